//! The verbs: each `Provider` method of [`SoftIwarp`], over the objects
//! of `Inner` and the NICs of `dev`.

use super::*;
use crate::post::{post_one_recv, post_one_send};

impl Provider for SoftIwarp {
    fn name(&self) -> &'static str {
        "softiwarp"
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.cas.iter().map(|c| c.guid).collect()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        let cfg = self.ca_cfg(guid.0).ok_or(VerbsError::NoSuchCa)?.clone();
        let mut st = self.lock();
        if let std::collections::hash_map::Entry::Vacant(v) = st.devs.entry(guid.0) {
            let d = Dev::start(&self.shared, guid.0, cfg.ip, &self.options).map_err(|e| {
                bad(format!(
                    "iWARP NIC {}: cannot listen on {}:{}: {e} (is the address on an interface, the port free?)",
                    guid, cfg.ip, self.options.port
                ))
            })?;
            v.insert(d);
        }
        Ok(CaHandle(st.objs.alloc(Obj::Ca {
            guid: guid.0,
            handler,
            ctx,
            children: 0,
        })))
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        Ok(CaAttr {
            guid: Guid(st.guid_of(i)),
            num_ports: 1,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 16,
            max_mw: 0,
            max_inline_data: 0,
            atomics: false,
        })
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        let (guid, handler, ctx, children) = match st.objs.get(i) {
            Obj::Ca {
                guid,
                handler,
                ctx,
                children,
            } => (*guid, handler.clone(), *ctx, *children),
            _ => unreachable!(),
        };
        if children > 0 {
            return Err(VerbsError::Busy("the CA has PDs"));
        }
        st.objs.release(i);
        st.defer(guid, Cb::Destroyed(handler, ResourceKind::Ca, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} (the CA has port 1 only)", port.0)));
        }
        let ip = self
            .ca_cfg(st.guid_of(i))
            .map(|c| c.ip)
            .ok_or(VerbsError::NoSuchCa)?;
        Ok(PortAttr {
            port,
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            lid: Lid(0),
            sm_lid: Lid(0),
            sm_gid: None,
            gids: vec![Gid::from_ip(ip)],
            pkeys: vec![Pkey::DEFAULT],
        })
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        st.adjust(i, 1);
        Ok(PdHandle(st.objs.alloc(Obj::Pd {
            ca: i,
            ctx,
            children: 0,
        })))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.pd(pd)?;
        let (ca, ctx, children) = match st.objs.get(i) {
            Obj::Pd { ca, ctx, children } => (*ca, *ctx, *children),
            _ => unreachable!(),
        };
        if children > 0 {
            return Err(VerbsError::Busy("the PD has objects"));
        }
        st.objs.release(i);
        st.adjust(ca, -1);
        let (guid, h) = (st.guid_of(ca), st.handler(ca));
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Pd, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if init.cqe == 0 || init.cqe > 1 << 20 {
            return Err(bad(format!("CQ of {} entries (1 to 2^20)", init.cqe)));
        }
        let ca = st.ca_of_pd(p);
        st.adjust(p, 1);
        Ok(CqHandle(st.objs.alloc(Obj::Cq {
            ca,
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.cq(cq)?;
        let guid = st.release_shared(i, ResourceKind::Cq, "a QP uses the CQ")?;
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_ref(i).cq
        };
        Ok(c.poll(out))
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let st = self.lock();
        let i = st.cq(cq)?;
        st.cq_ref(i).cq.arm(solicited_only);
        Ok(())
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        let c = {
            let st = self.lock();
            let i = st.cq(cq)?;
            st.cq_ref(i).cq
        };
        if c.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        match init.qp_type {
            QpType::Rc => {}
            QpType::Uc => return Err(VerbsError::NotSupported("UC QPs on iWARP")),
            QpType::Ud => return Err(VerbsError::NotSupported("UD QPs on iWARP")),
            QpType::Smi | QpType::Gsi => {
                return Err(VerbsError::NotSupported("special QPs (QP0/QP1) on iWARP"))
            }
        }
        let c = init.caps;
        if c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(bad(format!("queue depth above {MAX_QP_WR}")));
        }
        if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
            return Err(bad(format!("more than {MAX_SGE} SGEs per WR")));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.ca_of_pd(p);
        let (scq, rcq) = (st.cq(init.send_cq)?, st.cq(init.recv_cq)?);
        let srq = init.srq.map(|h| st.srq(h)).transpose()?;
        let srq_ref = srq.map(|i| match st.objs.get(i) {
            Obj::Srq {
                rq, pd, ctx, ca, ..
            } => SrqRef {
                rq: rq.clone(),
                pd: *pd as u32,
                ctx: *ctx,
                handler: st.handler(*ca),
            },
            _ => unreachable!("an SRQ slot"),
        });
        if let Some(i) = srq {
            st.adjust(i, 1);
        }
        let guid = st.guid_of(ca);
        let qpn = st
            .devs
            .get_mut(&guid)
            .ok_or(VerbsError::NoSuchCa)?
            .new_qpn();
        let (scq_ref, rcq_ref) = (st.cq_ref(scq), st.cq_ref(rcq));
        st.adjust(p, 1);
        st.adjust(scq, 1);
        st.adjust(rcq, 1);
        let handler = st.handler(ca);
        let h = st.objs.alloc(Obj::Qp(Box::new(Qp {
            pd: p,
            guid,
            init: *init,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            ctx,
            handler,
            scq: scq_ref,
            rcq: rcq_ref,
            conn: None,
            wait_sq: VecDeque::new(),
            wait_rq: VecDeque::new(),
            wrs: HashMap::new(),
            next_id: 0,
            sgls: HashMap::new(),
            sq_out: 0,
            rq_out: 0,
            comm_established: false,
            srq: srq_ref,
            next_srq_id: 0,
        })));
        let slot = st.objs.slot(h).unwrap_or_else(|_| unreachable!());
        if let Some(d) = st.devs.get_mut(&guid) {
            d.qpns.insert(qpn, slot);
        }
        Ok(QpHandle(h))
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        Ok(Qpn::from_bits(st.qp_mut(i).qpn))
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let (qp_type, from) = {
            let q = st.qp_mut(i);
            (q.init.qp_type, q.state)
        };
        let to = qp_table::check(qp_type, from, attr)?;
        if attr.alt_path.is_some() || attr.path_mig_state.is_some() {
            return Err(VerbsError::NotSupported("alternate paths (APM) on iWARP"));
        }
        if attr.pkey_index.is_some_and(|ix| ix != 0) {
            return Err(bad("P_Key index outside the 1-entry table"));
        }
        if attr.port.is_some_and(|p| p.0 != 1) {
            return Err(bad("the CA has one port"));
        }
        if let Some(av) = attr.av.filter(|_| to == QpState::Rtr) {
            if av.dgid == Gid::ZERO {
                return Err(bad("the destination GID (the peer's IP address) is zero"));
            }
        }
        let guid = st.qp_mut(i).guid;
        {
            let q = st.qp_mut(i);
            qp_table::merge(&mut q.attr, attr);
            q.state = to;
        }
        match (from, to) {
            (_, QpState::Err) => dev::qp_error(&mut st, i),
            (_, QpState::Reset) => dev::qp_reset(&mut st, i),
            (QpState::Init, QpState::Rtr) => {
                let now = self.shared.now();
                dev::qp_rtr(&mut st, i, self, now);
            }
            // TCP took what was sent; the SQ is drained at once.
            (QpState::Rts, QpState::Sqd) if attr.en_sqd_async_notify == Some(true) => {
                let q = st.qp_mut(i);
                let ev = AsyncEvent {
                    kind: AsyncEventKind::SqDrained,
                    ctx: q.ctx,
                    port: None,
                };
                let h = q.handler.clone();
                st.defer(guid, Cb::Async(h, ev));
            }
            _ => {}
        }
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let q = st.qp_mut(i);
        let mut a = q.attr;
        a.state = Some(q.state);
        Ok(a)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        dev::qp_detach(&mut st, i);
        let Some(Obj::Qp(q)) = st.objs.release(i) else {
            unreachable!("a QP slot")
        };
        if let Some(d) = st.devs.get_mut(&q.guid) {
            d.qpns.remove(&q.qpn);
        }
        st.adjust(q.pd, -1);
        for cq in [q.init.send_cq, q.init.recv_cq] {
            if let Ok(c) = st.cq(cq) {
                st.adjust(c, -1);
            }
        }
        if let Some(s) = q.init.srq.and_then(|h| st.srq(h).ok()) {
            st.adjust(s, -1);
        }
        st.defer(
            q.guid,
            Cb::Destroyed(q.handler.clone(), ResourceKind::Qp, q.ctx),
        );
        Self::kick(&mut st, q.guid);
        Ok(())
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        if attr.max_wr == 0 || attr.max_wr > MAX_QP_WR || attr.max_sge > MAX_SGE {
            return Err(bad(format!(
                "SRQ of {} WRs of {} SGEs (at most {MAX_QP_WR} of {MAX_SGE})",
                attr.max_wr, attr.max_sge
            )));
        }
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge.max(1));
        rq.set_limit(attr.limit)?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.ca_of_pd(p);
        st.adjust(p, 1);
        Ok(SrqHandle(st.objs.alloc(Obj::Srq {
            ca,
            pd: p,
            ctx,
            rq: Arc::new(Mutex::new(rq)),
            users: 0,
        })))
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.objs.get(i) {
            Obj::Srq { rq, .. } => rq
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_limit(limit),
            _ => unreachable!("an SRQ slot"),
        }
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let st = self.lock();
        let i = st.srq(srq)?;
        match st.objs.get(i) {
            Obj::Srq { rq, .. } => {
                let rq = rq.lock().unwrap_or_else(|e| e.into_inner());
                Ok(SrqAttr {
                    max_wr: rq.max_wr(),
                    max_sge: rq.max_sge(),
                    limit: rq.limit(),
                })
            }
            _ => unreachable!("an SRQ slot"),
        }
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.srq(srq)?;
        let guid = st.release_shared(i, ResourceKind::Srq, "a QP uses the SRQ")?;
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let rq = {
            let st = self.lock();
            let i = st.srq(srq)?;
            match st.objs.get(i) {
                Obj::Srq { rq, .. } => rq.clone(),
                _ => unreachable!("an SRQ slot"),
            }
        };
        // Checked when a Send takes one (the QP's PD and keys then).
        let r = rq.lock().unwrap_or_else(|e| e.into_inner()).post(wrs);
        r
    }

