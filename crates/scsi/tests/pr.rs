//! Persistent reservations: registration, reservation types, conflicts per
//! I_T nexus, release/clear/preempt and the unit attentions they leave.

mod common;

use common::{l0, pr_out};

use scsi::*;
use std::sync::Arc;

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
    let r = t.execute(&a, l0(), &[0x5f, 8, 1, 0, 0, 0, 0, 0, 24, 0], &[0; 24], 24);
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

/// A ram LU whose APTPL state lives in a file of its own directory;
/// `boot` is a restart: a new target over the same store and file.
struct Persisted {
    dir: common::TempDir,
    store: Arc<dyn Backend>,
    cfg: DeviceConfig,
}

impl Persisted {
    fn new(tag: &str) -> Persisted {
        let dir = common::TempDir::new(tag);
        let cfg = DeviceConfig {
            pr_file: Some(dir.path("lun0.pr")),
            ..Default::default()
        };
        Persisted {
            dir,
            store: Arc::new(Ram::new(64 * 512)),
            cfg,
        }
    }

    fn boot_with(&self, cfg: &DeviceConfig) -> Target {
        let t = Target::new();
        let dev = Device::new(cfg.clone(), self.store.clone()).unwrap();
        t.add_lun(None, l0(), Arc::new(dev));
        t
    }

    fn boot(&self) -> Target {
        self.boot_with(&self.cfg)
    }
}

#[test]
fn aptpl_state_survives_restart() {
    let lu = Persisted::new("pr");
    let (file, cfg, store) = (lu.dir.path("lun0.pr"), lu.cfg.clone(), lu.store.clone());
    let boot = |cfg: &DeviceConfig| lu.boot_with(cfg);
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
}

/// REGISTER AND MOVE parameter list (SPC-4 6.16.4): keys, UNREG/APTPL in
/// byte 17, relative target port identifier, TransportID length, TransportID.
fn move_params(key: u64, sa_key: u64, flags: u8, rtpi: u16, tid: &[u8]) -> Vec<u8> {
    let mut p = key.to_be_bytes().to_vec();
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0, flags]);
    p.extend_from_slice(&rtpi.to_be_bytes());
    p.extend_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend_from_slice(tid);
    p
}

fn register_and_move(t: &Target, n: &Nexus, p: &[u8]) -> ScsiResponse {
    let len = p.len() as u8;
    t.execute(n, l0(), &[0x5f, 7, 0, 0, 0, 0, 0, 0, len, 0], p, len as u64)
        .clone()
}

fn srp_tid(id_last: u8) -> Vec<u8> {
    let mut tid = vec![0u8; 24];
    tid[0] = 0x04; // SRP, format 00b
    tid[23] = id_last;
    tid
}

fn srp_name(id_last: u8) -> String {
    format!("0x{}{id_last:02x}", "0".repeat(30))
}

fn check(r: &ScsiResponse) -> (SenseKey, Asc, Option<u16>) {
    let s = r.sense.expect("CHECK CONDITION");
    (s.key, s.asc, s.field.map(|f| f.byte))
}

