//! A NIC against peers that die or misbehave: a stream reset, a peer
//! process killed, a corrupt CRC, an RDMA WRITE outside its registration.
//! Each ends the QP in error with `QpFatal` (and, for bad input, a
//! TERMINATE the peer reads), never a hang and never a byte outside a
//! registration, while the NIC's other connections keep working.

mod common;

use common::{connect, init, pair, ready, RawPeer};
use iwarp::{Event, STag, SendOp, SendWqe, Sge, TermCause};
use iwarp_tcp::VERBS_PORT;
use rdma_types::{AccessFlags, QpState, QpType, WcStatus};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use verbs::conformance::{qp_fatal, Node};
use verbs::{RecvWr, SendOpcode, SendWr};

fn ip(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 94, c, d))
}

fn recv(n: &Node, qp: verbs::QpHandle, wr_id: u64, off: u64, len: u32) {
    n.p.post_recv(
        qp,
        &[RecvWr {
            wr_id,
            sges: verbs::sges![n.sge(off, len)],
        }],
    )
    .unwrap();
}

/// The raw peer sends `data` as one Send (from its region 1).
fn raw_send(r: &mut RawPeer, wr_id: u64, data: &[u8]) {
    r.mem.register(STag(1), 0, data.to_vec(), false, false);
    r.c.post_send(SendWqe {
        wr_id,
        op: SendOp::Send {
            local: Sge {
                stag: STag(1),
                to: 0,
                len: data.len() as u32,
            },
            solicited: false,
            invalidate: None,
        },
    });
    r.flush();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The NIC (.2) has QP `qb` ready for the raw peer (.1) as its QP 7.
fn nic_and_peer(c: u8) -> (common::Iwarp, Node, verbs::QpHandle, RawPeer) {
    let (peer_ip, nic_ip) = (ip(c, 1), ip(c, 2));
    // The provider's first CA is never opened: the raw peer has its address.
    let f = pair(ip(c, 3), nic_ip);
    let b = Node::open(&f, f.guids.1, 64);
    let qb = b.qp(QpType::Rc, None, 20);
    let qpn = b.p.qp_num(qb).unwrap().value();
    ready(&b, qb, peer_ip, 7);
    let r = RawPeer::connect(peer_ip, SocketAddr::new(nic_ip, VERBS_PORT), 7, qpn);
    (f, b, qb, r)
}

#[test]
fn a_reset_stream_ends_the_qp_in_error() {
    let (_f, b, qb, mut r) = nic_and_peer(200);
    recv(&b, qb, 1, 0, 4096);
    let data = pattern(3000, 1);
    raw_send(&mut r, 1, &data);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 3000)
    );
    assert_eq!(b.buf.to_vec(0, 3000), data, "received bytes differ");
    recv(&b, qb, 2, 0, 64);
    // SO_LINGER 0: closing sends a RST.
    socket2::SockRef::from(&r.s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(r);
    assert!(
        b.rec.wait_for(|e| *e == qp_fatal(20)),
        "no QpFatal after the reset"
    );
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
}

#[test]
fn a_corrupt_crc_gets_a_terminate_and_the_nic_serves_on() {
    let (f, b, qb, mut r) = nic_and_peer(201);
    // A second connection to the same NIC, which must not notice.
    let qb2 = b.qp(QpType::Rc, None, 21);
    let qpn2 = b.p.qp_num(qb2).unwrap().value();
    ready(&b, qb2, ip(201, 1), 8);
    let mut r2 = RawPeer::connect(ip(201, 1), SocketAddr::new(ip(201, 2), VERBS_PORT), 8, qpn2);
    recv(&b, qb, 1, 0, 4096);
    // A Send whose CRC is wrong: one bit of its last byte flipped.
    r.mem.register(STag(1), 0, vec![0x77; 100], false, false);
    r.c.post_send(SendWqe {
        wr_id: 1,
        op: SendOp::Send {
            local: Sge {
                stag: STag(1),
                to: 0,
                len: 100,
            },
            solicited: false,
            invalidate: None,
        },
    });
    let mut fpdu = Vec::new();
    while r
        .c
        .poll_transmit(rdma_types::Instant::ZERO, &mut r.mem, &mut fpdu)
    {}
    *fpdu.last_mut().unwrap() ^= 0x01;
    r.s.write_all(&fpdu).unwrap();
    assert!(
        r.pump_until(|e| matches!(e, Event::TerminateReceived { .. })),
        "no TERMINATE: {:?}",
        r.events
    );
    assert!(r.events.contains(&Event::TerminateReceived {
        code: TermCause::MpaCrc.code()
    }));
    assert!(b.rec.wait_for(|e| *e == qp_fatal(20)), "no QpFatal");
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
    assert_eq!(b.buf.to_vec(0, 65536), vec![0; 65536], "memory touched");
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
    // The other connection still carries data.
    recv(&b, qb2, 2, 8192, 4096);
    let data = pattern(4000, 9);
    raw_send(&mut r2, 2, &data);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, 4000)
    );
    assert_eq!(b.buf.to_vec(8192, 4000), data);
    drop(f);
}

