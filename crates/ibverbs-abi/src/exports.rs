//! The exported functions, under the names and versions of rdma-core's
//! libibverbs (`symbols!` at the bottom binds each to its
//! `name@@VERSION`; `exports.map` defines the versions).
//!
//! Conventions of libibverbs kept here: a verb returning `int` answers 0
//! or an errno (`ibv_query_gid`, `ibv_query_pkey` and the event reads -1
//! with `errno` set, `ibv_poll_cq` a negative count); one returning a
//! pointer answers NULL with `errno` set. Every body runs under
//! `catch_unwind`: a bug here fails the call (`EIO`), never unwinds into
//! C.
//!
//! # Safety (of every function here)
//! The caller (a C program) keeps libibverbs' contract: every pointer is
//! NULL where allowed or valid for what the header says, and objects are
//! those this library made and has not destroyed. (The functions are
//! `pub` so that they keep external linkage, which `.symver` needs; each
//! shares this one contract.)

#![allow(clippy::missing_safety_doc)]

use crate::abi::consts::*;
use crate::abi::*;
use crate::mr;
use crate::objects::*;
use rdma_types::{
    AccessFlags, Gid, Lid, Lkey, Mtu, PortNum, Psn, Qkey, QpState, QpType, Qpn, Rkey, WcOpcode,
    WcStatus,
};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};
use verbs::{
    AhAttr, CqInit, MemBuf, QpAttr, QpCaps, QpInit, RecvWr, SendFlags, SendOpcode, SendWr, Sge,
    SrqAttr, UdDest, VerbsError, WcFlags, WorkCompletion,
};

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; a panic becomes `fail` (with `EIO` in errno).
fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        fail
    })
}

/// An errno result as the `int` of a verb.
fn rc(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// A pointer result: NULL and errno on failure.
fn ptr<T>(r: Result<*mut T, c_int>) -> *mut T {
    r.unwrap_or_else(|e| {
        set_errno(e);
        null_mut()
    })
}

fn verr(e: VerbsError) -> c_int {
    errno_of(&e)
}

fn boxed<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// The context of an object's `context` pointer.
///
/// # Safety
/// As [`Context::of`].
unsafe fn ctx_of<'a>(c: *mut ibv_context) -> &'a Context {
    // SAFETY: per the contract.
    unsafe { Context::of(c) }
}

// ---- devices ------------------------------------------------------------

#[export_name = "ibverbs_abi_ibv_get_device_list"]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        let guids = crate::objects::provider()
            .map(|p| p.list_cas())
            .unwrap_or_default();
        let mut list: Vec<*mut ibv_device> = guids
            .into_iter()
            .map(|g| device_of(g).cast::<ibv_device>())
            .collect();
        if !num.is_null() {
            // SAFETY: a valid `int *` per the contract.
            unsafe { *num = list.len() as c_int };
        }
        list.push(null_mut());
        Box::into_raw(list.into_boxed_slice()).cast()
    })
}

#[export_name = "ibverbs_abi_ibv_free_device_list"]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a list from `ibv_get_device_list`: NULL-terminated,
        // `n + 1` entries, allocated as a boxed slice of that length.
        unsafe {
            while !(*list.add(n)).is_null() {
                n += 1;
            }
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                list,
                n + 1,
            )));
        }
    })
}

#[export_name = "ibverbs_abi_ibv_get_device_name"]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a device of ours; its name lives as long as the process.
    unsafe { (*dev).name.as_ptr() }
}

#[export_name = "ibverbs_abi_ibv_get_device_guid"]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if dev.is_null() {
        return 0;
    }
    // SAFETY: every `ibv_device` of ours starts a `Device`.
    unsafe { (*dev.cast::<Device>()).guid.0.to_be() }
}

#[export_name = "ibverbs_abi_ibv_open_device"]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard(null_mut(), || ptr(open(dev)))
}

fn open(dev: *mut ibv_device) -> Result<*mut ibv_context, c_int> {
    if dev.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: every `ibv_device` of ours starts a `Device`.
    let guid = unsafe { (*dev.cast::<Device>()).guid };
    let p = crate::objects::provider().ok_or(libc::ENODEV)?;
    let (async_r, async_w) = pipe().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let shared = Shared::new(async_w);
    let ca = p
        .open_ca(guid, 0, Arc::new(Handler(shared.clone())))
        .map_err(verr)?;
    let cq_pd = match p.alloc_pd(ca, 0) {
        Ok(pd) => pd,
        Err(e) => {
            let _ = p.close_ca(ca);
            return Err(verr(e));
        }
    };
    let mut ops: ibv_context_ops =
        // SAFETY: all-zero is a valid `ibv_context_ops` (NULL pointers
        // and `None`s).
        unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    let c = boxed(Context {
        vctx: verbs_context {
            ops: [null_mut(); VERBS_CONTEXT_OPS],
            _abi_placeholder3: 0,
            sz: std::mem::size_of::<verbs_context>(),
            context: ibv_context {
                device: dev,
                ops,
                cmd_fd: -1,
                async_fd: async_r.as_raw_fd(),
                num_comp_vectors: 1,
                mutex: MUTEX,
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        },
        provider: p,
        ca,
        cq_pd,
        shared,
        async_r,
        live: Mutex::new(HashMap::new()),
    });
    // SAFETY: just made; the box is freed only by `ibv_close_device`.
    Ok(unsafe { &raw mut (*c).vctx.context })
}

#[export_name = "ibverbs_abi_ibv_close_device"]
pub unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        if c.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a context of ours (contract); freed here, once.
        let ctx = unsafe { Box::from_raw((ctx_of(c) as *const Context).cast_mut()) };
        // What the application left is released, children first, as the
        // kernel does when a process closes its device (perftest's
        // ib_send_bw client leaves a CQ); its structs stay allocated, in
        // case the application still reads one.
        ctx.release_leftovers();
        let _ = ctx.provider.dealloc_pd(ctx.cq_pd);
        rc(ctx.provider.close_ca(ctx.ca).map_err(verr))
    })
}

#[export_name = "ibverbs_abi_ibv_query_device"]
pub unsafe extern "C" fn ibv_query_device(c: *mut ibv_context, out: *mut ibv_device_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let a = match ctx.provider.query_ca(ctx.ca) {
            Ok(a) => a,
            Err(e) => return verr(e),
        };
        let pkeys = ctx
            .provider
            .query_port(ctx.ca, PortNum(1))
            .map(|p| p.pkeys.len())
            .unwrap_or(1);
        let i = |v: u32| v.min(c_int::MAX as u32) as c_int;
        // SAFETY: all-zero is a valid `ibv_device_attr`.
        let mut d: ibv_device_attr = unsafe { std::mem::zeroed() };
        for (dst, b) in d.fw_ver.iter_mut().zip(env!("CARGO_PKG_VERSION").bytes()) {
            *dst = b as c_char;
        }
        d.node_guid = a.guid.0.to_be();
        d.sys_image_guid = a.guid.0.to_be();
        d.max_mr_size = u64::MAX;
        d.page_size_cap = 4096;
        d.max_qp = i(a.max_qp);
        d.max_qp_wr = i(a.max_qp_wr);
        d.max_sge = i(a.max_sge);
        d.max_sge_rd = i(a.max_sge);
        d.max_cq = i(a.max_cq);
        d.max_cqe = i(a.max_cqe);
        d.max_mr = i(a.max_mr);
        d.max_pd = i(a.max_pd);
        d.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
        d.max_res_rd_atom = a.max_qp_rd_atom as c_int;
        d.max_qp_init_rd_atom = a.max_qp_rd_atom as c_int;
        d.atomic_cap = if a.atomics {
            IBV_ATOMIC_HCA
        } else {
            IBV_ATOMIC_NONE
        };
        d.max_mw = 0;
        d.max_ah = i(a.max_qp);
        d.max_srq = i(a.max_srq);
        d.max_srq_wr = i(a.max_qp_wr);
        d.max_srq_sge = i(a.max_sge);
        d.max_pkeys = pkeys.min(u16::MAX as usize) as u16;
        d.local_ca_ack_delay = 15;
        d.phys_port_cnt = a.num_ports;
        // SAFETY: a valid `ibv_device_attr *` per the contract.
        unsafe { out.write(d) };
        0
    })
}

