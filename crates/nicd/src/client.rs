//! The client provider: every verb a request to the daemon.
//!
//! [`NicdProvider::connect`] opens the socket, exchanges `Hello` and
//! starts two threads: a reader, which hands each response to the call
//! waiting for it and each event to the second, the event thread, which
//! runs the consumer's [`EventHandler`] for the CA the event is for,
//! holding no lock of ours. So handlers never run inside a verb call
//! ([`Provider::handlers_nest`] is false) and may call any verb,
//! `destroy_*` of their own object included: the reply comes on the
//! reader thread. Calls from several threads at once are served in
//! parallel by the daemon only for `wait_cq`; others queue there.
//!
//! Memory: the daemon's NIC reaches a region through a mapping of its
//! buffer's memfd, so `reg_mr` and `rereg_mr` take only shared buffers
//! ([`MemBuf::new_shared`]) and refuse private ones with
//! `InvalidArgument` saying so. Connecting makes [`MemBuf::new`] return
//! shared buffers from then on ([`MemBuf::set_shared_by_default`]), so a
//! consumer that allocates after it connects needs no change.
//!
//! When the daemon goes away, every open CA's handler gets `CaRemoval`
//! (with the context of its open), every ring is dead and whoever waits
//! on one is woken, and verbs on the session's objects fail with
//! `NoSuchCa`; the next `list_cas` or `open_ca` connects again (a new
//! session, see [`NicdProvider`]). Dropping the provider closes the
//! connection (the daemon releases what is left) and calls no handler.
//!
//! The data path (protocol version 2, when the daemon serves it):
//! SQ, RQ, SRQ and CQ are rings in shared memory (see [`crate::proto`]
//! and the `rings` module), so a post or a poll on a busy queue makes
//! no system call; [`NicdProvider::counters`] counts the ones made.
//! [`NicdProvider::connect_with`] can keep every verb on the socket.
//!
//! QP1: a GSI QP made here is this client's place at the daemon's
//! shared QP1 (see [`crate::mads`]), served by this provider (the `gsi`
//! module): the access layer's CM, SA client and MAD agents run over it
//! unchanged, and tell the daemon what they serve and listen on with
//! [`Provider::gsi_register`] and [`Provider::gsi_listen`]. QP0 is
//! refused (the daemon's).

pub mod direct;
mod gsi;
mod rings;

pub use rings::Counters;

use crate::proto::{
    self, Answer, ClientReport, Event, Kind, Reply, Request, OLDEST_VERSION, VERSION,
};
use crate::sock::{send_frame, FrameReader, ReadError};
use rdma_access::subnet::Fabric;
use rdma_types::{AccessFlags, Guid, PortNum, QpType, Qpn, Rkey};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use verbs::{
    AhAttr, AhHandle, AsyncEvent, AsyncEventKind, CaAttr, CaHandle, Context, CqHandle, CqInit,
    EventHandler, MemBuf, MrHandle, MrInfo, MwBind, MwHandle, MwType, PdHandle, PkeyViolations,
    PortAttr, PortModify, Provider, QpAttr, QpHandle, QpInit, RecvWr, SendWr, SrqAttr, SrqHandle,
    VerbsError, WorkCompletion,
};

type Result<T> = verbs::Result<T>;

/// Why [`NicdProvider::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nobody listens at the path (no daemon, or one that died).
    #[error("no NIC daemon at {path}: {source} (start one with `nicd --ip ADDRESS`)")]
    NoDaemon {
        /// The socket path tried.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The daemon refused the hello (another protocol version).
    #[error("the NIC daemon at {path} refused us: {reason}")]
    Refused {
        /// The socket path.
        path: PathBuf,
        /// Its words.
        reason: VerbsError,
    },
}

#[derive(Default)]
struct Pending {
    /// Answers by sequence number; `None` while awaited.
    slots: HashMap<u32, Option<Answer>>,
    /// The handler of each `OpenCa` awaited, by sequence number.
    opening: HashMap<u32, Opened>,
    /// The descriptor an answer carried (a `SharePort`'s), by sequence
    /// number, until its caller takes it.
    fds: HashMap<u32, OwnedFd>,
    /// The connection is gone.
    closed: bool,
}

struct Conn {
    sock: UnixStream,
    write: Mutex<()>,
    pending: Mutex<Pending>,
    answered: Condvar,
    seq: AtomicU32,
    /// The consumer's handler of each open CA, by the daemon's CA index.
    handlers: Mutex<HashMap<u32, Opened>>,
    /// The consumer dropped the provider: the connection's end is ours,
    /// not the daemon's, and no handler hears of it.
    dropped: AtomicBool,
    /// Requests sent.
    calls: AtomicU64,
    /// What this side serves itself: GSI QPs and what they need to know.
    local: Mutex<gsi::Local>,
    /// The event thread, for GSI completions made by a verb (taken when
    /// the connection ends, so that thread ends too).
    kick: Mutex<Option<Sender<Dispatch>>>,
    /// The session's rings, ended with the connection (so a wait on one
    /// returns at once).
    rings: Mutex<Option<Arc<rings::Rings>>>,
    /// The completion eventfd the daemon answers ring CQ arms on (taken
    /// and written when the connection ends, so its thread ends too).
    notice: Mutex<Option<Arc<OwnedFd>>>,
}

/// One connection to the daemon and what lives on it: a [`Provider`]
/// until the connection ends (see [`NicdProvider`], which replaces it).
struct Session {
    conn: Arc<Conn>,
    daemon_pid: u32,
    /// The data path's rings (protocol version 2), unless the daemon is
    /// older or the consumer asked for the socket.
    rings: Option<Arc<rings::Rings>>,
}

/// A [`Provider`] whose CAs are the NIC daemon's (see the module docs):
/// a session with the daemon, replaced by a new one when the daemon
/// went and came back.
///
/// When the connection ends, every open CA hears `CaRemoval` and verbs
/// on its objects fail (`NoSuchCa`, or `InvalidHandle` once a new
/// session serves: the daemon mixes a value of its own into every
/// handle, so an earlier daemon's are refused). The next
/// [`Provider::list_cas`] or [`Provider::open_ca`] (or
/// [`NicdProvider::reconnect`]) connects again, so a consumer that
/// follows a removed CA, as the access layer's do, finds it back when
/// the daemon returns.
pub struct NicdProvider {
    socket: PathBuf,
    rings: bool,
    cur: std::sync::RwLock<Arc<Session>>,
    /// Held while a new session is made (one at a time).
    renewing: Mutex<()>,
    /// Sessions made after the first.
    reconnects: AtomicU64,
}

