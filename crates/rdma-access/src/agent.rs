//! The CM agent of one port: GSI QP, MAD I/O, and the IB CM state machines.

use crate::gsi::{AgentId, Delivery, Dispatcher, MadBytes};
use crate::resource::{Client, Kind, ResId, Tracker};
use crate::wire::{self, Extra, Local, Offer};
use rdma_cm::{Cm, CmConfig, CmEvent, CmMsg, ConnId, ConnState, RejReason, Timing};
use rdma_types::{
    AccessFlags, Gid, Guid, Instant, Mtu, Pkey, PortNum, Psn, Qkey, QpState, QpType, Qpn,
    TimeoutExp,
};
use rdma_types::{WcOpcode, WcStatus};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration as StdDuration;
use verbs::{
    AhAttr, AhHandle, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, PdHandle, Provider,
    QpAttr, QpCaps, QpHandle, QpInit, RecvWr, SendOpcode, SendWr, Sge, UdDest, WorkCompletion,
};

const MAD: usize = 256;
const GRH: usize = 40;
const RECVS: u32 = 64;
const SENDS: u32 = 64;

/// Errors of the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// A verb failed while setting the agent up.
    #[error("{what}: {err}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The provider's answer.
        err: verbs::VerbsError,
    },
    /// The peer rejected the connection.
    #[error("connection rejected: {reason}")]
    Rejected {
        /// The reason in words (IBA 12.6.7.2).
        reason: String,
        /// The REJ reason code.
        code: u16,
        /// REJ private data (an SRP_LOGIN_REJ for consumer-defined rejects).
        private_data: Vec<u8>,
    },
    /// No answer after every retry.
    #[error("connection timed out: no answer from the peer")]
    TimedOut,
    /// The agent is stopped.
    #[error("CM agent stopped")]
    Stopped,
    /// A MAD agent could not be registered.
    #[error("MAD agent: {0}")]
    Mad(String),
    /// The port's CA was removed (hot unplug): its connections and
    /// listens are gone, nothing more can be sent.
    #[error("the CA was removed")]
    DeviceRemoved,
    /// An RDMA CM address or route did not resolve.
    #[error(transparent)]
    Resolve(#[from] crate::rdmacm::ResolveError),
}

/// A CM id that ended because its CA was removed (rdma_cm's
/// RDMA_CM_EVENT_DEVICE_REMOVAL), for [`CmAgent::on_device_removal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Removed {
    /// A connection, in whatever state it was (a `connect` still waiting
    /// returns [`CmError::DeviceRemoved`] as well).
    Conn(ConnId),
    /// A listen on this service ID (its channel is disconnected too).
    Listen(u64),
}

fn verbs_err(what: &'static str) -> impl FnOnce(verbs::VerbsError) -> CmError {
    move |err| CmError::Verbs { what, err }
}

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
/// (from RESET, on connect or accept), to RTR with the peer's QPN, first
/// PSN, the path MTU and the responder resources, and to RTS with the
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

    /// RESET -> INIT on port 1 at `pkey_index`, remote writes allowed
    /// and, with responder resources, remote READs and atomics (as Linux
    /// ib_cm's INIT attributes); a QP already in INIT stays.
    fn init(&self, pkey_index: u16) -> Result<Qpn, CmError> {
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
                    port: Some(PortNum(1)),
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
    fn connect(&self, to: &Ready) -> Result<(), CmError> {
        let p = &self.provider;
        p.modify_qp(
            self.qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr::roce(to.peer)),
                path_mtu: Some(to.mtu),
                dest_qpn: Some(to.remote_qpn),
                rq_psn: Some(to.remote_psn),
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
                sq_psn: Some(to.psn),
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
struct Ready {
    peer: Gid,
    mtu: Mtu,
    remote_qpn: Qpn,
    remote_psn: Psn,
    psn: Psn,
    responder_resources: u8,
    initiator_depth: u8,
    timeout: u8,
    retry_count: u8,
    rnr_retry: u8,
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
    agent: Arc<Inner>,
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
    /// RTR with the requester's QPN and PSN, the smaller of both path
    /// MTUs and READs the requester may have outstanding (at most
    /// `qp.params`), RTS from `psn` with the REQ's retry counts and local
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
        let qpn = match qp.init(index).and_then(ready) {
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

type Hook = Arc<dyn Fn(ConnId) + Send + Sync>;

/// A consumer hook a CM event runs ([`hook_for`]); the agent's thread
/// runs it once it let go of its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// [`CmAgent::on_disconnect`]: the connection ended.
    Ended(ConnId),
    /// [`CmAgent::on_established`]: an accepted connection's RTU came.
    Established(ConnId),
}
type RemovalHook = Arc<dyn Fn(Removed) + Send + Sync>;

/// Which consumer hook a CM event runs: the agent's routing rule, for
/// anything that drives a [`rdma_cm::Cm`] as the agent does (the SRP
/// target's CM login fuzz target). `waited` says whether a caller blocks
/// on the connection ([`CmAgent::connect`] and the like): that caller
/// hears of the connection's establishment, refusal or timeout. A
/// connection nobody waits on (one a listener accepted, or one whose
/// caller gave up) is established by its RTU ([`CmAgent::on_established`])
/// and ended by a REJ of its REP, the CM giving up on it, or a DREQ
/// ([`CmAgent::on_disconnect`]); a DREQ ends any connection. A REQ goes to
/// its service's listener, not to a hook.
pub fn hook_for<P>(ev: &CmEvent<P>, waited: bool) -> Option<Call> {
    match *ev {
        CmEvent::Established { conn, .. } if !waited => Some(Call::Established(conn)),
        CmEvent::Rejected { conn, .. } | CmEvent::TimedOut { conn } if !waited => {
            Some(Call::Ended(conn))
        }
        CmEvent::DisconnectRequested { conn } => Some(Call::Ended(conn)),
        _ => None,
    }
}

struct Meta {
    remote_qpn: Qpn,
    local_qpn: Qpn,
    /// The REQ's partition key.
    pkey: Pkey,
    /// What this side's REQ or REP offers.
    offer: Offer,
    /// What the peer's REP offered (active side).
    peer_params: Option<QpParams>,
}

struct State {
    cm: Cm<Gid>,
    listeners: HashMap<u64, Sender<Incoming>>,
    waiting: HashMap<ConnId, Sender<Result<Established, CmError>>>,
    meta: HashMap<ConnId, Meta>,
    ahs: HashMap<Gid, AhHandle>,
    free_sends: Vec<u32>,
    /// MADs waiting for a free send slot.
    backlog: std::collections::VecDeque<(Gid, [u8; MAD])>,
    /// Every class on QP1, the CM's too: agents, requests, retries, RMPP,
    /// status replies.
    gsi: Dispatcher,
    /// The CM's registration with `gsi`.
    cm_agent: AgentId,
    /// MADs that came on the wrong special QP (an SMP on QP1 or the
    /// reverse), dropped.
    gsi_misrouted: u64,
    /// Test knob: drop this share of received MADs (seeded).
    loss: Option<(rdma_sim::Rng, f64)>,
    /// Test knob: what this port does instead of sending an RTU.
    rtu_fault: RtuFault,
    /// Where each MAD agent's unsolicited requests go.
    mad_rx: HashMap<AgentId, Sender<(Gid, Box<MadBytes>)>>,
    /// Callers blocked on a request, by transaction ID.
    mad_waiters: HashMap<u64, Sender<Option<Vec<u8>>>>,
    next_tid: u64,
    on_disconnect: Option<Hook>,
    on_established: Option<Hook>,
    on_removal: Option<RemovalHook>,
    /// REQs refused because the port's P_Key table lacks their partition.
    pkey_refusals: u64,
    stopped: bool,
    /// The client whose tree holds this agent's objects
    /// ([`CmAgent::track_in`]), and each object's node there.
    tracker: Option<Tracker>,
    tracked: HashMap<TrackKey, ResId>,
    /// The CA node the agent's objects hang under in the tracking
    /// client's tree: the client's own open of the CA (an agent started
    /// over [`Client::into_provider`]) or `adopted`'s first.
    ca_node: Option<ResId>,
    /// The agent's verbs objects (CA, PD, CQ, QP1 and QP0, their buffers)
    /// put in the tree by [`CmAgent::track_in`] when the agent made them
    /// over another provider (an IB node's port): the nodes, CA first.
    adopted: Vec<ResId>,
}

/// An object of the agent that a tracking client's tree holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TrackKey {
    /// The agent itself (its CM class registration and thread).
    Port,
    /// A connection, from its REQ to the end of timewait.
    Conn(ConnId),
    /// A listen on a service ID.
    Listen(u64),
    /// A MAD agent.
    Agent(AgentId),
    /// An InformInfo subscription with the SA at this GID to this trap.
    Sub(Gid, u16),
}

/// The agent's own verbs objects, each released once: by the tracking
/// client's tree when it adopted them (a CA removal, a close), or by the
/// agent's drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Qp1,
    Qp0,
    RecvMr,
    SmiMr,
    SendMr,
    Cq,
    /// The PD, with the address handles made on it first.
    Pd,
    Ca,
}

impl Part {
    /// Release order (the verbs dependency order) with each part's kind.
    const ALL: [(Part, Kind); 8] = [
        (Part::Qp1, Kind::Qp),
        (Part::Qp0, Kind::Qp),
        (Part::RecvMr, Kind::Mr),
        (Part::SmiMr, Kind::Mr),
        (Part::SendMr, Kind::Mr),
        (Part::Cq, Kind::Cq),
        (Part::Pd, Kind::Pd),
        (Part::Ca, Kind::Ca),
    ];

    fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl TrackKey {
    fn kind(self) -> Kind {
        match self {
            TrackKey::Port | TrackKey::Agent(_) => Kind::MadAgent,
            TrackKey::Conn(_) | TrackKey::Listen(_) => Kind::CmId,
            TrackKey::Sub(..) => Kind::SaSubscription,
        }
    }
}

/// The CM agent of port 1 of one CA. Cloning the `Arc` shares it.
pub struct CmAgent {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Inner {
    provider: Arc<dyn Provider>,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    recv_buf: MemBuf,
    recv_mr: MrInfo,
    smi: Option<Smi>,
    send_buf: MemBuf,
    send_mr: MrInfo,
    local: Local,
    epoch: std::time::Instant,
    st: Mutex<State>,
    events: Mutex<Sender<Ev>>,
    me: std::sync::Weak<Inner>,
    /// The CA was removed (the provider's CaRemoval event).
    removed: AtomicBool,
    /// The [`Part`]s already given back to the provider.
    released: AtomicU16,
}

enum Ev {
    Cq,
    Kick,
    Stop,
    /// The CA is going: handled on the agent's thread because the event
    /// came while the agent's state was locked (perhaps by this very
    /// thread, inside a call the agent made under its lock).
    Removed,
}

/// The agent's handler for its CA: completions wake its thread, a CA
/// removal ends its CM ids ([`Inner::device_removed`]).
struct Wake {
    tx: Mutex<Sender<Ev>>,
    agent: OnceLock<Weak<Inner>>,
}

impl EventHandler for Wake {
    fn on_completion(&self, _cq_ctx: u64) {
        let _ = self.tx.lock().map(|tx| tx.send(Ev::Cq));
    }
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        if event.kind == verbs::AsyncEventKind::CaRemoval {
            if let Some(i) = self.agent.get().and_then(Weak::upgrade) {
                // A provider may deliver it inside one of the agent's own
                // calls made under its lock (the loopback does, from a
                // post): locking again here would never return, so the
                // agent's thread ends the CM ids instead.
                let free = i.st.try_lock().is_ok();
                if free {
                    i.device_removed();
                } else {
                    let _ = self.tx.lock().map(|tx| tx.send(Ev::Removed));
                }
            }
        }
    }
}

const KIND_SEND: u64 = 1 << 56;
const KIND_SMI: u64 = 1 << 55;

/// The port's QP0 and its receive ring.
struct Smi {
    qp: QpHandle,
    recv_buf: MemBuf,
    recv_mr: MrInfo,
}

/// A special QP (QP0 or QP1) of port 1, in RTS, with room for 64 sends
/// and 64 receives (the CM agent's and `ib_sm`'s port use it).
///
/// # Errors
/// What the provider refuses; a QP made before the refusal is destroyed.
pub fn special_qp(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
    cq: CqHandle,
    qp_type: QpType,
    qkey: Qkey,
) -> Result<QpHandle, verbs::VerbsError> {
    let qp = p.create_qp(
        pd,
        &QpInit {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: SENDS,
                max_recv_wr: RECVS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
            },
            sq_sig_all: true,
            port: Some(PortNum(1)),
        },
        0,
    )?;
    for attr in [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            qkey: Some(qkey),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            ..Default::default()
        },
    ] {
        if let Err(e) = p.modify_qp(qp, &attr) {
            let _ = p.destroy_qp(qp);
            return Err(e);
        }
    }
    Ok(qp)
}