/// The old `ibv_query_port` (IBVERBS_1.1), what the header's inline one
/// calls: fills the fields up to `link_layer` ([`COMPAT_PORT_ATTR_LEN`]).
#[export_name = "ibverbs_abi_ibv_query_port"]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let p = match ctx.provider.query_port(ctx.ca, PortNum(port)) {
            Ok(p) => p,
            Err(e) => return verr(e),
        };
        let state = match p.state {
            verbs::PortState::Down => IBV_PORT_DOWN,
            verbs::PortState::Init => IBV_PORT_INIT,
            verbs::PortState::Active => IBV_PORT_ACTIVE,
        };
        let a = ibv_port_attr {
            state,
            max_mtu: p.max_mtu.code() as c_int,
            active_mtu: p.active_mtu.code() as c_int,
            gid_tbl_len: p.gids.len() as c_int,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: p.pkeys.len().min(u16::MAX as usize) as u16,
            lid: p.lid.0,
            sm_lid: p.sm_lid.0,
            max_vl_num: 1,
            active_width: 1,
            active_speed: 1,
            // LinkUp (5) when active, else Polling (2).
            phys_state: if state == IBV_PORT_ACTIVE { 5 } else { 2 },
            // No LID: a RoCE port (the daemon's `roce` personality).
            link_layer: if p.lid.0 == 0 {
                IBV_LINK_LAYER_ETHERNET
            } else {
                1
            },
            ..Default::default()
        };
        // SAFETY: `out` has room for the old struct at least (contract);
        // `a` is a plain struct, read as its first bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const a).cast::<u8>(),
                out.cast::<u8>(),
                COMPAT_PORT_ATTR_LEN,
            )
        };
        0
    })
}

fn gid_at(ctx: &Context, port: u32, index: u32) -> Result<Gid, c_int> {
    let port = u8::try_from(port).map_err(|_| libc::EINVAL)?;
    let p = ctx
        .provider
        .query_port(ctx.ca, PortNum(port))
        .map_err(verr)?;
    p.gids.get(index as usize).copied().ok_or(libc::EINVAL)
}

#[export_name = "ibverbs_abi_ibv_query_gid"]
pub unsafe extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match u32::try_from(index)
            .map_err(|_| libc::EINVAL)
            .and_then(|i| gid_at(ctx, port as u32, i))
        {
            Ok(g) => {
                // SAFETY: a valid `union ibv_gid *` (contract).
                unsafe { gid.write(ibv_gid { raw: g.0 }) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

#[export_name = "ibverbs_abi__ibv_query_gid_ex"]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if flags != 0 {
            return libc::EINVAL;
        }
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match gid_at(ctx, port, index) {
            Ok(g) => {
                let e = ibv_gid_entry {
                    gid: ibv_gid { raw: g.0 },
                    gid_index: index,
                    port_num: port,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                };
                let n = entry_size.min(std::mem::size_of::<ibv_gid_entry>());
                // SAFETY: `entry` has `entry_size` bytes (contract).
                unsafe {
                    std::ptr::copy_nonoverlapping((&raw const e).cast::<u8>(), entry.cast(), n)
                };
                0
            }
            Err(e) => e,
        }
    })
}

/// rdma-core's private `ibv_query_gid_type` (`ibv_devinfo` uses it):
/// every GID of ours is RoCE v2.
#[export_name = "ibverbs_abi_ibv_query_gid_type"]
pub unsafe extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut u32,
) -> c_int {
    guard(-1, || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match gid_at(ctx, port as u32, index) {
            Ok(_) => {
                // SAFETY: a valid `enum ibv_gid_type_sysfs *`.
                unsafe { *ty = IBV_GID_TYPE_SYSFS_ROCE_V2 };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

#[export_name = "ibverbs_abi_ibv_query_pkey"]
pub unsafe extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let p = ctx.provider.query_port(ctx.ca, PortNum(port));
        match p.ok().and_then(|p| {
            usize::try_from(index)
                .ok()
                .and_then(|i| p.pkeys.get(i).copied())
        }) {
            Some(k) => {
                // SAFETY: a valid `__be16 *`.
                unsafe { *pkey = k.0.to_be() };
                0
            }
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

/// No sysfs behind our devices: nothing to read (what libibverbs
/// answers for a missing file).
#[export_name = "ibverbs_abi_ibv_read_sysfs_file"]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

#[export_name = "ibverbs_abi_ibv_fork_init"]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    // Registered pages are MADV_DONTFORK already (crate::mr).
    0
}

// ---- PD and MR ----------------------------------------------------------

#[export_name = "ibverbs_abi_ibv_alloc_pd"]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        ptr(ctx
            .provider
            .alloc_pd(ctx.ca, 0)
            .map_err(verr)
            .map(|handle| {
                let id = next_id();
                ctx.hold(id, Live::Pd(handle));
                boxed(Pd {
                    ibv: ibv_pd {
                        context: c,
                        handle: handle.0.index,
                    },
                    handle,
                    id,
                })
                .cast()
            }))
    })
}

#[export_name = "ibverbs_abi_ibv_dealloc_pd"]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        let p = pd.cast::<Pd>();
        // SAFETY: a PD of ours (contract).
        let (c, h, id) = unsafe { ((*p).ibv.context, (*p).handle, (*p).id) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match ctx.provider.dealloc_pd(h) {
            Ok(()) => {
                ctx.drop_held(id);
                // SAFETY: made by `ibv_alloc_pd`, freed once.
                drop(unsafe { Box::from_raw(p) });
                0
            }
            Err(e) => verr(e),
        }
    })
}

fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut ibv_mr, c_int> {
    if iova != addr as u64 {
        return Err(libc::EOPNOTSUPP);
    }
    // Optional access bits (IBV_ACCESS_OPTIONAL_RANGE, 1 << 20 on) may be
    // ignored, as libibverbs does where the kernel lacks them.
    let bits = (access as u32) & 0xfffff;
    let access = AccessFlags::from_bits(bits).ok_or(libc::EOPNOTSUPP)?;
    let p = pd.cast::<Pd>();
    // SAFETY: a PD of ours (contract).
    let (c, h) = unsafe { ((*p).ibv.context, (*p).handle) };
    // SAFETY: contract.
    let ctx = unsafe { ctx_of(c) };
    let region = mr::share(addr as u64, len as u64).map_err(|r| {
        eprintln!("libibverbs (ibverbs-abi): ibv_reg_mr: {}", r.why);
        r.errno
    })?;
    let info = match ctx
        .provider
        .reg_mr(h, &region, addr as u64, len as u64, access, 0)
    {
        Ok(i) => i,
        Err(e) => {
            mr::release(region.addr());
            return Err(verr(e));
        }
    };
    let id = next_id();
    ctx.hold(id, Live::Mr(info.handle, region.addr()));
    Ok(boxed(Mr {
        ibv: ibv_mr {
            context: c,
            pd,
            addr,
            length: len,
            handle: info.handle.0.index,
            lkey: info.lkey.0,
            rkey: info.rkey.0,
        },
        handle: info.handle,
        region,
        id,
    })
    .cast())
}

