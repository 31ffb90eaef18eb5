//! Two ports on one provider (the loopback fabric or the soft RoCE NIC on
//! 127.0.111.x), and the scenarios the MAD tests run on either; the
//! providers' CAs the other tests start from too.

#![allow(dead_code)]

use rdma_access::dm::{query_iocs, DmService, Ioc, IocLimits};
use rdma_access::{CmAgent, CmConfig, CmError};
use rdma_mad::dm::{ServiceEntry, IO_CLASS_SRP};
use rdma_types::{Gid, Guid, Psn, Qpn};
use rnic::loopback::{CaConfig, Fabric};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which provider carries the MADs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The in-process loopback fabric.
    Loopback,
    /// The soft RoCE NIC over UDP on loopback addresses.
    SoftRoce,
}

/// Two started ports and a GID nobody answers at.
pub struct Pair {
    pub a: Arc<CmAgent>,
    pub b: Arc<CmAgent>,
    pub nobody: Gid,
}

/// CAs `guids` on the loopback fabric, at LIDs 1, 2, ... in order.
pub fn loopback_cas(guids: &[u64]) -> Arc<Fabric> {
    let f = Fabric::new();
    for (lid, &guid) in (1..).zip(guids) {
        f.add_ca(CaConfig::simple(guid, lid)).unwrap();
    }
    f
}

/// Soft RoCE CAs `a` and `b` at 127.0.`net`.`host` and the next address.
pub fn soft_pair(net: u8, host: u8, a: u64, b: u64) -> Arc<SoftRoce> {
    let ca = |guid, h: u8| SoftCa {
        guid: Guid(guid),
        ip: IpAddr::V4(Ipv4Addr::new(127, 0, net, h)),
    };
    SoftRoce::new(vec![ca(a, host), ca(b, host + 1)], ROCE_PORT)
}

/// The CM with short timeouts (2^15 * 4.096 us = 134 ms) so that a lost
/// CM MAD costs little test time.
pub fn fast_cm() -> CmConfig {
    CmConfig {
        response_timeout: rdma_types::TimeoutExp::from_bits(15),
        max_retries: rdma_types::CmRetries::from_bits(15),
        timewait: rdma_types::Duration::from_millis(200),
        // 8 ms there and back: the response time rules.
        packet_life_time: rdma_types::TimeoutExp::from_bits(10),
        ..CmConfig::default()
    }
}

/// Ports A and B; on soft RoCE at 127.0.111.`host` and `host + 1`. With
/// `loss` > 0 each port drops that share of the MADs it receives (soft
/// RoCE: the NIC's fault injector, every packet; loopback: the port's MAD
/// receive knob).
pub fn pair(kind: Kind, host: u8, loss: f64) -> Pair {
    let seed = (u32::from(host) << 20) ^ std::process::id() << 4;
    match kind {
        Kind::Loopback => {
            let f = loopback_cas(&[0xa, 0xb]);
            let a = CmAgent::start_with(f.clone(), Guid(0xa), seed, fast_cm()).unwrap();
            let b = CmAgent::start_with(f, Guid(0xb), seed + 0x1000, fast_cm()).unwrap();
            if loss > 0.0 {
                a.set_receive_loss(Some((11, loss)));
                b.set_receive_loss(Some((12, loss)));
            }
            let nobody = Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0xdead));
            Pair { a, b, nobody }
        }
        Kind::SoftRoce => {
            let p = soft_pair(111, host, 0xa, 0xb);
            if loss > 0.0 {
                for (g, seed) in [(0xa, 7), (0xb, 8)] {
                    let f = rdma_sim::FaultConfig {
                        seed,
                        loss,
                        ..Default::default()
                    };
                    p.set_faults(Guid(g), Some(f)).unwrap();
                }
            }
            let a = CmAgent::start_with(p.clone(), Guid(0xa), seed, fast_cm()).unwrap();
            let b = CmAgent::start_with(p, Guid(0xb), seed + 0x1000, fast_cm()).unwrap();
            Pair {
                a,
                b,
                nobody: Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 111, 60))),
            }
        }
    }
}

