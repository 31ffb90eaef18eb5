//! `ibsm`: the subnet manager's command line. `ibsm check FILE` validates a
//! partitions file; `ibsm simulate` runs the SM over a simulated fabric
//! (`ib_sm::sim`) and prints what a sweep did: ports brought up with their
//! LIDs, each host's P_Key table, and the PathRecords one host gets from
//! the SA. Running the SM on a real port needs QP0, which the soft RoCE
//! NIC does not have yet.

use clap::{Parser, Subcommand};
use ib_sm::sim::{all_active, fabric, host, run_query, sm, table};
use ib_sm::SmEvent;
use rdma_mad::sa::{PathRecord, SaAttr};
use rdma_types::Duration;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ibsm",
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
    },
}

fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
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
            let mut sim = fabric(seed, loss, text.as_deref(), hosts).map_err(|e| e.to_string())?;
            let r = sim.run_until(Duration::from_secs(120), |s| all_active(s, hosts));
            for e in std::mem::take(&mut sm(&mut sim).events) {
                match e {
                    SmEvent::PortUp { guid, lid } => {
                        println!("port {:#018x} ACTIVE, LID {lid}", guid.0)
                    }
                    SmEvent::PortDown { guid } => println!("port {:#018x} gone", guid.0),
                }
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
                    "  SLID {:>3} -> DLID {:>3}  DGID {}  P_Key {:#06x}  MTU code {}",
                    p.slid, p.dlid, p.dgid, p.pkey.0, p.mtu
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
    match run(Cli::parse().cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibsm: {e}");
            ExitCode::FAILURE
        }
    }
}
