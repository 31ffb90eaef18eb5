//! Logins from a port of an rdma-core device (`--device NAME[:PORT]` of
//! `srp` and `srpd`): a real RDMA NIC, or Linux's rxe or siw, reached
//! through libibverbs (`rdmacore`), instead of our own soft RoCE NIC.
//!
//! On such a device the kernel owns QP1, so logins go by the kernel's RDMA
//! CM ([`rdmacore::RdmaCm`]) from one of the device's IP addresses; the
//! sessions' verbs objects are made on the device through a client of an
//! access layer of their own, which counts them.
//!
//! What it refuses: IB CM logins (`service_id=`, `dgid=` with SA paths)
//! need the kernel's `ib_cm` and SA through `ib_umad`, which are not served
//! yet ([`DeviceError::IbCm`] says so and names the fix).
//!
//! The device may go away under the logins (`rdma link delete rxe0`, a
//! hot unplug) and come back: the kernel's RDMA CM says so, the provider
//! tells the sessions (their LUNs wait or fail as the remote port timers
//! say, their verbs objects are released so the kernel can let the device
//! go), and [`DeviceCa::comeback`] is what srpd's watcher
//! (`crate::rejoin`) starts the RDMA CM on it with again once it is back
//! under the same GUID, so the logins reconnect.
//!
//! libibverbs is loaded at run time: without rdma-core, [`DeviceCa::open`]
//! fails with one line naming the package to install
//! ([`rdmacore::LoadError`]).

use crate::rejoin::{Comeback, Slot};
use rdma_types::{Guid, PortNum};
use rdmacore::{DeviceSpec, RdmaCm, RdmaCore};
use srp_initiator::session::Connector;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Why a device port cannot be used for a login; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// libibverbs is missing or unusable (one line naming the package).
    #[error(transparent)]
    Load(#[from] rdmacore::LoadError),
    /// No such device, or no RDMA in this kernel.
    #[error(transparent)]
    Lookup(#[from] rdmacore::DeviceLookupError),
    /// The kernel's RDMA CM could not start on the device.
    #[error("RDMA CM on {device}: {source}")]
    Cm {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: rdmacore::CmStartError,
    },
    /// A source address (`--ip`, a login's `src=`) the device does not
    /// have.
    #[error("{ip} is not an address of {device} (it has {}): give one of them, or none for {}",
        list(.has), .has.first().map_or("the first".to_string(), |a| a.to_string()))]
    NotItsAddress {
        /// The address asked for.
        ip: IpAddr,
        /// The device.
        device: String,
        /// The addresses it has.
        has: Vec<IpAddr>,
    },
    /// A login by IB CM (`service_id=`, or `dgid=` with SA paths), which
    /// the device cannot make yet.
    #[error(
        "{what}: IB CM logins are not served on rdma-core device {device} yet (the kernel owns \
         its QP1, and logins reach the kernel's CM only as RDMA CM); log in by RDMA CM with \
         dest=ip:port (the target's address and its RDMA CM port, 5555 for srptd){soft}"
    )]
    IbCm {
        /// The login's keys that ask for IB CM.
        what: String,
        /// The device.
        device: String,
        /// How to get a CA that can, where there is one.
        soft: &'static str,
    },
}

