//! An independent decoder reads the same bytes: every RoCEv2 frame of the
//! rxe captures (from `testdata/roce/`) is written to a pcap with our
//! writer and decoded by tshark; every BTH, DETH, RETH and AETH field and
//! the ICRC trailer tshark reports must equal what our parser returns.
//! Needs tshark (`rdma_testkit::need`: a skip, or a failure under
//! `CI=true`).

use std::process::Command;

use rdma_types::Instant;
use rdma_wire::icrc;
use rdma_wire::pcap::{LinkType, PcapWriter};
use rdma_wire::RoceFrame;

mod common;

use rdma_testkit::TSHARK;

const FIELDS: [&str; 16] = [
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.invariant.crc",
];

/// A tshark field as a number: empty is `None`, `0x..` is hex.
fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        None
    } else if let Some(h) = s.strip_prefix("0x") {
        Some(u64::from_str_radix(h, 16).unwrap())
    } else {
        Some(s.parse().unwrap())
    }
}

#[test]
fn tshark_and_we_read_every_capture_frame_the_same() {
    if !rdma_testkit::need::tool(TSHARK) {
        return;
    }
    let frames: Vec<Vec<u8>> = common::all_frames()
        .into_iter()
        .map(|(_, _, b)| b)
        .collect();
    assert_eq!(frames.len(), 141 + 600 + 17);
    let path =
        std::env::temp_dir().join(format!("rdma-wire-{}-crosscheck.pcap", std::process::id()));
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), LinkType::Ethernet).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(Instant::from_micros(i as u64), f).unwrap();
    }
    w.into_inner().unwrap();
    let mut cmd = Command::new(TSHARK);
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    std::fs::remove_file(&path).ok();
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<Option<u64>>> = text
        .lines()
        .map(|l| l.split('\t').map(num).collect())
        .collect();
    assert_eq!(rows.len(), frames.len());

    for (i, (row, bytes)) in rows.iter().zip(&frames).enumerate() {
        let f = RoceFrame::parse(bytes).unwrap();
        let ib = &f.roce.ib;
        let b = &ib.bth;
        let ours: [Option<u64>; 16] = [
            Some(b.opcode.code().into()),
            Some(b.solicited.into()),
            Some(b.mig_req.into()),
            Some(b.pad_count.into()),
            Some(b.pkey.0.into()),
            Some(b.dest_qp.value().into()),
            Some(b.ack_req.into()),
            Some(b.psn.value().into()),
            ib.ext.deth.map(|d| d.qkey.0.into()),
            ib.ext.deth.map(|d| d.src_qp.value().into()),
            ib.ext.reth.map(|r| r.va),
            ib.ext.reth.map(|r| r.rkey.0.into()),
            ib.ext.reth.map(|r| r.dma_len.into()),
            ib.ext.aeth.map(|a| a.syndrome.to_byte().into()),
            ib.ext.aeth.map(|a| a.msn.into()),
            // tshark shows the trailer bytes in wire order.
            icrc::trailer(&bytes[14..14 + f.roce.buffer_len()]).map(|c| c.swap_bytes().into()),
        ];
        for (k, field) in FIELDS.iter().enumerate() {
            assert_eq!(
                row.get(k).copied().flatten(),
                ours[k],
                "record {}: {field}",
                i + 1
            );
        }
    }
}
