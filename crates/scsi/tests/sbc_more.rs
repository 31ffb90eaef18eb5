//! Commands and pages the per-command tests did not reach: nullio
//! capacity, VPD B0h/B1h/B2h, WRITE(6)/(12), WRITE AND VERIFY, SYNCHRONIZE
//! CACHE(16), START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL, MODE SENSE
//! default and changeable values, and what reaches the store: FUA, flushes
//! and write-through after MODE SELECT turns the write cache off (proved
//! with a store that counts them).

mod common;

use common::{l0, ok, target};

use scsi::*;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

const BLOCKS: u64 = 64;

/// A ram store counting writes, FUA writes and flushes.
#[derive(Default)]
struct Counting {
    ram: Option<Ram>,
    writes: AtomicU64,
    fua: AtomicU64,
    flushes: AtomicU64,
}

impl Counting {
    fn new() -> Arc<Counting> {
        Arc::new(Counting {
            ram: Some(Ram::new(BLOCKS * 512)),
            ..Default::default()
        })
    }
    fn ram(&self) -> &Ram {
        self.ram.as_ref().unwrap()
    }
    /// (writes, FUA writes, flushes) so far.
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.writes.load(SeqCst),
            self.fua.load(SeqCst),
            self.flushes.load(SeqCst),
        )
    }
}

impl Backend for Counting {
    fn size(&self) -> u64 {
        self.ram().size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram().read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.writes.fetch_add(1, SeqCst);
        if fua {
            self.fua.fetch_add(1, SeqCst);
        }
        self.ram().write(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, SeqCst);
        Ok(())
    }
}

fn counting(cfg: DeviceConfig) -> (Target, Nexus, Arc<Counting>) {
    let c = Counting::new();
    let (t, n) = target(Device::new(cfg, c.clone()).unwrap());
    (t, n, c)
}

fn read10(t: &Target, n: &Nexus, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    ok(t, n, &c, &[], blocks as u64 * 512)
}

fn vpd(t: &Target, n: &Nexus, page: u8) -> Vec<u8> {
    let d = ok(t, n, &[0x12, 1, page, 0, 255, 0], &[], 255);
    assert_eq!(d[1], page);
    assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, d.len() - 4);
    d
}

#[test]
fn nullio_capacity_is_the_configured_size() {
    for (bytes, bs) in [(1u64 << 30, 512u32), (3 << 20, 4096)] {
        let cfg = DeviceConfig {
            block_size: bs,
            ..Default::default()
        };
        let (t, n) = target(Device::new(cfg, Arc::new(NullIo::new(bytes))).unwrap());
        let d = ok(
            &t,
            &n,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[],
            32,
        );
        let last = u64::from_be_bytes(d[0..8].try_into().unwrap());
        assert_eq!(last + 1, bytes / bs as u64);
        assert_eq!(u32::from_be_bytes(d[8..12].try_into().unwrap()), bs);
        let d = ok(&t, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8);
        assert_eq!(
            u32::from_be_bytes(d[0..4].try_into().unwrap()) as u64 + 1,
            bytes / bs as u64
        );
        // Writes vanish; reads are zeroes.
        let mut w = vec![0x2a, 0, 0, 0, 0, 5, 0, 0, 1, 0];
        ok(&t, &n, &w, &vec![0xab; bs as usize], bs as u64);
        w[0] = 0x28;
        assert!(ok(&t, &n, &w, &[], bs as u64).iter().all(|&b| b == 0));
    }
    assert!(Device::new(DeviceConfig::default(), Arc::new(NullIo::new(1000))).is_err());
}

