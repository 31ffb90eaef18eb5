//! `srp`: the SRP initiator's command line. Every subcommand logs in to a
//! target by RDMA CM (or IB CM) over the soft RoCE NIC: `srp io` reads,
//! writes and verifies a LUN, `srp luns` lists what the target shows this
//! initiator, `srp fuse` / `srp nbd` serve LUNs to the OS.
//!
//! `io`, `fuse` and `nbd` keep a LUN across connection loss (the remote
//! port reconnects, with Linux's `reconnect_delay`, `fast_io_fail_tmo` and
//! `dev_loss_tmo`), and with `--dest` given several times (one `--ip` per
//! path) make the paths one multipath device.
//!
//! `discover` walks the DM agents of the ports given (`--target`) or, with
//! `--sa`, of the ports the subnet administrator of a managed subnet names
//! (srp_daemon's normal mode; see `rdma_access::subnet`). With `--sa` or
//! `--fabric ib` our port joins the managed subnet and asks in its
//! partitions (a port of another partition than the target's gets no
//! answer: the target's port drops the MADs and tells the SM); without, it
//! is a plain RoCE port.

#![forbid(unsafe_code)]

use blockload::{Pattern, Workload};
use clap::{Args, Parser, Subcommand};
use rdma_access::subnet::{IbPort, IbPortError, SubnetPort};
use srp_cli::args::{SrptdHints, Tmo};
use srp_cli::initd::InitRequest;
use srp_initiator::discovery::{Discovery, DiscoveryConfig, Event, Host, Ports};
use srp_initiator::rules::Rules;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "srp", version, about = "SRP initiator")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where and as whom to log in.
#[derive(Args, Clone)]
struct Login {
    /// Target's RDMA CM address (ib_srp's dest=ip:port; the address alone
    /// means port 5555, srptd's default). Several: one path each, grouped
    /// into one multipath device per LUN.
    #[arg(long, required = true, value_parser = srp_cli::args::dest)]
    dest: Vec<SocketAddr>,
    /// Address of our soft RoCE NIC; with several paths, one per --dest
    /// (each path needs its own initiator port). With --device: which of
    /// the device's addresses logins come from [default: 127.0.0.2; with
    /// --device, the device's first].
    #[arg(long)]
    ip: Vec<IpAddr>,
    /// Log in through this rdma-core device (a real RDMA NIC, Linux rxe
    /// or siw), NAME or NAME:PORT as `ibv_devices` lists it, by the
    /// kernel's RDMA CM, instead of through our own soft RoCE NIC; every
    /// --dest is a path from its one port. The target's --id-ext is then
    /// needed (ib_srp's login string has it too).
    #[arg(long, value_name = "NAME[:PORT]", value_parser = parse_device)]
    device: Option<rdmacore::DeviceSpec>,
    /// Use the NIC daemon's soft RoCE NIC at --ip through its socket
    /// SOCKET [default: $NICD_SOCKET, else nicd's default]; the default,
    /// so other processes (srptd, srpd, rperf) can use the address too.
    /// With no daemon there one is started for the address (`nicd` beside
    /// this tool or on PATH); it leaves after $NICD_IDLE_EXIT (30s)
    /// without a client.
    #[arg(
        long,
        value_name = "SOCKET",
        num_args = 0..=1,
        default_missing_value = "", value_parser = nicd::socket_arg,
        conflicts_with_all = ["device", "own_nic"]
    )]
    nicd: Option<std::path::PathBuf>,
    /// A soft RoCE NIC of srp's own, in its process (one process per
    /// address and UDP port), not the NIC daemon's; also what $NICD_MODE=own,
    /// a --udp-port other than 4791, an --mtu other than 4096 or
    /// $SOFTROCE_FAULTS choose.
    #[arg(long, conflicts_with = "device")]
    own_nic: bool,
    /// Log in over our soft iWARP NIC at --ip (RDMA over TCP, what Linux
    /// siw speaks) instead of soft RoCE: RDMA CM is then a TCP connection
    /// to --dest and the MPA exchange; the target's id_ext defaults as
    /// over RoCE. RDMA CM logins only (no --service-id).
    #[arg(long, conflicts_with_all = ["device", "nicd", "service_id"])]
    iwarp: bool,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Target's id_ext (hex); by default srptd's for each --dest: the
    /// GUID of its address (0002c903 and the IPv4 address, or 32 bits
    /// folded from an IPv6 one).
    #[arg(long, value_parser = hex64)]
    id_ext: Option<u64>,
    /// Target's ioc_guid (hex); by default as --id-ext.
    #[arg(long, value_parser = hex64)]
    ioc_guid: Option<u64>,
    /// Our initiator_ext (hex): the first half of our initiator port ID,
    /// the name LUN masking matches.
    #[arg(long, value_parser = hex64, default_value = "1")]
    initiator_ext: u64,
    /// Path MTU in bytes (1024 on a 1500-byte Ethernet link).
    #[arg(long, default_value_t = 4096)]
    mtu: usize,
    /// Log in by IB CM to this service ID (hex; ib_srpt listens on its
    /// ioc_guid) at dest's address, instead of by RDMA CM to dest's port.
    #[arg(long, value_parser = hex64)]
    service_id: Option<u64>,
    /// RDMA channels per path (ib_srp's ch_count): channel 0 logs in
    /// SINGLE, the others MULTI; I/O is spread over them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    ch_count: u16,
}

