//! Responder (IBA 9.7.5.2, 9.7.6, 9.8): PSN checking, duplicate handling,
//! receive WQE consumption and RNR, remote access checks, READ responses,
//! atomics with a replay cache, ACK coalescing and NAKs.

use crate::mem::{scatter, Memory, MemoryError, RemoteAccess};
use crate::packet::{ack, nak, opcode, rnr_nak, MiddleRun, Packet, Payload};
use crate::qp::{Mode, Qp, QpConfig};
use crate::wqe::{Completion, RecvWqe};
use rdma_types::{Duration, Instant, Pkey, Psn, QpType, Qpn, Rkey, WcOpcode, WcStatus};
use rdma_wire::{
    AethRepr, AtomicAckEthRepr, CreditCount, Kind, NakCode, OpInfo, Opcode, Position, Transport,
};
use std::collections::VecDeque;

/// A response waiting to be sent, in PSN order.
#[derive(Debug, Clone)]
enum Response {
    /// ACK of one request (`copy` 0), or the newest ACK sent again, its
    /// `copy`th copy ([`AckRepeat`]).
    Ack { psn: Psn, msn: u32, copy: u8 },
    /// NAK or RNR NAK; `then` moves the QP to error once it is sent.
    Nak {
        psn: Psn,
        aeth: AethRepr,
        then: Option<WcStatus>,
    },
    /// READ response packets still to send.
    Read(ReadJob),
    /// Atomic acknowledge with the original value.
    Atomic { psn: Psn, orig: u64, msn: u32 },
}

#[derive(Debug, Clone)]
struct ReadJob {
    psn: Psn,
    va: u64,
    rkey: Rkey,
    len: u64,
    done: u64,
    msn: u32,
    /// Re-executed for a duplicate request.
    duplicate: bool,
}

impl ReadJob {
    /// The index of the response packet to send next, and how many the
    /// response has, in packets of `pmtu` bytes.
    fn at(&self, pmtu: u64) -> (u32, u32) {
        (
            (self.done / pmtu) as u32,
            self.len.div_ceil(pmtu).max(1) as u32,
        )
    }
}

/// A READ or atomic remembered for duplicate requests (responder resources).
#[derive(Debug, Clone)]
enum Resource {
    Read { first: Psn, npkts: u32 },
    Atomic { psn: Psn, orig: u64 },
}

#[derive(Debug)]
struct WriteState {
    va: u64,
    rkey: Rkey,
    len: u64,
    done: u64,
}

#[derive(Debug)]
pub(crate) struct Responder {
    epsn: Psn,
    msn: u32,
    rq: VecDeque<RecvWqe>,
    /// SEND in progress: its WQE and bytes placed so far.
    cur_recv: Option<(RecvWqe, u64)>,
    cur_write: Option<WriteState>,
    in_progress: Option<Kind>,
    nak_seq_sent: bool,
    /// UC: drop packets until the next first/only.
    discarding: bool,
    /// A fatal NAK is queued: drop further requests.
    dead: bool,
    queue: VecDeque<Response>,
    resources: VecDeque<Resource>,
    pmtu: u64,
    pub(crate) comm_pending: bool,
    /// The newest ACK sent, to send again at the instant given (as its
    /// copy of that number) unless a newer one has gone by then
    /// ([`AckRepeat`]).
    ack_repeat: Option<(Instant, Psn, u32, u8)>,
}

