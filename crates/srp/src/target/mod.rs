//! Sans-IO SRP target: login validation, I_T nexus bookkeeping and one
//! [`Channel`] per RDMA channel (one accepted login).
//!
//! The target knows no RDMA provider and no SCSI core. It consumes received
//! bytes and completions as values and produces [`Output`]s: IUs to SEND,
//! RDMA READ/WRITE work requests that name a byte range of a command's data
//! buffer, SCSI commands and task management functions for the SCSI core,
//! and a request to disconnect. The driver owns every data buffer; the
//! channel only says which bytes go where.
//!
//! # Call order
//!
//! 1. A CM REQ arrives: pass its private data to [`Target::login_private_data`]
//!    (or a parsed [`LoginReq`] to [`Target::login`]). [`Login::Accepted`]
//!    gives the channel id and the SRP_LOGIN_RSP for the CM REP;
//!    [`Login::Rejected`] gives the SRP_LOGIN_REJ for the CM REJ. Channels a
//!    SINGLE login terminated now have a T_LOGOUT and a `Disconnect` queued.
//! 2. Once the connection is established, for each channel:
//!    * every received SEND: [`Channel::handle_recv`] (the receive buffer
//!      may be reposted as soon as it returns: the channel copies what it keeps);
//!    * every send completion: [`Channel::handle_send_done`]; every RDMA
//!      completion: [`Channel::handle_rdma_done`], or, for an op whose
//!      [`Local`] is `Table`, [`Channel::handle_table_read`] with the bytes;
//!    * SCSI core results: [`Channel::handle_scsi_done`], [`Channel::handle_tmf_done`];
//!    * after any of these, drain [`Channel::poll_output`] until `None`.
//!      Each call does bounded work; work requests are only handed out while
//!      fewer than `srpt_sq_size` are outstanding, the rest wait inside.
//! 3. When the driver sees `Output::Disconnect` it closes the connection.
//!    When the connection is gone (either side) and the QP has been drained
//!    (no work request will touch memory any more), it calls
//!    [`Channel::disconnected`], drains the last outputs (aborts and
//!    releases), then [`Target::remove`] to return the channel's share of
//!    the shared receive queue to other channels.
//!
//! There are no timers: every rule below is triggered by an input.
//!
//! # Credits (SRP r16a 5.6)
//!
//! A channel's window is granted in the LOGIN_RSP: `max_credits`, or less
//! when the shared receive queue (`srpt_srq_size`) is smaller. Credits are a
//! flow-control promise, not a reservation, as in SCST and Linux ib_srpt:
//! the windows of all channels together may exceed the SRQ (256 initiators
//! with 128 credits each against 4095 entries), because a receive buffer is
//! reposted as soon as its IU was copied, not when its command finishes. If
//! the SRQ does run dry, the NIC answers RNR NAK and the initiator's QP
//! retries; no IU is lost and no login is refused for it. Every SRP_RSP and
//! CRED_REQ carries all credits owed so far in REQUEST LIMIT DELTA. AER_REQ carries zero, because
//! an initiator that ignores AERs would lose the credits. A CRED_REQ is sent
//! when credits are owed and either no request is in flight (no response
//! would carry them) or at least half the window is owed; one at a time.
//!
//! An SRP_CMD beyond the window is answered with TASK SET FULL (an SRP_TSK_MGMT
//! with TASK MANAGEMENT FUNCTION FAILED) without consuming a credit: the
//! initiator may retry, as SAM-5 allows for a resource shortage of its own
//! nexus. More than [`RESERVED_RECV`] such IUs while none is answered eat
//! into other channels' receives, so the channel is then logged out.
//!
//! # Task management
//!
//! Commands still fetching tables or data-out are aborted by the channel
//! itself; those with the SCSI core are aborted by the core, which only
//! marks them (a running I/O finishes). The response to an SRP_TSK_MGMT
//! goes out once the core answered it ([`Channel::handle_tmf_done`]) and
//! every command the function reaches is back from the core
//! ([`Channel::handle_scsi_done`], aborted or not) and every RDMA op
//! already handed out for a command aborted here has completed. A command that completed before the abort
//! took it is answered normally, its data-in and SRP_RSP ahead of the TMF
//! response. So once the initiator has the TMF response, no aborted
//! command touches its memory or the medium again, and it may reuse their
//! buffers and tags.
//!
//! # What the target refuses
//!
//! Protocol violations close the channel with an SRP_T_LOGOUT giving the
//! SRP r16a 6.6 reason: unknown or initiator-inappropriate IU types, IUs
//! longer than the negotiated maximum or shorter than their type, descriptor
//! formats it does not support, responses to requests it never sent. A
//! malformed SRP_CMD whose tag is readable gets CHECK CONDITION, ILLEGAL
//! REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT instead. External
//! indirect descriptor tables are fetched by RDMA READ (Linux ib_srpt refuses
//! them).

