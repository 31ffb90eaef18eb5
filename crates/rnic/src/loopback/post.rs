//! Posting work requests: checked, queued, and run at once (see `exec`).

use super::*;

impl Fabric {
    pub(super) fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            for (index, wr) in wrs.iter().enumerate() {
                let q = st.qp(i);
                let qt = q.init.qp_type;
                let cause = if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                    Some(VerbsError::InvalidState(q.state))
                } else if wr.sges.len() > q.init.caps.max_send_sge as usize {
                    Some(VerbsError::InvalidArgument(format!(
                        "{} SGEs > max_send_sge",
                        wr.sges.len()
                    )))
                } else if q.pending.len() >= q.init.caps.max_send_wr as usize {
                    Some(VerbsError::QueueFull)
                } else if qt.is_datagram()
                    && !matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm)
                {
                    Some(VerbsError::InvalidArgument(format!(
                        "{:?} on a datagram QP",
                        wr.opcode
                    )))
                } else if qt == QpType::Uc
                    && matches!(
                        wr.opcode,
                        SendOpcode::RdmaRead
                            | SendOpcode::AtomicCmpSwp
                            | SendOpcode::AtomicFetchAdd
                    )
                {
                    Some(VerbsError::InvalidArgument(format!(
                        "{:?} on a UC QP",
                        wr.opcode
                    )))
                } else if matches!(
                    wr.opcode,
                    SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd
                ) && self.lacks(verbs::Feature::Atomics)
                {
                    Some(VerbsError::NotSupported("atomics"))
                } else if qt.is_datagram() && wr.ud.is_none() {
                    Some(VerbsError::InvalidArgument(
                        "datagram WR without destination".into(),
                    ))
                } else {
                    None
                };
                if let Some(c) = cause {
                    return Err(VerbsError::BadWr {
                        index,
                        cause: Box::new(c),
                    });
                }
                if matches!(q.state, QpState::Err | QpState::Sqe) {
                    let (scq, ctx) = (q.send_cq, q.ctx);
                    st.complete(
                        scq,
                        WorkCompletion::new(
                            wr.wr_id,
                            WcStatus::WrFlushErr,
                            wc_opcode(wr.opcode),
                            ctx,
                        ),
                        false,
                        out,
                    );
                    continue;
                }
                if q.pending.is_empty() && q.state == QpState::Rts {
                    // Fast path: nothing queued ahead, run without copying the WR.
                    if !st.run_one(i, wr, out) {
                        st.qp(i).pending.push_back(wr.clone());
                        st.backlog = true;
                    }
                } else {
                    q.pending.push_back(wr.clone());
                    st.backlog = true;
                    st.progress(i, out);
                }
            }
            Ok(())
        })
    }

    pub(super) fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            let q = st.qp(i);
            if q.srq.is_some() {
                return Err(bad("QP uses an SRQ"));
            }
            if q.state == QpState::Reset {
                return Err(VerbsError::BadWr {
                    index: 0,
                    cause: Box::new(VerbsError::InvalidState(q.state)),
                });
            }
            q.rq.post(wrs)?;
            if q.state == QpState::Err {
                st.flush_rq(i, out);
            }
            st.progress_all(out);
            Ok(())
        })
    }
}