/// The last two requests that ask for an ACK each get their own, and the
/// newest ACK is sent again after each of [`AckRepeat::DELAYS`] unless a
/// newer one went
/// out meanwhile: a lost ACK is then covered by the next one or by a
/// copy, and the requester's retransmission timer is left for losing
/// them all. The copies are spread out, so a burst of losses (a full
/// queue on the way) that takes the ACK and its first copy spares the
/// later ones. One copy was not enough against Linux rxe at 1 % loss:
/// `vm-srp-ours-soak-lossy` lost an ACK and its copy about once a minute
/// (rxe's `completer_retry_err`), and one of those stopped the QP.
///
/// A requester learns of a lost ACK only from that timer (with rdma_cm's
/// RoCE defaults about 2 s), and Linux rxe (6.1) does not survive a
/// timeout that finds two or more requests unacknowledged when its
/// consumer registers memory between them, as Linux ib_srp does before
/// each command: the retry runs the next command's REG_MR a second time,
/// rxe refuses to register an MR that is already valid, puts the send
/// queue in error and from then on drops every ACK of the QP, so the QP
/// stops without an error completion (issue 22 item 6). One ACK for a
/// whole burst made a single lost ACK enough for that: it alone covered
/// the burst. So of the ACKs not yet sent, the last two stay apart (the
/// older one covering everything before it): a multi-request timeout
/// still needs both and the copies lost, as with an ACK per request, and
/// a burst answered in one pass costs two ACKs, not one per request
/// (`srpstack bench` 4 KiB randread QD32 over soft RoCE: 5.0 datagrams
/// per I/O with one each, 3.1 and a quarter more IOPS with two).
/// A requester ignores an ACK of PSNs already acknowledged (IBA
/// 9.7.5.1.2), so the copies cost a few datagrams at the end of a burst
/// and nothing while ACKs keep coming.
pub(crate) struct AckRepeat;

impl AckRepeat {
    /// How long after the newest ACK its first copy follows.
    pub(crate) const DELAY: Duration = Duration::from_millis(2);
    /// How long after the ACK (or the copy before) each copy follows:
    /// all within rdma_cm's RoCE retransmission timeout (about 1 s).
    pub(crate) const DELAYS: [Duration; 3] = [
        AckRepeat::DELAY,
        Duration::from_millis(40),
        Duration::from_millis(300),
    ];
}

impl Responder {
    /// Whether responses (ACKs, NAKs, READ and atomic responses) wait to
    /// be sent.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }
}

impl Responder {
    pub(crate) fn new(cfg: &QpConfig) -> Responder {
        Responder {
            epsn: cfg.rq_psn,
            msn: 0,
            rq: VecDeque::new(),
            cur_recv: None,
            cur_write: None,
            in_progress: None,
            nak_seq_sent: false,
            discarding: false,
            dead: false,
            queue: VecDeque::new(),
            resources: VecDeque::new(),
            pmtu: cfg.pmtu.bytes() as u64,
            comm_pending: true,
            ack_repeat: None,
        }
    }

    pub(crate) fn rq_len(&self) -> usize {
        self.rq.len()
    }

    pub(crate) fn post_recv(&mut self, wqe: RecvWqe) {
        self.rq.push_back(wqe);
    }

    pub(crate) fn flush(&mut self, out: &mut VecDeque<Completion>) {
        let cur = self.cur_recv.take().map(|(w, _)| w);
        for w in cur.into_iter().chain(self.rq.drain(..)) {
            out.push_back(Completion::recv(
                w.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            ));
        }
        self.queue.clear();
        self.ack_repeat = None;
    }

    /// When the last ACK is to be sent again.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.ack_repeat.map(|(at, ..)| at)
    }

    /// Sends the newest ACK again if its time has come and no newer ACK
    /// went out or waits to.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Some((at, psn, msn, copy)) = self.ack_repeat {
            if at <= now {
                self.ack_repeat = None;
                if !self.queue.iter().any(|r| matches!(r, Response::Ack { .. })) {
                    self.queue.push_back(Response::Ack { psn, msn, copy });
                }
            }
        }
    }

    /// Queues the ACK of one request. When the last two responses waiting
    /// are ACKs, the older one is dropped: the newer takes its place (it
    /// covers what it covered) and this one comes last, so the last two
    /// requests keep an ACK each (see [`AckRepeat`]).
    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        let new = Response::Ack { psn, msn, copy: 0 };
        let n = self.queue.len();
        if n >= 2
            && matches!(self.queue[n - 2], Response::Ack { copy: 0, .. })
            && matches!(self.queue[n - 1], Response::Ack { copy: 0, .. })
        {
            self.queue.swap(n - 2, n - 1);
            self.queue[n - 1] = new;
            return;
        }
        self.queue.push_back(new);
    }

    fn remember(&mut self, r: Resource, cap: u8) {
        if self.resources.len() >= usize::from(cap.max(1)) {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }
}

