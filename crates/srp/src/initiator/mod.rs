//! Sans-IO SRP initiator: one [`Channel`] per RDMA channel to a target
//! port, in the spirit of Linux `ib_srp` and of the SRP driver design in the
//! project seed (section 2.3).
//!
//! The channel knows no RDMA provider, no connection manager and no clock.
//! It builds the SRP_LOGIN_REQ and judges the answer, turns SCSI commands
//! whose memory the driver has registered into SRP_CMD bytes, keeps the
//! request limit, matches SRP_RSPs to commands, answers the target's credit
//! and event requests, and runs the error handler's timers. The driver
//! posts what it is told, feeds back what arrives, and owns every buffer.
//!
//! # Call order
//!
//! 1. [`Channel::new`] with a [`ChannelConfig`].
//! 2. [`Channel::login_request`] gives the SRP_LOGIN_REQ; put
//!    [`LoginReq::emit`](crate::wire::LoginReq::emit) (IB CM, 64 bytes) or
//!    [`emit_rdma`](crate::wire::LoginReq::emit_rdma) (RDMA CM, 56 bytes) in
//!    the CM REQ private data. Pass the private data of the CM REP or of a
//!    consumer-defined CM REJ to [`Channel::handle_login_response`]: `Ok`
//!    gives the [`Negotiated`] values (size the receive buffers for
//!    `max_ti_iu_len`), `Err` says why in words. If the CM fails without
//!    private data, call [`Channel::disconnected`].
//! 3. While connected, in any order the events happen:
//!    * [`Channel::submit`] a [`Command`]; on `Ok(tag)` an SRP_CMD is queued;
//!      on `Err` nothing was sent and no credit was taken.
//!    * every received SEND: [`Channel::handle_recv`] (the receive buffer
//!      may be reposted when it returns);
//!    * every send completion: [`Channel::handle_send_done`];
//!    * when [`Channel::poll_timeout`] passes: [`Channel::handle_timeout`];
//!    * after any of these, drain [`Channel::poll_output`],
//!      [`Channel::poll_completion`] and [`Channel::poll_event`] until
//!      `None`. Outputs must be acted on in order (seed 2.3.6: requests go
//!      out in the order they were submitted); completions come in the
//!      order the target's answers arrived.
//! 4. When the connection is gone (a send or receive failed, a DREQ, an
//!    [`Output::Reconnect`], after [`Event::TargetLogout`]) and the QP is
//!    drained, call [`Channel::disconnected`]: with `hold == false` every
//!    outstanding command completes with [`Status::TransportFailed`] (or
//!    [`Status::Reset`] after a host reset); with `hold == true` (the rport
//!    is blocked) they stay until [`Channel::fail_held`] or the next
//!    [`Channel::login_request`], which ends them with [`Status::Reset`] so
//!    the SCSI layer retries them on the new login, as ib_srp's reconnect does.
//!
//! Every call does work bounded by the number of outstanding commands.
//!
//! # Commands and their life
//!
//! A command holds a slot (its context, seed 2.3.5) from `submit` until both
//! its SRP_RSP (or abort/reset) and its send completion have been seen: the
//! answer may arrive before the send completion (seed 2.3.4). The
//! [`Completion`] is queued as soon as the answer arrives (the target sends
//! SRP_RSP only after its RDMA transfers, so the data buffer is free); the
//! tag is reused only after the send completion too, and tags carry a
//! generation, so a late answer to an aborted command never completes a
//! newer one. Device errors come up as [`Status::Scsi`] with the sense
//! data, never retried here (seed 2.3.9.3).
//!
//! Data descriptors follow ib_srp's `srp_map_data`: one segment is a direct
//! descriptor; up to `cmd_sg_entries` an indirect descriptor with the whole
//! list in the IU; more, when `allow_ext_sg` is on, an indirect descriptor
//! with the first `cmd_sg_entries` in the IU and the whole table at the
//! command's `desc_table`, whose bytes come in [`Transmit::ext_table`].
//! [`Data::Immediate`] puts data-out into the IU when the login agreed to
//! immediate data and [`Channel::immediate_capacity`] allows the length.
//!
//! Credits: every SRP_CMD takes one and may not take the last one, which
//! is kept for SRP_TSK_MGMT (ib_srp `__srp_get_tx_iu`); every SRP_RSP,
//! SRP_CRED_REQ and SRP_AER_REQ adds its REQUEST LIMIT DELTA. Answers to
//! the target (SRP_CRED_RSP, SRP_AER_RSP) take no credit.
//!
//! # Error handling
//!
//! As the SCSI error handler drives ib_srp: a command past its timeout gets
//! ABORT TASK; if that fails (response code other than complete, no answer
//! within `tmf_timeout`, or no credit), LOGICAL UNIT RESET for its LUN; if
//! that fails, [`Output::Reconnect`] (host reset). A successful abort
//! completes the command with [`Status::Aborted`], a successful LUN reset
//! completes every outstanding command of the LUN with [`Status::Reset`].
//! One task management request is outstanding at a time; while a LUN reset
//! is, `submit` answers [`SubmitError::Recovering`]; timers stop while the
//! channel is not logged in. The "Abort output" is an
//! [`Output::Send`] of an SRP_TSK_MGMT plus [`Event::TaskMgmtSent`]. What the channel does not decide: whether
//! the path is offlined. A host reset that reconnects leaves the rport
//! running (the `srp-initiator` rport FSM owns that policy).
//!
//! What it refuses: bidirectional commands, sending before login, and any
//! IU the target should not send (reported as [`Event::Protocol`] and
//! dropped).

