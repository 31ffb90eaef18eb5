//! Memory regions and windows in the device's key table (`verbs::kit::keys`).

use super::*;

impl Fabric {
    pub(super) fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> verbs::Result<MrInfo> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let (_, key) = st.devices[dev]
            .keys
            .reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust_children(p, 1);
        let h = st.alloc(Obj::Mr {
            ca,
            pd: p,
            key,
            ctx,
        });
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: rdma_types::Lkey(key),
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
    ) -> verbs::Result<MrInfo> {
        let mut st = self.lock();
        let i = st.slot(mr.0)?;
        let Obj::Mr { ca, key, .. } = st.obj(i) else {
            return Err(VerbsError::InvalidHandle);
        };
        let (ca, old) = (*ca, *key);
        let dev = st.ca_dev(ca);
        let new = st.devices[dev]
            .keys
            .rereg_mr(old >> 8, buf, addr, len, access)?;
        if let Obj::Mr { key, .. } = st.obj_mut(i) {
            *key = new;
        }
        Ok(MrInfo {
            handle: mr,
            lkey: rdma_types::Lkey(new),
            rkey: Rkey(new),
            addr,
            len,
        })
    }

    pub(super) fn dereg_mr(&self, mr: MrHandle) -> verbs::Result<()> {
        self.destroy_simple(mr.0, ResourceKind::Mr)
    }

    pub(super) fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> verbs::Result<(MwHandle, Rkey)> {
        if self.lacks(verbs::Feature::Mw) {
            return Err(VerbsError::NotSupported("alloc_mw"));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let (_, key) = st.devices[dev].keys.alloc_mw(p as u32, kind);
        st.adjust_children(p, 1);
        Ok((
            MwHandle(st.alloc(Obj::Mw {
                ca,
                pd: p,
                key,
                kind,
                ctx,
            })),
            Rkey(key),
        ))
    }

    pub(super) fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> verbs::Result<Rkey> {
        let mut st = self.lock();
        let qi = st.qp_idx(qp)?;
        let (dev, pd, qpn, state) = {
            let q = st.qpr(qi);
            (q.dev, q.pd, q.qpn, q.state)
        };
        if state != QpState::Rts {
            return Err(VerbsError::InvalidState(state));
        }
        let mwi = st.slot(bind.mw.0)?;
        let mri = st.slot(bind.mr.0)?;
        let (Obj::Mw { key: mwk, kind, .. }, Obj::Mr { key: mrk, .. }) = (st.obj(mwi), st.obj(mri))
        else {
            return Err(VerbsError::InvalidHandle);
        };
        if *kind != MwType::Type1 {
            return Err(bad("type 2 windows are bound with a BindMw work request"));
        }
        let (mwk, mrk) = (*mwk, *mrk);
        let k = st.devices[dev]
            .keys
            .bind_mw(
                pd as u32,
                mwk >> 8,
                mrk >> 8,
                bind.addr,
                bind.len,
                bind.access,
                0,
                qpn,
            )
            .map_err(|s| bad(format!("bind refused: {s}")))?;
        if let Obj::Mw { key, .. } = st.obj_mut(mwi) {
            *key = k;
        }
        Ok(Rkey(k))
    }

    pub(super) fn dealloc_mw(&self, mw: MwHandle) -> verbs::Result<()> {
        self.destroy_simple(mw.0, ResourceKind::Mw)
    }
}
