//! The completion side: the CA's callbacks, the poll thread, work
//! completions fed to the channel, its outputs posted, and its timers
//! (the command timeout, the liveness probe).

use super::*;
use std::sync::atomic::Ordering;

/// The CA's callbacks. Completions are handled right on the provider's
/// thread once the session exists (one thread hand-off less per answer);
/// before that, and for everything else, the poll thread is told.
pub(super) struct Wake {
    pub(super) tx: Mutex<Sender<Ev>>,
    pub(super) inner: std::sync::OnceLock<std::sync::Weak<Inner>>,
}

impl EventHandler for Wake {
    fn on_completion(&self, _cq_ctx: u64) {
        match self.inner.get().and_then(std::sync::Weak::upgrade) {
            // A waiting caller polls the CQ: it takes this completion.
            Some(inner) if inner.reaper_polls.load(Ordering::SeqCst) => {}
            // Our SENDs go out with no lock held (`State::posts`), so even
            // a provider that calls back from inside its calls may have
            // the completion handled right here.
            Some(inner) if verbs::nested::may_lock_here() => {
                inner.drain_cq();
                // Never drop the last reference here: the session's
                // teardown may stop the very thread running this callback.
                if Arc::strong_count(&inner) == 1 {
                    let _ = std::thread::Builder::new()
                        .name("srp-reap".into())
                        .spawn(move || drop(inner));
                }
            }
            _ => {
                let _ = self.tx.lock().map(|tx| tx.send(Ev::Cq));
            }
        }
    }
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        use verbs::AsyncEventKind::{CaRemoval, PortDown};
        if matches!(event.kind, PortDown | CaRemoval) {
            let _ = self.tx.lock().map(|tx| tx.send(Ev::PortGone));
        }
    }
}

