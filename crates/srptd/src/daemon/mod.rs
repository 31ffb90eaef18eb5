//! The SRP target daemon: a [`Config`] brought to life on a soft RoCE NIC,
//! a control socket for `srptadm`, and a metrics endpoint.
//!
//! [`Daemon::start`] builds the devices, the LUN maps (default set and
//! security groups) and one SRP target port per `[[target]]`, each on its
//! own soft RoCE NIC, all over one SCSI target, and serves logins by RDMA
//! CM and IB CM. Each port counts what it executes per LUN; `show` and
//! the metrics name the target, the LUN and its device.
//! [`Daemon::handle`] executes one admin [`Request`]; every change goes to
//! the running configuration too, so `write-config` saves what runs (as
//! `scstadmin -write_config` does). LUN map changes raise REPORTED LUNS
//! DATA HAS CHANGED on the affected nexuses and send SRP_AER_REQ to every
//! channel. Every request is logged as a [`crate::log::Record`]: changes
//! and refusals at info and warn level, queries at debug level.
//!
//! The control socket is created mode 0600 and also checks the peer's
//! credentials: only the daemon's own user may use it.
//!
//! [`preflight`] (`srptd --check`, and `srptd` before it makes
//! anything) tries what a start opens and binds, device files with the
//! access they need included, so that a configuration it passes does not
//! fail to start for a path or an address; what still fails at start
//! (no subnet manager, a race) names file, line and key, and takes back
//! the image files and the control socket it made.

use crate::config::{
    check_initiator, Config, ConfigError, DeviceSection, GroupSection, Handler, LunEntry,
};
use rdma_access::subnet::{IbPort, IbPortError};
use rdma_types::Guid;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use srp_target::TargetPort;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use toml::Spanned;

mod control;
mod error;
mod logins;
mod reload;
mod report;
mod roles;
mod store;

pub use control::*;
pub use error::AdminError;
use reload::group_mut;
pub use roles::{RoleArg, RoleError};
pub use store::*;

/// The running daemon.
pub struct Daemon {
    cfg: Mutex<Config>,
    cfg_path: Option<PathBuf>,
    scsi: Arc<scsi::Target>,
    devices: Mutex<BTreeMap<String, Arc<scsi::Device>>>,
    /// One per `[[target]]`, in the file's order.
    targets: Vec<TargetRt>,
    log: crate::log::Log,
    /// Devices that follow a DRBD role (`drbd_minor`), fixed at start.
    drbd: Vec<roles::Followed>,
    /// Set at shutdown: the role poller stops.
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// One target port at work: its NIC, the port, its CM agent and I/O
/// controller. The SCSI target behind it is the daemon's, shared.
struct TargetRt {
    /// What runs on the CA now. On an rdma-core device a removal ends it
    /// and the device's return replaces it ([`watch_device`]).
    live: Arc<Mutex<Live>>,
    /// Its soft RoCE NIC (counters); `None` on an rdma-core device.
    nic: Option<Arc<rnic::softroce::SoftRoce>>,
    /// The port's SMA and MAD driver in the `ib` fabric.
    ib_port: Option<IbPort>,
    /// Set at shutdown: a device watcher stops.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// The NIC daemon's process ID when the port is on its NIC.
    nicd_pid: Option<u32>,
}

/// The target port on its CA and what it reaches the CA through.
#[derive(Clone)]
struct Live {
    port: Arc<TargetPort>,
    guid: Guid,
    /// The access layer the target port reaches the NIC through: it
    /// counts every verbs object the port holds.
    access: rdma_access::resource::AccessLayer,
    /// The access layer's client the CM agent is tracked in: its CM ids
    /// (connections and listens), MAD agents and SA subscriptions, and
    /// (soft RoCE fabric) its QP1 objects. Closed first at shutdown.
    cm: Arc<rdma_access::resource::TrackedProvider>,
    /// On an rdma-core device: the kernel's RDMA CM the logins come
    /// through, closed at shutdown.
    rdma_cm: Option<Arc<rdmacore::RdmaCm>>,
    /// The I/O controller offered to discovery and the DM agent
    /// answering for it: on the soft RoCE NIC's QP1, or on an rdma-core
    /// device's through the kernel's user MAD interface (`None` where
    /// that cannot start: warned).
    _dm: Option<Arc<DmAgent>>,
    /// On the NIC daemon's `ib` port: our place on it (its MAD driver;
    /// the port's SMA is the daemon's). Made anew with the rest when the
    /// daemon comes back.
    shared_ib: Option<Arc<IbPort>>,
}

/// A target's DM agent: the controller's slot, the service answering DM
/// Gets, and (on an rdma-core device) the agent on the device's QP1 they
/// run on, dropped in that order. On the soft NIC they run on the
/// target's own CM agent.
struct DmAgent {
    _ioc: rdma_access::dm::IocHandle,
    _dm: rdma_access::dm::DmService,
    _agent: Option<Arc<rdma_access::CmAgent>>,
}

/// Starts the DM agent of target `t` on port `port` of device CA `guid`,
/// through `cm` (which tracks its objects, MAD agents included).
fn device_dm(
    t: &crate::config::TargetSection,
    cm: &Arc<rdma_access::resource::TrackedProvider>,
    guid: Guid,
    port: rdma_types::PortNum,
) -> Result<DmAgent, String> {
    let agent = rdma_access::CmAgent::start_on(
        cm.clone(),
        guid,
        port,
        std::process::id() << 8,
        rdma_access::CmConfig::default(),
    )
    .map_err(|e| e.to_string())?;
    agent
        .track_in(cm.client())
        .map_err(|e| format!("track the MAD agent: {e}"))?;
    let dm = rdma_access::dm::DmService::start(&agent).map_err(|e| e.to_string())?;
    let ioc = dm
        .register_ioc(srp_target::cm::ioc(guid, &tcfg_summary(t)))
        .map_err(|e| e.to_string())?;
    Ok(DmAgent {
        _ioc: ioc,
        _dm: dm,
        _agent: Some(agent),
    })
}

/// What every target takes from outside the configuration file: its soft
/// RoCE NIC's options and its port's inline limit. `srptd` maps the
/// environment onto them (`SOFTROCE_GSO`, `SOFTROCE_FOLLOW_LINK`,
/// `SOFTROCE_FAULTS`: [`rnic::softroce::NicOptions::from_env`];
/// `SRPT_INLINE`: [`srp_target::PortOptions::inline_max_from_env`]).
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Every target's soft RoCE NIC.
    pub nic: rnic::softroce::NicOptions,
    /// Every target port's [`srp_target::PortOptions::inline_max`].
    pub inline_max: u32,
    /// Run every soft RoCE target on the NIC daemon's NIC at its
    /// address, through the daemon at this socket, instead of a NIC of
    /// srptd's own (on the `ib` fabric the daemon must run
    /// `--fabric ib`: its SMA runs the port).
    pub nicd: Option<std::path::PathBuf>,
    /// Every `iwarp` target's soft iWARP NIC.
    pub iwarp: iwarp_tcp::NicOptions,
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            nic: rnic::softroce::NicOptions::default(),
            inline_max: srp_target::INLINE_MAX,
            nicd: None,
            iwarp: iwarp_tcp::NicOptions::default(),
        }
    }
}

