//! Workloads over RAM devices, some of them deliberately broken: the
//! verifier must catch every kind of damage and a healthy device must pass.

use blockload::{run, BlockDevice, Pattern, RamDevice, Workload};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn workload(pattern: Pattern, jobs: u32, size: u64) -> Workload {
    let mut w = Workload::new(pattern);
    w.jobs = jobs;
    w.size = Some(size);
    w.runtime = Duration::from_secs(60);
    w.verify = true;
    w
}

/// Writes the region once, then runs `pattern` verified on the same device.
fn fill_then(dev: Arc<dyn BlockDevice>, pattern: Pattern, jobs: u32) -> blockload::Report {
    let region = dev.num_blocks() * dev.block_size() as u64;
    // One run keeps one generation table, so fill and check in one workload:
    // a random mix over a small region writes and re-reads every block many times.
    let mut w = workload(pattern, jobs, region * 8);
    w.region = Some(region);
    run(dev, &w, |_| {}).unwrap()
}

#[test]
fn a_healthy_device_passes_and_reads_are_checked() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let r = fill_then(dev, Pattern::RandRw { read_pct: 50 }, 4);
    assert!(r.ok(), "{}", r.table());
    assert!(r.read.ios > 0 && r.write.ios > 0);
    assert!(
        r.verified_bytes > 512 * 1024,
        "most reads hit written blocks: {}",
        r.table()
    );
    assert!(r.read.lat_p50_us > 0.0 && r.read.lat_p99_us >= r.read.lat_p50_us);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["verify_failures"], 0);
    assert_eq!(json["bs"], 4096);
}

/// Acknowledges every `nth` write without storing it.
struct LosesWrites {
    inner: RamDevice,
    nth: u64,
    count: AtomicU64,
}

/// Stores every `nth` write one I/O block further on.
struct MisdirectsWrites {
    inner: RamDevice,
    nth: u64,
    count: AtomicU64,
}

/// Flips a bit in every `nth` read.
struct CorruptsReads {
    inner: RamDevice,
    nth: u64,
    count: AtomicU64,
}

/// Fails every I/O after the first `ok` ones.
struct FailsAfter {
    inner: RamDevice,
    ok: u64,
    count: AtomicU64,
}

macro_rules! delegate_geometry {
    () => {
        fn block_size(&self) -> u32 {
            self.inner.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.inner.num_blocks()
        }
    };
}

impl BlockDevice for LosesWrites {
    delegate_geometry!();
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        if self.count.fetch_add(1, Ordering::Relaxed) % self.nth == self.nth - 1 {
            return Ok(());
        }
        self.inner.write_at(lba, buf)
    }
}

impl BlockDevice for MisdirectsWrites {
    delegate_geometry!();
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let blocks = (buf.len() / 512) as u64;
        if self.count.fetch_add(1, Ordering::Relaxed) % self.nth == self.nth - 1
            && lba + 2 * blocks <= self.num_blocks()
        {
            return self.inner.write_at(lba + blocks, buf);
        }
        self.inner.write_at(lba, buf)
    }
}

impl BlockDevice for CorruptsReads {
    delegate_geometry!();
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(lba, buf)?;
        if self.count.fetch_add(1, Ordering::Relaxed) % self.nth == self.nth - 1 {
            buf[100] ^= 0x01;
        }
        Ok(())
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(lba, buf)
    }
}

impl BlockDevice for FailsAfter {
    delegate_geometry!();
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.ok {
            return Err(io::Error::other("medium error"));
        }
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.ok {
            return Err(io::Error::other("medium error"));
        }
        self.inner.write_at(lba, buf)
    }
}

#[test]
fn lost_writes_are_caught() {
    let dev = Arc::new(LosesWrites {
        inner: RamDevice::new(512, 1024),
        nth: 37,
        count: AtomicU64::new(0),
    });
    let r = fill_then(dev, Pattern::RandRw { read_pct: 50 }, 2);
    assert!(r.verify_failures > 0, "{}", r.table());
    assert!(
        r.verify_errors
            .iter()
            .all(|e| e.what.starts_with("stale data") || e.what.starts_with("zeros")),
        "{:?}",
        r.verify_errors
    );
}

