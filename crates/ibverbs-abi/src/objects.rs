//! The objects behind the pointers handed to the application: each
//! starts with the libibverbs struct it is (`#[repr(C)]`, first field),
//! so the pointer to the one is the pointer to the other, followed by
//! what this library keeps (the daemon's handle, ...).

use crate::abi::*;

use rdma_types::Guid;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::{
    AhHandle, AsyncEvent, AsyncEventKind, CaHandle, CqHandle, EventHandler, MemBuf, MrHandle,
    PdHandle, QpHandle, SrqHandle, VerbsError,
};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The errno rdma-core answers for a refusal of this kind.
pub fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::NotSupported(_) => libc::EOPNOTSUPP,
        VerbsError::NoSuchCa => libc::ENODEV,
        VerbsError::Busy(_) => libc::EBUSY,
        VerbsError::QueueFull | VerbsError::OutOfResources(_) => libc::ENOMEM,
        VerbsError::Timeout => libc::ETIMEDOUT,
        VerbsError::BadWr { cause, .. } => errno_of(cause),
        VerbsError::InvalidHandle
        | VerbsError::InvalidArgument(_)
        | VerbsError::InvalidTransition { .. }
        | VerbsError::MissingAttribute { .. }
        | VerbsError::UnexpectedAttribute { .. }
        | VerbsError::InvalidState(_) => libc::EINVAL,
    }
}

/// The connection to the daemon, made at the first device listing.
static PROVIDER: Mutex<Option<Arc<dyn verbs::Provider>>> = Mutex::new(None);

/// The daemon's socket: `NICD_SOCKET`, else the default for this user.
fn socket_path() -> std::path::PathBuf {
    match std::env::var_os(nicd::SOCKET_ENV) {
        Some(p) if !p.is_empty() => p.into(),
        _ => nicd::default_socket(
            nicd::euid(),
            std::env::var_os("XDG_RUNTIME_DIR").map(Into::into),
        ),
    }
}

/// The daemon's client, connecting if there is none yet; `None` (after
/// one line on stderr) when no daemon answers.
pub(crate) fn provider() -> Option<Arc<dyn verbs::Provider>> {
    let mut p = lock(&PROVIDER);
    if let Some(p) = p.as_ref() {
        return Some(p.clone());
    }
    let path = socket_path();
    match nicd::NicdProvider::connect(&path) {
        Ok(c) => {
            // `MemBuf::new` in this process stays private: the
            // application's memory is moved by `mr`, not allocated here.
            MemBuf::set_shared_by_default(false);
            // The QPs in this process, on members of the daemon's shared
            // ports, as every tool's (`NICD_DATA=daemon`: in the daemon).
            let c = nicd::data_path(c, nicd::data_here());
            *p = Some(c.clone());
            Some(c)
        }
        Err(e) => {
            eprintln!(
                "libibverbs (ibverbs-abi): {e}; or set {} to its socket",
                nicd::SOCKET_ENV
            );
            None
        }
    }
}

/// A device: one of the daemon's CAs, kept for the life of the process
/// (rdma-core keeps its devices while any list or context names them).
#[repr(C)]
pub(crate) struct Device {
    pub ibv: ibv_device,
    pub guid: Guid,
}

/// Devices by first sighting; their names (`nicd0`, `nicd1`, ...) are
/// their places here.
static DEVICES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The device of CA `guid`, made on first sight.
pub(crate) fn device_of(guid: Guid) -> *mut Device {
    let mut all = lock(&DEVICES);
    for &d in all.iter() {
        let dev = d as *mut Device;
        // SAFETY: every entry is a leaked `Device`, never freed.
        if unsafe { (*dev).guid } == guid {
            return dev;
        }
    }
    let name = format!("nicd{}", all.len());
    let mut ibv = ibv_device {
        _ops: ibv_device_ops {
            _dummy1: std::ptr::null_mut(),
            _dummy2: std::ptr::null_mut(),
        },
        node_type: consts::IBV_NODE_CA,
        transport_type: consts::IBV_TRANSPORT_IB,
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    copy_str(&mut ibv.name, &name);
    copy_str(&mut ibv.dev_name, &format!("uverbs-{name}"));
    // No sysfs: paths where nothing is, so a sysfs read finds nothing.
    copy_str(&mut ibv.dev_path, &format!("/nonexistent/nicd/{name}"));
    copy_str(&mut ibv.ibdev_path, &format!("/nonexistent/nicd/{name}"));
    let dev = Box::into_raw(Box::new(Device { ibv, guid }));
    all.push(dev as usize);
    dev
}

/// The place of `dev` in the device list, if it is one of ours.
pub(crate) fn device_index(dev: *mut ibv_device) -> Option<usize> {
    lock(&DEVICES).iter().position(|&d| d == dev as usize)
}

fn copy_str(dst: &mut [std::os::raw::c_char], s: &str) {
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as std::os::raw::c_char;
    }
}

