//! `srptd`: an SRP target on a soft RoCE NIC, serving logins by RDMA CM
//! (what LIO/SCST ib_srpt with `rdma_cm_port` do), configured by a TOML
//! file (`--config`, see `srptd::config`) or, without one, exporting a
//! RAM disk as LUN 0. `srptadm` talks to it over the control socket.
//! `--fabric ib` puts the port on a managed subnet (`rdma_access::subnet`): it
//! waits for `ibsm run` to activate it, offers device management to
//! srp_daemon-style discovery through the SA, and takes IB CM logins.
//! `--iwarp` (the file's `iwarp = true`) puts it on srptd's own soft iWARP
//! NIC instead (RDMA over TCP; RDMA CM logins only).

#![forbid(unsafe_code)]

use clap::Parser;
use daemon_ctl::bind_control;
use srptd::config::{Config, DeviceSection, Handler, LunEntry};
use srptd::daemon::{preflight, serve_control, serve_metrics, CreatedFile, Daemon};
use srptd::log::{Format, Level, Log, Logger, Record};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use toml::Spanned;

#[derive(Parser)]
#[command(name = "srptd", version, about = "SRP target over the soft RoCE NIC")]
struct Args {
    /// Configuration file (TOML); without it, LUN 0 is a RAM disk.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Validate the configuration and exit: besides the file, everything
    /// a start opens or binds is tried (device files with the access they
    /// need, the control socket's place, the addresses), creating nothing.
    /// Ports and sockets in use (as those of this file's running srptd)
    /// are noted, not refused.
    #[arg(long, requires = "config")]
    check: bool,
    /// Run the target port on this rdma-core device (a real RDMA NIC,
    /// Linux rxe or siw), NAME or NAME:PORT as `ibv_devices` lists it;
    /// logins come by the kernel's RDMA CM on the device's addresses,
    /// discovery (`srp discover --device`, srp_daemon) through a DM agent
    /// on the kernel's user MAD interface (modprobe ib_umad) (overrides
    /// the file's `device`) [default: srptd's own soft RoCE NIC at --ip].
    #[arg(long, value_name = "NAME[:PORT]", value_parser = parse_device)]
    device: Option<rdmacore::DeviceSpec>,
    /// Run the target port on srptd's own soft iWARP NIC at --ip (RDMA
    /// over TCP, what Linux siw speaks) instead of soft RoCE; logins by
    /// RDMA CM (TCP and MPA) at --rdma-cm-port, with the login strings of
    /// a soft RoCE target there (sets the file's `iwarp`).
    #[arg(long, conflicts_with_all = ["device", "nicd"])]
    iwarp: bool,
    /// Address of the target's NIC (overrides the file's `ip`)
    /// [default: 127.0.0.1].
    #[arg(long)]
    ip: Option<IpAddr>,
    /// Run the soft RoCE target ports on the NIC daemon's NICs through
    /// its socket SOCKET [default: $NICD_SOCKET, else nicd's default]; the
    /// default for the roce fabric, so other processes (srp, srpd, rperf)
    /// can use the address too. With no daemon there one is started for
    /// the addresses (`nicd` beside this tool or on PATH); it leaves after
    /// $NICD_IDLE_EXIT (30s) without a client. A target on the `ib`
    /// fabric takes it only when given, from a daemon started by hand with
    /// `nicd --fabric ib`.
    #[arg(
        long,
        value_name = "SOCKET",
        num_args = 0..=1,
        default_missing_value = "", value_parser = nicd::socket_arg,
        conflicts_with_all = ["device", "own_nic"]
    )]
    nicd: Option<std::path::PathBuf>,
    /// Run the soft RoCE target ports on NICs of srptd's own, in its
    /// process (one process per address and UDP port), not the NIC
    /// daemon's; also what $NICD_MODE=own, a udp_port other than 4791, an mtu
    /// other than 4096 or $SOFTROCE_FAULTS choose.
    #[arg(long)]
    own_nic: bool,
    /// RoCEv2 UDP port (overrides the file's `udp_port`) [default: 4791].
    #[arg(long)]
    udp_port: Option<u16>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096; 1024 on a
    /// 1500-byte Ethernet link (overrides the file's `mtu`) [default: 4096].
    #[arg(long, value_parser = rdma_types::Mtu::parse)]
    mtu: Option<rdma_types::Mtu>,
    /// RDMA CM port logins arrive on, ib_srpt's rdma_cm_port; 0 turns
    /// RDMA CM off (overrides the file's `rdma_cm_port`) [default: 5555].
    #[arg(long)]
    rdma_cm_port: Option<u16>,
    /// Who runs the port (overrides the file's `fabric`): `roce`, no
    /// subnet manager; `ib`, a managed subnet: the port waits for an SM
    /// (`ibsm run --node <this ip>`) to make it ACTIVE, and initiators
    /// find the target through the SA (srp_daemon) and log in by IB CM
    /// [default: roce].
    #[arg(long, value_enum)]
    fabric: Option<rdma_access::subnet::Fabric>,
    /// With `--fabric ib`: how long to wait at start for the port to go
    /// ACTIVE, in milliseconds or with a unit (30s) (overrides the file's
    /// `sm_wait_ms`) [default: 30000].
    #[arg(long, value_parser = rdma_types::units::millis)]
    sm_wait_ms: Option<std::time::Duration>,
    /// Without --config: LUN 0 is a RAM disk of this many MiB, or of a
    /// size with its unit (1G).
    #[arg(
        long = "ram-mib",
        value_name = "MIB",
        default_value = "64",
        value_parser = ram_size,
        conflicts_with = "config"
    )]
    ram: u64,
    /// Control socket for srptadm (overrides the file's `control_socket`)
    /// [default: /run/srptd.sock for root, $TMPDIR/srptd-<uid>.sock
    /// otherwise].
    #[arg(long)]
    control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics on this address:port, or on a bare port of
    /// 127.0.0.1 (overrides the file's `metrics`) [default: off].
    #[arg(long)]
    metrics: Option<srptd::config::MetricsAddr>,
    /// Log lines as text for a person, or one JSON object per line (ts,
    /// level, event, target, session, fields, msg) for a collector.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    log_format: Format,
    /// Least important records written; `srptadm set log-level` changes
    /// it while srptd runs.
    #[arg(long, value_enum, default_value_t = Level::Info)]
    log_level: Level,
}

