//! The soft RoCE NIC behind the verbs interface.
//!
//! Each configured CA is one `softroce::Node` (one UDP socket on the CA's
//! address) run by its own `softroce::Driver` thread. Verbs objects live in
//! a handle table here; QPs are `roce` engines inside the node, memory is
//! reached through [`verbs::kit::keys::KeyTable`] with the same checks as
//! the loopback provider, completions land in [`verbs::kit::cq::Cq`] rings.
//!
//! Addressing is RoCEv2: the port's GID 0 is the CA's IP address
//! (IPv4-mapped for IPv4), a destination GID names the peer's IP address,
//! and every CA of one provider uses the same UDP port (4791 by default,
//! another for tests that run several fabrics at once). The tools and
//! daemons name a CA by the GUID of its address, [`ip_guid`].
//!
//! The engine of a QP is built at INIT->RTR, when the path, the remote QPN
//! and the receive PSN are known; the QP number is reserved at create time.
//! Receives posted before RTR wait here and are handed over then.
//!
//! Fault injection for tests: [`SoftRoce::set_faults`] gives a CA's send
//! path a seeded [`FaultConfig`] (loss, duplication, reordering,
//! corruption, latency) before the CA is first opened;
//! [`SoftRoce::counters`] reports what the node and its QPs counted
//! (retransmissions among them). A CA with no faults set takes them from
//! the environment variable `SOFTROCE_FAULTS` (the tools' spec, e.g.
//! `loss=0.01,seed=3`), so any binary can be run over a lossy link — the
//! interop harness does this against Linux rxe; a bad spec fails the open.
//!
//! Two port personalities (DESIGN.md decision 2), chosen per CA with
//! [`SoftRoce::set_personality`] before its first open. [`Personality::Roce`]
//! (the default): the port is ACTIVE from the start, has no LID and no
//! QP0. [`Personality::Ib`], a managed subnet: the port starts in INIT
//! with LID 0 and has a QP0, and only a subnet manager makes it ACTIVE,
//! through the port's SMA in the access layer (`rdma_access::sma_agent`),
//! which applies the SM's Sets with the verbs' port control
//! ([`Provider::modify_port`]: LID, master SM LID, state, P_Key table) and
//! reads the port's P_Key violations with
//! [`Provider::take_pkey_violations`]. RoCE has no QP0 and no SMPs; our
//! convention is that SMPs travel like any other MAD, as UD SENDs to QPN 0
//! over UDP (Q_Key not checked, as IBA 9.6.1.1.2 has it for QP0). Addressing stays
//! RoCEv2: GIDs are still the CAs' IP addresses, and a LID only names a
//! port in SM and SA records.
//!
//! Partitions (IBA 10.9): a QP's P_Key index picks from the port's table
//! (an `ib` port's is the SM's, [`Provider::modify_port`]; a `roce` port's
//! the default P_Key alone, what Linux rxe sends), and a QP's key follows
//! its entry when the table changes. The port drops every received packet
//! but an SMP whose P_Key matches no entry, or is not the key of the
//! QP it is for (QP1 takes any entry: a GMP carries its sender's), and
//! counts it ([`SoftCaCounters::pkey_violations`]); the latest refusal is
//! kept for the SMA's trap 257 ([`SoftRoce::take_pkey_violations`]). A
//! GSI receive reports the table index of the entry its P_Key matched,
//! and a GSI send leaves with the entry its work request names
//! (`SendWr::pkey_index`: a response in the request's partition), else
//! with the QP's.
//!
//! Memory windows live in the CA's key table beside the MRs, so the
//! responder checks a window's range, rights and (type 2) QP the way it
//! checks an MR. A type 1 window is bound by the bind verb at once; a
//! type 2 window by a BindMw work request, and LocalInv invalidates one:
//! both are local operations the engine runs in send-queue order (once
//! every WR before them went out) and completes in order, with the
//! BIND_MW / LOCAL_INV opcode, or `MwBindErr` and the QP in error. A
//! received SEND with invalidate (IETH) invalidates a bound type 2 window
//! of the QP's PD; any other key (an MR's, a type 1 window's, another
//! PD's) completes the receive with a remote invalid request error and
//! moves the QP to error, as Linux rxe does (its "class J"); where rxe
//! still ACKs the SEND, we NAK it (Invalid Request) so the sender knows.
//!
//! Inline data (`SendFlags::INLINE`, up to [`MAX_INLINE_DATA`] and the
//! QP's `max_inline`, SEND and RDMA WRITE): the bytes are copied at post
//! time, so the buffer may be reused at once, and no L_Key is needed. The
//! provider can only read memory it knows, so each piece must lie in some
//! region registered on the CA (any PD, any key).
//!
//! A UC/UD send error stops only the send queue: the engine completes
//! the failed WR with its error, flushes the rest, keeps receiving, and
//! the QP reads SQE until modify SQE->RTS resumes it (IBA 10.3.1.6).
//!
//! What it refuses (`NotSupported`): alternate paths (no path migration:
//! a CA has one address, and the engine no second destination; the APM
//! conformance cases are declared skipped) and QP0 on a `roce` port.
//! (SQD, SQE and SRQ limit events, once on this list, are served.)

use rdma_types::{AccessFlags, Gid, Guid, Lid, Lkey, Mtu, Pkey, PortNum, Psn, Qkey, QpState};
use rdma_types::{QpType, Qpn, Rkey, WcOpcode, WcStatus};
use roce::{Memory, MemoryError, QpConfig, RemoteAccess};
use softroce::{Driver, Node, NodeConfig};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use verbs::kit::cq::Cq;
use verbs::kit::handle_table::HandleTable;
use verbs::kit::keys::KeyTable;
use verbs::kit::qp_table;
use verbs::kit::rq::RecvQueue;
use verbs::{
    AhAttr, AhHandle, AsyncEvent, AsyncEventKind, CaAttr, CaHandle, Context, CqHandle, CqInit,
    EventHandler, Handle, MemBuf, MrHandle, MrInfo, MwBind, MwHandle, MwType, PdHandle,
    PkeyViolations, PortAttr, PortModify, PortState, Provider, QpAttr, QpHandle, QpInit, RecvWr,
    ResourceKind, Result, SendOpcode, SendWr, SrqAttr, SrqHandle, VerbsError, WcFlags,
    WorkCompletion,
};

pub use guid::ip_guid;
pub use rdma_sim::FaultConfig;
pub use softroce::PkeyViolation;

mod guid;

/// Default RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// Most inline data one send WR may carry (what Linux rxe reported before
/// it derived the figure from its WQE size).
pub const MAX_INLINE_DATA: u32 = 400;

/// How long a reopen waits for the CA's previous node to let go of its
/// socket (a completion callback running on that node's thread delays it).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The key-table index no window or region has: a bind WR naming a
/// handle that is not a type 2 window of this CA fails as a bind error.
const NO_INDEX: u32 = u32::MAX;

/// The personality of a CA's port (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Personality {
    /// RoCE: no subnet manager, the port ACTIVE at once, no QP0.
    #[default]
    Roce,
    /// A managed (InfiniBand-style) subnet: QP0, the port INIT until an SM
    /// brings it ACTIVE and gives it a LID.
    Ib,
}

/// One CA of the provider: a name and an address to bind.
#[derive(Debug, Clone)]
pub struct SoftCa {
    /// Node GUID (used by `open_ca`).
    pub guid: Guid,
    /// IP address of the CA (its GID 0).
    pub ip: IpAddr,
}

/// The soft RoCE provider.
pub struct SoftRoce {
    udp_port: u16,
    mtu: Mtu,
    cas: Vec<SoftCa>,
    st: Mutex<State>,
    /// What the provider keeps of each CA, open or not, by GUID: one slot
    /// per entry of `cas`, all behind one lock.
    slots: Mutex<HashMap<u64, CaSlot>>,
}

/// One CA of the provider, open or not.
#[derive(Default)]
struct CaSlot {
    /// The device while at least one open holds it, and how many do.
    open: Option<(Arc<CaRt>, u32)>,
    /// Detached by `remove_ca`: it cannot be opened again.
    removed: bool,
    /// Faults for the node, applied when it binds (the first open).
    faults: Option<FaultConfig>,
    /// The pcap file the node writes every packet to, taken when it binds.
    capture: Option<std::path::PathBuf>,
    /// The port was taken down (`set_port_active`): the cable stays pulled
    /// while nobody has the CA open, and a new open finds it so.
    down: bool,
    /// The personality the port gets at the next first open.
    personality: Personality,
    /// When the latest node let go of its socket: a reopen waits for it
    /// (the node can outlive `close_ca` a little, see `open_ca`).
    released: Option<softroce::Released>,
}

/// What an open CA counted: its node's datagrams and the sum over its QPs,
/// destroyed ones included (totals since the CA was first opened).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SoftCaCounters {
    /// Datagrams handed to the socket (after fault injection).
    pub tx_packets: u64,
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Received datagrams dropped for a bad ICRC (corruption).
    pub rx_bad_icrc: u64,
    /// Packets the QPs retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts of the QPs.
    pub timeouts: u64,
    /// Duplicate requests the QPs' responders saw.
    pub duplicates: u64,
    /// Out-of-sequence requests the QPs' responders saw.
    pub out_of_sequence: u64,
    /// Sequence-error NAKs the QPs received.
    pub seq_naks_received: u64,
    /// Received packets dropped for their P_Key: by the port (no entry of
    /// its table matches, or not the key of the QP they were for) or by a
    /// QP's engine.
    pub pkey_violations: u64,
}

