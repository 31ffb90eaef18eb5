//! QPs, address handles and SRQs.
//!
//! A modify is checked against the verbs' transition table
//! (`verbs::kit::qp_table`) from the state the device reports, before the
//! device sees it: the same refusals, in the same words, as every other
//! provider. What the table allows and the device refuses comes back as
//! the device's errno.

use super::events;
use super::objects::{Obj, QpObj};
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys::{self, raw};
use rdma_types::{QpState, Qpn};
use std::sync::Arc;
use verbs::kit::qp_table;
use verbs::{
    AhAttr, AhHandle, Context, PdHandle, QpAttr, QpHandle, QpInit, ResourceKind, Result, SrqAttr,
    SrqHandle, VerbsError,
};

impl RdmaCore {
    pub(super) fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        if init.qp_type == rdma_types::QpType::Gsi {
            return self.create_gsi(pd, init, ctx);
        }
        let qp_type = convert::qp_type_raw(init.qp_type)?;
        let (rt, hw_pd, scq, rcq, srq) = {
            let st = self.lock();
            let p = st.pd(pd)?;
            let (ca, hw_pd) = st.pd_of(p);
            let scq = st.cq_rt(st.cq(init.send_cq)?);
            let rcq = st.cq_rt(st.cq(init.recv_cq)?);
            let srq = match init.srq {
                Some(s) => match st.obj(st.srq(s)?) {
                    Obj::Srq { srq, .. } => Some(srq.clone()),
                    _ => unreachable!("checked SRQ"),
                },
                None => None,
            };
            (st.rt(ca), hw_pd, scq, rcq, srq)
        };
        let max_inline = rt.max_inline();
        if init.caps.max_inline > max_inline {
            return Err(bad(format!(
                "{} inline data bytes asked for; {} takes at most {max_inline} \
                 (CaAttr::max_inline_data): ask for that or less",
                init.caps.max_inline,
                rt.dev.name()
            )));
        }
        let mut cap = raw::ibv_qp_cap {
            max_send_wr: init.caps.max_send_wr,
            max_recv_wr: init.caps.max_recv_wr,
            max_send_sge: init.caps.max_send_sge,
            max_recv_sge: init.caps.max_recv_sge,
            max_inline_data: init.caps.max_inline,
        };
        if srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let key = self.key();
        let (hw, caps) = sys::Qp::new(
            &hw_pd,
            &sys::QpCreate {
                qp_type,
                send_cq: &scq.hw,
                recv_cq: &rcq.hw,
                srq: srq.as_ref(),
                cap,
                sq_sig_all: init.sq_sig_all,
                qp_context: key,
            },
        )
        .map_err(|e| match convert::error("create_qp", e) {
            VerbsError::InvalidArgument(m) => bad(format!(
                "{m} ({} asked for {} send and {} receive WRs of {} and {} SGEs, {} inline \
                 bytes; it has max_qp_wr {}, max_sge {}, inline up to {max_inline} on RC)",
                rt.dev.name(),
                cap.max_send_wr,
                cap.max_recv_wr,
                cap.max_send_sge,
                cap.max_recv_sge,
                cap.max_inline_data,
                rt.attr.max_qp_wr,
                rt.attr.max_sge
            )),
            other => other,
        })?;
        let qpn = hw.num();
        let mut st = self.lock();
        // Everything named must still be there (and is kept by the counts).
        let p = st.pd(pd)?;
        let s = st.cq(init.send_cq)?;
        let r = st.cq(init.recv_cq)?;
        let q = init.srq.map(|h| st.srq(h)).transpose()?;
        let ca = st.pd_of(p).0;
        for i in [Some(p), Some(s), Some(r), q].into_iter().flatten() {
            st.adjust(i, 1);
        }
        rt.set_qp_ctx(qpn, Some(ctx));
        let h = st.insert(
            Obj::Qp(Box::new(QpObj {
                ca,
                pd: p,
                send_cq: s,
                recv_cq: r,
                srq: q,
                qp: Arc::new(hw),
                init: *init,
                caps,
                ctx,
                key,
                state: QpState::Reset,
                attr: QpAttr::default(),
            })),
            Some(key),
        );
        Ok(QpHandle(h))
    }

    pub(super) fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        let st = self.lock();
        if st.gsi(qp).is_ok() {
            return Ok(Qpn::GSI);
        }
        Ok(Qpn::from_bits(st.qp_obj(st.qp(qp)?).qp.num()))
    }

    /// The QP's object, with its state refreshed from the device.
    fn qp_now(&self, qp: QpHandle) -> Result<(Arc<sys::Qp>, QpState)> {
        let hw = {
            let st = self.lock();
            st.qp_obj(st.qp(qp)?).qp.clone()
        };
        let a = hw
            .query(raw::qp_mask::STATE)
            .map_err(|e| convert::error("query_qp", e))?;
        let state = convert::qp_state(a.qp_state);
        let mut st = self.lock();
        let i = st.qp(qp)?;
        st.qp_mut(i).state = state;
        Ok((hw, state))
    }

    pub(super) fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        if let Some((g, _)) = self.gsi_of(qp) {
            Self::modify_gsi(&g, attr);
            return Ok(());
        }
        let (hw, from) = self.qp_now(qp)?;
        let (qp_type, rt, port_before) = {
            let st = self.lock();
            let q = st.qp_obj(st.qp(qp)?);
            (q.init.qp_type, st.rt(q.ca), q.attr.port)
        };
        let to = qp_table::check(qp_type, from, attr)?;
        if let Some(mtu) = attr.path_mtu {
            let port = attr
                .av
                .map(|av| av.port)
                .or(attr.port)
                .or(port_before)
                .map_or(1, |p| p.0);
            rt.check_path_mtu(port, mtu)?;
        }
        if let Some(p) = attr.port {
            rt.check_port(p.0)?;
        }
        if let Some(ix) = attr.pkey_index {
            let port = attr.port.map_or(1, |p| p.0);
            let n = rt.pkey_table_len(port)?;
            if ix >= n {
                return Err(bad(format!("P_Key index {ix} outside the {n}-entry table")));
            }
        }
        let (raw_attr, mask) =
            convert::qp_attr(attr, |av| rt.device_gid_index(av.port.0, av.sgid_index))?;
        hw.modify(&raw_attr, mask)
            .map_err(|e| convert::error("modify_qp", e))?;
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let q = st.qp_mut(i);
        q.state = to;
        if to == QpState::Reset {
            q.attr = QpAttr::default();
        } else {
            qp_table::merge(&mut q.attr, attr);
        }
        Ok(())
    }

    pub(super) fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        if let Some((g, _)) = self.gsi_of(qp) {
            return Ok(Self::query_gsi(&g));
        }
        let (_, state) = self.qp_now(qp)?;
        let st = self.lock();
        let mut a = st.qp_obj(st.qp(qp)?).attr;
        a.state = Some(state);
        Ok(a)
    }

    pub(super) fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        if self.gsi_of(qp).is_some() {
            return self.destroy_gsi(qp);
        }
        let (rt, hw, ctx) = {
            let mut st = self.lock();
            let i = st.qp(qp)?;
            let q = match st.remove(i, None) {
                Some(Obj::Qp(q)) => q,
                _ => unreachable!("checked QP"),
            };
            st.by_key.remove(&q.key);
            for j in [Some(q.pd), Some(q.send_cq), Some(q.recv_cq), q.srq]
                .into_iter()
                .flatten()
            {
                st.adjust(j, -1);
            }
            (st.rt(q.ca), q.qp, q.ctx)
        };
        rt.set_qp_ctx(hw.num(), None);
        // Destroyed here unless a post holds it (then when that returns).
        drop(hw);
        events::retire(&rt, qp.0, ResourceKind::Qp, ctx);
        Ok(())
    }

    pub(super) fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let (rt, hw_pd) = {
            let st = self.lock();
            let (ca, hw_pd) = st.pd_of(st.pd(pd)?);
            (st.rt(ca), hw_pd)
        };
        let sgid = if attr.grh {
            rt.sgid_for(attr.port.0, attr.sgid_index, attr.dgid)?
        } else {
            rt.device_gid_index(attr.port.0, attr.sgid_index)?
        };
        let ah = sys::Ah::new(&hw_pd, &convert::ah_attr(attr, sgid))
            .map_err(|e| convert::error("create_ah", e))?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_of(p).0;
        st.adjust(p, 1);
        Ok(AhHandle(st.insert(
            Obj::Ah {
                ca,
                pd: p,
                ah: Arc::new(ah),
                attr: *attr,
                sgid,
            },
            None,
        )))
    }

    pub(super) fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        // An AH has no context: no `on_destroyed` (as every provider).
        let hw = {
            let mut st = self.lock();
            let i = st.ah(ah)?;
            let (pd, hw) = match st.remove(i, None) {
                Some(Obj::Ah { pd, ah, .. }) => (pd, ah),
                _ => unreachable!("checked AH"),
            };
            st.adjust(pd, -1);
            hw
        };
        drop(hw);
        Ok(())
    }

    pub(super) fn create_srq(
        &self,
        pd: PdHandle,
        attr: &SrqAttr,
        ctx: Context,
    ) -> Result<SrqHandle> {
        let (rt, hw_pd) = {
            let st = self.lock();
            let (ca, hw_pd) = st.pd_of(st.pd(pd)?);
            (st.rt(ca), hw_pd)
        };
        if rt.attr.max_srq <= 0 {
            return Err(VerbsError::NotSupported(
                "shared receive queues on this device",
            ));
        }
        if attr.max_wr == 0 || attr.max_sge == 0 || attr.limit > attr.max_wr {
            return Err(bad(format!(
                "SRQ of {} WRs of {} SGEs with limit {}",
                attr.max_wr, attr.max_sge, attr.limit
            )));
        }
        let key = self.key();
        let (srq, _) = sys::Srq::new(
            &hw_pd,
            raw::ibv_srq_attr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: attr.limit,
            },
            key,
        )
        .map_err(|e| convert::error("create_srq", e))?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_of(p).0;
        st.adjust(p, 1);
        Ok(SrqHandle(st.insert(
            Obj::Srq {
                ca,
                pd: p,
                srq: Arc::new(srq),
                ctx,
                key,
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                users: 0,
            },
            Some(key),
        )))
    }

    fn srq_of(&self, srq: SrqHandle) -> Result<(Arc<sys::Srq>, u32, u32)> {
        let st = self.lock();
        match st.obj(st.srq(srq)?) {
            Obj::Srq {
                srq,
                max_wr,
                max_sge,
                ..
            } => Ok((srq.clone(), *max_wr, *max_sge)),
            _ => unreachable!("checked SRQ"),
        }
    }

    pub(super) fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        let (hw, max_wr, _) = self.srq_of(srq)?;
        if limit > max_wr {
            return Err(bad(format!("SRQ limit {limit} above its {max_wr} WRs")));
        }
        hw.set_limit(limit)
            .map_err(|e| convert::error("modify_srq", e))
    }

    pub(super) fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let (hw, _, _) = self.srq_of(srq)?;
        let a = hw.query().map_err(|e| convert::error("query_srq", e))?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            limit: a.srq_limit,
        })
    }

    pub(super) fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let (rt, hw, ctx) = {
            let mut st = self.lock();
            let i = st.srq(srq)?;
            match st.obj(i) {
                Obj::Srq { users, .. } if *users > 0 => {
                    return Err(VerbsError::Busy("SRQ used by a QP"))
                }
                _ => {}
            }
            let (ca, pd, hw, ctx, key) = match st.remove(i, None) {
                Some(Obj::Srq {
                    ca,
                    pd,
                    srq,
                    ctx,
                    key,
                    ..
                }) => (ca, pd, srq, ctx, key),
                _ => unreachable!("checked SRQ"),
            };
            st.by_key.remove(&key);
            st.adjust(pd, -1);
            (st.rt(ca), hw, ctx)
        };
        drop(hw);
        events::retire(&rt, srq.0, ResourceKind::Srq, ctx);
        Ok(())
    }
}
