//! TERMINATE causes (the error codes of RFC 5040, RFC 5041, RFC 5044 and
//! RFC 6581, as Linux siw numbers them too) and the TERMINATE message body
//! (RFC 5040 4.8).
//!
//! One table holds every (layer, error type, error code) triple this crate
//! sends or names; parsing never fails on a triple outside it ([`TermCode`]
//! keeps the raw fields and says "unknown").

use core::fmt;

/// The layer a TERMINATE blames (RFC 5040 section 4.8, the Layer field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// RDMAP (0).
    Rdmap,
    /// DDP (1).
    Ddp,
    /// The lower layer protocol, here MPA (2).
    Llp,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for Layer {
    fn from(v: u8) -> Self {
        match v {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            n => Layer::Unknown(n),
        }
    }
}

impl From<Layer> for u8 {
    fn from(l: Layer) -> u8 {
        match l {
            Layer::Rdmap => 0,
            Layer::Ddp => 1,
            Layer::Llp => 2,
            Layer::Unknown(n) => n,
        }
    }
}

macro_rules! term_causes {
    ($( $(#[$doc:meta])* $name:ident = ($layer:expr, $etype:expr, $code:expr, $text:expr), )*) => {
        /// A TERMINATE cause this crate knows: one row of the RFCs' tables.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum TermCause {
            $( $(#[$doc])* $name, )*
        }

        impl TermCause {
            /// Every cause, in table order.
            pub const ALL: &'static [TermCause] = &[$(TermCause::$name,)*];

            /// The raw (layer, error type, error code) triple.
            pub const fn code(self) -> TermCode {
                match self {
                    $( TermCause::$name => TermCode { layer: $layer, etype: $etype, ecode: $code }, )*
                }
            }

            /// The RFC's words for the cause.
            pub const fn text(self) -> &'static str {
                match self {
                    $( TermCause::$name => $text, )*
                }
            }

            /// The cause a raw triple names, if it is in the table.
            pub fn from_code(c: TermCode) -> Option<TermCause> {
                Self::ALL.iter().copied().find(|k| k.code() == c)
            }
        }
    };
}

// Layer 0 RDMAP, 1 DDP, 2 LLP (MPA, error type 0).
term_causes! {
    /// RFC 5040: local catastrophic error.
    RdmapLocalCatastrophic = (0, 0x0, 0x00, "RDMAP local catastrophic error"),
    /// RFC 5040: remote protection, invalid STag.
    RdmapInvalidStag = (0, 0x1, 0x00, "RDMAP remote protection error: invalid STag"),
    /// RFC 5040: remote protection, base or bounds violation.
    RdmapBaseBounds = (0, 0x1, 0x01, "RDMAP remote protection error: base or bounds violation"),
    /// RFC 5040: remote protection, access rights violation.
    RdmapAccessRights = (0, 0x1, 0x02, "RDMAP remote protection error: access rights violation"),
    /// RFC 5040: remote protection, STag not associated with the stream.
    RdmapStagNotAssociated = (0, 0x1, 0x03, "RDMAP remote protection error: STag not associated with RDMAP stream"),
    /// RFC 5040: remote protection, tagged offset wrap.
    RdmapToWrap = (0, 0x1, 0x04, "RDMAP remote protection error: TO wrap"),
    /// RFC 5040: remote protection, STag cannot be invalidated.
    RdmapCannotInvalidate = (0, 0x1, 0x09, "RDMAP remote protection error: STag cannot be invalidated"),
    /// RFC 5040: remote protection, unspecified.
    RdmapProtectionUnspecified = (0, 0x1, 0xff, "RDMAP remote protection error: unspecified"),
    /// RFC 5040: remote operation, invalid RDMAP version.
    RdmapVersion = (0, 0x2, 0x05, "RDMAP remote operation error: invalid RDMAP version"),
    /// RFC 5040: remote operation, unexpected opcode.
    RdmapUnexpectedOpcode = (0, 0x2, 0x06, "RDMAP remote operation error: unexpected opcode"),
    /// RFC 5040: remote operation, catastrophic error local to the stream.
    RdmapStreamCatastrophic = (0, 0x2, 0x07, "RDMAP remote operation error: catastrophic error localized to RDMAP stream"),
    /// RFC 5040: remote operation, catastrophic global error.
    RdmapGlobalCatastrophic = (0, 0x2, 0x08, "RDMAP remote operation error: catastrophic error global"),
    /// RFC 5040: remote operation, unspecified.
    RdmapOperationUnspecified = (0, 0x2, 0xff, "RDMAP remote operation error: unspecified"),
    /// RFC 5041: local catastrophic.
    DdpLocalCatastrophic = (1, 0x0, 0x00, "DDP local catastrophic error"),
    /// RFC 5041: tagged buffer, invalid STag.
    DdpInvalidStag = (1, 0x1, 0x00, "DDP tagged buffer error: invalid STag"),
    /// RFC 5041: tagged buffer, base or bounds violation.
    DdpBaseBounds = (1, 0x1, 0x01, "DDP tagged buffer error: base or bounds violation"),
    /// RFC 5041: tagged buffer, STag not associated with the stream.
    DdpStagNotAssociated = (1, 0x1, 0x02, "DDP tagged buffer error: STag not associated with DDP stream"),
    /// RFC 5041: tagged buffer, TO wrap.
    DdpToWrap = (1, 0x1, 0x03, "DDP tagged buffer error: TO wrap"),
    /// RFC 5041: tagged buffer, invalid DDP version.
    DdpTaggedVersion = (1, 0x1, 0x04, "DDP tagged buffer error: invalid DDP version"),
    /// RFC 5041: untagged buffer, invalid QN.
    DdpInvalidQn = (1, 0x2, 0x01, "DDP untagged buffer error: invalid QN"),
    /// RFC 5041: untagged buffer, invalid MSN, no buffer available.
    DdpNoBuffer = (1, 0x2, 0x02, "DDP untagged buffer error: invalid MSN - no buffer available"),
    /// RFC 5041: untagged buffer, invalid MSN, MSN range.
    DdpMsnRange = (1, 0x2, 0x03, "DDP untagged buffer error: invalid MSN - MSN range"),
    /// RFC 5041: untagged buffer, invalid MO.
    DdpInvalidMo = (1, 0x2, 0x04, "DDP untagged buffer error: invalid MO"),
    /// RFC 5041: untagged buffer, message too long for the buffer.
    DdpTooLong = (1, 0x2, 0x05, "DDP untagged buffer error: DDP message too long for available buffer"),
    /// RFC 5041: untagged buffer, invalid DDP version.
    DdpUntaggedVersion = (1, 0x2, 0x06, "DDP untagged buffer error: invalid DDP version"),
    /// RFC 5044: TCP connection closed, terminated or lost.
    MpaConnectionLost = (2, 0x0, 0x01, "MPA error: TCP connection closed, terminated or lost"),
    /// RFC 5044: received MPA CRC does not match.
    MpaCrc = (2, 0x0, 0x02, "MPA error: received MPA CRC does not match"),
    /// RFC 5044: marker and ULPDU Length mismatch. Without markers we use
    /// it for a ULPDU Length that cannot start an FPDU (framing is lost).
    MpaFraming = (2, 0x0, 0x03, "MPA error: received MPA marker and ULPDU Length field mismatch"),
    /// RFC 5044: invalid MPA request or reply frame.
    MpaInvalidFrame = (2, 0x0, 0x04, "MPA error: received invalid MPA request or reply frame"),
    /// RFC 6581: local catastrophic.
    MpaLocalCatastrophic = (2, 0x0, 0x05, "MPA error: local catastrophic"),
    /// RFC 6581: insufficient IRD resources.
    MpaInsufficientIrd = (2, 0x0, 0x06, "MPA error: insufficient IRD resources"),
    /// RFC 6581: no matching RTR option.
    MpaNoMatchingRtr = (2, 0x0, 0x07, "MPA error: no matching RTR option"),
}

impl fmt::Display for TermCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.code();
        write!(
            f,
            "{} (layer {} type {:#x} code {:#04x})",
            self.text(),
            c.layer,
            c.etype,
            c.ecode
        )
    }
}