enum Obj {
    Ca {
        rt: Arc<CaRt>,
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
        pd: usize,
        ctx: Context,
        cq: Arc<Cq>,
        users: u32,
    },
    Srq {
        ca: usize,
        pd: usize,
        ctx: Context,
        rq: Arc<Mutex<RecvQueue>>,
        users: u32,
    },
    Qp(Box<QpObj>),
    Ah {
        pd: usize,
        id: softroce::AhId,
    },
    Mr {
        ca: usize,
        pd: usize,
        /// Key-table index.
        key: u32,
        /// The current L_Key (inline data is found by address in any MR).
        lkey: u32,
        ctx: Context,
    },
    Mw {
        ca: usize,
        pd: usize,
        /// Key-table index.
        index: u32,
        kind: MwType,
        ctx: Context,
    },
}

struct QpObj {
    ca: usize,
    pd: usize,
    init: QpInit,
    qpn: Qpn,
    state: QpState,
    attr: QpAttr,
    /// Receives posted before the engine exists (RESET/INIT).
    early: RecvQueue,
    access: Arc<AtomicU32>,
    ctx: Context,
    engine: bool,
}

#[derive(Default)]
struct State {
    /// Every verbs object, behind its handle.
    objs: HandleTable<Obj>,
}

/// Where a QP's completions go; read by the driver thread's callback.
#[derive(Clone)]
struct Route {
    /// The callbacks of the CA open that created the QP.
    handler: Arc<dyn EventHandler>,
    send_cq: (Arc<Cq>, Context),
    recv_cq: (Arc<Cq>, Context),
    ctx: Context,
    /// The consumer asked for ERR: no QpFatal event.
    quiet_error: bool,
}

/// A CA's device, shared by every open of it: its node, key table and
/// completion routes.
struct CaRt {
    driver: OnceLock<Driver>,
    keys: Arc<Mutex<KeyTable>>,
    routes: Mutex<HashMap<u32, Route>>,
    gid: Gid,
    guid: Guid,
    /// Port 1 as `query_port` reports it (changed by port control).
    port: Mutex<PortStatus>,
    /// The port's personality.
    personality: Personality,
}

#[derive(Debug, Clone)]
struct PortStatus {
    state: PortState,
    lid: Lid,
    sm_lid: Lid,
    /// The P_Key table an SM set (`ib`); empty: the default partition.
    pkeys: Vec<Pkey>,
}

/// One open of a CA: its handler and context.
type CaOpen = (Arc<dyn EventHandler>, Context);

/// An unaffiliated event of port 1 to every open of a CA (no provider
/// lock held).
fn port_event(opens: &[CaOpen], kind: AsyncEventKind) {
    for (h, _) in opens {
        h.on_async_event(AsyncEvent {
            kind,
            ctx: 0,
            port: Some(PortNum(1)),
        });
    }
}

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

impl CaRt {
    fn node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.driver
            .get()
            .expect("driver started with the CA")
            .with_node(f)
    }

    /// Reads the node without waking its thread (counters).
    fn inspect<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.driver
            .get()
            .expect("driver started with the CA")
            .inspect(f)
    }

    /// Moves a QP's completions from the node to its CQs and tells the
    /// consumer; runs on the driver thread with no lock of ours held when
    /// the handler is called.
    fn deliver(&self, qp: softroce::QpHandle) {
        let Some(route) = self.routes_lock().get(&qp.0.value()).cloned() else {
            return;
        };
        let (completions, events) = self.node(|n| {
            let mut c = Vec::new();
            while let Some(x) = n.poll_completion_with_pkey(qp) {
                c.push(x);
            }
            let mut e = Vec::new();
            while let Some(x) = n.poll_event(qp) {
                e.push(x);
            }
            (c, e)
        });
        let mut notify = Vec::new();
        // Datagram receives say which entry their P_Key matched.
        let table = completions
            .iter()
            .any(|(_, k)| k.is_some())
            .then(|| self.pkey_table());
        // The engine reports an unsignaled send only when it fails, so
        // every completion here is the consumer's (`send_wqe` gives the
        // engine each WR's signaled flag).
        for (c, pkey) in completions {
            let mut wc = WorkCompletion::new(c.wr_id, c.status, c.opcode, route.ctx);
            wc.byte_len = c.byte_len;
            if let Some(imm) = c.imm {
                wc.imm = imm;
                wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
            }
            if let Some(k) = c.invalidated {
                wc.invalidated_rkey = k;
                wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
            }
            if let Some(src) = c.src_qp {
                wc.src_qp = src;
            }
            if c.grh {
                wc.wc_flags = wc.wc_flags | WcFlags::GRH;
            }
            if let (Some(k), Some(t)) = (pkey, &table) {
                wc.pkey_index = pkey_index_of(t, k).unwrap_or(0);
            }
            let (cq, ctx) = if c.is_recv {
                &route.recv_cq
            } else {
                &route.send_cq
            };
            let r = cq.push(wc, c.solicited);
            if r.notify {
                notify.push(*ctx);
            }
            if r.overflow {
                route.handler.on_async_event(AsyncEvent {
                    kind: AsyncEventKind::CqError,
                    ctx: *ctx,
                    port: None,
                });
            }
        }
        for ctx in notify {
            route.handler.on_completion(ctx);
        }
        for e in events {
            let kind = match e {
                roce::QpEvent::CommEstablished => AsyncEventKind::CommEstablished,
                roce::QpEvent::Error(_) if route.quiet_error => continue,
                roce::QpEvent::Error(_) => AsyncEventKind::QpFatal,
                roce::QpEvent::SqDrained => AsyncEventKind::SqDrained,
                roce::QpEvent::LastWqeReached => continue,
            };
            route.handler.on_async_event(AsyncEvent {
                kind,
                ctx: route.ctx,
                port: None,
            });
        }
    }

    /// Port 1's P_Key table as `query_port` reports it.
    fn pkey_table(&self) -> Vec<Pkey> {
        let p = self.port.lock().unwrap_or_else(|e| e.into_inner());
        if p.pkeys.is_empty() {
            vec![Pkey::DEFAULT]
        } else {
            p.pkeys.clone()
        }
    }

    fn routes_lock(&self) -> MutexGuard<'_, HashMap<u32, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The index of the entry of `table` that admits P_Key `k`: the same key
/// if the table holds it, else the first that matches (IBA 10.9.3).
fn pkey_index_of(table: &[Pkey], k: Pkey) -> Option<u16> {
    table
        .iter()
        .position(|t| *t == k)
        .or_else(|| table.iter().position(|t| t.matches(k)))
        .map(|i| i as u16)
}

/// A QP's door to memory: its PD's keys, its remote rights, its SRQ.
struct PdMem {
    pd: u32,
    qpn: u32,
    keys: Arc<Mutex<KeyTable>>,
    access: Arc<AtomicU32>,
    srq: Option<SrqRef>,
}

/// An SRQ as its QPs see it, with whom to tell when it runs low.
#[derive(Clone)]
struct SrqRef {
    rq: Arc<Mutex<RecvQueue>>,
    handler: Arc<dyn EventHandler>,
    ctx: Context,
}

fn mem_err(s: WcStatus) -> MemoryError {
    match s {
        WcStatus::RemAccessErr | WcStatus::LocProtErr => MemoryError::BadKey,
        _ => MemoryError::OutOfRange,
    }
}

impl PdMem {
    fn keys(&self) -> MutexGuard<'_, KeyTable> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Lends `len` bytes of a checked target to a packet: the packet holds the
/// buffer's allocation, so a deregistration (or the consumer dropping its
/// buffer) while the packet waits frees nothing it reads. `None` (copy
/// instead) if the target were ever shorter than the checked range.
fn lend(t: &verbs::kit::keys::Target, len: usize) -> Option<roce::Pinned> {
    if t.off.checked_add(len).is_none_or(|e| e > t.buf.len()) {
        return None;
    }
    // SAFETY: `[off, off+len)` is inside the buffer (checked above), whose
    // allocation `keep_alive` keeps valid for as long as the `Pinned`
    // lives; the key table checked the access.
    Some(unsafe { roce::Pinned::new(t.buf.keep_alive(), t.buf.ptr_at(t.off), len) })
}

impl Memory for PdMem {
    fn pin_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        len: usize,
    ) -> std::result::Result<Option<roce::Pinned>, MemoryError> {
        let t = self
            .keys()
            .local(self.pd, lkey, addr, len as u64, AccessFlags::NONE)
            .map_err(mem_err)?;
        Ok(lend(&t, len))
    }

    fn pin_remote(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: usize,
    ) -> std::result::Result<Option<roce::Pinned>, MemoryError> {
        let t = self
            .keys()
            .remote(
                self.pd,
                rkey,
                addr,
                len as u64,
                AccessFlags::REMOTE_READ,
                self.qpn,
            )
            .map_err(mem_err)?;
        Ok(lend(&t, len))
    }

