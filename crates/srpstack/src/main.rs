//! `srpstack`: the SRP stack in one command.
//!
//! `srpstack quickstart` exports a LUN over SRP and uses it: no
//! configuration, cleans up after itself. `srpstack bench` runs a fio-like
//! workload against a LUN exported the same way.

#![forbid(unsafe_code)]

use blockload::{Pattern, Progress, Report, Workload};
use clap::{Parser, Subcommand};
use srpstack::{Backing, Stack, StackConfig, Transport};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "srpstack",
    version,
    about = "An RDMA storage stack: SRP target and initiator"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Export a LUN over SRP, log in, run a short verified workload, clean up.
    Quickstart {
        /// Back the LUN with nullio (writes dropped; no data verification).
        #[arg(long)]
        nullio: bool,
        /// LUN size (bytes; K, M, G, T suffixes).
        #[arg(long, default_value = "256M", value_parser = rdma_types::units::parse_size)]
        size: u64,
        /// Seconds (or with a unit: 500ms, 1m) of random I/O after the
        /// first write pass.
        #[arg(long, default_value = "5", value_parser = rdma_types::units::secs)]
        runtime: Duration,
        #[command(flatten)]
        net: NetArgs,
    },
    /// fio-like benchmark against a LUN exported over SRP in this process.
    Bench {
        #[command(flatten)]
        net: NetArgs,
        /// RAM-backed LUN of this size (bytes; K, M, G, T suffixes).
        #[arg(long, default_value = "1G", value_parser = rdma_types::units::parse_size)]
        ram: u64,
        /// read, write, randread, randwrite, randrw.
        #[arg(long, default_value = "randread")]
        rw: Pattern,
        /// Bytes per I/O (K, M suffixes).
        #[arg(long, default_value = "4K", value_parser = rdma_types::units::size::<u32>)]
        bs: u32,
        /// I/Os in flight.
        #[arg(long, default_value_t = 1)]
        iodepth: u32,
        /// How they are kept in flight: `queue` (one thread starts them
        /// and reaps their completions, as fio's libaio engine does) or
        /// `threads` (one thread per I/O, as fio's psync with numjobs).
        #[arg(long, default_value = "queue")]
        engine: String,
        /// Seconds to run (or with a unit: 500ms, 1m).
        #[arg(long, default_value = "10", value_parser = rdma_types::units::secs)]
        runtime: Duration,
        /// Stamp writes and check reads (a read-only pattern first fills
        /// the LUN, untimed, so every read is checked).
        #[arg(long)]
        verify: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Which provider carries SRP, and where.
#[derive(clap::Args, Clone)]
struct NetArgs {
    /// RDMA provider: softroce (RoCEv2 over UDP on loopback addresses) or
    /// loopback (in-process).
    #[arg(long, default_value = "softroce")]
    provider: String,
    /// Soft RoCE: the target NIC's address.
    #[arg(long, default_value = "127.0.0.1")]
    target_ip: std::net::IpAddr,
    /// Soft RoCE: the initiator NIC's address.
    #[arg(long, default_value = "127.0.0.2")]
    initiator_ip: std::net::IpAddr,
    /// Soft RoCE: the RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
}

impl NetArgs {
    fn transport(&self) -> Result<Transport, String> {
        match self.provider.as_str() {
            "loopback" => Ok(Transport::Loopback),
            "softroce" => {
                if self.target_ip == self.initiator_ip {
                    return Err("the target and initiator NICs need different addresses".into());
                }
                Ok(Transport::SoftRoce {
                    target: self.target_ip,
                    initiator: self.initiator_ip,
                    udp_port: self.udp_port,
                })
            }
            other => Err(format!(
                "provider `{other}` is not available (softroce or loopback)"
            )),
        }
    }
}

/// The stack's options from the environment: `SOFTROCE_GSO`,
/// `SOFTROCE_FOLLOW_LINK` and `SOFTROCE_FAULTS` for the soft RoCE NICs,
/// `SRPT_INLINE` for the target port.
fn env_options(transport: Transport) -> Result<StackConfig, String> {
    let nic = match transport {
        Transport::SoftRoce { .. } => {
            rnic::softroce::NicOptions::from_env().map_err(|e| e.to_string())?
        }
        Transport::Loopback => rnic::softroce::NicOptions::default(),
    };
    Ok(StackConfig {
        transport,
        nic,
        inline_max: srp_target::PortOptions::inline_max_from_env(),
        ..Default::default()
    })
}

fn bar(p: &Progress, label: &str) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let frac = (p.bytes as f64 / p.total_bytes.max(1) as f64)
        .max(p.elapsed.as_secs_f64() / p.runtime.as_secs_f64().max(1e-9))
        .min(1.0);
    let width = 30;
    let done = (frac * width as f64) as usize;
    let mib_s = p.bytes as f64 / p.elapsed.as_secs_f64().max(1e-9) / (1 << 20) as f64;
    eprint!(
        "\r  {label:<22} [{}{}] {:>3.0}%  {:>8.1} MiB/s ",
        "#".repeat(done),
        " ".repeat(width - done),
        frac * 100.0,
        mib_s
    );
    let _ = std::io::stderr().flush();
}

