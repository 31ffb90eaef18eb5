//! The SA client's requests and response reading against the project's
//! own SA (`ib-sm`), sans-IO on a virtual clock: four hosts, each an SMA
//! (`rdma_access::sma`) for the SM's sweeps and a MAD dispatcher with an
//! SA agent; once the SM has brought every port ACTIVE, host 2 asks for
//! paths (Get and an RMPP GetTable), every NodeRecord (a GetTable of
//! several segments), the PortInfoRecords with IsDeviceManagementSupported
//! and subscribes to traps; the dispatcher reassembles and ACKs ib-sm's
//! segments and the records parse with `rdma_access::sa`.

use ib_sm::{SmConfig, SubnetManager};
use rdma_access::gsi::{AgentId, Delivery, Dispatcher};
use rdma_access::sa;
use rdma_access::sma::{ca_capability_mask, Sma, SmaConfig};
use rdma_mad::sa::PathRecord;
use rdma_mad::smp::cap;
use rdma_types::{Duration, Gid, Guid, Instant};
use std::net::{IpAddr, Ipv4Addr};

fn gid(n: u8) -> Gid {
    Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 111, 40 + n)))
}

struct Host {
    sma: Sma,
    d: Dispatcher,
    sa: AgentId,
    responses: Vec<(u64, Vec<u8>)>,
    /// Trap numbers of the notices received.
    traps: Vec<u16>,
    /// Unplugged: answers no SMP.
    down: bool,
}

struct Net {
    sm: SubnetManager<u8>,
    hosts: Vec<Host>,
    now: Instant,
}

const SM: u8 = 1;

impl Net {
    fn new() -> Net {
        let mut cfg = SmConfig::new(Guid(0xabc));
        cfg.sweep_interval = Duration::from_secs(1);
        let endpoints = (2..6).map(|n| (n, gid(n))).collect();
        let hosts = (2..6u8)
            .map(|n| {
                let mut d = Dispatcher::new();
                let sa = d.register(sa::SA_CLASS, 2, &[0x06]).unwrap();
                Host {
                    sma: Sma::new(SmaConfig {
                        node_guid: Guid(0x100 + u64::from(n)),
                        port_guid: Guid(0x200 + u64::from(n)),
                        description: format!("host-{n}"),
                        capability_mask: ca_capability_mask(n == 2),
                    }),
                    d,
                    sa,
                    responses: Vec::new(),
                    traps: Vec::new(),
                    down: false,
                }
            })
            .collect();
        Net {
            sm: SubnetManager::new(cfg, endpoints, Instant::ZERO),
            hosts,
            now: Instant::ZERO,
        }
    }

    /// Moves MADs until `done` or the virtual clock passes `limit`.
    fn run(&mut self, limit: Duration, done: impl Fn(&Net) -> bool) {
        let end = self.now + limit;
        for _ in 0..100_000 {
            if done(self) {
                return;
            }
            let mut moved = false;
            while let Some(o) = self.sm.poll_transmit() {
                moved = true;
                let h = &mut self.hosts[usize::from(o.to - 2)];
                if o.qp == 0 {
                    if h.down {
                        continue;
                    }
                    if let Some((r, _)) = h.sma.handle(self.now, &o.mad[..]) {
                        self.sm.handle_mad(self.now, o.to, 0, &r);
                    }
                } else {
                    h.d.handle_mad(self.now, gid(SM), &o.mad[..]);
                }
            }
            for (i, h) in self.hosts.iter_mut().enumerate() {
                while let Some(d) = h.d.poll_delivery() {
                    match d {
                        Delivery::Response { tid, mad, .. } => h.responses.push((tid, mad)),
                        Delivery::Request { peer, mad, .. } => {
                            let n = sa::notice_of(&mad[..]).expect("a Report");
                            h.traps.push(n.trap_number);
                            h.d.send(peer, sa::report_response(&mad));
                        }
                        Delivery::TimedOut { tid, .. } => panic!("query {tid:#x} timed out"),
                    }
                }
                while let Some((to, m)) = h.d.poll_transmit() {
                    assert_eq!(to, gid(SM));
                    moved = true;
                    self.sm.handle_mad(self.now, i as u8 + 2, 1, &m[..]);
                }
            }
            if moved {
                continue;
            }
            let next = self
                .hosts
                .iter()
                .map(|h| h.d.poll_timeout())
                .chain([self.sm.poll_timeout()])
                .flatten()
                .min();
            let Some(t) = next else { return };
            assert!(t <= end, "nothing happened before the limit");
            self.now = t;
            self.sm.handle_timeout(t);
            for h in &mut self.hosts {
                h.d.handle_timeout(t);
            }
        }
        panic!("no end in 100000 rounds");
    }

