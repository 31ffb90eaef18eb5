//! The shared-memory rings against a client that writes garbage into
//! them, and a client killed while it posts through them.
//!
//! The hostile client speaks the protocol itself (a raw socket, its own
//! memfds), so it can write what the client provider never would: a
//! handle not its own, inline data outside its memory, an entry that
//! does not decode, a producer index past the ring. Each kills only the
//! ring it was written to (its QP in the error state, a `QpFatal`
//! event), and a well-behaved client of the same daemon is served
//! throughout.

mod common;

use common::{fresh_ip, rc_pair, Daemon, One, RcPair};
use nicd::proto::{self, Answer, Event, Kind, Reply, Request, RingSpec};
use nicd::ring::{encode_entry, flags, Ring, CQE_SIZE};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use rdma_types::{Qkey, QpState, QpType, WcStatus};
use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use verbs::conformance::{connect, Node};
use verbs::{
    AsyncEventKind, CqHandle, CqInit, MemBuf, PdHandle, QpCaps, QpHandle, QpInit, RecvWr,
    SendFlags, SendOpcode, SendWr, Sge, UdDest, VerbsError,
};

const THIRD: u8 = 120;

/// A client that speaks the protocol by hand.
struct Raw {
    s: UnixStream,
    seq: u32,
    doorbell: OwnedFd,
    /// Events read while waiting for an answer.
    events: Vec<Event>,
}

fn read_frame(s: &mut UnixStream) -> Vec<u8> {
    let mut len = [0; 4];
    s.read_exact(&mut len).expect("a frame from nicd in time");
    let mut f = vec![0; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut f).expect("the frame's body");
    f
}

