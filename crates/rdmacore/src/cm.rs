//! RDMA CM on an rdma-core device: the kernel's connection manager
//! through its user-space interface (`/dev/infiniband/rdma_cm`, see
//! `sys::ucma` for why not librdmacm), as the access layer's [`Service`].
//!
//! On such a device the kernel owns QP1, so the CM cannot be ours: a
//! listen binds an `rdma_cm_id` to each of the CA's addresses, and a
//! connect resolves the address and the route and sends the REQ through
//! the kernel. The consumer's QP lives on the provider's own context; the
//! kernel's CM only learns its number (`qp_num` of the conn param) and
//! announces its own starting PSN, which reaches the consumer as
//! [`IpRequest::local_psn`] / [`Established::local_psn`] (read with
//! the CM's INIT_QP_ATTR, as librdmacm does for a QP of its own). The RTU
//! goes out as soon as the REP is in, before the consumer's QP is in RTS,
//! as this crate's CM agent does: the passive side sends nothing before
//! the first request reaches it.
//!
//! One thread per service sleeps on the event channel and turns each
//! event into a request for a listener, a step of a waiting connect, or
//! a hook call (established, ended), always with no lock held. Every id
//! whose connection ended is disconnected (the DREP of a DREQ) and
//! destroyed; device removal ends every connection and listen of the CA.

use crate::sys::ucma::{event, Channel, Event, Id, RDMA_CM_DEVICE};
use crate::sys::{self, loader::Verbs, Errno};
use rdma_access::rdmacm::{Answer, ConnHook, IpRequest, Listened, ResolveError, Service};
use rdma_access::{CmError, ConnId, Established};
use rdma_types::{Gid, Guid, Pkey, Psn, Qpn};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// QP states `rdma_init_qp_attr` is asked about.
use crate::sys::raw::qp_state::{RTR, RTS};

/// READs each way a connection offers at most (this crate's CM agent
/// offers the same).
const READS: u8 = 16;

/// Why the service could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmStartError {
    /// The kernel's RDMA CM cannot be reached.
    #[error(
        "cannot open {RDMA_CM_DEVICE} ({0}): load the kernel's RDMA CM for user space \
         (modprobe rdma_ucm)"
    )]
    NoCmDevice(String),
    /// The event channel or its thread could not be made.
    #[error("cannot open the RDMA CM event channel: {0}")]
    Channel(String),
    /// The CA has no IP address to listen on.
    #[error(
        "RDMA device {device} has no IP address in its GID table: give its network \
         interface an address (ip addr add ... dev <netdev>)"
    )]
    NoAddress {
        /// The device.
        device: String,
    },
}

/// What an id is to the service.
enum Role {
    /// A listen on one of the CA's addresses, made with this `uid`.
    Listener(Sender<Listened>, u64),
    /// A request this side received, answered or not.
    Passive { conn: ConnId },
    /// A connection this side asked for; `waiter` takes its events until
    /// the REP is in.
    Active {
        conn: ConnId,
        waiter: Option<Sender<Event>>,
    },
}

struct Entry {
    id: Arc<Id>,
    role: Role,
}

#[derive(Default)]
struct St {
    ids: HashMap<u32, Entry>,
    /// The `uid` the next id is made with (a listen's requests carry it).
    next_uid: u64,
    next_conn: u32,
    on_disconnect: Option<ConnHook>,
    on_established: Option<ConnHook>,
    stopped: bool,
}

struct Inner {
    ch: Arc<Channel>,
    /// The provider, told when the kernel removes the device.
    core: std::sync::Weak<crate::RdmaCore>,
    /// The removal was passed on to the provider.
    removal_told: std::sync::atomic::AtomicBool,
    ca: Guid,
    device: String,
    addrs: Vec<IpAddr>,
    st: Mutex<St>,
    /// Signalled whenever an id leaves the table.
    gone: Condvar,
    waker: sys::Waker,
}

/// RDMA CM through the kernel for one rdma-core CA (see the module docs).
pub struct RdmaCm {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_conn(st: &mut St) -> ConnId {
        st.next_conn = st.next_conn.wrapping_add(1);
        ConnId(st.next_conn)
    }

    /// A `uid` no id of this service has had.
    fn new_uid(&self) -> u64 {
        let mut st = self.lock();
        st.next_uid += 1;
        st.next_uid
    }

    /// Removes id `key`; the entry is dropped by the caller, outside the
    /// lock (destroying an id may wait for the kernel).
    fn remove(&self, key: u32) -> Option<Entry> {
        let e = self.lock().ids.remove(&key);
        self.gone.notify_all();
        e
    }

