//! The only unsafe code of the crate: libibverbs' ABI ([`raw`]), the
//! library loaded at run time ([`loader`]), and safe owners of its objects.
//!
//! Each owner holds a pointer the library allocated and frees it on drop,
//! after everything made from it: a child holds an `Arc` of its parents
//! (an MR its PD, a QP its PD, CQs and SRQ, every object its device), so
//! the library never sees a parent destroyed before a child, and never a
//! pointer after its object was destroyed. libibverbs' verbs are thread
//! safe (the drivers lock their queues), so the owners are `Send + Sync`.
//!
//! What the owners promise the library beyond that:
//! - memory registered is a [`verbs::MemBuf`] range the MR keeps alive;
//! - inline send data is copied by the library from the process' memory
//!   at post time, so an inline SGE must lie inside a live MR's buffer
//!   ([`Qp::post_send`] checks it against the regions it is given);
//! - completion channels and the async fd are non-blocking, and events
//!   are acknowledged before anything else runs (`ibv_destroy_cq` and
//!   `ibv_destroy_qp` wait for every event of theirs to be acknowledged).

#![allow(unsafe_code)]

pub(crate) mod loader;
pub(crate) mod raw;
pub(crate) mod ucma;
pub(crate) mod umad;

use loader::Verbs;
use raw::*;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use verbs::MemBuf;

pub use loader::{LoadError, LIBIBVERBS};

/// An `errno` value a verb failed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Errno(pub i32);

impl Errno {
    /// The thread's `errno`, or `fallback` when it is 0 (a library that
    /// returned NULL without setting it).
    fn last(fallback: i32) -> Errno {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(e) if e != 0 => Errno(e),
            _ => Errno(fallback),
        }
    }

    /// A verb's return value: 0 is success, anything else an errno (some
    /// drivers return it negated).
    fn check(rc: c_int) -> Result<(), Errno> {
        match rc {
            0 => Ok(()),
            rc => Err(Errno(rc.abs())),
        }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// Sets `O_NONBLOCK` on `fd` (a channel's or the async fd: the
/// rdma-core man pages allow it, and the event calls then return at once
/// when nothing is pending).
fn set_nonblocking(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: fcntl on a descriptor the library owns and keeps open while
    // its object lives; F_GETFL/F_SETFL touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Errno::last(libc::EBADF));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Errno::last(libc::EBADF));
    }
    Ok(())
}

/// One device as `ibv_get_device_list` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceEntry {
    /// Kernel device name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// Node GUID, host order.
    pub guid: u64,
}

/// Runs `f` on the device list, freed after.
fn with_device_list<R>(v: &Verbs, f: impl FnOnce(&[*mut ibv_device]) -> R) -> Result<R, Errno> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { (v.f.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(Errno::last(libc::ENOSYS));
    }
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: the library returned an array of `n` device pointers (plus a
    // NULL terminator), valid until `ibv_free_device_list`.
    let devs = unsafe { std::slice::from_raw_parts(list, len) };
    let r = f(devs);
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once;
    // nothing of it is used after (open contexts stay valid).
    unsafe { (v.f.free_device_list)(list) };
    Ok(r)
}

fn entry(v: &Verbs, dev: *mut ibv_device) -> DeviceEntry {
    // SAFETY: `dev` is an element of a live device list; the name is a
    // NUL-terminated string inside the device struct.
    let name = unsafe {
        let p = (v.f.get_device_name)(dev);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    // SAFETY: as above; returns the node GUID in network order.
    let guid = u64::from_be(unsafe { (v.f.get_device_guid)(dev) });
    DeviceEntry { name, guid }
}

/// The devices libibverbs finds (those whose driver it could load).
pub(crate) fn devices(v: &Verbs) -> Result<Vec<DeviceEntry>, Errno> {
    with_device_list(v, |devs| devs.iter().map(|d| entry(v, *d)).collect())
}

/// What an affiliated or unaffiliated asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Element {
    /// The `qp_context` of the QP.
    Qp(u64),
    /// The `cq_context` of the CQ.
    Cq(u64),
    /// The `srq_context` of the SRQ.
    Srq(u64),
    /// A port.
    Port(u8),
    /// The device.
    Device,
}

/// An asynchronous event, read and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AsyncEventInfo {
    /// `enum ibv_event_type`.
    pub kind: u32,
    /// Its object.
    pub element: Element,
}

/// An open device (`struct ibv_context`).
pub(crate) struct Device {
    v: Arc<Verbs>,
    ctx: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (rdma-core's
// verbs are thread safe); the pointer is freed only on drop.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened by `Device::open`, closed once; every object made
        // from it holds an `Arc<Device>` and is gone already.
        let rc = unsafe { (self.v.f.close_device)(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, "ibv_close_device failed: {}", Errno(rc.abs()));
        }
    }
}

