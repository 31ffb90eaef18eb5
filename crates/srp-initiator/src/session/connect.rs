//! Setting a session up (verbs objects, IU rings, the pool, the login)
//! and tearing it down.

use super::*;

impl Session {
    /// Opens CA `guid` on `provider`, connects through `connector` and logs
    /// in. Blocks until the login is answered.
    ///
    /// The session's `srp_session` tracing span (the local CA and port,
    /// the target port identifier, the channel index) covers the login,
    /// the session's error events and its logout.
    pub fn connect(
        provider: Arc<dyn Provider>,
        guid: Guid,
        connector: Arc<dyn Connector>,
        cfg: SessionConfig,
    ) -> Result<Session, SessionError> {
        let span = tracing::info_span!(
            "srp_session",
            ca = %guid,
            port = cfg.port.0,
            id_ext = format_args!("{:016x}", cfg.channel.id_ext),
            ioc_guid = %cfg.channel.ioc_guid,
            channel = cfg.channel.channel_index,
        );
        let logged_in =
            span.in_scope(|| Session::log_in(provider, guid, connector, cfg, span.clone()));
        match &logged_in {
            Ok(s) => tracing::debug!(
                parent: &span,
                max_it_iu_len = s.inner.negotiated.max_it_iu_len,
                req_lim = s.inner.negotiated.req_lim,
                "logged in"
            ),
            Err(e) => tracing::debug!(parent: &span, error = %e, "login failed"),
        }
        logged_in
    }

    fn log_in(
        provider: Arc<dyn Provider>,
        guid: Guid,
        connector: Arc<dyn Connector>,
        cfg: SessionConfig,
        span: tracing::Span,
    ) -> Result<Session, SessionError> {
        let mut channel = Channel::new(cfg.channel.clone())?;
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(Wake {
            tx: Mutex::new(tx.clone()),
            inner: std::sync::OnceLock::new(),
        });
        let p = &provider;
        let ca = p
            .open_ca(guid, 0, wake.clone())
            .map_err(verbs_err("open CA"))?;
        let port = match p.query_port(ca, cfg.port) {
            Ok(port) if port.state == verbs::PortState::Active => port,
            Ok(port) => {
                let _ = p.close_ca(ca);
                return Err(SessionError::PortNotActive {
                    port: cfg.port.0,
                    state: port.state,
                });
            }
            Err(e) => {
                let _ = p.close_ca(ca);
                return Err(verbs_err("query port")(e));
            }
        };
        let gid = *port
            .gids
            .get(cfg.sgid_index as usize)
            .ok_or(SessionError::Verbs {
                what: "port GID",
                err: verbs::VerbsError::InvalidArgument("no GID at that index".into()),
            })?;
        let pkey_ix = match cfg.pkey {
            None => 0,
            Some(k) => match pkey_index(&port.pkeys, k) {
                Some(i) => i,
                None => {
                    let _ = p.close_ca(ca);
                    let table: Vec<String> = port
                        .pkeys
                        .iter()
                        .filter(|k| k.0 & 0x7fff != 0)
                        .map(|k| format!("{:04x}", k.0))
                        .collect();
                    return Err(SessionError::NoSuchPkey {
                        pkey: k.0,
                        table: table.join(", "),
                    });
                }
            },
        };
        let pd = p.alloc_pd(ca, 0).map_err(verbs_err("allocate PD"))?;
        let queue = u32::from(cfg.channel.can_queue) + 2;
        // Receives: every command's answer plus target requests (CRED_REQ,
        // AER_REQ, T_LOGOUT) in flight at once, and those handled but
        // waiting to be posted again with their batch.
        let recv_count = queue + 8 + REPOST_BATCH;
        // One send more than commands and answers need: the probe; with
        // register_always, each command's binds ahead of its SRP_CMD and
        // its invalidations after its answer (unsignaled: they hold their
        // places until a later SEND completes).
        let sends = if cfg.register_always {
            (queue + 1) * (2 * WINDOWS_PER_CMD as u32 + 1)
        } else {
            queue + 1
        };
        let cq = p
            .create_cq(
                pd,
                &CqInit {
                    // A flushed QP completes every request, unsignaled too.
                    cqe: recv_count + sends + 1,
                },
                0,
            )
            .map_err(verbs_err("create CQ"))?;
        let qp = p
            .create_qp(pd, &QpInit::rc(cq, sends, recv_count), 0)
            .map_err(verbs_err("create QP"))?;
        let psn = Psn::new(0x2b_0000 ^ (std::process::id() & 0xffff));
        let mtu = port.active_mtu;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(cfg.port),
                pkey_index: Some(pkey_ix),
                // The target moves data with RDMA READ and WRITE into our pool.
                access: Some(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to INIT"))?;

        let req = channel
            .login_request()
            .map_err(|e| SessionError::Connect(ConnectError::Failed(e.to_string())))?;
        let form = connector.form();
        let mut login = vec![0u8; 64];
        let n = match form {
            LoginForm::IbCm => req.emit(&mut login),
            LoginForm::RdmaCm => req.emit_rdma(&mut login),
        }
        .map_err(|e| SessionError::Connect(ConnectError::Failed(e.to_string())))?;
        login.truncate(n);

        // Receive buffers must be posted before the REP can be answered
        // with traffic; size them for the largest target IU we accept.
        // Whole cache lines, so each buffer starts word-aligned (a copy
        // between aligned buffers moves whole words).
        let recv_size = 4096u32
            .max(cfg.channel.max_it_iu_len(true))
            .next_multiple_of(64);
        let recv_buf = MemBuf::new((recv_size * recv_count) as usize);
        let recv_mr = p
            .reg_mr(
                pd,
                &recv_buf,
                recv_buf.addr(),
                recv_buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(verbs_err("register receive ring"))?;
        let recvs: Vec<RecvWr> = (0..recv_count)
            .map(|i| recv_wr(&recv_buf, &recv_mr, recv_size, i))
            .collect();
        p.post_recv(qp, &recvs)
            .map_err(verbs_err("post receives"))?;

        let local = QpInfo {
            qpn: p.qp_num(qp).map_err(verbs_err("QP number"))?,
            psn,
            gid,
            lid: port.lid,
            mtu,
        };
        let connected = match connector.connect(&login, local) {
            Ok(c) => c,
            Err(ConnectError::Rejected(data)) => {
                let err = channel
                    .handle_login_response(rdma_types::Instant::ZERO, &data)
                    .err()
                    .map(SessionError::Login)
                    .unwrap_or(SessionError::Connect(ConnectError::Rejected(data)));
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(err);
            }
            Err(e) => {
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(e.into());
            }
        };
        let epoch = std::time::Instant::now();
        let negotiated = match channel
            .handle_login_response(rdma_types::Instant::ZERO, &connected.private_data)
        {
            Ok(n) => n,
            Err(e) => {
                connector.disconnect(connected.handle);
                teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
                return Err(e.into());
            }
        };
        let peer = connected.peer;
        let to_rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr {
                dlid: peer.lid,
                port: cfg.port,
                grh: true,
                dgid: peer.gid,
                sgid_index: cfg.sgid_index,
                sl: 0,
                hop_limit: 64,
            }),
            path_mtu: Some(if peer.mtu.bytes() < mtu.bytes() {
                peer.mtu
            } else {
                mtu
            }),
            dest_qpn: Some(peer.qpn),
            rq_psn: Some(connected.local_psn.unwrap_or(psn)),
            // The target fetches data-out with RDMA READs: as many in flight
            // as it may issue (its initiator depth, 16).
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..Default::default()
        };
        let to_rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(peer.psn),
            timeout: Some(14),
            retry_cnt: Some(cfg.retry_cnt.min(7)),
            rnr_retry: Some(7),
            max_rd_atomic: Some(0),
            ..Default::default()
        };
        if let Err(e) = p
            .modify_qp(qp, &to_rtr)
            .and_then(|_| p.modify_qp(qp, &to_rts))
        {
            connector.disconnect(connected.handle);
            teardown(p, ca, pd, cq, qp, &[recv_mr.handle]);
            return Err(SessionError::Verbs {
                what: "connect QP",
                err: e,
            });
        }

