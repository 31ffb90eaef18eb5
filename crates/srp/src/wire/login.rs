//! SRP_LOGIN_REQ (both the 64-byte IB CM form and the 56-byte RDMA CM
//! form), SRP_LOGIN_RSP and SRP_LOGIN_REJ (SRP r16a 6.2-6.4, SRP2 immediate
//! data flags).

use super::{check_emit, check_opcode, Error, IuType, PortId, Result, Tag};
use core::fmt;

/// Length of SRP_LOGIN_REQ over IB CM (`struct srp_login_req`).
pub const LOGIN_REQ_LEN: usize = 64;
/// Length of SRP_LOGIN_REQ after the 36-byte RDMA CM header
/// (`struct srp_login_req_rdma`: 92 - 36 bytes of CM REQ private data).
pub const LOGIN_REQ_RDMA_LEN: usize = 56;
/// Length of SRP_LOGIN_RSP (`struct srp_login_rsp`).
pub const LOGIN_RSP_LEN: usize = 52;
/// Length of SRP_LOGIN_REJ (`struct srp_login_rej`).
pub const LOGIN_REJ_LEN: usize = 32;

/// Data buffer descriptor formats an initiator asks for or a target supports
/// (REQUIRED/SUPPORTED BUFFER FORMATS, SRP r16a 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BufFormats(pub u16);

impl BufFormats {
    /// Direct data buffer descriptors (`SRP_BUF_FORMAT_DIRECT`).
    pub const DIRECT: BufFormats = BufFormats(1 << 1);
    /// Indirect data buffer descriptors (`SRP_BUF_FORMAT_INDIRECT`).
    pub const INDIRECT: BufFormats = BufFormats(1 << 2);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: BufFormats) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for BufFormats {
    type Output = BufFormats;
    fn bitor(self, rhs: BufFormats) -> BufFormats {
        BufFormats(self.0 | rhs.0)
    }
}

rdma_types::open_enum! {
    /// MULTI-CHANNEL ACTION of SRP_LOGIN_REQ (SRP r16a 6.2, bits 1:0 of the
    /// flags byte).
    pub enum MultiChannelAction(u8), "multi-channel action" {
        /// Terminate other RDMA channels of the same I_T nexus.
        Single = 0 => "single channel",
        /// Keep the other channels.
        Multi = 1 => "multiple channels",
    }
}

rdma_types::open_enum! {
    /// MULTI-CHANNEL RESULT of SRP_LOGIN_RSP (SRP r16a 6.3, bits 1:0).
    pub enum MultiChannelResult(u8), "multi-channel result" {
        /// No existing RDMA channels were associated with the I_T nexus.
        NoExisting = 0 => "no existing channels",
        /// Existing channels were terminated.
        Terminated = 1 => "existing channels terminated",
        /// Existing channels were kept.
        Maintained = 2 => "existing channels maintained",
    }
}

/// The flags byte of SRP_LOGIN_REQ (SRP r16a 6.2; bit 7 from SRP2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginReqFlags(pub u8);

impl LoginReqFlags {
    /// IMMED_REQUESTED: the initiator wants to send immediate data.
    pub const IMMED_REQUESTED: u8 = 0x80;

    /// Build from the multi-channel action and the immediate data request.
    pub fn new(action: MultiChannelAction, immediate: bool) -> LoginReqFlags {
        let imm = if immediate { Self::IMMED_REQUESTED } else { 0 };
        LoginReqFlags((u8::from(action) & 3) | imm)
    }
    /// MULTI-CHANNEL ACTION.
    pub fn multichannel(self) -> MultiChannelAction {
        MultiChannelAction::from(self.0 & 3)
    }
    /// IMMED_REQUESTED.
    pub fn immediate_requested(self) -> bool {
        self.0 & Self::IMMED_REQUESTED != 0
    }
}

/// The flags byte of SRP_LOGIN_RSP (SRP r16a 6.3; bit 7 from SRP2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginRspFlags(pub u8);

