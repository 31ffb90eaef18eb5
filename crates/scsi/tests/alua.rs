//! ALUA (SPC-4 5.16): REPORT TARGET PORT GROUPS and SET TARGET PORT
//! GROUPS byte for byte, INQUIRY's TPGS and VPD 83h's designators, every
//! state's refusals, and the unit attention a change raises.

mod common;

use common::*;
use scsi::*;
use std::sync::Arc;

/// A target with a RAM disk at LUN 0 behind two ports, `pa` (relative
/// port 1, group 1) and `pb` (relative port 2, group 2), and a nexus
/// through each, past its power-on attention.
fn two_groups(a: AccessState, b: AccessState, explicit: bool) -> (Target, Nexus, Nexus) {
    let t = Target::new();
    let dev = Device::new(DeviceConfig::default(), Arc::new(Ram::new(64 * 512))).unwrap();
    t.add_lun(None, l0(), Arc::new(dev));
    t.set_relative_port_id("pa", 1).unwrap();
    t.set_relative_port_id("pb", 2).unwrap();
    let group = |id, state, rtpi| PortGroup {
        id,
        state,
        preferred: id == 1,
        ports: vec![rtpi],
        status: Default::default(),
    };
    t.set_alua(Alua {
        groups: vec![group(1, a, 1), group(2, b, 2)],
        explicit,
        transition_secs: 10,
    });
    let na = Nexus::new("i", "pa");
    let nb = Nexus::new("i", "pb");
    for n in [&na, &nb] {
        let r = t.execute(n, l0(), &[0; 6], &[], 0);
        assert_eq!(r.sense.unwrap().asc, Asc::POWER_ON_RESET);
    }
    (t, na, nb)
}

fn rtpg(format: u8, alloc: u32) -> Vec<u8> {
    let mut c = vec![0xa3, format << 5 | 0x0a, 0, 0, 0, 0];
    c.extend_from_slice(&alloc.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn stpg(params: &[u8]) -> Vec<u8> {
    let mut c = vec![0xa4, 0x0a, 0, 0, 0, 0];
    c.extend_from_slice(&(params.len() as u32).to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// STPG parameter list: four reserved bytes, then (state, group) pairs.
fn stpg_params(set: &[(u8, u16)]) -> Vec<u8> {
    let mut p = vec![0u8; 4];
    for &(state, g) in set {
        p.extend_from_slice(&[state, 0]);
        p.extend_from_slice(&g.to_be_bytes());
    }
    p
}

fn sense_of(r: &ScsiResponse) -> (SenseKey, Asc) {
    let s = r.sense.expect("CHECK CONDITION with sense");
    (s.key, s.asc)
}

#[test]
fn report_target_port_groups_bytes() {
    let (t, na, _) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, false);
    let descriptors = [
        // Group 1: PREF, state 0h (active/optimized).
        0x80, // PREF | ASYMMETRIC ACCESS STATE 0h
        0x8f, // T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP
        0x00, 0x01, // TARGET PORT GROUP 1
        0x00, // reserved
        0x00, // STATUS CODE: no status
        0x00, // vendor specific
        0x01, // TARGET PORT COUNT
        0x00, 0x00, 0x00, 0x01, // obsolete, RELATIVE TARGET PORT IDENTIFIER 1
        // Group 2: not preferred, state 2h (standby).
        0x02, 0x8f, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01, //
        0x00, 0x00, 0x00, 0x02, // relative port 2
    ];
    // PARAMETER DATA FORMAT 000b: RETURN DATA LENGTH only.
    let d = ok(&t, &na, &rtpg(0, 512), &[], 512);
    assert_eq!(&d[..4], &[0, 0, 0, 24]); // the 24 bytes after these four
    assert_eq!(&d[4..], &descriptors);
    // 001b: the extended header.
    let d = ok(&t, &na, &rtpg(1, 512), &[], 512);
    assert_eq!(
        &d[..8],
        &[
            0, 0, 0, 28,   // RETURN DATA LENGTH: 4 more header bytes + 24
            0x10, // FORMAT TYPE 001b
            10,   // IMPLICIT TRANSITION TIME, seconds
            0, 0, // reserved
        ]
    );
    assert_eq!(&d[8..], &descriptors);
    // The allocation length cuts the data (SPC-4 4.2.5.6).
    let r = t.execute(&na, l0(), &rtpg(0, 4), &[], 4);
    assert_eq!(
        (r.status, &r.data_in[..]),
        (Status::Good, &[0, 0, 0, 24][..])
    );
    // Formats 010b and up are reserved.
    let r = t.execute(&na, l0(), &rtpg(2, 512), &[], 512);
    assert_eq!(r.sense.unwrap(), Sense::invalid_field(1, Some(7)));
    // An implicit transition shows as STATUS CODE 02h.
    t.set_group_state(2, AccessState::ActiveNonOptimized)
        .unwrap();
    let _ = t.execute(&na, l0(), &[0; 6], &[], 0); // the unit attention
    let d = ok(&t, &na, &rtpg(0, 512), &[], 512);
    assert_eq!(&d[16..22], &[0x01, 0x8f, 0x00, 0x02, 0x00, 0x02]);
}

#[test]
fn inquiry_tpgs_and_designators() {
    let (t, na, nb) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, false);
    let std_inq = [0x12, 0, 0, 0, 36, 0];
    let d = ok(&t, &na, &std_inq, &[], 36);
    assert_eq!(d[5] & 0x30, 0x10, "TPGS 01b: implicit only");
    // VPD 83h through pb: relative port 2, then group 2, after the LU's own.
    let d = ok(&t, &nb, &[0x12, 1, 0x83, 1, 0, 0], &[], 256);
    let tail = &d[d.len() - 16..];
    assert_eq!(
        tail,
        &[
            0x01, 0x14, 0x00, 0x04, 0, 0, 0, 2, // target port, relative port 2
            0x01, 0x15, 0x00, 0x04, 0, 0, 0, 2, // target port, group 2
        ]
    );
    assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, d.len() - 4);
    // Explicit transitions enabled: TPGS 11b.
    let (t, na, _) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, true);
    assert_eq!(ok(&t, &na, &std_inq, &[], 36)[5] & 0x30, 0x30);
}

