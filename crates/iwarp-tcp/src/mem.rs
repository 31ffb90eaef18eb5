//! The engine's view of memory: a QP's local scatter/gather lists under
//! STags of their own, and the CA's key table for remote access.
//!
//! A posted work request's SGEs are checked against the key table once, at
//! post time, and kept as one [`Sgl`] under a local STag the driver picks
//! (the engine's `Sge` is a single buffer; this is how several SGEs reach
//! it, and how a Read's sink STag on the wire names them). A request whose
//! SGEs fail the check gets no list: the engine's first access to it is
//! refused, and it completes with a local protection error in queue order.

use std::collections::HashMap;

use iwarp::{Access, Memory, MemoryError, STag};
use rdma_types::{AccessFlags, Rkey};
use verbs::kit::keys::{KeyTable, Target};
use verbs::Sge;

/// One checked piece of a scatter/gather list.
pub(crate) struct Piece {
    target: Target,
    len: usize,
}

/// A work request's buffers, in order.
pub(crate) struct Sgl {
    pieces: Vec<Piece>,
    writable: bool,
}

impl Sgl {
    /// Checks `sges` in `pd` (`LOCAL_WRITE` when the list is written);
    /// `None` if any is refused.
    pub(crate) fn check(keys: &KeyTable, pd: u32, sges: &[Sge], writable: bool) -> Option<Sgl> {
        let needs = if writable {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::NONE
        };
        let pieces = sges
            .iter()
            .filter(|s| s.length > 0)
            .map(|s| {
                keys.local(pd, s.lkey, s.addr, u64::from(s.length), needs)
                    .ok()
                    .map(|target| Piece {
                        target,
                        len: s.length as usize,
                    })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Sgl { pieces, writable })
    }

    /// Visits the pieces covering `[to, to + len)` as (target, offset in
    /// the piece, range of the caller's bytes).
    fn walk(
        &self,
        to: u64,
        len: usize,
        mut f: impl FnMut(&Target, usize, std::ops::Range<usize>),
    ) -> Result<(), MemoryError> {
        let total: usize = self.pieces.iter().map(|p| p.len).sum();
        let start = usize::try_from(to).map_err(|_| MemoryError::OutOfBounds)?;
        if start.checked_add(len).is_none_or(|end| end > total) {
            return Err(MemoryError::OutOfBounds);
        }
        let (mut skip, mut done) = (start, 0);
        for p in &self.pieces {
            if done == len {
                break;
            }
            if skip >= p.len {
                skip -= p.len;
                continue;
            }
            let n = (p.len - skip).min(len - done);
            f(&p.target, skip, done..done + n);
            done += n;
            skip = 0;
        }
        Ok(())
    }
}

/// Memory as one QP's engine sees it.
pub(crate) struct QpMem<'a> {
    pub(crate) keys: &'a KeyTable,
    pub(crate) pd: u32,
    pub(crate) qpn: u32,
    /// The QP's remote access rights (modify-QP `access`).
    pub(crate) access: AccessFlags,
    pub(crate) sgls: &'a HashMap<u32, Sgl>,
}

fn needs(access: Access) -> AccessFlags {
    match access {
        Access::RemoteRead => AccessFlags::REMOTE_READ,
        Access::RemoteWrite => AccessFlags::REMOTE_WRITE,
    }
}

impl QpMem<'_> {
    fn remote(&self, stag: STag, to: u64, len: u64, access: Access) -> Result<Target, MemoryError> {
        let want = needs(access);
        let key = Rkey(stag.0);
        if let Ok(t) = self.keys.remote(self.pd, key, to, len, want, self.qpn) {
            // The QP must grant the access too (IBA 10.2.x, RFC 5040 6.x).
            return if self.access.contains(want) {
                Ok(t)
            } else {
                Err(MemoryError::NoAccess)
            };
        }
        // Say which check failed, for the TERMINATE's code.
        let any = AccessFlags::NONE;
        if self
            .keys
            .remote(self.pd, key, to, len, any, self.qpn)
            .is_ok()
        {
            Err(MemoryError::NoAccess)
        } else if self.keys.remote(self.pd, key, to, 0, any, self.qpn).is_ok() {
            Err(MemoryError::OutOfBounds)
        } else {
            Err(MemoryError::InvalidStag)
        }
    }
}

impl Memory for QpMem<'_> {
    fn read_local(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let sgl = self.sgls.get(&stag.0).ok_or(MemoryError::InvalidStag)?;
        sgl.walk(to, out.len(), |t, off, r| {
            t.buf.read_at(t.off + off, &mut out[r])
        })
    }

    fn write_local(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError> {
        let sgl = self.sgls.get(&stag.0).ok_or(MemoryError::InvalidStag)?;
        if !sgl.writable {
            return Err(MemoryError::NoAccess);
        }
        sgl.walk(to, data.len(), |t, off, r| {
            t.buf.write_at(t.off + off, &data[r])
        })
    }

    fn remote_check(
        &mut self,
        stag: STag,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemoryError> {
        self.remote(stag, to, len, access).map(|_| ())
    }

    fn remote_write(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError> {
        let t = self.remote(stag, to, data.len() as u64, Access::RemoteWrite)?;
        t.buf.write_at(t.off, data);
        Ok(())
    }

    fn remote_read(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let t = self.remote(stag, to, out.len() as u64, Access::RemoteRead)?;
        t.buf.read_at(t.off, out);
        Ok(())
    }

    fn invalidate(&mut self, _stag: STag) -> Result<(), MemoryError> {
        // No memory windows or fast-registered regions: nothing the peer
        // may invalidate (RFC 5040 6.10: an STag that cannot be
        // invalidated terminates the stream).
        Err(MemoryError::InvalidStag)
    }
}

/// The memory of a connection no QP owns yet (a responder waiting for the
/// MPA request): nothing.
pub(crate) struct NoMem;

impl Memory for NoMem {
    fn read_local(&mut self, _: STag, _: u64, _: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
    fn write_local(&mut self, _: STag, _: u64, _: &[u8]) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
    fn remote_check(&mut self, _: STag, _: u64, _: u64, _: Access) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
    fn remote_write(&mut self, _: STag, _: u64, _: &[u8]) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
    fn remote_read(&mut self, _: STag, _: u64, _: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
    fn invalidate(&mut self, _: STag) -> Result<(), MemoryError> {
        Err(MemoryError::InvalidStag)
    }
}
