//! The decoded packet the engine consumes and produces: `rdma-wire`'s BTH
//! and extension-header reprs plus the payload, either borrowed (received)
//! or owned (to send). Byte layout, the opcode table and the AETH codes are
//! `rdma-wire`'s; this module only adds what the engine needs beside them.

use crate::wqe::UdDest;
use rdma_types::{Pkey, Psn, QpType, Qpn};
use rdma_wire::{
    AethRepr, BthRepr, CreditCount, ExtHeaders, IbRepr, Kind, NakCode, Opcode, Position, RnrTimer,
    Syndrome, Transport,
};

/// One InfiniBand transport packet, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<P> {
    /// Base transport header; `pad_count` is set from the payload when the
    /// packet is framed (`Packet::ib_repr`).
    pub bth: BthRepr,
    /// Extension headers, as the opcode table lists them.
    pub ext: ExtHeaders,
    /// Payload without pad.
    pub payload: P,
    /// For received UD packets: the 40-byte GRH area as RoCEv2 delivers it
    /// (for IPv4, 20 zero bytes then the IPv4 header).
    pub grh: Option<[u8; 40]>,
    /// Destination of an outgoing datagram.
    pub ud_dest: Option<UdDest>,
}

impl<P: Default> Packet<P> {
    /// A packet with every extension header absent.
    pub fn new(opcode: Opcode, pkey: Pkey, dest_qp: Qpn, psn: Psn) -> Self {
        Packet {
            bth: BthRepr::new(opcode, pkey, dest_qp, psn),
            ext: ExtHeaders::default(),
            payload: P::default(),
            grh: None,
            ud_dest: None,
        }
    }
}

impl<P: Default> Default for Packet<P> {
    /// An empty packet (opcode 0xFF, no headers, no payload): the slot a
    /// driver hands to [`crate::Qp::poll_transmit_into`].
    fn default() -> Self {
        Packet::new(Opcode::Unknown(0xFF), Pkey::DEFAULT, Qpn::SMI, Psn::new(0))
    }
}

impl<P: std::ops::Deref<Target = [u8]>> Packet<P> {
    /// Borrows an owned packet as a received one (for loopback and tests).
    pub fn as_received(&self) -> Packet<&[u8]> {
        Packet {
            bth: self.bth,
            ext: self.ext,
            payload: &self.payload,
            grh: self.grh,
            ud_dest: self.ud_dest,
        }
    }

    /// The wire repr, ready for `IbRepr::emit` (pad count set).
    pub fn ib_repr(&self) -> IbRepr<'_> {
        IbRepr::new(self.bth, self.ext, &self.payload)
    }
}

impl<'a> Packet<&'a [u8]> {
    /// A received packet from its parsed wire repr.
    pub fn from_ib(ib: &IbRepr<'a>, grh: Option<[u8; 40]>) -> Self {
        Packet {
            bth: ib.bth,
            ext: ib.ext,
            payload: ib.payload,
            grh,
            ud_dest: None,
        }
    }
}

/// Bytes of registered memory lent to a packet instead of copied: the
/// pointer stays valid for reads while the packet holds `keep` (the
/// region's allocation), even if the region is deregistered meanwhile --
/// deregistration ends the key, not the allocation, exactly as the
/// consumer's own buffer outlives an MR on a real HCA.
///
/// The bytes are read when the packet is framed (ICRC) and again by the
/// kernel when it is sent, like a NIC's DMA reads: a consumer that writes
/// a buffer while a send from it is outstanding (which verbs leaves
/// undefined) can make those differ, and the receiver then drops the
/// packet for a bad ICRC.
#[derive(Clone)]
pub struct Pinned {
    keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `Pinned` only reads through `ptr`, which `keep` keeps valid; the
// owner of `keep` is `Send + Sync`.
unsafe impl Send for Pinned {}
// SAFETY: as above; `&Pinned` only reads.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Lends `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be one allocation, valid for reads for as long
    /// as `keep` (or a clone of it) is alive. The caller has checked the
    /// access (key, range, rights) the bytes are lent for.
    pub unsafe fn new(
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        ptr: *const u8,
        len: usize,
    ) -> Pinned {
        Pinned { keep, ptr, len }
    }

    /// What keeps the bytes alive (the region's allocation).
    pub fn owner(&self) -> &std::sync::Arc<dyn std::any::Any + Send + Sync> {
        &self.keep
    }

    /// The lent bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `new`'s contract: valid for reads while `keep` lives,
        // and `self` holds it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pinned({:p}+{})", self.ptr, self.len)
    }
}

/// The payload of a packet to send: a buffer the engine filled (inline
/// data, UD, short payloads, memory that cannot lend) or bytes lent by
/// registered memory ([`Memory::pin_local`] / [`Memory::pin_remote`]),
/// which the driver hands to the kernel without copying them first.
///
/// [`Memory::pin_local`]: crate::Memory::pin_local
/// [`Memory::pin_remote`]: crate::Memory::pin_remote
#[derive(Debug, Clone)]
pub enum Payload {
    /// Engine buffer; give it back with [`crate::Qp::recycle_payload`].
    Owned(Vec<u8>),
    /// Lent registered memory.
    Pinned(Pinned),
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Owned(Vec::new())
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Owned(v) => v,
            Payload::Pinned(p) => p.as_slice(),
        }
    }
}