impl Raw {
    /// Connects with version 2 and gives the daemon a doorbell.
    fn connect(d: &Daemon) -> Raw {
        let s = UnixStream::connect(&d.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // SAFETY: no pointers; the descriptor returned is ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(fd >= 0);
        // SAFETY: just made, owned by nobody else.
        let doorbell = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut r = Raw {
            s,
            seq: 0,
            doorbell,
            events: Vec::new(),
        };
        let v = proto::VERSION;
        assert!(matches!(
            r.call(&Request::Hello { version: v }, None),
            Ok(Reply::Hello { version: 2, .. })
        ));
        let db = r.doorbell.try_clone().unwrap();
        assert_eq!(
            r.call(&Request::Doorbell {}, Some(db.as_fd())),
            Ok(Reply::Unit {})
        );
        r
    }

    /// Sends `req` (with `fd`) and reads up to its answer (events on
    /// the way are kept).
    fn call(&mut self, req: &Request, fd: Option<BorrowedFd<'_>>) -> Answer {
        self.seq += 1;
        let f = proto::frame(Kind::Request, self.seq, req);
        match fd {
            None => self.s.write_all(&f).unwrap(),
            Some(fd) => {
                let fds = [fd.as_raw_fd()];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                let iov = [IoSlice::new(&f)];
                let n = sendmsg::<()>(self.s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
                    .unwrap();
                self.s.write_all(&f[n..]).unwrap();
            }
        }
        loop {
            let f = read_frame(&mut self.s);
            let (kind, seq, body) = proto::split(&f).unwrap();
            match kind {
                Kind::Response if seq == self.seq => {
                    return proto::decode::<Answer>(body).unwrap();
                }
                Kind::Event => self.events.push(proto::decode::<Event>(body).unwrap()),
                _ => {}
            }
        }
    }

    /// Reads events until one that `want` accepts.
    fn await_event(&mut self, want: impl Fn(&Event) -> bool) -> Event {
        if let Some(i) = self.events.iter().position(&want) {
            return self.events.remove(i);
        }
        for _ in 0..1000 {
            let f = read_frame(&mut self.s);
            let (kind, _, body) = proto::split(&f).unwrap();
            if kind == Kind::Event {
                let e = proto::decode::<Event>(body).unwrap();
                if want(&e) {
                    return e;
                }
            }
        }
        panic!("no such event in 1000 frames");
    }

    fn ring_doorbell(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes from a live array to our eventfd.
        let n = unsafe { libc::write(self.doorbell.as_raw_fd(), one.as_ptr().cast(), 8) };
        assert_eq!(n, 8);
    }
}

/// The hostile client's CA, PD and CQ (with its ring).
struct Setup {
    pd: PdHandle,
    cq: CqHandle,
    cq_ring: Ring,
}

fn setup(r: &mut Raw, guid: rdma_types::Guid) -> Setup {
    let Ok(Reply::Ca { ca }) = r.call(&Request::OpenCa { guid, ctx: 1 }, None) else {
        panic!("open");
    };
    let Ok(Reply::Pd { pd }) = r.call(&Request::AllocPd { ca, ctx: 2 }, None) else {
        panic!("pd");
    };
    let spec = RingSpec::new(0, CQE_SIZE as usize, 16);
    let buf = MemBuf::new_shared(spec.end() as usize).unwrap();
    let req = Request::CreateCqRing {
        pd,
        init: CqInit { cqe: 16 },
        ctx: 3,
        len: buf.len() as u64,
        ring: spec,
    };
    let Ok(Reply::Cq { cq }) = r.call(&req, buf.shared_fd()) else {
        panic!("cq");
    };
    Setup {
        pd,
        cq,
        cq_ring: Ring::new(buf, spec).unwrap(),
    }
}

/// A QP with rings: its handle, its SQ and its RQ.
fn qp(r: &mut Raw, s: &Setup, ctx: u64) -> (QpHandle, Ring, Ring) {
    let sq = RingSpec::new(0, 512, 16);
    let rq = RingSpec::new(sq.end().next_multiple_of(4096), 256, 16);
    let buf = MemBuf::new_shared(rq.end() as usize).unwrap();
    let init = QpInit {
        qp_type: QpType::Rc,
        send_cq: s.cq,
        recv_cq: s.cq,
        srq: None,
        caps: QpCaps::default(),
        sq_sig_all: false,
        port: None,
    };
    let req = Request::CreateQpRing {
        pd: s.pd,
        init,
        ctx,
        len: buf.len() as u64,
        sq,
        rq: Some(rq),
    };
    let Ok(Reply::Qp { qp }) = r.call(&req, buf.shared_fd()) else {
        panic!("qp");
    };
    let (sq, rq) = (
        Ring::new(buf.clone(), sq).unwrap(),
        Ring::new(buf, rq).unwrap(),
    );
    (qp, sq, rq)
}

/// Makes one completion for QP `q`'s CQ: a receive posted on the
/// socket, flushed by moving the QP to ERR.
fn flush_a_receive(r: &mut Raw, q: QpHandle) {
    let init = verbs::QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(rdma_types::PortNum(1)),
        access: Some(rdma_types::AccessFlags::NONE),
        ..Default::default()
    };
    assert_eq!(
        r.call(&Request::ModifyQp { qp: q, attr: init }, None),
        Ok(Reply::Unit {})
    );
    let wrs = vec![RecvWr {
        wr_id: 1,
        sges: verbs::sges![],
    }];
    assert_eq!(
        r.call(&Request::PostRecv { qp: q, wrs }, None),
        Ok(Reply::Unit {})
    );
    let err = verbs::QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    assert_eq!(
        r.call(&Request::ModifyQp { qp: q, attr: err }, None),
        Ok(Reply::Unit {})
    );
}

/// Writes `entries` raw into `ring` from index 0 and publishes them.
fn scribble(r: &Raw, ring: &Ring, entries: &[Vec<u8>]) {
    for (i, e) in entries.iter().enumerate() {
        assert!(ring.write(i as u64, e));
    }
    ring.set_producer(entries.len() as u64);
    r.ring_doorbell();
}

fn entry<T: proto::Wire>(v: &T) -> Vec<u8> {
    let mut b = Vec::new();
    encode_entry(v, &mut b);
    b
}

/// Waits for QP `ctx`'s `QpFatal`, then checks the ring is dead and the
/// QP in the error state.
fn refused(r: &mut Raw, qp: QpHandle, ctx: u64, ring: &Ring) {
    r.await_event(|e| {
        matches!(e, Event::Async { event, .. }
            if event.kind == AsyncEventKind::QpFatal && event.ctx == ctx)
    });
    assert_ne!(ring.flags() & flags::DEAD, 0, "the ring is dead");
    match r.call(&Request::QueryQp { qp }, None) {
        Ok(Reply::QpAttr { attr }) => assert_eq!(attr.state, Some(QpState::Err)),
        other => panic!("{other:?}"),
    }
}

/// Each kind of garbage kills its own ring and nothing else; the
/// daemon counts them; a good client's SEND goes through after.
#[test]
fn malformed_ring_entries_are_refused_without_harm_to_others() {
    let d = Daemon::start(&[fresh_ip(THIRD), fresh_ip(THIRD)]);
    let (g1, g2) = (d.guids[0], d.guids[1]);
    let good = d.client();
    assert!(good.uses_rings());
    let (ga, gb) = (One(good.clone(), g1), One(good.clone(), g2));
    let (a, b) = (Node::open(&ga, g1, 64), Node::open(&gb, g2, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    // A handle of the good client's, for the hostile one to name.
    let their_ah = a.p.create_ah(a.pd, &b.av()).unwrap();

    let mut r = Raw::connect(&d);
    let s = setup(&mut r, g1);
    let sge_in = |len| Sge {
        addr: 4096,
        length: len,
        lkey: rdma_types::Lkey(1),
    };

    // A handle not its own: the good client's AH.
    let (q, sq, _) = qp(&mut r, &s, 10);
    let mut w = SendWr::new(1, SendOpcode::Send, vec![]);
    w.ud = Some(UdDest {
        ah: their_ah,
        remote_qpn: rdma_types::Qpn::new(5).unwrap(),
        remote_qkey: Qkey(0),
    });
    scribble(&r, &sq, &[entry(&w)]);
    refused(&mut r, q, 10, &sq);

    // Inline data outside any registration of its own (it has none;
    // the address is one of the good client's).
    let (q, sq, _) = qp(&mut r, &s, 11);
    let mut w = SendWr::new(2, SendOpcode::Send, vec![a.sge(0, 16)]);
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    scribble(&r, &sq, &[entry(&w)]);
    refused(&mut r, q, 11, &sq);

    // Bytes that do not decode.
    let (q, sq, _) = qp(&mut r, &s, 12);
    let mut junk = vec![0xa7u8; 64];
    junk[..4].copy_from_slice(&60u32.to_le_bytes());
    scribble(&r, &sq, &[junk]);
    refused(&mut r, q, 12, &sq);
    assert_eq!(sq.consumer(), 0, "nothing taken");

    // A length prefix past the slot, in the RQ.
    let (q, _, rq) = qp(&mut r, &s, 13);
    let mut long = entry(&RecvWr {
        wr_id: 4,
        sges: verbs::sges![sge_in(8)],
    });
    long[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    scribble(&r, &rq, &[long]);
    refused(&mut r, q, 13, &rq);

    // A producer index far past the ring's 16 entries.
    let (q, sq, _) = qp(&mut r, &s, 14);
    sq.set_producer(1 << 40);
    r.ring_doorbell();
    refused(&mut r, q, 14, &sq);

    assert_eq!(d.server.ring_refusals(), 5);
    // The hostile client is still served on its socket.
    assert!(matches!(
        r.call(&Request::ListCas {}, None),
        Ok(Reply::Guids { .. })
    ));

    // The good client: its AH untouched, its SEND delivered and checked.
    b.post_one_recv(qb, 7, 0, 4096);
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 253) as u8).collect();
    a.buf.write_at(0, &msg);
    a.p.post_send(
        qa,
        &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 3000)])],
    )
    .unwrap();
    let wc = b.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 3000)
    );
    assert_eq!(b.buf.to_vec(0, 3000), msg);
    assert_eq!(a.wc().status, WcStatus::Success);
    a.p.destroy_ah(their_ah).unwrap();
    let c = good.counters();
    assert!(c.ring_posts >= 1, "the SEND went through its ring: {c:?}");
}