    fn read_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self
            .keys()
            .local(self.pd, lkey, addr, out.len() as u64, AccessFlags::NONE)
            .map_err(mem_err)?;
        t.buf.read_at(t.off, out);
        Ok(())
    }

    fn write_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self
            .keys()
            .local(
                self.pd,
                lkey,
                addr,
                data.len() as u64,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(mem_err)?;
        t.buf.write_at(t.off, data);
        Ok(())
    }

    fn remote_check(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: u64,
        access: RemoteAccess,
    ) -> std::result::Result<(), MemoryError> {
        let granted = AccessFlags::from_bits(self.access.load(Ordering::Relaxed))
            .unwrap_or(AccessFlags::NONE);
        if !granted.contains(access.flag()) {
            return Err(MemoryError::NoPermission);
        }
        if access == RemoteAccess::Atomic && addr & 7 != 0 {
            return Err(MemoryError::Misaligned);
        }
        self.keys()
            .remote(self.pd, rkey, addr, len, access.flag(), self.qpn)
            .map(|_| ())
            .map_err(mem_err)
    }

    fn remote_write(
        &mut self,
        rkey: Rkey,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self
            .keys()
            .remote(
                self.pd,
                rkey,
                addr,
                data.len() as u64,
                AccessFlags::REMOTE_WRITE,
                self.qpn,
            )
            .map_err(mem_err)?;
        t.buf.write_at(t.off, data);
        Ok(())
    }

    fn remote_read(
        &mut self,
        rkey: Rkey,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self
            .keys()
            .remote(
                self.pd,
                rkey,
                addr,
                out.len() as u64,
                AccessFlags::REMOTE_READ,
                self.qpn,
            )
            .map_err(mem_err)?;
        t.buf.read_at(t.off, out);
        Ok(())
    }

    fn remote_atomic(
        &mut self,
        rkey: Rkey,
        addr: u64,
        compare: Option<u64>,
        operand: u64,
    ) -> std::result::Result<u64, MemoryError> {
        let t = self
            .keys()
            .remote(self.pd, rkey, addr, 8, AccessFlags::REMOTE_ATOMIC, self.qpn)
            .map_err(mem_err)?;
        Ok(match compare {
            Some(c) => t
                .buf
                .atomic_u64(t.off, |v| if v == c { operand } else { v }),
            None => t.buf.atomic_u64(t.off, |v| v.wrapping_add(operand)),
        })
    }

    fn invalidate(&mut self, rkey: Rkey) -> std::result::Result<(), MemoryError> {
        let pd = self.pd;
        self.keys().invalidate(pd, rkey).map_err(mem_err)
    }

    fn bind_mw(&mut self, b: &roce::MwBindOp) -> std::result::Result<(), MemoryError> {
        // The new R_Key keeps the window's index; the consumer picks only
        // its low 8 bits (IBA 10.6.7.2.1).
        if b.rkey.0 >> 8 != b.mw {
            return Err(MemoryError::BadKey);
        }
        let (pd, qpn) = (self.pd, self.qpn);
        self.keys()
            .bind_mw(pd, b.mw, b.mr, b.addr, b.len, b.access, b.rkey.0 as u8, qpn)
            .map(|_| ())
            .map_err(|_| MemoryError::BadKey)
    }

    fn srq_pop(&mut self) -> Option<roce::RecvWqe> {
        let srq = self.srq.as_ref()?;
        let (wr, limit) = srq.rq.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        if limit {
            // IBA 11.5.2.3: fires once, then the limit disarms. Called on the
            // NIC thread with no lock of the provider held.
            srq.handler.on_async_event(AsyncEvent {
                kind: AsyncEventKind::SrqLimitReached,
                ctx: srq.ctx,
                port: None,
            });
        }
        Some(recv_wqe(&wr))
    }
}

fn recv_wqe(wr: &RecvWr) -> roce::RecvWqe {
    roce::RecvWqe {
        wr_id: wr.wr_id,
        sges: wr
            .sges
            .iter()
            .map(|s| roce::Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            })
            .collect(),
    }
}

/// The peer's UDP address for a destination GID.
fn addr_of(gid: Gid, port: u16) -> SocketAddr {
    let v6 = std::net::Ipv6Addr::from(gid.0);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, port)
}

impl SoftRoce {
    /// A provider with these CAs; each is bound (its socket opened) when a
    /// consumer opens it. `udp_port` is the RoCEv2 port every CA uses.
    pub fn new(cas: Vec<SoftCa>, udp_port: u16) -> Arc<SoftRoce> {
        SoftRoce::with_mtu(cas, udp_port, Mtu::Mtu4096)
    }

    /// Like [`SoftRoce::new`], with ports whose active MTU is `mtu` (rxe
    /// reports 1024 on a 1500-byte Ethernet link; loopback fits 4096).
    pub fn with_mtu(cas: Vec<SoftCa>, udp_port: u16, mtu: Mtu) -> Arc<SoftRoce> {
        let slots = cas.iter().map(|c| (c.guid.0, CaSlot::default()));
        let p = Arc::new(SoftRoce {
            udp_port,
            mtu,
            st: Mutex::new(State::default()),
            slots: Mutex::new(slots.collect()),
            cas,
        });
        // A CA's port follows the link under its address, as rxe's follows
        // its netdev (`softroce::link`; `SOFTROCE_FOLLOW_LINK=0`: off, and
        // on failure only timeouts find a dead link).
        let ips: Vec<IpAddr> = p.cas.iter().map(|c| c.ip).collect();
        let _ = softroce::link::follow(Arc::downgrade(&p), &ips, |p: &SoftRoce, k, up| {
            let _ = p.set_port_active(p.cas[k].guid, up);
        });
        p
    }

    /// Gives CA `guid` the `personality` it has from its next first open
    /// (the node's port starts over then, as after a reset).
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is open.
    pub fn set_personality(&self, guid: Guid, personality: Personality) -> Result<()> {
        self.closed_ca(guid, "the CA is open; choose its personality before", |s| {
            s.personality = personality
        })
    }

    /// The personality CA `guid` has (or will have at its next open).
    pub fn personality(&self, guid: Guid) -> Personality {
        self.with_slot(guid, |s| s.personality).unwrap_or_default()
    }