#[test]
fn vpd_block_limits_characteristics_and_provisioning() {
    for thin in [false, true] {
        for rotational in [false, true] {
            let cfg = DeviceConfig {
                thin,
                rotational,
                block_size: 4096,
                ..Default::default()
            };
            let (t, n) = target(Device::new(cfg, Arc::new(Ram::new(BLOCKS * 4096))).unwrap());
            let b0 = vpd(&t, &n, 0xb0);
            assert_eq!(b0.len(), 0x40);
            assert_eq!(b0[4] & 1, 1, "WSNZ");
            assert_eq!(b0[5], 16, "MAXIMUM COMPARE AND WRITE LENGTH");
            assert_eq!(
                &b0[8..12],
                &8192u32.to_be_bytes(),
                "MAXIMUM TRANSFER LENGTH"
            );
            assert_eq!(
                &b0[12..16],
                &8192u32.to_be_bytes(),
                "OPTIMAL TRANSFER LENGTH: the maximum (Linux's max_sectors)"
            );
            let (unmap_lbas, unmap_descs) = if thin { (8192u32, 256u32) } else { (0, 0) };
            assert_eq!(&b0[20..24], &unmap_lbas.to_be_bytes());
            assert_eq!(&b0[24..28], &unmap_descs.to_be_bytes());
            assert_eq!(
                &b0[36..44],
                &8192u64.to_be_bytes(),
                "MAXIMUM WRITE SAME LENGTH"
            );

            let b1 = vpd(&t, &n, 0xb1);
            let rate = u16::from_be_bytes([b1[4], b1[5]]);
            assert_eq!(rate, if rotational { 0 } else { 1 }, "MEDIUM ROTATION RATE");

            let b2 = vpd(&t, &n, 0xb2);
            let rc16 = ok(
                &t,
                &n,
                &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
                &[],
                32,
            );
            if thin {
                // LBPU, LBPWS, LBPWS10, LBPRZ; provisioning type 010b (thin).
                assert_eq!(b2[5], 0x80 | 0x40 | 0x20 | 0x04);
                assert_eq!(b2[6] & 0x07, 2);
                assert_eq!(rc16[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
            } else {
                assert_eq!((b2[5], b2[6] & 0x07), (0, 0));
                assert_eq!(rc16[14] & 0xc0, 0);
            }
        }
    }
}

#[test]
fn write6_write12_and_write_and_verify_store_their_data() {
    let (t, n, c) = counting(DeviceConfig::default());
    // WRITE(6): 21-bit LBA, 1 block; WRITE(12): 32-bit LBA, 2 blocks.
    ok(&t, &n, &[0x0a, 0, 0, 3, 1, 0], &[0x61; 512], 512);
    let mut w12 = vec![0xaa, 0, 0, 0, 0, 10, 0, 0, 0, 2, 0, 0];
    ok(&t, &n, &w12, &[0x62; 1024], 1024);
    assert!(read10(&t, &n, 3, 1).iter().all(|&b| b == 0x61));
    assert!(read10(&t, &n, 10, 2).iter().all(|&b| b == 0x62));
    assert!(
        read10(&t, &n, 4, 1).iter().all(|&b| b == 0),
        "neighbour untouched"
    );
    // WRITE(6) with transfer length 0 means 256 blocks: beyond 64.
    let r = t.execute(&n, l0(), &[0x0a, 0, 0, 0, 0, 0], &[0; 512 * 256], 512 * 256);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(c.counts().1, 0, "no FUA asked so far");
    // WRITE(12) with FUA reaches the store as FUA.
    w12[1] = 0x08;
    ok(&t, &n, &w12, &[0x63; 1024], 1024);
    assert_eq!(c.counts().1, 1);

    // WRITE AND VERIFY(10), BYTCHK 0 and 1: the data is written, and
    // before it is verified it reaches the medium (FUA).
    for (bytchk, fill) in [(0u8, 0x71u8), (1, 0x72)] {
        let before = c.counts();
        let cdb = [0x2e, bytchk << 1, 0, 0, 0, 20, 0, 0, 2, 0];
        ok(&t, &n, &cdb, &[fill; 1024], 1024);
        assert!(read10(&t, &n, 20, 2).iter().all(|&b| b == fill));
        let after = c.counts();
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    }
    // WRITE AND VERIFY(16) with BYTCHK 1, and BYTCHK 11b refused.
    let mut wv16 = vec![0x8e, 0x02, 0, 0, 0, 0, 0, 0, 0, 30, 0, 0, 0, 1, 0, 0];
    ok(&t, &n, &wv16, &[0x73; 512], 512);
    assert!(read10(&t, &n, 30, 1).iter().all(|&b| b == 0x73));
    wv16[1] = 0x06;
    let r = t.execute(&n, l0(), &wv16, &[0; 512], 512);
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn synchronize_cache_flushes_and_fua_reaches_the_store() {
    let (t, n, c) = counting(DeviceConfig::default());
    ok(&t, &n, &[0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0], &[1; 512], 512);
    assert_eq!(c.counts(), (1, 0, 0));
    ok(
        &t,
        &n,
        &[0x2a, 0x08, 0, 0, 0, 1, 0, 0, 1, 0],
        &[1; 512],
        512,
    );
    assert_eq!(c.counts(), (2, 1, 0));
    // SYNCHRONIZE CACHE(10) and (16), the latter for a range.
    ok(&t, &n, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(c.counts().2, 1);
    let sc16 = [0x91, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 16, 0, 0];
    ok(&t, &n, &sc16, &[], 0);
    assert_eq!(c.counts().2, 2);
    // A range past the end is refused without flushing.
    let mut bad = sc16;
    bad[9] = 60;
    let r = t.execute(&n, l0(), &bad, &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(c.counts().2, 2);
    // START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL are accepted and
    // leave the unit ready and its data in place (no medium to move).
    ok(&t, &n, &[0x1b, 0, 0, 0, 0x01, 0], &[], 0); // START
    ok(&t, &n, &[0x1e, 0, 0, 0, 0x01, 0], &[], 0); // PREVENT
    ok(&t, &n, &[0x1e, 0, 0, 0, 0x00, 0], &[], 0); // ALLOW
    ok(&t, &n, &[0; 6], &[], 0);
    assert!(read10(&t, &n, 1, 1).iter().all(|&b| b == 1));
    assert_eq!(c.counts(), (2, 1, 2), "no I/O from them");
}

/// `nv_cache`: FUA, write-through and SYNCHRONIZE CACHE reach the store
/// as plain writes and no flush, and VPD 86h says NV_SUP; `removable`:
/// standard INQUIRY's RMB. Neither is there by default.
#[test]
fn nv_cache_drops_flushes_and_removable_sets_rmb() {
    let (t, n, c) = counting(DeviceConfig::default());
    assert_eq!(vpd(&t, &n, 0x86)[6] & 0x02, 0, "no NV_SUP by default");
    let std_inq = ok(&t, &n, &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(std_inq[1] & 0x80, 0, "not removable by default");
    drop((t, n, c));

    let (t, n, c) = counting(DeviceConfig {
        nv_cache: true,
        removable: true,
        ..Default::default()
    });
    assert_eq!(vpd(&t, &n, 0x86)[6] & 0x02, 0x02, "NV_SUP");
    let std_inq = ok(&t, &n, &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(std_inq[1] & 0x80, 0x80, "RMB");
    // WRITE(10) with FUA, SYNCHRONIZE CACHE(10) and (16).
    ok(
        &t,
        &n,
        &[0x2a, 0x08, 0, 0, 0, 1, 0, 0, 1, 0],
        &[7; 512],
        512,
    );
    ok(&t, &n, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
    let sc16 = [0x91, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 16, 0, 0];
    ok(&t, &n, &sc16, &[], 0);
    assert_eq!(c.counts(), (1, 0, 0), "one plain write, no FUA, no flush");
    assert!(read10(&t, &n, 1, 1).iter().all(|&b| b == 7));
    // Its range is still checked.
    let mut bad = sc16;
    bad[9] = 60;
    let r = t.execute(&n, l0(), &bad, &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
}

/// MODE SENSE(6), DBD, one page with page control `pc`: the page bytes.
fn mode_page(t: &Target, n: &Nexus, pc: u8, page: u8) -> Vec<u8> {
    let d = ok(t, n, &[0x1a, 0x08, pc << 6 | page, 0, 255, 0], &[], 255);
    assert_eq!(d[3], 0, "no block descriptor with DBD");
    assert_eq!(d[4] & 0x3f, page);
    d[4..].to_vec()
}

fn select_caching(t: &Target, n: &Nexus, wce: bool) {
    let mut p = vec![0u8; 4];
    let mut page = vec![0u8; 20];
    page[0] = 0x08;
    page[1] = 18;
    page[2] = if wce { 0x04 } else { 0 };
    p.extend_from_slice(&page);
    ok(
        t,
        n,
        &[0x15, 0x10, 0, 0, p.len() as u8, 0],
        &p,
        p.len() as u64,
    );
}

#[test]
fn mode_sense_changeable_masks_and_defaults() {
    let (t, n, _) = counting(DeviceConfig::default());
    // PC=1: only WCE (caching) and D_SENSE (control) may change.
    let caching = mode_page(&t, &n, 1, 0x08);
    assert_eq!((caching[1], caching[2]), (18, 0x04));
    assert!(caching[3..].iter().all(|&b| b == 0));
    let control = mode_page(&t, &n, 1, 0x0a);
    assert_eq!((control[1], control[2]), (10, 0x04));
    assert!(control[3..].iter().all(|&b| b == 0));
    let ie = mode_page(&t, &n, 1, 0x1c);
    assert!(ie[2..].iter().all(|&b| b == 0));
    // PC=2 defaults stay what the device was configured with while the
    // current values change.
    select_caching(&t, &n, false);
    assert_eq!(mode_page(&t, &n, 0, 0x08)[2] & 0x04, 0, "current WCE off");
    assert_eq!(mode_page(&t, &n, 2, 0x08)[2] & 0x04, 0x04, "default WCE on");
    assert_eq!(
        mode_page(&t, &n, 2, 0x0a)[2] & 0x04,
        0,
        "default D_SENSE off"
    );
    let cfg = DeviceConfig {
        write_cache: false,
        ..Default::default()
    };
    let (t2, n2, _) = counting(cfg);
    assert_eq!(mode_page(&t2, &n2, 2, 0x08)[2] & 0x04, 0);
    // Saved values are not supported.
    let r = t.execute(&n, l0(), &[0x1a, 0x08, 3 << 6 | 0x08, 0, 255, 0], &[], 255);
    assert_eq!(r.sense.unwrap().asc, Asc::SAVING_PARAMETERS_NOT_SUPPORTED);
}

#[test]
fn write_cache_off_makes_every_write_durable() {
    let (t, n, c) = counting(DeviceConfig::default());
    ok(&t, &n, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[1; 512], 512);
    assert_eq!(c.counts(), (1, 0, 0), "write-back: no FUA");
    select_caching(&t, &n, false);
    // WRITE, WRITE SAME and COMPARE AND WRITE all reach the store as FUA.
    ok(&t, &n, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[2; 512], 512);
    assert_eq!(c.counts(), (2, 1, 0));
    ok(&t, &n, &[0x41, 0, 0, 0, 0, 8, 0, 0, 4, 0], &[3; 512], 512);
    assert_eq!(c.counts(), (3, 2, 0));
    let mut caw = vec![2u8; 512];
    caw.extend_from_slice(&[4; 512]);
    let cdb = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
    ok(&t, &n, &cdb, &caw, 1024);
    assert_eq!(c.counts(), (4, 3, 0));
    assert!(read10(&t, &n, 0, 1).iter().all(|&b| b == 4));
    // Write cache on again: write-back.
    select_caching(&t, &n, true);
    ok(&t, &n, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[5; 512], 512);
    assert_eq!(c.counts(), (5, 3, 0));
    // Configured off from the start: the same.
    let cfg = DeviceConfig {
        write_cache: false,
        ..Default::default()
    };
    let (t, n, c) = counting(cfg);
    ok(&t, &n, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[1; 512], 512);
    assert_eq!(c.counts(), (1, 1, 0));
}
