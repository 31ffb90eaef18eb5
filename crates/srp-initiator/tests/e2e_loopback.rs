//! The initiator's I/O path against the real target port, both on the
//! in-process loopback provider: login, INQUIRY, capacity, verified I/O
//! (100 MiB) through direct and indirect descriptors and immediate data.

mod common;

use common::{connect, fabric, ram, soft_pair, target_port, wait_for, Gate, Held, Hold};
use rdma_types::Guid;
use srp::initiator::{ChannelConfig, Status};
use srp::wire::TaskAttr;
use srp_initiator::disk::Disk;
use srp_initiator::session::{Session, SessionConfig, Xfer};
use srp_target::{PortOptions, TargetPort};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const TARGET_GUID: u64 = 0x0002_c903_0000_1111;
const INIT_GUID: u64 = 0x0002_c903_0000_2222;

struct Setup {
    fabric: Arc<dyn verbs::Provider>,
    port: Arc<TargetPort>,
    chan: ChannelConfig,
}

fn setup(lun_bytes: u64) -> Setup {
    setup_on(fabric(&[TARGET_GUID, INIT_GUID]), lun_bytes)
}

/// Two soft RoCE NICs on this test's own loopback addresses.
fn setup_soft(lun_bytes: u64, net: u8) -> Setup {
    let p = soft_pair(TARGET_GUID, INIT_GUID, net, rnic::softroce::ROCE_PORT);
    setup_on(p, lun_bytes)
}

fn setup_on(fabric: Arc<dyn verbs::Provider>, lun_bytes: u64) -> Setup {
    setup_with(fabric, lun_bytes, PortOptions::default())
}

