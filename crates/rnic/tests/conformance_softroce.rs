//! The verbs conformance suite against the soft RoCE provider: two CAs on
//! their own loopback addresses, every packet through real UDP sockets.

use rdma_types::{Guid, Lid, Pkey};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

struct Soft {
    provider: Arc<SoftRoce>,
}

/// Each fixture gets its own pair of addresses, so cases can run in parallel.
static NEXT: AtomicU32 = AtomicU32::new(0);

impl Soft {
    fn new() -> Soft {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ip = |k: u32| {
            IpAddr::V4(Ipv4Addr::new(
                127,
                77,
                (n / 100) as u8,
                (2 * (n % 100) + k) as u8 + 1,
            ))
        };
        Soft {
            provider: SoftRoce::new(
                vec![
                    SoftCa {
                        guid: Guid(0x1111),
                        ip: ip(0),
                    },
                    SoftCa {
                        guid: Guid(0x2222),
                        ip: ip(1),
                    },
                ],
                ROCE_PORT,
            ),
        }
    }
}

impl Fixture for Soft {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0x1111), Guid(0x2222))
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.provider.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.provider.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.provider.remove_ca(guid)
    }
    /// A `roce` port's P_Key table is fixed (no SM): the provider refuses,
    /// so this fixture answers NotSupported and `pkey_change` says
    /// SKIPPED here; `softroce_pkeys.rs` runs it on `ib` ports.
    fn set_pkeys(&self, _: Guid, _: &[Pkey]) -> Result<()> {
        Err(verbs::VerbsError::NotSupported("a roce port's P_Key table"))
    }
    /// The engine takes a UC/UD QP with a send error to ERR; SQE would
    /// need it to stop the send queue only (`roce`, not this provider).
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Sqe]
    }
}

verbs::conformance_tests!(Soft::new());