#[export_name = "ibverbs_abi_ibv_reg_mr"]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(null_mut(), || ptr(reg(pd, addr, len, addr as u64, access)))
}

#[export_name = "ibverbs_abi_ibv_reg_mr_iova"]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(null_mut(), || ptr(reg(pd, addr, len, iova, access)))
}

#[export_name = "ibverbs_abi_ibv_reg_mr_iova2"]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        ptr(reg(pd, addr, len, iova, access as c_int))
    })
}

#[export_name = "ibverbs_abi_ibv_dereg_mr"]
pub unsafe extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        let m = m.cast::<Mr>();
        // SAFETY: an MR of ours (contract).
        let (c, h, id) = unsafe { ((*m).ibv.context, (*m).handle, (*m).id) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match ctx.provider.dereg_mr(h) {
            Ok(()) => {
                ctx.drop_held(id);
                // SAFETY: made by `reg`, freed once.
                let m = unsafe { Box::from_raw(m) };
                mr::release(m.region.addr());
                0
            }
            Err(e) => verr(e),
        }
    })
}

#[export_name = "ibverbs_abi_ibv_rereg_mr"]
pub unsafe extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _len: usize,
    _access: c_int,
) -> c_int {
    libc::EOPNOTSUPP
}

pub unsafe extern "C" fn alloc_mw(_pd: *mut ibv_pd, _ty: c_uint) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

pub unsafe extern "C" fn bind_mw(_qp: *mut ibv_qp, _mw: *mut c_void, _bind: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

pub unsafe extern "C" fn dealloc_mw(_mw: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

// ---- completion channels and CQs ---------------------------------------

#[export_name = "ibverbs_abi_ibv_create_comp_channel"]
pub unsafe extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        let (r, w) = match pipe() {
            Ok(p) => p,
            Err(e) => return ptr(Err(e.raw_os_error().unwrap_or(libc::EMFILE))),
        };
        boxed(Channel {
            ibv: ibv_comp_channel {
                context: c,
                fd: r.as_raw_fd(),
                refcnt: 0,
            },
            r,
            w: Arc::new(w),
        })
        .cast()
    })
}

#[export_name = "ibverbs_abi_ibv_destroy_comp_channel"]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a channel of ours (contract).
        if unsafe { (*ch).refcnt } != 0 {
            return libc::EBUSY;
        }
        // SAFETY: made by `ibv_create_comp_channel`, freed once.
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
        0
    })
}

#[export_name = "ibverbs_abi_ibv_create_cq"]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    _vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let Ok(n) = u32::try_from(cqe) else {
            return ptr(Err(libc::EINVAL));
        };
        let id = next_id();
        let handle = match ctx.provider.create_cq(ctx.cq_pd, &CqInit { cqe: n }, id) {
            Ok(h) => h,
            Err(e) => return ptr(Err(verr(e))),
        };
        let w = if ch.is_null() {
            None
        } else {
            // SAFETY: a channel of ours (contract).
            unsafe { (*ch).refcnt += 1 };
            // SAFETY: every `ibv_comp_channel` of ours starts a `Channel`.
            Some(unsafe { (*ch.cast::<Channel>()).w.clone() })
        };
        let cq = boxed(Cq {
            ibv: ibv_cq {
                context: c,
                channel: ch,
                cq_context,
                handle: handle.0.index,
                cqe,
                mutex: MUTEX,
                cond: COND,
                comp_events_completed: 0,
                async_events_completed: 0,
            },
            handle,
            id,
        });
        lock(&ctx.shared.objs).insert(id, Obj::Cq(cq as usize, w));
        ctx.hold(id, Live::Cq(handle));
        cq.cast()
    })
}

#[export_name = "ibverbs_abi_ibv_resize_cq"]
pub unsafe extern "C" fn ibv_resize_cq(_cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    libc::EOPNOTSUPP
}

#[export_name = "ibverbs_abi_ibv_destroy_cq"]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        let q = cq.cast::<Cq>();
        // SAFETY: a CQ of ours (contract).
        let (c, h, id, ch) = unsafe { ((*q).ibv.context, (*q).handle, (*q).id, (*q).ibv.channel) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        if let Err(e) = ctx.provider.destroy_cq(h) {
            return verr(e);
        }
        ctx.drop_held(id);
        if !ch.is_null() {
            // SAFETY: the CQ's channel, alive while it counts this CQ.
            unsafe { (*ch).refcnt -= 1 };
        }
        // SAFETY: made by `ibv_create_cq`, freed once.
        drop(unsafe { Box::from_raw(q) });
        0
    })
}

#[export_name = "ibverbs_abi_ibv_get_cq_event"]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        let mut rec = [0u8; 8];
        // SAFETY: a channel of ours; `rec` has room for one record.
        let n = unsafe { libc::read((*ch).fd, rec.as_mut_ptr().cast(), rec.len()) };
        if n != rec.len() as isize {
            if n >= 0 {
                set_errno(libc::EIO);
            }
            return -1;
        }
        let q = u64::from_ne_bytes(rec) as usize as *mut ibv_cq;
        // SAFETY: a CQ of ours, alive until its events are acknowledged
        // (the application's part of the contract, as in rdma-core).
        unsafe {
            *cq = q;
            *cq_context = (*q).cq_context;
        }
        0
    })
}

#[export_name = "ibverbs_abi_ibv_ack_cq_events"]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    // SAFETY: a CQ of ours (contract).
    unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
}

pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a CQ of ours (contract).
        let (c, h) = unsafe { ((*cq).context, (*cq.cast::<Cq>()).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        rc(ctx
            .provider
            .req_notify_cq(h, solicited_only != 0)
            .map_err(verr))
    })
}

fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::BindMw => IBV_WC_BIND_MW,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// The `ibv_wc` of a completion; `qp_num` is the QP's that `qp_ctx`
/// names, 0 when it is gone.
pub(crate) fn ibv_wc_of(w: &WorkCompletion, qp_num: u32) -> ibv_wc {
    let mut flags = 0;
    let mut imm_or_inv = 0;
    if w.wc_flags.contains(WcFlags::GRH) {
        flags |= IBV_WC_GRH;
    }
    if w.wc_flags.contains(WcFlags::WITH_IMM) {
        flags |= IBV_WC_WITH_IMM;
        imm_or_inv = w.imm.to_be();
    }
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        flags |= IBV_WC_WITH_INV;
        imm_or_inv = w.invalidated_rkey.0;
    }
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: wc_opcode(w.opcode),
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_or_inv,
        qp_num,
        src_qp: w.src_qp.value(),
        wc_flags: flags,
        pkey_index: w.pkey_index,
        slid: w.slid.0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: a CQ of ours (contract).
        let (c, h) = unsafe { ((*cq).context, (*cq.cast::<Cq>()).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let want = usize::try_from(n).unwrap_or(0);
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
        let mut got = 0;
        while got < want {
            let chunk = (want - got).min(buf.len());
            let k = match ctx.provider.poll_cq(h, &mut buf[..chunk]) {
                Ok(k) => k,
                Err(_) if got > 0 => break,
                Err(_) => return -1,
            };
            let objs = lock(&ctx.shared.objs);
            for (i, w) in buf[..k].iter().enumerate() {
                let qpn = match objs.get(&w.qp_ctx) {
                    Some(Obj::Qp(_, n)) => *n,
                    _ => 0,
                };
                // SAFETY: `out` has room for `n` entries (contract).
                unsafe { out.add(got + i).write(ibv_wc_of(w, qpn)) };
            }
            got += k;
            if k < chunk {
                break;
            }
        }
        got as c_int
    })
}

