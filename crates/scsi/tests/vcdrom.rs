//! The virtual CD-ROM handler over real image files: what an MMC
//! initiator (Linux's sr, cdrom tools) asks of a read-only drive, the
//! image read back byte for byte, no medium, and changing the medium.

mod common;

use common::{l0, target, TempDir};
use scsi::vcdrom::{ImageError, CD_BLOCK};
use scsi::*;
use std::sync::Arc;

const BLOCKS: u64 = 300;

/// An image whose every byte says which block it is in and where.
fn image_bytes(blocks: u64) -> Vec<u8> {
    (0..blocks * CD_BLOCK)
        .map(|i| ((i / CD_BLOCK) as u8) ^ (i as u8).wrapping_mul(31))
        .collect()
}

fn drive(dir: &TempDir, blocks: u64) -> (Target, Nexus, std::path::PathBuf) {
    let path = dir.path("disc.iso");
    std::fs::write(&path, image_bytes(blocks)).unwrap();
    let cd = VCdrom::new(Some(&path)).unwrap();
    let dev = Device::vcdrom(DeviceConfig::default(), cd).unwrap();
    let (t, n) = target(dev);
    (t, n, path)
}

fn check(r: &ScsiResponse) -> (SenseKey, Asc) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    let s = r.sense.unwrap();
    (s.key, s.asc)
}

