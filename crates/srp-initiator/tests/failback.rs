//! Failover and failback over a flapping link, in process (issue 33).
//!
//! Two target ports on their own soft RoCE CAs (loopback addresses) over
//! one store, the way two `srptd` share one image; a failover multipath
//! device over a reconnecting remote port to each. Path A's link goes
//! down for 900 ms every 3 s, both ways and with no port event (the
//! netns test's far-end cut with link following off): path A is found
//! dead by the transport's retries, its I/O moves to path B, and once
//! the link is back path A logs in again and carries the I/O again.
//!
//! The netns test once read, right after the failback, a generation older
//! than the last write acknowledged to that block. Here every writer reads
//! its blocks back between writes, across several failovers and
//! failbacks, and every read must return the last generation acknowledged.

mod common;

use common::{connect, fabric, remote_path, target_port, wait_for, Gate, Held, Hold};
use rdma_types::Guid;
use rnic::softroce::{FaultConfig, SoftCa, SoftRoce};
use srp::initiator::ChannelConfig;
use srp::target::TargetConfig;
use srp_initiator::disk::Disk;
use srp_initiator::multipath::{Multipath, PathDevice, Policy};
use srp_initiator::session::SessionConfig;
use srp_target::{PortOptions, TargetPort};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const TARGET_A: u64 = 0x0002_c903_0000_4a01;
const INIT_A: u64 = 0x0002_c903_0000_4a02;
const TARGET_B: u64 = 0x0002_c903_0000_4b01;
const INIT_B: u64 = 0x0002_c903_0000_4b02;

/// Blocks of 4 KiB (written with immediate data, as `srp io` writes) per
/// writer.
const BLOCKS: u64 = 16;
const WRITERS: u64 = 4;

/// Block `k`'s bytes for generation `gen`: every 16 bytes say the LBA and
/// the generation.
fn stamp(lba: u64, gen: u64) -> Vec<u8> {
    let mut data = vec![0u8; 4096];
    for c in data.chunks_mut(16) {
        c[..8].copy_from_slice(&lba.to_le_bytes());
        c[8..].copy_from_slice(&gen.to_le_bytes());
    }
    data
}

/// The (LBA, generation) pairs in `data` that differ from `want`'s.
fn mismatch(data: &[u8], lba: u64, gen: u64) -> Option<String> {
    let bad: Vec<(u64, u64)> = data
        .chunks(16)
        .map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().unwrap()),
                u64::from_le_bytes(c[8..].try_into().unwrap()),
            )
        })
        .filter(|&p| p != (lba, gen))
        .collect();
    (!bad.is_empty()).then(|| format!("{} stamps wrong, first {:?}", bad.len(), bad[0]))
}

#[test]
fn reads_after_failover_and_failback_return_the_last_acknowledged_write() {
    let ip = |h: u8| std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 133, h));
    let soft = SoftRoce::new(
        vec![
            SoftCa {
                guid: Guid(TARGET_A),
                ip: ip(1),
            },
            SoftCa {
                guid: Guid(INIT_A),
                ip: ip(2),
            },
            SoftCa {
                guid: Guid(TARGET_B),
                ip: ip(3),
            },
            SoftCa {
                guid: Guid(INIT_B),
                ip: ip(4),
            },
        ],
        40_000 + (std::process::id() % 20_000) as u16,
    );
    // Both ends of path A drop everything they send while the link is
    // down (the outage is timed from each end's first datagram: the two
    // windows overlap but for a login's worth of milliseconds).
    let flap = FaultConfig::parse("seed=33,link_down_at_ms=1500,link_flap_ms=900/3000").unwrap();
    soft.set_faults(Guid(INIT_A), Some(flap.clone())).unwrap();
    soft.set_faults(Guid(TARGET_A), Some(flap)).unwrap();
    let provider: Arc<dyn verbs::Provider> = soft.clone();

    // One store, one LU (one NAA) behind two target ports.
    let store: Arc<dyn scsi::Backend> = Arc::new(scsi::Ram::new(4 << 20));
    let port = |guid: u64| {
        let scsi = Arc::new(scsi::Target::new());
        let dev = scsi::Device::new(scsi::DeviceConfig::default(), store.clone()).unwrap();
        scsi.add_lun(None, scsi::Lun::new(0).unwrap(), Arc::new(dev));
        let id = ChannelConfig::new(1, Guid(INIT_A), guid, Guid(guid)).target_port_id();
        Arc::new(
            TargetPort::start(
                provider.clone(),
                Guid(guid),
                TargetConfig::new(id, format!("{guid:x}")),
                scsi,
                PortOptions::default(),
            )
            .unwrap(),
        )
    };
    let path = |initiator: u64, target: u64| {
        let ids = (initiator, target);
        remote_path(
            provider.clone(),
            port(target),
            ids,
            rdma_types::Lid(0),
            None,
        )
    };
    let (a, b) = (path(INIT_A, TARGET_A), path(INIT_B, TARGET_B));
    let m = Arc::new(
        Multipath::new(
            vec![
                ("A".into(), a.clone() as Arc<dyn PathDevice>),
                ("B".into(), b.clone() as Arc<dyn PathDevice>),
            ],
            Policy::Failover,
            std::time::Duration::from_secs(30),
        )
        .unwrap(),
    );

    // Each writer owns BLOCKS blocks; it writes a new generation to one
    // or reads one back and checks it, at random.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (m, stop, reads, wrong) = (m.clone(), stop.clone(), reads.clone(), wrong.clone());
            std::thread::spawn(move || {
                let mut gens = [0u64; BLOCKS as usize];
                let mut x = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                while !stop.load(Ordering::SeqCst) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % BLOCKS) as usize;
                    let lba = (w * BLOCKS + k as u64) * 8;
                    if x & 0x100 == 0 {
                        let gen = gens[k] + 1;
                        blockload::BlockDevice::write_at(m.as_ref(), lba, &stamp(lba, gen))
                            .expect("no write error reaches the caller");
                        gens[k] = gen;
                    } else if gens[k] > 0 {
                        let mut data = vec![0u8; 4096];
                        blockload::BlockDevice::read_at(m.as_ref(), lba, &mut data)
                            .expect("no read error reaches the caller");
                        reads.fetch_add(1, Ordering::SeqCst);
                        if let Some(what) = mismatch(&data, lba, gens[k]) {
                            wrong.lock().unwrap().push(format!(
                                "LBA {lba}: last acknowledged generation {}, read {what}",
                                gens[k]
                            ));
                        }
                    }
                }
            })
        })
        .collect();

    // Two failovers and two failbacks (the first outage starts 1.5 s in,
    // one every 3 s), bounded; path B carried I/O meanwhile.
    wait_for("path A failing and coming back twice", 30, || {
        let s = a.stats();
        s.failures >= 2 && s.reconnects >= 2 && a.is_up()
    });
    let after = reads.load(Ordering::SeqCst);
    wait_for("reads over path A after its failback", 10, || {
        reads.load(Ordering::SeqCst) >= after + 200
    });
    stop.store(true, Ordering::SeqCst);
    for t in writers {
        t.join().unwrap();
    }
    let s = m.path_stats();
    assert!(s[1].ios > 0, "path B carried nothing: {s:?}");
    assert!(s[0].failures > 0, "nothing failed over from A: {s:?}");
    assert!(!m.failovers().is_empty());
    let wrong = wrong.lock().unwrap();
    assert!(
        wrong.is_empty(),
        "{} of {} reads wrong: {:#?}",
        wrong.len(),
        reads.load(Ordering::SeqCst),
        &wrong[..wrong.len().min(8)]
    );
}

