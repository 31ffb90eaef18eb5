//! `ibsm`: the subnet manager's command line. `ibsm check FILE` validates a
//! partitions file; `ibsm simulate` runs the SM over a simulated fabric
//! (`ib_sm::sim`) and prints what a sweep did: ports brought up with their
//! LIDs, each host's P_Key table, and the PathRecords one host gets from
//! the SA. `ibsm run` is the SM and SA on a real soft RoCE port in the
//! `ib` personality (`ib_sm::port`): it sweeps the nodes it is given
//! (UDP has no switches to discover them through), brings their ports
//! ACTIVE with LIDs and P_Key tables, and answers SA queries until
//! SIGTERM/SIGINT, or by itself after `--once` / `--sweeps N`. Two
//! `ibsm run`s that list each other among their nodes elect a master
//! (`--priority`, then the lower GUID); the other is standby, polls the
//! master's SMInfo every `--poll-interval-ms` and takes over when it stops
//! answering; the master polls its standbys as often and logs one that
//! comes or goes. `--mkey HEX` gives every port an M_Key (used in every
//! SMP), `--mkey-protect N` its protection level and `--mkey-lease-secs`
//! its lease; a port that refuses the SM's key, or reports a bad key
//! (trap 256), is logged. `--lmc N` gives every node's port 2^N LIDs
//! (base aligned) and the SA a path per LID pair. The SM runs on the NIC
//! daemon's port at `--addr` (an `ib` one, started or added on demand;
//! `--nicd` names the daemon's socket), whose SMA lends it the port's QP0
//! until it ends; `--own-nic` (or `NICD_MODE=own`, or a `--udp-port`
//! other than 4791) gives it a soft RoCE NIC of its own.

#![deny(clippy::undocumented_unsafe_blocks)]

use clap::{Parser, Subcommand};
use ib_sm::port::SmPort;
use ib_sm::sim::{all_active, fabric_with, host, run_query, sim_config, sm, table};
use ib_sm::{SmConfig, SmEvent};
use rdma_mad::sa::{PathRecord, SaAttr};
use rdma_types::{Duration, Gid, Guid, Lid, Mtu};
use rnic::softroce::{NicOptions, Personality, SoftCa, SoftRoce};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ibsm",
    version,
    about = "Subnet manager and SA for the managed-subnet mode"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Validate a partitions file (opensm partitions.conf style).
    Check {
        /// The file.
        file: std::path::PathBuf,
    },
    /// Run the SM over a simulated fabric and print the result.
    Simulate {
        /// Hosts besides the SM (1 to 60).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=60))]
        hosts: u8,
        /// Partitions file.
        #[arg(long)]
        partitions: Option<std::path::PathBuf>,
        /// Fraction of datagrams lost (0 to 0.5).
        #[arg(long, default_value_t = 0.0)]
        loss: f64,
        /// Seed of the simulation.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// LID Mask Control (0 to 7): 2^LMC LIDs per port, a path per
        /// SLID/DLID pair.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=7))]
        lmc: u8,
    },
    /// Run the SM and SA on a soft RoCE port (ib personality) for the nodes
    /// given, until SIGTERM/SIGINT.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The SM's own address (its soft RoCE CA binds it).
    #[arg(long)]
    addr: IpAddr,
    /// The NIC daemon's socket SOCKET [default: $NICD_SOCKET, else nicd's
    /// default]. The SM runs on the daemon's `ib` port at --addr (the
    /// default; started or added when missing), whose SMA lends it the
    /// port's QP0. Needs root or the daemon's user.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg)]
    nicd: Option<PathBuf>,
    /// A soft RoCE NIC of this process at --addr instead of the NIC
    /// daemon's port.
    #[arg(long)]
    own_nic: bool,
    /// A node's address (repeat for each).
    #[arg(long = "node")]
    nodes: Vec<IpAddr>,
    /// A file of node addresses, one a line ('#' starts a comment).
    #[arg(long)]
    nodes_file: Option<PathBuf>,
    /// Partitions file (default: everyone a full member of 0x7fff).
    #[arg(long)]
    partitions: Option<PathBuf>,
    /// The RoCEv2 UDP port of every node.
    #[arg(long, default_value_t = rnic::softroce::ROCE_PORT)]
    udp_port: u16,
    /// Milliseconds (or with a unit: 10s) between sweeps, 10 ms to 1 h.
    #[arg(long, default_value = "10000", value_parser = ms_within(10, 3_600_000))]
    sweep_interval_ms: std::time::Duration,
    /// Milliseconds (or with a unit) an SMP or Report waits for its
    /// answer, 1 ms to 60 s.
    #[arg(long, default_value = "200", value_parser = ms_within(1, 60_000))]
    timeout_ms: std::time::Duration,
    /// Resends before a node counts as gone.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=20))]
    retries: u32,
    /// The SM's own LID.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=0xbfff))]
    lid: u16,
    /// SMInfo priority (0 to 15): with other SMs among the nodes, the
    /// highest (then the lowest GUID) is master, the others standby.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=15))]
    priority: u8,
    /// Milliseconds (or with a unit: 3s) between a standby's polls of the
    /// master, 10 ms to 1 h.
    #[arg(long, default_value = "3000", value_parser = ms_within(10, 3_600_000))]
    poll_interval_ms: std::time::Duration,
    /// M_Key for every port, hex (0: none; IBA 14.2.4).
    #[arg(long, default_value = "0", value_parser = parse_hex_u64)]
    mkey: u64,
    /// M_KeyProtectBits: 0 Gets show the key, 1 Gets hide it from a wrong
    /// key, 2 and 3 Gets need the key (Sets always do).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    mkey_protect: u8,
    /// M_KeyLeasePeriod, seconds: protection lapses this long after a
    /// refused SMP unless the right key comes (0: never).
    #[arg(long, default_value_t = 0)]
    mkey_lease_secs: u16,
    /// LID Mask Control (0 to 7), as opensm's `lmc`: every node's port
    /// gets 2^LMC LIDs from a base aligned to 2^LMC, and the SA lists a
    /// path for each (SLID, DLID) pair, best first.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=7))]
    lmc: u8,
    /// Stop after the first sweep; fail unless every node came up.
    #[arg(long, conflicts_with = "sweeps")]
    once: bool,
    /// Stop after this many sweeps.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    sweeps: Option<u64>,
}