/// What `srptd` says about one running target when it starts.
#[derive(Debug, Clone)]
pub struct TargetSummary {
    /// The target name (port GID, SCST style).
    pub name: String,
    /// The CA GUID: id_ext, ioc_guid and IB CM service ID.
    pub guid: Guid,
    /// The LID the SM gave the port (`ib` fabric).
    pub lid: Option<u16>,
    /// On an rdma-core device: its name and the addresses its RDMA CM
    /// listens on.
    pub device: Option<(String, Vec<std::net::IpAddr>)>,
}

/// The limits an I/O controller profile advertises.
fn tcfg_summary(t: &crate::config::TargetSection) -> rdma_access::dm::IocLimits {
    rdma_access::dm::IocLimits {
        send_queue_depth: (*t.srpt_srq_size.get_ref()).min(u16::MAX as u32) as u16,
        send_size: *t.srp_max_req_size.get_ref(),
        rdma_size: *t.srp_max_rdma_size.get_ref(),
    }
}

/// Why a target did not start: the span and key of its table it belongs
/// to, and the message.
type StartError = (std::ops::Range<usize>, &'static str, String);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn spanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

impl TargetRt {
    /// Starts target `t` (the `n`th) over the shared SCSI target: on an
    /// rdma-core device when `t.device` names one, else on its own soft
    /// RoCE NIC. An error names the span and key (in the target's table)
    /// it belongs to.
    fn start(
        t: &crate::config::TargetSection,
        n: u32,
        scsi: &Arc<scsi::Target>,
        log: crate::log::Log,
        opts: &StartOptions,
    ) -> Result<TargetRt, StartError> {
        match &t.device {
            Some(d) => TargetRt::start_on_device(t, d, scsi, log, opts),
            None if *t.iwarp.get_ref() => TargetRt::start_iwarp(t, scsi, log, opts),
            None => TargetRt::start_soft(t, n, scsi, log, opts),
        }
    }

    /// Starts target `t` on its own soft iWARP NIC at its address: the
    /// port's verbs objects on it and its logins by RDMA CM over TCP and
    /// MPA (`iwarp_tcp::IwarpCm`) on `rdma_cm_port`. The CA has the GUID
    /// of its address as on soft RoCE, so the target port ID, and with it
    /// the login strings, are those of a soft RoCE target there. No IB
    /// CM, no DM agent: iWARP has no QP1.
    fn start_iwarp(
        t: &crate::config::TargetSection,
        scsi: &Arc<scsi::Target>,
        log: crate::log::Log,
        opts: &StartOptions,
    ) -> Result<TargetRt, StartError> {
        let nic_err = |m: String| (t.ip.span(), "ip", m);
        if opts.nicd.is_some() {
            return Err((
                t.iwarp.span(),
                "iwarp",
                "the NIC daemon serves soft RoCE NICs; an iwarp target runs on a NIC of \
                 srptd's own: drop --nicd, or iwarp"
                    .into(),
            ));
        }
        let ip = *t.ip.get_ref();
        let guid = rnic::softroce::ip_guid(ip);
        let nic = iwarp_tcp::SoftIwarp::with_options(
            vec![iwarp_tcp::IwarpCa { guid, ip }],
            opts.iwarp.clone(),
        );
        let access =
            rdma_access::resource::AccessLayer::new(nic.clone() as Arc<dyn verbs::Provider>);
        let cm = access.client("cm").into_provider();
        let port = TargetRt::target_port(
            t,
            access.client("srp target").into_provider(),
            guid,
            rdma_types::PortNum(1),
            scsi,
            opts,
            &|m| nic_err(format!("iWARP NIC at {ip}: {m}")),
        )?;
        let listen = srp_target::cm::Listen {
            rdma_cm_port: Some(t.rdma_cm_port),
            ib_service_id: None,
        };
        let rdma_cm = iwarp_tcp::IwarpCm::new(nic, guid);
        if let Err(e) = logins::serve_logins(rdma_cm, None, port.clone(), listen, log) {
            port.stop();
            return Err(nic_err(format!(
                "listen for logins on TCP {ip}:{}: {e}",
                t.rdma_cm_port
            )));
        }
        let live = Live {
            port,
            guid,
            access,
            cm,
            rdma_cm: None,
            _dm: None,
            shared_ib: None,
        };
        Ok(TargetRt {
            live: Arc::new(Mutex::new(live)),
            nic: None,
            ib_port: None,
            stopping: Arc::default(),
            nicd_pid: None,
        })
    }

    /// The target port on `provider`'s CA `guid` (port `port`), with the
    /// SRP parameters and limits of `t`.
    fn target_port(
        t: &crate::config::TargetSection,
        provider: Arc<dyn verbs::Provider>,
        guid: Guid,
        port: rdma_types::PortNum,
        scsi: &Arc<scsi::Target>,
        opts: &StartOptions,
        err_at: &dyn Fn(String) -> StartError,
    ) -> Result<Arc<TargetPort>, StartError> {
        // Target port ID = id_ext then ioc_guid, both the CA GUID (ib_srpt).
        let chan = srp::initiator::ChannelConfig::new(0, guid, guid.0, guid);
        let mut tcfg = srp::target::TargetConfig::new(chan.target_port_id(), "srptd");
        tcfg.max_req_size = *t.srp_max_req_size.get_ref();
        tcfg.max_rsp_size = *t.srp_max_rsp_size.get_ref();
        tcfg.max_rdma_size = *t.srp_max_rdma_size.get_ref();
        tcfg.srq_size = *t.srpt_srq_size.get_ref();
        tcfg.sq_size = *t.srpt_sq_size.get_ref();
        tcfg.max_channels = *t.max_channels.get_ref() as usize;
        tcfg.enabled = t.enabled;
        let port = Arc::new(
            TargetPort::start(
                provider,
                guid,
                tcfg,
                scsi.clone(),
                srp_target::PortOptions {
                    port,
                    // Checked when the file was read.
                    pkeys: t
                        .pkey
                        .get_ref()
                        .pkeys()
                        .map_err(|m| (t.pkey.span(), "pkey", m.to_string()))?,
                    login_timeout: Duration::from_millis(*t.login_timeout_ms.get_ref()),
                    max_pending_logins: *t.max_pending_logins.get_ref() as usize,
                    max_pending_per_initiator: *t.max_pending_per_initiator.get_ref() as usize,
                    keepalive: Some(*t.keepalive_ms.get_ref())
                        .filter(|&ms| ms > 0)
                        .map(Duration::from_millis),
                    inline_max: opts.inline_max,
                    ..Default::default()
                },
            )
            .map_err(|e| err_at(format!("start the target port: {e}")))?,
        );
        // SCST's rel_tgt_id: the port's relative port identifier (VPD 83h,
        // PR READ FULL STATUS), fixed before any command numbers it.
        scsi.set_relative_port_id(port.name(), *t.rel_tgt_id.get_ref())
            .map_err(|e| (t.rel_tgt_id.span(), "rel_tgt_id", e.to_string()))?;
        Ok(port)
    }

    /// Starts target `t` on rdma-core device `d` (`NAME[:PORT]`): the
    /// port's verbs objects on the device, its logins by the kernel's RDMA
    /// CM on the device's addresses, and a DM agent through the kernel's
    /// user MAD interface for discovery. IB CM logins are not served there
    /// yet: the kernel's CM owns them. A thread watches for the device's removal and return
    /// ([`watch_device`]).
    fn start_on_device(
        t: &crate::config::TargetSection,
        d: &Spanned<String>,
        scsi: &Arc<scsi::Target>,
        log: crate::log::Log,
        opts: &StartOptions,
    ) -> Result<TargetRt, StartError> {
        let dev_err = |m: String| (d.span(), "device", m);
        // Checked when the file was read.
        let spec: rdmacore::DeviceSpec = d.get_ref().parse().map_err(dev_err)?;
        let core = rdmacore::RdmaCore::new().map_err(|e| dev_err(e.to_string()))?;
        let live = device_live(t, &spec, &core, scsi, &log, opts).map_err(dev_err)?;
        let rt = TargetRt {
            live: Arc::new(Mutex::new(live)),
            nic: None,
            ib_port: None,
            stopping: Arc::default(),
            nicd_pid: None,
        };
        let w = DeviceWatch {
            t: t.clone(),
            spec,
            core,
            scsi: scsi.clone(),
            log,
            opts: opts.clone(),
            live: rt.live.clone(),
            stopping: rt.stopping.clone(),
        };
        std::thread::Builder::new()
            .name(format!("watch {}", d.get_ref()))
            .spawn(move || watch_device(w))
            .map_err(|e| dev_err(format!("cannot start the device watcher: {e}")))?;
        Ok(rt)
    }

    /// Starts target `t` (the `n`th) on its own soft RoCE NIC, or on the
    /// NIC daemon's (`--nicd`), where a watcher starts it again after
    /// the daemon's restart ([`watch_nicd`]).
    fn start_soft(
        t: &crate::config::TargetSection,
        n: u32,
        scsi: &Arc<scsi::Target>,
        log: crate::log::Log,
        opts: &StartOptions,
    ) -> Result<TargetRt, StartError> {
        // What fails here fails on the port's NIC, at its address, unless
        // said otherwise.
        let nic_err = |m: String| (t.ip.span(), "ip", m);
        // Every port has its own GUID, from its address (rnic::softroce::ip_guid): on a
        // managed subnet the SM keys LIDs by it, and in either mode it is
        // the target port ID (id_ext and ioc_guid, as ib_srpt's are its
        // HCA's GUID), which Linux ib_srp keeps unique per initiator port:
        // two targets with one ID cannot both be logged in to.
        let guid = rnic::softroce::ip_guid(*t.ip.get_ref());
        // The NIC daemon's NIC at the address, or one of our own.
        let (provider, soft): (Arc<dyn verbs::Provider>, _) = match &opts.nicd {
            Some(socket) => {
                let (p, _) =
                    nicd::connect_at(socket, *t.ip.get_ref(), Some(t.fabric)).map_err(nic_err)?;
                let (live, _) = TargetRt::soft_live(
                    t,
                    n,
                    scsi,
                    &log,
                    opts,
                    nicd::data_path(p.clone(), nicd::data_here()),
                    None,
                )?;
                let rt = TargetRt {
                    live: Arc::new(Mutex::new(live)),
                    nic: None,
                    ib_port: None,
                    stopping: Arc::default(),
                    nicd_pid: Some(p.daemon_pid()),
                };
                let w = NicdWatch {
                    t: t.clone(),
                    n,
                    socket: socket.clone(),
                    client: p,
                    scsi: scsi.clone(),
                    log,
                    opts: opts.clone(),
                    live: rt.live.clone(),
                    stopping: rt.stopping.clone(),
                };
                std::thread::Builder::new()
                    .name(format!("watch nicd {}", t.ip.get_ref()))
                    .spawn(move || watch_nicd(w))
                    .map_err(|e| nic_err(format!("cannot start the NIC daemon watcher: {e}")))?;
                return Ok(rt);
            }
            None => {
                let soft = rnic::softroce::SoftRoce::with_options(
                    vec![rnic::softroce::SoftCa {
                        guid,
                        ip: *t.ip.get_ref(),
                    }],
                    *t.udp_port.get_ref(),
                    // Checked with the file (`Config::validate`).
                    rdma_types::Mtu::from_bytes(*t.mtu.get_ref() as usize)
                        .unwrap_or(rdma_types::Mtu::Mtu4096),
                    opts.nic.clone(),
                );
                (soft.clone() as Arc<dyn verbs::Provider>, Some(soft))
            }
        };
        let (live, ib_port) = TargetRt::soft_live(t, n, scsi, &log, opts, provider, soft.as_ref())?;
        Ok(TargetRt {
            live: Arc::new(Mutex::new(live)),
            nic: soft,
            ib_port,
            stopping: Arc::default(),
            nicd_pid: None,
        })
    }

    /// The target port of `t` (the `n`th) on the soft RoCE CA of its
    /// address that `provider` serves (`soft`: our own NIC, whose port
    /// the `ib` fabric's SMA runs), its CM agent, DM agent and logins;
    /// and the `ib` fabric's port.
    fn soft_live(
        t: &crate::config::TargetSection,
        n: u32,
        scsi: &Arc<scsi::Target>,
        log: &crate::log::Log,
        opts: &StartOptions,
        provider: Arc<dyn verbs::Provider>,
        soft: Option<&Arc<rnic::softroce::SoftRoce>>,
    ) -> Result<(Live, Option<IbPort>), StartError> {
        let nic_err = |m: String| (t.ip.span(), "ip", m);
        let ib = t.fabric == rdma_access::subnet::Fabric::Ib;
        let guid = rnic::softroce::ip_guid(*t.ip.get_ref());
        // MAD transaction IDs of this process's agents, apart per target.
        let tid_base = (std::process::id() << 8) | (n & 0xff);
        // The target port and the CM agent reach the NIC through clients
        // of the access layer, which track every verbs object they make
        // and, for the CM agent, its CM ids, MAD agents and subscriptions.
        let access = rdma_access::resource::AccessLayer::new(provider.clone());
        let cm = access.client("cm").into_provider();
        // The ib personality is set before the CA is first opened: the
        // port, its SMA and MAD driver start here, and the SM's sweep
        // brings it ACTIVE (waited for at the end, once everything serves).
        let ip = *t.ip.get_ref();
        let ib_port = if let (true, Some(soft)) = (ib, soft) {
            soft.set_personality(guid, rnic::softroce::Personality::Ib)
                .map_err(|source| {
                    nic_err(IbPortError::Personality { ip, guid, source }.to_string())
                })?;
            let port = IbPort::start(
                soft.clone(),
                guid,
                ip,
                &format!("srptd {ip}"),
                true,
                tid_base,
            )
            .map_err(|e| nic_err(e.to_string()))?;
            Some(port)
        } else if ib {
            // The NIC daemon's ib port (`nicd --fabric ib`): its SMA is
            // the daemon's, we take a place at its QP1.
            let port = IbPort::join(provider.clone(), guid, ip, tid_base)
                .map_err(|e| nic_err(e.to_string()))?;
            Some(port)
        } else {
            None
        };
        let port = TargetRt::target_port(
            t,
            access.client("srp target").into_provider(),
            guid,
            rdma_types::PortNum(1),
            scsi,
            opts,
            &nic_err,
        )?;
        // On the ib fabric the port's node started the agent on the NIC
        // (the tree adopts its QP0/QP1 objects; its CM ids, MAD agents
        // and subscriptions hang under them).
        let agent = match &ib_port {
            Some(p) => p.agent().clone(),
            None => rdma_access::CmAgent::start(cm.clone(), guid, tid_base)
                .map_err(|e| nic_err(format!("start the CM agent on {}: {e}", t.ip.get_ref())))?,
        };
        agent
            .track_in(cm.client())
            .map_err(|e| nic_err(format!("track the CM agent: {e}")))?;
        // Discovery: the device management agent offers the target as an
        // SRP I/O controller, as ib_srpt does (srp_daemon, `srp discover`).
        let dm = rdma_access::dm::DmService::start(&agent)
            .map_err(|e| nic_err(format!("start the DM agent: {e}")))?;
        let ioc = dm
            .register_ioc(srp_target::cm::ioc(guid, &tcfg_summary(t)))
            .map_err(|e| nic_err(format!("register the I/O controller: {e}")))?;
        let listen = srp_target::cm::Listen {
            // 0 turns RDMA CM off (ib_srpt), it does not mean port 0.
            rdma_cm_port: (t.rdma_cm_port != 0).then_some(t.rdma_cm_port),
            // ib_srpt listens on the ioc_guid.
            ib_service_id: t.ib_cm.then_some(guid.0),
        };
        logins::serve_logins(
            agent.clone(),
            Some(agent),
            port.clone(),
            listen,
            log.clone(),
        )
        .map_err(|e| nic_err(format!("listen for logins: {e}")))?;
        // Everything serves: now the SM may bring the port up (a trap 64
        // subscriber then finds the I/O controller at once).
        if let Some(p) = &ib_port {
            let wait = *t.sm_wait_ms.get_ref();
            p.wait_active(std::time::Duration::from_millis(wait))
                .map_err(|e| (t.sm_wait_ms.span(), "sm_wait_ms", e.to_string()))?;
        }
        // Our own NIC's port lives with the target; the daemon's is made
        // anew with the rest after a restart of the daemon.
        let (ib_port, shared_ib) = match soft {
            Some(_) => (ib_port, None),
            None => (None, ib_port.map(Arc::new)),
        };
        let live = Live {
            port,
            guid,
            access,
            cm,
            rdma_cm: None,
            _dm: Some(Arc::new(DmAgent {
                _ioc: ioc,
                _dm: dm,
                _agent: None,
            })),
            shared_ib,
        };
        Ok((live, ib_port))
    }

    /// What runs on the CA now.
    fn live(&self) -> Live {
        lock(&self.live).clone()
    }

    /// The target port now.
    fn port(&self) -> Arc<TargetPort> {
        lock(&self.live).port.clone()
    }

    /// The LID the SM gave the port (`ib` fabric only).
    fn lid(&self) -> Option<u16> {
        let shared = || lock(&self.live).shared_ib.as_ref().map(|p| p.lid());
        self.ib_port.as_ref().map(|p| p.lid()).or_else(shared)
    }
}

/// The target port of `t` on device `spec` of `core`, serving logins by
/// the kernel's RDMA CM. An error in words.
fn device_live(
    t: &crate::config::TargetSection,
    spec: &rdmacore::DeviceSpec,
    core: &Arc<rdmacore::RdmaCore>,
    scsi: &Arc<scsi::Target>,
    log: &crate::log::Log,
    opts: &StartOptions,
) -> Result<Live, String> {
    let guid = core.guid_of(&spec.name).map_err(|e| e.to_string())?;
    // A port not ACTIVE yet still gets its target (logins wait for the
    // link); what to do about it is said now.
    if let Err(e) = core.find_port(spec) {
        log.emit(
            crate::log::Record::warn("port_not_active", e.to_string())
                .field("device", spec.to_string()),
        );
    }
    let provider: Arc<dyn verbs::Provider> = core.clone();
    let access = rdma_access::resource::AccessLayer::new(provider);
    let cm = access.client("cm").into_provider();
    let port = TargetRt::target_port(
        t,
        access.client("srp target").into_provider(),
        guid,
        rdma_types::PortNum(spec.port),
        scsi,
        opts,
        &|m| (0..0, "device", format!("{}: {m}", spec.name)),
    )
    .map_err(|(_, _, m)| m)?;
    let rdma_cm = match rdmacore::RdmaCm::start(core, guid) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            port.stop();
            return Err(e.to_string());
        }
    };
    let listen = srp_target::cm::Listen {
        rdma_cm_port: Some(t.rdma_cm_port),
        ib_service_id: None,
    };
    if let Err(e) = logins::serve_logins(rdma_cm.clone(), None, port.clone(), listen, log.clone()) {
        rdma_cm.close();
        port.stop();
        return Err(e.to_string());
    }
    // Discovery (`srp discover --device`, srp_daemon): a DM agent on the
    // device's QP1 through the kernel's user MAD interface, as ib_srpt
    // offers its ports. Without it logins still work: said, not fatal.
    let dm = match device_dm(t, &cm, guid, rdma_types::PortNum(spec.port)) {
        Ok(d) => {
            log.emit(
                crate::log::Record::info(
                    "dm_agent",
                    format!(
                        "{spec}: device management agent serving I/O controller {:016x} \
                         (through the kernel's user MAD interface)",
                        guid.0
                    ),
                )
                .field("device", spec.to_string()),
            );
            Some(Arc::new(d))
        }
        Err(e) => {
            log.emit(
                crate::log::Record::warn(
                    "no_dm_agent",
                    format!(
                        "{spec}: no device management agent, discovery will not find \
                         this target: {e}"
                    ),
                )
                .field("device", spec.to_string()),
            );
            None
        }
    };
    Ok(Live {
        port,
        guid,
        access,
        cm,
        rdma_cm: Some(rdma_cm),
        _dm: dm,
        shared_ib: None,
    })
}

