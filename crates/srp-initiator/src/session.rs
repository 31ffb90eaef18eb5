//! One SRP channel over a verbs provider: the I/O path of the initiator.
//!
//! [`Session`] runs an `srp::initiator::Channel` on an RC QP: it registers
//! receive and send IU rings and a data pool, connects through a
//! [`Connector`] (RDMA CM, IB CM, or a direct call in tests), and turns
//! [`Session::execute`] calls into SRP_CMDs whose data descriptors point
//! into the pool. One poller thread owns the CQ and the channel's timers;
//! callers block on their own command only.
//!
//! The data pool is one memory region registered for remote read and write
//! (the "pre-registered pool" mode of the issue): every command's buffer is
//! a run of pool pages, so a target sees only pages lent to it, but its
//! R_Key covers the whole pool. Per-command registration (FRWR, as ib_srp
//! does) is not implemented yet.
//!
//! When the connection fails (a work request fails, the port goes down,
//! the target logs out) the QP goes to the error state and every
//! outstanding command ends at once with `TransportFailed`, so a
//! multipath device can send it elsewhere that moment. Finding the
//! failure: the RC transport's retries (about 0.55 s) for anything we
//! sent, and a liveness probe ([`SessionConfig::probe_interval`]) for a
//! link that dies while the target holds every command already
//! acknowledged. Dropping a failed session returns at once; its DREQ and
//! teardown run on a thread of their own.
//!
//! A login is never sent from a port that is not ACTIVE: `connect` fails
//! at once with [`SessionError::PortNotActive`] instead of leaving a CM
//! REQ to die on a dead link and wait out the CM's retry timer (about 4 s)
//! after the link is back. A [`PortWatch`] tells whoever retries (the
//! remote port, [`crate::remote`]) when the port is ACTIVE again.

use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, Pkey, PortNum, Psn, QpState, Qpn};
use rdma_types::{IdMap, WcOpcode, WcStatus};
use srp::initiator::{
    Channel, ChannelConfig, Command, Completion, Data, Event, Negotiated, Output, SendId, Status,
};
use srp::wire::{DirectBuf, Lun, Tag, TaskAttr, TmFunc};
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use verbs::nested::Counted;
use verbs::{
    AhAttr, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, PdHandle, Provider, QpAttr,
    QpHandle, QpInit, RecvWr, SendOpcode, SendWr, Sge, WorkCompletion,
};

/// This side's QP, for the CM REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: Qpn,
    /// Starting PSN in the CM message: the first PSN this side expects to
    /// receive; the peer sends from it (IBA 12.7.25, as Linux ib_cm does).
    pub psn: Psn,
    /// Port GID.
    pub gid: Gid,
    /// Port LID (0 on RoCE).
    pub lid: Lid,
    /// Path MTU.
    pub mtu: Mtu,
}

/// What the CM brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    /// The target's QP.
    pub peer: QpInfo,
    /// REP private data (SRP_LOGIN_RSP).
    pub private_data: Vec<u8>,
    /// The connector's handle of the connection, for `disconnect`.
    pub handle: u64,
}

/// Why a connection attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The target answered with a REJ carrying this private data
    /// (SRP_LOGIN_REJ for a consumer-defined reject).
    #[error("connection rejected")]
    Rejected(Vec<u8>),
    /// No answer, no route, or a CM-level reject; in words.
    #[error("connection failed: {0}")]
    Failed(String),
}

/// A connection manager as the session needs it: send a REQ with the login
/// and this QP, and get the REP (or REJ) back.
pub trait Connector: Send + Sync {
    /// Connects; `login` is the REQ private data.
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError>;
    /// Tears the connection down (DREQ); idempotent.
    fn disconnect(&self, handle: u64);
    /// Which private-data layout the login uses.
    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// Login private data layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginForm {
    /// 64-byte SRP_LOGIN_REQ (IB CM).
    IbCm,
    /// 56-byte SRP_LOGIN_REQ after the RDMA CM header.
    RdmaCm,
}

/// Session settings.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// SRP channel settings (port IDs, cmd_sg_entries, queue, timeouts).
    pub channel: ChannelConfig,
    /// Port of the CA.
    pub port: PortNum,
    /// GID index of the source address.
    pub sgid_index: u8,
    /// Bytes in the registered data pool (the largest transfer must fit).
    pub pool_bytes: usize,
    /// Split every data buffer into segments of at most this many bytes,
    /// placed apart in the pool (0: one segment). Exercises indirect
    /// descriptors the way a scattered page cache does.
    pub max_segment: u32,
    /// The partition of the login (the path's P_Key, login string
    /// `pkey=`): the QP uses the index of the local port's P_Key table
    /// that holds this partition (full or limited member, IBA 10.9).
    /// `None`: index 0, the port's first (default) P_Key.
    pub pkey: Option<Pkey>,
    /// Liveness probe (the seed's option 4 of fast path-failure
    /// detection): when commands wait and nothing has come from the
    /// target for this long, a zero-length RDMA WRITE goes out. On a live
    /// link it is acknowledged; on a dead one the transport's retries run
    /// out and the session fails as it would for a command. Without it, a
    /// link that dies after the target acknowledged every command of ours
    /// (so nothing of ours is being retried) is found only by the command
    /// timeout, and then by the retries of the ABORT TASK that follows:
    /// 2.55 s with a 2 s timeout, 30.55 s with the default. `None`: no
    /// probes (a target whose QP refuses zero-length RDMA WRITEs would
    /// fail the session).
    pub probe_interval: Option<rdma_types::Duration>,
    /// The RC transport's retry count (the QP's `retry_cnt`, 0..=7): how
    /// often a request the target does not acknowledge is sent again
    /// before the QP fails. ib_srp takes it from the login string's
    /// `tl_retry_count` (2..=7, default 7); a smaller value finds a dead
    /// path sooner, at the price of failing on a lossy one.
    pub retry_cnt: u8,
    /// Most data descriptors one SRP_CMD may carry (ib_srp's
    /// `sg_tablesize`, the SCSI host's scatter/gather limit): with
    /// external tables up to this many, without them the smaller of this
    /// and `cmd_sg_entries`. Binds only when buffers are split into
    /// segments ([`SessionConfig::max_segment`]); a one-segment buffer
    /// always fits.
    pub sg_tablesize: u32,
}

/// [`SessionConfig::probe_interval`] by default: with the transport's
/// retry budget (about 0.55 s) a dead link is found within about 0.8 s.
pub const DEFAULT_PROBE_INTERVAL: rdma_types::Duration = rdma_types::Duration::from_millis(250);

/// The index of `pkey`'s partition in `table`: an entry with the same
/// P_Key first, else one of the same partition with the other membership
/// bit (the path's P_Key is what the SA gave; our port may hold the
/// partition as a full or a limited member). Invalid entries never match.
pub fn pkey_index(table: &[Pkey], pkey: Pkey) -> Option<u16> {
    let same = |k: &Pkey| k.0 & 0x7fff != 0 && k.0 & 0x7fff == pkey.0 & 0x7fff;
    table
        .iter()
        .position(|k| *k == pkey && same(k))
        .or_else(|| table.iter().position(same))
        .and_then(|i| u16::try_from(i).ok())
}

