//! A LUN as a file: end-of-file policies and errnos over
//! [`blockload::bytes::ByteView`], the part of the file system that does
//! not know about FUSE.

use crate::FileStats;
use blockload::bytes::ByteView;
use blockload::counts::IoCounts;
use blockload::BlockDevice;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a byte-level operation on a LUN failed.
#[derive(Debug)]
pub(crate) enum LunError {
    /// The range starts at or beyond the end of the device (block devices
    /// answer ENOSPC here; the file cannot grow).
    PastEnd,
    /// The device cannot do this (no UNMAP).
    Unsupported,
    /// The device failed the I/O.
    Device(io::Error),
}

impl LunError {
    fn device(e: io::Error) -> LunError {
        if e.kind() == io::ErrorKind::Unsupported {
            LunError::Unsupported
        } else {
            LunError::Device(e)
        }
    }

    /// The errno the caller of read(2)/write(2)/fallocate(2) sees.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            LunError::PastEnd => libc::ENOSPC,
            LunError::Unsupported => libc::EOPNOTSUPP,
            LunError::Device(_) => libc::EIO,
        }
    }
}

impl std::fmt::Display for LunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LunError::PastEnd => f.write_str("range starts past the end of the device"),
            LunError::Unsupported => f.write_str("the device does not support this"),
            LunError::Device(e) => write!(f, "device error: {e}"),
        }
    }
}

type Result<T> = std::result::Result<T, LunError>;

/// One device shown as a file: [`ByteView`] with a file's policies at the
/// end of the device (reads and writes come back short, zero and punch
/// are clamped, a write starting past the end is ENOSPC).
pub(crate) struct Lun {
    pub(crate) name: String,
    view: ByteView,
    /// A write, zero or punch has completed since the last cache flush
    /// began: set once the data is at the device, cleared as a flush
    /// starts (so a write that completes during a flush leaves it set).
    unsynced: AtomicBool,
    counts: IoCounts,
}

impl Lun {
    pub(crate) fn new(name: String, dev: Arc<dyn BlockDevice>, max_io: usize) -> io::Result<Lun> {
        let view = ByteView::new(dev, max_io)
            .map_err(|e| io::Error::new(e.kind(), format!("device `{name}`: {e}")))?;
        Ok(Lun {
            name,
            view,
            unsynced: AtomicBool::new(false),
            counts: IoCounts::default(),
        })
    }

    /// What was done through this file so far.
    pub(crate) fn stats(&self) -> FileStats {
        self.counts.stats()
    }

    pub(crate) fn size(&self) -> u64 {
        self.view.size()
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.view.block_size()
    }

    /// Flushes the device's cache (SYNCHRONIZE CACHE on SRP), always.
    pub(crate) fn flush(&self) -> Result<()> {
        self.unsynced.store(false, Ordering::SeqCst);
        self.counts.other(|| self.view.flush()).map_err(|e| {
            self.unsynced.store(true, Ordering::SeqCst);
            LunError::Device(e)
        })
    }

    /// Flushes the device's cache only if something was written since the
    /// last flush: a close that wrote nothing sends no command, and so
    /// does not wait on a path that is down.
    pub(crate) fn flush_if_written(&self) -> Result<()> {
        if self.unsynced.load(Ordering::SeqCst) {
            self.flush()
        } else {
            Ok(())
        }
    }

    fn wrote<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_ok() {
            self.unsynced.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Reads up to `len` bytes at `offset`; short at the end of the
    /// device, empty at or past it.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        let Some(len) = self.clamp(offset, u64::from(len)) else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; len as usize];
        self.counts
            .read(len, || self.view.read(offset, &mut buf))
            .map_err(LunError::Device)?;
        Ok(buf)
    }

