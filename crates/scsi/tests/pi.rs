//! Protection information (SBC-3 4.22): what a PI-formatted logical unit
//! reports, READ/WRITE with RDPROTECT/WRPROTECT and their checks, PI the
//! target generates and strips, and the ram and fileio PI stores.

mod common;

use common::{l0, TempDir};
use scsi::pi::{crc16_t10dif, Tuple};
use scsi::*;
use std::sync::Arc;

const BS: usize = 512;
const BLOCKS: u64 = 16;

fn pi_device(ty: PiType, store: Arc<dyn Backend>) -> Arc<Device> {
    let cfg = DeviceConfig {
        protection: Some(ty),
        thin: true,
        ..Default::default()
    };
    Arc::new(Device::new(cfg, store).unwrap())
}

fn target_with(dev: Arc<Device>) -> (Target, Nexus) {
    let t = Target::new();
    t.add_lun(None, l0(), dev);
    let n = Nexus::new("i", "p");
    t.execute(&n, l0(), &[0; 6], &[], 0);
    (t, n)
}

fn ram_pi(ty: PiType) -> (Target, Nexus, Arc<Ram>) {
    let ram = Arc::new(Ram::with_pi(BLOCKS * BS as u64, BS as u32));
    let (t, n) = target_with(pi_device(ty, ram.clone()));
    (t, n, ram)
}

/// READ(16)/WRITE(16) CDB with RDPROTECT/WRPROTECT in byte 1 bits 7..5.
fn cdb16(op: u8, protect: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, protect << 5];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn cdb10(op: u8, protect: u8, lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![op, protect << 5];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&n.to_be_bytes());
    c.push(0);
    c
}

fn cdb12(op: u8, protect: u8, lba: u32, n: u32) -> Vec<u8> {
    let mut c = vec![op, protect << 5];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// A block that says which LBA it was written for.
fn block(lba: u64, salt: u8) -> Vec<u8> {
    (0..BS)
        .map(|i| (lba as u8).wrapping_mul(31) ^ salt ^ i as u8)
        .collect()
}

/// Data-out with PI: each block followed by its 8-byte tuple.
fn interleave(blocks: &[(Vec<u8>, Tuple)]) -> Vec<u8> {
    blocks
        .iter()
        .flat_map(|(b, t)| b.iter().copied().chain(t.emit()))
        .collect()
}

fn good(lba: u64, salt: u8, app: u16) -> (Vec<u8>, Tuple) {
    let b = block(lba, salt);
    let t = Tuple {
        guard: crc16_t10dif(&b),
        app,
        reference: lba as u32,
    };
    (b, t)
}

/// WRITE(10) of one block at `lba` with its tuple and WRPROTECT `protect`.
fn put(t: &Target, n: &Nexus, protect: u8, lba: u32, b: &[u8], tu: Tuple) -> ScsiResponse {
    let out = interleave(&[(b.to_vec(), tu)]);
    t.execute(n, l0(), &cdb10(0x2a, protect, lba, 1), &out, 520)
}

fn sense(r: &ScsiResponse) -> (SenseKey, Asc, Option<u64>) {
    let s = r.sense.expect("CHECK CONDITION");
    (s.key, s.asc, s.information)
}

#[test]
fn a_protected_unit_says_so() {
    for (ty, p_type, spt_chk) in [(PiType::Type1, 0, 0x05), (PiType::Type3, 2, 0x24)] {
        let (t, n, _) = ram_pi(ty);
        // READ CAPACITY(16): byte 12 P_TYPE (bits 3..1), PROT_EN (bit 0).
        let r = t.execute(
            &n,
            l0(),
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[],
            32,
        );
        assert_eq!(r.data_in[12], (p_type << 1) | 1);
        // Standard INQUIRY: PROTECT (byte 5 bit 0).
        let r = t.execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36);
        assert_eq!(r.data_in[5] & 1, 1);
        // Extended INQUIRY Data: SPT, GRD_CHK, REF_CHK only for type 1;
        // APP_CHK 0 (no expected tag in 10/12/16-byte CDBs).
        let r = t.execute(&n, l0(), &[0x12, 1, 0x86, 0, 64, 0], &[], 64);
        assert_eq!(&r.data_in[..4], &[0, 0x86, 0, 0x3c]);
        assert_eq!(r.data_in[4], spt_chk);
        assert_eq!(r.data_in[5], 0x07);
        // Control mode page: ATO (byte 5 bit 7) current, not changeable.
        let r = t.execute(&n, l0(), &[0x1a, 0x08, 0x0a, 0, 255, 0], &[], 255);
        assert_eq!(r.data_in[4..6], [0x0a, 10]);
        assert_eq!(r.data_in[4 + 5] & 0x80, 0x80);
        let r = t.execute(&n, l0(), &[0x1a, 0x08, 0x4a, 0, 255, 0], &[], 255);
        assert_eq!(r.data_in[4 + 5] & 0x80, 0);
    }
    // Without PI: none of it.
    let dev = Device::new(
        DeviceConfig::default(),
        Arc::new(Ram::new(BLOCKS * BS as u64)),
    )
    .unwrap();
    let (t, n) = target_with(Arc::new(dev));
    let r = t.execute(
        &n,
        l0(),
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
        32,
    );
    assert_eq!(r.data_in[12], 0);
    let r = t.execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(r.data_in[5] & 1, 0);
    let r = t.execute(&n, l0(), &[0x12, 1, 0x86, 0, 64, 0], &[], 64);
    assert_eq!(r.data_in[4], 0);
}

