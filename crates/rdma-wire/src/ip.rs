//! IPv4, IPv6 and UDP, only as far as RoCEv2 needs them (IBA Annex A17):
//! one IPv4 header without options and unfragmented, or one IPv6 header
//! without extension headers, then UDP.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{be16, be32, need, put16, put32};
use crate::ParseError;

/// IPv4 header length without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// IP protocol / next header number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

/// Internet checksum accumulation (RFC 1071): 16-bit big-endian words,
/// an odd trailing byte padded with zero.
fn sum_words(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        acc += u32::from(*b) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    !(acc as u16)
}

// ---------------------------------------------------------------- IPv4

mod v4 {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// A view of an IPv4 header and what follows it.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer unchecked; getters panic if it is shorter than 20.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer holding a whole IPv4 packet: version 4, no options,
    /// total length within the buffer (bytes after it, e.g. Ethernet
    /// padding, are outside the packet).
    ///
    /// # Errors
    /// [`ParseError::Truncated`] or [`ParseError::Malformed`].
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        let b = buffer.as_ref();
        need("IPv4", IPV4_HEADER_LEN, b.len())?;
        let p = Ipv4Packet { buffer };
        if p.version() != 4 {
            return Err(ParseError::Malformed {
                what: "IPv4",
                reason: "version is not 4",
            });
        }
        if p.ihl() < 5 {
            return Err(ParseError::Malformed {
                what: "IPv4",
                reason: "IHL below 5",
            });
        }
        if p.ihl() > 5 {
            return Err(ParseError::Malformed {
                what: "IPv4",
                reason: "options (IHL > 5) are not supported on RoCEv2",
            });
        }
        let total = usize::from(p.total_len());
        if total < IPV4_HEADER_LEN {
            return Err(ParseError::Malformed {
                what: "IPv4",
                reason: "total length below header length",
            });
        }
        need("IPv4", total, p.buffer.as_ref().len())?;
        Ok(p)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Version.
    pub fn version(&self) -> u8 {
        self.b()[v4::VER_IHL] >> 4
    }
    /// Header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.b()[v4::VER_IHL] & 0x0F
    }
    /// Type of service byte (DSCP and ECN).
    pub fn tos(&self) -> u8 {
        self.b()[v4::TOS]
    }
    /// Total length.
    pub fn total_len(&self) -> u16 {
        be16(&self.b()[v4::LENGTH])
    }
    /// Identification (inside the ICRC, see INTEROP.md).
    pub fn ident(&self) -> u16 {
        be16(&self.b()[v4::IDENT])
    }
    /// Flags (3 bits: reserved, DF, MF).
    pub fn flags(&self) -> u8 {
        self.b()[v4::FLG_OFF.start] >> 5
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be16(&self.b()[v4::FLG_OFF]) & 0x1FFF
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[v4::TTL]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.b()[v4::PROTOCOL]
    }
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        be16(&self.b()[v4::CHECKSUM])
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be32(&self.b()[v4::SRC]))
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be32(&self.b()[v4::DST]))
    }
    /// The header checksum computed over the header as it is, with the
    /// checksum field counted as zero.
    pub fn compute_checksum(&self) -> u16 {
        let h = &self.b()[..IPV4_HEADER_LEN];
        let acc = sum_words(
            sum_words(0, &h[..v4::CHECKSUM.start]),
            &h[v4::CHECKSUM.end..],
        );
        fold(acc)
    }
    /// Bytes after the header up to the total length.
    pub fn payload(&self) -> &[u8] {
        let end = usize::from(self.total_len()).clamp(IPV4_HEADER_LEN, self.b().len());
        &self.b()[IPV4_HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Mutable payload (after the header, up to the total length).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.total_len()).clamp(IPV4_HEADER_LEN, self.b().len());
        &mut self.m()[IPV4_HEADER_LEN..end]
    }
    /// Sets version 4 and IHL 5 (no options).
    pub fn set_version_ihl(&mut self) {
        self.m()[v4::VER_IHL] = 0x45;
    }
    /// Sets the type of service byte.
    pub fn set_tos(&mut self, v: u8) {
        self.m()[v4::TOS] = v;
    }
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        put16(&mut self.m()[v4::LENGTH], v);
    }
    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        put16(&mut self.m()[v4::IDENT], v);
    }
    /// Sets the flags to DF or nothing, fragment offset 0.
    pub fn set_dont_frag(&mut self, df: bool) {
        put16(&mut self.m()[v4::FLG_OFF], if df { 0x4000 } else { 0 });
    }
    /// Sets the time to live.
    pub fn set_ttl(&mut self, v: u8) {
        self.m()[v4::TTL] = v;
    }
    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.m()[v4::PROTOCOL] = v;
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        put32(&mut self.m()[v4::SRC], u32::from(a));
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        put32(&mut self.m()[v4::DST], u32::from(a));
    }
    /// Recomputes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        put16(&mut self.m()[v4::CHECKSUM], 0);
        let c = self.compute_checksum();
        put16(&mut self.m()[v4::CHECKSUM], c);
    }
}

