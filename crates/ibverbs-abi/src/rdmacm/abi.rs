//! The structs and constants of librdmacm's public header as this
//! library lays them out: rdma-core's `<rdma/rdma_cma.h>` (Debian
//! bookworm's rdma-core 44.0, librdmacm-dev), with the `ibv_sa_path_rec`
//! of `<infiniband/sa.h>` it includes, x86_64. The test `header_layout`
//! of crates/rdmacm-abi compiles a C program against Debian's header and
//! compares every size, offset and constant here ([`LAYOUT`],
//! [`CONSTANTS`]).

#![allow(non_camel_case_types)]

use crate::abi::{ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp};
use crate::abi::{ibv_qp_cap, ibv_srq};
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int, c_void};

/// `struct rdma_event_channel`: the descriptor the application polls.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    /// Big-endian.
    pub pkey: u16,
}

/// `struct rdma_addr`: the unions of socket addresses as their largest
/// member, `sockaddr_storage`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: libc::sockaddr_storage,
    pub dst: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// The head of `struct ibv_qp_init_attr_ex` (`<infiniband/verbs.h>`) up
/// to `pd`: what `rdma_create_qp_ex` reads (it refuses every other
/// `comp_mask` bit, so the fields after `pd` are never read).
#[repr(C)]
pub struct ibv_qp_init_attr_ex_head {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
}

/// The header's constants.
pub mod consts {
    use std::os::raw::c_int;

    pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
    pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
    pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
    pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
    pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
    pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
    pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
    pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
    pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
    pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
    pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
    pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
    pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_int = 12;
    pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_int = 13;
    pub const RDMA_CM_EVENT_ADDR_CHANGE: c_int = 14;
    pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

    pub const RDMA_PS_IPOIB: c_int = 0x0002;
    pub const RDMA_PS_TCP: c_int = 0x0106;
    pub const RDMA_PS_UDP: c_int = 0x0111;
    pub const RDMA_PS_IB: c_int = 0x013f;

    pub const RAI_PASSIVE: c_int = 1;
    pub const RAI_NUMERICHOST: c_int = 2;
    pub const RAI_NOROUTE: c_int = 4;
    pub const RAI_FAMILY: c_int = 8;

    pub const RDMA_OPTION_ID: c_int = 0;
    pub const RDMA_OPTION_IB: c_int = 1;
    pub const RDMA_OPTION_ID_TOS: c_int = 0;
    pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
    pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
    pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

    /// `IBV_QP_INIT_ATTR_PD` of `enum ibv_qp_init_attr_mask`.
    pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
}

/// The event names `rdma_event_str` answers, by event number (rdma-core's
/// words: the enum's names).
pub const EVENT_NAMES: [&str; 16] = [
    "RDMA_CM_EVENT_ADDR_RESOLVED",
    "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST",
    "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",
    "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",
    "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",
    "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",
    "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

macro_rules! layout {
    ($($t:ident { $($f:ident),* $(,)? })*) => {
        &[$(
            (concat!("sizeof(struct ", stringify!($t), ")"), size_of::<$t>()),
            $((concat!("offsetof(struct ", stringify!($t), ", ", stringify!($f), ")"),
               offset_of!($t, $f)),)*
        )*]
    };
}

/// Every size and offset of the structs here: `(C expression, value
/// here)`, compared with Debian's header by crates/rdmacm-abi's test.
pub const LAYOUT: &[(&str, usize)] = {
    let v: &[(&str, usize)] = layout! {
        rdma_event_channel { fd }
        rdma_ib_addr { sgid, dgid, pkey }
        ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference
        }
        rdma_route { addr, path_rec, num_paths }
        rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
            send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type
        }
        rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, srq, qp_num
        }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len,
            ai_route, ai_connect_len, ai_connect, ai_next
        }
    };
    v
};

/// [`LAYOUT`] and the offsets of the unions' members, which `layout!`
/// cannot name.
pub fn layout() -> Vec<(&'static str, usize)> {
    type ibv_qp_init_attr_ex = ibv_qp_init_attr_ex_head;
    let mut v = LAYOUT.to_vec();
    v.extend_from_slice(&[
        (
            "offsetof(struct ibv_qp_init_attr_ex, cap)",
            offset_of!(ibv_qp_init_attr_ex, cap),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, qp_type)",
            offset_of!(ibv_qp_init_attr_ex, qp_type),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, comp_mask)",
            offset_of!(ibv_qp_init_attr_ex, comp_mask),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, pd)",
            offset_of!(ibv_qp_init_attr_ex, pd),
        ),
        (
            "offsetof(struct rdma_addr, dst_addr)",
            offset_of!(rdma_addr, dst),
        ),
        (
            "offsetof(struct rdma_addr, addr.ibaddr)",
            offset_of!(rdma_addr, ibaddr),
        ),
        ("sizeof(struct rdma_addr)", size_of::<rdma_addr>()),
        (
            "offsetof(struct rdma_cm_event, param.conn.private_data_len)",
            offset_of!(rdma_cm_event, param) + offset_of!(rdma_conn_param, private_data_len),
        ),
    ]);
    v
}

/// The constants: `(C name, value here)`.
pub const CONSTANTS: &[(&str, i64)] = {
    use consts::*;
    macro_rules! c {
        ($($n:ident),* $(,)?) => { &[$((stringify!($n), $n as i64)),*] };
    }
    c![
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RAI_PASSIVE,
        RAI_NUMERICHOST,
        RAI_NOROUTE,
        RAI_FAMILY,
        RDMA_OPTION_ID,
        RDMA_OPTION_IB,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY,
        RDMA_OPTION_ID_ACK_TIMEOUT,
        IBV_QP_INIT_ATTR_PD,
    ]
};
