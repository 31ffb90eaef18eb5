//! The soft iWARP NIC: the sans-IO `iwarp` engine over kernel TCP
//! sockets, as a verbs provider (issue 31, item 2; Linux's siw is the
//! same idea in the kernel).
//!
//! Each CA is one IP address. Its NIC runs one IO thread (`mio`, so one
//! epoll set) that owns every socket of the CA: the listener and each
//! QP's TCP stream, all non-blocking. A QP is one TCP connection with one
//! `iwarp::Connection` on it; there is no thread per connection, and a
//! verb wakes the IO thread only when it queued something to deliver.
//! Sending happens inside `post_send` itself when the socket takes the
//! bytes (the IO thread finishes what it did not take); receiving, MPA
//! negotiation, timers and every consumer callback happen on the IO
//! thread, never under the provider's lock, so handlers never nest in a
//! verb ([`verbs::Provider::handlers_nest`] is false).
//!
//! Connection setup. iWARP has no QP numbers on the wire: a QP is its
//! stream. Two ways give a QP its stream:
//! - verbs only (what the conformance suite and tools without a CM do):
//!   INIT->RTR names the peer's GID (its IP address) and QP number, as
//!   for RoCE. Of the two QPs, the one with the lower (address, QPN)
//!   connects to the peer CA's listening port ([`SoftIwarp::new`]'s
//!   `port`) and sends an MPA request whose private data names both QPs
//!   ([`rendezvous`]); the other side's IO thread answers it once its QP
//!   has reached RTR with the matching destination (a request for a QP
//!   still in INIT waits for it, bounded by the initiator's MPA timeout).
//! - through a connection manager ([`cm`]: listen, connect, accept,
//!   reject with private data, what Linux's iw_cm asks of a driver; and
//!   [`rdmacm::IwarpCm`], the access layer's RDMA CM `Service` over it):
//!   the QP names [`CM_QPN`] as its destination and takes the stream the
//!   CM connected or accepted.
//!
//! A NIC can write a pcap of its streams for tshark ([`NicOptions::capture_dir`],
//! module `capture`). A shared receive queue serves its QPs' Sends as
//! they arrive (the engine asks for a buffer through
//! `iwarp::Memory::shared_recv`).
//!
//! What a NIC cannot do, per RFC 5040 and as siw: UD, UC and the special
//! QPs, atomics, immediate data (RFC 7306 is not implemented) and memory
//! windows (not yet) are `NotSupported`. Completion semantics
//! are iWARP's: a Send or RDMA Write completes once TCP took it (RFC 5040
//! 5.x); a responder's refusal (bad STag, bounds, no receive buffer,
//! receive too small) comes back as a TERMINATE that puts the requester's
//! QP in error with an affiliated `QpFatal` and flushes what is left. An
//! RDMA Read still outstanding when such a TERMINATE arrives completes
//! with `RemAccessErr`. A stream that ends (peer reset, peer killed) does
//! the same without a TERMINATE. Bytes from the peer are checked by the
//! engine before any placement: memory outside a registration is never
//! touched.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use iwarp::{RecvWqe, STag, SendOp, SendWqe};
use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, Pkey, PortNum, QpState, QpType, Qpn, Rkey};
use rdma_types::{WcOpcode, WcStatus};
use verbs::kit::cq::Cq;
use verbs::kit::handle_table::HandleTable;
use verbs::kit::qp_table;
use verbs::{
    AsyncEvent, AsyncEventKind, CaAttr, CaHandle, Context, CqHandle, CqInit, EventHandler, MemBuf,
    MrHandle, MrInfo, PdHandle, PortAttr, PortState, Provider, QpAttr, QpHandle, QpInit, RecvWr,
    ResourceKind, Result, SendOpcode, SendWr, VerbsError, WcFlags, WorkCompletion,
};

mod capture;
pub mod cm;
mod dev;
#[doc(hidden)]
pub mod fuzz;
mod mem;
pub mod rdmacm;
pub mod rendezvous;

pub use cm::{CmConnected, CmError, CmListener, CmRequest, CM_QPN};
use dev::{Cb, Dev};
use mem::{Sgl, SrqRef};
pub use rdmacm::IwarpCm;
use verbs::kit::rq::RecvQueue;
use verbs::{SrqAttr, SrqHandle};

