//! Byte-addressed access to a block-addressed [`BlockDevice`].
//!
//! NBD's default minimum block size is 1 (proto.md "Size constraints"), so
//! requests may start and end anywhere. A range is split into a partial
//! head block, whole middle blocks and a partial tail block; partial
//! blocks are read, patched and written back. Whole-block writes take
//! `rmw` shared and read-modify-write takes it exclusive, so a concurrent
//! write to another part of the same block cannot be lost between the read
//! and the write-back. Callers check ranges first ([`Volume::contains`]).

use blockload::BlockDevice;
use std::io;
use std::sync::{Arc, RwLock};

/// Largest single device call and zero buffer.
const CHUNK: u64 = 1 << 20;

/// One device seen as bytes.
pub struct Volume {
    dev: Arc<dyn BlockDevice>,
    bs: u64,
    size: u64,
    rmw: RwLock<()>,
}

/// A byte range split at block boundaries.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    /// (lba, offset in block, length) of a partial first block.
    head: Option<(u64, usize, usize)>,
    /// (first lba, blocks) of the whole blocks.
    middle: Option<(u64, u64)>,
    /// (lba, length from the block start) of a partial last block.
    tail: Option<(u64, usize)>,
}

impl Volume {
    /// Wraps a device.
    ///
    /// # Errors
    /// `InvalidInput` if the block size is 0 or not a power of two, or the
    /// device holds 2^64 bytes or more.
    pub fn new(dev: Arc<dyn BlockDevice>) -> io::Result<Volume> {
        let bs = u64::from(dev.block_size());
        if !bs.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {bs} is not a power of two"),
            ));
        }
        let size = dev.num_blocks().checked_mul(bs).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "device larger than 2^64 bytes")
        })?;
        Ok(Volume {
            dev,
            bs,
            size,
            rmw: RwLock::new(()),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Device block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.bs as u32
    }

    /// True if `[offset, offset + len)` lies inside the volume.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// Flushes the device.
    ///
    /// # Errors
    /// The device's error.
    pub fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }

    fn split(&self, offset: u64, len: u64) -> Split {
        let bs = self.bs;
        let end = offset + len;
        let mut head = None;
        let mut first_whole = offset.div_ceil(bs);
        if !offset.is_multiple_of(bs) {
            let n = (bs - offset % bs).min(len) as usize;
            head = Some((offset / bs, (offset % bs) as usize, n));
            first_whole = offset / bs + 1;
        }
        let last_whole = end / bs; // exclusive
        let tail = (!end.is_multiple_of(bs) && last_whole >= first_whole)
            .then(|| (last_whole, (end % bs) as usize));
        let middle = (last_whole > first_whole).then(|| (first_whole, last_whole - first_whole));
        Split { head, middle, tail }
    }

    /// Reads `buf.len()` bytes at `offset` (inside the volume).
    ///
    /// # Errors
    /// The device's error.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let split = self.split(offset, buf.len() as u64);
        let mut at = 0usize;
        let mut block = Vec::new();
        if let Some((lba, in_block, n)) = split.head {
            block.resize(self.bs as usize, 0);
            self.dev.read_at(lba, &mut block)?;
            buf[..n].copy_from_slice(&block[in_block..in_block + n]);
            at = n;
        }
        if let Some((first, blocks)) = split.middle {
            let bytes = (blocks * self.bs) as usize;
            self.chunked(first, &mut buf[at..at + bytes], |lba, chunk| {
                self.dev.read_at(lba, chunk)
            })?;
            at += bytes;
        }
        if let Some((lba, n)) = split.tail {
            block.resize(self.bs as usize, 0);
            self.dev.read_at(lba, &mut block)?;
            buf[at..at + n].copy_from_slice(&block[..n]);
        }
        Ok(())
    }

    /// Writes `data` at `offset` (inside the volume).
    ///
    /// # Errors
    /// The device's error.
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let split = self.split(offset, data.len() as u64);
        let _guard = self.lock(&split);
        let mut at = 0usize;
        if let Some((lba, in_block, n)) = split.head {
            self.patch(lba, in_block, |b| b.copy_from_slice(&data[..n]), n)?;
            at = n;
        }
        if let Some((first, blocks)) = split.middle {
            let bytes = (blocks * self.bs) as usize;
            let mut lba = first;
            for chunk in data[at..at + bytes].chunks(CHUNK as usize) {
                self.dev.write_at(lba, chunk)?;
                lba += chunk.len() as u64 / self.bs;
            }
            at += bytes;
        }
        if let Some((lba, n)) = split.tail {
            self.patch(lba, 0, |b| b.copy_from_slice(&data[at..at + n]), n)?;
        }
        Ok(())
    }

    /// Zeroes `[offset, offset + len)` (inside the volume). With
    /// `may_unmap`, whole blocks are unmapped where the device can (the
    /// `BlockDevice` contract says unmapped blocks read as zeroes).
    ///
    /// # Errors
    /// The device's error.
    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        let split = self.split(offset, len);
        let _guard = self.lock(&split);
        if let Some((lba, in_block, n)) = split.head {
            self.patch(lba, in_block, |b| b.fill(0), n)?;
        }
        if let Some((first, blocks)) = split.middle {
            let unmapped = may_unmap && self.unmap_supported(first, blocks)?;
            if !unmapped {
                let zeroes = vec![0u8; (blocks * self.bs).min(CHUNK) as usize];
                let (mut lba, end) = (first, first + blocks);
                while lba < end {
                    let n = ((end - lba) * self.bs).min(CHUNK);
                    self.dev.write_at(lba, &zeroes[..n as usize])?;
                    lba += n / self.bs;
                }
            }
        }
        if let Some((lba, n)) = split.tail {
            self.patch(lba, 0, |b| b.fill(0), n)?;
        }
        Ok(())
    }

    /// Deallocates the whole blocks inside `[offset, offset + len)`.
    /// Partial blocks at the edges are left alone and a device without
    /// unmap ignores the request: TRIM is advisory (proto.md
    /// `NBD_CMD_TRIM`).
    ///
    /// # Errors
    /// The device's error other than `Unsupported`.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let split = self.split(offset, len);
        if let Some((first, blocks)) = split.middle {
            let _shared = self.rmw.read().unwrap_or_else(|p| p.into_inner());
            self.unmap_supported(first, blocks)?;
        }
        Ok(())
    }

    /// Unmaps; `Ok(false)` if the device cannot.
    fn unmap_supported(&self, first: u64, blocks: u64) -> io::Result<bool> {
        match self.dev.unmap(first, blocks) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn lock(&self, split: &Split) -> Guard<'_> {
        if split.head.is_some() || split.tail.is_some() {
            Guard::Exclusive(self.rmw.write().unwrap_or_else(|p| p.into_inner()))
        } else {
            Guard::Shared(self.rmw.read().unwrap_or_else(|p| p.into_inner()))
        }
    }

    /// Read-modify-write of bytes `[at, at + n)` of block `lba`; the
    /// caller holds `rmw` exclusive.
    fn patch(&self, lba: u64, at: usize, fill: impl FnOnce(&mut [u8]), n: usize) -> io::Result<()> {
        let mut block = vec![0u8; self.bs as usize];
        self.dev.read_at(lba, &mut block)?;
        fill(&mut block[at..at + n]);
        self.dev.write_at(lba, &block)
    }

    fn chunked(
        &self,
        first: u64,
        buf: &mut [u8],
        mut op: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut lba = first;
        for chunk in buf.chunks_mut(CHUNK as usize) {
            op(lba, chunk)?;
            lba += chunk.len() as u64 / self.bs;
        }
        Ok(())
    }
}