/// Receive buffers for one special QP: 64 slots of GRH (40 bytes) + MAD
/// (256), registered for local write.
///
/// # Errors
/// What the provider refuses.
pub fn recv_ring(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
) -> Result<(MemBuf, MrInfo), verbs::VerbsError> {
    let buf = MemBuf::new((GRH + MAD) * RECVS as usize);
    let mr = p.reg_mr(
        pd,
        &buf,
        buf.addr(),
        buf.len() as u64,
        AccessFlags::LOCAL_WRITE,
        0,
    )?;
    Ok((buf, mr))
}

/// Send buffers for a special QP's MADs: 64 slots of 256 bytes.
///
/// # Errors
/// What the provider refuses.
pub fn send_ring(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
) -> Result<(MemBuf, MrInfo), verbs::VerbsError> {
    let buf = MemBuf::new(MAD * SENDS as usize);
    let mr = p.reg_mr(pd, &buf, buf.addr(), buf.len() as u64, AccessFlags::NONE, 0)?;
    Ok((buf, mr))
}

/// SMPs (LID-routed and directed-route) travel on QP0 only.
fn is_smp(class: u8) -> bool {
    class == 0x01 || class == 0x81
}

impl CmAgent {
    /// Opens CA `guid` on `provider`, creates its GSI QP and starts the
    /// agent's thread. `first_comm_id` seeds the comm IDs (vary it per run).
    pub fn start(
        provider: Arc<dyn Provider>,
        guid: Guid,
        first_comm_id: u32,
    ) -> Result<Arc<CmAgent>, CmError> {
        CmAgent::start_with(provider, guid, first_comm_id, CmConfig::default())
    }