/// The TCP port the verbs-only connection setup uses when none is given
/// (no IANA number exists for it; any port both ends agree on works).
pub const VERBS_PORT: u16 = 4794;

/// Most SGEs per work request.
pub const MAX_SGE: u32 = 16;

/// Most work requests per queue.
pub const MAX_QP_WR: u32 = 4096;

/// One CA: its GUID and the address its NIC binds.
#[derive(Debug, Clone)]
pub struct IwarpCa {
    /// Node GUID (`open_ca` takes it).
    pub guid: Guid,
    /// IP address of the CA (its GID 0).
    pub ip: IpAddr,
}

impl IwarpCa {
    /// The CA at `ip` with the GUID of its address ([`ip_guid`]).
    pub fn at(ip: IpAddr) -> IwarpCa {
        IwarpCa {
            guid: ip_guid(ip),
            ip,
        }
    }
}

/// The GUID of a CA at `ip`: a prefix of our own (not soft RoCE's, so the
/// two NICs of one address stay apart in one access layer) and the low 32
/// bits of the address (IPv6: folded).
pub fn ip_guid(ip: IpAddr) -> Guid {
    let low = match ip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => u32::from(v4),
            None => a.octets().chunks(4).fold(0u32, |h, c| {
                h.rotate_left(5) ^ u32::from_be_bytes([c[0], c[1], c[2], c[3]])
            }),
        },
    };
    Guid(0x0002_c903_1000_0000 | u64::from(low))
}

/// Options of the whole provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicOptions {
    /// TCP port of the verbs-only connection setup (each CA listens on it).
    pub port: u16,
    /// The path MTU FPDUs are sized for (MULPDU, RFC 5044 7.x).
    pub path_mtu: u32,
    /// MPA revision offered (1 or 2).
    pub mpa_revision: u8,
    /// Whether we ask for CRC32c (used when either side asks).
    pub crc: bool,
    /// How long a silent peer may hold a stream: TCP keepalive probes
    /// start after half of it and the kernel gives up on unacknowledged
    /// data after all of it (`TCP_USER_TIMEOUT`), which ends the QP in
    /// error like a reset. A stream no QP took (an MPA request never sent,
    /// or for a QP that never reached RTR) is closed after it too.
    pub dead_peer: std::time::Duration,
    /// Where each NIC writes a pcap of its streams (`iwarp-<ip>.pcap`,
    /// see `capture`), for tshark's iWARP dissectors; none by default.
    pub capture_dir: Option<std::path::PathBuf>,
}

impl Default for NicOptions {
    fn default() -> Self {
        NicOptions {
            port: VERBS_PORT,
            path_mtu: 1500,
            mpa_revision: 2,
            crc: true,
            dead_peer: std::time::Duration::from_secs(30),
            capture_dir: None,
        }
    }
}

/// The soft iWARP provider.
pub struct SoftIwarp {
    cas: Vec<IwarpCa>,
    options: NicOptions,
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    st: Mutex<Inner>,
    epoch: std::time::Instant,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_micros(self.epoch.elapsed().as_micros() as u64)
    }
}

pub(crate) struct Inner {
    pub(crate) objs: HandleTable<Obj>,
    /// Running NICs by GUID.
    pub(crate) devs: HashMap<u64, Dev>,
    /// The CM's hook per NIC (set before or after the NIC starts).
    pub(crate) cm_closed: HashMap<u64, cm::ClosedHook>,
}

pub(crate) enum Obj {
    Ca {
        guid: u64,
        handler: Arc<dyn EventHandler>,
        ctx: Context,
        children: u32,
    },
    Pd {
        ca: usize,
        ctx: Context,
        children: u32,
    },
    Cq {
        ca: usize,
        pd: usize,
        ctx: Context,
        cq: Arc<Cq>,
        users: u32,
    },
    Qp(Box<Qp>),
    Srq {
        ca: usize,
        pd: usize,
        ctx: Context,
        rq: Arc<Mutex<RecvQueue>>,
        users: u32,
    },
    Mr {
        ca: usize,
        pd: usize,
        key: u32,
        ctx: Context,
    },
}

/// What a driver-side work request remembers for its completion.
pub(crate) struct WrInfo {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WcOpcode,
    pub(crate) signaled: bool,
    /// A receive taken from the QP's SRQ.
    pub(crate) srq: bool,
}

