//! Whole packets: [`IbRepr`] (BTH, extension headers, payload, pad: the
//! UDP payload minus the ICRC), [`RoceRepr`] (IP + UDP + IB + ICRC) and
//! [`RoceFrame`] (Ethernet around a RoceRepr). The opcode table decides
//! which extension headers are parsed and emitted, in which order, and
//! what payload is allowed.

use crate::bth::{self, BthPacket, BthRepr};
use crate::ethernet::{self, EtherType, EthernetPacket, EthernetRepr};
use crate::ext::*;
use crate::icrc;
use crate::ip::{IpRepr, UdpChecksum, UdpPacket, UdpRepr, PROTOCOL_UDP, UDP_HEADER_LEN};
use crate::opcode::{ExtHeader, OpInfo};
use crate::{EmitError, ParseError, ICRC_LEN};

/// The extension headers of one packet; exactly those the opcode table
/// lists for the BTH opcode are `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    /// DETH.
    pub deth: Option<DethRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt.
    pub imm_dt: Option<ImmDtRepr>,
    /// IETH.
    pub ieth: Option<IethRepr>,
}

impl ExtHeaders {
    /// Whether `h` is present.
    pub fn has(&self, h: ExtHeader) -> bool {
        match h {
            ExtHeader::Deth => self.deth.is_some(),
            ExtHeader::Reth => self.reth.is_some(),
            ExtHeader::AtomicEth => self.atomic_eth.is_some(),
            ExtHeader::Aeth => self.aeth.is_some(),
            ExtHeader::AtomicAckEth => self.atomic_ack_eth.is_some(),
            ExtHeader::ImmDt => self.imm_dt.is_some(),
            ExtHeader::Ieth => self.ieth.is_some(),
        }
    }

    /// The headers present, one bit each (bit `h as u8`).
    fn mask(&self) -> u8 {
        let bit = |present: bool, h: ExtHeader| u8::from(present) << h as u8;
        bit(self.deth.is_some(), ExtHeader::Deth)
            | bit(self.reth.is_some(), ExtHeader::Reth)
            | bit(self.atomic_eth.is_some(), ExtHeader::AtomicEth)
            | bit(self.aeth.is_some(), ExtHeader::Aeth)
            | bit(self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth)
            | bit(self.imm_dt.is_some(), ExtHeader::ImmDt)
            | bit(self.ieth.is_some(), ExtHeader::Ieth)
    }

    const KINDS: [ExtHeader; 7] = [
        ExtHeader::Deth,
        ExtHeader::Reth,
        ExtHeader::AtomicEth,
        ExtHeader::Aeth,
        ExtHeader::AtomicAckEth,
        ExtHeader::ImmDt,
        ExtHeader::Ieth,
    ];

    /// Parses header `h` from the start of `b` into `self`.
    fn parse_one(&mut self, h: ExtHeader, b: &[u8]) -> Result<(), ParseError> {
        match h {
            ExtHeader::Deth => self.deth = Some(DethRepr::parse(&DethPacket::new_checked(b)?)),
            ExtHeader::Reth => self.reth = Some(RethRepr::parse(&RethPacket::new_checked(b)?)),
            ExtHeader::AtomicEth => {
                self.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEthPacket::new_checked(b)?))
            }
            ExtHeader::Aeth => self.aeth = Some(AethRepr::parse(&AethPacket::new_checked(b)?)),
            ExtHeader::AtomicAckEth => {
                self.atomic_ack_eth = Some(AtomicAckEthRepr::parse(
                    &AtomicAckEthPacket::new_checked(b)?,
                ))
            }
            ExtHeader::ImmDt => self.imm_dt = Some(ImmDtRepr::parse(&ImmDtPacket::new_checked(b)?)),
            ExtHeader::Ieth => self.ieth = Some(IethRepr::parse(&IethPacket::new_checked(b)?)),
        }
        Ok(())
    }

    /// Emits header `h` (present, checked by the caller) at the start of `b`.
    fn emit_one(&self, h: ExtHeader, b: &mut [u8]) {
        match h {
            ExtHeader::Deth => {
                if let Some(r) = &self.deth {
                    r.emit(&mut DethPacket::new_unchecked(b))
                }
            }
            ExtHeader::Reth => {
                if let Some(r) = &self.reth {
                    r.emit(&mut RethPacket::new_unchecked(b))
                }
            }
            ExtHeader::AtomicEth => {
                if let Some(r) = &self.atomic_eth {
                    r.emit(&mut AtomicEthPacket::new_unchecked(b))
                }
            }
            ExtHeader::Aeth => {
                if let Some(r) = &self.aeth {
                    r.emit(&mut AethPacket::new_unchecked(b))
                }
            }
            ExtHeader::AtomicAckEth => {
                if let Some(r) = &self.atomic_ack_eth {
                    r.emit(&mut AtomicAckEthPacket::new_unchecked(b))
                }
            }
            ExtHeader::ImmDt => {
                if let Some(r) = &self.imm_dt {
                    r.emit(&mut ImmDtPacket::new_unchecked(b))
                }
            }
            ExtHeader::Ieth => {
                if let Some(r) = &self.ieth {
                    r.emit(&mut IethPacket::new_unchecked(b))
                }
            }
        }
    }
}

