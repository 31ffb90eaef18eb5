//! What a server of a device did with it, counted as its clients asked:
//! the FUSE files of `blockfuse` and the NBD export of `nbd` count each
//! request once, however many device calls it took. An interrupted server
//! says from these what it served and how many requests still wait inside
//! a device call (a device that stopped answering holds them, and the
//! server cannot end its session before they return).

use rdma_types::units::format_size;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The numbers of an [`IoCounts`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Reads done.
    pub reads: u64,
    /// Bytes they returned.
    pub read_bytes: u64,
    /// Writes done.
    pub writes: u64,
    /// Bytes they wrote.
    pub written_bytes: u64,
    /// Requests the device failed.
    pub errors: u64,
    /// Requests inside a device call now (reads, writes, flushes, zeroes
    /// and unmaps): a device that no longer answers keeps them here.
    pub in_flight: u64,
}

impl fmt::Display for IoStats {
    /// `2 reads (1 MiB), 1 writes (4 KiB), 0 errors`, and `, 1 in flight`
    /// when requests wait.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reads ({}), {} writes ({}), {} errors",
            self.reads,
            format_size(self.read_bytes),
            self.writes,
            format_size(self.written_bytes),
            self.errors
        )?;
        if self.in_flight > 0 {
            write!(f, ", {} in flight", self.in_flight)?;
        }
        Ok(())
    }
}

/// [`IoStats`] as they are counted, from any number of threads: each
/// request's device calls run inside [`IoCounts::read`],
/// [`IoCounts::write`] or [`IoCounts::other`].
#[derive(Debug, Default)]
pub struct IoCounts {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
}

/// One request inside a device call, for [`IoStats::in_flight`].
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl IoCounts {
    /// The numbers now.
    pub fn stats(&self) -> IoStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoStats {
            reads: get(&self.reads),
            read_bytes: get(&self.read_bytes),
            writes: get(&self.writes),
            written_bytes: get(&self.written_bytes),
            errors: get(&self.errors),
            in_flight: get(&self.in_flight),
        }
    }

    /// Runs `f`, the device calls of a read of `bytes`, in flight: a read
    /// of `bytes` when it succeeds, an error when it fails.
    ///
    /// # Errors
    /// `f`'s.
    pub fn read<T>(&self, bytes: u64, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let done = self.other(f)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(done)
    }

    /// As [`IoCounts::read`], for a write of `bytes`.
    ///
    /// # Errors
    /// `f`'s.
    pub fn write<T>(&self, bytes: u64, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let done = self.other(f)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(done)
    }

    /// Runs `f`, the device calls of a flush, zeroing or unmap, in flight:
    /// an error when it fails, except `Unsupported` (a device without
    /// unmap fails nothing).
    ///
    /// # Errors
    /// `f`'s.
    pub fn other<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let busy = InFlight(&self.in_flight);
        let done = f();
        drop(busy);
        if let Err(e) = &done {
            if e.kind() != io::ErrorKind::Unsupported {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn requests_bytes_and_errors_are_counted_once_each() {
        let c = IoCounts::default();
        c.read(4096, || Ok(())).unwrap();
        c.write(1 << 20, || Ok(())).unwrap();
        c.write(512, || Ok(())).unwrap();
        assert!(c
            .read(4096, || Err::<(), _>(io::Error::other("EIO")))
            .is_err());
        assert!(c
            .other(|| Err::<(), _>(io::Error::from(io::ErrorKind::Unsupported)))
            .is_err());
        assert!(c.other(|| Err::<(), _>(io::Error::other("EIO"))).is_err());
        let s = c.stats();
        assert_eq!(
            s,
            IoStats {
                reads: 1,
                read_bytes: 4096,
                writes: 2,
                written_bytes: (1 << 20) + 512,
                errors: 2,
                in_flight: 0,
            }
        );
        assert_eq!(
            s.to_string(),
            "1 reads (4 KiB), 2 writes (1.0 MiB), 2 errors"
        );
    }

    /// A request is in flight while its device call runs, and only then.
    #[test]
    fn a_request_inside_a_device_call_is_in_flight() {
        let c = Arc::new(IoCounts::default());
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let t = {
            let c = c.clone();
            std::thread::spawn(move || {
                c.read(512, || {
                    let _ = wait.recv();
                    Ok(())
                })
            })
        };
        let end = Instant::now() + Duration::from_secs(10);
        while c.stats().in_flight == 0 && Instant::now() < end {
            std::thread::yield_now();
        }
        assert_eq!(c.stats().in_flight, 1);
        assert!(c.stats().to_string().ends_with(", 0 errors, 1 in flight"));
        go.send(()).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!((c.stats().in_flight, c.stats().reads), (0, 1));
    }
}
