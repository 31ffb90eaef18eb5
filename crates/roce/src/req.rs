//! Requester and completer (IBA 9.7.4, 9.7.5.1, 9.9): segmentation, PSN
//! assignment, AckReq, ACK/NAK/RNR processing, READ and atomic responses,
//! retransmission on timeout and go-back-N, completion in order.

use crate::mem::{gather, pin_gather, scatter, sge_room, Memory};
use crate::packet::{opcode, transport_of, MiddleRun, Packet, Payload};
use crate::qp::{Mode, Qp, QpConfig};
use crate::wqe::{Completion, SendOp, SendWqe};
use rdma_types::{Instant, Psn, QpType, WcStatus};
use rdma_wire::{
    AtomicEthRepr, DethRepr, IethRepr, ImmDtRepr, Kind, NakCode, OpInfo, Position, RethRepr,
    Syndrome,
};
use std::collections::VecDeque;

/// Packets an RC requester may have beyond the oldest unacknowledged PSN.
/// Linux rxe uses 128 (`RXE_MAX_UNACKED_PSNS`); 512 keeps a slow rxe peer
/// from drowning (Linux ib_srp reading from srptd in a TCG VM: 1.3 MiB/s
/// unbounded, 26-58 MiB/s bounded) and costs nothing locally, where 128
/// took ~20 % off 4 KiB QD32 reads (our coalesced ACKs arrive later).
pub(crate) const MAX_UNACKED_PSNS: u32 = 512;

/// The least the window shrinks to after losses (packets).
pub(crate) const MIN_WINDOW: u32 = 8;

#[derive(Debug)]
pub(crate) struct Entry {
    wqe: SendWqe,
    len: u64,
    npkts: u32,
    first_psn: Psn,
    /// The first packet has gone out at least once.
    started: bool,
    /// Every packet has gone out at least once.
    sent: bool,
    /// A local error found before sending (completes the WQE in error).
    error: Option<WcStatus>,
}

impl Entry {
    /// The entry's last PSN; for a local operation (no PSNs) the one
    /// before its first, so it contains no PSN.
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts).sub(1)
    }

    fn contains(&self, psn: Psn) -> bool {
        psn.diff(self.first_psn) >= 0 && psn.diff(self.last_psn()) <= 0
    }
}

#[derive(Debug)]
pub(crate) struct Requester {
    sq: VecDeque<Entry>,
    /// PSN the next posted entry starts at.
    next_psn: Psn,
    /// Entry being transmitted and the packet within it.
    cursor: usize,
    cursor_pkt: u32,
    /// Oldest PSN not yet acknowledged.
    una: Psn,
    /// One past the highest PSN ever sent.
    max_sent: Psn,
    pkts_since_ack_req: u32,
    retry_left: u8,
    rnr_left: u8,
    rto_deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// PSN a sign of a gap (NAK, response past a missing one, ACK past a
    /// READ) or a timeout already made us go back to; later signs of the
    /// same gap are ignored until progress (the timeout still covers).
    gap_retried: Option<Psn>,
    /// The PSNs the last go-back-N (gap or timeout) sent again, `from..to`.
    resent: Option<(Psn, Psn)>,
    /// Packets (RC) that may be in flight beyond `una`: [`MAX_UNACKED_PSNS`]
    /// on a clean path, halved at each loss (a go-back-N), grown by one
    /// per window's worth of acknowledged packets (additive increase,
    /// multiplicative decrease). Go-back-N resends everything after a lost
    /// packet, so on a lossy path a full window makes each loss cost up
    /// to 512 packets, each resend loses again, and the requester spends
    /// its time and its retries resending (Linux ib_srp writing to srptd
    /// with 1 % loss: a third of what srptd sent were resends, SCSI
    /// timeouts, RetryExcErr); a window that follows the loss keeps what
    /// one loss costs small.
    window: u32,
    /// Packets acknowledged towards the next growth of `window`.
    window_acked: u32,
    pmtu: u64,
    /// Local operations (binds, local invalidates) in `sq`: while there
    /// are none, the send path does not look for them.
    locals: usize,
}

impl Requester {
    pub(crate) fn new(cfg: &QpConfig) -> Requester {
        Requester {
            sq: VecDeque::new(),
            next_psn: cfg.sq_psn,
            cursor: 0,
            cursor_pkt: 0,
            una: cfg.sq_psn,
            max_sent: cfg.sq_psn,
            pkts_since_ack_req: 0,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            rto_deadline: None,
            rnr_until: None,
            gap_retried: None,
            resent: None,
            window: MAX_UNACKED_PSNS,
            window_acked: 0,
            pmtu: cfg.pmtu.bytes() as u64,
            locals: 0,
        }
    }

    /// Sets the first PSN (modify-QP RTR->RTS gives it); only before
    /// anything was sent.
    pub(crate) fn start_at(&mut self, psn: rdma_types::Psn) -> bool {
        if self.sq.iter().any(|e| e.started) || self.next_psn != self.una {
            return false;
        }
        self.next_psn = psn;
        self.una = psn;
        self.max_sent = psn;
        true
    }