#[test]
fn rdprotect_and_wrprotect_need_a_protected_unit() {
    let dev = Device::new(
        DeviceConfig::default(),
        Arc::new(Ram::new(BLOCKS * BS as u64)),
    )
    .unwrap();
    let (t, n) = target_with(Arc::new(dev));
    for cdb in [
        cdb10(0x28, 1, 0, 1),
        cdb12(0xa8, 3, 0, 1),
        cdb16(0x88, 5, 0, 1),
        cdb10(0x2a, 1, 0, 1),
        cdb16(0x8a, 4, 0, 1),
    ] {
        let want = Sense::invalid_field(1, Some(7));
        assert_eq!(t.plan(&n, l0(), &cdb), Err(want), "{cdb:02x?}");
        let r = t.execute(&n, l0(), &cdb, &[0; 520], 520);
        assert_eq!(r.sense, Some(want), "{cdb:02x?}");
    }
    // Reserved 110b/111b on a protected unit too.
    let (t, n, _) = ram_pi(PiType::Type1);
    let r = t.execute(&n, l0(), &cdb10(0x28, 6, 0, 1), &[], 520);
    assert_eq!(r.sense, Some(Sense::invalid_field(1, Some(7))));
    // plan: 520 bytes per 512-byte block when PI moves, 512 otherwise.
    assert_eq!(
        t.plan(&n, l0(), &cdb16(0x8a, 1, 0, 4)).unwrap().len,
        4 * 520
    );
    assert_eq!(
        t.plan(&n, l0(), &cdb12(0xa8, 2, 0, 4)).unwrap().len,
        4 * 520
    );
    assert_eq!(
        t.plan(&n, l0(), &cdb10(0x28, 0, 0, 4)).unwrap().len,
        4 * 512
    );
}

