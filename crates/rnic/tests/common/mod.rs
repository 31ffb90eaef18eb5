//! The two-CA soft RoCE fixture the provider's tests share.

use rdma_types::{Guid, Lid, Pkey};
use rnic::softroce::{SoftCa, SoftRoce};
use std::net::IpAddr;
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

pub struct Soft {
    pub provider: Arc<SoftRoce>,
}

impl Soft {
    /// CAs 0x1111 on `a` and 0x2222 on `b`, RoCEv2 on UDP `port`.
    pub fn pair(a: IpAddr, b: IpAddr, port: u16) -> Soft {
        Soft {
            provider: SoftRoce::new(
                vec![
                    SoftCa {
                        guid: Guid(0x1111),
                        ip: a,
                    },
                    SoftCa {
                        guid: Guid(0x2222),
                        ip: b,
                    },
                ],
                port,
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
    /// so this fixture answers NotSupported and declares PkeyControl
    /// missing; `softroce_pkeys.rs` runs `pkey_change` on `ib` ports.
    fn set_pkeys(&self, _: Guid, _: &[Pkey]) -> Result<()> {
        Err(verbs::VerbsError::NotSupported("a roce port's P_Key table"))
    }
    /// No alternate paths: the provider refuses them (see its module doc).
    /// No P_Key tables set from here (see `set_pkeys`).
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Apm, Feature::PkeyControl]
    }
}
