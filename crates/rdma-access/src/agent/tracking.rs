//! Resource tracking and device removal: what the agent holds is counted
//! in the access layer's tracker, and a CA that goes away ends every
//! connection and listener on it, telling their consumers.

use super::*;

/// An object of the agent that a tracking client's tree holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum TrackKey {
    /// The agent itself (its CM class registration and thread).
    Port,
    /// A connection, from its REQ to the end of timewait.
    Conn(ConnId),
    /// A listen on a service ID.
    Listen(u64),
    /// A MAD agent.
    Agent(AgentId),
    /// An InformInfo subscription with the SA at this GID to this trap.
    Sub(Gid, u16),
}

/// The agent's own verbs objects, each released once: by the tracking
/// client's tree when it adopted them (a CA removal, a close), or by the
/// agent's drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Qp1,
    Qp0,
    RecvMr,
    SmiMr,
    SendMr,
    Cq,
    /// The PD, with the address handles made on it first.
    Pd,
    Ca,
}

impl Part {
    /// Release order (the verbs dependency order) with each part's kind.
    pub(super) const ALL: [(Part, Kind); 8] = [
        (Part::Qp1, Kind::Qp),
        (Part::Qp0, Kind::Qp),
        (Part::RecvMr, Kind::Mr),
        (Part::SmiMr, Kind::Mr),
        (Part::SendMr, Kind::Mr),
        (Part::Cq, Kind::Cq),
        (Part::Pd, Kind::Pd),
        (Part::Ca, Kind::Ca),
    ];

    pub(super) fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl TrackKey {
    pub(super) fn kind(self) -> Kind {
        match self {
            TrackKey::Port | TrackKey::Agent(_) => Kind::MadAgent,
            TrackKey::Conn(_) | TrackKey::Listen(_) => Kind::CmId,
            TrackKey::Sub(..) => Kind::SaSubscription,
        }
    }
}

impl CmAgent {
    /// Puts this agent and, from now on, every connection (from its REQ
    /// to the end of its timewait), listen, MAD agent and SA subscription
    /// of it in `client`'s resource tree (see [`crate::resource`]): they
    /// show in its counters, and closing or dropping the client
    /// disconnects the connections (a REQ still unanswered is abandoned
    /// and its `connect` returns [`CmError::Stopped`]; a REQ not yet
    /// answered by the consumer is rejected), ends the listens, deletes
    /// the subscriptions at the SA (one Set(InformInfo) each, not waited
    /// for), unregisters the MAD agents and stops the agent, in that
    /// order, before the client's QPs go.
    ///
    /// They all hang under the CA the agent uses (its CM ids, MAD agents
    /// and subscriptions under the agent's own node, which is under the
    /// CA): destroying that CA node, or the CA's removal, ends them
    /// first, then the agent's QP1 and QP0 and their buffers. An agent
    /// started over `client`'s own provider ([`Client::into_provider`])
    /// hangs under the client's open of the CA, where its QPs and buffers
    /// already are; an agent started over another provider (an IB node's
    /// port, made before any client) has its CA, PD, CQ, special QPs and
    /// buffers adopted into the tree, counted under their kinds, and
    /// given back to the provider by the tree (once: the agent's drop
    /// then skips them).
    ///
    /// When the CA is removed, every connection and listen of the agent
    /// ends where it stands (no DREQ can leave a removed port): the
    /// [`CmAgent::on_device_removal`] hook hears of each, the
    /// [`CmAgent::on_disconnect`] hook of each connection, a `connect`
    /// still waiting returns [`CmError::DeviceRemoved`], listen channels
    /// are disconnected. An untracked agent does the same by itself.
    ///
    /// # Errors
    /// The agent is already tracked, or `client` is closed.
    pub fn track_in(&self, client: &Client) -> Result<(), CmError> {
        let mut st = self.inner.lock();
        if st.tracker.is_some() {
            return Err(CmError::Verbs {
                what: "track the CM agent",
                err: verbs::VerbsError::InvalidArgument("already in a client's tree".into()),
            });
        }
        if st.stopped || self.inner.removed.load(Ordering::SeqCst) {
            return Err(CmError::Stopped);
        }
        let t = client.tracker();
        let ca_node = match t.ca_node(self.inner.ca) {
            Some(id) => id,
            None => {
                let adopted = self.inner.adopt(&t)?;
                let ca = adopted[0];
                st.adopted = adopted;
                ca
            }
        };
        st.tracker = Some(t);
        st.ca_node = Some(ca_node);
        let r = self.inner.track(&mut st, TrackKey::Port);
        if r.is_err() {
            let (t, adopted) = (st.tracker.take(), std::mem::take(&mut st.adopted));
            st.ca_node = None;
            if let Some(t) = t {
                for id in adopted {
                    t.untrack(id);
                }
            }
        }
        r
    }

