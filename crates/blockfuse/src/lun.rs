//! A LUN as a file: end-of-file policies and errnos over
//! [`blockload::bytes::ByteView`], the part of the file system that does
//! not know about FUSE.

use blockload::bytes::ByteView;
use blockload::BlockDevice;
use std::io;
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
}

impl Lun {
    pub(crate) fn new(name: String, dev: Arc<dyn BlockDevice>, max_io: usize) -> io::Result<Lun> {
        let view = ByteView::new(dev, max_io)
            .map_err(|e| io::Error::new(e.kind(), format!("device `{name}`: {e}")))?;
        Ok(Lun { name, view })
    }

    pub(crate) fn size(&self) -> u64 {
        self.view.size()
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.view.block_size()
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.view.flush().map_err(LunError::Device)
    }

    /// Reads up to `len` bytes at `offset`; short at the end of the
    /// device, empty at or past it.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        let Some(len) = self.clamp(offset, u64::from(len)) else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; len as usize];
        self.view.read(offset, &mut buf).map_err(LunError::Device)?;
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
        self.view
            .write(offset, &data[..len])
            .map_err(LunError::Device)?;
        Ok(len)
    }

    /// Writes zeroes over `[offset, offset + len)`, clamped to the device.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        self.view.zero(offset, len).map_err(LunError::Device)
    }

    /// Deallocates `[offset, offset + len)`, clamped to the device: whole
    /// blocks are unmapped, partial blocks at the edges are zeroed.
    pub(crate) fn punch(&self, offset: u64, len: u64) -> Result<()> {
        let Some(len) = self.clamp(offset, len) else {
            return Ok(());
        };
        self.view.punch(offset, len).map_err(LunError::device)
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