    /// [`Provider::modify_port`] of port 1 of open CA `guid`, for tools
    /// and tests that hold no handle of it: the port state alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_port_state(&self, guid: Guid, state: PortState) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().state(state))
    }

    /// [`Provider::modify_port`] by GUID: the master SM's LID alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_sm_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().sm_lid(lid))
    }

    /// [`Provider::modify_port`] by GUID: the P_Key table alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().pkeys(pkeys.to_vec()))
    }

    /// [`Provider::modify_port`] by GUID: the LID alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().lid(lid))
    }

    /// Port control of port 1 of open CA `guid` (see the module docs and
    /// [`Provider::modify_port`]). The LID raises `LidChange`; a new
    /// master SM LID `SmChange`. The state and P_Key table are an `ib`
    /// port's only: ACTIVE raises `PortActive`, leaving ACTIVE `PortDown`
    /// (a port error, IBA 11.6.3; the link is not touched, see
    /// [`SoftRoce::set_port_active`] for a pulled cable). A new table
    /// (empty slots, P_Key 0, left out) raises `PkeyChange`; the port
    /// checks received packets against it from then on, and each QP's key
    /// becomes the new entry at its index (QP0's stays the default: SMPs
    /// are not partitioned). LMC, master SM SL and alias GUIDs are
    /// refused: a soft RoCE port is reached by its GID, so they would
    /// route nothing (the SMA keeps them for the SM to read back).
    fn modify_port_of(&self, guid: Guid, m: &PortModify) -> Result<()> {
        m.check()?;
        if m.lmc.is_some() || m.sm_sl.is_some() || m.alias_guids.is_some() {
            return Err(VerbsError::NotSupported(
                "LMC, SM SL and alias GUIDs on soft RoCE (a port is reached by its GID)",
            ));
        }
        let (rt, opens) = self.opens(guid)?;
        if rt.personality != Personality::Ib {
            if m.state.is_some() {
                return Err(bad("only an ib port's state is set by an SM"));
            }
            if m.pkeys.is_some() {
                return Err(bad("only an ib port's P_Key table is set by an SM"));
            }
        }
        if let Some(lid) = m.lid {
            rt.port.lock().unwrap_or_else(|e| e.into_inner()).lid = lid;
            port_event(&opens, AsyncEventKind::LidChange);
        }
        if let Some(lid) = m.sm_lid {
            let old = std::mem::replace(
                &mut rt.port.lock().unwrap_or_else(|e| e.into_inner()).sm_lid,
                lid,
            );
            if old != lid {
                port_event(&opens, AsyncEventKind::SmChange);
            }
        }
        if let Some(pkeys) = &m.pkeys {
            self.replace_pkeys(&rt, pkeys);
            port_event(&opens, AsyncEventKind::PkeyChange);
        }
        if let Some(state) = m.state {
            let old = {
                let mut p = rt.port.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::replace(&mut p.state, state)
            };
            match (old == PortState::Active, state == PortState::Active) {
                (false, true) => port_event(&opens, AsyncEventKind::PortActive),
                (true, false) => port_event(&opens, AsyncEventKind::PortDown),
                _ => {}
            }
        }
        Ok(())
    }

    /// Gives `rt`'s port the P_Key table `pkeys` and every QP engine of
    /// it the key at its index.
    fn replace_pkeys(&self, rt: &Arc<CaRt>, pkeys: &[Pkey]) {
        let table: Vec<Pkey> = pkeys
            .iter()
            .copied()
            .filter(|k| k.0 & 0x7fff != 0)
            .collect();
        rt.port.lock().unwrap_or_else(|e| e.into_inner()).pkeys = table;
        let table = rt.pkey_table();
        // Under the handle table's lock, as modify_qp builds engines: one
        // built before this saw the old table and is here.
        let st = self.lock();
        let qps: Vec<(Qpn, u16)> = st
            .objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Qp(q)
                    if q.engine
                        && q.init.qp_type != QpType::Smi
                        && Arc::ptr_eq(&st.rt(q.ca), rt) =>
                {
                    Some((q.qpn, q.attr.pkey_index.unwrap_or(0)))
                }
                _ => None,
            })
            .collect();
        rt.node(|n| {
            n.set_pkeys(&table);
            for (qpn, ix) in qps {
                let e = n.qp_mut(softroce::QpHandle(qpn));
                if let (Some(e), Some(k)) = (e, table.get(usize::from(ix))) {
                    e.update_config(|c| c.pkey = *k);
                }
            }
        });
    }

    /// The P_Key violations port 1 of open CA `guid` counted since the
    /// last call, and the latest of them (what trap 257 reports); `None`
    /// when there were none or the CA is not open.
    pub fn take_pkey_violations(&self, guid: Guid) -> Option<(u64, PkeyViolation)> {
        let rt = self.device(guid)?;
        // The SMA asks every few tens of milliseconds: no wake-ups.
        rt.inspect(|n| n.take_pkey_violations())
    }

    /// The GUID of open CA `ca`, whose only port is `port`.
    fn port_one(&self, ca: CaHandle, port: PortNum) -> Result<Guid> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} does not exist", port.0)));
        }
        Ok(st.rt(i).guid)
    }

    /// The open device of CA `guid` and the handlers of every open of it.
    fn opens(&self, guid: Guid) -> Result<(Arc<CaRt>, Vec<CaOpen>)> {
        let rt = self.device(guid).ok_or(VerbsError::NoSuchCa)?;
        let st = self.lock();
        let opens = st
            .objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Ca {
                    rt: r,
                    handler,
                    ctx,
                    ..
                } if Arc::ptr_eq(r, &rt) => Some((handler.clone(), *ctx)),
                _ => None,
            })
            .collect();
        Ok((rt, opens))
    }

    /// Takes port 1 of CA `guid` down (its link drops every datagram both
    /// ways, like a pulled cable) or brings it back, raising `PortDown` /
    /// `PortActive` to every open of the CA. The state outlives the opens:
    /// a CA nobody has open keeps it, and the next open finds it.
    ///
    /// # Errors
    /// `NoSuchCa` for a GUID this provider does not have.
    pub fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.with_slot(guid, |s| s.down = !active)?;
        let Ok((rt, opens)) = self.opens(guid) else {
            return Ok(()); // not open: the next open starts in this state
        };
        let new = match (active, rt.personality) {
            (false, _) => PortState::Down,
            (true, Personality::Roce) => PortState::Active,
            // The link trained: INIT until the SM activates it again.
            (true, Personality::Ib) => PortState::Init,
        };
        let changed = {
            let mut p = rt.port.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut p.state, new) != new
        };
        rt.node(|n| n.set_link_up(active));
        if changed && new != PortState::Init {
            let kind = if active {
                AsyncEventKind::PortActive
            } else {
                AsyncEventKind::PortDown
            };
            port_event(&opens, kind);
        }
        Ok(())
    }

    /// Detaches open CA `guid`, as a hot-unplugged NIC: its link goes down,
    /// every open gets `CaRemoval` (with its context) and the CA cannot be
    /// opened again. Owners destroy their resources as after any removal.
    ///
    /// # Errors
    /// `NoSuchCa` when the CA is not open.
    pub fn remove_ca(&self, guid: Guid) -> Result<()> {
        let (rt, opens) = self.opens(guid)?;
        self.with_slot(guid, |s| s.removed = true)?;
        rt.port.lock().unwrap_or_else(|e| e.into_inner()).state = PortState::Down;
        rt.node(|n| n.set_link_up(false));
        for (h, ctx) in opens {
            h.on_async_event(AsyncEvent {
                kind: AsyncEventKind::CaRemoval,
                ctx,
                port: None,
            });
        }
        Ok(())
    }

    /// Injects `faults` on the send path of CA `guid` (`None`: a clean
    /// link). The node takes its faults when it binds, at the first open of
    /// the CA, so this must come before that.
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is already open.
    pub fn set_faults(&self, guid: Guid, faults: Option<FaultConfig>) -> Result<()> {
        self.closed_ca(guid, "the CA is open; set faults before", |s| {
            s.faults = faults
        })
    }

    /// Writes every packet CA `guid` sends and receives to the pcap file
    /// `path` (`None`: no capture). Like faults, taken when the node binds
    /// at the first open of the CA.
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is already open.
    pub fn set_capture(&self, guid: Guid, path: Option<std::path::PathBuf>) -> Result<()> {
        self.closed_ca(guid, "the CA is open; set the capture before", |s| {
            s.capture = path
        })
    }

    /// Runs `f` on the slot of CA `guid` if the CA is not open (what a
    /// node takes at bind time may still change), else `Busy(busy)`.
    fn closed_ca(&self, guid: Guid, busy: &'static str, f: impl FnOnce(&mut CaSlot)) -> Result<()> {
        self.with_slot(guid, |s| match s.open {
            Some(_) => Err(VerbsError::Busy(busy)),
            None => {
                f(s);
                Ok(())
            }
        })?
    }

    /// Runs `f` on the slot of CA `guid`, under the slots' lock.
    fn with_slot<R>(&self, guid: Guid, f: impl FnOnce(&mut CaSlot) -> R) -> Result<R> {
        self.slots()
            .get_mut(&guid.0)
            .map(f)
            .ok_or(VerbsError::NoSuchCa)
    }

    /// The device of CA `guid` while it is open.
    fn device(&self, guid: Guid) -> Option<Arc<CaRt>> {
        let slots = self.slots();
        slots.get(&guid.0)?.open.as_ref().map(|(rt, _)| rt.clone())
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<u64, CaSlot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters of CA `guid` while it is open (`None` when it is not).
    pub fn counters(&self, guid: Guid) -> Option<SoftCaCounters> {
        let rt = self.device(guid)?;
        let qpns: Vec<u32> = rt.routes_lock().keys().copied().collect();
        Some(rt.node(|n| {
            let s = n.stats();
            let mut k = n.retired_qp_counters();
            for q in qpns {
                if let Some(qp) = n.qp_mut(softroce::QpHandle(Qpn::from_bits(q))) {
                    k += qp.counters();
                }
            }
            SoftCaCounters {
                tx_packets: s.tx_packets,
                rx_datagrams: s.rx_datagrams,
                rx_bad_icrc: s.rx_bad_icrc,
                retransmits: k.retransmits,
                timeouts: k.timeouts,
                duplicates: k.duplicates,
                out_of_sequence: k.out_of_sequence,
                seq_naks_received: k.seq_naks_received,
                pkey_violations: k.pkey_violations + s.rx_pkey_violations,
            }
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn alloc(&mut self, obj: Obj) -> Handle {
        self.objs.alloc(obj)
    }

    fn release(&mut self, i: usize) -> Option<Obj> {
        self.objs.release(i)
    }

    fn slot(&self, h: Handle) -> Result<usize> {
        self.objs.slot(h)
    }

    fn obj(&self, i: usize) -> &Obj {
        self.objs.get(i)
    }

    fn obj_mut(&mut self, i: usize) -> &mut Obj {
        self.objs.get_mut(i)
    }

    fn ca(&self, h: CaHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Ca { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    fn pd(&self, h: PdHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Pd { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    fn cq(&self, h: CqHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Cq { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    fn srq(&self, h: SrqHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Srq { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    fn qp(&self, h: QpHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Qp(_))
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    fn qp_mut(&mut self, i: usize) -> &mut QpObj {
        match self.obj_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!("checked by State::qp"),
        }
    }

    fn rt(&self, ca: usize) -> Arc<CaRt> {
        match self.obj(ca) {
            Obj::Ca { rt, .. } => rt.clone(),
            _ => unreachable!("a CA slot"),
        }
    }

    fn handler(&self, ca: usize) -> Arc<dyn EventHandler> {
        match self.obj(ca) {
            Obj::Ca { handler, .. } => handler.clone(),
            _ => unreachable!("a CA slot"),
        }
    }

    fn pd_ca(&self, pd: usize) -> usize {
        match self.obj(pd) {
            Obj::Pd { ca, .. } => *ca,
            _ => unreachable!("a PD slot"),
        }
    }

    fn adjust(&mut self, i: usize, delta: i32) {
        match self.obj_mut(i) {
            Obj::Ca { children, .. } | Obj::Pd { children, .. } => {
                *children = children.wrapping_add_signed(delta)
            }
            Obj::Cq { users, .. } | Obj::Srq { users, .. } => {
                *users = users.wrapping_add_signed(delta)
            }
            _ => {}
        }
    }

    fn cq_arc(&self, i: usize) -> (Arc<Cq>, Context) {
        match self.obj(i) {
            Obj::Cq { cq, ctx, .. } => (cq.clone(), *ctx),
            _ => unreachable!("a CQ slot"),
        }
    }

    /// Key-table indices of a bind WR's window and region. Anything but a
    /// type 2 window and an MR of CA `ca` gets an index nothing has, so
    /// the bind completes with a bind error in its turn (as the loopback
    /// provider does), not a post error.
    fn bind_indices(&self, ca: usize, b: &MwBind) -> (u32, u32) {
        let mw = match self.slot(b.mw.0).map(|i| self.obj(i)) {
            Ok(Obj::Mw {
                ca: c,
                index,
                kind: MwType::Type2,
                ..
            }) if self.same_device(*c, ca) => *index,
            _ => NO_INDEX,
        };
        let mr = match self.slot(b.mr.0).map(|i| self.obj(i)) {
            Ok(Obj::Mr { ca: c, key, .. }) if self.same_device(*c, ca) => *key,
            _ => NO_INDEX,
        };
        (mw, mr)
    }

    /// Whether two CA opens are of one device (one key table).
    fn same_device(&self, a: usize, b: usize) -> bool {
        a == b || Arc::ptr_eq(&self.rt(a), &self.rt(b))
    }

    /// Copies the gather list of an inline WR (IBV_SEND_INLINE): at most
    /// `max` bytes, SEND or RDMA WRITE only. The L_Key is not needed: each
    /// piece is read from whichever region of the CA holds it (the SGE's
    /// own key first). Memory the provider does not know cannot be read
    /// safely, so a piece outside every registered region is refused.
    fn gather_inline(&self, ca: usize, pd: usize, wr: &SendWr, max: u32) -> Result<Vec<u8>> {
        let total = wr.total_len();
        if total > u64::from(max) {
            return Err(bad(format!(
                "{total} bytes of inline data > the QP's max_inline {max}"
            )));
        }
        if !matches!(
            wr.opcode,
            SendOpcode::Send
                | SendOpcode::SendWithImm
                | SendOpcode::SendWithInv
                | SendOpcode::RdmaWrite
                | SendOpcode::RdmaWriteWithImm
        ) {
            return Err(bad("inline data goes with SEND and RDMA WRITE only"));
        }
        let rt = self.rt(ca);
        let keys = rt.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![0u8; total as usize];
        let mut at = 0usize;
        for sge in &wr.sges {
            let len = sge.length as usize;
            let (addr, n) = (sge.addr, sge.length as u64);
            let found = keys
                .local(pd as u32, sge.lkey, addr, n, AccessFlags::NONE)
                .ok()
                .or_else(|| {
                    self.objs.iter().find_map(|(_, o)| match o {
                        Obj::Mr {
                            ca: c, pd, lkey, ..
                        } if self.same_device(*c, ca) => keys
                            .local(*pd as u32, Lkey(*lkey), addr, n, AccessFlags::NONE)
                            .ok(),
                        _ => None,
                    })
                });
            let Some(t) = found else {
                return Err(bad(format!(
                    "inline data at {addr:#x}+{n} is in no registered region"
                )));
            };
            t.buf.read_at(t.off, &mut out[at..at + len]);
            at += len;
        }
        Ok(out)
    }
}

fn send_wqe(wr: &SendWr, sig_all: bool) -> Result<roce::SendWqe> {
    use roce::SendOp;
    let r = wr.remote;
    let op = match wr.opcode {
        SendOpcode::Send => SendOp::Send,
        SendOpcode::SendWithImm => SendOp::SendImm(wr.imm),
        SendOpcode::SendWithInv => SendOp::SendInv(wr.invalidate_rkey),
        SendOpcode::RdmaWrite => SendOp::Write {
            raddr: r.addr,
            rkey: r.rkey,
        },
        SendOpcode::RdmaWriteWithImm => SendOp::WriteImm {
            raddr: r.addr,
            rkey: r.rkey,
            imm: wr.imm,
        },
        SendOpcode::RdmaRead => SendOp::Read {
            raddr: r.addr,
            rkey: r.rkey,
        },
        SendOpcode::AtomicCmpSwp => SendOp::CmpSwap {
            raddr: r.addr,
            rkey: r.rkey,
            compare: wr.compare_add,
            swap: wr.swap,
        },
        SendOpcode::AtomicFetchAdd => SendOp::FetchAdd {
            raddr: r.addr,
            rkey: r.rkey,
            add: wr.compare_add,
        },
        SendOpcode::LocalInv => SendOp::LocalInv(wr.invalidate_rkey),
        SendOpcode::BindMw => {
            let b = wr.bind_mw.ok_or_else(|| bad("BindMw WR without a bind"))?;
            SendOp::BindMw(roce::MwBindOp {
                mw: NO_INDEX,
                mr: NO_INDEX,
                rkey: b.rkey,
                addr: b.addr,
                len: b.len,
                access: b.access,
            })
        }
    };
    let mut w = roce::SendWqe::new(
        wr.wr_id,
        op,
        wr.sges
            .iter()
            .map(|s| roce::Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            })
            .collect(),
    );
    w.signaled = sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED);
    w.solicited = wr.flags.contains(verbs::SendFlags::SOLICITED);
    w.fence = wr.flags.contains(verbs::SendFlags::FENCE);
    Ok(w)
}

impl Provider for SoftRoce {
    fn name(&self) -> &'static str {
        "softroce"
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
        let cfg = self
            .cas
            .iter()
            .find(|c| c.guid == guid)
            .ok_or(VerbsError::NoSuchCa)?;
        // The previous node of this CA may still hold its socket: the last
        // reference to a closed CA can be a completion callback on its NIC
        // thread, which cannot be joined there, so the node goes when the
        // thread ends, soon after. Wait for it (unlocked: the callback may
        // call the provider), then look again.
        let mut waited = None;
        let mut slots = loop {
            let slots = self.slots();
            let s = slots.get(&guid.0).ok_or(VerbsError::NoSuchCa)?;
            if s.removed {
                return Err(VerbsError::NoSuchCa);
            }
            if s.open.is_some() || waited.is_some() {
                break slots;
            }
            let Some(prev) = s.released.clone().filter(|r| !r.is_released()) else {
                break slots;
            };
            drop(slots);
            waited = Some(prev.wait(RELEASE_WAIT));
        };
        let s = slots.get_mut(&guid.0).ok_or(VerbsError::NoSuchCa)?;
        let rt = match &mut s.open {
            Some((rt, opens)) => {
                *opens += 1;
                rt.clone()
            }
            None => {
                let addr = SocketAddr::new(cfg.ip, self.udp_port);
                let mut ncfg = NodeConfig::new(addr).with_random_first_qpn();
                ncfg.faults = match s.faults.clone() {
                    Some(f) => Some(f),
                    None => faults_from_env()?,
                };
                ncfg.capture = s.capture.clone();
                let mut node = Node::bind(ncfg).map_err(|e| {
                    let why = match waited {
                        Some(false) => format!(
                            " (the CA's previous node had not closed it; waited up to {} s)",
                            RELEASE_WAIT.as_secs()
                        ),
                        _ if e.kind() == std::io::ErrorKind::AddrInUse => {
                            " (held by another provider or process)".to_string()
                        }
                        _ => String::new(),
                    };
                    bad(format!("cannot bind {addr}: {e}{why}"))
                })?;
                let pulled = s.down;
                if pulled {
                    node.set_link_up(false);
                }
                let personality = s.personality;
                let rt = Arc::new(CaRt {
                    driver: OnceLock::new(),
                    keys: Arc::new(Mutex::new(KeyTable::new())),
                    routes: Mutex::new(HashMap::new()),
                    gid: Gid::from_ip(cfg.ip),
                    guid,
                    port: Mutex::new(PortStatus {
                        state: match (pulled, personality) {
                            (true, _) => PortState::Down,
                            (false, Personality::Roce) => PortState::Active,
                            (false, Personality::Ib) => PortState::Init,
                        },
                        lid: Lid(0),
                        sm_lid: Lid(0),
                        pkeys: Vec::new(),
                    }),
                    personality,
                });
                let weak: Weak<CaRt> = Arc::downgrade(&rt);
                let driver = Driver::start(
                    node,
                    Some(Box::new(move |qp| {
                        if let Some(rt) = weak.upgrade() {
                            rt.deliver(qp);
                        }
                    })),
                )
                .map_err(|e| bad(format!("cannot start the NIC thread: {e}")))?;
                s.released = Some(driver.released());
                let _ = rt.driver.set(driver);
                s.open = Some((rt.clone(), 1));
                rt
            }
        };
        drop(slots);
        let h = self.lock().alloc(Obj::Ca {
            rt,
            handler,
            ctx,
            children: 0,
        });
        Ok(CaHandle(h))
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        Ok(CaAttr {
            guid: st.rt(i).guid,
            num_ports: 1,
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 12,
            max_mw: 1 << 16,
            max_inline_data: MAX_INLINE_DATA,
            atomics: true,
        })
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let (rt, handler, ctx) = {
            let mut st = self.lock();
            let i = st.ca(ca)?;
            if let Obj::Ca { children, .. } = st.obj(i) {
                if *children > 0 {
                    return Err(VerbsError::Busy("CA has live objects"));
                }
            }
            match st.release(i) {
                Some(Obj::Ca {
                    rt, handler, ctx, ..
                }) => (rt, handler, ctx),
                _ => unreachable!("checked CA"),
            }
        };
        let _ = self.with_slot(rt.guid, |s| {
            if let Some((_, opens)) = &mut s.open {
                *opens -= 1;
                if *opens == 0 {
                    // The driver thread stops when the last reference goes.
                    s.open = None;
                }
            }
        });
        drop(rt);
        handler.on_destroyed(ResourceKind::Ca, ctx);
        Ok(())
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} does not exist", port.0)));
        }
        let rt = st.rt(i);
        let ps = rt.port.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let pkeys = rt.pkey_table();
        Ok(PortAttr {
            port,
            state: ps.state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.mtu,
            lid: ps.lid,
            sm_lid: ps.sm_lid,
            gids: vec![rt.gid],
            pkeys,
        })
    }

    fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()> {
        let guid = self.port_one(ca, port)?;
        self.modify_port_of(guid, modify)
    }

    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        let guid = self.port_one(ca, port)?;
        Ok(SoftRoce::take_pkey_violations(self, guid)
            .map(|(count, latest)| PkeyViolations { count, latest }))
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        st.adjust(i, 1);
        Ok(PdHandle(st.alloc(Obj::Pd {
            ca: i,
            ctx,
            children: 0,
        })))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.pd(pd)?;
            let (ca, ctx, children) = match st.obj(i) {
                Obj::Pd { ca, ctx, children } => (*ca, *ctx, *children),
                _ => unreachable!("checked PD"),
            };
            if children > 0 {
                return Err(VerbsError::Busy("PD has live objects"));
            }
            st.release(i);
            st.adjust(ca, -1);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Pd, ctx);
        Ok(())
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if init.cqe == 0 || init.cqe > 1 << 20 {
            return Err(bad(format!("{} CQ entries", init.cqe)));
        }
        st.adjust(p, 1);
        Ok(CqHandle(st.alloc(Obj::Cq {
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.cq(cq)?;
            let (pd, ctx, users) = match st.obj(i) {
                Obj::Cq { pd, ctx, users, .. } => (*pd, *ctx, *users),
                _ => unreachable!("checked CQ"),
            };
            if users > 0 {
                return Err(VerbsError::Busy("CQ used by a QP"));
            }
            st.release(i);
            st.adjust(pd, -1);
            let ca = st.pd_ca(pd);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Cq, ctx);
        Ok(())
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        Ok(c.poll(out))
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        c.arm(solicited_only);
        Ok(())
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        if c.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if attr.max_wr == 0 || attr.max_sge == 0 {
            return Err(bad("SRQ needs max_wr and max_sge"));
        }
        let ca = st.pd_ca(p);
        st.adjust(p, 1);
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge);
        let _ = rq.set_limit(attr.limit);
        Ok(SrqHandle(st.alloc(Obj::Srq {
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
        match st.obj(i) {
            Obj::Srq { rq, .. } => rq
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_limit(limit),
            _ => unreachable!("checked SRQ"),
        }
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.obj(i) {
            Obj::Srq { rq, .. } => {
                let rq = rq.lock().unwrap_or_else(|e| e.into_inner());
                Ok(SrqAttr {
                    max_wr: rq.max_wr(),
                    max_sge: rq.max_sge(),
                    limit: rq.limit(),
                })
            }
            _ => unreachable!("checked SRQ"),
        }
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.srq(srq)?;
            let (ca, pd, ctx, users) = match st.obj(i) {
                Obj::Srq {
                    ca, pd, ctx, users, ..
                } => (*ca, *pd, *ctx, *users),
                _ => unreachable!("checked SRQ"),
            };
            if users > 0 {
                return Err(VerbsError::Busy("SRQ used by a QP"));
            }
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Srq, ctx);
        Ok(())
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let (rq, rt) = {
            let st = self.lock();
            let i = st.srq(srq)?;
            match st.obj(i) {
                Obj::Srq { rq, ca, .. } => (rq.clone(), st.rt(*ca)),
                _ => unreachable!("checked SRQ"),
            }
        };
        rq.lock().unwrap_or_else(|e| e.into_inner()).post(wrs)?;
        // A SEND waiting on RNR retries by itself; wake the NIC thread so
        // its next poll sees the new receives.
        rt.node(|_| ());
        Ok(())
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        if init.caps.max_inline > MAX_INLINE_DATA {
            return Err(bad(format!(
                "max_inline {} > {MAX_INLINE_DATA}",
                init.caps.max_inline
            )));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let scq = st.cq(init.send_cq)?;
        let rcq = st.cq(init.recv_cq)?;
        let srq = init.srq.map(|s| st.srq(s)).transpose()?;
        let rt = st.rt(ca);
        let qpn = match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => rt.node(|n| n.reserve_qpn()),
            QpType::Gsi => Qpn::from_bits(1),
            QpType::Smi if rt.personality == Personality::Ib => Qpn::from_bits(0),
            QpType::Smi => return Err(VerbsError::NotSupported("QP0 on a roce port")),
        };
        if matches!(init.qp_type, QpType::Gsi | QpType::Smi)
            && rt.routes_lock().contains_key(&qpn.value())
        {
            return Err(VerbsError::Busy("the special QP exists"));
        }
        let send_cq = st.cq_arc(scq);
        let recv_cq = st.cq_arc(rcq);
        st.adjust(p, 1);
        st.adjust(scq, 1);
        st.adjust(rcq, 1);
        if let Some(s) = srq {
            st.adjust(s, 1);
        }
        let handler = st.handler(ca);
        rt.routes_lock().insert(
            qpn.value(),
            Route {
                handler,
                send_cq,
                recv_cq,
                ctx,
                quiet_error: false,
            },
        );
        let caps = init.caps;
        Ok(QpHandle(st.alloc(Obj::Qp(Box::new(QpObj {
            ca,
            pd: p,
            init: *init,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            early: RecvQueue::new(caps.max_recv_wr.max(1), caps.max_recv_sge.max(1)),
            access: Arc::new(AtomicU32::new(0)),
            ctx,
            engine: false,
        })))))
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        let st = self.lock();
        let i = st.qp(qp)?;
        match st.obj(i) {
            Obj::Qp(q) => Ok(q.qpn),
            _ => unreachable!("checked QP"),
        }
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let ca = st.qp_mut(i).ca;
        engine_state(&st.rt(ca), st.qp_mut(i));
        let (qp_type, from) = {
            let q = st.qp_mut(i);
            (q.init.qp_type, q.state)
        };
        let to = qp_table::check(qp_type, from, attr)?;
        if attr.alt_path.is_some() || attr.path_mig_state.is_some() {
            return Err(VerbsError::NotSupported("alternate paths (APM)"));
        }
        if let Some(ix) = attr.pkey_index {
            let ca = st.qp_mut(i).ca;
            let n = st.rt(ca).pkey_table().len();
            if usize::from(ix) >= n {
                return Err(bad(format!("P_Key index {ix} outside the {n}-entry table")));
            }
        }
        if attr.port.is_some_and(|p| p.0 != 1) {
            return Err(bad("the CA has one port"));
        }
        let (ca, pd, srq_rq) = {
            let q = st.qp_mut(i);
            (q.ca, q.pd, q.init.srq)
        };
        let srq = match srq_rq {
            Some(h) => {
                let si = st.srq(h)?;
                match st.obj(si) {
                    Obj::Srq { rq, ca, ctx, .. } => Some(SrqRef {
                        rq: rq.clone(),
                        handler: st.handler(*ca),
                        ctx: *ctx,
                    }),
                    _ => None,
                }
            }
            None => None,
        };
        let rt = st.rt(ca);
        let udp_port = self.udp_port;
        let q = st.qp_mut(i);
        merge(&mut q.attr, attr);
        if let Some(a) = attr.access {
            q.access.store(a.bits(), Ordering::Relaxed);
        }
        let qpn = q.qpn;
        match (from, to) {
            (_, QpState::Err) => {
                if let Some(r) = rt.routes_lock().get_mut(&qpn.value()) {
                    r.quiet_error = true;
                }
                if q.engine {
                    rt.node(|n| {
                        if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                            e.set_error(WcStatus::WrFlushErr);
                        }
                    });
                }
                // Receives never handed to an engine flush here.
                let early = q.early.drain();
                let ctx = q.ctx;
                q.state = QpState::Err;
                drop(st);
                if !early.is_empty() {
                    if let Some(route) = rt.routes_lock().get(&qpn.value()).cloned() {
                        let mut notify = false;
                        for wr in early {
                            let wc = WorkCompletion::new(
                                wr.wr_id,
                                WcStatus::WrFlushErr,
                                WcOpcode::Recv,
                                ctx,
                            );
                            notify |= route.recv_cq.0.push(wc, false).notify;
                        }
                        if notify {
                            route.handler.on_completion(route.recv_cq.1);
                        }
                    }
                }
                // Flushed engine completions come through the driver callback.
                rt.node(|_| ());
                return Ok(());
            }
            (_, QpState::Reset) => {
                if q.engine {
                    rt.node(|n| {
                        n.destroy_qp(softroce::QpHandle(qpn));
                        // Keep the number for this QP.
                        let r = n.reserve_qpn_exact(qpn);
                        debug_assert!(r);
                    });
                    q.engine = false;
                }
                q.early.drain();
                q.state = QpState::Reset;
                q.attr = QpAttr::default();
                if let Some(r) = rt.routes_lock().get_mut(&qpn.value()) {
                    r.quiet_error = false;
                }
                return Ok(());
            }
            (QpState::Init, QpState::Rtr) | (QpState::Reset, QpState::Init)
                if qp_type.is_datagram() || to == QpState::Rtr =>
            {
                // Build the engine now that its attributes are known (UD,
                // GSI: at INIT already, so receives land from the start).
                let mut cfg = engine_config(q, qp_type);
                // The P_Key its index names (an ib port's table comes from
                // the SM; QP0 keeps the default: SMPs are not partitioned).
                let ix = usize::from(q.attr.pkey_index.unwrap_or(0));
                if let (false, Some(k)) = (qp_type == QpType::Smi, rt.pkey_table().get(ix)) {
                    cfg.pkey = *k;
                }
                let mem = PdMem {
                    pd: pd as u32,
                    qpn: qpn.value(),
                    keys: rt.keys.clone(),
                    access: q.access.clone(),
                    srq,
                };
                let remote = q
                    .attr
                    .av
                    .filter(|_| !qp_type.is_datagram())
                    .map(|av| addr_of(av.dgid, udp_port));
                let early: Vec<RecvWr> = q.early.drain();
                let created = rt.node(|n| -> std::io::Result<()> {
                    let h = n.create_qp_at(cfg, Box::new(mem))?;
                    if let Some(r) = remote {
                        n.set_remote(h, r);
                    }
                    if let Some(e) = n.qp_mut(h) {
                        for wr in &early {
                            e.post_recv(recv_wqe(wr));
                        }
                    }
                    Ok(())
                });
                created.map_err(|e| bad(format!("cannot create the QP engine: {e}")))?;
                q.engine = true;
            }
            (QpState::Rts, QpState::Sqd) => {
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        e.set_sqd();
                    }
                });
                q.state = to;
                drop(st);
                // The drained event may be due at once (nothing in flight).
                rt.deliver(softroce::QpHandle(qpn));
                return Ok(());
            }
            (QpState::Rtr, QpState::Rts)
            | (QpState::Init, QpState::Rts)
            | (QpState::Sqd, QpState::Rts)
            | (QpState::Sqe, QpState::Rts) => {
                let a = q.attr;
                // Only RTR->RTS gives a send PSN; the stored one must not
                // rewind a requester that has sent (SQD/SQE->RTS).
                let sq_psn = attr.sq_psn;
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        if let Some(p) = sq_psn {
                            e.set_sq_psn(p);
                        }
                        e.update_config(|c| {
                            c.timeout = a.timeout.unwrap_or(c.timeout);
                            c.retry_cnt = a.retry_cnt.unwrap_or(c.retry_cnt);
                            c.rnr_retry = a.rnr_retry.unwrap_or(c.rnr_retry);
                            c.max_rd_atomic = a.max_rd_atomic.unwrap_or(c.max_rd_atomic).max(1);
                        });
                        e.set_rts();
                    }
                });
            }
            (QpState::Rts, QpState::Rts) | (QpState::Sqd, QpState::Sqd) => {
                let a = q.attr;
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        e.update_config(|c| {
                            c.timeout = a.timeout.unwrap_or(c.timeout);
                            c.retry_cnt = a.retry_cnt.unwrap_or(c.retry_cnt);
                            c.rnr_retry = a.rnr_retry.unwrap_or(c.rnr_retry);
                        });
                    }
                });
            }
            _ => {}
        }
        q.state = to;
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let ca = st.qp_mut(i).ca;
        let rt = st.rt(ca);
        let q = st.qp_mut(i);
        engine_state(&rt, q);
        let mut a = q.attr;
        a.state = Some(q.state);
        Ok(a)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.qp(qp)?;
            let q = match st.release(i) {
                Some(Obj::Qp(q)) => q,
                _ => unreachable!("checked QP"),
            };
            let (scq, rcq, srq) = (
                st.cq(q.init.send_cq).ok(),
                st.cq(q.init.recv_cq).ok(),
                q.init.srq.and_then(|s| st.srq(s).ok()),
            );
            for c in [scq, rcq].into_iter().flatten() {
                st.adjust(c, -1);
            }
            if let Some(s) = srq {
                st.adjust(s, -1);
            }
            st.adjust(q.pd, -1);
            let rt = st.rt(q.ca);
            let qpn = q.qpn;
            rt.routes_lock().remove(&qpn.value());
            rt.node(|n| {
                if !n.destroy_qp(softroce::QpHandle(qpn)) {
                    n.release_qpn(qpn);
                }
            });
            (st.handler(q.ca), q.ctx)
        };
        rt.on_destroyed(ResourceKind::Qp, ctx);
        Ok(())
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if !attr.grh {
            return Err(bad("RoCE address handles need a GRH (destination GID)"));
        }
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let dst = addr_of(attr.dgid, self.udp_port);
        let id = rt.node(|n| n.create_ah(dst));
        st.adjust(p, 1);
        Ok(AhHandle(st.alloc(Obj::Ah { pd: p, id })))
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.slot(ah.0)?;
        let pd = match st.obj(i) {
            Obj::Ah { pd, .. } => *pd,
            _ => return Err(VerbsError::InvalidHandle),
        };
        st.release(i);
        st.adjust(pd, -1);
        Ok(())
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
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let (index, key) = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust(p, 1);
        let h = st.alloc(Obj::Mr {
            ca,
            pd: p,
            key: index,
            lkey: key,
            ctx,
        });
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: Lkey(key),
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
        let i = st.slot(mr.0)?;
        let (ca, key) = match st.obj(i) {
            Obj::Mr { ca, key, .. } => (*ca, *key),
            _ => return Err(VerbsError::InvalidHandle),
        };
        let rt = st.rt(ca);
        let k = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rereg_mr(key, buf, addr, len, access)?;
        if let Obj::Mr { lkey, .. } = st.obj_mut(i) {
            *lkey = k;
        }
        Ok(MrInfo {
            handle: mr,
            lkey: Lkey(k),
            rkey: Rkey(k),
            addr,
            len,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let (handler, ctx) = {
            let mut st = self.lock();
            let i = st.slot(mr.0)?;
            let (ca, pd, key, ctx) = match st.obj(i) {
                Obj::Mr {
                    ca, pd, key, ctx, ..
                } => (*ca, *pd, *key, *ctx),
                _ => return Err(VerbsError::InvalidHandle),
            };
            let rt = st.rt(ca);
            rt.keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dereg_mr(key)?;
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        handler.on_destroyed(ResourceKind::Mr, ctx);
        Ok(())
    }

    fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let (index, key) = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc_mw(p as u32, kind);
        st.adjust(p, 1);
        let h = st.alloc(Obj::Mw {
            ca,
            pd: p,
            index,
            kind,
            ctx,
        });
        Ok((MwHandle(h), Rkey(key)))
    }

    /// Type 1 windows only (type 2 are bound by a BindMw work request);
    /// the bind takes effect at once and produces no completion, as the
    /// loopback provider's does.
    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        let st = self.lock();
        let qi = st.qp(qp)?;
        let Obj::Qp(q) = st.obj(qi) else {
            unreachable!("checked QP")
        };
        if q.state != QpState::Rts {
            return Err(VerbsError::InvalidState(q.state));
        }
        let (ca, pd, qpn) = (q.ca, q.pd, q.qpn);
        let mw = match st.obj(st.slot(bind.mw.0)?) {
            Obj::Mw {
                ca: c, index, kind, ..
            } if st.same_device(*c, ca) => {
                if *kind != MwType::Type1 {
                    return Err(bad("type 2 windows are bound with a BindMw work request"));
                }
                *index
            }
            _ => return Err(VerbsError::InvalidHandle),
        };
        let mr = match st.obj(st.slot(bind.mr.0)?) {
            Obj::Mr { ca: c, key, .. } if st.same_device(*c, ca) => *key,
            _ => return Err(VerbsError::InvalidHandle),
        };
        let rt = st.rt(ca);
        let k = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bind_mw(
                pd as u32,
                mw,
                mr,
                bind.addr,
                bind.len,
                bind.access,
                0,
                qpn.value(),
            )
            .map_err(|s| bad(format!("bind refused: {s}")))?;
        Ok(Rkey(k))
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        let (handler, ctx) = {
            let mut st = self.lock();
            let i = st.slot(mw.0)?;
            let (ca, pd, index, ctx) = match st.obj(i) {
                Obj::Mw {
                    ca, pd, index, ctx, ..
                } => (*ca, *pd, *index, *ctx),
                _ => return Err(VerbsError::InvalidHandle),
            };
            st.rt(ca)
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dealloc_mw(index)?;
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        handler.on_destroyed(ResourceKind::Mw, ctx);
        Ok(())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let (rt, qpn, sig_all, state, ud, max_sge, datagram, uc, mut local) = {
            let st = self.lock();
            let i = st.qp(qp)?;
            let Obj::Qp(q) = st.obj(i) else {
                unreachable!("checked QP")
            };
            // What needs the handle table: the window and region of a
            // bind, and inline data (copied now, so the buffer may be
            // reused as soon as the post returns).
            // Empty (no allocation) when no WR needs it, the usual case.
            let mut local = Vec::new();
            let needs_table = wrs.iter().any(|wr| {
                wr.opcode == SendOpcode::BindMw || wr.flags.contains(verbs::SendFlags::INLINE)
            });
            for wr in wrs.iter().filter(|_| needs_table) {
                let bind = wr
                    .bind_mw
                    .filter(|_| wr.opcode == SendOpcode::BindMw)
                    .map(|b| st.bind_indices(q.ca, &b));
                let inline = wr
                    .flags
                    .contains(verbs::SendFlags::INLINE)
                    .then(|| st.gather_inline(q.ca, q.pd, wr, q.init.caps.max_inline));
                local.push((bind, inline));
            }
            // A GSI WR may name the partition it sends in (IBA 11.4.1.1).
            let table = (q.init.qp_type == QpType::Gsi
                && wrs.iter().any(|w| w.pkey_index.is_some()))
            .then(|| st.rt(q.ca).pkey_table());
            let mut ud = Vec::new();
            for (index, wr) in wrs.iter().enumerate() {
                let pkey = match (&table, wr.pkey_index) {
                    (Some(t), Some(ix)) => match t.get(usize::from(ix)) {
                        Some(k) => Some(*k),
                        None => {
                            return Err(VerbsError::BadWr {
                                index,
                                cause: Box::new(bad(format!(
                                    "P_Key index {ix} outside the {}-entry table",
                                    t.len()
                                ))),
                            })
                        }
                    },
                    _ => None,
                };
                ud.push(match wr.ud {
                    Some(d) => match st.slot(d.ah.0).map(|a| st.obj(a)) {
                        Ok(Obj::Ah { id, .. }) => Some((
                            roce::UdDest {
                                qpn: d.remote_qpn,
                                qkey: d.remote_qkey,
                                ah: id.0,
                            },
                            pkey,
                        )),
                        _ => return Err(bad("invalid address handle")),
                    },
                    None => None,
                });
            }
            (
                st.rt(q.ca),
                q.qpn,
                q.init.sq_sig_all,
                q.state,
                ud,
                q.init.caps.max_send_sge,
                q.init.qp_type.is_datagram(),
                q.init.qp_type == QpType::Uc,
                local,
            )
        };
        // In ERR and SQE the engine flushes what is posted.
        if !matches!(state, QpState::Rts | QpState::Err | QpState::Sqe) {
            return Err(VerbsError::BadWr {
                index: 0,
                cause: Box::new(VerbsError::InvalidState(state)),
            });
        }
        let mut wqes = Vec::with_capacity(wrs.len());
        let mut refused = None;
        for (index, (wr, ud)) in wrs.iter().zip(ud).enumerate() {
            let (bind, inline) = local.get_mut(index).map(std::mem::take).unwrap_or_default();
            let checked = send_wqe(wr, sig_all).and_then(|mut w| {
                if let (roce::SendOp::BindMw(b), Some((mw, mr))) = (&mut w.op, bind) {
                    (b.mw, b.mr) = (mw, mr);
                }
                if let Some(data) = inline {
                    w.inline = Some(data?);
                }
                if wr.sges.len() > max_sge as usize {
                    Err(bad(format!("{} SGEs > max {max_sge}", wr.sges.len())))
                } else if datagram != ud.is_some() {
                    Err(bad("datagram QPs need a destination, connected ones none"))
                } else if datagram
                    && !matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm)
                {
                    Err(bad("only SEND on datagram QPs"))
                } else if uc
                    && matches!(
                        wr.opcode,
                        SendOpcode::RdmaRead
                            | SendOpcode::AtomicCmpSwp
                            | SendOpcode::AtomicFetchAdd
                    )
                {
                    Err(bad("UC has no RDMA READ or atomics (IBA 9.4)"))
                } else if uc && wr.opcode == SendOpcode::SendWithInv {
                    Err(bad("UC has no SEND with invalidate (IBA 9.2)"))
                } else {
                    Ok(w)
                }
            });
            let mut w = match checked {
                Ok(w) => w,
                Err(cause) => {
                    refused = Some(VerbsError::BadWr {
                        index,
                        cause: Box::new(cause),
                    });
                    break;
                }
            };
            let pkey = ud.and_then(|(_, k)| k);
            w.ud = ud.map(|(d, _)| d);
            wqes.push((w, pkey));
        }
        rt.node(|n| {
            for (w, pkey) in &mut wqes {
                if let (Some(d), Some(k)) = (w.ud.as_mut(), *pkey) {
                    if let Some(ah) = n.ah_in_partition(softroce::AhId(d.ah), k) {
                        d.ah = ah.0;
                    }
                }
            }
            if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                for (w, _) in wqes {
                    e.post_send(w);
                }
            }
        });
        refused.map_or(Ok(()), Err)
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let q = st.qp_mut(i);
        if q.init.srq.is_some() {
            return Err(bad("QP uses an SRQ; post to the SRQ"));
        }
        if q.state == QpState::Reset {
            return Err(VerbsError::InvalidState(QpState::Reset));
        }
        if !q.engine {
            return q.early.post(wrs);
        }
        let ca = q.ca;
        let qpn = q.qpn;
        let rt = st.rt(ca);
        drop(st);
        rt.node(|n| {
            if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                for wr in wrs {
                    e.post_recv(recv_wqe(wr));
                }
            }
        });
        Ok(())
    }
}