// ---- SRQ ------------------------------------------------------------------

#[export_name = "ibverbs_abi_ibv_create_srq"]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(null_mut(), || {
        let p = pd.cast::<Pd>();
        // SAFETY: a PD of ours and a valid init struct (contract).
        let (c, h, init) = unsafe { ((*p).ibv.context, (*p).handle, &*init) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let attr = SrqAttr {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            limit: init.attr.srq_limit,
        };
        let id = next_id();
        let handle = match ctx.provider.create_srq(h, &attr, id) {
            Ok(h) => h,
            Err(e) => return ptr(Err(verr(e))),
        };
        let s = boxed(Srq {
            ibv: ibv_srq {
                context: c,
                srq_context: init.srq_context,
                pd,
                handle: handle.0.index,
                mutex: MUTEX,
                cond: COND,
                events_completed: 0,
            },
            handle,
            id,
        });
        lock(&ctx.shared.objs).insert(id, Obj::Srq(s as usize));
        ctx.hold(id, Live::Srq(handle));
        s.cast()
    })
}

#[export_name = "ibverbs_abi_ibv_modify_srq"]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ of ours and a valid attr (contract).
        let (c, h, a) = unsafe { ((*srq).context, (*srq.cast::<Srq>()).handle, &*attr) };
        if mask & !IBV_SRQ_LIMIT != 0 {
            // Resizing (IBV_SRQ_MAX_WR) is not served.
            return libc::EOPNOTSUPP;
        }
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        if mask & IBV_SRQ_LIMIT == 0 {
            return 0;
        }
        rc(ctx.provider.modify_srq(h, a.srq_limit).map_err(verr))
    })
}

#[export_name = "ibverbs_abi_ibv_query_srq"]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ of ours (contract).
        let (c, h) = unsafe { ((*srq).context, (*srq.cast::<Srq>()).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match ctx.provider.query_srq(h) {
            Ok(a) => {
                // SAFETY: a valid `ibv_srq_attr *` (contract).
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.limit,
                    })
                };
                0
            }
            Err(e) => verr(e),
        }
    })
}

#[export_name = "ibverbs_abi_ibv_destroy_srq"]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        let s = srq.cast::<Srq>();
        // SAFETY: an SRQ of ours (contract).
        let (c, h, id) = unsafe { ((*s).ibv.context, (*s).handle, (*s).id) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        if let Err(e) = ctx.provider.destroy_srq(h) {
            return verr(e);
        }
        ctx.drop_held(id);
        // SAFETY: made by `ibv_create_srq`, freed once.
        drop(unsafe { Box::from_raw(s) });
        0
    })
}

// ---- QPs ------------------------------------------------------------------

fn qp_type_of(t: c_int) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        _ => Err(libc::EOPNOTSUPP),
    }
}

#[export_name = "ibverbs_abi_ibv_create_qp"]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(null_mut(), || ptr(create_qp(pd, init)))
}

fn create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    let p = pd.cast::<Pd>();
    // SAFETY: a PD of ours and a valid init struct (contract).
    let (c, h, init) = unsafe { ((*p).ibv.context, (*p).handle, &*init) };
    // SAFETY: contract.
    let ctx = unsafe { ctx_of(c) };
    let qp_type = qp_type_of(init.qp_type)?;
    if init.send_cq.is_null() || init.recv_cq.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: CQs and SRQ of ours (contract).
    let (send_cq, recv_cq, srq) = unsafe {
        (
            (*init.send_cq.cast::<Cq>()).handle,
            (*init.recv_cq.cast::<Cq>()).handle,
            (!init.srq.is_null()).then(|| (*init.srq.cast::<Srq>()).handle),
        )
    };
    let q = QpInit {
        qp_type,
        send_cq,
        recv_cq,
        srq,
        caps: QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline: init.cap.max_inline_data,
        },
        sq_sig_all: init.sq_sig_all != 0,
        port: None,
    };
    let id = next_id();
    let handle = ctx.provider.create_qp(h, &q, id).map_err(verr)?;
    let qpn = match ctx.provider.qp_num(handle) {
        Ok(n) => n.value(),
        Err(e) => {
            let _ = ctx.provider.destroy_qp(handle);
            return Err(verr(e));
        }
    };
    let bounce = match bounce_for(ctx, h, &init.cap) {
        Ok(b) => b,
        Err(e) => {
            let _ = ctx.provider.destroy_qp(handle);
            return Err(e);
        }
    };
    let qp = boxed(Qp {
        ibv: ibv_qp {
            context: c,
            qp_context: init.qp_context,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            handle: handle.0.index,
            qp_num: qpn,
            state: 0,
            qp_type: init.qp_type,
            mutex: MUTEX,
            cond: COND,
            events_completed: 0,
        },
        handle,
        id,
        cap: init.cap,
        sq_sig_all: init.sq_sig_all != 0,
        bounce,
    });
    lock(&ctx.shared.objs).insert(id, Obj::Qp(qp as usize, qpn));
    ctx.hold(id, Live::Qp(handle));
    Ok(qp.cast())
}

/// The inline bounce buffer of a QP with `max_inline_data` (see
/// [`Bounce`]), registered in its PD.
fn bounce_for(
    ctx: &Context,
    pd: verbs::PdHandle,
    cap: &ibv_qp_cap,
) -> Result<Option<Bounce>, c_int> {
    if cap.max_inline_data == 0 {
        return Ok(None);
    }
    let slot = cap.max_inline_data as usize;
    let slots = cap.max_send_wr.clamp(1, BOUNCE_SLOTS) as usize;
    let len = slot.checked_mul(slots).ok_or(libc::EINVAL)?;
    let buf = MemBuf::new_shared(len).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    let mr = ctx
        .provider
        .reg_mr(
            pd,
            &buf,
            buf.addr(),
            len as u64,
            AccessFlags::LOCAL_WRITE,
            0,
        )
        .map_err(verr)?;
    let id = next_id();
    ctx.hold(id, Live::Mr(mr.handle, 0));
    Ok(Some(Bounce {
        buf,
        mr,
        slot,
        slots,
        lock: Mutex::new(()),
        id,
    }))
}

/// Copies the bytes of each inline WR of `wrs` (the first `slots`) into
/// its slot of `b` and points the WR there.
///
/// # Safety
/// The SGEs of inline WRs name memory readable for their lengths (the
/// application's part of the contract: libibverbs reads it at post).
unsafe fn bounce_inline(b: &Bounce, wrs: &mut [SendWr]) {
    let inline = wrs
        .iter_mut()
        .filter(|w| w.flags.contains(SendFlags::INLINE));
    for (k, w) in inline.enumerate() {
        let total = w.total_len();
        if k == b.slots || total > b.slot as u64 {
            // Left as given: the daemon refuses what it cannot take.
            return;
        }
        let mut at = k * b.slot;
        for g in w.sges.iter().filter(|g| g.length > 0) {
            // SAFETY: per the contract.
            let bytes =
                unsafe { std::slice::from_raw_parts(g.addr as *const u8, g.length as usize) };
            b.buf.write_at(at, bytes);
            at += bytes.len();
        }
        w.sges = verbs::sges![Sge {
            addr: b.buf.addr() + (k * b.slot) as u64,
            length: total as u32,
            lkey: b.mr.lkey,
        }];
    }
}

