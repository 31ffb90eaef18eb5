//! `rpingpong`: see `rdma_perf::pingpong`.

#![forbid(unsafe_code)]

use clap::Parser;
use rdma_perf::device::{DeviceArgs, NicChoice, NicError};
use rdma_perf::pingpong::{run, PingPongConfig};
use rdma_types::Mtu;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

/// RC ping-pong compatible with ibv_rc_pingpong's out-of-band exchange.
#[derive(Parser)]
#[command(name = "rpingpong", version)]
struct Cli {
    /// Server to connect to; without it, wait for a client.
    server: Option<IpAddr>,
    /// Our soft RoCE NIC's address (the GID we announce is its
    /// IPv4-mapped form), where a server listens. With --device: only
    /// where a server listens [default: any].
    #[arg(long)]
    bind: Option<IpAddr>,
    #[command(flatten)]
    device: DeviceArgs,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// UDP port of RoCEv2 (4791 everywhere but in tests).
    #[arg(long, default_value_t = 4791)]
    roce_port: u16,
    /// Message size in bytes, or with K, M (4k).
    #[arg(short = 's', long, default_value = "4096", value_parser = rdma_types::units::size::<usize>)]
    size: usize,
    /// Exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: usize,
    /// GID index to announce (rxe: 1 is the RoCEv2 IPv4 GID).
    #[arg(short = 'g', long)]
    gid_idx: Option<u32>,
    /// Receives kept posted.
    #[arg(short = 'r', long, default_value_t = 500)]
    rx_depth: u64,
    /// UD instead of RC, compatible with ibv_ud_pingpong.
    #[arg(long)]
    ud: bool,
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
        daemon_ctl::signals::block_term().watch("rpingpong", daemon_ctl::signals::STOP_GRACE);
    let mtu = match Mtu::from_bytes(cli.mtu) {
        Ok(m) => m,
        Err(_) => {
            eprintln!(
                "rpingpong: MTU must be 256, 512, 1024, 2048 or 4096, not {}",
                cli.mtu
            );
            return ExitCode::FAILURE;
        }
    };
    let device = cli.device.rdma_core().cloned();
    let bind = match (cli.bind, &device) {
        (Some(b), _) => b,
        (None, Some(_)) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (None, None) => {
            eprintln!("rpingpong: {}", NicError::NoAddress("--bind".into()));
            return ExitCode::FAILURE;
        }
    };
    // Through the verbs: an rdma-core device, or the NIC daemon's NIC at
    // --bind; else a soft RoCE node of our own.
    // -m is the QP's path MTU, set through the verbs on either NIC.
    let own_only = (cli.roce_port != rnic::softroce::ROCE_PORT)
        .then(|| format!("--roce-port {}", cli.roce_port));
    let which = match cli.device.which(own_only) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("rpingpong: {e}");
            return ExitCode::FAILURE;
        }
    };
    let nic = match which {
        Some(own @ nicd::choice::Which::Own { .. }) if device.is_none() => {
            eprintln!("{}", own.line("rpingpong", &bind.to_string(), None));
            None
        }
        None if device.is_none() => None,
        _ => match NicChoice::from_args(&cli.device, Some(bind), "--bind", cli.roce_port, mtu) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("rpingpong: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let cfg = PingPongConfig {
        bind: SocketAddr::new(bind, cli.roce_port),
        tcp: SocketAddr::new(cli.server.unwrap_or(bind), cli.port),
        client: cli.server.is_some(),
        size: cli.size,
        iters: cli.iters,
        mtu,
        gid_index: cli.gid_idx,
        rx_depth: cli.rx_depth,
        ud: cli.ud,
        gso: softroce::gso_from_env(),
        nic,
        stop: interrupt.flag(),
    };
    let result = run(&cfg);
    if let Err(e) = &result {
        eprintln!("rpingpong: {e}");
    }
    rdma_perf::exit_code("rpingpong", &interrupt, result.is_ok())
}
