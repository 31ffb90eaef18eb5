//! `saquery`: ask a subnet's SA (`ibsm run`) what it knows, as
//! infiniband-diags' saquery does: nodes, ports (LID, state, MTU,
//! capabilities: the ibstat view of every port of the fabric), paths and
//! services. It takes a place at the QP1 of the NIC daemon's port at
//! `--ip` (started or added when missing; where that port is a managed
//! one, the SA is the one that manages it unless `--sa` says otherwise),
//! or with `--own-nic` (or `NICD_MODE=own`, or a `--udp-port` other than
//! 4791) opens a soft RoCE NIC of its own on `--ip` (which must be free)
//! and sends SA MADs from its QP1.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use rdma_access::sa::{PathQuery, SaClient, SaTiming};
use rdma_access::CmAgent;
use rdma_mad::smp::{cap_names, PortInfo};
use rdma_types::{Gid, Guid, Mtu, Pkey};
use rnic::softroce::{NicOptions, SoftCa, SoftRoce};
use std::net::IpAddr;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "saquery",
    version,
    about = "Query the subnet administrator (ibsm run)"
)]
struct Cli {
    /// Address of the SA's port (where `ibsm run` listens). On the NIC
    /// daemon's managed port: the SA of its SM by default.
    #[arg(long)]
    sa: Option<IpAddr>,
    /// Address of the NIC for the query: the NIC daemon's there (the
    /// address may be in use by others), or with --own-nic our own.
    #[arg(long, default_value = "127.0.0.9")]
    ip: IpAddr,
    /// The NIC daemon's socket SOCKET [default: $NICD_SOCKET, else nicd's
    /// default]: the daemon is the default.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "", value_parser = nicd::socket_arg)]
    nicd: Option<std::path::PathBuf>,
    /// A soft RoCE NIC of our own at --ip instead of the NIC daemon's.
    #[arg(long)]
    own_nic: bool,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Milliseconds (or with a unit: 1s) to wait for an answer (sent 3
    /// more times).
    #[arg(long, default_value = "500", value_parser = rdma_types::units::millis)]
    timeout_ms: std::time::Duration,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// NodeRecords: every node, or the one with `--lid`.
    Nodes {
        #[arg(long)]
        lid: Option<u16>,
    },
    /// PortInfoRecords: LID, state, SM LID, MTU and capabilities of every
    /// port (or `--lid`), optionally only those with device management.
    Ports {
        #[arg(long)]
        lid: Option<u16>,
        /// Only ports with IsDeviceManagementSupported (srp_daemon's query).
        #[arg(long)]
        dm: bool,
    },
    /// PathRecords from `--sgid` to `--dgid` (IP addresses or GIDs).
    Paths {
        #[arg(long)]
        sgid: String,
        #[arg(long)]
        dgid: String,
        /// At most this many paths (1: the SA's first, by a Get; 0: every
        /// path it has: with LMC > 0, one per SLID/DLID pair).
        #[arg(long, default_value_t = 4)]
        max: u8,
        /// Only paths in this partition (hex, e.g. ffff).
        #[arg(long)]
        pkey: Option<String>,
    },
    /// ServiceRecords: all, or by `--id` (hex) or `--name`.
    Services {
        #[arg(long)]
        id: Option<String>,
        #[arg(long)]
        name: Option<String>,
    },
}

/// An IP address (as its IPv4-mapped or IPv6 GID) or a GID written as 32
/// hex digits with or without colons.
fn gid(s: &str) -> Result<Gid, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(Gid::from_ip(ip));
    }
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.len() != 32 {
        return Err(format!("`{s}` is neither an IP address nor a 128-bit GID"));
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("`{s}`: not hex"))?;
    }
    Ok(Gid(g))
}

fn hex(s: &str, what: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| format!("{what} `{s}` is not a hex number"))
}

