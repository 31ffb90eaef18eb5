//! Errors of parsing and emitting. Each names the header and says what was
//! wrong, so a dropped packet can be logged in words.

use crate::Opcode;

/// Why bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than the header or its length field needs.
    #[error("{what}: truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Header being parsed.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value this layer does not accept.
    #[error("{what}: {reason}")]
    Malformed {
        /// Header being parsed.
        what: &'static str,
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// IPv4 header or UDP checksum does not match the bytes.
    #[error("{what} checksum mismatch: carried {carried:#06x}, computed {computed:#06x}")]
    Checksum {
        /// "IPv4 header" or "UDP".
        what: &'static str,
        /// Value in the packet.
        carried: u16,
        /// Value computed over the packet.
        computed: u16,
    },
    /// The invariant CRC does not match (IBA Annex A17, RoCEv2): the packet must be
    /// dropped silently.
    #[error("ICRC mismatch: carried {carried:#010x}, computed {computed:#010x}")]
    Icrc {
        /// Value in the packet.
        carried: u32,
        /// Value computed over the packet.
        computed: u32,
    },
    /// The BTH opcode is outside the table, so the headers after it are
    /// unknown.
    #[error("opcode {0:#04x} is not an RC, UC, UD or CNP opcode: its headers are unknown")]
    UnknownOpcode(u8),
    /// Payload length or pad count breaks the opcode's payload rule.
    #[error("{opcode}: {reason} (payload {payload} bytes, pad count {pad})")]
    Payload {
        /// The packet's opcode.
        opcode: Opcode,
        /// Which rule is broken.
        reason: &'static str,
        /// Payload bytes, pad excluded.
        payload: usize,
        /// BTH pad count.
        pad: u8,
    },
}

/// Why a repr could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The output buffer is shorter than `buffer_len()`.
    #[error("buffer too small: {need} bytes needed, {have} present")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The opcode is outside the table.
    #[error("opcode {0:#04x} is not an RC, UC, UD or CNP opcode")]
    UnknownOpcode(u8),
    /// The extension headers present differ from the ones the opcode
    /// table lists.
    #[error("{opcode}: extension header {header} is {state}")]
    Headers {
        /// The packet's opcode.
        opcode: Opcode,
        /// The header in question.
        header: &'static str,
        /// "missing" or "not allowed".
        state: &'static str,
    },
    /// Payload length breaks the opcode's payload rule, or the BTH pad
    /// count is not the one the payload length calls for.
    #[error("{opcode}: {reason} (payload {payload} bytes, pad count {pad})")]
    Payload {
        /// The packet's opcode.
        opcode: Opcode,
        /// Which rule is broken.
        reason: &'static str,
        /// Payload bytes.
        payload: usize,
        /// BTH pad count.
        pad: u8,
    },
    /// The datagram does not fit the 16-bit length fields of IP/UDP.
    #[error("datagram too long for IP/UDP length fields: {len} bytes")]
    TooLong {
        /// Bytes the length field would have to hold.
        len: usize,
    },
}
