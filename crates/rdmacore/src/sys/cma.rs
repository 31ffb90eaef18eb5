//! librdmacm, opened with `dlopen` like libibverbs: its ABI (what
//! `rdma_cma.h` fixes of `struct rdma_cm_id`, `struct rdma_cm_event` and
//! `struct rdma_conn_param`), the functions used, and safe owners of an
//! event channel and its ids.
//!
//! An id's QP is never the library's: the consumer's QP lives on the
//! provider's own context, and the kernel's CM is told its number
//! (`rdma_conn_param.qp_num`); the QP's attributes for RTR and RTS are
//! read with `rdma_init_qp_attr`, so its PSNs are the ones the kernel's
//! REQ and REP announce.

use super::loader::Verbs;
use super::raw::{ibv_context, ibv_device, ibv_qp_attr};
use super::{set_nonblocking, Errno};
use libloading::Library;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

/// librdmacm's SONAME since rdma-core's first release (ABI 1).
pub const LIBRDMACM: &str = "librdmacm.so.1";

/// `RDMA_PS_TCP`: the port space of Linux ib_srp's and ib_srpt's logins.
const RDMA_PS_TCP: c_int = 0x0106;

/// `struct rdma_event_channel`: its first member is the descriptor.
#[repr(C)]
struct RawChannel {
    fd: c_int,
}

/// The head of `struct rdma_cm_id` (the library allocates it; only these
/// fields and the route's addresses are read).
#[repr(C)]
struct RawId {
    verbs: *mut ibv_context,
    channel: *mut RawChannel,
    context: *mut c_void,
    qp: *mut c_void,
    /// `route.addr.src_storage` then `route.addr.dst_storage`.
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

/// `struct rdma_cm_event` (its `param` union is at least a conn param).
#[repr(C)]
struct RawEvent {
    id: *mut RawId,
    listen_id: *mut RawId,
    event: c_int,
    status: c_int,
    conn: RawConnParam,
}

/// `enum rdma_cm_event_type`.
#[allow(missing_docs)]
pub(crate) mod event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ADDR_ERROR: u32 = 1;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const ROUTE_ERROR: u32 = 3;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_RESPONSE: u32 = 5;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const DEVICE_REMOVAL: u32 = 11;
}

/// Why librdmacm could not be used: one line naming what to install.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmLoadError {
    /// Not installed.
    #[error(
        "cannot load {library}: {reason}; install rdma-core's connection manager library \
         (Debian/Ubuntu: apt-get install librdmacm1; Fedora/RHEL: dnf install librdmacm)"
    )]
    Missing {
        /// What was loaded.
        library: String,
        /// The loader's words.
        reason: String,
    },
    /// Too old, or not librdmacm.
    #[error("{library} has no {symbol} ({reason}): rdma-core 17 or later is needed")]
    Symbol {
        /// What was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's words.
        reason: String,
    },
}

macro_rules! cma_fns {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        struct Fns {
            $( $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl Fns {
            fn load(lib: &Library, library: &str) -> Result<Fns, CmLoadError> {
                Ok(Fns {
                    $( $field: {
                        // SAFETY: the symbol is librdmacm's function of
                        // that name, whose prototype (rdma_cma.h) is the
                        // declared type; used only while `Cma` keeps the
                        // library loaded.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!($sym, "\0").as_bytes(),
                            )
                        };
                        *s.map_err(|e| CmLoadError::Symbol {
                            library: library.to_string(),
                            symbol: $sym,
                            reason: e.to_string(),
                        })?
                    }, )*
                })
            }
        }
    };
}

cma_fns! {
    create_event_channel = "rdma_create_event_channel": fn() -> *mut RawChannel;
    destroy_event_channel = "rdma_destroy_event_channel": fn(*mut RawChannel) -> ();
    create_id = "rdma_create_id": fn(*mut RawChannel, *mut *mut RawId, *mut c_void, c_int) -> c_int;
    destroy_id = "rdma_destroy_id": fn(*mut RawId) -> c_int;
    bind_addr = "rdma_bind_addr": fn(*mut RawId, *const libc::sockaddr) -> c_int;
    listen = "rdma_listen": fn(*mut RawId, c_int) -> c_int;
    resolve_addr = "rdma_resolve_addr": fn(*mut RawId, *const libc::sockaddr, *const libc::sockaddr, c_int) -> c_int;
    resolve_route = "rdma_resolve_route": fn(*mut RawId, c_int) -> c_int;
    connect = "rdma_connect": fn(*mut RawId, *const RawConnParam) -> c_int;
    accept = "rdma_accept": fn(*mut RawId, *const RawConnParam) -> c_int;
    reject = "rdma_reject": fn(*mut RawId, *const c_void, u8) -> c_int;
    establish = "rdma_establish": fn(*mut RawId) -> c_int;
    disconnect = "rdma_disconnect": fn(*mut RawId) -> c_int;
    init_qp_attr = "rdma_init_qp_attr": fn(*mut RawId, *mut ibv_qp_attr, *mut c_int) -> c_int;
    get_cm_event = "rdma_get_cm_event": fn(*mut RawChannel, *mut *mut RawEvent) -> c_int;
    ack_cm_event = "rdma_ack_cm_event": fn(*mut RawEvent) -> c_int;
}

