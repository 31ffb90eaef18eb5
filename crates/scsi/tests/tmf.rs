//! Task management with commands in flight on a slow (gated) backend.

mod common;

use common::{l0, spawn_attr, wait_entered, Gated};
use scsi::*;
use std::sync::mpsc;
use std::sync::Arc;

const READ1: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

fn setup() -> (Arc<Target>, Arc<Gated>, mpsc::Receiver<()>, Nexus, Nexus) {
    let (g, rx) = Gated::new(64);
    let t = Target::new();
    t.add_lun(
        None,
        l0(),
        Arc::new(Device::new(DeviceConfig::default(), g.clone()).unwrap()),
    );
    let a = Nexus::new("a", "p");
    let b = Nexus::new("b", "p");
    for n in [&a, &b] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    (Arc::new(t), g, rx, a, b)
}

fn spawn_read(t: &Arc<Target>, n: &Nexus, tag: u64) -> std::thread::JoinHandle<ScsiResponse> {
    let (t, n) = (t.clone(), n.clone());
    std::thread::spawn(move || t.submit(&n, l0(), tag, &READ1, &[], 512))
}

fn ua(t: &Target, n: &Nexus) -> Option<Asc> {
    t.execute(n, l0(), &[0; 6], &[], 0).sense.map(|s| s.asc)
}

#[test]
fn abort_task_hits_only_its_tag() {
    let (t, g, rx, a, _) = setup();
    let h1 = spawn_read(&t, &a, 1);
    let h2 = spawn_read(&t, &a, 2);
    rx.recv().unwrap();
    rx.recv().unwrap();
    // Both are inside the backend. A reused tag is refused meanwhile.
    let r = t.submit(&a, l0(), 1, &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::OVERLAPPED_COMMANDS);
    assert_eq!(
        t.task_management(&a, l0(), Tmf::AbortTask(1)),
        TmfResponse::FunctionComplete
    );
    g.open();
    let (r1, r2) = (h1.join().unwrap(), h2.join().unwrap());
    assert_eq!((r1.status, r1.data_in.len()), (Status::TaskAborted, 0));
    assert_eq!((r2.status, r2.data_in.len()), (Status::Good, 512));
    // Tag 1 is free again, and no unit attention was left by ABORT TASK.
    assert_eq!(t.submit(&a, l0(), 1, &[0; 6], &[], 0).status, Status::Good);
    assert_eq!(
        t.task_management(&a, Lun::new(9).unwrap(), Tmf::AbortTaskSet),
        TmfResponse::IncorrectLun
    );
}

#[test]
fn abort_task_set_is_per_nexus_clear_task_set_is_not() {
    let (t, g, rx, a, b) = setup();
    let ha = spawn_read(&t, &a, 7);
    let hb = spawn_read(&t, &b, 7);
    rx.recv().unwrap();
    rx.recv().unwrap();
    t.task_management(&a, l0(), Tmf::AbortTaskSet);
    g.open();
    assert_eq!(ha.join().unwrap().status, Status::TaskAborted);
    assert_eq!(hb.join().unwrap().status, Status::Good);
    assert_eq!(ua(&t, &b), None);

    g.close();
    let ha = spawn_read(&t, &a, 8);
    let hb = spawn_read(&t, &b, 8);
    rx.recv().unwrap();
    rx.recv().unwrap();
    t.task_management(&a, l0(), Tmf::ClearTaskSet);
    g.open();
    assert_eq!(ha.join().unwrap().status, Status::TaskAborted);
    assert_eq!(hb.join().unwrap().status, Status::TaskAborted);
    assert_eq!(ua(&t, &b), Some(Asc::COMMANDS_CLEARED_BY_ANOTHER));
    assert_eq!(ua(&t, &a), None);
}