#[test]
fn no_groups_no_alua() {
    let (t, n) =
        target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(64 * 512))).unwrap());
    assert_eq!(ok(&t, &n, &[0x12, 0, 0, 0, 36, 0], &[], 36)[5] & 0x30, 0);
    let r = t.execute(&n, l0(), &rtpg(0, 512), &[], 512);
    assert_eq!(r.sense.unwrap(), Sense::invalid_field(1, Some(4)));
    let p = stpg_params(&[(0, 1)]);
    let r = t.execute(&n, l0(), &stpg(&p), &p, p.len() as u64);
    assert_eq!(r.sense.unwrap(), Sense::invalid_field(1, Some(4)));
    // VPD 83h has no group designator (type 5h).
    let d = ok(&t, &n, &[0x12, 1, 0x83, 1, 0, 0], &[], 256);
    assert!(!d.windows(2).any(|w| w == [0x01, 0x15]));
}

/// Every state against the commands SPC-4 5.16.2.4 names: `None` runs,
/// `Some(asc)` is NOT READY with it.
#[test]
fn every_state_refuses_what_spc4_says() {
    let read10 = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let write10 = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let tur = vec![0u8; 6];
    let mode_sense = vec![0x1a, 0x08, 0x3f, 0, 255, 0];
    let pr_in = vec![0x5e, 0, 0, 0, 0, 0, 0, 0x01, 0, 0];
    let inquiry = vec![0x12, 0, 0, 0, 36, 0];
    let report_luns = vec![0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let request_sense = vec![0x03, 0, 0, 0, 18, 0];
    let sync = vec![0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let read_capacity16 = vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let transition = Some(Asc::LU_NOT_ACCESSIBLE_TRANSITION);
    let standby = Some(Asc::LU_NOT_ACCESSIBLE_STANDBY);
    let unavailable = Some(Asc::LU_NOT_ACCESSIBLE_UNAVAILABLE);
    type Row<'a> = (&'a str, &'a [u8], [Option<Asc>; 3]);
    // Columns: standby, unavailable, transitioning.
    let rows: [Row; 11] = [
        ("TEST UNIT READY", &tur, [standby, unavailable, transition]),
        ("READ(10)", &read10, [standby, unavailable, transition]),
        ("WRITE(10)", &write10, [standby, unavailable, transition]),
        (
            "SYNCHRONIZE CACHE",
            &sync,
            [standby, unavailable, transition],
        ),
        (
            "MODE SENSE(6)",
            &mode_sense,
            [None, unavailable, transition],
        ),
        (
            "PERSISTENT RESERVE IN",
            &pr_in,
            [None, unavailable, transition],
        ),
        (
            "READ CAPACITY(16)",
            &read_capacity16,
            [None, unavailable, transition],
        ),
        ("INQUIRY", &inquiry, [None, None, None]),
        ("REPORT LUNS", &report_luns, [None, None, None]),
        ("REQUEST SENSE", &request_sense, [None, None, None]),
        (
            "REPORT TARGET PORT GROUPS",
            &rtpg(0, 512),
            [None, None, None],
        ),
    ];
    let states = [
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Transitioning,
    ];
    for (col, state) in states.into_iter().enumerate() {
        let (t, na, nb) = two_groups(AccessState::ActiveOptimized, state, false);
        for (name, cdb, want) in &rows {
            let pattern = |b: u8| {
                if cdb[0] == 0x2a {
                    vec![b; 512]
                } else {
                    Vec::new()
                }
            };
            // Through the active group everything runs.
            let r = t.execute(&na, l0(), cdb, &pattern(7), 512);
            assert_eq!(r.status, Status::Good, "{name} through the active port");
            let r = t.execute(&nb, l0(), cdb, &pattern(9), 512);
            match want[col] {
                None => assert_eq!(r.status, Status::Good, "{name} in {state}: {:?}", r.sense),
                Some(asc) => {
                    assert_eq!(r.status, Status::CheckCondition, "{name} in {state}");
                    assert_eq!(sense_of(&r), (SenseKey::NotReady, asc), "{name} in {state}");
                    assert_eq!(r.residual, Residual::Under(512), "{name}: nothing moved");
                }
            }
        }
        // The refused WRITE wrote nothing: the block is the active port's.
        assert_eq!(ok(&t, &na, &read10, &[], 512), vec![7u8; 512], "{state}");
    }
    // Active/non-optimized runs everything.
    let (t, _, nb) = two_groups(
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        false,
    );
    for (name, cdb, _) in &rows {
        let data = if cdb[0] == 0x2a {
            vec![7u8; 512]
        } else {
            Vec::new()
        };
        assert_eq!(
            t.execute(&nb, l0(), cdb, &data, 512).status,
            Status::Good,
            "{name}"
        );
    }
}

#[test]
fn implicit_transition_raises_unit_attention_on_every_nexus() {
    let (t, na, nb) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, false);
    // A nexus that has not reached the LU yet gets its power-on attention first.
    assert_eq!(
        t.set_group_state(2, AccessState::ActiveOptimized),
        Ok(AccessState::Standby)
    );
    assert_eq!(
        t.set_group_state(1, AccessState::Standby),
        Ok(AccessState::ActiveOptimized)
    );
    for n in [&na, &nb] {
        // INQUIRY does not consume it (SAM-5 5.14).
        ok(&t, n, &[0x12, 0, 0, 0, 36, 0], &[], 36);
        let r = t.execute(n, l0(), &[0; 6], &[], 0);
        assert_eq!(
            sense_of(&r),
            (
                SenseKey::UnitAttention,
                Asc::ASYMMETRIC_ACCESS_STATE_CHANGED
            ),
            "{}: both groups changed, one attention",
            n.target_port
        );
    }
    // Reported once; now pa is standby and pb active.
    assert_eq!(
        sense_of(&t.execute(&na, l0(), &[0; 6], &[], 0)),
        (SenseKey::NotReady, Asc::LU_NOT_ACCESSIBLE_STANDBY)
    );
    assert_eq!(t.execute(&nb, l0(), &[0; 6], &[], 0).status, Status::Good);
    // The same state again raises nothing; an unknown group is refused.
    assert_eq!(
        t.set_group_state(2, AccessState::ActiveOptimized),
        Ok(AccessState::ActiveOptimized)
    );
    assert_eq!(t.execute(&nb, l0(), &[0; 6], &[], 0).status, Status::Good);
    let e = t.set_group_state(9, AccessState::Standby).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no target port group 9 (the groups are 1, 2)"
    );
    // The configuration again, unchanged: no attention; changed: one.
    let same = t.alua();
    assert!(!t.set_alua(same.clone()));
    let mut other = same;
    other.groups[0].state = AccessState::ActiveNonOptimized;
    assert!(t.set_alua(other));
    let r = t.execute(&na, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
}

#[test]
fn set_target_port_groups() {
    // Refused unless explicit transitions are enabled.
    let (t, _, nb) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, false);
    let p = stpg_params(&[(0x0, 2), (0x2, 1)]);
    let r = t.execute(&nb, l0(), &stpg(&p), &p, p.len() as u64);
    assert_eq!(r.sense.unwrap(), Sense::invalid_field(1, Some(4)));

    let (t, na, nb) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, true);
    // Bad lists change nothing: an unknown group, a state an initiator
    // cannot ask for (transitioning, offline), a group twice, a cut list.
    for (p, want) in [
        (stpg_params(&[(0x0, 7)]), Sense::invalid_param(6, None)),
        (stpg_params(&[(0xf, 2)]), Sense::invalid_param(4, None)),
        (stpg_params(&[(0xe, 2)]), Sense::invalid_param(4, None)),
        (
            stpg_params(&[(0x0, 2), (0x1, 2)]),
            Sense::invalid_param(10, None),
        ),
    ] {
        let r = t.execute(&nb, l0(), &stpg(&p), &p, p.len() as u64);
        assert_eq!(r.sense.unwrap(), want, "{p:02x?}");
    }
    let cut = [0u8, 0, 0, 0, 0, 0];
    let r = t.execute(&nb, l0(), &stpg(&cut), &cut, 6);
    assert_eq!(r.sense.unwrap().asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
    assert_eq!(t.execute(&na, l0(), &[0; 6], &[], 0).status, Status::Good);

    // Through the standby port (STPG is allowed there): swap the roles.
    let p = stpg_params(&[(0x0, 2), (0x2, 1)]);
    let r = t.execute(&nb, l0(), &stpg(&p), &p, p.len() as u64);
    assert_eq!(r.status, Status::Good, "{:?}", r.sense);
    // The sender is not told; the other nexus is.
    assert_eq!(t.execute(&nb, l0(), &[0; 6], &[], 0).status, Status::Good);
    assert_eq!(
        sense_of(&t.execute(&na, l0(), &[0; 6], &[], 0)),
        (
            SenseKey::UnitAttention,
            Asc::ASYMMETRIC_ACCESS_STATE_CHANGED
        )
    );
    assert_eq!(
        sense_of(&t.execute(&na, l0(), &[0; 6], &[], 0)),
        (SenseKey::NotReady, Asc::LU_NOT_ACCESSIBLE_STANDBY)
    );
    // STATUS CODE 01h: altered by SET TARGET PORT GROUPS.
    let d = ok(&t, &nb, &rtpg(0, 512), &[], 512);
    assert_eq!(&d[4..10], &[0x82, 0x8f, 0, 1, 0, 1]);
    assert_eq!(&d[16..22], &[0x00, 0x8f, 0, 2, 0, 1]);
}

