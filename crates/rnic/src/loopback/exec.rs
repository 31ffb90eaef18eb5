//! The data path: a send queue's WRs executed against the peer found by
//! the path, memory copied between checked gather and scatter lists,
//! completions and errors as the verbs contract asks.

use super::*;

/// The sending QP of the WR being executed, as the data path reads it:
/// looked up once per WR instead of at every step.
#[derive(Clone, Copy)]
struct Sender {
    qi: usize,
    dev: usize,
    pd: usize,
    qpn: u32,
    qt: QpType,
    mig: MigState,
    peer: Option<Peer>,
}

/// Gathers/scatters: checks every SGE with `needs`, appending the targets
/// to `into` (left empty on failure). Returns the list's length in bytes.
/// A function of the key table alone, so that `into` may be the state's
/// own `gather` or `scatter`. Inlined: most WRs' lists are one SGE, and
/// the call's register saves and restores cost about what the loop does.
#[inline(always)]
fn sg(
    keys: &KeyTable,
    pd: usize,
    sges: &[Sge],
    needs: AccessFlags,
    into: &mut Vec<(Target, usize)>,
) -> Result<u64, WcStatus> {
    let mut total = 0;
    for s in sges {
        if s.length == 0 {
            continue;
        }
        match keys.local(pd as u32, s.lkey, s.addr, s.length as u64, needs) {
            Ok(t) => into.push((t, s.length as usize)),
            Err(e) => {
                into.clear();
                return Err(e);
            }
        }
        total += s.length as u64;
    }
    Ok(total)
}

impl State {
    /// Runs `f` with the receive WR's checked scatter list and its length
    /// (the `scatter` vector, emptied afterwards).
    fn with_scatter<T>(
        &mut self,
        dev: usize,
        pd: usize,
        sges: &[Sge],
        f: impl FnOnce(&State, Result<(&[(Target, usize)], u64), WcStatus>) -> T,
    ) -> T {
        let r = sg(
            &self.devices[dev].keys,
            pd,
            sges,
            AccessFlags::LOCAL_WRITE,
            &mut self.scatter,
        );
        let out = f(self, r.map(|n| (&self.scatter[..], n)));
        self.scatter.clear();
        out
    }

    fn take_recv(&mut self, qi: usize, out: &mut Vec<Cb>) -> Option<RecvWr> {
        let q = self.qp(qi);
        let Some(si) = q.srq else {
            return q.rq.take().map(|(wr, _)| wr);
        };
        let (wr, fire) = match self.obj_mut(si) {
            Obj::Srq { rq, .. } => rq.take()?,
            _ => return None,
        };
        if fire {
            if let Obj::Srq { ca, ctx, .. } = self.obj(si) {
                self.event(*ca, AsyncEventKind::SrqLimitReached, *ctx, None, out);
            }
        }
        Some(wr)
    }

    /// Runs the send queue of `qi` as far as it goes.
    pub(super) fn progress(&mut self, qi: usize, out: &mut Vec<Cb>) {
        loop {
            let q = self.qp(qi);
            if q.state != QpState::Rts {
                return;
            }
            let Some(wr) = q.pending.pop_front() else {
                return;
            };
            if !self.run_one(qi, &wr, out) {
                self.qp(qi).pending.push_front(wr);
                self.backlog = true;
                return;
            }
        }
    }

    /// Executes one WR and completes it; false if it must wait (RNR).
    pub(super) fn run_one(&mut self, qi: usize, wr: &SendWr, out: &mut Vec<Cb>) -> bool {
        let q = self.qpr(qi);
        let sig = q.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let (scq, ctx) = (q.send_cq, q.ctx);
        let rnr_retry = q.attr.rnr_retry.unwrap_or(0);
        let s = Sender {
            qi,
            dev: q.dev,
            pd: q.pd,
            qpn: q.qpn,
            qt: q.init.qp_type,
            mig: q.mig,
            peer: q.peer,
        };
        let status = match self.execute(s, wr, out) {
            Exec::Rnr if rnr_retry == 0 => Err(WcStatus::RnrRetryExcErr),
            Exec::Rnr => return false,
            Exec::Done(r) => r,
        };
        match status {
            Ok(byte_len) => {
                if sig {
                    let mut wc =
                        WorkCompletion::new(wr.wr_id, WcStatus::Success, wc_opcode(wr.opcode), ctx);
                    wc.byte_len = byte_len;
                    self.complete(scq, wc, false, out);
                }
            }
            Err(st) => {
                // An error completion moves an RC QP to ERR (IBA 10.8.3),
                // a UC/UD QP to SQE (IBA 10.3.1.6); both flush the sends
                // behind it. In SQE the receive queue keeps working.
                self.complete(
                    scq,
                    WorkCompletion::new(wr.wr_id, st, wc_opcode(wr.opcode), ctx),
                    false,
                    out,
                );
                if s.qt == QpType::Rc {
                    self.enter_error(qi, out);
                } else {
                    self.enter_sqe(qi, out);
                }
            }
        }
        true
    }

