//! Credentials decide what a client may do: a process of another user
//! (nobody) is served, but its port changes are refused in words where
//! root's reach the provider; it gets a place at the daemon's QP1 but
//! not QP0, and may not serve a class only privileged clients serve
//! (subnet administration) or add a NIC. Needs root (to run the client as nobody).
//!
//! The client is this test binary run again as nobody with
//! `NICD_TEST_UNPRIVILEGED` naming the socket and the CA.

mod common;

use common::{fresh_ip, Daemon, One};
use rdma_types::{Guid, Lid, PortNum, QpType};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;
use verbs::conformance::Node;
use verbs::{PortModify, QpCaps, QpInit, VerbsError};

const CHILD_ENV: &str = "NICD_TEST_UNPRIVILEGED";

fn gsi(n: &Node) -> QpInit {
    QpInit {
        qp_type: QpType::Gsi,
        send_cq: n.cq,
        recv_cq: n.cq,
        srq: None,
        caps: QpCaps::default(),
        sq_sig_all: true,
        port: Some(PortNum(1)),
    }
}

fn child(spec: &str) {
    let mut words = spec.split(' ');
    let (path, guid, mode) = (
        words.next().unwrap(),
        words.next().unwrap(),
        words.next().unwrap(),
    );
    let p = nicd::NicdProvider::connect(std::path::Path::new(path)).unwrap();
    let g = Guid(guid.parse().unwrap());
    let c = One(p.clone(), g);
    // Served: a CA, memory, a QP (with its QPs in this process, a member
    // of the daemon's shared port, which a root daemon lends nobody too).
    let direct = (mode == "direct").then(|| One(nicd::Direct::new(p), g));
    let n = match &direct {
        Some(d) => Node::open(d, g, 16),
        None => Node::open(&c, g, 16),
    };
    let q = n.qp(QpType::Rc, None, 1);
    if let Some(d) = &direct {
        assert!(d.0.nic().is_some(), "no node in this process");
        assert_ne!(roce_udp::qpn_block(n.p.qp_num(q).unwrap().value()), 0);
    }
    let e =
        n.p.modify_port(n.ca, PortNum(1), &PortModify::new().lid(Lid(7)))
            .unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("need root")),
        "{e:?}"
    );
    // A place at the daemon's QP1 (its CM needs one), not QP0, and no
    // serving of a class only privileged clients serve.
    let q1 = n.p.create_qp(n.pd, &gsi(&n), 0).unwrap();
    let qp0 = QpInit {
        qp_type: QpType::Smi,
        ..gsi(&n)
    };
    let e = n.p.create_qp(n.pd, &qp0, 0).unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("QP0 needs root")),
        "{e:?}"
    );
    let e = n.p.gsi_register(q1, 0x03, 2, &[0x01], true).unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("needs root")),
        "{e:?}"
    );
    n.p.gsi_register(q1, 0x06, 1, &[0x01], true).unwrap();
    // Nor may it have the daemon take another address.
    let e = c.0.add_nic([127, 27, 240, 250].into()).unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("adding a NIC needs root")),
        "{e:?}"
    );
    let e = c.0.daemon_clients().unwrap_err();
    assert!(
        matches!(&e, VerbsError::InvalidArgument(m) if m.contains("needs root")),
        "{e:?}"
    );
    println!("UNPRIVILEGED refused as expected");
}

#[test]
fn an_unprivileged_client_is_served_but_cannot_change_ports() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    if !rdma_testkit::need::root() {
        return;
    }
    unprivileged("rings");
}

/// The same refusals to a client whose QPs run in its own process.
#[test]
fn an_unprivileged_client_with_its_own_qps_is_refused_the_same() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    if !rdma_testkit::need::root() {
        return;
    }
    unprivileged("direct");
}

fn unprivileged(mode: &str) {
    let d = Daemon::start_shared(&[fresh_ip(240)], nicd::Limits::default(), true);
    let g = d.guids[0];
    // Root's port change passes the daemon's check and reaches the
    // provider (whatever that says of a LID on a RoCE port).
    let root = One(d.client(), g);
    let n = Node::open(&root, g, 16);
    let r =
        n.p.modify_port(n.ca, PortNum(1), &PortModify::new().lid(Lid(7)));
    assert!(
        !matches!(&r, Err(VerbsError::InvalidArgument(m)) if m.contains("need root")),
        "{r:?}"
    );

    let mut cmd = Command::new(std::env::current_exe().unwrap());
    let name = match mode {
        "direct" => "an_unprivileged_client_with_its_own_qps_is_refused_the_same",
        _ => "an_unprivileged_client_is_served_but_cannot_change_ports",
    };
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{} {} {mode}", d.path.display(), g.0))
        .uid(65534)
        .gid(65534);
    let child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let (done, watch) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to our own child, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("UNPRIVILEGED refused as expected"),
        "{}\n{text}",
        out.status
    );
    assert_eq!(d.server.release_failures(), 0);
}
