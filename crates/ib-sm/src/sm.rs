//! The subnet manager and its subnet administrator, sans-IO.

use crate::partitions::{self, default_partitions, Partition, DEFAULT_PKEY};
use rdma_access::gsi::{status_reply, MadBytes};
use rdma_access::sma::{
    state, Sma, SmaConfig, SMP_DATA, TRAP_BAD_MKEY, TRAP_BAD_PKEY, TRAP_CAPABILITY_MASK_CHANGE,
};
use rdma_mad::mad::{MadStatus, Method, StatusCode, MAD_SIZE};
use rdma_mad::rmpp::{self, RmppHeader};
use rdma_mad::sa::{
    InformInfo, PathRecord, SaAttr, SaHeader, ServiceRecord, SA_CLASS_VERSION, SA_HDR_LEN,
};
use rdma_mad::smp::{cap, BadKeyTrap, NodeInfo, Notice, PortInfo, SmInfo, SmpAttr};
use rdma_types::{Duration, Gid, Guid, Instant, Pkey};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// QP numbers MADs travel to.
pub const QP_SMI: u8 = 0;
/// The general services QP.
pub const QP_GSI: u8 = 1;

pub use rdma_mad::sa::{
    path_comp, portinfo_comp, service_comp, ERR_NO_RECORDS as SA_ERR_NO_RECORDS,
    ERR_REQ_INVALID as SA_ERR_REQ_INVALID,
};
use rdma_mad::sa::{NODE_RECORD_LEN, PORTINFO_RECORD_LEN};

/// Paths per port pair a GetTable without NumbPath gets at most: with LMC
/// 4 that is every pair of LIDs; above it the first 256 in opensm's order
/// (its SA would list all 2^(2 LMC), up to 16384 per pair).
pub const MAX_PATHS_PER_PAIR: usize = 256;

/// SMInfo:SMState (IBA 14.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmState {
    /// Not active: neither sweeps nor polls (after a DISABLE).
    NotActive,
    /// Discovering: the first sweep, reading only, looking for other SMs.
    Discovering,
    /// Standby: polls the master's SMInfo, takes over when it goes.
    Standby,
    /// Master: sweeps and configures the subnet.
    Master,
}

impl SmState {
    /// The SMInfo:SMState code.
    pub fn code(self) -> u8 {
        match self {
            SmState::NotActive => 0,
            SmState::Discovering => 1,
            SmState::Standby => 2,
            SmState::Master => 3,
        }
    }
}

/// SMInfo Set attribute modifiers (IBA 14.4.1, table 185).
pub mod sminfo_control {
    /// Hand mastership to the receiver.
    pub const HANDOVER: u32 = 1;
    /// Acknowledge a handover.
    pub const ACKNOWLEDGE: u32 = 2;
    /// Stop being an SM.
    pub const DISABLE: u32 = 3;
    /// Become standby.
    pub const STANDBY: u32 = 4;
    /// Discover again.
    pub const DISCOVER: u32 = 5;
}

/// True if SM `a` outranks SM `b`: higher priority, then lower GUID.
pub fn outranks(a: &SmInfo, b: &SmInfo) -> bool {
    a.priority > b.priority || (a.priority == b.priority && a.guid.0 < b.guid.0)
}

/// How the SM runs.
#[derive(Debug, Clone)]
pub struct SmConfig {
    /// The SM's port GUID.
    pub guid: Guid,
    /// The SM's own LID.
    pub lid: u16,
    /// Time between sweeps.
    pub sweep_interval: Duration,
    /// Time an SMP or Report waits for its answer.
    pub timeout: Duration,
    /// Resends before a node counts as gone.
    pub retries: u32,
    /// Partitions (default: everyone a full member of 0x7fff).
    pub partitions: Vec<Partition>,
    /// SMInfo:Priority (0 to 15; the highest is master).
    pub priority: u8,
    /// SMInfo:SM_Key (a Set of SMInfo must carry it). The SA takes the
    /// same key (opensm has a separate `sa_key`): an SA request carrying
    /// another non-zero SM_Key is dropped, and one carrying this key (not
    /// zero) is trusted and sees the ports' M_Keys in PortInfoRecords.
    pub sm_key: u64,
    /// Time between a standby's polls of the master's SMInfo, and a
    /// master's of its standbys'.
    pub poll_interval: Duration,
    /// The M_Key the SM gives every port it configures and sends in every
    /// SMP (0: none, the ports stay unprotected).
    pub mkey: u64,
    /// PortInfo:M_KeyProtectBits it gives them (0 to 3, IBA 14.2.4.1).
    pub mkey_protect: u8,
    /// PortInfo:M_KeyLeasePeriod it gives them, seconds (0: forever).
    pub mkey_lease: u16,
    /// PortInfo:LMC it gives every port it configures (0 to 7; more is
    /// taken as 7): each port gets `2^lmc` LIDs from a base LID aligned
    /// to `2^lmc`, as opensm's `lmc` option does. The SM's own port keeps
    /// its single LID.
    pub lmc: u8,
}

impl SmConfig {
    /// Sweeps every 10 s; 200 ms per SMP, 3 resends.
    pub fn new(guid: Guid) -> SmConfig {
        SmConfig {
            guid,
            lid: 1,
            sweep_interval: Duration::from_secs(10),
            timeout: Duration::from_millis(200),
            retries: 3,
            partitions: default_partitions(),
            priority: 0,
            sm_key: 0,
            poll_interval: Duration::from_secs(3),
            mkey: 0,
            mkey_protect: 0,
            mkey_lease: 0,
            lmc: 0,
        }
    }
}

/// A MAD for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing<P> {
    /// The node.
    pub to: P,
    /// QP 0 (SMPs) or 1 (SA).
    pub qp: u8,
    /// The MAD.
    pub mad: Box<MadBytes>,
}

/// What the SM noticed, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmEvent {
    /// A port is ACTIVE with this LID (trap 64 sent).
    PortUp {
        /// Port GUID.
        guid: Guid,
        /// Its LID.
        lid: u16,
    },
    /// A port stopped answering (trap 65 sent).
    PortDown {
        /// Port GUID.
        guid: Guid,
    },
    /// This SM's SMInfo:SMState changed.
    State(SmState),
    /// The master this standby polled stopped answering: this SM takes
    /// over.
    MasterLost {
        /// The old master's GUID.
        guid: Guid,
    },
    /// A port's CapabilityMask changed (trap 144, forwarded to
    /// subscribers).
    CapabilityChange {
        /// Port GUID.
        guid: Guid,
        /// The new mask.
        mask: u32,
    },
    /// A port refused an SMP for its M_Key (trap 256 from its SMA,
    /// forwarded to subscribers).
    BadMkey {
        /// Port GUID.
        guid: Guid,
        /// The requester's LID, if the SMP said (directed route).
        requester: u16,
        /// The refused SMP's method and attribute.
        method: u8,
        /// Attribute ID.
        attr: u16,
    },
    /// A port dropped a packet for its P_Key (trap 257 from its SMA,
    /// forwarded to subscribers): someone outside a partition tried to
    /// reach it.
    BadPkey {
        /// The port that dropped it.
        guid: Guid,
        /// The P_Key the packet carried.
        pkey: Pkey,
        /// The sender's GID.
        from: Gid,
        /// The sender's port GUID, when it is a port of this subnet.
        from_guid: Option<Guid>,
        /// The sender's QP (0 when the port could not tell).
        src_qp: u32,
        /// The QP the packet was for.
        dest_qp: u32,
    },
    /// A port will not be configured by this SM: its PortInfo hid the
    /// M_Key from this SM's key (protect level 1), or it answered Gets
    /// but dropped the Sets (a wrong key at level 0). It is left alone
    /// until its key is shown (the lease ran out) or this SM's key fits.
    MkeyRefused {
        /// Port GUID.
        guid: Guid,
    },
    /// A port's PortInfo showed an M_Key other than this SM's (level 0,
    /// or its lease ran out): this SM uses it for that port until its
    /// Set(PortInfo) gives the port this SM's key.
    MkeyLearned {
        /// Port GUID.
        guid: Guid,
    },
    /// The master found a standby SM (by a sweep, or when the standby
    /// asked for the master's SMInfo).
    StandbyFound {
        /// Its GUID.
        guid: Guid,
        /// Its priority.
        priority: u8,
    },
    /// A standby this master polled stopped answering (or its port went).
    StandbyLost {
        /// Its GUID.
        guid: Guid,
    },
    /// The SM this master handed over to acknowledged (Set(SMInfo,
    /// ACKNOWLEDGE), IBA 14.4.1): the handover is complete.
    HandoverAcknowledged {
        /// The new master's GUID.
        guid: Guid,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    NodeInfo,
    NodeDescription,
    PortInfo,
    SetPortInfo,
    SetPkeys,
    /// Get(SMInfo) of a port that says IsSM, during a sweep.
    SmInfo,
    /// A standby's Get(SMInfo) of the master.
    Poll,
    /// A master's Get(SMInfo) of a standby (IBA 14.4.1).
    PeerPoll,
    /// Set(SMInfo, HANDOVER) to an SM that outranks this master.
    Handover,
    /// Set(SMInfo, ACKNOWLEDGE) from a new master to the SM that handed
    /// over to it.
    Acknowledge,
}

