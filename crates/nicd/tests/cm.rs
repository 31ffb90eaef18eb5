//! The CM through the daemon's shared QP1: the access layer's
//! `CmAgent` runs unchanged in each client over its `NicdProvider`.
//! Two clients of one daemon (one address) and a peer with a NIC of its
//! own connect to each other; their CM IDs collide and do not matter;
//! a service one client listens on is refused to another; a client
//! killed with established connections has them ended by the daemon
//! (its peers get a DREQ, never a hang).
//!
//! Addresses: 127.91.1.x (no other test uses 127.91.0.0/16).

mod common;

use common::Daemon;
use rdma_access::CmAgent;
use rdma_types::{Gid, Guid, Psn, Qpn};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;
use verbs::Provider;

const CHILD_ENV: &str = "NICD_CM_CHILD";
const SID: u64 = 0x0000_0000_0106_4242;
const WAIT: Duration = Duration::from_secs(20);

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 91, 1, last))
}

/// A peer with a NIC of its own (no daemon) at 127.91.1.`last`.
fn outsider(last: u8) -> Arc<CmAgent> {
    let guid = Guid(0x9100 + u64::from(last));
    let soft = SoftRoce::new(vec![SoftCa { guid, ip: ip(last) }], ROCE_PORT);
    CmAgent::start(soft, guid, 100).unwrap()
}

/// Accepts every REQ on `rx` on a thread, offering QPN `qpn`.
fn accept_all(rx: std::sync::mpsc::Receiver<rdma_access::Incoming>, qpn: u32) {
    std::thread::spawn(move || {
        for inc in rx {
            assert!(inc.accept(Qpn::from_bits(qpn), Psn::new(1), Vec::new()));
        }
    });
}

#[test]
fn clients_of_one_daemon_and_an_outsider_connect_through_its_qp1() {
    let d = Daemon::start(&[ip(1)]);
    let g = d.guids[0];
    // Both start their CM IDs at 100: without the daemon's own IDs the
    // outsider could not tell their connections apart.
    let a = CmAgent::start(d.client() as Arc<dyn Provider>, g, 100).unwrap();
    let b = CmAgent::start(d.client() as Arc<dyn Provider>, g, 100).unwrap();
    let x = outsider(2);
    let here: Gid = a.gid();
    assert_eq!(here, b.gid(), "one port, one GID");

    accept_all(a.try_listen(SID).unwrap(), 0x11);
    let taken = b.try_listen(SID).expect_err("A listens on it");
    assert!(
        format!("{taken}").contains("another nicd client"),
        "{taken}"
    );
    accept_all(x.try_listen(SID + 1).unwrap(), 0x33);
    accept_all(b.try_listen(SID + 2).unwrap(), 0x22);

    // B to A through the daemon and back, the outsider to A and to B,
    // A to the outsider.
    let connect = |who: &CmAgent, to: Gid, sid: u64| {
        who.connect(to, sid, Qpn::from_bits(0x99), Psn::new(7), Vec::new(), WAIT)
            .unwrap_or_else(|e| panic!("connect to {sid:#x}: {e}"))
    };
    let ba = connect(&b, here, SID);
    assert_eq!(ba.remote_qpn, Qpn::from_bits(0x11));
    let xa = connect(&x, here, SID);
    assert_eq!(xa.remote_qpn, Qpn::from_bits(0x11));
    let xb = connect(&x, here, SID + 2);
    assert_eq!(xb.remote_qpn, Qpn::from_bits(0x22));
    let ax = connect(&a, x.gid(), SID + 1);
    assert_eq!(ax.remote_qpn, Qpn::from_bits(0x33));
    // Nobody listens: the daemon answers for the port (REJ 8).
    let none = x
        .connect(
            here,
            SID + 9,
            Qpn::from_bits(1),
            Psn::new(1),
            Vec::new(),
            WAIT,
        )
        .expect_err("nobody listens");
    assert!(
        matches!(none, rdma_access::CmError::Rejected { code: 8, .. }),
        "{none}"
    );

    // A disconnect from the outsider reaches B's agent, not A's.
    let (ended_b, b_heard) = channel();
    b.on_disconnect(move |c| {
        let _ = ended_b.send(c);
    });
    assert!(x.disconnect_wait(xb.conn, WAIT), "B answered the DREQ");
    let c = b_heard.recv_timeout(WAIT).expect("B heard the DREQ");
    assert_ne!(b.state(c), rdma_cm::ConnState::Established);
    let stats = d.server.gsi_stats(g).expect("QP1 open");
    assert!(stats.delivered >= 8, "{stats:?}");
    assert_eq!(d.server.gsi_refusals(), 1, "B's listen");
}

