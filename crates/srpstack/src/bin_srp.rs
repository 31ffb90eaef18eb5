//! `srp`: the SRP initiator's command line. `srp io` logs in to a target by
//! RDMA CM over the soft RoCE NIC and reads/writes/verifies LUN 0.

use blockload::{Pattern, Workload};
use clap::{Parser, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "srp", about = "SRP initiator")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Log in, run I/O on LUN 0 (verified by default), log out.
    Io {
        /// Target address and RDMA CM port (ib_srp's dest=).
        #[arg(long)]
        dest: SocketAddr,
        /// Address of this host's NIC.
        #[arg(long, default_value = "127.0.0.2")]
        ip: IpAddr,
        /// RoCEv2 UDP port.
        #[arg(long, default_value_t = 4791)]
        udp_port: u16,
        /// read, write, randread, randwrite, randrw.
        #[arg(long, default_value = "randrw")]
        rw: Pattern,
        /// Bytes per I/O.
        #[arg(long, default_value_t = 4096)]
        bs: u32,
        /// I/Os in flight.
        #[arg(long, default_value_t = 4)]
        iodepth: u32,
        /// Bytes of the LUN to use (from block 0).
        #[arg(long, default_value_t = 8 << 20)]
        region: u64,
        /// Bytes to move.
        #[arg(long, default_value_t = 32 << 20)]
        size: u64,
        /// Do not stamp and check data.
        #[arg(long)]
        no_verify: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Target port identifier extension (hex; ib_srp's id_ext).
        #[arg(long, value_parser = hex64, default_value = "0002c90300a00001")]
        id_ext: u64,
        /// Target I/O controller GUID (hex; ib_srp's ioc_guid).
        #[arg(long, value_parser = hex64, default_value = "0002c90300a00001")]
        ioc_guid: u64,
        /// This initiator's identifier extension (hex; initiator_ext).
        #[arg(long, value_parser = hex64, default_value = "1")]
        initiator_ext: u64,
        /// Active MTU of this NIC (1024 on a 1500-byte Ethernet link).
        #[arg(long, default_value_t = 4096)]
        mtu: usize,
    },
}

fn hex64(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| format!("`{s}` is not a 64-bit hex number"))
}

fn main() -> ExitCode {
    let Cmd::Io {
        dest,
        ip,
        udp_port,
        rw,
        bs,
        iodepth,
        region,
        size,
        no_verify,
        json,
        id_ext,
        ioc_guid,
        initiator_ext,
        mtu,
    } = Cli::parse().cmd;
    let run = || -> Result<bool, String> {
        use rdma_types::Guid;
        let guid = Guid(srpstack::INITIATOR_GUID);
        let mtu = rdma_types::Mtu::from_bytes(mtu)
            .map_err(|_| format!("MTU {mtu} is not 256, 512, 1024, 2048 or 4096"))?;
        let provider = rnic::softroce::SoftRoce::with_mtu(
            vec![rnic::softroce::SoftCa { guid, ip }],
            udp_port,
            mtu,
        );
        let agent = rdma_access::CmAgent::start(provider.clone(), guid, std::process::id() << 8)
            .map_err(|e| format!("start the CM agent on {ip}: {e}"))?;
        let connector = Arc::new(srpstack::RdmaCmConnector {
            agent,
            src: ip,
            dst: dest,
            timeout: Duration::from_secs(10),
        });
        let chan = srp::initiator::ChannelConfig::new(initiator_ext, guid, id_ext, Guid(ioc_guid));
        let session = Arc::new(
            srp_initiator::session::Session::connect(
                provider,
                guid,
                connector,
                srp_initiator::session::SessionConfig::new(chan),
            )
            .map_err(|e| format!("login to {dest}: {e}"))?,
        );
        let disk = Arc::new(
            srp_initiator::disk::Disk::open(session.clone(), 0)
                .map_err(|e| format!("open LUN 0: {e}"))?,
        );
        let info = disk.info().clone();
        if !json {
            println!(
                "srp: logged in to {dest}; LUN 0 {} {}, {} blocks of {} B",
                info.vendor, info.product, info.blocks, info.block_size
            );
        }
        let mut w = Workload::new(rw);
        w.bs = bs;
        w.jobs = iodepth;
        w.region = Some(region);
        w.size = Some(size);
        w.verify = !no_verify;
        w.runtime = Duration::from_secs(300);
        let dev: Arc<dyn blockload::BlockDevice> = disk.clone();
        let r = blockload::run(dev, &w, |_| {}).map_err(|e| e.to_string())?;
        disk.flush()
            .map_err(|e| format!("SYNCHRONIZE CACHE: {e}"))?;
        if json {
            println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
        } else {
            print!("{}", r.table());
        }
        Ok(r.ok())
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("srp: {e}");
            ExitCode::FAILURE
        }
    }
}
