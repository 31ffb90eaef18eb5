//! L_Key/R_Key table for memory regions and windows (IBA 10.6).
//!
//! A key is `index << 8 | tag`: the index selects the entry, the 8-bit tag
//! changes on every re-registration/bind so old keys stop working (for type
//! 2 windows the consumer picks the tag, IBA 10.6.7.2.1). Every access is
//! checked for key, PD, bounds and rights; a failed check names the
//! completion status the provider must report and touches no memory.

use crate::mem::MemBuf;
use crate::types::MwType;
use crate::VerbsError;
use rdma_types::{AccessFlags, Lkey, Rkey, WcStatus};

/// Protection domain identity as the provider numbers it.
pub type PdId = u32;

#[derive(Debug, Clone)]
struct MrEntry {
    pd: PdId,
    buf: MemBuf,
    addr: u64,
    len: u64,
    access: AccessFlags,
    key: u32,
    bound_mws: u32,
}

#[derive(Debug, Clone)]
struct MwBinding {
    mr: u32,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// Type 2: QP number the window is associated with (IBA 10.6.7.2.2).
    qpn: Option<u32>,
}

#[derive(Debug, Clone)]
struct MwEntry {
    pd: PdId,
    kind: MwType,
    key: u32,
    bound: Option<MwBinding>,
}

#[derive(Debug, Clone)]
enum Entry {
    Mr(MrEntry),
    Mw(MwEntry),
}

/// A checked memory target: buffer and byte offset into it.
#[derive(Debug, Clone)]
pub struct Target {
    /// Backing buffer.
    pub buf: MemBuf,
    /// Offset of the first byte.
    pub off: usize,
}

/// The key table of one CA.
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    tag: u8,
}

fn key_of(index: u32, tag: u8) -> u32 {
    (index << 8) | tag as u32
}

impl KeyTable {
    /// Empty table.
    pub fn new() -> KeyTable {
        KeyTable::default()
    }

    fn next_tag(&mut self) -> u8 {
        self.tag = self.tag.wrapping_add(1);
        self.tag
    }

    fn insert(&mut self, e: Entry) -> u32 {
        if let Some(i) = self.free.pop() {
            self.entries[i as usize] = Some(e);
            i
        } else {
            self.entries.push(Some(e));
            (self.entries.len() - 1) as u32
        }
    }

