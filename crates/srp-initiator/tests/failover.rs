//! Path failure, in process (loopback provider, the real target port):
//! how soon a dead path is found, and what happens to its I/O then.
//!
//! A link that dies after the target acknowledged every command of ours
//! leaves the transport nothing to retry: only the session's liveness
//! probe (a zero-length RDMA WRITE when commands wait on a quiet target)
//! finds it before the command timeout (the netns test saw 4 of 14
//! far-end cuts fail over at 2.6 s with a 2 s timeout).
//!
//! Two initiator ports reach one LU through one target port; each is a
//! reconnecting remote port (`fast_io_fail_tmo` 0) and a failover
//! multipath device sits over both. Path A's port goes down while writers
//! run. The disconnect of A's dead session (a DREQ over a dead link, which
//! waits for the CM's retries: seconds) is held by the test until every
//! writer has gone on over path B, so an I/O that waits for that teardown
//! cannot go unnoticed: before the teardown of failed sessions left the
//! caller's thread, the writer dropping the last reference to A's session
//! sat in it (the netns test saw one I/O of 16 take 2.55 s instead of
//! 0.55 s).

mod common;

use common::{connect, fabric, remote_path, target_port, wait_for, Direct, Gate, Held, Hold};
use rdma_types::{Duration, Guid, PortNum};
use srp::initiator::ChannelConfig;
use srp_initiator::disk::Disk;
use srp_initiator::multipath::{Multipath, PathDevice, Policy};
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::{RportConfig, RportState};
use srp_initiator::session::{Session, SessionConfig};
use srp_target::{PortOptions, TargetPort};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const TARGET_GUID: u64 = 0x0002_c903_0000_3111;
const INIT_A: u64 = 0x0002_c903_0000_3222;
const INIT_B: u64 = 0x0002_c903_0000_3333;

/// A target port on `provider` with one LU over `backend`.
fn target(provider: &Arc<dyn verbs::Provider>, backend: Arc<dyn scsi::Backend>) -> Arc<TargetPort> {
    let dev = scsi::Device::new(scsi::DeviceConfig::default(), backend).unwrap();
    let id = ChannelConfig::new(0, Guid(INIT_A), TARGET_GUID, Guid(TARGET_GUID));
    target_port(
        provider,
        TARGET_GUID,
        id.target_port_id(),
        "failover",
        vec![dev],
        PortOptions::default(),
    )
}

#[test]
fn a_link_dying_after_every_command_was_acknowledged_is_found_by_the_probe() {
    let fabric = fabric(&[TARGET_GUID, INIT_A]);
    let provider: Arc<dyn verbs::Provider> = fabric.clone();
    let held = Arc::new(Gate::default());
    let port = target(
        &provider,
        Arc::new(Held::new(1 << 20, held.clone(), Hold::Writes)),
    );
    let chan = ChannelConfig::new(1, Guid(INIT_A), TARGET_GUID, Guid(TARGET_GUID));
    let mut cfg = SessionConfig::new(chan);
    cfg.pool_bytes = 1 << 20;
    // The command timeout is far beyond the test's bounded waits: only the
    // probe can end the write below in time.
    cfg.channel.cmd_timeout = Duration::from_secs(60);
    cfg.probe_interval = Some(Duration::from_millis(50));
    let sess = connect(&provider, INIT_A, &port, cfg);
    let disk = Arc::new(Disk::open(sess.clone(), 0).unwrap());

    // A write the target holds: acknowledged, unanswered.
    held.set(true);
    let d = disk.clone();
    let write = std::thread::spawn(move || d.write(0, &[7u8; 512]));
    wait_for("the write held at the target", 5, || {
        held.held.load(Ordering::SeqCst) >= 1
    });
    // A live target acknowledges the probes; the session stays up and the
    // write waits.
    wait_for("probes acknowledged", 5, || sess.stats().probes >= 3);
    assert!(!sess.is_closed());
    assert!(!write.is_finished());

    // The target's port goes down: the initiator gets no event and has
    // nothing unacknowledged, but its next probe is not answered.
    fabric
        .set_port_active(Guid(TARGET_GUID), PortNum(1), false)
        .unwrap();
    wait_for("the write ended by the dead link", 5, || {
        write.is_finished()
    });
    let e = write.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    assert!(sess.is_closed());
    held.set(false);
}

