//! `srp_daemon`'s discovery: ask each target port's device management
//! agent for its I/O controllers and their service entries, turn every
//! SRP service entry (`SRP.T10:<id_ext>`) into a login string, let the
//! rules file decide, and hand the allowed ones to whoever logs in.
//!
//! The ports to ask are given by address, or named by the subnet
//! administrator of a managed subnet ([`dm_ports`]: every port whose
//! CapabilityMask has IsDeviceManagementSupported, IBA 14.4.8, with a
//! path to it). With a rescan period, [`Discovery::run`] walks again every
//! period until its [`Host`] reports a termination signal, sooner after a
//! walk with failures (0.5 s, doubling up to the period), and at once
//! when the SA reports a port in service (trap 64, IBA 14.2.5.1); the trap
//! subscription follows the master SM when another takes over.
//!
//! What the walk does goes out as [`Event`]s for the caller to print or
//! log; logins already held and new logins go through the [`Host`] (srpd's
//! control socket for `srp discover`). The walk reads a clock and sleeps
//! (it waits on DM answers and on the host's signals): it is a driver,
//! not a sans-IO core.

use crate::connectors::{SaPortError, SubnetPort};
use crate::login::{target_keys, LoginOptions, TargetAddress};
use crate::rules::{Decision, Rules, TargetInfo};
use rdma_access::dm::Ioc;
use rdma_access::sa::SaClient;
use rdma_access::{CmAgent, CmError};
use rdma_mad::sa::PathRecord;
use rdma_mad::smp::Notice;
use rdma_types::{Gid, Pkey};
use std::net::IpAddr;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// DM requests are sent this many more times after the first times out.
const DM_RETRIES: u32 = 3;

/// A port to walk: how it is named in messages, where it is, and the
/// partition its login string carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The port in messages: its address, or its LID and GID.
    pub label: String,
    /// Its GID.
    pub dgid: Gid,
    /// The partition of the path to it.
    pub pkey: Pkey,
}

impl Probe {
    /// The port at `ip` (its GID from the address), default partition.
    pub fn at(ip: IpAddr) -> Probe {
        Probe {
            label: ip.to_string(),
            dgid: Gid::from_ip(ip),
            pkey: Pkey(0xffff),
        }
    }

    /// The port at the end of `path`, in the path's partition.
    pub fn along(path: &PathRecord) -> Probe {
        Probe {
            label: format!("LID {} ({})", path.dlid, path.dgid),
            dgid: path.dgid,
            pkey: path.pkey,
        }
    }
}

/// Which ports to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// These addresses (`--target`).
    Given(Vec<IpAddr>),
    /// The ports the SA names with device management (srp_daemon's normal
    /// mode), paths in partition `pkey` (any when `None`).
    FromSa {
        /// The partition (srp_daemon -p).
        pkey: Option<Pkey>,
    },
}

/// What to walk and what to do with what is found.
#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    /// The ports to ask.
    pub ports: Ports,
    /// The rules file (allow/deny lines, per-target options).
    pub rules: Rules,
    /// How long to wait for each DM answer (sent 3 more times).
    pub timeout: Duration,
    /// Walk again every this long until a signal (`None`: once).
    pub rescan: Option<Duration>,
    /// Log in to every allowed target not held yet (srp_daemon -e).
    pub login: bool,
    /// Report targets held already too (srp_daemon -a).
    pub all: bool,
}

/// One SRP target port an I/O controller offers, and what the rules say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The port asked, as [`Probe::label`] names it.
    pub probe: String,
    /// What the rules match on.
    pub info: TargetInfo,
    /// The rules' decision.
    pub decision: Decision,
}

impl Found {
    /// The login string (srp_daemon -c), with the allowing rule's options.
    pub fn login_string(&self) -> String {
        let i = &self.info;
        let mut s = target_keys(
            i.id_ext,
            i.ioc_guid,
            &TargetAddress::IbCm {
                dgid: i.dgid,
                pkey: i.pkey,
                service_id: i.service_id,
            },
        );
        if !self.decision.options.is_empty() {
            s.push(',');
            s.push_str(&self.decision.options);
        }
        s
    }