/// librdmacm, loaded.
pub(crate) struct Cma {
    f: Fns,
    /// libibverbs (librdmacm links the same one), for the device GUID.
    verbs: Arc<Verbs>,
    /// Last: the pointers above are valid while it is loaded.
    _lib: Library,
}

impl Cma {
    /// Loads `library` and every function used here.
    pub(crate) fn load(library: &str, verbs: Arc<Verbs>) -> Result<Arc<Cma>, CmLoadError> {
        // SAFETY: loading librdmacm (and the libibverbs it links, already
        // loaded) runs their constructors, which set up only their own
        // state.
        let lib = unsafe { Library::new(library) }.map_err(|e| CmLoadError::Missing {
            library: library.to_string(),
            reason: e.to_string(),
        })?;
        let f = Fns::load(&lib, library)?;
        Ok(Arc::new(Cma {
            f,
            verbs,
            _lib: lib,
        }))
    }
}

/// A `struct sockaddr_in` / `sockaddr_in6` for `a`.
fn sockaddr_of(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: an all-zero sockaddr_storage is valid (family AF_UNSPEC).
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    s
}

/// The address in `s`, if it is IPv4 or IPv6.
fn socket_addr_of(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match c_int::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip, u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = IpAddr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// An event channel: the descriptor a thread sleeps on, and the ids made
/// on it.
pub(crate) struct Channel {
    cma: Arc<Cma>,
    ch: NonNull<RawChannel>,
}

// SAFETY: librdmacm's calls are thread safe; the channel is destroyed
// only on drop, after every id (each holds an `Arc<Channel>`).
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: made by `Channel::new`, destroyed once, no id left.
        unsafe { (self.cma.f.destroy_event_channel)(self.ch.as_ptr()) };
    }
}

/// One event, copied out and acknowledged.
pub(crate) struct Event {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// Its status (an errno, negated, or a REJ reason).
    pub status: i32,
    /// The id it is about (for a connect request: the new id).
    pub id: usize,
    /// The listening id of a connect request.
    pub listen_id: usize,
    /// The private data it carried.
    pub private_data: Vec<u8>,
    /// The conn param's QP number (the peer's, on a REP or a REQ).
    pub qp_num: u32,
    /// The conn param's initiator depth (from this side's view).
    pub initiator_depth: u8,
    /// The conn param's responder resources (from this side's view).
    pub responder_resources: u8,
    /// A connect request's new id, owned from here on.
    pub request: Option<Id>,
}

impl Channel {
    /// A new, non-blocking channel.
    pub(crate) fn new(cma: &Arc<Cma>) -> Result<Arc<Channel>, Errno> {
        // SAFETY: no arguments; NULL on failure with errno set.
        let ch = unsafe { (cma.f.create_event_channel)() };
        let ch = NonNull::new(ch).ok_or_else(|| Errno::last(libc::ENODEV))?;
        let c = Arc::new(Channel {
            cma: cma.clone(),
            ch,
        });
        set_nonblocking(c.fd())?;
        Ok(c)
    }

