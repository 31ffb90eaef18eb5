//! `rperftest`: see `rdma_perf::perftest`. Options follow perftest's
//! `ib_write_bw` / `ib_read_bw` / `ib_send_bw` / `ib_atomic_bw` /
//! `ib_atomic_lat`; the test is the first argument, the server (client
//! role) the last.

#![forbid(unsafe_code)]

use clap::Parser;
use rdma_perf::device::{DeviceArgs, NicChoice};
use rdma_perf::perftest::{run, AtomicOp, PerftestConfig, Verb, DEFAULT_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;

/// Tests compatible with perftest's ib_write_bw, ib_read_bw, ib_send_bw,
/// ib_atomic_bw and ib_atomic_lat (RC over RoCEv2 or iWARP, perftest's
/// TCP exchange or its RDMA CM mode).
#[derive(Parser)]
#[command(name = "rperftest", version)]
struct Cli {
    /// The test: write, read, send or atomic.
    verb: Verb,
    /// Server to connect to; without it, wait for a client.
    server: Option<IpAddr>,
    /// Our soft RoCE NIC's address (our GID is its IPv4-mapped form),
    /// where a server listens. With --device: only where a server
    /// listens [default: any].
    #[arg(long)]
    bind: Option<IpAddr>,
    #[command(flatten)]
    device: DeviceArgs,
    /// TCP port of the exchange (with -R: the RDMA CM port).
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// perftest's RDMA CM mode: connect through RDMA CM and swap the
    /// exchange as SENDs on a connection of its own (what perftest needs
    /// over iWARP). Both sides must give it.
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// RoCEv2 UDP port (4791 everywhere but in tests).
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Message size in bytes, or with K, M (default 65536; atomics: 8, the
    /// only size).
    #[arg(short = 's', long, value_parser = rdma_types::units::size::<usize>)]
    size: Option<usize>,
    /// Messages (perftest: 5000 for write, 1000 otherwise; with -D, no
    /// limit but the time).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Atomic: the operation (both sides must agree: our server checks
    /// its slots against it).
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value_t = AtomicOp::FetchAdd)]
    atomic_type: AtomicOp,
    /// Atomic: measure latency, one at a time, as ib_atomic_lat (without
    /// it, bandwidth as ib_atomic_bw).
    #[arg(long)]
    lat: bool,
    /// Client, write, read and atomic bandwidth: post for this many
    /// seconds (or with a unit: 500ms), then report what completed.
    #[arg(short = 'D', long, value_name = "SECS", value_parser = rdma_types::units::secs)]
    duration: Option<std::time::Duration>,
    /// Work requests in flight.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Receives kept posted (send server).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (the smaller side wins).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: usize,
    /// READs or atomics in flight (default: the device's maximum).
    #[arg(short = 'o', long = "outs")]
    outs: Option<u8>,
    /// GID index in our port's table (0 is the IPv4-mapped GID of --bind);
    /// without it, the IPv4-mapped one, as perftest picks.
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// Accepted for perftest compatibility (our clock is not the CPU's
    /// cycle counter, so CPU frequency does not matter).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Report Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Seconds (or with a unit: 2m) to wait for a client (server), for
    /// the peer's next message, or for the next completion.
    #[arg(long, default_value = "60", value_parser = rdma_types::units::secs)]
    timeout: std::time::Duration,
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
        daemon_ctl::signals::block_term().watch("rperftest", daemon_ctl::signals::STOP_GRACE);
    let _ = cli.cpu_freq;
    let Ok(mtu) = rdma_types::Mtu::from_bytes(cli.mtu) else {
        eprintln!(
            "rperftest: MTU must be 256, 512, 1024, 2048 or 4096, not {}",
            cli.mtu
        );
        return ExitCode::FAILURE;
    };
    let nic = match NicChoice::from_args(&cli.device, cli.bind, "--bind", cli.udp_port, mtu) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rperftest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = PerftestConfig {
        verb: cli.verb,
        atomic: cli.atomic_type,
        latency: cli.lat,
        bind: cli.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        server: cli.server,
        port: cli.port,
        rdma_cm: cli.rdma_cm,
        size: cli
            .size
            .unwrap_or(if cli.verb == Verb::Atomic { 8 } else { 65536 }),
        iters: cli.iters.unwrap_or(match (cli.duration, cli.verb) {
            (Some(_), _) => 1 << 32,
            (None, Verb::Write) => 5000,
            (None, _) => 1000,
        }),
        duration: cli.duration,
        tx_depth: cli.tx_depth,
        rx_depth: cli.rx_depth,
        mtu,
        outs: cli.outs,
        gid_index: cli.gid_index,
        report_gbits: cli.report_gbits,
        timeout: cli.timeout.max(std::time::Duration::from_secs(1)),
        nic,
        stop: interrupt.flag(),
    };
    match run(&cfg) {
        Ok(r) => {
            for v in &r.verified {
                println!(" verified: {v}");
            }
            if let Some(c) = &r.counters {
                println!(
                    " NIC: {} packets sent, {} retransmitted, {} timeouts, {} sequence NAKs received, \
                     {} duplicate requests",
                    c.tx_packets, c.retransmits, c.timeouts, c.seq_naks_received, c.duplicates
                );
            }
            println!(
                "rperftest: {} {}, MTU {}, peer {}{}",
                cfg.title(),
                if r.interrupted {
                    "interrupted: partial numbers, the rest of the exchange skipped"
                } else {
                    "done"
                },
                r.mtu.bytes(),
                r.peer.text,
                if r.peer.rperftest { " (rperftest)" } else { "" }
            );
            rdma_perf::exit_code("rperftest", &interrupt, true)
        }
        Err(e) => {
            eprintln!("rperftest: {e}");
            rdma_perf::exit_code("rperftest", &interrupt, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_replaces_bind_and_takes_perftest_s_d() {
        let c =
            Cli::try_parse_from(["rperftest", "write", "10.0.0.1", "--device", "rxe0:2"]).unwrap();
        assert_eq!(c.bind, None);
        assert_eq!(
            c.device.rdma_core().map(|d| (d.name.as_str(), d.port)),
            Some(("rxe0", 2))
        );
        let c = Cli::try_parse_from(["rperftest", "read", "-d", "mlx5_0", "--bind", "10.0.0.2"])
            .unwrap();
        assert_eq!(c.device.rdma_core().map(|d| d.port), Some(1));
        assert_eq!(c.bind, Some("10.0.0.2".parse().unwrap()));
        let c = Cli::try_parse_from([
            "rperftest",
            "send",
            "--ib-dev",
            "softroce0",
            "--bind",
            "127.0.0.1",
        ])
        .unwrap();
        assert!(c.device.rdma_core().is_none());
    }
}