mod channel;
mod plan;

pub use channel::{
    Channel, ChannelState, ChannelStats, CmdId, DataOut, Local, OpId, Output, RdmaOp, ScsiDone,
    ScsiRequest, TmfRequest,
};
pub use plan::{plan_rdma, Segment, Segments};

use crate::wire::{
    BufFormats, LoginRej, LoginRejReason, LoginReq, LoginRsp, LoginRspFlags, MultiChannelAction,
    MultiChannelResult, PortId, TLogoutReason, CMD_FIXED_LEN, IMM_BUF_LEN,
};

/// Receive buffers kept per channel beyond its credit window, for the IUs an
/// initiator may send without a credit: one SRP_CRED_RSP and one SRP_AER_RSP
/// (the target has at most one of each request outstanding) and one
/// SRP_I_LOGOUT.
pub const RESERVED_RECV: u32 = 3;

/// Smallest SRP_LOGIN_REQ IT IU length a target accepts (Linux ib_srpt: an
/// SRP_CMD with a 16-byte CDB and one direct descriptor fits in 64).
pub const MIN_IT_IU_LEN: u32 = 64;

/// Target settings. The first five are the ib_srpt module parameters with
/// their defaults (SCST srpt README).
///
/// The hard limits on logins are `max_channels` (every channel of the
/// port) and `max_channels_per_nexus`; a login refused by one of them is
/// refused with INSUFFICIENT RESOURCES or CHANNEL LIMIT REACHED, and
/// [`Target::last_refusal`] names the limit and the setting that raises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// `srp_max_req_size`: largest initiator-to-target IU accepted. SCST's
    /// README gives 4148 (68 + 16 * 255 descriptors); the default here is
    /// 8260 (68 + 8 KiB of immediate data) because that is what Linux
    /// ib_srp asks for by default (the captured ib_srp login requests 8260
    /// and LIO accepts it); with 4148 every default Linux login is rejected.
    pub max_req_size: u32,
    /// `srp_max_rsp_size`: largest target-to-initiator IU sent (256; sense
    /// data beyond 256 - 36 bytes is cut).
    pub max_rsp_size: u32,
    /// `srp_max_rdma_size`: largest single RDMA READ/WRITE (65536).
    pub max_rdma_size: u32,
    /// `srpt_srq_size`: receive buffers shared by all channels (4095).
    pub srq_size: u32,
    /// `srpt_sq_size`: send queue entries per channel (256).
    pub sq_size: u32,
    /// TARGET PORT IDENTIFIER logins must name.
    pub target_port_id: PortId,
    /// Target name, for logs.
    pub name: String,
    /// Credit window a channel gets when the SRQ has room.
    pub max_credits: u32,
    /// Buffer formats supported (direct and indirect by default).
    pub buf_formats: BufFormats,
    /// Accept SRP2 immediate data when an initiator asks for it.
    pub immediate_data: bool,
    /// Accept MULTI logins joining an existing I_T nexus.
    pub multichannel: bool,
    /// Most live channels per I_T nexus.
    pub max_channels_per_nexus: usize,
    /// Most channels of the port, every initiator together (each costs its
    /// QP, send queue slots and completion queue: see the port's memory
    /// per channel).
    pub max_channels: usize,
    /// Initiator ports allowed to log in (`None`: any).
    pub allowed_initiators: Option<Vec<PortId>>,
    /// Whether the port accepts logins at all.
    pub enabled: bool,
    /// Largest data transfer of one command in either direction.
    pub max_data_len: u32,
    /// Largest external descriptor table fetched by RDMA READ, in bytes.
    pub max_table_len: u32,
}

