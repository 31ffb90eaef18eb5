//! `rrping`: see `rdma_perf::rping`. Options follow librdmacm's rping:
//! `-s` serve or `-c` connect, `-a` the server's address (the address a
//! server binds), `-I` the client's own address, `-p` port, `-C` pings,
//! `-S` size, `-v` print data, `-V` validate.

#![forbid(unsafe_code)]

use clap::Parser;
use rdma_perf::device::{DeviceArgs, NicChoice};
use rdma_perf::rping::{run, RpingConfig, MIN_SIZE, RPING_PORT};
use std::net::IpAddr;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rrping",
    version,
    about = "rping over the soft RoCE NIC or an rdma-core device",
    disable_version_flag = true
)]
struct Args {
    /// Print version (long only: -V is rping's validate).
    #[arg(long, action = clap::ArgAction::Version)]
    version: (),
    /// Server.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client.
    #[arg(short = 'c')]
    client: bool,
    /// Server address (the address a server listens on; with --device,
    /// a server listens on all of the device's).
    #[arg(short = 'a')]
    addr: IpAddr,
    /// Client: our own address (with --device, one of the device's
    /// [default: its first]).
    #[arg(short = 'I')]
    source: Option<IpAddr>,
    #[command(flatten)]
    device: DeviceArgs,
    /// RDMA CM port.
    #[arg(short = 'p', default_value_t = RPING_PORT)]
    port: u16,
    /// Pings.
    #[arg(short = 'C', default_value_t = 10)]
    count: u64,
    /// Buffer size in bytes, or with K, M (4k).
    #[arg(short = 'S', default_value = "64", value_parser = rdma_types::units::size::<usize>)]
    size: usize,
    /// Print each ping's data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the data that came back.
    #[arg(short = 'V')]
    validate: bool,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Path MTU (1024 on a 1500-byte Ethernet link).
    #[arg(long, default_value_t = 1024)]
    mtu: usize,
    /// Seconds (or with a unit: 500ms) to wait for the connection (and
    /// between events after it).
    #[arg(long, default_value = "10", value_parser = rdma_types::units::secs)]
    timeout: std::time::Duration,
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Args as clap::CommandFactory>::command, "1") {
        return code;
    }
    daemon_ctl::log_to_stderr();
    let a = Args::parse();
    // Before any thread starts, so all of them inherit the mask.
    let interrupt =
        daemon_ctl::signals::block_term().watch("rrping", daemon_ctl::signals::STOP_GRACE);
    if !a.server && !a.client {
        eprintln!("rrping: say -s (server) or -c (client)");
        return ExitCode::FAILURE;
    }
    if a.size < MIN_SIZE {
        eprintln!("rrping: -S {} is below the minimum of {MIN_SIZE}", a.size);
        return ExitCode::FAILURE;
    }
    let Ok(mtu) = rdma_types::Mtu::from_bytes(a.mtu) else {
        eprintln!(
            "rrping: MTU must be 256, 512, 1024, 2048 or 4096, not {}",
            a.mtu
        );
        return ExitCode::FAILURE;
    };
    // Our soft RoCE NIC is at the server's address (server) or ours
    // (client).
    let (ip, what, peer) = if a.server {
        (Some(a.addr), "-a", None)
    } else {
        (
            a.source,
            "-I <our address> (each node binds its own)",
            Some(a.addr),
        )
    };
    let nic = match NicChoice::from_args(&a.device, ip, what, a.udp_port, mtu) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rrping: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = RpingConfig {
        server: a.server,
        local: if a.server { None } else { a.source },
        peer,
        port: a.port,
        count: a.count,
        size: a.size,
        verbose: a.verbose,
        validate: a.validate,
        idle_timeout: a.timeout.max(std::time::Duration::from_secs(1)),
        nic,
        stop: interrupt.flag(),
    };
    match run(&cfg) {
        Ok(r) => {
            println!(
                "rrping: {} pings{}{}",
                r.pings,
                if a.validate {
                    format!(", {} validated", r.validated)
                } else {
                    String::new()
                },
                match (r.interrupted, r.connected) {
                    (false, _) => "",
                    (true, true) => "; interrupted, disconnected",
                    (true, false) => "; interrupted while waiting for a client",
                }
            );
            rdma_perf::exit_code("rrping", &interrupt, true)
        }
        Err(e) => {
            eprintln!("rrping: {e}");
            rdma_perf::exit_code("rrping", &interrupt, false)
        }
    }
}
