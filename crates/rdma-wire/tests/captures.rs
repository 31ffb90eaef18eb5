//! Every RoCEv2 frame of the three Linux rxe captures (copied into
//! `testdata/roce/` by `testdata/roce/extract.py`) parses down to the
//! payload, re-emits byte for byte from the reprs, and carries the ICRC
//! we compute. Frames are counted, so a frame skipped by mistake fails.

use std::collections::BTreeMap;

mod common;
use common::{all_frames, frames};

use rdma_wire::icrc;
use rdma_wire::{IpRepr, Opcode, RoceFrame, RoceRepr, UdpChecksum, ROCEV2_UDP_PORT};

/// Checks every frame of a file; returns opcode counts and how many frames
/// were IPv6.
fn check_file(name: &str, expected_frames: usize) -> (BTreeMap<u8, usize>, usize) {
    let all = frames(name);
    assert_eq!(all.len(), expected_frames, "{name}: frame count");
    let mut ops = BTreeMap::new();
    let mut v6 = 0;
    for (n, bytes) in &all {
        let f = RoceFrame::parse(bytes).unwrap_or_else(|e| panic!("{name} frame {n}: {e}"));
        assert_eq!(f.roce.udp.dst_port, ROCEV2_UDP_PORT, "{name} frame {n}");
        // Re-emit from the reprs alone.
        let mut out = vec![0u8; f.buffer_len()];
        let len = f
            .emit(&mut out)
            .unwrap_or_else(|e| panic!("{name} frame {n}: emit: {e}"));
        assert_eq!(len, bytes.len(), "{name} frame {n}: length");
        assert_eq!(&out, bytes, "{name} frame {n}: re-emitted bytes differ");
        // Our ICRC over the captured bytes equals the captured trailer.
        let ip_len = f.roce.buffer_len();
        let ip = &bytes[14..14 + ip_len];
        let carried = icrc::trailer(ip).unwrap();
        assert_eq!(
            icrc::compute_ip_packet(ip),
            Ok(carried),
            "{name} frame {n}: ICRC"
        );
        // The payload slice is where the opcode table says it is.
        let info = f.roce.ib.info().unwrap();
        let udp_payload = &ip[f.roce.ip.buffer_len() + 8..];
        let start = info.header_len();
        assert_eq!(
            f.roce.ib.payload,
            &udp_payload[start..start + f.roce.ib.payload.len()]
        );
        if let IpRepr::V6(_) = f.roce.ip {
            v6 += 1;
        }
        *ops.entry(f.roce.ib.bth.opcode.code()).or_insert(0) += 1;
    }
    (ops, v6)
}

#[test]
fn rc_pingpong_and_rping() {
    let (ops, v6) = check_file("linux-rxe-rc-pingpong-and-rping.hex", 141);
    assert_eq!(v6, 0);
    // As tshark counts them: SEND first/middle/last/only, WRITE only, READ
    // request, READ response only, ACK, UD SEND only (CM).
    let expect: BTreeMap<u8, usize> = [
        (0x00, 20),
        (0x01, 40),
        (0x02, 20),
        (0x04, 12),
        (0x0A, 3),
        (0x0C, 3),
        (0x10, 3),
        (0x11, 35),
        (0x64, 5),
    ]
    .into_iter()
    .collect();
    assert_eq!(ops, expect);
}

#[test]
fn ib_srp_to_lio_srpt() {
    let (ops, v6) = check_file("linux-ib_srp-to-lio-srpt-over-rxe.hex", 600);
    assert_eq!(v6, 0);
    let expect: BTreeMap<u8, usize> = [
        (0x04, 125),
        (0x06, 11),
        (0x07, 256),
        (0x08, 10),
        (0x0A, 31),
        (0x11, 164),
        (0x64, 3),
    ]
    .into_iter()
    .collect();
    assert_eq!(ops, expect);
}