/// An SRP I/O controller with `entries` service entries.
pub fn srp_ioc(guid: u64, entries: u64) -> Ioc {
    let mut i = Ioc::srp(Guid(guid), &IocLimits::default(), "test IOC");
    i.services = (0..entries)
        .map(|k| ServiceEntry::srp(guid + k, guid))
        .collect();
    i
}

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(0x100);

/// One CM connection B -> A and its disconnect from B; true if both ends
/// saw it established and the DREP came.
pub fn cm_round(p: &Pair, deadline: Duration) -> Result<(), String> {
    let sid = 0x1000_0000_0000 | u64::from(NEXT_SERVICE.fetch_add(1, Ordering::Relaxed));
    let requests = p.a.listen(sid);
    let a = p.a.clone();
    let server = std::thread::spawn(move || {
        let inc = requests
            .recv_timeout(deadline)
            .map_err(|e| format!("no REQ: {e}"))?;
        let conn = inc.conn;
        if !inc.accept(Qpn::from_bits(0x77), Psn::new(1), b"welcome".to_vec()) {
            return Err("accept refused".to_string());
        }
        // Wait (bounded) for the RTU.
        let end = Instant::now() + deadline;
        while a.state(conn) != rdma_cm::ConnState::Established {
            if Instant::now() > end {
                return Err(format!("passive side stuck in {:?}", a.state(conn)));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(conn)
    });
    let est =
        p.b.connect(
            p.a.gid(),
            sid,
            Qpn::from_bits(0x42),
            Psn::new(2),
            b"hello".to_vec(),
            deadline,
        )
        .map_err(|e| format!("connect: {e}"))?;
    let passive = server.join().map_err(|_| "server panicked".to_string())??;
    if est.remote_qpn != Qpn::from_bits(0x77) || &est.private_data[..7] != b"welcome" {
        return Err(format!("wrong REP: {est:?}"));
    }
    if !p.b.disconnect_wait(est.conn, deadline) {
        return Err("no DREP".into());
    }
    let end = Instant::now() + deadline;
    while p.a.state(passive) == rdma_cm::ConnState::Established {
        if Instant::now() > end {
            return Err("passive side never saw the DREQ".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

const T: Duration = Duration::from_millis(200);

/// A DMs agent on A with one IOC; B discovers it while a CM connection
/// comes and goes on the same QP1; an unserved class gets its status; a
/// request to nobody retries `3` times and times out.
pub fn dm_and_cm_share_qp1(p: &Pair) {
    let dm = DmService::start(&p.a).unwrap();
    assert!(matches!(DmService::start(&p.a), Err(CmError::Mad(_))));
    let ioc = dm.register_ioc(srp_ioc(0x0002_c903_00a0_0001, 6)).unwrap();
    assert_eq!(ioc.slot(), 1);

    // CM rounds on another thread while B runs discovery.
    let stop = Arc::new(AtomicBool::new(false));
    let (p2a, p2b, s2) = (p.a.clone(), p.b.clone(), stop.clone());
    let cm = std::thread::spawn(move || {
        let q = Pair {
            a: p2a,
            b: p2b,
            nobody: Gid([0; 16]),
        };
        // At least one round, however soon discovery ends (on a loaded
        // machine it can end before this thread first runs).
        let mut n = 0;
        while (n == 0 || !s2.load(Ordering::Relaxed)) && n < 20 {
            cm_round(&q, Duration::from_secs(5))?;
            n += 1;
        }
        Ok::<u32, String>(n)
    });
    for _ in 0..5 {
        let found = query_iocs(&p.b, p.a.gid(), T, 3).unwrap();
        assert_eq!(found.len(), 1);
        let (slot, got) = &found[0];
        assert_eq!(*slot, 1);
        assert_eq!(got.profile.guid, Guid(0x0002_c903_00a0_0001));
        assert_eq!(got.profile.io_class, IO_CLASS_SRP);
        assert_eq!(got.profile.service_entries, 6);
        assert_eq!(got.services, srp_ioc(0x0002_c903_00a0_0001, 6).services);
        assert_eq!(got.services[0].name_str(), "SRP.T10:0002C90300A00001");
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = cm.join().unwrap().unwrap();
    assert!(rounds >= 1, "a CM connection came and went");
    // One more after discovery, to be sure the CM is still served.
    cm_round(p, Duration::from_secs(5)).unwrap();

    // The controller leaves with its handle.
    drop(ioc);
    assert!(query_iocs(&p.b, p.a.gid(), T, 3).unwrap().is_empty());

    // A class nobody serves: "bad version" (unsupported class/version);
    // a served class and version with a method nobody serves: "method
    // unsupported"; DM's own Get of an unknown attribute:
    // "method/attribute unsupported".
    let perf = p.b.mad_agent(0x04, 1, &[]).unwrap();
    let mut get = rdma_access::dm::get_request(rdma_mad::dm::DmAttr::ClassPortInfo, 0);
    get[1] = 0x04;
    let before = p.a.gsi_stats().status_replies;
    let r = perf.request(p.a.gid(), get, T, 0).unwrap();
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0x0004));
    let cm_get = p.b.mad_agent(0x07, 2, &[]).unwrap();
    let mut get = rdma_access::dm::get_request(rdma_mad::dm::DmAttr::ClassPortInfo, 0);
    get[1] = 0x07;
    get[2] = 2;
    let r = cm_get.request(p.a.gid(), get, T, 0).unwrap();
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0x0008));
    assert_eq!(p.a.gsi_stats().status_replies - before, 2);
    let dmq = p.b.mad_agent(0x06, 1, &[]).unwrap();
    let r = dmq
        .request(
            p.a.gid(),
            rdma_access::dm::get_request(rdma_mad::dm::DmAttr::from(0x7777), 0),
            T,
            0,
        )
        .unwrap();
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0x000c));

    // A responder that takes the request and never answers: it sees the
    // first send and two retries, the requester a timeout after them.
    let mute = p.a.mad_agent(0x09, 1, &[0x01]).unwrap();
    let asker = p.b.mad_agent(0x09, 1, &[]).unwrap();
    let mut get = rdma_access::dm::get_request(rdma_mad::dm::DmAttr::ClassPortInfo, 0);
    get[1] = 0x09;
    let started = Instant::now();
    assert_eq!(
        asker.request(p.a.gid(), get, Duration::from_millis(40), 2),
        Err(CmError::TimedOut)
    );
    assert!(started.elapsed() >= Duration::from_millis(120));
    let mut copies = Vec::new();
    while let Some((_, m)) = mute.recv(Duration::from_millis(50)) {
        copies.push(u64::from_be_bytes(m[8..16].try_into().unwrap()));
        assert!(copies.len() <= 3, "more than 1 + 2 retries");
    }
    assert_eq!(copies.len(), 3, "first send and two retries");
    assert!(
        copies.iter().all(|&t| t == copies[0]),
        "one TID for the retries"
    );

    // Nobody there: three retries, then a timeout.
    let start = Instant::now();
    let before = p.b.gsi_stats();
    assert_eq!(
        query_iocs(&p.b, p.nobody, Duration::from_millis(50), 3),
        Err(CmError::TimedOut)
    );
    let after = p.b.gsi_stats();
    assert_eq!(after.retries - before.retries, 3);
    assert_eq!(after.timeouts - before.timeouts, 1);
    assert!(start.elapsed() >= Duration::from_millis(200));
    drop(dm);
}

/// With 5 % of the MADs each port receives dropped: discovery of two IOCs
/// and CM connections still complete, at the cost of retries.
pub fn dm_and_cm_under_loss(p: &Pair) {
    let dm = DmService::start(&p.a).unwrap();
    let _i1 = dm.register_ioc(srp_ioc(0x77, 6)).unwrap();
    let _i2 = dm.register_ioc(srp_ioc(0x78, 6)).unwrap();
    for _ in 0..10 {
        let found = query_iocs(&p.b, p.a.gid(), Duration::from_millis(30), 20).unwrap();
        assert_eq!(
            found
                .iter()
                .map(|(s, i)| (*s, i.profile.guid, i.services.len()))
                .collect::<Vec<_>>(),
            vec![(1, Guid(0x77), 6), (2, Guid(0x78), 6)]
        );
    }
    for _ in 0..5 {
        cm_round(p, Duration::from_secs(10)).unwrap();
    }
    let (sa, sb) = (p.a.gsi_stats(), p.b.gsi_stats());
    assert!(
        sb.retries > 0,
        "5 % loss over ~100 DM MADs cost retries: {sa:?} {sb:?}"
    );
}
