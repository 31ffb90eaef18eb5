//! One SRP target port over a verbs provider. See the crate documentation.

use crate::names::{initiator_name, target_name};
use rdma_types::{
    AccessFlags, Gid, Guid, IdMap, Lid, Lkey, Mtu, Pkey, PortNum, Psn, QpState, QpType, Qpn,
    WcStatus,
};
use srp::target::{
    ChannelId, CmdId, DataOut, Local, Login, LoginForm, OpId, Output, RdmaOp, ScsiDone,
    ScsiRequest, Target, TargetConfig, TmfRequest,
};
use srp::wire::{LoginRej, LoginRejReason, RspCode, TLogoutReason, TmFunc};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use verbs::nested::Counted;
use verbs::{
    AhAttr, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, PdHandle, Provider, QpAttr,
    QpCaps, QpHandle, QpInit, RecvWr, RemoteAddr, SendFlags, SendOpcode, SendWr, Sge, SrqAttr,
    SrqHandle, WorkCompletion,
};

mod chunks;
mod completions;
mod connections;
mod execution;
mod stats;

use chunks::{Fetched, InData, OpInfo, DIRECT_IN_MIN};
pub use connections::{
    ChannelPhase, CloseReason, ConnId, LocalQp, LoginOutcome, LoginRefusal, OtherTargetPort,
    PartitionError, PeerQp,
};
use stats::LunTable;
pub use stats::{LunCounters, LunStats, SessionInfo};

/// Port construction errors.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The SRP settings are out of range.
    #[error("{0}")]
    Config(#[from] srp::target::ConfigError),
    /// A verbs object of the port could not be made.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Why the verbs objects of the port ([`TargetPort::start`]) or of a
/// login's channel ([`LoginRefusal::Channel`]) could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// A verb failed.
    #[error("{what}: {err}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The provider's answer.
        err: verbs::VerbsError,
    },
    /// The login's partition is not one the port serves.
    #[error(transparent)]
    Partition(#[from] PartitionError),
}

fn verbs_err(what: &'static str) -> impl FnOnce(verbs::VerbsError) -> SetupError {
    move |err| SetupError::Verbs { what, err }
}

/// Port settings beyond the SRP ones.
#[derive(Debug, Clone)]
pub struct PortOptions {
    /// Port number on the CA.
    pub port: PortNum,
    /// GID table index of the port address.
    pub sgid_index: u8,
    /// SCSI worker threads.
    pub workers: usize,
    /// Registered chunks of `srp_max_rdma_size` bytes for RDMA.
    pub chunks: usize,
    /// The partitions the port serves (empty: every P_Key of the port's
    /// table, as ib_srpt does). A login in a partition (see
    /// [`TargetPort::login_in_partition`]) gets a QP with the index of the
    /// port's table holding it; a login whose partition is unknown gets
    /// the first of these the table holds (index 0 when none are listed).
    pub pkeys: Vec<Pkey>,
    /// How long an accepted login may wait for the CM's RTU before its
    /// channel is closed (the CM's own REP resends may last minutes).
    pub login_timeout: std::time::Duration,
    /// Most unfinished logins (accepted, not established) of the port: a
    /// new login beyond it drops the oldest unfinished one.
    pub max_pending_logins: usize,
    /// Most unfinished logins of one initiator port: a new login beyond it
    /// is refused.
    pub max_pending_per_initiator: usize,
    /// An established channel with no completion for this long gets a
    /// keepalive (a zero-length RDMA WRITE, acknowledged by the
    /// initiator's NIC without its software); if that fails, the
    /// initiator is gone and its channel closes. A dead initiator's
    /// channel is freed within about twice this plus the transport's
    /// retries. `None`: no keepalives.
    pub keepalive: Option<std::time::Duration>,
    /// Who handles the port's completions and fires its timers.
    pub drive: PortDrive,
    /// Largest transfer (bytes) a command to a memory store may have to
    /// run right on the thread that got it (run to completion: received,
    /// executed, its data and response posted), however many are in
    /// flight: two thread hand-offs less. 0: every command goes to a
    /// worker (on the loopback fabric a command run inline is answered
    /// before its SEND returns, so nothing is ever in flight). Default
    /// [`INLINE_MAX`]; binaries map `SRPT_INLINE=0` onto 0
    /// ([`PortOptions::inline_max_from_env`]).
    pub inline_max: u32,
}

/// Who drives a port ([`PortOptions::drive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PortDrive {
    /// Its own poll thread, on the real clock.
    #[default]
    Thread,
    /// The caller, with [`TargetPort::poll_at`], on the clock it gives
    /// there: no poll thread, and the port's time (when a login was
    /// accepted, when it times out, when keepalives are due) is the latest
    /// `now` given. For deterministic tests and fuzzing. A provider that
    /// calls its completion handlers on a thread of its own (soft RoCE)
    /// still has them handled there.
    Caller,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            port: PortNum(1),
            sgid_index: 0,
            workers: 4,
            chunks: 256,
            pkeys: Vec::new(),
            login_timeout: std::time::Duration::from_secs(10),
            max_pending_logins: 64,
            max_pending_per_initiator: 4,
            keepalive: Some(std::time::Duration::from_secs(15)),
            drive: PortDrive::Thread,
            inline_max: INLINE_MAX,
        }
    }
}

/// The environment variable binaries map onto [`PortOptions::inline_max`]
/// (`0`: off).
pub const INLINE_ENV: &str = "SRPT_INLINE";

