//! The IB CM through the agent: listening, connecting (to a GID, a path,
//! in a partition, with the consumer's QP), disconnecting, and the CM's
//! messages and events turned into MADs and consumer hooks.

use super::*;

impl CmAgent {
    /// Listens on `service_id`: connection requests arrive on the returned
    /// channel.
    /// On a tracked agent ([`CmAgent::track_in`]) the listen is a CM id
    /// of the client, ended when it closes; a closed client's agent
    /// listens no more (the channel is disconnected at once), nor does
    /// one whose provider refuses the listen ([`CmAgent::try_listen`]
    /// says why).
    pub fn listen(&self, service_id: u64) -> Receiver<Incoming> {
        match self.try_listen(service_id) {
            Ok(rx) => rx,
            Err(_) => mpsc::channel().1,
        }
    }

    /// [`CmAgent::listen`], or why not: the agent is stopped or its
    /// client closed ([`CmError::Stopped`]), or, where QP1 is shared (the
    /// NIC daemon's client), another process listens on the service
    /// ([`CmError::Verbs`], `Busy`).
    ///
    /// # Errors
    /// As above.
    pub fn try_listen(&self, service_id: u64) -> Result<Receiver<Incoming>, CmError> {
        let (tx, rx) = mpsc::channel();
        let mut st = self.inner.lock();
        self.inner.track(&mut st, TrackKey::Listen(service_id))?;
        // Where QP1 is shared, the service's REQs come here only once the
        // provider knows of the listen.
        let i = &self.inner;
        if let Err(err) = i.provider.gsi_listen(i.qp, service_id, true) {
            i.untrack(&mut st, TrackKey::Listen(service_id));
            return Err(CmError::Verbs {
                what: "listen on a shared QP1",
                err,
            });
        }
        st.cm.listen(service_id);
        st.listeners.insert(service_id, tx);
        Ok(rx)
    }

    /// Connects to `service_id` at the port with GID `peer`, offering QP
    /// `qpn` starting at `psn`; blocks until the REP (or REJ, or the last
    /// retry) and sends the RTU. The REQ is in the partition of index 0
    /// of the port's P_Key table, where a QP made without a choice is (on
    /// RoCE the default P_Key, as Linux rdma_cm sends): a QP at another
    /// index connects with [`CmAgent::connect_in_partition`].
    pub fn connect(
        &self,
        peer: Gid,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        self.connect_path(
            &self.path_to(peer),
            service_id,
            qpn,
            psn,
            private_data,
            timeout,
        )
    }

