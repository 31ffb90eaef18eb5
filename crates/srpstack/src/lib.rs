//! The whole stack in one process: an SRP target port exporting a LUN and
//! an SRP initiator session using it, on one RDMA provider.
//!
//! [`Stack::start`] builds the fabric (two CAs: soft RoCE NICs on two
//! loopback addresses by default, or the in-process loopback provider), a
//! SCSI target with one LUN (fileio on a temporary
//! file, ram, or nullio), an SRP target port, and an initiator session that
//! logs in through [`Direct`], a connector that hands the login to the
//! target port the way a CM delivers a REQ. The LUN comes back as an
//! `srp_initiator::disk::Disk`, a `blockload::BlockDevice`.
//!
//! This is what `srpstack quickstart` and `srpstack bench` run. It refuses
//! nothing a user can type: every error is reported with what was being
//! done. [`usage`] is what the whole process spent (CPU, context
//! switches), which `srpstack bench` reports per I/O.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod usage;

use rdma_types::{Guid, Lid};
use rnic::loopback::{CaConfig, Fabric};
use srp::initiator::ChannelConfig;
use srp::target::{LoginForm as TargetForm, TargetConfig};
use srp_initiator::disk::Disk;
use srp_initiator::session::{
    ConnectError, Connected, Connector, LoginForm, QpInfo, Session, SessionConfig,
};
use srp_target::{LoginOutcome, PeerQp, PortOptions, TargetPort};
use std::path::PathBuf;
use std::sync::Arc;

/// GUID of the quickstart's target CA (in-process, on its own fabric;
/// srptd's ports take the GUID of their address, `rnic::softroce::ip_guid`).
pub const TARGET_GUID: u64 = 0x0002_c903_00a0_0001;
/// GUID of the quickstart's initiator CA (in-process, on its own fabric).
pub const INITIATOR_GUID: u64 = 0x0002_c903_00b0_0001;

/// Where the LUN keeps its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A temporary file (fileio), removed when the stack stops.
    TempFile,
    /// RAM.
    Ram,
    /// Nothing: writes are dropped, reads return zeros (nullio).
    Null,
}

/// Which RDMA provider carries SRP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The in-process loopback fabric (copies between registered buffers).
    Loopback,
    /// The soft RoCE NIC: RoCEv2 over UDP between two loopback addresses.
    SoftRoce {
        /// Address of the target's NIC.
        target: std::net::IpAddr,
        /// Address of the initiator's NIC.
        initiator: std::net::IpAddr,
        /// RoCEv2 UDP port both NICs use.
        udp_port: u16,
    },
    /// The NIC daemon's soft RoCE NICs at two addresses it serves,
    /// through its socket: both ends' verbs go through one client
    /// connection (its rings), the NICs run in the daemon. The CAs have
    /// the GUIDs of their addresses (`rnic::softroce::ip_guid`).
    Nicd {
        /// The daemon's socket.
        socket: PathBuf,
        /// Address of the target's NIC.
        target: std::net::IpAddr,
        /// Address of the initiator's NIC.
        initiator: std::net::IpAddr,
    },
}

impl Transport {
    /// Soft RoCE on 127.0.0.1 (target) and 127.0.0.2 (initiator), port 4791.
    pub fn soft_roce_default() -> Transport {
        Transport::SoftRoce {
            target: std::net::Ipv4Addr::new(127, 0, 0, 1).into(),
            initiator: std::net::Ipv4Addr::new(127, 0, 0, 2).into(),
            udp_port: rnic::softroce::ROCE_PORT,
        }
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// The provider.
    pub transport: Transport,
    /// LUN size in bytes.
    pub size: u64,
    /// Backing store.
    pub backing: Backing,
    /// Logical block size (512 or 4096).
    pub block_size: u32,
    /// Commands the initiator may have outstanding (`queue_size`).
    pub queue: u16,
    /// The soft RoCE NIC's options (GSO, link following, faults), for
    /// [`Transport::SoftRoce`]; `srpstack` maps the environment onto them
    /// (`rnic::softroce::NicOptions::from_env`).
    pub nic: rnic::softroce::NicOptions,
    /// The target port's [`PortOptions::inline_max`] (`srpstack` maps
    /// `SRPT_INLINE=0` onto 0).
    pub inline_max: u32,
    /// A memory window per command on the initiator
    /// ([`SessionConfig::register_always`]).
    pub register_always: bool,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            transport: Transport::soft_roce_default(),
            size: 256 << 20,
            backing: Backing::TempFile,
            block_size: 512,
            queue: 62,
            nic: rnic::softroce::NicOptions::default(),
            inline_max: srp_target::INLINE_MAX,
            register_always: false,
        }
    }
}

