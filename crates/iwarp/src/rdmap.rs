//! RDMAP opcodes and the Read Request header (RFC 5040).

use core::fmt;

use crate::types::STag;

/// RDMAP version carried in every segment (RFC 5040).
pub const RDMAP_VERSION: u8 = 1;

/// DDP untagged queue numbers RDMAP uses (RFC 5040).
pub mod qn {
    /// Send, Send with Invalidate, Send with SE (and Invalidate).
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
}

/// What an opcode carries and where: one row per RFC 5040 opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Uses the tagged buffer model.
    pub tagged: bool,
    /// Untagged queue number (for untagged opcodes).
    pub queue: u32,
    /// Solicited event.
    pub solicited: bool,
    /// Carries an STag to invalidate in the DDP RsvdULP field.
    pub invalidate: bool,
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $v:expr, $text:expr, tagged: $t:expr, queue: $q:expr, se: $se:expr, inv: $inv:expr; )*) => {
        /// An RDMAP opcode (4 bits). Every value parses.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( $(#[$doc])* $name, )*
            /// A value RFC 5040 does not define.
            Unknown(u8),
        }

        impl Opcode {
            /// Every defined opcode.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// The row of the table, or `None` for an unknown value.
            pub const fn info(self) -> Option<OpcodeInfo> {
                match self {
                    $( Opcode::$name => Some(OpcodeInfo { tagged: $t, queue: $q, solicited: $se, invalidate: $inv }), )*
                    Opcode::Unknown(_) => None,
                }
            }

            /// The RFC's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $text, )*
                    Opcode::Unknown(_) => "unknown",
                }
            }
        }

        impl From<u8> for Opcode {
            fn from(v: u8) -> Self {
                match v & 0xf {
                    $( $v => Opcode::$name, )*
                    n => Opcode::Unknown(n),
                }
            }
        }

        impl From<Opcode> for u8 {
            fn from(o: Opcode) -> u8 {
                match o {
                    $( Opcode::$name => $v, )*
                    Opcode::Unknown(n) => n & 0xf,
                }
            }
        }
    };
}

opcodes! {
    /// RDMA Write (0000b).
    RdmaWrite = 0x0, "RDMA Write", tagged: true, queue: 0, se: false, inv: false;
    /// RDMA Read Request (0001b), on queue 1.
    ReadRequest = 0x1, "RDMA Read Request", tagged: false, queue: qn::READ_REQUEST, se: false, inv: false;
    /// RDMA Read Response (0010b).
    ReadResponse = 0x2, "RDMA Read Response", tagged: true, queue: 0, se: false, inv: false;
    /// Send (0011b).
    Send = 0x3, "Send", tagged: false, queue: qn::SEND, se: false, inv: false;
    /// Send with Invalidate (0100b).
    SendInvalidate = 0x4, "Send with Invalidate", tagged: false, queue: qn::SEND, se: false, inv: true;
    /// Send with Solicited Event (0101b).
    SendSe = 0x5, "Send with Solicited Event", tagged: false, queue: qn::SEND, se: true, inv: false;
    /// Send with Solicited Event and Invalidate (0110b).
    SendSeInvalidate = 0x6, "Send with Solicited Event and Invalidate", tagged: false, queue: qn::SEND, se: true, inv: true;
    /// Terminate (0111b), on queue 2.
    Terminate = 0x7, "Terminate", tagged: false, queue: qn::TERMINATE, se: false, inv: false;
}

impl Opcode {
    /// The Send opcode with the given solicited-event and invalidate bits.
    pub fn send(solicited: bool, invalidate: bool) -> Opcode {
        match (solicited, invalidate) {
            (false, false) => Opcode::Send,
            (false, true) => Opcode::SendInvalidate,
            (true, false) => Opcode::SendSe,
            (true, true) => Opcode::SendSeInvalidate,
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(n) => write!(f, "unknown RDMAP opcode {n:#x}"),
            o => f.write_str(o.name()),
        }
    }
}

/// Length of the RDMA Read Request header (RFC 5040 4.4).
pub const READ_REQUEST_LEN: usize = 28;

mod field {
    use core::ops::Range;
    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SRC_STAG: Range<usize> = 16..20;
    pub const SRC_TO: Range<usize> = 20..28;
}

/// The RDMA Read Request header: the untagged payload of a Read Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestRepr {
    /// Data Sink STag (the requester's buffer).
    pub sink_stag: STag,
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMA Read Message Size.
    pub size: u32,
    /// Data Source STag (the responder's buffer).
    pub src_stag: STag,
    /// Data Source Tagged Offset.
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Parses the 28-byte header; `None` if the payload is not exactly that
    /// long (RFC 5040 4.4: the request is one segment of this size).
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() != READ_REQUEST_LEN {
            return None;
        }
        let u32_at =
            |r: core::ops::Range<usize>| u32::from_be_bytes(b[r].try_into().unwrap_or_default());
        let u64_at =
            |r: core::ops::Range<usize>| u64::from_be_bytes(b[r].try_into().unwrap_or_default());
        Some(ReadRequestRepr {
            sink_stag: STag(u32_at(field::SINK_STAG)),
            sink_to: u64_at(field::SINK_TO),
            size: u32_at(field::SIZE),
            src_stag: STag(u32_at(field::SRC_STAG)),
            src_to: u64_at(field::SRC_TO),
        })
    }

    /// Appends the header to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sink_stag.0.to_be_bytes());
        out.extend_from_slice(&self.sink_to.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.src_stag.0.to_be_bytes());
        out.extend_from_slice(&self.src_to.to_be_bytes());
    }
}