/// What a device watcher needs to start the target port again.
struct DeviceWatch {
    t: crate::config::TargetSection,
    spec: rdmacore::DeviceSpec,
    core: Arc<rdmacore::RdmaCore>,
    scsi: Arc<scsi::Target>,
    log: crate::log::Log,
    opts: StartOptions,
    live: Arc<Mutex<Live>>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// What a NIC daemon watcher needs to start the target port again.
struct NicdWatch {
    t: crate::config::TargetSection,
    n: u32,
    socket: std::path::PathBuf,
    /// The connection the target port runs on now.
    client: Arc<nicd::NicdProvider>,
    scsi: Arc<scsi::Target>,
    log: crate::log::Log,
    opts: StartOptions,
    live: Arc<Mutex<Live>>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// How often a NIC daemon watcher looks (its going ends the port's
/// sessions at once through the CA's removal; this finds it gone and
/// back).
const WATCH_NICD_EVERY: Duration = Duration::from_millis(200);

/// Watches a target on the NIC daemon's NIC until shutdown: when the
/// daemon went (killed, restarted), the port's sessions have ended
/// with the CA's removal; the watcher stops the old port, waits for a
/// daemon serving the address on the socket, and starts the target
/// port, its CM and DM agents on it again, as after a device's return.
fn watch_nicd(mut w: NicdWatch) {
    use crate::log::Record;
    use std::sync::atomic::Ordering;
    let ip = *w.t.ip.get_ref();
    let socket = w.socket.display().to_string();
    // A connection made again by any verb counts as the daemon's going
    // too: the objects of the port were on the old one.
    let mut seen = w.client.reconnects();
    while !w.stopping.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_NICD_EVERY);
        if w.client.connected() && w.client.reconnects() == seen {
            continue;
        }
        let cur = lock(&w.live).clone();
        w.log.emit(
            Record::warn(
                "nicd_gone",
                format!(
                    "the NIC daemon at {socket} went away: target {} on {ip} is gone until it \
                     returns",
                    cur.port.name()
                ),
            )
            .target(cur.port.name())
            .field("nicd", &socket),
        );
        cur.cm.client().close();
        cur.port.stop();
        drop(cur);
        let mut last_err = String::new();
        loop {
            if w.stopping.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(WATCH_NICD_EVERY);
            let back = nicd::connect_at(&w.socket, ip, Some(w.t.fabric)).and_then(|(p, _)| {
                let provider = nicd::data_path(p.clone(), nicd::data_here());
                TargetRt::soft_live(&w.t, w.n, &w.scsi, &w.log, &w.opts, provider, None)
                    .map(|(live, _)| (p, live))
                    .map_err(|(_, _, m)| m)
            });
            match back {
                Ok((p, live)) => {
                    let port = live.port.name().to_string();
                    *lock(&w.live) = live;
                    seen = p.reconnects();
                    w.client = p;
                    w.log.emit(
                        Record::info(
                            "nicd_back",
                            format!("the NIC daemon is back: target {port} takes logins again"),
                        )
                        .target(port)
                        .field("nicd", &socket),
                    );
                    break;
                }
                Err(e) if e != last_err => {
                    tracing::debug!(nicd = %socket, "not back yet: {e}");
                    last_err = e;
                }
                Err(_) => {}
            }
        }
    }
}

