//! One SRP target port over a verbs provider. See the crate documentation.

use crate::names::{initiator_name, target_name};
use rdma_types::{
    AccessFlags, Gid, Guid, IdMap, Lid, Mtu, Pkey, PortNum, Psn, QpState, QpType, Qpn, WcStatus,
};
use srp::target::{
    ChannelId, CmdId, DataOut, Local, Login, LoginForm, OpId, Output, RdmaOp, ScsiDone,
    ScsiRequest, Target, TargetConfig, TmfRequest,
};
use srp::wire::{LoginRej, LoginRejReason, RspCode, TLogoutReason, TmFunc};
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use verbs::nested::Counted;
use verbs::{
    AhAttr, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, PdHandle, Provider, QpAttr,
    QpCaps, QpHandle, QpInit, RecvWr, RemoteAddr, SendFlags, SendOpcode, SendWr, Sge, SrqAttr,
    SrqHandle, WorkCompletion,
};

/// A connection (one SRP channel) of this port; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The initiator's end of a connection, from the CM REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerQp {
    /// Initiator QP number.
    pub qpn: Qpn,
    /// The REQ's starting PSN: the first PSN the initiator expects to
    /// receive, so the target's send PSN (IBA 12.7.25; Linux ib_cm sets
    /// the passive side's sq_psn from it, as the captured rping shows).
    pub psn: Psn,
    /// Initiator port GID.
    pub gid: Gid,
    /// Initiator port LID (0 on RoCE).
    pub lid: Lid,
    /// Path MTU.
    pub mtu: Mtu,
    /// RDMA READs the target may have outstanding at the initiator: the
    /// REP's initiator depth, at most the REQ's responder resources (IBA
    /// 12.7.29). The target fetches data-out by RDMA READ, so a login
    /// offering 0 is refused.
    pub initiator_depth: u8,
    /// The QP's local ACK timeout exponent (4.096 us * 2^n): the REQ's
    /// (twice the path's packet lifetime, as Linux's CM gives a passive
    /// QP), at least 14 (67 ms); 14 for a caller without a CM.
    pub ack_timeout: u8,
}

/// Why the target closed a channel by itself, for its log (the initiator
/// closing it is reported by the CM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The target logged the initiator out (SRP_T_LOGOUT with this reason:
    /// a protocol violation, a SINGLE login replacing the channel, the
    /// LUN mapping removed, shutdown).
    TargetLogout(TLogoutReason),
    /// The initiator asked to log out (SRP_I_LOGOUT).
    InitiatorLogout,
    /// A work request failed and left the QP in error.
    WorkRequestFailed {
        /// The completion status.
        status: WcStatus,
        /// Which kind of work request.
        what: &'static str,
    },
    /// The idle channel's keepalive (a zero-length RDMA WRITE) failed: the
    /// initiator's port no longer acknowledges (its host or process died
    /// without logging out).
    PeerGone {
        /// The keepalive's completion status.
        status: WcStatus,
    },
    /// The CM never established the login (no RTU) within
    /// `login_timeout`.
    LoginTimeout(std::time::Duration),
    /// The oldest unfinished login, dropped to make room for a new one
    /// when `max_pending_logins` were unfinished.
    LoginEvicted {
        /// The limit that was reached.
        limit: usize,
    },
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::TargetLogout(r) => write!(f, "target logout: {r}"),
            CloseReason::InitiatorLogout => write!(f, "the initiator logged out"),
            CloseReason::WorkRequestFailed { status, what } => {
                write!(f, "{what} failed ({status:?}): the QP is in error")
            }
            CloseReason::PeerGone { status } => write!(
                f,
                "the initiator no longer answers: the idle channel's keepalive failed ({status:?})"
            ),
            CloseReason::LoginTimeout(t) => write!(
                f,
                "the login was not established (no CM RTU) within {} ms (login_timeout)",
                t.as_millis()
            ),
            CloseReason::LoginEvicted { limit } => write!(
                f,
                "an unfinished login dropped for a newer one: {limit} logins were unfinished (max_pending_logins raises it)"
            ),
        }
    }
}

/// A channel's place in its life, as `srptadm show` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelPhase {
    /// Accepted, the CM's RTU not yet come.
    Pending,
    /// Established.
    Live,
    /// Closing: waiting for its work requests to drain.
    Closing,
}

impl ChannelPhase {
    /// The word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelPhase::Pending => "pending",
            ChannelPhase::Live => "live",
            ChannelPhase::Closing => "closing",
        }
    }
}

/// The target's end of an accepted connection, for the CM REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalQp {
    /// Target QP number.
    pub qpn: Qpn,
    /// The REP's starting PSN: the first PSN the target expects to receive
    /// (the initiator sends from it).
    pub psn: Psn,
}

/// What to answer a login with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginOutcome {
    /// Send `rsp` (SRP_LOGIN_RSP) as REP private data with `local`.
    Accepted {
        /// The connection, for [`TargetPort::disconnected`].
        conn: ConnId,
        /// The target QP, already in RTS.
        local: LocalQp,
        /// SRP_LOGIN_RSP bytes.
        rsp: Vec<u8>,
    },
    /// Send `rej` (SRP_LOGIN_REJ) as REJ private data.
    Rejected {
        /// SRP_LOGIN_REJ bytes.
        rej: Vec<u8>,
        /// The reason in words, for logs.
        reason: String,
    },
}

/// Port construction errors.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The SRP settings are out of range.
    #[error("{0}")]
    Config(#[from] srp::target::ConfigError),
    /// A verb failed while setting the port up.
    #[error("{what}: {err}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The provider's answer.
        err: verbs::VerbsError,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The login's partition is not one the port serves.
    #[error("{0}")]
    Partition(String),
}

fn verbs_err(what: &'static str) -> impl FnOnce(verbs::VerbsError) -> PortError {
    move |err| PortError::Verbs { what, err }
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
        }
    }
}

/// A session as the admin tool shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Connection.
    pub conn: ConnId,
    /// Initiator name (`0x` + port identifier).
    pub initiator: String,
    /// Credit window granted.
    pub window: u32,
    /// Credits the initiator holds.
    pub credits: u32,
    /// Commands in flight.
    pub in_flight: u32,
    /// SRP_CMDs accepted so far.
    pub cmds: u64,
    /// SRP_TSK_MGMTs accepted so far.
    pub tmfs: u64,
    /// SRP_AER_REQs sent so far.
    pub aers: u64,
    /// Whether the channel is closing.
    pub closing: bool,
    /// Pending (login not established), live or closing.
    pub phase: ChannelPhase,
    /// The session's partition: the P_Key at its QP's index of the
    /// port's table.
    pub pkey: Pkey,
    /// Memory the port holds for the channel itself: its send slots
    /// (`srpt_sq_size` * `srp_max_rsp_size`) and work request tables. The
    /// QP and CQ rings are the provider's.
    pub memory: usize,
    /// Keepalives sent on the idle channel so far.
    pub keepalives: u64,
}

/// What the port did at one LUN, counted where it executes the LUN's
/// commands (SCST keeps its counters per LUN too): the device's own
/// counters mix every port and LUN that reach it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LunCounters {
    /// SRP_CMDs executed.
    pub commands: u64,
    /// READs that ended GOOD.
    pub reads: u64,
    /// WRITEs that ended GOOD.
    pub writes: u64,
    /// Data-in those READs returned.
    pub read_bytes: u64,
    /// Data-out those WRITEs carried.
    pub write_bytes: u64,
    /// Commands that ended in CHECK CONDITION.
    pub errors: u64,
    /// Task management functions addressed to the LUN.
    pub tmfs: u64,
}

/// One LUN's counters and the device mapped there while they counted.
/// The same LUN number mapping different devices (the default set and a
/// group) has one row per device.
#[derive(Clone)]
pub struct LunStats {
    pub lun: scsi::Lun,
    pub device: Arc<scsi::Device>,
    pub counters: LunCounters,
}

/// The counters by (LUN, device address); the device is held weakly so
/// counters of a device the daemon removed go with it.
type LunTable =
    std::collections::HashMap<(u16, usize), (std::sync::Weak<scsi::Device>, LunCounters)>;

