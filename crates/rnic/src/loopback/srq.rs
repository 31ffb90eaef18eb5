//! Shared receive queues.

use super::*;

impl Fabric {
    pub(super) fn create_srq(
        &self,
        pd: PdHandle,
        attr: &SrqAttr,
        ctx: Context,
    ) -> verbs::Result<SrqHandle> {
        if self.lacks(verbs::Feature::Srq) {
            return Err(VerbsError::NotSupported("create_srq"));
        }
        if attr.max_wr == 0 || attr.max_wr > MAX_QP_WR || attr.max_sge > MAX_SGE {
            return Err(bad("SRQ max_wr/max_sge out of range"));
        }
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge);
        rq.set_limit(attr.limit)?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        st.adjust_children(p, 1);
        Ok(SrqHandle(st.alloc(Obj::Srq {
            ca,
            pd: p,
            ctx,
            rq,
            users: 0,
        })))
    }

    pub(super) fn modify_srq(&self, srq: SrqHandle, limit: u32) -> verbs::Result<()> {
        let mut st = self.lock();
        let i = st.srq_idx(srq)?;
        match st.obj_mut(i) {
            Obj::Srq { rq, .. } => rq.set_limit(limit),
            _ => unreachable!(),
        }
    }

    pub(super) fn query_srq(&self, srq: SrqHandle) -> verbs::Result<SrqAttr> {
        let st = self.lock();
        match st.obj(st.srq_idx(srq)?) {
            Obj::Srq { rq, .. } => Ok(SrqAttr {
                max_wr: rq.max_wr(),
                max_sge: rq.max_sge(),
                limit: rq.limit(),
            }),
            _ => unreachable!(),
        }
    }

    pub(super) fn destroy_srq(&self, srq: SrqHandle) -> verbs::Result<()> {
        self.destroy_simple(srq.0, ResourceKind::Srq)
    }

    pub(super) fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.srq_idx(srq)?;
            match st.obj_mut(i) {
                Obj::Srq { rq, .. } => rq.post(wrs)?,
                _ => unreachable!(),
            }
            st.progress_all(out);
            Ok(())
        })
    }
}
