//! The small IUs: SRP_I_LOGOUT, SRP_T_LOGOUT (SRP r16a 6.5, 6.6),
//! SRP_CRED_REQ/RSP (6.10, 6.11) and SRP_AER_REQ/RSP (6.12, 6.13).

use super::{check_emit, check_len, check_opcode, IuType, Lun, Result, Tag};

/// Length of I_LOGOUT, T_LOGOUT, CRED_REQ, CRED_RSP and AER_RSP.
pub const SMALL_IU_LEN: usize = 16;
/// Length of SRP_AER_REQ before its sense data (`struct srp_aer_req`).
pub const AER_REQ_FIXED_LEN: usize = 36;

rdma_types::open_enum! {
    /// REASON of SRP_T_LOGOUT (SRP r16a 6.6).
    pub enum TLogoutReason(u32), "unknown target logout reason" {
        /// No reason specified.
        NoReason = 0 => "no reason specified",
        /// The channel was idle and the target reclaims its resources.
        Inactive = 1 => "inactive RDMA channel (reclaiming resources)",
        /// The initiator sent an IU type the target does not accept.
        InvalidIuType = 2 => "invalid information unit type code received",
        /// The initiator sent a response with no matching request.
        SpuriousResponse = 3 => "initiator port sent response with no corresponding request",
        /// A new login's multi-channel action closed this channel.
        MultiChannelAction = 4 => "disconnected due to multi-channel action code in new login",
        /// Unsupported data-out buffer descriptor format.
        UnsupportedDataOutFormat = 5 => "unsupported format code in data-out buffer descriptor",
        /// Unsupported data-in buffer descriptor format.
        UnsupportedDataInFormat = 6 => "unsupported format code in data-in buffer descriptor",
        /// An IU of the wrong length for its type.
        InvalidIuLength = 8 => "invalid length for IU type",
    }
}

mod field {
    use core::ops::Range;
    // Common head of the 16-byte IUs and of SRP_AER_REQ.
    pub const OPCODE: Range<usize> = 0..1;
    pub const SOL_NOT: Range<usize> = 1..2;
    /// REASON (T_LOGOUT) or REQUEST LIMIT DELTA (CRED_REQ, AER_REQ).
    pub const WORD: Range<usize> = 4..8;
    pub const TAG: Range<usize> = 8..16;
    // struct srp_aer_req.
    pub const LUN: Range<usize> = 20..28;
    pub const SENSE_DATA_LEN: Range<usize> = 28..32;
}

rdma_types::view! {
    /// View of the 16-byte IUs (I_LOGOUT, T_LOGOUT, CRED_REQ, CRED_RSP,
    /// AER_RSP), which share one layout.
    pub struct SmallPacket; len SMALL_IU_LEN; "SRP small IU", crate::wire::need => crate::wire::Error;
    /// IU type code.
    opcode / set_opcode: u8 = field::OPCODE;
    /// SOLNT bit (T_LOGOUT, CRED_REQ; reserved otherwise).
    sol_not / set_sol_not: u8 = field::SOL_NOT;
    /// REASON (T_LOGOUT) or REQUEST LIMIT DELTA (CRED_REQ); reserved otherwise.
    word / set_word: u32 = field::WORD;
    /// Tag.
    tag / set_tag: super::Tag = field::TAG;
}

rdma_types::view! {
    /// View of SRP_AER_REQ's fixed part.
    pub struct AerReqPacket; len AER_REQ_FIXED_LEN; "SRP_AER_REQ", crate::wire::need => crate::wire::Error;
    /// IU type code (0x82).
    opcode / set_opcode: u8 = field::OPCODE;
    /// SOLNT bit.
    sol_not / set_sol_not: u8 = field::SOL_NOT;
    /// REQUEST LIMIT DELTA (signed).
    req_lim_delta / set_req_lim_delta: i32 = field::WORD;
    /// Tag.
    tag / set_tag: super::Tag = field::TAG;
    /// Logical unit number.
    lun / set_lun: super::Lun = field::LUN;
    /// SENSE DATA LIST LENGTH.
    sense_data_len / set_sense_data_len: u32 = field::SENSE_DATA_LEN;
}

fn parse_small(buf: &[u8], t: IuType) -> Result<SmallPacket<&[u8]>> {
    check_opcode(buf, t)?;
    SmallPacket::new_checked(buf)
}

