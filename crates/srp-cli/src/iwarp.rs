//! Logins over our soft iWARP NIC (`--iwarp` of `srp` and `srpd`): RDMA
//! over TCP (`iwarp_tcp`), what Linux siw speaks, instead of soft RoCE.
//!
//! Each local address is one CA of one [`iwarp_tcp::SoftIwarp`], with the
//! GUID of its address as on soft RoCE (`rnic::softroce::ip_guid`), so an
//! initiator's port ID is the same over either NIC. Logins go by RDMA CM,
//! which on iWARP is a TCP connection to the target's `dest=ip:port` and
//! the MPA exchange carrying the SRP login ([`iwarp_tcp::IwarpCm`]):
//! the login strings are those of RoCE.
//!
//! What it refuses: IB CM logins (`service_id=`, `dgid=`) and discovery,
//! which need MADs on a QP1 that iWARP does not have ([`IwarpError`]).

use rdma_types::Guid;
use srp_initiator::session::Connector;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// What an iWARP CA cannot do, in words with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IwarpError {
    /// A login by IB CM.
    #[error(
        "{what}: IB CM logins need a QP1, which iWARP does not have: log in by RDMA CM with \
         dest=ip:port (the target's address and its RDMA CM port, 5555 for srptd), or drop \
         --iwarp to log in over soft RoCE"
    )]
    IbCm {
        /// The login's keys that ask for IB CM.
        what: String,
    },
    /// A local address whose TCP port of the verbs-only setup is taken,
    /// or that is not this host's.
    #[error("{ip} cannot be an iWARP CA: {why}")]
    Local {
        /// The address.
        ip: IpAddr,
        /// Why.
        why: String,
    },
}

/// Our soft iWARP NIC with one CA per local address, the sessions'
/// tracked client of an access layer over it, and RDMA CM on each CA.
pub struct IwarpCas {
    access: rdma_access::resource::AccessLayer,
    sessions: Arc<dyn verbs::Provider>,
    cas: Vec<(IpAddr, Guid, Arc<iwarp_tcp::IwarpCm>)>,
}

impl IwarpCas {
    /// The NIC with a CA at each of `ips`, `options` for all.
    ///
    /// # Errors
    /// An address that is not this host's, or whose TCP port of the
    /// verbs-only setup ([`iwarp_tcp::NicOptions::port`]) another process
    /// holds: tried before anything is made.
    pub fn open(ips: &[IpAddr], options: iwarp_tcp::NicOptions) -> Result<IwarpCas, IwarpError> {
        for &ip in ips {
            if let Err(e) = std::net::TcpListener::bind((ip, options.port)) {
                let why = match e.kind() {
                    std::io::ErrorKind::AddrInUse => format!(
                        "TCP {ip}:{} is in use (another process has its iWARP NIC there): pick \
                         another local address with --ip",
                        options.port
                    ),
                    std::io::ErrorKind::AddrNotAvailable => format!(
                        "not an address of this host ({e}): give one of its addresses with --ip"
                    ),
                    _ => format!("cannot listen on TCP {ip}:{}: {e}", options.port),
                };
                return Err(IwarpError::Local { ip, why });
            }
        }
        let list: Vec<iwarp_tcp::IwarpCa> = ips
            .iter()
            .map(|&ip| iwarp_tcp::IwarpCa {
                guid: rnic::softroce::ip_guid(ip),
                ip,
            })
            .collect();
        let nic = iwarp_tcp::SoftIwarp::with_options(list.clone(), options);
        let access =
            rdma_access::resource::AccessLayer::new(nic.clone() as Arc<dyn verbs::Provider>);
        let sessions = access.client("srp initiator").into_provider();
        let cas = list
            .iter()
            .map(|c| (c.ip, c.guid, iwarp_tcp::IwarpCm::new(nic.clone(), c.guid)))
            .collect();
        Ok(IwarpCas {
            access,
            sessions,
            cas,
        })
    }

    /// The provider sessions make their verbs objects on (a tracked
    /// client).
    pub fn sessions(&self) -> &Arc<dyn verbs::Provider> {
        &self.sessions
    }

    /// The CAs: address, GUID, RDMA CM.
    pub fn cas(&self) -> &[(IpAddr, Guid, Arc<iwarp_tcp::IwarpCm>)] {
        &self.cas
    }

    /// A connector logging in by RDMA CM from CA `k` to `dst`, waiting at
    /// most `timeout`.
    pub fn connector(&self, k: usize, dst: SocketAddr, timeout: Duration) -> Arc<dyn Connector> {
        let (ip, _, cm) = &self.cas[k];
        Arc::new(srp_initiator::connectors::RdmaCmConnector {
            agent: cm.clone(),
            src: *ip,
            dst,
            timeout,
        })
    }

    /// Verbs objects the sessions hold (0 once every session ended).
    pub fn live(&self) -> i64 {
        self.access.live_total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_not_of_this_host_is_named_with_the_fix() {
        // 192.0.2.1 (TEST-NET-1) is no address of a test host.
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let Err(e) = IwarpCas::open(&[ip], iwarp_tcp::NicOptions::default()) else {
            panic!("an iWARP CA on a foreign address");
        };
        let m = e.to_string();
        assert!(
            m.starts_with("192.0.2.1 cannot be an iWARP CA: not an address of this host")
                && m.ends_with("give one of its addresses with --ip"),
            "{m}"
        );
    }

    #[test]
    fn a_taken_verbs_port_is_named() {
        let ip: IpAddr = "127.31.9.1".parse().unwrap();
        let held = std::net::TcpListener::bind((ip, 0)).unwrap();
        let options = iwarp_tcp::NicOptions {
            port: held.local_addr().unwrap().port(),
            ..Default::default()
        };
        let Err(e) = IwarpCas::open(&[ip], options) else {
            panic!("two iWARP NICs on one address and port");
        };
        assert!(e.to_string().contains("is in use"), "{e}");
    }

    #[test]
    fn ib_cm_logins_are_refused_with_the_way_that_works() {
        let m = IwarpError::IbCm {
            what: "service_id=0002c903000b0b0b".into(),
        }
        .to_string();
        assert!(
            m.contains("iWARP does not have") && m.contains("dest=ip:port"),
            "{m}"
        );
    }
}
