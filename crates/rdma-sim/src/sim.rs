//! A datagram network of sans-IO nodes on a virtual clock.
//!
//! Every directed (source, destination) address pair is a link with its own
//! [`FaultInjector`], seeded from the simulator's seed and the addresses, so a
//! run is reproducible. The clock only moves when nothing is left to do at
//! the current instant, and then jumps to the earliest pending event.

use crate::fault::{FaultConfig, FaultInjector, FaultStats};
use rdma_types::{Duration, Instant};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

/// A datagram in flight between two nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Sender address.
    pub src: SocketAddr,
    /// Receiver address.
    pub dst: SocketAddr,
    /// Payload bytes (for RoCEv2: the UDP payload, BTH onward).
    pub data: Vec<u8>,
}

/// A sans-IO participant. The simulator calls, in rounds: `poll_transmit`
/// until `None`, `handle_datagram` for everything due, and `handle_timeout`
/// once `poll_timeout` has passed.
pub trait SimNode {
    /// Addresses the node receives on.
    fn addrs(&self) -> Vec<SocketAddr>;
    /// A datagram arrived.
    fn handle_datagram(&mut self, now: Instant, dgram: Datagram);
    /// The next datagram the node wants to send, if any.
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram>;
    /// When the node next wants `handle_timeout`.
    fn poll_timeout(&mut self) -> Option<Instant>;
    /// The deadline returned by `poll_timeout` has passed.
    fn handle_timeout(&mut self, now: Instant);
}

/// Why [`Simulator::run_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The caller's condition became true.
    Done,
    /// Nothing left to happen: no datagram in flight, no timer pending.
    Idle,
    /// The virtual deadline passed.
    Deadline,
    /// The step budget ran out (a livelock at one instant, most likely).
    StepLimit,
}

struct Link {
    src: SocketAddr,
    dst: SocketAddr,
    fault: FaultInjector,
}

/// The simulated network. Generic over one node type; use an enum to mix.
pub struct Simulator<N: SimNode> {
    now: Instant,
    seed: u64,
    nodes: Vec<N>,
    routes: BTreeMap<SocketAddr, usize>,
    links: BTreeMap<(SocketAddr, SocketAddr), Link>,
    default_fault: FaultConfig,
    down: BTreeSet<(IpAddr, IpAddr)>,
    unroutable: u64,
    max_steps: u64,
}