impl NicdProvider {
    /// Connects to the daemon at `socket`, posts and polls through
    /// shared-memory rings when it serves them (protocol version 2; an
    /// older daemon is asked for version 1, every verb on the socket).
    ///
    /// # Errors
    /// See [`ConnectError`].
    pub fn connect(socket: &Path) -> std::result::Result<Arc<NicdProvider>, ConnectError> {
        NicdProvider::connect_with(socket, true)
    }

    /// [`NicdProvider::connect`]; every verb on the socket unless
    /// `rings` (to compare the two, or to rule the rings out).
    ///
    /// # Errors
    /// See [`ConnectError`]; with `rings`, the refusal of version 2 when
    /// version 1 is refused too.
    pub fn connect_with(
        socket: &Path,
        rings: bool,
    ) -> std::result::Result<Arc<NicdProvider>, ConnectError> {
        let s = Session::connect_with(socket, rings)?;
        Ok(Arc::new(NicdProvider {
            socket: socket.to_owned(),
            rings,
            cur: std::sync::RwLock::new(Arc::new(s)),
            renewing: Mutex::new(()),
            reconnects: AtomicU64::new(0),
        }))
    }

    /// The session now.
    fn s(&self) -> Arc<Session> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The session now, a new one first when the daemon went (and is
    /// back); the ended one when it is not back.
    fn live(&self) -> Arc<Session> {
        let s = self.s();
        if !s.closed() {
            return s;
        }
        let _ = self.reconnect();
        self.s()
    }

    /// Connects anew when the connection ended; whether a new session
    /// serves now (`false`: the old one is still up).
    ///
    /// # Errors
    /// The daemon is not back (see [`ConnectError`]).
    pub fn reconnect(&self) -> std::result::Result<bool, ConnectError> {
        let _one = self.renewing.lock().unwrap_or_else(|e| e.into_inner());
        if !self.s().closed() {
            return Ok(false);
        }
        let new = Arc::new(Session::connect_with(&self.socket, self.rings)?);
        let pid = new.daemon_pid;
        *self.cur.write().unwrap_or_else(|e| e.into_inner()) = new;
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "nicd client: connected again to {} (daemon pid {pid})",
            self.socket.display()
        );
        Ok(true)
    }

    /// Whether the connection now is up.
    pub fn connected(&self) -> bool {
        !self.s().closed()
    }

    /// How many times a new session replaced an ended one.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The daemon's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether posts and polls go through shared-memory rings.
    pub fn uses_rings(&self) -> bool {
        self.s().uses_rings()
    }

    /// What this session did so far (requests on the socket, doorbells,
    /// ring posts and polls): the system calls of the data path are the
    /// requests and the doorbells.
    pub fn counters(&self) -> Counters {
        self.s().counters()
    }

    /// The daemon's process ID (from its hello).
    pub fn daemon_pid(&self) -> u32 {
        self.s().daemon_pid
    }

    /// The daemon's clients and what each holds (this one among them).
    ///
    /// # Errors
    /// `InvalidArgument` for a client that is neither root nor the
    /// daemon's user; `NoSuchCa` when the daemon is gone.
    pub fn daemon_clients(&self) -> Result<Vec<ClientReport>> {
        self.live().daemon_clients()
    }

    /// A member of the shared port of this client's CA `ca`
    /// ([`crate::shared`]): its block of QP numbers and its socket.
    ///
    /// # Errors
    /// `NotSupported` where the daemon lends none (an `ib` port, a daemon
    /// without shared ports, or older than the request); `NoSuchCa` when
    /// the daemon is gone.
    pub fn share_port(&self, ca: CaHandle) -> Result<(std::ops::Range<u32>, OwnedFd)> {
        let s = self.s();
        match s.conn.call_opening(&Request::SharePort { ca }, None, None) {
            (
                Ok(Reply::SharedPort {
                    first_qpn, end_qpn, ..
                }),
                Some(fd),
            ) => Ok((first_qpn..end_qpn, fd)),
            (Ok(other), _) => Err(unexpected("SharePort", &other)),
            (Err(VerbsError::InvalidArgument(m)), _) if m.starts_with("malformed request") => Err(
                VerbsError::NotSupported("this daemon lends no shared ports"),
            ),
            (Err(e), _) => Err(e),
        }
    }

