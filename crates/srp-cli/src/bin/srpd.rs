//! `srpd`: the resident SRP initiator (see `srp_cli::initd`). It keeps
//! logins made with `srp login` (Linux `ib_srp` login strings) and shows
//! each LUN as a file under `--mount-root/<login name>/`, until SIGTERM or
//! SIGINT, when it logs every target out. Its CAs are our soft RoCE NIC
//! (`--ip`; our soft iWARP NIC with `--iwarp`) or a port of an rdma-core
//! device (`--device`), or both.

#![forbid(unsafe_code)]

use clap::Parser;
use daemon_ctl::bind_control;
use srp_cli::args::Tmo;
use srp_cli::initd::{serve_control, InitRequest, Initd, InitdConfig};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "srpd",
    version,
    about = "Resident SRP initiator: logins by login string, LUNs as files"
)]
struct Args {
    /// Address of a local soft RoCE NIC (several: one CA each; a login's
    /// `src=` picks one, the first is the default) [default: 127.0.0.2;
    /// none with --device].
    #[arg(long)]
    ip: Vec<IpAddr>,
    /// Log in through this rdma-core device (a real RDMA NIC, Linux rxe
    /// or siw), NAME or NAME:PORT as `ibv_devices` lists it, by the
    /// kernel's RDMA CM: logins with `dest=ip:port` (a login's `src=` may
    /// pick one of the device's addresses). It is the default CA; --ip
    /// adds soft RoCE CAs beside it. When the device goes away (`rdma
    /// link delete`, a hot unplug) its LUNs wait or fail as the timers
    /// below say, and when it is back its logins reconnect under the
    /// same files. Needs rdma-core's libibverbs.
    #[arg(long, value_name = "NAME[:PORT]", value_parser = parse_device)]
    device: Option<rdmacore::DeviceSpec>,
    /// Use the NIC daemon's soft RoCE NIC at each --ip through its socket
    /// SOCKET [default: $NICD_SOCKET, else nicd's default]; the default on
    /// the roce fabric, so other processes (srptd, srp, rperf) can use
    /// the addresses too. With no daemon there one is started for the
    /// addresses (`nicd` beside this tool or on PATH); it leaves after
    /// $NICD_IDLE_EXIT (30s) without a client. With --fabric ib only when
    /// given, from a daemon started by hand with `nicd --fabric ib`.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg,
          conflicts_with = "own_nic")]
    nicd: Option<PathBuf>,
    /// Soft RoCE NICs of srpd's own, in its process (one process per
    /// address and UDP port), not the NIC daemon's; also what $NICD_MODE=own,
    /// a --udp-port other than 4791, an --mtu other than 4096 or
    /// $SOFTROCE_FAULTS choose.
    #[arg(long)]
    own_nic: bool,
    /// The CAs at --ip are our soft iWARP NIC's (RDMA over TCP, what
    /// Linux siw speaks) instead of soft RoCE's: logins by RDMA CM
    /// (`dest=ip:port`, a TCP connection and the MPA exchange), with the
    /// login strings of RoCE; no IB CM logins.
    #[arg(long, conflicts_with = "nicd")]
    iwarp: bool,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Path MTU in bytes (1024 on a 1500-byte Ethernet link).
    #[arg(long, default_value_t = 4096)]
    mtu: usize,
    /// Directory under which each login's LUN files are mounted.
    #[arg(long)]
    mount_root: PathBuf,
    /// Control socket for `srp login/logout/list` (/run/srpd.sock for
    /// root, $TMPDIR/srpd-<uid>.sock otherwise).
    #[arg(long, default_value_os_t = daemon_ctl::control_socket_of("srpd"))]
    control_socket: PathBuf,
    /// Seconds (or with a unit: 500ms, 2m) between reconnect attempts, or
    /// `off`.
    #[arg(long, default_value = "10")]
    reconnect_delay: Tmo,
    /// Seconds (or with a unit) after a failure until I/O fails instead of
    /// waiting, or `off`.
    #[arg(long, default_value = "15")]
    fast_io_fail_tmo: Tmo,
    /// Seconds (or with a unit) after a failure until a LUN is given up,
    /// or `off`.
    #[arg(long, default_value = "600")]
    dev_loss_tmo: Tmo,
    /// Milliseconds (or with a unit: 10s) a login (and each reconnect
    /// attempt) waits for the target's answer.
    #[arg(long, default_value = "10000", value_parser = rdma_types::units::millis)]
    login_timeout_ms: Duration,
    /// Let other users reach the LUN files (FUSE allow_other).
    #[arg(long)]
    allow_other: bool,
    /// Log in with this login string at start (repeatable).
    #[arg(long)]
    login: Vec<String>,
    /// Who runs the ports: `roce`, no subnet manager; `ib`, a managed
    /// subnet: each port waits for an SM (`ibsm run --node <ip>`) to make
    /// it ACTIVE, and `dgid=` logins take their paths from the SA.
    #[arg(long, value_enum, default_value = "roce")]
    fabric: rdma_access::subnet::Fabric,
    /// With `--fabric ib`: milliseconds (or with a unit: 30s) to wait at
    /// start for the ports to go ACTIVE.
    #[arg(long, default_value = "30000", value_parser = rdma_types::units::millis)]
    sm_wait_ms: Duration,
}