/// The target side of the same hazard: a command the target had taken in
/// (its data with it: immediate data) but not yet started when its
/// channel went away must never reach the store, or it could land after
/// the initiator has written the block again over another path. The
/// port's one worker is held inside a first WRITE; a second WRITE waits
/// behind it; the channel is torn down; then the store is let go.
#[test]
fn a_write_the_target_had_queued_when_its_channel_went_is_never_run() {
    let fabric = fabric(&[TARGET_A, INIT_A]);
    let provider: Arc<dyn verbs::Provider> = fabric.clone();
    let gate = Arc::new(Gate::default());
    let held = Arc::new(Held::new(1 << 20, gate.clone(), Hold::Writes));
    let dev = scsi::Device::new(scsi::DeviceConfig::default(), held.clone()).unwrap();
    let id = ChannelConfig::new(1, Guid(INIT_A), TARGET_A, Guid(TARGET_A)).target_port_id();
    let opts = PortOptions {
        workers: 1,
        ..PortOptions::default()
    };
    let port = target_port(&provider, TARGET_A, id, "queued", vec![dev], opts);
    let chan = ChannelConfig::new(1, Guid(INIT_A), TARGET_A, Guid(TARGET_A));
    let mut cfg = SessionConfig::new(chan);
    cfg.pool_bytes = 1 << 20;
    let sess = connect(&provider, INIT_A, &port, cfg);
    let disk = Arc::new(Disk::open(sess, 0).unwrap());
    let accepted = || port.sessions().iter().map(|s| s.cmds).sum::<u64>();
    let run = || {
        port.lun_stats()
            .iter()
            .map(|l| l.counters.commands)
            .sum::<u64>()
    };

    gate.set(true);
    let before = (accepted(), run());
    let first = {
        let d = disk.clone();
        std::thread::spawn(move || d.write(0, &stamp(0, 1)))
    };
    wait_for("the first WRITE held in the only worker", 5, || {
        gate.held.load(Ordering::SeqCst) >= 1
    });
    let second = {
        let d = disk.clone();
        std::thread::spawn(move || d.write(8, &stamp(8, 1)))
    };
    wait_for("the second WRITE taken in by the target", 5, || {
        accepted() >= before.0 + 2
    });
    // The channel goes (a DREQ, a failed work request, a SINGLE login
    // replacing it: all close it the same way).
    let conn = port.sessions()[0].conn;
    port.disconnected(conn);
    gate.set(false);
    // Both WRITEs come out of the worker, run or refused.
    wait_for("both WRITEs through the worker", 5, || {
        run() >= before.1 + 2
    });
    assert_eq!(
        held.written.load(Ordering::SeqCst),
        1,
        "only the WRITE that was running when the channel went reached the store"
    );
    let mut block = vec![0u8; 4096];
    scsi::Backend::read(held.as_ref(), 8 * 512, &mut block).unwrap();
    assert_eq!(block, vec![0u8; 4096], "the queued WRITE landed");
    // The initiator's commands end with the connection, one way or another.
    let _ = first.join().unwrap();
    let _ = second.join().unwrap();
}
