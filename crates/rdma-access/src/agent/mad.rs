//! The MAD driver under the agent: the special QPs (QP1, and QP0 where the
//! CA has an SMI), their receive and send rings, MAD agents for other
//! classes, and completions routed to the GSI dispatcher or the SMI.

use super::*;

/// The port's QP0 and its receive ring.
pub(super) struct Smi {
    pub(super) qp: QpHandle,
    pub(super) recv_buf: MemBuf,
    pub(super) recv_mr: MrInfo,
}

/// A special QP (QP0 or QP1) of port 1, in RTS, with room for 64 sends
/// and 64 receives (the CM agent's and `ib_sm`'s port use it).
///
/// # Errors
/// What the provider refuses; a QP made before the refusal is destroyed.
pub fn special_qp(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
    cq: CqHandle,
    qp_type: QpType,
    qkey: Qkey,
    port: PortNum,
) -> Result<QpHandle, verbs::VerbsError> {
    let qp = p.create_qp(
        pd,
        &QpInit {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: SENDS,
                max_recv_wr: RECVS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
            },
            sq_sig_all: true,
            port: Some(port),
        },
        0,
    )?;
    for attr in [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            qkey: Some(qkey),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            ..Default::default()
        },
    ] {
        if let Err(e) = p.modify_qp(qp, &attr) {
            let _ = p.destroy_qp(qp);
            return Err(e);
        }
    }
    Ok(qp)
}

/// Receive buffers for one special QP: 64 slots of GRH (40 bytes) + MAD
/// (256), registered for local write.
///
/// # Errors
/// What the provider refuses.
pub fn recv_ring(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
) -> Result<(MemBuf, MrInfo), verbs::VerbsError> {
    let buf = MemBuf::new((GRH + MAD) * RECVS as usize);
    let mr = p.reg_mr(
        pd,
        &buf,
        buf.addr(),
        buf.len() as u64,
        AccessFlags::LOCAL_WRITE,
        0,
    )?;
    Ok((buf, mr))
}

/// Send buffers for a special QP's MADs: 64 slots of 256 bytes.
///
/// # Errors
/// What the provider refuses.
pub fn send_ring(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
) -> Result<(MemBuf, MrInfo), verbs::VerbsError> {
    let buf = MemBuf::new(MAD * SENDS as usize);
    let mr = p.reg_mr(pd, &buf, buf.addr(), buf.len() as u64, AccessFlags::NONE, 0)?;
    Ok((buf, mr))
}

/// SMPs (LID-routed and directed-route) travel on QP0 only.
pub(super) fn is_smp(class: u8) -> bool {
    class == 0x01 || class == 0x81
}

impl CmAgent {
    /// Registers a MAD agent on this port's QP1 for `methods` of `class`
    /// and `version` (no methods: it only sends requests). See
    /// [`crate::gsi`] for the routing rules.
    ///
    /// # Errors
    /// Another agent serves one of the methods.
    pub fn mad_agent(&self, class: u8, version: u8, methods: &[u8]) -> Result<MadAgent, CmError> {
        let mut st = self.inner.lock();
        if st.stopped {
            return Err(CmError::Stopped);
        }
        let id = st
            .gsi
            .register(class, version, methods)
            .map_err(|e| CmError::Mad(e.to_string()))?;
        if let Err(e) = self.inner.track(&mut st, TrackKey::Agent(id)) {
            st.gsi.unregister(id);
            return Err(e);
        }
        // SMP classes are served on QP0, which this agent holds itself
        // where it has one: the shared QP1's owner has nothing to route.
        if !methods.is_empty() && !is_smp(class) {
            let told =
                self.inner
                    .provider
                    .gsi_register(self.inner.qp, class, version, methods, true);
            if let Err(e) = told {
                st.gsi.unregister(id);
                self.inner.untrack(&mut st, TrackKey::Agent(id));
                return Err(CmError::Mad(format!(
                    "class {class:#04x} version {version} on the shared QP1: {e}"
                )));
            }
            st.gsi_regs.insert(id, (class, version, methods.to_vec()));
        }
        let (tx, rx) = mpsc::channel();
        st.mad_rx.insert(id, tx);
        Ok(MadAgent {
            port: self.inner.clone(),
            id,
            rx: Mutex::new(rx),
        })
    }

    /// Counters of the port's MAD dispatcher.
    pub fn gsi_stats(&self) -> crate::gsi::GsiStats {
        self.inner.lock().gsi.stats()
    }

