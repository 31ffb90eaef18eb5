//! One SRP target RDMA channel: credits, command flow, task management,
//! asynchronous events and logout. See the module documentation of
//! [`crate::target`] for the call order.

use super::plan::{plan_rdma, Segment};
use super::{sense, RESERVED_RECV};
use crate::wire::AerRsp;
use crate::wire::{
    sol_not, AerReq, BufFormats, Cmd, CmdPacket, CredReq, CredRsp, DataDesc, DescFormat, DescList,
    DirectBuf, Error as WireError, ILogout, Iu, IuType, Lun, PortId, Rsp, RspCode, RspFlags,
    TLogout, TLogoutReason, Tag, TaskAttr, TmFunc, TskMgmt, AER_REQ_FIXED_LEN, RSP_FIXED_LEN,
};
use rdma_types::{IdRing, Rkey};
use std::collections::VecDeque;

mod commands;
mod interface;
mod tags;

use commands::*;
pub use interface::*;

/// AERs waiting while one is unanswered.
const AER_BACKLOG: usize = 8;

/// Immediate-data buffers a channel keeps for reuse (a batch of commands
/// received in one poll takes them; each at most an IU long). No more are
/// ever kept than were live at once, which the credit window bounds.
const SPARE_DATA_OUT: usize = 64;

/// What a login fixed for the channel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub max_it_iu_len: u32,
    pub max_ti_iu_len: u32,
    pub max_rdma_size: u32,
    pub sq_size: u32,
    pub imm_data_offset: Option<u16>,
    pub buf_formats: BufFormats,
    pub max_data_len: u32,
    pub max_table_len: u32,
    pub window: u32,
    pub nexus: (PortId, PortId),
}

/// One direction's descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Xfer {
    None,
    Descs(smallvec::SmallVec<[DirectBuf; 2]>),
    /// Table still to fetch.
    External(DirectBuf),
}

#[derive(Debug, Clone)]
struct RspPlan {
    tag: Tag,
    solicited: bool,
    status: u8,
    flags: u8,
    do_res: u32,
    di_res: u32,
    resp: Option<RspCode>,
    sense: Vec<u8>,
}

#[derive(Debug, Clone)]
enum Phase {
    /// Fetching external descriptor tables.
    Table { left: u8 },
    /// Fetching data-out.
    Fetch { left: u32 },
    /// With the SCSI core.
    Core,
    /// Waiting for posted ops (the other table READ of a refused command);
    /// then the response.
    Write { left: u32, rsp: RspPlan },
    /// Response posted behind its data-in WRITEs (RC executes them in
    /// order, so the initiator sees the data before the response); the
    /// buffer is released when the WRITEs complete, since a retransmitted
    /// WRITE still reads it.
    Drain,
    /// A TMF with the SCSI core (`rsp` empty) or answered by it and
    /// waiting for the tasks it aborts to end (`rsp` set).
    Tmf {
        /// Tasks the function aborts that may still touch initiator
        /// memory or the medium: ones with the SCSI core (until their
        /// [`ScsiDone`] arrives; the core's abort only marks a running
        /// command, which still completes) and ones dropped here with
        /// RDMA ops posted (until those complete). The response waits for
        /// them: once an initiator has FUNCTION COMPLETE it reuses the
        /// aborted command's buffers and may send its tag again.
        awaiting: Vec<CmdId>,
        /// The core's answer, held until `awaiting` is empty.
        rsp: Option<Box<RspPlan>>,
    },
}

#[derive(Debug, Clone)]
struct Task {
    tag: Tag,
    lun: Lun,
    sol: u8,
    cdb: Cdb,
    attr: TaskAttr,
    out: Xfer,
    out_total: u32,
    inn: Xfer,
    in_total: u32,
    immediate: Option<Vec<u8>>,
    phase: Phase,
    /// RDMA ops posted and not completed.
    ops: u32,
    /// Dropped: no response; released once `ops` is zero.
    aborted: bool,
}

/// A work request waiting for a send queue slot.
#[derive(Debug, Clone)]
enum Wr {
    Rsp(RspPlan),
    CredReq,
    Aer { lun: Lun, sense: Vec<u8> },
    TLogout(TLogoutReason),
    Rdma { op: OpId, read: bool },
}

