//! SRP_CMD and SRP_TSK_MGMT in: a command checked, its data planned and
//! fetched, handed to SCSI or refused; a task management function
//! received.

use super::*;

impl Channel {
    pub(super) fn recv_cmd(&mut self, iu: &[u8]) {
        let Ok(p) = CmdPacket::new_checked(iu) else {
            return self.fail(Some(TLogoutReason::InvalidIuLength));
        };
        let (tag, sol) = (p.tag(), p.sol_not());
        if !self.take_credit() {
            return self.over_limit(tag, sol, false);
        }
        self.stats.cmds += 1;
        // Formats first: a format the channel cannot take closes it even when
        // the IU is also too short for the descriptor (SRP r16a 6.6 reasons 5, 6).
        let out_ok = match p.data_out_format() {
            DescFormat::Unknown(_) => false,
            DescFormat::Immediate => self.p.imm_data_offset.is_some(),
            _ => true,
        };
        if !out_ok {
            return self.fail(Some(TLogoutReason::UnsupportedDataOutFormat));
        }
        if matches!(
            p.data_in_format(),
            DescFormat::Unknown(_) | DescFormat::Immediate
        ) {
            return self.fail(Some(TLogoutReason::UnsupportedDataInFormat));
        }
        let cmd = match Cmd::parse(iu, self.p.imm_data_offset) {
            Ok(c) => c,
            Err(WireError::DescFormat { dir, .. }) => {
                return self.fail(Some(if dir == "data-in" {
                    TLogoutReason::UnsupportedDataInFormat
                } else {
                    TLogoutReason::UnsupportedDataOutFormat
                }))
            }
            Err(WireError::ImmediateNotNegotiated) => {
                return self.fail(Some(TLogoutReason::UnsupportedDataOutFormat))
            }
            Err(_) => return self.refuse(tag, sol, sense::invalid_cmd_iu()),
        };
        for (d, reason) in [
            (&cmd.data_out, TLogoutReason::UnsupportedDataOutFormat),
            (&cmd.data_in, TLogoutReason::UnsupportedDataInFormat),
        ] {
            let ok = match d {
                DataDesc::Direct(_) => self.p.buf_formats.contains(BufFormats::DIRECT),
                DataDesc::Indirect(_) => self.p.buf_formats.contains(BufFormats::INDIRECT),
                _ => true,
            };
            if !ok {
                return self.fail(Some(reason));
            }
        }
        let xfers = (self.xfer(&cmd.data_out), self.xfer(&cmd.data_in));
        // A tag in use is refused.
        if self.tags.contains(tag) {
            return self.refuse(tag, sol, sense::overlapped());
        }
        let (Some((out, out_total)), Some((inn, in_total))) = xfers else {
            return self.refuse(tag, sol, sense::invalid_cmd_iu());
        };
        let immediate = match cmd.data_out {
            DataDesc::Immediate { data, .. } => {
                let mut v = self.spare_data_out.take();
                v.extend_from_slice(data);
                Some(v)
            }
            _ => None,
        };
        let id = CmdId(self.next_cmd);
        self.next_cmd += 1;
        let tables = [&out, &inn]
            .iter()
            .filter(|x| matches!(x, Xfer::External(_)))
            .count() as u8;
        let mut t = Task {
            tag,
            lun: cmd.lun,
            sol,
            cdb: Cdb::from_slice(cmd.cdb),
            attr: cmd.task_attr,
            out,
            out_total,
            inn,
            in_total,
            immediate,
            phase: Phase::Table { left: tables },
            ops: 0,
            aborted: false,
        };
        let mut table_ops = Vec::new();
        for (x, data_in) in [(&t.out, false), (&t.inn, true)] {
            if let Xfer::External(d) = x {
                table_ops.push((*d, data_in));
            }
        }
        if tables == 0 {
            t.phase = Phase::Core;
        }
        self.tasks.insert(id, t);
        self.tags.insert(tag, id);
        if tables == 0 {
            self.start_data_out(id);
            return;
        }
        for (d, data_in) in table_ops {
            let seg = [Segment {
                remote_va: d.va,
                rkey: d.key,
                len: d.len,
                local_offset: 0,
            }];
            self.post_segments(id, &seg, true, |_| Local::Table { data_in });
        }
    }