/// A CQ as a QP reaches it.
#[derive(Clone)]
pub(crate) struct CqRef {
    pub(crate) cq: Arc<Cq>,
    pub(crate) ctx: Context,
    pub(crate) handler: Arc<dyn EventHandler>,
}

pub(crate) struct Qp {
    pub(crate) pd: usize,
    pub(crate) guid: u64,
    pub(crate) init: QpInit,
    pub(crate) qpn: u32,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr,
    pub(crate) ctx: Context,
    pub(crate) handler: Arc<dyn EventHandler>,
    pub(crate) scq: CqRef,
    pub(crate) rcq: CqRef,
    /// The stream's token in the NIC, once there is one.
    pub(crate) conn: Option<mio::Token>,
    /// Work posted before the engine exists, handed to it in order.
    pub(crate) wait_sq: VecDeque<SendWqe>,
    pub(crate) wait_rq: VecDeque<RecvWqe>,
    /// Driver work requests by engine id.
    pub(crate) wrs: HashMap<u64, WrInfo>,
    pub(crate) next_id: u64,
    /// Checked buffers by local STag (= engine id).
    pub(crate) sgls: HashMap<u32, Sgl>,
    pub(crate) sq_out: u32,
    pub(crate) rq_out: u32,
    pub(crate) comm_established: bool,
    /// The shared receive queue, if the QP has one.
    pub(crate) srq: Option<SrqRef>,
    /// Next id of a receive taken from the SRQ.
    pub(crate) next_srq_id: u32,
}

impl Qp {
    fn next_id(&mut self) -> u64 {
        // Ids double as local STags: never 0, unique among those in use.
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            // The top bit of a 32-bit id is the SRQ's (mem::SRQ_ID).
            let id = self.next_id & 0x7fff_ffff;
            if id != 0 && !self.wrs.contains_key(&id) {
                return id;
            }
        }
    }
}

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

impl Inner {
    fn slot_of<F: Fn(&Obj) -> bool>(&self, h: verbs::Handle, is: F) -> Result<usize> {
        let i = self.objs.slot(h)?;
        if is(self.objs.get(i)) {
            Ok(i)
        } else {
            Err(VerbsError::InvalidHandle)
        }
    }
    fn ca(&self, h: CaHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Ca { .. }))
    }
    fn pd(&self, h: PdHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Pd { .. }))
    }
    fn cq(&self, h: CqHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Cq { .. }))
    }
    fn qp(&self, h: QpHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Qp(_)))
    }
    fn srq(&self, h: SrqHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Srq { .. }))
    }
    fn mr(&self, h: MrHandle) -> Result<usize> {
        self.slot_of(h.0, |o| matches!(o, Obj::Mr { .. }))
    }
    pub(crate) fn qp_mut(&mut self, i: usize) -> &mut Qp {
        match self.objs.get_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!("a QP slot"),
        }
    }
    fn ca_of_pd(&self, pd: usize) -> usize {
        match self.objs.get(pd) {
            Obj::Pd { ca, .. } => *ca,
            _ => unreachable!("a PD slot"),
        }
    }
    fn guid_of(&self, ca: usize) -> u64 {
        match self.objs.get(ca) {
            Obj::Ca { guid, .. } => *guid,
            _ => unreachable!("a CA slot"),
        }
    }
    fn handler(&self, ca: usize) -> Arc<dyn EventHandler> {
        match self.objs.get(ca) {
            Obj::Ca { handler, .. } => handler.clone(),
            _ => unreachable!("a CA slot"),
        }
    }
    fn adjust(&mut self, i: usize, delta: i32) {
        match self.objs.get_mut(i) {
            Obj::Ca { children, .. } | Obj::Pd { children, .. } => {
                *children = children.wrapping_add_signed(delta)
            }
            Obj::Cq { users, .. } | Obj::Srq { users, .. } => {
                *users = users.wrapping_add_signed(delta)
            }
            _ => {}
        }
    }
    fn cq_ref(&self, i: usize) -> CqRef {
        match self.objs.get(i) {
            Obj::Cq { cq, ctx, ca, .. } => CqRef {
                cq: cq.clone(),
                ctx: *ctx,
                handler: self.handler(*ca),
            },
            _ => unreachable!("a CQ slot"),
        }
    }
    /// Queues a callback for the NIC's IO thread.
    pub(crate) fn defer(&mut self, guid: u64, cb: Cb) {
        if let Some(d) = self.devs.get_mut(&guid) {
            d.defer(cb);
        }
    }
}

