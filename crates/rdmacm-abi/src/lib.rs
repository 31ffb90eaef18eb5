//! librdmacm for the NIC daemon: a shared library with rdma-core's
//! `librdmacm.so.1` ABI (its SONAME and symbol versions), so Debian's
//! own RDMA CM programs, unmodified, connect over the soft RoCE NIC of
//! `nicd`: `rping`, perftest's `-R` (`ib_write_bw -R`, `ib_send_bw -R`),
//! fio's `rdma` engine. It is used beside crates/ibverbs-abi's
//! `libibverbs.so.1`, both found through one `LD_LIBRARY_PATH` (a
//! directory holding `librdmacm.so.1` and `libibverbs.so.1`, copies or
//! links of `librdmacm_abi.so` and `libibverbs_abi.so`).
//!
//! This library is only librdmacm's face: each function, under its
//! rdma-core name and version, calls the function of the same name that
//! `libibverbs.so.1` exports as `ibverbs_abi_<name>`
//! (`ibverbs_abi::rdmacm`, where the connection manager is). So an id's
//! `verbs`, `qp` and `pd` are that library's contexts, QPs and PDs, and
//! there is one connection to the daemon per process. The names are
//! bound by the dynamic linker when this library loads: with another
//! libibverbs (rdma-core's) found first, loading fails naming the
//! missing `ibverbs_abi_*` symbol, rather than mixing two libraries'
//! objects.
//!
//! Covered: rdma-core 44.0 (Debian bookworm), x86_64: event channels
//! (a descriptor the application may poll or make non-blocking),
//! `rdma_create_id` (`RDMA_PS_TCP`) / `rdma_destroy_id`,
//! `rdma_bind_addr`, `rdma_resolve_addr` / `rdma_resolve_route` (an IP
//! address to the daemon's CA with that address's GID, RoCE v2),
//! `rdma_create_qp` / `rdma_create_qp_ex` (RC, the application's CQs) /
//! `rdma_destroy_qp`, `rdma_connect` / `rdma_listen` / `rdma_accept` /
//! `rdma_reject` / `rdma_disconnect` with private data, `rdma_get_cm_event`
//! / `rdma_ack_cm_event`, `rdma_event_str`, `rdma_set_option` (taken,
//! without effect), `rdma_get_devices` / `rdma_free_devices`,
//! `rdma_get_src_port` / `rdma_get_dst_port`, an id without a QP (the
//! application's own, `param->qp_num`: `CONNECT_RESPONSE`,
//! `rdma_init_qp_attr`, `rdma_establish`), `rdma_getaddrinfo` /
//! `rdma_freeaddrinfo`, and rsocket's `rpoll` / `rselect` (plain
//! `poll`/`select`: there are no rsockets). The connections are Linux
//! rdma_cm's (service ID from the TCP port, `cma_hdr`), so the peer may be
//! Linux, our own tools (`rrping`, `rperftest`) or another program on
//! this library.
//!
//! Refused with -1 and `ENOSYS`: endpoints (`rdma_create_ep`), SRQs on
//! ids, `rdma_get_request`, multicast, `rdma_migrate_id`, `rdma_notify`,
//! ECE; with `EOPNOTSUPP`: the UDP, IB and IPoIB port spaces, an
//! id without a channel, a QP without CQs or other than RC, the extended
//! QP (`rdma_create_qp_ex` with more than a PD). The rest of rsocket
//! (`rsocket`, `rsend`, ...) is not exported.

#![allow(clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_int, c_void};

type P = *mut c_void;

/// Each function under its rdma-core name and version (`.symver`, with
/// the version script `build.rs` writes from this list), calling
/// `ibverbs_abi_<name>` of libibverbs.so.1. Each is also exported as
/// `rdmacm_abi_<name>` (a function rustc does not export is local, and
/// so would its versioned name be).
macro_rules! forward {
    ($(fn $f:ident($($a:ident: $t:ty),*) $(-> $r:ty)? => $v:literal;)*) => {
        $(
            #[export_name = concat!("rdmacm_abi_", stringify!($f))]
            pub unsafe extern "C" fn $f($($a: $t),*) $(-> $r)? {
                extern "C" {
                    #[link_name = concat!("ibverbs_abi_", stringify!($f))]
                    fn target($($a: $t),*) $(-> $r)?;
                }
                // SAFETY: the same function, with the caller's contract.
                unsafe { target($($a),*) }
            }
        )*
        std::arch::global_asm!(
            $(concat!(".symver {", stringify!($f), "}, ", stringify!($f), "@@", $v),)*
            $($f = sym $f,)*
        );
        /// The exported names and versions.
        pub const EXPORTS: &[(&str, &str)] = &[$((stringify!($f), $v)),*];
    };
}

