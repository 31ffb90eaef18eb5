//! A target port's contracts that need no initiator: what its disconnect
//! hook may do, and what a failed start or login leaves behind. Logins are
//! handed to the port directly, as a CM would, over the in-process loopback
//! provider; the port runs on the test's clock (`PortDrive::Caller`).

use rdma_types::{Gid, Guid, Lid, Mtu, Psn, Qpn};
use srp::target::{LoginForm, TargetConfig};
use srp::wire::{BufFormats, LoginReq, LoginReqFlags, PortId, Tag};
use srp_target::{CloseReason, ConnId, LoginOutcome, PeerQp, PortDrive, PortOptions, TargetPort};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const TARGET_GUID: u64 = 0x7a;

fn target_port_id() -> PortId {
    PortId(*b"\x00\x00\x00\x00\x00\x00\x00\x7a\x00\x02\xc9\x03\x00\x00\x00\x7a")
}

/// A small target: few buffers, so a port starts fast.
fn config() -> TargetConfig {
    let mut cfg = TargetConfig::new(target_port_id(), "t");
    cfg.srq_size = 16;
    cfg.sq_size = 4;
    cfg.max_rdma_size = 4096;
    cfg.max_table_len = 4096;
    cfg
}

/// Driven by the test, no keepalives, logins pending for `login_timeout`.
fn options(login_timeout: Duration) -> PortOptions {
    PortOptions {
        workers: 1,
        chunks: 2,
        login_timeout,
        keepalive: None,
        drive: PortDrive::Caller,
        ..PortOptions::default()
    }
}

fn fabric() -> Arc<rnic::loopback::Fabric> {
    let f = rnic::loopback::Fabric::new();
    f.add_ca(rnic::loopback::CaConfig::simple(TARGET_GUID, 1))
        .expect("a fresh fabric takes the CA");
    f
}

/// Initiator `n`'s SRP_LOGIN_REQ (IB CM form) and its QP.
fn login_from(n: u8) -> (Vec<u8>, PeerQp) {
    let mut initiator = [0u8; 16];
    initiator[15] = n;
    let req = LoginReq {
        tag: Tag(u64::from(n)),
        req_it_iu_len: 4148,
        req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
        flags: LoginReqFlags(0),
        imm_data_offset: 0,
        initiator_port_id: PortId(initiator),
        target_port_id: target_port_id(),
    };
    let mut b = vec![0u8; req.buffer_len()];
    req.emit(&mut b).expect("sized by buffer_len");
    let peer = PeerQp {
        qpn: Qpn::from_bits(0x100 + u32::from(n)),
        psn: Psn::new(0),
        gid: Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0x100 + u64::from(n))),
        lid: Lid(0),
        mtu: Mtu::Mtu1024,
        initiator_depth: 4,
        ack_timeout: 14,
    };
    (b, peer)
}

fn accepted(outcome: LoginOutcome) -> ConnId {
    match outcome {
        LoginOutcome::Accepted { conn, .. } => conn,
        LoginOutcome::Rejected { reason, .. } => panic!("login rejected: {reason}"),
    }
}

/// Runs `f` on a thread of its own and waits for it at most 10 s: a
/// deadlock fails the test instead of hanging it.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not return within 10 s: deadlock"))
}

/// The disconnect hook runs with no lock of the port held, its own slot
/// included: it may drive the port so that the port closes another
/// channel (whose hook then runs nested), and it may set the hook. Before,
/// the hook ran holding its slot's lock, and both deadlocked.
#[test]
fn the_disconnect_hook_may_close_another_channel_and_set_the_hook() {
    let timeout = Duration::from_secs(1);
    let port = Arc::new(
        TargetPort::start(
            fabric(),
            Guid(TARGET_GUID),
            config(),
            Arc::new(scsi::Target::new()),
            options(timeout),
        )
        .expect("the port starts"),
    );
    // Two logins never established: A times out at t0 + 1 s, B at
    // t0 + 1.6 s.
    let t0 = Instant::now();
    port.poll_at(t0);
    let (data, peer) = login_from(1);
    let a = accepted(port.login(&data, LoginForm::IbCm, peer));
    port.poll_at(t0 + Duration::from_millis(600));
    let (data, peer) = login_from(2);
    let b = accepted(port.login(&data, LoginForm::IbCm, peer));

    let calls: Arc<Mutex<Vec<(ConnId, String)>>> = Arc::default();
    let weak = Arc::downgrade(&port);
    let log = calls.clone();
    port.on_disconnect(move |conn, why: &CloseReason| {
        log.lock().unwrap().push((conn, why.to_string()));
        let Some(port) = weak.upgrade() else { return };
        if conn == a {
            // From A's hook, time passes until B's login times out too: the
            // port closes B on this thread and runs the hook for it here.
            port.poll_at(t0 + Duration::from_millis(1700));
        } else {
            // From B's hook, the hook is replaced.
            let log = log.clone();
            port.on_disconnect(move |conn, _| log.lock().unwrap().push((conn, "later".into())));
        }
    });
    let p = port.clone();
    bounded("poll_at running the disconnect hooks", move || {
        p.poll_at(t0 + Duration::from_millis(1100))
    });
    let calls = calls.lock().unwrap().clone();
    let order: Vec<ConnId> = calls.iter().map(|c| c.0).collect();
    assert_eq!(
        order,
        [a, b],
        "A's hook, then B's from inside it: {calls:?}"
    );
    assert!(
        calls.iter().all(|c| c.1.contains("login_timeout")),
        "{calls:?}"
    );
    assert!(port.sessions().is_empty(), "{:?}", port.sessions());
    // The hook holds the port only weakly: nothing to let go of first.
    port.stop();
}
