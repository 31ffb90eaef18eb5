//! The daemon: clients on a Unix stream socket, each verb forwarded to
//! the in-process provider that owns the NIC.
//!
//! Each connection has a reader thread, which serves its requests in
//! order (a `WaitCq` waits on a thread of its own and answers when done),
//! and a writer thread, which sends the responses and the provider's
//! callbacks in the order they were queued: a callback never waits for a
//! slow client, it only queues a frame.
//!
//! Every object a client creates is an entry in one table: the
//! provider's handle, the owner (the connection), its kind, and the
//! handle the client was given instead (see [`crate::proto`]). A handle
//! that is not this client's and of this kind is refused with
//! `InvalidHandle`, so a client cannot reach another's objects by
//! guessing numbers. Work requests are checked the same way (a bind's
//! MW and MR, a datagram's AH); an inline SGE must lie in one of the
//! client's own registrations in the QP's PD and is posted with its
//! L_Key (the provider would read it from any region of the CA at that
//! address). L_Keys and R_Keys are the provider's own and checked by
//! it: an L_Key of another client's PD is a protection error there.
//!
//! Privilege: QP0 is refused to every client; QP1 is the daemon's own
//! (the `gsi` module, one per CA, opened for the first client that asks
//! with `OpenGsi`), where each client gets a place and the router of
//! [`crate::mads`] checks every MAD it sends (see there for what a
//! non-privileged client may not do); port changes (`modify_port`)
//! only to root and the daemon's own user. Each client
//! stays within [`Limits`] (QPs, registered memory) and 64 blocked
//! `wait_cq` calls; refusals are counted. The table is searched
//! linearly for a client's holdings and inline ranges: fine for
//! thousands of objects, an index per client when there are more.
//!
//! A client of protocol version 2 posts and polls through rings in
//! shared memory instead (see [`crate::proto`]; the daemon's side is the
//! `rings` module): a poller thread per connection takes its posts and
//! checks each as above; the provider's completion callback fills its
//! CQ rings.
//!
//! When a connection ends (the client closed it, exited or was killed),
//! the daemon stops its poller, then destroys what it left in the seeds' hierarchical order: QPs,
//! then MWs, AHs, SRQs, CQs and MRs, then PDs, then CAs. Its place at
//! QP1 goes first (with the QPs): the daemon ends the connections its
//! CM made there, established ones with a DREQ, others with a REJ, so
//! their peers learn at once; a peer of an RC QP connected some other
//! way sees it gone at its next request (retries exhausted:
//! `RetryExcErr`).

mod gsi;
mod rings;

use crate::proto::{self, Answer, Event, Kind, Reply, Request, OLDEST_VERSION, VERSION};
pub use crate::proto::{ClientReport, Peer};
use crate::ring::Ring;
use crate::sock::{send_frame, FrameReader, ReadError};
use rdma_access::subnet::Fabric;
use rdma_types::Lkey;
use rings::{ConnRings, CqRing, WqKind, WqRing};
use rnic::softroce::Personality;
use std::collections::HashMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use verbs::{
    AhHandle, AsyncEvent, CaHandle, CqHandle, EventHandler, Handle, MemBuf, MrHandle, MrInfo,
    MwHandle, PdHandle, Provider, QpHandle, ResourceKind, SendFlags, SendWr, SrqHandle, VerbsError,
    WorkCompletion,
};

type Result<T> = verbs::Result<T>;

/// How long a write to a client may block before the client is taken
/// for dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most frames waiting for one client's writer: a client that sends
/// requests (or arms CQs) and stops reading the answers is disconnected
/// when it has this many unread, instead of growing the daemon's memory
/// without bound.
const OUTBOX_FRAMES: usize = 4096;

/// A blocked `WaitCq` looks this often whether its CQ and its client are
/// still there: a CQ destroyed under it, or a client gone, ends it then
/// (it would hold its thread until its own timeout, which the client
/// chooses).
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Most `WaitCq`s of one client blocked at once (each holds a thread).
const MAX_WAITS: usize = 64;

/// Most completions one `PollCq` returns.
const MAX_POLL: u32 = 4096;

/// What one client may hold; a verb that would go beyond is refused
/// with `OutOfResources` naming the limit, and counted
/// ([`Server::limit_refusals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// QPs at once.
    pub max_qps: usize,
    /// Bytes of memory registered at once: the sum of its MRs' lengths
    /// and of its rings' memfds (a ring beyond it is refused, and the
    /// client provider makes that queue without rings).
    pub max_registered: u64,
}

impl Default for Limits {
    /// Generous: they stop a runaway client, not a storage target
    /// (16384 QPs, 64 GiB).
    fn default() -> Limits {
        Limits {
            max_qps: 16384,
            max_registered: 64 << 30,
        }
    }
}

struct Obj {
    owner: u64,
    kind: ResourceKind,
    raw: Handle,
    /// The client's index of the PD it lives in (QPs and MRs; else 0).
    pd: u32,
    /// An MR's registered range.
    range: Option<MrRange>,
    /// A PD's CA (the client's index; else 0).
    ca: u32,
    /// Bytes counted as registered besides an MR's range: the memfd of
    /// its rings (a CQ, QP or SRQ with rings), memory the daemon reads
    /// and writes for the client, or a registration in the client's own
    /// node ([`Request::CountMr`]), never reached.
    charged: u64,
}

/// What an MR registered: `[addr, addr+len)` under `lkey`.
#[derive(Clone, Copy)]
struct MrRange {
    addr: u64,
    len: u64,
    lkey: Lkey,
}

impl MrRange {
    fn holds(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && (addr - self.addr)
                .checked_add(len)
                .is_some_and(|e| e <= self.len)
    }
}

#[derive(Default)]
struct Table {
    objs: HashMap<u32, Obj>,
    next: u32,
    clients: HashMap<u64, Peer>,
    /// The members of shared ports lent to each client: NIC and block.
    lent: HashMap<u64, Vec<(rdma_types::Guid, u8)>>,
    /// The port each client's GSI QP is a place at, by its index.
    gsi: HashMap<u32, Arc<gsi::GsiPort>>,
}

/// The provider's "handle" of a client's GSI QP: none (the client's
/// place at the daemon's QP1 is no QP of the provider; a verb on it is
/// refused there as an unknown handle).
const GSI_RAW: Handle = Handle {
    index: u32::MAX,
    generation: u32::MAX,
};

/// The provider's "handle" of a QP or MR counted for its owner
/// ([`Request::CountQp`], [`Request::CountMr`]): none either, the object
/// is in the client's process; a verb on it is refused as an unknown
/// handle.
const COUNTED_RAW: Handle = Handle {
    index: u32::MAX - 1,
    generation: u32::MAX,
};

/// What lets a running daemon serve a NIC at another address: the
/// daemon's provider (`nicd` gives its soft RoCE NICs'), seen from the
/// server, which knows only `verbs::Provider`.
pub trait AddNics: Send + Sync {
    /// Makes the provider list a NIC at `ip` (or finds the one it has)
    /// on `fabric` (`None`: the daemon's default) and names its GUID.
    ///
    /// # Errors
    /// Why the provider will not (in words), or the NIC it has at `ip`
    /// cannot serve a tool of `fabric` (an `ib` NIC serves RoCE tools too).
    fn add(&self, ip: std::net::IpAddr, fabric: Option<Fabric>) -> Result<rdma_types::Guid>;
    /// Takes back a NIC [`AddNics::add`] made that would not open.
    fn forget(&self, guid: rdma_types::Guid);
    /// The NIC at `ip` that [`AddNics::add`] made is served now (the
    /// daemon holds it open): what runs on its port may start (an `ib`
    /// port's SMA).
    fn added(&self, ip: std::net::IpAddr, guid: rdma_types::Guid) {
        let _ = (ip, guid);
    }
}

/// What lets the NICs' own threads serve the clients' rings (the
/// daemon's provider, seen from the server): a ring of a QP or SRQ on a
/// NIC that has such a thread is taken in by it on each of its turns
/// ([`rnic::softroce::Feeder`]), so a client's post and the NIC's
/// receiving wake one thread, not two. Without it (or for a NIC without
/// such a thread) a thread per client polls its rings.
pub trait DataPath: Send + Sync {
    /// The NIC that holds the provider's QP or SRQ `of`, when its thread
    /// takes feeders.
    fn home(&self, of: Handle) -> Option<rdma_types::Guid>;
    /// Has the thread of NIC `guid` ask `f` on each turn; `None` when it
    /// will not.
    fn attach(
        &self,
        guid: rdma_types::Guid,
        f: Arc<dyn rnic::softroce::Feeder>,
    ) -> Option<rnic::softroce::FeederId>;
    /// Stops asking feeder `id` of NIC `guid`.
    fn detach(&self, guid: rdma_types::Guid, id: rnic::softroce::FeederId);
}

/// The soft RoCE NICs' threads take the rings of their QPs and SRQs.
impl DataPath for Arc<rnic::softroce::SoftRoce> {
    fn home(&self, of: Handle) -> Option<rdma_types::Guid> {
        self.ca_of(of).ok()
    }

    fn attach(
        &self,
        guid: rdma_types::Guid,
        f: Arc<dyn rnic::softroce::Feeder>,
    ) -> Option<rnic::softroce::FeederId> {
        self.add_feeder(guid, f).ok()
    }

    fn detach(&self, guid: rdma_types::Guid, id: rnic::softroce::FeederId) {
        self.remove_feeder(guid, id);
    }
}

