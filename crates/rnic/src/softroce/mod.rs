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
//! (retransmissions among them). A CA with no faults set takes the
//! provider's ([`NicOptions::faults`]).
//!
//! Options of the whole provider ([`NicOptions`], given to
//! [`SoftRoce::with_options`]): UDP GSO/GRO, following the link under each
//! CA's address, default faults. The provider reads no environment
//! variable; binaries map `SOFTROCE_GSO`, `SOFTROCE_FOLLOW_LINK` and
//! `SOFTROCE_FAULTS` (the tools' spec, e.g. `loss=0.01,seed=3`) onto them
//! with [`NicOptions::from_env`], so any of our binaries can be run over a
//! lossy link — the interop harness does this against Linux rxe; a bad
//! spec stops the binary with the variable named.
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
//! A port shared by processes ([`SoftRoce::share_port`], the NIC daemon
//! and its clients): a CA's node then receives on a member of the port's
//! `roce_udp::PortGroup` instead of binding its address, and numbers its
//! QPs in the member's block; QP0 and QP1 are the block 0 owner's.
//!
//! What it refuses (`NotSupported`): alternate paths (no path migration:
//! a CA has one address, and the engine no second destination; the APM
//! conformance cases are declared skipped), QP0 on a `roce` port, and QP0
//! and QP1 on a shared port's member that is not its owner.
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

pub use ca::SharedPort;
pub use guid::ip_guid;
pub use options::{NicEnvError, NicOptions, FAULTS_ENV, FOLLOW_LINK_ENV};
pub use rdma_sim::FaultConfig;
pub use softroce::{Fed, Feeder, FeederId, PkeyViolation};

mod ca;
mod cq;
mod events;
mod guid;
mod memory;
mod mr;
mod objects;
mod options;
mod port;
mod post;
mod qp;
mod srq;
#[cfg(test)]
mod tests;

use ca::{CaRt, CaSlot};
use events::Route;
use memory::{PdMem, SrqRef};
use mr::NO_INDEX;
use objects::{Obj, QpObj, State};
use port::{pkey_index_of, CaOpen, PortStatus};
use post::recv_wqe;

/// Default RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// Most inline data one send WR may carry (what Linux rxe reported before
/// it derived the figure from its WQE size).
pub const MAX_INLINE_DATA: u32 = 400;

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

impl SoftCa {
    /// The CA at `ip` with the GUID of its address ([`ip_guid`]), as the
    /// daemons and tools make theirs. For an initiator the GUID is the
    /// second half of its port ID, which targets key LUN masking and
    /// multichannel by: two hosts with one GUID and the same
    /// initiator_ext would be one initiator to the target, and each SINGLE
    /// login would end the other's channels.
    pub fn at(ip: IpAddr) -> SoftCa {
        SoftCa {
            guid: ip_guid(ip),
            ip,
        }
    }

    /// [`SoftCa::at`] each address.
    pub fn at_each(ips: &[IpAddr]) -> Vec<SoftCa> {
        ips.iter().copied().map(SoftCa::at).collect()
    }
}