#[test]
fn userspace_cm_req() {
    let (ops, v6) = check_file("userspace-cm-req-to-linux-rxe.hex", 17);
    assert_eq!(v6, 7, "IPv6 ULA and link-local CM exchanges");
    assert_eq!(
        ops.into_iter().collect::<Vec<_>>(),
        vec![(Opcode::UdSendOnly.code(), 17)]
    );
    // rxe sends no UDP checksum; the user-space sender's checksums were
    // captured before offload filled them in (tshark also calls them bad):
    // kept as they are, the ICRC still matches.
    let mut states = BTreeMap::new();
    for (_, bytes) in frames("userspace-cm-req-to-linux-rxe.hex") {
        let f = RoceFrame::parse(&bytes).unwrap();
        let key = match f.roce.udp.checksum {
            UdpChecksum::None => "none",
            UdpChecksum::Valid => "valid",
            UdpChecksum::Invalid(_) => "invalid",
        };
        *states.entry(key).or_insert(0) += 1;
    }
    assert_eq!(states, [("invalid", 6), ("none", 11)].into_iter().collect());
}

/// A UDP socket does not see the IPv4 identification rxe used; the ICRC
/// alone gives it back, for every IPv4 frame of the captures.
#[test]
fn ipv4_ident_recovered_from_icrc() {
    let mut checked = 0;
    for (name, n, bytes) in all_frames() {
        let f = RoceFrame::parse(&bytes).unwrap();
        let IpRepr::V4(mut v4) = f.roce.ip else {
            continue;
        };
        let ident = v4.ident;
        v4.ident = 0;
        let udp_payload = &bytes[14 + 28..14 + f.roce.buffer_len()];
        let ib = &udp_payload[..udp_payload.len() - 4];
        let carried = icrc::trailer(udp_payload).unwrap();
        assert_eq!(
            icrc::recover_ipv4_ident(&IpRepr::V4(v4), &f.roce.udp, ib, carried),
            Some(ident),
            "{name} frame {n}"
        );
        checked += 1;
    }
    assert_eq!(checked, 141 + 600 + 10);
}

/// The receive path of a NIC behind a UDP socket: it sees addresses,
/// ports and the UDP payload, not the IP header. Rebuilt with
/// `IpRepr::rocev2` (and, for IPv4, the ID recovered from the ICRC), every
/// frame's ICRC verifies; some frames carry exactly the header
/// `IpRepr::rocev2` describes.
#[test]
fn socket_view_verifies_every_frame() {
    let mut checked = 0;
    let mut exact = Vec::new();
    for (name, n, bytes) in all_frames() {
        let f = RoceFrame::parse(&bytes).unwrap();
        let (src, dst) = (f.roce.ip.src_addr(), f.roce.ip.dst_addr());
        let iph = f.roce.ip.buffer_len();
        let udp_payload = &bytes[14 + iph + 8..14 + f.roce.buffer_len()];
        let mut ip = IpRepr::rocev2(src, dst, 8 + udp_payload.len()).unwrap();
        if ip == f.roce.ip {
            exact.push((name, n));
        }
        if let IpRepr::V4(v4) = &mut ip {
            let ib = &udp_payload[..udp_payload.len() - 4];
            let carried = icrc::trailer(udp_payload).unwrap();
            v4.ident =
                icrc::recover_ipv4_ident(&IpRepr::V4(*v4), &f.roce.udp, ib, carried).unwrap();
        }
        let r = RoceRepr::parse_datagram(ip, f.roce.udp, udp_payload)
            .unwrap_or_else(|e| panic!("{name} frame {n}: {e}"));
        assert_eq!(r.ib, f.roce.ib);
        checked += 1;
    }
    assert_eq!(checked, 758);
    // IPv4 frames 58 and 60 of the user-space sender (unconnected socket),
    // and rxe's IPv6 frames 6, 28 and 53 (flow label 0, hop limit 64).
    let u = "userspace-cm-req-to-linux-rxe.hex";
    assert_eq!(exact, [(u, 6), (u, 28), (u, 53), (u, 58), (u, 60)]);
}

/// Every packet in the captures carries the default P_Key 0xFFFF (Linux
/// rxe's table holds only it): what a soft RoCE port in the `roce`
/// personality, whose table is that key alone, admits, so checking
/// received P_Keys leaves RoCE interop with Linux as it was.
#[test]
fn every_rxe_packet_is_in_the_default_partition() {
    let all = all_frames();
    for (name, n, bytes) in &all {
        let f = RoceFrame::parse(bytes).unwrap_or_else(|e| panic!("{name} frame {n}: {e}"));
        let pkey = f.roce.ib.bth.pkey;
        assert_eq!(pkey, rdma_types::Pkey::DEFAULT, "{name} frame {n}");
        assert!(rdma_types::Pkey::DEFAULT.matches(pkey));
    }
    assert_eq!(all.len(), 141 + 600 + 17);
}
