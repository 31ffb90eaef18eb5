//! Transport semantics of BTH opcodes (IBA 9.2, table 38).
//!
//! TODO(wire): this module is a thin interim decoding of the opcode byte;
//! once `rdma-wire`'s opcode table lands it must delegate to that table so
//! the project keeps one table per fact.

use rdma_types::QpType;

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// SEND.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Acknowledge (ACK, NAK, RNR NAK).
    Ack,
    /// Atomic acknowledge.
    AtomicAck,
    /// Atomic compare and swap.
    CmpSwap,
    /// Atomic fetch and add.
    FetchAdd,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// First of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several.
    Last,
    /// The only packet.
    Only,
}

impl Position {
    /// Whether the packet starts a message.
    pub fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether the packet ends a message.
    pub fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }

    /// The position of packet `index` of `count`.
    pub fn of(index: u32, count: u32) -> Position {
        match (index == 0, index + 1 >= count) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, true) => Position::Last,
            (false, false) => Position::Middle,
        }
    }
}

/// Decoded meaning of one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// RC, UC or UD.
    pub transport: QpType,
    /// Operation.
    pub kind: OpKind,
    /// Position in the message.
    pub pos: Position,
    /// Carries ImmDt.
    pub imm: bool,
    /// Carries IETH.
    pub inv: bool,
}

const RC: u8 = 0x00;
const UC: u8 = 0x20;
const UD: u8 = 0x60;

/// Decodes an opcode byte; `None` for opcodes this engine does not serve
/// (RD, CNP, reserved).
pub fn info(opcode: u8) -> Option<OpInfo> {
    use OpKind::*;
    use Position::*;
    let transport = match opcode & 0xE0 {
        RC => QpType::Rc,
        UC => QpType::Uc,
        UD => QpType::Ud,
        _ => return None,
    };
    let (kind, pos, imm, inv) = match opcode & 0x1F {
        0 => (Send, First, false, false),
        1 => (Send, Middle, false, false),
        2 => (Send, Last, false, false),
        3 => (Send, Last, true, false),
        4 => (Send, Only, false, false),
        5 => (Send, Only, true, false),
        6 => (Write, First, false, false),
        7 => (Write, Middle, false, false),
        8 => (Write, Last, false, false),
        9 => (Write, Last, true, false),
        10 => (Write, Only, false, false),
        11 => (Write, Only, true, false),
        12 => (ReadRequest, Only, false, false),
        13 => (ReadResponse, First, false, false),
        14 => (ReadResponse, Middle, false, false),
        15 => (ReadResponse, Last, false, false),
        16 => (ReadResponse, Only, false, false),
        17 => (Ack, Only, false, false),
        18 => (AtomicAck, Only, false, false),
        19 => (CmpSwap, Only, false, false),
        20 => (FetchAdd, Only, false, false),
        22 => (Send, Last, false, true),
        23 => (Send, Only, false, true),
        _ => return None,
    };
    let allowed = match transport {
        QpType::Rc => true,
        QpType::Uc => matches!(kind, Send | Write) && !inv,
        _ => kind == Send && pos == Only && !inv,
    };
    allowed.then_some(OpInfo {
        transport,
        kind,
        pos,
        imm,
        inv,
    })
}

/// Encodes an opcode; the inverse of [`info`].
pub fn encode(transport: QpType, kind: OpKind, pos: Position, imm: bool, inv: bool) -> u8 {
    use OpKind::*;
    use Position::*;
    let t = match transport {
        QpType::Rc => RC,
        QpType::Uc => UC,
        _ => UD,
    };
    let low = match (kind, pos, imm, inv) {
        (Send, First, _, _) => 0,
        (Send, Middle, _, _) => 1,
        (Send, Last, false, false) => 2,
        (Send, Last, true, _) => 3,
        (Send, Last, false, true) => 22,
        (Send, Only, false, false) => 4,
        (Send, Only, true, _) => 5,
        (Send, Only, false, true) => 23,
        (Write, First, _, _) => 6,
        (Write, Middle, _, _) => 7,
        (Write, Last, false, _) => 8,
        (Write, Last, true, _) => 9,
        (Write, Only, false, _) => 10,
        (Write, Only, true, _) => 11,
        (ReadRequest, _, _, _) => 12,
        (ReadResponse, First, _, _) => 13,
        (ReadResponse, Middle, _, _) => 14,
        (ReadResponse, Last, _, _) => 15,
        (ReadResponse, Only, _, _) => 16,
        (Ack, _, _, _) => 17,
        (AtomicAck, _, _, _) => 18,
        (CmpSwap, _, _, _) => 19,
        (FetchAdd, _, _, _) => 20,
    };
    t | low
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_inverts_info_for_every_served_opcode() {
        let mut served = 0;
        for op in 0..=255u8 {
            if let Some(i) = info(op) {
                served += 1;
                assert_eq!(
                    encode(i.transport, i.kind, i.pos, i.imm, i.inv),
                    op,
                    "opcode {op:#04x}"
                );
            }
        }
        // RC: 23 opcodes (0..=20, 22, 23); UC: 12 (SEND x6, WRITE x6); UD: 2.
        assert_eq!(served, 23 + 12 + 2);
    }

    #[test]
    fn positions() {
        assert_eq!(Position::of(0, 1), Position::Only);
        assert_eq!(Position::of(0, 3), Position::First);
        assert_eq!(Position::of(1, 3), Position::Middle);
        assert_eq!(Position::of(2, 3), Position::Last);
    }
}