    /// True if the port has a QP0 (SMPs can be sent and received).
    pub fn has_smi(&self) -> bool {
        self.inner.smi.is_some()
    }

    /// Drops a seeded random share `loss` (0..1) of the MADs this port
    /// receives, every class alike: a fault knob for tests on providers
    /// without fault injection of their own. `None` turns it off.
    pub fn set_receive_loss(&self, loss: Option<(u64, f64)>) {
        self.inner.lock().loss = loss.map(|(seed, p)| (rdma_sim::Rng::new(seed), p));
    }
}

/// A MAD agent on a port's QP1 (from [`CmAgent::mad_agent`]); dropping it
/// unregisters it.
pub struct MadAgent {
    pub(super) port: Arc<Inner>,
    pub(super) id: AgentId,
    pub(super) rx: Mutex<Receiver<(Gid, Box<MadBytes>)>>,
}

/// What [`MadAgent::wait`] found.
#[derive(Debug)]
pub enum MadWait {
    /// An unsolicited request for the agent, and the port that sent it.
    Request(Gid, Box<MadBytes>),
    /// Nothing came in the time given.
    TimedOut,
    /// Nothing will come again: the agent was closed
    /// ([`MadAgentCloser::close`]) or its CA was removed. A loop serving
    /// the agent ends here rather than asking again, which would return at
    /// once every time.
    Closed,
}

impl MadAgent {
    /// The next unsolicited request for this agent, waiting at most
    /// `timeout`; `None` when the time passed or the agent is closed (see
    /// [`MadAgent::wait`] to tell them apart).
    pub fn recv(&self, timeout: StdDuration) -> Option<(Gid, Box<MadBytes>)> {
        match self.wait(timeout) {
            MadWait::Request(peer, mad) => Some((peer, mad)),
            MadWait::TimedOut | MadWait::Closed => None,
        }
    }

    /// The next unsolicited request for this agent, waiting at most
    /// `timeout`, or why there is none.
    pub fn wait(&self, timeout: StdDuration) -> MadWait {
        match self
            .rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(timeout)
        {
            Ok((peer, mad)) => MadWait::Request(peer, mad),
            Err(RecvTimeoutError::Timeout) => MadWait::TimedOut,
            Err(RecvTimeoutError::Disconnected) => MadWait::Closed,
        }
    }

    /// A handle another thread uses to close this agent's receiving side,
    /// so a thread blocked in [`MadAgent::wait`] returns at once with
    /// [`MadWait::Closed`]: a serving loop can then wait without a timeout
    /// to check a stop flag against.
    pub fn closer(&self) -> MadAgentCloser {
        MadAgentCloser {
            port: self.port.clone(),
            id: self.id,
        }
    }

    /// Sends `mad` (a response, or a request that wants none) to `peer`.
    pub fn send(&self, peer: Gid, mad: MadBytes) {
        let mut st = self.port.lock();
        st.gsi.send(peer, mad);
        self.port.flush(&mut st);
    }

    /// Sends a response too large for one MAD as an RMPP transfer (see
    /// [`crate::gsi::Dispatcher::send_rmpp`]): `header` is the response's
    /// headers (TID, method, class header), `data` the payload.
    ///
    /// # Errors
    /// The header is too short for its class.
    pub fn send_rmpp(
        &self,
        peer: Gid,
        header: &[u8],
        data: &[u8],
        timeout: StdDuration,
        retries: u32,
    ) -> Result<(), CmError> {
        let mut st = self.port.lock();
        let now = self.port.now();
        let t = rdma_types::Duration::from_micros(timeout.as_micros() as u64);
        st.gsi
            .send_rmpp(now, peer, header, data, t, retries)
            .map_err(|e| CmError::Mad(e.to_string()))?;
        self.port.flush(&mut st);
        drop(st);
        self.port.kick();
        Ok(())
    }

    /// Sends request `mad` to `peer` (with a fresh transaction ID) and waits
    /// for the response, resending every `timeout` up to `retries` times.
    /// An RMPP response comes back cut to its first 256 bytes: see
    /// [`MadAgent::request_long`].
    ///
    /// # Errors
    /// No response after every retry, or the port stopped.
    pub fn request(
        &self,
        peer: Gid,
        mad: MadBytes,
        timeout: StdDuration,
        retries: u32,
    ) -> Result<Box<MadBytes>, CmError> {
        let r = self.request_long(peer, mad, timeout, retries)?;
        let mut m = Box::new([0u8; MAD]);
        let n = r.len().min(MAD);
        m[..n].copy_from_slice(&r[..n]);
        Ok(m)
    }

