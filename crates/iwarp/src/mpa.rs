//! MPA: Marker PDU Aligned framing (RFC 5044) with Enhanced Connection
//! Establishment (RFC 6581).
//!
//! Markers are never requested here and a peer that asks for them is
//! refused (the reply's R bit), so an FPDU on the wire is: ULPDU Length (2),
//! ULPDU, 0-3 pad bytes to a 4-byte boundary, CRC32c (4) over all of those.

use crate::terminate::TermCause;

/// Key of a request frame (RFC 5044 7.1).
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// Key of a reply frame.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Length of a request/reply frame before its private data.
pub const FRAME_HEADER_LEN: usize = 20;
/// Largest private data a frame may carry (RFC 5044 7.1, PD_Length).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of RFC 6581's IRD/ORD block at the start of the private data.
pub const IRD_ORD_LEN: usize = 4;
/// The largest IRD or ORD value (14 bits).
pub const MAX_IRD_ORD: u16 = 0x3fff;
/// ULPDU Length field plus CRC.
pub const FPDU_OVERHEAD: usize = 6;

mod field {
    use core::ops::Range;
    pub const KEY: Range<usize> = 0..16;
    /// M (7), C (6), R (5), H (4: RFC 6581's enhanced flag), reserved (3-0).
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: Range<usize> = 18..20;
}

const FLAG_M: u8 = 0x80;
const FLAG_C: u8 = 0x40;
const FLAG_R: u8 = 0x20;
const FLAG_H: u8 = 0x10;
const IRD_P2P: u16 = 0x8000;
const IRD_ZERO_RTR: u16 = 0x4000;
const ORD_WRITE_RTR: u16 = 0x8000;
const ORD_READ_RTR: u16 = 0x4000;

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// "MPA ID Req Frame", sent by the initiator.
    Request,
    /// "MPA ID Rep Frame", sent by the responder.
    Reply,
}

/// RFC 6581's IRD/ORD block and its peer-to-peer (RTR) flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth the sender offers.
    pub ird: u16,
    /// Outbound RDMA Read queue depth the sender wants.
    pub ord: u16,
    /// Peer-to-peer mode: an RTR message follows the exchange.
    pub peer_to_peer: bool,
    /// RTR may be a zero-length Send.
    pub zero_length_rtr: bool,
    /// RTR may be a zero-length RDMA Write.
    pub write_rtr: bool,
    /// RTR may be a zero-length RDMA Read.
    pub read_rtr: bool,
}

/// A parsed MPA request or reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRepr {
    /// Request or reply.
    pub kind: FrameKind,
    /// M: the sender wants markers in the stream it receives.
    pub markers: bool,
    /// C: CRC wanted (request) or in use (reply).
    pub crc: bool,
    /// R: the reply rejects the connection.
    pub reject: bool,
    /// Revision (1 or 2).
    pub revision: u8,
    /// RFC 6581's block, when revision 2 with H set.
    pub ird_ord: Option<IrdOrd>,
    /// The ULP's private data (after the IRD/ORD block, if any).
    pub private_data: Vec<u8>,
}

/// Why a request/reply frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// More bytes are needed; the value is the frame's total length if known.
    #[error("MPA frame incomplete: {0} bytes needed")]
    Incomplete(usize),
    /// The key is not the expected one.
    #[error("MPA frame key is not {expected:?}")]
    BadKey {
        /// The kind we waited for.
        expected: FrameKind,
    },
    /// Revision other than 1 or 2.
    #[error("MPA revision {0} not supported (1 or 2)")]
    Revision(u8),
    /// PD_Length over 512.
    #[error("MPA private data length {0} over the maximum of 512")]
    PrivateDataTooLong(usize),
    /// Revision 2 with H set but private data too short for IRD/ORD.
    #[error("MPA v2 frame without room for IRD/ORD (private data {0} bytes)")]
    NoIrdOrd(usize),
}

