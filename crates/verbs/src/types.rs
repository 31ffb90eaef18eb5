//! Values passed through the verbs: attributes, work requests, completions,
//! events. Modelled on ibverbs.

use crate::handles::{AhHandle, CqHandle, MrHandle, MwHandle, SrqHandle};
use rdma_types::{
    AccessFlags, Gid, Guid, Lid, Lkey, Mtu, Pkey, PortNum, Psn, Qkey, QpState, QpType, Qpn, Rkey,
    WcOpcode, WcStatus,
};

/// Capabilities and limits of a CA (IBA 11.2.1.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaAttr {
    /// Node GUID.
    pub guid: Guid,
    /// Number of physical ports (numbered from 1).
    pub num_ports: u8,
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum WRs per work queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum CQEs per CQ.
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/atomic as responder.
    pub max_qp_rd_atom: u8,
    /// Maximum SRQs (0: no SRQ support).
    pub max_srq: u32,
    /// Maximum memory windows (0: none).
    pub max_mw: u32,
    /// Most inline data bytes a send WR may carry (0: no inline sends).
    pub max_inline_data: u32,
    /// Atomics supported.
    pub atomics: bool,
}

/// Physical port state (IBA 14.2.5.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up, not yet configured.
    Init,
    /// Configured and usable.
    Active,
}

/// Port attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number.
    pub port: PortNum,
    /// State.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// Current active MTU.
    pub active_mtu: Mtu,
    /// Base LID.
    pub lid: Lid,
    /// LID of the subnet manager.
    pub sm_lid: Lid,
    /// Where the master SM (and its SA) answers, on a fabric where a LID
    /// routes nothing (soft RoCE's `ib` personality, reached by GID):
    /// the GID its Sets came from, as the port's SMA set it
    /// ([`PortModify::sm_gid`](crate::PortModify::sm_gid)). `None` where
    /// the SM LID routes, or no SM has set the port up.
    pub sm_gid: Option<rdma_types::Gid>,
    /// GID table.
    pub gids: Vec<Gid>,
    /// P_Key table.
    pub pkeys: Vec<Pkey>,
}

/// Completion queue creation parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqInit {
    /// Minimum number of entries.
    pub cqe: u32,
}

/// Shared receive queue creation parameters and modifiable attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Limit: when the number of posted WRs falls below it, the SRQ limit
    /// event fires once and the limit disarms (IBA 11.5.2.3). 0 = disarmed.
    pub limit: u32,
}

/// Work queue capacities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline data bytes.
    pub max_inline: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline: 64,
        }
    }
}

/// QP creation parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// Transport type (SMI/GSI for QP0/QP1).
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: CqHandle,
    /// CQ for receive completions.
    pub recv_cq: CqHandle,
    /// Optional shared receive queue.
    pub srq: Option<SrqHandle>,
    /// Capacities.
    pub caps: QpCaps,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Port of a special QP (QP0/QP1); `None` for others.
    pub port: Option<PortNum>,
}

impl QpInit {
    /// An RC QP whose sends and receives complete on `cq`, with room for
    /// `send_wr` and `recv_wr` work requests of one SGE each, every send
    /// signalled, no SRQ.
    pub fn rc(cq: CqHandle, send_wr: u32, recv_wr: u32) -> QpInit {
        QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
            },
            sq_sig_all: true,
            port: None,
        }
    }
}

/// Address vector (IBA 11.2.2.1; for RoCE the GRH is mandatory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID.
    pub dlid: Lid,
    /// Local port.
    pub port: PortNum,
    /// Whether a GRH is present.
    pub grh: bool,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID index.
    pub sgid_index: u8,
    /// Service level.
    pub sl: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl AhAttr {
    /// The address vector of a RoCE peer at `dgid` through port 1 (no LID,
    /// GRH with our first GID, hop limit 64).
    pub fn roce(dgid: Gid) -> AhAttr {
        AhAttr {
            dlid: Lid(0),
            port: PortNum(1),
            grh: true,
            dgid,
            sgid_index: 0,
            sl: 0,
            hop_limit: 64,
        }
    }
}