impl TargetConfig {
    /// The ib_srpt defaults for a target port.
    pub fn new(target_port_id: PortId, name: impl Into<String>) -> TargetConfig {
        TargetConfig {
            max_req_size: 8260,
            max_rsp_size: 256,
            max_rdma_size: 65536,
            srq_size: 4095,
            sq_size: 256,
            target_port_id,
            name: name.into(),
            max_credits: 128,
            buf_formats: BufFormats::DIRECT | BufFormats::INDIRECT,
            immediate_data: true,
            multichannel: true,
            max_channels_per_nexus: 16,
            max_channels: 1024,
            allowed_initiators: None,
            enabled: true,
            max_data_len: 16 << 20,
            max_table_len: 4096 * 16,
        }
    }

    /// Check the settings are usable.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad =
            |key: &'static str, value: u32, why: &'static str| Err(ConfigError { key, value, why });
        if self.max_req_size < MIN_IT_IU_LEN {
            return bad("srp_max_req_size", self.max_req_size, "below 64");
        }
        if self.max_rsp_size < 64 {
            return bad("srp_max_rsp_size", self.max_rsp_size, "below 64");
        }
        if self.max_rdma_size == 0 {
            return bad("srp_max_rdma_size", 0, "zero");
        }
        if self.srq_size <= RESERVED_RECV {
            return bad("srpt_srq_size", self.srq_size, "no room for one credit");
        }
        if self.sq_size == 0 {
            return bad("srpt_sq_size", 0, "zero");
        }
        if self.max_credits == 0 {
            return bad("max_credits", 0, "zero");
        }
        if self.max_channels == 0 {
            return bad("max_channels", 0, "zero");
        }
        Ok(())
    }
}

/// A target setting out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("target setting {key} = {value}: {why}")]
pub struct ConfigError {
    /// The setting's name.
    pub key: &'static str,
    /// Its value.
    pub value: u32,
    /// What is wrong.
    pub why: &'static str,
}

/// Handle of a channel inside a [`Target`]; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u64);

// Issued in sequence by the target.
impl rdma_types::RingId for ChannelId {
    fn ring_index(self) -> u64 {
        self.0
    }
}

/// Which connection manager carried the login (the layouts differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginForm {
    /// IB CM REQ private data: the 64-byte SRP_LOGIN_REQ.
    IbCm,
    /// RDMA CM: the 56 bytes after the RDMA CM header.
    RdmaCm,
}

/// Outcome of a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    /// A channel was created; send `rsp` in the CM REP.
    Accepted {
        /// The new channel.
        channel: ChannelId,
        /// SRP_LOGIN_RSP.
        rsp: LoginRsp,
        /// Channels of the same I_T nexus closed by a SINGLE login.
        terminated: Vec<ChannelId>,
    },
    /// Send `rej` in a CM REJ (consumer defined).
    Rejected(LoginRej),
}

/// An asynchronous event reported to initiators by SRP_AER_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AerEvent {
    /// The LUN inventory changed (SPC-4: REPORTED LUNS DATA HAS CHANGED).
    LunsChanged,
    /// A LUN's capacity changed (SBC-3: CAPACITY DATA HAS CHANGED).
    CapacityChanged(crate::wire::Lun),
}

