//! SRP_RSP (SRP r16a 6.9): status, residuals, response data and sense data.

use super::{check_emit, check_len, check_opcode, IuType, Result, Tag};

/// Length of SRP_RSP before response and sense data (`struct srp_rsp`).
pub const RSP_FIXED_LEN: usize = 36;

/// The flags byte of SRP_RSP (SRP r16a 6.9, `SRP_RSP_FLAG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RspFlags(pub u8);

impl RspFlags {
    /// RSPVALID: response data present.
    pub const RSPVALID: u8 = 1 << 0;
    /// SNSVALID: sense data present.
    pub const SNSVALID: u8 = 1 << 1;
    /// DOOVER: data-out overflow, DATA-OUT RESIDUAL COUNT valid.
    pub const DOOVER: u8 = 1 << 2;
    /// DOUNDER: data-out underflow, DATA-OUT RESIDUAL COUNT valid.
    pub const DOUNDER: u8 = 1 << 3;
    /// DIOVER: data-in overflow, DATA-IN RESIDUAL COUNT valid.
    pub const DIOVER: u8 = 1 << 4;
    /// DIUNDER: data-in underflow, DATA-IN RESIDUAL COUNT valid.
    pub const DIUNDER: u8 = 1 << 5;
    const RESIDUAL: u8 = Self::DOOVER | Self::DOUNDER | Self::DIOVER | Self::DIUNDER;

    /// Whether `bit` (one of the constants) is set.
    pub const fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

rdma_types::open_enum! {
    /// RESPONSE CODE, byte 3 of the 4-byte response data of an SRP_RSP that
    /// answers SRP_TSK_MGMT (SRP r16a table 24; Linux `SRP_TSK_MGMT_*`).
    pub enum RspCode(u8), "unknown SRP response code" {
        /// No failure, or the task management function completed.
        Complete = 0x00 => "task management function complete",
        /// Fields of the request were invalid.
        RequestFieldsInvalid = 0x02 => "request fields invalid",
        /// The function is not supported.
        NotSupported = 0x04 => "task management function not supported",
        /// The function failed.
        Failed = 0x05 => "task management function failed",
    }
}

impl RspCode {
    /// The 4-byte response data carrying this code, as LIO ib_srpt sends it.
    pub fn to_response_data(self) -> [u8; 4] {
        [0, 0, 0, u8::from(self)]
    }
}

mod field {
    use core::ops::Range;
    // struct srp_rsp, SRP r16a 6.9.
    pub const OPCODE: Range<usize> = 0..1;
    pub const SOL_NOT: Range<usize> = 1..2;
    pub const REQ_LIM_DELTA: Range<usize> = 4..8;
    pub const TAG: Range<usize> = 8..16;
    pub const FLAGS: Range<usize> = 18..19;
    pub const STATUS: Range<usize> = 19..20;
    pub const DATA_OUT_RES_CNT: Range<usize> = 20..24;
    pub const DATA_IN_RES_CNT: Range<usize> = 24..28;
    pub const SENSE_DATA_LEN: Range<usize> = 28..32;
    pub const RESP_DATA_LEN: Range<usize> = 32..36;
}

rdma_types::view! {
    /// View of SRP_RSP's fixed part.
    pub struct RspPacket; len RSP_FIXED_LEN; "SRP_RSP", crate::wire::need => crate::wire::Error;
    /// IU type code (0xc1).
    opcode / set_opcode: u8 = field::OPCODE;
    /// SOLNT bit (bit 0).
    sol_not / set_sol_not: u8 = field::SOL_NOT;
    /// REQUEST LIMIT DELTA (signed).
    req_lim_delta / set_req_lim_delta: i32 = field::REQ_LIM_DELTA;
    /// Tag of the command or task management request.
    tag / set_tag: super::Tag = field::TAG;
    /// Flags byte.
    flags / set_flags: u8 = field::FLAGS;
    /// SCSI status.
    status / set_status: u8 = field::STATUS;
    /// DATA-OUT RESIDUAL COUNT.
    data_out_res_cnt / set_data_out_res_cnt: u32 = field::DATA_OUT_RES_CNT;
    /// DATA-IN RESIDUAL COUNT.
    data_in_res_cnt / set_data_in_res_cnt: u32 = field::DATA_IN_RES_CNT;
    /// SENSE DATA LIST LENGTH.
    sense_data_len / set_sense_data_len: u32 = field::SENSE_DATA_LEN;
    /// RESPONSE DATA LIST LENGTH.
    resp_data_len / set_resp_data_len: u32 = field::RESP_DATA_LEN;
}

/// SRP_RSP (SRP r16a 6.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rsp<'a> {
    /// Solicited notification byte.
    pub sol_not: u8,
    /// Credits returned to the initiator (may be negative).
    pub req_lim_delta: i32,
    /// Tag of the request answered.
    pub tag: Tag,
    /// Overflow/underflow bits only; RSPVALID and SNSVALID follow from
    /// `response_data` and `sense_data`.
    pub flags: RspFlags,
    /// SCSI status (SAM-5; interpreted by the SCSI core).
    pub status: u8,
    /// Data-out residual count.
    pub data_out_res_cnt: u32,
    /// Data-in residual count.
    pub data_in_res_cnt: u32,
    /// Response data (RSPVALID), e.g. the 4-byte task management response.
    pub response_data: Option<&'a [u8]>,
    /// Sense data (SNSVALID).
    pub sense_data: Option<&'a [u8]>,
}

