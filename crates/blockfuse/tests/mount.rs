//! Real FUSE mounts over RAM devices: std::fs, fio, ext4 on a loop device,
//! fsync and hole punching reaching the device. A test whose tool or
//! device is missing is skipped, or fails under `CI=true`
//! (`rdma_testkit::need`).

use blockfuse::{mount, DirectIo, Mount, Options};
use blockload::{BlockDevice, RamDevice};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rdma_testkit::need;

/// Whether FUSE mounts work here (`/dev/fuse` and fusermount3); if not,
/// the test is skipped (a failure under `CI=true`).
fn fuse() -> bool {
    need::fuse() && need::tool("fusermount3")
}

/// A unique directory under the temp dir, removed on drop (after the
/// mount that lives in it, which is declared later and so dropped first).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "blockfuse-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A RAM device that counts flushes and unmaps, and can lack unmap.
struct Counting {
    ram: RamDevice,
    flushes: AtomicU64,
    unmaps: AtomicU64,
    can_unmap: bool,
}

impl Counting {
    fn new(bs: u32, blocks: u64) -> Arc<Counting> {
        Arc::new(Counting {
            ram: RamDevice::new(bs, blocks),
            flushes: AtomicU64::new(0),
            unmaps: AtomicU64::new(0),
            can_unmap: true,
        })
    }
}

impl BlockDevice for Counting {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.ram.write_at(lba, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        if !self.can_unmap {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no unmap"));
        }
        self.unmaps.fetch_add(1, Ordering::SeqCst);
        self.ram.unmap(lba, blocks)
    }
}

fn mount_one(dir: &TempDir, dev: Arc<dyn BlockDevice>, options: Options) -> Mount {
    mount(&dir.0, vec![("lun0".into(), dev)], options).expect("FUSE mount")
}

/// Bytes that say where they belong.
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) * 13 % 251) as u8 + 1)
        .collect()
}

/// Runs `cmd`, killing it if it has not finished in `limit`.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own child, which has not
            // been reaped (its waiter is still blocked).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = rx.recv_timeout(Duration::from_secs(10));
            panic!("{cmd:?} did not finish within {limit:?}");
        }
    }
}

fn errno_of(r: io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn bad_names_are_refused_before_mounting() {
    let dir = TempDir::new("names");
    for bad in ["", ".", "..", "a/b", "nul\0"] {
        let dev: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(512, 8));
        let e = mount(&dir.0, vec![(bad.into(), dev)], Options::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
    }
    let a: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(512, 8));
    let e = mount(
        &dir.0,
        vec![("x".into(), a.clone()), ("x".into(), a)],
        Options::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn std_fs_unaligned_io_size_and_limits() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("stdfs");
    let small = Arc::new(RamDevice::new(512, 2048)); // 1 MiB
    let big = Arc::new(RamDevice::new(4096, 512)); // 2 MiB, 4 KiB blocks
    let m = mount(
        &dir.0,
        vec![
            ("lun0".into(), small.clone() as Arc<dyn BlockDevice>),
            ("lun1".into(), big.clone()),
        ],
        Options::default(),
    )
    .unwrap();

    let mut names: Vec<_> = std::fs::read_dir(m.mountpoint())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["lun0", "lun1"]);

    // statfs: the capacity of all devices, nothing free to allocate.
    let c = std::ffi::CString::new(m.mountpoint().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and a zeroed out-struct the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_blocks * st.f_frsize, 3 << 20);
    assert_eq!(st.f_bfree, 0);

    for (name, dev, size) in [("lun0", &small, 1u64 << 20), ("lun1", &big, 2 << 20)] {
        let path = m.path_of(name).unwrap();
        let md = std::fs::metadata(&path).unwrap();
        assert!(md.is_file());
        assert_eq!(md.len(), size);
        assert_eq!(md.permissions().mode() & 0o777, 0o644);

        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut shadow = vec![0u8; size as usize];
        for (off, len) in [
            (1u64, 3usize),
            (511, 2),
            (4095, 4098),
            (100_000, 70_001),
            (size - 7, 7),
        ] {
            let data = pattern(off, len);
            f.write_all_at(&data, off).unwrap();
            shadow[off as usize..off as usize + len].copy_from_slice(&data);
        }
        let mut back = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut back).unwrap();
        assert!(back == shadow, "{name}: read back differs");
        // The bytes are on the device, not in a cache.
        let mut raw = vec![0u8; size as usize];
        dev.read_at(0, &mut raw).unwrap();
        assert!(raw == shadow, "{name}: device content differs");

        // Past the end: no growth, ENOSPC; crossing it: a short write.
        assert_eq!(errno_of(f.write_at(b"x", size)), Some(libc::ENOSPC));
        assert_eq!(f.write_at(&[7u8; 10], size - 4).unwrap(), 4);
        assert_eq!(errno_of(f.set_len(0)), Some(libc::EINVAL));
        assert_eq!(errno_of(f.set_len(size + 1)), Some(libc::EINVAL));
        f.set_len(size).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        assert_eq!(f.read_at(&mut [0u8; 8], size).unwrap(), 0);
    }
    let new = m.mountpoint().join("new");
    assert_eq!(errno_of(File::create(&new)), Some(libc::EPERM));
    assert_eq!(errno_of(std::fs::create_dir(&new)), Some(libc::EPERM));
    assert_eq!(
        errno_of(std::fs::remove_file(m.path_of("lun0").unwrap())),
        Some(libc::EPERM)
    );
    assert_eq!(
        errno_of(std::fs::rename(m.path_of("lun0").unwrap(), &new)),
        Some(libc::EPERM)
    );
    // O_TRUNC would shrink the file: refused.
    assert_eq!(
        errno_of(File::create(m.path_of("lun0").unwrap())),
        Some(libc::EINVAL)
    );
    assert_eq!(
        std::fs::read_dir(m.mountpoint()).unwrap().count(),
        2,
        "no entry was created"
    );
    m.unmount().unwrap();
    assert!(
        std::fs::read_dir(&dir.0).unwrap().next().is_none(),
        "mount point empty again"
    );
}

