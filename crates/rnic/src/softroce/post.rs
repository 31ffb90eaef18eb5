//! Posting work: send WRs checked and turned into engine WQEs (inline data
//! gathered at post time), receives handed to the engine.

use super::*;

impl SoftRoce {
    pub(super) fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let (rt, qpn, sig_all, state, ud, max_sge, datagram, uc, mut local) = {
            let st = self.lock();
            let i = st.qp(qp)?;
            let Obj::Qp(q) = st.obj(i) else {
                unreachable!("checked QP")
            };
            // What needs the handle table: the window and region of a
            // bind, and inline data (copied now, so the buffer may be
            // reused as soon as the post returns).
            // Empty (no allocation) when no WR needs it, the usual case.
            let mut local = Vec::new();
            let needs_table = wrs.iter().any(|wr| {
                wr.opcode == SendOpcode::BindMw || wr.flags.contains(verbs::SendFlags::INLINE)
            });
            for wr in wrs.iter().filter(|_| needs_table) {
                let bind = wr
                    .bind_mw
                    .filter(|_| wr.opcode == SendOpcode::BindMw)
                    .map(|b| st.bind_indices(q.ca, &b));
                let inline = wr
                    .flags
                    .contains(verbs::SendFlags::INLINE)
                    .then(|| st.gather_inline(q.ca, q.pd, wr, q.init.caps.max_inline));
                local.push((bind, inline));
            }
            // A GSI WR may name the partition it sends in (IBA 11.4.1.1).
            let table = (q.init.qp_type == QpType::Gsi
                && wrs.iter().any(|w| w.pkey_index.is_some()))
            .then(|| st.rt(q.ca).pkey_table());
            let mut ud = Vec::new();
            for (index, wr) in wrs.iter().enumerate() {
                let pkey = match (&table, wr.pkey_index) {
                    (Some(t), Some(ix)) => match t.get(usize::from(ix)) {
                        Some(k) => Some(*k),
                        None => {
                            return Err(VerbsError::BadWr {
                                index,
                                cause: Box::new(bad(format!(
                                    "P_Key index {ix} outside the {}-entry table",
                                    t.len()
                                ))),
                            })
                        }
                    },
                    _ => None,
                };
                ud.push(match wr.ud {
                    Some(d) => match st.slot(d.ah.0).map(|a| st.obj(a)) {
                        Ok(Obj::Ah { id, .. }) => Some((
                            roce::UdDest {
                                qpn: d.remote_qpn,
                                qkey: d.remote_qkey,
                                ah: id.0,
                            },
                            pkey,
                        )),
                        _ => return Err(bad("invalid address handle")),
                    },
                    None => None,
                });
            }
            (
                st.rt(q.ca),
                q.qpn,
                q.init.sq_sig_all,
                q.state,
                ud,
                q.init.caps.max_send_sge,
                q.init.qp_type.is_datagram(),
                q.init.qp_type == QpType::Uc,
                local,
            )
        };
        // In ERR and SQE the engine flushes what is posted.
        if !matches!(state, QpState::Rts | QpState::Err | QpState::Sqe) {
            return Err(VerbsError::BadWr {
                index: 0,
                cause: Box::new(VerbsError::InvalidState(state)),
            });
        }
        let mut wqes = Vec::with_capacity(wrs.len());
        let mut refused = None;
        for (index, (wr, ud)) in wrs.iter().zip(ud).enumerate() {
            let (bind, inline) = local.get_mut(index).map(std::mem::take).unwrap_or_default();
            let checked = send_wqe(wr, sig_all).and_then(|mut w| {
                if let (roce::SendOp::BindMw(b), Some((mw, mr))) = (&mut w.op, bind) {
                    (b.mw, b.mr) = (mw, mr);
                }
                if let Some(data) = inline {
                    w.inline = Some(data?);
                }
                if wr.sges.len() > max_sge as usize {
                    Err(bad(format!("{} SGEs > max {max_sge}", wr.sges.len())))
                } else if datagram != ud.is_some() {
                    Err(bad("datagram QPs need a destination, connected ones none"))
                } else if datagram
                    && !matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm)
                {
                    Err(bad("only SEND on datagram QPs"))
                } else if uc
                    && matches!(
                        wr.opcode,
                        SendOpcode::RdmaRead
                            | SendOpcode::AtomicCmpSwp
                            | SendOpcode::AtomicFetchAdd
                    )
                {
                    Err(bad("UC has no RDMA READ or atomics (IBA 9.4)"))
                } else if uc && wr.opcode == SendOpcode::SendWithInv {
                    Err(bad("UC has no SEND with invalidate (IBA 9.2)"))
                } else {
                    Ok(w)
                }
            });
            let mut w = match checked {
                Ok(w) => w,
                Err(cause) => {
                    refused = Some(VerbsError::BadWr {
                        index,
                        cause: Box::new(cause),
                    });
                    break;
                }
            };
            let pkey = ud.and_then(|(_, k)| k);
            w.ud = ud.map(|(d, _)| d);
            wqes.push((w, pkey));
        }
        rt.node(|n| {
            for (w, pkey) in &mut wqes {
                if let (Some(d), Some(k)) = (w.ud.as_mut(), *pkey) {
                    if let Some(ah) = n.ah_in_partition(softroce::AhId(d.ah), k) {
                        d.ah = ah.0;
                    }
                }
            }
            if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                for (w, _) in wqes {
                    e.post_send(w);
                }
            }
        });
        refused.map_or(Ok(()), Err)
    }

    pub(super) fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let mut st = self.lock();
        let i = st.qp(qp)?;
        let q = st.qp_mut(i);
        if q.init.srq.is_some() {
            return Err(bad("QP uses an SRQ; post to the SRQ"));
        }
        if q.state == QpState::Reset {
            return Err(VerbsError::InvalidState(QpState::Reset));
        }
        if !q.engine {
            return q.early.post(wrs);
        }
        let ca = q.ca;
        let qpn = q.qpn;
        let rt = st.rt(ca);
        drop(st);
        rt.node(|n| {
            if let Some(e) = n.qp_mut(softroce::QpHandle(qpn)) {
                for wr in wrs {
                    e.post_recv(recv_wqe(wr));
                }
            }
        });
        Ok(())
    }
}