    /// [`CmAgent::connect`] with the REQ in partition `pkey`: the P_Key of
    /// the table entry QP `qpn` uses (IBA 12.6.5; the passive side puts
    /// its QP in the same partition or refuses).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_in_partition(
        &self,
        peer: Gid,
        pkey: Pkey,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let path = Path {
            pkey,
            ..self.path_to(peer)
        };
        self.connect_path(&path, service_id, qpn, psn, private_data, timeout)
    }

    /// The path to the port with GID `dgid` when nobody resolved one:
    /// this port's GID and active MTU, the partition of index 0 of its
    /// P_Key table, the configured packet lifetime (RoCE has no SA).
    pub fn path_to(&self, dgid: Gid) -> Path {
        let plt = self.inner.lock().cm.config().packet_life_time;
        Path {
            sgid: self.gid(),
            dgid,
            pkey: self.pkeys().first().copied().unwrap_or(Pkey::DEFAULT),
            mtu: self.mtu(),
            packet_life_time: plt,
        }
    }

    /// Connects over `path` (see [`CmAgent::connect`]): the REQ is in
    /// its partition, offers its MTU (at most the port's) and waits for
    /// the REP by its packet lifetime (twice, plus the peer's CM
    /// response time).
    pub fn connect_path(
        &self,
        path: &Path,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let offer = Offer {
            params: QpParams::DEFAULT,
            mtu: path.mtu,
        };
        let (conn, rx) = self.send_req(path, service_id, qpn, psn, private_data, offer, false)?;
        self.wait_answer(conn, rx, timeout)
    }

    /// Connects `qp` over `path` and readies it, as Linux `rdma_connect`
    /// with a QP: INIT (from RESET) in the path's partition before the
    /// REQ; on the REP, RTR with the responder's QPN, receiving from
    /// `psn` (the REQ's starting PSN: what this side expects, IBA
    /// 12.7.25), the path MTU and the READs it may have outstanding (at
    /// most `qp.params`), then RTS sending from the REP's starting PSN,
    /// with the REQ's retry count, the REP's RNR
    /// retry count, the path's local ACK timeout (packet lifetime + 1)
    /// and the READs the responder takes, and only then the RTU. If a
    /// transition fails the REP is rejected (consumer defined) and the
    /// error returned.
    ///
    /// # Errors
    /// As [`CmAgent::connect`]; [`CmError::Verbs`] when the QP could not
    /// be readied; the path's partition missing from the port's table.
    pub fn connect_qp(
        &self,
        path: &Path,
        service_id: u64,
        qp: &ConnQp,
        psn: Psn,
        private_data: Vec<u8>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        let index = self
            .pkeys()
            .iter()
            .position(|k| *k == path.pkey)
            .ok_or_else(|| CmError::Verbs {
                what: "P_Key index",
                err: verbs::VerbsError::InvalidArgument(format!(
                    "P_Key {:04x} is not in the port's table",
                    path.pkey.0
                )),
            })?;
        let qpn = qp.init(self.inner.port, index as u16)?;
        let offer = Offer {
            params: qp.params,
            mtu: path.mtu,
        };
        let (conn, rx) = self.send_req(path, service_id, qpn, psn, private_data, offer, true)?;
        let rep = self.wait_answer(conn, rx, timeout)?;
        let theirs = self
            .inner
            .lock()
            .meta
            .get(&conn)
            .and_then(|m| m.peer_params)
            .unwrap_or(QpParams::DEFAULT);
        let mine = qp.params;
        let ready = Ready {
            peer: path.dgid,
            mtu: if path.mtu.bytes() < self.mtu().bytes() {
                path.mtu
            } else {
                self.mtu()
            },
            remote_qpn: rep.remote_qpn,
            remote_psn: rep.remote_psn,
            psn,
            responder_resources: mine.responder_resources.min(theirs.initiator_depth),
            initiator_depth: mine.initiator_depth.min(theirs.responder_resources),
            timeout: self
                .inner
                .lock()
                .cm
                .config()
                .timing(path.packet_life_time)
                .local_ack_timeout()
                .value(),
            retry_count: mine.retry_count,
            rnr_retry: theirs.rnr_retry_count,
        };
        let r = qp.connect(&ready);
        let mut st = self.inner.lock();
        let sent = match &r {
            Ok(()) => st.cm.ready(conn),
            Err(_) => {
                st.cm
                    .reject_reply(conn, RejReason::CONSUMER_DEFINED, Vec::new());
                st.meta.remove(&conn);
                self.inner.untrack(&mut st, TrackKey::Conn(conn));
                false
            }
        };
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
        r?;
        if !sent {
            // Abandoned meanwhile (the client closed, the CA went).
            return Err(self.inner.gone());
        }
        Ok(rep)
    }

    /// Sends the REQ of a new connection; the receiver hears its answer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_req(
        &self,
        path: &Path,
        service_id: u64,
        qpn: Qpn,
        psn: Psn,
        private_data: Vec<u8>,
        offer: Offer,
        hold_rtu: bool,
    ) -> Result<(ConnId, Receiver<Result<Established, CmError>>), CmError> {
        let (tx, rx) = mpsc::channel();
        let mut st = self.inner.lock();
        if self.inner.removed.load(Ordering::SeqCst) {
            return Err(CmError::DeviceRemoved);
        }
        if st.stopped || st.tracker.as_ref().is_some_and(|t| !t.is_open()) {
            return Err(CmError::Stopped);
        }
        let now = self.inner.now();
        let timing = st.cm.config().timing(path.packet_life_time);
        let req = rdma_cm::ReqInfo {
            service_id,
            qpn,
            psn,
            pkey: path.pkey,
            timing,
            private_data,
        };
        let conn = st.cm.connect_req(now, vec![path.dgid], req);
        if hold_rtu {
            st.cm.hold_rtu(conn);
        }
        if let Err(e) = self.inner.track(&mut st, TrackKey::Conn(conn)) {
            // Closed just now: the REQ is not sent again.
            st.cm.abandon(conn);
            return Err(e);
        }
        st.waiting.insert(conn, tx);
        st.meta.insert(
            conn,
            Meta {
                remote_qpn: Qpn::from_bits(0),
                local_qpn: qpn,
                pkey: path.pkey,
                offer,
                peer_params: None,
            },
        );
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
        Ok((conn, rx))
    }

    /// Waits for the answer to a REQ, at most `timeout`.
    pub(super) fn wait_answer(
        &self,
        conn: ConnId,
        rx: Receiver<Result<Established, CmError>>,
        timeout: StdDuration,
    ) -> Result<Established, CmError> {
        if let Ok(r) = rx.recv_timeout(timeout) {
            return r;
        }
        // Given up: no REQ goes out again (a late one would log in behind
        // the caller's back), unless the answer came meanwhile.
        let mut st = self.inner.lock();
        if let Ok(r) = rx.try_recv() {
            return r;
        }
        st.cm.abandon(conn);
        st.waiting.remove(&conn);
        st.meta.remove(&conn);
        self.inner.untrack(&mut st, TrackKey::Conn(conn));
        Err(CmError::TimedOut)
    }

    /// Starts a disconnect (DREQ); idempotent. An accepted connection
    /// still waiting for its RTU is refused instead (REJ) and gone at once.
    pub fn disconnect(&self, conn: ConnId) {
        let mut st = self.inner.lock();
        let now = self.inner.now();
        let unanswered = st.cm.state(conn) == rdma_cm::ConnState::RepSent;
        if st.cm.disconnect(now, conn) && unanswered {
            st.meta.remove(&conn);
            self.inner.untrack(&mut st, TrackKey::Conn(conn));
        }
        self.inner.flush(&mut st);
        drop(st);
        self.inner.kick();
    }

    /// Disconnects and waits, at most `within`, for the DREP (or the DREQ
    /// to time out): a process about to exit has then really told the
    /// peer, which otherwise keeps the connection and rejects the next
    /// login from the same CA as stale. True if the DREP came.
    pub fn disconnect_wait(&self, conn: ConnId, within: std::time::Duration) -> bool {
        self.disconnect(conn);
        let end = std::time::Instant::now() + within;
        loop {
            if self.state(conn) != rdma_cm::ConnState::DreqSent {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The state of a connection.
    pub fn state(&self, conn: ConnId) -> rdma_cm::ConnState {
        self.inner.lock().cm.state(conn)
    }
}

impl Inner {
    pub(super) fn flush(&self, st: &mut State) {
        let local = self.local;
        while let Some((peer, msg)) = st.cm.poll_transmit() {
            st.next_tid += 1;
            let tid = st.next_tid;
            let meta = match &msg {
                CmMsg::Dreq { local_comm_id, .. }
                | CmMsg::Req { local_comm_id, .. }
                | CmMsg::Rep { local_comm_id, .. } => st.meta.get(&ConnId(*local_comm_id)),
                _ => None,
            };
            let peer_qpn = match &msg {
                CmMsg::Dreq { .. } => meta.map_or(Qpn::from_bits(0), |m| m.remote_qpn),
                _ => Qpn::from_bits(0),
            };
            let offer = meta.map_or(
                Offer {
                    params: QpParams::DEFAULT,
                    mtu: local.mtu,
                },
                |m| m.offer,
            );
            let msg = match (msg, st.rtu_fault) {
                (
                    CmMsg::Rtu {
                        local_comm_id,
                        remote_comm_id,
                    },
                    fault,
                ) if fault != RtuFault::None => {
                    if fault == RtuFault::Drop {
                        continue;
                    }
                    st.cm.forget(ConnId(local_comm_id));
                    st.meta.remove(&ConnId(local_comm_id));
                    self.untrack(st, TrackKey::Conn(ConnId(local_comm_id)));
                    CmMsg::Rej {
                        local_comm_id,
                        remote_comm_id,
                        msg: rdma_cm::MsgKind::Rep,
                        reason: RejReason::CONSUMER_DEFINED,
                        private_data: Vec::new(),
                    }
                }
                (msg, _) => msg,
            };
            // The connection's partition: the REQ's P_Key, at the entry of
            // this port's table that holds it.
            let index = st
                .meta
                .get(&ConnId(local_comm_id(&msg)))
                .and_then(|m| self.pkey_index(m.pkey));
            let mad = wire::encode(&msg, tid, &local, peer, peer_qpn, &offer);
            match index {
                Some(i) => st.gsi.send_in(peer, mad, i),
                None => st.gsi.send(peer, mad),
            }
        }
        while let Some((peer, mad)) = st.gsi.poll_transmit() {
            st.backlog.push_back((peer, *mad));
        }
        while let Some(slot) = st.free_sends.last().copied() {
            let Some((peer, mad)) = st.backlog.pop_front() else {
                break;
            };
            let (qp, dest_qpn, qkey) = match (&self.smi, is_smp(mad[1])) {
                (_, false) => (self.qp, Qpn::GSI, Qkey::GSI),
                (Some(s), true) => (s.qp, Qpn::from_bits(0), Qkey(0)),
                // No QP0 on this provider: SMPs cannot leave.
                (None, true) => continue,
            };
            let ah = match st.ahs.get(&peer) {
                Some(a) => *a,
                // The PD is gone (the tree gave it back): no new AH on it.
                None if self.is_released(Part::Pd) => continue,
                None => {
                    let attr = AhAttr::roce(peer);
                    match self.provider.create_ah(self.pd, &attr) {
                        Ok(a) => {
                            st.ahs.insert(peer, a);
                            a
                        }
                        Err(_) => continue,
                    }
                }
            };
            st.free_sends.pop();
            let off = slot as usize * MAD;
            self.send_buf.write_at(off, &mad);
            let mut wr = SendWr::new(
                KIND_SEND | slot as u64,
                SendOpcode::Send,
                vec![Sge {
                    addr: self.send_buf.addr() + off as u64,
                    length: MAD as u32,
                    lkey: self.send_mr.lkey,
                }],
            );
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: dest_qpn,
                remote_qkey: qkey,
            });
            // A response goes in its request's partition.
            wr.pkey_index = st.gsi.pkey_index_for(peer, &mad);
            if self.provider.post_send(qp, &[wr]).is_err() {
                st.free_sends.push(slot);
            }
        }
    }

    /// Routes state machine events and sends what they queued; returns the
    /// consumer hooks that must run (without the lock).
    pub(super) fn take_events(&self, st: &mut State, extra: Option<Extra>) -> Vec<Call> {
        let mut calls: Vec<Call> = Vec::new();
        while let Some(ev) = st.cm.poll_event() {
            let waited = st.waiting.contains_key(&ev.conn());
            calls.extend(hook_for(&ev, waited));
            match ev {
                CmEvent::Request { conn, peer, req } => {
                    let Some(agent) = self.me.upgrade() else {
                        continue;
                    };
                    // A REQ in a partition the port is not in: refused as
                    // Linux ib_cm does when the REQ's P_Key is not in the
                    // port's table (primary path refused, IBA reason 12).
                    if !self.pkeys().iter().any(|k| k.matches(req.pkey)) {
                        st.pkey_refusals += 1;
                        st.cm.reject(conn, RejReason::INVALID_GID, Vec::new());
                        continue;
                    }
                    let mtu = extra.and_then(|x| x.mtu).unwrap_or(self.local.mtu);
                    let params = extra.map_or(QpParams::DEFAULT, |x| x.params);
                    st.meta.insert(
                        conn,
                        Meta {
                            remote_qpn: req.qpn,
                            local_qpn: Qpn::from_bits(0),
                            pkey: req.pkey,
                            offer: Offer {
                                params: QpParams::DEFAULT,
                                mtu,
                            },
                            peer_params: Some(params),
                        },
                    );
                    let incoming = Incoming {
                        conn,
                        peer,
                        remote_qpn: req.qpn,
                        remote_psn: req.psn,
                        mtu,
                        pkey: req.pkey,
                        service_id: req.service_id,
                        timing: req.timing,
                        params,
                        private_data: req.private_data,
                        agent,
                    };
                    let delivered = st.listeners.contains_key(&req.service_id)
                        && self.track(st, TrackKey::Conn(conn)).is_ok()
                        && st
                            .listeners
                            .get(&req.service_id)
                            .is_some_and(|tx| tx.send(incoming).is_ok());
                    if !delivered {
                        self.untrack(st, TrackKey::Conn(conn));
                        st.cm
                            .reject(conn, RejReason::INVALID_SERVICE_ID, Vec::new());
                    }
                }
                CmEvent::Established {
                    conn,
                    remote_qpn,
                    remote_psn,
                    private_data,
                } => {
                    if let Some(m) = st.meta.get_mut(&conn) {
                        m.remote_qpn = remote_qpn;
                    }
                    // Passive (nobody waits): the RTU of a connection a
                    // listener accepted, for the established hook.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Ok(Established {
                            conn,
                            remote_qpn,
                            remote_psn,
                            private_data,
                            local_psn: None,
                        }));
                    }
                }
                // A REP held for a consumer readying its QP: the one
                // waiting in `connect_qp` does it; nobody waits any more
                // (it gave up), the REP is refused.
                CmEvent::Reply {
                    conn,
                    remote_qpn,
                    remote_psn,
                    private_data,
                } => {
                    if let Some(m) = st.meta.get_mut(&conn) {
                        m.remote_qpn = remote_qpn;
                        m.peer_params = extra.map(|x| x.params);
                    }
                    let est = Established {
                        conn,
                        remote_qpn,
                        remote_psn,
                        private_data,
                        local_psn: None,
                    };
                    let taken = st
                        .waiting
                        .remove(&conn)
                        .is_some_and(|tx| tx.send(Ok(est)).is_ok());
                    if !taken {
                        st.cm.reject_reply(conn, RejReason::TIMEOUT, Vec::new());
                        st.meta.remove(&conn);
                        self.untrack(st, TrackKey::Conn(conn));
                    }
                }
                CmEvent::Rejected {
                    conn,
                    reason,
                    private_data,
                } => {
                    let meta = st.meta.remove(&conn);
                    self.untrack(st, TrackKey::Conn(conn));
                    // Passive (nobody waits): the requester refused our
                    // REP (Linux ib_srp does when it does not like the
                    // login response). The consumer accepted the
                    // connection and holds what it made for it: its
                    // disconnect hook releases that now, not never.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let mut words = rdma_mad::cm::RejReason::from(reason.0).to_string();
                        if let (RejReason::INVALID_GID, Some(m)) = (reason, meta) {
                            words += &format!(
                                " (the REQ was in partition P_Key {:04x}: the peer's port may not be a member)",
                                m.pkey.0
                            );
                        }
                        let _ = tx.send(Err(CmError::Rejected {
                            reason: words,
                            code: reason.0,
                            private_data,
                        }));
                    }
                }
                CmEvent::TimedOut { conn } => {
                    self.untrack(st, TrackKey::Conn(conn));
                    // Nobody waits: the disconnect hook.
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Err(CmError::TimedOut));
                    }
                }
                CmEvent::DisconnectRequested { .. } | CmEvent::Disconnected { .. } => {}
                CmEvent::TimewaitExit { conn } => {
                    st.meta.remove(&conn);
                    self.untrack(st, TrackKey::Conn(conn));
                }
            }
        }
        self.flush(st);
        calls
    }
}

/// The comm ID a CM message names as its sender's: ours, for what we send.
pub(super) fn local_comm_id(msg: &CmMsg) -> u32 {
    match msg {
        CmMsg::Req { local_comm_id, .. }
        | CmMsg::Mra { local_comm_id, .. }
        | CmMsg::Rej { local_comm_id, .. }
        | CmMsg::Rep { local_comm_id, .. }
        | CmMsg::Rtu { local_comm_id, .. }
        | CmMsg::Dreq { local_comm_id, .. }
        | CmMsg::Drep { local_comm_id, .. } => *local_comm_id,
    }
}
