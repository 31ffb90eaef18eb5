//! Execution: SCSI commands and task management functions, run inline or
//! on the worker pool, and their results fed back to the sans-IO target.

use super::*;

/// Abort flags kept for reuse (`State::spare_flags`), at most.
const SPARE_FLAGS: usize = 256;

impl Inner {
    /// A command came back from the SCSI core: its data-in and response
    /// go out from the calling thread (a worker), with no hop through the
    /// poller.
    pub(super) fn scsi_done(
        &self,
        conn: ConnId,
        done: ScsiDone,
        data_in: InData,
        data_out: Vec<u8>,
    ) {
        let mut st = self.lock();
        self.done_locked(&mut st, conn, done, data_in, data_out);
        self.pump_noted(&mut st);
        self.run_inline(st);
    }

    /// Hands a finished command to its channel (and its data-out buffer
    /// back, for the next immediate data); what follows is sent by the
    /// caller's [`Inner::pump_noted`], and commands that come out small
    /// enough are kept for this thread.
    pub(super) fn done_locked(
        &self,
        st: &mut State,
        conn: ConnId,
        done: ScsiDone,
        data_in: InData,
        data_out: Vec<u8>,
    ) {
        let Some(c) = st.conns.get_mut(&conn) else {
            // The connection went while the command ran.
            st.free_chunks.extend_from_slice(data_in.chunks());
            return;
        };
        let (cmd, channel) = (done.cmd, c.channel);
        // The job is gone (it ran): a flag nobody else holds serves the
        // next command.
        if let Some(mut q) = c.queued.remove(&cmd) {
            if Arc::get_mut(&mut q.aborted).is_some() && st.spare_flags.len() < SPARE_FLAGS {
                st.spare_flags.push(q.aborted);
            }
        }
        c.data_in.insert(cmd, data_in);
        let taken = st.target.channel_mut(channel).is_some_and(|ch| {
            ch.reuse_data_out(data_out);
            ch.handle_scsi_done(done)
        });
        if !taken {
            // The channel dropped the command while it ran (it is closing)
            // and released it already: no WRITE will name these chunks.
            if let Some(d) = st.conns.get_mut(&conn).and_then(|c| c.data_in.remove(&cmd)) {
                st.free_chunks.extend_from_slice(d.chunks());
            }
        }
        st.inline_here = true;
        self.pump_soon(st, conn);
    }

    pub(super) fn submit_scsi(&self, st: &mut State, conn: ConnId, mut req: ScsiRequest) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let out_len = match &req.data_out {
            DataOut::None => 0,
            DataOut::Immediate(v) => v.len() as u32,
            DataOut::InBuffer { len } => *len,
        };
        let (data_out, parts) = match &mut req.data_out {
            DataOut::None => (Vec::new(), OutParts::None),
            // Moved, not copied: the job holds it from here (the request
            // keeps saying there is data-out, `execute` looks at that).
            DataOut::Immediate(v) => (std::mem::take(v), OutParts::None),
            DataOut::InBuffer { len } => (
                Vec::new(),
                OutParts::Fetched {
                    len: *len,
                    parts: c.fetched.remove(&req.cmd).unwrap_or_default(),
                },
            ),
        };
        let spilled = rdma_types::remove_if_any(&mut c.spilled, &req.cmd).unwrap_or_default();
        let aborted = match st.spare_flags.pop() {
            Some(f) => {
                f.store(false, std::sync::atomic::Ordering::SeqCst);
                f
            }
            None => Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        c.queued.insert(
            req.cmd,
            Queued {
                tag: req.tag,
                lun: req.lun,
                aborted: aborted.clone(),
            },
        );
        // A small command to a memory store runs to completion on this
        // thread once the lock is released, however many are in flight:
        // two thread hand-offs less (to a worker and back to the NIC) for
        // what takes a microsecond.
        // The device, looked up once: whether the command may run here,
        // and else whose threads take it.
        let lun = scsi::Lun::decode(req.lun.0).ok();
        let dev = lun.and_then(|lun| self.scsi.route(&c.nexus, lun, &mut c.route).cloned());
        // Below `inline_max` any command; above it only a READ out of a
        // memory store, which goes out of the store itself (no copy: its
        // size costs nothing here).
        let small = req.data_in_len.max(out_len) <= self.inline_max;
        let inline = st.inline_here
            && self.inline_max > 0
            && (small
                || (out_len == 0
                    && dev
                        .as_ref()
                        .is_some_and(|d| reads_out_of_store(d, &req.cdb, req.data_in_len))))
            && matches!(req.attr, srp::wire::TaskAttr::Simple)
            && lun.is_some()
            && dev
                .as_ref()
                .is_none_or(|d| self.scsi.device_runs_without_blocking(d));
        let job = Job {
            conn,
            nexus: c.nexus.clone(),
            req,
            data_out,
            parts,
            spilled,
            aborted,
            route: match lun {
                Some(_) => c.route.clone(),
                None => scsi::Route::unrouted(None),
            },
        };
        if inline {
            st.inline_jobs.push(job);
            return;
        }
        let pool = dev
            .filter(|d| d.config.threads_num > 0)
            .and_then(|d| self.device_queue(st, &d, conn));
        let sent = match pool {
            Some(q) => q.send(job),
            None => st.jobs.send(job),
        };
        if let Err(mpsc::SendError(job)) = sent {
            // Shutting down: answer BUSY so the initiator retries elsewhere.
            if let OutParts::Fetched { parts, .. } = &job.parts {
                st.free_chunks.extend(parts.iter().map(|p| p.1));
            }
            if let Some(c) = st.conns.get_mut(&conn) {
                c.queued.remove(&job.req.cmd);
            }
            let done = ScsiDone {
                status: scsi::Status::Busy.code(),
                ..ScsiDone::good(job.req.cmd, 0)
            };
            let channel = st.conns.get(&conn).map(|c| c.channel);
            if let Some(ch) = channel.and_then(|c| st.target.channel_mut(c)) {
                ch.handle_scsi_done(done);
            }
        }
    }