#[test]
fn misplaced_writes_are_caught() {
    let dev = Arc::new(MisdirectsWrites {
        inner: RamDevice::new(512, 1024),
        nth: 41,
        count: AtomicU64::new(0),
    });
    let r = fill_then(dev, Pattern::RandRw { read_pct: 50 }, 1);
    assert!(
        r.verify_errors
            .iter()
            .any(|e| e.what.starts_with("misplaced data")),
        "{}",
        r.table()
    );
}

#[test]
fn corrupt_reads_are_caught() {
    let dev = Arc::new(CorruptsReads {
        inner: RamDevice::new(512, 1024),
        nth: 13,
        count: AtomicU64::new(0),
    });
    let r = fill_then(dev, Pattern::RandRw { read_pct: 70 }, 2);
    assert!(r.verify_failures > 0);
    assert!(r
        .verify_errors
        .iter()
        .all(|e| e.what.starts_with("corrupt data")));
}

/// A read-only workload with verify on writes its region first (untimed),
/// so every read it times is checked: before, it verified 0 bytes and
/// passed whatever the device returned.
#[test]
fn verified_read_only_workloads_check_every_read() {
    for (pattern, jobs) in [(Pattern::RandRead, 3), (Pattern::Read, 1)] {
        let dev = Arc::new(RamDevice::new(512, 2048)); // 1 MiB
        let mut w = workload(pattern, jobs, 4 << 20);
        w.bs = 4096;
        let r = run(dev, &w, |_| {}).unwrap();
        assert!(r.ok(), "{pattern:?}: {}", r.table());
        assert_eq!(r.write.ios, 0, "{pattern:?}: the fill is not timed");
        // Every timed read, and the read-back of the region after them.
        assert!(
            r.verified_bytes >= (4 << 20) + (1 << 20),
            "{pattern:?}: {}",
            r.table()
        );
    }
    let dev = Arc::new(CorruptsReads {
        inner: RamDevice::new(512, 1024),
        nth: 13,
        count: AtomicU64::new(0),
    });
    let r = run(dev, &workload(Pattern::RandRead, 2, 1 << 20), |_| {}).unwrap();
    assert!(r.verify_failures > 0, "{}", r.table());
}

#[test]
fn io_errors_stop_the_job_and_are_reported() {
    let dev = Arc::new(FailsAfter {
        inner: RamDevice::new(4096, 256),
        ok: 10,
        count: AtomicU64::new(0),
    });
    let r = run(dev, &workload(Pattern::Write, 1, 1 << 20), |_| {}).unwrap();
    assert_eq!(r.io_errors, 1);
    assert_eq!(r.write.ios, 10);
    let e = r.first_io_error.as_deref().unwrap();
    assert!(
        e.contains("write at byte offset 0xa000") && e.contains("medium error"),
        "{e}"
    );
    assert!(!r.ok());
}

#[test]
fn sequential_patterns_cover_the_region_and_progress_is_reported() {
    let dev = Arc::new(RamDevice::new(4096, 512));
    let mut seen = Vec::new();
    let w = workload(Pattern::Write, 2, 2 << 20);
    let r = run(dev.clone(), &w, |p| seen.push(p.bytes)).unwrap();
    assert_eq!(r.write.bytes, 2 << 20);
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(*seen.last().unwrap(), 2 << 20);
    // Every block was written: no zero block is left.
    let mut buf = vec![0u8; 4096];
    for lba in 0..512 {
        dev.read_at(lba, &mut buf).unwrap();
        assert!(buf.iter().any(|&b| b != 0), "block {lba} never written");
    }
}

#[test]
fn workloads_the_device_cannot_run_are_refused() {
    let dev: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(4096, 16));
    let mut w = workload(Pattern::Read, 1, 4096);
    w.bs = 512;
    let e = run(dev.clone(), &w, |_| {}).unwrap_err();
    assert!(
        e.0.contains("not a multiple of the device block size 4096"),
        "{e}"
    );
    let mut w = workload(Pattern::Read, 1, 4096);
    w.region = Some(1 << 30);
    let e = run(dev.clone(), &w, |_| {}).unwrap_err();
    assert!(e.0.contains("larger than the device"), "{e}");
    let w = workload(Pattern::Read, 17, 4096);
    let e = run(dev, &w, |_| {}).unwrap_err();
    assert!(e.0.contains("fewer than 17 jobs"), "{e}");
    assert!("bogus"
        .parse::<Pattern>()
        .unwrap_err()
        .to_string()
        .contains("unknown pattern `bogus`"));
}