impl PortOptions {
    /// For binaries: [`PortOptions::inline_max`] as `SRPT_INLINE` sets it
    /// (`0`: 0, inline execution off; unset or anything else: the default
    /// [`INLINE_MAX`]). The library itself never reads the environment.
    pub fn inline_max_from_env() -> u32 {
        if std::env::var_os(INLINE_ENV).is_some_and(|v| v == "0") {
            0
        } else {
            INLINE_MAX
        }
    }
}

/// Shared so the lock guard can call it with no lock held, not even the
/// hook's own slot ([`TargetPort::on_disconnect`]).
type DisconnectHook = Arc<dyn Fn(ConnId, &CloseReason) + Send + Sync>;

/// One SRP target port; [`TargetPort::stop`] or dropping it stops its
/// threads and releases its verbs objects (call [`TargetPort::logout_all`]
/// first to log initiators out cleanly).
pub struct TargetPort {
    inner: Arc<Inner>,
    /// The poll and SCSI worker threads; `None` once stopped.
    threads: Mutex<Option<Vec<JoinHandle<()>>>>,
}

struct Inner {
    provider: Arc<dyn Provider>,
    scsi: Arc<scsi::Target>,
    name: String,
    gid: Gid,
    opts: PortOptions,
    ca: CaHandle,
    pd: PdHandle,
    recv_cq: CqHandle,
    srq: SrqHandle,
    srq_buf: MemBuf,
    srq_mr: MrInfo,
    chunk_buf: MemBuf,
    chunk_mr: MrInfo,
    /// Memory stores registered for READs to be sent straight out of
    /// ([`crate::MemStore`]), each with its registration (`None`: the
    /// provider refused it, not asked again) and how many of its holders
    /// are that registration's (this list and the provider).
    stores: Mutex<Vec<(MemBuf, Option<MrInfo>, usize)>>,
    req_size: u32,
    /// Bytes between receive buffers: `req_size` rounded up to a cache
    /// line, so every buffer starts word-aligned (a copy between aligned
    /// buffers moves whole words; 8260, ib_srpt's default, is not).
    req_stride: u32,
    /// Receive buffers posted again together, at most (`State::reposts`):
    /// a 64th of the SRQ, up to 16; 1 (each at once) below 128 entries.
    repost_batch: usize,
    chunk_size: u32,
    /// Commands whose data-in the store read straight into reserved
    /// chunks (no copy before the RDMA WRITEs).
    direct_in: std::sync::atomic::AtomicU64,
    /// Commands whose data-out the store took straight from the chunks the
    /// RDMA READs filled (no gather copy).
    direct_out: std::sync::atomic::AtomicU64,
    /// Below this many free chunks, fetched data-out is copied out of its
    /// chunk at once instead of waiting in it for the worker.
    spill_below: usize,
    /// Commands up to this many bytes may run inline (0: never).
    inline_max: u32,
    st: Mutex<State>,
    /// Per-LUN counters, under their own lock: the workers update them
    /// without the port lock.
    lun_stats: Mutex<LunTable>,
    events: Mutex<Sender<Event>>,
    hook: Mutex<Option<DisconnectHook>>,
    /// [`PortDrive::Caller`]: the events the poll thread would take, for
    /// [`TargetPort::poll_at`], and the caller's clock.
    caller: Option<Mutex<CallerDrive>>,
    /// The port itself, for the device pools' threads.
    me: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// The device pools' threads (see `device_queue`), joined at stop.
    dev_threads: Mutex<Vec<JoinHandle<()>>>,
}

struct CallerDrive {
    events: Receiver<Event>,
    now: std::time::Instant,
}

enum Event {
    /// A CQ (context) has completions.
    Cq(u64),
    /// A deadline may have moved closer (a new login).
    Timer,
    Stop,
}

struct Job {
    conn: ConnId,
    nexus: scsi::Nexus,
    req: ScsiRequest,
    data_out: Vec<u8>,
    /// Data-out in RDMA chunks, if it came that way.
    parts: OutParts,
    /// Data-out pieces copied out of their chunks early (offset, bytes).
    spilled: Vec<(u64, Vec<u8>)>,
    /// Set by a task management function that reached the command before
    /// it entered the SCSI core (see [`Queued`]).
    aborted: Arc<std::sync::atomic::AtomicBool>,
    /// The logical unit, looked up as the command was handed on (the
    /// connection's route for its LUN: `route.device()` is `None` when
    /// there is none there).
    route: scsi::Route,
}

/// Where a job's data-out is when it is not in `Job::data_out` (one
/// field for both: a job moves by value several times, and under 256
/// bytes a move is a few instructions).
#[derive(Default)]
enum OutParts {
    #[default]
    None,
    /// Still in RDMA chunks (offset, chunk, length) to `len` bytes in
    /// all, gathered into `data_out` by the worker, outside the port lock.
    Fetched { len: u32, parts: Vec<Fetched> },
    /// Filling its chunks back to back from offset 0: the store writes it
    /// from there (`scsi::Buffers::data_out`), no gather.
    Direct(Vec<Fetched>),
}

/// A command handed to a worker (or kept to run inline) and not yet
/// finished. The SCSI core aborts only the tasks it has started; one still
/// queued here was in the task set for the initiator when its TMF came, so
/// the TMF marks it here and it ends TASK ABORTED without running.
struct Queued {
    tag: srp::wire::Tag,
    lun: srp::wire::Lun,
    aborted: Arc<std::sync::atomic::AtomicBool>,
}

/// A device pool's key: the device's address and, for a per-initiator
/// pool, its connection.
type PoolKey = (usize, Option<ConnId>);

