//! `ibstat`: list soft RoCE CAs and their ports as infiniband-diags'
//! `ibstat` and `ibv_devinfo` do (node and port GUIDs, limits, state,
//! LID, SM LID, LMC, capability mask, MTUs, GIDs, P_Keys, alias GUIDs),
//! as text or `--json`. A soft RoCE CA lives in the process that opens
//! it, so the tool opens one CA per `--ip` (the address must be free). In
//! the `ib` personality the CA's SMA answers an SM (`ibsm run --node
//! ADDR`) while the tool waits `--wait-active-ms` for it to activate the
//! port; what the SM set (LID, SM LID, P_Keys, ARMED/ACTIVE, GUIDInfo) is
//! then listed. `--device` lists rdma-core devices (real NICs, Linux
//! rxe/siw) through the rdma-core provider beside them, and with neither
//! option every device rdma-core finds is listed, as infiniband-diags'
//! `ibstat` does. `--nicd` lists the NIC daemon's CAs (those at `--ip`,
//! or every one it serves) through its socket, then the daemon's clients
//! and what each holds (root and the daemon's user only).

#![forbid(unsafe_code)]

use clap::{Parser, ValueEnum};
use rdma_access::devinfo::{self, CaInfo};
use rdma_access::sma::state;
use rdma_access::IbNode;
use rdma_mad::smp::cap;
use rdma_types::Mtu;
use rnic::softroce::{ip_guid, NicOptions, Personality, SoftCa, SoftRoce};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use verbs::Provider;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fabric {
    /// RoCE: GIDs from the addresses, no SM, ports active at once.
    Roce,
    /// Managed subnet: the port waits in INIT for an SM (`ibsm run`).
    Ib,
}

#[derive(Parser)]
#[command(
    name = "ibstat",
    version,
    about = "List soft RoCE CAs, rdma-core devices and their ports (ibstat / ibv_devinfo)"
)]
struct Cli {
    /// Address of a soft RoCE CA to open and list (repeat for several).
    #[arg(long)]
    ip: Vec<IpAddr>,
    /// An rdma-core device to list (rxe0, mlx5_0; repeat for several);
    /// with neither --ip nor --device, every device rdma-core finds, and
    /// the NIC daemon's CAs and clients when one serves.
    #[arg(long, value_name = "NAME")]
    device: Vec<String>,
    /// Port personality.
    #[arg(long, value_enum, default_value = "roce")]
    fabric: Fabric,
    /// ib: wait at most this long for an SM to make the port ACTIVE, in
    /// milliseconds or with a unit (10s).
    #[arg(long, default_value = "0", value_parser = rdma_types::units::millis)]
    wait_active_ms: Duration,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
    /// List the NIC daemon's CAs (those at --ip, else every one it
    /// serves) and its clients, through its socket SOCKET [default:
    /// $NICD_SOCKET, else nicd's default]; what --ip lists by default on
    /// the roce fabric, a daemon being started for the addresses when none
    /// answers.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg,
          conflicts_with = "own_nic")]
    nicd: Option<std::path::PathBuf>,
    /// Open the CAs at --ip on a soft RoCE NIC of this process's own, not
    /// the NIC daemon's; also what $NICD_MODE=own, --fabric ib or a --udp-port
    /// other than 4791 choose.
    #[arg(long)]
    own_nic: bool,
}

struct Quiet;

impl verbs::EventHandler for Quiet {
    fn on_completion(&self, _: u64) {}
    fn on_async_event(&self, _: verbs::AsyncEvent) {}
}

/// The rdma-core devices `names` asks for (all of them when `names` is
/// empty), each listed through the rdma-core provider.
fn rdma_core_cas(names: &[String]) -> Result<Vec<CaInfo>, String> {
    let core = rdmacore::RdmaCore::new().map_err(|e| e.to_string())?;
    let names: Vec<String> = if names.is_empty() {
        core.devices()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|d| d.name)
            .collect()
    } else {
        names.to_vec()
    };
    let mut out = Vec::new();
    for name in names {
        let guid = core.guid_of(&name).map_err(|e| e.to_string())?;
        let dev = core
            .open_ca(guid, 0, Arc::new(Quiet))
            .map_err(|e| format!("open {name}: {e}"))?;
        // The kernel runs its QP1 and the CM behind it.
        let info = devinfo::query(core.as_ref(), dev, &name, "Ethernet", cap::IS_CM_SUPPORTED);
        let _ = core.close_ca(dev);
        out.push(info.map_err(|e| format!("query {name}: {e}"))?);
    }
    Ok(out)
}

fn run(cli: &Cli) -> Result<Vec<CaInfo>, String> {
    if cli.ip.is_empty() || !cli.device.is_empty() {
        let mut cas = rdma_core_cas(&cli.device).map_err(|e| {
            if cli.ip.is_empty() {
                format!("{e}; or give --ip ADDR to list a soft RoCE CA")
            } else {
                e
            }
        })?;
        if cli.ip.is_empty() {
            if cas.is_empty() {
                return Err(
                    "rdma-core lists no RDMA device here; give --ip ADDR to list a soft RoCE CA"
                        .into(),
                );
            }
            return Ok(cas);
        }
        cas.extend(soft_cas(cli)?);
        return Ok(cas);
    }
    soft_cas(cli)
}