#[test]
fn a_verified_write_run_reads_back_everything_it_wrote() {
    // 1 MiB region, 4 KiB writes: 256 blocks, all written once.
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::Write, 4, 1 << 20);
    w.region = Some(1 << 20);
    let r = run(dev, &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert_eq!(r.read.ios, 0, "the read-back is not a timed read");
    assert_eq!(r.verified_bytes, 1 << 20, "{}", r.table());

    // The same run on a device that drops one write in 50: the read-back
    // finds each lost one although the run itself issued no reads.
    let dev = Arc::new(LosesWrites {
        inner: RamDevice::new(512, 2048),
        nth: 50,
        count: AtomicU64::new(0),
    });
    let r = run(dev, &w, |_| {}).unwrap();
    // 256 writes, every 50th lost: 5 blocks of 8 units each.
    assert_eq!(r.verify_failures, 5 * 8, "{}", r.table());
    assert_eq!(r.verified_bytes, (1 << 20) - 5 * 4096, "{}", r.table());
}

/// A RAM device with a queue whose I/Os take effect when they complete,
/// newest first (so completions come out of order), optionally losing
/// every `lose_nth` write; it remembers the most I/Os it had in flight.
struct QueuedRam {
    inner: RamDevice,
    lose_nth: u64,
    writes: AtomicU64,
    max_in_flight: AtomicU64,
    /// Reads started in place land in the queue's own buffers, copied
    /// out only by `read_back` (counted).
    in_place: bool,
    read_backs: AtomicU64,
}

enum Op {
    Read(u64, usize),
    ReadInPlace(u64, usize),
    Write(u64, Vec<u8>),
}

struct Q<'a> {
    dev: &'a QueuedRam,
    started: Vec<(usize, Op)>,
    kept: std::collections::HashMap<usize, Vec<u8>>,
}

impl blockload::IoQueue for Q<'_> {
    fn start_read(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()> {
        self.started.push((slot, Op::Read(lba, len)));
        self.note();
        Ok(())
    }
    fn start_write(&mut self, slot: usize, lba: u64, data: &[u8]) -> io::Result<()> {
        self.started.push((slot, Op::Write(lba, data.to_vec())));
        self.note();
        Ok(())
    }
    fn start_read_in_place(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()> {
        if !self.dev.in_place {
            return self.start_read(slot, lba, len);
        }
        self.kept.remove(&slot);
        self.started.push((slot, Op::ReadInPlace(lba, len)));
        self.note();
        Ok(())
    }
    fn read_back(&mut self, slot: usize, out: &mut [u8]) -> io::Result<()> {
        if let Some(k) = self.kept.get(&slot) {
            out[..k.len()].copy_from_slice(k);
            self.dev.read_backs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
    fn complete_one(&mut self, bufs: &mut [Vec<u8>]) -> Option<(usize, io::Result<()>)> {
        let (slot, op) = self.started.pop()?;
        let r = match op {
            Op::Read(lba, len) => self.dev.inner.read_at(lba, &mut bufs[slot][..len]),
            Op::ReadInPlace(lba, len) => {
                let mut k = vec![0u8; len];
                let r = self.dev.inner.read_at(lba, &mut k);
                self.kept.insert(slot, k);
                r
            }
            Op::Write(lba, data) => {
                let n = self.dev.writes.fetch_add(1, Ordering::Relaxed);
                if self.dev.lose_nth > 0 && n % self.dev.lose_nth == self.dev.lose_nth - 1 {
                    Ok(())
                } else {
                    self.dev.inner.write_at(lba, &data)
                }
            }
        };
        Some((slot, r))
    }
}

impl Q<'_> {
    fn note(&self) {
        self.dev
            .max_in_flight
            .fetch_max(self.started.len() as u64, Ordering::Relaxed);
    }
}

impl BlockDevice for QueuedRam {
    delegate_geometry!();
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(lba, buf)
    }
    fn queue(&self, _depth: usize) -> Option<Box<dyn blockload::IoQueue + '_>> {
        Some(Box::new(Q {
            dev: self,
            started: Vec::new(),
            kept: Default::default(),
        }))
    }
}

