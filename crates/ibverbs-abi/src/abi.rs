//! The structs and constants of libibverbs' public header, as the
//! provider side of the ABI lays them out: rdma-core's
//! `<infiniband/verbs.h>` (Debian bookworm's rdma-core 44.0), x86_64.
//!
//! Written from the header's declarations and C's layout rules; the test
//! `header_layout` compiles a C program against Debian's header and
//! compares every size, offset and constant used here with
//! [`LAYOUT`] and [`CONSTANTS`]. Unlike `rdmacore::sys::raw` (the
//! consumer's view, declared up to the last field it reads), the structs
//! this library allocates and hands to applications (`ibv_context`,
//! `ibv_cq`, `ibv_qp`, ...) are declared whole: an application or an
//! inline function of the header may read any field of them.

#![allow(non_camel_case_types)]

use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `union ibv_gid`: 16 bytes in network order, 8-aligned (its other
/// member is two `__be64`).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct _ibv_device_ops`: two slots libibverbs keeps for old
/// providers; nothing calls them.
#[repr(C)]
pub struct ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut c_void;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut c_void, *mut c_void) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `struct ibv_context_ops`: 32 slots, of which the header's inline
/// functions call eight (`ibv_poll_cq`, `ibv_req_notify_cq`,
/// `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, and the
/// window verbs); the `_compat_*` slots are never called.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_0_6: [*mut c_void; 7],
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_13_19: [*mut c_void; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_21_24: [*mut c_void; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_27_31: [*mut c_void; 5],
}

/// `pthread_mutex_t` (glibc x86_64: 40 bytes; all zero is
/// `PTHREAD_MUTEX_INITIALIZER`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t(pub [u8; 40]);

/// `pthread_cond_t` (glibc x86_64: 48 bytes; all zero is
/// `PTHREAD_COND_INITIALIZER`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t(pub [u8; 48]);

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// `__VERBS_ABI_IS_EXTENDED` (all ones) when a `verbs_context`
    /// precedes the context.
    pub abi_compat: *mut c_void,
}

/// The number of extended-verb slots of `struct verbs_context` before
/// its `_ABI_placeholder3` (rdma-core 44: `query_port` first,
/// `close_xrcd` last).
pub const VERBS_CONTEXT_OPS: usize = 38;

/// `struct verbs_context`: the extended verbs, placed just before the
/// `ibv_context` they extend. Every slot is NULL here, so the header's
/// inline extended verbs (`verbs_get_ctx_op`) find none and take their
/// fallback or answer `EOPNOTSUPP`.
#[repr(C)]
pub struct verbs_context {
    pub ops: [*mut c_void; VERBS_CONTEXT_OPS],
    pub _abi_placeholder3: u64,
    /// Bytes of this struct the library filled, counted back from the
    /// end (`sizeof(struct verbs_context)` here).
    pub sz: usize,
    pub context: ibv_context,
}

/// `__VERBS_ABI_IS_EXTENDED`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// Network order.
    pub node_guid: u64,
    /// Network order.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`. The exported `ibv_query_port` is the old
/// entry point (`struct _compat_ibv_port_attr`, which the header's inline
/// `ibv_query_port` calls when the context has no extended `query_port`):
/// it fills the fields up to `link_layer` only ([`COMPAT_PORT_ATTR_LEN`]).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// The bytes of `ibv_port_attr` an old caller's struct surely has: up
/// to and including `link_layer`.
pub const COMPAT_PORT_ATTR_LEN: usize = offset_of!(ibv_port_attr, link_layer) + 1;

/// `struct ibv_gid_entry` (`ibv_query_gid_ex`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`, as its largest member
/// (`atomic`: remote_addr, compare_add, swap, rkey); `rdma` and `ud` read
/// their fields from the same bytes ([`SendWrUnion::rdma`],
/// [`SendWrUnion::ud`]).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SendWrUnion {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

impl SendWrUnion {
    /// `wr.rdma`: remote address, then the R_Key at offset 8.
    pub fn rdma(&self) -> (u64, u32) {
        (self.remote_addr, self.compare_add as u32)
    }