impl Device {
    /// Opens the device with node GUID `guid` (host order); `Ok(None)`
    /// when no device has it.
    pub(crate) fn open(v: &Arc<Verbs>, guid: u64) -> Result<Option<Arc<Device>>, Errno> {
        let opened = with_device_list(v, |devs| {
            let Some(dev) = devs.iter().copied().find(|d| entry(v, *d).guid == guid) else {
                return Ok(None);
            };
            let name = entry(v, dev).name;
            // SAFETY: `dev` is an element of the live list; the context
            // outlives the list (rdma-core documents it).
            let ctx = unsafe { (v.f.open_device)(dev) };
            match NonNull::new(ctx) {
                None => Err(Errno::last(libc::ENODEV)),
                Some(ctx) => Ok(Some((ctx, name))),
            }
        })??;
        let Some((ctx, name)) = opened else {
            return Ok(None);
        };
        let d = Arc::new(Device {
            v: v.clone(),
            ctx,
            name,
        });
        set_nonblocking(d.async_fd())?;
        Ok(Some(d))
    }

    /// Kernel device name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn ctx(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<ibv_device_attr, Errno> {
        let mut a = ibv_device_attr::default();
        // SAFETY: live context, `a` a valid out-struct of the ABI's size.
        Errno::check(unsafe { (self.v.f.query_device)(self.ctx(), &mut a) })?;
        Ok(a)
    }

    /// `ibv_query_port` (see the loader's docs for which symbol).
    pub(crate) fn query_port(&self, port: u8) -> Result<ibv_port_attr, Errno> {
        let mut a = ibv_port_attr::default();
        // SAFETY: live context; `a` is the whole 52-byte struct, of which
        // the library writes the compat prefix.
        Errno::check(unsafe { (self.v.f.query_port)(self.ctx(), port, &mut a) })?;
        Ok(a)
    }

    /// The valid entries of port `port`'s GID table, in index order, with
    /// their types where the library can say (`gid_type` is `u32::MAX`
    /// when it cannot). `table_len` is the port's `gid_tbl_len`.
    pub(crate) fn gid_table(&self, port: u8, table_len: usize) -> Vec<ibv_gid_entry> {
        if let Some(f) = self.v.f.query_gid_table {
            let total = self
                .query_device()
                .map(|a| usize::from(a.phys_port_cnt))
                .unwrap_or(1)
                .max(1)
                * table_len.max(1);
            let mut out = vec![ibv_gid_entry::default(); total];
            // SAFETY: `out` has room for `total` entries of the size given.
            let n = unsafe {
                f(
                    self.ctx(),
                    out.as_mut_ptr(),
                    out.len(),
                    0,
                    std::mem::size_of::<ibv_gid_entry>(),
                )
            };
            if let Ok(n) = usize::try_from(n) {
                out.truncate(n.min(total));
                out.retain(|e| e.port_num == u32::from(port));
                out.sort_by_key(|e| e.gid_index);
                return out;
            }
        }
        (0..table_len)
            .filter_map(|i| {
                let mut g = ibv_gid::default();
                let i = c_int::try_from(i).ok()?;
                // SAFETY: live context, `g` a valid 16-byte out-buffer.
                let rc = unsafe { (self.v.f.query_gid)(self.ctx(), port, i, &mut g) };
                (rc == 0 && g.raw != [0; 16]).then_some(ibv_gid_entry {
                    gid: g,
                    gid_index: i as u32,
                    port_num: u32::from(port),
                    gid_type: u32::MAX,
                    ndev_ifindex: 0,
                })
            })
            .collect()
    }

    /// `ibv_query_pkey`, host order.
    pub(crate) fn query_pkey(&self, port: u8, index: u16) -> Result<u16, Errno> {
        let mut k: u16 = 0;
        // SAFETY: live context, `k` a valid out-pointer.
        Errno::check(unsafe {
            (self.v.f.query_pkey)(self.ctx(), port, c_int::from(index), &mut k)
        })?;
        Ok(u16::from_be(k))
    }

    /// The descriptor asynchronous events arrive on (non-blocking).
    pub(crate) fn async_fd(&self) -> RawFd {
        // SAFETY: `async_fd` is a plain int of the live context, set at open.
        unsafe { (*self.ctx()).async_fd }
    }

    /// The next asynchronous event, if one is pending, already
    /// acknowledged (so destroying its object does not wait for us).
    pub(crate) fn next_async_event(&self) -> Option<AsyncEventInfo> {
        let mut ev = ibv_async_event {
            element: ibv_event_element {
                ptr: std::ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: live context; the fd is non-blocking, so this returns -1
        // at once when nothing is pending.
        if unsafe { (self.v.f.get_async_event)(self.ctx(), &mut ev) } != 0 {
            return None;
        }
        use raw::event::*;
        let kind = ev.event_type;
        // SAFETY: the event type says which union member the library set;
        // the object is alive until the event is acknowledged below (its
        // destroy waits for that), and only its context field is read.
        let element = unsafe {
            match kind {
                CQ_ERR => Element::Cq((*ev.element.ptr.cast::<ibv_cq>()).cq_context as u64),
                QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR | COMM_EST | SQ_DRAINED | PATH_MIG
                | PATH_MIG_ERR | QP_LAST_WQE_REACHED => {
                    Element::Qp((*ev.element.ptr.cast::<ibv_qp>()).qp_context as u64)
                }
                SRQ_ERR | SRQ_LIMIT_REACHED => {
                    Element::Srq((*ev.element.ptr.cast::<ibv_srq>()).srq_context as u64)
                }
                PORT_ACTIVE | PORT_ERR | LID_CHANGE | PKEY_CHANGE | SM_CHANGE
                | CLIENT_REREGISTER | GID_CHANGE => {
                    Element::Port(u8::try_from(ev.element.port_num).unwrap_or(0))
                }
                _ => Element::Device,
            }
        };
        // SAFETY: the event was returned by `ibv_get_async_event` above and
        // is acknowledged once.
        unsafe { (self.v.f.ack_async_event)(&mut ev) };
        Some(AsyncEventInfo { kind, element })
    }
}

/// A protection domain.
pub(crate) struct Pd {
    dev: Arc<Device>,
    pd: NonNull<ibv_pd>,
}

// SAFETY: see `Device`.
unsafe impl Send for Pd {}
// SAFETY: see `Device`.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by `Pd::new`, freed once, after every child
        // (each holds an `Arc<Pd>`).
        let rc = unsafe { (self.dev.v.f.dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.dev.name, "ibv_dealloc_pd failed: {}", Errno(rc.abs()));
        }
    }
}