/// A client's ring post on the socket goes after what its ring holds,
/// and a `BadWr` of a mixed batch counts from the call's first WR.
#[test]
fn ring_and_socket_posts_keep_their_order() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let c = One(d.client(), g);
    let (a, b) = (Node::open(&c, g, 64), Node::open(&c, g, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    let recvs: Vec<RecvWr> = (0..4)
        .map(|i| RecvWr {
            wr_id: i,
            sges: verbs::sges![b.sge(i * 64, 64)],
        })
        .collect();
    b.p.post_recv(qb, &recvs).unwrap();
    // Two ring sends, an atomic (socket: not a ring opcode), one more,
    // then one the provider refuses (64 SGEs): index 4.
    let mut batch: Vec<SendWr> = (0..2)
        .map(|i| SendWr::new(i, SendOpcode::Send, vec![a.sge(i * 64, 8)]))
        .collect();
    let mut fa = SendWr::new(2, SendOpcode::AtomicFetchAdd, vec![a.sge(1024, 8)]);
    fa.remote = verbs::RemoteAddr {
        addr: b.buf.addr() + 2048,
        rkey: b.mr.rkey,
    };
    fa.compare_add = 5;
    batch.push(fa);
    batch.push(SendWr::new(3, SendOpcode::Send, vec![a.sge(192, 8)]));
    batch.push(SendWr::new(4, SendOpcode::Send, vec![a.sge(0, 1); 64]));
    let e = a.p.post_send(qa, &batch).unwrap_err();
    assert!(matches!(e, VerbsError::BadWr { index: 4, .. }), "{e:?}");
    let ids: Vec<u64> = (0..4).map(|_| a.wc().wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3], "in the order posted");
    let recvd: Vec<u64> = (0..3).map(|_| b.wc().wr_id).collect();
    assert_eq!(recvd, vec![0, 1, 2]);
    assert_eq!(b.buf.to_vec(2048, 8), vec![5, 0, 0, 0, 0, 0, 0, 0]);
    a.no_wc();
}

