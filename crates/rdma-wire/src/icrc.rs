//! Invariant CRC of RoCEv2 packets (IBA Annex A17, RoCEv2, on top of the
//! ICRC of IBA 7.8).
//!
//! CRC-32 (IEEE 802.3, reflected, the one `crc32fast` computes) over:
//! 8 bytes of 0xFF standing in for the masked LRH; the IP header with the
//! fields routers may change set to 1s (IPv4: TOS, TTL, header checksum;
//! IPv6: traffic class, flow label, hop limit); the UDP header with its
//! checksum set to 1s; the BTH with byte 4 (FECN, BECN, reserved) set to
//! 1s; then everything after the BTH up to, not including, the ICRC. The
//! IPv4 identification and lengths are covered, not masked. The result is
//! stored least significant byte first, i.e. little-endian.
//!
//! Nothing here allocates. The CRC runs over the packet bytes in place and
//! the masking is applied as a precomputed correction (see `Masks`); only
//! [`compute`] writes bytes, the IP and UDP headers it stands in for, on
//! the stack.

use crate::bth::HEADER_LEN as BTH_LEN;
use crate::ip::{IpRepr, UdpRepr, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use crate::{ParseError, ICRC_LEN};

/// CRC-32 of the 8 bytes of 0xFF that stand in for the masked LRH; the
/// hash starts from it (Linux rxe's seed 0xDEBB20E3 is the same state
/// before the final inversion).
const LRH_ONES_CRC: u32 = 0x2144_DF1C;

/// Reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xEDB8_8320;

/// Bytes the widest CRC kernel folds per step (`crc32fast`'s AVX-512
/// one: four 512-bit registers). An update whose length is a multiple of
/// it leaves nothing for the narrower kernels.
const WIDE_BLOCK: usize = 256;

/// How the masked prefix (IP + UDP + BTH) differs from the bytes as they
/// are: at each listed position the variant bits (`mask`) become 1s.
/// Rather than copying the prefix and setting bits (the CRC then reads
/// freshly stored bytes back, which stalls the pipeline: 40 ns instead of
/// 28 ns for a 64-byte packet here), the CRC runs over the bytes in place
/// and a correction is XORed in: CRC-32 is affine, so for messages of one
/// length crc(a ^ d) = crc(a) ^ L(d), with L linear. `tables[i][v]` is
/// L of a prefix that is zero except for `v` at `pos[i]`.
struct Masks {
    pos: [usize; 8],
    mask: [u8; 8],
    count: usize,
    tables: [[u32; 256]; 8],
}

impl Masks {
    /// `fields` are (position, variant bits) in a prefix of `len` bytes.
    const fn new(fields: &[(usize, u8)], len: usize) -> Masks {
        let mut m = Masks {
            pos: [0; 8],
            mask: [0; 8],
            count: fields.len(),
            tables: [[0; 256]; 8],
        };
        let mut i = 0;
        while i < fields.len() {
            let (pos, mask) = fields[i];
            m.pos[i] = pos;
            m.mask[i] = mask;
            // L of a single set bit: that bit, then 8 register steps per
            // byte from the field to the end of the prefix.
            let mut bits = [0u32; 8];
            let mut b = 0;
            while b < 8 {
                let mut r: u32 = 1 << b;
                let mut steps = 8 * (len - pos);
                while steps > 0 {
                    r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
                    steps -= 1;
                }
                bits[b] = r;
                b += 1;
            }
            let mut v = 0;
            while v < 256 {
                let mut acc = 0;
                let mut b = 0;
                while b < 8 {
                    if v & (1 << b) != 0 {
                        acc ^= bits[b];
                    }
                    b += 1;
                }
                m.tables[i][v] = acc;
                v += 1;
            }
            i += 1;
        }
        m
    }
}

/// IPv4 (20) + UDP (8) + BTH (12): TOS, TTL, header checksum, UDP
/// checksum, BTH byte 4 (FECN, BECN, reserved).
static MASKS_V4: Masks = Masks::new(
    &[
        (1, 0xFF),
        (8, 0xFF),
        (10, 0xFF),
        (11, 0xFF),
        (26, 0xFF),
        (27, 0xFF),
        (28 + 4, 0xFF),
    ],
    IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN,
);

/// IPv6 (40) + UDP (8) + BTH (12): traffic class and flow label (low
/// nibble of byte 0, bytes 1-3), hop limit, UDP checksum, BTH byte 4.
static MASKS_V6: Masks = Masks::new(
    &[
        (0, 0x0F),
        (1, 0xFF),
        (2, 0xFF),
        (3, 0xFF),
        (7, 0xFF),
        (46, 0xFF),
        (47, 0xFF),
        (48 + 4, 0xFF),
    ],
    IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN,
);

/// CRC of the 8 bytes of 1s and the masked IP + UDP + BTH prefix, read in
/// place. `ip_udp` is 28 (IPv4) or 48 (IPv6) bytes, `bth` at least 12.
fn prefix_crc(ip_udp: &[u8], bth: &[u8]) -> u32 {
    let n = ip_udp.len();
    let m = if n == IPV4_HEADER_LEN + UDP_HEADER_LEN {
        &MASKS_V4
    } else {
        &MASKS_V6
    };
    let mut fix = 0;
    for i in 0..m.count {
        let p = m.pos[i];
        let orig = if p < n { ip_udp[p] } else { bth[p - n] };
        fix ^= m.tables[i][usize::from(!orig & m.mask[i])];
    }
    let mut h = crc32fast::Hasher::new_with_initial(LRH_ONES_CRC);
    h.update(ip_udp);
    h.update(&bth[..BTH_LEN]);
    h.finalize() ^ fix
}

fn prefix_hasher(ip_udp: &[u8], bth: &[u8]) -> crc32fast::Hasher {
    crc32fast::Hasher::new_with_initial(prefix_crc(ip_udp, bth))
}

/// ICRC from the raw IP and UDP headers (`ip_udp`: 28 bytes for IPv4,
/// 48 for IPv6, version taken from the first nibble) and the IB part
/// without its ICRC (`ib`: BTH, extension headers, payload, pad).
///
/// # Errors
/// [`ParseError::Truncated`]/[`ParseError::Malformed`] if the lengths do
/// not fit the version or `ib` is shorter than a BTH.
pub fn compute_raw(ip_udp: &[u8], ib: &[u8]) -> Result<u32, ParseError> {
    check_lengths(ip_udp, ib)?;
    let mut h = prefix_hasher(ip_udp, ib);
    h.update(&ib[BTH_LEN..]);
    Ok(h.finalize())
}

fn check_lengths(ip_udp: &[u8], ib: &[u8]) -> Result<(), ParseError> {
    let want = match ip_udp.first().map(|b| b >> 4) {
        Some(4) => IPV4_HEADER_LEN + UDP_HEADER_LEN,
        Some(6) => IPV6_HEADER_LEN + UDP_HEADER_LEN,
        _ => {
            return Err(ParseError::Malformed {
                what: "ICRC",
                reason: "IP version is neither 4 nor 6",
            })
        }
    };
    if ip_udp.len() != want {
        return Err(ParseError::Malformed {
            what: "ICRC",
            reason: "IP+UDP header length does not match the version",
        });
    }
    if ib.len() < BTH_LEN {
        return Err(ParseError::Truncated {
            what: "ICRC",
            need: BTH_LEN,
            have: ib.len(),
        });
    }
    Ok(())
}

/// ICRC of a whole IP packet (IP header through the 4-byte ICRC trailer,
/// which is excluded from the computation). The header lengths are taken
/// from the version; IPv4 options are refused.
///
/// # Errors
/// If the packet is too short for IP, UDP, BTH and ICRC, or has options.
pub fn compute_ip_packet(ip_packet: &[u8]) -> Result<u32, ParseError> {
    let hdr = match ip_packet.first().copied() {
        Some(0x45) => IPV4_HEADER_LEN + UDP_HEADER_LEN,
        Some(b) if b >> 4 == 6 => IPV6_HEADER_LEN + UDP_HEADER_LEN,
        _ => {
            return Err(ParseError::Malformed {
                what: "ICRC",
                reason: "not IPv4 without options or IPv6",
            })
        }
    };
    let end = ip_packet
        .len()
        .checked_sub(ICRC_LEN)
        .filter(|&e| e >= hdr + BTH_LEN);
    let Some(end) = end else {
        return Err(ParseError::Truncated {
            what: "ICRC",
            need: hdr + BTH_LEN + ICRC_LEN,
            have: ip_packet.len(),
        });
    };
    compute_raw(&ip_packet[..hdr], &ip_packet[hdr..end])
}

/// The ICRC trailer of a UDP payload, read least significant byte first.
pub fn trailer(udp_payload: &[u8]) -> Option<u32> {
    let n = udp_payload.len().checked_sub(ICRC_LEN)?;
    let t = &udp_payload[n..];
    Some(u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
}

/// Writes `icrc` as the trailer (the last 4 bytes of `udp_payload`).
///
/// # Panics
/// If `udp_payload` is shorter than 4 bytes.
pub fn write_trailer(udp_payload: &mut [u8], icrc: u32) {
    let n = udp_payload.len() - ICRC_LEN;
    udp_payload[n..].copy_from_slice(&icrc.to_le_bytes());
}

/// Writes the IP and UDP headers a packet with these reprs would carry
/// (for the IB part `ib_len` bytes long, ICRC excluded) into `out`;
/// returns their length. Masked fields are left as the repr has them.
fn synth_headers(
    ip: &IpRepr,
    udp: &UdpRepr,
    ib_len: usize,
    out: &mut [u8; IPV6_HEADER_LEN + UDP_HEADER_LEN],
) -> usize {
    let udp_len = UDP_HEADER_LEN + ib_len + ICRC_LEN;
    let mut ip = *ip;
    ip.set_payload_len(udp_len);
    let n = ip.buffer_len();
    ip.emit(&mut out[..n]);
    let u = &mut out[n..n + UDP_HEADER_LEN];
    u[0..2].copy_from_slice(&udp.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&udp.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    u[6..8].fill(0xFF); // masked anyway
    n + UDP_HEADER_LEN
}

/// ICRC for an IB part (`ib`: BTH through pad, no ICRC) sent or received
/// with these IP and UDP headers. This is what a NIC that only sees the
/// UDP payload (a UDP socket) uses: the IP fields that are not masked
/// (addresses, identification, DF, protocol, lengths) come from `ip`.
///
/// # Errors
/// If `ib` is shorter than a BTH or the datagram exceeds the IP length
/// fields.
pub fn compute(ip: &IpRepr, udp: &UdpRepr, ib: &[u8]) -> Result<u32, ParseError> {
    if UDP_HEADER_LEN + ib.len() + ICRC_LEN > ip.max_payload_len() {
        return Err(ParseError::Malformed {
            what: "ICRC",
            reason: "datagram longer than the IP length field allows",
        });
    }
    let mut hdr = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN];
    let n = synth_headers(ip, udp, ib.len(), &mut hdr);
    compute_raw(&hdr[..n], ib)
}

/// [`compute`] for an IB part held in pieces: `ib` is the concatenation of
/// `parts` (the first holding at least the whole BTH), as a sender that
/// gathers headers, payload and pad into one datagram with iovecs has it.
///
/// # Errors
/// As [`compute`].
pub fn compute_vectored(ip: &IpRepr, udp: &UdpRepr, parts: &[&[u8]]) -> Result<u32, ParseError> {
    let ib_len: usize = parts.iter().map(|p| p.len()).sum();
    let first = parts.first().copied().unwrap_or_default();
    if UDP_HEADER_LEN + ib_len + ICRC_LEN > ip.max_payload_len() {
        return Err(ParseError::Malformed {
            what: "ICRC",
            reason: "datagram longer than the IP length field allows",
        });
    }
    let mut hdr = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN];
    let n = synth_headers(ip, udp, ib_len, &mut hdr);
    check_lengths(&hdr[..n], first)?;
    let mut h = prefix_hasher(&hdr[..n], first);
    h.update(&first[BTH_LEN..]);
    for p in &parts[1..] {
        h.update(p);
    }
    Ok(h.finalize())
}

/// The ICRC computation split at the end of the UDP header: the CRC state
/// after the 8 bytes of 1s and the masked IP and UDP headers of datagrams
/// with these headers whose IB part (BTH through pad, ICRC excluded) is
/// `ib_len` bytes. Those headers are the same for every datagram of one
/// length between two ports (the IPv4 Identification aside, which
/// [`Ipv4IdentDelta`] covers), so a NIC computes this once per peer and
/// length and runs only [`finish_vectored`] per packet: synthesizing and
/// hashing 28 or 48 header bytes was a tenth of the per-packet work of a
/// 4 KiB packet outside the payload's own CRC.
///
/// # Errors
/// As [`compute`]: `ib_len` is shorter than a BTH or too long for the IP
/// length fields.
pub fn header_state(ip: &IpRepr, udp: &UdpRepr, ib_len: usize) -> Result<u32, ParseError> {
    if UDP_HEADER_LEN + ib_len + ICRC_LEN > ip.max_payload_len() {
        return Err(ParseError::Malformed {
            what: "ICRC",
            reason: "datagram longer than the IP length field allows",
        });
    }
    if ib_len < BTH_LEN {
        return Err(ParseError::Truncated {
            what: "ICRC",
            need: BTH_LEN,
            have: ib_len,
        });
    }
    let mut hdr = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN];
    let n = synth_headers(ip, udp, ib_len, &mut hdr);
    let m = if n == IPV4_HEADER_LEN + UDP_HEADER_LEN {
        &MASKS_V4
    } else {
        &MASKS_V6
    };
    for i in 0..m.count {
        if let Some(b) = hdr[..n].get_mut(m.pos[i]) {
            *b |= m.mask[i];
        }
    }
    let mut h = crc32fast::Hasher::new_with_initial(LRH_ONES_CRC);
    h.update(&hdr[..n]);
    Ok(h.finalize())
}