#[test]
fn target_generates_and_strips_pi() {
    let (t, n, _) = ram_pi(PiType::Type1);
    // Never written: all-ones PI, escaped, so reads succeed.
    let r = t.execute(&n, l0(), &cdb10(0x28, 1, 3, 1), &[], 520);
    assert_eq!(r.status, Status::Good);
    assert_eq!(&r.data_in[512..], &[0xff; 8]);
    // WRITE(10) WRPROTECT 0: the target generates guard and reference tag.
    let data: Vec<u8> = (5..8).flat_map(|l| block(l, 1)).collect();
    let r = t.execute(&n, l0(), &cdb10(0x2a, 0, 5, 3), &data, data.len() as u64);
    assert_eq!(r.status, Status::Good);
    // READ(12) RDPROTECT 1: data with PI, 520 bytes per block.
    let r = t.execute(&n, l0(), &cdb12(0xa8, 1, 5, 3), &[], 3 * 520);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.residual, Residual::None);
    for (k, c) in r.data_in.chunks(520).enumerate() {
        let lba = 5 + k as u64;
        assert_eq!(&c[..512], &block(lba, 1)[..]);
        let tuple = Tuple::parse(&c[512..]);
        assert_eq!(
            tuple,
            Tuple {
                guard: crc16_t10dif(&c[..512]),
                app: 0,
                reference: lba as u32
            }
        );
    }
    // READ(16) RDPROTECT 0: checked, then stripped.
    let r = t.execute(&n, l0(), &cdb16(0x88, 0, 5, 3), &[], 3 * 512);
    assert_eq!(r.data_in, data);
}

#[test]
fn wrprotect_data_out_is_checked_and_stored() {
    let (t, n, _) = ram_pi(PiType::Type1);
    // WRITE(16) WRPROTECT 1 with good PI and an application tag of its own.
    let out = interleave(&[good(2, 7, 0xabcd), good(3, 7, 0x1234)]);
    let r = t.execute(&n, l0(), &cdb16(0x8a, 1, 2, 2), &out, out.len() as u64);
    assert_eq!((r.status, r.residual), (Status::Good, Residual::None));
    // Stored as sent (ATO: the application tag is never changed).
    let r = t.execute(&n, l0(), &cdb16(0x88, 3, 2, 2), &[], 1040);
    assert_eq!(r.data_in, out);

    // A bad guard on the second block: ABORTED COMMAND 10/01 with its
    // LBA, and nothing written.
    let mut bad = interleave(&[good(2, 9, 1), good(3, 9, 1)]);
    bad[520 + 512] ^= 0x01;
    let r = t.execute(&n, l0(), &cdb16(0x8a, 1, 2, 2), &bad, 1040);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::GUARD_CHECK_FAILED, Some(3))
    );
    let r = t.execute(&n, l0(), &cdb16(0x88, 3, 2, 2), &[], 1040);
    assert_eq!(r.data_in, out);
    // A reference tag that is not the LBA (type 1): 10/03.
    let (b, mut tu) = good(4, 1, 0);
    tu.reference = 99;
    let r = put(&t, &n, 1, 4, &b, tu);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::REF_TAG_CHECK_FAILED, Some(4))
    );
    // WRPROTECT 100b checks only the guard: the odd reference tag passes...
    let r = put(&t, &n, 4, 4, &b, tu);
    assert_eq!(r.status, Status::Good);
    // ...and a later READ with RDPROTECT 0 (guard and reference checked)
    // reports it; RDPROTECT 100b (guard only) does not.
    let r = t.execute(&n, l0(), &cdb10(0x28, 0, 4, 1), &[], 512);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::REF_TAG_CHECK_FAILED, Some(4))
    );
    let r = t.execute(&n, l0(), &cdb10(0x28, 4, 4, 1), &[], 520);
    assert_eq!(r.status, Status::Good);
    // WRPROTECT 011b checks nothing; 010b checks the reference tag only.
    let (b, mut tu) = good(6, 1, 0);
    tu.guard ^= 0xffff;
    let r = put(&t, &n, 2, 6, &b, tu);
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &cdb10(0x28, 1, 6, 1), &[], 520);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::GUARD_CHECK_FAILED, Some(6))
    );
    let r = t.execute(&n, l0(), &cdb10(0x28, 2, 6, 1), &[], 520);
    assert_eq!(r.status, Status::Good);
    assert_eq!(Tuple::parse(&r.data_in[512..]), tu);
    // Application tag FFFFh escapes every check (type 1).
    let (b, mut tu) = good(7, 1, 0xffff);
    tu.guard ^= 1;
    tu.reference = 0;
    let r = put(&t, &n, 1, 7, &b, tu);
    assert_eq!(r.status, Status::Good);
    assert_eq!(
        t.execute(&n, l0(), &cdb10(0x28, 1, 7, 1), &[], 520).status,
        Status::Good
    );
    // Data-out shorter than 520 bytes per block: refused, not half-written.
    let r = t.execute(&n, l0(), &cdb10(0x2a, 1, 8, 2), &out[..1039], 1039);
    assert_eq!(r.sense.unwrap().key, SenseKey::AbortedCommand);
}

