//! A port on a managed InfiniBand subnet, as its consumers use it.
//!
//! [`IbPort`] is a CA's port in the `ib` personality (a subnet manager
//! gives it a LID, its SM LID and P_Key table and brings it ACTIVE) with
//! what the daemons need on top of [`IbNode`] (the port's SMA and MAD
//! driver):
//! - [`IbPort::wait_active`] waits, bounded, for the SM to activate the
//!   port and says plainly when none did;
//! - [`IbPort::sa`] is the SA client of the port's master SM (its address
//!   is where the SM's Sets came from), made anew when the SM moves; with
//!   it the port is a [`SubnetPort`], the trait the SRP initiator's path
//!   connector and discovery use.
//!
//! The provider's CA must already be in the `ib` personality (for soft
//! RoCE, `SoftRoce::set_personality` before the CA's first open).
//! [`IbPort::join`] is the same for a port whose SMA is another's (the
//! NIC daemon's, `nicd --fabric ib`): QP1 only, and the port's state,
//! LID, SM LID, P_Keys and SM GID read from the provider, as that SMA
//! set them.
//!
//! Partitions on the data path: an initiator's session QP uses the index
//! of its port's P_Key table holding the login's `pkey`; a target's QPs
//! use the index of its table entry matching the REQ's partition key.
//!
//! GUIDs: the daemons give every port the GUID of its address (soft
//! RoCE's `ip_guid`), in either fabric. On a managed subnet the SM keys
//! LIDs by it; a target's id_ext and ioc_guid follow it, and so does the
//! second half of an initiator's port ID, so two hosts are two initiators
//! and two targets two target ports without configuration.

use crate::sa::{SaClient, SaError, SaTiming};
use crate::sma::state;
use crate::{CmAgent, CmError, IbNode, IbNodeError};
use rdma_types::{Gid, Guid, Pkey};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Who runs the port: nobody (`roce`, RDMA CM by IP address, like Linux
/// rxe) or a subnet manager (`ib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// Unmanaged RoCE: GIDs from IP addresses, no SM.
    #[default]
    Roce,
    /// Managed subnet: `ibsm run` configures the port; paths from its SA.
    Ib,
}

/// Why the subnet administrator of a port's subnet could not be asked, or
/// what it answered instead of records.
#[derive(Debug, thiserror::Error)]
pub enum SaPortError {
    /// No subnet manager has configured the port yet: start one that
    /// lists the port (`ibsm run --node <ip>`), or wait for it.
    #[error("port {port}: no SM has configured it")]
    NoSm {
        /// The port, as its owner names it.
        port: String,
    },
    /// The SA client could not register on the port (another client
    /// holds the port's Report method: close it first).
    #[error("SA client on {port}: {source}")]
    Client {
        /// The port.
        port: String,
        /// What the access layer said.
        source: CmError,
    },
    /// The SA did not answer, or answered an error status or a malformed
    /// response; the SM's log says more.
    #[error("SA at {sa} (from {port}): {source}")]
    Query {
        /// The SA's GID.
        sa: Gid,
        /// The port asking.
        port: String,
        /// The query's failure.
        source: SaError,
    },
    /// The SA knows no path from the port to the target in the partition:
    /// the target port is down, or not a member of the partition.
    #[error("the SA at {sa} has no path from {port} to {dgid} in partition {:04x}", pkey.0)]
    NoPath {
        /// The SA's GID.
        sa: Gid,
        /// The port asking.
        port: String,
        /// The target port's GID.
        dgid: Gid,
        /// The partition asked for.
        pkey: Pkey,
    },
}

/// A local port on a managed subnet, as the initiator needs it: its CM
/// agent (the port's MAD driver: CM, DM, SA queries) and the SA client of
/// its current master SM. The daemons' soft RoCE port in the `ib`
/// personality is one ([`IbPort`]).
pub trait SubnetPort: Send + Sync {
    /// The port's CM agent (now: a port made anew, after its NIC's
    /// removal and return, has another).
    fn agent(&self) -> Arc<CmAgent>;
    /// The port's LID.
    fn lid(&self) -> u16;
    /// The master SM's LID as the port knows it (it changes when another
    /// SM takes over).
    fn sm_lid(&self) -> u16;
    /// The port as messages name it (its address).
    fn name(&self) -> String;
    /// The SA client of the current master SM (made anew if the SM moved).
    ///
    /// # Errors
    /// No SM has set the port up yet, or the client cannot register.
    fn sa(&self) -> Result<Arc<SaClient>, SaPortError>;
    /// Forgets the SA client: the next [`SubnetPort::sa`] registers afresh
    /// (a new master SM inherits no subscriptions). Callers drop their
    /// own handles first.
    fn renew_sa(&self);
    /// A failed query of `sa`, naming the SA and this port.
    fn sa_error(&self, sa: &SaClient, source: SaError) -> SaPortError {
        SaPortError::Query {
            sa: sa.sa_gid(),
            port: self.name(),
            source,
        }
    }
}

