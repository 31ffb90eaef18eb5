//! The connection state machine: one TCP stream's MPA negotiation, then
//! DDP/RDMAP in FPDUs until a TERMINATE or the end.
//!
//! Call order, per connection:
//! 1. [`Connection::new`] once the TCP connection is up (the initiator's
//!    MPA request is queued at once);
//! 2. [`Connection::post_send`] / [`Connection::post_recv`] as the consumer
//!    posts work (sends wait until the connection is established);
//! 3. [`Connection::handle_bytes`] with every chunk the socket read, of any
//!    size; a responder then sees [`Event::ConnectRequest`] and answers
//!    with [`Connection::accept`] or [`Connection::reject`];
//! 4. [`Connection::poll_transmit`] until it returns `false` (bounded: one
//!    MPA frame or one FPDU per call), writing what it appended in order;
//! 5. [`Connection::handle_timeout`] once [`Connection::poll_timeout`] has
//!    passed (the timers: the initiator's wait for the MPA reply, and its
//!    hold of the first FPDU after it, [`Config::first_fpdu_hold`], during
//!    which `poll_transmit` gives only MPA frames and TERMINATEs; TCP
//!    retransmits, so there is no transport timer);
//! 6. [`Connection::poll_completion`] and [`Connection::poll_event`] until
//!    `None`;
//! 7. [`Connection::handle_stream_closed`] when the stream ends under it
//!    (EOF, a reset), [`Connection::abort`] when the consumer ends it.
//!
//! Memory may lend receive buffers from a queue shared by several
//! connections ([`Memory::shared_recv`]): a Send that finds none of the
//! connection's own takes one there. A zero-length RDMA Write or Read
//! names no memory and is neither checked nor placed.
//!
//! After [`Event::TerminateSent`] or [`Event::TerminateReceived`] the
//! driver sends what `poll_transmit` still gives and closes the stream;
//! all work has completed (flushed) by then and bytes are ignored.

use std::collections::VecDeque;

use rdma_types::{Duration, Instant};

use crate::ddp::{DdpPacket, Placement, SegmentRepr, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use crate::mpa::{
    self, FpduReceiver, FrameError, FrameKind, FrameRepr, IrdOrd, FRAME_HEADER_LEN, IRD_ORD_LEN,
    MAX_PRIVATE_DATA,
};
use crate::rdmap::{qn, Opcode, ReadRequestRepr, READ_REQUEST_LEN};
use crate::terminate::{TermCause, TermCode, TerminateRepr};
use crate::types::{Msn, STag};

/// Why memory refused an access; nothing was touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Unknown or invalidated STag.
    #[error("invalid STag")]
    InvalidStag,
    /// The range is outside the buffer.
    #[error("base or bounds violation")]
    OutOfBounds,
    /// The buffer does not grant the access.
    #[error("access rights violation")]
    NoAccess,
    /// The STag belongs to another protection domain or stream.
    #[error("STag not associated with this stream")]
    NotAssociated,
}

/// Remote access kinds for [`Memory::remote_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// RDMA Read source.
    RemoteRead,
    /// RDMA Write sink.
    RemoteWrite,
}

/// Checked access to the connection's registered memory. The driver
/// implements it over its STag tables; the engine asks for single ranges.
pub trait Memory {
    /// Copies local memory under `stag` at `to` into `out` (send sources).
    fn read_local(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError>;
    /// Copies `data` into local memory under `stag` at `to` (receive
    /// buffers and RDMA Read sinks).
    fn write_local(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// Checks a whole remote access once, before any of it is done.
    fn remote_check(
        &mut self,
        stag: STag,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemoryError>;
    /// A remote RDMA Write of `data` at `to`.
    fn remote_write(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// A remote RDMA Read of `out.len()` bytes at `to`.
    fn remote_read(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError>;
    /// Invalidates `stag` (Send with Invalidate).
    fn invalidate(&mut self, stag: STag) -> Result<(), MemoryError>;
    /// A receive buffer from a queue the connection shares with others
    /// (a shared receive queue), taken when a Send finds none of the
    /// connection's own; `None` when there is none.
    fn shared_recv(&mut self) -> Option<RecvWqe> {
        None
    }
}

/// A local buffer: STag, tagged offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Local STag.
    pub stag: STag,
    /// Offset under the STag.
    pub to: u64,
    /// Length in bytes.
    pub len: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send, optionally with solicited event and invalidate.
    Send {
        /// Source buffer.
        local: Sge,
        /// Solicited event.
        solicited: bool,
        /// STag for the peer to invalidate.
        invalidate: Option<STag>,
    },
    /// RDMA Write.
    Write {
        /// Source buffer.
        local: Sge,
        /// Data sink STag at the peer.
        remote_stag: STag,
        /// Data sink tagged offset.
        remote_to: u64,
    },
    /// RDMA Read into `local` from the peer's buffer.
    Read {
        /// Data sink (local); must grant the peer's Read Responses write.
        local: Sge,
        /// Data source STag at the peer.
        remote_stag: STag,
        /// Data source tagged offset.
        remote_to: u64,
    },
}

/// A send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
}

/// A receive work request: one untagged buffer for one Send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the Send's data goes.
    pub buf: Sge,
}

/// Which work a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcKind {
    /// A Send (any variant).
    Send,
    /// An RDMA Write.
    Write,
    /// An RDMA Read.
    Read,
    /// A receive.
    Recv,
}

/// How work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local buffer was refused by [`Memory`].
    LocalProtection,
    /// The connection ended before the work did.
    Flushed,
    /// Receives: the data arrived but the STag the Send asked us to
    /// invalidate was refused (the connection terminates).
    InvalidateRefused,
    /// Receives: the Send was longer than the buffer (RFC 5041 untagged
    /// error "message too long"; the connection terminates).
    LocalLength,
    /// Reads: the peer refused the Read Request with a TERMINATE naming a
    /// remote protection or tagged buffer error (RFC 5040 4.8).
    RemoteAccess,
}