    /// As [`MadAgent::request`], with the whole response: one MAD, or an
    /// RMPP transfer's first headers followed by all its data.
    ///
    /// # Errors
    /// No response after every retry, or the port stopped.
    pub fn request_long(
        &self,
        peer: Gid,
        mad: MadBytes,
        timeout: StdDuration,
        retries: u32,
    ) -> Result<Vec<u8>, CmError> {
        let (tx, rx) = mpsc::channel();
        {
            let mut st = self.port.lock();
            if st.stopped {
                return Err(CmError::Stopped);
            }
            let now = self.port.now();
            let t = rdma_types::Duration::from_micros(timeout.as_micros() as u64);
            let tid = st.gsi.send_request(now, self.id, peer, mad, t, retries);
            st.mad_waiters.insert(tid, tx);
            self.port.flush(&mut st);
        }
        self.port.kick();
        // The dispatcher's own timers end the wait (an RMPP transfer
        // resets them per segment); this bound only covers a port that
        // stopped meanwhile.
        let bound = timeout * (retries + 2) + StdDuration::from_secs(5);
        match rx.recv_timeout(bound) {
            Ok(Some(m)) => Ok(m),
            Ok(None) | Err(_) => Err(CmError::TimedOut),
        }
    }
}

impl MadAgent {
    /// Puts a subscription to `trap` with the SA at `sa` in the tracking
    /// client's tree (if the port has one).
    pub(crate) fn track_subscription(&self, sa: Gid, trap: u16) -> Result<(), CmError> {
        let mut st = self.port.lock();
        self.port.track(&mut st, TrackKey::Sub(sa, trap))
    }

    /// The subscription ended (or never began).
    pub(crate) fn untrack_subscription(&self, sa: Gid, trap: u16) {
        let mut st = self.port.lock();
        self.port.untrack(&mut st, TrackKey::Sub(sa, trap));
    }
}

/// Closes a [`MadAgent`]'s receiving side from another thread
/// ([`MadAgent::closer`]). Requests that come after are dropped; the agent
/// stays registered (its sends work) until it is dropped.
pub struct MadAgentCloser {
    pub(super) port: Arc<Inner>,
    pub(super) id: AgentId,
}

impl MadAgentCloser {
    /// Closes the agent's receiving side (again is harmless).
    pub fn close(&self) {
        self.port.lock().mad_rx.remove(&self.id);
    }
}

impl Drop for MadAgent {
    fn drop(&mut self) {
        let mut st = self.port.lock();
        st.gsi.unregister(self.id);
        self.port.gsi_unregister(&mut st, self.id);
        st.mad_rx.remove(&self.id);
        self.port.untrack(&mut st, TrackKey::Agent(self.id));
    }
}

/// The receive of slot `i` of a [`recv_ring`], its work-request ID `tag`
/// with the slot number in the low bits.
pub fn recv_wr(buf: &MemBuf, mr: &MrInfo, i: u32, tag: u64) -> RecvWr {
    RecvWr {
        wr_id: tag | i as u64,
        sges: verbs::sges![Sge {
            addr: buf.addr() + (i as usize * (GRH + MAD)) as u64,
            length: (GRH + MAD) as u32,
            lkey: mr.lkey,
        }],
    }
}

/// The sender's GID from the 40-byte area in front of a UD receive: an IB
/// GRH (source GID at 8), or on RoCEv2 over IPv4 an IPv4 header in the last
/// 20 bytes (source address at 32). `grh` is at least 40 bytes.
pub fn source_gid(grh: &[u8]) -> Gid {
    if grh[20] == 0x45 {
        let ip = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        Gid::from_ip(ip.into())
    } else {
        Gid(grh[8..24].try_into().expect("16 bytes"))
    }
}

/// The 40 bytes a UD receive holds in front of a MAD from `sgid`, as a
/// NIC writes them (what [`source_gid`] reads): on RoCEv2 over IPv4 an
/// IPv4 header in the last 20 (source address at 32), else an IB GRH
/// (source GID at 8). For providers that fill GSI receives themselves.
pub fn ud_grh(sgid: Gid) -> [u8; GRH] {
    let mut g = [0u8; GRH];
    match sgid.to_ipv4().filter(|_| sgid.is_ipv4_mapped()) {
        Some(v4) => {
            g[20] = 0x45;
            g[32..36].copy_from_slice(&v4.octets());
        }
        None => {
            g[0] = 0x60;
            g[8..24].copy_from_slice(&sgid.0);
        }
    }
    g
}