fn emit_small(buf: &mut [u8], t: IuType, sol_not: u8, word: u32, tag: Tag) -> Result<usize> {
    check_emit(buf, SMALL_IU_LEN)?;
    let buf = &mut buf[..SMALL_IU_LEN];
    buf.fill(0);
    let mut p = SmallPacket::new_unchecked(buf);
    p.set_opcode(t.into());
    p.set_sol_not(sol_not);
    p.set_word(word);
    p.set_tag(tag);
    Ok(SMALL_IU_LEN)
}

/// SRP_I_LOGOUT (SRP r16a 6.5): the initiator closes the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ILogout {
    /// Tag.
    pub tag: Tag,
}

/// SRP_T_LOGOUT (SRP r16a 6.6): the target closes the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TLogout {
    /// SOLNT bit.
    pub sol_not: u8,
    /// Why.
    pub reason: TLogoutReason,
    /// Tag.
    pub tag: Tag,
}

impl core::fmt::Display for TLogout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "SRP target logout: {}", self.reason)
    }
}

/// SRP_CRED_REQ (SRP r16a 6.10): the target grants credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredReq {
    /// SOLNT bit.
    pub sol_not: u8,
    /// Credits added (signed).
    pub req_lim_delta: i32,
    /// Tag.
    pub tag: Tag,
}

/// SRP_CRED_RSP (SRP r16a 6.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredRsp {
    /// Tag of the CRED_REQ.
    pub tag: Tag,
}

/// SRP_AER_RSP (SRP r16a 6.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerRsp {
    /// Tag of the AER_REQ.
    pub tag: Tag,
}

macro_rules! small_iu {
    ($ty:ident, $code:expr, |$p:ident| $parse:expr, |$s:ident| ($sol:expr, $word:expr)) => {
        impl $ty {
            /// Parse; bytes past the 16 are ignored.
            ///
            /// # Errors
            /// [`Error::WrongOpcode`](super::Error::WrongOpcode),
            /// [`Error::Truncated`](super::Error::Truncated).
            pub fn parse(buf: &[u8]) -> Result<$ty> {
                let $p = parse_small(buf, $code)?;
                Ok($parse)
            }
            /// Bytes `emit` writes (16).
            pub fn buffer_len(&self) -> usize {
                SMALL_IU_LEN
            }
            /// Write the IU, reserved bytes zero.
            ///
            /// # Errors
            /// [`Error::BufferTooShort`](super::Error::BufferTooShort).
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
                let $s = self;
                emit_small(buf, $code, $sol, $word, $s.tag)
            }
        }
    };
}

small_iu!(
    ILogout,
    IuType::ILogout,
    |p| ILogout { tag: p.tag() },
    |s| (0, 0)
);
small_iu!(
    TLogout,
    IuType::TLogout,
    |p| TLogout {
        sol_not: p.sol_not(),
        reason: p.word().into(),
        tag: p.tag()
    },
    |s| (s.sol_not, s.reason.into())
);
small_iu!(
    CredReq,
    IuType::CredReq,
    |p| CredReq {
        sol_not: p.sol_not(),
        req_lim_delta: p.word() as i32,
        tag: p.tag()
    },
    |s| (s.sol_not, s.req_lim_delta as u32)
);
small_iu!(
    CredRsp,
    IuType::CredRsp,
    |p| CredRsp { tag: p.tag() },
    |s| (0, 0)
);
small_iu!(AerRsp, IuType::AerRsp, |p| AerRsp { tag: p.tag() }, |s| (
    0, 0
));

/// SRP_AER_REQ (SRP r16a 6.12): an asynchronous event for a LUN, as sense data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerReq<'a> {
    /// SOLNT bit.
    pub sol_not: u8,
    /// Credits added (signed).
    pub req_lim_delta: i32,
    /// Tag.
    pub tag: Tag,
    /// Logical unit the event concerns.
    pub lun: Lun,
    /// Sense data describing the event.
    pub sense_data: &'a [u8],
}

impl<'a> AerReq<'a> {
    /// Parse; bytes past the sense data are ignored.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`](super::Error::WrongOpcode),
    /// [`Error::Truncated`](super::Error::Truncated) when the sense data
    /// length runs past the IU.
    pub fn parse(buf: &'a [u8]) -> Result<AerReq<'a>> {
        check_opcode(buf, IuType::AerReq)?;
        let p = AerReqPacket::new_checked(buf)?;
        let end = usize::try_from(p.sense_data_len())
            .ok()
            .and_then(|l| l.checked_add(AER_REQ_FIXED_LEN))
            .unwrap_or(usize::MAX);
        check_len("SRP_AER_REQ sense data", buf, end)?;
        Ok(AerReq {
            sol_not: p.sol_not(),
            req_lim_delta: p.req_lim_delta(),
            tag: p.tag(),
            lun: p.lun(),
            sense_data: &buf[AER_REQ_FIXED_LEN..end],
        })
    }

    /// Bytes [`AerReq::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        AER_REQ_FIXED_LEN + self.sense_data.len()
    }