type DisconnectHook = Box<dyn Fn(ConnId, &CloseReason) + Send + Sync>;

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
    req_size: u32,
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
    /// Commands handed to the workers and not finished: inline execution
    /// is for a quiet port (latency); a busy one keeps its workers
    /// (parallelism).
    at_workers: std::sync::atomic::AtomicUsize,
    st: Mutex<State>,
    /// Per-LUN counters, under their own lock: the workers update them
    /// without the port lock.
    lun_stats: Mutex<LunTable>,
    events: Mutex<Sender<Event>>,
    hook: Mutex<Option<DisconnectHook>>,
    /// [`PortDrive::Caller`]: the events the poll thread would take, for
    /// [`TargetPort::poll_at`], and the caller's clock.
    caller: Option<Mutex<CallerDrive>>,
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
    /// Data-out still in RDMA chunks (offset, chunk, length), gathered into
    /// `data_out` by the worker, outside the port lock.
    chunks: Option<(u32, Vec<Fetched>)>,
    /// Data-out pieces copied out of their chunks early (offset, bytes).
    spilled: Vec<(u64, Vec<u8>)>,
    /// Data-out that fills its chunks back to back from offset 0: the
    /// store writes it from there (`scsi::Buffers::data_out`), no gather.
    direct_out: Option<Vec<Fetched>>,
    /// Set by a task management function that reached the command before
    /// it entered the SCSI core (see [`Queued`]).
    aborted: Arc<std::sync::atomic::AtomicBool>,
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

/// A data-out piece in an RDMA chunk: (offset in the command's buffer,
/// chunk, length).
type Fetched = (u64, usize, u32);

/// A finished command's data-in.
enum InData {
    /// Built by the core (small commands, or no chunks were free): copied
    /// into a chunk per RDMA WRITE.
    Vec(Vec<u8>),
    /// Read by the store straight into chunks reserved for the command
    /// (`Target::submit_attr_into`); byte `k` of the data is in chunk
    /// `chunks[k / chunk_size]`. WRITEs go out of them with no copy.
    Chunks { chunks: Vec<usize>, len: usize },
}

impl InData {
    fn chunks(&self) -> &[usize] {
        match self {
            InData::Vec(_) => &[],
            InData::Chunks { chunks, .. } => chunks,
        }
    }
}

/// Data-in at least this long is read into reserved chunks, not a vector.
const DIRECT_IN_MIN: u32 = 16 << 10;

/// Where an RDMA op's local side lives.
#[derive(Debug, Clone, Copy)]
struct OpInfo {
    /// The chunk the op took from the pool (none for a WRITE out of its
    /// command's reserved chunks).
    chunk: Option<usize>,
    cmd: CmdId,
    local: Local,
    len: u32,
}

struct Conn {
    channel: ChannelId,
    qp: QpHandle,
    send_cq: CqHandle,
    send_buf: MemBuf,
    send_mr: MrInfo,
    slot_size: u32,
    free_slots: Vec<u32>,
    outstanding: u32,
    closing: bool,
    initiator: String,
    /// The P_Key at the QP's index: the session's partition.
    pkey: Pkey,
    nexus: scsi::Nexus,
    ops: IdMap<OpId, OpInfo>,
    /// Data-out chunks fetched so far per command: (offset, chunk, len).
    fetched: IdMap<CmdId, Vec<Fetched>>,
    /// Data-out pieces copied out of their chunks while chunks ran short:
    /// a command with more pieces than the pool has chunks (an external
    /// table of a thousand small descriptors) must not hold them all.
    spilled: IdMap<CmdId, Vec<(u64, Vec<u8>)>>,
    data_in: IdMap<CmdId, InData>,
    /// Commands with the SCSI core (queued or running).
    queued: IdMap<CmdId, Queued>,
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
}

impl Conn {
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
    /// The thread holding the lock will run `inline_jobs` afterwards.
    inline_here: bool,
    target: Target,
    conns: IdMap<ConnId, Conn>,
    by_channel: IdMap<ChannelId, ConnId>,
    free_chunks: Vec<usize>,
    /// RDMA ops waiting for a chunk.
    waiting: VecDeque<(ConnId, Output)>,
    next_conn: u64,
    jobs: Sender<Job>,
    /// When the keepalive sweep last ran.
    last_sweep: std::time::Instant,
    /// Channels the target closed whose disconnect hook has not run yet
    /// (it runs when the lock is let go).
    closed: Vec<(ConnId, CloseReason)>,
}

const RECV_CQ_CTX: u64 = u64::MAX;
const KIND_SEND: u64 = 1 << 56;
const KIND_RDMA: u64 = 2 << 56;
const KIND_KEEPALIVE: u64 = 3 << 56;
const KIND_MASK: u64 = 0xff << 56;