/// mimalloc: the data path allocates a few small buffers per I/O, and
/// glibc's malloc costs several times more instructions per call.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Args as clap::CommandFactory>::command, "8") {
        return code;
    }
    let a = Args::parse();
    let log = Logger::stdout(a.log_format, a.log_level);
    // The libraries' tracing events go to the same log, in its format and
    // at its (changeable) level.
    srptd::log::Bridge::install(log.clone());
    match run(&a, &log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // On standard error, in the format asked for.
            let r = Record::new(Level::Error, "fatal", &e).field("error", &e);
            eprintln!("{}", r.line(a.log_format, std::time::SystemTime::now()));
            ExitCode::FAILURE
        }
    }
}

/// `--device`: NAME or NAME:PORT.
fn parse_device(s: &str) -> Result<rdmacore::DeviceSpec, String> {
    s.parse()
}

/// `--ram-mib`: MiB, or a size with its unit.
fn ram_size(s: &str) -> Result<u64, rdma_types::units::SizeError> {
    rdma_types::units::parse_size_in(s, 1 << 20)
}

fn default_config(a: &Args) -> Result<Config, String> {
    if a.ram == 0 {
        return Err("--ram-mib must be at least 1".into());
    }
    let s = |v| Spanned::new(0..0, v);
    let mut c = Config::default();
    c.devices.push(DeviceSection {
        name: s("ram0".to_string()),
        handler: Spanned::new(0..0, Handler::Ram),
        filename: None,
        size: Some(s(a.ram.to_string())),
        block_size: Spanned::new(0..0, 512),
        read_only: false,
        thin: false,
        rotational: false,
        removable: false,
        nv_cache: false,
        write_through: false,
        o_direct: false,
        t10_vendor_id: None,
        t10_product_id: None,
        usn: None,
        threads_num: None,
        threads_pool_type: None,
        drbd_minor: None,
    });
    c.luns.push(LunEntry {
        lun: Spanned::new(0..0, 0),
        device: s("ram0".to_string()),
    });
    Ok(c)
}

