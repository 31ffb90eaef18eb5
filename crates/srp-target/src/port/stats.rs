//! What the port reports: sessions and per-LUN counters.

use super::*;

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
    /// Commands that ended in CHECK CONDITION for an error: every sense
    /// key but UNIT ATTENTION.
    pub errors: u64,
    /// Commands that ended in CHECK CONDITION with UNIT ATTENTION (SAM-5
    /// 5.14): news for the initiator (a new nexus's POWER ON, RESET, a
    /// changed capacity or LUN inventory), which it answers by retrying,
    /// not a failure of the LUN.
    pub unit_attentions: u64,
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
/// counters of a device the daemon removed go with it. An [`IdMap`]
/// (counted on every command): an entry is made only for a LUN that
/// addresses a device, so an initiator picks among the LUNs we mapped and
/// cannot make keys collide.
///
/// [`IdMap`]: rdma_types::IdMap
pub(super) type LunTable =
    rdma_types::IdMap<(u16, usize), (std::sync::Weak<scsi::Device>, LunCounters)>;
