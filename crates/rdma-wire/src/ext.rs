//! Extension transport headers (IBA 9.3): the ones RC, UC and UD use.
//! RDETH (reliable datagram) is not supported.

use core::fmt;
use rdma_types::{Duration, Qkey, Qpn, Rkey};

use crate::bytes::{be24, be32, be64, put24, put32, put64};

/// DETH length.
pub const DETH_LEN: usize = 8;
/// RETH length.
pub const RETH_LEN: usize = 16;
/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AETH length.
pub const AETH_LEN: usize = 4;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt length.
pub const IMM_DT_LEN: usize = 4;
/// IETH length.
pub const IETH_LEN: usize = 4;

// ---------------------------------------------------------------- RETH

mod reth {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
}

rdma_types::view! {
    /// RDMA extended transport header (IBA 9.3.3).
    pub struct RethPacket; len RETH_LEN; "RETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[reth::VA])
    }
    /// R_Key.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(&self.buffer.as_ref()[reth::RKEY]))
    }
    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        be32(&self.buffer.as_ref()[reth::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[reth::VA], v);
    }
    /// Sets R_Key.
    pub fn set_rkey(&mut self, v: Rkey) {
        put32(&mut self.buffer.as_mut()[reth::RKEY], v.0);
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        put32(&mut self.buffer.as_mut()[reth::DMA_LEN], v);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RethRepr {
    /// Virtual address.
    pub va: u64,
    /// R_Key.
    pub rkey: Rkey,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &RethPacket<T>) -> RethRepr {
        RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        }
    }
    /// [`RETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`RETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RethPacket<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

// ---------------------------------------------------------------- AETH

mod aeth {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

rdma_types::view! {
    /// ACK extended transport header (IBA 9.3.5).
    pub struct AethPacket; len AETH_LEN; "AETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// Raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[aeth::SYNDROME]
    }
    /// Decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be24(&self.buffer.as_ref()[aeth::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[aeth::SYNDROME] = s.to_byte();
    }
    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        put24(&mut self.buffer.as_mut()[aeth::MSN], msn);
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// What the acknowledgement says.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads a checked view. Every syndrome byte parses (reserved ones as
    /// [`Syndrome::Reserved`]); the transport decides what to do with them.
    pub fn parse<T: AsRef<[u8]>>(p: &AethPacket<T>) -> AethRepr {
        AethRepr {
            syndrome: p.syndrome(),
            msn: p.msn(),
        }
    }
    /// [`AETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }
    /// Writes the header; the MSN is cut to 24 bits.
    ///
    /// # Panics
    /// If the buffer is shorter than [`AETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AethPacket<T>) {
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
    }
}

/// AETH syndrome (IBA 9.3.5): bit 7 reserved, bits 6-5 the kind, bits 4-0
/// its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// 0b00: ACK with an end-to-end credit count.
    Ack(CreditCount),
    /// 0b01: receiver not ready, retry after the timer.
    RnrNak(RnrTimer),
    /// 0b11: NAK with a code.
    Nak(NakCode),
    /// Kind 0b10 or bit 7 set: reserved; the whole byte is kept.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte; every byte decodes.
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 0x3 {
            0 => Syndrome::Ack(CreditCount(b & 0x1F)),
            1 => Syndrome::RnrNak(RnrTimer(b & 0x1F)),
            3 => Syndrome::Nak(NakCode::from_code(b & 0x1F)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes; `from_byte(s.to_byte()) == s` for every `s` from_byte made.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c.0 & 0x1F,
            Syndrome::RnrNak(t) => 0x20 | (t.0 & 0x1F),
            Syndrome::Nak(n) => 0x60 | (n.code() & 0x1F),
            Syndrome::Reserved(b) => b,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack(c) => match c.credits() {
                Some(n) => write!(f, "ACK, {n} credits"),
                None => f.write_str("ACK, credits not limited"),
            },
            Syndrome::RnrNak(t) => {
                write!(f, "RNR NAK, retry after {} us", t.duration().total_micros())
            }
            Syndrome::Nak(n) => write!(f, "NAK: {n}"),
            Syndrome::Reserved(b) => write!(f, "reserved syndrome {b:#04x}"),
        }
    }
}