/// The ICRC of an IB part held in `parts` (their concatenation: BTH
/// through pad, the first part holding at least the whole BTH), from the
/// state [`header_state`] gave for its headers and total length. The
/// caller keeps the two consistent: `state` must be for
/// `parts`' total length.
///
/// # Errors
/// [`ParseError::Truncated`] if the first part is shorter than a BTH.
pub fn finish_vectored(state: u32, parts: &[&[u8]]) -> Result<u32, ParseError> {
    let first = parts.first().copied().unwrap_or_default();
    let Some(bth) = first.get(..BTH_LEN) else {
        return Err(ParseError::Truncated {
            what: "ICRC",
            need: BTH_LEN,
            have: first.len(),
        });
    };
    // The BTH with byte 4 (FECN, BECN, reserved) masked to 1s, then the
    // headers after it in the same call: short updates are the slow ones.
    // When the first part runs on into a payload (a received packet), only
    // what lies past the payload's last whole block is taken along, so
    // the long update starts on a block boundary of the wide CRC kernel
    // and leaves no tail for its slower narrow one (a 4 KiB payload behind
    // 12-28 header bytes: 75 ns instead of 140).
    let mut head = [0u8; 64];
    let rest = &first[BTH_LEN..];
    let inline = match rest.len() % WIDE_BLOCK {
        over if rest.len() > WIDE_BLOCK && over <= head.len() - BTH_LEN => over,
        _ => rest.len().min(head.len() - BTH_LEN),
    };
    head[..BTH_LEN].copy_from_slice(bth);
    head[4] = 0xFF;
    head[BTH_LEN..BTH_LEN + inline].copy_from_slice(&rest[..inline]);
    let mut h = crc32fast::Hasher::new_with_initial(state);
    h.update(&head[..BTH_LEN + inline]);
    h.update(&rest[inline..]);
    for p in &parts[1..] {
        h.update(p);
    }
    Ok(h.finalize())
}