/// Catches up with the state the engine moved the QP to by itself: ERR
/// on a fatal completion, SQE on a UC/UD send error (IBA 10.3.1.6).
fn engine_state(rt: &CaRt, q: &mut QpObj) {
    if !q.engine || q.state == QpState::Err {
        return;
    }
    let qpn = q.qpn;
    let (err, sqe) = rt.node(|n| {
        n.qp_mut(softroce::QpHandle(qpn))
            .map_or((false, false), |e| (e.is_error(), e.is_send_error()))
    });
    if err {
        q.state = QpState::Err;
    } else if sqe && matches!(q.state, QpState::Rts | QpState::Sqd) {
        q.state = QpState::Sqe;
    }
}

/// The engine's configuration from the QP's accumulated attributes.
fn engine_config(q: &QpObj, qp_type: QpType) -> QpConfig {
    let a = &q.attr;
    let mut c = QpConfig::rc(q.qpn, a.dest_qpn.unwrap_or(Qpn::from_bits(0)));
    c.qp_type = qp_type;
    c.pmtu = a.path_mtu.unwrap_or(Mtu::Mtu1024);
    c.rq_psn = a.rq_psn.unwrap_or(Psn::new(0));
    c.sq_psn = a.sq_psn.unwrap_or(Psn::new(0));
    c.max_dest_rd_atomic = a.max_dest_rd_atomic.unwrap_or(4).max(1);
    c.min_rnr_timer = a.min_rnr_timer.unwrap_or(12);
    c.qkey = a.qkey.unwrap_or(if qp_type == QpType::Gsi {
        Qkey::GSI
    } else {
        Qkey(0)
    });
    c.srq = q.init.srq.is_some();
    c
}