const CHILD_ENV: &str = "NICD_RINGS_CHILD";

/// The child: posts WRITEs between two QPs of its own as fast as it
/// can, says so once it is under way, and goes on until killed.
fn child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let p = nicd::NicdProvider::connect(std::path::Path::new(f[0])).unwrap();
    assert!(p.uses_rings());
    let guid = rdma_types::Guid(f[1].parse().unwrap());
    let c = One(p.clone(), guid);
    let (a, b) = (Node::open(&c, guid, 256), Node::open(&c, guid, 256));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    let blank = verbs::WorkCompletion::new(0, WcStatus::GeneralErr, rdma_types::WcOpcode::Send, 0);
    let mut wcs = [blank; 16];
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut said = false;
    loop {
        while posted - done < 16 {
            let mut w = SendWr::new(posted, SendOpcode::RdmaWrite, vec![a.sge(0, 512)]);
            w.remote = verbs::RemoteAddr {
                addr: b.buf.addr() + (posted % 64) * 512,
                rkey: b.mr.rkey,
            };
            a.p.post_send(qa, &[w]).unwrap();
            posted += 1;
        }
        done += a.p.poll_cq(a.cq, &mut wcs).unwrap() as u64;
        if posted >= 1000 && !said {
            said = true;
            let mut out = std::io::stdout().lock();
            writeln!(out, "CHILD POSTING").unwrap();
            out.flush().unwrap();
        }
    }
}

/// `kill -9` of a client while it posts through its rings: the daemon
/// stops its poller and releases all it held; another client goes on.
#[test]
fn a_client_killed_mid_post_is_released() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let me = One(d.client(), g);
    let (a, b) = (Node::open(&me, g, 64), Node::open(&me, g, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    let mine = d.server.live_objects();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_client_killed_mid_post_is_released",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} {}", d.path.display(), g.0))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (reported, watch) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to our own child, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "the child ended");
        if line.contains("CHILD POSTING") {
            break;
        }
    }
    let _ = reported.send(());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        d.server.wait_until(Duration::from_secs(20), |c, live| {
            c.iter().all(|c| c.peer.pid != pid) && live == mine
        }),
        "the child's objects were not released: {:?}",
        d.server.clients()
    );
    assert_eq!(d.server.release_failures(), 0);
    assert_eq!(
        d.server.ring_refusals(),
        0,
        "nothing it left was taken for garbage"
    );

    // We go on.
    b.post_one_recv(qb, 9, 0, 64);
    a.buf.write_at(0, b"still here");
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 10)])])
        .unwrap();
    assert_eq!(b.wc().byte_len, 10);
    assert_eq!(b.buf.to_vec(0, 10), b"still here");
    assert_eq!(a.wc().status, WcStatus::Success);
}

