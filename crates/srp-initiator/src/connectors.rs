//! The [`Connector`]s a session logs in through over the access layer:
//! RDMA CM to an address and port ([`RdmaCmConnector`], ib_srp's
//! `dest=ip:port`), IB CM to a service ID at a GID ([`IbCmConnector`]),
//! and IB CM along PathRecords from the subnet administrator
//! ([`SaPathConnector`], ib_srp's `dgid=`, `pkey=`, `service_id=`).
//!
//! A consumer-defined REJ (code 28, IBA 12.6.7.2) carries the target's
//! SRP_LOGIN_REJ and comes back as [`ConnectError::Rejected`] for the
//! session to decode; no answer at all is [`ConnectError::NoAnswer`] and
//! a REJ for an unknown service ID [`ConnectError::NoListener`], each
//! naming where the login went; every other failure is a CM failure, in
//! words.
//! Disconnecting waits (bounded) for the DREP: a peer that never heard the
//! DREQ rejects the next login as stale.

use crate::session::{
    pkey_index, ConnectError, Connected, Connector, LoginAddress, LoginForm, QpInfo,
};
use rdma_access::sa::PathQuery;
pub use rdma_access::subnet::{SaPortError, SubnetPort};
use rdma_access::{CmAgent, CmError};
use rdma_mad::sa::PathRecord;
use rdma_types::{Gid, Lid, Mtu, Pkey};
use std::sync::Arc;
use std::time::Duration;

/// The CM's REP as the session wants it: the target's QP at `gid`.
fn connected(e: rdma_access::Established, gid: Gid, mtu: Mtu) -> Connected {
    Connected {
        local_psn: e.local_psn,
        peer: QpInfo {
            qpn: e.remote_qpn,
            psn: e.remote_psn,
            gid,
            lid: Lid(0),
            mtu,
        },
        private_data: e.private_data,
        handle: e.conn.0 as u64,
    }
}

/// A consumer-defined REJ (code 28) carries the SRP_LOGIN_REJ; no answer
/// and a REJ for an unknown service ID say nothing took the login at
/// `at`; anything else is a CM failure, in words.
fn connect_error(e: CmError, at: LoginAddress) -> ConnectError {
    match e {
        CmError::Rejected {
            code: 28,
            private_data,
            ..
        } => ConnectError::Rejected(private_data),
        CmError::Rejected { code, .. }
            if rdma_mad::cm::RejReason::from(code) == rdma_mad::cm::RejReason::InvalidServiceId =>
        {
            ConnectError::NoListener(at)
        }
        CmError::TimedOut => ConnectError::NoAnswer(at),
        e => ConnectError::Failed(e.to_string()),
    }
}

/// Disconnects and waits for the DREP: `srp` exits right after, and a
/// peer that never heard the DREQ rejects the next login as stale.
fn disconnect_and_wait(agent: &dyn rdma_access::rdmacm::Service, handle: u64) {
    agent.disconnect_wait(rdma_access::ConnId(handle as u32), Duration::from_secs(2));
}

/// Connects through RDMA CM: the SRP login travels in the REQ after the
/// `cma_hdr`, as Linux ib_srp does with `dest=ip:port`.
pub struct RdmaCmConnector {
    /// This port's RDMA CM: its CM agent, or the kernel's CM through
    /// librdmacm on an rdma-core device.
    pub agent: Arc<dyn rdma_access::rdmacm::Service>,
    /// This NIC's address.
    pub src: std::net::IpAddr,
    /// The target's address and RDMA CM port.
    pub dst: std::net::SocketAddr,
    /// How long to wait for the REP.
    pub timeout: Duration,
}

impl Connector for RdmaCmConnector {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        match self.agent.connect(
            self.src,
            self.dst,
            local.qpn,
            local.psn,
            login,
            self.timeout,
        ) {
            Ok(e) => Ok(connected(e, Gid::from_ip(self.dst.ip()), local.mtu)),
            Err(e) => Err(connect_error(e, LoginAddress::RdmaCm(self.dst))),
        }
    }

    fn disconnect(&self, handle: u64) {
        disconnect_and_wait(&*self.agent, handle);
    }

    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// Connects through the IB CM to a service ID (ib_srp's `service_id=`;
