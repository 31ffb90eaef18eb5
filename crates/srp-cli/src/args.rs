//! What the command lines of `srp` and `srpd` share beyond clap: Linux's
//! SRP transport timers as they are given (seconds, or with a unit, or
//! `off`), the target's address with srptd's port as the default, the
//! check that our local address is free, and the connector that adds
//! srptd's defaults to a login nothing took.

use rdma_types::units::{self, DurationError};
use srp_initiator::session::{ConnectError, Connected, Connector, LoginAddress, LoginForm, QpInfo};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A `--dest` that is no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a target address: write ip:port or [ipv6]:port, or the address alone for port {port} (srptd's default rdma_cm_port)",
    port = srp::RDMA_CM_PORT
)]
pub struct DestError(pub String);

/// A target's RDMA CM address (`--dest`): `ip:port`, `[ipv6]:port`, or
/// the address alone (`127.0.0.1`, `::1`, `[::1]`) for srptd's port,
/// [`srp::RDMA_CM_PORT`], as ib_srpt set-ups use it.
///
/// # Errors
/// Anything else.
pub fn dest(s: &str) -> Result<SocketAddr, DestError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    ip.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, srp::RDMA_CM_PORT))
        .map_err(|_| DestError(s.to_string()))
}

/// Why our soft RoCE NIC cannot have a local address.
#[derive(Debug, thiserror::Error)]
pub enum LocalAddrError {
    /// Another process (an srptd on the same address, say) holds the
    /// RoCEv2 UDP port there.
    #[error(
        "UDP {ip}:{port} (RoCEv2) is in use: another process (srptd? the NIC daemon? `nicd --clients` lists its clients) has its NIC on {ip}; pick another local address with --ip, or drop --own-nic to share the daemon's NIC"
    )]
    InUse {
        /// The address.
        ip: IpAddr,
        /// The UDP port.
        port: u16,
    },
    /// Not an address of this host.
    #[error("{ip} is not an address of this host ({source}): give one of its addresses with --ip")]
    NotLocal {
        /// The address.
        ip: IpAddr,
        /// What bind said.
        source: std::io::Error,
    },
}

/// Checks, before any NIC is made, that the RoCEv2 UDP port is free on
/// each local address (`--ip`): the usual mistake is giving the target's
/// own address, where srptd holds it.
///
/// # Errors
/// The first address whose port is taken or that is not this host's.
pub fn check_local(ips: &[IpAddr], port: u16) -> Result<(), LocalAddrError> {
    for &ip in ips {
        match std::net::UdpSocket::bind((ip, port)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(LocalAddrError::InUse { ip, port })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                return Err(LocalAddrError::NotLocal { ip, source: e })
            }
            // Anything else is the NIC's to report when it binds.
            Err(_) => {}
        }
    }
    Ok(())
}

/// A connector whose logins that nothing took also say what srptd's
/// defaults are: the initiator library names where the login went, the
/// command line knows which daemon is usually there.
pub struct SrptdHints(pub Arc<dyn Connector>);

impl SrptdHints {
    /// `e` with srptd's defaults added where they are the likely fix.
    pub fn hint(e: ConnectError) -> ConnectError {
        let port = srp::RDMA_CM_PORT;
        match e {
            ConnectError::NoAnswer(LoginAddress::RdmaCm(_)) => ConnectError::Failed(format!(
                "{e}: is srptd running there? (its default port is {port})"
            )),
            ConnectError::NoListener(LoginAddress::RdmaCm(_)) => {
                ConnectError::Failed(format!("{e}; srptd's default is {port}"))
            }
            ConnectError::NoAnswer(LoginAddress::IbCm { .. }) => {
                ConnectError::Failed(format!("{e}: is srptd running there?"))
            }
            ConnectError::NoListener(LoginAddress::IbCm { .. }) => ConnectError::Failed(format!(
                "{e}; srptd listens on its ioc_guid, 0002c903 and its IPv4 address in hex"
            )),
            e => e,
        }
    }
}

impl Connector for SrptdHints {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        self.0.connect(login, local).map_err(SrptdHints::hint)
    }

    fn disconnect(&self, handle: u64) {
        self.0.disconnect(handle)
    }

    fn form(&self) -> LoginForm {
        self.0.form()
    }
}

/// One of scsi_transport_srp's timers (`reconnect_delay`,
/// `fast_io_fail_tmo`, `dev_loss_tmo`) as given on a command line: a
/// duration, where a plain number counts seconds as in Linux's sysfs
/// files (`10`, `500ms`, `2m`), or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmo(pub Option<Duration>);

