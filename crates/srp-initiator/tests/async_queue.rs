//! The library API's asynchronous flush and unmap: a LUN's
//! `blockload::IoQueue` starts SYNCHRONIZE CACHE and UNMAP like reads and
//! writes, in slots, from one thread, without waiting for them. Against
//! the real target port on the loopback provider, with a store whose
//! flush the test holds.

mod common;

use blockload::BlockDevice;
use common::{connect, fabric, target_port, wait_for, Gate, Held, Hold};
use rdma_types::Guid;
use srp::initiator::ChannelConfig;
use srp_initiator::disk::Disk;
use srp_initiator::session::SessionConfig;
use srp_target::{PortOptions, TargetPort};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const TARGET_GUID: u64 = 0x0002_c903_0000_5111;
const INIT_GUID: u64 = 0x0002_c903_0000_5222;

/// LUN 0 of a target port whose store holds its flushes at `gate`; `thin`: with
/// logical block provisioning (UNMAP).
fn disk(thin: bool, gate: Arc<Gate>) -> (Disk, Arc<TargetPort>) {
    let (d, port, _) = disk_holding(thin, gate, Hold::Flushes);
    (d, port)
}

/// As [`disk`], holding `hold` at the gate; with the store.
fn disk_holding(thin: bool, gate: Arc<Gate>, hold: Hold) -> (Disk, Arc<TargetPort>, Arc<Held>) {
    let provider: Arc<dyn verbs::Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let store = Arc::new(Held::new(4 << 20, gate, hold));
    let chan = ChannelConfig::new(0x11, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let dev = scsi::Device::new(
        scsi::DeviceConfig {
            thin,
            ..Default::default()
        },
        store.clone(),
    )
    .unwrap();
    let port = target_port(
        &provider,
        TARGET_GUID,
        chan.target_port_id(),
        "async",
        vec![dev],
        PortOptions::default(),
    );
    let sess = connect(&provider, INIT_GUID, &port, SessionConfig::new(chan));
    (Disk::open(sess, 0).unwrap(), port, store)
}

#[test]
fn flush_and_unmap_are_started_and_completed_like_reads_and_writes() {
    let gate = Arc::new(Gate::default());
    let (d, _port) = disk(true, gate.clone());
    // A write's data is its slot's buffer, unchanged until it completes.
    let mut bufs = vec![vec![0x5au8; 8 * 512]; 4];
    let mut q = d.queue(4).unwrap();
    q.start_write(0, 0, &bufs[0]).unwrap();
    q.start_write(1, 8, &bufs[1]).unwrap();
    let mut done: Vec<usize> = (0..2)
        .map(|_| {
            let (slot, r) = q.complete_one(&mut bufs).unwrap();
            r.unwrap();
            slot
        })
        .collect();
    done.sort();
    assert_eq!(done, vec![0, 1]);

    // A flush the store holds: started, and the caller goes on.
    gate.set(true);
    q.start_flush(1).unwrap();
    wait_for("the flush held at the store", 10, || {
        gate.held.load(Ordering::SeqCst) == 1
    });
    // Meanwhile an unmap and a write complete in other slots.
    q.start_unmap(2, 0, 8).unwrap();
    let (slot, r) = q.complete_one(&mut bufs).unwrap();
    assert_eq!(slot, 2);
    r.unwrap();
    q.start_write(3, 16, &bufs[3]).unwrap();
    let (slot, r) = q.complete_one(&mut bufs).unwrap();
    assert_eq!(slot, 3);
    r.unwrap();
    // A busy slot is refused.
    assert!(q.start_flush(1).is_err());
    gate.set(false);
    let (slot, r) = q.complete_one(&mut bufs).unwrap();
    assert_eq!(slot, 1);
    r.unwrap();
    assert!(q.complete_one(&mut bufs).is_none());
    drop(q);

    // The unmapped blocks read as zeroes, the rest as written.
    let mut back = vec![0u8; 24 * 512];
    d.read(0, &mut back).unwrap();
    assert!(back[..8 * 512].iter().all(|b| *b == 0));
    assert!(back[8 * 512..].iter().all(|b| *b == 0x5a));
}

#[test]
fn an_unmap_the_lu_cannot_do_completes_unsupported() {
    let (d, _port) = disk(false, Arc::new(Gate::default()));
    let mut bufs = vec![Vec::new(); 2];
    let mut q = d.queue(2).unwrap();
    q.start_unmap(0, 0, 8).unwrap();
    let (slot, r) = q.complete_one(&mut bufs).unwrap();
    assert_eq!(slot, 0);
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::Unsupported);
    // Out of range is refused at once.
    let e = q.start_unmap(1, d.num_blocks() - 4, 8).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    // The flush of an LU completes too.
    q.start_flush(1).unwrap();
    assert_eq!(q.complete_one(&mut bufs).unwrap().0, 1);
}

