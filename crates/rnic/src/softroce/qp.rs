//! QPs: the verbs object and its `roce` engine in the node (built at
//! INIT->RTR, or at INIT for datagram QPs), state changes, address handles.

use super::*;

impl SoftRoce {
    pub(super) fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        if init.caps.max_inline > MAX_INLINE_DATA {
            return Err(bad(format!(
                "max_inline {} > {MAX_INLINE_DATA}",
                init.caps.max_inline
            )));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let scq = st.cq(init.send_cq)?;
        let rcq = st.cq(init.recv_cq)?;
        let srq = init.srq.map(|s| st.srq(s)).transpose()?;
        let rt = st.rt(ca);
        if matches!(init.qp_type, QpType::Gsi | QpType::Smi) && !rt.special_qps {
            return Err(VerbsError::NotSupported(
                "QP0 and QP1 of a shared port are its owner's (the NIC daemon's)",
            ));
        }
        let qpn = match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => rt.node(|n| n.reserve_qpn()),
            QpType::Gsi => Qpn::from_bits(1),
            QpType::Smi if rt.personality == Personality::Ib => Qpn::from_bits(0),
            QpType::Smi => return Err(VerbsError::NotSupported("QP0 on a roce port")),
        };
        if matches!(init.qp_type, QpType::Gsi | QpType::Smi)
            && rt.routes_lock().contains_key(&qpn.value())
        {
            return Err(VerbsError::Busy("the special QP exists"));
        }
        let send_cq = st.cq_arc(scq);
        let recv_cq = st.cq_arc(rcq);
        st.adjust(p, 1);
        st.adjust(scq, 1);
        st.adjust(rcq, 1);
        if let Some(s) = srq {
            st.adjust(s, 1);
        }
        let handler = st.handler(ca);
        rt.routes_lock().insert(
            qpn.value(),
            Route {
                handler,
                send_cq,
                recv_cq,
                ctx,
                quiet_error: false,
            },
        );
        let caps = init.caps;
        Ok(QpHandle(st.alloc(Obj::Qp(Box::new(QpObj {
            ca,
            pd: p,
            init: *init,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            early: RecvQueue::new(caps.max_recv_wr.max(1), caps.max_recv_sge.max(1)),
            access: Arc::new(AtomicU32::new(0)),
            ctx,
            engine: false,
        })))))
    }

    pub(super) fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        let st = self.lock();
        let i = st.qp(qp)?;
        match st.obj(i) {
            Obj::Qp(q) => Ok(q.qpn),
            _ => unreachable!("checked QP"),
        }
    }

    pub(super) fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let ca = st.qp_mut(i).ca;
        engine_state(&st.rt(ca), st.qp_mut(i));
        let (qp_type, from) = {
            let q = st.qp_mut(i);
            (q.init.qp_type, q.state)
        };
        let to = qp_table::check(qp_type, from, attr)?;
        if attr.alt_path.is_some() || attr.path_mig_state.is_some() {
            return Err(VerbsError::NotSupported("alternate paths (APM)"));
        }
        if let Some(ix) = attr.pkey_index {
            let ca = st.qp_mut(i).ca;
            let n = st.rt(ca).pkey_table().len();
            if usize::from(ix) >= n {
                return Err(bad(format!("P_Key index {ix} outside the {n}-entry table")));
            }
        }
        if attr.port.is_some_and(|p| p.0 != 1) {
            return Err(bad("the CA has one port"));
        }
        let (ca, pd, srq_rq) = {
            let q = st.qp_mut(i);
            (q.ca, q.pd, q.init.srq)
        };
        let srq = match srq_rq {
            Some(h) => {
                let si = st.srq(h)?;
                match st.obj(si) {
                    Obj::Srq { rq, ca, ctx, .. } => Some(SrqRef {
                        rq: rq.clone(),
                        handler: st.handler(*ca),
                        ctx: *ctx,
                    }),
                    _ => None,
                }
            }
            None => None,
        };
        let rt = st.rt(ca);
        let udp_port = self.udp_port;
        let q = st.qp_mut(i);
        qp_table::merge(&mut q.attr, attr);
        if let Some(a) = attr.access {
            q.access.store(a.bits(), Ordering::Relaxed);
        }
        let qpn = q.qpn;
        match (from, to) {
            (_, QpState::Err) => {
                if let Some(r) = rt.routes_lock().get_mut(&qpn.value()) {
                    r.quiet_error = true;
                }
                if q.engine {
                    rt.node(|n| {
                        if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                            e.set_error(WcStatus::WrFlushErr);
                        }
                    });
                }
                // Receives never handed to an engine flush here.
                let early = q.early.drain();
                let ctx = q.ctx;
                q.state = QpState::Err;
                drop(st);
                if !early.is_empty() {
                    if let Some(route) = rt.routes_lock().get(&qpn.value()).cloned() {
                        let mut notify = false;
                        for wr in early {
                            let wc = WorkCompletion::new(
                                wr.wr_id,
                                WcStatus::WrFlushErr,
                                WcOpcode::Recv,
                                ctx,
                            );
                            notify |= route.recv_cq.0.push(wc, false).notify;
                        }
                        if notify {
                            route.handler.on_completion(route.recv_cq.1);
                        }
                    }
                }
                // Flushed engine completions come through the driver callback.
                rt.node(|_| ());
                return Ok(());
            }
            (_, QpState::Reset) => {
                if q.engine {
                    rt.node(|n| {
                        n.destroy_qp(softroce::QpHandle(qpn));
                        // Keep the number for this QP.
                        let r = n.reserve_qpn_exact(qpn);
                        debug_assert!(r);
                    });
                    q.engine = false;
                }
                q.early.drain();
                q.state = QpState::Reset;
                q.attr = QpAttr::default();
                if let Some(r) = rt.routes_lock().get_mut(&qpn.value()) {
                    r.quiet_error = false;
                }
                return Ok(());
            }
            (QpState::Init, QpState::Rtr) | (QpState::Reset, QpState::Init)
                if !q.engine && (qp_type.is_datagram() || to == QpState::Rtr) =>
            {
                // Build the engine now that its attributes are known (UD,
                // GSI: at INIT already, so receives land from the start;
                // their INIT->RTR keeps that engine and the receives
                // posted to it, as ibv_ud_pingpong posts them in INIT).
                let mut cfg = engine_config(q, qp_type);
                // The P_Key its index names (an ib port's table comes from
                // the SM; QP0 keeps the default: SMPs are not partitioned).
                let ix = usize::from(q.attr.pkey_index.unwrap_or(0));
                if let (false, Some(k)) = (qp_type == QpType::Smi, rt.pkey_table().get(ix)) {
                    cfg.pkey = *k;
                }
                let mem = PdMem {
                    pd: pd as u32,
                    qpn: qpn.value(),
                    keys: rt.keys.clone(),
                    access: q.access.clone(),
                    srq,
                };
                let remote = q
                    .attr
                    .av
                    .filter(|_| !qp_type.is_datagram())
                    .map(|av| addr_of(av.dgid, udp_port));
                let early: Vec<RecvWr> = q.early.drain();
                let created = rt.node(|n| -> std::io::Result<()> {
                    let h = n.create_qp_at(cfg, Box::new(mem))?;
                    if let Some(r) = remote {
                        n.set_remote(h, r);
                    }
                    if let Some(e) = n.qp_mut(h) {
                        for wr in &early {
                            e.post_recv(recv_wqe(wr));
                        }
                    }
                    Ok(())
                });
                created.map_err(|e| bad(format!("cannot create the QP engine: {e}")))?;
                q.engine = true;
            }
            (QpState::Init, QpState::Rtr) if qp_type.is_datagram() => {
                // The engine built at INIT stays (with its receives); the
                // Q_Key and P_Key index INIT->RTR may carry reach it.
                let qkey = engine_config(q, qp_type).qkey;
                let ix = usize::from(q.attr.pkey_index.unwrap_or(0));
                let pkey = rt.pkey_table().get(ix).copied();
                let smi = qp_type == QpType::Smi;
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        e.update_config(|c| {
                            c.qkey = qkey;
                            if let (false, Some(k)) = (smi, pkey) {
                                c.pkey = k;
                            }
                        });
                    }
                });
            }
            (QpState::Rts, QpState::Sqd) => {
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        e.set_sqd();
                    }
                });
                q.state = to;
                drop(st);
                // The drained event may be due at once (nothing in flight).
                rt.deliver(softroce::QpHandle(qpn));
                return Ok(());
            }
            (QpState::Rtr, QpState::Rts)
            | (QpState::Init, QpState::Rts)
            | (QpState::Sqd, QpState::Rts)
            | (QpState::Sqe, QpState::Rts) => {
                let a = q.attr;
                // Only RTR->RTS gives a send PSN; the stored one must not
                // rewind a requester that has sent (SQD/SQE->RTS).
                let sq_psn = attr.sq_psn;
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        if let Some(p) = sq_psn {
                            e.set_sq_psn(p);
                        }
                        e.update_config(|c| {
                            c.timeout = a.timeout.unwrap_or(c.timeout);
                            c.retry_cnt = a.retry_cnt.unwrap_or(c.retry_cnt);
                            c.rnr_retry = a.rnr_retry.unwrap_or(c.rnr_retry);
                            c.max_rd_atomic = a.max_rd_atomic.unwrap_or(c.max_rd_atomic).max(1);
                        });
                        e.set_rts();
                    }
                });
            }
            (QpState::Rts, QpState::Rts) | (QpState::Sqd, QpState::Sqd) => {
                let a = q.attr;
                rt.node(|n| {
                    if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                        e.update_config(|c| {
                            c.timeout = a.timeout.unwrap_or(c.timeout);
                            c.retry_cnt = a.retry_cnt.unwrap_or(c.retry_cnt);
                            c.rnr_retry = a.rnr_retry.unwrap_or(c.rnr_retry);
                        });
                    }
                });
            }
            _ => {}
        }
        q.state = to;
        Ok(())
    }

    pub(super) fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let ca = st.qp_mut(i).ca;
        let rt = st.rt(ca);
        let q = st.qp_mut(i);
        engine_state(&rt, q);
        let mut a = q.attr;
        a.state = Some(q.state);
        Ok(a)
    }

    pub(super) fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.qp(qp)?;
            let q = match st.release(i) {
                Some(Obj::Qp(q)) => q,
                _ => unreachable!("checked QP"),
            };
            let (scq, rcq, srq) = (
                st.cq(q.init.send_cq).ok(),
                st.cq(q.init.recv_cq).ok(),
                q.init.srq.and_then(|s| st.srq(s).ok()),
            );
            for c in [scq, rcq].into_iter().flatten() {
                st.adjust(c, -1);
            }
            if let Some(s) = srq {
                st.adjust(s, -1);
            }
            st.adjust(q.pd, -1);
            let rt = st.rt(q.ca);
            let qpn = q.qpn;
            rt.routes_lock().remove(&qpn.value());
            rt.node(|n| {
                if !n.destroy_qp(softroce::QpHandle(qpn)) {
                    n.release_qpn(qpn);
                }
            });
            (st.handler(q.ca), q.ctx)
        };
        rt.on_destroyed(ResourceKind::Qp, ctx);
        Ok(())
    }

    pub(super) fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        if !attr.grh {
            return Err(bad("RoCE address handles need a GRH (destination GID)"));
        }
        let ca = st.pd_ca(p);
        let rt = st.rt(ca);
        let dst = addr_of(attr.dgid, self.udp_port);
        let id = rt.node(|n| n.create_ah(dst));
        st.adjust(p, 1);
        Ok(AhHandle(st.alloc(Obj::Ah { pd: p, id })))
    }

    pub(super) fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        let mut st = self.lock();
        let i = st.slot(ah.0)?;
        let pd = match st.obj(i) {
            Obj::Ah { pd, .. } => *pd,
            _ => return Err(VerbsError::InvalidHandle),
        };
        st.release(i);
        st.adjust(pd, -1);
        Ok(())
    }
}

