//! Device handlers' storage: a byte-addressed backing store.
//!
//! `Ram` keeps blocks in memory, `NullIo` reads zeroes and discards writes,
//! `FileIo` uses pread/pwrite on a file (fdatasync for SYNCHRONIZE CACHE and
//! FUA, or after every write when write-through; buffered or O_DIRECT;
//! UNMAP punches holes), `BlockIo` uses O_DIRECT on a block device (its
//! logical block size from BLKSSZGET; UNMAP deallocates with zeroes).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::RwLock;

/// Storage behind a logical unit. Offsets and lengths are in bytes and
/// already checked against [`Backend::size`] by the core.
pub trait Backend: Send + Sync {
    fn size(&self) -> u64;
    /// Holds the store for one command: a store that can close
    /// ([`crate::Detachable`]) is not closed while the hold lives, and
    /// refuses the hold while closed. The default never closes.
    ///
    /// # Errors
    /// The store is closed.
    fn hold(&self) -> Result<crate::detach::Hold<'_>, crate::detach::Closed> {
        Ok(crate::detach::Hold::free())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// `fua`: data must be on stable storage before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    fn flush(&self) -> io::Result<()>;
    /// Reads `len` bytes at `offset` into a new vector. The default zeroes
    /// the vector and then [`Backend::read`]s into it; a memory store
    /// copies straight in (zeroing a 4 KiB buffer was a tenth of a read's
    /// instructions).
    fn read_vec(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read(offset, &mut buf)?;
        Ok(buf)
    }
    /// Reads consecutive bytes at `offset` into the buffers in order (a
    /// scatter list, as [`crate::Buffers`] hands them over). The default
    /// reads each piece in turn.
    fn read_vectored(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        let mut at = offset;
        for b in bufs.iter_mut() {
            self.read(at, b)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Writes the buffers in order as consecutive bytes at `offset` (a
    /// gather list; [`crate::Buffers::data_out`]). The default writes each
    /// piece in turn.
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]], fua: bool) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write(at, b, fua)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Whether reads and writes only touch memory and never wait (RAM,
    /// null): a transport may then run commands on its own thread instead
    /// of handing them to a worker.
    fn never_blocks(&self) -> bool {
        false
    }
    /// The smallest unit the store can read or write (a block device's
    /// logical block size under O_DIRECT); [`crate::Device::new`] refuses a
    /// logical block size that is not a multiple of it.
    fn min_block_size(&self) -> u32 {
        1
    }
    /// Deallocates `len` bytes at `offset` so that they read back as
    /// zeroes (UNMAP, WRITE SAME with UNMAP). `Unsupported`: the core
    /// writes zeroes instead.
    fn unmap(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// The store itself, for a transport that knows its type and can move
    /// data-in straight out of its memory ([`crate::Buffers::by_reference`]:
    /// an RDMA transport whose store lives in registered memory). `None`
    /// (the default): data-in is always copied out by the core.
    fn memory(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        None
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
    fn read_vec(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let src = usize::try_from(offset)
            .ok()
            .and_then(|o| d.get(o..o.checked_add(len)?))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        Ok(src.to_vec())
    }
    /// One lock for the whole scatter list, so a read never sees half of
    /// a concurrent write (as [`Backend::read_vec`]).
    fn read_vectored(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let mut at = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        for b in bufs.iter_mut() {
            let src = at
                .checked_add(b.len())
                .and_then(|end| d.get(at..end))
                .ok_or(io::ErrorKind::UnexpectedEof)?;
            b.copy_from_slice(src);
            at += b.len();
        }
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
    /// One lock for the whole gather list, as [`Ram::read_vectored`].
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]], _fua: bool) -> io::Result<()> {
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        let mut at = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let total = bufs.iter().map(|b| b.len()).sum::<usize>();
        if at.checked_add(total).is_none_or(|end| end > d.len()) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        for b in bufs {
            d[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
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

/// A regular file accessed with pread/pwrite, buffered ([`FileIo::new`])
/// or with O_DIRECT ([`FileIo::direct`]).
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
    /// O_DIRECT: the alignment every offset and length keeps, and which
    /// the bounce buffers are aligned to. `None`: buffered.
    direct: Option<usize>,
    /// The PI side file and its length.
    pi: Option<(File, u64)>,
}

/// Sets or clears O_DIRECT on an open file.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let want = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, want) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Deallocates a byte range of a file or block device, keeping its size:
/// the range reads back as zeroes afterwards (for a block device the
/// kernel refuses with EOPNOTSUPP unless it can guarantee that).
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::ErrorKind::InvalidInput.into());
    };
    // SAFETY: fallocate on a descriptor we own; no pointers involved.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => io::ErrorKind::Unsupported.into(),
            _ => e,
        });
    }
    Ok(())
}

/// Reads through an aligned bounce buffer (O_DIRECT).
fn read_direct(file: &File, align: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    check_aligned(align, offset, buf.len())?;
    let mut b = Aligned::new(buf.len(), align)?;
    file.read_exact_at(b.as_mut(buf.len()), offset)?;
    buf.copy_from_slice(b.as_mut(buf.len()));
    Ok(())
}