#[test]
fn io_on_a_failed_path_goes_on_over_the_other_without_waiting_for_its_teardown() {
    let fabric = fabric(&[TARGET_GUID, INIT_A, INIT_B]);
    let provider: Arc<dyn verbs::Provider> = fabric.clone();
    let port = target(&provider, Arc::new(scsi::Ram::new(4 << 20)));
    // Holds disconnects while closed, as a DREQ over a dead link is held
    // by the CM's retries.
    let gate = Arc::new(Gate::default());
    let path = |guid: u64| {
        let gate = gate.clone();
        let pass: Arc<dyn Fn() + Send + Sync> = Arc::new(move || gate.pass());
        let ids = (guid, TARGET_GUID);
        remote_path(
            provider.clone(),
            port.clone(),
            ids,
            rdma_types::Lid(1),
            Some(pass),
        )
    };
    let (a, b) = (path(INIT_A), path(INIT_B));
    let m = Arc::new(
        Multipath::new(
            vec![
                ("A".into(), a.clone() as Arc<dyn PathDevice>),
                ("B".into(), b.clone() as Arc<dyn PathDevice>),
            ],
            Policy::Failover,
            std::time::Duration::from_secs(30),
        )
        .unwrap()
        // A write in flight on A at the cut is in doubt and completes
        // only after this hold (srp_initiator::fence); short here, so the
        // bound below is about the teardown, not the hold.
        .with_in_doubt_hold(std::time::Duration::from_millis(300)),
    );

    // Writers, each on its own blocks, each write a new generation.
    const WRITERS: u64 = 8;
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (m, stop, counts) = (m.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || {
                let mut gen = 0u64;
                while !stop.load(Ordering::SeqCst) && gen < 1_000_000 {
                    gen += 1;
                    let mut block = [0u8; 512];
                    block[..8].copy_from_slice(&w.to_le_bytes());
                    block[8..16].copy_from_slice(&gen.to_le_bytes());
                    blockload::BlockDevice::write_at(m.as_ref(), w * 8 + gen % 8, &block)
                        .expect("no write error reaches the caller");
                    counts[w as usize].store(gen, Ordering::SeqCst);
                }
                gen
            })
        })
        .collect();
    let snapshot = || -> Vec<u64> { counts.iter().map(|c| c.load(Ordering::SeqCst)).collect() };
    wait_for("writes on path A", 10, || {
        snapshot().iter().all(|&n| n >= 20)
    });
    assert_eq!(
        m.path_stats()[1].ios,
        0,
        "failover policy: B idle while A is up"
    );

    // Path A's port goes down; its session's disconnect will be held.
    gate.set(true);
    fabric
        .set_port_active(Guid(INIT_A), PortNum(1), false)
        .unwrap();
    let at_cut = snapshot();
    // Every writer goes on over B while A's teardown is still held.
    wait_for("every writer going on over path B", 5, || {
        snapshot().iter().zip(&at_cut).all(|(n, c)| *n >= c + 20)
    });
    wait_for("A's dead session being torn down", 5, || {
        gate.held.load(Ordering::SeqCst) >= 1
    });
    let s = m.path_stats();
    assert!(s[1].ios >= 20 * WRITERS, "{s:?}");
    assert!(!a.is_up(), "path A is not up with its port down");
    assert!(a.stats().failures >= 1, "{:?}", a.stats());

    gate.set(false);
    stop.store(true, Ordering::SeqCst);
    let last: Vec<u64> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    // Every block holds the last generation written to it.
    for (w, &n) in last.iter().enumerate() {
        for g in n.saturating_sub(7)..=n {
            let mut block = [0u8; 512];
            blockload::BlockDevice::read_at(m.as_ref(), w as u64 * 8 + g % 8, &mut block).unwrap();
            assert_eq!(
                u64::from_le_bytes(block[8..16].try_into().unwrap()),
                g,
                "writer {w}, block {}",
                g % 8
            );
        }
    }
}

/// A connector that counts the logins it is asked for (each a CM REQ on a
/// real fabric).
struct Counting {
    inner: Direct,
    reqs: AtomicU64,
}