/// A port in the `ib` personality, ACTIVE (see the module docs).
pub struct IbPort {
    node: Node,
    ip: IpAddr,
    timing: SaTiming,
    sa: Mutex<Option<Arc<SaClient>>>,
}

/// Who answers the port's SMPs.
enum Node {
    /// Our own SMA ([`IbPort::start`]).
    Own(IbNode),
    /// Another's, the NIC daemon's ([`IbPort::join`]): the port as the
    /// SM set it is read from the provider.
    Shared(SharedPort),
}

/// A port whose SMA is another's: our MAD driver on its QP1 and an open
/// of its CA to read the port by.
struct SharedPort {
    p: Arc<dyn verbs::Provider>,
    guid: Guid,
    ca: verbs::CaHandle,
    agent: Arc<CmAgent>,
}

impl SharedPort {
    /// Port 1 as the provider reports it (`None`: the CA is gone).
    fn attr(&self) -> Option<verbs::PortAttr> {
        self.p.query_port(self.ca, rdma_types::PortNum(1)).ok()
    }
}

impl Drop for SharedPort {
    fn drop(&mut self) {
        let _ = self.p.close_ca(self.ca);
    }
}

/// What [`IbPort`] reads of its port, from whichever SMA runs it.
struct PortNow {
    active: bool,
    state: &'static str,
    lid: u16,
    sm_lid: u16,
    sm_gid: Option<Gid>,
    pkeys: Vec<Pkey>,
}

impl Node {
    fn guid(&self) -> Guid {
        match self {
            Node::Own(n) => n.guid(),
            Node::Shared(s) => s.guid,
        }
    }

    fn agent(&self) -> &Arc<CmAgent> {
        match self {
            Node::Own(n) => n.agent(),
            Node::Shared(s) => &s.agent,
        }
    }

    fn now(&self) -> PortNow {
        match self {
            Node::Own(n) => {
                let sma = n.sma();
                let st = sma.port_state();
                PortNow {
                    active: st == state::ACTIVE,
                    state: state::name(st).unwrap_or("in an unknown state"),
                    lid: sma.lid(),
                    sm_lid: sma.sm_lid(),
                    sm_gid: sma.sm_gid(),
                    pkeys: sma.pkeys().to_vec(),
                }
            }
            Node::Shared(s) => match s.attr() {
                Some(a) => PortNow {
                    active: a.state == verbs::PortState::Active,
                    state: match a.state {
                        verbs::PortState::Active => "ACTIVE",
                        verbs::PortState::Init => "INIT",
                        _ => "DOWN",
                    },
                    lid: a.lid.0,
                    sm_lid: a.sm_lid.0,
                    sm_gid: a.sm_gid,
                    pkeys: a.pkeys,
                },
                None => PortNow {
                    active: false,
                    state: "gone (its CA was removed)",
                    lid: 0,
                    sm_lid: 0,
                    sm_gid: None,
                    pkeys: Vec::new(),
                },
            },
        }
    }