/// Writes through an aligned bounce buffer (O_DIRECT).
fn write_direct(file: &File, align: usize, offset: u64, data: &[u8]) -> io::Result<()> {
    check_aligned(align, offset, data.len())?;
    let mut b = Aligned::new(data.len(), align)?;
    b.as_mut(data.len()).copy_from_slice(data);
    file.write_all_at(b.as_mut(data.len()), offset)
}

fn check_aligned(align: usize, offset: u64, len: usize) -> io::Result<()> {
    if offset % align as u64 != 0 || len % align != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unaligned O_DIRECT I/O",
        ));
    }
    Ok(())
}

impl FileIo {
    /// Opens `file` as the store, buffered; its current length is the
    /// capacity. `write_through`: every write is made durable before it
    /// completes (as FUA).
    pub fn new(file: File, write_through: bool) -> io::Result<FileIo> {
        let size = file.metadata()?.len();
        Ok(FileIo {
            file,
            size,
            write_through,
            direct: None,
            pi: None,
        })
    }

    /// Like [`FileIo::new`] but with O_DIRECT (set on `file` here): reads
    /// and writes bypass the page cache through bounce buffers aligned to
    /// `block_size`, which must be the LU's logical block size and a
    /// multiple of the file system's direct I/O alignment (512 suits most
    /// file systems on 512-byte-sector disks, 4096 all). The file's length
    /// must be a multiple of `block_size`. A file system without O_DIRECT
    /// (older tmpfs) refuses here with the kernel's error.
    pub fn direct(file: File, write_through: bool, block_size: u32) -> io::Result<FileIo> {
        let align = block_size as usize;
        if !align.is_power_of_two() || align < 512 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("O_DIRECT block size {block_size} (a power of two, at least 512)"),
            ));
        }
        set_direct(&file, true)?;
        let mut f = FileIo::new(file, write_through)?;
        f.direct = Some(align);
        Ok(f)
    }

    /// Whether I/O goes around the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
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
    fn min_block_size(&self) -> u32 {
        self.direct.map_or(1, |a| a as u32)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.direct {
            Some(align) => read_direct(&self.file, align, offset, buf),
            None => self.file.read_exact_at(buf, offset),
        }
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        match self.direct {
            Some(align) => write_direct(&self.file, align, offset, data)?,
            None => self.file.write_all_at(data, offset)?,
        }
        // O_DIRECT data may still sit in the disk's cache: FUA needs the
        // flush either way.
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
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        punch_hole(&self.file, offset, len)?;
        if self.write_through {
            self.file.sync_data()?;
        }
        Ok(())
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

/// A block device (or a file) opened with O_DIRECT: I/O bypasses the page
/// cache through a bounce buffer aligned to the logical block size, which
/// for a block device is the device's own (BLKSSZGET).
pub struct BlockIo {
    file: File,
    size: u64,
    align: usize,
    is_device: bool,
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

/// A block device's logical block size (BLKSSZGET).
fn device_block_size(file: &File) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut bs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid.
    if unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut bs as *mut libc::c_int,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(bs)
        .ok()
        .filter(|b| b.is_power_of_two() && *b >= 512)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("BLKSSZGET {bs}")))
}

impl BlockIo {
    /// Opens `path` with O_DIRECT. For a block device the size and the
    /// logical block size come from the device (BLKSSZGET); for a regular
    /// file the length is the size and `block_size` (512 or 4096) the
    /// logical block size. Every offset and length the core passes is a
    /// multiple of [`BlockIo::block_size`], so the LU's `block_size` must
    /// be a multiple of it ([`crate::Device::new`] checks).
    pub fn open(path: &std::path::Path, read_only: bool, block_size: usize) -> io::Result<BlockIo> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let is_device = file.metadata()?.file_type().is_block_device();
        let align = if is_device {
            device_block_size(&file)? as usize
        } else if block_size.is_power_of_two() && block_size >= 512 {
            block_size
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {block_size} (a power of two, at least 512)"),
            ));
        };
        // Block devices report length 0 in metadata; seeking to the end works for both.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(BlockIo {
            file,
            size,
            align,
            is_device,
        })
    }

    /// The logical block size: the device's, or the one given for a file.
    pub fn block_size(&self) -> u32 {
        self.align as u32
    }

    /// Whether the store is a block device (not a regular file).
    pub fn is_block_device(&self) -> bool {
        self.is_device
    }
}

impl Backend for BlockIo {
    fn size(&self) -> u64 {
        self.size
    }
    fn min_block_size(&self) -> u32 {
        self.align as u32
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        read_direct(&self.file, self.align, offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        write_direct(&self.file, self.align, offset, data)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        // A block device deallocates with a guarantee of zeroes (the
        // kernel's write-zeroes-with-unmap or discard-zeroes) or refuses;
        // a bare BLKDISCARD promises no zeroes, which LBPRZ needs.
        check_aligned(self.align, offset, len as usize)?;
        punch_hole(&self.file, offset, len)
    }
}