#[test]
fn read_only_mount() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("ro");
    let dev = Arc::new(RamDevice::new(512, 64));
    dev.write_at(0, &[0x5a; 512]).unwrap();
    let m = mount_one(
        &dir,
        dev,
        Options {
            read_only: true,
            ..Options::default()
        },
    );
    let path = m.path_of("lun0").unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert_eq!(
        errno_of(OpenOptions::new().write(true).open(&path)),
        Some(libc::EROFS)
    );
    let mut b = [0u8; 4];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut b, 508)
        .unwrap();
    assert_eq!(b, [0x5a; 4]);
    m.unmount().unwrap();
}

#[test]
fn fsync_and_close_reach_device_flush() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("fsync");
    let dev = Counting::new(512, 256);
    let m = mount_one(&dir, dev.clone(), Options::default());
    let path = m.path_of("lun0").unwrap();

    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"hello", 3).unwrap();
    let before = dev.flushes.load(Ordering::SeqCst);
    f.sync_all().unwrap();
    let after_fsync = dev.flushes.load(Ordering::SeqCst);
    assert_eq!(after_fsync, before + 1, "fsync -> one flush");
    f.sync_data().unwrap();
    assert_eq!(
        dev.flushes.load(Ordering::SeqCst),
        after_fsync + 1,
        "fdatasync -> one flush"
    );
    drop(f);
    assert_eq!(
        dev.flushes.load(Ordering::SeqCst),
        after_fsync + 1,
        "close of a writer with nothing written since fdatasync -> no flush"
    );

    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"again", 700).unwrap();
    drop(f);
    let after_close = dev.flushes.load(Ordering::SeqCst);
    assert_eq!(
        after_close,
        after_fsync + 2,
        "close of a writer that wrote -> one flush"
    );
    // Opened for writing, nothing written: no flush at close.
    drop(OpenOptions::new().write(true).open(&path).unwrap());
    assert_eq!(dev.flushes.load(Ordering::SeqCst), after_close);

    // A reader's close does not flush.
    drop(File::open(&path).unwrap());
    assert_eq!(dev.flushes.load(Ordering::SeqCst), after_close);
    m.unmount().unwrap();
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: a valid open descriptor and plain integer arguments.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[test]
fn punch_hole_unmaps_and_reads_zeroes() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("punch");
    let dev = Counting::new(512, 256); // 128 KiB
    let m = mount_one(&dir, dev.clone(), Options::default());
    let path = m.path_of("lun0").unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all_at(&[0xaa; 65536], 0).unwrap();

    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, 4096 + 100, 16384).unwrap();
    assert_eq!(dev.unmaps.load(Ordering::SeqCst), 1);
    let mut back = vec![0u8; 65536];
    f.read_exact_at(&mut back, 0).unwrap();
    let hole = 4196..4196 + 16384;
    for (i, b) in back.iter().enumerate() {
        let want = if hole.contains(&i) { 0 } else { 0xaa };
        assert_eq!(*b, want, "byte {i}");
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 128 << 10);

    // ZERO_RANGE writes zeroes without unmapping.
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 30000, 1000).unwrap();
    f.read_exact_at(&mut back[..1002], 29999).unwrap();
    assert_eq!(back[0], 0xaa);
    assert!(back[1..1001].iter().all(|&b| b == 0));
    assert_eq!(back[1001], 0xaa);
    assert_eq!(dev.unmaps.load(Ordering::SeqCst), 1);

    // Growing through fallocate is refused; allocating inside is a no-op.
    assert_eq!(
        errno_of(fallocate(&f, 0, 128 << 10, 4096)),
        Some(libc::ENOSPC)
    );
    fallocate(&f, 0, 0, 4096).unwrap();
    drop(f);
    m.unmount().unwrap();

    // A device without unmap: punching whole blocks is EOPNOTSUPP.
    let dir2 = TempDir::new("punch-nounmap");
    let plain = Arc::new(Counting {
        ram: RamDevice::new(512, 64),
        flushes: AtomicU64::new(0),
        unmaps: AtomicU64::new(0),
        can_unmap: false,
    });
    let m = mount_one(&dir2, plain, Options::default());
    let f = OpenOptions::new()
        .write(true)
        .open(m.path_of("lun0").unwrap())
        .unwrap();
    assert_eq!(
        errno_of(fallocate(&f, punch, 0, 4096)),
        Some(libc::EOPNOTSUPP)
    );
    drop(f);
    m.unmount().unwrap();
}