fn list(a: &[IpAddr]) -> String {
    if a.is_empty() {
        return "none".into();
    }
    a.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A port of an rdma-core device opened for SRP logins: the device's
/// provider behind an access layer, and the kernel's RDMA CM on its CA.
pub struct DeviceCa {
    spec: DeviceSpec,
    guid: Guid,
    core: Arc<RdmaCore>,
    /// The RDMA CM now (a new one after the device's return).
    cm: Arc<Slot<RdmaCm>>,
    access: rdma_access::resource::AccessLayer,
    sessions: Arc<dyn verbs::Provider>,
}

impl DeviceCa {
    /// Opens device port `spec`, with libibverbs found the usual way.
    ///
    /// # Errors
    /// libibverbs missing, no such device (or no RDMA in the kernel), or
    /// the kernel's RDMA CM that cannot start there (`rdma_ucm` not
    /// loaded, no IP address on the device).
    pub fn open(spec: &DeviceSpec) -> Result<DeviceCa, DeviceError> {
        DeviceCa::open_with(spec, rdmacore::Options::default())
    }

    /// As [`DeviceCa::open`], libibverbs loaded as `opts` say.
    ///
    /// # Errors
    /// As [`DeviceCa::open`].
    pub fn open_with(spec: &DeviceSpec, opts: rdmacore::Options) -> Result<DeviceCa, DeviceError> {
        let core = rdmacore::RdmaCore::with_options(opts)?;
        let guid = core.find_port(spec)?;
        let cm = RdmaCm::start(&core, guid).map_err(|source| DeviceError::Cm {
            device: spec.name.clone(),
            source,
        })?;
        let provider: Arc<dyn verbs::Provider> = core.clone();
        let access = rdma_access::resource::AccessLayer::new(provider);
        let sessions = access.client("srp initiator").into_provider();
        Ok(DeviceCa {
            spec: spec.clone(),
            guid,
            core,
            cm: Slot::new(Arc::new(cm)),
            access,
            sessions,
        })
    }

    /// The device's name (`rxe0`).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The CA's node GUID: our initiator port ID's second half.
    pub fn guid(&self) -> Guid {
        self.guid
    }

    /// The port logins leave from.
    pub fn port(&self) -> PortNum {
        PortNum(self.spec.port)
    }

    /// The device's IP addresses, which logins may come from.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.cm.get().addresses().to_vec()
    }

    /// The provider sessions make their verbs objects on (a tracked
    /// client of the device).
    pub fn sessions(&self) -> &Arc<dyn verbs::Provider> {
        &self.sessions
    }

    /// The source address of a login: `wanted` if the device has it, by
    /// default its first IPv4 address (else its first).
    ///
    /// # Errors
    /// `wanted` is not the device's.
    pub fn source(&self, wanted: Option<IpAddr>) -> Result<IpAddr, DeviceError> {
        let has = self.addresses();
        match wanted {
            Some(ip) if has.contains(&ip) => Ok(ip),
            Some(ip) => Err(DeviceError::NotItsAddress {
                ip,
                device: self.spec.name.clone(),
                has,
            }),
            // `RdmaCm::start` refuses a device without an address.
            None => has
                .iter()
                .find(|a| a.is_ipv4())
                .or(has.first())
                .copied()
                .ok_or_else(|| DeviceError::Cm {
                    device: self.spec.name.clone(),
                    source: rdmacore::CmStartError::NoAddress {
                        device: self.spec.name.clone(),
                    },
                }),
        }
    }

    /// A connector logging in by the kernel's RDMA CM from `src` (one of
    /// the device's addresses) to `dst`, waiting at most `timeout`.
    pub fn connector(&self, src: IpAddr, dst: SocketAddr, timeout: Duration) -> Arc<dyn Connector> {
        Arc::new(srp_initiator::connectors::RdmaCmConnector {
            agent: self.cm.clone(),
            src,
            dst,
            timeout,
        })
    }

    /// Verbs objects the sessions hold on the device, and connections
    /// and listens of its RDMA CM (0 once every session ended, and once
    /// the device was removed).
    pub fn live(&self) -> i64 {
        self.access.live_total() + self.cm.get().live_ids() as i64
    }

    /// Ends what the RDMA CM still holds and stops its thread (at
    /// shutdown, once the sessions are gone).
    pub fn close(&self) {
        self.cm.get().close();
    }

    /// What srpd's watcher brings the device's RDMA CM back with after
    /// its removal (see the module docs).
    pub fn comeback(&self) -> Box<dyn Comeback> {
        Box::new(DeviceComeback {
            spec: self.spec.clone(),
            guid: self.guid,
            core: self.core.clone(),
            cm: self.cm.clone(),
        })
    }
}

/// A device port's RDMA CM, started again once the device is back.
struct DeviceComeback {
    spec: DeviceSpec,
    guid: Guid,
    core: Arc<RdmaCore>,
    cm: Arc<Slot<RdmaCm>>,
}

impl Comeback for DeviceComeback {
    fn gone(&self) -> bool {
        self.cm.get().is_removed()
    }

    fn again(&mut self) -> Result<(), String> {
        // The removed one's thread ends; it holds no id of the device.
        self.cm.get().close();
        let guid = self.core.find_port(&self.spec).map_err(|e| e.to_string())?;
        if guid != self.guid {
            // The sessions' initiator port IDs and opens name the old
            // GUID: a new device under the name is not the one they had.
            return Err(format!(
                "{} is back with node GUID {guid}, not {}: its logins cannot move to another \
                 device; log them in again (srp logout, srp login)",
                self.spec.name, self.guid
            ));
        }
        let cm = RdmaCm::start(&self.core, guid).map_err(|e| e.to_string())?;
        self.cm.replace(Arc::new(cm));
        Ok(())
    }

    fn went(&self) -> String {
        format!(
            "{} was removed: its logins' LUNs wait for it (reconnect_delay, fast_io_fail_tmo, \
             dev_loss_tmo)",
            self.spec
        )
    }

    fn back(&self) -> String {
        format!("{} is back: logins reconnect through it", self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path of a machine without rdma-core, whatever this host has.
    #[test]
    fn without_libibverbs_a_device_says_what_to_install_in_one_line() {
        let spec: DeviceSpec = "rxe0".parse().unwrap();
        let opts = rdmacore::Options {
            library: "/nonexistent/libibverbs.so.1".into(),
            ..Default::default()
        };
        let Err(e) = DeviceCa::open_with(&spec, opts) else {
            panic!("opened a device without its library");
        };
        assert!(matches!(e, DeviceError::Load(_)), "{e:?}");
        let m = e.to_string();
        assert!(!m.contains('\n'), "{m}");
        assert!(m.contains("apt-get install libibverbs1"), "{m}");
    }

    #[test]
    fn errors_name_the_cause_and_the_fix() {
        let e = DeviceError::NotItsAddress {
            ip: "10.0.0.9".parse().unwrap(),
            device: "rxe0".into(),
            has: vec!["10.0.0.1".parse().unwrap(), "fe80::1".parse().unwrap()],
        };
        assert_eq!(
            e.to_string(),
            "10.0.0.9 is not an address of rxe0 (it has 10.0.0.1, fe80::1): give one of them, \
             or none for 10.0.0.1"
        );
        let e = DeviceError::IbCm {
            what: "service_id=0002c903000b0b0b".into(),
            device: "rxe0".into(),
            soft: "",
        };
        let m = e.to_string();
        assert!(
            m.starts_with("service_id=0002c903000b0b0b: IB CM logins are not served on rdma-core device rxe0 yet")
                && m.contains("log in by RDMA CM with dest=ip:port"),
            "{m}"
        );
    }
}
