//! Several clients of one daemon: traffic between them on one NIC (one
//! address, as on a host), their handles kept apart, bad input refused
//! without disturbing the others.

mod common;

use common::{fresh_ip, rc_pair, Daemon, One, RcPair};
use nicd::proto::{self, Answer, Kind, Reply, Request, VERSION};
use rdma_types::{QpType, WcOpcode, WcStatus};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use verbs::conformance::{connect, Node};
use verbs::{MemBuf, RemoteAddr, SendOpcode, SendWr, VerbsError};

const THIRD: u8 = 100;

/// Two client connections on one CA (one address): an RC SEND, an RDMA
/// WRITE and an RDMA READ between them, each verified in the other's
/// memory; the daemon counts each client's objects.
#[test]
fn two_clients_share_one_nic() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let RcPair {
        ca, a, b, qa, qb, ..
    } = rc_pair(&d, 64, 7);
    let clients = d.server.clients();
    assert_eq!(clients.len(), 2);
    for c in &clients {
        // CA, PD, CQ, MR, QP each.
        assert_eq!(c.total(), 5, "{c:?}");
        assert_eq!(c.peer.pid as u32, std::process::id());
    }
    // A client (root here) asks the daemon the same.
    assert_eq!(ca.0.daemon_clients().unwrap(), clients);
    assert!(
        clients[0]
            .to_string()
            .ends_with(": 1 CA, 1 PD, 1 CQ, 1 QP, 1 MR"),
        "{}",
        clients[0]
    );

    // SEND a -> b.
    b.post_one_recv(qb, 7, 0, 4096);
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 13 % 251) as u8).collect();
    a.buf.write_at(0, &msg);
    a.p.post_send(
        qa,
        &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 3000)])],
    )
    .unwrap();
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 3000)
    );
    assert_eq!(wc.qp_ctx, 2, "the client's own QP context");
    assert_eq!(b.buf.to_vec(0, 3000), msg);
    assert_eq!(a.wc().status, WcStatus::Success);

    // An inline SEND a -> b: the daemon reads a's bytes at post time
    // from a's own registration.
    b.post_one_recv(qb, 8, 60_000, 64);
    a.buf.write_at(100, b"inline through the daemon");
    let mut s = SendWr::new(4, SendOpcode::Send, vec![a.sge(100, 25)]);
    s.flags = verbs::SendFlags::SIGNALED | verbs::SendFlags::INLINE;
    a.p.post_send(qa, &[s]).unwrap();
    a.buf.write_at(100, &[0; 25]);
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (8, WcStatus::Success, 25)
    );
    assert_eq!(b.buf.to_vec(60_000, 25), b"inline through the daemon");
    assert_eq!(a.wc().status, WcStatus::Success);

    // WRITE a -> b's memory at b's address, with b's R_Key.
    a.buf.write_at(8192, &[0xa5; 5000]);
    let mut w = SendWr::new(2, SendOpcode::RdmaWrite, vec![a.sge(8192, 5000)]);
    w.remote = RemoteAddr {
        addr: b.buf.addr() + 20_000,
        rkey: b.mr.rkey,
    };
    a.p.post_send(qa, &[w]).unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert_eq!(b.buf.to_vec(20_000, 5000), vec![0xa5; 5000]);
    assert_eq!(b.buf.to_vec(25_000, 8), vec![0; 8], "nothing beyond");

    // READ b's memory into a's.
    b.buf.write_at(40_000, b"read me through the daemon");
    let mut r = SendWr::new(3, SendOpcode::RdmaRead, vec![a.sge(50_000, 26)]);
    r.remote = RemoteAddr {
        addr: b.buf.addr() + 40_000,
        rkey: b.mr.rkey,
    };
    a.p.post_send(qa, &[r]).unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    assert_eq!(a.buf.to_vec(50_000, 26), b"read me through the daemon");
}

