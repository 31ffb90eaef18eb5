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
mod post;
mod provider;
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

/// Most work requests per queue: siw's (`SIW_MAX_QP_WR`), which SCST's
/// and srptd's default send queue of 4096 (plus its extra slots) fits.
pub const MAX_QP_WR: u32 = 32 * 1024;

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
    /// How long a CM connect holds its first FPDU after the MPA reply
    /// (`iwarp::Config::first_fpdu_hold`): Linux siw (6.1) hands its
    /// socket to the QP only after sending its reply, and an FPDU that
    /// arrives in between waits unread until the next segment (seen in
    /// the siw-ours interop scenario: rping's server never saw our first
    /// Send). Once per connection; zero turns it off.
    pub cm_first_fpdu_hold: std::time::Duration,
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
            cm_first_fpdu_hold: std::time::Duration::from_millis(50),
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
    /// Destroys the CQ or SRQ in slot `i` unless a QP uses it (`busy`
    /// says so), and queues its destroyed-callback.
    fn release_shared(&mut self, i: usize, kind: ResourceKind, busy: &'static str) -> Result<u64> {
        let (ca, pd, ctx, users) = match self.objs.get(i) {
            Obj::Cq {
                ca, pd, ctx, users, ..
            }
            | Obj::Srq {
                ca, pd, ctx, users, ..
            } => (*ca, *pd, *ctx, *users),
            _ => unreachable!("a CQ or SRQ slot"),
        };
        if users > 0 {
            return Err(VerbsError::Busy(busy));
        }
        self.objs.release(i);
        self.adjust(pd, -1);
        let (guid, h) = (self.guid_of(ca), self.handler(ca));
        self.defer(guid, Cb::Destroyed(h, kind, ctx));
        Ok(guid)
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
