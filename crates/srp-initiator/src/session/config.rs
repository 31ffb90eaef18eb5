//! A session's settings and its errors.

use super::*;

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
    /// Where the session notes what the target says changed (LUNs added
    /// or removed, a capacity changed: unit attentions and AERs), for a
    /// rescan ([`crate::changes`]). Give every session of one login the
    /// same one, so it outlives reconnects.
    pub changes: Option<Arc<crate::changes::TargetChanges>>,
    /// Each command's data (and descriptor table) gets an R_Key of its
    /// own, a type 2 memory window bound to its pool pages before the
    /// SRP_CMD goes and invalidated when the answer comes (ib_srp's
    /// `register_always`, which it does with fast registration): the
    /// target can reach that command's bytes and nothing else of the
    /// pool, and an RDMA outside them fails with a remote access error.
    /// `false`: one R_Key for the whole pool (two work requests fewer per
    /// command). Needs a provider with memory windows.
    pub register_always: bool,
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
            changes: None,
            sg_tablesize: MAX_EXT_DESCRIPTORS as u32,
            register_always: false,
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

pub(super) fn verbs_err(what: &'static str) -> impl FnOnce(verbs::VerbsError) -> SessionError {
    move |err| SessionError::Verbs { what, err }
}