/// How often a device watcher looks (a removal ends the port at once
/// through the CA's removal event; this only finds it gone and back).
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Watches a target's rdma-core device until shutdown: when the kernel
/// removed it (`rdma link delete`, a hot unplug), the port's sessions
/// have ended and its objects are released (the CA's removal event);
/// the watcher stops the old port, waits for a device of that name to
/// return, and starts the target port on it again, as ib_srpt's port
/// comes back with its HCA.
fn watch_device(w: DeviceWatch) {
    use crate::log::Record;
    use std::sync::atomic::Ordering;
    let name = w.spec.to_string();
    while !w.stopping.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_EVERY);
        let cur = lock(&w.live).clone();
        if !cur.rdma_cm.as_ref().is_some_and(|c| c.is_removed()) {
            continue;
        }
        w.log.emit(
            Record::warn(
                "device_removed",
                format!(
                    "{name} was removed: target {} is gone until it returns",
                    cur.port.name()
                ),
            )
            .target(cur.port.name())
            .field("device", &name),
        );
        if let Some(c) = &cur.rdma_cm {
            c.close();
        }
        cur.port.stop();
        let mut last_err = String::new();
        loop {
            if w.stopping.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(WATCH_EVERY);
            match device_live(&w.t, &w.spec, &w.core, &w.scsi, &w.log, &w.opts) {
                Ok(live) => {
                    let port = live.port.name().to_string();
                    *lock(&w.live) = live;
                    w.log.emit(
                        Record::info(
                            "device_returned",
                            format!("{name} is back: target {port} takes logins again"),
                        )
                        .target(port)
                        .field("device", &name),
                    );
                    break;
                }
                Err(e) if e != last_err => {
                    tracing::debug!(device = %name, "not back yet: {e}");
                    last_err = e;
                }
                Err(_) => {}
            }
        }
    }
}