impl<N: SimNode> Simulator<N> {
    /// An empty network whose link faults follow from `seed`.
    pub fn new(seed: u64) -> Self {
        Simulator {
            now: Instant::ZERO,
            seed,
            nodes: Vec::new(),
            routes: BTreeMap::new(),
            links: BTreeMap::new(),
            default_fault: FaultConfig::default(),
            down: BTreeSet::new(),
            unroutable: 0,
            max_steps: 10_000_000,
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Faults applied to links created from now on (the seed field is
    /// replaced per link).
    pub fn set_default_fault(&mut self, cfg: FaultConfig) {
        self.default_fault = cfg;
    }

    /// Changes the faults of every existing link and of links created later.
    pub fn set_fault_everywhere(&mut self, cfg: FaultConfig) {
        for link in self.links.values_mut() {
            let seed = link.fault.config().seed;
            link.fault.set_config(FaultConfig {
                seed,
                ..cfg.clone()
            });
        }
        self.default_fault = cfg;
    }

    /// Bounds the number of rounds a single `run_until` may take.
    pub fn set_max_steps(&mut self, steps: u64) {
        self.max_steps = steps;
    }

    /// Adds a node and returns its index.
    ///
    /// # Panics
    /// If another node already owns one of its addresses (a test bug).
    pub fn add_node(&mut self, node: N) -> usize {
        let id = self.nodes.len();
        for a in node.addrs() {
            let prev = self.routes.insert(a, id);
            assert!(prev.is_none(), "address {a} owned by two simulated nodes");
        }
        self.nodes.push(node);
        id
    }

    /// A node by index.
    pub fn node(&self, id: usize) -> &N {
        &self.nodes[id]
    }

    /// A node by index, mutably (to post work, query state, ...).
    pub fn node_mut(&mut self, id: usize) -> &mut N {
        &mut self.nodes[id]
    }

    /// Cuts (or restores) both directions between two IP addresses,
    /// dropping whatever is in flight between them.
    pub fn set_link_up(&mut self, a: IpAddr, b: IpAddr, up: bool) {
        for pair in [(a, b), (b, a)] {
            if up {
                self.down.remove(&pair);
            } else {
                self.down.insert(pair);
            }
        }
        for link in self.links.values_mut() {
            let pair = (link.src.ip(), link.dst.ip());
            if pair == (a, b) || pair == (b, a) {
                link.fault.set_link_up(up);
            }
        }
    }

    /// Datagrams sent to an address no node owns.
    pub fn unroutable(&self) -> u64 {
        self.unroutable
    }

    /// Fault counters summed over every link.
    pub fn fault_stats(&self) -> FaultStats {
        let mut sum = FaultStats::default();
        for l in self.links.values() {
            let s = l.fault.stats();
            sum.offered += s.offered;
            sum.lost += s.lost;
            sum.link_down += s.link_down;
            sum.duplicated += s.duplicated;
            sum.reordered += s.reordered;
            sum.corrupted += s.corrupted;
        }
        sum
    }

    fn link_seed(&self, src: SocketAddr, dst: SocketAddr) -> u64 {
        // FNV-1a over the textual addresses: stable across runs and
        // platforms, unlike std's randomly keyed hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for b in src
            .to_string()
            .bytes()
            .chain([0])
            .chain(dst.to_string().bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    fn send(&mut self, d: Datagram) {
        if !self.routes.contains_key(&d.dst) {
            self.unroutable += 1;
            return;
        }
        let key = (d.src, d.dst);
        if !self.links.contains_key(&key) {
            let cfg = FaultConfig {
                seed: self.link_seed(d.src, d.dst),
                ..self.default_fault.clone()
            };
            let mut fault = FaultInjector::new(cfg);
            if self.down.contains(&(d.src.ip(), d.dst.ip())) {
                fault.set_link_up(false);
            }
            self.links.insert(
                key,
                Link {
                    src: d.src,
                    dst: d.dst,
                    fault,
                },
            );
        }
        let link = self.links.get_mut(&key).expect("inserted above");
        link.fault.push(self.now, d.data);
    }

    /// One round at the current instant; returns whether anything happened.
    fn round(&mut self) -> bool {
        let mut busy = false;
        for i in 0..self.nodes.len() {
            while let Some(d) = self.nodes[i].poll_transmit(self.now) {
                busy = true;
                self.send(d);
            }
        }
        let now = self.now;
        let mut arrivals = Vec::new();
        for link in self.links.values_mut() {
            while let Some(data) = link.fault.pop_ready(now) {
                arrivals.push(Datagram {
                    src: link.src,
                    dst: link.dst,
                    data,
                });
            }
        }
        for d in arrivals {
            busy = true;
            if let Some(&id) = self.routes.get(&d.dst) {
                self.nodes[id].handle_datagram(now, d);
            }
        }
        for node in &mut self.nodes {
            if node.poll_timeout().is_some_and(|t| t <= now) {
                busy = true;
                node.handle_timeout(now);
            }
        }
        busy
    }

    fn next_event(&mut self) -> Option<Instant> {
        let links = self.links.values().filter_map(|l| l.fault.next_release());
        let timers: Vec<Instant> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.poll_timeout())
            .collect();
        links.chain(timers).min()
    }

    /// Runs until `done` holds, nothing is left to happen, or virtual time
    /// passes `limit` from now. `done` is checked after every round.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> RunOutcome {
        let deadline = self.now + limit;
        let mut steps = 0u64;
        loop {
            if done(self) {
                return RunOutcome::Done;
            }
            steps += 1;
            if steps > self.max_steps {
                return RunOutcome::StepLimit;
            }
            if self.round() {
                continue;
            }
            match self.next_event() {
                None => return RunOutcome::Idle,
                Some(t) if t > deadline => {
                    self.now = deadline;
                    return RunOutcome::Deadline;
                }
                Some(t) => self.now = self.now.max(t),
            }
        }
    }

    /// Runs until nothing is left to happen or `limit` of virtual time passes.
    pub fn run_idle(&mut self, limit: Duration) -> RunOutcome {
        self.run_until(limit, |_| false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FaultConfig;

    /// A stop-and-wait sender with retransmission, and a receiver that
    /// acknowledges by sequence number: enough protocol to exercise loss,
    /// duplication, reordering and timers.
    struct Peer {
        addr: SocketAddr,
        peer: SocketAddr,
        // sender side
        to_send: Vec<u32>,
        next: usize,
        last_sent: Option<Instant>,
        rto: Duration,
        retransmits: u32,
        // receiver side
        expect: u32,
        received: Vec<u32>,
        acks: Vec<u32>,
    }

    impl Peer {
        fn new(addr: &str, peer: &str, to_send: Vec<u32>) -> Self {
            Peer {
                addr: addr.parse().unwrap(),
                peer: peer.parse().unwrap(),
                to_send,
                next: 0,
                last_sent: None,
                rto: Duration::from_millis(10),
                retransmits: 0,
                expect: 0,
                received: Vec::new(),
                acks: Vec::new(),
            }
        }
    }

    impl SimNode for Peer {
        fn addrs(&self) -> Vec<SocketAddr> {
            vec![self.addr]
        }
        fn handle_datagram(&mut self, _now: Instant, d: Datagram) {
            if d.data.len() != 5 {
                return; // corrupted length can't happen, but be strict
            }
            let v = u32::from_be_bytes(d.data[1..5].try_into().unwrap());
            match d.data[0] {
                b'D' => {
                    if v == self.expect {
                        self.received.push(v);
                        self.expect += 1;
                    }
                    self.acks.push(self.expect);
                }
                b'A' if v as usize > self.next => {
                    self.next = v as usize;
                    self.last_sent = None;
                }
                _ => {}
            }
        }
        fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
            if let Some(a) = self.acks.pop() {
                let mut data = vec![b'A'];
                data.extend_from_slice(&a.to_be_bytes());
                return Some(Datagram {
                    src: self.addr,
                    dst: self.peer,
                    data,
                });
            }
            if self.next < self.to_send.len() && self.last_sent.is_none() {
                self.last_sent = Some(now);
                let mut data = vec![b'D'];
                data.extend_from_slice(&self.to_send[self.next].to_be_bytes());
                return Some(Datagram {
                    src: self.addr,
                    dst: self.peer,
                    data,
                });
            }
            None
        }
        fn poll_timeout(&mut self) -> Option<Instant> {
            self.last_sent.map(|t| t + self.rto)
        }
        fn handle_timeout(&mut self, _now: Instant) {
            self.retransmits += 1;
            self.last_sent = None;
        }
    }

    fn pair(sim: &mut Simulator<Peer>, n: u32) -> (usize, usize) {
        let a = sim.add_node(Peer::new(
            "127.0.0.1:4791",
            "127.0.0.2:4791",
            (0..n).collect(),
        ));
        let b = sim.add_node(Peer::new("127.0.0.2:4791", "127.0.0.1:4791", vec![]));
        (a, b)
    }

    #[test]
    fn clean_link_delivers_in_order_without_time_passing() {
        let mut sim = Simulator::new(1);
        let (a, b) = pair(&mut sim, 100);
        let out = sim.run_until(Duration::from_secs(1), |s| s.node(b).received.len() == 100);
        assert_eq!(out, RunOutcome::Done);
        assert_eq!(sim.node(b).received, (0..100).collect::<Vec<_>>());
        assert_eq!(sim.node(a).retransmits, 0);
        assert_eq!(sim.now(), Instant::ZERO);
    }

    #[test]
    fn lossy_link_recovers_by_timeouts_on_virtual_time() {
        let mut sim = Simulator::new(7);
        sim.set_default_fault(FaultConfig {
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.1,
            ..FaultConfig::default()
        });
        let (a, b) = pair(&mut sim, 300);
        let out = sim.run_until(Duration::from_secs(3600), |s| {
            s.node(b).received.len() == 300
        });
        assert_eq!(out, RunOutcome::Done);
        assert_eq!(sim.node(b).received, (0..300).collect::<Vec<_>>());
        assert!(sim.node(a).retransmits > 10);
        assert!(
            sim.now() > Instant::ZERO,
            "retransmission timers moved the clock"
        );
        let s = sim.fault_stats();
        assert!(s.lost > 0 && s.duplicated > 0 && s.reordered > 0, "{s:?}");
    }

    #[test]
    fn runs_are_reproducible_from_the_seed() {
        let run = |seed| {
            let mut sim = Simulator::new(seed);
            sim.set_default_fault(FaultConfig::lossy(0, 0.2));
            let (a, b) = pair(&mut sim, 50);
            sim.run_until(Duration::from_secs(3600), |s| {
                s.node(b).received.len() == 50
            });
            (sim.now(), sim.node(a).retransmits, sim.fault_stats())
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn cut_link_stalls_until_restored() {
        let mut sim = Simulator::new(3);
        let (a, b) = pair(&mut sim, 10);
        let ip1: IpAddr = "127.0.0.1".parse().unwrap();
        let ip2: IpAddr = "127.0.0.2".parse().unwrap();
        sim.set_link_up(ip1, ip2, false);
        let out = sim.run_until(Duration::from_millis(100), |s| {
            s.node(b).received.len() == 10
        });
        assert_eq!(out, RunOutcome::Deadline);
        assert!(sim.node(b).received.is_empty());
        assert!(sim.node(a).retransmits >= 9, "kept retrying every 10 ms");
        sim.set_link_up(ip1, ip2, true);
        let out = sim.run_until(Duration::from_secs(1), |s| s.node(b).received.len() == 10);
        assert_eq!(out, RunOutcome::Done);
    }

    #[test]
    fn idle_and_unroutable_are_reported() {
        let mut sim = Simulator::new(0);
        sim.add_node(Peer::new("127.0.0.1:1", "127.0.0.9:1", vec![1]));
        // The sender retries forever into the void: the deadline ends it.
        assert_eq!(
            sim.run_idle(Duration::from_millis(50)),
            RunOutcome::Deadline
        );
        assert!(sim.unroutable() >= 5);
        let mut quiet: Simulator<Peer> = Simulator::new(0);
        quiet.add_node(Peer::new("127.0.0.1:1", "127.0.0.2:1", vec![]));
        assert_eq!(quiet.run_idle(Duration::from_secs(1)), RunOutcome::Idle);
    }
}