/// [`finish_vectored`] for packets whose BTH differs only in its last
/// four bytes (AckReq and PSN) -- the middle packets of one message --
/// and whose IP and UDP headers are the same: the CRC state after the
/// headers and the BTH's first eight bytes (byte 4 masked), taken once;
/// each packet hashes only its last four BTH bytes and what follows.
#[derive(Clone)]
pub struct SharedBthHead(crc32fast::Hasher);

impl SharedBthHead {
    /// From `state` ([`header_state`] for the packets' length) and the
    /// first eight bytes of `bth`; `None` if it is shorter than a BTH.
    pub fn new(state: u32, bth: &[u8]) -> Option<SharedBthHead> {
        let head = bth.get(..BTH_LEN)?;
        let mut fixed = [0u8; 8];
        fixed.copy_from_slice(&head[..8]);
        fixed[4] = 0xFF;
        let mut h = crc32fast::Hasher::new_with_initial(state);
        h.update(&fixed);
        Some(SharedBthHead(h))
    }

    /// The ICRC of the packet whose BTH is `bth` (its first eight bytes
    /// those given to [`SharedBthHead::new`]) followed by `rest`.
    /// `None` if `bth` is shorter than a BTH.
    pub fn finish(&self, bth: &[u8], rest: &[&[u8]]) -> Option<u32> {
        let tail = bth.get(8..BTH_LEN)?;
        let mut h = self.0.clone();
        h.update(tail);
        for p in rest {
            h.update(p);
        }
        Some(h.finalize())
    }
}