impl Daemon {
    /// Builds everything `cfg` describes and starts serving logins on
    /// every target. `log` takes a record per event. An error names the
    /// file, line and key it comes from, and the image files this start
    /// created are removed again ([`preflight`] finds most such errors
    /// before anything is made). `opts` go to every target's NIC and port.
    pub fn start(
        cfg: Config,
        cfg_path: Option<PathBuf>,
        log: crate::log::Log,
        opts: &StartOptions,
    ) -> Result<Arc<Daemon>, ConfigError> {
        let scsi = Arc::new(scsi::Target::new());
        let mut devices = BTreeMap::new();
        let mut created = Vec::new();
        let mut drbd = Vec::new();
        for (i, d) in cfg.devices.iter().enumerate() {
            if let Some(minor) = &d.drbd_minor {
                // Closed until this host is Primary: the poller or
                // `srptadm set-role` opens it.
                let (size, lbs) = roles::drbd_geometry(d).map_err(|e| device_error(&cfg, i, e))?;
                let store = Arc::new(scsi::Detachable::closed(size, lbs));
                let device = device_on(d, store.clone()).map_err(|e| device_error(&cfg, i, e))?;
                let name = d.name.get_ref().clone();
                let groups = cfg
                    .target_groups
                    .iter()
                    .filter(|g| g.follow.as_ref().is_some_and(|f| *f.get_ref() == name))
                    .map(|g| {
                        let local = g.targets.iter().any(|t| {
                            cfg.targets
                                .iter()
                                .any(|p| p.rel_tgt_id.get_ref() == t.get_ref())
                        });
                        (*g.group_id.get_ref(), local)
                    })
                    .collect();
                drbd.push(roles::Followed {
                    name: name.clone(),
                    minor: *minor.get_ref(),
                    section: d.clone(),
                    store,
                    groups,
                    state: Mutex::new((crate::drbd::Follower::new(), None)),
                });
                devices.insert(name, Arc::new(device));
                continue;
            }
            let (device, made) = build_device(d).map_err(|e| device_error(&cfg, i, e))?;
            created.extend(made);
            devices.insert(d.name.get_ref().clone(), device);
        }
        let lun_at = |l: &LunEntry, at: String| {
            lun(*l.lun.get_ref()).map_err(|m| cfg.error(l.lun.span(), at, m.to_string()))
        };
        for (j, l) in cfg.luns.iter().enumerate() {
            let n = lun_at(l, format!("lun[{j}].lun"))?;
            scsi.add_lun(None, n, devices[l.device.get_ref()].clone());
        }
        for (k, g) in cfg.groups.iter().enumerate() {
            let name = g.name.get_ref();
            scsi.add_group(name);
            for i in &g.initiators {
                scsi.add_initiator(name, i.get_ref());
            }
            for (j, l) in g.luns.iter().enumerate() {
                let n = lun_at(l, format!("group[{k}].lun[{j}].lun"))?;
                scsi.add_lun(Some(name), n, devices[l.device.get_ref()].clone());
            }
        }
        // Target port groups before any port starts: no command runs
        // through a port before its group's state applies to it. Those
        // that follow a DRBD role get it below, before the ports too.
        scsi.set_alua(cfg.alua());
        let poll = *cfg.drbd.poll_interval_ms.get_ref();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pre = Daemon {
            cfg: Mutex::new(cfg.clone()),
            cfg_path: None,
            scsi: scsi.clone(),
            devices: Mutex::new(BTreeMap::new()),
            targets: Vec::new(),
            log: log.clone(),
            drbd,
            stop: stop.clone(),
        };
        pre.start_roles();
        let drbd = pre.drbd;
        let mut targets = Vec::new();
        for (i, t) in cfg.targets.iter().enumerate() {
            let rt = TargetRt::start(t, i as u32, &scsi, log.clone(), opts)
                .map_err(|(span, k, m)| cfg.error(span, format!("{}.{k}", cfg.target_key(i)), m))?;
            // The port's own default LUNs. A login that came in the
            // moment since the port started gets REPORTED LUNS DATA HAS
            // CHANGED for them.
            for (j, l) in t.luns.iter().enumerate() {
                let n = lun_at(l, format!("{}.lun[{j}].lun", cfg.target_key(i)))?;
                scsi.add_port_lun(rt.port().name(), n, devices[l.device.get_ref()].clone());
            }
            targets.push(rt);
        }
        created.into_iter().for_each(CreatedFile::keep);
        let daemon = Arc::new(Daemon {
            cfg: Mutex::new(cfg),
            cfg_path,
            scsi,
            devices: Mutex::new(devices),
            targets,
            log,
            drbd,
            stop: stop.clone(),
        });
        if poll > 0 && !daemon.drbd.is_empty() {
            let weak = Arc::downgrade(&daemon);
            std::thread::Builder::new()
                .name("srptd-drbd".into())
                .spawn(move || roles::watch_roles(weak, Duration::from_millis(poll), stop))
                .map_err(|e| ConfigError {
                    file: PathBuf::new(),
                    line: 0,
                    key: "drbd.poll_interval_ms".into(),
                    message: format!("cannot start the DRBD role poller: {e}"),
                })?;
        }
        Ok(daemon)
    }