fn queued(lose_nth: u64) -> Arc<QueuedRam> {
    Arc::new(QueuedRam {
        inner: RamDevice::new(512, 2048),
        lose_nth,
        writes: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        in_place: false,
        read_backs: AtomicU64::new(0),
    })
}

/// Reads a queue keeps in place are copied out to be verified, and only
/// then: a run that verifies reads every one back (and finds lost
/// writes through them), one that does not leaves them where they are.
#[test]
fn reads_kept_in_place_are_read_back_only_to_be_verified() {
    let region = 2048 * 512;
    for (verify, lose_nth) in [(true, 0), (true, 29), (false, 0)] {
        let dev = Arc::new(QueuedRam {
            in_place: true,
            ..Arc::into_inner(queued(lose_nth)).expect("fresh")
        });
        let mut w = workload(Pattern::RandRw { read_pct: 50 }, 1, region * 8);
        w.region = Some(region);
        w.iodepth = 8;
        w.verify = verify;
        let r = run(dev.clone(), &w, |_| {}).unwrap();
        let read_backs = dev.read_backs.load(Ordering::Relaxed);
        assert!(r.read.ios > 0, "{}", r.table());
        match (verify, lose_nth) {
            (true, 0) => {
                assert!(r.ok(), "{}", r.table());
                assert_eq!(read_backs, r.read.ios, "{}", r.table());
            }
            (true, _) => assert!(r.verify_failures > 0, "{}", r.table()),
            (false, _) => assert_eq!(read_backs, 0, "{}", r.table()),
        }
    }
}

#[test]
fn the_queued_engine_keeps_many_in_flight_and_verifies_out_of_order_completions() {
    let dev = queued(0);
    let region = 2048 * 512;
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 2, region * 8);
    w.region = Some(region);
    w.iodepth = 8;
    let r = run(dev.clone(), &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes > 512 * 1024, "{}", r.table());
    assert_eq!(r.read.ios + r.write.ios, region * 8 / 4096, "{}", r.table());
    assert_eq!(
        dev.max_in_flight.load(Ordering::Relaxed),
        8,
        "one queue per job, 8 deep"
    );
}

#[test]
fn the_queued_engine_catches_lost_writes() {
    let dev = queued(29);
    let region = 2048 * 512;
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 1, region * 8);
    w.region = Some(region);
    w.iodepth = 16;
    let r = run(dev, &w, |_| {}).unwrap();
    assert!(r.verify_failures > 0, "{}", r.table());
}

#[test]
fn iodepth_without_a_queue_runs_a_thread_per_io() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 2, 1 << 20);
    w.region = Some(1 << 20);
    w.iodepth = 4;
    let r = run(dev, &w, |_| {}).unwrap();
    assert!(r.ok(), "{}", r.table());
    assert_eq!(r.jobs, 8, "{}", r.table());
}

#[test]
fn a_queue_without_flush_or_unmap_says_so() {
    let dev = queued(0);
    let mut q = dev.queue(2).unwrap();
    for r in [q.start_flush(0), q.start_unmap(1, 0, 8)] {
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Unsupported);
    }
    let mut bufs = vec![Vec::new(); 2];
    assert!(q.complete_one(&mut bufs).is_none(), "nothing was started");
}

