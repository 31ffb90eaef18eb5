//! Connection state machines of one CM endpoint.

use rdma_types::{CmRetries, Duration, Instant, Pkey, Psn, Qpn, TimeoutExp};
use std::collections::{BTreeMap, VecDeque};

/// A REJ reason code (IBA 12.6.7.2, table 112). The words for every code
/// belong to the MAD layer's table; the state machines only need these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejReason(pub u16);

impl RejReason {
    /// The peer gave up waiting (sent by the side whose retries ran out).
    pub const TIMEOUT: RejReason = RejReason(4);
    /// A message named a comm ID this endpoint does not know.
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    /// The REQ's primary path is refused; Linux ib_cm also sends it for a
    /// REQ whose partition key the passive port's P_Key table lacks.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// Nobody listens on the service ID.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// A REQ for a QP that is still connected under another comm ID.
    pub const STALE_CONN: RejReason = RejReason(10);
    /// The consumer refused; its private data says why (SRP logins do).
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
}

/// Which message a MRA or REJ answers (IBA 12.6.6 / 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// A REQ.
    Req,
    /// A REP.
    Rep,
    /// Something else (LAP).
    Other,
}

/// The CM messages, as the state machines see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    /// Connection request.
    Req {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Service asked for.
        service_id: u64,
        /// Sender's QP.
        qpn: Qpn,
        /// Sender's first PSN.
        psn: Psn,
        /// The partition of the connection (IBA 12.6.5: the P_Key of the
        /// sender's QP; the passive QP must be in the same partition).
        pkey: Pkey,
        /// The path's packet lifetime and both CM response timeouts.
        timing: Timing,
        /// Consumer data (an SRP login request, an RDMA CM header...).
        private_data: Vec<u8>,
    },
    /// Message receipt acknowledgement: "I need longer to answer".
    Mra {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID.
        remote_comm_id: u32,
        /// What is being delayed.
        msg: MsgKind,
        /// How long to wait now.
        service_timeout: TimeoutExp,
    },
    /// Reject.
    Rej {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID (0 if unknown).
        remote_comm_id: u32,
        /// What is rejected.
        msg: MsgKind,
        /// Why.
        reason: RejReason,
        /// Consumer data.
        private_data: Vec<u8>,
    },
    /// Reply to a REQ.
    Rep {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID.
        remote_comm_id: u32,
        /// Sender's QP.
        qpn: Qpn,
        /// Sender's first PSN.
        psn: Psn,
        /// Consumer data (an SRP login response...).
        private_data: Vec<u8>,
    },
    /// Ready to use.
    Rtu {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID.
        remote_comm_id: u32,
    },
    /// Disconnect request.
    Dreq {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID.
        remote_comm_id: u32,
    },
    /// Disconnect reply.
    Drep {
        /// Sender's comm ID.
        local_comm_id: u32,
        /// Receiver's comm ID.
        remote_comm_id: u32,
    },
}

/// The times a REQ announces (IBA 12.6.5), each a 5-bit time exponent
/// ([`TimeoutExp`]: 4.096 us * 2^n). The waits of the connection come from them, as
/// IBA 12.7.27/12.7.34 and Linux ib_cm compute them: the requester waits
/// for the REP 2 packet lifetimes (there and back) plus the remote CM
/// response time; the responder waits for the RTU 2 packet lifetimes plus
/// the requester's local CM response time; an MRA stretches the wait to
/// its service timeout plus 2 packet lifetimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The path's packet lifetime (PathRecord PacketLifeTime). On the
    /// wire it travels as the primary path's local ACK timeout, one more
    /// (IBA 12.6.5: the ACK timeout covers a round trip; Linux sends
    /// packet lifetime + 1 and the passive side takes one off).
    pub packet_life_time: TimeoutExp,
    /// How long the requester takes to answer a REP (and a DREQ).
    pub local_cm_response_timeout: TimeoutExp,
    /// How long the requester expects the responder to take over the REQ.
    pub remote_cm_response_timeout: TimeoutExp,
}