impl SessionConfig {
    /// Defaults: port 1, GID 0, 64 MiB pool, one segment per command.
    pub fn new(channel: ChannelConfig) -> SessionConfig {
        SessionConfig {
            channel,
            port: PortNum(1),
            sgid_index: 0,
            pool_bytes: 64 << 20,
            max_segment: 0,
            pkey: None,
            probe_interval: Some(DEFAULT_PROBE_INTERVAL),
            retry_cnt: 7,
            sg_tablesize: MAX_EXT_DESCRIPTORS as u32,
        }
    }
}

/// Errors of a session.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A verb failed.
    #[error("{what}: {err}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The provider's answer.
        err: verbs::VerbsError,
    },
    /// The channel settings are invalid.
    #[error("{0}")]
    Config(#[from] srp::initiator::ConfigError),
    /// The CM could not connect.
    #[error("{0}")]
    Connect(#[from] ConnectError),
    /// The target refused the login, or answered nonsense.
    #[error("{0}")]
    Login(#[from] srp::initiator::LoginFailure),
    /// The command was not sent.
    #[error("{0}")]
    Submit(#[from] srp::initiator::SubmitError),
    /// The data does not fit the pool.
    #[error("transfer of {0} bytes does not fit the {1}-byte data pool")]
    TooLarge(usize, usize),
    /// The buffer needs more descriptors than one command may carry
    /// (`sg_tablesize`, or `cmd_sg_entries` without external tables).
    #[error("transfer of {len} bytes needs {segments} data descriptors; at most {max} per command (sg_tablesize)")]
    TooManySegments {
        /// Bytes asked for.
        len: usize,
        /// Segments the buffer would have.
        segments: usize,
        /// Descriptors allowed per command.
        max: usize,
    },
    /// The session is closed.
    #[error("session closed")]
    Closed,
    /// A task management request failed.
    #[error("task management: {0}")]
    TaskMgmt(srp::initiator::TmfFailure),
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The local port is not ACTIVE (its link is down): no login was sent.
    #[error("port {port} is {state:?}, not ACTIVE: no login sent (the link is down)")]
    PortNotActive {
        /// The port of the CA.
        port: u8,
        /// Its state.
        state: verbs::PortState,
    },
    /// The login's partition is not in the local port's P_Key table.
    #[error("P_Key {pkey:04x}: the local port is not a member of that partition (its P_Key table: {table})")]
    NoSuchPkey {
        /// The login's P_Key.
        pkey: u16,
        /// The port's valid P_Keys, in words.
        table: String,
    },
}

fn verbs_err(what: &'static str) -> impl FnOnce(verbs::VerbsError) -> SessionError {
    move |err| SessionError::Verbs { what, err }
}

/// The outcome of one SCSI command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdResult {
    /// How it ended.
    pub status: Status,
    /// Sense data (CHECK CONDITION).
    pub sense: Vec<u8>,
    /// Data-in bytes (reads).
    pub data: Vec<u8>,
    /// Data-in residual.
    pub residual: Option<srp::initiator::Residual>,
}

impl CmdResult {
    /// GOOD status.
    pub fn good(&self) -> bool {
        self.status == Status::Scsi(0)
    }
}

/// A command sent by [`Session::start`], to be ended by
/// [`Session::finish`] (its pool pages are held until then).
#[derive(Debug)]
#[must_use = "a started command holds pool pages until finished"]
pub struct Started {
    tag: Tag,
    runs: Vec<(usize, usize)>,
    segs: Vec<DirectBuf>,
    len: usize,
    reading: bool,
}

/// Most descriptors one external table holds (ib_srp's largest
/// `sg_tablesize`): 8 MiB in 4 KiB segments.
pub const MAX_EXT_DESCRIPTORS: usize = 2048;

/// Direction and data of a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Xfer<'a> {
    /// No data.
    None,
    /// Read this many bytes (into [`CmdResult::data`]).
    In(usize),
    /// Read into this buffer (as many bytes as it holds; the residual says
    /// how many came). [`CmdResult::data`] stays empty: one copy less.
    InTo(&'a mut [u8]),
    /// Write these bytes.
    Out(&'a [u8]),
}

impl Xfer<'_> {
    /// The same transfer for one more attempt (a retry after a reset).
    pub fn reborrow(&mut self) -> Xfer<'_> {
        match self {
            Xfer::None => Xfer::None,
            Xfer::In(n) => Xfer::In(*n),
            Xfer::InTo(b) => Xfer::InTo(b),
            Xfer::Out(d) => Xfer::Out(d),
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// Commands completed.
    pub completed: u64,
    /// Commands that timed out (error handler started).
    pub timeouts: u64,
    /// Task management functions sent.
    pub tmfs: u64,
    /// AERs received.
    pub aers: u64,
    /// Protocol errors seen.
    pub protocol_errors: u64,
    /// Commands ended by a LUN reset or reconnect (`Status::Reset`).
    pub reset_ended: u64,
    /// Times the session ended because its port went down or its CA was
    /// removed (fast path-failure detection from port events).
    pub port_failures: u64,
    /// ABORT TASKs the target answered FUNCTION COMPLETE.
    pub aborts_complete: u64,
    /// ABORT TASKs that failed (refused, timed out, no credit): the
    /// command had usually been answered already.
    pub aborts_failed: u64,
    /// Commands ended by an ABORT TASK (`Status::Aborted`).
    pub aborted: u64,
    /// Liveness probes the target acknowledged
    /// ([`SessionConfig::probe_interval`]).
    pub probes: u64,
}

/// One logged-in SRP channel.
pub struct Session {
    inner: Arc<Inner>,
    poller: Option<JoinHandle<()>>,
}

struct Inner {
    provider: Arc<dyn Provider>,
    connector: Arc<dyn Connector>,
    guid: Guid,
    port: PortNum,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    recv_buf: MemBuf,
    recv_mr: MrInfo,
    recv_size: u32,
    send_buf: MemBuf,
    send_mr: MrInfo,
    slot_size: u32,
    pool: MemBuf,
    pool_mr: MrInfo,
    page: usize,
    max_segment: u32,
    cmd_sg_entries: u8,
    /// External descriptor tables may be used (ib_srp's allow_ext_sg).
    allow_ext_sg: bool,
    /// Descriptors one command may carry ([`SessionConfig::sg_tablesize`]).
    sg_tablesize: u32,
    negotiated: Negotiated,
    probe_interval: Option<rdma_types::Duration>,
    handle: u64,
    epoch: std::time::Instant,
    st: Mutex<State>,
    cv: Condvar,
    events: Mutex<Sender<Ev>>,
}

enum Ev {
    Cq,
    Kick,
    Stop,
    /// Our port went down or the CA is going away: the path is dead now,
    /// not after the transport's retries run out.
    PortGone,
}

struct State {
    channel: Channel,
    /// Free send slots.
    free_slots: Vec<u32>,
    /// Send slot of each SendId in flight.
    slot_of: IdMap<SendId, u32>,
    /// Results of finished commands, by tag, until their caller takes them.
    done: IdMap<Tag, Completion>,
    /// Pool pages in use.
    pages: Vec<bool>,
    /// Where each command's external descriptor table lives in the pool.
    tables: IdMap<Tag, u64>,
    events: VecDeque<Event>,
    /// Task management requests finished, and the last one's outcome.
    tmfs_done: u64,
    last_tmf: Option<(TmFunc, Result<(), srp::initiator::TmfFailure>)>,
    stats: SessionStats,
    closed: bool,
    /// Callers waiting for their command's answer, woken one by one.
    parked: IdMap<Tag, std::thread::Thread>,
    /// Commands sent again after an abort or reset ([`Session::execute_retry`]):
    /// [`Session::abort_oldest`] passes them by.
    retried: IdMap<Tag, ()>,
    /// Callers waiting on `cv` (pool pages, credits, task management).
    cv_waiters: u32,
    /// The poll thread sleeps until this timer deadline (`Some(None)`:
    /// with no timer); `None` while it works (it looks at timers again
    /// before it sleeps).
    timer_sleep: Option<Option<rdma_types::Instant>>,
    /// Since when the target has been silent while commands wait: the
    /// last thing received, probe acknowledged, or command sent to an
    /// idle channel.
    quiet_since: rdma_types::Instant,
    /// A liveness probe is in flight.
    probe_out: bool,
}

/// The session lock, counted so a completion callback on this thread
/// knows not to take it again.
type Locked<'a> = Counted<'a, State>;

/// The CA's callbacks. Completions are handled right on the provider's
/// thread once the session exists (one thread hand-off less per answer);
/// before that, and for everything else, the poll thread is told.
struct Wake {
    tx: Mutex<Sender<Ev>>,
    inner: std::sync::OnceLock<std::sync::Weak<Inner>>,
    /// The provider never calls handlers from inside its own calls.
    inline: bool,
}

impl EventHandler for Wake {
    fn on_completion(&self, _cq_ctx: u64) {
        match self.inner.get().and_then(std::sync::Weak::upgrade) {
            Some(inner) if self.inline && verbs::nested::may_lock_here() => {
                inner.drain_cq();
                // Never drop the last reference here: the session's
                // teardown may stop the very thread running this callback.
                if Arc::strong_count(&inner) == 1 {
                    let _ = std::thread::Builder::new()
                        .name("srp-reap".into())
                        .spawn(move || drop(inner));
                }
            }
            _ => {
                let _ = self.tx.lock().map(|tx| tx.send(Ev::Cq));
            }
        }
    }
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        use verbs::AsyncEventKind::{CaRemoval, PortDown};
        if matches!(event.kind, PortDown | CaRemoval) {
            let _ = self.tx.lock().map(|tx| tx.send(Ev::PortGone));
        }
    }
}

/// The port events of one port, through an open of the CA of its own (so
/// it outlives every session on the port), closed on drop: how a remote
/// port whose login found the link down learns that it is back (the
/// soft RoCE port follows its interface's carrier, as rxe does).
pub struct PortWatch {
    provider: Arc<dyn Provider>,
    ca: CaHandle,
}

struct WatchEvents {
    port: PortNum,
    on_active: Box<dyn Fn() + Send + Sync>,
}

impl EventHandler for WatchEvents {
    fn on_completion(&self, _cq_ctx: u64) {}
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        if event.kind == verbs::AsyncEventKind::PortActive
            && event.port.is_none_or(|p| p == self.port)
        {
            (self.on_active)();
        }
    }
}

impl PortWatch {
    /// Calls `on_active` (on the provider's event thread, never under a
    /// provider lock) each time `port` of CA `guid` becomes ACTIVE.
    ///
    /// # Errors
    /// The CA cannot be opened.
    pub fn open(
        provider: Arc<dyn Provider>,
        guid: Guid,
        port: PortNum,
        on_active: Box<dyn Fn() + Send + Sync>,
    ) -> Result<PortWatch, SessionError> {
        let ca = provider
            .open_ca(guid, 0, Arc::new(WatchEvents { port, on_active }))
            .map_err(verbs_err("open CA for port events"))?;
        Ok(PortWatch { provider, ca })
    }
}

impl Drop for PortWatch {
    fn drop(&mut self) {
        let _ = self.provider.close_ca(self.ca);
    }
}

const KIND_RECV: u64 = 1 << 56;
const KIND_SEND: u64 = 2 << 56;
const KIND_PROBE: u64 = 3 << 56;
const KIND_MASK: u64 = 0xff << 56;
const PAGE: usize = 4096;

impl Session {
    /// Opens CA `guid` on `provider`, connects through `connector` and logs
    /// in. Blocks until the login is answered.
    pub fn connect(
        provider: Arc<dyn Provider>,
        guid: Guid,
        connector: Arc<dyn Connector>,
        cfg: SessionConfig,
    ) -> Result<Session, SessionError> {
        let mut channel = Channel::new(cfg.channel.clone())?;
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(Wake {
            tx: Mutex::new(tx.clone()),
            inner: std::sync::OnceLock::new(),
            inline: !provider.handlers_nest(),
        });
        let p = &provider;
        let ca = p
            .open_ca(guid, 0, wake.clone())
            .map_err(verbs_err("open CA"))?;
        let port = match p.query_port(ca, cfg.port) {
            Ok(port) if port.state == verbs::PortState::Active => port,
            Ok(port) => {
                let _ = p.close_ca(ca);
                return Err(SessionError::PortNotActive {
                    port: cfg.port.0,
                    state: port.state,
                });
            }
            Err(e) => {
                let _ = p.close_ca(ca);
                return Err(verbs_err("query port")(e));
            }
        };
        let gid = *port
            .gids
            .get(cfg.sgid_index as usize)
            .ok_or(SessionError::Verbs {
                what: "port GID",
                err: verbs::VerbsError::InvalidArgument("no GID at that index".into()),
            })?;
        let pkey_ix = match cfg.pkey {
            None => 0,
            Some(k) => match pkey_index(&port.pkeys, k) {
                Some(i) => i,
                None => {
                    let _ = p.close_ca(ca);
                    let table: Vec<String> = port
                        .pkeys
                        .iter()
                        .filter(|k| k.0 & 0x7fff != 0)
                        .map(|k| format!("{:04x}", k.0))
                        .collect();
                    return Err(SessionError::NoSuchPkey {
                        pkey: k.0,
                        table: table.join(", "),
                    });
                }
            },
        };
        let pd = p.alloc_pd(ca, 0).map_err(verbs_err("allocate PD"))?;
        let queue = u32::from(cfg.channel.can_queue) + 2;
        // Receives: every command's answer plus target requests (CRED_REQ,
        // AER_REQ, T_LOGOUT) in flight at once.
        let recv_count = queue + 8;
        let cq = p
            .create_cq(
                pd,
                &CqInit {
                    cqe: recv_count + queue + 2,
                },
                0,
            )
            .map_err(verbs_err("create CQ"))?;
        let qp = p
            // One send more than commands and answers need: the probe.
            .create_qp(pd, &QpInit::rc(cq, queue + 1, recv_count), 0)
            .map_err(verbs_err("create QP"))?;
        let psn = Psn::new(0x2b_0000 ^ (std::process::id() & 0xffff));
        let mtu = port.active_mtu;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(cfg.port),
                pkey_index: Some(pkey_ix),
                // The target moves data with RDMA READ and WRITE into our pool.
                access: Some(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to INIT"))?;

        let req = channel
            .login_request()
            .map_err(|e| SessionError::Connect(ConnectError::Failed(e.to_string())))?;
        let form = connector.form();
        let mut login = vec![0u8; 64];
        let n = match form {
            LoginForm::IbCm => req.emit(&mut login),
            LoginForm::RdmaCm => req.emit_rdma(&mut login),
        }
        .map_err(|e| SessionError::Connect(ConnectError::Failed(e.to_string())))?;
        login.truncate(n);

        // Receive buffers must be posted before the REP can be answered
        // with traffic; size them for the largest target IU we accept.
        let recv_size = 4096u32.max(cfg.channel.max_it_iu_len(true));
        let recv_buf = MemBuf::new((recv_size * recv_count) as usize);
        let recv_mr = p
            .reg_mr(
                pd,
                &recv_buf,
                recv_buf.addr(),
                recv_buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(verbs_err("register receive ring"))?;
        let recvs: Vec<RecvWr> = (0..recv_count)
            .map(|i| recv_wr(&recv_buf, &recv_mr, recv_size, i))
            .collect();
        p.post_recv(qp, &recvs)
            .map_err(verbs_err("post receives"))?;

        let local = QpInfo {
            qpn: p.qp_num(qp).map_err(verbs_err("QP number"))?,
            psn,
            gid,
            lid: port.lid,
            mtu,
        };
        let connected = match connector.connect(&login, local) {
            Ok(c) => c,
            Err(ConnectError::Rejected(data)) => {
                let err = channel
                    .handle_login_response(rdma_types::Instant::ZERO, &data)
                    .err()
                    .map(SessionError::Login)
                    .unwrap_or(SessionError::Connect(ConnectError::Rejected(data)));
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(err);
            }
            Err(e) => {
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(e.into());
            }
        };
        let epoch = std::time::Instant::now();
        let negotiated = match channel
            .handle_login_response(rdma_types::Instant::ZERO, &connected.private_data)
        {
            Ok(n) => n,
            Err(e) => {
                connector.disconnect(connected.handle);
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(e.into());
            }
        };
        let peer = connected.peer;
        let to_rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr {
                dlid: peer.lid,
                port: cfg.port,
                grh: true,
                dgid: peer.gid,
                sgid_index: cfg.sgid_index,
                sl: 0,
                hop_limit: 64,
            }),
            path_mtu: Some(if peer.mtu.bytes() < mtu.bytes() {
                peer.mtu
            } else {
                mtu
            }),
            dest_qpn: Some(peer.qpn),
            rq_psn: Some(psn),
            // The target fetches data-out with RDMA READs: as many in flight
            // as it may issue (its initiator depth, 16).
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..Default::default()
        };
        let to_rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(peer.psn),
            timeout: Some(14),
            retry_cnt: Some(cfg.retry_cnt.min(7)),
            rnr_retry: Some(7),
            max_rd_atomic: Some(0),
            ..Default::default()
        };
        if let Err(e) = p
            .modify_qp(qp, &to_rtr)
            .and_then(|_| p.modify_qp(qp, &to_rts))
        {
            connector.disconnect(connected.handle);
            teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
            return Err(SessionError::Verbs {
                what: "connect QP",
                err: e,
            });
        }

        let slot_size = negotiated.max_it_iu_len.max(64);
        let slots = queue;
        let send_buf = MemBuf::new((slot_size * slots) as usize);
        let send_mr = p
            .reg_mr(
                pd,
                &send_buf,
                send_buf.addr(),
                send_buf.len() as u64,
                AccessFlags::NONE,
                0,
            )
            .map_err(verbs_err("register send ring"))?;
        let pool = MemBuf::new(cfg.pool_bytes.max(PAGE).div_ceil(PAGE) * PAGE);
        let pool_mr = p
            .reg_mr(
                pd,
                &pool,
                pool.addr(),
                pool.len() as u64,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                0,
            )
            .map_err(verbs_err("register data pool"))?;
        p.req_notify_cq(cq, false).map_err(verbs_err("arm CQ"))?;
        let pages = pool.len() / PAGE;
        let inner = Arc::new(Inner {
            provider: provider.clone(),
            connector,
            guid,
            port: cfg.port,
            ca,
            pd,
            cq,
            qp,
            recv_buf,
            recv_mr,
            recv_size,
            send_buf,
            send_mr,
            slot_size,
            pool,
            pool_mr,
            page: PAGE,
            max_segment: cfg.max_segment,
            cmd_sg_entries: cfg.channel.cmd_sg_entries,
            allow_ext_sg: cfg.channel.allow_ext_sg,
            sg_tablesize: cfg.sg_tablesize.max(1),
            negotiated,
            probe_interval: cfg.probe_interval,
            handle: connected.handle,
            epoch,
            st: Mutex::new(State {
                channel,
                free_slots: (0..slots).rev().collect(),
                slot_of: IdMap::default(),
                done: IdMap::default(),
                pages: vec![false; pages],
                tables: IdMap::default(),
                events: VecDeque::new(),
                tmfs_done: 0,
                last_tmf: None,
                stats: SessionStats::default(),
                closed: false,
                parked: IdMap::default(),
                retried: IdMap::default(),
                cv_waiters: 0,
                timer_sleep: None,
                quiet_since: rdma_types::Instant::ZERO,
                probe_out: false,
            }),
            cv: Condvar::new(),
            events: Mutex::new(tx),
        });
        let _ = wake.inner.set(Arc::downgrade(&inner));
        // Completions that came before now go through the poll thread.
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Cq));
        let poller = inner.clone();
        let handle = std::thread::Builder::new()
            .name("srp-poll".into())
            .spawn(move || poller.poll_loop(rx))?;
        Ok(Session {
            inner,
            poller: Some(handle),
        })
    }

    /// A [`PortWatch`] on this session's port, calling `on_active` each
    /// time the port becomes ACTIVE; it outlives the session.
    ///
    /// # Errors
    /// The CA cannot be opened again.
    pub fn watch_port(
        &self,
        on_active: Box<dyn Fn() + Send + Sync>,
    ) -> Result<PortWatch, SessionError> {
        PortWatch::open(
            self.inner.provider.clone(),
            self.inner.guid,
            self.inner.port,
            on_active,
        )
    }

    /// What the login negotiated.
    pub fn negotiated(&self) -> Negotiated {
        self.inner.negotiated
    }

    /// Largest transfer one SRP_CMD can describe when buffers are split
    /// into segments (`max_segment` times `cmd_sg_entries`, or times
    /// [`MAX_EXT_DESCRIPTORS`] with external tables); `None` when every
    /// buffer is one segment.
    pub fn max_transfer_by_segments(&self) -> Option<usize> {
        let inner = &self.inner;
        (inner.max_segment > 0).then(|| {
            let seg = (inner.max_segment as usize).div_ceil(inner.page) * inner.page;
            seg * inner.max_descriptors()
        })
    }

    /// The QP's attributes as the provider reports them (`retry_cnt`,
    /// `timeout`, path MTU, ...).
    ///
    /// # Errors
    /// The provider cannot query QPs, or the QP is gone.
    pub fn query_qp(&self) -> Result<QpAttr, SessionError> {
        self.inner
            .provider
            .query_qp(self.inner.qp)
            .map_err(verbs_err("query QP"))
    }

    /// Credits the initiator holds.
    pub fn credits(&self) -> i64 {
        self.inner.lock().channel.credits()
    }

    /// Counters.
    pub fn stats(&self) -> SessionStats {
        self.inner.lock().stats
    }

    /// Events the channel reported (AERs, logouts, task management), oldest
    /// first.
    pub fn take_events(&self) -> Vec<Event> {
        self.inner.lock().events.drain(..).collect()
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }

    /// Runs one SCSI command and waits for its answer.
    pub fn execute(&self, lun: Lun, cdb: &[u8], xfer: Xfer<'_>) -> Result<CmdResult, SessionError> {
        self.execute_attr(lun, cdb, xfer, TaskAttr::Simple)
    }

    /// [`Session::execute`] with a task attribute.
    pub fn execute_attr(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<CmdResult, SessionError> {
        self.execute_marked(lun, cdb, xfer, attr, false)
    }

    /// [`Session::execute_attr`] for a command sent again because an
    /// abort or reset ended its previous try (the disk layer's bounded
    /// retries). [`Session::abort_oldest`] never picks such a command, so
    /// a test's stream of aborts cannot end one I/O more often than the
    /// retry limit allows and fail it: the real error handler aborts a
    /// command only after its timeout, which a retried one starts afresh.
    pub fn execute_retry(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<CmdResult, SessionError> {
        self.execute_marked(lun, cdb, xfer, attr, true)
    }

    fn execute_marked(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
        retry: bool,
    ) -> Result<CmdResult, SessionError> {
        let c = self.start_marked(lun, cdb, &xfer, attr, retry)?;
        Ok(self.finish(c, xfer))
    }

    /// Sends one SCSI command and returns at once (waiting only for pool
    /// pages, a credit or a queue slot): the asynchronous half of
    /// [`Session::execute_attr`]. Write data is copied out of `xfer`
    /// before this returns; a read's destination is given to
    /// [`Session::finish`]. Every started command must be finished.
    pub fn start(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<Started, SessionError> {
        self.start_marked(lun, cdb, xfer, attr, false)
    }

    fn start_marked(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
        retry: bool,
    ) -> Result<Started, SessionError> {
        let inner = &self.inner;
        let (len, reading) = match xfer {
            Xfer::None => (0, false),
            Xfer::In(n) => (*n, true),
            Xfer::InTo(b) => (b.len(), true),
            Xfer::Out(d) => (d.len(), false),
        };
        if len > inner.pool.len() {
            return Err(SessionError::TooLarge(len, inner.pool.len()));
        }
        let mut st = inner.lock();
        // Wait for pool pages (other commands may hold them).
        let pages = len.div_ceil(inner.page);
        // Segments the buffer will have, and whether they need an external
        // descriptor table (in the pool too, which the target fetches by
        // RDMA READ). Data and table pages are taken together, so callers
        // waiting for pages never hold half of what they need.
        let seg_count = pages.div_ceil(inner.seg_pages(pages).max(1));
        if seg_count > inner.max_descriptors() {
            return Err(SessionError::TooManySegments {
                len,
                segments: seg_count,
                max: inner.max_descriptors(),
            });
        }
        let table_pages = if inner.allow_ext_sg && seg_count > usize::from(inner.cmd_sg_entries) {
            (seg_count * srp::wire::DIRECT_BUF_LEN).div_ceil(inner.page)
        } else {
            0
        };
        let (runs, table_run) = loop {
            if st.closed {
                return Err(SessionError::Closed);
            }
            if let Some(runs) = inner.alloc(&mut st, pages) {
                if table_pages == 0 {
                    break (runs, None);
                }
                if let Some(start) = find_free(&st.pages, 0, table_pages) {
                    for p in &mut st.pages[start..start + table_pages] {
                        *p = true;
                    }
                    break (runs, Some((start, table_pages)));
                }
                inner.free(&mut st, &runs);
            }
            st = inner.wait_cv(st);
        };
        let segs = inner.segments(&runs, len);
        let immediate = match xfer {
            Xfer::Out(d) => st
                .channel
                .immediate_capacity()
                .is_some_and(|cap| (d.len() as u32) <= cap && !d.is_empty()),
            _ => false,
        };
        if let Xfer::Out(data) = xfer {
            if !immediate {
                // The pages are ours until freed: fill them without holding
                // the lock every completion takes.
                drop(st);
                let mut at = 0;
                for s in &segs {
                    inner.pool.write_at(
                        (s.va - inner.pool.addr()) as usize,
                        &data[at..at + s.len as usize],
                    );
                    at += s.len as usize;
                }
                st = inner.lock();
            }
        }
        let data = match xfer {
            Xfer::None => Data::None,
            Xfer::In(_) | Xfer::InTo(_) => Data::In(segs.clone()),
            Xfer::Out(d) if immediate => Data::Immediate(d.to_vec()),
            Xfer::Out(_) => Data::Out(segs.clone()),
        };
        let mut cmd = Command::new(lun, cdb, data);
        cmd.attr = attr;
        cmd.desc_table = table_run.map(|(start, pages)| DirectBuf {
            va: inner.pool.addr() + (start * inner.page) as u64,
            key: inner.pool_mr.rkey,
            len: (pages * inner.page) as u32,
        });
        let runs: Vec<(usize, usize)> = runs.into_iter().chain(table_run).collect();
        // Queue full or no credit: wait for a completion and try again.
        let tag = loop {
            let now = inner.now();
            if st.channel.outstanding() == 0 {
                // The target has had nothing to answer until now.
                st.quiet_since = now;
            }
            match st.channel.submit(now, &cmd) {
                Ok(tag) => {
                    if let Some(t) = cmd.desc_table {
                        st.tables.insert(tag, t.va);
                    }
                    if retry {
                        st.retried.insert(tag, ());
                    }
                    break tag;
                }
                Err(
                    srp::initiator::SubmitError::NoCredit
                    | srp::initiator::SubmitError::QueueFull(_)
                    | srp::initiator::SubmitError::Recovering,
                ) if !st.closed => {
                    st = inner.wait_cv(st);
                }
                Err(e) => {
                    inner.free(&mut st, &runs);
                    inner.cv.notify_all();
                    return Err(if st.closed {
                        SessionError::Closed
                    } else {
                        e.into()
                    });
                }
            }
        };
        inner.flush_outputs_here(&mut st);
        inner.kick_if_timer_earlier(&st);
        Ok(Started {
            tag,
            runs,
            segs,
            len,
            reading,
        })
    }

    /// Waits until one of `cmds` has its answer; returns its index. One
    /// thread can keep many commands in flight this way (as fio's libaio
    /// engine does) instead of one thread per command.
    pub fn wait_any(&self, cmds: &[&Started]) -> usize {
        self.wait_any_of(cmds.iter().copied().enumerate())
            .unwrap_or(0)
    }

    /// [`Session::wait_any`] over `(key, command)` pairs, without a slice:
    /// returns the key of a command that has its answer, or `None` when
    /// `cmds` is empty. The iterator is walked once per wake-up.
    pub fn wait_any_of<'a, K, I>(&self, cmds: I) -> Option<K>
    where
        I: Iterator<Item = (K, &'a Started)> + Clone,
    {
        let inner = &self.inner;
        let mut st = inner.lock();
        let mut registered = false;
        loop {
            let mut any = false;
            let mut found = None;
            for (k, c) in cmds.clone() {
                any = true;
                if st.done.contains_key(&c.tag) {
                    found = Some(k);
                    break;
                }
            }
            if found.is_some() || !any {
                if registered {
                    for (_, c) in cmds.clone() {
                        st.parked.remove(&c.tag);
                    }
                }
                return found;
            }
            // Once: the poll thread takes a tag's entry only when that tag
            // is answered, which ends the wait above.
            if !registered {
                let me = std::thread::current();
                for (_, c) in cmds.clone() {
                    st.parked.insert(c.tag, me.clone());
                }
                registered = true;
            }
            drop(st);
            // Bounded, so a lost wake-up costs time, never a hang.
            std::thread::park_timeout(std::time::Duration::from_millis(200));
            st = inner.lock();
        }
    }

    /// Waits for `c`'s answer (at once after [`Session::wait_any`] chose
    /// it), copies read data into `xfer`'s buffer (`Xfer::InTo`) or into
    /// [`CmdResult::data`] (`Xfer::In`), and gives its pages back.
    pub fn finish(&self, c: Started, xfer: Xfer<'_>) -> CmdResult {
        let inner = &self.inner;
        let Started {
            tag,
            runs,
            segs,
            len,
            reading,
        } = c;
        let mut st = inner.lock();
        // Parked until the poll thread hands this tag its answer: one
        // wake-up per command, not one per completion for every caller.
        let completion = loop {
            if let Some(c) = st.done.remove(&tag) {
                st.parked.remove(&tag);
                st.tables.remove(&tag);
                st.retried.remove(&tag);
                break c;
            }
            st.parked.insert(tag, std::thread::current());
            drop(st);
            // Bounded, so a lost wake-up costs time, never a hang.
            std::thread::park_timeout(std::time::Duration::from_millis(200));
            st = inner.lock();
        };
        let mut out = Vec::new();
        if reading && completion.status == Status::Scsi(0) {
            let got = match completion.data_in_residual {
                Some(srp::initiator::Residual::Under(n)) => len.saturating_sub(n as usize),
                _ => len,
            };
            // The pages stay ours until freed below: copy without the lock.
            drop(st);
            let dst: &mut [u8] = match xfer {
                Xfer::InTo(b) => {
                    let got = got.min(b.len());
                    &mut b[..got]
                }
                _ => {
                    out = vec![0u8; got];
                    &mut out
                }
            };
            let got = dst.len();
            let mut at = 0;
            for s in &segs {
                if at >= got {
                    break;
                }
                let n = (s.len as usize).min(got - at);
                inner
                    .pool
                    .read_at((s.va - inner.pool.addr()) as usize, &mut dst[at..at + n]);
                at += n;
            }
            st = inner.lock();
        }
        inner.free(&mut st, &runs);
        if st.cv_waiters > 0 {
            inner.cv.notify_all();
        }
        CmdResult {
            status: completion.status,
            sense: completion.sense,
            data: out,
            residual: completion.data_in_residual,
        }
    }

    /// LOGICAL UNIT RESET of `lun` (what `sg_reset --device` asks of
    /// ib_srp); waits for the target's answer. Commands of the LUN still
    /// outstanding end with `Status::Reset` (callers such as
    /// [`crate::disk::Disk`] retry them).
    pub fn reset_lun(&self, lun: Lun) -> Result<(), SessionError> {
        let inner = &self.inner;
        let mut st = inner.lock();
        let before = loop {
            if st.closed {
                return Err(SessionError::Closed);
            }
            let seen = st.tmfs_done;
            let now = inner.now();
            match st.channel.reset_lun(now, lun) {
                Ok(()) => break seen,
                Err(srp::initiator::SubmitError::Recovering) => {
                    st = inner.wait_cv(st);
                }
                Err(e) => return Err(e.into()),
            }
        };
        inner.flush_outputs_here(&mut st);
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Kick));
        loop {
            if st.tmfs_done > before {
                if let Some((TmFunc::LogicalUnitReset, result)) = st.last_tmf {
                    return result.map_err(SessionError::TaskMgmt);
                }
            }
            if st.closed {
                return Err(SessionError::Closed);
            }
            st = inner.wait_cv(st);
        }
    }

    /// Sends ABORT TASK for the oldest unanswered command, as the error
    /// handler does for a timed-out one, passing by commands that are
    /// already retries ([`Session::execute_retry`]); returns `false` when
    /// nothing such was outstanding. The command then ends `Status::Aborted` if the target
    /// aborted it, or normally if its response came first
    /// ([`SessionStats::aborts_complete`] / `aborts_failed` count the
    /// answers).
    pub fn abort_oldest(&self) -> bool {
        let inner = &self.inner;
        let mut st = inner.lock();
        if st.closed {
            return false;
        }
        let now = inner.now();
        let retried = &st.retried;
        let Some(tag) = st
            .channel
            .oldest_unanswered_where(|t| !retried.contains_key(&t))
        else {
            return false;
        };
        let sent = st.channel.abort(now, tag);
        inner.flush_outputs_here(&mut st);
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Kick));
        sent
    }

    /// Logs out: disconnects (ib_srp sends no SRP_I_LOGOUT either) and
    /// fails whatever is still outstanding.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        shutdown(&self.inner, self.poller.take());
    }
}

