//! Shared receive queues, popped by the engines through `PdMem`.

use super::*;

impl SoftRoce {
    pub(super) fn create_srq(
        &self,
        pd: PdHandle,
        attr: &SrqAttr,
        ctx: Context,
    ) -> Result<SrqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if attr.max_wr == 0 || attr.max_sge == 0 {
            return Err(bad("SRQ needs max_wr and max_sge"));
        }
        let ca = st.pd_ca(p);
        st.adjust(p, 1);
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge);
        let _ = rq.set_limit(attr.limit);
        Ok(SrqHandle(st.alloc(Obj::Srq {
            ca,
            pd: p,
            ctx,
            rq: Arc::new(Mutex::new(rq)),
            users: 0,
        })))
    }

    pub(super) fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.obj(i) {
            Obj::Srq { rq, .. } => rq
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_limit(limit),
            _ => unreachable!("checked SRQ"),
        }
    }

    pub(super) fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.obj(i) {
            Obj::Srq { rq, .. } => {
                let rq = rq.lock().unwrap_or_else(|e| e.into_inner());
                Ok(SrqAttr {
                    max_wr: rq.max_wr(),
                    max_sge: rq.max_sge(),
                    limit: rq.limit(),
                })
            }
            _ => unreachable!("checked SRQ"),
        }
    }

    pub(super) fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.srq(srq)?;
            let (ca, pd, ctx, users) = match st.obj(i) {
                Obj::Srq {
                    ca, pd, ctx, users, ..
                } => (*ca, *pd, *ctx, *users),
                _ => unreachable!("checked SRQ"),
            };
            if users > 0 {
                return Err(VerbsError::Busy("SRQ used by a QP"));
            }
            st.release(i);
            st.adjust(pd, -1);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Srq, ctx);
        Ok(())
    }

    pub(super) fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let (rq, rt) = {
            let st = self.lock();
            let i = st.srq(srq)?;
            match st.obj(i) {
                Obj::Srq { rq, ca, .. } => (rq.clone(), st.rt(*ca)),
                _ => unreachable!("checked SRQ"),
            }
        };
        rq.lock().unwrap_or_else(|e| e.into_inner()).post(wrs)?;
        // A SEND waiting on RNR retries by itself; wake the NIC thread so
        // its next poll sees the new receives.
        rt.node(|_| ());
        Ok(())
    }
}
