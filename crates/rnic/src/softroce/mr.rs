//! Memory regions and windows in the CA's key table (`verbs::kit::keys`).

use super::*;

/// The key-table index no window or region has: a bind WR naming a
/// handle that is not a type 2 window of this CA fails as a bind error.
pub(super) const NO_INDEX: u32 = u32::MAX;

impl SoftRoce {
    pub(super) fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let (index, key) = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust(p, 1);
        let h = st.alloc(Obj::Mr {
            ca,
            pd: p,
            key: index,
            lkey: key,
            ctx,
        });
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    pub(super) fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let mut st = self.lock();
        let i = st.slot(mr.0)?;
        let (ca, key) = match st.obj(i) {
            Obj::Mr { ca, key, .. } => (*ca, *key),
            _ => return Err(VerbsError::InvalidHandle),
        };
        let rt = st.rt(ca);
        let k = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rereg_mr(key, buf, addr, len, access)?;
        if let Obj::Mr { lkey, .. } = st.obj_mut(i) {
            *lkey = k;
        }
        Ok(MrInfo {
            handle: mr,
            lkey: Lkey(k),
            rkey: Rkey(k),
            addr,
            len,
        })
    }

    pub(super) fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let (handler, ctx) = {
            let mut st = self.lock();
            let i = st.slot(mr.0)?;
            let (ca, pd, key, ctx) = match st.obj(i) {
                Obj::Mr {
                    ca, pd, key, ctx, ..
                } => (*ca, *pd, *key, *ctx),
                _ => return Err(VerbsError::InvalidHandle),
            };
            let rt = st.rt(ca);
            rt.keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dereg_mr(key)?;
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        handler.on_destroyed(ResourceKind::Mr, ctx);
        Ok(())
    }

    pub(super) fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> Result<(MwHandle, Rkey)> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let (index, key) = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc_mw(p as u32, kind);
        st.adjust(p, 1);
        let h = st.alloc(Obj::Mw {
            ca,
            pd: p,
            index,
            kind,
            ctx,
        });
        Ok((MwHandle(h), Rkey(key)))
    }

    /// Type 1 windows only (type 2 are bound by a BindMw work request);
    /// the bind takes effect at once and produces no completion, as the
    /// loopback provider's does.
    pub(super) fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        let st = self.lock();
        let qi = st.qp(qp)?;
        let Obj::Qp(q) = st.obj(qi) else {
            unreachable!("checked QP")
        };
        if q.state != QpState::Rts {
            return Err(VerbsError::InvalidState(q.state));
        }
        let (ca, pd, qpn) = (q.ca, q.pd, q.qpn);
        let mw = match st.obj(st.slot(bind.mw.0)?) {
            Obj::Mw {
                ca: c, index, kind, ..
            } if st.same_device(*c, ca) => {
                if *kind != MwType::Type1 {
                    return Err(bad("type 2 windows are bound with a BindMw work request"));
                }
                *index
            }
            _ => return Err(VerbsError::InvalidHandle),
        };
        let mr = match st.obj(st.slot(bind.mr.0)?) {
            Obj::Mr { ca: c, key, .. } if st.same_device(*c, ca) => *key,
            _ => return Err(VerbsError::InvalidHandle),
        };
        let rt = st.rt(ca);
        let k = rt
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bind_mw(
                pd as u32,
                mw,
                mr,
                bind.addr,
                bind.len,
                bind.access,
                0,
                qpn.value(),
            )
            .map_err(|s| bad(format!("bind refused: {s}")))?;
        Ok(Rkey(k))
    }

    pub(super) fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        let (handler, ctx) = {
            let mut st = self.lock();
            let i = st.slot(mw.0)?;
            let (ca, pd, index, ctx) = match st.obj(i) {
                Obj::Mw {
                    ca, pd, index, ctx, ..
                } => (*ca, *pd, *index, *ctx),
                _ => return Err(VerbsError::InvalidHandle),
            };
            st.rt(ca)
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dealloc_mw(index)?;
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        handler.on_destroyed(ResourceKind::Mw, ctx);
        Ok(())
    }
}

impl State {
    /// Key-table indices of a bind WR's window and region. Anything but a
    /// type 2 window and an MR of CA `ca` gets an index nothing has, so
    /// the bind completes with a bind error in its turn (as the loopback
    /// provider does), not a post error.
    pub(super) fn bind_indices(&self, ca: usize, b: &MwBind) -> (u32, u32) {
        let mw = match self.slot(b.mw.0).map(|i| self.obj(i)) {
            Ok(Obj::Mw {
                ca: c,
                index,
                kind: MwType::Type2,
                ..
            }) if self.same_device(*c, ca) => *index,
            _ => NO_INDEX,
        };
        let mr = match self.slot(b.mr.0).map(|i| self.obj(i)) {
            Ok(Obj::Mr { ca: c, key, .. }) if self.same_device(*c, ca) => *key,
            _ => NO_INDEX,
        };
        (mw, mr)
    }
}
