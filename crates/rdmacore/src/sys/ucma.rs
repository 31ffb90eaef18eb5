//! The kernel's RDMA CM driven directly through `/dev/infiniband/rdma_cm`
//! (the `rdma_ucm` module's command interface, `rdma_user_cm.h`): a
//! command is a `write(2)` of a header and its struct, its answer written
//! by the kernel where the command's `response` points.
//!
//! Not librdmacm: librdmacm opens a verbs context of every device an id
//! is bound to and keeps it until the device leaves the device list, and
//! Linux takes a device off that list only after every such context is
//! closed, so a process using librdmacm holds a removed rxe forever. The
//! commands need no verbs context at all; the consumer's QP lives on the
//! provider's own context, and the kernel's CM only learns its number.

use super::raw::ibv_qp_attr;
use super::{set_nonblocking, Errno};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::raw::c_void;
use std::sync::Arc;

/// The command device (`rdma_ucm`).
pub const RDMA_CM_DEVICE: &str = "/dev/infiniband/rdma_cm";

/// `RDMA_PS_TCP`: the port space of Linux ib_srp's and ib_srpt's logins.
const RDMA_PS_TCP: u16 = 0x0106;
/// `IB_QPT_RC`.
const QPT_RC: u8 = 2;
/// `RDMA_MAX_PRIVATE_DATA`.
const MAX_PRIVATE: usize = 256;

/// `enum` of `rdma_user_cm.h`'s commands (those used here).
mod cmd {
    pub const CREATE_ID: u32 = 0;
    pub const DESTROY_ID: u32 = 1;
    pub const RESOLVE_ROUTE: u32 = 4;
    pub const CONNECT: u32 = 6;
    pub const LISTEN: u32 = 7;
    pub const ACCEPT: u32 = 8;
    pub const REJECT: u32 = 9;
    pub const DISCONNECT: u32 = 10;
    pub const INIT_QP_ATTR: u32 = 11;
    pub const GET_EVENT: u32 = 12;
    pub const QUERY: u32 = 19;
    pub const BIND: u32 = 20;
    pub const RESOLVE_ADDR: u32 = 21;
}

/// `RDMA_USER_CM_QUERY_ADDR`.
const QUERY_ADDR: u32 = 0;

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

