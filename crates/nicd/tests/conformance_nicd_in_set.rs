//! The verbs conformance suite over the NIC daemon's client provider held
//! in a set of providers (`rdma_access::multi::Providers`) beside the
//! loopback fabric, as a tool holding the daemon's CAs and another
//! provider's at once would: every handle the daemon gives out must fit
//! under the set's tag. The fixture's CAs are the daemon's; the fabric's
//! CA is there to be skipped over.

mod common;

use common::Two;
use rdma_access::multi::Providers;
use rdma_types::{Guid, Lid};
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

/// A daemon's two CAs and the loopback fabric's one, in one set (the
/// fabric first, so the daemon's handles carry a tag other than 0).
struct InSet {
    two: Two,
    set: Arc<Providers>,
}

impl InSet {
    fn new(third: u8) -> InSet {
        let two = Two::new(third);
        let fabric = Fabric::new();
        fabric.add_ca(CaConfig::dual_port(0x3333, 1)).unwrap();
        let set = Providers::new(vec![fabric, two.client.clone()]).unwrap();
        InSet {
            two,
            set: Arc::new(set),
        }
    }
}

impl Fixture for InSet {
    fn provider(&self) -> Arc<dyn Provider> {
        self.set.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.two.guids()
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.two.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.two.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.two.remove_ca(guid)
    }
    fn lacks(&self) -> Vec<Feature> {
        self.two.lacks()
    }
}

verbs::conformance_tests!(InSet::new(90));
