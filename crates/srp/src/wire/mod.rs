//! SRP information units (SRP r16a chapter 6, SRP2 immediate data).
//!
//! Each IU has a view (`XxxPacket<T: AsRef<[u8]>>`, fields read and written
//! in place, `new_checked` for untrusted input) and a repr (`Xxx`, validated
//! values with `parse`, `buffer_len` and `emit`). [`Iu`] dispatches on the
//! opcode byte through the one table in [`IuType`].
//!
//! Multi-byte fields are big-endian, except the tag, which is
//! opaque to the receiver; see [`Tag`].

#[macro_use]
mod macros;

mod cmd;
mod login;
mod misc;
mod rsp;
mod tsk_mgmt;

pub use cmd::{
    Cmd, CmdPacket, DataDesc, DescFormat, DescList, DirectBuf, IndirectBuf, TaskAttr,
    CMD_FIXED_LEN, DIRECT_BUF_LEN, IMM_BUF_LEN, INDIRECT_BUF_HEADER_LEN, LINUX_IMM_DATA_OFFSET,
    MAX_ADD_CDB_LEN,
};
pub use login::{
    BufFormats, LoginRej, LoginRejPacket, LoginRejReason, LoginReq, LoginReqFlags, LoginReqPacket,
    LoginReqRdmaPacket, LoginRsp, LoginRspFlags, LoginRspPacket, MultiChannelAction,
    MultiChannelResult, LOGIN_REJ_LEN, LOGIN_REQ_LEN, LOGIN_REQ_RDMA_LEN, LOGIN_RSP_LEN,
};
pub use misc::{
    AerReq, AerReqPacket, AerRsp, CredReq, CredRsp, ILogout, SmallPacket, TLogout, TLogoutReason,
    AER_REQ_FIXED_LEN, SMALL_IU_LEN,
};
pub use rsp::{Rsp, RspCode, RspFlags, RspPacket, RSP_FIXED_LEN};
pub use tsk_mgmt::{TmFunc, TskMgmt, TskMgmtPacket, TSK_MGMT_LEN};

use core::fmt;
use rdma_types::view::Field as WireField;

/// Solicited notification bits of byte 1 (Linux `ib_srpt.h`, SRP r16a tables 16 and 22).
pub mod sol_not {
    /// SRP_RSP, SRP_T_LOGOUT, SRP_CRED_REQ, SRP_AER_REQ: the initiator asked
    /// for solicited notification of this IU.
    pub const SOLNT: u8 = 0x01;
    /// SRP_CMD, SRP_TSK_MGMT: notify solicitedly on successful completion.
    pub const SCSOLNT: u8 = 0x02;
    /// SRP_CMD, SRP_TSK_MGMT: notify solicitedly on unsuccessful completion.
    pub const UCSOLNT: u8 = 0x04;
}

/// Why an IU could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the IU's fixed part or than a length or
    /// count inside it says.
    #[error("{iu} truncated: needs {need} bytes, got {got}")]
    Truncated {
        /// Which IU or part was being read.
        iu: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The opcode byte is not the one of the IU being parsed.
    #[error("opcode {got:#04x} is not {expected}")]
    WrongOpcode {
        /// The IU type the caller asked for.
        expected: IuType,
        /// The opcode byte found.
        got: u8,
    },
    /// An opcode outside SRP r16a (only [`Iu::parse`] reports it).
    #[error("unknown SRP IU opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A data buffer descriptor format this crate cannot locate fields past
    /// (SRP r16a defines 0..=2, SRP2 adds 3 for data-out).
    #[error("SRP_CMD {dir} buffer descriptor format {format} not supported")]
    DescFormat {
        /// "data-out" or "data-in".
        dir: &'static str,
        /// The 4-bit format code.
        format: u8,
    },
    /// An indirect table descriptor length that is not a multiple of 16.
    #[error("indirect table length {0} is not a multiple of 16")]
    TableLen(u32),
    /// More descriptors in the IU than the indirect table descriptor covers.
    #[error("{count} descriptors in the IU but the indirect table holds {table_len} bytes")]
    TableCount {
        /// DATA-OUT/IN BUFFER DESCRIPTOR COUNT.
        count: u8,
        /// Table descriptor length in bytes.
        table_len: u32,
    },
    /// More descriptors in the IU than the one-byte count field can say.
    #[error("{0} descriptors do not fit SRP_CMD (max 255 in the IU)")]
    TooManyDescriptors(usize),
    /// Immediate data in an IU whose login did not negotiate it.
    #[error("SRP_CMD carries immediate data but none was negotiated")]
    ImmediateNotNegotiated,
    /// The immediate data offset lies inside the descriptors, or the data
    /// runs past the IU.
    #[error("immediate data at offset {offset} ({len} bytes) does not fit after the descriptors ({desc_end}) in an IU of {iu_len}")]
    ImmediateBounds {
        /// Negotiated data offset.
        offset: u16,
        /// IMMEDIATE DATA LENGTH from the descriptor.
        len: u32,
        /// Where the descriptors end.
        desc_end: usize,
        /// IU length.
        iu_len: usize,
    },
    /// A CDB that cannot be sent (more than 16 + 252 bytes).
    #[error("CDB of {0} bytes does not fit SRP_CMD (max 268)")]
    CdbLen(usize),
    /// Emit was given a buffer shorter than `buffer_len()`.
    #[error("emit buffer too short: need {need}, have {have}")]
    BufferTooShort {
        /// `buffer_len()` of the repr.
        need: usize,
        /// Length of the buffer given.
        have: usize,
    },
}

