//! The verbs conformance suite over the NIC daemon's client provider held
//! in a set of providers (`rdma_access::multi::Providers`) beside the
//! loopback fabric, as a tool holding the daemon's CAs and another
//! provider's at once would: every handle the daemon gives out must fit
//! under the set's tag. The fixture's CAs are the daemon's; the fabric's
//! CA is there to be skipped over.

mod common;

use common::Two;
use rdma_access::multi::Providers;
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::Through;

/// A daemon's two CAs and the loopback fabric's one, in one set (the
/// fabric first, so the daemon's handles carry a tag other than 0).
fn in_set(third: u8) -> Through<Two> {
    let two = Two::new(third);
    let fabric = Fabric::new();
    fabric.add_ca(CaConfig::dual_port(0x3333, 1)).unwrap();
    let set = Providers::new(vec![fabric, two.client.clone()]).unwrap();
    Through {
        inner: two,
        provider: Arc::new(set),
    }
}

verbs::conformance_tests!(in_set(90));
