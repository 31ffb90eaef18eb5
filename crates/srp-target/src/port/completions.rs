//! Completions: the CQs drained (on the provider's thread or the poll
//! thread), received IUs fed to the sans-IO target, and its outputs turned
//! into SENDs and RDMA READ/WRITEs.

use super::*;

impl Inner {
    pub(super) fn poll_loop(&self, rx: Receiver<Event>) {
        loop {
            let ev = match self.next_deadline() {
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(at) => {
                    rx.recv_timeout(at.saturating_duration_since(std::time::Instant::now()))
                }
            };
            match ev {
                Ok(Event::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Event::Cq(ctx)) => self.drain_cq(ctx),
                Ok(Event::Timer) | Err(mpsc::RecvTimeoutError::Timeout) => self.on_timer(),
            }
        }
    }

    pub(super) fn drain_cq(&self, ctx: u64) {
        let mut st = self.lock();
        st.inline_here = true;
        self.drain_cq_locked(&mut st, ctx);
        self.run_inline(st);
    }

    /// Runs the commands `submit_scsi` kept for this thread, with the lock
    /// released, until none are left (their responses may start more).
    /// The results of a round go back under one lock, so its data and
    /// responses go out as one batch (see `flush_posts`).
    pub(super) fn run_inline<'a>(&'a self, mut st: Locked<'a>) {
        loop {
            if st.inline_jobs.is_empty() {
                st.inline_here = false;
                return;
            }
            let mut jobs = std::mem::take(&mut st.inline_jobs);
            let mut results = std::mem::take(&mut st.inline_done);
            drop(st);
            results.extend(jobs.drain(..).map(|mut job| {
                self.gather_job(&mut job);
                let (done, data_in) = self.execute(&job);
                (job.conn, done, data_in, job.data_out)
            }));
            st = self.lock();
            for (conn, done, data_in, data_out) in results.drain(..) {
                self.done_locked(&mut st, conn, done, data_in, data_out);
            }
            self.pump_noted(&mut st);
            // The emptied vectors keep their room for the next round
            // (unless the responses queued new jobs meanwhile).
            if st.inline_jobs.is_empty() {
                st.inline_jobs = jobs;
            }
            st.inline_done = results;
        }
    }

    pub(super) fn drain_cq_locked(&self, st: &mut State, ctx: u64) {
        let cq = if ctx == RECV_CQ_CTX {
            self.recv_cq
        } else {
            match st.conns.get(&ConnId(ctx)) {
                Some(c) => c.send_cq,
                None => return,
            }
        };
        let mut wcs =
            [WorkCompletion::new(0, WcStatus::Success, rdma_types::WcOpcode::Send, 0); 32];
        let mut armed = false;
        loop {
            let n = match self.provider.poll_cq(cq, &mut wcs) {
                Ok(n) => n,
                Err(_) => return,
            };
            for wc in &wcs[..n] {
                if ctx == RECV_CQ_CTX {
                    self.on_recv(st, wc);
                } else {
                    self.on_send_wc(st, ConnId(ctx), wc);
                }
            }
            self.pump_noted(st);
            if n == 0 {
                if armed {
                    break;
                }
                // Arm, then look once more: a completion that landed
                // between the last poll and the arm is not lost.
                if self.provider.req_notify_cq(cq, false).is_err() {
                    break;
                }
                armed = true;
            }
        }
        self.retry_waiting(st);
    }

    pub(super) fn on_recv(&self, st: &mut State, wc: &WorkCompletion) {
        let index = wc.wr_id as u32;
        let conn = ConnId(wc.qp_ctx);
        if wc.status == WcStatus::Success {
            if let Some(c) = st.conns.get_mut(&conn) {
                c.activity += 1;
                let channel = c.channel;
                let off = (index * self.req_stride) as usize;
                let len = (wc.byte_len as usize).min(self.req_size as usize);
                // SAFETY: `off + len` lies in receive buffer `index` of
                // `srq_buf` (`req_stride` apart, `len` at most `req_size`).
                // Its receive WR has completed and is posted again only
                // below, after the view's last use; the buffer is
                // registered for local access only, so no peer's RDMA
                // reaches it, and nothing else in this process touches
                // it: the IU is parsed in place, not copied first.
                let iu = unsafe { std::slice::from_raw_parts(self.srq_buf.ptr_at(off), len) };
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_recv(iu);
                }
                self.pump_soon(st, conn);
            }
        }
        // The channel copied what it keeps: the buffer goes back, with the
        // batch it completes (the SRQ's other entries meanwhile), unless
        // fewer are needed now (a channel went).
        if st.recv_posted > self.recv_goal(st) {
            st.recv_posted -= 1;
            st.recv_idle.push(index);
            return;
        }
        st.reposts.push(self.recv_wr(index));
        if st.reposts.len() >= self.repost_batch {
            let _ = self.provider.post_srq_recv(self.srq, &st.reposts);
            st.reposts.clear();
        }
    }

    pub(super) fn on_send_wc(&self, st: &mut State, conn: ConnId, wc: &WorkCompletion) {
        let ok = wc.status == WcStatus::Success;
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        c.outstanding = c.outstanding.saturating_sub(1);
        c.activity += 1;
        let channel = c.channel;
        // The first failure names the close, unless the channel was
        // already logging out (its reason stands; the failure follows it).
        let live = st
            .target
            .channel(channel)
            .is_some_and(|ch| ch.state() == srp::target::ChannelState::Live);
        if !ok && live && !c.closing && c.close_reason.is_none() {
            let kind = wc.wr_id & KIND_MASK;
            c.close_reason = Some(if kind == KIND_KEEPALIVE {
                CloseReason::PeerGone { status: wc.status }
            } else {
                CloseReason::WorkRequestFailed {
                    status: wc.status,
                    what: match kind {
                        KIND_SEND => "an IU SEND",
                        KIND_RDMA => "an RDMA READ or WRITE",
                        _ => "a work request",
                    },
                }
            });
        }
        match wc.wr_id & KIND_MASK {
            KIND_KEEPALIVE => {
                c.keepalive_out = false;
                if !ok {
                    if let Some(ch) = st.target.channel_mut(channel) {
                        ch.connection_lost();
                    }
                }
            }
            KIND_SEND => {
                let slot = (wc.wr_id & !KIND_MASK) as u32;
                let seq = c.slot_seq.get(slot as usize).copied().unwrap_or(0);
                c.free_slots.push(slot);
                self.implied_done(st, conn, seq, ok);
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(ok);
                }
            }
            KIND_RDMA => {
                let op = OpId(wc.wr_id & !KIND_MASK);
                let Some(info) = c.ops.remove(&op) else {
                    return;
                };
                self.implied_done(st, conn, info.seq, ok);
                self.rdma_done(st, conn, op, info, ok);
            }
            _ => {}
        }
        self.pump_soon(st, conn);
    }

    /// The unsignaled WRITEs queued before request `seq`, which completed
    /// (`ok`: well): they are done too, as an RC send queue completes in
    /// order. When it failed, they are counted failed with it: one may
    /// have been joined into it (`joins`) and has no completion of its
    /// own, and the QP is in error anyway. One that failed by itself had
    /// its own (errors always complete) and is out of `ops` already.
    /// Without this, a connection whose last signaled request failed kept
    /// them outstanding and never finished closing.
    fn implied_done(&self, st: &mut State, conn: ConnId, seq: u64, ok: bool) {
        loop {
            let Some(c) = st.conns.get_mut(&conn) else {
                return;
            };
            let op = match c.unsignaled.front() {
                Some(&(n, op)) if n < seq => op,
                _ => return,
            };
            c.unsignaled.pop_front();
            // Gone already: it completed in error (or its post failed).
            let Some(info) = c.ops.remove(&op) else {
                continue;
            };
            c.outstanding = c.outstanding.saturating_sub(1);
            self.rdma_done(st, conn, op, info, ok);
        }
    }

    /// An RDMA op (already out of the connection's op table) completed.
    fn rdma_done(&self, st: &mut State, conn: ConnId, op: OpId, info: OpInfo, ok: bool) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let channel = c.channel;
        match info.local {
            Local::Table { .. } => {
                let chunk = info.chunk.expect("a table read takes a chunk");
                let bytes = ok.then(|| {
                    self.chunk_buf
                        .to_vec(chunk * self.chunk_size as usize, info.len as usize)
                });
                st.free_chunks.push(chunk);
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_table_read(op, bytes.as_deref());
                }
            }
            Local::DataOut { offset } => {
                let chunk = info.chunk.expect("a data-out READ takes a chunk");
                if ok && st.free_chunks.len() < self.spill_below {
                    let bytes = self
                        .chunk_buf
                        .to_vec(chunk * self.chunk_size as usize, info.len as usize);
                    c.spilled.entry(info.cmd).or_default().push((offset, bytes));
                    st.free_chunks.push(chunk);
                } else if ok {
                    c.fetched
                        .entry(info.cmd)
                        .or_default()
                        .push((offset, chunk, info.len));
                } else {
                    st.free_chunks.push(chunk);
                }
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_rdma_done(op, ok);
                }
            }
            Local::DataIn { .. } => {
                st.free_chunks.extend(info.chunk);
                if info.chunk.is_none()
                    && c.parked.contains_key(&info.cmd)
                    && !c
                        .ops
                        .values()
                        .any(|o| o.cmd == info.cmd && o.chunk.is_none())
                {
                    if let Some(chunks) = c.parked.remove(&info.cmd) {
                        st.free_chunks.extend(chunks);
                    }
                }
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_rdma_done(op, ok);
                }
            }
        }
    }

    /// Notes `conn` for [`Inner::pump_noted`], which the caller runs once
    /// its batch of completions is handed to the channels: a channel's
    /// outputs keep their order, and a batch of a connection's
    /// completions costs one pump, not one each.
    pub(super) fn pump_soon(&self, st: &mut State, conn: ConnId) {
        if st.pump_later.last() != Some(&conn) && !st.pump_later.contains(&conn) {
            st.pump_later.push(conn);
        }
    }

    /// [`Inner::pump`] for each connection noted by [`Inner::pump_soon`],
    /// in the order noted.
    pub(super) fn pump_noted(&self, st: &mut State) {
        if st.pump_later.is_empty() {
            return;
        }
        let mut noted = std::mem::take(&mut st.pump_later);
        for &conn in &noted {
            self.pump(st, conn);
        }
        // A pump notes nothing (only completions do): the list goes back
        // empty, kept for its room.
        debug_assert!(st.pump_later.is_empty());
        noted.clear();
        st.pump_later = noted;
    }

    /// Carries out every output the channel has.
    pub(super) fn pump(&self, st: &mut State, conn: ConnId) {
        // A connection's channel never changes, and the two go together
        // (`maybe_finish` removes both): once an output has ended the
        // connection, its channel is gone too and the loop stops.
        let Some(channel) = st.conns.get(&conn).map(|c| c.channel) else {
            return;
        };
        while let Some(out) = st
            .target
            .channel_mut(channel)
            .and_then(|ch| ch.poll_output())
        {
            self.carry_out(st, conn, out);
        }
        self.maybe_finish(st, conn);
    }

    pub(super) fn carry_out(&self, st: &mut State, conn: ConnId, out: Output) {
        match out {
            Output::Send { bytes, solicited } => {
                // An IU never overtakes this channel's RDMA ops waiting for
                // a chunk: the channel hands out a TMF response only once
                // the commands it aborts are back from the core, but a
                // command that completed first still has its data-in
                // WRITEs ahead of it, and a TMF response overtaking them
                // would let the initiator reuse the buffer they land in.
                if st.waiting.iter().any(|(c, _)| *c == conn) {
                    st.waiting
                        .push_back((conn, Output::Send { bytes, solicited }));
                } else {
                    self.post_send_iu(st, conn, &bytes, solicited)
                }
            }
            Output::RdmaRead(op) | Output::RdmaWrite(op) => {
                if !self.post_rdma(st, conn, &out, op) {
                    st.waiting.push_back((conn, out));
                }
            }
            Output::Scsi(req) => self.submit_scsi(st, conn, req),
            Output::Tmf(req) => self.run_tmf(st, conn, req),
            Output::Abort(cmd) => {
                // The core's later completion is ignored by the channel; a
                // running backend I/O is not interrupted (the channel is
                // closing: no TMF response waits for it), but one not yet
                // started never starts (issue 33).
                if let Some(c) = st.conns.get(&conn) {
                    c.abort_unstarted(cmd);
                }
            }
            Output::Release(cmd) => {
                if let Some(c) = st.conns.get_mut(&conn) {
                    // Data-in with chunks of the pool: the ops table is
                    // searched (every op of the connection) only then.
                    if let Some(d) = c.data_in.remove(&cmd).filter(|d| !d.chunks().is_empty()) {
                        if c.ops.values().any(|o| o.cmd == cmd && o.chunk.is_none()) {
                            c.parked.insert(cmd, d.chunks().to_vec());
                        } else {
                            st.free_chunks.extend_from_slice(d.chunks());
                        }
                    }
                    // Only data-out fetched through the pool is in these.
                    rdma_types::remove_if_any(&mut c.spilled, &cmd);
                    if let Some(chunks) = rdma_types::remove_if_any(&mut c.fetched, &cmd) {
                        st.free_chunks
                            .extend(chunks.into_iter().map(|(_, ch, _)| ch));
                    }
                }
            }
            Output::Disconnect => {
                let why = self.close_reason(st, conn);
                if let Some(c) = st.conns.get(&conn) {
                    tracing::debug!(parent: &c.span, reason = %why, "closing the channel");
                }
                self.close(st, conn);
                // The hook runs once the lock is let go (`PortLock`).
                st.closed.push((conn, why));
            }
        }
    }

    pub(super) fn post_send_iu(&self, st: &mut State, conn: ConnId, bytes: &[u8], solicited: bool) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let channel = c.channel;
        let slot = match c.free_slots.pop() {
            Some(s) if bytes.len() <= c.slot_size as usize => s,
            other => {
                // The channel never has more than srpt_sq_size work requests
                // out and never builds an IU above srp_max_rsp_size, so this
                // is a bug: fail the send rather than corrupt a slot.
                if let Some(s) = other {
                    c.free_slots.push(s);
                }
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(false);
                }
                return;
            }
        };
        let off = slot as usize * super::slot_stride(c.slot_size) as usize;
        c.send_buf.write_at(off, bytes);
        let mut wr = SendWr::new(
            KIND_SEND | slot as u64,
            SendOpcode::Send,
            verbs::sges![Sge {
                addr: c.send_buf.addr() + off as u64,
                length: bytes.len() as u32,
                lkey: c.send_mr.lkey,
            }],
        );
        if solicited {
            wr.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
        }
        c.outstanding += 1;
        c.queued_wrs += 1;
        if let Some(n) = c.slot_seq.get_mut(slot as usize) {
            *n = c.queued_wrs;
        }
        let qp = c.qp;
        st.posts.ius.push(wr);
        st.posts.iu_posts.push(Post {
            conn,
            qp,
            kind: Posted::Send { slot },
        });
    }

    /// Posts an RDMA op; false when no chunk is free (the op waits).
    pub(super) fn post_rdma(&self, st: &mut State, conn: ConnId, out: &Output, op: RdmaOp) -> bool {
        let read = matches!(out, Output::RdmaRead(_));
        if op.len > self.chunk_size {
            // Larger than any chunk: the channel splits at srp_max_rdma_size
            // and tables are bounded by max_table_len, so only a table over
            // the chunk size lands here.
            self.fail_rdma(st, conn, op);
            return true;
        }
        let cs = self.chunk_size as usize;
        let mut store = false;
        // A WRITE of data-in the store read into the command's own chunks
        // goes straight out of them.
        let reserved = match (
            op.local,
            st.conns.get(&conn).and_then(|c| c.data_in.get(&op.cmd)),
        ) {
            (Local::DataIn { offset }, Some(InData::Chunks { chunks, len })) => {
                Some(self.reserved_sges(chunks, *len, offset as usize, op.len as usize))
            }
            (Local::DataIn { offset }, Some(InData::Store { mem, lkey, at, len })) => {
                if offset + u64::from(op.len) > *len as u64 {
                    // The channel asks only for the data-in it was told
                    // of; past it there is nothing of this command's.
                    self.fail_rdma(st, conn, op);
                    return true;
                }
                store = true;
                Some(verbs::sges![Sge {
                    addr: mem.addr() + at + offset,
                    length: op.len,
                    lkey: *lkey,
                }])
            }
            _ => None,
        };
        let (chunk, sges) = match reserved {
            Some(sges) => (None, sges),
            None => {
                let Some(chunk) = st.free_chunks.pop() else {
                    return false;
                };
                (
                    Some(chunk),
                    verbs::sges![Sge {
                        addr: self.chunk_buf.addr() + (chunk * cs) as u64,
                        length: op.len,
                        lkey: self.chunk_mr.lkey,
                    }],
                )
            }
        };
        let Some(c) = st.conns.get_mut(&conn) else {
            st.free_chunks.extend(chunk);
            return true;
        };
        if let (Local::DataIn { offset }, Some(chunk)) = (op.local, chunk) {
            let chunk_off = chunk * cs;
            let data = match c.data_in.get(&op.cmd) {
                Some(InData::Vec(v)) => v.as_slice(),
                _ => &[],
            };
            let start = (offset as usize).min(data.len());
            let end = (offset as usize + op.len as usize).min(data.len());
            self.chunk_buf.write_at(chunk_off, &data[start..end]);
            if end - start < op.len as usize {
                let zeros = vec![0u8; op.len as usize - (end - start)];
                self.chunk_buf.write_at(chunk_off + (end - start), &zeros);
            }
        }
        let mut wr = SendWr::new(
            KIND_RDMA | op.id.0,
            if read {
                SendOpcode::RdmaRead
            } else {
                SendOpcode::RdmaWrite
            },
            sges,
        );
        wr.remote = RemoteAddr {
            addr: op.remote_va,
            rkey: op.rkey,
        };
        c.outstanding += 1;
        c.queued_wrs += 1;
        // A WRITE out of a memory store holds nothing of the pool, so it
        // can wait for the response queued behind it to say it is done
        // (its data is sent before the response either way): one
        // completion per command, not one per WRITE. At most half the
        // send queue waits so (a read of 1 MiB at QD8 is 128 WRITEs of
        // srp_max_rdma_size), so a signaled request always follows; the
        // channel counts them as out until then, so the queue never
        // overflows.
        if store && c.unsignaled.len() < (c.slot_seq.len() / 2).max(1) {
            wr.flags = SendFlags(wr.flags.0 & !SendFlags::SIGNALED.0);
            c.unsignaled.push_back((c.queued_wrs, op.id));
        }
        c.ops.insert(
            op.id,
            OpInfo {
                chunk,
                cmd: op.cmd,
                local: op.local,
                len: op.len,
                seq: c.queued_wrs,
            },
        );
        let qp = c.qp;
        st.posts.wrs.push(wr);
        st.posts.posts.push(Post {
            conn,
            qp,
            kind: Posted::Rdma { op, chunk },
        });
        true
    }

    /// Posts the batch in `batch` and whatever other threads queue
    /// meanwhile, with the lock let go (`PortLock`); a failed post is
    /// undone and its channel told. In each batch the RDMA READs and
    /// WRITEs go first, then the IUs, each in the order queued: a response
    /// moves only later, never ahead of its data, and same-size packets
    /// (the WRITEs of a batch of reads, their responses) leave back to
    /// back, one GSO send each on soft RoCE. Each QP's run of requests is
    /// one post, in which an unsignaled WRITE joins the WRITE after it
    /// where the two are one contiguous span at both ends (see [`joins`]).
    pub(super) fn flush_posts(&self, mut batch: Batch) {
        loop {
            // The IUs behind the RDMA ops, in one move each list.
            batch.wrs.append(&mut batch.ius);
            batch.posts.append(&mut batch.iu_posts);
            let Batch {
                wrs, posts, ends, ..
            } = &mut batch;
            // Index ranges of `posts` whose posts failed (rare: no
            // allocation otherwise).
            let mut failed: Vec<std::ops::Range<usize>> = Vec::new();
            let mut start = 0;
            while start < posts.len() {
                let qp = posts[start].qp;
                let run = posts[start..].iter().take_while(|p| p.qp == qp).count();
                ends.clear();
                // The run's requests, joins folded in, move down to
                // `start..end` in place (no move at all while none joins).
                let mut end = start;
                for i in start..start + run {
                    if end > start && joins(&wrs[end - 1], &wrs[i]) {
                        let (done, rest) = wrs.split_at_mut(i);
                        let (prev, wr) = (&mut done[end - 1], &rest[0]);
                        prev.sges[0].length += wr.sges[0].length;
                        prev.wr_id = wr.wr_id;
                        prev.flags = wr.flags;
                        *ends.last_mut().expect("one end a request") = i - start;
                    } else {
                        if end != i {
                            wrs.swap(end, i);
                        }
                        ends.push(i - start);
                        end += 1;
                    }
                }
                match self.provider.post_send(qp, &wrs[start..end]) {
                    Ok(()) => {}
                    Err(verbs::VerbsError::BadWr { index, .. }) => {
                        // The requests before the refused one went out.
                        let first = index.checked_sub(1).map_or(0, |k| ends[k] + 1);
                        failed.push(start + first.min(run)..start + run);
                    }
                    Err(_) => failed.push(start..start + run),
                }
                start += run;
            }
            wrs.clear();
            let mut st = self.lock();
            if failed.is_empty() {
                posts.clear();
            }
            for (i, p) in posts.drain(..).enumerate() {
                if failed.iter().any(|r| r.contains(&i)) {
                    self.post_failed(&mut st, p);
                }
            }
            if st.posts.is_empty() {
                st.flushing = false;
                st.flush_bufs = batch;
                return;
            }
            std::mem::swap(&mut st.posts, &mut batch);
        }
    }

    fn post_failed(&self, st: &mut State, p: Post) {
        if let Some(c) = st.conns.get_mut(&p.conn) {
            c.outstanding = c.outstanding.saturating_sub(1);
        }
        match p.kind {
            Posted::Send { slot } => {
                let Some(c) = st.conns.get_mut(&p.conn) else {
                    return;
                };
                c.free_slots.push(slot);
                let channel = c.channel;
                if let Some(ch) = st.target.channel_mut(channel) {
                    ch.handle_send_done(false);
                }
            }
            Posted::Rdma { op, chunk } => {
                st.free_chunks.extend(chunk);
                if let Some(c) = st.conns.get_mut(&p.conn) {
                    c.ops.remove(&op.id);
                }
                self.fail_rdma(st, p.conn, op);
            }
        }
        self.pump(st, p.conn);
    }

    pub(super) fn fail_rdma(&self, st: &mut State, conn: ConnId, op: RdmaOp) {
        let Some(channel) = st.conns.get(&conn).map(|c| c.channel) else {
            return;
        };
        if let Some(ch) = st.target.channel_mut(channel) {
            match op.local {
                Local::Table { .. } => ch.handle_table_read(op.id, None),
                _ => ch.handle_rdma_done(op.id, false),
            }
        }
    }

    pub(super) fn retry_waiting(&self, st: &mut State) {
        while let Some((conn, out)) = st.waiting.pop_front() {
            if !st.conns.contains_key(&conn) {
                continue;
            }
            let op = match &out {
                Output::RdmaRead(op) | Output::RdmaWrite(op) => *op,
                Output::Send { bytes, solicited } => {
                    self.post_send_iu(st, conn, bytes, *solicited);
                    continue;
                }
                _ => continue,
            };
            if !self.post_rdma(st, conn, &out, op) {
                st.waiting.push_front((conn, out));
                break;
            }
            self.pump(st, conn);
        }
    }
}

