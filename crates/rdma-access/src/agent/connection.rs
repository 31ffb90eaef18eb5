//! What a connection is made of on each side: the QP parameters both
//! sides negotiate, the consumer's QP taken through INIT, RTR and RTS, the
//! path, and an incoming REQ for a listener to accept or reject.

use super::*;

/// The answer to a connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// The connection, for [`CmAgent::disconnect`].
    pub conn: ConnId,
    /// The peer's QP.
    pub remote_qpn: Qpn,
    /// The peer's first PSN.
    pub remote_psn: Psn,
    /// REP private data.
    pub private_data: Vec<u8>,
    /// The first PSN this side's QP receives, when the CM chose it rather
    /// than the consumer (the kernel's CM announces its own in the
    /// REQ); `None`: the PSN the consumer gave the connect.
    pub local_psn: Option<Psn>,
}

/// The QP parameters a REQ or REP offers (IBA 12.6.5, 12.6.8), and that
/// a QP the CM readies ([`ConnQp`]) takes, negotiated with the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// RDMA READs and atomics this side's QP takes at once as a responder
    /// (its `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side's QP has outstanding as a
    /// requester (its `max_rd_atomic`).
    pub initiator_depth: u8,
    /// Transport retries of both QPs (the REQ's count rules; 0..=7).
    pub retry_count: u8,
    /// RNR retries the sender asks of the peer's QP (7: for ever).
    pub rnr_retry_count: u8,
}

impl QpParams {
    /// What the agent has always offered: 16 READs each way, 7 retries
    /// of each kind.
    pub const DEFAULT: QpParams = QpParams {
        responder_resources: 16,
        initiator_depth: 16,
        retry_count: 7,
        rnr_retry_count: 7,
    };
}

impl Default for QpParams {
    fn default() -> Self {
        QpParams::DEFAULT
    }
}

/// A consumer's RC QP that the CM moves through its states, as Linux
/// `rdma_connect` / `rdma_accept` do with an `rdma_cm_id`'s QP: to INIT
/// (from RESET, on connect or accept), to RTR with the peer's QPN, the
/// PSN this side announced, the path MTU and the responder resources,
/// and to RTS sending from the peer's announced PSN, with the
/// retry counts and the local ACK timeout of the path (its packet
/// lifetime + 1). A QP on the agent's provider, or on one wrapping it (a
/// tracking client's).
#[derive(Clone)]
pub struct ConnQp {
    /// The provider the QP belongs to.
    pub provider: Arc<dyn Provider>,
    /// The QP, in RESET or INIT.
    pub qp: QpHandle,
    /// What this side offers.
    pub params: QpParams,
    /// The RNR NAK timer code this side's receive queue answers with.
    pub min_rnr_timer: u8,
}

impl std::fmt::Debug for ConnQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnQp")
            .field("qp", &self.qp)
            .field("params", &self.params)
            .finish()
    }
}

impl ConnQp {
    /// QP `qp` of `provider`, offering [`QpParams::DEFAULT`], RNR timer
    /// code 12 (0.64 ms).
    pub fn new(provider: Arc<dyn Provider>, qp: QpHandle) -> ConnQp {
        ConnQp {
            provider,
            qp,
            params: QpParams::DEFAULT,
            min_rnr_timer: 12,
        }
    }

    /// RESET -> INIT on `port` at `pkey_index`, remote writes allowed
    /// and, with responder resources, remote READs and atomics (as Linux
    /// ib_cm's INIT attributes); a QP already in INIT stays.
    pub(super) fn init(&self, port: PortNum, pkey_index: u16) -> Result<Qpn, CmError> {
        let p = &self.provider;
        let state = p
            .query_qp(self.qp)
            .map_err(verbs_err("query the QP"))?
            .state;
        if state == Some(QpState::Reset) {
            let mut access = AccessFlags::REMOTE_WRITE;
            if self.params.responder_resources > 0 {
                access = access | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
            }
            p.modify_qp(
                self.qp,
                &QpAttr {
                    state: Some(QpState::Init),
                    port: Some(port),
                    pkey_index: Some(pkey_index),
                    access: Some(access),
                    ..Default::default()
                },
            )
            .map_err(verbs_err("QP to INIT"))?;
        } else if state != Some(QpState::Init) {
            return Err(CmError::Verbs {
                what: "QP to INIT",
                err: verbs::VerbsError::InvalidArgument(format!(
                    "the QP is in {state:?}, not RESET or INIT"
                )),
            });
        }
        p.qp_num(self.qp).map_err(verbs_err("QP number"))
    }