/// A client that asks for version 1 is served as before: every verb on
/// the socket, nothing through rings.
#[test]
fn a_version_1_client_is_served_on_the_socket() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let old = nicd::NicdProvider::connect_with(&d.path, false).unwrap();
    assert!(!old.uses_rings());
    let c = One(old.clone(), g);
    let (a, b) = (Node::open(&c, g, 64), Node::open(&c, g, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    b.post_one_recv(qb, 1, 0, 64);
    a.buf.write_at(0, b"version 1");
    a.p.post_send(qa, &[SendWr::new(2, SendOpcode::Send, vec![a.sge(0, 9)])])
        .unwrap();
    assert_eq!(b.wc().byte_len, 9);
    assert_eq!(b.buf.to_vec(0, 9), b"version 1");
    assert_eq!(a.wc().status, WcStatus::Success);
    let n = old.counters();
    assert_eq!(
        (n.ring_posts, n.ring_polls, n.doorbells),
        (0, 0, 0),
        "{n:?}"
    );
}

/// A daemon of version 1 refuses version 2 and closes; the client asks
/// again for version 1 on a new connection and is served on the socket.
#[test]
fn a_new_client_falls_back_to_an_old_daemon() {
    let path = std::env::temp_dir().join(format!("nicd-v1-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let old_daemon = std::thread::spawn(move || {
        for (want, answer) in [
            (
                2,
                Err(VerbsError::InvalidArgument(
                    "protocol version 2 not served: this nicd speaks version 1".into(),
                )),
            ),
            (1, Ok(Reply::Hello { version: 1, pid: 1 })),
        ] {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let f = read_frame(&mut s);
            let (_, seq, body) = proto::split(&f).unwrap();
            assert_eq!(
                proto::decode::<Request>(body).unwrap(),
                Request::Hello { version: want }
            );
            let a: Answer = answer;
            s.write_all(&proto::frame(Kind::Response, seq, &a)).unwrap();
            // The client lets go of the connection (refused, or dropped).
            assert_eq!(s.read(&mut [0; 1]).unwrap(), 0);
        }
    });
    let p = nicd::NicdProvider::connect(&path).unwrap();
    assert!(!p.uses_rings(), "an old daemon: the socket only");
    drop(p);
    old_daemon.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// `wait_cq` on a CQ with a ring sleeps in the client (on the ring's
/// producer index) and holds no thread of the daemon: 65 waiters are
/// not refused, and all of them return on one completion.
#[test]
fn ring_waits_hold_no_daemon_thread() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let c = One(d.client(), g);
    let n = std::sync::Arc::new(Node::open(&c, g, 256));
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..65 {
        let (n, tx) = (n.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(n.p.wait_cq(n.cq, Duration::from_secs(60)));
        });
    }
    common::flush_a_receive(&n);
    for _ in 0..65 {
        assert_eq!(rx.recv().unwrap(), Ok(()));
    }
    assert_eq!(d.server.limit_refusals(), 0);
    assert_eq!(n.wc().status, WcStatus::WrFlushErr);
    // A wait with nothing to come times out in the client.
    assert_eq!(
        n.p.wait_cq(n.cq, Duration::from_millis(5)),
        Err(VerbsError::Timeout)
    );
}

/// A CQ consumer index from nowhere (past the producer's): the next
/// completion overruns that CQ (`CqError`, the ring dead), and the
/// client's other CQ and the daemon are untouched.
#[test]
fn a_cq_consumer_index_from_nowhere_overruns_only_that_cq() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let mut r = Raw::connect(&d);
    let s = setup(&mut r, g);
    let other = setup(&mut r, g);
    let (q, _, _) = qp(&mut r, &s, 20);
    s.cq_ring.set_consumer(1 << 40);
    flush_a_receive(&mut r, q);
    r.await_event(|e| {
        matches!(e, Event::Async { event, .. }
            if event.kind == AsyncEventKind::CqError && event.ctx == 3)
    });
    assert_ne!(s.cq_ring.flags() & flags::DEAD, 0);
    assert_eq!(other.cq_ring.flags() & flags::DEAD, 0, "the other CQ lives");
    assert!(matches!(
        r.call(&Request::ListCas {}, None),
        Ok(Reply::Guids { .. })
    ));
}