/// `abort_oldest` (what `srp io --abort-every-ms` uses) passes by a
/// command that is already a retry: the older, retried flush held at the
/// store is left alone and the newer first try is aborted.
#[test]
fn abort_oldest_passes_by_a_retried_command() {
    use srp::wire::{Lun, TaskAttr};
    use srp_initiator::session::Xfer;
    let gate = Arc::new(Gate::default());
    let (d, port) = disk(false, gate.clone());
    let sess = d.session().clone();
    const SYNC10: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    gate.set(true);
    let s = sess.clone();
    let retried = std::thread::spawn(move || {
        s.execute_retry(Lun::from_u64(0), &SYNC10, Xfer::None, TaskAttr::Simple)
    });
    wait_for("the retried flush held at the store", 10, || {
        gate.held.load(Ordering::SeqCst) == 1
    });
    let s = sess.clone();
    let first = std::thread::spawn(move || s.execute(Lun::from_u64(0), &SYNC10, Xfer::None));
    wait_for("the first try held at the store", 10, || {
        gate.held.load(Ordering::SeqCst) == 2
    });
    assert!(sess.abort_oldest(), "an abort was sent");
    // The target answers only once the aborted flush is back from the
    // store, so the gate opens first, but only after the SCSI core has
    // marked the task: the port counts the TMF in the same hold of its
    // lock that runs it, so once the count shows, taking that lock
    // (`sessions`) waits for the core to have been told.
    wait_for("the abort at the target", 10, || {
        port.lun_stats()
            .iter()
            .map(|l| l.counters.tmfs)
            .sum::<u64>()
            == 1
    });
    let _ = port.sessions();
    gate.set(false);
    let first = first.join().unwrap().unwrap();
    let retried = retried.join().unwrap().unwrap();
    assert_eq!(first.status, srp::initiator::Status::Aborted, "{first:?}");
    assert!(retried.good(), "{retried:?}");
    assert_eq!(sess.stats().aborted, 1);
    assert_eq!(sess.stats().tmfs, 1);
}

/// A queued write the error handler aborted is sent again from its slot's
/// buffer (the queue keeps no copy): once when `complete_one` ends it, and
/// once when the queue ended it early (a write larger than one command
/// waits for the queue's others first) and sends it again only when
/// `complete_one` hands over the buffers.
#[test]
fn an_aborted_queued_write_is_sent_again_from_its_slot() {
    let gate = Arc::new(Gate::default());
    let (mut d, port, store) = disk_holding(false, gate.clone(), Hold::Writes);
    d.limit_transfer(64 * 1024);
    let sess = d.session().clone();
    let block = 4096;
    let mut bufs: Vec<Vec<u8>> = (0..2u8)
        .map(|i| vec![0xa0 + i; block])
        .chain([vec![0x77; 128 * 1024]])
        .collect();
    let tmfs = || {
        port.lun_stats()
            .iter()
            .map(|l| l.counters.tmfs)
            .sum::<u64>()
    };
    let mut q = d.queue(3).unwrap();
    for (round, slot) in [0usize, 1].into_iter().enumerate() {
        gate.set(true);
        let lba = (slot * block / 512) as u64;
        q.start_write(slot, lba, &bufs[slot]).unwrap();
        wait_for("the write held at the store", 10, || {
            gate.held.load(Ordering::SeqCst) == round as u64 + 1
        });
        assert!(sess.abort_oldest(), "an abort was sent");
        // As in the test above: the TMF counted, the core has been told.
        wait_for("the abort at the target", 10, || tmfs() == round as u64 + 1);
        let _ = port.sessions();
        gate.set(false);
        let (done, r) = if slot == 0 {
            q.complete_one(&mut bufs).unwrap()
        } else {
            // Larger than one command: the queue ends slot 1 first.
            q.start_write(2, 64, &bufs[2]).unwrap();
            let first = q.complete_one(&mut bufs).unwrap();
            let (big, r) = q.complete_one(&mut bufs).unwrap();
            assert_eq!(big, 2);
            r.unwrap();
            first
        };
        assert_eq!(done, slot);
        r.unwrap();
    }
    assert_eq!(sess.stats().aborted, 2);
    drop(q);
    // Each aborted write went to the store twice (the first try ran to its
    // end before the abort was answered); the large one in two commands.
    assert_eq!(store.written.load(Ordering::SeqCst), 6);
    let mut back = vec![0u8; 2 * block];
    d.read(0, &mut back).unwrap();
    assert!(back[..block].iter().all(|b| *b == 0xa0));
    assert!(back[block..].iter().all(|b| *b == 0xa1));
    let mut big = vec![0u8; 128 * 1024];
    d.read(64, &mut big).unwrap();
    assert!(big.iter().all(|b| *b == 0x77));
}
