//! Posting: a verbs work request checked (state, SGE count, queue depth,
//! its buffers against the key table) and handed to the QP's engine as a
//! work request under a local STag of its own; and an engine completion
//! turned back into the consumer's.

use super::*;

fn send_opcode(op: SendOpcode) -> Option<WcOpcode> {
    match op {
        SendOpcode::Send | SendOpcode::SendWithInv => Some(WcOpcode::Send),
        SendOpcode::RdmaWrite => Some(WcOpcode::RdmaWrite),
        SendOpcode::RdmaRead => Some(WcOpcode::RdmaRead),
        _ => None,
    }
}

pub(crate) fn post_one_send(st: &mut Inner, i: usize, wr: &SendWr) -> Result<()> {
    let Some(opcode) = send_opcode(wr.opcode) else {
        return Err(VerbsError::NotSupported(match wr.opcode {
            SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm => {
                "immediate data on iWARP (RFC 7306 not implemented)"
            }
            SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => "atomics on iWARP",
            _ => "memory windows and local invalidate on this iWARP NIC",
        }));
    };
    let guid = st.qp_mut(i).guid;
    let q = st.qp_mut(i);
    match q.state {
        QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe => {}
        s => return Err(VerbsError::InvalidState(s)),
    }
    if wr.sges.len() > q.init.caps.max_send_sge as usize {
        return Err(bad(format!(
            "{} SGEs, the QP takes {}",
            wr.sges.len(),
            q.init.caps.max_send_sge
        )));
    }
    if q.sq_out >= q.init.caps.max_send_wr {
        return Err(VerbsError::QueueFull);
    }
    let len = u32::try_from(wr.total_len()).map_err(|_| bad("message longer than 4 GiB"))?;
    let pd = q.pd as u32;
    let writable = opcode == WcOpcode::RdmaRead;
    let inline = wr.flags.contains(verbs::SendFlags::INLINE) && !writable;
    let sgl = st
        .devs
        .get(&guid)
        .and_then(|d| Sgl::check(&d.keys, pd, &wr.sges, writable))
        .map(|l| if inline { l.snapshot() } else { l });
    let q = st.qp_mut(i);
    let id = q.next_id();
    if let Some(s) = sgl {
        q.sgls.insert(id as u32, s);
    }
    q.wrs.insert(
        id,
        WrInfo {
            wr_id: wr.wr_id,
            opcode,
            signaled: q.init.sq_sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED),
            srq: false,
        },
    );
    q.sq_out += 1;
    let local = iwarp::Sge {
        stag: STag(id as u32),
        to: 0,
        len,
    };
    let op = match wr.opcode {
        SendOpcode::RdmaWrite => SendOp::Write {
            local,
            remote_stag: STag(wr.remote.rkey.0),
            remote_to: wr.remote.addr,
        },
        SendOpcode::RdmaRead => SendOp::Read {
            local,
            remote_stag: STag(wr.remote.rkey.0),
            remote_to: wr.remote.addr,
        },
        _ => SendOp::Send {
            local,
            solicited: wr.flags.contains(verbs::SendFlags::SOLICITED),
            invalidate: (wr.opcode == SendOpcode::SendWithInv)
                .then_some(STag(wr.invalidate_rkey.0)),
        },
    };
    dev::qp_post_send(st, i, SendWqe { wr_id: id, op });
    Ok(())
}

pub(crate) fn post_one_recv(st: &mut Inner, i: usize, wr: &RecvWr) -> Result<()> {
    let guid = st.qp_mut(i).guid;
    let q = st.qp_mut(i);
    if q.srq.is_some() {
        return Err(bad("the QP takes its receives from its SRQ"));
    }
    if q.state == QpState::Reset {
        return Err(VerbsError::InvalidState(QpState::Reset));
    }
    if wr.sges.len() > q.init.caps.max_recv_sge as usize {
        return Err(bad(format!(
            "{} SGEs, the QP takes {}",
            wr.sges.len(),
            q.init.caps.max_recv_sge
        )));
    }
    if q.rq_out >= q.init.caps.max_recv_wr {
        return Err(VerbsError::QueueFull);
    }
    let len: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
    let len = u32::try_from(len).map_err(|_| bad("receive longer than 4 GiB"))?;
    let pd = q.pd as u32;
    let sgl = st
        .devs
        .get(&guid)
        .and_then(|d| Sgl::check(&d.keys, pd, &wr.sges, true));
    let q = st.qp_mut(i);
    let id = q.next_id();
    if let Some(s) = sgl {
        q.sgls.insert(id as u32, s);
    }
    q.wrs.insert(
        id,
        WrInfo {
            wr_id: wr.wr_id,
            opcode: WcOpcode::Recv,
            signaled: true,
            srq: false,
        },
    );
    q.rq_out += 1;
    let wqe = RecvWqe {
        wr_id: id,
        buf: iwarp::Sge {
            stag: STag(id as u32),
            to: 0,
            len,
        },
    };
    dev::qp_post_recv(st, i, wqe);
    Ok(())
}

/// Builds the verbs completion of an engine completion for QP `q`; `None`
/// for an unsignaled success.
pub(crate) fn to_wc(q: &mut Qp, c: &iwarp::Completion) -> Option<(WorkCompletion, bool, bool)> {
    let info = q.wrs.remove(&c.wr_id)?;
    q.sgls.remove(&(c.wr_id as u32));
    let recv = c.kind == iwarp::WcKind::Recv;
    if recv && !info.srq {
        q.rq_out = q.rq_out.saturating_sub(1);
    } else if !recv {
        q.sq_out = q.sq_out.saturating_sub(1);
    }
    let status = match c.status {
        iwarp::WcStatus::Success => WcStatus::Success,
        iwarp::WcStatus::LocalProtection => WcStatus::LocProtErr,
        iwarp::WcStatus::Flushed => WcStatus::WrFlushErr,
        iwarp::WcStatus::InvalidateRefused => WcStatus::RemInvReqErr,
        iwarp::WcStatus::LocalLength => WcStatus::LocLenErr,
        iwarp::WcStatus::RemoteAccess => WcStatus::RemAccessErr,
    };
    if status == WcStatus::Success && !info.signaled {
        return None;
    }
    let mut wc = WorkCompletion::new(info.wr_id, status, info.opcode, q.ctx);
    wc.byte_len = c.byte_len;
    wc.src_qp = Qpn::from_bits(q.attr.dest_qpn.map_or(0, |n| n.value()));
    if let Some(s) = c.invalidated {
        wc.invalidated_rkey = Rkey(s.0);
        wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
    }
    Some((wc, recv, c.solicited))
}
