//! A simulated fabric for the SM: the SM at 10.0.0.1 and hosts at .2 and
//! up, each host a subnet management agent (`rdma_access::sma`) with a
//! small SA client, on `rdma_sim`'s virtual clock. MADs travel as
//! datagrams whose first byte names the QP (0 for SMPs, 1 for the SA): the
//! simulator moves bytes, not RoCEv2 frames, since what is exercised here
//! is the management protocol, not the transport. The tests and `ibsm
//! simulate` use it. [`two_sms`] adds a second SM after the hosts, for
//! election, standby polling and takeover; an SM node can be stopped
//! (`dead`), which silences it as a killed process is.

use crate::sm::{table_records, QP_GSI, QP_SMI};
use crate::{parse_partitions, SmConfig, SmEvent, SubnetManager};
use rdma_access::gsi::MadBytes;
use rdma_access::sma::{ca_capability_mask, state, Sma, SmaConfig};
use rdma_mad::mad::{Mad, Method, MAD_SIZE};
use rdma_mad::rmpp::RmppHeader;
use rdma_mad::sa::{InformInfo, SaAttr, SaHeader, SA_HDR_LEN};
use rdma_mad::smp::Notice;
use rdma_sim::{Datagram, FaultConfig, SimNode, Simulator};
use rdma_types::{Duration, Gid, Guid, Instant, Qpn};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub fn addr(n: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)), 4791)
}

pub fn gid(n: u8) -> Gid {
    Gid::from_ip(addr(n).ip())
}

pub fn port_guid(n: u8) -> Guid {
    Guid(0x0002_c903_0000_0000 | u64::from(n))
}

pub fn frame(from: SocketAddr, to: SocketAddr, qp: u8, mad: &[u8]) -> Datagram {
    let mut data = vec![qp];
    data.extend_from_slice(&mad[..MAD_SIZE]);
    Datagram {
        src: from,
        dst: to,
        data,
    }
}

/// A query in flight: the request, when to resend it, what came back.
pub struct Query {
    pub mad: MadBytes,
    pub deadline: Instant,
    pub segments: Vec<MadBytes>,
    pub done: bool,
}

pub struct Host {
    pub me: SocketAddr,
    pub sm: SocketAddr,
    pub sma: Sma,
    pub out: VecDeque<Datagram>,
    pub queries: HashMap<u64, Query>,
    pub notices: Vec<Notice>,
    pub next_tid: u64,
    /// When the SMA's unrepressed trap is sent again.
    pub trap_deadline: Option<Instant>,
    /// Traps sent (first sends and resends).
    pub traps_sent: u64,
    /// TrapRepresses to lose on arrival (a one-way loss for tests).
    pub lose_represses: u32,
    /// The TID of the trap last sent.
    trap_sent: Option<u64>,
    /// The SM_Key its SA requests carry (0: an ordinary, untrusted
    /// client).
    pub sa_sm_key: u64,
}

impl Host {
    pub fn new(n: u8, dm: bool) -> Host {
        Host {
            me: addr(n),
            sm: addr(1),
            sma: Sma::new(SmaConfig {
                node_guid: Guid(port_guid(n).0 + 0x100),
                port_guid: port_guid(n),
                description: format!("host-{n}"),
                capability_mask: ca_capability_mask(dm),
            }),
            out: VecDeque::new(),
            queries: HashMap::new(),
            notices: Vec::new(),
            next_tid: 1,
            trap_deadline: None,
            traps_sent: 0,
            lose_represses: 0,
            trap_sent: None,
            sa_sm_key: 0,
        }
    }

    /// Changes the port's CapabilityMask; the SMA's trap 144 goes to the
    /// SM (resent every 300 ms until repressed).
    pub fn set_capability_mask(&mut self, now: Instant, mask: u32) {
        self.sma.set_capability_mask(mask);
        self.send_trap(now);
    }

    /// The port dropped `count` packets for their P_Key, the latest as
    /// `last` says; the SMA's trap 257 goes to the SM (resent every 300 ms
    /// until repressed).
    pub fn note_pkey_violations(
        &mut self,
        now: Instant,
        count: u64,
        last: rdma_mad::smp::BadKeyTrap,
    ) {
        self.sma.note_pkey_violations(count, last);
        self.send_trap(now);
    }