struct Conn {
    channel: ChannelId,
    /// How the nexus reaches the LUN of its last command (`scsi::Route`):
    /// commands to that LUN skip the LUN maps while nothing changes.
    route: scsi::Route,
    qp: QpHandle,
    send_cq: CqHandle,
    send_buf: MemBuf,
    send_mr: MrInfo,
    slot_size: u32,
    free_slots: Vec<u32>,
    outstanding: u32,
    /// Work requests queued to the QP so far: each one's number in order.
    queued_wrs: u64,
    /// The number (`queued_wrs`) of the IU in each send slot.
    slot_seq: Vec<u64>,
    /// Unsignaled data-in WRITEs (out of a memory store) by number: done
    /// when a signaled request queued after them completes (an RC send
    /// queue completes in order).
    unsignaled: VecDeque<(u64, OpId)>,
    closing: bool,
    initiator: String,
    /// The P_Key at the QP's index: the session's partition.
    pkey: Pkey,
    nexus: scsi::Nexus,
    ops: rdma_types::IdRing<OpId, OpInfo>,
    /// Data-out chunks fetched so far per command: (offset, chunk, len).
    fetched: IdMap<CmdId, Vec<Fetched>>,
    /// Data-out pieces copied out of their chunks while chunks ran short:
    /// a command with more pieces than the pool has chunks (an external
    /// table of a thousand small descriptors) must not hold them all.
    spilled: IdMap<CmdId, Vec<(u64, Vec<u8>)>>,
    data_in: rdma_types::IdRing<CmdId, InData>,
    /// Commands with the SCSI core (queued or running).
    queued: rdma_types::IdRing<CmdId, Queued>,
    /// Reserved data-in chunks of released commands whose WRITEs are still
    /// in flight: they go back to the pool when the last one completes,
    /// never while the NIC may still read them.
    parked: IdMap<CmdId, Vec<usize>>,
    /// The CM's RTU came (see [`TargetPort::established`]).
    established: bool,
    /// When the login was accepted.
    accepted_at: std::time::Instant,
    /// Completions of the channel so far: a keepalive sweep that sees the
    /// same count twice found it idle.
    activity: u64,
    /// `activity` at the last keepalive sweep.
    activity_seen: u64,
    /// A keepalive is in flight.
    keepalive_out: bool,
    keepalives: u64,
    /// Why the target closes it, once it does.
    close_reason: Option<CloseReason>,
    /// The channel's `srp_channel` span (port, connection, initiator):
    /// parent of its login, close and release events, none per command.
    span: tracing::Span,
}