/// The soft RoCE NICs: one at each address, named by it
/// ([`rnic::softroce::ip_guid`]), bound when the daemon claims it.
/// `ib` ones in the `ib` personality.
impl AddNics for Arc<rnic::softroce::SoftRoce> {
    fn add(&self, ip: std::net::IpAddr, fabric: Option<Fabric>) -> Result<rdma_types::Guid> {
        let ca = rnic::softroce::SoftCa::at(ip);
        let guid = ca.guid;
        if self.list_cas().contains(&guid) {
            let has = match self.personality(guid) {
                Personality::Roce => Fabric::Roce,
                Personality::Ib => Fabric::Ib,
            };
            return match fabric {
                Some(want) if !serves(has, want) => Err(bad(other_fabric(ip, has, want))),
                _ => Ok(guid),
            };
        }
        self.add_ca(ca)?;
        if fabric == Some(Fabric::Ib) {
            if let Err(e) = self.set_personality(guid, Personality::Ib) {
                let _ = self.forget_ca(guid);
                return Err(e);
            }
        }
        Ok(guid)
    }
    fn forget(&self, guid: rdma_types::Guid) {
        let _ = self.forget_ca(guid);
    }
}

fn fabric_word(f: Fabric) -> &'static str {
    match f {
        Fabric::Roce => "roce",
        Fabric::Ib => "ib",
    }
}

/// Whether a port on `has` serves a tool that asked for `want`: an `ib`
/// port serves RoCE tools too (RC and UD by GID, once an SM made it
/// ACTIVE: rperf beside ibsm and srptd on one managed port), but a RoCE
/// port has no SM to serve a tool of the managed subnet.
fn serves(has: Fabric, want: Fabric) -> bool {
    has == want || want == Fabric::Roce
}

/// The refusal of a NIC at `ip` on `want` where the daemon has one on
/// `has`.
fn other_fabric(ip: std::net::IpAddr, has: Fabric, want: Fabric) -> String {
    format!(
        "the NIC daemon serves {ip} on the {} fabric, not the {} one, and no subnet manager \
         runs there: give this tool another address (the daemon adds an {} port there), or \
         --own-nic",
        fabric_word(has),
        fabric_word(want),
        fabric_word(want)
    )
}

/// What lends clients a member of a NIC's shared port
/// ([`crate::shared::SharedPorts`] for the soft RoCE NICs), so a client
/// runs its own QPs' transport on the NIC's address.
pub trait PortLender: Send + Sync {
    /// A member of NIC `guid`'s port: its block and socket.
    ///
    /// # Errors
    /// In words: the NIC's port is not shared (an `ib` port), or every
    /// block is lent.
    fn lend(&self, guid: rdma_types::Guid) -> Result<(u8, std::os::fd::OwnedFd)>;
    /// Takes back block `block` of NIC `guid`'s port (its client left).
    fn give_back(&self, guid: rdma_types::Guid, block: u8);
}

/// Who holds each `ib` port's QP0 when no client does: the daemon's SMA
/// (`nicd --fabric ib`). A privileged client that asks for a QP0 (a
/// subnet manager on the port) is lent it: the SMA lets go of it, and
/// takes it back when the client's QP0 is gone.
pub trait Qp0Keeper: Send + Sync {
    /// Lets go of CA `guid`'s QP0 for a client; whether it held it.
    fn lend(&self, guid: rdma_types::Guid) -> bool;
    /// Takes CA `guid`'s QP0 back (its client destroyed it or left).
    fn take_back(&self, guid: rdma_types::Guid);
    /// Whether a client serves device management on CA `guid`'s port
    /// now (a DM agent registered, or the last one went): the port's
    /// PortInfo says IsDeviceManagementSupported while one does, as
    /// srp_daemon's walk asks of the SA.
    fn device_management(&self, guid: rdma_types::Guid, served: bool) {
        let _ = (guid, served);
    }
}

/// The daemon's state: the provider and every client's objects.
pub struct Server {
    provider: Arc<dyn Provider>,
    /// Mixed into handles, so an earlier daemon's are refused.
    salt: u32,
    uid: u32,
    st: Mutex<Table>,
    changed: Condvar,
    next_client: AtomicU64,
    /// `WaitCq`s blocked on threads now, of every client.
    blocked_waits: AtomicUsize,
    /// Objects of departed clients the provider refused to destroy.
    release_failures: AtomicU64,
    limits: Limits,
    limit_refusals: AtomicU64,
    /// The daemon's own opening of each CA ([`Server::claim_nics`],
    /// [`Server::add_nic`]).
    claimed: Mutex<Vec<(rdma_types::Guid, CaHandle)>>,
    /// What makes a NIC at another address ([`Server::add_nics_with`]).
    nic_maker: Mutex<Option<Arc<dyn AddNics>>>,
    /// Who holds QP0s no client holds ([`Server::keep_qp0_with`]).
    qp0_keeper: Mutex<Option<Arc<dyn Qp0Keeper>>>,
    /// QP0s lent to clients: the provider's QP and its CA.
    qp0_lent: Mutex<HashMap<Handle, rdma_types::Guid>>,
    /// Ports whose keeper was last told that a client serves device
    /// management there.
    dm_served: Mutex<std::collections::HashSet<rdma_types::Guid>>,
    /// Ring entries and indices refused ([`Server::ring_refusals`]).
    ring_refusals: AtomicU64,
    /// How long a ring poller spins after its last work, in ns.
    ring_spin_ns: AtomicU64,
    /// The NICs' threads that take rings in ([`Server::set_data_path`]).
    data_path: Mutex<Option<Arc<dyn DataPath>>>,
    /// Lends members of the NICs' shared ports ([`Request::SharePort`]).
    lender: Mutex<Option<Arc<dyn PortLender>>>,
    /// Ring poller threads running ([`Server::ring_pollers`]).
    ring_pollers: AtomicUsize,
    /// The daemon's QP1 of each CA, opened for the first client that
    /// asks ([`Request::OpenGsi`]).
    gsi_ports: Mutex<HashMap<rdma_types::Guid, Arc<gsi::GsiPort>>>,
    /// Registrations, listens and MADs of clients refused at QP1.
    gsi_refusals: AtomicU64,
}

/// The refusal of memory (registered or rings) beyond a client's
/// [`Limits::max_registered`].
pub const MEMORY_LIMIT: &str = "this client's registered memory limit (nicd --max-registered)";

/// How long a ring poller spins after its last work by default: short,
/// as a spinning poller takes the CPU its clients and the NIC need on a
/// small machine (2 loaded cores: a 64-byte ping-pong 110-125 us p50 at
/// 0-10 us, 160-220 us at 50 us). A stream of posts keeps it busy
/// anyway, and the posts that find it asleep share one doorbell.
pub const DEFAULT_RING_SPIN: Duration = Duration::from_micros(5);

/// A frame for a client, and the descriptor it carries.
type Framed = (Vec<u8>, Option<std::os::fd::OwnedFd>);

/// Where a connection's frames go: to its writer thread, until the
/// connection ends.
struct Outbox {
    tx: Mutex<Option<SyncSender<Framed>>>,
    /// `WaitCq`s waiting on threads of their own.
    waits: AtomicUsize,
    /// The client's socket, shut down when it leaves `OUTBOX_FRAMES`
    /// frames unread (its reader then ends and its resources go).
    sock: UnixStream,
    client: u64,
}

impl Outbox {
    fn send(&self, frame: Vec<u8>) {
        self.send_with(frame, None);
    }
    /// [`Outbox::send`] with a descriptor (`SCM_RIGHTS`).
    fn send_with(&self, frame: Vec<u8>, fd: Option<std::os::fd::OwnedFd>) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = &*tx else { return };
        if let Err(TrySendError::Full(_)) = t.try_send((frame, fd)) {
            tracing::warn!(
                "nicd: client {} left {OUTBOX_FRAMES} answers and events unread: disconnected \
                 (its resources are released)",
                self.client
            );
            tx.take();
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }
    fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
    /// Whether the client is still served (not closed, not cut off).
    fn is_open(&self) -> bool {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// What a request is served with: who asks, where its frames go, its
/// rings.
struct Conn<'a> {
    peer: &'a Peer,
    out: &'a Arc<Outbox>,
    rings: &'a Arc<ConnRings>,
}

/// The handler the daemon opens a CA with for a client: each callback
/// becomes an event frame for that client's CA.
struct Forward {
    out: Arc<Outbox>,
    ca: CaHandle,
    rings: Arc<ConnRings>,
}

impl Forward {
    fn event(&self, e: Event) {
        self.out.send(proto::frame(Kind::Event, 0, &e));
    }
}

impl EventHandler for Forward {
    fn on_completion(&self, cq_ctx: u64) {
        if !self.rings.on_completion(self.ca, cq_ctx) {
            return;
        }
        self.event(Event::Completion {
            ca: self.ca,
            cq_ctx,
        });
    }
    fn on_async_event(&self, event: AsyncEvent) {
        self.event(Event::Async { ca: self.ca, event });
    }
    fn on_destroyed(&self, kind: ResourceKind, ctx: u64) {
        self.event(Event::Destroyed {
            ca: self.ca,
            kind,
            ctx,
        });
    }
}

fn kind_code(k: ResourceKind) -> u32 {
    match k {
        ResourceKind::Ca => 1,
        ResourceKind::Pd => 2,
        ResourceKind::Cq => 3,
        ResourceKind::Srq => 4,
        ResourceKind::Qp => 5,
        ResourceKind::Ah => 6,
        ResourceKind::Mr => 7,
        ResourceKind::Mw => 8,
    }
}

/// The seeds' hierarchical order of release: children before parents.
fn release_rank(k: ResourceKind) -> u8 {
    match k {
        ResourceKind::Qp => 0,
        ResourceKind::Mw => 1,
        ResourceKind::Ah => 2,
        ResourceKind::Srq => 3,
        ResourceKind::Cq => 4,
        ResourceKind::Mr => 5,
        ResourceKind::Pd => 6,
        ResourceKind::Ca => 7,
    }
}

const KINDS: [ResourceKind; 8] = [
    ResourceKind::Ca,
    ResourceKind::Pd,
    ResourceKind::Cq,
    ResourceKind::Srq,
    ResourceKind::Qp,
    ResourceKind::Ah,
    ResourceKind::Mr,
    ResourceKind::Mw,
];

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

impl Server {
    /// A daemon serving `provider`'s CAs, with the default [`Limits`].
    pub fn new(provider: Arc<dyn Provider>) -> Arc<Server> {
        Server::with_limits(provider, Limits::default())
    }