fn qp_state_of(s: c_int) -> Result<QpState, c_int> {
    Ok(match s {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

pub(crate) fn qp_state_code(s: QpState) -> c_int {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn ah_attr_of(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dlid: Lid(a.dlid),
        port: PortNum(a.port_num),
        grh: a.is_global != 0,
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        sl: a.sl,
        hop_limit: a.grh.hop_limit,
    }
}

fn ibv_ah_attr_of(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: 0,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: 0,
        },
        dlid: a.dlid.0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: a.grh as u8,
        port_num: a.port.0,
    }
}

/// The verbs attributes of an `ibv_modify_qp` (mask and values).
pub(crate) fn qp_attr_of(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    const SERVED: c_int = IBV_QP_STATE
        | IBV_QP_CUR_STATE
        | IBV_QP_EN_SQD_ASYNC_NOTIFY
        | IBV_QP_ACCESS_FLAGS
        | IBV_QP_PKEY_INDEX
        | IBV_QP_PORT
        | IBV_QP_QKEY
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_DEST_QPN;
    // Alternate paths, path migration, resizing and rate limits are not
    // served.
    if mask & !SERVED != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let has = |bit: c_int| mask & bit != 0;
    let mut q = QpAttr::default();
    if has(IBV_QP_STATE) {
        q.state = Some(qp_state_of(a.qp_state)?);
    }
    if has(IBV_QP_EN_SQD_ASYNC_NOTIFY) {
        q.en_sqd_async_notify = Some(a.en_sqd_async_notify != 0);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        q.access = Some(AccessFlags::from_bits(a.qp_access_flags).ok_or(libc::EINVAL)?);
    }
    if has(IBV_QP_PKEY_INDEX) {
        q.pkey_index = Some(a.pkey_index);
    }
    if has(IBV_QP_PORT) {
        q.port = Some(PortNum(a.port_num));
    }
    if has(IBV_QP_QKEY) {
        q.qkey = Some(Qkey(a.qkey));
    }
    if has(IBV_QP_AV) {
        q.av = Some(ah_attr_of(&a.ah_attr));
    }
    if has(IBV_QP_PATH_MTU) {
        let code = u8::try_from(a.path_mtu).map_err(|_| libc::EINVAL)?;
        q.path_mtu = Some(Mtu::from_code(code).map_err(|_| libc::EINVAL)?);
    }
    if has(IBV_QP_TIMEOUT) {
        q.timeout = Some(a.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        q.retry_cnt = Some(a.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        q.rnr_retry = Some(a.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        q.rq_psn = Some(Psn::new(a.rq_psn));
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        q.max_rd_atomic = Some(a.max_rd_atomic);
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        q.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(IBV_QP_SQ_PSN) {
        q.sq_psn = Some(Psn::new(a.sq_psn));
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        q.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(IBV_QP_DEST_QPN) {
        q.dest_qpn = Some(Qpn::new(a.dest_qp_num).map_err(|_| libc::EINVAL)?);
    }
    Ok(q)
}

#[export_name = "ibverbs_abi_ibv_modify_qp"]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: a QP of ours and a valid attr (contract).
        let (c, h, a) = unsafe { ((*q).ibv.context, (*q).handle, &*attr) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let v = match qp_attr_of(a, mask) {
            Ok(v) => v,
            Err(e) => return e,
        };
        match ctx.provider.modify_qp(h, &v) {
            Ok(()) => {
                if let Some(s) = v.state {
                    // SAFETY: a QP of ours (contract).
                    unsafe { (*q).ibv.state = qp_state_code(s) };
                }
                0
            }
            Err(e) => verr(e),
        }
    })
}

#[export_name = "ibverbs_abi_ibv_query_qp"]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: a QP of ours (contract).
        let (c, h) = unsafe { ((*q).ibv.context, (*q).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let v = match ctx.provider.query_qp(h) {
            Ok(v) => v,
            Err(e) => return verr(e),
        };
        // SAFETY: a QP of ours (contract).
        let qp_ref = unsafe { &*q };
        let state = v.state.map(qp_state_code).unwrap_or(qp_ref.ibv.state);
        let a = ibv_qp_attr {
            qp_state: state,
            cur_qp_state: state,
            path_mtu: v.path_mtu.map_or(0, |m| m.code() as c_int),
            qkey: v.qkey.map_or(0, |k| k.0),
            rq_psn: v.rq_psn.map_or(0, |p| p.value()),
            sq_psn: v.sq_psn.map_or(0, |p| p.value()),
            dest_qp_num: v.dest_qpn.map_or(0, |n| n.value()),
            qp_access_flags: v.access.map_or(0, |a| a.bits()),
            cap: qp_ref.cap,
            ah_attr: v.av.as_ref().map(ibv_ah_attr_of).unwrap_or_default(),
            pkey_index: v.pkey_index.unwrap_or(0),
            en_sqd_async_notify: v.en_sqd_async_notify.unwrap_or(false) as u8,
            max_rd_atomic: v.max_rd_atomic.unwrap_or(0),
            max_dest_rd_atomic: v.max_dest_rd_atomic.unwrap_or(0),
            min_rnr_timer: v.min_rnr_timer.unwrap_or(0),
            port_num: v.port.map_or(0, |p| p.0),
            timeout: v.timeout.unwrap_or(0),
            retry_cnt: v.retry_cnt.unwrap_or(0),
            rnr_retry: v.rnr_retry.unwrap_or(0),
            ..Default::default()
        };
        // SAFETY: valid out pointers (contract).
        unsafe {
            attr.write(a);
            if !init.is_null() {
                init.write(ibv_qp_init_attr {
                    qp_context: qp_ref.ibv.qp_context,
                    send_cq: qp_ref.ibv.send_cq,
                    recv_cq: qp_ref.ibv.recv_cq,
                    srq: qp_ref.ibv.srq,
                    cap: qp_ref.cap,
                    qp_type: qp_ref.ibv.qp_type,
                    sq_sig_all: qp_ref.sq_sig_all as c_int,
                });
            }
        }
        0
    })
}

#[export_name = "ibverbs_abi_ibv_destroy_qp"]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: a QP of ours (contract).
        let (c, h, id) = unsafe { ((*q).ibv.context, (*q).handle, (*q).id) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        if let Err(e) = ctx.provider.destroy_qp(h) {
            return verr(e);
        }
        ctx.drop_held(id);
        // SAFETY: made by `create_qp`, freed once.
        let q = unsafe { Box::from_raw(q) };
        if let Some(b) = &q.bounce {
            let _ = ctx.provider.dereg_mr(b.mr.handle);
            ctx.drop_held(b.id);
        }
        0
    })
}

/// Rdma-core answers NULL for a QP not created by `ibv_create_qp_ex`,
/// which is every QP here.
#[export_name = "ibverbs_abi_ibv_qp_to_qp_ex"]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut c_void {
    null_mut()
}

// ---- posts --------------------------------------------------------------

/// The SGEs of a work request.
///
/// # Safety
/// `list` holds `n` entries when `n > 0`.
unsafe fn sges(list: *const ibv_sge, n: c_int) -> Result<Vec<Sge>, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: per the contract.
    let s = unsafe { std::slice::from_raw_parts(list, n) };
    Ok(s.iter()
        .map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: Lkey(g.lkey),
        })
        .collect())
}

