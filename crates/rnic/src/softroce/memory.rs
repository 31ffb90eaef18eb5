//! A QP's door to memory (`roce::Memory`): its PD's keys, its remote
//! rights and its SRQ; payloads lent to packets from registered regions.

use super::*;
use verbs::kit::keys::Target;

/// A QP's door to memory: its PD's keys, its remote rights, its SRQ.
pub(super) struct PdMem {
    pub(super) pd: u32,
    pub(super) qpn: u32,
    pub(super) keys: Arc<Mutex<KeyTable>>,
    pub(super) access: Arc<AtomicU32>,
    pub(super) srq: Option<SrqRef>,
}

/// An SRQ as its QPs see it, with whom to tell when it runs low.
#[derive(Clone)]
pub(super) struct SrqRef {
    pub(super) rq: Arc<Mutex<RecvQueue>>,
    pub(super) handler: Arc<dyn EventHandler>,
    pub(super) ctx: Context,
}

fn mem_err(s: WcStatus) -> MemoryError {
    match s {
        WcStatus::RemAccessErr | WcStatus::LocProtErr => MemoryError::BadKey,
        _ => MemoryError::OutOfRange,
    }
}

impl PdMem {
    fn keys(&self) -> MutexGuard<'_, KeyTable> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` bytes at `addr` under L_Key `lkey` of this PD, with `access`.
    fn local(&self, lkey: Lkey, addr: u64, len: usize, access: AccessFlags) -> MemResult<Target> {
        let keys = self.keys();
        keys.local(self.pd, lkey, addr, len as u64, access)
            .map_err(mem_err)
    }

    /// `len` bytes at `addr` under R_Key `rkey` of this PD, for this QP.
    fn remote(&self, rkey: Rkey, addr: u64, len: usize, access: AccessFlags) -> MemResult<Target> {
        let keys = self.keys();
        keys.remote(self.pd, rkey, addr, len as u64, access, self.qpn)
            .map_err(mem_err)
    }
}

type MemResult<T> = std::result::Result<T, MemoryError>;

/// Lends `len` bytes of a checked target to a packet: the packet holds the
/// buffer's allocation, so a deregistration (or the consumer dropping its
/// buffer) while the packet waits frees nothing it reads. `None` (copy
/// instead) if the target were ever shorter than the checked range.
fn lend(t: &Target, len: usize) -> Option<roce::Pinned> {
    if t.off.checked_add(len).is_none_or(|e| e > t.buf.len()) {
        return None;
    }
    // SAFETY: `[off, off+len)` is inside the buffer (checked above), whose
    // allocation `keep_alive` keeps valid for as long as the `Pinned`
    // lives; the key table checked the access. `ptr_at` also asks that
    // nothing else in the process touch the bytes while the packet reads
    // them (its ICRC, a retransmit's copy; the kernel's send is not such
    // a touch): that is the verbs rule for a posted send's buffer (not
    // written until the WR completes), which a consumer is trusted to
    // keep. A consumer writing lent bytes meanwhile (or a READ responder's
    // owner writing the region being read) breaks that promise through
    // safe code; only the copy path (payloads under 512 B) is immune.
    Some(unsafe { roce::Pinned::new(t.buf.keep_alive(), t.buf.ptr_at(t.off), len) })
}