    fn ask(&mut self, req: rdma_access::gsi::MadBytes) -> Vec<u8> {
        let h = &mut self.hosts[0];
        let tid =
            h.d.send_request(self.now, h.sa, gid(SM), req, Duration::from_millis(300), 3);
        self.run(Duration::from_secs(5), |n| {
            n.hosts[0].responses.iter().any(|(t, _)| *t == tid)
        });
        let h = &mut self.hosts[0];
        let k = h.responses.iter().position(|(t, _)| *t == tid).unwrap();
        h.responses.remove(k).1
    }
}

#[test]
fn sa_client_queries_the_ib_sm_sa() {
    let mut net = Net::new();
    net.run(Duration::from_secs(10), |n| n.sm.active_ports().len() == 4);
    let lids: Vec<u16> = net.sm.active_ports().iter().map(|p| p.1).collect();
    assert_eq!(lids.len(), 4);

    let q = sa::PathQuery {
        sgid: gid(2),
        dgid: gid(3),
        max_paths: 1,
        pkey: None,
        service_id: None,
    };
    let one = sa::records(&net.ask(sa::path_request(&q)), PathRecord::LEN).unwrap();
    assert_eq!(one.len(), 1);
    let p = PathRecord::parse(&one[0]).unwrap();
    assert_eq!((p.sgid, p.dgid), (gid(2), gid(3)));
    assert_eq!(Some(p.slid), net.sm.lid(Guid(0x202)));
    assert_eq!(Some(p.dlid), net.sm.lid(Guid(0x203)));
    let table = net.ask(sa::path_request(&sa::PathQuery { max_paths: 4, ..q }));
    let many = sa::records(&table, PathRecord::LEN).unwrap();
    assert!(!many.is_empty());
    assert!(many
        .iter()
        .map(|r| PathRecord::parse(r).unwrap())
        .all(|r| r.sgid == gid(2) && r.dgid == gid(3)));

    // Four 108-byte NodeRecords at a 112-byte stride: 448 bytes, three
    // RMPP segments, reassembled and ACKed by host 2's dispatcher.
    let before = net.hosts[0].d.stats().rmpp_segments_in;
    let nodes = sa::records(&net.ask(sa::node_request(None)), sa::NODE_RECORD_LEN).unwrap();
    assert_eq!(net.hosts[0].d.stats().rmpp_segments_in - before, 3);
    let mut names: Vec<(u64, String)> = nodes
        .iter()
        .map(|r| sa::NodeRecord::parse(r).unwrap())
        .map(|n| (n.info.port_guid.0, n.description))
        .collect();
    names.sort();
    assert_eq!(
        names,
        (2..6u64)
            .map(|n| (0x200 + n, format!("host-{n}")))
            .collect::<Vec<_>>()
    );

    // Capability-mask matching: only host 2 offers device management.
    let dm = sa::records(
        &net.ask(sa::port_info_request(
            None,
            Some(cap::IS_DEVICE_MGMT_SUPPORTED),
        )),
        sa::PORTINFO_RECORD_LEN,
    )
    .unwrap();
    let dm: Vec<sa::PortInfoRecord> = dm
        .iter()
        .map(|r| sa::PortInfoRecord::parse(r).unwrap())
        .collect();
    assert_eq!(dm.len(), 1);
    assert_eq!(Some(dm[0].lid), net.sm.lid(Guid(0x202)));
    assert_ne!(dm[0].capability_mask() & cap::IS_DEVICE_MGMT_SUPPORTED, 0);
    let all = sa::records(
        &net.ask(sa::port_info_request(None, None)),
        sa::PORTINFO_RECORD_LEN,
    )
    .unwrap();
    assert_eq!(all.len(), 4);

    // Subscribed to every trap: host 5 leaving is trap 65, delivered as a
    // Report that host 2 answers with a ReportResp.
    let r = net.ask(sa::inform_info_request(gid(2), 0xffff, true));
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0);
    net.hosts[3].down = true;
    net.run(Duration::from_secs(30), |n| n.hosts[0].traps.contains(&65));
    assert!(net.hosts[1].traps.is_empty(), "host 3 did not subscribe");
}