    fn execute(&mut self, s: Sender, wr: &SendWr, out: &mut Vec<Cb>) -> Exec {
        let Sender { dev, pd, qpn, .. } = s;
        // Local-only operations.
        match wr.opcode {
            SendOpcode::LocalInv => {
                return Exec::Done(
                    self.devices[dev]
                        .keys
                        .invalidate(pd as u32, wr.invalidate_rkey)
                        .map(|_| 0)
                        .map_err(|_| WcStatus::MwBindErr),
                )
            }
            SendOpcode::BindMw => {
                let Some(b) = wr.bind_mw else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (Ok(mwi), Ok(mri)) = (self.slot(b.mw.0), self.slot(b.mr.0)) else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (
                    Obj::Mw {
                        key: mwk,
                        kind: MwType::Type2,
                        ..
                    },
                    Obj::Mr { key: mrk, .. },
                ) = (self.obj(mwi), self.obj(mri))
                else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (mwk, mrk) = (*mwk, *mrk);
                if b.rkey.0 >> 8 != mwk >> 8 {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                }
                let r = self.devices[dev].keys.bind_mw(
                    pd as u32,
                    mwk >> 8,
                    mrk >> 8,
                    b.addr,
                    b.len,
                    b.access,
                    b.rkey.0 as u8,
                    qpn,
                );
                if let (Ok(k), Obj::Mw { key, .. }) = (r, self.obj_mut(mwi)) {
                    *key = k;
                }
                return Exec::Done(r.map(|_| 0));
            }
            _ => {}
        }
        let needs_local = match wr.opcode {
            SendOpcode::RdmaRead | SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => {
                AccessFlags::LOCAL_WRITE
            }
            _ => AccessFlags::NONE,
        };
        let keys = &self.devices[dev].keys;
        let r = match sg(keys, pd, &wr.sges, needs_local, &mut self.gather) {
            // The checked list's length is the WR's: empty SGEs add nothing.
            Ok(len) => self.transfer(s, wr, len, out),
            Err(e) => Exec::Done(Err(e)),
        };
        self.gather.clear();
        r
    }

