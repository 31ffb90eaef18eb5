//! The subnet manager and its subnet administrator, sans-IO.

use crate::partitions::{self, default_partitions, Partition, DEFAULT_PKEY};
use rdma_access::gsi::{status_reply, MadBytes};
use rdma_access::retries::{Due, Retries};
use rdma_access::sma::{
    state, Sma, SmaConfig, SMP_DATA, TRAP_BAD_MKEY, TRAP_BAD_PKEY, TRAP_CAPABILITY_MASK_CHANGE,
};
use rdma_mad::mad::{Mad, MadStatus, Method, StatusCode, MAD_SIZE};
use rdma_mad::rmpp::{self, RmppHeader};
use rdma_mad::sa::{
    InformInfo, PathRecord, SaAttr, SaHeader, ServiceRecord, SA_CLASS_VERSION, SA_HDR_LEN,
};
use rdma_mad::smp::{cap, BadKeyTrap, NodeInfo, Notice, PortInfo, SmInfo, Smp, SmpAttr};
use rdma_types::{Duration, Gid, Guid, Instant, Pkey};
use std::collections::{BTreeMap, HashMap, VecDeque};

mod handover;
mod sa;
mod sweep;

pub use handover::*;
pub use sa::*;

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
    /// The SM's own port says IsDeviceManagementSupported: where the
    /// port is shared with other processes (the NIC daemon's), a DM
    /// agent of one of them (srptd's) may serve on it, and discovery
    /// asks the SA for such ports.
    pub own_device_management: bool,
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
            own_device_management: false,
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
    pending: Retries<Pending<P>>,
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

impl<P: Copy + Eq + std::fmt::Debug> SubnetManager<P> {
    /// An SM for the nodes at `endpoints` (address and port GID); the
    /// first sweep starts at `now`.
    pub fn new(cfg: SmConfig, endpoints: Vec<(P, Gid)>, now: Instant) -> SubnetManager<P> {
        let next_lid = cfg.lid.max(1) + 1;
        let mut own = Box::new(Sma::new(SmaConfig {
            node_guid: cfg.guid,
            port_guid: cfg.guid,
            description: "ib-sm".into(),
            capability_mask: rdma_access::sma::ca_capability_mask(cfg.own_device_management)
                | cap::IS_SM,
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
            pending: Retries::default(),
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
        if let Some(p) = self.pending.next_deadline() {
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
        Mad::new_unchecked(&mut mad[..]).set_tid(tid);
        if let (QP_SMI, Some(i)) = (qp, node) {
            Smp::new_unchecked(&mut mad[..]).set_mkey(self.nodes[i].mkey);
        }
        let mad = Box::new(mad);
        self.tx.push_back(Outgoing {
            to,
            qp,
            mad: mad.clone(),
        });
        self.pending.insert(
            tid,
            now,
            self.cfg.timeout,
            self.cfg.retries,
            Pending {
                node,
                to,
                qp,
                want,
                mad,
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
        let mut lost = Vec::new();
        let (stats, tx) = (&mut self.stats, &mut self.tx);
        self.pending.expire(now, |_, due| match due {
            Due::Resend(p) => {
                stats.retries += 1;
                tx.push_back(Outgoing {
                    to: p.to,
                    qp: p.qp,
                    mad: p.mad.clone(),
                });
            }
            // A Report nobody acknowledged is dropped (the subscriber stays).
            Due::GaveUp(p) => lost.extend(p.node.zip(p.want)),
        });
        for (i, want) in lost {
            self.node_lost(now, i, want);
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
            if let Some(p) = self.pending.remove(tid).map(|s| s.req) {
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
}