    /// The login string by RDMA CM (`dest=ADDRESS:port`), for a RoCE port
    /// found by its address: the port's GID is that address, and its
    /// target listens for RDMA CM logins on `port` (srptd's
    /// `rdma_cm_port`, ib_srpt's `rdma_cm_port`). With the allowing rule's
    /// options.
    pub fn rdma_cm_login_string(&self, port: u16) -> String {
        let i = &self.info;
        let mut s = target_keys(
            i.id_ext,
            i.ioc_guid,
            &TargetAddress::RdmaCm {
                dest: std::net::SocketAddr::new(i.dgid.to_ip(), port),
                src: None,
            },
        );
        if !self.decision.options.is_empty() {
            s.push(',');
            s.push_str(&self.decision.options);
        }
        s
    }

    /// Whether one of `held` (login strings) is a login to this target
    /// port: the same id_ext and ioc_guid, and its address: the same
    /// dgid by IB CM, or by RDMA CM the address that is the port's GID (a
    /// RoCE port found by its address, logged in to as
    /// [`Found::rdma_cm_login_string`] says).
    pub fn held_in(&self, held: &[String]) -> bool {
        let i = &self.info;
        held.iter()
            .filter_map(|h| LoginOptions::parse(h).ok())
            .any(|o| {
                o.id_ext == i.id_ext
                    && o.ioc_guid == i.ioc_guid
                    && match o.address {
                        TargetAddress::IbCm { dgid, .. } => dgid == i.dgid,
                        TargetAddress::RdmaCm { dest, .. } => dest.ip() == i.dgid.to_ip(),
                    }
            })
    }
}

/// The SRP target ports of `ioc` found through `probe`: none unless the
/// IOC's class is SRP; one per service entry named `SRP.T10:<id_ext>`.
pub fn srp_targets(probe: &Probe, ioc: &Ioc, rules: &Rules) -> Vec<Found> {
    let p = &ioc.profile;
    if p.io_class != rdma_mad::dm::IO_CLASS_SRP {
        return Vec::new();
    }
    ioc.services
        .iter()
        .filter_map(|e| {
            let id_ext = e
                .name_str()
                .strip_prefix("SRP.T10:")
                .and_then(|h| u64::from_str_radix(h, 16).ok())?;
            let info = TargetInfo {
                id_ext,
                ioc_guid: p.guid.0,
                dgid: probe.dgid,
                service_id: e.id,
                pkey: probe.pkey,
            };
            Some(Found {
                probe: probe.label.clone(),
                decision: rules.decide(&info),
                info,
            })
        })
        .collect()
}

/// srp_daemon's query: every port whose CapabilityMask has
/// IsDeviceManagementSupported, each with its first path from `port` in
/// partition `pkey` (any partition when `None`); ports without such a
/// path are left out. Our own port is among them when it says so: on a
/// port processes share (the NIC daemon's) a target may serve there.
///
/// # Errors
/// The SA did not answer or answered an error.
pub fn dm_ports(port: &dyn SubnetPort, pkey: Option<Pkey>) -> Result<Vec<PathRecord>, SaPortError> {
    let sa = port.sa()?;
    let recs = sa
        .port_info_records(None, Some(rdma_mad::smp::cap::IS_DEVICE_MGMT_SUPPORTED))
        .map_err(|e| port.sa_error(&sa, e))?;
    let mut out = Vec::new();
    for r in &recs {
        let paths = sa
            .paths_to_lid(port.agent().gid(), r.lid, pkey)
            .map_err(|e| port.sa_error(&sa, e))?;
        if let Some(p) = paths.first() {
            out.push(*p);
        }
    }
    Ok(out)
}