        let slot_size = negotiated.max_it_iu_len.max(64).next_multiple_of(64);
        let slots = queue;
        let send_buf = MemBuf::new((slot_size * slots) as usize);
        let send_mr = p
            .reg_mr(
                pd,
                &send_buf,
                send_buf.addr(),
                send_buf.len() as u64,
                AccessFlags::NONE,
                0,
            )
            .map_err(verbs_err("register send ring"))?;
        let pool = MemBuf::new(cfg.pool_bytes.max(PAGE).div_ceil(PAGE) * PAGE);
        let bind = if cfg.register_always {
            AccessFlags::MW_BIND
        } else {
            AccessFlags::NONE
        };
        let pool_mr = p
            .reg_mr(
                pd,
                &pool,
                pool.addr(),
                pool.len() as u64,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_WRITE
                    | bind,
                0,
            )
            .map_err(verbs_err("register data pool"))?;
        // One window per command the queue holds, made now so a NIC
        // without windows refuses the login, not the first command.
        let mut windows = Vec::new();
        if cfg.register_always {
            for _ in 0..queue {
                match p.alloc_mw(pd, MwType::Type2, 0) {
                    Ok(w) => windows.push(w),
                    Err(e) => {
                        for (w, _) in windows {
                            let _ = p.dealloc_mw(w);
                        }
                        teardown(
                            p,
                            ca,
                            pd,
                            cq,
                            qp,
                            &[recv_mr.handle, send_mr.handle, pool_mr.handle],
                        );
                        return Err(SessionError::Verbs {
                            what: "allocate a memory window for register_always (a NIC \
                                   without them: log in without register_always)",
                            err: e,
                        });
                    }
                }
            }
        }
        p.req_notify_cq(cq, false).map_err(verbs_err("arm CQ"))?;
        let pages = pool.len() / PAGE;
        let inner = Arc::new(Inner {
            provider: provider.clone(),
            connector,
            guid,
            port: cfg.port,
            ca,
            pd,
            cq,
            qp,
            recv_buf,
            recv_mr,
            recv_size,
            send_buf,
            send_mr,
            slot_size,
            pool,
            pool_mr,
            page: PAGE,
            max_segment: cfg.max_segment,
            cmd_sg_entries: cfg.channel.cmd_sg_entries,
            allow_ext_sg: cfg.channel.allow_ext_sg,
            sg_tablesize: cfg.sg_tablesize.max(1),
            register_always: cfg.register_always,
            negotiated,
            probe_interval: cfg.probe_interval,
            changes: cfg.changes.clone(),
            alua_changes: Default::default(),
            handle: connected.handle,
            epoch,
            span,
            st: Mutex::new(State {
                channel,
                free_slots: (0..slots).rev().collect(),
                slot_ids: vec![None; slots as usize],
                done: Default::default(),
                pages: PageMap::new(pages),
                tables: IdMap::default(),
                events: VecDeque::new(),
                tmfs_done: 0,
                last_tmf: None,
                stats: SessionStats::default(),
                closed: false,
                parked: Default::default(),
                reaper: None,
                spin: Spin::new(reap::SPIN_MAX),
                drive_spin: Spin::new(reap::DRIVE_SPIN_MAX),
                drove: false,
                waiting: 0,
                provider_drives: false,
                wake: Vec::new(),
                retried: IdMap::default(),
                cv_waiters: 0,
                posts: Posts::default(),
                flushing: false,
                flush_bufs: Default::default(),
                iu_buf: Vec::new(),
                reposts: Vec::with_capacity(REPOST_BATCH as usize),
                batching: None,
                batch_now: None,
                timer_sleep: None,
                quiet_since: rdma_types::Instant::ZERO,
                probe_out: false,
                windows_made: windows.iter().map(|(w, _)| *w).collect(),
                windows,
                bound: IdMap::default(),
            }),
            reaper_polls: Default::default(),
            cv: Condvar::new(),
            events: Mutex::new(tx),
        });
        let _ = wake.inner.set(Arc::downgrade(&inner));
        // Completions that came before now go through the poll thread.
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Cq));
        let poller = inner.clone();
        let handle = std::thread::Builder::new()
            .name("srp-poll".into())
            .spawn(move || poller.poll_loop(rx))?;
        Ok(Session {
            inner,
            poller: Some(handle),
        })
    }
}

