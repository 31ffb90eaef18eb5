//! The verbs conformance suite against the loopback provider.

use rdma_types::{Guid, Lid, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

struct Loop {
    fabric: Arc<Fabric>,
}

impl Loop {
    fn new() -> Loop {
        let fabric = Fabric::new();
        fabric.add_ca(CaConfig::simple(0x1111, 1)).unwrap();
        fabric.add_ca(CaConfig::simple(0x2222, 2)).unwrap();
        Loop { fabric }
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
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

verbs::conformance_tests!(Loop::new());