impl<'a> Rsp<'a> {
    /// Parse. A length field whose valid bit is clear is ignored (SRP r16a
    /// 6.9); bytes after the sense data are ignored.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`](super::Error::WrongOpcode),
    /// [`Error::Truncated`](super::Error::Truncated) when the lengths run past the IU.
    pub fn parse(buf: &'a [u8]) -> Result<Rsp<'a>> {
        check_opcode(buf, IuType::Rsp)?;
        let p = RspPacket::new_checked(buf)?;
        let flags = RspFlags(p.flags());
        let mut at = RSP_FIXED_LEN;
        let mut take = |valid: bool, len: u32, what: &'static str| -> Result<Option<&'a [u8]>> {
            if !valid {
                return Ok(None);
            }
            let need = usize::try_from(len)
                .ok()
                .and_then(|l| at.checked_add(l))
                .unwrap_or(usize::MAX);
            check_len(what, buf, need)?;
            let s = &buf[at..need];
            at = need;
            Ok(Some(s))
        };
        let response_data = take(
            flags.has(RspFlags::RSPVALID),
            p.resp_data_len(),
            "SRP_RSP response data",
        )?;
        let sense_data = take(
            flags.has(RspFlags::SNSVALID),
            p.sense_data_len(),
            "SRP_RSP sense data",
        )?;
        Ok(Rsp {
            sol_not: p.sol_not(),
            req_lim_delta: p.req_lim_delta(),
            tag: p.tag(),
            flags: RspFlags(flags.0 & RspFlags::RESIDUAL),
            status: p.status(),
            data_out_res_cnt: p.data_out_res_cnt(),
            data_in_res_cnt: p.data_in_res_cnt(),
            response_data,
            sense_data,
        })
    }

    /// The response code in the response data, when it holds at least 4
    /// bytes (how Linux ib_srp reads task management results).
    pub fn response_code(&self) -> Option<RspCode> {
        self.response_data
            .and_then(|d| d.get(3))
            .map(|&c| RspCode::from(c))
    }

    /// Bytes [`Rsp::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        RSP_FIXED_LEN
            + self.response_data.map_or(0, <[u8]>::len)
            + self.sense_data.map_or(0, <[u8]>::len)
    }