/// A validated IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Type of service byte: DSCP (6 bits) and ECN (2 bits).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol of the payload.
    pub protocol: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Parses a checked view.
    ///
    /// # Errors
    /// Fragments and the reserved flag are refused; a wrong header
    /// checksum is [`ParseError::Checksum`] (not checked under `fuzzing`).
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Ipv4Repr, ParseError> {
        if p.flags() & 0b101 != 0 || p.frag_offset() != 0 {
            return Err(ParseError::Malformed {
                what: "IPv4",
                reason: "fragmented or reserved flag set (RoCEv2 is never fragmented)",
            });
        }
        let computed = p.compute_checksum();
        if !cfg!(fuzzing) && computed != p.checksum() {
            return Err(ParseError::Checksum {
                what: "IPv4 header",
                carried: p.checksum(),
                computed,
            });
        }
        Ok(Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.flags() & 0b010 != 0,
            ttl: p.ttl(),
            protocol: p.protocol(),
            payload_len: usize::from(p.total_len()) - IPV4_HEADER_LEN,
        })
    }

    /// Header length (20).
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes the header with its checksum.
    ///
    /// # Panics
    /// If the buffer is shorter than 20 bytes or `payload_len + 20` does
    /// not fit 16 bits (callers check with [`crate::EmitError::TooLong`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv4Packet<T>) {
        let total = u16::try_from(self.payload_len + IPV4_HEADER_LEN).expect("IPv4 total length");
        p.set_version_ihl();
        p.set_tos(self.tos);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_dont_frag(self.dont_frag);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
    }
}

// ---------------------------------------------------------------- IPv6

mod v6 {
    use core::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// A view of an IPv6 header and what follows it.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer unchecked; getters panic if it is shorter than 40.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer holding a whole IPv6 packet: version 6, payload
    /// length within the buffer.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] or [`ParseError::Malformed`].
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        need("IPv6", IPV6_HEADER_LEN, buffer.as_ref().len())?;
        let p = Ipv6Packet { buffer };
        if p.version() != 6 {
            return Err(ParseError::Malformed {
                what: "IPv6",
                reason: "version is not 6",
            });
        }
        need(
            "IPv6",
            IPV6_HEADER_LEN + usize::from(p.payload_len()),
            p.buffer.as_ref().len(),
        )?;
        Ok(p)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn word0(&self) -> u32 {
        be32(&self.b()[v6::VER_TC_FLOW])
    }
    /// Version.
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }
    /// Traffic class (DSCP and ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000F_FFFF
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        be16(&self.b()[v6::PAYLOAD_LEN])
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.b()[v6::NEXT_HEADER]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[v6::HOP_LIMIT]
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[v6::SRC]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[v6::DST]);
        Ipv6Addr::from(a)
    }
    /// Bytes after the header up to the payload length.
    pub fn payload(&self) -> &[u8] {
        let end = (IPV6_HEADER_LEN + usize::from(self.payload_len())).min(self.b().len());
        &self.b()[IPV6_HEADER_LEN.min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets version 6, the traffic class and the flow label (low 20 bits).
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let w0 = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xF_FFFF);
        put32(&mut self.buffer.as_mut()[v6::VER_TC_FLOW], w0);
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        put16(&mut self.buffer.as_mut()[v6::PAYLOAD_LEN], v);
    }
    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[v6::NEXT_HEADER] = v;
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[v6::HOP_LIMIT] = v;
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[v6::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[v6::DST].copy_from_slice(&a.octets());
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = (IPV6_HEADER_LEN + usize::from(self.payload_len())).min(self.b().len());
        &mut self.buffer.as_mut()[IPV6_HEADER_LEN.min(end)..end]
    }
}

