//! The tuning keys of a login string take effect, as in Linux ib_srp:
//! `tl_retry_count` is the QP's retry count, `max_sect` splits longer
//! transfers, `sg_tablesize` bounds the descriptors of one command,
//! `max_cmd_per_lun` and `target_can_queue` bound the commands in flight
//! per LUN and per target. Against the real target port, on the loopback
//! provider (and soft RoCE on 127.0.178.x for the QP's retry count).

mod common;

use common::{connect, ram, soft_pair, target_port, Gate, Held, Hold};
use rdma_types::Guid;
use srp_initiator::disk::Disk;
use srp_initiator::login::LoginOptions;
use srp_initiator::session::{Session, SessionConfig, SessionError, Xfer};
use srp_target::{PortOptions, TargetPort};
use std::sync::Arc;

const TARGET_GUID: u64 = 0x0002_c903_0000_4111;
const INIT_GUID: u64 = 0x0002_c903_0000_4222;

struct Setup {
    fabric: Arc<dyn verbs::Provider>,
    port: Arc<TargetPort>,
}

/// A target port with `luns` RAM LUNs of 16 MiB on `fabric`.
fn setup_on(fabric: Arc<dyn verbs::Provider>, luns: u16) -> Setup {
    setup_with(fabric, (0..luns).map(|_| ram(16 << 20)).collect())
}

fn setup_with(fabric: Arc<dyn verbs::Provider>, luns: Vec<scsi::Device>) -> Setup {
    let chan = login("").channel_config(Guid(INIT_GUID));
    let port = target_port(
        &fabric,
        TARGET_GUID,
        chan.target_port_id(),
        "keys",
        luns,
        PortOptions::default(),
    );
    Setup { fabric, port }
}

fn setup(luns: u16) -> Setup {
    setup_on(common::fabric(&[TARGET_GUID, INIT_GUID]), luns)
}

/// [`setup`] with LUNs whose WRITEs wait at `gate` while it is closed.
fn setup_held(luns: u16, gate: &Arc<Gate>) -> Setup {
    let held = (0..luns)
        .map(|_| {
            let store = Held::new(16 << 20, gate.clone(), Hold::Writes);
            scsi::Device::new(scsi::DeviceConfig::default(), Arc::new(store)).unwrap()
        })
        .collect();
    setup_with(common::fabric(&[TARGET_GUID, INIT_GUID]), held)
}

/// A login string to this test's target with `extra` keys.
fn login(extra: &str) -> LoginOptions {
    let mut s =
        format!("id_ext={TARGET_GUID:016x},ioc_guid={TARGET_GUID:016x},dest=127.0.178.1:5000");
    if !extra.is_empty() {
        s.push(',');
        s.push_str(extra);
    }
    LoginOptions::parse(&s).unwrap()
}

fn session(s: &Setup, cfg: SessionConfig) -> Arc<Session> {
    connect(&s.fabric, INIT_GUID, &s.port, cfg)
}