/// Largest transfer a command may have to run on the thread that got it
/// (the environment variable `SRPT_INLINE=0` turns inline execution off).
const INLINE_MAX: u32 = 64 << 10;

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
        let closed = match self.st.as_mut() {
            Some(st) if !st.closed.is_empty() => std::mem::take(&mut st.closed),
            _ => return,
        };
        drop(self.st.take());
        let hook = self.inner.hook.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = hook.as_ref() {
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
            inline: !provider.handlers_nest(),
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
            .ok_or(PortError::Verbs {
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
        let srq_buf = MemBuf::new((srq_len * req_size) as usize);
        let srq_mr = p
            .reg_mr(
                pd,
                &srq_buf,
                srq_buf.addr(),
                srq_buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(verbs_err("register receive buffers"))?;
        let h = srq_mr.handle;
        undo.push(move |p| drop(p.dereg_mr(h)));
        let chunk_size = config.max_rdma_size.max(config.max_table_len);
        let chunk_buf = MemBuf::new(chunk_size as usize * opts.chunks);
        let chunk_mr = p
            .reg_mr(
                pd,
                &chunk_buf,
                chunk_buf.addr(),
                chunk_buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(verbs_err("register RDMA chunks"))?;
        let h = chunk_mr.handle;
        undo.push(move |p| drop(p.dereg_mr(h)));
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
            req_size,
            chunk_size,
            spill_below: (opts.chunks / 4).max(2),
            direct_in: Default::default(),
            direct_out: Default::default(),
            at_workers: std::sync::atomic::AtomicUsize::new(0),
            inline_max: if std::env::var_os("SRPT_INLINE").is_some_and(|v| v == "0") {
                0
            } else {
                INLINE_MAX
            },
            st: Mutex::new(State {
                target,
                conns: IdMap::default(),
                by_channel: IdMap::default(),
                free_chunks: (0..opts.chunks).rev().collect(),
                waiting: VecDeque::new(),
                inline_jobs: Vec::new(),
                inline_here: false,
                next_conn: 1,
                jobs: jobs_tx,
                last_sweep: std::time::Instant::now(),
                closed: Vec::new(),
            }),
            lun_stats: Mutex::new(LunTable::new()),
            events: Mutex::new(tx),
            hook: Mutex::new(None),
            caller,
            opts,
        });
        let recvs: Vec<RecvWr> = (0..srq_len).map(|i| inner.recv_wr(i)).collect();
        p.post_srq_recv(srq, &recvs)
            .map_err(verbs_err("post receive buffers"))?;
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

    /// Called, with why, when the target closes a connection by itself
    /// (logout, protocol violation, failed work request, dead initiator,
    /// a login never established): the CM should send a DREQ (or a REJ,
    /// for a login still waiting for its RTU). Called on the thread that
    /// closed it once it let go of the port's lock, so the hook may call
    /// the port.
    pub fn on_disconnect(&self, hook: impl Fn(ConnId, &CloseReason) + Send + Sync + 'static) {
        *self.inner.hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(hook));
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
            for lun in scsi.visible_luns(&nexus.initiator) {
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

    /// Registered RDMA chunks not in use (all of them when idle).
    pub fn free_chunks(&self) -> usize {
        self.inner.lock().free_chunks.len()
    }

    /// Commands whose data-in the store read straight into registered
    /// chunks, sent from there with no copy (the others are copied).
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
        }
        let _ = self.inner.events.lock().map(|tx| tx.send(Event::Stop));
        for t in threads {
            let _ = t.join();
        }
        let p = &self.inner.provider;
        let _ = p.destroy_srq(self.inner.srq);
        let _ = p.dereg_mr(self.inner.srq_mr.handle);
        let _ = p.dereg_mr(self.inner.chunk_mr.handle);
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

    fn recv_wr(&self, index: u32) -> RecvWr {
        RecvWr {
            wr_id: index as u64,
            sges: vec![Sge {
                addr: self.srq_buf.addr() + (index * self.req_size) as u64,
                length: self.req_size,
                lkey: self.srq_mr.lkey,
            }],
        }
    }

    /// The P_Key table index for a login in `pkey`, and the P_Key there
    /// (see [`PortOptions::pkeys`]).
    fn pkey_index(&self, pkey: Option<Pkey>) -> Result<(u16, Pkey), PortError> {
        let served = &self.opts.pkeys;
        let table = match self.provider.query_port(self.ca, self.opts.port) {
            Ok(p) => p.pkeys,
            // Nothing to choose from: index 0, as before partitions.
            Err(_) if pkey.is_none() && served.is_empty() => Vec::new(),
            Err(e) => return Err(verbs_err("query port")(e)),
        };
        if pkey.is_none() && served.is_empty() {
            return Ok((0, table.first().copied().unwrap_or(Pkey::DEFAULT)));
        }
        let same = |a: Pkey, b: Pkey| a.is_valid() && a.base() == b.base();
        let names = |t: &[Pkey]| {
            t.iter()
                .filter(|k| k.is_valid())
                .map(|k| format!("{:04x}", k.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let at = |i: usize| u16::try_from(i).ok().map(|ix| (ix, table[i]));
        let Some(k) = pkey else {
            // No partition named: the first served one the table holds.
            let Some(s) = served.iter().find(|s| table.iter().any(|t| same(*t, **s))) else {
                return Err(PortError::Partition(format!(
                    "the port's P_Key table ({}) holds none of the partitions served ({})",
                    names(&table),
                    names(served)
                )));
            };
            let i = table
                .iter()
                .position(|t| t == s)
                .or_else(|| table.iter().position(|t| same(*t, *s)));
            return i
                .and_then(at)
                .ok_or_else(|| PortError::Partition(format!("P_Key {:04x} left the table", s.0)));
        };
        if !served.is_empty() && !served.iter().any(|s| same(*s, k)) {
            return Err(PortError::Partition(format!(
                "P_Key {:04x}: the target does not serve that partition (it serves {})",
                k.0,
                names(served)
            )));
        }
        // IBA 10.9.3: the entry must match the REQ's key (same partition,
        // one side a full member); a full entry matches every member, so
        // it goes first (as Linux ib_find_cached_pkey prefers it).
        let i = table
            .iter()
            .position(|t| t.is_full() && t.matches(k))
            .or_else(|| table.iter().position(|t| t.matches(k)));
        if let Some(r) = i.and_then(at) {
            return Ok(r);
        }
        Err(PortError::Partition(if table.iter().any(|t| same(*t, k)) {
            format!(
                    "P_Key {:04x}: the initiator and the target port are both limited members of that partition (its P_Key table: {})",
                    k.0,
                    names(&table)
                )
        } else {
            format!(
                    "P_Key {:04x}: the target port is not a member of that partition (its P_Key table: {})",
                    k.0,
                    names(&table)
                )
        }))
    }

    fn login(
        &self,
        data: &[u8],
        form: LoginForm,
        peer: PeerQp,
        pkey: Option<Pkey>,
    ) -> LoginOutcome {
        let mut st = self.lock();
        if let Some(refused) = self.refuse_pending(&mut st, data, form, peer) {
            return refused;
        }
        let conn = ConnId(st.next_conn);
        st.next_conn += 1;
        let (channel, rsp, terminated) = match st.target.login_private_data(data, form) {
            Login::Accepted {
                channel,
                rsp,
                terminated,
            } => (channel, rsp, terminated),
            Login::Rejected(rej) => {
                let mut reason = st
                    .target
                    .last_refusal()
                    .map_or_else(|| rej.reason.to_string(), str::to_string);
                // A login for another target port (an initiator that still
                // has an old id_ext/ioc_guid, say) is told apart in the log.
                let req = match form {
                    LoginForm::IbCm => srp::wire::LoginReq::parse(data),
                    LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(data),
                };
                let ours = st.target.config().target_port_id;
                if let Ok(req) = req.map(|r| r.target_port_id) {
                    if rej.reason == LoginRejReason::UnableAssociateChannel && req != ours {
                        reason = format!(
                            "{reason}: it names target port id_ext {:016x} ioc_guid {:016x}, this port is id_ext {:016x} ioc_guid {:016x}",
                            req.id_ext(),
                            req.guid(),
                            ours.id_ext(),
                            ours.guid()
                        );
                    }
                }
                return LoginOutcome::Rejected {
                    reason,
                    rej: rej_bytes(&rej),
                };
            }
        };
        let (initiator, sq) = {
            let ch = st.target.channel(channel).expect("channel just created");
            (initiator_name(&ch.nexus().0), st.target.config().sq_size)
        };
        let slot_size = st.target.config().max_rsp_size;
        let created = self.pkey_index(pkey).and_then(|(ix, key)| {
            self.create_conn(conn, peer, ix, sq, slot_size, &initiator)
                .map(|(c, local)| (c, local, key))
        });
        match created {
            Ok((mut c, local, key)) => {
                c.channel = channel;
                c.pkey = key;
                st.by_channel.insert(channel, conn);
                st.conns.insert(conn, c);
                // The poll thread times the login from now.
                let _ = self.events.lock().map(|tx| tx.send(Event::Timer));
                for t in terminated {
                    if let Some(&tc) = st.by_channel.get(&t) {
                        self.pump(&mut st, tc);
                    }
                }
                let mut b = vec![0u8; rsp.buffer_len()];
                let n = rsp.emit(&mut b).expect("buffer sized by buffer_len");
                b.truncate(n);
                LoginOutcome::Accepted {
                    conn,
                    local,
                    rsp: b,
                }
            }
            Err(e) => {
                st.target.remove(channel);
                let rej = LoginRej {
                    reason: LoginRejReason::UnableEstablishChannel,
                    tag: rsp.tag,
                    buf_fmt: rsp.buf_fmt,
                };
                LoginOutcome::Rejected {
                    reason: format!("cannot set up the RDMA channel: {e}"),
                    rej: rej_bytes(&rej),
                }
            }
        }
    }

    /// The bounds on unfinished logins (accepted, no RTU yet), checked
    /// before a login creates anything: one initiator port may have
    /// `max_pending_per_initiator` (beyond: refused, INSUFFICIENT
    /// RESOURCES), the port `max_pending_logins` (beyond: the oldest
    /// unfinished login is dropped, so a flood of half-open logins from
    /// many ports cannot keep a good initiator out, whose login finishes
    /// within a round trip). Also refuses a REQ that lets the target no
    /// RDMA READ.
    fn refuse_pending(
        &self,
        st: &mut State,
        data: &[u8],
        form: LoginForm,
        peer: PeerQp,
    ) -> Option<LoginOutcome> {
        let req = match form {
            LoginForm::IbCm => srp::wire::LoginReq::parse(data),
            LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(data),
        }
        .ok()?;
        let refuse = |reason: String| {
            let rej = LoginRej {
                reason: LoginRejReason::InsufficientResources,
                tag: req.tag,
                buf_fmt: st.target.config().buf_formats,
            };
            Some(LoginOutcome::Rejected {
                reason,
                rej: rej_bytes(&rej),
            })
        };
        if peer.initiator_depth == 0 {
            return refuse(
                "the initiator's QP takes no RDMA READ (REQ responder resources 0): the target could not fetch data-out"
                    .into(),
            );
        }
        let name = initiator_name(&req.initiator_port_id);
        let pending: Vec<(std::time::Instant, ConnId, bool)> = st
            .conns
            .iter()
            .filter(|(_, c)| c.phase() == ChannelPhase::Pending)
            .map(|(id, c)| (c.accepted_at, *id, c.initiator == name))
            .collect();
        let mine = pending.iter().filter(|p| p.2).count();
        let per = self.opts.max_pending_per_initiator;
        if mine >= per {
            return refuse(format!(
                "the initiator has {mine} logins not yet established, the most one initiator port may have (max_pending_per_initiator = {per} raises it)"
            ));
        }
        let limit = self.opts.max_pending_logins;
        if pending.len() >= limit {
            if let Some(&(_, oldest, _)) = pending.iter().min() {
                self.drop_channel(st, oldest, CloseReason::LoginEvicted { limit });
            }
        }
        None
    }

    /// Creates the QP, its send CQ and send slots, and connects the QP.
    fn create_conn(
        &self,
        conn: ConnId,
        peer: PeerQp,
        pkey_index: u16,
        sq: u32,
        slot_size: u32,
        initiator: &str,
    ) -> Result<(Conn, LocalQp), PortError> {
        let p = &self.provider;
        let send_cq = p
            .create_cq(self.pd, &CqInit { cqe: sq + 2 }, conn.0)
            .map_err(verbs_err("create send CQ"))?;
        let qp = match p.create_qp(
            self.pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq,
                recv_cq: self.recv_cq,
                srq: Some(self.srq),
                caps: QpCaps {
                    // One beyond the channel's own for a keepalive.
                    max_send_wr: sq + 1,
                    max_recv_wr: 0,
                    // A WRITE out of reserved chunks may span two.
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline: 0,
                },
                sq_sig_all: true,
                port: None,
            },
            conn.0,
        ) {
            Ok(qp) => qp,
            Err(e) => {
                let _ = p.destroy_cq(send_cq);
                return Err(PortError::Verbs {
                    what: "create QP",
                    err: e,
                });
            }
        };
        let send_buf = MemBuf::new((sq * slot_size) as usize);
        let cleanup = |p: &Arc<dyn Provider>| {
            let _ = p.destroy_qp(qp);
            let _ = p.destroy_cq(send_cq);
        };
        let send_mr = match p.reg_mr(
            self.pd,
            &send_buf,
            send_buf.addr(),
            send_buf.len() as u64,
            AccessFlags::LOCAL_WRITE,
            0,
        ) {
            Ok(m) => m,
            Err(e) => {
                cleanup(p);
                return Err(PortError::Verbs {
                    what: "register send slots",
                    err: e,
                });
            }
        };
        let psn = Psn::new((conn.0 as u32).wrapping_mul(0x9e37_79b9) >> 8);
        if let Err(e) = self.connect_qp(qp, peer, pkey_index, psn) {
            let _ = p.dereg_mr(send_mr.handle);
            cleanup(p);
            return Err(e);
        }
        if let Err(e) = p.req_notify_cq(send_cq, false) {
            let _ = p.dereg_mr(send_mr.handle);
            cleanup(p);
            return Err(PortError::Verbs {
                what: "arm send CQ",
                err: e,
            });
        }
        let qpn = p.qp_num(qp).map_err(verbs_err("QP number"))?;
        let nexus = scsi::Nexus::new(initiator, &self.name);
        Ok((
            Conn {
                channel: ChannelId(0),
                qp,
                send_cq,
                send_buf,
                send_mr,
                slot_size,
                free_slots: (0..sq).rev().collect(),
                outstanding: 0,
                closing: false,
                initiator: initiator.to_string(),
                pkey: Pkey::DEFAULT,
                nexus,
                ops: IdMap::default(),
                fetched: IdMap::default(),
                spilled: IdMap::default(),
                data_in: IdMap::default(),
                queued: IdMap::default(),
                parked: IdMap::default(),
                established: false,
                accepted_at: self.now(),
                activity: 0,
                activity_seen: 0,
                keepalive_out: false,
                keepalives: 0,
                close_reason: None,
            },
            LocalQp { qpn, psn },
        ))
    }

    fn connect_qp(
        &self,
        qp: QpHandle,
        peer: PeerQp,
        pkey_index: u16,
        psn: Psn,
    ) -> Result<(), PortError> {
        let p = &self.provider;
        let port = self.opts.port;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(port),
                pkey_index: Some(pkey_index),
                access: Some(AccessFlags::NONE),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to INIT"))?;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr {
                    dlid: peer.lid,
                    port,
                    grh: true,
                    dgid: peer.gid,
                    sgid_index: self.opts.sgid_index,
                    sl: 0,
                    hop_limit: 64,
                }),
                path_mtu: Some(peer.mtu),
                dest_qpn: Some(peer.qpn),
                rq_psn: Some(psn),
                max_dest_rd_atomic: Some(0),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTR"))?;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(peer.psn),
                timeout: Some(peer.ack_timeout.clamp(14, 31)),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(peer.initiator_depth),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTS"))?;
        Ok(())
    }

    fn poll_loop(&self, rx: Receiver<Event>) {
        loop {
            let ev = match self.next_deadline() {
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(at) => {
                    rx.recv_timeout(at.saturating_duration_since(std::time::Instant::now()))
                }
            };
            match ev {
                Ok(Event::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Event::Cq(ctx)) => self.drain_cq(ctx),
                Ok(Event::Timer) | Err(mpsc::RecvTimeoutError::Timeout) => self.on_timer(),
            }
        }
    }

    /// When the poll thread must look at the channels next: the oldest
    /// pending login's timeout, and the next keepalive sweep while any
    /// channel is established. `None`: nothing to time.
    fn next_deadline(&self) -> Option<std::time::Instant> {
        let st = self.lock();
        let pending = st
            .conns
            .values()
            .filter(|c| !c.established && !c.closing)
            .map(|c| c.accepted_at + self.opts.login_timeout)
            .min();
        let sweep = self.opts.keepalive.and_then(|k| {
            st.conns
                .values()
                .any(|c| c.established && !c.closing)
                .then_some(st.last_sweep + k)
        });
        pending.into_iter().chain(sweep).min()
    }

    /// Closes logins that were not established in time, and sends a
    /// keepalive on every established channel that had no completion
    /// since the last sweep.
    fn on_timer(&self) {
        let now = self.now();
        let mut st = self.lock();
        let timeout = self.opts.login_timeout;
        let late: Vec<ConnId> = st
            .conns
            .iter()
            .filter(|(_, c)| !c.established && !c.closing && now >= c.accepted_at + timeout)
            .map(|(id, _)| *id)
            .collect();
        for conn in late {
            self.drop_channel(&mut st, conn, CloseReason::LoginTimeout(timeout));
        }
        let Some(every) = self.opts.keepalive else {
            return;
        };
        if now < st.last_sweep + every {
            return;
        }
        st.last_sweep = now;
        let idle: Vec<ConnId> = st
            .conns
            .iter_mut()
            .filter_map(|(id, c)| {
                let idle = c.established
                    && !c.closing
                    && !c.keepalive_out
                    && c.outstanding == 0
                    && c.activity == c.activity_seen;
                c.activity_seen = c.activity;
                idle.then_some(*id)
            })
            .collect();
        for conn in idle {
            self.send_keepalive(&mut st, conn);
        }
    }

    /// A zero-length RDMA WRITE: no memory is touched at either end (IBA
    /// C9-88: no R_Key is checked), but the initiator's NIC must
    /// acknowledge it, so it completes in error if the initiator is gone.
    fn send_keepalive(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let mut wr = SendWr::new(KIND_KEEPALIVE, SendOpcode::RdmaWrite, Vec::new());
        wr.remote = RemoteAddr {
            addr: 0,
            rkey: rdma_types::Rkey(0),
        };
        if self.provider.post_send(c.qp, &[wr]).is_ok() {
            c.outstanding += 1;
            c.keepalive_out = true;
            c.keepalives += 1;
        }
    }

    /// Closes a channel for a reason of the port's own (not the SRP
    /// channel's): the channel is told the connection is lost and, once
    /// its work requests drained, the disconnect hook runs with `why`.
    fn drop_channel(&self, st: &mut State, conn: ConnId, why: CloseReason) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        if c.closing || c.close_reason.is_some() {
            return;
        }
        c.close_reason = Some(why);
        let channel = c.channel;
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.connection_lost();
        }
        self.pump(st, conn);
    }

    /// A command came back from the SCSI core: its data-in and response
    /// go out from the calling thread (a worker), with no hop through the
    /// poller.
    fn scsi_done(&self, conn: ConnId, done: ScsiDone, data_in: InData) {
        let mut st = self.lock();
        self.done_locked(&mut st, conn, done, data_in);
        self.run_inline(st);
    }

    /// Hands a finished command to its channel and sends what follows;
    /// commands that come out small enough are kept for this thread.
    fn done_locked(&self, st: &mut State, conn: ConnId, done: ScsiDone, data_in: InData) {
        let Some(c) = st.conns.get_mut(&conn) else {
            // The connection went while the command ran.
            st.free_chunks.extend_from_slice(data_in.chunks());
            return;
        };
        let (cmd, channel) = (done.cmd, c.channel);
        c.queued.remove(&cmd);
        c.data_in.insert(cmd, data_in);
        let taken = st
            .target
            .channel_mut(channel)
            .is_some_and(|ch| ch.handle_scsi_done(done));
        if !taken {
            // The channel dropped the command while it ran (it is closing)
            // and released it already: no WRITE will name these chunks.
            if let Some(d) = st.conns.get_mut(&conn).and_then(|c| c.data_in.remove(&cmd)) {
                st.free_chunks.extend_from_slice(d.chunks());
            }
        }
        st.inline_here = true;
        self.pump(st, conn);
    }

    fn drain_cq(&self, ctx: u64) {
        let mut st = self.lock();
        st.inline_here = true;
        self.drain_cq_locked(&mut st, ctx);
        self.run_inline(st);
    }

    /// Runs the commands `submit_scsi` kept for this thread, with the lock
    /// released, until none are left (their responses may start more).
    fn run_inline<'a>(&'a self, mut st: Locked<'a>) {
        loop {
            let jobs = std::mem::take(&mut st.inline_jobs);
            if jobs.is_empty() {
                st.inline_here = false;
                return;
            }
            drop(st);
            for mut job in jobs {
                self.gather_job(&mut job);
                let (done, data_in) = self.execute(&job);
                self.done_locked(&mut self.lock(), job.conn, done, data_in);
            }
            st = self.lock();
        }
    }

    fn drain_cq_locked(&self, st: &mut State, ctx: u64) {
        let cq = if ctx == RECV_CQ_CTX {
            self.recv_cq
        } else {
            match st.conns.get(&ConnId(ctx)) {
                Some(c) => c.send_cq,
                None => return,
            }
        };
        let mut wcs =
            [WorkCompletion::new(0, WcStatus::Success, rdma_types::WcOpcode::Send, 0); 32];
        let mut armed = false;
        loop {
            let n = match self.provider.poll_cq(cq, &mut wcs) {
                Ok(n) => n,
                Err(_) => return,
            };
            for wc in &wcs[..n] {
                if ctx == RECV_CQ_CTX {
                    self.on_recv(st, wc);
                } else {
                    self.on_send_wc(st, ConnId(ctx), wc);
                }
            }
            if n == 0 {
                if armed {
                    break;
                }
                // Arm, then look once more: a completion that landed
                // between the last poll and the arm is not lost.
                if self.provider.req_notify_cq(cq, false).is_err() {
                    break;
                }
                armed = true;
            }
        }
        self.retry_waiting(st);
    }

    fn on_recv(&self, st: &mut State, wc: &WorkCompletion) {
        let index = wc.wr_id as u32;
        let conn = ConnId(wc.qp_ctx);
        if wc.status == WcStatus::Success {
            if let Some(c) = st.conns.get_mut(&conn) {
                c.activity += 1;
                let channel = c.channel;
                let off = (index * self.req_size) as usize;
                let len = (wc.byte_len as usize).min(self.req_size as usize);
                let bytes = self.srq_buf.to_vec(off, len);
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_recv(&bytes);
                }
                self.pump(st, conn);
            }
        }
        // The channel copied what it keeps: the buffer goes straight back.
        let _ = self
            .provider
            .post_srq_recv(self.srq, &[self.recv_wr(index)]);
    }

    fn on_send_wc(&self, st: &mut State, conn: ConnId, wc: &WorkCompletion) {
        let ok = wc.status == WcStatus::Success;
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        c.outstanding = c.outstanding.saturating_sub(1);
        c.activity += 1;
        let channel = c.channel;
        // The first failure names the close, unless the channel was
        // already logging out (its reason stands; the failure follows it).
        let live = st
            .target
            .channel(channel)
            .is_some_and(|ch| ch.state() == srp::target::ChannelState::Live);
        if !ok && live && !c.closing && c.close_reason.is_none() {
            let kind = wc.wr_id & KIND_MASK;
            c.close_reason = Some(if kind == KIND_KEEPALIVE {
                CloseReason::PeerGone { status: wc.status }
            } else {
                CloseReason::WorkRequestFailed {
                    status: wc.status,
                    what: match kind {
                        KIND_SEND => "an IU SEND",
                        KIND_RDMA => "an RDMA READ or WRITE",
                        _ => "a work request",
                    },
                }
            });
        }
        match wc.wr_id & KIND_MASK {
            KIND_KEEPALIVE => {
                c.keepalive_out = false;
                if !ok {
                    if let Some(ch) = st.target.channel_mut(channel) {
                        ch.connection_lost();
                    }
                }
            }
            KIND_SEND => {
                c.free_slots.push((wc.wr_id & !KIND_MASK) as u32);
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(ok);
                }
            }
            KIND_RDMA => {
                let op = OpId(wc.wr_id & !KIND_MASK);
                let Some(info) = c.ops.remove(&op) else {
                    return;
                };
                match info.local {
                    Local::Table { .. } => {
                        let chunk = info.chunk.expect("a table read takes a chunk");
                        let bytes = ok.then(|| {
                            self.chunk_buf
                                .to_vec(chunk * self.chunk_size as usize, info.len as usize)
                        });
                        st.free_chunks.push(chunk);
                        if let Some(ch) = st.target.channel_mut(channel) {
                            ch.handle_table_read(op, bytes.as_deref());
                        }
                    }
                    Local::DataOut { offset } => {
                        let chunk = info.chunk.expect("a data-out READ takes a chunk");
                        if ok && st.free_chunks.len() < self.spill_below {
                            let bytes = self
                                .chunk_buf
                                .to_vec(chunk * self.chunk_size as usize, info.len as usize);
                            c.spilled.entry(info.cmd).or_default().push((offset, bytes));
                            st.free_chunks.push(chunk);
                        } else if ok {
                            c.fetched
                                .entry(info.cmd)
                                .or_default()
                                .push((offset, chunk, info.len));
                        } else {
                            st.free_chunks.push(chunk);
                        }
                        if let Some(ch) = st.target.channel_mut(channel) {
                            ch.handle_rdma_done(op, ok);
                        }
                    }
                    Local::DataIn { .. } => {
                        st.free_chunks.extend(info.chunk);
                        if info.chunk.is_none()
                            && !c
                                .ops
                                .values()
                                .any(|o| o.cmd == info.cmd && o.chunk.is_none())
                        {
                            if let Some(chunks) = c.parked.remove(&info.cmd) {
                                st.free_chunks.extend(chunks);
                            }
                        }
                        if let Some(ch) = st.target.channel_mut(channel) {
                            ch.handle_rdma_done(op, ok);
                        }
                    }
                }
            }
            _ => {}
        }
        self.pump(st, conn);
    }

    /// Carries out every output the channel has.
    fn pump(&self, st: &mut State, conn: ConnId) {
        loop {
            let Some(c) = st.conns.get(&conn) else {
                return;
            };
            let channel = c.channel;
            let Some(out) = st
                .target
                .channel_mut(channel)
                .and_then(|ch| ch.poll_output())
            else {
                break;
            };
            self.carry_out(st, conn, out);
        }
        self.maybe_finish(st, conn);
    }

    fn carry_out(&self, st: &mut State, conn: ConnId, out: Output) {
        match out {
            Output::Send { bytes, solicited } => {
                // An IU never overtakes this channel's RDMA ops waiting for
                // a chunk: the channel hands out a TMF response only once
                // the commands it aborts are back from the core, but a
                // command that completed first still has its data-in
                // WRITEs ahead of it, and a TMF response overtaking them
                // would let the initiator reuse the buffer they land in.
                if st.waiting.iter().any(|(c, _)| *c == conn) {
                    st.waiting
                        .push_back((conn, Output::Send { bytes, solicited }));
                } else {
                    self.post_send_iu(st, conn, &bytes, solicited)
                }
            }
            Output::RdmaRead(op) | Output::RdmaWrite(op) => {
                if !self.post_rdma(st, conn, &out, op) {
                    st.waiting.push_back((conn, out));
                }
            }
            Output::Scsi(req) => self.submit_scsi(st, conn, req),
            Output::Tmf(req) => self.run_tmf(st, conn, req),
            Output::Abort(_) => {
                // The core's later completion is ignored by the channel; a
                // running backend I/O is not interrupted (the channel is
                // closing: no TMF response waits for it).
            }
            Output::Release(cmd) => {
                if let Some(c) = st.conns.get_mut(&conn) {
                    if let Some(d) = c.data_in.remove(&cmd) {
                        let chunks = d.chunks().to_vec();
                        let busy = c.ops.values().any(|o| o.cmd == cmd && o.chunk.is_none());
                        if busy && !chunks.is_empty() {
                            c.parked.insert(cmd, chunks);
                        } else {
                            st.free_chunks.extend(chunks);
                        }
                    }
                    c.spilled.remove(&cmd);
                    if let Some(chunks) = c.fetched.remove(&cmd) {
                        st.free_chunks
                            .extend(chunks.into_iter().map(|(_, ch, _)| ch));
                    }
                }
            }
            Output::Disconnect => {
                let why = self.close_reason(st, conn);
                self.close(st, conn);
                // The hook runs once the lock is let go (`PortLock`).
                st.closed.push((conn, why));
            }
        }
    }

    fn post_send_iu(&self, st: &mut State, conn: ConnId, bytes: &[u8], solicited: bool) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let channel = c.channel;
        let slot = match c.free_slots.pop() {
            Some(s) if bytes.len() <= c.slot_size as usize => s,
            other => {
                // The channel never has more than srpt_sq_size work requests
                // out and never builds an IU above srp_max_rsp_size, so this
                // is a bug: fail the send rather than corrupt a slot.
                if let Some(s) = other {
                    c.free_slots.push(s);
                }
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(false);
                }
                return;
            }
        };
        let off = slot as usize * c.slot_size as usize;
        c.send_buf.write_at(off, bytes);
        let mut wr = SendWr::new(
            KIND_SEND | slot as u64,
            SendOpcode::Send,
            vec![Sge {
                addr: c.send_buf.addr() + off as u64,
                length: bytes.len() as u32,
                lkey: c.send_mr.lkey,
            }],
        );
        if solicited {
            wr.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
        }
        match self.provider.post_send(c.qp, &[wr]) {
            Ok(()) => c.outstanding += 1,
            Err(_) => {
                c.free_slots.push(slot);
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(false);
                }
            }
        }
    }

    /// Posts an RDMA op; false when no chunk is free (the op waits).
    fn post_rdma(&self, st: &mut State, conn: ConnId, out: &Output, op: RdmaOp) -> bool {
        let read = matches!(out, Output::RdmaRead(_));
        if op.len > self.chunk_size {
            // Larger than any chunk: the channel splits at srp_max_rdma_size
            // and tables are bounded by max_table_len, so only a table over
            // the chunk size lands here.
            self.fail_rdma(st, conn, op);
            return true;
        }
        let cs = self.chunk_size as usize;
        // A WRITE of data-in the store read into the command's own chunks
        // goes straight out of them.
        let reserved = match (
            op.local,
            st.conns.get(&conn).and_then(|c| c.data_in.get(&op.cmd)),
        ) {
            (Local::DataIn { offset }, Some(InData::Chunks { chunks, len })) => {
                Some(self.reserved_sges(chunks, *len, offset as usize, op.len as usize))
            }
            _ => None,
        };
        let (chunk, sges) = match reserved {
            Some(sges) => (None, sges),
            None => {
                let Some(chunk) = st.free_chunks.pop() else {
                    return false;
                };
                (
                    Some(chunk),
                    vec![Sge {
                        addr: self.chunk_buf.addr() + (chunk * cs) as u64,
                        length: op.len,
                        lkey: self.chunk_mr.lkey,
                    }],
                )
            }
        };
        let Some(c) = st.conns.get_mut(&conn) else {
            st.free_chunks.extend(chunk);
            return true;
        };
        if let (Local::DataIn { offset }, Some(chunk)) = (op.local, chunk) {
            let chunk_off = chunk * cs;
            let data = match c.data_in.get(&op.cmd) {
                Some(InData::Vec(v)) => v.as_slice(),
                _ => &[],
            };
            let start = (offset as usize).min(data.len());
            let end = (offset as usize + op.len as usize).min(data.len());
            self.chunk_buf.write_at(chunk_off, &data[start..end]);
            if end - start < op.len as usize {
                let zeros = vec![0u8; op.len as usize - (end - start)];
                self.chunk_buf.write_at(chunk_off + (end - start), &zeros);
            }
        }
        let mut wr = SendWr::new(
            KIND_RDMA | op.id.0,
            if read {
                SendOpcode::RdmaRead
            } else {
                SendOpcode::RdmaWrite
            },
            sges,
        );
        wr.remote = RemoteAddr {
            addr: op.remote_va,
            rkey: op.rkey,
        };
        match self.provider.post_send(c.qp, &[wr]) {
            Ok(()) => {
                c.outstanding += 1;
                c.ops.insert(
                    op.id,
                    OpInfo {
                        chunk,
                        cmd: op.cmd,
                        local: op.local,
                        len: op.len,
                    },
                );
            }
            Err(_) => {
                st.free_chunks.extend(chunk);
                self.fail_rdma(st, conn, op);
            }
        }
        true
    }

    /// The SGEs of `[offset, offset + len)` of data-in held in reserved
    /// chunks (`placed` bytes of it real). Bytes past `placed` are zeroed
    /// first: whatever an earlier command left in a chunk never leaves.
    fn reserved_sges(
        &self,
        chunks: &[usize],
        placed: usize,
        offset: usize,
        len: usize,
    ) -> Vec<Sge> {
        let cs = self.chunk_size as usize;
        let mut sges = Vec::with_capacity(2);
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let Some(&chunk) = chunks.get(at / cs) else {
                // Past the reserved chunks (more than the command's
                // data-in length): the channel never asks for that; send
                // nothing rather than someone else's bytes.
                break;
            };
            let within = at % cs;
            let n = (cs - within).min(end - at);
            let base = chunk * cs + within;
            if at + n > placed {
                let from = placed.max(at);
                self.chunk_buf
                    .write_at(base + (from - at), &vec![0u8; at + n - from]);
            }
            sges.push(Sge {
                addr: self.chunk_buf.addr() + base as u64,
                length: n as u32,
                lkey: self.chunk_mr.lkey,
            });
            at += n;
        }
        sges
    }

    fn fail_rdma(&self, st: &mut State, conn: ConnId, op: RdmaOp) {
        let Some(channel) = st.conns.get(&conn).map(|c| c.channel) else {
            return;
        };
        if let Some(ch) = st.target.channel_mut(channel) {
            match op.local {
                Local::Table { .. } => ch.handle_table_read(op.id, None),
                _ => ch.handle_rdma_done(op.id, false),
            }
        }
    }

    fn retry_waiting(&self, st: &mut State) {
        while let Some((conn, out)) = st.waiting.pop_front() {
            if !st.conns.contains_key(&conn) {
                continue;
            }
            let op = match &out {
                Output::RdmaRead(op) | Output::RdmaWrite(op) => *op,
                Output::Send { bytes, solicited } => {
                    self.post_send_iu(st, conn, bytes, *solicited);
                    continue;
                }
                _ => continue,
            };
            if !self.post_rdma(st, conn, &out, op) {
                st.waiting.push_front((conn, out));
                break;
            }
            self.pump(st, conn);
        }
    }

    fn submit_scsi(&self, st: &mut State, conn: ConnId, req: ScsiRequest) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let (data_out, chunks) = match &req.data_out {
            DataOut::None => (Vec::new(), None),
            DataOut::Immediate(v) => (v.clone(), None),
            DataOut::InBuffer { len } => (
                Vec::new(),
                Some((*len, c.fetched.remove(&req.cmd).unwrap_or_default())),
            ),
        };
        let spilled = c.spilled.remove(&req.cmd).unwrap_or_default();
        let aborted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        c.queued.insert(
            req.cmd,
            Queued {
                tag: req.tag,
                lun: req.lun,
                aborted: aborted.clone(),
            },
        );
        // A small command to a memory store runs on this thread once the
        // lock is released: two thread hand-offs less (to a worker and back
        // to the NIC) for what takes a microsecond.
        let inline = st.inline_here
            && st.inline_jobs.is_empty()
            && self.at_workers.load(std::sync::atomic::Ordering::Relaxed) == 0
            && req.data_in_len.max(match &req.data_out {
                DataOut::None => 0,
                DataOut::Immediate(v) => v.len() as u32,
                DataOut::InBuffer { len } => *len,
            }) <= self.inline_max
            && self.inline_max > 0
            && matches!(req.attr, srp::wire::TaskAttr::Simple)
            && scsi::Lun::decode(req.lun.0)
                .is_ok_and(|lun| self.scsi.runs_without_blocking(&c.nexus, lun));
        let job = Job {
            conn,
            nexus: c.nexus.clone(),
            req,
            data_out,
            chunks,
            spilled,
            direct_out: None,
            aborted,
        };
        if inline {
            st.inline_jobs.push(job);
            return;
        }
        self.at_workers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(mpsc::SendError(job)) = st.jobs.send(job) {
            self.at_workers
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            // Shutting down: answer BUSY so the initiator retries elsewhere.
            if let Some((_, parts)) = &job.chunks {
                st.free_chunks.extend(parts.iter().map(|p| p.1));
            }
            if let Some(c) = st.conns.get_mut(&conn) {
                c.queued.remove(&job.req.cmd);
            }
            let done = ScsiDone {
                status: 0x08,
                ..ScsiDone::good(job.req.cmd, 0)
            };
            if let Some(ch) = st.target.channel_mut(st.conns[&conn].channel) {
                ch.handle_scsi_done(done);
            }
        }
    }

    fn run_tmf(&self, st: &mut State, conn: ConnId, req: TmfRequest) {
        let Some(c) = st.conns.get(&conn) else {
            return;
        };
        let channel = c.channel;
        let tmf = match req.func {
            TmFunc::AbortTask => Some(scsi::Tmf::AbortTask(req.task_tag.0)),
            TmFunc::AbortTaskSet => Some(scsi::Tmf::AbortTaskSet),
            TmFunc::ClearTaskSet => Some(scsi::Tmf::ClearTaskSet),
            TmFunc::LogicalUnitReset => Some(scsi::Tmf::LogicalUnitReset),
            TmFunc::ClearAca => Some(scsi::Tmf::ClearAca),
            _ => None,
        };
        if let Ok(lun) = scsi::Lun::decode(req.lun.0) {
            if let Some(dev) = self.scsi.device(&c.nexus, lun) {
                self.count(lun, &dev, |n| n.tmfs += 1);
                self.abort_queued(st, conn, &req, &dev);
            }
        }
        let code = match (tmf, scsi::Lun::decode(req.lun.0)) {
            (None, _) => RspCode::NotSupported,
            (Some(_), Err(_)) => RspCode::Failed,
            (Some(t), Ok(lun)) => match self.scsi.tmf(&c.nexus, lun, t) {
                scsi::ServiceResponse::FunctionComplete => RspCode::Complete,
                // r16a table 24 has no "rejected": a CLEAR ACA from a
                // nexus other than the faulted one is a failed function.
                scsi::ServiceResponse::FunctionRejected | scsi::ServiceResponse::IncorrectLun => {
                    RspCode::Failed
                }
            },
        };
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.handle_tmf_done(req.cmd, code);
        }
    }

    /// Marks the commands `req` aborts that are queued for the SCSI core
    /// and not finished (see [`Queued`]); the core marks those it runs.
    /// CLEAR TASK SET and LOGICAL UNIT RESET reach every session's tasks
    /// on the device, as they do in the core.
    fn abort_queued(&self, st: &State, conn: ConnId, req: &TmfRequest, dev: &Arc<scsi::Device>) {
        let every_nexus = match req.func {
            TmFunc::AbortTask | TmFunc::AbortTaskSet => false,
            TmFunc::ClearTaskSet | TmFunc::LogicalUnitReset => true,
            _ => return,
        };
        for (id, c) in st.conns.iter() {
            if *id != conn && !every_nexus {
                continue;
            }
            for q in c.queued.values() {
                let hit = if *id == conn {
                    q.lun == req.lun && (req.func != TmFunc::AbortTask || q.tag == req.task_tag)
                } else {
                    // Another session may reach the device at another LUN.
                    scsi::Lun::decode(q.lun.0)
                        .ok()
                        .and_then(|l| self.scsi.device(&c.nexus, l))
                        .is_some_and(|d| Arc::ptr_eq(&d, dev))
                };
                if hit {
                    q.aborted.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }

    /// Why the target is closing `conn`: the port's own reason if it has
    /// one, else what the SRP channel did.
    fn close_reason(&self, st: &State, conn: ConnId) -> CloseReason {
        let c = st.conns.get(&conn);
        if let Some(r) = c.and_then(|c| c.close_reason.clone()) {
            return r;
        }
        let stats = c
            .and_then(|c| st.target.channel(c.channel))
            .map(|ch| ch.stats())
            .unwrap_or_default();
        match stats.logout_reason {
            Some(r) => CloseReason::TargetLogout(r),
            None if stats.initiator_logout => CloseReason::InitiatorLogout,
            None => CloseReason::WorkRequestFailed {
                status: WcStatus::GeneralErr,
                what: "a work request",
            },
        }
    }

    /// Moves the QP to ERROR so every posted work request flushes; the
    /// channel is released once they have.
    fn close(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        if !c.closing {
            c.closing = true;
            let _ = self.provider.modify_qp(
                c.qp,
                &QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                },
            );
        }
        self.maybe_finish(st, conn);
    }

    fn maybe_finish(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get(&conn) else {
            return;
        };
        if !c.closing || c.outstanding > 0 {
            return;
        }
        let channel = c.channel;
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.disconnected();
        }
        // Last outputs: aborts and releases.
        while let Some(out) = st
            .target
            .channel_mut(channel)
            .and_then(|ch| ch.poll_output())
        {
            if let Output::Release(cmd) = out {
                if let Some(c) = st.conns.get_mut(&conn) {
                    if let Some(d) = c.data_in.remove(&cmd) {
                        st.free_chunks.extend_from_slice(d.chunks());
                    }
                    c.spilled.remove(&cmd);
                    if let Some(chunks) = c.fetched.remove(&cmd) {
                        st.free_chunks
                            .extend(chunks.into_iter().map(|(_, ch, _)| ch));
                    }
                }
            }
        }
        st.target.remove(channel);
        st.by_channel.remove(&channel);
        let c = st.conns.remove(&conn).expect("checked above");
        st.free_chunks
            .extend(c.ops.values().filter_map(|o| o.chunk));
        st.free_chunks
            .extend(c.data_in.values().flat_map(|d| d.chunks().iter().copied()));
        st.free_chunks.extend(c.parked.values().flatten().copied());
        st.free_chunks.extend(
            c.fetched
                .values()
                .flat_map(|v| v.iter().map(|&(_, ch, _)| ch)),
        );
        st.waiting.retain(|(w, _)| *w != conn);
        let p = &self.provider;
        let _ = p.destroy_qp(c.qp);
        let _ = p.dereg_mr(c.send_mr.handle);
        let _ = p.destroy_cq(c.send_cq);
    }

    fn worker_loop(&self, jobs: Arc<Mutex<Receiver<Job>>>) {
        loop {
            let job = {
                let rx = jobs.lock().unwrap_or_else(|e| e.into_inner());
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            };
            let mut job = job;
            self.gather_job(&mut job);
            let (done, data_in) = self.execute(&job);
            self.at_workers
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.scsi_done(job.conn, done, data_in);
        }
    }

    /// Puts a job's data-out together from its chunks and spilled pieces.
    fn gather_job(&self, job: &mut Job) {
        if let Some((len, mut parts)) = job.chunks.take() {
            parts.sort_by_key(|p| p.0);
            let mut end = 0u64;
            let back_to_back = parts.iter().all(|&(off, _, n)| {
                let next = off == end;
                end += n as u64;
                next
            });
            if job.spilled.is_empty() && back_to_back && end == len as u64 && !parts.is_empty() {
                job.direct_out = Some(parts);
                return;
            }
            job.data_out = self.gather(len, parts);
            for (offset, bytes) in std::mem::take(&mut job.spilled) {
                let start = (offset as usize).min(job.data_out.len());
                let end = (start + bytes.len()).min(job.data_out.len());
                job.data_out[start..end].copy_from_slice(&bytes[..end - start]);
            }
        }
    }

    /// Copies data-out of `len` bytes out of its RDMA chunks and gives the
    /// chunks back (ops waiting for one go out).
    fn gather(&self, len: u32, mut parts: Vec<Fetched>) -> Vec<u8> {
        let mut v = vec![0u8; len as usize];
        parts.sort_by_key(|p| p.0);
        for &(offset, chunk, plen) in &parts {
            let start = (offset as usize).min(v.len());
            let end = (offset as usize + plen as usize).min(v.len());
            self.chunk_buf
                .read_at(chunk * self.chunk_size as usize, &mut v[start..end]);
        }
        if !parts.is_empty() {
            let mut st = self.lock();
            st.free_chunks.extend(parts.iter().map(|p| p.1));
            self.retry_waiting(&mut st);
        }
        v
    }

    /// Views of chunks a command holds: the first `n` bytes (at most a
    /// chunk) of each `(chunk, n)`, for the SCSI core to read into or
    /// write from with no copy in between.
    ///
    /// # Safety
    /// Until the views are dropped, each chunk must be the calling
    /// command's alone (off the free list for it, and not freed while the
    /// views live) and named by no work request in flight, so that nothing
    /// else reads or writes those bytes; the pairs name distinct chunks.
    unsafe fn chunk_views<I: Iterator<Item = (usize, usize)>>(
        &self,
        pieces: I,
    ) -> impl Iterator<Item = &mut [u8]> {
        let cs = self.chunk_size as usize;
        pieces.map(move |(chunk, n)| {
            // SAFETY: the chunk is this command's alone (the caller's
            // promise), so this is the only view of its bytes; `chunk * cs
            // + n.min(cs)` is inside `chunk_buf` (chunks * chunk_size bytes).
            unsafe { std::slice::from_raw_parts_mut(self.chunk_buf.ptr_at(chunk * cs), n.min(cs)) }
        })
    }

    /// Chunks for `len` bytes of data-in, if the pool can spare them and
    /// still keep `spill_below` for RDMA in flight.
    fn reserve_chunks(&self, len: u32) -> Option<Vec<usize>> {
        let need = len.div_ceil(self.chunk_size) as usize;
        let mut st = self.lock();
        let free = st.free_chunks.len();
        if free < need + self.spill_below {
            return None;
        }
        Some(st.free_chunks.split_off(free - need))
    }

    /// Updates the counters of `lun` mapping `dev`.
    fn count(&self, lun: scsi::Lun, dev: &Arc<scsi::Device>, f: impl FnOnce(&mut LunCounters)) {
        let mut t = self.lun_stats.lock().unwrap_or_else(|e| e.into_inner());
        let slot = t
            .entry((lun.value(), Arc::as_ptr(dev) as usize))
            .or_insert_with(|| (Arc::downgrade(dev), LunCounters::default()));
        // A new device at the address of one that is gone starts afresh.
        if !std::sync::Weak::ptr_eq(&slot.0, &Arc::downgrade(dev)) || slot.0.strong_count() == 0 {
            *slot = (Arc::downgrade(dev), LunCounters::default());
        }
        f(&mut slot.1);
    }

    fn execute(&self, job: &Job) -> (ScsiDone, InData) {
        let req = &job.req;
        let Ok(lun) = scsi::Lun::decode(req.lun.0) else {
            // SPC-4: LOGICAL UNIT NOT SUPPORTED for an address we cannot decode.
            let mut done = ScsiDone::good(req.cmd, 0);
            done.status = 0x02;
            done.sense = vec![
                0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x25, 0, 0, 0, 0, 0,
            ];
            return (done, InData::Vec(Vec::new()));
        };
        let data_out_dir = !matches!(req.data_out, DataOut::None);
        let out_len = match &job.direct_out {
            Some(parts) => parts.iter().map(|p| p.2 as u64).sum(),
            None => job.data_out.len() as u64,
        };
        let expected = if data_out_dir {
            out_len
        } else {
            req.data_in_len as u64
        };
        // SRP_CMD TASK ATTRIBUTE (r16a table 24) to SAM-5; unknown values
        // were refused when the IU was parsed, reserved ones run SIMPLE.
        let attr = match req.attr {
            srp::wire::TaskAttr::Ordered => scsi::TaskAttr::Ordered,
            srp::wire::TaskAttr::HeadOfQueue => scsi::TaskAttr::HeadOfQueue,
            srp::wire::TaskAttr::Aca => scsi::TaskAttr::Aca,
            _ => scsi::TaskAttr::Simple,
        };
        // Looked up before the command runs: a map change while it runs
        // counts it where it was addressed.
        let dev = self.scsi.device(&job.nexus, lun);
        let reserved = (!data_out_dir && req.data_in_len >= DIRECT_IN_MIN)
            .then(|| self.reserve_chunks(req.data_in_len))
            .flatten();
        // The command as the core runs it: below, only where its data is
        // differs.
        let submit = |data_out: &[u8], bufs: Option<&mut scsi::Buffers<'_, '_>>| {
            if job.aborted.load(std::sync::atomic::Ordering::SeqCst) {
                // Aborted before it reached the core: it never runs.
                return scsi::ScsiResponse {
                    status: scsi::Status::TaskAborted,
                    sense: None,
                    data_in: Vec::new(),
                    residual: scsi::Residual::None,
                    descriptor_sense: false,
                };
            }
            self.scsi.submit_attr_into(
                &job.nexus, lun, req.tag.0, attr, &req.cdb, data_out, expected, bufs,
            )
        };
        let (r, data_in) = match reserved {
            Some(chunks) => {
                let cs = self.chunk_size as usize;
                let len = req.data_in_len as usize;
                // SAFETY: `chunks` came off the free list for this command
                // alone and no work request names them until the command
                // is done.
                let mut pieces: Vec<&mut [u8]> = unsafe {
                    self.chunk_views(
                        chunks
                            .iter()
                            .enumerate()
                            .map(|(k, &chunk)| (chunk, len - k * cs)),
                    )
                    .collect()
                };
                let mut sink = scsi::Buffers::data_in(&mut pieces);
                let r = submit(&job.data_out, Some(&mut sink));
                let len = sink.placed();
                if sink.read_direct() {
                    self.direct_in
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                (r, InData::Chunks { chunks, len })
            }
            None => {
                let mut r = match &job.direct_out {
                    Some(parts) => {
                        // SAFETY: the READs that filled these chunks have
                        // completed and the chunks stay this command's
                        // until they are freed below.
                        let pieces: Vec<&[u8]> = unsafe {
                            self.chunk_views(parts.iter().map(|&(_, chunk, n)| (chunk, n as usize)))
                                .map(|p| &*p)
                                .collect()
                        };
                        let mut bufs = scsi::Buffers::data_out(&pieces);
                        let r = submit(&[], Some(&mut bufs));
                        self.direct_out
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let mut st = self.lock();
                        st.free_chunks.extend(parts.iter().map(|p| p.1));
                        self.retry_waiting(&mut st);
                        r
                    }
                    None => submit(&job.data_out, None),
                };
                let mut v = std::mem::take(&mut r.data_in);
                v.truncate(req.data_in_len as usize);
                (r, InData::Vec(v))
            }
        };
        let sense = r.sense_bytes().unwrap_or_default();
        let in_len = match &data_in {
            InData::Vec(v) => v.len(),
            InData::Chunks { len, .. } => *len,
        };
        if let Some(dev) = &dev {
            let good = r.status == scsi::Status::Good;
            let kind = scsi::Command::parse(&req.cdb).map(|(_, c)| c);
            let (data_in_len, data_out_len) = (in_len as u64, out_len);
            self.count(lun, dev, |n| {
                n.commands += 1;
                match kind {
                    Ok(scsi::Command::Read { .. }) if good => {
                        n.reads += 1;
                        n.read_bytes += data_in_len;
                    }
                    Ok(scsi::Command::Write { .. }) if good => {
                        n.writes += 1;
                        n.write_bytes += data_out_len;
                    }
                    _ => {}
                }
                if r.status == scsi::Status::CheckCondition {
                    n.errors += 1;
                }
            });
        }
        let mut done = ScsiDone::good(req.cmd, in_len as u32);
        done.status = u8::from(r.status);
        done.sense = sense;
        done.aborted = r.status == scsi::Status::TaskAborted;
        match r.residual {
            scsi::Residual::Over(n) if data_out_dir => {
                done.wanted_out = Some((expected + n).min(u32::MAX as u64) as u32)
            }
            scsi::Residual::Over(n) => {
                done.wanted_in = Some((expected + n).min(u32::MAX as u64) as u32)
            }
            scsi::Residual::Under(n) if data_out_dir => {
                done.wanted_out = Some(expected.saturating_sub(n) as u32)
            }
            _ => {}
        }
        (done, data_in)
    }
}