/// A validated IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Ipv6Repr {
        Ipv6Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: usize::from(p.payload_len()),
        }
    }

    /// Header length (40).
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Writes the header; the flow label is cut to 20 bits.
    ///
    /// # Panics
    /// If the buffer is shorter than 40 bytes or the payload length does
    /// not fit 16 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv6Packet<T>) {
        let len = u16::try_from(self.payload_len).expect("IPv6 payload length");
        p.set_version_class_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
    }
}

// ---------------------------------------------------------------- IpRepr

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Parses an IPv4 or IPv6 packet by its version nibble; returns the
    /// header and the payload (trailing bytes beyond the IP length are
    /// left out).
    ///
    /// # Errors
    /// Whatever the version's parser refuses.
    pub fn parse(bytes: &[u8]) -> Result<(IpRepr, &[u8]), ParseError> {
        need("IP", 1, bytes.len())?;
        match bytes[0] >> 4 {
            4 => {
                let p = Ipv4Packet::new_checked(bytes)?;
                let r = Ipv4Repr::parse(&p)?;
                let end = usize::from(p.total_len());
                Ok((IpRepr::V4(r), &bytes[IPV4_HEADER_LEN..end]))
            }
            6 => {
                let p = Ipv6Packet::new_checked(bytes)?;
                let r = Ipv6Repr::parse(&p);
                Ok((
                    IpRepr::V6(r),
                    &bytes[IPV6_HEADER_LEN..IPV6_HEADER_LEN + r.payload_len],
                ))
            }
            _ => Err(ParseError::Malformed {
                what: "IP",
                reason: "version is neither 4 nor 6",
            }),
        }
    }

    /// The IP header of a RoCEv2 datagram as Linux sends it from an
    /// unconnected UDP socket with `IP_PMTUDISC_DO` (INTEROP.md): IPv4 ID
    /// 0 and DF (both inside the ICRC), TTL or hop limit 64, TOS, traffic
    /// class and flow label 0 (masked in the ICRC, so any value verifies).
    /// IPv4-mapped IPv6 addresses count as IPv4. `None` if the two
    /// addresses are of different families.
    pub fn rocev2(src: IpAddr, dst: IpAddr, payload_len: usize) -> Option<IpRepr> {
        let canon = |a: IpAddr| match a {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
            v4 => v4,
        };
        match (canon(src), canon(dst)) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(IpRepr::V4(Ipv4Repr {
                src,
                dst,
                tos: 0,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                protocol: PROTOCOL_UDP,
                payload_len,
            })),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Some(IpRepr::V6(Ipv6Repr {
                src,
                dst,
                traffic_class: 0,
                flow_label: 0,
                next_header: PROTOCOL_UDP,
                hop_limit: 64,
                payload_len,
            })),
            _ => None,
        }
    }

    /// The 40-byte GRH area a UD receive completion hands up on RoCEv2
    /// (Linux `union rdma_network_hdr`): the IPv6 header as it is, or 20
    /// zero bytes then the IPv4 header.
    ///
    /// # Panics
    /// If the payload length does not fit the header's length field.
    pub fn grh_area(&self) -> [u8; 40] {
        let mut g = [0u8; 40];
        match self {
            IpRepr::V4(r) => r.emit(&mut Ipv4Packet::new_unchecked(&mut g[20..])),
            IpRepr::V6(r) => r.emit(&mut Ipv6Packet::new_unchecked(&mut g[..])),
        }
        g
    }

    /// Source address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.src),
            IpRepr::V6(r) => IpAddr::V6(r.src),
        }
    }

    /// Destination address.
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.dst),
            IpRepr::V6(r) => IpAddr::V6(r.dst),
        }
    }

    /// Protocol (IPv4) or next header (IPv6).
    pub fn protocol(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.protocol,
            IpRepr::V6(r) => r.next_header,
        }
    }

    /// Payload length.
    pub fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: usize) {
        match self {
            IpRepr::V4(r) => r.payload_len = len,
            IpRepr::V6(r) => r.payload_len = len,
        }
    }

    /// Largest payload the length field can describe.
    pub fn max_payload_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => usize::from(u16::MAX) - IPV4_HEADER_LEN,
            IpRepr::V6(_) => usize::from(u16::MAX),
        }
    }

    /// Header length.
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.buffer_len(),
            IpRepr::V6(r) => r.buffer_len(),
        }
    }

    /// Writes the header at the start of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`IpRepr::buffer_len`] or the payload
    /// length does not fit.
    pub fn emit(&self, buf: &mut [u8]) {
        match self {
            IpRepr::V4(r) => r.emit(&mut Ipv4Packet::new_unchecked(buf)),
            IpRepr::V6(r) => r.emit(&mut Ipv6Packet::new_unchecked(buf)),
        }
    }
}