    fn send_trap(&mut self, now: Instant) {
        self.trap_deadline = None;
        if let Some(t) = self.sma.trap() {
            let f = frame(self.me, self.sm, QP_SMI, t);
            self.trap_sent = Some(u64::from_be_bytes(t[8..16].try_into().expect("8")));
            self.out.push_back(f);
            self.traps_sent += 1;
            self.trap_deadline = Some(now + Duration::from_millis(300));
        }
    }

    /// Sends an SA request; returns its TID.
    pub fn query(
        &mut self,
        now: Instant,
        method: u8,
        attr: SaAttr,
        comp_mask: u64,
        data: &[u8],
    ) -> u64 {
        self.next_tid += 1;
        let tid = self.next_tid;
        let mut m = rdma_access::sa::sa_request(Method::from(method), attr, comp_mask, data);
        Mad::new_unchecked(&mut m[..]).set_tid(tid);
        SaHeader {
            comp_mask,
            sm_key: self.sa_sm_key,
            ..Default::default()
        }
        .emit(&mut m);
        self.out.push_back(frame(self.me, self.sm, QP_GSI, &m));
        self.queries.insert(
            tid,
            Query {
                mad: m,
                deadline: now + Duration::from_millis(300),
                segments: Vec::new(),
                done: false,
            },
        );
        tid
    }

    pub fn done(&self, tid: u64) -> bool {
        self.queries.get(&tid).is_some_and(|q| q.done)
    }
}