/// Outcome of processing one in-sequence request.
enum Step {
    /// Accepted: advance the expected PSN by this many.
    Advance(u32),
    /// Receiver not ready: RNR NAK, PSN unchanged.
    Rnr,
    /// Fatal for the QP: NAK with this code, then error with this status;
    /// the words say why (kept for diagnostics).
    Fatal(NakCode, WcStatus, &'static str),
}

impl Qp {
    fn nak(&mut self, psn: Psn, code: NakCode, then: Option<WcStatus>) {
        self.counters.naks_sent += 1;
        let aeth = nak(code, self.resp.msn);
        self.resp.queue.push_back(Response::Nak { psn, aeth, then });
    }

    fn take_recv_wqe(&mut self, mem: &mut (impl Memory + ?Sized)) -> Option<RecvWqe> {
        if self.cfg.srq {
            mem.srq_pop()
        } else {
            self.resp.rq.pop_front()
        }
    }

    pub(crate) fn handle_request(
        &mut self,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) {
        if self.resp.dead {
            self.counters.dropped += 1;
            return;
        }
        match self.cfg.qp_type {
            QpType::Rc => self.rc_request(pkt, info, mem),
            QpType::Uc => self.uc_request(pkt, info, mem),
            _ => self.ud_request(pkt, info, mem),
        }
    }

    fn rc_request(&mut self, pkt: &Packet<&[u8]>, info: &OpInfo, mem: &mut (impl Memory + ?Sized)) {
        let d = pkt.bth.psn.diff(self.resp.epsn);
        if d > 0 {
            // IBA 9.7.5.2.2: one NAK per gap, until the expected PSN arrives.
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_seq_sent {
                self.resp.nak_seq_sent = true;
                let epsn = self.resp.epsn;
                self.nak(epsn, NakCode::PsnSequenceError, None);
            }
            return;
        }
        if d < 0 {
            self.counters.duplicates += 1;
            self.duplicate_request(pkt, info);
            return;
        }
        self.resp.nak_seq_sent = false;
        self.counters.rx_packets += 1;
        match self.in_sequence(pkt, info, mem) {
            Step::Advance(n) => {
                self.resp.epsn = self.resp.epsn.add(n);
                if pkt.bth.ack_req && matches!(info.kind, Kind::Send | Kind::RdmaWrite) {
                    self.resp.push_ack(pkt.bth.psn);
                }
            }
            Step::Rnr => {
                self.counters.rnr_naks_sent += 1;
                self.counters.naks_sent += 1;
                let aeth = rnr_nak(self.cfg.min_rnr_timer, self.resp.msn);
                self.resp.queue.push_back(Response::Nak {
                    psn: pkt.bth.psn,
                    aeth,
                    then: None,
                });
            }
            Step::Fatal(code, status, why) => {
                self.last_error = Some(why);
                self.resp.dead = true;
                self.nak(pkt.bth.psn, code, Some(status));
            }
        }
    }

    /// IBA 9.7.5.2.3 / 9.7.6: re-ACK SEND/WRITE, re-execute READ, replay atomics.
    fn duplicate_request(&mut self, pkt: &Packet<&[u8]>, info: &OpInfo) {
        match info.kind {
            // ACKed with its own PSN: true whatever was received after it
            // (ACKs are cumulative), and the resends that follow are ACKed
            // in turn. (Linux rxe ACKs the newest PSN instead; either is
            // accepted. The rxe stall once blamed on the newest PSN was rxe
            // failing its own retry, see `AckRepeat`.)
            Kind::Send | Kind::RdmaWrite if pkt.bth.ack_req => {
                self.resp.push_ack(pkt.bth.psn);
            }
            Kind::RdmaReadRequest => {
                let known = self.resp.resources.iter().any(|r| match r {
                    Resource::Read { first, npkts } => {
                        pkt.bth.psn.diff(*first) >= 0 && pkt.bth.psn.diff(first.add(*npkts)) < 0
                    }
                    Resource::Atomic { .. } => false,
                });
                if let (true, Some(reth)) = (known, pkt.ext.reth) {
                    // The requester goes back to this PSN and re-sends what
                    // follows: responses still queued from here on would be
                    // sent twice and hold responder resources.
                    let from = pkt.bth.psn;
                    let pmtu = self.resp.pmtu;
                    self.resp.queue.retain(|r| match r {
                        // Keep only jobs that end before the PSN asked for;
                        // one that covers it is replaced by the new job.
                        Response::Read(job) => {
                            job.psn.add(job.len.div_ceil(pmtu).max(1) as u32).diff(from) <= 0
                        }
                        Response::Atomic { psn, .. } => psn.diff(from) < 0,
                        _ => true,
                    });
                    let msn = self.resp.msn;
                    self.resp.queue.push_back(Response::Read(ReadJob {
                        psn: pkt.bth.psn,
                        va: reth.va,
                        rkey: reth.rkey,
                        len: u64::from(reth.dma_len),
                        done: 0,
                        msn,
                        duplicate: true,
                    }));
                }
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let cached = self.resp.resources.iter().find_map(|r| match r {
                    Resource::Atomic { psn, orig } if *psn == pkt.bth.psn => Some(*orig),
                    _ => None,
                });
                if let Some(orig) = cached {
                    let msn = self.resp.msn;
                    self.resp.queue.push_back(Response::Atomic {
                        psn: pkt.bth.psn,
                        orig,
                        msn,
                    });
                }
            }
            _ => {}
        }
    }

