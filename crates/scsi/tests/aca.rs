//! Auto contingent allegiance (SAM-5 5.9): a CHECK CONDITION with NACA=1
//! establishes ACA for the faulted I_T nexus; the task manager then admits
//! only that nexus's ACA task; CLEAR ACA, resets, nexus loss and PREEMPT
//! AND ABORT end it. Without NormACA, NACA=1 is an invalid CDB field.

mod common;

use common::{l0, spawn_attr, wait_entered, Gated};
use scsi::sense::FieldPointer;
use scsi::*;
use std::sync::{mpsc, Arc};

/// READ(10) of one block at `lba` with CONTROL byte `control`.
fn read10(lba: u32, control: u8) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&[0, 0, 1, control]);
    c
}

const NACA: u8 = 0x04;
/// Past the end of the 64-block LU.
const OUT_OF_RANGE: u32 = 1000;

fn setup_with(cfg: DeviceConfig) -> (Arc<Target>, Arc<Gated>, mpsc::Receiver<()>, Nexus, Nexus) {
    let (g, rx) = Gated::new(64);
    g.open();
    let t = Target::new();
    t.add_lun(None, l0(), Arc::new(Device::new(cfg, g.clone()).unwrap()));
    let a = Nexus::new("a", "p");
    let b = Nexus::new("b", "p");
    for n in [&a, &b] {
        let r = t.execute(n, l0(), &[0; 6], &[], 0);
        assert_eq!(r.sense.unwrap().asc, Asc::POWER_ON_RESET);
    }
    (Arc::new(t), g, rx, a, b)
}

fn setup() -> (Arc<Target>, Arc<Gated>, mpsc::Receiver<()>, Nexus, Nexus) {
    setup_with(DeviceConfig::default())
}

fn submit(t: &Target, n: &Nexus, tag: u64, attr: TaskAttr, cdb: &[u8]) -> ScsiResponse {
    t.submit_attr(n, l0(), tag, attr, cdb, &[], 512)
}

/// Faults nexus `n`: a READ past the end with NACA=1.
fn fault(t: &Target, n: &Nexus) {
    let r = submit(t, n, 99, TaskAttr::Simple, &read10(OUT_OF_RANGE, NACA));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(t.aca_faulted(n, l0()).as_ref(), Some(n));
}

fn sense_of(r: &ScsiResponse) -> (SenseKey, Asc) {
    let s = r.sense.expect("sense data");
    (s.key, s.asc)
}

#[test]
fn inquiry_says_norm_aca_when_supported() {
    for (norm_aca, bit) in [(true, 0x20), (false, 0)] {
        let (t, _, _, a, _) = setup_with(DeviceConfig {
            norm_aca,
            ..Default::default()
        });
        let r = t.execute(&a, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36);
        assert_eq!(r.status, Status::Good);
        // SPC-4 6.6.2: byte 3 = NORMACA (bit 5) | response data format 2.
        assert_eq!(r.data_in[3], 0x02 | bit);
    }
}

#[test]
fn naca_without_norm_aca_is_an_invalid_field_on_the_control_byte() {
    let (t, _, _, a, _) = setup_with(DeviceConfig {
        norm_aca: false,
        ..Default::default()
    });
    // TEST UNIT READY (6), READ(10), READ(16) and an opcode the table lacks
    // whose group code says 10 bytes: the pointer is on the CONTROL byte.
    let mut read16 = vec![0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, NACA];
    let cases: [(Vec<u8>, u16, Asc); 4] = [
        (vec![0, 0, 0, 0, 0, NACA], 5, Asc::INVALID_FIELD_IN_CDB),
        (read10(0, NACA), 9, Asc::INVALID_FIELD_IN_CDB),
        (read16.clone(), 15, Asc::INVALID_FIELD_IN_CDB),
        // Unknown opcode: INVALID COMMAND OPERATION CODE comes first.
        (
            vec![0x3f, 0, 0, 0, 0, 0, 0, 0, 0, NACA],
            0,
            Asc::INVALID_COMMAND_OPERATION_CODE,
        ),
    ];
    for (cdb, byte, asc) in cases {
        let r = submit(&t, &a, 1, TaskAttr::Simple, &cdb);
        assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}");
        let s = r.sense.unwrap();
        assert_eq!((s.key, s.asc), (SenseKey::IllegalRequest, asc));
        if asc == Asc::INVALID_FIELD_IN_CDB {
            assert_eq!(
                s.field,
                Some(FieldPointer {
                    in_cdb: true,
                    byte,
                    bit: Some(2)
                })
            );
            assert_eq!(t.plan(&a, l0(), &cdb), Err(s));
        }
        // No ACA condition: the next command runs.
        assert_eq!(t.aca_faulted(&a, l0()), None);
        assert_eq!(
            submit(&t, &a, 2, TaskAttr::Simple, &read10(0, 0)).status,
            Status::Good
        );
    }
    // Without NACA the same READ(16) runs.
    read16[15] = 0;
    assert_eq!(
        submit(&t, &a, 3, TaskAttr::Simple, &read16).status,
        Status::Good
    );
}