impl Timing {
    /// The QP local ACK timeout exponent for the path (IBA 9.7.6.1.3:
    /// twice the packet lifetime, as Linux cma does: lifetime + 1).
    pub fn local_ack_timeout(self) -> TimeoutExp {
        self.packet_life_time.saturating_add(1)
    }

    fn round_trip(self) -> Duration {
        self.local_ack_timeout().duration()
    }

    /// How long the requester waits for the REP (or an MRA).
    pub fn rep_wait(self) -> Duration {
        self.round_trip() + self.remote_cm_response_timeout.duration()
    }

    /// How long the responder waits for the RTU, and either side for a
    /// DREP.
    pub fn rtu_wait(self) -> Duration {
        self.round_trip() + self.local_cm_response_timeout.duration()
    }

    /// The first wait for the REP: the path's round trip, and at most
    /// [`REQ_FIRST_RESEND`] of the peer's response time (the later resends
    /// double up to [`Timing::rep_wait`]).
    pub fn first_req_wait(self) -> Duration {
        self.round_trip()
            + self
                .remote_cm_response_timeout
                .duration()
                .min(REQ_FIRST_RESEND)
    }

    /// How long to wait after an MRA with `service_timeout`.
    pub fn mra_wait(self, service_timeout: TimeoutExp) -> Duration {
        self.round_trip() + service_timeout.duration()
    }
}

/// Timing of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This endpoint's own CM response time (IBA 12.7.27): a REQ's local CM response timeout,
    /// the remote one it expects of the peer (Linux rdma_cm puts the same
    /// value in both), and the service timeout of its MRAs.
    pub response_timeout: TimeoutExp,
    /// Times a REQ, REP or DREQ is sent again before giving up.
    pub max_retries: CmRetries,
    /// How long a closed connection's IDs stay reserved (timewait).
    pub timewait: Duration,
    /// The packet lifetime of a path that names none ([`Cm::connect`]):
    /// on RoCE there is no SA, and Linux rdma_cm assumes 16 (268 ms).
    pub packet_life_time: TimeoutExp,
    /// The shortest wait for an answer, whatever the path and the peer
    /// announce (a 0 lifetime and response time would mean 8 us: a
    /// resend storm).
    pub min_timeout: Duration,
    /// The longest wait for an answer (an exponent of 31 means 2.4 hours).
    pub max_timeout: Duration,
}

/// The first wait of a REQ counts at most this (2^16 * 4.096 us) of the
/// peer's CM response time, on top of the path's round trip
/// ([`Timing::first_req_wait`]); each further resend waits twice as long as
/// the one before, up to the whole wait ([`Timing::rep_wait`]). A REQ lost
/// on a link that has just come back (or into a port not yet up at the far
/// end) is then sent again within about as long as it has been waiting,
/// not after the whole wait (about 4.8 s with Linux's response timeout 20
/// and rdma_cm's RoCE packet lifetime 16). A peer that answers slowly gets
/// duplicates, which the CM answers or drops (IBA 12.9.8.3: MRA or REP
/// again), and its MRA ends the quick resends.
pub const REQ_FIRST_RESEND: Duration = Duration::from_micros(268_435);

impl Default for CmConfig {
    /// Linux ib_cm's flavour: 2^20 * 4.096 us (about 4.3 s), 15 retries,
    /// rdma_cm's RoCE packet lifetime; waits between 1 ms and 5 minutes.
    fn default() -> Self {
        CmConfig {
            response_timeout: TimeoutExp::from_bits(20),
            max_retries: CmRetries::MAX,
            timewait: Duration::from_secs(4),
            packet_life_time: TimeoutExp::from_bits(16),
            min_timeout: Duration::from_millis(1),
            max_timeout: Duration::from_secs(300),
        }
    }
}

impl CmConfig {
    /// The timing of a REQ over a path with `packet_life_time`.
    pub fn timing(&self, packet_life_time: TimeoutExp) -> Timing {
        Timing {
            packet_life_time,
            local_cm_response_timeout: self.response_timeout,
            remote_cm_response_timeout: self.response_timeout,
        }
    }

    fn clamp(&self, d: Duration) -> Duration {
        d.max(self.min_timeout)
            .min(self.max_timeout.max(self.min_timeout))
    }
}