    fn mr_mut(&mut self, index: u32) -> Result<&mut MrEntry, VerbsError> {
        match self.entries.get_mut(index as usize) {
            Some(Some(Entry::Mr(m))) => Ok(m),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn mw_mut(&mut self, index: u32) -> Result<&mut MwEntry, VerbsError> {
        match self.entries.get_mut(index as usize) {
            Some(Some(Entry::Mw(m))) => Ok(m),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn validate(buf: &MemBuf, addr: u64, len: u64, access: AccessFlags) -> Result<(), VerbsError> {
        if !access.is_valid_for_mr() {
            return Err(VerbsError::InvalidArgument(format!(
                "access {access:?}: remote write/atomic need LOCAL_WRITE"
            )));
        }
        if access.contains(AccessFlags::ZERO_BASED) {
            return Err(VerbsError::NotSupported("zero-based MR"));
        }
        if len == 0 || !buf.contains(addr, len) {
            return Err(VerbsError::InvalidArgument(format!(
                "range {addr:#x}+{len} not inside {buf:?}"
            )));
        }
        Ok(())
    }

    /// Registers an MR; returns its index and key (L_Key = R_Key).
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(u32, u32), VerbsError> {
        Self::validate(buf, addr, len, access)?;
        let tag = self.next_tag();
        let index = self.insert(Entry::Mr(MrEntry {
            pd,
            buf: buf.clone(),
            addr,
            len,
            access,
            key: 0,
            bound_mws: 0,
        }));
        let key = key_of(index, tag);
        self.mr_mut(index)?.key = key;
        Ok((index, key))
    }

    /// Re-registers an MR with a new range/rights and a new key. Refused
    /// with `Busy` while windows are bound to it.
    pub fn rereg_mr(
        &mut self,
        index: u32,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<u32, VerbsError> {
        Self::validate(buf, addr, len, access)?;
        let tag = self.next_tag();
        let mr = self.mr_mut(index)?;
        if mr.bound_mws > 0 {
            return Err(VerbsError::Busy("memory windows are bound to this MR"));
        }
        *mr = MrEntry {
            pd: mr.pd,
            buf: buf.clone(),
            addr,
            len,
            access,
            key: key_of(index, tag),
            bound_mws: 0,
        };
        Ok(mr.key)
    }

    /// Deregisters; refused with `Busy` while windows are bound.
    pub fn dereg_mr(&mut self, index: u32) -> Result<(), VerbsError> {
        if self.mr_mut(index)?.bound_mws > 0 {
            return Err(VerbsError::Busy("memory windows are bound to this MR"));
        }
        self.entries[index as usize] = None;
        self.free.push(index);
        Ok(())
    }

    /// Allocates an unbound window; returns index and initial R_Key.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> (u32, u32) {
        let tag = self.next_tag();
        let index = self.insert(Entry::Mw(MwEntry {
            pd,
            kind,
            key: 0,
            bound: None,
        }));
        let key = key_of(index, tag);
        if let Some(Some(Entry::Mw(w))) = self.entries.get_mut(index as usize) {
            w.key = key;
        }
        (index, key)
    }

    fn unbind(&mut self, mw: u32) {
        let prev = match self.entries.get_mut(mw as usize) {
            Some(Some(Entry::Mw(w))) => w.bound.take(),
            _ => None,
        };
        if let Some(b) = prev {
            if let Ok(mr) = self.mr_mut(b.mr) {
                mr.bound_mws -= 1;
            }
        }
    }

    /// Deallocates a window (unbinding it).
    pub fn dealloc_mw(&mut self, index: u32) -> Result<(), VerbsError> {
        self.mw_mut(index)?;
        self.unbind(index);
        self.entries[index as usize] = None;
        self.free.push(index);
        Ok(())
    }

    /// Binds window `mw` to `[addr, addr+len)` of MR `mr` (IBA 10.6.7.2).
    /// Type 1: a fresh tag is chosen; type 2: `tag` is the consumer's
    /// and `qpn` associates the window with that QP. A zero `len` unbinds
    /// (type 1 only). Returns the new R_Key; errors are `MwBindErr`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &mut self,
        pd: PdId,
        mw: u32,
        mr: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
        tag: u8,
        qpn: u32,
    ) -> Result<u32, WcStatus> {
        let kind = match self.entries.get(mw as usize) {
            Some(Some(Entry::Mw(w))) if w.pd == pd => w.kind,
            _ => return Err(WcStatus::MwBindErr),
        };
        if kind == MwType::Type2 && self.mw_mut(mw).map(|w| w.bound.is_some()).unwrap_or(true) {
            // A bound type 2 window must be invalidated first (IBA 10.6.7.2.2).
            return Err(WcStatus::MwBindErr);
        }
        if len == 0 && kind == MwType::Type1 {
            self.unbind(mw);
            let t = self.next_tag();
            let w = self.mw_mut(mw).map_err(|_| WcStatus::MwBindErr)?;
            w.key = key_of(mw, t);
            return Ok(w.key);
        }
        let ok = match self.entries.get(mr as usize) {
            Some(Some(Entry::Mr(m))) => {
                m.pd == pd
                    && m.access.contains(AccessFlags::MW_BIND)
                    && addr >= m.addr
                    && addr.checked_add(len).is_some_and(|e| e <= m.addr + m.len)
                    && (!access.contains(AccessFlags::REMOTE_WRITE)
                        && !access.contains(AccessFlags::REMOTE_ATOMIC)
                        || m.access.contains(AccessFlags::LOCAL_WRITE))
            }
            _ => false,
        };
        if !ok || len == 0 {
            return Err(WcStatus::MwBindErr);
        }
        self.unbind(mw);
        let t = if kind == MwType::Type1 {
            self.next_tag()
        } else {
            tag
        };
        self.mr_mut(mr).map_err(|_| WcStatus::MwBindErr)?.bound_mws += 1;
        let w = self.mw_mut(mw).map_err(|_| WcStatus::MwBindErr)?;
        w.key = key_of(mw, t);
        w.bound = Some(MwBinding {
            mr,
            addr,
            len,
            access,
            qpn: (kind == MwType::Type2).then_some(qpn),
        });
        Ok(w.key)
    }

    /// Invalidates the type 2 window with R_Key `rkey` in `pd` (local
    /// invalidate or SEND with invalidate, IBA 10.6.7.2.4).
    pub fn invalidate(&mut self, pd: PdId, rkey: Rkey) -> Result<(), WcStatus> {
        let index = rkey.0 >> 8;
        match self.entries.get(index as usize) {
            Some(Some(Entry::Mw(w)))
                if w.pd == pd
                    && w.key == rkey.0
                    && w.kind == MwType::Type2
                    && w.bound.is_some() =>
            {
                self.unbind(index);
                Ok(())
            }
            _ => Err(WcStatus::LocProtErr),
        }
    }

    /// Checks a local SGE: L_Key of an MR in `pd`, range inside it, and
    /// `needs` (LOCAL_WRITE for scatter) granted. Error: `LocProtErr`.
    pub fn local(
        &self,
        pd: PdId,
        lkey: Lkey,
        addr: u64,
        len: u64,
        needs: AccessFlags,
    ) -> Result<Target, WcStatus> {
        match self.entries.get((lkey.0 >> 8) as usize) {
            Some(Some(Entry::Mr(m)))
                if m.key == lkey.0
                    && m.pd == pd
                    && m.access.contains(needs)
                    && addr >= m.addr
                    && addr.checked_add(len).is_some_and(|e| e <= m.addr + m.len) =>
            {
                Ok(Target {
                    buf: m.buf.clone(),
                    off: (addr - m.buf.addr()) as usize,
                })
            }
            _ => Err(WcStatus::LocProtErr),
        }
    }

    /// Checks a remote access (IBA 9.7.5.1.3, C9-88): R_Key of an MR or a
    /// bound window in `pd`, range inside, rights granted, and for a type 2
    /// window the QP association. Error: `RemAccessErr`.
    #[inline]
    pub fn remote(
        &self,
        pd: PdId,
        rkey: Rkey,
        addr: u64,
        len: u64,
        needs: AccessFlags,
        qpn: u32,
    ) -> Result<Target, WcStatus> {
        let inside = |start: u64, l: u64| {
            addr >= start && addr.checked_add(len).is_some_and(|e| e <= start + l)
        };
        match self.entries.get((rkey.0 >> 8) as usize) {
            Some(Some(Entry::Mr(m)))
                if m.key == rkey.0
                    && m.pd == pd
                    && m.access.contains(needs)
                    && inside(m.addr, m.len) =>
            {
                Ok(Target {
                    buf: m.buf.clone(),
                    off: (addr - m.buf.addr()) as usize,
                })
            }
            Some(Some(Entry::Mw(w))) if w.key == rkey.0 && w.pd == pd => {
                let b = w.bound.as_ref().ok_or(WcStatus::RemAccessErr)?;
                if !b.access.contains(needs)
                    || !inside(b.addr, b.len)
                    || b.qpn.is_some_and(|q| q != qpn)
                {
                    return Err(WcStatus::RemAccessErr);
                }
                match self.entries.get(b.mr as usize) {
                    Some(Some(Entry::Mr(m))) => Ok(Target {
                        buf: m.buf.clone(),
                        off: (addr - m.buf.addr()) as usize,
                    }),
                    _ => Err(WcStatus::RemAccessErr),
                }
            }
            _ => Err(WcStatus::RemAccessErr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> AccessFlags {
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND
    }

    #[test]
    fn mr_checks_key_pd_bounds_rights() {
        let mut t = KeyTable::new();
        let b = MemBuf::new(4096);
        let (_, k) = t
            .reg_mr(
                1,
                &b,
                b.addr() + 100,
                1000,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let a = b.addr() + 100;
        assert_eq!(
            t.local(1, Lkey(k), a, 1000, AccessFlags::LOCAL_WRITE)
                .unwrap()
                .off,
            100
        );
        assert_eq!(
            t.local(2, Lkey(k), a, 10, AccessFlags::NONE).unwrap_err(),
            WcStatus::LocProtErr
        );
        assert_eq!(
            t.local(1, Lkey(k ^ 1), a, 10, AccessFlags::NONE)
                .unwrap_err(),
            WcStatus::LocProtErr
        );
        assert_eq!(
            t.local(1, Lkey(k), a, 1001, AccessFlags::NONE).unwrap_err(),
            WcStatus::LocProtErr
        );
        assert_eq!(
            t.local(1, Lkey(k), a - 1, 1, AccessFlags::NONE)
                .unwrap_err(),
            WcStatus::LocProtErr
        );
        assert_eq!(
            t.local(1, Lkey(k), u64::MAX, 2, AccessFlags::NONE)
                .unwrap_err(),
            WcStatus::LocProtErr
        );
        assert!(t
            .remote(1, Rkey(k), a, 8, AccessFlags::REMOTE_READ, 0)
            .is_ok());
        assert_eq!(
            t.remote(1, Rkey(k), a, 8, AccessFlags::REMOTE_WRITE, 0)
                .unwrap_err(),
            WcStatus::RemAccessErr
        );
        assert_eq!(
            t.remote(1, Rkey(k), a + 999, 2, AccessFlags::REMOTE_READ, 0)
                .unwrap_err(),
            WcStatus::RemAccessErr
        );
    }

    #[test]
    fn registration_validation_and_rereg_changes_key() {
        let mut t = KeyTable::new();
        let b = MemBuf::new(4096);
        assert!(matches!(
            t.reg_mr(1, &b, b.addr(), 10, AccessFlags::REMOTE_WRITE),
            Err(VerbsError::InvalidArgument(_))
        ));
        assert!(matches!(
            t.reg_mr(1, &b, b.addr(), 4097, AccessFlags::NONE),
            Err(VerbsError::InvalidArgument(_))
        ));
        let (i, k) = t.reg_mr(1, &b, b.addr(), 10, AccessFlags::NONE).unwrap();
        let k2 = t
            .rereg_mr(i, &b, b.addr(), 4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        assert_ne!(k, k2);
        assert!(t.local(1, Lkey(k), b.addr(), 1, AccessFlags::NONE).is_err());
        assert!(t
            .local(1, Lkey(k2), b.addr(), 4096, AccessFlags::LOCAL_WRITE)
            .is_ok());
        t.dereg_mr(i).unwrap();
        assert!(t
            .local(1, Lkey(k2), b.addr(), 1, AccessFlags::NONE)
            .is_err());
        assert_eq!(t.dereg_mr(i), Err(VerbsError::InvalidHandle));
    }

    #[test]
    fn windows_type1_and_type2() {
        let mut t = KeyTable::new();
        let b = MemBuf::new(8192);
        let (mr, mrkey) = t.reg_mr(1, &b, b.addr(), 8192, all()).unwrap();
        let (w1, _) = t.alloc_mw(1, MwType::Type1);
        let k1 = t
            .bind_mw(
                1,
                w1,
                mr,
                b.addr() + 4096,
                100,
                AccessFlags::REMOTE_READ,
                0,
                9,
            )
            .unwrap();
        assert!(t
            .remote(
                1,
                Rkey(k1),
                b.addr() + 4096,
                100,
                AccessFlags::REMOTE_READ,
                3
            )
            .is_ok());
        assert!(t
            .remote(1, Rkey(k1), b.addr() + 4095, 1, AccessFlags::REMOTE_READ, 3)
            .is_err());
        assert!(t
            .remote(
                1,
                Rkey(k1),
                b.addr() + 4096,
                1,
                AccessFlags::REMOTE_WRITE,
                3
            )
            .is_err());
        assert_eq!(
            t.dereg_mr(mr),
            Err(VerbsError::Busy("memory windows are bound to this MR"))
        );
        // Rebinding gives a new key; the old one dies.
        let k1b = t
            .bind_mw(1, w1, mr, b.addr(), 8, AccessFlags::REMOTE_READ, 0, 9)
            .unwrap();
        assert_ne!(k1, k1b);
        assert!(t
            .remote(1, Rkey(k1), b.addr() + 4096, 1, AccessFlags::REMOTE_READ, 3)
            .is_err());
        // Type 2: consumer tag, QP association, invalidate.
        let (w2, _) = t.alloc_mw(1, MwType::Type2);
        let k2 = t
            .bind_mw(1, w2, mr, b.addr(), 64, AccessFlags::REMOTE_WRITE, 0x5a, 7)
            .unwrap();
        assert_eq!(k2 & 0xff, 0x5a);
        assert!(t
            .remote(1, Rkey(k2), b.addr(), 64, AccessFlags::REMOTE_WRITE, 7)
            .is_ok());
        assert_eq!(
            t.remote(1, Rkey(k2), b.addr(), 64, AccessFlags::REMOTE_WRITE, 8)
                .unwrap_err(),
            WcStatus::RemAccessErr
        );
        assert_eq!(
            t.bind_mw(1, w2, mr, b.addr(), 64, AccessFlags::REMOTE_WRITE, 0x5b, 7),
            Err(WcStatus::MwBindErr)
        );
        t.invalidate(1, Rkey(k2)).unwrap();
        assert!(t
            .remote(1, Rkey(k2), b.addr(), 1, AccessFlags::REMOTE_WRITE, 7)
            .is_err());
        assert_eq!(t.invalidate(1, Rkey(k2)), Err(WcStatus::LocProtErr));
        // MR without MW_BIND, other PD, out of range: bind errors.
        let (mr2, _) = t.reg_mr(1, &b, b.addr(), 10, AccessFlags::NONE).unwrap();
        assert_eq!(
            t.bind_mw(1, w1, mr2, b.addr(), 4, AccessFlags::NONE, 0, 0),
            Err(WcStatus::MwBindErr)
        );
        assert_eq!(
            t.bind_mw(2, w1, mr, b.addr(), 4, AccessFlags::NONE, 0, 0),
            Err(WcStatus::MwBindErr)
        );
        assert_eq!(
            t.bind_mw(1, w1, mr, b.addr(), 8193, AccessFlags::NONE, 0, 0),
            Err(WcStatus::MwBindErr)
        );
        t.dealloc_mw(w1).unwrap();
        t.dereg_mr(mr).unwrap();
        let _ = mrkey;
    }
}
