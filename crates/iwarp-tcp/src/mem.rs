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
use std::sync::{Arc, Mutex};

use iwarp::{Access, Memory, MemoryError, STag};
use rdma_types::{AccessFlags, Rkey};
use verbs::kit::keys::{KeyTable, Target};
use verbs::kit::rq::RecvQueue;
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

    /// The list's bytes copied now into a buffer of its own (inline
    /// sends: the consumer may reuse its buffers once the post returns).
    pub(crate) fn snapshot(&self) -> Sgl {
        let len: usize = self.pieces.iter().map(|p| p.len).sum();
        let buf = verbs::MemBuf::new_private(len.max(1));
        let mut at = 0;
        for p in &self.pieces {
            let mut tmp = vec![0u8; p.len];
            p.target.buf.read_at(p.target.off, &mut tmp);
            buf.write_at(at, &tmp);
            at += p.len;
        }
        Sgl {
            pieces: vec![Piece {
                target: Target { buf, off: 0 },
                len,
            }],
            writable: false,
        }
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
    /// The QP's shared receive queue.
    pub(crate) srq: Option<&'a SrqRef>,
    /// What was taken from the SRQ meanwhile, for the driver to keep.
    pub(crate) taken: Taken,
}

/// A QP's shared receive queue as its engine reaches it.
#[derive(Clone)]
pub(crate) struct SrqRef {
    pub(crate) rq: Arc<Mutex<RecvQueue>>,
    pub(crate) pd: u32,
    pub(crate) ctx: u64,
    pub(crate) handler: Arc<dyn verbs::EventHandler>,
}

/// Receives a QP's engine took from its SRQ while it ran: their lists
/// (under STags with the top bit set, which the QP's own never use),
/// engine id to the consumer's WR id, and whether the SRQ's limit fired.
#[derive(Default)]
pub(crate) struct Taken {
    pub(crate) sgls: Vec<(u32, Sgl)>,
    pub(crate) wrs: Vec<(u64, u64)>,
    pub(crate) next_id: u32,
    pub(crate) limit_fired: bool,
}

/// The bit that marks a local STag (and engine id) of an SRQ receive.
pub(crate) const SRQ_ID: u32 = 0x8000_0000;

impl QpMem<'_> {
    fn sgl(&self, stag: STag) -> Option<&Sgl> {
        self.sgls.get(&stag.0).or_else(|| {
            self.taken
                .sgls
                .iter()
                .find(|(s, _)| *s == stag.0)
                .map(|(_, l)| l)
        })
    }
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
        let sgl = self.sgl(stag).ok_or(MemoryError::InvalidStag)?;
        sgl.walk(to, out.len(), |t, off, r| {
            t.buf.read_at(t.off + off, &mut out[r])
        })
    }

    fn write_local(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError> {
        let sgl = self.sgl(stag).ok_or(MemoryError::InvalidStag)?;
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

    fn shared_recv(&mut self) -> Option<iwarp::RecvWqe> {
        let srq = self.srq?;
        let (wr, fire) = srq.rq.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        self.taken.limit_fired |= fire;
        let id = SRQ_ID | (self.taken.next_id & !SRQ_ID);
        self.taken.next_id = self.taken.next_id.wrapping_add(1);
        let len: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        // A list that fails its check gets no entry: the first byte for
        // it is refused, the receive completes with a protection error.
        if let Some(l) = Sgl::check(self.keys, srq.pd, &wr.sges, true) {
            self.taken.sgls.push((id, l));
        }
        self.taken.wrs.push((u64::from(id), wr.wr_id));
        Some(iwarp::RecvWqe {
            wr_id: u64::from(id),
            buf: iwarp::Sge {
                stag: STag(id),
                to: 0,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            },
        })
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
