//! One queue pair's transport state, and the dispatch between requester,
//! completer and responder.

use crate::mem::Memory;
use crate::packet::{transport_of, Packet, Payload};
use crate::req::Requester;
use crate::resp::Responder;
use crate::wqe::{Completion, RecvWqe, SendWqe};
use rdma_types::{Duration, Instant, Mtu, Pkey, Psn, Qkey, QpType, Qpn, WcStatus};
use rdma_wire::Kind;
use std::collections::VecDeque;

/// Transport attributes of a QP, as set by modify-QP (IBA 11.2.4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpConfig {
    /// Service type.
    pub qp_type: QpType,
    /// This QP's number.
    pub qpn: Qpn,
    /// Connected peer QP (RC/UC).
    pub dest_qpn: Qpn,
    /// Path MTU.
    pub pmtu: Mtu,
    /// First PSN the requester sends.
    pub sq_psn: Psn,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// Local ACK timeout exponent (4.096 us * 2^n; 0 = infinite).
    pub timeout: u8,
    /// Transport retries on timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this responder advertises in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Initiator depth: outstanding READs/atomics this requester may have.
    pub max_rd_atomic: u8,
    /// Responder resources: READs/atomics remembered for duplicates.
    pub max_dest_rd_atomic: u8,
    /// Partition key of the QP.
    pub pkey: Pkey,
    /// Q_Key for UD.
    pub qkey: Qkey,
    /// The requester sets AckReq at least every this many packets.
    pub ack_req_every: u32,
    /// Receives come from a shared receive queue.
    pub srq: bool,
}

impl QpConfig {
    /// Defaults for an RC QP between `qpn` and `dest_qpn`, as ibverbs
    /// examples use them (MTU 1024, timeout 14, retries 7).
    pub fn rc(qpn: Qpn, dest_qpn: Qpn) -> QpConfig {
        QpConfig {
            qp_type: QpType::Rc,
            qpn,
            dest_qpn,
            pmtu: Mtu::Mtu1024,
            sq_psn: Psn::new(0),
            rq_psn: Psn::new(0),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            pkey: Pkey::DEFAULT,
            qkey: Qkey(0),
            ack_req_every: 64,
            srq: false,
        }
    }
}

/// Asynchronous events a QP raises (IBA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// The first packet arrived while the QP was in RTR.
    CommEstablished,
    /// The QP entered the error state; the status says why.
    Error(WcStatus),
    /// SQD: every outstanding send completed.
    SqDrained,
    /// Last WQE reached (QP on an SRQ in error).
    LastWqeReached,
}

/// Counters for diagnostics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets sent.
    pub tx_packets: u64,
    /// Packets received and accepted.
    pub rx_packets: u64,
    /// Packets retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Duplicate requests seen by the responder.
    pub duplicates: u64,
    /// Out-of-sequence requests seen by the responder.
    pub out_of_sequence: u64,
    /// NAKs (of any kind) sent.
    pub naks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// Packets dropped for a P_Key mismatch.
    pub pkey_violations: u64,
    /// Datagrams dropped for a Q_Key mismatch.
    pub qkey_violations: u64,
    /// Datagrams dropped for want of a receive WQE.
    pub ud_no_wqe_drops: u64,
    /// Packets dropped as malformed or unexpected.
    pub dropped: u64,
    /// Queued READ responses dropped because a new READ found the
    /// responder resources full (the ring overwrote the oldest).
    pub read_jobs_evicted: u64,
}

impl std::ops::AddAssign for QpCounters {
    fn add_assign(&mut self, o: QpCounters) {
        self.tx_packets += o.tx_packets;
        self.rx_packets += o.rx_packets;
        self.retransmits += o.retransmits;
        self.timeouts += o.timeouts;
        self.duplicates += o.duplicates;
        self.out_of_sequence += o.out_of_sequence;
        self.naks_sent += o.naks_sent;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.rnr_naks_received += o.rnr_naks_received;
        self.seq_naks_received += o.seq_naks_received;
        self.pkey_violations += o.pkey_violations;
        self.qkey_violations += o.qkey_violations;
        self.ud_no_wqe_drops += o.ud_no_wqe_drops;
        self.dropped += o.dropped;
        self.read_jobs_evicted += o.read_jobs_evicted;
    }
}

/// Which parts of the QP run, from the verbs state (IBA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// RTR: the responder runs, the requester does not.
    ReceiveOnly,
    /// RTS: both run.
    Active,
    /// SQD: no new WQEs start; outstanding ones finish.
    Draining,
    /// SQE (UC, UD; IBA 10.3.1.6): a send error stopped the requester and
    /// flushed the send queue; the responder runs on. RTS resumes.
    SendError,
    /// ERR: everything is flushed; packets are dropped.
    Error,
}

