//! Base transport header, 12 bytes (IBA 9.2). Byte 4 holds FECN, BECN and
//! 6 reserved bits (the resv8a of older releases, masked in the ICRC).

use rdma_types::{Pkey, Psn, Qpn};

use crate::bytes::{be16, be24, need, put16, put24};
use crate::{Opcode, ParseError};

/// Length of the BTH.
pub const HEADER_LEN: usize = 12;

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    /// SE (bit 7), M (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved (resv8a in the ICRC mask).
    pub const ECN: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    /// AckReq (bit 7), 7 reserved bits.
    pub const ACK_REQ: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

/// A view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps a buffer without checking its length; getters panic on a
    /// buffer shorter than [`HEADER_LEN`].
    pub const fn new_unchecked(buffer: T) -> Self {
        BthPacket { buffer }
    }

    /// Wraps a buffer of at least [`HEADER_LEN`] bytes.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if the buffer is shorter.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        need("BTH", HEADER_LEN, buffer.as_ref().len())?;
        Ok(BthPacket { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.b()[field::OPCODE])
    }

    /// SE: solicited event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }

    /// M: migration request state.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }

    /// PadCnt: bytes of pad after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }

    /// TVer: transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0F
    }

    /// P_Key.
    pub fn pkey(&self) -> Pkey {
        Pkey(be16(&self.b()[field::PKEY]))
    }

    /// FECN: forward congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::ECN] & 0x80 != 0
    }

    /// BECN: backward congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::ECN] & 0x40 != 0
    }

    /// Reserved low 6 bits of byte 4.
    pub fn resv6(&self) -> u8 {
        self.b()[field::ECN] & 0x3F
    }

    /// DestQP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_bits(be24(&self.b()[field::DEST_QP]))
    }

    /// A: acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }

    /// Reserved low 7 bits of byte 8.
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK_REQ] & 0x7F
    }

    /// PSN.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(&self.b()[field::PSN]))
    }

    /// Bytes after the BTH.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets OpCode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.m()[field::OPCODE] = op.code();
    }

    /// Sets SE, M, PadCnt (low 2 bits) and TVer (low 4 bits) at once.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.m()[field::FLAGS] = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 3) << 4)
            | (tver & 0xF);
    }

    /// Sets P_Key.
    pub fn set_pkey(&mut self, pkey: Pkey) {
        put16(&mut self.m()[field::PKEY], pkey.0);
    }

    /// Sets FECN and BECN; the reserved bits of byte 4 become 0.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.m()[field::ECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Sets DestQP.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        put24(&mut self.m()[field::DEST_QP], qpn.value());
    }

    /// Sets AckReq; the reserved bits of byte 8 become 0.
    pub fn set_ack_req(&mut self, a: bool) {
        self.m()[field::ACK_REQ] = u8::from(a) << 7;
    }

    /// Sets PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        put24(&mut self.m()[field::PSN], psn.value());
    }
}

/// A validated BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// OpCode (may be [`Opcode::Unknown`] at this level).
    pub opcode: Opcode,
    /// SE.
    pub solicited: bool,
    /// M.
    pub mig_req: bool,
    /// PadCnt, 0..=3.
    pub pad_count: u8,
    /// P_Key.
    pub pkey: Pkey,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with every flag clear and pad count 0 ([`crate::IbRepr::new`]
    /// sets the pad count from the payload).
    pub const fn new(opcode: Opcode, pkey: Pkey, dest_qp: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses a checked view. Reserved bits are ignored (IBA 9.2: "ignored
    /// by the receiver").
    ///
    /// # Errors
    /// [`ParseError::Malformed`] for a transport version other than 0
    /// (IBA 9.2: such packets are dropped).
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<BthRepr, ParseError> {
        if p.tver() != 0 {
            return Err(ParseError::Malformed {
                what: "BTH",
                reason: "transport header version is not 0",
            });
        }
        Ok(BthRepr {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; reserved bits become 0.
    ///
    /// # Panics
    /// If the view's buffer is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BthPacket<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_ecn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BTH of frame 4 of linux-rxe-rc-pingpong-and-rping.pcapng (rxe,
    /// ibv_rc_pingpong), an RC SEND Last with AckReq.
    const SEND_LAST: [u8; 12] = [
        0x02, // OpCode: RC SEND Last
        0x00, // SE 0, M 0, PadCnt 0, TVer 0
        0xff, 0xff, // P_Key 0xFFFF
        0x00, // FECN 0, BECN 0, reserved 0
        0x00, 0x00, 0x11, // DestQP 0x11
        0x80, // AckReq 1, reserved 0
        0xf7, 0x48, 0x35, // PSN 0xF74835
    ];

    /// Hand-built: every flag set, pad 3, 24-bit extremes.
    const FLAGS: [u8; 12] = [
        0x05, // OpCode: RC SEND Only with Immediate
        0xf0, // SE 1, M 1, PadCnt 3, TVer 0
        0x80, 0x01, // P_Key 0x8001 (full member, index 1)
        0xc0, // FECN 1, BECN 1
        0xff, 0xff, 0xfe, // DestQP 0xFFFFFE
        0x80, // AckReq 1
        0xff, 0xff, 0xff, // PSN 0xFFFFFF
    ];

    #[test]
    fn parse_and_emit_capture_vector() {
        let p = BthPacket::new_checked(&SEND_LAST[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode::RcSendLast);
        assert!(r.ack_req && !r.solicited && !r.fecn);
        assert_eq!(r.pkey, Pkey(0xFFFF));
        assert_eq!(r.dest_qp, Qpn::new(0x11).unwrap());
        assert_eq!(r.psn, Psn::new(0xF74835));
        let mut out = [0xAAu8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, SEND_LAST);
    }

    #[test]
    fn parse_and_emit_all_flags() {
        let r = BthRepr::parse(&BthPacket::new_checked(&FLAGS[..]).unwrap()).unwrap();
        assert!(r.solicited && r.mig_req && r.fecn && r.becn && r.ack_req);
        assert_eq!(r.pad_count, 3);
        assert_eq!(r.dest_qp.value(), 0xFF_FFFE);
        let mut out = [0u8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, FLAGS);
    }

    #[test]
    fn refuses_short_and_versioned() {
        assert_eq!(
            BthPacket::new_checked(&SEND_LAST[..11]).unwrap_err(),
            ParseError::Truncated {
                what: "BTH",
                need: 12,
                have: 11
            }
        );
        let mut v = SEND_LAST;
        v[1] = 0x01; // TVer 1
        assert!(matches!(
            BthRepr::parse(&BthPacket::new_checked(&v[..]).unwrap()),
            Err(ParseError::Malformed { .. })
        ));
    }

    #[test]
    fn reserved_bits_are_ignored_and_emitted_as_zero() {
        let mut v = SEND_LAST;
        v[4] |= 0x3F;
        v[8] |= 0x7F;
        let p = BthPacket::new_checked(&v[..]).unwrap();
        assert_eq!((p.resv6(), p.resv7()), (0x3F, 0x7F));
        let r = BthRepr::parse(&p).unwrap();
        let mut out = [0u8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, SEND_LAST);
    }
}