impl Inner {
    pub(super) fn poll_loop(&self, rx: Receiver<Ev>) {
        loop {
            let wait = {
                let mut st = self.lock();
                let next = self.next_timer(&st);
                st.timer_sleep = Some(next);
                next.map(|t| t.saturating_since(self.now()).to_std())
            };
            let ev = match wait {
                Some(d) => rx.recv_timeout(d.max(std::time::Duration::from_millis(1))),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            self.lock().timer_sleep = None;
            match ev {
                Ok(Ev::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Ev::Cq) => self.drain_cq(),
                Ok(Ev::PortGone) => {
                    let mut st = self.lock();
                    st.stats.port_failures += 1;
                    self.lost(&mut st);
                    self.drain_channel(&mut st);
                }
                Ok(Ev::Kick) => {
                    let mut st = self.lock();
                    self.drain_channel(&mut st);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut st = self.lock();
                    let now = self.now();
                    st.channel.handle_timeout(now);
                    self.probe_if_due(&mut st, now);
                    self.drain_channel(&mut st);
                }
            }
        }
    }

    pub(super) fn drain_cq(&self) {
        let mut st = self.lock();
        self.drain_cq_locked(&mut st);
    }

    pub(super) fn drain_cq_locked(&self, st: &mut State) {
        // A caller reaping the CQ arms it as it gives the role up.
        self.poll_cq_locked(st, st.reaper.is_some());
        self.drain_channel(st);
    }

    /// Polls the CQ until it is empty and hands each completion to the
    /// channel; arms it once it is empty (then polls again: what came
    /// before the arm raises no callback) unless `armed`. Returns how many
    /// completions it handled.
    pub(super) fn poll_cq_locked(&self, st: &mut State, mut armed: bool) -> usize {
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        let mut handled = 0;
        // One clock reading for every answer of this poll (microseconds
        // apart at most): the time they came.
        let mut now = None;
        while let Ok(n) = self.provider.poll_cq(self.cq, &mut wcs) {
            for wc in &wcs[..n] {
                self.on_wc(st, wc, &mut now);
            }
            handled += n;
            if n == 0 {
                if armed || self.provider.req_notify_cq(self.cq, false).is_err() {
                    break;
                }
                armed = true;
            }
        }
        handled
    }

    /// Handles one work completion; `now` is the clock as read for the
    /// poll that found it, read here if it was not yet.
    pub(super) fn on_wc(
        &self,
        st: &mut State,
        wc: &WorkCompletion,
        now: &mut Option<rdma_types::Instant>,
    ) {
        let ok = wc.status == WcStatus::Success;
        if !ok {
            // Routine when the QP is flushed (every outstanding request
            // ends so at a disconnect): debug, not a warning.
            tracing::debug!(
                parent: &self.span,
                wr_id = format_args!("{:#x}", wc.wr_id),
                status = ?wc.status,
                "completion failed"
            );
        }
        match wc.wr_id & KIND_MASK {
            KIND_RECV => {
                let i = (wc.wr_id & !KIND_MASK) as u32;
                if ok {
                    let now = *now.get_or_insert_with(|| self.now());
                    st.quiet_since = now;
                    let len = (wc.byte_len).min(self.recv_size) as usize;
                    // Read into a buffer kept for it: no allocation per IU.
                    // Whole 8-byte words as far as the slot has them (an
                    // SRP_RSP is 36 bytes): MemBuf copies those with no
                    // partial-word step; the bytes past the IU are not
                    // looked at.
                    let whole = len.next_multiple_of(8).min(self.recv_size as usize);
                    let mut iu = std::mem::take(&mut st.iu_buf);
                    iu.resize(whole, 0);
                    self.recv_buf
                        .read_at((i * self.recv_size) as usize, &mut iu);
                    st.channel.handle_recv(now, &iu[..len]);
                    st.iu_buf = iu;
                    st.reposts
                        .push(recv_wr(&self.recv_buf, &self.recv_mr, self.recv_size, i));
                    if st.reposts.len() >= REPOST_BATCH as usize {
                        let _ = self.provider.post_recv(self.qp, &st.reposts);
                        st.reposts.clear();
                    }
                } else {
                    self.lost(st);
                }
            }
            KIND_PROBE => {
                st.probe_out = false;
                if ok {
                    st.stats.probes += 1;
                    st.quiet_since = *now.get_or_insert_with(|| self.now());
                } else {
                    self.lost(st);
                }
            }
            // A bind or an invalidation failed: its window is in an
            // unknown state, and so is the connection.
            KIND_MW if !ok => self.lost(st),
            KIND_SEND => {
                let slot = (wc.wr_id & !KIND_MASK) as usize;
                if let Some(id) = st.slot_ids.get_mut(slot).and_then(Option::take) {
                    st.free_slots.push(slot as u32);
                    st.channel.handle_send_done(id);
                }
                if !ok {
                    self.lost(st);
                }
            }
            _ => {}
        }
    }

    /// The connection failed under us: every outstanding command fails.
    /// The QP goes to the error state first (it may still be up after a
    /// port event or a target logout), so the target can no longer fetch
    /// the data of a command that is now retried elsewhere.
    pub(super) fn lost(&self, st: &mut State) {
        if !st.closed {
            tracing::debug!(parent: &self.span, "connection lost");
            let _ = self.provider.modify_qp(
                self.qp,
                &QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                },
            );
            st.closed = true;
            st.channel.disconnected(false);
        }
    }