/// The targets on a soft RoCE NIC (neither an rdma-core device nor
/// iWARP).
fn soft_targets(cfg: &Config) -> impl Iterator<Item = &srptd::config::TargetSection> {
    cfg.targets
        .iter()
        .filter(|t| t.device.is_none() && !*t.iwarp.get_ref())
}

/// Whose NICs the soft RoCE targets run on (`nicd::choice`); `None`
/// when there are none. The `ib` fabric and iWARP targets beside them
/// keep srptd's own unless `--nicd` is given; an iWARP target beside
/// them, a udp_port, mtu or $SOFTROCE_FAULTS that only a NIC of srptd's
/// own honours choose it.
fn nic_choice(a: &Args, cfg: &Config) -> Result<Option<nicd::choice::Which>, String> {
    let soft: Vec<_> = soft_targets(cfg).collect();
    if soft.is_empty() {
        return Ok(None);
    }
    let key = |i: usize, k: &str| format!("{}.{k}", cfg.target_key(i));
    let own_only = cfg.targets.iter().enumerate().find_map(|(i, t)| {
        if t.device.is_some() {
            None
        } else if *t.iwarp.get_ref() {
            Some(format!("{} = true", key(i, "iwarp")))
        } else if *t.udp_port.get_ref() != rnic::softroce::ROCE_PORT {
            Some(format!("{} = {}", key(i, "udp_port"), t.udp_port.get_ref()))
        } else if *t.mtu.get_ref() != 4096 {
            Some(format!("{} = {}", key(i, "mtu"), t.mtu.get_ref()))
        } else {
            None
        }
    });
    let asked = nicd::choice::Asked::from_env(a.nicd.as_deref(), a.own_nic, own_only);
    nicd::choice::choose(&asked).map(Some)
}