/// Consecutive middle packets of a message ([`crate::Qp::poll_middles`]),
/// and its last packet when `ends`: what differs from the message's first
/// or middle packet before them.
#[derive(Debug)]
pub struct MiddleRun {
    /// The first one's PSN; the others follow it.
    pub psn: Psn,
    /// How many (1 to 64).
    pub count: usize,
    /// Bit `i`: packet `i` asks for an ACK.
    pub ack_req: u64,
    /// The last packet is the message's last (a Last opcode; its payload
    /// may be shorter, and padded).
    pub ends: bool,
    /// The message's last packet has SE set.
    pub solicited: bool,
    /// The payload bytes of each packet but a last that `ends` the
    /// message (a path MTU).
    pub each: usize,
    /// A path MTU of the message's bytes for each, in order (the last
    /// packet's, when `ends`, what is left of the message), lent by the
    /// memory.
    pub payload: Payload,
}

impl MiddleRun {
    /// Packet `i`'s PSN, AckReq and payload.
    pub fn packet(&self, i: usize) -> (Psn, bool, &[u8]) {
        let end = ((i + 1) * self.each).min(self.payload.len());
        (
            self.psn.add(i as u32),
            self.ack_req >> i & 1 == 1,
            &self.payload[i * self.each..end],
        )
    }
}

/// Payload buffers of sent packets, handed back by the driver
/// ([`crate::Qp::recycle_payload`]) so the next packets neither allocate
/// nor zero-fill: every byte of a taken buffer is overwritten by the
/// gather or remote read that fills it.
#[derive(Debug, Default)]
pub(crate) struct PayloadPool(Vec<Vec<u8>>);

impl PayloadPool {
    /// Buffers kept at most: a driver that sends a batch of packets and
    /// gives their buffers back needs as many as it takes from one QP per
    /// batch (the soft RoCE node takes 64); more would only hold memory,
    /// up to this many path MTUs per QP.
    const MAX: usize = 64;
    /// Smaller buffers are not worth keeping.
    const MIN_CAPACITY: usize = 256;

    /// A buffer of `len` bytes whose contents are unspecified.
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        match self.0.pop() {
            Some(mut b) => {
                b.resize(len, 0); // fills only growth
                b
            }
            None => vec![0; len],
        }
    }

    /// Keeps `buf` for a later [`PayloadPool::take`].
    pub(crate) fn give(&mut self, buf: Vec<u8>) {
        if self.0.len() < Self::MAX && buf.capacity() >= Self::MIN_CAPACITY {
            self.0.push(buf);
        }
    }
}

/// An ACK AETH granting `credits` (code 31: unlimited).
pub(crate) fn ack(credits: CreditCount, msn: u32) -> AethRepr {
    AethRepr {
        syndrome: Syndrome::Ack(credits),
        msn: msn & 0xFF_FFFF,
    }
}

/// An RNR NAK AETH.
pub(crate) fn rnr_nak(timer: u8, msn: u32) -> AethRepr {
    AethRepr {
        syndrome: Syndrome::RnrNak(RnrTimer(timer & 0x1F)),
        msn: msn & 0xFF_FFFF,
    }
}

/// A NAK AETH.
pub(crate) fn nak(code: NakCode, msn: u32) -> AethRepr {
    AethRepr {
        syndrome: Syndrome::Nak(code),
        msn: msn & 0xFF_FFFF,
    }
}

/// The wire transport of a QP type (QP0/QP1 are UD on the wire).
pub(crate) fn transport_of(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud | QpType::Smi | QpType::Gsi => Transport::Ud,
    }
}

/// The opcode with these properties, from `rdma-wire`'s table.
///
/// # Panics
/// If the table has no such opcode: the engine only asks for combinations
/// the IBA defines (a test builds every one the engine can ask for).
pub(crate) fn opcode(t: Transport, kind: Kind, pos: Position, imm: bool, inv: bool) -> Opcode {
    Opcode::find(t, kind, pos, imm, inv).expect("the engine builds only opcodes of the table")
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::*;
    use Position::*;

    #[test]
    fn every_opcode_the_engine_builds_is_in_the_table() {
        let positions = [First, Middle, Last, Only];
        for t in [Transport::Rc, Transport::Uc] {
            for pos in positions {
                let ends = pos.ends();
                opcode(t, Send, pos, false, false);
                opcode(t, RdmaWrite, pos, false, false);
                if ends {
                    opcode(t, Send, pos, true, false);
                    opcode(t, RdmaWrite, pos, true, false);
                    if t == Transport::Rc {
                        opcode(t, Send, pos, false, true);
                    }
                }
                if t == Transport::Rc {
                    opcode(t, RdmaReadResponse, pos, false, false);
                }
            }
        }
        for k in [
            RdmaReadRequest,
            CompareSwap,
            FetchAdd,
            Acknowledge,
            AtomicAcknowledge,
        ] {
            opcode(Transport::Rc, k, Only, false, false);
        }
        opcode(Transport::Ud, Send, Only, false, false);
        opcode(Transport::Ud, Send, Only, true, false);
        assert_eq!(transport_of(QpType::Gsi), Transport::Ud);
    }

    #[test]
    fn aeth_builders() {
        assert_eq!(ack(CreditCount::UNLIMITED, 0x1FF_FFFF).msn, 0xFF_FFFF);
        assert_eq!(rnr_nak(14, 0).syndrome.to_byte(), 0x2E);
        assert_eq!(nak(NakCode::RemoteAccessError, 0).syndrome.to_byte(), 0x62);
    }
}