    fn key_of(&self, conn: ConnId) -> Option<u32> {
        self.lock().ids.iter().find_map(|(k, e)| match e.role {
            Role::Passive { conn: c } | Role::Active { conn: c, .. } if c == conn => Some(*k),
            _ => None,
        })
    }

    fn dispatch(self: &Arc<Self>, ev: Event) {
        if ev.kind == event::CONNECT_REQUEST {
            return self.request(ev);
        }
        if ev.kind == event::DEVICE_REMOVAL {
            self.tell_removal();
        }
        let mut st = self.lock();
        let Some(entry) = st.ids.get_mut(&ev.id) else {
            // An id already given up (a connect that timed out, a
            // rejected request): nothing waits for it.
            return;
        };
        if let Role::Active {
            waiter: Some(tx), ..
        } = &entry.role
        {
            // A connect in progress takes its own events.
            let _ = tx.send(ev);
            return;
        }
        match (ev.kind, &entry.role) {
            (event::ESTABLISHED, Role::Passive { conn }) => {
                let (conn, hook) = (*conn, st.on_established.clone());
                drop(st);
                if let Some(h) = hook {
                    h(conn);
                }
            }
            (
                event::DISCONNECTED
                | event::CONNECT_ERROR
                | event::UNREACHABLE
                | event::REJECTED
                | event::DEVICE_REMOVAL,
                Role::Passive { conn } | Role::Active { conn, .. },
            ) => {
                let (conn, hook) = (*conn, st.on_disconnect.clone());
                let entry = st.ids.remove(&ev.id);
                drop(st);
                self.gone.notify_all();
                if let Some(e) = &entry {
                    // The DREP of the peer's DREQ (harmless otherwise).
                    let _ = e.id.disconnect();
                }
                drop(entry);
                if let Some(h) = hook {
                    h(conn);
                }
            }
            (event::DEVICE_REMOVAL, Role::Listener(..)) => {
                let entry = st.ids.remove(&ev.id);
                drop(st);
                self.gone.notify_all();
                drop(entry);
            }
            _ => {}
        }
    }

    /// The first DEVICE_REMOVAL of any id: the provider's opens of the
    /// device hear `CaRemoval`, so their consumers let it go (the kernel
    /// waits for that), while this service ends the ids themselves.
    fn tell_removal(&self) {
        use std::sync::atomic::Ordering;
        if self.removal_told.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(device = %self.device, "the kernel is removing the device: its connections and listens end");
        if let Some(core) = self.core.upgrade() {
            core.device_removed(self.ca);
        }
    }

    /// A CONNECT_REQUEST: the new id becomes a request for the listener.
    fn request(self: &Arc<Self>, mut ev: Event) {
        let Some(id) = ev.request.take() else {
            return;
        };
        let id = Arc::new(id);
        let listener = self.lock().ids.values().find_map(|e| match &e.role {
            Role::Listener(tx, uid) if *uid == ev.uid => Some(tx.clone()),
            _ => None,
        });
        let listener = match listener {
            Some(tx) => tx,
            None => {
                let _ = id.reject(&[]);
                return;
            }
        };
        // The RTR attributes give the requester's QP, the path MTU and GID
        // and this side's receive PSN; the RTS attributes the requester's
        // receive PSN (this side's send PSN) and the ACK timeout.
        let (rtr, rts) = match id.qp_attr(RTR).and_then(|r| Ok((r, id.qp_attr(RTS)?))) {
            Ok(a) => a,
            Err(why) => {
                tracing::warn!(device = %self.device, "refused a connect request: {why}");
                let _ = id.reject(&[]);
                return;
            }
        };
        let conn = {
            let mut st = self.lock();
            let conn = Inner::new_conn(&mut st);
            st.ids.insert(
                id.key(),
                Entry {
                    id: id.clone(),
                    role: Role::Passive { conn },
                },
            );
            conn
        };
        let local_psn = Psn::new(rtr.rq_psn);
        let initiator_depth = ev.initiator_depth.min(READS);
        let peer = Gid(rtr.ah_attr.grh.dgid.raw);
        let req = IpRequest {
            conn,
            src: id
                .peer_addr()
                .unwrap_or_else(|| SocketAddr::new(peer.to_ip(), 0)),
            private_data: std::mem::take(&mut ev.private_data),
            peer,
            remote_qpn: Qpn::from_bits(rtr.dest_qp_num),
            remote_psn: Psn::new(rts.sq_psn),
            mtu: crate::convert::mtu(i32::try_from(rtr.path_mtu).unwrap_or(0)),
            // RoCE has one partition.
            pkey: Pkey::DEFAULT,
            initiator_depth,
            ack_timeout: rts.timeout,
            local_psn: Some(local_psn),
            answer: Box::new(PassiveAnswer {
                inner: self.clone(),
                id: Some(id.clone()),
                responder_resources: ev.responder_resources.min(READS),
                initiator_depth,
                psn: Some(local_psn),
            }),
        };
        if let Err(back) = listener.send(Ok(req)) {
            // The listener is gone: the answer's drop refuses it.
            drop(back);
        }
    }
}

