//! `srpd`: the resident SRP initiator, what Linux's `ib_srp` is to its
//! `add_target` file.
//!
//! The daemon owns a soft RoCE NIC (one CA per local address) and a CM
//! agent per CA, or a port of an rdma-core device (`srpd --device`, see
//! [`crate::device`]: a real RDMA NIC or Linux rxe, its logins by the
//! kernel's RDMA CM), or both, and keeps logins for as long as it runs.
//! A login is a Linux `ib_srp` login string (`id_ext=…,ioc_guid=…,dest=ip:port` or
//! `…,dgid=…,pkey=…,service_id=…`), written to the control socket by
//! `srp login`. Each login gets a name (given, or `t<N>`) and a directory
//! `<mount root>/<name>` in which every LUN the target shows this initiator
//! appears as a file `lun<N>` (a FUSE mount, see `blockfuse`): the
//! counterpart of the `/dev/sdX` nodes a kernel login creates. Each LUN
//! rides out connection loss with the remote port state machine
//! (`reconnect_delay`, `fast_io_fail_tmo`, `dev_loss_tmo`), and keeps its
//! file across reconnects. `srp logout <name>` unmounts the directory and
//! ends the session; `srp list` shows logins with their channels, credits,
//! port state and LUNs.
//!
//! The files follow the target, as a kernel's SCSI rescan follows it: each
//! login has a follower thread that waits on the login's
//! [`TargetChanges`] (an SRP_AER_REQ, or a unit attention REPORTED LUNS
//! DATA HAS CHANGED or CAPACITY DATA HAS CHANGED seen by any command) and
//! then rescans: REPORT LUNS, and each known LUN looked at again
//! ([`RemoteDisk::recheck`]). A new LUN's file appears, a removed one's
//! goes (descriptors still open on it get `ENODEV`, never another LUN's
//! data), a resized one's size changes. `srp rescan` does the same on
//! demand and answers what changed.
//!
//! Login-string keys and what they do here: `id_ext`, `ioc_guid`, `dest`
//! (`src` picks the local CA: the one with that address; without it, the
//! first, which is the device when there is one), `dgid`/`pkey`/
//! `service_id` (IB CM),
//! `initiator_ext`, `queue_size` (commands per channel), `ch_count`,
//! `cmd_sg_entries`, `max_it_iu_size`, `io_class`, `max_sect` (the largest
//! transfer of one command; longer I/O is split), `max_cmd_per_lun`
//! (commands in flight per LUN), `target_can_queue` (commands in flight
//! over all LUNs of the login), `tl_retry_count` (the QP's transport
//! retry count) and `sg_tablesize` (descriptors per command) are applied
//! as ib_srp applies them (`srp_initiator::login`). `comp_vector` is
//! accepted for compatibility and selects nothing (our NIC has one
//! completion thread per CA); `allow_ext_sg=1` lets the session use
//! external descriptor tables (it seldom needs them: each transfer is one
//! registered buffer).
//!
//! In the `ib` fabric (`srpd --fabric ib`) every port waits at start for
//! the subnet manager to activate it, and a `dgid=…,pkey=…,service_id=…`
//! login goes along the PathRecords the SA gives for that partition and
//! service: the first path, the next on a failure, a fresh query when
//! all failed (`srp_initiator::connectors::SaPathConnector`); `pkey` must be in the port's
//! P_Key table, and the session's QP uses the index holding it (its
//! packets carry that partition's key, so a target QP in another
//! partition drops them).
//!
//! A CA that goes away and comes back keeps its logins: the NIC daemon
//! restarting (`--nicd`) or the rdma-core device deleted and added again
//! (`rdma link delete rxe0`, `rdma link add rxe0 type rxe netdev eth0`).
//! The removal fails the sessions and releases their verbs objects (the
//! kernel lets a deleted device go only once its users did); the LUN
//! files stay and wait or fail as the remote port timers say; a watcher
//! starts the CA's CM service again once it is back, and the LUNs'
//! reconnects log in through it ([`crate::rejoin`]).
//!
//! On an rdma-core device only `dest=` logins are made: IB CM
//! (`service_id=`, `dgid=`) needs the kernel's `ib_cm` and SA, not served
//! yet, so such a login goes to the first soft RoCE CA, and is refused
//! with the reason and the fix when there is none.

use crate::args::SrptdHints;
use crate::device::{DeviceCa, DeviceError};
use crate::rejoin::IbSlot;
use rdma_access::subnet::{IbPort, IbPortError};
use rdma_types::{Guid, PortNum};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use srp_initiator::changes::TargetChanges;
use srp_initiator::disk::QueueLimit;
use srp_initiator::login::{LoginOptions, TargetAddress};
use srp_initiator::path_login::PathLogin;
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::RportConfig;
use srp_initiator::session::Connector;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use verbs::Provider;

/// One request on `srpd`'s control socket (`{"cmd": "..."}`, a line of
/// JSON; the answer is one line, `{"ok": true, "data": ...}` or
/// `{"ok": false, "error": ...}`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum InitRequest {
    /// Logs in with a Linux `ib_srp` login string.
    Login {
        /// The login string.
        target: String,
        /// Name of the login (default `t<N>`).
        name: Option<String>,
    },
    /// Ends a login: unmounts its LUN files and logs out.
    Logout {
        /// The login's name.
        name: String,
    },
    /// The logins, with channels, credits, port state and LUNs.
    List,
    /// Looks at the target(s) again now: LUNs added, removed or resized.
    Rescan {
        /// The login's name (every login if none).
        name: Option<String>,
    },
}