/// What flipping each bit of the IPv4 identification does to the ICRC,
/// given what flipping bit 7 does. The CRC takes input bits least
/// significant first within each byte, so of the ID bytes (high, then low)
/// bit 7 enters last; any other ID bit entered `k` bit times earlier and
/// went through `k` more zero-input register steps (multiplications by x).
fn ident_bit_deltas(bit7: u32) -> [u32; 16] {
    let step = |r: u32| if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
    let mut delta = [0u32; 16];
    for (j, d) in delta.iter_mut().enumerate() {
        // Position in input order: high byte bits 8..=15 first, then 0..=7.
        let order = if j < 8 { 8 + j } else { j - 8 };
        let mut r = bit7;
        for _ in order..15 {
            r = step(r);
        }
        *d = r;
    }
    delta
}

/// How the ICRC of a RoCEv2 datagram over IPv4 changes with the IPv4
/// Identification alone. The CRC is affine, so for datagrams of one length
/// the change from Identification 0 to `k` is the same XOR whatever the
/// addresses, ports and contents: a sender that learns its datagram will
/// leave with Identification `k` (the segments of a GSO send get 0, 1, 2,
/// …) turns an ICRC computed for 0 into the right one with one XOR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdentDelta {
    bits: [u32; 16],
}

impl Ipv4IdentDelta {
    /// The deltas for datagrams whose IB part (BTH through pad, ICRC
    /// excluded) is `ib_len` bytes, or `None` if that is shorter than a BTH
    /// or too long for IPv4.
    pub fn for_ib_len(ib_len: usize) -> Option<Ipv4IdentDelta> {
        if ib_len < BTH_LEN {
            return None;
        }
        let zeros = vec![0u8; ib_len];
        let any = core::net::IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED);
        let IpRepr::V4(v4) = IpRepr::rocev2(any, any, UDP_HEADER_LEN + ib_len + ICRC_LEN)? else {
            return None;
        };
        let udp = UdpRepr {
            src_port: 0,
            dst_port: 0,
            checksum: crate::ip::UdpChecksum::None,
        };
        let crc_with = |ident: u16| {
            let mut r = v4;
            r.ident = ident;
            compute(&IpRepr::V4(r), &udp, &zeros).ok()
        };
        let base = crc_with(0)?;
        Some(Ipv4IdentDelta {
            bits: ident_bit_deltas(crc_with(0x0080)? ^ base),
        })
    }

    /// What to XOR into an ICRC computed with Identification 0 to get the
    /// ICRC under `ident`.
    pub fn delta(&self, ident: u16) -> u32 {
        (0..16)
            .filter(|j| ident & (1 << j) != 0)
            .fold(0, |acc, j| acc ^ self.bits[j])
    }

    /// `delta(0)`, `delta(1)`, … `delta(0xffff)` in turn, each from the one
    /// before: only the bits that change from `k - 1` to `k` (two on
    /// average) are folded in, which suits the segments of a GSO send.
    pub fn deltas(&self) -> impl Iterator<Item = u32> + '_ {
        (0..=u32::from(u16::MAX)).scan(0u32, move |acc, k| {
            let mut changed = if k == 0 { 0 } else { k ^ (k - 1) };
            while changed != 0 {
                *acc ^= self.bits[changed.trailing_zeros() as usize];
                changed &= changed - 1;
            }
            Some(*acc)
        })
    }
}

