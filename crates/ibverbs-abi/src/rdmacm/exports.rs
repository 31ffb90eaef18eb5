//! librdmacm's functions, exported unversioned as `ibverbs_abi_<name>`;
//! crates/rdmacm-abi's `librdmacm.so.1` gives them rdma-core's names and
//! versions ([`EXPORTS`] is the list both sides check).
//!
//! librdmacm's conventions: an `int` function answers 0, or -1 with
//! `errno` set; a pointer function NULL with `errno` set. What is not
//! supported answers -1 with `ENOSYS` (rdma-core's word for a call its
//! build lacks) or `EOPNOTSUPP` (a case of a supported call this
//! library refuses), never a crash. Every body runs under
//! `catch_unwind`: a bug here fails the call with `EIO`.
//!
//! # Safety (of every function here)
//! The caller keeps librdmacm's contract: every pointer is NULL where
//! allowed or valid for what `<rdma/rdma_cma.h>` says, and ids, channels
//! and events are ones this library made and has not freed.

#![allow(clippy::missing_safety_doc)]

use super::abi::consts::*;
use super::abi::*;
use super::*;
use crate::abi::{ibv_context, ibv_pd, ibv_qp, ibv_qp_init_attr};
use crate::objects::{Context, Qp};
use rdma_access::{ConnQp, QpParams};
use rdma_mad::cm::{CmaHdrRepr, CMA_HDR_LEN};
use rdma_types::{AccessFlags, PortNum, Psn, QpState};
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::time::Duration;
use verbs::{Provider, QpAttr};

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`: `Err(errno)` becomes -1 with `errno` set; a panic -1 with
/// `EIO`.
fn int(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// Runs `f`: `Err(errno)` or a panic becomes NULL with `errno` set.
fn ptr<T>(f: impl FnOnce() -> Result<*mut T, c_int>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            set_errno(e);
            null_mut()
        }
        Err(_) => {
            set_errno(libc::EIO);
            null_mut()
        }
    }
}

/// The id behind `id`.
///
/// # Safety
/// `id` is NULL or an id of ours.
unsafe fn id_of<'a>(id: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    if id.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: every `rdma_cm_id` of ours starts an `Id`.
    Ok(unsafe { &mut *id.cast::<Id>() })
}

// ---- channels and events ---------------------------------------------------

#[export_name = "ibverbs_abi_rdma_create_event_channel"]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ptr(|| {
        let inner = ChannelInner::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
        let ch = Box::new(Channel {
            ibv: rdma_event_channel {
                fd: inner.r.as_raw_fd(),
            },
            inner,
        });
        Ok(Box::into_raw(ch).cast())
    })
}

#[export_name = "ibverbs_abi_rdma_destroy_event_channel"]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    if ch.is_null() {
        return;
    }
    // SAFETY: a channel of ours, destroyed once (contract); ids still on
    // it keep its shared part alive.
    drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
}

#[export_name = "ibverbs_abi_rdma_get_cm_event"]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    int(|| {
        if ch.is_null() || event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a channel of ours (contract).
        let inner = unsafe { (*ch.cast::<Channel>()).inner.clone() };
        let e = inner.take()?;
        // SAFETY: a valid out pointer (contract); `e` a live event.
        unsafe {
            *event = e.cast();
            let id = (*e).ev.id;
            if !id.is_null() {
                (*id).event = e.cast();
            }
        }
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_ack_cm_event"]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    int(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an event of ours, acked once (contract).
        drop(unsafe { Box::from_raw(event.cast::<Event>()) });
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_event_str"]
pub unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    static NAMES: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    static UNKNOWN: &std::ffi::CStr = c"UNKNOWN EVENT";
    let names = NAMES.get_or_init(|| {
        EVENT_NAMES
            .iter()
            .map(|n| std::ffi::CString::new(*n).expect("no NUL in a name"))
            .collect()
    });
    usize::try_from(event)
        .ok()
        .and_then(|i| names.get(i))
        .map_or(UNKNOWN.as_ptr(), |n| n.as_ptr())
}

// ---- ids -------------------------------------------------------------------

#[export_name = "ibverbs_abi_rdma_create_id"]
pub unsafe extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    int(|| {
        if ch.is_null() || out.is_null() {
            // librdmacm makes a synchronous id without a channel: not here.
            return Err(if ch.is_null() {
                libc::EOPNOTSUPP
            } else {
                libc::EINVAL
            });
        }
        if ps != RDMA_PS_TCP {
            warn(format_args!(
                "port space {ps:#x} is not supported: only RDMA_PS_TCP (RC connections)"
            ));
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: a channel of ours (contract).
        let inner = unsafe { (*ch.cast::<Channel>()).inner.clone() };
        let id = new_id(ch, inner, context, ps);
        // SAFETY: a valid out pointer (contract).
        unsafe { *out = id };
        Ok(())
    })
}

/// A new id on channel `ch`.
fn new_id(
    ch: *mut rdma_event_channel,
    channel: Arc<ChannelInner>,
    context: *mut c_void,
    ps: c_int,
) -> *mut rdma_cm_id {
    // SAFETY: all-zero is a valid `rdma_route` (addresses of no family,
    // NULL path).
    let route: rdma_route = unsafe { std::mem::zeroed() };
    let inner = Arc::new(IdInner {
        ptr: 0,
        channel,
        st: Mutex::new(IdState {
            alive: true,
            ..Default::default()
        }),
    });
    let id = Box::into_raw(Box::new(Id {
        ibv: rdma_cm_id {
            verbs: null_mut(),
            channel: ch,
            context,
            qp: null_mut(),
            route,
            ps,
            port_num: 0,
            event: null_mut(),
            send_cq_channel: null_mut(),
            send_cq: null_mut(),
            recv_cq_channel: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            pd: null_mut(),
            qp_type: crate::abi::consts::IBV_QPT_RC,
        },
        inner,
    }));
    // The address is known only now: the shared part gets it before
    // anyone else sees the id.
    // SAFETY: just made; nobody else holds the `Arc` yet.
    unsafe {
        let i = Arc::get_mut(&mut (*id).inner).expect("a fresh Arc");
        i.ptr = id as usize;
    }
    id.cast()
}

#[export_name = "ibverbs_abi_rdma_destroy_id"]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let inner = i.inner.clone();
        let (conn, incoming, listening) = {
            let mut st = lock(&inner.st);
            st.alive = false;
            inner.channel.purge(inner.ptr);
            let conn = if st.ended { None } else { st.conn.take() };
            (conn, st.incoming.take(), st.listening.take())
        };
        if let Some(l) = listening {
            l.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some((_, inc)) = incoming {
            inc.reject(Vec::new());
        }
        if let Some(c) = conn {
            // A connected id sends its DREQ as it goes (as ib_cm does).
            c.agent.disconnect(c.conn);
        }
        // SAFETY: an id of ours, destroyed once (contract).
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_set_option"]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    int(|| {
        // SAFETY: contract.
        unsafe { id_of(id)? };
        match (level, optname) {
            // Type of service, address reuse, IPv6 only, ACK timeout:
            // taken, without effect on the soft NIC (one traffic class;
            // the path's packet lifetime gives the ACK timeout).
            (
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS
                | RDMA_OPTION_ID_REUSEADDR
                | RDMA_OPTION_ID_AFONLY
                | RDMA_OPTION_ID_ACK_TIMEOUT,
            ) => Ok(()),
            _ => Err(libc::ENOSYS),
        }
    })
}

// ---- addresses and routes --------------------------------------------------

#[export_name = "ibverbs_abi_rdma_bind_addr"]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        // SAFETY: a socket address (contract).
        let a = unsafe { sockaddr_in(addr) }.ok_or(libc::EAFNOSUPPORT)?;
        if !a.ip().is_unspecified() {
            let (agent, _) = owner(a.ip())?;
            i.ibv.verbs = context_of(agent.ca_guid())?;
            i.ibv.port_num = 1;
        }
        write_sockaddr(&mut i.ibv.route.addr.src, a);
        lock(&i.inner.st).bound = Some(a);
        Ok(())
    })
}

/// The agent whose CA has address `ip`, and the GID's index.
fn owner(ip: IpAddr) -> Result<(Arc<CmAgent>, u8), c_int> {
    let agents = agents()?;
    let gid = rdma_types::Gid::from_ip(ip);
    for a in agents {
        if let Some(i) = a.gids().iter().position(|g| *g == gid) {
            return Ok((a, i as u8));
        }
    }
    warn(format_args!(
        "no NIC of the daemon has address {ip}: start one with `nicd --ip {ip}` \
         or use an address `ibv_devinfo -v` lists as a GID"
    ));
    Err(libc::EADDRNOTAVAIL)
}

#[export_name = "ibverbs_abi_rdma_resolve_addr"]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        // SAFETY: socket addresses (contract).
        let dst = unsafe { sockaddr_in(dst) }.ok_or(libc::EINVAL)?;
        let bound = lock(&i.inner.st).bound;
        // SAFETY: as above.
        let src = unsafe { sockaddr_in(src) }.or(bound);
        let agents = agents()?;
        let r = match rdma_access::rdmacm::resolve_addr(&agents, dst.ip(), src.map(|s| s.ip())) {
            Ok(r) => r,
            Err(e) => {
                warn(format_args!(
                    "resolve {dst}: {e} (the daemon's NICs are the addresses `nicd --ip` \
                     serves)"
                ));
                i.inner.post(
                    RDMA_CM_EVENT_ADDR_ERROR,
                    EventArgs {
                        status: -libc::EADDRNOTAVAIL,
                        ..Default::default()
                    },
                );
                return Ok(());
            }
        };
        i.ibv.verbs = context_of(r.ca)?;
        i.ibv.port_num = 1;
        let port = src.map_or(0, |s| s.port());
        write_sockaddr(&mut i.ibv.route.addr.src, SocketAddr::new(r.src, port));
        write_sockaddr(&mut i.ibv.route.addr.dst, dst);
        i.ibv.route.addr.ibaddr = rdma_ib_addr {
            sgid: crate::abi::ibv_gid { raw: r.sgid.0 },
            dgid: crate::abi::ibv_gid { raw: r.dgid.0 },
            pkey: 0xffffu16.to_be(),
        };
        i.inner
            .post_with(RDMA_CM_EVENT_ADDR_RESOLVED, EventArgs::default(), |s| {
                s.resolved = Some(r)
            });
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_resolve_route"]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let r = lock(&i.inner.st).resolved.ok_or(libc::EINVAL)?;
        let agent = agent_of(r.ca)?;
        let path = match rdma_access::rdmacm::resolve_route(&agent, &r) {
            Ok(p) => p,
            Err(e) => {
                warn(format_args!("route to {}: {e}", r.dst));
                i.inner.post(
                    RDMA_CM_EVENT_ROUTE_ERROR,
                    EventArgs {
                        status: -libc::EHOSTUNREACH,
                        ..Default::default()
                    },
                );
                return Ok(());
            }
        };
        let mut rec = Box::new(ibv_sa_path_rec {
            dgid: crate::abi::ibv_gid { raw: path.dgid.0 },
            sgid: crate::abi::ibv_gid { raw: path.sgid.0 },
            hop_limit: 64,
            reversible: 1,
            numb_path: 1,
            pkey: path.pkey.0.to_be(),
            mtu_selector: 2,
            mtu: path.mtu.code(),
            rate_selector: 2,
            packet_life_time_selector: 2,
            packet_life_time: path.packet_life_time.value(),
            ..Default::default()
        });
        i.ibv.route.path_rec = &mut *rec;
        i.ibv.route.num_paths = 1;
        i.inner.post_with(
            RDMA_CM_EVENT_ROUTE_RESOLVED,
            EventArgs::default(),
            move |s| s.path = Some((path, rec)),
        );
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_get_src_port"]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: contract.
    match unsafe { id_of(id) } {
        Ok(i) => read_sockaddr(&i.ibv.route.addr.src).map_or(0, |a| a.port().to_be()),
        Err(_) => 0,
    }
}

#[export_name = "ibverbs_abi_rdma_get_dst_port"]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: contract.
    match unsafe { id_of(id) } {
        Ok(i) => read_sockaddr(&i.ibv.route.addr.dst).map_or(0, |a| a.port().to_be()),
        Err(_) => 0,
    }
}

// ---- QPs -------------------------------------------------------------------

#[export_name = "ibverbs_abi_rdma_create_qp"]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a valid init struct (contract).
        unsafe { create_qp(i, pd, &mut *attr) }
    })
}

/// `rdma_create_qp` on id `i`: the QP made by `ibv_create_qp` and taken
/// to INIT (as librdmacm does, so receives may be posted before the
/// connection).
///
/// # Safety
/// `pd` NULL or a PD of ours; `attr` valid.
unsafe fn create_qp(i: &mut Id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let guid = guid_of_context(i.ibv.verbs).ok_or(libc::EINVAL)?;
    if !i.ibv.qp.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        warn(format_args!(
            "rdma_create_qp without CQs is not supported: create them with ibv_create_cq"
        ));
        return Err(libc::EOPNOTSUPP);
    }
    if attr.qp_type != crate::abi::consts::IBV_QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    let pd = if pd.is_null() { default_pd(guid)? } else { pd };
    // SAFETY: per the contract.
    let qp = unsafe { crate::exports::ibv_create_qp(pd, attr) };
    if qp.is_null() {
        // SAFETY: the calling thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    // SAFETY: a QP just made.
    let (ctx, h) = unsafe { (Context::of(i.ibv.verbs), (*qp.cast::<Qp>()).handle) };
    let init = ctx.provider.modify_qp(
        h,
        &QpAttr {
            state: Some(QpState::Init),
            port: Some(PortNum(1)),
            pkey_index: Some(0),
            access: Some(
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            ),
            ..Default::default()
        },
    );
    if let Err(e) = init {
        // SAFETY: the QP just made, destroyed once.
        unsafe { crate::exports::ibv_destroy_qp(qp) };
        return Err(crate::errno_of(&e));
    }
    // SAFETY: the QP just made.
    unsafe { (*qp).state = crate::exports::qp_state_code(QpState::Init) };
    i.ibv.qp = qp;
    i.ibv.pd = pd;
    Ok(())
}

#[export_name = "ibverbs_abi_rdma_create_qp_ex"]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex_head,
) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a valid init struct (contract).
        let a = unsafe { &*attr };
        if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            // The extended QP (ibv_wr_* posting, ...) is not supported.
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            null_mut()
        };
        let mut plain = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: as `rdma_create_qp`.
        unsafe { create_qp(i, pd, &mut plain)? };
        // The capacities the QP got, as the caller's struct reports them.
        // SAFETY: a valid init struct (contract).
        unsafe { (*attr).cap = plain.cap };
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_destroy_qp"]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: contract.
    if let Ok(i) = unsafe { id_of(id) } {
        if !i.ibv.qp.is_null() {
            // SAFETY: the id's QP, destroyed once.
            unsafe { crate::exports::ibv_destroy_qp(i.ibv.qp) };
            i.ibv.qp = null_mut();
        }
    }
}

/// The QP of id `i`, as the CM readies it: `param`'s READ depths (librdmacm's
/// defaults without one).
fn conn_qp(i: &Id, param: *const rdma_conn_param) -> Result<(ConnQp, u32), c_int> {
    if i.ibv.qp.is_null() {
        warn(format_args!(
            "connecting an id without a QP is not supported: create it with rdma_create_qp"
        ));
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: an id with a context of ours and a QP of ours.
    let (ctx, q) = unsafe { (Context::of(i.ibv.verbs), &*i.ibv.qp.cast::<Qp>()) };
    let mut params = QpParams::DEFAULT;
    if !param.is_null() {
        // SAFETY: a valid param (contract).
        let p = unsafe { &*param };
        params.responder_resources = p.responder_resources;
        params.initiator_depth = p.initiator_depth;
        params.retry_count = p.retry_count.min(7);
        params.rnr_retry_count = p.rnr_retry_count.min(7);
    }
    let provider: Arc<dyn Provider> = ctx.provider.clone();
    Ok((
        ConnQp {
            params,
            ..ConnQp::new(provider, q.handle)
        },
        q.ibv.qp_num,
    ))
}

/// The private data of `param`.
fn private_of(param: *const rdma_conn_param) -> Vec<u8> {
    if param.is_null() {
        return Vec::new();
    }
    // SAFETY: a valid param whose data has its length (contract).
    unsafe {
        let p = &*param;
        if p.private_data.is_null() || p.private_data_len == 0 {
            return Vec::new();
        }
        std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len as usize)
            .to_vec()
    }
}

/// A first PSN: 24 bits that differ from run to run.
fn fresh_psn() -> Psn {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Psn::new((t ^ std::process::id().rotate_left(8)) & 0xff_ffff)
}

/// The QP's state field, after a transition the CM made.
fn note_rts(i: &Id) {
    if !i.ibv.qp.is_null() {
        // SAFETY: the id's QP.
        unsafe { (*i.ibv.qp).state = crate::exports::qp_state_code(QpState::Rts) };
    }
}

// ---- connecting ----------------------------------------------------------------

/// How long a connect waits for its answer at most (the CM's own REQ
/// retries end it sooner when nobody answers).
const CONNECT_WAIT: Duration = Duration::from_secs(60);

#[export_name = "ibverbs_abi_rdma_connect"]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let (path, r) = {
            let st = lock(&i.inner.st);
            match (&st.path, &st.resolved) {
                (Some((p, _)), Some(r)) => (*p, *r),
                _ => return Err(libc::EINVAL),
            }
        };
        if i.ibv.qp.is_null() {
            return connect_own_qp(i, param, path, r);
        }
        let (qp, qpn) = conn_qp(i, param)?;
        let agent = agent_of(r.ca)?;
        let dst = read_sockaddr(&i.ibv.route.addr.dst).ok_or(libc::EINVAL)?;
        // An ephemeral source port, as the kernel gives one at connect.
        let mut src = read_sockaddr(&i.ibv.route.addr.src).ok_or(libc::EINVAL)?;
        if src.port() == 0 {
            src.set_port(0xc000 | (qpn as u16 & 0x3fff));
            write_sockaddr(&mut i.ibv.route.addr.src, src);
        }
        let pd = req_private(src, dst, param)?;
        let inner = i.inner.clone();
        let qp_ptr = i.ibv.qp as usize;
        let psn = fresh_psn();
        std::thread::Builder::new()
            .name("rdmacm connect".into())
            .spawn(move || {
                let sid = rdma_access::rdmacm::service_id(dst.port());
                let res = agent.connect_qp(&path, sid, &qp, psn, pd, CONNECT_WAIT);
                connected(&inner, &agent, qp_ptr, &qp, res);
            })
            .map_err(|_| libc::EAGAIN)?;
        Ok(())
    })
}

/// The REQ's private data: the `cma_hdr` from `src` to `dst`, then the
/// application's.
fn req_private(
    src: SocketAddr,
    dst: SocketAddr,
    param: *const rdma_conn_param,
) -> Result<Vec<u8>, c_int> {
    let user = private_of(param);
    if user.len() > 92 - CMA_HDR_LEN {
        return Err(libc::EINVAL);
    }
    let ip_bytes = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    let hdr = CmaHdrRepr {
        cma_version: 0,
        ip_version: if dst.is_ipv4() { 4 } else { 6 },
        src_port: src.port(),
        src_addr: ip_bytes(src.ip()),
        dst_addr: ip_bytes(dst.ip()),
    };
    let mut pd = vec![0u8; CMA_HDR_LEN];
    hdr.emit(&mut pd);
    pd.extend_from_slice(&user);
    Ok(pd)
}

/// `rdma_connect` of an id without a QP: the REQ names the
/// application's QP (`param->qp_num`); the REP gives `CONNECT_RESPONSE`,
/// after which the application readies its QP with
/// `rdma_init_qp_attr`. The CM sends the RTU on the REP already, so
/// `rdma_establish` has nothing left to send.
fn connect_own_qp(
    i: &mut Id,
    param: *mut rdma_conn_param,
    path: Path,
    r: Resolved,
) -> Result<(), c_int> {
    if param.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a valid param (contract).
    let p = unsafe { *param };
    if p.qp_num == 0 {
        return Err(libc::EINVAL);
    }
    let agent = agent_of(r.ca)?;
    let dst = read_sockaddr(&i.ibv.route.addr.dst).ok_or(libc::EINVAL)?;
    let mut src = read_sockaddr(&i.ibv.route.addr.src).ok_or(libc::EINVAL)?;
    if src.port() == 0 {
        src.set_port(0xc000 | (p.qp_num as u16 & 0x3fff));
        write_sockaddr(&mut i.ibv.route.addr.src, src);
    }
    let pd = req_private(src, dst, param)?;
    let inner = i.inner.clone();
    let psn = fresh_psn();
    std::thread::Builder::new()
        .name("rdmacm connect".into())
        .spawn(move || {
            let sid = rdma_access::rdmacm::service_id(dst.port());
            let qpn = rdma_types::Qpn::from_bits(p.qp_num);
            let res = agent.connect_path(&path, sid, qpn, psn, pd, CONNECT_WAIT);
            let est = match res {
                Ok(est) => est,
                Err(e) => return connect_failed(&inner, e),
            };
            note_conn(agent.ca_guid(), est.conn, &inner);
            let own = SelfQp {
                peer: path.dgid,
                mtu: path.mtu,
                remote_qpn: est.remote_qpn.value(),
                rq_psn: psn,
                sq_psn: est.remote_psn,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                timeout: 14,
                retry: p.retry_count.min(7),
                rnr_retry: p.rnr_retry_count.min(7),
            };
            let conn = Conn {
                agent: agent.clone(),
                conn: est.conn,
            };
            let a = EventArgs {
                private: est.private_data,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                qp_num: est.remote_qpn.value(),
                ..Default::default()
            };
            inner.post_with(RDMA_CM_EVENT_CONNECT_RESPONSE, a, move |s| {
                s.conn = Some(conn);
                s.established = true;
                s.self_qp = Some(own);
            });
        })
        .map_err(|_| libc::EAGAIN)?;
    Ok(())
}

/// The end of a connect: `ESTABLISHED`, or why not.
fn connected(
    inner: &Arc<IdInner>,
    agent: &Arc<CmAgent>,
    qp_ptr: usize,
    qp: &ConnQp,
    res: Result<rdma_access::Established, rdma_access::CmError>,
) {
    match res {
        Ok(est) => {
            note_conn(agent.ca_guid(), est.conn, inner);
            let alive = lock(&inner.st).alive;
            if !alive {
                agent.disconnect(est.conn);
                return;
            }
            // SAFETY: the id is alive, so is its QP (destroying the QP
            // of a connecting id is the application's error).
            unsafe { (*(qp_ptr as *mut ibv_qp)).state = 3 };
            let conn = Conn {
                agent: agent.clone(),
                conn: est.conn,
            };
            let a = EventArgs {
                private: est.private_data,
                responder_resources: qp.params.responder_resources,
                initiator_depth: qp.params.initiator_depth,
                retry_count: qp.params.retry_count,
                rnr_retry_count: qp.params.rnr_retry_count,
                qp_num: est.remote_qpn.value(),
                ..Default::default()
            };
            inner.post_with(RDMA_CM_EVENT_ESTABLISHED, a, move |s| {
                s.conn = Some(conn);
                s.established = true;
            });
        }
        Err(e) => connect_failed(inner, e),
    }
}

/// A connect that did not establish: `REJECTED` (the REJ's reason and
/// private data), `UNREACHABLE` (no answer), or `CONNECT_ERROR`.
fn connect_failed(inner: &Arc<IdInner>, e: rdma_access::CmError) {
    use rdma_access::CmError as E;
    match e {
        E::Rejected {
            code, private_data, ..
        } => inner.post(
            RDMA_CM_EVENT_REJECTED,
            EventArgs {
                // librdmacm's status of a REJ on IB: its reason.
                status: code as i32,
                private: private_data,
                ..Default::default()
            },
        ),
        E::TimedOut => inner.post(
            RDMA_CM_EVENT_UNREACHABLE,
            EventArgs {
                status: -libc::ETIMEDOUT,
                ..Default::default()
            },
        ),
        e => {
            warn(format_args!("connect: {e}"));
            let status = match &e {
                E::Verbs { err, .. } => -crate::errno_of(err),
                E::DeviceRemoved => -libc::ENODEV,
                _ => -libc::ECONNREFUSED,
            };
            inner.post(
                RDMA_CM_EVENT_CONNECT_ERROR,
                EventArgs {
                    status,
                    ..Default::default()
                },
            )
        }
    }
}

// ---- listening ---------------------------------------------------------------

#[export_name = "ibverbs_abi_rdma_listen"]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let bound = lock(&i.inner.st).bound.ok_or(libc::EINVAL)?;
        let port = if bound.port() == 0 {
            // An ephemeral port, as the kernel gives one.
            let p = 0xc000 | (fresh_psn().value() as u16 & 0x3fff);
            let a = SocketAddr::new(bound.ip(), p);
            write_sockaddr(&mut i.ibv.route.addr.src, a);
            lock(&i.inner.st).bound = Some(a);
            p
        } else {
            bound.port()
        };
        let agents: Vec<Arc<CmAgent>> = if bound.ip().is_unspecified() {
            agents()?
        } else {
            vec![owner(bound.ip())?.0]
        };
        let on = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut rxs = Vec::new();
        for a in &agents {
            let sid = rdma_access::rdmacm::service_id(port);
            match a.try_listen(sid) {
                Ok(rx) => rxs.push((a.clone(), rx)),
                Err(e) => {
                    warn(format_args!(
                        "listen on port {port}: {e} (another process listens there?)"
                    ));
                    return Err(libc::EADDRINUSE);
                }
            }
        }
        lock(&i.inner.st).listening = Some(on.clone());
        let ch = i.ibv.channel as usize;
        let ctx = i.ibv.context as usize;
        for (agent, rx) in rxs {
            let inner = i.inner.clone();
            let on = on.clone();
            std::thread::Builder::new()
                .name(format!("rdmacm listen {port}"))
                .spawn(move || listener(inner, agent, rx, on, port, ch, ctx))
                .map_err(|_| libc::EAGAIN)?;
        }
        Ok(())
    })
}

/// A listen's thread: each REQ a new id and a `CONNECT_REQUEST`, until
/// the listening id is destroyed (looked at every 100 ms).
fn listener(
    listen: Arc<IdInner>,
    agent: Arc<CmAgent>,
    rx: std::sync::mpsc::Receiver<Incoming>,
    on: Arc<std::sync::atomic::AtomicBool>,
    port: u16,
    ch: usize,
    ctx: usize,
) {
    use std::sync::atomic::Ordering;
    while on.load(Ordering::SeqCst) {
        let inc = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(i) => i,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(_) => return,
        };
        let req = match rdma_access::rdmacm::decode(inc) {
            Ok(r) => r,
            Err((inc, e)) => {
                warn(format_args!("{e}: refused"));
                inc.reject(Vec::new());
                continue;
            }
        };
        let guid = agent.ca_guid();
        let verbs = match context_of(guid) {
            Ok(c) => c,
            Err(_) => {
                req.incoming.reject(Vec::new());
                continue;
            }
        };
        let id = new_id(
            ch as *mut rdma_event_channel,
            listen.channel.clone(),
            ctx as *mut c_void,
            RDMA_PS_TCP,
        );
        // SAFETY: just made, not yet seen by the application.
        let child = unsafe { &mut *id.cast::<Id>() };
        child.ibv.verbs = verbs;
        child.ibv.port_num = 1;
        let local = SocketAddr::new(ip_of_gid(agent.gid()), port);
        write_sockaddr(&mut child.ibv.route.addr.src, local);
        write_sockaddr(&mut child.ibv.route.addr.dst, req.src);
        child.ibv.route.addr.ibaddr = rdma_ib_addr {
            sgid: crate::abi::ibv_gid { raw: agent.gid().0 },
            dgid: crate::abi::ibv_gid {
                raw: req.incoming.peer.0,
            },
            pkey: req.incoming.pkey.0.to_be(),
        };
        let inc = req.incoming;
        let a = EventArgs {
            listen_id: listen.ptr,
            private: req.private_data,
            responder_resources: inc.params.responder_resources,
            initiator_depth: inc.params.initiator_depth,
            retry_count: inc.params.retry_count,
            rnr_retry_count: inc.params.rnr_retry_count,
            qp_num: inc.remote_qpn.value(),
            ..Default::default()
        };
        // The event goes on the listener's channel, for the new id; if
        // the listener went meanwhile, so does the request.
        let alive = lock(&listen.st).alive;
        if !alive {
            inc.reject(Vec::new());
            // SAFETY: the id made above, never handed out.
            drop(unsafe { Box::from_raw(id.cast::<Id>()) });
            return;
        }
        let own = SelfQp {
            peer: inc.peer,
            mtu: if inc.mtu.bytes() < agent.mtu().bytes() {
                inc.mtu
            } else {
                agent.mtu()
            },
            remote_qpn: inc.remote_qpn.value(),
            rq_psn: fresh_psn(),
            sq_psn: inc.remote_psn,
            responder_resources: inc.params.initiator_depth.min(16),
            initiator_depth: inc.params.responder_resources.min(16),
            timeout: inc.timing.local_ack_timeout().value(),
            retry: inc.params.retry_count.min(7),
            rnr_retry: inc.params.rnr_retry_count.min(7),
        };
        let agent2 = agent.clone();
        child
            .inner
            .post_with(RDMA_CM_EVENT_CONNECT_REQUEST, a, move |s| {
                s.incoming = Some((agent2, inc));
                s.self_qp = Some(own);
            });
    }
}

#[export_name = "ibverbs_abi_rdma_accept"]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        if i.ibv.qp.is_null() {
            return accept_own_qp(i, param);
        }
        let (qp, _) = conn_qp(i, param)?;
        let (agent, inc) = lock(&i.inner.st).incoming.take().ok_or(libc::EINVAL)?;
        let private = private_of(param);
        let conn = inc.conn;
        // Known before the REP goes: the RTU may come at once.
        note_conn(agent.ca_guid(), conn, &i.inner);
        lock(&i.inner.st).conn = Some(Conn {
            agent: agent.clone(),
            conn,
        });
        match inc.accept_qp(&qp, fresh_psn(), private) {
            Ok(()) => {
                note_rts(i);
                Ok(())
            }
            Err(e) => {
                warn(format_args!("accept: {e}"));
                lock(&i.inner.st).conn = None;
                Err(match e {
                    rdma_access::CmError::Verbs { err, .. } => crate::errno_of(&err),
                    _ => libc::ECONNABORTED,
                })
            }
        }
    })
}

/// `rdma_accept` of an id without a QP: the REP names the
/// application's QP (`param->qp_num`), which it readied itself with
/// `rdma_init_qp_attr`; `ESTABLISHED` comes with the RTU.
fn accept_own_qp(i: &mut Id, param: *mut rdma_conn_param) -> Result<(), c_int> {
    if param.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a valid param (contract).
    let p = unsafe { *param };
    let (own, taken) = {
        let mut st = lock(&i.inner.st);
        (st.self_qp, st.incoming.take())
    };
    let (Some(own), Some((agent, inc))) = (own, taken) else {
        return Err(libc::EINVAL);
    };
    if p.qp_num == 0 {
        lock(&i.inner.st).incoming = Some((agent, inc));
        return Err(libc::EINVAL);
    }
    let conn = inc.conn;
    note_conn(agent.ca_guid(), conn, &i.inner);
    lock(&i.inner.st).conn = Some(Conn {
        agent: agent.clone(),
        conn,
    });
    let mine = QpParams {
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: 7,
        rnr_retry_count: p.rnr_retry_count.min(7),
    };
    let qpn = rdma_types::Qpn::from_bits(p.qp_num);
    if inc.accept_offering(qpn, own.rq_psn, mine, private_of(param)) {
        Ok(())
    } else {
        lock(&i.inner.st).conn = None;
        Err(libc::ECONNABORTED)
    }
}

#[export_name = "ibverbs_abi_rdma_init_qp_attr"]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut crate::abi::ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    int(|| {
        use crate::abi::consts::*;
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a valid attr (contract).
        let a = unsafe { &mut *attr };
        let own = lock(&i.inner.st).self_qp;
        let m = match (a.qp_state, own) {
            // INIT as ib_cm's: port 1, P_Key index 0, remote access.
            (1, _) => {
                a.pkey_index = 0;
                a.port_num = 1;
                a.qp_access_flags = (AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ)
                    .bits();
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
            }
            (2, Some(o)) => {
                a.ah_attr = crate::abi::ibv_ah_attr {
                    grh: crate::abi::ibv_global_route {
                        dgid: crate::abi::ibv_gid { raw: o.peer.0 },
                        hop_limit: 64,
                        ..Default::default()
                    },
                    is_global: 1,
                    port_num: 1,
                    ..Default::default()
                };
                a.path_mtu = o.mtu.code() as c_int;
                a.dest_qp_num = o.remote_qpn;
                a.rq_psn = o.rq_psn.value();
                a.max_dest_rd_atomic = o.responder_resources;
                a.min_rnr_timer = 12;
                IBV_QP_STATE
                    | IBV_QP_AV
                    | IBV_QP_PATH_MTU
                    | IBV_QP_DEST_QPN
                    | IBV_QP_RQ_PSN
                    | IBV_QP_MAX_DEST_RD_ATOMIC
                    | IBV_QP_MIN_RNR_TIMER
            }
            (3, Some(o)) => {
                a.sq_psn = o.sq_psn.value();
                a.timeout = o.timeout;
                a.retry_cnt = o.retry;
                a.rnr_retry = o.rnr_retry;
                a.max_rd_atomic = o.initiator_depth;
                IBV_QP_STATE
                    | IBV_QP_SQ_PSN
                    | IBV_QP_TIMEOUT
                    | IBV_QP_RETRY_CNT
                    | IBV_QP_RNR_RETRY
                    | IBV_QP_MAX_QP_RD_ATOMIC
            }
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: a valid out pointer (contract).
        unsafe { *mask = m };
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_establish"]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let st = lock(&i.inner.st);
        // The CM sent the RTU with the REP's arrival (see
        // `connect_own_qp`): nothing is left to send.
        match (&st.self_qp, &st.conn) {
            (Some(_), Some(_)) => Ok(()),
            _ => Err(libc::EINVAL),
        }
    })
}

#[export_name = "ibverbs_abi_rdma_reject"]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let (_, inc) = lock(&i.inner.st).incoming.take().ok_or(libc::EINVAL)?;
        let data = if private_data.is_null() {
            Vec::new()
        } else {
            // SAFETY: `len` bytes at `private_data` (contract).
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), len as usize) }.to_vec()
        };
        inc.reject(data);
        Ok(())
    })
}

#[export_name = "ibverbs_abi_rdma_disconnect"]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    int(|| {
        // SAFETY: contract.
        let i = unsafe { id_of(id)? };
        let (conn, ended) = {
            let st = lock(&i.inner.st);
            (st.conn.clone().ok_or(libc::EINVAL)?, st.ended)
        };
        if !i.ibv.qp.is_null() {
            // As librdmacm: the QP to ERR, so its work requests flush.
            // SAFETY: the id's QP.
            let (ctx, h) = unsafe { (Context::of(i.ibv.verbs), (*i.ibv.qp.cast::<Qp>()).handle) };
            if ctx
                .provider
                .modify_qp(
                    h,
                    &QpAttr {
                        state: Some(QpState::Err),
                        ..Default::default()
                    },
                )
                .is_ok()
            {
                // SAFETY: the id's QP.
                unsafe { (*i.ibv.qp).state = crate::exports::qp_state_code(QpState::Err) };
            }
        }
        if ended {
            // The peer ended it: its DISCONNECTED is queued already.
            conn.agent.disconnect(conn.conn);
            return Ok(());
        }
        let inner = i.inner.clone();
        std::thread::Builder::new()
            .name("rdmacm disconnect".into())
            .spawn(move || {
                conn.agent
                    .disconnect_wait(conn.conn, Duration::from_secs(2));
                let done = lock(&inner.st).ended;
                if !done {
                    inner.post_with(RDMA_CM_EVENT_DISCONNECTED, EventArgs::default(), |s| {
                        s.ended = true
                    });
                }
            })
            .map_err(|_| libc::EAGAIN)?;
        Ok(())
    })
}

// ---- devices and addresses -------------------------------------------------------

#[export_name = "ibverbs_abi_rdma_get_devices"]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    ptr(|| {
        let p = crate::objects::provider().ok_or(libc::ENODEV)?;
        let mut list = Vec::new();
        for g in p.list_cas() {
            list.push(context_of(g)?);
        }
        if !num.is_null() {
            // SAFETY: a valid `int *` (contract).
            unsafe { *num = list.len() as c_int };
        }
        list.push(null_mut());
        Ok(Box::into_raw(list.into_boxed_slice()).cast())
    })
}

#[export_name = "ibverbs_abi_rdma_free_devices"]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: a list from `rdma_get_devices`: NULL-terminated, allocated
    // as a boxed slice of `n + 1` entries.
    unsafe {
        while !(*list.add(n)).is_null() {
            n += 1;
        }
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            list,
            n + 1,
        )));
    }
}

/// An `rdma_addrinfo` with room for its addresses.
#[repr(C)]
struct AddrInfo {
    ai: rdma_addrinfo,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

#[export_name = "ibverbs_abi_rdma_getaddrinfo"]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        if res.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NULL or valid hints (contract).
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        let family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        if h.is_some_and(|h| h.ai_port_space != 0 && h.ai_port_space != RDMA_PS_TCP) {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: all-zero is a valid `addrinfo`.
        let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
        ai.ai_family = family;
        ai.ai_socktype = libc::SOCK_STREAM;
        if flags & RAI_PASSIVE != 0 {
            ai.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            ai.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut found: *mut libc::addrinfo = null_mut();
        // SAFETY: C strings or NULL (contract), valid hints and out
        // pointer.
        let rc = unsafe { libc::getaddrinfo(node, service, &ai, &mut found) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: a list getaddrinfo made; its first entry.
        let addr = unsafe { sockaddr_in((*found).ai_addr) };
        // SAFETY: the list getaddrinfo made, freed once.
        unsafe { libc::freeaddrinfo(found) };
        let Some(addr) = addr else {
            return libc::EAI_FAMILY;
        };
        // SAFETY: all-zero is a valid `AddrInfo` (NULL pointers).
        let mut out: Box<AddrInfo> = Box::new(unsafe { std::mem::zeroed() });
        let len = if addr.is_ipv4() {
            std::mem::size_of::<libc::sockaddr_in>()
        } else {
            std::mem::size_of::<libc::sockaddr_in6>()
        } as libc::socklen_t;
        out.ai.ai_flags = flags;
        out.ai.ai_family = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        out.ai.ai_qp_type = crate::abi::consts::IBV_QPT_RC;
        out.ai.ai_port_space = RDMA_PS_TCP;
        if flags & RAI_PASSIVE != 0 {
            write_sockaddr(&mut out.src, addr);
            out.ai.ai_src_len = len;
            out.ai.ai_src_addr = (&mut out.src as *mut libc::sockaddr_storage).cast();
        } else {
            write_sockaddr(&mut out.dst, addr);
            out.ai.ai_dst_len = len;
            out.ai.ai_dst_addr = (&mut out.dst as *mut libc::sockaddr_storage).cast();
        }
        // SAFETY: a valid out pointer (contract).
        unsafe { *res = Box::into_raw(out).cast() };
        0
    }))
    .unwrap_or_else(|_| {
        set_errno(libc::EIO);
        -1
    })
}

#[export_name = "ibverbs_abi_rdma_freeaddrinfo"]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: an entry `rdma_getaddrinfo` made, freed once.
        let b = unsafe { Box::from_raw(p.cast::<AddrInfo>()) };
        p = b.ai.ai_next;
    }
}

// ---- rsocket's poll and select, for programs that call them on plain fds --------

#[export_name = "ibverbs_abi_rpoll"]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // No rsockets here: every descriptor is the kernel's.
    // SAFETY: as `poll(2)` (contract).
    unsafe { libc::poll(fds, nfds, timeout) }
}

#[export_name = "ibverbs_abi_rselect"]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: as `select(2)` (contract).
    unsafe { libc::select(nfds, r, w, e, t) }
}

// ---- refused ------------------------------------------------------------------------

/// Functions of librdmacm this library does not have, each answering -1
/// with `ENOSYS` (or NULL / nothing for those that return no `int`).
macro_rules! refused {
    ($($name:ident($($a:ident: $t:ty),*);)*) => {$(
        #[export_name = concat!("ibverbs_abi_", stringify!($name))]
        pub unsafe extern "C" fn $name($(_: $t),*) -> c_int {
            set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

refused! {
    rdma_create_ep(id: *mut *mut rdma_cm_id, res: *mut rdma_addrinfo, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr);
    rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut c_void);
    rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut c_void);
    rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id);
    rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr, ctx: *mut c_void);
    rdma_join_multicast_ex(id: *mut rdma_cm_id, attr: *mut c_void, ctx: *mut c_void);
    rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr);
    rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel);
    rdma_notify(id: *mut rdma_cm_id, event: c_int);
    rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void);
    rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void);
    rdma_reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8);
}

#[export_name = "ibverbs_abi_rdma_destroy_ep"]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // No endpoint is ever made (`rdma_create_ep` refuses); an id of
    // `rdma_create_id` is destroyed as `rdma_destroy_id` would.
    // SAFETY: contract.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}

#[export_name = "ibverbs_abi_rdma_destroy_srq"]
pub unsafe extern "C" fn rdma_destroy_srq(_id: *mut rdma_cm_id) {}

/// Every function librdmacm.so.1 exports, with rdma-core 44's version:
/// crates/rdmacm-abi forwards exactly these (its tests compare).
pub const EXPORTS: &[(&str, &str)] = &[
    ("rdma_create_event_channel", "RDMACM_1.0"),
    ("rdma_destroy_event_channel", "RDMACM_1.0"),
    ("rdma_get_cm_event", "RDMACM_1.0"),
    ("rdma_ack_cm_event", "RDMACM_1.0"),
    ("rdma_event_str", "RDMACM_1.0"),
    ("rdma_create_id", "RDMACM_1.0"),
    ("rdma_destroy_id", "RDMACM_1.0"),
    ("rdma_set_option", "RDMACM_1.0"),
    ("rdma_bind_addr", "RDMACM_1.0"),
    ("rdma_resolve_addr", "RDMACM_1.0"),
    ("rdma_resolve_route", "RDMACM_1.0"),
    ("rdma_get_src_port", "RDMACM_1.0"),
    ("rdma_get_dst_port", "RDMACM_1.0"),
    ("rdma_create_qp", "RDMACM_1.0"),
    ("rdma_create_qp_ex", "RDMACM_1.0"),
    ("rdma_destroy_qp", "RDMACM_1.0"),
    ("rdma_connect", "RDMACM_1.0"),
    ("rdma_listen", "RDMACM_1.0"),
    ("rdma_accept", "RDMACM_1.0"),
    ("rdma_reject", "RDMACM_1.0"),
    ("rdma_disconnect", "RDMACM_1.0"),
    ("rdma_get_devices", "RDMACM_1.0"),
    ("rdma_free_devices", "RDMACM_1.0"),
    ("rdma_getaddrinfo", "RDMACM_1.0"),
    ("rdma_freeaddrinfo", "RDMACM_1.0"),
    ("rpoll", "RDMACM_1.0"),
    ("rselect", "RDMACM_1.0"),
    ("rdma_create_ep", "RDMACM_1.0"),
    ("rdma_destroy_ep", "RDMACM_1.0"),
    ("rdma_create_srq", "RDMACM_1.0"),
    ("rdma_create_srq_ex", "RDMACM_1.0"),
    ("rdma_destroy_srq", "RDMACM_1.0"),
    ("rdma_get_request", "RDMACM_1.0"),
    ("rdma_join_multicast", "RDMACM_1.0"),
    ("rdma_leave_multicast", "RDMACM_1.0"),
    ("rdma_migrate_id", "RDMACM_1.0"),
    ("rdma_notify", "RDMACM_1.0"),
    ("rdma_join_multicast_ex", "RDMACM_1.1"),
    ("rdma_establish", "RDMACM_1.2"),
    ("rdma_init_qp_attr", "RDMACM_1.2"),
    ("rdma_get_remote_ece", "RDMACM_1.3"),
    ("rdma_reject_ece", "RDMACM_1.3"),
    ("rdma_set_local_ece", "RDMACM_1.3"),
];