    /// Descriptors and total length of one direction; `None` for lengths
    /// past the limits or descriptors that do not add up to TOTAL LENGTH.
    pub(super) fn xfer(&self, d: &DataDesc<'_>) -> Option<(Xfer, u32)> {
        let max = self.p.max_data_len;
        match d {
            DataDesc::None => Some((Xfer::None, 0)),
            DataDesc::Immediate { data, .. } => Some((Xfer::None, u32::try_from(data.len()).ok()?)),
            DataDesc::Direct(b) => {
                (b.len <= max).then(|| (Xfer::Descs(smallvec::smallvec![*b]), b.len))
            }
            DataDesc::Indirect(i) => {
                if i.total_len > max {
                    return None;
                }
                if i.is_external() {
                    let lim = self.p.max_table_len.min(self.p.max_rdma_size);
                    return (i.table.len <= lim).then_some((Xfer::External(i.table), i.total_len));
                }
                let v: smallvec::SmallVec<[DirectBuf; 2]> = i.descs.iter().collect();
                (sum_len(&v) == u64::from(i.total_len)).then_some((Xfer::Descs(v), i.total_len))
            }
        }
    }

    /// Post the data-out READs, or go straight to the core.
    pub(super) fn start_data_out(&mut self, id: CmdId) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        let segs = match &t.out {
            Xfer::Descs(d) if t.immediate.is_none() => {
                plan_rdma(d, u64::from(t.out_total), self.p.max_rdma_size)
            }
            _ => Default::default(),
        };
        if segs.is_empty() {
            self.submit(id);
        } else {
            t.phase = Phase::Fetch {
                left: segs.len() as u32,
            };
            self.post_segments(id, &segs, true, |o| Local::DataOut { offset: o });
        }
    }

    pub(super) fn submit(&mut self, id: CmdId) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        t.phase = Phase::Core;
        // The immediate data moves on with the request (nothing reads it
        // here again): copied once, out of the receive buffer.
        let data_out = match (t.immediate.take(), t.out_total) {
            (Some(d), _) => DataOut::Immediate(d),
            (None, 0) => DataOut::None,
            (None, len) => DataOut::InBuffer { len },
        };
        self.events.push_back(Output::Scsi(ScsiRequest {
            cmd: id,
            tag: t.tag,
            lun: t.lun,
            cdb: std::mem::take(&mut t.cdb),
            attr: t.attr,
            data_out,
            data_in_len: t.in_total,
        }));
    }

    /// Answer a malformed command (its credit taken) with CHECK CONDITION.
    pub(super) fn refuse(&mut self, tag: Tag, sol: u8, sense: [u8; 18]) {
        self.stats.bad_cmds += 1;
        self.free_credit();
        self.wrs
            .push_back(Wr::Rsp(check_condition(tag, sol, &sense)));
    }

    /// An IU beyond the credit window.
    pub(super) fn over_limit(&mut self, tag: Tag, sol: u8, tmf: bool) {
        self.stats.over_limit += 1;
        self.over_streak += 1;
        if self.over_streak > RESERVED_RECV {
            return self.fail(Some(TLogoutReason::NoReason));
        }
        let rsp = RspPlan {
            tag,
            solicited: sol & sol_not::UCSOLNT != 0,
            status: if tmf {
                sense::GOOD
            } else {
                sense::TASK_SET_FULL
            },
            flags: 0,
            do_res: 0,
            di_res: 0,
            resp: tmf.then_some(RspCode::Failed),
            sense: Vec::new(),
        };
        self.wrs.push_back(Wr::Rsp(rsp));
    }

    pub(super) fn recv_tmf(&mut self, iu: &[u8]) {
        let Ok(tm) = TskMgmt::parse(iu) else {
            return self.fail(Some(TLogoutReason::InvalidIuLength));
        };
        if !self.take_credit() {
            return self.over_limit(tm.tag, tm.sol_not, true);
        }
        self.stats.tmfs += 1;
        let id = CmdId(self.next_cmd);
        self.next_cmd += 1;
        let task = self.tags.get(tm.task_tag);
        let mut t = Task {
            tag: tm.tag,
            lun: tm.lun,
            sol: tm.sol_not,
            cdb: Cdb::new(),
            attr: TaskAttr::Simple,
            out: Xfer::None,
            out_total: 0,
            inn: Xfer::None,
            in_total: 0,
            immediate: None,
            phase: Phase::Tmf {
                awaiting: Vec::new(),
                rsp: None,
            },
            ops: 0,
            aborted: false,
        };
        let code = if self.tags.contains(tm.tag) {
            Some(RspCode::RequestFieldsInvalid)
        } else if matches!(tm.func, TmFunc::Unknown(_)) {
            Some(RspCode::NotSupported)
        } else {
            None
        };
        if let Some(code) = code {
            t.phase = Phase::Core;
            self.tasks.insert(id, t);
            let rsp = RspPlan {
                tag: tm.tag,
                solicited: tm.sol_not & sol_not::UCSOLNT != 0,
                status: sense::GOOD,
                flags: 0,
                do_res: 0,
                di_res: 0,
                resp: Some(code),
                sense: Vec::new(),
            };
            return self.respond(id, rsp);
        }
        // The tasks the function reaches, as the core picks them (an ACA
        // task for CLEAR ACA).
        let hits = |x: &Task| match tm.func {
            TmFunc::AbortTask => x.tag == tm.task_tag,
            TmFunc::AbortTaskSet | TmFunc::ClearTaskSet | TmFunc::LogicalUnitReset => {
                x.lun == tm.lun
            }
            TmFunc::ClearAca => x.lun == tm.lun && x.attr == TaskAttr::Aca,
            _ => false,
        };
        // Tasks the core has not seen yet (fetching tables or data-out)
        // are aborted here; the core aborts the ones it holds.
        let local: Vec<CmdId> = self
            .tasks
            .iter()
            .filter(|(_, x)| {
                !x.aborted
                    && matches!(x.phase, Phase::Table { .. } | Phase::Fetch { .. })
                    && tm.func != TmFunc::ClearAca
                    && hits(x)
            })
            .map(|(id, _)| *id)
            .collect();
        for &v in &local {
            self.drop_task(v);
        }
        // What the response waits for: the tasks dropped here whose posted
        // READs have not completed, and the tasks with the core.
        let awaiting: Vec<CmdId> = self
            .tasks
            .iter()
            .filter(|(id, x)| {
                (local.contains(id) && x.ops > 0)
                    || (!x.aborted && matches!(x.phase, Phase::Core) && hits(x))
            })
            .map(|(id, _)| *id)
            .collect();
        let task = task.filter(|c| {
            self.tasks
                .get(c)
                .is_some_and(|x| !x.aborted && matches!(x.phase, Phase::Core))
        });
        if !awaiting.is_empty() {
            self.tmfs_waiting.push(id);
        }
        t.phase = Phase::Tmf {
            awaiting,
            rsp: None,
        };
        self.tasks.insert(id, t);
        self.tags.insert(tm.tag, id);
        self.events.push_back(Output::Tmf(TmfRequest {
            cmd: id,
            tag: tm.tag,
            lun: tm.lun,
            func: tm.func,
            task_tag: tm.task_tag,
            task,
        }));
    }
}

pub(super) fn send(iu: Iu<'_>, solicited: bool) -> Output {
    // Emitting into a vector of buffer_len() bytes cannot fail.
    Output::Send {
        bytes: iu.to_bytes().unwrap_or_default(),
        solicited,
    }
}

pub(super) fn sum_len(d: &[DirectBuf]) -> u64 {
    d.iter().map(|b| u64::from(b.len)).sum()
}

/// Residual flag and count: over when more was wanted than described.
pub(super) fn residual(described: u32, wanted: u32, over: u8, under: u8) -> (u8, u32) {
    match wanted.cmp(&described) {
        core::cmp::Ordering::Greater => (over, wanted - described),
        core::cmp::Ordering::Less => (under, described - wanted),
        core::cmp::Ordering::Equal => (0, 0),
    }
}

pub(super) fn check_condition(tag: Tag, sol: u8, sense: &[u8]) -> RspPlan {
    RspPlan {
        tag,
        solicited: sol & sol_not::UCSOLNT != 0,
        status: sense::CHECK_CONDITION,
        flags: 0,
        do_res: 0,
        di_res: 0,
        resp: None,
        sense: sense.to_vec(),
    }
}