/// The verbs WR of an `ibv_send_wr`.
///
/// # Safety
/// `w` and what it points to are valid (the caller's contract).
pub(crate) unsafe fn send_wr_of(w: &ibv_send_wr) -> Result<SendWr, c_int> {
    let opcode = match w.opcode {
        IBV_WR_SEND => SendOpcode::Send,
        IBV_WR_SEND_WITH_IMM => SendOpcode::SendWithImm,
        IBV_WR_SEND_WITH_INV => SendOpcode::SendWithInv,
        IBV_WR_RDMA_WRITE => SendOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOpcode::RdmaWriteWithImm,
        IBV_WR_RDMA_READ => SendOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOpcode::AtomicCmpSwp,
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOpcode::AtomicFetchAdd,
        IBV_WR_LOCAL_INV => SendOpcode::LocalInv,
        _ => return Err(libc::EOPNOTSUPP),
    };
    // SAFETY: per the contract.
    let mut wr = SendWr::new(w.wr_id, opcode, unsafe { sges(w.sg_list, w.num_sge)? });
    let mut flags = SendFlags::default();
    for (bit, f) in [
        (IBV_SEND_SIGNALED, SendFlags::SIGNALED),
        (IBV_SEND_SOLICITED, SendFlags::SOLICITED),
        (IBV_SEND_FENCE, SendFlags::FENCE),
        (IBV_SEND_INLINE, SendFlags::INLINE),
    ] {
        if w.send_flags & bit != 0 {
            flags = flags | f;
        }
    }
    wr.flags = flags;
    match opcode {
        SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm => {
            wr.imm = u32::from_be(w.imm_or_inv)
        }
        SendOpcode::SendWithInv | SendOpcode::LocalInv => wr.invalidate_rkey = Rkey(w.imm_or_inv),
        _ => {}
    }
    match opcode {
        SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm | SendOpcode::RdmaRead => {
            let (addr, rkey) = w.wr.rdma();
            wr.remote = verbs::RemoteAddr {
                addr,
                rkey: Rkey(rkey),
            };
        }
        SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => {
            wr.remote = verbs::RemoteAddr {
                addr: w.wr.remote_addr,
                rkey: Rkey(w.wr.rkey),
            };
            wr.compare_add = w.wr.compare_add;
            wr.swap = w.wr.swap;
        }
        _ => {}
    }
    Ok(wr)
}

pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: a QP of ours (contract).
        let (c, h, ud) = unsafe {
            (
                (*q).ibv.context,
                (*q).handle,
                (*q).ibv.qp_type == IBV_QPT_UD,
            )
        };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        let mut ptrs = Vec::new();
        let mut wrs = Vec::new();
        let mut at = wr;
        while !at.is_null() {
            // SAFETY: a chain of valid WRs (contract).
            let w = unsafe { &*at };
            // SAFETY: as above.
            let mut v = match unsafe { send_wr_of(w) } {
                Ok(v) => v,
                Err(e) => return refuse_at(ctx, h, &wrs, &ptrs, at, bad, e),
            };
            if ud {
                let (ah, qpn, qkey) = w.wr.ud();
                if ah.is_null() {
                    return refuse_at(ctx, h, &wrs, &ptrs, at, bad, libc::EINVAL);
                }
                v.ud = Some(UdDest {
                    // SAFETY: an AH of ours (contract).
                    ah: unsafe { (*ah.cast::<Ah>()).handle },
                    remote_qpn: Qpn::from_bits(qpn),
                    remote_qkey: Qkey(qkey),
                });
            }
            wrs.push(v);
            ptrs.push(at);
            at = w.next;
        }
        // SAFETY: a QP of ours (contract).
        let bounce = unsafe { (*q).bounce.as_ref() };
        let _held = bounce.map(|b| lock(&b.lock));
        if let Some(b) = bounce {
            // SAFETY: the WRs' SGEs per the contract.
            unsafe { bounce_inline(b, &mut wrs) };
        }
        post_result(ctx.provider.post_send(h, &wrs), &ptrs, bad)
    })
}

/// Posts the WRs before a bad one, then reports the bad one.
fn refuse_at(
    ctx: &Context,
    h: verbs::QpHandle,
    wrs: &[SendWr],
    ptrs: &[*mut ibv_send_wr],
    at: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    e: c_int,
) -> c_int {
    if !wrs.is_empty() {
        let r = post_result(ctx.provider.post_send(h, wrs), ptrs, bad);
        if r != 0 {
            return r;
        }
    }
    if !bad.is_null() {
        // SAFETY: a valid out pointer (contract).
        unsafe { *bad = at };
    }
    e
}

/// 0, or the errno with `*bad` at the first WR not posted.
fn post_result<T>(r: verbs::Result<()>, ptrs: &[*mut T], bad: *mut *mut T) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            let i = match &e {
                VerbsError::BadWr { index, .. } => *index,
                _ => 0,
            };
            if !bad.is_null() {
                // SAFETY: a valid out pointer (contract).
                unsafe { *bad = ptrs.get(i).copied().unwrap_or(null_mut()) };
            }
            verr(e)
        }
    }
}

/// The receive WRs of a chain, and their pointers.
///
/// # Safety
/// `wr` is a chain of valid WRs.
unsafe fn recv_chain(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> Result<(Vec<RecvWr>, Vec<*mut ibv_recv_wr>), c_int> {
    let (mut wrs, mut ptrs) = (Vec::new(), Vec::new());
    while !wr.is_null() {
        // SAFETY: per the contract.
        let w = unsafe { &*wr };
        // SAFETY: per the contract.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(s) => wrs.push(RecvWr {
                wr_id: w.wr_id,
                sges: s.into(),
            }),
            Err(e) => {
                if !bad.is_null() {
                    // SAFETY: a valid out pointer.
                    unsafe { *bad = wr };
                }
                return Err(e);
            }
        }
        ptrs.push(wr);
        wr = w.next;
    }
    Ok((wrs, ptrs))
}

pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a QP of ours (contract).
        let (c, h) = unsafe { ((*qp).context, (*qp.cast::<Qp>()).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        // SAFETY: contract.
        match unsafe { recv_chain(wr, bad) } {
            Ok((wrs, ptrs)) => post_result(ctx.provider.post_recv(h, &wrs), &ptrs, bad),
            Err(e) => e,
        }
    })
}

pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ of ours (contract).
        let (c, h) = unsafe { ((*srq).context, (*srq.cast::<Srq>()).handle) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        // SAFETY: contract.
        match unsafe { recv_chain(wr, bad) } {
            Ok((wrs, ptrs)) => post_result(ctx.provider.post_srq_recv(h, &wrs), &ptrs, bad),
            Err(e) => e,
        }
    })
}

// ---- AH -------------------------------------------------------------------

#[export_name = "ibverbs_abi_ibv_create_ah"]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(null_mut(), || {
        let p = pd.cast::<Pd>();
        // SAFETY: a PD of ours and a valid attr (contract).
        let (c, h, a) = unsafe { ((*p).ibv.context, (*p).handle, &*attr) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        ptr(ctx
            .provider
            .create_ah(h, &ah_attr_of(a))
            .map_err(verr)
            .map(|handle| {
                let id = next_id();
                ctx.hold(id, Live::Ah(handle));
                boxed(Ah {
                    ibv: ibv_ah {
                        context: c,
                        pd,
                        handle: handle.0.index,
                    },
                    handle,
                    id,
                })
                .cast()
            }))
    })
}

