//! The IB-managed mode (`--fabric ib`, `fabric = "ib"`): the daemons' soft
//! RoCE port takes the `ib` personality, a subnet manager (`ibsm run`,
//! which must list the port's address among its nodes) gives it a LID, its
//! SM LID and P_Key table and brings it ACTIVE, and the subnet
//! administrator answers what `srp_daemon` and `ib_srp` ask it.
//!
//! What this module adds on top of `rdma_access::IbNode` (the port's SMA
//! and MAD driver):
//! - [`IbPort::wait_active`] waits, bounded, for the SM to activate the
//!   port and says plainly when none did;
//! - [`IbPort::sa`] is the SA client of the port's master SM (its address
//!   is where the SM's Sets came from), made anew when the SM moves;
//! - [`SaPathConnector`] logs in by IB CM along PathRecords from the SA
//!   (`dgid`, `pkey`, `service_id` of the login string): the first path,
//!   then the next on a failure, then a fresh query when all failed; a
//!   reject ends the attempt and is reported decoded;
//! - [`dm_ports`] is srp_daemon's query: the ports whose CapabilityMask has
//!   IsDeviceManagementSupported, each with a path in the chosen partition.
//!
//! Partitions on the data path: srpd's session QP uses the index of its
//! port's P_Key table holding the login's `pkey`; srptd's QPs use the
//! index of its table entry matching the REQ's partition key, which
//! carries the P_Key of the session QP's entry; a partition the config
//! does not serve (`target.pkey`) is refused.
//!
//! GUIDs: every port's GUID comes from its address ([`ib_guid`]), in
//! either fabric. On a managed subnet the SM keys LIDs by it; in both, a
//! target's id_ext and ioc_guid follow it, and so does the second half of
//! an initiator's port ID, so two hosts are two initiators and two targets
//! two target ports without configuration.

use rdma_access::sa::{PathQuery, SaClient, SaError, SaTiming};
use rdma_access::sma::state;
use rdma_access::{CmAgent, IbNode};
use rdma_mad::sa::PathRecord;
use rdma_types::{Gid, Guid, Lid, Mtu, Pkey};
use serde::{Deserialize, Serialize};
use srp_initiator::session::{ConnectError, Connected, Connector, LoginForm, QpInfo};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Who runs the port: nobody (`roce`, RDMA CM by IP address, like Linux
/// rxe) or a subnet manager (`ib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// Unmanaged RoCE: GIDs from IP addresses, no SM.
    #[default]
    Roce,
    /// Managed subnet: `ibsm run` configures the port; paths from its SA.
    Ib,
}

/// The GUID of the CA at `ip`, in either fabric (see
/// [`rnic::softroce::ip_guid`]).
pub use rnic::softroce::ip_guid as ib_guid;

/// A port in the `ib` personality, ACTIVE (see the module docs).
pub struct IbPort {
    node: IbNode,
    ip: IpAddr,
    timing: SaTiming,
    sa: Mutex<Option<Arc<SaClient>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn state_name(s: u8) -> &'static str {
    match s {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        _ => "in an unknown state",
    }
}

impl IbPort {
    /// Starts CA `guid` at `ip` of `p` (not yet open) in the `ib`
    /// personality, device management offered if `dm`. The port is INIT
    /// until an SM activates it: see [`IbPort::wait_active`].
    ///
    /// # Errors
    /// The CA is unknown or open, or its port cannot start.
    pub fn start(
        p: Arc<rnic::softroce::SoftRoce>,
        guid: Guid,
        ip: IpAddr,
        description: &str,
        dm: bool,
        first_comm_id: u32,
    ) -> Result<IbPort, String> {
        let start = |e: String| format!("start the ib port on {ip}: {e}");
        p.set_personality(guid, rnic::softroce::Personality::Ib)
            .map_err(|e| start(format!("CA {:#x}: {e}", guid.0)))?;
        let node = IbNode::start(p, guid, description, dm, first_comm_id)
            .map_err(|e| start(e.to_string()))?;
        Ok(IbPort {
            node,
            ip,
            timing: SaTiming::default(),
            sa: Mutex::new(None),
        })
    }