#[test]
fn type3_leaves_the_reference_tag_to_the_client() {
    let (t, n, _) = ram_pi(PiType::Type3);
    let (b, mut tu) = good(1, 3, 0x55);
    tu.reference = 0xdead_beef;
    let r = put(&t, &n, 1, 1, &b, tu);
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &cdb10(0x28, 1, 1, 1), &[], 520);
    assert_eq!(Tuple::parse(&r.data_in[512..]), tu);
    // The guard is still checked.
    tu.guard ^= 2;
    let r = put(&t, &n, 5, 1, &b, tu);
    assert_eq!(sense(&r).1, Asc::GUARD_CHECK_FAILED);
}

#[test]
fn corruption_under_the_target_is_caught_on_read() {
    let (t, n, ram) = ram_pi(PiType::Type1);
    let data: Vec<u8> = (0..4).flat_map(|l| block(l, 2)).collect();
    t.execute(&n, l0(), &cdb10(0x2a, 0, 0, 4), &data, data.len() as u64);
    // One bit flips on the medium in block 2.
    ram.write(2 * BS as u64 + 100, &[data[2 * BS + 100] ^ 0x10], false)
        .unwrap();
    let r = t.execute(&n, l0(), &cdb10(0x28, 0, 0, 4), &[], 4 * 512);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::GUARD_CHECK_FAILED, Some(2))
    );
    assert!(r.data_in.is_empty());
    // VERIFY (BYTCHK 0) is a medium check, PI included.
    let r = t.execute(&n, l0(), &[0x2f, 0, 0, 0, 0, 0, 0, 0, 4, 0], &[], 0);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::GUARD_CHECK_FAILED, Some(2))
    );
    // Blocks around it read fine.
    assert_eq!(
        t.execute(&n, l0(), &cdb10(0x28, 0, 0, 2), &[], 1024).status,
        Status::Good
    );
}

#[test]
fn write_same_unmap_and_compare_and_write_keep_pi() {
    let (t, n, _) = ram_pi(PiType::Type1);
    // WRITE SAME(16) over 4 blocks: one guard, four reference tags.
    let b = block(0, 4);
    let mut ws = vec![0x93, 0];
    ws.extend_from_slice(&8u64.to_be_bytes());
    ws.extend_from_slice(&4u32.to_be_bytes());
    ws.extend_from_slice(&[0, 0]);
    assert_eq!(t.execute(&n, l0(), &ws, &b, 512).status, Status::Good);
    let r = t.execute(&n, l0(), &cdb16(0x88, 1, 8, 4), &[], 4 * 520);
    for (k, c) in r.data_in.chunks(520).enumerate() {
        assert_eq!(
            Tuple::parse(&c[512..]),
            Tuple {
                guard: crc16_t10dif(&b),
                app: 0,
                reference: 8 + k as u32
            }
        );
    }
    // UNMAP block 9: zeroes with all-ones PI (LBPRZ).
    let mut p = vec![0, 22, 0, 16, 0, 0, 0, 0];
    p.extend_from_slice(&9u64.to_be_bytes());
    p.extend_from_slice(&1u32.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    let r = t.execute(&n, l0(), &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24);
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &cdb16(0x88, 1, 9, 1), &[], 520);
    assert_eq!(&r.data_in[..512], &[0; 512]);
    assert_eq!(&r.data_in[512..], &[0xff; 8]);
    // COMPARE AND WRITE on block 10: the new data gets generated PI.
    let mut caw = vec![0x89, 0];
    caw.extend_from_slice(&10u64.to_be_bytes());
    caw.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    let mut d = b.clone();
    let new = block(10, 5);
    d.extend_from_slice(&new);
    assert_eq!(t.execute(&n, l0(), &caw, &d, 1024).status, Status::Good);
    let r = t.execute(&n, l0(), &cdb16(0x88, 1, 10, 1), &[], 520);
    assert_eq!(&r.data_in[..512], &new[..]);
    assert_eq!(Tuple::parse(&r.data_in[512..]).guard, crc16_t10dif(&new));
}