/// The InfiniBand part of a RoCEv2 datagram: BTH, extension headers,
/// payload and pad. On the wire the ICRC follows; [`IbRepr::buffer_len`]
/// counts it and [`IbRepr::emit`] leaves room for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbRepr<'a> {
    /// The BTH; `pad_count` must be the one the payload length calls for.
    pub bth: BthRepr,
    /// Extension headers, as the opcode table lists them.
    pub ext: ExtHeaders,
    /// Payload without pad.
    pub payload: &'a [u8],
}

/// Pad bytes that align `payload_len` to 4 (IBA 9.2.2).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

impl<'a> IbRepr<'a> {
    /// A packet whose BTH pad count is set from the payload length.
    pub fn new(mut bth: BthRepr, ext: ExtHeaders, payload: &'a [u8]) -> IbRepr<'a> {
        bth.pad_count = pad_for(payload.len());
        IbRepr { bth, ext, payload }
    }

    /// Parses a UDP payload: BTH, the extension headers the opcode table
    /// lists, payload, pad and the 4-byte ICRC (whose value is not checked
    /// here: it needs the IP header, see [`RoceRepr::parse`] and
    /// [`icrc::compute`]).
    ///
    /// # Errors
    /// Truncation, an unknown opcode, a transport version other than 0, or
    /// a payload/pad that breaks the opcode's payload rule (the path MTU is
    /// not known here; check it with [`OpInfo::payload_rule`]).
    pub fn parse(udp_payload: &'a [u8]) -> Result<IbRepr<'a>, ParseError> {
        let bthp = BthPacket::new_checked(udp_payload)?;
        let bth = BthRepr::parse(&bthp)?;
        let info = bth
            .opcode
            .info()
            .ok_or(ParseError::UnknownOpcode(bth.opcode.code()))?;
        let hdr = info.header_len();
        crate::bytes::need("IB packet", hdr + ICRC_LEN, udp_payload.len())?;
        let mut ext = ExtHeaders::default();
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            ext.parse_one(h, &udp_payload[off..])?;
            off += h.wire_len();
        }
        let rest = &udp_payload[hdr..udp_payload.len() - ICRC_LEN];
        let pad = bth.pad_count;
        let payload_len = rest
            .len()
            .checked_sub(usize::from(pad))
            .ok_or(ParseError::Payload {
                opcode: bth.opcode,
                reason: "pad count exceeds the bytes after the headers",
                payload: 0,
                pad,
            })?;
        info.payload_rule()
            .check(payload_len, pad, None)
            .map_err(|reason| ParseError::Payload {
                opcode: bth.opcode,
                reason,
                payload: payload_len,
                pad,
            })?;
        Ok(IbRepr {
            bth,
            ext,
            payload: &rest[..payload_len],
        })
    }

    /// The opcode's table row.
    pub fn info(&self) -> Option<&'static OpInfo> {
        self.bth.opcode.info()
    }