fn fmt_gid(g: Gid) -> String {
    g.0.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// Our MAD driver for the queries and the SA's GID: at the NIC daemon's
/// port, or on a NIC of our own.
fn port(cli: &Cli) -> Result<(std::sync::Arc<CmAgent>, Gid), String> {
    let first_comm_id = std::process::id() << 8;
    let which = nicd::choice::choose_for(cli.nicd.as_deref(), cli.own_nic, cli.udp_port, &[])?;
    let Some(socket) = which.socket().map(std::path::PathBuf::from) else {
        let sa = cli.sa.ok_or(
            "give --sa ADDRESS: a NIC of saquery's own knows no SM (the NIC daemon's managed \
             port does)",
        )?;
        let guid = Guid(0x0002_c903_00ee_0000 | u64::from(std::process::id() & 0xffff));
        let provider = SoftRoce::with_options(
            vec![SoftCa { guid, ip: cli.ip }],
            cli.udp_port,
            Mtu::Mtu4096,
            NicOptions::from_env().map_err(|e| e.to_string())?,
        );
        let agent = CmAgent::start(provider, guid, first_comm_id)
            .map_err(|e| format!("open our NIC on {}: {e}", cli.ip))?;
        eprintln!("{}", which.line("saquery", &cli.ip.to_string(), None));
        return Ok((agent, Gid::from_ip(sa)));
    };
    // A port the daemon serves at --ip, of either fabric (a roce one is
    // added when it serves none there).
    let how = nicd::ondemand::OnDemand::from_env()?;
    let held = nicd::ondemand::ensure(&socket, &[cli.ip], nicd::Fabric::Roce, &how)
        .map_err(|e| e.to_string())?;
    if let Some(s) = &held.started {
        eprintln!("saquery: {s}");
    }
    let (p, guid) = nicd::connect_at(&socket, cli.ip, None)?;
    drop(held);
    eprintln!(
        "{}",
        which.line("saquery", &cli.ip.to_string(), Some(p.daemon_pid()))
    );
    let provider: std::sync::Arc<dyn verbs::Provider> = p;
    // Its SM's address as the port's SMA (the daemon's) keeps it.
    let ca = provider
        .open_ca(guid, 0, std::sync::Arc::new(verbs::IgnoreEvents))
        .map_err(|e| format!("{}: {e}", cli.ip))?;
    let sm_gid = provider
        .query_port(ca, rdma_types::PortNum(1))
        .map(|a| a.sm_gid)
        .unwrap_or(None);
    let _ = provider.close_ca(ca);
    // QP1 only: the port's QP0 is its SMA's.
    let agent = CmAgent::start_without_qp0(provider, guid, first_comm_id)
        .map_err(|e| format!("the NIC daemon's port at {}: {e}", cli.ip))?;
    let sa = match cli.sa {
        Some(ip) => Gid::from_ip(ip),
        None => sm_gid.ok_or_else(|| {
            format!(
                "the NIC daemon's port at {} knows no SM (not managed yet, or on the roce \
                 fabric): give --sa ADDRESS",
                cli.ip
            )
        })?,
    };
    Ok((agent, sa))
}

fn run(cli: Cli) -> Result<(), String> {
    let (agent, sa_gid) = port(&cli)?;
    let timing = SaTiming {
        timeout: cli.timeout_ms.max(std::time::Duration::from_millis(1)),
        ..SaTiming::default()
    };
    let sa = SaClient::new(&agent, sa_gid, timing).map_err(|e| format!("SA client: {e}"))?;
    let sa_name = sa_gid.to_ip();
    let q = |e: rdma_access::sa::SaError| format!("SA at {sa_name}: {e}");
    match cli.cmd {
        Cmd::Nodes { lid } => {
            let recs = sa.node_records(lid).map_err(q)?;
            println!(
                "{:<6} {:<18} {:<18} {:<5} description",
                "lid", "node guid", "port guid", "type"
            );
            for r in &recs {
                println!(
                    "{:<6} {:016x}   {:016x}   {:<5} {}",
                    r.lid,
                    r.info.node_guid.0,
                    r.info.port_guid.0,
                    match r.info.node_type {
                        1 => "CA",
                        2 => "SW",
                        3 => "RTR",
                        _ => "?",
                    },
                    r.description
                );
            }
            println!("{} node records", recs.len());
        }
        Cmd::Ports { lid, dm } => {
            let mask = dm.then_some(rdma_mad::smp::cap::IS_DEVICE_MGMT_SUPPORTED);
            let recs = sa.port_info_records(lid, mask).map_err(q)?;
            println!(
                "{:<6} {:<4} {:<7} {:<6} {:<5} capabilities",
                "lid", "port", "state", "sm lid", "mtu"
            );
            for r in &recs {
                let Ok(p) = PortInfo::new_checked(&r.port_info[..]) else {
                    continue;
                };
                println!(
                    "{:<6} {:<4} {:<7} {:<6} {:<5} {}",
                    r.lid,
                    r.port,
                    rdma_access::sma::state::name(p.port_state()).unwrap_or("?"),
                    p.sm_lid(),
                    rdma_types::Mtu::from_code(p.mtu_active()).map_or(0, |m| m.bytes()),
                    cap_names(p.capability_mask()).join(",")
                );
            }
            println!("{} port records", recs.len());
        }
        Cmd::Paths {
            sgid,
            dgid,
            max,
            pkey,
        } => {
            let pq = PathQuery {
                sgid: gid(&sgid)?,
                dgid: gid(&dgid)?,
                max_paths: max,
                pkey: pkey
                    .map(|p| hex(&p, "P_Key").map(|v| Pkey(v as u16)))
                    .transpose()?,
                service_id: None,
            };
            let recs = sa.path_records(&pq).map_err(q)?;
            for r in &recs {
                println!(
                    "slid {} dlid {} sgid {} dgid {} pkey {:#06x} sl {} mtu {} rate {} packet life {} preference {}",
                    r.slid,
                    r.dlid,
                    fmt_gid(r.sgid),
                    fmt_gid(r.dgid),
                    r.pkey.0,
                    r.sl,
                    rdma_types::Mtu::from_code(r.mtu).map_or(0, |m| m.bytes()),
                    r.rate,
                    r.packet_life,
                    r.preference
                );
            }
            println!("{} path records", recs.len());
        }
        Cmd::Services { id, name } => {
            let id = id.map(|s| hex(&s, "service ID")).transpose()?;
            let recs = sa.service_records(id, name.as_deref()).map_err(q)?;
            for r in &recs {
                let end = r.service_name.iter().position(|b| *b == 0).unwrap_or(64);
                println!(
                    "id {:016x} gid {} pkey {:#06x} lease {} name \"{}\"",
                    r.service_id,
                    fmt_gid(r.service_gid),
                    r.service_pkey.0,
                    if r.service_lease == u32::MAX {
                        "indefinite".to_string()
                    } else {
                        format!("{} s", r.service_lease)
                    },
                    String::from_utf8_lossy(&r.service_name[..end])
                );
            }
            println!("{} service records", recs.len());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "8") {
        return code;
    }
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("saquery: {e}");
            ExitCode::FAILURE
        }
    }
}
