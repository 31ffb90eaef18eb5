//! The file and block stores against real files and devices: fileio
//! buffered and O_DIRECT, UNMAP deallocating file blocks, and blockio on
//! loop devices of 512- and 4096-byte logical blocks (as root, with
//! `losetup`; skipped otherwise, or failed under `CI=true`:
//! `rdma_testkit::need`).

mod common;

use common::{ok, target, TempDir};
use scsi::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn rw16(op: u8, lba: u64, blocks: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![op, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&blocks.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// Blocks whose every 8-byte word is the LBA plus `salt`.
fn stamped(lba: u64, blocks: u32, bs: u32, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; (blocks * bs) as usize];
    for (k, b) in v.chunks_mut(bs as usize).enumerate() {
        for w in b.chunks_mut(8) {
            w.copy_from_slice(&(lba + k as u64 + salt).to_be_bytes());
        }
    }
    v
}

fn unmap(t: &Target, n: &Nexus, lba: u64, blocks: u32) {
    let mut p = vec![0, 22, 0, 16, 0, 0, 0, 0];
    p.extend_from_slice(&lba.to_be_bytes());
    p.extend_from_slice(&blocks.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    ok(t, n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24);
}

/// 512-byte units allocated to the file at `path`.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks()
}

/// A file of `len` bytes of 0xab, on disk.
fn full_file(dir: &TempDir, name: &str, len: usize) -> PathBuf {
    let path = dir.path(name);
    std::fs::write(&path, vec![0xab; len]).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    path
}

const MIB: u64 = 1 << 20;

#[test]
fn fileio_unmap_and_write_same_unmap_punch_holes() {
    let dir = TempDir::new("stores-punch");
    for direct in [false, true] {
        let name = format!("img-{direct}");
        let path = full_file(&dir, &name, 4 * MIB as usize);
        let f = dir.open(&name);
        let fio = if direct {
            FileIo::direct(f, false, 512).unwrap()
        } else {
            FileIo::new(f, false).unwrap()
        };
        assert_eq!(fio.is_direct(), direct);
        let cfg = DeviceConfig {
            thin: true,
            ..Default::default()
        };
        let (t, n) = target(Device::new(cfg, Arc::new(fio)).unwrap());
        let before = allocated(&path);
        assert!(before >= 8192, "{before} 512-byte units allocated");
        // UNMAP 1 MiB at LBA 2048 (1 MiB in).
        unmap(&t, &n, 2048, 2048);
        let after = allocated(&path);
        assert!(before - after >= 2048, "{before} -> {after}");
        assert!(ok(&t, &n, &rw16(0x88, 2048, 2048, 0), &[], MIB)
            .iter()
            .all(|&b| b == 0));
        // The neighbours keep their data.
        assert!(ok(&t, &n, &rw16(0x88, 2047, 1, 0), &[], 512)
            .iter()
            .all(|&b| b == 0xab));
        assert!(ok(&t, &n, &rw16(0x88, 4096, 1, 0), &[], 512)
            .iter()
            .all(|&b| b == 0xab));
        // WRITE SAME(16) with UNMAP and a zero block deallocates too.
        ok(&t, &n, &rw16(0x93, 6144, 2048, 0x08), &[0; 512], 512);
        let after2 = allocated(&path);
        assert!(after - after2 >= 2048, "{after} -> {after2}");
        assert!(ok(&t, &n, &rw16(0x88, 6144, 2048, 0), &[], MIB)
            .iter()
            .all(|&b| b == 0));
        // With data other than zeroes it writes that data.
        ok(&t, &n, &rw16(0x93, 2048, 16, 0x08), &[0x5c; 512], 512);
        assert!(ok(&t, &n, &rw16(0x88, 2048, 16, 0), &[], 16 * 512)
            .iter()
            .all(|&b| b == 0x5c));
        assert!(allocated(&path) > after2);
    }
}

#[test]
fn fileio_direct_moves_data_and_refuses_smaller_blocks() {
    let dir = TempDir::new("stores-direct");
    let path = full_file(&dir, "img", MIB as usize);
    let fio = FileIo::direct(dir.open("img"), false, 4096).unwrap();
    // O_DIRECT with 4096-byte alignment cannot serve 512-byte blocks.
    let fio = Arc::new(fio);
    assert!(Device::new(DeviceConfig::default(), fio.clone()).is_err());
    let cfg = DeviceConfig {
        block_size: 4096,
        ..Default::default()
    };
    let (t, n) = target(Device::new(cfg, fio).unwrap());
    let data = stamped(3, 5, 4096, 0);
    ok(&t, &n, &rw16(0x8a, 3, 5, 0x08), &data, data.len() as u64);
    assert_eq!(ok(&t, &n, &rw16(0x88, 3, 5, 0), &[], 5 * 4096), data);
    // Bypassing the page cache, the file holds it at once.
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[3 * 4096..8 * 4096], &data[..]);
    assert!(FileIo::direct(dir.open("img"), false, 100).is_err());
}

/// A loop device attached for the test's lifetime; detached on drop, so
/// on every exit path including a failed assertion.
struct Loop(String);