mod config;
mod types;

pub use config::{
    ChannelConfig, ConfigError, DEFAULT_CMD_TIMEOUT, DEFAULT_TMF_TIMEOUT, MAX_ADD_CDB_LEN,
    MIN_IT_IU_LEN, TSK_MGMT_RESERVE,
};
pub use types::{
    Command, Completion, Data, Event, LoginError, LoginFailure, Negotiated, Output, ProtocolError,
    Residual, Segment, SendId, Status, SubmitError, TmfFailure, Transmit,
};

use crate::wire::{
    AerRsp, BufFormats, Cmd, CredRsp, DataDesc, DescList, DirectBuf, IndirectBuf, Iu, IuType,
    LoginRsp, Lun, Rsp, RspCode, RspFlags, Tag, TmFunc, TskMgmt, DIRECT_BUF_LEN,
};
use rdma_types::{Instant, Rkey};
use std::collections::VecDeque;

/// Bit 63 marks task management tags (ib_srp's `SRP_TAG_TSK_MGMT` is bit
/// 31 of its 32-bit blk-mq tags; command tags here use 63 bits).
const TAG_TSK_MGMT: u64 = 1 << 63;
/// Generations use bits 62..32 of a command tag.
const GEN_MASK: u32 = 0x7fff_ffff;

/// Encoding buffers a channel keeps for reuse (a batch of SRP_CMDs sent
/// together takes them).
const SPARE_BYTES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    LoginSent,
    Live,
    /// Output::Reconnect emitted; waiting for `disconnected`.
    Resetting,
    /// SRP_T_LOGOUT received; waiting for `disconnected`.
    LoggedOut,
    Disconnected,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::LoginSent => "logging in",
            State::Live => "logged in",
            State::Resetting => "resetting",
            State::LoggedOut => "logged out by the target",
            State::Disconnected => "disconnected",
        }
    }
}

/// The context of one outstanding command (seed 2.3.5).
#[derive(Debug, Clone)]
struct Ctx {
    /// Submission order (seed 2.3.6).
    seq: u64,
    tag: Tag,
    lun: Lun,
    deadline: Instant,
    /// The SEND not yet completed.
    send: Option<SendId>,
    /// The completion has been queued.
    done: bool,
    /// Passed its deadline; queued for abort.
    timed_out: bool,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    gen: u32,
    ctx: Option<Ctx>,
}

#[derive(Debug, Clone, Copy)]
enum SendWhat {
    Cmd { slot: u32, gen: u32 },
    Tmf,
    Answer,
}

/// The one task management request in flight.
#[derive(Debug, Clone, Copy)]
struct Tmf {
    func: TmFunc,
    lun: Lun,
    tag: Tag,
    /// The command being aborted (ABORT TASK) or this request's own tag.
    task: Tag,
    deadline: Instant,
}

/// One SRP initiator RDMA channel; see the module documentation for the
/// call order.
#[derive(Debug)]
pub struct Channel {
    cfg: ChannelConfig,
    state: State,
    neg: Option<Negotiated>,
    /// Credits: may go negative with a negative delta.
    req_lim: i64,
    slots: Vec<Slot>,
    /// Free slots, oldest freed first (delays tag reuse).
    free: VecDeque<u32>,
    /// Slots with a context.
    live: u32,
    next_send: u64,
    next_seq: u64,
    sends: rdma_types::IdRing<SendId, SendWhat>,
    /// Answers waiting for a send slot.
    deferred: VecDeque<Transmit>,
    /// Sent SRP_CMDs' buffers, handed back ([`Channel::reuse_bytes`]) to
    /// encode the next ones in: at most `SPARE_BYTES`, none larger than
    /// an IU.
    spare_bytes: crate::spare::SpareBufs<SPARE_BYTES>,
    tmf: Option<Tmf>,
    tmf_seq: u64,
    abort_queue: VecDeque<Tag>,
    outputs: VecDeque<Output>,
    completions: VecDeque<Completion>,
    events: VecDeque<Event>,
}

