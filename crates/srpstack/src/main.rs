//! `srpstack`: the SRP stack in one command.
//!
//! `srpstack quickstart` exports a LUN over SRP and uses it: no
//! configuration, cleans up after itself. `srpstack bench` runs a fio-like
//! workload against a LUN exported the same way.

#![forbid(unsafe_code)]

use blockload::{Pattern, Progress, Report, Workload};
use clap::{Parser, Subcommand};
use daemon_ctl::signals::Interrupt;
use indicatif::{ProgressBar, ProgressStyle};
use rdma_types::units::format_size;
use srpstack::{Backing, Stack, StackConfig, Transport};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// mimalloc: the data path allocates a few small buffers per I/O, and
/// glibc's malloc costs several times more instructions per call.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// Seconds to run (or with a unit: 500ms, 1m) [default: 10; with
        /// --ios, 24 h].
        #[arg(long, value_parser = rdma_types::units::secs)]
        runtime: Option<Duration>,
        /// Stop after this many I/Os (with --runtime too: whichever comes
        /// first). Exact with --engine queue; with threads, a multiple of
        /// --iodepth. For counts that repeat, as `bench/cost` needs.
        #[arg(long)]
        ios: Option<u64>,
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
    /// Run both NICs in the NIC daemon (at --target-ip and
    /// --initiator-ip), through its socket SOCKET [default: $NICD_SOCKET,
    /// else nicd's default], instead of in this process; one is started
    /// for the two addresses when none answers.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg)]
    nicd: Option<std::path::PathBuf>,
    /// Give each command's data an R_Key of its own (a memory window
    /// bound per command, ib_srp's register_always) instead of one for
    /// the initiator's whole buffer pool.
    #[arg(long)]
    register_always: bool,
}

impl NetArgs {
    fn transport(&self) -> Result<Transport, String> {
        match self.provider.as_str() {
            "loopback" => Ok(Transport::Loopback),
            "softroce" if self.nicd.is_some() => {
                if self.target_ip == self.initiator_ip {
                    return Err("the target and initiator NICs need different addresses".into());
                }
                Ok(Transport::Nicd {
                    socket: nicd::socket_for(
                        self.nicd.as_deref().unwrap_or(std::path::Path::new("")),
                    ),
                    target: self.target_ip,
                    initiator: self.initiator_ip,
                })
            }
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
        Transport::Loopback | Transport::Nicd { .. } => rnic::softroce::NicOptions::default(),
    };
    Ok(StackConfig {
        transport,
        nic,
        inline_max: srp_target::PortOptions::inline_max_from_env(),
        ..Default::default()
    })
}

/// A workload's progress on standard error (drawn only when it is a
/// terminal): the timed part with its rate so far, the number the
/// report's `total` row ends with; then, with verify, the read-back as a
/// phase of its own.
struct Bars {
    timed: ProgressBar,
    check: Option<ProgressBar>,
    /// No bars at all (`bench --json`).
    quiet: bool,
}

impl Bars {
    /// Permille steps of the timed bar.
    const STEPS: u64 = 1000;

    fn new(label: &str, quiet: bool) -> Bars {
        let timed = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(Self::STEPS)
        };
        timed.set_style(Self::style("{msg:>12}"));
        timed.set_prefix(label.to_string());
        Bars {
            timed,
            check: None,
            quiet,
        }
    }

