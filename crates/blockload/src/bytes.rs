//! Byte-addressed access to a block-addressed [`BlockDevice`].
//!
//! A byte range is split into a partial head block, whole middle blocks
//! and a partial tail block (each may be empty). Whole blocks go to the
//! device directly, in calls of at most `max_io` bytes; partial blocks are
//! read, patched and written back. Writes and unmaps of whole blocks take
//! the view's lock shared and read-modify-write takes it exclusive, so no
//! write to another part of a block can land between the read and the
//! write-back of a partial update and be lost.
//!
//! Every operation takes a range that lies inside the device and refuses
//! one that does not (`InvalidInput`); what to do at the end of a device
//! (an error, a short write) is the caller's policy. The end is the
//! device's as it says now (`num_blocks` on every call), so a view follows
//! a device that is resized under it.

use crate::BlockDevice;
use std::io;
use std::sync::{Arc, RwLock};

/// One device seen as bytes.
pub struct ByteView {
    dev: Arc<dyn BlockDevice>,
    bs: u64,
    /// Largest single device call, a whole number of blocks.
    max_io: u64,
    /// Shared for whole-block writes and unmaps, exclusive for
    /// read-modify-write of a partial block.
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

impl Split {
    fn partial(&self) -> bool {
        self.head.is_some() || self.tail.is_some()
    }
}

/// Where written bytes come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Data(&'a [u8]),
    Zeroes,
}

impl Source<'_> {
    /// Fills `dst` with the source's bytes from `at` on.
    fn fill(self, dst: &mut [u8], at: usize) {
        match self {
            Source::Data(d) => dst.copy_from_slice(&d[at..at + dst.len()]),
            Source::Zeroes => dst.fill(0),
        }
    }
}

impl ByteView {
    /// Wraps `dev`; device calls move at most `max_io` bytes (rounded down
    /// to whole blocks, at least one block).
    ///
    /// # Errors
    /// `InvalidInput` if the block size is 0 or the device holds 2^64
    /// bytes or more.
    pub fn new(dev: Arc<dyn BlockDevice>, max_io: usize) -> io::Result<ByteView> {
        let bs = u64::from(dev.block_size());
        if bs == 0 {
            return Err(invalid("block size of 0".into()));
        }
        dev.num_blocks()
            .checked_mul(bs)
            .ok_or_else(|| invalid("device larger than 2^64 bytes".into()))?;
        let max_io = (max_io as u64 / bs).max(1) * bs;
        Ok(ByteView {
            dev,
            bs,
            max_io,
            rmw: RwLock::new(()),
        })
    }

    /// Size in bytes now (saturating at 2^64 - 1 for a device that grew
    /// that large).
    pub fn size(&self) -> u64 {
        self.dev.num_blocks().saturating_mul(self.bs)
    }