    /// The job queue of `dev`, which has threads of its own
    /// (`threads_num`, SCST's per-device threads), for connection `conn`:
    /// made with its threads the first time it runs one of the device's
    /// commands, kept until the connection goes (a per-initiator pool) or
    /// the port stops (a shared one). `None` (the shared workers take the
    /// job) while the port stops, or when no thread could be started.
    fn device_queue(
        &self,
        st: &mut State,
        dev: &Arc<scsi::Device>,
        conn: ConnId,
    ) -> Option<Sender<Job>> {
        let owner = (dev.config.threads_pool == scsi::ThreadsPool::PerInitiator).then_some(conn);
        let key = (Arc::as_ptr(dev) as usize, owner);
        if let Some((_, q)) = st.dev_jobs.get(&key) {
            return Some(q.clone());
        }
        let me = self.me.get().and_then(std::sync::Weak::upgrade)?;
        if st.stopping {
            return None;
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = Vec::new();
        for i in 0..dev.config.threads_num {
            let (w, rx) = (me.clone(), rx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("srpt-dev-{i}"))
                .spawn(move || w.worker_loop(rx));
            match spawned {
                Ok(t) => started.push(t),
                Err(e) => {
                    tracing::warn!(
                        "device threads: thread {i} of {} did not start ({e}); the \
                         device's commands run on the port's workers",
                        dev.config.threads_num
                    );
                    break;
                }
            }
        }
        let any = !started.is_empty();
        {
            let mut threads = self.dev_threads.lock().unwrap_or_else(|e| e.into_inner());
            // The threads of pools whose connections went have ended.
            threads.retain(|t| !t.is_finished());
            threads.extend(started);
        }
        if !any {
            return None;
        }
        st.dev_jobs.insert(key, (dev.clone(), tx.clone()));
        Some(tx)
    }

    pub(super) fn run_tmf(&self, st: &mut State, conn: ConnId, req: TmfRequest) {
        let Some(c) = st.conns.get(&conn) else {
            return;
        };
        let channel = c.channel;
        let tmf = match req.func {
            TmFunc::AbortTask => Some(scsi::Tmf::AbortTask(req.task_tag.0)),
            TmFunc::AbortTaskSet => Some(scsi::Tmf::AbortTaskSet),
            TmFunc::ClearTaskSet => Some(scsi::Tmf::ClearTaskSet),
            TmFunc::LogicalUnitReset => Some(scsi::Tmf::LogicalUnitReset),
            TmFunc::ClearAca => Some(scsi::Tmf::ClearAca),
            _ => None,
        };
        if let Ok(lun) = scsi::Lun::decode(req.lun.0) {
            if let Some(dev) = self.scsi.device(&c.nexus, lun) {
                self.count(lun, &dev, |n| n.tmfs += 1);
                self.abort_queued(st, conn, &req, &dev);
            }
        }
        let code = match (tmf, scsi::Lun::decode(req.lun.0)) {
            (None, _) => RspCode::NotSupported,
            (Some(_), Err(_)) => RspCode::Failed,
            (Some(t), Ok(lun)) => match self.scsi.tmf(&c.nexus, lun, t) {
                scsi::ServiceResponse::FunctionComplete => RspCode::Complete,
                // r16a table 24 has no "rejected": a CLEAR ACA from a
                // nexus other than the faulted one is a failed function.
                scsi::ServiceResponse::FunctionRejected | scsi::ServiceResponse::IncorrectLun => {
                    RspCode::Failed
                }
            },
        };
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.handle_tmf_done(req.cmd, code);
        }
    }