impl LoginRspFlags {
    /// IMMED_SUPP: the target accepts immediate data.
    pub const IMMED_SUPP: u8 = 0x80;

    /// Build from the multi-channel result and immediate data support.
    pub fn new(result: MultiChannelResult, immediate: bool) -> LoginRspFlags {
        let imm = if immediate { Self::IMMED_SUPP } else { 0 };
        LoginRspFlags((u8::from(result) & 3) | imm)
    }
    /// MULTI-CHANNEL RESULT.
    pub fn multichannel(self) -> MultiChannelResult {
        MultiChannelResult::from(self.0 & 3)
    }
    /// IMMED_SUPP.
    pub fn immediate_supported(self) -> bool {
        self.0 & Self::IMMED_SUPP != 0
    }
}

rdma_types::open_enum! {
    /// REASON of SRP_LOGIN_REJ (SRP r16a 6.4, `SRP_LOGIN_REJ_*`).
    pub enum LoginRejReason(u32), "unknown login reject reason" {
        /// Unable to establish the RDMA channel, no reason given.
        UnableEstablishChannel = 0x0001_0000 => "unable to establish RDMA channel, no reason specified",
        /// Target lacks resources.
        InsufficientResources = 0x0001_0001 => "insufficient RDMA channel resources",
        /// REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH too large.
        ReqItIuLengthTooLarge = 0x0001_0002 => "requested maximum initiator to target IU length too large",
        /// Cannot associate the channel with the I_T nexus.
        UnableAssociateChannel = 0x0001_0003 => "unable to associate RDMA channel with I_T nexus",
        /// None of the required buffer formats is supported.
        UnsupportedDescriptorFmt = 0x0001_0004 => "one or more requested data buffer descriptor formats not supported",
        /// Multiple channels per I_T nexus not supported.
        MultiChannelUnsupported = 0x0001_0005 => "multiple RDMA channels not supported with this I_T nexus",
        /// Channel limit reached.
        ChannelLimitReached = 0x0001_0006 => "I_T nexus RDMA channel limit reached",
    }
}

mod field {
    use core::ops::Range;
    // struct srp_login_req (IB CM form), SRP r16a 6.2.
    pub const OPCODE: Range<usize> = 0..1;
    pub const TAG: Range<usize> = 8..16;
    pub const REQ_IT_IU_LEN: Range<usize> = 16..20;
    pub const REQ_BUF_FMT: Range<usize> = 24..26;
    pub const REQ_FLAGS: Range<usize> = 26..27;
    pub const IMM_DATA_OFFSET: Range<usize> = 28..30;
    pub const INITIATOR_PORT_ID: Range<usize> = 32..48;
    pub const TARGET_PORT_ID: Range<usize> = 48..64;

    // struct srp_login_req_rdma: same values, reserved bytes dropped and the
    // fields reordered (Linux include/scsi/srp.h).
    pub const R_TAG: Range<usize> = 0..8;
    pub const R_REQ_BUF_FMT: Range<usize> = 8..10;
    pub const R_REQ_FLAGS: Range<usize> = 10..11;
    pub const R_OPCODE: Range<usize> = 11..12;
    pub const R_REQ_IT_IU_LEN: Range<usize> = 12..16;
    pub const R_INITIATOR_PORT_ID: Range<usize> = 16..32;
    pub const R_TARGET_PORT_ID: Range<usize> = 32..48;
    pub const R_IMM_DATA_OFFSET: Range<usize> = 48..50;

    // struct srp_login_rsp, SRP r16a 6.3.
    pub const REQ_LIM_DELTA: Range<usize> = 4..8;
    pub const MAX_IT_IU_LEN: Range<usize> = 16..20;
    pub const MAX_TI_IU_LEN: Range<usize> = 20..24;
    pub const BUF_FMT: Range<usize> = 24..26;
    pub const RSP_FLAGS: Range<usize> = 26..27;