/// ib_srpt listens on its ioc_guid): the 64-byte SRP_LOGIN_REQ is the
/// REQ's private data. On RoCE the port is reached at the GID of its IP
/// address.
pub struct IbCmConnector {
    /// This port's CM agent.
    pub agent: Arc<CmAgent>,
    /// The target port's GID.
    pub dgid: Gid,
    /// The service ID.
    pub service_id: u64,
    /// How long to wait for the REP.
    pub timeout: Duration,
}

impl Connector for IbCmConnector {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        match self.agent.connect(
            self.dgid,
            self.service_id,
            local.qpn,
            local.psn,
            login.to_vec(),
            self.timeout,
        ) {
            Ok(e) => Ok(connected(e, self.dgid, local.mtu)),
            Err(e) => Err(connect_error(
                e,
                LoginAddress::IbCm {
                    dgid: self.dgid,
                    service_id: self.service_id,
                },
            )),
        }
    }

    fn disconnect(&self, handle: u64) {
        disconnect_and_wait(&*self.agent, handle);
    }

    fn form(&self) -> LoginForm {
        LoginForm::IbCm
    }
}

/// Tries `attempt` along `paths` in order until one connects; a reject
/// (the target answered) ends the walk at once. The errors of the
/// attempts made, in order, when none connected.
pub fn connect_along<P, T>(
    paths: &[P],
    mut attempt: impl FnMut(&P) -> Result<T, CmError>,
) -> Result<T, Vec<CmError>> {
    let mut errs = Vec::new();
    for p in paths {
        match attempt(p) {
            Ok(t) => return Ok(t),
            Err(e) => {
                let rejected = matches!(e, CmError::Rejected { .. });
                errs.push(e);
                if rejected {
                    break;
                }
            }
        }
    }
    Err(errs)
}

/// Logs in by IB CM along paths from the SA: the first path, then the
/// next on a failure, then a fresh query when all failed; a reject ends
/// the attempt and is reported decoded.
pub struct SaPathConnector {
    /// The local port on the managed subnet.
    pub port: Arc<dyn SubnetPort>,
    /// The target port's GID (login string `dgid=`).
    pub dgid: Gid,
    /// The partition (`pkey=`).
    pub pkey: Pkey,
    /// The service ID (`service_id=`).
    pub service_id: u64,
    /// How long each path waits for the REP.
    pub timeout: Duration,
    /// Paths asked of the SA per query.
    pub max_paths: u8,
}

impl SaPathConnector {
    fn paths(&self) -> Result<Vec<PathRecord>, SaPortError> {
        let sa = self.port.sa()?;
        let q = PathQuery {
            sgid: self.port.agent().gid(),
            dgid: self.dgid,
            max_paths: self.max_paths.max(1),
            pkey: Some(self.pkey),
            service_id: Some(self.service_id),
        };
        let paths = sa
            .path_records(&q)
            .map_err(|e| self.port.sa_error(&sa, e))?;
        if paths.is_empty() {
            return Err(SaPortError::NoPath {
                sa: sa.sa_gid(),
                port: self.port.name(),
                dgid: self.dgid,
                pkey: self.pkey,
            });
        }
        Ok(paths)
    }
}

