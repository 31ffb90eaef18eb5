//! Several providers as one (`rdma_access::multi::Providers`): the soft
//! RoCE NIC beside the loopback fabric in one set and one access layer:
//! both carry traffic at once, objects of one never mix with the other's,
//! and the access layer's counts cover both. (The conformance suite
//! through a set is in conformance_tracked.rs.)

use rdma_access::multi::Providers;
use rdma_access::resource::AccessLayer;
use rdma_types::{Guid, Lid, PortNum, QpType};
use rnic::loopback::{CaConfig, Fabric};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use verbs::conformance::{connect, Feature, Fixture, Node, Through};
use verbs::{Provider, QpInit, RecvWr, Result, SendOpcode, SendWr, VerbsError};

/// The loopback fabric and a soft RoCE pair (real UDP on loopback
/// addresses) in one set.
struct Mixed {
    fabric: Arc<Fabric>,
    soft: (Guid, Guid),
    set: Arc<Providers>,
}

/// `net`: the third octet of the soft pair's addresses, one per test (tests
/// run at once).
fn mixed(net: u8) -> Mixed {
    let fabric = Fabric::new();
    fabric.add_ca(CaConfig::dual_port(0x1111, 1)).unwrap();
    fabric.add_ca(CaConfig::dual_port(0x2222, 2)).unwrap();
    let ip = |k| IpAddr::V4(Ipv4Addr::new(127, 78, net, k));
    let cas = SoftCa::at_each(&[ip(1), ip(2)]);
    let soft = (cas[0].guid, cas[1].guid);
    let nic = SoftRoce::new(cas, ROCE_PORT);
    let set = Providers::new(vec![fabric.clone(), nic]).unwrap();
    Mixed {
        fabric,
        soft,
        set: Arc::new(set),
    }
}

/// A fixture over `m`'s set for the pair `guids` (what `Node::open`
/// needs).
struct Pair<'a>(&'a Mixed, (Guid, Guid));

impl Fixture for Pair<'_> {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.set.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.1
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.0.fabric.set_port_active(guid, PortNum(1), active)
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported("set_lid"))
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.0.fabric.remove_ca(guid)
    }
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

/// An RC SEND from `a` to `b`, checked at both ends.
fn send(a: &Node, b: &Node, text: &[u8]) {
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(a, qa, b, qb, QpType::Rc, 7);
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 5,
            sges: verbs::sges![b.sge(0, 256)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, text);
    a.p.post_send(
        qa,
        &[SendWr::new(
            6,
            SendOpcode::Send,
            vec![a.sge(0, text.len() as u32)],
        )],
    )
    .unwrap();
    assert_eq!(a.wc().wr_id, 6);
    let w = b.wc();
    assert_eq!((w.wr_id, w.byte_len), (5, text.len() as u32));
    assert_eq!(b.buf.to_vec(0, text.len()), text);
}

#[test]
fn the_soft_nic_and_the_loopback_fabric_carry_traffic_side_by_side() {
    let m = mixed(1);
    let cas = m.set.list_cas();
    for g in [Guid(0x1111), Guid(0x2222), m.soft.0, m.soft.1] {
        assert!(cas.contains(&g), "{g:?} not in {cas:?}");
    }
    assert_eq!(m.set.provider_of(m.soft.0).unwrap().name(), "softroce");
    assert_eq!(m.set.provider_of(Guid(0x1111)).unwrap().name(), "loopback");
    let lo = Pair(&m, (Guid(0x1111), Guid(0x2222)));
    let so = Pair(&m, m.soft);
    let (la, lb) = (
        Node::open(&lo, Guid(0x1111), 16),
        Node::open(&lo, Guid(0x2222), 16),
    );
    let (sa, sb) = (Node::open(&so, m.soft.0, 16), Node::open(&so, m.soft.1, 16));
    send(&la, &lb, b"through the loopback fabric");
    send(&sa, &sb, b"through soft RoCE, UDP on 127.78.1.x");

    // A CQ of the loopback fabric named for a soft RoCE QP, or the other
    // way round, is another NIC's object: refused, nothing made.
    let cross = QpInit::rc(la.cq, 4, 4);
    assert_eq!(
        sa.p.create_qp(sa.pd, &cross, 9).unwrap_err(),
        VerbsError::InvalidHandle
    );
    let cross = QpInit::rc(sa.cq, 4, 4);
    assert_eq!(
        la.p.create_qp(la.pd, &cross, 9).unwrap_err(),
        VerbsError::InvalidHandle
    );
    // A handle whose tag names no provider of the set.
    let stray = verbs::QpHandle(verbs::Handle {
        index: 5 << 24,
        generation: 0,
    });
    assert_eq!(m.set.qp_num(stray).unwrap_err(), VerbsError::InvalidHandle);
    // A GUID nobody has.
    assert_eq!(
        m.set
            .open_ca(Guid(0xdead), 0, Arc::new(verbs::IgnoreEvents))
            .unwrap_err(),
        VerbsError::NoSuchCa
    );
}

/// One access layer over the set: a client's objects on both NICs are
/// counted together and all go when the client goes.
#[test]
fn one_access_layer_holds_objects_of_both_providers() {
    let m = mixed(2);
    let access = AccessLayer::new(m.set.clone());
    let p = access.client("both").into_provider();
    let lo = Pair(&m, (Guid(0x1111), Guid(0x2222)));
    let so = Pair(&m, m.soft);
    {
        // Opened through the client's provider, as a consumer would.
        let through = |inner| Through {
            inner,
            provider: p.clone(),
        };
        let (tl, ts) = (through(lo), through(so));
        let a = Node::open(&tl, Guid(0x1111), 16);
        let b = Node::open(&ts, m.soft.0, 16);
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
        assert!(access.live_total() >= 10, "{}", access.live_total());
        assert_ne!(p.qp_num(qa).unwrap(), rdma_types::Qpn::SMI);
        assert_ne!(p.qp_num(qb).unwrap(), rdma_types::Qpn::SMI);
    }
    drop(p);
    assert_eq!(access.live_total(), 0, "objects left after the client went");
}
