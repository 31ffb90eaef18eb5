//! RMPP header (IBA 13.6.2) and pure segmentation/reassembly of RMPP DATA
//! segments. No windows, timers or ACK handling: those belong to the agent.

use crate::bytes::*;
use crate::mad::MAD_SIZE;
use crate::{check_len, Error, Result};

/// RMPP header offset inside the MAD.
pub const RMPP_OFFSET: usize = 24;
/// RMPP header length.
pub const RMPP_HDR_LEN: usize = 12;
/// Bytes counted as RMPP payload per segment (MAD minus common and RMPP headers).
pub const SEG_PAYLOAD: usize = MAD_SIZE - RMPP_OFFSET - RMPP_HDR_LEN;

open_enum! {
    /// RMPP type (IBA 13.6.2.1).
    pub enum RmppType(u8) {
        /// No RMPP.
        None = 0 => "none",
        /// DATA segment.
        Data = 1 => "DATA",
        /// ACK.
        Ack = 2 => "ACK",
        /// STOP.
        Stop = 3 => "STOP",
        /// ABORT.
        Abort = 4 => "ABORT",
    }
}

/// RMPP flag: RMPP is active for this MAD.
pub const FLAG_ACTIVE: u8 = 0x1;
/// RMPP flag: first segment.
pub const FLAG_FIRST: u8 = 0x2;
/// RMPP flag: last segment.
pub const FLAG_LAST: u8 = 0x4;

/// The 12-byte RMPP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RmppHeader {
    /// RMPP version (1).
    pub version: u8,
    /// Type.
    pub rmpp_type: u8,
    /// Response time (5 bits).
    pub resp_time: u8,
    /// Flags (3 bits: ACTIVE, FIRST, LAST).
    pub flags: u8,
    /// Status.
    pub status: u8,
    /// Segment number (DATA, ACK).
    pub seg_num: u32,
    /// Payload length (DATA) or new window last (ACK).
    pub paylen_newwin: u32,
}

impl RmppHeader {
    /// Reads the header from a whole MAD.
    pub fn parse(mad: &[u8]) -> Result<Self> {
        check_len(mad, RMPP_OFFSET + RMPP_HDR_LEN)?;
        let b = &mad[RMPP_OFFSET..];
        Ok(RmppHeader {
            version: b[0],
            rmpp_type: b[1],
            resp_time: bits(b, 2, 3, 5),
            flags: bits(b, 2, 0, 3),
            status: b[3],
            seg_num: u32_at(b, 4),
            paylen_newwin: u32_at(b, 8),
        })
    }

    /// Always 12.
    pub const fn buffer_len(&self) -> usize {
        RMPP_HDR_LEN
    }

    /// Writes the header into a whole MAD.
    pub fn emit(&self, mad: &mut [u8]) {
        let b = &mut mad[RMPP_OFFSET..];
        b[0] = self.version;
        b[1] = self.rmpp_type;
        b[2] = (self.resp_time << 3) | (self.flags & 7);
        b[3] = self.status;
        put_u32(b, 4, self.seg_num);
        put_u32(b, 8, self.paylen_newwin);
    }

    /// The type as an enum.
    pub fn kind(&self) -> RmppType {
        RmppType::from(self.rmpp_type)
    }

    /// True if the ACTIVE flag is set.
    pub fn active(&self) -> bool {
        self.flags & FLAG_ACTIVE != 0
    }
}

/// Splits `data` into RMPP DATA segments, Linux style (`ib_mad_rmpp.c`).
///
/// `template` is the first `hdr_len` bytes of the MAD (common header, RMPP
/// header slot, class header: 56 for SA, 36 for plain RMPP classes); it is
/// copied into every segment. Each segment carries `256 - hdr_len` data
/// bytes. Payload length counts from the end of the RMPP header: the first
/// segment gives the total, the last its own length, middle ones 0.
pub fn segment(
    template: &[u8],
    hdr_len: usize,
    data: &[u8],
    resp_time: u8,
) -> Result<Vec<[u8; MAD_SIZE]>> {
    if !(RMPP_OFFSET + RMPP_HDR_LEN..MAD_SIZE).contains(&hdr_len) {
        return Err(Error::Malformed {
            what: "RMPP header length",
            value: hdr_len as u64,
        });
    }
    check_len(template, hdr_len)?;
    let per = MAD_SIZE - hdr_len;
    let count = data.len().div_ceil(per).max(1);
    let pad = count * per - data.len();
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let mut mad = [0u8; MAD_SIZE];
        mad[..hdr_len].copy_from_slice(&template[..hdr_len]);
        let start = i * per;
        let end = (start + per).min(data.len());
        mad[hdr_len..hdr_len + (end - start)].copy_from_slice(&data[start..end]);
        let mut flags = FLAG_ACTIVE;
        let mut paylen = 0;
        if i == 0 {
            flags |= FLAG_FIRST;
            paylen = count * SEG_PAYLOAD - pad;
        }
        if i + 1 == count {
            flags |= FLAG_LAST;
            paylen = SEG_PAYLOAD - pad;
        }
        RmppHeader {
            version: 1,
            rmpp_type: RmppType::Data.into(),
            resp_time,
            flags,
            status: 0,
            seg_num: i as u32 + 1,
            paylen_newwin: paylen as u32,
        }
        .emit(&mut mad);
        out.push(mad);
    }
    Ok(out)
}