/// One RDMA channel of an I_T nexus (one accepted login).
#[derive(Debug)]
pub struct Channel {
    p: Params,
    state: ChannelState,
    /// Our own ids, issued in sequence: found by their low bits
    /// ([`IdRing`]); where the order of commands shows (aborts,
    /// releases), their ids are sorted (arrival).
    tasks: IdRing<CmdId, Task>,
    /// The initiator's tags, which it chooses.
    tags: tags::Tags,
    ops: IdRing<OpId, RdmaOp>,
    next_cmd: u64,
    next_op: u64,
    next_tag: u64,
    events: VecDeque<Output>,
    wrs: VecDeque<Wr>,
    /// Work requests handed out and not completed.
    wr_out: u32,
    /// Of which SENDs.
    sends_out: u32,
    window: u32,
    /// Requests holding a credit.
    in_flight: u32,
    /// Credits freed and not yet returned in a REQUEST LIMIT DELTA.
    owed: u32,
    /// Over-limit IUs since credits were last returned.
    over_streak: u32,
    cred_req_queued: bool,
    cred_req_out: Option<Tag>,
    aer_queued: bool,
    aer_out: Option<Tag>,
    aer_backlog: VecDeque<(Lun, Vec<u8>)>,
    /// Buffers of finished commands' immediate data, handed back
    /// ([`Channel::reuse_data_out`]) for the next ones: at most
    /// `SPARE_DATA_OUT`, none larger than an IU.
    spare_data_out: crate::spare::SpareBufs<SPARE_DATA_OUT>,
    /// TMFs whose response waits for tasks (`Phase::Tmf::awaiting`), so
    /// a completion looks only at them.
    tmfs_waiting: Vec<CmdId>,
    stats: ChannelStats,
}

impl Channel {
    pub(crate) fn new(p: Params) -> Channel {
        Channel {
            window: p.window,
            p,
            state: ChannelState::Live,
            tasks: IdRing::default(),
            tags: tags::Tags::new(p.window),
            ops: IdRing::default(),
            next_cmd: 1,
            next_op: 1,
            next_tag: 1,
            events: VecDeque::new(),
            wrs: VecDeque::new(),
            wr_out: 0,
            sends_out: 0,
            in_flight: 0,
            owed: 0,
            over_streak: 0,
            cred_req_queued: false,
            cred_req_out: None,
            aer_queued: false,
            aer_out: None,
            aer_backlog: VecDeque::new(),
            spare_data_out: Default::default(),
            tmfs_waiting: Vec::new(),
            stats: ChannelStats::default(),
        }
    }

    /// (initiator port, target port).
    pub fn nexus(&self) -> (PortId, PortId) {
        self.p.nexus
    }

    /// Life cycle state.
    pub fn state(&self) -> ChannelState {
        self.state
    }

    /// Counters.
    pub fn stats(&self) -> ChannelStats {
        self.stats
    }

    /// Credits granted so far (login plus growth).
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Credits the initiator holds, as it should count them: the window
    /// minus requests in flight minus credits not yet returned.
    pub fn initiator_credits(&self) -> u32 {
        self.window - self.in_flight - self.owed
    }

    /// Credits freed and not yet returned.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Requests (commands and TMFs) holding a credit.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Immediate data offset agreed at login.
    pub fn imm_data_offset(&self) -> Option<u16> {
        self.p.imm_data_offset
    }

    /// Work requests handed out and not yet completed.
    pub fn outstanding_wrs(&self) -> u32 {
        self.wr_out
    }

    // ---- inputs ---------------------------------------------------------