/// A client's handles name nothing for another client, nor an object
/// of another kind; another client's L_Key is a protection error and
/// its R_Key range ends where its registration does.
#[test]
fn another_clients_handles_and_keys_are_refused() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let (ca, cb) = (One(d.client(), g), One(d.client(), g));
    let (a, b) = (Node::open(&ca, g, 64), Node::open(&cb, g, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    // b names a's objects: refused, and a's are untouched.
    assert_eq!(b.p.destroy_qp(qa), Err(VerbsError::InvalidHandle));
    assert_eq!(b.p.qp_num(qa), Err(VerbsError::InvalidHandle));
    assert_eq!(b.p.dereg_mr(a.mr.handle), Err(VerbsError::InvalidHandle));
    assert_eq!(b.p.dealloc_pd(a.pd), Err(VerbsError::InvalidHandle));
    assert_eq!(b.p.query_ca(a.ca), Err(VerbsError::InvalidHandle));
    assert_eq!(b.p.poll_cq(a.cq, &mut []), Err(VerbsError::InvalidHandle));
    assert!(a.p.qp_num(qa).is_ok());
    // A handle of one kind passed as another.
    assert_eq!(
        a.p.qp_num(verbs::QpHandle(a.cq.0)),
        Err(VerbsError::InvalidHandle)
    );
    connect(&a, qa, &b, qb, QpType::Rc, 7);

    // b's RDMA WRITE just past a's registration: a remote access error,
    // and a's bytes there stay as they were. Register a smaller range
    // of a's buffer for this.
    let mr =
        a.p.reg_mr(
            a.pd,
            &a.buf,
            a.buf.addr(),
            4096,
            verbs::conformance::all_access(),
            9,
        )
        .unwrap();
    let mut w = SendWr::new(1, SendOpcode::RdmaWrite, vec![b.sge(0, 64)]);
    b.buf.write_at(0, &[0xee; 64]);
    w.remote = RemoteAddr {
        addr: a.buf.addr() + 4096 - 32,
        rkey: mr.rkey,
    };
    b.p.post_send(qb, &[w]).unwrap();
    assert_eq!(b.wc().status, WcStatus::RemAccessErr);
    assert_eq!(a.buf.to_vec(4096 - 32, 64), vec![0; 64]);

    // a's L_Key in b's work request: a's PD, not b's.
    let (qa2, qb2) = (a.qp(QpType::Rc, None, 3), b.qp(QpType::Rc, None, 4));
    connect(&a, qa2, &b, qb2, QpType::Rc, 7);
    let mut s = SendWr::new(5, SendOpcode::Send, vec![a.sge(0, 16)]);
    s.flags = verbs::SendFlags::SIGNALED;
    match b.p.post_send(qb2, &[s]) {
        Ok(()) => assert_eq!(b.wc().status, WcStatus::LocProtErr),
        Err(e) => panic!("a bad L_Key completes in error, not {e}"),
    }
    // Inline data must lie in the client's own registrations.
    let mut s = SendWr::new(6, SendOpcode::Send, vec![a.sge(0, 16)]);
    s.flags = verbs::SendFlags::SIGNALED | verbs::SendFlags::INLINE;
    let e = b.p.post_send(qb, &[s]).unwrap_err();
    assert!(
        matches!(&e, VerbsError::BadWr { index: 0, cause } if matches!(**cause, VerbsError::InvalidArgument(_))),
        "{e:?}"
    );
}

/// Private memory cannot be registered through the daemon, and says why.
#[test]
fn private_memory_is_refused_with_the_fix() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let c = One(d.client(), g);
    let n = Node::open(&c, g, 16);
    let private = MemBuf::new_private(4096);
    let e =
        n.p.reg_mr(
            n.pd,
            &private,
            private.addr(),
            4096,
            rdma_types::AccessFlags::NONE,
            0,
        )
        .unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("MemBuf::new_shared")),
        "{e:?}"
    );
    // After connecting, MemBuf::new shares.
    assert!(MemBuf::new(100).shared_fd().is_some());
}

fn raw_call(s: &mut UnixStream, seq: u32, req: &Request) -> Answer {
    s.write_all(&proto::frame(Kind::Request, seq, req)).unwrap();
    read_answer(s, seq)
}

