//! librdmacm's connection manager over the NIC daemon, inside this
//! library so that an id's `verbs`, `qp` and `pd` are this library's
//! contexts, QPs and PDs, which the application then uses with `ibv_*`
//! calls. crates/rdmacm-abi's `librdmacm.so.1` exports each function
//! here under rdma-core's name and version and calls it through its
//! unversioned name `ibverbs_abi_<name>` (one copy of the state: the
//! connection to the daemon, the devices, the contexts).
//!
//! The CM is the access layer's: one [`CmAgent`] per CA of the daemon,
//! on the client's place at the daemon's QP1 (see nicd's `mads`), with
//! RDMA CM's addressing from [`rdma_access::rdmacm`] (service ID from the
//! TCP port, the `cma_hdr` in the REQ's private data), so the peer may be
//! our own tools, another process through this library, or Linux's
//! rdma_cm.
//!
//! What librdmacm does asynchronously happens here on threads of this
//! module, each ending in an event on the id's channel: an address and a
//! route resolve at once (local lookups: the daemon's CAs and their
//! GIDs); a connect runs [`CmAgent::connect_qp`] on a thread of its own
//! (INIT before the REQ, RTR and RTS on the REP, then the RTU, as
//! librdmacm with a QP on the id); a listen has a thread turning REQs
//! into new ids and `CONNECT_REQUEST` events; the agent's hooks give
//! `ESTABLISHED` (the RTU of an accepted connection) and `DISCONNECTED`.
//!
//! The channel's descriptor is one end of a socket pair holding a byte
//! per queued event, so `poll` on it says when `rdma_get_cm_event` will
//! not block and an application's `O_NONBLOCK` on it works as with
//! librdmacm.
//!
//! Locking: an id's state lock is taken before its channel's queue lock
//! (an event is queued only while its id is alive); no lock of this
//! module is held while calling into a [`CmAgent`], whose hooks take
//! them.

pub mod abi;
pub mod exports;

use crate::abi::ibv_context;
use crate::objects::lock;
use abi::*;
use rdma_access::rdmacm::Resolved;
use rdma_access::{CmAgent, ConnId, Incoming, Path};
use rdma_types::Guid;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

/// One line on stderr, as rdma-core prints its warnings: what failed and
/// what to do.
fn warn(what: std::fmt::Arguments<'_>) {
    eprintln!("librdmacm (ibverbs-abi): {what}");
}

// ---- event channels --------------------------------------------------------

/// An event as the application receives it, with the private data its
/// `param.conn.private_data` points into.
#[repr(C)]
pub(crate) struct Event {
    pub ev: rdma_cm_event,
    pub private: Vec<u8>,
}

/// What a channel's writers share.
pub(crate) struct ChannelInner {
    /// Events not yet taken, as `Box<Event>` pointers.
    queue: Mutex<VecDeque<usize>>,
    /// The end the application reads (its `fd`).
    r: OwnedFd,
    /// One byte per queued event; non-blocking.
    w: OwnedFd,
}

/// A channel: `ibv` first, so its pointer is the application's.
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: rdma_event_channel,
    pub inner: Arc<ChannelInner>,
}

