//! Large transfers between two NICs: a 12 MiB SEND, WRITE and READ in
//! flight together, thousands of FPDUs each way, every byte verified.

mod common;

use common::{pair, ready};
use rdma_types::{AccessFlags, QpType, WcOpcode, WcStatus};
use std::net::{IpAddr, Ipv4Addr};
use verbs::conformance::Node;
use verbs::{MemBuf, RecvWr, RemoteAddr, SendOpcode, SendWr, Sge};

const LEN: usize = 12 << 20;

fn ip(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 94, 208, d))
}

#[test]
fn twelve_mib_each_way_byte_for_byte() {
    let f = pair(ip(1), ip(2));
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    let (na, nb) = (
        a.p.qp_num(qa).unwrap().value(),
        b.p.qp_num(qb).unwrap().value(),
    );
    ready(&a, qa, ip(2), nb);
    ready(&b, qb, ip(1), na);
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // Three regions on each side: send/receive, write, read.
    let (ba, bb) = (MemBuf::new(3 * LEN), MemBuf::new(3 * LEN));
    let ma =
        a.p.reg_mr(a.pd, &ba, ba.addr(), 3 * LEN as u64, all, 0)
            .unwrap();
    let mb =
        b.p.reg_mr(b.pd, &bb, bb.addr(), 3 * LEN as u64, all, 0)
            .unwrap();
    let pattern = |seed: u32| -> Vec<u8> {
        (0..LEN as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    };
    let (send, write, read) = (pattern(1), pattern(2), pattern(3));
    ba.write_at(0, &send);
    ba.write_at(LEN, &write);
    bb.write_at(2 * LEN, &read);
    let sge = |buf: &MemBuf, lkey, off: usize| Sge {
        addr: buf.addr() + off as u64,
        length: LEN as u32,
        lkey,
    };
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 1,
            sges: verbs::sges![sge(&bb, mb.lkey, 0)],
        }],
    )
    .unwrap();
    let mut w = SendWr::new(2, SendOpcode::RdmaWrite, vec![sge(&ba, ma.lkey, LEN)]);
    w.remote = RemoteAddr {
        addr: bb.addr() + LEN as u64,
        rkey: mb.rkey,
    };
    let mut r = SendWr::new(3, SendOpcode::RdmaRead, vec![sge(&ba, ma.lkey, 2 * LEN)]);
    r.remote = RemoteAddr {
        addr: bb.addr() + 2 * LEN as u64,
        rkey: mb.rkey,
    };
    a.p.post_send(
        qa,
        &[
            SendWr::new(1, SendOpcode::Send, vec![sge(&ba, ma.lkey, 0)]),
            w,
            r,
        ],
    )
    .unwrap();
    for (id, op) in [
        (1, WcOpcode::Send),
        (2, WcOpcode::RdmaWrite),
        (3, WcOpcode::RdmaRead),
    ] {
        let wc = a.wc();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (id, WcStatus::Success, op)
        );
    }
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, LEN as u32)
    );
    assert!(bb.to_vec(0, LEN) == send, "SEND data differs");
    assert!(bb.to_vec(LEN, LEN) == write, "WRITE data differs");
    assert!(ba.to_vec(2 * LEN, LEN) == read, "READ data differs");
}

#[test]
fn an_inline_send_carries_the_bytes_of_its_post() {
    let f = pair(ip(3), ip(4));
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    let (na, nb) = (
        a.p.qp_num(qa).unwrap().value(),
        b.p.qp_num(qb).unwrap().value(),
    );
    // a is ready; b not yet: a's sends wait for the stream.
    ready(&a, qa, ip(4), nb);
    a.buf.write_at(0, b"first");
    let mut w = SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 5)]);
    w.flags = verbs::SendFlags::SIGNALED | verbs::SendFlags::INLINE;
    a.p.post_send(qa, &[w]).unwrap();
    a.buf.write_at(0, b"later");
    a.p.post_send(qa, &[SendWr::new(2, SendOpcode::Send, vec![a.sge(0, 5)])])
        .unwrap();
    common::init(&b, qb);
    for id in 1..=2 {
        b.p.post_recv(
            qb,
            &[RecvWr {
                wr_id: id,
                sges: verbs::sges![b.sge(100 * id, 16)],
            }],
        )
        .unwrap();
    }
    common::connect(&b, qb, ip(3), na);
    assert_eq!(b.wc().wr_id, 1);
    assert_eq!(b.wc().wr_id, 2);
    assert_eq!(b.buf.to_vec(100, 5), b"first", "the inline send's bytes");
    assert_eq!(b.buf.to_vec(200, 5), b"later");
}

#[test]
fn a_zero_length_write_with_no_key_is_a_harmless_probe() {
    let f = pair(ip(5), ip(6));
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    let (na, nb) = (
        a.p.qp_num(qa).unwrap().value(),
        b.p.qp_num(qb).unwrap().value(),
    );
    ready(&a, qa, ip(6), nb);
    ready(&b, qb, ip(5), na);
    // srp_initiator's liveness probe: no SGE, address 0, R_Key 0.
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::RdmaWrite, vec![])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    // A SEND behind it arrives: the stream lives.
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 2,
            sges: verbs::sges![b.sge(0, 16)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, b"alive");
    a.p.post_send(qa, &[SendWr::new(3, SendOpcode::Send, vec![a.sge(0, 5)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, 5)
    );
    assert_eq!(b.buf.to_vec(0, 5), b"alive");
}
