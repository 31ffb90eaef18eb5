//! The conformance suite's `pkey_change` case on soft RoCE `ib` ports,
//! whose P_Key table an SM sets (a `roce` port's table is fixed, so
//! `conformance_softroce` skips the case). Addresses 127.0.157.1-2.

use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use verbs::conformance::{cases, Feature, Fixture, Outcome};
use verbs::{IgnoreEvents, Provider, Result};

struct Ib(Arc<SoftRoce>);

impl Fixture for Ib {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0x1111), Guid(0x2222))
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.0.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.0.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.0.remove_ca(guid)
    }
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.0.set_pkeys(guid, pkeys)
    }
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Sqe]
    }
}

#[test]
fn pkey_change_on_ib_ports() {
    let ip = |k| IpAddr::V4(Ipv4Addr::new(127, 0, 157, k));
    let p = SoftRoce::new(
        vec![
            SoftCa {
                guid: Guid(0x1111),
                ip: ip(1),
            },
            SoftCa {
                guid: Guid(0x2222),
                ip: ip(2),
            },
        ],
        ROCE_PORT,
    );
    for g in [Guid(0x1111), Guid(0x2222)] {
        p.set_personality(g, Personality::Ib).unwrap();
    }
    let f = Ib(p.clone());
    assert_eq!(cases::pkey_change(&f), Outcome::Passed);
    // The case ran for real: the table it set is what the port reports.
    let ca = p.open_ca(Guid(0x2222), 0, Arc::new(IgnoreEvents)).unwrap();
    let pkeys = p.query_port(ca, PortNum(1)).unwrap().pkeys;
    assert!(pkeys.contains(&Pkey(0x8010)), "{pkeys:?}");
}
