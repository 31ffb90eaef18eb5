//! `srptd`: an SRP target on a soft RoCE NIC, serving logins by RDMA CM
//! (what LIO/SCST ib_srpt with `rdma_cm_port` do).

use clap::Parser;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "srptd", about = "SRP target over the soft RoCE NIC")]
struct Args {
    /// Address of the target's NIC.
    #[arg(long, default_value = "127.0.0.1")]
    ip: IpAddr,
    /// RoCEv2 UDP port.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// RDMA CM port logins arrive on (ib_srpt's rdma_cm_port).
    #[arg(long, default_value_t = 5555)]
    rdma_cm_port: u16,
    /// LUN 0: a RAM disk of this many MiB.
    #[arg(long, default_value_t = 64)]
    ram_mib: u64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("srptd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    use rdma_types::Guid;
    if a.ram_mib == 0 {
        return Err("--ram-mib must be at least 1".into());
    }
    let guid = Guid(srpstack::TARGET_GUID);
    let provider =
        rnic::softroce::SoftRoce::new(vec![rnic::softroce::SoftCa { guid, ip: a.ip }], a.udp_port);
    let scsi = Arc::new(scsi::Target::new());
    let dev = scsi::Device::new(
        scsi::DeviceConfig::default(),
        Arc::new(scsi::Ram::new(a.ram_mib << 20)),
    )
    .map_err(|e| format!("LUN 0: {e}"))?;
    scsi.add_lun(None, scsi::Lun::new(0).expect("LUN 0"), Arc::new(dev));
    // Target port ID = id_ext then ioc_guid, both the CA GUID (ib_srpt).
    let chan = srp::initiator::ChannelConfig::new(0, guid, guid.0, guid);
    let tcfg = srp::target::TargetConfig::new(chan.target_port_id(), "srptd");
    let port = Arc::new(
        srp_target::TargetPort::start(
            provider.clone(),
            guid,
            tcfg,
            scsi,
            srp_target::PortOptions::default(),
        )
        .map_err(|e| format!("start the target port: {e}"))?,
    );
    let agent = rdma_access::CmAgent::start(provider, guid, std::process::id() << 8)
        .map_err(|e| format!("start the CM agent on {}: {e}", a.ip))?;
    let t = srpstack::serve_rdma_cm(agent, port.clone(), a.rdma_cm_port, |line| {
        println!("srptd: {line}");
    });
    // Scripts wait for this line.
    println!(
        "srptd: target {} listening on {}:{} (RDMA CM), LUN 0 ram {} MiB, id_ext {:016x} ioc_guid {:016x}",
        port.name(),
        a.ip,
        a.rdma_cm_port,
        a.ram_mib,
        guid.0,
        guid.0
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let _ = t.join();
    Ok(())
}