/// The stop flag (an interrupt) ends a long run within moments: what was
/// done so far is reported as interrupted, and the read-back is skipped.
#[test]
fn a_stop_flag_ends_the_run_with_a_partial_report() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::Write, 2, u64::MAX / 2);
    w.region = Some(1 << 20);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = std::time::Instant::now();
    let r = blockload::run_until(dev, &w, stop.clone(), |p| {
        if p.bytes > 0 {
            stop.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(r.stopped, blockload::Stopped::Interrupted, "{}", r.table());
    assert!(r.write.ios > 0, "{}", r.table());
    assert_eq!(r.verified_bytes, 0, "no read-back: {}", r.table());
    let t = r.table();
    assert!(
        t.contains("interrupted after") && t.contains("read-back skipped"),
        "{t}"
    );
    assert!(r.ok(), "an interrupt is no failure: {t}");
}

/// Answers `answers` I/Os, then none: every later call waits until
/// `thaw` is set (a target that stopped answering).
struct Freezes {
    inner: RamDevice,
    answers: u64,
    count: AtomicU64,
    thaw: std::sync::atomic::AtomicBool,
}

impl Freezes {
    fn gate(&self) {
        if self.count.fetch_add(1, Ordering::SeqCst) >= self.answers {
            while !self.thaw.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

impl BlockDevice for Freezes {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.gate();
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.gate();
        self.inner.write_at(lba, buf)
    }
}

/// An interrupt while every job waits on a device that stopped answering:
/// the run still ends within [`blockload::STOP_WAIT`] and a little, with
/// what the jobs did before counted and the waiting jobs named.
#[test]
fn a_stop_flag_ends_a_run_whose_jobs_wait_on_a_frozen_device() {
    let dev = Arc::new(Freezes {
        inner: RamDevice::new(512, 2048),
        answers: 100,
        count: AtomicU64::new(0),
        thaw: Default::default(),
    });
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 4, u64::MAX / 2);
    w.region = Some(1 << 20);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut stopped_at = None;
    let r = blockload::run_until(dev.clone(), &w, stop.clone(), |_| {
        // Every job is inside a call that will not return.
        if stopped_at.is_none() && dev.count.load(Ordering::SeqCst) >= 100 + 4 {
            stop.store(true, Ordering::Relaxed);
            stopped_at = Some(std::time::Instant::now());
        }
    })
    .unwrap();
    let took = stopped_at.expect("the device froze").elapsed();
    dev.thaw.store(true, Ordering::SeqCst);
    let t = r.table();
    assert!(
        took < blockload::STOP_WAIT + Duration::from_millis(500),
        "{took:?}"
    );
    assert_eq!(r.stopped, blockload::Stopped::Interrupted, "{t}");
    assert_eq!(r.jobs_waiting, 4, "{t}");
    assert_eq!(r.total.ios, 100, "every answered I/O is counted: {t}");
    assert!(
        t.contains("4 of 4 jobs still waiting on the device, their I/O in flight not counted"),
        "{t}"
    );
    assert!(r.ok(), "{t}");
    assert_eq!(serde_json::to_value(&r).unwrap()["jobs_waiting"], 4);
}

/// A byte budget that runs out before the runtime is named as the reason.
#[test]
fn a_size_cap_before_the_runtime_says_so() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::Write, 2, 1 << 20);
    w.region = Some(1 << 20);
    w.runtime = Duration::from_secs(5);
    let r = run(dev, &w, |_| {}).unwrap();
    assert_eq!(r.stopped, blockload::Stopped::Size, "{}", r.table());
    let t = r.table();
    assert!(
        t.contains("size cap of 1 MiB reached before the 5.0 s runtime"),
        "{t}"
    );
    // Human units, not a raw byte count.
    assert!(
        t.contains("verified 1 MiB (all in the read-back), 0 verify failures"),
        "{t}"
    );
    assert!(t.contains("bs=4 KiB"), "{t}");
    assert_eq!(serde_json::to_value(&r).unwrap()["stopped"], "size");
}

/// The last progress a bar shows is the report's: the same bytes, seconds
/// and rate (the `total` row), then the read-back as a phase of its own
/// that ends with every written byte checked.
#[test]
fn progress_ends_at_the_reports_numbers_and_shows_the_read_back() {
    let dev = Arc::new(RamDevice::new(512, 4096));
    let mut w = workload(Pattern::RandRw { read_pct: 70 }, 4, 8 << 20);
    w.region = Some(2 << 20);
    let mut seen: Vec<blockload::Progress> = Vec::new();
    let r = run(dev, &w, |p| seen.push(p)).unwrap();
    assert!(r.ok(), "{}", r.table());
    let last = seen.last().copied().expect("progress was called");
    assert_eq!(last.bytes, r.read.bytes + r.write.bytes);
    assert_eq!(last.elapsed.as_secs_f64(), r.seconds);
    assert_eq!(last.mib_per_s(), r.total.mib_per_s);
    assert_eq!(r.total.ios, r.read.ios + r.write.ios);
    let rb = last
        .read_back
        .expect("verify: the read-back is its own phase");
    assert!(rb.total > 0 && rb.done == rb.total, "{rb:?}");
    assert_eq!(r.read_back_bytes, rb.total, "{}", r.table());
    let part = format!(
        "({} in the read-back)",
        rdma_types::units::format_size(rb.total)
    );
    assert!(r.table().contains(&part), "{part}: {}", r.table());
    // Once the read-back shows, the timed part is over: its numbers stay.
    let from = seen.iter().position(|p| p.read_back.is_some()).unwrap();
    for p in &seen[from..] {
        assert!(p.read_back.is_some() && p.bytes == last.bytes, "{p:?}");
        assert_eq!(p.elapsed, last.elapsed, "{p:?}");
    }
    let t = r.table();
    let total = t
        .lines()
        .find(|l| l.starts_with("total"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(total.contains(&format!("{:.1}", r.total.mib_per_s)), "{t}");
}

/// Percentiles come with their sample count; one the samples cannot
/// resolve is not printed.
#[test]
fn percentiles_show_their_sample_count_and_hide_what_they_cannot_resolve() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    // 64 writes of 4 KiB: too few for p99 (100) and p99.9 (1000).
    let mut w = workload(Pattern::Write, 1, 64 * 4096);
    w.region = Some(1 << 20);
    let r = run(dev.clone(), &w, |_| {}).unwrap();
    let t = r.table();
    let head: Vec<&str> = t.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(head[..3], ["dir", "I/Os", "IOPS"], "{t}");
    let row: Vec<&str> = t
        .lines()
        .find(|l| l.starts_with("write"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[1], "64", "{t}");
    assert_eq!(row[5..7], ["-", "-"], "p99 and p99.9 of 64 samples: {t}");
    assert!(t.contains("p99.9 needs 1000"), "{t}");

    // 2000 I/Os: both resolved, no note.
    let mut w = workload(Pattern::Write, 1, 2000 * 4096);
    w.region = Some(1 << 20);
    let r = run(dev, &w, |_| {}).unwrap();
    let t = r.table();
    assert!(!t.contains(" - ") && !t.contains("needs"), "{t}");
}

/// A stop flag on a device that answers: every job finishes the I/O it
/// has in flight and ends, none is left behind.
#[test]
fn a_stop_flag_ends_a_run_on_a_healthy_device_with_no_job_left_waiting() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 4, u64::MAX / 2);
    w.region = Some(1 << 20);
    w.runtime = Duration::from_secs(60);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = blockload::run_until(dev, &w, stop.clone(), |p| {
        if p.bytes >= 4 << 20 {
            stop.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    let t = r.table();
    assert_eq!(r.stopped, blockload::Stopped::Interrupted, "{t}");
    assert_eq!(r.jobs_waiting, 0, "{t}");
    assert!(r.ok(), "{t}");
}

/// A run its caller ends ([`Workload::end`]): the jobs finish what they
/// have in flight and read back everything they wrote, as after a byte
/// budget.
#[test]
fn a_run_its_caller_ends_reads_back_what_it_wrote() {
    let dev = Arc::new(RamDevice::new(512, 2048));
    let mut w = workload(Pattern::RandRw { read_pct: 50 }, 4, u64::MAX / 2);
    w.region = Some(1 << 20);
    w.verify = true;
    w.runtime = Duration::from_secs(60);
    let end = Arc::new(std::sync::atomic::AtomicBool::new(false));
    w.end = Some(end.clone());
    let r = blockload::run(dev, &w, |p| {
        if p.bytes >= 4 << 20 {
            end.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    let t = r.table();
    assert_eq!(r.stopped, blockload::Stopped::Ended, "{t}");
    assert!(r.ok(), "{t}");
    assert!(r.read_back_bytes > 0, "{t}");
    assert!(t.contains("ended by its caller after"), "{t}");
}