impl Pd {
    /// `ibv_alloc_pd`.
    pub(crate) fn new(dev: &Arc<Device>) -> Result<Arc<Pd>, Errno> {
        // SAFETY: live context.
        let pd = unsafe { (dev.v.f.alloc_pd)(dev.ctx()) };
        let pd = NonNull::new(pd).ok_or_else(|| Errno::last(libc::ENOMEM))?;
        Ok(Arc::new(Pd {
            dev: dev.clone(),
            pd,
        }))
    }

    fn v(&self) -> &Verbs {
        &self.dev.v
    }
}

/// A memory region over part of a [`MemBuf`], which it keeps alive.
pub(crate) struct Mr {
    pd: Arc<Pd>,
    mr: NonNull<ibv_mr>,
    buf: MemBuf,
    addr: u64,
    len: u64,
}

// SAFETY: see `Device`.
unsafe impl Send for Mr {}
// SAFETY: see `Device`.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `Mr::new`, deregistered once; the buffer
        // is released only after (it is a field, dropped after this).
        let rc = unsafe { (self.pd.v().f.dereg_mr)(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.dev.name, "ibv_dereg_mr failed: {}", Errno(rc.abs()));
        }
    }
}

impl Mr {
    /// The buffer it is registered over.
    pub(crate) fn buf(&self) -> &MemBuf {
        &self.buf
    }

    /// Registers `[addr, addr + len)`, which must lie inside `buf`
    /// (`EINVAL` otherwise), with `access` (`IBV_ACCESS_*` bits).
    pub(crate) fn new(
        pd: &Arc<Pd>,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: u32,
    ) -> Result<Mr, Errno> {
        if !buf.contains(addr, len) {
            return Err(Errno(libc::EINVAL));
        }
        let length = usize::try_from(len).map_err(|_| Errno(libc::EINVAL))?;
        let access = c_int::try_from(access).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: the range lies inside `buf`, whose allocation this MR
        // keeps alive until after deregistration; the device reaches it
        // only through the keys the registration returns.
        let mr = unsafe { (pd.v().f.reg_mr)(pd.pd.as_ptr(), addr as *mut c_void, length, access) };
        let mr = NonNull::new(mr).ok_or_else(|| Errno::last(libc::EINVAL))?;
        Ok(Mr {
            pd: pd.clone(),
            mr,
            buf: buf.clone(),
            addr,
            len,
        })
    }

    /// Local key.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live; `lkey` is a plain field set at
        // registration.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// Remote key.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as `lkey`.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The registered range: start address and length.
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.addr, self.len)
    }

    /// Whether `[addr, addr + len)` lies inside the registered range.
    pub(crate) fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.addr + self.len)
            && self.buf.contains(addr, len)
    }
}

/// A memory window. It keeps the MR it was last bound to (and so that
/// MR's buffer) alive until the device has deallocated it: a peer may
/// reach the buffer through the window until then.
pub(crate) struct Mw {
    pd: Arc<Pd>,
    mw: NonNull<ibv_mw>,
    bound: std::sync::Mutex<Option<Arc<Mr>>>,
}

// SAFETY: see `Device`. The one field written after allocation, the
// R_Key, is written through an atomic (see `Mw::set_rkey`).
unsafe impl Send for Mw {}
// SAFETY: as above.
unsafe impl Sync for Mw {}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: the inline `ibv_dealloc_mw`: the driver's function from
        // the ops table on a window allocated by `Mw::new`, deallocated
        // once; the MR it was bound to is released after (a field).
        let rc = unsafe {
            match (*self.pd.dev.ctx()).ops.dealloc_mw {
                Some(f) => f(self.mw.as_ptr()),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            tracing::warn!(device = %self.pd.dev.name, "ibv_dealloc_mw failed: {}", Errno(rc.abs()));
        }
    }
}

