//! `ibsm run --nicd` (issue 27): the subnet manager on a port of the NIC
//! daemon (`nicd --fabric ib`). The daemon's SMA of that port lends the
//! SM its QP0; the SM sweeps the daemon's other port, whose SMA answers,
//! and that port comes ACTIVE with a LID and the SM's LID, as a client
//! of the daemon reads them.
//!
//! Addresses: 127.127.33.1 and .2 only.

mod common;

use common::{bin_of, sock_of, tool, Proc};
use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use verbs::Provider;

#[test]
fn ibsm_runs_through_the_nic_daemon() {
    let (a, b): (IpAddr, IpAddr) = (
        "127.127.33.1".parse().unwrap(),
        "127.127.33.2".parse().unwrap(),
    );
    let sock = sock_of("nicd_ibsm", "nicd");
    let _ = std::fs::remove_file(&sock);
    let daemon = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args([
                "--fabric",
                "ib",
                "--ip",
                &a.to_string(),
                "--ip",
                &b.to_string(),
            ])
            .arg("--socket")
            .arg(&sock)
            .env("SOFTROCE_FOLLOW_LINK", "0"),
    );
    daemon.wait_line("nicd: serving 127.127.33.1, 127.127.33.2", 30);

    let out = tool(bin_of("ibsm"))
        .args([
            "run",
            "--addr",
            &a.to_string(),
            "--node",
            &b.to_string(),
            "--once",
        ])
        .arg("--nicd")
        .arg(&sock)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("ibsm: SM and SA at 127.127.33.1 (LID 1)"),
        "{text}"
    );

    let p = nicd::NicdProvider::connect(&sock).unwrap();
    let gb = rnic::softroce::ip_guid(b);
    let cb = p.open_ca(gb, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    let port = p.query_port(cb, rdma_types::PortNum(1)).unwrap();
    assert_eq!(port.state, verbs::PortState::Active, "{port:?}\n{text}");
    assert_ne!(port.lid, rdma_types::Lid(0), "{port:?}");
    assert_eq!(port.sm_lid, rdma_types::Lid(1), "{port:?}");
    drop(daemon);
}

/// An address added to a running `nicd --fabric ib` (a tool's
/// `connect_at`) gets its port's SMA, so the SM brings it up; and the
/// daemon leaves on `--idle-exit` once its last client went, its own SMAs
/// not counting as clients. Addresses: 127.127.33.5 and .6 only.
#[test]
fn an_added_ib_port_comes_up_and_the_daemon_still_idles_out() {
    let (a, b): (IpAddr, IpAddr) = (
        "127.127.33.5".parse().unwrap(),
        "127.127.33.6".parse().unwrap(),
    );
    let sock = sock_of("nicd_ibsm_add", "nicd");
    let _ = std::fs::remove_file(&sock);
    let mut daemon = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--fabric", "ib", "--ip", &a.to_string()])
            .args(["--idle-exit", "1s", "--socket"])
            .arg(&sock)
            .env("SOFTROCE_FOLLOW_LINK", "0"),
    );
    daemon.wait_line("nicd: serving 127.127.33.5", 30);
    let mut sm = Proc::start(
        "ibsm",
        tool(bin_of("ibsm"))
            .args(["run", "--addr", &a.to_string(), "--node", &b.to_string()])
            .args([
                "--sweep-interval-ms",
                "200",
                "--timeout-ms",
                "100",
                "--nicd",
            ])
            .arg(&sock),
    );
    sm.wait_line("ibsm: SM and SA at 127.127.33.5", 30);

    // b is not served yet: connecting there adds it.
    let (p, gb) = nicd::connect_at(&sock, b, None).unwrap();
    let cb = p.open_ca(gb, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let port = loop {
        let port = p.query_port(cb, rdma_types::PortNum(1)).unwrap();
        if port.state == verbs::PortState::Active || std::time::Instant::now() > end {
            break port;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(port.state, verbs::PortState::Active, "{port:?}");
    assert_ne!(port.lid, rdma_types::Lid(0), "{port:?}");
    assert_eq!(port.sm_gid, Some(rdma_types::Gid::from_ip(a)), "{port:?}");
    p.close_ca(cb).unwrap();
    drop(p);
    sm.term();

    // No client left but the daemon's own SMAs: it leaves.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = daemon.child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > end {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "nicd --fabric ib did not leave when idle: {status:?}"
    );
    assert!(!sock.exists());
}