/// The raw cause fields of a TERMINATE as they came off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// Layer (4 bits).
    pub layer: u8,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub ecode: u8,
}

impl TermCode {
    /// The layer blamed.
    pub fn layer(self) -> Layer {
        Layer::from(self.layer)
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match TermCause::from_code(*self) {
            Some(c) => c.fmt(f),
            None => write!(
                f,
                "unknown TERMINATE cause (layer {} type {:#x} code {:#04x})",
                self.layer, self.etype, self.ecode
            ),
        }
    }
}

/// Length of the Terminate Control field.
pub const CONTROL_LEN: usize = 4;
/// Length of the Terminated RDMA header (a Read Request's, RFC 5040 4.8).
pub const RDMA_HEADER_LEN: usize = 28;

mod field {
    /// Layer (bits 7-4), EType (bits 3-0).
    pub const LAYER_ETYPE: usize = 0;
    pub const ECODE: usize = 1;
    /// M (bit 7), D (bit 6), R (bit 5), 5 reserved bits.
    pub const HDRCT: usize = 2;
    pub const SEG_LEN: core::ops::Range<usize> = 4..6;
}

const FLAG_M: u8 = 0x80;
const FLAG_D: u8 = 0x40;
const FLAG_R: u8 = 0x20;

/// The body of a TERMINATE message (the untagged DDP payload).
///
/// Our reading of RFC 5040 4.8 (and Linux siw's layout): Terminate Control,
/// then, when M is set, the DDP Segment Length (the MPA ULPDU Length, two
/// bytes) immediately followed when D is set by the terminated DDP header,
/// then when R is set the 28-byte terminated RDMA header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminateRepr {
    /// The cause.
    pub code: TermCode,
    /// DDP Segment Length of the offending segment (M).
    pub segment_len: Option<u16>,
    /// The offending segment's DDP header (D), 14 or 18 bytes.
    pub ddp_header: Option<Vec<u8>>,
    /// The offending segment's RDMA header (R), a Read Request's 28 bytes.
    pub rdma_header: Option<[u8; RDMA_HEADER_LEN]>,
}

