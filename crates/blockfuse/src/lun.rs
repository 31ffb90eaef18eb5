//! Byte-addressed access to a block-addressed device: the part of the
//! filesystem that does not know about FUSE.

use blockload::BlockDevice;
use std::io;
use std::sync::{Arc, RwLock};

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

/// One device shown as a file.
pub(crate) struct Lun {
    pub(crate) name: String,
    dev: Arc<dyn BlockDevice>,
    bs: u64,
    size: u64,
    /// Largest single device call, a whole number of blocks.
    max_io: u64,
    /// Writes that cover whole blocks take it shared; read-modify-write
    /// of a partial block takes it exclusive, so no other write can land
    /// between its read and its write and be lost.
    rmw: RwLock<()>,
}

/// A byte range split at block boundaries: a partial head block, whole
/// middle blocks, a partial tail block (each part may be empty).
#[derive(Debug, PartialEq, Eq)]
struct Split {
    /// (lba, offset in block, length) of a partial first block.
    head: Option<(u64, usize, usize)>,
    /// (first lba, blocks) of the whole blocks.
    middle: Option<(u64, u64)>,
    /// (lba, length from the block start) of a partial last block.
    tail: Option<(u64, usize)>,
}

impl Lun {
    pub(crate) fn new(name: String, dev: Arc<dyn BlockDevice>, max_io: usize) -> io::Result<Lun> {
        let bs = u64::from(dev.block_size());
        if bs == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device `{name}` reports a block size of 0"),
            ));
        }
        let size = dev.num_blocks().checked_mul(bs).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device `{name}` is larger than 2^64 bytes"),
            )
        })?;
        let max_io = (max_io as u64 / bs).max(1) * bs;
        Ok(Lun {
            name,
            dev,
            bs,
            size,
            max_io,
            rmw: RwLock::new(()),
        })
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.bs as u32
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.dev.flush().map_err(LunError::Device)
    }

    /// Splits `[offset, offset + len)`, which must lie inside the device.
    fn split(&self, offset: u64, len: u64) -> Split {
        let bs = self.bs;
        let end = offset + len;
        let mut head = None;
        let mut tail = None;
        let mut first_whole = offset.div_ceil(bs);
        let last_whole = end / bs; // exclusive
        if !offset.is_multiple_of(bs) {
            let lba = offset / bs;
            let in_block = (offset % bs) as usize;
            let n = (bs - offset % bs).min(len) as usize;
            head = Some((lba, in_block, n));
            first_whole = lba + 1;
        }
        if !end.is_multiple_of(bs) && end / bs >= first_whole {
            tail = Some((end / bs, (end % bs) as usize));
        }
        let middle = (last_whole > first_whole).then(|| (first_whole, last_whole - first_whole));
        Split { head, middle, tail }
    }

    /// Reads up to `len` bytes at `offset`; short at the end of the
    /// device, empty at or past it.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        if offset >= self.size {
            return Ok(Vec::new());
        }
        let len = u64::from(len).min(self.size - offset);
        let first = offset / self.bs;
        let end_lba = (offset + len).div_ceil(self.bs);
        let mut buf = vec![0u8; ((end_lba - first) * self.bs) as usize];
        for (i, chunk) in buf.chunks_mut(self.max_io as usize).enumerate() {
            let lba = first + i as u64 * (self.max_io / self.bs);
            self.dev.read_at(lba, chunk).map_err(LunError::Device)?;
        }
        let skip = (offset % self.bs) as usize;
        buf.drain(..skip);
        buf.truncate(len as usize);
        Ok(buf)
    }

    /// Writes `data` at `offset`; returns how much was written, which is
    /// short when the write crosses the end of the device.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= self.size {
            return Err(LunError::PastEnd);
        }
        let len = (data.len() as u64).min(self.size - offset) as usize;
        let data = &data[..len];
        self.modify(offset, len as u64, |dst, at| {
            dst.copy_from_slice(&data[at..at + dst.len()])
        })?;
        Ok(len)
    }

    /// Writes zeroes over `[offset, offset + len)`, clamped to the device.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        self.modify(offset, len, |dst, _| dst.fill(0))
    }

    /// Deallocates `[offset, offset + len)`, clamped to the device: whole
    /// blocks are unmapped, partial blocks at the edges are zeroed.
    pub(crate) fn punch(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        let split = self.split(offset, len);
        if let Some((lba, blocks)) = split.middle {
            let _shared = self.rmw.read().unwrap_or_else(|p| p.into_inner());
            self.dev.unmap(lba, blocks).map_err(LunError::device)?;
        }
        let _excl = self.rmw.write().unwrap_or_else(|p| p.into_inner());
        if let Some((lba, at, n)) = split.head {
            self.rmw_block(lba, at, n, |dst| dst.fill(0))?;
        }
        if let Some((lba, n)) = split.tail {
            self.rmw_block(lba, 0, n, |dst| dst.fill(0))?;
        }
        Ok(())
    }

    fn clamp(&self, offset: u64, len: u64) -> Option<u64> {
        (offset < self.size && len > 0).then(|| len.min(self.size - offset))
    }

    /// Fills `[offset, offset + len)` (inside the device) through `fill`,
    /// which gets each destination slice and its offset from `offset`.
    fn modify(&self, offset: u64, len: u64, fill: impl Fn(&mut [u8], usize)) -> Result<()> {
        let split = self.split(offset, len);
        let partial = split.head.is_some() || split.tail.is_some();
        let _guard = if partial {
            (
                None,
                Some(self.rmw.write().unwrap_or_else(|p| p.into_inner())),
            )
        } else {
            (
                Some(self.rmw.read().unwrap_or_else(|p| p.into_inner())),
                None,
            )
        };
        let mut at = 0usize;
        if let Some((lba, in_block, n)) = split.head {
            self.rmw_block(lba, in_block, n, |dst| fill(dst, 0))?;
            at = n;
        }
        if let Some((first, blocks)) = split.middle {
            let mut buf = vec![0u8; (blocks * self.bs).min(self.max_io) as usize];
            let mut lba = first;
            let end = first + blocks;
            while lba < end {
                let n = ((end - lba) * self.bs).min(self.max_io) as usize;
                let chunk = &mut buf[..n];
                fill(chunk, at);
                self.dev.write_at(lba, chunk).map_err(LunError::Device)?;
                lba += n as u64 / self.bs;
                at += n;
            }
        }
        if let Some((lba, n)) = split.tail {
            self.rmw_block(lba, 0, n, |dst| fill(dst, at))?;
        }
        Ok(())
    }

    /// Read-modify-write of bytes `[at, at + n)` of block `lba`. The caller
    /// holds `rmw` exclusively.
    fn rmw_block(&self, lba: u64, at: usize, n: usize, fill: impl FnOnce(&mut [u8])) -> Result<()> {
        let mut block = vec![0u8; self.bs as usize];
        self.dev
            .read_at(lba, &mut block)
            .map_err(LunError::Device)?;
        fill(&mut block[at..at + n]);
        self.dev.write_at(lba, &block).map_err(LunError::Device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockload::RamDevice;

    fn lun(bs: u32, blocks: u64, max_io: usize) -> Lun {
        Lun::new("t".into(), Arc::new(RamDevice::new(bs, blocks)), max_io).unwrap()
    }

    #[test]
    fn split_cases() {
        let l = lun(512, 16, 4096);
        let s = |o, n| l.split(o, n);
        assert_eq!(
            s(0, 1024),
            Split {
                head: None,
                middle: Some((0, 2)),
                tail: None
            }
        );
        assert_eq!(
            s(10, 5),
            Split {
                head: Some((0, 10, 5)),
                middle: None,
                tail: None
            }
        );
        assert_eq!(
            s(0, 5),
            Split {
                head: None,
                middle: None,
                tail: Some((0, 5))
            }
        );
        assert_eq!(
            s(500, 1100),
            Split {
                head: Some((0, 500, 12)),
                middle: Some((1, 2)),
                tail: Some((3, 64))
            }
        );
        assert_eq!(
            s(500, 12),
            Split {
                head: Some((0, 500, 12)),
                middle: None,
                tail: None
            }
        );
        assert_eq!(
            s(500, 13),
            Split {
                head: Some((0, 500, 12)),
                middle: None,
                tail: Some((1, 1))
            }
        );
    }

    /// Every byte's value is a function of its offset, so any misplaced
    /// byte shows.
    fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| ((offset + i) * 7 % 251) as u8 + 1)
            .collect()
    }

    #[test]
    fn unaligned_writes_read_back_and_spare_neighbours() {
        // max_io of one block forces the chunk loop.
        let l = lun(512, 32, 512);
        let mut shadow = vec![0u8; l.size() as usize];
        for (off, len) in [
            (1u64, 3usize),
            (511, 2),
            (700, 3000),
            (4096, 512),
            (8000, 192),
        ] {
            let data = pattern(off, len);
            assert_eq!(l.write(off, &data).unwrap(), len);
            shadow[off as usize..off as usize + len].copy_from_slice(&data);
        }
        assert_eq!(l.read(0, l.size() as u32).unwrap(), shadow);
        assert_eq!(l.read(699, 5).unwrap(), shadow[699..704]);
    }

    #[test]
    fn end_of_device() {
        let l = lun(512, 4, 4096);
        assert_eq!(l.read(2048, 10).unwrap(), Vec::<u8>::new());
        assert_eq!(l.read(2040, 100).unwrap().len(), 8);
        assert!(matches!(l.write(2048, &[1]), Err(LunError::PastEnd)));
        assert_eq!(LunError::PastEnd.errno(), libc::ENOSPC);
        assert_eq!(l.write(2040, &[9u8; 100]).unwrap(), 8);
        assert_eq!(l.read(2040, 8).unwrap(), vec![9u8; 8]);
    }

    #[test]
    fn punch_and_zero() {
        let l = lun(512, 8, 4096);
        l.write(0, &[0xaa; 4096]).unwrap();
        l.punch(100, 1000).unwrap();
        let all = l.read(0, 4096).unwrap();
        assert!(all[..100].iter().all(|&b| b == 0xaa));
        assert!(all[100..1100].iter().all(|&b| b == 0));
        assert!(all[1100..].iter().all(|&b| b == 0xaa));
        l.zero(3000, 5000).unwrap(); // clamped at the end
        let all = l.read(0, 4096).unwrap();
        assert!(all[1100..3000].iter().all(|&b| b == 0xaa));
        assert!(all[3000..].iter().all(|&b| b == 0));
    }

    struct NoUnmap(RamDevice);
    impl BlockDevice for NoUnmap {
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
    }

    #[test]
    fn punch_without_unmap_is_unsupported() {
        let l = Lun::new("n".into(), Arc::new(NoUnmap(RamDevice::new(512, 8))), 4096).unwrap();
        let e = l.punch(0, 1024).unwrap_err();
        assert_eq!(e.errno(), libc::EOPNOTSUPP);
    }

    /// Many threads each write their own byte of the same two blocks with
    /// unaligned writes; without the exclusive read-modify-write some
    /// bytes would come back zero.
    #[test]
    fn concurrent_unaligned_writes_to_one_block_are_not_lost() {
        let l = Arc::new(lun(512, 4, 4096));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..128u64 {
                        let off = 256 + i * 8 + t;
                        l.write(off, &[(t + 1) as u8]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let got = l.read(256, 1024).unwrap();
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, (i % 8) as u8 + 1, "byte {} lost", 256 + i);
        }
    }
}