#[test]
fn register_and_move_to_an_srp_initiator() {
    let t = Target::new();
    let dev = Device::new(DeviceConfig::default(), Arc::new(Ram::new(64 * 512))).unwrap();
    t.add_lun(None, l0(), Arc::new(dev));
    let a = Nexus::from_transport_id(&TransportId::parse(&srp_tid(1)).unwrap().0, "port-a");
    assert_eq!(&*a.initiator, srp_name(1));
    let b = Nexus::new(&srp_name(2), "port-b");
    for n in [&a, &b] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    let rtpi_b = t.relative_port_id("port-b");
    assert_ne!(rtpi_b, t.relative_port_id("port-a"));
    // VPD 83h carries the relative target port designator of the nexus.
    let r = t.execute(&b, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    let tail = &r.data_in[r.data_in.len() - 8..];
    assert_eq!(tail, &[0x01, 0x14, 0, 4, 0, 0, 0, rtpi_b as u8]);
    assert_eq!(
        u16::from_be_bytes([r.data_in[2], r.data_in[3]]) as usize,
        r.data_in.len() - 4
    );

    // No registration: conflict. No reservation: ILLEGAL REQUEST.
    let p = move_params(0xa, 0xb, 0, rtpi_b, &srp_tid(2));
    assert_eq!(register_and_move(&t, &a, &p).status, RC);
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 0xa), OK);
    assert_eq!(
        check(&register_and_move(&t, &a, &p)).0,
        SenseKey::IllegalRequest
    );
    // A registrant that does not hold the reservation: conflict.
    assert_eq!(pr_out(&t, &b, 0, 0, 0, 0xbb), OK);
    assert_eq!(pr_out(&t, &b, 1, 1, 0xbb, 0), OK);
    assert_eq!(register_and_move(&t, &a, &p).status, RC);
    assert_eq!(pr_out(&t, &b, 2, 1, 0xbb, 0), OK);
    assert_eq!(pr_out(&t, &a, 1, 3, 0xa, 0), OK); // a holds EA
    let bad_param = |r: &ScsiResponse| {
        let (k, asc, byte) = check(r);
        assert_eq!(
            (k, asc),
            (
                SenseKey::IllegalRequest,
                Asc::INVALID_FIELD_IN_PARAMETER_LIST
            )
        );
        byte
    };
    // The TransportID names the issuer itself.
    let me = move_params(0xa, 0xb, 0, rtpi_b, &srp_tid(1));
    assert_eq!(bad_param(&register_and_move(&t, &a, &me)), Some(24));
    // Unknown relative target port; zero service action key; SAS TransportID.
    let p_bad = move_params(0xa, 0xb, 0, 77, &srp_tid(2));
    assert_eq!(bad_param(&register_and_move(&t, &a, &p_bad)), Some(18));
    let p_bad = move_params(0xa, 0, 0, rtpi_b, &srp_tid(2));
    assert_eq!(bad_param(&register_and_move(&t, &a, &p_bad)), Some(8));
    let mut sas = srp_tid(2);
    sas[0] = 0x06;
    let p_bad = move_params(0xa, 0xb, 0, rtpi_b, &sas);
    assert_eq!(bad_param(&register_and_move(&t, &a, &p_bad)), Some(24));
    // TransportID length past the parameter list.
    let mut short = move_params(0xa, 0xb, 0, rtpi_b, &srp_tid(2));
    short.truncate(40);
    assert_eq!(
        check(&register_and_move(&t, &a, &short)).1,
        Asc::PARAMETER_LIST_LENGTH_ERROR
    );
    // An initiator whose LUN map (a group without this LU) hides it.
    t.add_group("masked");
    t.add_initiator("masked", &srp_name(3));
    let hidden = move_params(0xa, 0xb, 0, rtpi_b, &srp_tid(3));
    assert_eq!(bad_param(&register_and_move(&t, &a, &hidden)), Some(24));
    // Wrong reservation key: conflict. Nothing moved so far.
    let wrong = move_params(0xbad, 0xb, 0, rtpi_b, &srp_tid(2));
    assert_eq!(register_and_move(&t, &a, &wrong).status, RC);
    assert_eq!((read(&t, &a), read(&t, &b)), (OK, RC));

    // The move: b gets key 0xb and the Exclusive Access reservation; a
    // stays registered (UNREG 0) but loses access.
    assert_eq!(register_and_move(&t, &a, &p).status, OK);
    assert_eq!((read(&t, &a), read(&t, &b)), (RC, OK));
    let r = t.execute(&a, l0(), &[0x5e, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[8..16], &0xbu64.to_be_bytes());
    assert_eq!(r.data_in[21], 3);
    let keys = t.execute(&a, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&keys.data_in[4..8], &[0, 0, 0, 16]);

    // READ FULL STATUS: one descriptor per registrant with its TransportID.
    let r = t.execute(&a, l0(), &[0x5e, 3, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(r.status, OK);
    assert_eq!(u32::from_be_bytes(r.data_in[4..8].try_into().unwrap()), 96);
    let descs: Vec<&[u8]> = r.data_in[8..].chunks(48).collect();
    let of = |last: u8| {
        *descs
            .iter()
            .find(|d| d[24..48] == srp_tid(last)[..])
            .expect("descriptor with the SRP TransportID")
    };
    let (da, db) = (of(1), of(2));
    assert_eq!(&db[0..8], &0xbu64.to_be_bytes());
    assert_eq!((db[12], db[13]), (1, 3)); // R_HOLDER, type EA
    assert_eq!(u16::from_be_bytes([db[18], db[19]]), rtpi_b);
    assert_eq!(&db[20..24], &[0, 0, 0, 24]);
    assert_eq!(&da[0..8], &0xau64.to_be_bytes());
    assert_eq!(da[12], 0);
    assert_eq!(
        u16::from_be_bytes([da[18], da[19]]),
        t.relative_port_id("port-a")
    );

    // Back to a with UNREG: b's registration goes, a holds again.
    let back = move_params(0xb, 0xa2, 0x02, t.relative_port_id("port-a"), &srp_tid(1));
    assert_eq!(register_and_move(&t, &b, &back).status, OK);
    assert_eq!((read(&t, &a), read(&t, &b)), (OK, RC));
    let keys = t.execute(&a, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(
        &keys.data_in[4..16],
        &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xa2]
    );
}

#[test]
fn register_and_move_refuses_all_registrants_reservations() {
    let (t, [a, b, _]) = setup();
    let rtpi = t.relative_port_id("p");
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 0xa), OK);
    for ty in [7, 8] {
        assert_eq!(pr_out(&t, &a, 1, ty, 0xa, 0), OK);
        let tid = b.transport_id().unwrap().emit();
        let p = move_params(0xa, 0xb, 0, rtpi, &tid);
        // SPC-4 5.12.8: RESERVATION CONFLICT for WEAR and EAAR.
        assert_eq!(register_and_move(&t, &a, &p).status, RC);
        assert_eq!(pr_out(&t, &a, 2, ty, 0xa, 0), OK);
    }
}