    /// `wr.ud`: the AH pointer, then remote QPN and Q_Key at 8 and 12.
    pub fn ud(&self) -> (*mut ibv_ah, u32, u32) {
        (
            self.remote_addr as *mut ibv_ah,
            self.compare_add as u32,
            (self.compare_add >> 32) as u32,
        )
    }
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// The last union of `struct ibv_send_wr` (`bind_mw` or `tso`), as its
/// larger member `bind_mw`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SendWrBindMw {
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_or_inv: u32,
    pub wr: SendWrUnion,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    pub bind_mw: SendWrBindMw,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_async_event`: the element (a CQ, QP or SRQ pointer, or a
/// port number in the low 32 bits) and the event type.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// The header's constants this library uses, by name and value.
pub mod consts {
    use std::os::raw::c_int;

    pub const IBV_NODE_CA: c_int = 1;
    pub const IBV_TRANSPORT_IB: c_int = 0;
    pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
    pub const IBV_PORT_DOWN: c_int = 1;
    pub const IBV_PORT_INIT: c_int = 2;
    pub const IBV_PORT_ACTIVE: c_int = 4;
    pub const IBV_ATOMIC_NONE: c_int = 0;
    pub const IBV_ATOMIC_HCA: c_int = 1;
    pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
    /// `IBV_GID_TYPE_SYSFS_ROCE_V2` of `<infiniband/driver.h>` (not in
    /// libibverbs-dev; rdma-core's "GID types as they appear in sysfs":
    /// IB/RoCE v1 is 0, RoCE v2 is 1), what `ibv_query_gid_type` gives.
    pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

    pub const IBV_QPT_RC: c_int = 2;
    pub const IBV_QPT_UC: c_int = 3;
    pub const IBV_QPT_UD: c_int = 4;

    pub const IBV_QP_STATE: c_int = 1 << 0;
    pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
    pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
    pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
    pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
    pub const IBV_QP_PORT: c_int = 1 << 5;
    pub const IBV_QP_QKEY: c_int = 1 << 6;
    pub const IBV_QP_AV: c_int = 1 << 7;
    pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
    pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
    pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
    pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
    pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
    pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
    pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
    pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
    pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
    pub const IBV_QP_CAP: c_int = 1 << 19;
    pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

    pub const IBV_WR_RDMA_WRITE: c_int = 0;
    pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
    pub const IBV_WR_SEND: c_int = 2;
    pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
    pub const IBV_WR_RDMA_READ: c_int = 4;
    pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
    pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
    pub const IBV_WR_LOCAL_INV: c_int = 7;
    pub const IBV_WR_SEND_WITH_INV: c_int = 9;

    pub const IBV_SEND_FENCE: u32 = 1 << 0;
    pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
    pub const IBV_SEND_SOLICITED: u32 = 1 << 2;
    pub const IBV_SEND_INLINE: u32 = 1 << 3;

    pub const IBV_WC_SEND: c_int = 0;
    pub const IBV_WC_RDMA_WRITE: c_int = 1;
    pub const IBV_WC_RDMA_READ: c_int = 2;
    pub const IBV_WC_COMP_SWAP: c_int = 3;
    pub const IBV_WC_FETCH_ADD: c_int = 4;
    pub const IBV_WC_BIND_MW: c_int = 5;
    pub const IBV_WC_LOCAL_INV: c_int = 6;
    pub const IBV_WC_RECV: c_int = 128;
    pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = 129;

    pub const IBV_WC_GRH: u32 = 1 << 0;
    pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
    pub const IBV_WC_WITH_INV: u32 = 1 << 3;

    pub const IBV_EVENT_CQ_ERR: c_int = 0;
    pub const IBV_EVENT_QP_FATAL: c_int = 1;
    pub const IBV_EVENT_COMM_EST: c_int = 4;
    pub const IBV_EVENT_SQ_DRAINED: c_int = 5;
    pub const IBV_EVENT_PATH_MIG: c_int = 6;
    pub const IBV_EVENT_DEVICE_FATAL: c_int = 8;
    pub const IBV_EVENT_PORT_ACTIVE: c_int = 9;
    pub const IBV_EVENT_PORT_ERR: c_int = 10;
    pub const IBV_EVENT_LID_CHANGE: c_int = 11;
    pub const IBV_EVENT_PKEY_CHANGE: c_int = 12;
    pub const IBV_EVENT_SM_CHANGE: c_int = 13;
    pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;

    pub const IBV_SRQ_MAX_WR: c_int = 1 << 0;
    pub const IBV_SRQ_LIMIT: c_int = 1 << 1;
}

/// What the layout test checks: `(C expression, Rust value)`, each
/// expression printed by a program compiled against Debian's header.
pub const LAYOUT: &[(&str, usize)] = &[
    ("sizeof(union ibv_gid)", size_of::<ibv_gid>()),
    ("sizeof(struct ibv_device)", size_of::<ibv_device>()),
    (
        "offsetof(struct ibv_device, node_type)",
        offset_of!(ibv_device, node_type),
    ),
    (
        "offsetof(struct ibv_device, transport_type)",
        offset_of!(ibv_device, transport_type),
    ),
    (
        "offsetof(struct ibv_device, name)",
        offset_of!(ibv_device, name),
    ),
    (
        "offsetof(struct ibv_device, dev_name)",
        offset_of!(ibv_device, dev_name),
    ),
    (
        "offsetof(struct ibv_device, dev_path)",
        offset_of!(ibv_device, dev_path),
    ),
    (
        "offsetof(struct ibv_device, ibdev_path)",
        offset_of!(ibv_device, ibdev_path),
    ),
    (
        "sizeof(struct ibv_context_ops)",
        size_of::<ibv_context_ops>(),
    ),
    (
        "offsetof(struct ibv_context_ops, alloc_mw)",
        offset_of!(ibv_context_ops, alloc_mw),
    ),
    (
        "offsetof(struct ibv_context_ops, bind_mw)",
        offset_of!(ibv_context_ops, bind_mw),
    ),
    (
        "offsetof(struct ibv_context_ops, dealloc_mw)",
        offset_of!(ibv_context_ops, dealloc_mw),
    ),
    (
        "offsetof(struct ibv_context_ops, poll_cq)",
        offset_of!(ibv_context_ops, poll_cq),
    ),
    (
        "offsetof(struct ibv_context_ops, req_notify_cq)",
        offset_of!(ibv_context_ops, req_notify_cq),
    ),
    (
        "offsetof(struct ibv_context_ops, post_srq_recv)",
        offset_of!(ibv_context_ops, post_srq_recv),
    ),
    (
        "offsetof(struct ibv_context_ops, post_send)",
        offset_of!(ibv_context_ops, post_send),
    ),
    (
        "offsetof(struct ibv_context_ops, post_recv)",
        offset_of!(ibv_context_ops, post_recv),
    ),
    ("sizeof(pthread_mutex_t)", size_of::<pthread_mutex_t>()),
    ("sizeof(pthread_cond_t)", size_of::<pthread_cond_t>()),
    ("sizeof(struct ibv_context)", size_of::<ibv_context>()),
    (
        "offsetof(struct ibv_context, ops)",
        offset_of!(ibv_context, ops),
    ),
    (
        "offsetof(struct ibv_context, cmd_fd)",
        offset_of!(ibv_context, cmd_fd),
    ),
    (
        "offsetof(struct ibv_context, async_fd)",
        offset_of!(ibv_context, async_fd),
    ),
    (
        "offsetof(struct ibv_context, num_comp_vectors)",
        offset_of!(ibv_context, num_comp_vectors),
    ),
    (
        "offsetof(struct ibv_context, mutex)",
        offset_of!(ibv_context, mutex),
    ),
    (
        "offsetof(struct ibv_context, abi_compat)",
        offset_of!(ibv_context, abi_compat),
    ),
    ("sizeof(struct verbs_context)", size_of::<verbs_context>()),
    (
        "offsetof(struct verbs_context, query_port)",
        offset_of!(verbs_context, ops),
    ),
    (
        "offsetof(struct verbs_context, close_xrcd)",
        offset_of!(verbs_context, ops) + (VERBS_CONTEXT_OPS - 1) * 8,
    ),
    (
        "offsetof(struct verbs_context, sz)",
        offset_of!(verbs_context, sz),
    ),
    (
        "offsetof(struct verbs_context, context)",
        offset_of!(verbs_context, context),
    ),
    (
        "sizeof(struct ibv_device_attr)",
        size_of::<ibv_device_attr>(),
    ),
    (
        "offsetof(struct ibv_device_attr, node_guid)",
        offset_of!(ibv_device_attr, node_guid),
    ),
    (
        "offsetof(struct ibv_device_attr, sys_image_guid)",
        offset_of!(ibv_device_attr, sys_image_guid),
    ),
    (
        "offsetof(struct ibv_device_attr, max_mr_size)",
        offset_of!(ibv_device_attr, max_mr_size),
    ),
    (
        "offsetof(struct ibv_device_attr, vendor_id)",
        offset_of!(ibv_device_attr, vendor_id),
    ),
    (
        "offsetof(struct ibv_device_attr, max_qp)",
        offset_of!(ibv_device_attr, max_qp),
    ),
    (
        "offsetof(struct ibv_device_attr, max_qp_wr)",
        offset_of!(ibv_device_attr, max_qp_wr),
    ),
    (
        "offsetof(struct ibv_device_attr, device_cap_flags)",
        offset_of!(ibv_device_attr, device_cap_flags),
    ),
    (
        "offsetof(struct ibv_device_attr, max_sge)",
        offset_of!(ibv_device_attr, max_sge),
    ),
    (
        "offsetof(struct ibv_device_attr, max_cq)",
        offset_of!(ibv_device_attr, max_cq),
    ),
    (
        "offsetof(struct ibv_device_attr, max_cqe)",
        offset_of!(ibv_device_attr, max_cqe),
    ),
    (
        "offsetof(struct ibv_device_attr, max_mr)",
        offset_of!(ibv_device_attr, max_mr),
    ),
    (
        "offsetof(struct ibv_device_attr, max_pd)",
        offset_of!(ibv_device_attr, max_pd),
    ),
    (
        "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
        offset_of!(ibv_device_attr, max_qp_rd_atom),
    ),
    (
        "offsetof(struct ibv_device_attr, max_qp_init_rd_atom)",
        offset_of!(ibv_device_attr, max_qp_init_rd_atom),
    ),
    (
        "offsetof(struct ibv_device_attr, atomic_cap)",
        offset_of!(ibv_device_attr, atomic_cap),
    ),
    (
        "offsetof(struct ibv_device_attr, max_mw)",
        offset_of!(ibv_device_attr, max_mw),
    ),
    (
        "offsetof(struct ibv_device_attr, max_ah)",
        offset_of!(ibv_device_attr, max_ah),
    ),
    (
        "offsetof(struct ibv_device_attr, max_srq)",
        offset_of!(ibv_device_attr, max_srq),
    ),
    (
        "offsetof(struct ibv_device_attr, max_srq_wr)",
        offset_of!(ibv_device_attr, max_srq_wr),
    ),
    (
        "offsetof(struct ibv_device_attr, max_srq_sge)",
        offset_of!(ibv_device_attr, max_srq_sge),
    ),
    (
        "offsetof(struct ibv_device_attr, max_pkeys)",
        offset_of!(ibv_device_attr, max_pkeys),
    ),
    (
        "offsetof(struct ibv_device_attr, phys_port_cnt)",
        offset_of!(ibv_device_attr, phys_port_cnt),
    ),
    ("sizeof(struct ibv_port_attr)", size_of::<ibv_port_attr>()),
    (
        "offsetof(struct ibv_port_attr, max_mtu)",
        offset_of!(ibv_port_attr, max_mtu),
    ),
    (
        "offsetof(struct ibv_port_attr, active_mtu)",
        offset_of!(ibv_port_attr, active_mtu),
    ),
    (
        "offsetof(struct ibv_port_attr, gid_tbl_len)",
        offset_of!(ibv_port_attr, gid_tbl_len),
    ),
    (
        "offsetof(struct ibv_port_attr, max_msg_sz)",
        offset_of!(ibv_port_attr, max_msg_sz),
    ),
    (
        "offsetof(struct ibv_port_attr, pkey_tbl_len)",
        offset_of!(ibv_port_attr, pkey_tbl_len),
    ),
    (
        "offsetof(struct ibv_port_attr, lid)",
        offset_of!(ibv_port_attr, lid),
    ),
    (
        "offsetof(struct ibv_port_attr, sm_lid)",
        offset_of!(ibv_port_attr, sm_lid),
    ),
    (
        "offsetof(struct ibv_port_attr, active_width)",
        offset_of!(ibv_port_attr, active_width),
    ),
    (
        "offsetof(struct ibv_port_attr, active_speed)",
        offset_of!(ibv_port_attr, active_speed),
    ),
    (
        "offsetof(struct ibv_port_attr, phys_state)",
        offset_of!(ibv_port_attr, phys_state),
    ),
    (
        "offsetof(struct ibv_port_attr, link_layer)",
        offset_of!(ibv_port_attr, link_layer),
    ),
    (
        "offsetof(struct ibv_port_attr, port_cap_flags2)",
        offset_of!(ibv_port_attr, port_cap_flags2),
    ),
    ("sizeof(struct ibv_gid_entry)", size_of::<ibv_gid_entry>()),
    (
        "offsetof(struct ibv_gid_entry, gid_type)",
        offset_of!(ibv_gid_entry, gid_type),
    ),
    ("sizeof(struct ibv_pd)", size_of::<ibv_pd>()),
    ("sizeof(struct ibv_mr)", size_of::<ibv_mr>()),
    ("offsetof(struct ibv_mr, addr)", offset_of!(ibv_mr, addr)),
    (
        "offsetof(struct ibv_mr, length)",
        offset_of!(ibv_mr, length),
    ),
    ("offsetof(struct ibv_mr, lkey)", offset_of!(ibv_mr, lkey)),
    ("offsetof(struct ibv_mr, rkey)", offset_of!(ibv_mr, rkey)),
    (
        "sizeof(struct ibv_comp_channel)",
        size_of::<ibv_comp_channel>(),
    ),
    (
        "offsetof(struct ibv_comp_channel, fd)",
        offset_of!(ibv_comp_channel, fd),
    ),
    ("sizeof(struct ibv_cq)", size_of::<ibv_cq>()),
    (
        "offsetof(struct ibv_cq, channel)",
        offset_of!(ibv_cq, channel),
    ),
    (
        "offsetof(struct ibv_cq, cq_context)",
        offset_of!(ibv_cq, cq_context),
    ),
    ("offsetof(struct ibv_cq, cqe)", offset_of!(ibv_cq, cqe)),
    ("offsetof(struct ibv_cq, mutex)", offset_of!(ibv_cq, mutex)),
    ("offsetof(struct ibv_cq, cond)", offset_of!(ibv_cq, cond)),
    (
        "offsetof(struct ibv_cq, comp_events_completed)",
        offset_of!(ibv_cq, comp_events_completed),
    ),
    (
        "offsetof(struct ibv_cq, async_events_completed)",
        offset_of!(ibv_cq, async_events_completed),
    ),
    ("sizeof(struct ibv_srq)", size_of::<ibv_srq>()),
    (
        "offsetof(struct ibv_srq, handle)",
        offset_of!(ibv_srq, handle),
    ),
    (
        "offsetof(struct ibv_srq, events_completed)",
        offset_of!(ibv_srq, events_completed),
    ),
    (
        "sizeof(struct ibv_srq_init_attr)",
        size_of::<ibv_srq_init_attr>(),
    ),
    (
        "offsetof(struct ibv_srq_init_attr, attr)",
        offset_of!(ibv_srq_init_attr, attr),
    ),
    ("sizeof(struct ibv_qp)", size_of::<ibv_qp>()),
    ("offsetof(struct ibv_qp, srq)", offset_of!(ibv_qp, srq)),
    (
        "offsetof(struct ibv_qp, qp_num)",
        offset_of!(ibv_qp, qp_num),
    ),
    ("offsetof(struct ibv_qp, state)", offset_of!(ibv_qp, state)),
    (
        "offsetof(struct ibv_qp, qp_type)",
        offset_of!(ibv_qp, qp_type),
    ),
    ("offsetof(struct ibv_qp, mutex)", offset_of!(ibv_qp, mutex)),
    (
        "offsetof(struct ibv_qp, events_completed)",
        offset_of!(ibv_qp, events_completed),
    ),
    ("sizeof(struct ibv_qp_cap)", size_of::<ibv_qp_cap>()),
    (
        "sizeof(struct ibv_qp_init_attr)",
        size_of::<ibv_qp_init_attr>(),
    ),
    (
        "offsetof(struct ibv_qp_init_attr, cap)",
        offset_of!(ibv_qp_init_attr, cap),
    ),
    (
        "offsetof(struct ibv_qp_init_attr, qp_type)",
        offset_of!(ibv_qp_init_attr, qp_type),
    ),
    (
        "offsetof(struct ibv_qp_init_attr, sq_sig_all)",
        offset_of!(ibv_qp_init_attr, sq_sig_all),
    ),
    (
        "sizeof(struct ibv_global_route)",
        size_of::<ibv_global_route>(),
    ),
    (
        "offsetof(struct ibv_global_route, sgid_index)",
        offset_of!(ibv_global_route, sgid_index),
    ),
    (
        "offsetof(struct ibv_global_route, hop_limit)",
        offset_of!(ibv_global_route, hop_limit),
    ),
    ("sizeof(struct ibv_ah_attr)", size_of::<ibv_ah_attr>()),
    (
        "offsetof(struct ibv_ah_attr, dlid)",
        offset_of!(ibv_ah_attr, dlid),
    ),
    (
        "offsetof(struct ibv_ah_attr, sl)",
        offset_of!(ibv_ah_attr, sl),
    ),
    (
        "offsetof(struct ibv_ah_attr, is_global)",
        offset_of!(ibv_ah_attr, is_global),
    ),
    (
        "offsetof(struct ibv_ah_attr, port_num)",
        offset_of!(ibv_ah_attr, port_num),
    ),
    ("sizeof(struct ibv_ah)", size_of::<ibv_ah>()),
    ("sizeof(struct ibv_qp_attr)", size_of::<ibv_qp_attr>()),
    (
        "offsetof(struct ibv_qp_attr, qkey)",
        offset_of!(ibv_qp_attr, qkey),
    ),
    (
        "offsetof(struct ibv_qp_attr, rq_psn)",
        offset_of!(ibv_qp_attr, rq_psn),
    ),
    (
        "offsetof(struct ibv_qp_attr, sq_psn)",
        offset_of!(ibv_qp_attr, sq_psn),
    ),
    (
        "offsetof(struct ibv_qp_attr, dest_qp_num)",
        offset_of!(ibv_qp_attr, dest_qp_num),
    ),
    (
        "offsetof(struct ibv_qp_attr, qp_access_flags)",
        offset_of!(ibv_qp_attr, qp_access_flags),
    ),
    (
        "offsetof(struct ibv_qp_attr, cap)",
        offset_of!(ibv_qp_attr, cap),
    ),
    (
        "offsetof(struct ibv_qp_attr, ah_attr)",
        offset_of!(ibv_qp_attr, ah_attr),
    ),
    (
        "offsetof(struct ibv_qp_attr, alt_ah_attr)",
        offset_of!(ibv_qp_attr, alt_ah_attr),
    ),
    (
        "offsetof(struct ibv_qp_attr, pkey_index)",
        offset_of!(ibv_qp_attr, pkey_index),
    ),
    (
        "offsetof(struct ibv_qp_attr, en_sqd_async_notify)",
        offset_of!(ibv_qp_attr, en_sqd_async_notify),
    ),
    (
        "offsetof(struct ibv_qp_attr, max_rd_atomic)",
        offset_of!(ibv_qp_attr, max_rd_atomic),
    ),
    (
        "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
        offset_of!(ibv_qp_attr, max_dest_rd_atomic),
    ),
    (
        "offsetof(struct ibv_qp_attr, min_rnr_timer)",
        offset_of!(ibv_qp_attr, min_rnr_timer),
    ),
    (
        "offsetof(struct ibv_qp_attr, port_num)",
        offset_of!(ibv_qp_attr, port_num),
    ),
    (
        "offsetof(struct ibv_qp_attr, timeout)",
        offset_of!(ibv_qp_attr, timeout),
    ),
    (
        "offsetof(struct ibv_qp_attr, retry_cnt)",
        offset_of!(ibv_qp_attr, retry_cnt),
    ),
    (
        "offsetof(struct ibv_qp_attr, rnr_retry)",
        offset_of!(ibv_qp_attr, rnr_retry),
    ),
    (
        "offsetof(struct ibv_qp_attr, rate_limit)",
        offset_of!(ibv_qp_attr, rate_limit),
    ),
    ("sizeof(struct ibv_sge)", size_of::<ibv_sge>()),
    ("offsetof(struct ibv_sge, lkey)", offset_of!(ibv_sge, lkey)),
    ("sizeof(struct ibv_send_wr)", size_of::<ibv_send_wr>()),
    (
        "offsetof(struct ibv_send_wr, next)",
        offset_of!(ibv_send_wr, next),
    ),
    (
        "offsetof(struct ibv_send_wr, sg_list)",
        offset_of!(ibv_send_wr, sg_list),
    ),
    (
        "offsetof(struct ibv_send_wr, num_sge)",
        offset_of!(ibv_send_wr, num_sge),
    ),
    (
        "offsetof(struct ibv_send_wr, opcode)",
        offset_of!(ibv_send_wr, opcode),
    ),
    (
        "offsetof(struct ibv_send_wr, send_flags)",
        offset_of!(ibv_send_wr, send_flags),
    ),
    (
        "offsetof(struct ibv_send_wr, imm_data)",
        offset_of!(ibv_send_wr, imm_or_inv),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
        offset_of!(ibv_send_wr, wr),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
        offset_of!(ibv_send_wr, wr) + 8,
    ),
    (
        "offsetof(struct ibv_send_wr, wr.atomic.compare_add)",
        offset_of!(ibv_send_wr, wr) + offset_of!(SendWrUnion, compare_add),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.atomic.swap)",
        offset_of!(ibv_send_wr, wr) + offset_of!(SendWrUnion, swap),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.atomic.rkey)",
        offset_of!(ibv_send_wr, wr) + offset_of!(SendWrUnion, rkey),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.ud.ah)",
        offset_of!(ibv_send_wr, wr),
    ),
    (
        "offsetof(struct ibv_send_wr, wr.ud.remote_qpn)",
        offset_of!(ibv_send_wr, wr) + 8,
    ),
    (
        "offsetof(struct ibv_send_wr, wr.ud.remote_qkey)",
        offset_of!(ibv_send_wr, wr) + 12,
    ),
    (
        "offsetof(struct ibv_send_wr, qp_type.xrc.remote_srqn)",
        offset_of!(ibv_send_wr, remote_srqn),
    ),
    (
        "offsetof(struct ibv_send_wr, bind_mw)",
        offset_of!(ibv_send_wr, bind_mw),
    ),
    ("sizeof(struct ibv_recv_wr)", size_of::<ibv_recv_wr>()),
    (
        "offsetof(struct ibv_recv_wr, num_sge)",
        offset_of!(ibv_recv_wr, num_sge),
    ),
    ("sizeof(struct ibv_wc)", size_of::<ibv_wc>()),
    (
        "offsetof(struct ibv_wc, status)",
        offset_of!(ibv_wc, status),
    ),
    (
        "offsetof(struct ibv_wc, opcode)",
        offset_of!(ibv_wc, opcode),
    ),
    (
        "offsetof(struct ibv_wc, byte_len)",
        offset_of!(ibv_wc, byte_len),
    ),
    (
        "offsetof(struct ibv_wc, imm_data)",
        offset_of!(ibv_wc, imm_or_inv),
    ),
    (
        "offsetof(struct ibv_wc, qp_num)",
        offset_of!(ibv_wc, qp_num),
    ),
    (
        "offsetof(struct ibv_wc, src_qp)",
        offset_of!(ibv_wc, src_qp),
    ),
    (
        "offsetof(struct ibv_wc, wc_flags)",
        offset_of!(ibv_wc, wc_flags),
    ),
    (
        "offsetof(struct ibv_wc, pkey_index)",
        offset_of!(ibv_wc, pkey_index),
    ),
    ("offsetof(struct ibv_wc, slid)", offset_of!(ibv_wc, slid)),
    ("offsetof(struct ibv_wc, sl)", offset_of!(ibv_wc, sl)),
    (
        "sizeof(struct ibv_async_event)",
        size_of::<ibv_async_event>(),
    ),
    (
        "offsetof(struct ibv_async_event, event_type)",
        offset_of!(ibv_async_event, event_type),
    ),
];

/// The header's constants as the layout test checks them: `(C name,
/// value here)`.
pub const CONSTANTS: &[(&str, i64)] = {
    use consts::*;
    &[
        ("IBV_NODE_CA", IBV_NODE_CA as i64),
        ("IBV_TRANSPORT_IB", IBV_TRANSPORT_IB as i64),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as i64),
        ("IBV_PORT_DOWN", IBV_PORT_DOWN as i64),
        ("IBV_PORT_INIT", IBV_PORT_INIT as i64),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as i64),
        ("IBV_ATOMIC_NONE", IBV_ATOMIC_NONE as i64),
        ("IBV_ATOMIC_HCA", IBV_ATOMIC_HCA as i64),
        ("IBV_GID_TYPE_ROCE_V2", IBV_GID_TYPE_ROCE_V2 as i64),
        ("IBV_QPT_RC", IBV_QPT_RC as i64),
        ("IBV_QPT_UC", IBV_QPT_UC as i64),
        ("IBV_QPT_UD", IBV_QPT_UD as i64),
        ("IBV_QP_STATE", IBV_QP_STATE as i64),
        ("IBV_QP_CUR_STATE", IBV_QP_CUR_STATE as i64),
        (
            "IBV_QP_EN_SQD_ASYNC_NOTIFY",
            IBV_QP_EN_SQD_ASYNC_NOTIFY as i64,
        ),
        ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as i64),
        ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as i64),
        ("IBV_QP_PORT", IBV_QP_PORT as i64),
        ("IBV_QP_QKEY", IBV_QP_QKEY as i64),
        ("IBV_QP_AV", IBV_QP_AV as i64),
        ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as i64),
        ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as i64),
        ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as i64),
        ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as i64),
        ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as i64),
        ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as i64),
        ("IBV_QP_ALT_PATH", IBV_QP_ALT_PATH as i64),
        ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as i64),
        ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as i64),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as i64,
        ),
        ("IBV_QP_PATH_MIG_STATE", IBV_QP_PATH_MIG_STATE as i64),
        ("IBV_QP_CAP", IBV_QP_CAP as i64),
        ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as i64),
        ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as i64),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            IBV_WR_RDMA_WRITE_WITH_IMM as i64,
        ),
        ("IBV_WR_SEND", IBV_WR_SEND as i64),
        ("IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM as i64),
        ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as i64),
        (
            "IBV_WR_ATOMIC_CMP_AND_SWP",
            IBV_WR_ATOMIC_CMP_AND_SWP as i64,
        ),
        (
            "IBV_WR_ATOMIC_FETCH_AND_ADD",
            IBV_WR_ATOMIC_FETCH_AND_ADD as i64,
        ),
        ("IBV_WR_LOCAL_INV", IBV_WR_LOCAL_INV as i64),
        ("IBV_WR_SEND_WITH_INV", IBV_WR_SEND_WITH_INV as i64),
        ("IBV_SEND_FENCE", IBV_SEND_FENCE as i64),
        ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as i64),
        ("IBV_SEND_SOLICITED", IBV_SEND_SOLICITED as i64),
        ("IBV_SEND_INLINE", IBV_SEND_INLINE as i64),
        ("IBV_WC_SEND", IBV_WC_SEND as i64),
        ("IBV_WC_RDMA_WRITE", IBV_WC_RDMA_WRITE as i64),
        ("IBV_WC_RDMA_READ", IBV_WC_RDMA_READ as i64),
        ("IBV_WC_COMP_SWAP", IBV_WC_COMP_SWAP as i64),
        ("IBV_WC_FETCH_ADD", IBV_WC_FETCH_ADD as i64),
        ("IBV_WC_BIND_MW", IBV_WC_BIND_MW as i64),
        ("IBV_WC_LOCAL_INV", IBV_WC_LOCAL_INV as i64),
        ("IBV_WC_RECV", IBV_WC_RECV as i64),
        (
            "IBV_WC_RECV_RDMA_WITH_IMM",
            IBV_WC_RECV_RDMA_WITH_IMM as i64,
        ),
        ("IBV_WC_GRH", IBV_WC_GRH as i64),
        ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as i64),
        ("IBV_WC_WITH_INV", IBV_WC_WITH_INV as i64),
        ("IBV_EVENT_CQ_ERR", IBV_EVENT_CQ_ERR as i64),
        ("IBV_EVENT_QP_FATAL", IBV_EVENT_QP_FATAL as i64),
        ("IBV_EVENT_COMM_EST", IBV_EVENT_COMM_EST as i64),
        ("IBV_EVENT_SQ_DRAINED", IBV_EVENT_SQ_DRAINED as i64),
        ("IBV_EVENT_PATH_MIG", IBV_EVENT_PATH_MIG as i64),
        ("IBV_EVENT_DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL as i64),
        ("IBV_EVENT_PORT_ACTIVE", IBV_EVENT_PORT_ACTIVE as i64),
        ("IBV_EVENT_PORT_ERR", IBV_EVENT_PORT_ERR as i64),
        ("IBV_EVENT_LID_CHANGE", IBV_EVENT_LID_CHANGE as i64),
        ("IBV_EVENT_PKEY_CHANGE", IBV_EVENT_PKEY_CHANGE as i64),
        ("IBV_EVENT_SM_CHANGE", IBV_EVENT_SM_CHANGE as i64),
        (
            "IBV_EVENT_SRQ_LIMIT_REACHED",
            IBV_EVENT_SRQ_LIMIT_REACHED as i64,
        ),
        ("IBV_SRQ_MAX_WR", IBV_SRQ_MAX_WR as i64),
        ("IBV_SRQ_LIMIT", IBV_SRQ_LIMIT as i64),
        ("(long)IBV_ACCESS_LOCAL_WRITE", 1),
        ("(long)IBV_ACCESS_REMOTE_WRITE", 2),
        ("(long)IBV_ACCESS_REMOTE_READ", 4),
        ("(long)IBV_ACCESS_REMOTE_ATOMIC", 8),
        ("(long)IBV_ACCESS_MW_BIND", 16),
        ("(long)IBV_ACCESS_ZERO_BASED", 32),
    ]
};