impl Connector for SaPathConnector {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let mut why = Vec::new();
        // The paths of one query, then of a fresh one (the SM may have
        // moved the target since).
        for round in 1..=2 {
            let paths = match self.paths() {
                Ok(p) => p,
                Err(e) => {
                    why.push(format!("query {round}: {e}"));
                    continue;
                }
            };
            // The REQ carries the P_Key of the session QP's table entry
            // (chosen from the login's pkey the same way).
            let table = self.port.agent().pkeys();
            let key = pkey_index(&table, self.pkey).map_or(self.pkey, |i| table[usize::from(i)]);
            let r = connect_along(&paths, |p| {
                self.port
                    .agent()
                    .connect_in_partition(
                        p.dgid,
                        key,
                        self.service_id,
                        local.qpn,
                        local.psn,
                        login.to_vec(),
                        self.timeout,
                    )
                    .map(|e| (e, *p))
            });
            match r {
                Ok((e, p)) => {
                    let mtu = Mtu::from_code(p.mtu).map_or(local.mtu, |m| m.min(local.mtu));
                    return Ok(Connected {
                        peer: QpInfo {
                            qpn: e.remote_qpn,
                            psn: e.remote_psn,
                            gid: p.dgid,
                            lid: Lid(p.dlid),
                            mtu,
                        },
                        private_data: e.private_data,
                        handle: e.conn.0 as u64,
                        local_psn: e.local_psn,
                    });
                }
                Err(mut errs) => {
                    if matches!(errs.last(), Some(CmError::Rejected { .. })) {
                        let e = errs.pop().expect("the reject");
                        let at = LoginAddress::IbCm {
                            dgid: self.dgid,
                            service_id: self.service_id,
                        };
                        return Err(connect_error(e, at));
                    }
                    for (k, (e, p)) in errs.iter().zip(&paths).enumerate() {
                        why.push(format!(
                            "query {round} path {} (DLID {}): {e}",
                            k + 1,
                            p.dlid
                        ));
                    }
                }
            }
        }
        Err(ConnectError::Failed(why.join("; ")))
    }

    fn disconnect(&self, handle: u64) {
        disconnect_and_wait(&*self.port.agent(), handle);
    }

    fn form(&self) -> LoginForm {
        LoginForm::IbCm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rej() -> CmError {
        CmError::Rejected {
            reason: "consumer defined".into(),
            code: 28,
            private_data: vec![0xc2],
        }
    }

    #[test]
    fn connect_along_tries_the_next_path_and_stops_at_a_reject() {
        // The first path times out, the second connects.
        let mut tried = Vec::new();
        let r = connect_along(&[1, 2, 3], |p| {
            tried.push(*p);
            if *p == 1 {
                Err(CmError::TimedOut)
            } else {
                Ok(*p * 10)
            }
        });
        assert_eq!((r.unwrap(), tried), (20, vec![1, 2]));
        // A reject on the first path: the target answered, no other path.
        let mut tried = Vec::new();
        let r: Result<(), _> = connect_along(&[1, 2], |p| {
            tried.push(*p);
            Err(rej())
        });
        let errs = r.unwrap_err();
        assert_eq!((errs.len(), tried), (1, vec![1]));
        assert!(matches!(errs[0], CmError::Rejected { code: 28, .. }));
        // Every path fails: every error, in order.
        let r: Result<(), _> = connect_along(&[1, 2], |_| Err(CmError::TimedOut));
        assert_eq!(r.unwrap_err().len(), 2);
    }

    #[test]
    fn a_consumer_defined_reject_carries_the_login_reject() {
        let at = LoginAddress::RdmaCm("127.0.0.1:5556".parse().unwrap());
        assert_eq!(connect_error(rej(), at), ConnectError::Rejected(vec![0xc2]));
        assert!(matches!(
            connect_error(CmError::Stopped, at),
            ConnectError::Failed(_)
        ));
    }

    /// No answer, and a REJ for a service nothing listens on, say that
    /// nothing took the login and where it was sent.
    #[test]
    fn nothing_there_is_said_with_the_address() {
        let at = LoginAddress::RdmaCm("127.0.0.1:5556".parse().unwrap());
        let e = connect_error(CmError::TimedOut, at);
        assert_eq!(e, ConnectError::NoAnswer(at));
        assert_eq!(
            e.to_string(),
            "nothing answered SRP logins at 127.0.0.1:5556 (RDMA CM port)"
        );
        let invalid_sid = CmError::Rejected {
            reason: "invalid service ID".into(),
            code: 8,
            private_data: vec![],
        };
        let e = connect_error(invalid_sid, at);
        assert_eq!(
            e.to_string(),
            "nothing listens for SRP logins at 127.0.0.1:5556 (RDMA CM port; its CM rejected the login: invalid service ID)"
        );
        let ib = LoginAddress::IbCm {
            dgid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            service_id: 0x1234,
        };
        assert_eq!(
            ConnectError::NoAnswer(ib).to_string(),
            "nothing answered SRP logins at service ID 0000000000001234 of ::ffff:127.0.0.1 (IB CM)"
        );
    }
}