    /// As [`CmAgent::start`], with the CM's response timeout, retries and
    /// timewait from `cm`.
    pub fn start_with(
        provider: Arc<dyn Provider>,
        guid: Guid,
        first_comm_id: u32,
        cm: CmConfig,
    ) -> Result<Arc<CmAgent>, CmError> {
        let (tx, rx) = mpsc::channel();
        let p = &provider;
        let wake = Arc::new(Wake {
            tx: Mutex::new(tx.clone()),
            agent: OnceLock::new(),
        });
        let ca = p
            .open_ca(guid, 0, wake.clone())
            .map_err(verbs_err("open CA"))?;
        let port = p
            .query_port(ca, PortNum(1))
            .map_err(verbs_err("query port"))?;
        let gid = port.gids.first().copied().ok_or(CmError::Verbs {
            what: "port GID",
            err: verbs::VerbsError::InvalidArgument("no GID".into()),
        })?;
        let pd = p.alloc_pd(ca, 0).map_err(verbs_err("allocate PD"))?;
        let cq = p
            .create_cq(
                pd,
                &CqInit {
                    cqe: 2 * RECVS + SENDS + 1,
                },
                0,
            )
            .map_err(verbs_err("create CQ"))?;
        let qp = special_qp(p, pd, cq, QpType::Gsi, Qkey::GSI).map_err(verbs_err("GSI QP"))?;
        let (recv_buf, recv_mr) =
            recv_ring(p, pd).map_err(verbs_err("register MAD receive buffers"))?;
        // QP0 where the provider has one (soft RoCE has none: RoCE carries
        // no SMPs).
        let smi = match special_qp(p, pd, cq, QpType::Smi, Qkey(0)) {
            Ok(q) => match recv_ring(p, pd) {
                Ok((buf, mr)) => {
                    let recvs: Vec<RecvWr> = (0..RECVS)
                        .map(|i| recv_wr(&buf, &mr, i, KIND_SMI))
                        .collect();
                    let _ = p.post_recv(q, &recvs);
                    Some(Smi {
                        qp: q,
                        recv_buf: buf,
                        recv_mr: mr,
                    })
                }
                Err(_) => {
                    let _ = p.destroy_qp(q);
                    None
                }
            },
            Err(_) => None,
        };
        let (send_buf, send_mr) =
            send_ring(p, pd).map_err(verbs_err("register MAD send buffers"))?;
        let recvs: Vec<RecvWr> = (0..RECVS)
            .map(|i| recv_wr(&recv_buf, &recv_mr, i, 0))
            .collect();
        p.post_recv(qp, &recvs)
            .map_err(verbs_err("post MAD receives"))?;
        p.req_notify_cq(cq, false).map_err(verbs_err("arm CQ"))?;
        let mut gsi = Dispatcher::new();
        let cm_agent = gsi
            .register(
                u8::from(rdma_mad::mad::MgmtClass::Cm),
                rdma_mad::cm::CM_CLASS_VERSION,
                &[u8::from(rdma_mad::mad::Method::Send)],
            )
            .map_err(|e| CmError::Mad(e.to_string()))?;
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            provider: provider.clone(),
            ca,
            pd,
            cq,
            qp,
            recv_buf,
            recv_mr,
            smi,
            send_buf,
            send_mr,
            local: Local {
                guid,
                gid,
                mtu: port.active_mtu,
            },
            epoch: std::time::Instant::now(),
            st: Mutex::new(State {
                cm: Cm::new(cm, first_comm_id),
                listeners: HashMap::new(),
                waiting: HashMap::new(),
                meta: HashMap::new(),
                ahs: HashMap::new(),
                free_sends: (0..SENDS).rev().collect(),
                backlog: Default::default(),
                gsi,
                cm_agent,
                gsi_misrouted: 0,
                loss: None,
                mad_rx: HashMap::new(),
                mad_waiters: HashMap::new(),
                next_tid: (first_comm_id as u64) << 32,
                on_disconnect: None,
                on_established: None,
                rtu_fault: RtuFault::None,
                on_removal: None,
                pkey_refusals: 0,
                stopped: false,
                tracker: None,
                tracked: HashMap::new(),
                ca_node: None,
                adopted: Vec::new(),
            }),
            events: Mutex::new(tx),
            removed: AtomicBool::new(false),
            released: AtomicU16::new(0),
        });
        let _ = wake.agent.set(Arc::downgrade(&inner));
        let w = inner.clone();
        let thread = std::thread::Builder::new()
            .name("cm-agent".into())
            .spawn(move || w.run(rx))
            .map_err(|e| CmError::Verbs {
                what: "start the CM thread",
                err: verbs::VerbsError::InvalidArgument(e.to_string()),
            })?;
        Ok(Arc::new(CmAgent {
            inner,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The port GID the agent answers on.
    pub fn gid(&self) -> Gid {
        self.inner.local.gid
    }

    /// The GUID of the agent's CA.
    pub fn ca_guid(&self) -> Guid {
        self.inner.local.guid
    }

    /// The port's GID table as the provider reports it now (the GID the
    /// agent answers on alone if the provider cannot say).
    pub fn gids(&self) -> Vec<Gid> {
        match self.inner.provider.query_port(self.inner.ca, PortNum(1)) {
            Ok(p) if !p.gids.is_empty() => p.gids,
            _ => vec![self.gid()],
        }
    }

    /// The port's active MTU.
    pub fn mtu(&self) -> Mtu {
        self.inner.local.mtu
    }

    /// Listens on `service_id`: connection requests arrive on the returned
    /// channel.
    /// On a tracked agent ([`CmAgent::track_in`]) the listen is a CM id
    /// of the client, ended when it closes; a closed client's agent
    /// listens no more (the channel is disconnected at once).
    pub fn listen(&self, service_id: u64) -> Receiver<Incoming> {
        let (tx, rx) = mpsc::channel();
        let mut st = self.inner.lock();
        if self
            .inner
            .track(&mut st, TrackKey::Listen(service_id))
            .is_ok()
        {
            st.cm.listen(service_id);
            st.listeners.insert(service_id, tx);
        }
        rx
    }

    /// Puts this agent and, from now on, every connection (from its REQ
    /// to the end of its timewait), listen, MAD agent and SA subscription
    /// of it in `client`'s resource tree (see [`crate::resource`]): they
    /// show in its counters, and closing or dropping the client
    /// disconnects the connections (a REQ still unanswered is abandoned
    /// and its `connect` returns [`CmError::Stopped`]; a REQ not yet
    /// answered by the consumer is rejected), ends the listens, deletes
    /// the subscriptions at the SA (one Set(InformInfo) each, not waited
    /// for), unregisters the MAD agents and stops the agent, in that
    /// order, before the client's QPs go.
    ///
    /// They all hang under the CA the agent uses (its CM ids, MAD agents
    /// and subscriptions under the agent's own node, which is under the
    /// CA): destroying that CA node, or the CA's removal, ends them
    /// first, then the agent's QP1 and QP0 and their buffers. An agent
    /// started over `client`'s own provider ([`Client::into_provider`])
    /// hangs under the client's open of the CA, where its QPs and buffers
    /// already are; an agent started over another provider (an IB node's
    /// port, made before any client) has its CA, PD, CQ, special QPs and
    /// buffers adopted into the tree, counted under their kinds, and
    /// given back to the provider by the tree (once: the agent's drop
    /// then skips them).
    ///
    /// When the CA is removed, every connection and listen of the agent
    /// ends where it stands (no DREQ can leave a removed port): the
    /// [`CmAgent::on_device_removal`] hook hears of each, the
    /// [`CmAgent::on_disconnect`] hook of each connection, a `connect`
    /// still waiting returns [`CmError::DeviceRemoved`], listen channels
    /// are disconnected. An untracked agent does the same by itself.
    ///
    /// # Errors
    /// The agent is already tracked, or `client` is closed.
    pub fn track_in(&self, client: &Client) -> Result<(), CmError> {
        let mut st = self.inner.lock();
        if st.tracker.is_some() {
            return Err(CmError::Verbs {
                what: "track the CM agent",
                err: verbs::VerbsError::InvalidArgument("already in a client's tree".into()),
            });
        }
        if st.stopped || self.inner.removed.load(Ordering::SeqCst) {
            return Err(CmError::Stopped);
        }
        let t = client.tracker();
        let ca_node = match t.ca_node(self.inner.ca) {
            Some(id) => id,
            None => {
                let adopted = self.inner.adopt(&t)?;
                let ca = adopted[0];
                st.adopted = adopted;
                ca
            }
        };
        st.tracker = Some(t);
        st.ca_node = Some(ca_node);
        let r = self.inner.track(&mut st, TrackKey::Port);
        if r.is_err() {
            let (t, adopted) = (st.tracker.take(), std::mem::take(&mut st.adopted));
            st.ca_node = None;
            if let Some(t) = t {
                for id in adopted {
                    t.untrack(id);
                }
            }
        }
        r
    }

    /// Called for each CM id (connection or listen) ended because the
    /// port's CA was removed, as rdma_cm's RDMA_CM_EVENT_DEVICE_REMOVAL
    /// (see [`CmAgent::track_in`]).
    pub fn on_device_removal(&self, hook: impl Fn(Removed) + Send + Sync + 'static) {
        self.inner.lock().on_removal = Some(Arc::new(hook));
    }

    /// True once the port's CA was removed.
    pub fn is_removed(&self) -> bool {
        self.inner.removed.load(Ordering::SeqCst)
    }

    /// Called with the connection when the peer disconnects (DREQ), the
    /// connection's state machine gives up on it, or its CA is removed;
    /// for a connection a listener accepted, also when it ends before it
    /// was established: the requester refuses the REP (REJ), sends a DREQ
    /// instead of the RTU, or the RTU never comes.
    pub fn on_disconnect(&self, hook: impl Fn(ConnId) + Send + Sync + 'static) {
        self.inner.lock().on_disconnect = Some(Arc::new(hook));
    }

    /// Called with a connection a listener accepted when its RTU arrives:
    /// from then on only [`CmAgent::on_disconnect`] ends it.
    pub fn on_established(&self, hook: impl Fn(ConnId) + Send + Sync + 'static) {
        self.inner.lock().on_established = Some(Arc::new(hook));
    }

    /// The port's P_Key table as the provider reports it now (an SM may
    /// change it); the default P_Key alone if the provider cannot say.
    pub fn pkeys(&self) -> Vec<Pkey> {
        self.inner.pkeys()
    }

    /// REQs this port refused because its P_Key table lacks their
    /// partition.
    pub fn pkey_refusals(&self) -> u64 {
        self.inner.lock().pkey_refusals
    }

    /// Connects to `service_id` at the port with GID `peer`, offering QP
    /// `qpn` starting at `psn`; blocks until the REP (or REJ, or the last
    /// retry) and sends the RTU. The REQ is in the partition of index 0
    /// of the port's P_Key table, where a QP made without a choice is (on
    /// RoCE the default P_Key, as Linux rdma_cm sends): a QP at another
    /// index connects with [`CmAgent::connect_in_partition`].
    pub fn connect(
        &self,
        peer: Gid,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        self.connect_path(
            &self.path_to(peer),
            service_id,
            qpn,
            psn,
            private_data,
            timeout,
        )
    }

    /// [`CmAgent::connect`] with the REQ in partition `pkey`: the P_Key of
    /// the table entry QP `qpn` uses (IBA 12.6.5; the passive side puts
    /// its QP in the same partition or refuses).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_in_partition(
        &self,
        peer: Gid,
        pkey: Pkey,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let path = Path {
            pkey,
            ..self.path_to(peer)
        };
        self.connect_path(&path, service_id, qpn, psn, private_data, timeout)
    }

    /// The path to the port with GID `dgid` when nobody resolved one:
    /// this port's GID and active MTU, the partition of index 0 of its
    /// P_Key table, the configured packet lifetime (RoCE has no SA).
    pub fn path_to(&self, dgid: Gid) -> Path {
        let plt = self.inner.lock().cm.config().packet_life_time;
        Path {
            sgid: self.gid(),
            dgid,
            pkey: self.pkeys().first().copied().unwrap_or(Pkey::DEFAULT),
            mtu: self.mtu(),
            packet_life_time: plt,
        }
    }

    /// Connects over `path` (see [`CmAgent::connect`]): the REQ is in
    /// its partition, offers its MTU (at most the port's) and waits for
    /// the REP by its packet lifetime (twice, plus the peer's CM
    /// response time).
    pub fn connect_path(
        &self,
        path: &Path,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let offer = Offer {
            params: QpParams::DEFAULT,
            mtu: path.mtu,
        };
        let (conn, rx) = self.send_req(path, service_id, qpn, psn, private_data, offer, false)?;
        self.wait_answer(conn, rx, timeout)
    }

    /// Connects `qp` over `path` and readies it, as Linux `rdma_connect`
    /// with a QP: INIT (from RESET) in the path's partition before the
    /// REQ; on the REP, RTR with the responder's QPN and PSN, the path
    /// MTU and the READs it may have outstanding (at most `qp.params`),
    /// then RTS from `psn` with the REQ's retry count, the REP's RNR
    /// retry count, the path's local ACK timeout (packet lifetime + 1)
    /// and the READs the responder takes, and only then the RTU. If a
    /// transition fails the REP is rejected (consumer defined) and the
    /// error returned.
    ///
    /// # Errors
    /// As [`CmAgent::connect`]; [`CmError::Verbs`] when the QP could not
    /// be readied; the path's partition missing from the port's table.
    pub fn connect_qp(
        &self,
        path: &Path,
        service_id: u64,
        qp: &ConnQp,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let index = self
            .pkeys()
            .iter()
            .position(|k| *k == path.pkey)
            .ok_or_else(|| CmError::Verbs {
                what: "P_Key index",
                err: verbs::VerbsError::InvalidArgument(format!(
                    "P_Key {:04x} is not in the port's table",
                    path.pkey.0
                )),
            })?;
        let qpn = qp.init(index as u16)?;
        let offer = Offer {
            params: qp.params,
            mtu: path.mtu,
        };
        let (conn, rx) = self.send_req(path, service_id, qpn, psn, private_data, offer, true)?;
        let rep = self.wait_answer(conn, rx, timeout)?;
        let theirs = self
            .inner
            .lock()
            .meta
            .get(&conn)
            .and_then(|m| m.peer_params)
            .unwrap_or(QpParams::DEFAULT);
        let mine = qp.params;
        let ready = Ready {
            peer: path.dgid,
            mtu: if path.mtu.bytes() < self.mtu().bytes() {
                path.mtu
            } else {
                self.mtu()
            },
            remote_qpn: rep.remote_qpn,
            remote_psn: rep.remote_psn,
            psn,
            responder_resources: mine.responder_resources.min(theirs.initiator_depth),
            initiator_depth: mine.initiator_depth.min(theirs.responder_resources),
            timeout: self
                .inner
                .lock()
                .cm
                .config()
                .timing(path.packet_life_time)
                .local_ack_timeout()
                .value(),
            retry_count: mine.retry_count,
            rnr_retry: theirs.rnr_retry_count,
        };
        let r = qp.connect(&ready);
        let mut st = self.inner.lock();
        let sent = match &r {
            Ok(()) => st.cm.ready(conn),
            Err(_) => {
                st.cm
                    .reject_reply(conn, RejReason::CONSUMER_DEFINED, Vec::new());
                st.meta.remove(&conn);
                self.inner.untrack(&mut st, TrackKey::Conn(conn));
                false
            }
        };
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
        r?;
        if !sent {
            // Abandoned meanwhile (the client closed, the CA went).
            return Err(self.inner.gone());
        }
        Ok(rep)
    }

    /// Sends the REQ of a new connection; the receiver hears its answer.
    #[allow(clippy::too_many_arguments)]
    fn send_req(
        &self,
        path: &Path,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        offer: Offer,
        hold_rtu: bool,
    ) -> Result<(ConnId, Receiver<Result<Established, CmError>>), CmError> {
        let (tx, rx) = mpsc::channel();
        let mut st = self.inner.lock();
        if self.inner.removed.load(Ordering::SeqCst) {
            return Err(CmError::DeviceRemoved);
        }
        if st.stopped || st.tracker.as_ref().is_some_and(|t| !t.is_open()) {
            return Err(CmError::Stopped);
        }
        let now = self.inner.now();
        let timing = st.cm.config().timing(path.packet_life_time);
        let req = rdma_cm::ReqInfo {
            service_id,
            qpn,
            psn,
            pkey: path.pkey,
            timing,
            private_data,
        };
        let conn = st.cm.connect_req(now, vec![path.dgid], req);
        if hold_rtu {
            st.cm.hold_rtu(conn);
        }
        if let Err(e) = self.inner.track(&mut st, TrackKey::Conn(conn)) {
            // Closed just now: the REQ is not sent again.
            st.cm.abandon(conn);
            return Err(e);
        }
        st.waiting.insert(conn, tx);
        st.meta.insert(
            conn,
            Meta {
                remote_qpn: Qpn::from_bits(0),
                local_qpn: qpn,
                pkey: path.pkey,
                offer,
                peer_params: None,
            },
        );
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
        Ok((conn, rx))
    }

    /// Waits for the answer to a REQ, at most `timeout`.
    fn wait_answer(
        &self,
        conn: ConnId,
        rx: Receiver<Result<Established, CmError>>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        if let Ok(r) = rx.recv_timeout(timeout) {
            return r;
        }
        // Given up: no REQ goes out again (a late one would log in behind
        // the caller's back), unless the answer came meanwhile.
        let mut st = self.inner.lock();
        if let Ok(r) = rx.try_recv() {
            return r;
        }
        st.cm.abandon(conn);
        st.waiting.remove(&conn);
        st.meta.remove(&conn);
        self.inner.untrack(&mut st, TrackKey::Conn(conn));
        Err(CmError::TimedOut)
    }

    /// Starts a disconnect (DREQ); idempotent. An accepted connection
    /// still waiting for its RTU is refused instead (REJ) and gone at once.
    pub fn disconnect(&self, conn: ConnId) {
        let mut st = self.inner.lock();
        let now = self.inner.now();
        let unanswered = st.cm.state(conn) == rdma_cm::ConnState::RepSent;
        if st.cm.disconnect(now, conn) && unanswered {
            st.meta.remove(&conn);
            self.inner.untrack(&mut st, TrackKey::Conn(conn));
        }
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
    }

    /// Disconnects and waits, at most `within`, for the DREP (or the DREQ
    /// to time out): a process about to exit has then really told the
    /// peer, which otherwise keeps the connection and rejects the next
    /// login from the same CA as stale. True if the DREP came.
    pub fn disconnect_wait(&self, conn: ConnId, within: std::time::Duration) -> bool {
        self.disconnect(conn);
        let end = std::time::Instant::now() + within;
        loop {
            if self.state(conn) != rdma_cm::ConnState::DreqSent {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The state of a connection.
    pub fn state(&self, conn: ConnId) -> rdma_cm::ConnState {
        self.inner.lock().cm.state(conn)
    }

    /// Registers a MAD agent on this port's QP1 for `methods` of `class`
    /// and `version` (no methods: it only sends requests). See
    /// [`crate::gsi`] for the routing rules.
    ///
    /// # Errors
    /// Another agent serves one of the methods.
    pub fn mad_agent(&self, class: u8, version: u8, methods: &[u8]) -> Result<MadAgent, CmError> {
        let mut st = self.inner.lock();
        if st.stopped {
            return Err(CmError::Stopped);
        }
        let id = st
            .gsi
            .register(class, version, methods)
            .map_err(|e| CmError::Mad(e.to_string()))?;
        if let Err(e) = self.inner.track(&mut st, TrackKey::Agent(id)) {
            st.gsi.unregister(id);
            return Err(e);
        }
        let (tx, rx) = mpsc::channel();
        st.mad_rx.insert(id, tx);
        Ok(MadAgent {
            port: self.inner.clone(),
            id,
            rx: Mutex::new(rx),
        })
    }

    /// Counters of the port's MAD dispatcher.
    pub fn gsi_stats(&self) -> crate::gsi::GsiStats {
        self.inner.lock().gsi.stats()
    }

    /// True if the port has a QP0 (SMPs can be sent and received).
    pub fn has_smi(&self) -> bool {
        self.inner.smi.is_some()
    }

    /// Drops a seeded random share `loss` (0..1) of the MADs this port
    /// receives, every class alike: a fault knob for tests on providers
    /// without fault injection of their own. `None` turns it off.
    pub fn set_receive_loss(&self, loss: Option<(u64, f64)>) {
        self.inner.lock().loss = loss.map(|(seed, p)| (rdma_sim::Rng::new(seed), p));
    }

    /// What this port does where its CM would send an RTU: a fault knob
    /// for testing a passive side against initiators whose logins never
    /// complete (see [`RtuFault`]).
    pub fn set_rtu_fault(&self, fault: RtuFault) {
        self.inner.lock().rtu_fault = fault;
    }
}

/// What an active side does after a REP instead of its RTU
/// ([`CmAgent::set_rtu_fault`]), each a way a half-open login ends (or
/// does not) at the passive side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtuFault {
    /// The RTU goes out (normal).
    None,
    /// The RTU is not sent (lost, or the initiator died after the REP):
    /// this side thinks it is connected, the passive side waits. A later
    /// [`CmAgent::disconnect`] sends a DREQ the passive side gets before
    /// any RTU.
    Drop,
    /// A REJ answers the REP (Linux ib_srp does when it refuses a login
    /// response) and this side forgets the connection.
    Reject,
}

/// A MAD agent on a port's QP1 (from [`CmAgent::mad_agent`]); dropping it
/// unregisters it.
pub struct MadAgent {
    port: Arc<Inner>,
    id: AgentId,
    rx: Mutex<Receiver<(Gid, Box<MadBytes>)>>,
}

/// What [`MadAgent::wait`] found.
#[derive(Debug)]
pub enum MadWait {
    /// An unsolicited request for the agent, and the port that sent it.
    Request(Gid, Box<MadBytes>),
    /// Nothing came in the time given.
    TimedOut,
    /// Nothing will come again: the agent was closed
    /// ([`MadAgentCloser::close`]) or its CA was removed. A loop serving
    /// the agent ends here rather than asking again, which would return at
    /// once every time.
    Closed,
}

impl MadAgent {
    /// The next unsolicited request for this agent, waiting at most
    /// `timeout`; `None` when the time passed or the agent is closed (see
    /// [`MadAgent::wait`] to tell them apart).
    pub fn recv(&self, timeout: StdDuration) -> Option<(Gid, Box<MadBytes>)> {
        match self.wait(timeout) {
            MadWait::Request(peer, mad) => Some((peer, mad)),
            MadWait::TimedOut | MadWait::Closed => None,
        }
    }

    /// The next unsolicited request for this agent, waiting at most
    /// `timeout`, or why there is none.
    pub fn wait(&self, timeout: StdDuration) -> MadWait {
        match self
            .rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(timeout)
        {
            Ok((peer, mad)) => MadWait::Request(peer, mad),
            Err(RecvTimeoutError::Timeout) => MadWait::TimedOut,
            Err(RecvTimeoutError::Disconnected) => MadWait::Closed,
        }
    }

    /// A handle another thread uses to close this agent's receiving side,
    /// so a thread blocked in [`MadAgent::wait`] returns at once with
    /// [`MadWait::Closed`]: a serving loop can then wait without a timeout
    /// to check a stop flag against.
    pub fn closer(&self) -> MadAgentCloser {
        MadAgentCloser {
            port: self.port.clone(),
            id: self.id,
        }
    }

    /// Sends `mad` (a response, or a request that wants none) to `peer`.
    pub fn send(&self, peer: Gid, mad: MadBytes) {
        let mut st = self.port.lock();
        st.gsi.send(peer, mad);
        self.port.flush(&mut st);
    }

    /// Sends a response too large for one MAD as an RMPP transfer (see
    /// [`crate::gsi::Dispatcher::send_rmpp`]): `header` is the response's
    /// headers (TID, method, class header), `data` the payload.
    ///
    /// # Errors
    /// The header is too short for its class.
    pub fn send_rmpp(
        &self,
        peer: Gid,
        header: &[u8],
        data: &[u8],
        timeout: StdDuration,
        retries: u32,
    ) -> Result<(), CmError> {
        let mut st = self.port.lock();
        let now = self.port.now();
        let t = rdma_types::Duration::from_micros(timeout.as_micros() as u64);
        st.gsi
            .send_rmpp(now, peer, header, data, t, retries)
            .map_err(|e| CmError::Mad(e.to_string()))?;
        self.port.flush(&mut st);
        drop(st);
        self.port.kick();
        Ok(())
    }

    /// Sends request `mad` to `peer` (with a fresh transaction ID) and waits
    /// for the response, resending every `timeout` up to `retries` times.
    /// An RMPP response comes back cut to its first 256 bytes: see
    /// [`MadAgent::request_long`].
    ///
    /// # Errors
    /// No response after every retry, or the port stopped.
    pub fn request(
        &self,
        peer: Gid,
        mad: MadBytes,
        timeout: StdDuration,
        retries: u32,
    ) -> Result<Box<MadBytes>, CmError> {
        let r = self.request_long(peer, mad, timeout, retries)?;
        let mut m = Box::new([0u8; MAD]);
        let n = r.len().min(MAD);
        m[..n].copy_from_slice(&r[..n]);
        Ok(m)
    }

    /// As [`MadAgent::request`], with the whole response: one MAD, or an
    /// RMPP transfer's first headers followed by all its data.
    ///
    /// # Errors
    /// No response after every retry, or the port stopped.
    pub fn request_long(
        &self,
        peer: Gid,
        mad: MadBytes,
        timeout: StdDuration,
        retries: u32,
    ) -> Result<Vec<u8>, CmError> {
        let (tx, rx) = mpsc::channel();
        {
            let mut st = self.port.lock();
            if st.stopped {
                return Err(CmError::Stopped);
            }
            let now = self.port.now();
            let t = rdma_types::Duration::from_micros(timeout.as_micros() as u64);
            let tid = st.gsi.send_request(now, self.id, peer, mad, t, retries);
            st.mad_waiters.insert(tid, tx);
            self.port.flush(&mut st);
        }
        self.port.kick();
        // The dispatcher's own timers end the wait (an RMPP transfer
        // resets them per segment); this bound only covers a port that
        // stopped meanwhile.
        let bound = timeout * (retries + 2) + StdDuration::from_secs(5);
        match rx.recv_timeout(bound) {
            Ok(Some(m)) => Ok(m),
            Ok(None) | Err(_) => Err(CmError::TimedOut),
        }
    }
}

impl MadAgent {
    /// Puts a subscription to `trap` with the SA at `sa` in the tracking
    /// client's tree (if the port has one).
    pub(crate) fn track_subscription(&self, sa: Gid, trap: u16) -> Result<(), CmError> {
        let mut st = self.port.lock();
        self.port.track(&mut st, TrackKey::Sub(sa, trap))
    }

    /// The subscription ended (or never began).
    pub(crate) fn untrack_subscription(&self, sa: Gid, trap: u16) {
        let mut st = self.port.lock();
        self.port.untrack(&mut st, TrackKey::Sub(sa, trap));
    }
}

/// Closes a [`MadAgent`]'s receiving side from another thread
/// ([`MadAgent::closer`]). Requests that come after are dropped; the agent
/// stays registered (its sends work) until it is dropped.
pub struct MadAgentCloser {
    port: Arc<Inner>,
    id: AgentId,
}

impl MadAgentCloser {
    /// Closes the agent's receiving side (again is harmless).
    pub fn close(&self) {
        self.port.lock().mad_rx.remove(&self.id);
    }
}

impl Drop for MadAgent {
    fn drop(&mut self) {
        let mut st = self.port.lock();
        st.gsi.unregister(self.id);
        st.mad_rx.remove(&self.id);
        self.port.untrack(&mut st, TrackKey::Agent(self.id));
    }
}

impl Drop for CmAgent {
    fn drop(&mut self) {
        self.inner.lock().stopped = true;
        let _ = self.inner.events.lock().map(|tx| tx.send(Ev::Stop));
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        let i = &self.inner;
        // What a tracking client's tree still holds of the agent ends here.
        {
            let mut st = i.lock();
            let keys: Vec<TrackKey> = st.tracked.keys().copied().collect();
            for k in keys {
                i.untrack(&mut st, k);
            }
        }
        // Adopted verbs objects leave the tree; what the tree has not
        // given back yet goes back here.
        {
            let mut st = i.lock();
            let adopted = std::mem::take(&mut st.adopted);
            if let Some(t) = &st.tracker {
                for id in adopted {
                    t.untrack(id);
                }
            }
        }
        for (part, _) in Part::ALL {
            i.release(part);
        }
    }
}

/// The receive of slot `i` of a [`recv_ring`], its work-request ID `tag`
/// with the slot number in the low bits.
pub fn recv_wr(buf: &MemBuf, mr: &MrInfo, i: u32, tag: u64) -> RecvWr {
    RecvWr {
        wr_id: tag | i as u64,
        sges: vec![Sge {
            addr: buf.addr() + (i as usize * (GRH + MAD)) as u64,
            length: (GRH + MAD) as u32,
            lkey: mr.lkey,
        }],
    }
}

/// The sender's GID from the 40-byte area in front of a UD receive: an IB
/// GRH (source GID at 8), or on RoCEv2 over IPv4 an IPv4 header in the last
/// 20 bytes (source address at 32). `grh` is at least 40 bytes.
pub fn source_gid(grh: &[u8]) -> Gid {
    if grh[20] == 0x45 {
        let ip = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        Gid::from_ip(ip.into())
    } else {
        Gid(grh[8..24].try_into().expect("16 bytes"))
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `key` in the tracking client's tree, if the agent has one;
    /// its node's hook ends the object ([`Inner::close_tracked`]).
    ///
    /// # Errors
    /// The tracking client is closed: the object must not be made.
    fn track(&self, st: &mut State, key: TrackKey) -> Result<(), CmError> {
        let Some(t) = st.tracker.clone() else {
            return Ok(());
        };
        if st.tracked.contains_key(&key) {
            return Ok(());
        }
        // The agent's node under its CA; everything else under the agent.
        let parent = match key {
            TrackKey::Port => st.ca_node,
            _ => Some(*st.tracked.get(&TrackKey::Port).ok_or(CmError::Stopped)?),
        };
        let me = self.me.clone();
        let id = t
            .track(key.kind(), parent, move || {
                if let Some(i) = me.upgrade() {
                    i.close_tracked(key);
                }
            })
            .map_err(|_| self.gone())?;
        st.tracked.insert(key, id);
        Ok(())
    }

    /// Why the agent does no more work.
    fn gone(&self) -> CmError {
        if self.removed.load(Ordering::SeqCst) {
            CmError::DeviceRemoved
        } else {
            CmError::Stopped
        }
    }

    /// Puts the agent's verbs objects in `t`'s tree (CA, then PD under
    /// it, then the rest under the PD), each node releasing its part.
    /// Returns the nodes, CA first.
    ///
    /// # Errors
    /// The client is closed (nothing is left in its tree).
    fn adopt(&self, t: &Tracker) -> Result<Vec<ResId>, CmError> {
        let mut ids: Vec<ResId> = Vec::new();
        let mut parent = None;
        for (part, kind) in Part::ALL.iter().rev().copied() {
            if matches!(part, Part::Qp0 | Part::SmiMr) && self.smi.is_none() {
                continue;
            }
            let me = self.me.clone();
            let placed = t.track(kind, parent, move || {
                if let Some(i) = me.upgrade() {
                    i.release(part);
                }
            });
            match placed {
                Ok(id) => {
                    ids.push(id);
                    // The CA holds the PD, the PD the rest.
                    if matches!(part, Part::Ca | Part::Pd) {
                        parent = Some(id);
                    }
                }
                Err(_) => {
                    for id in ids {
                        t.untrack(id);
                    }
                    return Err(CmError::Stopped);
                }
            }
        }
        Ok(ids)
    }

    /// Gives `part` back to the provider, once (errors ignored: a removed
    /// CA has taken it already).
    fn release(&self, part: Part) {
        if self.released.fetch_or(part.bit(), Ordering::SeqCst) & part.bit() != 0 {
            return;
        }
        let p = &self.provider;
        let _ = match part {
            Part::Qp1 => p.destroy_qp(self.qp),
            Part::Qp0 => self.smi.as_ref().map_or(Ok(()), |s| p.destroy_qp(s.qp)),
            Part::RecvMr => p.dereg_mr(self.recv_mr.handle),
            Part::SmiMr => self
                .smi
                .as_ref()
                .map_or(Ok(()), |s| p.dereg_mr(s.recv_mr.handle)),
            Part::SendMr => p.dereg_mr(self.send_mr.handle),
            Part::Cq => p.destroy_cq(self.cq),
            Part::Pd => {
                let ahs: Vec<AhHandle> = self.lock().ahs.drain().map(|(_, a)| a).collect();
                for a in ahs {
                    let _ = p.destroy_ah(a);
                }
                p.dealloc_pd(self.pd)
            }
            Part::Ca => p.close_ca(self.ca),
        };
    }

    fn is_released(&self, part: Part) -> bool {
        self.released.load(Ordering::SeqCst) & part.bit() != 0
    }

    /// The CA is being removed (its CaRemoval event, before the provider
    /// forgets it). A tracked agent's objects end through the tracking
    /// client's tree: the adopted CA node is destroyed here, or the
    /// client's own open of the CA is destroyed by the client's handler
    /// right after this returns; each CM id's node ends it
    /// ([`Inner::close_tracked`]). An untracked agent ends them itself.
    fn device_removed(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (tracker, adopted_ca) = {
            let st = self.lock();
            (st.tracker.clone(), st.adopted.first().copied())
        };
        match (tracker, adopted_ca) {
            (Some(t), Some(ca)) if t.is_open() => t.destroy(ca),
            (Some(t), None) if t.is_open() => {}
            _ => self.end_all_removed(),
        }
    }

    /// Ends a connection on a removed CA: forgotten by the state machine
    /// (nothing can be sent), out of the tree, its waiting `connect` told
    /// (the disconnect hook is for connections nobody waits on).
    fn end_conn_removed(&self, st: &mut State, conn: ConnId, told: &mut Vec<(Removed, bool)>) {
        let known = st.cm.forget(conn) | st.meta.remove(&conn).is_some();
        self.untrack(st, TrackKey::Conn(conn));
        let waiting = st.waiting.remove(&conn);
        if let Some(tx) = &waiting {
            let _ = tx.send(Err(CmError::DeviceRemoved));
        }
        if known || waiting.is_some() {
            told.push((Removed::Conn(conn), waiting.is_none()));
        }
    }

    fn end_listen_removed(&self, st: &mut State, service_id: u64, told: &mut Vec<(Removed, bool)>) {
        st.cm.unlisten(service_id);
        self.untrack(st, TrackKey::Listen(service_id));
        if st.listeners.remove(&service_id).is_some() {
            told.push((Removed::Listen(service_id), false));
        }
    }

    /// Ends every connection and listen left on a removed CA, and the
    /// agent: its thread stops, its MAD agents' waiting callers hear.
    fn end_all_removed(&self) {
        let mut st = self.lock();
        let mut told = Vec::new();
        let mut conns: Vec<ConnId> = st.meta.keys().chain(st.waiting.keys()).copied().collect();
        conns.sort();
        conns.dedup();
        for c in conns {
            self.end_conn_removed(&mut st, c, &mut told);
        }
        let listens: Vec<u64> = st.listeners.keys().copied().collect();
        for s in listens {
            self.end_listen_removed(&mut st, s, &mut told);
        }
        let keys: Vec<TrackKey> = st.tracked.keys().copied().collect();
        for k in keys.into_iter().filter(|k| *k != TrackKey::Port) {
            self.untrack(&mut st, k);
        }
        st.stopped = true;
        st.mad_waiters.clear();
        let _ = self.events.lock().map(|tx| tx.send(Ev::Stop));
        self.tell_removed(st, told);
    }

    /// Runs the removal hooks (and the disconnect hook where marked)
    /// without the lock.
    fn tell_removed(&self, st: MutexGuard<'_, State>, told: Vec<(Removed, bool)>) {
        let (removal, disconnect) = (st.on_removal.clone(), st.on_disconnect.clone());
        drop(st);
        for (r, disconnected) in told {
            if let (Removed::Conn(c), true, Some(h)) = (r, disconnected, &disconnect) {
                h(c);
            }
            if let Some(h) = &removal {
                h(r);
            }
        }
    }

    /// `key` ended by itself: its node leaves the client's tree.
    fn untrack(&self, st: &mut State, key: TrackKey) {
        if let (Some(id), Some(t)) = (st.tracked.remove(&key), &st.tracker) {
            t.untrack(id);
        }
    }

    /// The tracking client is closing: ends the object `key` is. Runs
    /// outside the client's lock, on the closing thread.
    fn close_tracked(&self, key: TrackKey) {
        let mut st = self.lock();
        st.tracked.remove(&key);
        if self.removed.load(Ordering::SeqCst) {
            // Nothing can leave the port: no DREQ, REJ or InformInfo
            // delete; each CM id ends where it stands and is told.
            let mut told = Vec::new();
            match key {
                TrackKey::Conn(conn) => self.end_conn_removed(&mut st, conn, &mut told),
                TrackKey::Listen(s) => self.end_listen_removed(&mut st, s, &mut told),
                TrackKey::Agent(id) => {
                    st.gsi.unregister(id);
                    st.mad_rx.remove(&id);
                    st.mad_waiters.retain(|tid, _| (tid >> 32) as u32 != id.0);
                }
                TrackKey::Sub(..) => {}
                TrackKey::Port => {
                    // Last of the agent's nodes: whatever was made before
                    // the agent was tracked ends too.
                    drop(st);
                    self.end_all_removed();
                    return;
                }
            }
            self.tell_removed(st, told);
            return;
        }
        match key {
            TrackKey::Port => {
                st.stopped = true;
                drop(st);
                // The DREQs and InformInfo deletes just posted leave
                // before the client's teardown reaches QP1: wait (a
                // bounded while) for every send to complete.
                let end = std::time::Instant::now() + StdDuration::from_millis(250);
                loop {
                    self.drain_cq();
                    let idle = {
                        let st = self.lock();
                        st.backlog.is_empty() && st.free_sends.len() == SENDS as usize
                    };
                    if idle || std::time::Instant::now() >= end {
                        break;
                    }
                    std::thread::sleep(StdDuration::from_millis(1));
                }
                let _ = self.events.lock().map(|tx| tx.send(Ev::Stop));
                return;
            }
            TrackKey::Conn(conn) => match st.cm.state(conn) {
                ConnState::ReqSent | ConnState::RepRcvd => {
                    st.cm.abandon(conn);
                    st.meta.remove(&conn);
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Err(CmError::Stopped));
                    }
                }
                ConnState::ReqRcvd => {
                    st.cm.reject(conn, RejReason::CONSUMER_DEFINED, Vec::new());
                }
                _ => {
                    let now = self.now();
                    st.cm.disconnect(now, conn);
                }
            },
            TrackKey::Listen(service_id) => {
                st.listeners.remove(&service_id);
            }
            TrackKey::Agent(id) => {
                st.gsi.unregister(id);
                st.mad_rx.remove(&id);
                // Its callers waiting on a response hear at once.
                st.mad_waiters.retain(|tid, _| (tid >> 32) as u32 != id.0);
            }
            TrackKey::Sub(sa, trap) => {
                let mut mad = crate::sa::inform_info_request(self.local.gid, trap, false);
                st.next_tid += 1;
                mad[8..16].copy_from_slice(&st.next_tid.to_be_bytes());
                st.gsi.send(sa, mad);
            }
        }
        self.flush(&mut st);
        drop(st);
        self.kick();
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, std::time::Instant::now())
    }

    fn pkeys(&self) -> Vec<Pkey> {
        match self.provider.query_port(self.ca, PortNum(1)) {
            Ok(p) if !p.pkeys.is_empty() => p.pkeys,
            _ => vec![Pkey::DEFAULT],
        }
    }

    fn kick(&self) {
        let _ = self.events.lock().map(|tx| tx.send(Ev::Kick));
    }

    fn run(&self, rx: Receiver<Ev>) {
        loop {
            let wait = {
                let st = self.lock();
                let next = match (st.cm.poll_timeout(), st.gsi.poll_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                next.map(|t| t.saturating_since(self.now()).to_std())
            };
            let ev = match wait {
                Some(d) => rx.recv_timeout(d.max(StdDuration::from_millis(1))),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match ev {
                Ok(Ev::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Ev::Cq) => self.drain_cq(),
                Ok(Ev::Kick) => {}
                Ok(Ev::Removed) => self.device_removed(),
                Err(RecvTimeoutError::Timeout) => {}
            }
            let mut st = self.lock();
            let now = self.now();
            if st.cm.poll_timeout().is_some_and(|t| t <= now) {
                st.cm.handle_timeout(now);
            }
            let mut calls = Vec::new();
            if st.gsi.poll_timeout().is_some_and(|t| t <= now) {
                st.gsi.handle_timeout(now);
                calls = self.route_mads(&mut st, now);
            }
            calls.extend(self.take_events(&mut st, None));
            self.call_hooks(st, calls);
        }
    }

    fn call_hooks(&self, st: MutexGuard<'_, State>, calls: Vec<Call>) {
        let (ended, established) = (st.on_disconnect.clone(), st.on_established.clone());
        drop(st);
        for c in calls {
            match (c, &ended, &established) {
                (Call::Ended(c), Some(h), _) | (Call::Established(c), _, Some(h)) => h(c),
                _ => {}
            }
        }
    }

    fn drain_cq(&self) {
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
        let mut armed = false;
        loop {
            let n = match self.provider.poll_cq(self.cq, &mut wcs) {
                Ok(n) => n,
                Err(_) => return,
            };
            for wc in &wcs[..n] {
                self.on_wc(wc);
            }
            if n == 0 {
                if armed || self.provider.req_notify_cq(self.cq, false).is_err() {
                    return;
                }
                armed = true;
            }
        }
    }

    fn on_wc(&self, wc: &WorkCompletion) {
        let mut st = self.lock();
        if wc.wr_id & KIND_SEND != 0 {
            st.free_sends.push((wc.wr_id & !KIND_SEND) as u32);
            self.flush(&mut st);
            return;
        }
        let i = wc.wr_id as u32;
        let (qp, buf, mr, tag) = match &self.smi {
            Some(s) if wc.wr_id & KIND_SMI != 0 => (s.qp, &s.recv_buf, &s.recv_mr, KIND_SMI),
            _ => (self.qp, &self.recv_buf, &self.recv_mr, 0),
        };
        if i >= RECVS {
            return;
        }
        if wc.status == WcStatus::Success && wc.byte_len as usize >= GRH + 24 {
            let off = i as usize * (GRH + MAD);
            let bytes = buf.to_vec(off, GRH + MAD);
            let peer = source_gid(&bytes[..GRH]);
            let _ = self.provider.post_recv(qp, &[recv_wr(buf, mr, i, tag)]);
            // An SMP belongs on QP0, anything else on QP1.
            if is_smp(bytes[GRH + 1]) != (tag == KIND_SMI) {
                st.gsi_misrouted += 1;
                return;
            }
            let lost = st.loss.as_mut().is_some_and(|(rng, p)| rng.chance(*p));
            if !lost {
                let now = self.now();
                let len = (wc.byte_len as usize).min(GRH + MAD) - GRH;
                st.gsi
                    .handle_mad_in(now, peer, wc.pkey_index, &bytes[GRH..GRH + len]);
                let calls = self.route_mads(&mut st, now);
                self.flush(&mut st);
                self.call_hooks(st, calls);
                return;
            }
        } else {
            let _ = self.provider.post_recv(qp, &[recv_wr(buf, mr, i, tag)]);
        }
        self.flush(&mut st);
    }

    /// Sends what the state machines queued.
    /// The entry of this port's P_Key table for partition `pkey`: its full
    /// membership's first, else a limited one matching it.
    fn pkey_index(&self, pkey: Pkey) -> Option<u16> {
        let table = self.pkeys();
        table
            .iter()
            .position(|k| k.0 | 0x8000 == pkey.0 | 0x8000 && k.0 & 0x8000 != 0)
            .or_else(|| table.iter().position(|k| k.matches(pkey)))
            .and_then(|i| u16::try_from(i).ok())
    }

    fn flush(&self, st: &mut State) {
        let local = self.local;
        while let Some((peer, msg)) = st.cm.poll_transmit() {
            st.next_tid += 1;
            let tid = st.next_tid;
            let meta = match &msg {
                CmMsg::Dreq { local_comm_id, .. }
                | CmMsg::Req { local_comm_id, .. }
                | CmMsg::Rep { local_comm_id, .. } => st.meta.get(&ConnId(*local_comm_id)),
                _ => None,
            };
            let peer_qpn = match &msg {
                CmMsg::Dreq { .. } => meta.map_or(Qpn::from_bits(0), |m| m.remote_qpn),
                _ => Qpn::from_bits(0),
            };
            let offer = meta.map_or(
                Offer {
                    params: QpParams::DEFAULT,
                    mtu: local.mtu,
                },
                |m| m.offer,
            );
            let msg = match (msg, st.rtu_fault) {
                (
                    CmMsg::Rtu {
                        local_comm_id,
                        remote_comm_id,
                    },
                    fault,
                ) if fault != RtuFault::None => {
                    if fault == RtuFault::Drop {
                        continue;
                    }
                    st.cm.forget(ConnId(local_comm_id));
                    st.meta.remove(&ConnId(local_comm_id));
                    self.untrack(st, TrackKey::Conn(ConnId(local_comm_id)));
                    CmMsg::Rej {
                        local_comm_id,
                        remote_comm_id,
                        msg: rdma_cm::MsgKind::Rep,
                        reason: RejReason::CONSUMER_DEFINED,
                        private_data: Vec::new(),
                    }
                }
                (msg, _) => msg,
            };
            // The connection's partition: the REQ's P_Key, at the entry of
            // this port's table that holds it.
            let index = st
                .meta
                .get(&ConnId(local_comm_id(&msg)))
                .and_then(|m| self.pkey_index(m.pkey));
            let mad = wire::encode(&msg, tid, &local, peer, peer_qpn, &offer);
            match index {
                Some(i) => st.gsi.send_in(peer, mad, i),
                None => st.gsi.send(peer, mad),
            }
        }
        while let Some((peer, mad)) = st.gsi.poll_transmit() {
            st.backlog.push_back((peer, *mad));
        }
        while let Some(slot) = st.free_sends.last().copied() {
            let Some((peer, mad)) = st.backlog.pop_front() else {
                break;
            };
            let (qp, dest_qpn, qkey) = match (&self.smi, is_smp(mad[1])) {
                (_, false) => (self.qp, Qpn::GSI, Qkey::GSI),
                (Some(s), true) => (s.qp, Qpn::from_bits(0), Qkey(0)),
                // No QP0 on this provider: SMPs cannot leave.
                (None, true) => continue,
            };
            let ah = match st.ahs.get(&peer) {
                Some(a) => *a,
                // The PD is gone (the tree gave it back): no new AH on it.
                None if self.is_released(Part::Pd) => continue,
                None => {
                    let attr = AhAttr::roce(peer);
                    match self.provider.create_ah(self.pd, &attr) {
                        Ok(a) => {
                            st.ahs.insert(peer, a);
                            a
                        }
                        Err(_) => continue,
                    }
                }
            };
            st.free_sends.pop();
            let off = slot as usize * MAD;
            self.send_buf.write_at(off, &mad);
            let mut wr = SendWr::new(
                KIND_SEND | slot as u64,
                SendOpcode::Send,
                vec![Sge {
                    addr: self.send_buf.addr() + off as u64,
                    length: MAD as u32,
                    lkey: self.send_mr.lkey,
                }],
            );
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: dest_qpn,
                remote_qkey: qkey,
            });
            // A response goes in its request's partition.
            wr.pkey_index = st.gsi.pkey_index_for(peer, &mad);
            if self.provider.post_send(qp, &[wr]).is_err() {
                st.free_sends.push(slot);
            }
        }
    }

    /// Hands the dispatcher's deliveries to the CM, agents and blocked
    /// requesters; returns the consumer hooks that must run.
    fn route_mads(&self, st: &mut State, now: Instant) -> Vec<Call> {
        let mut calls = Vec::new();
        while let Some(d) = st.gsi.poll_delivery() {
            match d {
                Delivery::Request { agent, peer, mad } if agent == st.cm_agent => {
                    if let Some((msg, extra)) = wire::decode(&mad[..]) {
                        st.cm.handle_msg(now, peer, msg);
                        // A REQ's Request event comes out of this very input.
                        calls.extend(self.take_events(st, extra));
                    }
                }
                Delivery::Request { agent, peer, mad } => {
                    if let Some(tx) = st.mad_rx.get(&agent) {
                        let _ = tx.send((peer, mad));
                    }
                }
                Delivery::Response { tid, mad, .. } => {
                    if let Some(tx) = st.mad_waiters.remove(&tid) {
                        let _ = tx.send(Some(mad));
                    }
                }
                Delivery::TimedOut { tid, .. } => {
                    if let Some(tx) = st.mad_waiters.remove(&tid) {
                        let _ = tx.send(None);
                    }
                }
            }
        }
        calls
    }

    /// Routes state machine events and sends what they queued; returns the
    /// consumer hooks that must run (without the lock).
    fn take_events(&self, st: &mut State, extra: Option<Extra>) -> Vec<Call> {
        let mut calls: Vec<Call> = Vec::new();
        while let Some(ev) = st.cm.poll_event() {
            let waited = st.waiting.contains_key(&ev.conn());
            calls.extend(hook_for(&ev, waited));
            match ev {
                CmEvent::Request { conn, peer, req } => {
                    let Some(agent) = self.me.upgrade() else {
                        continue;
                    };
                    // A REQ in a partition the port is not in: refused as
                    // Linux ib_cm does when the REQ's P_Key is not in the
                    // port's table (primary path refused, IBA reason 12).
                    if !self.pkeys().iter().any(|k| k.matches(req.pkey)) {
                        st.pkey_refusals += 1;
                        st.cm.reject(conn, RejReason::INVALID_GID, Vec::new());
                        continue;
                    }
                    let mtu = extra.and_then(|x| x.mtu).unwrap_or(self.local.mtu);
                    let params = extra.map_or(QpParams::DEFAULT, |x| x.params);
                    st.meta.insert(
                        conn,
                        Meta {
                            remote_qpn: req.qpn,
                            local_qpn: Qpn::from_bits(0),
                            pkey: req.pkey,
                            offer: Offer {
                                params: QpParams::DEFAULT,
                                mtu,
                            },
                            peer_params: Some(params),
                        },
                    );
                    let incoming = Incoming {
                        conn,
                        peer,
                        remote_qpn: req.qpn,
                        remote_psn: req.psn,
                        mtu,
                        pkey: req.pkey,
                        service_id: req.service_id,
                        timing: req.timing,
                        params,
                        private_data: req.private_data,
                        agent,
                    };
                    let delivered = st.listeners.contains_key(&req.service_id)
                        && self.track(st, TrackKey::Conn(conn)).is_ok()
                        && st
                            .listeners
                            .get(&req.service_id)
                            .is_some_and(|tx| tx.send(incoming).is_ok());
                    if !delivered {
                        self.untrack(st, TrackKey::Conn(conn));
                        st.cm
                            .reject(conn, RejReason::INVALID_SERVICE_ID, Vec::new());
                    }
                }
                CmEvent::Established {
                    conn,
                    remote_qpn,
                    remote_psn,
                    private_data,
                } => {
                    if let Some(m) = st.meta.get_mut(&conn) {
                        m.remote_qpn = remote_qpn;
                    }
                    // Passive (nobody waits): the RTU of a connection a
                    // listener accepted, for the established hook.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Ok(Established {
                            conn,
                            remote_qpn,
                            remote_psn,
                            private_data,
                        }));
                    }
                }
                // A REP held for a consumer readying its QP: the one
                // waiting in `connect_qp` does it; nobody waits any more
                // (it gave up), the REP is refused.
                CmEvent::Reply {
                    conn,
                    remote_qpn,
                    remote_psn,
                    private_data,
                } => {
                    if let Some(m) = st.meta.get_mut(&conn) {
                        m.remote_qpn = remote_qpn;
                        m.peer_params = extra.map(|x| x.params);
                    }
                    let est = Established {
                        conn,
                        remote_qpn,
                        remote_psn,
                        private_data,
                    };
                    let taken = st
                        .waiting
                        .remove(&conn)
                        .is_some_and(|tx| tx.send(Ok(est)).is_ok());
                    if !taken {
                        st.cm.reject_reply(conn, RejReason::TIMEOUT, Vec::new());
                        st.meta.remove(&conn);
                        self.untrack(st, TrackKey::Conn(conn));
                    }
                }
                CmEvent::Rejected {
                    conn,
                    reason,
                    private_data,
                } => {
                    let meta = st.meta.remove(&conn);
                    self.untrack(st, TrackKey::Conn(conn));
                    // Passive (nobody waits): the requester refused our
                    // REP (Linux ib_srp does when it does not like the
                    // login response). The consumer accepted the
                    // connection and holds what it made for it: its
                    // disconnect hook releases that now, not never.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let mut words = rdma_mad::cm::RejReason::from(reason.0).to_string();
                        if let (RejReason::INVALID_GID, Some(m)) = (reason, meta) {
                            words += &format!(
                                " (the REQ was in partition P_Key {:04x}: the peer's port may not be a member)",
                                m.pkey.0
                            );
                        }
                        let _ = tx.send(Err(CmError::Rejected {
                            reason: words,
                            code: reason.0,
                            private_data,
                        }));
                    }
                }
                CmEvent::TimedOut { conn } => {
                    self.untrack(st, TrackKey::Conn(conn));
                    // Nobody waits: the disconnect hook.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Err(CmError::TimedOut));
                    }
                }
                CmEvent::DisconnectRequested { .. } | CmEvent::Disconnected { .. } => {}
                CmEvent::TimewaitExit { conn } => {
                    st.meta.remove(&conn);
                    self.untrack(st, TrackKey::Conn(conn));
                }
            }
        }
        self.flush(st);
        calls
    }
}