    // struct srp_login_rej, SRP r16a 6.4.
    pub const REASON: Range<usize> = 4..8;
}

rdma_types::view! {
    /// View of a 64-byte SRP_LOGIN_REQ (IB CM private data).
    pub struct LoginReqPacket; len LOGIN_REQ_LEN; "SRP_LOGIN_REQ", crate::wire::need => crate::wire::Error;
    /// IU type code (0x00).
    opcode / set_opcode: u8 = field::OPCODE;
    /// Tag.
    tag / set_tag: super::Tag = field::TAG;
    /// REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH.
    req_it_iu_len / set_req_it_iu_len: u32 = field::REQ_IT_IU_LEN;
    /// REQUIRED BUFFER FORMATS.
    req_buf_fmt / set_req_buf_fmt: u16 = field::REQ_BUF_FMT;
    /// Flags (multi-channel action, IMMED_REQUESTED).
    req_flags / set_req_flags: u8 = field::REQ_FLAGS;
    /// SRP2 immediate data offset.
    imm_data_offset / set_imm_data_offset: u16 = field::IMM_DATA_OFFSET;
    /// INITIATOR PORT IDENTIFIER.
    initiator_port_id / set_initiator_port_id: super::PortId = field::INITIATOR_PORT_ID;
    /// TARGET PORT IDENTIFIER.
    target_port_id / set_target_port_id: super::PortId = field::TARGET_PORT_ID;
}

rdma_types::view! {
    /// View of a 56-byte SRP_LOGIN_REQ as carried after the RDMA CM header.
    pub struct LoginReqRdmaPacket; len LOGIN_REQ_RDMA_LEN; "SRP_LOGIN_REQ (RDMA CM)", crate::wire::need => crate::wire::Error;
    /// Tag.
    tag / set_tag: super::Tag = field::R_TAG;
    /// REQUIRED BUFFER FORMATS.
    req_buf_fmt / set_req_buf_fmt: u16 = field::R_REQ_BUF_FMT;
    /// Flags.
    req_flags / set_req_flags: u8 = field::R_REQ_FLAGS;
    /// IU type code (0x00), at byte 11 in this form.
    opcode / set_opcode: u8 = field::R_OPCODE;
    /// REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH.
    req_it_iu_len / set_req_it_iu_len: u32 = field::R_REQ_IT_IU_LEN;
    /// INITIATOR PORT IDENTIFIER.
    initiator_port_id / set_initiator_port_id: super::PortId = field::R_INITIATOR_PORT_ID;
    /// TARGET PORT IDENTIFIER.
    target_port_id / set_target_port_id: super::PortId = field::R_TARGET_PORT_ID;
    /// SRP2 immediate data offset.
    imm_data_offset / set_imm_data_offset: u16 = field::R_IMM_DATA_OFFSET;
}

rdma_types::view! {
    /// View of SRP_LOGIN_RSP.
    pub struct LoginRspPacket; len LOGIN_RSP_LEN; "SRP_LOGIN_RSP", crate::wire::need => crate::wire::Error;
    /// IU type code (0xc0).
    opcode / set_opcode: u8 = field::OPCODE;
    /// REQUEST LIMIT DELTA: the initial credit.
    req_lim_delta / set_req_lim_delta: u32 = field::REQ_LIM_DELTA;
    /// Tag of the login request.
    tag / set_tag: super::Tag = field::TAG;
    /// MAXIMUM INITIATOR TO TARGET IU LENGTH.
    max_it_iu_len / set_max_it_iu_len: u32 = field::MAX_IT_IU_LEN;
    /// MAXIMUM TARGET TO INITIATOR IU LENGTH.
    max_ti_iu_len / set_max_ti_iu_len: u32 = field::MAX_TI_IU_LEN;
    /// SUPPORTED BUFFER FORMATS.
    buf_fmt / set_buf_fmt: u16 = field::BUF_FMT;
    /// Flags (multi-channel result, IMMED_SUPP).
    rsp_flags / set_rsp_flags: u8 = field::RSP_FLAGS;
}