/// Where a node is in the current sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing asked.
    Idle,
    /// NodeInfo, NodeDescription, PortInfo (and SMInfo) being read.
    Reading,
    /// Read, waiting for a new LID until every port has said which LID it
    /// has (so a LID some port already holds is never given twice).
    Parked,
    /// Being configured (PortInfo, P_Key Sets).
    Configuring,
}

struct Node<P> {
    addr: P,
    gid: Gid,
    info: Option<NodeInfo>,
    desc: [u8; 64],
    port: [u8; 64],
    lid: u16,
    in_service: bool,
    busy: bool,
    stage: Stage,
    /// SMInfo of the SM behind this port, if it says IsSM.
    sm: Option<SmInfo>,
    /// The M_Key this SM's SMPs to the port carry: the configured one,
    /// or one the port showed (see [`SmEvent::MkeyLearned`]).
    mkey: u64,
    /// A master's poll of this standby is out.
    polling: bool,
    /// This master logged the standby SM behind this port (found, not
    /// lost since).
    standby_logged: bool,
    /// The port's refusal of our M_Key is logged (until it takes a Set).
    refused_logged: bool,
    /// This configuration pass has set the port's P_Key table.
    pkeys_done: bool,
}

struct Pending<P> {
    node: Option<usize>,
    to: P,
    qp: u8,
    want: Option<Want>,
    mad: Box<MadBytes>,
    deadline: Instant,
    retries_left: u32,
}

struct Subscriber<P> {
    addr: P,
    trap: u16,
}