/// The transport engine of one QP.
#[derive(Debug)]
pub struct Qp {
    pub(crate) cfg: QpConfig,
    pub(crate) mode: Mode,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    pub(crate) completions: VecDeque<Completion>,
    pub(crate) events: VecDeque<QpEvent>,
    pub(crate) counters: QpCounters,
    /// Alternate between responder and requester output.
    pub(crate) turn: bool,
    /// SQD: the drained event has been delivered.
    pub(crate) drain_reported: bool,
    /// Why the responder last refused a request (diagnostics).
    pub(crate) last_error: Option<&'static str>,
    /// Payload buffers to reuse.
    pub(crate) payloads: crate::packet::PayloadPool,
}

impl Qp {
    /// A QP in RTR with `cfg`; call [`Qp::set_rts`] to start the requester.
    pub fn new(cfg: QpConfig) -> Qp {
        Qp {
            req: Requester::new(&cfg),
            resp: Responder::new(&cfg),
            cfg,
            mode: Mode::ReceiveOnly,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            counters: QpCounters::default(),
            turn: false,
            drain_reported: false,
            last_error: None,
            payloads: Default::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn counters(&self) -> QpCounters {
        self.counters
    }

    /// RTR -> RTS (or SQD -> RTS, SQE -> RTS): the requester may send.
    pub fn set_rts(&mut self) {
        if self.mode != Mode::Error {
            self.mode = Mode::Active;
            self.drain_reported = false;
        }
    }

    /// Sets the requester's first PSN, as modify-QP RTR->RTS does (IBA
    /// 11.2.4.2 `sq_psn`). Refused (false) once the requester has sent.
    pub fn set_sq_psn(&mut self, psn: Psn) -> bool {
        if !self.req.start_at(psn) {
            return false;
        }
        self.cfg.sq_psn = psn;
        true
    }

    /// RTS -> SQD: finish what is outstanding, start nothing new.
    pub fn set_sqd(&mut self) {
        if self.mode == Mode::Active {
            self.mode = Mode::Draining;
            self.check_drained();
        }
    }

    /// Updates retry/timeout attributes (modify QP in RTS/SQD).
    pub fn update_config(&mut self, f: impl FnOnce(&mut QpConfig)) {
        f(&mut self.cfg);
        self.req.reconfigure(&self.cfg);
    }

    /// Why the responder last refused a request with a NAK, in words.
    pub fn last_error(&self) -> Option<&'static str> {
        self.last_error
    }

    /// Whether the QP is in the error state.
    pub fn is_error(&self) -> bool {
        self.mode == Mode::Error
    }

    /// Whether a send error stopped the send queue of this UC/UD QP (the
    /// SQE state); [`Qp::set_rts`] resumes it.
    pub fn is_send_error(&self) -> bool {
        self.mode == Mode::SendError
    }

    /// Number of send WQEs not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.len()
    }

