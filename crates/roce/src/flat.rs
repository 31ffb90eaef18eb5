//! A single registered region as a [`Memory`]: what tools, benches, fuzz
//! targets and tests use when they run the engine without the verbs
//! layer's key tables.

use crate::{Memory, MemoryError, Pinned, RemoteAccess};
use rdma_types::{Lkey, Rkey};
use std::sync::{Arc, Mutex};

/// One buffer registered under one key for local and remote access.
/// Clones share the buffer.
#[derive(Debug, Clone)]
pub struct FlatMemory {
    key: u32,
    buf: Arc<Mutex<Vec<u8>>>,
    /// Where the buffer's bytes are and how many: fixed, as the `Vec` is
    /// never resized (only slices of it are handed out), so a lend needs
    /// no lock.
    base: usize,
    len: usize,
}

impl FlatMemory {
    /// A zeroed region of `len` bytes at virtual address 0 under `key`.
    pub fn new(key: u32, len: usize) -> FlatMemory {
        let buf = vec![0u8; len];
        FlatMemory {
            key,
            base: buf.as_ptr() as usize,
            len,
            buf: Arc::new(Mutex::new(buf)),
        }
    }

    /// The key the region answers to (as L_Key and R_Key).
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Region length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic elsewhere while holding the lock leaves bytes, not
        // invariants: keep going with the data as it is.
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the whole buffer (to fill it or check it).
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.lock())
    }

    /// The bytes `[start, end)` that `len` bytes at `addr` under `key`
    /// are, checked against the key and the buffer's length.
    fn span(&self, key: u32, addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemoryError> {
        if key != self.key {
            return Err(MemoryError::BadKey);
        }
        let start = usize::try_from(addr).map_err(|_| MemoryError::OutOfRange)?;
        let end = start.checked_add(len).ok_or(MemoryError::OutOfRange)?;
        if end > self.len {
            return Err(MemoryError::OutOfRange);
        }
        Ok(start..end)
    }

    fn range<R>(
        &self,
        key: u32,
        addr: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, MemoryError> {
        let span = self.span(key, addr, len)?;
        Ok(f(&mut self.lock()[span]))
    }
}

impl FlatMemory {
    /// Lends the checked range: the packet holds the buffer (a clone of
    /// the `Arc`), whose bytes never move. No lock: the range is checked
    /// against the length the buffer was made with.
    fn lend(&self, key: u32, addr: u64, len: usize) -> Result<Option<Pinned>, MemoryError> {
        let start = self.span(key, addr, len)?.start;
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.buf.clone();
        let ptr = (self.base + start) as *const u8;
        // SAFETY: `len` bytes from `start` lie inside the buffer, whose
        // bytes start at `base` and stay there (the `Vec` is never
        // resized) while `keep` keeps it allocated. Writes to it while a
        // lent packet is in flight (`with`, or a receive into the same
        // bytes) are a consumer changing a buffer under an outstanding
        // send.
        Ok(Some(unsafe { Pinned::new(keep, ptr, len) }))
    }
}

impl Memory for FlatMemory {
    fn pin_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        len: usize,
    ) -> Result<Option<Pinned>, MemoryError> {
        self.lend(lkey.0, addr, len)
    }
    fn pin_remote(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: usize,
    ) -> Result<Option<Pinned>, MemoryError> {
        self.lend(rkey.0, addr, len)
    }
    fn read_local(&mut self, lkey: Lkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.range(lkey.0, addr, out.len(), |m| out.copy_from_slice(m))
    }
    fn write_local(&mut self, lkey: Lkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.range(lkey.0, addr, data.len(), |m| m.copy_from_slice(data))
    }
    fn remote_check(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: u64,
        _: RemoteAccess,
    ) -> Result<(), MemoryError> {
        let len = usize::try_from(len).map_err(|_| MemoryError::OutOfRange)?;
        self.range(rkey.0, addr, len, |_| ())
    }
    fn remote_write(&mut self, rkey: Rkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.range(rkey.0, addr, data.len(), |m| m.copy_from_slice(data))
    }
    fn remote_read(&mut self, rkey: Rkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.range(rkey.0, addr, out.len(), |m| out.copy_from_slice(m))
    }
    fn remote_atomic(
        &mut self,
        rkey: Rkey,
        addr: u64,
        compare: Option<u64>,
        operand: u64,
    ) -> Result<u64, MemoryError> {
        if !addr.is_multiple_of(8) {
            return Err(MemoryError::Misaligned);
        }
        self.range(rkey.0, addr, 8, |m| {
            crate::mem::apply_atomic(m, compare, operand)
        })
    }
    fn invalidate(&mut self, _: Rkey) -> Result<(), MemoryError> {
        Err(MemoryError::NoPermission)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_and_alignment_are_checked() {
        let mut m = FlatMemory::new(5, 64);
        let mut out = [0u8; 8];
        assert_eq!(m.read_local(Lkey(6), 0, &mut out), Err(MemoryError::BadKey));
        assert_eq!(
            m.read_local(Lkey(5), 60, &mut out),
            Err(MemoryError::OutOfRange)
        );
        assert_eq!(
            m.read_local(Lkey(5), u64::MAX, &mut out),
            Err(MemoryError::OutOfRange)
        );
        assert_eq!(
            m.remote_atomic(Rkey(5), 4, None, 1),
            Err(MemoryError::Misaligned)
        );
        m.write_local(Lkey(5), 8, &7u64.to_ne_bytes()).unwrap();
        assert_eq!(m.remote_atomic(Rkey(5), 8, Some(7), 9), Ok(7));
        assert_eq!(m.remote_atomic(Rkey(5), 8, None, 1), Ok(9));
        m.read_local(Lkey(5), 8, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 10);
        // Lending checks the same way and outlives the memory's handles.
        assert_eq!(m.pin_local(Lkey(6), 0, 8).err(), Some(MemoryError::BadKey));
        assert_eq!(
            m.pin_remote(Rkey(5), 60, 8).err(),
            Some(MemoryError::OutOfRange)
        );
        assert_eq!(
            m.pin_remote(Rkey(5), u64::MAX, 8).err(),
            Some(MemoryError::OutOfRange)
        );
        assert!(m.pin_remote(Rkey(5), 56, 8).is_ok(), "the last 8 bytes");
        let lent = m.pin_local(Lkey(5), 8, 8).unwrap().unwrap();
        drop(m);
        assert_eq!(lent.as_slice(), &10u64.to_ne_bytes());
    }
}