/// A registered service and when its lease ends (`None`: indefinite).
struct Service {
    rec: ServiceRecord,
    expires: Option<Instant>,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmStats {
    /// Sweeps started.
    pub sweeps: u64,
    /// SMPs and Reports sent again.
    pub retries: u64,
    /// SA requests answered.
    pub sa_requests: u64,
    /// Reports (notices) sent to subscribers.
    pub reports: u64,
    /// ServiceRecords registered now.
    pub services: u64,
    /// Polls of the master's SMInfo answered (standby).
    pub polls: u64,
    /// Traps received from SMAs (and repressed).
    pub traps: u64,
    /// Trap 256s (bad M_Key) among them.
    pub bad_mkey_traps: u64,
    /// Trap 257s (bad P_Key) among them.
    pub bad_pkey_traps: u64,
    /// Ports found refusing this SM's M_Key (see [`SmEvent::MkeyRefused`]).
    pub mkey_refused: u64,
    /// Polls of standbys' SMInfo answered (master).
    pub standby_polls: u64,
    /// SA MADs ignored because this SM is not master (as opensm does).
    pub sa_ignored: u64,
    /// SA MADs dropped for a non-zero SM_Key that is not this SM's
    /// (IBA C15-0.1.5).
    pub sa_bad_sm_key: u64,
    /// SMInfo Sets refused: a wrong SM_Key, or a control its sender's
    /// state may not send (HANDOVER, DISABLE, STANDBY, DISCOVER from an
    /// SM that is not master; ACKNOWLEDGE from one that is not standby).
    pub sminfo_refused: u64,
}

/// The subnet manager of a fabric whose nodes it reaches directly.
pub struct SubnetManager<P> {
    cfg: SmConfig,
    nodes: Vec<Node<P>>,
    next_lid: u16,
    lid_of: HashMap<Guid, u16>,
    pending: HashMap<u64, Pending<P>>,
    next_tid: u64,
    tx: VecDeque<Outgoing<P>>,
    subscribers: Vec<Subscriber<P>>,
    services: Vec<Service>,
    events: VecDeque<SmEvent>,
    next_sweep: Instant,
    stats: SmStats,
    state: SmState,
    act_count: u32,
    /// The SMA of the SM's own port (answers other SMs' sweeps).
    own: Box<Sma>,
    /// The node whose SM this standby polls.
    master: Option<usize>,
    /// The last traps seen, (sender, TID), so a resent one is repressed
    /// again but forwarded once.
    traps_seen: VecDeque<(P, u64)>,
    /// When a master next polls its standbys.
    next_peer_poll: Instant,
    /// The GUID of the SM this master sent a HANDOVER to, until its
    /// ACKNOWLEDGE comes.
    handed_to: Option<Guid>,
}

fn smp(method: Method, attr: SmpAttr, modifier: u32) -> MadBytes {
    let mut m = [0u8; MAD_SIZE];
    m[0] = 1;
    m[1] = 0x81; // directed route, hop count 0: the node at the other end
    m[2] = 1;
    m[3] = u8::from(method);
    m[16..18].copy_from_slice(&u16::from(attr).to_be_bytes());
    m[20..24].copy_from_slice(&modifier.to_be_bytes());
    m
}

fn service_bytes(r: &ServiceRecord) -> Vec<u8> {
    let mut b = vec![0u8; ServiceRecord::LEN];
    r.emit(&mut b);
    b
}

impl<P: Copy + Eq + std::fmt::Debug> SubnetManager<P> {
    /// An SM for the nodes at `endpoints` (address and port GID); the
    /// first sweep starts at `now`.
    pub fn new(cfg: SmConfig, endpoints: Vec<(P, Gid)>, now: Instant) -> SubnetManager<P> {
        let next_lid = cfg.lid.max(1) + 1;
        let mut own = Box::new(Sma::new(SmaConfig {
            node_guid: cfg.guid,
            port_guid: cfg.guid,
            description: "ib-sm".into(),
            capability_mask: rdma_access::sma::ca_capability_mask(false) | cap::IS_SM,
        }));
        own.assume(cfg.lid, cfg.lid, state::ACTIVE);
        SubnetManager {
            state: SmState::Discovering,
            act_count: 0,
            own,
            master: None,
            traps_seen: VecDeque::new(),
            next_peer_poll: now,
            handed_to: None,
            nodes: endpoints
                .into_iter()
                .map(|(addr, gid)| Node {
                    addr,
                    gid,
                    info: None,
                    desc: [0; 64],
                    port: [0; 64],
                    lid: 0,
                    in_service: false,
                    busy: false,
                    stage: Stage::Idle,
                    sm: None,
                    mkey: cfg.mkey,
                    polling: false,
                    standby_logged: false,
                    refused_logged: false,
                    pkeys_done: false,
                })
                .collect(),
            cfg,
            next_lid,
            lid_of: HashMap::new(),
            pending: HashMap::new(),
            next_tid: 1,
            tx: VecDeque::new(),
            subscribers: Vec::new(),
            services: Vec::new(),
            events: VecDeque::new(),
            next_sweep: now,
            stats: SmStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> SmStats {
        self.stats
    }

    /// SMInfo:SMState now.
    pub fn state(&self) -> SmState {
        self.state
    }

    /// This SM's SMInfo (ActCount counts the SMPs it has sent).
    pub fn sm_info(&self) -> SmInfo {
        SmInfo {
            guid: self.cfg.guid,
            sm_key: self.cfg.sm_key,
            act_count: self.act_count,
            priority: self.cfg.priority,
            sm_state: self.state.code(),
        }
    }

    /// The master a standby polls, with the SMInfo of its last answer.
    pub fn master(&self) -> Option<(P, SmInfo)> {
        let n = &self.nodes[self.master?];
        Some((n.addr, n.sm?))
    }

    /// The other SMs found by sweeps: address and last SMInfo.
    pub fn peers(&self) -> Vec<(P, SmInfo)> {
        self.nodes
            .iter()
            .filter_map(|n| Some((n.addr, n.sm?)))
            .collect()
    }

    /// The SM's LID now: its port's, which it set itself (the configured
    /// one) or a master gave it while it was standby.
    pub fn lid_now(&self) -> u16 {
        self.own.lid()
    }

    /// The SM's port takes itself as master SM (its LID stays).
    fn become_master(&mut self) {
        let lid = self.own.lid();
        self.own.assume(lid, lid, state::ACTIVE);
    }

    fn set_state(&mut self, st: SmState) {
        if self.state != st {
            self.state = st;
            self.events.push_back(SmEvent::State(st));
        }
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing<P>> {
        self.tx.pop_front()
    }

    /// The next event to log.
    pub fn poll_event(&mut self) -> Option<SmEvent> {
        self.events.pop_front()
    }

    /// When [`SubnetManager::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_sweep;
        if let Some(p) = self.pending.values().map(|p| p.deadline).min() {
            t = t.min(p);
        }
        if self.state == SmState::Master && self.nodes.iter().any(|n| n.sm.is_some()) {
            t = t.min(self.next_peer_poll);
        }
        Some(t)
    }

    /// True while SMPs (or Reports) wait for their answers: a sweep is
    /// under way, or a notice not yet acknowledged.
    pub fn busy(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The LID of the port with this GUID, once assigned.
    pub fn lid(&self, guid: Guid) -> Option<u16> {
        self.lid_of.get(&guid).copied()
    }

    /// Ports ACTIVE and answering now.
    pub fn active_ports(&self) -> Vec<(Guid, u16)> {
        self.nodes
            .iter()
            .filter(|n| n.in_service)
            .filter_map(|n| Some((n.info?.port_guid, n.lid)))
            .collect()
    }

    fn send(
        &mut self,
        now: Instant,
        node: Option<usize>,
        to: P,
        qp: u8,
        want: Option<Want>,
        mut mad: MadBytes,
    ) {
        self.next_tid += 1;
        if qp == QP_SMI {
            self.act_count = self.act_count.wrapping_add(1);
        }
        let tid = (u64::from(self.lid_now()) << 48) | self.next_tid;
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        if let (QP_SMI, Some(i)) = (qp, node) {
            mad[24..32].copy_from_slice(&self.nodes[i].mkey.to_be_bytes());
        }
        let mad = Box::new(mad);
        self.tx.push_back(Outgoing {
            to,
            qp,
            mad: mad.clone(),
        });
        self.pending.insert(
            tid,
            Pending {
                node,
                to,
                qp,
                want,
                mad,
                deadline: now + self.cfg.timeout,
                retries_left: self.cfg.retries,
            },
        );
    }

    fn ask(&mut self, now: Instant, i: usize, want: Want, mad: MadBytes) {
        self.nodes[i].busy = true;
        let to = self.nodes[i].addr;
        self.send(now, Some(i), to, QP_SMI, Some(want), mad);
    }

    /// Timers: resends, gone nodes, the next sweep.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for tid in due {
            let Some(p) = self.pending.get_mut(&tid) else {
                continue;
            };
            if p.retries_left > 0 {
                p.retries_left -= 1;
                p.deadline = now + self.cfg.timeout;
                self.stats.retries += 1;
                self.tx.push_back(Outgoing {
                    to: p.to,
                    qp: p.qp,
                    mad: p.mad.clone(),
                });
                continue;
            }
            let p = self.pending.remove(&tid).expect("present");
            if let (Some(i), Some(want)) = (p.node, p.want) {
                self.node_lost(now, i, want);
            }
            // A Report nobody acknowledged is dropped (the subscriber stays).
        }
        if self.state == SmState::Master && now >= self.next_peer_poll {
            self.next_peer_poll = now + self.cfg.poll_interval;
            for i in 0..self.nodes.len() {
                let standby = self.nodes[i]
                    .sm
                    .is_some_and(|s| s.sm_state == SmState::Standby.code());
                if standby {
                    self.poll_peer(now, i);
                }
            }
        }
        if now >= self.next_sweep {
            match self.state {
                SmState::Master | SmState::Discovering => self.start_sweep(now),
                SmState::Standby => {
                    self.next_sweep = now + self.cfg.poll_interval;
                    match self.master {
                        Some(i) if !self.nodes[i].busy => {
                            self.ask(now, i, Want::Poll, smp(Method::Get, SmpAttr::SmInfo, 0))
                        }
                        Some(_) => {}
                        None => self.start_sweep(now),
                    }
                }
                SmState::NotActive => self.next_sweep = now + self.cfg.sweep_interval,
            }
        }
    }

    /// A master's Get(SMInfo) of the SM at node `i` (IBA 14.4.1), beside
    /// any sweep of the node.
    fn poll_peer(&mut self, now: Instant, i: usize) {
        if self.nodes[i].polling {
            return;
        }
        self.nodes[i].polling = true;
        let to = self.nodes[i].addr;
        let m = smp(Method::Get, SmpAttr::SmInfo, 0);
        self.send(now, Some(i), to, QP_SMI, Some(Want::PeerPoll), m);
    }

    /// Records what the SM at node `i` said of itself; a master logs a
    /// standby it did not know.
    fn peer_seen(&mut self, i: usize, info: SmInfo) {
        let n = &mut self.nodes[i];
        if n.sm.is_some_and(|s| s.guid != info.guid) {
            n.standby_logged = false;
        }
        n.sm = Some(info);
        if !n.standby_logged
            && self.state == SmState::Master
            && info.guid != self.cfg.guid
            && info.sm_state == SmState::Standby.code()
        {
            n.standby_logged = true;
            self.events.push_back(SmEvent::StandbyFound {
                guid: info.guid,
                priority: info.priority,
            });
        }
    }

    /// Node `i` has no SM (any more); a master logs a standby gone.
    fn peer_gone(&mut self, i: usize) {
        let logged = std::mem::take(&mut self.nodes[i].standby_logged);
        if let Some(s) = self.nodes[i].sm.take() {
            if logged && self.state == SmState::Master {
                self.events.push_back(SmEvent::StandbyLost { guid: s.guid });
            }
        }
    }

    fn start_sweep(&mut self, now: Instant) {
        self.next_sweep = now + self.cfg.sweep_interval;
        if self.state == SmState::Master {
            self.stats.sweeps += 1;
        }
        for i in 0..self.nodes.len() {
            if !self.nodes[i].busy {
                self.nodes[i].stage = Stage::Reading;
                self.ask(
                    now,
                    i,
                    Want::NodeInfo,
                    smp(Method::Get, SmpAttr::NodeInfo, 0),
                );
            }
        }
        self.sweep_progress(now);
    }

    /// After every answer or loss: a discovering SM decides once nothing
    /// is being read; a master gives new LIDs once every port has said
    /// which it holds.
    fn sweep_progress(&mut self, now: Instant) {
        if self.nodes.iter().any(|n| n.stage == Stage::Reading) {
            return;
        }
        match self.state {
            SmState::Discovering => self.decide(now),
            SmState::Master => {
                for i in 0..self.nodes.len() {
                    if self.nodes[i].stage != Stage::Parked {
                        continue;
                    }
                    let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
                    if !self.lid_of.contains_key(&guid) {
                        let Some(l) = self.fresh_lid() else {
                            // No LIDs left: the port waits for a sweep
                            // after one frees.
                            self.nodes[i].stage = Stage::Idle;
                            self.nodes[i].busy = false;
                            continue;
                        };
                        self.lid_of.insert(guid, l);
                    }
                    self.configure(now, i, true);
                }
            }
            _ => {}
        }
    }

    /// The end of discovery (IBA 14.4.1): a master found is followed; else
    /// an SM that outranks this one; else this one is master.
    fn decide(&mut self, now: Instant) {
        let me = self.sm_info();
        let mut best: Option<(usize, SmInfo)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(peer) = n.sm else { continue };
            if peer.guid == me.guid || peer.sm_state == SmState::NotActive.code() {
                continue;
            }
            let key = |x: &SmInfo| (x.sm_state == SmState::Master.code(), outranks(x, &me));
            let better = match &best {
                None => key(&peer) != (false, false),
                Some((_, b)) => key(&peer) > key(b) || (key(&peer) == key(b) && outranks(&peer, b)),
            };
            if better {
                best = Some((i, peer));
            }
        }
        match best {
            Some((i, _)) => self.follow(now, i),
            None => {
                self.set_state(SmState::Master);
                self.become_master();
                self.start_sweep(now);
            }
        }
    }

