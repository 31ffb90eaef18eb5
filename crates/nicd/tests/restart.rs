//! The daemon killed and started again (issue 27): a client's open CA
//! hears its removal at once, not at its next verb; its verbs fail
//! rather than hang; and the same provider finds the NIC again when a
//! daemon is back on the socket, while handles of the first daemon stay
//! refused.
//!
//! Addresses: 127.127.27.2 only.

use rdma_types::PortNum;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use verbs::conformance::{Ev, Recorder};
use verbs::{AsyncEventKind, CqInit, Provider, VerbsError};

const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 127, 27, 2));

/// A daemon process, killed when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nicd --ip IP --socket SOCKET`, once it says it serves.
fn start(socket: &Path) -> Daemon {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nicd"))
        .args(["--ip", &IP.to_string(), "--socket"])
        .arg(socket)
        .env("SOFTROCE_FOLLOW_LINK", "0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("nicd: serving 127.127.27.2"), "{line}");
    Daemon(c)
}

#[test]
fn a_client_hears_the_daemon_die_and_finds_it_back() {
    let socket = std::env::temp_dir().join(format!("nicd-restart-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let mut first = start(&socket);
    let p = nicd::NicdProvider::connect(&socket).unwrap();
    let guid = rnic::softroce::ip_guid(IP);
    let rec = Arc::new(Recorder::default());
    let ca = p.open_ca(guid, 7, rec.clone()).unwrap();
    let pd = p.alloc_pd(ca, 0).unwrap();
    let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 1).unwrap();
    let first_pid = p.daemon_pid();

    // kill -9: no goodbye from the daemon, its socket file left behind.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(rec.wait_for(|e| matches!(
        e,
        Ev::Async(a) if a.kind == AsyncEventKind::CaRemoval && a.ctx == 7
    )));
    assert!(!p.connected());
    // Verbs on its objects fail at once; waiting on its CQ returns.
    assert_eq!(p.query_ca(ca), Err(VerbsError::NoSuchCa));
    assert!(p.wait_cq(cq, Duration::from_secs(5)).is_err());
    assert_eq!(p.alloc_pd(ca, 0), Err(VerbsError::NoSuchCa));
    // Nothing to find while no daemon is back.
    assert!(p.list_cas().is_empty());
    assert!(p.reconnect().is_err());

    // A daemon again on the socket (it replaces the stale file): the
    // same provider lists and opens the NIC, through a new session.
    let _second = start(&socket);
    assert_eq!(p.list_cas(), vec![guid]);
    assert!(p.connected());
    assert_eq!(p.reconnects(), 1);
    assert_ne!(p.daemon_pid(), first_pid);
    let rec2 = Arc::new(Recorder::default());
    let ca2 = p.open_ca(guid, 8, rec2).unwrap();
    let pd2 = p.alloc_pd(ca2, 0).unwrap();
    let cq2 = p.create_cq(pd2, &CqInit { cqe: 16 }, 2).unwrap();
    assert_eq!(
        p.query_port(ca2, PortNum(1)).unwrap().gids[0],
        rdma_types::Gid::from_ip(IP)
    );
    // The first daemon's handles are nothing to the second.
    assert_eq!(p.query_ca(ca), Err(VerbsError::InvalidHandle));
    assert_eq!(p.destroy_cq(cq), Err(VerbsError::InvalidHandle));
    p.destroy_cq(cq2).unwrap();
    p.dealloc_pd(pd2).unwrap();
    p.close_ca(ca2).unwrap();
    // A session that is up is not replaced.
    assert!(!p.reconnect().unwrap());
    let _ = std::fs::remove_file(&socket);
}