/// How a LUN rides out connection loss (Linux scsi_transport_srp's
/// timers, in seconds or with a unit (500ms, 2m); `off` disables one) and
/// how paths are used.
#[derive(Args, Clone)]
struct Keep {
    /// Seconds between reconnect attempts.
    #[arg(long, default_value = "10")]
    reconnect_delay: Tmo,
    /// Seconds after a failure until I/O fails instead of waiting
    /// (default 15 with one path, 0 with several, so multipath moves I/O
    /// to another path at once).
    #[arg(long)]
    fast_io_fail_tmo: Option<Tmo>,
    /// Seconds after a failure until the LUN is given up.
    #[arg(long, default_value = "600")]
    dev_loss_tmo: Tmo,
    /// Multipath policy: failover or round-robin.
    #[arg(long, default_value = "failover")]
    path_policy: srp_initiator::multipath::Policy,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read, write and verify a LUN (fio-like).
    Io {
        #[command(flatten)]
        login: Login,
        #[command(flatten)]
        keep: Keep,
        /// LUN to use.
        #[arg(long, default_value_t = 0)]
        lun: u16,
        /// Pattern: read, write, randread, randwrite, randrw.
        #[arg(long, default_value = "randrw")]
        rw: Pattern,
        /// Block size in bytes, or with K, M (4k).
        #[arg(long, default_value = "4096", value_parser = rdma_types::units::size::<u32>)]
        bs: u32,
        /// I/Os in flight (jobs).
        #[arg(long, default_value_t = 4)]
        iodepth: u32,
        /// Bytes of the LUN to use, from LBA 0 (K, M, G, T suffixes).
        #[arg(long, default_value = "8M", value_parser = rdma_types::units::parse_size)]
        region: u64,
        /// Bytes to move in all (K, M, G, T suffixes).
        #[arg(long, default_value = "32M", value_parser = rdma_types::units::parse_size)]
        size: u64,
        /// Do not stamp and check data.
        #[arg(long)]
        no_verify: bool,
        /// Every this many milliseconds (or with a unit: 1s), send ABORT
        /// TASK for the oldest outstanding command (as the error handler
        /// does after a timeout), to exercise the target's task management
        /// under I/O; aborted commands are retried, and what happened is
        /// reported at the end.
        #[arg(long, value_parser = rdma_types::units::millis)]
        abort_every_ms: Option<Duration>,
        /// JSON report.
        #[arg(long)]
        json: bool,
    },
    /// Serve the target's LUNs as files `lun<N>` in a FUSE mount until
    /// SIGTERM or SIGINT (fio, dd, losetup and mkfs use them).
    Fuse {
        #[command(flatten)]
        login: Login,
        #[command(flatten)]
        keep: Keep,
        /// Existing directory to mount on.
        #[arg(long)]
        mountpoint: std::path::PathBuf,
        /// Only this LUN (default: every LUN REPORT LUNS lists).
        #[arg(long)]
        lun: Option<u16>,
        /// Let other users reach the files (FUSE allow_other).
        #[arg(long)]
        allow_other: bool,
        /// Use the page cache unless a file is opened O_DIRECT (default:
        /// every open is direct I/O).
        #[arg(long)]
        cached: bool,
    },
    /// Serve a LUN over NBD (newstyle, with TRIM and FLUSH) until SIGTERM
    /// or SIGINT, for qemu-img, nbdcopy and fio's nbd engine.
    Nbd {
        #[command(flatten)]
        login: Login,
        #[command(flatten)]
        keep: Keep,
        /// LUN to export.
        #[arg(long, default_value_t = 0)]
        lun: u16,
        /// TCP address to listen on (loopback by default).
        #[arg(long, default_value = "127.0.0.1:10809", conflicts_with = "socket")]
        listen: SocketAddr,
        /// Listen on this Unix socket instead.
        #[arg(long)]
        socket: Option<std::path::PathBuf>,
        /// Export name (the export also answers to "").
        #[arg(long, default_value = "")]
        name: String,
        /// Refuse writes.
        #[arg(long)]
        read_only: bool,
    },
    /// Send LOGICAL UNIT RESET to a LUN and report the target's answer.
    Reset {
        #[command(flatten)]
        login: Login,
        #[arg(long, default_value_t = 0)]
        lun: u16,
    },
    /// Ask the resident initiator (`srpd`) to log in with a Linux ib_srp
    /// login string (`id_ext=..,ioc_guid=..,dest=ip:port`, as written to
    /// ib_srp's add_target); the LUNs appear as files under its mount root.
    Login {
        /// The login string.
        target: String,
        /// Name of the login (default: srpd picks t<N>).
        #[arg(long)]
        name: Option<String>,
        /// srpd's control socket.
        #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
        control_socket: std::path::PathBuf,
    },
    /// Ask `srpd` to end a login: its LUN files go away, the channels log out.
    Logout {
        /// The login's name (see `srp list`).
        name: String,
        /// srpd's control socket.
        #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
        control_socket: std::path::PathBuf,
    },
    /// Ask `srpd` to look at its targets again now (REPORT LUNS, READ
    /// CAPACITY): new LUNs' files appear, removed ones go, resized ones
    /// change size. srpd does this by itself when a target reports a
    /// change; this is for a target that does not.
    Rescan {
        /// The login's name (default: every login).
        name: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// srpd's control socket.
        #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
        control_socket: std::path::PathBuf,
    },
    /// The logins `srpd` holds: target, path, channels with credits, LUNs
    /// with their files and remote port state.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// srpd's control socket.
        #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
        control_socket: std::path::PathBuf,
    },
    /// Find SRP targets the way srp_daemon does: ask each target port's
    /// device management agent for its I/O controllers and their service
    /// entries, and print one ib_srp login string per SRP target port
    /// (srp_daemon -o -c). With --login (-e), hand the allowed ones to
    /// srpd. Targets srpd is already logged in to are left out unless
    /// --all (-a) is given, as srp_daemon leaves out targets connected
    /// through the local port. The ports to ask: --target addresses, or
    /// with --sa every port the subnet administrator lists with device
    /// management. With --device, from a port of an rdma-core device
    /// through the kernel's user MAD interface (ib_umad), printing RDMA CM
    /// login strings (dest=ADDRESS:--rdma-cm-port) that `srp --device`
    /// logs in with. srp_daemon's short options: -o, -a, -c, -e, -f, -R,
    /// -t.
    Discover {
        /// Address (GID) of a port to ask; repeat for several.
        #[arg(long, required_unless_present = "sa", conflicts_with = "sa")]
        target: Vec<IpAddr>,
        /// srp_daemon's normal mode on a managed subnet: our port (--ip)
        /// joins it (`ibsm run --node <ip>` must list it) and waits to be
        /// ACTIVE; the SA of its master SM names the ports with
        /// IsDeviceManagementSupported and gives the path to each. With
        /// --rescan, traps 64/65 (ports in and out of service) are
        /// subscribed: a port coming up is scanned at once, and the
        /// subscription follows the SM when another takes over.
        #[arg(long)]
        sa: bool,
        /// The fabric our port is on. `ib` (implied by --sa): it joins the
        /// managed subnet (`ibsm run --node <ip>` must list it), waits to
        /// be ACTIVE and asks the --target ports directly, in the
        /// partitions the SM gave it. `roce`: a plain RoCE port.
        #[arg(long, value_enum, default_value = "roce")]
        fabric: rdma_access::subnet::Fabric,
        /// With --sa: only paths in this partition (hex P_Key, srp_daemon
        /// -p); our port must be a member. Default: any partition.
        #[arg(long, value_parser = hex16, requires = "sa")]
        pkey: Option<u16>,
        /// With --sa or --fabric ib: milliseconds (or with a unit: 10s) to
        /// wait for the SM to make our port ACTIVE.
        #[arg(long, default_value = "10000", value_parser = rdma_types::units::millis)]
        sm_wait_ms: Duration,
        /// Address of our soft RoCE NIC.
        #[arg(long, default_value = "127.0.0.2")]
        ip: IpAddr,
        /// Use the NIC daemon's soft RoCE NIC at --ip through its socket
        /// SOCKET [default: $NICD_SOCKET, else nicd's default]; the default
        /// on the roce fabric. With no daemon there one is started for the
        /// address (`nicd` beside this tool or on PATH). With --sa or
        /// --fabric ib only when given, from a daemon started by hand with
        /// `nicd --fabric ib`.
        #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg,
              conflicts_with = "own_nic")]
        nicd: Option<std::path::PathBuf>,
        /// A soft RoCE NIC of srp's own, in its process, not the NIC
        /// daemon's; also what $NICD_MODE=own, a --udp-port other than 4791
        /// or $SOFTROCE_FAULTS choose.
        #[arg(long)]
        own_nic: bool,
        /// Ask from this rdma-core device's port (a real RDMA NIC, Linux
        /// rxe or siw), NAME or NAME:PORT as `ibv_devices` lists it: the
        /// DM queries go through the kernel's user MAD interface
        /// (/dev/infiniband/umadN; modprobe ib_umad), to --target
        /// addresses (a RoCE port has no subnet administrator). With
        /// --login, srpd logs in by RDMA CM (srpd --device).
        #[arg(long, value_name = "NAME[:PORT]", value_parser = parse_device,
              conflicts_with = "nicd")]
        device: Option<rdmacore::DeviceSpec>,
        /// With --device: the targets' RDMA CM port, put in the login
        /// strings printed (srptd's rdma_cm_port).
        #[arg(long, default_value_t = 5555)]
        rdma_cm_port: u16,
        /// RoCEv2 UDP port.
        #[arg(long, default_value_t = 4791)]
        udp_port: u16,
        /// srp_daemon rules file: allow/deny lines and per-target options
        /// (srp_daemon -f).
        #[arg(long, short = 'f')]
        rules: Option<std::path::PathBuf>,
        /// Log in to every allowed target through srpd (srp_daemon -e,
        /// execute the connection commands); never twice to one target.
        #[arg(long, short = 'e')]
        login: bool,
        /// srpd's control socket: where to log in (--login) and to ask
        /// which targets are logged in already.
        #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
        control_socket: std::path::PathBuf,
        /// Milliseconds (or with a unit: 1s) to wait for each answer (sent
        /// 3 more times; srp_daemon -t).
        #[arg(long, short = 't', default_value = "500", value_parser = rdma_types::units::millis)]
        timeout_ms: Duration,
        /// Walk once and exit (srp_daemon -o, as ibsrpdm does); also what
        /// happens without --rescan.
        #[arg(long, short = 'o', conflicts_with = "rescan")]
        once: bool,
        /// Print every target found, also those srpd is logged in to
        /// already (srp_daemon -a, as ibsrpdm prints).
        #[arg(long, short = 'a')]
        all: bool,
        /// Print login strings, one per target port, as written to
        /// ib_srp's add_target (srp_daemon -c); the only output format,
        /// so the default.
        #[arg(long = "login-strings", short = 'c')]
        login_strings: bool,
        /// Also print each I/O controller's profile.
        #[arg(long, short)]
        verbose: bool,
        /// Keep running until SIGTERM/SIGINT and walk again every this
        /// many seconds (or with a unit: 2m; srp_daemon -R): with --login,
        /// targets that appeared since are logged in, those already logged
        /// in are left alone.
        #[arg(long, short = 'R', value_parser = rdma_types::units::secs)]
        rescan: Option<Duration>,
    },
    /// List the LUNs the target shows this initiator (REPORT LUNS, then
    /// INQUIRY and READ CAPACITY of each).
    Luns {
        #[command(flatten)]
        login: Login,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

fn hex16(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| format!("`{s}` is not a 16-bit hex P_Key"))
}