#[test]
fn fileio_keeps_pi_in_a_side_file() {
    let dir = TempDir::new("pi");
    let open = |name: &str| dir.open(name);
    let data_file = open("lun.img");
    data_file.set_len(BLOCKS * BS as u64).unwrap();
    let store = FileIo::with_pi(data_file, open("lun.pi"), BS as u32, false).unwrap();
    // Formatted: 8 bytes of all-ones per block.
    assert_eq!(
        std::fs::read(dir.path("lun.pi")).unwrap(),
        vec![0xff; BLOCKS as usize * 8]
    );
    let (t, n) = target_with(pi_device(PiType::Type1, Arc::new(store)));
    let out = interleave(&[good(5, 1, 0x4242)]);
    assert_eq!(
        t.execute(&n, l0(), &cdb10(0x2a, 1, 5, 1), &out, 520).status,
        Status::Good
    );
    drop(t);
    // The side file holds block 5's tuple at offset 40, in wire order.
    let side = std::fs::read(dir.path("lun.pi")).unwrap();
    assert_eq!(&side[40..48], &out[512..]);
    // Reopened, the PI is still there and still checked.
    let store = FileIo::with_pi(open("lun.img"), open("lun.pi"), BS as u32, false).unwrap();
    let (t, n) = target_with(pi_device(PiType::Type1, Arc::new(store)));
    let r = t.execute(&n, l0(), &cdb10(0x28, 1, 5, 1), &[], 520);
    assert_eq!(r.data_in, out);
    // A side file of the wrong length is refused; so is PI on a store
    // without PI space.
    std::fs::write(dir.path("short.pi"), [0xff; 8]).unwrap();
    assert!(FileIo::with_pi(open("lun.img"), open("short.pi"), BS as u32, false).is_err());
    let cfg = DeviceConfig {
        protection: Some(PiType::Type1),
        ..Default::default()
    };
    assert!(Device::new(cfg, Arc::new(Ram::new(BLOCKS * BS as u64))).is_err());
}

/// READ(32)/WRITE(32) (variable-length CDB 7Fh, SBC-3 5.18/5.38): service
/// action 0009h/000Bh, protect field in byte 10, LBA, expected initial
/// reference tag, expected application tag and mask, transfer length.
fn cdb32(
    write: bool,
    protect: u8,
    lba: u64,
    n: u32,
    reference: u32,
    app: u16,
    mask: u16,
) -> Vec<u8> {
    let mut c = vec![
        0x7f,
        0,
        0,
        0,
        0,
        0,
        0,
        0x18,
        0,
        if write { 0x0b } else { 0x09 },
        protect << 5,
        0,
    ];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&reference.to_be_bytes());
    c.extend_from_slice(&app.to_be_bytes());
    c.extend_from_slice(&mask.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c
}