/// Finds the IPv4 identification under which `icrc` is the ICRC of `ib`
/// with these headers (`ip.ident` is ignored). Linux rxe sends IDs from a
/// per-destination counter that a UDP socket cannot see (INTEROP.md); the
/// CRC is affine in the ID bits, so two CRCs of the packet (ID 0 and ID
/// 0x0080), register steps for the other bits and a 16-unknown linear
/// solve decide it; at most one ID can match.
///
/// Returns `None` if no ID matches (a corrupted packet), or for IPv6.
pub fn recover_ipv4_ident(ip: &IpRepr, udp: &UdpRepr, ib: &[u8], icrc: u32) -> Option<u16> {
    let IpRepr::V4(v4) = ip else { return None };
    if ib.len() < BTH_LEN || UDP_HEADER_LEN + ib.len() + ICRC_LEN > ip.max_payload_len() {
        return None;
    }
    let crc_with = |ident: u16| {
        let mut r = *v4;
        r.ident = ident;
        let mut hdr = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN];
        let n = synth_headers(&IpRepr::V4(r), udp, ib.len(), &mut hdr);
        let mut h = prefix_hasher(&hdr[..n], ib);
        h.update(&ib[BTH_LEN..]);
        h.finalize()
    };
    let base = crc_with(0);
    let delta = ident_bit_deltas(crc_with(0x0080) ^ base);
    // Solve sum(x_i * delta_i) = icrc ^ base over GF(2) by elimination.
    // CRC-32 detects every burst of up to 32 bits, so the 16 deltas are
    // independent and a solution, if any, is unique.
    let mut basis = [(0u32, 0u16); 32]; // by leading bit: (vector, which IDs bits)
    for (i, &d) in delta.iter().enumerate() {
        let (mut v, mut c) = (d, 1u16 << i);
        while v != 0 {
            let top = 31 - v.leading_zeros() as usize;
            if basis[top].0 == 0 {
                basis[top] = (v, c);
                break;
            }
            v ^= basis[top].0;
            c ^= basis[top].1;
        }
    }
    let (mut t, mut ident) = (icrc ^ base, 0u16);
    while t != 0 {
        let top = 31 - t.leading_zeros() as usize;
        if basis[top].0 == 0 {
            return None;
        }
        t ^= basis[top].0;
        ident ^= basis[top].1;
    }
    Some(ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept BTH head gives, for any AckReq and PSN bytes and any
    /// payload, what `finish_vectored` gives for the whole packet; a
    /// change in the first eight BTH bytes is not its packet's.
    #[test]
    fn a_shared_bth_head_finishes_as_the_whole_packet() {
        let ip = IpRepr::rocev2(
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
            8 + 12 + 1024 + ICRC_LEN,
        )
        .unwrap();
        let udp = UdpRepr {
            src_port: 0xC000,
            dst_port: 4791,
            checksum: crate::ip::UdpChecksum::None,
        };
        let state = header_state(&ip, &udp, 12 + 1024).unwrap();
        let mut bth: [u8; 12] = [0x07, 0, 0xFF, 0xFF, 0x40, 0, 0, 0x22, 0, 0, 0, 0];
        let shared = SharedBthHead::new(state, &bth).unwrap();
        let payload: Vec<u8> = (0..1024u32).map(|i| (i * 13 + 5) as u8).collect();
        for (ack, psn) in [(0u8, 1u32), (0x80, 2), (0, 0xFF_FFFF), (0x80, 0x12_3456)] {
            bth[8] = ack;
            bth[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
            let whole = finish_vectored(state, &[&bth, &payload]).unwrap();
            assert_eq!(shared.finish(&bth, &[&payload]), Some(whole));
            // Byte 4 is masked either way; byte 3 is not.
            let mut other = bth;
            other[4] = 0x80;
            assert_eq!(shared.finish(&other, &[&payload]), Some(whole));
            other[3] ^= 1;
            assert_ne!(finish_vectored(state, &[&other, &payload]).unwrap(), whole);
        }
        assert!(shared.finish(&bth[..11], &[&payload]).is_none());
        assert!(SharedBthHead::new(state, &bth[..11]).is_none());
    }

    #[test]
    fn split_computation_matches_the_whole_one() {
        // The captured rxe ACK: headers hashed once, then the IB part.
        let ip_udp = &ACK[..28];
        let ib = &ACK[28..ACK.len() - ICRC_LEN];
        let mut ip = IpRepr::rocev2(
            Ipv4Addr::new(10, 99, 0, 3).into(),
            Ipv4Addr::new(10, 99, 0, 2).into(),
            48 - 20,
        )
        .unwrap();
        if let IpRepr::V4(v4) = &mut ip {
            v4.ident = 0x2327;
        }
        let udp = UdpRepr {
            src_port: 0xEC4D,
            dst_port: 4791,
            checksum: crate::ip::UdpChecksum::None,
        };
        let state = header_state(&ip, &udp, ib.len()).unwrap();
        assert_eq!(finish_vectored(state, &[ib]).unwrap(), 0xF424_8C79);
        assert_eq!(compute_raw(ip_udp, ib).unwrap(), 0xF424_8C79);
        // Any split of a longer IB part, including long first parts and
        // empty pieces, gives what `compute` gives; byte 4 of the BTH and
        // nothing else is masked.
        let mut body: Vec<u8> = (0..4200u32).map(|i| (i * 7 + 3) as u8).collect();
        let v6 = IpRepr::rocev2(
            "fe80::1".parse().unwrap(),
            "fe80::2".parse().unwrap(),
            8 + body.len() + ICRC_LEN,
        )
        .unwrap();
        for ip in [ip, v6] {
            let whole = compute(&ip, &udp, &body).unwrap();
            let state = header_state(&ip, &udp, body.len()).unwrap();
            for cut in [12, 13, 28, 40, 76, 77, 200, 4100, 4200] {
                let (a, b) = body.split_at(cut);
                assert_eq!(
                    finish_vectored(state, &[a, &[], b]).unwrap(),
                    whole,
                    "cut {cut}"
                );
            }
            body[4] ^= 0x5A;
            assert_eq!(
                finish_vectored(state, &[&body]).unwrap(),
                whole,
                "byte 4 masked"
            );
            body[5] ^= 1;
            assert_ne!(
                finish_vectored(state, &[&body]).unwrap(),
                whole,
                "byte 5 covered"
            );
            body[5] ^= 1;
        }
        // A received packet comes as one part. Lengths where the bytes
        // past the last 256-byte block fit the inline header buffer
        // (a BTH before a 4 KiB payload, with and without a RETH) take
        // them along; others (53 over) inline as before.
        for len in [
            12 + 256,
            12 + 4096,
            28 + 4096,
            12 + 52 + 4096,
            12 + 53 + 4096,
            12 + 255,
        ] {
            let ip = IpRepr::rocev2(
                Ipv4Addr::new(10, 0, 0, 1).into(),
                Ipv4Addr::new(10, 0, 0, 2).into(),
                8 + len + ICRC_LEN,
            )
            .unwrap();
            let whole = compute(&ip, &udp, &body[..len]).unwrap();
            let state = header_state(&ip, &udp, len).unwrap();
            assert_eq!(
                finish_vectored(state, &[&body[..len]]).unwrap(),
                whole,
                "{len}"
            );
        }
        assert!(finish_vectored(state, &[&body[..11], &body[11..]]).is_err());
        assert!(header_state(&v6, &udp, 11).is_err());
        assert!(header_state(&v6, &udp, 70_000).is_err());
    }
    use crate::ip::Ipv4Repr;
    use core::net::Ipv4Addr;

    /// Frame 5 of linux-ib_srp-to-lio-srpt-over-rxe.pcapng without its
    /// Ethernet header: an rxe RC ACK whose ICRC is 0xF4248C79.
    const ACK: [u8; 48] = [
        0x45, 0x00, 0x00, 0x30, // IPv4, TOS 0 (masked), total length 48
        0x23, 0x27, 0x40, 0x00, // ID 0x2327 (covered), DF
        0x40, 0x11, 0x02, 0xcc, // TTL 64 (masked), UDP, checksum (masked)
        0x0a, 0x63, 0x00, 0x03, // 10.99.0.3
        0x0a, 0x63, 0x00, 0x02, // 10.99.0.2
        0xec, 0x4d, 0x12, 0xb7, // UDP ports 0xEC4D -> 4791
        0x00, 0x1c, 0x00, 0x00, // UDP length 28, checksum 0 (masked)
        0x11, 0x00, 0xff, 0xff, // BTH: Acknowledge, flags 0, P_Key 0xFFFF
        0x00, 0x00, 0x00, 0x11, // byte 4 (masked), DestQP 0x11
        0x00, 0x2d, 0x75, 0x46, // AckReq 0, PSN 0x2D7546
        0x1f, 0x00, 0x00, 0x01, // AETH: ACK unlimited credits, MSN 1
        0x79, 0x8c, 0x24, 0xf4, // ICRC, least significant byte first
    ];

    /// The annex's recipe written out the slow way: copy, set the variant
    /// fields to 1s, CRC the lot.
    fn reference(ip_udp: &[u8], ib: &[u8]) -> u32 {
        let mut m = vec![0xFFu8; 8];
        m.extend_from_slice(ip_udp);
        m.extend_from_slice(ib);
        let ones: &[usize] = if ip_udp[0] >> 4 == 4 {
            &[1, 8, 10, 11, 26, 27, 32]
        } else {
            &[1, 2, 3, 7, 46, 47, 52]
        };
        for &p in ones {
            m[8 + p] = 0xFF;
        }
        if ip_udp[0] >> 4 == 6 {
            m[8] |= 0x0F;
        }
        crc32fast::hash(&m)
    }

    #[test]
    fn in_place_correction_equals_the_masked_copy() {
        let mut x: u64 = 0x1234_5678_9ABC_DEF1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        for round in 0..500 {
            let v6 = round % 2 == 1;
            let hdr = if v6 { 48 } else { 28 };
            let len = hdr + 12 + (round % 70);
            let mut b: Vec<u8> = (0..len).map(|_| next()).collect();
            b[0] = (b[0] & 0x0F) | if v6 { 0x60 } else { 0x40 };
            let (ip_udp, ib) = b.split_at(hdr);
            assert_eq!(
                compute_raw(ip_udp, ib),
                Ok(reference(ip_udp, ib)),
                "round {round}"
            );
        }
    }

    #[test]
    fn lrh_seed_is_the_crc_of_eight_ones_bytes() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), LRH_ONES_CRC);
    }

    #[test]
    fn capture_vector() {
        assert_eq!(compute_ip_packet(&ACK), Ok(0xF424_8C79));
        assert_eq!(trailer(&ACK), Some(0xF424_8C79));
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc_covered_ones_do() {
        let base = compute_ip_packet(&ACK).unwrap();
        // Masked: TOS, TTL, IP checksum, UDP checksum, BTH byte 4.
        for i in [1, 8, 10, 11, 26, 27, 32] {
            let mut v = ACK;
            v[i] ^= 0x5A;
            assert_eq!(compute_ip_packet(&v), Ok(base), "byte {i} must be masked");
        }
        // Covered: everything else before the ICRC.
        for i in (0..44).filter(|i| ![0, 1, 8, 10, 11, 26, 27, 32].contains(i)) {
            let mut v = ACK;
            v[i] ^= 0x01;
            assert_ne!(compute_ip_packet(&v), Ok(base), "byte {i} must be covered");
        }
    }

    #[test]
    fn recovers_the_ipv4_id_rxe_used() {
        let ip = IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 99, 0, 3),
            dst: Ipv4Addr::new(10, 99, 0, 2),
            tos: 0,
            ident: 0, // unknown to a UDP socket
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        });
        let udp = UdpRepr {
            src_port: 0xEC4D,
            dst_port: 4791,
            checksum: crate::ip::UdpChecksum::None,
        };
        let ib = &ACK[28..44];
        assert_eq!(recover_ipv4_ident(&ip, &udp, ib, 0xF424_8C79), Some(0x2327));
        let IpRepr::V4(mut known) = ip else {
            unreachable!()
        };
        known.ident = 0x2327;
        assert_eq!(compute(&IpRepr::V4(known), &udp, ib), Ok(0xF424_8C79));
        // The same bytes in pieces (BTH, AETH split anywhere) give the same.
        for cut in 12..=ib.len() {
            let (a, b) = ib.split_at(cut);
            let got = compute_vectored(&IpRepr::V4(known), &udp, &[a, b, &[]]);
            assert_eq!(got, Ok(0xF424_8C79), "cut at {cut}");
        }
        let short = compute_vectored(&IpRepr::V4(known), &udp, &[&ib[..11], &ib[11..]]);
        assert!(short.is_err(), "the first piece must hold the BTH");
        // A one-bit error in the ICRC matches no ID.
        assert_eq!(recover_ipv4_ident(&ip, &udp, ib, 0xF424_8C78), None);
    }

    #[test]
    fn ident_delta_turns_an_id0_icrc_into_the_captured_one() {
        // The rxe ACK above left with ID 0x2327 and ICRC 0xF4248C79.
        let ib = &ACK[28..44];
        let mut v = ACK;
        v[4..6].fill(0);
        let at_zero = compute_raw(&v[..28], ib).unwrap();
        assert_ne!(at_zero, 0xF424_8C79);
        let d = Ipv4IdentDelta::for_ib_len(ib.len()).unwrap();
        assert_eq!(at_zero ^ d.delta(0x2327), 0xF424_8C79);
        assert_eq!(d.delta(0), 0);
        // Every ID of a GSO run, checked against a direct computation.
        for ident in [1u16, 2, 15, 63, 0xFFFF] {
            v[4..6].copy_from_slice(&ident.to_be_bytes());
            assert_eq!(at_zero ^ d.delta(ident), compute_raw(&v[..28], ib).unwrap());
        }
        assert_eq!(Ipv4IdentDelta::for_ib_len(4), None);
    }

    #[test]
    fn ident_deltas_match_direct_computation() {
        let ib = &ACK[28..44];
        let with = |ident: u16| {
            let mut v = ACK;
            v[4..6].copy_from_slice(&ident.to_be_bytes());
            compute_raw(&v[..28], ib).unwrap()
        };
        let base = with(0);
        let delta = ident_bit_deltas(with(0x80) ^ base);
        for (j, d) in delta.iter().enumerate() {
            assert_eq!(*d, with(1 << j) ^ base, "ID bit {j}");
        }
    }

    #[test]
    fn running_deltas_equal_the_direct_ones() {
        let d = Ipv4IdentDelta::for_ib_len(4096 + 12).unwrap();
        let mut n = 0u32;
        for (k, running) in d.deltas().enumerate() {
            assert_eq!(running, d.delta(k as u16), "ID {k}");
            n += 1;
        }
        assert_eq!(n, 0x10000, "every Identification, then the end");
        assert_ne!(d.delta(1), 0);
    }

    #[test]
    fn refuses_bad_lengths() {
        assert!(compute_ip_packet(&ACK[..43]).is_err());
        assert!(compute_raw(&ACK[..27], &ACK[28..44]).is_err());
        assert!(compute_raw(&ACK[..28], &ACK[28..39]).is_err());
        let mut v = ACK;
        v[0] = 0x46;
        assert!(compute_ip_packet(&v).is_err());
    }
}