    /// Bytes of one received SEND.
    pub fn handle_recv(&mut self, iu: &[u8]) {
        if self.state != ChannelState::Live {
            return;
        }
        if iu.is_empty() || iu.len() as u64 > u64::from(self.p.max_it_iu_len) {
            return self.fail(Some(TLogoutReason::InvalidIuLength));
        }
        match IuType::from(iu[0]) {
            IuType::Cmd => self.recv_cmd(iu),
            IuType::TskMgmt => self.recv_tmf(iu),
            IuType::ILogout => match ILogout::parse(iu) {
                Ok(_) => {
                    self.stats.initiator_logout = true;
                    self.fail(None)
                }
                Err(_) => self.fail(Some(TLogoutReason::InvalidIuLength)),
            },
            IuType::CredRsp => match CredRsp::parse(iu) {
                Ok(r) if self.cred_req_out == Some(r.tag) => self.cred_req_out = None,
                Ok(_) => self.fail(Some(TLogoutReason::SpuriousResponse)),
                Err(_) => self.fail(Some(TLogoutReason::InvalidIuLength)),
            },
            IuType::AerRsp => match AerRsp::parse(iu) {
                Ok(r) if self.aer_out == Some(r.tag) => {
                    self.aer_out = None;
                    if let Some((lun, sense)) = self.aer_backlog.pop_front() {
                        self.aer_queued = true;
                        self.wrs.push_back(Wr::Aer { lun, sense });
                    }
                }
                Ok(_) => self.fail(Some(TLogoutReason::SpuriousResponse)),
                Err(_) => self.fail(Some(TLogoutReason::InvalidIuLength)),
            },
            // Unknown codes and IUs only a target (or the CM) sends.
            _ => self.fail(Some(TLogoutReason::InvalidIuType)),
        }
        self.maybe_cred_req();
    }

    /// A SEND completed (in order; `ok` false if it failed or was flushed).
    pub fn handle_send_done(&mut self, ok: bool) {
        if self.sends_out == 0 {
            return;
        }
        self.sends_out -= 1;
        self.wr_out = self.wr_out.saturating_sub(1);
        if !ok {
            // A failed work request leaves an RC QP in error.
            self.fail(None);
        }
        self.maybe_cred_req();
    }

    /// An RDMA READ or WRITE completed. For a `Local::Table` READ use
    /// [`Channel::handle_table_read`]; a table op reported here counts as a
    /// table of zero bytes (the command is refused).
    pub fn handle_rdma_done(&mut self, op: OpId, ok: bool) {
        self.op_done(op, ok, Some(&[]));
    }

    /// An RDMA READ of an external descriptor table completed with `bytes`
    /// (`None`: the READ failed).
    pub fn handle_table_read(&mut self, op: OpId, bytes: Option<&[u8]>) {
        self.op_done(op, bytes.is_some(), bytes);
    }

    /// A [`DataOut::Immediate`] buffer the driver is done with: kept (up
    /// to a few, none larger than an IU) to hold the next command's
    /// immediate data, which then costs a copy and no allocation.
    pub fn reuse_data_out(&mut self, buf: Vec<u8>) {
        self.spare_data_out.give(buf, self.p.max_it_iu_len as usize);
    }

    /// The SCSI core finished a command. Returns false if the channel does
    /// not (or no longer) know it.
    pub fn handle_scsi_done(&mut self, done: ScsiDone) -> bool {
        let id = done.cmd;
        match self.tasks.get(&id) {
            Some(t) if matches!(t.phase, Phase::Core) && !t.aborted => {}
            _ => return false,
        }
        if done.aborted {
            // Reaped at once (a task with the core has no op posted),
            // which lets a TMF waiting for it answer.
            self.drop_task(id);
            self.maybe_cred_req();
            return true;
        }
        let Some(t) = self.tasks.get_mut(&id) else {
            return false;
        };
        let n = done.data_in_len.min(t.in_total);
        let (fi, di_res) = residual(
            t.in_total,
            done.wanted_in.unwrap_or(done.data_in_len),
            RspFlags::DIOVER,
            RspFlags::DIUNDER,
        );
        let (fo, do_res) = residual(
            t.out_total,
            done.wanted_out.unwrap_or(t.out_total),
            RspFlags::DOOVER,
            RspFlags::DOUNDER,
        );
        let good = done.status == sense::GOOD;
        let rsp = RspPlan {
            tag: t.tag,
            solicited: t.sol
                & if good {
                    sol_not::SCSOLNT
                } else {
                    sol_not::UCSOLNT
                }
                != 0,
            status: done.status,
            flags: fi | fo,
            do_res,
            di_res,
            resp: None,
            sense: done.sense,
        };
        let segs = match &t.inn {
            Xfer::Descs(d) => plan_rdma(d, u64::from(n), self.p.max_rdma_size),
            _ => Default::default(),
        };
        if segs.is_empty() {
            self.respond(id, rsp);
        } else {
            t.phase = Phase::Drain;
            self.post_segments(id, &segs, false, |o| Local::DataIn { offset: o });
            self.respond_draining(id, rsp);
        }
        // It completed before the abort took it: its data-in and response
        // are queued now, so a TMF response waiting for it goes behind
        // them and the initiator sees the command end first.
        self.settled(id);
        self.maybe_cred_req();
        true
    }