impl Loop {
    /// Attaches `file` with `sector` logical blocks, or says why not.
    fn attach(file: &Path, sector: u32) -> Result<Loop, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--sector-size", &sector.to_string()])
            .arg(file)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !dev.starts_with("/dev/loop") {
            return Err(format!("losetup printed {dev:?}"));
        }
        Ok(Loop(dev))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let r = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            eprintln!("could not detach {}: {r:?}", self.0);
        }
    }
}

#[test]
fn blockio_takes_size_and_block_size_from_loop_devices() {
    if !rdma_testkit::need::root() || !rdma_testkit::need::tool("losetup") {
        return;
    }
    let dir = TempDir::new("stores-loop");
    for sector in [4096u32, 512] {
        let name = format!("loop-{sector}");
        let path = dir.path(&name);
        let f = dir.open(&name);
        f.set_len(8 * MIB).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let lo = match Loop::attach(&path, sector) {
            Ok(l) => l,
            Err(why) => {
                rdma_testkit::need::WHOLE.skip(
                    &format!("a loop device: {why}"),
                    "modprobe loop; in a container, give it the loop devices",
                );
                return;
            }
        };
        // The block size passed applies to regular files only.
        let other = if sector == 4096 { 512 } else { 4096 };
        let bio = BlockIo::open(Path::new(&lo.0), false, other).unwrap();
        assert!(bio.is_block_device());
        assert_eq!(bio.block_size(), sector, "{}", lo.0);
        assert_eq!(bio.size(), 8 * MIB);
        let bio = Arc::new(bio);
        if sector == 4096 {
            // 512-byte blocks cannot be served by a 4096-byte device.
            assert!(Device::new(DeviceConfig::default(), bio.clone()).is_err());
        }
        let cfg = DeviceConfig {
            block_size: sector,
            thin: true,
            ..Default::default()
        };
        let (t, n) = target(Device::new(cfg, bio).unwrap());
        let blocks = (8 * MIB / sector as u64) as u32;
        let rc = ok(
            &t,
            &n,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[],
            32,
        );
        assert_eq!(
            u64::from_be_bytes(rc[0..8].try_into().unwrap()) + 1,
            blocks as u64
        );
        assert_eq!(u32::from_be_bytes(rc[8..12].try_into().unwrap()), sector);
        // Verified writes: WRITE AND VERIFY(16) with BYTCHK, then READ and
        // VERIFY against the same data, at the start, middle and end.
        let per = 64 * 1024 / sector;
        for lba in [0, blocks as u64 / 2 - 1, (blocks - per) as u64] {
            let data = stamped(lba, per, sector, sector as u64);
            ok(
                &t,
                &n,
                &rw16(0x8e, lba, per, 0x02),
                &data,
                data.len() as u64,
            );
            assert_eq!(
                ok(&t, &n, &rw16(0x88, lba, per, 0), &[], data.len() as u64),
                data
            );
            ok(
                &t,
                &n,
                &rw16(0x8f, lba, per, 0x02),
                &data,
                data.len() as u64,
            );
        }
        ok(&t, &n, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
        let img = std::fs::read(&path).unwrap();
        let lba = blocks as u64 / 2 - 1;
        let at = (lba * sector as u64) as usize;
        assert_eq!(
            &img[at..at + 64 * 1024],
            &stamped(lba, per, sector, sector as u64)[..]
        );
        // UNMAP deallocates in the backing file and reads back zeroes.
        // 4 MiB in: aligned to the backing file system's blocks.
        let mid = blocks as u64 / 2;
        let full = stamped(0, 256 * 1024 / sector, sector, 1);
        ok(
            &t,
            &n,
            &rw16(0x8a, mid, 256 * 1024 / sector, 0x08),
            &full,
            full.len() as u64,
        );
        let before = allocated(&path);
        unmap(&t, &n, mid, 256 * 1024 / sector);
        let after = allocated(&path);
        assert!(before - after >= 256 * 1024 / 512, "{before} -> {after}");
        let back = ok(
            &t,
            &n,
            &rw16(0x88, mid, 256 * 1024 / sector, 0),
            &[],
            full.len() as u64,
        );
        assert!(back.iter().all(|&b| b == 0));
        drop(t);
        drop(lo);
    }
}

#[test]
fn read_vec_agrees_with_read_and_refuses_past_the_end() {
    let ram = scsi::backend::Ram::new(64 * 1024);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    ram.write(4096, &data, false).unwrap();
    let mut by_read = vec![0u8; 8192];
    ram.read(4096, &mut by_read).unwrap();
    assert_eq!(ram.read_vec(4096, 8192).unwrap(), by_read);
    assert_eq!(by_read, data);
    // The default (zero, then read) gives the same bytes.
    let dir = TempDir::new("stores-read-vec");
    let path = full_file(&dir, "img", 64 * 1024);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let fio = scsi::backend::FileIo::new(file, false).unwrap();
    fio.write(4096, &data, false).unwrap();
    assert_eq!(fio.read_vec(4096, 8192).unwrap(), data);
    for (off, len) in [(60 * 1024, 8192), (u64::MAX - 1, 2), (0, usize::MAX)] {
        assert!(
            ram.read_vec(off, len).is_err(),
            "read_vec({off}, {len}) past the end"
        );
    }
}
