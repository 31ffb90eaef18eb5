//! QPs: creation, state changes (with the error and SQE states a failed
//! WR moves them to), address handles.

use super::*;

impl Fabric {
    pub(super) fn create_qp(
        &self,
        pd: PdHandle,
        init: &QpInit,
        ctx: Context,
    ) -> verbs::Result<QpHandle> {
        let c = init.caps;
        if c.max_send_wr > MAX_QP_WR
            || c.max_recv_wr > MAX_QP_WR
            || c.max_send_sge > MAX_SGE
            || c.max_recv_sge > MAX_SGE
        {
            return Err(VerbsError::OutOfResources(
                "QP capabilities exceed the CA's limits",
            ));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let scq = st.cq_idx(init.send_cq)?;
        let rcq = st.cq_idx(init.recv_cq)?;
        let srq = init.srq.map(|s| st.srq_idx(s)).transpose()?;
        for i in [scq, rcq].into_iter().chain(srq) {
            let owner = match st.obj(i) {
                Obj::Cq { ca, .. } | Obj::Srq { ca, .. } => *ca,
                _ => unreachable!(),
            };
            if st.ca_dev(owner) != dev {
                return Err(bad("CQ/SRQ belongs to another CA"));
            }
        }
        let special = matches!(init.qp_type, QpType::Smi | QpType::Gsi);
        let (qpn, key) = if special {
            let port = init.port.ok_or_else(|| bad("special QP needs a port"))?;
            if port.0 == 0 || port.0 as usize > st.devices[dev].ports.len() {
                return Err(bad(format!("no port {}", port.0)));
            }
            let n = if init.qp_type == QpType::Smi { 0 } else { 1 };
            let key = (port.0 as u32) << 24 | n;
            if st.devices[dev].qpns.contains_key(&key) {
                return Err(VerbsError::Busy("special QP already exists on this port"));
            }
            (n, key)
        } else {
            if init.port.is_some() {
                return Err(bad("port is given at INIT for non-special QPs"));
            }
            let d = &mut st.devices[dev];
            let n = d.next_qpn;
            d.next_qpn = if n + 1 > Qpn::MASK - 1 { 2 } else { n + 1 };
            (n, n)
        };
        let qp = Qp {
            ca,
            dev,
            pd: p,
            init: *init,
            send_cq: scq,
            recv_cq: rcq,
            srq,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            rq: RecvQueue::new(c.max_recv_wr, c.max_recv_sge),
            pending: VecDeque::new(),
            ctx,
            established: false,
            mig: MigState::Migrated,
            peer: None,
        };
        st.paths_changed();
        st.adjust_children(p, 1);
        st.adjust_children(scq, 1);
        st.adjust_children(rcq, 1);
        if let Some(s) = srq {
            st.adjust_children(s, 1);
        }
        let h = st.alloc(Obj::Qp(Box::new(qp)));
        st.devices[dev].qpns.insert(key, h.index as usize);
        Ok(QpHandle(h))
    }

    pub(super) fn qp_num(&self, qp: QpHandle) -> verbs::Result<Qpn> {
        let st = self.lock();
        Ok(Qpn::from_bits(st.qpr(st.qp_idx(qp)?).qpn))
    }

    pub(super) fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            st.paths_changed();
            let q = st.qpr(i);
            let to = qp_table::check(q.init.qp_type, q.state, attr)?;
            let dev = &st.devices[q.dev];
            let port = attr.port.or(q.attr.port).or(q.init.port);
            if let Some(p) = attr.port {
                if p.0 == 0 || p.0 as usize > dev.ports.len() {
                    return Err(bad(format!("no port {}", p.0)));
                }
            }
            if let (Some(pk), Some(p)) = (attr.pkey_index, port) {
                if pk as usize >= dev.ports[p.0 as usize - 1].pkeys.len() {
                    return Err(bad(format!("pkey_index {pk} beyond the table")));
                }
            }
            if let (Some(m), Some(p)) = (attr.path_mtu, port) {
                if m.bytes() > dev.ports[p.0 as usize - 1].max_mtu.bytes() {
                    return Err(bad("path_mtu above the port's MTU"));
                }
            }
            if attr.rnr_retry.is_some_and(|r| r > 7)
                || attr.retry_cnt.is_some_and(|r| r > 7)
                || attr.timeout.is_some_and(|t| t > 31)
                || attr.min_rnr_timer.is_some_and(|t| t > 31)
            {
                return Err(bad("retry/timer field out of range"));
            }
            if attr.access.is_some_and(|a| {
                a.contains(AccessFlags::MW_BIND) || a.contains(AccessFlags::ZERO_BASED)
            }) {
                return Err(bad("QP access takes only remote rights"));
            }
            if self.lacks(verbs::Feature::Apm)
                && (attr.alt_path.is_some() || attr.path_mig_state.is_some())
            {
                return Err(VerbsError::NotSupported("alternate paths (APM)"));
            }
            if let Some(alt) = &attr.alt_path {
                let p = dev
                    .ports
                    .get((alt.port.0 as usize).wrapping_sub(1))
                    .ok_or_else(|| bad(format!("no port {} for the alternate path", alt.port.0)))?;
                if alt.pkey_index as usize >= p.pkeys.len() {
                    return Err(bad("alternate pkey_index beyond the table"));
                }
            }
            let step = kit::apm::check(q.state, to, q.mig, q.attr.alt_path.is_some(), attr)?;
            let from = q.state;
            let notify = attr.en_sqd_async_notify == Some(true);
            let qm = st.qp(i);
            qp_table::merge(&mut qm.attr, attr);
            qm.attr.state = Some(to);
            qm.mig = step.state;
            qm.attr.path_mig_state = Some(step.state);
            if step.migrate {
                st.migrate(i, out);
            }
            let qm = st.qp(i);
            match to {
                QpState::Reset => {
                    qm.state = to;
                    qm.pending.clear();
                    qm.rq.drain();
                    qm.attr = QpAttr::default();
                    qm.established = false;
                    qm.mig = MigState::Migrated;
                }
                QpState::Err => st.enter_error(i, out),
                _ => {
                    qm.state = to;
                    if to == QpState::Sqd && from != QpState::Sqd && notify {
                        // Loopback executes synchronously: the SQ is drained now.
                        let (ca, ctx) = (qm.ca, qm.ctx);
                        st.event(ca, AsyncEventKind::SqDrained, ctx, None, out);
                    }
                    st.progress_all(out);
                }
            }
            Ok(())
        })
    }

    pub(super) fn query_qp(&self, qp: QpHandle) -> verbs::Result<QpAttr> {
        let st = self.lock();
        let q = st.qpr(st.qp_idx(qp)?);
        let mut a = q.attr;
        a.state = Some(q.state);
        a.path_mig_state = (!q.init.qp_type.is_datagram()).then_some(q.mig);
        Ok(a)
    }

    pub(super) fn destroy_qp(&self, qp: QpHandle) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            let q = st.qpr(i);
            let key = if q.qpn <= 1 {
                (st.qp_port(q).0 as u32) << 24 | q.qpn
            } else {
                q.qpn
            };
            let (dev, pd, scq, rcq, srq, ca, ctx) =
                (q.dev, q.pd, q.send_cq, q.recv_cq, q.srq, q.ca, q.ctx);
            st.devices[dev].qpns.remove(&key);
            st.paths_changed();
            for p in [pd, scq, rcq].into_iter().chain(srq) {
                st.adjust_children(p, -1);
            }
            let h = st.handler(ca);
            st.release(i);
            out.push(Cb::Destroyed(h, ResourceKind::Qp, ctx));
            Ok(())
        })
    }

    pub(super) fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> verbs::Result<AhHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let dev = st.ca_dev(st.pd_ca(p));
        if attr.port.0 == 0 || attr.port.0 as usize > st.devices[dev].ports.len() {
            return Err(bad(format!("no port {}", attr.port.0)));
        }
        st.adjust_children(p, 1);
        Ok(AhHandle(st.alloc(Obj::Ah { pd: p, attr: *attr })))
    }

    pub(super) fn destroy_ah(&self, ah: AhHandle) -> verbs::Result<()> {
        self.destroy_simple(ah.0, ResourceKind::Ah)
    }
}