#[test]
fn page_cache_mode_for_plain_opens_still_reaches_device() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("cached");
    let dev = Arc::new(RamDevice::new(512, 256));
    let m = mount_one(
        &dir,
        dev.clone(),
        Options {
            direct_io: DirectIo::WhenRequested,
            ..Options::default()
        },
    );
    let path = m.path_of("lun0").unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all_at(&pattern(1000, 3000), 1000).unwrap();
    f.sync_all().unwrap();
    let mut raw = vec![0u8; 4096];
    dev.read_at(0, &mut raw).unwrap();
    assert!(raw[1000..4000] == pattern(1000, 3000)[..]);

    // O_DIRECT with an aligned buffer.
    let d = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let mut aligned = AlignedBuf::new(4096);
    aligned.as_mut().copy_from_slice(&pattern(8192, 4096));
    d.write_all_at(aligned.as_mut(), 8192).unwrap();
    dev.read_at(16, &mut raw).unwrap();
    assert!(raw == pattern(8192, 4096));
    drop((f, d));
    m.unmount().unwrap();
}

/// A 4 KiB-aligned buffer for O_DIRECT.
struct AlignedBuf {
    v: Vec<u8>,
    at: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + 4096];
        let at = v.as_ptr().align_offset(4096);
        AlignedBuf { v, at, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.at..self.at + self.len]
    }
}

/// Unmounting while a file is open detaches, aborts the connection after
/// the timeout, returns rather than hanging, and names the process that
/// held the file.
#[test]
fn unmount_of_a_busy_mount_is_bounded() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("busy");
    let dev = Arc::new(RamDevice::new(512, 64));
    let m = mount_one(
        &dir,
        dev,
        Options {
            unmount_timeout: Duration::from_secs(2),
            ..Options::default()
        },
    );
    let f = File::open(m.path_of("lun0").unwrap()).unwrap();
    let r = m.unmount();
    let e = r.expect_err("busy unmount must say it aborted");
    assert!(e.to_string().contains("aborted"), "{e}");
    // It names who kept it busy: this test, through `f`.
    let me = format!("pid {} (", std::process::id());
    assert!(e.to_string().contains(&me), "{e}");
    assert!(
        f.read_at(&mut [0u8; 16], 0).is_err(),
        "I/O after abort fails"
    );
}