/// The answer to request `seq`, past the event frames before it (a CQ's
/// destruction is one).
fn read_answer(s: &mut UnixStream, seq: u32) -> Answer {
    let (got, answer) = read_any_answer(s);
    assert_eq!(got, seq, "the answer to request {seq}");
    answer
}

/// The next answer, whichever request it answers, past event frames.
fn read_any_answer(s: &mut UnixStream) -> (u32, Answer) {
    for _ in 0..16 {
        let mut len = [0; 4];
        s.read_exact(&mut len).unwrap();
        let mut f = vec![0; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut f).unwrap();
        let (kind, seq, body) = proto::split(&f).unwrap();
        if kind == Kind::Event {
            continue;
        }
        assert_eq!(kind, Kind::Response);
        return (seq, proto::decode::<Answer>(body).unwrap());
    }
    panic!("no answer among 16 frames");
}

/// A wrong version, a request before the hello, a malformed request, a
/// frame too long: each gets its error (or its connection closed), and
/// the daemon keeps serving the others.
#[test]
fn bad_input_is_refused_and_others_are_served() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let good = One(d.client(), g);
    let n = Node::open(&good, g, 16);

    // Another version: refused in words, and the connection closed.
    let mut s = UnixStream::connect(&d.path).unwrap();
    match raw_call(
        &mut s,
        1,
        &Request::Hello {
            version: VERSION + 1,
        },
    ) {
        Err(VerbsError::InvalidArgument(m)) => assert!(m.contains("version"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.read(&mut [0; 1]).unwrap(), 0, "closed");

    // A verb before the hello.
    let mut s = UnixStream::connect(&d.path).unwrap();
    match raw_call(&mut s, 1, &Request::ListCas {}) {
        Err(VerbsError::InvalidArgument(m)) => assert!(m.contains("Hello"), "{m}"),
        other => panic!("{other:?}"),
    }

    // After a good hello, a request of an unknown tag and one cut short:
    // errors, and the connection goes on.
    let mut s = UnixStream::connect(&d.path).unwrap();
    assert!(matches!(
        raw_call(&mut s, 1, &Request::Hello { version: VERSION }),
        Ok(Reply::Hello { .. })
    ));
    let mut f = proto::frame(Kind::Request, 2, &Request::ListCas {});
    f[9] = 250;
    s.write_all(&f).unwrap();
    match read_answer(&mut s, 2) {
        Err(VerbsError::InvalidArgument(m)) => assert!(m.contains("malformed"), "{m}"),
        other => panic!("{other:?}"),
    }
    let mut f = proto::frame(
        Kind::Request,
        3,
        &Request::QpNum {
            qp: verbs::QpHandle(verbs::Handle {
                index: 1,
                generation: 2,
            }),
        },
    );
    f.truncate(f.len() - 3);
    let len = (f.len() - 4) as u32;
    f[..4].copy_from_slice(&len.to_le_bytes());
    s.write_all(&f).unwrap();
    assert!(matches!(
        read_answer(&mut s, 3),
        Err(VerbsError::InvalidArgument(_))
    ));
    // A handle it never got.
    assert_eq!(
        raw_call(
            &mut s,
            4,
            &Request::QpNum {
                qp: verbs::QpHandle(verbs::Handle {
                    index: 1,
                    generation: 2
                })
            }
        ),
        Err(VerbsError::InvalidHandle)
    );
    assert!(matches!(
        raw_call(&mut s, 5, &Request::ListCas {}),
        Ok(Reply::Guids { guids }) if guids == vec![g]
    ));

    // A length beyond the limit: that connection is closed.
    let mut s2 = UnixStream::connect(&d.path).unwrap();
    assert!(raw_call(&mut s2, 1, &Request::Hello { version: VERSION }).is_ok());
    s2.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert_eq!(s2.read(&mut [0; 1]).unwrap(), 0, "closed");

    // The well-behaved client was served throughout; the connections
    // closed for their errors are gone, the good one and `s` remain.
    assert_eq!(n.p.query_ca(n.ca).unwrap().guid, g);
    assert!(d
        .server
        .wait_until(std::time::Duration::from_secs(10), |c, _| c.len() == 2));
}

/// A client that lets go of its provider (a clean exit) has its tree
/// released just as a killed one: the daemon's count for it is zero and
/// the client is gone, while another client's objects stay.
#[test]
fn a_client_that_disconnects_leaves_nothing_behind() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let stay = One(d.client(), g);
    let kept = Node::open(&stay, g, 16);
    let kept_objects = d.server.live_objects();
    let leaving_rec;
    {
        let leaving = One(d.client(), g);
        let n = Node::open(&leaving, g, 16);
        leaving_rec = n.rec.clone();
        let _srq =
            n.p.create_srq(
                n.pd,
                &verbs::SrqAttr {
                    max_wr: 16,
                    max_sge: 1,
                    limit: 0,
                },
                5,
            )
            .unwrap();
        let _qp = n.qp(QpType::Rc, None, 6);
        let (_mw, _) = n.p.alloc_mw(n.pd, verbs::MwType::Type2, 7).unwrap();
        let _ah = n.p.create_ah(n.pd, &n.av()).unwrap();
        // CA, PD, CQ, MR, SRQ, QP, MW, AH.
        assert_eq!(d.server.live_objects(), kept_objects + 8);
        // `n` and `leaving` dropped here without destroying anything.
    }
    assert!(
        d.server
            .wait_until(std::time::Duration::from_secs(10), |c, live| c.len() == 1
                && live == kept_objects),
        "{:?}",
        d.server.clients()
    );
    assert_eq!(d.server.release_failures(), 0, "the provider refused none");
    assert_eq!(kept.p.query_ca(kept.ca).unwrap().guid, g);
    // The client's threads end and let go of its handler, which heard
    // nothing of the end it chose (no CaRemoval).
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::sync::Arc::strong_count(&leaving_rec) > 1 && std::time::Instant::now() < end {
        std::thread::yield_now();
    }
    assert_eq!(std::sync::Arc::strong_count(&leaving_rec), 1);
    assert!(
        !leaving_rec.events().iter().any(|e| matches!(
            e,
            verbs::conformance::Ev::Async(a) if a.kind == verbs::AsyncEventKind::CaRemoval
        )),
        "{:?}",
        leaving_rec.events()
    );
}

