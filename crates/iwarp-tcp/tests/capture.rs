//! pcap capture of a NIC's streams, decoded by tshark's iWARP dissectors
//! (`iwarp_mpa`, `iwarp_ddp_rdmap`): the MPA request and reply, then
//! SEND, RDMA WRITE, RDMA Read Request, Read Response and TERMINATE FPDUs
//! with their CRCs, no packet malformed and no expert warning.

mod common;

use common::{pair_with, ready};
use iwarp_tcp::NicOptions;
use rdma_types::{QpType, WcStatus};
use std::net::{IpAddr, Ipv4Addr};
use verbs::conformance::{qp_fatal, Node};
use verbs::{RecvWr, RemoteAddr, SendOpcode, SendWr};

fn ip(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 94, 206, d))
}

#[test]
fn tshark_decodes_every_frame_of_a_capture() {
    let dir = std::env::temp_dir().join(format!("iwarp-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = NicOptions {
        capture_dir: Some(dir.clone()),
        ..Default::default()
    };
    let f = pair_with(ip(1), ip(2), options);
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    let (na, nb) = (
        a.p.qp_num(qa).unwrap().value(),
        b.p.qp_num(qb).unwrap().value(),
    );
    ready(&a, qa, ip(2), nb);
    ready(&b, qb, ip(1), na);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    a.buf.write_at(0, &data);
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 1,
            sges: verbs::sges![b.sge(0, 8192)],
        }],
    )
    .unwrap();
    let mut w = SendWr::new(2, SendOpcode::RdmaWrite, vec![a.sge(0, 3000)]);
    w.remote = RemoteAddr {
        addr: b.buf.addr() + 10_000,
        rkey: b.mr.rkey,
    };
    let mut r = SendWr::new(3, SendOpcode::RdmaRead, vec![a.sge(20_000, 2000)]);
    r.remote = RemoteAddr {
        addr: b.buf.addr() + 10_000,
        rkey: b.mr.rkey,
    };
    a.p.post_send(
        qa,
        &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 5000)]), w, r],
    )
    .unwrap();
    for id in 1..=3 {
        let wc = a.wc();
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    assert_eq!(b.wc().byte_len, 5000);
    assert_eq!(b.buf.to_vec(0, 5000), data);
    assert_eq!(a.buf.to_vec(20_000, 2000), data[..2000]);
    // A WRITE past b's registration: b's TERMINATE is captured too.
    let mut bad = SendWr::new(4, SendOpcode::RdmaWrite, vec![a.sge(0, 64)]);
    bad.remote = RemoteAddr {
        addr: b.buf.addr() + 65536 - 16,
        rkey: b.mr.rkey,
    };
    a.p.post_send(qa, &[bad]).unwrap();
    assert_eq!(a.wc().wr_id, 4);
    assert!(a.rec.wait_for(|e| *e == qp_fatal(10)), "no TERMINATE came");
    let pcap = dir.join(format!("iwarp-{}.pcap", ip(1)));
    let Some(rows) = rdma_testkit::tshark_fields(
        "tshark_decodes_every_frame_of_a_capture",
        &pcap,
        &[],
        &[
            "tcp.len",
            "iwarp_mpa.key.req",
            "iwarp_mpa.key.rep",
            "iwarp_rdma.opcode",
            "iwarp_mpa.crc_check",
        ],
    ) else {
        return;
    };
    let _ = std::fs::remove_dir_all(&dir);
    println!("{rows:#?}");
    let col = |i: usize| -> Vec<String> {
        rows.iter()
            .flat_map(|r| r[i].split(',').map(String::from).collect::<Vec<_>>())
            .filter(|v| !v.is_empty())
            .collect()
    };
    assert!(!col(1).is_empty(), "no MPA request decoded");
    assert!(!col(2).is_empty(), "no MPA reply decoded");
    // Every payload-carrying segment decodes as MPA (request, reply or
    // FPDUs).
    for r in &rows {
        if r[0] != "0" {
            assert!(
                !r[1].is_empty() || !r[2].is_empty() || !r[3].is_empty(),
                "a segment tshark did not decode as iWARP: {r:?}"
            );
        }
    }
    let ops = col(3);
    for (op, what) in [
        ("0x03", "Send"),
        ("0x00", "RDMA Write"),
        ("0x01", "Read Request"),
        ("0x02", "Read Response"),
        ("0x07", "Terminate"),
    ] {
        assert!(ops.iter().any(|o| o == op), "no {what} ({op}) in {ops:?}");
    }
}