/// Holds `rmw` shared or exclusive until dropped.
enum Guard<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use blockload::RamDevice;

    fn vol(bs: u32, blocks: u64) -> Volume {
        Volume::new(Arc::new(RamDevice::new(bs, blocks))).unwrap()
    }

    /// Every byte's value is a function of its offset, so a misplaced byte
    /// shows.
    pub(crate) fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| ((offset + i) * 7 % 251) as u8 + 1)
            .collect()
    }

    #[test]
    fn split_cases() {
        let v = vol(512, 16);
        let s = |o, n| v.split(o, n);
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
        assert_eq!(
            s(512, 0),
            Split {
                head: None,
                middle: None,
                tail: None
            }
        );
    }

    #[test]
    fn unaligned_io_reads_back_and_spares_neighbours() {
        let v = vol(4096, 8);
        let mut shadow = vec![0u8; v.size() as usize];
        for (off, len) in [
            (1u64, 3usize),
            (4095, 2),
            (700, 9000),
            (12288, 4096),
            (30000, 2768),
        ] {
            let data = pattern(off, len);
            v.write(off, &data).unwrap();
            shadow[off as usize..off as usize + len].copy_from_slice(&data);
        }
        let mut all = vec![0u8; v.size() as usize];
        v.read(0, &mut all).unwrap();
        assert_eq!(all, shadow);
        let mut some = vec![0u8; 5];
        v.read(4094, &mut some).unwrap();
        assert_eq!(some, shadow[4094..4099]);
        v.write_zeroes(100, 9000, true).unwrap();
        shadow[100..9100].fill(0);
        v.write_zeroes(20000, 5, false).unwrap();
        shadow[20000..20005].fill(0);
        v.read(0, &mut all).unwrap();
        assert_eq!(all, shadow);
    }

    #[test]
    fn trim_touches_only_whole_blocks() {
        let v = vol(512, 8);
        v.write(0, &[0xaa; 4096]).unwrap();
        v.trim(100, 1000).unwrap(); // only block 1 (512..1024) is whole
        let mut all = vec![0u8; 4096];
        v.read(0, &mut all).unwrap();
        assert!(all[..512].iter().all(|&b| b == 0xaa));
        assert!(all[512..1024].iter().all(|&b| b == 0));
        assert!(all[1024..].iter().all(|&b| b == 0xaa));
        assert!(v.contains(4000, 96) && !v.contains(4000, 97) && !v.contains(u64::MAX, 2));
    }

    #[test]
    fn bad_block_size_refused() {
        struct Odd;
        impl BlockDevice for Odd {
            fn block_size(&self) -> u32 {
                520
            }
            fn num_blocks(&self) -> u64 {
                1
            }
            fn read_at(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
                Ok(())
            }
            fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
                Ok(())
            }
        }
        assert!(Volume::new(Arc::new(Odd)).is_err());
    }

    /// Threads write their own byte of the same block with unaligned
    /// writes; without the exclusive read-modify-write some would be lost.
    #[test]
    fn concurrent_unaligned_writes_are_not_lost() {
        let v = Arc::new(vol(512, 4));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let v = v.clone();
                std::thread::spawn(move || {
                    for i in 0..64u64 {
                        v.write(256 + i * 8 + t, &[(t + 1) as u8]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut got = vec![0u8; 512];
        v.read(256, &mut got).unwrap();
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, (i % 8) as u8 + 1, "byte {} lost", 256 + i);
        }
    }
}
