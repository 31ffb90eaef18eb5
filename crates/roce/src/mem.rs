//! The engine's only door to memory. The driver implements [`Memory`] over
//! its key tables for the QP's protection domain; the engine walks SGEs and
//! asks for single checked ranges.

use crate::wqe::{MwBindOp, RecvWqe, Sge};
use rdma_types::{AccessFlags, Lkey, Rkey};

/// Why a memory access was refused. No memory was touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryError {
    /// Unknown or invalidated key, or a key of another protection domain.
    BadKey,
    /// The range is outside the region or window.
    OutOfRange,
    /// The region does not grant the access.
    NoPermission,
    /// Atomic target not 8-byte aligned.
    Misaligned,
}

/// Remote access kinds checked by [`Memory::remote_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccess {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// Atomic.
    Atomic,
}

impl RemoteAccess {
    /// The access flag the region must grant.
    pub fn flag(self) -> AccessFlags {
        match self {
            RemoteAccess::Read => AccessFlags::REMOTE_READ,
            RemoteAccess::Write => AccessFlags::REMOTE_WRITE,
            RemoteAccess::Atomic => AccessFlags::REMOTE_ATOMIC,
        }
    }
}

/// Checked memory access for one QP's protection domain.
pub trait Memory {
    /// Copies local memory `[addr, addr+out.len())` under `lkey` into `out`.
    fn read_local(&mut self, lkey: Lkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError>;
    /// Copies `data` to local memory at `addr` under `lkey` (needs local write).
    fn write_local(&mut self, lkey: Lkey, addr: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// Checks a whole remote request once, at its first packet.
    fn remote_check(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemoryError>;
    /// Remote write of `data` at `addr` (checked again: keys may have been
    /// invalidated since the first packet).
    fn remote_write(&mut self, rkey: Rkey, addr: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// Remote read into `out`.
    fn remote_read(&mut self, rkey: Rkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError>;
    /// Atomic on the 8 bytes at `addr`: if `compare` is `Some(c)`, swap in
    /// `operand` when the value equals `c`; otherwise add `operand`. Returns
    /// the original value. Must be atomic with respect to other atomics.
    fn remote_atomic(
        &mut self,
        rkey: Rkey,
        addr: u64,
        compare: Option<u64>,
        operand: u64,
    ) -> Result<u64, MemoryError>;
    /// Invalidates `rkey` (SEND with invalidate, and local invalidate).
    fn invalidate(&mut self, rkey: Rkey) -> Result<(), MemoryError>;
    /// Binds a memory window for this QP (a bind work request reached by
    /// the send queue). Memory without windows refuses.
    fn bind_mw(&mut self, bind: &MwBindOp) -> Result<(), MemoryError> {
        let _ = bind;
        Err(MemoryError::NoPermission)
    }
    /// Like [`Memory::read_local`] (same checks, same errors) but lends the
    /// bytes instead of copying them: `Ok(None)` when this memory cannot
    /// lend (the engine then copies with `read_local`).
    fn pin_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        len: usize,
    ) -> Result<Option<crate::Pinned>, MemoryError> {
        let _ = (lkey, addr, len);
        Ok(None)
    }
    /// Like [`Memory::remote_read`] (same checks, same errors) but lends
    /// the bytes; `Ok(None)` when this memory cannot lend.
    fn pin_remote(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: usize,
    ) -> Result<Option<crate::Pinned>, MemoryError> {
        let _ = (rkey, addr, len);
        Ok(None)
    }
    /// Takes a receive WQE from the QP's shared receive queue, if it has one.
    fn srq_pop(&mut self) -> Option<RecvWqe> {
        None
    }
}

/// Applies an atomic to the 8 bytes of `cell` (host byte order, as the
/// responder's memory holds them): compare-and-swap when `compare` is
/// `Some`, fetch-and-add otherwise. Returns the original value. Memory
/// implementations call it under whatever makes them atomic.
///
/// # Panics
/// If `cell` is not 8 bytes long (callers pass exactly the checked range).
pub fn apply_atomic(cell: &mut [u8], compare: Option<u64>, operand: u64) -> u64 {
    let orig = u64::from_ne_bytes(cell[..8].try_into().expect("an 8-byte cell"));
    let new = match compare {
        Some(c) if c == orig => operand,
        Some(_) => orig,
        None => orig.wrapping_add(operand),
    };
    cell.copy_from_slice(&new.to_ne_bytes());
    orig
}

/// Walks `sges` from message byte `offset` over `len` bytes, calling
/// `f(sge, addr, range)` for each piece (`range` indexes the caller's
/// buffer). Stops at the first error; SGEs shorter than `offset + len` are
/// [`MemoryError::OutOfRange`].
fn walk_sges(
    sges: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, std::ops::Range<usize>) -> Result<(), MemoryError>,
) -> Result<(), MemoryError> {
    let mut skip = offset;
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sl = u64::from(sge.len);
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let take = ((sl - skip) as usize).min(len - done);
        f(sge, sge.addr + skip, done..done + take)?;
        done += take;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemoryError::OutOfRange)
    }
}

/// Payloads shorter than this are copied even from memory that can lend:
/// lending costs a key lookup and a reference count, like the copy of a
/// few hundred bytes.
pub(crate) const PIN_MIN: usize = 512;

/// Lends message bytes `[offset, offset+len)` from local SGEs when they lie
/// in one SGE and the memory can lend; `Ok(None)` means: copy them.
pub(crate) fn pin_gather(
    mem: &mut (impl Memory + ?Sized),
    sges: &[Sge],
    offset: u64,
    len: usize,
) -> Result<Option<crate::Pinned>, MemoryError> {
    if len < PIN_MIN {
        return Ok(None);
    }
    let (sge, skip) = sge_at(sges, offset).ok_or(MemoryError::OutOfRange)?;
    if u64::from(sge.len) - skip < len as u64 {
        return Ok(None); // spans SGEs
    }
    mem.pin_local(sge.lkey, sge.addr + skip, len)
}

/// The bytes from message byte `offset` to the end of the SGE that holds
/// it (`None`: past the last SGE).
pub(crate) fn sge_room(sges: &[Sge], offset: u64) -> Option<u64> {
    sge_at(sges, offset).map(|(sge, skip)| u64::from(sge.len) - skip)
}

/// The SGE that holds message byte `offset`, and where in it.
fn sge_at(sges: &[Sge], offset: u64) -> Option<(&Sge, u64)> {
    let mut skip = offset;
    for sge in sges {
        let sl = u64::from(sge.len);
        if skip < sl {
            return Some((sge, skip));
        }
        skip -= sl;
    }
    None
}

/// Gathers message bytes `[offset, offset+out.len())` from local SGEs.
pub(crate) fn gather(
    mem: &mut (impl Memory + ?Sized),
    sges: &[Sge],
    offset: u64,
    out: &mut [u8],
) -> Result<(), MemoryError> {
    walk_sges(sges, offset, out.len(), |sge, addr, r| {
        mem.read_local(sge.lkey, addr, &mut out[r])
    })
}

/// Scatters `data` into local SGEs at message byte `offset`.
pub(crate) fn scatter(
    mem: &mut (impl Memory + ?Sized),
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), MemoryError> {
    walk_sges(sges, offset, data.len(), |sge, addr, r| {
        mem.write_local(sge.lkey, addr, &data[r])
    })
}