/// What an object's context value (the `Context` the daemon hands back
/// with its completions and events) stands for.
#[derive(Clone)]
pub(crate) enum Obj {
    /// A CQ: its pointer, and its channel's write end if it has one.
    Cq(usize, Option<Arc<OwnedFd>>),
    /// A QP: its pointer and number.
    Qp(usize, u32),
    /// An SRQ: its pointer.
    Srq(usize),
}

/// What a context shares with its event handler.
pub(crate) struct Shared {
    /// The async event pipe's write end (records of [`ibv_async_event`]).
    async_w: OwnedFd,
    /// Objects by context value.
    pub objs: Mutex<HashMap<u64, Obj>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh context value for an object.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A pipe, both ends close-on-exec; the read end blocking, the write
/// end not (an event nobody reads is dropped, never a stuck handler).
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both just made by pipe2, owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: a plain call on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(w.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(w.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok((r, w))
}

/// Writes one record; a full pipe drops it (the reader is far behind).
pub(crate) fn put(fd: RawFd, bytes: &[u8]) {
    // SAFETY: `bytes` is valid for reading; a record is smaller than
    // PIPE_BUF, so it is written whole or not at all.
    let _ = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

impl Shared {
    pub(crate) fn new(async_w: OwnedFd) -> Arc<Shared> {
        Arc::new(Shared {
            async_w,
            objs: Mutex::new(HashMap::new()),
        })
    }

    fn post_async(&self, element: usize, event_type: i32) {
        let mut rec = [0u8; 16];
        rec[..8].copy_from_slice(&(element as u64).to_ne_bytes());
        rec[8..12].copy_from_slice(&event_type.to_ne_bytes());
        put(self.async_w.as_raw_fd(), &rec);
    }
}

/// The handler of one context's CA: completions to the CQ's channel,
/// async events to the context's pipe, both as the pointers the
/// application knows.
pub(crate) struct Handler(pub Arc<Shared>);

impl EventHandler for Handler {
    fn on_completion(&self, cq_ctx: u64) {
        let obj = lock(&self.0.objs).get(&cq_ctx).cloned();
        if let Some(Obj::Cq(cq, Some(w))) = obj {
            put(w.as_raw_fd(), &(cq as u64).to_ne_bytes());
        }
    }

    fn on_async_event(&self, event: AsyncEvent) {
        use consts::*;
        use AsyncEventKind as K;
        let obj = lock(&self.0.objs).get(&event.ctx).cloned();
        let element = match (&obj, event.port) {
            (Some(Obj::Cq(p, _) | Obj::Qp(p, _) | Obj::Srq(p)), _) => *p,
            (None, Some(port)) => port.0 as usize,
            (None, None) => 0,
        };
        let kind = match event.kind {
            K::QpFatal => IBV_EVENT_QP_FATAL,
            K::PathMigrated => IBV_EVENT_PATH_MIG,
            K::CommEstablished => IBV_EVENT_COMM_EST,
            K::SqDrained => IBV_EVENT_SQ_DRAINED,
            K::SrqLimitReached => IBV_EVENT_SRQ_LIMIT_REACHED,
            K::CqError => IBV_EVENT_CQ_ERR,
            K::PortActive => IBV_EVENT_PORT_ACTIVE,
            K::PortDown => IBV_EVENT_PORT_ERR,
            K::LidChange => IBV_EVENT_LID_CHANGE,
            K::PkeyChange => IBV_EVENT_PKEY_CHANGE,
            K::SmChange => IBV_EVENT_SM_CHANGE,
            K::CaRemoval => IBV_EVENT_DEVICE_FATAL,
        };
        let affiliated = !matches!(
            event.kind,
            K::PortActive | K::PortDown | K::LidChange | K::PkeyChange | K::SmChange | K::CaRemoval
        );
        if affiliated && obj.is_none() {
            return; // its object is gone
        }
        self.0.post_async(element, kind);
    }
}

/// An open device: the `verbs_context` (with the `ibv_context` at its
/// end) first.
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub provider: Arc<dyn verbs::Provider>,
    pub ca: CaHandle,
    /// The PD the daemon creates CQs in (a verbs CQ lives in a PD; an
    /// ibverbs CQ in a context).
    pub cq_pd: PdHandle,
    pub shared: Arc<Shared>,
    pub async_r: OwnedFd,
    /// The daemon's objects the application holds, by id.
    pub live: Mutex<HashMap<u64, Live>>,
}

/// One of the daemon's objects an application holds, in the order
/// [`Context::release_leftovers`] releases them (children first).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Live {
    Qp(QpHandle),
    Ah(AhHandle),
    /// With the first address of its region of moved pages.
    Mr(MrHandle, u64),
    Srq(SrqHandle),
    Cq(CqHandle),
    Pd(PdHandle),
}

impl Context {
    /// Notes an object the application now holds.
    pub(crate) fn hold(&self, id: u64, what: Live) {
        lock(&self.live).insert(id, what);
    }