impl Mw {
    /// `ibv_alloc_mw` of `mw_type` (`IBV_MW_TYPE_*`).
    pub(crate) fn new(pd: &Arc<Pd>, mw_type: u32) -> Result<Mw, Errno> {
        // SAFETY: the inline `ibv_alloc_mw`: the driver's function from the
        // ops table (libibverbs' stub sets EOPNOTSUPP when the driver has
        // none) on a live PD.
        let mw = unsafe {
            match (*pd.dev.ctx()).ops.alloc_mw {
                Some(f) => f(pd.pd.as_ptr(), mw_type),
                None => std::ptr::null_mut(),
            }
        };
        let mw = NonNull::new(mw).ok_or_else(|| Errno::last(libc::EOPNOTSUPP))?;
        Ok(Mw {
            pd: pd.clone(),
            mw,
            bound: std::sync::Mutex::new(None),
        })
    }

    /// The field the R_Key lives in, as an atomic.
    fn rkey_cell(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: the window is live and the field is a 4-aligned u32 the
        // library allocated. Every access of ours goes through this view;
        // the driver writes it only inside a type 1 bind (`Mw::bind`,
        // under the window's lock, after which ours read it), and reads
        // it while posting a type 2 bind, before ours store the new key.
        unsafe {
            std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.mw.as_ptr()).rkey))
        }
    }

    /// The window's R_Key: the one it was allocated with or last bound to.
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey_cell().load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records a type 2 bind WR's new R_Key (the driver builds the next
    /// bind from the window's current key, as `ibv_bind_mw` leaves it for
    /// type 1).
    fn set_rkey(&self, rkey: u32) {
        self.rkey_cell()
            .store(rkey, std::sync::atomic::Ordering::Release);
    }

    /// Keeps `mr` alive for as long as the window may reach it.
    fn bound_to(&self, mr: &Arc<Mr>) {
        *self.bound.lock().unwrap_or_else(|e| e.into_inner()) = Some(mr.clone());
    }

    /// `ibv_bind_mw` of a type 1 window to `[addr, addr + len)` of `mr`
    /// with `access` (`IBV_ACCESS_*`), by an unsignaled bind WR on `qp`'s
    /// send queue (the driver posts it; with `sq_sig_all` it completes as
    /// a BIND_MW of wr_id 0). Returns the new R_Key. `EPERM` when the
    /// window and the MR are in different PDs, as `ibv_bind_mw` says.
    pub(crate) fn bind(
        &self,
        qp: &Qp,
        mr: &Arc<Mr>,
        addr: u64,
        len: u64,
        access: u32,
    ) -> Result<u32, Errno> {
        if !Arc::ptr_eq(&self.pd, &mr.pd) {
            return Err(Errno(libc::EPERM));
        }
        let mut b = ibv_mw_bind {
            wr_id: 0,
            send_flags: 0,
            bind_info: ibv_mw_bind_info {
                mr: mr.mr.as_ptr(),
                addr,
                length: len,
                mw_access_flags: access,
            },
        };
        // Binds of one window are serialised by this lock, held across
        // the call (the driver rewrites the window's R_Key field).
        let mut guard = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the inline `ibv_bind_mw` (its type and PD checks made
        // above and by the caller): the driver's function from the ops
        // table on a live QP, window and MR. The driver reads `b` during
        // the call only.
        let rc = unsafe {
            match (*self.pd.dev.ctx()).ops.bind_mw {
                Some(f) => f(qp.qp.as_ptr(), self.mw.as_ptr(), &mut b),
                None => libc::ENOSYS,
            }
        };
        Errno::check(rc)?;
        *guard = Some(mr.clone());
        drop(guard);
        Ok(self.rkey())
    }
}

/// A completion queue with its own completion channel.
pub(crate) struct Cq {
    dev: Arc<Device>,
    cq: NonNull<ibv_cq>,
    channel: NonNull<ibv_comp_channel>,
}

// SAFETY: see `Device`.
unsafe impl Send for Cq {}
// SAFETY: see `Device`.
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by `Cq::new`, destroyed once after every QP using
        // it (they hold an `Arc<Cq>`); all its events were acknowledged
        // when read. The channel goes after the CQ attached to it.
        unsafe {
            let rc = (self.dev.v.f.destroy_cq)(self.cq.as_ptr());
            if rc != 0 {
                tracing::warn!(device = %self.dev.name, "ibv_destroy_cq failed: {}", Errno(rc.abs()));
            }
            let rc = (self.dev.v.f.destroy_comp_channel)(self.channel.as_ptr());
            if rc != 0 {
                tracing::warn!(device = %self.dev.name, "ibv_destroy_comp_channel failed: {}", Errno(rc.abs()));
            }
        }
    }
}

