//! Channel configuration and the login request built from it (Linux
//! `ib_srp` `srp_send_req`, `srp_max_it_iu_len`).

use crate::wire::{
    BufFormats, LoginReq, LoginReqFlags, MultiChannelAction, PortId, Tag, CMD_FIXED_LEN,
    DIRECT_BUF_LEN, INDIRECT_BUF_HEADER_LEN, LINUX_IMM_DATA_OFFSET,
};
use rdma_types::{Duration, Guid};

/// Additional CDB bytes ib_srp makes room for (`SRP_MAX_ADD_CDB_LEN`): a
/// 32-byte CDB fits every IU.
pub const MAX_ADD_CDB_LEN: usize = 16;
/// Credits kept back for task management (`SRP_TSK_MGMT_SQ_SIZE`): an
/// SRP_CMD may not take the last one, an SRP_TSK_MGMT may.
pub const TSK_MGMT_RESERVE: i64 = 1;
/// How long ib_srp waits for a task management response
/// (`SRP_ABORT_TIMEOUT_MS`).
pub const DEFAULT_TMF_TIMEOUT: Duration = Duration::from_secs(5);
/// The SCSI disk driver's default command timeout.
pub const DEFAULT_CMD_TIMEOUT: Duration = Duration::from_secs(30);

/// What one RDMA channel of an SRP initiator port asks for at login and how
/// it behaves afterwards. Field names follow the ib_srp login string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelConfig {
    /// `initiator_ext`: first half of the initiator port identifier.
    pub initiator_ext: u64,
    /// GUID of the local port (the interface ID of its GID).
    pub port_guid: Guid,
    /// `id_ext`: first half of the target port identifier.
    pub id_ext: u64,
    /// `ioc_guid`: second half of the target port identifier.
    pub ioc_guid: Guid,
    /// The target reported the I/O class of SRP revision 10
    /// (`SRP_REV10_IB_IO_CLASS`): both port identifiers carry the GUID first.
    pub io_class_rev10: bool,
    /// `max_it_iu_size`: upper bound on the IU length requested (0: none).
    pub max_it_iu_size: u32,
    /// `cmd_sg_entries`: descriptors an SRP_CMD carries in the IU (1..=255).
    pub cmd_sg_entries: u8,
    /// `allow_ext_sg`: longer lists go to an external table the target
    /// fetches by RDMA READ.
    pub allow_ext_sg: bool,
    /// Ask for immediate data (ib_srp module parameter `use_imm_data`).
    pub want_immediate: bool,
    /// Largest immediate data payload (ib_srp `max_imm_data`, 8 KiB).
    pub max_imm_data: u32,
    /// Commands outstanding at once (`queue_size` of the login string, the
    /// SCSI host's `can_queue`). The send queue holds two more: one task
    /// management request and one answer to a target request.
    pub can_queue: u16,
    /// Index of this channel among the target's channels: channel 0 logs in
    /// with multi-channel action SINGLE, every other one with MULTI.
    pub channel_index: u16,
    /// Command timeout when a [`Command`](super::Command) gives none.
    pub cmd_timeout: Duration,
    /// How long a task management request may take before it counts as
    /// failed and the error handler escalates.
    pub tmf_timeout: Duration,
}

impl ChannelConfig {
    /// A configuration with ib_srp's defaults (12 descriptors in the IU, no
    /// external tables, immediate data wanted up to 8 KiB, 62 commands).
    pub fn new(initiator_ext: u64, port_guid: Guid, id_ext: u64, ioc_guid: Guid) -> Self {
        ChannelConfig {
            initiator_ext,
            port_guid,
            id_ext,
            ioc_guid,
            io_class_rev10: false,
            max_it_iu_size: 0,
            cmd_sg_entries: 12,
            allow_ext_sg: false,
            want_immediate: true,
            max_imm_data: 8 * 1024,
            can_queue: 62,
            channel_index: 0,
            cmd_timeout: DEFAULT_CMD_TIMEOUT,
            tmf_timeout: DEFAULT_TMF_TIMEOUT,
        }
    }