    /// Forgets an object the application destroyed.
    pub(crate) fn drop_held(&self, id: u64) {
        lock(&self.live).remove(&id);
        lock(&self.shared.objs).remove(&id);
    }

    /// Releases every object the application did not destroy, children
    /// first (QPs, AHs, MRs, SRQs, CQs, PDs); errors are moot here.
    pub(crate) fn release_leftovers(&self) {
        let mut left: Vec<Live> = lock(&self.live).drain().map(|(_, l)| l).collect();
        lock(&self.shared.objs).clear();
        left.sort_by_key(|l| match l {
            Live::Qp(_) => 0,
            Live::Ah(_) => 1,
            Live::Mr(..) => 2,
            Live::Srq(_) => 3,
            Live::Cq(_) => 4,
            Live::Pd(_) => 5,
        });
        let p = &self.provider;
        for l in left {
            let _ = match l {
                Live::Qp(h) => p.destroy_qp(h),
                Live::Ah(h) => p.destroy_ah(h),
                Live::Mr(h, region) => {
                    let r = p.dereg_mr(h);
                    crate::mr::release(region);
                    r
                }
                Live::Srq(h) => p.destroy_srq(h),
                Live::Cq(h) => p.destroy_cq(h),
                Live::Pd(h) => p.dealloc_pd(h),
            };
        }
    }

    /// The context of `ctx`.
    ///
    /// # Safety
    /// `ctx` is the `context` field of a live [`Context`] made by
    /// `ibv_open_device`.
    pub(crate) unsafe fn of<'a>(ctx: *mut ibv_context) -> &'a Context {
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` is at offset `off` of the
        // `verbs_context` that starts the `Context`.
        unsafe { &*(ctx.cast::<u8>().sub(off).cast::<Context>()) }
    }
}

/// A PD.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub handle: PdHandle,
    pub id: u64,
}

/// A completion channel: the application reads `ibv.fd`, the read end
/// of a pipe of CQ pointers.
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: ibv_comp_channel,
    pub r: OwnedFd,
    pub w: Arc<OwnedFd>,
}

/// A CQ.
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq,
    pub handle: CqHandle,
    pub id: u64,
}

/// An MR, and the region of moved pages it is on.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pub handle: MrHandle,
    pub region: MemBuf,
    pub id: u64,
}

/// An SRQ.
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub handle: SrqHandle,
    pub id: u64,
}

/// A QP, and the capacities it was created with (what `ibv_query_qp`
/// reports of them).
#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp,
    pub handle: QpHandle,
    pub id: u64,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: bool,
    /// Where inline sends' bytes go (a QP with `max_inline_data`).
    pub bounce: Option<Bounce>,
}

/// A QP's inline bounce buffer: registered memory in the QP's PD the
/// bytes of each inline send are copied into when it is posted, so the
/// application may send inline from any memory (a stack buffer, with no
/// L_Key, as libibverbs allows), while the daemon takes inline data only
/// from registered memory of the client. One slot per WR of a post; a
/// post returns once the daemon took the data, so slots are free again.
pub(crate) struct Bounce {
    pub buf: MemBuf,
    pub mr: verbs::MrInfo,
    /// Bytes per slot (`max_inline_data`).
    pub slot: usize,
    /// Slots (WRs of one post).
    pub slots: usize,
    /// Held from the copy to the post's return.
    pub lock: Mutex<()>,
    /// Its id in the context's held objects.
    pub id: u64,
}

/// Most inline WRs one post bounces; more go as the application gave them.
pub(crate) const BOUNCE_SLOTS: u32 = 64;

/// An AH.
#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub handle: AhHandle,
    pub id: u64,
}

/// Zeroed `pthread_mutex_t` / `pthread_cond_t` (glibc's initializers).
pub(crate) const MUTEX: pthread_mutex_t = pthread_mutex_t([0; 40]);
pub(crate) const COND: pthread_cond_t = pthread_cond_t([0; 48]);
