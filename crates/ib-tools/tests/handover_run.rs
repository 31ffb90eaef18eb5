//! Two `ibsm run` processes on 127.0.150.1 and .2, each listing the other
//! among its nodes, and an `ib` node on 127.0.150.3: the higher priority
//! is master, the other standby; after SIGKILL of the master the standby
//! takes over, keeps the node's LID, and the node's SM LID (and SA
//! address) move to it, which the node's access layer reports as a
//! `SmChange` PnP event. Both SMs hold the same M_Key (protect level 2),
//! so the node's port is protected throughout and the new master's SMPs
//! pass. Then the node's CapabilityMask changes and its trap 144 reaches
//! the new master, which represses it.

mod common;

use common::Ibsm;
use rdma_access::resource::{AccessLayer, PnpEvent};
use rdma_access::sma::state;
use rdma_types::{Gid, Guid, PortNum};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const MKEY: u64 = 0x0123_4567_89ab_cdef;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 150, last))
}

/// Polls `done` until it holds or `within` passes; panics with `what`
/// and the SMs' output then.
fn wait_for(within: Duration, what: &str, sms: &[&Ibsm], mut done: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !done() {
        if Instant::now() >= end {
            let outs: Vec<String> = sms.iter().map(|s| s.output()).collect();
            panic!("{what}: not within {within:?}\n{}", outs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sm_args<'a>(
    me: &'a str,
    peer: &'a str,
    node: &'a str,
    lid: &'a str,
    prio: &'a str,
) -> Vec<&'a str> {
    vec![
        "--addr",
        me,
        "--node",
        peer,
        "--node",
        node,
        "--lid",
        lid,
        "--priority",
        prio,
        "--sweep-interval-ms",
        "300",
        "--poll-interval-ms",
        "200",
        "--timeout-ms",
        "100",
        "--retries",
        "2",
        "--mkey",
        "0x0123456789abcdef",
        "--mkey-protect",
        "2",
    ]
}

#[test]
fn the_standby_ibsm_takes_over_a_killed_master() {
    let (a, b, n) = (ip(1).to_string(), ip(2).to_string(), ip(3).to_string());
    let mut sm_a = Ibsm::start("a", &sm_args(&a, &b, &n, "1", "5"));
    let sm_b = Ibsm::start("b", &sm_args(&b, &a, &n, "2", "1"));
    // The election, and the master holding the standby's port at LID 2
    // (so the node, which comes after, gets another).
    wait_for(T, "election", &[&sm_a, &sm_b], || {
        let (oa, ob) = (sm_a.output(), sm_b.output());
        oa.contains("SM state MASTER")
            && oa.contains("ACTIVE, LID 2")
            && ob.contains("SM state STANDBY")
            && !ob.contains("SM state MASTER")
    });

    let guid = Guid(0x1500_0003);
    let p = SoftRoce::new(vec![SoftCa { guid, ip: ip(3) }], ROCE_PORT);
    let node = common::ib_node(p.clone(), guid, "node-3", false, 3 << 16).unwrap();
    let events: Arc<Mutex<Vec<PnpEvent>>> = Arc::default();
    let al = AccessLayer::new(p.clone());
    let ev = events.clone();
    al.register_pnp(move |e| ev.lock().unwrap().push(e))
        .unwrap();
    wait_for(T, "node managed by A", &[&sm_a, &sm_b], || {
        node.sma().port_state() == state::ACTIVE && node.sma().sm_lid() == 1
    });
    let lid = node.sma().lid();
    assert!(lid > 2, "LID {lid} collides with an SM's");
    assert_eq!(node.sma().mkey(), (MKEY, 2), "the port is protected");
    assert_eq!(node.sma().sm_gid(), Some(Gid::from_ip(ip(1))));
    let sm_change = PnpEvent::SmChange(guid, PortNum(1));
    let changes = || {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| **e == sm_change)
            .count()
    };
    let before = changes();

    // SIGKILL: no goodbye. The standby notices and takes over.
    sm_a.kill();
    let t0 = Instant::now();
    wait_for(T, "takeover", &[&sm_b], || {
        node.sma().sm_lid() == 2 && changes() > before
    });
    let took = t0.elapsed();
    println!("takeover: node's SM LID moved to the standby in {took:?}");
    let ob = sm_b.output();
    assert!(ob.contains("stopped answering: taking over"), "{ob}");
    assert!(ob.contains("SM state MASTER"), "{ob}");
    assert_eq!(node.sma().lid(), lid, "the new master kept the LID");
    assert_eq!(node.sma().port_state(), state::ACTIVE);
    assert_eq!(node.sma().sm_gid(), Some(Gid::from_ip(ip(2))));
    assert_eq!(node.sma().mkey(), (MKEY, 2));
    assert_eq!(node.sma().mkey_violations(), 0, "both SMs had the key");
    assert_eq!(node.port().unwrap().sm_lid.0, 2, "the provider's port too");
    // The takeover and what it kept are the verdict; its time (a poll of
    // 200 ms, 3 tries of 100 ms, then a sweep) is printed above, bounded
    // only by the wait's T.

    // A DM agent registers on the node: its SMA's trap 144 reaches the new
    // master, which represses it.
    node.sma()
        .set_capability_mask(rdma_access::sma::ca_capability_mask(true));
    assert!(node.sma().trap_pending());
    wait_for(T, "trap 144 repressed", &[&sm_b], || {
        !node.sma().trap_pending() && sm_b.output().contains("(trap 144)")
    });
    assert!(node.sma().traps_sent() >= 1);
}