    /// Becomes standby polling the SM at node `i`.
    fn follow(&mut self, now: Instant, i: usize) {
        self.master = Some(i);
        for n in &mut self.nodes {
            n.standby_logged = false;
        }
        self.set_state(SmState::Standby);
        for n in &mut self.nodes {
            if n.stage == Stage::Parked {
                n.stage = Stage::Idle;
                n.busy = false;
            }
        }
        self.next_sweep = now + self.cfg.poll_interval;
    }

    /// LIDs per port: `2^lmc`.
    fn span(&self) -> u16 {
        1 << self.cfg.lmc.min(7)
    }

    /// The LID range of the port with this GUID (base LID and the
    /// `2^lmc - 1` above it), once assigned.
    pub fn lids(&self, guid: Guid) -> Option<std::ops::RangeInclusive<u16>> {
        let base = self.lid(guid)?;
        Some(base..=base + (self.span() - 1))
    }

    /// PortInfo:LMC of the ports this SM configures.
    pub fn lmc(&self) -> u8 {
        self.cfg.lmc.min(7)
    }

    /// True if the range of `2^lmc` LIDs from `base` is free: unicast,
    /// aligned, clear of the SM's own LID and of every range assigned.
    /// For the port `owner` keeping the LID it reported, that is all; a
    /// fresh range (`owner` `None`) must also miss every LID a port
    /// reported (it may keep it yet).
    fn range_free(&self, base: u16, owner: Option<Guid>) -> bool {
        let span = self.span();
        let end = u32::from(base) + u32::from(span); // exclusive
        let hits =
            |b: u16, n: u16| u32::from(b) < end && u32::from(base) < u32::from(b) + u32::from(n);
        base != 0
            && base.is_multiple_of(span)
            && end <= 0xc000
            && !hits(self.lid_now(), 1)
            && !self
                .lid_of
                .iter()
                .any(|(g, b)| Some(*g) != owner && hits(*b, span))
            && (owner.is_some()
                || !self.nodes.iter().any(|n| {
                    PortInfo::new_checked(&n.port[..])
                        .is_ok_and(|p| p.lid() != 0 && hits(p.lid(), 1 << p.lmc()))
                }))
    }

    /// The base of a LID range no port holds or reported, nor holding the
    /// SM's own LID (aligned to `2^lmc`, IBA 7.11.1); `None` when the
    /// unicast LIDs are used up.
    fn fresh_lid(&mut self) -> Option<u16> {
        let span = u32::from(self.span());
        for _ in 0..=0xc000 / span {
            // The next aligned base from the cursor, wrapping to the
            // first (LID 0 is no LID) past the unicast LIDs.
            let l = match u32::from(self.next_lid).div_ceil(span) * span {
                l if l == 0 || l + span > 0xc000 => span,
                l => l,
            };
            self.next_lid = (l + span) as u16; // at most 0xc000
            if self.range_free(l as u16, None) {
                return Some(l as u16);
            }
        }
        None
    }

    fn node_lost(&mut self, now: Instant, i: usize, want: Want) {
        if want == Want::Handover {
            return; // the peer stays standby; this SM stays master
        }
        if want == Want::Acknowledge {
            // Optional in IBA 14.4.1 (opensm does not send it); the old
            // master's silence is the sweeps' business.
            return;
        }
        if want == Want::PeerPoll {
            self.nodes[i].polling = false;
            self.peer_gone(i);
            return;
        }
        let keyed = PortInfo::new_checked(&self.nodes[i].port[..])
            .is_ok_and(|p| p.mkey() != 0 || p.mkey_protect() != 0);
        if keyed && matches!(want, Want::SetPortInfo | Want::SetPkeys) {
            // A keyed port answered the sweep's Gets but drops our Sets: a
            // wrong M_Key (IBA 14.2.4.1). Alive, not ours. (An unkeyed one
            // cannot refuse: it is gone.)
            self.mkey_refused(now, i);
            return;
        }
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if want == Want::Poll && self.master == Some(i) && self.state == SmState::Standby {
            // The master is gone: take over (IBA 14.4.1), keeping the LIDs
            // it gave (the sweep reads them from the ports).
            let guid = n.sm.map_or(Guid(0), |x| x.guid);
            n.sm = None;
            self.master = None;
            self.events.push_back(SmEvent::MasterLost { guid });
            self.set_state(SmState::Master);
            self.become_master();
            self.start_sweep(now);
            return;
        }
        self.peer_gone(i);
        self.sweep_progress(now);
        let n = &mut self.nodes[i];
        if n.in_service {
            n.in_service = false;
            let gid = n.gid;
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::PortDown { guid });
            self.trap(now, Notice::TRAP_GID_OUT_OF_SERVICE, gid);
        }
    }

    /// Node `i` will not take this SM's Sets for its M_Key: logged (once
    /// until it takes one), and left alone until the next sweep.
    fn mkey_refused(&mut self, now: Instant, i: usize) {
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if !n.refused_logged {
            n.refused_logged = true;
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.stats.mkey_refused += 1;
            self.events.push_back(SmEvent::MkeyRefused { guid });
        }
        self.sweep_progress(now);
    }

    /// The P_Key table this port should have: the default partition in
    /// entry 0 (the entry QP1 sends its requests with, so they reach the
    /// SA), the port a full member if the partitions say so and a limited
    /// one otherwise (opensm's rule); then the others in the file's order.
    fn pkeys_for(&self, port: Guid) -> [u16; 32] {
        let mut t = [0u16; 32];
        let full = |p: &Partition| p.pkey == DEFAULT_PKEY && p.membership(port) == Some(true);
        t[0] = DEFAULT_PKEY
            | if self.cfg.partitions.iter().any(full) {
                0x8000
            } else {
                0
            };
        let mut k = 1;
        for p in self
            .cfg
            .partitions
            .iter()
            .filter(|p| p.pkey != DEFAULT_PKEY)
        {
            if let Some(full) = p.membership(port) {
                if k < 32 {
                    t[k] = p.pkey | if full { 0x8000 } else { 0 };
                    k += 1;
                }
            }
        }
        t
    }

    /// A MAD arrived from `from` on QP `qp`.
    pub fn handle_mad(&mut self, now: Instant, from: P, qp: u8, bytes: &[u8]) {
        let Some(mad) = bytes
            .get(..MAD_SIZE)
            .and_then(|b| <&MadBytes>::try_from(b).ok())
        else {
            return;
        };
        if mad[0] != 1 {
            return;
        }
        let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
        if mad[3] & 0x80 != 0 {
            if let Some(p) = self.pending.remove(&tid) {
                if let (Some(i), Some(want)) = (p.node, p.want) {
                    self.smp_answer(now, i, want, mad);
                }
            }
            return;
        }
        if qp == QP_GSI && mad[1] == 0x03 {
            if self.state != SmState::Master {
                // The SA runs on the master only; like opensm, a standby
                // (or discovering) SM drops SA MADs unanswered.
                self.stats.sa_ignored += 1;
                return;
            }
            self.sa_request(now, from, mad);
        } else if qp == QP_SMI && matches!(mad[1], 0x01 | 0x81) {
            self.smp_request(now, from, mad);
        }
    }