impl FrameRepr {
    /// Parses a frame of `kind` from the start of `b`; returns it and the
    /// bytes it took.
    ///
    /// # Errors
    /// [`FrameError::Incomplete`] until the whole frame is present; the
    /// others for a frame the connection must refuse.
    pub fn parse(b: &[u8], kind: FrameKind) -> Result<(Self, usize), FrameError> {
        if b.len() < FRAME_HEADER_LEN {
            return Err(FrameError::Incomplete(FRAME_HEADER_LEN));
        }
        let key = match kind {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        };
        if &b[field::KEY] != key {
            return Err(FrameError::BadKey { expected: kind });
        }
        let flags = b[field::FLAGS];
        let revision = b[field::REV];
        if !(1..=2).contains(&revision) {
            return Err(FrameError::Revision(revision));
        }
        let pd_len = usize::from(u16::from_be_bytes([
            b[field::PD_LEN.start],
            b[field::PD_LEN.start + 1],
        ]));
        if pd_len > MAX_PRIVATE_DATA {
            return Err(FrameError::PrivateDataTooLong(pd_len));
        }
        let total = FRAME_HEADER_LEN + pd_len;
        if b.len() < total {
            return Err(FrameError::Incomplete(total));
        }
        let mut pd = &b[FRAME_HEADER_LEN..total];
        let ird_ord = if revision == 2 && flags & FLAG_H != 0 {
            if pd.len() < IRD_ORD_LEN {
                return Err(FrameError::NoIrdOrd(pd.len()));
            }
            let ird = u16::from_be_bytes([pd[0], pd[1]]);
            let ord = u16::from_be_bytes([pd[2], pd[3]]);
            pd = &pd[IRD_ORD_LEN..];
            Some(IrdOrd {
                ird: ird & MAX_IRD_ORD,
                ord: ord & MAX_IRD_ORD,
                peer_to_peer: ird & IRD_P2P != 0,
                zero_length_rtr: ird & IRD_ZERO_RTR != 0,
                write_rtr: ord & ORD_WRITE_RTR != 0,
                read_rtr: ord & ORD_READ_RTR != 0,
            })
        } else {
            None
        };
        let repr = FrameRepr {
            kind,
            markers: flags & FLAG_M != 0,
            crc: flags & FLAG_C != 0,
            reject: flags & FLAG_R != 0,
            revision,
            ird_ord,
            private_data: pd.to_vec(),
        };
        Ok((repr, total))
    }

    /// A frame as this crate sends it: no markers, no reject, and for an
    /// `ird_ord` of (IRD, ORD) the RFC 6581 block without RTR flags.
    pub fn ours(
        kind: FrameKind,
        crc: bool,
        revision: u8,
        ird_ord: Option<(u16, u16)>,
        private_data: &[u8],
    ) -> Self {
        FrameRepr {
            kind,
            markers: false,
            crc,
            reject: false,
            revision,
            ird_ord: ird_ord.map(|(ird, ord)| IrdOrd {
                ird,
                ord,
                ..IrdOrd::default()
            }),
            private_data: private_data.to_vec(),
        }
    }

    /// The whole frame's length from its first [`FRAME_HEADER_LEN`] bytes
    /// (PD_Length capped at 512: a longer one is refused by `parse`).
    pub fn wire_len(header: &[u8]) -> usize {
        let pd = header
            .get(field::PD_LEN)
            .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
        FRAME_HEADER_LEN + pd.min(MAX_PRIVATE_DATA)
    }

    /// Bytes [`FrameRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN + self.ird_ord.map_or(0, |_| IRD_ORD_LEN) + self.private_data.len()
    }

    /// Appends the frame to `out`.
    ///
    /// # Panics
    /// If the private data (with the IRD/ORD block) exceeds 512 bytes: the
    /// connection checks its configuration before building frames.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let pd_len = self.buffer_len() - FRAME_HEADER_LEN;
        assert!(
            pd_len <= MAX_PRIVATE_DATA,
            "MPA private data over 512 bytes"
        );
        out.extend_from_slice(match self.kind {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        });
        let mut flags = 0;
        for (on, bit) in [
            (self.markers, FLAG_M),
            (self.crc, FLAG_C),
            (self.reject, FLAG_R),
        ] {
            if on {
                flags |= bit;
            }
        }
        if self.ird_ord.is_some() {
            flags |= FLAG_H;
        }
        out.push(flags);
        out.push(self.revision);
        out.extend_from_slice(&(pd_len as u16).to_be_bytes());
        if let Some(io) = self.ird_ord {
            let mut ird = io.ird.min(MAX_IRD_ORD);
            let mut ord = io.ord.min(MAX_IRD_ORD);
            for (on, bit) in [
                (io.peer_to_peer, IRD_P2P),
                (io.zero_length_rtr, IRD_ZERO_RTR),
            ] {
                if on {
                    ird |= bit;
                }
            }
            for (on, bit) in [(io.write_rtr, ORD_WRITE_RTR), (io.read_rtr, ORD_READ_RTR)] {
                if on {
                    ord |= bit;
                }
            }
            out.extend_from_slice(&ird.to_be_bytes());
            out.extend_from_slice(&ord.to_be_bytes());
        }
        out.extend_from_slice(&self.private_data);
    }
}

/// CRC32c (Castagnoli) as MPA computes it: the iSCSI CRC (RFC 3720 B.4),
/// sent least significant byte first as Linux siw and iSCSI do.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Pad bytes after a ULPDU of `ulpdu_len` bytes.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (2 + ulpdu_len) % 4) % 4
}

/// Length of the FPDU carrying a ULPDU of `ulpdu_len` bytes.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    2 + ulpdu_len + pad_len(ulpdu_len) + 4
}