/// How `srpd` runs.
#[derive(Debug, Clone)]
pub struct InitdConfig {
    /// Local addresses, one soft RoCE CA each (the first is the default
    /// when there is no `device`).
    pub ips: Vec<IpAddr>,
    /// A port of an rdma-core device: a CA whose logins go by the kernel's
    /// RDMA CM, the default one (before the soft CAs).
    pub device: Option<rdmacore::DeviceSpec>,
    /// RoCEv2 UDP port.
    pub udp_port: u16,
    /// Path MTU.
    pub mtu: rdma_types::Mtu,
    /// Directory under which each login's LUN files are mounted.
    pub mount_root: PathBuf,
    /// Remote port timers of every LUN.
    pub rport: RportConfig,
    /// How long a login waits for the target's answer.
    pub login_timeout: Duration,
    /// Let other users reach the LUN files.
    pub allow_other: bool,
    /// Who runs the ports: in the `ib` fabric each waits (at most
    /// `sm_wait`) for the SM to activate it, and an IB CM login goes along
    /// PathRecords from the SA (`srp_initiator::connectors::SaPathConnector`).
    pub fabric: rdma_access::subnet::Fabric,
    /// How long `start` waits for the SM in the `ib` fabric.
    pub sm_wait: Duration,
    /// The soft RoCE NIC's options (`srpd` maps the environment onto
    /// them: `rnic::softroce::NicOptions::from_env`).
    pub nic: rnic::softroce::NicOptions,
    /// The soft RoCE CAs are the NIC daemon's at `ips`, through its
    /// socket here, instead of a NIC of srpd's own (on the `ib` fabric
    /// the daemon's must be `nicd --fabric ib`; its SMAs run the ports).
    pub nicd: Option<PathBuf>,
    /// The CAs at `ips` are our soft iWARP NIC's (`srpd --iwarp`, see
    /// [`crate::iwarp`]) instead of soft RoCE's: RDMA CM logins only.
    pub iwarp: bool,
}

/// One login: its path, its LUNs and their files. Shared by the registry
/// and the login's follower thread.
struct Login {
    name: String,
    string: String,
    opts: LoginOptions,
    path: Arc<PathLogin>,
    /// `target_can_queue`: shared by every LUN of the login, across
    /// reconnects and rescans.
    target_queue: Option<Arc<QueueLimit>>,
    rport: RportConfig,
    /// What the login's sessions report changed (the follower waits on it).
    changes: Arc<TargetChanges>,
    /// The LUNs, by number.
    luns: Mutex<Vec<(u16, Arc<RemoteDisk>)>>,
    /// The LUN files (taken at logout).
    mount: Mutex<Option<blockfuse::Mount>>,
    dir: PathBuf,
    /// Held across a rescan: the follower's and `srp rescan`'s take turns.
    rescanning: Mutex<()>,
}

/// A login in the registry, with its follower thread.
struct Entry {
    login: Arc<Login>,
    follower: Option<std::thread::JoinHandle<()>>,
}

/// What one rescan found and did.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Rescan {
    /// The login.
    pub name: String,
    /// Where its LUN files are.
    pub dir: PathBuf,
    /// LUNs that appeared: (LUN, bytes).
    pub added: Vec<(u16, u64)>,
    /// LUNs that went.
    pub removed: Vec<u16>,
    /// LUNs whose size changed: (LUN, bytes before, bytes now).
    pub resized: Vec<(u16, u64, u64)>,
    /// LUNs that could not be opened or looked at: (LUN, why).
    pub failed: Vec<(u16, String)>,
}

impl Rescan {
    /// Whether anything changed or failed.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty()
            && self.removed.is_empty()
            && self.resized.is_empty()
            && self.failed.is_empty())
    }

    /// What changed, in words, one line each (`srpd`'s log and `srp
    /// rescan`'s answer).
    pub fn lines(&self) -> Vec<String> {
        let name = &self.name;
        let size = rdma_types::units::format_size;
        let mut out = Vec::new();
        for (n, b) in &self.added {
            out.push(format!(
                "{name}: LUN {n} appeared ({}), file {}",
                size(*b),
                self.dir.join(lun_file(*n)).display()
            ));
        }
        for n in &self.removed {
            out.push(format!("{name}: LUN {n} went away; its file is removed"));
        }
        for (n, a, b) in &self.resized {
            out.push(format!(
                "{name}: LUN {n} resized from {} to {}",
                size(*a),
                size(*b)
            ));
        }
        for (n, e) in &self.failed {
            out.push(format!("{name}: LUN {n}: {e}"));
        }
        out
    }
}

/// One local CA logins leave from.
struct LocalCa {
    /// A soft RoCE CA's address (one); a device's are asked for each
    /// time ([`LocalCa::addrs`]).
    addrs: Vec<IpAddr>,
    guid: Guid,
    port: PortNum,
    /// What its sessions make their verbs objects on: a client of an
    /// access layer, which tracks every object they make.
    sessions: Arc<dyn Provider>,
    via: Via,
}