    /// The running targets, in the configuration's order.
    /// The NIC daemon's process ID, when a target port is on its NIC.
    pub fn nicd_pid(&self) -> Option<u32> {
        self.targets.iter().find_map(|t| t.nicd_pid)
    }

    pub fn targets(&self) -> Vec<TargetSummary> {
        self.targets
            .iter()
            .map(|t| {
                let live = t.live();
                TargetSummary {
                    name: live.port.name().to_string(),
                    guid: live.guid,
                    lid: t.lid(),
                    device: live
                        .rdma_cm
                        .as_ref()
                        .map(|c| (c.device().to_string(), c.addresses().to_vec())),
                }
            })
            .collect()
    }

    /// The first target's port.
    pub fn port(&self) -> Arc<TargetPort> {
        self.targets[0].port()
    }

    /// The targets `which` names (a target name or address), or all.
    fn select(&self, which: Option<&str>) -> Result<Vec<(usize, &TargetRt)>, AdminError> {
        let cfg = lock(&self.cfg);
        let all = self.targets.iter().enumerate();
        let Some(w) = which else {
            return Ok(all.collect());
        };
        let hit: Vec<_> = all
            .filter(|(i, t)| t.port().name() == w || cfg.targets[*i].ip.get_ref().to_string() == w)
            .collect();
        if hit.is_empty() {
            return Err(AdminError::NoTarget(w.to_string()));
        }
        Ok(hit)
    }