    /// Bytes on the wire: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        let hdr = match self.info() {
            Some(i) => i.header_len(),
            None => bth::HEADER_LEN,
        };
        hdr + self.payload.len() + usize::from(self.bth.pad_count & 3) + ICRC_LEN
    }

    /// Checks the repr against the opcode table: headers, payload rule,
    /// pad count.
    ///
    /// # Errors
    /// What is inconsistent.
    pub fn check(&self) -> Result<&'static OpInfo, EmitError> {
        let op = self.bth.opcode;
        let info = op.info().ok_or(EmitError::UnknownOpcode(op.code()))?;
        let want = info.headers.iter().fold(0u8, |m, &h| m | 1 << h as u8);
        // Every packet a sender builds has its opcode's headers: then only
        // the payload is left to check. Otherwise say which one differs.
        if want != self.ext.mask() {
            for h in ExtHeaders::KINDS {
                let state = match (info.has(h), self.ext.has(h)) {
                    (true, false) => "missing",
                    (false, true) => "not allowed",
                    _ => continue,
                };
                return Err(EmitError::Headers {
                    opcode: op,
                    header: h.name(),
                    state,
                });
            }
        }
        let (len, pad) = (self.payload.len(), self.bth.pad_count);
        let bad = |reason| EmitError::Payload {
            opcode: op,
            reason,
            payload: len,
            pad,
        };
        info.payload_rule().check(len, pad, None).map_err(bad)?;
        if pad != pad_for(len) {
            return Err(bad("pad count is not the one the payload length calls for"));
        }
        Ok(info)
    }

    /// Writes only the BTH and extension headers at the start of `buf`;
    /// returns their length. For a sender that hands the payload, pad and
    /// ICRC to the socket as separate pieces (see
    /// [`icrc::compute_vectored`]) instead of copying them behind the
    /// headers.
    ///
    /// # Errors
    /// [`IbRepr::check`] failures, or a short buffer.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let info = self.check()?;
        let hdr = info.header_len();
        if buf.len() < hdr {
            return Err(EmitError::BufferTooSmall {
                need: hdr,
                have: buf.len(),
            });
        }
        self.bth
            .emit(&mut BthPacket::new_unchecked(&mut buf[..bth::HEADER_LEN]));
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            self.ext.emit_one(h, &mut buf[off..off + h.wire_len()]);
            off += h.wire_len();
        }
        Ok(hdr)
    }

    /// Writes headers, payload and zero pad at the start of `buf`, and
    /// zeroes the 4 ICRC bytes (fill them with [`icrc::write_trailer`] or
    /// use [`RoceRepr::emit`]). Returns [`IbRepr::buffer_len`].
    ///
    /// # Errors
    /// [`IbRepr::check`] failures, or a short buffer.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let total = self.buffer_len();
        if buf.len() < total {
            return Err(EmitError::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let mut off = self.emit_headers(buf)?;
        buf[off..off + self.payload.len()].copy_from_slice(self.payload);
        off += self.payload.len();
        buf[off..total].fill(0); // pad and ICRC placeholder
        Ok(total)
    }
}

/// A whole RoCEv2 datagram: IP, UDP, the IB part; the ICRC is checked on
/// parse and computed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr<'a> {
    /// IPv4 or IPv6 header; its payload length is recomputed on emit.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and what follows.
    pub ib: IbRepr<'a>,
}

impl<'a> RoceRepr<'a> {
    /// Parses an IP packet (header first; bytes past the IP length, e.g.
    /// Ethernet padding, are ignored) and verifies the ICRC (not under
    /// `fuzzing`). A wrong UDP checksum is reported in `udp.checksum`, not
    /// refused: the ICRC is what protects RoCEv2. The UDP port is not
    /// checked (tests use other ports); compare it with
    /// [`crate::ROCEV2_UDP_PORT`] if that matters.
    ///
    /// # Errors
    /// Any header's error, a non-UDP protocol, or [`ParseError::Icrc`].
    pub fn parse(ip_packet: &'a [u8]) -> Result<RoceRepr<'a>, ParseError> {
        let (ip, ip_payload) = IpRepr::parse(ip_packet)?;
        if ip.protocol() != PROTOCOL_UDP {
            return Err(ParseError::Malformed {
                what: "IP",
                reason: "next protocol is not UDP (IPv6 extension headers are not supported)",
            });
        }
        let udpp = UdpPacket::new_checked(ip_payload)?;
        if usize::from(udpp.len()) != ip_payload.len() {
            return Err(ParseError::Malformed {
                what: "UDP",
                reason: "length differs from the IP payload length",
            });
        }
        let udp = UdpRepr::parse(&udpp, ip.src_addr(), ip.dst_addr());
        let udp_payload = &ip_payload[UDP_HEADER_LEN..usize::from(udpp.len())];
        Self::parse_datagram(ip, udp, udp_payload)
    }

    /// Parses and ICRC-checks a UDP payload received with these IP and UDP
    /// headers, as a UDP socket delivers it (for IPv4 the identification
    /// must be known: see [`icrc::recover_ipv4_ident`]).
    ///
    /// # Errors
    /// As [`IbRepr::parse`], or [`ParseError::Icrc`].
    pub fn parse_datagram(
        mut ip: IpRepr,
        udp: UdpRepr,
        udp_payload: &'a [u8],
    ) -> Result<RoceRepr<'a>, ParseError> {
        let ib = IbRepr::parse(udp_payload)?;
        let body = &udp_payload[..udp_payload.len() - ICRC_LEN];
        let carried = icrc::trailer(udp_payload).unwrap_or(0);
        ip.set_payload_len(UDP_HEADER_LEN + udp_payload.len());
        let computed = icrc::compute(&ip, &udp, body)?;
        if !cfg!(fuzzing) && computed != carried {
            return Err(ParseError::Icrc { carried, computed });
        }
        Ok(RoceRepr { ip, udp, ib })
    }