fn hex64(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| format!("`{s}` is not a 64-bit hex number"))
}

/// `--device`: NAME or NAME:PORT.
fn parse_device(s: &str) -> Result<rdmacore::DeviceSpec, String> {
    s.parse()
}

/// `--ip`, or our soft RoCE NIC's usual address.
fn local_ips(l: &Login) -> Vec<IpAddr> {
    if l.ip.is_empty() {
        vec![IpAddr::from([127, 0, 0, 2])]
    } else {
        l.ip.clone()
    }
}

/// One path's [`PathLogin`]: our port `local_guid`/`port` on
/// `sessions`, logging in through `connector` to the target port
/// `id_ext` (and `--ioc-guid`, else the same), with `l`'s initiator_ext
/// and channel count.
fn path_login(
    l: &Login,
    name: String,
    sessions: &Arc<dyn verbs::Provider>,
    local_guid: rdma_types::Guid,
    port: rdma_types::PortNum,
    connector: Arc<dyn srp_initiator::session::Connector>,
    id_ext: u64,
) -> Arc<srp_initiator::path_login::PathLogin> {
    let chan = srp::initiator::ChannelConfig::new(
        l.initiator_ext,
        local_guid,
        id_ext,
        rdma_types::Guid(l.ioc_guid.unwrap_or(id_ext)),
    );
    let mut cfg = srp_initiator::session::SessionConfig::new(chan);
    cfg.port = port;
    Arc::new(
        srp_initiator::path_login::PathLogin::new(
            name,
            sessions.clone(),
            local_guid,
            connector,
            cfg,
        )
        .with_ch_count(l.ch_count),
    )
}

/// The paths of `--device`: one [`PathLogin`] per `--dest`, all from the
/// device's port, logging in by the kernel's RDMA CM.
fn device_paths(
    l: &Login,
    spec: &rdmacore::DeviceSpec,
) -> Result<Vec<Arc<srp_initiator::path_login::PathLogin>>, String> {
    if let Some(sid) = l.service_id {
        return Err(srp_cli::device::DeviceError::IbCm {
            what: format!("--service-id {sid:x}"),
            device: spec.name.clone(),
            soft: "",
        }
        .to_string());
    }
    let Some(id_ext) = l.id_ext else {
        return Err(format!(
            "with --device, give the target's --id-ext (and --ioc-guid if it differs): its \
             port GUID, as in ib_srp's login string (`srp discover` or ibsrpdm show it; for \
             srptd on a device, that device's node GUID: cat /sys/class/infiniband/<dev>/node_guid); \
             --dest {} alone does not say it",
            l.dest[0]
        ));
    };
    let dev = srp_cli::device::DeviceCa::open(spec).map_err(|e| e.to_string())?;
    let src =
        match l.ip.as_slice() {
            [] => dev.source(None),
            [ip] => dev.source(Some(*ip)),
            _ => return Err(
                "with --device, give at most one --ip: every path leaves from the device's port"
                    .into(),
            ),
        }
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for dest in &l.dest {
        out.push(path_login(
            l,
            format!("{}:{src} -> {dest}", spec.name),
            dev.sessions(),
            dev.guid(),
            dev.port(),
            dev.connector(src, *dest, Duration::from_secs(10)),
            id_ext,
        ));
    }
    eprintln!(
        "srp: logging in to {} from {src} on {} ...",
        l.dest
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        spec.name
    );
    Ok(out)
}