fn end_bar() {
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}

/// A run time of zero runs for a second, as it always did.
fn at_least_a_second(runtime: Duration) -> Duration {
    if runtime.is_zero() {
        Duration::from_secs(1)
    } else {
        runtime
    }
}

fn quickstart(nullio: bool, size: u64, runtime: Duration, net: &NetArgs) -> Result<(), String> {
    println!("srpstack quickstart: an SRP target and initiator in one process\n");
    let cfg = StackConfig {
        size,
        backing: if nullio {
            Backing::Null
        } else {
            Backing::TempFile
        },
        ..env_options(net.transport()?)?
    };
    let t0 = std::time::Instant::now();
    let stack = Stack::start(&cfg).map_err(|e| e.to_string())?;
    let info = stack.disk.info().clone();
    let sessions = stack.port.sessions();
    let session = sessions
        .first()
        .ok_or("the target shows no session after login")?;
    let neg = stack.session.negotiated();
    match &cfg.transport {
        Transport::Loopback => println!("  provider     loopback (in-process RDMA fabric, two CAs)"),
        Transport::SoftRoce {
            target,
            initiator,
            udp_port,
        } => println!(
            "  provider     softroce: RoCEv2 over UDP, target NIC {target}:{udp_port}, initiator NIC {initiator}:{udp_port}"
        ),
    }
    println!("  target       {}", stack.port.name());
    println!(
        "  session      {} (credits {}, max IU {} B, immediate data {})",
        session.initiator,
        neg.req_lim,
        neg.max_it_iu_len,
        if neg.imm_data_offset.is_some() {
            "on"
        } else {
            "off"
        }
    );
    println!(
        "  LUN 0        {} {} rev {}, {} blocks of {} B ({} MiB), {}",
        info.vendor,
        info.product,
        info.revision,
        info.blocks,
        info.block_size,
        (info.blocks * info.block_size as u64) >> 20,
        stack.backing
    );
    if let Some(naa) = &info.naa {
        println!("  device id    naa.{naa}");
    }
    println!(
        "  logged in in {:.1} ms\n",
        t0.elapsed().as_secs_f64() * 1e3
    );

    let dev: Arc<dyn blockload::BlockDevice> = stack.disk.clone();
    let region = size.min(64 << 20);
    let verify = !nullio;
    let mut reports: Vec<(String, Report)> = Vec::new();
    // Two phases: a sequential fill of the region, then a random mix. Each
    // ends by reading back and checking every block it wrote.
    let mut fill = Workload::new(Pattern::Write);
    fill.bs = 1 << 20;
    fill.jobs = 4;
    fill.region = Some(region);
    fill.size = Some(region);
    fill.verify = verify;
    fill.runtime = Duration::from_secs(60);
    let r = blockload::run(dev.clone(), &fill, |p| bar(&p, "sequential write 1M"))
        .map_err(|e| e.to_string())?;
    end_bar();
    reports.push(("sequential write, 1 MiB, 4 jobs".into(), r));
    let mut mix = Workload::new(Pattern::RandRw { read_pct: 70 });
    mix.bs = 4096;
    mix.jobs = 8;
    mix.region = Some(region);
    mix.verify = verify;
    mix.runtime = at_least_a_second(runtime);
    mix.size = Some(region * 4);
    let r = blockload::run(dev.clone(), &mix, |p| bar(&p, "random 70/30 r/w 4K"))
        .map_err(|e| e.to_string())?;
    end_bar();
    reports.push(("random 70% read / 30% write, 4 KiB, 8 jobs".into(), r));
    stack
        .disk
        .flush()
        .map_err(|e| format!("SYNCHRONIZE CACHE: {e}"))?;

    let mut ok = true;
    for (what, r) in &reports {
        println!("{what}:");
        for line in r.table().lines() {
            println!("  {line}");
        }
        ok &= r.ok();
    }
    let stats = stack.session.stats();
    println!(
        "\n  {} SCSI commands completed, {} timeouts, {} protocol errors",
        stats.completed, stats.timeouts, stats.protocol_errors
    );
    if verify {
        let verified: u64 = reports.iter().map(|(_, r)| r.verified_bytes).sum();
        println!(
            "  {:.1} MiB read back and verified against what was written",
            verified as f64 / (1u64 << 20) as f64
        );
    } else {
        println!("  nullio drops writes, so nothing was verified");
    }
    if let Some(c) = stack.link_counters() {
        println!(
            "  soft RoCE    {} packets sent, {} retransmitted, {} retransmission timeouts{}",
            c.tx_packets,
            c.retransmits,
            c.timeouts,
            match std::env::var("SOFTROCE_FAULTS") {
                Ok(f) if !f.trim().is_empty() => format!(" (SOFTROCE_FAULTS {f})"),
                _ => String::new(),
            }
        );
    }
    let temp = matches!(cfg.backing, Backing::TempFile);
    drop(dev);
    let left = stack.shutdown();
    println!(
        "  logged out, target stopped{}; verbs objects left behind: {left}\n",
        if temp {
            ", temporary LUN file removed"
        } else {
            ""
        }
    );
    if left != 0 {
        return Err(format!(
            "{left} verbs objects (QPs, CQs, MRs, ...) were not destroyed by the initiator and target"
        ));
    }
    println!("Next:");
    println!("  cargo run --release -p srpstack -- bench --rw randread --bs 4K --iodepth 32");
    println!("  cargo run --release -p srpstack -- quickstart --nullio --runtime 10");
    println!("  cargo run --release -p rdma-perf --bin rperf -- demo    # the soft RoCE NIC alone");
    if ok {
        Ok(())
    } else {
        Err("the workload reported errors (see above)".into())
    }
}

