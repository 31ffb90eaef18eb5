//! Completion queues: `verbs::kit::cq` rings the NIC thread fills.

use super::*;

impl SoftRoce {
    pub(super) fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if init.cqe == 0 || init.cqe > 1 << 20 {
            return Err(bad(format!("{} CQ entries", init.cqe)));
        }
        st.adjust(p, 1);
        Ok(CqHandle(st.alloc(Obj::Cq {
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    pub(super) fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.cq(cq)?;
            let (pd, ctx, users) = match st.obj(i) {
                Obj::Cq { pd, ctx, users, .. } => (*pd, *ctx, *users),
                _ => unreachable!("checked CQ"),
            };
            if users > 0 {
                return Err(VerbsError::Busy("CQ used by a QP"));
            }
            st.release(i);
            st.adjust(pd, -1);
            let ca = st.pd_ca(pd);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Cq, ctx);
        Ok(())
    }

    pub(super) fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        Ok(c.poll(out))
    }

    pub(super) fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        c.arm(solicited_only);
        Ok(())
    }

    /// The waiting consumer receives for the CA's node ([`Driver::drive`]):
    /// the completions of QPs whose CQs are both `cq` are delivered on its
    /// thread, the others by the NIC thread.
    pub(super) fn drive_cq(
        &self,
        cq: CqHandle,
        spin: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        let (rt, c) = {
            let st = self.lock();
            let i = st.cq(cq)?;
            let pd = match st.obj(i) {
                Obj::Cq { pd, .. } => *pd,
                _ => unreachable!("checked CQ"),
            };
            (st.rt(st.pd_ca(pd)), st.cq_arc(i).0)
        };
        let Some(driver) = rt.driver.get() else {
            return Ok(false);
        };
        Ok(driver.drive(spin, timeout, |qp| {
            let mine = rt
                .routes_lock()
                .get(&qp.0.value())
                .is_some_and(|r| Arc::ptr_eq(&r.send_cq.0, &c) && Arc::ptr_eq(&r.recv_cq.0, &c));
            if mine {
                rt.deliver(qp);
            }
            mine
        }))
    }

    pub(super) fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_arc(i).0
        };
        if c.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }
}
