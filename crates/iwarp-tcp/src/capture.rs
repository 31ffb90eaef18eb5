//! pcap capture of a NIC's streams (issue 31, item 4), for tshark's
//! `iwarp_mpa` and `iwarp_ddp_rdmap` dissectors.
//!
//! The kernel owns the TCP segments, so the capture makes its own: each
//! stream becomes a TCP conversation in IPv4 packets (LINKTYPE_RAW) that
//! opens with a three-way handshake, carries exactly the bytes the NIC
//! wrote and read, in order, with sequence and acknowledgement numbers
//! that count them, and ends with a FIN when the NIC closes the stream.
//! Segment boundaries are the NIC's writes and reads (cut at 64 000
//! bytes), not the wire's; everything above TCP is byte for byte what
//! crossed the socket. IPv6 streams are not captured.

use std::collections::HashMap;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use mio::Token;
use rdma_types::Instant;
use rdma_wire::ip::{Ipv4Packet, Ipv4Repr};
use rdma_wire::pcap::{LinkType, PcapWriter};

/// The TCP header fields the capture writes (RFC 9293 3.1).
mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    pub const OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const HEADER_LEN: usize = 20;
}

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// Largest payload of one captured segment (an IPv4 packet's length is
/// 16 bits).
const SEGMENT: usize = 64_000;

struct Stream {
    local: (Ipv4Addr, u16),
    peer: (Ipv4Addr, u16),
    /// Next sequence number we send, and the peer.
    tx: u32,
    rx: u32,
}

/// One NIC's capture file.
pub(crate) struct Capture {
    out: PcapWriter<File>,
    streams: HashMap<Token, Stream>,
}

fn v4(a: SocketAddr) -> Option<(Ipv4Addr, u16)> {
    match a.ip() {
        IpAddr::V4(ip) => Some((ip, a.port())),
        IpAddr::V6(ip) => ip.to_ipv4_mapped().map(|ip| (ip, a.port())),
    }
}

fn now() -> Instant {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Instant::from_micros(t.as_micros() as u64)
}

/// The ones' complement sum of `data` added to `sum`.
fn sum16(mut sum: u32, data: &[u8]) -> u32 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Capture {
    /// Creates (truncates) `path` and writes the pcap header.
    pub(crate) fn create(path: &Path) -> std::io::Result<Capture> {
        Ok(Capture {
            out: PcapWriter::new(File::create(path)?, LinkType::Raw)?,
            streams: HashMap::new(),
        })
    }

    /// A new stream `tok` between `local` and `peer`; `we_connected` says
    /// who sent the SYN.
    pub(crate) fn open(
        &mut self,
        tok: Token,
        local: SocketAddr,
        peer: SocketAddr,
        we_connected: bool,
    ) {
        let (Some(local), Some(peer)) = (v4(local), v4(peer)) else {
            return;
        };
        // Initial sequence numbers of our own choosing.
        let mut s = Stream {
            local,
            peer,
            tx: 1_000,
            rx: 500_000,
        };
        if we_connected {
            self.segment(&mut s, true, SYN, &[]);
            self.segment(&mut s, false, SYN | ACK, &[]);
            self.segment(&mut s, true, ACK, &[]);
        } else {
            self.segment(&mut s, false, SYN, &[]);
            self.segment(&mut s, true, SYN | ACK, &[]);
            self.segment(&mut s, false, ACK, &[]);
        }
        self.streams.insert(tok, s);
    }

    /// Bytes the NIC wrote to stream `tok` (`out`) or read from it.
    pub(crate) fn data(&mut self, tok: Token, out: bool, bytes: &[u8]) {
        let Some(mut s) = self.streams.remove(&tok) else {
            return;
        };
        for chunk in bytes.chunks(SEGMENT) {
            self.segment(&mut s, out, PSH | ACK, chunk);
        }
        self.streams.insert(tok, s);
    }

    /// The NIC closed stream `tok` (`by_us`) or saw its end.
    pub(crate) fn close(&mut self, tok: Token, by_us: bool) {
        if let Some(mut s) = self.streams.remove(&tok) {
            self.segment(&mut s, by_us, FIN | ACK, &[]);
        }
    }

    /// Writes one segment in direction `out` (ours) or the peer's, and
    /// advances that direction's sequence number.
    fn segment(&mut self, s: &mut Stream, out: bool, flags: u8, payload: &[u8]) {
        let (src, dst, seq, ack) = if out {
            (s.local, s.peer, s.tx, s.rx)
        } else {
            (s.peer, s.local, s.rx, s.tx)
        };
        let mut tcp = vec![0u8; field::HEADER_LEN + payload.len()];
        tcp[field::SRC_PORT].copy_from_slice(&src.1.to_be_bytes());
        tcp[field::DST_PORT].copy_from_slice(&dst.1.to_be_bytes());
        tcp[field::SEQ].copy_from_slice(&seq.to_be_bytes());
        // No ACK number on the first SYN (RFC 9293 3.1).
        let a = if flags & ACK != 0 { ack } else { 0 };
        tcp[field::ACK].copy_from_slice(&a.to_be_bytes());
        tcp[field::OFFSET] = ((field::HEADER_LEN / 4) as u8) << 4;
        tcp[field::FLAGS] = flags;
        tcp[field::WINDOW].copy_from_slice(&0xffffu16.to_be_bytes());
        tcp[field::HEADER_LEN..].copy_from_slice(payload);
        // The pseudo-header: addresses, protocol 6, TCP length.
        let mut sum = sum16(0, &src.0.octets());
        sum = sum16(sum, &dst.0.octets());
        sum += 6 + tcp.len() as u32;
        let c = fold(sum16(sum, &tcp));
        tcp[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        let ip = Ipv4Repr {
            src: src.0,
            dst: dst.0,
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 6,
            payload_len: tcp.len(),
        };
        let mut pkt = vec![0u8; ip.buffer_len() + tcp.len()];
        let mut view = Ipv4Packet::new_unchecked(&mut pkt[..]);
        ip.emit(&mut view);
        view.payload_mut().copy_from_slice(&tcp);
        // A capture that cannot be written is given up quietly: it is a
        // diagnostic, the NIC runs on.
        let _ = self.out.write_packet(now(), &pkt);
        let step = payload.len() as u32 + u32::from(flags & (SYN | FIN) != 0);
        if out {
            s.tx = s.tx.wrapping_add(step);
        } else {
            s.rx = s.rx.wrapping_add(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_segment() {
        // RFC 1071's example words: 0001 f203 f4f5 f6f7 sum to ddf2,
        // whose complement is 220d.
        assert_eq!(
            fold(sum16(0, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])),
            0x220d
        );
    }
}