/// Logs a session out and frees its verbs objects: disconnect (a DREQ,
/// which over a dead link waits for the CM's retries to run out), fail
/// what is still outstanding, stop and join the poll thread, destroy.
fn shutdown(inner: &Inner, poller: Option<JoinHandle<()>>) {
    inner.connector.disconnect(inner.handle);
    {
        let mut st = inner.lock();
        let _ = inner.provider.modify_qp(
            inner.qp,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        );
        st.channel.disconnected(false);
        inner.drain_channel(&mut st);
        st.closed = true;
    }
    inner.cv.notify_all();
    let _ = inner.events.lock().map(|tx| tx.send(Ev::Stop));
    if let Some(h) = poller {
        let _ = h.join();
    }
    teardown(
        &inner.provider,
        inner.ca,
        inner.pd,
        inner.cq,
        inner.qp,
        &[
            inner.recv_mr.handle,
            inner.send_mr.handle,
            inner.pool_mr.handle,
        ],
    );
}

impl Drop for Session {
    /// A live session is logged out before this returns. A session whose
    /// connection already failed is torn down on a thread of its own: its
    /// commands have all ended (`TransportFailed`), and the DREQ over a
    /// dead link can take the CM's whole retry budget (seconds). Whoever
    /// drops the last reference (often an I/O thread on its way to retry
    /// a failed command on another path, or the remote port's reconnect
    /// thread) must not wait for that.
    fn drop(&mut self) {
        let Some(poller) = self.poller.take() else {
            return;
        };
        if !self.inner.lock().closed {
            shutdown(&self.inner, Some(poller));
            return;
        }
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("srp-teardown".into())
            .spawn(move || shutdown(&inner, Some(poller)));
        if spawned.is_err() {
            // No thread to hand it to: tear down here (the poll thread,
            // whose handle went with the closure, is stopped, not joined).
            shutdown(&self.inner, None);
        }
    }
}