impl Cq {
    /// A CQ of at least `cqe` entries on a new, non-blocking channel;
    /// `cq_context` comes back in its asynchronous events.
    pub(crate) fn new(dev: &Arc<Device>, cqe: u32, cq_context: u64) -> Result<Cq, Errno> {
        let cqe = c_int::try_from(cqe).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: live context.
        let ch = unsafe { (dev.v.f.create_comp_channel)(dev.ctx()) };
        let channel = NonNull::new(ch).ok_or_else(|| Errno::last(libc::ENOMEM))?;
        let destroy_channel = || {
            // SAFETY: created above, attached to nothing, destroyed once.
            unsafe { (dev.v.f.destroy_comp_channel)(channel.as_ptr()) };
        };
        // SAFETY: `channel` is live; reading its fd field.
        let fd = unsafe { (*channel.as_ptr()).fd };
        if let Err(e) = set_nonblocking(fd) {
            destroy_channel();
            return Err(e);
        }
        // SAFETY: live context and channel; vector 0 always exists; the
        // context value is never dereferenced by the library.
        let cq = unsafe {
            (dev.v.f.create_cq)(
                dev.ctx(),
                cqe,
                cq_context as *mut c_void,
                channel.as_ptr(),
                0,
            )
        };
        let Some(cq) = NonNull::new(cq) else {
            let e = Errno::last(libc::ENOMEM);
            destroy_channel();
            return Err(e);
        };
        Ok(Cq {
            dev: dev.clone(),
            cq,
            channel,
        })
    }

    /// The channel's descriptor (readable when an event is pending).
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: live channel; `fd` is a plain field set at creation.
        unsafe { (*self.channel.as_ptr()).fd }
    }

    /// `ibv_poll_cq` into `out`; how many were written.
    pub(crate) fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, Errno> {
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: the inline `ibv_poll_cq` of verbs.h: the driver's
        // `poll_cq` from the context's ops table; `out` has room for `n`.
        let rc = unsafe {
            let f = (*self.dev.ctx()).ops.poll_cq.ok_or(Errno(libc::ENOSYS))?;
            f(self.cq.as_ptr(), n, out.as_mut_ptr())
        };
        usize::try_from(rc).map_err(|_| Errno(libc::EIO))
    }

    /// `ibv_req_notify_cq`.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<(), Errno> {
        // SAFETY: the inline `ibv_req_notify_cq`: the driver's function
        // from the ops table on a live CQ.
        let rc = unsafe {
            let f = (*self.dev.ctx())
                .ops
                .req_notify_cq
                .ok_or(Errno(libc::ENOSYS))?;
            f(self.cq.as_ptr(), c_int::from(solicited_only))
        };
        Errno::check(rc)
    }

    /// Takes one pending completion event from the channel and
    /// acknowledges it; false when none was pending.
    pub(crate) fn take_event(&self) -> bool {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: live non-blocking channel; valid out-pointers.
        let rc = unsafe { (self.dev.v.f.get_cq_event)(self.channel.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 || cq.is_null() {
            return false;
        }
        // SAFETY: the event is for the one CQ on this channel, live (its
        // destroy waits for this acknowledgement).
        unsafe { (self.dev.v.f.ack_cq_events)(cq, 1) };
        true
    }
}

/// A shared receive queue.
pub(crate) struct Srq {
    pd: Arc<Pd>,
    srq: NonNull<ibv_srq>,
}

// SAFETY: see `Device`.
unsafe impl Send for Srq {}
// SAFETY: see `Device`.
unsafe impl Sync for Srq {}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: created by `Srq::new`, destroyed once after every QP using
        // it (they hold an `Arc<Srq>`).
        let rc = unsafe { (self.pd.v().f.destroy_srq)(self.srq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.dev.name, "ibv_destroy_srq failed: {}", Errno(rc.abs()));
        }
    }
}

