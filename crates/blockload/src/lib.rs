//! Verified block workloads, in the spirit of fio.
//!
//! `blockload` drives any [`BlockDevice`] (an SRP LUN, a file, RAM) with a
//! [`Workload`]: sequential or random reads, writes or a mix, a block size,
//! a number of jobs (threads, each with one I/O in flight, like fio's sync
//! engine with `numjobs`), bounded by a byte count and a runtime, whichever
//! ends first. It reports IOPS, bandwidth and latency percentiles per
//! direction ([`Report`], printable as a table or JSON).
//!
//! With `verify` on, every 512-byte unit a job writes carries a stamp: a
//! magic, the unit's own byte offset, the write's generation, the job seed
//! and a CRC32 over the unit. Each job owns a disjoint slice of the device,
//! so it knows exactly which generation every unit it wrote must hold, and
//! a read tells apart corrupt data (CRC), misplaced data (a unit stamped for
//! another offset), and lost or stale writes (an older generation). Units a
//! job never wrote are not checked. Like fio's `verify`, once the timed part
//! is over each job reads back every block it wrote and checks it too (not
//! counted in IOPS or latency); [`Report::verified_bytes`] says how much was
//! checked in all. The report says what ended the run ([`Stopped`]): the
//! runtime, the byte budget, an I/O error, or the caller's stop flag
//! ([`run_until`], for an interrupt: the jobs finish the I/Os in flight,
//! skip the read-back and report what they did; a job whose I/O is still
//! waiting on the device [`STOP_WAIT`] later is left behind, its I/O in
//! flight counted nowhere and said so).
//!
//! [`bytes::ByteView`] shows a device as bytes: unaligned ranges become
//! read-modify-write of the edge blocks, safe under concurrent writers.
//! The NBD server and the FUSE file system both sit on it, and count
//! what their clients asked of it in [`counts::IoCounts`].
//!
//! What it refuses: block sizes that are not a multiple of 512 bytes or of
//! the device's block size, regions outside the device, unbounded runs.

#![forbid(unsafe_code)]

pub mod bytes;
pub mod counts;
mod stamp;

pub use stamp::{check_unit, fill_unit, offset_units, Mismatch, UNIT};