impl Memory for PdMem {
    fn pin_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        len: usize,
    ) -> std::result::Result<Option<roce::Pinned>, MemoryError> {
        let t = self.local(lkey, addr, len, AccessFlags::NONE)?;
        Ok(lend(&t, len))
    }

    fn pin_remote(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: usize,
    ) -> std::result::Result<Option<roce::Pinned>, MemoryError> {
        let t = self.remote(rkey, addr, len, AccessFlags::REMOTE_READ)?;
        Ok(lend(&t, len))
    }

    fn read_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self.local(lkey, addr, out.len(), AccessFlags::NONE)?;
        t.buf.read_at(t.off, out);
        Ok(())
    }

    fn write_local(
        &mut self,
        lkey: Lkey,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self.local(lkey, addr, data.len(), AccessFlags::LOCAL_WRITE)?;
        t.buf.write_at(t.off, data);
        Ok(())
    }

    fn remote_check(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: u64,
        access: RemoteAccess,
    ) -> std::result::Result<(), MemoryError> {
        let granted = AccessFlags::from_bits(self.access.load(Ordering::Relaxed))
            .unwrap_or(AccessFlags::NONE);
        if !granted.contains(access.flag()) {
            return Err(MemoryError::NoPermission);
        }
        if access == RemoteAccess::Atomic && addr & 7 != 0 {
            return Err(MemoryError::Misaligned);
        }
        self.keys()
            .remote(self.pd, rkey, addr, len, access.flag(), self.qpn)
            .map(|_| ())
            .map_err(mem_err)
    }

    fn remote_write(
        &mut self,
        rkey: Rkey,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self.remote(rkey, addr, data.len(), AccessFlags::REMOTE_WRITE)?;
        t.buf.write_at(t.off, data);
        Ok(())
    }

    fn remote_read(
        &mut self,
        rkey: Rkey,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        let t = self.remote(rkey, addr, out.len(), AccessFlags::REMOTE_READ)?;
        t.buf.read_at(t.off, out);
        Ok(())
    }

    fn remote_atomic(
        &mut self,
        rkey: Rkey,
        addr: u64,
        compare: Option<u64>,
        operand: u64,
    ) -> std::result::Result<u64, MemoryError> {
        let t = self.remote(rkey, addr, 8, AccessFlags::REMOTE_ATOMIC)?;
        Ok(match compare {
            Some(c) => t
                .buf
                .atomic_u64(t.off, |v| if v == c { operand } else { v }),
            None => t.buf.atomic_u64(t.off, |v| v.wrapping_add(operand)),
        })
    }

    fn invalidate(&mut self, rkey: Rkey) -> std::result::Result<(), MemoryError> {
        let pd = self.pd;
        self.keys().invalidate(pd, rkey).map_err(mem_err)
    }

    fn bind_mw(&mut self, b: &roce::MwBindOp) -> std::result::Result<(), MemoryError> {
        // The new R_Key keeps the window's index; the consumer picks only
        // its low 8 bits (IBA 10.6.7.2.1).
        if b.rkey.0 >> 8 != b.mw {
            return Err(MemoryError::BadKey);
        }
        let (pd, qpn) = (self.pd, self.qpn);
        self.keys()
            .bind_mw(pd, b.mw, b.mr, b.addr, b.len, b.access, b.rkey.0 as u8, qpn)
            .map(|_| ())
            .map_err(|_| MemoryError::BadKey)
    }

    fn srq_pop(&mut self) -> Option<roce::RecvWqe> {
        let srq = self.srq.as_ref()?;
        let (wr, limit) = srq.rq.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        if limit {
            // IBA 11.5.2.3: fires once, then the limit disarms. Called on the
            // NIC thread with no lock of the provider held.
            srq.handler.on_async_event(AsyncEvent {
                kind: AsyncEventKind::SrqLimitReached,
                ctx: srq.ctx,
                port: None,
            });
        }
        Some(recv_wqe(&wr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet's payload lent from an MR survives the MR's deregistration
    /// and the consumer dropping its buffer (the packet holds the
    /// allocation); lending checks key, range and rights like a copy.
    #[test]
    fn lent_payload_outlives_deregistration_and_is_checked() {
        let buf = MemBuf::new(8192);
        for i in 0..8192 {
            buf.write_at(i, &[(i % 251) as u8]);
        }
        let keys = Arc::new(Mutex::new(KeyTable::new()));
        let (index, key) = keys
            .lock()
            .unwrap()
            .reg_mr(1, &buf, buf.addr() + 4096, 4096, AccessFlags::REMOTE_READ)
            .unwrap();
        let mut mem = PdMem {
            pd: 1,
            qpn: 0x11,
            keys: keys.clone(),
            access: Arc::new(AtomicU32::new(AccessFlags::ALL.bits())),
            srq: None,
        };
        let addr = buf.addr() + 4096 + 100;
        let want = buf.to_vec(4196, 2000);
        let lent = mem.pin_local(Lkey(key), addr, 2000).unwrap().unwrap();
        let read = mem.pin_remote(Rkey(key), addr, 2000).unwrap().unwrap();
        assert_eq!(lent.as_slice(), &want[..]);
        assert_eq!(read.as_slice(), &want[..]);
        // Outside the region, another PD's view, a wrong key: refused.
        assert!(mem.pin_local(Lkey(key), addr, 4096).is_err());
        assert!(mem.pin_local(Lkey(key), buf.addr(), 16).is_err());
        assert!(mem.pin_remote(Rkey(key ^ 0x100), addr, 16).is_err());
        keys.lock().unwrap().dereg_mr(index).unwrap();
        assert_eq!(
            mem.pin_local(Lkey(key), addr, 16).err(),
            Some(MemoryError::BadKey)
        );
        drop(buf);
        // The packets alone keep the allocation, whose bytes are unchanged.
        assert_eq!(Arc::strong_count(lent.owner()), 2);
        drop(read);
        assert_eq!(Arc::strong_count(lent.owner()), 1);
        assert_eq!(lent.as_slice(), &want[..]);
    }
}