    /// Writes `data` at `offset`; returns how much was written, which is
    /// short when the write crosses the end of the device.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let len = self
            .clamp(offset, data.len() as u64)
            .ok_or(LunError::PastEnd)? as usize;
        self.wrote(
            self.counts
                .write(len as u64, || self.view.write(offset, &data[..len]))
                .map_err(LunError::Device),
        )?;
        Ok(len)
    }

    /// Writes zeroes over `[offset, offset + len)`, clamped to the device.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        self.wrote(
            self.counts
                .other(|| self.view.zero(offset, len))
                .map_err(LunError::Device),
        )
    }

    /// Deallocates `[offset, offset + len)`, clamped to the device: whole
    /// blocks are unmapped, partial blocks at the edges are zeroed.
    pub(crate) fn punch(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        self.wrote(
            self.counts
                .other(|| self.view.punch(offset, len))
                .map_err(LunError::device),
        )
    }

    fn clamp(&self, offset: u64, len: u64) -> Option<u64> {
        let size = self.size();
        (offset < size && len > 0).then(|| len.min(size - offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockload::RamDevice;

    fn lun(bs: u32, blocks: u64) -> Lun {
        Lun::new("t".into(), Arc::new(RamDevice::new(bs, blocks)), 4096).unwrap()
    }

    #[test]
    fn end_of_device() {
        let l = lun(512, 4);
        assert_eq!(l.read(2048, 10).unwrap(), Vec::<u8>::new());
        assert_eq!(l.read(2040, 100).unwrap().len(), 8);
        assert!(matches!(l.write(2048, &[1]), Err(LunError::PastEnd)));
        assert_eq!(LunError::PastEnd.errno(), libc::ENOSPC);
        assert_eq!(l.write(2040, &[9u8; 100]).unwrap(), 8);
        assert_eq!(l.read(2040, 8).unwrap(), vec![9u8; 8]);
        assert_eq!(l.read(2039, 3).unwrap(), vec![0, 9, 9]);
    }

    #[test]
    fn punch_and_zero() {
        let l = lun(512, 8);
        l.write(0, &[0xaa; 4096]).unwrap();
        l.punch(100, 1000).unwrap();
        let all = l.read(0, 4096).unwrap();
        assert!(all[..100].iter().all(|&b| b == 0xaa));
        assert!(all[100..1100].iter().all(|&b| b == 0));
        assert!(all[1100..].iter().all(|&b| b == 0xaa));
        l.zero(3000, 5000).unwrap(); // clamped at the end
        l.punch(4096, 10).unwrap(); // past the end: nothing
        let all = l.read(0, 4096).unwrap();
        assert!(all[1100..3000].iter().all(|&b| b == 0xaa));
        assert!(all[3000..].iter().all(|&b| b == 0));
    }

    /// A RAM device that counts cache flushes.
    struct Flushes(RamDevice, std::sync::atomic::AtomicU64);

    impl BlockDevice for Flushes {
        fn block_size(&self) -> u32 {
            self.0.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.0.num_blocks()
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
            self.0.read_at(lba, buf)
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
            self.0.write_at(lba, buf)
        }
        fn flush(&self) -> io::Result<()> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
            self.0.unmap(lba, blocks)
        }
    }

    #[test]
    fn a_close_flushes_only_after_a_write() {
        let dev = Arc::new(Flushes(RamDevice::new(512, 8), Default::default()));
        let l = Lun::new("f".into(), dev.clone(), 4096).unwrap();
        let flushes = || dev.1.load(Ordering::SeqCst);
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 0, "nothing written yet");
        l.write(10, &[1, 2, 3]).unwrap();
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 1);
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 1, "nothing written since");
        l.zero(0, 100).unwrap();
        l.flush_if_written().unwrap();
        l.punch(0, 1024).unwrap();
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 3, "zero and punch write too");
        l.read(0, 100).unwrap();
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 3, "a read is not a write");
        l.flush().unwrap();
        assert_eq!(flushes(), 4, "fsync always flushes");
        // A write that failed (past the end) wrote nothing.
        assert!(l.write(4096, &[1]).is_err());
        l.flush_if_written().unwrap();
        assert_eq!(flushes(), 4);
    }

    /// A RAM device whose reads fail while `broken`, and wait while
    /// `held` (a device that does not answer).
    struct Stalls {
        ram: RamDevice,
        broken: AtomicBool,
        held: AtomicBool,
    }

    impl BlockDevice for Stalls {
        fn block_size(&self) -> u32 {
            self.ram.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.ram.num_blocks()
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
            while self.held.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if self.broken.load(Ordering::SeqCst) {
                return Err(io::Error::other("medium error"));
            }
            self.ram.read_at(lba, buf)
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
            self.ram.write_at(lba, buf)
        }
    }

    #[test]
    fn stats_count_requests_bytes_errors_and_what_is_in_flight() {
        let dev = Arc::new(Stalls {
            ram: RamDevice::new(512, 4),
            broken: AtomicBool::new(false),
            held: AtomicBool::new(false),
        });
        let l = Arc::new(Lun::new("s".into(), dev.clone(), 4096).unwrap());
        l.write(0, &[7u8; 100]).unwrap();
        l.read(2040, 100).unwrap(); // short: 8 bytes
        assert!(l.write(2048, &[1]).is_err(), "past the end: no request");
        dev.broken.store(true, Ordering::SeqCst);
        assert!(l.read(0, 10).is_err());
        dev.broken.store(false, Ordering::SeqCst);
        let s = l.stats();
        assert_eq!((s.reads, s.read_bytes), (1, 8), "{s:?}");
        assert_eq!((s.writes, s.written_bytes), (1, 100), "{s:?}");
        assert_eq!((s.errors, s.in_flight), (1, 0), "{s:?}");
        // A read the device holds is in flight until it answers.
        dev.held.store(true, Ordering::SeqCst);
        let reader = {
            let l = l.clone();
            std::thread::spawn(move || l.read(0, 512).map(|b| b.len()).ok())
        };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while l.stats().in_flight == 0 && std::time::Instant::now() < end {
            std::thread::yield_now();
        }
        assert_eq!(l.stats().in_flight, 1);
        dev.held.store(false, Ordering::SeqCst);
        assert_eq!(reader.join().unwrap(), Some(512));
        assert_eq!(l.stats().in_flight, 0);
        assert_eq!(l.stats().reads, 2);
    }

    #[test]
    fn punch_without_unmap_is_unsupported() {
        let dev = RamDevice::new(512, 8).without_unmap();
        let l = Lun::new("n".into(), Arc::new(dev), 4096).unwrap();
        let e = l.punch(0, 1024).unwrap_err();
        assert_eq!(e.errno(), libc::EOPNOTSUPP);
    }

    #[test]
    fn zero_block_size_is_refused_with_the_name() {
        let e = Lun::new("odd".into(), Arc::new(RamDevice::new(0, 8)), 4096)
            .err()
            .unwrap();
        assert!(e.to_string().contains("`odd`"), "{e}");
    }
}