/// The answer to one request: a REP or a REJ through its id; dropped
/// unanswered, a REJ.
struct PassiveAnswer {
    inner: Arc<Inner>,
    id: Option<Arc<Id>>,
    responder_resources: u8,
    initiator_depth: u8,
    psn: Option<Psn>,
}

impl PassiveAnswer {
    fn refuse(&mut self, private_data: &[u8]) {
        if let Some(id) = self.id.take() {
            let _ = id.reject(private_data);
            let entry = self.inner.remove(id.key());
            drop(entry);
        }
    }
}

impl Answer for PassiveAnswer {
    fn accept(mut self: Box<Self>, qpn: Qpn, psn: Psn, private_data: Vec<u8>) -> bool {
        let Some(id) = self.id.take() else {
            return false;
        };
        if self.psn.is_some_and(|p| p != psn) {
            tracing::warn!(
                "accepting with PSN {psn:?}, not the {:?} the kernel's REP announces",
                self.psn
            );
        }
        match id.accept(
            self.inner.new_uid(),
            &private_data,
            qpn.value(),
            self.responder_resources,
            self.initiator_depth,
        ) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(device = %self.inner.device, "rdma_accept failed: {e}");
                let _ = id.reject(&[]);
                drop(self.inner.remove(id.key()));
                false
            }
        }
    }

    fn reject(mut self: Box<Self>, private_data: Vec<u8>) {
        self.refuse(&private_data);
    }
}

impl Drop for PassiveAnswer {
    fn drop(&mut self) {
        self.refuse(&[]);
    }
}

