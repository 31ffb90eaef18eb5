//! DDP segment headers (RFC 5041) with the RDMAP control byte
//! (RFC 5040) they carry, and message segmentation.
//!
//! Byte 0 is DDP's: T (tagged), L (last), 4 reserved bits, DV (version).
//! Byte 1 is the ULP's (RsvdULP); RDMAP puts RV (version), 2 reserved bits
//! and its opcode there. A tagged header is 14 bytes, an untagged one 18.

use crate::rdmap::{Opcode, RDMAP_VERSION};
use crate::terminate::TermCause;
use crate::types::{Msn, STag};

/// DDP version (RFC 5041).
pub const DDP_VERSION: u8 = 1;
/// Length of a tagged header.
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged header.
pub const UNTAGGED_HEADER_LEN: usize = 18;
/// The T bit of byte 0.
pub const FLAG_TAGGED: u8 = 0x80;
/// The L bit of byte 0.
pub const FLAG_LAST: u8 = 0x40;

mod field {
    use core::ops::Range;
    /// T (7), L (6), reserved (5-2), DV (1-0).
    pub const DDP_CTRL: usize = 0;
    /// RV (7-6), reserved (5-4), opcode (3-0).
    pub const RDMAP_CTRL: usize = 1;
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    /// RsvdULP of an untagged segment: RDMAP's Invalidate STag.
    pub const INV_STAG: Range<usize> = 2..6;
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
}

/// A view of a DDP segment (header and payload), as an MPA ULPDU.
#[derive(Debug, Clone)]
pub struct DdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl<T: AsRef<[u8]>> DdpPacket<T> {
    /// Wraps a buffer holding at least the header its T bit names.
    ///
    /// # Errors
    /// The cause to TERMINATE with: a ULPDU too short for its own header
    /// has lost its framing ([`TermCause::MpaFraming`]).
    pub fn new_checked(buffer: T) -> Result<Self, TermCause> {
        let b = buffer.as_ref();
        if b.len() < TAGGED_HEADER_LEN
            || (b[field::DDP_CTRL] & FLAG_TAGGED == 0 && b.len() < UNTAGGED_HEADER_LEN)
        {
            return Err(TermCause::MpaFraming);
        }
        Ok(DdpPacket { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The T bit.
    pub fn tagged(&self) -> bool {
        self.b()[field::DDP_CTRL] & FLAG_TAGGED != 0
    }
    /// The L bit.
    pub fn last(&self) -> bool {
        self.b()[field::DDP_CTRL] & FLAG_LAST != 0
    }
    /// DV.
    pub fn ddp_version(&self) -> u8 {
        self.b()[field::DDP_CTRL] & 0x3
    }
    /// RV.
    pub fn rdmap_version(&self) -> u8 {
        self.b()[field::RDMAP_CTRL] >> 6
    }
    /// The RDMAP opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.b()[field::RDMAP_CTRL])
    }
    /// Header length by the T bit.
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }
    /// STag (tagged).
    pub fn stag(&self) -> STag {
        STag(be32(&self.b()[field::STAG]))
    }
    /// Tagged offset (tagged).
    pub fn to(&self) -> u64 {
        u64::from_be_bytes(self.b()[field::TO].try_into().unwrap_or_default())
    }
    /// RsvdULP as RDMAP's Invalidate STag (untagged).
    pub fn inv_stag(&self) -> STag {
        STag(be32(&self.b()[field::INV_STAG]))
    }
    /// Queue number (untagged).
    pub fn qn(&self) -> u32 {
        be32(&self.b()[field::QN])
    }
    /// Message sequence number (untagged).
    pub fn msn(&self) -> Msn {
        Msn(be32(&self.b()[field::MSN]))
    }
    /// Message offset (untagged).
    pub fn mo(&self) -> u32 {
        be32(&self.b()[field::MO])
    }
    /// The header bytes.
    pub fn header(&self) -> &[u8] {
        &self.b()[..self.header_len()]
    }
    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

/// Where a segment goes: the DDP buffer model's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Tagged buffer model (RFC 5041).
    Tagged {
        /// Data sink STag.
        stag: STag,
        /// Data sink tagged offset of this segment's first byte.
        to: u64,
    },
    /// Untagged buffer model (RFC 5041).
    Untagged {
        /// RsvdULP: RDMAP's Invalidate STag (zero unless Send with Invalidate).
        inv_stag: STag,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: Msn,
        /// Message offset of this segment's first byte.
        mo: u32,
    },
}

/// A validated DDP+RDMAP segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRepr {
    /// Last segment of its message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// Buffer model and its fields.
    pub placement: Placement,
}

