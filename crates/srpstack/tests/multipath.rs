//! Path failover (issue 8 item 6): one LU exported on two target ports,
//! reached over two paths (two initiator CAs, two target CAs, soft RoCE on
//! 127.0.86.x), grouped into one round-robin multipath device. Under a
//! verified random read/write workload, first the initiator's port of path
//! A goes down (a local port event), comes back, then the target's port of
//! path B goes down (a remote failure only the transport's retries can
//! see) and comes back. The workload must see no error and no bad data;
//! the time from each cut to I/O completing on the other path is printed.
//!
//! Second, the blktests-style case: the target logs path B out again and
//! again while path A carries the I/O, then path A's RDMA device is
//! hot-unplugged and B is logged out again, so I/O queues until B is back
//! (dm-multipath's queue_if_no_path). Again no error and no bad data.

use rdma_types::{Guid, Lid};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use srp::initiator::ChannelConfig;
use srp::target::TargetConfig;
use srp::wire::TLogoutReason;
use srp_initiator::disk::Disk;
use srp_initiator::multipath::{Multipath, PathDevice, Policy};
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::RportConfig;
use srp_initiator::session::{Session, SessionConfig};
use srp_target::{PortOptions, TargetPort};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TGT_A: u64 = 0x0002_c903_00c0_0001;
const TGT_B: u64 = 0x0002_c903_00c0_0002;
const INI_A: u64 = 0x0002_c903_00d0_0001;
const INI_B: u64 = 0x0002_c903_00d0_0002;

fn ca(guid: u64, last: u8) -> SoftCa {
    SoftCa {
        guid: Guid(guid),
        ip: std::net::Ipv4Addr::new(127, 0, 86, last).into(),
    }
}

/// One LU (RAM, NAA from the default config) behind two target ports on
/// CAs `TGT_A` and `TGT_B`, with initiator CAs `INI_A`, `INI_B`; the CAs
/// on 127.0.86.(`base` + 1..=4).
fn fabric(base: u8) -> (Arc<SoftRoce>, Arc<TargetPort>, Arc<TargetPort>) {
    let p = SoftRoce::new(
        vec![
            ca(TGT_A, base + 1),
            ca(INI_A, base + 2),
            ca(TGT_B, base + 3),
            ca(INI_B, base + 4),
        ],
        ROCE_PORT,
    );
    let scsi = Arc::new(scsi::Target::new());
    let dev = scsi::Device::new(
        scsi::DeviceConfig {
            serial: "mpath0".into(),
            ..Default::default()
        },
        Arc::new(scsi::Ram::new(32 << 20)),
    )
    .unwrap();
    scsi.add_lun(None, scsi::Lun::new(0).unwrap(), Arc::new(dev));
    let port_id = ChannelConfig::new(1, Guid(INI_A), TGT_A, Guid(TGT_A)).target_port_id();
    let start = |guid: u64, name: &str| {
        Arc::new(
            TargetPort::start(
                p.clone(),
                Guid(guid),
                TargetConfig::new(port_id, name),
                scsi.clone(),
                PortOptions::default(),
            )
            .unwrap(),
        )
    };
    let (a, b) = (start(TGT_A, "mpath-a"), start(TGT_B, "mpath-b"));
    (p, a, b)
}

/// A verified 4-job random read/write of `size` bytes over the first
/// 8 MiB of `dev`, on its own thread; `moved` follows its progress.
fn workload(
    dev: Arc<dyn blockload::BlockDevice>,
    end: &Arc<AtomicBool>,
    moved: &Arc<AtomicU64>,
) -> std::thread::JoinHandle<blockload::Report> {
    let (moved, end) = (moved.clone(), end.clone());
    std::thread::spawn(move || {
        let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
        w.jobs = 4;
        w.verify = true;
        w.region = Some(8 << 20);
        // Until the test has done its cuts and ends it (then the writes
        // are read back): a byte budget would be over before a cut in a
        // fast build, or long after it in a slow one.
        w.size = Some(1 << 40);
        w.runtime = Duration::from_secs(120);
        w.end = Some(end);
        blockload::run(dev, &w, |p| moved.store(p.bytes, Ordering::SeqCst)).unwrap()
    })
}