    /// Has the daemon count a QP this client runs itself under its PD
    /// `pd` ([`Request::CountQp`]): a handle that `destroy_qp` ends, or
    /// `None` from a daemon older than the request (nothing counted).
    ///
    /// # Errors
    /// `OutOfResources` past the client's QP limit (`nicd --max-qps`);
    /// `InvalidHandle` for a PD not the client's.
    pub fn count_qp(&self, pd: PdHandle) -> Result<Option<QpHandle>> {
        match self.live().conn.call(&Request::CountQp { pd }, None) {
            Ok(Reply::Qp { qp }) => Ok(Some(qp)),
            Ok(other) => Err(unexpected("CountQp", &other)),
            Err(VerbsError::InvalidArgument(m)) if m.starts_with("malformed request") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Has the daemon count a registration of `len` bytes of memory it
    /// cannot reach, made in this client's own node under its PD `pd`
    /// ([`Request::CountMr`]): a handle that `dereg_mr` ends, or `None`
    /// from a daemon older than the request (nothing counted).
    ///
    /// # Errors
    /// `OutOfResources` past the client's memory limit
    /// (`nicd --max-registered`); `InvalidHandle` for a PD not the
    /// client's.
    pub fn count_mr(&self, pd: PdHandle, len: u64) -> Result<Option<MrHandle>> {
        match self.live().conn.call(&Request::CountMr { pd, len }, None) {
            Ok(Reply::Mr { info }) => Ok(Some(info.handle)),
            Ok(other) => Err(unexpected("CountMr", &other)),
            Err(VerbsError::InvalidArgument(m)) if m.starts_with("malformed request") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The members of shared ports the daemon has lent, and to whom.
    ///
    /// # Errors
    /// As [`NicdProvider::daemon_clients`]; `NotSupported` from a daemon
    /// older than the request.
    pub fn lent_ports(&self) -> Result<Vec<crate::proto::LentPort>> {
        match self.live().conn.call(&Request::LentPorts {}, None) {
            Ok(Reply::Lent { lent }) => Ok(lent),
            Ok(other) => Err(unexpected("LentPorts", &other)),
            Err(VerbsError::InvalidArgument(m)) if m.starts_with("malformed request") => Err(
                VerbsError::NotSupported("this daemon lends no shared ports"),
            ),
            Err(e) => Err(e),
        }
    }

    /// Has the daemon serve a NIC at `ip` from now on (or finds the one
    /// it serves there) and names its GUID.
    ///
    /// # Errors
    /// `InvalidArgument` for a client that is neither root nor the
    /// daemon's user, or a NIC that would not open there (in words);
    /// `NotSupported` from a daemon that cannot add NICs.
    pub fn add_nic(&self, ip: std::net::IpAddr) -> Result<Guid> {
        self.live().add_nic(ip)
    }

    /// [`NicdProvider::add_nic`] on `fabric`. A NIC the daemon serves at
    /// `ip` already is named to any client when it is on `fabric`.
    ///
    /// # Errors
    /// As [`NicdProvider::add_nic`]'s (adding one needs root or the
    /// daemon's user), and `InvalidArgument` in words when the daemon's
    /// NIC at `ip` is on the other fabric; `NotSupported` from a daemon
    /// older than the request.
    pub fn add_nic_on(&self, ip: std::net::IpAddr, fabric: Fabric) -> Result<Guid> {
        self.live().add_nic_on(ip, fabric)
    }
}

/// Each verb the current session's ([`NicdProvider::s`]).
macro_rules! to_session {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(
            fn $name(&self $(, $arg: $ty)*) -> $ret {
                Provider::$name(&*self.s() $(, $arg)*)
            }
        )*
    };
}

impl Provider for NicdProvider {
    fn name(&self) -> &'static str {
        "nicd"
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.live().list_cas()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        self.live().open_ca(guid, ctx, handler)
    }

    to_session! {
        fn query_ca(&self, ca: CaHandle) -> Result<CaAttr>;
        fn close_ca(&self, ca: CaHandle) -> Result<()>;
        fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr>;
        fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()>;
        fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>>;
        fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle>;
        fn dealloc_pd(&self, pd: PdHandle) -> Result<()>;
        fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle>;
        fn destroy_cq(&self, cq: CqHandle) -> Result<()>;
        fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize>;
        fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()>;
        fn wait_cq(&self, cq: CqHandle, timeout: Duration) -> Result<()>;
        fn drive_cq(&self, cq: CqHandle, spin: Duration, timeout: Duration) -> Result<bool>;
        fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle>;
        fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()>;
        fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr>;
        fn destroy_srq(&self, srq: SrqHandle) -> Result<()>;
        fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle>;
        fn qp_num(&self, qp: QpHandle) -> Result<Qpn>;
        fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()>;
        fn query_qp(&self, qp: QpHandle) -> Result<QpAttr>;
        fn destroy_qp(&self, qp: QpHandle) -> Result<()>;
        fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle>;
        fn destroy_ah(&self, ah: AhHandle) -> Result<()>;
        fn reg_mr(&self, pd: PdHandle, buf: &MemBuf, addr: u64, len: u64, access: AccessFlags, ctx: Context) -> Result<MrInfo>;
        fn rereg_mr(&self, mr: MrHandle, buf: &MemBuf, addr: u64, len: u64, access: AccessFlags) -> Result<MrInfo>;
        fn dereg_mr(&self, mr: MrHandle) -> Result<()>;
        fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)>;
        fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey>;
        fn dealloc_mw(&self, mw: MwHandle) -> Result<()>;
        fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()>;
        fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()>;
        fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()>;
        fn gsi_register(&self, qp: QpHandle, class: u8, version: u8, methods: &[u8], serve: bool) -> Result<()>;
        fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<()>;
    }
}

/// An open CA's handler and the consumer's context of the open (its
/// `CaRemoval` carries it).
type Opened = (Arc<dyn EventHandler>, u64);

/// What the event thread is handed.
enum Dispatch {
    /// A CA opened: its handler, in place before any event read after
    /// the reply.
    Register(u32, Opened),
    Event(Event),
    /// The daemon is gone: `CaRemoval` to every open CA.
    Gone,
    /// CQ `.0` has a GSI completion: its handler hears if it is armed.
    Kick(u32),
    /// A ring CQ of CA `.0` with context `.1` was answered on the
    /// completion eventfd before its CA's handler was in place.
    Notice(u32, u64),
}

impl Session {
    /// A session with the daemon at `socket` (see
    /// [`NicdProvider::connect_with`]).
    fn connect_with(socket: &Path, rings: bool) -> std::result::Result<Session, ConnectError> {
        if !rings {
            return Session::open(socket, OLDEST_VERSION);
        }
        let mut p = match Session::open(socket, VERSION) {
            Ok(p) => p,
            Err(e @ ConnectError::Refused { .. }) => {
                // An older daemon closed that connection: ask it for
                // version 1 on a new one.
                return Session::open(socket, OLDEST_VERSION).map_err(|_| e);
            }
            Err(e) => return Err(e),
        };
        // Without a doorbell the rings stay off and the socket serves.
        match crate::efd::new() {
            Ok(fd) => {
                let r = rings::Rings::new(fd);
                if let Ok(Reply::Unit {}) = p.conn.call(&Request::Doorbell {}, Some(r.doorbell())) {
                    let r = Arc::new(r);
                    *p.conn.rings.lock().unwrap_or_else(|e| e.into_inner()) = Some(r.clone());
                    p.rings = Some(r.clone());
                    p.conn.start_notice(&r);
                }
            }
            Err(e) => tracing::warn!("nicd client: no eventfd for a doorbell ({e}): socket only"),
        }
        Ok(p)
    }

    /// Whether the connection ended (the daemon went, or closed it).
    fn closed(&self) -> bool {
        self.conn
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed
    }