/// Applies the attributes `new` gives on top of `acc`.
fn merge(acc: &mut QpAttr, new: &QpAttr) {
    macro_rules! take {
        ($($f:ident),*) => { $( if new.$f.is_some() { acc.$f = new.$f; } )* };
    }
    take!(
        state,
        port,
        pkey_index,
        qkey,
        access,
        path_mtu,
        dest_qpn,
        rq_psn,
        sq_psn,
        av,
        max_dest_rd_atomic,
        max_rd_atomic,
        min_rnr_timer,
        timeout,
        retry_cnt,
        rnr_retry,
        en_sqd_async_notify
    );
}

/// The faults `SOFTROCE_FAULTS` asks for (`None` when unset or empty).
fn faults_from_env() -> Result<Option<FaultConfig>> {
    match std::env::var("SOFTROCE_FAULTS") {
        Ok(spec) if !spec.trim().is_empty() => FaultConfig::parse(&spec)
            .map(Some)
            .map_err(|e| bad(format!("SOFTROCE_FAULTS: {e}"))),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::conformance::{connect, Feature, Fixture, Node as TNode};

    /// A packet's payload lent from an MR survives the MR's deregistration
    /// and the consumer dropping its buffer (the packet holds the
    /// allocation); lending checks key, range and rights like a copy.
    #[test]
    fn lent_payload_outlives_deregistration_and_is_checked() {
        let buf = MemBuf::new(8192);
        for i in 0..8192 {
            buf.write_at(i, &[(i % 251) as u8]);
        }
        let keys = Arc::new(Mutex::new(KeyTable::new()));
        let (index, key) = keys
            .lock()
            .unwrap()
            .reg_mr(1, &buf, buf.addr() + 4096, 4096, AccessFlags::REMOTE_READ)
            .unwrap();
        let mut mem = PdMem {
            pd: 1,
            qpn: 0x11,
            keys: keys.clone(),
            access: Arc::new(AtomicU32::new(AccessFlags::ALL.bits())),
            srq: None,
        };
        let addr = buf.addr() + 4096 + 100;
        let want = buf.to_vec(4196, 2000);
        let lent = mem.pin_local(Lkey(key), addr, 2000).unwrap().unwrap();
        let read = mem.pin_remote(Rkey(key), addr, 2000).unwrap().unwrap();
        assert_eq!(lent.as_slice(), &want[..]);
        assert_eq!(read.as_slice(), &want[..]);
        // Outside the region, another PD's view, a wrong key: refused.
        assert!(mem.pin_local(Lkey(key), addr, 4096).is_err());
        assert!(mem.pin_local(Lkey(key), buf.addr(), 16).is_err());
        assert!(mem.pin_remote(Rkey(key ^ 0x100), addr, 16).is_err());
        keys.lock().unwrap().dereg_mr(index).unwrap();
        assert_eq!(
            mem.pin_local(Lkey(key), addr, 16).err(),
            Some(MemoryError::BadKey)
        );
        drop(buf);
        // The packets alone keep the allocation, whose bytes are unchanged.
        assert_eq!(Arc::strong_count(lent.owner()), 2);
        drop(read);
        assert_eq!(Arc::strong_count(lent.owner()), 1);
        assert_eq!(lent.as_slice(), &want[..]);
    }

    struct Two(Arc<SoftRoce>);

    impl Fixture for Two {
        fn provider(&self) -> Arc<dyn Provider> {
            self.0.clone()
        }
        fn guids(&self) -> (Guid, Guid) {
            (Guid(0xa1), Guid(0xb2))
        }
        fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
            Err(VerbsError::NotSupported("port control"))
        }
        fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
            Err(VerbsError::NotSupported("port control"))
        }
        fn remove_ca(&self, _: Guid) -> Result<()> {
            Err(VerbsError::NotSupported("port control"))
        }
        fn lacks(&self) -> Vec<Feature> {
            Vec::new()
        }
    }

    /// A lossy sender still delivers every SEND in order, by retransmitting;
    /// the counters show it. Faults are refused once the CA is open.
    #[test]
    fn seeded_loss_is_recovered_and_counted() {
        let ca = |g: u64, last: u8| SoftCa {
            guid: Guid(g),
            ip: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 91, last)),
        };
        let p = SoftRoce::new(vec![ca(0xa1, 201), ca(0xb2, 202)], ROCE_PORT);
        assert!(matches!(
            p.set_faults(Guid(0x99), None),
            Err(VerbsError::NoSuchCa)
        ));
        p.set_faults(Guid(0xa1), Some(FaultConfig::lossy(7, 0.2)))
            .unwrap();
        assert_eq!(p.counters(Guid(0xa1)), None, "not open yet");
        let f = Two(p.clone());
        let (a, b) = (
            TNode::open(&f, Guid(0xa1), 512),
            TNode::open(&f, Guid(0xb2), 512),
        );
        assert!(matches!(
            p.set_faults(Guid(0xa1), None),
            Err(VerbsError::Busy(_))
        ));
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
        connect(&a, qa, &b, qb, QpType::Rc, 7);
        const N: u64 = 60;
        const LEN: u32 = 1000;
        let recvs: Vec<RecvWr> = (0..N)
            .map(|i| RecvWr {
                wr_id: i,
                sges: vec![b.sge(i * LEN as u64, LEN)],
            })
            .collect();
        b.p.post_recv(qb, &recvs).unwrap();
        for i in 0..N {
            let at = (i * LEN as u64) as usize;
            a.buf.write_at(at, &vec![i as u8 ^ 0x5a; LEN as usize]);
            let mut w = SendWr::new(i, SendOpcode::Send, vec![a.sge(at as u64, LEN)]);
            w.flags = verbs::SendFlags::SIGNALED;
            a.p.post_send(qa, &[w]).unwrap();
        }
        for i in 0..N {
            let wc = b.wc();
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (i, WcStatus::Success, LEN)
            );
            let got = b.buf.to_vec((i * LEN as u64) as usize, LEN as usize);
            assert!(got.iter().all(|&x| x == i as u8 ^ 0x5a), "message {i}");
        }
        for i in 0..N {
            let wc = a.wc();
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        let c = p.counters(Guid(0xa1)).unwrap();
        assert!(c.retransmits > 0, "{c:?}");
        assert!(c.tx_packets > N, "{c:?}");
        let r = p.counters(Guid(0xb2)).unwrap();
        assert!(
            r.out_of_sequence + r.duplicates > 0 || c.timeouts > 0,
            "{r:?} {c:?}"
        );
        // The totals outlive the QP that counted them.
        a.p.destroy_qp(qa).unwrap();
        let after = p.counters(Guid(0xa1)).unwrap();
        assert_eq!(after.retransmits, c.retransmits, "{after:?}");
        assert!(after.tx_packets >= c.tx_packets, "{after:?}");
    }
}