impl Channel {
    /// A channel that has not logged in.
    ///
    /// # Errors
    /// [`ConfigError`] for values no channel can work with.
    pub fn new(cfg: ChannelConfig) -> Result<Channel, ConfigError> {
        cfg.validate()?;
        let n = u32::from(cfg.can_queue);
        Ok(Channel {
            slots: vec![Slot::default(); n as usize],
            free: (0..n).collect(),
            cfg,
            state: State::Idle,
            neg: None,
            req_lim: 0,
            live: 0,
            next_send: 0,
            next_seq: 0,
            sends: rdma_types::IdRing::default(),
            deferred: VecDeque::new(),
            spare_bytes: Default::default(),
            tmf: None,
            tmf_seq: 0,
            abort_queue: VecDeque::new(),
            outputs: VecDeque::new(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// What the last successful login agreed.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    /// Whether commands may be submitted.
    pub fn is_logged_in(&self) -> bool {
        self.state == State::Live
    }

    /// The request limit (credits) as the channel counts it.
    pub fn credits(&self) -> i64 {
        self.req_lim
    }

    /// Commands holding a context (answered commands whose send has not
    /// completed included).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.live as usize
    }

    /// Bytes of data-out that fit as immediate data, when negotiated.
    #[inline]
    pub fn immediate_capacity(&self) -> Option<u32> {
        let neg = self.neg.as_ref()?;
        let off = neg.imm_data_offset?;
        Some(neg.max_it_iu_len.saturating_sub(u32::from(off)))
    }

    /// Start a login: the SRP_LOGIN_REQ to put in the CM REQ. Commands held
    /// since the last disconnect complete with [`Status::Reset`] now.
    ///
    /// # Errors
    /// [`LoginError::Busy`] unless the channel is new or disconnected.
    pub fn login_request(&mut self) -> Result<crate::wire::LoginReq, LoginError> {
        match self.state {
            State::Idle | State::Disconnected => {}
            s => return Err(LoginError::Busy(s.name())),
        }
        self.end_all(Status::Reset);
        self.state = State::LoginSent;
        Ok(self.cfg.login_req())
    }

    /// Judge the target's answer to the login: the private data of the CM
    /// REP (SRP_LOGIN_RSP) or CM REJ (SRP_LOGIN_REJ).
    ///
    /// # Errors
    /// [`LoginFailure`], decoded; the channel is then disconnected and may
    /// log in again.
    pub fn handle_login_response(
        &mut self,
        _now: Instant,
        private_data: &[u8],
    ) -> Result<Negotiated, LoginFailure> {
        if self.state != State::LoginSent {
            return Err(LoginFailure::NotWaiting);
        }
        let res = self.judge_login(private_data);
        match &res {
            Ok(neg) => {
                self.neg = Some(*neg);
                self.req_lim = i64::from(neg.req_lim);
                self.state = State::Live;
            }
            Err(_) => self.state = State::Disconnected,
        }
        res
    }

    fn judge_login(&self, data: &[u8]) -> Result<Negotiated, LoginFailure> {
        let rsp = match Iu::parse(data, None).map_err(LoginFailure::Malformed)? {
            Iu::LoginRsp(r) => r,
            Iu::LoginRej(r) => {
                return Err(LoginFailure::Rejected {
                    reason: r.reason,
                    req_it_iu_len: self.cfg.max_it_iu_len(self.cfg.want_immediate),
                    buf_fmt: r.buf_fmt,
                })
            }
            other => return Err(LoginFailure::Unexpected(other.iu_type())),
        };
        self.negotiate(&rsp)
    }

    fn negotiate(&self, rsp: &LoginRsp) -> Result<Negotiated, LoginFailure> {
        // ib_srp srp_cm_rep_handler: immediate data only if both want it.
        let imm = self.cfg.want_immediate && rsp.flags.immediate_supported();
        let max_it = self.cfg.max_it_iu_len(imm).min(rsp.max_it_iu_len);
        if (max_it as usize) < MIN_IT_IU_LEN {
            return Err(LoginFailure::ItIuTooSmall(rsp.max_it_iu_len));
        }
        let imm_data_offset = imm.then_some(crate::wire::LINUX_IMM_DATA_OFFSET);
        let credits_for_cmds = i64::from(rsp.req_lim_delta) - TSK_MGMT_RESERVE;
        let can_queue = credits_for_cmds.clamp(1, i64::from(self.cfg.can_queue)) as u32;
        Ok(Negotiated {
            req_lim: rsp.req_lim_delta,
            max_it_iu_len: max_it,
            max_ti_iu_len: rsp.max_ti_iu_len,
            imm_data_offset,
            multichannel: rsp.flags.multichannel(),
            buf_fmt: rsp.buf_fmt,
            can_queue,
        })
    }

    /// Sends LOGICAL UNIT RESET for `lun` at the user's request (what
    /// `sg_reset --device` makes ib_srp do). On success every unanswered
    /// command of the LUN ends with [`Status::Reset`]; on failure the
    /// channel escalates to a reconnect, as after a failed reset of the
    /// error handler. The result arrives as [`Event::TaskMgmtDone`].
    ///
    /// # Errors
    /// [`SubmitError::NotLoggedIn`], or [`SubmitError::Recovering`] while
    /// another task management request is in flight.
    pub fn reset_lun(&mut self, now: Instant, lun: Lun) -> Result<(), SubmitError> {
        if self.state != State::Live {
            return Err(SubmitError::NotLoggedIn);
        }
        if self.tmf.is_some() {
            return Err(SubmitError::Recovering);
        }
        self.start_tmf(now, TmFunc::LogicalUnitReset, lun, Tag(0));
        Ok(())
    }

    /// ABORT TASK for an unanswered command, on request rather than after
    /// its timeout (what an operator or a test asks for). It goes through
    /// the error handler like a timed-out command's: one task management
    /// request at a time, a failed abort of a command still unanswered
    /// escalates to LOGICAL UNIT RESET, and a command whose response
    /// arrives first completes normally. Returns whether `tag` was an
    /// unanswered command of this channel.
    pub fn abort(&mut self, now: Instant, tag: Tag) -> bool {
        if self.state != State::Live {
            return false;
        }
        let open = self
            .lookup(tag)
            .and_then(|s| self.slots[s as usize].ctx.as_ref())
            .is_some_and(|c| !c.done);
        if open && !self.abort_queue.contains(&tag) {
            self.abort_queue.push_back(tag);
            self.drive_eh(now);
        }
        open
    }

    /// The oldest unanswered command, by submission order.
    pub fn oldest_unanswered(&self) -> Option<Tag> {
        self.oldest_unanswered_where(|_| true)
    }

    /// The oldest unanswered command for which `pick` holds.
    pub fn oldest_unanswered_where(&self, mut pick: impl FnMut(Tag) -> bool) -> Option<Tag> {
        self.slots
            .iter()
            .filter_map(|s| s.ctx.as_ref())
            .filter(|c| !c.done && pick(c.tag))
            .min_by_key(|c| c.seq)
            .map(|c| c.tag)
    }

    /// Queue one SCSI command; returns its tag.
    ///
    /// # Errors
    /// [`SubmitError`]; nothing was queued and no credit taken.
    pub fn submit(&mut self, now: Instant, cmd: &Command) -> Result<Tag, SubmitError> {
        let neg = match (self.state, self.neg) {
            (State::Live, Some(n)) => n,
            _ => return Err(SubmitError::NotLoggedIn),
        };
        if self.tmf.is_some_and(|t| t.func != TmFunc::AbortTask) {
            // The SCSI error handler holds new commands while it resets a
            // LUN; one sent now would be ended by the reset's success.
            return Err(SubmitError::Recovering);
        }
        if self.live >= neg.can_queue {
            return Err(SubmitError::QueueFull(self.live));
        }
        let slot = *self.free.front().ok_or(SubmitError::QueueFull(self.live))?;
        let gen = self.slots[slot as usize].gen;
        // Channels of one nexus share the target's task set: the channel
        // index keeps their tags apart (as blk-mq's unique tag does for
        // ib_srp's hardware queues). `can_queue` is 16 bits, so is a slot.
        let tag = Tag((u64::from(gen) << 32)
            | (u64::from(self.cfg.channel_index) << 16)
            | u64::from(slot));
        let mut bytes = self.spare_bytes.take();
        let (ext_table, follows) = self.encode_cmd(&neg, tag, cmd, &mut bytes)?;
        if self.req_lim <= TSK_MGMT_RESERVE {
            self.reuse_bytes(bytes);
            return Err(SubmitError::NoCredit);
        }
        self.req_lim -= 1;
        self.free.pop_front();
        let id = self.send_id(SendWhat::Cmd { slot, gen });
        self.next_seq += 1;
        self.slots[slot as usize].ctx = Some(Ctx {
            seq: self.next_seq,
            tag,
            lun: cmd.lun,
            deadline: now + cmd.timeout.unwrap_or(self.cfg.cmd_timeout),
            send: Some(id),
            done: false,
            timed_out: false,
        });
        self.live += 1;
        self.outputs.push_back(Output::Send(Transmit {
            id,
            iu: IuType::Cmd,
            tag,
            bytes,
            ext_table,
            follows,
        }));
        Ok(tag)
    }

    /// Encodes `cmd` into `bytes`; returns its external descriptor table
    /// and the bytes of immediate data left for the driver to append
    /// ([`Command::immediate_follows`]).
    fn encode_cmd(
        &self,
        neg: &Negotiated,
        tag: Tag,
        cmd: &Command,
        bytes: &mut Vec<u8>,
    ) -> Result<(Option<Vec<u8>>, usize), SubmitError> {
        let mut list = Vec::new();
        let mut ext = None;
        let (data_out, data_in) = match &cmd.data {
            Data::None => (DataDesc::None, DataDesc::None),
            // Most commands: one segment, described in the IU as it is
            // (what `describe` does too, without its call).
            Data::In([seg]) => (DataDesc::None, DataDesc::Direct(*seg)),
            Data::Out([seg]) => (DataDesc::Direct(*seg), DataDesc::None),
            Data::In(segs) => (
                DataDesc::None,
                self.describe(neg, segs, cmd.desc_table, &mut list, &mut ext)?,
            ),
            Data::Out(segs) => (
                self.describe(neg, segs, cmd.desc_table, &mut list, &mut ext)?,
                DataDesc::None,
            ),
            Data::Immediate(data) => {
                let offset = neg
                    .imm_data_offset
                    .ok_or(SubmitError::ImmediateNotNegotiated)?;
                if data.is_empty() {
                    return Err(SubmitError::EmptyData);
                }
                let max = neg.max_it_iu_len.saturating_sub(u32::from(offset));
                if data.len() > max as usize {
                    return Err(SubmitError::ImmediateTooLarge {
                        len: data.len(),
                        max,
                    });
                }
                (DataDesc::Immediate { offset, data }, DataDesc::None)
            }
        };
        let iu = Cmd {
            sol_not: 0,
            tag,
            lun: cmd.lun,
            task_attr: cmd.attr,
            cdb: cmd.cdb,
            data_out,
            data_in,
        };
        let follows = match iu.data_out {
            DataDesc::Immediate { data, .. } if cmd.immediate_follows => {
                iu.encode_head_into(bytes).map_err(SubmitError::Encode)?;
                data.len()
            }
            _ => {
                iu.encode_into(bytes).map_err(SubmitError::Encode)?;
                0
            }
        };
        let n = bytes.len() + follows;
        if n > neg.max_it_iu_len as usize {
            return Err(SubmitError::IuTooLong {
                len: n,
                max: neg.max_it_iu_len,
            });
        }
        Ok((ext, follows))
    }

    /// The descriptor for registered segments (ib_srp `srp_map_data`).
    fn describe<'a>(
        &self,
        neg: &Negotiated,
        segs: &[Segment],
        table: Option<DirectBuf>,
        list: &'a mut Vec<u8>,
        ext: &mut Option<Vec<u8>>,
    ) -> Result<DataDesc<'a>, SubmitError> {
        let n = segs.len();
        if n == 0 {
            return Err(SubmitError::EmptyData);
        }
        if n == 1 {
            // Its length is a u32: no total to check.
            return Ok(DataDesc::Direct(segs[0]));
        }
        let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
        let total_len = u32::try_from(total).map_err(|_| SubmitError::DataTooLong(total))?;
        if !neg.buf_fmt.contains(BufFormats::INDIRECT) {
            return Err(SubmitError::IndirectUnsupported);
        }
        let max = self.cfg.cmd_sg_entries;
        let table_bytes = n * DIRECT_BUF_LEN;
        let table_len = u32::try_from(table_bytes)
            .map_err(|_| SubmitError::TooManySegments { segments: n, max })?;
        let in_iu = if n > usize::from(max) {
            if !self.cfg.allow_ext_sg {
                return Err(SubmitError::TooManySegments { segments: n, max });
            }
            match table {
                Some(t) if t.len >= table_len => {}
                _ => return Err(SubmitError::NeedTable(table_bytes)),
            }
            usize::from(max)
        } else {
            n
        };
        DescList::encode(segs, list);
        if in_iu < n {
            *ext = Some(list.clone());
        }
        let list: &'a Vec<u8> = list;
        let descs = DescList::new(&list[..in_iu * DIRECT_BUF_LEN]).map_err(SubmitError::Encode)?;
        let (va, key) = table.map_or((0, Rkey(0)), |t| (t.va, t.key));
        Ok(DataDesc::Indirect(IndirectBuf {
            table: DirectBuf {
                va,
                key,
                len: table_len,
            },
            total_len,
            descs,
        }))
    }

    fn send_id(&mut self, what: SendWhat) -> SendId {
        let id = SendId(self.next_send);
        self.next_send += 1;
        self.sends.insert(id, what);
        id
    }

    /// A SEND this channel handed out has completed successfully. Returns
    /// `false` for an id the channel does not know (already completed, or
    /// from before a disconnect). A failed send is a broken connection:
    /// call [`Channel::disconnected`] instead.
    pub fn handle_send_done(&mut self, id: SendId) -> bool {
        let Some(what) = self.sends.remove(&id) else {
            return false;
        };
        match what {
            SendWhat::Cmd { slot, gen } => {
                let s = &mut self.slots[slot as usize];
                if s.gen == gen {
                    if let Some(ctx) = s.ctx.as_mut() {
                        ctx.send = None;
                        if ctx.done {
                            self.free_slot(slot);
                        }
                    }
                }
            }
            SendWhat::Tmf => {}
            SendWhat::Answer => {
                if let Some(t) = self.deferred.pop_front() {
                    self.sends.insert(t.id, SendWhat::Answer);
                    self.outputs.push_back(Output::Send(t));
                }
            }
        }
        true
    }

    fn free_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.ctx.take().is_some() {
            s.gen = s.gen.wrapping_add(1) & GEN_MASK;
            self.live -= 1;
            self.free.push_back(slot);
        }
    }