/// A TERMINATE body that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TerminateError {
    /// Shorter than its header control bits promise.
    #[error("TERMINATE body truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
}

impl TerminateRepr {
    /// Parses a TERMINATE body. Bytes after the described headers are
    /// ignored (RFC 5040 allows none, but they carry no meaning).
    ///
    /// # Errors
    /// [`TerminateError::Truncated`] when a promised field is missing.
    pub fn parse(b: &[u8]) -> Result<Self, TerminateError> {
        let need = |n: usize| {
            if b.len() < n {
                Err(TerminateError::Truncated {
                    need: n,
                    have: b.len(),
                })
            } else {
                Ok(())
            }
        };
        need(CONTROL_LEN)?;
        let code = TermCode {
            layer: b[field::LAYER_ETYPE] >> 4,
            etype: b[field::LAYER_ETYPE] & 0xf,
            ecode: b[field::ECODE],
        };
        let hdrct = b[field::HDRCT];
        let mut at = CONTROL_LEN;
        let mut segment_len = None;
        let mut ddp_header = None;
        if hdrct & (FLAG_M | FLAG_D) != 0 {
            need(field::SEG_LEN.end)?;
            let len = u16::from_be_bytes([b[4], b[5]]);
            at = field::SEG_LEN.end;
            if hdrct & FLAG_M != 0 {
                segment_len = Some(len);
            }
            if hdrct & FLAG_D != 0 {
                need(at + 1)?;
                let hlen = if b[at] & crate::ddp::FLAG_TAGGED != 0 {
                    crate::ddp::TAGGED_HEADER_LEN
                } else {
                    crate::ddp::UNTAGGED_HEADER_LEN
                };
                need(at + hlen)?;
                ddp_header = Some(b[at..at + hlen].to_vec());
                at += hlen;
            }
        }
        let mut rdma_header = None;
        if hdrct & FLAG_R != 0 {
            need(at + RDMA_HEADER_LEN)?;
            let mut h = [0; RDMA_HEADER_LEN];
            h.copy_from_slice(&b[at..at + RDMA_HEADER_LEN]);
            rdma_header = Some(h);
        }
        Ok(TerminateRepr {
            code,
            segment_len,
            ddp_header,
            rdma_header,
        })
    }

    /// Bytes [`TerminateRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        let mut n = CONTROL_LEN;
        if self.segment_len.is_some() || self.ddp_header.is_some() {
            n += 2 + self.ddp_header.as_ref().map_or(0, Vec::len);
        }
        n + self.rdma_header.map_or(0, |h| h.len())
    }

    /// Appends the body to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut hdrct = 0;
        if self.segment_len.is_some() {
            hdrct |= FLAG_M;
        }
        if self.ddp_header.is_some() {
            hdrct |= FLAG_D;
        }
        if self.rdma_header.is_some() {
            hdrct |= FLAG_R;
        }
        out.push((self.code.layer & 0xf) << 4 | (self.code.etype & 0xf));
        out.push(self.code.ecode);
        out.push(hdrct);
        out.push(0);
        if self.segment_len.is_some() || self.ddp_header.is_some() {
            out.extend_from_slice(&self.segment_len.unwrap_or(0).to_be_bytes());
            if let Some(h) = &self.ddp_header {
                out.extend_from_slice(h);
            }
        }
        if let Some(h) = &self.rdma_header {
            out.extend_from_slice(h);
        }
    }
}