/// Rings count toward a client's memory limit (the daemon reads and
/// writes them for it): QPs whose rings would pass it are made on the
/// socket instead (the refusal counted) and work; the CQ's ring, which
/// fits, serves the polls.
#[test]
fn rings_count_toward_the_memory_limit() {
    // Node::open: a 64 KiB registration and a CQ of 64 (an 8 KiB ring);
    // 1 KiB more holds no QP's rings (a 4 KiB header each).
    let limits = nicd::Limits {
        max_qps: 16,
        max_registered: (64 << 10) + (8 << 10) + 1024,
    };
    let d = Daemon::start_with(&[fresh_ip(THIRD)], limits);
    let g = d.guids[0];
    let p = d.client();
    let c = One(p.clone(), g);
    let n = Node::open(&c, g, 64);
    assert_eq!(d.server.limit_refusals(), 0, "the CQ's ring fits");
    let (qa, qb) = (n.qp(QpType::Rc, None, 1), n.qp(QpType::Rc, None, 2));
    assert_eq!(d.server.limit_refusals(), 2, "neither QP's rings fit");
    connect(&n, qa, &n, qb, QpType::Rc, 7);
    let before = p.counters();
    n.post_one_recv(qb, 5, 4096, 64);
    n.buf.write_at(0, b"no rings");
    n.p.post_send(qa, &[SendWr::new(6, SendOpcode::Send, vec![n.sge(0, 8)])])
        .unwrap();
    let mut got = [n.wc(), n.wc()];
    got.sort_by_key(|w| w.wr_id);
    assert_eq!((got[0].wr_id, got[0].byte_len), (5, 8));
    assert_eq!(n.buf.to_vec(4096, 8), b"no rings");
    let after = p.counters();
    assert_eq!(after.ring_posts, before.ring_posts, "posts on the socket");
    assert!(after.ring_polls > before.ring_polls, "polls from the ring");
}

/// A receive posted on a running QP returns without waiting for the
/// daemon to take it, and so does the poster's next send on the ring:
/// the daemon takes the receive rings before the sends it saw, so a
/// peer that learns of the receives from that send finds every one in
/// the NIC: here 64 SENDs answer the message at once on a QP with no
/// RNR retry (a missing receive would fail one with `RnrRetryExcErr`).
#[test]
fn receives_on_a_running_queue_go_to_the_nic_before_the_next_send() {
    receives_before_the_next_send(Daemon::start(&[fresh_ip(THIRD)]));
}

/// The same with a thread per client polling its rings
/// (`nicd --ring-pollers`).
#[test]
fn receives_go_before_the_next_send_with_ring_pollers() {
    let d = Daemon::start_pollers(&[fresh_ip(THIRD)]);
    let server = d.server.clone();
    receives_before_the_next_send(d);
    // Both clients had a poller (they end with the test's nodes).
    assert!(server.ring_pollers() <= 2);
}