rdma_types::view! {
    /// View of SRP_LOGIN_REJ.
    pub struct LoginRejPacket; len LOGIN_REJ_LEN; "SRP_LOGIN_REJ", crate::wire::need => crate::wire::Error;
    /// IU type code (0xc2).
    opcode / set_opcode: u8 = field::OPCODE;
    /// REASON.
    reason / set_reason: u32 = field::REASON;
    /// Tag of the login request.
    tag / set_tag: super::Tag = field::TAG;
    /// SUPPORTED BUFFER FORMATS.
    buf_fmt / set_buf_fmt: u16 = field::BUF_FMT;
}

/// SRP_LOGIN_REQ (SRP r16a 6.2). The same values travel in two encodings:
/// 64 bytes in IB CM REQ private data ([`LoginReq::parse`]/[`LoginReq::emit`])
/// and 56 bytes after the RDMA CM header ([`LoginReq::parse_rdma`]/
/// [`LoginReq::emit_rdma`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginReq {
    /// Tag.
    pub tag: Tag,
    /// Largest IU the initiator will send.
    pub req_it_iu_len: u32,
    /// Descriptor formats the initiator will use.
    pub req_buf_fmt: BufFormats,
    /// Multi-channel action and IMMED_REQUESTED.
    pub flags: LoginReqFlags,
    /// Where immediate data starts in SRP_CMD (SRP2; 0 when not requested).
    pub imm_data_offset: u16,
    /// Initiator port identifier.
    pub initiator_port_id: PortId,
    /// Target port identifier.
    pub target_port_id: PortId,
}

impl LoginReq {
    /// Parse the 64-byte IB CM form.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`], [`Error::Truncated`].
    pub fn parse(buf: &[u8]) -> Result<LoginReq> {
        check_opcode(buf, IuType::LoginReq)?;
        let p = LoginReqPacket::new_checked(buf)?;
        Ok(LoginReq {
            tag: p.tag(),
            req_it_iu_len: p.req_it_iu_len(),
            req_buf_fmt: BufFormats(p.req_buf_fmt()),
            flags: LoginReqFlags(p.req_flags()),
            imm_data_offset: p.imm_data_offset(),
            initiator_port_id: p.initiator_port_id(),
            target_port_id: p.target_port_id(),
        })
    }

    /// Parse the 56-byte form that follows the RDMA CM header.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`] if byte 11 is not 0x00, [`Error::Truncated`].
    pub fn parse_rdma(buf: &[u8]) -> Result<LoginReq> {
        let p = LoginReqRdmaPacket::new_checked(buf)?;
        if p.opcode() != u8::from(IuType::LoginReq) {
            return Err(Error::WrongOpcode {
                expected: IuType::LoginReq,
                got: p.opcode(),
            });
        }
        Ok(LoginReq {
            tag: p.tag(),
            req_it_iu_len: p.req_it_iu_len(),
            req_buf_fmt: BufFormats(p.req_buf_fmt()),
            flags: LoginReqFlags(p.req_flags()),
            imm_data_offset: p.imm_data_offset(),
            initiator_port_id: p.initiator_port_id(),
            target_port_id: p.target_port_id(),
        })
    }

    /// Bytes [`LoginReq::emit`] writes (64).
    pub fn buffer_len(&self) -> usize {
        LOGIN_REQ_LEN
    }