    /// The SCSI core finished a task management function. Returns false if
    /// the channel does not know it.
    pub fn handle_tmf_done(&mut self, cmd: CmdId, code: RspCode) -> bool {
        let Some(t) = self.tasks.get_mut(&cmd) else {
            return false;
        };
        if !matches!(t.phase, Phase::Tmf { rsp: None, .. }) || t.aborted {
            return false;
        }
        let ok = code == RspCode::Complete;
        let rsp = RspPlan {
            tag: t.tag,
            solicited: t.sol
                & if ok {
                    sol_not::SCSOLNT
                } else {
                    sol_not::UCSOLNT
                }
                != 0,
            status: sense::GOOD,
            flags: 0,
            do_res: 0,
            di_res: 0,
            resp: Some(code),
            sense: Vec::new(),
        };
        match &mut t.phase {
            Phase::Tmf {
                awaiting,
                rsp: held,
            } if !awaiting.is_empty() => {
                *held = Some(Box::new(rsp));
            }
            _ => self.respond(cmd, rsp),
        }
        self.maybe_cred_req();
        true
    }

    /// Queue an SRP_AER_REQ (SRP r16a 6.12) for `lun` with `sense`. One is
    /// outstanding at a time; up to 8 more wait (duplicates merged), later
    /// ones are dropped and counted. Returns false if the channel is not live.
    pub fn send_aer(&mut self, lun: Lun, sense: &[u8]) -> bool {
        if self.state != ChannelState::Live {
            return false;
        }
        let room = (self.p.max_ti_iu_len as usize).saturating_sub(AER_REQ_FIXED_LEN);
        let sense = sense[..sense.len().min(room)].to_vec();
        if self.aer_queued || self.aer_out.is_some() {
            if self
                .aer_backlog
                .iter()
                .any(|(l, s)| *l == lun && *s == sense)
            {
                return true;
            }
            if self.aer_backlog.len() >= AER_BACKLOG {
                self.stats.aers_dropped += 1;
            } else {
                self.aer_backlog.push_back((lun, sense));
            }
            return true;
        }
        self.aer_queued = true;
        self.wrs.push_back(Wr::Aer { lun, sense });
        true
    }

    /// Log the channel out (SRP_T_LOGOUT with `reason`, then Disconnect).
    pub fn logout(&mut self, reason: TLogoutReason) {
        self.fail(Some(reason));
    }

    /// The driver found the connection unusable by itself (its QP failed
    /// outside the channel's own work requests, say, or its login never
    /// completed): close as after a failed work request, with no
    /// SRP_T_LOGOUT (it could not be delivered), then Disconnect once
    /// posted work requests completed.
    pub fn connection_lost(&mut self) {
        self.fail(None);
    }

    /// The connection is gone and its QP drained: every command is
    /// released (those with the SCSI core are aborted first). No more
    /// work requests or Disconnect are emitted.
    pub fn disconnected(&mut self) {
        self.fail(None);
        self.state = ChannelState::Closed;
        self.wrs.clear();
        self.ops.clear();
        self.wr_out = 0;
        self.sends_out = 0;
        let mut ids: Vec<CmdId> = self.tasks.keys().copied().collect();
        self.tasks.clear();
        ids.sort_unstable();
        for id in ids {
            self.events.push_back(Output::Release(id));
        }
    }

    // ---- output ---------------------------------------------------------

