//! The target is killed (SIGKILL) and restarted under verified I/O: the
//! initiator's remote port blocks, logs in again to the restarted `srptd`
//! and sends the held commands again. No acknowledged write is lost (the
//! LUN is fileio, so what was written survives the process), no data is
//! misplaced, and the workload never sees an error.

mod common;

use common::Proc;
use rdma_types::Guid;
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::RportConfig;
use srp_initiator::session::{Session, SessionConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn srptd(cfg: &std::path::Path) -> Proc {
    let p = Proc::start(
        "srptd",
        common::tool(common::srptd_bin()).arg("--config").arg(cfg),
    );
    p.wait_line("listening on", 20);
    p
}

#[test]
fn target_killed_and_restarted_under_verified_io() {
    let dir = std::env::temp_dir().join(format!("srp-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.0.87.1\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"d0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"32M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            dir.join("ctl.sock").display(),
            dir.join("d0.img").display()
        ),
    )
    .unwrap();
    let mut target = srptd(&cfg);

    let guid = Guid(srpstack::INITIATOR_GUID);
    let ip: std::net::IpAddr = "127.0.87.2".parse().unwrap();
    let provider = rnic::softroce::SoftRoce::new(vec![rnic::softroce::SoftCa { guid, ip }], 4791);
    let agent = rdma_access::CmAgent::start(provider.clone(), guid, 0x7900).unwrap();
    let connector = Arc::new(srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: ip,
        dst: "127.0.87.1:5555".parse().unwrap(),
        timeout: Duration::from_secs(2),
    });
    let chan = srp::initiator::ChannelConfig::new(
        1,
        guid,
        rnic::softroce::ip_guid("127.0.87.1".parse().unwrap()).0,
        rnic::softroce::ip_guid("127.0.87.1".parse().unwrap()),
    );
    let logins = Arc::new(AtomicU64::new(0));
    let open = {
        let logins = logins.clone();
        Box::new(move || {
            logins.fetch_add(1, Ordering::SeqCst);
            let mut sc = SessionConfig::new(chan.clone());
            // A dead target is noticed in seconds, not the default 30.
            sc.channel.cmd_timeout = rdma_types::Duration::from_secs(5);
            let s = Session::connect(provider.clone(), guid, connector.clone(), sc)
                .map_err(std::io::Error::other)?;
            srp_initiator::disk::Disk::open(Arc::new(s), 0)
        })
    };
    let rport = RportConfig {
        reconnect_delay: Some(rdma_types::Duration::from_millis(200)),
        fast_io_fail_tmo: Some(rdma_types::Duration::from_secs(25)),
        dev_loss_tmo: Some(rdma_types::Duration::from_secs(40)),
    };
    let disk = Arc::new(RemoteDisk::open(open, rport).expect("first login"));

    let moved = Arc::new(AtomicU64::new(0));
    let run = {
        let (disk, moved) = (disk.clone(), moved.clone());
        std::thread::spawn(move || {
            let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
            w.jobs = 4;
            w.verify = true;
            w.region = Some(8 << 20);
            w.size = Some(48 << 20);
            w.runtime = Duration::from_secs(90);
            let dev: Arc<dyn blockload::BlockDevice> = disk;
            blockload::run(dev, &w, |p| moved.store(p.bytes, Ordering::SeqCst)).unwrap()
        })
    };
    // Kill the target a third of the way through, restart it at once.
    let end = Instant::now() + Duration::from_secs(60);
    while moved.load(Ordering::SeqCst) < 16 << 20 {
        assert!(
            Instant::now() < end && !run.is_finished(),
            "the workload did not get going"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    target.child.kill().unwrap();
    target.child.wait().unwrap();
    let killed_at = Instant::now();
    target = srptd(&cfg);
    let r = run.join().unwrap();
    let st = disk.stats();
    println!(
        "restart after {:?}; longest outage {:?}; {st:?}; {} logins",
        killed_at.elapsed(),
        st.longest_outage,
        logins.load(Ordering::SeqCst)
    );
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes > 4 << 20, "{}", r.table());
    assert!(st.failures >= 1 && st.reconnects >= 1, "{st:?}");
    assert_eq!(st.state, srp_initiator::rport::RportState::Running);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