    /// Number of receive WQEs posted and not consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq_len()
    }

    /// Queues a send WQE. In the error and SQE states it is flushed at
    /// once (IBA 10.8.3.3: posting to an errored QP completes with flush;
    /// 10.3.1.6 likewise for a send queue in error).
    pub fn post_send(&mut self, wqe: SendWqe) {
        if matches!(self.mode, Mode::Error | Mode::SendError) {
            self.completions.push_back(Completion::send(
                wqe.wr_id,
                wqe.op,
                WcStatus::WrFlushErr,
                0,
            ));
            return;
        }
        self.req.post(wqe, &self.cfg);
    }

    /// Queues a receive WQE (QPs without an SRQ).
    pub fn post_recv(&mut self, wqe: RecvWqe) {
        if self.mode == Mode::Error {
            self.completions.push_back(Completion::recv(
                wqe.wr_id,
                WcStatus::WrFlushErr,
                rdma_types::WcOpcode::Recv,
                0,
            ));
            return;
        }
        self.resp.post_recv(wqe);
    }

    /// Moves the QP to the error state: every WQE is flushed (IBA 10.3.1).
    pub fn set_error(&mut self, why: WcStatus) {
        if self.mode == Mode::Error {
            return;
        }
        self.mode = Mode::Error;
        self.req.flush(&mut self.completions);
        self.resp.flush(&mut self.completions);
        self.events.push_back(QpEvent::Error(why));
        if self.cfg.srq {
            self.events.push_back(QpEvent::LastWqeReached);
        }
    }

    /// A UC/UD send error (IBA 10.3.1.6): the failed WQE completes with
    /// its error, the WQEs behind it flush, the requester stops; receives
    /// go on. No asynchronous event: the error completion says it all.
    pub(crate) fn set_send_error(&mut self) {
        if matches!(self.mode, Mode::Error | Mode::SendError) {
            return;
        }
        self.mode = Mode::SendError;
        self.req.flush_send_error(&mut self.completions);
    }

    /// A packet addressed to this QP arrived.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        pkt: &Packet<&[u8]>,
        mem: &mut (impl Memory + ?Sized),
    ) {
        if self.mode == Mode::Error {
            self.counters.dropped += 1;
            return;
        }
        // IBA 9.6.1.3 / 10.9.3: P_Key check; mismatch drops silently.
        if !self.cfg.qp_type.is_datagram() && !pkt.bth.pkey.matches(self.cfg.pkey) {
            self.counters.pkey_violations += 1;
            return;
        }
        let Some(info) = pkt.bth.opcode.info() else {
            self.counters.dropped += 1;
            return;
        };
        if info.transport != transport_of(self.cfg.qp_type) {
            self.counters.dropped += 1;
            return;
        }
        match info.kind {
            Kind::Acknowledge | Kind::AtomicAcknowledge | Kind::RdmaReadResponse => {
                if self.mode == Mode::ReceiveOnly {
                    self.counters.dropped += 1;
                    return;
                }
                self.counters.rx_packets += 1;
                self.handle_response(now, pkt, info, mem);
            }
            _ => {
                if self.resp.comm_pending && self.mode == Mode::ReceiveOnly {
                    self.events.push_back(QpEvent::CommEstablished);
                }
                self.resp.comm_pending = false;
                self.handle_request(pkt, info, mem);
            }
        }
        self.check_drained();
    }

    /// Gives back the payload of a packet from [`Qp::poll_transmit`] once
    /// it is sent, for later packets to reuse (optional: a driver that
    /// drops payloads only costs an allocation per packet).
    pub fn recycle_payload(&mut self, buf: Vec<u8>) {
        self.payloads.give(buf);
    }

    /// The next packet to send, or `None`. One packet per call. A payload
    /// lent by registered memory is copied into an engine buffer here; a
    /// driver that can send lent bytes uses [`Qp::poll_transmit_lent`].
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
    ) -> Option<Packet<Vec<u8>>> {
        let p = self.poll_transmit_lent(now, mem)?;
        let payload = match p.payload {
            Payload::Owned(v) => v,
            Payload::Pinned(lent) => {
                let mut v = self.payloads.take(lent.as_slice().len());
                v.copy_from_slice(lent.as_slice());
                v
            }
        };
        Some(Packet {
            bth: p.bth,
            ext: p.ext,
            payload,
            grh: p.grh,
            ud_dest: p.ud_dest,
        })
    }

    /// The next packet to send, or `None`, its payload possibly lent by
    /// registered memory ([`Payload::Pinned`]): the packet keeps the
    /// region's allocation alive until dropped, so sending it after the
    /// region was deregistered reads no freed memory. Give
    /// [`Payload::Owned`] buffers back with [`Qp::recycle_payload`].
    pub fn poll_transmit_lent(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
    ) -> Option<Packet<Payload>> {
        let mut pkt = Packet::default();
        self.poll_transmit_into(now, mem, &mut pkt).then_some(pkt)
    }

    /// [`Qp::poll_transmit_lent`] into a packet the driver keeps between
    /// calls: the packet is built where it lies instead of being moved
    /// out through the engine's layers (a few hundred bytes, several
    /// times per packet). Returns whether `out` now holds a packet to
    /// send; when it does not, what `out` holds means nothing. Whatever
    /// `out` held is dropped when it is overwritten, so take its payload
    /// first.
    pub fn poll_transmit_into(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
        out: &mut Packet<Payload>,
    ) -> bool {
        if self.mode == Mode::Error {
            return false;
        }
        // Responses first on alternate calls so neither side starves.
        self.turn = !self.turn;
        let responses_first = self.turn;
        let built = responses_first && self.poll_response(now, mem, out)
            || self.poll_request(now, mem, out)
            || !responses_first && self.poll_response(now, mem, out);
        if built {
            self.counters.tx_packets += 1;
        }
        self.check_drained();
        built
    }

    /// The earliest deadline the QP wants [`Qp::handle_timeout`] at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.mode == Mode::Error {
            return None;
        }
        [self.req.next_deadline(), self.resp.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Handles expired deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.mode == Mode::Error {
            return;
        }
        self.requester_timeout(now);
        self.resp.handle_timeout(now);
    }

    /// The next completion, in the order the spec requires.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    fn check_drained(&mut self) {
        if self.mode == Mode::Draining && !self.drain_reported && self.req.is_idle() {
            // Reported once; the QP stays in SQD until moved back to RTS.
            self.drain_reported = true;
            self.events.push_back(QpEvent::SqDrained);
        }
    }

    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        Duration::from_ack_timeout_exp(self.cfg.timeout)
    }
}
