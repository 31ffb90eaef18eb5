//! Completion queues (`verbs::kit::cq` rings).

use super::*;

impl Fabric {
    pub(super) fn create_cq(
        &self,
        pd: PdHandle,
        init: &CqInit,
        ctx: Context,
    ) -> verbs::Result<CqHandle> {
        if init.cqe == 0 || init.cqe > MAX_CQE {
            return Err(bad(format!("cqe {} not in 1..={MAX_CQE}", init.cqe)));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        st.adjust_children(p, 1);
        Ok(CqHandle(st.alloc(Obj::Cq {
            ca,
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    pub(super) fn destroy_cq(&self, cq: CqHandle) -> verbs::Result<()> {
        self.destroy_simple(cq.0, ResourceKind::Cq)
    }

    pub(super) fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> verbs::Result<usize> {
        // Polled under the state lock (state, then CQ: the order `complete`
        // takes them in), which saves cloning the CQ's Arc on every poll.
        let st = self.lock();
        match st.obj(st.cq_idx(cq)?) {
            Obj::Cq { cq, .. } => Ok(cq.poll(out)),
            _ => unreachable!(),
        }
    }

    pub(super) fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> verbs::Result<()> {
        self.cq_arc(cq)?.arm(solicited_only);
        Ok(())
    }

    pub(super) fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> verbs::Result<()> {
        if self.cq_arc(cq)?.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }
}
