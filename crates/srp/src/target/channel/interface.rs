//! What a [`Channel`] takes and gives: command and operation handles, the
//! RDMA operations it asks for, SCSI requests and results, task management,
//! its outputs, state and counters.

use super::*;

/// Handle of one SRP_CMD or SRP_TSK_MGMT inside its channel; names the
/// command's data buffers in every output. Never reused by a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmdId(pub u64);

/// Handle of one RDMA work request; echoed in its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

// Both are issued in sequence by the channel.
impl rdma_types::RingId for CmdId {
    fn ring_index(self) -> u64 {
        self.0
    }
}

impl rdma_types::RingId for OpId {
    fn ring_index(self) -> u64 {
        self.0
    }
}

/// Where the local side of an RDMA op lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Bytes `offset..offset + len` of the command's data-out buffer
    /// (RDMA READ destination).
    DataOut {
        /// Offset in the buffer.
        offset: u64,
    },
    /// Bytes `offset..offset + len` of the command's data-in buffer (RDMA
    /// WRITE source).
    DataIn {
        /// Offset in the buffer.
        offset: u64,
    },
    /// A scratch buffer for an external indirect descriptor table; hand the
    /// bytes back with [`Channel::handle_table_read`].
    Table {
        /// The table of the data-in descriptor (else data-out).
        data_in: bool,
    },
}

/// An RDMA READ or WRITE to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOp {
    /// Echo in the completion.
    pub id: OpId,
    /// The command whose buffer is the local side.
    pub cmd: CmdId,
    /// Initiator virtual address.
    pub remote_va: u64,
    /// Initiator memory key.
    pub rkey: Rkey,
    /// Bytes, at most `srp_max_rdma_size`.
    pub len: u32,
    /// Local side.
    pub local: Local,
}

/// The data-out bytes of a SCSI command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataOut {
    /// No data-out.
    None,
    /// SRP2 immediate data copied from the IU.
    Immediate(Vec<u8>),
    /// `len` bytes already fetched into the command's data-out buffer.
    InBuffer {
        /// Bytes.
        len: u32,
    },
}

/// A SCSI command for the SCSI core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiRequest {
    /// Answer with [`Channel::handle_scsi_done`] naming this.
    pub cmd: CmdId,
    /// SRP tag (the SCSI task tag).
    pub tag: Tag,
    /// LUN field.
    pub lun: Lun,
    /// CDB (16 bytes or more).
    pub cdb: Cdb,
    /// Task attribute.
    pub attr: TaskAttr,
    /// Data-out.
    pub data_out: DataOut,
    /// Bytes the data-in descriptors can take; the core writes at most this
    /// many into the command's data-in buffer.
    pub data_in_len: u32,
}

/// A CDB: 16 bytes held inline, longer ones (an additional CDB) on the
/// heap.
pub type Cdb = smallvec::SmallVec<[u8; 16]>;

/// The SCSI core's answer to a [`ScsiRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiDone {
    /// The command.
    pub cmd: CmdId,
    /// SCSI status (SAM-5 5.3).
    pub status: u8,
    /// Sense data (empty for none); cut to fit `srp_max_rsp_size`.
    pub sense: Vec<u8>,
    /// Data-in bytes the core put in the data-in buffer.
    pub data_in_len: u32,
    /// Data-in length the CDB asked for, when it differs from what was
    /// produced (a larger value gives DIOVER); `None`: `data_in_len`.
    pub wanted_in: Option<u32>,
    /// Data-out length the CDB asked for; `None`: all data-out was used.
    pub wanted_out: Option<u32>,
    /// The task was aborted (task management or [`Output::Abort`]): no
    /// response is sent (SAM-5, TAS = 0).
    pub aborted: bool,
}

impl ScsiDone {
    /// GOOD status with `data_in_len` bytes of data-in.
    pub fn good(cmd: CmdId, data_in_len: u32) -> ScsiDone {
        ScsiDone {
            cmd,
            status: sense::GOOD,
            sense: Vec::new(),
            data_in_len,
            wanted_in: None,
            wanted_out: None,
            aborted: false,
        }
    }
}

/// A task management function for the SCSI core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmfRequest {
    /// Answer with [`Channel::handle_tmf_done`] naming this.
    pub cmd: CmdId,
    /// Tag of the SRP_TSK_MGMT.
    pub tag: Tag,
    /// LUN.
    pub lun: Lun,
    /// Function.
    pub func: TmFunc,
    /// TASK TAG (ABORT TASK).
    pub task_tag: Tag,
    /// The channel's handle of that task when it is with the core.
    pub task: Option<CmdId>,
}

/// What the channel asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Post a SEND of `bytes` (solicited event bit as given); report its
    /// completion with [`Channel::handle_send_done`].
    Send {
        /// The IU.
        bytes: crate::wire::IuBytes,
        /// Set the solicited event bit (the initiator asked, SRP r16a 6.9).
        solicited: bool,
    },
    /// Post an RDMA READ; report with [`Channel::handle_rdma_done`] (or
    /// [`Channel::handle_table_read`] for a `Local::Table` op).
    RdmaRead(RdmaOp),
    /// Post an RDMA WRITE; report with [`Channel::handle_rdma_done`].
    RdmaWrite(RdmaOp),
    /// Give a command to the SCSI core.
    Scsi(ScsiRequest),
    /// Give a task management function to the SCSI core.
    Tmf(TmfRequest),
    /// Tell the SCSI core to drop a command or TMF it holds (the channel is
    /// going away); its later completion is ignored.
    Abort(CmdId),
    /// No output will name this command's buffers again: free them.
    Release(CmdId),
    /// Close the connection (after every earlier work request completed).
    Disconnect,
}

/// Channel life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelState {
    /// Accepting IUs.
    Live,
    /// Logging out: waiting for posted work requests to complete.
    Closing,
    /// Disconnect emitted or connection lost.
    Closed,
}

/// Counters, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelStats {
    /// SRP_CMDs accepted within the credit window.
    pub cmds: u64,
    /// SRP_TSK_MGMTs accepted within the credit window.
    pub tmfs: u64,
    /// IUs beyond the credit window (answered TASK SET FULL / FAILED).
    pub over_limit: u64,
    /// Malformed SRP_CMDs answered with CHECK CONDITION.
    pub bad_cmds: u64,
    /// SRP_CRED_REQs sent.
    pub cred_reqs: u64,
    /// SRP_AER_REQs sent.
    pub aers_sent: u64,
    /// AERs dropped because the backlog was full.
    pub aers_dropped: u64,
    /// Why the target logged the channel out, if it did.
    pub logout_reason: Option<TLogoutReason>,
    /// The initiator logged out (SRP_I_LOGOUT).
    pub initiator_logout: bool,
}