#[export_name = "ibverbs_abi_ibv_destroy_ah"]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        let a = ah.cast::<Ah>();
        // SAFETY: an AH of ours (contract).
        let (c, h, id) = unsafe { ((*a).ibv.context, (*a).handle, (*a).id) };
        // SAFETY: contract.
        let ctx = unsafe { ctx_of(c) };
        match ctx.provider.destroy_ah(h) {
            Ok(()) => {
                ctx.drop_held(id);
                // SAFETY: made by `ibv_create_ah`, freed once.
                drop(unsafe { Box::from_raw(a) });
                0
            }
            Err(e) => verr(e),
        }
    })
}

#[export_name = "ibverbs_abi_ibv_create_ah_from_wc"]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    _pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut c_void,
    _port: u8,
) -> *mut ibv_ah {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

#[export_name = "ibverbs_abi_ibv_init_ah_from_wc"]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    _c: *mut ibv_context,
    _port: u8,
    _wc: *mut ibv_wc,
    _grh: *mut c_void,
    _attr: *mut ibv_ah_attr,
) -> c_int {
    libc::EOPNOTSUPP
}

#[export_name = "ibverbs_abi_ibv_attach_mcast"]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}

#[export_name = "ibverbs_abi_ibv_detach_mcast"]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}

// ---- async events -------------------------------------------------------

#[export_name = "ibverbs_abi_ibv_get_async_event"]
pub unsafe extern "C" fn ibv_get_async_event(
    c: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        let mut rec = [0u8; 16];
        // SAFETY: a context of ours; `rec` has room for one record.
        let n = unsafe { libc::read((*c).async_fd, rec.as_mut_ptr().cast(), rec.len()) };
        if n != rec.len() as isize {
            if n >= 0 {
                set_errno(libc::EIO);
            }
            return -1;
        }
        let element = u64::from_ne_bytes(rec[..8].try_into().expect("8 bytes")) as usize;
        let kind = c_int::from_ne_bytes(rec[8..12].try_into().expect("4 bytes"));
        // SAFETY: a valid out pointer (contract).
        unsafe {
            ev.write(ibv_async_event {
                element: element as *mut c_void,
                event_type: kind,
            })
        };
        0
    })
}

#[export_name = "ibverbs_abi_ibv_ack_async_event"]
pub unsafe extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}

// ---- words ----------------------------------------------------------------

/// `WcStatus::as_str` of each code, as C strings made once.
fn status_words() -> &'static [std::ffi::CString] {
    static WORDS: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    WORDS.get_or_init(|| {
        WcStatus::ALL
            .iter()
            .map(|s| std::ffi::CString::new(s.as_str()).expect("no NUL in the words"))
            .collect()
    })
}

#[export_name = "ibverbs_abi_ibv_wc_status_str"]
pub unsafe extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    match usize::try_from(status)
        .ok()
        .and_then(|i| status_words().get(i))
    {
        Some(s) => s.as_ptr(),
        None => c"unknown".as_ptr(),
    }
}

#[export_name = "ibverbs_abi_ibv_port_state_str"]
pub unsafe extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    let s: &std::ffi::CStr = match state {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    };
    s.as_ptr()
}

#[export_name = "ibverbs_abi_ibv_node_type_str"]
pub unsafe extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    let s: &std::ffi::CStr = match t {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[export_name = "ibverbs_abi_ibv_event_type_str"]
pub unsafe extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    let s: &std::ffi::CStr = match e {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        4 => c"communication established",
        5 => c"send queue drained",
        6 => c"path migrated",
        7 => c"path migration request error",
        8 => c"local catastrophic error",
        9 => c"port active",
        10 => c"port error",
        11 => c"LID change",
        12 => c"P_Key change",
        13 => c"SM change",
        14 => c"SRQ catastrophic error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        17 => c"client reregistration",
        18 => c"GID table change",
        _ => c"unknown",
    };
    s.as_ptr()
}