#[test]
fn report_capabilities_is_honest() {
    let (t, [a, _, _]) = setup();
    let r = t.execute(&a, l0(), &[0x5e, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[], 8);
    // LENGTH 8; SIP_C, ATP_C, PTPL_C 0 (no PR file); TMV; all six types.
    assert_eq!(r.data_in, [0, 8, 0, 0x80, 0xea, 0x01, 0, 0]);
    // SPEC_I_PT and ALL_TG_PT, which it says it lacks, are refused.
    for (bit, flag) in [(3, 0x08), (2, 0x04)] {
        let mut p = vec![0u8; 24];
        p[8..16].copy_from_slice(&5u64.to_be_bytes());
        p[20] = flag;
        let r = t.execute(&a, l0(), &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24);
        let s = r.sense.unwrap();
        assert_eq!(s.asc, Asc::INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(s.field.unwrap().bit, Some(bit));
    }
}

#[test]
fn aptpl_keeps_a_moved_registration() {
    let lu = Persisted::new("pr-move");
    let file = lu.dir.path("lun0.pr");
    let boot = || lu.boot();
    let a = Nexus::new(&srp_name(1), "p");
    let b = Nexus::new(&srp_name(2), "q");
    let t = boot();
    for n in [&a, &b] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    let r = t.execute(&a, l0(), &[0x5e, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[], 8);
    assert_eq!((r.data_in[2], r.data_in[3]), (0x01, 0x80)); // PTPL_C, PTPL_A 0
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 0xa), OK);
    assert_eq!(pr_out(&t, &a, 1, 1, 0xa, 0), OK);
    // Move with UNREG and APTPL.
    let p = move_params(0xa, 0xb, 0x03, t.relative_port_id("q"), &srp_tid(2));
    assert_eq!(register_and_move(&t, &a, &p).status, OK);
    assert!(file.exists());
    let r = t.execute(&a, l0(), &[0x5e, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[], 8);
    assert_eq!(r.data_in[3], 0x81); // PTPL_A
    drop(t);
    let t = boot();
    for n in [&a, &b] {
        t.execute(n, l0(), &[0; 6], &[], 0);
    }
    assert_eq!((write(&t, &a), write(&t, &b)), (RC, OK));
    let r = t.execute(&a, l0(), &[0x5e, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
    assert_eq!(&r.data_in[8..16], &0xbu64.to_be_bytes());
}

#[test]
fn registrants_only_and_all_registrants_types_conflict_per_spc4_table() {
    // SPC-4 table 196: type 6 (EXCLUSIVE ACCESS - REGISTRANTS ONLY) keeps
    // non-registrants from reading and writing; type 7 (WRITE EXCLUSIVE -
    // ALL REGISTRANTS) only from writing. Registrants do both.
    for (ty, c_reads) in [(6u8, RC), (7, OK)] {
        let (t, [a, b, c]) = setup();
        assert_eq!(pr_out(&t, &a, 0, 0, 0, 0xaa), OK);
        assert_eq!(pr_out(&t, &b, 0, 0, 0, 0xbb), OK);
        assert_eq!(pr_out(&t, &a, 1, ty, 0xaa, 0), OK);
        assert_eq!((read(&t, &a), write(&t, &a)), (OK, OK), "type {ty}");
        assert_eq!((read(&t, &b), write(&t, &b)), (OK, OK), "type {ty}");
        assert_eq!((read(&t, &c), write(&t, &c)), (c_reads, RC), "type {ty}");
        // Another type is a conflict for the other registrant too.
        assert_eq!(pr_out(&t, &b, 1, 1, 0xbb, 0), RC);
        // READ RESERVATION shows the type.
        let r = t.execute(&c, l0(), &[0x5e, 1, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256);
        assert_eq!(r.data_in[21] & 0x0f, ty);
        // Once c registers it may do what registrants do.
        assert_eq!(pr_out(&t, &c, 0, 0, 0, 0xcc), OK);
        assert_eq!((read(&t, &c), write(&t, &c)), (OK, OK), "type {ty}");
        // A registrant unregistering loses access again.
        assert_eq!(pr_out(&t, &c, 0, 0, 0xcc, 0), OK);
        assert_eq!(write(&t, &c), RC, "type {ty}");
    }
}