#[test]
fn a_port_outside_every_group_is_symmetric() {
    let (t, _, _) = two_groups(AccessState::Standby, AccessState::Standby, false);
    let nc = Nexus::new("i", "pc");
    assert_eq!(
        t.execute(&nc, l0(), &[0; 6], &[], 0).sense.unwrap().asc,
        Asc::POWER_ON_RESET
    );
    assert_eq!(t.execute(&nc, l0(), &[0; 6], &[], 0).status, Status::Good);
    // It is not listed: two descriptors of one port each.
    let d = ok(&t, &nc, &rtpg(0, 512), &[], 512);
    assert_eq!(&d[..4], &[0, 0, 0, 24]);
}

#[test]
fn a_group_may_hold_another_targets_ports() {
    // Group 2 holds relative port 2 here and port 12 of another host
    // serving the same LU: both are listed, only the local one runs here.
    let (t, na, nb) = two_groups(AccessState::ActiveOptimized, AccessState::Standby, false);
    let mut alua = t.alua();
    alua.groups[1].ports.push(12);
    assert!(t.set_alua(alua));
    let r = t.execute(&na, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    let d = ok(&t, &na, &rtpg(0, 512), &[], 512);
    assert_eq!(&d[..4], &[0, 0, 0, 28]);
    assert_eq!(
        &d[16..],
        &[0x02, 0x8f, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 12]
    );
    let r = t.execute(&nb, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    let r = t.execute(&nb, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::LU_NOT_ACCESSIBLE_STANDBY);
}