impl SoftIwarp {
    /// A provider with these CAs and the default [`NicOptions`]; each
    /// CA's NIC (listener and IO thread) starts when a consumer first
    /// opens it.
    pub fn new(cas: Vec<IwarpCa>) -> Arc<SoftIwarp> {
        SoftIwarp::with_options(cas, NicOptions::default())
    }

    /// Like [`SoftIwarp::new`] with `options`.
    pub fn with_options(cas: Vec<IwarpCa>, options: NicOptions) -> Arc<SoftIwarp> {
        Arc::new(SoftIwarp {
            cas,
            options,
            shared: Arc::new(Shared {
                st: Mutex::new(Inner {
                    objs: HandleTable::new(),
                    devs: HashMap::new(),
                    cm_closed: HashMap::new(),
                }),
                epoch: std::time::Instant::now(),
            }),
        })
    }

    /// The options the provider was made with.
    pub fn options(&self) -> &NicOptions {
        &self.options
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    fn ca_cfg(&self, guid: u64) -> Option<&IwarpCa> {
        self.cas.iter().find(|c| c.guid.0 == guid)
    }

    /// Wakes the IO thread of `guid` if a verb left it work.
    fn kick(st: &mut Inner, guid: u64) {
        if let Some(d) = st.devs.get_mut(&guid) {
            d.kick();
        }
    }
}

impl Drop for SoftIwarp {
    fn drop(&mut self) {
        let mut st = self.lock();
        for d in st.devs.values_mut() {
            d.stop();
        }
    }
}

fn send_opcode(op: SendOpcode) -> Option<WcOpcode> {
    match op {
        SendOpcode::Send | SendOpcode::SendWithInv => Some(WcOpcode::Send),
        SendOpcode::RdmaWrite => Some(WcOpcode::RdmaWrite),
        SendOpcode::RdmaRead => Some(WcOpcode::RdmaRead),
        _ => None,
    }
}

impl Provider for SoftIwarp {
    fn name(&self) -> &'static str {
        "softiwarp"
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.cas.iter().map(|c| c.guid).collect()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        let cfg = self.ca_cfg(guid.0).ok_or(VerbsError::NoSuchCa)?.clone();
        let mut st = self.lock();
        if let std::collections::hash_map::Entry::Vacant(v) = st.devs.entry(guid.0) {
            let d = Dev::start(&self.shared, guid.0, cfg.ip, &self.options).map_err(|e| {
                bad(format!(
                    "iWARP NIC {}: cannot listen on {}:{}: {e} (is the address on an interface, the port free?)",
                    guid, cfg.ip, self.options.port
                ))
            })?;
            v.insert(d);
        }
        Ok(CaHandle(st.objs.alloc(Obj::Ca {
            guid: guid.0,
            handler,
            ctx,
            children: 0,
        })))
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        Ok(CaAttr {
            guid: Guid(st.guid_of(i)),
            num_ports: 1,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 16,
            max_mw: 0,
            max_inline_data: 0,
            atomics: false,
        })
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        let (guid, handler, ctx, children) = match st.objs.get(i) {
            Obj::Ca {
                guid,
                handler,
                ctx,
                children,
            } => (*guid, handler.clone(), *ctx, *children),
            _ => unreachable!(),
        };
        if children > 0 {
            return Err(VerbsError::Busy("the CA has PDs"));
        }
        st.objs.release(i);
        st.defer(guid, Cb::Destroyed(handler, ResourceKind::Ca, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} (the CA has port 1 only)", port.0)));
        }
        let ip = self
            .ca_cfg(st.guid_of(i))
            .map(|c| c.ip)
            .ok_or(VerbsError::NoSuchCa)?;
        Ok(PortAttr {
            port,
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            lid: Lid(0),
            sm_lid: Lid(0),
            gids: vec![Gid::from_ip(ip)],
            pkeys: vec![Pkey::DEFAULT],
        })
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        st.adjust(i, 1);
        Ok(PdHandle(st.objs.alloc(Obj::Pd {
            ca: i,
            ctx,
            children: 0,
        })))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.pd(pd)?;
        let (ca, ctx, children) = match st.objs.get(i) {
            Obj::Pd { ca, ctx, children } => (*ca, *ctx, *children),
            _ => unreachable!(),
        };
        if children > 0 {
            return Err(VerbsError::Busy("the PD has objects"));
        }
        st.objs.release(i);
        st.adjust(ca, -1);
        let (guid, h) = (st.guid_of(ca), st.handler(ca));
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Pd, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if init.cqe == 0 || init.cqe > 1 << 20 {
            return Err(bad(format!("CQ of {} entries (1 to 2^20)", init.cqe)));
        }
        let ca = st.ca_of_pd(p);
        st.adjust(p, 1);
        Ok(CqHandle(st.objs.alloc(Obj::Cq {
            ca,
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.cq(cq)?;
        let (ca, pd, ctx, users) = match st.objs.get(i) {
            Obj::Cq {
                ca, pd, ctx, users, ..
            } => (*ca, *pd, *ctx, *users),
            _ => unreachable!(),
        };
        if users > 0 {
            return Err(VerbsError::Busy("a QP uses the CQ"));
        }
        st.objs.release(i);
        st.adjust(pd, -1);
        let (guid, h) = (st.guid_of(ca), st.handler(ca));
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Cq, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_ref(i).cq
        };
        Ok(c.poll(out))
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let st = self.lock();
        let i = st.cq(cq)?;
        st.cq_ref(i).cq.arm(solicited_only);
        Ok(())
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_ref(i).cq
        };
        if c.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        match init.qp_type {
            QpType::Rc => {}
            QpType::Uc => return Err(VerbsError::NotSupported("UC QPs on iWARP")),
            QpType::Ud => return Err(VerbsError::NotSupported("UD QPs on iWARP")),
            QpType::Smi | QpType::Gsi => {
                return Err(VerbsError::NotSupported("special QPs (QP0/QP1) on iWARP"))
            }
        }
        let c = init.caps;
        if c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(bad(format!("queue depth above {MAX_QP_WR}")));
        }
        if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
            return Err(bad(format!("more than {MAX_SGE} SGEs per WR")));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.ca_of_pd(p);
        let (scq, rcq) = (st.cq(init.send_cq)?, st.cq(init.recv_cq)?);
        let srq = init.srq.map(|h| st.srq(h)).transpose()?;
        let srq_ref = srq.map(|i| match st.objs.get(i) {
            Obj::Srq {
                rq, pd, ctx, ca, ..
            } => SrqRef {
                rq: rq.clone(),
                pd: *pd as u32,
                ctx: *ctx,
                handler: st.handler(*ca),
            },
            _ => unreachable!("an SRQ slot"),
        });
        if let Some(i) = srq {
            st.adjust(i, 1);
        }
        let guid = st.guid_of(ca);
        let qpn = st
            .devs
            .get_mut(&guid)
            .ok_or(VerbsError::NoSuchCa)?
            .new_qpn();
        let (scq_ref, rcq_ref) = (st.cq_ref(scq), st.cq_ref(rcq));
        st.adjust(p, 1);
        st.adjust(scq, 1);
        st.adjust(rcq, 1);
        let handler = st.handler(ca);
        let h = st.objs.alloc(Obj::Qp(Box::new(Qp {
            pd: p,
            guid,
            init: *init,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            ctx,
            handler,
            scq: scq_ref,
            rcq: rcq_ref,
            conn: None,
            wait_sq: VecDeque::new(),
            wait_rq: VecDeque::new(),
            wrs: HashMap::new(),
            next_id: 0,
            sgls: HashMap::new(),
            sq_out: 0,
            rq_out: 0,
            comm_established: false,
            srq: srq_ref,
            next_srq_id: 0,
        })));
        let slot = st.objs.slot(h).unwrap_or_else(|_| unreachable!());
        if let Some(d) = st.devs.get_mut(&guid) {
            d.qpns.insert(qpn, slot);
        }
        Ok(QpHandle(h))
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        Ok(Qpn::from_bits(st.qp_mut(i).qpn))
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let (qp_type, from) = {
            let q = st.qp_mut(i);
            (q.init.qp_type, q.state)
        };
        let to = qp_table::check(qp_type, from, attr)?;
        if attr.alt_path.is_some() || attr.path_mig_state.is_some() {
            return Err(VerbsError::NotSupported("alternate paths (APM) on iWARP"));
        }
        if attr.pkey_index.is_some_and(|ix| ix != 0) {
            return Err(bad("P_Key index outside the 1-entry table"));
        }
        if attr.port.is_some_and(|p| p.0 != 1) {
            return Err(bad("the CA has one port"));
        }
        if let Some(av) = attr.av.filter(|_| to == QpState::Rtr) {
            if av.dgid == Gid::ZERO {
                return Err(bad("the destination GID (the peer's IP address) is zero"));
            }
        }
        let guid = st.qp_mut(i).guid;
        {
            let q = st.qp_mut(i);
            qp_table::merge(&mut q.attr, attr);
            q.state = to;
        }
        match (from, to) {
            (_, QpState::Err) => dev::qp_error(&mut st, i),
            (_, QpState::Reset) => dev::qp_reset(&mut st, i),
            (QpState::Init, QpState::Rtr) => {
                let now = self.shared.now();
                dev::qp_rtr(&mut st, i, self, now);
            }
            // TCP took what was sent; the SQ is drained at once.
            (QpState::Rts, QpState::Sqd) if attr.en_sqd_async_notify == Some(true) => {
                let q = st.qp_mut(i);
                let ev = AsyncEvent {
                    kind: AsyncEventKind::SqDrained,
                    ctx: q.ctx,
                    port: None,
                };
                let h = q.handler.clone();
                st.defer(guid, Cb::Async(h, ev));
            }
            _ => {}
        }
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let q = st.qp_mut(i);
        let mut a = q.attr;
        a.state = Some(q.state);
        Ok(a)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        dev::qp_detach(&mut st, i);
        let Some(Obj::Qp(q)) = st.objs.release(i) else {
            unreachable!("a QP slot")
        };
        if let Some(d) = st.devs.get_mut(&q.guid) {
            d.qpns.remove(&q.qpn);
        }
        st.adjust(q.pd, -1);
        for cq in [q.init.send_cq, q.init.recv_cq] {
            if let Ok(c) = st.cq(cq) {
                st.adjust(c, -1);
            }
        }
        if let Some(s) = q.init.srq.and_then(|h| st.srq(h).ok()) {
            st.adjust(s, -1);
        }
        st.defer(
            q.guid,
            Cb::Destroyed(q.handler.clone(), ResourceKind::Qp, q.ctx),
        );
        Self::kick(&mut st, q.guid);
        Ok(())
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        if attr.max_wr == 0 || attr.max_wr > MAX_QP_WR || attr.max_sge > MAX_SGE {
            return Err(bad(format!(
                "SRQ of {} WRs of {} SGEs (at most {MAX_QP_WR} of {MAX_SGE})",
                attr.max_wr, attr.max_sge
            )));
        }
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge.max(1));
        rq.set_limit(attr.limit)?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.ca_of_pd(p);
        st.adjust(p, 1);
        Ok(SrqHandle(st.objs.alloc(Obj::Srq {
            ca,
            pd: p,
            ctx,
            rq: Arc::new(Mutex::new(rq)),
            users: 0,
        })))
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.objs.get(i) {
            Obj::Srq { rq, .. } => rq
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_limit(limit),
            _ => unreachable!("an SRQ slot"),
        }
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.objs.get(i) {
            Obj::Srq { rq, .. } => {
                let rq = rq.lock().unwrap_or_else(|e| e.into_inner());
                Ok(SrqAttr {
                    max_wr: rq.max_wr(),
                    max_sge: rq.max_sge(),
                    limit: rq.limit(),
                })
            }
            _ => unreachable!("an SRQ slot"),
        }
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.srq(srq)?;
        let (ca, pd, ctx, users) = match st.objs.get(i) {
            Obj::Srq {
                ca, pd, ctx, users, ..
            } => (*ca, *pd, *ctx, *users),
            _ => unreachable!(),
        };
        if users > 0 {
            return Err(VerbsError::Busy("a QP uses the SRQ"));
        }
        st.objs.release(i);
        st.adjust(pd, -1);
        let (guid, h) = (st.guid_of(ca), st.handler(ca));
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Srq, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let rq = {
            let st = self.lock();
            let i = st.srq(srq)?;
            match st.objs.get(i) {
                Obj::Srq { rq, .. } => rq.clone(),
                _ => unreachable!("an SRQ slot"),
            }
        };
        // Checked when a Send takes one (the QP's PD and keys then).
        let r = rq.lock().unwrap_or_else(|e| e.into_inner()).post(wrs);
        r
    }

    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.ca_of_pd(p);
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        let (key_ix, key) = d.keys.reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust(p, 1);
        let h = st.objs.alloc(Obj::Mr {
            ca,
            pd: p,
            key: key_ix,
            ctx,
        });
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: rdma_types::Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let mut st = self.lock();
        let i = st.mr(mr)?;
        let (ca, key_ix) = match st.objs.get(i) {
            Obj::Mr { ca, key, .. } => (*ca, *key),
            _ => unreachable!(),
        };
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        let key = d.keys.rereg_mr(key_ix, buf, addr, len, access)?;
        Ok(MrInfo {
            handle: mr,
            lkey: rdma_types::Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.mr(mr)?;
        let (ca, pd, key_ix, ctx) = match st.objs.get(i) {
            Obj::Mr { ca, pd, key, ctx } => (*ca, *pd, *key, *ctx),
            _ => unreachable!(),
        };
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        d.keys.dereg_mr(key_ix)?;
        st.objs.release(i);
        st.adjust(pd, -1);
        let h = st.handler(ca);
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Mr, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let guid = st.qp_mut(i).guid;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(cause) = post_one_send(&mut st, i, wr) {
                result = Err(VerbsError::BadWr {
                    index,
                    cause: Box::new(cause),
                });
                break;
            }
        }
        let now = self.shared.now();
        dev::qp_pump(&mut st, i, now);
        Self::kick(&mut st, guid);
        result
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let guid = st.qp_mut(i).guid;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(cause) = post_one_recv(&mut st, i, wr) {
                result = Err(VerbsError::BadWr {
                    index,
                    cause: Box::new(cause),
                });
                break;
            }
        }
        let now = self.shared.now();
        dev::qp_pump(&mut st, i, now);
        Self::kick(&mut st, guid);
        result
    }
}

