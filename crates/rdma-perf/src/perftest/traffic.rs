//! The measured traffic: the client's posts and completions, the server's
//! receives, and the checks of what arrived (data and atomic results).

use super::*;

/// Client: moves the messages, returns (post times, completion times).
pub(super) fn client_run(
    nic: &Nic,
    cfg: &PerftestConfig,
    sys: SysData,
    peer: &Dest,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(Vec<f64>, Vec<f64>), PerftestError> {
    let n = cfg.iters;
    let size = cfg.size;
    // A latency run has one message in flight (perftest's tx depth 1).
    let depth = if cfg.latency {
        1
    } else {
        u64::from(cfg.tx_depth).min(n)
    };
    let mut atomics = (cfg.verb == Verb::Atomic).then(|| atomic_model(cfg, sys, peer_is_ours));
    let epoch = Instant::now();
    let stop_posting = cfg.duration.map(|d| epoch + d);
    let room = (n as usize).min(1 << 20);
    let mut posted_at = Vec::with_capacity(room);
    let mut done_at = Vec::with_capacity(room);
    // READ with a Linux peer: the first bytes seen per slot.
    let mut seen: Vec<Option<Vec<u8>>> = vec![None; slot_count(size, sys)];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wc = vec![empty_wc(); 64];
    let mut idle = 0u32;
    let mut last_progress = Instant::now();
    let opcode = match (cfg.verb, cfg.atomic) {
        (Verb::Write, _) => SendOpcode::RdmaWrite,
        (Verb::Read, _) => SendOpcode::RdmaRead,
        (Verb::Send, _) => SendOpcode::Send,
        (Verb::Atomic, AtomicOp::FetchAdd) => SendOpcode::AtomicFetchAdd,
        (Verb::Atomic, AtomicOp::CmpSwap) => SendOpcode::AtomicCmpSwp,
    };
    // An atomic's result slot: one per message in flight.
    let result_at = |k: u64| (k % depth) as usize * ATOMIC_SIZE;
    // When the stop flag was seen: posting ends, what is in flight has
    // DRAIN to complete.
    let mut interrupted: Option<Instant> = None;
    loop {
        if interrupted.is_none() && cfg.stop.load(Ordering::Relaxed) {
            interrupted = Some(Instant::now());
        }
        let over = interrupted.is_some() || stop_posting.is_some_and(|t| Instant::now() >= t);
        if done >= n
            || (over && done == posted)
            || interrupted.is_some_and(|t| t.elapsed() >= crate::DRAIN)
        {
            break;
        }
        let mut batch = Vec::new();
        while !over && posted < n && posted - done < depth {
            // The peer's slot: perftest's walk, or its VADDR when timing
            // latency (no walk in run_iter_lat).
            let off = if cfg.latency {
                0
            } else {
                slot_offset(posted, size, sys)
            };
            let local = if atomics.is_some() {
                result_at(posted)
            } else {
                off
            };
            let mut wr = SendWr::new(
                posted,
                opcode,
                vec![Sge {
                    addr: nic.mem.addr() + local as u64,
                    length: size as u32,
                    lkey: nic.mr.lkey,
                }],
            );
            if cfg.verb.remote() {
                wr.remote = RemoteAddr {
                    addr: peer.vaddr.wrapping_add(off as u64),
                    rkey: Rkey(peer.rkey),
                };
            }
            if let Some(m) = atomics.as_mut() {
                let o = m.post(off / slot_step(size, sys));
                wr.compare_add = o.compare_add;
                wr.swap = o.swap;
            }
            batch.push(wr);
            posted += 1;
        }
        if !batch.is_empty() {
            let t = epoch.elapsed().as_secs_f64();
            posted_at.extend(std::iter::repeat_n(t, batch.len()));
            nic.p
                .post_send(nic.qp, &batch)
                .map_err(|e| PerftestError::Transfer(format!("post send: {e}")))?;
        }
        let got = nic.poll(&mut wc, &mut idle)?;
        for c in &wc[..got] {
            if c.status != WcStatus::Success {
                return Err(wc_error(c, done, n));
            }
            if c.wr_id != done {
                return Err(PerftestError::Transfer(format!(
                    "completion for message {} when {done} was next",
                    c.wr_id
                )));
            }
            if cfg.verb == Verb::Read {
                let off = slot_offset(done, size, sys);
                let got = nic.mem.to_vec(off, size);
                let slot = off / slot_step(size, sys);
                if peer_is_ours {
                    if got != pattern(off, size) {
                        return Err(PerftestError::Verify(format!(
                            "READ {done} (slot {slot}) brought back bytes other than the server's pattern"
                        )));
                    }
                } else if let Some(first) = &seen[slot] {
                    if *first != got {
                        return Err(PerftestError::Verify(format!(
                            "READ {done} of slot {slot} brought back different bytes than the first READ of it"
                        )));
                    }
                } else {
                    seen[slot] = Some(got);
                }
            }
            if let Some(m) = atomics.as_mut() {
                let got = nic.mem.to_vec(result_at(done), ATOMIC_SIZE);
                let got = u64::from_ne_bytes(got.try_into().unwrap_or([0; 8]));
                m.complete(got)
                    .map_err(|e| PerftestError::Verify(e.to_string()))?;
            }
            done += 1;
            done_at.push(epoch.elapsed().as_secs_f64());
            last_progress = Instant::now();
            if done == 1 {
                tracing::info!(
                    "rperftest client: first {} completed; running",
                    cfg.verb.name()
                );
            }
        }
        if last_progress.elapsed() > cfg.timeout {
            return Err(PerftestError::Transfer(format!(
                "no completion for {:?} ({done} of {n} done)",
                cfg.timeout
            )));
        }
    }
    let n = done;
    verified.push(format!("{n} completions, all successful and in order"));
    if cfg.verb == Verb::Read {
        verified.push(if peer_is_ours {
            format!("every READ brought back the server's pattern ({n} x {size} bytes)")
        } else {
            format!(
                "every READ of a slot brought back the same bytes as the first ({} slots)",
                seen.iter().filter(|s| s.is_some()).count()
            )
        });
    }
    if let Some(m) = &atomics {
        verified.push(m.summary());
    }
    Ok((posted_at, done_at))
}

/// The atomic slots of the walk (one when timing latency: every message
/// hits the peer's `VADDR`).
pub(super) fn atomic_slots(cfg: &PerftestConfig, sys: SysData) -> usize {
    if cfg.latency {
        1
    } else {
        slot_count(ATOMIC_SIZE, sys)
    }
}

/// Our server's initial value of atomic slot `s`: its pattern.
pub(super) fn atomic_initial(s: usize, sys: SysData) -> u64 {
    let p = pattern(s * slot_step(ATOMIC_SIZE, sys), ATOMIC_SIZE);
    u64::from_ne_bytes(p.try_into().unwrap_or([0; 8]))
}

/// The client's model of the server's slots: exact (and with real swaps)
/// when the server is ours and so holds our pattern.
pub(super) fn atomic_model(cfg: &PerftestConfig, sys: SysData, peer_is_ours: bool) -> AtomicModel {
    let initial: Vec<Option<u64>> = (0..atomic_slots(cfg, sys))
        .map(|s| peer_is_ours.then(|| atomic_initial(s, sys)))
        .collect();
    AtomicModel::new(cfg.atomic, peer_is_ours, &initial)
}

/// SEND server: receive buffers, one per posted receive, so a message is
/// checked before anything can land on it again.
pub(super) struct Receiver {
    pub(super) bufs: usize,
    pub(super) posted: u64,
}

impl Receiver {
    pub(super) fn post(
        &mut self,
        nic: &Nic,
        cfg: &PerftestConfig,
        sys: SysData,
    ) -> Result<(), PerftestError> {
        let off = nic.half + (self.posted as usize % self.bufs) * slot_step(cfg.size, sys);
        nic.p
            .post_recv(
                nic.qp,
                &[RecvWr {
                    wr_id: self.posted,
                    sges: verbs::sges![Sge {
                        addr: nic.mem.addr() + off as u64,
                        length: cfg.size as u32,
                        lkey: nic.mr.lkey,
                    }],
                }],
            )
            .map_err(|e| PerftestError::Transfer(format!("post receive: {e}")))?;
        self.posted += 1;
        Ok(())
    }

    /// Posts the first receives (before the client may send).
    pub(super) fn start(
        nic: &Nic,
        cfg: &PerftestConfig,
        sys: SysData,
        bufs: usize,
    ) -> Result<Receiver, PerftestError> {
        let mut r = Receiver { bufs, posted: 0 };
        while r.posted < cfg.iters.min(bufs as u64) {
            r.post(nic, cfg, sys)?;
        }
        Ok(r)
    }

    /// Receives `iters` messages, or until the stop flag; returns seconds
    /// from the first to the last, and how many arrived.
    pub(super) fn run(
        &mut self,
        nic: &Nic,
        cfg: &PerftestConfig,
        sys: SysData,
        peer_is_ours: bool,
        verified: &mut Vec<String>,
    ) -> Result<(f64, u64), PerftestError> {
        let (n, size) = (cfg.iters, cfg.size);
        let step = slot_step(size, sys);
        let mut wc = vec![empty_wc(); 64];
        let mut idle = 0u32;
        let mut done = 0u64;
        let mut first: Option<Instant> = None;
        let mut last: Option<Instant> = None;
        let mut last_progress = Instant::now();
        while done < n && !cfg.stop.load(Ordering::Relaxed) {
            let got = nic.poll(&mut wc, &mut idle)?;
            for c in &wc[..got] {
                if c.status != WcStatus::Success {
                    return Err(wc_error(c, done, n));
                }
                first.get_or_insert_with(Instant::now);
                if c.byte_len as usize != size {
                    return Err(PerftestError::Verify(format!(
                        "SEND {done} carried {} bytes, not {size}",
                        c.byte_len
                    )));
                }
                if peer_is_ours {
                    let at = nic.half + (c.wr_id as usize % self.bufs) * step;
                    let src = slot_offset(done, size, sys);
                    if nic.mem.to_vec(at, size) != pattern(src, size) {
                        return Err(PerftestError::Verify(format!(
                            "SEND {done} does not carry the client's pattern of slot {}",
                            src / step
                        )));
                    }
                }
                done += 1;
                if self.posted < n {
                    self.post(nic, cfg, sys)?;
                }
                last_progress = Instant::now();
                last = Some(last_progress);
            }
            if last_progress.elapsed() > cfg.timeout {
                return Err(PerftestError::Transfer(format!(
                    "no SEND arrived for {:?} ({done} of {n} received)",
                    cfg.timeout
                )));
            }
        }
        verified.push(format!(
            "{done} receives, all successful with {size} bytes each"
        ));
        if peer_is_ours {
            verified.push("every SEND carried the client's pattern".into());
        }
        let secs = match (first, last) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        Ok((secs, done))
    }
}

/// WRITE/READ server: checks the target buffer after the client is done.
pub(super) fn server_check(
    nic: &Nic,
    cfg: &PerftestConfig,
    sys: SysData,
    client: Option<BwReport>,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(), PerftestError> {
    let size = cfg.size;
    // The client's own count (perftest wants -n equal on both sides, but
    // the slots written follow what the client did).
    let iters = match client {
        Some(r) if r.size != size as u64 => {
            return Err(PerftestError::Verify(format!(
            "the client moved {}-byte messages, we were told -s {size}: run both with the same -s",
            r.size
        )))
        }
        Some(r) => r.iters,
        None => cfg.iters,
    };
    let base = nic.half;
    let region = nic.mem.to_vec(base, nic.half);
    if cfg.verb == Verb::Atomic {
        return atomic_server_check(&region, cfg, sys, iters, peer_is_ours, verified);
    }
    if cfg.verb == Verb::Read {
        if region != pattern(0, nic.half) {
            return Err(PerftestError::Verify(
                "the READ source buffer changed during the test".into(),
            ));
        }
        verified.push("the READ source buffer was not written".into());
        return Ok(());
    }
    let slots = (slot_count(size, sys) as u64).min(iters) as usize;
    let step = slot_step(size, sys);
    let mut written = vec![false; nic.half];
    for s in 0..slots {
        let off = slot_offset(s as u64, size, sys);
        written[off..off + size].iter_mut().for_each(|w| *w = true);
        let got = &region[off..off + size];
        if peer_is_ours {
            if got != pattern(off, size).as_slice() {
                return Err(PerftestError::Verify(format!(
                    "slot {} does not hold the client's pattern",
                    off / step
                )));
            }
        } else if size >= 16 && got.iter().all(|&b| b == CANARY) {
            return Err(PerftestError::Verify(format!(
                "slot {} was never written",
                off / step
            )));
        }
    }
    if let Some(i) = (0..nic.half).find(|&i| !written[i] && region[i] != CANARY) {
        return Err(PerftestError::Verify(format!(
            "byte {i} of the target buffer, outside every written slot, changed"
        )));
    }
    verified.push(if peer_is_ours {
        format!("all {slots} written slots hold the client's pattern; nothing else changed")
    } else {
        format!("all {slots} slots were written; nothing outside them changed")
    });
    Ok(())
}

/// Atomic server: each slot of `region` (our target, which started as our
/// pattern) holds what `iters` atomics of the client's leave there, and
/// nothing else changed.
pub(super) fn atomic_server_check(
    region: &[u8],
    cfg: &PerftestConfig,
    sys: SysData,
    iters: u64,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(), PerftestError> {
    let slots = atomic_slots(cfg, sys);
    let step = slot_step(ATOMIC_SIZE, sys);
    let initial: Vec<u64> = (0..slots).map(|s| atomic_initial(s, sys)).collect();
    let finals = |op: AtomicOp| {
        atomic::final_values(op, peer_is_ours, &initial, iters, |k| {
            (k % slots as u64) as usize
        })
    };
    let want = finals(cfg.atomic);
    let held: Vec<u64> = (0..slots)
        .map(|s| {
            let b = &region[s * step..s * step + ATOMIC_SIZE];
            u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
        })
        .collect();
    if held != want {
        let other = cfg.atomic.other();
        if held == finals(other) {
            return Err(PerftestError::Verify(format!(
                "the slots hold what {iters} {} would leave, not {iters} {}: run both sides with the same -A",
                other.name(),
                cfg.atomic.name()
            )));
        }
        let s = (0..slots).find(|&s| held[s] != want[s]).unwrap_or(0);
        let visits = iters / slots as u64 + u64::from((s as u64) < iters % slots as u64);
        return Err(PerftestError::Verify(format!(
            "atomic slot {s} holds {:#018x}, expected {:#018x} (initially {:#018x}, {visits} {} of {iters} in all{})",
            held[s],
            want[s],
            initial[s],
            cfg.atomic.name(),
            if cfg.latency {
                "; a latency server counts its own -n: run both sides with the same -n"
            } else {
                ""
            }
        )));
    }
    let mut written = vec![false; region.len()];
    for s in 0..slots {
        written[s * step..s * step + ATOMIC_SIZE]
            .iter_mut()
            .for_each(|w| *w = true);
    }
    let start = pattern(0, region.len());
    if let Some(i) = (0..region.len()).find(|&i| !written[i] && region[i] != start[i]) {
        return Err(PerftestError::Verify(format!(
            "byte {i} of the atomic target buffer, outside every slot, changed"
        )));
    }
    let used = (slots as u64).min(iters);
    let (subject, hold, its) = if used == 1 {
        ("the atomic slot".to_string(), "holds", "its")
    } else {
        (format!("all {used} atomic slots"), "hold", "their")
    };
    verified.push(match cfg.atomic {
        AtomicOp::FetchAdd => format!(
            "{subject} {hold} {its} initial value plus 1 per FETCH_AND_ADD ({iters} in all); nothing else changed"
        ),
        AtomicOp::CmpSwap if peer_is_ours => format!(
            "{subject} {hold} the last swap whose compare matched ({iters} CMP_AND_SWAP in all); nothing else changed"
        ),
        AtomicOp::CmpSwap => format!(
            "{subject} kept {its} nonzero initial value ({iters} CMP_AND_SWAP of compare 0, swap 0); nothing else changed"
        ),
    });
    Ok(())
}