    /// An SMP to the SM's own port: SMInfo from another SM, a trap from
    /// an SMA, anything else to the port's own SMA.
    fn smp_request(&mut self, now: Instant, from: P, req: &MadBytes) {
        let method = Method::from(req[3]);
        let attr = SmpAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let directed = req[1] == 0x81;
        let out = |m: MadBytes| Outgoing {
            to: from,
            qp: QP_SMI,
            mad: Box::new(m),
        };
        if method == Method::Trap {
            self.sma_trap(now, from, req);
            return;
        }
        if attr != SmpAttr::SmInfo || !matches!(method, Method::Get | Method::Set) {
            if let Some((r, _)) = self.own.handle(now, req) {
                self.tx.push_back(out(r));
            }
            return;
        }
        if directed && req[6] != req[7] {
            return;
        }
        if method == Method::Get && self.state == SmState::Master {
            // An SM asking for ours: if we do not know it, ask for its
            // (a new standby shows at once, not at the next sweep).
            if let Some(i) = self.nodes.iter().position(|n| n.addr == from) {
                if self.nodes[i].sm.is_none() {
                    self.poll_peer(now, i);
                }
            }
        }
        let peer = SmInfo::parse(&req[SMP_DATA..SMP_DATA + SmInfo::LEN]).ok();
        let keyed = peer.is_some_and(|p| p.sm_key == self.cfg.sm_key);
        let mut status = MadStatus::OK;
        if method == Method::Set {
            let modifier = u32::from_be_bytes(req[20..24].try_into().expect("4 bytes"));
            let from_node = self.nodes.iter().position(|n| n.addr == from);
            // The Set carries its sender's SMInfo: only a master sends
            // HANDOVER, DISABLE, STANDBY and DISCOVER, only a standby
            // ACKNOWLEDGE (the legality opensm checks too).
            let sender = peer.map_or(SmState::NotActive.code(), |p| p.sm_state);
            let legal = match modifier {
                sminfo_control::ACKNOWLEDGE => sender == SmState::Standby.code(),
                _ => sender == SmState::Master.code(),
            };
            match modifier {
                _ if !keyed || !legal => {
                    self.stats.sminfo_refused += 1;
                    status = MadStatus::from_code(StatusCode::InvalidAttrValue);
                }
                sminfo_control::HANDOVER
                    if matches!(self.state, SmState::Standby | SmState::Discovering) =>
                {
                    // Acknowledged (IBA 14.4.1) with the SMInfo the
                    // HANDOVER found, a standby's (what opensm's check of
                    // an ACKNOWLEDGE wants), sent again until answered.
                    let mut ack = smp(Method::Set, SmpAttr::SmInfo, sminfo_control::ACKNOWLEDGE);
                    self.sm_info()
                        .emit(&mut ack[SMP_DATA..SMP_DATA + SmInfo::LEN]);
                    self.master = None;
                    self.set_state(SmState::Master);
                    self.become_master();
                    self.start_sweep(now);
                    self.send(now, from_node, from, QP_SMI, Some(Want::Acknowledge), ack);
                }
                sminfo_control::ACKNOWLEDGE => {
                    // The SM this one handed over to took it (opensm's
                    // old master does nothing more either).
                    let guid = peer.map_or(Guid(0), |p| p.guid);
                    if self.handed_to == Some(guid) {
                        self.handed_to = None;
                        self.events
                            .push_back(SmEvent::HandoverAcknowledged { guid });
                    }
                }
                sminfo_control::DISABLE => {
                    self.master = None;
                    self.set_state(SmState::NotActive);
                }
                sminfo_control::DISCOVER => {
                    self.master = None;
                    self.set_state(SmState::Discovering);
                    self.start_sweep(now);
                }
                sminfo_control::STANDBY if from_node.is_some() => {
                    self.follow(now, from_node.expect("some"));
                }
                _ => status = MadStatus::from_code(StatusCode::InvalidAttrValue),
            }
        }
        let mut r = status_reply(req, status);
        let mut me = self.sm_info();
        if !keyed {
            me.sm_key = 0; // the key is shown only to who knows it
        }
        me.emit(&mut r[SMP_DATA..SMP_DATA + SmInfo::LEN]);
        if directed {
            r[4] |= 0x80;
        }
        self.tx.push_back(out(r));
    }