/// QP attributes for modify/query. `None` = not given (the ibverbs mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state (required for modify).
    pub state: Option<QpState>,
    /// Port number.
    pub port: Option<PortNum>,
    /// P_Key index.
    pub pkey_index: Option<u16>,
    /// Q_Key (UD, SMI, GSI).
    pub qkey: Option<Qkey>,
    /// Remote access rights (RC, UC).
    pub access: Option<AccessFlags>,
    /// Path MTU (RC, UC).
    pub path_mtu: Option<Mtu>,
    /// Destination QPN (RC, UC).
    pub dest_qpn: Option<Qpn>,
    /// Receive PSN.
    pub rq_psn: Option<Psn>,
    /// Send PSN.
    pub sq_psn: Option<Psn>,
    /// Primary path (RC, UC).
    pub av: Option<AhAttr>,
    /// Responder resources for READ/atomic (RC).
    pub max_dest_rd_atomic: Option<u8>,
    /// Initiator depth (RC).
    pub max_rd_atomic: Option<u8>,
    /// Minimum RNR NAK timer code (RC).
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout exponent (RC).
    pub timeout: Option<u8>,
    /// Transport retry count (RC).
    pub retry_cnt: Option<u8>,
    /// RNR retry count, 7 = infinite (RC).
    pub rnr_retry: Option<u8>,
    /// Request the SQD "drained" async event.
    pub en_sqd_async_notify: Option<bool>,
    /// Alternate path (RC, UC; IBA 11.2.5.2), loadable in INIT->RTR,
    /// RTR->RTS, RTS->RTS, SQD->RTS and SQD->SQD while the path migration
    /// state is not `Armed`. A provider without path migration refuses it
    /// with `NotSupported`.
    pub alt_path: Option<AltPath>,
    /// Path migration state (RC, UC; IBA 17.2.8). The consumer asks for
    /// `Rearm` (the provider arms once an alternate path is loaded) or,
    /// in RTS->RTS while `Armed`, `Migrated` (a forced migration);
    /// `query_qp` reports the state in force.
    pub path_mig_state: Option<MigState>,
}

/// The alternate path of a connected QP (IBA 11.2.5.2: alternate address
/// vector, port, P_Key index and local ACK timeout, loaded together as
/// ibverbs' `IBV_QP_ALT_PATH` does). On migration it becomes the primary
/// path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AltPath {
    /// Address vector of the alternate path (its `port` is not used:
    /// `port` below is the local port).
    pub av: AhAttr,
    /// Local port of the alternate path.
    pub port: PortNum,
    /// P_Key index on that port.
    pub pkey_index: u16,
    /// Local ACK timeout exponent on the alternate path (RC).
    pub timeout: u8,
}

/// Path migration state of a connected QP (IBA 17.2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigState {
    /// No armed alternate path: the QP runs on its (possibly migrated)
    /// primary path. The state after RESET.
    Migrated,
    /// The consumer asked to arm the loaded alternate path.
    Rearm,
    /// The alternate path is ready: a failure of the primary path, or a
    /// forced migration, switches to it and raises `PathMigrated`.
    Armed,
}

/// Memory window type (IBA 10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Type 1: bound with the bind verb, PD-wide.
    Type1,
    /// Type 2: bound by a bind WR on a QP, invalidated by WR.
    Type2,
}

/// Result of memory registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Handle for rereg/dereg.
    pub handle: MrHandle,
    /// Local key.
    pub lkey: Lkey,
    /// Remote key.
    pub rkey: Rkey,
    /// First virtual address.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

/// Scatter/gather element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR covering the range.
    pub lkey: Lkey,
}

/// A work request's SGEs: up to two held in place (no allocation for
/// the requests of a storage data path), more on the heap. Built with
/// [`sges!`](crate::sges) as `vec!` builds a `Vec`, or from a `Vec`.
pub type Sges = smallvec::SmallVec<[Sge; 2]>;

/// Send work request opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOpcode {
    /// SEND.
    Send,
    /// SEND with immediate.
    SendWithImm,
    /// SEND with invalidate (`invalidate_rkey`).
    SendWithInv,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate (consumes a receive).
    RdmaWriteWithImm,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare-and-swap.
    AtomicCmpSwp,
    /// Atomic fetch-and-add.
    AtomicFetchAdd,
    /// Local invalidate of `invalidate_rkey`.
    LocalInv,
    /// Bind a type 2 memory window.
    BindMw,
}

/// Send flags (ibverbs `IBV_SEND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u8);

impl SendFlags {
    /// Generate a completion.
    pub const SIGNALED: SendFlags = SendFlags(1);
    /// Solicited event at the responder.
    pub const SOLICITED: SendFlags = SendFlags(2);
    /// Wait for prior READ/atomic to complete.
    pub const FENCE: SendFlags = SendFlags(4);
    /// Data copied at post time, lkeys ignored.
    pub const INLINE: SendFlags = SendFlags(8);

    /// Whether `f` is set.
    pub const fn contains(self, f: SendFlags) -> bool {
        self.0 & f.0 == f.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// Remote target of RDMA and atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: Rkey,
}

/// Datagram destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Address handle.
    pub ah: AhHandle,
    /// Destination QPN.
    pub remote_qpn: Qpn,
    /// Q_Key (high bit set: use the QP's own Q_Key, IBA 10.2.4).
    pub remote_qkey: Qkey,
}

/// Type 2 window bind (also used for type 1 via [`crate::Provider::bind_mw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window.
    pub mw: MwHandle,
    /// New R_Key (type 2: consumer picks the low 8 bits).
    pub rkey: Rkey,
    /// The MR the window is bound to.
    pub mr: MrHandle,
    /// Start address inside the MR.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Remote rights of the window.
    pub access: AccessFlags,
}