    /// Waits at most `wait` for the port to be ACTIVE.
    fn wait_active(&self, wait: Duration) -> bool {
        match self {
            Node::Own(n) => n.sma().wait_state(state::ACTIVE, wait),
            Node::Shared(_) => {
                // The daemon's SMA tells us nothing but port events; a
                // look every 20 ms, bounded by `wait`.
                let end = std::time::Instant::now() + wait;
                loop {
                    if self.now().active {
                        return true;
                    }
                    if std::time::Instant::now() >= end {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why an ib port did not start, come up, or serve a partition.
#[derive(Debug, thiserror::Error)]
pub enum IbPortError {
    /// The provider refused the `ib` personality for the CA: it is not
    /// one of the provider's CAs, or it is open already (the personality
    /// is set before the CA's first open). Its owner sets it before
    /// [`IbPort::start`] (soft RoCE: `SoftRoce::set_personality`) and
    /// reports a refusal with this.
    #[error("start the ib port on {ip}: CA {:#x}: {source}", guid.0)]
    Personality {
        /// The port's address.
        ip: IpAddr,
        /// The CA.
        guid: Guid,
        /// What the provider said.
        source: verbs::VerbsError,
    },
    /// The port's SMA and MAD driver did not start.
    #[error("start the ib port on {ip}: {source}")]
    Node {
        /// The port's address.
        ip: IpAddr,
        /// Why.
        source: IbNodeError,
    },
    /// No subnet manager made the port ACTIVE in time: run one that
    /// lists the port (`ibsm run --node <ip>`) and can reach it.
    #[error(
        "port {ip} (GUID {:016x}) still {state} after {} ms: no subnet manager configured it \
         (is `ibsm run --node {ip}` running and reachable?)",
        guid.0,
        waited.as_millis()
    )]
    NotActive {
        /// The port's address.
        ip: IpAddr,
        /// Its GUID.
        guid: Guid,
        /// The state it is in (DOWN, INIT, ARMED).
        state: &'static str,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The port is ACTIVE but the SA did not list it in time (the SM was
    /// still finishing with it, or its SA did not answer).
    #[error(
        "port {ip} ACTIVE, LID {lid}, but the SA is not ready after {} ms: {}",
        waited.as_millis(),
        last.as_ref().map_or_else(|| "it does not list the port yet".to_string(), ToString::to_string)
    )]
    SaNotReady {
        /// The port's address.
        ip: IpAddr,
        /// Its LID.
        lid: u16,
        /// How long it was waited for.
        waited: Duration,
        /// The last query's failure (`None`: the SA answered without the
        /// port).
        last: Option<Box<SaPortError>>,
    },
    /// The port to join is ACTIVE with no LID: nobody manages it (a NIC
    /// daemon serving the `roce` fabric).
    #[error(
        "port {ip} is not on a managed subnet (ACTIVE with no LID, as a roce port is): run the \
         NIC daemon with --fabric ib, or use the roce fabric"
    )]
    NotManaged {
        /// The port's address.
        ip: IpAddr,
    },
    /// The SM did not put the port in the partition: add the port to it
    /// in the SM's partitions file, or use one of the table's.
    #[error(
        "P_Key {:04x}: port {ip} is not a member of that partition (its P_Key table: {})",
        pkey.0,
        table.iter().map(|k| format!("{:04x}", k.0)).collect::<Vec<_>>().join(", ")
    )]
    NotMember {
        /// The port's address.
        ip: IpAddr,
        /// The partition asked for.
        pkey: Pkey,
        /// The port's P_Key table (valid entries).
        table: Vec<Pkey>,
    },
}

impl IbPort {
    /// Starts CA `guid` at `ip` of `p` (not yet open, already in the `ib`
    /// personality), device management offered if `dm`. The port is INIT
    /// until an SM activates it: see [`IbPort::wait_active`].
    ///
    /// # Errors
    /// The CA is unknown or open, or its port cannot start.
    pub fn start(
        p: Arc<dyn verbs::Provider>,
        guid: Guid,
        ip: IpAddr,
        description: &str,
        dm: bool,
        first_comm_id: u32,
    ) -> Result<IbPort, IbPortError> {
        let node = IbNode::start(p, guid, description, dm, first_comm_id)
            .map_err(|source| IbPortError::Node { ip, source })?;
        Ok(IbPort {
            node: Node::Own(node),
            ip,
            timing: SaTiming::default(),
            sa: Mutex::new(None),
        })
    }