fn post_one_send(st: &mut Inner, i: usize, wr: &SendWr) -> Result<()> {
    let Some(opcode) = send_opcode(wr.opcode) else {
        return Err(VerbsError::NotSupported(match wr.opcode {
            SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm => {
                "immediate data on iWARP (RFC 7306 not implemented)"
            }
            SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => "atomics on iWARP",
            _ => "memory windows and local invalidate on this iWARP NIC",
        }));
    };
    let guid = st.qp_mut(i).guid;
    let q = st.qp_mut(i);
    match q.state {
        QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe => {}
        s => return Err(VerbsError::InvalidState(s)),
    }
    if wr.sges.len() > q.init.caps.max_send_sge as usize {
        return Err(bad(format!(
            "{} SGEs, the QP takes {}",
            wr.sges.len(),
            q.init.caps.max_send_sge
        )));
    }
    if q.sq_out >= q.init.caps.max_send_wr {
        return Err(VerbsError::QueueFull);
    }
    let len = u32::try_from(wr.total_len()).map_err(|_| bad("message longer than 4 GiB"))?;
    let pd = q.pd as u32;
    let writable = opcode == WcOpcode::RdmaRead;
    let inline = wr.flags.contains(verbs::SendFlags::INLINE) && !writable;
    let sgl = st
        .devs
        .get(&guid)
        .and_then(|d| Sgl::check(&d.keys, pd, &wr.sges, writable))
        .map(|l| if inline { l.snapshot() } else { l });
    let q = st.qp_mut(i);
    let id = q.next_id();
    if let Some(s) = sgl {
        q.sgls.insert(id as u32, s);
    }
    q.wrs.insert(
        id,
        WrInfo {
            wr_id: wr.wr_id,
            opcode,
            signaled: q.init.sq_sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED),
            srq: false,
        },
    );
    q.sq_out += 1;
    let local = iwarp::Sge {
        stag: STag(id as u32),
        to: 0,
        len,
    };
    let op = match wr.opcode {
        SendOpcode::RdmaWrite => SendOp::Write {
            local,
            remote_stag: STag(wr.remote.rkey.0),
            remote_to: wr.remote.addr,
        },
        SendOpcode::RdmaRead => SendOp::Read {
            local,
            remote_stag: STag(wr.remote.rkey.0),
            remote_to: wr.remote.addr,
        },
        _ => SendOp::Send {
            local,
            solicited: wr.flags.contains(verbs::SendFlags::SOLICITED),
            invalidate: (wr.opcode == SendOpcode::SendWithInv)
                .then_some(STag(wr.invalidate_rkey.0)),
        },
    };
    dev::qp_post_send(st, i, SendWqe { wr_id: id, op });
    Ok(())
}