    /// Write the 64-byte IB CM form.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_emit(buf, LOGIN_REQ_LEN)?;
        let buf = &mut buf[..LOGIN_REQ_LEN];
        buf.fill(0);
        let mut p = LoginReqPacket::new_unchecked(buf);
        p.set_opcode(IuType::LoginReq.into());
        p.set_tag(self.tag);
        p.set_req_it_iu_len(self.req_it_iu_len);
        p.set_req_buf_fmt(self.req_buf_fmt.0);
        p.set_req_flags(self.flags.0);
        p.set_imm_data_offset(self.imm_data_offset);
        p.set_initiator_port_id(self.initiator_port_id);
        p.set_target_port_id(self.target_port_id);
        Ok(LOGIN_REQ_LEN)
    }

    /// Write the 56-byte RDMA CM form.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`].
    pub fn emit_rdma(&self, buf: &mut [u8]) -> Result<usize> {
        check_emit(buf, LOGIN_REQ_RDMA_LEN)?;
        let buf = &mut buf[..LOGIN_REQ_RDMA_LEN];
        buf.fill(0);
        let mut p = LoginReqRdmaPacket::new_unchecked(buf);
        p.set_opcode(IuType::LoginReq.into());
        p.set_tag(self.tag);
        p.set_req_it_iu_len(self.req_it_iu_len);
        p.set_req_buf_fmt(self.req_buf_fmt.0);
        p.set_req_flags(self.flags.0);
        p.set_imm_data_offset(self.imm_data_offset);
        p.set_initiator_port_id(self.initiator_port_id);
        p.set_target_port_id(self.target_port_id);
        Ok(LOGIN_REQ_RDMA_LEN)
    }
}

/// SRP_LOGIN_RSP (SRP r16a 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRsp {
    /// Initial request limit (credits).
    pub req_lim_delta: u32,
    /// Tag of the login request.
    pub tag: Tag,
    /// Largest IU the target accepts.
    pub max_it_iu_len: u32,
    /// Largest IU the target will send.
    pub max_ti_iu_len: u32,
    /// Descriptor formats the target supports.
    pub buf_fmt: BufFormats,
    /// Multi-channel result and IMMED_SUPP.
    pub flags: LoginRspFlags,
}

impl LoginRsp {
    /// Parse; bytes past the 52 (CM REP private data padding) are ignored.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`], [`Error::Truncated`].
    pub fn parse(buf: &[u8]) -> Result<LoginRsp> {
        check_opcode(buf, IuType::LoginRsp)?;
        let p = LoginRspPacket::new_checked(buf)?;
        Ok(LoginRsp {
            req_lim_delta: p.req_lim_delta(),
            tag: p.tag(),
            max_it_iu_len: p.max_it_iu_len(),
            max_ti_iu_len: p.max_ti_iu_len(),
            buf_fmt: BufFormats(p.buf_fmt()),
            flags: LoginRspFlags(p.rsp_flags()),
        })
    }

    /// Bytes [`LoginRsp::emit`] writes (52).
    pub fn buffer_len(&self) -> usize {
        LOGIN_RSP_LEN
    }

    /// Write the IU.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_emit(buf, LOGIN_RSP_LEN)?;
        let buf = &mut buf[..LOGIN_RSP_LEN];
        buf.fill(0);
        let mut p = LoginRspPacket::new_unchecked(buf);
        p.set_opcode(IuType::LoginRsp.into());
        p.set_req_lim_delta(self.req_lim_delta);
        p.set_tag(self.tag);
        p.set_max_it_iu_len(self.max_it_iu_len);
        p.set_max_ti_iu_len(self.max_ti_iu_len);
        p.set_buf_fmt(self.buf_fmt.0);
        p.set_rsp_flags(self.flags.0);
        Ok(LOGIN_RSP_LEN)
    }
}

/// SRP_LOGIN_REJ (SRP r16a 6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRej {
    /// Why the login was rejected.
    pub reason: LoginRejReason,
    /// Tag of the login request.
    pub tag: Tag,
    /// Descriptor formats the target supports.
    pub buf_fmt: BufFormats,
}