fn run(a: &Args, log: &Log) -> Result<(), String> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => default_config(a)?,
    };
    // The port options override one target; the daemon's (control
    // socket, metrics) go to the first, where the file keeps them.
    let port_opts = a.device.is_some()
        || a.iwarp
        || a.ip.is_some()
        || a.udp_port.is_some()
        || a.mtu.is_some()
        || a.rdma_cm_port.is_some()
        || a.fabric.is_some()
        || a.sm_wait_ms.is_some();
    if port_opts && cfg.targets.len() > 1 {
        return Err(format!(
            "--device, --iwarp, --ip, --udp-port, --mtu, --rdma-cm-port, --fabric and --sm-wait-ms override a single target; {} has {}",
            a.config.as_ref().map_or("the configuration".into(), |p| p.display().to_string()),
            cfg.targets.len()
        ));
    }
    let t = &mut cfg.targets[0];
    if let Some(d) = &a.device {
        t.device = Some(Spanned::new(0..0, d.to_string()));
    }
    if a.iwarp {
        t.iwarp = Spanned::new(0..0, true);
    }
    if let Some(ip) = a.ip {
        t.ip = Spanned::new(0..0, ip);
    }
    if let Some(p) = a.udp_port {
        t.udp_port = Spanned::new(0..0, p);
    }
    if let Some(m) = a.mtu {
        t.mtu = Spanned::new(0..0, m.bytes() as u32);
    }
    if let Some(p) = a.rdma_cm_port {
        t.rdma_cm_port = p;
    }
    if let Some(f) = a.fabric {
        t.fabric = f;
    }
    if let Some(w) = a.sm_wait_ms {
        t.sm_wait_ms = Spanned::new(0..0, rdma_types::units::as_millis(w));
    }
    if let Some(p) = &a.control_socket {
        t.control_socket = Spanned::new(0..0, p.clone());
    }
    if let Some(m) = a.metrics {
        t.metrics = Some(Spanned::new(0..0, m));
    }
    // The options may have changed what the file said.
    cfg.check().map_err(|e| e.to_string())?;
    // The daemon's NICs or srptd's own, for the soft RoCE targets.
    let nic = nic_choice(a, &cfg)?;
    // What a start would open and bind, tried before anything is made.
    let found = preflight(&cfg, nic.as_ref().is_some_and(|w| w.socket().is_some()))
        .map_err(|e| e.to_string())?;
    if a.check {
        println!(
            "srptd: {}: valid ({}{} devices, {} default LUNs, {} groups)",
            a.config.as_ref().expect("required").display(),
            match cfg.targets.len() {
                1 => String::new(),
                n => format!("{n} targets, "),
            },
            cfg.devices.len(),
            cfg.luns.len(),
            cfg.groups.len()
        );
        for busy in &found.busy {
            println!("srptd: note: {busy}");
        }
        return Ok(());
    }
    if let Some(busy) = found.busy.first() {
        return Err(busy.to_string());
    }
    let t = cfg.target();
    let sock = t.control_socket.get_ref().clone();
    let at = |span, key: &str, m: String| {
        cfg.error(span, format!("{}.{key}", cfg.target_key(0)), m)
            .to_string()
    };

    // SIGTERM/SIGINT are taken by sigwait below, in this thread only: block
    // them before any thread starts so every thread inherits the mask.
    let signals = daemon_ctl::signals::block_term();
    let control = bind_control(&sock)
        .map_err(|e| at(t.control_socket.span(), "control_socket", e.to_string()))?;
    // Removed on a failed start (when this function returns) and at stop.
    let sock_file = CreatedFile::new(&sock);
    // What the NICs and ports take from the environment.
    let opts = srptd::daemon::StartOptions {
        nic: rnic::softroce::NicOptions::from_env().map_err(|e| e.to_string())?,
        inline_max: srp_target::PortOptions::inline_max_from_env(),
        nicd: nic
            .as_ref()
            .and_then(|w| w.socket())
            .map(std::path::Path::to_owned),
        iwarp: iwarp_tcp::NicOptions::default(),
    };
    // A daemon started for the targets' addresses if none answers;
    // connected to under its start lock (held until the targets start).
    let mut held = None;
    if let Some(s) = &opts.nicd {
        let soft: Vec<_> = cfg
            .targets
            .iter()
            .filter(|t| t.device.is_none() && !*t.iwarp.get_ref())
            .collect();
        // A daemon started here serves the first target's fabric; the
        // targets on the other are added as they connect.
        let fabric = soft.first().map_or(nicd::Fabric::Roce, |t| t.fabric);
        let ips: Vec<std::net::IpAddr> = soft
            .iter()
            .filter(|t| t.fabric == fabric)
            .map(|t| *t.ip.get_ref())
            .collect();
        let how = nicd::ondemand::OnDemand::from_env()?;
        let e = nicd::ondemand::ensure(s, &ips, fabric, &how).map_err(|e| e.to_string())?;
        if let Some(started) = &e.started {
            eprintln!("srptd: {started}");
        }
        held = Some(e);
    }
    let daemon = Daemon::start(cfg.clone(), a.config.clone(), log.clone(), &opts)
        .map_err(|e| e.to_string())?;
    drop(held);
    if let Some(w) = &nic {
        let at: Vec<String> = soft_targets(&cfg)
            .map(|t| t.ip.get_ref().to_string())
            .collect();
        let pid = daemon.nicd_pid();
        eprintln!("{}", w.line("srptd", &at.join(", "), pid));
    }
    serve_control(daemon.clone(), control);
    let metrics = match &t.metrics {
        Some(m) => {
            let addr = m.get_ref().0;
            let (local, _) = serve_metrics(daemon.clone(), addr)
                .map_err(|e| at(m.span(), "metrics", format!("cannot listen on {addr}: {e}")))?;
            Some(local)
        }
        None => None,
    };
    let lun0 = cfg.luns.iter().find(|l| *l.lun.get_ref() == 0);
    // Scripts wait for these lines, one per target.
    for (t, run) in cfg.targets.iter().zip(daemon.targets()) {
        let (ip, guid) = (*t.ip.get_ref(), run.guid.0);
        if let Some(lid) = run.lid {
            log.emit(
                Record::info(
                    "port_active",
                    format!("port {ip} ACTIVE on the managed subnet, LID {lid}"),
                )
                .target(&run.name)
                .field("ip", ip)
                .field("lid", lid),
            );
        }
        let iwarp = *t.iwarp.get_ref();
        let ib_sid = (t.ib_cm && run.device.is_none() && !iwarp).then(|| format!("{guid:016x}"));
        log.emit(
            Record::info("target_listening", format!(
                "target {} listening on {}{}, {} devices, {} default LUNs{}, {} groups, id_ext {:016x} ioc_guid {:016x}, control {}",
                run.name,
                match (&run.device, t.rdma_cm_port) {
                    (Some((dev, addrs)), p) => format!(
                        "{} of {dev} (RDMA CM through the kernel)",
                        addrs.iter().map(|a| std::net::SocketAddr::new(*a, p).to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    (None, p) if iwarp => format!("{ip}:{p} (RDMA CM over our soft iWARP NIC)"),
                    (None, 0) => format!("{ip} (RDMA CM off)"),
                    (None, p) => format!("{ip}:{p} (RDMA CM)"),
                },
                ib_sid.as_ref().map(|s| format!(" and IB CM service ID {s}")).unwrap_or_default(),
                cfg.devices.len(),
                cfg.luns.len(),
                lun0.map(|l| format!(" (LUN 0 {})", l.device.get_ref())).unwrap_or_default(),
                cfg.groups.len(),
                guid,
                guid,
                sock.display(),
            ))
            .target(&run.name)
            .field("ip", ip)
            .field("rdma_cm_port", t.rdma_cm_port)
            .field("ib_cm_service_id", &ib_sid)
            .field("id_ext", format!("{guid:016x}"))
            .field("devices", cfg.devices.len())
            .field("default_luns", cfg.luns.len())
            .field("groups", cfg.groups.len())
            .field("control", &sock),
        );
    }
    if let Some(local) = metrics {
        log.emit(
            Record::info(
                "metrics_listening",
                format!("metrics on http://{local}/metrics"),
            )
            .field("address", local),
        );
    }
    // SIGHUP reloads the configuration (sessions stay; the daemon logs
    // the outcome); SIGTERM/SIGINT stop.
    let sig = loop {
        let sig = signals.wait();
        if sig != libc::SIGHUP {
            break sig;
        }
        let _ = daemon.handle(srptd::daemon::Request::Reload);
    };
    log.emit(
        Record::info("shutdown", format!("signal {sig}: logging initiators out"))
            .field("signal", sig),
    );
    let (left, objects) = daemon.shutdown(std::time::Duration::from_secs(10));
    drop(sock_file);
    let r = if left > 0 || objects != 0 {
        Record::warn(
            "stopped",
            format!("{left} channels still closing at exit, {objects} verbs objects left"),
        )
    } else {
        Record::info("stopped", "stopped cleanly, 0 verbs objects left")
    };
    log.emit(
        r.field("channels_left", left)
            .field("verbs_objects_left", objects),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The options that override the file cannot have clap defaults (a
    /// default would always override); their help names the file's
    /// defaults, which must be what the file takes.
    #[test]
    fn help_names_the_files_defaults() {
        let help = Args::command().render_long_help().to_string();
        let t = srptd::config::TargetSection::default();
        assert_eq!(t.fabric, rdma_access::subnet::Fabric::Roce);
        assert!(t.metrics.is_none());
        for want in [
            format!("[default: {}]", t.ip.get_ref()),
            format!("[default: {}]", t.udp_port.get_ref()),
            format!("[default: {}]", t.mtu.get_ref()),
            format!("[default: {}]", t.rdma_cm_port),
            format!("[default: {}]", t.sm_wait_ms.get_ref()),
            "[default: roce]".to_string(),
            "[default: off]".to_string(),
            "[default: 64]".to_string(),
        ] {
            assert!(help.contains(&want), "{want} missing from\n{help}");
        }
    }

    #[test]
    fn ram_takes_mib_or_a_size() {
        assert_eq!(ram_size("64"), Ok(64 << 20));
        assert_eq!(ram_size("1G"), Ok(1 << 30));
        assert!(ram_size("1X").is_err());
    }
}