    fn open(socket: &Path, version: u32) -> std::result::Result<Session, ConnectError> {
        let sock = UnixStream::connect(socket).map_err(|source| ConnectError::NoDaemon {
            path: socket.to_owned(),
            source,
        })?;
        let rsock = sock.try_clone().map_err(|source| ConnectError::NoDaemon {
            path: socket.to_owned(),
            source,
        })?;
        let (tx, rx) = channel::<Dispatch>();
        let conn = Arc::new(Conn {
            sock,
            write: Mutex::new(()),
            pending: Mutex::new(Pending::default()),
            answered: Condvar::new(),
            seq: AtomicU32::new(0),
            handlers: Mutex::new(HashMap::new()),
            dropped: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            local: Mutex::new(gsi::Local::default()),
            kick: Mutex::new(Some(tx.clone())),
            rings: Mutex::new(None),
            notice: Mutex::new(None),
        });
        let c = conn.clone();
        std::thread::Builder::new()
            .name("nicd-client-rx".into())
            .spawn(move || c.read_loop(FrameReader::new(rsock), tx))
            .expect("spawn the reader thread");
        let c = conn.clone();
        std::thread::Builder::new()
            .name("nicd-client-events".into())
            .spawn(move || {
                for d in rx {
                    c.dispatch(d);
                }
            })
            .expect("spawn the event thread");
        // Dropped on a refusal, which ends the connection and its threads.
        let mut p = Session {
            conn,
            daemon_pid: 0,
            rings: None,
        };
        let refused = |reason| ConnectError::Refused {
            path: socket.to_owned(),
            reason,
        };
        p.daemon_pid = match p.conn.call(&Request::Hello { version }, None) {
            Ok(Reply::Hello { pid, .. }) => pid,
            Ok(other) => return Err(refused(unexpected("Hello", &other))),
            Err(reason) => return Err(refused(reason)),
        };
        MemBuf::set_shared_by_default(true);
        Ok(p)
    }

    fn uses_rings(&self) -> bool {
        self.rings.is_some()
    }

    fn counters(&self) -> Counters {
        let mut c = self
            .rings
            .as_ref()
            .map(|r| r.count.get())
            .unwrap_or_default();
        c.socket_calls = self.conn.calls.load(Ordering::Relaxed);
        c
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Ends the reader (and so the event thread); the daemon releases
        // what is left.
        self.conn.dropped.store(true, Ordering::Relaxed);
        let _ = self.conn.sock.shutdown(std::net::Shutdown::Both);
    }
}

fn unexpected(verb: &str, r: &Reply) -> VerbsError {
    VerbsError::InvalidArgument(format!("nicd answered {verb} with {r:?}"))
}

impl Conn {
    fn read_loop(&self, mut reader: FrameReader, events: Sender<Dispatch>) {
        loop {
            let f = match reader.next() {
                Ok(f) => f,
                Err(ReadError::Closed | ReadError::Io(_)) => break,
                Err(ReadError::Framing(e)) => {
                    tracing::error!("nicd client: {e}: connection dropped");
                    break;
                }
            };
            // Only an answer carries one (a `SharePort`'s), at most one.
            let fd = reader.take_fd();
            while reader.take_fd().is_some() {}
            let Ok((kind, seq, body)) = proto::split(&f) else {
                break;
            };
            match kind {
                Kind::Response => {
                    let a = proto::decode::<Answer>(body).unwrap_or_else(|e| {
                        Err(VerbsError::InvalidArgument(format!(
                            "malformed answer from nicd: {e}"
                        )))
                    });
                    let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(h) = p.opening.remove(&seq) {
                        if let Ok(Reply::Ca { ca }) = &a {
                            let _ = events.send(Dispatch::Register(ca.0.index, h));
                        }
                    }
                    if let Some(slot) = p.slots.get_mut(&seq) {
                        *slot = Some(a);
                        if let Some(fd) = fd {
                            p.fds.insert(seq, fd);
                        }
                        self.answered.notify_all();
                    }
                }
                Kind::Event => match proto::decode::<Event>(body) {
                    Ok(e) => {
                        let _ = events.send(Dispatch::Event(e));
                    }
                    Err(e) => tracing::error!("nicd client: malformed event: {e}"),
                },
                Kind::Request => tracing::error!("nicd client: a request from the daemon"),
            }
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed = true;
        self.answered.notify_all();
        if let Some(r) = self.rings.lock().unwrap_or_else(|e| e.into_inner()).take() {
            r.end_all();
        }
        if let Some(fd) = self.notice.lock().unwrap_or_else(|e| e.into_inner()).take() {
            crate::efd::write_one(&fd);
        }
        if !self.dropped.load(Ordering::Relaxed) {
            let _ = events.send(Dispatch::Gone);
        }
        self.kick.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn local(&self) -> std::sync::MutexGuard<'_, gsi::Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the daemon a completion eventfd and starts the thread that
    /// waits on it (see [`Conn::notice_loop`]); a daemon that does not
    /// know the request keeps sending `Completion` events.
    fn start_notice(self: &Arc<Self>, r: &Arc<rings::Rings>) {
        let fd = match crate::efd::new() {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                tracing::warn!("nicd client: no eventfd for completions ({e}): events serve");
                return;
            }
        };
        let Ok(Reply::Unit {}) = self.call(&Request::CompletionNotice {}, Some(fd.as_fd())) else {
            return;
        };
        *self.notice.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd.clone());
        let (c, r) = (self.clone(), r.clone());
        let started = std::thread::Builder::new()
            .name("nicd-client-cq".into())
            .spawn(move || c.notice_loop(&fd, &r));
        if let Err(e) = started {
            // The daemon answers this connection's arms on a descriptor
            // nobody reads: its CQ handlers would never run.
            tracing::error!("nicd client: no completion thread ({e}): connection dropped");
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Until the connection ends: waits on the completion eventfd, then
    /// runs the handler of every ring CQ the daemon answered since the
    /// last look, holding no lock.
    fn notice_loop(&self, fd: &OwnedFd, r: &rings::Rings) {
        let mut fired = Vec::new();
        loop {
            crate::efd::wait(fd, Duration::from_secs(1));
            if self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
            {
                return;
            }
            r.notified(&mut fired);
            r.count
                .notices
                .fetch_add(fired.len() as u64, Ordering::Relaxed);
            for (ca, ctx) in fired.drain(..) {
                // Without a handler, the event thread has its
                // registration to make yet.
                if !self.complete(ca, ctx) {
                    if let Some(tx) = &*self.kick.lock().unwrap_or_else(|e| e.into_inner()) {
                        let _ = tx.send(Dispatch::Notice(ca, ctx));
                    }
                }
            }
        }
    }

    /// Runs CA `ca`'s handler for a completion on the CQ of context
    /// `ctx`, holding no lock; `false` when the CA has no handler (yet).
    fn complete(&self, ca: u32, ctx: u64) -> bool {
        let h = self
            .handlers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ca)
            .cloned();
        h.map(|(h, _)| h.on_completion(ctx)).is_some()
    }

    /// Has the event thread tell CQ `cq`'s handler of a GSI completion.
    fn kick(&self, cq: u32) {
        if let Some(tx) = &*self.kick.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = tx.send(Dispatch::Kick(cq));
        }
    }