    /// Called for each CM id (connection or listen) ended because the
    /// port's CA was removed, as rdma_cm's RDMA_CM_EVENT_DEVICE_REMOVAL
    /// (see [`CmAgent::track_in`]).
    pub fn on_device_removal(&self, hook: impl Fn(Removed) + Send + Sync + 'static) {
        self.inner.lock().on_removal = Some(Arc::new(hook));
    }

    /// True once the port's CA was removed.
    pub fn is_removed(&self) -> bool {
        self.inner.removed.load(Ordering::SeqCst)
    }
}

impl Inner {
    /// Puts `key` in the tracking client's tree, if the agent has one;
    /// its node's hook ends the object ([`Inner::close_tracked`]).
    ///
    /// # Errors
    /// The tracking client is closed: the object must not be made.
    pub(super) fn track(&self, st: &mut State, key: TrackKey) -> Result<(), CmError> {
        let Some(t) = st.tracker.clone() else {
            return Ok(());
        };
        if st.tracked.contains_key(&key) {
            return Ok(());
        }
        // The agent's node under its CA; everything else under the agent.
        let parent = match key {
            TrackKey::Port => st.ca_node,
            _ => Some(*st.tracked.get(&TrackKey::Port).ok_or(CmError::Stopped)?),
        };
        let me = self.me.clone();
        let id = t
            .track(key.kind(), parent, move || {
                if let Some(i) = me.upgrade() {
                    i.close_tracked(key);
                }
            })
            .map_err(|_| self.gone())?;
        st.tracked.insert(key, id);
        Ok(())
    }

    /// Why the agent does no more work.
    pub(super) fn gone(&self) -> CmError {
        if self.removed.load(Ordering::SeqCst) {
            CmError::DeviceRemoved
        } else {
            CmError::Stopped
        }
    }

    /// Puts the agent's verbs objects in `t`'s tree (CA, then PD under
    /// it, then the rest under the PD), each node releasing its part.
    /// Returns the nodes, CA first.
    ///
    /// # Errors
    /// The client is closed (nothing is left in its tree).
    pub(super) fn adopt(&self, t: &Tracker) -> Result<Vec<ResId>, CmError> {
        let mut ids: Vec<ResId> = Vec::new();
        let mut parent = None;
        for (part, kind) in Part::ALL.iter().rev().copied() {
            if matches!(part, Part::Qp0 | Part::SmiMr) && self.smi.is_none() {
                continue;
            }
            let me = self.me.clone();
            let placed = t.track(kind, parent, move || {
                if let Some(i) = me.upgrade() {
                    i.release(part);
                }
            });
            match placed {
                Ok(id) => {
                    ids.push(id);
                    // The CA holds the PD, the PD the rest.
                    if matches!(part, Part::Ca | Part::Pd) {
                        parent = Some(id);
                    }
                }
                Err(_) => {
                    for id in ids {
                        t.untrack(id);
                    }
                    return Err(CmError::Stopped);
                }
            }
        }
        Ok(ids)
    }