#[repr(C)]
#[derive(Clone, Copy)]
struct CmdHdr {
    cmd: u32,
    in_len: u16,
    out_len: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CreateId {
    uid: u64,
    response: u64,
    ps: u16,
    qp_type: u8,
    reserved: [u8; 5],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct IdOnly {
    /// `response` of DESTROY_ID, INIT_QP_ATTR, QUERY (0 where unused).
    response: u64,
    id: u32,
    /// DESTROY_ID: reserved; INIT_QP_ATTR: qp_state; QUERY: option.
    arg: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Bind {
    id: u32,
    addr_size: u16,
    reserved: u16,
    addr: libc::sockaddr_storage,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ResolveAddr {
    id: u32,
    timeout_ms: u32,
    src_size: u16,
    dst_size: u16,
    reserved: u32,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

/// `struct rdma_ucm_listen` and `struct rdma_ucm_resolve_route`: an id
/// and one `u32` (backlog, timeout).
#[repr(C)]
#[derive(Clone, Copy)]
struct IdArg {
    id: u32,
    arg: u32,
}

/// `struct rdma_ucm_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ConnParam {
    qp_num: u32,
    qkey: u32,
    private_data: [u8; MAX_PRIVATE],
    private_data_len: u8,
    srq: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    valid: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Ece {
    vendor_id: u32,
    attr_mod: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Connect {
    conn_param: ConnParam,
    id: u32,
    reserved: u32,
    ece: Ece,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Accept {
    uid: u64,
    conn_param: ConnParam,
    id: u32,
    reserved: u32,
    ece: Ece,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Reject {
    id: u32,
    private_data_len: u8,
    reason: u8,
    reserved: [u8; 2],
    private_data: [u8; MAX_PRIVATE],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct GetEvent {
    response: u64,
}

/// `struct rdma_ucm_event_resp` (its `param` union is at least the UD
/// param's 304 bytes; only the conn param is read).
#[repr(C)]
#[derive(Clone, Copy)]
struct EventResp {
    uid: u64,
    id: u32,
    event: u32,
    status: i32,
    conn: ConnParam,
    /// The rest of the UD param.
    _ud: [u8; 32],
    reserved: u32,
    ece: Ece,
}

/// `struct rdma_ucm_query_addr_resp`.
#[repr(C)]
#[derive(Clone, Copy)]
struct QueryAddrResp {
    node_guid: u64,
    port_num: u8,
    reserved: u8,
    pkey: u16,
    src_size: u16,
    dst_size: u16,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
    ibdev_index: u32,
    reserved1: u32,
}

/// `struct ib_uverbs_global_route` and `struct ib_uverbs_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UverbsAh {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    reserved: u8,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
    reserved2: u8,
}

/// `struct ib_uverbs_qp_attr` (what INIT_QP_ATTR answers).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UverbsQpAttr {
    qp_attr_mask: u32,
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    ah_attr: UverbsAh,
    alt_ah_attr: UverbsAh,
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    reserved: [u8; 5],
}

/// An all-zero value of a plain C struct of this module.
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the `repr(C)` structs above, made of integers,
    // byte arrays and `sockaddr_storage`, for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// A `struct sockaddr_in` / `sockaddr_in6` for `a`, and its size.
fn sockaddr_of(a: SocketAddr) -> (libc::sockaddr_storage, u16) {
    let mut s: libc::sockaddr_storage = zeroed();
    let size = match a {
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
            std::mem::size_of::<libc::sockaddr_in>()
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
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, size as u16)
}

/// The address in `s`, if it is IPv4 or IPv6.
fn socket_addr_of(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
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

/// The command channel: `/dev/infiniband/rdma_cm` opened once, the ids
/// made on it, and the descriptor a thread sleeps on for their events.
pub(crate) struct Channel {
    fd: OwnedFd,
}

/// One event, read from the channel.
pub(crate) struct Event {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// Its status (an errno, negated, or a REJ reason).
    pub status: i32,
    /// The id it is about (for a connect request: the new id).
    pub id: u32,
    /// The `uid` the id was made with (for a connect request: the
    /// listening id's).
    pub uid: u64,
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
    /// Opens the command device, non-blocking.
    pub(crate) fn open() -> Result<Arc<Channel>, std::io::Error> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(RDMA_CM_DEVICE)?;
        let fd = OwnedFd::from(f);
        set_nonblocking(fd.as_raw_fd()).map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
        Ok(Arc::new(Channel { fd }))
    }

    /// The descriptor, readable when an event waits.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Writes command `cmd` with `body`, whose answer (if any) the kernel
    /// writes where the body's `response` points (`out` bytes).
    fn command<T: Copy>(&self, cmd: u32, body: &T, out: usize) -> Result<(), Errno> {
        #[repr(C)]
        struct Msg<T> {
            hdr: CmdHdr,
            body: T,
        }
        let msg = Msg {
            hdr: CmdHdr {
                cmd,
                in_len: std::mem::size_of::<T>() as u16,
                out_len: out as u16,
            },
            body: *body,
        };
        let len = std::mem::size_of::<Msg<T>>();
        // SAFETY: writes `len` bytes of a live, initialised `Msg` (its
        // padding, if any, was never read by the kernel: `in_len` covers
        // the body as laid out).
        let rc = unsafe { libc::write(self.fd(), (&msg as *const Msg<T>).cast::<c_void>(), len) };
        if rc < 0 {
            return Err(Errno::last(libc::EINVAL));
        }
        Ok(())
    }

    /// The next event; `None` when none waits.
    pub(crate) fn next_event(self: &Arc<Self>) -> Option<Event> {
        let mut r: EventResp = zeroed();
        let ask = GetEvent {
            response: (&mut r as *mut EventResp) as u64,
        };
        self.command(cmd::GET_EVENT, &ask, std::mem::size_of::<EventResp>())
            .ok()?;
        let len = usize::from(r.conn.private_data_len).min(MAX_PRIVATE);
        Some(Event {
            kind: r.event,
            status: r.status,
            id: r.id,
            uid: r.uid,
            private_data: r.conn.private_data[..len].to_vec(),
            qp_num: r.conn.qp_num,
            initiator_depth: r.conn.initiator_depth,
            responder_resources: r.conn.responder_resources,
            // The kernel made a new id for the request; it is nobody's
            // but this event's.
            request: (r.event == event::CONNECT_REQUEST).then(|| Id {
                ch: self.clone(),
                id: r.id,
            }),
        })
    }

    /// A new id on this channel, in the TCP port space, tagged `uid`.
    pub(crate) fn create_id(self: &Arc<Self>, uid: u64) -> Result<Id, Errno> {
        let mut resp = 0u32;
        let c = CreateId {
            uid,
            response: (&mut resp as *mut u32) as u64,
            ps: RDMA_PS_TCP,
            qp_type: QPT_RC,
            reserved: [0; 5],
        };
        self.command(cmd::CREATE_ID, &c, 4)?;
        Ok(Id {
            ch: self.clone(),
            id: resp,
        })
    }
}

/// An id, destroyed on drop (its pending events go with it).
pub(crate) struct Id {
    ch: Arc<Channel>,
    id: u32,
}

impl Drop for Id {
    fn drop(&mut self) {
        let mut events = 0u32;
        let d = IdOnly {
            response: (&mut events as *mut u32) as u64,
            id: self.id,
            arg: 0,
        };
        if let Err(e) = self.ch.command(cmd::DESTROY_ID, &d, 4) {
            tracing::warn!("destroying RDMA CM id {}: {e}", self.id);
        }
    }
}

/// A conn param with `private_data` (at most 256 bytes: longer is cut).
fn conn_param(
    private_data: &[u8],
    qp_num: u32,
    responder_resources: u8,
    initiator_depth: u8,
) -> ConnParam {
    let len = private_data.len().min(MAX_PRIVATE);
    let mut pd = [0u8; MAX_PRIVATE];
    pd[..len].copy_from_slice(&private_data[..len]);
    ConnParam {
        qp_num,
        qkey: 0,
        private_data: pd,
        private_data_len: len as u8,
        srq: 0,
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        valid: 1,
    }
}

impl Id {
    /// The kernel's number of the id, as its events name it.
    pub(crate) fn key(&self) -> u32 {
        self.id
    }

    fn query_addr(&self) -> Result<QueryAddrResp, Errno> {
        let mut r: QueryAddrResp = zeroed();
        let q = IdOnly {
            response: (&mut r as *mut QueryAddrResp) as u64,
            id: self.id,
            arg: QUERY_ADDR,
        };
        self.ch
            .command(cmd::QUERY, &q, std::mem::size_of::<QueryAddrResp>())?;
        Ok(r)
    }

    /// The node GUID (host order) of the device the id is bound to, once
    /// it is (after binding to a device's address or resolving one).
    pub(crate) fn device_guid(&self) -> Option<u64> {
        self.query_addr()
            .ok()
            .map(|r| u64::from_be(r.node_guid))
            .filter(|g| *g != 0)
    }

    /// The peer's address.
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        socket_addr_of(&self.query_addr().ok()?.dst)
    }

    /// Binds to `addr` and listens with `backlog`.
    pub(crate) fn bind_listen(&self, addr: SocketAddr, backlog: u32) -> Result<(), Errno> {
        let (sa, size) = sockaddr_of(addr);
        let b = Bind {
            id: self.id,
            addr_size: size,
            reserved: 0,
            addr: sa,
        };
        self.ch.command(cmd::BIND, &b, 0)?;
        self.ch.command(
            cmd::LISTEN,
            &IdArg {
                id: self.id,
                arg: backlog,
            },
            0,
        )
    }

    /// Starts resolving `dst` from `src`.
    pub(crate) fn resolve_addr(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Result<(), Errno> {
        let ((s, ss), (d, ds)) = (sockaddr_of(src), sockaddr_of(dst));
        let r = ResolveAddr {
            id: self.id,
            timeout_ms,
            src_size: ss,
            dst_size: ds,
            reserved: 0,
            src: s,
            dst: d,
        };
        self.ch.command(cmd::RESOLVE_ADDR, &r, 0)
    }

    /// Starts resolving the route.
    pub(crate) fn resolve_route(&self, timeout_ms: u32) -> Result<(), Errno> {
        self.ch.command(
            cmd::RESOLVE_ROUTE,
            &IdArg {
                id: self.id,
                arg: timeout_ms,
            },
            0,
        )
    }

    /// Sends the REQ naming QP `qp_num`.
    pub(crate) fn connect(
        &self,
        private_data: &[u8],
        qp_num: u32,
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<(), Errno> {
        let c = Connect {
            conn_param: conn_param(private_data, qp_num, responder_resources, initiator_depth),
            id: self.id,
            reserved: 0,
            ece: Ece::default(),
        };
        self.ch.command(cmd::CONNECT, &c, 0)
    }

    /// Sends the REP naming QP `qp_num`; the id's later events carry
    /// `uid`.
    pub(crate) fn accept(
        &self,
        uid: u64,
        private_data: &[u8],
        qp_num: u32,
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<(), Errno> {
        let a = Accept {
            uid,
            conn_param: conn_param(private_data, qp_num, responder_resources, initiator_depth),
            id: self.id,
            reserved: 0,
            ece: Ece::default(),
        };
        self.ch.command(cmd::ACCEPT, &a, 0)
    }

    /// Sends the RTU of a REP this side received (an ACCEPT without a
    /// conn param, as librdmacm's `rdma_establish`).
    pub(crate) fn establish(&self) -> Result<(), Errno> {
        let mut a: Accept = zeroed();
        a.id = self.id;
        self.ch.command(cmd::ACCEPT, &a, 0)
    }

    /// Sends a consumer-defined REJ.
    pub(crate) fn reject(&self, private_data: &[u8]) -> Result<(), Errno> {
        let len = private_data.len().min(MAX_PRIVATE);
        let mut r = Reject {
            id: self.id,
            private_data_len: len as u8,
            reason: 0,
            reserved: [0; 2],
            private_data: [0; MAX_PRIVATE],
        };
        r.private_data[..len].copy_from_slice(&private_data[..len]);
        self.ch.command(cmd::REJECT, &r, 0)
    }

    /// Sends a DREQ, or the DREP of one received.
    pub(crate) fn disconnect(&self) -> Result<(), Errno> {
        self.ch.command(
            cmd::DISCONNECT,
            &IdArg {
                id: self.id,
                arg: 0,
            },
            0,
        )
    }

    /// The QP attributes the kernel's CM gives a QP entering `state` (a
    /// `raw::qp_state`), in verbs' layout.
    pub(crate) fn qp_attr(&self, state: u32) -> Result<ibv_qp_attr, Errno> {
        let mut k = UverbsQpAttr::default();
        let q = IdOnly {
            response: (&mut k as *mut UverbsQpAttr) as u64,
            id: self.id,
            arg: state,
        };
        self.ch
            .command(cmd::INIT_QP_ATTR, &q, std::mem::size_of::<UverbsQpAttr>())?;
        let mut a = ibv_qp_attr {
            qp_state: state,
            path_mtu: k.path_mtu,
            qkey: k.qkey,
            rq_psn: k.rq_psn,
            sq_psn: k.sq_psn,
            dest_qp_num: k.dest_qp_num,
            qp_access_flags: k.qp_access_flags,
            pkey_index: k.pkey_index,
            max_rd_atomic: k.max_rd_atomic,
            max_dest_rd_atomic: k.max_dest_rd_atomic,
            min_rnr_timer: k.min_rnr_timer,
            port_num: k.port_num,
            timeout: k.timeout,
            retry_cnt: k.retry_cnt,
            rnr_retry: k.rnr_retry,
            ..Default::default()
        };
        a.ah_attr.grh.dgid.raw = k.ah_attr.dgid;
        a.ah_attr.grh.sgid_index = k.ah_attr.sgid_index;
        a.ah_attr.grh.hop_limit = k.ah_attr.hop_limit;
        a.ah_attr.dlid = k.ah_attr.dlid;
        a.ah_attr.is_global = k.ah_attr.is_global;
        a.ah_attr.port_num = k.ah_attr.port_num;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn addresses_round_trip_through_sockaddr() {
        for a in ["10.0.0.2:5555", "[fe80::1]:4791", "[::ffff:1.2.3.4]:1"] {
            let a: SocketAddr = a.parse().unwrap();
            let (s, size) = sockaddr_of(a);
            assert_eq!(socket_addr_of(&s), Some(a));
            assert_eq!(usize::from(size), if a.is_ipv4() { 16 } else { 28 });
        }
    }

    /// The sizes and offsets of rdma_user_cm.h and ib_user_verbs.h that
    /// the kernel reads and writes.
    #[test]
    fn the_structs_have_the_kernels_layout() {
        assert_eq!(size_of::<CmdHdr>(), 8);
        assert_eq!(size_of::<CreateId>(), 24);
        assert_eq!(size_of::<IdOnly>(), 16);
        assert_eq!(size_of::<Bind>(), 8 + 128);
        assert_eq!(size_of::<ResolveAddr>(), 16 + 256);
        assert_eq!(size_of::<ConnParam>(), 8 + 256 + 8);
        assert_eq!(size_of::<Connect>(), 272 + 8 + 8);
        assert_eq!(size_of::<Accept>(), 8 + 272 + 8 + 8);
        assert_eq!(size_of::<Reject>(), 8 + 256);
        // uid, id, event, status, the 304-byte param union, reserved, ece.
        assert_eq!(offset_of!(EventResp, conn), 20);
        assert_eq!(offset_of!(EventResp, reserved), 20 + 304);
        assert_eq!(size_of::<EventResp>(), 336);
        assert_eq!(offset_of!(QueryAddrResp, src), 16);
        assert_eq!(size_of::<QueryAddrResp>(), 16 + 256 + 8);
        assert_eq!(size_of::<UverbsAh>(), 32);
        assert_eq!(offset_of!(UverbsQpAttr, ah_attr), 40);
        assert_eq!(offset_of!(UverbsQpAttr, pkey_index), 124);
        assert_eq!(offset_of!(UverbsQpAttr, timeout), 134);
        assert_eq!(size_of::<UverbsQpAttr>(), 144);
    }
}