    /// Runs the handler an event is for, holding no lock.
    fn dispatch(&self, d: Dispatch) {
        let handlers = || self.handlers.lock().unwrap_or_else(|e| e.into_inner());
        match d {
            Dispatch::Register(ca, h) => {
                handlers().insert(ca, h);
            }
            Dispatch::Notice(ca, ctx) => {
                self.complete(ca, ctx);
            }
            Dispatch::Kick(cq) => {
                let hear = self.local().notify(cq);
                if let Some((ca, ctx)) = hear {
                    self.complete(ca, ctx);
                }
            }
            Dispatch::Event(Event::Mad {
                qp,
                sgid,
                pkey_index,
                mad,
                ..
            }) => {
                let hear = self.local().receive(qp.0.index, sgid, pkey_index, &mad);
                if let Some((ca, ctx)) = hear {
                    self.complete(ca, ctx);
                }
            }
            Dispatch::Event(e) => {
                let ca = match &e {
                    Event::Completion { ca, .. }
                    | Event::Async { ca, .. }
                    | Event::Destroyed { ca, .. }
                    | Event::Mad { ca, .. } => ca.0.index,
                };
                let Some((h, _)) = handlers().get(&ca).cloned() else {
                    return;
                };
                match e {
                    Event::Completion { cq_ctx, .. } => h.on_completion(cq_ctx),
                    Event::Async { event, .. } => h.on_async_event(event),
                    Event::Destroyed { kind, ctx, .. } => {
                        h.on_destroyed(kind, ctx);
                        if kind == verbs::ResourceKind::Ca {
                            handlers().remove(&ca);
                        }
                    }
                    Event::Mad { .. } => {}
                }
            }
            Dispatch::Gone => {
                let all: Vec<_> = handlers().drain().map(|(_, o)| o).collect();
                for (h, ctx) in all {
                    h.on_async_event(AsyncEvent {
                        kind: AsyncEventKind::CaRemoval,
                        ctx,
                        port: None,
                    });
                }
            }
        }
    }