    /// Posts (queues in `st.posts`) what the channel has to send.
    /// `data`: the immediate data of the command just submitted with
    /// [`srp::initiator::Command::immediate_follows`], by its tag: it is
    /// written into the SEND's slot after the IU's head.
    pub(super) fn flush_outputs(&self, st: &mut State, data: Option<(Tag, &[u8])>) {
        while let Some(out) = st.channel.poll_output() {
            match out {
                Output::Send(t) => {
                    let Some(slot) = st.free_slots.pop() else {
                        // More sends than slots: the queue is sized
                        // can_queue + 2, so this is a bug; fail the link.
                        self.lost(st);
                        return;
                    };
                    // The table must be in place before the target can see
                    // the SRP_CMD that points at it (the map is looked
                    // into only for a command that has one).
                    if let Some(table) = &t.ext_table {
                        if let Some(&desc) = st.tables.get(&t.tag) {
                            self.pool
                                .write_at((desc - self.pool.addr()) as usize, table);
                        }
                    }
                    let off = slot as usize * self.slot_size as usize;
                    let mut n = t.bytes.len().min(self.slot_size as usize);
                    self.send_buf.write_at(off, &t.bytes[..n]);
                    if t.follows > 0 {
                        // Only the command just submitted leaves its data
                        // to us, and it is flushed before the lock goes.
                        let fits = |d: &[u8]| n + d.len() <= self.slot_size as usize;
                        match data
                            .filter(|&(tag, d)| tag == t.tag && d.len() == t.follows && fits(d))
                        {
                            Some((_, d)) => {
                                self.send_buf.write_at(off + n, d);
                                n += d.len();
                            }
                            None => {
                                // Not sent whole, never sent short: a
                                // link that failed before its flush.
                                tracing::debug!(parent: &self.span, tag = t.tag.0, "immediate data not at hand");
                                st.free_slots.push(slot);
                                self.lost(st);
                                return;
                            }
                        }
                    }
                    let wr = SendWr::new(
                        KIND_SEND | u64::from(slot),
                        SendOpcode::Send,
                        verbs::sges![Sge {
                            addr: self.send_buf.addr() + off as u64,
                            length: n as u32,
                            lkey: self.send_mr.lkey,
                        }],
                    );
                    if let Some(id) = st.slot_ids.get_mut(slot as usize) {
                        *id = Some(t.id);
                    }
                    st.posts.push(slot, wr);
                    st.channel.reuse_bytes(t.bytes);
                }
                Output::Reconnect => {
                    // Host reset: this session gives up; the caller (rport
                    // FSM) logs in again.
                    self.lost(st);
                }
            }
        }
    }

    /// [`Inner::flush_outputs`] from a caller's thread: when a post failed
    /// and the connection is lost, the commands it ended (the caller's own
    /// among them) are handed to their waiters now, not whenever the poll
    /// thread next wakes.
    pub(super) fn flush_outputs_here(&self, st: &mut State, data: Option<(Tag, &[u8])>) {
        self.flush_outputs(st, data);
        if st.closed {
            self.drain_channel(st);
        }
    }