    /// The part of `execute` that moves data: `gather` holds the WR's
    /// checked gather (or, for READ and atomics, scatter) list, `len` its
    /// length.
    fn transfer(&mut self, s: Sender, wr: &SendWr, len: u64, out: &mut Vec<Cb>) -> Exec {
        let Sender {
            qi, dev, qpn, qt, ..
        } = s;
        // A message no responder takes: an RC requester's retries run
        // out, a UC or UD message is lost.
        let lost = || {
            Exec::Done(if qt == QpType::Rc {
                Err(WcStatus::RetryExcErr)
            } else {
                Ok(len as u32)
            })
        };
        let (port, pi, at, dq, mig) = match s.peer {
            // Nothing that decides the path changed since it was found
            // (an armed QP may migrate first, which changes the count).
            Some(c) if c.epoch == self.paths && s.mig != MigState::Armed => {
                (c.port, c.slot, c.at, c.dqpn, s.mig)
            }
            _ => {
                let mut q = self.qpr(qi);
                if !qt.is_datagram() && q.mig == MigState::Armed {
                    self.migrate_if_failed(qi, out);
                    q = self.qpr(qi);
                }
                let port = self.qp_port(q);
                if !self.port_active(dev, port) {
                    return lost();
                }
                if qt.is_datagram() {
                    return Exec::Done(self.ud_send(qi, wr, len, out));
                }
                // Connected: find the peer.
                let (Some(av), Some(dq), mig) = (&q.attr.av, q.attr.dest_qpn, q.mig) else {
                    return Exec::Done(Err(WcStatus::RetryExcErr));
                };
                let Some((pi, at)) = self
                    .device_of_port(av)
                    .filter(|(d, p)| self.port_active(*d, *p))
                    .and_then(|(d, p)| Some((self.devices[d].qpns.get(&dq.value()).copied()?, p)))
                else {
                    return lost();
                };
                self.qp(qi).peer = Some(Peer {
                    epoch: self.paths,
                    port,
                    slot: pi,
                    at,
                    dqpn: dq,
                });
                (port, pi, at, dq, mig)
            }
        };
        let p = self.qpr(pi);
        // The slot still holds the QP the path named (a cached peer whose
        // QP was replaced would fail here even if a change were missed).
        if p.qpn != dq.value()
            || !matches!(
                p.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            || p.attr.dest_qpn.map(|x| x.value()) != Some(qpn)
            || p.init.qp_type != qt
        {
            return lost();
        }
        // MigReq (IBA 17.2.8, BTH:MigReq): a migrated requester that
        // reaches an armed responder on the responder's alternate path
        // makes the responder migrate too.
        let mig_req = mig == MigState::Migrated
            && p.mig == MigState::Armed
            && p.attr.alt_path.is_some_and(|alt| {
                alt.port == at && self.device_of_port(&alt.av) == Some((dev, port))
            });
        // Migrating changes the peer's path only, none of these.
        let (pdev, ppd, pctx, prcq, paccess) = (
            p.dev,
            p.pd,
            p.ctx,
            p.recv_cq,
            p.attr.access.unwrap_or(AccessFlags::NONE),
        );
        let (pca, establish) = (p.ca, p.state == QpState::Rtr && !p.established);
        if mig_req {
            self.migrate(pi, out);
        }
        debug_assert!(self.qpr(qi).attr.path_mtu.is_some());
        if establish {
            self.qp(pi).established = true;
            self.event(pca, AsyncEventKind::CommEstablished, pctx, None, out);
        }
        let remote = |st: &State, needs: AccessFlags, l: u64| -> Result<Target, WcStatus> {
            if !paccess.contains(needs) {
                return Err(WcStatus::RemAccessErr);
            }
            st.devices[pdev].keys.remote(
                ppd as u32,
                wr.remote.rkey,
                wr.remote.addr,
                l,
                needs,
                dq.value(),
            )
        };
        let rc = qt == QpType::Rc;
        match wr.opcode {
            // Zero length: no memory touched, no key checked (as the soft
            // RoCE responder); SRP initiators send it as a liveness probe.
            SendOpcode::RdmaWrite if len == 0 => Exec::Done(Ok(0)),
            SendOpcode::RdmaWrite => match remote(self, AccessFlags::REMOTE_WRITE, len) {
                Ok(t) => {
                    copy_sg(&self.gather, &[(t, len as usize)]);
                    Exec::Done(Ok(len as u32))
                }
                Err(e) if rc => {
                    self.responder_fatal(pi, out);
                    Exec::Done(Err(e))
                }
                Err(_) => Exec::Done(Ok(len as u32)),
            },
            SendOpcode::RdmaRead => match remote(self, AccessFlags::REMOTE_READ, len) {
                Ok(t) => {
                    copy_sg(&[(t, len as usize)], &self.gather);
                    Exec::Done(Ok(len as u32))
                }
                Err(e) => {
                    self.responder_fatal(pi, out);
                    Exec::Done(Err(e))
                }
            },
            SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => {
                if len != 8 || self.gather.len() != 1 {
                    return Exec::Done(Err(WcStatus::LocLenErr));
                }
                if wr.remote.addr & 7 != 0 {
                    self.responder_fatal(pi, out);
                    return Exec::Done(Err(WcStatus::RemInvReqErr));
                }
                match remote(self, AccessFlags::REMOTE_ATOMIC, 8) {
                    Ok(t) => {
                        let (cmp, swap) = (wr.compare_add, wr.swap);
                        let old = if wr.opcode == SendOpcode::AtomicCmpSwp {
                            t.buf.atomic_u64(t.off, |v| if v == cmp { swap } else { v })
                        } else {
                            t.buf.atomic_u64(t.off, |v| v.wrapping_add(cmp))
                        };
                        let (l, _) = &self.gather[0];
                        l.buf.write_at(l.off, &old.to_ne_bytes());
                        Exec::Done(Ok(8))
                    }
                    Err(e) => {
                        self.responder_fatal(pi, out);
                        Exec::Done(Err(e))
                    }
                }
            }
            SendOpcode::RdmaWriteWithImm
            | SendOpcode::Send
            | SendOpcode::SendWithImm
            | SendOpcode::SendWithInv => {
                let target = if wr.opcode == SendOpcode::RdmaWriteWithImm {
                    match remote(self, AccessFlags::REMOTE_WRITE, len) {
                        Ok(t) => Some(t),
                        Err(e) if rc => {
                            self.responder_fatal(pi, out);
                            return Exec::Done(Err(e));
                        }
                        Err(_) => return Exec::Done(Ok(len as u32)),
                    }
                } else {
                    None
                };
                let Some(rwr) = self.take_recv(pi, out) else {
                    // RC: RNR NAK (IBA 9.7.5.2.8); UC: message dropped.
                    return if rc {
                        Exec::Rnr
                    } else {
                        Exec::Done(Ok(len as u32))
                    };
                };
                let mut wc =
                    WorkCompletion::new(rwr.wr_id, WcStatus::Success, WcOpcode::Recv, pctx);
                wc.byte_len = len as u32;
                wc.src_qp = Qpn::from_bits(qpn);
                let mut fail = None;
                if let Some(t) = target {
                    copy_sg(&self.gather, &[(t, len as usize)]);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                } else {
                    fail = self.with_scatter(pdev, ppd, &rwr.sges, |st, dst| match dst {
                        Ok((dst, room)) if room >= len => {
                            copy_sg(&st.gather, dst);
                            None
                        }
                        Ok(_) => Some((WcStatus::LocLenErr, WcStatus::RemInvReqErr)),
                        Err(e) => Some((e, WcStatus::RemOpErr)),
                    });
                }
                if matches!(
                    wr.opcode,
                    SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm
                ) {
                    wc.imm = wr.imm;
                    wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
                }
                if fail.is_none() && wr.opcode == SendOpcode::SendWithInv {
                    match self.devices[pdev]
                        .keys
                        .invalidate(ppd as u32, wr.invalidate_rkey)
                    {
                        Ok(()) => {
                            wc.invalidated_rkey = wr.invalidate_rkey;
                            wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
                        }
                        Err(_) => fail = Some((WcStatus::RemInvReqErr, WcStatus::RemInvReqErr)),
                    }
                }
                if let Some((resp, req)) = fail {
                    wc.status = resp;
                    self.complete(prcq, wc, true, out);
                    self.enter_error(pi, out);
                    return Exec::Done(Err(req));
                }
                self.complete(prcq, wc, wr.flags.contains(SendFlags::SOLICITED), out);
                Exec::Done(Ok(len as u32))
            }
            SendOpcode::LocalInv | SendOpcode::BindMw => unreachable!(),
        }
    }

    fn ud_send(
        &mut self,
        qi: usize,
        wr: &SendWr,
        len: u64,
        out: &mut Vec<Cb>,
    ) -> Result<u32, WcStatus> {
        let q = self.qpr(qi);
        let (dev, qpn, own_qkey, port) = (
            q.dev,
            q.qpn,
            q.attr.qkey.unwrap_or(Qkey(0)),
            self.qp_port(q),
        );
        let Some(ud) = wr.ud else {
            return Err(WcStatus::LocQpOpErr);
        };
        let av = match self.slot(ud.ah.0).map(|i| self.obj(i)) {
            Ok(Obj::Ah { attr, .. }) => *attr,
            _ => return Err(WcStatus::LocQpOpErr),
        };
        let mtu = self.devices[dev].ports[port.0 as usize - 1].active_mtu;
        if len as usize > mtu.bytes() {
            return Err(WcStatus::LocLenErr);
        }
        let sport = &self.devices[dev].ports[port.0 as usize - 1];
        let (sgid, slid) = (sport.gids[0], sport.lid);
        let Some((pdev, pport)) = self
            .device_of_port(&av)
            .filter(|(d, p)| self.port_active(*d, *p))
        else {
            return Ok(len as u32);
        };
        let key = if ud.remote_qpn.value() <= 1 {
            (pport.0 as u32) << 24 | ud.remote_qpn.value()
        } else {
            ud.remote_qpn.value()
        };
        let Some(&pi) = self.devices[pdev].qpns.get(&key) else {
            return Ok(len as u32);
        };
        let p = self.qpr(pi);
        let qkey = if ud.remote_qkey.0 & 0x8000_0000 != 0 {
            own_qkey
        } else {
            ud.remote_qkey
        };
        if !p.init.qp_type.is_datagram()
            || !matches!(
                p.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            || p.attr.qkey != Some(qkey)
        {
            return Ok(len as u32); // silently dropped (IBA 10.2.4: Q_Key violation)
        }
        let (ppd, pctx, prcq, ppkey) = (p.pd, p.ctx, p.recv_cq, p.attr.pkey_index.unwrap_or(0));
        let dgid = self.devices[pdev].ports[pport.0 as usize - 1].gids[0];
        let Some(rwr) = self.take_recv(pi, out) else {
            return Ok(len as u32);
        };
        let mut wc = WorkCompletion::new(rwr.wr_id, WcStatus::Success, WcOpcode::Recv, pctx);
        self.with_scatter(pdev, ppd, &rwr.sges, |st, dst| match dst {
            Ok((dst, room)) if room >= GRH_LEN as u64 + len => {
                let mut grh = [0u8; GRH_LEN];
                grh[0] = 0x60; // IP version 6 (IBA 8.3.1)
                grh[4..6].copy_from_slice(&(len as u16).to_be_bytes());
                grh[6] = 0x1b; // next header: IBA transport
                grh[7] = av.hop_limit;
                grh[8..24].copy_from_slice(&sgid.0);
                grh[24..40].copy_from_slice(&dgid.0);
                let g = MemBuf::new(GRH_LEN);
                g.write_at(0, &grh);
                let mut src = vec![(Target { buf: g, off: 0 }, GRH_LEN)];
                src.extend(st.gather.iter().cloned());
                copy_sg(&src, dst);
                wc.byte_len = (GRH_LEN as u64 + len) as u32;
                wc.src_qp = Qpn::from_bits(qpn);
                wc.slid = slid;
                wc.pkey_index = ppkey;
                wc.wc_flags = WcFlags::GRH;
                if wr.opcode == SendOpcode::SendWithImm {
                    wc.imm = wr.imm;
                    wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
                }
                st.complete(prcq, wc, wr.flags.contains(SendFlags::SOLICITED), out);
            }
            Ok(_) => {
                wc.status = WcStatus::LocLenErr;
                st.complete(prcq, wc, true, out);
            }
            Err(e) => {
                wc.status = e;
                st.complete(prcq, wc, true, out);
            }
        });
        Ok(len as u32)
    }

    /// Runs every RTS send queue that holds waiting WRs (see `backlog`).
    pub(super) fn progress_all(&mut self, out: &mut Vec<Cb>) {
        if !self.backlog {
            return;
        }
        let waiting: Vec<usize> = self
            .objs
            .iter()
            .filter(|(_, o)| matches!(o, Obj::Qp(q) if !q.pending.is_empty() && q.state == QpState::Rts))
            .map(|(i, _)| i)
            .collect();
        for i in waiting {
            self.progress(i, out);
        }
        self.backlog = self
            .objs
            .iter()
            .any(|(_, o)| matches!(o, Obj::Qp(q) if !q.pending.is_empty()));
    }
}

enum Exec {
    Done(Result<u32, WcStatus>),
    Rnr,
}

pub(super) fn wc_opcode(op: SendOpcode) -> WcOpcode {
    match op {
        SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv => WcOpcode::Send,
        SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        SendOpcode::RdmaRead => WcOpcode::RdmaRead,
        SendOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
        SendOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
        SendOpcode::LocalInv => WcOpcode::LocalInv,
        SendOpcode::BindMw => WcOpcode::BindMw,
    }
}

/// Copies the gather list into the scatter list (which is long enough).
fn copy_sg(src: &[(Target, usize)], dst: &[(Target, usize)]) {
    let (mut di, mut doff) = (0, 0);
    for (s, slen) in src {
        let mut soff = 0;
        while soff < *slen {
            let (d, dlen) = &dst[di];
            let n = (slen - soff).min(dlen - doff);
            d.buf.copy_from(d.off + doff, &s.buf, s.off + soff, n);
            soff += n;
            doff += n;
            if doff == *dlen {
                di += 1;
                doff = 0;
            }
        }
    }
}