    /// Next thing for the driver to do, or `None`. Work requests are handed
    /// out only while fewer than `srpt_sq_size` are outstanding.
    pub fn poll_output(&mut self) -> Option<Output> {
        // Nothing queued (the last of each round of calls): said before
        // the loop below sets itself up.
        if self.events.is_empty() && self.wrs.is_empty() && self.state == ChannelState::Live {
            return None;
        }
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            if self.state == ChannelState::Closing && self.wrs.is_empty() && self.wr_out == 0 {
                self.state = ChannelState::Closed;
                return Some(Output::Disconnect);
            }
            if self.state == ChannelState::Closed || self.wr_out >= self.p.sq_size {
                return None;
            }
            let wr = self.wrs.pop_front()?;
            if let Some(out) = self.emit(wr) {
                self.wr_out += 1;
                if matches!(out, Output::Send { .. }) {
                    self.sends_out += 1;
                }
                return Some(out);
            }
        }
    }

    #[inline(never)]
    fn emit(&mut self, wr: Wr) -> Option<Output> {
        match wr {
            Wr::Rdma { op, read } => {
                let op = *self.ops.get(&op)?;
                Some(if read {
                    Output::RdmaRead(op)
                } else {
                    Output::RdmaWrite(op)
                })
            }
            Wr::Rsp(r) => {
                let delta = self.take_owed();
                let resp = r.resp.map(RspCode::to_response_data);
                let resp_len = resp.map_or(0, |r| r.len());
                let room = (self.p.max_ti_iu_len as usize).saturating_sub(RSP_FIXED_LEN + resp_len);
                let sense = &r.sense[..r.sense.len().min(room)];
                let rsp = Rsp {
                    sol_not: if r.solicited { sol_not::SOLNT } else { 0 },
                    req_lim_delta: delta as i32,
                    tag: r.tag,
                    // RSPVALID/SNSVALID follow from the data given.
                    flags: RspFlags(r.flags),
                    status: r.status,
                    data_out_res_cnt: r.do_res,
                    data_in_res_cnt: r.di_res,
                    response_data: resp.as_ref().map(|r| &r[..]),
                    sense_data: (!sense.is_empty()).then_some(sense),
                };
                Some(send(Iu::Rsp(rsp), r.solicited))
            }
            Wr::CredReq => {
                self.cred_req_queued = false;
                if self.owed == 0 || self.state != ChannelState::Live {
                    return None;
                }
                let tag = self.new_tag();
                let delta = self.take_owed();
                self.cred_req_out = Some(tag);
                self.stats.cred_reqs += 1;
                let iu = CredReq {
                    sol_not: 0,
                    req_lim_delta: delta as i32,
                    tag,
                };
                Some(send(Iu::CredReq(iu), false))
            }
            Wr::Aer { lun, sense } => {
                self.aer_queued = false;
                if self.state != ChannelState::Live {
                    return None;
                }
                let tag = self.new_tag();
                self.aer_out = Some(tag);
                self.stats.aers_sent += 1;
                // REQUEST LIMIT DELTA stays 0: an initiator that ignores
                // AERs must not lose credits.
                let iu = AerReq {
                    sol_not: 0,
                    req_lim_delta: 0,
                    tag,
                    lun,
                    sense_data: &sense,
                };
                Some(send(Iu::AerReq(iu), false))
            }
            Wr::TLogout(reason) => {
                let tag = self.new_tag();
                let iu = TLogout {
                    sol_not: 0,
                    reason,
                    tag,
                };
                Some(send(Iu::TLogout(iu), false))
            }
        }
    }

    // ---- internals ------------------------------------------------------

    fn new_tag(&mut self) -> Tag {
        let t = Tag(self.next_tag);
        self.next_tag += 1;
        t
    }

    fn take_owed(&mut self) -> u32 {
        let d = std::mem::take(&mut self.owed);
        if d > 0 {
            self.over_streak = 0;
        }
        d
    }

    fn take_credit(&mut self) -> bool {
        if self.in_flight + self.owed < self.window {
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    fn free_credit(&mut self) {
        if self.in_flight > 0 {
            self.in_flight -= 1;
            self.owed += 1;
        }
    }

    /// CRED_REQ rule: credits owed, none queued or unanswered, and no
    /// response queued that would carry them; and either nothing in flight
    /// or at least half the window owed.
    fn maybe_cred_req(&mut self) {
        if self.state != ChannelState::Live
            || self.owed == 0
            || self.cred_req_queued
            || self.cred_req_out.is_some()
            || self.wrs.iter().any(|w| matches!(w, Wr::Rsp(_)))
        {
            return;
        }
        if self.in_flight == 0 || self.owed * 2 >= self.window {
            self.cred_req_queued = true;
            self.wrs.push_back(Wr::CredReq);
        }
    }

    /// Close the channel: `Some(reason)` sends T_LOGOUT first. Work not yet
    /// posted is dropped; tasks with the core are aborted; Disconnect
    /// follows once posted work requests completed.
    fn fail(&mut self, reason: Option<TLogoutReason>) {
        if self.state != ChannelState::Live {
            return;
        }
        self.state = ChannelState::Closing;
        self.stats.logout_reason = reason;
        for wr in std::mem::take(&mut self.wrs) {
            if let Wr::Rdma { op, .. } = wr {
                self.unpost(op);
            }
        }
        if let Some(r) = reason {
            self.wrs.push_back(Wr::TLogout(r));
        }
        self.cred_req_queued = false;
        self.aer_queued = false;
        self.aer_backlog.clear();
        self.tags.clear();
        let mut ids: Vec<CmdId> = self.tasks.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(t) = self.tasks.get_mut(&id) {
                if matches!(t.phase, Phase::Core | Phase::Tmf { rsp: None, .. }) && !t.aborted {
                    self.events.push_back(Output::Abort(id));
                }
                t.aborted = true;
                if t.ops == 0 {
                    self.tasks.remove(&id);
                    self.events.push_back(Output::Release(id));
                }
            }
        }
    }

    /// Forget an op that was queued but never handed out.
    fn unpost(&mut self, op: OpId) {
        if let Some(o) = self.ops.remove(&op) {
            if let Some(t) = self.tasks.get_mut(&o.cmd) {
                t.ops = t.ops.saturating_sub(1);
            }
        }
    }

    /// End a task without a response: its credit is owed; its buffers are
    /// released once no posted op names them.
    fn drop_task(&mut self, id: CmdId) {
        let queued: Vec<OpId> = self
            .wrs
            .iter()
            .filter_map(|w| match w {
                Wr::Rdma { op, .. } if self.ops.get(op).is_some_and(|o| o.cmd == id) => Some(*op),
                _ => None,
            })
            .collect();
        self.wrs
            .retain(|w| !matches!(w, Wr::Rdma { op, .. } if queued.contains(op)));
        for op in queued {
            self.unpost(op);
        }
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if !t.aborted {
            t.aborted = true;
            self.tags.forget(t.tag, id);
            self.free_credit();
        }
        self.reap(id);
    }

    /// Release an aborted task once no posted op names it.
    fn reap(&mut self, id: CmdId) {
        if self.tasks.get(&id).is_some_and(|t| t.aborted && t.ops == 0) {
            self.tasks.remove(&id);
            self.events.push_back(Output::Release(id));
            self.settled(id);
        }
    }

    /// Task `id` can no longer touch initiator memory or the medium behind
    /// the channel's back (it ended, or what it still sends is queued):
    /// TMFs waiting for it stop waiting, and those the core has answered
    /// send their response now.
    fn settled(&mut self, id: CmdId) {
        if self.tmfs_waiting.is_empty() {
            return;
        }
        let mut ready = Vec::new();
        let tasks = &mut self.tasks;
        self.tmfs_waiting.retain(|tmf| {
            let Some(t) = tasks.get_mut(tmf) else {
                // Ended with the channel.
                return false;
            };
            let Phase::Tmf { awaiting, rsp } = &mut t.phase else {
                return false;
            };
            awaiting.retain(|a| *a != id);
            if !awaiting.is_empty() {
                return true;
            }
            if let Some(rsp) = rsp.take().filter(|_| !t.aborted) {
                ready.push((*tmf, *rsp));
            }
            false
        });
        for (tmf, rsp) in ready {
            self.respond(tmf, rsp);
        }
    }

    /// Finish a task with a response.
    fn respond(&mut self, id: CmdId, rsp: RspPlan) {
        if let Some(t) = self.tasks.remove(&id) {
            self.tags.forget(t.tag, id);
            self.free_credit();
            self.wrs.push_back(Wr::Rsp(rsp));
            self.events.push_back(Output::Release(id));
        }
    }

    /// Like [`Channel::respond`] for a task whose data-in WRITEs are
    /// posted: the response goes out behind them, the task (and its buffer)
    /// stays until they complete.
    fn respond_draining(&mut self, id: CmdId, rsp: RspPlan) {
        if let Some(t) = self.tasks.get(&id) {
            self.tags.forget(t.tag, id);
            self.free_credit();
            self.wrs.push_back(Wr::Rsp(rsp));
        }
    }

    fn post_segments(
        &mut self,
        id: CmdId,
        segs: &[Segment],
        read: bool,
        local: impl Fn(u64) -> Local,
    ) {
        for s in segs {
            let op = OpId(self.next_op);
            self.next_op += 1;
            self.ops.insert(
                op,
                RdmaOp {
                    id: op,
                    cmd: id,
                    remote_va: s.remote_va,
                    rkey: s.rkey,
                    len: s.len,
                    local: local(s.local_offset),
                },
            );
            self.wrs.push_back(Wr::Rdma { op, read });
        }
        if let Some(t) = self.tasks.get_mut(&id) {
            t.ops += segs.len() as u32;
        }
    }

    fn op_done(&mut self, op: OpId, ok: bool, table: Option<&[u8]>) {
        let Some(o) = self.ops.remove(&op) else {
            return;
        };
        self.wr_out = self.wr_out.saturating_sub(1);
        let id = o.cmd;
        if let Some(t) = self.tasks.get_mut(&id) {
            t.ops = t.ops.saturating_sub(1);
        }
        if !ok {
            // RC: the QP is in error now; everything else will flush.
            self.fail(None);
            self.reap(id);
            self.maybe_cred_req();
            return;
        }
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if t.aborted {
            self.reap(id);
            self.maybe_cred_req();
            return;
        }
        match (&mut t.phase, o.local) {
            (Phase::Table { left }, Local::Table { data_in }) => {
                let total = if data_in { t.in_total } else { t.out_total };
                let want = match if data_in { &t.inn } else { &t.out } {
                    Xfer::External(d) => d.len as usize,
                    _ => usize::MAX,
                };
                let bytes = table.unwrap_or(&[]);
                let descs = (bytes.len() == want)
                    .then(|| DescList::new(bytes).ok())
                    .flatten()
                    .map(|l| l.iter().collect::<Vec<_>>())
                    .filter(|d| sum_len(d) == u64::from(total));
                *left -= 1;
                let left = *left;
                match descs {
                    Some(d) => {
                        if data_in {
                            t.inn = Xfer::Descs(d.into());
                        } else {
                            t.out = Xfer::Descs(d.into());
                        }
                        if left == 0 {
                            self.start_data_out(id);
                        }
                    }
                    None => self.refuse_task(id),
                }
            }
            (Phase::Fetch { left }, Local::DataOut { .. }) => {
                *left -= 1;
                if *left == 0 {
                    self.submit(id);
                }
            }
            (Phase::Drain, _) if t.ops == 0 => {
                self.tasks.remove(&id);
                self.events.push_back(Output::Release(id));
            }
            // The other table READ of a refused command.
            (Phase::Write { left, rsp }, _) => {
                *left -= 1;
                if *left == 0 {
                    let rsp = rsp.clone();
                    self.respond(id, rsp);
                }
            }
            _ => {}
        }
        self.maybe_cred_req();
    }

    /// A command found bad after it was accepted (bad external table):
    /// CHECK CONDITION once its posted ops completed.
    fn refuse_task(&mut self, id: CmdId) {
        let Some(t) = self.tasks.get(&id) else {
            return;
        };
        let rsp = check_condition(t.tag, t.sol, &sense::invalid_cmd_iu());
        self.stats.bad_cmds += 1;
        if t.ops == 0 {
            self.respond(id, rsp);
        } else {
            // The other table read is still posted: answer when it lands.
            if let Some(t) = self.tasks.get_mut(&id) {
                t.phase = Phase::Write { left: t.ops, rsp };
            }
        }
    }
}