/// A running target + initiator pair.
pub struct Stack {
    /// The target port.
    pub port: Arc<TargetPort>,
    /// The initiator session.
    pub session: Arc<Session>,
    /// LUN 0 as a block device.
    pub disk: Arc<Disk>,
    /// The provider's name.
    pub provider: &'static str,
    /// What backs the LUN, in words.
    pub backing: String,
    soft: Option<Arc<rnic::softroce::SoftRoce>>,
    /// The access layer and the two clients' providers, kept so the
    /// counters outlive the target and the initiator.
    #[allow(clippy::type_complexity)]
    clients: Option<(
        rdma_access::resource::AccessLayer,
        Arc<rdma_access::resource::TrackedProvider>,
        Arc<rdma_access::resource::TrackedProvider>,
    )>,
    temp: TempFile,
}

/// Connects by handing the login to a target port in the same process, as
/// a CM would hand it the REQ private data and the initiator's QP.
pub struct Direct {
    /// The target port.
    pub port: Arc<TargetPort>,
    /// LID of the target port (0 on RoCE).
    pub lid: Lid,
    /// The REQ's partition (`None`: as [`TargetPort::login`], the port's
    /// default; `Some`: [`TargetPort::login_in_partition`]).
    pub pkey: Option<rdma_types::Pkey>,
    /// Why the target refused the last login (its log line), if it did.
    pub refused: std::sync::Mutex<String>,
}

impl Direct {
    /// A connector to `port` in its default partition.
    pub fn new(port: Arc<TargetPort>, lid: Lid) -> Direct {
        Direct {
            port,
            lid,
            pkey: None,
            refused: Default::default(),
        }
    }
}

