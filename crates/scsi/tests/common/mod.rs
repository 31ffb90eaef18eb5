//! Test helpers shared by the core's tests.

#![allow(dead_code)]

use scsi::*;
use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

/// A ram store whose reads stop at a gate until the test opens it, and
/// report on a channel that they have arrived there.
pub struct Gated {
    ram: Ram,
    open: Mutex<bool>,
    cv: Condvar,
    arrived: Mutex<mpsc::Sender<()>>,
}

impl Gated {
    /// A closed gate in front of `blocks` 512-byte blocks, and the
    /// channel that hears of each read arriving at it.
    pub fn new(blocks: u64) -> (Arc<Gated>, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        let g = Arc::new(Gated {
            ram: Ram::new(blocks * 512),
            open: Mutex::new(false),
            cv: Condvar::new(),
            arrived: Mutex::new(tx),
        });
        (g, rx)
    }

    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    pub fn close(&self) {
        *self.open.lock().unwrap() = false;
    }
}

impl Backend for Gated {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let _ = self.arrived.lock().unwrap().send(());
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.ram.write(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

pub fn l0() -> Lun {
    Lun::new(0).unwrap()
}

/// A target with `dev` at LUN 0 and a nexus past its power-on attention.
pub fn target(dev: Device) -> (Target, Nexus) {
    let t = Target::new();
    t.add_lun(None, l0(), Arc::new(dev));
    let n = Nexus::new("a", "p");
    let r = t.execute(&n, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::POWER_ON_RESET);
    (t, n)
}

/// Runs `cdb` on LUN 0, insists on GOOD, returns the data-in.
pub fn ok(t: &Target, n: &Nexus, cdb: &[u8], data: &[u8], expected: u64) -> Vec<u8> {
    let r = t.execute(n, l0(), cdb, data, expected);
    assert_eq!(
        r.status,
        Status::Good,
        "{:02x?}: {:?}",
        cdb,
        r.sense.map(|s| s.to_string())
    );
    r.data_in
}

/// Waits until `n` tasks are in LUN 0's task set (they entered in the
/// order the test submitted them).
pub fn wait_entered(t: &Target, nx: &Nexus, n: usize) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while t.task_set_len(nx, l0()) < n {
        assert!(
            std::time::Instant::now() < end,
            "tasks never entered the task set"
        );
        std::thread::yield_now();
    }
}

/// Submits on a thread of its own.
pub fn spawn_attr(
    t: &Arc<Target>,
    n: &Nexus,
    tag: u64,
    attr: TaskAttr,
    cdb: Vec<u8>,
    data: Vec<u8>,
) -> std::thread::JoinHandle<ScsiResponse> {
    let (t, n) = (t.clone(), n.clone());
    let expected = if data.is_empty() {
        512
    } else {
        data.len() as u64
    };
    std::thread::spawn(move || t.submit_attr(&n, l0(), tag, attr, &cdb, &data, expected))
}

/// A directory of its own under the system temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// `scsi-<tag>-<pid>`, created empty.
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("scsi-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }

    /// Opens (creating) `name` for reading and writing, keeping its bytes.
    pub fn open(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.path(name))
            .unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// PERSISTENT RESERVE OUT on LUN 0 from `n`: service action `sa`, type
/// `ty`, reservation key `key`, service action key `sa_key`.
pub fn pr_out(t: &Target, n: &Nexus, sa: u8, ty: u8, key: u64, sa_key: u64) -> Status {
    let mut p = key.to_be_bytes().to_vec();
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    t.execute(n, l0(), &[0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], &p, 24)
        .status
}