/// `--nicd`: the daemon's CAs (those of `--ip`, else all) and its
/// clients (`Err` in words when it refuses to list them).
fn nicd_cas(cli: &Cli, socket: &std::path::Path) -> Result<NicdListing, String> {
    if cli.fabric == Fabric::Ib || !cli.device.is_empty() {
        return Err(
            "--nicd lists the NIC daemon's soft RoCE CAs (the roce fabric): drop --fabric ib and \
             --device, or --nicd"
                .into(),
        );
    }
    let socket = nicd::socket_for(socket);
    let held = if cli.ip.is_empty() {
        None
    } else {
        let how = nicd::ondemand::OnDemand::from_env()?;
        let e = nicd::ondemand::ensure(&socket, &cli.ip, nicd::Fabric::Roce, &how)
            .map_err(|e| e.to_string())?;
        if let Some(s) = &e.started {
            eprintln!("ibstat: {s}");
        }
        Some(e)
    };
    let p = nicd::NicdProvider::connect(&socket).map_err(|e| e.to_string())?;
    drop(held);
    let served = p.list_cas();
    let guids: Vec<(rdma_types::Guid, Option<IpAddr>)> = if cli.ip.is_empty() {
        served.iter().map(|g| (*g, None)).collect()
    } else {
        let mut v = Vec::new();
        for ip in &cli.ip {
            let g = ip_guid(*ip);
            if !served.contains(&g) {
                return Err(format!(
                    "the NIC daemon at {} serves no NIC at {ip}: start one with `nicd --ip {ip}`",
                    socket.display()
                ));
            }
            v.push((g, Some(*ip)));
        }
        v
    };
    let mut cas = Vec::new();
    for (guid, ip) in guids {
        let dev = p
            .open_ca(guid, 0, Arc::new(Quiet))
            .map_err(|e| format!("open the NIC daemon's CA {:#018x}: {e}", guid.0))?;
        let ip = ip.or_else(|| {
            p.query_port(dev, rdma_types::PortNum(1))
                .ok()
                .and_then(|a| a.gids.first().map(|g| g.to_ip()))
        });
        let name = match ip {
            Some(ip) => format!("nicd {ip}"),
            None => format!("nicd {:#018x}", guid.0),
        };
        let info = devinfo::query(p.as_ref(), dev, &name, "Ethernet", cap::IS_CM_SUPPORTED);
        let _ = p.close_ca(dev);
        cas.push(info.map_err(|e| format!("query {name}: {e}"))?);
    }
    // Which clients run their own QPs on a block of a NIC's shared port.
    let lent = p.lent_ports().unwrap_or_default();
    let clients = p
        .daemon_clients()
        .map(|cs| {
            cs.into_iter()
                .filter(|c| i64::from(c.peer.pid) != i64::from(std::process::id()))
                .map(|c| {
                    let comm = std::fs::read_to_string(format!("/proc/{}/comm", c.peer.pid))
                        .map(|s| s.trim().to_string())
                        .unwrap_or_default();
                    let mut line = if comm.is_empty() {
                        c.to_string()
                    } else {
                        format!("{c} ({comm})")
                    };
                    for l in lent.iter().filter(|l| l.client == c.peer.id) {
                        line.push_str(&format!(
                            "; its own QPs on {:#018x}, block {}",
                            l.guid.0, l.block
                        ));
                    }
                    line
                })
                .collect()
        })
        .map_err(|e| format!("the daemon does not list its clients to this user: {e}"));
    Ok(NicdListing {
        socket,
        pid: p.daemon_pid(),
        cas,
        clients,
    })
}

/// What `--nicd` lists.
struct NicdListing {
    socket: std::path::PathBuf,
    pid: u32,
    cas: Vec<CaInfo>,
    /// One line per client (this tool's own connection left out).
    clients: Result<Vec<String>, String>,
}