/// `--device`: NAME or NAME:PORT.
fn parse_device(s: &str) -> Result<rdmacore::DeviceSpec, String> {
    s.parse()
}

fn run(a: Args) -> Result<(), String> {
    let mtu = rdma_types::Mtu::from_bytes(a.mtu)
        .map_err(|_| format!("MTU {} is not 256, 512, 1024, 2048 or 4096", a.mtu))?;
    let rport = srp_initiator::rport::RportConfig {
        reconnect_delay: a.reconnect_delay.rport(),
        fast_io_fail_tmo: a.fast_io_fail_tmo.rport(),
        dev_loss_tmo: a.dev_loss_tmo.rport(),
    };
    let nic = rnic::softroce::NicOptions::from_env().map_err(|e| e.to_string())?;
    let sock = a.control_socket.clone();
    let signals = daemon_ctl::signals::block_term();
    let control =
        bind_control(&sock).map_err(|e| format!("control socket {}: {e}", sock.display()))?;
    let ips = match (&a.device, a.ip.is_empty()) {
        (None, true) => vec![IpAddr::from([127, 0, 0, 2])],
        _ => a.ip.clone(),
    };
    // The NIC daemon's NICs at the soft RoCE addresses, or srpd's own.
    let which = if a.iwarp || (a.device.is_some() && a.ip.is_empty()) {
        None
    } else {
        Some(srp_cli::args::nic_choice(
            a.nicd.as_deref(),
            a.own_nic,
            a.udp_port,
            a.mtu,
        )?)
    };
    let socket = which.as_ref().and_then(|w| w.socket()).map(PathBuf::from);
    // A daemon started for us if none answers; connected to under its
    // start lock (held until `Initd::start` returns).
    let mut held = None;
    if let Some(s) = &socket {
        let how = nicd::ondemand::OnDemand::from_env()?;
        let e = nicd::ondemand::ensure(s, &ips, a.fabric, &how).map_err(|e| e.to_string())?;
        if let Some(started) = &e.started {
            eprintln!("srpd: {started}");
        }
        held = Some(e);
    }
    let at: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
    let started = Initd::start(InitdConfig {
        ips,
        device: a.device.clone(),
        udp_port: a.udp_port,
        mtu,
        mount_root: a.mount_root.clone(),
        rport,
        login_timeout: a.login_timeout_ms.max(Duration::from_millis(1)),
        allow_other: a.allow_other,
        fabric: a.fabric,
        sm_wait: a.sm_wait_ms,
        nic,
        nicd: socket,
        iwarp: a.iwarp,
    });
    drop(held);
    let initd = match started {
        Ok(i) => Arc::new(i),
        Err(e) => {
            // Nothing will answer there.
            let _ = std::fs::remove_file(&sock);
            return Err(e.to_string());
        }
    };
    if let Some(w) = &which {
        eprintln!("{}", w.line("srpd", &at.join(", "), initd.nicd_pid()));
    }
    for s in &a.login {
        let v = initd
            .handle(InitRequest::Login {
                target: s.clone(),
                name: None,
            })
            .map_err(|e| e.to_string())?;
        println!("srpd: logged in: {v}");
    }
    serve_control(initd.clone(), control);
    // Scripts wait for this line.
    println!(
        "srpd: ready on {}, CAs {}, LUN files under {}",
        sock.display(),
        initd.cas(),
        a.mount_root.display()
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let sig = signals.wait();
    println!("srpd: signal {sig}: logging out");
    let n = initd.shutdown();
    let _ = std::fs::remove_file(&sock);
    // The sessions' verbs objects go as their last users (mounts, channel
    // threads) let go; a count left after a grace period is a leak.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while initd.verbs_objects() > 0 && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    println!(
        "srpd: {n} logins ended; {} verbs objects left; stopped",
        initd.verbs_objects()
    );
    Ok(())
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
    daemon_ctl::log_to_stderr();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("srpd: {e}");
            ExitCode::FAILURE
        }
    }
}