    /// Enables or disables the targets `which` names, or all.
    fn set_enabled(&self, which: Option<String>, on: bool) -> Result<Value, AdminError> {
        let hit = self.select(which.as_deref())?;
        let mut names = Vec::new();
        let mut cfg = lock(&self.cfg);
        for (i, t) in hit {
            t.port().set_enabled(on);
            cfg.targets[i].enabled = on;
            names.push(t.port().name().to_string());
        }
        Ok(json!({ "enabled": on, "targets": names }))
    }

    /// The target port groups as the SCSI core has them now.
    fn target_groups(&self) -> Value {
        let cfg = lock(&self.cfg);
        let alua = self.scsi.alua();
        let groups: Vec<Value> = alua
            .groups
            .iter()
            .map(|g| {
                let name = cfg
                    .target_groups
                    .iter()
                    .find(|t| *t.group_id.get_ref() == g.id)
                    .map(|t| t.name.get_ref().clone());
                // A port no [[target]] has is another host's.
                let ports: Vec<Value> = g
                    .ports
                    .iter()
                    .map(|rel| {
                        let local = cfg
                            .targets
                            .iter()
                            .zip(&self.targets)
                            .find(|(t, _)| t.rel_tgt_id.get_ref() == rel)
                            .map(|(_, rt)| rt.port().name().to_string());
                        json!({ "rel_tgt_id": rel, "target": local })
                    })
                    .collect();
                json!({
                    "name": name,
                    "group_id": g.id,
                    "state": g.state.name(),
                    "preferred": g.preferred,
                    "ports": ports,
                })
            })
            .collect();
        json!({
            "explicit": alua.explicit,
            "implicit_transition_time": alua.transition_secs,
            "groups": groups,
        })
    }

    /// An implicit ALUA transition: group `which` (name or group_id)
    /// goes to `state`; every session learns of it by a unit attention
    /// (2A/06). The running configuration keeps it.
    fn set_group_state(&self, which: &str, state: StateArg) -> Result<Value, AdminError> {
        let state = state.0;
        let mut cfg = lock(&self.cfg);
        let known = || {
            let names: Vec<String> = cfg
                .target_groups
                .iter()
                .map(|g| format!("{} ({})", g.name.get_ref(), g.group_id.get_ref()))
                .collect();
            if names.is_empty() {
                "none: add [[target_group]] tables".to_string()
            } else {
                names.join(", ")
            }
        };
        let Some(i) = cfg
            .target_groups
            .iter()
            .position(|g| g.name.get_ref() == which || g.group_id.get_ref().to_string() == which)
        else {
            return Err(AdminError::NoTargetGroup {
                group: which.to_string(),
                known: known(),
            });
        };
        let id = *cfg.target_groups[i].group_id.get_ref();
        if let Some(device) = self.group_follows(id) {
            return Err(AdminError::GroupFollows {
                group: which.to_string(),
                device: device.to_string(),
            });
        }
        let was = self
            .scsi
            .set_group_state(id, state)
            .map_err(|e| AdminError::NoTargetGroup {
                group: e.to_string(),
                known: known(),
            })?;
        cfg.target_groups[i].state = Some(spanned(state.name().to_string()));
        Ok(json!({
            "group": cfg.target_groups[i].name.get_ref(),
            "group_id": id,
            "state": state.name(),
            "was": was.name(),
        }))
    }

    /// Tells every target's channels the LUN maps changed (SRP_AER_REQ);
    /// returns how many were told.
    fn luns_changed(&self) -> usize {
        self.targets
            .iter()
            .map(|t| t.port().notify(srp::target::AerEvent::LunsChanged))
            .sum()
    }

    /// The running configuration. The target port groups' states are the
    /// SCSI core's: an initiator's SET TARGET PORT GROUPS changes them
    /// there, and `srptadm write-config` must save what is in force.
    pub fn config(&self) -> Config {
        let mut cfg = lock(&self.cfg).clone();
        let alua = self.scsi.alua();
        for g in &mut cfg.target_groups {
            if let Some(now) = alua.groups.iter().find(|a| a.id == *g.group_id.get_ref()) {
                if g.follow.is_none() && g.access_state() != now.state {
                    g.state = Some(spanned(now.state.name().to_string()));
                }
            }
        }
        cfg
    }

    /// Executes one admin request and logs it; `Err` is the message for
    /// the user.
    pub fn handle(&self, req: Request) -> Result<Value, AdminError> {
        use crate::log::{Level, Record};
        let (event, changes) = req.event();
        let asked = serde_json::to_value(&req).unwrap_or(Value::Null);
        let cmd = asked["cmd"].as_str().unwrap_or("?").to_string();
        let reload = matches!(req, Request::Reload);
        let words = |v: &Value| answer_text(&req, v).unwrap_or_else(|| v.to_string());
        let r = self.execute(req.clone());
        let record = match &r {
            // The SIGHUP and `srptadm reload` lines scripts look for.
            Ok(v) if reload => Record::info(event, words(v)).fields_of(v),
            Err(e) if reload => Record::warn(
                "reload_refused",
                format!("reload refused, configuration unchanged: {e}"),
            )
            .field("error", e.to_string()),
            Ok(v) => Record::new(
                if changes { Level::Info } else { Level::Debug },
                event,
                if changes {
                    words(v)
                } else {
                    format!("{cmd} {}: ok", args_of(&asked))
                },
            )
            .fields_of(&asked)
            .fields_of(if changes { v } else { &Value::Null }),
            Err(e) => Record::warn(
                "admin_refused",
                format!("{cmd} {} refused: {e}", args_of(&asked)),
            )
            .fields_of(&asked)
            .field("error", e.to_string()),
        };
        self.log.emit(record);
        r
    }