    /// The slot of a live command tag of the current generation.
    fn lookup(&self, tag: Tag) -> Option<u32> {
        if tag.0 & TAG_TSK_MGMT != 0 {
            return None;
        }
        if (tag.0 >> 16) & 0xffff != u64::from(self.cfg.channel_index) {
            return None;
        }
        let slot = (tag.0 & 0xffff) as u32;
        let gen = (tag.0 >> 32) as u32;
        let s = self.slots.get(slot as usize)?;
        (s.gen == gen && s.ctx.is_some()).then_some(slot)
    }

    /// Queue the completion of a command and free its slot if its send has
    /// completed too. Inlined (every answered command comes here): the
    /// completion is then built where it is queued, not moved into a call.
    #[inline(always)]
    fn finish(&mut self, slot: u32, c: Completion) {
        let Some(ctx) = self.slots[slot as usize].ctx.as_mut() else {
            return;
        };
        ctx.done = true;
        let free = ctx.send.is_none();
        self.completions.push_back(c);
        if free {
            self.free_slot(slot);
        }
    }

    /// Every IU received on the channel (one RC SEND each).
    pub fn handle_recv(&mut self, now: Instant, bytes: &[u8]) {
        if matches!(
            self.state,
            State::Idle | State::LoginSent | State::Disconnected
        ) {
            // No connection this channel knows of: nothing can match.
            let t = bytes
                .first()
                .map_or(IuType::Unknown(0), |&b| IuType::from(b));
            self.events
                .push_back(Event::Protocol(ProtocolError::Unexpected(t)));
            return;
        }
        // SRP_RSP, nearly every IU: parsed as one, not through the
        // dispatch over every IU type.
        let iu = if bytes.first().map(|&b| IuType::from(b)) == Some(IuType::Rsp) {
            Rsp::parse(bytes).map(Iu::Rsp)
        } else {
            Iu::parse(bytes, None)
        };
        let iu = match iu {
            Ok(iu) => iu,
            Err(e) => {
                self.events
                    .push_back(Event::Protocol(ProtocolError::Malformed(e)));
                return;
            }
        };
        match iu {
            Iu::Rsp(r) => {
                self.add_credit(r.req_lim_delta);
                if r.tag.0 & TAG_TSK_MGMT != 0 {
                    self.tmf_response(now, &r);
                } else {
                    self.cmd_response(&r);
                }
            }
            Iu::CredReq(r) => {
                self.add_credit(r.req_lim_delta);
                self.answer(Iu::CredRsp(CredRsp { tag: r.tag }), r.tag);
            }
            Iu::AerReq(r) => {
                self.add_credit(r.req_lim_delta);
                self.answer(Iu::AerRsp(AerRsp { tag: r.tag }), r.tag);
                self.events.push_back(Event::Aer {
                    lun: r.lun,
                    sense: r.sense_data.to_vec(),
                });
            }
            Iu::TLogout(r) => {
                self.events.push_back(Event::TargetLogout(r.reason));
                self.state = State::LoggedOut;
                self.tmf = None;
                self.abort_queue.clear();
            }
            other => self
                .events
                .push_back(Event::Protocol(ProtocolError::Unexpected(other.iu_type()))),
        }
    }