impl Connector for Direct {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let peer = PeerQp {
            qpn: local.qpn,
            psn: local.psn,
            gid: local.gid,
            lid: local.lid,
            mtu: local.mtu,
            initiator_depth: rdma_access::QpParams::DEFAULT.initiator_depth,
            ack_timeout: 14,
            local_psn: None,
        };
        let outcome = match self.pkey {
            None => self.port.login(login, TargetForm::RdmaCm, peer),
            Some(k) => self
                .port
                .login_in_partition(login, TargetForm::RdmaCm, peer, k),
        };
        match outcome {
            LoginOutcome::Accepted {
                conn,
                local: t,
                rsp,
            } => Ok({
                // No CM here: the connection is up as the login returns.
                self.port.established(conn);
                Connected {
                    peer: QpInfo {
                        qpn: t.qpn,
                        psn: t.psn,
                        gid: self.port.gid(),
                        lid: self.lid,
                        mtu: local.mtu,
                    },
                    private_data: rsp,
                    handle: conn.0,
                    local_psn: None,
                }
            }),
            LoginOutcome::Rejected { rej, reason } => {
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = reason.to_string();
                Err(ConnectError::Rejected(rej))
            }
        }
    }

    fn disconnect(&self, handle: u64) {
        self.port.disconnected(srp_target::ConnId(handle));
    }

    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// Why [`Stack::start`] failed; a temporary image it made is removed.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("block size {0} is not 512 or 4096")]
    BlockSize(u32),
    #[error("LUN size {0} must be at least 1 MiB and a multiple of the block size")]
    LunSize(u64),
    /// The NIC daemon is not there or serves neither address (in words).
    #[error("{0}")]
    Nicd(String),
    /// The loopback fabric refused a CA (`which`: target or initiator).
    #[error("add {which} CA: {source}")]
    AddCa {
        which: &'static str,
        #[source]
        source: verbs::VerbsError,
    },
    /// The temporary image file: `step` is create, size or open.
    #[error("{step} {}: {source}", path.display())]
    TempFile {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot commit {} of memory for the RAM LUN: {source}: give a smaller --ram",
        rdma_types::units::format_size(*size)
    )]
    Ram {
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("create the SCSI device: {0}")]
    Device(#[source] scsi::DeviceError),
    #[error("start the target port: {0}")]
    TargetPort(#[source] srp_target::PortError),
    #[error("log in: {0}")]
    Login(#[source] srp_initiator::session::SessionError),
    #[error("open LUN 0: {0}")]
    OpenLun(#[source] std::io::Error),
}

impl Stack {
    /// What the soft RoCE NICs of both ends counted so far, summed (`None`
    /// on the loopback provider).
    pub fn link_counters(&self) -> Option<rnic::softroce::SoftCaCounters> {
        let soft = self.soft.as_ref()?;
        let mut sum = rnic::softroce::SoftCaCounters::default();
        for guid in [TARGET_GUID, INITIATOR_GUID] {
            let c = soft.counters(Guid(guid))?;
            sum.tx_packets += c.tx_packets;
            sum.rx_datagrams += c.rx_datagrams;
            sum.rx_bad_icrc += c.rx_bad_icrc;
            sum.retransmits += c.retransmits;
            sum.timeouts += c.timeouts;
            sum.duplicates += c.duplicates;
            sum.out_of_sequence += c.out_of_sequence;
            sum.seq_naks_received += c.seq_naks_received;
        }
        Some(sum)
    }

    /// Builds the fabric, the target with LUN 0, and logs in.
    pub fn start(cfg: &StackConfig) -> Result<Stack, StackError> {
        if cfg.block_size != 512 && cfg.block_size != 4096 {
            return Err(StackError::BlockSize(cfg.block_size));
        }
        if cfg.size < 1 << 20 || !cfg.size.is_multiple_of(cfg.block_size as u64) {
            return Err(StackError::LunSize(cfg.size));
        }
        let mut soft = None;
        // The CAs' GUIDs: the daemon's are those of their addresses.
        let (tguid, iguid) = match &cfg.transport {
            Transport::Nicd {
                target, initiator, ..
            } => (
                rnic::softroce::ip_guid(*target),
                rnic::softroce::ip_guid(*initiator),
            ),
            _ => (Guid(TARGET_GUID), Guid(INITIATOR_GUID)),
        };
        let (fabric, provider, target_lid): (Arc<dyn verbs::Provider>, &'static str, Lid) =
            match &cfg.transport {
                Transport::Loopback => {
                    let fabric = Fabric::new();
                    fabric
                        .add_ca(CaConfig::simple(TARGET_GUID, 1))
                        .map_err(|source| StackError::AddCa {
                            which: "target",
                            source,
                        })?;
                    fabric
                        .add_ca(CaConfig::simple(INITIATOR_GUID, 2))
                        .map_err(|source| StackError::AddCa {
                            which: "initiator",
                            source,
                        })?;
                    (fabric, "loopback", Lid(1))
                }
                Transport::SoftRoce {
                    target,
                    initiator,
                    udp_port,
                } => {
                    let p = rnic::softroce::SoftRoce::with_options(
                        vec![
                            rnic::softroce::SoftCa {
                                guid: Guid(TARGET_GUID),
                                ip: *target,
                            },
                            rnic::softroce::SoftCa {
                                guid: Guid(INITIATOR_GUID),
                                ip: *initiator,
                            },
                        ],
                        *udp_port,
                        rdma_types::Mtu::Mtu4096,
                        cfg.nic.clone(),
                    );
                    soft = Some(p.clone());
                    (p, "softroce", Lid(0))
                }
                Transport::Nicd {
                    socket,
                    target,
                    initiator,
                } => {
                    let (p, _) = nicd::connect_at(socket, *target, Some(nicd::Fabric::Roce))
                        .map_err(StackError::Nicd)?;
                    // The initiator's NIC from the same daemon, added
                    // when it serves only the target's.
                    if !verbs::Provider::list_cas(p.as_ref()).contains(&iguid) {
                        p.add_nic(*initiator).map_err(|e| {
                            StackError::Nicd(format!(
                                "the NIC daemon at {} serves no NIC at {initiator} and would not \
                                 add one ({e}): start it with both addresses (`nicd --ip \
                                 {target} --ip {initiator}`)",
                                socket.display()
                            ))
                        })?;
                    }
                    (nicd::data_path(p, nicd::data_here()), "nicd", Lid(0))
                }
            };

        let (backend, backing, temp): (Arc<dyn scsi::Backend>, String, Option<PathBuf>) =
            match cfg.backing {
                Backing::Ram => (
                    Arc::new(srp_target::MemStore::new(cfg.size).map_err(|source| {
                        StackError::Ram {
                            size: cfg.size,
                            source,
                        }
                    })?),
                    "ram".into(),
                    None,
                ),
                Backing::Null => (Arc::new(scsi::NullIo::new(cfg.size)), "nullio".into(), None),
                Backing::TempFile => {
                    let path = std::env::temp_dir()
                        .join(format!("srpstack-lun0-{}.img", std::process::id()));
                    let at = |step| {
                        let path = path.clone();
                        move |source| StackError::TempFile { step, path, source }
                    };
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .map_err(at("create"))?;
                    file.set_len(cfg.size).map_err(at("size"))?;
                    let b = scsi::FileIo::new(file, false).map_err(at("open"))?;
                    (
                        Arc::new(b),
                        format!("fileio {}", path.display()),
                        Some(path),
                    )
                }
            };
        let remove_temp = |p: &Option<PathBuf>| {
            if let Some(p) = p {
                let _ = std::fs::remove_file(p);
            }
        };
        let dev_cfg = scsi::DeviceConfig {
            block_size: cfg.block_size,
            serial: format!("{:016x}", TARGET_GUID),
            ..Default::default()
        };
        let dev = match scsi::Device::new(dev_cfg, backend) {
            Ok(d) => d,
            Err(e) => {
                remove_temp(&temp);
                return Err(StackError::Device(e));
            }
        };
        let scsi = Arc::new(scsi::Target::new());
        scsi.add_lun(None, scsi::Lun::new(0).expect("LUN 0"), Arc::new(dev));

        let mut chan = ChannelConfig::new(0x1, iguid, tguid.0, tguid);
        chan.can_queue = cfg.queue;
        let tcfg = TargetConfig::new(chan.target_port_id(), "srpstack");
        // The target and the initiator each reach the provider through a
        // client of the access layer: every verbs object they make is
        // tracked, and what they leave behind is counted.
        let al = rdma_access::resource::AccessLayer::new(fabric);
        let target_side = al.client("srp target").into_provider();
        let initiator_side = al.client("srp initiator").into_provider();
        let port = match TargetPort::start(
            target_side.clone(),
            tguid,
            tcfg,
            scsi,
            PortOptions {
                inline_max: cfg.inline_max,
                ..PortOptions::default()
            },
        ) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                remove_temp(&temp);
                return Err(StackError::TargetPort(e));
            }
        };
        let direct = Arc::new(Direct::new(port.clone(), target_lid));
        let session = match Session::connect(
            initiator_side.clone(),
            iguid,
            direct,
            SessionConfig {
                register_always: cfg.register_always,
                ..SessionConfig::new(chan)
            },
        ) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                remove_temp(&temp);
                return Err(StackError::Login(e));
            }
        };
        let disk = match Disk::open(session.clone(), 0) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                remove_temp(&temp);
                return Err(StackError::OpenLun(e));
            }
        };
        Ok(Stack {
            port,
            session,
            disk,
            provider,
            backing,
            soft,
            clients: Some((al, target_side, initiator_side)),
            temp: TempFile(temp),
        })
    }

    /// Logs out and stops the target; returns how many verbs objects the
    /// initiator and the target left behind (the access layer's live
    /// counters, read before their clients close what is left: 0 unless
    /// something leaks). Clones of `disk` or `session` held elsewhere must
    /// be dropped first, or the session is still logged in when counted.
    pub fn shutdown(self) -> i64 {
        let Stack {
            port,
            session,
            disk,
            clients,
            temp,
            ..
        } = self;
        // The users of the verbs objects go first: the disk, the session
        // (logged out when its last reference goes), the target port.
        drop(disk);
        drop(session);
        drop(port);
        drop(temp);
        let Some((al, _, _)) = clients else { return 0 };
        // A session that failed (a lossy link's retries ran out) is torn
        // down on a thread of its own, off the I/O path: give it a bounded
        // moment to finish, as srpd does at exit.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while al.live_total() > 0 && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        al.live_total()
    }
}

/// A temporary LUN file, removed when dropped.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