fn setup_with(fabric: Arc<dyn verbs::Provider>, lun_bytes: u64, opts: PortOptions) -> Setup {
    let chan = ChannelConfig::new(0x11, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let port = target_port(
        &fabric,
        TARGET_GUID,
        chan.target_port_id(),
        "e2e",
        vec![ram(lun_bytes)],
        opts,
    );
    Setup { fabric, port, chan }
}

fn session(s: &Setup, cfg: SessionConfig) -> Arc<Session> {
    connect(&s.fabric, INIT_GUID, &s.port, cfg)
}

#[test]
fn login_inquiry_capacity_and_verified_io() {
    let s = setup(64 << 20);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    assert!(sess.negotiated().req_lim > 1);
    let disk = Disk::open(sess.clone(), 0).unwrap();
    let info = disk.info().clone();
    assert_eq!(info.vendor, "RUSTSCST");
    assert_eq!(info.block_size, 512);
    assert_eq!(info.blocks, (64 << 20) / 512);
    assert!(info.naa.is_some(), "VPD 0x83 names the LU");
    assert_eq!(s.port.sessions().len(), 1);

    let disk: Arc<dyn blockload::BlockDevice> = Arc::new(disk);
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.jobs = 4;
    w.verify = true;
    w.region = Some(8 << 20);
    w.size = Some(32 << 20);
    w.runtime = std::time::Duration::from_secs(120);
    let r = blockload::run(disk, &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes > 4 << 20, "{}", r.table());
}

#[test]
fn large_transfers_through_direct_and_indirect_descriptors() {
    let s = setup(32 << 20);
    let all_chunks = s.port.free_chunks();
    // (cmd_sg_entries, segment size, allow_ext_sg): the last one puts a
    // 4 MiB transfer's 1024 descriptors in an external table that the
    // target fetches by RDMA READ (Linux targets refuse these).
    for (sg, seg, ext) in [
        (1u8, 0u32, false),
        (255, 4096, false),
        (255, 64 << 10, false),
        (1, 4096, true),
    ] {
        let mut chan = s.chan.clone();
        chan.cmd_sg_entries = sg;
        chan.allow_ext_sg = ext;
        let mut cfg = SessionConfig::new(chan);
        cfg.max_segment = seg;
        let sess = session(&s, cfg);
        let disk = Disk::open(sess.clone(), 0).unwrap();
        assert!(disk.max_transfer() <= 4 << 20, "VPD B0 caps one command");
        if seg > 0 && !ext {
            assert!(disk.max_transfer() <= sg as usize * seg as usize);
        }
        if ext {
            assert_eq!(disk.max_transfer(), 4 << 20, "tables lift the IU's limit");
        }
        for mib in [4usize, 8] {
            let len = mib << 20;
            let data: Vec<u8> = (0..len)
                .map(|i| (i * 7 + mib + sg as usize) as u8)
                .collect();
            let before = sess.stats().completed;
            if let Err(e) = disk.write(1024, &data) {
                panic!("{e}: {:?}", sess.take_events());
            }
            let mut back = vec![0u8; len];
            disk.read(1024, &mut back).unwrap();
            assert!(
                back == data,
                "{mib} MiB with cmd_sg_entries={sg} segment={seg} ext={ext}"
            );
            if ext {
                // 4 MiB per command each way, not 4 KiB.
                assert_eq!(sess.stats().completed - before, 2 * mib as u64 / 4);
            }
        }
        drop(disk);
        drop(sess);
    }
    // The reads (a command is at most 4 MiB) went out of chunks the store
    // read into, and every chunk came back.
    assert!(s.port.direct_data_in() >= 8, "{}", s.port.direct_data_in());
    // The 4 MiB writes with 64 KiB segments or one descriptor arrive in
    // chunks back to back and are written from there.
    assert!(
        s.port.direct_data_out() >= 4,
        "{}",
        s.port.direct_data_out()
    );
    assert_eq!(s.port.free_chunks(), all_chunks);
}

/// Must-show 3 on the loopback provider: 100 MiB written and read back
/// verified, each kind of data descriptor carrying its share: one direct
/// descriptor per 4 MiB command (24 MiB), indirect tables in the IU
/// (64 KiB segments, 24 MiB), external tables the target fetches by RDMA
/// READ (4 KiB segments, 48 MiB) and immediate data (4 MiB). Every
/// sector holds its own offset, so a misplaced block shows.
#[test]
fn hundred_mib_verified_through_every_descriptor_kind() {
    const MIB: u64 = 1 << 20;
    let s = setup(100 * MIB);
    let stamped = blockload::offset_units;
    let chunk = 4 << 20;
    let mut total = 0;
    // (what, cmd_sg_entries, segment, allow_ext_sg, MiB, bytes per write)
    for (what, sg, seg, ext, mib, piece) in [
        ("direct", 1u8, 0u32, false, 24u64, chunk),
        ("indirect in the IU", 255, 64 << 10, false, 24, chunk),
        ("external tables", 1, 4096, true, 48, chunk),
        ("immediate data", 12, 0, false, 4, 0),
    ] {
        let mut chan = s.chan.clone();
        chan.cmd_sg_entries = sg;
        chan.allow_ext_sg = ext;
        let mut cfg = SessionConfig::new(chan);
        cfg.max_segment = seg;
        let sess = session(&s, cfg);
        let piece = if piece > 0 {
            piece
        } else {
            let neg = sess.negotiated();
            let off = neg.imm_data_offset.expect("immediate data offered");
            let cap = (neg.max_it_iu_len - u32::from(off)) as usize / 512 * 512;
            assert!(cap >= 4096, "{neg:?}");
            cap
        };
        let disk = Disk::open(sess.clone(), 0).unwrap();
        assert_eq!(disk.max_transfer(), chunk, "{what}");
        let at = total * MIB;
        for off in (at..at + mib * MIB).step_by(chunk) {
            let data = stamped(off, chunk);
            for (k, p) in data.chunks(piece).enumerate() {
                let before = sess.stats().completed;
                disk.write((off + (k * piece) as u64) / 512, p).unwrap();
                assert_eq!(sess.stats().completed - before, 1, "{what}: one command");
            }
        }
        let mut back = vec![0u8; chunk];
        for off in (at..at + mib * MIB).step_by(chunk) {
            let before = sess.stats().completed;
            disk.read(off / 512, &mut back).unwrap();
            assert_eq!(sess.stats().completed - before, 1, "{what}: one command");
            assert!(
                back == stamped(off, chunk),
                "{what}: MiB {} differs",
                off / MIB
            );
        }
        total += mib;
    }
    assert_eq!(total, 100);
}

#[test]
fn small_writes_travel_as_immediate_data() {
    let s = setup(1 << 20);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    assert!(sess.negotiated().imm_data_offset.is_some());
    let disk = Disk::open(sess.clone(), 0).unwrap();
    let data = vec![0x5au8; 4096];
    disk.write(8, &data).unwrap();
    let mut back = vec![0u8; 4096];
    disk.read(8, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn over_soft_roce_verified_io_and_large_transfers() {
    let s = setup_soft(16 << 20, 93);
    let mut chan = s.chan.clone();
    chan.cmd_sg_entries = 255;
    let mut cfg = SessionConfig::new(chan);
    cfg.max_segment = 16 << 10;
    let sess = session(&s, cfg);
    let disk = Disk::open(sess.clone(), 0).unwrap();
    assert_eq!(disk.info().blocks, (16 << 20) / 512);
    for mib in [4usize, 8] {
        let len = mib << 20;
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + mib) as u8).collect();
        disk.write(2048, &data).unwrap();
        let mut back = vec![0u8; len];
        disk.read(2048, &mut back).unwrap();
        assert!(back == data, "{mib} MiB over soft RoCE");
    }
    let disk: Arc<dyn blockload::BlockDevice> = Arc::new(disk);
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.jobs = 4;
    w.verify = true;
    w.region = Some(2 << 20);
    w.size = Some(4 << 20);
    w.runtime = std::time::Duration::from_secs(120);
    let r = blockload::run(disk, &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes > 0, "{}", r.table());
}

/// Runs `w` on `disk` in a thread and, each time `sess` has completed
/// `every` more commands, calls `act` (a task management function), until
/// the workload ends or `act` has succeeded `max` times. Returns the
/// workload's report and how often `act` succeeded.
fn during(
    sess: &Session,
    disk: Arc<dyn blockload::BlockDevice>,
    w: blockload::Workload,
    every: u64,
    max: u32,
    mut act: impl FnMut() -> bool,
) -> (blockload::Report, u32) {
    let run = std::thread::spawn(move || blockload::run(disk, &w, |_| {}).unwrap());
    let mut acted = 0;
    while !run.is_finished() && acted < max {
        let done = sess.stats().completed;
        while sess.stats().completed < done + every && !run.is_finished() {
            std::thread::yield_now();
        }
        if !run.is_finished() && act() {
            acted += 1;
        }
    }
    (run.join().unwrap(), acted)
}
/// LOGICAL UNIT RESET while a verified workload runs (what `sg_reset
/// --device` does under fio): the target aborts the LUN's commands, the
/// disk sends them again, and no data is lost or misplaced.
#[test]
fn lun_reset_during_verified_io() {
    // Commands at the workers: on the loopback fabric a command run inline
    // is answered before its SEND returns, so no reset could find one.
    let opts = PortOptions {
        inline_max: 0,
        ..PortOptions::default()
    };
    let s = setup_with(fabric(&[TARGET_GUID, INIT_GUID]), 32 << 20, opts);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    let disk: Arc<dyn blockload::BlockDevice> = Arc::new(Disk::open(sess.clone(), 0).unwrap());
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.jobs = 8;
    w.verify = true;
    w.region = Some(8 << 20);
    w.size = Some(48 << 20);
    w.runtime = std::time::Duration::from_secs(120);
    let lun = srp::wire::Lun::from_u64(0);
    // Each reset after 200 more commands, so it lands in the middle of
    // the workload rather than in a burst.
    let (r, resets) = during(&sess, disk, w, 200, 10, || {
        sess.reset_lun(lun).expect("LUN reset");
        true
    });
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes > 4 << 20, "{}", r.table());
    assert!(
        resets >= 3,
        "only {resets} resets landed during the workload"
    );
    let st = sess.stats();
    assert!(st.tmfs >= u64::from(resets), "{st:?}");
    // The resets did cut commands short, and the disk sent them again.
    assert!(st.reset_ended > 0, "{st:?}");
    // No command the reset ended was answered after the reset's response
    // (the initiator counts such a response as a protocol error).
    assert_eq!(st.protocol_errors, 0, "{st:?}");
}

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