/// The soft RoCE CAs of `--ip`.
fn soft_cas(cli: &Cli) -> Result<Vec<CaInfo>, String> {
    for (i, a) in cli.ip.iter().enumerate() {
        if cli.ip[..i].contains(a) {
            return Err(format!("--ip {a} is given twice"));
        }
    }
    let cas: Vec<SoftCa> = cli
        .ip
        .iter()
        .map(|&ip| SoftCa {
            guid: ip_guid(ip),
            ip,
        })
        .collect();
    let nic = NicOptions::from_env().map_err(|e| e.to_string())?;
    let p = SoftRoce::with_options(cas.clone(), cli.udp_port, Mtu::Mtu4096, nic);
    let mut out = Vec::new();
    match cli.fabric {
        Fabric::Roce => {
            for ca in &cas {
                let dev = p
                    .open_ca(ca.guid, 0, Arc::new(Quiet))
                    .map_err(|e| format!("open the CA on {}: {e}", ca.ip))?;
                let name = format!("roce {}", ca.ip);
                // No SMA on a RoCE port: the CM (QP1) is what it offers.
                let info = devinfo::query(p.as_ref(), dev, &name, "Ethernet", cap::IS_CM_SUPPORTED);
                let _ = p.close_ca(dev);
                out.push(info.map_err(|e| format!("query the CA on {}: {e}", ca.ip))?);
            }
        }
        Fabric::Ib => {
            let nodes = cas
                .iter()
                .map(|ca| {
                    let desc = format!("ibstat {}", ca.ip);
                    let start = |e: String| format!("start the ib port on {}: {e}", ca.ip);
                    p.set_personality(ca.guid, Personality::Ib)
                        .map_err(|e| start(format!("CA {:#x}: {e}", ca.guid.0)))?;
                    IbNode::start(p.clone(), ca.guid, &desc, false, std::process::id() << 8)
                        .map_err(|e| start(e.to_string()))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let wait = cli.wait_active_ms;
            for n in &nodes {
                n.sma().wait_state(state::ACTIVE, wait);
            }
            for (n, ca) in nodes.iter().zip(&cas) {
                let dev = p
                    .open_ca(ca.guid, 0, Arc::new(Quiet))
                    .map_err(|e| format!("open the CA on {}: {e}", ca.ip))?;
                let name = format!("ib {}", ca.ip);
                let info = devinfo::query(p.as_ref(), dev, &name, "InfiniBand", 0);
                let _ = p.close_ca(dev);
                let mut info = info.map_err(|e| format!("query the CA on {}: {e}", ca.ip))?;
                for port in &mut info.ports {
                    *port = port.clone().from_sma(n.sma());
                }
                out.push(info);
            }
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "8") {
        return code;
    }
    let cli = Cli::parse();
    // --ip: the daemon's CAs there, or CAs of our own.
    // Neither --ip, --device nor --nicd: every rdma-core device, and the
    // NIC daemon's CAs when one serves at the default socket (none is
    // started for a listing).
    let bare = cli.ip.is_empty() && cli.device.is_empty() && cli.nicd.is_none();
    let which = match (&cli.nicd, cli.ip.is_empty()) {
        (None, true) if bare && cli.fabric == Fabric::Roce => {
            let asked = nicd::choice::Asked::from_env(None, cli.own_nic, None);
            nicd::choice::choose(&asked)
                .ok()
                .filter(|w| w.socket().is_some_and(nicd::ondemand::answers))
        }
        (None, true) => None,
        _ => {
            // Beside rdma-core devices, CAs of our own (nicd_cas refuses
            // --device with --nicd).
            let own_only = nicd::choice::first_given(&[
                (
                    cli.nicd.is_none() && !cli.device.is_empty(),
                    "--device beside --ip".into(),
                ),
                (
                    cli.udp_port != rnic::softroce::ROCE_PORT,
                    format!("--udp-port {}", cli.udp_port),
                ),
                // A port of its own in the ib personality, to see what an
                // SM made of it; the daemon's are listed on the roce one.
                (cli.fabric == Fabric::Ib, "--fabric ib".into()),
            ]);
            let asked = nicd::choice::Asked::from_env(cli.nicd.as_deref(), cli.own_nic, own_only);
            match nicd::choice::choose(&asked) {
                Ok(w) => Some(w),
                Err(e) => {
                    eprintln!("ibstat: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    if let Some(own @ nicd::choice::Which::Own { .. }) = &which {
        let at: Vec<String> = cli.ip.iter().map(|i| i.to_string()).collect();
        eprintln!("{}", own.line("ibstat", &at.join(", "), None));
    }
    if let Some(s) = which.as_ref().and_then(|w| w.socket()) {
        return match nicd_cas(&cli, s) {
            Ok(l) => {
                // The rdma-core devices beside them, if there are any.
                let devices = if bare {
                    rdma_core_cas(&[]).unwrap_or_default()
                } else {
                    Vec::new()
                };
                if cli.json {
                    let all: Vec<CaInfo> = l.cas.iter().chain(&devices).cloned().collect();
                    println!("{}", devinfo::json(&all));
                    return ExitCode::SUCCESS;
                }
                for c in l.cas.iter().chain(&devices) {
                    print!("{}", c.human());
                }
                println!(
                    "NIC daemon pid {} on {}: clients",
                    l.pid,
                    l.socket.display()
                );
                match &l.clients {
                    Ok(lines) if lines.is_empty() => println!("\tnone"),
                    Ok(lines) => lines.iter().for_each(|c| println!("\t{c}")),
                    Err(e) => println!("\t({e})"),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ibstat: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&cli) {
        Ok(cas) => {
            if cli.json {
                println!("{}", devinfo::json(&cas));
            } else {
                for c in &cas {
                    print!("{}", c.human());
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ibstat: {e}");
            ExitCode::FAILURE
        }
    }
}