impl State {
    /// Copies the gather list of an inline WR (IBV_SEND_INLINE): at most
    /// `max` bytes, SEND or RDMA WRITE only. The L_Key is not needed: each
    /// piece is read from whichever region of the CA holds it (the SGE's
    /// own key first). Memory the provider does not know cannot be read
    /// safely, so a piece outside every registered region is refused.
    fn gather_inline(&self, ca: usize, pd: usize, wr: &SendWr, max: u32) -> Result<Vec<u8>> {
        let total = wr.total_len();
        if total > u64::from(max) {
            return Err(bad(format!(
                "{total} bytes of inline data > the QP's max_inline {max}"
            )));
        }
        if !matches!(
            wr.opcode,
            SendOpcode::Send
                | SendOpcode::SendWithImm
                | SendOpcode::SendWithInv
                | SendOpcode::RdmaWrite
                | SendOpcode::RdmaWriteWithImm
        ) {
            return Err(bad("inline data goes with SEND and RDMA WRITE only"));
        }
        let rt = self.rt(ca);
        let keys = rt.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![0u8; total as usize];
        let mut at = 0usize;
        for sge in &wr.sges {
            let len = sge.length as usize;
            let (addr, n) = (sge.addr, sge.length as u64);
            let found = keys
                .local(pd as u32, sge.lkey, addr, n, AccessFlags::NONE)
                .ok()
                .or_else(|| {
                    self.objs.iter().find_map(|(_, o)| match o {
                        Obj::Mr {
                            ca: c, pd, lkey, ..
                        } if self.same_device(*c, ca) => keys
                            .local(*pd as u32, Lkey(*lkey), addr, n, AccessFlags::NONE)
                            .ok(),
                        _ => None,
                    })
                });
            let Some(t) = found else {
                return Err(bad(format!(
                    "inline data at {addr:#x}+{n} is in no registered region"
                )));
            };
            t.buf.read_at(t.off, &mut out[at..at + len]);
            at += len;
        }
        Ok(out)
    }
}

fn send_wqe(wr: &SendWr, sig_all: bool) -> Result<roce::SendWqe> {
    use roce::SendOp;
    let r = wr.remote;
    let op = match wr.opcode {
        SendOpcode::Send => SendOp::Send,
        SendOpcode::SendWithImm => SendOp::SendImm(wr.imm),
        SendOpcode::SendWithInv => SendOp::SendInv(wr.invalidate_rkey),
        SendOpcode::RdmaWrite => SendOp::Write {
            raddr: r.addr,
            rkey: r.rkey,
        },
        SendOpcode::RdmaWriteWithImm => SendOp::WriteImm {
            raddr: r.addr,
            rkey: r.rkey,
            imm: wr.imm,
        },
        SendOpcode::RdmaRead => SendOp::Read {
            raddr: r.addr,
            rkey: r.rkey,
        },
        SendOpcode::AtomicCmpSwp => SendOp::CmpSwap {
            raddr: r.addr,
            rkey: r.rkey,
            compare: wr.compare_add,
            swap: wr.swap,
        },
        SendOpcode::AtomicFetchAdd => SendOp::FetchAdd {
            raddr: r.addr,
            rkey: r.rkey,
            add: wr.compare_add,
        },
        SendOpcode::LocalInv => SendOp::LocalInv(wr.invalidate_rkey),
        SendOpcode::BindMw => {
            let b = wr.bind_mw.ok_or_else(|| bad("BindMw WR without a bind"))?;
            SendOp::BindMw(roce::MwBindOp {
                mw: NO_INDEX,
                mr: NO_INDEX,
                rkey: b.rkey,
                addr: b.addr,
                len: b.len,
                access: b.access,
            })
        }
    };
    let mut w = roce::SendWqe::new(
        wr.wr_id,
        op,
        wr.sges
            .iter()
            .map(|s| roce::Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            })
            .collect(),
    );
    w.signaled = sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED);
    w.solicited = wr.flags.contains(verbs::SendFlags::SOLICITED);
    w.fence = wr.flags.contains(verbs::SendFlags::FENCE);
    Ok(w)
}

pub(super) fn recv_wqe(wr: &RecvWr) -> roce::RecvWqe {
    roce::RecvWqe {
        wr_id: wr.wr_id,
        sges: wr
            .sges
            .iter()
            .map(|s| roce::Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            })
            .collect(),
    }
}