#[test]
fn a_write_outside_its_registration_gets_a_terminate_and_touches_nothing() {
    let (_f, b, qb, mut r) = nic_and_peer(202);
    // A registration of [4096, 8192) inside the 64 KiB buffer.
    let m =
        b.p.reg_mr(
            b.pd,
            &b.buf,
            b.buf.addr() + 4096,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            0,
        )
        .unwrap();
    let write = |r: &mut RawPeer, wr_id, to: u64| {
        r.c.post_send(SendWqe {
            wr_id,
            op: SendOp::Write {
                local: Sge {
                    stag: STag(2),
                    to: 0,
                    len: 64,
                },
                remote_stag: STag(m.rkey.0),
                remote_to: to,
            },
        });
        r.flush();
    };
    r.mem.register(STag(2), 0, vec![0xee; 64], false, false);
    // In range, then a Send behind it: its receive proves the placement.
    recv(&b, qb, 1, 0, 16);
    write(&mut r, 1, b.buf.addr() + 4096);
    raw_send(&mut r, 2, b"after");
    assert_eq!(b.wc().wr_id, 1);
    assert_eq!(b.buf.to_vec(4096, 64), vec![0xee; 64]);
    // 16 bytes inside, 48 past the end.
    recv(&b, qb, 3, 0, 16);
    write(&mut r, 3, b.buf.addr() + 8192 - 16);
    assert!(
        r.pump_until(|e| matches!(e, Event::TerminateReceived { .. })),
        "no TERMINATE: {:?}",
        r.events
    );
    assert!(
        r.events.contains(&Event::TerminateReceived {
            code: TermCause::DdpBaseBounds.code()
        }),
        "{:?}",
        r.events
    );
    assert!(b.rec.wait_for(|e| *e == qp_fatal(20)), "no QpFatal");
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::WrFlushErr));
    let mut want = vec![0u8; 65536];
    want[..5].copy_from_slice(b"after");
    want[4096..4160].fill(0xee);
    assert!(
        b.buf.to_vec(0, 65536) == want,
        "bytes outside the placements changed"
    );
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
}

/// The environment variable that makes [`peer_process`] a peer: the
/// parent's QPN.
const CHILD_ENV: &str = "IWARP_TCP_TEST_PEER_OF";

/// Run by [`a_killed_peer_process_ends_the_qp_in_error`] in a child
/// process: a NIC at 127.94.203.1 whose QP sends 8 KiB to the parent's QP
/// and then waits to be killed (it gives up after 60 s).
#[test]
#[ignore = "the peer process of a_killed_peer_process_ends_the_qp_in_error"]
fn peer_process() {
    let Ok(parent_qpn) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parent_qpn: u32 = parent_qpn.parse().unwrap();
    let f = pair(ip(203, 1), ip(203, 3));
    let a = Node::open(&f, f.guids.0, 64);
    let qa = a.qp(QpType::Rc, None, 10);
    println!("qpn {}", a.p.qp_num(qa).unwrap().value());
    ready(&a, qa, ip(203, 2), parent_qpn);
    a.buf.write_at(0, &pattern(8192, 5));
    a.p.post_send(
        qa,
        &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 8192)])],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    println!("sent");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn a_killed_peer_process_ends_the_qp_in_error() {
    let f = pair(ip(203, 4), ip(203, 2));
    let b = Node::open(&f, f.guids.1, 64);
    let qb = b.qp(QpType::Rc, None, 20);
    let qpn = b.p.qp_num(qb).unwrap().value();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, qpn.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next = |what: &str| loop {
        let l = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("peer process: no {what}: {e}"));
        // libtest prints "test peer_process ... " before the output.
        if let Some(at) = l.find(what) {
            return l[at + what.len()..].to_string();
        }
    };
    let peer_qpn: u32 = next("qpn ").trim().parse().unwrap();
    init(&b, qb);
    recv(&b, qb, 1, 0, 8192);
    recv(&b, qb, 2, 8192, 8192);
    connect(&b, qb, ip(203, 1), peer_qpn);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 8192)
    );
    assert_eq!(b.buf.to_vec(0, 8192), pattern(8192, 5));
    next("sent");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        b.rec.wait_for(|e| *e == qp_fatal(20)),
        "no QpFatal after the peer died"
    );
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
}