    /// INIT -> RTR -> RTS towards `peer`.
    pub(super) fn connect(&self, to: &Ready) -> Result<(), CmError> {
        let p = &self.provider;
        p.modify_qp(
            self.qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr::roce(to.peer)),
                path_mtu: Some(to.mtu),
                dest_qpn: Some(to.remote_qpn),
                // A CM message's starting PSN is the first its sender
                // expects to receive (IBA 12.7.25; Linux ib_cm makes the
                // peer's the QP's send PSN): ours announced, the peer's
                // ours to send from.
                rq_psn: Some(to.psn),
                max_dest_rd_atomic: Some(to.responder_resources),
                min_rnr_timer: Some(self.min_rnr_timer),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTR"))?;
        p.modify_qp(
            self.qp,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(to.remote_psn),
                timeout: Some(to.timeout),
                retry_cnt: Some(to.retry_count.min(7)),
                rnr_retry: Some(to.rnr_retry.min(7)),
                max_rd_atomic: Some(to.initiator_depth),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTS"))
    }
}

/// The attributes of a QP's RTR and RTS, negotiated from both offers.
pub(super) struct Ready {
    pub(super) peer: Gid,
    pub(super) mtu: Mtu,
    pub(super) remote_qpn: Qpn,
    pub(super) remote_psn: Psn,
    pub(super) psn: Psn,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) timeout: u8,
    pub(super) retry_count: u8,
    pub(super) rnr_retry: u8,
}

/// A route to a peer's port, what librdmacm's `rdma_resolve_route` (or an
/// SA PathRecord) gives: the CM puts it in the REQ and times its waits by
/// its packet lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// This port's GID the connection leaves from.
    pub sgid: Gid,
    /// The peer port's GID.
    pub dgid: Gid,
    /// The partition (the P_Key of the entry the QP uses).
    pub pkey: Pkey,
    /// The path MTU.
    pub mtu: Mtu,
    /// The path's packet lifetime (4.096 us * 2^n).
    pub packet_life_time: TimeoutExp,
}

/// A connection request for a service this agent listens on.
pub struct Incoming {
    /// The connection.
    pub conn: ConnId,
    /// The requester's port GID.
    pub peer: Gid,
    /// The requester's QP.
    pub remote_qpn: Qpn,
    /// The requester's first PSN.
    pub remote_psn: Psn,
    /// Path MTU the REQ asks for.
    pub mtu: Mtu,
    /// The REQ's partition key (the P_Key of the requester's QP). The
    /// agent only delivers REQs whose partition the port's P_Key table
    /// holds (IBA 10.9.3: same partition, one side a full member); the
    /// consumer's QP takes the index of the entry matching it.
    pub pkey: Pkey,
    /// Service ID.
    pub service_id: u64,
    /// The path's packet lifetime and the CM response timeouts the REQ
    /// announced.
    pub timing: Timing,
    /// What the requester's QP offers.
    pub params: QpParams,
    /// REQ private data (92 bytes, zero padded).
    pub private_data: Vec<u8>,
    pub(super) agent: Arc<Inner>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("conn", &self.conn)
            .field("peer", &self.peer)
            .field("remote_qpn", &self.remote_qpn)
            .field("pkey", &self.pkey)
            .field("service_id", &format_args!("{:#x}", self.service_id))
            .finish()
    }
}

impl Incoming {
    /// Answers with a REP naming `qpn`/`psn` (the consumer's QP, at least
    /// in RTR) and `private_data`, offering [`QpParams::DEFAULT`] as far as
    /// the REQ allows ([`Incoming::negotiate`]).
    pub fn accept(&self, qpn: Qpn, psn: Psn, private_data: Vec<u8>) -> bool {
        self.accept_offering(qpn, psn, QpParams::DEFAULT, private_data)
    }