/// A completed work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// Which queue and operation.
    pub kind: WcKind,
    /// Outcome.
    pub status: WcStatus,
    /// Bytes moved (receives: the Send's length).
    pub byte_len: u32,
    /// Receives: the STag the Send invalidated.
    pub invalidated: Option<STag>,
    /// Receives: the Send asked for a solicited event.
    pub solicited: bool,
}

/// Which end of the TCP connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connected: sends the MPA request.
    Initiator,
    /// Accepted: answers it.
    Responder,
}

/// Connection parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Initiator or responder.
    pub role: Role,
    /// MPA revision we send (initiator) or the highest we answer with.
    pub revision: u8,
    /// Whether we want CRCs (used if either side wants them).
    pub crc: bool,
    /// Largest ULPDU we send: [`mpa::mulpdu`] of the path.
    pub mulpdu: u16,
    /// RDMA Reads we serve at once.
    pub ird: u16,
    /// RDMA Reads we issue at once.
    pub ord: u16,
    /// The initiator's private data (the responder's goes to `accept`).
    pub private_data: Vec<u8>,
    /// How long the initiator waits for the MPA reply.
    pub mpa_timeout: Duration,
    /// How long the initiator holds its first FPDU after the MPA reply
    /// (0: not at all). RFC 5044 lets it send at once, and a responder
    /// must take FPDUs once its reply is out; Linux siw (6.1) moves its
    /// socket under the QP only after sending the reply, so an FPDU
    /// arriving in between waits in its socket until the next segment
    /// comes, which for a Send its peer must answer is never.
    pub first_fpdu_hold: Duration,
}

impl Config {
    /// Defaults for a role: revision 2, CRC on, MULPDU of a 1500-byte IPv4
    /// path, IRD and ORD 16, no private data, 10 s MPA timeout.
    pub fn new(role: Role) -> Self {
        Config {
            role,
            revision: 2,
            crc: true,
            mulpdu: mpa::mulpdu(1500, mpa::TCP_IPV4_OVERHEAD),
            ird: 16,
            ord: 16,
            private_data: Vec::new(),
            mpa_timeout: Duration::from_secs(10),
            first_fpdu_hold: Duration::ZERO,
        }
    }
}

/// A configuration the engine cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Revision other than 1 or 2.
    #[error("MPA revision {0} is not 1 or 2")]
    Revision(u8),
    /// Private data longer than a frame carries.
    #[error("private data of {len} bytes exceeds the {max} an MPA frame carries")]
    PrivateData {
        /// Given length.
        len: usize,
        /// Room in the frame.
        max: usize,
    },
    /// MULPDU too small for a header and a byte.
    #[error("MULPDU {0} leaves no room for payload (minimum 31)")]
    Mulpdu(u16),
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Initiator: request sent, waiting for the reply.
    AwaitingReply,
    /// Responder: waiting for the request.
    AwaitingRequest,
    /// Responder: request received, waiting for accept or reject.
    RequestReceived,
    /// FPDUs flow.
    Established,
    /// A TERMINATE was sent or received; all work flushed.
    Terminated,
    /// Negotiation failed or was rejected; close the stream.
    Closed,
}

/// Something the driver or consumer must know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: an acceptable MPA request arrived; answer with
    /// [`Connection::accept`] or [`Connection::reject`].
    ConnectRequest {
        /// The initiator's private data.
        private_data: Vec<u8>,
        /// Its IRD/ORD block (revision 2).
        ird_ord: Option<IrdOrd>,
    },
    /// FPDUs may flow.
    Established {
        /// The peer's private data.
        private_data: Vec<u8>,
        /// CRCs are in use.
        crc: bool,
        /// Negotiated RDMA Reads we serve at once.
        ird: u16,
        /// Negotiated RDMA Reads we issue at once.
        ord: u16,
    },
    /// Initiator: the responder rejected (R bit).
    Rejected {
        /// The responder's private data.
        private_data: Vec<u8>,
    },
    /// We refused the peer's MPA frame; the driver closes the stream.
    MpaRefused {
        /// What was wrong.
        reason: MpaRefusal,
    },
    /// Initiator: no reply within the timeout.
    MpaTimeout,
    /// We sent a TERMINATE (still to be written by `poll_transmit`).
    TerminateSent {
        /// Why.
        cause: TermCause,
    },
    /// The stream ended (the peer closed or reset it, or the driver
    /// gave up on it) before a TERMINATE or a clean end; all work flushed.
    StreamClosed,
    /// The peer sent a TERMINATE.
    TerminateReceived {
        /// The peer's cause fields (may be outside our table).
        code: TermCode,
    },
}