/// The paths of `--iwarp`: one [`PathLogin`] per `--dest`, each from its
/// own CA of our soft iWARP NIC (`ips`, one per dest), by RDMA CM.
fn iwarp_paths(
    l: &Login,
    ips: &[IpAddr],
) -> Result<Vec<Arc<srp_initiator::path_login::PathLogin>>, String> {
    let nic = srp_cli::iwarp::IwarpCas::open(ips, iwarp_tcp::NicOptions::default())
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (k, dest) in l.dest.iter().enumerate() {
        let (ip, guid, _) = &nic.cas()[k];
        let connector = Arc::new(SrptdHints(nic.connector(k, *dest, Duration::from_secs(10))));
        out.push(path_login(
            l,
            format!("{ip} -> {dest} (iWARP)"),
            nic.sessions(),
            *guid,
            rdma_types::PortNum(1),
            connector,
            // srptd's port GUID comes from its address over iWARP too.
            l.id_ext.unwrap_or(rnic::softroce::ip_guid(dest.ip()).0),
        ));
    }
    eprintln!(
        "srp: logging in to {} over iWARP ...",
        l.dest
            .iter()
            .zip(ips)
            .map(|(d, ip)| format!("{d} from {ip}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(out)
}

/// One [`PathLogin`] per `--dest`, each on its own soft RoCE CA, or all
/// on the rdma-core device `--device` names.
fn paths(l: &Login) -> Result<Vec<Arc<srp_initiator::path_login::PathLogin>>, String> {
    if let Some(spec) = &l.device {
        return device_paths(l, spec);
    }
    let mtu = rdma_types::Mtu::from_bytes(l.mtu)
        .map_err(|_| format!("MTU {} is not 256, 512, 1024, 2048 or 4096", l.mtu))?;
    let ip = local_ips(l);
    let ips: Vec<IpAddr> = match (ip.len(), l.dest.len()) {
        (1, n) if n > 1 => {
            return Err(format!(
                "{n} paths (--dest) need {n} local addresses (--ip): each path is its own initiator port"
            ))
        }
        (i, d) if i == d => ip.clone(),
        (i, d) => return Err(format!("{i} --ip for {d} --dest: give one --ip per --dest")),
    };
    if l.iwarp {
        return iwarp_paths(l, &ips);
    }
    let cas = rnic::softroce::SoftCa::at_each(&ips);
    let which = srp_cli::args::nic_choice(l.nicd.as_deref(), l.own_nic, l.udp_port, l.mtu)?;
    let at = ips
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let provider: Arc<dyn verbs::Provider> = match which.socket() {
        Some(socket) => {
            let how = nicd::ondemand::OnDemand::from_env()?;
            let held = nicd::ondemand::ensure(socket, &ips, nicd::Fabric::Roce, &how)
                .map_err(|e| e.to_string())?;
            if let Some(s) = &held.started {
                eprintln!("srp: {s}");
            }
            let mut client = None;
            for ip in &ips {
                client = Some(nicd::connect_at(socket, *ip, Some(nicd::Fabric::Roce))?.0);
            }
            let client = client.ok_or("no --ip")?;
            eprintln!("{}", which.line("srp", &at, Some(client.daemon_pid())));
            nicd::data_path(client, nicd::data_here())
        }
        None => {
            srp_cli::args::check_local(&ips, l.udp_port).map_err(|e| e.to_string())?;
            let nic = rnic::softroce::NicOptions::from_env().map_err(|e| e.to_string())?;
            let own = rnic::softroce::SoftRoce::with_options(cas.clone(), l.udp_port, mtu, nic);
            eprintln!("{}", which.line("srp", &at, None));
            own
        }
    };
    // Sessions reach the NIC through a client of the access layer, which
    // tracks every verbs object they make; the CM agents through another,
    // which tracks their CM ids and MAD agents too (each agent holds it).
    let access = rdma_access::resource::AccessLayer::new(provider.clone());
    let sessions: Arc<dyn verbs::Provider> = access.client("srp initiator").into_provider();
    let cm = access.client("cm").into_provider();
    let timeout = Duration::from_secs(10);
    let mut out = Vec::new();
    for (k, (ca, dest)) in cas.iter().zip(&l.dest).enumerate() {
        let agent =
            rdma_access::CmAgent::start(cm.clone(), ca.guid, (std::process::id() << 8) | k as u32)
                .map_err(|e| format!("start the CM agent on {}: {e}", ca.ip))?;
        agent
            .track_in(cm.client())
            .map_err(|e| format!("track the CM agent on {}: {e}", ca.ip))?;
        let connector: Arc<dyn srp_initiator::session::Connector> =
            Arc::new(SrptdHints(match l.service_id {
                Some(service_id) => Arc::new(srp_initiator::connectors::IbCmConnector {
                    agent,
                    dgid: rdma_types::Gid::from_ip(dest.ip()),
                    service_id,
                    timeout,
                }),
                None => Arc::new(srp_initiator::connectors::RdmaCmConnector {
                    agent,
                    src: ca.ip,
                    dst: *dest,
                    timeout,
                }),
            }));
        // srptd's port GUID comes from its address (rnic::softroce::ip_guid).
        let target_guid = rnic::softroce::ip_guid(dest.ip()).0;
        out.push(path_login(
            l,
            format!("{} -> {dest}", ca.ip),
            &sessions,
            ca.guid,
            rdma_types::PortNum(1),
            connector,
            l.id_ext.unwrap_or(target_guid),
        ));
    }
    // The first login follows at once; with nothing at the other end it
    // waits the whole timeout, so say what is going on.
    eprintln!(
        "srp: logging in to {} ...",
        l.dest
            .iter()
            .zip(&ips)
            .map(|(d, ip)| format!("{d} from {ip}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(out)
}

/// The first path's session, for one-shot commands.
fn login(l: &Login) -> Result<Arc<srp_initiator::session::Session>, String> {
    paths(l)?[0].session().map_err(|e| e.to_string())
}

/// `srp io --abort-every-ms`: until `stop`, every `every` ABORT TASK for
/// the oldest outstanding command of each path's channel 0.
/// Returns how many aborts were asked for and the task management counts
/// of the sessions it saw (summed, each session once).
fn abort_loop(
    paths: &[Arc<srp_initiator::path_login::PathLogin>],
    every: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> (u64, srp_initiator::session::SessionStats) {
    let mut asked = 0;
    let mut seen: Vec<Arc<srp_initiator::session::Session>> = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(every);
        for p in paths {
            for s in p.live_channels().into_iter().take(1) {
                if s.abort_oldest() {
                    asked += 1;
                }
                if !seen.iter().any(|x| Arc::ptr_eq(x, &s)) {
                    seen.push(s);
                }
            }
        }
    }
    let mut sum = srp_initiator::session::SessionStats::default();
    for s in &seen {
        let st = s.stats();
        sum.tmfs += st.tmfs;
        sum.aborts_complete += st.aborts_complete;
        sum.aborts_failed += st.aborts_failed;
        sum.aborted += st.aborted;
    }
    (asked, sum)
}

/// One line per live channel that dropped IUs it could not match (an
/// SRP_RSP for no outstanding tag, say): they say that a target answered a
/// command this session never sent or already ended, which verify failures
/// alone do not tell (issue 33).
fn dropped_ius(paths: &[Arc<srp_initiator::path_login::PathLogin>]) -> Vec<String> {
    let mut out = Vec::new();
    for p in paths {
        for (k, s) in p.live_channels().iter().enumerate() {
            let n = s.stats().protocol_errors;
            if n == 0 {
                continue;
            }
            let first = s.take_events().into_iter().find_map(|e| match e {
                srp::initiator::Event::Protocol(why) => Some(why.to_string()),
                _ => None,
            });
            out.push(format!(
                "srp: path {} channel {k}: {n} IUs dropped as protocol errors (first kept: {})",
                p.name,
                first.as_deref().unwrap_or("none kept")
            ));
        }
    }
    out
}

/// How long `srp io` waits for its cache flush after an interrupt: with
/// blockload's STOP_WAIT for the I/O in flight, well within STOP_GRACE.
const FLUSH_WAIT: Duration = Duration::from_millis(250);

/// `disk.flush()` on a thread of its own, waited for up to `wait`: `None`
/// when it did not answer in time (the thread is left to the exit).
fn flush_within(
    disk: &Arc<dyn blockload::BlockDevice>,
    wait: Duration,
) -> Option<std::io::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = disk.clone();
    std::thread::Builder::new()
        .name("flush".into())
        .spawn(move || {
            let r = d.flush();
            // Let go before answering: the caller's drop of its own is
            // then the last, and logs out on its thread, where a thread
            // still holding this one would have the exit cut the logout
            // short (the target keeping the session until its keepalive).
            drop(d);
            let _ = tx.send(r);
        })
        .ok()?;
    rx.recv_timeout(wait).ok()
}

/// LUN `lun` over every path, kept across connection loss.
fn open_kept(
    paths: &[Arc<srp_initiator::path_login::PathLogin>],
    keep: &Keep,
    lun: u16,
) -> Result<Arc<dyn blockload::BlockDevice>, String> {
    let fast = keep
        .fast_io_fail_tmo
        .unwrap_or(Tmo(Some(Duration::from_secs(if paths.len() > 1 {
            0
        } else {
            15
        }))));
    let rport = srp_initiator::rport::RportConfig {
        reconnect_delay: keep.reconnect_delay.rport(),
        fast_io_fail_tmo: fast.rport(),
        dev_loss_tmo: keep.dev_loss_tmo.rport(),
    };
    rport.validate().map_err(|e| e.to_string())?;
    let no_path = keep.dev_loss_tmo.0.unwrap_or(Duration::from_secs(600));
    srp_initiator::path_login::open_lun(paths, lun, rport, keep.path_policy, no_path)
        .map_err(|e| format!("open LUN {lun} {e}"))
}

/// Why a server (`srp fuse`, `srp nbd`) stopped by a signal exits without
/// logging out: a request still waits on the target, and a logout would
/// wait on it too.
fn no_answer(l: &Login) -> String {
    format!(
        "a request still waits on {}, which does not answer; exiting without logout",
        dests(l)
    )
}

/// Targets for messages.
fn dests(l: &Login) -> String {
    l.dest
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn run(cmd: Cmd) -> Result<bool, String> {
    match cmd {
        Cmd::Io {
            login: l,
            keep,
            lun,
            rw,
            bs,
            iodepth,
            region,
            size,
            no_verify,
            abort_every_ms,
            json,
        } => {
            if abort_every_ms.is_some_and(|d| d < Duration::from_millis(1)) {
                return Err("--abort-every-ms must be at least 1".into());
            }
            // Before any thread starts, so all of them inherit the mask.
            let interrupt =
                daemon_ctl::signals::block_term().watch("srp", daemon_ctl::signals::STOP_GRACE);
            let paths = paths(&l)?;
            let disk = open_kept(&paths, &keep, lun)?;
            if !json {
                println!(
                    "srp: logged in to {} ({} path{}, {} channel{} each); LUN {lun}: {} blocks of {} B",
                    dests(&l),
                    paths.len(),
                    if paths.len() == 1 { "" } else { "s" },
                    l.ch_count,
                    if l.ch_count == 1 { "" } else { "s" },
                    disk.num_blocks(),
                    disk.block_size()
                );
            }
            let mut w = Workload::new(rw);
            w.bs = bs;
            w.jobs = iodepth;
            w.region = Some(region);
            w.size = Some(size);
            w.verify = !no_verify;
            w.runtime = Duration::from_secs(300);
            let run =
                |w: &Workload| blockload::run_until(disk.clone(), w, interrupt.flag(), |_| {});
            let r = match abort_every_ms {
                None => run(&w),
                Some(every) => {
                    let stop = std::sync::atomic::AtomicBool::new(false);
                    std::thread::scope(|sc| {
                        let aborter = sc.spawn(|| abort_loop(&paths, every, &stop));
                        let r = run(&w);
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        let (asked, stats) = aborter.join().unwrap_or_default();
                        if !json {
                            println!(
                                "srp: ABORT TASK asked {asked} times: {} function complete, {} failed (answered first), {} commands aborted and retried, {} LUN resets",
                                stats.aborts_complete,
                                stats.aborts_failed,
                                stats.aborted,
                                stats.tmfs.saturating_sub(stats.aborts_complete + stats.aborts_failed),
                            );
                        }
                        r
                    })
                }
            }
            .map_err(|e| e.to_string())?;
            // Interrupted with I/O still waiting on a target that does not
            // answer: a cache flush or a logout would wait on it too.
            let waiting = r.jobs_waiting > 0;
            let sig = interrupt.signal().map(daemon_ctl::signals::name);
            // Interrupted with every job back, the flush may still meet a
            // target that stopped answering just after it answered them
            // (their answers were on the way): it gets FLUSH_WAIT, so the
            // report still comes within the interrupt's grace.
            let mut flush_unanswered = false;
            if !waiting {
                let flushed = if sig.is_some() {
                    flush_within(&disk, FLUSH_WAIT)
                } else {
                    Some(disk.flush())
                };
                match flushed {
                    Some(r) => r.map_err(|e| format!("SYNCHRONIZE CACHE: {e}"))?,
                    None => flush_unanswered = true,
                }
            }
            if let Some(sig) = &sig {
                eprintln!("srp: {sig}: stopped; the report holds what was done so far");
            }
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            } else {
                print!("{}", r.table());
                for line in dropped_ius(&paths) {
                    println!("{line}");
                }
            }
            if let Some(sig) = sig.as_deref().filter(|_| waiting || flush_unanswered) {
                let why = if flush_unanswered {
                    format!(
                        "SYNCHRONIZE CACHE got no answer from {} within {} ms: exiting without it or logout",
                        dests(&l),
                        FLUSH_WAIT.as_millis()
                    )
                } else {
                    format!(
                        "I/O still waits on {}, which does not answer: exiting without SYNCHRONIZE CACHE or logout",
                        dests(&l)
                    )
                };
                eprintln!("srp: {sig}: {why}");
                return Ok(r.ok());
            }
            // Logged out now, not when the target's keepalive notices.
            drop(disk);
            drop(paths);
            if let Some(sig) = sig {
                eprintln!("srp: {sig}: logged out of {}", dests(&l));
            }
            Ok(r.ok())
        }
        Cmd::Fuse {
            login: l,
            keep,
            mountpoint,
            lun,
            allow_other,
            cached,
        } => {
            // Before any thread starts, so all of them inherit the mask.
            // Stopping (unmount, summary, logout) is bounded by STOP_GRACE.
            let interrupt =
                daemon_ctl::signals::block_term().watch("srp", daemon_ctl::signals::STOP_GRACE);
            let paths = paths(&l)?;
            let luns = match lun {
                Some(n) => vec![n],
                None => {
                    let session = paths[0].session().map_err(|e| e.to_string())?;
                    srp_initiator::disk::report_luns(&session).map_err(|e| e.to_string())?
                }
            };
            let mut devices: Vec<(String, Arc<dyn blockload::BlockDevice>)> = Vec::new();
            for n in &luns {
                devices.push((format!("lun{n}"), open_kept(&paths, &keep, *n)?));
            }
            let opts = blockfuse::Options {
                allow_other,
                direct_io: if cached {
                    blockfuse::DirectIo::WhenRequested
                } else {
                    blockfuse::DirectIo::Always
                },
                fsname: format!("srp:{}", l.dest[0]),
                // Twice this at most (unmount, then abort the connection):
                // well within STOP_GRACE.
                unmount_timeout: Duration::from_millis(150),
                ..Default::default()
            };
            let m = blockfuse::mount(&mountpoint, devices, opts)
                .map_err(|e| format!("mount {}: {e}", mountpoint.display()))?;
            // Scripts wait for this line.
            println!(
                "srp: mounted {} LUNs of {} on {}",
                luns.len(),
                dests(&l),
                m.mountpoint().display()
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
            let sig = daemon_ctl::signals::name(interrupt.wait());
            let stats = m.stats();
            for (name, st) in &stats {
                println!("srp: {name}: {st} before {sig}");
            }
            println!("srp: {sig}: unmounting {}", m.mountpoint().display());
            let _ = std::io::Write::flush(&mut std::io::stdout());
            // A busy mount is detached and its connection aborted; only a
            // request inside a call to a target that does not answer
            // keeps the session from ending (TimedOut).
            match m.unmount() {
                Ok(()) => println!("srp: unmounted"),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    // A logout would wait on the target too.
                    return Err(format!(
                        "{sig}: unmount {}: {e}: {}",
                        mountpoint.display(),
                        no_answer(&l)
                    ));
                }
                Err(e) => eprintln!("srp: unmount {}: {e}", mountpoint.display()),
            }
            // The devices went with the mount; logged out now, not when
            // the target's keepalive notices.
            drop(paths);
            println!("srp: {sig}: logged out of {}", dests(&l));
            Ok(true)
        }
        Cmd::Nbd {
            login: l,
            keep,
            lun,
            listen,
            socket,
            name,
            read_only,
        } => {
            // Before any thread starts, so all of them inherit the mask.
            // Stopping (the connections, the summary, the logout) is
            // bounded by STOP_GRACE.
            let interrupt =
                daemon_ctl::signals::block_term().watch("srp", daemon_ctl::signals::STOP_GRACE);
            let paths = paths(&l)?;
            let disk = open_kept(&paths, &keep, lun)?;
            let mut export = nbd::Export::new(name, disk);
            export.read_only = read_only;
            let server = match &socket {
                Some(p) => nbd::Server::bind_unix(p, export),
                None => nbd::Server::bind_tcp(listen, export),
            }
            .map_err(|e| format!("listen for NBD: {e}"))?;
            let mut handle = server.spawn().map_err(|e| format!("serve NBD: {e}"))?;
            // Scripts wait for this line.
            println!("srp: LUN {lun} of {} served at {}", dests(&l), handle.uri());
            let _ = std::io::Write::flush(&mut std::io::stdout());
            let sig = daemon_ctl::signals::name(interrupt.wait());
            println!(
                "srp: {sig}: stopping NBD ({} connections open)",
                handle.stats().active
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
            // The clients are cut off; a request inside a call to a target
            // that does not answer is given up on after STOP_WAIT.
            let stopped = handle.shutdown_within(blockload::STOP_WAIT);
            let st = handle.stats();
            println!(
                "srp: LUN {lun}: {} requests, {} before {sig}",
                st.requests, st.io
            );
            if let Err(busy) = stopped {
                // A logout would wait on the target too.
                return Err(format!("{sig}: {busy}: {}", no_answer(&l)));
            }
            println!("srp: NBD stopped");
            // Logged out now, not when the target's keepalive notices.
            drop(handle);
            drop(paths);
            println!("srp: {sig}: logged out of {}", dests(&l));
            Ok(true)
        }
        Cmd::Reset { login: l, lun } => {
            // A short command: an interrupt (most likely while a login
            // waits on a target that does not answer) ends it within
            // STOP_GRACE, said on standard error.
            let _interrupt =
                daemon_ctl::signals::block_term().watch("srp", daemon_ctl::signals::STOP_GRACE);
            let session = login(&l)?;
            // Past the new nexus's unit attentions first, as a real user is.
            srp_initiator::disk::Disk::open(session.clone(), lun)
                .map_err(|e| format!("open LUN {lun}: {e}"))?;
            session
                .reset_lun(srp::wire::Lun::from_u64((lun as u64) << 48))
                .map_err(|e| format!("LOGICAL UNIT RESET of LUN {lun}: {e}"))?;
            println!(
                "srp: LOGICAL UNIT RESET of LUN {lun} at {}: function complete",
                l.dest[0]
            );
            Ok(true)
        }
        Cmd::Login {
            target,
            name,
            control_socket,
        } => {
            let v = srpd(&control_socket, &InitRequest::Login { target, name })?;
            println!("srp: logged in as {}", v["name"].as_str().unwrap_or("?"));
            print_login(&v);
            Ok(true)
        }
        Cmd::Logout {
            name,
            control_socket,
        } => {
            srpd(&control_socket, &InitRequest::Logout { name: name.clone() })?;
            println!("srp: logged out of {name}");
            Ok(true)
        }
        Cmd::Rescan {
            name,
            json,
            control_socket,
        } => {
            let v = srpd(&control_socket, &InitRequest::Rescan { name })?;
            if json {
                println!("{v}");
                return Ok(true);
            }
            let all: Vec<srp_cli::initd::Rescan> =
                serde_json::from_value(v).map_err(|e| format!("srpd's answer: {e}"))?;
            for r in &all {
                let lines = r.lines();
                if lines.is_empty() {
                    println!("srp: {}: no change", r.name);
                }
                lines.iter().for_each(|l| println!("srp: {l}"));
            }
            if all.is_empty() {
                println!("srp: no logins");
            }
            Ok(true)
        }
        Cmd::List {
            json,
            control_socket,
        } => {
            let v = srpd(&control_socket, &InitRequest::List)?;
            if json {
                println!("{v}");
            } else {
                let all = v.as_array().cloned().unwrap_or_default();
                if all.is_empty() {
                    println!("srp: no logins");
                }
                for l in &all {
                    print_login(l);
                }
            }
            Ok(true)
        }
        Cmd::Discover {
            target,
            sa,
            fabric,
            pkey,
            sm_wait_ms,
            ip,
            nicd,
            own_nic,
            device,
            rdma_cm_port,
            udp_port,
            rules,
            login,
            control_socket,
            timeout_ms,
            verbose,
            rescan,
            once,
            all,
            login_strings: _,
        } => {
            if device.is_some() && (sa || fabric == rdma_access::subnet::Fabric::Ib) {
                return Err(format!(
                    "srp discover --device: {} (--target ADDRESS); an InfiniBand port's SA \
                     is not asked through the kernel yet",
                    rdmacore::NO_SA_ON_ROCE
                ));
            }
            if rescan.is_some_and(|d| d < Duration::from_secs(1)) {
                return Err("--rescan must be at least 1 second".into());
            }
            let rules = match rules {
                Some(p) => {
                    let text =
                        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                    Rules::parse(&text).map_err(|e| format!("{}: {e}", p.display()))?
                }
                None => Rules::parse("").map_err(|e| e.to_string())?,
            };
            let pkey = pkey.map(rdma_types::Pkey);
            let cfg = DiscoveryConfig {
                ports: if sa {
                    Ports::FromSa { pkey }
                } else {
                    Ports::Given(target)
                },
                rules,
                timeout: timeout_ms.max(Duration::from_millis(1)),
                rescan: if once { None } else { rescan },
                login,
                all,
            };
            let which = match device {
                Some(_) => None,
                None => Some(srp_cli::args::nic_choice(
                    nicd.as_deref(),
                    own_nic,
                    udp_port,
                    4096,
                )?),
            };
            let local = Local {
                ip,
                nicd: which,
                device: device.map(|d| (d, rdma_cm_port)),
                udp_port,
                ib: (sa || fabric == rdma_access::subnet::Fabric::Ib).then_some(IbMode {
                    pkey,
                    sm_wait: sm_wait_ms,
                }),
            };
            discover(local, cfg, control_socket, verbose)
        }
        Cmd::Luns { login: l, json } => {
            // As `srp reset`: an interrupt ends it within STOP_GRACE.
            let _interrupt =
                daemon_ctl::signals::block_term().watch("srp", daemon_ctl::signals::STOP_GRACE);
            let session = login(&l)?;
            let luns = srp_initiator::disk::report_luns(&session).map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            for n in luns {
                let d = srp_initiator::disk::Disk::open(session.clone(), n)
                    .map_err(|e| format!("LUN {n}: {e}"))?;
                let i = d.info();
                rows.push(serde_json::json!({
                    "lun": n, "vendor": i.vendor, "product": i.product,
                    "blocks": i.blocks, "block_size": i.block_size, "naa": i.naa,
                }));
                if !json {
                    println!(
                        "LUN {n:<5} {:<8} {:<16} {:>12} blocks of {:>4} B  naa {}",
                        i.vendor,
                        i.product,
                        i.blocks,
                        i.block_size,
                        i.naa.as_deref().unwrap_or("-")
                    );
                }
            }
            if json {
                println!("{}", serde_json::Value::Array(rows));
            }
            Ok(true)
        }
    }
}

/// `srp discover --sa` or `--fabric ib`: our port on the managed subnet.
struct IbMode {
    pkey: Option<rdma_types::Pkey>,
    sm_wait: Duration,
}

/// `srp discover`: our port, and how it joins the fabric.
struct Local {
    ip: IpAddr,
    /// The NIC daemon's NIC at `ip` or one of our own (`None` with a
    /// device).
    nicd: Option<nicd::choice::Which>,
    /// An rdma-core device's port instead, and the targets' RDMA CM port.
    device: Option<(rdmacore::DeviceSpec, u16)>,
    udp_port: u16,
    ib: Option<IbMode>,
}

/// `srp discover`'s side of the walk: srpd's logins, and the events
/// printed as srp_daemon prints them.
struct Printer {
    /// srpd's control socket.
    socket: std::path::PathBuf,
    verbose: bool,
    rescan: bool,
    signals: Option<daemon_ctl::signals::TermSignals>,
    /// Print RDMA CM login strings to this port (found from a device's
    /// RoCE port by address) instead of IB CM ones, and log in with them
    /// (srpd makes only RDMA CM logins on a device).
    rdma_cm_port: Option<u16>,
}

impl Printer {
    /// A target found, as the login string its login takes.
    fn login_string(&self, t: &srp_initiator::discovery::Found) -> String {
        match self.rdma_cm_port {
            Some(port) => t.rdma_cm_login_string(port),
            None => t.login_string(),
        }
    }
}

impl Host for Printer {
    fn held(&mut self) -> Vec<String> {
        // No srpd: nothing is held.
        srpd(&self.socket, &InitRequest::List)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|l| l["target"].as_str().map(str::to_string))
            .collect()
    }

    fn login(
        &mut self,
        t: &srp_initiator::discovery::Found,
    ) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
        let target = self.login_string(t);
        let v = srpd(&self.socket, &InitRequest::Login { target, name: None })?;
        Ok(v["name"].as_str().unwrap_or("?").to_string())
    }

    fn event(&mut self, event: Event<'_>) {
        let verbose = self.verbose;
        let scans = self.rescan && verbose;
        match event {
            Event::SmMoved { from, to } => println!("# SM LID {from} -> {to}: subscribing again"),
            Event::Subscribed { sm_lid } if verbose => {
                println!("# subscribed to traps 64/65 (SM LID {sm_lid})")
            }
            Event::ScanStarted { round } if scans => println!("# scan {round}"),
            Event::Ioc { probe, slot, ioc } if verbose => {
                let p = &ioc.profile;
                println!(
                    "# {probe} slot {slot}: IOC {:016x} \"{}\" class {:#06x} subclass {:#06x} protocol {:#06x} send {} B x {} rdma {} B",
                    p.guid.0, p.id(), p.io_class, p.io_subclass, p.protocol,
                    p.send_size, p.send_queue_depth, p.rdma_size
                );
            }
            Event::Denied(t) if verbose => println!(
                "# denied by rules line {}: {}",
                t.decision.line.unwrap_or(0),
                self.login_string(t)
            ),
            Event::Held(t) if verbose => {
                println!("# logged in already: {}", self.login_string(t))
            }
            Event::Target(t) => println!("{}", self.login_string(t)),
            Event::LoggedIn { name } => println!("# logged in as {name}"),
            Event::Failed(e) => eprintln!("srp: {e}"),
            Event::ScanDone { round, found } if scans => {
                println!("# scan {round} done: {found} SRP target ports")
            }
            Event::NoneFound => eprintln!("srp: no SRP targets found"),
            Event::RetrySoon { round, next } if verbose => println!(
                "# scan {round} had failures: next scan in {} ms",
                next.as_millis()
            ),
            Event::Trap { number: 64, gid } => {
                println!("# trap 64: port {gid} in service: scanning")
            }
            Event::Trap { number: 65, gid } => println!("# trap 65: port {gid} out of service"),
            Event::Trap { number, .. } => println!("# trap {number}"),
            Event::Stopped { signal, rounds } => {
                println!("# signal {signal}: stopped after {rounds} scans")
            }
            _ => {}
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }

    fn wait_signal(&mut self, timeout: Duration) -> Option<i32> {
        match &self.signals {
            Some(s) => s.wait_timeout(timeout),
            None => {
                std::thread::sleep(timeout);
                None
            }
        }
    }
}

/// `srp discover`: our port on soft RoCE (joining the managed subnet with
/// `--sa` or `--fabric ib`), then the walk of
/// `srp_initiator::discovery` with its events printed.
fn discover(
    local: Local,
    cfg: DiscoveryConfig,
    socket: std::path::PathBuf,
    verbose: bool,
) -> Result<bool, String> {
    let Local {
        ip,
        nicd,
        device,
        udp_port,
        ib,
    } = local;
    // Before any thread starts, so all of them inherit the mask.
    let signals = cfg.rescan.map(|_| daemon_ctl::signals::block_term());
    if let Some((spec, rdma_cm_port)) = device {
        let host = Printer {
            socket,
            verbose,
            rescan: cfg.rescan.is_some(),
            signals,
            rdma_cm_port: Some(rdma_cm_port),
        };
        return discover_on_device(&spec, cfg, host);
    }
    // The CM agent is tracked in a client of the access layer: its CM
    // ids, MAD agents and trap subscriptions (and, on soft RoCE, its QP1
    // objects). `_cm`, dropped first, closes them before the port goes.
    let guid = rnic::softroce::ip_guid(ip);
    let which = nicd.unwrap_or(nicd::choice::Which::Own {
        why: "--device".into(),
    });
    let (provider, soft): (Arc<dyn verbs::Provider>, _) = match which.socket() {
        Some(socket) => {
            let fabric = if ib.is_some() {
                nicd::Fabric::Ib
            } else {
                nicd::Fabric::Roce
            };
            let how = nicd::ondemand::OnDemand::from_env()?;
            let held =
                nicd::ondemand::ensure(socket, &[ip], fabric, &how).map_err(|e| e.to_string())?;
            if let Some(s) = &held.started {
                eprintln!("srp: {s}");
            }
            let (p, _) = nicd::connect_at(socket, ip, Some(fabric))?;
            drop(held);
            eprintln!(
                "{}",
                which.line("srp", &ip.to_string(), Some(p.daemon_pid()))
            );
            (nicd::data_path(p, nicd::data_here()), None)
        }
        None => {
            let soft = rnic::softroce::SoftRoce::with_options(
                vec![rnic::softroce::SoftCa { guid, ip }],
                udp_port,
                rdma_types::Mtu::Mtu4096,
                rnic::softroce::NicOptions::from_env().map_err(|e| e.to_string())?,
            );
            eprintln!("{}", which.line("srp", &ip.to_string(), None));
            (soft.clone() as Arc<dyn verbs::Provider>, Some(soft))
        }
    };
    let cm = rdma_access::resource::AccessLayer::new(provider.clone())
        .client("cm")
        .into_provider();
    let (agent, port) = match (&ib, soft) {
        (Some(m), soft) => {
            let port = match soft {
                Some(own) => {
                    own.set_personality(guid, rnic::softroce::Personality::Ib)
                        .map_err(|source| {
                            IbPortError::Personality { ip, guid, source }.to_string()
                        })?;
                    IbPort::start(
                        own,
                        guid,
                        ip,
                        &format!("srp discover {ip}"),
                        false,
                        std::process::id() << 8,
                    )
                }
                // The NIC daemon's ib port: its SMA is the daemon's.
                None => IbPort::join(provider.clone(), guid, ip, std::process::id() << 8),
            }
            .map_err(|e| e.to_string())?
            .with_timing(rdma_access::sa::SaTiming {
                timeout: cfg.timeout,
                retries: 3,
            });
            port.wait_active(m.sm_wait).map_err(|e| e.to_string())?;
            if let Some(k) = m.pkey {
                port.check_pkey(k).map_err(|e| e.to_string())?;
            }
            if verbose {
                println!(
                    "# port {ip} ACTIVE, LID {}, SM LID {}",
                    port.lid(),
                    port.sm_lid()
                );
            }
            (port.agent().clone(), Some(port))
        }
        _ => (
            rdma_access::CmAgent::start(cm.clone(), guid, std::process::id() << 8)
                .map_err(|e| format!("start the CM agent on {ip}: {e}"))?,
            None,
        ),
    };
    agent
        .track_in(cm.client())
        .map_err(|e| format!("track the CM agent on {ip}: {e}"))?;
    let mut host = Printer {
        socket,
        verbose,
        rescan: cfg.rescan.is_some(),
        signals,
        rdma_cm_port: None,
    };
    let subnet = port.as_ref().map(|p| p as &dyn SubnetPort);
    let ok = Discovery::new(&agent, subnet, cfg).run(&mut host);
    drop(cm);
    Ok(ok)
}

/// `srp discover --device`: the walk from port `spec` of an rdma-core
/// device, its MADs through the kernel's user MAD interface (the
/// provider's GSI QP), the CM agent tracked as on soft RoCE.
fn discover_on_device(
    spec: &rdmacore::DeviceSpec,
    cfg: DiscoveryConfig,
    mut host: Printer,
) -> Result<bool, String> {
    let core = rdmacore::RdmaCore::new().map_err(|e| e.to_string())?;
    let guid = core.find_port(spec).map_err(|e| e.to_string())?;
    if spec.port != 1 {
        return Err(format!(
            "{spec}: discovery asks from port 1 of a device only, for now"
        ));
    }
    // Said in one line with the fix before anything starts.
    rdmacore::user_mad_ready(&spec.name, spec.port).map_err(|e| e.to_string())?;
    let provider: Arc<dyn verbs::Provider> = core;
    let cm = rdma_access::resource::AccessLayer::new(provider)
        .client("cm")
        .into_provider();
    let agent = rdma_access::CmAgent::start(cm.clone(), guid, std::process::id() << 8)
        .map_err(|e| format!("start the MAD agent on {spec}: {e}"))?;
    agent
        .track_in(cm.client())
        .map_err(|e| format!("track the MAD agent on {spec}: {e}"))?;
    let ok = Discovery::new(&agent, None, cfg).run(&mut host);
    drop(cm);
    Ok(ok)
}

/// One request to `srpd`.
fn srpd(sock: &std::path::Path, req: &InitRequest) -> Result<serde_json::Value, String> {
    daemon_ctl::request_to(sock, "srpd", req).map_err(|e| e.to_string())
}

/// A login as `srp list` prints it.
fn print_login(l: &serde_json::Value) {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_string();
    println!(
        "{}  {}  ({})",
        s(&l["name"]),
        s(&l["path"]),
        s(&l["target"])
    );
    for c in l["channels"].as_array().into_iter().flatten() {
        println!(
            "  channel {}: {}, credits {} of {}, {} commands done{}",
            c["channel"],
            if c["closed"] == serde_json::json!(true) {
                "closed"
            } else {
                "live"
            },
            c["credits"],
            c["req_lim"],
            c["completed"],
            if c["immediate_data"] == serde_json::json!(true) {
                ", immediate data"
            } else {
                ""
            }
        );
    }
    for u in l["luns"].as_array().into_iter().flatten() {
        println!(
            "  LUN {:<3} {:<8} {:<16} {} blocks of {} B  {}  state {}, {} failures, {} reconnects",
            u["lun"],
            s(&u["vendor"]),
            s(&u["product"]),
            u["blocks"],
            u["block_size"],
            s(&u["file"]),
            s(&u["state"]),
            u["failures"],
            u["reconnects"]
        );
    }
}

/// mimalloc: the data path allocates a few small buffers per I/O, and
/// glibc's malloc costs several times more instructions per call.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "1") {
        return code;
    }
    daemon_ctl::log_to_stderr();
    let cmd = Cli::parse().cmd;
    // A workload cut short exits as a shell reports an interrupted
    // command; the servers (fuse, nbd) stop on a signal as they should,
    // and exit so only when stopping could not finish (a target that
    // does not answer).
    let workload = matches!(cmd, Cmd::Io { .. });
    let result = run(cmd);
    if let Some(sig) = daemon_ctl::signals::caught().filter(|_| workload || result.is_err()) {
        if let Err(e) = &result {
            eprintln!("srp: {e}");
        }
        return ExitCode::from(daemon_ctl::signals::exit_status(sig));
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("srp: {e}");
            ExitCode::FAILURE
        }
    }
}