/// A client's QPs and registered memory stop at its limits, with an
/// error that names the limit, counted; what it frees it may use again.
#[test]
fn per_client_limits_are_enforced_and_counted() {
    let limits = nicd::Limits {
        max_qps: 2,
        max_registered: 128 << 10,
    };
    let d = Daemon::start_with(&[fresh_ip(THIRD)], limits);
    let g = d.guids[0];
    // On the socket: rings count toward the memory limit too
    // (tests/rings.rs), and this counts registrations alone.
    let c = One(nicd::NicdProvider::connect_with(&d.path, false).unwrap(), g);
    // Node::open registers 64 KiB.
    let n = Node::open(&c, g, 16);
    let all = verbs::conformance::all_access();
    let b = MemBuf::new(64 << 10);
    let mr = n.p.reg_mr(n.pd, &b, b.addr(), 64 << 10, all, 1).unwrap();
    let small = MemBuf::new(4096);
    let e =
        n.p.reg_mr(n.pd, &small, small.addr(), 4096, all, 2)
            .unwrap_err();
    assert!(
        matches!(e, VerbsError::OutOfResources(m) if m.contains("--max-registered")),
        "{e:?}"
    );
    // Shrunk by a re-registration, the room is there again.
    n.p.rereg_mr(mr.handle, &b, b.addr(), 4096, all).unwrap();
    n.p.reg_mr(n.pd, &small, small.addr(), 4096, all, 2)
        .unwrap();

    let (q1, _q2) = (n.qp(QpType::Rc, None, 1), n.qp(QpType::Rc, None, 2));
    let e =
        n.p.create_qp(n.pd, &verbs::QpInit::rc(n.cq, 4, 4), 3)
            .unwrap_err();
    assert!(
        matches!(e, VerbsError::OutOfResources(m) if m.contains("--max-qps")),
        "{e:?}"
    );
    n.p.destroy_qp(q1).unwrap();
    n.p.create_qp(n.pd, &verbs::QpInit::rc(n.cq, 4, 4), 3)
        .unwrap();
    assert_eq!(d.server.limit_refusals(), 2);
    // Another client has limits of its own.
    let other = One(nicd::NicdProvider::connect_with(&d.path, false).unwrap(), g);
    let m = Node::open(&other, g, 16);
    let b2 = MemBuf::new(64 << 10);
    m.p.reg_mr(m.pd, &b2, b2.addr(), 64 << 10, all, 1).unwrap();
}

