//! Helpers for integration tests: [`need`], what a test needs from the
//! machine (a missing tool fails under `CI=true`, is a visible skip
//! elsewhere); tshark on a capture, one row of fields per packet, with the
//! malformed and expert-severity checks every capture test makes; MAD
//! frames in a pcap; [`netns`], `ip` for the tests that make network
//! namespaces. Tests only; nothing in the stack depends on it.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod fuzz;
pub mod need;
pub mod netns;

use std::path::Path;
use std::process::Command;

/// tshark, run from `PATH` (`.ci/run` installs it); ask
/// [`need::tool`]`(TSHARK)` before running it.
pub const TSHARK: &str = "tshark";

/// Expert info severities of warning (0x600000) and above are failures.
const EXPERT_WARN: u32 = 0x60_0000;

/// Runs tshark on `pcap`, decoding the given UDP ports as RoCEv2 as well as
/// 4791, and returns `fields` for every packet. `None` when tshark is not
/// installed: the tshark half of the test is skipped ([`need::part`]; a
/// failure under `CI=true`). `test` names the test in messages.
///
/// # Panics
/// If tshark fails, or marks a packet malformed, or raises an expert
/// warning or error: the test's verdict.
pub fn tshark_fields(
    test: &str,
    pcap: &Path,
    roce_ports: &[u16],
    fields: &[&str],
) -> Option<Vec<Vec<String>>> {
    tshark_fields_without(test, pcap, roce_ports, fields, &[])
}

/// [`tshark_fields`] with the named dissectors disabled: tshark reads the
/// payload of every RC SEND with Invalidate as RPC-over-RDMA (NFS/RDMA's
/// use of it) and calls a short one malformed, so captures of other
/// payloads pass `&["rpcordma"]`.
///
/// # Panics
/// As [`tshark_fields`].
pub fn tshark_fields_without(
    test: &str,
    pcap: &Path,
    roce_ports: &[u16],
    fields: &[&str],
    disabled: &[&str],
) -> Option<Vec<Vec<String>>> {
    if !need::part("the tshark half").tool(TSHARK) {
        return None;
    }
    let mut args: Vec<String> = vec!["-r".into(), pcap.display().to_string()];
    for d in disabled {
        args.push("--disable-protocol".into());
        args.push((*d).to_string());
    }
    for p in roce_ports {
        args.push("-d".into());
        args.push(format!("udp.port=={p},infiniband"));
    }
    args.extend(["-T", "fields"].map(String::from));
    for f in fields
        .iter()
        .chain(&["_ws.malformed", "_ws.expert.severity"])
    {
        args.push("-e".into());
        args.push((*f).to_string());
    }
    let out = Command::new(TSHARK)
        .args(&args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed on {test}'s capture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split('\t').map(String::from).collect())
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let malformed = row.get(fields.len()).is_some_and(|c| !c.is_empty());
        assert!(
            !malformed,
            "{test}: tshark: packet {} malformed: {row:?}",
            i + 1
        );
        let worst = row.get(fields.len() + 1).map_or(0, |c| {
            c.split(',')
                .filter_map(|v| v.parse::<u32>().ok())
                .max()
                .unwrap_or(0)
        });
        assert!(
            worst < EXPERT_WARN,
            "{test}: tshark: packet {} has an expert warning or error: {row:?}",
            i + 1
        );
    }
    Some(
        rows.into_iter()
            .map(|mut r| {
                r.truncate(fields.len());
                r
            })
            .collect(),
    )
}

/// A RoCEv2 UD SEND ONLY frame (Ethernet, IPv4 10.0.0.1 -> 10.0.0.2, UDP
/// to 4791, BTH with the default P_Key and destination `qp`, DETH with
/// the QP's well-known Q_Key) carrying a 256-byte MAD, for tshark. The
/// trailing ICRC is a plain CRC-32 of the frame: tshark does not check it.
pub fn mad_frame(qp: u8, mad: &[u8; 256], psn: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let ip_len = (20 + 8 + 12 + 8 + 256 + 4) as u16;
    let mut ip = [
        0x45, 0x00, 0, 0, 0, 0, 0x40, 0x00, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    let mut sum: u32 = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]); // 49152 -> 4791
    f.extend_from_slice(&(ip_len - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum
    f.extend_from_slice(&[0x64, 0x00, 0xff, 0xff, 0, 0, 0, qp]);
    f.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes());
    let qkey: [u8; 4] = if qp == 0 { [0; 4] } else { [0x80, 0x01, 0, 0] };
    f.extend_from_slice(&qkey);
    f.extend_from_slice(&[0, 0, 0, qp]);
    f.extend_from_slice(mad);
    let icrc = crc32fast::hash(&f[14..]);
    f.extend_from_slice(&icrc.to_le_bytes());
    f
}

/// A classic pcap file (Ethernet link type) of `frames`.
pub fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&4u16.to_le_bytes());
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&65535u32.to_le_bytes());
    p.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        p.extend_from_slice(&(i as u32).to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(f);
    }
    p
}