    /// Sends `req` (with `fd`) and waits for its answer.
    fn call(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> Answer {
        self.call_opening(req, fd, None).0
    }

    /// [`Conn::call`]; `handler` is an `OpenCa`'s. With the descriptor
    /// the answer carried.
    fn call_opening(
        &self,
        req: &Request,
        fd: Option<BorrowedFd<'_>>,
        handler: Option<Opened>,
    ) -> (Answer, Option<OwnedFd>) {
        let mut seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if seq == 0 {
            seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        let frame = proto::frame(Kind::Request, seq, req);
        self.calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.closed {
                return (Err(VerbsError::NoSuchCa), None);
            }
            p.slots.insert(seq, None);
            if let Some(h) = handler {
                p.opening.insert(seq, h);
            }
        }
        let sent = {
            let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
            send_frame(&self.sock, &frame, fd)
        };
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if sent.is_err() {
            p.slots.remove(&seq);
            p.opening.remove(&seq);
            return (Err(VerbsError::NoSuchCa), None);
        }
        loop {
            if let Some(Some(_)) = p.slots.get(&seq) {
                let fd = p.fds.remove(&seq);
                return (p.slots.remove(&seq).flatten().expect("answered"), fd);
            }
            if p.closed {
                p.slots.remove(&seq);
                return (Err(VerbsError::NoSuchCa), None);
            }
            p = self.answered.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Calls and takes the reply of the expected variant.
macro_rules! call {
    ($self:ident, $req:expr, $pat:pat => $v:expr) => {
        call!($self, $req, None, $pat => $v)
    };
    ($self:ident, $req:expr, $fd:expr, $pat:pat => $v:expr) => {
        match $self.conn.call(&$req, $fd)? {
            $pat => Ok($v),
            other => Err(unexpected(stringify!($req), &other)),
        }
    };
}

/// The memfd of a buffer to register, or the refusal.
fn shared_fd(buf: &MemBuf) -> Result<BorrowedFd<'_>> {
    buf.shared_fd().ok_or_else(|| {
        VerbsError::InvalidArgument(
            "this buffer is private memory the NIC daemon cannot reach: allocate it with \
             MemBuf::new_shared (or MemBuf::new after connecting to nicd)"
                .into(),
        )
    })
}

impl Session {
    /// Forgets the rings of a destroyed object.
    fn forget(&self, h: verbs::Handle) {
        if let Some(r) = &self.rings {
            r.forget(h);
        }
    }

    fn daemon_clients(&self) -> Result<Vec<ClientReport>> {
        call!(self, Request::Clients {}, Reply::Clients { clients } => clients)
    }

    fn add_nic(&self, ip: std::net::IpAddr) -> Result<Guid> {
        let guids = call!(self, Request::AddNic { ip }, Reply::Guids { guids } => guids)?;
        guids
            .first()
            .copied()
            .ok_or_else(|| unexpected("Request::AddNic", &Reply::Guids { guids }))
    }

    fn add_nic_on(&self, ip: std::net::IpAddr, fabric: Fabric) -> Result<Guid> {
        let ib = fabric == Fabric::Ib;
        let guids = call!(self, Request::AddNicOn { ip, ib }, Reply::Guids { guids } => guids)?;
        guids
            .first()
            .copied()
            .ok_or_else(|| unexpected("Request::AddNicOn", &Reply::Guids { guids }))
    }
}

/// The CQ verbs as the daemon serves them (GSI completions aside).
impl Session {
    /// `create_cq` on `pd` of the daemon's CA `ca`.
    fn create_cq_here(
        &self,
        pd: PdHandle,
        ca: u32,
        init: &CqInit,
        ctx: Context,
    ) -> Result<CqHandle> {
        let init = *init;
        let layout = self
            .rings
            .as_ref()
            .and_then(|r| rings::Rings::cq_layout(init.cqe).map(|l| (r, l)));
        let Some((r, layout)) = layout else {
            return call!(self, Request::CreateCq { pd, init, ctx }, Reply::Cq { cq } => cq);
        };
        let (buf, ring) = layout?;
        let req = Request::CreateCqRing {
            pd,
            init,
            ctx,
            len: buf.len() as u64,
            ring,
        };
        let fd = shared_fd(&buf)?;
        let cq = match self.conn.call(&req, Some(fd)) {
            Ok(Reply::Cq { cq }) => cq,
            Ok(other) => return Err(unexpected("CreateCqRing", &other)),
            // Rings beyond this client's memory limit: the socket serves.
            Err(VerbsError::OutOfResources(m)) if m == crate::server::MEMORY_LIMIT => {
                return call!(self, Request::CreateCq { pd, init, ctx }, Reply::Cq { cq } => cq);
            }
            Err(e) => return Err(e),
        };
        r.add_cq(cq.0, buf, ring, ca, ctx)?;
        Ok(cq)
    }

    fn poll_cq_here(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        if let Some(r) = &self.rings {
            match r.poll_cq(cq.0, out) {
                Some(Ok((n, false))) => return Ok(n),
                Some(Err(e)) => return Err(e),
                // No ring, or a delegated one found empty.
                Some(Ok((_, true))) | None => {}
            }
        }
        let max = out.len().min(u32::MAX as usize) as u32;
        let wcs = call!(self, Request::PollCq { cq, max }, Reply::Wcs { wcs } => wcs)?;
        let n = wcs.len().min(out.len());
        out[..n].copy_from_slice(&wcs[..n]);
        Ok(n)
    }

    fn req_notify_cq_here(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        if !solicited_only && self.rings.as_ref().is_some_and(|r| r.arm(cq.0)) {
            return Ok(());
        }
        call!(self, Request::ReqNotifyCq { cq, solicited_only }, Reply::Unit {} => ())
    }

    /// Waits on CQ `cq`'s ring, looking for `spin` without a system call
    /// first: `None` when the CQ has none (or a delegated one); else
    /// `Timeout`, or `NoSuchCa` for a wait the connection's end woke.
    fn ring_wait(&self, cq: CqHandle, spin: Duration, timeout: Duration) -> Option<Result<()>> {
        let came = self.rings.as_ref()?.wait_cq(cq.0, spin, timeout)?;
        Some(match came {
            true if self.closed() => Err(VerbsError::NoSuchCa),
            true => Ok(()),
            false => Err(VerbsError::Timeout),
        })
    }

    /// Whether GSI CQ `cq` has completions this side made.
    fn gsi_done(&self, cq: CqHandle) -> bool {
        let l = self.conn.local();
        l.done.get(&cq.0.index).is_some_and(|d| !d.is_empty())
    }

    fn wait_cq_here(&self, cq: CqHandle, timeout: Duration) -> Result<()> {
        if let Some(r) = self.ring_wait(cq, Duration::ZERO, timeout) {
            return r;
        }
        let timeout_us = timeout.as_micros().min(u64::MAX as u128) as u64;
        call!(self, Request::WaitCq { cq, timeout_us }, Reply::Unit {} => ())
    }
}

impl Provider for Session {
    fn name(&self) -> &'static str {
        "nicd"
    }

    fn list_cas(&self) -> Vec<Guid> {
        match self.conn.call(&Request::ListCas {}, None) {
            Ok(Reply::Guids { guids }) => guids,
            _ => Vec::new(),
        }
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        // The reader thread puts the handler in place when it reads the
        // reply, before it reads any event for the CA.
        match self
            .conn
            .call_opening(&Request::OpenCa { guid, ctx }, None, Some((handler, ctx)))
            .0?
        {
            Reply::Ca { ca } => Ok(ca),
            other => Err(unexpected("OpenCa", &other)),
        }
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        call!(self, Request::QueryCa { ca }, Reply::CaAttr { attr } => attr)
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        call!(self, Request::CloseCa { ca }, Reply::Unit {} => ())
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        call!(self, Request::QueryPortSm { ca, port }, Reply::PortSm { attr, sm_gid } => PortAttr { sm_gid, ..attr })
    }

    fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()> {
        let modify = modify.clone();
        let sm_gid = modify.sm_gid;
        call!(self, Request::ModifyPortSm { ca, port, modify, sm_gid }, Reply::Unit {} => ())
    }

    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        call!(self, Request::TakePkeyViolations { ca, port }, Reply::PkeyViolations { v } => v)
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let pd = call!(self, Request::AllocPd { ca, ctx }, Reply::Pd { pd } => pd)?;
        self.conn.local().pds.insert(pd.0.index, ca.0.index);
        Ok(pd)
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        call!(self, Request::DeallocPd { pd }, Reply::Unit {} => ())?;
        self.conn.local().pds.remove(&pd.0.index);
        Ok(())
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let ca = self.conn.local().pds.get(&pd.0.index).copied().unwrap_or(0);
        let cq = self.create_cq_here(pd, ca, init, ctx)?;
        self.conn.local().cqs.insert(cq.0.index, (ca, ctx));
        Ok(cq)
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        call!(self, Request::DestroyCq { cq }, Reply::Unit {} => ())?;
        self.forget(cq.0);
        let mut l = self.conn.local();
        l.cqs.remove(&cq.0.index);
        l.done.remove(&cq.0.index);
        l.armed.remove(&cq.0.index);
        Ok(())
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        // GSI completions first; the CQ's own on the next call.
        let n = self.conn.local().poll(cq.0.index, out);
        if n > 0 {
            return Ok(n);
        }
        self.poll_cq_here(cq, out)
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let pending = {
            let mut l = self.conn.local();
            l.armed.insert(cq.0.index);
            l.done.get(&cq.0.index).is_some_and(|d| !d.is_empty())
        };
        if pending {
            self.conn.kick(cq.0.index);
        }
        self.req_notify_cq_here(cq, solicited_only)
    }

    fn wait_cq(&self, cq: CqHandle, timeout: Duration) -> Result<()> {
        if self.gsi_done(cq) {
            return Ok(());
        }
        self.wait_cq_here(cq, timeout)
    }

    /// A consumer's thread waits on the CQ's ring itself: it looks for
    /// `spin` without a system call, then sleeps on the ring's producer
    /// index, which the daemon's NIC thread wakes as it moves a
    /// completion in (no thread of this process in between, and no arm).
    /// `Ok(false)` for a CQ without a ring (or a delegated one).
    fn drive_cq(&self, cq: CqHandle, spin: Duration, timeout: Duration) -> Result<bool> {
        if self.gsi_done(cq) {
            return Ok(true);
        }
        match self.ring_wait(cq, spin, timeout) {
            None => Ok(false),
            Some(Ok(()) | Err(VerbsError::Timeout)) => Ok(true),
            Some(Err(e)) => Err(e),
        }
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        let attr = *attr;
        let layout = self
            .rings
            .as_ref()
            .and_then(|r| rings::Rings::srq_layout(&attr).map(|l| (r, l)));
        let Some((r, layout)) = layout else {
            return call!(self, Request::CreateSrq { pd, attr, ctx }, Reply::Srq { srq } => srq);
        };
        let (buf, ring) = layout?;
        let req = Request::CreateSrqRing {
            pd,
            attr,
            ctx,
            len: buf.len() as u64,
            ring,
        };
        let fd = shared_fd(&buf)?;
        let srq = match self.conn.call(&req, Some(fd)) {
            Ok(Reply::Srq { srq }) => srq,
            Ok(other) => return Err(unexpected("CreateSrqRing", &other)),
            // Rings beyond this client's memory limit: the socket serves.
            Err(VerbsError::OutOfResources(m)) if m == crate::server::MEMORY_LIMIT => {
                return call!(self, Request::CreateSrq { pd, attr, ctx }, Reply::Srq { srq } => srq);
            }
            Err(e) => return Err(e),
        };
        r.add_srq(srq.0, &attr, buf, ring)?;
        Ok(srq)
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        call!(self, Request::ModifySrq { srq, limit }, Reply::Unit {} => ())
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        call!(self, Request::QuerySrq { srq }, Reply::SrqAttr { attr } => attr)
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        call!(self, Request::DestroySrq { srq }, Reply::Unit {} => ())?;
        self.forget(srq.0);
        Ok(())
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        // QP1 is a place at the daemon's; QP0 (root's or the daemon's
        // user's, on an `ib` port nobody holds yet) goes on the socket.
        if init.qp_type == QpType::Gsi {
            return self.open_gsi(pd, init, ctx);
        }
        let init = *init;
        let layout = self
            .rings
            .as_ref()
            .and_then(|r| rings::Rings::qp_layout(&init).map(|l| (r, l)));
        let Some((r, layout)) = layout else {
            return call!(self, Request::CreateQp { pd, init, ctx }, Reply::Qp { qp } => qp);
        };
        let (buf, sq, rq) = layout?;
        let req = Request::CreateQpRing {
            pd,
            init,
            ctx,
            len: buf.len() as u64,
            sq,
            rq,
        };
        let fd = shared_fd(&buf)?;
        let qp = match self.conn.call(&req, Some(fd)) {
            Ok(Reply::Qp { qp }) => qp,
            Ok(other) => return Err(unexpected("CreateQpRing", &other)),
            // Rings beyond this client's memory limit: the socket serves.
            Err(VerbsError::OutOfResources(m)) if m == crate::server::MEMORY_LIMIT => {
                return call!(self, Request::CreateQp { pd, init, ctx }, Reply::Qp { qp } => qp);
            }
            Err(e) => return Err(e),
        };
        r.add_qp(qp.0, &init, pd.0, buf, sq, rq)?;
        Ok(qp)
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        if self.conn.local().gsis.contains_key(&qp.0.index) {
            return Ok(Qpn::GSI);
        }
        call!(self, Request::QpNum { qp }, Reply::Qpn { qpn } => qpn)
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        if let Some(g) = self.conn.local().gsis.get_mut(&qp.0.index) {
            if let Some(s) = attr.state {
                g.state = s;
            }
            if let Some(i) = attr.pkey_index {
                g.pkey_index = i;
            }
            return Ok(());
        }
        let attr = *attr;
        call!(self, Request::ModifyQp { qp, attr }, Reply::Unit {} => ())?;
        if let (Some(r), Some(state)) = (&self.rings, attr.state) {
            r.set_state(qp.0, state);
        }
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        if let Some(g) = self.conn.local().gsis.get(&qp.0.index) {
            return Ok(QpAttr {
                state: Some(g.state),
                pkey_index: Some(g.pkey_index),
                qkey: Some(rdma_types::Qkey::GSI),
                ..Default::default()
            });
        }
        call!(self, Request::QueryQp { qp }, Reply::QpAttr { attr } => attr)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        call!(self, Request::DestroyQp { qp }, Reply::Unit {} => ())?;
        self.forget(qp.0);
        self.conn.local().gsis.remove(&qp.0.index);
        Ok(())
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let attr = *attr;
        let ah = call!(self, Request::CreateAh { pd, attr }, Reply::Ah { ah } => ah)?;
        self.conn.local().ahs.insert(ah.0.index, attr.dgid);
        Ok(ah)
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        call!(self, Request::DestroyAh { ah }, Reply::Unit {} => ())?;
        self.conn.local().ahs.remove(&ah.0.index);
        Ok(())
    }

    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        let fd = shared_fd(buf)?;
        let req = Request::RegMr {
            pd,
            buf_addr: buf.addr(),
            buf_len: buf.len() as u64,
            addr,
            len,
            access,
            ctx,
        };
        let info = call!(self, req, Some(fd), Reply::Mr { info } => info)?;
        if let Some(r) = &self.rings {
            r.add_mr(info.handle.0, Some(pd.0), info.addr, info.len);
        }
        let mr = (buf.clone(), info.addr, info.len, info.lkey);
        self.conn.local().mrs.insert(info.handle.0.index, mr);
        Ok(info)
    }

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let fd = shared_fd(buf)?;
        let req = Request::ReregMr {
            mr,
            buf_addr: buf.addr(),
            buf_len: buf.len() as u64,
            addr,
            len,
            access,
        };
        let info = call!(self, req, Some(fd), Reply::Mr { info } => info)?;
        if let Some(r) = &self.rings {
            r.add_mr(mr.0, None, info.addr, info.len);
        }
        let held = (buf.clone(), info.addr, info.len, info.lkey);
        self.conn.local().mrs.insert(mr.0.index, held);
        Ok(info)
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        call!(self, Request::DeregMr { mr }, Reply::Unit {} => ())?;
        self.forget(mr.0);
        self.conn.local().mrs.remove(&mr.0.index);
        Ok(())
    }

    fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)> {
        call!(self, Request::AllocMw { pd, kind, ctx }, Reply::Mw { mw, rkey } => (mw, rkey))
    }

    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        let bind = *bind;
        call!(self, Request::BindMw { qp, bind }, Reply::Rkey { rkey } => rkey)
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        call!(self, Request::DeallocMw { mw }, Reply::Unit {} => ())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        // Receives posted before this send are the NIC's before it goes:
        // a send on the socket waits until the daemon took them (one on
        // the SQ ring needs not: the daemon's poller takes every receive
        // ring before the sends it has seen).
        let fence = || {
            if let Some(r) = &self.rings {
                r.fence();
            }
        };
        if self.conn.local().gsis.contains_key(&qp.0.index) {
            fence();
            return self.gsi_send(qp, wrs);
        }
        let socket = |wrs: &[SendWr]| {
            if !wrs.is_empty() {
                fence();
            }
            let wrs = wrs.to_vec();
            call!(self, Request::PostSend { qp, wrs }, Reply::Unit {} => ())
        };
        match &self.rings {
            Some(r) => r.post_send(qp.0, wrs, socket),
            None => socket(wrs),
        }
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        if let Some(g) = self.conn.local().gsis.get_mut(&qp.0.index) {
            g.recvs.extend(wrs.iter().cloned());
            return Ok(());
        }
        let socket = |wrs: &[RecvWr]| {
            let wrs = wrs.to_vec();
            call!(self, Request::PostRecv { qp, wrs }, Reply::Unit {} => ())
        };
        match &self.rings {
            Some(r) => r.post_recv(qp.0, false, wrs, socket),
            None => socket(wrs),
        }
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let socket = |wrs: &[RecvWr]| {
            let wrs = wrs.to_vec();
            call!(self, Request::PostSrqRecv { srq, wrs }, Reply::Unit {} => ())
        };
        match &self.rings {
            Some(r) => r.post_recv(srq.0, true, wrs, socket),
            None => socket(wrs),
        }
    }

    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        let req = Request::GsiRegister {
            qp,
            class,
            version,
            methods: methods.to_vec(),
            serve,
        };
        call!(self, req, Reply::Unit {} => ())
    }

    fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<()> {
        let req = Request::GsiListen {
            qp,
            service_id,
            listen,
        };
        call!(self, req, Reply::Unit {} => ())
    }
}