/// A duration option in milliseconds or with a unit
/// (`rdma_types::units::millis`), within `lo..=hi` milliseconds.
fn ms_within(
    lo: u64,
    hi: u64,
) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync + 'static {
    move |s| {
        let d = rdma_types::units::millis(s).map_err(|e| e.to_string())?;
        let ms = d.as_millis();
        if d.subsec_nanos() % 1_000_000 != 0 {
            Err(format!("`{s}` is not a whole number of milliseconds"))
        } else if (u128::from(lo)..=u128::from(hi)).contains(&ms) {
            Ok(d)
        } else {
            Err(format!("`{s}` is {ms} ms, outside {lo}..={hi} ms"))
        }
    }
}

/// A 64-bit hex number, with or without `0x`.
fn parse_hex_u64(s: &str) -> Result<u64, String> {
    let t = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(t, 16).map_err(|e| format!("{s:?}: not a 64-bit hex number: {e}"))
}

/// The node addresses of `--node` and `--nodes-file`, in that order,
/// without repeats.
fn node_addrs(args: &RunArgs, own: bool) -> Result<Vec<IpAddr>, String> {
    let mut out = args.nodes.clone();
    if let Some(f) = &args.nodes_file {
        out.extend(read_nodes(f)?);
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|a| seen.insert(*a));
    if out.contains(&args.addr) && own {
        return Err(format!("{} is the SM's own address, not a node", args.addr));
    }
    if out.is_empty() {
        return Err("no nodes: give --node ADDR or --nodes-file FILE".into());
    }
    Ok(out)
}

fn read_nodes(f: &Path) -> Result<Vec<IpAddr>, String> {
    let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let a = line
            .parse()
            .map_err(|e| format!("{}:{}: {line:?}: {e}", f.display(), i + 1))?;
        out.push(a);
    }
    Ok(out)
}

