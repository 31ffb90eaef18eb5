//! The decoded packet the engine consumes and produces: BTH fields plus the
//! extension headers, with the payload either borrowed (received) or owned
//! (to send). Byte layout is `rdma-wire`'s business.

use crate::tables::{credit_count_decode, rnr_timer_decode};
use crate::wqe::UdDest;
use rdma_types::{Duration, Pkey, Psn, Qkey, Qpn, Rkey};

/// RDMA extended transport header (IBA 9.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// DMA length of the whole message.
    pub len: u32,
}

/// Atomic extended transport header (IBA 9.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap (compare-and-swap) or add (fetch-and-add) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

/// Datagram extended transport header (IBA 9.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth {
    /// Queue key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
}

/// NAK codes of the AETH syndrome (IBA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    /// PSN sequence error.
    PsnSequence,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error.
    RemoteAccess,
    /// Remote operational error.
    RemoteOperational,
    /// Invalid RD request.
    InvalidRdRequest,
    /// Reserved value.
    Reserved(u8),
}

impl NakCode {
    fn code(self) -> u8 {
        match self {
            NakCode::PsnSequence => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccess => 2,
            NakCode::RemoteOperational => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1F,
        }
    }

    fn from_code(c: u8) -> NakCode {
        match c {
            0 => NakCode::PsnSequence,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOperational,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// What an AETH syndrome says (IBA 9.3.4, table 42).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AethKind {
    /// ACK with an end-to-end credit code.
    Ack {
        /// 5-bit credit code (31 = unlimited).
        credits: u8,
    },
    /// Receiver not ready: retry after the encoded timer.
    Rnr {
        /// 5-bit RNR timer code.
        timer: u8,
    },
    /// Negative acknowledge.
    Nak(NakCode),
    /// Reserved syndrome class (01x).
    Reserved(u8),
}

/// ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    /// Raw syndrome byte.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// An ACK carrying a credit code.
    pub fn ack(credits: u8, msn: u32) -> Aeth {
        Aeth {
            syndrome: credits & 0x1F,
            msn: msn & 0xFF_FFFF,
        }
    }

    /// An RNR NAK with a timer code.
    pub fn rnr(timer: u8, msn: u32) -> Aeth {
        Aeth {
            syndrome: 0x20 | (timer & 0x1F),
            msn: msn & 0xFF_FFFF,
        }
    }

    /// A NAK.
    pub fn nak(code: NakCode, msn: u32) -> Aeth {
        Aeth {
            syndrome: 0x60 | code.code(),
            msn: msn & 0xFF_FFFF,
        }
    }

    /// Decodes the syndrome.
    pub fn kind(self) -> AethKind {
        let value = self.syndrome & 0x1F;
        match (self.syndrome >> 5) & 0x3 {
            0 => AethKind::Ack { credits: value },
            1 => AethKind::Rnr { timer: value },
            3 => AethKind::Nak(NakCode::from_code(value)),
            _ => AethKind::Reserved(self.syndrome),
        }
    }

    /// For an RNR NAK, how long to wait.
    pub fn rnr_wait(self) -> Option<Duration> {
        match self.kind() {
            AethKind::Rnr { timer } => Some(rnr_timer_decode(timer)),
            _ => None,
        }
    }

    /// For an ACK, the credits granted (`None`: unlimited or not an ACK).
    pub fn credits(self) -> Option<u32> {
        match self.kind() {
            AethKind::Ack { credits } => credit_count_decode(credits),
            _ => None,
        }
    }
}

/// One InfiniBand transport packet, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<P> {
    /// BTH opcode.
    pub opcode: u8,
    /// Solicited event bit.
    pub solicited: bool,
    /// Pad count (0..=3) as sent; the engine computes it for output.
    pub pad: u8,
    /// Partition key.
    pub pkey: Pkey,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// AckReq bit.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
    /// RETH, when the opcode carries one.
    pub reth: Option<Reth>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// DETH.
    pub deth: Option<Deth>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Invalidate R_Key (IETH).
    pub ieth: Option<Rkey>,
    /// Payload without pad.
    pub payload: P,
    /// For received UD packets: the 40-byte GRH area as RoCEv2 delivers it
    /// (for IPv4, 20 zero bytes then the IPv4 header). For packets to send
    /// on a UD QP: the resolved destination.
    pub grh: Option<[u8; 40]>,
    /// Destination of an outgoing datagram.
    pub ud_dest: Option<UdDest>,
}

impl<P: Default> Packet<P> {
    /// A packet with every optional header absent.
    pub fn new(opcode: u8, pkey: Pkey, dest_qp: Qpn, psn: Psn) -> Self {
        Packet {
            opcode,
            solicited: false,
            pad: 0,
            pkey,
            dest_qp,
            ack_req: false,
            psn,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            deth: None,
            imm: None,
            ieth: None,
            payload: P::default(),
            grh: None,
            ud_dest: None,
        }
    }
}

impl Packet<Vec<u8>> {
    /// Borrows an owned packet as a received one (for loopback and tests).
    pub fn as_received(&self) -> Packet<&[u8]> {
        Packet {
            opcode: self.opcode,
            solicited: self.solicited,
            pad: self.pad,
            pkey: self.pkey,
            dest_qp: self.dest_qp,
            ack_req: self.ack_req,
            psn: self.psn,
            reth: self.reth,
            atomic: self.atomic,
            aeth: self.aeth,
            atomic_ack: self.atomic_ack,
            deth: self.deth,
            imm: self.imm,
            ieth: self.ieth,
            payload: &self.payload,
            grh: self.grh,
            ud_dest: self.ud_dest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aeth_syndromes() {
        assert_eq!(Aeth::ack(31, 5).kind(), AethKind::Ack { credits: 31 });
        assert_eq!(Aeth::ack(31, 5).credits(), None);
        assert_eq!(Aeth::ack(4, 5).credits(), Some(4));
        let rnr = Aeth::rnr(14, 0);
        assert_eq!(rnr.syndrome, 0x2E);
        assert_eq!(rnr.rnr_wait(), Some(Duration::from_micros(1_280)));
        assert_eq!(Aeth::nak(NakCode::RemoteAccess, 0).syndrome, 0x62);
        assert_eq!(
            Aeth::nak(NakCode::PsnSequence, 0).kind(),
            AethKind::Nak(NakCode::PsnSequence)
        );
        assert_eq!(
            Aeth {
                syndrome: 0x41,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x41)
        );
        assert_eq!(Aeth::ack(0, 0x1FF_FFFF).msn, 0xFF_FFFF);
    }
}