    /// Bytes of the UDP payload (IB part with ICRC).
    pub fn udp_payload_len(&self) -> usize {
        self.ib.buffer_len()
    }

    /// Bytes of the whole IP packet.
    pub fn buffer_len(&self) -> usize {
        self.ip.buffer_len() + UDP_HEADER_LEN + self.ib.buffer_len()
    }

    /// Writes the UDP payload only (IB part and ICRC), with the ICRC
    /// computed for the IP/UDP headers of this repr: what a NIC hands to a
    /// UDP socket. Returns its length.
    ///
    /// # Errors
    /// As [`IbRepr::emit`], or [`EmitError::TooLong`].
    pub fn emit_udp_payload(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let n = self.ib.emit(buf)?;
        self.too_long()?;
        let computed = icrc::compute(&self.ip, &self.udp, &buf[..n - ICRC_LEN]).map_err(|_| {
            EmitError::TooLong {
                len: self.buffer_len(),
            }
        })?;
        icrc::write_trailer(&mut buf[..n], computed);
        Ok(n)
    }

    fn too_long(&self) -> Result<(), EmitError> {
        let udp_len = UDP_HEADER_LEN + self.ib.buffer_len();
        if udp_len > self.ip.max_payload_len() {
            return Err(EmitError::TooLong {
                len: self.buffer_len(),
            });
        }
        Ok(())
    }

    /// Writes the whole IP packet: IP header (payload length and IPv4
    /// checksum computed), UDP header (checksum computed for
    /// [`UdpChecksum::Valid`]), IB part, ICRC. Returns [`RoceRepr::buffer_len`].
    ///
    /// # Errors
    /// As [`IbRepr::emit`], a short buffer, or [`EmitError::TooLong`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.too_long()?;
        let total = self.buffer_len();
        if buf.len() < total {
            return Err(EmitError::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        let mut ip = self.ip;
        let udp_len = UDP_HEADER_LEN + self.ib.buffer_len();
        ip.set_payload_len(udp_len);
        let iph = ip.buffer_len();
        let n = self.ib.emit(&mut buf[iph + UDP_HEADER_LEN..])?;
        ip.emit(&mut buf[..iph]);
        self.udp.emit(
            &mut UdpPacket::new_unchecked(&mut buf[iph..]),
            ip.src_addr(),
            ip.dst_addr(),
            n,
        );
        // The UDP checksum is masked in the ICRC, but covers the ICRC: ICRC
        // first, then the checksum again.
        let hdr = iph + UDP_HEADER_LEN;
        let (headers, ib) = buf.split_at_mut(hdr);
        let c = icrc::compute_raw(headers, &ib[..n - ICRC_LEN])
            .map_err(|_| EmitError::TooLong { len: total })?;
        icrc::write_trailer(ib, c);
        if self.udp.checksum == UdpChecksum::Valid {
            UdpPacket::new_unchecked(&mut buf[iph..]).fill_checksum(ip.src_addr(), ip.dst_addr());
        }
        Ok(total)
    }
}

/// A RoCEv2 datagram in an Ethernet frame, as captures hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Ethernet header (EtherType IPv4 or IPv6).
    pub eth: EthernetRepr,
    /// The datagram.
    pub roce: RoceRepr<'a>,
    /// Bytes after the IP packet (Ethernet padding of short frames).
    pub trailer: &'a [u8],
}