/// A session with a pool of 1 MiB, its LU past the power-on attention,
/// and 256 KiB of data (a pattern from `k`) written at LBA 64.
fn kept_reads_setup(k: u32) -> (Setup, Arc<Session>, srp::wire::Lun, Vec<u8>) {
    let s = setup(8 << 20);
    let mut cfg = SessionConfig::new(s.chan.clone());
    cfg.pool_bytes = 1 << 20;
    let sess = session(&s, cfg);
    let lun = srp::wire::Lun::from_u64(0);
    let data: Vec<u8> = (0..256 << 10)
        .map(|i: u32| (i * k + i / 4096) as u8)
        .collect();
    // TEST UNIT READY takes the power-on unit attention.
    let ready = (0..3).any(|_| sess.execute(lun, &[0; 6], Xfer::None).unwrap().good());
    assert!(ready, "the LU never got ready");
    let r = sess
        .execute(lun, &write10(64, 512), Xfer::Out(&data))
        .unwrap();
    assert!(r.good(), "{r:?}");
    (s, sess, lun, data)
}

/// A read finished with `finish_kept` leaves its data in the session's
/// pool, where `Kept::read` finds what a plain read copies out; the pages
/// return to the pool when the `Kept` goes. A pool of 1 MiB holds four
/// kept 256 KiB reads: forty in turn, each dropped, never wait for pages.
#[test]
fn a_read_kept_in_the_pool_reads_as_a_copied_one_and_gives_its_pages_back() {
    let (_s, sess, lun, data) = kept_reads_setup(7);
    // On a thread of its own: pages never given back would have a start
    // wait for them forever.
    let (tx, rx) = std::sync::mpsc::channel();
    let (sess2, data2) = (sess.clone(), data.clone());
    std::thread::spawn(move || {
        let (sess, data) = (sess2, data2);
        for round in 0..40 {
            let started = sess
                .start(
                    lun,
                    &read10(64, 512),
                    &Xfer::In(256 << 10),
                    TaskAttr::Simple,
                )
                .unwrap();
            let (r, kept) = sess.finish_kept(started);
            assert!(r.good() && r.data.is_empty(), "{r:?}");
            let kept = kept.expect("a GOOD read keeps its data");
            assert_eq!(kept.len(), 256 << 10);
            let mut out = vec![0u8; 256 << 10];
            assert_eq!(kept.read(&mut out), 256 << 10);
            assert!(out == data, "round {round}: kept data differs");
            if round == 0 {
                // As a plain read gives it, while the kept one holds its pages.
                let plain = sess
                    .execute(lun, &read10(64, 512), Xfer::In(256 << 10))
                    .unwrap();
                assert!(plain.data == data);
            }
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("40 kept reads in turn within 30 s: their pages come back");
    // A command that fails keeps nothing.
    let started = sess
        .start(
            lun,
            &read10(u32::MAX - 1, 1),
            &Xfer::In(512),
            TaskAttr::Simple,
        )
        .unwrap();
    let (r, kept) = sess.finish_kept(started);
    assert!(!r.good() && kept.is_none(), "{r:?}");
}

/// A start that replaces a kept read (`start_batched_after`) gives the
/// kept pages back before it takes its own: a pool of 1 MiB holds four
/// kept 256 KiB reads, and each later read replacing the oldest of them
/// never waits for pages. The replaced `Kept` is left empty.
#[test]
fn a_start_after_a_kept_read_takes_the_pages_it_gives_back() {
    let (_s, sess, lun, data) = kept_reads_setup(13);
    let (tx, rx) = std::sync::mpsc::channel();
    let (sess2, data2) = (sess.clone(), data.clone());
    std::thread::spawn(move || {
        let (sess, data) = (sess2, data2);
        let mut kept: Vec<Option<srp_initiator::session::Kept>> = (0..4).map(|_| None).collect();
        for round in 0..24 {
            let old = &mut kept[round % 4];
            let started = sess
                .start_batched_after(
                    old.as_mut(),
                    lun,
                    &read10(64, 512),
                    &Xfer::In(256 << 10),
                    TaskAttr::Simple,
                )
                .unwrap();
            if let Some(k) = old {
                assert!(
                    k.is_empty(),
                    "round {round}: the replaced read kept its data"
                );
            }
            let (r, k) = sess.finish_kept(started);
            assert!(r.good(), "{r:?}");
            let k = k.expect("a GOOD read keeps its data");
            let mut out = vec![0u8; 256 << 10];
            assert_eq!(k.read(&mut out), 256 << 10);
            assert!(out == data, "round {round}: kept data differs");
            *old = Some(k);
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("24 reads replacing kept ones within 30 s: no start waits for pages");
}

/// `wait_any_answer` takes the answer it finds for the command's finish;
/// an answer handed to another command's finish goes back, and both
/// commands end with their own data.
#[test]
fn an_answer_taken_by_the_wait_finishes_its_command_and_no_other() {
    let s = setup(8 << 20);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    let lun = srp::wire::Lun::from_u64(0);
    let ready = (0..3).any(|_| sess.execute(lun, &[0; 6], Xfer::None).unwrap().good());
    assert!(ready, "the LU never got ready");
    let (a, b) = (vec![0xa1u8; 4096], vec![0xb2u8; 4096]);
    for (lba, d) in [(8, &a), (16, &b)] {
        let r = sess.execute(lun, &write10(lba, 8), Xfer::Out(d)).unwrap();
        assert!(r.good(), "{r:?}");
    }
    let start = |lba| {
        sess.start(lun, &read10(lba, 8), &Xfer::In(4096), TaskAttr::Simple)
            .unwrap()
    };
    let (sa, sb) = (start(8), start(16));
    let (k, answer) = sess
        .wait_any_answer([(0, &sa)].into_iter())
        .expect("a command to wait for");
    assert_eq!(k, 0);
    // A's answer given with B: it goes back, and B's own is waited for.
    let rb = sess.finish_answered(sb, answer, Xfer::In(4096));
    assert!(rb.good() && rb.data == b, "{rb:?}");
    let ra = sess.finish(sa, Xfer::In(4096));
    assert!(ra.good() && ra.data == a, "{ra:?}");
    // The common way: the answer to the command it was taken for.
    let sa = start(8);
    let (_, answer) = sess.wait_any_answer([(0, &sa)].into_iter()).unwrap();
    let (r, kept) = sess.finish_kept_answered(sa, answer);
    let mut out = vec![0u8; 4096];
    assert!(r.good());
    assert_eq!(kept.expect("kept").read(&mut out), 4096);
    assert!(out == a);
}

/// Over soft RoCE, whose NIC the waiting caller drives, a thread that
/// starts commands batched sends them 16 at a time, not all when it next
/// waits: the target starts on the first half while the thread builds the
/// second (a whole queue in one batch left each side idle while the other
/// worked). Seen at the target: 16 of 20 commands arrive before the
/// thread waits for any. (Held whole, they would arrive only when some
/// other thread of the session happened to post meanwhile; the unit test
/// `a_batch_for_a_driven_nic_goes_out_at_sixteen...` pins the rule.)
#[test]
fn batched_starts_over_a_driven_nic_go_out_sixteen_at_a_time() {
    let s = setup_soft(8 << 20, 181);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    let lun = srp::wire::Lun::from_u64(0);
    // TEST UNIT READY takes the unit attention; its wait drives the NIC,
    // which is how the session learns that it does.
    let ready = (0..3).any(|_| sess.execute(lun, &[0; 6], Xfer::None).unwrap().good());
    assert!(ready, "the LU never got ready");
    let cmds_before = s.port.sessions()[0].cmds;
    let started: Vec<_> = (0..20u32)
        .map(|i| {
            sess.start_batched(lun, &read10(i * 8, 8), &Xfer::In(4096), TaskAttr::Simple)
                .unwrap()
        })
        .collect();
    wait_for("the first 16 batched commands at the target", 10, || {
        s.port.sessions()[0].cmds >= cmds_before + 16
    });
    for c in started {
        assert!(sess.finish(c, Xfer::None).good());
    }
    assert_eq!(s.port.sessions()[0].cmds, cmds_before + 20);
}

/// LOGICAL UNIT RESET while the store holds one WRITE and a second one
/// waits for the port's only worker. The reset is answered only once the
/// held WRITE returned from the store (an aborted command must not change
/// the medium after the answer, nor send anything), and the queued WRITE,
/// which the SCSI core never started, is aborted too: it never reaches
/// the store.
#[test]
fn lun_reset_waits_for_the_write_it_aborts_and_aborts_the_queued_one() {
    let gate = Arc::new(Gate::default());
    let store = Arc::new(Held::new(4 << 20, gate.clone(), Hold::Writes));
    let dev = scsi::Device::new(scsi::DeviceConfig::default(), store.clone()).unwrap();
    let fabric: Arc<dyn verbs::Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let chan = ChannelConfig::new(0x11, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let opts = PortOptions {
        workers: 1,
        ..PortOptions::default()
    };
    let port = target_port(
        &fabric,
        TARGET_GUID,
        chan.target_port_id(),
        "e2e",
        vec![dev],
        opts,
    );
    let sess = connect(&fabric, INIT_GUID, &port, SessionConfig::new(chan));
    let lun = srp::wire::Lun::from_u64(0);
    // TEST UNIT READY until the login's unit attention is taken.
    let tur = || sess.execute(lun, &[0; 6], Xfer::None).unwrap().good();
    assert!(tur() || tur());
    let cmds = || port.sessions()[0].cmds;
    let before = cmds();
    gate.set(true);
    // 128 KiB: too large to run on the receiving thread, so it goes to the
    // worker, which the store then holds.
    let a_data = vec![0xaau8; 128 << 10];
    let a = sess
        .start(lun, &write10(0, 256), &Xfer::Out(&a_data), TaskAttr::Simple)
        .unwrap();
    wait_for("the first WRITE held in the store", 10, || {
        gate.held.load(Ordering::SeqCst) == 1
    });
    // Immediate data: queued for the worker under the same port lock that
    // counts it.
    let b_data = vec![0xbbu8; 4096];
    let b = sess
        .start(
            lun,
            &write10(2048, 8),
            &Xfer::Out(&b_data),
            TaskAttr::Simple,
        )
        .unwrap();
    wait_for("the second WRITE queued", 10, || cmds() == before + 2);
    let reset = {
        let (sess, store) = (sess.clone(), store.clone());
        std::thread::spawn(move || {
            let r = sess.reset_lun(lun);
            (r, store.written.load(Ordering::SeqCst))
        })
    };
    wait_for("the reset at the target", 10, || {
        port.sessions()[0].tmfs == 1
    });
    // Nothing may answer it while the store holds the WRITE: give a wrong
    // answer half a second to arrive.
    let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while !reset.is_finished() && std::time::Instant::now() < until {
        std::thread::yield_now();
    }
    assert!(
        !reset.is_finished(),
        "LUN reset answered while the store still held a WRITE it aborts"
    );
    gate.set(false);
    let (r, written) = reset.join().unwrap();
    r.expect("LUN reset");
    assert_eq!(
        written, 1,
        "the held WRITE had returned when the reset was answered"
    );
    assert_eq!(sess.finish(a, Xfer::Out(&a_data)).status, Status::Reset);
    assert_eq!(sess.finish(b, Xfer::Out(&b_data)).status, Status::Reset);
    assert_eq!(
        store.written.load(Ordering::SeqCst),
        1,
        "the queued WRITE ran"
    );
    let mut back = vec![0u8; 4096];
    scsi::Backend::read(&store.ram, 2048 * 512, &mut back).unwrap();
    assert!(
        back.iter().all(|&x| x == 0),
        "the queued WRITE reached the store"
    );
    assert_eq!(sess.stats().protocol_errors, 0, "{:?}", sess.stats());
    assert_eq!(port.free_chunks(), PortOptions::default().chunks);
}

/// ABORT TASK under verified 1 MiB I/O on a target whose chunk pool is so
/// small that data-in WRITEs wait for chunks: a TMF response must not
/// overtake an aborted READ's waiting WRITEs, nor go out while a command
/// it reaches is still on its way back from the SCSI core (one that
/// completed just before the abort still sends its data-in), or the
/// initiator reuses the buffer they then land in (seen as misplaced data).
#[test]
fn aborts_while_data_in_waits_for_chunks_lose_nothing() {
    let fabric = fabric(&[TARGET_GUID, INIT_GUID]);
    let opts = PortOptions {
        chunks: 3,
        ..PortOptions::default()
    };
    let s = setup_with(fabric, 16 << 20, opts);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    let disk: Arc<dyn blockload::BlockDevice> = Arc::new(Disk::open(sess.clone(), 0).unwrap());
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 70 });
    w.bs = 1 << 20;
    w.jobs = 6;
    w.verify = true;
    w.region = Some(8 << 20);
    w.size = Some(96 << 20);
    w.runtime = std::time::Duration::from_secs(120);
    let (r, asked) = during(&sess, disk, w, 2, 400, || sess.abort_oldest());
    assert!(r.ok(), "{}", r.table());
    assert!(asked >= 10, "only {asked} aborts during the workload");
    let st = sess.stats();
    assert!(st.aborts_complete > 0, "{st:?}");
    assert!(st.aborted > 0, "{st:?}");
    assert_eq!(st.protocol_errors, 0, "a response after its abort: {st:?}");
    assert_eq!(s.port.free_chunks(), 3, "every chunk back");
}

/// The target's disconnect hook runs once the port's lock is let go, so a
/// hook may call the port (a CM glue that looks the session up, say).
/// Before, it ran under the lock and such a hook deadlocked the port.
#[test]
fn the_disconnect_hook_may_call_back_into_the_port() {
    let s = setup(1 << 20);
    let sess = session(&s, SessionConfig::new(s.chan.clone()));
    Disk::open(sess.clone(), 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let port = Arc::downgrade(&s.port);
    let tx = std::sync::Mutex::new(tx);
    s.port.on_disconnect(move |conn, why| {
        // Into the port from the hook: its sessions, its lock.
        let left = port.upgrade().map(|p| p.sessions().len());
        let _ = tx.lock().unwrap().send((conn, why.to_string(), left));
    });
    // From another thread: a deadlock would hold it, not the test.
    let p = s.port.clone();
    std::thread::spawn(move || p.logout_all(srp::wire::TLogoutReason::NoReason));
    let (_, why, left) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the hook ran and returned (no deadlock)");
    assert!(why.contains("target logout"), "{why}");
    assert!(left.is_some(), "the hook reached the port");
}

/// A LUN grown at the target: the next command meets CAPACITY DATA HAS
/// CHANGED, which the session notes for a rescan and the disk follows by
/// itself (its size is the new one, and I/O past the old end works).
#[test]
fn a_capacity_unit_attention_is_noted_and_followed() {
    let fabric: Arc<dyn verbs::Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let chan = ChannelConfig::new(0x11, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let scsi = Arc::new(scsi::Target::new());
    scsi.add_lun(None, scsi::Lun::new(0).unwrap(), Arc::new(ram(4 << 20)));
    let port = Arc::new(
        TargetPort::start(
            fabric.clone(),
            Guid(TARGET_GUID),
            srp::target::TargetConfig::new(chan.target_port_id(), "grow"),
            scsi.clone(),
            PortOptions::default(),
        )
        .unwrap(),
    );
    let changes = Arc::new(srp_initiator::changes::TargetChanges::new());
    let mut cfg = SessionConfig::new(chan);
    cfg.changes = Some(changes.clone());
    let disk = Disk::open(connect(&fabric, INIT_GUID, &port, cfg), 0).unwrap();
    assert_eq!(disk.blocks(), (4 << 20) / 512);
    let seen = changes.generation();

    scsi.resize(None, scsi::Lun::new(0).unwrap(), (8 << 20) / 512)
        .unwrap();
    let data = vec![0x5a; 4096];
    disk.write(0, &data).unwrap();
    assert!(changes.generation() > seen, "the unit attention was noted");
    assert_eq!(disk.blocks(), (8 << 20) / 512, "the disk read its capacity");
    let past_old_end = (6 << 20) / 512;
    disk.write(past_old_end, &data).unwrap();
    let mut back = vec![0; 4096];
    disk.read(past_old_end, &mut back).unwrap();
    assert_eq!(back, data);
    // A rescan's recheck agrees, and the info keeps the size at open.
    assert_eq!(disk.recheck().unwrap(), (8 << 20) / 512);
    assert_eq!(disk.info().blocks, (4 << 20) / 512);
}