#[test]
fn aca_admits_only_the_faulted_nexus_aca_task_until_clear_aca() {
    let (t, _, _, a, b) = setup();
    // A CHECK CONDITION with NACA=0 leaves no ACA; a good NACA=1 command neither.
    let r = submit(&t, &a, 1, TaskAttr::Simple, &read10(OUT_OF_RANGE, 0));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(
        submit(&t, &a, 1, TaskAttr::Simple, &read10(0, NACA)).status,
        Status::Good
    );
    assert_eq!(t.aca_faulted(&a, l0()), None);
    // An ACA task without an ACA condition (SAM-5 8.6.5).
    let r = submit(&t, &a, 1, TaskAttr::Aca, &read10(0, 0));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(
        sense_of(&r),
        (SenseKey::IllegalRequest, Asc::INVALID_MESSAGE_ERROR)
    );
    assert_eq!(t.aca_faulted(&a, l0()), None);

    fault(&t, &a);
    // The faulted nexus: anything but an ACA task gets ACA ACTIVE, with no
    // sense and nothing moved, by either entry point.
    for attr in [TaskAttr::Simple, TaskAttr::Ordered, TaskAttr::HeadOfQueue] {
        let r = submit(&t, &a, 2, attr, &read10(0, 0));
        assert_eq!(
            (r.status, r.sense, r.data_in.len()),
            (Status::AcaActive, None, 0)
        );
        assert_eq!(r.residual, Residual::Under(512));
    }
    assert_eq!(
        t.execute(&a, l0(), &read10(0, 0), &[], 512).status,
        Status::AcaActive
    );
    // Other nexuses: BUSY when NACA=0, ACA ACTIVE when NACA=1 or for an
    // ACA task (SAM-5 5.9.2.3).
    assert_eq!(
        submit(&t, &b, 2, TaskAttr::Simple, &read10(0, 0)).status,
        Status::Busy
    );
    assert_eq!(t.execute(&b, l0(), &[0; 6], &[], 0).status, Status::Busy);
    assert_eq!(
        submit(&t, &b, 2, TaskAttr::Simple, &read10(0, NACA)).status,
        Status::AcaActive
    );
    assert_eq!(
        submit(&t, &b, 2, TaskAttr::Aca, &read10(0, 0)).status,
        Status::AcaActive
    );
    assert_eq!(u8::from(Status::AcaActive), 0x30);
    assert_eq!(u8::from(Status::Busy), 0x08);
    // The faulted nexus's ACA task runs (REQUEST SENSE, then a READ).
    let r = submit(&t, &a, 3, TaskAttr::Aca, &[0x03, 0, 0, 0, 18, 0]);
    assert_eq!(r.status, Status::Good);
    assert_eq!(
        submit(&t, &a, 4, TaskAttr::Aca, &read10(5, 0)).status,
        Status::Good
    );
    // CLEAR ACA from another nexus is rejected and changes nothing; the
    // two-outcome API reports it as a failed function.
    assert_eq!(
        t.tmf(&b, l0(), Tmf::ClearAca),
        ServiceResponse::FunctionRejected
    );
    assert_eq!(
        t.task_management(&b, l0(), Tmf::ClearAca),
        TmfResponse::IncorrectLun
    );
    assert_eq!(t.aca_faulted(&b, l0()).as_ref(), Some(&a));
    assert_eq!(
        t.tmf(&a, Lun::new(7).unwrap(), Tmf::ClearAca),
        ServiceResponse::IncorrectLun
    );
    // From the faulted nexus it ends the condition; everyone runs again,
    // and CLEAR ACA with no condition is a no-op that completes.
    assert_eq!(
        t.tmf(&a, l0(), Tmf::ClearAca),
        ServiceResponse::FunctionComplete
    );
    assert_eq!(t.aca_faulted(&a, l0()), None);
    assert_eq!(
        submit(&t, &a, 5, TaskAttr::Simple, &read10(0, 0)).status,
        Status::Good
    );
    assert_eq!(
        t.execute(&b, l0(), &read10(0, 0), &[], 512).status,
        Status::Good
    );
    assert_eq!(
        t.tmf(&a, l0(), Tmf::ClearAca),
        ServiceResponse::FunctionComplete
    );
    // ACA established through `execute` too.
    let r = t.execute(&b, l0(), &read10(OUT_OF_RANGE, NACA), &[], 512);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(t.aca_faulted(&a, l0()).as_ref(), Some(&b));
    assert_eq!(t.execute(&a, l0(), &[0; 6], &[], 0).status, Status::Busy);
}