    /// Marks the commands `req` aborts that are queued for the SCSI core
    /// and not finished (see [`Queued`]); the core marks those it runs.
    /// CLEAR TASK SET and LOGICAL UNIT RESET reach every session's tasks
    /// on the device, as they do in the core.
    pub(super) fn abort_queued(
        &self,
        st: &State,
        conn: ConnId,
        req: &TmfRequest,
        dev: &Arc<scsi::Device>,
    ) {
        let every_nexus = match req.func {
            TmFunc::AbortTask | TmFunc::AbortTaskSet => false,
            TmFunc::ClearTaskSet | TmFunc::LogicalUnitReset => true,
            _ => return,
        };
        for (id, c) in st.conns.iter() {
            if *id != conn && !every_nexus {
                continue;
            }
            for q in c.queued.values() {
                let hit = if *id == conn {
                    q.lun == req.lun && (req.func != TmFunc::AbortTask || q.tag == req.task_tag)
                } else {
                    // Another session may reach the device at another LUN.
                    scsi::Lun::decode(q.lun.0)
                        .ok()
                        .and_then(|l| self.scsi.device(&c.nexus, l))
                        .is_some_and(|d| Arc::ptr_eq(&d, dev))
                };
                if hit {
                    q.aborted.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }

    pub(super) fn worker_loop(&self, jobs: Arc<Mutex<Receiver<Job>>>) {
        loop {
            let job = {
                let rx = jobs.lock().unwrap_or_else(|e| e.into_inner());
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            };
            let mut job = job;
            self.gather_job(&mut job);
            let (done, data_in) = self.execute(&job);
            self.scsi_done(job.conn, done, data_in, job.data_out);
        }
    }

    /// Puts a job's data-out together from its chunks and spilled pieces.
    pub(super) fn gather_job(&self, job: &mut Job) {
        let (len, mut parts) = match std::mem::take(&mut job.parts) {
            OutParts::Fetched { len, parts } => (len, parts),
            // Gathered already, or never in chunks.
            other => {
                job.parts = other;
                return;
            }
        };
        parts.sort_by_key(|p| p.0);
        let mut end = 0u64;
        let back_to_back = parts.iter().all(|&(off, _, n)| {
            let next = off == end;
            end += n as u64;
            next
        });
        if job.spilled.is_empty() && back_to_back && end == len as u64 && !parts.is_empty() {
            job.parts = OutParts::Direct(parts);
            return;
        }
        job.data_out = self.gather(len, parts);
        for (offset, bytes) in std::mem::take(&mut job.spilled) {
            let start = (offset as usize).min(job.data_out.len());
            let end = (start + bytes.len()).min(job.data_out.len());
            job.data_out[start..end].copy_from_slice(&bytes[..end - start]);
        }
    }

    /// Updates the counters of `lun` mapping `dev`.
    pub(super) fn count(
        &self,
        lun: scsi::Lun,
        dev: &Arc<scsi::Device>,
        f: impl FnOnce(&mut LunCounters),
    ) {
        let mut t = self.lun_stats.lock().unwrap_or_else(|e| e.into_inner());
        let slot = t
            .entry((lun.value(), Arc::as_ptr(dev) as usize))
            .or_insert_with(|| (Arc::downgrade(dev), LunCounters::default()));
        // A new device at the address of one that is gone starts afresh.
        // Compared by address: no weak reference made per command.
        if slot.0.as_ptr() != Arc::as_ptr(dev) || slot.0.strong_count() == 0 {
            *slot = (Arc::downgrade(dev), LunCounters::default());
        }
        f(&mut slot.1);
    }

    pub(super) fn execute(&self, job: &Job) -> (ScsiDone, InData) {
        let req = &job.req;
        let Ok(lun) = scsi::Lun::decode(req.lun.0) else {
            // SPC-4: LOGICAL UNIT NOT SUPPORTED for an address we cannot decode.
            let mut done = ScsiDone::good(req.cmd, 0);
            done.status = scsi::Status::CheckCondition.code();
            done.sense = scsi::Sense::new(
                scsi::SenseKey::IllegalRequest,
                scsi::Asc::LOGICAL_UNIT_NOT_SUPPORTED,
            )
            .to_fixed();
            return (done, InData::Vec(Vec::new()));
        };
        let data_out_dir = !matches!(req.data_out, DataOut::None);
        let out_len = match &job.parts {
            OutParts::Direct(parts) => parts.iter().map(|p| p.2 as u64).sum(),
            _ => job.data_out.len() as u64,
        };
        let expected = if data_out_dir {
            out_len
        } else {
            req.data_in_len as u64
        };
        // SRP_CMD TASK ATTRIBUTE (r16a table 24) to SAM-5; unknown values
        // were refused when the IU was parsed, reserved ones run SIMPLE.
        let attr = match req.attr {
            srp::wire::TaskAttr::Ordered => scsi::TaskAttr::Ordered,
            srp::wire::TaskAttr::HeadOfQueue => scsi::TaskAttr::HeadOfQueue,
            srp::wire::TaskAttr::Aca => scsi::TaskAttr::Aca,
            _ => scsi::TaskAttr::Simple,
        };
        // Looked up before the command ran (`submit_scsi`): a map change
        // since counts it where it was addressed.
        let dev = job.route.device();
        let direct_in = !data_out_dir && req.data_in_len >= DIRECT_IN_MIN;
        // By its operation code (the core parses the CDB when it runs
        // it): it picks the memory store's path and the counters.
        let medium = scsi::cdb::medium_direction(&req.cdb);
        // A READ from a memory store goes out of the store itself.
        let store = dev
            .as_ref()
            .filter(|_| direct_in && medium == Some(scsi::DataDir::In))
            .and_then(|d| d.backend().memory()?.downcast_ref::<crate::MemStore>())
            .map(crate::MemStore::memory_now)
            .and_then(|mem| Some((self.store_lkey(&mem)?, mem)));
        let reserved = (direct_in && store.is_none())
            .then(|| self.reserve_chunks(req.data_in_len))
            .flatten();
        // The command as the core runs it: below, only where its data is
        // differs.
        let submit = |data_out: &[u8], bufs: Option<&mut scsi::Buffers<'_, '_>>| {
            if job.aborted.load(std::sync::atomic::Ordering::SeqCst) {
                // Aborted before it reached the core: it never runs.
                return scsi::ScsiResponse {
                    status: scsi::Status::TaskAborted,
                    sense: None,
                    device_sense: None,
                    data_in: Vec::new(),
                    residual: scsi::Residual::None,
                    descriptor_sense: false,
                };
            }
            self.scsi.submit_routed(
                &job.route, &job.nexus, lun, req.tag.0, attr, &req.cdb, data_out, expected, bufs,
            )
        };
        let (r, data_in) = match (store, reserved) {
            (Some((lkey, mem)), _) => {
                let mut sink = scsi::Buffers::by_reference(req.data_in_len as usize);
                let mut r = submit(&job.data_out, Some(&mut sink));
                match sink.reference() {
                    Some((at, len)) if mem.contains(mem.addr() + at, len as u64) => {
                        self.direct_in
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        (r, InData::Store { mem, lkey, at, len })
                    }
                    // Not a READ after all, or the store was resized under
                    // it: the data (if any) came back in the vector.
                    _ => {
                        let mut v = std::mem::take(&mut r.data_in);
                        v.truncate(req.data_in_len as usize);
                        (r, InData::Vec(v))
                    }
                }
            }
            (None, Some(chunks)) => {
                let cs = self.chunk_size as usize;
                let len = req.data_in_len as usize;
                // SAFETY: `chunks` came off the free list for this command
                // alone and no work request names them until the command
                // is done.
                let mut pieces: Vec<&mut [u8]> = unsafe {
                    self.chunk_views(
                        chunks
                            .iter()
                            .enumerate()
                            .map(|(k, &chunk)| (chunk, len - k * cs)),
                    )
                    .collect()
                };
                let mut sink = scsi::Buffers::data_in(&mut pieces);
                let r = submit(&job.data_out, Some(&mut sink));
                let len = sink.placed();
                if sink.read_direct() {
                    self.direct_in
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                (r, InData::Chunks { chunks, len })
            }
            (None, None) => {
                let mut r = match &job.parts {
                    OutParts::Direct(parts) => {
                        // SAFETY: the READs that filled these chunks have
                        // completed and the chunks stay this command's
                        // until they are freed below.
                        let pieces: Vec<&[u8]> = unsafe {
                            self.chunk_views(parts.iter().map(|&(_, chunk, n)| (chunk, n as usize)))
                                .map(|p| &*p)
                                .collect()
                        };
                        let mut bufs = scsi::Buffers::data_out(&pieces);
                        let r = submit(&[], Some(&mut bufs));
                        self.direct_out
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let mut st = self.lock();
                        st.free_chunks.extend(parts.iter().map(|p| p.1));
                        self.retry_waiting(&mut st);
                        r
                    }
                    _ => submit(&job.data_out, None),
                };
                let mut v = std::mem::take(&mut r.data_in);
                v.truncate(req.data_in_len as usize);
                (r, InData::Vec(v))
            }
        };
        let sense = r.sense_bytes().unwrap_or_default();
        let in_len = data_in.len();
        if let Some(dev) = &dev {
            let good = r.status == scsi::Status::Good;
            let (data_in_len, data_out_len) = (in_len as u64, out_len);
            self.count(lun, dev, |n| {
                n.commands += 1;
                match medium {
                    Some(scsi::DataDir::In) if good => {
                        n.reads += 1;
                        n.read_bytes += data_in_len;
                    }
                    Some(scsi::DataDir::Out) if good => {
                        n.writes += 1;
                        n.write_bytes += data_out_len;
                    }
                    _ => {}
                }
                if r.status == scsi::Status::CheckCondition {
                    match r.sense.map(|s| s.key) {
                        Some(scsi::SenseKey::UnitAttention) => n.unit_attentions += 1,
                        _ => n.errors += 1,
                    }
                }
            });
        }
        let mut done = ScsiDone::good(req.cmd, in_len as u32);
        done.status = u8::from(r.status);
        done.sense = sense;
        done.aborted = r.status == scsi::Status::TaskAborted;
        match r.residual {
            scsi::Residual::Over(n) if data_out_dir => {
                done.wanted_out = Some((expected + n).min(u32::MAX as u64) as u32)
            }
            scsi::Residual::Over(n) => {
                done.wanted_in = Some((expected + n).min(u32::MAX as u64) as u32)
            }
            scsi::Residual::Under(n) if data_out_dir => {
                done.wanted_out = Some(expected.saturating_sub(n) as u32)
            }
            _ => {}
        }
        (done, data_in)
    }
}

/// Whether `cdb` is a READ of `len` bytes that the port sends straight out
/// of `dev`'s memory store (see `execute`).
fn reads_out_of_store(dev: &scsi::Device, cdb: &[u8], len: u32) -> bool {
    use scsi::Opcode::{Read10, Read12, Read16, Read6};
    len >= DIRECT_IN_MIN
        && cdb
            .first()
            .is_some_and(|&op| matches!(scsi::Opcode::from(op), Read6 | Read10 | Read12 | Read16))
        && dev
            .backend()
            .memory()
            .is_some_and(|m| m.downcast_ref::<crate::MemStore>().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(backend: Arc<dyn scsi::Backend>) -> scsi::Device {
        scsi::Device::new(scsi::DeviceConfig::default(), backend).unwrap()
    }

    #[test]
    fn only_reads_out_of_a_memory_store_count_as_copy_free() {
        let mem = device(Arc::new(crate::MemStore::new(4 << 20).unwrap()));
        let ram = device(Arc::new(scsi::Ram::new(4 << 20)));
        let read10 = [0x28, 0, 0, 0, 0, 0, 0, 0x08, 0, 0];
        let read16 = [0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0, 0, 0];
        let write10 = [0x2a, 0, 0, 0, 0, 0, 0, 0x08, 0, 0];
        assert!(reads_out_of_store(&mem, &read10, 1 << 20));
        assert!(reads_out_of_store(&mem, &read16, 1 << 20));
        // A WRITE copies into the store; a short READ goes in chunks.
        assert!(!reads_out_of_store(&mem, &write10, 1 << 20));
        assert!(!reads_out_of_store(&mem, &read10, DIRECT_IN_MIN - 1));
        // A store that is not memory the port sends from copies.
        assert!(!reads_out_of_store(&ram, &read10, 1 << 20));
        assert!(!reads_out_of_store(&mem, &[], 1 << 20));
    }
}