/// How a CA's logins reach the target.
enum Via {
    /// Our soft RoCE NIC (or the NIC daemon's): our CM agent on its QP1
    /// (a new one after the daemon's restart, `crate::rejoin`).
    Soft {
        agent: Arc<crate::rejoin::AgentSlot>,
        /// The port on the managed subnet (`ib` fabric; a new one after
        /// the daemon's restart, `crate::rejoin`).
        ib: Option<Arc<crate::rejoin::IbSlot>>,
    },
    /// An rdma-core device: the kernel's RDMA CM.
    Device(DeviceCa),
    /// CA `k` of our soft iWARP NIC: RDMA CM over TCP and MPA.
    Iwarp {
        nic: Arc<crate::iwarp::IwarpCas>,
        k: usize,
    },
}

impl LocalCa {
    /// Its addresses, which `src=` picks by: a device's as they are now
    /// (it may come back from a removal with others).
    fn addrs(&self) -> Vec<IpAddr> {
        match &self.via {
            Via::Device(d) => d.addresses(),
            Via::Soft { .. } | Via::Iwarp { .. } => self.addrs.clone(),
        }
    }

    /// The CA in words: `127.0.0.2`, `rxe0:1 (10.0.0.2)`.
    fn name(&self) -> String {
        let addrs = || {
            self.addrs()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &self.via {
            Via::Soft { .. } => addrs(),
            Via::Iwarp { .. } => format!("{} (iWARP)", addrs()),
            Via::Device(d) => format!("{}:{} ({})", d.name(), self.port.0, addrs()),
        }
    }
}

/// The soft RoCE NIC's access layer.
struct SoftNic {
    access: rdma_access::resource::AccessLayer,
    /// The client the CM agents are tracked in: their CM ids, MAD agents
    /// and SA subscriptions, and (soft RoCE fabric) their QP1 objects.
    /// Closed at shutdown, once the logins are gone.
    cm: Arc<rdma_access::resource::TrackedProvider>,
    /// The NIC daemon's process ID, when the NIC is its.
    nicd_pid: Option<u32>,
}

/// The running initiator daemon.
pub struct Initd {
    cfg: InitdConfig,
    /// The soft RoCE NIC, when srpd has CAs on it (`--ip`).
    soft: Option<SoftNic>,
    /// The soft iWARP NIC, when srpd has CAs on it (`--ip` with `--iwarp`).
    iwarp: Option<Arc<crate::iwarp::IwarpCas>>,
    /// The device CA first (when there is one), then the soft ones.
    cas: Vec<LocalCa>,
    logins: Mutex<BTreeMap<String, Entry>>,
    /// Logins in progress, by name, so two requests cannot take one name.
    pending: Mutex<Vec<String>>,
    next: Mutex<u32>,
    /// Ends the watcher.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The watcher of CAs that go and come back (the NIC daemon's, an
    /// rdma-core device: `crate::rejoin`), joined at shutdown.
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Initd {
    /// The NIC daemon's process ID, when the soft RoCE CAs are its.
    pub fn nicd_pid(&self) -> Option<u32> {
        self.soft.as_ref().and_then(|s| s.nicd_pid)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why [`Initd::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum InitdStartError {
    #[error("srpd needs a CA: a local address (--ip) or an rdma-core device (--device)")]
    NoAddress,
    /// `--fabric ib` with a device: that fabric is our soft NIC's.
    #[error(
        "--fabric ib runs our soft RoCE ports on a subnet our SM manages; an rdma-core device's \
         ports are the kernel's: drop --fabric ib to use --device"
    )]
    IbFabricDevice,
    /// `--fabric ib` or `--nicd` with `--iwarp`.
    #[error(
        "{0} does not go with --iwarp: it is a soft RoCE NIC's (iWARP has no subnet manager \
         and no NIC daemon); drop {0}, or --iwarp"
    )]
    IwarpWith(&'static str),
    /// The soft iWARP NIC's addresses.
    #[error(transparent)]
    Iwarp(#[from] crate::iwarp::IwarpError),
    /// The rdma-core device (libibverbs missing, no such device, no
    /// RDMA CM there).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The NIC daemon is not there, serves no NIC at an address, or was
    /// asked for the `ib` fabric (in words).
    #[error("{0}")]
    Nicd(String),
    #[error("mount root {} is not a directory", .0.display())]
    MountRoot(PathBuf),
    /// The reconnect timers (`--reconnect-delay` and the others).
    #[error(transparent)]
    Rport(#[from] srp_initiator::rport::RportConfigError),
    /// An `ib` fabric port (no subnet manager, for one).
    #[error(transparent)]
    IbPort(#[from] IbPortError),
    /// A local address whose RoCEv2 port is taken, or not this host's.
    #[error(transparent)]
    LocalAddr(#[from] crate::args::LocalAddrError),
    #[error("start the CM agent on {ip}: {source}")]
    CmAgent {
        ip: IpAddr,
        #[source]
        source: rdma_access::CmError,
    },
    #[error("track the CM agent on {ip}: {source}")]
    TrackCmAgent {
        ip: IpAddr,
        #[source]
        source: rdma_access::CmError,
    },
    /// The thread that follows CAs going and coming back.
    #[error("cannot start the thread that follows CAs going and coming back: {0}")]
    Watcher(#[source] std::io::Error),
}

/// Why a control request of srpd (`srp login`, `srp logout`) failed.
#[derive(Debug, thiserror::Error)]
pub enum InitdError {
    #[error("login string: {0}")]
    LoginString(#[source] srp_initiator::login::LoginError),
    #[error(
        "login name `{0}`: use 1 to 64 letters, digits, `-`, `_` or `.`, not starting with `.`"
    )]
    BadName(String),
    #[error("a login named `{0}` exists")]
    NameTaken(String),
    #[error("src={src}: srpd has no CA with that address (it has {has})")]
    NoSuchSource { src: IpAddr, has: String },
    /// A login the device CA cannot make (IB CM).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A login an iWARP CA cannot make (IB CM).
    #[error(transparent)]
    Iwarp(#[from] crate::iwarp::IwarpError),
    /// The login's partition is not in the port's P_Key table.
    #[error(transparent)]
    Pkey(#[from] IbPortError),
    /// No channel to the target could be made.
    #[error("{0}")]
    Session(#[source] std::io::Error),
    #[error("REPORT LUNS: {0}")]
    ReportLuns(#[source] std::io::Error),
    #[error("open LUN {lun}: {source}")]
    OpenLun {
        lun: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("create {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mount {}: {source}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no login named `{0}`")]
    NoLogin(String),
    #[error("unmount {}: {source}", path.display())]
    Unmount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A login name: a plain file name of letters, digits, `-`, `_` and `.`.
fn check_name(name: &str) -> Result<(), InitdError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(InitdError::BadName(name.to_string()))
    }
}

impl Initd {
    /// Starts the device's RDMA CM (with `device`), and the soft RoCE NIC
    /// and a CM agent on every local address.
    ///
    /// # Errors
    /// No CA, a NIC, device or CM agent that cannot start, or a mount
    /// root that is not a directory.
    pub fn start(cfg: InitdConfig) -> Result<Initd, InitdStartError> {
        if cfg.ips.is_empty() && cfg.device.is_none() {
            return Err(InitdStartError::NoAddress);
        }
        if !cfg.mount_root.is_dir() {
            return Err(InitdStartError::MountRoot(cfg.mount_root.clone()));
        }
        cfg.rport.validate()?;
        let ib = cfg.fabric == rdma_access::subnet::Fabric::Ib;
        if ib && cfg.device.is_some() {
            return Err(InitdStartError::IbFabricDevice);
        }
        if cfg.iwarp && ib {
            return Err(InitdStartError::IwarpWith("--fabric ib"));
        }
        if cfg.iwarp && cfg.nicd.is_some() {
            return Err(InitdStartError::IwarpWith("--nicd"));
        }
        let mut cas = Vec::new();
        // What the watcher brings back after a CA's removal and return.
        let mut comebacks: Vec<Box<dyn crate::rejoin::Comeback>> = Vec::new();
        if let Some(spec) = &cfg.device {
            let dev = DeviceCa::open(spec)?;
            comebacks.push(dev.comeback());
            cas.push(LocalCa {
                addrs: Vec::new(),
                guid: dev.guid(),
                port: dev.port(),
                sessions: dev.sessions().clone(),
                via: Via::Device(dev),
            });
        }
        let mut iwarp = None;
        let soft = if cfg.ips.is_empty() {
            None
        } else if cfg.iwarp {
            let nic = Arc::new(crate::iwarp::IwarpCas::open(
                &cfg.ips,
                iwarp_tcp::NicOptions::default(),
            )?);
            for (k, (ip, guid, _)) in nic.cas().iter().enumerate() {
                cas.push(LocalCa {
                    addrs: vec![*ip],
                    guid: *guid,
                    port: PortNum(1),
                    sessions: nic.sessions().clone(),
                    via: Via::Iwarp {
                        nic: nic.clone(),
                        k,
                    },
                });
            }
            iwarp = Some(nic);
            None
        } else {
            Some(Initd::start_soft(&cfg, &mut cas, &mut comebacks)?)
        };
        for ca in &cas {
            if let Via::Soft { ib: Some(p), .. } = &ca.via {
                p.get().wait_active(cfg.sm_wait)?;
            }
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = if comebacks.is_empty() {
            None
        } else {
            Some(crate::rejoin::watch(comebacks, stop.clone()).map_err(InitdStartError::Watcher)?)
        };
        Ok(Initd {
            cfg,
            soft,
            iwarp,
            cas,
            logins: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(Vec::new()),
            next: Mutex::new(0),
            stop,
            watcher: Mutex::new(watcher),
        })
    }

    /// The soft RoCE NIC with a CA and a CM agent on every local address
    /// (added to `cas`).
    fn start_soft(
        cfg: &InitdConfig,
        cas: &mut Vec<LocalCa>,
        comebacks: &mut Vec<Box<dyn crate::rejoin::Comeback>>,
    ) -> Result<SoftNic, InitdStartError> {
        let ib = cfg.fabric == rdma_access::subnet::Fabric::Ib;
        // Every port has the GUID of its address, in either fabric.
        let soft = rnic::softroce::SoftCa::at_each(&cfg.ips);
        // The NIC daemon's NIC at the addresses, or one of our own.
        let mut nicd_pid = None;
        let mut daemon = None;
        let (provider, own): (Arc<dyn Provider>, _) = match &cfg.nicd {
            Some(socket) => {
                let mut client = None;
                for ip in &cfg.ips {
                    client = Some(
                        nicd::connect_at(socket, *ip, Some(cfg.fabric))
                            .map_err(InitdStartError::Nicd)?
                            .0,
                    );
                }
                let client = client.ok_or(InitdStartError::NoAddress)?;
                nicd_pid = Some(client.daemon_pid());
                daemon = Some(client.clone());
                (nicd::data_path(client, nicd::data_here()), None)
            }
            None => {
                crate::args::check_local(&cfg.ips, cfg.udp_port)?;
                let nic = rnic::softroce::SoftRoce::with_options(
                    soft.clone(),
                    cfg.udp_port,
                    cfg.mtu,
                    cfg.nic.clone(),
                );
                (nic.clone() as Arc<dyn Provider>, Some(nic))
            }
        };
        let access = rdma_access::resource::AccessLayer::new(provider.clone());
        let cm = access.client("cm").into_provider();
        let sessions: Arc<dyn Provider> = access.client("srp initiator").into_provider();
        for (k, ca) in soft.iter().enumerate() {
            let first_comm_id = (std::process::id() << 8) | k as u32;
            let (agent, port) = if let (true, Some(own)) = (ib, &own) {
                own.set_personality(ca.guid, rnic::softroce::Personality::Ib)
                    .map_err(|source| IbPortError::Personality {
                        ip: ca.ip,
                        guid: ca.guid,
                        source,
                    })?;
                let port = IbPort::start(
                    own.clone(),
                    ca.guid,
                    ca.ip,
                    &format!("srpd {}", ca.ip),
                    false,
                    first_comm_id,
                )?;
                (port.agent().clone(), Some(IbSlot::new(Arc::new(port))))
            } else if ib {
                // The NIC daemon's ib port: its SMA is the daemon's; we
                // take a place at its QP1.
                let port = IbPort::join(provider.clone(), ca.guid, ca.ip, first_comm_id)?;
                (port.agent().clone(), Some(IbSlot::new(Arc::new(port))))
            } else {
                let agent = rdma_access::CmAgent::start(cm.clone(), ca.guid, first_comm_id)
                    .map_err(|source| InitdStartError::CmAgent { ip: ca.ip, source })?;
                (agent, None)
            };
            agent
                .track_in(cm.client())
                .map_err(|source| InitdStartError::TrackCmAgent { ip: ca.ip, source })?;
            let agent = crate::rejoin::AgentSlot::new(agent);
            // Through the daemon, a new CM agent on each CA when it comes
            // back after a restart (on the ib fabric, a port that joins the
            // subnet anew).
            match (&daemon, &port) {
                (Some(client), Some(port)) => comebacks.push(Box::new(crate::rejoin::WatchedIb {
                    client: client.clone(),
                    ip: ca.ip,
                    guid: ca.guid,
                    port: port.clone(),
                    slot: agent.clone(),
                    cm: cm.clone(),
                    first_comm_id,
                    round: 0,
                    pending: None,
                })),
                (Some(_), None) => comebacks.push(Box::new(crate::rejoin::Watched {
                    ip: ca.ip,
                    guid: ca.guid,
                    slot: agent.clone(),
                    first_comm_id,
                    cm: cm.clone(),
                    round: 0,
                })),
                (None, _) => {}
            }
            cas.push(LocalCa {
                addrs: vec![ca.ip],
                guid: ca.guid,
                port: PortNum(1),
                sessions: sessions.clone(),
                via: Via::Soft { agent, ib: port },
            });
        }
        Ok(SoftNic {
            access,
            cm,
            nicd_pid,
        })
    }

    /// The CAs in words, the default first: `rxe0:1 (10.0.0.2), 127.0.0.2`.
    pub fn cas(&self) -> String {
        self.cas
            .iter()
            .map(LocalCa::name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Answers one control request.
    ///
    /// # Errors
    /// The request failed; the reason in words.
    pub fn handle(&self, req: InitRequest) -> Result<Value, InitdError> {
        match req {
            InitRequest::Login { target, name } => self.login(&target, name),
            InitRequest::Logout { name } => self.logout(&name),
            InitRequest::List => Ok(self.list()),
            InitRequest::Rescan { name } => self.rescan_request(name),
        }
    }

    fn rescan_request(&self, name: Option<String>) -> Result<Value, InitdError> {
        let logins: Vec<Arc<Login>> = {
            let all = lock(&self.logins);
            match &name {
                Some(n) => vec![all
                    .get(n)
                    .ok_or_else(|| InitdError::NoLogin(n.clone()))?
                    .login
                    .clone()],
                None => all.values().map(|e| e.login.clone()).collect(),
            }
        };
        let mut out = Vec::new();
        for l in logins {
            out.push(serde_json::to_value(rescan(&l)?).unwrap_or_default());
        }
        Ok(Value::Array(out))
    }

    fn pick_name(&self, name: Option<String>) -> Result<String, InitdError> {
        let logins = lock(&self.logins);
        let mut pending = lock(&self.pending);
        let name = match name {
            Some(n) => {
                check_name(&n)?;
                if logins.contains_key(&n) || pending.contains(&n) {
                    return Err(InitdError::NameTaken(n));
                }
                n
            }
            None => {
                let mut next = lock(&self.next);
                loop {
                    let n = format!("t{}", *next);
                    *next += 1;
                    if !logins.contains_key(&n) && !pending.contains(&n) {
                        break n;
                    }
                }
            }
        };
        pending.push(name.clone());
        Ok(name)
    }

    fn login(&self, target: &str, name: Option<String>) -> Result<Value, InitdError> {
        let opts = LoginOptions::parse(target).map_err(InitdError::LoginString)?;
        let name = self.pick_name(name)?;
        let result = self.login_named(&name, target, &opts);
        lock(&self.pending).retain(|n| n != &name);
        let login = Arc::new(result?);
        let answer = login_json(&login);
        let follower = follow(login.clone());
        lock(&self.logins).insert(
            name,
            Entry {
                login,
                follower: Some(follower),
            },
        );
        Ok(answer)
    }

    /// The CA a login leaves from, the path's source in words, and the
    /// connector that logs in: by RDMA CM from the CA `src=` names (the
    /// default CA without it), by IB CM from the first soft RoCE CA.
    fn connector_for(
        &self,
        address: &TargetAddress,
    ) -> Result<(&LocalCa, String, Arc<dyn Connector>), InitdError> {
        let timeout = self.cfg.login_timeout;
        match address {
            TargetAddress::RdmaCm { dest, src } => {
                let ca = match src {
                    Some(ip) => self
                        .cas
                        .iter()
                        .find(|c| c.addrs().contains(ip))
                        .ok_or_else(|| InitdError::NoSuchSource {
                            src: *ip,
                            has: self.cas(),
                        })?,
                    None => &self.cas[0],
                };
                let (from, conn): (IpAddr, Arc<dyn Connector>) = match &ca.via {
                    Via::Soft { agent, .. } => {
                        let from = ca.addrs[0];
                        let conn = Arc::new(srp_initiator::connectors::RdmaCmConnector {
                            agent: agent.clone(),
                            src: from,
                            dst: *dest,
                            timeout,
                        });
                        (from, conn)
                    }
                    Via::Device(d) => {
                        let from = d.source(*src)?;
                        (from, d.connector(from, *dest, timeout))
                    }
                    Via::Iwarp { nic, k } => (ca.addrs[0], nic.connector(*k, *dest, timeout)),
                };
                let name = match &ca.via {
                    Via::Soft { .. } => from.to_string(),
                    Via::Iwarp { .. } => format!("{from} (iWARP)"),
                    Via::Device(d) => format!("{}:{from}", d.name()),
                };
                Ok((ca, name, Arc::new(SrptdHints(conn))))
            }
            TargetAddress::IbCm {
                dgid,
                service_id,
                pkey,
            } => {
                let soft = self.cas.iter().find_map(|c| match &c.via {
                    Via::Soft { agent, ib } => Some((c, agent.get(), ib)),
                    Via::Device(_) | Via::Iwarp { .. } => None,
                });
                let Some((ca, agent, ib)) = soft else {
                    let what = format!(
                        "service_id={service_id:016x},dgid={}",
                        srp_initiator::login::dgid_hex(dgid)
                    );
                    if self.iwarp.is_some() {
                        return Err(crate::iwarp::IwarpError::IbCm { what }.into());
                    }
                    let dev = match self.cas.first().map(|c| &c.via) {
                        Some(Via::Device(d)) => d.name().to_string(),
                        _ => "?".to_string(),
                    };
                    return Err(DeviceError::IbCm {
                        what,
                        device: dev,
                        soft: "; or give srpd --ip too: a soft RoCE CA makes IB CM logins",
                    }
                    .into());
                };
                let conn: Arc<dyn Connector> = match ib {
                    // A managed subnet: paths from the SA, in the login's
                    // partition.
                    Some(port) => {
                        port.get().check_pkey(*pkey)?;
                        Arc::new(srp_initiator::connectors::SaPathConnector {
                            port: port.clone(),
                            dgid: *dgid,
                            pkey: *pkey,
                            service_id: *service_id,
                            timeout,
                            max_paths: 4,
                        })
                    }
                    None => Arc::new(srp_initiator::connectors::IbCmConnector {
                        agent: agent.clone(),
                        dgid: *dgid,
                        service_id: *service_id,
                        timeout,
                    }),
                };
                Ok((ca, ca.addrs[0].to_string(), Arc::new(SrptdHints(conn))))
            }
        }
    }

    fn login_named(&self, name: &str, target: &str, o: &LoginOptions) -> Result<Login, InitdError> {
        let (ca, src, connector) = self.connector_for(&o.address)?;
        // Every key of the login string takes effect here, as in ib_srp
        // (see `LoginOptions::session_config` and `apply_to_disk`).
        let mut scfg = o.session_config(ca.guid);
        scfg.port = ca.port;
        let changes = Arc::new(TargetChanges::new());
        scfg.changes = Some(changes.clone());
        let ch_count = o.ch_count.unwrap_or(1).clamp(1, 64) as u16;
        let path = Arc::new(
            PathLogin::new(
                format!("{src} -> {}", address_text(&o.address)),
                ca.sessions.clone(),
                ca.guid,
                connector,
                scfg,
            )
            .with_ch_count(ch_count),
        );
        let session = path.session().map_err(InitdError::Session)?;
        let lun_ids = srp_initiator::disk::report_luns(&session).map_err(InitdError::ReportLuns)?;
        let mut login = Login {
            name: name.to_string(),
            string: target.to_string(),
            opts: o.clone(),
            path,
            // `target_can_queue` bounds all LUNs of this login together,
            // `max_cmd_per_lun` each one; both outlive reconnects.
            target_queue: o.target_queue(),
            rport: self.cfg.rport,
            changes,
            luns: Mutex::new(Vec::new()),
            mount: Mutex::new(None),
            dir: self.cfg.mount_root.join(name),
            rescanning: Mutex::new(()),
        };
        let mut luns = Vec::new();
        for n in lun_ids {
            let d = login
                .open_lun(n)
                .map_err(|source| InitdError::OpenLun { lun: n, source })?;
            luns.push((n, d));
        }
        let dir = login.dir.clone();
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && is_empty_dir(&dir) => {}
            Err(source) => return Err(InitdError::CreateDir { path: dir, source }),
        }
        let devices: Vec<(String, Arc<dyn blockload::BlockDevice>)> = luns
            .iter()
            .map(|(n, d)| {
                (
                    format!("lun{n}"),
                    d.clone() as Arc<dyn blockload::BlockDevice>,
                )
            })
            .collect();
        // Mounted even with no LUN yet: a rescan may bring some.
        let opts = blockfuse::Options {
            allow_other: self.cfg.allow_other,
            fsname: format!("srp:{name}"),
            ..Default::default()
        };
        let mount = match blockfuse::mount(&dir, devices, opts) {
            Ok(m) => m,
            Err(source) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(InitdError::Mount { path: dir, source });
            }
        };
        login.luns = Mutex::new(luns);
        login.mount = Mutex::new(Some(mount));
        Ok(login)
    }

    fn logout(&self, name: &str) -> Result<Value, InitdError> {
        let entry = lock(&self.logins)
            .remove(name)
            .ok_or_else(|| InitdError::NoLogin(name.to_string()))?;
        let dir = entry.login.dir.clone();
        end_login(entry)?;
        Ok(json!({ "name": name, "unmounted": dir }))
    }

    fn list(&self) -> Value {
        let logins = lock(&self.logins);
        Value::Array(logins.values().map(|e| login_json(&e.login)).collect())
    }

    /// Objects the sessions and the CM agents hold now: verbs objects,
    /// CM ids, MAD agents, SA subscriptions (0 once every login is gone
    /// and [`Initd::shutdown`] closed the agents).
    /// On a device CA, its sessions' verbs objects and the connections its
    /// RDMA CM holds.
    pub fn verbs_objects(&self) -> i64 {
        let soft = self.soft.as_ref().map_or(0, |s| s.access.live_total())
            + self.iwarp.as_ref().map_or(0, |n| n.live());
        let devices: i64 = self
            .cas
            .iter()
            .map(|c| match &c.via {
                Via::Device(d) => d.live(),
                Via::Soft { .. } | Via::Iwarp { .. } => 0,
            })
            .sum();
        soft + devices
    }

    /// Live objects of one kind (e.g. `Kind::CmId`) on the soft RoCE NIC.
    pub fn live(&self, kind: rdma_access::resource::Kind) -> i64 {
        self.soft.as_ref().map_or(0, |s| s.access.live(kind))
    }

    /// Logs every login out (at exit), then closes the CM agents' client
    /// (connections in timewait ended, listens, subscriptions and MAD
    /// agents gone, then their QP1 objects); returns how many logins
    /// there were. No login can be made afterwards.
    pub fn shutdown(&self) -> usize {
        let all: Vec<Entry> = std::mem::take(&mut *lock(&self.logins))
            .into_values()
            .collect();
        let n = all.len();
        for l in all {
            if let Err(e) = end_login(l) {
                eprintln!("srpd: {e}");
            }
        }
        // No CM service comes back after this.
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = lock(&self.watcher).take() {
            let _ = t.join();
        }
        if let Some(s) = &self.soft {
            s.cm.client().close();
        }
        for c in &self.cas {
            if let Via::Device(d) = &c.via {
                d.close();
            }
        }
        n
    }
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_none())
}

fn address_text(a: &TargetAddress) -> String {
    match a {
        TargetAddress::RdmaCm { dest, .. } => dest.to_string(),
        TargetAddress::IbCm {
            dgid, service_id, ..
        } => format!("{dgid} service {service_id:016x}"),
    }
}

/// Ends a login: its follower first (a rescan under way finishes), then
/// the files, then the channels.
fn end_login(mut e: Entry) -> Result<(), InitdError> {
    let l = &e.login;
    l.changes.close();
    if let Some(t) = e.follower.take() {
        let _ = t.join();
    }
    let dir = l.dir.clone();
    if let Some(m) = lock(&l.mount).take() {
        m.unmount().map_err(|source| InitdError::Unmount {
            path: dir.clone(),
            source,
        })?;
    }
    let _ = std::fs::remove_dir(&dir);
    // Dropping the disks and the path ends the channels (DREQ).
    drop(std::mem::take(&mut *lock(&l.luns)));
    Ok(())
}

impl Login {
    /// Opens LUN `n` of this login as a reconnecting disk, with the login
    /// string's keys applied.
    fn open_lun(&self, n: u16) -> std::io::Result<Arc<RemoteDisk>> {
        let p = self.path.clone();
        let opts = self.opts.clone();
        let lun_queue = self.opts.lun_queue();
        let target_queue = self.target_queue.clone();
        let open = Box::new(move || {
            let mut ch = p.channels()?;
            let first = ch.remove(0);
            let disk = srp_initiator::disk::Disk::open(first, n)?.with_channels(ch);
            Ok(opts.apply_to_disk(disk, lun_queue.clone(), target_queue.clone()))
        });
        RemoteDisk::open(open, self.rport).map(Arc::new)
    }
}

/// The file of LUN `n`.
fn lun_file(n: u16) -> String {
    format!("lun{n}")
}

/// Looks at the target again and makes the files match it: REPORT LUNS,
/// then every known LUN rechecked (a LUN that now names another LU is
/// taken away and opened anew), new ones opened, gone ones removed.
/// Commands go out with no lock of the login held but `rescanning`, so
/// `srp list` answers meanwhile.
fn rescan(l: &Login) -> Result<Rescan, InitdError> {
    let _one = lock(&l.rescanning);
    let session = l.path.session().map_err(InitdError::Session)?;
    let now = srp_initiator::disk::report_luns(&session).map_err(InitdError::ReportLuns)?;
    drop(session);
    let known: Vec<(u16, Arc<RemoteDisk>)> = lock(&l.luns).clone();
    let mut r = Rescan {
        name: l.name.clone(),
        dir: l.dir.clone(),
        ..Default::default()
    };
    let bytes = |d: &RemoteDisk, blocks: u64| blocks.saturating_mul(u64::from(d.info().block_size));
    let mut gone = Vec::new();
    for (n, d) in &known {
        if !now.contains(n) {
            gone.push(*n);
            continue;
        }
        let before = d.blocks();
        match d.recheck() {
            Ok(blocks) if blocks != before => {
                r.resized.push((*n, bytes(d, before), bytes(d, blocks)));
            }
            Ok(_) => {}
            // Another LU under this number: the old file goes, and the
            // new LU gets a file of its own below.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(login = %l.name, lun = n, "{e}");
                gone.push(*n);
            }
            Err(e) => r.failed.push((*n, e.to_string())),
        }
    }
    let mut fresh = Vec::new();
    for &n in &now {
        if known.iter().any(|(k, _)| *k == n) && !gone.contains(&n) {
            continue;
        }
        match l.open_lun(n) {
            Ok(d) => fresh.push((n, d)),
            Err(e) => r.failed.push((n, format!("open: {e}"))),
        }
    }
    let mut dropped = Vec::new();
    {
        let mount = lock(&l.mount);
        let mut luns = lock(&l.luns);
        for n in gone {
            if let Some(m) = mount.as_ref() {
                m.remove(&lun_file(n));
            }
            if let Some(at) = luns.iter().position(|(k, _)| *k == n) {
                dropped.push(luns.remove(at));
            }
            if !now.contains(&n) {
                r.removed.push(n);
            }
        }
        for &(n, ..) in &r.resized {
            if let Some(m) = mount.as_ref() {
                m.resized(&lun_file(n));
            }
        }
        for (n, d) in fresh {
            let dev = d.clone() as Arc<dyn blockload::BlockDevice>;
            if let Some(Err(e)) = mount.as_ref().map(|m| m.add(&lun_file(n), dev)) {
                r.failed.push((n, format!("file: {e}")));
                continue;
            }
            r.added.push((n, bytes(&d, d.blocks())));
            luns.push((n, d));
        }
        luns.sort_by_key(|(n, _)| *n);
    }
    // The disks go (their threads joined) with no lock held.
    drop(dropped);
    Ok(r)
}

/// How long the follower waits between looks when nothing was said: a
/// target that sends no AER and a login with no I/O still show changes
/// within this.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(30);

/// The login's follower: rescans whenever its sessions report a change
/// (and every [`FOLLOW_INTERVAL`]), until the login ends.
fn follow(l: Arc<Login>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("srpd-follow-{}", l.name))
        .spawn(move || {
            let mut seen = l.changes.generation();
            while let Some(g) = l.changes.wait_past(seen, FOLLOW_INTERVAL) {
                seen = g;
                match rescan(&l) {
                    // srpd's stdout, where operators and scripts read its
                    // other events.
                    Ok(r) => r.lines().iter().for_each(|t| println!("srpd: {t}")),
                    Err(e) => tracing::warn!(login = %l.name, "rescan: {e}"),
                }
            }
        })
        .expect("spawn the follower thread")
}

fn login_json(l: &Login) -> Value {
    let name = &l.name;
    let channels: Vec<Value> = l
        .path
        .live_channels()
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n = s.negotiated();
            // The QP's transport retry count (tl_retry_count), as the
            // provider holds it.
            let retry_cnt = s.query_qp().ok().and_then(|a| a.retry_cnt);
            json!({
                "channel": k,
                "closed": s.is_closed(),
                "credits": s.credits(),
                "req_lim": n.req_lim,
                "max_it_iu_len": n.max_it_iu_len,
                "immediate_data": n.imm_data_offset.is_some(),
                "completed": s.stats().completed,
                "retry_cnt": retry_cnt,
            })
        })
        .collect();
    let luns: Vec<Value> = lock(&l.luns)
        .iter()
        .map(|(n, d)| {
            let i = d.info();
            let st = d.stats();
            json!({
                "lun": n,
                "file": l.dir.join(format!("lun{n}")),
                "vendor": i.vendor,
                "product": i.product,
                "blocks": d.blocks(),
                "block_size": i.block_size,
                "naa": i.naa,
                "state": format!("{:?}", st.state).to_lowercase(),
                "failures": st.failures,
                "reconnects": st.reconnects,
            })
        })
        .collect();
    json!({
        "name": name,
        "target": l.string,
        "path": l.path.name,
        "dir": l.dir,
        "channels": channels,
        "luns": luns,
    })
}

/// Serves `srpd`'s control socket: one JSON request per line, one answer
/// per line; only the daemon's own user may connect.
pub fn serve_control(
    initd: Arc<Initd>,
    listener: std::os::unix::net::UnixListener,
) -> std::thread::JoinHandle<()> {
    daemon_ctl::serve_lines(listener, "srpd", move |line| {
        match serde_json::from_str::<InitRequest>(line) {
            Ok(req) => match initd.handle(req) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e.to_string() }),
            },
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
        }
    })
}