/// A connection handle of this endpoint (its local comm ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// Connection states (IBA 12.9.6, simplified to what a consumer can see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP/MRA/REJ.
    ReqSent,
    /// Active, RTU held ([`Cm::hold_rtu`]): the REP arrived, the consumer
    /// readies its QP and then sends the RTU ([`Cm::ready`]) or a REJ
    /// ([`Cm::reject_reply`]).
    RepRcvd,
    /// Passive: REQ received, waiting for the consumer.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Both ends ready.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected; IDs held until timewait ends.
    Timewait,
    /// Gone (rejected, timed out, or timewait over).
    Closed,
}

/// What the REQ said, for the consumer deciding to accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    /// Service asked for.
    pub service_id: u64,
    /// The requester's QP.
    pub qpn: Qpn,
    /// The requester's first PSN.
    pub psn: Psn,
    /// The connection's partition (the P_Key of the requester's QP).
    pub pkey: Pkey,
    /// The path's packet lifetime and the CM response timeouts.
    pub timing: Timing,
    /// Consumer data of the REQ.
    pub private_data: Vec<u8>,
}

/// What the consumer must know or do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent<P> {
    /// Passive: a REQ for a service we listen on; call accept or reject.
    Request {
        /// The new connection.
        conn: ConnId,
        /// Who asks.
        peer: P,
        /// What the REQ carried.
        req: ReqInfo,
    },
    /// Active: the REP arrived (and the RTU went out); move the QP to RTS
    /// with these values. Passive: the RTU arrived.
    Established {
        /// The connection.
        conn: ConnId,
        /// The peer's QP.
        remote_qpn: Qpn,
        /// The peer's first PSN.
        remote_psn: Psn,
        /// Consumer data of the REP (active side) or empty (passive).
        private_data: Vec<u8>,
    },
    /// Active, RTU held ([`Cm::hold_rtu`]): the REP arrived; move the QP
    /// to RTR and RTS with these values, then call [`Cm::ready`] (or
    /// [`Cm::reject_reply`] if that failed).
    Reply {
        /// The connection.
        conn: ConnId,
        /// The peer's QP.
        remote_qpn: Qpn,
        /// The peer's first PSN.
        remote_psn: Psn,
        /// Consumer data of the REP.
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RejReason,
        /// Consumer data of the REJ.
        private_data: Vec<u8>,
    },
    /// No answer after every retry on every path.
    TimedOut {
        /// The connection.
        conn: ConnId,
    },
    /// The peer asked to disconnect (a DREP went out): stop using the QP.
    DisconnectRequested {
        /// The connection.
        conn: ConnId,
    },
    /// The connection entered timewait.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// Timewait is over; the connection's resources may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
}

impl<P> CmEvent<P> {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match *self {
            CmEvent::Request { conn, .. }
            | CmEvent::Established { conn, .. }
            | CmEvent::Reply { conn, .. }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::TimedOut { conn }
            | CmEvent::DisconnectRequested { conn }
            | CmEvent::Disconnected { conn }
            | CmEvent::TimewaitExit { conn } => conn,
        }
    }
}

#[derive(Debug)]
struct Conn<P> {
    state: ConnState,
    /// Paths still to try (active side); the current one is `paths[path]`.
    paths: Vec<P>,
    path: usize,
    remote_comm_id: u32,
    service_id: u64,
    qpn: Qpn,
    psn: Psn,
    remote_qpn: Qpn,
    remote_psn: Psn,
    /// The REQ's timing: what the waits below come from.
    timing: Timing,
    /// How long to wait for the answer to `pending` (before the clamp).
    wait: Duration,
    /// The message we are waiting on an answer for, to send again.
    pending: Option<CmMsg>,
    retries_left: u8,
    /// How long after the last send of `pending` it is sent again.
    interval: Duration,
    deadline: Option<Instant>,
    /// Active: stop in `RepRcvd` on the REP, the RTU waits for the
    /// consumer.
    hold_rtu: bool,
}

/// One CM endpoint; `P` names a peer (an IP address or GID on RoCE).
#[derive(Debug)]
pub struct Cm<P> {
    cfg: CmConfig,
    next_id: u32,
    conns: BTreeMap<u32, Conn<P>>,
    listening: Vec<u64>,
    out: VecDeque<(P, CmMsg)>,
    events: VecDeque<CmEvent<P>>,
}