/// Reassembles in-order DATA segments made like [`segment`]; returns the
/// first segment's header bytes (`hdr_len`) and the data.
pub fn reassemble(segments: &[&[u8]], hdr_len: usize) -> Result<(Vec<u8>, Vec<u8>)> {
    if !(RMPP_OFFSET + RMPP_HDR_LEN..MAD_SIZE).contains(&hdr_len) {
        return Err(Error::Malformed {
            what: "RMPP header length",
            value: hdr_len as u64,
        });
    }
    let per = MAD_SIZE - hdr_len;
    let Some(first) = segments.first() else {
        return Err(Error::Malformed {
            what: "RMPP segment count",
            value: 0,
        });
    };
    check_len(first, MAD_SIZE)?;
    let mut data = Vec::with_capacity(segments.len() * per);
    for (i, seg) in segments.iter().enumerate() {
        check_len(seg, MAD_SIZE)?;
        let h = RmppHeader::parse(seg)?;
        if h.kind() != RmppType::Data || !h.active() {
            return Err(Error::Malformed {
                what: "RMPP type",
                value: h.rmpp_type as u64,
            });
        }
        if h.seg_num != i as u32 + 1 {
            return Err(Error::Malformed {
                what: "RMPP segment number",
                value: h.seg_num as u64,
            });
        }
        if (i == 0) != (h.flags & FLAG_FIRST != 0) {
            return Err(Error::Malformed {
                what: "RMPP FIRST flag",
                value: h.flags as u64,
            });
        }
        let last = i + 1 == segments.len();
        if last != (h.flags & FLAG_LAST != 0) {
            return Err(Error::Malformed {
                what: "RMPP LAST flag",
                value: h.flags as u64,
            });
        }
        let mut take = per;
        if last {
            // Pad as Linux computes it: a nonsensical length means no pad.
            let pad = SEG_PAYLOAD as i64 - h.paylen_newwin as i64;
            if (0..=per as i64).contains(&pad) {
                take = per - pad as usize;
            }
        }
        data.extend_from_slice(&seg[hdr_len..hdr_len + take]);
    }
    Ok((first[..hdr_len].to_vec(), data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_vector() {
        let mut mad = [0u8; MAD_SIZE];
        mad[24..36].copy_from_slice(&[
            0x01, // RMPP version 1
            0x01, // type DATA
            0x93, // resp time 18, flags ACTIVE|FIRST
            0x00, // status
            0x00, 0x00, 0x00, 0x01, // segment 1
            0x00, 0x00, 0x01, 0xb8, // payload length 440
        ]);
        let h = RmppHeader::parse(&mad).unwrap();
        assert_eq!(h.kind(), RmppType::Data);
        assert_eq!(h.resp_time, 18);
        assert_eq!(h.flags, FLAG_ACTIVE | FLAG_FIRST);
        assert_eq!(h.paylen_newwin, 440);
        let mut out = [0u8; MAD_SIZE];
        h.emit(&mut out);
        assert_eq!(out, mad);
    }

    #[test]
    fn split_and_join() {
        let template = [0x11u8; 56];
        for len in [0usize, 1, 199, 200, 201, 450, 1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let segs = segment(&template, 56, &data, 0).unwrap();
            assert_eq!(segs.len(), len.div_ceil(200).max(1));
            let first = RmppHeader::parse(&segs[0]).unwrap();
            if segs.len() > 1 {
                // Linux counts 20 SA header bytes per segment (SEG_PAYLOAD 220).
                assert_eq!(first.paylen_newwin as usize, len + 20 * segs.len());
            }
            let refs: Vec<&[u8]> = segs.iter().map(|s| &s[..]).collect();
            let (hdr, back) = reassemble(&refs, 56).unwrap();
            assert_eq!(back, data);
            assert_eq!(&hdr[..24], &template[..24]);
        }
    }

    #[test]
    fn join_rejects_gaps() {
        let data = vec![5u8; 500];
        let segs = segment(&[0u8; 56], 56, &data, 0).unwrap();
        let refs: Vec<&[u8]> = vec![&segs[0], &segs[2]];
        assert!(reassemble(&refs, 56).is_err());
        let refs: Vec<&[u8]> = vec![&segs[0], &segs[1]];
        assert!(reassemble(&refs, 56).is_err()); // no LAST
        assert!(reassemble(&[], 56).is_err());
        assert!(reassemble(&[&segs[0][..100]], 56).is_err());
    }
}