impl LoginRej {
    /// Parse; bytes past the 32 are ignored.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`], [`Error::Truncated`].
    pub fn parse(buf: &[u8]) -> Result<LoginRej> {
        check_opcode(buf, IuType::LoginRej)?;
        let p = LoginRejPacket::new_checked(buf)?;
        Ok(LoginRej {
            reason: p.reason().into(),
            tag: p.tag(),
            buf_fmt: BufFormats(p.buf_fmt()),
        })
    }

    /// Bytes [`LoginRej::emit`] writes (32).
    pub fn buffer_len(&self) -> usize {
        LOGIN_REJ_LEN
    }

    /// Write the IU.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_emit(buf, LOGIN_REJ_LEN)?;
        let buf = &mut buf[..LOGIN_REJ_LEN];
        buf.fill(0);
        let mut p = LoginRejPacket::new_unchecked(buf);
        p.set_opcode(IuType::LoginRej.into());
        p.set_reason(self.reason.into());
        p.set_tag(self.tag);
        p.set_buf_fmt(self.buf_fmt.0);
        Ok(LOGIN_REJ_LEN)
    }
}

impl fmt::Display for LoginRej {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SRP login rejected: {}", self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 56-byte SRP_LOGIN_REQ of frame 1 of
    /// `linux-ib_srp-to-lio-srpt-over-rxe.pcapng` (CM REQ private data after
    /// the 36-byte RDMA CM header), as Linux ib_srp sent it.
    const CAPTURED_LOGIN_REQ_RDMA: [u8; 56] = [
        0, 0, 0, 0, 0, 0, 0, 0, // tag 0
        0x00, 0x06, // req_buf_fmt: DIRECT | INDIRECT
        0x80, // req_flags: IMMED_REQUESTED, single channel
        0x00, // opcode SRP_LOGIN_REQ
        0x00, 0x00, 0x20, 0x44, // req_it_iu_len 8260
        0, 0, 0, 0, 0, 0, 0, 0, // initiator port id: id_ext 0
        0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x03, // ... port GUID
        0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02, // target port id: id_ext
        0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02, // ... ioc GUID
        0x00, 0x44, // imm_data_offset 68
        0, 0, 0, 0, 0, 0, // reserved
    ];

    fn captured_req() -> LoginReq {
        let mut ini = [0u8; 16];
        ini[8..].copy_from_slice(&[0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x03]);
        let mut tgt = [0u8; 16];
        tgt[..8].copy_from_slice(&[0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02]);
        tgt[8..].copy_from_slice(&[0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02]);
        LoginReq {
            tag: Tag(0),
            req_it_iu_len: 8260,
            req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
            flags: LoginReqFlags::new(MultiChannelAction::Single, true),
            imm_data_offset: 68,
            initiator_port_id: PortId(ini),
            target_port_id: PortId(tgt),
        }
    }

    #[test]
    fn login_req_rdma_form_from_capture() {
        let r = LoginReq::parse_rdma(&CAPTURED_LOGIN_REQ_RDMA).unwrap();
        assert_eq!(r, captured_req());
        assert!(r.flags.immediate_requested());
        assert_eq!(r.flags.multichannel(), MultiChannelAction::Single);
        let mut out = [0xaa; 56];
        assert_eq!(r.emit_rdma(&mut out), Ok(56));
        assert_eq!(out, CAPTURED_LOGIN_REQ_RDMA);
    }

    #[test]
    fn login_req_ib_form_moves_every_field() {
        let expected: [u8; 64] = [
            0x00, // opcode
            0, 0, 0, 0, 0, 0, 0, // reserved
            0, 0, 0, 0, 0, 0, 0, 0, // tag 0
            0x00, 0x00, 0x20, 0x44, // req_it_iu_len 8260
            0, 0, 0, 0, // reserved
            0x00, 0x06, // req_buf_fmt
            0x80, // req_flags
            0,    // reserved
            0x00, 0x44, // imm_data_offset 68
            0, 0, // reserved
            0, 0, 0, 0, 0, 0, 0, 0, // initiator id_ext
            0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x03, // initiator GUID
            0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02, // target id_ext
            0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x02, // target GUID
        ];
        let mut out = [0xaa; 64];
        assert_eq!(captured_req().emit(&mut out), Ok(64));
        assert_eq!(out, expected);
        assert_eq!(LoginReq::parse(&expected), Ok(captured_req()));
        // The RDMA form's opcode sits at byte 11; the IB parser must not accept it.
        let mut bad = expected;
        bad[0] = 0xc0;
        assert!(matches!(
            LoginReq::parse(&bad),
            Err(Error::WrongOpcode { .. })
        ));
    }