#[test]
fn the_aca_task_failing_keeps_aca_with_naca_and_ends_it_without() {
    let (t, _, _, a, b) = setup();
    fault(&t, &a);
    // A good ACA task leaves the condition.
    assert_eq!(
        submit(&t, &a, 1, TaskAttr::Aca, &read10(0, 0)).status,
        Status::Good
    );
    assert_eq!(t.aca_faulted(&a, l0()).as_ref(), Some(&a));
    // An ACA task failing with NACA=1: still in ACA.
    let r = submit(&t, &a, 1, TaskAttr::Aca, &read10(OUT_OF_RANGE, NACA));
    assert_eq!(
        sense_of(&r),
        (SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE)
    );
    assert_eq!(t.aca_faulted(&a, l0()).as_ref(), Some(&a));
    assert_eq!(
        submit(&t, &b, 1, TaskAttr::Simple, &read10(0, 0)).status,
        Status::Busy
    );
    // An ACA task failing with NACA=0 ends it (SAM-5 5.9.1).
    let r = submit(&t, &a, 1, TaskAttr::Aca, &read10(OUT_OF_RANGE, 0));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(t.aca_faulted(&a, l0()), None);
    assert_eq!(
        submit(&t, &b, 1, TaskAttr::Simple, &read10(0, 0)).status,
        Status::Good
    );
}

#[test]
fn tasks_in_the_task_set_are_blocked_until_aca_ends() {
    let (t, g, rx, a, b) = setup();
    g.close();
    let write7 = vec![0x2a, 0, 0, 0, 0, 7, 0, 0, 1, 0];
    // b: a READ held in the backend, an ORDERED write of LBA 7 behind it.
    let h1 = spawn_attr(&t, &b, 1, TaskAttr::Simple, read10(0, 0), Vec::new());
    rx.recv().unwrap();
    let h2 = spawn_attr(&t, &b, 2, TaskAttr::Ordered, write7, vec![0xab; 512]);
    wait_entered(&t, &b, 2);
    // a faults with a HEAD OF QUEUE command that passes them both.
    let r = submit(
        &t,
        &a,
        3,
        TaskAttr::HeadOfQueue,
        &read10(OUT_OF_RANGE, NACA),
    );
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(t.aca_faulted(&a, l0()).as_ref(), Some(&a));
    // The running READ completes; the ORDERED write stays blocked (QERR
    // 00b: blocked, not aborted) while a's ACA task runs and reads LBA 7's
    // old contents.
    g.open();
    assert_eq!(h1.join().unwrap().status, Status::Good);
    let r = submit(&t, &a, 4, TaskAttr::Aca, &read10(7, 0));
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data_in, vec![0; 512]);
    assert!(!h2.is_finished());
    assert_eq!(t.task_set_len(&a, l0()), 1);
    // CLEAR ACA: the write runs.
    assert_eq!(
        t.tmf(&a, l0(), Tmf::ClearAca),
        ServiceResponse::FunctionComplete
    );
    assert_eq!(h2.join().unwrap().status, Status::Good);
    let r = submit(&t, &a, 5, TaskAttr::Simple, &read10(7, 0));
    assert_eq!(r.data_in, vec![0xab; 512]);
}