    /// Waits at most `wait` for an SM to make the port ACTIVE and for its
    /// SA to list it (the SM finishes with a port, P_Key table and trap
    /// 64, a few SMPs after ACTIVE; only then do others find it).
    ///
    /// # Errors
    /// No SM did, in words.
    pub fn wait_active(&self, wait: Duration) -> Result<(), String> {
        let sma = self.node.sma();
        let end = std::time::Instant::now() + wait;
        if sma.wait_state(state::ACTIVE, wait) {
            let mut last: String;
            loop {
                match self.sa().and_then(|sa| {
                    sa.node_records(Some(self.lid()))
                        .map_err(|e| self.sa_error(&sa, e))
                }) {
                    Ok(r) if !r.is_empty() => return Ok(()),
                    Ok(_) => last = "it does not list the port yet".into(),
                    Err(e) => last = e,
                }
                if std::time::Instant::now() >= end {
                    return Err(format!(
                        "port {} ACTIVE, LID {}, but the SA is not ready after {} ms: {last}",
                        self.ip,
                        self.lid(),
                        wait.as_millis()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(format!(
            "port {} (GUID {:016x}) still {} after {} ms: no subnet manager configured it \
             (is `ibsm run --node {}` running and reachable?)",
            self.ip,
            self.node.guid().0,
            state_name(sma.port_state()),
            wait.as_millis(),
            self.ip
        ))
    }

    /// How SA queries wait and resend.
    pub fn with_timing(mut self, timing: SaTiming) -> IbPort {
        self.timing = timing;
        self
    }

    /// The port's MAD driver (CM, DM, SA).
    pub fn agent(&self) -> &Arc<CmAgent> {
        self.node.agent()
    }

    /// The port's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The port's LID.
    pub fn lid(&self) -> u16 {
        self.node.sma().lid()
    }

    /// The master SM's LID as the port knows it (it changes when another
    /// SM takes over).
    pub fn sm_lid(&self) -> u16 {
        self.node.sma().sm_lid()
    }

    /// The P_Keys of the port's table the SM filled in.
    pub fn pkeys(&self) -> Vec<Pkey> {
        self.node
            .sma()
            .pkeys()
            .into_iter()
            .filter(|k| k.0 & 0x7fff != 0)
            .collect()
    }

    /// `pkey` if the port is a member of that partition (either
    /// membership), else an error naming the table.
    ///
    /// # Errors
    /// The SM did not put the port in the partition.
    pub fn check_pkey(&self, pkey: Pkey) -> Result<(), String> {
        let table = self.pkeys();
        if table.iter().any(|k| k.0 & 0x7fff == pkey.0 & 0x7fff) {
            return Ok(());
        }
        let names: Vec<String> = table.iter().map(|k| format!("{:04x}", k.0)).collect();
        Err(format!(
            "P_Key {:04x}: port {} is not a member of that partition (its P_Key table: {})",
            pkey.0,
            self.ip,
            names.join(", ")
        ))
    }

    /// The SA client of the current master SM (made anew if the SM moved).
    ///
    /// # Errors
    /// No SM has set the port yet, or the client cannot register.
    pub fn sa(&self) -> Result<Arc<SaClient>, String> {
        let gid = self
            .node
            .sma()
            .sm_gid()
            .ok_or_else(|| format!("port {}: no SM has configured it", self.ip))?;
        let mut g = lock(&self.sa);
        if let Some(c) = &*g {
            if c.sa_gid() == gid {
                return Ok(c.clone());
            }
        }
        // One SA client per port: the old one lets go of the Report method.
        *g = None;
        let c = Arc::new(
            SaClient::new(self.agent(), gid, self.timing)
                .map_err(|e| format!("SA client on {}: {e}", self.ip))?,
        );
        *g = Some(c.clone());
        Ok(c)
    }

    /// Forgets the SA client (a new master SM inherits no subscriptions:
    /// the next [`IbPort::sa`] registers afresh). Callers drop their own
    /// handles first.
    pub fn renew_sa(&self) {
        *lock(&self.sa) = None;
    }

    /// An SA error in words, naming the SA.
    pub fn sa_error(&self, sa: &SaClient, e: SaError) -> String {
        format!("SA at {} (from {}): {e}", sa.sa_gid(), self.ip)
    }
}

/// Tries `attempt` along `paths` in order until one connects; a reject
/// (the target answered) ends the walk at once. The errors of the
/// attempts made, in order, when none connected.
pub fn connect_along<P, T>(
    paths: &[P],
    mut attempt: impl FnMut(&P) -> Result<T, rdma_access::CmError>,
) -> Result<T, Vec<rdma_access::CmError>> {
    let mut errs = Vec::new();
    for p in paths {
        match attempt(p) {
            Ok(t) => return Ok(t),
            Err(e) => {
                let rejected = matches!(e, rdma_access::CmError::Rejected { .. });
                errs.push(e);
                if rejected {
                    break;
                }
            }
        }
    }
    Err(errs)
}

/// Logs in by IB CM along paths from the SA (see the module docs).
pub struct SaPathConnector {
    /// The local ib port.
    pub port: Arc<IbPort>,
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
    fn paths(&self) -> Result<Vec<PathRecord>, String> {
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
            return Err(format!(
                "the SA at {} has no path from {} to {} in partition {:04x}",
                sa.sa_gid(),
                self.port.ip(),
                self.dgid,
                self.pkey.0
            ));
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
            let key = srp_initiator::session::pkey_index(&table, self.pkey)
                .map_or(self.pkey, |i| table[usize::from(i)]);
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
                    });
                }
                Err(mut errs) => {
                    if matches!(errs.last(), Some(rdma_access::CmError::Rejected { .. })) {
                        let e = errs.pop().expect("the reject");
                        return Err(crate::connect_error(e));
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
        crate::disconnect_and_wait(self.port.agent(), handle);
    }

    fn form(&self) -> LoginForm {
        LoginForm::IbCm
    }
}

/// srp_daemon's query: every other port whose CapabilityMask has
/// IsDeviceManagementSupported, each with its first path from us in
/// partition `pkey` (any partition when `None`); ports without such a
/// path are left out.
///
/// # Errors
/// The SA did not answer or answered an error.
pub fn dm_ports(port: &IbPort, pkey: Option<Pkey>) -> Result<Vec<PathRecord>, String> {
    let sa = port.sa()?;
    let recs = sa
        .port_info_records(None, Some(rdma_mad::smp::cap::IS_DEVICE_MGMT_SUPPORTED))
        .map_err(|e| port.sa_error(&sa, e))?;
    let me = port.lid();
    let mut out = Vec::new();
    for r in recs.iter().filter(|r| r.lid != me) {
        let paths = sa
            .paths_to_lid(port.agent().gid(), r.lid, pkey)
            .map_err(|e| port.sa_error(&sa, e))?;
        if let Some(p) = paths.first() {
            out.push(*p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_access::CmError;

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
    fn ib_guids_differ_by_address() {
        let a = ib_guid("127.0.140.1".parse().unwrap());
        let b = ib_guid("127.0.140.2".parse().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.0, 0x0002_c903_7f00_8c01);
    }
}