    /// Gives `part` back to the provider, once (errors ignored: a removed
    /// CA has taken it already).
    pub(super) fn release(&self, part: Part) {
        if self.released.fetch_or(part.bit(), Ordering::SeqCst) & part.bit() != 0 {
            return;
        }
        let p = &self.provider;
        let _ = match part {
            Part::Qp1 => p.destroy_qp(self.qp),
            Part::Qp0 => self.smi.as_ref().map_or(Ok(()), |s| p.destroy_qp(s.qp)),
            Part::RecvMr => p.dereg_mr(self.recv_mr.handle),
            Part::SmiMr => self
                .smi
                .as_ref()
                .map_or(Ok(()), |s| p.dereg_mr(s.recv_mr.handle)),
            Part::SendMr => p.dereg_mr(self.send_mr.handle),
            Part::Cq => p.destroy_cq(self.cq),
            Part::Pd => {
                let ahs: Vec<AhHandle> = self.lock().ahs.drain().map(|(_, a)| a).collect();
                for a in ahs {
                    let _ = p.destroy_ah(a);
                }
                p.dealloc_pd(self.pd)
            }
            Part::Ca => p.close_ca(self.ca),
        };
    }

    pub(super) fn is_released(&self, part: Part) -> bool {
        self.released.load(Ordering::SeqCst) & part.bit() != 0
    }

    /// The CA is being removed (its CaRemoval event, before the provider
    /// forgets it). A tracked agent's objects end through the tracking
    /// client's tree: the adopted CA node is destroyed here, or the
    /// client's own open of the CA is destroyed by the client's handler
    /// right after this returns; each CM id's node ends it
    /// ([`Inner::close_tracked`]). An untracked agent ends them itself.
    pub(super) fn device_removed(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (tracker, adopted_ca) = {
            let st = self.lock();
            (st.tracker.clone(), st.adopted.first().copied())
        };
        match (tracker, adopted_ca) {
            (Some(t), Some(ca)) if t.is_open() => t.destroy(ca),
            (Some(t), None) if t.is_open() => {}
            _ => self.end_all_removed(),
        }
    }

    /// Ends a connection on a removed CA: forgotten by the state machine
    /// (nothing can be sent), out of the tree, its waiting `connect` told
    /// (the disconnect hook is for connections nobody waits on).
    pub(super) fn end_conn_removed(
        &self,
        st: &mut State,
        conn: ConnId,
        told: &mut Vec<(Removed, bool)>,
    ) {
        let known = st.cm.forget(conn) | st.meta.remove(&conn).is_some();
        self.untrack(st, TrackKey::Conn(conn));
        let waiting = st.waiting.remove(&conn);
        if let Some(tx) = &waiting {
            let _ = tx.send(Err(CmError::DeviceRemoved));
        }
        if known || waiting.is_some() {
            told.push((Removed::Conn(conn), waiting.is_none()));
        }
    }

    pub(super) fn end_listen_removed(
        &self,
        st: &mut State,
        service_id: u64,
        told: &mut Vec<(Removed, bool)>,
    ) {
        st.cm.unlisten(service_id);
        self.untrack(st, TrackKey::Listen(service_id));
        if st.listeners.remove(&service_id).is_some() {
            told.push((Removed::Listen(service_id), false));
        }
    }

    /// Ends every connection and listen left on a removed CA, and the
    /// agent: its thread stops, its MAD agents' waiting callers hear.
    pub(super) fn end_all_removed(&self) {
        let mut st = self.lock();
        let mut told = Vec::new();
        let mut conns: Vec<ConnId> = st.meta.keys().chain(st.waiting.keys()).copied().collect();
        conns.sort();
        conns.dedup();
        for c in conns {
            self.end_conn_removed(&mut st, c, &mut told);
        }
        let listens: Vec<u64> = st.listeners.keys().copied().collect();
        for s in listens {
            self.end_listen_removed(&mut st, s, &mut told);
        }
        let keys: Vec<TrackKey> = st.tracked.keys().copied().collect();
        for k in keys.into_iter().filter(|k| *k != TrackKey::Port) {
            self.untrack(&mut st, k);
        }
        st.stopped = true;
        st.mad_waiters.clear();
        let _ = self.events.lock().map(|tx| tx.send(Ev::Stop));
        self.tell_removed(st, told);
    }