    /// What a REP offering `mine` may say to this REQ (IBA 12.7.29-30):
    /// no more READs taken at once than the requester has outstanding
    /// (its initiator depth), and no more outstanding than it takes (its
    /// responder resources). The consumer's QP must follow it: its
    /// `max_rd_atomic` at most the returned `initiator_depth`.
    pub fn negotiate(&self, mine: QpParams) -> QpParams {
        QpParams {
            responder_resources: mine.responder_resources.min(self.params.initiator_depth),
            initiator_depth: mine.initiator_depth.min(self.params.responder_resources),
            retry_count: self.params.retry_count,
            rnr_retry_count: mine.rnr_retry_count,
        }
    }

    /// [`Incoming::accept`] offering what `mine` and the REQ allow
    /// together ([`Incoming::negotiate`]).
    pub fn accept_offering(
        &self,
        qpn: Qpn,
        psn: Psn,
        mine: QpParams,
        private_data: Vec<u8>,
    ) -> bool {
        let offer = self.negotiate(mine);
        let mut st = self.agent.lock();
        let now = self.agent.now();
        let ok = st.cm.accept(now, self.conn, qpn, psn, private_data);
        if ok {
            if let Some(m) = st.meta.get_mut(&self.conn) {
                m.local_qpn = qpn;
                m.offer.params = offer;
            }
        }
        self.agent.flush(&mut st);
        ok
    }

    /// Readies `qp` for the requester and answers with a REP, as Linux
    /// `rdma_accept` with a QP: INIT (from RESET) in the REQ's partition,
    /// RTR with the requester's QPN, receiving from `psn` (the REP's
    /// starting PSN, IBA 12.7.25), the smaller of both path MTUs and
    /// READs the requester may have outstanding (at most `qp.params`),
    /// RTS sending from the REQ's starting PSN, with the REQ's retry
    /// counts and local
    /// ACK timeout. The REP offers what was negotiated. If a transition
    /// fails, the REQ is rejected (consumer defined, no private data).
    ///
    /// # Errors
    /// The transition that failed ([`CmError::Verbs`]); the request was
    /// already answered ([`CmError::Stopped`]).
    pub fn accept_qp(&self, qp: &ConnQp, psn: Psn, private_data: Vec<u8>) -> Result<(), CmError> {
        let pkeys = self.agent.pkeys();
        // The entry the REQ matched (a full member's first).
        let index = pkeys
            .iter()
            .position(|k| *k == self.pkey || (k.matches(self.pkey) && k.0 & 0x8000 != 0))
            .or_else(|| pkeys.iter().position(|k| k.matches(self.pkey)))
            .unwrap_or(0) as u16;
        let mine = qp.params;
        let req = self.params;
        let ready = |qpn| -> Result<Qpn, CmError> {
            let local_mtu = self.agent.local.mtu;
            qp.connect(&Ready {
                peer: self.peer,
                mtu: if self.mtu.bytes() < local_mtu.bytes() {
                    self.mtu
                } else {
                    local_mtu
                },
                remote_qpn: self.remote_qpn,
                remote_psn: self.remote_psn,
                psn,
                responder_resources: mine.responder_resources.min(req.initiator_depth),
                initiator_depth: mine.initiator_depth.min(req.responder_resources),
                timeout: self.timing.local_ack_timeout().value(),
                retry_count: req.retry_count,
                rnr_retry: req.rnr_retry_count,
            })?;
            Ok(qpn)
        };
        let qpn = match qp.init(self.agent.port, index).and_then(ready) {
            Ok(q) => q,
            Err(e) => {
                self.reject(Vec::new());
                return Err(e);
            }
        };
        if self.accept_offering(qpn, psn, mine, private_data) {
            Ok(())
        } else {
            Err(CmError::Stopped)
        }
    }

    /// Answers with a REJ, consumer defined (IBA reason 28), carrying
    /// `private_data`.
    pub fn reject(&self, private_data: Vec<u8>) -> bool {
        let mut st = self.agent.lock();
        let ok = st
            .cm
            .reject(self.conn, RejReason::CONSUMER_DEFINED, private_data);
        if ok {
            self.agent.untrack(&mut st, TrackKey::Conn(self.conn));
        }
        self.agent.flush(&mut st);
        ok
    }
}
