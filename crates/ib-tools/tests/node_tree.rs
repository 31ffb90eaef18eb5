//! An `ib` node's port (QP0 for its SMA, QP1 for its MADs, made by the
//! node over the bare soft RoCE provider at 127.0.171.x) in an access
//! layer client's resource tree: once its CM agent is tracked, the
//! special QPs, their CQ, PD, buffers and CA open count in the client's
//! leak counters and leave with the client, or with the CA.

mod common;

use rdma_access::resource::{AccessLayer, Kind};
use rdma_access::IbNode;
use rdma_access::{CmAgent, Removed};
use rdma_types::Guid;
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn node(last: u8) -> (Arc<SoftRoce>, Guid, IbNode) {
    let guid = Guid(0x1710_0000 | u64::from(last));
    let p = SoftRoce::new(
        vec![SoftCa {
            guid,
            ip: format!("127.0.171.{last}").parse().unwrap(),
        }],
        ROCE_PORT,
    );
    let n = common::ib_node(p.clone(), guid, "tree", false, u32::from(last) << 16).unwrap();
    (p, guid, n)
}

/// Waits (at most 10 s) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn an_ib_nodes_special_qps_count_and_go_with_the_client() {
    let (p, guid, n) = node(20);
    let al = AccessLayer::new(p.clone());
    let c = al.client("cm");
    assert!(n.agent().has_smi(), "an ib port has a QP0");
    n.agent().track_in(&c).unwrap();
    for (kind, want) in [
        (Kind::Qp, 2), // QP0 and QP1
        (Kind::Mr, 3), // their receive rings and the send ring
        (Kind::Cq, 1),
        (Kind::Pd, 1),
        (Kind::Ca, 1),
        (Kind::MadAgent, 1), // the agent's own CM registration
    ] {
        assert_eq!(c.live(kind), want, "{kind:?}");
    }
    // While the node's port lives, its special QPs are taken.
    assert!(CmAgent::start(p.clone(), guid, 0x77 << 16).is_err());
    c.close();
    assert_eq!(al.live_total(), 0, "nothing leaks");
    // The client's close gave them back to the provider: a new port can
    // make its QP0 and QP1 on the same CA.
    let again = CmAgent::start(p.clone(), guid, 0x78 << 16).expect("QP0/QP1 were released");
    assert!(again.has_smi());
    drop(again);
    // The node's own drop does not give them back a second time.
    drop(n);
    assert_eq!(al.live_total(), 0);
}

#[test]
fn removing_an_ib_nodes_ca_empties_its_tree() {
    let (p, guid, n) = node(21);
    let al = AccessLayer::new(p.clone());
    let c = al.client("cm");
    let agent = n.agent().clone();
    agent.track_in(&c).unwrap();
    let told = Arc::new(Mutex::new(Vec::new()));
    let t = told.clone();
    agent.on_device_removal(move |r| t.lock().unwrap().push(r));
    let listen = agent.listen(0x1234);
    let mad = agent.mad_agent(0x04, 1, &[]).unwrap();
    assert_eq!(c.live(Kind::CmId), 1);
    assert_eq!(c.live(Kind::MadAgent), 2);
    assert_eq!(c.live(Kind::Qp), 2);
    p.remove_ca(guid).unwrap();
    eventually("the removed CA's tree is still there", || {
        c.live_total() == 0
    });
    assert_eq!(*told.lock().unwrap(), vec![Removed::Listen(0x1234)]);
    assert!(listen.recv_timeout(Duration::from_secs(1)).is_err());
    assert!(agent.is_removed());
    drop((mad, agent, n));
    assert_eq!(al.live_total(), 0);
}