    /// Device block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.bs as u32
    }

    /// True if `[offset, offset + len)` lies inside the device.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size())
    }

    /// Flushes the device.
    ///
    /// # Errors
    /// The device's error.
    pub fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }

    /// Fills `buf` from `offset`.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the device, else the device's
    /// error.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let split = self.split(offset, buf.len() as u64)?;
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
            let mut lba = first;
            for chunk in buf[at..at + bytes].chunks_mut(self.max_io as usize) {
                self.dev.read_at(lba, chunk)?;
                lba += chunk.len() as u64 / self.bs;
            }
            at += bytes;
        }
        if let Some((lba, n)) = split.tail {
            block.resize(self.bs as usize, 0);
            self.dev.read_at(lba, &mut block)?;
            buf[at..at + n].copy_from_slice(&block[..n]);
        }
        Ok(())
    }

    /// Writes `data` at `offset`.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the device, else the device's
    /// error.
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.modify(offset, data.len() as u64, Source::Data(data))
    }

    /// Writes zeroes over `[offset, offset + len)`.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the device, else the device's
    /// error.
    pub fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.modify(offset, len, Source::Zeroes)
    }

    /// Unmaps the whole blocks inside `[offset, offset + len)`; partial
    /// blocks at the edges are left alone.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the device, else the device's
    /// error (`Unsupported` if it cannot unmap).
    pub fn unmap_blocks(&self, offset: u64, len: u64) -> io::Result<()> {
        let split = self.split(offset, len)?;
        self.unmap_middle(&split)
    }

    /// Deallocates `[offset, offset + len)`: whole blocks are unmapped (the
    /// `BlockDevice` contract says they then read as zeroes), partial
    /// blocks at the edges are zeroed.
    ///
    /// # Errors
    /// `InvalidInput` for a range outside the device, else the device's
    /// error. A device that cannot unmap answers `Unsupported` before the
    /// edges are touched, so the caller may fall back to [`ByteView::zero`].
    pub fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let split = self.split(offset, len)?;
        self.unmap_middle(&split)?;
        if split.partial() {
            let _excl = self.rmw.write().unwrap_or_else(|p| p.into_inner());
            self.patch_edges(&split, Source::Zeroes)?;
        }
        Ok(())
    }

    /// Splits `[offset, offset + len)`, which must lie inside the device.
    fn split(&self, offset: u64, len: u64) -> io::Result<Split> {
        if !self.contains(offset, len) {
            return Err(invalid(format!(
                "{len} bytes at offset {offset} are outside a device of {} bytes",
                self.size()
            )));
        }
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
        Ok(Split { head, middle, tail })
    }

    fn modify(&self, offset: u64, len: u64, src: Source<'_>) -> io::Result<()> {
        let split = self.split(offset, len)?;
        // Exclusive for the whole call if any block is partial: simpler
        // than dropping and retaking it around the middle.
        let _guard = if split.partial() {
            Guard::Exclusive(self.rmw.write().unwrap_or_else(|p| p.into_inner()))
        } else {
            Guard::Shared(self.rmw.read().unwrap_or_else(|p| p.into_inner()))
        };
        if let Some((first, blocks)) = split.middle {
            let at = split.head.map_or(0, |(_, _, n)| n);
            let bytes = (blocks * self.bs) as usize;
            let mut lba = first;
            match src {
                Source::Data(d) => {
                    for chunk in d[at..at + bytes].chunks(self.max_io as usize) {
                        self.dev.write_at(lba, chunk)?;
                        lba += chunk.len() as u64 / self.bs;
                    }
                }
                Source::Zeroes => {
                    let zeroes = vec![0u8; bytes.min(self.max_io as usize)];
                    let end = first + blocks;
                    while lba < end {
                        let n = ((end - lba) * self.bs).min(self.max_io);
                        self.dev.write_at(lba, &zeroes[..n as usize])?;
                        lba += n / self.bs;
                    }
                }
            }
        }
        self.patch_edges(&split, src)
    }

    /// Unmaps the middle of `split` under the shared lock.
    fn unmap_middle(&self, split: &Split) -> io::Result<()> {
        if let Some((first, blocks)) = split.middle {
            let _shared = self.rmw.read().unwrap_or_else(|p| p.into_inner());
            self.dev.unmap(first, blocks)?;
        }
        Ok(())
    }

    /// Read-modify-write of the partial head and tail of `split` from
    /// `src`; the caller holds `rmw` exclusive.
    fn patch_edges(&self, split: &Split, src: Source<'_>) -> io::Result<()> {
        let mut block = Vec::new();
        let mut patch = |lba: u64, in_block: usize, n: usize, at: usize| {
            block.resize(self.bs as usize, 0);
            self.dev.read_at(lba, &mut block)?;
            src.fill(&mut block[in_block..in_block + n], at);
            self.dev.write_at(lba, &block)
        };
        if let Some((lba, in_block, n)) = split.head {
            patch(lba, in_block, n, 0)?;
        }
        if let Some((lba, n)) = split.tail {
            let head = split.head.map_or(0, |(_, _, n)| n);
            let middle = split.middle.map_or(0, |(_, b)| (b * self.bs) as usize);
            patch(lba, 0, n, head + middle)?;
        }
        Ok(())
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Holds `rmw` shared or exclusive until dropped.
enum Guard<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamDevice;

    fn view(bs: u32, blocks: u64, max_io: usize) -> ByteView {
        ByteView::new(Arc::new(RamDevice::new(bs, blocks)), max_io).unwrap()
    }

    /// Every byte's value is a function of its offset, so a misplaced byte
    /// shows.
    fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| ((offset + i) * 7 % 251) as u8 + 1)
            .collect()
    }

    fn all(v: &ByteView) -> Vec<u8> {
        let mut buf = vec![0u8; v.size() as usize];
        v.read(0, &mut buf).unwrap();
        buf
    }

    #[test]
    fn split_cases() {
        let v = view(512, 16, 4096);
        let s = |o, n| v.split(o, n).unwrap();
        let split = |head, middle, tail| Split { head, middle, tail };
        assert_eq!(s(0, 1024), split(None, Some((0, 2)), None));
        assert_eq!(s(10, 5), split(Some((0, 10, 5)), None, None));
        assert_eq!(s(0, 5), split(None, None, Some((0, 5))));
        assert_eq!(
            s(500, 1100),
            split(Some((0, 500, 12)), Some((1, 2)), Some((3, 64)))
        );
        assert_eq!(s(500, 12), split(Some((0, 500, 12)), None, None));
        assert_eq!(s(500, 13), split(Some((0, 500, 12)), None, Some((1, 1))));
        assert_eq!(s(512, 0), split(None, None, None));
        assert_eq!(s(8191, 1), split(Some((15, 511, 1)), None, None));
    }

    #[test]
    fn ranges_outside_the_device_are_refused() {
        let v = view(512, 4, 4096);
        let bad = |r: io::Result<()>| r.unwrap_err().kind() == io::ErrorKind::InvalidInput;
        assert!(bad(v.read(2040, &mut [0u8; 9])));
        assert!(bad(v.write(2048, &[1])));
        assert!(bad(v.zero(u64::MAX, 2)));
        assert!(bad(v.punch(0, 2049)));
        assert!(bad(v.unmap_blocks(1, u64::MAX)));
        assert!(v.contains(2040, 8) && !v.contains(2040, 9) && !v.contains(u64::MAX, 2));
        v.write(2040, &[7; 8]).unwrap();
        v.read(2048, &mut []).unwrap();
        assert!(ByteView::new(Arc::new(RamDevice::new(0, 4)), 4096).is_err());
    }

    #[test]
    fn unaligned_io_reads_back_and_spares_neighbours() {
        // A max_io of one block and of three (1636 rounds down) run the
        // chunk loops; 1 MiB does not.
        for (bs, max_io) in [(512, 512), (512, 1636), (4096, 1 << 20)] {
            let v = view(bs, 32 * 512 / bs as u64, max_io);
            let mut shadow = vec![0u8; v.size() as usize];
            for (off, len) in [
                (1u64, 3usize),
                (511, 2),
                (700, 9000),
                (12288, 4096),
                (15000, 1384),
            ] {
                let data = pattern(off, len);
                v.write(off, &data).unwrap();
                shadow[off as usize..off as usize + len].copy_from_slice(&data);
            }
            assert_eq!(all(&v), shadow, "bs {bs} max_io {max_io}");
            let mut some = vec![0u8; 5];
            v.read(4094, &mut some).unwrap();
            assert_eq!(some, shadow[4094..4099]);
            v.zero(100, 9000).unwrap();
            shadow[100..9100].fill(0);
            v.zero(12000, 5).unwrap();
            shadow[12000..12005].fill(0);
            assert_eq!(all(&v), shadow, "bs {bs} max_io {max_io} after zero");
        }
    }

    #[test]
    fn unmap_blocks_touches_only_whole_blocks_and_punch_zeroes_edges() {
        let v = view(512, 8, 4096);
        v.write(0, &[0xaa; 4096]).unwrap();
        v.unmap_blocks(100, 1000).unwrap(); // only block 1 (512..1024) is whole
        let got = all(&v);
        assert!(got[..512].iter().all(|&b| b == 0xaa));
        assert!(got[512..1024].iter().all(|&b| b == 0));
        assert!(got[1024..].iter().all(|&b| b == 0xaa));
        v.punch(2000, 1500).unwrap();
        let got = all(&v);
        assert!(got[1024..2000].iter().all(|&b| b == 0xaa));
        assert!(got[2000..3500].iter().all(|&b| b == 0));
        assert!(got[3500..].iter().all(|&b| b == 0xaa));
    }

    #[test]
    fn punch_without_unmap_fails_before_touching_the_edges() {
        let v = ByteView::new(Arc::new(RamDevice::new(512, 8).without_unmap()), 4096).unwrap();
        v.write(0, &[0xaa; 4096]).unwrap();
        let e = v.punch(100, 1000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(all(&v).iter().all(|&b| b == 0xaa));
        // No whole block inside: nothing to unmap, the edge is zeroed.
        v.punch(100, 10).unwrap();
        assert!(all(&v)[100..110].iter().all(|&b| b == 0));
    }

    /// Threads write their own byte of the same three blocks with unaligned
    /// writes; without the exclusive read-modify-write some bytes would
    /// come back zero.
    #[test]
    fn concurrent_unaligned_writes_are_not_lost() {
        let dev = RamDevice::new(512, 4).yielding_reads();
        let v = Arc::new(ByteView::new(Arc::new(dev), 4096).unwrap());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let v = v.clone();
                std::thread::spawn(move || {
                    for i in 0..128u64 {
                        v.write(256 + i * 8 + t, &[(t + 1) as u8]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut got = vec![0u8; 1024];
        v.read(256, &mut got).unwrap();
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, (i % 8) as u8 + 1, "byte {} lost", 256 + i);
        }
    }
}