impl SimNode for Host {
    fn addrs(&self) -> Vec<SocketAddr> {
        vec![self.me]
    }

    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        let Some((&qp, mad)) = d.data.split_first() else {
            return;
        };
        if qp == QP_SMI {
            if mad.get(3) == Some(&0x07) && self.lose_represses > 0 {
                self.lose_represses -= 1;
                return;
            }
            if let Some((r, _)) = self.sma.handle(now, mad) {
                if mad.get(3) == Some(&0x02) {
                    // The SM (and its SA) is where the Sets come from.
                    self.sm = d.src;
                }
                self.out.push_back(frame(self.me, d.src, QP_SMI, &r));
            }
            match self.sma.trap() {
                None => self.trap_deadline = None,
                // A new trap (256 for a bad M_Key, or the next queued one):
                // send it now.
                Some(t)
                    if Some(u64::from_be_bytes(t[8..16].try_into().expect("8")))
                        != self.trap_sent =>
                {
                    self.send_trap(now)
                }
                Some(_) => {}
            }
            return;
        }
        if mad.len() < MAD_SIZE {
            return;
        }
        let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap());
        match mad[3] {
            0x06 => {
                // Report: note the notice and acknowledge it.
                if let Ok(n) = Notice::parse(&mad[SA_HDR_LEN..]) {
                    self.notices.push(n);
                }
                let mut r = [0u8; MAD_SIZE];
                r.copy_from_slice(&mad[..MAD_SIZE]);
                r[3] = 0x86;
                self.out.push_back(frame(self.me, d.src, QP_GSI, &r));
            }
            m if m & 0x80 != 0 => {
                let Some(q) = self.queries.get_mut(&tid) else {
                    return;
                };
                if q.done {
                    return;
                }
                let seg: MadBytes = mad[..MAD_SIZE].try_into().unwrap();
                let rmpp = RmppHeader::parse(&seg).ok().filter(|h| h.active());
                match rmpp {
                    None => {
                        q.segments = vec![seg];
                        q.done = true;
                    }
                    Some(h) => {
                        // In order only (the SM sends them in order; a gap
                        // is loss, and the query is sent again).
                        if h.seg_num as usize == q.segments.len() + 1 {
                            q.segments.push(seg);
                            q.done = h.flags & rdma_mad::rmpp::FLAG_LAST != 0;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        self.out.pop_front()
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.queries
            .values()
            .filter(|q| !q.done)
            .map(|q| q.deadline)
            .chain(self.trap_deadline)
            .chain(self.sma.poll_timeout())
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.sma.handle_timeout(now);
        if self.trap_deadline.is_some_and(|t| t <= now) {
            self.send_trap(now);
        }
        for q in self
            .queries
            .values_mut()
            .filter(|q| !q.done && q.deadline <= now)
        {
            q.segments.clear();
            q.deadline = now + Duration::from_millis(300);
            self.out.push_back(frame(self.me, self.sm, QP_GSI, &q.mad));
        }
    }
}

pub struct SmNode {
    pub me: SocketAddr,
    /// A stopped SM: hears nothing, sends nothing.
    pub dead: bool,
    pub sm: SubnetManager<SocketAddr>,
    pub events: Vec<SmEvent>,
    /// Every MAD the SM sent or received: (QP, MAD), for the tshark check.
    pub log: Vec<(u8, MadBytes)>,
}

impl SimNode for SmNode {
    fn addrs(&self) -> Vec<SocketAddr> {
        vec![self.me]
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        if self.dead {
            return;
        }
        if let Some((&qp, mad)) = d.data.split_first() {
            if let Ok(m) = <MadBytes>::try_from(mad) {
                self.log.push((qp, m));
            }
            self.sm.handle_mad(now, d.src, qp, mad);
        }
        while let Some(e) = self.sm.poll_event() {
            self.events.push(e);
        }
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        if self.dead {
            return None;
        }
        let o = self.sm.poll_transmit()?;
        self.log.push((o.qp, *o.mad));
        Some(frame(self.me, o.to, o.qp, &o.mad[..]))
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        if self.dead {
            return None;
        }
        self.sm.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.dead {
            return;
        }
        self.sm.handle_timeout(now);
        while let Some(e) = self.sm.poll_event() {
            self.events.push(e);
        }
    }
}

pub enum N {
    Sm(SmNode),
    Host(Host),
}

impl SimNode for N {
    fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            N::Sm(s) => s.addrs(),
            N::Host(h) => h.addrs(),
        }
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        match self {
            N::Sm(s) => s.handle_datagram(now, d),
            N::Host(h) => h.handle_datagram(now, d),
        }
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        match self {
            N::Sm(s) => s.poll_transmit(now),
            N::Host(h) => h.poll_transmit(now),
        }
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        match self {
            N::Sm(s) => s.poll_timeout(),
            N::Host(h) => h.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            N::Sm(s) => s.handle_timeout(now),
            N::Host(h) => h.handle_timeout(now),
        }
    }
}

/// An SM at 10.0.0.1 and hosts at .2 to .5; host 2 offers device
/// management. Returns the simulator with node 0 the SM.
pub fn fabric(
    seed: u64,
    loss: f64,
    partitions: Option<&str>,
    hosts: u8,
) -> Result<Simulator<N>, crate::PartitionError> {
    Ok(fabric_with(seed, loss, sim_config(partitions)?, hosts))
}

/// The SM configuration [`fabric`] uses: sweeps every second, the
/// partitions of `partitions` (a partitions file's text) if given.
pub fn sim_config(partitions: Option<&str>) -> Result<SmConfig, crate::PartitionError> {
    let mut cfg = SmConfig::new(Guid(0xabc));
    cfg.sweep_interval = Duration::from_secs(1);
    if let Some(p) = partitions {
        cfg.partitions = parse_partitions(p)?;
    }
    Ok(cfg)
}

/// [`fabric`] with the SM configured as `cfg` says.
pub fn fabric_with(seed: u64, loss: f64, cfg: SmConfig, hosts: u8) -> Simulator<N> {
    let mut sim = Simulator::new(seed);
    if loss > 0.0 {
        sim.set_default_fault(FaultConfig {
            seed,
            loss,
            ..Default::default()
        });
    }
    let endpoints = (2..2 + hosts).map(|n| (addr(n), gid(n))).collect();
    add_sm(&mut sim, 1, cfg, endpoints, Instant::ZERO, false);
    for n in 2..2 + hosts {
        sim.add_node(N::Host(Host::new(n, n == 2)));
    }
    sim
}

/// Adds an SM at `addr(n)` managing `endpoints`, first sweeping at
/// `start`; stopped (`dead`) if `dead`.
pub fn add_sm(
    sim: &mut Simulator<N>,
    n: u8,
    cfg: SmConfig,
    endpoints: Vec<(SocketAddr, Gid)>,
    start: Instant,
    dead: bool,
) {
    sim.add_node(N::Sm(SmNode {
        me: addr(n),
        dead,
        sm: SubnetManager::new(cfg, endpoints, start),
        events: Vec::new(),
        log: Vec::new(),
    }));
}

/// Two SMs: A at 10.0.0.1 (LID 1, node 0) and B after the hosts at
/// `addr(hosts + 2)` (LID `lid_b`, node `hosts + 1`), each listing the other
/// among its nodes; sweeps every second, polls every 500 ms, 100 ms per
/// SMP with 2 resends. With a `b_delay`, B starts stopped (`dead`, for
/// the test to start) and sweeps no earlier than `b_delay`.
pub fn two_sms(
    seed: u64,
    hosts: u8,
    prio_a: u8,
    prio_b: u8,
    lid_b: u16,
    b_delay: Duration,
) -> Simulator<N> {
    let mut sim = Simulator::new(seed);
    let b = hosts + 2;
    let mk = |n: u8, lid: u16, prio: u8, peer: u8, start: Instant, dead: bool| {
        let mut cfg = SmConfig::new(Guid(0xabc0 + u64::from(n)));
        cfg.lid = lid;
        cfg.priority = prio;
        cfg.sweep_interval = Duration::from_secs(1);
        cfg.poll_interval = Duration::from_millis(500);
        cfg.timeout = Duration::from_millis(100);
        cfg.retries = 2;
        let mut endpoints: Vec<(SocketAddr, Gid)> =
            (2..2 + hosts).map(|h| (addr(h), gid(h))).collect();
        endpoints.push((addr(peer), gid(peer)));
        N::Sm(SmNode {
            me: addr(n),
            dead,
            sm: SubnetManager::new(cfg, endpoints, start),
            events: Vec::new(),
            log: Vec::new(),
        })
    };
    sim.add_node(mk(1, 1, prio_a, b, Instant::ZERO, false));
    for n in 2..2 + hosts {
        sim.add_node(N::Host(Host::new(n, false)));
    }
    let late = b_delay > Duration::ZERO;
    sim.add_node(mk(b, lid_b, prio_b, 1, Instant::ZERO + b_delay, late));
    sim
}

/// The SM at simulator node `id` (0 for A; `hosts + 1` for B of
/// [`two_sms`]).
pub fn sm_node(sim: &mut Simulator<N>, id: usize) -> &mut SmNode {
    match sim.node_mut(id) {
        N::Sm(s) => s,
        N::Host(_) => unreachable!("node {id} is a host"),
    }
}

pub fn host(sim: &mut Simulator<N>, n: u8) -> &mut Host {
    match sim.node_mut(usize::from(n - 1)) {
        N::Host(h) => h,
        N::Sm(_) => unreachable!("node 1 is the SM; hosts are 2 and up"),
    }
}

pub fn sm(sim: &mut Simulator<N>) -> &mut SmNode {
    match sim.node_mut(0) {
        N::Sm(s) => s,
        N::Host(_) => unreachable!("node 0 is the SM"),
    }
}

pub fn all_active(sim: &mut Simulator<N>, hosts: u8) -> bool {
    (2..2 + hosts).all(|n| host(sim, n).sma.port_state() == state::ACTIVE)
        && sm(sim).sm.active_ports().len() == usize::from(hosts)
}

pub fn run_query(
    sim: &mut Simulator<N>,
    n: u8,
    method: u8,
    attr: SaAttr,
    mask: u64,
    data: &[u8],
) -> Option<Vec<MadBytes>> {
    let now = sim.now();
    let tid = host(sim, n).query(now, method, attr, mask, data);
    let r = sim.run_until(rdma_types::Duration::from_secs(30), |s| {
        host(s, n).done(tid)
    });
    (r == rdma_sim::RunOutcome::Done).then(|| host(sim, n).queries[&tid].segments.clone())
}

pub fn table(segs: &[MadBytes]) -> Result<(SaHeader, Vec<Vec<u8>>), rdma_mad::Error> {
    let refs: Vec<&[u8]> = segs.iter().map(|s| &s[..]).collect();
    table_records(&refs)
}

pub fn subscribe(sim: &mut Simulator<N>, n: u8) -> bool {
    let info = InformInfo {
        gid: Gid([0; 16]),
        lid_range_begin: 0xffff,
        lid_range_end: 0,
        is_generic: 1,
        subscribe: 1,
        trap_type: 0xffff,
        trap_number: 0xffff,
        qpn: Qpn::from_bits(1),
        resp_time_value: 18,
        producer_type: 0xff_ffff,
    };
    let mut b = [0u8; 36];
    info.emit(&mut b);
    run_query(sim, n, 0x02, SaAttr::InformInfo, 0, &b)
        .is_some_and(|segs| u16::from_be_bytes([segs[0][4], segs[0][5]]) == 0)
}