    /// The descriptor, readable when an event waits.
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is its first member.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The next event, acknowledged; `None` when none waits.
    pub(crate) fn next_event(self: &Arc<Self>) -> Option<Event> {
        let mut ev: *mut RawEvent = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-pointer; the channel is live and
        // non-blocking.
        let rc = unsafe { (self.cma.f.get_cm_event)(self.ch.as_ptr(), &mut ev) };
        if rc != 0 || ev.is_null() {
            return None;
        }
        // SAFETY: the library returned a live event, valid until acked;
        // its private data (when any) is `private_data_len` bytes.
        let e = unsafe {
            let r = &*ev;
            let pd = if r.conn.private_data.is_null() || r.conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    r.conn.private_data.cast::<u8>(),
                    usize::from(r.conn.private_data_len),
                )
                .to_vec()
            };
            Event {
                kind: r.event as u32,
                status: r.status,
                id: r.id as usize,
                listen_id: r.listen_id as usize,
                private_data: pd,
                qp_num: r.conn.qp_num,
                initiator_depth: r.conn.initiator_depth,
                responder_resources: r.conn.responder_resources,
                // The kernel made a new id for the request; it is
                // nobody's but this event's.
                request: if r.event as u32 == event::CONNECT_REQUEST {
                    NonNull::new(r.id).map(|id| Id {
                        ch: self.clone(),
                        id,
                    })
                } else {
                    None
                },
            }
        };
        // SAFETY: acknowledged once, not used after.
        unsafe { (self.cma.f.ack_cm_event)(ev) };
        Some(e)
    }

    /// A new id on this channel, in the TCP port space.
    pub(crate) fn create_id(self: &Arc<Self>) -> Result<Id, Errno> {
        let mut id: *mut RawId = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the channel is live.
        let rc = unsafe {
            (self.cma.f.create_id)(self.ch.as_ptr(), &mut id, std::ptr::null_mut(), RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(Errno::last(libc::ENOMEM));
        }
        let id = NonNull::new(id).ok_or(Errno(libc::ENOMEM))?;
        Ok(Id {
            ch: self.clone(),
            id,
        })
    }
}

/// An `rdma_cm_id`, destroyed on drop (which waits until every event of
/// it was acknowledged; [`Channel::next_event`] acknowledges each at once).
pub(crate) struct Id {
    ch: Arc<Channel>,
    id: NonNull<RawId>,
}

// SAFETY: librdmacm's calls on an id are thread safe; it is freed only on
// drop.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: the id is live and destroyed once.
        let rc = unsafe { (self.f().destroy_id)(self.id.as_ptr()) };
        if rc != 0 {
            tracing::warn!("rdma_destroy_id failed: {}", Errno::last(libc::EINVAL));
        }
    }
}

/// A conn param with `private_data` (at most 255 bytes: longer is cut).
fn conn_param(
    private_data: &[u8],
    qp_num: u32,
    responder_resources: u8,
    initiator_depth: u8,
    srq: bool,
) -> RawConnParam {
    RawConnParam {
        private_data: private_data.as_ptr().cast(),
        private_data_len: u8::try_from(private_data.len()).unwrap_or(u8::MAX),
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: u8::from(srq),
        qp_num,
    }
}

fn check(rc: c_int, fallback: i32) -> Result<(), Errno> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::last(fallback))
    }
}

impl Id {
    fn f(&self) -> &Fns {
        &self.ch.cma.f
    }

    /// Its address, as events name it.
    pub(crate) fn key(&self) -> usize {
        self.id.as_ptr() as usize
    }

    /// The node GUID (host order) of the device the id is bound to, once
    /// it is (after binding to a device's address or resolving one).
    pub(crate) fn device_guid(&self) -> Option<u64> {
        // SAFETY: the id is live; `verbs` is NULL or the library's context
        // of the device, whose first member is its `ibv_device`.
        unsafe {
            let ctx = (*self.id.as_ptr()).verbs;
            if ctx.is_null() {
                return None;
            }
            let dev = *(ctx as *const *mut ibv_device);
            (!dev.is_null()).then(|| u64::from_be((self.ch.cma.verbs.f.get_device_guid)(dev)))
        }
    }

