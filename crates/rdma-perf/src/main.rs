//! `rperf`: see the library docs (`rdma_perf`). Runs on our soft RoCE
//! NIC at `--bind`, or with `--device` on an rdma-core device
//! (`rdma_perf::device`).

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use rdma_perf::device::{DeviceArgs, Nic, NicChoice};
use rdma_perf::{parse_faults, run_client, run_server, ClientConfig, Common, Op, PerfError};
use rdma_types::Mtu;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Bandwidth and latency of the soft RoCE NIC (or of an rdma-core device,
/// --device) between two processes.
#[derive(Parser)]
#[command(name = "rperf", version)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(clap::Args, Clone)]
struct CommonArgs {
    /// RoCE address of this node, our soft RoCE NIC's (ip:port; port 4791
    /// for interop) [default: 127.0.0.1:4791]. Not with --device, whose
    /// port and GID (the one rdma-core's tools pick) are used.
    #[arg(long)]
    bind: Option<SocketAddr>,
    #[command(flatten)]
    device: DeviceArgs,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (with --device, at
    /// most the port's active MTU).
    #[arg(long, default_value_t = 4096, value_parser = parse_mtu)]
    mtu: usize,
    /// Faults on this node's send path, e.g. "loss=0.01,reorder=0.01,seed=7"
    /// (our soft NIC's; not with --device).
    #[arg(long)]
    faults: Option<String>,
    /// Write this node's packets to a pcap file (our soft NIC's; not with
    /// --device).
    #[arg(long)]
    capture: Option<PathBuf>,
    /// Registered buffer size in bytes (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = rdma_types::units::size::<usize>)]
    buffer: usize,
}

#[derive(Subcommand)]
enum Role {
    /// Wait for a client on a TCP address and answer its test.
    Server {
        #[command(flatten)]
        common: CommonArgs,
        /// TCP address for the out-of-band exchange.
        #[arg(long, default_value = "127.0.0.1:18515")]
        oob: SocketAddr,
        /// Serve this many clients, then exit.
        #[arg(long, default_value_t = 1)]
        clients: u32,
    },
    /// Run a server and a client in one process on 127.0.0.2 and 127.0.0.1:
    /// 1 GiB of verified RDMA WRITEs and READs against a plain-UDP baseline.
    Demo {
        /// Messages of 64 KiB each way.
        #[arg(long, default_value_t = 16384)]
        iters: u64,
    },
    /// Connect to a server and run a test.
    Client {
        #[command(flatten)]
        common: CommonArgs,
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:18515")]
        server: SocketAddr,
        /// Operation to measure.
        #[arg(long, value_enum, default_value_t = Op::Write)]
        op: Op,
        /// Message size in bytes (K, M, G suffixes).
        #[arg(long, default_value = "65536", value_parser = rdma_types::units::size::<usize>)]
        size: usize,
        /// Work requests in flight.
        #[arg(long, default_value_t = 16)]
        qd: usize,
        /// Messages to move (default 1000, or unlimited with --duration).
        #[arg(long)]
        iters: Option<u64>,
        /// Run for this many seconds, or with a unit: 500ms, 2m (with
        /// --iters too: whichever ends first).
        #[arg(long, value_name = "SECS", value_parser = rdma_types::units::secs)]
        duration: Option<std::time::Duration>,
        /// Check every byte moved.
        #[arg(long)]
        verify: bool,
        /// Also measure plain UDP between the same addresses (plain TCP
        /// with --iwarp) and print ours/baseline.
        #[arg(long)]
        baseline: bool,
        /// WRITE only: the server writes back as much at the same time.
        #[arg(long)]
        bidir: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_mtu(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    Mtu::from_bytes(n)
        .map(|m| m.bytes())
        .map_err(|_| format!("MTU must be 256, 512, 1024, 2048 or 4096, not {n}"))
}

/// Our soft NIC's address when --bind is not given.
const DEFAULT_BIND: &str = "127.0.0.1:4791";

/// The options that only mean something on our soft RoCE NIC, refused
/// with an rdma-core device (`baseline`: the client's --baseline, plain
/// UDP from --bind's address).
fn soft_only(a: &CommonArgs, baseline: bool) -> Result<(), String> {
    if a.device.iwarp {
        let given = [
            (
                a.faults.is_some(),
                "--faults",
                "faults are injected by our soft RoCE NIC",
            ),
            (
                a.capture.is_some(),
                "--capture",
                "our soft RoCE NIC writes this capture: capture iWARP's TCP streams with tcpdump",
            ),
        ];
        // On iWARP --baseline measures plain TCP.
        return refuse_first(&given, "--iwarp", "--iwarp");
    }
    if a.device.nicd.is_some() {
        let given = [
            (
                a.faults.is_some(),
                "--faults",
                "faults are injected by this process's own soft NIC",
            ),
            (
                a.capture.is_some(),
                "--capture",
                "this process's own soft NIC writes the capture",
            ),
            (
                baseline,
                "--baseline",
                "it compares plain UDP with this process's own soft NIC",
            ),
        ];
        return refuse_first(&given, "--nicd", "--nicd to run on a NIC of rperf's own");
    }
    let Some(spec) = a.device.rdma_core() else {
        return Ok(());
    };
    let given = [
        (a.bind.is_some(), "--bind", "our soft RoCE NIC's address and UDP port: on a device the port and its GID are used"),
        (a.faults.is_some(), "--faults", "faults are injected by our soft RoCE NIC"),
        (a.capture.is_some(), "--capture", "our soft RoCE NIC writes the capture: capture a device's traffic with tcpdump or dumpcap on its network interface"),
        (baseline, "--baseline", "it measures plain UDP between --bind addresses against our soft RoCE NIC"),
    ];
    refuse_first(
        &given,
        &format!("--device {spec}"),
        "--device to run on our soft NIC",
    )
}

/// The first option given (`(given, option, why)`) that does not go with
/// `with`, refused in words: drop it, or drop `or`.
fn refuse_first(given: &[(bool, &str, &str)], with: &str, or: &str) -> Result<(), String> {
    match given.iter().find(|(on, ..)| *on) {
        Some((_, opt, why)) => Err(format!(
            "{opt} does not go with {with}: {why}; drop {opt}, or {or}"
        )),
        None => Ok(()),
    }
}

/// The shared settings; with --device, the device's port opened (ACTIVE).
fn common(a: &CommonArgs, baseline: bool, stop: &Arc<AtomicBool>) -> Result<Common, String> {
    let bind = a
        .bind
        .unwrap_or_else(|| DEFAULT_BIND.parse().expect("literal address"));
    let own_only = nicd::choice::first_given(&[
        (
            bind.port() != rnic::softroce::ROCE_PORT,
            format!("--bind {bind}"),
        ),
        (a.mtu != 4096, format!("--mtu {}", a.mtu)),
        (a.faults.is_some(), "--faults".into()),
        (a.capture.is_some(), "--capture".into()),
        (baseline, "--baseline".into()),
    ]);
    let which = a.device.which(own_only)?;
    let device = match (a.device.rdma_core(), which) {
        (Some(spec), _) => Some(Arc::new(
            Nic::open(&NicChoice::RdmaCore(spec.clone())).map_err(|e| e.to_string())?,
        )),
        (None, Some(nicd::choice::Which::Daemon { socket })) => {
            let choice = NicChoice::Nicd {
                socket,
                ip: bind.ip(),
                start: nicd::ondemand::OnDemand::from_env()?,
            };
            Some(Arc::new(Nic::open(&choice).map_err(|e| e.to_string())?))
        }
        (None, Some(own)) => {
            eprintln!("{}", own.line("rperf", &bind.ip().to_string(), None));
            None
        }
        (None, None) if a.device.iwarp => {
            let choice = NicChoice::Iwarp {
                ip: bind.ip(),
                opts: iwarp_tcp::NicOptions::default(),
            };
            let nic = Nic::open(&choice).map_err(|e| e.to_string())?;
            Some(Arc::new(nic))
        }
        (None, None) => None,
    };
    Ok(Common {
        bind,
        mtu: Mtu::from_bytes(a.mtu).map_err(|e| e.to_string())?,
        faults: a
            .faults
            .as_deref()
            .map(parse_faults)
            .transpose()
            .map_err(|e| e.to_string())?,
        capture: a.capture.clone(),
        buffer: a.buffer,
        gso: softroce::gso_from_env(),
        stop: stop.clone(),
        device,
    })
}

/// Server thread plus client, write then read, each with --verify.
fn demo(iters: u64, stop: &Arc<AtomicBool>) -> Result<(), String> {
    let mk = |ip: &str| Common {
        bind: format!("{ip}:4791").parse().expect("literal address"),
        mtu: Mtu::Mtu4096,
        faults: None,
        capture: None,
        buffer: 64 << 20,
        gso: softroce::gso_from_env(),
        stop: stop.clone(),
        device: None,
    };
    let oob: SocketAddr = "127.0.0.2:18515".parse().expect("literal address");
    let listener = TcpListener::bind(oob).map_err(|e| format!("cannot listen on {oob}: {e}"))?;
    let server_common = mk("127.0.0.2");
    let server = std::thread::spawn(move || -> Result<(), String> {
        for _ in 0..2 {
            run_server(&server_common, &listener).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    println!(
        "rperf demo: soft RoCE NICs on 127.0.0.1:4791 and 127.0.0.2:4791, {} MiB each way",
        iters / 16
    );
    for (op, baseline) in [(Op::Write, true), (Op::Read, false)] {
        let cfg = ClientConfig {
            common: mk("127.0.0.1"),
            server: oob,
            op,
            size: 65536,
            qd: 16,
            iters,
            duration: None,
            verify: true,
            baseline,
            bidir: false,
        };
        let report = run_client(&cfg).map_err(|e| e.to_string())?;
        print!("{}", report.table());
        if report.interrupted {
            // The server thread ends with the process.
            return Ok(());
        }
    }
    server
        .join()
        .map_err(|_| "server thread panicked".to_string())??;
    println!("every byte verified; try `rperf client --help` for more");
    Ok(())
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "1") {
        return code;
    }
    daemon_ctl::log_to_stderr();
    let cli = Cli::parse();
    // Before any thread starts, so all of them inherit the mask.
    let interrupt =
        daemon_ctl::signals::block_term().watch("rperf", daemon_ctl::signals::STOP_GRACE);
    let stop = interrupt.flag();
    let result: Result<(), String> = match cli.role {
        Role::Server {
            common: c,
            oob,
            clients,
        } => (|| {
            soft_only(&c, false)?;
            let c = common(&c, false, &stop)?;
            let listener =
                TcpListener::bind(oob).map_err(|e| format!("cannot listen on {oob}: {e}"))?;
            // Scripts wait for this line before starting a client.
            match &c.device {
                Some(nic) => println!("rperf server: listening on {oob}, on {}", nic.name()),
                None => println!("rperf server: listening on {oob}"),
            }
            let _ = std::io::Write::flush(&mut std::io::stdout());
            for served in 0..clients {
                match run_server(&c, &listener) {
                    Ok(s) if s.interrupted => {
                        println!(
                            "rperf server: interrupted while serving {}; connection closed, {served} clients served before",
                            s.summary()
                        );
                        break;
                    }
                    Ok(_) => {}
                    Err(PerfError::Interrupted) => {
                        println!("rperf server: interrupted after serving {served} clients");
                        break;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        })(),
        Role::Demo { iters } => demo(iters, &stop),
        Role::Client {
            common: c,
            server,
            op,
            bidir,
            size,
            qd,
            iters,
            duration,
            verify,
            baseline,
            json,
        } => (|| {
            soft_only(&c, baseline)?;
            if size == 0 || size > (1 << 30) {
                return Err(format!("--size must be 1..=1 GiB, not {size}"));
            }
            if let Some(d) = duration.filter(|d| d.is_zero() || d.as_secs_f64() > 86_400.0) {
                return Err(format!(
                    "--duration must be more than 0 and at most 86400 seconds, not {}",
                    d.as_secs_f64()
                ));
            }
            if bidir && duration.is_some() {
                return Err("--bidir counts messages; use --iters, not --duration".into());
            }
            let iters = iters.unwrap_or(if duration.is_some() { u64::MAX } else { 1000 });
            let cfg = ClientConfig {
                common: common(&c, baseline, &stop)?,
                server,
                op,
                size,
                qd,
                iters,
                duration,
                verify,
                baseline,
                bidir,
            };
            if bidir && op != Op::Write {
                return Err("--bidir works with --op write".into());
            }
            let report = run_client(&cfg).map_err(|e| e.to_string())?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
                );
            } else {
                print!("{}", report.table());
            }
            Ok(())
        })(),
    };
    if let Err(e) = &result {
        eprintln!("rperf: {e}");
    }
    rdma_perf::exit_code("rperf", &interrupt, result.is_ok())
}