    /// Write the IU.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`](super::Error::BufferTooShort).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let total = self.buffer_len();
        check_emit(buf, total)?;
        let buf = &mut buf[..total];
        buf.fill(0);
        let mut p = AerReqPacket::new_unchecked(&mut *buf);
        p.set_opcode(IuType::AerReq.into());
        p.set_sol_not(self.sol_not);
        p.set_req_lim_delta(self.req_lim_delta);
        p.set_tag(self.tag);
        p.set_lun(self.lun);
        p.set_sense_data_len(u32::try_from(self.sense_data.len()).unwrap_or(u32::MAX));
        buf[AER_REQ_FIXED_LEN..].copy_from_slice(self.sense_data);
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Error, Iu};

    #[test]
    fn logout_and_credit_vectors() {
        #[rustfmt::skip]
        let t_logout: [u8; 16] = [
            0x80, // opcode SRP_T_LOGOUT
            0x01, // SOLNT
            0, 0, // reserved
            0x00, 0x00, 0x00, 0x01, // reason: inactive channel
            0x05, 0, 0, 0, 0, 0, 0, 0, // tag 5
        ];
        let t = TLogout::parse(&t_logout).unwrap();
        assert_eq!(t.reason, TLogoutReason::Inactive);
        assert_eq!(
            t.to_string(),
            "SRP target logout: inactive RDMA channel (reclaiming resources)"
        );
        let mut out = [0xaa; 16];
        t.emit(&mut out).unwrap();
        assert_eq!(out, t_logout);

        #[rustfmt::skip]
        let cred_req: [u8; 16] = [
            0x81, // opcode SRP_CRED_REQ
            0x00, 0, 0, // sol_not, reserved
            0xff, 0xff, 0xff, 0xfd, // req_lim_delta -3
            0x10, 0, 0, 0, 0, 0, 0, 0, // tag 0x10
        ];
        let c = CredReq::parse(&cred_req).unwrap();
        assert_eq!(c.req_lim_delta, -3);
        c.emit(&mut out).unwrap();
        assert_eq!(out, cred_req);

        // The responses Linux ib_srp builds: opcode, zeros, the echoed tag.
        for (op, iu) in [
            (0x41u8, Iu::CredRsp(CredRsp { tag: Tag(0x10) })),
            (0x42, Iu::AerRsp(AerRsp { tag: Tag(0x10) })),
            (0x03, Iu::ILogout(ILogout { tag: Tag(0x10) })),
        ] {
            let v = iu.to_vec().unwrap();
            let mut expected = [0u8; 16];
            expected[0] = op; // opcode
            expected[8] = 0x10; // tag
            assert_eq!(v, expected);
            assert_eq!(Iu::parse(&v, None), Ok(iu));
        }
        // Wrong opcode for the parser asked.
        assert!(matches!(
            CredRsp::parse(&cred_req),
            Err(Error::WrongOpcode { got: 0x81, .. })
        ));
    }

    #[test]
    fn aer_req_with_sense() {
        let sense = [0x70, 0, 0x06, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x2a, 0x09];
        let a = AerReq {
            sol_not: 0,
            req_lim_delta: 0,
            tag: Tag(0x77),
            lun: Lun([0, 3, 0, 0, 0, 0, 0, 0]),
            sense_data: &sense,
        };
        let mut v = vec![0u8; a.buffer_len()];
        a.emit(&mut v).unwrap();
        #[rustfmt::skip]
        let head: [u8; 36] = [
            0x82, 0, 0, 0, // opcode SRP_AER_REQ, sol_not, reserved
            0, 0, 0, 0, // req_lim_delta 0
            0x77, 0, 0, 0, 0, 0, 0, 0, // tag
            0, 0, 0, 0, // reserved
            0, 3, 0, 0, 0, 0, 0, 0, // LUN 3
            0, 0, 0, 14, // sense data length
            0, 0, 0, 0, // reserved
        ];
        assert_eq!(&v[..36], &head);
        assert_eq!(&v[36..], &sense);
        assert_eq!(AerReq::parse(&v), Ok(a));
        assert!(matches!(
            AerReq::parse(&v[..49]),
            Err(Error::Truncated { .. })
        ));
    }
}
