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

mod connect;
mod connection;
mod mad;
mod tracking;

pub use connection::*;
pub use mad::*;
use tracking::*;

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
    /// The kernel's CM (on an rdma-core device)
    /// refused a step; in words.
    #[error("{0}")]
    Library(String),
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
    /// What each MAD agent serves (class, version, methods), as told to
    /// the provider ([`Provider::gsi_register`]).
    gsi_regs: HashMap<AgentId, (u8, u8, Vec<u8>)>,
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
    /// The port whose QP1 (and QP0) the agent serves, and its connections
    /// use.
    port: PortNum,
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
        CmAgent::start_on(provider, guid, PortNum(1), first_comm_id, cm)
    }

    /// As [`CmAgent::start_with`], on port `port` of the CA: its QP1 (and
    /// QP0), its GID and P_Keys, and the port of the QPs it connects.
    pub fn start_on(
        provider: Arc<dyn Provider>,
        guid: Guid,
        port_num: PortNum,
        first_comm_id: u32,
        cm: CmConfig,
    ) -> Result<Arc<CmAgent>, CmError> {
        CmAgent::start_port(provider, guid, port_num, first_comm_id, cm, true)
    }

    /// As [`CmAgent::start`], QP1 only: on a port whose SMPs another
    /// serves (the NIC daemon's SMA), where asking for QP0 would take it
    /// from that SMA.
    pub fn start_without_qp0(
        provider: Arc<dyn Provider>,
        guid: Guid,
        first_comm_id: u32,
    ) -> Result<Arc<CmAgent>, CmError> {
        CmAgent::start_port(
            provider,
            guid,
            PortNum(1),
            first_comm_id,
            CmConfig::default(),
            false,
        )
    }

    fn start_port(
        provider: Arc<dyn Provider>,
        guid: Guid,
        port_num: PortNum,
        first_comm_id: u32,
        cm: CmConfig,
        qp0: bool,
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
            .query_port(ca, port_num)
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
        let qp =
            special_qp(p, pd, cq, QpType::Gsi, Qkey::GSI, port_num).map_err(verbs_err("GSI QP"))?;
        let (recv_buf, recv_mr) =
            recv_ring(p, pd).map_err(verbs_err("register MAD receive buffers"))?;
        // QP0 where the provider has one (soft RoCE has none: RoCE carries
        // no SMPs).
        let smi = if qp0 {
            special_qp(p, pd, cq, QpType::Smi, Qkey(0), port_num)
        } else {
            Err(verbs::VerbsError::NotSupported("QP0 not asked for"))
        };
        let smi = match smi {
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
        // Where QP1 is shared (the NIC daemon's client), the CM class is
        // this process's too; its REQs come by the listens it declares.
        let cm_class = (
            u8::from(rdma_mad::mad::MgmtClass::Cm),
            rdma_mad::cm::CM_CLASS_VERSION,
        );
        let send = [u8::from(rdma_mad::mad::Method::Send)];
        p.gsi_register(qp, cm_class.0, cm_class.1, &send, true)
            .map_err(|e| CmError::Mad(format!("the CM class on a shared QP1: {e}")))?;
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
            port: port_num,
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
                gsi_regs: HashMap::new(),
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
        match self
            .inner
            .provider
            .query_port(self.inner.ca, self.inner.port)
        {
            Ok(p) if !p.gids.is_empty() => p.gids,
            _ => vec![self.gid()],
        }
    }

    /// The port's active MTU.
    pub fn mtu(&self) -> Mtu {
        self.inner.local.mtu
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

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, std::time::Instant::now())
    }

    fn pkeys(&self) -> Vec<Pkey> {
        match self.provider.query_port(self.ca, self.port) {
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