/// The blocked termination signals, polled between steps (no handler
/// runs in signal context). Blocked before any thread starts, so every
/// thread inherits the mask and the main thread alone takes them.
struct Signals(libc::sigset_t);

impl Signals {
    fn block() -> Signals {
        // SAFETY: the set is initialised by sigemptyset before use; the
        // mask change is this thread's, inherited by threads made later.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Signals(set)
        }
    }

    /// A pending SIGTERM/SIGINT, taken without waiting.
    fn pending(&self) -> Option<i32> {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: the set was initialised in block(); a null siginfo is
        // allowed; zero is a valid timespec.
        let s = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &zero) };
        (s > 0).then_some(s)
    }
}

fn run_sm(args: RunArgs) -> Result<(), String> {
    let signals = Signals::block();
    let which = nicd::choice::choose_for(args.nicd.as_deref(), args.own_nic, args.udp_port, &[])?;
    let nodes = node_addrs(&args, which.socket().is_none())?;
    let mut cfg = SmConfig::new(Guid(0));
    if let Some(f) = &args.partitions {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        cfg.partitions =
            ib_sm::parse_partitions(&text).map_err(|e| format!("{}: {e}", f.display()))?;
    }
    // The SM's port GUID: from its address, as the GIDs are.
    let gid = Gid::from_ip(args.addr);
    let guid = Guid(u64::from_be_bytes(gid.0[8..16].try_into().expect("8 bytes")) | 1 << 57);
    cfg.guid = guid;
    cfg.lid = args.lid;
    cfg.sweep_interval = Duration::from_std(args.sweep_interval_ms);
    cfg.timeout = Duration::from_std(args.timeout_ms);
    cfg.retries = args.retries;
    cfg.priority = args.priority;
    cfg.poll_interval = Duration::from_std(args.poll_interval_ms);
    cfg.mkey = args.mkey;
    cfg.mkey_protect = args.mkey_protect;
    cfg.mkey_lease = args.mkey_lease_secs;
    cfg.lmc = args.lmc;
    let gids: Vec<Gid> = nodes.iter().map(|a| Gid::from_ip(*a)).collect();
    let (mut port, _own) = match which.socket().map(PathBuf::from) {
        None => {
            let nic = SoftRoce::with_options(
                vec![SoftCa {
                    guid,
                    ip: args.addr,
                }],
                args.udp_port,
                Mtu::Mtu4096,
                NicOptions::from_env().map_err(|e| e.to_string())?,
            );
            nic.set_personality(guid, Personality::Ib)
                .map_err(|e| e.to_string())?;
            let port = SmPort::open(nic.clone(), guid, cfg, &gids).map_err(|e| e.to_string())?;
            // The SM configures its own port directly: it is the master here.
            nic.set_lid(guid, Lid(args.lid))
                .and_then(|()| nic.set_sm_lid(guid, Lid(args.lid)))
                .and_then(|()| nic.set_port_state(guid, verbs::PortState::Active))
                .map_err(|e| format!("own port: {e}"))?;
            eprintln!("{}", which.line("ibsm", &args.addr.to_string(), None));
            (port, None)
        }
        Some(socket) => {
            let how = nicd::ondemand::OnDemand::from_env()?;
            let held = nicd::ondemand::ensure(&socket, &[args.addr], nicd::Fabric::Ib, &how)
                .map_err(|e| e.to_string())?;
            if let Some(s) = &held.started {
                eprintln!("ibsm: {s}");
            }
            let (p, guid) = nicd::connect_at(&socket, args.addr, Some(nicd::Fabric::Ib))?;
            drop(held);
            cfg.guid = guid;
            // Other clients of the daemon share the port: srptd's DM
            // agent may serve on it (the daemon answers DM requests with
            // a status when none does).
            cfg.own_device_management = true;
            let provider: std::sync::Arc<dyn verbs::Provider> = p.clone();
            let port = SmPort::open(provider.clone(), guid, cfg, &gids)
                .map_err(|e| format!("the NIC daemon's port at {}: {e}", args.addr))?;
            // Its own port through the daemon's port control.
            let ca = provider
                .open_ca(guid, 0, std::sync::Arc::new(verbs::IgnoreEvents))
                .map_err(|e| format!("own port: {e}"))?;
            // The SA is here: the daemon's other clients on this port
            // find it by the port's SM GID.
            let own = verbs::PortModify::new()
                .lid(Lid(args.lid))
                .sm_lid(Lid(args.lid))
                .sm_gid(gid)
                .state(verbs::PortState::Active);
            provider
                .modify_port(ca, rdma_types::PortNum(1), &own)
                .map_err(|e| format!("own port: {e}"))?;
            eprintln!(
                "{}",
                which.line("ibsm", &args.addr.to_string(), Some(p.daemon_pid()))
            );
            (port, Some((provider, ca)))
        }
    };
    println!(
        "ibsm: SM and SA at {} (LID {}), {} nodes, sweeps every {} ms, LMC {}",
        args.addr,
        args.lid,
        nodes.len(),
        args.sweep_interval_ms.as_millis(),
        args.lmc
    );
    let last_sweep = if args.once { Some(1) } else { args.sweeps };
    loop {
        port.step(std::time::Duration::from_millis(50));
        while let Some(e) = port.poll_event() {
            match e {
                SmEvent::State(_) => {
                    println!("{} (LID {})", describe(&e, args.lmc), port.sm().lid_now())
                }
                _ => println!("{}", describe(&e, args.lmc)),
            }
        }
        if let Some(sig) = signals.pending() {
            println!("ibsm: signal {sig}, stopping");
            break;
        }
        let sm = port.sm();
        if last_sweep.is_some_and(|n| sm.stats().sweeps >= n && !sm.busy()) {
            break;
        }
    }
    let sm = port.sm();
    let st = sm.stats();
    let active = sm.active_ports().len();
    println!(
        "ibsm: {active} of {} ports ACTIVE after {} sweeps, {} resends, {} SA requests, {} reports, \
         {} bad M_Key traps, {} ports refusing our M_Key, {} SA MADs ignored (not master), \
         {} SA MADs dropped (wrong SM_Key)",
        nodes.len(),
        st.sweeps,
        st.retries,
        st.sa_requests,
        st.reports,
        st.bad_mkey_traps,
        st.mkey_refused,
        st.sa_ignored,
        st.sa_bad_sm_key
    );
    if args.once && active < nodes.len() {
        return Err(format!(
            "{} of {} nodes did not come up",
            nodes.len() - active,
            nodes.len()
        ));
    }
    Ok(())
}