use serde::Serialize;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A device addressed in logical blocks. Calls may come from several
/// threads at once.
pub trait BlockDevice: Send + Sync {
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Number of logical blocks.
    fn num_blocks(&self) -> u64;
    /// Reads `buf.len()` bytes (a whole number of blocks) from `lba`.
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` (a whole number of blocks) at `lba`.
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes completed writes durable.
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    /// A queue for keeping up to `depth` I/Os in flight from one thread
    /// (as io_uring or libaio do); `None` when the device has none, and
    /// the engine then runs one thread per I/O in flight.
    fn queue(&self, depth: usize) -> Option<Box<dyn IoQueue + '_>> {
        let _ = depth;
        None
    }
    /// Deallocates `blocks` blocks from `lba`; later reads of them return
    /// zeroes. Devices without thin provisioning answer `Unsupported`.
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        let _ = (lba, blocks);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "unmap not supported",
        ))
    }
}

/// I/Os in flight from one thread, each in a numbered slot. A slot is
/// free again once [`IoQueue::complete_one`] has returned it.
pub trait IoQueue {
    /// Starts reading `len` bytes from `lba` into slot `slot`.
    fn start_read(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()>;
    /// Starts writing `data` at `lba` in slot `slot`. `data` is the slot's
    /// buffer (`bufs[slot]` of [`IoQueue::complete_one`]) and stays as it
    /// is until the slot completes, as a buffer given to io_uring or libaio
    /// does: a queue may send it again from there (a retry after a reset)
    /// rather than copy it first.
    fn start_write(&mut self, slot: usize, lba: u64, data: &[u8]) -> io::Result<()>;
    /// Starts a read as [`IoQueue::start_read`] does, for a caller that
    /// looks at the data only when it asks for it ([`IoQueue::read_back`]):
    /// a queue whose reads land in registered memory of its own (an RDMA
    /// initiator's pool, which the target wrote into) leaves the data
    /// there at completion, as an application whose buffers are
    /// registered reads in place, rather than copy it into `bufs[slot]`.
    /// The data stays until the slot is started again. By default a plain
    /// read: the data is in `bufs[slot]` at completion.
    fn start_read_in_place(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()> {
        self.start_read(slot, lba, len)
    }
    /// Copies the data of slot `slot`'s last read into `out` (its buffer)
    /// when the queue kept it in place; nothing to do when it is in
    /// `bufs[slot]` already.
    fn read_back(&mut self, slot: usize, out: &mut [u8]) -> io::Result<()> {
        let _ = (slot, out);
        Ok(())
    }
    /// Waits for one started I/O to end and returns its slot and result;
    /// a read's data is in `bufs[slot]`. `None` when nothing is in flight.
    fn complete_one(&mut self, bufs: &mut [Vec<u8>]) -> Option<(usize, io::Result<()>)>;
    /// Starts a flush in slot `slot` ([`BlockDevice::flush`] without
    /// waiting): when it completes, every write that had completed before
    /// it started is durable. Writes still in flight are not covered, as
    /// with a block layer's flush. Queues without it answer `Unsupported`.
    fn start_flush(&mut self, slot: usize) -> io::Result<()> {
        let _ = slot;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this queue has no asynchronous flush",
        ))
    }
    /// Starts deallocating `blocks` blocks from `lba` in slot `slot`
    /// ([`BlockDevice::unmap`] without waiting). Queues without it answer
    /// `Unsupported`; so does the completion when the device has no thin
    /// provisioning.
    fn start_unmap(&mut self, slot: usize, lba: u64, blocks: u64) -> io::Result<()> {
        let _ = (slot, lba, blocks);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this queue has no asynchronous unmap",
        ))
    }
}

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mix; `read_pct` percent of the I/Os are reads.
    RandRw {
        /// Share of reads, 0..=100.
        read_pct: u8,
    },
}

/// A pattern name other than those [`Pattern`] knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pattern `{0}` (read, write, randread, randwrite, randrw)")]
pub struct PatternError(pub String);

impl std::str::FromStr for Pattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Pattern, PatternError> {
        Ok(match s {
            "read" => Pattern::Read,
            "write" => Pattern::Write,
            "randread" => Pattern::RandRead,
            "randwrite" => Pattern::RandWrite,
            "randrw" | "mixed" => Pattern::RandRw { read_pct: 50 },
            _ => return Err(PatternError(s.to_string())),
        })
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Read => f.write_str("read"),
            Pattern::Write => f.write_str("write"),
            Pattern::RandRead => f.write_str("randread"),
            Pattern::RandWrite => f.write_str("randwrite"),
            Pattern::RandRw { read_pct } => write!(f, "randrw({read_pct}% read)"),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Access pattern.
    pub pattern: Pattern,
    /// Bytes per I/O; a multiple of 512 and of the device block size.
    pub bs: u32,
    /// Concurrent jobs (threads).
    pub jobs: u32,
    /// I/Os each job keeps in flight (a device without a queue gets
    /// `jobs * iodepth` threads of one I/O each instead).
    pub iodepth: u32,
    /// Stop after this many bytes in all (`None`: once over the region for
    /// sequential patterns, the region's size for random ones).
    pub size: Option<u64>,
    /// Stop after this long.
    pub runtime: Duration,
    /// Stamp writes and check reads. A read-only pattern (`Read`,
    /// `RandRead`) first writes its region once, untimed, so that every
    /// read it times is checked too (without it, it would check nothing).
    pub verify: bool,
    /// Seed for offsets and stamps.
    pub seed: u64,
    /// Bytes of the device to use from offset 0 (`None`: all of it).
    pub region: Option<u64>,
    /// Set by the caller to end the timed part as the byte budget would:
    /// the jobs start no more I/O, wait for what they have in flight
    /// however long it takes, and read back what they wrote (`verify`).
    /// For a run whose length depends on events the caller waits for,
    /// where [`run_until`]'s stop flag would skip the read-back and leave
    /// slow I/O behind.
    pub end: Option<Arc<AtomicBool>>,
}

impl Workload {
    /// A workload with fio-like defaults: 4 KiB, 1 job, 10 s, verify off.
    pub fn new(pattern: Pattern) -> Workload {
        Workload {
            pattern,
            bs: 4096,
            jobs: 1,
            iodepth: 1,
            size: None,
            runtime: Duration::from_secs(10),
            verify: false,
            seed: 0x5eed,
            region: None,
            end: None,
        }
    }
}

/// A workload that cannot run on this device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// Progress of a running workload, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Bytes moved so far by the timed part.
    pub bytes: u64,
    /// Byte budget of the run.
    pub total_bytes: u64,
    /// Time since the start; once the timed part is over, its length (the
    /// report's [`Report::seconds`]).
    pub elapsed: Duration,
    /// Time budget of the run.
    pub runtime: Duration,
    /// Once every job's timed part is over and `verify` is on: the
    /// read-back of what was written, a phase of its own.
    pub read_back: Option<ReadBack>,
}

impl Progress {
    /// MiB per second of the timed part so far, both directions: at the
    /// end, the report's `total` row.
    pub fn mib_per_s(&self) -> f64 {
        mib_per_s(self.bytes, self.elapsed.as_secs_f64())
    }

    /// The timed part's share done, 0 to 1: of the byte budget or of the
    /// runtime, whichever is further along.
    pub fn fraction(&self) -> f64 {
        let by_bytes = self.bytes as f64 / self.total_bytes.max(1) as f64;
        let by_time = self.elapsed.as_secs_f64() / self.runtime.as_secs_f64().max(1e-9);
        by_bytes.max(by_time).min(1.0)
    }
}

/// The read-back after the timed part (`verify`): bytes checked so far,
/// of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBack {
    /// Bytes read back and checked.
    pub done: u64,
    /// Bytes the jobs wrote and will read back.
    pub total: u64,
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// Its runtime was over.
    Runtime,
    /// It moved its byte budget ([`Workload::size`]) before the runtime
    /// was over.
    Size,
    /// The device failed an I/O.
    IoError,
    /// The caller's stop flag ([`run_until`]): the numbers are partial
    /// and the read-back was skipped.
    Interrupted,
    /// The caller ended it ([`Workload::end`]) before its budgets ran out.
    Ended,
}

/// Samples a latency percentile needs to be more than the largest value:
/// p99 needs 100, p99.9 needs 1000.
fn samples_for(quantile: f64) -> u64 {
    (1.0 / (1.0 - quantile)).round() as u64
}

fn mib_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-9) / (1024.0 * 1024.0)
}

/// Latency and throughput of one direction.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DirStats {
    /// Completed I/Os.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Median latency, microseconds.
    pub lat_p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub lat_p99_us: f64,
    /// 99.9th percentile latency, microseconds.
    pub lat_p999_us: f64,
    /// Largest latency, microseconds.
    pub lat_max_us: f64,
}

impl DirStats {
    /// A percentile for the table: `-` when fewer I/Os completed than it
    /// takes to tell it from the maximum ([`samples_for`]).
    fn cell(&self, quantile: f64, us: f64) -> String {
        if self.ios < samples_for(quantile) {
            "-".into()
        } else {
            format!("{us:.1}")
        }
    }
}

/// One verification failure.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyError {
    /// Byte offset of the 512-byte unit on the device.
    pub offset: u64,
    /// What was wrong.
    pub what: String,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Pattern run.
    pub pattern: String,
    /// Bytes per I/O.
    pub bs: u32,
    /// Jobs.
    pub jobs: u32,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// Both directions together (the rate a progress bar shows).
    pub total: DirStats,
    /// What ended the run.
    pub stopped: Stopped,
    /// The byte budget it had.
    pub size_budget: u64,
    /// The runtime it had, seconds.
    pub runtime_budget: f64,
    /// Bytes whose content was checked against what was written.
    pub verified_bytes: u64,
    /// The part of them the read-back after the timed part checked.
    pub read_back_bytes: u64,
    /// Verification failures (all of them counted, the first 16 kept).
    pub verify_failures: u64,
    /// The first verification failures.
    pub verify_errors: Vec<VerifyError>,
    /// I/O errors returned by the device.
    pub io_errors: u64,
    /// The first I/O error's text.
    pub first_io_error: Option<String>,
    /// Interrupted runs: jobs whose I/O was still waiting on the device
    /// [`STOP_WAIT`] after the stop flag (a peer that no longer answers).
    /// The report was made without them: what they completed before is
    /// counted, the I/O they wait on is not.
    pub jobs_waiting: u32,
}

impl Report {
    /// True when no I/O failed and every check passed.
    pub fn ok(&self) -> bool {
        self.io_errors == 0 && self.verify_failures == 0
    }

    /// A human-readable table: a row per direction (and their total when
    /// both ran) with the I/Os each latency column rests on; a percentile
    /// that so few I/Os cannot resolve shows `-`.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "dir", "I/Os", "IOPS", "MiB/s", "p50 us", "p99 us", "p99.9 us", "max us"
        );
        let both = self.read.ios > 0 && self.write.ios > 0;
        let mut unresolved = false;
        for (name, d) in [
            ("read", &self.read),
            ("write", &self.write),
            ("total", &self.total),
        ] {
            if d.ios == 0 || (name == "total" && !both) {
                continue;
            }
            unresolved |= d.ios < samples_for(0.999);
            s += &format!(
                "{:<9} {:>9} {:>10.0} {:>10.1} {:>10.1} {:>10} {:>10} {:>10.1}\n",
                name,
                d.ios,
                d.iops,
                d.mib_per_s,
                d.lat_p50_us,
                d.cell(0.99, d.lat_p99_us),
                d.cell(0.999, d.lat_p999_us),
                d.lat_max_us
            );
        }
        if unresolved {
            s += &format!(
                "  (-: too few I/Os for the percentile: p99 needs {}, p99.9 needs {})\n",
                samples_for(0.99),
                samples_for(0.999)
            );
        }
        s += &format!(
            "{} bs={} jobs={} in {:.2} s, {}; verified {}{}, {} verify failures, {} I/O errors\n",
            self.pattern,
            rdma_types::units::format_size(self.bs as u64),
            self.jobs,
            self.seconds,
            self.stop_reason(),
            rdma_types::units::format_size(self.verified_bytes),
            match self.read_back_bytes {
                0 => String::new(),
                n if n == self.verified_bytes => " (all in the read-back)".into(),
                n => format!(" ({} in the read-back)", rdma_types::units::format_size(n)),
            },
            self.verify_failures,
            self.io_errors
        );
        for e in &self.verify_errors {
            s += &format!("  verify: offset {:#x}: {}\n", e.offset, e.what);
        }
        if let Some(e) = &self.first_io_error {
            s += &format!("  first I/O error: {e}\n");
        }
        s
    }

    /// What ended the run, in words.
    pub fn stop_reason(&self) -> String {
        let moved = rdma_types::units::format_size(self.read.bytes + self.write.bytes);
        match self.stopped {
            Stopped::Runtime => format!("runtime of {:.1} s reached", self.runtime_budget),
            Stopped::Size => format!(
                "size cap of {} reached before the {:.1} s runtime",
                rdma_types::units::format_size(self.size_budget),
                self.runtime_budget
            ),
            Stopped::IoError => format!("stopped by an I/O error after {moved}"),
            Stopped::Ended => format!("ended by its caller after {moved}"),
            Stopped::Interrupted if self.jobs_waiting > 0 => format!(
                "interrupted after {moved}: partial numbers, read-back skipped; {} of {} jobs \
                 still waiting on the device, their I/O in flight not counted",
                self.jobs_waiting, self.jobs
            ),
            Stopped::Interrupted => {
                format!("interrupted after {moved}: partial numbers, read-back skipped")
            }
        }
    }
}

/// Generations written per I/O block, shared by the jobs (each job only
/// touches its own slice).
struct GenTable(Vec<AtomicU32>);

const KEEP_ERRORS: usize = 16;

struct Shared {
    gens: GenTable,
    /// Bytes the timed part moved.
    bytes: AtomicU64,
    /// The caller's stop flag.
    stop: Arc<AtomicBool>,
    /// Jobs still in their timed part.
    timed: AtomicUsize,
    /// When the last timed part so far ended, nanoseconds after the start.
    timed_end_ns: AtomicU64,
    /// Read-back: bytes to check (added as each job's timed part ends)
    /// and bytes checked.
    to_check: AtomicU64,
    checked: AtomicU64,
    /// Each job's numbers, kept here rather than on its stack so that a
    /// job stuck in a device call after an interrupt still has what it
    /// did before counted ([`STOP_WAIT`]). Each job locks only its own,
    /// and only between device calls.
    results: Vec<Mutex<JobResult>>,
}

impl Shared {
    /// A job's timed part is over at `now`; it will read back `to_check`
    /// bytes.
    fn timed_over(&self, start: Instant, now: Instant, to_check: u64) {
        let ns = now.saturating_duration_since(start).as_nanos();
        self.timed_end_ns
            .fetch_max(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.to_check.fetch_add(to_check, Ordering::Relaxed);
        self.timed.fetch_sub(1, Ordering::Release);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Job `job`'s numbers, to update.
    fn result(&self, job: u32) -> MutexGuard<'_, JobResult> {
        self.results[job as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an interrupted run ([`run_until`]) waits for the I/Os in
/// flight before it reports without the jobs still waiting on the device:
/// an interrupt must not wait on a peer that no longer answers.
pub const STOP_WAIT: Duration = Duration::from_millis(250);

/// How often [`run_until`] looks at its jobs and its stop flag.
const TICK: Duration = Duration::from_millis(50);

/// How often [`run_until`] calls its `progress`, at least.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

struct JobResult {
    read: hdrhistogram::Histogram<u64>,
    write: hdrhistogram::Histogram<u64>,
    read_bytes: u64,
    write_bytes: u64,
    verified: u64,
    /// Bytes the read-back read and checked.
    read_back: u64,
    failures: u64,
    errors: Vec<VerifyError>,
    io_errors: u64,
    first_io_error: Option<String>,
    /// Why its timed part ended.
    stopped: Stopped,
}

/// Runs `w` on `dev`, calling `progress` about five times a second.
pub fn run(
    dev: Arc<dyn BlockDevice>,
    w: &Workload,
    progress: impl FnMut(Progress),
) -> Result<Report, ConfigError> {
    run_until(dev, w, Arc::new(AtomicBool::new(false)), progress)
}

/// [`run`], ending early once `stop` is set (an interrupt): each job
/// finishes the I/Os it has in flight and starts no more, the read-back
/// is skipped, and the report ([`Stopped::Interrupted`]) holds what was
/// done until then. Jobs whose I/O is still waiting on the device
/// [`STOP_WAIT`] after `stop` was seen are left behind (their threads
/// return when the device answers or fails the I/O) and counted in
/// [`Report::jobs_waiting`]. `progress` is called at least every 200 ms,
/// so a caller may set `stop` from it.
pub fn run_until(
    dev: Arc<dyn BlockDevice>,
    w: &Workload,
    stop: Arc<AtomicBool>,
    mut progress: impl FnMut(Progress),
) -> Result<Report, ConfigError> {
    let queued = w.iodepth > 1 && dev.queue(1).is_some();
    let expanded;
    let w = if w.iodepth > 1 && !queued {
        // No queue: the same number of I/Os in flight, one per thread.
        expanded = Workload {
            jobs: w.jobs.saturating_mul(w.iodepth),
            iodepth: 1,
            ..w.clone()
        };
        &expanded
    } else {
        w
    };
    let geo = Geometry::new(dev.as_ref(), w)?;
    let total_bytes = w.size.unwrap_or(geo.io_blocks * w.bs as u64);
    let shared = Arc::new(Shared {
        gens: GenTable((0..geo.io_blocks).map(|_| AtomicU32::new(0)).collect()),
        bytes: AtomicU64::new(0),
        stop,
        timed: AtomicUsize::new(w.jobs as usize),
        timed_end_ns: AtomicU64::new(0),
        to_check: AtomicU64::new(0),
        checked: AtomicU64::new(0),
        results: (0..w.jobs).map(|_| Mutex::new(new_result())).collect(),
    });
    if w.verify && matches!(w.pattern, Pattern::Read | Pattern::RandRead) {
        if let Err(e) = prefill(dev.as_ref(), w, &geo, &shared) {
            let mut r = new_result();
            r.io_errors = 1;
            r.first_io_error = Some(e.to_string());
            r.stopped = Stopped::IoError;
            return Ok(merge(w, vec![r], 0.0, total_bytes));
        }
    }
    let start = Instant::now();
    let (tx, rx) = mpsc::channel();
    let per_job_bytes = total_bytes.div_ceil(w.jobs as u64);
    for job in 0..w.jobs {
        let (dev, shared, tx, w) = (dev.clone(), shared.clone(), tx.clone(), w.clone());
        let slice = geo.slice(job);
        std::thread::spawn(move || {
            if queued {
                run_job_queued(dev.as_ref(), &w, job, slice, per_job_bytes, start, &shared)
            } else {
                run_job(dev.as_ref(), &w, job, slice, per_job_bytes, start, &shared)
            }
            let _ = tx.send(());
        });
    }
    drop(tx);
    let mut ended = 0;
    let mut stop_seen: Option<Instant> = None;
    let mut last_progress: Option<Instant> = None;
    while ended < w.jobs {
        let job_ended = match rx.recv_timeout(TICK) {
            Ok(()) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        ended += u32::from(job_ended);
        if shared.stopped() && stop_seen.get_or_insert_with(Instant::now).elapsed() >= STOP_WAIT {
            break;
        }
        if !job_ended && last_progress.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            continue;
        }
        last_progress = Some(Instant::now());
        let timed_over = shared.timed.load(Ordering::Acquire) == 0;
        progress(Progress {
            bytes: shared.bytes.load(Ordering::Relaxed),
            total_bytes,
            elapsed: if timed_over {
                Duration::from_nanos(shared.timed_end_ns.load(Ordering::Relaxed))
            } else {
                start.elapsed()
            },
            runtime: w.runtime,
            read_back: (timed_over && w.verify).then(|| ReadBack {
                done: shared.checked.load(Ordering::Relaxed),
                total: shared.to_check.load(Ordering::Relaxed),
            }),
        });
    }
    // The same length the progress showed once the timed part was over.
    let seconds = match shared.timed_end_ns.load(Ordering::Relaxed) {
        0 => start.elapsed(),
        ns => Duration::from_nanos(ns),
    };
    // What every job did, the jobs left behind included: a job that
    // comes back later accounts into a fresh result no one reads.
    let results = (0..w.jobs)
        .map(|job| {
            let mut r = std::mem::replace(&mut *shared.result(job), new_result());
            if shared.stopped() {
                r.stopped = Stopped::Interrupted;
            }
            r
        })
        .collect();
    let mut report = merge(w, results, seconds.as_secs_f64(), total_bytes);
    report.jobs_waiting = w.jobs - ended;
    Ok(report)
}

/// A prefill write failed: where, and the device's error.
#[derive(Debug, thiserror::Error)]
#[error("prefill write at byte offset {at:#x}: {source}")]
struct PrefillError {
    at: u64,
    #[source]
    source: io::Error,
}

/// Writes every I/O block of the region once, as its job would write
/// generation 1, in writes of up to 1 MiB: a read-only workload's reads
/// then have stamps to check from its first read on. Not timed.
fn prefill(
    dev: &dyn BlockDevice,
    w: &Workload,
    geo: &Geometry,
    shared: &Shared,
) -> Result<(), PrefillError> {
    let bs = w.bs as u64;
    let lbs = dev.block_size() as u64;
    let per_write = ((1u64 << 20) / bs).max(1);
    for job in 0..w.jobs {
        let slice = geo.slice(job);
        let job_seed = (w.seed as u32) ^ job;
        let end = slice.first + slice.count;
        let mut block = slice.first;
        while block < end {
            let n = per_write.min(end - block);
            let at = block * bs;
            let mut buf = vec![0u8; (n * bs) as usize];
            for (u, unit) in buf.chunks_exact_mut(UNIT).enumerate() {
                fill_unit(unit, at + (u * UNIT) as u64, 1, job_seed);
            }
            dev.write_at(at / lbs, &buf)
                .map_err(|source| PrefillError { at, source })?;
            for b in block..block + n {
                shared.gens.0[b as usize].store(1, Ordering::Relaxed);
            }
            block += n;
        }
    }
    Ok(())
}

/// Device geometry as the workload sees it: I/O blocks of `bs` bytes.
struct Geometry {
    io_blocks: u64,
    jobs: u64,
    lbas_per_io: u64,
}

impl Geometry {
    fn new(dev: &dyn BlockDevice, w: &Workload) -> Result<Geometry, ConfigError> {
        let lbs = dev.block_size() as u64;
        if lbs == 0 || !lbs.is_multiple_of(UNIT as u64) {
            return Err(ConfigError(format!(
                "device block size {lbs} is not a multiple of {UNIT}"
            )));
        }
        let bs = w.bs as u64;
        if bs == 0 || !bs.is_multiple_of(lbs) {
            return Err(ConfigError(format!(
                "block size {bs} is not a multiple of the device block size {lbs}"
            )));
        }
        if w.jobs == 0 {
            return Err(ConfigError("jobs must be at least 1".into()));
        }
        if w.runtime.is_zero() {
            return Err(ConfigError("runtime must be above zero".into()));
        }
        if let Pattern::RandRw { read_pct } = w.pattern {
            if read_pct > 100 {
                return Err(ConfigError(format!("read share {read_pct}% is above 100%")));
            }
        }
        let dev_bytes = dev.num_blocks().saturating_mul(lbs);
        let region = w.region.unwrap_or(dev_bytes);
        if region > dev_bytes {
            return Err(ConfigError(format!(
                "region of {region} bytes is larger than the device ({dev_bytes} bytes)"
            )));
        }
        let io_blocks = region / bs;
        if io_blocks < w.jobs as u64 {
            return Err(ConfigError(format!(
                "region holds {io_blocks} blocks of {bs} bytes, fewer than {} jobs",
                w.jobs
            )));
        }
        Ok(Geometry {
            io_blocks,
            jobs: w.jobs as u64,
            lbas_per_io: bs / lbs,
        })
    }

    /// The contiguous range of I/O blocks job `j` owns.
    fn slice(&self, j: u32) -> Slice {
        let per = self.io_blocks / self.jobs;
        let first = per * j as u64;
        let count = if j as u64 == self.jobs - 1 {
            self.io_blocks - first
        } else {
            per
        };
        Slice {
            first,
            count,
            lbas_per_io: self.lbas_per_io,
        }
    }
}

#[derive(Clone, Copy)]
struct Slice {
    first: u64,
    count: u64,
    lbas_per_io: u64,
}

/// The blocks of a slice with an I/O in flight (asked on every I/O): a
/// bit a block while the slice has at most `InFlight::BITS_MAX` blocks (a
/// look and a flip), a set of block numbers past that.
enum InFlight {
    Bits { first: u64, words: Vec<u64> },
    Set(rdma_types::IdSet<u64>),
}

impl InFlight {
    /// Most blocks kept a bit each: 2 MiB of bits.
    const BITS_MAX: u64 = 1 << 24;

    fn new(slice: Slice) -> InFlight {
        if slice.count <= Self::BITS_MAX {
            InFlight::Bits {
                first: slice.first,
                words: vec![0; slice.count.div_ceil(64) as usize],
            }
        } else {
            InFlight::Set(Default::default())
        }
    }

    fn contains(&self, block: u64) -> bool {
        match self {
            InFlight::Bits { first, words } => {
                let i = block - first;
                words[(i / 64) as usize] & (1 << (i % 64)) != 0
            }
            InFlight::Set(s) => s.contains(&block),
        }
    }

    fn set(&mut self, block: u64, busy: bool) {
        match self {
            InFlight::Bits { first, words } => {
                let i = block - *first;
                let w = &mut words[(i / 64) as usize];
                if busy {
                    *w |= 1 << (i % 64);
                } else {
                    *w &= !(1 << (i % 64));
                }
            }
            InFlight::Set(s) if busy => {
                s.insert(block);
            }
            InFlight::Set(s) => {
                s.remove(&block);
            }
        }
    }
}

/// xorshift64*: small, seedable, good enough for offsets and fill.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn new_result() -> JobResult {
    let hist = || hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).unwrap();
    JobResult {
        read: hist(),
        write: hist(),
        read_bytes: 0,
        write_bytes: 0,
        verified: 0,
        read_back: 0,
        failures: 0,
        errors: Vec::new(),
        io_errors: 0,
        first_io_error: None,
        stopped: Stopped::Runtime,
    }
}

/// The next I/O of a job: block index within its slice, and read or not.
fn next_op(w: &Workload, slice: Slice, rng: &mut Rng, next_seq: &mut u64) -> (u64, bool) {
    match w.pattern {
        Pattern::Read | Pattern::Write => {
            let i = *next_seq % slice.count;
            *next_seq += 1;
            (i, w.pattern == Pattern::Read)
        }
        Pattern::RandRead => (rng.below(slice.count), true),
        Pattern::RandWrite => (rng.below(slice.count), false),
        Pattern::RandRw { read_pct } => (rng.below(slice.count), rng.below(100) < read_pct as u64),
    }
}

/// Fills `buf` for a write of generation `gen` at byte `offset`.
fn fill_write(buf: &mut [u8], w: &Workload, offset: u64, gen: u32, job_seed: u32, rng: &mut Rng) {
    if w.verify {
        for (u, unit) in buf.chunks_exact_mut(UNIT).enumerate() {
            fill_unit(unit, offset + (u * UNIT) as u64, gen, job_seed);
        }
    } else {
        // fio's scramble_buffers: the buffer holds random bytes from the
        // start (`random_buf`) and each write draws a new first word for
        // every 512 bytes, so no two writes carry the same data while the
        // client's cost stays out of the device's numbers.
        for sector in buf.chunks_mut(512) {
            let n = sector.len().min(8);
            sector[..n].copy_from_slice(&rng.next_u64().to_le_bytes()[..n]);
        }
    }
}

/// `len` random (incompressible) bytes, eight per draw, from a generator
/// of their own (the job's picks the same I/Os with or without them).
fn random_buf(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut buf = Vec::with_capacity(len.next_multiple_of(8));
    while buf.len() < len {
        buf.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    buf.truncate(len);
    buf
}

/// Counts one finished I/O; `false` when it failed (the job stops: a
/// device that fails once will likely fail again).
#[allow(clippy::too_many_arguments)]
fn account(
    r: &mut JobResult,
    res: io::Result<()>,
    w: &Workload,
    shared: &Shared,
    block: u64,
    is_read: bool,
    gen: u32,
    job_seed: u32,
    buf: &[u8],
    ns: u64,
) -> bool {
    let bs = w.bs as u64;
    let offset = block * bs;
    match res {
        Ok(()) => {
            if is_read {
                r.read.saturating_record(ns);
                r.read_bytes += bs;
                if w.verify {
                    verify_read(buf, offset, shared, block, job_seed, r);
                }
            } else {
                shared.gens.0[block as usize].store(gen, Ordering::Relaxed);
                r.write.saturating_record(ns);
                r.write_bytes += bs;
            }
            shared.bytes.fetch_add(bs, Ordering::Relaxed);
            true
        }
        Err(e) => {
            r.io_errors += 1;
            if r.first_io_error.is_none() {
                r.first_io_error = Some(format!(
                    "{} at byte offset {offset:#x}: {e}",
                    if is_read { "read" } else { "write" }
                ));
            }
            false
        }
    }
}

/// Whether the caller ended the run ([`Workload::end`]).
fn ended(w: &Workload) -> bool {
    w.end.as_ref().is_some_and(|e| e.load(Ordering::Relaxed))
}

/// Why a job's timed part ended: its flags, in the order they count.
fn why_stopped(failed: bool, shared: &Shared, w: &Workload, moved: u64, budget: u64) -> Stopped {
    if shared.stopped() {
        Stopped::Interrupted
    } else if failed {
        Stopped::IoError
    } else if moved >= budget {
        Stopped::Size
    } else if ended(w) {
        Stopped::Ended
    } else {
        Stopped::Runtime
    }
}

/// Ends a job's timed part: why, and then (with `verify`, when nothing
/// failed or stopped it) the read-back of every block it wrote.
fn end_timed(
    dev: &dyn BlockDevice,
    slice: Slice,
    bs: usize,
    (job, job_seed, start): (u32, u32, Instant),
    shared: &Shared,
    verify: bool,
) {
    let check = verify && shared.result(job).io_errors == 0 && !shared.stopped();
    let to_check = if check {
        (slice.first..slice.first + slice.count)
            .filter(|&b| shared.gens.0[b as usize].load(Ordering::Relaxed) != 0)
            .count() as u64
            * bs as u64
    } else {
        0
    };
    shared.timed_over(start, Instant::now(), to_check);
    if check {
        let mut buf = vec![0u8; bs];
        read_back(dev, slice, bs, shared, (job, job_seed), &mut buf);
    }
}

fn run_job(
    dev: &dyn BlockDevice,
    w: &Workload,
    job: u32,
    slice: Slice,
    budget: u64,
    start: Instant,
    shared: &Shared,
) {
    let deadline = start + w.runtime;
    let bs = w.bs as usize;
    let mut buf = random_buf(bs, !w.seed ^ u64::from(job));
    let mut rng = Rng::new(w.seed ^ (job as u64).wrapping_mul(0x1000_0001));
    let job_seed = (w.seed as u32) ^ job;
    let mut next_seq = 0u64;
    let mut moved = 0u64;
    let mut failed = false;
    while moved < budget && !shared.stopped() && !ended(w) && Instant::now() < deadline {
        let (index, is_read) = next_op(w, slice, &mut rng, &mut next_seq);
        let block = slice.first + index;
        let lba = block * slice.lbas_per_io;
        let t0 = Instant::now();
        let mut gen = 0;
        let res = if is_read {
            dev.read_at(lba, &mut buf)
        } else {
            gen = shared.gens.0[block as usize].load(Ordering::Relaxed) + 1;
            fill_write(&mut buf, w, block * bs as u64, gen, job_seed, &mut rng);
            dev.write_at(lba, &buf)
        };
        let ns = t0.elapsed().as_nanos().max(1) as u64;
        if !account(
            &mut shared.result(job),
            res,
            w,
            shared,
            block,
            is_read,
            gen,
            job_seed,
            &buf,
            ns,
        ) {
            failed = true;
            break;
        }
        moved += bs as u64;
    }
    shared.result(job).stopped = why_stopped(failed, shared, w, moved, budget);
    end_timed(dev, slice, bs, (job, job_seed, start), shared, w.verify);
}

/// One job with `w.iodepth` I/Os in flight through the device's queue.
/// Two I/Os of one job never touch the same block at once, so a read
/// checks against the last write that completed.
fn run_job_queued(
    dev: &dyn BlockDevice,
    w: &Workload,
    job: u32,
    slice: Slice,
    budget: u64,
    start: Instant,
    shared: &Shared,
) {
    let deadline = start + w.runtime;
    let bs = w.bs as usize;
    let depth = (w.iodepth as usize).clamp(1, slice.count as usize);
    let Some(mut q) = dev.queue(depth) else {
        return run_job(dev, w, job, slice, budget, start, shared);
    };
    let mut bufs: Vec<Vec<u8>> = (0..depth)
        .map(|i| random_buf(bs, !w.seed ^ (u64::from(job) << 32 | i as u64)))
        .collect();
    // Per slot: (block, read?, generation, start time) while in flight.
    let mut busy: Vec<Option<(u64, bool, u32, Instant)>> = vec![None; depth];
    let mut in_flight = InFlight::new(slice);
    let mut rng = Rng::new(w.seed ^ (job as u64).wrapping_mul(0x1000_0001));
    let job_seed = (w.seed as u32) ^ job;
    let mut next_seq = 0u64;
    let mut started = 0u64;
    let mut failed = false;
    // Free slots, the lowest on top: a completion frees one, so a pass
    // looks at that one, not at every slot.
    let mut free: Vec<usize> = (0..depth).rev().collect();
    // The clock read at the last completion: the next I/O's start (one
    // read, not two, per I/O; the accounting between is in its latency).
    let mut fresh = None;
    loop {
        // Fill every free slot while the budget and the clock allow.
        while let Some(&slot) = free.last() {
            if failed || started >= budget || shared.stopped() || ended(w) {
                break;
            }
            let t0 = fresh.take().unwrap_or_else(Instant::now);
            if t0 >= deadline {
                break;
            }
            let mut pick = None;
            for _ in 0..8 {
                let (index, is_read) = next_op(w, slice, &mut rng, &mut next_seq);
                let block = slice.first + index;
                if !in_flight.contains(block) {
                    pick = Some((block, is_read));
                    break;
                }
            }
            let Some((block, is_read)) = pick else {
                break; // the slice is crowded: let something finish first
            };
            let lba = block * slice.lbas_per_io;
            let (res, gen) = if is_read {
                // Copied out only to be verified.
                (q.start_read_in_place(slot, lba, bs), 0)
            } else {
                let gen = shared.gens.0[block as usize].load(Ordering::Relaxed) + 1;
                fill_write(
                    &mut bufs[slot],
                    w,
                    block * bs as u64,
                    gen,
                    job_seed,
                    &mut rng,
                );
                (q.start_write(slot, lba, &bufs[slot]), gen)
            };
            match res {
                Ok(()) => {
                    free.pop();
                    busy[slot] = Some((block, is_read, gen, t0));
                    in_flight.set(block, true);
                    started += bs as u64;
                }
                Err(e) => {
                    account(
                        &mut shared.result(job),
                        Err(e),
                        w,
                        shared,
                        block,
                        is_read,
                        0,
                        job_seed,
                        &[],
                        0,
                    );
                    failed = true;
                }
            }
        }
        let Some((slot, res)) = q.complete_one(&mut bufs) else {
            break; // nothing in flight and nothing more to start
        };
        let Some((block, is_read, gen, t0)) = busy.get_mut(slot).and_then(Option::take) else {
            continue;
        };
        in_flight.set(block, false);
        free.push(slot);
        let now = Instant::now();
        let ns = now.duration_since(t0).as_nanos().max(1) as u64;
        let res = match res {
            Ok(()) if is_read && w.verify => q.read_back(slot, &mut bufs[slot]),
            r => r,
        };
        if !account(
            &mut shared.result(job),
            res,
            w,
            shared,
            block,
            is_read,
            gen,
            job_seed,
            &bufs[slot],
            ns,
        ) {
            failed = true;
        }
        fresh = Some(now);
    }
    drop(q);
    shared.result(job).stopped = why_stopped(failed, shared, w, started, budget);
    end_timed(dev, slice, bs, (job, job_seed, start), shared, w.verify);
}

/// Reads back every block of `slice` this run wrote and checks it: the
/// last acknowledged write of each block must be on the device.
fn read_back(
    dev: &dyn BlockDevice,
    slice: Slice,
    bs: usize,
    shared: &Shared,
    (job, job_seed): (u32, u32),
    buf: &mut [u8],
) {
    for block in slice.first..slice.first + slice.count {
        if shared.stopped() {
            return;
        }
        if shared.gens.0[block as usize].load(Ordering::Relaxed) == 0 {
            continue;
        }
        let offset = block * bs as u64;
        let res = dev.read_at(block * slice.lbas_per_io, buf);
        let mut r = shared.result(job);
        if let Err(e) = res {
            r.io_errors += 1;
            r.first_io_error
                .get_or_insert_with(|| format!("read-back at byte offset {offset:#x}: {e}"));
            return;
        }
        verify_read(buf, offset, shared, block, job_seed, &mut r);
        r.read_back += bs as u64;
        shared.checked.fetch_add(bs as u64, Ordering::Relaxed);
    }
}

fn verify_read(buf: &[u8], offset: u64, shared: &Shared, block: u64, seed: u32, r: &mut JobResult) {
    let gen = shared.gens.0[block as usize].load(Ordering::Relaxed);
    if gen == 0 {
        return; // never written by this run
    }
    for (u, unit) in buf.chunks_exact(UNIT).enumerate() {
        let at = offset + (u * UNIT) as u64;
        match check_unit(unit, at, gen, seed) {
            Ok(()) => r.verified += UNIT as u64,
            Err(m) => {
                r.failures += 1;
                if r.errors.len() < KEEP_ERRORS {
                    r.errors.push(VerifyError {
                        offset: at,
                        what: m.to_string(),
                    });
                }
            }
        }
    }
}

fn stats(h: &hdrhistogram::Histogram<u64>, bytes: u64, seconds: f64) -> DirStats {
    let ios = h.len();
    if ios == 0 {
        return DirStats::default();
    }
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    DirStats {
        ios,
        bytes,
        iops: ios as f64 / seconds,
        mib_per_s: mib_per_s(bytes, seconds),
        lat_p50_us: us(0.5),
        lat_p99_us: us(0.99),
        lat_p999_us: us(0.999),
        lat_max_us: h.max() as f64 / 1000.0,
    }
}

fn merge(w: &Workload, results: Vec<JobResult>, seconds: f64, size_budget: u64) -> Report {
    let mut read = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let mut write = read.clone();
    let (mut rb, mut wb, mut verified, mut failures, mut io_errors) = (0, 0, 0, 0, 0);
    let mut read_back = 0;
    let mut errors = Vec::new();
    let mut first_io_error = None;
    // The first reason in this order that any job gives.
    let order = [
        Stopped::Interrupted,
        Stopped::IoError,
        Stopped::Ended,
        Stopped::Runtime,
        Stopped::Size,
    ];
    let stopped = order
        .into_iter()
        .find(|o| results.iter().any(|r| r.stopped == *o))
        .unwrap_or(Stopped::Runtime);
    for r in results {
        read.add(&r.read)
            .expect("histograms with auto-resize merge");
        write
            .add(&r.write)
            .expect("histograms with auto-resize merge");
        rb += r.read_bytes;
        wb += r.write_bytes;
        verified += r.verified;
        read_back += r.read_back;
        failures += r.failures;
        io_errors += r.io_errors;
        errors.extend(r.errors);
        first_io_error = first_io_error.or(r.first_io_error);
    }
    errors.truncate(KEEP_ERRORS);
    let seconds = seconds.max(1e-9);
    let mut both = read.clone();
    both.add(&write).expect("histograms with auto-resize merge");
    Report {
        pattern: w.pattern.to_string(),
        bs: w.bs,
        jobs: w.jobs,
        seconds,
        read: stats(&read, rb, seconds),
        write: stats(&write, wb, seconds),
        total: stats(&both, rb + wb, seconds),
        stopped,
        size_budget,
        runtime_budget: w.runtime.as_secs_f64(),
        verified_bytes: verified,
        read_back_bytes: read_back,
        verify_failures: failures,
        verify_errors: errors,
        io_errors,
        first_io_error,
        jobs_waiting: 0,
    }
}

/// A RAM-backed device, for tests and as a baseline.
pub struct RamDevice {
    block_size: u32,
    data: std::sync::RwLock<Vec<u8>>,
    can_unmap: bool,
    yield_after_read: bool,
    flushes: AtomicU64,
}

impl RamDevice {
    /// A zeroed device of `blocks` blocks.
    pub fn new(block_size: u32, blocks: u64) -> RamDevice {
        RamDevice {
            block_size,
            data: std::sync::RwLock::new(vec![0; (block_size as u64 * blocks) as usize]),
            can_unmap: true,
            yield_after_read: false,
            flushes: AtomicU64::new(0),
        }
    }

    /// The same device answering `unmap` with `Unsupported`, like a disk
    /// without thin provisioning.
    pub fn without_unmap(self) -> RamDevice {
        RamDevice {
            can_unmap: false,
            ..self
        }
    }

    /// The same device giving up the CPU after each read, so that a
    /// read-modify-write racing another write loses it in tests rather
    /// than once in a blue moon.
    pub fn yielding_reads(self) -> RamDevice {
        RamDevice {
            yield_after_read: true,
            ..self
        }
    }

    /// How many times `flush` was called.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }
    fn range(&self, lba: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let start = lba
            .checked_mul(self.block_size as u64)
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "LBA out of range"))?;
        let end = start.saturating_add(len);
        if !len.is_multiple_of(self.block_size as usize) || end > self.data.read().unwrap().len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("I/O of {len} bytes at LBA {lba} is outside the device"),
            ));
        }
        Ok(start..end)
    }
}

impl BlockDevice for RamDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.data.read().unwrap().len() as u64 / self.block_size as u64
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        let r = self.range(lba, buf.len())?;
        buf.copy_from_slice(&self.data.read().unwrap()[r]);
        if self.yield_after_read {
            std::thread::yield_now();
        }
        Ok(())
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let r = self.range(lba, buf.len())?;
        self.data.write().unwrap()[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        if !self.can_unmap {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "unmap not supported",
            ));
        }
        let len = usize::try_from(blocks.saturating_mul(self.block_size as u64))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "unmap range too large"))?;
        let r = self.range(lba, len)?;
        self.data.write().unwrap()[r].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, Slice};

    #[test]
    fn in_flight_blocks_are_kept_as_bits_or_as_a_set_alike() {
        let small = Slice {
            first: 1000,
            count: 130,
            lbas_per_io: 8,
        };
        let large = Slice {
            count: InFlight::BITS_MAX + 1,
            ..small
        };
        let (mut bits, mut set) = (InFlight::new(small), InFlight::new(large));
        assert!(matches!(bits, InFlight::Bits { .. }));
        assert!(matches!(set, InFlight::Set(_)));
        for f in [&mut bits, &mut set] {
            for b in [1000, 1063, 1064, 1129] {
                assert!(!f.contains(b));
                f.set(b, true);
                assert!(f.contains(b));
            }
            f.set(1064, false);
            assert!(!f.contains(1064));
            assert!(f.contains(1063) && f.contains(1129));
        }
    }
}