fn receives_before_the_next_send(d: Daemon) {
    let RcPair {
        cb, a, b, qa, qb, ..
    } = rc_pair(&d, 256, 0);
    // The first receive of each side's ring is waited for.
    a.post_one_recv(qa, 900, 8192, 64);
    b.post_one_recv(qb, 0, 0, 64);
    let before = cb.0.counters();
    for i in 1..=64u64 {
        let wr = RecvWr {
            wr_id: i,
            sges: verbs::sges![b.sge(i * 64, 64)],
        };
        b.p.post_recv(qb, &[wr]).unwrap();
    }
    let mid = cb.0.counters();
    assert_eq!(
        mid.deferred_receives - before.deferred_receives,
        64,
        "{mid:?}"
    );
    // b tells a it may send: the send goes on the ring without waiting,
    // behind the receives.
    b.p.post_send(
        qb,
        &[SendWr::new(1000, SendOpcode::Send, vec![b.sge(16384, 8)])],
    )
    .unwrap();
    let after = cb.0.counters();
    assert_eq!(after.fenced_sends - before.fenced_sends, 0, "{after:?}");
    assert_eq!(after.ring_posts - mid.ring_posts, 1, "{after:?}");
    assert_eq!(b.wc().status, WcStatus::Success);
    assert_eq!(a.wc().wr_id, 900);
    let sends: Vec<SendWr> = (0..64)
        .map(|i| SendWr::new(2000 + i, SendOpcode::Send, vec![a.sge(i * 64, 8)]))
        .collect();
    for chunk in sends.chunks(16) {
        a.p.post_send(qa, chunk).unwrap();
    }
    for _ in 0..64 {
        let wc = a.wc();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    // In the order posted: the first (waited for), then the deferred.
    let got: Vec<u64> = (0..64).map(|_| b.wc().wr_id).collect();
    assert_eq!(got, (0..64).collect::<Vec<u64>>());
}

/// Two clients on one NIC: that NIC's thread takes their rings (no
/// poller thread); a third client with queues on two NICs has all of its
/// rings taken by its first NIC's thread (one thread keeps its receives
/// ahead of its sends across the NICs; still no poller), and its queues
/// on both NICs work through the rings.
#[test]
fn a_nics_thread_takes_the_rings_of_its_clients() {
    let d = Daemon::start(&[fresh_ip(THIRD), fresh_ip(THIRD)]);
    let (g0, g1) = (d.guids[0], d.guids[1]);
    let (ca, cb) = (One(d.client(), g0), One(d.client(), g0));
    let (a, b) = (Node::open(&ca, g0, 256), Node::open(&cb, g0, 256));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    exchange(&a, qa, &b, qb, 10);
    assert_eq!(
        d.server.ring_pollers(),
        0,
        "a poller thread for one NIC's rings"
    );
    assert!(ca.0.counters().ring_posts > 0, "{:?}", ca.0.counters());
    // One client, a QP on each NIC.
    let c = d.client();
    let (c0, c1) = (One(c.clone(), g0), One(c.clone(), g1));
    let n0 = Node::open(&c0, g0, 256);
    let q0 = n0.qp(QpType::Rc, None, 3);
    let (pa, pq) = (b.qp(QpType::Rc, None, 4), q0);
    connect(&b, pa, &n0, pq, QpType::Rc, 7);
    exchange(&b, pa, &n0, pq, 3);
    assert_eq!(d.server.ring_pollers(), 0);
    let n1 = Node::open(&c1, g1, 256);
    let q1 = n1.qp(QpType::Rc, None, 5);
    assert_eq!(
        d.server.ring_pollers(),
        0,
        "the first NIC's thread takes the two-NIC client's rings"
    );
    let before = c.counters();
    let e = One(d.client(), g1);
    let m = Node::open(&e, g1, 256);
    let qm = m.qp(QpType::Rc, None, 6);
    connect(&m, qm, &n1, q1, QpType::Rc, 7);
    exchange(&m, qm, &n1, q1, 3);
    exchange(&n1, q1, &m, qm, 3);
    exchange(&b, pa, &n0, pq, 3);
    exchange(&n0, pq, &b, pa, 3);
    let after = c.counters();
    assert!(
        after.ring_posts >= before.ring_posts + 12,
        "both NICs' posts went through the rings: {before:?} -> {after:?}"
    );
}

/// `n` SENDs from `a`'s QP `qa` to `b`'s `qb`, each received whole
/// (the QPs retry RNR without end: two clients' rings may be taken by
/// two threads, the receives after the SEND arrived).
fn exchange(a: &Node, qa: QpHandle, b: &Node, qb: QpHandle, n: u64) {
    for i in 0..n {
        b.post_one_recv(qb, 500 + i, 4096 + i * 64, 64);
    }
    for i in 0..n {
        a.p.post_send(
            qa,
            &[SendWr::new(
                600 + i,
                SendOpcode::Send,
                vec![a.sge(i * 64, 32)],
            )],
        )
        .unwrap();
    }
    for _ in 0..n {
        let wc = a.wc();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let got: Vec<(u64, WcStatus)> = (0..n)
        .map(|_| {
            let w = b.wc();
            (w.wr_id, w.status)
        })
        .collect();
    let want: Vec<(u64, WcStatus)> = (0..n).map(|i| (500 + i, WcStatus::Success)).collect();
    assert_eq!(got, want);
}

/// An eventfd of the test's own (blocking, as a client may make it).
fn eventfd() -> OwnedFd {
    // SAFETY: no pointers; the descriptor returned is ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just made, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Whether `fd` becomes readable within `ms` milliseconds.
fn readable(fd: &OwnedFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the call's duration.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// A client that gave a completion eventfd hears of an armed ring CQ
/// there (the notified word moved to its arm), not on the socket; the
/// daemon refuses a descriptor that is no eventfd, a second one, and
/// one after a CQ ring was made.
#[test]
fn an_armed_ring_cq_is_answered_on_the_completion_eventfd() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let mut r = Raw::connect(&d);
    let mut ends = [0; 2];
    // SAFETY: a valid out-array of two descriptors.
    assert_eq!(
        unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) },
        0
    );
    // SAFETY: just made, owned by nobody else.
    let (rd, _wr) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    match r.call(&Request::CompletionNotice {}, Some(rd.as_fd())) {
        Err(VerbsError::InvalidArgument(m)) => assert!(m.contains("not an eventfd"), "{m}"),
        other => panic!("a pipe taken for an eventfd: {other:?}"),
    }
    let notice = eventfd();
    assert_eq!(
        r.call(&Request::CompletionNotice {}, Some(notice.as_fd())),
        Ok(Reply::Unit {})
    );
    // SAFETY: a plain fcntl on a descriptor we own.
    let fl = unsafe { libc::fcntl(notice.as_raw_fd(), libc::F_GETFL) };
    assert_ne!(fl & libc::O_NONBLOCK, 0, "the daemon made it non-blocking");
    let again = eventfd();
    assert!(matches!(
        r.call(&Request::CompletionNotice {}, Some(again.as_fd())),
        Err(VerbsError::InvalidArgument(_))
    ));
    let s = setup(&mut r, g);
    let (q, _, _) = qp(&mut r, &s, 30);
    assert!(!readable(&notice, 0), "nothing to hear of yet");
    s.cq_ring.bump_arm();
    flush_a_receive(&mut r, q);
    assert!(readable(&notice, 20_000), "the eventfd was written");
    assert_eq!(s.cq_ring.notified(), 1, "the arm answered");
    assert_eq!(
        s.cq_ring.producer(),
        1,
        "the flushed receive is in the ring"
    );
    // The daemon sent no event for it: any would come before this answer.
    assert!(matches!(
        r.call(&Request::ListCas {}, None),
        Ok(Reply::Guids { .. })
    ));
    assert!(
        !r.events
            .iter()
            .any(|e| matches!(e, Event::Completion { .. })),
        "{:?}",
        r.events
    );
    let late = eventfd();
    match r.call(&Request::CompletionNotice {}, Some(late.as_fd())) {
        Err(VerbsError::InvalidArgument(m)) => assert!(m.contains("after a CQ ring"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// The client provider's CQ handlers run from its completion eventfd:
/// an armed CQ's handler hears of a SEND's completion, counted as a
/// notice.
#[test]
fn the_client_runs_cq_handlers_from_its_completion_eventfd() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let RcPair {
        cb, a, b, qa, qb, ..
    } = rc_pair(&d, 64, 7);
    let before = cb.0.counters();
    b.p.req_notify_cq(b.cq, false).unwrap();
    exchange(&a, qa, &b, qb, 1);
    assert!(
        b.rec
            .wait_for(|e| *e == verbs::conformance::Ev::Completion(100)),
        "the handler heard: {:?}",
        b.rec.events()
    );
    let after = cb.0.counters();
    assert!(after.notices > before.notices, "{before:?} -> {after:?}");
}

/// `drive_cq` waits on the CQ's ring in the consumer's thread: it comes
/// back with a completion that arrives meanwhile (and with none after
/// its timeout, having waited); a client on the socket alone has no
/// such wait (`false` at once).
#[test]
fn drive_cq_waits_on_the_ring() {
    let d = Daemon::start(&[fresh_ip(THIRD)]);
    let g = d.guids[0];
    let RcPair { a, b, qa, qb, .. } = rc_pair(&d, 64, 7);
    let t = std::time::Instant::now();
    assert_eq!(
        b.p.drive_cq(b.cq, Duration::from_micros(20), Duration::from_millis(50)),
        Ok(true)
    );
    assert!(t.elapsed() >= Duration::from_millis(50), "it waited");
    b.post_one_recv(qb, 9, 0, 64);
    let sender = std::thread::spawn(move || {
        a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 64)])])
            .unwrap();
        a
    });
    let t = std::time::Instant::now();
    let mut got = None;
    while got.is_none() && t.elapsed() < Duration::from_secs(20) {
        assert_eq!(
            b.p.drive_cq(b.cq, Duration::ZERO, Duration::from_secs(5)),
            Ok(true)
        );
        let mut out = [verbs::WorkCompletion::new(
            0,
            WcStatus::GeneralErr,
            rdma_types::WcOpcode::Send,
            0,
        )];
        if b.p.poll_cq(b.cq, &mut out).unwrap() == 1 {
            got = Some(out[0]);
        }
    }
    let wc = got.expect("the receive's completion");
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    let a = sender.join().unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);

    let plain = nicd::NicdProvider::connect_with(&d.path, false).unwrap();
    let c = One(plain.clone(), g);
    let n = Node::open(&c, g, 64);
    let t = std::time::Instant::now();
    assert_eq!(
        n.p.drive_cq(n.cq, Duration::ZERO, Duration::from_secs(5)),
        Ok(false)
    );
    assert!(t.elapsed() < Duration::from_secs(1), "no wait");
}