/// The peer's UDP address for a destination GID.
fn addr_of(gid: Gid, port: u16) -> SocketAddr {
    let v6 = std::net::Ipv6Addr::from(gid.0);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, port)
}

/// Catches up with the state the engine moved the QP to by itself: ERR
/// on a fatal completion, SQE on a UC/UD send error (IBA 10.3.1.6).
fn engine_state(rt: &CaRt, q: &mut QpObj) {
    if !q.engine || q.state == QpState::Err {
        return;
    }
    let qpn = q.qpn;
    let (err, sqe) = rt.node(|n| {
        n.qp_mut(softroce::QpHandle(qpn))
            .map_or((false, false), |e| (e.is_error(), e.is_send_error()))
    });
    if err {
        q.state = QpState::Err;
    } else if sqe && matches!(q.state, QpState::Rts | QpState::Sqd) {
        q.state = QpState::Sqe;
    }
}

/// The engine's configuration from the QP's accumulated attributes.
fn engine_config(q: &QpObj, qp_type: QpType) -> QpConfig {
    let a = &q.attr;
    let mut c = QpConfig::rc(q.qpn, a.dest_qpn.unwrap_or(Qpn::from_bits(0)));
    c.qp_type = qp_type;
    c.pmtu = a.path_mtu.unwrap_or(Mtu::Mtu1024);
    c.rq_psn = a.rq_psn.unwrap_or(Psn::new(0));
    c.sq_psn = a.sq_psn.unwrap_or(Psn::new(0));
    c.max_dest_rd_atomic = a.max_dest_rd_atomic.unwrap_or(4).max(1);
    c.min_rnr_timer = a.min_rnr_timer.unwrap_or(12);
    c.qkey = a.qkey.unwrap_or(if qp_type == QpType::Gsi {
        Qkey::GSI
    } else {
        Qkey(0)
    });
    c.srq = q.init.srq.is_some();
    c
}