/// LUN `lun` opened as srpd opens it: the login's limits applied.
fn disk(s: &Setup, o: &LoginOptions, lun: u16) -> Disk {
    let sess = session(s, o.session_config(Guid(INIT_GUID)));
    o.apply_to_disk(Disk::open(sess, lun).unwrap(), o.lun_queue(), None)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn tl_retry_count_is_the_qps_retry_count() {
    let p = soft_pair(TARGET_GUID, INIT_GUID, 178, rnic::softroce::ROCE_PORT + 178);
    let s = setup_on(p, 1);
    for (extra, want) in [("tl_retry_count=3", 3), ("", 7), ("tl_retry_count=2", 2)] {
        let sess = session(&s, login(extra).session_config(Guid(INIT_GUID)));
        let attr = sess.query_qp().unwrap();
        assert_eq!(attr.retry_cnt, Some(want), "login with `{extra}`");
        // The session works with it.
        let d = Disk::open(sess.clone(), 0).unwrap();
        d.write(0, &pattern(4096, want)).unwrap();
        let mut back = vec![0u8; 4096];
        d.read(0, &mut back).unwrap();
        assert_eq!(back, pattern(4096, want));
    }
}

#[test]
fn max_sect_splits_a_longer_transfer_into_commands() {
    let s = setup(1);
    // 16 sectors: 8 KiB per command.
    let o = login("max_sect=16");
    let d = disk(&s, &o, 0);
    assert_eq!(d.max_transfer(), 8192);
    let before = d.session().stats().completed;
    let data = pattern(64 << 10, 1);
    d.write(100, &data).unwrap();
    assert_eq!(
        d.session().stats().completed - before,
        8,
        "64 KiB in 8 KiB commands"
    );
    let mut back = vec![0u8; 64 << 10];
    let before = d.session().stats().completed;
    d.read(100, &mut back).unwrap();
    assert_eq!(d.session().stats().completed - before, 8);
    assert_eq!(back, data);
    // The default, 1024 sectors: 64 KiB is one command.
    let d = disk(&s, &login(""), 0);
    assert_eq!(d.max_transfer(), 512 << 10);
    let before = d.session().stats().completed;
    d.read(100, &mut back).unwrap();
    assert_eq!(d.session().stats().completed - before, 1);
    assert_eq!(back, data);
}

#[test]
fn sg_tablesize_bounds_the_descriptors_of_one_command() {
    let s = setup(1);
    // Buffers in 4 KiB segments, external tables allowed, at most 4
    // descriptors per command: 16 KiB per command.
    let o = login("allow_ext_sg=1,cmd_sg_entries=2,sg_tablesize=4");
    let mut cfg = o.session_config(Guid(INIT_GUID));
    cfg.max_segment = 4096;
    let sess = session(&s, cfg);
    let too_many = sess.start(
        srp::wire::Lun::from_u64(0),
        &[0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0],
        &Xfer::Out(&[0u8; 20 << 10]),
        srp::wire::TaskAttr::Simple,
    );
    match too_many {
        Err(e @ SessionError::TooManySegments { .. }) => {
            assert!(
                e.to_string()
                    .contains("needs 5 data descriptors; at most 4"),
                "{e}"
            )
        }
        other => panic!("20 KiB in 4 KiB segments with sg_tablesize=4: {other:?}"),
    }
    let d = o.apply_to_disk(Disk::open(sess, 0).unwrap(), o.lun_queue(), None);
    assert_eq!(d.max_transfer(), 16 << 10);
    let data = pattern(64 << 10, 2);
    let before = d.session().stats().completed;
    d.write(8, &data).unwrap();
    assert_eq!(d.session().stats().completed - before, 4);
    let mut back = vec![0u8; 64 << 10];
    d.read(8, &mut back).unwrap();
    assert_eq!(back, data);

    // Without external tables no more than cmd_sg_entries fit.
    let o = login("cmd_sg_entries=2,sg_tablesize=4");
    let mut cfg = o.session_config(Guid(INIT_GUID));
    cfg.max_segment = 4096;
    let d = o.apply_to_disk(
        Disk::open(session(&s, cfg), 0).unwrap(),
        o.lun_queue(),
        None,
    );
    assert_eq!(d.max_transfer(), 8 << 10);
    d.read(8, &mut back).unwrap();
    assert_eq!(back, data);
}

/// Runs `threads` writers per disk, `rounds` 16 KiB writes each.
fn hammer(disks: &[Arc<Disk>], threads: usize, rounds: usize) {
    std::thread::scope(|sc| {
        for (k, d) in disks.iter().enumerate() {
            for t in 0..threads {
                let d = d.clone();
                sc.spawn(move || {
                    let data = pattern(16 << 10, (k * 16 + t) as u8);
                    for r in 0..rounds {
                        let lba = ((t * rounds + r) * 32) as u64;
                        d.write(lba, &data).unwrap();
                    }
                });
            }
        }
    });
}

/// [`hammer`] with the target holding the WRITEs until `full` says the
/// queue under test filled (or 10 s passed), so the peak it reaches does
/// not depend on how the threads happen to be scheduled; whether it
/// filled.
fn hammer_held(
    gate: &Gate,
    disks: &[Arc<Disk>],
    threads: usize,
    rounds: usize,
    full: impl Fn() -> bool,
) -> bool {
    gate.set(true);
    std::thread::scope(|sc| {
        sc.spawn(|| hammer(disks, threads, rounds));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !full() && std::time::Instant::now() < end {
            std::thread::yield_now();
        }
        let filled = full();
        gate.set(false);
        filled
    })
}

#[test]
fn max_cmd_per_lun_bounds_the_commands_of_one_lun_in_flight() {
    let gate = Arc::new(Gate::default());
    let s = setup_held(1, &gate);
    let o = login("max_cmd_per_lun=2");
    let d = Arc::new(disk(&s, &o, 0));
    let q = d.lun_queue().unwrap().clone();
    assert_eq!(q.max(), 2);
    let filled = hammer_held(&gate, std::slice::from_ref(&d), 8, 40, || {
        q.in_flight() == 2
    });
    assert!(filled, "2 commands in flight within 10 s");
    assert_eq!(q.peak(), 2, "8 writers, max_cmd_per_lun=2");
    assert_eq!(q.in_flight(), 0);

    // Queued I/O from one thread (blockload's engine) keeps to it too.
    let dev: Arc<dyn blockload::BlockDevice> = d.clone();
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.iodepth = 8;
    w.verify = true;
    w.region = Some(2 << 20);
    w.size = Some(4 << 20);
    w.runtime = std::time::Duration::from_secs(60);
    let r = blockload::run(dev, &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert_eq!(q.peak(), 2);

    // Without the key, queue_size (64) is the LUN's depth: the same
    // writers have more than 2 in flight.
    let d = Arc::new(disk(&s, &login(""), 0));
    let q = d.lun_queue().unwrap().clone();
    assert_eq!(q.max(), 64);
    let filled = hammer_held(&gate, std::slice::from_ref(&d), 8, 40, || q.in_flight() > 2);
    assert!(filled, "peak {} with 8 writers", q.peak());
}

#[test]
fn target_can_queue_bounds_every_lun_of_the_target_together() {
    let gate = Arc::new(Gate::default());
    let s = setup_held(2, &gate);
    let o = login("target_can_queue=3");
    let target = o.target_queue().unwrap();
    let sess = session(&s, o.session_config(Guid(INIT_GUID)));
    let disks: Vec<Arc<Disk>> = (0..2)
        .map(|n| {
            Arc::new(o.apply_to_disk(
                Disk::open(sess.clone(), n).unwrap(),
                o.lun_queue(),
                Some(target.clone()),
            ))
        })
        .collect();
    let filled = hammer_held(&gate, &disks, 4, 30, || target.in_flight() == 3);
    assert!(filled, "3 commands in flight within 10 s");
    assert_eq!(target.peak(), 3, "8 writers on 2 LUNs, target_can_queue=3");
    assert_eq!(target.in_flight(), 0);
    // Without it, nothing bounds the target below the LUNs' depths.
    assert_eq!(login("").target_queue().map(|q| q.max()), None);
}