fn post_one_recv(st: &mut Inner, i: usize, wr: &RecvWr) -> Result<()> {
    let guid = st.qp_mut(i).guid;
    let q = st.qp_mut(i);
    if q.srq.is_some() {
        return Err(bad("the QP takes its receives from its SRQ"));
    }
    if q.state == QpState::Reset {
        return Err(VerbsError::InvalidState(QpState::Reset));
    }
    if wr.sges.len() > q.init.caps.max_recv_sge as usize {
        return Err(bad(format!(
            "{} SGEs, the QP takes {}",
            wr.sges.len(),
            q.init.caps.max_recv_sge
        )));
    }
    if q.rq_out >= q.init.caps.max_recv_wr {
        return Err(VerbsError::QueueFull);
    }
    let len: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
    let len = u32::try_from(len).map_err(|_| bad("receive longer than 4 GiB"))?;
    let pd = q.pd as u32;
    let sgl = st
        .devs
        .get(&guid)
        .and_then(|d| Sgl::check(&d.keys, pd, &wr.sges, true));
    let q = st.qp_mut(i);
    let id = q.next_id();
    if let Some(s) = sgl {
        q.sgls.insert(id as u32, s);
    }
    q.wrs.insert(
        id,
        WrInfo {
            wr_id: wr.wr_id,
            opcode: WcOpcode::Recv,
            signaled: true,
            srq: false,
        },
    );
    q.rq_out += 1;
    let wqe = RecvWqe {
        wr_id: id,
        buf: iwarp::Sge {
            stag: STag(id as u32),
            to: 0,
            len,
        },
    };
    dev::qp_post_recv(st, i, wqe);
    Ok(())
}

