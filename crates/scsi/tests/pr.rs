//! Persistent reservations: registration, reservation types, conflicts per
//! I_T nexus, release/clear/preempt and the unit attentions they leave.

use scsi::*;
use std::sync::Arc;

fn l0() -> Lun {
    Lun::new(0).unwrap()
}

fn setup() -> (Target, [Nexus; 3]) {
    let t = Target::new();
    let dev = Device::new(DeviceConfig::default(), Arc::new(Ram::new(64 * 512))).unwrap();
    t.add_lun(None, l0(), Arc::new(dev));
    let ns = [
        Nexus::new("a", "p"),
        Nexus::new("b", "p"),
        Nexus::new("c", "p"),
    ];
    for n in &ns {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    (t, ns)
}

fn pr_out(t: &Target, n: &Nexus, sa: u8, ty: u8, key: u64, sa_key: u64) -> Status {
    let mut p = key.to_be_bytes().to_vec();
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    t.execute(n, l0(), &[0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], &p, 24)
        .status
}

fn read(t: &Target, n: &Nexus) -> Status {
    t.execute(n, l0(), &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512)
        .status
}

fn write(t: &Target, n: &Nexus) -> Status {
    t.execute(n, l0(), &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[7; 512], 512)
        .status
}

fn pending_ua(t: &Target, n: &Nexus) -> Option<Asc> {
    let r = t.execute(n, l0(), &[0; 6], &[], 0);
    r.sense
        .filter(|s| s.key == SenseKey::UnitAttention)
        .map(|s| s.asc)
}

const OK: Status = Status::Good;
const RC: Status = Status::ReservationConflict;

#[test]
fn write_exclusive_and_exclusive_access() {
    let (t, [a, b, c]) = setup();
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 0xaa), OK);
    assert_eq!(pr_out(&t, &b, 0, 0, 0, 0xbb), OK);
    // Wrong current key on REGISTER: conflict; REGISTER AND IGNORE works.
    assert_eq!(pr_out(&t, &b, 0, 0, 0x12, 0xbc), RC);
    assert_eq!(pr_out(&t, &b, 6, 0, 0, 0xbb), OK);
    // RESERVE with an unregistered nexus or wrong key: conflict.
    assert_eq!(pr_out(&t, &c, 1, 1, 0xcc, 0), RC);
    assert_eq!(pr_out(&t, &a, 1, 1, 0xbb, 0), RC);
    assert_eq!(pr_out(&t, &a, 1, 1, 0xaa, 0), OK); // Write Exclusive
    assert_eq!((read(&t, &b), write(&t, &b), write(&t, &c)), (OK, RC, RC));
    assert_eq!(write(&t, &a), OK);
    // Another type while reserved: conflict; same type by holder: OK.
    assert_eq!(pr_out(&t, &a, 1, 3, 0xaa, 0), RC);
    assert_eq!(pr_out(&t, &a, 1, 1, 0xaa, 0), OK);
    // READ KEYS and READ RESERVATION.
    let r = t.execute(&c, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[4..8], &[0, 0, 0, 16]);
    assert_eq!(
        &r.data_in[8..24],
        &[0, 0, 0, 0, 0, 0, 0, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0xbb]
    );
    let r = t.execute(&c, l0(), &[0x5e, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[4..8], &[0, 0, 0, 16]);
    assert_eq!(&r.data_in[8..16], &0xaau64.to_be_bytes());
    assert_eq!(r.data_in[21], 1);
    // RELEASE with the wrong type is refused; right type frees the LU.
    let r = t.execute(
        &a,
        l0(),
        &[0x5f, 2, 3, 0, 0, 0, 0, 0, 24, 0],
        &{
            let mut p = 0xaau64.to_be_bytes().to_vec();
            p.resize(24, 0);
            p
        },
        24,
    );
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_RELEASE_OF_PR);
    assert_eq!(pr_out(&t, &a, 2, 1, 0xaa, 0), OK);
    assert_eq!(write(&t, &c), OK);
    // Exclusive Access: other nexuses cannot even read.
    assert_eq!(pr_out(&t, &b, 1, 3, 0xbb, 0), OK);
    assert_eq!((read(&t, &a), read(&t, &c), read(&t, &b)), (RC, RC, OK));
    // INQUIRY and TEST UNIT READY are never in conflict.
    assert_eq!(
        t.execute(&c, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36).status,
        OK
    );
    assert_eq!(t.execute(&c, l0(), &[0; 6], &[], 0).status, OK);
}