#[test]
fn type2_takes_pi_in_32_byte_cdbs() {
    let (t, n, _) = ram_pi(PiType::Type2);
    let r = t.execute(
        &n,
        l0(),
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
        32,
    );
    assert_eq!(r.data_in[12], (1 << 1) | 1); // P_TYPE 001b
    let r = t.execute(&n, l0(), &[0x12, 1, 0x86, 0, 64, 0], &[], 64);
    assert_eq!(r.data_in[4], (0b010 << 3) | 0x07); // SPT 010b, GRD/APP/REF_CHK
                                                   // PI in a 10-byte CDB on type 2: INVALID FIELD IN CDB.
    let r = t.execute(&n, l0(), &cdb10(0x28, 1, 0, 1), &[], 520);
    assert_eq!(r.sense, Some(Sense::invalid_field(1, Some(7))));
    // WRITE(32) of blocks 4..6 whose reference tags start at 1000 (the
    // application's numbering, not the LBA) and application tag 0x5a01.
    let blocks: Vec<(Vec<u8>, Tuple)> = (0..2u32)
        .map(|k| {
            let b = block(4 + k as u64, 8);
            let tu = Tuple {
                guard: crc16_t10dif(&b),
                app: 0x5a01,
                reference: 1000 + k,
            };
            (b, tu)
        })
        .collect();
    let out = interleave(&blocks);
    let w = cdb32(true, 1, 4, 2, 1000, 0x5a00, 0xff00);
    assert_eq!(t.plan(&n, l0(), &w).unwrap().len, 1040);
    let r = t.execute(&n, l0(), &w, &out, 1040);
    assert_eq!((r.status, r.sense), (Status::Good, None));
    // Read back with the same expectations: data and PI as written.
    let r = t.execute(
        &n,
        l0(),
        &cdb32(false, 1, 4, 2, 1000, 0x5a00, 0xff00),
        &[],
        1040,
    );
    assert_eq!(r.data_in, out);
    // An expected application tag that differs under the mask: 10/02.
    let r = t.execute(
        &n,
        l0(),
        &cdb32(false, 1, 4, 2, 1000, 0x6600, 0xff00),
        &[],
        1040,
    );
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::APP_TAG_CHECK_FAILED, Some(4))
    );
    // ... but not outside it; a wrong initial reference tag: 10/03 on
    // the first block.
    let r = t.execute(
        &n,
        l0(),
        &cdb32(false, 1, 4, 2, 1000, 0x5aff, 0xff00),
        &[],
        1040,
    );
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &cdb32(false, 1, 4, 2, 1001, 0, 0), &[], 1040);
    assert_eq!(
        sense(&r),
        (SenseKey::AbortedCommand, Asc::REF_TAG_CHECK_FAILED, Some(4))
    );
    // WRITE(32) checks the same way before writing.
    let w = cdb32(true, 1, 4, 2, 1000, 0x7700, 0xff00);
    assert_eq!(
        sense(&t.execute(&n, l0(), &w, &out, 1040)).1,
        Asc::APP_TAG_CHECK_FAILED
    );
    // RDPROTECT 0 on READ(32): checked against the CDB, stripped.
    let r = t.execute(&n, l0(), &cdb32(false, 0, 4, 2, 1000, 0, 0), &[], 1024);
    assert_eq!(r.data_in.len(), 1024);
    assert_eq!(&r.data_in[..512], &blocks[0].0[..]);
    // READ(32) on a type 1 unit, or a unit without PI: not a command there.
    let (t1, n1, _) = ram_pi(PiType::Type1);
    let r = t1.execute(&n1, l0(), &cdb32(false, 0, 0, 1, 0, 0, 0), &[], 512);
    assert_eq!(sense(&r).1, Asc::INVALID_COMMAND_OPERATION_CODE);
    // A bad ADDITIONAL CDB LENGTH or service action: INVALID FIELD IN CDB.
    let mut bad = cdb32(false, 0, 0, 1, 0, 0, 0);
    bad[7] = 0x10;
    assert_eq!(
        t.execute(&n, l0(), &bad, &[], 512).sense,
        Some(Sense::invalid_field(7, None))
    );
    let mut bad = cdb32(false, 0, 0, 1, 0, 0, 0);
    bad[9] = 0x0a;
    assert_eq!(
        t.execute(&n, l0(), &bad, &[], 512).sense,
        Some(Sense::invalid_field(8, None))
    );
}