impl SegmentRepr {
    /// Checks versions and that the opcode fits the buffer model.
    ///
    /// # Errors
    /// The TERMINATE cause: DDP version (RFC 5041, per model), RDMAP
    /// version, or unexpected opcode (RFC 5040).
    pub fn parse<T: AsRef<[u8]>>(p: &DdpPacket<T>) -> Result<Self, TermCause> {
        if p.ddp_version() != DDP_VERSION {
            return Err(if p.tagged() {
                TermCause::DdpTaggedVersion
            } else {
                TermCause::DdpUntaggedVersion
            });
        }
        if p.rdmap_version() != RDMAP_VERSION {
            return Err(TermCause::RdmapVersion);
        }
        let opcode = p.opcode();
        match opcode.info() {
            Some(i) if i.tagged == p.tagged() => {}
            _ => return Err(TermCause::RdmapUnexpectedOpcode),
        }
        let placement = if p.tagged() {
            Placement::Tagged {
                stag: p.stag(),
                to: p.to(),
            }
        } else {
            Placement::Untagged {
                inv_stag: p.inv_stag(),
                qn: p.qn(),
                msn: p.msn(),
                mo: p.mo(),
            }
        };
        Ok(SegmentRepr {
            last: p.last(),
            opcode,
            placement,
        })
    }

    /// Header length.
    pub fn buffer_len(&self) -> usize {
        match self.placement {
            Placement::Tagged { .. } => TAGGED_HEADER_LEN,
            Placement::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Appends the header to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let tagged = matches!(self.placement, Placement::Tagged { .. });
        let mut c = DDP_VERSION;
        if tagged {
            c |= FLAG_TAGGED;
        }
        if self.last {
            c |= FLAG_LAST;
        }
        out.push(c);
        out.push(RDMAP_VERSION << 6 | u8::from(self.opcode));
        match self.placement {
            Placement::Tagged { stag, to } => {
                out.extend_from_slice(&stag.0.to_be_bytes());
                out.extend_from_slice(&to.to_be_bytes());
            }
            Placement::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => {
                out.extend_from_slice(&inv_stag.0.to_be_bytes());
                out.extend_from_slice(&qn.to_be_bytes());
                out.extend_from_slice(&msn.0.to_be_bytes());
                out.extend_from_slice(&mo.to_be_bytes());
            }
        }
    }
}

/// Splits a message of `len` bytes into segments whose ULPDU (header of
/// `header_len` plus payload) fits in `mulpdu`: yields (offset, length,
/// last). A zero-length message is one empty segment (RFC 5041).
///
/// # Panics
/// If `mulpdu` leaves no room for payload (`mulpdu <= header_len`);
/// [`crate::mpa::mulpdu`] never returns such a value.
pub fn segments(
    len: u32,
    header_len: usize,
    mulpdu: u16,
) -> impl Iterator<Item = (u32, u32, bool)> {
    let room = usize::from(mulpdu)
        .checked_sub(header_len)
        .filter(|r| *r > 0)
        .expect("MULPDU leaves room for payload") as u32;
    let mut off = 0u32;
    let mut done = false;
    core::iter::from_fn(move || {
        if done {
            return None;
        }
        let n = (len - off).min(room);
        let at = off;
        off += n;
        done = off == len;
        Some((at, n, done))
    })
}