fn recv_wr(buf: &MemBuf, mr: &MrInfo, size: u32, i: u32) -> RecvWr {
    RecvWr {
        wr_id: KIND_RECV | i as u64,
        sges: vec![Sge {
            addr: buf.addr() + (i * size) as u64,
            length: size,
            lkey: mr.lkey,
        }],
    }
}

fn teardown(
    p: &Arc<dyn Provider>,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    mrs: &[verbs::MrHandle],
) {
    let _ = p.destroy_qp(qp);
    for &m in mrs {
        let _ = p.dereg_mr(m);
    }
    let _ = p.destroy_cq(cq);
    let _ = p.dealloc_pd(pd);
    let _ = p.close_ca(ca);
}

impl Inner {
    fn lock(&self) -> Locked<'_> {
        Counted::lock(&self.st)
    }

    fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_std(self.epoch, std::time::Instant::now())
    }

    /// Pages per segment of a `pages`-page buffer: all of them, or
    /// `max_segment`'s worth when buffers are split.
    /// Descriptors one command may carry: `sg_tablesize` (at most
    /// [`MAX_EXT_DESCRIPTORS`]) with external tables, else no more than
    /// fit in the IU (`cmd_sg_entries`), as ib_srp limits `sg_tablesize`
    /// to `cmd_sg_entries` when it cannot use external tables.
    fn max_descriptors(&self) -> usize {
        let sg = (self.sg_tablesize as usize).min(MAX_EXT_DESCRIPTORS);
        if self.allow_ext_sg {
            sg
        } else {
            sg.min(usize::from(self.cmd_sg_entries))
        }
    }

    fn seg_pages(&self, pages: usize) -> usize {
        if self.max_segment == 0 {
            pages
        } else {
            (self.max_segment as usize).div_ceil(self.page).max(1)
        }
    }

    /// First-fit runs of free pages; split into runs of `max_segment` placed
    /// one page apart when segments are asked for.
    fn alloc(&self, st: &mut State, pages: usize) -> Option<Vec<(usize, usize)>> {
        if pages == 0 {
            return Some(Vec::new());
        }
        let seg_pages = self.seg_pages(pages);
        let mut runs = Vec::new();
        let mut left = pages;
        let mut from = 0;
        while left > 0 {
            let want = left.min(seg_pages);
            let Some(start) = find_free(&st.pages, from, want) else {
                self.free(st, &runs);
                return None;
            };
            for p in &mut st.pages[start..start + want] {
                *p = true;
            }
            runs.push((start, want));
            left -= want;
            // Leave a gap so consecutive segments are not contiguous.
            from = start + want + usize::from(self.max_segment != 0);
        }
        Some(runs)
    }

    fn free(&self, st: &mut State, runs: &[(usize, usize)]) {
        for &(start, n) in runs {
            for p in &mut st.pages[start..start + n] {
                *p = false;
            }
        }
    }

    fn segments(&self, runs: &[(usize, usize)], len: usize) -> Vec<DirectBuf> {
        let mut left = len;
        let mut segs = Vec::new();
        for &(start, n) in runs {
            let bytes = (n * self.page).min(left);
            segs.push(DirectBuf {
                va: self.pool.addr() + (start * self.page) as u64,
                key: self.pool_mr.rkey,
                len: bytes as u32,
            });
            left -= bytes;
        }
        segs
    }

    fn poll_loop(&self, rx: Receiver<Ev>) {
        loop {
            let wait = {
                let mut st = self.lock();
                let next = self.next_timer(&st);
                st.timer_sleep = Some(next);
                next.map(|t| t.saturating_since(self.now()).to_std())
            };
            let ev = match wait {
                Some(d) => rx.recv_timeout(d.max(std::time::Duration::from_millis(1))),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            self.lock().timer_sleep = None;
            match ev {
                Ok(Ev::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Ev::Cq) => self.drain_cq(),
                Ok(Ev::PortGone) => {
                    let mut st = self.lock();
                    st.stats.port_failures += 1;
                    self.lost(&mut st);
                    self.drain_channel(&mut st);
                }
                Ok(Ev::Kick) => {
                    let mut st = self.lock();
                    self.drain_channel(&mut st);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut st = self.lock();
                    let now = self.now();
                    st.channel.handle_timeout(now);
                    self.probe_if_due(&mut st, now);
                    self.drain_channel(&mut st);
                }
            }
        }
    }

    fn drain_cq(&self) {
        let mut st = self.lock();
        self.drain_cq_locked(&mut st);
    }

    fn drain_cq_locked(&self, st: &mut State) {
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        let mut armed = false;
        while let Ok(n) = self.provider.poll_cq(self.cq, &mut wcs) {
            for wc in &wcs[..n] {
                self.on_wc(st, wc);
            }
            if n == 0 {
                if armed || self.provider.req_notify_cq(self.cq, false).is_err() {
                    break;
                }
                armed = true;
            }
        }
        self.drain_channel(st);
    }

    fn on_wc(&self, st: &mut State, wc: &WorkCompletion) {
        let ok = wc.status == WcStatus::Success;
        if !ok && std::env::var_os("SRP_DEBUG").is_some() {
            eprintln!(
                "srp session: completion {:#x} failed: {:?}",
                wc.wr_id, wc.status
            );
        }
        match wc.wr_id & KIND_MASK {
            KIND_RECV => {
                let i = (wc.wr_id & !KIND_MASK) as u32;
                if ok {
                    st.quiet_since = self.now();
                    let len = (wc.byte_len).min(self.recv_size) as usize;
                    let bytes = self.recv_buf.to_vec((i * self.recv_size) as usize, len);
                    let now = self.now();
                    st.channel.handle_recv(now, &bytes);
                    let _ = self.provider.post_recv(
                        self.qp,
                        &[recv_wr(&self.recv_buf, &self.recv_mr, self.recv_size, i)],
                    );
                } else {
                    self.lost(st);
                }
            }
            KIND_PROBE => {
                st.probe_out = false;
                if ok {
                    st.stats.probes += 1;
                    st.quiet_since = self.now();
                } else {
                    self.lost(st);
                }
            }
            KIND_SEND => {
                let id = SendId(wc.wr_id & !KIND_MASK);
                if let Some(slot) = st.slot_of.remove(&id) {
                    st.free_slots.push(slot);
                }
                st.channel.handle_send_done(id);
                if !ok {
                    self.lost(st);
                }
            }
            _ => {}
        }
    }

    /// The connection failed under us: every outstanding command fails.
    /// The QP goes to the error state first (it may still be up after a
    /// port event or a target logout), so the target can no longer fetch
    /// the data of a command that is now retried elsewhere.
    fn lost(&self, st: &mut State) {
        if !st.closed {
            let _ = self.provider.modify_qp(
                self.qp,
                &QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                },
            );
            st.closed = true;
            st.channel.disconnected(false);
        }
    }

    fn flush_outputs(&self, st: &mut State) {
        while let Some(out) = st.channel.poll_output() {
            match out {
                Output::Send(t) => {
                    let Some(slot) = st.free_slots.pop() else {
                        // More sends than slots: the queue is sized
                        // can_queue + 2, so this is a bug; fail the link.
                        self.lost(st);
                        return;
                    };
                    if let (Some(table), Some(&desc)) = (&t.ext_table, st.tables.get(&t.tag)) {
                        // The table must be in place before the target
                        // can see the SRP_CMD that points at it.
                        self.pool
                            .write_at((desc - self.pool.addr()) as usize, table);
                    }
                    let off = slot as usize * self.slot_size as usize;
                    let n = t.bytes.len().min(self.slot_size as usize);
                    self.send_buf.write_at(off, &t.bytes[..n]);
                    let wr = SendWr::new(
                        KIND_SEND | t.id.0,
                        SendOpcode::Send,
                        vec![Sge {
                            addr: self.send_buf.addr() + off as u64,
                            length: n as u32,
                            lkey: self.send_mr.lkey,
                        }],
                    );
                    st.slot_of.insert(t.id, slot);
                    if self.provider.post_send(self.qp, &[wr]).is_err() {
                        st.slot_of.remove(&t.id);
                        st.free_slots.push(slot);
                        self.lost(st);
                    }
                }
                Output::Reconnect => {
                    // Host reset: this session gives up; the caller (rport
                    // FSM) logs in again.
                    self.lost(st);
                }
            }
        }
    }

    /// [`Inner::flush_outputs`] from a caller's thread: when a post failed
    /// and the connection is lost, the commands it ended (the caller's own
    /// among them) are handed to their waiters now, not whenever the poll
    /// thread next wakes.
    fn flush_outputs_here(&self, st: &mut State) {
        self.flush_outputs(st);
        if st.closed {
            self.drain_channel(st);
        }
    }

    fn drain_channel(&self, st: &mut State) {
        self.flush_outputs(st);
        while let Some(c) = st.channel.poll_completion() {
            st.stats.completed += 1;
            match c.status {
                Status::Reset => st.stats.reset_ended += 1,
                Status::Aborted => st.stats.aborted += 1,
                _ => {}
            }
            if let Some(t) = st.parked.remove(&c.tag) {
                t.unpark();
            }
            st.done.insert(c.tag, c);
        }
        while let Some(e) = st.channel.poll_event() {
            match &e {
                Event::TimedOut { .. } => st.stats.timeouts += 1,
                Event::TaskMgmtSent { .. } => st.stats.tmfs += 1,
                Event::TaskMgmtDone { func, result, .. } => {
                    st.tmfs_done += 1;
                    if *func == TmFunc::AbortTask {
                        match result {
                            Ok(()) => st.stats.aborts_complete += 1,
                            Err(_) => st.stats.aborts_failed += 1,
                        }
                    }
                    st.last_tmf = Some((*func, *result));
                }
                Event::Aer { .. } => st.stats.aers += 1,
                Event::Protocol(_) => st.stats.protocol_errors += 1,
                Event::TargetLogout(_) => self.lost(st),
            }
            if st.events.len() < 1024 {
                st.events.push_back(e);
            }
        }
        self.flush_outputs(st);
        // Completions may have freed credits or slots for waiting callers.
        if st.cv_waiters > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits on `cv`, counted so notifiers can skip an empty wait.
    fn wait_cv<'a>(&self, mut st: Locked<'a>) -> Locked<'a> {
        st.cv_waiters += 1;
        let g = self
            .cv
            .wait(st.into_guard())
            .unwrap_or_else(|e| e.into_inner());
        let mut st = Counted::from_guard(g);
        st.cv_waiters -= 1;
        st
    }

    /// When the liveness probe is due: commands wait, none is in flight,
    /// and the target has been quiet for the probe interval.
    fn probe_due(&self, st: &State) -> Option<rdma_types::Instant> {
        let every = self.probe_interval?;
        let waiting = !st.closed && !st.probe_out && st.channel.outstanding() > 0;
        waiting.then(|| st.quiet_since + every)
    }

    /// The poll thread's next deadline: the channel's timers or the probe.
    fn next_timer(&self, st: &State) -> Option<rdma_types::Instant> {
        match (st.channel.poll_timeout(), self.probe_due(st)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends the liveness probe if it is due: a zero-length RDMA WRITE,
    /// which needs no memory of the target's (a zero-length RDMA operation
    /// carries no valid address or R_Key, IBA C9-88; Linux rxe and our
    /// soft RoCE accept it, and ib_srpt's QPs allow remote writes) but is
    /// acknowledged or retried like any request. A failed probe is a failed connection.
    fn probe_if_due(&self, st: &mut State, now: rdma_types::Instant) {
        if self.probe_due(st).is_none_or(|at| at > now) {
            return;
        }
        let wr = SendWr::new(KIND_PROBE, SendOpcode::RdmaWrite, Vec::new());
        st.probe_out = true;
        if self.provider.post_send(self.qp, &[wr]).is_err() {
            st.probe_out = false;
            self.lost(st);
        }
    }

    /// Wakes the poll thread when it sleeps past the channel's next timer
    /// (a command sent to an idle channel arms its timeout).
    fn kick_if_timer_earlier(&self, st: &State) {
        let next = self.next_timer(st);
        let kick = match st.timer_sleep {
            None => false,
            Some(None) => next.is_some(),
            Some(Some(at)) => next.is_some_and(|n| n < at),
        };
        if kick {
            let _ = self.events.lock().map(|tx| tx.send(Ev::Kick));
        }
    }
}

fn find_free(pages: &[bool], from: usize, want: usize) -> Option<usize> {
    let mut run = 0;
    let start_at = if from + want <= pages.len() { from } else { 0 };
    for (i, &used) in pages.iter().enumerate().skip(start_at) {
        if used {
            run = 0;
        } else {
            run += 1;
            if run == want {
                return Some(i + 1 - want);
            }
        }
    }
    if start_at > 0 {
        return find_free(pages, 0, want);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_picks_its_table_index() {
        let t = [Pkey(0xffff), Pkey(0x0010), Pkey(0x0000), Pkey(0x8020)];
        // The same P_Key, or the partition with the other membership bit.
        assert_eq!(pkey_index(&t, Pkey(0xffff)), Some(0));
        assert_eq!(pkey_index(&t, Pkey(0x8010)), Some(1));
        assert_eq!(pkey_index(&t, Pkey(0x0020)), Some(3));
        // An exact entry wins over one of the other membership.
        let both = [Pkey(0x0010), Pkey(0x8010)];
        assert_eq!(pkey_index(&both, Pkey(0x8010)), Some(1));
        assert_eq!(pkey_index(&both, Pkey(0x0010)), Some(0));
        // Absent partitions and invalid keys find nothing.
        assert_eq!(pkey_index(&t, Pkey(0x8030)), None);
        assert_eq!(pkey_index(&t, Pkey(0x8000)), None);
        assert_eq!(pkey_index(&t, Pkey(0x0000)), None);
    }
}
