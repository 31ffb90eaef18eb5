//! The subnet manager and its subnet administrator, sans-IO.

use crate::partitions::{default_partitions, Partition};
use rdma_access::gsi::{status_reply, MadBytes};
use rdma_access::sma::{state, SMP_DATA};
use rdma_mad::mad::{MadStatus, Method, StatusCode, MAD_SIZE};
use rdma_mad::rmpp::{self, RmppHeader};
use rdma_mad::sa::{
    InformInfo, PathRecord, SaAttr, SaHeader, ServiceRecord, SA_CLASS_VERSION, SA_HDR_LEN,
};
use rdma_mad::smp::{NodeInfo, Notice, PortInfo, SmpAttr};
use rdma_types::{Duration, Gid, Guid, Instant, Pkey};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// QP numbers MADs travel to.
pub const QP_SMI: u8 = 0;
/// The general services QP.
pub const QP_GSI: u8 = 1;

/// SA status: no records match (class-specific, IBA 15.2.1.2).
pub const SA_ERR_NO_RECORDS: u16 = 0x0300;
/// SA status: the request is invalid.
pub const SA_ERR_REQ_INVALID: u16 = 0x0200;

/// PathRecord component mask bits (IBA 15.2.5.16).
pub mod path_comp {
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
}

/// ServiceRecord component mask bits (IBA 15.2.5.14).
pub mod service_comp {
    /// ServiceID.
    pub const ID: u64 = 1 << 0;
    /// ServiceGID.
    pub const GID: u64 = 1 << 1;
    /// ServiceP_Key.
    pub const PKEY: u64 = 1 << 2;
    /// ServiceName.
    pub const NAME: u64 = 1 << 6;
}

/// PortInfoRecord component mask bits (opensm's numbering).
pub mod portinfo_comp {
    /// End port LID.
    pub const LID: u64 = 1 << 0;
    /// PortInfo:CapabilityMask.
    pub const CAPMASK: u64 = 1 << 7;
}