/// The CA's addresses: the IP address of each valid GID of port 1 that
/// has one (IPv4-mapped, or a global IPv6 address), in table order.
fn addresses(verbs: &Arc<Verbs>, guid: Guid) -> Result<(String, Vec<IpAddr>), String> {
    let dev = sys::Device::open(verbs, guid.0)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no RDMA device with GUID {:016x}", guid.0))?;
    let len = dev
        .query_port(1)
        .map(|a| usize::try_from(a.gid_tbl_len).unwrap_or(0))
        .map_err(|e| e.to_string())?;
    let mut ips = Vec::new();
    for e in dev.gid_table(1, len) {
        let g = Gid(e.gid.raw);
        if g.0 == [0; 16] || g.0[..2] == [0xfe, 0x80] {
            continue;
        }
        let ip = g.to_ip();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok((dev.name().to_string(), ips))
}

impl RdmaCm {
    /// RDMA CM for CA `ca` of `core` (its node GUID), listening and
    /// connecting on its addresses.
    ///
    /// # Errors
    /// The kernel's RDMA CM is not there (`rdma_ucm` not loaded), the CA
    /// has no address, or the event thread cannot start.
    pub fn start(core: &Arc<crate::RdmaCore>, ca: Guid) -> Result<RdmaCm, CmStartError> {
        let (device, addrs) = addresses(&core.verbs(), ca).map_err(CmStartError::Channel)?;
        if addrs.is_empty() {
            return Err(CmStartError::NoAddress { device });
        }
        let ch = Channel::open().map_err(|e| CmStartError::NoCmDevice(e.to_string()))?;
        let waker = sys::Waker::new().map_err(|e| CmStartError::Channel(e.to_string()))?;
        let inner = Arc::new(Inner {
            ch,
            core: Arc::downgrade(core),
            removal_told: std::sync::atomic::AtomicBool::new(false),
            ca,
            device,
            addrs,
            st: Mutex::default(),
            gone: Condvar::new(),
            waker,
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rdmacm {}", inner.device))
            .spawn(move || events(&run))
            .map_err(|e| CmStartError::Channel(e.to_string()))?;
        Ok(RdmaCm {
            inner,
            thread: Some(thread),
        })
    }

    /// The device's name (`rxe0`).
    pub fn device(&self) -> &str {
        &self.inner.device
    }

    /// The addresses it listens on and connects from.
    pub fn addresses(&self) -> &[IpAddr] {
        &self.inner.addrs
    }

    /// Whether the kernel removed the device (its ids ended then).
    pub fn is_removed(&self) -> bool {
        self.inner
            .removal_told
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Connections and listens it holds now (0 once everything ended).
    pub fn live_ids(&self) -> usize {
        self.inner.lock().ids.len()
    }
}

/// The event thread: sleeps on the channel until the service stops.
fn events(inner: &Arc<Inner>) {
    let fds = [inner.ch.fd(), inner.waker.fd()];
    loop {
        if inner.lock().stopped {
            return;
        }
        match sys::poll_readable(&fds, -1) {
            Ok(r) if r[0] == sys::Ready::Broken => {
                tracing::warn!(device = %inner.device, "the RDMA CM event channel broke");
                return;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(device = %inner.device, "poll on the RDMA CM channel: {e}");
                return;
            }
        }
        inner.waker.drain();
        while let Some(ev) = inner.ch.next_event() {
            inner.dispatch(ev);
        }
    }
}

impl RdmaCm {
    /// Ends every connection (a DREQ each) and listen, and stops the
    /// event thread; the disconnect hook is not called for them. What is
    /// asked of the service afterwards fails or does nothing.
    pub fn close(&self) {
        self.inner.lock().stopped = true;
        self.inner.waker.wake();
        let ids: Vec<Entry> = self.inner.lock().ids.drain().map(|(_, e)| e).collect();
        for e in &ids {
            if !matches!(e.role, Role::Listener(..)) {
                let _ = e.id.disconnect();
            }
        }
        drop(ids);
        self.inner.gone.notify_all();
    }
}

impl Drop for RdmaCm {
    fn drop(&mut self) {
        self.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lib_err(what: &str, e: Errno) -> CmError {
    CmError::Library(format!("{what}: {e}"))
}

/// Waits for the next event of a connect until `deadline`.
fn next(rx: &Receiver<Event>, deadline: Instant) -> Result<Event, CmError> {
    let left = deadline.saturating_duration_since(Instant::now());
    rx.recv_timeout(left).map_err(|_| CmError::TimedOut)
}

/// A negative errno of an event's status, in words.
fn status_words(status: i32) -> String {
    std::io::Error::from_raw_os_error(status.abs()).to_string()
}

impl Service for RdmaCm {
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError> {
        if self.inner.lock().stopped {
            return Err(CmError::Stopped);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut made = Vec::new();
        for ip in &self.inner.addrs {
            let at = SocketAddr::new(*ip, port);
            let uid = self.inner.new_uid();
            let id = self
                .inner
                .ch
                .create_id(uid)
                .map_err(|e| lib_err("create an RDMA CM id", e))?;
            id.bind_listen(at, 128).map_err(|e| {
                let hint = if e.0 == libc::EADDRINUSE {
                    " (another process listens there: stop it or choose another port)"
                } else {
                    ""
                };
                CmError::Library(format!("cannot listen on {at} (RDMA CM): {e}{hint}"))
            })?;
            made.push((id, uid));
        }
        let mut st = self.inner.lock();
        for (id, uid) in made {
            st.ids.insert(
                id.key(),
                Entry {
                    id: Arc::new(id),
                    role: Role::Listener(tx.clone(), uid),
                },
            );
        }
        Ok(rx)
    }

    fn connect(
        &self,
        src: IpAddr,
        dst: SocketAddr,
        qpn: Qpn,
        _psn: Psn,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Established, CmError> {
        // Closed: no event thread answers the steps any more.
        if self.inner.lock().stopped {
            return Err(CmError::Stopped);
        }
        let deadline = Instant::now() + timeout;
        let ms = u32::try_from(timeout.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        let id = Arc::new(
            self.inner
                .ch
                .create_id(self.inner.new_uid())
                .map_err(|e| lib_err("create an RDMA CM id", e))?,
        );
        let key = id.key();
        let (tx, rx) = std::sync::mpsc::channel();
        let conn = {
            let mut st = self.inner.lock();
            let conn = Inner::new_conn(&mut st);
            st.ids.insert(
                key,
                Entry {
                    id: id.clone(),
                    role: Role::Active {
                        conn,
                        waiter: Some(tx),
                    },
                },
            );
            conn
        };
        let r = self.connect_steps(&id, src, dst, qpn, private_data, ms, &rx, deadline);
        match r {
            Ok(mut est) => {
                est.conn = conn;
                if let Some(Entry {
                    role: Role::Active { waiter, .. },
                    ..
                }) = self.inner.lock().ids.get_mut(&key)
                {
                    *waiter = None;
                }
                // Events that came between the REP and now (a DREQ)
                // were the connect's: pass them on as the thread would.
                while let Ok(ev) = rx.try_recv() {
                    self.inner.dispatch(ev);
                }
                Ok(est)
            }
            Err(e) => {
                drop(self.inner.remove(key));
                Err(e)
            }
        }
    }

    fn disconnect(&self, conn: ConnId) {
        let Some(key) = self.inner.key_of(conn) else {
            return;
        };
        let id = self.inner.lock().ids.get(&key).map(|e| e.id.clone());
        if let Some(id) = id {
            // A REP still waiting for its RTU cannot be disconnected: the
            // connection is refused instead.
            if id.disconnect().is_err() {
                let _ = id.reject(&[]);
                drop(self.inner.remove(key));
            }
        }
    }

    fn disconnect_wait(&self, conn: ConnId, within: Duration) -> bool {
        self.disconnect(conn);
        let Some(key) = self.inner.key_of(conn) else {
            return true;
        };
        let end = Instant::now() + within;
        let mut st = self.inner.lock();
        while st.ids.contains_key(&key) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .inner
                .gone
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn on_disconnect(&self, hook: ConnHook) {
        self.inner.lock().on_disconnect = Some(hook);
    }

    fn on_established(&self, hook: ConnHook) {
        self.inner.lock().on_established = Some(hook);
    }
}

impl RdmaCm {
    /// Address, route, REQ and REP of one connect, then the RTU.
    #[allow(clippy::too_many_arguments)]
    fn connect_steps(
        &self,
        id: &Id,
        src: IpAddr,
        dst: SocketAddr,
        qpn: Qpn,
        private_data: &[u8],
        ms: u32,
        rx: &Receiver<Event>,
        deadline: Instant,
    ) -> Result<Established, CmError> {
        let unreachable = |why: String| {
            CmError::Resolve(ResolveError::Unreachable {
                src,
                dst: dst.ip(),
                why,
            })
        };
        id.resolve_addr(SocketAddr::new(src, 0), dst, ms)
            .map_err(|e| unreachable(format!("rdma_resolve_addr: {e}")))?;
        let ev = next(rx, deadline)?;
        match ev.kind {
            event::ADDR_RESOLVED => {}
            event::ADDR_ERROR => return Err(unreachable(status_words(ev.status))),
            _ => {
                return Err(CmError::Library(format!(
                    "address resolution: event {}",
                    ev.kind
                )))
            }
        }
        if id.device_guid() != Some(self.inner.ca.0) {
            return Err(CmError::Resolve(ResolveError::NoDevice(src)));
        }
        id.resolve_route(ms)
            .map_err(|e| unreachable(format!("rdma_resolve_route: {e}")))?;
        let ev = next(rx, deadline)?;
        match ev.kind {
            event::ROUTE_RESOLVED => {}
            event::ROUTE_ERROR => return Err(unreachable(status_words(ev.status))),
            _ => {
                return Err(CmError::Library(format!(
                    "route resolution: event {}",
                    ev.kind
                )))
            }
        }
        id.connect(private_data, qpn.value(), READS, READS)
            .map_err(|e| lib_err("rdma_connect", e))?;
        let ev = next(rx, deadline)?;
        match ev.kind {
            event::CONNECT_RESPONSE => {}
            event::REJECTED => {
                let code = u16::try_from(ev.status.unsigned_abs()).unwrap_or(u16::MAX);
                return Err(CmError::Rejected {
                    reason: rdma_mad::cm::RejReason::from(code).to_string(),
                    code,
                    private_data: ev.private_data,
                });
            }
            event::UNREACHABLE | event::CONNECT_ERROR if ev.status.abs() == libc::ETIMEDOUT => {
                return Err(CmError::TimedOut)
            }
            event::UNREACHABLE | event::CONNECT_ERROR => {
                return Err(CmError::Library(format!(
                    "connecting to {dst}: {}",
                    status_words(ev.status)
                )))
            }
            event::DEVICE_REMOVAL => return Err(CmError::DeviceRemoved),
            k => return Err(CmError::Library(format!("connecting to {dst}: event {k}"))),
        }
        let rtr = id
            .qp_attr(RTR)
            .map_err(|e| lib_err("rdma_init_qp_attr", e))?;
        let rts = id
            .qp_attr(RTS)
            .map_err(|e| lib_err("rdma_init_qp_attr", e))?;
        id.establish().map_err(|e| lib_err("rdma_establish", e))?;
        Ok(Established {
            conn: ConnId(0),
            remote_qpn: Qpn::from_bits(ev.qp_num),
            remote_psn: Psn::new(rts.sq_psn),
            private_data: ev.private_data,
            local_psn: Some(Psn::new(rtr.rq_psn)),
        })
    }
}