/// A mount namespace made while the directory is mounted (`unshare -m`,
/// as `ip netns exec` does) keeps a copy of the mount that our unmount
/// never reaches (private propagation). The unmount still succeeds, in
/// about a second rather than the whole timeout, and the copy's files
/// answer `ENOTCONN` afterwards (the connection is gone).
#[test]
fn a_copy_in_another_mount_namespace_does_not_hold_the_unmount() {
    // A mount namespace of its own needs root (CAP_SYS_ADMIN).
    if !fuse() || !need::root() || !need::tool("unshare") || !need::tool("nsenter") {
        return;
    }
    let dir = TempDir::new("nscopy");
    let dev = Arc::new(RamDevice::new(512, 64));
    let m = mount_one(
        &dir,
        dev,
        Options {
            unmount_timeout: Duration::from_secs(20),
            ..Options::default()
        },
    );
    let file = m.path_of("lun0").unwrap();
    // A namespace holding a copy, until we kill it (bounded: 120 s).
    let mut holder = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "120"])
        .spawn()
        .expect("unshare");
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let ns = format!("/proc/{}/ns/mnt", holder.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(&ns).map_or(true, |n| n == ours) {
        assert!(
            std::time::Instant::now() < deadline,
            "unshare made no namespace"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let in_copy = |args: &[&str]| {
        Command::new("nsenter")
            .arg(format!("--mount={ns}"))
            .args(args)
            .output()
            .unwrap()
    };
    let seen = in_copy(&["stat", "-c", "%s", file.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&seen.stdout).trim(),
        "32768",
        "{seen:?}"
    );

    let started = std::time::Instant::now();
    let r = m.unmount();
    let took = started.elapsed();
    let after = in_copy(&["stat", file.to_str().unwrap()]);
    let _ = holder.kill();
    let _ = holder.wait();
    r.expect("an unmount held only by another namespace's copy succeeds");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(
        !after.status.success(),
        "the copy's file still answers: {after:?}"
    );
    assert!(
        String::from_utf8_lossy(&after.stderr).contains("not connected"),
        "{after:?}"
    );
}

fn fio_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON object.
    let start = text.find('{').unwrap_or_else(|| {
        panic!(
            "no JSON from fio: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio JSON: {e}\n{text}"))
}

fn run_fio(path: &Path, engine: &str, depth: u32) -> serde_json::Value {
    let out = run_bounded(
        Command::new("fio")
            .arg("--name=v")
            .arg(format!("--filename={}", path.display()))
            .args(["--rw=randrw", "--bs=4k", "--size=16m", "--direct=1"])
            .arg(format!("--ioengine={engine}"))
            .arg(format!("--iodepth={depth}"))
            .args([
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--verify_state_save=0",
            ])
            .args(["--randrepeat=1", "--output-format=json"]),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "fio {engine} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    fio_json(&out)
}

#[test]
fn fio_randrw_verify_psync_and_libaio() {
    if !fuse() || !need::tool("fio") {
        return;
    }
    let dir = TempDir::new("fio");
    let dev = Arc::new(RamDevice::new(512, 65536)); // 32 MiB
    let m = mount_one(&dir, dev, Options::default());
    let path = m.path_of("lun0").unwrap();
    for (engine, depth) in [("psync", 1), ("libaio", 8)] {
        let j = run_fio(&path, engine, depth);
        let job = &j["jobs"][0];
        assert_eq!(job["error"].as_i64(), Some(0), "{engine}: {job}");
        let rd = job["read"]["io_bytes"].as_u64().unwrap();
        let wr = job["write"]["io_bytes"].as_u64().unwrap();
        assert!(rd > 0 && wr > 0, "{engine}: read {rd} write {wr}");
        println!("fio {engine} iodepth={depth}: read {rd} B, write {wr} B, no errors");
    }
    m.unmount().unwrap();
}

/// Undoes the ext4 test's side effects in any order of failure.
struct LoopGuard {
    loopdev: Option<String>,
    fs_mount: Option<PathBuf>,
}

impl LoopGuard {
    fn umount_fs(&mut self) {
        if let Some(p) = self.fs_mount.take() {
            let out = run_bounded(Command::new("umount").arg(&p), Duration::from_secs(60));
            assert!(
                out.status.success(),
                "umount {}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    fn detach(&mut self) {
        if let Some(d) = self.loopdev.take() {
            let out = run_bounded(
                Command::new("losetup").args(["-d", &d]),
                Duration::from_secs(60),
            );
            assert!(
                out.status.success(),
                "losetup -d {d}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        if let Some(p) = self.fs_mount.take() {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
        if let Some(d) = self.loopdev.take() {
            let _ = Command::new("losetup").args(["-d", &d]).status();
        }
    }
}

fn sh(cmd: &mut Command) -> Output {
    let out = run_bounded(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn ext4_on_a_loop_device_over_the_file() {
    if !fuse() || !need::tools(&["losetup", "mkfs.ext4", "fsck.ext4", "mount", "umount"]) {
        return;
    }
    let dir = TempDir::new("ext4");
    let fsdir = TempDir::new("ext4-mnt");
    let dev = Counting::new(4096, 16384); // 64 MiB
    let m = mount_one(&dir, dev.clone(), Options::default());
    let path = m.path_of("lun0").unwrap();
    let mut guard = LoopGuard {
        loopdev: None,
        fs_mount: None,
    };

    let out = run_bounded(
        Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&path),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    if !need::have(
        "a loop device",
        (!out.status.success()).then(|| format!("losetup cannot attach: {}", err.trim())),
        "root and /dev/loop-control (modprobe loop)",
    ) {
        return;
    }
    let loopdev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    guard.loopdev = Some(loopdev.clone());
    println!("{} attached as {loopdev}", path.display());

    sh(Command::new("mkfs.ext4").args(["-q", "-F", &loopdev]));
    // The superblock reached the device: ext4 magic 0xEF53 at byte 1080.
    let mut sb = vec![0u8; 4096];
    dev.read_at(0, &mut sb).unwrap();
    assert_eq!(&sb[1080..1082], &[0x53, 0xef], "ext4 magic on the device");

    sh(Command::new("mount")
        .args(["-t", "ext4", &loopdev])
        .arg(&fsdir.0));
    guard.fs_mount = Some(fsdir.0.clone());
    let files: Vec<(String, Vec<u8>)> = [(1usize, 7u64), (4096, 1), (100_000, 2), (3 << 20, 3)]
        .iter()
        .map(|&(len, seed)| (format!("f{seed}-{len}"), pattern(seed * 1_000_003, len)))
        .collect();
    std::fs::create_dir(fsdir.0.join("sub")).unwrap();
    for (name, data) in &files {
        std::fs::write(fsdir.0.join("sub").join(name), data).unwrap();
    }
    let flushes_before = dev.flushes.load(Ordering::SeqCst);
    guard.umount_fs();
    // ext4 issues cache flushes at unmount (journal commit), which the
    // loop driver turns into fsync on the file.
    assert!(
        dev.flushes.load(Ordering::SeqCst) > flushes_before,
        "unmount flushed the device"
    );

    let fsck = run_bounded(
        Command::new("fsck.ext4").args(["-fn", &loopdev]),
        Duration::from_secs(120),
    );
    assert_eq!(
        fsck.status.code(),
        Some(0),
        "fsck.ext4 -fn: {}\n{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );

    println!(
        "fsck.ext4 -fn: {}",
        String::from_utf8_lossy(&fsck.stdout).trim()
    );
    sh(Command::new("mount")
        .args(["-t", "ext4", &loopdev])
        .arg(&fsdir.0));
    guard.fs_mount = Some(fsdir.0.clone());
    for (name, data) in &files {
        let back = std::fs::read(fsdir.0.join("sub").join(name)).unwrap();
        assert!(back == *data, "{name} differs after remount");
    }
    guard.umount_fs();
    guard.detach();
    drop(guard);
    m.unmount().unwrap();
}

/// Threads writing single bytes into the same blocks through the mount
/// (direct I/O, parallel writes allowed) lose none of them.
#[test]
fn concurrent_unaligned_writes_through_the_mount() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("race");
    let dev = Arc::new(RamDevice::new(4096, 16));
    let m = mount_one(
        &dir,
        dev.clone(),
        Options {
            threads: 8,
            ..Options::default()
        },
    );
    let path = m.path_of("lun0").unwrap();
    let writers: Vec<_> = (0..8u64)
        .map(|t| {
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            std::thread::spawn(move || {
                for i in 0..256u64 {
                    f.write_all_at(&[(t + 1) as u8], 4000 + i * 8 + t).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let mut raw = vec![0u8; 8192];
    dev.read_at(0, &mut raw).unwrap();
    for i in 0..2048usize {
        assert_eq!(raw[4000 + i], (i % 8) as u8 + 1, "byte {} lost", 4000 + i);
    }
    m.unmount().unwrap();
}

/// A device whose I/O fails after a point.
struct Broken {
    ram: RamDevice,
    fail: std::sync::atomic::AtomicBool,
}

impl BlockDevice for Broken {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("medium error"));
        }
        self.ram.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("medium error"));
        }
        self.ram.write_at(lba, buf)
    }
    fn flush(&self) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("cache lost"));
        }
        Ok(())
    }
}

#[test]
fn device_errors_are_eio() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("eio");
    let dev = Arc::new(Broken {
        ram: RamDevice::new(512, 64),
        fail: std::sync::atomic::AtomicBool::new(false),
    });
    let m = mount_one(&dir, dev.clone(), Options::default());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path_of("lun0").unwrap())
        .unwrap();
    f.write_all_at(&[1u8; 512], 0).unwrap();
    dev.fail.store(true, Ordering::SeqCst);
    assert_eq!(errno_of(f.read_at(&mut [0u8; 512], 0)), Some(libc::EIO));
    assert_eq!(errno_of(f.write_at(&[2u8; 512], 0)), Some(libc::EIO));
    assert_eq!(
        errno_of(f.write_at(&[2u8; 3], 1)),
        Some(libc::EIO),
        "RMW read fails"
    );
    assert_eq!(errno_of(f.sync_all()), Some(libc::EIO));
    dev.fail.store(false, Ordering::SeqCst);
    drop(f);
    m.unmount().unwrap();
}

/// A RAM device whose reported size can change (a LUN resized at the
/// target): `blocks` of the `ram`'s blocks are shown.
struct Resizable {
    ram: RamDevice,
    blocks: AtomicU64,
}

impl BlockDevice for Resizable {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::SeqCst)
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.ram.write_at(lba, buf)
    }
}

#[test]
fn files_come_go_and_change_size_while_mounted() {
    if !fuse() {
        return;
    }
    let dir = TempDir::new("dynamic");
    let dev = Arc::new(Resizable {
        ram: RamDevice::new(512, 4096),
        blocks: AtomicU64::new(2048),
    });
    let m = mount_one(&dir, dev.clone(), Options::default());
    let lun0 = dir.0.join("lun0");
    assert_eq!(std::fs::metadata(&lun0).unwrap().len(), 1 << 20);

    // Grown: the new size shows at once, and the new end takes writes.
    dev.blocks.store(4096, Ordering::SeqCst);
    assert!(m.resized("lun0"));
    assert!(!m.resized("nothing"));
    assert_eq!(std::fs::metadata(&lun0).unwrap().len(), 2 << 20);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lun0)
        .unwrap();
    f.write_all_at(&pattern(3 << 19, 4096), 3 << 19).unwrap();

    // Added: a second file, with its own device's bytes.
    let one = Arc::new(RamDevice::new(512, 64));
    one.write_at(0, &pattern(0, 512)).unwrap();
    let path = m.add("lun1", one).unwrap();
    assert_eq!(path, m.mountpoint().join("lun1"));
    assert_eq!(m.names(), ["lun0", "lun1"]);
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"lun1".to_string()), "{names:?}");
    let old = File::open(&path).unwrap();
    let mut b = vec![0u8; 512];
    old.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b, pattern(0, 512));
    let taken = m.add("lun1", Arc::new(RamDevice::new(512, 8))).unwrap_err();
    assert_eq!(taken.kind(), io::ErrorKind::InvalidInput);
    assert!(m.add("../x", Arc::new(RamDevice::new(512, 8))).is_err());

    // Removed, then another device under the same name: the old
    // descriptor gets an error, never the new device's bytes.
    assert!(m.remove("lun1"));
    assert!(!m.remove("lun1"));
    assert!(!path.exists());
    assert_eq!(errno_of(old.read_exact_at(&mut b, 0)), Some(libc::ENODEV));
    let other = Arc::new(RamDevice::new(512, 64));
    other.write_at(0, &pattern(7, 512)).unwrap();
    m.add("lun1", other).unwrap();
    assert_eq!(errno_of(old.read_exact_at(&mut b, 0)), Some(libc::ENODEV));
    File::open(&path).unwrap().read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b, pattern(7, 512));

    // Shrunk: reads stop at the new end.
    dev.blocks.store(1024, Ordering::SeqCst);
    m.resized("lun0");
    assert_eq!(std::fs::metadata(&lun0).unwrap().len(), 512 << 10);
    let mut tail = vec![0u8; 4096];
    assert_eq!(f.read_at(&mut tail, (512 << 10) - 1024).unwrap(), 1024);
    drop((f, old));
    m.unmount().unwrap();
}