// ---------------------------------------------------------------- UDP

mod udp {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer unchecked; getters panic if it is shorter than 8.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer holding a whole datagram: length field at least 8
    /// and within the buffer.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] or [`ParseError::Malformed`].
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        need("UDP", UDP_HEADER_LEN, buffer.as_ref().len())?;
        let p = UdpPacket { buffer };
        let len = usize::from(p.len());
        if len < UDP_HEADER_LEN {
            return Err(ParseError::Malformed {
                what: "UDP",
                reason: "length below header length",
            });
        }
        need("UDP", len, p.buffer.as_ref().len())?;
        Ok(p)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(&self.b()[udp::SRC_PORT])
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(&self.b()[udp::DST_PORT])
    }
    /// Length of header and payload.
    pub fn len(&self) -> u16 {
        be16(&self.b()[udp::LENGTH])
    }
    /// Whether the length field says 0 (never valid).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Checksum (0: none, what rxe sends).
    pub fn checksum(&self) -> u16 {
        be16(&self.b()[udp::CHECKSUM])
    }
    /// Bytes after the header up to the length field.
    pub fn payload(&self) -> &[u8] {
        let end = usize::from(self.len()).clamp(UDP_HEADER_LEN, self.b().len());
        &self.b()[UDP_HEADER_LEN..end]
    }
    /// The checksum over pseudo-header, header (checksum counted as zero)
    /// and payload (RFC 768; RFC 8200 8.1 for IPv6); 0 comes out as 0xFFFF.
    pub fn compute_checksum(&self, src: IpAddr, dst: IpAddr) -> u16 {
        let len = usize::from(self.len()).clamp(UDP_HEADER_LEN, self.b().len());
        let mut acc = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                sum_words(sum_words(0, &s.octets()), &d.octets())
                    + u32::from(PROTOCOL_UDP)
                    + len as u32
            }
            (s, d) => {
                let s = match s {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                let d = match d {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                sum_words(sum_words(0, &s.octets()), &d.octets())
                    + u32::from(PROTOCOL_UDP)
                    + len as u32
            }
        };
        let b = &self.b()[..len];
        acc = sum_words(acc, &b[..udp::CHECKSUM.start]);
        acc = sum_words(acc, &b[udp::CHECKSUM.end..]);
        match fold(acc) {
            0 => 0xFFFF,
            c => c,
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        put16(&mut self.buffer.as_mut()[udp::SRC_PORT], v);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        put16(&mut self.buffer.as_mut()[udp::DST_PORT], v);
    }
    /// Sets the length (header and payload).
    pub fn set_len(&mut self, v: u16) {
        put16(&mut self.buffer.as_mut()[udp::LENGTH], v);
    }
    /// Sets the checksum field as given.
    pub fn set_checksum(&mut self, v: u16) {
        put16(&mut self.buffer.as_mut()[udp::CHECKSUM], v);
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len()).clamp(UDP_HEADER_LEN, self.b().len());
        &mut self.buffer.as_mut()[UDP_HEADER_LEN..end]
    }
    /// Computes and stores the checksum over the payload now in place.
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        let c = self.compute_checksum(src, dst);
        self.set_checksum(c);
    }
}