/// Why an MPA frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaRefusal {
    /// The frame did not parse.
    Frame(FrameError),
    /// The peer wants markers, which we never insert.
    MarkersRequired,
    /// The initiator sent bytes before our reply.
    EarlyData,
}

/// An outstanding RDMA Read we issued.
#[derive(Debug, Clone, Copy)]
struct OutRead {
    wr_id: u64,
    sink: Sge,
    received: u32,
}

/// A Read Response still to send.
#[derive(Debug, Clone, Copy)]
struct InRead {
    req: ReadRequestRepr,
    off: u32,
}

/// The receive buffer a multi-segment Send is filling.
#[derive(Debug, Clone, Copy)]
struct ActiveRecv {
    wqe: RecvWqe,
    received: u32,
}

/// One iWARP connection (one TCP stream, one QP).
#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    state: State,
    deadline: Option<Instant>,
    /// The initiator's FPDUs wait until then ([`Config::first_fpdu_hold`]).
    held_until: Option<Instant>,
    /// MPA frame bytes (incoming), at most a header plus 512.
    frame_in: Vec<u8>,
    /// An MPA frame to send.
    frame_out: Option<Vec<u8>>,
    /// The peer's request, kept for the reply.
    peer_req: Option<FrameRepr>,
    crc: bool,
    ird: u16,
    ord: u16,
    rx: Option<FpduReceiver>,
    terminate_out: Option<Vec<u8>>,
    sq: VecDeque<SendWqe>,
    /// Offset into the head of `sq` (mid-message).
    sq_off: u32,
    rq: VecDeque<RecvWqe>,
    active_recv: Option<ActiveRecv>,
    out_reads: VecDeque<OutRead>,
    in_reads: VecDeque<InRead>,
    tx_send_msn: Msn,
    tx_read_msn: Msn,
    rx_send_msn: Msn,
    rx_read_msn: Msn,
    completions: VecDeque<Completion>,
    events: VecDeque<Event>,
    scratch: Vec<u8>,
}

fn tagged_cause(e: MemoryError) -> TermCause {
    match e {
        MemoryError::InvalidStag => TermCause::DdpInvalidStag,
        MemoryError::OutOfBounds => TermCause::DdpBaseBounds,
        MemoryError::NotAssociated => TermCause::DdpStagNotAssociated,
        MemoryError::NoAccess => TermCause::RdmapAccessRights,
    }
}

fn rdmap_cause(e: MemoryError) -> TermCause {
    match e {
        MemoryError::InvalidStag => TermCause::RdmapInvalidStag,
        MemoryError::OutOfBounds => TermCause::RdmapBaseBounds,
        MemoryError::NotAssociated => TermCause::RdmapStagNotAssociated,
        MemoryError::NoAccess => TermCause::RdmapAccessRights,
    }
}

impl Connection {
    /// A connection whose TCP stream is up at `now`.
    ///
    /// # Errors
    /// [`ConfigError`] for a revision, private data or MULPDU that cannot work.
    pub fn new(cfg: Config, now: Instant) -> Result<Self, ConfigError> {
        if !(1..=2).contains(&cfg.revision) {
            return Err(ConfigError::Revision(cfg.revision));
        }
        let max = MAX_PRIVATE_DATA - if cfg.revision == 2 { IRD_ORD_LEN } else { 0 };
        if cfg.private_data.len() > max {
            return Err(ConfigError::PrivateData {
                len: cfg.private_data.len(),
                max,
            });
        }
        if usize::from(cfg.mulpdu) <= UNTAGGED_HEADER_LEN + READ_REQUEST_LEN {
            // A Read Request must fit one segment (RFC 5040 4.4).
            return Err(ConfigError::Mulpdu(cfg.mulpdu));
        }
        let mut c = Connection {
            state: State::AwaitingRequest,
            deadline: None,
            held_until: None,
            frame_in: Vec::new(),
            frame_out: None,
            peer_req: None,
            crc: cfg.crc,
            ird: cfg.ird,
            ord: cfg.ord,
            rx: None,
            terminate_out: None,
            sq: VecDeque::new(),
            sq_off: 0,
            rq: VecDeque::new(),
            active_recv: None,
            out_reads: VecDeque::new(),
            in_reads: VecDeque::new(),
            tx_send_msn: Msn::FIRST,
            tx_read_msn: Msn::FIRST,
            rx_send_msn: Msn::FIRST,
            rx_read_msn: Msn::FIRST,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            scratch: Vec::new(),
            cfg,
        };
        if c.cfg.role == Role::Initiator {
            let req = FrameRepr::ours(
                FrameKind::Request,
                c.cfg.crc,
                c.cfg.revision,
                (c.cfg.revision == 2).then_some((c.cfg.ird, c.cfg.ord)),
                &c.cfg.private_data,
            );
            let mut out = Vec::with_capacity(req.buffer_len());
            req.emit(&mut out);
            c.frame_out = Some(out);
            c.state = State::AwaitingReply;
            c.deadline = Some(Instant::from_micros(
                now.total_micros()
                    .saturating_add(c.cfg.mpa_timeout.total_micros()),
            ));
        }
        Ok(c)
    }