#[test]
fn a_stream_that_never_asks_for_a_qp_is_closed() {
    let options = iwarp_tcp::NicOptions {
        dead_peer: Duration::from_secs(1),
        ..Default::default()
    };
    let f = common::pair_with(ip(204, 1), ip(204, 2), options);
    let _b = Node::open(&f, f.guids.1, 16);
    let mut s = std::net::TcpStream::connect_timeout(
        &SocketAddr::new(ip(204, 2), VERBS_PORT),
        Duration::from_secs(10),
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    // No MPA request: the NIC closes the stream (EOF) after `dead_peer`.
    let n = std::io::Read::read(&mut s, &mut buf);
    assert!(matches!(n, Ok(0)), "expected EOF, got {n:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(9),
        "closed after {waited:?}"
    );
}

#[test]
fn a_client_that_speaks_no_mpa_is_refused_and_the_nic_serves_on() {
    let (_f, b, qb, mut r) = nic_and_peer(209);
    // Junk where an MPA request belongs: the NIC closes that stream.
    let mut junk = std::net::TcpStream::connect_timeout(
        &SocketAddr::new(ip(209, 2), VERBS_PORT),
        Duration::from_secs(10),
    )
    .unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    junk.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut junk, &mut buf);
    assert!(
        matches!(n, Ok(0))
            || n.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected the stream closed, got {n:?}"
    );
    // An MPA request for a QP the NIC does not have: a reject reply.
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(ip(209, 1), 0).into()).unwrap();
    s.connect_timeout(
        &SocketAddr::new(ip(209, 2), VERBS_PORT).into(),
        Duration::from_secs(10),
    )
    .unwrap();
    let mut s = std::net::TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let pd = iwarp_tcp::rendezvous::Rendezvous {
        initiator_qpn: 9,
        responder_qpn: 0x00ab_cdef,
    }
    .emit();
    let req =
        iwarp::mpa::FrameRepr::ours(iwarp::mpa::FrameKind::Request, true, 2, Some((4, 4)), &pd);
    let mut bytes = Vec::new();
    req.emit(&mut bytes);
    s.write_all(&bytes).unwrap();
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut got);
    let (rep, _) = iwarp::mpa::FrameRepr::parse(&got, iwarp::mpa::FrameKind::Reply).unwrap();
    assert!(rep.reject, "{rep:?}");
    assert_eq!(rep.private_data, b"no such QP");
    // The good connection still carries data.
    recv(&b, qb, 1, 0, 64);
    raw_send(&mut r, 1, b"still here");
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 10)
    );
    assert_eq!(b.buf.to_vec(0, 10), b"still here");
}

#[test]
fn destroying_a_qp_ends_its_peer_in_error() {
    let f = pair(ip(210, 1), ip(210, 2));
    let (a, b) = (Node::open(&f, f.guids.0, 64), Node::open(&f, f.guids.1, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    let (na, nb) = (
        a.p.qp_num(qa).unwrap().value(),
        b.p.qp_num(qb).unwrap().value(),
    );
    ready(&a, qa, ip(210, 2), nb);
    ready(&b, qb, ip(210, 1), na);
    recv(&b, qb, 1, 0, 64);
    a.buf.write_at(0, b"bye");
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 3)])])
        .unwrap();
    assert_eq!(b.wc().byte_len, 3);
    recv(&b, qb, 2, 0, 64);
    a.p.destroy_qp(qa).unwrap();
    assert!(b.rec.wait_for(|e| *e == qp_fatal(20)), "no QpFatal");
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
}

#[test]
fn a_peer_nic_that_is_not_there_ends_the_qp_in_error() {
    // Only the first NIC is opened; the second address has no listener.
    let f = pair(ip(211, 1), ip(211, 2));
    let a = Node::open(&f, f.guids.0, 16);
    let qa = a.qp(QpType::Rc, None, 10);
    init(&a, qa);
    recv(&a, qa, 1, 0, 64);
    // The connect is refused (at once, or by the time RTS is asked for).
    common::rtr(&a, qa, ip(211, 2), 99);
    assert!(a.rec.wait_for(|e| *e == qp_fatal(10)), "no QpFatal");
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
}