impl<'a> RoceFrame<'a> {
    /// Parses an Ethernet frame without FCS.
    ///
    /// # Errors
    /// An EtherType other than IPv4/IPv6, or any [`RoceRepr::parse`] error.
    pub fn parse(frame: &'a [u8]) -> Result<RoceFrame<'a>, ParseError> {
        let p = EthernetPacket::new_checked(frame)?;
        let eth = EthernetRepr::parse(&p);
        if !matches!(eth.ethertype, EtherType::Ipv4 | EtherType::Ipv6) {
            return Err(ParseError::Malformed {
                what: "Ethernet",
                reason: "EtherType is neither IPv4 nor IPv6",
            });
        }
        let ip_bytes = &frame[ethernet::HEADER_LEN..];
        let roce = RoceRepr::parse(ip_bytes)?;
        let version_ok = matches!(
            (eth.ethertype, roce.ip),
            (EtherType::Ipv4, IpRepr::V4(_)) | (EtherType::Ipv6, IpRepr::V6(_))
        );
        if !version_ok {
            return Err(ParseError::Malformed {
                what: "Ethernet",
                reason: "EtherType and IP version disagree",
            });
        }
        let ip_len = roce.ip.buffer_len() + roce.ip.payload_len();
        Ok(RoceFrame {
            eth,
            roce,
            trailer: &ip_bytes[ip_len..],
        })
    }

    /// Bytes of the frame.
    pub fn buffer_len(&self) -> usize {
        ethernet::HEADER_LEN + self.roce.buffer_len() + self.trailer.len()
    }

    /// Writes the frame. Returns [`RoceFrame::buffer_len`].
    ///
    /// # Errors
    /// As [`RoceRepr::emit`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let total = self.buffer_len();
        if buf.len() < total {
            return Err(EmitError::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        self.eth.emit(&mut EthernetPacket::new_unchecked(
            &mut buf[..ethernet::HEADER_LEN],
        ));
        let n = self.roce.emit(&mut buf[ethernet::HEADER_LEN..total])?;
        buf[ethernet::HEADER_LEN + n..total].copy_from_slice(self.trailer);
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opcode, Syndrome};
    use core::net::{Ipv4Addr, Ipv6Addr};
    use rdma_types::{Pkey, Psn, Qpn, Rkey};

    /// Frame 106 of linux-rxe-rc-pingpong-and-rping.pcapng: rping's RDMA
    /// READ request as rxe sent it, Ethernet included.
    const READ_REQUEST: [u8; 74] = [
        0x52, 0x54, 0x00, 0x99, 0x00, 0x03, // Ethernet destination
        0x52, 0x54, 0x00, 0x99, 0x00, 0x02, // Ethernet source
        0x08, 0x00, // EtherType IPv4
        0x45, 0x00, 0x00, 0x3c, // IPv4, IHL 5, TOS 0, total length 60
        0x80, 0x89, 0x40, 0x00, // ID 0x8089, DF
        0x40, 0x11, 0xa5, 0x5d, // TTL 64, UDP, header checksum
        0x0a, 0x63, 0x00, 0x02, // source 10.99.0.2
        0x0a, 0x63, 0x00, 0x03, // destination 10.99.0.3
        0xc6, 0x73, 0x12, 0xb7, // UDP 0xC673 -> 4791
        0x00, 0x28, 0x00, 0x00, // UDP length 40, no checksum
        0x0c, 0x00, 0xff, 0xff, // BTH: RC RDMA READ Request, pad 0, P_Key 0xFFFF
        0x00, 0x00, 0x00, 0x12, // FECN/BECN 0, DestQP 0x12
        0x80, 0x1b, 0x2d, 0xa0, // AckReq, PSN 0x1B2DA0
        0x00, 0x00, 0x55, 0x60, 0x74, 0x0c, 0x15, 0xc0, // RETH VA
        0x00, 0x00, 0x08, 0x4a, // RETH R_Key
        0x00, 0x00, 0x00, 0x40, // RETH DMA length 64
        0x88, 0x31, 0x07, 0xf2, // ICRC 0xF2073188, least significant byte first
    ];

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr::new(opcode, Pkey::DEFAULT, Qpn::new(0x42).unwrap(), Psn::new(1))
    }

    #[test]
    fn capture_frame_round_trip() {
        let f = RoceFrame::parse(&READ_REQUEST).unwrap();
        assert!(f.trailer.is_empty());
        let IpRepr::V4(ip) = f.roce.ip else {
            panic!("IPv4")
        };
        assert_eq!((ip.src, ip.ident), (Ipv4Addr::new(10, 99, 0, 2), 0x8089));
        assert_eq!(f.roce.udp.src_port, 0xC673);
        let ib = f.roce.ib;
        assert_eq!(ib.bth.opcode, Opcode::RcReadRequest);
        assert!(ib.bth.ack_req);
        assert_eq!(
            ib.ext.reth,
            Some(RethRepr {
                va: 0x5560_740C_15C0,
                rkey: Rkey(0x84A),
                dma_len: 64
            })
        );
        assert_eq!(
            ib.ext,
            ExtHeaders {
                reth: ib.ext.reth,
                ..ExtHeaders::default()
            }
        );
        assert!(ib.payload.is_empty());
        let mut out = [0u8; 74];
        assert_eq!(f.emit(&mut out), Ok(74));
        assert_eq!(out, READ_REQUEST);
        // The UDP payload alone, ICRC computed from the reprs' headers.
        let mut udp_payload = [0u8; 32];
        assert_eq!(f.roce.emit_udp_payload(&mut udp_payload), Ok(32));
        assert_eq!(udp_payload, READ_REQUEST[42..]);
    }

    #[test]
    fn corrupted_icrc_and_bytes_are_refused() {
        let mut v = READ_REQUEST;
        v[73] ^= 0x80;
        assert!(matches!(RoceFrame::parse(&v), Err(ParseError::Icrc { .. })));
        let mut v = READ_REQUEST;
        v[60] ^= 0x01; // a RETH byte: covered by the ICRC
        assert_eq!(
            RoceFrame::parse(&v).unwrap_err(),
            ParseError::Icrc {
                carried: 0xF207_3188,
                computed: icrc::compute_ip_packet(&v[14..]).unwrap()
            }
        );
        let mut v = READ_REQUEST;
        v[46] = 0xC0; // BTH byte 4 (FECN/BECN): masked, still valid
        let f = RoceFrame::parse(&v).unwrap();
        assert!(f.roce.ib.bth.fecn && f.roce.ib.bth.becn);
    }

    #[test]
    fn udp_length_must_fill_the_ip_payload() {
        let mut v = READ_REQUEST;
        v[14 + 20 + 5] -= 4; // UDP length 36 inside an IP payload of 40
        assert_eq!(
            RoceFrame::parse(&v).unwrap_err(),
            ParseError::Malformed {
                what: "UDP",
                reason: "length differs from the IP payload length"
            }
        );
    }

    #[test]
    fn ib_parse_refusals() {
        let ib = &READ_REQUEST[42..];
        assert!(matches!(
            IbRepr::parse(&ib[..31]),
            Err(ParseError::Truncated { .. })
        ));
        let mut v = ib.to_vec();
        v[0] = 0x15; // reserved RC opcode
        assert_eq!(IbRepr::parse(&v), Err(ParseError::UnknownOpcode(0x15)));
        let mut v = ib.to_vec();
        v.splice(28..28, [1, 2, 3, 4]); // 4 payload bytes on a READ request
        assert!(matches!(
            IbRepr::parse(&v),
            Err(ParseError::Payload {
                reason: "opcode carries no payload",
                ..
            })
        ));
        let mut v = ib.to_vec();
        v[1] = 0x30; // pad 3 with no bytes after the headers
        assert!(matches!(IbRepr::parse(&v), Err(ParseError::Payload { .. })));
        // SEND First with 5 bytes and pad 3: first packets carry whole MTUs.
        let mut v = vec![0x00, 0x30, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        v.extend([9u8; 8]);
        v.extend([0u8; 4]);
        assert!(matches!(IbRepr::parse(&v), Err(ParseError::Payload { .. })));
        v[1] = 0x00; // pad 0, 8 bytes: fine for a parser that does not know the MTU
        assert_eq!(IbRepr::parse(&v).unwrap().payload, &[9u8; 8]);
    }

    #[test]
    fn emit_checks_against_the_table() {
        let none = ExtHeaders::default();
        let reth = Some(RethRepr {
            va: 1,
            rkey: Rkey(2),
            dma_len: 3,
        });
        let aeth = Some(AethRepr {
            syndrome: Syndrome::from_byte(0x1f),
            msn: 0,
        });
        let mut buf = [0u8; 128];
        let r = IbRepr::new(bth(Opcode::RcWriteOnly), none, b"abc");
        assert_eq!(
            r.emit(&mut buf),
            Err(EmitError::Headers {
                opcode: Opcode::RcWriteOnly,
                header: "RETH",
                state: "missing"
            })
        );
        let r = IbRepr::new(
            bth(Opcode::RcWriteOnly),
            ExtHeaders { reth, aeth, ..none },
            b"abc",
        );
        assert_eq!(
            r.emit(&mut buf),
            Err(EmitError::Headers {
                opcode: Opcode::RcWriteOnly,
                header: "AETH",
                state: "not allowed"
            })
        );
        let mut r = IbRepr::new(
            bth(Opcode::RcWriteOnly),
            ExtHeaders { reth, ..none },
            b"abc",
        );
        assert_eq!(r.bth.pad_count, 1);
        assert_eq!(r.buffer_len(), 12 + 16 + 3 + 1 + 4);
        assert_eq!(
            r.emit(&mut buf[..35]),
            Err(EmitError::BufferTooSmall { need: 36, have: 35 })
        );
        assert_eq!(r.emit(&mut buf), Ok(36));
        assert_eq!(&buf[28..32], b"abc\0", "payload then one zero pad byte");
        assert_eq!(IbRepr::parse(&buf[..36]), Ok(r));
        r.bth.pad_count = 0;
        assert!(matches!(r.emit(&mut buf), Err(EmitError::Payload { .. })));
        let r = IbRepr::new(bth(Opcode::Unknown(0x40)), none, &[]);
        assert_eq!(r.emit(&mut buf), Err(EmitError::UnknownOpcode(0x40)));
    }

    #[test]
    fn ipv6_build_parse_and_socket_view() {
        let payload = [0u8; 16];
        let mut b = bth(Opcode::Cnp);
        b.becn = true;
        let roce = RoceRepr {
            ip: IpRepr::V6(crate::Ipv6Repr {
                src: Ipv6Addr::LOCALHOST,
                dst: "fd00::7".parse().unwrap(),
                traffic_class: 0x02,
                flow_label: 0x12345,
                next_header: PROTOCOL_UDP,
                hop_limit: 64,
                payload_len: 0,
            }),
            udp: UdpRepr {
                src_port: 0xC000,
                dst_port: crate::ROCEV2_UDP_PORT,
                checksum: UdpChecksum::Valid,
            },
            ib: IbRepr::new(b, ExtHeaders::default(), &payload),
        };
        let mut buf = vec![0u8; roce.buffer_len()];
        assert_eq!(roce.emit(&mut buf), Ok(40 + 8 + 12 + 16 + 4));
        let parsed = RoceRepr::parse(&buf).unwrap();
        assert_eq!(
            parsed.udp.checksum,
            UdpChecksum::Valid,
            "checksum computed after the ICRC"
        );
        assert_eq!(parsed.ib, roce.ib);
        // What a UDP socket hands up: the payload and the addresses.
        let IpRepr::V6(mut v6) = roce.ip else {
            unreachable!()
        };
        v6.traffic_class = 0xFF; // masked: a router may change it
        v6.hop_limit = 3;
        let again = RoceRepr::parse_datagram(IpRepr::V6(v6), roce.udp, &buf[48..]).unwrap();
        assert_eq!(again.ib, roce.ib);
        v6.flow_label = 0; // masked too
        v6.dst = "fd00::8".parse().unwrap(); // covered
        assert!(matches!(
            RoceRepr::parse_datagram(IpRepr::V6(v6), roce.udp, &buf[48..]),
            Err(ParseError::Icrc { .. })
        ));
    }

    #[test]
    fn ethernet_padding_is_kept_as_trailer() {
        // Bytes after the IP packet (Ethernet pads frames below 60 bytes)
        // are not part of the datagram; they are kept to re-emit the frame.
        let mut frame = READ_REQUEST.to_vec();
        frame.extend([0xEE, 0xEE]);
        let f = RoceFrame::parse(&frame).unwrap();
        assert_eq!(f.trailer, &[0xEE, 0xEE]);
        let mut out = vec![0u8; f.buffer_len()];
        f.emit(&mut out).unwrap();
        assert_eq!(out, frame);
    }
}