impl Conn {
    /// A command of this channel handed to the SCSI core but not started
    /// by a worker yet will not start: its channel is going, and a WRITE
    /// run now could land after the initiator wrote the block again over
    /// another path (issue 33). One already running finishes.
    fn abort_unstarted(&self, cmd: CmdId) {
        if let Some(q) = self.queued.get(&cmd) {
            q.aborted.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn phase(&self) -> ChannelPhase {
        if self.closing || self.close_reason.is_some() {
            ChannelPhase::Closing
        } else if self.established {
            ChannelPhase::Live
        } else {
            ChannelPhase::Pending
        }
    }

    /// What the port holds for the channel: send slots and the tables of
    /// its work requests in flight.
    fn memory(&self) -> usize {
        self.send_buf.len()
            + self.free_slots.capacity() * std::mem::size_of::<u32>()
            + std::mem::size_of::<Conn>()
            + (self.ops.len() + self.queued.len() + self.data_in.len())
                * std::mem::size_of::<OpInfo>()
    }
}

struct State {
    /// Commands to run on this thread once the lock is released (memory
    /// stores only, see `submit_scsi`).
    inline_jobs: Vec<Job>,
    /// The results of a round of inline jobs, on their way back (kept for
    /// its room between rounds).
    inline_done: Vec<(ConnId, ScsiDone, InData, Vec<u8>)>,
    /// The thread holding the lock will run `inline_jobs` afterwards.
    inline_here: bool,
    /// Connections whose channels took completions of a batch (receives,
    /// sends, finished commands): their outputs are carried out once,
    /// after the batch ([`Inner::pump_noted`]), not after each.
    pump_later: Vec<ConnId>,
    target: Target,
    conns: rdma_types::IdRing<ConnId, Conn>,
    by_channel: IdMap<ChannelId, ConnId>,
    free_chunks: Vec<usize>,
    /// RDMA ops waiting for a chunk.
    waiting: VecDeque<(ConnId, Output)>,
    next_conn: u64,
    jobs: Sender<Job>,
    /// The job queues of devices with threads of their own
    /// (`scsi::DeviceConfig::threads_num`), by the device's address (the
    /// device kept alive with its queue, so the address is not reused)
    /// and, for a per-initiator pool, the connection whose it is (its
    /// queue closes, and its threads end, when the connection goes).
    dev_jobs: HashMap<PoolKey, (Arc<scsi::Device>, Sender<Job>)>,
    /// The port stops: no device pool starts any more.
    stopping: bool,
    /// When the keepalive sweep last ran.
    last_sweep: std::time::Instant,
    /// Channels the target closed whose disconnect hook has not run yet
    /// (it runs when the lock is let go).
    closed: Vec<(ConnId, CloseReason)>,
    /// Work requests queued under the lock, posted once it is let go.
    posts: Batch,
    /// Abort flags of finished commands (`Queued::aborted`), for the next
    /// ones: no allocation per command.
    spare_flags: Vec<Arc<std::sync::atomic::AtomicBool>>,
    /// Receive buffers whose IUs were handled, posted again once
    /// `Inner::repost_batch` of them wait (one call, not one each).
    reposts: Vec<RecvWr>,
    /// Receive buffers in the SRQ or on their way back (`reposts`): what
    /// the channels' credits need ([`Inner::recv_goal`]), not the whole
    /// SRQ, so the buffers an IU lands in cycle through a set the caches
    /// hold (4095 of ib_srpt's 8 KiB buffers are 34 MB: every IU would
    /// land in memory no cache had seen since 4094 IUs before).
    recv_posted: usize,
    /// The other buffers' indexes, the next to post last.
    recv_idle: Vec<u32>,
    /// A thread is posting `posts` (it takes what others queue meanwhile).
    flushing: bool,
    /// The posting thread's buffers, kept between batches so a batch
    /// allocates nothing (the flushing thread has them meanwhile).
    flush_bufs: Batch,
}

/// Work requests queued under the port lock and posted once it is let go
/// (`flush_posts`): the RDMA READs and WRITEs apart from the IUs, so a
/// batch goes out with them first with no request moved one by one.
/// Empty between batches, with their capacity kept.
#[derive(Default)]
struct Batch {
    /// The RDMA READs and WRITEs in the order queued, and what each is.
    wrs: Vec<SendWr>,
    posts: Vec<Post>,
    /// The IUs in the order queued, and what each is.
    ius: Vec<SendWr>,
    iu_posts: Vec<Post>,
    /// For each request of a QP's run as posted, the index in the run of
    /// its last queued one (a WRITE joined into the next takes two).
    ends: Vec<usize>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.posts.is_empty() && self.iu_posts.is_empty()
    }
}

/// What a work request queued under the port lock is (its request waits in
/// a [`Batch`]); it is posted once the lock is
/// let go (`PortLock`): a provider that calls back on the posting thread
/// (the loopback fabric) can then run the initiator's handlers, and ours,
/// right there, with no thread hand-off. One thread at a time posts the
/// queue, in order, so a response never overtakes its data.
struct Post {
    conn: ConnId,
    qp: QpHandle,
    /// What to undo if the post fails.
    kind: Posted,
}

enum Posted {
    /// An IU in send slot `slot`.
    Send { slot: u32 },
    /// An RDMA READ or WRITE, through `chunk` unless it uses a command's
    /// own chunks.
    Rdma { op: RdmaOp, chunk: Option<usize> },
}

const RECV_CQ_CTX: u64 = u64::MAX;
const KIND_SEND: u64 = 1 << 56;
const KIND_RDMA: u64 = 2 << 56;
const KIND_KEEPALIVE: u64 = 3 << 56;
const KIND_MASK: u64 = 0xff << 56;

/// Largest transfer a command may have to run on the thread that got it,
/// by default ([`PortOptions::inline_max`]).
pub const INLINE_MAX: u32 = 64 << 10;

/// The port lock, counted so a completion callback on this thread knows
/// not to take it again. Letting it go runs the disconnect hook for every
/// channel the holder closed, after the lock is released: a hook may call
/// back into the port (or into a CM that calls the port).
type Locked<'a> = PortLock<'a>;

struct PortLock<'a> {
    inner: &'a Inner,
    st: Option<Counted<'a, State>>,
}

impl std::ops::Deref for PortLock<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.st.as_ref().expect("held")
    }
}

impl std::ops::DerefMut for PortLock<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.st.as_mut().expect("held")
    }
}

impl Drop for PortLock<'_> {
    fn drop(&mut self) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        let batch = (!st.flushing && !st.posts.is_empty()).then(|| {
            st.flushing = true;
            let mut batch = std::mem::take(&mut st.flush_bufs);
            std::mem::swap(&mut st.posts, &mut batch);
            batch
        });
        let closed = std::mem::take(&mut st.closed);
        drop(self.st.take());
        if let Some(batch) = batch {
            self.inner.flush_posts(batch);
        }
        if closed.is_empty() {
            return;
        }
        // The hook's slot is let go too before it runs: a hook may set the
        // hook, or make the port close another channel on this thread
        // (whose hook then runs nested, from that call).
        let hook = self
            .inner
            .hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(h) = hook {
            for (conn, why) in &closed {
                h(*conn, why);
            }
        }
    }
}

/// The CA's callbacks: completions are handled right on the provider's
/// thread once the port is up (one thread hand-off less per IU); before
/// that they go to the poll thread.
struct Wake {
    tx: Mutex<Sender<Event>>,
    inner: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// The provider never calls handlers from inside its own calls.
    inline: bool,
}

impl EventHandler for Wake {
    fn on_completion(&self, cq_ctx: u64) {
        match self.inner.get().and_then(std::sync::Weak::upgrade) {
            Some(inner) if self.inline && verbs::nested::may_lock_here() => {
                inner.drain_cq(cq_ctx);
                // Never drop the last reference here: the port's
                // teardown may stop the very thread running this callback.
                if Arc::strong_count(&inner) == 1 {
                    let _ = std::thread::Builder::new()
                        .name("srpt-reap".into())
                        .spawn(move || drop(inner));
                }
            }
            _ => {
                let _ = self.tx.lock().map(|tx| tx.send(Event::Cq(cq_ctx)));
            }
        }
    }
    fn on_async_event(&self, _event: verbs::AsyncEvent) {
        // QP errors surface as flushed completions, which the poller handles.
    }
}