/// What went wrong in a walk; the walk goes on (and the next comes sooner).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The SA could not name the ports to ask (see [`SaPortError`]).
    #[error(transparent)]
    Sa(#[from] SaPortError),
    /// The SA refused a trap subscription: traps 64/65 will not arrive,
    /// only the periodic rescan finds new ports.
    #[error("subscribe to trap {trap}: {source}")]
    Subscribe {
        /// The trap number.
        trap: u16,
        /// Why.
        source: SaPortError,
    },
    /// Someone else took the SA client's notices (a bug of the caller:
    /// one trap reader per port).
    #[error("the SA client's notices were taken")]
    NoticesTaken,
    /// A port's device management agent did not answer or answered an
    /// error (a port that came up before its DM agent registered answers
    /// "bad version"; the next walk asks again).
    #[error("{probe}: device management query failed: {source}")]
    Dm {
        /// The port asked.
        probe: String,
        /// Why.
        source: CmError,
    },
    /// The host could not log in to a target found.
    #[error("login to {probe} ({id_ext:016x}): {source}")]
    Login {
        /// The port the target was found through.
        probe: String,
        /// The target port's id_ext.
        id_ext: u64,
        /// What the host said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What a walk does, in order, for the caller to print or log.
#[derive(Debug)]
pub enum Event<'a> {
    /// Subscribed to traps 64/65 at the SA of the SM at `sm_lid`.
    Subscribed {
        /// The master SM's LID.
        sm_lid: u16,
    },
    /// The port's master SM moved: subscribing again.
    SmMoved {
        /// The old SM LID.
        from: u16,
        /// The new one.
        to: u16,
    },
    /// Walk number `round` (from 1) starts.
    ScanStarted {
        /// The walk's number.
        round: u64,
    },
    /// An I/O controller in `slot` of the port `probe`.
    Ioc {
        /// The port asked.
        probe: &'a str,
        /// Its slot.
        slot: u8,
        /// The controller.
        ioc: &'a Ioc,
    },
    /// A target port the rules deny.
    Denied(&'a Found),
    /// A target port the host is logged in to already (left out unless
    /// [`DiscoveryConfig::all`]).
    Held(&'a Found),
    /// A target port to report (its login string).
    Target(&'a Found),
    /// The host logged in to the last target, under this name.
    LoggedIn {
        /// The login's name.
        name: &'a str,
    },
    /// A failure; the walk goes on.
    Failed(DiscoveryError),
    /// Walk `round` is over; it found `found` SRP target ports.
    ScanDone {
        /// The walk's number.
        round: u64,
        /// SRP target ports found (denied and held ones too).
        found: usize,
    },
    /// A single walk found no SRP target and had no failures.
    NoneFound,
    /// Walk `round` had failures: the next comes after `next`.
    RetrySoon {
        /// The walk's number.
        round: u64,
        /// How long until the next walk.
        next: Duration,
    },
    /// A trap from the SA (64: port in service, which starts a walk; 65:
    /// port out of service).
    Trap {
        /// The trap number.
        number: u16,
        /// The port it names.
        gid: Gid,
    },
    /// A termination signal ended the rescans after `rounds` walks.
    Stopped {
        /// The signal.
        signal: i32,
        /// Walks done.
        rounds: u64,
    },
}

/// What the walk needs of its caller: the logins held, a way to log in,
/// a place for events, and the termination signals.
pub trait Host {
    /// Login strings of the logins held now (none if nobody holds any).
    fn held(&mut self) -> Vec<String>;
    /// Logs in to `target` (with [`Found::login_string`], or the RDMA CM
    /// form where the host logs in by RDMA CM); the login's name.
    ///
    /// # Errors
    /// Whatever the logging-in party said.
    fn login(&mut self, target: &Found)
        -> Result<String, Box<dyn std::error::Error + Send + Sync>>;
    /// Reports what the walk does.
    fn event(&mut self, event: Event<'_>);
    /// Waits at most `timeout` for a termination signal (rescans only).
    fn wait_signal(&mut self, timeout: Duration) -> Option<i32>;
}

/// A subscription to traps 64/65 at the SA of the master SM whose LID the
/// port had when it was made.
struct TrapSub {
    _sa: Arc<SaClient>,
    notices: Receiver<(Gid, Notice)>,
}

/// Subscribes to traps 64 and 65 with a fresh SA client (a new master SM
/// inherits no subscriptions).
fn subscribe_traps(port: &dyn SubnetPort) -> Result<TrapSub, DiscoveryError> {
    port.renew_sa();
    let sa = port.sa()?;
    for trap in [64, 65] {
        sa.subscribe(trap).map_err(|e| DiscoveryError::Subscribe {
            trap,
            source: port.sa_error(&sa, e),
        })?;
    }
    let notices = sa.notices().ok_or(DiscoveryError::NoticesTaken)?;
    Ok(TrapSub { _sa: sa, notices })
}

/// The GID a trap 64/65 names (IBA 14.2.5.1: data details bytes 6..22).
fn trap_gid(n: &Notice) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&n.data_details[6..22]);
    Gid(g)
}

/// The discovery of one local port (see the module docs).
pub struct Discovery<'a> {
    agent: &'a CmAgent,
    subnet: Option<&'a dyn SubnetPort>,
    cfg: DiscoveryConfig,
}

impl<'a> Discovery<'a> {
    /// Walks from the port of `agent`; `subnet` is that port on a managed
    /// subnet (needed for [`Ports::FromSa`] and for traps), `None` on RoCE.
    pub fn new(
        agent: &'a CmAgent,
        subnet: Option<&'a dyn SubnetPort>,
        cfg: DiscoveryConfig,
    ) -> Discovery<'a> {
        Discovery { agent, subnet, cfg }
    }

    /// The ports to ask in this walk.
    fn probes(&self) -> Result<Vec<Probe>, DiscoveryError> {
        match (&self.cfg.ports, self.subnet) {
            (Ports::FromSa { pkey }, Some(port)) => {
                Ok(dm_ports(port, *pkey)?.iter().map(Probe::along).collect())
            }
            (Ports::FromSa { .. }, None) => Ok(Vec::new()),
            (Ports::Given(ips), _) => Ok(ips.iter().copied().map(Probe::at).collect()),
        }
    }

    /// One walk: each port's IOCs, their SRP targets, the rules, the
    /// logins. Returns the targets found and whether nothing failed.
    fn scan(&self, host: &mut dyn Host) -> (usize, bool) {
        let cfg = &self.cfg;
        // Logins the host holds already (their login strings): left out
        // of the output unless `all`, and never logged in to twice (a
        // second SINGLE login would end the first).
        let held: Vec<String> = if cfg.all && !cfg.login {
            Vec::new()
        } else {
            host.held()
        };
        let mut ok = true;
        let mut found = 0;
        let probes = self.probes().unwrap_or_else(|e| {
            host.event(Event::Failed(e));
            ok = false;
            Vec::new()
        });
        for probe in &probes {
            let iocs = match rdma_access::dm::query_iocs(
                self.agent,
                probe.dgid,
                cfg.timeout,
                DM_RETRIES,
            ) {
                Ok(i) => i,
                Err(source) => {
                    host.event(Event::Failed(DiscoveryError::Dm {
                        probe: probe.label.clone(),
                        source,
                    }));
                    ok = false;
                    continue;
                }
            };
            for (slot, ioc) in &iocs {
                host.event(Event::Ioc {
                    probe: &probe.label,
                    slot: *slot,
                    ioc,
                });
                for t in srp_targets(probe, ioc, &cfg.rules) {
                    found += 1;
                    if !t.decision.allow {
                        host.event(Event::Denied(&t));
                        continue;
                    }
                    let logged_in = t.held_in(&held);
                    if logged_in && !cfg.all {
                        host.event(Event::Held(&t));
                        continue;
                    }
                    host.event(Event::Target(&t));
                    if cfg.login && !logged_in {
                        match host.login(&t) {
                            Ok(name) => host.event(Event::LoggedIn { name: &name }),
                            Err(source) => {
                                host.event(Event::Failed(DiscoveryError::Login {
                                    probe: t.probe.clone(),
                                    id_ext: t.info.id_ext,
                                    source,
                                }));
                                ok = false;
                            }
                        }
                    }
                }
            }
        }
        (found, ok)
    }

    /// Walks once, or with [`DiscoveryConfig::rescan`] until the host
    /// reports a signal; true if no walk failed (a signal ends it as
    /// true).
    pub fn run(&self, host: &mut dyn Host) -> bool {
        let rescan = self.cfg.rescan;
        // Traps 64/65, with rescans on a managed subnet: subscribed before
        // the first walk, again whenever the port's SM LID changes.
        let mut traps: Option<TrapSub> = None;
        let mut traps_sm_lid: Option<u16> = None;
        let mut round = 0u64;
        // After a walk with failures (a port that came up before its
        // device management agent was registered answers "bad version"),
        // the next comes sooner: 0.5 s, doubling up to the rescan period.
        let mut retry_in = Duration::from_millis(500);
        loop {
            round += 1;
            if let (Some(port), Some(_)) = (self.subnet, rescan) {
                let now = port.sm_lid();
                if traps.is_none() || traps_sm_lid != Some(now) {
                    if let Some(from) = traps_sm_lid.filter(|l| *l != now) {
                        host.event(Event::SmMoved { from, to: now });
                    }
                    traps = None;
                    traps_sm_lid = Some(now);
                    match subscribe_traps(port) {
                        Ok(t) => {
                            host.event(Event::Subscribed { sm_lid: now });
                            traps = Some(t);
                        }
                        Err(e) => host.event(Event::Failed(e)),
                    }
                }
            }
            host.event(Event::ScanStarted { round });
            let (found, ok) = self.scan(host);
            host.event(Event::ScanDone { round, found });
            let Some(period) = rescan else {
                if found == 0 && ok {
                    host.event(Event::NoneFound);
                }
                return ok;
            };
            // Until the next walk: signals, and (on a managed subnet)
            // traps and SM changes, looked at every 100 ms.
            let wait = if ok {
                retry_in = Duration::from_millis(500);
                period
            } else {
                let w = retry_in.min(period);
                retry_in = (retry_in * 2).min(period);
                host.event(Event::RetrySoon { round, next: w });
                w
            };
            let next = Instant::now() + wait;
            loop {
                let left = next.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if let Some(signal) = host.wait_signal(left.min(Duration::from_millis(100))) {
                    host.event(Event::Stopped {
                        signal,
                        rounds: round,
                    });
                    return true;
                }
                let Some(port) = self.subnet else { continue };
                if traps_sm_lid != Some(port.sm_lid()) {
                    break; // a new master SM: subscribe again and walk
                }
                let mut appeared = false;
                while let Some(Ok((_, n))) = traps.as_ref().map(|t| t.notices.try_recv()) {
                    appeared |= n.trap_number == 64;
                    host.event(Event::Trap {
                        number: n.trap_number,
                        gid: trap_gid(&n),
                    });
                }
                if appeared {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_access::dm::IocLimits;
    use rdma_types::Guid;

    fn probe() -> Probe {
        Probe::at("127.0.0.1".parse().unwrap())
    }

    #[test]
    fn an_srp_ioc_gives_one_login_string_per_srp_service_entry() {
        let mut ioc = Ioc::srp(Guid(0x0002_c903_7f00_0001), &IocLimits::default(), "t");
        ioc.services
            .push(rdma_mad::dm::ServiceEntry::srp(0x1122, 0x3344));
        let rules = Rules::parse("").unwrap();
        let found = srp_targets(&probe(), &ioc, &rules);
        let strings: Vec<String> = found.iter().map(Found::login_string).collect();
        assert_eq!(
            strings,
            [
                "id_ext=0002c9037f000001,ioc_guid=0002c9037f000001,\
                 dgid=00000000000000000000ffff7f000001,pkey=ffff,service_id=0002c9037f000001",
                "id_ext=0000000000001122,ioc_guid=0002c9037f000001,\
                 dgid=00000000000000000000ffff7f000001,pkey=ffff,service_id=0000000000003344",
            ]
        );
        // A RoCE port found by its address: the same target by RDMA CM.
        assert_eq!(
            found[1].rdma_cm_login_string(5555),
            "id_ext=0000000000001122,ioc_guid=0002c9037f000001,dest=127.0.0.1:5555"
        );
        // Held: the same id_ext, ioc_guid and dgid, whatever the options.
        let held = vec![format!("{},max_sect=256", strings[1])];
        assert!(!found[0].held_in(&held));
        assert!(found[1].held_in(&held));
        // Held by RDMA CM (srpd --device): the address is the port's GID;
        // another address is another port.
        let by_cm = vec![found[1].rdma_cm_login_string(5555)];
        assert!(found[1].held_in(&by_cm));
        assert!(!found[0].held_in(&by_cm));
        let elsewhere = vec![by_cm[0].replace("127.0.0.1", "127.0.0.2")];
        assert!(!found[1].held_in(&elsewhere));
    }

    #[test]
    fn rules_deny_or_add_options_and_other_classes_are_skipped() {
        let ioc = Ioc::srp(Guid(0x10), &IocLimits::default(), "t");
        let rules = Rules::parse("a id_ext=0000000000000010,max_cmd_per_lun=8\nd\n").unwrap();
        let found = srp_targets(&probe(), &ioc, &rules);
        assert!(found[0].decision.allow);
        assert!(found[0].login_string().ends_with(",max_cmd_per_lun=8"));
        let deny = Rules::parse("d\n").unwrap();
        assert!(!srp_targets(&probe(), &ioc, &deny)[0].decision.allow);
        let mut other = ioc.clone();
        other.profile.io_class = 0x2000;
        assert!(srp_targets(&probe(), &other, &rules).is_empty());
    }

    /// The walk's side of srpd in a test: holds `held`, logs in by
    /// remembering, keeps the events in words, and has a signal ready.
    #[derive(Default)]
    struct Recorder {
        held: Vec<String>,
        logins: Vec<String>,
        events: Vec<String>,
        signal: Option<i32>,
    }

    impl Host for Recorder {
        fn held(&mut self) -> Vec<String> {
            self.held.clone()
        }
        fn login(
            &mut self,
            target: &Found,
        ) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
            self.logins.push(target.login_string());
            Ok(format!("t{}", self.logins.len()))
        }
        fn event(&mut self, event: Event<'_>) {
            self.events.push(match event {
                Event::Target(t) => format!("target {:x}", t.info.id_ext),
                Event::Held(t) => format!("held {:x}", t.info.id_ext),
                Event::Failed(e) => format!("failed {e}"),
                e => format!("{e:?}")
                    .split([' ', '('])
                    .next()
                    .unwrap_or("")
                    .to_string(),
            });
        }
        fn wait_signal(&mut self, _timeout: Duration) -> Option<i32> {
            self.signal
        }
    }

    /// A walk over soft RoCE on 127.0.213.x: the target port's DM agent
    /// offers an SRP IOC, a second address answers nothing.
    #[test]
    fn a_walk_reports_logs_in_skips_what_is_held_and_stops_on_a_signal() {
        use rdma_access::dm::DmService;
        use rnic::softroce::{SoftCa, SoftRoce};
        let ip = |h: u8| IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 213, h));
        let (gi, gt) = (Guid(0x2131), Guid(0x2132));
        let p = SoftRoce::new(
            vec![
                SoftCa {
                    guid: gi,
                    ip: ip(1),
                },
                SoftCa {
                    guid: gt,
                    ip: ip(2),
                },
            ],
            rnic::softroce::ROCE_PORT + 213,
        );
        let init = CmAgent::start(p.clone(), gi, 0x2131 << 8).unwrap();
        let target = CmAgent::start(p.clone(), gt, 0x2132 << 8).unwrap();
        let dm = DmService::start(&target).unwrap();
        let _ioc = dm
            .register_ioc(Ioc::srp(gt, &IocLimits::default(), "t"))
            .unwrap();
        let cfg = DiscoveryConfig {
            ports: Ports::Given(vec![ip(2)]),
            rules: Rules::parse("").unwrap(),
            timeout: Duration::from_millis(200),
            rescan: None,
            login: true,
            all: false,
        };
        // Once: the target is printed and logged in to.
        let mut host = Recorder::default();
        assert!(Discovery::new(&init, None, cfg.clone()).run(&mut host));
        assert_eq!(
            host.events,
            ["ScanStarted", "Ioc", "target 2132", "LoggedIn", "ScanDone"]
        );
        assert_eq!(host.logins.len(), 1);
        // Held already: left out, not logged in to again; with a rescan
        // period the signal ends the walks, as a success.
        let mut host = Recorder {
            held: host.logins.clone(),
            signal: Some(15),
            ..Default::default()
        };
        let rescan = DiscoveryConfig {
            rescan: Some(Duration::from_secs(1)),
            ..cfg.clone()
        };
        assert!(Discovery::new(&init, None, rescan).run(&mut host));
        assert_eq!(
            host.events,
            ["ScanStarted", "Ioc", "held 2132", "ScanDone", "Stopped"]
        );
        assert!(host.logins.is_empty());
        // A port that answers nothing: a failure naming it, and the walk
        // says it failed; nothing is reported as "none found".
        let mut host = Recorder::default();
        let mute = DiscoveryConfig {
            ports: Ports::Given(vec![ip(9)]),
            timeout: Duration::from_millis(20),
            ..cfg
        };
        assert!(!Discovery::new(&init, None, mute).run(&mut host));
        assert_eq!(host.events.len(), 3, "{:?}", host.events);
        assert!(
            host.events[1].starts_with("failed 127.0.213.9: device management query failed"),
            "{:?}",
            host.events
        );
    }
}