impl<P: Copy + Eq + core::fmt::Debug> Cm<P> {
    /// An endpoint whose comm IDs start at `first_comm_id` (seed it per run:
    /// reusing IDs of a previous incarnation looks stale to peers).
    pub fn new(cfg: CmConfig, first_comm_id: u32) -> Cm<P> {
        Cm {
            cfg,
            next_id: first_comm_id.max(1),
            conns: BTreeMap::new(),
            listening: Vec::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The configuration the endpoint runs with.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    fn alloc_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Accepts REQs for `service_id` from now on.
    pub fn listen(&mut self, service_id: u64) {
        if !self.listening.contains(&service_id) {
            self.listening.push(service_id);
        }
    }

    /// State of a connection (`Closed` once forgotten).
    pub fn state(&self, conn: ConnId) -> ConnState {
        self.conns
            .get(&conn.0)
            .map_or(ConnState::Closed, |c| c.state)
    }

    /// Every connection the endpoint still has (not yet forgotten), with
    /// its state, by comm ID.
    pub fn connections(&self) -> impl Iterator<Item = (ConnId, ConnState)> + '_ {
        self.conns.iter().map(|(id, c)| (ConnId(*id), c.state))
    }

    /// Active side: sends a REQ in the default partition (P_Key 0xffff)
    /// over the first of `paths`; see [`Cm::connect_req`].
    ///
    /// # Panics
    /// If `paths` is empty (a caller bug: there is nowhere to send).
    pub fn connect(
        &mut self,
        now: Instant,
        paths: Vec<P>,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
    ) -> ConnId {
        let req = ReqInfo {
            service_id,
            qpn,
            psn,
            pkey: Pkey::DEFAULT,
            timing: self.cfg.timing(self.cfg.packet_life_time),
            private_data,
        };
        self.connect_req(now, paths, req)
    }

    /// Active side: sends the REQ `req` over the first of `paths`, trying
    /// the next ones when a path's retries run out. `req.pkey` is the
    /// P_Key of the table entry the requester's QP uses; `req.timing` has
    /// the path's packet lifetime, and the REQ is sent again after
    /// [`Timing::rep_wait`] (clamped to the configured bounds).
    ///
    /// # Panics
    /// If `paths` is empty (a caller bug: there is nowhere to send).
    pub fn connect_req(&mut self, now: Instant, paths: Vec<P>, req: ReqInfo) -> ConnId {
        assert!(!paths.is_empty(), "connect needs at least one path");
        let id = self.alloc_id();
        let ReqInfo {
            service_id,
            qpn,
            psn,
            pkey,
            timing,
            private_data,
        } = req;
        let req = CmMsg::Req {
            local_comm_id: id,
            service_id,
            qpn,
            psn,
            pkey,
            timing,
            private_data,
        };
        let conn = Conn {
            state: ConnState::ReqSent,
            paths,
            path: 0,
            remote_comm_id: 0,
            service_id,
            qpn,
            psn,
            remote_qpn: Qpn::from_bits(0),
            remote_psn: Psn::new(0),
            timing,
            wait: timing.rep_wait(),
            pending: None,
            retries_left: 0,
            interval: Duration::ZERO,
            deadline: None,
            hold_rtu: false,
        };
        self.conns.insert(id, conn);
        self.send_and_wait(now, id, req);
        ConnId(id)
    }

    /// Sends `msg` on the connection's current path and arms the retry
    /// timer for the connection's wait.
    fn send_and_wait(&mut self, now: Instant, id: u32, msg: CmMsg) {
        let is_req = matches!(msg, CmMsg::Req { .. });
        let retries = self.cfg.max_retries.value();
        let cfg = self.cfg;
        if let Some(c) = self.conns.get_mut(&id) {
            let peer = c.paths[c.path];
            self.out.push_back((peer, msg.clone()));
            c.pending = Some(msg);
            c.retries_left = retries;
            let full = cfg.clamp(c.wait);
            let interval = if is_req {
                cfg.clamp(c.timing.first_req_wait()).min(full)
            } else {
                full
            };
            c.interval = interval;
            c.deadline = Some(now + interval);
        }
    }

    /// How long a connection waits for the answer to what it sent last
    /// (after the configured bounds); `None` for a connection not known.
    pub fn response_wait(&self, conn: ConnId) -> Option<Duration> {
        self.conns.get(&conn.0).map(|c| self.cfg.clamp(c.wait))
    }

    fn send_once(&mut self, id: u32, msg: CmMsg) {
        if let Some(c) = self.conns.get(&id) {
            self.out.push_back((c.paths[c.path], msg));
        }
    }

    /// Passive side: answers a REQ with a REP.
    pub fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
    ) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return false;
        };
        if c.state != ConnState::ReqRcvd {
            return false;
        }
        c.state = ConnState::RepSent;
        c.qpn = qpn;
        c.psn = psn;
        c.wait = c.timing.rtu_wait();
        let rep = CmMsg::Rep {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            qpn,
            psn,
            private_data,
        };
        self.send_and_wait(now, conn.0, rep);
        true
    }

    /// Passive side: refuses a REQ.
    pub fn reject(&mut self, conn: ConnId, reason: RejReason, private_data: Vec<u8>) -> bool {
        let Some(c) = self.conns.get(&conn.0) else {
            return false;
        };
        if c.state != ConnState::ReqRcvd {
            return false;
        }
        let rej = CmMsg::Rej {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            msg: MsgKind::Req,
            reason,
            private_data,
        };
        self.send_once(conn.0, rej);
        self.conns.remove(&conn.0);
        true
    }

    /// Active side: the REP of `conn` (still waiting for it) stops in
    /// [`ConnState::RepRcvd`] with a [`CmEvent::Reply`] instead of
    /// sending the RTU at once, so that the consumer can move its QP to
    /// RTR and RTS first and refuse the connection if that fails (as IBA
    /// 12.9.6's REP-received state, and Linux rdma_cm with a QP, do).
    /// Returns whether the connection waits for a REP.
    pub fn hold_rtu(&mut self, conn: ConnId) -> bool {
        match self.conns.get_mut(&conn.0) {
            Some(c) if c.state == ConnState::ReqSent => {
                c.hold_rtu = true;
                true
            }
            _ => false,
        }
    }

    /// Active side, after a [`CmEvent::Reply`]: sends the RTU; the
    /// connection is established ([`CmEvent::Established`] follows).
    pub fn ready(&mut self, conn: ConnId) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return false;
        };
        if c.state != ConnState::RepRcvd {
            return false;
        }
        c.state = ConnState::Established;
        let rtu = CmMsg::Rtu {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
        };
        let (remote_qpn, remote_psn) = (c.remote_qpn, c.remote_psn);
        self.send_once(conn.0, rtu);
        self.events.push_back(CmEvent::Established {
            conn,
            remote_qpn,
            remote_psn,
            private_data: Vec::new(),
        });
        true
    }

    /// Active side, after a [`CmEvent::Reply`]: refuses the REP (the QP
    /// could not be readied) with a REJ; the connection is gone.
    pub fn reject_reply(&mut self, conn: ConnId, reason: RejReason, private_data: Vec<u8>) -> bool {
        let Some(c) = self.conns.get(&conn.0) else {
            return false;
        };
        if c.state != ConnState::RepRcvd {
            return false;
        }
        let rej = CmMsg::Rej {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            msg: MsgKind::Rep,
            reason,
            private_data,
        };
        self.send_once(conn.0, rej);
        self.conns.remove(&conn.0);
        true
    }

    /// Active side: gives up an attempt whose REQ is still unanswered (the
    /// consumer's own deadline passed): the REQ is not sent again, so it
    /// cannot reach the passive side long after the consumer moved on (a
    /// late SRP login there ends the initiator's newer channel). A REP
    /// that still comes finds no connection. Returns whether it was
    /// waiting.
    /// A REP held for the consumer ([`Cm::hold_rtu`]) is abandoned the
    /// same way: the passive side, without an RTU, gives up by itself.
    pub fn abandon(&mut self, conn: ConnId) -> bool {
        if !matches!(self.state(conn), ConnState::ReqSent | ConnState::RepRcvd) {
            return false;
        }
        self.conns.remove(&conn.0);
        true
    }

    /// Either side, any state: drops the connection without a message and
    /// without an event, its timers with it. For a port that is gone (its
    /// CA removed): nothing can be sent any more, and retrying a REQ, a
    /// REP or a DREQ into a dead port would only keep the connection
    /// alive in the tables. The peer finds out by its own timeouts, as
    /// with a pulled cable. Returns whether the connection existed.
    pub fn forget(&mut self, conn: ConnId) -> bool {
        self.conns.remove(&conn.0).is_some()
    }

    /// Stops accepting REQs for `service_id` (later ones get REJ invalid
    /// service ID); connections already made are not touched.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.retain(|s| *s != service_id);
    }

    /// Either side: starts a disconnect (DREQ). A passive connection
    /// whose REP still waits for the RTU has nothing to disconnect yet: it
    /// is refused instead (REJ of the REP, consumer defined, as Linux
    /// ib_cm does when a REP_SENT id is destroyed) and forgotten at once,
    /// without an event, so a consumer giving up on a login that never
    /// completes holds nothing for the rest of the RTU wait.
    pub fn disconnect(&mut self, now: Instant, conn: ConnId) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return false;
        };
        if c.state == ConnState::RepSent {
            let rej = CmMsg::Rej {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                msg: MsgKind::Rep,
                reason: RejReason::CONSUMER_DEFINED,
                private_data: Vec::new(),
            };
            self.send_once(conn.0, rej);
            self.conns.remove(&conn.0);
            return true;
        }
        if c.state != ConnState::Established {
            return false;
        }
        c.state = ConnState::DreqSent;
        // The DREP comes within the peer's CM response time: the wait
        // the connection has already (the requester's for the passive
        // side, the responder's for the active side).
        let dreq = CmMsg::Dreq {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
        };
        self.send_and_wait(now, conn.0, dreq);
        true
    }

    fn enter_timewait(&mut self, now: Instant, id: u32) {
        let tw = self.cfg.timewait;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::Timewait;
            c.pending = None;
            c.deadline = Some(now + tw);
            self.events
                .push_back(CmEvent::Disconnected { conn: ConnId(id) });
        }
    }

    /// A CM MAD arrived from `peer`.
    pub fn handle_msg(&mut self, now: Instant, peer: P, msg: CmMsg) {
        match msg {
            CmMsg::Req {
                local_comm_id,
                service_id,
                qpn,
                psn,
                pkey,
                timing,
                private_data,
            } => self.on_req(
                now,
                peer,
                local_comm_id,
                ReqInfo {
                    service_id,
                    qpn,
                    psn,
                    pkey,
                    timing,
                    private_data,
                },
            ),
            CmMsg::Mra {
                remote_comm_id,
                service_timeout,
                ..
            } => {
                // Wait the longer time the peer asked for (IBA 12.6.6:
                // its service timeout, plus the MRA's and the answer's
                // trips over the path), once more.
                let cfg = self.cfg;
                if let Some(c) = self.conns.get_mut(&remote_comm_id) {
                    if matches!(c.state, ConnState::ReqSent | ConnState::RepSent) {
                        // The peer is there and slow: no quick resends.
                        c.interval = cfg.clamp(c.wait);
                        let wait = cfg.clamp(c.timing.mra_wait(service_timeout));
                        c.deadline = Some(now + wait);
                    }
                }
            }
            CmMsg::Rej {
                remote_comm_id,
                reason,
                private_data,
                ..
            } => {
                let Some(c) = self.conns.get(&remote_comm_id) else {
                    return;
                };
                if matches!(
                    c.state,
                    ConnState::ReqSent | ConnState::RepRcvd | ConnState::RepSent
                ) {
                    self.conns.remove(&remote_comm_id);
                    self.events.push_back(CmEvent::Rejected {
                        conn: ConnId(remote_comm_id),
                        reason,
                        private_data,
                    });
                }
            }
            CmMsg::Rep {
                local_comm_id,
                remote_comm_id,
                qpn,
                psn,
                private_data,
            } => {
                let Some(c) = self.conns.get_mut(&remote_comm_id) else {
                    // A REP for nothing we know: tell the sender (IBA 12.6.7).
                    self.out.push_back((
                        peer,
                        CmMsg::Rej {
                            local_comm_id: 0,
                            remote_comm_id: local_comm_id,
                            msg: MsgKind::Rep,
                            reason: RejReason::INVALID_COMM_ID,
                            private_data: Vec::new(),
                        },
                    ));
                    return;
                };
                let rtu = CmMsg::Rtu {
                    local_comm_id: remote_comm_id,
                    remote_comm_id: local_comm_id,
                };
                match c.state {
                    ConnState::ReqSent if c.hold_rtu => {
                        c.state = ConnState::RepRcvd;
                        c.remote_comm_id = local_comm_id;
                        c.remote_qpn = qpn;
                        c.remote_psn = psn;
                        c.pending = None;
                        c.deadline = None;
                        self.events.push_back(CmEvent::Reply {
                            conn: ConnId(remote_comm_id),
                            remote_qpn: qpn,
                            remote_psn: psn,
                            private_data,
                        });
                    }
                    ConnState::ReqSent => {
                        c.state = ConnState::Established;
                        c.remote_comm_id = local_comm_id;
                        c.remote_qpn = qpn;
                        c.remote_psn = psn;
                        c.pending = None;
                        c.deadline = None;
                        self.out.push_back((peer, rtu));
                        self.events.push_back(CmEvent::Established {
                            conn: ConnId(remote_comm_id),
                            remote_qpn: qpn,
                            remote_psn: psn,
                            private_data,
                        });
                    }
                    // Our RTU was lost and the peer sent the REP again.
                    ConnState::Established if c.remote_comm_id == local_comm_id => {
                        self.out.push_back((peer, rtu))
                    }
                    _ => {}
                }
            }
            CmMsg::Rtu { remote_comm_id, .. } => {
                let Some(c) = self.conns.get_mut(&remote_comm_id) else {
                    return;
                };
                if c.state == ConnState::RepSent {
                    c.state = ConnState::Established;
                    c.pending = None;
                    c.deadline = None;
                    let (remote_qpn, remote_psn) = (c.remote_qpn, c.remote_psn);
                    self.events.push_back(CmEvent::Established {
                        conn: ConnId(remote_comm_id),
                        remote_qpn,
                        remote_psn,
                        private_data: Vec::new(),
                    });
                }
            }
            CmMsg::Dreq {
                local_comm_id,
                remote_comm_id,
            } => {
                let drep = CmMsg::Drep {
                    local_comm_id: remote_comm_id,
                    remote_comm_id: local_comm_id,
                };
                // IBA 12.6.10: always answer a DREQ, even for a connection
                // already in timewait (our DREP may have been lost).
                self.out.push_back((peer, drep));
                let Some(c) = self.conns.get(&remote_comm_id) else {
                    return;
                };
                match c.state {
                    ConnState::Established | ConnState::RepSent => {
                        self.events.push_back(CmEvent::DisconnectRequested {
                            conn: ConnId(remote_comm_id),
                        });
                        self.enter_timewait(now, remote_comm_id);
                    }
                    // Simultaneous disconnect: both sent DREQ.
                    ConnState::DreqSent => self.enter_timewait(now, remote_comm_id),
                    _ => {}
                }
            }
            CmMsg::Drep { remote_comm_id, .. } => {
                if self
                    .conns
                    .get(&remote_comm_id)
                    .is_some_and(|c| c.state == ConnState::DreqSent)
                {
                    self.enter_timewait(now, remote_comm_id);
                }
            }
        }
    }

    fn on_req(&mut self, now: Instant, peer: P, remote_comm_id: u32, req: ReqInfo) {
        let (service_id, qpn, psn) = (req.service_id, req.qpn, req.psn);
        // A duplicate of a REQ we already have: answer again, do not fork.
        let existing = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_comm_id == remote_comm_id
                    && c.paths[c.path] == peer
                    && c.service_id == service_id
            })
            .map(|(id, c)| (*id, c.state));
        if let Some((id, state)) = existing {
            match state {
                ConnState::ReqRcvd => self.send_once(
                    id,
                    CmMsg::Mra {
                        local_comm_id: id,
                        remote_comm_id,
                        msg: MsgKind::Req,
                        service_timeout: self.cfg.response_timeout,
                    },
                ),
                ConnState::RepSent => {
                    if let Some(rep) = self.conns.get(&id).and_then(|c| c.pending.clone()) {
                        self.send_once(id, rep);
                    }
                }
                _ => {}
            }
            return;
        }
        let rej = |reason| CmMsg::Rej {
            local_comm_id: 0,
            remote_comm_id,
            msg: MsgKind::Req,
            reason,
            private_data: Vec::new(),
        };
        if !self.listening.contains(&service_id) {
            self.out
                .push_back((peer, rej(RejReason::INVALID_SERVICE_ID)));
            return;
        }
        // IBA 12.4.1.3: a REQ for a QP still connected under another comm ID
        // is stale: refuse it and drop the old connection.
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.paths[c.path] == peer && c.remote_qpn == qpn && c.state == ConnState::Established
            })
            .map(|(id, _)| *id);
        if let Some(old) = stale {
            self.out.push_back((peer, rej(RejReason::STALE_CONN)));
            self.events
                .push_back(CmEvent::DisconnectRequested { conn: ConnId(old) });
            self.enter_timewait(now, old);
            return;
        }
        let id = self.alloc_id();
        self.conns.insert(
            id,
            Conn {
                state: ConnState::ReqRcvd,
                paths: vec![peer],
                path: 0,
                remote_comm_id,
                service_id,
                qpn: Qpn::from_bits(0),
                psn: Psn::new(0),
                remote_qpn: qpn,
                remote_psn: psn,
                timing: req.timing,
                wait: req.timing.rtu_wait(),
                pending: None,
                retries_left: 0,
                interval: Duration::ZERO,
                deadline: None,
                hold_rtu: false,
            },
        );
        self.events.push_back(CmEvent::Request {
            conn: ConnId(id),
            peer,
            req,
        });
    }

    /// The next CM message to send, with its destination.
    pub fn poll_transmit(&mut self) -> Option<(P, CmMsg)> {
        self.out.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent<P>> {
        self.events.pop_front()
    }

    /// The earliest timer deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Fires the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        let cfg = self.cfg;
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.deadline = None;
            if c.state == ConnState::Timewait {
                self.conns.remove(&id);
                self.events
                    .push_back(CmEvent::TimewaitExit { conn: ConnId(id) });
                continue;
            }
            let Some(msg) = c.pending.clone() else {
                continue;
            };
            if c.retries_left > 0 {
                c.retries_left -= 1;
                c.interval = c.interval.saturating_mul(2).min(cfg.clamp(c.wait));
                c.deadline = Some(now + c.interval);
                let peer = c.paths[c.path];
                self.out.push_back((peer, msg));
                continue;
            }
            match c.state {
                // Next path, fresh retries (IBA 12.9.8.3 leaves the policy to
                // the consumer; SRP's seed asks for exactly this).
                ConnState::ReqSent if c.path + 1 < c.paths.len() => {
                    c.path += 1;
                    let retries = self.cfg.max_retries.value();
                    c.retries_left = retries;
                    c.interval = cfg.clamp(c.timing.first_req_wait()).min(cfg.clamp(c.wait));
                    c.deadline = Some(now + c.interval);
                    let peer = c.paths[c.path];
                    self.out.push_back((peer, msg));
                }
                ConnState::ReqSent | ConnState::RepSent => {
                    let peer = c.paths[c.path];
                    let remote = c.remote_comm_id;
                    self.conns.remove(&id);
                    self.out.push_back((
                        peer,
                        CmMsg::Rej {
                            local_comm_id: id,
                            remote_comm_id: remote,
                            msg: MsgKind::Other,
                            reason: RejReason::TIMEOUT,
                            private_data: Vec::new(),
                        },
                    ));
                    self.events
                        .push_back(CmEvent::TimedOut { conn: ConnId(id) });
                }
                // No DREP after every retry: disconnect anyway.
                ConnState::DreqSent => self.enter_timewait(now, id),
                _ => {}
            }
        }
    }
}