/// The soft RoCE provider.
pub struct SoftRoce {
    udp_port: u16,
    mtu: Mtu,
    /// The CAs, in the order they were given and added
    /// ([`SoftRoce::add_ca`]).
    cas: std::sync::RwLock<Vec<SoftCa>>,
    options: NicOptions,
    st: Mutex<State>,
    /// What the provider keeps of each CA, open or not, by GUID: one slot
    /// per entry of `cas`, all behind one lock.
    slots: Mutex<HashMap<u64, CaSlot>>,
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

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
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
        SoftRoce::with_options(cas, udp_port, mtu, NicOptions::default())
    }

    /// Like [`SoftRoce::with_mtu`], with `options` instead of the defaults
    /// (binaries pass [`NicOptions::from_env`]).
    pub fn with_options(
        cas: Vec<SoftCa>,
        udp_port: u16,
        mtu: Mtu,
        options: NicOptions,
    ) -> Arc<SoftRoce> {
        let slots = cas.iter().map(|c| (c.guid.0, CaSlot::default()));
        let follow = options.follow_link;
        let p = Arc::new(SoftRoce {
            udp_port,
            mtu,
            options,
            st: Mutex::new(State::default()),
            slots: Mutex::new(slots.collect()),
            cas: std::sync::RwLock::new(Vec::new()),
        });
        if follow {
            p.follow_links(&cas);
        }
        *p.cas.write().unwrap_or_else(|e| e.into_inner()) = cas;
        p
    }

    /// A CA's port follows the link under its address, as rxe's follows
    /// its netdev (`softroce::link`; unless the options say not to, and
    /// on failure only timeouts find a dead link).
    fn follow_links(self: &Arc<Self>, cas: &[SoftCa]) {
        let guids: Vec<Guid> = cas.iter().map(|c| c.guid).collect();
        let ips: Vec<IpAddr> = cas.iter().map(|c| c.ip).collect();
        let _ = softroce::link::follow(Arc::downgrade(self), &ips, move |p: &SoftRoce, k, up| {
            let _ = p.set_port_active(guids[k], up);
        });
    }

    /// Adds `ca` to a running provider (as `rdma link add` does a device):
    /// it is listed at once and bound at its first open. Adding a CA the
    /// provider has (same GUID and address) again does nothing.
    ///
    /// # Errors
    /// `InvalidArgument` when another CA has its GUID.
    pub fn add_ca(self: &Arc<Self>, ca: SoftCa) -> Result<()> {
        {
            let mut cas = self.cas.write().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = cas.iter().find(|c| c.guid == ca.guid) {
                if old.ip == ca.ip {
                    return Ok(());
                }
                return Err(bad(format!(
                    "GUID {:#018x} is the CA at {} already",
                    ca.guid.0, old.ip
                )));
            }
            self.slots().entry(ca.guid.0).or_default();
            cas.push(ca.clone());
        }
        if self.options.follow_link {
            self.follow_links(std::slice::from_ref(&ca));
        }
        Ok(())
    }

    /// Takes CA `guid` off the list again, as `rdma link delete` does a
    /// device nobody uses (an open CA is removed with [`SoftRoce::remove_ca`]).
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` while the CA is open.
    pub fn forget_ca(&self, guid: Guid) -> Result<()> {
        let mut cas = self.cas.write().unwrap_or_else(|e| e.into_inner());
        let mut slots = self.slots();
        match slots.get(&guid.0) {
            None => return Err(VerbsError::NoSuchCa),
            Some(s) if s.open.is_some() => return Err(VerbsError::Busy("the CA is open")),
            Some(_) => {}
        }
        slots.remove(&guid.0);
        cas.retain(|c| c.guid != guid);
        Ok(())
    }

    /// The CA `guid` as given or added.
    pub(super) fn ca_config(&self, guid: Guid) -> Option<SoftCa> {
        let cas = self.cas.read().unwrap_or_else(|e| e.into_inner());
        cas.iter().find(|c| c.guid == guid).cloned()
    }

    /// The options the provider was made with.
    pub fn options(&self) -> &NicOptions {
        &self.options
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Each verb but a few one-liners is the inherent method of the same name
/// in the file of its object (`ca`, `port`, `cq`, `srq`, `qp`, `mr`,
/// `post`), visible in this module only (see `forward_verbs!`).
impl Provider for SoftRoce {
    fn name(&self) -> &'static str {
        "softroce"
    }

    fn list_cas(&self) -> Vec<Guid> {
        let cas = self.cas.read().unwrap_or_else(|e| e.into_inner());
        cas.iter().map(|c| c.guid).collect()
    }

    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        let guid = self.port_one(ca, port)?;
        Ok(SoftRoce::take_pkey_violations(self, guid)
            .map(|(count, latest)| PkeyViolations { count, latest }))
    }

    forward_verbs! {
        fn open_ca(
            &self,
            guid: Guid,
            ctx: Context,
            handler: Arc<dyn EventHandler>,
        ) -> Result<CaHandle>;
        fn query_ca(&self, ca: CaHandle) -> Result<CaAttr>;
        fn close_ca(&self, ca: CaHandle) -> Result<()>;
        fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr>;
        fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()>;
        fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle>;
        fn dealloc_pd(&self, pd: PdHandle) -> Result<()>;
        fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle>;
        fn destroy_cq(&self, cq: CqHandle) -> Result<()>;
        fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize>;
        fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()>;
        fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()>;
        fn drive_cq(&self, cq: CqHandle, spin: std::time::Duration, timeout: std::time::Duration) -> Result<bool>;
        fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle>;
        fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()>;
        fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr>;
        fn destroy_srq(&self, srq: SrqHandle) -> Result<()>;
        fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()>;
        fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle>;
        fn qp_num(&self, qp: QpHandle) -> Result<Qpn>;
        fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()>;
        fn query_qp(&self, qp: QpHandle) -> Result<QpAttr>;
        fn destroy_qp(&self, qp: QpHandle) -> Result<()>;
        fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle>;
        fn destroy_ah(&self, ah: AhHandle) -> Result<()>;
        fn reg_mr(
            &self,
            pd: PdHandle,
            buf: &MemBuf,
            addr: u64,
            len: u64,
            access: AccessFlags,
            ctx: Context,
        ) -> Result<MrInfo>;
        fn rereg_mr(
            &self,
            mr: MrHandle,
            buf: &MemBuf,
            addr: u64,
            len: u64,
            access: AccessFlags,
        ) -> Result<MrInfo>;
        fn dereg_mr(&self, mr: MrHandle) -> Result<()>;
        fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)>;
        fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey>;
        fn dealloc_mw(&self, mw: MwHandle) -> Result<()>;
        fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()>;
        fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()>;
    }
}
