//! The verbs conformance suite against the soft iWARP provider: two NICs
//! on their own loopback addresses (127.94.x.y), every byte through real
//! kernel TCP streams.

use iwarp_tcp::{IwarpCa, SoftIwarp};
use rdma_types::{Guid, Lid};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result, VerbsError};

/// Each fixture gets its own pair of addresses, so cases run in parallel.
static NEXT: AtomicU32 = AtomicU32::new(0);

struct Iwarp {
    p: Arc<SoftIwarp>,
    guids: (Guid, Guid),
}

fn fixture() -> Iwarp {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let ip = |k: u32| {
        IpAddr::V4(Ipv4Addr::new(
            127,
            94,
            (n / 100) as u8,
            (2 * (n % 100) + k) as u8 + 1,
        ))
    };
    let (a, b) = (IwarpCa::at(ip(0)), IwarpCa::at(ip(1)));
    let guids = (a.guid, b.guid);
    Iwarp {
        p: SoftIwarp::new(vec![a, b]),
        guids,
    }
}

impl Fixture for Iwarp {
    fn provider(&self) -> Arc<dyn Provider> {
        self.p.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported("port control of an iWARP NIC"))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported("LIDs on iWARP"))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(VerbsError::NotSupported("CA removal of an iWARP NIC"))
    }
    fn lacks(&self) -> Vec<Feature> {
        vec![
            Feature::Uc,
            Feature::Ud,
            Feature::SpecialQp,
            Feature::Srq,
            Feature::Mw,
            Feature::Atomics,
            Feature::PortControl,
            Feature::Apm,
            Feature::Immediate,
            Feature::RemoteErrorCompletion,
        ]
    }
}

verbs::conformance_tests!(fixture());