/// GSI QPs (see the `gsi` module).
impl Session {
    fn open_gsi(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        if init.port.is_some_and(|p| p != PortNum(1)) {
            return Err(VerbsError::InvalidArgument(
                "the NIC daemon's CAs have one port: a GSI QP of port 1".into(),
            ));
        }
        let qp = call!(self, Request::OpenGsi { pd, ctx }, Reply::Qp { qp } => qp)?;
        self.conn.local().gsis.insert(
            qp.0.index,
            gsi::Gsi {
                ctx,
                send_cq: init.send_cq.0.index,
                recv_cq: init.recv_cq.0.index,
                sig_all: init.sq_sig_all,
                state: rdma_types::QpState::Reset,
                pkey_index: 0,
                recvs: Default::default(),
            },
        );
        Ok(qp)
    }

    /// Each WR's MAD to the daemon; its completion here.
    fn gsi_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let bad = |index, cause: VerbsError| VerbsError::BadWr {
            index,
            cause: Box::new(cause),
        };
        for (i, wr) in wrs.iter().enumerate() {
            let (mad, dgid, pkey_index, cq, ctx, signal) = {
                let l = self.conn.local();
                let Some(g) = l.gsis.get(&qp.0.index) else {
                    return Err(VerbsError::InvalidHandle);
                };
                if g.state != rdma_types::QpState::Rts {
                    return Err(bad(i, VerbsError::InvalidState(g.state)));
                }
                let Some(ud) = wr.ud.filter(|u| u.remote_qpn == Qpn::GSI) else {
                    return Err(bad(
                        i,
                        VerbsError::InvalidArgument(
                            "a send on the NIC daemon's QP1 goes to QP1 of a port (UD, QPN 1)"
                                .into(),
                        ),
                    ));
                };
                let Some(dgid) = l.ahs.get(&ud.ah.0.index).copied() else {
                    return Err(bad(i, VerbsError::InvalidHandle));
                };
                let mad = l.gather(&wr.sges, 256).map_err(|e| bad(i, e))?;
                let signal = g.sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED);
                let pkey_index = wr.pkey_index.unwrap_or(g.pkey_index);
                (mad, dgid, pkey_index, g.send_cq, g.ctx, signal)
            };
            let req = Request::GsiSend {
                qp,
                dgid,
                pkey_index,
                mad,
            };
            call!(self, req, Reply::Unit {} => ()).map_err(|e| bad(i, e))?;
            if signal {
                let wc = WorkCompletion::new(
                    wr.wr_id,
                    rdma_types::WcStatus::Success,
                    rdma_types::WcOpcode::Send,
                    ctx,
                );
                // The handler hears on the event thread, never in a verb.
                self.conn.local().push(cq, wc);
                self.conn.kick(cq);
            }
        }
        Ok(())
    }
}