/// End-to-end credit count of an ACK (IBA 9.7.7.2.5): a 5-bit
/// code; 31 means "invalid", i.e. the responder does not limit requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CreditCount(pub u8);

/// Receive WQEs for codes 0..=30 (IBA 9.7.7.2.5).
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCount {
    /// Code 31: no credit limit.
    pub const UNLIMITED: CreditCount = CreditCount(31);

    /// Receive WQEs the code stands for; `None` for code 31 (unlimited).
    pub fn credits(self) -> Option<u32> {
        CREDITS.get(usize::from(self.0 & 0x1F)).copied()
    }

    /// The largest code not exceeding `available` WQEs (rounding down is
    /// a responder must never advertise more than it has); `None` gives
    /// [`CreditCount::UNLIMITED`].
    pub fn for_available(available: Option<u32>) -> CreditCount {
        match available {
            None => CreditCount::UNLIMITED,
            Some(n) => CreditCount(CREDITS.iter().rposition(|&c| c <= n).unwrap_or(0) as u8),
        }
    }
}

/// RNR NAK timer field (IBA 9.7.5.2.8, table 45 of release 1.2): 5-bit code of the
/// minimum wait before retrying; code 0 is the longest, 655.36 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RnrTimer(pub u8);

/// Microseconds per code (IBA 9.7.5.2.8).
const RNR_MICROS: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// The wait the code stands for.
    pub fn duration(self) -> Duration {
        Duration::from_micros(RNR_MICROS[usize::from(self.0 & 0x1F)])
    }

    /// The shortest code whose wait is at least `d` (code 0, the longest,
    /// if none of 1..=31 is long enough).
    pub fn at_least(d: Duration) -> RnrTimer {
        let us = d.total_micros();
        match (1..32u8).find(|&c| RNR_MICROS[usize::from(c)] >= us) {
            Some(c) => RnrTimer(c),
            None => RnrTimer(0),
        }
    }
}

macro_rules! nak_codes {
    ($( $code:literal $var:ident $text:literal; )+) => {
        /// NAK code of an AETH syndrome (IBA 9.3.5). Codes
        /// the table does not list are [`NakCode::Unknown`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum NakCode {
            $( #[doc = $text] $var, )+
            /// A reserved code (5..=31).
            Unknown(u8),
        }

        impl NakCode {
            /// The code for a 5-bit value.
            pub const fn from_code(c: u8) -> NakCode {
                match c {
                    $( $code => NakCode::$var, )+
                    other => NakCode::Unknown(other),
                }
            }
            /// The 5-bit value.
            pub const fn code(self) -> u8 {
                match self {
                    $( NakCode::$var => $code, )+
                    NakCode::Unknown(c) => c,
                }
            }
            /// Words for the code, `None` for a reserved one.
            pub const fn description(self) -> Option<&'static str> {
                match self {
                    $( NakCode::$var => Some($text), )+
                    NakCode::Unknown(_) => None,
                }
            }
        }
    };
}

nak_codes! {
    0 PsnSequenceError "PSN sequence error";
    1 InvalidRequest "invalid request";
    2 RemoteAccessError "remote access error";
    3 RemoteOperationalError "remote operational error";
    4 InvalidRdRequest "invalid RD request";
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.description() {
            Some(s) => f.write_str(s),
            None => write!(f, "reserved NAK code {}", self.code()),
        }
    }
}

// ---------------------------------------------------------------- AtomicETH

mod atomic {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const SWAP_ADD: Range<usize> = 12..20;
    pub const COMPARE: Range<usize> = 20..28;
}

rdma_types::view! {
    /// Atomic extended transport header (IBA 9.3.4).
    pub struct AtomicEthPacket; len ATOMIC_ETH_LEN; "AtomicETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[atomic::VA])
    }
    /// R_Key.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(&self.buffer.as_ref()[atomic::RKEY]))
    }
    /// Swap (CmpSwap) or add (FetchAdd) data.
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[atomic::SWAP_ADD])
    }
    /// Compare data (CmpSwap).
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[atomic::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEthPacket<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[atomic::VA], v);
    }
    /// Sets R_Key.
    pub fn set_rkey(&mut self, v: Rkey) {
        put32(&mut self.buffer.as_mut()[atomic::RKEY], v.0);
    }
    /// Sets swap/add data.
    pub fn set_swap_add(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[atomic::SWAP_ADD], v);
    }
    /// Sets compare data.
    pub fn set_compare(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[atomic::COMPARE], v);
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address (8-byte aligned for a valid request; the responder
    /// checks, not the parser).
    pub va: u64,
    /// R_Key.
    pub rkey: Rkey,
    /// Swap or add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicEthPacket<T>) -> AtomicEthRepr {
        AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        }
    }
    /// [`ATOMIC_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`ATOMIC_ETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicEthPacket<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