    /// Check the values a channel cannot work with.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cmd_sg_entries == 0 {
            return Err(ConfigError::CmdSgEntries);
        }
        if self.can_queue == 0 {
            return Err(ConfigError::CanQueue);
        }
        if self.cmd_timeout == Duration::ZERO || self.tmf_timeout == Duration::ZERO {
            return Err(ConfigError::Timeout);
        }
        if self.max_it_iu_size != 0 && (self.max_it_iu_size as usize) < MIN_IT_IU_LEN {
            return Err(ConfigError::MaxItIuSize(self.max_it_iu_size));
        }
        Ok(())
    }

    /// The initiator port identifier as ib_srp builds it: `initiator_ext`
    /// then the port GUID, both big-endian (swapped for revision 10 targets).
    pub fn initiator_port_id(&self) -> PortId {
        port_id(self.initiator_ext, self.port_guid.0, self.io_class_rev10)
    }

    /// The target port identifier: `id_ext` then `ioc_guid` (swapped for
    /// revision 10 targets).
    pub fn target_port_id(&self) -> PortId {
        port_id(self.id_ext, self.ioc_guid.0, self.io_class_rev10)
    }

    /// The multi-channel action of this channel's login.
    pub fn multichannel_action(&self) -> MultiChannelAction {
        if self.channel_index == 0 {
            MultiChannelAction::Single
        } else {
            MultiChannelAction::Multi
        }
    }

    /// The longest IU this channel sends (`srp_max_it_iu_len`): SRP_CMD with
    /// 16 additional CDB bytes and `cmd_sg_entries` indirect descriptors,
    /// or the immediate data area if larger, capped by `max_it_iu_size`.
    pub fn max_it_iu_len(&self, immediate: bool) -> u32 {
        let mut len = (CMD_FIXED_LEN
            + MAX_ADD_CDB_LEN
            + INDIRECT_BUF_HEADER_LEN
            + usize::from(self.cmd_sg_entries) * DIRECT_BUF_LEN) as u32;
        if immediate {
            len = len.max(u32::from(LINUX_IMM_DATA_OFFSET).saturating_add(self.max_imm_data));
        }
        if self.max_it_iu_size != 0 {
            len = len.min(self.max_it_iu_size);
        }
        len
    }

    /// The SRP_LOGIN_REQ for this channel (tag 0, as ib_srp sends it). Emit
    /// it with [`LoginReq::emit`] for IB CM or [`LoginReq::emit_rdma`] for
    /// RDMA CM.
    pub fn login_req(&self) -> LoginReq {
        LoginReq {
            tag: Tag(0),
            req_it_iu_len: self.max_it_iu_len(self.want_immediate),
            req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
            flags: LoginReqFlags::new(self.multichannel_action(), self.want_immediate),
            imm_data_offset: if self.want_immediate {
                LINUX_IMM_DATA_OFFSET
            } else {
                0
            },
            initiator_port_id: self.initiator_port_id(),
            target_port_id: self.target_port_id(),
        }
    }
}

/// The shortest IU length a channel can work with: SRP_CMD and one direct
/// descriptor.
pub const MIN_IT_IU_LEN: usize = CMD_FIXED_LEN + DIRECT_BUF_LEN;

fn port_id(ext: u64, guid: u64, rev10: bool) -> PortId {
    let (a, b) = if rev10 { (guid, ext) } else { (ext, guid) };
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&a.to_be_bytes());
    id[8..].copy_from_slice(&b.to_be_bytes());
    PortId(id)
}

/// A configuration value a channel cannot work with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `cmd_sg_entries` is 0.
    #[error("cmd_sg_entries must be 1..=255")]
    CmdSgEntries,
    /// `can_queue` is 0.
    #[error("can_queue (queue_size) must be at least 1")]
    CanQueue,
    /// A zero timeout.
    #[error("command and task management timeouts must be non-zero")]
    Timeout,
    /// `max_it_iu_size` below what one SRP_CMD needs.
    #[error(
        "max_it_iu_size {0} is below the {MIN_IT_IU_LEN} bytes of an SRP_CMD with one descriptor"
    )]
    MaxItIuSize(u32),
}