    fn add_credit(&mut self, delta: i32) {
        self.req_lim = self.req_lim.saturating_add(i64::from(delta));
    }

    /// SRP_CRED_RSP / SRP_AER_RSP: no credit, one send slot (deferred while
    /// the send queue is full).
    fn answer(&mut self, iu: Iu<'_>, tag: Tag) {
        let Ok(bytes) = iu.to_vec() else { return };
        let sq = usize::from(self.cfg.can_queue) + 2;
        let t = Transmit {
            id: SendId(self.next_send),
            iu: iu.iu_type(),
            tag,
            bytes,
            ext_table: None,
            follows: 0,
        };
        if self.sends.len() < sq {
            self.next_send += 1;
            self.sends.insert(t.id, SendWhat::Answer);
            self.outputs.push_back(Output::Send(t));
        } else if self.deferred.len() < sq {
            self.next_send += 1;
            self.deferred.push_back(t);
        } else {
            self.events
                .push_back(Event::Protocol(ProtocolError::AnswerOverflow(iu.iu_type())));
        }
    }

    fn cmd_response(&mut self, r: &Rsp<'_>) {
        let slot = match self.lookup(r.tag) {
            Some(s) if self.slots[s as usize].ctx.as_ref().is_some_and(|c| !c.done) => s,
            _ => {
                self.events
                    .push_back(Event::Protocol(ProtocolError::UnknownTag(r.tag)));
                return;
            }
        };
        let resid = |under: u8, over: u8, cnt: u32| {
            if r.flags.has(under) {
                Some(Residual::Under(cnt))
            } else if r.flags.has(over) {
                Some(Residual::Over(cnt))
            } else {
                None
            }
        };
        self.finish(
            slot,
            Completion {
                tag: r.tag,
                status: Status::Scsi(r.status),
                sense: r.sense_data.map(<[u8]>::to_vec).unwrap_or_default(),
                response_code: r.response_code(),
                data_in_residual: resid(RspFlags::DIUNDER, RspFlags::DIOVER, r.data_in_res_cnt),
                data_out_residual: resid(RspFlags::DOUNDER, RspFlags::DOOVER, r.data_out_res_cnt),
            },
        );
    }