#[allow(clippy::too_many_arguments)]
fn bench(
    net: &NetArgs,
    ram: u64,
    rw: Pattern,
    bs: u32,
    iodepth: u32,
    engine: &str,
    runtime: Duration,
    verify: bool,
    json: bool,
) -> Result<bool, String> {
    let transport = net.transport()?;
    let provider = net.provider.as_str();
    if iodepth == 0 || iodepth > 256 {
        return Err(format!("iodepth {iodepth} must be 1..=256"));
    }
    let stack = Stack::start(&StackConfig {
        size: ram,
        backing: Backing::Ram,
        queue: (iodepth + 2).clamp(16, 254) as u16,
        ..env_options(transport)?
    })
    .map_err(|e| e.to_string())?;
    let dev: Arc<dyn blockload::BlockDevice> = stack.disk.clone();
    let mut w = Workload::new(rw);
    w.bs = bs;
    match engine {
        "queue" => {
            w.jobs = 1;
            w.iodepth = iodepth;
        }
        "threads" => w.jobs = iodepth,
        other => return Err(format!("engine `{other}`: use queue or threads")),
    }
    w.runtime = at_least_a_second(runtime);
    w.size = Some(u64::MAX / 2);
    w.verify = verify;
    let r = blockload::run(dev, &w, |p| {
        if !json {
            bar(&p, &format!("{rw} {bs}B qd{iodepth}"));
        }
    })
    .map_err(|e| e.to_string())?;
    if !json {
        end_bar();
    }
    let link = stack.link_counters();
    let ios = r.read.ios + r.write.ios;
    if json {
        let mut v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
        v["provider"] = serde_json::Value::from(provider);
        if let Some(c) = link {
            v["nic_packets_sent"] = c.tx_packets.into();
            v["nic_retransmits"] = c.retransmits.into();
        }
        println!("{v}");
    } else {
        print!("{}", r.table());
        if let Some(c) = link {
            println!(
                "soft RoCE: {} datagrams sent by both NICs ({:.2} per I/O, incl. login and setup), {} retransmitted",
                c.tx_packets,
                c.tx_packets as f64 / ios.max(1) as f64,
                c.retransmits
            );
        }
    }
    Ok(r.ok())
}

fn main() -> ExitCode {
    daemon_ctl::log_to_stderr();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Quickstart {
            nullio,
            size,
            runtime,
            net,
        } => quickstart(nullio, size, runtime, &net).map(|_| true),
        Cmd::Bench {
            net,
            ram,
            rw,
            bs,
            iodepth,
            engine,
            runtime,
            verify,
            json,
        } => bench(&net, ram, rw, bs, iodepth, &engine, runtime, verify, json),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("srpstack: {e}");
            ExitCode::FAILURE
        }
    }
}
