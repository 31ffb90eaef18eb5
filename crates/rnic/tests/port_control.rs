//! Port control through the verbs (`Provider::modify_port`,
//! `Provider::take_pkey_violations`) on both providers: what an SMA sets
//! reaches `query_port` with its event, what a provider cannot set is
//! refused whole with `NotSupported`.
//!
//! Soft RoCE CAs on 127.0.179.1 and .2, RoCEv2 on UDP port 47179.

use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use rnic::softroce::{Personality, SoftCa, SoftRoce};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use verbs::conformance::{Ev, Recorder};
use verbs::{AsyncEventKind, PortModify, PortState, Provider, VerbsError};

/// The async events `rec` got since the last call.
struct Events {
    rec: Arc<Recorder>,
    seen: usize,
}

impl Events {
    fn take(&mut self) -> Vec<AsyncEventKind> {
        let all = self.rec.events();
        let new = all[self.seen..]
            .iter()
            .filter_map(|e| match e {
                Ev::Async(a) => Some(a.kind),
                _ => None,
            })
            .collect();
        self.seen = all.len();
        new
    }
}

/// What both providers do alike with an SMA's Sets on port 1 of `guid`.
fn sets_reach_the_port(p: Arc<dyn Provider>, guid: Guid) {
    let rec = Arc::new(Recorder::default());
    let ca = p.open_ca(guid, 0, rec.clone()).unwrap();
    let mut ev = Events { rec, seen: 0 };
    let one = PortNum(1);
    p.modify_port(ca, one, &PortModify::new().lid(Lid(7)).sm_lid(Lid(3)))
        .unwrap();
    let a = p.query_port(ca, one).unwrap();
    assert_eq!((a.lid, a.sm_lid), (Lid(7), Lid(3)));
    assert_eq!(
        ev.take(),
        [AsyncEventKind::LidChange, AsyncEventKind::SmChange]
    );
    // The same master again: no SmChange.
    p.modify_port(ca, one, &PortModify::new().sm_lid(Lid(3)))
        .unwrap();
    assert_eq!(ev.take(), []);
    let table = vec![Pkey::DEFAULT, Pkey(0), Pkey(0x8010)];
    p.modify_port(ca, one, &PortModify::new().pkeys(table))
        .unwrap();
    assert_eq!(
        p.query_port(ca, one).unwrap().pkeys,
        [Pkey::DEFAULT, Pkey(0x8010)]
    );
    assert_eq!(ev.take(), [AsyncEventKind::PkeyChange]);
    p.modify_port(ca, one, &PortModify::new().state(PortState::Active))
        .unwrap();
    assert_eq!(p.query_port(ca, one).unwrap().state, PortState::Active);
    p.modify_port(ca, one, &PortModify::new().state(PortState::Init))
        .unwrap();
    assert_eq!(p.query_port(ca, one).unwrap().state, PortState::Init);
    assert_eq!(
        ev.take(),
        [AsyncEventKind::PortActive, AsyncEventKind::PortDown]
    );
    // What neither can set is refused whole: the LID stays.
    let lmc = PortModify::new().lid(Lid(9)).lmc(1);
    assert!(matches!(
        p.modify_port(ca, one, &lmc),
        Err(VerbsError::NotSupported(_))
    ));
    assert!(matches!(
        p.modify_port(ca, one, &PortModify::new().alias_guids(vec![Guid(5)])),
        Err(VerbsError::NotSupported(_))
    ));
    assert!(matches!(
        p.modify_port(ca, one, &PortModify::new().lmc(8)),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert_eq!(p.query_port(ca, one).unwrap().lid, Lid(7));
    assert!(p
        .modify_port(ca, PortNum(2), &PortModify::new().lid(Lid(1)))
        .is_err());
    assert_eq!(ev.take(), []);
    p.close_ca(ca).unwrap();
}

#[test]
fn loopback_ports_take_an_smas_sets() {
    let f = Fabric::new();
    let mut cfg = CaConfig::simple(0x51, 1);
    cfg.ports[0].active = false;
    f.add_ca(cfg).unwrap();
    sets_reach_the_port(f.clone(), Guid(0x51));
    // No P_Key violations are counted on the loopback fabric.
    let ca = f
        .open_ca(Guid(0x51), 0, Arc::new(verbs::IgnoreEvents))
        .unwrap();
    assert!(matches!(
        f.take_pkey_violations(ca, PortNum(1)),
        Err(VerbsError::NotSupported(_))
    ));
}

#[test]
fn soft_roce_ib_ports_take_an_smas_sets_and_roce_ports_refuse_them() {
    let ip = |k: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 179, k));
    let (ib, roce) = (Guid(0x1791), Guid(0x1792));
    let p = SoftRoce::new(
        vec![
            SoftCa {
                guid: ib,
                ip: ip(1),
            },
            SoftCa {
                guid: roce,
                ip: ip(2),
            },
        ],
        47179,
    );
    p.set_personality(ib, Personality::Ib).unwrap();
    sets_reach_the_port(p.clone(), ib);
    let ca = p.open_ca(ib, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    assert_eq!(
        Provider::take_pkey_violations(&*p, ca, PortNum(1)),
        Ok(None)
    );
    // A roce port has no SM: its state and table are the link's and the
    // default partition's, its LID is free to name.
    let rc = p.open_ca(roce, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    for m in [
        PortModify::new().state(PortState::Init),
        PortModify::new().pkeys(vec![Pkey(0x8001)]),
    ] {
        assert!(matches!(
            p.modify_port(rc, PortNum(1), &m),
            Err(VerbsError::InvalidArgument(_))
        ));
    }
    let a = p.query_port(rc, PortNum(1)).unwrap();
    assert_eq!((a.state, a.pkeys), (PortState::Active, vec![Pkey::DEFAULT]));
    p.modify_port(rc, PortNum(1), &PortModify::new().lid(Lid(4)))
        .unwrap();
    assert_eq!(p.query_port(rc, PortNum(1)).unwrap().lid, Lid(4));
}