    /// Runs the removal hooks (and the disconnect hook where marked)
    /// without the lock.
    pub(super) fn tell_removed(&self, st: MutexGuard<'_, State>, told: Vec<(Removed, bool)>) {
        let (removal, disconnect) = (st.on_removal.clone(), st.on_disconnect.clone());
        drop(st);
        for (r, disconnected) in told {
            if let (Removed::Conn(c), true, Some(h)) = (r, disconnected, &disconnect) {
                h(c);
            }
            if let Some(h) = &removal {
                h(r);
            }
        }
    }

    /// `key` ended by itself: its node leaves the client's tree.
    pub(super) fn untrack(&self, st: &mut State, key: TrackKey) {
        if let (Some(id), Some(t)) = (st.tracked.remove(&key), &st.tracker) {
            t.untrack(id);
        }
    }

    /// The tracking client is closing: ends the object `key` is. Runs
    /// outside the client's lock, on the closing thread.
    pub(super) fn close_tracked(&self, key: TrackKey) {
        let mut st = self.lock();
        st.tracked.remove(&key);
        if self.removed.load(Ordering::SeqCst) {
            // Nothing can leave the port: no DREQ, REJ or InformInfo
            // delete; each CM id ends where it stands and is told.
            let mut told = Vec::new();
            match key {
                TrackKey::Conn(conn) => self.end_conn_removed(&mut st, conn, &mut told),
                TrackKey::Listen(s) => self.end_listen_removed(&mut st, s, &mut told),
                TrackKey::Agent(id) => {
                    st.gsi.unregister(id);
                    st.mad_rx.remove(&id);
                    st.mad_waiters.retain(|tid, _| (tid >> 32) as u32 != id.0);
                }
                TrackKey::Sub(..) => {}
                TrackKey::Port => {
                    // Last of the agent's nodes: whatever was made before
                    // the agent was tracked ends too.
                    drop(st);
                    self.end_all_removed();
                    return;
                }
            }
            self.tell_removed(st, told);
            return;
        }
        match key {
            TrackKey::Port => {
                st.stopped = true;
                drop(st);
                // The DREQs and InformInfo deletes just posted leave
                // before the client's teardown reaches QP1: wait (a
                // bounded while) for every send to complete.
                let end = std::time::Instant::now() + StdDuration::from_millis(250);
                loop {
                    self.drain_cq();
                    let idle = {
                        let st = self.lock();
                        st.backlog.is_empty() && st.free_sends.len() == SENDS as usize
                    };
                    if idle || std::time::Instant::now() >= end {
                        break;
                    }
                    std::thread::sleep(StdDuration::from_millis(1));
                }
                let _ = self.events.lock().map(|tx| tx.send(Ev::Stop));
                return;
            }
            TrackKey::Conn(conn) => match st.cm.state(conn) {
                ConnState::ReqSent | ConnState::RepRcvd => {
                    st.cm.abandon(conn);
                    st.meta.remove(&conn);
                    if let Some(tx) = st.waiting.remove(&conn) {
                        let _ = tx.send(Err(CmError::Stopped));
                    }
                }
                ConnState::ReqRcvd => {
                    st.cm.reject(conn, RejReason::CONSUMER_DEFINED, Vec::new());
                }
                _ => {
                    let now = self.now();
                    st.cm.disconnect(now, conn);
                }
            },
            TrackKey::Listen(service_id) => {
                if st.listeners.remove(&service_id).is_some() {
                    let _ = self.provider.gsi_listen(self.qp, service_id, false);
                }
            }
            TrackKey::Agent(id) => {
                st.gsi.unregister(id);
                self.gsi_unregister(&mut st, id);
                st.mad_rx.remove(&id);
                // Its callers waiting on a response hear at once.
                st.mad_waiters.retain(|tid, _| (tid >> 32) as u32 != id.0);
            }
            TrackKey::Sub(sa, trap) => {
                let mut mad = crate::sa::inform_info_request(self.local.gid, trap, false);
                st.next_tid += 1;
                rdma_mad::mad::Mad::new_unchecked(&mut mad[..]).set_tid(st.next_tid);
                st.gsi.send(sa, mad);
            }
        }
        self.flush(&mut st);
        drop(st);
        self.kick();
    }
}
