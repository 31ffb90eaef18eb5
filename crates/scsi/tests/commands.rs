//! Per-command tests against stores where every sector carries its own
//! address (LBA as big-endian u64 at the start of each 8-byte word).

use scsi::sense::FieldPointer;
use scsi::*;
use std::sync::Arc;

const BLOCKS: u64 = 64;

fn stamped(bs: u32) -> Vec<u8> {
    let mut v = vec![0u8; (BLOCKS * bs as u64) as usize];
    for (lba, sector) in v.chunks_mut(bs as usize).enumerate() {
        for w in sector.chunks_mut(8) {
            w.copy_from_slice(&(lba as u64).to_be_bytes());
        }
    }
    v
}

fn ram_device(bs: u32, read_only: bool) -> Arc<Device> {
    let ram = Ram::new(BLOCKS * bs as u64);
    ram.write(0, &stamped(bs), false).unwrap();
    let cfg = DeviceConfig {
        block_size: bs,
        read_only,
        serial: "SN123".into(),
        ..Default::default()
    };
    Arc::new(Device::new(cfg, Arc::new(ram)).unwrap())
}

fn lun(n: u32) -> Lun {
    Lun::new(n).unwrap()
}

/// A target with LUN 0 (ram, 512 B) in the default set, nexus already past
/// its power-on unit attention.
fn setup() -> (Target, Nexus) {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    let n = Nexus::new("init-a", "port-1");
    let r = t.execute(&n, lun(0), &[0, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::POWER_ON_RESET);
    (t, n)
}

fn good(r: &ScsiResponse) {
    assert_eq!(
        r.status,
        Status::Good,
        "{:?}",
        r.sense.map(|s| s.to_string())
    );
}

fn check(r: &ScsiResponse, key: SenseKey, asc: Asc) -> Sense {
    assert_eq!(r.status, Status::CheckCondition);
    let s = r.sense.unwrap();
    assert_eq!((s.key, s.asc), (key, asc), "{s}");
    s
}

fn rw10(op: u8, lba: u32, blocks: u16, flags: u8) -> Vec<u8> {
    let mut c = vec![op, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    c
}

fn assert_sectors(data: &[u8], first: u64, bs: usize) {
    for (i, s) in data.chunks(bs).enumerate() {
        for w in s.chunks(8) {
            assert_eq!(u64::from_be_bytes(w.try_into().unwrap()), first + i as u64);
        }
    }
}

#[test]
fn unit_attention_first_once_inquiry_not_blocked() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    let n = Nexus::new("i", "p");
    good(&t.execute(&n, lun(0), &[0x12, 0, 0, 0, 36, 0], &[], 36));
    check(
        &t.execute(&n, lun(0), &rw10(0x28, 0, 1, 0), &[], 512),
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET,
    );
    good(&t.execute(&n, lun(0), &rw10(0x28, 0, 1, 0), &[], 512));
    // Another nexus of the same initiator has its own condition.
    let n2 = Nexus::new("i", "p2");
    check(
        &t.execute(&n2, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET,
    );
}

#[test]
fn request_sense_reports_pending_ua() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    let n = Nexus::new("i", "p");
    let r = t.execute(&n, lun(0), &[0x03, 0, 0, 0, 18, 0], &[], 18);
    good(&r);
    assert_eq!(r.data_in[2] & 0x0f, 0x06);
    assert_eq!((r.data_in[12], r.data_in[13]), (0x29, 0x00));
    let r = t.execute(&n, lun(0), &[0x03, 1, 0, 0, 252, 0], &[], 252);
    assert_eq!(&r.data_in[..4], &[0x72, 0, 0, 0]); // descriptor, NO SENSE
    assert_eq!(r.residual, Residual::Under(252 - 8));
}

#[test]
fn reads_all_sizes_return_addressed_sectors() {
    let (t, n) = setup();
    // READ(6) LBA 3, 2 blocks.
    let r = t.execute(&n, lun(0), &[0x08, 0, 0, 3, 2, 0], &[], 1024);
    good(&r);
    assert_sectors(&r.data_in, 3, 512);
    let r = t.execute(&n, lun(0), &rw10(0x28, 10, 4, 0x10), &[], 2048); // DPO
    good(&r);
    assert_sectors(&r.data_in, 10, 512);
    let r = t.execute(
        &n,
        lun(0),
        &[0xa8, 0, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0],
        &[],
        1536,
    );
    good(&r);
    assert_sectors(&r.data_in, 20, 512);
    let mut c16 = vec![0x88, 0x08];
    c16.extend_from_slice(&63u64.to_be_bytes());
    c16.extend_from_slice(&1u32.to_be_bytes());
    c16.extend_from_slice(&[0, 0]);
    let r = t.execute(&n, lun(0), &c16, &[], 512);
    good(&r);
    assert_sectors(&r.data_in, 63, 512);
    assert_eq!(r.residual, Residual::None);
}

#[test]
fn write_then_read_and_residuals() {
    let (t, n) = setup();
    let data: Vec<u8> = (0..1024).map(|i| i as u8).collect();
    good(&t.execute(&n, lun(0), &rw10(0x2a, 5, 2, 0x08), &data, 1024));
    let r = t.execute(&n, lun(0), &rw10(0x28, 4, 4, 0), &[], 2048);
    assert_sectors(&r.data_in[..512], 4, 512);
    assert_eq!(&r.data_in[512..1536], &data[..]);
    assert_sectors(&r.data_in[1536..], 7, 512);
    // Initiator expected less than the CDB asks: overflow, data truncated.
    let r = t.execute(&n, lun(0), &rw10(0x28, 0, 2, 0), &[], 512);
    assert_eq!((r.data_in.len(), r.residual), (512, Residual::Over(512)));
    // Expected more than the CDB asks: underflow.
    let r = t.execute(&n, lun(0), &rw10(0x28, 0, 1, 0), &[], 4096);
    assert_eq!(r.residual, Residual::Under(3584));
    // WRITE with data-out shorter than the transfer length.
    let r = t.execute(&n, lun(0), &rw10(0x2a, 0, 2, 0), &data[..512], 512);
    check(&r, SenseKey::AbortedCommand, Asc::NO_ADDITIONAL);
    let r = t.execute(&n, lun(0), &rw10(0x28, 0, 1, 0), &[], 512);
    assert_sectors(&r.data_in, 0, 512);
}

#[test]
fn lba_out_of_range_every_size() {
    let (t, n) = setup();
    let s = check(
        &t.execute(&n, lun(0), &rw10(0x28, 63, 2, 0), &[], 1024),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    assert_eq!(s.information, Some(63));
    check(
        &t.execute(&n, lun(0), &rw10(0x2a, 64, 1, 0), &[0; 512], 512),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    check(
        &t.execute(&n, lun(0), &[0x08, 0, 0, 64, 1, 0], &[], 512),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    let mut c16 = vec![0x88, 0];
    c16.extend_from_slice(&u64::MAX.to_be_bytes());
    c16.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    check(
        &t.execute(&n, lun(0), &c16, &[], 512),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    check(
        &t.execute(&n, lun(0), &[0x35, 0, 0, 0, 0, 60, 0, 0, 9, 0], &[], 0),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    good(&t.execute(&n, lun(0), &[0x35, 0, 0, 0, 0, 60, 0, 0, 4, 0], &[], 0));
}

#[test]
fn bad_fields_carry_pointers() {
    let (t, n) = setup();
    let s = check(
        &t.execute(&n, lun(0), &rw10(0x28, 0, 1, 0x20), &[], 512),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(
        s.field,
        Some(FieldPointer {
            in_cdb: true,
            byte: 1,
            bit: Some(7)
        })
    );
    // INQUIRY page code without EVPD.
    let s = check(
        &t.execute(&n, lun(0), &[0x12, 0, 0x80, 0, 255, 0], &[], 255),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field.unwrap().byte, 2);
    // Unsupported VPD page, NACA in CONTROL of a LU without NormACA,
    // over-long transfer.
    check(
        &t.execute(&n, lun(0), &[0x12, 1, 0x99, 0, 255, 0], &[], 255),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    let no_aca = DeviceConfig {
        norm_aca: false,
        ..Default::default()
    };
    t.add_lun(
        None,
        lun(1),
        Arc::new(Device::new(no_aca, Arc::new(Ram::new(BLOCKS * 512))).unwrap()),
    );
    t.execute(&n, lun(1), &[0; 6], &[], 0); // power-on unit attention
    let s = check(
        &t.execute(&n, lun(1), &[0, 0, 0, 0, 0, 4], &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(
        s.field.unwrap(),
        FieldPointer {
            in_cdb: true,
            byte: 5,
            bit: Some(2)
        }
    );
    assert_eq!(t.aca_faulted(&n, lun(1)), None);
    // Unknown opcode and empty CDB.
    check(
        &t.execute(&n, lun(0), &[0xc0, 0, 0, 0, 0, 0], &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    check(
        &t.execute(&n, lun(0), &[], &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    // Fixed-format bytes of the field pointer.
    assert_eq!(&s.to_fixed()[15..18], &[0xca, 0, 5]);
}

#[test]
fn write_to_read_only() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(4096, true));
    let n = Nexus::new("i", "p");
    t.execute(&n, lun(0), &[0; 6], &[], 0);
    check(
        &t.execute(&n, lun(0), &rw10(0x2a, 0, 1, 0), &[0; 4096], 4096),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
    let r = t.execute(&n, lun(0), &rw10(0x28, 1, 2, 0), &[], 8192);
    assert_eq!((r.data_in.len(), r.residual), (8192, Residual::None));
    assert_sectors(&r.data_in, 1, 4096);
    // MODE SENSE(6) shows WP.
    let r = t.execute(&n, lun(0), &[0x1a, 0, 0x3f, 0, 255, 0], &[], 255);
    assert_eq!(r.data_in[2] & 0x80, 0x80);
}

#[test]
fn read_capacity_both() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(4096, false));
    let n = Nexus::new("i", "p");
    t.execute(&n, lun(0), &[0; 6], &[], 0);
    let r = t.execute(&n, lun(0), &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8);
    assert_eq!(r.data_in, [0, 0, 0, 63, 0, 0, 0x10, 0]);
    let mut c = vec![0x9e, 0x10];
    c.extend_from_slice(&[0; 8]);
    c.extend_from_slice(&32u32.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    let r = t.execute(&n, lun(0), &c, &[], 32);
    assert_eq!(&r.data_in[..12], &[0, 0, 0, 0, 0, 0, 0, 63, 0, 0, 0x10, 0]);
    c[1] = 0x11;
    check(
        &t.execute(&n, lun(0), &c, &[], 32),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
}

#[test]
fn inquiry_standard_and_vpd() {
    let (t, n) = setup();
    let r = t.execute(&n, lun(0), &[0x12, 0, 0, 0, 96, 0], &[], 96);
    assert_eq!(&r.data_in[8..16], b"RUSTSCST");
    assert_eq!(r.residual, Residual::Under(96 - 36));
    let r = t.execute(&n, lun(0), &[0x12, 1, 0, 0, 255, 0], &[], 255);
    assert_eq!(
        r.data_in,
        [0, 0, 0, 7, 0x00, 0x80, 0x83, 0x86, 0xb0, 0xb1, 0xb2]
    );
    let r = t.execute(&n, lun(0), &[0x12, 1, 0x80, 0, 255, 0], &[], 255);
    assert_eq!(&r.data_in[4..], b"SN123");
    let r = t.execute(&n, lun(0), &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    // NAA designator: binary, LU association, type 3, length 8, NAA 5.
    assert_eq!(&r.data_in[4..8], &[1, 3, 0, 8]);
    assert_eq!(r.data_in[8] >> 4, 5);
    // T10 vendor id: ASCII, type 1.
    assert_eq!(&r.data_in[16..20], &[2, 1, 0, 13]);
    assert_eq!(&r.data_in[20..33], b"RUSTSCSTSN123");
    // Allocation length smaller than the page.
    let r = t.execute(&n, lun(0), &[0x12, 1, 0xb0, 0, 8, 0], &[], 8);
    assert_eq!(r.data_in.len(), 8);
    assert_eq!(r.data_in[1], 0xb0);
}

#[test]
fn mode_sense_pages() {
    let (t, n) = setup();
    let r = t.execute(&n, lun(0), &[0x1a, 0, 0x08, 0, 255, 0], &[], 255);
    // header 4 + block descriptor 8 + caching page 20.
    assert_eq!(r.data_in.len(), 32);
    assert_eq!(r.data_in[0], 31);
    assert_eq!(&r.data_in[12..15], &[0x08, 18, 0x04]);
    // Changeable values: WCE is the one changeable bit of the caching page.
    let r = t.execute(
        &n,
        lun(0),
        &[0x5a, 0x08, 0x48, 0, 0, 0, 0, 0, 255, 0],
        &[],
        255,
    );
    assert_eq!(&r.data_in[8..11], &[0x08, 18, 0x04]);
    assert!(r.data_in[11..28].iter().all(|&b| b == 0));
    check(
        &t.execute(&n, lun(0), &[0x1a, 0, 0xc8, 0, 255, 0], &[], 255),
        SenseKey::IllegalRequest,
        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    check(
        &t.execute(&n, lun(0), &[0x1a, 0, 0x19, 0, 255, 0], &[], 255),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    let r = t.execute(&n, lun(0), &[0x1a, 8, 0x3f, 0, 255, 0], &[], 255);
    assert_eq!(r.data_in.len(), 4 + 20 + 12 + 12);
}

#[test]
fn lun_maps_masking_and_report_luns() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    t.add_lun(None, lun(300), ram_device(512, false));
    t.add_lun(Some("special"), lun(7), ram_device(512, false));
    let a = Nexus::new("plain", "p");
    let s = Nexus::new("special", "p");
    let rl = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = t.execute(&a, lun(0), &rl, &[], 256);
    assert_eq!(&r.data_in[..8], &[0, 0, 0, 16, 0, 0, 0, 0]);
    assert_eq!(
        &r.data_in[8..24],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0x41, 0x2c, 0, 0, 0, 0, 0, 0]
    );
    // The group sees only its LUN 7; REPORT LUNS to unmapped LUN 0 works.
    let r = t.execute(&s, lun(0), &rl, &[], 256);
    assert_eq!(r.data_in, [0, 0, 0, 8, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0]);
    // Unmapped LUN: INQUIRY says qualifier 011b, others refused.
    let r = t.execute(&s, lun(0), &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(r.data_in[0], 0x7f);
    check(
        &t.execute(&s, lun(0), &[0; 6], &[], 0),
        SenseKey::IllegalRequest,
        Asc::LOGICAL_UNIT_NOT_SUPPORTED,
    );
    check(
        &t.execute(&a, lun(7), &[0; 6], &[], 0),
        SenseKey::IllegalRequest,
        Asc::LOGICAL_UNIT_NOT_SUPPORTED,
    );
}

#[test]
fn device_counters() {
    let t = Target::new();
    let dev = ram_device(512, false);
    t.add_lun(None, lun(0), dev.clone());
    let n = Nexus::new("i", "p");
    t.execute(&n, lun(0), &[0; 6], &[], 0);
    let data = vec![7u8; 1024];
    good(&t.execute(&n, lun(0), &rw10(0x2a, 5, 2, 0), &data, 1024));
    for _ in 0..3 {
        good(&t.execute(&n, lun(0), &rw10(0x28, 0, 4, 0), &[], 2048));
    }
    let beyond = BLOCKS as u32;
    check(
        &t.execute(&n, lun(0), &rw10(0x28, beyond, 1, 0), &[], 512),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    let s = dev.stats();
    assert_eq!((s.writes, s.write_bytes), (1, 1024));
    assert_eq!((s.reads, s.read_bytes), (3, 3 * 2048));
    assert_eq!(s.errors, 1);
    assert!(s.commands >= 5, "{s:?}");
}

#[test]
fn named_groups_with_initiator_patterns() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    t.add_lun(Some("hosts-a"), lun(1), ram_device(512, false));
    t.add_lun(Some("hosts-a"), lun(2), ram_device(512, false));
    t.add_initiator("hosts-a", "0xaa01");
    t.add_initiator("hosts-a", "0xaa02");
    t.add_initiator("hosts-b", "0xbb*");
    assert_eq!(t.visible_luns("0xaa01", "p"), vec![lun(1), lun(2)]);
    assert_eq!(t.visible_luns("0xaa02", "p"), vec![lun(1), lun(2)]);
    // In a group without LUNs: sees nothing, not the default set.
    assert!(t.visible_luns("0xbb77", "p").is_empty());
    // Outside every group: the default LUNs.
    assert_eq!(t.visible_luns("0xcc00", "p"), vec![lun(0)]);
    let maps = t.lun_maps();
    assert_eq!(maps.default.len(), 1);
    let names: Vec<&str> = maps.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["hosts-a", "hosts-b"]);
    assert_eq!(maps.groups[0].initiators, ["0xaa01", "0xaa02"]);

    // Leaving a group is a LUN inventory change for that initiator only.
    let a1 = Nexus::new("0xaa01", "p");
    let a2 = Nexus::new("0xaa02", "p");
    for n in [&a1, &a2] {
        check(
            &t.execute(n, lun(1), &[0; 6], &[], 0),
            SenseKey::UnitAttention,
            Asc::POWER_ON_RESET,
        );
    }
    assert!(t.remove_initiator("hosts-a", "0xaa01"));
    assert!(!t.remove_initiator("hosts-a", "0xaa01"));
    assert_eq!(t.visible_luns("0xaa01", "p"), vec![lun(0)]);
    good(&t.execute(&a2, lun(1), &[0; 6], &[], 0));
    check(
        &t.execute(&a1, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET,
    );
    // LUN 1 is gone for it.
    check(
        &t.execute(&a1, lun(1), &[0; 6], &[], 0),
        SenseKey::IllegalRequest,
        Asc::LOGICAL_UNIT_NOT_SUPPORTED,
    );
    assert!(t.remove_group("hosts-a"));
    assert!(!t.remove_group("hosts-a"));
    assert_eq!(t.visible_luns("0xaa02", "p"), vec![lun(0)]);
}

/// A target port with default LUNs of its own: initiators outside every
/// group see them through that port and the target's default set through
/// the others; a group still wins; a change to the port's set is a LUN
/// inventory change for that port's nexuses only.
#[test]
fn a_port_with_its_own_default_luns() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    t.add_lun(Some("g"), lun(7), ram_device(512, false));
    t.add_initiator("g", "0xgg");
    assert!(t
        .add_port_lun("own", lun(3), ram_device(512, false))
        .is_none());
    assert_eq!(t.visible_luns("0xaa", "own"), vec![lun(3)]);
    assert_eq!(t.visible_luns("0xaa", "shared"), vec![lun(0)]);
    assert_eq!(t.visible_luns("0xgg", "own"), vec![lun(7)]);
    let maps = t.lun_maps();
    assert_eq!(maps.ports.len(), 1);
    assert_eq!(maps.ports[0].port, "own");

    let via_own = Nexus::new("0xaa", "own");
    let via_shared = Nexus::new("0xaa", "shared");
    for (n, l) in [(&via_own, lun(3)), (&via_shared, lun(0))] {
        check(
            &t.execute(n, l, &[0; 6], &[], 0),
            SenseKey::UnitAttention,
            Asc::POWER_ON_RESET,
        );
        good(&t.execute(n, l, &[0; 6], &[], 0));
    }
    // LUN 0 is not there through the port with its own set.
    check(
        &t.execute(&via_own, lun(0), &[0; 6], &[], 0),
        SenseKey::IllegalRequest,
        Asc::LOGICAL_UNIT_NOT_SUPPORTED,
    );
    // A second LUN on the port: its nexus is told, the other is not.
    t.add_port_lun("own", lun(4), ram_device(512, false));
    check(
        &t.execute(&via_own, lun(3), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::REPORTED_LUNS_DATA_CHANGED,
    );
    good(&t.execute(&via_shared, lun(0), &[0; 6], &[], 0));
    // And the target's default set changing is not the port's business.
    t.add_lun(None, lun(1), ram_device(512, false));
    good(&t.execute(&via_own, lun(3), &[0; 6], &[], 0));
    check(
        &t.execute(&via_shared, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::REPORTED_LUNS_DATA_CHANGED,
    );
    assert!(t.remove_port_lun("own", lun(4)).is_some());
    assert!(t.remove_port_lun("own", lun(4)).is_none());
    assert_eq!(t.visible_luns("0xaa", "own"), vec![lun(3)]);
}

#[test]
fn dynamic_lun_add_raises_ua_for_affected_nexuses_only() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(512, false));
    t.add_lun(Some("g"), lun(0), ram_device(512, false));
    let a = Nexus::new("plain", "p");
    let g = Nexus::new("g", "p");
    for n in [&a, &g] {
        check(
            &t.execute(n, lun(0), &[0; 6], &[], 0),
            SenseKey::UnitAttention,
            Asc::POWER_ON_RESET,
        );
    }
    t.add_lun(None, lun(1), ram_device(512, false));
    check(
        &t.execute(&a, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::REPORTED_LUNS_DATA_CHANGED,
    );
    good(&t.execute(&a, lun(0), &[0; 6], &[], 0));
    good(&t.execute(&g, lun(0), &[0; 6], &[], 0));
    // REPORT LUNS clears the condition without it being reported.
    t.remove_lun(None, lun(1));
    t.execute(
        &a,
        lun(0),
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
        256,
    );
    good(&t.execute(&a, lun(0), &[0; 6], &[], 0));
}

#[test]
fn plan_before_execute() {
    let t = Target::new();
    t.add_lun(None, lun(0), ram_device(4096, false));
    let n = Nexus::new("i", "p");
    assert_eq!(
        t.plan(&n, lun(0), &rw10(0x2a, 0, 3, 0)).unwrap(),
        Plan {
            dir: DataDir::Out,
            len: 3 * 4096
        }
    );
    assert_eq!(
        t.plan(&n, lun(0), &[0x12, 0, 0, 1, 0, 0]).unwrap(),
        Plan {
            dir: DataDir::In,
            len: 256
        }
    );
    assert_eq!(
        t.plan(&n, lun(0), &[0; 6]).unwrap(),
        Plan {
            dir: DataDir::None,
            len: 0
        }
    );
    assert_eq!(
        t.plan(&n, lun(0), &[0xff]).unwrap_err().asc,
        Asc::INVALID_COMMAND_OPERATION_CODE
    );
}

#[test]
fn fileio_and_nullio() {
    let path = std::env::temp_dir().join(format!("scsi-fileio-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(BLOCKS * 512).unwrap();
    let fio = FileIo::new(f, false).unwrap();
    fio.write(0, &stamped(512), false).unwrap();
    let dev = Arc::new(Device::new(DeviceConfig::default(), Arc::new(fio)).unwrap());
    let t = Target::new();
    t.add_lun(None, lun(0), dev);
    t.add_lun(
        None,
        lun(1),
        Arc::new(Device::new(DeviceConfig::default(), Arc::new(NullIo::new(1 << 20))).unwrap()),
    );
    let n = Nexus::new("i", "p");
    t.execute(&n, lun(0), &[0; 6], &[], 0);
    t.execute(&n, lun(1), &[0; 6], &[], 0);
    let r = t.execute(&n, lun(0), &rw10(0x28, 9, 2, 0), &[], 1024);
    assert_sectors(&r.data_in, 9, 512);
    good(&t.execute(&n, lun(0), &rw10(0x2a, 9, 1, 0x08), &[0xab; 512], 512));
    good(&t.execute(&n, lun(0), &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0));
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[9 * 512..10 * 512].iter().all(|&b| b == 0xab));
    std::fs::remove_file(&path).unwrap();
    // nullio: writes vanish, reads are zero.
    good(&t.execute(&n, lun(1), &rw10(0x2a, 0, 1, 0), &[0xcd; 512], 512));
    let r = t.execute(&n, lun(1), &rw10(0x28, 0, 1, 0), &[], 512);
    assert!(r.data_in.iter().all(|&b| b == 0));
    // Bad device configs are refused.
    assert!(Device::new(
        DeviceConfig {
            block_size: 1024,
            ..Default::default()
        },
        Arc::new(Ram::new(4096))
    )
    .is_err());
    assert!(Device::new(DeviceConfig::default(), Arc::new(Ram::new(1000))).is_err());
}

/// Deterministic run of random and mutated CDBs: no panic, unknown opcodes
/// and malformed CDBs get CHECK CONDITION.
#[test]
fn random_cdbs_never_panic() {
    let (t, n) = setup();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: Vec<Vec<u8>> = vec![
        rw10(0x28, 0, 1, 0),
        rw10(0x2a, 0, 1, 0),
        vec![0x12, 1, 0x83, 0, 255, 0],
        vec![0xa0; 12],
    ];
    for i in 0..20000 {
        let mut cdb = if i % 2 == 0 {
            seeds[(next() % 4) as usize].clone()
        } else {
            (0..(next() % 20) as usize).map(|_| next() as u8).collect()
        };
        if !cdb.is_empty() {
            let k = (next() % cdb.len() as u64) as usize;
            cdb[k] = next() as u8;
        }
        let r = t.execute(&n, lun(0), &cdb, &[0u8; 4096], 4096);
        let op = Opcode::from(cdb.first().copied().unwrap_or(0));
        if cdb.is_empty()
            || matches!(op, Opcode::Unknown(_))
            || cdb.len() < op.cdb_len().unwrap_or(0)
        {
            assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}");
        }
        if r.status == Status::Good {
            assert!(r.data_in.len() <= 4096);
        }
        // A CHECK CONDITION with NACA=1 leaves an ACA condition, nothing
        // else does; CLEAR ACA ends it for the next CDB.
        let aca = t.aca_faulted(&n, lun(0)).is_some();
        assert_eq!(
            aca,
            r.status == Status::CheckCondition && scsi::cdb::naca(&cdb),
            "{cdb:02x?}"
        );
        if aca {
            assert_eq!(
                t.tmf(&n, lun(0), Tmf::ClearAca),
                ServiceResponse::FunctionComplete
            );
        }
    }
}

#[test]
fn resize_raises_capacity_changed_to_every_path() {
    let t = Target::new();
    let dev = ram_device(512, false);
    t.add_lun(None, lun(0), dev.clone());
    t.add_lun(Some("g"), lun(5), dev);
    let a = Nexus::new("a", "p");
    let g = Nexus::new("g", "p");
    t.execute(&a, lun(0), &[0; 6], &[], 0);
    t.execute(&g, lun(5), &[0; 6], &[], 0);
    t.resize(None, lun(0), 128).unwrap();
    for (n, l) in [(&a, lun(0)), (&g, lun(5))] {
        check(
            &t.execute(n, l, &[0; 6], &[], 0),
            SenseKey::UnitAttention,
            Asc::CAPACITY_DATA_CHANGED,
        );
        let r = t.execute(n, l, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8);
        assert_eq!(&r.data_in[..4], &[0, 0, 0, 127]);
    }
    // The old data survives growth; new blocks read zero and are addressable.
    let r = t.execute(&a, lun(0), &rw10(0x28, 63, 2, 0), &[], 1024);
    assert_sectors(&r.data_in[..512], 63, 512);
    assert!(r.data_in[512..].iter().all(|&b| b == 0));
    assert!(t.resize(None, lun(0), 0).is_err());
    assert!(t.resize(None, lun(9), 10).is_err());
}

#[test]
fn mode_select_wce_and_d_sense() {
    let (t, n) = setup();
    let other = Nexus::new("other", "p");
    t.execute(&other, lun(0), &[0; 6], &[], 0);
    // Current caching page via MODE SENSE(6) with DBD, then clear WCE.
    let r = t.execute(&n, lun(0), &[0x1a, 8, 0x08, 0, 255, 0], &[], 255);
    let mut params = vec![0, 0, 0, 0];
    params.extend_from_slice(&r.data_in[4..]);
    params[6] &= !0x04;
    let sel = [0x15, 0x10, 0, 0, params.len() as u8, 0];
    assert_eq!(
        t.plan(&n, lun(0), &sel).unwrap(),
        Plan {
            dir: DataDir::Out,
            len: 24
        }
    );
    good(&t.execute(&n, lun(0), &sel, &params, 24));
    let r = t.execute(&n, lun(0), &[0x1a, 8, 0x08, 0, 255, 0], &[], 255);
    assert_eq!(r.data_in[6] & 0x04, 0);
    // The other nexus hears of it once; the changer does not.
    check(
        &t.execute(&other, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::MODE_PARAMETERS_CHANGED,
    );
    good(&t.execute(&other, lun(0), &[0; 6], &[], 0));
    good(&t.execute(&n, lun(0), &[0; 6], &[], 0));
    // A non-changeable bit (caching page byte 3) is refused with a pointer
    // into the parameter list.
    params[7] = 0xff;
    let s = check(
        &t.execute(&n, lun(0), &sel, &params, 24),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(
        s.field.unwrap(),
        FieldPointer {
            in_cdb: false,
            byte: 7,
            bit: None
        }
    );
    // SP=1 and PF=0 refused.
    check(
        &t.execute(&n, lun(0), &[0x15, 0x11, 0, 0, 24, 0], &params, 24),
        SenseKey::IllegalRequest,
        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    check(
        &t.execute(&n, lun(0), &[0x15, 0, 0, 0, 24, 0], &params, 24),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    // D_SENSE via MODE SELECT(10): sense then comes in descriptor format.
    let ctl = [
        0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 10, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    good(&t.execute(&n, lun(0), &[0x55, 0x10, 0, 0, 0, 0, 0, 0, 20, 0], &ctl, 20));
    let r = t.execute(&n, lun(0), &rw10(0x28, 64, 1, 0), &[], 512);
    assert_eq!(r.sense_bytes().unwrap()[0], 0x72);
    check(
        &t.execute(&other, lun(0), &[0; 6], &[], 0),
        SenseKey::UnitAttention,
        Asc::MODE_PARAMETERS_CHANGED,
    );
    let r = t.execute(&other, lun(0), &rw10(0x28, 64, 1, 0), &[], 512);
    assert_eq!(r.sense_bytes().unwrap()[0], 0x72);
}

/// VERIFY(10) with BYTCHK: 01b compares the data-out with the blocks, 11b
/// one block of data-out with every block; a difference is MISCOMPARE with
/// the offset of the first differing byte; 10b is reserved.
#[test]
fn verify_with_byte_check() {
    let (t, n) = setup();
    let medium = stamped(512);
    let v = |bytchk: u8, lba: u32, blocks: u16| rw10(0x2f, lba, blocks, bytchk << 1);

    // The plan asks the transport for the data-out first.
    let p = t.plan(&n, lun(0), &v(1, 4, 3)).unwrap();
    assert_eq!((p.dir, p.len), (DataDir::Out, 3 * 512));
    let p = t.plan(&n, lun(0), &v(3, 4, 3)).unwrap();
    assert_eq!((p.dir, p.len), (DataDir::Out, 512));
    assert_eq!(t.plan(&n, lun(0), &v(0, 4, 3)).unwrap().dir, DataDir::None);

    // Equal data: GOOD.
    let same = &medium[4 * 512..7 * 512];
    good(&t.execute(&n, lun(0), &v(1, 4, 3), same, same.len() as u64));
    good(&t.execute(&n, lun(0), &v(0, 4, 3), &[], 0));

    // One byte off in the second block: MISCOMPARE at its offset.
    let mut off = same.to_vec();
    off[512 + 100] ^= 0xff;
    let r = t.execute(&n, lun(0), &v(1, 4, 3), &off, off.len() as u64);
    let s = check(&r, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(s.information, Some(512 + 100));

    // 11b: block 4's content against blocks 4..7 differs at block 5, whose
    // first word holds 5 instead of 4 (byte 7 of that block).
    let one = &medium[4 * 512..5 * 512];
    good(&t.execute(&n, lun(0), &v(3, 4, 1), one, 512));
    let r = t.execute(&n, lun(0), &v(3, 4, 3), one, 512);
    let s = check(&r, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(s.information, Some(512 + 7));

    // Reserved BYTCHK 10b, and 11b on WRITE AND VERIFY: bad field, bit 2.
    let r = t.execute(&n, lun(0), &v(2, 4, 1), &[], 0);
    let s = check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(
        s.field,
        Some(FieldPointer {
            in_cdb: true,
            byte: 1,
            bit: Some(2)
        })
    );
    let r = t.execute(&n, lun(0), &rw10(0x2e, 4, 1, 3 << 1), one, 512);
    check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    // Too little data-out for what BYTCHK 01b compares: refused, not read
    // past the buffer.
    let r = t.execute(&n, lun(0), &v(1, 4, 3), &same[..512], 512);
    assert_eq!(r.status, Status::CheckCondition);
    // Unchanged medium.
    let r = t.execute(&n, lun(0), &rw10(0x28, 4, 3, 0), &[], 3 * 512);
    good(&r);
    assert_sectors(&r.data_in, 4, 512);
}