/// The child: a client with a CM agent listening on `SID` of the
/// daemon at `socket`, accepting everything; killed by the test.
fn child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let p = nicd::NicdProvider::connect(std::path::Path::new(f[0])).unwrap();
    let a = CmAgent::start(p, Guid(f[1].parse().unwrap()), 100).unwrap();
    let rx = a.try_listen(SID).unwrap();
    println!("LISTENING");
    for inc in rx {
        assert!(inc.accept(Qpn::from_bits(0x44), Psn::new(1), Vec::new()));
    }
}

#[test]
fn a_killed_clients_connections_end_with_a_dreq_from_the_daemon() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    let d = Daemon::start(&[ip(11)]);
    let g = d.guids[0];
    let b = CmAgent::start(d.client() as Arc<dyn Provider>, g, 100).unwrap();
    let x = outsider(12);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_clients_connections_end_with_a_dreq_from_the_daemon",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} {}", d.path.display(), g.0))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // A child that hangs before it reports is killed, so the read below
    // ends (and the test fails) instead of waiting forever.
    let (reported, watch) = channel::<()>();
    std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to our own child, whose PID is not reused
            // before we wait for it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("LISTENING") {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "the child ended");
    }
    let _ = reported.send(());

    // Another client of the daemon and an outsider connect to it.
    let here = b.gid();
    let conns: Vec<_> = [&b, &x]
        .iter()
        .map(|who| {
            who.connect(
                here,
                SID,
                Qpn::from_bits(0x99),
                Psn::new(7),
                Vec::new(),
                WAIT,
            )
            .unwrap()
        })
        .collect();
    assert!(conns.iter().all(|c| c.remote_qpn == Qpn::from_bits(0x44)));
    let (tx, heard) = channel();
    for who in [&b, &x] {
        let tx = tx.clone();
        let name = if Arc::ptr_eq(who, &b) { "B" } else { "X" };
        who.on_disconnect(move |c| {
            let _ = tx.send((name, c));
        });
    }

    child.kill().unwrap();
    child.wait().unwrap();
    let mut ended: Vec<_> = (0..2)
        .map(|_| {
            heard
                .recv_timeout(WAIT)
                .expect("a DREQ for the killed client")
        })
        .collect();
    ended.sort();
    assert_eq!(ended, vec![("B", conns[0].conn), ("X", conns[1].conn)]);
    assert!(
        d.server
            .wait_until(WAIT, |c, _| c.iter().all(|c| c.peer.pid != pid)),
        "the child's objects were not released"
    );
    let stats = d.server.gsi_stats(g).unwrap();
    assert!(stats.ended_for_dead >= 2, "{stats:?}");
    // The port serves on: a new listener, a new connection.
    let b2 = b.try_listen(SID).expect("the dead client's listen is gone");
    accept_all(b2, 0x55);
    let again = x
        .connect(
            here,
            SID,
            Qpn::from_bits(0x98),
            Psn::new(3),
            Vec::new(),
            WAIT,
        )
        .unwrap();
    assert_eq!(again.remote_qpn, Qpn::from_bits(0x55));
}