/// One line for the log (`lmc`: the SM's, for a port's LID range).
fn describe(e: &SmEvent, lmc: u8) -> String {
    match e {
        SmEvent::PortUp { guid, lid } if lmc > 0 => format!(
            "port {:#018x} ACTIVE, LIDs {lid}-{} (LMC {lmc})",
            guid.0,
            lid + ((1u16 << lmc) - 1)
        ),
        SmEvent::PortUp { guid, lid } => format!("port {:#018x} ACTIVE, LID {lid}", guid.0),
        SmEvent::PortDown { guid } => format!("port {:#018x} gone", guid.0),
        SmEvent::State(s) => format!("ibsm: SM state {}", format!("{s:?}").to_uppercase()),
        SmEvent::MasterLost { guid } => {
            format!(
                "ibsm: master {:#018x} stopped answering: taking over",
                guid.0
            )
        }
        SmEvent::CapabilityChange { guid, mask } => {
            format!(
                "port {:#018x} capability mask {mask:#010x} (trap 144)",
                guid.0
            )
        }
        SmEvent::BadMkey {
            guid,
            requester,
            method,
            attr,
        } => format!(
            "port {:#018x} refused an SMP with a bad M_Key (trap 256): method {method:#04x} \
             attribute {attr:#06x} from LID {requester}",
            guid.0
        ),
        SmEvent::BadPkey {
            guid,
            pkey,
            from,
            from_guid,
            src_qp,
            dest_qp,
        } => {
            let who = from_guid.map_or(String::new(), |g| format!(" (port {:#018x})", g.0));
            format!(
                "port {:#018x} dropped a packet with a bad P_Key (trap 257): P_Key {:04x} \
                 from {from}{who} QP {src_qp:#x} to QP {dest_qp:#x}",
                guid.0, pkey.0
            )
        }
        SmEvent::MkeyRefused { guid } => {
            format!("port {:#018x} refuses our M_Key: left unconfigured", guid.0)
        }
        SmEvent::MkeyLearned { guid } => {
            format!("port {:#018x} showed another M_Key: using it", guid.0)
        }
        SmEvent::StandbyFound { guid, priority } => {
            format!("ibsm: standby SM {:#018x} (priority {priority})", guid.0)
        }
        SmEvent::StandbyLost { guid } => {
            format!("ibsm: standby SM {:#018x} stopped answering", guid.0)
        }
        SmEvent::HandoverAcknowledged { guid } => {
            format!("ibsm: SM {:#018x} acknowledged the handover", guid.0)
        }
    }
}

fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Run(args) => run_sm(args),
        Cmd::Check { file } => {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let parts =
                ib_sm::parse_partitions(&text).map_err(|e| format!("{}: {e}", file.display()))?;
            for p in &parts {
                let members: Vec<String> = p
                    .members
                    .iter()
                    .map(|(g, full)| {
                        format!(
                            "{}={}",
                            g.map_or("ALL".to_string(), |g| format!("{:#018x}", g.0)),
                            if *full { "full" } else { "limited" }
                        )
                    })
                    .collect();
                println!("{} {:#06x}: {}", p.name, p.pkey, members.join(", "));
            }
            println!(
                "ibsm: {}: {} partitions, valid",
                file.display(),
                parts.len()
            );
            Ok(())
        }
        Cmd::Simulate {
            hosts,
            partitions,
            loss,
            seed,
            lmc,
        } => {
            if !(0.0..=0.5).contains(&loss) {
                return Err(format!("--loss {loss}: use 0 to 0.5"));
            }
            let text = match &partitions {
                Some(f) => {
                    Some(std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?)
                }
                None => None,
            };
            let mut cfg = sim_config(text.as_deref()).map_err(|e| e.to_string())?;
            cfg.lmc = lmc;
            let mut sim = fabric_with(seed, loss, cfg, hosts);
            let r = sim.run_until(Duration::from_secs(120), |s| all_active(s, hosts));
            for e in std::mem::take(&mut sm(&mut sim).events) {
                println!("{}", describe(&e, lmc));
            }
            if r != rdma_sim::RunOutcome::Done {
                return Err(format!("the fabric did not come up: {r:?}"));
            }
            for n in 2..2 + hosts {
                let keys: Vec<String> = host(&mut sim, n)
                    .sma
                    .pkeys()
                    .iter()
                    .filter(|k| k.0 & 0x7fff != 0)
                    .map(|k| format!("{:#06x}", k.0))
                    .collect();
                println!("host {n}: P_Keys {}", keys.join(" "));
            }
            let segs = run_query(&mut sim, 2, 0x12, SaAttr::PathRecord, 0, &[0u8; 64])
                .ok_or("the SA did not answer")?;
            let (_, recs) = table(&segs).map_err(|e| e.to_string())?;
            println!("PathRecords from host 2 ({}):", recs.len());
            for r in recs {
                let p = PathRecord::parse(&r).map_err(|e| e.to_string())?;
                println!(
                    "  SLID {:>3} -> DLID {:>3}  DGID {}  P_Key {:#06x}  MTU code {}  preference {}",
                    p.slid, p.dlid, p.dgid, p.pkey.0, p.mtu, p.preference
                );
            }
            let st = sm(&mut sim).sm.stats();
            println!(
                "ibsm: {hosts} hosts ACTIVE after {} sweeps, {} resends, {} SA requests, {} ms of virtual time",
                st.sweeps,
                st.retries,
                st.sa_requests,
                sim.now().total_millis()
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "8") {
        return code;
    }
    match run(Cli::parse().cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibsm: {e}");
            ExitCode::FAILURE
        }
    }
}