impl Srq {
    /// `ibv_create_srq`; `srq_context` comes back in its events. Returns
    /// the SRQ and the attributes the device gave it.
    pub(crate) fn new(
        pd: &Arc<Pd>,
        attr: ibv_srq_attr,
        srq_context: u64,
    ) -> Result<(Srq, ibv_srq_attr), Errno> {
        let mut init = ibv_srq_init_attr {
            srq_context: srq_context as *mut c_void,
            attr,
        };
        // SAFETY: live PD, `init` valid; the context value is never
        // dereferenced by the library.
        let srq = unsafe { (pd.v().f.create_srq)(pd.pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| Errno::last(libc::EINVAL))?;
        Ok((
            Srq {
                pd: pd.clone(),
                srq,
            },
            init.attr,
        ))
    }

    /// Sets the limit (`IBV_SRQ_LIMIT`), arming the limit event.
    pub(crate) fn set_limit(&self, limit: u32) -> Result<(), Errno> {
        let mut a = ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: live SRQ, `a` valid.
        Errno::check(unsafe {
            (self.pd.v().f.modify_srq)(self.srq.as_ptr(), &mut a, IBV_SRQ_LIMIT)
        })
    }

    /// `ibv_query_srq`.
    pub(crate) fn query(&self) -> Result<ibv_srq_attr, Errno> {
        let mut a = ibv_srq_attr::default();
        // SAFETY: live SRQ, `a` valid.
        Errno::check(unsafe { (self.pd.v().f.query_srq)(self.srq.as_ptr(), &mut a) })?;
        Ok(a)
    }

    /// Posts receives (see [`post_recv_list`]).
    pub(crate) fn post_recv(&self, wrs: &[RecvDesc<'_>]) -> Result<(), PostError> {
        post_recv_list(wrs, |first, bad| {
            // SAFETY: the inline `ibv_post_srq_recv`: the driver's function
            // from the ops table, on a live SRQ with a valid WR list.
            unsafe {
                match (*self.pd.dev.ctx()).ops.post_srq_recv {
                    Some(f) => f(self.srq.as_ptr(), first, bad),
                    None => libc::ENOSYS,
                }
            }
        })
    }
}

/// A receive work request: its id and scatter list.
pub(crate) struct RecvDesc<'a> {
    pub wr_id: u64,
    pub sges: &'a [ibv_sge],
}

/// Where the remote side of a send work request is.
pub(crate) enum Remote<'a> {
    /// SEND and local operations.
    None,
    /// RDMA WRITE/READ.
    Rdma { addr: u64, rkey: u32 },
    /// Atomics.
    Atomic {
        addr: u64,
        compare_add: u64,
        swap: u64,
        rkey: u32,
    },
    /// UD.
    Ud { ah: &'a Ah, qpn: u32, qkey: u32 },
    /// A type 2 window bind.
    Bind {
        mw: &'a Arc<Mw>,
        rkey: u32,
        mr: &'a Arc<Mr>,
        addr: u64,
        len: u64,
        access: u32,
    },
}

/// A send work request.
pub(crate) struct SendDesc<'a> {
    pub wr_id: u64,
    /// `IBV_WR_*`.
    pub opcode: u32,
    /// `IBV_SEND_*`.
    pub flags: u32,
    /// Immediate data (network order) or the R_Key to invalidate.
    pub imm_or_inv: u32,
    pub sges: &'a [ibv_sge],
    pub remote: Remote<'a>,
}

/// A post that stopped at work request `index` (those before it were
/// posted) with `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PostError {
    pub index: usize,
    pub errno: Errno,
}

/// What the bind WRs among `posted` (handed to the driver) did to their
/// windows: each has its new R_Key (the next bind of it starts from
/// there) and keeps its MR alive. A bind that then completes in error
/// leaves the window as it was on the device; its next bind fails too,
/// as after a failed `ibv_bind_mw`.
fn bound(posted: &[SendDesc<'_>]) {
    for w in posted {
        if let Remote::Bind { mw, rkey, mr, .. } = w.remote {
            mw.set_rkey(rkey);
            mw.bound_to(mr);
        }
    }
}

/// Index of `bad` in `list`, or 0 when it points elsewhere.
fn index_of<T>(list: &[T], bad: *const T) -> usize {
    let base = list.as_ptr() as usize;
    let size = std::mem::size_of::<T>().max(1);
    (bad as usize)
        .checked_sub(base)
        .map(|off| off / size)
        .filter(|i| *i < list.len())
        .unwrap_or(0)
}

/// Links `wrs` as `ibv_recv_wr`s and posts them with `post`.
fn post_recv_list(
    wrs: &[RecvDesc<'_>],
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
) -> Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut list: Vec<ibv_recv_wr> = wrs
        .iter()
        .map(|w| ibv_recv_wr {
            wr_id: w.wr_id,
            next: std::ptr::null_mut(),
            // The library only reads the list.
            sg_list: w.sges.as_ptr().cast_mut(),
            num_sge: c_int::try_from(w.sges.len()).unwrap_or(c_int::MAX),
        })
        .collect();
    let base = list.as_mut_ptr();
    for i in 1..list.len() {
        // SAFETY: `i` is in bounds; the vector is not resized after this.
        list[i - 1].next = unsafe { base.add(i) };
    }
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    if rc == 0 {
        return Ok(());
    }
    Err(PostError {
        index: index_of(&list, bad),
        errno: Errno(rc.abs()),
    })
}

/// What a QP is created with.
pub(crate) struct QpCreate<'a> {
    /// `IBV_QPT_*`.
    pub qp_type: u32,
    pub send_cq: &'a Arc<Cq>,
    pub recv_cq: &'a Arc<Cq>,
    pub srq: Option<&'a Arc<Srq>>,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: bool,
    /// Comes back in the QP's asynchronous events.
    pub qp_context: u64,
}

/// A queue pair.
pub(crate) struct Qp {
    pd: Arc<Pd>,
    qp: NonNull<ibv_qp>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
}

// SAFETY: see `Device`.
unsafe impl Send for Qp {}
// SAFETY: see `Device`.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by `Qp::new`, destroyed once, before its CQs,
        // SRQ and PD (fields and `Arc`s released after this); its events
        // were acknowledged when read.
        let rc = unsafe { (self.pd.v().f.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.dev.name, "ibv_destroy_qp failed: {}", Errno(rc.abs()));
        }
    }
}