/// What a UDP header's checksum field says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    /// Zero: no checksum. What rxe sends; RoCEv2 relies on the ICRC.
    None,
    /// Correct on parse; computed on emit.
    Valid,
    /// Carried but wrong. A capture taken before checksum offload fills
    /// the field shows such values (the user-space frames of
    /// userspace-cm-req-to-linux-rxe.pcapng do); the ICRC, not this field,
    /// protects RoCEv2, so the value is kept and re-emitted as it was.
    Invalid(u16),
}

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port (rxe: 0xC000 | hash of the QPN; receivers ignore it).
    pub src_port: u16,
    /// Destination port ([`crate::ROCEV2_UDP_PORT`] for RoCEv2).
    pub dst_port: u16,
    /// The checksum field.
    pub checksum: UdpChecksum,
}

impl UdpRepr {
    /// Parses a checked view, checking a non-zero checksum against the IP
    /// addresses. A wrong checksum is reported in
    /// [`UdpRepr::checksum`], not refused: callers that must drop such
    /// datagrams test for [`UdpChecksum::Invalid`].
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>, src: IpAddr, dst: IpAddr) -> UdpRepr {
        let carried = p.checksum();
        let checksum = if carried == 0 {
            UdpChecksum::None
        } else if p.compute_checksum(src, dst) == carried {
            UdpChecksum::Valid
        } else {
            UdpChecksum::Invalid(carried)
        };
        UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            checksum,
        }
    }

    /// Header length (8).
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }

    /// Writes the header for a payload of `payload_len` bytes that is
    /// already in place after it; computes the checksum for
    /// [`UdpChecksum::Valid`].
    ///
    /// # Panics
    /// If the buffer is shorter than 8 + `payload_len` or the length does
    /// not fit 16 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut UdpPacket<T>,
        src: IpAddr,
        dst: IpAddr,
        payload_len: usize,
    ) {
        let len = u16::try_from(payload_len + UDP_HEADER_LEN).expect("UDP length");
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        match self.checksum {
            UdpChecksum::None => p.set_checksum(0),
            UdpChecksum::Invalid(v) => p.set_checksum(v),
            UdpChecksum::Valid => {
                p.set_checksum(0);
                p.fill_checksum(src, dst);
            }
        }
    }
}

// ---------------------------------------------------------------- source port

/// Lowest UDP source port RoCEv2 senders use (IBA Annex A17: the source
/// port carries flow entropy; receivers ignore it).
pub const ROCEV2_SOURCE_PORT_MIN: u16 = 0xC000;

/// The UDP source port for a flow label, folded the way Linux does it
/// (`rdma_flow_label_to_udp_sport`): low 14 bits XOR the high 6, in
/// 0xC000..=0xFFFF. Checked against the rxe captures, where the flow label
/// comes from the CM REQ's primary path.
pub const fn source_port_for_flow_label(flow_label: u32) -> u16 {
    let fl = flow_label & 0xF_FFFF;
    let low = (fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14);
    ROCEV2_SOURCE_PORT_MIN | low as u16
}