    /// Where the connection is.
    pub fn state(&self) -> State {
        self.state
    }

    /// Queues a send work request. After the end it completes flushed.
    pub fn post_send(&mut self, wqe: SendWqe) {
        if matches!(self.state, State::Terminated | State::Closed) {
            self.completions
                .push_back(flushed(wqe.wr_id, send_kind(&wqe.op)));
        } else {
            self.sq.push_back(wqe);
        }
    }

    /// Queues a receive buffer. After the end it completes flushed.
    pub fn post_recv(&mut self, wqe: RecvWqe) {
        if matches!(self.state, State::Terminated | State::Closed) {
            self.completions.push_back(flushed(wqe.wr_id, WcKind::Recv));
        } else {
            self.rq.push_back(wqe);
        }
    }

    /// The next completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Connection::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.deadline, self.held_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers that are due: the initiator gives up on the MPA
    /// reply, or its first FPDU's hold ends (transmit again).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.held_until.is_some_and(|h| now >= h) {
            self.held_until = None;
        }
        if let Some(d) = self.deadline {
            if now >= d {
                self.deadline = None;
                if self.state == State::AwaitingReply {
                    self.events.push_back(Event::MpaTimeout);
                    self.close();
                }
            }
        }
    }

    /// The driver saw the stream end (EOF, reset, a send error). Unless a
    /// TERMINATE or negotiation failure ended the connection already, it
    /// reports [`Event::StreamClosed`] and flushes all work.
    pub fn handle_stream_closed(&mut self) {
        if !matches!(self.state, State::Terminated | State::Closed) {
            self.events.push_back(Event::StreamClosed);
            self.close();
        }
    }

    /// The consumer ends the connection (its QP went to error): all work
    /// flushes, nothing more is sent or taken, and no event is reported.
    pub fn abort(&mut self) {
        self.frame_out = None;
        self.terminate_out = None;
        self.close();
    }

    /// Responder: accepts the request with our private data.
    ///
    /// # Errors
    /// [`ConfigError::PrivateData`] if it does not fit the reply (nothing
    /// changes); a call in another state does nothing.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), ConfigError> {
        let Some(req) = self
            .peer_req
            .take()
            .filter(|_| self.state == State::RequestReceived)
        else {
            return Ok(());
        };
        let revision = req.revision.min(self.cfg.revision);
        let ird_ord = req.ird_ord.filter(|_| revision == 2).map(|peer| {
            // RFC 6581: we issue no more reads than the peer serves.
            self.ord = self.ord.min(peer.ird);
            (self.ird, self.ord)
        });
        let max = MAX_PRIVATE_DATA - ird_ord.map_or(0, |_| IRD_ORD_LEN);
        if private_data.len() > max {
            self.peer_req = Some(req);
            return Err(ConfigError::PrivateData {
                len: private_data.len(),
                max,
            });
        }
        self.crc = self.cfg.crc || req.crc;
        let rep = FrameRepr::ours(FrameKind::Reply, self.crc, revision, ird_ord, private_data);
        let mut out = Vec::with_capacity(rep.buffer_len());
        rep.emit(&mut out);
        self.frame_out = Some(out);
        self.establish(req.private_data);
        Ok(())
    }

    /// Responder: rejects the request (a reply with R set); then closed.
    pub fn reject(&mut self, private_data: &[u8]) {
        if self.state != State::RequestReceived {
            return;
        }
        let rev = self
            .peer_req
            .take()
            .map_or(1, |r| r.revision.min(self.cfg.revision));
        self.send_reject(rev, private_data);
        self.close();
    }

    fn send_reject(&mut self, revision: u8, private_data: &[u8]) {
        let rep = FrameRepr {
            reject: true,
            ..FrameRepr::ours(
                FrameKind::Reply,
                self.cfg.crc,
                revision,
                None,
                &private_data[..private_data.len().min(MAX_PRIVATE_DATA)],
            )
        };
        let mut out = Vec::new();
        rep.emit(&mut out);
        self.frame_out = Some(out);
    }

    fn establish(&mut self, peer_private_data: Vec<u8>) {
        self.state = State::Established;
        self.deadline = None;
        self.rx = Some(FpduReceiver::new(self.crc, TAGGED_HEADER_LEN));
        self.events.push_back(Event::Established {
            private_data: peer_private_data,
            crc: self.crc,
            ird: self.ird,
            ord: self.ord,
        });
    }

    fn close(&mut self) {
        self.state = State::Closed;
        self.deadline = None;
        self.held_until = None;
        self.flush();
    }

    fn flush(&mut self) {
        for w in self.sq.drain(..) {
            self.completions
                .push_back(flushed(w.wr_id, send_kind(&w.op)));
        }
        self.sq_off = 0;
        for r in self.out_reads.drain(..) {
            self.completions.push_back(flushed(r.wr_id, WcKind::Read));
        }
        if let Some(a) = self.active_recv.take() {
            self.completions
                .push_back(flushed(a.wqe.wr_id, WcKind::Recv));
        }
        for r in self.rq.drain(..) {
            self.completions.push_back(flushed(r.wr_id, WcKind::Recv));
        }
        self.in_reads.clear();
    }

    /// Bytes the stream delivered, any amount. Every byte is taken: MPA
    /// frames are buffered up to their bounded size, FPDUs up to one.
    pub fn handle_bytes(
        &mut self,
        now: Instant,
        mut data: &[u8],
        mem: &mut (impl Memory + ?Sized),
    ) {
        while !data.is_empty() {
            match self.state {
                State::AwaitingReply | State::AwaitingRequest => {
                    let was = self.state;
                    self.take_frame(&mut data);
                    let hold = self.cfg.first_fpdu_hold.total_micros();
                    if was == State::AwaitingReply && self.state == State::Established && hold > 0 {
                        self.held_until = Some(Instant::from_micros(
                            now.total_micros().saturating_add(hold),
                        ));
                    }
                }
                State::RequestReceived => {
                    // RFC 5044: nothing may follow the request before
                    // the reply.
                    self.events.push_back(Event::MpaRefused {
                        reason: MpaRefusal::EarlyData,
                    });
                    self.peer_req = None;
                    self.close();
                    return;
                }
                State::Established => {
                    let Some(mut rx) = self.rx.take() else { return };
                    loop {
                        match rx.poll(&mut data) {
                            Ok(Some(ulpdu)) => {
                                self.scratch.clear();
                                self.scratch.extend_from_slice(ulpdu);
                                let seg = std::mem::take(&mut self.scratch);
                                self.handle_ulpdu(&seg, mem);
                                self.scratch = seg;
                                if self.state != State::Established {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            Err(cause) => {
                                self.terminate(cause, None);
                                return;
                            }
                        }
                    }
                    self.rx = Some(rx);
                }
                State::Terminated | State::Closed => return,
            }
        }
    }

    fn take_frame(&mut self, data: &mut &[u8]) {
        let kind = if self.state == State::AwaitingReply {
            FrameKind::Reply
        } else {
            FrameKind::Request
        };
        // Take no more than the frame can be: its header, then its PD.
        let want = if self.frame_in.len() < FRAME_HEADER_LEN {
            FRAME_HEADER_LEN
        } else {
            FrameRepr::wire_len(&self.frame_in)
        };
        let take = want.saturating_sub(self.frame_in.len()).min(data.len());
        self.frame_in.extend_from_slice(&data[..take]);
        *data = &data[take..];
        let frame = match FrameRepr::parse(&self.frame_in, kind) {
            Err(FrameError::Incomplete(_)) => return,
            Err(e) => return self.refuse_frame(MpaRefusal::Frame(e)),
            Ok((f, _)) => f,
        };
        self.frame_in = Vec::new();
        match kind {
            FrameKind::Request => {
                if frame.markers {
                    // RFC 5044: we cannot insert markers; refuse.
                    self.send_reject(frame.revision.min(self.cfg.revision), &[]);
                    return self.refuse_frame(MpaRefusal::MarkersRequired);
                }
                self.events.push_back(Event::ConnectRequest {
                    private_data: frame.private_data.clone(),
                    ird_ord: frame.ird_ord,
                });
                self.peer_req = Some(frame);
                self.state = State::RequestReceived;
            }
            FrameKind::Reply => self.handle_reply(frame),
        }
    }

    fn refuse_frame(&mut self, reason: MpaRefusal) {
        self.events.push_back(Event::MpaRefused { reason });
        self.close();
    }

    fn handle_reply(&mut self, rep: FrameRepr) {
        if rep.reject {
            self.events.push_back(Event::Rejected {
                private_data: rep.private_data,
            });
            return self.close();
        }
        self.crc = rep.crc;
        // RFC 6581: IRD/ORD only when both sides speak revision 2.
        let io = rep
            .ird_ord
            .filter(|_| self.cfg.revision == 2 && rep.revision == 2);
        if let Some(io) = io {
            self.ord = self.ord.min(io.ird);
        }
        self.establish(rep.private_data);
        // RFC 5044 7.1: a reply may not add markers we never asked for, drop
        // the CRC we asked for, or raise the revision.
        if rep.markers || (self.cfg.crc && !rep.crc) || rep.revision > self.cfg.revision {
            return self.terminate(TermCause::MpaInvalidFrame, None);
        }
        if let Some(io) = io {
            if io.peer_to_peer {
                // The responder wants an RTR; we offered none (RFC 6581).
                return self.terminate(TermCause::MpaNoMatchingRtr, None);
            }
            if io.ord > self.ird {
                // It would issue more reads than we serve (RFC 6581).
                self.terminate(TermCause::MpaInsufficientIrd, None);
            }
        }
    }

    /// Sends a TERMINATE for `cause` (quoting the offending segment when
    /// there is one), flushes all work and stops taking bytes.
    fn terminate(&mut self, cause: TermCause, seg: Option<&[u8]>) {
        let mut body = TerminateRepr {
            code: cause.code(),
            segment_len: None,
            ddp_header: None,
            rdma_header: None,
        };
        if let Some(ulpdu) = seg {
            body.segment_len = u16::try_from(ulpdu.len()).ok();
            if let Ok(p) = DdpPacket::new_checked(ulpdu) {
                body.ddp_header = Some(p.header().to_vec());
                if p.opcode() == Opcode::ReadRequest && p.payload().len() >= READ_REQUEST_LEN {
                    let mut h = [0; READ_REQUEST_LEN];
                    h.copy_from_slice(&p.payload()[..READ_REQUEST_LEN]);
                    body.rdma_header = Some(h);
                }
            }
        }
        let hdr = SegmentRepr {
            last: true,
            opcode: Opcode::Terminate,
            placement: Placement::Untagged {
                inv_stag: STag(0),
                qn: qn::TERMINATE,
                msn: Msn::FIRST,
                mo: 0,
            },
        };
        let mut ulpdu = Vec::with_capacity(hdr.buffer_len() + body.buffer_len());
        hdr.emit(&mut ulpdu);
        body.emit(&mut ulpdu);
        let mut out = Vec::new();
        mpa::emit_fpdu(&ulpdu, self.crc, &mut out);
        self.terminate_out = Some(out);
        self.state = State::Terminated;
        self.events.push_back(Event::TerminateSent { cause });
        self.flush();
    }

    fn handle_ulpdu(&mut self, ulpdu: &[u8], mem: &mut (impl Memory + ?Sized)) {
        if let Err(cause) = self.place(ulpdu, mem) {
            self.terminate(cause, Some(ulpdu));
        }
    }

    /// Checks and places one DDP segment (RFC 5041, RFC 5040).
    fn place(&mut self, ulpdu: &[u8], mem: &mut (impl Memory + ?Sized)) -> Result<(), TermCause> {
        let p = DdpPacket::new_checked(ulpdu)?;
        let seg = SegmentRepr::parse(&p)?;
        let data = p.payload();
        let len = data.len() as u64;
        match seg.placement {
            Placement::Tagged { stag, to } => {
                to.checked_add(len).ok_or(TermCause::DdpToWrap)?;
                if seg.opcode == Opcode::RdmaWrite {
                    // A zero-length Write names no memory: nothing is
                    // checked or placed (as IBA C9-88 has it for RDMA over
                    // IB; peers use it as a liveness probe with STag 0).
                    if data.is_empty() {
                        return Ok(());
                    }
                    return mem.remote_write(stag, to, data).map_err(tagged_cause);
                }
                // Read Response: it must answer our oldest Read.
                let r = self
                    .out_reads
                    .front_mut()
                    .ok_or(TermCause::RdmapUnexpectedOpcode)?;
                if stag != r.sink.stag {
                    return Err(TermCause::DdpStagNotAssociated);
                }
                let start = r.sink.to + u64::from(r.received);
                if to != start || u64::from(r.received) + len > u64::from(r.sink.len) {
                    return Err(TermCause::DdpBaseBounds);
                }
                mem.write_local(stag, to, data)
                    .map_err(|_| TermCause::DdpLocalCatastrophic)?;
                r.received += len as u32;
                if seg.last {
                    let r = self.out_reads.pop_front().unwrap_or_else(|| unreachable!());
                    if r.received != r.sink.len {
                        return Err(TermCause::DdpBaseBounds);
                    }
                    self.completions
                        .push_back(success(r.wr_id, WcKind::Read, r.received));
                }
                Ok(())
            }
            Placement::Untagged {
                inv_stag,
                qn: q,
                msn,
                mo,
            } => {
                if q > qn::TERMINATE {
                    return Err(TermCause::DdpInvalidQn);
                }
                let info = seg.opcode.info().ok_or(TermCause::RdmapUnexpectedOpcode)?;
                if info.queue != q {
                    return Err(TermCause::RdmapUnexpectedOpcode);
                }
                match q {
                    qn::SEND => self.place_send(&seg, inv_stag, msn, mo, data, mem),
                    qn::READ_REQUEST => self.take_read_request(&seg, msn, mo, data, mem),
                    _ => {
                        let body = TerminateRepr::parse(data)
                            .map_err(|_| TermCause::RdmapOperationUnspecified)?;
                        let c = body.code;
                        if (c.layer, c.etype) == (0, 1) || (c.layer, c.etype) == (1, 1) {
                            // A protection error ends our oldest Read: the
                            // peer refused its request (RFC 5040 4.8).
                            if let Some(r) = self.out_reads.pop_front() {
                                self.completions.push_back(Completion {
                                    status: WcStatus::RemoteAccess,
                                    ..success(r.wr_id, WcKind::Read, 0)
                                });
                            }
                        }
                        self.events
                            .push_back(Event::TerminateReceived { code: body.code });
                        self.state = State::Terminated;
                        self.flush();
                        Ok(())
                    }
                }
            }
        }
    }

    fn place_send(
        &mut self,
        seg: &SegmentRepr,
        inv_stag: STag,
        msn: Msn,
        mo: u32,
        data: &[u8],
        mem: &mut (impl Memory + ?Sized),
    ) -> Result<(), TermCause> {
        if msn != self.rx_send_msn {
            return Err(TermCause::DdpMsnRange);
        }
        let mut a = match self.active_recv.take() {
            Some(a) => a,
            None => {
                let wqe = self
                    .rq
                    .pop_front()
                    .or_else(|| mem.shared_recv())
                    .ok_or(TermCause::DdpNoBuffer)?;
                ActiveRecv { wqe, received: 0 }
            }
        };
        let result = (|| {
            if mo != a.received {
                return Err((TermCause::DdpInvalidMo, WcStatus::Flushed));
            }
            let end = u64::from(mo) + data.len() as u64;
            if end > u64::from(a.wqe.buf.len) {
                return Err((TermCause::DdpTooLong, WcStatus::LocalLength));
            }
            mem.write_local(
                a.wqe.buf.stag,
                a.wqe.buf.to.wrapping_add(u64::from(mo)),
                data,
            )
            .map_err(|_| (TermCause::DdpLocalCatastrophic, WcStatus::LocalProtection))?;
            a.received = end as u32;
            Ok(())
        })();
        match result {
            Ok(()) => self.active_recv = Some(a),
            // The buffer is this message's: flushed, or completed with the
            // local error that refused the data.
            Err((cause, WcStatus::Flushed)) => {
                self.active_recv = Some(a);
                return Err(cause);
            }
            Err((cause, status)) => {
                self.completions.push_back(Completion {
                    status,
                    ..success(a.wqe.wr_id, WcKind::Recv, a.received)
                });
                return Err(cause);
            }
        }
        if !seg.last {
            return Ok(());
        }
        self.active_recv = None;
        self.rx_send_msn = self.rx_send_msn.next();
        let info = seg.opcode.info().unwrap_or_else(|| unreachable!());
        let mut invalidated = None;
        if info.invalidate {
            if mem.invalidate(inv_stag).is_err() {
                self.completions.push_back(Completion {
                    status: WcStatus::InvalidateRefused,
                    ..success(a.wqe.wr_id, WcKind::Recv, a.received)
                });
                return Err(TermCause::RdmapCannotInvalidate);
            }
            invalidated = Some(inv_stag);
        }
        self.completions.push_back(Completion {
            invalidated,
            solicited: info.solicited,
            ..success(a.wqe.wr_id, WcKind::Recv, a.received)
        });
        Ok(())
    }

    fn take_read_request(
        &mut self,
        seg: &SegmentRepr,
        msn: Msn,
        mo: u32,
        data: &[u8],
        mem: &mut (impl Memory + ?Sized),
    ) -> Result<(), TermCause> {
        if msn != self.rx_read_msn {
            return Err(TermCause::DdpMsnRange);
        }
        if mo != 0 || !seg.last {
            return Err(TermCause::DdpInvalidMo);
        }
        // Queue 1's buffers hold exactly one 28-byte request.
        let req = ReadRequestRepr::parse(data).ok_or(TermCause::DdpTooLong)?;
        if self.in_reads.len() >= usize::from(self.ird) {
            // RFC 5040: more reads than our IRD: no buffer on queue 1.
            return Err(TermCause::DdpNoBuffer);
        }
        req.src_to
            .checked_add(u64::from(req.size))
            .ok_or(TermCause::RdmapToWrap)?;
        // A zero-length Read names no memory either (see `place`).
        if req.size > 0 {
            mem.remote_check(
                req.src_stag,
                req.src_to,
                u64::from(req.size),
                Access::RemoteRead,
            )
            .map_err(rdmap_cause)?;
        }
        self.rx_read_msn = self.rx_read_msn.next();
        self.in_reads.push_back(InRead { req, off: 0 });
        Ok(())
    }

    /// Appends the next MPA frame or FPDU to `out`; `false` when there is
    /// nothing to send. One frame or FPDU per call.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut (impl Memory + ?Sized),
        out: &mut Vec<u8>,
    ) -> bool {
        if let Some(f) = self.frame_out.take() {
            out.extend_from_slice(&f);
            return true;
        }
        if let Some(t) = self.terminate_out.take() {
            out.extend_from_slice(&t);
            return true;
        }
        if self.state != State::Established {
            return false;
        }
        if let Some(h) = self.held_until {
            if now < h {
                return false;
            }
            self.held_until = None;
        }
        // Whole messages: a Read Response starts only between SQ messages.
        let sent = if self.sq_off == 0 && !self.in_reads.is_empty() {
            self.send_read_response(mem, out)
        } else {
            self.send_from_sq(mem, out)
        };
        if !sent {
            // Memory refused a send; the TERMINATE goes instead.
            if let Some(t) = self.terminate_out.take() {
                out.extend_from_slice(&t);
                return true;
            }
        }
        sent
    }

    fn send_read_response(&mut self, mem: &mut (impl Memory + ?Sized), out: &mut Vec<u8>) -> bool {
        let Some(r) = self.in_reads.front().copied() else {
            return false;
        };
        let room = (usize::from(self.cfg.mulpdu) - TAGGED_HEADER_LEN) as u32;
        let n = (r.req.size - r.off).min(room);
        let last = r.off + n == r.req.size;
        let mut payload = vec![0; n as usize];
        let read = if payload.is_empty() {
            Ok(())
        } else {
            mem.remote_read(
                r.req.src_stag,
                r.req.src_to + u64::from(r.off),
                &mut payload,
            )
        };
        if let Err(e) = read {
            // Invalidated since the request was checked.
            self.terminate(rdmap_cause(e), None);
            return false;
        }
        let hdr = SegmentRepr {
            last,
            opcode: Opcode::ReadResponse,
            placement: Placement::Tagged {
                stag: r.req.sink_stag,
                to: r.req.sink_to.wrapping_add(u64::from(r.off)),
            },
        };
        self.emit_segment(&hdr, &payload, out);
        if last {
            self.in_reads.pop_front();
        } else if let Some(f) = self.in_reads.front_mut() {
            f.off += n;
        }
        true
    }

    fn emit_segment(&mut self, hdr: &SegmentRepr, payload: &[u8], out: &mut Vec<u8>) {
        self.scratch.clear();
        hdr.emit(&mut self.scratch);
        self.scratch.extend_from_slice(payload);
        mpa::emit_fpdu(&self.scratch, self.crc, out);
    }

    fn send_from_sq(&mut self, mem: &mut (impl Memory + ?Sized), out: &mut Vec<u8>) -> bool {
        let Some(w) = self.sq.front().copied() else {
            return false;
        };
        let (local, hdr_len) = match w.op {
            SendOp::Send { local, .. } => (local, UNTAGGED_HEADER_LEN),
            SendOp::Write { local, .. } => (local, TAGGED_HEADER_LEN),
            SendOp::Read {
                local,
                remote_stag,
                remote_to,
            } => {
                if self.out_reads.len() >= usize::from(self.ord) {
                    return false; // RFC 5040: wait for ORD credit.
                }
                // The sink must take the responses before we ask for them.
                if mem.write_local(local.stag, local.to, &[]).is_err() {
                    self.sq.pop_front();
                    self.completions.push_back(Completion {
                        status: WcStatus::LocalProtection,
                        ..success(w.wr_id, WcKind::Read, 0)
                    });
                    self.terminate(TermCause::RdmapLocalCatastrophic, None);
                    return false;
                }
                let hdr = SegmentRepr {
                    last: true,
                    opcode: Opcode::ReadRequest,
                    placement: Placement::Untagged {
                        inv_stag: STag(0),
                        qn: qn::READ_REQUEST,
                        msn: self.tx_read_msn,
                        mo: 0,
                    },
                };
                let req = ReadRequestRepr {
                    sink_stag: local.stag,
                    sink_to: local.to,
                    size: local.len,
                    src_stag: remote_stag,
                    src_to: remote_to,
                };
                let mut body = Vec::with_capacity(READ_REQUEST_LEN);
                req.emit(&mut body);
                self.emit_segment(&hdr, &body, out);
                self.tx_read_msn = self.tx_read_msn.next();
                self.sq.pop_front();
                self.out_reads.push_back(OutRead {
                    wr_id: w.wr_id,
                    sink: local,
                    received: 0,
                });
                return true;
            }
        };
        let room = (usize::from(self.cfg.mulpdu) - hdr_len) as u32;
        let off = self.sq_off;
        let n = (local.len - off).min(room);
        let last = off + n == local.len;
        let mut payload = vec![0; n as usize];
        if mem
            .read_local(local.stag, local.to + u64::from(off), &mut payload)
            .is_err()
        {
            self.sq.pop_front();
            self.sq_off = 0;
            self.completions.push_back(Completion {
                status: WcStatus::LocalProtection,
                ..success(w.wr_id, send_kind(&w.op), 0)
            });
            self.terminate(TermCause::RdmapLocalCatastrophic, None);
            return false;
        }
        let hdr = match w.op {
            SendOp::Send {
                solicited,
                invalidate,
                ..
            } => SegmentRepr {
                last,
                opcode: Opcode::send(solicited, invalidate.is_some()),
                placement: Placement::Untagged {
                    inv_stag: invalidate.unwrap_or(STag(0)),
                    qn: qn::SEND,
                    msn: self.tx_send_msn,
                    mo: off,
                },
            },
            SendOp::Write {
                remote_stag,
                remote_to,
                ..
            } => SegmentRepr {
                last,
                opcode: Opcode::RdmaWrite,
                placement: Placement::Tagged {
                    stag: remote_stag,
                    to: remote_to.wrapping_add(u64::from(off)),
                },
            },
            SendOp::Read { .. } => unreachable!("handled above"),
        };
        self.emit_segment(&hdr, &payload, out);
        if last {
            self.sq.pop_front();
            self.sq_off = 0;
            if matches!(w.op, SendOp::Send { .. }) {
                self.tx_send_msn = self.tx_send_msn.next();
            }
            // RFC 5040: a Send or Write completes once handed to the LLP.
            self.completions
                .push_back(success(w.wr_id, send_kind(&w.op), local.len));
        } else {
            self.sq_off = off + n;
        }
        true
    }
}

fn send_kind(op: &SendOp) -> WcKind {
    match op {
        SendOp::Send { .. } => WcKind::Send,
        SendOp::Write { .. } => WcKind::Write,
        SendOp::Read { .. } => WcKind::Read,
    }
}

fn success(wr_id: u64, kind: WcKind, byte_len: u32) -> Completion {
    Completion {
        wr_id,
        kind,
        status: WcStatus::Success,
        byte_len,
        invalidated: None,
        solicited: false,
    }
}

fn flushed(wr_id: u64, kind: WcKind) -> Completion {
    Completion {
        status: WcStatus::Flushed,
        ..success(wr_id, kind, 0)
    }
}
