//! A client process killed in the middle (`kill -9`): the daemon
//! releases everything it held, and its peer's QP sees the connection
//! end (an error completion), never a hang.
//!
//! The client is this test binary run again with `NICD_TEST_CHILD` set:
//! it connects, registers memory, connects an RC QP to ours, posts a
//! receive, prints what we need and waits to be killed.

mod common;

use common::{fresh_ip, rc_to, Daemon, One};
use rdma_types::{Gid, Guid, QpState, QpType, Qpn, Rkey, WcStatus};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;
use verbs::conformance::Node;
use verbs::{AhAttr, RecvWr, RemoteAddr, SendOpcode, SendWr};

const CHILD_ENV: &str = "NICD_TEST_CHILD";

/// The child's side: `socket guid peer_qpn peer_gid mode` (`direct`: its
/// QPs in its own process, on a block of the daemon's shared port).
fn child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let p = nicd::NicdProvider::connect(std::path::Path::new(f[0])).unwrap();
    let guid = Guid(f[1].parse().unwrap());
    let peer_qpn = Qpn::from_bits(f[2].parse().unwrap());
    let peer_gid = Gid::parse_hex(f[3]).unwrap();
    let direct = One(nicd::Direct::new(p.clone()), guid);
    let c = One(p, guid);
    let n = match f[4] {
        "direct" => Node::open(&direct, guid, 64),
        _ => Node::open(&c, guid, 64),
    };
    let q = n.qp(QpType::Rc, None, 1);
    rc_to(&n, q, AhAttr::roce(peer_gid), peer_qpn);
    n.p.post_recv(
        q,
        &[RecvWr {
            wr_id: 1,
            sges: verbs::sges![n.sge(0, 4096)],
        }],
    )
    .unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "CHILD {} {} {}",
        n.p.qp_num(q).unwrap().value(),
        n.mr.rkey.0,
        n.buf.addr()
    )
    .unwrap();
    out.flush().unwrap();
    drop(out);
    // Serve our peer's RDMA until killed.
    loop {
        std::thread::park();
    }
}

/// Kills child `.0` should the test fail before it does: a child left
/// running holds the test's output pipe open.
struct ReapOnPanic(i32);

impl Drop for ReapOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: a signal to our own child, not waited for yet (a
            // panic skips the test's wait), so its PID is not reused.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

fn gid_hex(g: Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_killed_client_is_released_and_its_peer_sees_the_end() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    killed(
        "rings",
        "a_killed_client_is_released_and_its_peer_sees_the_end",
    );
}

/// The same with the child's QPs in its own process: the daemon releases
/// its halves and takes its block back; the peer's QP learns as before.
#[test]
fn a_killed_client_with_its_own_qps_is_released_the_same() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    killed(
        "direct",
        "a_killed_client_with_its_own_qps_is_released_the_same",
    );
}

fn killed(mode: &str, name: &str) {
    let d = Daemon::start_shared(&[fresh_ip(200)], nicd::Limits::default(), false);
    let g = d.guids[0];
    let me = One(d.client(), g);
    let a = Node::open(&me, g, 64);
    let qa = a.qp(QpType::Rc, None, 1);
    let mine = d.server.clients()[0].total();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!(
                "{} {} {} {} {mode}",
                d.path.display(),
                g.0,
                a.p.qp_num(qa).unwrap().value(),
                gid_hex(a.port.gids[0])
            ),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let _reap = ReapOnPanic(pid);
    // Should the child hang before it reports, it is killed, so the
    // read below ends (and the test fails) instead of waiting forever.
    let (reported, watch) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to our own child, whose PID is not reused
            // before we wait for it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut line = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    // libtest prints "test NAME ... " before the test's own output.
    let at = loop {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Some(at) = line.find("CHILD ") {
            break at;
        }
    };
    let _ = reported.send(());
    let f: Vec<u64> = line[at + 6..]
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let (qpn, rkey, addr) = (Qpn::from_bits(f[0] as u32), Rkey(f[1] as u32), f[2]);
    rc_to(&a, qa, a.av(), qpn);

    // The child holds its tree: CA, PD, CQ, MR, QP (with its QPs in its
    // process, the daemon has the halves of the first four, counts the
    // QP, and lends the child a block of the port).
    let held = d.server.clients();
    let theirs = held
        .iter()
        .find(|c| c.peer.pid == pid)
        .expect("child known");
    let admin = d.client();
    let lent = admin.lent_ports().unwrap();
    assert_eq!(theirs.total(), 5, "{theirs:?}");
    if mode == "direct" {
        assert_eq!(roce_udp::qpn_block(qpn.value()), 1);
        assert!(lent
            .iter()
            .any(|l| l.client == theirs.peer.id && l.block == 1));
    } else {
        assert!(lent.is_empty(), "{lent:?}");
    }
    drop(admin);

    // Traffic works both ways: a SEND to its receive, a WRITE to its memory.
    a.buf.write_at(0, b"hello child");
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 11)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let mut w = SendWr::new(2, SendOpcode::RdmaWrite, vec![a.sge(0, 11)]);
    w.remote = RemoteAddr { addr, rkey };
    a.p.post_send(qa, &[w]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);

    // kill -9, in the middle of the connection.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        d.server.wait_until(Duration::from_secs(10), |c, live| {
            c.iter().all(|c| c.peer.pid != pid) && live == mine
        }),
        "the child's objects were not released: {:?}",
        d.server.clients()
    );
    assert!(d
        .server
        .wait_until(Duration::from_secs(10), |c, _| c.len() == 1));
    assert_eq!(d.server.release_failures(), 0, "the provider refused none");
    assert_eq!(d.client().lent_ports().unwrap(), vec![], "block given back");

    // Our QP learns at its next request: retries exhausted, the QP in
    // error (connected without the CM, so no DREQ: tests/cm.rs has the
    // DREQ the daemon sends for a killed client's CM connections).
    let mut w = SendWr::new(3, SendOpcode::RdmaWrite, vec![a.sge(0, 11)]);
    w.remote = RemoteAddr { addr, rkey };
    a.p.post_send(qa, &[w]).unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RetryExcErr));
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
}