impl Qp {
    /// `ibv_create_qp`; returns the QP and the capacities the device gave.
    pub(crate) fn new(pd: &Arc<Pd>, c: &QpCreate<'_>) -> Result<(Qp, ibv_qp_cap), Errno> {
        let mut init = ibv_qp_init_attr {
            qp_context: c.qp_context as *mut c_void,
            send_cq: c.send_cq.cq.as_ptr(),
            recv_cq: c.recv_cq.cq.as_ptr(),
            srq: c.srq.map_or(std::ptr::null_mut(), |s| s.srq.as_ptr()),
            cap: c.cap,
            qp_type: c.qp_type,
            sq_sig_all: c_int::from(c.sq_sig_all),
        };
        // SAFETY: live PD, CQs and SRQ (the QP keeps them alive); the
        // context value is never dereferenced by the library.
        let qp = unsafe { (pd.v().f.create_qp)(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| Errno::last(libc::EINVAL))?;
        Ok((
            Qp {
                pd: pd.clone(),
                qp,
                _send_cq: c.send_cq.clone(),
                _recv_cq: c.recv_cq.clone(),
                _srq: c.srq.cloned(),
            },
            init.cap,
        ))
    }

    /// The QP number.
    pub(crate) fn num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is a plain field set at creation.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp` with `mask` (`IBV_QP_*`).
    pub(crate) fn modify(&self, attr: &ibv_qp_attr, mask: i32) -> Result<(), Errno> {
        let mut a = *attr;
        // SAFETY: live QP, `a` a valid attribute struct.
        Errno::check(unsafe { (self.pd.v().f.modify_qp)(self.qp.as_ptr(), &mut a, mask) })
    }

    /// `ibv_query_qp` of the attributes in `mask`.
    pub(crate) fn query(&self, mask: i32) -> Result<ibv_qp_attr, Errno> {
        let mut a = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        // SAFETY: live QP, valid out-structs.
        Errno::check(unsafe {
            (self.pd.v().f.query_qp)(self.qp.as_ptr(), &mut a, mask, &mut init)
        })?;
        Ok(a)
    }

    /// Posts send work requests in order. An inline WR's gather list is
    /// copied by the library from this process' memory at once, so each
    /// of its SGEs must lie inside one of `regions` (`EINVAL` for that WR
    /// otherwise, and nothing from it on is posted).
    pub(crate) fn post_send(
        &self,
        wrs: &[SendDesc<'_>],
        regions: &[Arc<Mr>],
    ) -> Result<(), PostError> {
        let mut list: Vec<ibv_send_wr> = Vec::with_capacity(wrs.len());
        let mut refused = None;
        for (i, w) in wrs.iter().enumerate() {
            if w.flags & IBV_SEND_INLINE != 0
                && !w.sges.iter().all(|s| {
                    regions
                        .iter()
                        .any(|r| r.covers(s.addr, u64::from(s.length)))
                })
            {
                refused = Some(PostError {
                    index: i,
                    errno: Errno(libc::EINVAL),
                });
                break;
            }
            let mut r = ibv_send_wr::zeroed();
            r.wr_id = w.wr_id;
            r.sg_list = w.sges.as_ptr().cast_mut();
            r.num_sge = c_int::try_from(w.sges.len()).unwrap_or(c_int::MAX);
            r.opcode = w.opcode;
            r.send_flags = w.flags;
            r.imm_or_inv = w.imm_or_inv;
            match w.remote {
                Remote::None => {}
                Remote::Rdma { addr, rkey } => r.set_rdma(addr, rkey),
                Remote::Atomic {
                    addr,
                    compare_add,
                    swap,
                    rkey,
                } => r.set_atomic(addr, compare_add, swap, rkey),
                Remote::Ud { ah, qpn, qkey } => r.set_ud(ah.ah.as_ptr(), qpn, qkey),
                Remote::Bind {
                    mw,
                    rkey,
                    mr,
                    addr,
                    len,
                    access,
                } => {
                    r.bind_mw = wr_bind_mw {
                        mw: mw.mw.as_ptr(),
                        rkey,
                        bind_info: ibv_mw_bind_info {
                            mr: mr.mr.as_ptr(),
                            addr,
                            length: len,
                            mw_access_flags: access,
                        },
                    }
                }
            }
            list.push(r);
        }
        if !list.is_empty() {
            let base = list.as_mut_ptr();
            for i in 1..list.len() {
                // SAFETY: `i` is in bounds; the vector is not resized after.
                list[i - 1].next = unsafe { base.add(i) };
            }
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: the inline `ibv_post_send`: the driver's function from
            // the ops table on a live QP. The list, its SGE arrays and the
            // AHs it names outlive the call; the driver copies what it
            // keeps (AVs, inline data from regions checked above).
            let rc = unsafe {
                match (*self.pd.dev.ctx()).ops.post_send {
                    Some(f) => f(self.qp.as_ptr(), base, &mut bad),
                    None => libc::ENOSYS,
                }
            };
            let posted = if rc == 0 {
                list.len()
            } else {
                index_of(&list, bad)
            };
            bound(&wrs[..posted]);
            if rc != 0 {
                return Err(PostError {
                    index: posted,
                    errno: Errno(rc.abs()),
                });
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Posts receive work requests in order.
    pub(crate) fn post_recv(&self, wrs: &[RecvDesc<'_>]) -> Result<(), PostError> {
        post_recv_list(wrs, |first, bad| {
            // SAFETY: the inline `ibv_post_recv`: the driver's function from
            // the ops table on a live QP with a valid WR list.
            unsafe {
                match (*self.pd.dev.ctx()).ops.post_recv {
                    Some(f) => f(self.qp.as_ptr(), first, bad),
                    None => libc::ENOSYS,
                }
            }
        })
    }
}

/// An address handle.
pub(crate) struct Ah {
    pd: Arc<Pd>,
    ah: NonNull<ibv_ah>,
}

// SAFETY: see `Device`.
unsafe impl Send for Ah {}
// SAFETY: see `Device`.
unsafe impl Sync for Ah {}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created by `Ah::new`, destroyed once; WRs posted with it
        // hold a copy of its address vector, not the AH.
        let rc = unsafe { (self.pd.v().f.destroy_ah)(self.ah.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.dev.name, "ibv_destroy_ah failed: {}", Errno(rc.abs()));
        }
    }
}

impl Ah {
    /// `ibv_create_ah`.
    pub(crate) fn new(pd: &Arc<Pd>, attr: &ibv_ah_attr) -> Result<Ah, Errno> {
        let mut a = *attr;
        // SAFETY: live PD, `a` valid.
        let ah = unsafe { (pd.v().f.create_ah)(pd.pd.as_ptr(), &mut a) };
        let ah = NonNull::new(ah).ok_or_else(|| Errno::last(libc::EINVAL))?;
        Ok(Ah { pd: pd.clone(), ah })
    }
}

/// An eventfd that wakes a thread sleeping in [`poll_readable`].
pub(crate) struct Waker(std::os::fd::OwnedFd);

impl Waker {
    /// A non-blocking, close-on-exec eventfd.
    pub(crate) fn new() -> std::io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Waker(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    /// Its descriptor, readable after [`Waker::wake`].
    pub(crate) fn fd(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }

    /// Makes the descriptor readable.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        let _ = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears it.
    pub(crate) fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// What `poll(2)` said of one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Nothing.
    No,
    /// Readable.
    Readable,
    /// Error, hang-up or not open: it will never be readable again.
    Broken,
}

/// Sleeps in `poll(2)` until one of `fds` is readable or broken (or
/// `timeout_ms` passes, -1: no timeout), and says which.
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> std::io::Result<Vec<Ready>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let n = libc::nfds_t::try_from(p.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `p` is a live array of `n` pollfds.
    let rc = unsafe { libc::poll(p.as_mut_ptr(), n, timeout_ms) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.iter()
        .map(|x| {
            if x.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                Ready::Broken
            } else if x.revents & libc::POLLIN != 0 {
                Ready::Readable
            } else {
                Ready::No
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_woken_waker_is_readable_until_drained() {
        let w = Waker::new().unwrap();
        assert_eq!(poll_readable(&[w.fd()], 0).unwrap(), [Ready::No]);
        w.wake();
        assert_eq!(poll_readable(&[w.fd()], 0).unwrap(), [Ready::Readable]);
        w.drain();
        assert_eq!(poll_readable(&[w.fd()], 0).unwrap(), [Ready::No]);
        assert_eq!(poll_readable(&[-1], 0).unwrap(), [Ready::No]);
    }

    #[test]
    fn a_bad_wr_pointer_names_its_index_or_zero() {
        let list = [0u64; 4];
        assert_eq!(index_of(&list, &list[2]), 2);
        assert_eq!(index_of(&list, std::ptr::null()), 0);
        let other = 0u64;
        assert_eq!(index_of(&list, &other), 0);
    }

    #[test]
    fn ud_and_rdma_fields_land_where_verbs_h_has_them() {
        let mut w = ibv_send_wr::zeroed();
        w.set_ud(0x1000 as *mut ibv_ah, 0x12_3456, 0x8001_0000);
        let base = &w as *const _ as usize;
        let at = |off: usize| {
            // SAFETY: reading bytes inside `w` (128 bytes).
            unsafe { std::ptr::read_unaligned((base + off) as *const u32) }
        };
        // wr.ud: ah at 40, remote_qpn at 48, remote_qkey at 52.
        assert_eq!((at(48), at(52)), (0x12_3456, 0x8001_0000));
        w.set_rdma(0xdead_beef_0000, 0x77);
        // wr.rdma: remote_addr at 40, rkey at 48.
        assert_eq!(at(48), 0x77);
        w.set_atomic(8, 1, 2, 0x99);
        // wr.atomic: rkey at 64.
        assert_eq!(at(64), 0x99);
    }
}
