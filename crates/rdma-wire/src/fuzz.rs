//! Bodies of the fuzz targets in `fuzz/fuzz_targets/`, here so the plain
//! `#[test]` in `tests/fuzz_smoke.rs` runs them without nightly. Each
//! parses untrusted bytes; whatever parses must re-emit and re-parse to
//! the same repr. Any panic is a bug. Each returns whether `data` parsed,
//! so the smoke test can show it reached the round trip.

use crate::*;

/// BTH view and repr.
pub fn bth(data: &[u8]) -> bool {
    let Ok(p) = BthPacket::new_checked(data) else {
        return false;
    };
    let Ok(r) = BthRepr::parse(&p) else {
        return false;
    };
    let mut out = [0u8; bth::HEADER_LEN];
    r.emit(&mut BthPacket::new_unchecked(&mut out[..]));
    assert_eq!(BthRepr::parse(&BthPacket::new_unchecked(&out[..])), Ok(r));
    true
}

/// Every extension header, each from the start of `data`.
pub fn ext(data: &[u8]) -> bool {
    let mut any = false;
    macro_rules! one {
        ($view:ident, $repr:ident, $len:expr) => {
            if let Ok(p) = $view::new_checked(data) {
                let r = $repr::parse(&p);
                let mut out = [0u8; $len];
                r.emit(&mut $view::new_unchecked(&mut out[..]));
                assert_eq!($repr::parse(&$view::new_unchecked(&out[..])), r);
                any = true;
            }
        };
    }
    one!(RethPacket, RethRepr, ext::RETH_LEN);
    one!(AethPacket, AethRepr, ext::AETH_LEN);
    one!(AtomicEthPacket, AtomicEthRepr, ext::ATOMIC_ETH_LEN);
    one!(
        AtomicAckEthPacket,
        AtomicAckEthRepr,
        ext::ATOMIC_ACK_ETH_LEN
    );
    one!(DethPacket, DethRepr, ext::DETH_LEN);
    one!(ImmDtPacket, ImmDtRepr, ext::IMM_DT_LEN);
    one!(IethPacket, IethRepr, ext::IETH_LEN);
    any
}

/// IPv4/IPv6 and UDP headers.
pub fn ip_udp(data: &[u8]) -> bool {
    let Ok((ip, payload)) = IpRepr::parse(data) else {
        return false;
    };
    let mut out = std::vec![0u8; ip.buffer_len() + payload.len()];
    ip.emit(&mut out);
    out[ip.buffer_len()..].copy_from_slice(payload);
    let (again, _) = IpRepr::parse(&out).expect("an emitted IP header parses");
    assert_eq!(again, ip);
    let Ok(u) = UdpPacket::new_checked(payload) else {
        return true;
    };
    let r = UdpRepr::parse(&u, ip.src_addr(), ip.dst_addr());
    let mut out = payload[..usize::from(u.len())].to_vec();
    r.emit(
        &mut UdpPacket::new_unchecked(&mut out[..]),
        ip.src_addr(),
        ip.dst_addr(),
        u.payload().len(),
    );
    let u2 = UdpPacket::new_checked(&out[..]).expect("an emitted UDP header parses");
    assert_eq!(UdpRepr::parse(&u2, ip.src_addr(), ip.dst_addr()), r);
    true
}

/// IB part of a UDP payload.
pub fn ib_packet(data: &[u8]) -> bool {
    let Ok(r) = IbRepr::parse(data) else {
        return false;
    };
    let mut out = std::vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).expect("a parsed repr emits");
    assert_eq!(n, r.buffer_len());
    assert_eq!(IbRepr::parse(&out), Ok(r));
    true
}

/// ICRC over an IP packet, both entry points.
pub fn icrc(data: &[u8]) -> bool {
    let whole = icrc::compute_ip_packet(data).is_ok();
    let split = data.len().min(48);
    let _ = icrc::compute_raw(&data[..split], &data[split..]);
    let _ = icrc::trailer(data);
    whole
}

/// Whole Ethernet frame with IP, UDP, IB and ICRC.
pub fn roce_frame(data: &[u8]) -> bool {
    let Ok(f) = RoceFrame::parse(data) else {
        return false;
    };
    let mut out = std::vec![0u8; f.buffer_len()];
    let n = f.emit(&mut out).expect("a parsed frame emits");
    assert_eq!(n, f.buffer_len());
    let again = RoceFrame::parse(&out).expect("an emitted frame parses");
    assert_eq!(again.roce.ib, f.roce.ib);
    assert_eq!(again.roce.udp.src_port, f.roce.udp.src_port);
    assert_eq!(again.roce.ip.src_addr(), f.roce.ip.src_addr());
    true
}

/// A UDP payload as a socket delivers it: the first byte picks IPv4 or
/// IPv6 addresses, the rest is BTH through ICRC.
pub fn datagram(data: &[u8]) -> bool {
    let Some((&sel, payload)) = data.split_first() else {
        return false;
    };
    let (ip, udp) = datagram_headers(sel);
    let Ok(r) = RoceRepr::parse_datagram(ip, udp, payload) else {
        return false;
    };
    let mut out = std::vec![0u8; r.udp_payload_len()];
    let n = r
        .emit_udp_payload(&mut out)
        .expect("a parsed datagram emits");
    let again = RoceRepr::parse_datagram(ip, udp, &out[..n]).expect("an emitted datagram parses");
    assert_eq!(again.ib, r.ib);
    true
}

/// The IP and UDP headers [`datagram`] assumes for selector byte `sel`.
pub fn datagram_headers(sel: u8) -> (IpRepr, UdpRepr) {
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let (src, dst) = if sel & 1 == 0 {
        (
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        )
    } else {
        (
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        )
    };
    let ip = IpRepr::rocev2(src, dst, 0).expect("same family");
    (
        ip,
        UdpRepr {
            src_port: 0xC000,
            dst_port: ROCEV2_UDP_PORT,
            checksum: UdpChecksum::None,
        },
    )
}