#[test]
fn clear_aca_aborts_the_aca_task_and_only_one_runs_at_a_time() {
    let (t, g, rx, a, _) = setup();
    fault(&t, &a);
    g.close();
    let h = spawn_attr(&t, &a, 1, TaskAttr::Aca, read10(0, 0), Vec::new());
    rx.recv().unwrap();
    // A second ACA task while the first runs: ACA ACTIVE.
    assert_eq!(
        submit(&t, &a, 2, TaskAttr::Aca, &read10(1, 0)).status,
        Status::AcaActive
    );
    assert_eq!(
        t.tmf(&a, l0(), Tmf::ClearAca),
        ServiceResponse::FunctionComplete
    );
    g.open();
    let r = h.join().unwrap();
    assert_eq!((r.status, r.data_in.len()), (Status::TaskAborted, 0));
    assert_eq!(t.aca_faulted(&a, l0()), None);
}

#[test]
fn resets_and_nexus_loss_end_aca() {
    let (t, _, _, a, b) = setup();
    // LOGICAL UNIT RESET from any nexus ends it (and leaves its unit attention).
    fault(&t, &a);
    assert_eq!(
        t.task_management(&b, l0(), Tmf::LogicalUnitReset),
        TmfResponse::FunctionComplete
    );
    assert_eq!(t.aca_faulted(&a, l0()), None);
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(
        sense_of(&r),
        (SenseKey::UnitAttention, Asc::BUS_DEVICE_RESET)
    );
    assert_eq!(
        t.execute(&b, l0(), &[0; 6], &[], 0).sense.unwrap().asc,
        Asc::BUS_DEVICE_RESET
    );
    // I_T NEXUS RESET of another nexus leaves it; of the faulted one ends it.
    fault(&t, &a);
    t.task_management(&b, l0(), Tmf::ItNexusReset);
    assert_eq!(t.aca_faulted(&a, l0()).as_ref(), Some(&a));
    t.task_management(&a, l0(), Tmf::ItNexusReset);
    assert_eq!(t.aca_faulted(&a, l0()), None);
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(sense_of(&r), (SenseKey::UnitAttention, Asc::I_T_NEXUS_LOSS));
}

#[test]
fn preempt_and_abort_of_the_faulted_nexus_ends_aca() {
    let (t, _, _, a, b) = setup();
    let pr_out = |n: &Nexus, sa: u8, key: u64, sa_key: u64| {
        let mut p = key.to_be_bytes().to_vec();
        p.extend_from_slice(&sa_key.to_be_bytes());
        p.resize(24, 0);
        submit_out(&t, n, &[0x5f, sa, 1, 0, 0, 0, 0, 0, 24, 0], &p)
    };
    assert_eq!(pr_out(&a, 0, 0, 0xa).status, Status::Good);
    assert_eq!(pr_out(&b, 0, 0, 0xb).status, Status::Good);
    fault(&t, &a);
    // Other PR OUT service actions from b are BUSY; PREEMPT AND ABORT of
    // a's key runs and ends a's ACA condition (SPC-4 5.12.11.2.6).
    assert_eq!(pr_out(&b, 1, 0xb, 0).status, Status::Busy);
    assert_eq!(pr_out(&b, 5, 0xb, 0xa).status, Status::Good);
    assert_eq!(t.aca_faulted(&a, l0()), None);
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(
        sense_of(&r),
        (SenseKey::UnitAttention, Asc::REGISTRATIONS_PREEMPTED)
    );
}

fn submit_out(t: &Target, n: &Nexus, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    t.submit_attr(n, l0(), 50, TaskAttr::Simple, cdb, data, data.len() as u64)
}