impl ChannelInner {
    pub(crate) fn new() -> std::io::Result<Arc<ChannelInner>> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both just made, owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: plain calls on a descriptor we own.
        unsafe {
            let fl = libc::fcntl(w.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(w.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Arc::new(ChannelInner {
            queue: Mutex::new(VecDeque::new()),
            r,
            w,
        }))
    }

    /// Queues `ev` and wakes the reader.
    fn push(&self, ev: Box<Event>) {
        lock(&self.queue).push_back(Box::into_raw(ev) as usize);
        // SAFETY: one byte from a valid buffer; a full socket drops it,
        // and the reader then finds more events than bytes, which it
        // takes on its next call.
        let _ = unsafe { libc::write(self.w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }

    /// The next event: waits as the descriptor does (blocking unless the
    /// application made it non-blocking).
    pub(crate) fn take(&self) -> Result<*mut Event, i32> {
        loop {
            if let Some(e) = lock(&self.queue).pop_front() {
                // Its byte: taken without waiting (a purged event left
                // bytes behind, so there may be more bytes than events).
                let mut b = [0u8; 1];
                // SAFETY: a one-byte buffer; MSG_DONTWAIT never blocks.
                let _ = unsafe {
                    libc::recv(
                        self.r.as_raw_fd(),
                        b.as_mut_ptr().cast(),
                        1,
                        libc::MSG_DONTWAIT,
                    )
                };
                return Ok(e as *mut Event);
            }
            let mut b = [0u8; 1];
            // SAFETY: a one-byte buffer on our descriptor.
            let n = unsafe { libc::read(self.r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.raw_os_error().unwrap_or(libc::EIO));
            }
            if n == 0 {
                return Err(libc::EIO);
            }
            // The byte came before its event was queued, or belonged to
            // a purged event: look again (pushing queues, then writes).
            if let Some(e) = lock(&self.queue).pop_front() {
                return Ok(e as *mut Event);
            }
        }
    }

    /// Drops the queued events of id `id` (being destroyed).
    fn purge(&self, id: usize) {
        let mut q = lock(&self.queue);
        q.retain(|&e| {
            // SAFETY: every entry is a leaked `Box<Event>` not yet taken.
            let mine = unsafe { (*(e as *mut Event)).ev.id as usize == id };
            if mine {
                // SAFETY: as above; removed from the queue, freed once.
                drop(unsafe { Box::from_raw(e as *mut Event) });
            }
            !mine
        });
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        for e in lock(&self.queue).drain(..) {
            // SAFETY: queued events are leaked boxes nobody took.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
    }
}

// ---- ids -----------------------------------------------------------------

/// An id's connection, once the CM has one.
#[derive(Clone)]
pub(crate) struct Conn {
    pub agent: Arc<CmAgent>,
    pub conn: ConnId,
}

/// What an id knows beyond its C struct.
#[derive(Default)]
pub(crate) struct IdState {
    /// False once destroyed: nothing is queued for it any more.
    pub alive: bool,
    /// `rdma_bind_addr`'s address.
    pub bound: Option<SocketAddr>,
    /// `rdma_resolve_addr`'s answer.
    pub resolved: Option<Resolved>,
    /// `rdma_resolve_route`'s path, and its record (the id's
    /// `route.path_rec`).
    pub path: Option<(Path, Box<ibv_sa_path_rec>)>,
    /// A request waiting for `rdma_accept` or `rdma_reject`.
    pub incoming: Option<(Arc<CmAgent>, Incoming)>,
    /// The connection.
    pub conn: Option<Conn>,
    /// Whether `ESTABLISHED` was queued.
    pub established: bool,
    /// Whether `DISCONNECTED` (or the error ending the connection) was
    /// queued.
    pub ended: bool,
    /// A listen's end: its threads stop when this is false.
    pub listening: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// What `rdma_init_qp_attr` gives a QP the application made itself
    /// (an id without a QP, rping's `-q`): known at `CONNECT_RESPONSE`
    /// (active) or `CONNECT_REQUEST` (passive).
    pub self_qp: Option<SelfQp>,
}

/// The attributes of a connection for a QP the application moves
/// itself: a CM message's starting PSN is the first PSN its sender
/// expects to receive (IBA 12.7.25), so `rq_psn` is what this side
/// announced and `sq_psn` what the peer did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SelfQp {
    pub peer: rdma_types::Gid,
    pub mtu: rdma_types::Mtu,
    pub remote_qpn: u32,
    pub rq_psn: rdma_types::Psn,
    pub sq_psn: rdma_types::Psn,
    /// READs the peer may have outstanding here (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs this side may have outstanding (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    pub retry: u8,
    pub rnr_retry: u8,
}

/// What an id's threads and the agents' hooks share.
pub(crate) struct IdInner {
    /// The `Id`'s address.
    pub ptr: usize,
    pub channel: Arc<ChannelInner>,
    pub st: Mutex<IdState>,
}

/// An id: `ibv` first.
#[repr(C)]
pub(crate) struct Id {
    pub ibv: rdma_cm_id,
    pub inner: Arc<IdInner>,
}

/// What an event carries besides its kind.
#[derive(Default)]
pub(crate) struct EventArgs {
    pub listen_id: usize,
    pub status: i32,
    pub private: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub qp_num: u32,
}

impl IdInner {
    /// Queues event `kind` for this id if it is alive; `update` runs on
    /// its state first, under the same lock.
    pub(crate) fn post_with(&self, kind: i32, a: EventArgs, update: impl FnOnce(&mut IdState)) {
        let mut st = lock(&self.st);
        if !st.alive {
            return;
        }
        update(&mut st);
        let mut ev = Box::new(Event {
            ev: rdma_cm_event {
                id: self.ptr as *mut rdma_cm_id,
                listen_id: a.listen_id as *mut rdma_cm_id,
                event: kind,
                status: a.status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: std::ptr::null(),
                        private_data_len: 0,
                        responder_resources: a.responder_resources,
                        initiator_depth: a.initiator_depth,
                        flow_control: 0,
                        retry_count: a.retry_count,
                        rnr_retry_count: a.rnr_retry_count,
                        srq: 0,
                        qp_num: a.qp_num,
                    },
                },
            },
            private: a.private,
        });
        if !ev.private.is_empty() {
            // Writing a union field is safe; `conn` is the member the
            // event was made with.
            ev.ev.param.conn.private_data = ev.private.as_ptr().cast();
            ev.ev.param.conn.private_data_len = ev.private.len().min(255) as u8;
        }
        self.channel.push(ev);
        drop(st);
    }

    pub(crate) fn post(&self, kind: i32, a: EventArgs) {
        self.post_with(kind, a, |_| {})
    }
}

// ---- the CM of each CA ---------------------------------------------------

/// Ids by connection, for the agents' hooks.
static CONNS: Mutex<Vec<(Guid, ConnId, Weak<IdInner>)>> = Mutex::new(Vec::new());

/// The agent of each CA, started at first use.
static AGENTS: Mutex<Vec<(Guid, Arc<CmAgent>)>> = Mutex::new(Vec::new());

/// Notes that `conn` of `guid` is `id`'s.
pub(crate) fn note_conn(guid: Guid, conn: ConnId, id: &Arc<IdInner>) {
    let mut all = lock(&CONNS);
    all.retain(|(_, _, w)| w.strong_count() > 0);
    all.push((guid, conn, Arc::downgrade(id)));
}

fn id_of_conn(guid: Guid, conn: ConnId) -> Option<Arc<IdInner>> {
    lock(&CONNS)
        .iter()
        .find(|(g, c, _)| *g == guid && *c == conn)
        .and_then(|(_, _, w)| w.upgrade())
}

/// The agents of every CA of the daemon, started if need be.
///
/// # Errors
/// No daemon (`ENODEV`; the line on stderr is the device list's), or an
/// agent that did not start (`EIO`, with a line on stderr).
pub(crate) fn agents() -> Result<Vec<Arc<CmAgent>>, i32> {
    let p = crate::objects::provider().ok_or(libc::ENODEV)?;
    let mut all = lock(&AGENTS);
    for guid in verbs::Provider::list_cas(&*p) {
        if all.iter().any(|(g, _)| *g == guid) {
            continue;
        }
        // Comm IDs from the process and the CA, so two processes on one
        // daemon, or a process run twice, do not reuse each other's.
        let first = (std::process::id() << 12) ^ (guid.0 as u32).rotate_left(20);
        let provider: Arc<dyn verbs::Provider> = p.clone();
        // The agent's MAD buffers must be memory the daemon maps; this
        // library allocates no other `MemBuf::new` (see
        // `objects::provider`), and agents start under `AGENTS`' lock.
        verbs::MemBuf::set_shared_by_default(true);
        let agent = CmAgent::start(provider, guid, first);
        verbs::MemBuf::set_shared_by_default(false);
        let agent = agent.map_err(|e| {
            warn(format_args!("start the CM on CA {guid}: {e}"));
            libc::EIO
        })?;
        agent.on_disconnect(move |c| ended(guid, c));
        agent.on_established(move |c| established(guid, c));
        all.push((guid, agent));
    }
    Ok(all.iter().map(|(_, a)| a.clone()).collect())
}

/// The agent of CA `guid`.
pub(crate) fn agent_of(guid: Guid) -> Result<Arc<CmAgent>, i32> {
    agents()?
        .into_iter()
        .find(|a| a.ca_guid() == guid)
        .ok_or(libc::ENODEV)
}

/// The RTU of an accepted connection.
fn established(guid: Guid, conn: ConnId) {
    if let Some(id) = id_of_conn(guid, conn) {
        let already = lock(&id.st).established;
        if !already {
            id.post_with(
                consts::RDMA_CM_EVENT_ESTABLISHED,
                EventArgs::default(),
                |s| s.established = true,
            );
        }
    }
}

/// A connection the CM ended (a DREQ, a REJ of the REP, no RTU, the CA
/// gone): `DISCONNECTED` once established, `CONNECT_ERROR` before.
fn ended(guid: Guid, conn: ConnId) {
    let Some(id) = id_of_conn(guid, conn) else {
        return;
    };
    let (done, est) = {
        let s = lock(&id.st);
        (s.ended, s.established)
    };
    if done {
        return;
    }
    let kind = if est {
        consts::RDMA_CM_EVENT_DISCONNECTED
    } else {
        consts::RDMA_CM_EVENT_CONNECT_ERROR
    };
    let a = EventArgs {
        status: if est { 0 } else { -libc::ECONNRESET },
        ..Default::default()
    };
    id.post_with(kind, a, |s| s.ended = true);
}

// ---- the verbs side ---------------------------------------------------------

/// The context of each CA librdmacm hands out (`id->verbs`,
/// `rdma_get_devices`), opened at first use and kept for the life of the
/// process, as librdmacm keeps its devices open.
static CONTEXTS: Mutex<Vec<(Guid, usize)>> = Mutex::new(Vec::new());

/// The PD of each context for `rdma_create_qp` without one.
static PDS: Mutex<Vec<(Guid, usize)>> = Mutex::new(Vec::new());

/// The context of CA `guid`.
pub(crate) fn context_of(guid: Guid) -> Result<*mut ibv_context, i32> {
    let mut all = lock(&CONTEXTS);
    if let Some((_, c)) = all.iter().find(|(g, _)| *g == guid) {
        return Ok(*c as *mut ibv_context);
    }
    let dev = crate::objects::device_of(guid);
    // SAFETY: a device of ours.
    let c = unsafe { crate::exports::ibv_open_device(dev.cast()) };
    if c.is_null() {
        // SAFETY: the calling thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    all.push((guid, c as usize));
    Ok(c)
}

/// The CA of one of [`context_of`]'s contexts.
pub(crate) fn guid_of_context(c: *mut ibv_context) -> Option<Guid> {
    lock(&CONTEXTS)
        .iter()
        .find(|(_, x)| *x == c as usize)
        .map(|(g, _)| *g)
}

/// The default PD of CA `guid`'s context.
pub(crate) fn default_pd(guid: Guid) -> Result<*mut crate::abi::ibv_pd, i32> {
    let c = context_of(guid)?;
    let mut all = lock(&PDS);
    if let Some((_, p)) = all.iter().find(|(g, _)| *g == guid) {
        return Ok(*p as *mut crate::abi::ibv_pd);
    }
    // SAFETY: a context of ours.
    let pd = unsafe { crate::exports::ibv_alloc_pd(c) };
    if pd.is_null() {
        // SAFETY: the calling thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    all.push((guid, pd as usize));
    Ok(pd)
}

// ---- socket addresses ------------------------------------------------------

/// The address at `sa` (`AF_INET` or `AF_INET6`).
///
/// # Safety
/// `sa` is NULL or points to a socket address whose family says its size.
pub(crate) unsafe fn sockaddr_in(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    unsafe {
        match (*sa).sa_family as i32 {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::new(
                    IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::new(
                    IpAddr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// `a` as a socket address in `out`.
pub(crate) fn write_sockaddr(out: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    *out = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: a `sockaddr_storage` holds a `sockaddr_in`.
            let s =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as u16;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from_be_bytes(v4.ip().octets()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: a `sockaddr_storage` holds a `sockaddr_in6`.
            let s =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as u16;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
        }
    }
}

/// The socket address in `s`, if it holds one.
pub(crate) fn read_sockaddr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: a `sockaddr_storage` is as large as any address.
    unsafe { sockaddr_in((s as *const libc::sockaddr_storage).cast()) }
}

/// The IP address of a RoCE GID (IPv4-mapped or IPv6).
pub(crate) fn ip_of_gid(g: rdma_types::Gid) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(g.0);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}