    /// Checks that `pos` may follow what is in progress (IBA 9.7.5.2.4).
    fn sequence_ok(&self, kind: Kind, pos: Position) -> bool {
        match self.resp.in_progress {
            Some(k) => k == kind && !pos.starts(),
            None => pos.starts(),
        }
    }

    fn in_sequence(
        &mut self,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) -> Step {
        let pmtu = self.resp.pmtu;
        let plen = pkt.payload.len() as u64;
        match info.kind {
            Kind::Send | Kind::RdmaWrite => {
                let full = matches!(info.position, Position::First | Position::Middle);
                if !self.sequence_ok(info.kind, info.position)
                    || (full && plen != pmtu)
                    || plen > pmtu
                {
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "SEND/WRITE packet out of order or with a bad length",
                    );
                }
                if info.kind == Kind::Send {
                    self.rc_send(pkt, info, mem)
                } else {
                    self.rc_write(pkt, info, mem)
                }
            }
            Kind::RdmaReadRequest => {
                if self.resp.in_progress.is_some() {
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "READ request inside a SEND/WRITE message",
                    );
                }
                let Some(reth) = pkt.ext.reth else {
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "READ request without RETH",
                    );
                };
                let len = u64::from(reth.dma_len);
                // Responder resources are a ring (as in Linux rxe): a
                // requester keeps at most max_dest_rd_atomic READs in flight,
                // so when a new one finds the ring full, the oldest queued
                // job -- a re-execution first -- belongs to a READ the
                // requester has finished or will ask for again.
                let cap = usize::from(self.cfg.max_dest_rd_atomic.max(1));
                while self
                    .resp
                    .queue
                    .iter()
                    .filter(|r| matches!(r, Response::Read(_)))
                    .count()
                    >= cap
                {
                    let victim = self
                        .resp
                        .queue
                        .iter()
                        .position(|r| matches!(r, Response::Read(j) if j.duplicate))
                        .or_else(|| {
                            self.resp
                                .queue
                                .iter()
                                .position(|r| matches!(r, Response::Read(_)))
                        });
                    match victim {
                        Some(i) => {
                            self.resp.queue.remove(i);
                            self.counters.read_jobs_evicted += 1;
                        }
                        None => break,
                    }
                }
                if len > 0
                    && mem
                        .remote_check(reth.rkey, reth.va, len, RemoteAccess::Read)
                        .is_err()
                {
                    return Step::Fatal(
                        NakCode::RemoteAccessError,
                        WcStatus::LocAccessErr,
                        "READ outside the region or without remote read access",
                    );
                }
                let npkts = len.div_ceil(pmtu).max(1) as u32;
                self.resp.msn = (self.resp.msn + 1) & 0xFF_FFFF;
                let msn = self.resp.msn;
                let cap = self.cfg.max_dest_rd_atomic;
                self.resp.remember(
                    Resource::Read {
                        first: pkt.bth.psn,
                        npkts,
                    },
                    cap,
                );
                self.resp.queue.push_back(Response::Read(ReadJob {
                    psn: pkt.bth.psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    len,
                    done: 0,
                    msn,
                    duplicate: false,
                }));
                Step::Advance(npkts)
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let Some(a) = pkt
                    .ext
                    .atomic_eth
                    .filter(|_| self.resp.in_progress.is_none())
                else {
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "atomic without AtomicETH or inside a message",
                    );
                };
                if !a.va.is_multiple_of(8) {
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "atomic target not 8-byte aligned",
                    );
                }
                let compare = (info.kind == Kind::CompareSwap).then_some(a.compare);
                let orig = match mem.remote_atomic(a.rkey, a.va, compare, a.swap_add) {
                    Ok(v) => v,
                    Err(MemoryError::Misaligned) => {
                        return Step::Fatal(
                            NakCode::InvalidRequest,
                            WcStatus::RemInvReqErr,
                            "atomic target not 8-byte aligned",
                        )
                    }
                    Err(_) => {
                        return Step::Fatal(
                            NakCode::RemoteAccessError,
                            WcStatus::LocAccessErr,
                            "atomic outside the region or without remote atomic access",
                        )
                    }
                };
                self.resp.msn = (self.resp.msn + 1) & 0xFF_FFFF;
                let msn = self.resp.msn;
                let cap = self.cfg.max_dest_rd_atomic;
                self.resp.remember(
                    Resource::Atomic {
                        psn: pkt.bth.psn,
                        orig,
                    },
                    cap,
                );
                self.resp.queue.push_back(Response::Atomic {
                    psn: pkt.bth.psn,
                    orig,
                    msn,
                });
                Step::Advance(1)
            }
            _ => Step::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "opcode not served by an RC responder",
            ),
        }
    }

    fn rc_send(
        &mut self,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) -> Step {
        if info.position.starts() {
            match self.take_recv_wqe(mem) {
                Some(w) => self.resp.cur_recv = Some((w, 0)),
                None => return Step::Rnr,
            }
        }
        let Some((wqe, offset)) = self.resp.cur_recv.take() else {
            return Step::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "SEND continuation without a message in progress",
            );
        };
        if let Err(e) = scatter(mem, &wqe.sges, offset, pkt.payload) {
            let status = if e == MemoryError::OutOfRange {
                WcStatus::LocLenErr
            } else {
                WcStatus::LocProtErr
            };
            self.completions
                .push_back(Completion::recv(wqe.wr_id, status, WcOpcode::Recv, 0));
            let code = if e == MemoryError::OutOfRange {
                NakCode::InvalidRequest
            } else {
                NakCode::RemoteOperationalError
            };
            return Step::Fatal(code, status, "receive buffer too small or not writable");
        }
        let placed = offset + pkt.payload.len() as u64;
        if info.position.ends() {
            let mut wc =
                Completion::recv(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, placed as u32);
            wc.imm = pkt.ext.imm_dt.map(|i| i.imm);
            wc.solicited = pkt.bth.solicited;
            if let Some(rkey) = pkt.ext.ieth.map(|i| i.rkey) {
                if mem.invalidate(rkey).is_err() {
                    // Not a bound type 2 window of this PD (an MR's key, a
                    // type 1 window, another PD's key, a stale key): the
                    // receive completes with a remote invalid request
                    // error and the QP goes to error, as Linux rxe has it
                    // (its "class J"); our requester is told by a NAK.
                    wc.status = WcStatus::RemInvReqErr;
                    self.completions.push_back(wc);
                    return Step::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "SEND with invalidate of an R_Key that is not a bound type 2 window",
                    );
                }
                wc.invalidated = Some(rkey);
            }
            self.completions.push_back(wc);
            self.resp.msn = (self.resp.msn + 1) & 0xFF_FFFF;
            self.resp.in_progress = None;
        } else {
            self.resp.cur_recv = Some((wqe, placed));
            self.resp.in_progress = Some(Kind::Send);
        }
        Step::Advance(1)
    }

    fn rc_write(
        &mut self,
        pkt: &Packet<&[u8]>,
        info: &OpInfo,
        mem: &mut (impl Memory + ?Sized),
    ) -> Step {
        if info.position.starts() {
            let Some(reth) = pkt.ext.reth else {
                return Step::Fatal(
                    NakCode::InvalidRequest,
                    WcStatus::RemInvReqErr,
                    "WRITE first packet without RETH",
                );
            };
            let len = u64::from(reth.dma_len);
            if len > 0
                && mem
                    .remote_check(reth.rkey, reth.va, len, RemoteAccess::Write)
                    .is_err()
            {
                return Step::Fatal(
                    NakCode::RemoteAccessError,
                    WcStatus::LocAccessErr,
                    "WRITE outside the region or without remote write access",
                );
            }
            self.resp.cur_write = Some(WriteState {
                va: reth.va,
                rkey: reth.rkey,
                len,
                done: 0,
            });
        }
        let Some((w_va, w_rkey, w_len, w_done)) = self
            .resp
            .cur_write
            .as_ref()
            .map(|w| (w.va, w.rkey, w.len, w.done))
        else {
            return Step::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "WRITE continuation without a message in progress",
            );
        };
        let plen = pkt.payload.len() as u64;
        let total_after = w_done + plen;
        if total_after > w_len || (info.position.ends() && total_after != w_len) {
            return Step::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "WRITE payload longer or shorter than its RETH length",
            );
        }
        // WRITE with immediate consumes a receive WQE at its last packet;
        // check before touching memory so an RNR retry starts clean.
        let recv = if info.has_immediate() {
            match self.take_recv_wqe(mem) {
                Some(wqe) => Some(wqe),
                None => return Step::Rnr,
            }
        } else {
            None
        };
        if plen > 0
            && mem
                .remote_write(w_rkey, w_va.wrapping_add(w_done), pkt.payload)
                .is_err()
        {
            return Step::Fatal(
                NakCode::RemoteAccessError,
                WcStatus::LocAccessErr,
                "WRITE outside the region or without remote write access",
            );
        }
        let total = w_len;
        if info.position.ends() {
            if let Some(wqe) = recv {
                let mut wc = Completion::recv(
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total as u32,
                );
                wc.imm = pkt.ext.imm_dt.map(|i| i.imm);
                wc.solicited = pkt.bth.solicited;
                self.completions.push_back(wc);
            }
            self.resp.msn = (self.resp.msn + 1) & 0xFF_FFFF;
            self.resp.cur_write = None;
            self.resp.in_progress = None;
        } else {
            if let Some(w) = self.resp.cur_write.as_mut() {
                w.done = total_after;
            }
            self.resp.in_progress = Some(Kind::RdmaWrite);
        }
        Step::Advance(1)
    }

    /// UC (IBA 9.8.3): no ACKs; a lost packet discards the rest of its
    /// message, and the receive WQE is reused for the next one.
    fn uc_request(&mut self, pkt: &Packet<&[u8]>, info: &OpInfo, mem: &mut (impl Memory + ?Sized)) {
        if pkt.bth.psn != self.resp.epsn {
            self.counters.out_of_sequence += 1;
            if let Some((wqe, _)) = self.resp.cur_recv.take() {
                self.resp.rq.push_front(wqe);
            }
            self.resp.cur_write = None;
            self.resp.in_progress = None;
            self.resp.discarding = true;
        }
        if self.resp.discarding {
            if !info.position.starts() {
                self.counters.dropped += 1;
                self.resp.epsn = pkt.bth.psn.next();
                return;
            }
            self.resp.discarding = false;
        }
        self.resp.epsn = pkt.bth.psn;
        self.counters.rx_packets += 1;
        let step = match info.kind {
            Kind::Send | Kind::RdmaWrite if !self.sequence_ok(info.kind, info.position) => {
                Step::Fatal(
                    NakCode::InvalidRequest,
                    WcStatus::RemInvReqErr,
                    "UC packet out of order",
                )
            }
            Kind::Send => self.rc_send(pkt, info, mem),
            Kind::RdmaWrite => self.rc_write(pkt, info, mem),
            _ => Step::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "opcode not served by a UC responder",
            ),
        };
        match step {
            Step::Advance(n) => self.resp.epsn = pkt.bth.psn.add(n),
            // No receive WQE or a bad message: drop it silently.
            Step::Rnr | Step::Fatal(..) => {
                self.counters.dropped += 1;
                self.resp.cur_write = None;
                self.resp.in_progress = None;
                self.resp.discarding = true;
                self.resp.epsn = pkt.bth.psn.next();
            }
        }
    }

    /// UD, GSI, SMI (IBA 9.6.2, 10.2.4): Q_Key check, one packet per message,
    /// GRH in the first 40 bytes of the buffer, silent drop without a WQE.
    fn ud_request(&mut self, pkt: &Packet<&[u8]>, info: &OpInfo, mem: &mut (impl Memory + ?Sized)) {
        let Some(deth) = pkt.ext.deth else {
            self.counters.dropped += 1;
            return;
        };
        if info.kind != Kind::Send
            || info.position != Position::Only
            || pkt.payload.len() as u64 > self.resp.pmtu
        {
            self.counters.dropped += 1;
            return;
        }
        if self.cfg.qp_type != QpType::Smi && deth.qkey != self.cfg.qkey {
            self.counters.qkey_violations += 1;
            return;
        }
        if self.cfg.qp_type == QpType::Ud && !pkt.bth.pkey.matches(self.cfg.pkey) {
            self.counters.pkey_violations += 1;
            return;
        }
        let Some(wqe) = self.take_recv_wqe(mem) else {
            self.counters.ud_no_wqe_drops += 1;
            return;
        };
        self.counters.rx_packets += 1;
        let grh = pkt.grh.unwrap_or([0; 40]);
        let placed =
            scatter(mem, &wqe.sges, 0, &grh).and_then(|_| scatter(mem, &wqe.sges, 40, pkt.payload));
        let mut wc = Completion::recv(
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            40 + pkt.payload.len() as u32,
        );
        wc.src_qp = Some(deth.src_qp);
        wc.grh = true;
        wc.imm = pkt.ext.imm_dt.map(|i| i.imm);
        wc.solicited = pkt.bth.solicited;
        if let Err(e) = placed {
            wc.status = if e == MemoryError::OutOfRange {
                WcStatus::LocLenErr
            } else {
                WcStatus::LocProtErr
            };
            wc.byte_len = 0;
        }
        self.completions.push_back(wc);
    }

    /// The next response packet (ACK, NAK, READ response, atomic ACK).
    pub(crate) fn poll_response(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
        out: &mut Packet<Payload>,
    ) -> bool {
        // Most calls find nothing: answer before working out the credits.
        if self.cfg.qp_type != QpType::Rc || self.resp.queue.is_empty() {
            return false;
        }
        let pkey = self.cfg.pkey;
        let dest = self.cfg.dest_qpn;
        let credits = if self.cfg.srq {
            CreditCount::for_available(None)
        } else {
            CreditCount::for_available(Some(self.resp.rq.len() as u32))
        };
        let pmtu = self.resp.pmtu;
        let Some(front) = self.resp.queue.front_mut() else {
            return false;
        };
        *out = match front {
            Response::Ack { psn, msn, copy } => {
                let p = acknowledge(pkey, dest, *psn, ack(credits, *msn));
                // The next copy of this ACK, while there are copies left.
                let next = usize::from(*copy);
                self.resp.ack_repeat = AckRepeat::DELAYS
                    .get(next)
                    .map(|d| (now + *d, *psn, *msn, *copy + 1));
                self.resp.queue.pop_front();
                p
            }
            Response::Nak { psn, aeth, then } => {
                let p = acknowledge(pkey, dest, *psn, *aeth);
                let then = *then;
                self.resp.queue.pop_front();
                if let Some(status) = then {
                    // Send the NAK first, then stop: the error state drops
                    // every later packet (IBA 9.9.2).
                    self.set_error_after_send(status);
                }
                p
            }
            Response::Atomic { psn, orig, msn } => {
                let mut p = Packet::new(Opcode::RcAtomicAcknowledge, pkey, dest, *psn);
                p.ext.aeth = Some(ack(credits, *msn));
                p.ext.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: *orig });
                self.resp.queue.pop_front();
                p
            }
            Response::Read(job) => {
                let (index, npkts) = job.at(pmtu);
                let pos = Position::of(index, npkts);
                let len = (job.len - job.done).min(pmtu) as usize;
                let psn = job.psn.add(index);
                let va = job.va.wrapping_add(job.done);
                // Lent straight from the region when it can be.
                let pinned = if len < crate::mem::PIN_MIN {
                    Ok(None)
                } else {
                    mem.pin_remote(job.rkey, va, len)
                };
                let read = pinned.and_then(|pinned| match pinned {
                    Some(p) => Ok(Payload::Pinned(p)),
                    None => {
                        let mut payload = self.payloads.take(len);
                        if len > 0 {
                            mem.remote_read(job.rkey, va, &mut payload)?;
                        }
                        Ok(Payload::Owned(payload))
                    }
                });
                let Ok(payload) = read else {
                    let first = job.psn;
                    self.resp.queue.pop_front();
                    self.resp.dead = true;
                    self.counters.naks_sent += 1;
                    let p = acknowledge(
                        pkey,
                        dest,
                        first,
                        nak(NakCode::RemoteAccessError, self.resp.msn),
                    );
                    self.set_error_after_send(WcStatus::LocAccessErr);
                    *out = p;
                    return true;
                };
                let mut p = Packet::new(
                    opcode(Transport::Rc, Kind::RdmaReadResponse, pos, false, false),
                    pkey,
                    dest,
                    psn,
                );
                if pos != Position::Middle {
                    p.ext.aeth = Some(ack(credits, job.msn));
                }
                p.payload = payload;
                job.done += len as u64;
                if pos.ends() {
                    self.resp.queue.pop_front();
                }
                p
            }
        };
        true
    }

    /// The next response packets when they are middle packets of the
    /// RDMA READ response being sent (neither its first nor its last,
    /// which carry an AETH: a BTH alone and a full path MTU of payload
    /// each), at most `max` (and 64) of them, whose bytes the memory lends
    /// in one piece: their first PSN and payloads, with the QP moved on as
    /// that many [`Qp::poll_transmit_into`] calls would have had no
    /// request gone between them. Every other header field is the one of
    /// the response's first or middle packet before them (the opcode a
    /// middle one's, AETH dropped), so a driver that just sent one can
    /// send these from that header without building them. `None`: build
    /// the next packet with [`Qp::poll_transmit_into`] (nothing has
    /// changed).
    pub fn poll_middle_responses(
        &mut self,
        mem: &mut (impl Memory + ?Sized),
        max: usize,
    ) -> Option<MiddleRun> {
        if self.cfg.qp_type != QpType::Rc || self.mode != Mode::Active {
            return None;
        }
        let pmtu = self.resp.pmtu;
        let Some(Response::Read(job)) = self.resp.queue.front_mut() else {
            return None;
        };
        let (index, npkts) = job.at(pmtu);
        if index == 0 || index + 1 >= npkts {
            return None;
        }
        let count = (npkts - 1 - index).min(max.min(64) as u32);
        let len = usize::try_from(u64::from(count) * pmtu).ok()?;
        if count == 0 || len < crate::mem::PIN_MIN {
            return None;
        }
        let va = job.va.wrapping_add(job.done);
        let pinned = mem.pin_remote(job.rkey, va, len).ok()??;
        let psn = job.psn.add(index);
        job.done += len as u64;
        self.counters.tx_packets += u64::from(count);
        // As many turns as calls of poll_transmit_into.
        self.turn ^= count % 2 == 1;
        Some(MiddleRun {
            psn,
            count: count as usize,
            ack_req: 0,
            ends: false,
            solicited: false,
            each: pmtu as usize,
            payload: Payload::Pinned(pinned),
        })
    }

    fn set_error_after_send(&mut self, status: WcStatus) {
        // The packet being returned is already built; entering the error
        // state now flushes the queues without dropping it.
        self.set_error(status);
    }

    /// Whether the QP may still transmit (used by tests).
    pub fn is_active(&self) -> bool {
        matches!(self.mode, Mode::Active | Mode::Draining)
    }
}

/// An RC Acknowledge packet (ACK, NAK or RNR NAK, as `aeth` says).
fn acknowledge(pkey: Pkey, dest: Qpn, psn: Psn, aeth: AethRepr) -> Packet<Payload> {
    let mut p = Packet::new(Opcode::RcAcknowledge, pkey, dest, psn);
    p.ext.aeth = Some(aeth);
    p
}