    pub(super) fn drain_channel(&self, st: &mut State) {
        self.flush_outputs(st, None);
        while let Some(c) = st.channel.poll_completion() {
            st.stats.completed += 1;
            match c.status {
                Status::Reset => st.stats.reset_ended += 1,
                Status::Aborted => st.stats.aborted += 1,
                _ => {}
            }
            // Empty unless register_always: not even looked into then.
            if let Some(w) = rdma_types::remove_if_any(&mut st.bound, &c.tag) {
                self.invalidate(st, w);
            }
            if let Some(t) = st.parked.remove(&c.tag.0) {
                // Not the reaper itself, draining in `reap`: it looks for
                // its answers after each drain, before it sleeps.
                if st.reaper != Some(t.id()) || t.id() != current_id() {
                    st.wake.push(t);
                }
            }
            st.done.insert(c.tag.0, c);
        }
        while let Some(e) = st.channel.poll_event() {
            match &e {
                Event::TimedOut { .. } => st.stats.timeouts += 1,
                Event::TaskMgmtSent { .. } => st.stats.tmfs += 1,
                Event::TaskMgmtDone { func, result, .. } => {
                    st.tmfs_done += 1;
                    if *func == TmFunc::AbortTask {
                        match result {
                            Ok(()) => st.stats.aborts_complete += 1,
                            Err(_) => st.stats.aborts_failed += 1,
                        }
                    }
                    st.last_tmf = Some((*func, *result));
                }
                Event::Aer { sense, .. } => {
                    st.stats.aers += 1;
                    // A counter bumped under its own short lock; no callback.
                    if let Some(c) = &self.changes {
                        c.note_sense(sense);
                    }
                }
                Event::Protocol(_) => st.stats.protocol_errors += 1,
                Event::TargetLogout(_) => self.lost(st),
            }
            if st.events.len() < 1024 {
                st.events.push_back(e);
            }
        }
        self.flush_outputs(st, None);
        // Completions may have freed credits or slots for waiting callers.
        if st.cv_waiters > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits on `cv`, counted so notifiers can skip an empty wait.
    pub(super) fn wait_cv<'a>(&self, mut st: Locked<'a>) -> Locked<'a> {
        let inner = st.inner;
        st.stop_batching();
        if !st.posts.is_empty() || !st.wake.is_empty() {
            // What we wait for may need them: post them first (a wake-up
            // as a condition variable may have any time); and the waiters
            // owed a wake-up get it.
            drop(st);
            return inner.lock();
        }
        st.cv_waiters += 1;
        let g = self
            .cv
            .wait(st.st.take().expect("held").into_guard())
            .unwrap_or_else(|e| e.into_inner());
        let mut st = Locked {
            inner,
            st: Some(Counted::from_guard(g)),
        };
        st.cv_waiters -= 1;
        st
    }

    /// When the liveness probe is due: commands wait, none is in flight,
    /// and the target has been quiet for the probe interval.
    pub(super) fn probe_due(&self, st: &State) -> Option<rdma_types::Instant> {
        let every = self.probe_interval?;
        let waiting = !st.closed && !st.probe_out && st.channel.outstanding() > 0;
        waiting.then(|| st.quiet_since + every)
    }

    /// The poll thread's next deadline: the channel's timers or the probe.
    pub(super) fn next_timer(&self, st: &State) -> Option<rdma_types::Instant> {
        earliest(st.channel.poll_timeout(), self.probe_due(st))
    }

    /// Sends the liveness probe if it is due: a zero-length RDMA WRITE,
    /// which needs no memory of the target's (a zero-length RDMA operation
    /// carries no valid address or R_Key, IBA C9-88; Linux rxe and our
    /// soft RoCE accept it, and ib_srpt's QPs allow remote writes) but is
    /// acknowledged or retried like any request. A failed probe is a failed connection.
    pub(super) fn probe_if_due(&self, st: &mut State, now: rdma_types::Instant) {
        if self.probe_due(st).is_none_or(|at| at > now) {
            return;
        }
        let wr = SendWr::new(KIND_PROBE, SendOpcode::RdmaWrite, Vec::new());
        st.probe_out = true;
        if self.provider.post_send(self.qp, &[wr]).is_err() {
            st.probe_out = false;
            self.lost(st);
        }
    }

    /// Wakes the poll thread when it sleeps past a timer that command
    /// `tag`, just started, may have brought forward (a command sent to an
    /// idle channel arms its timeout).
    pub(super) fn kick_if_timer_earlier(&self, st: &mut State, tag: Tag) {
        let Some(sleep) = st.timer_sleep else {
            // At work, or kicked already: it looks at every timer before
            // it sleeps again.
            return;
        };
        // What the command may have moved: its own deadline, and the probe
        // (the first command after a quiet spell); the task management
        // function's as ever. The other commands' deadlines stand where
        // the poll thread saw them, or each kicked it when it started.
        let next = earliest(st.channel.poll_timeout_with(tag), self.probe_due(st));
        let kick = match sleep {
            None => next.is_some(),
            Some(at) => next.is_some_and(|n| n < at),
        };
        if kick {
            // One kick until it sleeps again (the commands started before
            // it wakes need none of their own).
            st.timer_sleep = None;
            let _ = self.events.lock().map(|tx| tx.send(Ev::Kick));
        }
    }
}

/// The earlier of two optional deadlines.
fn earliest(
    a: Option<rdma_types::Instant>,
    b: Option<rdma_types::Instant>,
) -> Option<rdma_types::Instant> {
    // Looked at every command's start: a match, not an iterator chain.
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
