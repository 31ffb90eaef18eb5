//! The daemon started on demand (issue 27): two tools that find no
//! daemon at once end with one, both its clients; it leaves once it has
//! had no client for its idle time, and the next tool starts another.
//!
//! Addresses: 127.127.27.1 and 127.127.27.3.

use nicd::ondemand::{answers, ensure, OnDemand};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use verbs::Provider;

const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 127, 27, 1));

/// Kills a daemon the test started should it fail before the daemon
/// left by itself.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        // SAFETY: a signal to a daemon this test started (ESRCH once it
        // left).
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Waits (at most `within`) for `f`; whether it came.
fn until(within: Duration, f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + within;
    let mut pause = Duration::from_millis(1);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    f()
}

#[test]
fn two_tools_start_one_daemon_which_leaves_when_idle() {
    let socket = std::env::temp_dir().join(format!("nicd-ondemand-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(nicd::ondemand::log_path(&socket));
    assert!(!answers(&socket));
    let how = OnDemand {
        idle_exit: Duration::from_millis(400),
        program: Some(env!("CARGO_BIN_EXE_nicd").into()),
        wait: Duration::from_secs(30),
    };
    // Two "tools" find no daemon at the same moment.
    let go = Arc::new(Barrier::new(2));
    let tools: Vec<_> = (0..2)
        .map(|_| {
            let (socket, how, go) = (socket.clone(), how.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                let held = ensure(&socket, &[IP], nicd::Fabric::Roce, &how).unwrap();
                let (p, guid) = nicd::connect_at(&socket, IP, None).unwrap();
                (held.started.clone(), p, guid)
            })
        })
        .collect();
    let got: Vec<_> = tools.into_iter().map(|t| t.join().unwrap()).collect();
    let started: Vec<_> = got.iter().filter_map(|(s, ..)| s.clone()).collect();
    assert_eq!(started.len(), 1, "{started:?}");
    let pid = started[0].pid;
    let _reap = Reap(pid);
    // It keeps no directory of the tool's busy.
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        std::path::Path::new("/")
    );
    // Both are clients of the one daemon started, which serves the NIC.
    for (_, p, guid) in &got {
        assert_eq!(p.daemon_pid(), pid);
        assert_eq!(p.list_cas(), vec![*guid]);
    }
    let line = started[0].to_string();
    assert!(
        line.starts_with("started the NIC daemon (")
            && line.contains(&format!("pid {pid}"))
            && line.contains("leaves after 400ms without a client"),
        "{line}"
    );

    // While a client stays the daemon stays, longer than its idle time.
    let first = got.into_iter().next().map(|(_, p, _)| p).unwrap();
    std::thread::sleep(Duration::from_millis(900));
    assert!(alive(pid) && answers(&socket));
    assert_eq!(first.list_cas(), vec![rnic::softroce::ip_guid(IP)]);
    drop(first);

    // No client for 400 ms: it leaves, and says so in its log.
    assert!(
        until(Duration::from_secs(20), || !alive(pid)),
        "nicd {pid} still runs"
    );
    assert!(!answers(&socket));
    let log = std::fs::read_to_string(nicd::ondemand::log_path(&socket)).unwrap();
    assert!(log.contains("no client for 400ms: leaving"), "{log}");

    // The next tool starts another (the port the first let go of).
    let held = ensure(&socket, &[IP], nicd::Fabric::Roce, &how).unwrap();
    let again = held.started.clone().expect("a new daemon");
    let _reap2 = Reap(again.pid);
    assert_ne!(again.pid, pid);
    let (p, _) = nicd::connect_at(&socket, IP, None).unwrap();
    drop(held);
    assert_eq!(p.daemon_pid(), again.pid);
    drop(p);
    assert!(until(Duration::from_secs(20), || !alive(again.pid)));
    let _ = std::fs::remove_file(nicd::ondemand::lock_path(&socket));
    let _ = std::fs::remove_file(nicd::ondemand::log_path(&socket));
}

#[test]
fn a_daemon_that_cannot_start_is_reported_with_its_words() {
    let socket =
        std::env::temp_dir().join(format!("nicd-ondemand-bad-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let how = OnDemand {
        idle_exit: Duration::from_millis(400),
        program: Some(env!("CARGO_BIN_EXE_nicd").into()),
        wait: Duration::from_secs(30),
    };
    // 192.0.2.1 (TEST-NET-1) is no address of this host.
    let bad = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let e = ensure(&socket, &[bad], nicd::Fabric::Roce, &how)
        .err()
        .expect("no daemon");
    let text = e.to_string();
    assert!(
        text.contains("stopped") && text.contains("192.0.2.1 (UDP port 4791)"),
        "{text}"
    );
    let missing = OnDemand {
        program: Some("/nonexistent/nicd".into()),
        ..how
    };
    let e = ensure(&socket, &[IP], nicd::Fabric::Roce, &missing)
        .err()
        .expect("no program");
    assert!(e.to_string().contains("would not start"), "{e}");
    for p in [
        nicd::ondemand::lock_path(&socket),
        nicd::ondemand::log_path(&socket),
    ] {
        let _ = std::fs::remove_file(p);
    }
}

/// A daemon whose lock file this user cannot make (here: a directory in
/// its place) is still used when it answers; with none answering, the
/// lock is the error, naming it.
#[test]
fn a_daemon_that_answers_is_used_without_its_lock() {
    let socket =
        std::env::temp_dir().join(format!("nicd-ondemand-nolock-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let lock = nicd::ondemand::lock_path(&socket);
    let _ = std::fs::remove_dir(&lock);
    std::fs::create_dir(&lock).unwrap();
    let how = OnDemand {
        idle_exit: Duration::from_millis(400),
        program: Some(env!("CARGO_BIN_EXE_nicd").into()),
        wait: Duration::from_secs(30),
    };
    let ip = IpAddr::V4(Ipv4Addr::new(127, 127, 27, 3));
    let e = ensure(&socket, &[ip], nicd::Fabric::Roce, &how)
        .err()
        .expect("no lock, no daemon");
    assert!(
        e.to_string()
            .contains(&format!("cannot lock {}", lock.display())),
        "{e}"
    );
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_nicd"))
        .args(["--ip", &ip.to_string(), "--socket"])
        .arg(&socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _reap = Reap(daemon.id());
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(daemon.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("nicd: serving"), "{line}");
    let held = ensure(&socket, &[ip], nicd::Fabric::Roce, &how).unwrap();
    assert!(held.started.is_none());
    let (p, _) = nicd::connect_at(&socket, ip, None).unwrap();
    assert_eq!(p.daemon_pid(), daemon.id());
    drop((held, p));
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir(&lock);
    let _ = std::fs::remove_file(&socket);
}