    #[test]
    fn login_rsp_from_capture() {
        // Frame 2 of the capture: first 52 bytes of the CM REP private data (LIO ib_srpt).
        let bytes: [u8; 52] = [
            0xc0, // opcode SRP_LOGIN_RSP
            0, 0, 0, // reserved
            0x00, 0x00, 0x00, 0x80, // req_lim_delta 128
            0, 0, 0, 0, 0, 0, 0, 0, // tag 0
            0x00, 0x00, 0x20, 0x54, // max_it_iu_len 8276
            0x00, 0x00, 0x20, 0x44, // max_ti_iu_len 8260
            0x00, 0x06, // buf_fmt DIRECT | INDIRECT
            0x80, // rsp_flags: IMMED_SUPP, no existing channel
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved (25 bytes)
        ];
        let r = LoginRsp::parse(&bytes).unwrap();
        assert_eq!(r.req_lim_delta, 128);
        assert_eq!(r.max_it_iu_len, 8276);
        assert_eq!(r.max_ti_iu_len, 8260);
        assert!(r
            .buf_fmt
            .contains(BufFormats::DIRECT | BufFormats::INDIRECT));
        assert!(r.flags.immediate_supported());
        assert_eq!(r.flags.multichannel(), MultiChannelResult::NoExisting);
        let mut out = [0xaa; 52];
        assert_eq!(r.emit(&mut out), Ok(52));
        assert_eq!(out, bytes);
    }

    #[test]
    fn login_rej_every_reason_in_words() {
        let bytes: [u8; 32] = [
            0xc2, // opcode SRP_LOGIN_REJ
            0, 0, 0, // reserved
            0x00, 0x01, 0x00, 0x02, // reason: IT IU length too large
            7, 0, 0, 0, 0, 0, 0, 0, // tag 7
            0, 0, 0, 0, 0, 0, 0, 0, // reserved
            0x00, 0x02, // buf_fmt DIRECT
            0, 0, 0, 0, 0, 0, // reserved
        ];
        let r = LoginRej::parse(&bytes).unwrap();
        assert_eq!(r.reason, LoginRejReason::ReqItIuLengthTooLarge);
        assert_eq!(r.tag, Tag(7));
        assert_eq!(
            r.to_string(),
            "SRP login rejected: requested maximum initiator to target IU length too large"
        );
        let mut out = [0xaa; 32];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        for v in 0x0001_0000..=0x0001_0006u32 {
            let reason = LoginRejReason::from(v);
            assert!(!matches!(reason, LoginRejReason::Unknown(_)));
            assert_eq!(u32::from(reason), v);
        }
        assert_eq!(
            LoginRejReason::from(0x0001_0007).to_string(),
            "unknown login reject reason 0x10007"
        );
    }

    #[test]
    fn short_buffers_are_errors() {
        assert!(matches!(
            LoginReq::parse_rdma(&CAPTURED_LOGIN_REQ_RDMA[..55]),
            Err(Error::Truncated {
                need: 56,
                got: 55,
                ..
            })
        ));
        assert!(matches!(
            captured_req().emit(&mut [0u8; 63]),
            Err(Error::BufferTooShort { need: 64, have: 63 })
        ));
        assert!(LoginRsp::parse(&[0xc0; 51]).is_err());
    }
}