#[test]
fn an_image_reads_back_byte_for_byte_as_a_read_only_mmc_drive() {
    let dir = TempDir::new("vcd-read");
    let (t, n, _) = drive(&dir, BLOCKS);
    let want = image_bytes(BLOCKS);

    let inq = t
        .execute(&n, l0(), &[0x12, 0, 0, 0, 96, 0], &[], 96)
        .data_in;
    assert_eq!(inq[0], 0x05, "peripheral type 05h: CD/DVD");
    assert_eq!(inq[1], 0x80, "removable");
    assert_eq!(&inq[8..16], b"RUSTSCST");

    assert_eq!(t.execute(&n, l0(), &[0; 6], &[], 0).status, Status::Good);
    let cap = t
        .execute(&n, l0(), &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8)
        .data_in;
    assert_eq!(cap[..4], ((BLOCKS - 1) as u32).to_be_bytes(), "last LBA");
    assert_eq!(cap[4..], 2048u32.to_be_bytes(), "2048-byte blocks");

    // READ(10) of blocks 7..10, READ(12) of 250..300, and the whole disc
    // in 64 KiB READ(10)s into transport pieces of 3000 bytes.
    let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 0, 7, 0, 0, 3, 0], &[], 3 * 2048);
    assert_eq!(r.status, Status::Good);
    assert!(r.data_in == want[7 * 2048..10 * 2048]);
    let cdb12 = [0xa8, 0, 0, 0, 0, 250, 0, 0, 0, 50, 0, 0];
    let r = t.execute(&n, l0(), &cdb12, &[], 50 * 2048);
    assert!(r.data_in == want[250 * 2048..]);
    // READ(16) and READ CAPACITY(16), as initiators written for disks
    // send them.
    let mut cdb16 = [0u8; 16];
    cdb16[0] = 0x88;
    cdb16[9] = 100;
    cdb16[13] = 2;
    let r = t.execute(&n, l0(), &cdb16, &[], 4096);
    assert!(r.data_in == want[100 * 2048..102 * 2048]);
    let rc16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let cap = t.execute(&n, l0(), &rc16, &[], 32).data_in;
    assert_eq!(cap[..8], (BLOCKS - 1).to_be_bytes());
    assert_eq!(cap[8..12], 2048u32.to_be_bytes());
    let mut back = Vec::new();
    for lba in (0..BLOCKS as u32).step_by(32) {
        let count = (BLOCKS as u32 - lba).min(32) as u16;
        let len = count as usize * 2048;
        let mut space = vec![0u8; len];
        let mut pieces: Vec<&mut [u8]> = space.chunks_mut(3000).collect();
        let mut bufs = Buffers::data_in(&mut pieces);
        let [l0_, l1, l2, l3] = lba.to_be_bytes();
        let [c0, c1] = count.to_be_bytes();
        let cdb = [0x28, 0, l0_, l1, l2, l3, 0, c0, c1, 0];
        let r = t.submit_attr_into(
            &n,
            l0(),
            1,
            TaskAttr::Simple,
            &cdb,
            &[],
            len as u64,
            Some(&mut bufs),
        );
        assert_eq!((r.status, r.residual), (Status::Good, Residual::None));
        assert!(r.data_in.is_empty(), "copied into the pieces");
        back.extend_from_slice(&space);
    }
    assert!(back == want, "the whole image, byte for byte");

    // Two blocks asked for, room for one: the first, and an overflow.
    let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 0, 7, 0, 0, 2, 0], &[], 2048);
    assert_eq!((r.status, r.residual), (Status::Good, Residual::Over(2048)));
    assert!(r.data_in == want[7 * 2048..8 * 2048]);
    // Less TOC than the transport's room: an underrun, not an overflow.
    let r = t.execute(&n, l0(), &[0x43, 0, 0, 0, 0, 0, 0, 0, 100, 0], &[], 100);
    assert_eq!((r.data_in.len(), r.residual), (20, Residual::Under(80)));

    // Past the end: LBA OUT OF RANGE. Writes: DATA PROTECT.
    let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 1, 0x2b, 0, 0, 2, 0], &[], 4096);
    assert_eq!(check(&r), (SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE));
    for w in [
        vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        vec![0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        vec![0x0a, 0, 0, 0, 1, 0],
    ] {
        let r = t.execute(&n, l0(), &w, &[0u8; 2048], 2048);
        assert_eq!(
            check(&r),
            (SenseKey::DataProtect, Asc::WRITE_PROTECTED),
            "{w:02x?}"
        );
    }
    let r = t.execute(&n, l0(), &[0xf0, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(check(&r).1, Asc::INVALID_COMMAND_OPERATION_CODE);
}

#[test]
fn toc_configuration_mode_page_and_events_describe_one_data_track() {
    let dir = TempDir::new("vcd-toc");
    let (t, n, _) = drive(&dir, BLOCKS);
    // READ TOC format 0, LBA: header (length 18, tracks 1..1), track 1 at
    // 0 (ADR 1, data), lead-out AAh at the capacity.
    let toc = t
        .execute(&n, l0(), &[0x43, 0, 0, 0, 0, 0, 0, 0x03, 0x24, 0], &[], 804)
        .data_in;
    assert_eq!(
        toc,
        [
            0,
            18,
            1,
            1, //
            0,
            0x14,
            1,
            0,
            0,
            0,
            0,
            0, //
            0,
            0x14,
            0xaa,
            0,
            0,
            0,
            (BLOCKS >> 8) as u8,
            BLOCKS as u8
        ]
    );
    // MSF: 300 blocks + 150 = 450 frames = 0:06:00.
    let toc = t
        .execute(&n, l0(), &[0x43, 0x02, 0, 0, 0, 0, 0, 0, 100, 0], &[], 100)
        .data_in;
    assert_eq!(&toc[8..12], &[0, 0, 2, 0], "track 1 at 00:02:00");
    assert_eq!(&toc[16..20], &[0, 0, 6, 0], "lead-out at 00:06:00");
    // Format 1: one session, its first track 1.
    let s = t
        .execute(&n, l0(), &[0x43, 0, 1, 0, 0, 0, 0, 0, 12, 0], &[], 12)
        .data_in;
    assert_eq!(s, [0, 10, 1, 1, 0, 0x14, 1, 0, 0, 0, 0, 0]);
    let r = t.execute(&n, l0(), &[0x43, 0, 4, 0, 0, 0, 0, 0, 12, 0], &[], 12);
    assert_eq!(
        check(&r).1,
        Asc::INVALID_FIELD_IN_CDB,
        "ATIP is not a CD-ROM's"
    );

    // GET CONFIGURATION: current profile CD-ROM, the Profile List first.
    let c = t
        .execute(&n, l0(), &[0x46, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256)
        .data_in;
    assert_eq!(&c[6..8], &[0, 8], "current profile 0008h");
    assert_eq!(&c[8..10], &[0, 0], "Profile List");
    assert_eq!(&c[12..16], &[0, 8, 1, 0], "CD-ROM, current");
    let len = u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize;
    assert_eq!(len + 4, c.len());
    // RT 2: only the feature asked for (Random Readable, 2048 blocks).
    let c = t
        .execute(&n, l0(), &[0x46, 2, 0, 0x10, 0, 0, 0, 1, 0, 0], &[], 256)
        .data_in;
    assert_eq!(c.len(), 8 + 12);
    assert_eq!(&c[8..10], &[0, 0x10]);
    assert_eq!(&c[12..16], &2048u32.to_be_bytes());

    // MODE SENSE(10) of page 2Ah.
    let m = t
        .execute(
            &n,
            l0(),
            &[0x5a, 0x08, 0x2a, 0, 0, 0, 0, 0, 255, 0],
            &[],
            255,
        )
        .data_in;
    assert_eq!(u16::from_be_bytes([m[0], m[1]]) as usize + 2, m.len());
    assert_eq!(&m[8..10], &[0x2a, 20]);
    let r = t.execute(&n, l0(), &[0x5a, 0, 0x08, 0, 0, 0, 0, 0, 255, 0], &[], 255);
    assert_eq!(check(&r).1, Asc::INVALID_FIELD_IN_CDB, "no caching page");

    // GET EVENT STATUS NOTIFICATION, media class: medium present, no event.
    let e = t
        .execute(&n, l0(), &[0x4a, 1, 0, 0, 0x10, 0, 0, 0, 8, 0], &[], 8)
        .data_in;
    assert_eq!(e, [0, 6, 4, 0x10, 0, 0x02, 0, 0]);
}

#[test]
fn no_medium_and_a_changed_medium() {
    let dir = TempDir::new("vcd-change");
    let empty = dir.path("empty.iso");
    std::fs::write(&empty, b"").unwrap();
    for cd in [
        VCdrom::new(None).unwrap(),
        VCdrom::new(Some(&empty)).unwrap(),
    ] {
        assert_eq!(cd.blocks(), 0);
        let dev = Device::vcdrom(DeviceConfig::default(), cd).unwrap();
        let (t, n) = target(dev);
        let not_ready = (SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT);
        assert_eq!(check(&t.execute(&n, l0(), &[0; 6], &[], 0)), not_ready);
        let r = t.execute(&n, l0(), &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8);
        assert_eq!(check(&r), not_ready);
        let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 2048);
        assert_eq!(check(&r), not_ready);
        // INQUIRY and GET CONFIGURATION still answer: no current profile.
        assert_eq!(
            t.execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
                .data_in[0],
            5
        );
        let c = t
            .execute(&n, l0(), &[0x46, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256)
            .data_in;
        assert_eq!(&c[6..8], &[0, 0]);
    }

    // A medium loaded into a running drive: every nexus hears 28/00 once,
    // GET EVENT STATUS reports new media once, the image reads.
    let dir2 = TempDir::new("vcd-change2");
    let (t, a, first) = drive(&dir2, 10);
    let b = Nexus::new("b", "p");
    let r = t.execute(&b, l0(), &[0; 6], &[], 0);
    assert_eq!(check(&r).1, Asc::POWER_ON_RESET);
    let second = dir.path("second.iso");
    std::fs::write(&second, image_bytes(20)).unwrap();
    let dev = t.device(&a, l0()).unwrap();
    assert_eq!((dev.block_size(), dev.blocks()), (2048, 10));
    t.change_medium(&dev, Some(&second)).unwrap();
    assert_eq!(dev.blocks(), 20, "the new disc's blocks");
    assert_eq!(dev.vcdrom_handler().unwrap().image(), Some(second.clone()));
    for n in [&a, &b] {
        let r = t.execute(n, l0(), &[0; 6], &[], 0);
        assert_eq!(
            check(&r),
            (SenseKey::UnitAttention, Asc::NOT_READY_TO_READY_CHANGE)
        );
        assert_eq!(t.execute(n, l0(), &[0; 6], &[], 0).status, Status::Good);
    }
    let gesn = [0x4a, 1, 0, 0, 0x10, 0, 0, 0, 8, 0];
    let e = t.execute(&a, l0(), &gesn, &[], 8).data_in;
    assert_eq!(&e[4..6], &[2, 0x02], "new media, present");
    let e = t.execute(&a, l0(), &gesn, &[], 8).data_in;
    assert_eq!(&e[4..6], &[0, 0x02], "reported once");
    let cap = t
        .execute(&a, l0(), &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8)
        .data_in;
    assert_eq!(cap[..4], 19u32.to_be_bytes(), "the new disc's capacity");
    let r = t.execute(&a, l0(), &[0x28, 0, 0, 0, 0, 19, 0, 0, 1, 0], &[], 2048);
    assert!(r.data_in == image_bytes(20)[19 * 2048..]);

    // A bad image leaves the disc in: not whole blocks, not a file.
    let odd = dir.path("odd.iso");
    std::fs::write(&odd, vec![0u8; 3000]).unwrap();
    let e = t.change_medium(&dev, Some(&odd)).unwrap_err();
    assert!(matches!(e, ImageError::Size { size: 3000, .. }), "{e}");
    assert!(e.to_string().contains("2048-byte"), "{e}");
    let e = t.change_medium(&dev, Some(&dir.0)).unwrap_err();
    assert!(matches!(e, ImageError::NotFile { .. }), "{e}");
    let e = VCdrom::new(Some(&dir.path("absent.iso"))).err().unwrap();
    assert!(matches!(e, ImageError::Open { .. }), "{e}");
    assert_eq!(dev.vcdrom_handler().unwrap().blocks(), 20);

    // PREVENT MEDIUM REMOVAL holds the disc against START STOP UNIT's
    // eject; ALLOW lets it go, and the drive is then empty.
    let eject = [0x1b, 0, 0, 0, 0x02, 0];
    assert_eq!(
        t.execute(&a, l0(), &[0x1e, 0, 0, 0, 1, 0], &[], 0).status,
        Status::Good
    );
    let r = t.execute(&a, l0(), &eject, &[], 0);
    assert_eq!(
        check(&r),
        (SenseKey::IllegalRequest, Asc::MEDIUM_REMOVAL_PREVENTED)
    );
    assert_eq!(
        t.execute(&a, l0(), &[0x1e, 0, 0, 0, 0, 0], &[], 0).status,
        Status::Good
    );
    assert_eq!(t.execute(&a, l0(), &eject, &[], 0).status, Status::Good);
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(check(&r), (SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT));
    let e = t.execute(&a, l0(), &gesn, &[], 8).data_in;
    assert_eq!(&e[4..6], &[3, 0], "media removal, none present");

    // An emulated disk has no medium to change.
    let disk = Arc::new(Device::new(DeviceConfig::default(), Arc::new(Ram::new(4096))).unwrap());
    let e = t.change_medium(&disk, Some(&first)).unwrap_err();
    assert!(matches!(e, ImageError::NotCdrom), "{e}");
}