impl AerEvent {
    /// The LUN field and the fixed-format sense data the AER carries.
    pub fn to_sense(self) -> (crate::wire::Lun, [u8; 18]) {
        match self {
            // SPC-4 table for ASC 3Fh: ASCQ 0Eh.
            AerEvent::LunsChanged => (crate::wire::Lun::default(), sense::fixed(0x06, 0x3f, 0x0e)),
            // SPC-4: ASC 2Ah ASCQ 09h.
            AerEvent::CapacityChanged(lun) => (lun, sense::fixed(0x06, 0x2a, 0x09)),
        }
    }
}

/// SCSI status bytes and sense data the channel produces itself (SAM-5 5.3,
/// SPC-4 4.5.3).
pub mod sense {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// ILLEGAL REQUEST sense key.
    pub const ILLEGAL_REQUEST: u8 = 0x05;

    /// 18 bytes of fixed-format current sense (response code 70h, additional
    /// length 10).
    pub fn fixed(key: u8, asc: u8, ascq: u8) -> [u8; 18] {
        let mut s = [0u8; 18];
        s[0] = 0x70;
        s[2] = key & 0x0f;
        s[7] = 10;
        s[12] = asc;
        s[13] = ascq;
        s
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT (0E/03).
    pub fn invalid_cmd_iu() -> [u8; 18] {
        fixed(ILLEGAL_REQUEST, 0x0e, 0x03)
    }

    /// ILLEGAL REQUEST, OVERLAPPED COMMANDS ATTEMPTED (4E/00).
    pub fn overlapped() -> [u8; 18] {
        fixed(ILLEGAL_REQUEST, 0x4e, 0x00)
    }
}

/// The SRP target port: settings and every channel.
#[derive(Debug)]
pub struct Target {
    config: TargetConfig,
    /// By id, issued in sequence: found by its low bits (asked several
    /// times per command).
    channels: rdma_types::IdRing<ChannelId, Channel>,
    next_id: u64,
    /// Credits promised: windows plus [`RESERVED_RECV`] per channel.
    promised: u64,
    /// Why the last login was refused, in words for a log.
    last_refusal: Option<String>,
}

impl Target {
    /// A target with no channels.
    ///
    /// # Errors
    /// [`ConfigError`] if the settings are unusable.
    pub fn new(config: TargetConfig) -> Result<Target, ConfigError> {
        config.validate()?;
        Ok(Target {
            config,
            channels: Default::default(),
            next_id: 1,
            promised: 0,
            last_refusal: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// Credits promised to channels, windows plus [`RESERVED_RECV`] each.
    /// May exceed the SRQ: see the module's notes on credits.
    pub fn credits_promised(&self) -> u64 {
        self.promised
    }

    /// Why the last refused login was refused, naming the limit and the
    /// setting that raises it where a limit refused it.
    pub fn last_refusal(&self) -> Option<&str> {
        self.last_refusal.as_deref()
    }

    /// A login carried in CM private data. Bytes that are not an
    /// SRP_LOGIN_REQ are rejected with "unable to establish RDMA channel".
    pub fn login_private_data(&mut self, data: &[u8], form: LoginForm) -> Login {
        let parsed = match form {
            LoginForm::IbCm => LoginReq::parse(data),
            LoginForm::RdmaCm => LoginReq::parse_rdma(data),
        };
        match parsed {
            Ok(req) => self.login(&req),
            Err(_) => {
                // The tag is echoed when it can be read.
                let tag_at = if form == LoginForm::IbCm { 8 } else { 0 };
                let tag = data
                    .get(tag_at..tag_at + 8)
                    .and_then(|b| b.try_into().ok())
                    .map(crate::wire::Tag::from_bytes)
                    .unwrap_or_default();
                self.reject(tag, LoginRejReason::UnableEstablishChannel)
            }
        }
    }

    fn reject(&mut self, tag: crate::wire::Tag, reason: LoginRejReason) -> Login {
        self.last_refusal = Some(reason.to_string());
        Login::Rejected(LoginRej {
            reason,
            tag,
            buf_fmt: self.config.buf_formats,
        })
    }

    /// Validate a login (SRP r16a 6.2-6.4) and create its channel. Checks, in
    /// order: port enabled, IT IU length in 64..=`srp_max_req_size`, target
    /// port identifier, initiator allowed, required buffer formats,
    /// multi-channel action, channel limits. Only then does a SINGLE
    /// login terminate the nexus's other channels.
    pub fn login(&mut self, req: &LoginReq) -> Login {
        use LoginRejReason as R;
        let c = self.config.clone();
        let c = &c;
        if !c.enabled {
            return self.reject(req.tag, R::InsufficientResources);
        }
        if req.req_it_iu_len < MIN_IT_IU_LEN || req.req_it_iu_len > c.max_req_size {
            return self.reject(req.tag, R::ReqItIuLengthTooLarge);
        }
        if req.target_port_id != c.target_port_id {
            return self.reject(req.tag, R::UnableAssociateChannel);
        }
        if let Some(allowed) = &c.allowed_initiators {
            if !allowed.contains(&req.initiator_port_id) {
                return self.reject(req.tag, R::UnableEstablishChannel);
            }
        }
        if !c.buf_formats.contains(req.req_buf_fmt) {
            return self.reject(req.tag, R::UnsupportedDescriptorFmt);
        }
        let nexus = (req.initiator_port_id, req.target_port_id);
        let live: Vec<ChannelId> = self
            .channels
            .iter()
            .filter(|(_, ch)| ch.nexus() == nexus && ch.state() == ChannelState::Live)
            .map(|(id, _)| *id)
            .collect();
        let action = req.flags.multichannel();
        match action {
            MultiChannelAction::Single => {}
            MultiChannelAction::Multi => {
                if !c.multichannel && !live.is_empty() {
                    return self.reject(req.tag, R::MultiChannelUnsupported);
                }
                if live.len() >= c.max_channels_per_nexus {
                    let rej = self.reject(req.tag, R::ChannelLimitReached);
                    self.last_refusal = Some(format!(
                        "the initiator has {} channels, the most one I_T nexus may have (max_channels_per_nexus = {} raises it)",
                        live.len(),
                        c.max_channels_per_nexus
                    ));
                    return rej;
                }
            }
            MultiChannelAction::Unknown(_) => {
                return self.reject(req.tag, R::UnableEstablishChannel);
            }
        }
        // A SINGLE login replaces the nexus's channels: they do not count.
        let replaced = if action == MultiChannelAction::Single {
            live.len()
        } else {
            0
        };
        let open = self
            .channels
            .values()
            .filter(|ch| ch.state() != ChannelState::Closed)
            .count();
        if open - replaced >= c.max_channels {
            let rej = self.reject(req.tag, R::InsufficientResources);
            self.last_refusal = Some(format!(
                "the port has {open} channels, its limit (max_channels = {} raises it)",
                c.max_channels
            ));
            return rej;
        }
        let window = c.max_credits.min(c.srq_size - RESERVED_RECV);

        // SRP2: immediate data when asked for and the offset leaves room for
        // SRP_CMD and its descriptor inside the IU (Linux ib_srpt's rule).
        let imm = (req.flags.immediate_requested()
            && c.immediate_data
            && usize::from(req.imm_data_offset) >= CMD_FIXED_LEN + IMM_BUF_LEN
            && u32::from(req.imm_data_offset) < req.req_it_iu_len)
            .then_some(req.imm_data_offset);

        let mut terminated = Vec::new();
        let result = match action {
            MultiChannelAction::Single => {
                for id in &live {
                    if let Some(ch) = self.channels.get_mut(id) {
                        ch.logout(TLogoutReason::MultiChannelAction);
                        terminated.push(*id);
                    }
                }
                if terminated.is_empty() {
                    MultiChannelResult::NoExisting
                } else {
                    MultiChannelResult::Terminated
                }
            }
            // r16a 6.3: NO EXISTING when nothing was there to maintain
            // (Linux ib_srpt answers MAINTAINED regardless).
            _ if live.is_empty() => MultiChannelResult::NoExisting,
            _ => MultiChannelResult::Maintained,
        };
        let max_rsp = c.max_rsp_size;
        let rsp = LoginRsp {
            req_lim_delta: window,
            tag: req.tag,
            max_it_iu_len: req.req_it_iu_len,
            max_ti_iu_len: max_rsp,
            buf_fmt: c.buf_formats,
            flags: LoginRspFlags::new(result, imm.is_some()),
        };
        let id = ChannelId(self.next_id);
        self.next_id += 1;
        self.promised += u64::from(window + RESERVED_RECV);
        self.last_refusal = None;
        let params = channel::Params {
            max_it_iu_len: req.req_it_iu_len,
            max_ti_iu_len: max_rsp,
            max_rdma_size: c.max_rdma_size,
            sq_size: c.sq_size,
            imm_data_offset: imm,
            buf_formats: c.buf_formats,
            max_data_len: c.max_data_len,
            max_table_len: c.max_table_len,
            window,
            nexus,
        };
        self.channels.insert(id, Channel::new(params));
        Login::Accepted {
            channel: id,
            rsp,
            terminated,
        }
    }

    /// A channel.
    pub fn channel(&self, id: ChannelId) -> Option<&Channel> {
        self.channels.get(&id)
    }

    /// A channel, to feed it input or poll it.
    pub fn channel_mut(&mut self, id: ChannelId) -> Option<&mut Channel> {
        self.channels.get_mut(&id)
    }

    /// Ids of every channel not yet removed.
    pub fn channel_ids(&self) -> Vec<ChannelId> {
        let mut ids: Vec<ChannelId> = self.channels.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Live channels of the I_T nexus (initiator port, this target port).
    pub fn nexus_channels(&self, initiator: PortId) -> Vec<ChannelId> {
        let nexus = (initiator, self.config.target_port_id);
        let mut ids: Vec<ChannelId> = self
            .channels
            .iter()
            .filter(|(_, ch)| ch.nexus() == nexus && ch.state() == ChannelState::Live)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Forget a channel whose connection is gone, with its credits.
    /// Returns false for an unknown id.
    pub fn remove(&mut self, id: ChannelId) -> bool {
        let Some(mut ch) = self.channels.remove(&id) else {
            return false;
        };
        ch.disconnected();
        self.promised = self
            .promised
            .saturating_sub(u64::from(ch.window() + RESERVED_RECV));
        true
    }

    /// Queue an SRP_AER_REQ for `event` on every live channel; returns how
    /// many channels took it.
    pub fn notify(&mut self, event: AerEvent) -> usize {
        let (lun, sense) = event.to_sense();
        self.channels
            .values_mut()
            .map(|ch| ch.send_aer(lun, &sense))
            .filter(|&took| took)
            .count()
    }

    /// Log out every channel of an initiator (its LUN mapping was removed).
    /// Returns how many were live.
    pub fn logout_initiator(&mut self, initiator: PortId, reason: TLogoutReason) -> usize {
        let ids = self.nexus_channels(initiator);
        for id in &ids {
            if let Some(ch) = self.channels.get_mut(id) {
                ch.logout(reason);
            }
        }
        ids.len()
    }

    /// Accept logins again after [`Target::shutdown`] or
    /// [`Target::set_enabled`]`(false)`; disabling logs nobody out.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.config.enabled = enabled;
    }

    /// Log out every channel (target shutdown) and stop accepting logins.
    pub fn shutdown(&mut self, reason: TLogoutReason) {
        self.config.enabled = false;
        for ch in self.channels.values_mut() {
            ch.logout(reason);
        }
    }
}