impl Inner {
    /// Tells the provider agent `id` serves nothing more (a shared QP1).
    pub(super) fn gsi_unregister(&self, st: &mut State, id: AgentId) {
        if let Some((class, version, methods)) = st.gsi_regs.remove(&id) {
            let _ = self
                .provider
                .gsi_register(self.qp, class, version, &methods, false);
        }
    }

    pub(super) fn drain_cq(&self) {
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
        let mut armed = false;
        loop {
            let n = match self.provider.poll_cq(self.cq, &mut wcs) {
                Ok(n) => n,
                Err(_) => return,
            };
            for wc in &wcs[..n] {
                self.on_wc(wc);
            }
            if n == 0 {
                if armed || self.provider.req_notify_cq(self.cq, false).is_err() {
                    return;
                }
                armed = true;
            }
        }
    }

    pub(super) fn on_wc(&self, wc: &WorkCompletion) {
        let mut st = self.lock();
        if wc.wr_id & KIND_SEND != 0 {
            st.free_sends.push((wc.wr_id & !KIND_SEND) as u32);
            self.flush(&mut st);
            return;
        }
        let i = wc.wr_id as u32;
        let (qp, buf, mr, tag) = match &self.smi {
            Some(s) if wc.wr_id & KIND_SMI != 0 => (s.qp, &s.recv_buf, &s.recv_mr, KIND_SMI),
            _ => (self.qp, &self.recv_buf, &self.recv_mr, 0),
        };
        if i >= RECVS {
            return;
        }
        if wc.status == WcStatus::Success && wc.byte_len as usize >= GRH + 24 {
            let off = i as usize * (GRH + MAD);
            let bytes = buf.to_vec(off, GRH + MAD);
            let peer = source_gid(&bytes[..GRH]);
            let _ = self.provider.post_recv(qp, &[recv_wr(buf, mr, i, tag)]);
            // An SMP belongs on QP0, anything else on QP1.
            if is_smp(bytes[GRH + 1]) != (tag == KIND_SMI) {
                st.gsi_misrouted += 1;
                return;
            }
            let lost = st.loss.as_mut().is_some_and(|(rng, p)| rng.chance(*p));
            if !lost {
                let now = self.now();
                let len = (wc.byte_len as usize).min(GRH + MAD) - GRH;
                st.gsi
                    .handle_mad_in(now, peer, wc.pkey_index, &bytes[GRH..GRH + len]);
                let calls = self.route_mads(&mut st, now);
                self.flush(&mut st);
                self.call_hooks(st, calls);
                return;
            }
        } else {
            let _ = self.provider.post_recv(qp, &[recv_wr(buf, mr, i, tag)]);
        }
        self.flush(&mut st);
    }

    /// Hands the dispatcher's deliveries to the CM, agents and blocked
    /// requesters; returns the consumer hooks that must run.
    pub(super) fn route_mads(&self, st: &mut State, now: Instant) -> Vec<Call> {
        let mut calls = Vec::new();
        while let Some(d) = st.gsi.poll_delivery() {
            match d {
                Delivery::Request { agent, peer, mad } if agent == st.cm_agent => {
                    if let Some((msg, extra)) = wire::decode(&mad[..]) {
                        st.cm.handle_msg(now, peer, msg);
                        // A REQ's Request event comes out of this very input.
                        calls.extend(self.take_events(st, extra));
                    }
                }
                Delivery::Request { agent, peer, mad } => {
                    if let Some(tx) = st.mad_rx.get(&agent) {
                        let _ = tx.send((peer, mad));
                    }
                }
                Delivery::Response { tid, mad, .. } => {
                    if let Some(tx) = st.mad_waiters.remove(&tid) {
                        let _ = tx.send(Some(mad));
                    }
                }
                Delivery::TimedOut { tid, .. } => {
                    if let Some(tx) = st.mad_waiters.remove(&tid) {
                        let _ = tx.send(None);
                    }
                }
            }
        }
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_a_provider_writes_reads_back_as_its_sender() {
        for ip in ["10.77.0.11", "fe80::1"] {
            let gid = Gid::from_ip(ip.parse().unwrap());
            assert_eq!(source_gid(&ud_grh(gid)), gid, "{ip}");
        }
        let v4 = ud_grh(Gid::from_ip([10, 77, 0, 11].into()));
        assert_eq!((v4[20], &v4[32..36]), (0x45, &[10u8, 77, 0, 11][..]));
        assert_eq!(ud_grh(Gid::from_ip("fe80::1".parse().unwrap()))[0], 0x60);
    }
}