/// Each blocked `wait_cq` on the socket holds a thread of the daemon: a
/// client gets 64 at once, the 65th is refused at once (counted), and
/// the 64 all end when the CQ gets a completion. (A CQ with a ring is
/// waited for in the client and holds none: `tests/rings.rs`.)
#[test]
fn blocked_waits_are_bounded_per_client() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let c = One(nicd::NicdProvider::connect_with(&d.path, false).unwrap(), g);
    let n = std::sync::Arc::new(Node::open(&c, g, 256));
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..65 {
        let (n, tx) = (n.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(n.p.wait_cq(n.cq, std::time::Duration::from_secs(60)));
        });
    }
    // Only the refusal can come before a completion.
    let first = rx.recv().unwrap();
    assert!(
        matches!(first, Err(VerbsError::OutOfResources(m)) if m.contains("wait_cq")),
        "{first:?}"
    );
    assert_eq!(d.server.limit_refusals(), 1);
    // A flushed receive is a completion: every waiter returns.
    common::flush_a_receive(&n);
    for _ in 0..64 {
        assert_eq!(rx.recv().unwrap(), Ok(()));
    }
    assert_eq!(n.wc().status, WcStatus::WrFlushErr);
}

/// A daemon that refuses the hello (another version): `connect` says so
/// with the daemon's words, and no connection is kept.
#[test]
fn a_refused_hello_is_a_connect_error() {
    let path = std::env::temp_dir().join(format!("nicd-refuse-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut len = [0; 4];
        s.read_exact(&mut len).unwrap();
        let mut f = vec![0; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut f).unwrap();
        let (kind, seq, body) = proto::split(&f).unwrap();
        assert_eq!(kind, Kind::Request);
        assert_eq!(
            proto::decode::<Request>(body).unwrap(),
            Request::Hello { version: VERSION }
        );
        let no: Answer = Err(VerbsError::InvalidArgument(
            "protocol version 1 not served: this nicd speaks version 2".into(),
        ));
        s.write_all(&proto::frame(Kind::Response, seq, &no))
            .unwrap();
        // The client lets go of the connection.
        assert_eq!(s.read(&mut [0; 1]).unwrap(), 0);
    });
    let e = nicd::NicdProvider::connect(&path).err().expect("refused");
    assert!(
        matches!(&e, nicd::ConnectError::Refused { reason: VerbsError::InvalidArgument(m), .. } if m.contains("version 2")),
        "{e:?}"
    );
    assert!(e.to_string().contains("refused us"), "{e}");
    fake.join().unwrap();
    let _ = std::fs::remove_file(&path);
    // And nobody at a path is NoDaemon, saying how to start one.
    let e = nicd::NicdProvider::connect(&path).err().expect("no daemon");
    assert!(e.to_string().contains("nicd --ip"), "{e}");
}

