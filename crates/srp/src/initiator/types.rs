//! Values that cross the channel's API: commands in, completions, outputs
//! and events out, and the errors of each operation.

use crate::wire::{
    self, BufFormats, DirectBuf, IuType, LoginRejReason, Lun, MultiChannelResult, RspCode,
    TLogoutReason, Tag, TaskAttr, TmFunc,
};
use rdma_types::Duration;

/// One registered memory region of a command's data buffer, as the target
/// will address it: virtual address, R_Key and length. The driver registers
/// the memory (per I/O or from a pre-registered pool) before
/// [`Channel::submit`](super::Channel::submit) and may release it once the
/// command's [`Completion`] has been polled.
pub type Segment = DirectBuf;

/// The data of one SCSI command. ib_srp refuses bidirectional commands, and
/// so does this channel.
/// It borrows the caller's segments and bytes: the channel encodes the
/// command into its IU within [`Channel::submit`](super::Channel::submit)
/// and keeps none of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Data<'a> {
    /// No data transfer.
    #[default]
    None,
    /// Data-in: the target RDMA WRITEs into these segments, in order.
    In(&'a [Segment]),
    /// Data-out: the target RDMA READs these segments, in order.
    Out(&'a [Segment]),
    /// Data-out carried inside the SRP_CMD (SRP2 immediate data); only when
    /// [`Channel::immediate_capacity`](super::Channel::immediate_capacity)
    /// says it fits.
    Immediate(&'a [u8]),
}

/// A SCSI command for [`Channel::submit`](super::Channel::submit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command<'a> {
    /// Logical unit.
    pub lun: Lun,
    /// The CDB (at most 16 + 252 bytes; 32 with immediate data).
    pub cdb: &'a [u8],
    /// Task attribute.
    pub attr: TaskAttr,
    /// Data buffer.
    pub data: Data<'a>,
    /// Timeout; `None` takes the channel's `cmd_timeout`.
    pub timeout: Option<Duration>,
    /// Registered memory where the full descriptor table may be written,
    /// needed only when the segments exceed `cmd_sg_entries` and
    /// `allow_ext_sg` is set (ib_srp's per-request `indirect_desc` buffer).
    /// Its `len` is the capacity in bytes. When given, its address and key
    /// also fill the table descriptor of an in-IU indirect list, as ib_srp
    /// does.
    pub desc_table: Option<DirectBuf>,
    /// [`Data::Immediate`]'s bytes are left out of the SEND the channel
    /// hands out: its [`Transmit::bytes`] end where they go, and the
    /// driver writes them after, from its own copy, into the SEND's
    /// buffer ([`Transmit::follows`] says how many). A driver that
    /// copies the IU into registered memory anyway saves a copy of the
    /// data.
    pub immediate_follows: bool,
}

impl<'a> Command<'a> {
    /// A command with SIMPLE task attribute, the default timeout and no
    /// descriptor table.
    pub fn new(lun: Lun, cdb: &'a [u8], data: Data<'a>) -> Command<'a> {
        Command {
            lun,
            cdb,
            attr: TaskAttr::Simple,
            data,
            timeout: None,
            desc_table: None,
            immediate_follows: false,
        }
    }
}

/// Identifies one SEND handed out in [`Output::Send`], for
/// [`Channel::handle_send_done`](super::Channel::handle_send_done).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SendId(pub u64);

// Issued in sequence by the channel.
impl rdma_types::RingId for SendId {
    fn ring_index(self) -> u64 {
        self.0
    }
}

/// An IU to post as one RC SEND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Give this to `handle_send_done` when the send completes.
    pub id: SendId,
    /// What the IU is.
    pub iu: IuType,
    /// Its tag (for SRP_CRED_RSP/SRP_AER_RSP the target's tag echoed).
    pub tag: Tag,
    /// The IU bytes.
    pub bytes: Vec<u8>,
    /// For an SRP_CMD with an external descriptor table: the full table,
    /// to be written at the command's `desc_table` address before the SEND
    /// is posted (the target fetches it by RDMA READ).
    pub ext_table: Option<Vec<u8>>,
    /// Bytes of immediate data that follow `bytes` in the SEND, written
    /// there by the driver (a command submitted with
    /// [`Command::immediate_follows`]); 0 when `bytes` is the whole IU.
    pub follows: usize,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Post this SEND.
    Send(Transmit),
    /// Host reset: the error handler gave up on task management. Tear the
    /// connection down, call [`Channel::disconnected`](super::Channel::disconnected)
    /// once the QP is drained, then log in again.
    Reconnect,
}