/// The comm ID a CM message names as its sender's: ours, for what we send.
fn local_comm_id(msg: &CmMsg) -> u32 {
    match msg {
        CmMsg::Req { local_comm_id, .. }
        | CmMsg::Mra { local_comm_id, .. }
        | CmMsg::Rej { local_comm_id, .. }
        | CmMsg::Rep { local_comm_id, .. }
        | CmMsg::Rtu { local_comm_id, .. }
        | CmMsg::Dreq { local_comm_id, .. }
        | CmMsg::Drep { local_comm_id, .. } => *local_comm_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic::loopback::{CaConfig, Fabric};

    const T: StdDuration = StdDuration::from_secs(10);

    /// The routing rule: a connection nobody waits on is established by
    /// its RTU and ended by a REJ of its REP, the CM giving up or a DREQ;
    /// a waiting caller hears of the first three itself.
    #[test]
    fn hooks_run_for_connections_nobody_waits_on() {
        let c = ConnId(7);
        let est = CmEvent::<u8>::Established {
            conn: c,
            remote_qpn: Qpn::from_bits(1),
            remote_psn: Psn::new(1),
            private_data: Vec::new(),
        };
        let rej = CmEvent::<u8>::Rejected {
            conn: c,
            reason: RejReason::CONSUMER_DEFINED,
            private_data: Vec::new(),
        };
        let timed_out = CmEvent::<u8>::TimedOut { conn: c };
        let dreq = CmEvent::<u8>::DisconnectRequested { conn: c };
        assert_eq!(hook_for(&est, false), Some(Call::Established(c)));
        assert_eq!(hook_for(&rej, false), Some(Call::Ended(c)));
        assert_eq!(hook_for(&timed_out, false), Some(Call::Ended(c)));
        for waited in [false, true] {
            assert_eq!(hook_for(&dreq, waited), Some(Call::Ended(c)));
            let quiet = [
                CmEvent::<u8>::Disconnected { conn: c },
                CmEvent::<u8>::TimewaitExit { conn: c },
            ];
            assert!(quiet.iter().all(|e| hook_for(e, waited).is_none()));
        }
        for e in [est, rej, timed_out] {
            assert_eq!(hook_for(&e, true), None, "{e:?}");
        }
    }

    /// Two ports on the loopback fabric with their own P_Key tables:
    /// every REQ carries the requester's partition, the passive agent
    /// hands it to the consumer, and refuses the REQs its table cannot
    /// match (IBA 10.9.3: a limited member only talks to a full one).
    /// A REP never offers more READs than the REQ's responder resources
    /// take (IBA 12.7.29): a requester taking 4 hears an initiator depth
    /// of 4 from a passive side that would offer 16, and taking 0 hears 0.
    #[test]
    fn the_rep_offers_no_more_reads_than_the_req_takes() {
        let f = Fabric::new();
        f.add_ca(CaConfig::simple(0xa, 1)).unwrap();
        f.add_ca(CaConfig::simple(0xb, 2)).unwrap();
        let a = CmAgent::start(f.clone(), Guid(0xa), 0x100).unwrap();
        let b = CmAgent::start(f, Guid(0xb), 0x200).unwrap();
        let requests = b.listen(0x78);
        let server = std::thread::spawn(move || {
            let mut offered = Vec::new();
            while let Ok(inc) = requests.recv_timeout(T) {
                offered.push(inc.negotiate(QpParams::DEFAULT));
                assert!(inc.accept(Qpn::from_bits(0x99), Psn::new(1), Vec::new()));
                if offered.len() == 2 {
                    break;
                }
            }
            offered
        });
        let mut heard = Vec::new();
        for (n, takes) in [4u8, 0].into_iter().enumerate() {
            let offer = Offer {
                params: QpParams {
                    responder_resources: takes,
                    initiator_depth: 2,
                    ..QpParams::DEFAULT
                },
                mtu: a.mtu(),
            };
            let qpn = Qpn::from_bits(0x50 + n as u32);
            let (conn, rx) = a
                .send_req(
                    &a.path_to(b.gid()),
                    0x78,
                    qpn,
                    Psn::new(1),
                    Vec::new(),
                    offer,
                    true,
                )
                .unwrap();
            a.wait_answer(conn, rx, T).expect("REP");
            let st = a.inner.lock();
            let theirs = st
                .meta
                .get(&conn)
                .and_then(|m| m.peer_params)
                .expect("the REP's offer");
            heard.push((theirs.initiator_depth, theirs.responder_resources));
        }
        // The REP's initiator depth follows the REQ's responder resources;
        // its responder resources follow the REQ's initiator depth (2).
        assert_eq!(heard, vec![(4, 2), (0, 2)]);
        let offered = server.join().unwrap();
        assert_eq!(
            offered
                .iter()
                .map(|o| o.initiator_depth)
                .collect::<Vec<_>>(),
            vec![4, 0]
        );
    }

    #[test]
    fn the_req_partition_reaches_the_listener_or_is_refused() {
        let f = Fabric::new();
        f.add_ca(CaConfig::simple(0xa, 1)).unwrap();
        f.add_ca(CaConfig::simple(0xb, 2)).unwrap();
        let (full, limited) = (|k: u16| Pkey(0x8000 | k), Pkey);
        f.set_pkeys(
            Guid(0xa),
            PortNum(1),
            vec![Pkey::DEFAULT, full(0x10), limited(0x20), limited(0x10)],
        )
        .unwrap();
        f.set_pkeys(
            Guid(0xb),
            PortNum(1),
            vec![Pkey::DEFAULT, limited(0x10), full(0x20)],
        )
        .unwrap();
        let cfg = CmConfig {
            response_timeout: TimeoutExp::from_bits(15),
            max_retries: rdma_types::CmRetries::from_bits(3),
            timewait: rdma_types::Duration::from_millis(100),
            packet_life_time: TimeoutExp::from_bits(10),
            ..CmConfig::default()
        };
        let a = CmAgent::start_with(f.clone(), Guid(0xa), 0x100, cfg).unwrap();
        let b = CmAgent::start_with(f, Guid(0xb), 0x200, cfg).unwrap();
        assert_eq!(b.pkeys(), vec![Pkey::DEFAULT, limited(0x10), full(0x20)]);
        let requests = b.listen(0x77);
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Ok(inc) = requests.recv_timeout(T) {
                seen.push(inc.pkey);
                assert!(inc.accept(Qpn::from_bits(0x99), Psn::new(1), Vec::new()));
                if seen.len() == 3 {
                    break;
                }
            }
            (seen, requests)
        });
        let next_qpn = std::cell::Cell::new(0x40);
        let connect = |pkey: Option<Pkey>| {
            // A QP per connection: the same one again would be stale.
            next_qpn.set(next_qpn.get() + 1);
            let (q, p, v) = (Qpn::from_bits(next_qpn.get()), Psn::new(1), b"hi".to_vec());
            match pkey {
                Some(k) => a.connect_in_partition(b.gid(), k, 0x77, q, p, v, T),
                None => a.connect(b.gid(), 0x77, q, p, v, T),
            }
        };
        // B is a limited member of 0x0010 and a full one of 0x0020.
        connect(Some(full(0x10))).expect("full requester, limited responder");
        connect(Some(limited(0x20))).expect("limited requester, full responder");
        // No choice: index 0 of A's table, the default partition.
        connect(None).expect("the default partition");
        for (k, words) in [(limited(0x10), "P_Key 0010"), (full(0x30), "P_Key 8030")] {
            match connect(Some(k)) {
                Err(CmError::Rejected { code, reason, .. }) => {
                    assert_eq!(code, RejReason::INVALID_GID.0, "{reason}");
                    assert!(reason.contains(words), "{reason}");
                }
                other => panic!("REQ in {k} not refused: {other:?}"),
            }
        }
        let (seen, requests) = server.join().unwrap();
        assert_eq!(seen, vec![full(0x10), limited(0x20), Pkey::DEFAULT]);
        assert!(requests.try_recv().is_err(), "a refused REQ was delivered");
        assert_eq!(b.pkey_refusals(), 2);
        assert_eq!(a.pkey_refusals(), 0);
    }
}