    /// Write the IU as LIO ib_srpt would: response data, then sense data.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`](super::Error::BufferTooShort).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let total = self.buffer_len();
        check_emit(buf, total)?;
        let buf = &mut buf[..total];
        buf[..RSP_FIXED_LEN].copy_from_slice(&self.head());
        let mut at = RSP_FIXED_LEN;
        for s in [self.response_data, self.sense_data].into_iter().flatten() {
            buf[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        Ok(total)
    }

    /// The fixed part as emitted, reserved bytes zero: built in an array
    /// of its own, not in a zeroed slice field by field (no bounds checks,
    /// no fill of bytes written next).
    fn head(&self) -> [u8; RSP_FIXED_LEN] {
        let mut head = [0u8; RSP_FIXED_LEN];
        let mut flags = self.flags.0 & RspFlags::RESIDUAL;
        if self.response_data.is_some() {
            flags |= RspFlags::RSPVALID;
        }
        if self.sense_data.is_some() {
            flags |= RspFlags::SNSVALID;
        }
        let len32 = |s: Option<&[u8]>| u32::try_from(s.map_or(0, <[u8]>::len)).unwrap_or(u32::MAX);
        let mut p = RspPacket::new_unchecked(&mut head[..]);
        p.set_opcode(IuType::Rsp.into());
        p.set_sol_not(self.sol_not);
        p.set_req_lim_delta(self.req_lim_delta);
        p.set_tag(self.tag);
        p.set_flags(flags);
        p.set_status(self.status);
        p.set_data_out_res_cnt(self.data_out_res_cnt);
        p.set_data_in_res_cnt(self.data_in_res_cnt);
        p.set_sense_data_len(len32(self.sense_data));
        p.set_resp_data_len(len32(self.response_data));
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    #[test]
    fn captured_good_status() {
        // Frame 9 of linux-ib_srp-to-lio-srpt-over-rxe.pcapng (LIO ib_srpt).
        let bytes: [u8; 36] = [
            0xc1, // opcode SRP_RSP
            0x00, // sol_not
            0, 0, // reserved
            0x00, 0x00, 0x00, 0x01, // req_lim_delta 1
            0x28, 0, 0, 0, 0, 0, 0, 0, // tag 0x28
            0, 0,    // reserved
            0x00, // flags
            0x00, // status GOOD
            0, 0, 0, 0, // data-out residual
            0, 0, 0, 0, // data-in residual
            0, 0, 0, 0, // sense data length
            0, 0, 0, 0, // response data length
        ];
        let r = Rsp::parse(&bytes).unwrap();
        assert_eq!(r.req_lim_delta, 1);
        assert_eq!(r.tag, Tag(0x28));
        assert_eq!(r.response_data, None);
        assert_eq!(r.sense_data, None);
        let mut out = [0xaa; 36];
        assert_eq!(r.emit(&mut out), Ok(36));
        assert_eq!(out, bytes);
    }

    #[test]
    fn underflow_response_data_and_sense() {
        let resp = [0, 0, 0, 0x05]; // response code: TMF failed
        let sense = [0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x20, 0x00];
        let r = Rsp {
            sol_not: 1,
            req_lim_delta: -2,
            tag: Tag(9),
            flags: RspFlags(RspFlags::DIUNDER),
            status: 0x02,
            data_out_res_cnt: 0,
            data_in_res_cnt: 512,
            response_data: Some(&resp),
            sense_data: Some(&sense),
        };
        let mut v = vec![0; r.buffer_len()];
        r.emit(&mut v).unwrap();
        #[rustfmt::skip]
        let head: [u8; 36] = [
            0xc1, 0x01, 0, 0, // opcode, SOLNT, reserved
            0xff, 0xff, 0xff, 0xfe, // req_lim_delta -2
            9, 0, 0, 0, 0, 0, 0, 0, // tag
            0, 0, // reserved
            0x23, // flags: DIUNDER | SNSVALID | RSPVALID
            0x02, // CHECK CONDITION
            0, 0, 0, 0, // data-out residual
            0, 0, 0x02, 0, // data-in residual 512
            0, 0, 0, 14, // sense length
            0, 0, 0, 4, // response data length
        ];
        assert_eq!(&v[..36], &head);
        assert_eq!(&v[36..40], &resp);
        assert_eq!(&v[40..], &sense);
        assert_eq!(Rsp::parse(&v), Ok(r));
        assert_eq!(r.response_code(), Some(RspCode::Failed));
        assert_eq!(RspCode::NotSupported.to_response_data(), [0, 0, 0, 4]);
        assert_eq!(
            RspCode::Failed.to_string(),
            "task management function failed"
        );
        // Lengths beyond the IU are errors, including ones that overflow.
        let mut bad = v.clone();
        bad[28..32].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(Rsp::parse(&bad), Err(Error::Truncated { .. })));
        // A length whose valid bit is clear is ignored.
        bad[18] = 0x21;
        assert_eq!(Rsp::parse(&bad).unwrap().sense_data, None);
    }
}