/// A residual count of one direction (SRP r16a 6.9 DxOVER/DxUNDER).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    /// Fewer bytes moved than the buffer holds.
    Under(u32),
    /// The target had more bytes than the buffer holds.
    Over(u32),
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The target answered with this SCSI status (SAM-5); device errors
    /// such as CHECK CONDITION come up here with their sense, unretried.
    Scsi(u8),
    /// Aborted by ABORT TASK after a timeout (Linux `DID_ABORT`).
    Aborted,
    /// Ended by a LOGICAL UNIT RESET or a host reset (Linux `DID_RESET`):
    /// the SCSI layer may retry it.
    Reset,
    /// The channel went away and the command was not held (Linux
    /// `DID_TRANSPORT_FAILFAST`).
    TransportFailed,
}

/// A finished command, in the order results arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The tag `submit` returned.
    pub tag: Tag,
    /// The outcome.
    pub status: Status,
    /// Sense data as the target sent it (empty when none).
    pub sense: Vec<u8>,
    /// The response code, if the target sent response data (SRP r16a
    /// table 24; normally absent for SRP_CMD).
    pub response_code: Option<RspCode>,
    /// Data-in residual.
    pub data_in_residual: Option<Residual>,
    /// Data-out residual.
    pub data_out_residual: Option<Residual>,
}

impl Completion {
    pub(crate) fn ended(tag: Tag, status: Status) -> Completion {
        Completion {
            tag,
            status,
            sense: Vec::new(),
            response_code: None,
            data_in_residual: None,
            data_out_residual: None,
        }
    }
}

/// Why a task management request did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TmfFailure {
    /// The target answered with a response code other than complete
    /// (`None`: no response data).
    #[error("target answered {}", .0.map_or("without response data".to_string(), |c| c.to_string()))]
    Response(Option<RspCode>),
    /// No answer within the task management timeout.
    #[error("no answer in time")]
    Timeout,
    /// No credit left even for task management (as ib_srp, a failure).
    #[error("no credit to send it")]
    NoCredit,
}

/// Something the driver or its log should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A command passed its timeout; the error handler takes over.
    TimedOut {
        /// The command.
        tag: Tag,
    },
    /// A task management request was sent.
    TaskMgmtSent {
        /// Function.
        func: TmFunc,
        /// Logical unit.
        lun: Lun,
        /// The task aborted (ABORT TASK), otherwise the request's own tag.
        task_tag: Tag,
    },
    /// A task management request ended.
    TaskMgmtDone {
        /// Function.
        func: TmFunc,
        /// Logical unit.
        lun: Lun,
        /// Success, or why not.
        result: Result<(), TmfFailure>,
    },
    /// SRP_AER_REQ: an asynchronous event for a logical unit (already
    /// answered with SRP_AER_RSP).
    Aer {
        /// Logical unit.
        lun: Lun,
        /// Sense data describing the event.
        sense: Vec<u8>,
    },
    /// SRP_T_LOGOUT: the target closed the channel; no new commands.
    TargetLogout(TLogoutReason),
    /// A received IU that does not fit the protocol state; dropped.
    Protocol(ProtocolError),
}

/// A received IU the channel dropped (seed 2.3.9.2: reported upward).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// It did not parse.
    #[error("malformed IU: {0}")]
    Malformed(wire::Error),
    /// An IU type a target does not send on an established channel.
    #[error("unexpected {0} from the target")]
    Unexpected(IuType),
    /// An SRP_RSP whose tag names no outstanding request: a late answer
    /// to an aborted or reset command, a duplicate, or garbage.
    #[error("SRP_RSP for tag {0} which is not outstanding")]
    UnknownTag(Tag),
    /// More target requests waiting for a send slot than the queue holds.
    #[error("target requests arrive faster than sends complete; SRP_{0} dropped")]
    AnswerOverflow(IuType),
}

