//! A memory store the NIC reads READ data straight out of.
//!
//! [`MemStore`] is a RAM disk whose bytes live in a [`MemBuf`]: a target
//! port registers that memory once (local access only) and sends a READ's
//! data-in by RDMA WRITE from the store itself, with no copy into a chunk
//! first, as LIO's rd_mcp hands its pages to the HCA. Data-out still lands
//! in chunks and is copied in.
//!
//! Writes take the store's lock alone and copies out share it, so a copy
//! never sees half of a write; an RDMA WRITE reading the store while a
//! WRITE to the same blocks runs may send some of each (SBC gives
//! overlapping commands no order, and the bytes are read by whole words,
//! see [`MemBuf`]). A resize builds a new buffer: commands already given
//! the old one finish from it.

use scsi::Backend;
use std::io;
use std::sync::{PoisonError, RwLock};
use verbs::MemBuf;

/// A RAM store in registrable memory (see the module docs).
pub struct MemStore {
    buf: RwLock<MemBuf>,
}

impl MemStore {
    /// A zeroed store of `size` bytes, in huge pages, all committed now
    /// (as LIO's rd_mcp allocates its pages when the device is enabled):
    /// a store the system cannot back fails here, not with an I/O (or the
    /// OOM killer) later.
    ///
    /// # Errors
    /// The system's (`ENOMEM`), or `OutOfMemory` for a size beyond the
    /// address space.
    pub fn new(size: u64) -> io::Result<MemStore> {
        let len = usize::try_from(size).map_err(|_| io::ErrorKind::OutOfMemory)?;
        Ok(MemStore {
            buf: RwLock::new(MemBuf::for_store(len)?),
        })
    }

    /// The memory as it is now (a resize replaces it).
    pub fn memory_now(&self) -> MemBuf {
        self.buf
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn check(buf: &MemBuf, offset: u64, len: usize) -> io::Result<usize> {
        let off = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        match off.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(off),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

impl Backend for MemStore {
    fn never_blocks(&self) -> bool {
        true
    }
    fn size(&self) -> u64 {
        self.buf
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64
    }
    fn memory(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let b = self.buf.read().unwrap_or_else(PoisonError::into_inner);
        b.read_at(Self::check(&b, offset, out.len())?, out);
        Ok(())
    }
    fn read_vec(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let b = self.buf.read().unwrap_or_else(PoisonError::into_inner);
        Ok(b.to_vec(Self::check(&b, offset, len)?, len))
    }
    /// One lock for the whole scatter list: no half of a concurrent write.
    fn read_vectored(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        let b = self.buf.read().unwrap_or_else(PoisonError::into_inner);
        let total = bufs.iter().map(|p| p.len()).sum();
        let mut at = Self::check(&b, offset, total)?;
        for p in bufs.iter_mut() {
            b.read_at(at, p);
            at += p.len();
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        self.write_vectored(offset, &[data], false)
    }
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]], _fua: bool) -> io::Result<()> {
        // Alone: a copy out never sees half of it. The buffer is shared
        // memory, so writing needs no `&mut`.
        let b = self.buf.write().unwrap_or_else(PoisonError::into_inner);
        let total = bufs.iter().map(|p| p.len()).sum();
        let mut at = Self::check(&b, offset, total)?;
        for p in bufs {
            b.write_at(at, p);
            at += p.len();
        }
        Ok(())
    }
    fn resize(&self, new_size: u64) -> io::Result<()> {
        let mut b = self.buf.write().unwrap_or_else(PoisonError::into_inner);
        let new =
            MemBuf::for_store(usize::try_from(new_size).map_err(|_| io::ErrorKind::OutOfMemory)?)?;
        new.copy_from(0, &b, 0, b.len().min(new.len()));
        *b = new;
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_keeps_it_across_a_resize() {
        let s = MemStore::new(8192).unwrap();
        s.write_vectored(100, &[b"abc", b"defg"], false).unwrap();
        assert_eq!(s.read_vec(100, 7).unwrap(), b"abcdefg");
        let before = s.memory_now();
        s.resize(16384).unwrap();
        assert_eq!(s.size(), 16384);
        assert_eq!(s.read_vec(100, 7).unwrap(), b"abcdefg");
        // The old memory stays whole for whoever holds it.
        assert_eq!(before.to_vec(100, 7), b"abcdefg");
        s.resize(4096).unwrap();
        assert_eq!(s.read_vec(100, 7).unwrap(), b"abcdefg");
        assert!(s.read_vec(4090, 7).is_err());
        assert!(s.write(4095, b"xy", false).is_err());
    }

    #[test]
    fn offers_itself_as_memory() {
        let s = MemStore::new(4096).unwrap();
        let any = s.memory().expect("a memory store");
        assert!(any.downcast_ref::<MemStore>().is_some());
    }
}