impl State {
    /// Moves a QP to ERR, flushing its send and receive queues.
    pub(super) fn enter_error(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        if q.state == QpState::Err {
            return;
        }
        q.state = QpState::Err;
        let pending: Vec<SendWr> = q.pending.drain(..).collect();
        let recvs = q.rq.drain();
        let (scq, rcq, ctx) = (q.send_cq, q.recv_cq, q.ctx);
        for wr in pending {
            self.complete(
                scq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wc_opcode(wr.opcode), ctx),
                false,
                out,
            );
        }
        for wr in recvs {
            self.complete(
                rcq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, ctx),
                false,
                out,
            );
        }
    }

    /// Moves a UC/UD QP to SQE, flushing its send queue only.
    pub(super) fn enter_sqe(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        q.state = QpState::Sqe;
        q.attr.state = Some(QpState::Sqe);
        let pending: Vec<SendWr> = q.pending.drain(..).collect();
        let (scq, ctx) = (q.send_cq, q.ctx);
        for wr in pending {
            self.complete(
                scq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wc_opcode(wr.opcode), ctx),
                false,
                out,
            );
        }
    }

    /// A responder error no receive completion reports (a bad RDMA or
    /// atomic request): the responder's QP goes to ERR and its owner gets
    /// an affiliated QpFatal (IBA 9.9.3.1: local access violation /
    /// invalid request work queue errors).
    pub(super) fn responder_fatal(&mut self, pi: usize, out: &mut Vec<Cb>) {
        let (ca, ctx) = (self.qpr(pi).ca, self.qpr(pi).ctx);
        self.enter_error(pi, out);
        self.event(ca, AsyncEventKind::QpFatal, ctx, None, out);
    }

    pub(super) fn flush_rq(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        let recvs = q.rq.drain();
        let (rcq, ctx) = (q.recv_cq, q.ctx);
        for wr in recvs {
            self.complete(
                rcq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, ctx),
                false,
                out,
            );
        }
    }
}