/// What a successful login agreed (SRP r16a 6.3 plus ib_srp's own limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Initial credits (REQUEST LIMIT DELTA of the response).
    pub req_lim: u32,
    /// Longest IU this channel will send: ib_srp's own limit, lowered to
    /// the target's if that is smaller.
    pub max_it_iu_len: u32,
    /// Longest IU the target will send (receive buffers must hold it).
    pub max_ti_iu_len: u32,
    /// Immediate data offset when both sides agreed to immediate data.
    pub imm_data_offset: Option<u16>,
    /// Multi-channel result.
    pub multichannel: MultiChannelResult,
    /// Descriptor formats the target supports.
    pub buf_fmt: BufFormats,
    /// Commands that may be outstanding: `can_queue`, lowered to the
    /// initial credits minus the task management reserve (ib_srp).
    pub can_queue: u32,
}

/// Why a login did not establish the channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginFailure {
    /// The target sent SRP_LOGIN_REJ.
    #[error("SRP login rejected: {reason}{}", detail(*.reason, *.req_it_iu_len))]
    Rejected {
        /// The decoded reason.
        reason: LoginRejReason,
        /// What this channel asked for, quoted when the reason is the IU length.
        req_it_iu_len: u32,
        /// Formats the target supports.
        buf_fmt: BufFormats,
    },
    /// The private data did not parse.
    #[error("SRP login response malformed: {0}")]
    Malformed(wire::Error),
    /// The private data held another IU.
    #[error("SRP login answered with {0}")]
    Unexpected(IuType),
    /// The target accepts IUs too short for an SRP_CMD.
    #[error("SRP login: target accepts IUs of at most {0} bytes, an SRP_CMD needs {min}", min = super::config::MIN_IT_IU_LEN)]
    ItIuTooSmall(u32),
    /// No login was outstanding.
    #[error("no SRP login is outstanding")]
    NotWaiting,
}

fn detail(reason: LoginRejReason, req: u32) -> String {
    match reason {
        LoginRejReason::ReqItIuLengthTooLarge => format!(" (requested {req})"),
        _ => String::new(),
    }
}

/// Why `login_request` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// A login is outstanding or the channel is logged in.
    #[error("channel is {0}; log in only when disconnected")]
    Busy(&'static str),
}

/// Why `submit` refused a command; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Not logged in (or logged out, or resetting): hold the command.
    #[error("SRP channel not logged in")]
    NotLoggedIn,
    /// A LUN reset is in progress (the SCSI error handler holds the host):
    /// retry after its [`Event::TaskMgmtDone`].
    #[error("SRP channel is resetting a logical unit")]
    Recovering,
    /// No credit (the last one is kept for task management): retry after
    /// a response or SRP_CRED_REQ.
    #[error("no SRP credit left for a command")]
    NoCredit,
    /// `can_queue` commands are outstanding.
    #[error("{0} commands outstanding, the queue is full")]
    QueueFull(u32),
    /// More segments than `cmd_sg_entries` and external tables not allowed.
    #[error("{segments} segments do not fit the {max} descriptors of an SRP_CMD and allow_ext_sg is off")]
    TooManySegments {
        /// Segments given.
        segments: usize,
        /// `cmd_sg_entries`.
        max: u8,
    },
    /// An external table is needed but `desc_table` is missing or smaller
    /// than this many bytes.
    #[error("an external descriptor table of {0} bytes is needed")]
    NeedTable(usize),
    /// The target does not support indirect descriptors.
    #[error("target does not support indirect data buffer descriptors")]
    IndirectUnsupported,
    /// A data direction with no segments.
    #[error("data direction given without segments")]
    EmptyData,
    /// More than 4 GiB of data.
    #[error("data length {0} exceeds 32 bits")]
    DataTooLong(u64),
    /// Immediate data without it being negotiated.
    #[error("immediate data was not negotiated")]
    ImmediateNotNegotiated,
    /// Immediate data longer than the IU can carry.
    #[error("{len} bytes of immediate data exceed the {max} that fit")]
    ImmediateTooLarge {
        /// Bytes given.
        len: usize,
        /// Bytes that fit.
        max: u32,
    },
    /// The SRP_CMD would exceed the negotiated IU length.
    #[error("SRP_CMD of {len} bytes exceeds max_it_iu_len {max}")]
    IuTooLong {
        /// IU length.
        len: usize,
        /// Negotiated maximum.
        max: u32,
    },
    /// The IU could not be encoded (CDB too long, CDB overlapping the
    /// immediate data).
    #[error("SRP_CMD cannot be encoded: {0}")]
    Encode(wire::Error),
}