    /// A daemon serving `provider`'s CAs, each client within `limits`.
    pub fn with_limits(provider: Arc<dyn Provider>, limits: Limits) -> Arc<Server> {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let salt = (t.as_nanos() as u32 ^ std::process::id().rotate_left(16)) & 0x00ff_ffff;
        Arc::new(Server {
            provider,
            salt,
            uid: crate::euid(),
            // Indices start apart from an earlier daemon's too (at a
            // place of their own), so a consumer's state kept by index
            // after it connected again seldom meets an old index for a
            // new object; the generation refuses old handles anyway.
            st: Mutex::new(Table {
                next: salt % rdma_access::multi::INDEX_LIMIT,
                ..Table::default()
            }),
            changed: Condvar::new(),
            next_client: AtomicU64::new(1),
            blocked_waits: AtomicUsize::new(0),
            release_failures: AtomicU64::new(0),
            limits,
            limit_refusals: AtomicU64::new(0),
            claimed: Mutex::new(Vec::new()),
            nic_maker: Mutex::new(None),
            qp0_keeper: Mutex::new(None),
            qp0_lent: Mutex::new(HashMap::new()),
            dm_served: Mutex::new(std::collections::HashSet::new()),
            ring_refusals: AtomicU64::new(0),
            ring_spin_ns: AtomicU64::new(DEFAULT_RING_SPIN.as_nanos() as u64),
            data_path: Mutex::new(None),
            lender: Mutex::new(None),
            ring_pollers: AtomicUsize::new(0),
            gsi_ports: Mutex::new(HashMap::new()),
            gsi_refusals: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens every CA of the provider for the daemon itself and keeps it
    /// open: each NIC's UDP socket is bound now, so a start on an address
    /// another process holds fails at once, and stays bound between
    /// clients (no other process can take the port while none is
    /// connected).
    ///
    /// # Errors
    /// The first CA that would not open, and why (the others are closed
    /// again).
    pub fn claim_nics(&self) -> std::result::Result<(), (rdma_types::Guid, VerbsError)> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        for guid in self.provider.list_cas() {
            match self
                .provider
                .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
            {
                Ok(ca) => claimed.push((guid, ca)),
                Err(e) => {
                    for (_, ca) in claimed.drain(..) {
                        let _ = self.provider.close_ca(ca);
                    }
                    return Err((guid, e));
                }
            }
        }
        Ok(())
    }

    /// Lets the running daemon serve NICs at more addresses
    /// ([`Server::add_nic`], a client's [`Request::AddNic`]).
    pub fn add_nics_with(&self, maker: Arc<dyn AddNics>) {
        *self.nic_maker.lock().unwrap_or_else(|e| e.into_inner()) = Some(maker);
    }

    /// Has `keeper` hold the QP0s no client holds, and lend them to
    /// privileged clients that ask ([`Qp0Keeper`]).
    pub fn keep_qp0_with(&self, keeper: Arc<dyn Qp0Keeper>) {
        *self.qp0_keeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(keeper);
    }

    /// After a registration or a departure at `port`'s QP1: tells the
    /// keeper when device management became served or unserved there.
    fn note_dm(&self, port: &gsi::GsiPort) {
        let (guid, now) = (port.guid(), port.serves_dm());
        let changed = {
            let mut s = self.dm_served.lock().unwrap_or_else(|e| e.into_inner());
            if now {
                s.insert(guid)
            } else {
                s.remove(&guid)
            }
        };
        let keeper = self
            .qp0_keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let (true, Some(k)) = (changed, keeper) {
            k.device_management(guid, now);
        }
    }

    /// A client's QP `raw` is gone: if it was a lent QP0, its keeper
    /// takes it back (on a thread of its own: it makes requests of the
    /// daemon).
    fn qp0_returned(&self, raw: Handle) {
        let Some(guid) = self
            .qp0_lent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&raw)
        else {
            return;
        };
        let keeper = self
            .qp0_keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(k) = keeper {
            let _ = std::thread::Builder::new()
                .name("nicd-qp0-back".into())
                .spawn(move || k.take_back(guid));
        }
    }

    /// Serves a NIC at `ip` from now on, as [`Server::claim_nics`] does
    /// those it started with (its socket bound now), and names its GUID;
    /// one it serves already is named at once.
    ///
    /// # Errors
    /// `NotSupported` when the daemon was not given [`Server::add_nics_with`];
    /// the maker's refusal, or why the new NIC would not open (the
    /// address is not this host's, another process holds its port), in
    /// words naming the address.
    pub fn add_nic(&self, ip: std::net::IpAddr) -> Result<rdma_types::Guid> {
        self.add_nic_on(ip, None)
    }

    /// [`Server::add_nic`] on `fabric` (`None`: the daemon's default).
    pub fn add_nic_on(
        &self,
        ip: std::net::IpAddr,
        fabric: Option<Fabric>,
    ) -> Result<rdma_types::Guid> {
        let maker = self
            .nic_maker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(maker) = maker else {
            let guid = rnic::softroce::ip_guid(ip);
            if claimed.iter().any(|(g, _)| *g == guid) {
                return Ok(guid);
            }
            return Err(VerbsError::NotSupported(
                "this daemon serves only the NICs it started with (restart it with another --ip)",
            ));
        };
        // A NIC the maker has already is named, its fabric checked.
        let guid = maker.add(ip, fabric)?;
        if claimed.iter().any(|(g, _)| *g == guid) {
            return Ok(guid);
        }
        match self
            .provider
            .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
        {
            Ok(ca) => {
                claimed.push((guid, ca));
                drop(claimed);
                tracing::info!("nicd: serving a NIC at {ip} ({guid:?}) from now on");
                maker.added(ip, guid);
                Ok(guid)
            }
            Err(e) => {
                maker.forget(guid);
                Err(bad(format!("no NIC at {ip}: {e}")))
            }
        }
    }

    /// Accepts clients on `listener` until it fails, each on threads of
    /// its own (see the module docs).
    pub fn serve(self: &Arc<Self>, listener: UnixListener) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("nicd-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => {
                            let me = me.clone();
                            let _ = std::thread::Builder::new()
                                .name("nicd-client".into())
                                .spawn(move || me.run_client(s));
                        }
                        Err(e) => {
                            tracing::error!("nicd: accepting a client: {e}");
                            return;
                        }
                    }
                }
            })
            .expect("spawn the accept thread")
    }

    /// `WaitCq` calls blocked on threads of their own now (each ends with
    /// its completion, its timeout, its CQ or its client).
    pub fn blocked_waits(&self) -> usize {
        self.blocked_waits.load(Ordering::Relaxed)
    }

    /// The clients connected now and what each holds.
    pub fn clients(&self) -> Vec<ClientReport> {
        let t = self.lock();
        report(&t)
    }

    /// How many objects of departed clients the provider refused to
    /// destroy (each logged): 0 unless the release order is wrong.
    pub fn release_failures(&self) -> u64 {
        self.release_failures.load(Ordering::Relaxed)
    }

    /// How many ring entries or indices were refused (each ring that
    /// had one is dead, its QP in the error state; see [`crate::proto`]).
    pub fn ring_refusals(&self) -> u64 {
        self.ring_refusals.load(Ordering::Relaxed)
    }

    /// How long each client's ring poller spins after its last work
    /// before it sleeps on the client's doorbell ([`DEFAULT_RING_SPIN`]).
    pub fn set_ring_spin(&self, spin: Duration) {
        let ns = spin.as_nanos().min(u64::MAX as u128) as u64;
        self.ring_spin_ns.store(ns, Ordering::Relaxed);
    }

    fn ring_spin(&self) -> Duration {
        Duration::from_nanos(self.ring_spin_ns.load(Ordering::Relaxed))
    }

    /// How many clients' rings a thread of their own polls now (with a
    /// [`DataPath`], only those of clients with queues on two NICs).
    pub fn ring_pollers(&self) -> usize {
        self.ring_pollers.load(Ordering::Relaxed)
    }

    /// Lends clients members of the NICs' shared ports from now on
    /// ([`Request::SharePort`]).
    pub fn lend_ports_with(&self, l: Arc<dyn PortLender>) {
        *self.lender.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
    }

    /// Lends client `me` a member of the shared port of its CA `ca`, and
    /// notes it in `lent` (given back when the client goes).
    fn share_port(&self, me: u64, ca: CaHandle) -> Result<(Reply, std::os::fd::OwnedFd)> {
        let raw = CaHandle(self.raw(me, ResourceKind::Ca, ca.0)?);
        let guid = self.provider.query_ca(raw)?.guid;
        let lender = self
            .lender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let lender = lender.ok_or(VerbsError::NotSupported(
            "this daemon lends no shared ports",
        ))?;
        let held = self.lock().lent.get(&me).cloned().unwrap_or_default();
        if let Some((_, b)) = held.iter().find(|(g, _)| *g == guid) {
            return Err(bad(format!(
                "this client holds block {b} of the port already: one member per client and NIC"
            )));
        }
        let (block, fd) = lender.lend(guid)?;
        self.lock().lent.entry(me).or_default().push((guid, block));
        let qpns = roce_udp::block_qpns(block);
        Ok((
            Reply::SharedPort {
                block,
                first_qpn: qpns.start,
                end_qpn: qpns.end,
            },
            fd,
        ))
    }

    /// Has the NICs' own threads serve the rings of clients that connect
    /// from now on ([`DataPath`]): `nicd` gives its soft RoCE provider.
    pub fn set_data_path(&self, d: Arc<dyn DataPath>) {
        *self.data_path.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
    }

    /// How many registrations, listens and MADs of clients were refused
    /// at the shared QP1 (see [`crate::mads`]).
    pub fn gsi_refusals(&self) -> u64 {
        self.gsi_refusals.load(Ordering::Relaxed)
    }

    /// The counters of the shared QP1 of CA `guid`, once a client opened
    /// it.
    pub fn gsi_stats(&self, guid: rdma_types::Guid) -> Option<crate::mads::Stats> {
        let ports = self.gsi_ports.lock().unwrap_or_else(|e| e.into_inner());
        ports.get(&guid).map(|p| p.stats())
    }

    /// The shared QP1 of the CA of client `me`'s PD `pd` (opened now if
    /// no client opened it before).
    fn gsi_port(&self, me: u64, pd: PdHandle) -> Result<Arc<gsi::GsiPort>> {
        let ca = self.pd_ca(me, pd)?;
        let raw = CaHandle(self.raw(me, ResourceKind::Ca, ca.0)?);
        let guid = self.provider.query_ca(raw)?.guid;
        let mut ports = self.gsi_ports.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = ports.get(&guid) {
            return Ok(p.clone());
        }
        let port = gsi::GsiPort::open(self.provider.clone(), guid)?;
        ports.insert(guid, port.clone());
        Ok(port)
    }

    /// The port of client `me`'s GSI QP `qp`.
    fn gsi_of(&self, me: u64, qp: QpHandle) -> Result<Arc<gsi::GsiPort>> {
        if self.raw(me, ResourceKind::Qp, qp.0)? != GSI_RAW {
            return Err(bad(
                "not a GSI QP: MAD services are for the QP1 OpenGsi gave",
            ));
        }
        self.lock()
            .gsi
            .get(&qp.0.index)
            .cloned()
            .ok_or(VerbsError::InvalidHandle)
    }

    /// A refusal at QP1 in the verbs' words, counted.
    fn gsi_refused(&self, r: crate::mads::Refused) -> VerbsError {
        use crate::mads::Refused as R;
        self.gsi_refusals.fetch_add(1, Ordering::Relaxed);
        match r {
            R::Taken { .. } => VerbsError::Busy("served by another nicd client"),
            R::Listened(_) => VerbsError::Busy("listened on by another nicd client"),
            other => bad(other.to_string()),
        }
    }

    /// How many verbs were refused for a client's [`Limits`].
    pub fn limit_refusals(&self) -> u64 {
        self.limit_refusals.load(Ordering::Relaxed)
    }

    /// Refuses with `what` (counted) unless `within`.
    fn limit(&self, within: bool, what: &'static str) -> Result<()> {
        if within {
            return Ok(());
        }
        self.limit_refusals.fetch_add(1, Ordering::Relaxed);
        Err(VerbsError::OutOfResources(what))
    }

    /// Client `owner`'s QPs and registered bytes, leaving out MR `but`.
    fn holdings(&self, owner: u64, but: Option<u32>) -> (usize, u64) {
        let t = self.lock();
        let mine = t.objs.iter().filter(|(_, o)| o.owner == owner);
        mine.fold((0, 0), |(q, b), (i, o)| {
            let b = b + o.charged;
            match (o.kind, o.range) {
                (ResourceKind::Qp, _) => (q + 1, b),
                (ResourceKind::Mr, Some(r)) if Some(*i) != but => (q, b + r.len),
                _ => (q, b),
            }
        })
    }

    /// Objects held by all clients (connected or being cleaned up).
    pub fn live_objects(&self) -> usize {
        self.lock().objs.len()
    }

    /// Waits until `pred` holds of the clients and the number of live
    /// objects, at most `timeout`; whether it does.
    pub fn wait_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&[ClientReport], usize) -> bool,
    ) -> bool {
        let end = Instant::now() + timeout;
        let mut t = self.lock();
        loop {
            if pred(&report(&t), t.objs.len()) {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            t = self
                .changed
                .wait_timeout(t, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn run_client(self: Arc<Self>, sock: UnixStream) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let peer = match daemon_ctl::peer_cred(&sock) {
            Ok(c) => Peer {
                id,
                pid: c.pid,
                uid: c.uid,
                gid: c.gid,
            },
            Err(e) => {
                tracing::warn!("nicd: a client without credentials ({e}): closed");
                return;
            }
        };
        let (Ok(rsock), Ok(wsock), Ok(osock)) =
            (sock.try_clone(), sock.try_clone(), sock.try_clone())
        else {
            return;
        };
        tracing::info!(
            "nicd: client {id} connected (pid {}, uid {})",
            peer.pid,
            peer.uid
        );
        self.lock().clients.insert(id, peer);
        self.changed.notify_all();
        // A client that stops reading holds up only its own writer, and
        // not for long: its frames are dropped with the connection.
        let _ = wsock.set_write_timeout(Some(WRITE_TIMEOUT));
        let (tx, rx) = sync_channel(OUTBOX_FRAMES);
        let out = Arc::new(Outbox {
            tx: Mutex::new(Some(tx)),
            waits: AtomicUsize::new(0),
            sock: osock,
            client: id,
        });
        let writer = std::thread::Builder::new()
            .name("nicd-writer".into())
            .spawn(move || {
                for (f, fd) in rx {
                    let fd: Option<std::os::fd::OwnedFd> = fd;
                    if send_frame(&wsock, &f, fd.as_ref().map(std::os::fd::AsFd::as_fd)).is_err() {
                        break;
                    }
                }
            });
        let mut reader = FrameReader::new(rsock);
        let mut hello = false;
        let mut version = 0;
        let data_path = self
            .data_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rings = ConnRings::new(self.provider.clone(), out.clone(), data_path);
        loop {
            let f = match reader.next() {
                Ok(f) => f,
                Err(ReadError::Closed) => break,
                Err(ReadError::Io(e)) => {
                    tracing::info!("nicd: client {id}: {e}");
                    break;
                }
                Err(ReadError::Framing(e)) => {
                    tracing::warn!("nicd: client {id}: {e}: closed");
                    break;
                }
            };
            let (kind, seq, body) = match proto::split(&f) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("nicd: client {id}: {e}: closed");
                    break;
                }
            };
            let req = match kind {
                Kind::Request => proto::decode::<Request>(body),
                _ => Err(proto::ProtoError::BadValue("frame kind from a client")),
            };
            let req = match req {
                Ok(r) => r,
                Err(e) => {
                    // The frame's descriptor, if any, belongs to nothing.
                    while reader.take_fd().is_some() {}
                    let a: Answer = Err(bad(format!("malformed request: {e}")));
                    out.send(proto::frame(Kind::Response, seq, &a));
                    continue;
                }
            };
            if !hello {
                let a: Answer = match req {
                    Request::Hello { version: v } if (OLDEST_VERSION..=VERSION).contains(&v) => {
                        version = v;
                        Ok(Reply::Hello {
                            version: v,
                            pid: std::process::id(),
                        })
                    }
                    Request::Hello { version } => Err(bad(format!(
                        "protocol version {version} not served: this nicd speaks versions \
                         {OLDEST_VERSION} to {VERSION}"
                    ))),
                    _ => Err(bad("the first request must be Hello")),
                };
                hello = a.is_ok();
                out.send(proto::frame(Kind::Response, seq, &a));
                if !hello {
                    break;
                }
                continue;
            }
            let ring_req = matches!(
                req,
                Request::Doorbell {}
                    | Request::CompletionNotice {}
                    | Request::CreateCqRing { .. }
                    | Request::CreateQpRing { .. }
                    | Request::CreateSrqRing { .. }
            );
            if ring_req && version < 2 {
                while reader.take_fd().is_some() {}
                let a: Answer = Err(bad(format!(
                    "rings need protocol version 2; this connection said {version} in its Hello"
                )));
                out.send(proto::frame(Kind::Response, seq, &a));
                continue;
            }
            if let Request::SharePort { ca } = req {
                let (a, fd): (Answer, _) = match self.share_port(id, ca) {
                    Ok((r, fd)) => (Ok(r), Some(fd)),
                    Err(e) => (Err(e), None),
                };
                out.send_with(proto::frame(Kind::Response, seq, &a), fd);
                continue;
            }
            let conn = Conn {
                peer: &peer,
                out: &out,
                rings: &rings,
            };
            if let Some(a) = self.answer(&conn, seq, req, &mut reader) {
                out.send(proto::frame(Kind::Response, seq, &a));
            }
        }
        // The poller first: it posts with handles released below.
        rings.stop();
        self.release_all(id);
        let lender = self
            .lender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let lent = self.lock().lent.remove(&id).unwrap_or_default();
        for (guid, block) in lent {
            if let Some(l) = &lender {
                l.give_back(guid, block);
            }
        }
        out.close();
        if let Ok(w) = writer {
            let _ = w.join();
        }
        let _ = sock.shutdown(std::net::Shutdown::Both);
        self.lock().clients.remove(&id);
        self.changed.notify_all();
        tracing::info!("nicd: client {id} (pid {}) gone", peer.pid);
    }

    /// Destroys every object of client `id`, children first.
    fn release_all(&self, id: u64) {
        let mut mine: Vec<(u8, u32, ResourceKind, Handle)> = self
            .lock()
            .objs
            .iter()
            .filter(|(_, o)| o.owner == id)
            .map(|(i, o)| (release_rank(o.kind), *i, o.kind, o.raw))
            .collect();
        mine.sort_by_key(|(rank, index, ..)| (*rank, *index));
        let p = &self.provider;
        for (_, index, kind, raw) in mine {
            let r = match kind {
                ResourceKind::Qp if raw == GSI_RAW => {
                    let port = self.lock().gsi.remove(&index);
                    if let Some(port) = port {
                        port.leave(id);
                        self.note_dm(&port);
                    }
                    Ok(())
                }
                ResourceKind::Qp | ResourceKind::Mr if raw == COUNTED_RAW => Ok(()),
                ResourceKind::Qp => {
                    let r = p.destroy_qp(QpHandle(raw));
                    self.qp0_returned(raw);
                    r
                }
                ResourceKind::Mw => p.dealloc_mw(MwHandle(raw)),
                ResourceKind::Ah => p.destroy_ah(AhHandle(raw)),
                ResourceKind::Srq => p.destroy_srq(SrqHandle(raw)),
                ResourceKind::Cq => p.destroy_cq(CqHandle(raw)),
                ResourceKind::Mr => p.dereg_mr(MrHandle(raw)),
                ResourceKind::Pd => p.dealloc_pd(PdHandle(raw)),
                ResourceKind::Ca => p.close_ca(CaHandle(raw)),
            };
            // A handle already dead (a CA removed under it) is released.
            if let Err(e) = r {
                if e != VerbsError::InvalidHandle {
                    self.release_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("nicd: client {id}: releasing a {kind:?}: {e}");
                }
            }
            self.lock().objs.remove(&index);
            self.changed.notify_all();
        }
    }

    fn generation(&self, kind: ResourceKind) -> u32 {
        self.salt | (kind_code(kind) << 24)
    }

    /// The provider's handle for client `owner`'s handle `h` of `kind`.
    fn raw(&self, owner: u64, kind: ResourceKind, h: Handle) -> Result<Handle> {
        let t = self.lock();
        match t.objs.get(&h.index) {
            Some(o)
                if o.owner == owner && o.kind == kind && h.generation == self.generation(kind) =>
            {
                Ok(o.raw)
            }
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    /// Refuses (counted) a QP beyond client `me`'s limit.
    fn within_qps(&self, me: u64) -> Result<()> {
        let (qps, _) = self.holdings(me, None);
        self.limit(
            qps < self.limits.max_qps,
            "this client's QP limit (nicd --max-qps)",
        )
    }

    /// Whether `peer` is root or the daemon's own user: it may change
    /// ports, list the clients, and serve every class at QP1 but the
    /// SMPs'.
    fn privileged(&self, peer: &Peer) -> bool {
        peer.uid == 0 || peer.uid == self.uid
    }

    /// Adding a NIC: root and the daemon's user only.
    fn may_add_nic(&self, peer: &Peer) -> Result<()> {
        if self.privileged(peer) {
            return Ok(());
        }
        Err(bad(format!(
            "adding a NIC needs root or the daemon's user (uid {}); client uid {}",
            self.uid, peer.uid
        )))
    }

    /// `modify_port` for client `me`: root or the daemon's user only.
    fn port_change(
        &self,
        me: u64,
        peer: &Peer,
        ca: CaHandle,
        port: rdma_types::PortNum,
        modify: verbs::PortModify,
    ) -> Result<Reply> {
        if !self.privileged(peer) {
            return Err(bad(format!(
                "port changes need root or the daemon's user (uid {}); client uid {}",
                self.uid, peer.uid
            )));
        }
        let raw = self.raw(me, ResourceKind::Ca, ca.0)?;
        self.provider.modify_port(CaHandle(raw), port, &modify)?;
        Ok(Reply::Unit {})
    }

    /// Refuses a registration (or rings) of `len` more bytes (in place
    /// of MR `but`) beyond the client's limit.
    fn within_registered(&self, owner: u64, but: Option<u32>, len: u64) -> Result<()> {
        let (_, held) = self.holdings(owner, but);
        self.limit(
            held.checked_add(len)
                .is_some_and(|t| t <= self.limits.max_registered),
            MEMORY_LIMIT,
        )
    }

    /// [`Server::raw`], and the client's index of the object's PD.
    fn raw_in_pd(&self, owner: u64, kind: ResourceKind, h: Handle) -> Result<(Handle, u32)> {
        let raw = self.raw(owner, kind, h)?;
        let pd = self.lock().objs.get(&h.index).map_or(0, |o| o.pd);
        Ok((raw, pd))
    }

    /// A new entry's client handle (reserved before the provider is asked,
    /// so a CA's handler knows it). Its index is below
    /// `multi::INDEX_LIMIT` and not 0, so a set of providers can hold a
    /// client of ours beside others (`rdma_access::multi::Providers`
    /// tags the top 8 bits).
    fn reserve(&self, kind: ResourceKind) -> Handle {
        let mut t = self.lock();
        loop {
            t.next = (t.next + 1) % rdma_access::multi::INDEX_LIMIT;
            if t.next != 0 && !t.objs.contains_key(&t.next) {
                return Handle {
                    index: t.next,
                    generation: self.generation(kind),
                };
            }
        }
    }

    fn insert(
        &self,
        owner: u64,
        kind: ResourceKind,
        h: Handle,
        raw: Handle,
        pd: u32,
        range: Option<MrRange>,
    ) {
        self.lock().objs.insert(
            h.index,
            Obj {
                owner,
                kind,
                raw,
                pd,
                range,
                ca: 0,
                charged: 0,
            },
        );
        self.changed.notify_all();
    }

    fn add(&self, owner: u64, kind: ResourceKind, raw: Handle, pd: u32) -> Handle {
        let h = self.reserve(kind);
        self.insert(owner, kind, h, raw, pd, None);
        h
    }

    /// Destroys client `owner`'s `h` of `kind` with `destroy`; the entry
    /// goes when the provider agrees.
    fn destroy(
        &self,
        owner: u64,
        kind: ResourceKind,
        h: Handle,
        destroy: impl FnOnce(Handle) -> Result<()>,
    ) -> Answer {
        let raw = self.raw(owner, kind, h)?;
        destroy(raw)?;
        self.lock().objs.remove(&h.index);
        self.changed.notify_all();
        Ok(Reply::Unit {})
    }

    /// The provider's form of a client's send WR on a QP of its PD
    /// `pd`: its handles translated; each inline piece must lie in one of
    /// the client's registrations in that PD, whose L_Key it is given
    /// (the provider reads inline data from whichever region of the CA
    /// holds the address when the L_Key does not: another client's, at
    /// the same address in its own process, must never be that region).
    fn send_wr(&self, owner: u64, pd: u32, mut wr: SendWr) -> Result<SendWr> {
        if let Some(ud) = &mut wr.ud {
            ud.ah = AhHandle(self.raw(owner, ResourceKind::Ah, ud.ah.0)?);
        }
        if let Some(b) = &mut wr.bind_mw {
            b.mw = MwHandle(self.raw(owner, ResourceKind::Mw, b.mw.0)?);
            b.mr = MrHandle(self.raw(owner, ResourceKind::Mr, b.mr.0)?);
        }
        if wr.flags.contains(SendFlags::INLINE) {
            let t = self.lock();
            for s in &mut wr.sges {
                let mr = t.objs.values().find_map(|o| {
                    o.range.filter(|r| {
                        o.owner == owner && o.pd == pd && r.holds(s.addr, s.length as u64)
                    })
                });
                let Some(mr) = mr else {
                    return Err(bad(
                        "inline data outside this client's registered memory in the QP's PD",
                    ));
                };
                s.lkey = mr.lkey;
            }
        }
        Ok(wr)
    }

    /// `create_qp` for client `me`: the provider's QP and the client's
    /// handle.
    /// Client `me`'s QP (`privileged`: root's or the daemon's user's).
    /// QP1 is the daemon's own (a client's place at it is `OpenGsi`);
    /// QP0 of an `ib` port goes whole to the first privileged client
    /// that asks, on `nicd --fabric ib` the daemon's own SMA.
    fn create_qp(
        &self,
        me: u64,
        privileged: bool,
        pd: PdHandle,
        mut init: verbs::QpInit,
        ctx: u64,
    ) -> Result<(QpHandle, Handle)> {
        use ResourceKind as K;
        match init.qp_type {
            rdma_types::QpType::Gsi => {
                return Err(VerbsError::NotSupported(
                    "QP1 is nicd's own: a client's place at QP1 is OpenGsi \
                     (NicdProvider::create_qp of a GSI QP asks for it)",
                ))
            }
            rdma_types::QpType::Smi if !privileged => {
                return Err(bad(format!(
                    "QP0 needs root or the daemon's user (uid {}), and nicd --fabric ib serves \
                     its ports' SMPs itself",
                    self.uid
                )))
            }
            _ => {}
        }
        self.within_qps(me)?;
        init.send_cq = CqHandle(self.raw(me, K::Cq, init.send_cq.0)?);
        init.recv_cq = CqHandle(self.raw(me, K::Cq, init.recv_cq.0)?);
        if let Some(s) = &mut init.srq {
            *s = SrqHandle(self.raw(me, K::Srq, s.0)?);
        }
        let raw_pd = PdHandle(self.raw(me, K::Pd, pd.0)?);
        let raw = match self.provider.create_qp(raw_pd, &init, ctx) {
            Err(VerbsError::Busy(_)) if init.qp_type == rdma_types::QpType::Smi => {
                self.borrow_qp0(me, pd, raw_pd, &init, ctx)?
            }
            r => r?,
        };
        Ok((raw, self.add(me, K::Qp, raw.0, pd.0.index)))
    }

    /// QP0 for client `me` (privileged) while another holds it: lent by
    /// the daemon's SMA ([`Qp0Keeper`]), never taken from a client.
    fn borrow_qp0(
        &self,
        me: u64,
        pd: PdHandle,
        raw_pd: PdHandle,
        init: &verbs::QpInit,
        ctx: u64,
    ) -> Result<QpHandle> {
        let held = VerbsError::Busy("QP0 of this port has its holder (another client)");
        let keeper = self
            .qp0_keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(keeper) = keeper else {
            return Err(held);
        };
        let ca = self.pd_ca(me, pd)?;
        let raw_ca = CaHandle(self.raw(me, ResourceKind::Ca, ca.0)?);
        let guid = self.provider.query_ca(raw_ca)?.guid;
        if !keeper.lend(guid) {
            return Err(held);
        }
        match self.provider.create_qp(raw_pd, init, ctx) {
            Ok(qp) => {
                self.qp0_lent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(qp.0, guid);
                tracing::info!("nicd: client {me} holds QP0 of {guid:?}; its SMA waits");
                Ok(qp)
            }
            Err(e) => {
                keeper.take_back(guid);
                Err(e)
            }
        }
    }

    /// `post_send` of client `me`'s WRs on its QP `qp` of PD `pd`.
    fn post_send(&self, me: u64, qp: QpHandle, pd: u32, wrs: Vec<SendWr>) -> Result<()> {
        let mut ok = Vec::with_capacity(wrs.len());
        let mut refused = None;
        for (i, w) in wrs.into_iter().enumerate() {
            match self.send_wr(me, pd, w) {
                Ok(w) => ok.push(w),
                Err(e) => {
                    refused = Some((i, e));
                    break;
                }
            }
        }
        // Those before a refused WR are posted (the verb's contract),
        // then its refusal reported.
        if !ok.is_empty() || refused.is_none() {
            self.provider.post_send(qp, &ok)?;
        }
        match refused {
            Some((index, cause)) => Err(VerbsError::BadWr {
                index,
                cause: Box::new(cause),
            }),
            None => Ok(()),
        }
    }

    /// [`Server::destroy`] of a QP or SRQ, its rings taken from the
    /// poller first (and given back if the provider refuses).
    fn destroy_with_rings(
        &self,
        c: &Conn<'_>,
        kind: ResourceKind,
        h: Handle,
        destroy: impl FnOnce(Handle) -> Result<()>,
    ) -> Answer {
        // Only this connection's rings are found by index.
        let rings = c.rings.remove_wqs(h.index);
        let r = self.destroy(c.peer.id, kind, h, destroy);
        if r.is_err() {
            rings.into_iter().for_each(|w| c.rings.add_wq(w));
        }
        r
    }

    /// A record of client `owner`'s object of `kind` under its PD `pd`
    /// that runs in the client ([`COUNTED_RAW`]): its handle.
    fn count(&self, owner: u64, kind: ResourceKind, pd: PdHandle) -> Result<Handle> {
        self.raw(owner, ResourceKind::Pd, pd.0)?;
        let h = self.reserve(kind);
        self.insert(owner, kind, h, COUNTED_RAW, pd.0.index, None);
        Ok(h)
    }

    /// Counts `len` bytes to object `h` (so to its client): its rings',
    /// or those of a registration in the client's own node.
    fn charge(&self, h: Handle, len: u64) {
        if let Some(o) = self.lock().objs.get_mut(&h.index) {
            o.charged = len;
        }
    }

    /// The client's handle of the CA of its PD `pd`.
    fn pd_ca(&self, owner: u64, pd: PdHandle) -> Result<CaHandle> {
        self.raw(owner, ResourceKind::Pd, pd.0)?;
        let ca = self.lock().objs.get(&pd.0.index).map_or(0, |o| o.ca);
        Ok(CaHandle(Handle {
            index: ca,
            generation: self.generation(ResourceKind::Ca),
        }))
    }

    /// Serves one request; `None` when the answer is sent later.
    fn answer(
        self: &Arc<Self>,
        c: &Conn<'_>,
        seq: u32,
        req: Request,
        reader: &mut FrameReader,
    ) -> Option<Answer> {
        use ResourceKind as K;
        let (peer, out) = (c.peer, c.out);
        let me = peer.id;
        if let Request::WaitCq { cq, timeout_us } = req {
            return self.wait_cq(me, c, seq, cq, timeout_us);
        }
        let p = &*self.provider;
        let a = || -> Answer {
            Ok(match req {
                Request::Hello { .. } => return Err(bad("Hello was already exchanged")),
                // Answered with its descriptor where the connection reads.
                Request::SharePort { .. } => return Err(bad("SharePort out of place")),
                Request::ListCas {} => Reply::Guids {
                    guids: p.list_cas(),
                },
                Request::OpenCa { guid, ctx } => {
                    let h = self.reserve(K::Ca);
                    let fwd = Arc::new(Forward {
                        out: out.clone(),
                        ca: CaHandle(h),
                        rings: c.rings.clone(),
                    });
                    let raw = p.open_ca(guid, ctx, fwd)?;
                    self.insert(me, K::Ca, h, raw.0, 0, None);
                    Reply::Ca { ca: CaHandle(h) }
                }
                Request::QueryCa { ca } => Reply::CaAttr {
                    attr: p.query_ca(CaHandle(self.raw(me, K::Ca, ca.0)?))?,
                },
                Request::CloseCa { ca } => {
                    return self.destroy(me, K::Ca, ca.0, |r| p.close_ca(CaHandle(r)))
                }
                Request::QueryPort { ca, port } => Reply::PortAttr {
                    attr: p.query_port(CaHandle(self.raw(me, K::Ca, ca.0)?), port)?,
                },
                Request::QueryPortSm { ca, port } => {
                    let attr = p.query_port(CaHandle(self.raw(me, K::Ca, ca.0)?), port)?;
                    Reply::PortSm {
                        sm_gid: attr.sm_gid,
                        attr,
                    }
                }
                Request::ModifyPort { ca, port, modify } => {
                    self.port_change(me, peer, ca, port, modify)?
                }
                Request::ModifyPortSm {
                    ca,
                    port,
                    mut modify,
                    sm_gid,
                } => {
                    modify.sm_gid = sm_gid;
                    self.port_change(me, peer, ca, port, modify)?
                }
                Request::TakePkeyViolations { ca, port } => Reply::PkeyViolations {
                    v: p.take_pkey_violations(CaHandle(self.raw(me, K::Ca, ca.0)?), port)?,
                },
                Request::AddNic { ip } => {
                    self.may_add_nic(peer)?;
                    Reply::Guids {
                        guids: vec![self.add_nic(ip)?],
                    }
                }
                Request::AddNicOn { ip, ib } => {
                    let fabric = if ib { Fabric::Ib } else { Fabric::Roce };
                    // A NIC served already is named to anyone (its fabric
                    // checked by `add_nic_on`); adding one is privileged.
                    let guid = rnic::softroce::ip_guid(ip);
                    let served = self
                        .claimed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .iter()
                        .any(|(g, _)| *g == guid);
                    if !served {
                        self.may_add_nic(peer)?;
                    }
                    Reply::Guids {
                        guids: vec![self.add_nic_on(ip, Some(fabric))?],
                    }
                }
                Request::LentPorts {} => {
                    if !self.privileged(peer) {
                        return Err(bad(format!(
                            "listing the lent ports needs root or the daemon's user (uid {}); \
                             client uid {}",
                            self.uid, peer.uid
                        )));
                    }
                    let t = self.lock();
                    let mut lent: Vec<proto::LentPort> = (t.lent.iter())
                        .flat_map(|(c, v)| {
                            v.iter().map(|(guid, block)| proto::LentPort {
                                client: *c,
                                guid: *guid,
                                block: *block,
                            })
                        })
                        .collect();
                    lent.sort_by_key(|l| (l.client, l.guid.0));
                    Reply::Lent { lent }
                }
                Request::Clients {} => {
                    if !self.privileged(peer) {
                        return Err(bad(format!(
                            "listing the clients needs root or the daemon's user (uid {}); client uid {}",
                            self.uid, peer.uid
                        )));
                    }
                    Reply::Clients {
                        clients: self.clients(),
                    }
                }
                Request::AllocPd { ca, ctx } => {
                    let raw = p.alloc_pd(CaHandle(self.raw(me, K::Ca, ca.0)?), ctx)?;
                    let pd = self.add(me, K::Pd, raw.0, 0);
                    if let Some(o) = self.lock().objs.get_mut(&pd.index) {
                        o.ca = ca.0.index;
                    }
                    Reply::Pd { pd: PdHandle(pd) }
                }
                Request::DeallocPd { pd } => {
                    return self.destroy(me, K::Pd, pd.0, |r| p.dealloc_pd(PdHandle(r)))
                }
                Request::CreateCq { pd, init, ctx } => {
                    let raw = p.create_cq(PdHandle(self.raw(me, K::Pd, pd.0)?), &init, ctx)?;
                    Reply::Cq {
                        cq: CqHandle(self.add(me, K::Cq, raw.0, 0)),
                    }
                }
                Request::DestroyCq { cq } => {
                    let ring = c.rings.remove_cq(cq.0.index);
                    let r = self.destroy(me, K::Cq, cq.0, |r| p.destroy_cq(CqHandle(r)));
                    if let (Err(_), Some(ring)) = (&r, ring) {
                        c.rings.add_cq(ring);
                    }
                    return r;
                }
                Request::PollCq { cq, max } => {
                    let raw = CqHandle(self.raw(me, K::Cq, cq.0)?);
                    let ring = c.rings.cq(cq.0.index);
                    let blank = WorkCompletion::new(
                        0,
                        rdma_types::WcStatus::GeneralErr,
                        rdma_types::WcOpcode::Send,
                        0,
                    );
                    let mut wcs = vec![blank; max.min(MAX_POLL) as usize];
                    let n = match ring {
                        Some(ring) => ring.poll_socket(p, out, &mut wcs)?,
                        None => p.poll_cq(raw, &mut wcs)?,
                    };
                    wcs.truncate(n);
                    Reply::Wcs { wcs }
                }
                Request::ReqNotifyCq { cq, solicited_only } => {
                    let raw = CqHandle(self.raw(me, K::Cq, cq.0)?);
                    match c.rings.cq(cq.0.index) {
                        Some(ring) => ring.arm_socket(p, out, solicited_only)?,
                        None => p.req_notify_cq(raw, solicited_only)?,
                    }
                    Reply::Unit {}
                }
                Request::WaitCq { .. } => unreachable!("served by wait_cq"),
                Request::CreateSrq { pd, attr, ctx } => {
                    let raw = p.create_srq(PdHandle(self.raw(me, K::Pd, pd.0)?), &attr, ctx)?;
                    Reply::Srq {
                        srq: SrqHandle(self.add(me, K::Srq, raw.0, 0)),
                    }
                }
                Request::ModifySrq { srq, limit } => {
                    p.modify_srq(SrqHandle(self.raw(me, K::Srq, srq.0)?), limit)?;
                    Reply::Unit {}
                }
                Request::QuerySrq { srq } => Reply::SrqAttr {
                    attr: p.query_srq(SrqHandle(self.raw(me, K::Srq, srq.0)?))?,
                },
                Request::DestroySrq { srq } => {
                    return self
                        .destroy_with_rings(c, K::Srq, srq.0, |r| p.destroy_srq(SrqHandle(r)))
                }
                Request::PostSrqRecv { srq, wrs } => {
                    let raw = SrqHandle(self.raw(me, K::Srq, srq.0)?);
                    let post = || match wrs.is_empty() {
                        true => Ok(()),
                        false => p.post_srq_recv(raw, &wrs),
                    };
                    match c.rings.wq(srq.0.index, WqKind::Srq) {
                        Some(w) => w.after_drain(self, me, out, true, post)?,
                        None => post()?,
                    }
                    Reply::Unit {}
                }
                Request::CreateQp { pd, init, ctx } => {
                    let (_, qp) = self.create_qp(me, self.privileged(peer), pd, init, ctx)?;
                    Reply::Qp { qp: QpHandle(qp) }
                }
                Request::QpNum { qp } => Reply::Qpn {
                    qpn: p.qp_num(QpHandle(self.raw(me, K::Qp, qp.0)?))?,
                },
                Request::ModifyQp { qp, attr } => {
                    let raw = QpHandle(self.raw(me, K::Qp, qp.0)?);
                    // What the rings hold was posted before this.
                    let modify = || p.modify_qp(raw, &attr);
                    let sq = c.rings.wq(qp.0.index, WqKind::Send { pd: 0 });
                    let rq = c.rings.wq(qp.0.index, WqKind::Recv);
                    let rq_then = || match &rq {
                        Some(r) => r.after_drain(self, me, out, false, modify),
                        None => modify(),
                    };
                    match &sq {
                        Some(s) => s.after_drain(self, me, out, false, rq_then)?,
                        None => rq_then()?,
                    }
                    Reply::Unit {}
                }
                Request::QueryQp { qp } => Reply::QpAttr {
                    attr: p.query_qp(QpHandle(self.raw(me, K::Qp, qp.0)?))?,
                },
                Request::DestroyQp { qp } => {
                    if let Ok(port) = self.gsi_of(me, qp) {
                        self.lock().gsi.remove(&qp.0.index);
                        port.leave(me);
                        self.note_dm(&port);
                        return self.destroy(me, K::Qp, qp.0, |_| Ok(()));
                    }
                    return self.destroy_with_rings(c, K::Qp, qp.0, |r| match r {
                        COUNTED_RAW => Ok(()),
                        r => {
                            p.destroy_qp(QpHandle(r))?;
                            self.qp0_returned(r);
                            Ok(())
                        }
                    });
                }
                Request::CountQp { pd } => {
                    self.within_qps(me)?;
                    Reply::Qp {
                        qp: QpHandle(self.count(me, K::Qp, pd)?),
                    }
                }
                Request::OpenGsi { pd, ctx: _ } => {
                    self.within_qps(me)?;
                    let port = self.gsi_port(me, pd)?;
                    let ca = self.pd_ca(me, pd)?;
                    let mine = {
                        let t = self.lock();
                        t.gsi.iter().any(|(i, g)| {
                            Arc::ptr_eq(g, &port) && t.objs.get(i).is_some_and(|o| o.owner == me)
                        })
                    };
                    if mine {
                        return Err(VerbsError::Busy("this client has its GSI QP on this port"));
                    }
                    let h = self.reserve(K::Qp);
                    self.insert(me, K::Qp, h, GSI_RAW, pd.0.index, None);
                    self.lock().gsi.insert(h.index, port.clone());
                    port.join(me, self.privileged(peer), out.clone(), ca, QpHandle(h));
                    Reply::Qp { qp: QpHandle(h) }
                }
                Request::GsiRegister {
                    qp,
                    class,
                    version,
                    methods,
                    serve,
                } => {
                    let port = self.gsi_of(me, qp)?;
                    port.register(me, class, version, &methods, serve)
                        .map_err(|r| self.gsi_refused(r))?;
                    self.note_dm(&port);
                    Reply::Unit {}
                }
                Request::GsiListen {
                    qp,
                    service_id,
                    listen,
                } => {
                    let port = self.gsi_of(me, qp)?;
                    port.listen(me, service_id, listen)
                        .map_err(|r| self.gsi_refused(r))?;
                    Reply::Unit {}
                }
                Request::GsiSend {
                    qp,
                    dgid,
                    pkey_index,
                    mad,
                } => {
                    let port = self.gsi_of(me, qp)?;
                    port.send(me, dgid, pkey_index, &mad)
                        .map_err(|r| self.gsi_refused(r))?;
                    Reply::Unit {}
                }
                Request::CreateAh { pd, attr } => {
                    let raw = p.create_ah(PdHandle(self.raw(me, K::Pd, pd.0)?), &attr)?;
                    Reply::Ah {
                        ah: AhHandle(self.add(me, K::Ah, raw.0, 0)),
                    }
                }
                Request::DestroyAh { ah } => {
                    return self.destroy(me, K::Ah, ah.0, |r| p.destroy_ah(AhHandle(r)))
                }
                Request::RegMr {
                    pd,
                    buf_addr,
                    buf_len,
                    addr,
                    len,
                    access,
                    ctx,
                } => {
                    let buf = map(reader, buf_addr, buf_len)?;
                    let raw_pd = PdHandle(self.raw(me, K::Pd, pd.0)?);
                    self.within_registered(me, None, len)?;
                    let info = p.reg_mr(raw_pd, &buf, addr, len, access, ctx)?;
                    let h = self.reserve(K::Mr);
                    let range = MrRange {
                        addr: info.addr,
                        len: info.len,
                        lkey: info.lkey,
                    };
                    self.insert(me, K::Mr, h, info.handle.0, pd.0.index, Some(range));
                    Reply::Mr {
                        info: MrInfo {
                            handle: MrHandle(h),
                            ..info
                        },
                    }
                }
                Request::ReregMr {
                    mr,
                    buf_addr,
                    buf_len,
                    addr,
                    len,
                    access,
                } => {
                    let buf = map(reader, buf_addr, buf_len)?;
                    let raw = self.raw(me, K::Mr, mr.0)?;
                    self.within_registered(me, Some(mr.0.index), len)?;
                    let info = p.rereg_mr(MrHandle(raw), &buf, addr, len, access)?;
                    if let Some(o) = self.lock().objs.get_mut(&mr.0.index) {
                        o.range = Some(MrRange {
                            addr: info.addr,
                            len: info.len,
                            lkey: info.lkey,
                        });
                    }
                    Reply::Mr {
                        info: MrInfo { handle: mr, ..info },
                    }
                }
                Request::DeregMr { mr } => {
                    return self.destroy(me, K::Mr, mr.0, |r| match r {
                        COUNTED_RAW => Ok(()),
                        r => p.dereg_mr(MrHandle(r)),
                    })
                }
                Request::CountMr { pd, len } => {
                    self.raw(me, K::Pd, pd.0)?;
                    self.within_registered(me, None, len)?;
                    let h = self.count(me, K::Mr, pd)?;
                    self.charge(h, len);
                    Reply::Mr {
                        info: MrInfo {
                            handle: MrHandle(h),
                            lkey: Lkey(0),
                            rkey: rdma_types::Rkey(0),
                            addr: 0,
                            len,
                        },
                    }
                }
                Request::AllocMw { pd, kind, ctx } => {
                    let (raw, rkey) =
                        p.alloc_mw(PdHandle(self.raw(me, K::Pd, pd.0)?), kind, ctx)?;
                    Reply::Mw {
                        mw: MwHandle(self.add(me, K::Mw, raw.0, 0)),
                        rkey,
                    }
                }
                Request::BindMw { qp, mut bind } => {
                    bind.mw = MwHandle(self.raw(me, K::Mw, bind.mw.0)?);
                    bind.mr = MrHandle(self.raw(me, K::Mr, bind.mr.0)?);
                    let raw = QpHandle(self.raw(me, K::Qp, qp.0)?);
                    // After the sends its ring holds, as on its SQ.
                    let bind = || p.bind_mw(raw, &bind);
                    let rkey = match c.rings.wq(qp.0.index, WqKind::Send { pd: 0 }) {
                        Some(w) => w.after_drain(self, me, out, false, bind)?,
                        None => bind()?,
                    };
                    Reply::Rkey { rkey }
                }
                Request::DeallocMw { mw } => {
                    return self.destroy(me, K::Mw, mw.0, |r| p.dealloc_mw(MwHandle(r)))
                }
                Request::PostSend { qp, wrs } => {
                    let (raw, pd) = self.raw_in_pd(me, K::Qp, qp.0)?;
                    // Nothing: a client's wait for its ring to be taken.
                    let post = || match wrs.is_empty() {
                        true => Ok(()),
                        false => self.post_send(me, QpHandle(raw), pd, wrs),
                    };
                    match c.rings.wq(qp.0.index, WqKind::Send { pd }) {
                        Some(w) => w.after_drain(self, me, out, true, post)?,
                        None => post()?,
                    }
                    Reply::Unit {}
                }
                Request::PostRecv { qp, wrs } => {
                    let raw = QpHandle(self.raw(me, K::Qp, qp.0)?);
                    // Nothing: a client's wait for its ring to be taken.
                    let post = || match wrs.is_empty() {
                        true => Ok(()),
                        false => p.post_recv(raw, &wrs),
                    };
                    match c.rings.wq(qp.0.index, WqKind::Recv) {
                        Some(w) => w.after_drain(self, me, out, true, post)?,
                        None => post()?,
                    }
                    Reply::Unit {}
                }
                Request::Doorbell {} => {
                    let fd = reader
                        .take_fd()
                        .ok_or_else(|| bad("Doorbell without its eventfd (SCM_RIGHTS)"))?;
                    c.rings.start(self, me, fd)?;
                    Reply::Unit {}
                }
                Request::CompletionNotice {} => {
                    let fd = reader
                        .take_fd()
                        .ok_or_else(|| bad("CompletionNotice without its eventfd (SCM_RIGHTS)"))?;
                    c.rings.set_notice(fd)?;
                    Reply::Unit {}
                }
                Request::CreateCqRing {
                    pd,
                    init,
                    ctx,
                    len,
                    ring,
                } => {
                    let buf = map_rings(reader, len)?;
                    let ring = Ring::new(buf, ring).map_err(bad)?;
                    // Exactly: the daemon writes every entry, and a page
                    // per 64 bytes would be its memory, not the client's.
                    if ring.spec().entry_size != crate::ring::CQE_SIZE {
                        return Err(bad(format!(
                            "CQ ring entries of {} bytes: they are {}",
                            ring.spec().entry_size,
                            crate::ring::CQE_SIZE
                        )));
                    }
                    let ca = self.pd_ca(me, pd)?;
                    self.within_registered(me, None, len)?;
                    let raw = p.create_cq(PdHandle(self.raw(me, K::Pd, pd.0)?), &init, ctx)?;
                    let h = self.add(me, K::Cq, raw.0, 0);
                    self.charge(h, len);
                    let notice = c.rings.notice();
                    let cq = Arc::new(CqRing::new(ring, raw, h.index, ca, ctx, notice));
                    c.rings.add_cq(cq.clone());
                    // Arms the provider's CQ for the pumps to come.
                    cq.pump(p, out);
                    Reply::Cq { cq: CqHandle(h) }
                }
                Request::CreateQpRing {
                    pd,
                    init,
                    ctx,
                    len,
                    sq,
                    rq,
                } => {
                    let buf = map_rings(reader, len)?;
                    if !c.rings.has_doorbell() {
                        return Err(bad("a QP ring before the Doorbell request"));
                    }
                    if init.srq.is_some() == rq.is_some() {
                        return Err(bad(
                            "an RQ ring goes with a QP without an SRQ, and only with one",
                        ));
                    }
                    if rq.is_some_and(|r| r.offset < sq.end() && sq.offset < r.end()) {
                        return Err(bad("the SQ and RQ rings overlap"));
                    }
                    let sq = Ring::new(buf.clone(), sq).map_err(bad)?;
                    let rq = rq.map(|r| Ring::new(buf, r)).transpose().map_err(bad)?;
                    let ca = self.pd_ca(me, pd)?;
                    self.within_registered(me, None, len)?;
                    let (raw, qp) = self.create_qp(me, self.privileged(peer), pd, init, ctx)?;
                    self.charge(qp, len);
                    let send = WqKind::Send { pd: pd.0.index };
                    c.rings
                        .add_wq(WqRing::new(sq, send, raw.0, qp.index, ca, ctx));
                    if let Some(rq) = rq {
                        c.rings
                            .add_wq(WqRing::new(rq, WqKind::Recv, raw.0, qp.index, ca, ctx));
                    }
                    Reply::Qp { qp: QpHandle(qp) }
                }
                Request::CreateSrqRing {
                    pd,
                    attr,
                    ctx,
                    len,
                    ring,
                } => {
                    let buf = map_rings(reader, len)?;
                    if !c.rings.has_doorbell() {
                        return Err(bad("an SRQ ring before the Doorbell request"));
                    }
                    let ring = Ring::new(buf, ring).map_err(bad)?;
                    let ca = self.pd_ca(me, pd)?;
                    self.within_registered(me, None, len)?;
                    let raw = p.create_srq(PdHandle(self.raw(me, K::Pd, pd.0)?), &attr, ctx)?;
                    let h = self.add(me, K::Srq, raw.0, 0);
                    self.charge(h, len);
                    c.rings
                        .add_wq(WqRing::new(ring, WqKind::Srq, raw.0, h.index, ca, ctx));
                    Reply::Srq { srq: SrqHandle(h) }
                }
            })
        };
        Some(a())
    }

    /// `WaitCq`: answered at once when the CQ has a completion (or the
    /// handle is bad), else by a thread that waits (on the provider, or
    /// for a CQ with a ring on the ring's pumps).
    fn wait_cq(
        self: &Arc<Self>,
        me: u64,
        c: &Conn<'_>,
        seq: u32,
        cq: CqHandle,
        timeout_us: u64,
    ) -> Option<Answer> {
        let out = c.out;
        let raw = match self.raw(me, ResourceKind::Cq, cq.0) {
            Ok(r) => CqHandle(r),
            Err(e) => return Some(Err(e)),
        };
        let ring = c.rings.cq(cq.0.index).filter(|r| !r.delegated());
        let provider = self.provider.clone();
        let wait = move |timeout: Duration, out: &Outbox| match &ring {
            Some(r) if r.wait(&*provider, out, timeout) => Ok(()),
            Some(_) => Err(VerbsError::Timeout),
            None => provider.wait_cq(raw, timeout),
        };
        match wait(Duration::ZERO, out) {
            Err(VerbsError::Timeout) if timeout_us > 0 => {}
            r => return Some(r.map(|()| Reply::Unit {})),
        }
        if out.waits.fetch_add(1, Ordering::Relaxed) >= MAX_WAITS {
            out.waits.fetch_sub(1, Ordering::Relaxed);
            return Some(
                self.limit(false, "this client's blocked wait_cq calls (64 at once)")
                    .map(|()| Reply::Unit {}),
            );
        }
        let waiter = out.clone();
        let server = self.clone();
        self.blocked_waits.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("nicd-wait".into())
            .spawn(move || {
                // No deadline when the client's timeout runs past what the
                // clock can count.
                let deadline = Instant::now().checked_add(Duration::from_micros(timeout_us));
                let r = loop {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    let slice = left.map_or(WAIT_SLICE, |l| l.min(WAIT_SLICE));
                    match wait(slice, &waiter) {
                        Err(VerbsError::Timeout) if left.is_none_or(|l| l > slice) => {
                            if !waiter.is_open()
                                || server.raw(me, ResourceKind::Cq, cq.0) != Ok(raw.0)
                            {
                                break Err(VerbsError::InvalidHandle);
                            }
                        }
                        r => break r,
                    }
                }
                .map(|()| Reply::Unit {});
                waiter.waits.fetch_sub(1, Ordering::Relaxed);
                server.blocked_waits.fetch_sub(1, Ordering::Relaxed);
                waiter.send(proto::frame(Kind::Response, seq, &r));
            });
        match spawned {
            Ok(_) => None,
            Err(_) => {
                out.waits.fetch_sub(1, Ordering::Relaxed);
                self.blocked_waits.fetch_sub(1, Ordering::Relaxed);
                Some(Err(VerbsError::OutOfResources("nicd threads")))
            }
        }
    }
}

/// Binds the clients' socket at `path`: replaces a stale socket file
/// (nobody listening), refuses one a daemon listens on or any other file.
/// Mode 0666 when `everyone` (a root daemon serving every user), else
/// 0600 (its own user's processes only).
///
/// # Errors
/// What [`daemon_ctl::control_path`] and `bind` say, in words.
pub fn bind(path: &std::path::Path, everyone: bool) -> std::io::Result<UnixListener> {
    use daemon_ctl::SocketPath;
    use std::os::unix::fs::PermissionsExt;
    match daemon_ctl::control_path(path)? {
        SocketPath::Free => {}
        SocketPath::Stale => std::fs::remove_file(path)?,
        SocketPath::Listening => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another nicd is listening there",
            ))
        }
    }
    if !everyone {
        return daemon_ctl::bind_control(path);
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Maps the rings whose memfd came with the request.
fn map_rings(reader: &mut FrameReader, len: u64) -> Result<MemBuf> {
    let fd = reader
        .take_fd()
        .ok_or_else(|| bad("a ring request without its memfd (SCM_RIGHTS)"))?;
    if len > crate::ring::MAX_RINGS_LEN {
        return Err(bad(format!(
            "a rings memfd of {len} bytes: at most {} served",
            crate::ring::MAX_RINGS_LEN
        )));
    }
    let len = usize::try_from(len).map_err(|_| bad("rings length"))?;
    MemBuf::map_shared(fd, len, 0).map_err(|e| bad(format!("the rings' memfd: {e}")))
}

/// Maps the buffer whose memfd came with the request.
fn map(reader: &mut FrameReader, addr: u64, len: u64) -> Result<MemBuf> {
    let fd = reader
        .take_fd()
        .ok_or_else(|| bad("memory registration without the buffer's memfd (SCM_RIGHTS)"))?;
    let len = usize::try_from(len).map_err(|_| bad("buffer length"))?;
    MemBuf::map_shared(fd, len, addr).map_err(|e| bad(format!("the buffer's memfd: {e}")))
}

fn report(t: &Table) -> Vec<ClientReport> {
    let mut v: Vec<ClientReport> = t
        .clients
        .values()
        .map(|peer| ClientReport {
            peer: *peer,
            objects: KINDS
                .iter()
                .map(|k| {
                    let n = t
                        .objs
                        .values()
                        .filter(|o| o.owner == peer.id && o.kind == *k)
                        .count();
                    (*k, n)
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        })
        .collect();
    v.sort_by_key(|c| c.peer.id);
    v
}
