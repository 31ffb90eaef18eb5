//! What rdma-core's other libraries import from libibverbs beyond the
//! verbs applications call: librdmacm (`ibv_copy_*_from_kern`,
//! `ibv_get_sysfs_path`, ECE, ...) and the provider libraries perftest
//! links directly (libmlx5, libefa: the `IBVERBS_PRIVATE_34` interface
//! between libibverbs and its drivers). Those libraries bind every
//! symbol when they load (`-z now`), so each must exist for perftest to
//! start at all; none of them is a driver of our devices, so the driver
//! interface is never reached here: each of its functions refuses
//! (`EOPNOTSUPP` in `errno` and as an `int` result, or NULL) or does
//! nothing. The few a consumer may call on our devices do their work.
//!
//! # Safety (of every function here)
//! As in `exports`: the caller keeps libibverbs' contract (pointers valid
//! for what rdma-core's headers say, objects of this library). The
//! refusing and ignoring ones touch nothing they are given.

#![allow(clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::AtomicBool;

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Driver-interface functions returning an `int`: `EOPNOTSUPP`.
macro_rules! refuse_int {
    ($($f:ident),* $(,)?) => {$(
        #[export_name = concat!("ibverbs_abi_", stringify!($f))]
        pub unsafe extern "C" fn $f() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

/// Driver-interface functions returning nothing: nothing done.
macro_rules! ignore {
    ($($f:ident),* $(,)?) => {$(
        #[export_name = concat!("ibverbs_abi_", stringify!($f))]
        pub unsafe extern "C" fn $f() {}
    )*};
}

refuse_int!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    verbs_open_device,
    ibv_resolve_eth_l2_from_gid,
    ibv_set_ece,
    ibv_query_ece,
);

ignore!(
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_uninit_context,
    verbs_init_cq,
    __verbs_log,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_path_rec_from_kern,
);

/// A driver's context allocation: none here (NULL, `EOPNOTSUPP`).
#[export_name = "ibverbs_abi__verbs_init_and_alloc_context"]
pub unsafe extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// The driver-interface flag drivers may set; nothing reads it here.
#[allow(non_upper_case_globals)]
#[export_name = "ibverbs_abi_verbs_allow_disassociate_destroy"]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// Where libibverbs looks for sysfs: there is none behind our devices,
/// but librdmacm asks.
#[export_name = "ibverbs_abi_ibv_get_sysfs_path"]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `madvise(MADV_DONTFORK)` over the pages of a range, as libibverbs.
#[export_name = "ibverbs_abi_ibv_dontfork_range"]
pub unsafe extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    advise(base, size, libc::MADV_DONTFORK)
}

/// `madvise(MADV_DOFORK)` over the pages of a range, as libibverbs.
#[export_name = "ibverbs_abi_ibv_dofork_range"]
pub unsafe extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    advise(base, size, libc::MADV_DOFORK)
}

fn advise(base: *mut c_void, size: usize, advice: c_int) -> c_int {
    let Some((lo, hi)) = crate::mr::page_span(base as u64, size as u64) else {
        return libc::EINVAL;
    };
    // SAFETY: advice on whole pages of the caller's range; it changes
    // what a fork inherits, never the memory.
    if unsafe { libc::madvise(lo as *mut c_void, (hi - lo) as usize, advice) } != 0 {
        return std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
    }
    0
}

/// A device's index (its place in our list: `nicd0` is 0).
#[export_name = "ibverbs_abi_ibv_get_device_index"]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut crate::abi::ibv_device) -> c_int {
    crate::objects::device_index(dev).map_or(-1, |i| i as c_int)
}

/// The index of P_Key `pkey` (network order) in a port's table, or -1.
#[export_name = "ibverbs_abi_ibv_get_pkey_index"]
pub unsafe extern "C" fn ibv_get_pkey_index(
    c: *mut crate::abi::ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    // SAFETY: a context of ours (the caller's contract).
    let ctx = unsafe { crate::objects::Context::of(c) };
    let want = u16::from_be(pkey);
    match ctx.provider.query_port(ctx.ca, rdma_types::PortNum(port)) {
        Ok(p) => p
            .pkeys
            .iter()
            .position(|k| k.0 == want)
            .map_or(-1, |i| i as c_int),
        Err(_) => -1,
    }
}

symbols! {
    ibv_get_device_index @ "IBVERBS_1.9",
    ibv_get_pkey_index @ "IBVERBS_1.5",
    ibv_get_sysfs_path @ "IBVERBS_1.0",
    ibv_dontfork_range @ "IBVERBS_1.1",
    ibv_dofork_range @ "IBVERBS_1.1",
    ibv_copy_ah_attr_from_kern @ "IBVERBS_1.1",
    ibv_copy_qp_attr_from_kern @ "IBVERBS_1.0",
    ibv_copy_path_rec_from_kern @ "IBVERBS_1.0",
    ibv_resolve_eth_l2_from_gid @ "IBVERBS_1.1",
    ibv_set_ece @ "IBVERBS_1.10",
    ibv_query_ece @ "IBVERBS_1.10",
    execute_ioctl @ "IBVERBS_PRIVATE_34",
    ibv_cmd_advise_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_dm @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_mw @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_pd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_attach_mcast @ "IBVERBS_PRIVATE_34",
    ibv_cmd_close_xrcd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_ah @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_cq_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_flow @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_flow_action_esp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_qp_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_qp_ex2 @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_rwq_ind_table @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_srq_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dealloc_mw @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dealloc_pd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dereg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_ah @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_cq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_flow @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_flow_action @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_rwq_ind_table @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_detach_mcast @ "IBVERBS_PRIVATE_34",
    ibv_cmd_free_dm @ "IBVERBS_PRIVATE_34",
    ibv_cmd_get_context @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_cq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_flow_action_esp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_qp_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_open_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_open_xrcd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_context @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_device_any @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_port @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_read_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_dm_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_dmabuf_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_rereg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_resize_cq @ "IBVERBS_PRIVATE_34",
    verbs_open_device @ "IBVERBS_PRIVATE_34",
    verbs_register_driver_34 @ "IBVERBS_PRIVATE_34",
    verbs_set_ops @ "IBVERBS_PRIVATE_34",
    verbs_uninit_context @ "IBVERBS_PRIVATE_34",
    verbs_init_cq @ "IBVERBS_PRIVATE_34",
    __verbs_log @ "IBVERBS_PRIVATE_34",
    _verbs_init_and_alloc_context @ "IBVERBS_PRIVATE_34",
    verbs_allow_disassociate_destroy @ "IBVERBS_PRIVATE_34",
}