    /// A Trap from a port's SMA: repressed (always, so a resent one stops
    /// too) and, the first time, forwarded as a Report to subscribers.
    /// Trap 144 also updates the port's CapabilityMask the SA answers with.
    fn sma_trap(&mut self, now: Instant, from: P, req: &MadBytes) {
        if SmpAttr::from(u16::from_be_bytes([req[16], req[17]])) != SmpAttr::Notice {
            return;
        }
        let mut r = *req;
        r[3] = u8::from(Method::TrapRepress);
        if req[1] == 0x81 {
            r[4] |= 0x80;
        }
        self.tx.push_back(Outgoing {
            to: from,
            qp: QP_SMI,
            mad: Box::new(r),
        });
        let tid = u64::from_be_bytes(req[8..16].try_into().expect("8 bytes"));
        if self.traps_seen.contains(&(from, tid)) {
            return;
        }
        if self.traps_seen.len() >= 64 {
            self.traps_seen.pop_front();
        }
        self.traps_seen.push_back((from, tid));
        self.stats.traps += 1;
        let mut full = [0u8; Notice::LEN];
        full[..64].copy_from_slice(&req[SMP_DATA..SMP_DATA + 64]);
        let Ok(mut notice) = Notice::parse(&full) else {
            return;
        };
        let node = self.nodes.iter().position(|n| n.addr == from);
        if let Some(i) = node {
            notice.issuer_gid = self.nodes[i].gid;
        }
        if notice.is_generic && notice.trap_number == TRAP_BAD_MKEY {
            self.stats.bad_mkey_traps += 1;
            let d = &notice.data_details;
            let guid = node
                .and_then(|i| self.nodes[i].info)
                .map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::BadMkey {
                guid,
                requester: u16::from_be_bytes([d[2], d[3]]),
                method: d[5],
                attr: u16::from_be_bytes([d[6], d[7]]),
            });
        }
        if notice.is_generic && notice.trap_number == TRAP_BAD_PKEY {
            self.stats.bad_pkey_traps += 1;
            let d = BadKeyTrap::parse(&notice.data_details);
            let guid_of = |n: &Node<P>| n.info.map_or(Guid(0), |x| x.port_guid);
            let guid = node.map_or(Guid(0), |i| guid_of(&self.nodes[i]));
            let from_guid = self.nodes.iter().find(|n| n.gid == d.gid1).map(guid_of);
            self.events.push_back(SmEvent::BadPkey {
                guid,
                pkey: Pkey(d.key as u16),
                from: d.gid1,
                from_guid,
                src_qp: d.qp1,
                dest_qp: d.qp2,
            });
        }
        if notice.is_generic && notice.trap_number == TRAP_CAPABILITY_MASK_CHANGE {
            let mask = u32::from_be_bytes(notice.data_details[6..10].try_into().expect("4"));
            if let Some(i) = node {
                let n = &mut self.nodes[i];
                PortInfo::new_checked(&mut n.port[..])
                    .expect("64 bytes")
                    .set_capability_mask(mask);
                let guid = n.info.map_or(Guid(0), |x| x.port_guid);
                self.events
                    .push_back(SmEvent::CapabilityChange { guid, mask });
            }
        }
        self.report(now, &notice);
    }

    fn smp_answer(&mut self, now: Instant, i: usize, want: Want, mad: &MadBytes) {
        let ok = u16::from_be_bytes([mad[4], mad[5]]) & 0x7fff == 0;
        let data = &mad[SMP_DATA..SMP_DATA + 64];
        match want {
            Want::Poll => {
                // Any answer shows the master alive.
                self.nodes[i].busy = false;
                self.stats.polls += 1;
                if let Ok(info) = SmInfo::parse(&data[..SmInfo::LEN]) {
                    self.nodes[i].sm = Some(info);
                }
                return;
            }
            Want::Handover => {
                if ok && self.state == SmState::Master {
                    self.follow(now, i);
                }
                return;
            }
            // The old master took it (it answers any Set): nothing to do.
            Want::Acknowledge => return,
            Want::PeerPoll => {
                self.nodes[i].polling = false;
                if let Ok(info) = SmInfo::parse(&data[..SmInfo::LEN]) {
                    self.stats.standby_polls += 1;
                    self.peer_seen(i, info);
                }
                return;
            }
            _ => {}
        }
        if !ok {
            // The port refused: start over at the next sweep.
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
            self.sweep_progress(now);
            return;
        }
        match want {
            Want::Poll | Want::Handover | Want::PeerPoll | Want::Acknowledge => {}
            Want::SmInfo => {
                let Ok(peer) = SmInfo::parse(&data[..SmInfo::LEN]) else {
                    self.after_read(now, i);
                    return;
                };
                self.peer_seen(i, peer);
                let me = self.sm_info();
                if self.state == SmState::Master && peer.guid != me.guid && outranks(&peer, &me) {
                    if peer.sm_state == SmState::Master.code() {
                        // Two masters: the lesser yields.
                        self.nodes[i].busy = false;
                        self.nodes[i].stage = Stage::Idle;
                        self.follow(now, i);
                        return;
                    }
                    if peer.sm_state == SmState::Standby.code() {
                        // An SM that outranks this one joined: hand over.
                        let mut m = smp(Method::Set, SmpAttr::SmInfo, sminfo_control::HANDOVER);
                        me.emit(&mut m[SMP_DATA..SMP_DATA + SmInfo::LEN]);
                        self.handed_to = Some(peer.guid);
                        let to = self.nodes[i].addr;
                        self.send(now, Some(i), to, QP_SMI, Some(Want::Handover), m);
                    }
                }
                self.after_read(now, i);
            }
            Want::NodeInfo => {
                let Ok(info) = NodeInfo::parse(data) else {
                    self.nodes[i].busy = false;
                    return;
                };
                self.nodes[i].info = Some(info);
                self.ask(
                    now,
                    i,
                    Want::NodeDescription,
                    smp(Method::Get, SmpAttr::NodeDescription, 0),
                );
            }
            Want::NodeDescription => {
                self.nodes[i].desc.copy_from_slice(data);
                self.ask(
                    now,
                    i,
                    Want::PortInfo,
                    smp(Method::Get, SmpAttr::PortInfo, 0),
                );
            }
            Want::PortInfo => {
                self.nodes[i].port.copy_from_slice(data);
                let pi = PortInfo::new_checked(data).expect("64 bytes");
                let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
                if pi.mkey() != 0 && pi.mkey() != self.nodes[i].mkey {
                    // Shown (level 0, or the lease ran out): use it until
                    // our Set gives the port our key.
                    self.nodes[i].mkey = pi.mkey();
                    self.events.push_back(SmEvent::MkeyLearned { guid });
                } else if pi.mkey() == 0 && pi.mkey_protect() == 1 && self.nodes[i].mkey != 0 {
                    // Hidden from our key (level 1): a Set would only
                    // count against us.
                    self.mkey_refused(now, i);
                    return;
                }
                if pi.capability_mask() & cap::IS_SM != 0 {
                    self.ask(now, i, Want::SmInfo, smp(Method::Get, SmpAttr::SmInfo, 0));
                } else {
                    self.peer_gone(i);
                    self.after_read(now, i);
                }
            }
            Want::SetPortInfo => {
                self.nodes[i].port.copy_from_slice(data);
                // The port holds our key now.
                self.nodes[i].mkey = self.cfg.mkey;
                self.nodes[i].refused_logged = false;
                self.configure(now, i, false);
            }
            Want::SetPkeys => {
                self.nodes[i].pkeys_done = true;
                let armed = PortInfo::new_checked(&self.nodes[i].port[..])
                    .is_ok_and(|p| p.port_state() == state::ARMED);
                if armed {
                    self.configure(now, i, false);
                } else {
                    self.in_service(now, i);
                }
            }
        }
    }

    /// Configures node `i` whose PortInfo was just read (`first`) or set:
    /// its LID (the one it already has if no other port holds it: a new
    /// master keeps the old one's LIDs), the master SM LID, the state walk
    /// to ACTIVE with the P_Key table set while the port is ARMED (as
    /// opensm sets partitions before activating, so a port is never
    /// ACTIVE with a table the SM has not given it); an ACTIVE port gets
    /// its table again (partitions may have changed).
    fn configure(&mut self, now: Instant, i: usize, first: bool) {
        if self.state != SmState::Master {
            // Mastership went elsewhere mid-sweep: leave the port alone.
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
            return;
        }
        let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
        let pi = PortInfo::new_checked(&self.nodes[i].port[..]).expect("64 bytes");
        let (reported, port_state, sm_lid) = (pi.lid(), pi.port_state(), pi.sm_lid());
        let violations = (pi.mkey_violations(), pi.pkey_violations());
        let port_lmc = pi.lmc();
        let keyed = pi.mkey() == self.cfg.mkey
            && pi.mkey_protect() == self.cfg.mkey_protect
            && pi.mkey_lease_period() == self.cfg.mkey_lease;
        let lmc = self.lmc();
        let lid = match self.lid_of.get(&guid) {
            Some(l) => *l,
            // The port's own LID is kept if its range (with our LMC) is
            // aligned and free, as opensm keeps a discovered LID.
            None if self.range_free(reported, Some(guid)) => {
                self.lid_of.insert(guid, reported);
                reported
            }
            None => {
                // A new LID once every port has said which it holds.
                self.nodes[i].stage = Stage::Parked;
                return;
            }
        };
        if first {
            self.nodes[i].pkeys_done = false;
        }
        let pkeys_done = self.nodes[i].pkeys_done;
        self.nodes[i].stage = Stage::Configuring;
        self.nodes[i].lid = lid;
        let next = match port_state {
            state::INIT => Some(state::ARMED),
            state::ARMED if !pkeys_done => None,
            state::ARMED => Some(state::ACTIVE),
            _ if reported != lid || port_lmc != lmc || sm_lid != self.lid_now() || !keyed => {
                Some(0)
            }
            _ => None,
        };
        match next {
            Some(st) if first || st != 0 => {
                let mut m = smp(Method::Set, SmpAttr::PortInfo, 0);
                let mut p =
                    PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).expect("64 bytes");
                p.set_lid(lid);
                p.set_lmc(lmc);
                p.set_sm_lid(self.lid_now());
                p.set_subnet_timeout(18);
                p.set_port_state(st);
                p.set_mkey(self.cfg.mkey);
                p.set_mkey_protect(self.cfg.mkey_protect);
                p.set_mkey_lease_period(self.cfg.mkey_lease);
                // M_KeyViolations and P_KeyViolations are writable: keep
                // the port's counts.
                p.set_mkey_violations(violations.0);
                p.set_pkey_violations(violations.1);
                self.ask(now, i, Want::SetPortInfo, m);
            }
            _ if pkeys_done => self.in_service(now, i),
            _ => {
                let wanted = self.pkeys_for(guid);
                let mut m = smp(Method::Set, SmpAttr::PkeyTable, 0);
                for (k, v) in wanted.iter().enumerate() {
                    m[SMP_DATA + 2 * k..SMP_DATA + 2 * k + 2].copy_from_slice(&v.to_be_bytes());
                }
                self.ask(now, i, Want::SetPkeys, m);
            }
        }
    }

    /// Node `i` is configured: the sweep is done with it; a port new to
    /// service is logged and trap 64 goes to subscribers.
    fn in_service(&mut self, now: Instant, i: usize) {
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if !n.in_service {
            n.in_service = true;
            let (gid, lid) = (n.gid, n.lid);
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::PortUp { guid, lid });
            self.trap(now, Notice::TRAP_GID_IN_SERVICE, gid);
        }
    }

    /// A node's port is read: a master configures it, a discovering or
    /// standby SM only looks.
    fn after_read(&mut self, now: Instant, i: usize) {
        if self.state == SmState::Master {
            self.configure(now, i, true);
        } else {
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
        }
        self.sweep_progress(now);
    }

    /// Sends trap `number` about `gid` to every subscriber of it.
    fn trap(&mut self, now: Instant, number: u16, gid: Gid) {
        let mut details = [0u8; 54];
        details[6..22].copy_from_slice(&gid.0);
        let notice = Notice {
            is_generic: true,
            notice_type: 3,   // informational
            producer_type: 4, // class manager (the SA)
            trap_number: number,
            issuer_lid: self.lid_now(),
            toggle: false,
            count: 0,
            data_details: details,
            issuer_gid: Gid([0; 16]),
        };
        self.report(now, &notice);
    }

    /// Sends `notice` as a Report to every subscriber of its trap.
    fn report(&mut self, now: Instant, notice: &Notice) {
        let number = notice.trap_number;
        let targets: Vec<P> = self
            .subscribers
            .iter()
            .filter(|s| s.trap == 0xffff || s.trap == number)
            .map(|s| s.addr)
            .collect();
        for to in targets {
            let mut m = [0u8; MAD_SIZE];
            m[0] = 1;
            m[1] = 0x03;
            m[2] = SA_CLASS_VERSION;
            m[3] = u8::from(Method::Report);
            m[16..18].copy_from_slice(&u16::from(SaAttr::Notice).to_be_bytes());
            notice.emit(&mut m[SA_HDR_LEN..SA_HDR_LEN + Notice::LEN]);
            self.stats.reports += 1;
            self.send(now, None, to, QP_GSI, None, m);
        }
    }

    fn sa_request(&mut self, now: Instant, from: P, req: &MadBytes) {
        self.stats.sa_requests += 1;
        let reply = |m: MadBytes| Outgoing {
            to: from,
            qp: QP_GSI,
            mad: Box::new(m),
        };
        // Nothing answers a response, a Send, a Trap or a TrapRepress, not
        // even with a status (IBA 13.4.7).
        let m = Method::from(req[3]);
        if m.is_response() || matches!(m, Method::Send | Method::Trap | Method::TrapRepress) {
            return;
        }
        if req[2] != SA_CLASS_VERSION {
            let r = status_reply(req, MadStatus::from_code(StatusCode::BadVersion));
            self.tx.push_back(reply(r));
            return;
        }
        let method = Method::from(req[3]);
        let attr = SaAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let Ok(hdr) = SaHeader::parse(req) else {
            return;
        };
        // IBA C15-0.1.5: the SA header's SM_Key is zero or the SM's;
        // anything else is discarded unanswered, as opensm does (an
        // answer would tell a prober the key was wrong).
        if hdr.sm_key != 0 && hdr.sm_key != self.cfg.sm_key {
            self.stats.sa_bad_sm_key += 1;
            return;
        }
        let data = &req[SA_HDR_LEN..];
        match (method, attr) {
            (Method::Set, SaAttr::InformInfo) => {
                let Ok(info) = InformInfo::parse(data) else {
                    self.tx
                        .push_back(reply(status_reply(req, MadStatus(SA_ERR_REQ_INVALID))));
                    return;
                };
                self.subscribers
                    .retain(|s| !(s.addr == from && s.trap == info.trap_number));
                if info.subscribe == 1 {
                    self.subscribers.push(Subscriber {
                        addr: from,
                        trap: info.trap_number,
                    });
                }
                let mut r = status_reply(req, MadStatus::OK);
                r[SA_HDR_LEN..].copy_from_slice(&req[SA_HDR_LEN..]);
                self.tx.push_back(reply(r));
            }
            (Method::Get | Method::GetTable, SaAttr::PathRecord) => {
                let recs = self.path_records(from, method, &hdr, data);
                self.answer(from, req, method, &recs, PathRecord::LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::NodeRecord) => {
                let recs = self.node_records(&hdr, data);
                self.answer(from, req, method, &recs, NODE_RECORD_LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::PortInfoRecord) => {
                let mut recs = self.portinfo_records(&hdr, data);
                // IBA PortInfoRecord: the M_Key shows only to a trusted request
                // (its SM_Key, checked above, is not zero).
                if hdr.sm_key == 0 {
                    for r in &mut recs {
                        PortInfo::new_checked(&mut r[4..68])
                            .expect("64 bytes")
                            .set_mkey(0);
                    }
                }
                self.answer(from, req, method, &recs, PORTINFO_RECORD_LEN);
            }
            (
                Method::Set | Method::Get | Method::GetTable | Method::Delete,
                SaAttr::ServiceRecord,
            ) => {
                self.services.retain(|s| s.expires.is_none_or(|t| t > now));
                self.stats.services = self.services.len() as u64;
                let Ok(q) = ServiceRecord::parse(data) else {
                    self.tx
                        .push_back(reply(status_reply(req, MadStatus(SA_ERR_REQ_INVALID))));
                    return;
                };
                let mask = if method == Method::Set {
                    service_comp::ID | service_comp::GID | service_comp::PKEY
                } else {
                    hdr.comp_mask
                };
                let matches = |r: &ServiceRecord| {
                    (mask & service_comp::ID == 0 || r.service_id == q.service_id)
                        && (mask & service_comp::GID == 0 || r.service_gid == q.service_gid)
                        && (mask & service_comp::PKEY == 0 || r.service_pkey == q.service_pkey)
                        && (mask & service_comp::NAME == 0 || r.service_name == q.service_name)
                };
                let recs: Vec<Vec<u8>> = match method {
                    Method::Set => {
                        // Registration replaces the record with the same
                        // ID, GID and P_Key; the lease starts again.
                        self.services.retain(|s| !matches(&s.rec));
                        let expires = (q.service_lease != u32::MAX)
                            .then(|| now + Duration::from_secs(u64::from(q.service_lease)));
                        self.services.push(Service { rec: q, expires });
                        self.stats.services = self.services.len() as u64;
                        vec![data[..ServiceRecord::LEN].to_vec()]
                    }
                    Method::Delete => {
                        let (gone, kept): (Vec<Service>, Vec<Service>) =
                            std::mem::take(&mut self.services)
                                .into_iter()
                                .partition(|s| matches(&s.rec));
                        self.services = kept;
                        self.stats.services = self.services.len() as u64;
                        gone.iter().map(|s| service_bytes(&s.rec)).collect()
                    }
                    _ => self
                        .services
                        .iter()
                        .filter(|s| matches(&s.rec))
                        .map(|s| service_bytes(&s.rec))
                        .collect(),
                };
                // Set and Delete answer GetResp with the record, as Get does.
                let as_get = if method == Method::GetTable {
                    Method::GetTable
                } else {
                    Method::Get
                };
                self.answer(from, req, as_get, &recs, ServiceRecord::LEN);
            }
            (Method::Get | Method::GetTable | Method::Set | Method::Delete, _) => {
                let r = status_reply(req, MadStatus::from_code(StatusCode::MethodAttrUnsupported));
                self.tx.push_back(reply(r));
            }
            (m, _)
                if m.is_response()
                    || matches!(m, Method::Send | Method::Trap | Method::TrapRepress) => {}
            _ => {
                let r = status_reply(req, MadStatus::from_code(StatusCode::MethodUnsupported));
                self.tx.push_back(reply(r));
            }
        }
    }

    /// Get: the first record (or "no records"); GetTable: all of them,
    /// segmented with RMPP.
    fn answer(&mut self, from: P, req: &MadBytes, method: Method, recs: &[Vec<u8>], len: usize) {
        let stride = len.div_ceil(8) * 8;
        let mut hdr = SaHeader::parse(req).unwrap_or_default();
        hdr.attr_offset = (stride / 8) as u16;
        if method == Method::Get {
            let r = match recs.first() {
                Some(rec) => {
                    let mut r = status_reply(req, MadStatus::OK);
                    hdr.emit(&mut r);
                    r[SA_HDR_LEN..SA_HDR_LEN + rec.len()].copy_from_slice(rec);
                    r
                }
                None => status_reply(req, MadStatus(SA_ERR_NO_RECORDS)),
            };
            self.tx.push_back(Outgoing {
                to: from,
                qp: QP_GSI,
                mad: Box::new(r),
            });
            return;
        }
        let mut table = vec![0u8; recs.len() * stride];
        for (k, rec) in recs.iter().enumerate() {
            table[k * stride..k * stride + rec.len()].copy_from_slice(rec);
        }
        let mut template = status_reply(req, MadStatus::OK);
        hdr.emit(&mut template);
        // Active sender without a window: every segment at once; a lost one
        // costs the requester a timeout and a new query.
        if let Ok(segs) = rmpp::segment(&template[..SA_HDR_LEN], SA_HDR_LEN, &table, 0x1f) {
            for s in segs {
                self.tx.push_back(Outgoing {
                    to: from,
                    qp: QP_GSI,
                    mad: Box::new(s),
                });
            }
        }
    }

    fn shares_partition(&self, a: Guid, b: Guid, only: Option<u16>) -> Option<u16> {
        self.cfg.partitions.iter().find_map(|p| {
            if only.is_some_and(|k| k & 0x7fff != p.pkey) {
                return None;
            }
            let (x, y) = (partitions::membership(p, a)?, partitions::membership(p, b)?);
            (x || y).then_some(p.pkey | 0x8000)
        })
    }

    /// True if `lid` is one of node `n`'s (its base and the `2^lmc - 1`
    /// above: the SA's LID-to-port map, as opensm's covers the range).
    fn holds(&self, n: &Node<P>, lid: u16) -> bool {
        n.lid != 0 && lid >= n.lid && lid - n.lid < self.span()
    }

    /// The (SLID, DLID, preference) of the paths from a port with LIDs
    /// `s` to one with `d`, in opensm's order: first the pairs at the same
    /// offset from each base (base to base, base+1 to base+1, ...:
    /// preference 0, the most redundant with each other), then every
    /// other pair, source-major (preference 2); at most `limit`.
    fn lid_pairs(s: (u16, u16), d: (u16, u16), limit: usize) -> Vec<(u16, u16, u8)> {
        let mut out = Vec::new();
        let (ns, nd) = (s.1 - s.0 + 1, d.1 - d.0 + 1);
        for k in 0..ns.min(nd) {
            out.push((s.0 + k, d.0 + k, 0));
        }
        for i in 0..ns {
            for j in (0..nd).filter(|j| *j != i) {
                out.push((s.0 + i, d.0 + j, 2));
            }
        }
        out.truncate(limit);
        out
    }

    fn path_records(&self, from: P, method: Method, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let Ok(q) = PathRecord::parse(data) else {
            return Vec::new();
        };
        let m = hdr.comp_mask;
        // Paths per pair: one for a Get (IBA 1.2 erratum, as opensm);
        // NumbPath when the mask has it; else every LID pair, at most
        // MAX_PATHS_PER_PAIR.
        let limit = if method == Method::Get {
            1
        } else if m & path_comp::NUMB_PATH != 0 {
            usize::from(q.numb_path)
        } else {
            MAX_PATHS_PER_PAIR
        };
        let srcs: Vec<&Node<P>> = self
            .nodes
            .iter()
            .filter(|n| n.in_service)
            .filter(|n| {
                if m & (path_comp::SGID | path_comp::SLID) == 0 {
                    n.addr == from
                } else {
                    (m & path_comp::SGID == 0 || n.gid == q.sgid)
                        && (m & path_comp::SLID == 0 || self.holds(n, q.slid))
                }
            })
            .collect();
        let mut out = Vec::new();
        for s in &srcs {
            for d in self.nodes.iter().filter(|n| n.in_service) {
                if (m & path_comp::DGID != 0 && d.gid != q.dgid)
                    || (m & path_comp::DLID != 0 && !self.holds(d, q.dlid))
                {
                    continue;
                }
                let (Some(si), Some(di)) = (s.info, d.info) else {
                    continue;
                };
                let only = (m & path_comp::PKEY != 0).then_some(q.pkey.0);
                let Some(pkey) = self.shares_partition(si.port_guid, di.port_guid, only) else {
                    continue;
                };
                // The client's SLID or DLID narrows its end to that LID.
                let top = self.span() - 1;
                let srange = if m & path_comp::SLID != 0 {
                    (q.slid, q.slid)
                } else {
                    (s.lid, s.lid + top)
                };
                let drange = if m & path_comp::DLID != 0 {
                    (q.dlid, q.dlid)
                } else {
                    (d.lid, d.lid + top)
                };
                for (slid, dlid, preference) in Self::lid_pairs(srange, drange, limit) {
                    let rec = PathRecord {
                        service_id: q.service_id,
                        dgid: d.gid,
                        sgid: s.gid,
                        dlid,
                        slid,
                        raw_traffic: false,
                        flow_label: 0,
                        hop_limit: 0,
                        tclass: 0,
                        reversible: true,
                        numb_path: 1,
                        pkey: Pkey(pkey),
                        qos_class: 0,
                        sl: 0,
                        mtu_selector: 2,
                        mtu: 5,
                        rate_selector: 2,
                        rate: 3,
                        packet_life_selector: 2,
                        packet_life: 16,
                        preference,
                    };
                    let mut b = vec![0u8; PathRecord::LEN];
                    rec.emit(&mut b);
                    out.push(b);
                }
            }
        }
        out
    }

    fn node_records(&self, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let want_lid = u16::from_be_bytes([data[0], data[1]]);
        self.nodes
            .iter()
            .filter(|n| n.in_service && (hdr.comp_mask & 1 == 0 || self.holds(n, want_lid)))
            .filter_map(|n| {
                let mut b = vec![0u8; NODE_RECORD_LEN];
                b[0..2].copy_from_slice(&n.lid.to_be_bytes());
                n.info?.emit(&mut b[4..44]);
                b[44..108].copy_from_slice(&n.desc);
                Some(b)
            })
            .collect()
    }

    fn portinfo_records(&self, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let want_lid = u16::from_be_bytes([data[0], data[1]]);
        let want_caps = PortInfo::new_checked(&data[4..68])
            .map(|p| p.capability_mask())
            .unwrap_or(0);
        let m = hdr.comp_mask;
        let by_lid: BTreeMap<u16, &Node<P>> = self
            .nodes
            .iter()
            .filter(|n| n.in_service)
            .map(|n| (n.lid, n))
            .collect();
        by_lid
            .values()
            .filter(|n| m & portinfo_comp::LID == 0 || self.holds(n, want_lid))
            .filter(|n| {
                let caps = PortInfo::new_checked(&n.port[..])
                    .expect("64")
                    .capability_mask();
                m & portinfo_comp::CAPMASK == 0 || caps & want_caps == want_caps
            })
            .map(|n| {
                let mut b = vec![0u8; PORTINFO_RECORD_LEN];
                b[0..2].copy_from_slice(&n.lid.to_be_bytes());
                b[2] = 1;
                b[4..68].copy_from_slice(&n.port);
                // The record shows the state the SM left the port in.
                let mut p = PortInfo::new_checked(&mut b[4..68]).expect("64");
                p.set_lid(n.lid);
                p.set_lmc(self.lmc());
                p.set_sm_lid(self.lid_now());
                p.set_port_state(state::ACTIVE);
                b
            })
            .collect()
    }
}

/// Reassembles the RMPP segments of one GetTableResp (in order) into its
/// SA header and records.
///
/// # Errors
/// The segments do not form one response.
pub fn table_records(segments: &[&[u8]]) -> Result<(SaHeader, Vec<Vec<u8>>), rdma_mad::Error> {
    let (hdr_bytes, data) = rmpp::reassemble(segments, SA_HDR_LEN)?;
    let mut full = hdr_bytes.clone();
    full.resize(MAD_SIZE, 0);
    let hdr = SaHeader::parse(&full)?;
    let recs = rdma_mad::sa::records(&data, hdr.attr_offset)
        .map(<[u8]>::to_vec)
        .collect();
    let _ = RmppHeader::parse(&full)?;
    Ok((hdr, recs))
}