    fn execute(&self, req: Request) -> Result<Value, AdminError> {
        match req {
            Request::Show => Ok(self.show()),
            Request::Sessions => Ok(self.sessions()),
            Request::Devices => Ok(self.devices()),
            Request::Luns => Ok(self.luns()),
            Request::AddDevice { toml } => self.add_device(&toml),
            Request::RemoveDevice { name } => self.remove_device(&name),
            Request::Resize { device, size } => self.resize(&device, &size),
            Request::ChangeMedium { device, image } => self.change_medium(&device, image),
            Request::AddLun { group, lun, device } => self.add_lun(group, lun, device),
            Request::RemoveLun { group, lun } => self.remove_lun(group, lun),
            Request::AddGroup { name } => self.edit(|c| {
                if c.groups.iter().any(|g| g.name.get_ref() == &name) {
                    return Err(AdminError::GroupExists(name));
                }
                c.groups.push(GroupSection {
                    name: spanned(name.clone()),
                    initiators: Vec::new(),
                    luns: Vec::new(),
                });
                self.scsi.add_group(&name);
                Ok(json!({ "added": name }))
            }),
            Request::RemoveGroup { name } => self.edit(|c| {
                let i = c
                    .groups
                    .iter()
                    .position(|g| g.name.get_ref() == &name)
                    .ok_or_else(|| AdminError::NoGroup(name.clone()))?;
                c.groups.remove(i);
                self.scsi.remove_group(&name);
                self.luns_changed();
                Ok(json!({ "removed": name }))
            }),
            Request::AddInitiator { group, initiator } => self.edit(|c| {
                check_initiator(&initiator)?;
                let g = group_mut(c, &group)?;
                if g.initiators.iter().any(|i| i.get_ref() == &initiator) {
                    return Err(AdminError::InitiatorInGroup { initiator, group });
                }
                g.initiators.push(spanned(initiator.clone()));
                self.scsi.add_initiator(&group, &initiator);
                self.luns_changed();
                Ok(json!({ "group": group, "added": initiator }))
            }),
            Request::RemoveInitiator { group, initiator } => self.edit(|c| {
                let g = group_mut(c, &group)?;
                let i = g
                    .initiators
                    .iter()
                    .position(|i| i.get_ref() == &initiator)
                    .ok_or_else(|| AdminError::InitiatorNotInGroup {
                        initiator: initiator.clone(),
                        group: group.clone(),
                    })?;
                g.initiators.remove(i);
                self.scsi.remove_initiator(&group, &initiator);
                self.luns_changed();
                Ok(json!({ "group": group, "removed": initiator }))
            }),
            Request::Enable { target } => self.set_enabled(target, true),
            Request::Disable { target } => self.set_enabled(target, false),
            Request::TargetGroups => Ok(self.target_groups()),
            Request::Roles => Ok(self.roles()),
            Request::SetRole { device, role } => self.set_role(&device, role),
            Request::SetGroupState { group, state } => self.set_group_state(&group, state),
            Request::SetLogLevel { level } => {
                let was = self.log.set_level(level);
                Ok(json!({ "log_level": level, "was": was }))
            }
            Request::Reload => {
                let path = self.cfg_path.clone().ok_or(AdminError::NoConfigFile)?;
                let next = Config::load(&path)?;
                self.reload(next)
            }
            Request::WriteConfig { path } => {
                let path = path
                    .or_else(|| self.cfg_path.clone())
                    .ok_or(AdminError::NoFileToWrite)?;
                let text = self.config().to_toml();
                let tmp = path.with_extension("tmp-srptd");
                std::fs::write(&tmp, &text)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|source| AdminError::Write {
                        path: path.clone(),
                        source,
                    })?;
                Ok(json!({ "written": path }))
            }
        }
    }

    /// Logs every initiator out and waits (bounded) until the channels
    /// are gone: every command the target acknowledged has completed. Then
    /// closes the CM agent's client (its connections disconnected, listens
    /// ended, subscriptions deleted, MAD agents unregistered, then its QP1
    /// objects) and stops the target port, releasing its verbs objects.
    /// Returns the channels still open at the deadline and the objects
    /// left (both 0 after a clean stop).
    pub fn shutdown(&self, within: std::time::Duration) -> (usize, i64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in &self.targets {
            t.port().logout_all(srp::wire::TLogoutReason::NoReason);
        }
        let end = std::time::Instant::now() + within;
        let left = loop {
            let left: usize = self.targets.iter().map(|t| t.port().sessions().len()).sum();
            if left == 0 || std::time::Instant::now() >= end {
                break left;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        for t in &self.targets {
            t.stopping.store(true, std::sync::atomic::Ordering::Release);
            let live = t.live();
            live.cm.client().close();
            if let Some(c) = &live.rdma_cm {
                c.close();
            }
            live.port.stop();
        }
        (
            left,
            self.targets
                .iter()
                .map(|t| t.live().access.live_total())
                .sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_identity_is_per_host_unless_the_usn_names_it() {
        let naa = |usn, name, host| fnv(&identity_key(usn, name, host)) & 0xf_ffff_ffff;
        // One host: one name is one LU, across restarts and processes.
        assert_eq!(naa(None, "ram0", "h1"), naa(None, "ram0", "h1"));
        assert_ne!(naa(None, "ram0", "h1"), naa(None, "ram1", "h1"));
        // Two hosts' default ram0 are two LUs.
        assert_ne!(naa(None, "ram0", "h1"), naa(None, "ram0", "h2"));
        // A usn makes a shared disk one LU whatever its names and hosts,
        // and differs from a device named like it.
        assert_eq!(
            naa(Some("shared7"), "a", "h1"),
            naa(Some("shared7"), "b", "h2")
        );
        assert_ne!(naa(Some("ram0"), "ram0", "h1"), naa(None, "ram0", "h1"));
        assert!(!host_id().is_empty(), "no machine ID and no host name");
    }
}