/// Builds the verbs completion of an engine completion for QP `q`; `None`
/// for an unsignaled success.
pub(crate) fn to_wc(q: &mut Qp, c: &iwarp::Completion) -> Option<(WorkCompletion, bool, bool)> {
    let info = q.wrs.remove(&c.wr_id)?;
    q.sgls.remove(&(c.wr_id as u32));
    let recv = c.kind == iwarp::WcKind::Recv;
    if recv && !info.srq {
        q.rq_out = q.rq_out.saturating_sub(1);
    } else if !recv {
        q.sq_out = q.sq_out.saturating_sub(1);
    }
    let status = match c.status {
        iwarp::WcStatus::Success => WcStatus::Success,
        iwarp::WcStatus::LocalProtection => WcStatus::LocProtErr,
        iwarp::WcStatus::Flushed => WcStatus::WrFlushErr,
        iwarp::WcStatus::InvalidateRefused => WcStatus::RemInvReqErr,
        iwarp::WcStatus::LocalLength => WcStatus::LocLenErr,
        iwarp::WcStatus::RemoteAccess => WcStatus::RemAccessErr,
    };
    if status == WcStatus::Success && !info.signaled {
        return None;
    }
    let mut wc = WorkCompletion::new(info.wr_id, status, info.opcode, q.ctx);
    wc.byte_len = c.byte_len;
    wc.src_qp = Qpn::from_bits(q.attr.dest_qpn.map_or(0, |n| n.value()));
    if let Some(s) = c.invalidated {
        wc.invalidated_rkey = Rkey(s.0);
        wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
    }
    Some((wc, recv, c.solicited))
}

/// The address of a GID: IPv4 when mapped.
pub(crate) fn gid_ip(g: Gid) -> IpAddr {
    g.to_ip()
}

/// The CA address of `guid` in `p`.
pub(crate) fn ca_ip(p: &SoftIwarp, guid: u64) -> Option<IpAddr> {
    p.ca_cfg(guid).map(|c| c.ip)
}

pub(crate) fn peer_addr(p: &SoftIwarp, ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, p.options.port)
}