    pub(crate) fn reconfigure(&mut self, cfg: &QpConfig) {
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
        self.pmtu = cfg.pmtu.bytes() as u64;
    }

    pub(crate) fn len(&self) -> usize {
        self.sq.len()
    }

    /// Nothing started is still waiting for its acknowledgement.
    pub(crate) fn is_idle(&self) -> bool {
        self.sq.iter().all(|e| !e.started)
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match (self.rto_deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn post(&mut self, wqe: SendWqe, cfg: &QpConfig) {
        let local = wqe.op.is_local();
        let len = if local { 0 } else { wqe.len() };
        let mut error = None;
        let npkts = match wqe.op {
            _ if local => 0,
            SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => {
                if len != 8 {
                    error = Some(WcStatus::LocLenErr);
                }
                1
            }
            _ => len.div_ceil(self.pmtu).max(1),
        };
        if len > u64::from(u32::MAX >> 1) {
            error = Some(WcStatus::LocLenErr);
        }
        if local && cfg.qp_type.is_datagram() {
            // Windows are bound on connected QPs only (IBA 10.6.7.2.2).
            error = Some(WcStatus::LocQpOpErr);
        } else if cfg.qp_type.is_datagram()
            && (npkts > 1
                || wqe.ud.is_none()
                || !matches!(wqe.op, SendOp::Send | SendOp::SendImm(_)))
        {
            error = Some(WcStatus::LocLenErr);
        }
        if cfg.qp_type == QpType::Uc
            && (wqe.op.is_read_or_atomic() || matches!(wqe.op, SendOp::SendInv(_)))
        {
            // UC has no READ, atomics or SEND with invalidate (IBA 9.2,
            // the opcode table has none for it).
            error = Some(WcStatus::LocQpOpErr);
        }
        let npkts = if local {
            0
        } else if error.is_some() {
            1
        } else {
            npkts.min(u64::from(u32::MAX)) as u32
        };
        let first_psn = self.next_psn;
        self.next_psn = first_psn.add(npkts);
        self.locals += usize::from(local);
        self.sq.push_back(Entry {
            wqe,
            len,
            npkts,
            first_psn,
            started: false,
            sent: false,
            error,
        });
    }

    /// Completes every entry with its error or a flush (IBA 10.3.1, ERR).
    pub(crate) fn flush(&mut self, out: &mut VecDeque<Completion>) {
        for e in self.sq.drain(..) {
            let status = e.error.unwrap_or(WcStatus::WrFlushErr);
            out.push_back(Completion::send(e.wqe.wr_id, e.wqe.op, status, 0));
        }
        self.cursor = 0;
        self.cursor_pkt = 0;
        self.rto_deadline = None;
        self.rnr_until = None;
        self.locals = 0;
    }

    /// SQE: the front entry completes with its error, every entry behind
    /// it with a flush (whatever it would have failed with), and the next
    /// WQE posted after the QP resumes takes the PSN after the last one
    /// sent, so the peer sees no gap for WQEs that never left.
    pub(crate) fn flush_send_error(&mut self, out: &mut VecDeque<Completion>) {
        for e in self.sq.iter_mut().skip(1) {
            e.error = None;
        }
        self.flush(out);
        self.next_psn = self.max_sent;
        self.una = self.max_sent;
    }

    fn outstanding_rd_atomic(&self) -> usize {
        self.sq
            .iter()
            .take(self.cursor)
            .filter(|e| e.wqe.op.is_read_or_atomic())
            .count()
    }

    fn rewind(&mut self, psn: Psn) {
        if let Some(i) = self.sq.iter().position(|e| e.contains(psn)) {
            self.cursor = i;
            self.cursor_pkt = psn.distance_from(self.sq[i].first_psn);
        }
    }

    fn outstanding(&self) -> bool {
        self.una != self.max_sent
    }

    /// A loss: half the window, not below [`MIN_WINDOW`].
    fn shrink_window(&mut self) {
        self.window = (self.window / 2).max(MIN_WINDOW);
        self.window_acked = 0;
    }

    /// `n` packets acknowledged: one more packet of window per window's
    /// worth, up to [`MAX_UNACKED_PSNS`].
    fn grow_window(&mut self, n: u32) {
        if self.window >= MAX_UNACKED_PSNS {
            return;
        }
        self.window_acked = self.window_acked.saturating_add(n);
        while self.window_acked >= self.window && self.window < MAX_UNACKED_PSNS {
            self.window_acked -= self.window;
            self.window += 1;
        }
    }

    /// Whether the front READ/atomic (starting at `first`), missing its
    /// responses from `una` on, was asked for again by the last go-back-N
    /// and no response to that re-request has arrived yet. ACKs arriving
    /// meanwhile answer requests sent before the re-request (a responder
    /// ACKs a duplicate SEND with the newest PSN it acknowledged, Linux
    /// rxe included), so being past the READ says nothing of its responses.
    /// Once one response to the re-request is in, the responder has got
    /// to it, and a later ACK past the READ does mean responses were lost.
    fn awaiting_re_request(&self, first: Psn) -> bool {
        let una = self.una;
        self.resent.is_some_and(|(from, to)| {
            una.diff(from) >= 0 && una.diff(to) < 0 && (una == from || una == first)
        })
    }
}

impl Qp {
    fn arm_rto(&mut self, now: Instant) {
        if self.req.rto_deadline.is_none() {
            self.req.rto_deadline = self.ack_timeout().map(|d| now + d);
        }
    }

    /// Completes the front entry with `status` and moves the QP to error
    /// (RC, IBA 10.8.3) or, for unreliable service, stops only the send
    /// queue (SQE, IBA 10.3.1.6).
    fn fail_front(&mut self, status: WcStatus) {
        if let Some(front) = self.req.sq.front_mut() {
            front.error = Some(status);
        }
        if self.cfg.qp_type == QpType::Rc {
            self.set_error(status);
        } else {
            self.set_send_error();
        }
    }

    /// Completes the front entry, then the local operations behind it that
    /// already ran (they complete in order, IBA 10.8.3).
    fn complete_front(&mut self) {
        self.pop_front_completed();
        while self.req.locals > 0
            && self
                .req
                .sq
                .front()
                .is_some_and(|e| e.wqe.op.is_local() && e.sent && e.error.is_none())
        {
            self.pop_front_completed();
        }
    }

    fn pop_front_completed(&mut self) {
        let Some(e) = self.req.sq.pop_front() else {
            return;
        };
        if e.wqe.op.is_local() {
            self.req.locals -= 1;
        }
        if self.req.cursor == 0 {
            // The cursor was retransmitting the entry just acknowledged:
            // move on to the start of the next one.
            self.req.cursor_pkt = 0;
        } else {
            self.req.cursor -= 1;
        }
        if e.wqe.signaled {
            let byte_len = if e.wqe.op.is_atomic() {
                8
            } else if e.wqe.op.is_local() {
                0
            } else {
                e.len as u32
            };
            self.completions.push_back(Completion::send(
                e.wqe.wr_id,
                e.wqe.op,
                WcStatus::Success,
                byte_len,
            ));
        }
    }

    pub(crate) fn poll_request(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
        out: &mut Packet<Payload>,
    ) -> bool {
        if !matches!(self.mode, Mode::Active | Mode::Draining) {
            return false;
        }
        if let Some(t) = self.req.rnr_until {
            if now < t {
                return false;
            }
            self.req.rnr_until = None;
        }
        if !self.run_local_ops(mem) {
            return false;
        }
        let idx = self.req.cursor;
        let Some(entry) = self.req.sq.get(idx) else {
            return false;
        };
        // RC: at most the window beyond the oldest unacknowledged PSN (at
        // most MAX_UNACKED_PSNS, Linux rxe's window), so a slow receiver is
        // not buried under a burst it can only drop, and a lossy path does
        // not have a whole window resent for every loss.
        // READ requests are exempt: the peer paces its responses.
        if self.cfg.qp_type == QpType::Rc
            && !matches!(entry.wqe.op, SendOp::Read { .. })
            && entry.first_psn.add(self.req.cursor_pkt).diff(self.req.una) >= self.req.window as i32
        {
            return false;
        }
        if !entry.started {
            if self.mode == Mode::Draining {
                return false;
            }
            if entry.wqe.op.is_read_or_atomic()
                && self.req.outstanding_rd_atomic() >= usize::from(self.cfg.max_rd_atomic.max(1))
            {
                return false;
            }
            if entry.wqe.fence
                && self
                    .req
                    .sq
                    .iter()
                    .take(idx)
                    .any(|e| e.wqe.op.is_read_or_atomic())
            {
                return false;
            }
        }
        if let Some(status) = entry.error {
            // Local errors complete in order: once every earlier WQE has.
            if idx == 0 {
                self.fail_front(status);
            }
            return false;
        }
        match self.build_request(idx, mem, out) {
            Ok(()) => {
                self.sent_request(now, idx, out.bth.psn, 1);
                true
            }
            Err(status) => {
                self.req.sq[idx].error = Some(status);
                if idx == 0 {
                    self.fail_front(status);
                }
                false
            }
        }
    }

    /// Notes that the `count` packets from `psn` of entry `idx` were
    /// built: resends counted, the highest PSN sent moved on, the timer
    /// armed (RC).
    #[inline]
    fn sent_request(&mut self, now: Instant, idx: usize, psn: Psn, count: u32) {
        let resent = self.req.max_sent.diff(psn).clamp(0, count as i32);
        self.counters.retransmits += resent as u64;
        // A READ request reserves the PSNs of all its responses.
        let reserved = match self.req.sq.get(idx) {
            Some(e) if matches!(e.wqe.op, SendOp::Read { .. }) => e.last_psn().next(),
            _ => psn.add(count),
        };
        if reserved.diff(self.req.max_sent) > 0 {
            self.req.max_sent = reserved;
        }
        if self.cfg.qp_type == QpType::Rc {
            self.arm_rto(now);
        }
    }

    /// The next request packets when they are middle packets of the
    /// message being sent (neither its first nor its last, so a BTH alone
    /// and a full path MTU of payload each), and then its last packet too
    /// when that has no header past the BTH either (a SEND or a WRITE
    /// without immediate data or invalidate): at most `max` (and 64) of
    /// them, whose bytes the memory lends in one piece, when nothing else
    /// has to go first (a response, a local operation, an RNR wait, a
    /// drain). Their first PSN, AckReq bits and payloads, with the QP's
    /// state moved on as that many [`Qp::poll_transmit_into`] calls would
    /// have. Every other header field of a middle packet is the one of the
    /// message's first or middle packet before it (the opcode a middle
    /// one's, SE and pad clear), so a driver that just sent one can send
    /// these from that header without building them; the last differs in
    /// its opcode, SE ([`MiddleRun::solicited`]) and pad. `None`: build
    /// the next packet with [`Qp::poll_transmit_into`] (nothing has
    /// changed).
    pub fn poll_middles(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
        max: usize,
    ) -> Option<MiddleRun> {
        let reliable = match self.cfg.qp_type {
            QpType::Rc => true,
            QpType::Uc => false,
            _ => return None,
        };
        if self.mode != Mode::Active
            || self.req.rnr_until.is_some()
            || self.req.locals != 0
            || self.resp.has_queued()
        {
            return None;
        }
        let (idx, pkt_idx) = (self.req.cursor, self.req.cursor_pkt);
        let entry = self.req.sq.get(idx)?;
        let op = entry.wqe.op;
        if !entry.started
            || entry.error.is_some()
            || pkt_idx == 0
            || pkt_idx >= entry.npkts
            || entry.wqe.inline.is_some()
            || !op.is_send_or_write()
        {
            return None;
        }
        let psn = entry.first_psn.add(pkt_idx);
        // The packets left, those the window takes, the last only when
        // it is plain.
        let mut count = (entry.npkts - pkt_idx).min(max.min(64) as u32);
        if reliable {
            let room = self.req.window as i32 - psn.diff(self.req.una);
            count = count.min(room.max(0) as u32);
        }
        let plain_last = matches!(op, SendOp::Send | SendOp::Write { .. });
        if pkt_idx + count == entry.npkts && !plain_last {
            count -= 1;
        }
        // Lent in one piece: as far as the local SGE goes.
        let pmtu = self.req.pmtu;
        let offset = u64::from(pkt_idx) * pmtu;
        let mut len = (entry.len - offset).min(u64::from(count) * pmtu);
        let in_sge = sge_room(&entry.wqe.sges, offset).unwrap_or(0);
        if in_sge < len {
            count = count.min((in_sge / pmtu) as u32);
            len = u64::from(count) * pmtu;
        }
        if count == 0 {
            return None;
        }
        let pinned =
            pin_gather(mem, &entry.wqe.sges, offset, usize::try_from(len).ok()?).ok()??;
        let ends = pkt_idx + count == entry.npkts;
        let solicited = ends && !matches!(op, SendOp::Write { .. }) && entry.wqe.solicited;
        let middles = count - u32::from(ends);
        let mut ack_req = 0u64;
        if reliable {
            for i in 0..middles {
                if self.ack_request(psn.add(i), false) {
                    ack_req |= 1 << i;
                }
            }
        }
        self.req.cursor_pkt = pkt_idx + middles;
        if ends {
            let kind = match op {
                SendOp::Write { .. } => Kind::RdmaWrite,
                _ => Kind::Send,
            };
            let last = psn.add(middles);
            if self.advance(idx, last, kind, true, pkt_idx + count) {
                ack_req |= 1 << middles;
            }
        }
        self.sent_request(now, idx, psn, count);
        self.counters.tx_packets += u64::from(count);
        // As many turns as calls of poll_transmit_into.
        self.turn ^= count % 2 == 1;
        Some(MiddleRun {
            psn,
            count: count as usize,
            ack_req,
            ends,
            solicited,
            each: pmtu as usize,
            payload: Payload::Pinned(pinned),
        })
    }

    /// Whether the RC request packet at `psn` asks for an ACK: when
    /// `forced`, and at least twice per window and on the packet that
    /// fills it (a window smaller than the QP's `ack_req_every` would
    /// otherwise wait for the timeout with nothing asking the responder
    /// to ACK). Counts the packets since the last that asked.
    fn ack_request(&mut self, psn: Psn, forced: bool) -> bool {
        let window = self.req.window;
        let every = self.req.pkts_since_ack_req + 1
            >= self.cfg.ack_req_every.max(1).min((window / 2).max(1));
        let fills = psn.next().diff(self.req.una) >= window as i32;
        let asks = forced || every || fills;
        self.req.pkts_since_ack_req = if asks {
            0
        } else {
            self.req.pkts_since_ack_req + 1
        };
        asks
    }

    /// Runs the local operations (window binds, local invalidates) at the
    /// cursor. Each runs once every entry before it has been sent, as Linux
    /// rxe does, so later entries of the queue see its effect; it completes
    /// once the entries before it have. A failed one completes in error
    /// (`MwBindErr`) when it reaches the front, and the QP goes to error.
    /// Returns whether the cursor may go on to an entry that sends.
    /// Bounded: each turn moves the cursor or returns.
    fn run_local_ops(&mut self, mem: &mut (impl Memory + ?Sized)) -> bool {
        if self.req.locals == 0 {
            return true;
        }
        while let Some(e) = self.req.sq.get(self.req.cursor) {
            let idx = self.req.cursor;
            if !e.wqe.op.is_local() {
                return true;
            }
            if e.sent {
                // Ran already: the cursor went back over it (go-back-N).
                self.req.cursor += 1;
                self.req.cursor_pkt = 0;
                continue;
            }
            if let Some(status) = e.error {
                if idx == 0 {
                    self.fail_front(status);
                }
                return false;
            }
            if self.mode == Mode::Draining {
                return false;
            }
            if e.wqe.fence
                && self
                    .req
                    .sq
                    .iter()
                    .take(idx)
                    .any(|x| x.wqe.op.is_read_or_atomic())
            {
                return false;
            }
            let done = match e.wqe.op {
                SendOp::BindMw(b) => mem.bind_mw(&b),
                SendOp::LocalInv(rkey) => mem.invalidate(rkey),
                _ => Ok(()),
            };
            let e = &mut self.req.sq[idx];
            if done.is_err() {
                e.error = Some(WcStatus::MwBindErr);
                if idx == 0 {
                    self.fail_front(WcStatus::MwBindErr);
                }
                return false;
            }
            e.started = true;
            e.sent = true;
            self.req.cursor = idx + 1;
            self.req.cursor_pkt = 0;
            if idx == 0 {
                self.complete_front();
            }
        }
        true
    }

    /// Builds the packet at the cursor and advances it.
    fn build_request(
        &mut self,
        idx: usize,
        mem: &mut (impl Memory + ?Sized),
        out: &mut Packet<Payload>,
    ) -> Result<(), WcStatus> {
        let qp_type = self.cfg.qp_type;
        let pmtu = self.req.pmtu;
        let pkt_idx = self.req.cursor_pkt;
        let entry = &self.req.sq[idx];
        let op = entry.wqe.op;
        let psn = entry.first_psn.add(pkt_idx);
        let transport = transport_of(qp_type);
        let dest = entry.wqe.ud.map(|u| u.qpn).unwrap_or(self.cfg.dest_qpn);
        // Built where the driver keeps it: no move of the packet after.
        *out = Packet::new(rdma_wire::Opcode::Unknown(0xFF), self.cfg.pkey, dest, psn);
        let pkt = out;

        let (kind, pos, next_pkt) = match op {
            SendOp::Read { raddr, rkey } => {
                let offset = u64::from(pkt_idx) * pmtu;
                pkt.ext.reth = Some(RethRepr {
                    va: raddr.wrapping_add(offset),
                    rkey,
                    dma_len: (entry.len - offset.min(entry.len)) as u32,
                });
                (Kind::RdmaReadRequest, Position::Only, entry.npkts)
            }
            SendOp::CmpSwap {
                raddr,
                rkey,
                compare,
                swap,
            } => {
                pkt.ext.atomic_eth = Some(AtomicEthRepr {
                    va: raddr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (Kind::CompareSwap, Position::Only, 1)
            }
            SendOp::FetchAdd { raddr, rkey, add } => {
                pkt.ext.atomic_eth = Some(AtomicEthRepr {
                    va: raddr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (Kind::FetchAdd, Position::Only, 1)
            }
            // Run by `run_local_ops`, never sent.
            SendOp::BindMw(_) | SendOp::LocalInv(_) => return Err(WcStatus::LocQpOpErr),
            SendOp::Send
            | SendOp::SendImm(_)
            | SendOp::SendInv(_)
            | SendOp::Write { .. }
            | SendOp::WriteImm { .. } => {
                let pos = Position::of(pkt_idx, entry.npkts);
                let offset = u64::from(pkt_idx) * pmtu;
                let len = (entry.len - offset).min(pmtu) as usize;
                // Lent straight from registered memory when it can be (the
                // driver's send is then the payload's only copy).
                let pinned = match &entry.wqe.inline {
                    Some(_) => None,
                    None => pin_gather(mem, &entry.wqe.sges, offset, len)
                        .map_err(|_| WcStatus::LocProtErr)?,
                };
                pkt.payload = match pinned {
                    Some(p) => Payload::Pinned(p),
                    None => {
                        let mut payload = self.payloads.take(len);
                        match &entry.wqe.inline {
                            Some(data) => payload
                                .copy_from_slice(&data[offset as usize..offset as usize + len]),
                            None => gather(mem, &entry.wqe.sges, offset, &mut payload)
                                .map_err(|_| WcStatus::LocProtErr)?,
                        }
                        Payload::Owned(payload)
                    }
                };
                let is_write = matches!(op, SendOp::Write { .. } | SendOp::WriteImm { .. });
                if let (
                    true,
                    SendOp::Write { raddr, rkey } | SendOp::WriteImm { raddr, rkey, .. },
                ) = (pos.starts(), op)
                {
                    pkt.ext.reth = Some(RethRepr {
                        va: raddr,
                        rkey,
                        dma_len: entry.len as u32,
                    });
                }
                if pos.ends() {
                    match op {
                        SendOp::SendImm(imm) | SendOp::WriteImm { imm, .. } => {
                            pkt.ext.imm_dt = Some(ImmDtRepr { imm })
                        }
                        SendOp::SendInv(rkey) => pkt.ext.ieth = Some(IethRepr { rkey }),
                        _ => {}
                    }
                    pkt.bth.solicited =
                        entry.wqe.solicited && (!is_write || pkt.ext.imm_dt.is_some());
                }
                (
                    if is_write {
                        Kind::RdmaWrite
                    } else {
                        Kind::Send
                    },
                    pos,
                    pkt_idx + 1,
                )
            }
        };
        pkt.bth.opcode = opcode(
            transport,
            kind,
            pos,
            pkt.ext.imm_dt.is_some(),
            pkt.ext.ieth.is_some(),
        );
        if let Some(ud) = entry.wqe.ud.filter(|_| qp_type.is_datagram()) {
            pkt.ext.deth = Some(DethRepr {
                qkey: ud.qkey,
                src_qp: self.cfg.qpn,
            });
            pkt.ud_dest = Some(ud);
        }
        pkt.bth.ack_req = self.advance(idx, psn, kind, pos.ends(), next_pkt);
        Ok(())
    }

    /// Moves the QP past the request packet at `psn` of entry `idx`, a
    /// `kind` packet that `ends` its message or not, the next to send
    /// being packet `next_pkt` of the entry (past its last: the next
    /// entry); UC completes an entry once its last packet is sent. Whether
    /// the packet asks for an ACK (RC).
    // Inlined: it is most of what a packet's building leaves to do (a
    // call cost a 4 KiB soft RoCE I/O ~100 instructions under callgrind).
    #[inline(always)]
    fn advance(&mut self, idx: usize, psn: Psn, kind: Kind, ends: bool, next_pkt: u32) -> bool {
        let qp_type = self.cfg.qp_type;
        let npkts = self.req.sq[idx].npkts;
        let mut ack_req = false;
        if qp_type == QpType::Rc {
            // A message's last packet asks for an ACK, but for an RDMA
            // WRITE with a SEND or WRITE already queued behind it: that
            // one's ACK covers both (ACKs are cumulative), so a WRITE
            // chained to the SEND that follows it (a target's data and
            // response) costs the peer one ACK, not two. SENDs keep one
            // ACK each, so that one lost ACK never leaves two of them to
            // the timer (see `resp::AckRepeat`). A resend always asks:
            // what follows may never be sent (a drain, an error), and a
            // duplicate that asks nothing gets no ACK.
            let resend = psn.diff(self.req.max_sent) < 0;
            let covered = kind == Kind::RdmaWrite
                && !resend
                && self
                    .req
                    .sq
                    .get(idx + 1)
                    .is_some_and(|next| next.error.is_none() && next.wqe.op.is_send_or_write());
            let forced = ends && !covered || kind != Kind::Send && kind != Kind::RdmaWrite;
            ack_req = self.ack_request(psn, forced);
        }

        let e = &mut self.req.sq[idx];
        e.started = true;
        if next_pkt >= npkts {
            e.sent = true;
            self.req.cursor = idx + 1;
            self.req.cursor_pkt = 0;
        } else {
            self.req.cursor_pkt = next_pkt;
        }
        // UC and UD complete once the last packet is on the wire.
        if qp_type != QpType::Rc && next_pkt >= npkts {
            self.req.una = psn.next();
            if idx == 0 {
                self.complete_front();
            }
        }
        ack_req
    }

    /// Acknowledges every PSN up to and including `psn`.
    fn ack_through(&mut self, now: Instant, psn: Psn) {
        self.ack_through_inner(now, psn, true);
    }

    /// Completes what an ACK through `psn` covers. `rewind_reads`: an ACK
    /// past a READ/atomic still missing responses means they were lost, a
    /// sign of the gap at the oldest unacknowledged PSN ([`Qp::retry_gap`]);
    /// a READ response of a later READ (which acknowledges what comes
    /// before that READ implicitly) leaves the front READ to the gap rule
    /// in `handle_read_response` instead.
    fn ack_through_inner(&mut self, now: Instant, psn: Psn, rewind_reads: bool) {
        let mut progress = false;
        let before = self.req.una;
        while let Some(front) = self.req.sq.front() {
            if !front.started || psn.diff(front.first_psn) < 0 {
                break;
            }
            if psn.diff(front.last_psn()) >= 0 && front.sent {
                if front.wqe.op.is_read_or_atomic() {
                    // An ACK beyond a READ/atomic without all its responses:
                    // they were lost (IBA 9.7.5.1.5). Ask again from the
                    // first one missing, not from the READ's start: the
                    // responses before it are in, and a responder that
                    // answered the partial re-request (Linux rxe) drops a
                    // re-request from before it.
                    if rewind_reads && !self.req.awaiting_re_request(front.first_psn) {
                        self.retry_gap(now);
                    }
                    break;
                }
                self.req.una = front.last_psn().next();
                self.complete_front();
                progress = true;
            } else {
                if psn.diff(self.req.una) >= 0 && !front.wqe.op.is_read_or_atomic() {
                    self.req.una = psn.next();
                    progress = true;
                }
                break;
            }
        }
        if progress {
            let acked = self.req.una.diff(before).max(0) as u32;
            self.req.grow_window(acked);
            self.req.retry_left = self.cfg.retry_cnt;
            self.req.rnr_left = self.cfg.rnr_retry;
            self.req.rto_deadline = None;
            if self.req.outstanding() {
                self.arm_rto(now);
            }
        }
    }

    pub(crate) fn handle_response(
        &mut self,
        now: Instant,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) {
        let psn = pkt.bth.psn;
        // Only PSNs in flight mean anything; older ones are duplicates.
        if psn.diff(self.req.una) < 0 || psn.diff(self.req.max_sent) >= 0 {
            if info.kind == Kind::Acknowledge && psn.diff(self.req.una) < 0 {
                self.counters.duplicates += 1;
            } else {
                self.counters.dropped += 1;
            }
            if info.kind == Kind::RdmaReadResponse && psn.diff(self.req.una) < 0 {
                self.responder_busy(now);
            }
            return;
        }
        match info.kind {
            Kind::Acknowledge => {
                let Some(aeth) = pkt.ext.aeth else {
                    self.counters.dropped += 1;
                    return;
                };
                match aeth.syndrome {
                    Syndrome::Ack(_) => self.ack_through(now, psn),
                    Syndrome::RnrNak(timer) => {
                        self.counters.rnr_naks_received += 1;
                        self.ack_through(now, psn.sub(1));
                        if self.req.rnr_left == 0 {
                            self.fail_front(WcStatus::RnrRetryExcErr);
                            return;
                        }
                        if self.cfg.rnr_retry != 7 {
                            self.req.rnr_left -= 1;
                        }
                        self.req.rnr_until = Some(now + timer.duration());
                        self.req.rto_deadline = None;
                        let una = self.req.una;
                        self.req.rewind(una);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.counters.seq_naks_received += 1;
                        self.ack_through(now, psn.sub(1));
                        // From the oldest unacknowledged PSN: an earlier READ
                        // whose response went missing must be asked again.
                        self.retry_gap(now);
                    }
                    Syndrome::Nak(code) => {
                        self.ack_through(now, psn.sub(1));
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                            _ => WcStatus::BadRespErr,
                        };
                        self.fail_front(status);
                    }
                    Syndrome::Reserved(_) => self.fail_front(WcStatus::BadRespErr),
                }
            }
            Kind::RdmaReadResponse => self.handle_read_response(now, pkt, info, mem),
            Kind::AtomicAcknowledge => {
                self.ack_through(now, psn.sub(1));
                let Some(front) = self.req.sq.front() else {
                    return;
                };
                if !front.wqe.op.is_atomic() || front.first_psn != psn {
                    self.counters.dropped += 1;
                    return;
                }
                let Some(orig) = pkt.ext.atomic_ack_eth.map(|a| a.orig_data) else {
                    self.counters.dropped += 1;
                    return;
                };
                let sges = front.wqe.sges.clone();
                if scatter(mem, &sges, 0, &orig.to_ne_bytes()).is_err() {
                    self.fail_front(WcStatus::LocProtErr);
                    return;
                }
                self.req.una = psn.next();
                // Progress, as an ACK or a READ response is: the retries
                // come back and the retransmission timer restarts.
                self.req.retry_left = self.cfg.retry_cnt;
                self.req.rnr_left = self.cfg.rnr_retry;
                self.req.rto_deadline = None;
                self.complete_front();
                self.ack_through(now, psn);
                if self.req.outstanding() {
                    self.arm_rto(now);
                }
            }
            _ => self.counters.dropped += 1,
        }
    }

    /// A READ response that is not the one we wait for: of a READ already
    /// complete, of a later READ, or of the front READ past a lost packet.
    /// The responder is still answering requests it had before our latest
    /// re-request, which comes after them (Linux rxe answers every
    /// re-request it can match to its responder resources, in order), so
    /// the retransmission timer starts again: a timeout now would only
    /// queue one more full pass behind the others, each one longer to
    /// answer than the timer, until the retries run out. Seen against rxe
    /// in a TCG VM, 67 ms of timer each time:
    /// - perftest-ours (issue 33): 16 64 KiB READs, one lost response
    ///   packet, then a re-request of all 16 every 67 ms while rxe replayed
    ///   READs already complete, and RetryExcErr after 39 of 100 READs;
    /// - shims-rxe: 100 64 KiB READs in flight, one response packet lost,
    ///   and rxe spent 52 ms on the 27 READs after it, whose responses we
    ///   drop, before it answered the re-request.
    ///
    /// The responder's queue is finite: once it is answered and nothing we
    /// wait for came, the timer runs out.
    fn responder_busy(&mut self, now: Instant) {
        if self.req.outstanding() && self.req.rto_deadline.is_some() {
            self.req.rto_deadline = None;
            self.arm_rto(now);
        }
    }

    /// Goes back to the oldest unacknowledged PSN on a sign that what was
    /// sent from there is lost: a sequence NAK, a response past a missing
    /// one, an ACK past a READ still missing responses. Once per gap: the
    /// other signs of the same loss (the rest of a response stream, the
    /// ACKs of what go-back-N sends again) would each start another pass,
    /// asking again for what is already on its way (Linux rxe's completer
    /// likewise starts one retry until progress or a timeout). The
    /// retransmission timer covers a re-request that is lost too.
    fn retry_gap(&mut self, now: Instant) {
        let una = self.req.una;
        if self.req.gap_retried != Some(una) {
            self.req.gap_retried = Some(una);
            self.retry_from(now, una);
        }
    }

    /// Go back to `psn` after a sequence NAK or an out-of-order response,
    /// spending one transport retry.
    fn retry_from(&mut self, now: Instant, psn: Psn) {
        if self.req.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        self.req.shrink_window();
        self.req.resent = Some((psn, self.req.max_sent));
        self.req.rewind(psn);
        self.req.rto_deadline = None;
        self.arm_rto(now);
    }

    fn handle_read_response(
        &mut self,
        now: Instant,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) {
        let psn = pkt.bth.psn;
        // A READ response acknowledges the requests before its READ.
        self.ack_through_inner(now, psn.sub(1), false);
        let pmtu = self.req.pmtu;
        let Some(front) = self.req.sq.front() else {
            return;
        };
        if front.wqe.op.is_read_or_atomic() && front.sent && psn.diff(front.last_psn()) > 0 {
            // A response of a later READ: the front READ's (or atomic's)
            // missing responses will not come. Ask again from what is
            // missing, once per gap; the retransmission timer covers a
            // re-request that is lost too.
            self.retry_gap(now);
            self.responder_busy(now);
            self.counters.dropped += 1;
            return;
        }
        if !matches!(front.wqe.op, SendOp::Read { .. }) || !front.contains(psn) {
            self.responder_busy(now);
            self.counters.dropped += 1;
            return;
        }
        if psn != self.req.una {
            // A gap inside the READ response: re-request from what we miss.
            if psn.diff(self.req.una) > 0 {
                self.retry_gap(now);
                self.responder_busy(now);
            }
            return;
        }
        let index = psn.distance_from(front.first_psn);
        let offset = u64::from(index) * pmtu;
        // A re-requested READ restarts its response stream with FIRST (or
        // ONLY) mid-message, so only "ends here or not" is checked.
        let is_last = index + 1 >= front.npkts;
        let expected_len = (front.len - offset).min(pmtu);
        if info.position.ends() != is_last || pkt.payload.len() as u64 != expected_len {
            self.fail_front(WcStatus::BadRespErr);
            return;
        }
        let sges = front.wqe.sges.clone();
        if scatter(mem, &sges, offset, pkt.payload).is_err() {
            self.fail_front(WcStatus::LocProtErr);
            return;
        }
        self.req.una = psn.next();
        self.req.retry_left = self.cfg.retry_cnt;
        self.req.rto_deadline = None;
        if info.position.ends() {
            self.complete_front();
        }
        if self.req.outstanding() {
            self.arm_rto(now);
        }
    }

    pub(crate) fn requester_timeout(&mut self, now: Instant) {
        let Some(deadline) = self.req.rto_deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        self.req.rto_deadline = None;
        if !self.req.outstanding() {
            return;
        }
        self.counters.timeouts += 1;
        // The timeout's pass is the retry for this gap: other signs of it
        // (responses to what was asked before, still arriving) start no
        // second pass until progress, as after a NAK (Linux rxe's
        // `started_retry` likewise). The next timeout covers this pass.
        let una = self.req.una;
        self.req.gap_retried = Some(una);
        self.retry_from(now, una);
    }
}