    fn reg_mr(
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
        let ca = st.ca_of_pd(p);
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        let (key_ix, key) = d.keys.reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust(p, 1);
        let h = st.objs.alloc(Obj::Mr {
            ca,
            pd: p,
            key: key_ix,
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

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let mut st = self.lock();
        let i = st.mr(mr)?;
        let (ca, key_ix) = match st.objs.get(i) {
            Obj::Mr { ca, key, .. } => (*ca, *key),
            _ => unreachable!(),
        };
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        let key = d.keys.rereg_mr(key_ix, buf, addr, len, access)?;
        Ok(MrInfo {
            handle: mr,
            lkey: rdma_types::Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.mr(mr)?;
        let (ca, pd, key_ix, ctx) = match st.objs.get(i) {
            Obj::Mr { ca, pd, key, ctx } => (*ca, *pd, *key, *ctx),
            _ => unreachable!(),
        };
        let guid = st.guid_of(ca);
        let d = st.devs.get_mut(&guid).ok_or(VerbsError::NoSuchCa)?;
        d.keys.dereg_mr(key_ix)?;
        st.objs.release(i);
        st.adjust(pd, -1);
        let h = st.handler(ca);
        st.defer(guid, Cb::Destroyed(h, ResourceKind::Mr, ctx));
        Self::kick(&mut st, guid);
        Ok(())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let guid = st.qp_mut(i).guid;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(cause) = post_one_send(&mut st, i, wr) {
                result = Err(VerbsError::BadWr {
                    index,
                    cause: Box::new(cause),
                });
                break;
            }
        }
        let now = self.shared.now();
        dev::qp_pump(&mut st, i, now);
        Self::kick(&mut st, guid);
        result
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let guid = st.qp_mut(i).guid;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(cause) = post_one_recv(&mut st, i, wr) {
                result = Err(VerbsError::BadWr {
                    index,
                    cause: Box::new(cause),
                });
                break;
            }
        }
        let now = self.shared.now();
        dev::qp_pump(&mut st, i, now);
        Self::kick(&mut st, guid);
        result
    }
}