// ---------------------------------------------------------------- AtomicAckETH

mod atomic_ack {
    use core::ops::Range;
    pub const ORIG: Range<usize> = 0..8;
}

rdma_types::view! {
    /// Atomic acknowledge extended transport header (IBA 9.3.6).
    pub struct AtomicAckEthPacket; len ATOMIC_ACK_ETH_LEN; "AtomicAckETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
    /// Original remote data.
    pub fn orig_data(&self) -> u64 {
        be64(&self.buffer.as_ref()[atomic_ack::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEthPacket<T> {
    /// Sets the original remote data.
    pub fn set_orig_data(&mut self, v: u64) {
        put64(&mut self.buffer.as_mut()[atomic_ack::ORIG], v);
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// Value at the address before the atomic operation.
    pub orig_data: u64,
}

impl AtomicAckEthRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicAckEthPacket<T>) -> AtomicAckEthRepr {
        AtomicAckEthRepr {
            orig_data: p.orig_data(),
        }
    }
    /// [`ATOMIC_ACK_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`ATOMIC_ACK_ETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicAckEthPacket<T>) {
        p.set_orig_data(self.orig_data);
    }
}

// ---------------------------------------------------------------- DETH

mod deth {
    use core::ops::Range;
    pub const QKEY: Range<usize> = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Range<usize> = 5..8;
}

rdma_types::view! {
    /// Datagram extended transport header (IBA 9.3.2).
    pub struct DethPacket; len DETH_LEN; "DETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Q_Key.
    pub fn qkey(&self) -> Qkey {
        Qkey(be32(&self.buffer.as_ref()[deth::QKEY]))
    }
    /// Reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[deth::RESERVED]
    }
    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::from_bits(be24(&self.buffer.as_ref()[deth::SRC_QP]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Sets Q_Key.
    pub fn set_qkey(&mut self, v: Qkey) {
        put32(&mut self.buffer.as_mut()[deth::QKEY], v.0);
    }
    /// Sets the source QP; the reserved byte becomes 0.
    pub fn set_src_qp(&mut self, v: Qpn) {
        self.buffer.as_mut()[deth::RESERVED] = 0;
        put24(&mut self.buffer.as_mut()[deth::SRC_QP], v.value());
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Reads a checked view (the reserved byte is ignored).
    pub fn parse<T: AsRef<[u8]>>(p: &DethPacket<T>) -> DethRepr {
        DethRepr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        }
    }
    /// [`DETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`DETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DethPacket<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

// ---------------------------------------------------------------- ImmDt

mod imm {
    use core::ops::Range;
    pub const DATA: Range<usize> = 0..4;
}

rdma_types::view! {
    /// Immediate data extended transport header (IBA 9.3.7).
    pub struct ImmDtPacket; len IMM_DT_LEN; "ImmDt", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> ImmDtPacket<T> {
    /// Immediate data, read big-endian (as it appears on the wire).
    pub fn imm(&self) -> u32 {
        be32(&self.buffer.as_ref()[imm::DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDtPacket<T> {
    /// Sets the immediate data.
    pub fn set_imm(&mut self, v: u32) {
        put32(&mut self.buffer.as_mut()[imm::DATA], v);
    }
}

/// Parsed immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDtRepr {
    /// The 4 opaque bytes, read big-endian.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &ImmDtPacket<T>) -> ImmDtRepr {
        ImmDtRepr { imm: p.imm() }
    }
    /// [`IMM_DT_LEN`].
    pub const fn buffer_len(&self) -> usize {
        IMM_DT_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`IMM_DT_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ImmDtPacket<T>) {
        p.set_imm(self.imm);
    }
}

// ---------------------------------------------------------------- IETH

mod ieth {
    use core::ops::Range;
    pub const RKEY: Range<usize> = 0..4;
}

rdma_types::view! {
    /// Invalidate extended transport header (IBA 9.3.8).
    pub struct IethPacket; len IETH_LEN; "IETH", crate::bytes::need => crate::ParseError;
}

impl<T: AsRef<[u8]>> IethPacket<T> {
    /// R_Key to invalidate.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(&self.buffer.as_ref()[ieth::RKEY]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IethPacket<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: Rkey) {
        put32(&mut self.buffer.as_mut()[ieth::RKEY], v.0);
    }
}

/// A parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub rkey: Rkey,
}

impl IethRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &IethPacket<T>) -> IethRepr {
        IethRepr { rkey: p.rkey() }
    }
    /// [`IETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        IETH_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`IETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut IethPacket<T>) {
        p.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RETH of frame 106 of linux-rxe-rc-pingpong-and-rping.pcapng (rping's
    /// RDMA READ request, sent by rxe).
    const RETH: [u8; 16] = [
        0x00, 0x00, 0x55, 0x60, 0x74, 0x0c, 0x15, 0xc0, // VA 0x00005560740C15C0
        0x00, 0x00, 0x08, 0x4a, // R_Key 0x0000084A
        0x00, 0x00, 0x00, 0x40, // DMA length 64
    ];

    /// AETH of frame 5 of linux-ib_srp-to-lio-srpt-over-rxe.pcapng (rxe ACK).
    const AETH_ACK: [u8; 4] = [
        0x1f, // syndrome: ACK (00), credit code 31 = unlimited
        0x00, 0x00, 0x01, // MSN 1
    ];

    /// Hand-built NAK: remote access error, MSN 0x123456 (IBA 9.3.5).
    const AETH_NAK: [u8; 4] = [
        0x62, // syndrome: NAK (11), code 2 remote access error
        0x12, 0x34, 0x56, // MSN
    ];

    /// Hand-built RNR NAK, timer code 14 = 1.28 ms (IBA 9.7.5.2.8).
    const AETH_RNR: [u8; 4] = [
        0x2e, // syndrome: RNR NAK (01), timer 14
        0x00, 0x00, 0x07, // MSN 7
    ];

    /// DETH of frame 1 of linux-ib_srp-to-lio-srpt-over-rxe.pcapng (CM REQ
    /// to QP1).
    const DETH: [u8; 8] = [
        0x80, 0x01, 0x00, 0x00, // Q_Key 0x80010000 (GSI)
        0x00, // reserved
        0x00, 0x00, 0x01, // source QP 1
    ];

    /// Hand-built AtomicETH (IBA 9.3.4): CmpSwap at 0x1000.
    const ATOMIC: [u8; 28] = [
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // VA 0x1000
        0xde, 0xad, 0xbe, 0xef, // R_Key
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // swap data
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // compare data
    ];

    /// Hand-built AtomicAckETH.
    const ATOMIC_ACK: [u8; 8] = [0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10]; // original data

    /// Hand-built ImmDt.
    const IMM: [u8; 4] = [0xca, 0xfe, 0xf0, 0x0d]; // immediate 0xCAFEF00D

    /// Hand-built IETH.
    const IETH: [u8; 4] = [0x00, 0x01, 0x02, 0x03]; // R_Key 0x00010203

    #[test]
    fn reth() {
        let r = RethRepr::parse(&RethPacket::new_checked(&RETH[..]).unwrap());
        assert_eq!(
            r,
            RethRepr {
                va: 0x5560_740C_15C0,
                rkey: Rkey(0x84A),
                dma_len: 64
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut RethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, RETH);
        assert!(RethPacket::new_checked(&RETH[..15]).is_err());
    }

    #[test]
    fn aeth_ack_nak_rnr() {
        for (bytes, syn, msn) in [
            (AETH_ACK, Syndrome::Ack(CreditCount::UNLIMITED), 1),
            (
                AETH_NAK,
                Syndrome::Nak(NakCode::RemoteAccessError),
                0x12_3456,
            ),
            (AETH_RNR, Syndrome::RnrNak(RnrTimer(14)), 7),
        ] {
            let r = AethRepr::parse(&AethPacket::new_checked(&bytes[..]).unwrap());
            assert_eq!(r, AethRepr { syndrome: syn, msn });
            let mut out = [0u8; 4];
            r.emit(&mut AethPacket::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
        assert_eq!(
            Syndrome::from_byte(0x1f).to_string(),
            "ACK, credits not limited"
        );
        assert_eq!(
            Syndrome::from_byte(0x62).to_string(),
            "NAK: remote access error"
        );
        assert_eq!(
            Syndrome::from_byte(0x2e).to_string(),
            "RNR NAK, retry after 1280 us"
        );
        assert_eq!(Syndrome::from_byte(0x05).to_string(), "ACK, 6 credits");
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for b in 0..=255u8 {
            let s = Syndrome::from_byte(b);
            assert_eq!(s.to_byte(), b, "{b:#04x} -> {s:?}");
            let reserved = b & 0x80 != 0 || (b >> 5) & 3 == 2;
            assert_eq!(matches!(s, Syndrome::Reserved(_)), reserved, "{b:#04x}");
        }
        assert_eq!(
            Syndrome::from_byte(0x65),
            Syndrome::Nak(NakCode::Unknown(5))
        );
        assert_eq!(NakCode::Unknown(5).to_string(), "reserved NAK code 5");
    }

    #[test]
    fn credit_and_rnr_tables() {
        assert_eq!(CreditCount(0).credits(), Some(0));
        assert_eq!(CreditCount(5).credits(), Some(6));
        assert_eq!(CreditCount(30).credits(), Some(32768));
        assert_eq!(CreditCount::UNLIMITED.credits(), None);
        assert_eq!(
            CreditCount::for_available(Some(5)),
            CreditCount(4),
            "rounds down"
        );
        assert_eq!(CreditCount::for_available(Some(1_000_000)), CreditCount(30));
        for c in 0..=31u8 {
            assert_eq!(
                CreditCount::for_available(CreditCount(c).credits()),
                CreditCount(c)
            );
        }
        assert_eq!(RnrTimer(0).duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer(1).duration(), Duration::from_micros(10));
        assert_eq!(RnrTimer(31).duration(), Duration::from_micros(491_520));
        assert_eq!(
            RnrTimer::at_least(Duration::from_micros(1_000)),
            RnrTimer(14)
        );
        assert_eq!(RnrTimer::at_least(Duration::from_millis(600)), RnrTimer(0));
        for c in 0..=31u8 {
            assert_eq!(RnrTimer::at_least(RnrTimer(c).duration()), RnrTimer(c));
        }
    }

    #[test]
    fn deth() {
        let r = DethRepr::parse(&DethPacket::new_checked(&DETH[..]).unwrap());
        assert_eq!(
            r,
            DethRepr {
                qkey: Qkey::GSI,
                src_qp: Qpn::GSI
            }
        );
        let mut out = [0xffu8; 8];
        r.emit(&mut DethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, DETH);
    }

    #[test]
    fn atomic_eth_and_ack() {
        let r = AtomicEthRepr::parse(&AtomicEthPacket::new_checked(&ATOMIC[..]).unwrap());
        assert_eq!(r.va, 0x1000);
        assert_eq!(r.rkey, Rkey(0xDEAD_BEEF));
        assert_eq!(r.swap_add, 0x0102_0304_0506_0708);
        assert_eq!(r.compare, 0x1112_1314_1516_1718);
        let mut out = [0u8; 28];
        r.emit(&mut AtomicEthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, ATOMIC);
        assert!(AtomicEthPacket::new_checked(&ATOMIC[..27]).is_err());

        let a = AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_checked(&ATOMIC_ACK[..]).unwrap());
        assert_eq!(a.orig_data, 0xFEDC_BA98_7654_3210);
        let mut out = [0u8; 8];
        a.emit(&mut AtomicAckEthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, ATOMIC_ACK);
    }

    #[test]
    fn imm_and_ieth() {
        let i = ImmDtRepr::parse(&ImmDtPacket::new_checked(&IMM[..]).unwrap());
        assert_eq!(i.imm, 0xCAFE_F00D);
        let mut out = [0u8; 4];
        i.emit(&mut ImmDtPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, IMM);
        let e = IethRepr::parse(&IethPacket::new_checked(&IETH[..]).unwrap());
        assert_eq!(e.rkey, Rkey(0x0001_0203));
        e.emit(&mut IethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, IETH);
        assert!(IethPacket::new_checked(&IETH[..3]).is_err());
    }
}