/// Result of parsing or emitting an IU.
pub type Result<T> = core::result::Result<T, Error>;

/// Bytes an [`IuBytes`] holds without allocating.
pub const IU_INLINE: usize = 64;

/// An emitted IU ([`Iu::to_bytes`]), held inline when short.
pub type IuBytes = smallvec::SmallVec<[u8; IU_INLINE]>;

/// The length check of the views (`rdma_types::view!`).
pub(crate) fn need(iu: &'static str, need: usize, have: usize) -> Result<()> {
    if have < need {
        Err(Error::Truncated {
            iu,
            need,
            got: have,
        })
    } else {
        Ok(())
    }
}

pub(crate) fn check_len(iu: &'static str, buf: &[u8], need_len: usize) -> Result<()> {
    need(iu, need_len, buf.len())
}

pub(crate) fn check_emit(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::BufferTooShort {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn get_u32(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    u32::from_be_bytes(b[r].try_into().unwrap_or([0; 4]))
}
pub(crate) fn get_u64(b: &[u8], r: core::ops::Range<usize>) -> u64 {
    u64::from_be_bytes(b[r].try_into().unwrap_or([0; 8]))
}

/// The tag of an IU: chosen by the sender of a request, echoed in the
/// response, opaque to the receiver (SRP r16a). The 8 bytes are read
/// little-endian, as Linux on x86/ARM stores its `u64` tag, so values print
/// the same as in Linux logs; the bytes on the wire are never altered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Tag(pub u64);

impl Tag {
    /// The tag from its 8 wire bytes.
    pub const fn from_bytes(b: [u8; 8]) -> Tag {
        Tag(u64::from_le_bytes(b))
    }
    /// The 8 wire bytes of the tag.
    pub const fn to_bytes(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// An 8-byte SCSI LUN field, uninterpreted (SAM-5 4.6; the SCSI core owns
/// its meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// The LUN field from one big-endian number.
    pub const fn from_u64(v: u64) -> Lun {
        Lun(v.to_be_bytes())
    }
    /// The LUN as one big-endian number (handy for logs and single-level LUNs).
    pub const fn to_u64(self) -> u64 {
        u64::from_be_bytes(self.0)
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.to_u64())
    }
}

/// A 128-bit SRP initiator or target port identifier (SRP r16a; for IB
/// the identifier extension followed by the port or IOC GUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PortId(pub [u8; 16]);

impl PortId {
    /// Identifier extension (first 8 bytes).
    pub fn id_ext(&self) -> u64 {
        get_u64(&self.0, 0..8)
    }
    /// GUID part (last 8 bytes).
    pub fn guid(&self) -> u64 {
        get_u64(&self.0, 8..16)
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.id_ext(), self.guid())
    }
}

iu_types! {
    /// SRP IU type codes (SRP r16a, Linux `include/scsi/srp.h`), with
    /// the fixed length of each IU in bytes (the part before any variable
    /// data; the IB form for SRP_LOGIN_REQ).
    IuType {
        LoginReq = 0x00, "SRP_LOGIN_REQ", 64;
        TskMgmt = 0x01, "SRP_TSK_MGMT", 48;
        Cmd = 0x02, "SRP_CMD", 48;
        ILogout = 0x03, "SRP_I_LOGOUT", 16;
        CredRsp = 0x41, "SRP_CRED_RSP", 16;
        AerRsp = 0x42, "SRP_AER_RSP", 16;
        TLogout = 0x80, "SRP_T_LOGOUT", 16;
        CredReq = 0x81, "SRP_CRED_REQ", 16;
        AerReq = 0x82, "SRP_AER_REQ", 36;
        LoginRsp = 0xc0, "SRP_LOGIN_RSP", 52;
        Rsp = 0xc1, "SRP_RSP", 36;
        LoginRej = 0xc2, "SRP_LOGIN_REJ", 32;
    }
}

pub(crate) fn check_opcode(buf: &[u8], expected: IuType) -> Result<()> {
    check_len(expected.name(), buf, 1)?;
    if buf[0] != u8::from(expected) {
        return Err(Error::WrongOpcode {
            expected,
            got: buf[0],
        });
    }
    check_len(expected.name(), buf, expected.fixed_len().unwrap_or(0))
}

/// Any SRP IU, dispatched on its opcode byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Iu<'a> {
    /// SRP_LOGIN_REQ in its 64-byte IB CM form.
    LoginReq(LoginReq),
    /// SRP_LOGIN_RSP.
    LoginRsp(LoginRsp),
    /// SRP_LOGIN_REJ.
    LoginRej(LoginRej),
    /// SRP_CMD.
    Cmd(Cmd<'a>),
    /// SRP_RSP.
    Rsp(Rsp<'a>),
    /// SRP_TSK_MGMT.
    TskMgmt(TskMgmt),
    /// SRP_I_LOGOUT.
    ILogout(ILogout),
    /// SRP_T_LOGOUT.
    TLogout(TLogout),
    /// SRP_CRED_REQ.
    CredReq(CredReq),
    /// SRP_CRED_RSP.
    CredRsp(CredRsp),
    /// SRP_AER_REQ.
    AerReq(AerReq<'a>),
    /// SRP_AER_RSP.
    AerRsp(AerRsp),
}

impl<'a> Iu<'a> {
    /// Parse any IU. `imm_data_offset` is the immediate data offset agreed at
    /// login (`None` if immediate data was not negotiated); only SRP_CMD uses it.
    ///
    /// # Errors
    /// [`Error::UnknownOpcode`] for an opcode not in [`IuType`], otherwise the
    /// errors of the IU's own parser.
    pub fn parse(buf: &'a [u8], imm_data_offset: Option<u16>) -> Result<Iu<'a>> {
        check_len("IU", buf, 1)?;
        Ok(match IuType::from(buf[0]) {
            IuType::LoginReq => Iu::LoginReq(LoginReq::parse(buf)?),
            IuType::LoginRsp => Iu::LoginRsp(LoginRsp::parse(buf)?),
            IuType::LoginRej => Iu::LoginRej(LoginRej::parse(buf)?),
            IuType::Cmd => Iu::Cmd(Cmd::parse(buf, imm_data_offset)?),
            IuType::Rsp => Iu::Rsp(Rsp::parse(buf)?),
            IuType::TskMgmt => Iu::TskMgmt(TskMgmt::parse(buf)?),
            IuType::ILogout => Iu::ILogout(ILogout::parse(buf)?),
            IuType::TLogout => Iu::TLogout(TLogout::parse(buf)?),
            IuType::CredReq => Iu::CredReq(CredReq::parse(buf)?),
            IuType::CredRsp => Iu::CredRsp(CredRsp::parse(buf)?),
            IuType::AerReq => Iu::AerReq(AerReq::parse(buf)?),
            IuType::AerRsp => Iu::AerRsp(AerRsp::parse(buf)?),
            IuType::Unknown(op) => return Err(Error::UnknownOpcode(op)),
        })
    }

    /// The IU's type.
    pub fn iu_type(&self) -> IuType {
        match self {
            Iu::LoginReq(_) => IuType::LoginReq,
            Iu::LoginRsp(_) => IuType::LoginRsp,
            Iu::LoginRej(_) => IuType::LoginRej,
            Iu::Cmd(_) => IuType::Cmd,
            Iu::Rsp(_) => IuType::Rsp,
            Iu::TskMgmt(_) => IuType::TskMgmt,
            Iu::ILogout(_) => IuType::ILogout,
            Iu::TLogout(_) => IuType::TLogout,
            Iu::CredReq(_) => IuType::CredReq,
            Iu::CredRsp(_) => IuType::CredRsp,
            Iu::AerReq(_) => IuType::AerReq,
            Iu::AerRsp(_) => IuType::AerRsp,
        }
    }

    /// The tag of the IU (every IU has one).
    pub fn tag(&self) -> Tag {
        match self {
            Iu::LoginReq(r) => r.tag,
            Iu::LoginRsp(r) => r.tag,
            Iu::LoginRej(r) => r.tag,
            Iu::Cmd(r) => r.tag,
            Iu::Rsp(r) => r.tag,
            Iu::TskMgmt(r) => r.tag,
            Iu::ILogout(r) => r.tag,
            Iu::TLogout(r) => r.tag,
            Iu::CredReq(r) => r.tag,
            Iu::CredRsp(r) => r.tag,
            Iu::AerReq(r) => r.tag,
            Iu::AerRsp(r) => r.tag,
        }
    }

    /// Bytes [`Iu::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Iu::LoginReq(r) => r.buffer_len(),
            Iu::LoginRsp(r) => r.buffer_len(),
            Iu::LoginRej(r) => r.buffer_len(),
            Iu::Cmd(r) => r.buffer_len(),
            Iu::Rsp(r) => r.buffer_len(),
            Iu::TskMgmt(r) => r.buffer_len(),
            Iu::ILogout(r) => r.buffer_len(),
            Iu::TLogout(r) => r.buffer_len(),
            Iu::CredReq(r) => r.buffer_len(),
            Iu::CredRsp(r) => r.buffer_len(),
            Iu::AerReq(r) => r.buffer_len(),
            Iu::AerRsp(r) => r.buffer_len(),
        }
    }

    /// Write the IU into `buf[..buffer_len()]`, reserved bytes zero; returns
    /// the length written.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`], or the IU's own emit errors.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        match self {
            Iu::LoginReq(r) => r.emit(buf),
            Iu::LoginRsp(r) => r.emit(buf),
            Iu::LoginRej(r) => r.emit(buf),
            Iu::Cmd(r) => r.emit(buf),
            Iu::Rsp(r) => r.emit(buf),
            Iu::TskMgmt(r) => r.emit(buf),
            Iu::ILogout(r) => r.emit(buf),
            Iu::TLogout(r) => r.emit(buf),
            Iu::CredReq(r) => r.emit(buf),
            Iu::CredRsp(r) => r.emit(buf),
            Iu::AerReq(r) => r.emit(buf),
            Iu::AerRsp(r) => r.emit(buf),
        }
    }

    /// The emitted bytes in a new vector.
    ///
    /// # Errors
    /// As [`Iu::emit`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0; self.buffer_len()];
        let n = self.emit(&mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// [`Iu::to_vec`] into an [`IuBytes`]: no allocation for an IU of
    /// [`IU_INLINE`] bytes or fewer (an SRP_RSP without sense data).
    pub fn to_bytes(&self) -> Result<IuBytes> {
        let len = self.buffer_len();
        if len <= IU_INLINE {
            // Emitted into an array that becomes the inline buffer: no
            // call to fill a vector's bytes that emit writes again.
            let mut a = [0u8; IU_INLINE];
            let n = self.emit(&mut a)?;
            return Ok(IuBytes::from_buf_and_len(a, n));
        }
        let mut v = IuBytes::from_elem(0, len);
        let n = self.emit(&mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

// How SRP's own types sit in an IU's fields (the views' accessors).
impl WireField for Tag {
    fn get(b: &[u8]) -> Self {
        Tag::from_bytes(b.try_into().unwrap_or_default())
    }
    fn put(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_bytes())
    }
}

impl WireField for Lun {
    fn get(b: &[u8]) -> Self {
        Lun(b.try_into().unwrap_or_default())
    }
    fn put(self, b: &mut [u8]) {
        b.copy_from_slice(&self.0)
    }
}

impl WireField for PortId {
    fn get(b: &[u8]) -> Self {
        PortId(b.try_into().unwrap_or_default())
    }
    fn put(self, b: &mut [u8]) {
        b.copy_from_slice(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iu_type_table_round_trips_and_names() {
        for op in 0..=255u8 {
            let t = IuType::from(op);
            assert_eq!(u8::from(t), op);
            match t {
                IuType::Unknown(_) => {
                    assert!(t.fixed_len().is_none());
                    assert_eq!(t.to_string(), format!("unknown IU type {op:#04x}"));
                }
                _ => assert!(t.to_string().starts_with("SRP_")),
            }
        }
        assert_eq!(IuType::Rsp.to_string(), "SRP_RSP");
        assert_eq!(IuType::from(0xc2), IuType::LoginRej);
        assert_eq!(IuType::LoginRsp.fixed_len(), Some(52));
    }

    #[test]
    fn iu_dispatch_rejects_unknown_and_empty() {
        assert_eq!(
            Iu::parse(&[0x55; 64], None),
            Err(Error::UnknownOpcode(0x55))
        );
        assert!(matches!(Iu::parse(&[], None), Err(Error::Truncated { .. })));
    }

    #[test]
    fn tag_is_read_like_linux_little_endian() {
        let t = Tag::from_bytes([0x28, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(t, Tag(0x28));
        assert_eq!(t.to_bytes(), [0x28, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(t.to_string(), "0x28");
    }

    #[test]
    fn port_id_prints_as_32_hex_digits() {
        let mut b = [0u8; 16];
        b[8..].copy_from_slice(&[0x50, 0x54, 0x00, 0xff, 0xfe, 0x99, 0x00, 0x03]);
        let p = PortId(b);
        assert_eq!(p.guid(), 0x505400fffe990003);
        assert_eq!(p.to_string(), "0000000000000000505400fffe990003");
    }
}