/// NodeRecord length on the wire (LID, reserved, NodeInfo, NodeDescription).
const NODE_RECORD_LEN: usize = 108;
/// PortInfoRecord length (LID, port, options, PortInfo).
const PORTINFO_RECORD_LEN: usize = 68;

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    NodeInfo,
    NodeDescription,
    PortInfo,
    SetPortInfo,
    SetPkeys,
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
        SubnetManager {
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
        let p = self.pending.values().map(|p| p.deadline).min();
        Some(p.map_or(self.next_sweep, |p| p.min(self.next_sweep)))
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
        let tid = (u64::from(self.cfg.lid) << 48) | self.next_tid;
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
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
            if let (Some(i), Some(_)) = (p.node, p.want) {
                self.node_lost(now, i);
            }
            // A Report nobody acknowledged is dropped (the subscriber stays).
        }
        if now >= self.next_sweep {
            self.next_sweep = now + self.cfg.sweep_interval;
            self.stats.sweeps += 1;
            for i in 0..self.nodes.len() {
                if !self.nodes[i].busy {
                    self.ask(
                        now,
                        i,
                        Want::NodeInfo,
                        smp(Method::Get, SmpAttr::NodeInfo, 0),
                    );
                }
            }
        }
    }

    fn node_lost(&mut self, now: Instant, i: usize) {
        let n = &mut self.nodes[i];
        n.busy = false;
        if n.in_service {
            n.in_service = false;
            let gid = n.gid;
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::PortDown { guid });
            self.trap(now, Notice::TRAP_GID_OUT_OF_SERVICE, gid);
        }
    }

    /// The P_Key table this port should have.
    fn pkeys_for(&self, port: Guid) -> [u16; 32] {
        let mut t = [0u16; 32];
        let mut k = 0;
        for p in &self.cfg.partitions {
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
            self.sa_request(now, from, mad);
        }
    }

    fn smp_answer(&mut self, now: Instant, i: usize, want: Want, mad: &MadBytes) {
        let ok = u16::from_be_bytes([mad[4], mad[5]]) & 0x7fff == 0;
        let data = &mad[SMP_DATA..SMP_DATA + 64];
        if !ok {
            // The port refused: start over at the next sweep.
            self.nodes[i].busy = false;
            return;
        }
        match want {
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
            Want::PortInfo | Want::SetPortInfo => {
                self.nodes[i].port.copy_from_slice(data);
                let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
                let lid = match self.lid_of.get(&guid) {
                    Some(l) => *l,
                    None => {
                        let l = self.next_lid;
                        self.next_lid += 1;
                        self.lid_of.insert(guid, l);
                        l
                    }
                };
                self.nodes[i].lid = lid;
                let pi = PortInfo::new_checked(data).expect("64 bytes");
                let next = match pi.port_state() {
                    state::INIT => Some(state::ARMED),
                    state::ARMED => Some(state::ACTIVE),
                    _ if pi.lid() != lid || pi.sm_lid() != self.cfg.lid => Some(0),
                    _ => None,
                };
                match next {
                    Some(st) if want == Want::PortInfo || st != 0 => {
                        let mut m = smp(Method::Set, SmpAttr::PortInfo, 0);
                        let mut p = PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64])
                            .expect("64 bytes");
                        p.set_lid(lid);
                        p.set_sm_lid(self.cfg.lid);
                        p.set_subnet_timeout(18);
                        p.set_port_state(st);
                        self.ask(now, i, Want::SetPortInfo, m);
                    }
                    _ => {
                        let wanted = self.pkeys_for(guid);
                        let mut m = smp(Method::Set, SmpAttr::PkeyTable, 0);
                        for (k, v) in wanted.iter().enumerate() {
                            m[SMP_DATA + 2 * k..SMP_DATA + 2 * k + 2]
                                .copy_from_slice(&v.to_be_bytes());
                        }
                        self.ask(now, i, Want::SetPkeys, m);
                    }
                }
            }
            Want::SetPkeys => {
                let n = &mut self.nodes[i];
                n.busy = false;
                if !n.in_service {
                    n.in_service = true;
                    let (gid, lid) = (n.gid, n.lid);
                    let guid = n.info.map_or(Guid(0), |x| x.port_guid);
                    self.events.push_back(SmEvent::PortUp { guid, lid });
                    self.trap(now, Notice::TRAP_GID_IN_SERVICE, gid);
                }
            }
        }
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
            issuer_lid: self.cfg.lid,
            toggle: false,
            count: 0,
            data_details: details,
            issuer_gid: Gid([0; 16]),
        };
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
                let recs = self.path_records(from, &hdr, data);
                self.answer(from, req, method, &recs, PathRecord::LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::NodeRecord) => {
                let recs = self.node_records(&hdr, data);
                self.answer(from, req, method, &recs, NODE_RECORD_LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::PortInfoRecord) => {
                let recs = self.portinfo_records(&hdr, data);
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
            let (x, y) = (p.membership(a)?, p.membership(b)?);
            (x || y).then_some(p.pkey | 0x8000)
        })
    }

    fn path_records(&self, from: P, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let Ok(q) = PathRecord::parse(data) else {
            return Vec::new();
        };
        let m = hdr.comp_mask;
        let srcs: Vec<&Node<P>> = self
            .nodes
            .iter()
            .filter(|n| n.in_service)
            .filter(|n| {
                if m & (path_comp::SGID | path_comp::SLID) == 0 {
                    n.addr == from
                } else {
                    (m & path_comp::SGID == 0 || n.gid == q.sgid)
                        && (m & path_comp::SLID == 0 || n.lid == q.slid)
                }
            })
            .collect();
        let mut out = Vec::new();
        for s in &srcs {
            for d in self.nodes.iter().filter(|n| n.in_service) {
                if (m & path_comp::DGID != 0 && d.gid != q.dgid)
                    || (m & path_comp::DLID != 0 && d.lid != q.dlid)
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
                let rec = PathRecord {
                    service_id: q.service_id,
                    dgid: d.gid,
                    sgid: s.gid,
                    dlid: d.lid,
                    slid: s.lid,
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
                    preference: 0,
                };
                let mut b = vec![0u8; PathRecord::LEN];
                rec.emit(&mut b);
                out.push(b);
            }
        }
        out
    }

    fn node_records(&self, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let want_lid = u16::from_be_bytes([data[0], data[1]]);
        self.nodes
            .iter()
            .filter(|n| n.in_service && (hdr.comp_mask & 1 == 0 || n.lid == want_lid))
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
            .filter(|n| m & portinfo_comp::LID == 0 || n.lid == want_lid)
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
                p.set_sm_lid(self.cfg.lid);
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