symbols! {
    ibv_get_device_list @ "IBVERBS_1.1",
    ibv_free_device_list @ "IBVERBS_1.1",
    ibv_get_device_name @ "IBVERBS_1.1",
    ibv_get_device_guid @ "IBVERBS_1.1",
    ibv_open_device @ "IBVERBS_1.1",
    ibv_close_device @ "IBVERBS_1.1",
    ibv_query_device @ "IBVERBS_1.1",
    ibv_query_port @ "IBVERBS_1.1",
    ibv_query_gid @ "IBVERBS_1.1",
    _ibv_query_gid_ex @ "IBVERBS_1.11",
    ibv_query_gid_type @ "IBVERBS_PRIVATE_34",
    ibv_query_pkey @ "IBVERBS_1.1",
    ibv_read_sysfs_file @ "IBVERBS_1.0",
    ibv_fork_init @ "IBVERBS_1.1",
    ibv_alloc_pd @ "IBVERBS_1.1",
    ibv_dealloc_pd @ "IBVERBS_1.1",
    ibv_reg_mr @ "IBVERBS_1.1",
    ibv_reg_mr_iova @ "IBVERBS_1.7",
    ibv_reg_mr_iova2 @ "IBVERBS_1.8",
    ibv_dereg_mr @ "IBVERBS_1.1",
    ibv_rereg_mr @ "IBVERBS_1.1",
    ibv_create_comp_channel @ "IBVERBS_1.0",
    ibv_destroy_comp_channel @ "IBVERBS_1.0",
    ibv_create_cq @ "IBVERBS_1.1",
    ibv_resize_cq @ "IBVERBS_1.1",
    ibv_destroy_cq @ "IBVERBS_1.1",
    ibv_get_cq_event @ "IBVERBS_1.1",
    ibv_ack_cq_events @ "IBVERBS_1.1",
    ibv_create_srq @ "IBVERBS_1.1",
    ibv_modify_srq @ "IBVERBS_1.1",
    ibv_query_srq @ "IBVERBS_1.1",
    ibv_destroy_srq @ "IBVERBS_1.1",
    ibv_create_qp @ "IBVERBS_1.1",
    ibv_modify_qp @ "IBVERBS_1.1",
    ibv_query_qp @ "IBVERBS_1.1",
    ibv_destroy_qp @ "IBVERBS_1.1",
    ibv_qp_to_qp_ex @ "IBVERBS_1.6",
    ibv_create_ah @ "IBVERBS_1.1",
    ibv_destroy_ah @ "IBVERBS_1.1",
    ibv_create_ah_from_wc @ "IBVERBS_1.1",
    ibv_init_ah_from_wc @ "IBVERBS_1.1",
    ibv_attach_mcast @ "IBVERBS_1.1",
    ibv_detach_mcast @ "IBVERBS_1.1",
    ibv_get_async_event @ "IBVERBS_1.1",
    ibv_ack_async_event @ "IBVERBS_1.1",
    ibv_wc_status_str @ "IBVERBS_1.1",
    ibv_port_state_str @ "IBVERBS_1.1",
    ibv_node_type_str @ "IBVERBS_1.1",
    ibv_event_type_str @ "IBVERBS_1.1",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modify_mask_becomes_the_attributes_it_names() {
        let a = ibv_qp_attr {
            qp_state: 2,
            path_mtu: 3,
            dest_qp_num: 0x12_3456,
            rq_psn: 0x65_4321,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: [7; 16] },
                    sgid_index: 1,
                    hop_limit: 1,
                    ..Default::default()
                },
                is_global: 1,
                port_num: 1,
                ..Default::default()
            },
            // Not in the mask: left out.
            qkey: 0x1111,
            ..Default::default()
        };
        let mask = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        let q = qp_attr_of(&a, mask).unwrap();
        assert_eq!(q.state, Some(QpState::Rtr));
        assert_eq!(q.path_mtu, Some(Mtu::Mtu1024));
        assert_eq!(q.dest_qpn.map(|n| n.value()), Some(0x12_3456));
        assert_eq!(q.rq_psn, Some(Psn::new(0x65_4321)));
        assert_eq!((q.max_dest_rd_atomic, q.min_rnr_timer), (Some(4), Some(12)));
        let av = q.av.unwrap();
        assert!(av.grh);
        assert_eq!((av.dgid, av.sgid_index, av.hop_limit), (Gid([7; 16]), 1, 1));
        assert_eq!((q.qkey, q.sq_psn, q.access), (None, None, None));
        // Not served: alternate paths, path migration, resizing.
        for m in [IBV_QP_ALT_PATH, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP] {
            assert_eq!(qp_attr_of(&a, IBV_QP_STATE | m), Err(libc::EOPNOTSUPP));
        }
        // Out of range values: EINVAL.
        let bad_state = ibv_qp_attr { qp_state: 9, ..a };
        assert_eq!(qp_attr_of(&bad_state, IBV_QP_STATE), Err(libc::EINVAL));
        let bad_mtu = ibv_qp_attr { path_mtu: 6, ..a };
        assert_eq!(qp_attr_of(&bad_mtu, IBV_QP_PATH_MTU), Err(libc::EINVAL));
        let bad_qpn = ibv_qp_attr {
            dest_qp_num: 1 << 24,
            ..a
        };
        assert_eq!(qp_attr_of(&bad_qpn, IBV_QP_DEST_QPN), Err(libc::EINVAL));
    }

    fn wr(opcode: c_int, sge: &mut ibv_sge) -> ibv_send_wr {
        ibv_send_wr {
            wr_id: 9,
            next: null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode,
            send_flags: IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            imm_or_inv: 0x1234u32.to_be(),
            wr: SendWrUnion::default(),
            remote_srqn: 0,
            bind_mw: SendWrBindMw {
                mw: null_mut(),
                rkey: 0,
                bind_info: ibv_mw_bind_info {
                    mr: null_mut(),
                    addr: 0,
                    length: 0,
                    mw_access_flags: 0,
                },
            },
        }
    }

    #[test]
    fn a_send_wr_reads_its_union_as_its_opcode_says() {
        let mut sge = ibv_sge {
            addr: 0x1000,
            length: 64,
            lkey: 5,
        };
        let mut w = wr(IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge);
        // wr.rdma: remote_addr, then the R_Key at 8.
        w.wr.remote_addr = 0xdead_0000;
        w.wr.compare_add = 0x77;
        // SAFETY: `w` and its SGE are valid.
        let v = unsafe { send_wr_of(&w) }.unwrap();
        assert_eq!(v.opcode, SendOpcode::RdmaWriteWithImm);
        assert_eq!((v.remote.addr, v.remote.rkey), (0xdead_0000, Rkey(0x77)));
        assert_eq!(v.imm, 0x1234, "immediate data in host order");
        assert!(v.flags.contains(SendFlags::SIGNALED) && v.flags.contains(SendFlags::INLINE));
        assert!(!v.flags.contains(SendFlags::SOLICITED));
        assert_eq!(
            v.sges.to_vec(),
            vec![Sge {
                addr: 0x1000,
                length: 64,
                lkey: Lkey(5)
            }]
        );
        // wr.atomic: remote_addr, compare_add, swap, rkey at 24.
        let mut w = wr(IBV_WR_ATOMIC_CMP_AND_SWP, &mut sge);
        w.wr = SendWrUnion {
            remote_addr: 0x2000,
            compare_add: 1,
            swap: 2,
            rkey: 0x99,
        };
        // SAFETY: as above.
        let v = unsafe { send_wr_of(&w) }.unwrap();
        assert_eq!(
            (v.remote.addr, v.remote.rkey, v.compare_add, v.swap),
            (0x2000, Rkey(0x99), 1, 2)
        );
        // wr.ud: the AH, remote QPN at 8, Q_Key at 12.
        let u = SendWrUnion {
            remote_addr: 0x5000,
            compare_add: (0x1111_1111u64 << 32) | 0x42,
            ..Default::default()
        };
        assert_eq!(u.ud(), (0x5000 as *mut ibv_ah, 0x42, 0x1111_1111));
        // Window binds and unknown opcodes: EOPNOTSUPP.
        for op in [8, 10, 99] {
            let w = wr(op, &mut sge);
            // SAFETY: as above.
            assert_eq!(unsafe { send_wr_of(&w) }.unwrap_err(), libc::EOPNOTSUPP);
        }
    }

    #[test]
    fn a_completion_reads_as_libibverbs_writes_it() {
        let mut w = WorkCompletion::new(5, WcStatus::RemAccessErr, WcOpcode::RecvRdmaWithImm, 0);
        w.byte_len = 100;
        w.imm = 0xabcd;
        w.wc_flags = WcFlags::WITH_IMM | WcFlags::GRH;
        w.src_qp = Qpn::from_bits(0x33);
        let c = ibv_wc_of(&w, 0x77);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (5, 10, IBV_WC_RECV_RDMA_WITH_IMM)
        );
        assert_eq!((c.byte_len, c.qp_num, c.src_qp), (100, 0x77, 0x33));
        assert_eq!(c.imm_or_inv, 0xabcdu32.to_be(), "network order in the WC");
        assert_eq!(c.wc_flags, IBV_WC_WITH_IMM | IBV_WC_GRH);
        let mut w = WorkCompletion::new(6, WcStatus::Success, WcOpcode::Recv, 0);
        w.wc_flags = WcFlags::WITH_INV;
        w.invalidated_rkey = Rkey(0x4242);
        let c = ibv_wc_of(&w, 1);
        assert_eq!((c.imm_or_inv, c.wc_flags), (0x4242, IBV_WC_WITH_INV));
    }

    #[test]
    fn each_refusal_has_rdma_cores_errno() {
        assert_eq!(errno_of(&VerbsError::NotSupported("x")), libc::EOPNOTSUPP);
        assert_eq!(errno_of(&VerbsError::QueueFull), libc::ENOMEM);
        assert_eq!(errno_of(&VerbsError::Busy("x")), libc::EBUSY);
        assert_eq!(errno_of(&VerbsError::NoSuchCa), libc::ENODEV);
        let bad = VerbsError::BadWr {
            index: 1,
            cause: Box::new(VerbsError::OutOfResources("sge")),
        };
        assert_eq!(errno_of(&bad), libc::ENOMEM);
        assert_eq!(errno_of(&VerbsError::InvalidHandle), libc::EINVAL);
    }

    #[test]
    fn status_words_are_rdma_cores() {
        let w = |s| {
            // SAFETY: the function returns a static C string.
            unsafe { std::ffi::CStr::from_ptr(ibv_wc_status_str(s)) }
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(w(0), "success");
        assert_eq!(w(5), "Work Request Flushed Error");
        assert_eq!(w(12), "transport retry counter exceeded");
        assert_eq!(w(21), "general error");
        assert_eq!(w(22), "unknown");
        assert_eq!(w(-1), "unknown");
        assert!(WcStatus::ALL
            .iter()
            .enumerate()
            .all(|(i, s)| *s as usize == i));
    }
}
