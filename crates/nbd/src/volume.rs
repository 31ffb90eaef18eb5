//! Byte-addressed access to a block-addressed [`BlockDevice`], with NBD's
//! policies on top of [`ByteView`].
//!
//! NBD's default minimum block size is 1 (proto.md "Size constraints"), so
//! requests may start and end anywhere; [`ByteView`] turns them into
//! read-modify-write of the edge blocks, safe against concurrent writes.
//! Here: block sizes must be powers of two (the advertised sizes are),
//! TRIM is advisory and WRITE_ZEROES may unmap. Callers check ranges
//! first ([`Volume::contains`]) and answer `NBD_EINVAL`/`NBD_ENOSPC`.
//! Each call is one request in [`Volume::stats`].

use blockload::bytes::ByteView;
use blockload::counts::{IoCounts, IoStats};
use blockload::BlockDevice;
use std::io;
use std::sync::Arc;

/// Largest single device call and zero buffer.
const CHUNK: usize = 1 << 20;

/// One device seen as bytes.
pub struct Volume {
    view: ByteView,
    counts: IoCounts,
}

impl Volume {
    /// Wraps a device.
    ///
    /// # Errors
    /// `InvalidInput` if the block size is 0 or not a power of two, or the
    /// device holds 2^64 bytes or more.
    pub fn new(dev: Arc<dyn BlockDevice>) -> io::Result<Volume> {
        let bs = dev.block_size();
        if !bs.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {bs} is not a power of two"),
            ));
        }
        Ok(Volume {
            view: ByteView::new(dev, CHUNK)?,
            counts: IoCounts::default(),
        })
    }

    /// What was read and written, and what waits inside a device call now.
    pub fn stats(&self) -> IoStats {
        self.counts.stats()
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.view.size()
    }

    /// Device block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.view.block_size()
    }

    /// True if `[offset, offset + len)` lies inside the volume.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        self.view.contains(offset, len)
    }

    /// Flushes the device.
    ///
    /// # Errors
    /// The device's error.
    pub fn flush(&self) -> io::Result<()> {
        self.counts.other(|| self.view.flush())
    }

    /// Reads `buf.len()` bytes at `offset` (inside the volume).
    ///
    /// # Errors
    /// The device's error.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.counts
            .read(buf.len() as u64, || self.view.read(offset, buf))
    }

    /// Writes `data` at `offset` (inside the volume).
    ///
    /// # Errors
    /// The device's error.
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.counts
            .write(data.len() as u64, || self.view.write(offset, data))
    }

    /// Zeroes `[offset, offset + len)` (inside the volume). With
    /// `may_unmap`, whole blocks are unmapped where the device can (the
    /// `BlockDevice` contract says unmapped blocks read as zeroes).
    ///
    /// # Errors
    /// The device's error.
    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.counts.other(|| {
            if may_unmap {
                match self.view.punch(offset, len) {
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
                    done => return done,
                }
            }
            self.view.zero(offset, len)
        })
    }

    /// Deallocates the whole blocks inside `[offset, offset + len)`.
    /// Partial blocks at the edges are left alone and a device without
    /// unmap ignores the request: TRIM is advisory (proto.md
    /// `NBD_CMD_TRIM`).
    ///
    /// # Errors
    /// The device's error other than `Unsupported`.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.counts.other(|| self.view.unmap_blocks(offset, len)) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
            done => done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockload::RamDevice;

    /// WRITE_ZEROES unmaps whole blocks where it may and can, and zeroes
    /// them otherwise; the edges are zeroed either way.
    #[test]
    fn write_zeroes_with_and_without_unmap() {
        for dev in [
            RamDevice::new(512, 8),
            RamDevice::new(512, 8).without_unmap(),
        ] {
            let v = Volume::new(Arc::new(dev)).unwrap();
            v.write(0, &[0xaa; 4096]).unwrap();
            v.write_zeroes(100, 1000, true).unwrap();
            v.write_zeroes(3000, 5, false).unwrap();
            let mut want = vec![0xaa; 4096];
            want[100..1100].fill(0);
            want[3000..3005].fill(0);
            let mut got = vec![0u8; 4096];
            v.read(0, &mut got).unwrap();
            assert_eq!(got, want);
        }
    }

    /// TRIM spares partial blocks and is a no-op without unmap.
    #[test]
    fn trim_touches_only_whole_blocks_and_is_advisory() {
        for (dev, unmaps) in [
            (RamDevice::new(512, 8), true),
            (RamDevice::new(512, 8).without_unmap(), false),
        ] {
            let v = Volume::new(Arc::new(dev)).unwrap();
            v.write(0, &[0xaa; 4096]).unwrap();
            v.trim(100, 1000).unwrap(); // only block 1 (512..1024) is whole
            let mut got = vec![0u8; 4096];
            v.read(0, &mut got).unwrap();
            let gone = |b: &u8| if unmaps { *b == 0 } else { *b == 0xaa };
            assert!(got[..512].iter().all(|&b| b == 0xaa));
            assert!(got[512..1024].iter().all(gone));
            assert!(got[1024..].iter().all(|&b| b == 0xaa));
        }
    }

    #[test]
    fn block_size_must_be_a_power_of_two() {
        assert!(Volume::new(Arc::new(RamDevice::new(520, 1))).is_err());
        assert!(Volume::new(Arc::new(RamDevice::new(0, 1))).is_err());
        let v = Volume::new(Arc::new(RamDevice::new(4096, 1))).unwrap();
        assert!(v.contains(4000, 96) && !v.contains(4000, 97) && !v.contains(u64::MAX, 2));
    }
}