/// Most bytes WRITEs joined into one request carry (see [`joins`]).
const JOINED_MAX: u32 = 1 << 20;

/// Whether `next`, posted right after `prev` on the same QP, can be one
/// RDMA WRITE with it: both WRITEs of one local span and one remote span,
/// `next` starting where `prev` ends at both ends (same L_Key, same
/// R_Key), `prev` unsignaled, no other flag between them different, and
/// JOINED_MAX bytes at most together. The data WRITEs of a command out of
/// a memory store are such (the channel splits them at
/// srp_max_rdma_size; Linux's ib_srpt posts one WRITE per descriptor).
/// The joined request takes `next`'s id and flags: its completion, when
/// signaled, is `next`'s, and `prev`'s is implied by it as by any later
/// signaled request (`implied_done`). On soft RoCE a WRITE's first packet
/// (with its RETH) starts a new segmented send, so fewer, longer WRITEs
/// take fewer sends.
fn joins(prev: &SendWr, next: &SendWr) -> bool {
    let (SendOpcode::RdmaWrite, SendOpcode::RdmaWrite) = (prev.opcode, next.opcode) else {
        return false;
    };
    let ([a], [b]) = (&prev.sges[..], &next.sges[..]) else {
        return false;
    };
    !prev.flags.contains(SendFlags::SIGNALED)
        && prev.flags.0 == next.flags.0 & !SendFlags::SIGNALED.0
        && a.lkey == b.lkey
        && a.addr.checked_add(u64::from(a.length)) == Some(b.addr)
        && prev.remote.rkey == next.remote.rkey
        && prev.remote.addr.checked_add(u64::from(a.length)) == Some(next.remote.addr)
        && a.length
            .checked_add(b.length)
            .is_some_and(|n| n <= JOINED_MAX)
}