    /// Joins CA `guid` at `ip` of `p`, an `ib` port whose SMA is
    /// another's (the NIC daemon's, `nicd --fabric ib`): our MAD driver
    /// on its QP1 (never its QP0, which that SMA holds), and the port's
    /// state, LID, SM and P_Keys read from the provider, as that SMA set
    /// them. See [`IbPort::wait_active`].
    ///
    /// # Errors
    /// The CA is unknown, or its QP1 cannot be had.
    pub fn join(
        p: Arc<dyn verbs::Provider>,
        guid: Guid,
        ip: IpAddr,
        first_comm_id: u32,
    ) -> Result<IbPort, IbPortError> {
        let node_err = |err| IbPortError::Node {
            ip,
            source: IbNodeError::Open { guid, err },
        };
        let ca = p
            .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
            .map_err(node_err)?;
        let agent = match CmAgent::start_without_qp0(p.clone(), guid, first_comm_id) {
            Ok(a) => a,
            Err(err) => {
                let _ = p.close_ca(ca);
                return Err(IbPortError::Node {
                    ip,
                    source: IbNodeError::Port { guid, err },
                });
            }
        };
        let shared = SharedPort { p, guid, ca, agent };
        // An `ib` port is INIT until an SM activates it, with a LID.
        if shared
            .attr()
            .is_some_and(|a| a.state == verbs::PortState::Active && a.lid.0 == 0)
        {
            return Err(IbPortError::NotManaged { ip });
        }
        Ok(IbPort {
            node: Node::Shared(shared),
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
    pub fn wait_active(&self, wait: Duration) -> Result<(), IbPortError> {
        let end = std::time::Instant::now() + wait;
        if self.node.wait_active(wait) {
            loop {
                let last = match self.sa().and_then(|sa| {
                    sa.node_records(Some(self.lid()))
                        .map_err(|e| self.sa_error(&sa, e))
                }) {
                    Ok(r) if !r.is_empty() => return Ok(()),
                    Ok(_) => None,
                    Err(e) => Some(Box::new(e)),
                };
                if std::time::Instant::now() >= end {
                    return Err(IbPortError::SaNotReady {
                        ip: self.ip,
                        lid: self.lid(),
                        waited: wait,
                        last,
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(IbPortError::NotActive {
            ip: self.ip,
            guid: self.node.guid(),
            state: self.node.now().state,
            waited: wait,
        })
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
        self.node.now().lid
    }

    /// The master SM's LID as the port knows it (it changes when another
    /// SM takes over).
    pub fn sm_lid(&self) -> u16 {
        self.node.now().sm_lid
    }

    /// The P_Keys of the port's table the SM filled in.
    pub fn pkeys(&self) -> Vec<Pkey> {
        self.node
            .now()
            .pkeys
            .into_iter()
            .filter(|k| k.0 & 0x7fff != 0)
            .collect()
    }

    /// `pkey` if the port is a member of that partition (either
    /// membership), else an error naming the table.
    ///
    /// # Errors
    /// The SM did not put the port in the partition.
    pub fn check_pkey(&self, pkey: Pkey) -> Result<(), IbPortError> {
        let table = self.pkeys();
        if table.iter().any(|k| k.0 & 0x7fff == pkey.0 & 0x7fff) {
            return Ok(());
        }
        Err(IbPortError::NotMember {
            ip: self.ip,
            pkey,
            table,
        })
    }

    /// The SA client of the current master SM (made anew if the SM moved).
    ///
    /// # Errors
    /// No SM has set the port yet, or the client cannot register.
    pub fn sa(&self) -> Result<Arc<SaClient>, SaPortError> {
        let gid = self.node.now().sm_gid.ok_or_else(|| SaPortError::NoSm {
            port: self.ip.to_string(),
        })?;
        let mut g = lock(&self.sa);
        if let Some(c) = &*g {
            if c.sa_gid() == gid {
                return Ok(c.clone());
            }
        }
        // One SA client per port: the old one lets go of the Report method.
        *g = None;
        let c = Arc::new(
            SaClient::new(self.agent(), gid, self.timing).map_err(|source| {
                SaPortError::Client {
                    port: self.ip.to_string(),
                    source,
                }
            })?,
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
}

impl SubnetPort for IbPort {
    fn agent(&self) -> Arc<CmAgent> {
        IbPort::agent(self).clone()
    }

    fn lid(&self) -> u16 {
        IbPort::lid(self)
    }

    fn sm_lid(&self) -> u16 {
        IbPort::sm_lid(self)
    }

    fn name(&self) -> String {
        self.ip.to_string()
    }

    fn sa(&self) -> Result<Arc<SaClient>, SaPortError> {
        IbPort::sa(self)
    }

    fn renew_sa(&self) {
        IbPort::renew_sa(self)
    }
}
