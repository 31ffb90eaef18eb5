//! The verbs conformance suite through the access layer's tracking proxy
//! (`Client::into_provider`) over the loopback provider: a consumer written
//! against the verbs interface sees the provider's behaviour unchanged,
//! refusals included, while every object it makes is in the client's tree.
//! And through a set of providers (`rdma_access::multi::Providers`) whose
//! first is a decoy fabric, so every handle the suite uses carries a tag.

use rdma_access::multi::Providers;
use rdma_access::resource::{AccessLayer, Kind, TrackedProvider};
use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

/// The loopback fabric's two dual-port CAs (port 2 carries the
/// alternate path of the APM cases), reached through `provider`.
struct Tracked {
    fabric: Arc<Fabric>,
    al: AccessLayer,
    proxy: Arc<TrackedProvider>,
    provider: Arc<dyn Provider>,
}

impl Tracked {
    fn fabric() -> Arc<Fabric> {
        let fabric = Fabric::new();
        fabric.add_ca(CaConfig::dual_port(0x1111, 1)).unwrap();
        fabric.add_ca(CaConfig::dual_port(0x2222, 2)).unwrap();
        fabric
    }

    /// Through the tracking proxy.
    fn new() -> Tracked {
        let fabric = Self::fabric();
        let al = AccessLayer::new(fabric.clone());
        let proxy = al.client("conformance").into_provider();
        Tracked {
            provider: proxy.clone(),
            fabric,
            al,
            proxy,
        }
    }

    /// Through a set whose first provider is a decoy fabric (one CA).
    fn tagged() -> Tracked {
        let mut t = Tracked::new();
        let decoy = Fabric::new();
        decoy.add_ca(CaConfig::dual_port(0x9999, 9)).unwrap();
        t.provider = Arc::new(Providers::new(vec![decoy, t.fabric.clone()]).unwrap());
        t
    }
}

impl Fixture for Tracked {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
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
        Vec::new()
    }
}

verbs::conformance_tests!(Tracked::new());

mod through_a_set {
    use super::*;
    verbs::conformance_tests!(Tracked::tagged());
}

/// After a case, whatever it left open is in the tree, and closing the
/// client takes it all: the provider's own objects go too.
#[test]
fn what_a_case_leaves_the_client_takes_away() {
    for case in [
        verbs::conformance::cases::rc_send,
        verbs::conformance::cases::rc_read,
        verbs::conformance::cases::mw_type1,
        verbs::conformance::cases::srq_limit,
    ] {
        let f = Tracked::new();
        let _ = case(&f);
        let left = f.al.live_total();
        f.proxy.client().close();
        assert_eq!(f.al.live_total(), 0, "{left} objects were left");
        for kind in [Kind::Qp, Kind::Cq, Kind::Mr, Kind::Pd, Kind::Ca] {
            assert_eq!(f.proxy.client().live(kind), 0, "{kind:?}");
        }
        // The provider agrees: a new client can open both CAs afresh and
        // nothing of the old one answers.
        let again = f.al.client("again");
        let (_, ca) = again
            .open_ca(Guid(0x1111), 0, Arc::new(verbs::IgnoreEvents))
            .unwrap();
        assert!(f.fabric.query_ca(ca).is_ok());
    }
}