impl srp_initiator::session::Connector for Counting {
    fn connect(
        &self,
        login: &[u8],
        local: srp_initiator::session::QpInfo,
    ) -> Result<srp_initiator::session::Connected, srp_initiator::session::ConnectError> {
        self.reqs.fetch_add(1, Ordering::SeqCst);
        self.inner.connect(login, local)
    }
    fn disconnect(&self, handle: u64) {
        self.inner.disconnect(handle);
    }
    fn form(&self) -> srp_initiator::session::LoginForm {
        self.inner.form()
    }
}

#[test]
fn no_login_goes_into_a_down_port_and_the_port_coming_back_reconnects_at_once() {
    let fabric = fabric(&[TARGET_GUID, INIT_A]);
    let provider: Arc<dyn verbs::Provider> = fabric.clone();
    let port = target(&provider, Arc::new(scsi::Ram::new(1 << 20)));
    let conn = Arc::new(Counting {
        inner: Direct {
            port: port.clone(),
            lid: rdma_types::Lid(1),
            on_disconnect: None,
        },
        reqs: AtomicU64::new(0),
    });
    let session_cfg = || {
        let chan = ChannelConfig::new(1, Guid(INIT_A), TARGET_GUID, Guid(TARGET_GUID));
        let mut cfg = SessionConfig::new(chan);
        cfg.pool_bytes = 1 << 20;
        cfg
    };
    let attempts = Arc::new(AtomicU64::new(0));
    let last_error = Arc::new(Mutex::new(String::new()));
    let open = {
        let (provider, conn, attempts, last_error) = (
            provider.clone(),
            conn.clone(),
            attempts.clone(),
            last_error.clone(),
        );
        Box::new(move || {
            attempts.fetch_add(1, Ordering::SeqCst);
            let s = Session::connect(provider.clone(), Guid(INIT_A), conn.clone(), session_cfg())
                .map_err(|e| {
                *last_error.lock().unwrap() = e.to_string();
                std::io::Error::other(e)
            })?;
            Disk::open(Arc::new(s), 0)
        })
    };
    // reconnect_delay is far beyond the test's bounded waits: only the
    // port event can bring the path back in time.
    let rport = RportConfig {
        reconnect_delay: Some(Duration::from_secs(60)),
        fast_io_fail_tmo: Some(Duration::ZERO),
        dev_loss_tmo: Some(Duration::from_secs(120)),
    };
    let d = RemoteDisk::open(open, rport).unwrap();
    blockload::BlockDevice::write_at(&d, 0, &[1u8; 512]).unwrap();
    assert_eq!(conn.reqs.load(Ordering::SeqCst), 1);

    // The port goes down: the session fails, and the remote port's first
    // attempt (at once) finds the port DOWN and sends nothing.
    fabric
        .set_port_active(Guid(INIT_A), PortNum(1), false)
        .unwrap();
    wait_for("the first reconnect attempt", 5, || {
        attempts.load(Ordering::SeqCst) >= 2
    });
    wait_for("the attempt to end", 5, || {
        !last_error.lock().unwrap().is_empty()
    });
    let why = last_error.lock().unwrap().clone();
    assert!(why.contains("not ACTIVE"), "{why}");
    assert_eq!(d.stats().failures, 1);
    assert_ne!(d.stats().state, RportState::Running);
    // A login on the down port directly: refused before any REQ.
    let e = Session::connect(provider.clone(), Guid(INIT_A), conn.clone(), session_cfg())
        .err()
        .expect("no login on a DOWN port");
    assert!(
        matches!(
            e,
            srp_initiator::session::SessionError::PortNotActive {
                port: 1,
                state: verbs::PortState::Down
            }
        ),
        "{e}"
    );
    assert_eq!(
        conn.reqs.load(Ordering::SeqCst),
        1,
        "no REQ into a DOWN port"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);

    // The port comes back: one attempt at once, not after reconnect_delay.
    let up = std::time::Instant::now();
    fabric
        .set_port_active(Guid(INIT_A), PortNum(1), true)
        .unwrap();
    assert!(
        d.wait_running(std::time::Duration::from_secs(5)),
        "path not back within 5 s of PortActive: {:?}",
        d.stats()
    );
    println!("PortActive to running again: {:?}", up.elapsed());
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "one attempt after PortActive"
    );
    assert_eq!(conn.reqs.load(Ordering::SeqCst), 2);
    assert_eq!(d.stats().reconnects, 1);
    let mut back = [0u8; 512];
    blockload::BlockDevice::read_at(&d, 0, &mut back).unwrap();
    assert_eq!(back, [1u8; 512]);
}