    fn style(right: &str) -> ProgressStyle {
        ProgressStyle::with_template(&format!(
            "  {{prefix:<24}} [{{bar:30}}] {{percent:>3}}%  {right}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#> ")
    }

    fn update(&mut self, p: &Progress) {
        self.timed
            .set_position((p.fraction() * Self::STEPS as f64) as u64);
        self.timed
            .set_message(format!("{:.1} MiB/s", p.mib_per_s()));
        let Some(rb) = p.read_back else {
            return;
        };
        if self.check.is_none() {
            self.timed.set_position(Self::STEPS);
            self.timed.finish();
            let bar = if self.quiet {
                ProgressBar::hidden()
            } else {
                ProgressBar::new(rb.total.max(1))
            };
            bar.set_style(Self::style("{msg}"));
            bar.set_prefix("read back and verify");
            self.check = Some(bar);
        }
        if let Some(bar) = &self.check {
            bar.set_length(rb.total.max(1));
            bar.set_position(rb.done);
            bar.set_message(format!(
                "{} of {}",
                format_size(rb.done),
                format_size(rb.total)
            ));
        }
    }

    /// The run is over: bars that did not finish say why.
    fn end(self, r: Option<&Report>) {
        let interrupted = r.is_some_and(|r| r.stopped == blockload::Stopped::Interrupted);
        for bar in std::iter::once(&self.timed).chain(&self.check) {
            if bar.is_finished() {
                continue;
            }
            if interrupted {
                bar.abandon_with_message("interrupted");
            } else {
                bar.finish();
            }
        }
    }
}

/// Runs `w` on `dev` with its bars, until done or `stop`.
fn run_with_bars(
    dev: Arc<dyn blockload::BlockDevice>,
    w: &Workload,
    label: &str,
    stop: &Interrupt,
    quiet: bool,
) -> Result<Report, String> {
    let mut bars = Bars::new(label, quiet);
    let r = blockload::run_until(dev, w, stop.flag(), |p| bars.update(&p));
    bars.end(r.as_ref().ok());
    r.map_err(|e| e.to_string())
}

/// A run time of zero runs for a second, as it always did.
/// `--nicd`: a daemon answering for both addresses (started when none
/// does), its start lock held until the stack has connected.
fn nicd_for(transport: &Transport) -> Result<Option<nicd::ondemand::Ensured>, String> {
    let Transport::Nicd {
        socket,
        target,
        initiator,
    } = transport
    else {
        return Ok(None);
    };
    let how = nicd::ondemand::OnDemand::from_env()?;
    let e = nicd::ondemand::ensure(socket, &[*target, *initiator], nicd::Fabric::Roce, &how)
        .map_err(|e| e.to_string())?;
    if let Some(s) = &e.started {
        eprintln!("srpstack: {s}");
    }
    eprintln!(
        "srpstack: NIC: the NIC daemon's at {target} and {initiator}, through {}",
        socket.display()
    );
    Ok(Some(e))
}

fn at_least_a_second(runtime: Duration) -> Duration {
    if runtime.is_zero() {
        Duration::from_secs(1)
    } else {
        runtime
    }
}

fn quickstart(
    nullio: bool,
    size: u64,
    runtime: Duration,
    net: &NetArgs,
    stop: &Interrupt,
) -> Result<(), String> {
    println!("srpstack quickstart: an SRP target and initiator in one process\n");
    let cfg = StackConfig {
        size,
        backing: if nullio {
            Backing::Null
        } else {
            Backing::TempFile
        },
        register_always: net.register_always,
        ..env_options(net.transport()?)?
    };
    let t0 = std::time::Instant::now();
    let held = nicd_for(&cfg.transport)?;
    let stack = Stack::start(&cfg).map_err(|e| e.to_string())?;
    drop(held);
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
        Transport::Nicd {
            socket,
            target,
            initiator,
        } => println!(
            "  provider     nicd: the NIC daemon's soft RoCE NICs {target} (target) and {initiator} (initiator), through {}",
            socket.display()
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
    // ends by reading back and checking every block it wrote. An interrupt
    // ends the phase it comes in and skips the rest.
    let mut fill = Workload::new(Pattern::Write);
    fill.bs = 1 << 20;
    fill.jobs = 4;
    fill.region = Some(region);
    fill.size = Some(region);
    fill.verify = verify;
    fill.runtime = Duration::from_secs(60);
    let r = run_with_bars(dev.clone(), &fill, "sequential write 1M", stop, false)?;
    reports.push((
        format!("sequential write, 1 MiB, 4 jobs, {}", format_size(region)),
        r,
    ));
    let mut mix = Workload::new(Pattern::RandRw { read_pct: 70 });
    mix.bs = 4096;
    mix.jobs = 8;
    mix.region = Some(region);
    mix.verify = verify;
    mix.runtime = at_least_a_second(runtime);
    // Four passes over the region at most, so a fast machine's quickstart
    // stays short; the report says when this, not --runtime, ended it.
    mix.size = Some(region * 4);
    if stop.signal().is_none() {
        let r = run_with_bars(dev.clone(), &mix, "random 70/30 r/w 4K", stop, false)?;
        reports.push((
            format!(
                "random 70% read / 30% write, 4 KiB, 8 jobs, {:.1} s or {}, whichever comes first",
                mix.runtime.as_secs_f64(),
                format_size(region * 4)
            ),
            r,
        ));
    }
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
            "  {} read back and verified against what was written",
            format_size(verified)
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
    if let Some(sig) = stop.signal() {
        return Err(interrupted(sig));
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

/// How long a run bounded by `--ios` alone may take: no limit in
/// practice, even under callgrind (the help says 24 h).
const NO_RUNTIME_LIMIT: Duration = Duration::from_secs(86_400);

#[allow(clippy::too_many_arguments)]
fn bench(
    net: &NetArgs,
    ram: u64,
    rw: Pattern,
    bs: u32,
    iodepth: u32,
    engine: &str,
    runtime: Option<Duration>,
    ios: Option<u64>,
    verify: bool,
    json: bool,
    stop: &Interrupt,
) -> Result<bool, String> {
    let transport = net.transport()?;
    let provider = if net.nicd.is_some() {
        "nicd"
    } else {
        net.provider.as_str()
    };
    if iodepth == 0 || iodepth > 256 {
        return Err(format!("iodepth {iodepth} must be 1..=256"));
    }
    // A byte budget of exactly `ios` I/Os: the queue engine's one job
    // stops at it; the threads engine splits it evenly over its jobs.
    let size = match ios {
        None => u64::MAX / 2,
        Some(0) => return Err("--ios must be at least 1".into()),
        Some(n) if engine == "threads" && !n.is_multiple_of(iodepth.into()) => {
            return Err(format!(
                "--ios {n} with --engine threads must be a multiple of --iodepth {iodepth} (one share per thread)"
            ))
        }
        Some(n) => n
            .checked_mul(bs.into())
            .ok_or_else(|| format!("--ios {n} of {bs} bytes is more bytes than can be counted"))?,
    };
    let held = nicd_for(&transport)?;
    let stack = Stack::start(&StackConfig {
        size: ram,
        backing: Backing::Ram,
        queue: (iodepth + 2).clamp(16, 254) as u16,
        register_always: net.register_always,
        ..env_options(transport)?
    })
    .map_err(|e| e.to_string())?;
    drop(held);
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
    w.runtime = match (runtime, ios) {
        (Some(t), _) => at_least_a_second(t),
        (None, Some(_)) => NO_RUNTIME_LIMIT,
        (None, None) => Duration::from_secs(10),
    };
    w.size = Some(size);
    w.verify = verify;
    let label = format!("{rw} {} qd{iodepth}", format_size(bs.into()));
    // The process's spending across the run: without verify, the run is
    // its timed window (plus starting the job threads and collecting
    // their reports); with it, a prefill or a read-back would count too.
    let before = srpstack::usage::Usage::now().map_err(|e| format!("getrusage: {e}"))?;
    let r = run_with_bars(dev, &w, &label, stop, json)?;
    let spent = srpstack::usage::Usage::now()
        .map_err(|e| format!("getrusage: {e}"))?
        .since(&before);
    let link = stack.link_counters();
    let ios = r.read.ios + r.write.ios;
    let per_io = if verify { None } else { spent.per_io(ios) };
    if json {
        let mut v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
        v["provider"] = serde_json::Value::from(provider);
        v["per_io"] = serde_json::to_value(per_io).map_err(|e| e.to_string())?;
        if let Some(c) = link {
            v["nic_packets_sent"] = c.tx_packets.into();
            v["nic_retransmits"] = c.retransmits.into();
        }
        println!("{v}");
    } else {
        print!("{}", r.table());
        match per_io {
            Some(p) => println!(
                "per I/O, whole process, timed window: {p}; syscalls and instructions: bench/cost"
            ),
            None if verify => println!(
                "per I/O: not measured with --verify (its prefill and read-back would count)"
            ),
            None => {}
        }
        if let Some(c) = link {
            println!(
                "soft RoCE: {} datagrams sent by both NICs ({:.2} per I/O, incl. login and setup), {} retransmitted",
                c.tx_packets,
                c.tx_packets as f64 / ios.max(1) as f64,
                c.retransmits
            );
        }
    }
    if let Some(sig) = stop.signal() {
        return Err(interrupted(sig));
    }
    Ok(r.ok())
}

/// What an interrupted run says last, once its report is out and the
/// stack is stopped.
fn interrupted(sig: i32) -> String {
    format!(
        "{}: stopped; the report above holds what was done so far",
        daemon_ctl::signals::name(sig)
    )
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "1") {
        return code;
    }
    daemon_ctl::log_to_stderr();
    let cli = Cli::parse();
    // Before any thread starts, so all of them inherit the mask.
    let stop = daemon_ctl::signals::block_term().watch("srpstack", daemon_ctl::signals::STOP_GRACE);
    let result = match cli.cmd {
        Cmd::Quickstart {
            nullio,
            size,
            runtime,
            net,
        } => quickstart(nullio, size, runtime, &net, &stop).map(|_| true),
        Cmd::Bench {
            net,
            ram,
            rw,
            bs,
            iodepth,
            engine,
            runtime,
            ios,
            verify,
            json,
        } => bench(
            &net, ram, rw, bs, iodepth, &engine, runtime, ios, verify, json, &stop,
        ),
    };
    if let Some(sig) = stop.signal() {
        if let Err(e) = &result {
            eprintln!("srpstack: {e}");
        }
        return ExitCode::from(daemon_ctl::signals::exit_status(sig));
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("srpstack: {e}");
            ExitCode::FAILURE
        }
    }
}