    fn tmf_response(&mut self, now: Instant, r: &Rsp<'_>) {
        match self.tmf {
            Some(t) if t.tag == r.tag => {
                let result = match r.response_code() {
                    Some(RspCode::Complete) => Ok(()),
                    code => Err(TmfFailure::Response(code)),
                };
                self.tmf_done(now, result);
            }
            _ => self
                .events
                .push_back(Event::Protocol(ProtocolError::UnknownTag(r.tag))),
        }
    }

    /// The next deadline, if a timer runs (none while not logged in).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state != State::Live {
            return None;
        }
        let cmds = self
            .slots
            .iter()
            .filter_map(|s| s.ctx.as_ref())
            .filter(|c| !c.done && !c.timed_out)
            .map(|c| c.deadline);
        cmds.chain(self.tmf.map(|t| t.deadline)).min()
    }

    /// The earliest of the timers a submit of `tag` may have brought
    /// forward: the command's own deadline (while it waits) and the task
    /// management function's. No other deadline moved, so a driver that
    /// knew [`Channel::poll_timeout`] before the submit compares this with
    /// it instead of asking for the earliest over every slot again.
    pub fn poll_timeout_with(&self, tag: Tag) -> Option<Instant> {
        if self.state != State::Live {
            return None;
        }
        let cmd = self
            .lookup(tag)
            .and_then(|slot| self.slots[slot as usize].ctx.as_ref())
            .filter(|c| !c.done && !c.timed_out)
            .map(|c| c.deadline);
        // Asked at every command's start: a match, not an iterator chain.
        match (cmd, self.tmf) {
            (Some(c), Some(t)) => Some(c.min(t.deadline)),
            (c, t) => c.or(t.map(|t| t.deadline)),
        }
    }

    /// Run the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state != State::Live {
            return;
        }
        let mut expired: Vec<(Instant, u64, Tag)> = self
            .slots
            .iter_mut()
            .filter_map(|s| s.ctx.as_mut())
            .filter(|c| !c.done && !c.timed_out && c.deadline <= now)
            .map(|c| {
                c.timed_out = true;
                (c.deadline, c.seq, c.tag)
            })
            .collect();
        expired.sort();
        for (_, _, tag) in expired {
            self.events.push_back(Event::TimedOut { tag });
            self.abort_queue.push_back(tag);
        }
        if let Some(t) = self.tmf {
            if t.deadline <= now {
                self.tmf_done(now, Err(TmfFailure::Timeout));
            }
        }
        self.drive_eh(now);
    }

    /// Start the next abort if no task management request is in flight.
    fn drive_eh(&mut self, now: Instant) {
        while self.tmf.is_none() && self.state == State::Live {
            let Some(tag) = self.abort_queue.pop_front() else {
                return;
            };
            let Some(slot) = self.lookup(tag) else {
                continue;
            };
            let Some(ctx) = self.slots[slot as usize].ctx.as_ref() else {
                continue;
            };
            if ctx.done {
                continue;
            }
            let lun = ctx.lun;
            self.start_tmf(now, TmFunc::AbortTask, lun, tag);
        }
    }

    fn start_tmf(&mut self, now: Instant, func: TmFunc, lun: Lun, task: Tag) {
        self.tmf_seq += 1;
        let tag = Tag(TAG_TSK_MGMT | (self.tmf_seq & !TAG_TSK_MGMT));
        let task = if func == TmFunc::AbortTask { task } else { tag };
        self.tmf = Some(Tmf {
            func,
            lun,
            tag,
            task,
            deadline: now + self.cfg.tmf_timeout,
        });
        if self.req_lim < 1 {
            self.tmf_done(now, Err(TmfFailure::NoCredit));
            return;
        }
        self.req_lim -= 1;
        let iu = TskMgmt {
            sol_not: 0,
            tag,
            lun,
            func,
            task_tag: if func == TmFunc::AbortTask {
                task
            } else {
                Tag(0)
            },
        };
        let Ok(bytes) = Iu::TskMgmt(iu).to_vec() else {
            return;
        };
        let id = self.send_id(SendWhat::Tmf);
        self.events.push_back(Event::TaskMgmtSent {
            func,
            lun,
            task_tag: task,
        });
        self.outputs.push_back(Output::Send(Transmit {
            id,
            iu: IuType::TskMgmt,
            tag,
            bytes,
            ext_table: None,
            follows: 0,
        }));
    }

    /// The task management request in flight ended: escalate or go on.
    fn tmf_done(&mut self, now: Instant, result: Result<(), TmfFailure>) {
        let Some(t) = self.tmf.take() else { return };
        self.events.push_back(Event::TaskMgmtDone {
            func: t.func,
            lun: t.lun,
            result,
        });
        match (t.func, result) {
            (TmFunc::AbortTask, Ok(())) => {
                if let Some(slot) = self.lookup(t.task) {
                    if self.slots[slot as usize]
                        .ctx
                        .as_ref()
                        .is_some_and(|c| !c.done)
                    {
                        self.finish(slot, Completion::ended(t.task, Status::Aborted));
                    }
                }
                self.drive_eh(now);
            }
            (TmFunc::AbortTask, Err(_)) => {
                // Escalate only if the command is still unanswered.
                let open = self
                    .lookup(t.task)
                    .and_then(|s| self.slots[s as usize].ctx.as_ref())
                    .is_some_and(|c| !c.done);
                if open {
                    self.start_tmf(now, TmFunc::LogicalUnitReset, t.lun, t.task);
                } else {
                    self.drive_eh(now);
                }
            }
            (_, Ok(())) => {
                self.end_matching(Some(t.lun), Status::Reset);
                self.drive_eh(now);
            }
            (_, Err(_)) => self.host_reset(),
        }
    }

    fn host_reset(&mut self) {
        self.state = State::Resetting;
        self.tmf = None;
        self.abort_queue.clear();
        self.outputs.push_back(Output::Reconnect);
    }

    /// Complete every unanswered command of `lun` (ib_srp
    /// `srp_reset_device`), or of every LUN, in submission order.
    fn end_matching(&mut self, lun: Option<Lun>, status: Status) {
        let mut open: Vec<(u64, u32, Tag)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.ctx.as_ref().map(|c| (i, c)))
            .filter(|(_, c)| !c.done && lun.is_none_or(|l| l == c.lun))
            .map(|(i, c)| (c.seq, i as u32, c.tag))
            .collect();
        open.sort_unstable();
        for (_, slot, tag) in open {
            self.finish(slot, Completion::ended(tag, status));
        }
    }

    fn end_all(&mut self, status: Status) {
        self.end_matching(None, status);
    }

    /// The connection is gone and its QP drained: no SEND will complete and
    /// no RDMA will touch command memory any more. With `hold`, unanswered
    /// commands stay outstanding (the rport is blocked) until
    /// [`Channel::fail_held`] or the next login; otherwise they complete
    /// now with [`Status::TransportFailed`], or [`Status::Reset`] after an
    /// [`Output::Reconnect`]. Outputs not yet acted on are dropped.
    pub fn disconnected(&mut self, hold: bool) {
        if matches!(self.state, State::Idle | State::Disconnected) {
            return;
        }
        let status = if self.state == State::Resetting {
            Status::Reset
        } else {
            Status::TransportFailed
        };
        self.state = State::Disconnected;
        self.req_lim = 0;
        self.sends.clear();
        self.deferred.clear();
        self.outputs.clear();
        self.tmf = None;
        self.abort_queue.clear();
        for slot in 0..self.slots.len() as u32 {
            if let Some(ctx) = self.slots[slot as usize].ctx.as_mut() {
                ctx.send = None;
                ctx.timed_out = false;
                if ctx.done {
                    self.free_slot(slot);
                }
            }
        }
        if !hold {
            self.end_all(status);
        }
    }

    /// Complete every held command with [`Status::TransportFailed`] (the
    /// rport's fast_io_fail or dev_loss timer fired).
    pub fn fail_held(&mut self) {
        if self.state == State::Disconnected {
            self.end_all(Status::TransportFailed);
        }
    }

    /// A sent [`Transmit`]'s bytes the driver is done with: kept (up to a
    /// few, none larger than an IU) to encode the next SRP_CMD in, which
    /// then allocates nothing.
    pub fn reuse_bytes(&mut self, bytes: Vec<u8>) {
        let max = self.neg.map_or(0, |n| n.max_it_iu_len as usize);
        self.spare_bytes.give(bytes, max);
    }

    /// The next thing the driver must do, in order.
    #[inline]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The next finished command, in the order results arrived.
    #[inline]
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next event.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