/// Appends the FPDU around `ulpdu` (at most 65535 bytes) to `out`. The CRC
/// field is always there; with CRCs off we send zero and the receiver
/// ignores it.
///
/// # Panics
/// If `ulpdu` is longer than 65535 bytes.
pub fn emit_fpdu(ulpdu: &[u8], crc: bool, out: &mut Vec<u8>) {
    let len = u16::try_from(ulpdu.len()).expect("ULPDU fits the 16-bit length");
    let start = out.len();
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(ulpdu);
    out.extend(core::iter::repeat_n(0, pad_len(ulpdu.len())));
    let c = if crc { crc32c(&out[start..]) } else { 0 };
    out.extend_from_slice(&c.to_le_bytes());
}

/// IPv4 and TCP header bytes per segment with timestamps (20 + 20 + 12).
pub const TCP_IPV4_OVERHEAD: u32 = 52;
/// IPv6 and TCP header bytes per segment with timestamps (40 + 20 + 12).
pub const TCP_IPV6_OVERHEAD: u32 = 72;

/// MULPDU, the largest ULPDU that keeps one FPDU in one TCP segment, for a
/// path MTU and the IP+TCP overhead of a segment (RFC 5044, markers
/// off: MULPDU = EMSS - (6 + EMSS mod 4)), at most 65535. A path too small
/// gives a value the connection's configuration check refuses.
pub fn mulpdu(path_mtu: u32, tcp_overhead: u32) -> u16 {
    let emss = path_mtu.saturating_sub(tcp_overhead);
    let m = emss.saturating_sub(6 + emss % 4);
    m.min(u32::from(u16::MAX)) as u16
}

/// The receiving half of MPA's FPDU framing over a byte stream: bytes in,
/// whole checked ULPDUs out, with any split or join of FPDUs.
///
/// Memory is bounded by one FPDU (at most 65535 + 10 bytes). After an error
/// the receiver stays failed: the stream's framing is gone.
#[derive(Debug)]
pub struct FpduReceiver {
    crc: bool,
    min_ulpdu: usize,
    buf: Vec<u8>,
    /// The whole FPDU's length once its ULPDU Length field is in.
    need: Option<usize>,
    /// The previous FPDU was handed out; clear before taking more bytes.
    delivered: bool,
    failed: Option<TermCause>,
}

impl FpduReceiver {
    /// A receiver; `crc` is whether the connection negotiated CRCs, and a
    /// ULPDU Length below `min_ulpdu` (the ULP's smallest header) cannot
    /// begin an FPDU.
    pub fn new(crc: bool, min_ulpdu: usize) -> Self {
        FpduReceiver {
            crc,
            min_ulpdu,
            buf: Vec::new(),
            need: None,
            delivered: false,
            failed: None,
        }
    }

    /// Takes bytes from the front of `input` until one FPDU is complete and
    /// returns its ULPDU (borrowed until the next call), or `None` once
    /// `input` is empty with no FPDU complete. Bounded: copies at most one
    /// FPDU's bytes per call.
    ///
    /// # Errors
    /// The TERMINATE cause: [`TermCause::MpaCrc`] for a CRC mismatch,
    /// [`TermCause::MpaFraming`] for a ULPDU Length below `min_ulpdu` (no
    /// such FPDU exists, so the framing is lost).
    pub fn poll(&mut self, input: &mut &[u8]) -> Result<Option<&[u8]>, TermCause> {
        if let Some(c) = self.failed {
            return Err(c);
        }
        if self.delivered {
            self.buf.clear();
            self.need = None;
            self.delivered = false;
        }
        loop {
            let want = self.need.unwrap_or(2);
            let take = (want - self.buf.len()).min(input.len());
            self.buf.extend_from_slice(&input[..take]);
            *input = &input[take..];
            if self.buf.len() < want {
                return Ok(None);
            }
            if self.need.is_none() {
                let ulpdu_len = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
                if ulpdu_len < self.min_ulpdu {
                    self.failed = Some(TermCause::MpaFraming);
                    return Err(TermCause::MpaFraming);
                }
                let total = fpdu_len(ulpdu_len);
                self.buf.reserve_exact(total - self.buf.len());
                self.need = Some(total);
                continue;
            }
            let n = self.buf.len();
            if self.crc {
                let got = u32::from_le_bytes([
                    self.buf[n - 4],
                    self.buf[n - 3],
                    self.buf[n - 2],
                    self.buf[n - 1],
                ]);
                if crc32c(&self.buf[..n - 4]) != got {
                    self.failed = Some(TermCause::MpaCrc);
                    return Err(TermCause::MpaCrc);
                }
            }
            self.delivered = true;
            let ulpdu_len = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
            return Ok(Some(&self.buf[2..2 + ulpdu_len]));
        }
    }

    /// Whether the receiver holds part of an FPDU (bytes taken, none given).
    pub fn mid_fpdu(&self) -> bool {
        !self.delivered && !self.buf.is_empty()
    }
}
