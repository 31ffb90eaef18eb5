//! The stable libibverbs ABI, written by hand from rdma-core's
//! `libibverbs/verbs.h` (the layouts have not changed since rdma-core 17;
//! the offsets asserted at the bottom were printed by a C program compiled
//! against rdma-core 44's header on x86_64, except the memory window ones
//! (`ibv_mw`, `ibv_mw_bind`, the send WR's `bind_mw`, the ops slots),
//! worked out by hand from the header's declarations and C's alignment
//! rules; the scenario `rdmacore-conformance-ours` exercises them).
//!
//! Only what this crate uses is declared. Structs the library allocates
//! (`ibv_context`, `ibv_cq`, `ibv_qp`, ...) are declared up to the last
//! field read here and never built or moved by Rust; structs passed in
//! (attributes, work requests) are declared whole.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `union ibv_gid`: 16 bytes, network order, aligned as its other member
/// (two `__be64`), which makes `ibv_ah_attr` and `ibv_qp_attr` 8-aligned.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (rdma-core 32+, `ibv_query_gid_table`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    /// `enum ibv_gid_type`: IB (0), RoCE v1 (1), RoCE v2 (2).
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

/// `struct ibv_device`, the fields after the two private function pointers.
#[repr(C)]
pub struct ibv_device {
    _ops: [*mut c_void; 2],
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
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: what `verbs.h`'s inline functions call
/// through (`ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`,
/// `ibv_post_recv`, `ibv_post_srq_recv`, and the window verbs
/// `ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`). 32 pointers; the
/// `_compat_*` slots are never called. libibverbs fills every slot it
/// calls with a stub answering `EOPNOTSUPP` when the driver has no such
/// verb.
#[repr(C)]
pub struct ibv_context_ops {
    _compat_query_device: *mut c_void,
    _compat_query_port: *mut c_void,
    _compat_alloc_pd: *mut c_void,
    _compat_dealloc_pd: *mut c_void,
    _compat_reg_mr: *mut c_void,
    _compat_rereg_mr: *mut c_void,
    _compat_dereg_mr: *mut c_void,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    _compat_cq_event: *mut c_void,
    _compat_resize_cq: *mut c_void,
    _compat_destroy_cq: *mut c_void,
    _compat_create_srq: *mut c_void,
    _compat_modify_srq: *mut c_void,
    _compat_query_srq: *mut c_void,
    _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    _compat_create_qp: *mut c_void,
    _compat_query_qp: *mut c_void,
    _compat_modify_qp: *mut c_void,
    _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    _compat_create_ah: *mut c_void,
    _compat_destroy_ah: *mut c_void,
    _compat_attach_mcast: *mut c_void,
    _compat_detach_mcast: *mut c_void,
    _compat_async_event: *mut c_void,
}

/// `struct ibv_context`, up to `num_comp_vectors`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// Network order.
    pub node_guid: u64,
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
    /// `enum ibv_atomic_cap`: none (0), HCA (1), global (2).
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

impl Default for ibv_device_attr {
    fn default() -> Self {
        ibv_device_attr {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 0,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

/// `enum ibv_device_cap_flags`: the bits of `device_cap_flags` read here.
pub mod device_cap {
    /// Type 1 memory windows.
    pub const MEM_WINDOW: u32 = 1 << 17;
    /// Type 2A windows (associated with a QP, any QP of the PD binds).
    pub const MEM_WINDOW_TYPE_2A: u32 = 1 << 23;
    /// Type 2B windows (associated with the QP that bound them).
    pub const MEM_WINDOW_TYPE_2B: u32 = 1 << 24;
}

/// `struct ibv_port_attr` (whole, 52 bytes). The exported
/// `ibv_query_port@@IBVERBS_1.1` fills the fields up to `link_layer` (its
/// `_compat_ibv_port_attr`); the rest stays as the caller zeroed it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: c_int,
    /// `enum ibv_mtu` (1..=5).
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

pub const IBV_PORT_INIT: c_int = 2;
pub const IBV_PORT_ARMED: c_int = 3;
pub const IBV_PORT_ACTIVE: c_int = 4;
pub const IBV_PORT_ACTIVE_DEFER: c_int = 5;

/// `enum ibv_event_type`.
pub mod event {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const PATH_MIG: u32 = 6;
    pub const PATH_MIG_ERR: u32 = 7;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const LID_CHANGE: u32 = 11;
    pub const PKEY_CHANGE: u32 = 12;
    pub const SM_CHANGE: u32 = 13;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
    pub const CLIENT_REREGISTER: u32 = 17;
    pub const GID_CHANGE: u32 = 18;
}

/// The `element` union of `struct ibv_async_event`: the object an
/// affiliated event is about, or the port of a port event.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_event_element {
    pub ptr: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    pub element: ibv_event_element,
    pub event_type: u32,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`, by `wc_flags`.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `enum ibv_wc_opcode`.
pub mod wc_opcode {
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const BIND_MW: u32 = 5;
    pub const LOCAL_INV: u32 = 6;
    pub const RECV: u32 = 1 << 7;
    pub const RECV_RDMA_WITH_IMM: u32 = RECV + 1;
}

/// `enum ibv_wc_flags`.
pub const IBV_WC_GRH: u32 = 1 << 0;
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
pub const IBV_WC_WITH_INV: u32 = 1 << 3;

/// `struct ibv_pd`, its first field.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
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

/// `enum ibv_mw_type`.
pub const IBV_MW_TYPE_1: u32 = 1;
pub const IBV_MW_TYPE_2: u32 = 2;

/// `struct ibv_mw`: its R_Key is the one the next bind starts from (the
/// library updates it for a type 1 bind; the owner for a type 2 bind WR).
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub mw_type: u32,
}

/// `struct ibv_mw_bind_info`: what a window is bound to.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    /// `IBV_ACCESS_*`.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`: a type 1 bind (`ibv_bind_mw`).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    /// `IBV_SEND_*`.
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_ah`, opaque.
#[repr(C)]
pub struct ibv_ah {
    _context: *mut ibv_context,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
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

/// `enum ibv_srq_attr_mask`.
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

/// `struct ibv_srq`, up to `srq_context`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`, up to `cqe`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
}

/// `enum ibv_qp_type`.
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
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
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp`, up to `qp_type`.
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
    pub state: u32,
    pub qp_type: u32,
}

/// `enum ibv_qp_state`.
pub mod qp_state {
    pub const RESET: u32 = 0;
    pub const INIT: u32 = 1;
    pub const RTR: u32 = 2;
    pub const RTS: u32 = 3;
    pub const SQD: u32 = 4;
    pub const SQE: u32 = 5;
    pub const ERR: u32 = 6;
}

/// `enum ibv_qp_attr_mask`.
pub mod qp_mask {
    pub const STATE: i32 = 1 << 0;
    pub const EN_SQD_ASYNC_NOTIFY: i32 = 1 << 2;
    pub const ACCESS_FLAGS: i32 = 1 << 3;
    pub const PKEY_INDEX: i32 = 1 << 4;
    pub const PORT: i32 = 1 << 5;
    pub const QKEY: i32 = 1 << 6;
    pub const AV: i32 = 1 << 7;
    pub const PATH_MTU: i32 = 1 << 8;
    pub const TIMEOUT: i32 = 1 << 9;
    pub const RETRY_CNT: i32 = 1 << 10;
    pub const RNR_RETRY: i32 = 1 << 11;
    pub const RQ_PSN: i32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: i32 = 1 << 13;
    pub const MIN_RNR_TIMER: i32 = 1 << 15;
    pub const SQ_PSN: i32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: i32 = 1 << 17;
    pub const DEST_QPN: i32 = 1 << 20;
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `enum ibv_wr_opcode`.
pub mod wr_opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
}

/// `enum ibv_send_flags`.
pub const IBV_SEND_FENCE: u32 = 1 << 0;
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
pub const IBV_SEND_SOLICITED: u32 = 1 << 2;
pub const IBV_SEND_INLINE: u32 = 1 << 3;

/// The `wr` union of `struct ibv_send_wr` as its largest member, the
/// atomic one: `rdma` is (remote_addr, rkey at offset 8), `ud` is (ah,
/// remote_qpn at 8, remote_qkey at 12), written through the accessors of
/// [`ibv_send_wr`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct wr_union {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u32,
}

/// The `bind_mw` member of the union that ends `struct ibv_send_wr` (the
/// other, `tso`, is never used here): a type 2 bind.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wr_bind_mw {
    pub mw: *mut ibv_mw,
    /// The window's new R_Key.
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_or_inv: u32,
    pub wr: wr_union,
    /// `qp_type.xrc.remote_srqn`.
    pub xrc_remote_srqn: u32,
    pub bind_mw: wr_bind_mw,
}

impl ibv_send_wr {
    /// A zeroed WR.
    pub fn zeroed() -> ibv_send_wr {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_or_inv: 0,
            wr: wr_union::default(),
            xrc_remote_srqn: 0,
            bind_mw: wr_bind_mw {
                mw: std::ptr::null_mut(),
                rkey: 0,
                bind_info: ibv_mw_bind_info {
                    mr: std::ptr::null_mut(),
                    addr: 0,
                    length: 0,
                    mw_access_flags: 0,
                },
            },
        }
    }

    /// `wr.rdma`.
    pub fn set_rdma(&mut self, remote_addr: u64, rkey: u32) {
        self.wr.a = remote_addr;
        self.wr.b = halves(rkey, 0);
    }

    /// `wr.atomic`.
    pub fn set_atomic(&mut self, remote_addr: u64, compare_add: u64, swap: u64, rkey: u32) {
        self.wr = wr_union {
            a: remote_addr,
            b: compare_add,
            c: swap,
            d: rkey,
        };
    }

    /// `wr.ud`: the AH pointer, then remote QPN and Q_Key as two `u32` in
    /// the next eight bytes.
    pub fn set_ud(&mut self, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
        self.wr.a = ah as u64;
        self.wr.b = halves(remote_qpn, remote_qkey);
    }
}

/// The eight bytes of two `u32` fields laid out one after the other.
fn halves(first: u32, second: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&first.to_ne_bytes());
    b[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

// The layouts above, as rdma-core 44's verbs.h has them on 64-bit Linux
// (sizes and offsets printed by a C program with `offsetof`).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ibv_device, node_type) == 16);
    assert!(offset_of!(ibv_device, name) == 24);
    assert!(size_of::<ibv_device>() == 664);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv) == 168);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, async_fd) == 268);
    assert!(offset_of!(ibv_context, num_comp_vectors) == 272);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, node_guid) == 64);
    assert!(offset_of!(ibv_device_attr, max_qp) == 108);
    assert!(offset_of!(ibv_device_attr, atomic_cap) == 164);
    assert!(offset_of!(ibv_device_attr, max_srq) == 212);
    assert!(offset_of!(ibv_device_attr, max_pkeys) == 224);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_port_attr, pkey_tbl_len) == 32);
    assert!(offset_of!(ibv_port_attr, lid) == 34);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, imm_or_inv) == 24);
    assert!(offset_of!(ibv_wc, qp_num) == 28);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(offset_of!(ibv_wc, pkey_index) == 40);
    assert!(offset_of!(ibv_wc, slid) == 42);
    assert!(offset_of!(ibv_wc, sl) == 44);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, num_sge) == 24);
    assert!(offset_of!(ibv_send_wr, opcode) == 28);
    assert!(offset_of!(ibv_send_wr, send_flags) == 32);
    assert!(offset_of!(ibv_send_wr, imm_or_inv) == 36);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, wr) + offset_of!(wr_union, d) == 64);
    assert!(offset_of!(ibv_send_wr, xrc_remote_srqn) == 72);
    assert!(offset_of!(ibv_send_wr, bind_mw) == 80);
    assert!(offset_of!(ibv_send_wr, bind_mw) + offset_of!(wr_bind_mw, rkey) == 88);
    assert!(offset_of!(ibv_send_wr, bind_mw) + offset_of!(wr_bind_mw, bind_info) == 96);
    assert!(size_of::<ibv_mw_bind_info>() == 32);
    assert!(offset_of!(ibv_mw_bind_info, mw_access_flags) == 24);
    assert!(size_of::<ibv_mw_bind>() == 48);
    assert!(offset_of!(ibv_mw_bind, bind_info) == 16);
    assert!(offset_of!(ibv_mw, rkey) == 16);
    assert!(offset_of!(ibv_mw, mw_type) == 24);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, alloc_mw) == 64);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, dealloc_mw) == 80);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(ibv_qp_init_attr, cap) == 32);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(offset_of!(ibv_qp_init_attr, sq_sig_all) == 56);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, cap) == 36);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, alt_ah_attr) == 88);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, en_sqd_async_notify) == 124);
    assert!(offset_of!(ibv_qp_attr, rnr_retry) == 132);
    assert!(offset_of!(ibv_qp_attr, alt_timeout) == 134);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(offset_of!(ibv_ah_attr, dlid) == 24);
    assert!(offset_of!(ibv_ah_attr, port_num) == 30);
    assert!(size_of::<ibv_global_route>() == 24);
    assert!(std::mem::align_of::<ibv_qp_attr>() == 8);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_srq_attr>() == 12);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(offset_of!(ibv_async_event, event_type) == 8);
    assert!(offset_of!(ibv_cq, channel) == 8);
    assert!(offset_of!(ibv_cq, cq_context) == 16);
    assert!(offset_of!(ibv_cq, cqe) == 28);
    assert!(offset_of!(ibv_qp, qp_context) == 8);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_qp, state) == 56);
    assert!(offset_of!(ibv_srq, srq_context) == 8);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(offset_of!(ibv_mr, rkey) == 40);
    assert!(offset_of!(ibv_comp_channel, fd) == 8);
};
