//! The NIC driven by a connection manager: listen, connect, accept and
//! reject with private data in the MPA frames, QPs that take their stream
//! from the CM (destination QPN `CM_QPN`), data both ways verified byte
//! for byte, and the CM told when a stream ends.

mod common;

use common::{connect, init, pair};
use iwarp_tcp::{CmError, CM_QPN};
use rdma_types::{QpState, QpType, WcOpcode, WcStatus};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use verbs::conformance::{qp_fatal, Node};
use verbs::{QpAttr, RecvWr, RemoteAddr, SendOpcode, SendWr};

fn ip(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 94, 205, d))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn listen_connect_accept_reject_and_close() {
    let f = pair(ip(1), ip(2));
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let listener = f.p.cm_listen(f.guids.1, 5001).unwrap();
    let dst = SocketAddr::new(ip(2), 5001);
    let (closed_tx, closed_rx) = mpsc::channel();
    f.p.cm_on_closed(
        f.guids.1,
        Arc::new(move |_, qpn| {
            let _ = closed_tx.send(qpn);
        }),
    );

    // A rejected request: the connect says so with the reject's data.
    let qa0 = a.qp(QpType::Rc, None, 9);
    init(&a, qa0);
    let (p, g, n) = (f.p.clone(), f.guids.0, a.p.qp_num(qa0).unwrap());
    let t = std::thread::spawn(move || p.cm_connect(g, n, dst, b"first", Duration::from_secs(10)));
    let req = listener
        .requests()
        .unwrap()
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!(req.private_data, b"first");
    assert_eq!(req.peer.ip(), ip(1));
    req.reject(b"not you");
    assert_eq!(
        t.join().unwrap(),
        Err(CmError::Rejected {
            private_data: b"not you".to_vec()
        })
    );

    // An accepted one.
    let qa = a.qp(QpType::Rc, None, 10);
    let qb = b.qp(QpType::Rc, None, 20);
    init(&a, qa);
    init(&b, qb);
    let n = a.p.qp_num(qa).unwrap();
    let p = f.p.clone();
    let t = std::thread::spawn(move || p.cm_connect(g, n, dst, b"login", Duration::from_secs(10)));
    let req = listener
        .requests()
        .unwrap()
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!(req.private_data, b"login");
    // The target readies its QP, posts receives, then accepts.
    connect(&b, qb, ip(1), CM_QPN.value());
    let data = pattern(40_000, 3);
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 1,
            sges: verbs::sges![b.sge(0, 40_000)],
        }],
    )
    .unwrap();
    req.accept(b.p.qp_num(qb).unwrap(), b"welcome").unwrap();
    let got = t.join().unwrap().unwrap();
    assert_eq!(got.private_data, b"welcome");
    connect(&a, qa, ip(2), CM_QPN.value());
    // SEND a -> b, byte for byte.
    a.buf.write_at(0, &data);
    a.p.post_send(
        qa,
        &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 40_000)])],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 40_000)
    );
    assert_eq!(b.buf.to_vec(0, 40_000), data);
    // WRITE b -> a, then READ it back into b.
    let back = pattern(20_000, 77);
    b.buf.write_at(40_000, &back);
    let mut w = SendWr::new(2, SendOpcode::RdmaWrite, vec![b.sge(40_000, 20_000)]);
    w.remote = RemoteAddr {
        addr: a.buf.addr() + 30_000,
        rkey: a.mr.rkey,
    };
    let mut r = SendWr::new(3, SendOpcode::RdmaRead, vec![b.sge(0, 20_000)]);
    r.remote = RemoteAddr {
        addr: a.buf.addr() + 30_000,
        rkey: a.mr.rkey,
    };
    b.p.post_send(qb, &[w, r]).unwrap();
    assert_eq!(b.wc().wr_id, 2);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (3, WcStatus::Success, WcOpcode::RdmaRead, 20_000)
    );
    assert_eq!(a.buf.to_vec(30_000, 20_000), back);
    assert_eq!(b.buf.to_vec(0, 20_000), back);

    // The initiator disconnects (its QP to ERR): the target's CM hears of
    // it, and its QP is in error.
    a.p.modify_qp(
        qa,
        &QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        },
    )
    .unwrap();
    let closed = closed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(closed, b.p.qp_num(qb).unwrap());
    assert!(b.rec.wait_for(|e| *e == qp_fatal(20)));
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
}

#[test]
fn a_connect_nobody_answers_times_out() {
    let f = pair(ip(3), ip(4));
    let a = Node::open(&f, f.guids.0, 16);
    let _b = Node::open(&f, f.guids.1, 16);
    let listener = f.p.cm_listen(f.guids.1, 5002).unwrap();
    let qa = a.qp(QpType::Rc, None, 10);
    init(&a, qa);
    let n = a.p.qp_num(qa).unwrap();
    let r = f.p.cm_connect(
        f.guids.0,
        n,
        SocketAddr::new(ip(4), 5002),
        b"hello?",
        Duration::from_millis(300),
    );
    assert_eq!(r, Err(CmError::TimedOut));
    // The request reached the listener; nobody answered it.
    assert!(listener.requests().unwrap().try_recv().is_ok());
    // The QP is free for another attempt.
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Init));
}

#[test]
fn a_connect_to_a_port_nobody_listens_on_fails_at_once() {
    let f = pair(ip(5), ip(6));
    let a = Node::open(&f, f.guids.0, 16);
    let _b = Node::open(&f, f.guids.1, 16);
    let qa = a.qp(QpType::Rc, None, 10);
    init(&a, qa);
    let n = a.p.qp_num(qa).unwrap();
    let started = std::time::Instant::now();
    let r = f.p.cm_connect(
        f.guids.0,
        n,
        SocketAddr::new(ip(6), 5999),
        b"anyone?",
        Duration::from_secs(10),
    );
    // Refused, naming where: what RDMA CM reports as a REJ for the
    // service ID (no listener), not a stream that merely ended.
    let dst = SocketAddr::new(ip(6), 5999);
    assert_eq!(r, Err(CmError::Refused(dst)));
    assert_eq!(
        r.unwrap_err().to_string(),
        "TCP connection to 127.94.205.6:5999 refused: nothing listens there"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Init));
}
