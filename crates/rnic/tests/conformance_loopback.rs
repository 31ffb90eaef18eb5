//! The verbs conformance suite against the loopback provider.

use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

struct Loop {
    fabric: Arc<Fabric>,
    lacks: Vec<Feature>,
}

impl Loop {
    fn new() -> Loop {
        Loop::without(&[])
    }

    fn without(lacks: &[Feature]) -> Loop {
        let fabric = Fabric::without(lacks);
        fabric.add_ca(CaConfig::simple(0x1111, 1)).unwrap();
        fabric.add_ca(CaConfig::simple(0x2222, 2)).unwrap();
        Loop {
            fabric,
            lacks: lacks.to_vec(),
        }
    }
}

impl Fixture for Loop {
    fn provider(&self) -> Arc<dyn Provider> {
        self.fabric.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0x1111), Guid(0x2222))
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.fabric.set_port_active(guid, PortNum(1), active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.fabric.set_lid(guid, PortNum(1), lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.fabric.remove_ca(guid)
    }
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.fabric.set_pkeys(guid, PortNum(1), pkeys.to_vec())
    }
    fn lacks(&self) -> Vec<Feature> {
        self.lacks.clone()
    }
}

verbs::conformance_tests!(Loop::new());

/// The same suite against a loopback CA without memory windows, SRQs and
/// atomics: those cases must print SKIPPED and pass only because the
/// provider answers `NotSupported`.
mod limited {
    use super::*;
    verbs::conformance_tests!(Loop::without(&[
        Feature::Mw,
        Feature::Srq,
        Feature::Atomics
    ]));
}