forward! {
fn rdma_create_event_channel() -> P => "RDMACM_1.0";
fn rdma_destroy_event_channel(ch: P) => "RDMACM_1.0";
fn rdma_get_cm_event(ch: P, event: *mut P) -> c_int => "RDMACM_1.0";
fn rdma_ack_cm_event(event: P) -> c_int => "RDMACM_1.0";
fn rdma_event_str(event: c_int) -> *const c_char => "RDMACM_1.0";
fn rdma_create_id(ch: P, id: *mut P, context: P, ps: c_int) -> c_int => "RDMACM_1.0";
fn rdma_destroy_id(id: P) -> c_int => "RDMACM_1.0";
fn rdma_set_option(id: P, level: c_int, name: c_int, val: P, len: usize) -> c_int => "RDMACM_1.0";
fn rdma_bind_addr(id: P, addr: P) -> c_int => "RDMACM_1.0";
fn rdma_resolve_addr(id: P, src: P, dst: P, timeout_ms: c_int) -> c_int => "RDMACM_1.0";
fn rdma_resolve_route(id: P, timeout_ms: c_int) -> c_int => "RDMACM_1.0";
fn rdma_get_src_port(id: P) -> u16 => "RDMACM_1.0";
fn rdma_get_dst_port(id: P) -> u16 => "RDMACM_1.0";
fn rdma_create_qp(id: P, pd: P, attr: P) -> c_int => "RDMACM_1.0";
fn rdma_create_qp_ex(id: P, attr: P) -> c_int => "RDMACM_1.0";
fn rdma_destroy_qp(id: P) => "RDMACM_1.0";
fn rdma_connect(id: P, param: P) -> c_int => "RDMACM_1.0";
fn rdma_listen(id: P, backlog: c_int) -> c_int => "RDMACM_1.0";
fn rdma_accept(id: P, param: P) -> c_int => "RDMACM_1.0";
fn rdma_reject(id: P, data: *const c_void, len: u8) -> c_int => "RDMACM_1.0";
fn rdma_disconnect(id: P) -> c_int => "RDMACM_1.0";
fn rdma_get_devices(num: *mut c_int) -> *mut P => "RDMACM_1.0";
fn rdma_free_devices(list: *mut P) => "RDMACM_1.0";
fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: P, res: *mut P) -> c_int => "RDMACM_1.0";
fn rdma_freeaddrinfo(res: P) => "RDMACM_1.0";
fn rpoll(fds: P, nfds: u64, timeout: c_int) -> c_int => "RDMACM_1.0";
fn rselect(nfds: c_int, r: P, w: P, e: P, t: P) -> c_int => "RDMACM_1.0";
fn rdma_create_ep(id: *mut P, res: P, pd: P, attr: P) -> c_int => "RDMACM_1.0";
fn rdma_destroy_ep(id: P) => "RDMACM_1.0";
fn rdma_create_srq(id: P, pd: P, attr: P) -> c_int => "RDMACM_1.0";
fn rdma_create_srq_ex(id: P, attr: P) -> c_int => "RDMACM_1.0";
fn rdma_destroy_srq(id: P) => "RDMACM_1.0";
fn rdma_get_request(listen: P, id: *mut P) -> c_int => "RDMACM_1.0";
fn rdma_join_multicast(id: P, addr: P, context: P) -> c_int => "RDMACM_1.0";
fn rdma_leave_multicast(id: P, addr: P) -> c_int => "RDMACM_1.0";
fn rdma_migrate_id(id: P, ch: P) -> c_int => "RDMACM_1.0";
fn rdma_notify(id: P, event: c_int) -> c_int => "RDMACM_1.0";
fn rdma_join_multicast_ex(id: P, attr: P, context: P) -> c_int => "RDMACM_1.1";
fn rdma_establish(id: P) -> c_int => "RDMACM_1.2";
fn rdma_init_qp_attr(id: P, attr: P, mask: *mut c_int) -> c_int => "RDMACM_1.2";
fn rdma_get_remote_ece(id: P, ece: P) -> c_int => "RDMACM_1.3";
fn rdma_reject_ece(id: P, data: *const c_void, len: u8) -> c_int => "RDMACM_1.3";
fn rdma_set_local_ece(id: P, ece: P) -> c_int => "RDMACM_1.3";
}