/// Waits (bounded, the workload still running) until `done` holds.
fn wait_for(what: &str, run: &std::thread::JoinHandle<blockload::Report>, done: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < end && !run.is_finished(), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A path: initiator CA `ini` logging in to `port`, kept up by a remote
/// port that fails I/O at once (the multipath layer retries elsewhere) and
/// reconnects every 100 ms.
fn path(p: &Arc<SoftRoce>, ini: u64, port: &Arc<TargetPort>) -> Arc<RemoteDisk> {
    let (p, port) = (p.clone(), port.clone());
    let open = Box::new(move || {
        let mut sc = SessionConfig::new(ChannelConfig::new(1, Guid(ini), TGT_A, Guid(TGT_A)));
        // A login over a dead link gives up in seconds, not the default 30.
        sc.channel.cmd_timeout = rdma_types::Duration::from_secs(2);
        let direct = Arc::new(srpstack::Direct::new(port.clone(), Lid(0)));
        let s =
            Session::connect(p.clone(), Guid(ini), direct, sc).map_err(std::io::Error::other)?;
        Disk::open(Arc::new(s), 0)
    });
    let cfg = RportConfig {
        reconnect_delay: Some(rdma_types::Duration::from_millis(100)),
        fast_io_fail_tmo: Some(rdma_types::Duration::ZERO),
        dev_loss_tmo: Some(rdma_types::Duration::from_secs(120)),
    };
    Arc::new(RemoteDisk::open(open, cfg).expect("first login"))
}

/// Paths A (`INI_A` to `port_a`) and B (`INI_B` to `port_b`) and the
/// multipath device over them.
fn two_paths(
    p: &Arc<SoftRoce>,
    port_a: &Arc<TargetPort>,
    port_b: &Arc<TargetPort>,
    policy: Policy,
) -> (Arc<RemoteDisk>, Arc<RemoteDisk>, Arc<Multipath>) {
    let (a, b) = (path(p, INI_A, port_a), path(p, INI_B, port_b));
    let m = Multipath::new(
        vec![
            ("A".into(), a.clone() as Arc<dyn PathDevice>),
            ("B".into(), b.clone() as Arc<dyn PathDevice>),
        ],
        policy,
        Duration::from_secs(30),
    )
    .expect("both paths reach the same LU");
    (a, b, Arc::new(m))
}

/// Waits (bounded) until the workload has moved `bytes` more.
fn wait_moved(moved: &AtomicU64, bytes: u64, run: &std::thread::JoinHandle<blockload::Report>) {
    let goal = moved.load(Ordering::SeqCst) + bytes;
    wait_for(
        &format!("the workload moved {bytes} more bytes"),
        run,
        || moved.load(Ordering::SeqCst) >= goal,
    );
}

/// From `cut` to the first and the last failed-over I/O that failed after it.
fn failover_times(m: &Multipath, cut: Instant, until: Instant) -> (Duration, Duration, usize) {
    let f: Vec<_> = m
        .failovers()
        .into_iter()
        .filter(|f| f.failed_at >= cut && f.failed_at < until)
        .collect();
    let first = f.iter().map(|f| f.done_at - cut).min().unwrap_or_default();
    let last = f.iter().map(|f| f.done_at - cut).max().unwrap_or_default();
    (first, last, f.len())
}

#[test]
fn two_paths_round_robin_survive_a_local_and_a_remote_cut_without_errors() {
    let (p, port_a, port_b) = fabric(0);
    let (a, b, m) = two_paths(&p, &port_a, &port_b, Policy::RoundRobin);

    let (moved, end) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let run = workload(m.clone(), &end, &moved);

    // Cut 1: the initiator's port of path A goes down.
    wait_moved(&moved, 6 << 20, &run);
    let cut1 = Instant::now();
    p.set_port_active(Guid(INI_A), false).unwrap();
    wait_for("path A fails I/O", &run, || a.stats().failures >= 1);
    wait_moved(&moved, 2 << 20, &run);
    p.set_port_active(Guid(INI_A), true).unwrap();
    let back1 = Instant::now();
    assert!(a.wait_running(Duration::from_secs(20)), "path A came back");
    let a_before = m.path_stats()[0].ios;
    // Read now: the log keeps the latest failovers, and cut 2's may push
    // these out.
    let (l_first, l_last, l_n) = failover_times(&m, cut1, back1);
    wait_for(
        "round robin uses path A again once it is back",
        &run,
        || m.path_stats()[0].ios > a_before,
    );

    // Cut 2: the target's port of path B goes down; the initiator's port
    // stays up, so only the transport's retries find out.
    wait_moved(&moved, 2 << 20, &run);
    let cut2 = Instant::now();
    p.set_port_active(Guid(TGT_B), false).unwrap();
    wait_for("path B fails I/O", &run, || b.stats().failures >= 1);
    wait_moved(&moved, 2 << 20, &run);
    p.set_port_active(Guid(TGT_B), true).unwrap();
    let back2 = Instant::now();
    assert!(b.wait_running(Duration::from_secs(20)), "path B came back");
    let b_before = m.path_stats()[1].ios;
    wait_for(
        "round robin uses path B again once it is back",
        &run,
        || m.path_stats()[1].ios > b_before,
    );
    wait_moved(&moved, 2 << 20, &run);
    end.store(true, Ordering::SeqCst);

    let r = run.join().unwrap();
    let stats = m.path_stats();
    let (r_first, r_last, r_n) = failover_times(&m, cut2, back2);
    println!("{}", r.table());
    println!("paths: {stats:?}");
    println!(
        "local port down: {l_n} I/Os failed over, first done {l_first:?} after the cut, last {l_last:?}"
    );
    println!(
        "remote port down: {r_n} I/Os failed over, first done {r_first:?} after the cut, last {r_last:?}"
    );
    println!("path A {:?}\npath B {:?}", a.stats(), b.stats());
    assert!(r.ok(), "{}", r.table());
    assert_eq!(r.stopped, blockload::Stopped::Ended, "{}", r.table());
    assert!(r.verified_bytes >= 8 << 20, "{}", r.table());
    assert!(l_n >= 1 && r_n >= 1, "both cuts caught I/O in flight");
    assert!(stats.iter().all(|s| s.up && s.ios > 0), "{stats:?}");
    assert!(a.stats().failures >= 1 && b.stats().failures >= 1);
    assert!(a.stats().reconnects >= 1 && b.stats().reconnects >= 1);
    // Bounds against a hang, not speed goals (those are printed above).
    assert!(l_last < Duration::from_secs(10) && r_last < Duration::from_secs(10));
}

#[test]
fn repeated_logouts_and_a_hot_unplugged_device_under_multipath_io() {
    let (p, port_a, port_b) = fabric(10);
    let (a, b, m) = two_paths(&p, &port_a, &port_b, Policy::Failover);
    let (moved, end) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let run = workload(m.clone(), &end, &moved);
    let logout_b = |after: u64| {
        wait_moved(&moved, after, &run);
        let before = b.stats().reconnects;
        // SCST's enabled 0 then 1: every session logged out, logins
        // accepted again.
        port_b.logout_all(TLogoutReason::NoReason);
        port_b.set_enabled(true);
        let end = Instant::now() + Duration::from_secs(30);
        while b.stats().reconnects == before {
            assert!(
                Instant::now() < end,
                "path B did not log in again: {:?}; target sessions {:?}",
                b.stats(),
                port_b.sessions()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    // Failover policy: A carries the I/O; B is logged out and in 3 times.
    for _ in 1..=3 {
        logout_b(1 << 20);
    }
    // Path A's device goes away for good; B now carries everything.
    wait_moved(&moved, 2 << 20, &run);
    let b_before = m.path_stats()[1].ios;
    p.remove_ca(Guid(INI_A)).unwrap();
    wait_for("path B took over", &run, || {
        m.path_stats()[1].ios > b_before
    });
    // With A gone, each logout of B leaves no path: I/O waits for B.
    for _ in 0..3 {
        logout_b(2 << 20);
    }
    wait_moved(&moved, 2 << 20, &run);
    end.store(true, Ordering::SeqCst);
    let r = run.join().unwrap();
    let stats = m.path_stats();
    println!(
        "{}
paths: {stats:?}
A {:?}
B {:?}",
        r.table(),
        a.stats(),
        b.stats()
    );
    assert!(r.ok(), "{}", r.table());
    assert_eq!(r.stopped, blockload::Stopped::Ended, "{}", r.table());
    assert!(r.verified_bytes >= 8 << 20, "{}", r.table());
    assert!(!stats[0].up && stats[1].up, "{stats:?}");
    assert!(b.stats().reconnects >= 6, "{:?}", b.stats());
    assert!(a.stats().failures >= 1 && a.stats().reconnects == 0);
}