/// A send queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Consumer id returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: SendOpcode,
    /// Gather list (scatter list for READ / atomic result).
    pub sges: Sges,
    /// Flags.
    pub flags: SendFlags,
    /// Immediate data (with-imm opcodes), network order value.
    pub imm: u32,
    /// RDMA and atomic target.
    pub remote: RemoteAddr,
    /// Compare value (CAS) or add value (fetch-add).
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
    /// Datagram destination.
    pub ud: Option<UdDest>,
    /// R_Key to invalidate (SEND with invalidate, local invalidate).
    pub invalidate_rkey: Rkey,
    /// Window bind.
    pub bind_mw: Option<MwBind>,
    /// GSI sends only: the index of the port's P_Key table entry the
    /// datagram leaves with (IBA 11.4.1.1: a GSI work request names its
    /// partition; a response uses the request's,
    /// [`WorkCompletion::pkey_index`]). `None`: the QP's own. Other QP
    /// types send with the QP's P_Key and ignore it.
    pub pkey_index: Option<u16>,
}

impl SendWr {
    /// A signaled WR of `opcode` with `sges`, all else zero.
    pub fn new(wr_id: u64, opcode: SendOpcode, sges: impl Into<Sges>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            sges: sges.into(),
            flags: SendFlags::SIGNALED,
            imm: 0,
            remote: RemoteAddr::default(),
            compare_add: 0,
            swap: 0,
            ud: None,
            invalidate_rkey: Rkey(0),
            bind_mw: None,
            pkey_index: None,
        }
    }

    /// Total gather length.
    pub fn total_len(&self) -> u64 {
        self.sges.iter().map(|s| s.length as u64).sum()
    }
}

/// A receive work request.
#[derive(Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Consumer id.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: Sges,
}

/// As derived, with the scatter list copied whole (`Sge` is `Copy`), not
/// element by element: a posted receive is cloned into its queue.
impl Clone for RecvWr {
    fn clone(&self) -> RecvWr {
        RecvWr {
            wr_id: self.wr_id,
            sges: Sges::from_slice(&self.sges),
        }
    }
}

/// Work completion flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WcFlags(pub u8);

impl WcFlags {
    /// A 40-byte GRH precedes the payload in the receive buffer.
    pub const GRH: WcFlags = WcFlags(1);
    /// `imm` is valid.
    pub const WITH_IMM: WcFlags = WcFlags(2);
    /// `invalidated_rkey` is valid.
    pub const WITH_INV: WcFlags = WcFlags(4);

    /// Whether `f` is set.
    pub const fn contains(self, f: WcFlags) -> bool {
        self.0 & f.0 == f.0
    }
}

impl core::ops::BitOr for WcFlags {
    type Output = WcFlags;
    fn bitor(self, rhs: WcFlags) -> WcFlags {
        WcFlags(self.0 | rhs.0)
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The WR's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation (valid on success; receives always `Recv*`).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: including the GRH on UD).
    pub byte_len: u32,
    /// Immediate data.
    pub imm: u32,
    /// R_Key invalidated by SEND with invalidate.
    pub invalidated_rkey: Rkey,
    /// Source QPN (UD receives).
    pub src_qp: Qpn,
    /// P_Key index (GSI receives): the entry of the port's table that
    /// matched the datagram's P_Key, the one to answer it with.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: Lid,
    /// Flags.
    pub wc_flags: WcFlags,
    /// Consumer context of the QP.
    pub qp_ctx: u64,
}

impl WorkCompletion {
    /// A completion with only the ids and status set.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_ctx: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: 0,
            invalidated_rkey: Rkey(0),
            src_qp: Qpn::from_bits(0),
            pkey_index: 0,
            slid: Lid(0),
            wc_flags: WcFlags::default(),
            qp_ctx,
        }
    }
}

/// Kinds of resources, for [`crate::EventHandler::on_destroyed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// CA.
    Ca,
    /// PD.
    Pd,
    /// CQ.
    Cq,
    /// SRQ.
    Srq,
    /// QP.
    Qp,
    /// AH.
    Ah,
    /// MR.
    Mr,
    /// MW.
    Mw,
}

/// Asynchronous events (IBA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventKind {
    /// QP went to ERR on a fatal error (affiliated, QP ctx).
    QpFatal,
    /// Path migrated (affiliated, QP ctx).
    PathMigrated,
    /// First packet received in RTR (affiliated, QP ctx).
    CommEstablished,
    /// SQ drained in SQD (affiliated, QP ctx).
    SqDrained,
    /// SRQ fell below its limit (affiliated, SRQ ctx).
    SrqLimitReached,
    /// CQ overflow or error (affiliated, CQ ctx).
    CqError,
    /// Port became active (unaffiliated, port).
    PortActive,
    /// Port went down (unaffiliated, port).
    PortDown,
    /// LID changed (unaffiliated, port).
    LidChange,
    /// P_Key table changed (unaffiliated, port).
    PkeyChange,
    /// The port's master SM changed (unaffiliated, port; Linux's
    /// IB_EVENT_SM_CHANGE): SA clients re-register their subscriptions.
    SmChange,
    /// The CA is being removed (unaffiliated).
    CaRemoval,
}

/// An asynchronous event as delivered to the owner's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// Consumer context of the affiliated object (0 for unaffiliated).
    pub ctx: u64,
    /// Port for port events.
    pub port: Option<PortNum>,
}