/// The flow label Linux derives from the two QP numbers of a connection
/// when none was given (`rdma_calc_flow_label`).
pub const fn flow_label_for_qps(local: rdma_types::Qpn, remote: rdma_types::Qpn) -> u32 {
    let mut v = local.value() as u64 * remote.value() as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// The source port Linux rxe gives a QP at creation, before any path is
/// known (what its UD QPs and QP1 keep): 0xC000 | 14-bit multiplicative
/// hash of the QPN.
pub const fn rxe_default_source_port(qpn: rdma_types::Qpn) -> u16 {
    let h = qpn.value().wrapping_mul(0x61C8_8647) >> (32 - 14);
    ROCEV2_SOURCE_PORT_MIN | (h & 0x3FFF) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 and UDP headers of frame 5 of linux-ib_srp-to-lio-srpt-over-rxe
    /// .pcapng (an rxe ACK), without the 24 bytes of IB that follow.
    const V4_UDP: [u8; 28] = [
        0x45, // version 4, IHL 5
        0x00, // TOS 0
        0x00, 0x30, // total length 48
        0x23, 0x27, // identification 0x2327
        0x40, 0x00, // DF, offset 0
        0x40, // TTL 64
        0x11, // protocol UDP
        0x02, 0xcc, // header checksum
        0x0a, 0x63, 0x00, 0x03, // source 10.99.0.3
        0x0a, 0x63, 0x00, 0x02, // destination 10.99.0.2
        0xec, 0x4d, // UDP source port 0xEC4D (0xC000 | hash)
        0x12, 0xb7, // destination port 4791
        0x00, 0x1c, // UDP length 28
        0x00, 0x00, // checksum 0 (rxe sends none)
    ];

    /// IPv6 and UDP headers of frame 5 of userspace-cm-req-to-linux-rxe
    /// .pcapng (a user-space CM REQ over IPv6, with a UDP checksum).
    const V6_UDP: [u8; 48] = [
        0x60, 0x0c, 0xcd, 0xc4, // version 6, class 0, flow label 0xCCDC4
        0x01, 0x20, // payload length 288
        0x11, // next header UDP
        0x40, // hop limit 64
        0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, // source fd77::1
        0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, // destination fd77::2
        0x12, 0xb7, // UDP source port 4791
        0x12, 0xb7, // destination port 4791
        0x01, 0x20, // UDP length 288
        0xfc, 0x23, // checksum
    ];

    #[test]
    fn ipv4_header_round_trip() {
        let mut buf = [0u8; 48];
        buf[..28].copy_from_slice(&V4_UDP);
        let (ip, payload) = IpRepr::parse(&buf).unwrap();
        let IpRepr::V4(r) = ip else { panic!("not v4") };
        assert_eq!(r.src, Ipv4Addr::new(10, 99, 0, 3));
        assert_eq!(r.ident, 0x2327);
        assert!(r.dont_frag);
        assert_eq!((r.ttl, r.protocol, r.payload_len), (64, 17, 28));
        assert_eq!(payload.len(), 28);
        let mut out = [0u8; 20];
        ip.emit(&mut out);
        assert_eq!(out, V4_UDP[..20]);
    }

    #[test]
    fn ipv4_refusals() {
        let mut buf = [0u8; 48];
        buf[..28].copy_from_slice(&V4_UDP);
        let mut bad = buf;
        bad[11] ^= 1;
        assert!(matches!(
            IpRepr::parse(&bad),
            Err(ParseError::Checksum { .. })
        ));
        let mut opt = buf;
        opt[0] = 0x46;
        assert_eq!(
            IpRepr::parse(&opt).unwrap_err(),
            ParseError::Malformed {
                what: "IPv4",
                reason: "options (IHL > 5) are not supported on RoCEv2"
            }
        );
        let mut frag = buf;
        frag[6] = 0x20; // MF
        let mut p = Ipv4Packet::new_unchecked(&mut frag[..]);
        p.fill_checksum();
        assert!(matches!(
            IpRepr::parse(&frag),
            Err(ParseError::Malformed { .. })
        ));
        assert!(matches!(
            IpRepr::parse(&buf[..47]),
            Err(ParseError::Truncated { .. })
        ));
    }

    #[test]
    fn grh_area_layout() {
        let mut buf = [0u8; 48];
        buf[..28].copy_from_slice(&V4_UDP);
        let (ip, _) = IpRepr::parse(&buf).unwrap();
        let g = ip.grh_area();
        assert_eq!(g[..20], [0u8; 20]);
        assert_eq!(g[20..], V4_UDP[..20]);
        let mut buf = vec![0u8; 48 + 280];
        buf[..48].copy_from_slice(&V6_UDP);
        let (ip, _) = IpRepr::parse(&buf).unwrap();
        assert_eq!(ip.grh_area(), V6_UDP[..40]);
    }

    #[test]
    fn udp_zero_checksum() {
        let mut buf = [0u8; 48];
        buf[..28].copy_from_slice(&V4_UDP);
        let (ip, payload) = IpRepr::parse(&buf).unwrap();
        let p = UdpPacket::new_checked(payload).unwrap();
        let r = UdpRepr::parse(&p, ip.src_addr(), ip.dst_addr());
        assert_eq!(
            r,
            UdpRepr {
                src_port: 0xEC4D,
                dst_port: 4791,
                checksum: UdpChecksum::None
            }
        );
        assert_eq!(p.payload().len(), 20);
        let mut out = [0u8; 28];
        r.emit(
            &mut UdpPacket::new_unchecked(&mut out[..]),
            ip.src_addr(),
            ip.dst_addr(),
            20,
        );
        assert_eq!(out[..8], V4_UDP[20..28]);
    }

    #[test]
    fn ipv6_header_and_udp_checksum_from_capture() {
        // The 280 bytes of IB after the headers are not needed to check the
        // IPv6 header; the UDP checksum is checked on the full frame by the
        // capture test.
        let mut buf = vec![0u8; 48 + 280];
        buf[..48].copy_from_slice(&V6_UDP);
        let (ip, payload) = IpRepr::parse(&buf).unwrap();
        let IpRepr::V6(r) = ip else { panic!("not v6") };
        assert_eq!(r.flow_label, 0xCCDC4);
        assert_eq!(
            (r.traffic_class, r.hop_limit, r.next_header, r.payload_len),
            (0, 64, 17, 288)
        );
        assert_eq!(payload.len(), 288);
        let mut out = [0u8; 40];
        ip.emit(&mut out);
        assert_eq!(out, V6_UDP[..40]);
        // With all-zero IB bytes the carried checksum is wrong; it is kept
        // and emitted as it was.
        let p = UdpPacket::new_checked(payload).unwrap();
        let r = UdpRepr::parse(&p, ip.src_addr(), ip.dst_addr());
        assert_eq!(r.checksum, UdpChecksum::Invalid(0xFC23));
        let mut out = buf[40..].to_vec();
        r.emit(
            &mut UdpPacket::new_unchecked(&mut out[..]),
            ip.src_addr(),
            ip.dst_addr(),
            280,
        );
        assert_eq!(out[..8], V6_UDP[40..]);
    }

    #[test]
    fn udp_checksum_emit_then_verify() {
        let src: IpAddr = "fd77::1".parse().unwrap();
        let dst: IpAddr = "fd77::2".parse().unwrap();
        let mut buf = [0u8; 8 + 5];
        buf[8..].copy_from_slice(b"hello"); // odd length exercises the pad byte
        let r = UdpRepr {
            src_port: 1,
            dst_port: 4791,
            checksum: UdpChecksum::Valid,
        };
        r.emit(&mut UdpPacket::new_unchecked(&mut buf[..]), src, dst, 5);
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_ne!(p.checksum(), 0);
        assert_eq!(UdpRepr::parse(&p, src, dst), r);
        let other: IpAddr = "fd77::3".parse().unwrap();
        assert_eq!(
            UdpRepr::parse(&p, src, other).checksum,
            UdpChecksum::Invalid(p.checksum())
        );
    }

    /// Source ports of the rxe captures: QP1 MADs (hash of QPN 1), an
    /// ibv_rc_pingpong QP pair 0x11/0x11 (no flow label: derived from the
    /// QPNs), rping and ib_srp (flow labels 0x6066B and 0xC2C7D from their
    /// CM REQs).
    #[test]
    fn source_ports_match_rxe() {
        use rdma_types::Qpn;
        assert_eq!(rxe_default_source_port(Qpn::GSI), 0xD872);
        let q = Qpn::new(0x11).unwrap();
        assert_eq!(source_port_for_flow_label(flow_label_for_qps(q, q)), 0xC121);
        assert_eq!(source_port_for_flow_label(0x6066B), 0xC673);
        assert_eq!(source_port_for_flow_label(0xC2C7D), 0xEC4D);
    }
}