    /// The peer's address (`rdma_get_peer_addr`).
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; the route's addresses are inline.
        socket_addr_of(unsafe { &(*self.id.as_ptr()).dst })
    }

    /// Binds to `addr` (`rdma_bind_addr`) and listens with `backlog`.
    pub(crate) fn bind_listen(&self, addr: SocketAddr, backlog: i32) -> Result<(), Errno> {
        let sa = sockaddr_of(addr);
        // SAFETY: a live id and a sockaddr of its family's size.
        let rc = unsafe {
            (self.f().bind_addr)(
                self.id.as_ptr(),
                (&sa as *const libc::sockaddr_storage).cast(),
            )
        };
        check(rc, libc::EADDRINUSE)?;
        // SAFETY: a live, bound id.
        let rc = unsafe { (self.f().listen)(self.id.as_ptr(), backlog) };
        check(rc, libc::EINVAL)
    }

    /// Starts resolving `dst` from `src` (`rdma_resolve_addr`).
    pub(crate) fn resolve_addr(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), Errno> {
        let (s, d) = (sockaddr_of(src), sockaddr_of(dst));
        // SAFETY: a live id and two sockaddrs of their family's size.
        let rc = unsafe {
            (self.f().resolve_addr)(
                self.id.as_ptr(),
                (&s as *const libc::sockaddr_storage).cast(),
                (&d as *const libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        };
        check(rc, libc::EINVAL)
    }

    /// Starts resolving the route (`rdma_resolve_route`).
    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> Result<(), Errno> {
        // SAFETY: a live id with a resolved address.
        let rc = unsafe { (self.f().resolve_route)(self.id.as_ptr(), timeout_ms) };
        check(rc, libc::EINVAL)
    }

    /// Sends the REQ (`rdma_connect`) naming QP `qp_num`.
    pub(crate) fn connect(
        &self,
        private_data: &[u8],
        qp_num: u32,
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<(), Errno> {
        let p = conn_param(
            private_data,
            qp_num,
            responder_resources,
            initiator_depth,
            false,
        );
        // SAFETY: a live id; `p` and its private data outlive the call
        // (the library copies them).
        let rc = unsafe { (self.f().connect)(self.id.as_ptr(), &p) };
        check(rc, libc::EINVAL)
    }

    /// Sends the REP (`rdma_accept`) naming QP `qp_num`.
    pub(crate) fn accept(
        &self,
        private_data: &[u8],
        qp_num: u32,
        responder_resources: u8,
        initiator_depth: u8,
        srq: bool,
    ) -> Result<(), Errno> {
        let p = conn_param(
            private_data,
            qp_num,
            responder_resources,
            initiator_depth,
            srq,
        );
        // SAFETY: as `connect`.
        let rc = unsafe { (self.f().accept)(self.id.as_ptr(), &p) };
        check(rc, libc::EINVAL)
    }

    /// Sends a consumer-defined REJ (`rdma_reject`).
    pub(crate) fn reject(&self, private_data: &[u8]) -> Result<(), Errno> {
        let len = u8::try_from(private_data.len()).unwrap_or(u8::MAX);
        // SAFETY: a live id; `len` bytes of `private_data` are readable.
        let rc = unsafe { (self.f().reject)(self.id.as_ptr(), private_data.as_ptr().cast(), len) };
        check(rc, libc::EINVAL)
    }

    /// Sends the RTU (`rdma_establish`).
    pub(crate) fn establish(&self) -> Result<(), Errno> {
        // SAFETY: a live id that received a REP.
        let rc = unsafe { (self.f().establish)(self.id.as_ptr()) };
        check(rc, libc::EINVAL)
    }

    /// Sends a DREQ, or the DREP of one received (`rdma_disconnect`).
    pub(crate) fn disconnect(&self) -> Result<(), Errno> {
        // SAFETY: a live id.
        let rc = unsafe { (self.f().disconnect)(self.id.as_ptr()) };
        check(rc, libc::EINVAL)
    }

    /// The QP attributes the kernel's CM gives a QP entering `state`
    /// (`rdma_init_qp_attr`; a `raw::qp_state`).
    pub(crate) fn qp_attr(&self, state: u32) -> Result<ibv_qp_attr, Errno> {
        let mut a = ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: a live id and valid out-pointers.
        let rc = unsafe { (self.f().init_qp_attr)(self.id.as_ptr(), &mut a, &mut mask) };
        check(rc, libc::EINVAL)?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_sockaddr() {
        for a in ["10.0.0.2:5555", "[fe80::1]:4791", "[::ffff:1.2.3.4]:1"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(socket_addr_of(&sockaddr_of(a)), Some(a));
        }
    }

    #[test]
    fn the_id_head_has_rdma_cma_h_offsets() {
        // verbs, channel, context, qp, then route.addr.src_storage at 32
        // and dst_storage at 160 (rdma_get_peer_addr).
        assert_eq!(std::mem::offset_of!(RawId, src), 32);
        assert_eq!(std::mem::offset_of!(RawId, dst), 160);
        // id, listen_id, event, status, then the conn param at 24.
        assert_eq!(std::mem::offset_of!(RawEvent, conn), 24);
        // private_data, seven u8 fields, then qp_num aligned to 4.
        assert_eq!(std::mem::offset_of!(RawConnParam, qp_num), 16);
    }

    #[test]
    fn a_missing_library_names_the_package_in_one_line() {
        let e = CmLoadError::Missing {
            library: LIBRDMACM.into(),
            reason: "librdmacm.so.1: cannot open shared object file".into(),
        };
        let m = e.to_string();
        assert!(m.starts_with("cannot load librdmacm.so.1: "), "{m}");
        assert!(m.contains("apt-get install librdmacm1"), "{m}");
        assert!(!m.contains('\n'), "{m}");
    }
}