#[test]
fn lu_reset_and_nexus_reset_leave_unit_attentions() {
    let (t, g, rx, a, b) = setup();
    let ha = spawn_read(&t, &a, 1);
    let hb = spawn_read(&t, &b, 1);
    rx.recv().unwrap();
    rx.recv().unwrap();
    t.task_management(&a, l0(), Tmf::LogicalUnitReset);
    g.open();
    assert_eq!(ha.join().unwrap().status, Status::TaskAborted);
    assert_eq!(hb.join().unwrap().status, Status::TaskAborted);
    for n in [&a, &b] {
        assert_eq!(ua(&t, n), Some(Asc::BUS_DEVICE_RESET));
        assert_eq!(ua(&t, n), None);
    }
    t.task_management(&b, l0(), Tmf::ItNexusReset);
    assert_eq!(ua(&t, &b), Some(Asc::I_T_NEXUS_LOSS));
    assert_eq!(ua(&t, &a), None);
}

#[test]
fn preempt_and_abort_aborts_the_victims_tasks() {
    let (t, g, rx, a, b) = setup();
    let reg = |n: &Nexus, key: u64| {
        let mut p = vec![0u8; 24];
        p[8..16].copy_from_slice(&key.to_be_bytes());
        assert_eq!(
            t.execute(n, l0(), &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24)
                .status,
            Status::Good
        );
    };
    reg(&a, 1);
    reg(&b, 2);
    let ha = spawn_read(&t, &a, 3);
    rx.recv().unwrap();
    // b preempts a's key (1) and aborts a's tasks. No reservation existed,
    // so none is created (SPC-4 5.9.11.4.3): only the registration goes.
    let mut p = 2u64.to_be_bytes().to_vec();
    p.extend_from_slice(&1u64.to_be_bytes());
    p.resize(24, 0);
    let r = t.submit(&b, l0(), 9, &[0x5f, 5, 3, 0, 0, 0, 0, 0, 24, 0], &p, 24);
    assert_eq!(r.status, Status::Good);
    g.open();
    assert_eq!(ha.join().unwrap().status, Status::TaskAborted);
    assert_eq!(ua(&t, &a), Some(Asc::REGISTRATIONS_PREEMPTED));
    let r = t.execute(&a, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(t.execute(&a, l0(), &READ1, &[], 512).status, Status::Good);
}

#[test]
fn ordered_waits_for_older_tasks_and_newer_ones_wait_for_it() {
    let (t, g, rx, a, b) = setup();
    let write5 = vec![0x2a, 0, 0, 0, 0, 5, 0, 0, 1, 0];
    let read5 = vec![0x28, 0, 0, 0, 0, 5, 0, 0, 1, 0];
    // A SIMPLE read held in the backend.
    let h1 = spawn_read(&t, &a, 1);
    rx.recv().unwrap();
    // Behind it: an ORDERED write of LBA 5, then a SIMPLE read of LBA 5
    // from another nexus (the task set is the LU's, not the nexus's).
    let h2 = spawn_attr(&t, &a, 2, TaskAttr::Ordered, write5, vec![0xab; 512]);
    wait_entered(&t, &a, 2);
    let h3 = spawn_attr(&t, &b, 3, TaskAttr::Simple, read5, Vec::new());
    wait_entered(&t, &a, 3);
    // HEAD OF QUEUE passes them all while the first read is still held.
    let r = t.submit_attr(&a, l0(), 4, TaskAttr::HeadOfQueue, &[0; 6], &[], 0);
    assert_eq!(r.status, Status::Good);
    assert!(!h2.is_finished() && !h3.is_finished());
    assert_eq!(t.task_set_len(&a, l0()), 3);
    g.open();
    assert_eq!(h1.join().unwrap().status, Status::Good);
    assert_eq!(h2.join().unwrap().status, Status::Good);
    // The newer SIMPLE read ran after the ORDERED write: it sees its data.
    let r3 = h3.join().unwrap();
    assert_eq!(r3.status, Status::Good);
    assert_eq!(r3.data_in, vec![0xab; 512]);
    assert_eq!(t.task_set_len(&a, l0()), 0);
}

#[test]
fn a_task_aborted_while_waiting_its_turn_never_runs() {
    let (t, g, rx, a, _) = setup();
    let h1 = spawn_read(&t, &a, 1);
    rx.recv().unwrap();
    let write7 = vec![0x2a, 0, 0, 0, 0, 7, 0, 0, 1, 0];
    let h2 = spawn_attr(&t, &a, 2, TaskAttr::Ordered, write7, vec![0xcd; 512]);
    wait_entered(&t, &a, 2);
    assert_eq!(
        t.task_management(&a, l0(), Tmf::AbortTask(2)),
        TmfResponse::FunctionComplete
    );
    // It ends while the older read is still held, without writing.
    assert_eq!(h2.join().unwrap().status, Status::TaskAborted);
    g.open();
    assert_eq!(h1.join().unwrap().status, Status::Good);
    let r = t.execute(&a, l0(), &[0x28, 0, 0, 0, 0, 7, 0, 0, 1, 0], &[], 512);
    assert_ne!(r.data_in, vec![0xcd; 512]);
}

#[test]
fn it_nexus_reset_aborts_the_nexus_commands_held_in_the_backend() {
    let (t, g, rx, a, b) = setup();
    let ha = spawn_read(&t, &a, 1);
    let hb = spawn_read(&t, &b, 1);
    rx.recv().unwrap();
    rx.recv().unwrap();
    // Both are inside the (gated) backend when a's nexus is reset.
    assert_eq!(
        t.task_management(&a, l0(), Tmf::ItNexusReset),
        TmfResponse::FunctionComplete
    );
    g.open();
    let (ra, rb) = (ha.join().unwrap(), hb.join().unwrap());
    assert_eq!((ra.status, ra.data_in.len()), (Status::TaskAborted, 0));
    assert_eq!((rb.status, rb.data_in.len()), (Status::Good, 512));
    assert_eq!(ua(&t, &a), Some(Asc::I_T_NEXUS_LOSS));
    assert_eq!(ua(&t, &a), None);
    assert_eq!(ua(&t, &b), None, "the other nexus keeps its state");
    assert_eq!(t.submit(&a, l0(), 1, &READ1, &[], 512).status, Status::Good);
}

#[test]
fn a_command_beyond_the_queue_depth_gets_task_set_full_without_running() {
    let (g, rx) = Gated::new(64);
    let t = Arc::new(Target::new());
    let cfg = DeviceConfig {
        queue_depth: 2,
        ..Default::default()
    };
    t.add_lun(None, l0(), Arc::new(Device::new(cfg, g.clone()).unwrap()));
    let (a, b, c) = (
        Nexus::new("a", "p"),
        Nexus::new("b", "p"),
        Nexus::new("c", "p"),
    );
    for n in [&a, &b, &c] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    let h1 = spawn_read(&t, &a, 1);
    let h2 = spawn_read(&t, &b, 1);
    rx.recv().unwrap();
    rx.recv().unwrap();
    assert_eq!(t.task_set_len(&a, l0()), 2);
    // A third command (a WRITE, which the gate does not hold) finds the
    // task set full and does not run: TASK SET FULL to a nexus with a
    // task there, BUSY to one without (SAM-5 5.3.1).
    let w = [0x2a, 0, 0, 0, 0, 9, 0, 0, 1, 0];
    for (n, tag, want) in [
        (&a, 2, Status::TaskSetFull),
        (&b, 2, Status::TaskSetFull),
        (&c, 1, Status::Busy),
    ] {
        let r = t.submit(n, l0(), tag, &w, &[0x5a; 512], 512);
        assert_eq!(r.status, want);
        assert!(r.sense.is_none());
    }
    assert_eq!(u8::from(Status::TaskSetFull), 0x28);
    assert_eq!(t.task_set_len(&a, l0()), 2);
    g.open();
    assert_eq!(h1.join().unwrap().status, Status::Good);
    assert_eq!(h2.join().unwrap().status, Status::Good);
    // The refused write left block 9 as it was; with room again, it runs.
    let r = t.submit(&a, l0(), 3, &[0x28, 0, 0, 0, 0, 9, 0, 0, 1, 0], &[], 512);
    assert!(r.data_in.iter().all(|&x| x == 0));
    assert_eq!(
        t.submit(&a, l0(), 4, &w, &[0x5a; 512], 512).status,
        Status::Good
    );
    let r = t.submit(&a, l0(), 5, &[0x28, 0, 0, 0, 0, 9, 0, 0, 1, 0], &[], 512);
    assert!(r.data_in.iter().all(|&x| x == 0x5a));
    let zero = DeviceConfig {
        queue_depth: 0,
        ..Default::default()
    };
    assert!(Device::new(zero, Arc::new(Ram::new(4096))).is_err());
}