impl TargetPort {
    /// Opens CA `guid` on `provider` and starts a target port with the SRP
    /// settings `config` and the LUNs of `scsi`.
    pub fn start(
        provider: Arc<dyn Provider>,
        guid: Guid,
        config: TargetConfig,
        scsi: Arc<scsi::Target>,
        opts: PortOptions,
    ) -> Result<TargetPort, PortError> {
        config.validate()?;
        let (tx, rx) = mpsc::channel();
        let handler = Arc::new(Wake {
            tx: Mutex::new(tx.clone()),
            inner: std::sync::OnceLock::new(),
            // Posts go out with no lock held, so even a provider that
            // calls back from inside them may have its completions handled
            // on the spot; a caller-driven port takes them in `poll_at`.
            inline: !provider.handlers_nest() || opts.drive == PortDrive::Thread,
        });
        let p = &provider;
        // What is made so far, released again if a later step fails.
        let mut undo = Undo::new(p);
        let ca = p
            .open_ca(guid, 0, handler.clone())
            .map_err(verbs_err("open CA"))?;
        undo.push(move |p| drop(p.close_ca(ca)));
        let attr = p
            .query_port(ca, opts.port)
            .map_err(verbs_err("query port"))?;
        let gid = *attr
            .gids
            .get(opts.sgid_index as usize)
            .ok_or(SetupError::Verbs {
                what: "port GID",
                err: verbs::VerbsError::InvalidArgument("no GID at that index".into()),
            })?;
        let pd = p.alloc_pd(ca, 0).map_err(verbs_err("allocate PD"))?;
        undo.push(move |p| drop(p.dealloc_pd(pd)));
        let srq_len = config.srq_size;
        let recv_cq = p
            .create_cq(pd, &CqInit { cqe: srq_len + 1 }, RECV_CQ_CTX)
            .map_err(verbs_err("create receive CQ"))?;
        undo.push(move |p| drop(p.destroy_cq(recv_cq)));
        let srq = p
            .create_srq(
                pd,
                &SrqAttr {
                    max_wr: srq_len,
                    max_sge: 1,
                    limit: 0,
                },
                0,
            )
            .map_err(verbs_err("create SRQ"))?;
        undo.push(move |p| drop(p.destroy_srq(srq)));
        let req_size = config.max_req_size;
        let req_stride = slot_stride(req_size);
        let srq_buf = MemBuf::new((srq_len * req_stride) as usize);
        let srq_mr = undo.reg_local(pd, &srq_buf, "register receive buffers")?;
        let chunk_size = config.max_rdma_size.max(config.max_table_len);
        let chunk_buf = MemBuf::new(chunk_size as usize * opts.chunks);
        let chunk_mr = undo.reg_local(pd, &chunk_buf, "register RDMA chunks")?;
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let name = target_name(gid);
        let target = Target::new(config)?;
        // The poll thread's events, or the caller's.
        let mut rx = Some(rx);
        let caller = match opts.drive {
            PortDrive::Thread => None,
            PortDrive::Caller => rx.take().map(|events| {
                Mutex::new(CallerDrive {
                    events,
                    now: std::time::Instant::now(),
                })
            }),
        };
        let inner = Arc::new(Inner {
            provider: provider.clone(),
            scsi,
            name,
            gid,
            ca,
            pd,
            recv_cq,
            srq,
            srq_buf,
            srq_mr,
            chunk_buf,
            chunk_mr,
            stores: Mutex::default(),
            req_size,
            req_stride,
            repost_batch: (srq_len as usize / 64).clamp(1, 16),
            chunk_size,
            spill_below: (opts.chunks / 4).max(2),
            direct_in: Default::default(),
            direct_out: Default::default(),
            inline_max: opts.inline_max,
            st: Mutex::new(State {
                target,
                conns: Default::default(),
                by_channel: IdMap::default(),
                free_chunks: (0..opts.chunks).rev().collect(),
                waiting: VecDeque::new(),
                inline_jobs: Vec::new(),
                inline_done: Vec::new(),
                inline_here: false,
                pump_later: Vec::new(),
                next_conn: 1,
                jobs: jobs_tx,
                dev_jobs: HashMap::new(),
                stopping: false,
                last_sweep: std::time::Instant::now(),
                closed: Vec::new(),
                posts: Batch::default(),
                spare_flags: Vec::new(),
                reposts: Vec::new(),
                recv_posted: 0,
                recv_idle: (0..srq_len).rev().collect(),
                flushing: false,
                flush_bufs: Batch::default(),
            }),
            lun_stats: Mutex::new(LunTable::default()),
            events: Mutex::new(tx),
            hook: Mutex::new(None),
            caller,
            opts,
            me: std::sync::OnceLock::new(),
            dev_threads: Mutex::new(Vec::new()),
        });
        let _ = inner.me.set(Arc::downgrade(&inner));
        {
            let mut st = inner.st.lock().unwrap_or_else(|e| e.into_inner());
            inner
                .post_recv_goal(&mut st)
                .map_err(verbs_err("post receive buffers"))?;
        }
        p.req_notify_cq(recv_cq, false)
            .map_err(verbs_err("arm receive CQ"))?;

        let _ = handler.inner.set(Arc::downgrade(&inner));
        // Completions that came before now go through the poll thread.
        let _ = inner
            .events
            .lock()
            .map(|tx| tx.send(Event::Cq(RECV_CQ_CTX)));
        // From here the port's own stop releases everything, threads
        // started so far included, if a thread cannot be started.
        undo.disarm();
        let port = TargetPort {
            inner: inner.clone(),
            threads: Mutex::new(Some(Vec::new())),
        };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<(), PortError> {
            let t = std::thread::Builder::new().name(name).spawn(f)?;
            if let Some(v) = port
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                v.push(t);
            }
            Ok(())
        };
        if let Some(rx) = rx {
            let poller = inner.clone();
            spawn("srpt-poll".into(), Box::new(move || poller.poll_loop(rx)))?;
        }
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for i in 0..inner.opts.workers.max(1) {
            let (w, rx) = (inner.clone(), jobs_rx.clone());
            spawn(
                format!("srpt-scsi-{i}"),
                Box::new(move || w.worker_loop(rx)),
            )?;
        }
        Ok(port)
    }

    /// Target name (port GID with a colon after every fourth digit).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The port GID logins arrive on.
    pub fn gid(&self) -> Gid {
        self.inner.gid
    }

    /// The port's attributes now, as its provider reports them (state,
    /// active MTU): what a device's port negotiated, which no setting of
    /// ours names.
    ///
    /// # Errors
    /// The provider refused the query (the CA went away).
    pub fn port_attr(&self) -> verbs::Result<verbs::PortAttr> {
        self.inner
            .provider
            .query_port(self.inner.ca, self.inner.opts.port)
    }

    /// Called, with why, when the target closes a connection by itself
    /// (logout, protocol violation, failed work request, dead initiator,
    /// a login never established): the CM should send a DREQ (or a REJ,
    /// for a login still waiting for its RTU). Replaces the hook set
    /// before.
    ///
    /// # Locking
    ///
    /// The hook runs on the thread that closed the channel (the poll
    /// thread, a provider's completion thread, a SCSI worker, or the
    /// caller of the port method that closed it, [`TargetPort::poll_at`]
    /// and [`TargetPort::login`] included) once that thread let go of
    /// every lock of the port, so it may call any method of the port
    /// (`on_disconnect` too) or a CM that calls the port. A call that
    /// closes another channel runs the hook for it before returning, so
    /// the hook may be re-entered. The caller of the port method must not
    /// hold a lock the hook takes. The hook should not block for long: the
    /// thread running it may be the one that handles the port's
    /// completions.
    pub fn on_disconnect(&self, hook: impl Fn(ConnId, &CloseReason) + Send + Sync + 'static) {
        *self.inner.hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
    }

    /// The CM established the connection (its RTU came): the login is no
    /// longer pending.
    pub fn established(&self, conn: ConnId) {
        let mut st = self.inner.lock();
        if let Some(c) = st.conns.get_mut(&conn) {
            c.established = true;
        }
    }

    /// A login from a CM REQ: creates the channel and its QP (in RTS) or
    /// says why not. The channel is pending until the CM's RTU
    /// ([`TargetPort::established`]; a caller with no CM calls it once the
    /// initiator has the answer) and is closed if that does not come
    /// within [`PortOptions::login_timeout`].
    pub fn login(&self, private_data: &[u8], form: LoginForm, peer: PeerQp) -> LoginOutcome {
        self.inner.login(private_data, form, peer, None)
    }

    /// [`TargetPort::login`] for a REQ in partition `pkey` (the REQ's partition
    /// key): the QP uses the index of the port's P_Key table entry that
    /// matches it (IBA 10.9.3: same partition, one side a full member; a
    /// full-member entry first); a partition the port does not serve, or
    /// that no entry of its table matches, is refused (SRP_LOGIN_REJ, the
    /// reason naming the P_Key).
    pub fn login_in_partition(
        &self,
        private_data: &[u8],
        form: LoginForm,
        peer: PeerQp,
        pkey: Pkey,
    ) -> LoginOutcome {
        self.inner.login(private_data, form, peer, Some(pkey))
    }

    /// The connection is gone (CM DREQ/DREP, REJ after REP, REP timeout, or
    /// a QP error): flush the QP and release the channel once its work
    /// requests drained. A pending login's channel goes at once.
    pub fn disconnected(&self, conn: ConnId) {
        let mut st = self.inner.lock();
        if let Some(c) = st.conns.get(&conn) {
            tracing::debug!(parent: &c.span, "connection gone");
        }
        self.inner.close(&mut st, conn);
    }

    /// Tells logged-in initiators the LUN inventory or a capacity changed
    /// (SRP_AER_REQ); returns how many channels were told.
    pub fn notify(&self, event: srp::target::AerEvent) -> usize {
        let mut st = self.inner.lock();
        let n = st.target.notify(event);
        let conns: Vec<ConnId> = st.conns.keys().copied().collect();
        for c in conns {
            self.inner.pump(&mut st, c);
        }
        n
    }

    /// Tells every initiator that sees `device` that its capacity changed
    /// (SBC-3 4.6): an SRP_AER_REQ with CAPACITY DATA HAS CHANGED naming
    /// each LUN through which that initiator reaches the device (LUN
    /// masking gives different initiators different numbers). Returns
    /// how many AERs the channels took.
    pub fn capacity_changed(&self, device: &Arc<scsi::Device>) -> usize {
        let mut st = self.inner.lock();
        let scsi = &self.inner.scsi;
        let mut told = 0;
        let conns: Vec<(ConnId, ChannelId, scsi::Nexus)> = st
            .conns
            .iter()
            .map(|(id, c)| (*id, c.channel, c.nexus.clone()))
            .collect();
        for (id, channel, nexus) in conns {
            for lun in scsi.visible_luns(&nexus.initiator, &nexus.target_port) {
                let seen = scsi.device(&nexus, lun);
                if !seen.is_some_and(|d| Arc::ptr_eq(&d, device)) {
                    continue;
                }
                let event = srp::target::AerEvent::CapacityChanged(srp::wire::Lun(lun.encode()));
                let (lun, sense) = event.to_sense();
                if let Some(ch) = st.target.channel_mut(channel) {
                    told += usize::from(ch.send_aer(lun, &sense));
                }
            }
            self.inner.pump(&mut st, id);
        }
        told
    }

    /// Enables or disables the port (SCST's `enabled`): a disabled port
    /// rejects logins and logs its initiators out.
    pub fn set_enabled(&self, enabled: bool) {
        if enabled {
            self.inner.lock().target.set_enabled(true);
        } else {
            self.logout_all(TLogoutReason::NoReason);
        }
    }

    /// Whether logins are accepted.
    pub fn enabled(&self) -> bool {
        self.inner.lock().target.config().enabled
    }

    /// Logs every initiator out (SRP_T_LOGOUT) and disconnects them.
    pub fn logout_all(&self, reason: TLogoutReason) {
        let mut st = self.inner.lock();
        st.target.shutdown(reason);
        let conns: Vec<ConnId> = st.conns.keys().copied().collect();
        for c in conns {
            self.inner.pump(&mut st, c);
        }
    }

    /// A caller-driven port ([`PortDrive::Caller`]): takes `now` as the
    /// port's time (an earlier `now` than before is no time passing),
    /// handles every completion the provider has delivered and fires the
    /// timers due by `now` (login timeouts, keepalives), until nothing is
    /// left to do; all on this thread, disconnect hooks included. A port
    /// with its own poll thread ignores it.
    pub fn poll_at(&self, now: std::time::Instant) {
        let inner = &self.inner;
        let Some(caller) = &inner.caller else {
            return;
        };
        {
            let mut c = caller.lock().unwrap_or_else(|e| e.into_inner());
            c.now = c.now.max(now);
        }
        let mut timers_ran = false;
        loop {
            let events: Vec<Event> = caller
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .events
                .try_iter()
                .collect();
            if events.is_empty() {
                if timers_ran {
                    return;
                }
                // What the timers close may complete more work requests.
                inner.on_timer();
                timers_ran = true;
                continue;
            }
            for ev in events {
                if let Event::Cq(ctx) = ev {
                    inner.drain_cq(ctx);
                }
            }
        }
    }

    /// Live sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let st = self.inner.lock();
        let mut v: Vec<SessionInfo> = st
            .conns
            .iter()
            .filter_map(|(id, c)| {
                let ch = st.target.channel(c.channel)?;
                Some(SessionInfo {
                    conn: *id,
                    initiator: c.initiator.clone(),
                    window: ch.window(),
                    credits: ch.initiator_credits(),
                    in_flight: ch.in_flight(),
                    cmds: ch.stats().cmds,
                    tmfs: ch.stats().tmfs,
                    aers: ch.stats().aers_sent,
                    closing: c.closing,
                    phase: c.phase(),
                    pkey: c.pkey,
                    memory: c.memory(),
                    keepalives: c.keepalives,
                })
            })
            .collect();
        v.sort_by_key(|s| s.conn);
        v
    }

    /// The per-LUN counters, by LUN then device naa; rows of devices no
    /// longer alive are dropped.
    pub fn lun_stats(&self) -> Vec<LunStats> {
        let mut t = self
            .inner
            .lun_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        t.retain(|_, (dev, _)| dev.strong_count() > 0);
        let mut v: Vec<LunStats> = t
            .iter()
            .filter_map(|(&(lun, _), (dev, counters))| {
                Some(LunStats {
                    lun: scsi::Lun::new(lun as u32).ok()?,
                    device: dev.upgrade()?,
                    counters: *counters,
                })
            })
            .collect();
        v.sort_by_key(|s| (s.lun.value(), s.device.config.naa));
        v
    }

    /// Receive buffers in the shared receive queue (or on their way
    /// back): enough for the credits the channels were promised, up to
    /// `srpt_srq_size`, not all of them (see `recv_goal`).
    pub fn receive_buffers_posted(&self) -> usize {
        self.inner.lock().recv_posted
    }

    /// Registered RDMA chunks not in use (all of them when idle).
    pub fn free_chunks(&self) -> usize {
        self.inner.lock().free_chunks.len()
    }

    /// Commands whose data-in went out with no copy: read by the store
    /// straight into registered chunks and sent from there, or sent from a
    /// memory store's own memory (the others are copied).
    pub fn direct_data_in(&self) -> u64 {
        self.inner
            .direct_in
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commands whose data-out the store took straight from the registered
    /// chunks the RDMA READs filled (the others are gathered into one
    /// buffer first).
    pub fn direct_data_out(&self) -> u64 {
        self.inner
            .direct_out
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl TargetPort {
    /// Stops the port now rather than when the last owner drops it: logins
    /// are refused, every channel closes, the threads end and every verbs
    /// object the port holds (SRQ, memory regions, CQ, PD, CA) is released,
    /// so a daemon can count what is left before it exits. Log initiators
    /// out first ([`TargetPort::logout_all`]). Idempotent; drop does it.
    pub fn stop(&self) {
        let Some(threads) = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        {
            let mut st = self.inner.lock();
            st.target.set_enabled(false);
            let conns: Vec<ConnId> = st.conns.keys().copied().collect();
            for c in conns {
                self.inner.close(&mut st, c);
            }
            // Workers leave when the job queue closes.
            let (dead, _) = mpsc::channel();
            st.jobs = dead;
            st.dev_jobs.clear();
            st.stopping = true;
        }
        let _ = self.inner.events.lock().map(|tx| tx.send(Event::Stop));
        let pools = std::mem::take(
            &mut *self
                .inner
                .dev_threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads.into_iter().chain(pools) {
            let _ = t.join();
        }
        let p = &self.inner.provider;
        let _ = p.destroy_srq(self.inner.srq);
        let _ = p.dereg_mr(self.inner.srq_mr.handle);
        let _ = p.dereg_mr(self.inner.chunk_mr.handle);
        for (_, mr, _) in
            std::mem::take(&mut *self.inner.stores.lock().unwrap_or_else(|e| e.into_inner()))
        {
            if let Some(mr) = mr {
                let _ = p.dereg_mr(mr.handle);
            }
        }
        let _ = p.destroy_cq(self.inner.recv_cq);
        let _ = p.dealloc_pd(self.inner.pd);
        let _ = p.close_ca(self.inner.ca);
    }
}

impl Drop for TargetPort {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Verbs objects made so far by a start that may still fail: released in
/// reverse order when dropped, unless disarmed.
struct Undo<'a> {
    provider: &'a Arc<dyn Provider>,
    steps: Vec<UndoStep>,
}

type UndoStep = Box<dyn FnOnce(&dyn Provider)>;

impl<'a> Undo<'a> {
    fn new(provider: &'a Arc<dyn Provider>) -> Undo<'a> {
        Undo {
            provider,
            steps: Vec::new(),
        }
    }

    fn push(&mut self, step: impl FnOnce(&dyn Provider) + 'static) {
        self.steps.push(Box::new(step));
    }

    /// Registers all of `buf` in `pd` for local writes (receive
    /// buffers, RDMA chunks, send slots: no remote access), deregistered
    /// again on undo; `what` names the step in the error.
    fn reg_local(
        &mut self,
        pd: PdHandle,
        buf: &MemBuf,
        what: &'static str,
    ) -> Result<MrInfo, SetupError> {
        let mr = self
            .provider
            .reg_mr(
                pd,
                buf,
                buf.addr(),
                buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(verbs_err(what))?;
        let h = mr.handle;
        self.push(move |p| drop(p.dereg_mr(h)));
        Ok(mr)
    }

    fn disarm(&mut self) {
        self.steps.clear();
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        while let Some(step) = self.steps.pop() {
            step(self.provider.as_ref());
        }
    }
}

/// Receive buffers posted beyond what the credits promised need
/// ([`Inner::recv_goal`]): IUs a peer sends past its window (answered
/// TASK SET FULL, [`srp::target::RESERVED_RECV`] covers only three) land
/// in one rather than draw an RNR NAK.
const RECV_SLACK: usize = 32;

/// The distance between `size`-byte slots of one registered buffer: a
/// whole number of cache lines, so each slot starts word-aligned.
pub(super) fn slot_stride(size: u32) -> u32 {
    size.max(1).next_multiple_of(64)
}

fn rej_bytes(rej: &LoginRej) -> Vec<u8> {
    let mut b = vec![0u8; rej.buffer_len()];
    let n = rej.emit(&mut b).expect("buffer sized by buffer_len");
    b.truncate(n);
    b
}

impl Inner {
    /// The port's time: the caller's ([`PortDrive::Caller`]) or the real
    /// clock's.
    fn now(&self) -> std::time::Instant {
        match &self.caller {
            Some(c) => c.lock().unwrap_or_else(|e| e.into_inner()).now,
            None => std::time::Instant::now(),
        }
    }

    fn lock(&self) -> Locked<'_> {
        PortLock {
            inner: self,
            st: Some(Counted::lock(&self.st)),
        }
    }

    /// Receive buffers the SRQ needs: every credit promised (windows
    /// plus the reserve, [`srp::target::Target::credits_promised`]), the
    /// buffers a repost batch holds back, and [`RECV_SLACK`]; at most
    /// the SRQ's size.
    pub(super) fn recv_goal(&self, st: &State) -> usize {
        let promised = usize::try_from(st.target.credits_promised()).unwrap_or(usize::MAX);
        promised
            .saturating_add(self.repost_batch + RECV_SLACK)
            .min(st.recv_posted + st.recv_idle.len())
    }

    /// Posts idle receive buffers until [`Inner::recv_goal`] are posted
    /// (after a login: before its LOGIN_RSP goes, so before its IUs can
    /// come).
    pub(super) fn post_recv_goal(&self, st: &mut State) -> verbs::Result<()> {
        let want = self.recv_goal(st).saturating_sub(st.recv_posted);
        if want == 0 {
            return Ok(());
        }
        let at = st.recv_idle.len().saturating_sub(want);
        let recvs: Vec<RecvWr> = st.recv_idle[at..]
            .iter()
            .rev()
            .map(|&i| self.recv_wr(i))
            .collect();
        self.provider.post_srq_recv(self.srq, &recvs)?;
        st.recv_idle.truncate(at);
        st.recv_posted += recvs.len();
        Ok(())
    }

    fn recv_wr(&self, index: u32) -> RecvWr {
        RecvWr {
            wr_id: index as u64,
            sges: verbs::sges![Sge {
                addr: self.srq_buf.addr() + (index * self.req_stride) as u64,
                length: self.req_size,
                lkey: self.srq_mr.lkey,
            }],
        }
    }
}

// A job moves by value from the port's queue to where it runs: past 256
// bytes each move is a longer memcpy.
const _: () = assert!(std::mem::size_of::<Job>() <= 256);