/// Logs a session out and frees its verbs objects: disconnect (a DREQ,
/// which over a dead link waits for the CM's retries to run out), fail
/// what is still outstanding, stop and join the poll thread, destroy.
pub(super) fn shutdown(inner: &Inner, poller: Option<JoinHandle<()>>) {
    let _span = inner.span.enter();
    inner.connector.disconnect(inner.handle);
    {
        let mut st = inner.lock();
        let _ = inner.provider.modify_qp(
            inner.qp,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        );
        st.channel.disconnected(false);
        inner.drain_channel(&mut st);
        st.closed = true;
    }
    inner.cv.notify_all();
    let _ = inner.events.lock().map(|tx| tx.send(Ev::Stop));
    if let Some(h) = poller {
        let _ = h.join();
    }
    // Windows first: the pool's registration is refused while one is
    // bound to it.
    let windows = std::mem::take(&mut inner.lock().windows_made);
    for w in windows {
        let _ = inner.provider.dealloc_mw(w);
    }
    teardown(
        &inner.provider,
        inner.ca,
        inner.pd,
        inner.cq,
        inner.qp,
        &[
            inner.recv_mr.handle,
            inner.send_mr.handle,
            inner.pool_mr.handle,
        ],
    );
    tracing::debug!("logged out");
}

pub(super) fn recv_wr(buf: &MemBuf, mr: &MrInfo, size: u32, i: u32) -> RecvWr {
    RecvWr {
        wr_id: KIND_RECV | i as u64,
        sges: verbs::sges![Sge {
            addr: buf.addr() + (i * size) as u64,
            length: size,
            lkey: mr.lkey,
        }],
    }
}

pub(super) fn teardown(
    p: &Arc<dyn Provider>,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    mrs: &[verbs::MrHandle],
) {
    let _ = p.destroy_qp(qp);
    for &m in mrs {
        let _ = p.dereg_mr(m);
    }
    let _ = p.destroy_cq(cq);
    let _ = p.dealloc_pd(pd);
    let _ = p.close_ca(ca);
}