#[cfg(test)]
mod tests {
    use super::{joins, JOINED_MAX};
    use rdma_types::{Lkey, Rkey};
    use verbs::{RemoteAddr, SendFlags, SendOpcode, SendWr, Sge};

    /// A WRITE of `len` bytes from `local` (L_Key 5) to `remote` (R_Key 9).
    fn write(local: u64, remote: u64, len: u32, signaled: bool) -> SendWr {
        let mut wr = SendWr::new(
            local,
            SendOpcode::RdmaWrite,
            verbs::sges![Sge {
                addr: local,
                length: len,
                lkey: Lkey(5),
            }],
        );
        wr.remote = RemoteAddr {
            addr: remote,
            rkey: Rkey(9),
        };
        if !signaled {
            wr.flags = SendFlags(0);
        }
        wr
    }

    #[test]
    fn an_unsignaled_write_joins_the_write_that_continues_it_at_both_ends() {
        let a = write(0x1000, 0x9000, 0x1000, false);
        assert!(joins(&a, &write(0x2000, 0xa000, 0x1000, true)));
        assert!(joins(&a, &write(0x2000, 0xa000, 0x1000, false)));
        // A signaled WRITE keeps its own completion.
        let signaled = write(0x1000, 0x9000, 0x1000, true);
        assert!(!joins(&signaled, &write(0x2000, 0xa000, 0x1000, true)));
        // Not contiguous here, or there, or another key.
        assert!(!joins(&a, &write(0x2001, 0xa000, 0x1000, true)));
        assert!(!joins(&a, &write(0x2000, 0xa008, 0x1000, true)));
        let mut other_rkey = write(0x2000, 0xa000, 0x1000, true);
        other_rkey.remote.rkey = Rkey(10);
        assert!(!joins(&a, &other_rkey));
        let mut other_lkey = write(0x2000, 0xa000, 0x1000, true);
        other_lkey.sges[0].lkey = Lkey(6);
        assert!(!joins(&a, &other_lkey));
        // Not a WRITE, another flag, or too long together.
        let mut read = write(0x2000, 0xa000, 0x1000, true);
        read.opcode = SendOpcode::RdmaRead;
        assert!(!joins(&a, &read));
        let mut fenced = write(0x2000, 0xa000, 0x1000, true);
        fenced.flags = SendFlags::SIGNALED | SendFlags::FENCE;
        assert!(!joins(&a, &fenced));
        let big = write(0x1000, 0x9000, JOINED_MAX, false);
        assert!(!joins(
            &big,
            &write(
                0x1000 + u64::from(JOINED_MAX),
                0x9000 + u64::from(JOINED_MAX),
                1,
                true
            )
        ));
        // An address that would wrap joins nothing.
        let top = write(u64::MAX - 0xfff, 0x9000, 0x1000, false);
        assert!(!joins(&top, &write(0, 0xa000, 0x1000, true)));
    }
}