/// A timer that is neither a duration nor `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}, or `off`")]
pub struct TmoError(pub DurationError);

impl std::str::FromStr for Tmo {
    type Err = TmoError;
    fn from_str(s: &str) -> Result<Tmo, TmoError> {
        if s.trim() == "off" {
            return Ok(Tmo(None));
        }
        units::secs(s).map(|d| Tmo(Some(d))).map_err(TmoError)
    }
}

impl Tmo {
    /// The timer as the remote port takes it.
    pub fn rport(self) -> Option<rdma_types::Duration> {
        self.0.map(rdma_types::Duration::from_std)
    }
}

/// Whose soft RoCE NIC `srp` or `srpd` runs on ([`nicd::choice`]): the
/// NIC daemon's unless `--own-nic`, `$NICD_MODE=own`, a `--udp-port` other
/// than 4791, an `--mtu` other than 4096 or `$SOFTROCE_FAULTS` asks for
/// one of its own (on the `ib` fabric too: the daemon's port there).
///
/// # Errors
/// Options that contradict each other, in words.
pub fn nic_choice(
    nicd: Option<&std::path::Path>,
    own_nic: bool,
    udp_port: u16,
    mtu: usize,
) -> Result<nicd::choice::Which, String> {
    nicd::choice::choose_for(
        nicd,
        own_nic,
        udp_port,
        &[(mtu != 4096, format!("--mtu {mtu}"))],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_defaults_to_srptds_port() {
        let a = |s: &str| dest(s).unwrap().to_string();
        assert_eq!(a("127.0.0.1:5556"), "127.0.0.1:5556");
        assert_eq!(a("127.0.0.1"), "127.0.0.1:5555");
        assert_eq!(a("[::1]:7000"), "[::1]:7000");
        assert_eq!(a("[::1]"), "[::1]:5555");
        assert_eq!(a("::1"), "[::1]:5555");
        let e = dest("host:5555").unwrap_err().to_string();
        assert!(
            e.contains("`host:5555` is not a target address") && e.contains("port 5555"),
            "{e}"
        );
        assert!(dest("127.0.0.1:").is_err());
        assert!(dest("[::1").is_err());
    }

    #[test]
    fn logins_nothing_took_get_srptds_defaults() {
        let at = LoginAddress::RdmaCm("127.0.0.1:5556".parse().unwrap());
        let m = SrptdHints::hint(ConnectError::NoListener(at)).to_string();
        assert!(
            m.contains("nothing listens for SRP logins at 127.0.0.1:5556 (RDMA CM port")
                && m.ends_with("srptd's default is 5555"),
            "{m}"
        );
        let m = SrptdHints::hint(ConnectError::NoAnswer(at)).to_string();
        assert!(
            m.contains("nothing answered SRP logins at 127.0.0.1:5556 (RDMA CM port)")
                && m.ends_with("is srptd running there? (its default port is 5555)"),
            "{m}"
        );
        assert_eq!(
            SrptdHints::hint(ConnectError::Rejected(vec![1])),
            ConnectError::Rejected(vec![1])
        );
    }

    #[test]
    fn a_taken_local_port_is_named() {
        let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let m = check_local(&[ip], port).unwrap_err().to_string();
        assert!(
            m.contains(&format!("UDP 127.0.0.1:{port} (RoCEv2) is in use"))
                && m.contains("pick another local address with --ip"),
            "{m}"
        );
        drop(held);
        // 192.0.2.1 (TEST-NET-1) is no address of a test host.
        let m = check_local(&["192.0.2.1".parse().unwrap()], port)
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("192.0.2.1 is not an address of this host"),
            "{m}"
        );
    }

    #[test]
    fn timers_take_seconds_units_or_off() {
        assert_eq!("10".parse(), Ok(Tmo(Some(Duration::from_secs(10)))));
        assert_eq!("500ms".parse(), Ok(Tmo(Some(Duration::from_millis(500)))));
        assert_eq!("2m".parse(), Ok(Tmo(Some(Duration::from_secs(120)))));
        assert_eq!("off".parse(), Ok(Tmo(None)));
        let e = "never".parse::<Tmo>().unwrap_err().to_string();
        assert!(
            e.contains("`never` is not a duration")
                && e.contains("a number of seconds")
                && e.ends_with("or `off`"),
            "{e}"
        );
        assert_eq!(
            Tmo(Some(Duration::from_secs(15))).rport(),
            Some(rdma_types::Duration::from_secs(15))
        );
    }
}
