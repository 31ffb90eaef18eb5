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
}

/// In-memory store.
pub struct Ram {
    data: RwLock<Vec<u8>>,
}

impl Ram {
    pub fn new(size: u64) -> Ram {
        Ram {
            data: RwLock::new(vec![0; size as usize]),
        }
    }
}

impl Backend for Ram {
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
pub struct FileIo {
    file: File,
    size: u64,
    write_through: bool,
}

impl FileIo {
    /// Opens `file` as the store; its current length is the capacity.
    pub fn new(file: File, write_through: bool) -> io::Result<FileIo> {
        let size = file.metadata()?.len();
        Ok(FileIo {
            file,
            size,
            write_through,
        })
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
        self.file.sync_data()
    }
}
