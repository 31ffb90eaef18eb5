//! Device handlers' storage: a byte-addressed backing store.
//!
//! `Ram` keeps blocks in memory, `NullIo` reads zeroes and discards writes,
//! `FileIo` uses pread/pwrite on a file (fdatasync for SYNCHRONIZE CACHE and
//! FUA, or after every write when write-through).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::RwLock;

/// Storage behind a logical unit. Offsets and lengths are in bytes and
/// already checked against [`Backend::size`] by the core.
pub trait Backend: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// `fua`: data must be on stable storage before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    fn flush(&self) -> io::Result<()>;
    /// Whether reads and writes only touch memory and never wait (RAM,
    /// null): a transport may then run commands on its own thread instead
    /// of handing them to a worker.
    fn never_blocks(&self) -> bool {
        false
    }
    /// Changes the capacity (SCST resize); not every store can.
    fn resize(&self, _new_size: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Bytes of protection information space (SBC-3 4.22): 8 per logical
    /// block, block `n`'s at offset `8 n`; 0 for a store that keeps none.
    fn pi_size(&self) -> u64 {
        0
    }
    /// Reads protection information (offsets in the PI space).
    fn read_pi(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Writes protection information; `fua` as for [`Backend::write`].
    fn write_pi(&self, _offset: u64, _data: &[u8], _fua: bool) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A formatted PI space: all ones, so every block's checks are escaped
/// until it is written.
fn formatted_pi(len: u64) -> Vec<u8> {
    vec![0xff; len as usize]
}

fn slice_at(v: &[u8], offset: u64, len: usize) -> io::Result<&[u8]> {
    let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    v.get(start..start.saturating_add(len))
        .ok_or(io::ErrorKind::UnexpectedEof.into())
}

fn slice_at_mut(v: &mut [u8], offset: u64, len: usize) -> io::Result<&mut [u8]> {
    let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    v.get_mut(start..start.saturating_add(len))
        .ok_or(io::ErrorKind::UnexpectedEof.into())
}

/// In-memory store, optionally with protection information space.
pub struct Ram {
    data: RwLock<Vec<u8>>,
    /// PI space and the logical block size it is kept for.
    pi: Option<(RwLock<Vec<u8>>, u64)>,
}

impl Ram {
    pub fn new(size: u64) -> Ram {
        Ram {
            data: RwLock::new(vec![0; size as usize]),
            pi: None,
        }
    }

    /// A store formatted with protection information: 8 bytes per
    /// `block_size` bytes of data, all ones until written.
    pub fn with_pi(size: u64, block_size: u32) -> Ram {
        let bs = block_size.max(1) as u64;
        Ram {
            data: RwLock::new(vec![0; size as usize]),
            pi: Some((RwLock::new(formatted_pi(size / bs * 8)), bs)),
        }
    }
}

impl Backend for Ram {
    fn never_blocks(&self) -> bool {
        true
    }
    fn size(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let src = d
            .get(offset as usize..offset as usize + buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.data
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .resize(new_size as usize, 0);
        if let Some((pi, bs)) = &self.pi {
            pi.write()
                .unwrap_or_else(|e| e.into_inner())
                .resize((new_size / bs * 8) as usize, 0xff);
        }
        Ok(())
    }
    fn pi_size(&self) -> u64 {
        self.pi.as_ref().map_or(0, |(pi, _)| {
            pi.read().unwrap_or_else(|e| e.into_inner()).len() as u64
        })
    }
    fn read_pi(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (pi, _) = self.pi.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        let pi = pi.read().unwrap_or_else(|e| e.into_inner());
        buf.copy_from_slice(slice_at(&pi, offset, buf.len())?);
        Ok(())
    }
    fn write_pi(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let (pi, _) = self.pi.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        let mut pi = pi.write().unwrap_or_else(|e| e.into_inner());
        slice_at_mut(&mut pi, offset, data.len())?.copy_from_slice(data);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        let dst = d
            .get_mut(offset as usize..offset as usize + data.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        dst.copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// No storage: reads return zeroes, writes are discarded, no I/O is done.
pub struct NullIo {
    size: u64,
}

impl NullIo {
    pub fn new(size: u64) -> NullIo {
        NullIo { size }
    }
}

impl Backend for NullIo {
    fn never_blocks(&self) -> bool {
        true
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A regular file accessed with pread/pwrite.
///
/// With protection information ([`FileIo::with_pi`]) the tuples live in a
/// side file, not interleaved with the data, so the data file stays a
/// plain image other tools can read: 8 bytes per logical block, block `n`'s
/// at offset `8 n`, in wire order (guard, application tag, reference tag,
/// big-endian). The data is written before its PI; a crash between the two
/// leaves a block whose guard no longer matches, which the next checked
/// read reports (LOGICAL BLOCK GUARD CHECK FAILED) rather than returning
/// silently mixed data.
pub struct FileIo {
    file: File,
    size: u64,
    write_through: bool,
    /// The PI side file and its length.
    pi: Option<(File, u64)>,
}

impl FileIo {
    /// Opens `file` as the store; its current length is the capacity.
    pub fn new(file: File, write_through: bool) -> io::Result<FileIo> {
        let size = file.metadata()?.len();
        Ok(FileIo {
            file,
            size,
            write_through,
            pi: None,
        })
    }

    /// `file` as the store with `pi_file` as its PI side file for logical
    /// blocks of `block_size` bytes. An empty side file is formatted (all
    /// ones); one of another length than 8 bytes per block is refused.
    pub fn with_pi(
        file: File,
        pi_file: File,
        block_size: u32,
        write_through: bool,
    ) -> io::Result<FileIo> {
        let mut f = FileIo::new(file, write_through)?;
        let want = f.size / block_size.max(1) as u64 * 8;
        let have = pi_file.metadata()?.len();
        if have == 0 {
            // Format in 1 MiB steps.
            let ones = formatted_pi((1 << 20).min(want));
            let mut done = 0;
            while done < want {
                let n = (want - done).min(ones.len() as u64) as usize;
                pi_file.write_all_at(&ones[..n], done)?;
                done += n as u64;
            }
            pi_file.sync_data()?;
        } else if have != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("PI side file holds {have} bytes, {want} expected (8 per block)"),
            ));
        }
        f.pi = Some((pi_file, want));
        Ok(f)
    }
}

impl Backend for FileIo {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.file.write_all_at(data, offset)?;
        if fua || self.write_through {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if let Some((pi, _)) = &self.pi {
            pi.sync_data()?;
        }
        self.file.sync_data()
    }
    fn pi_size(&self) -> u64 {
        self.pi.as_ref().map_or(0, |(_, len)| *len)
    }
    fn read_pi(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (pi, _) = self.pi.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        pi.read_exact_at(buf, offset)
    }
    fn write_pi(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let (pi, _) = self.pi.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        pi.write_all_at(data, offset)?;
        if fua || self.write_through {
            pi.sync_data()?;
        }
        Ok(())
    }
}

/// A block device or file opened with O_DIRECT: I/O bypasses the page
/// cache through a bounce buffer aligned to the alignment unit.
pub struct BlockIo {
    file: File,
    size: u64,
    align: usize,
}

/// A heap buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize, align: usize) -> io::Result<Aligned> {
        let layout = std::alloc::Layout::from_size_align(len.max(align), align)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        Ok(Aligned { ptr, layout })
    }

    fn as_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() >= len bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len.min(self.layout.size())) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl BlockIo {
    /// Opens `path` with O_DIRECT; `align` (512 or 4096) must divide every
    /// offset and length the core passes, i.e. the device's block size.
    pub fn open(path: &std::path::Path, read_only: bool, align: usize) -> io::Result<BlockIo> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        // Block devices report length 0 in metadata; seeking to the end works for both.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(BlockIo { file, size, align })
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset % self.align as u64 != 0 || len % self.align != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned O_DIRECT I/O",
            ));
        }
        Ok(())
    }
}

impl Backend for BlockIo {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut b = Aligned::new(buf.len(), self.align)?;
        self.file.read_exact_at(b.as_mut(buf.len()), offset)?;
        buf.copy_from_slice(b.as_mut(buf.len()));
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.check(offset, data.len())?;
        let mut b = Aligned::new(data.len(), self.align)?;
        b.as_mut(data.len()).copy_from_slice(data);
        self.file.write_all_at(b.as_mut(data.len()), offset)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}