/// A client that sends requests and never reads the answers is
/// disconnected once thousands are unread (the daemon's queue for it is
/// bounded), and its seat is given up; another client is served all the
/// while.
#[test]
fn a_client_that_never_reads_is_disconnected() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let good = One(d.client(), g);
    let n = Node::open(&good, g, 16);
    let mut s = UnixStream::connect(&d.path).unwrap();
    assert!(matches!(
        raw_call(&mut s, 1, &Request::Hello { version: VERSION }),
        Ok(Reply::Hello { .. })
    ));
    assert_eq!(d.server.clients().len(), 2);
    let frame = proto::frame(Kind::Request, 2, &Request::ListCas {});
    let mut sent = 0u32;
    let refused = loop {
        // Bounded: far more than the daemon's queue plus the socket's
        // buffers hold.
        assert!(
            sent < 1_000_000,
            "{sent} requests unread and still connected"
        );
        if let Err(e) = s.write_all(&frame) {
            break e;
        }
        sent += 1;
    };
    assert!(
        matches!(
            refused.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        "after {sent} requests: {refused}"
    );
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while d.server.clients().len() != 1 {
        assert!(
            std::time::Instant::now() < end,
            "the reader is still a client"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The other client was served throughout and still is.
    assert_eq!(good.0.daemon_clients().unwrap().len(), 1);
    drop(n);
}

/// A raw client's CQ: Hello, OpenCa, AllocPd, CreateCq.
fn raw_cq(d: &Daemon) -> (UnixStream, verbs::CqHandle) {
    let mut s = UnixStream::connect(&d.path).unwrap();
    assert!(matches!(
        raw_call(&mut s, 1, &Request::Hello { version: VERSION }),
        Ok(Reply::Hello { .. })
    ));
    let Ok(Reply::Ca { ca }) = raw_call(
        &mut s,
        2,
        &Request::OpenCa {
            guid: d.guids[0],
            ctx: 0,
        },
    ) else {
        panic!("open CA")
    };
    let Ok(Reply::Pd { pd }) = raw_call(&mut s, 3, &Request::AllocPd { ca, ctx: 0 }) else {
        panic!("allocate PD")
    };
    let init = verbs::CqInit { cqe: 16 };
    let Ok(Reply::Cq { cq }) = raw_call(&mut s, 4, &Request::CreateCq { pd, init, ctx: 0 }) else {
        panic!("create CQ")
    };
    (s, cq)
}

/// A `WaitCq` with no end (the longest timeout a client can ask) ends
/// when its CQ is destroyed (answered: invalid handle) or its client goes
/// (its thread ends): a client cannot leave the daemon's threads blocked
/// behind it. The timeout itself is no panic.
#[test]
fn an_endless_wait_ends_with_its_cq_or_its_client() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let (mut s, cq) = raw_cq(&d);
    let wait = Request::WaitCq {
        cq,
        timeout_us: u64::MAX,
    };
    s.write_all(&proto::frame(Kind::Request, 5, &wait)).unwrap();
    // Both are answered, in either order (answers carry their request's
    // number): the destroy done, the wait with an error.
    s.write_all(&proto::frame(Kind::Request, 6, &Request::DestroyCq { cq }))
        .unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut answers = [read_any_answer(&mut s), read_any_answer(&mut s)];
    answers.sort_by_key(|(seq, _)| *seq);
    let [(5, wait), (6, destroy)] = answers else {
        panic!("answers to 5 and 6, not {answers:?}")
    };
    assert!(matches!(destroy, Ok(Reply::Unit {})), "{destroy:?}");
    assert!(matches!(wait, Err(VerbsError::InvalidHandle)), "{wait:?}");

    drop(s);
    // Another endless wait, and the client goes away under it.
    assert_eq!(d.server.blocked_waits(), 0);
    let (mut s, cq) = raw_cq(&d);
    s.write_all(&proto::frame(
        Kind::Request,
        5,
        &Request::WaitCq {
            cq,
            timeout_us: u64::MAX,
        },
    ))
    .unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while d.server.blocked_waits() == 0 {
        assert!(std::time::Instant::now() < end, "the wait never blocked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(s);
    while d.server.blocked_waits() > 0 || !d.server.clients().is_empty() {
        assert!(
            std::time::Instant::now() < end,
            "{} waits still blocked after their client left",
            d.server.blocked_waits()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