#[test]
fn registrants_only_release_clear_preempt() {
    let (t, [a, b, c]) = setup();
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 1), OK);
    assert_eq!(pr_out(&t, &b, 0, 0, 0, 2), OK);
    assert_eq!(pr_out(&t, &a, 1, 5, 1, 0), OK); // WE registrants only
    assert_eq!((write(&t, &b), write(&t, &c), read(&t, &c)), (OK, RC, OK));
    // Release of a registrants-only type tells the other registrants.
    assert_eq!(pr_out(&t, &a, 2, 5, 1, 0), OK);
    assert_eq!(pending_ua(&t, &b), Some(Asc::RESERVATIONS_RELEASED));
    assert_eq!(pending_ua(&t, &c), None);
    // PREEMPT: b removes a's registration and takes the reservation.
    assert_eq!(pr_out(&t, &a, 1, 1, 1, 0), OK);
    assert_eq!(pr_out(&t, &b, 4, 3, 2, 1), OK);
    assert_eq!(pending_ua(&t, &a), Some(Asc::REGISTRATIONS_PREEMPTED));
    assert_eq!((read(&t, &a), write(&t, &b)), (RC, OK));
    // a is no longer registered: its old key does nothing.
    assert_eq!(pr_out(&t, &a, 2, 3, 1, 0), RC);
    // CLEAR by b drops everything and tells the other registrants.
    assert_eq!(pr_out(&t, &c, 0, 0, 0, 3), OK);
    assert_eq!(pr_out(&t, &b, 3, 0, 2, 0), OK);
    assert_eq!(pending_ua(&t, &c), Some(Asc::RESERVATIONS_PREEMPTED));
    assert_eq!((read(&t, &a), write(&t, &c)), (OK, OK));
    let r = t.execute(&c, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[4..8], &[0, 0, 0, 0]);
}

#[test]
fn all_registrants_and_bad_fields() {
    let (t, [a, b, c]) = setup();
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 1), OK);
    assert_eq!(pr_out(&t, &b, 0, 0, 0, 2), OK);
    assert_eq!(pr_out(&t, &a, 1, 8, 1, 0), OK); // EA all registrants
    assert_eq!((read(&t, &b), write(&t, &b), read(&t, &c)), (OK, OK, RC));
    // Reservation stays while any registrant remains.
    assert_eq!(pr_out(&t, &a, 0, 0, 1, 0), OK);
    assert_eq!(read(&t, &c), RC);
    assert_eq!(pr_out(&t, &b, 0, 0, 2, 0), OK);
    assert_eq!(read(&t, &c), OK);
    // Short parameter list, bad type, LU scope only, unknown service action.
    let r = t.execute(&a, l0(), &[0x5f, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[0; 8], 8);
    assert_eq!(r.sense.unwrap().asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 9), OK);
    let r = t.execute(
        &a,
        l0(),
        &[0x5f, 1, 2, 0, 0, 0, 0, 0, 24, 0],
        &[0, 0, 0, 0, 0, 0, 0, 9].repeat(3),
        24,
    );
    assert_eq!(r.sense.unwrap().field.unwrap().byte, 2);
    let r = t.execute(
        &a,
        l0(),
        &[0x5f, 1, 0x11, 0, 0, 0, 0, 0, 24, 0],
        &[0; 24],
        24,
    );
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_FIELD_IN_CDB);
    let r = t.execute(&a, l0(), &[0x5f, 7, 1, 0, 0, 0, 0, 0, 24, 0], &[0; 24], 24);
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn unit_attention_comes_before_reservation_conflict() {
    let (t, [a, b, _]) = setup();
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 1), OK);
    assert_eq!(pr_out(&t, &a, 1, 3, 1, 0), OK);
    let late = Nexus::new("late", "p");
    let r = t.execute(&late, l0(), &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512);
    assert_eq!(r.sense.unwrap().asc, Asc::POWER_ON_RESET);
    assert_eq!(read(&t, &late), RC);
    assert_eq!(read(&t, &b), RC);
}

#[test]
fn aptpl_state_survives_restart() {
    let dir = std::env::temp_dir().join(format!("scsi-pr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lun0.pr");
    let _ = std::fs::remove_file(&file);
    let store: Arc<dyn Backend> = Arc::new(Ram::new(64 * 512));
    let cfg = DeviceConfig {
        pr_file: Some(file.clone()),
        ..Default::default()
    };
    let boot = |cfg: &DeviceConfig| {
        let t = Target::new();
        t.add_lun(
            None,
            l0(),
            Arc::new(Device::new(cfg.clone(), store.clone()).unwrap()),
        );
        t
    };
    let a = Nexus::new("iqn.a with space", "p");
    let b = Nexus::new("b", "p");
    let t = boot(&cfg);
    for n in [&a, &b] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    // REGISTER with APTPL (parameter byte 20 bit 0), then reserve EA.
    let mut p = vec![0u8; 24];
    p[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    p[20] = 1;
    assert_eq!(
        t.execute(&a, l0(), &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24)
            .status,
        OK
    );
    assert_eq!(pr_out(&t, &a, 1, 3, 0x1234, 0), OK);
    assert!(file.exists());
    drop(t);
    // Restart: the registration and reservation are back.
    let t = boot(&cfg);
    for n in [&a, &b] {
        assert_eq!(pending_ua(&t, n), Some(Asc::POWER_ON_RESET));
    }
    assert_eq!((read(&t, &b), read(&t, &a)), (RC, OK));
    // Without a file path the state does not survive.
    let t2 = boot(&DeviceConfig::default());
    t2.execute(&b, l0(), &[0; 6], &[], 0);
    assert_eq!(read(&t2, &b), OK);
    // Re-registering without APTPL removes the file; a corrupt file is refused.
    assert_eq!(pr_out(&t, &a, 0, 0, 0x1234, 0x1234), OK);
    assert!(!file.exists());
    std::fs::write(&file, "key zz\n").unwrap();
    assert!(Device::new(cfg.clone(), store.clone()).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
