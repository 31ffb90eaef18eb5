//! Interrupts (issue 26, item 5): a tool running a workload stops on
//! SIGINT or SIGTERM with a report of what it did, logs out so the target
//! drops the session at once, and exits within a second, even while its
//! commands wait on a target that no longer answers. Real processes and
//! real signals on loopback addresses of their own (127.0.203.x); every
//! wait is bounded.

mod common;
use common::Proc;

use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The bound the tools promise, from signal to exit.
const WITHIN: Duration = Duration::from_secs(1);

fn sock(tag: &str) -> PathBuf {
    common::sock_of("interrupts", tag)
}

fn srptd(ip: &str, tag: &str) -> Proc {
    common::srptd_ram64(ip, &sock(tag))
}

/// `srptadm --json <args>` against the srptd of `tag`.
fn adm(tag: &str, args: &[&str]) -> Value {
    let out = Command::new(common::srptadm_bin())
        .arg("--control-socket")
        .arg(sock(tag))
        .arg("--json")
        .args(args)
        .output()
        .expect("run srptadm");
    assert!(out.status.success(), "{}", common::text(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Polls `cond` every 10 ms for at most `limit`; whether it came true.
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill with a child's pid and a valid signal.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Sends `sig` to `child` and waits (bounded) for it to exit: its status
/// and how long that took.
fn signal_and_wait(child: &mut Child, sig: i32) -> (ExitStatus, Duration) {
    let t0 = Instant::now();
    kill(child.id(), sig);
    let mut status = None;
    let exited = within(Duration::from_secs(20), || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    assert!(exited, "still running 20 s after signal {sig}");
    (status.expect("exited"), t0.elapsed())
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// `srp io` interrupted mid-run by `sig`: the partial report, the logout
/// and the exit status, and the target without the session at once.
/// Returns the target, still running.
fn srp_io_interrupted(sig: i32, name: &str, tag: &str, target: &str, ours: &str) -> Proc {
    let d = srptd(target, tag);
    let mut io = Proc::start(
        "srp io",
        Command::new(common::srp_bin())
            .args(["io", "--dest", target, "--ip", ours])
            .args(["--size", "100G", "--region", "8M"])
            .stderr(Stdio::piped()),
    );
    io.wait_line("srp: logged in to", 60);
    // The workload runs: the target counts the session's commands.
    let runs = within(Duration::from_secs(30), || {
        adm(tag, &["sessions"])
            .as_array()
            .and_then(|s| s.first())
            .and_then(|s| s["commands"].as_u64())
            .is_some_and(|n| n > 100)
    });
    assert!(runs, "no I/O reached the target");

    let (status, took) = signal_and_wait(&mut io.child, sig);
    let out = io.rest(10).join("\n");
    let err = stderr_of(&mut io.child);
    println!("{out}\n{err}\n(exit {status:?} {took:?} after {name})");
    assert!(took < WITHIN, "{name}: exit took {took:?}");
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    // The partial report: what was moved, that the read-back was skipped,
    // and nothing failed.
    assert!(
        out.contains("interrupted after") && out.contains("read-back skipped"),
        "{out}"
    );
    assert!(out.contains("0 verify failures, 0 I/O errors"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("total ")), "{out}");
    assert!(
        err.contains(&format!(
            "srp: {name}: stopped; the report holds what was done so far"
        )) && err.contains(&format!("srp: {name}: logged out of {target}:5555")),
        "{err}"
    );
    // Logged out: the target dropped the session at once, not after its
    // 15 s keepalive.
    let gone = within(Duration::from_secs(1), || {
        adm(tag, &["sessions"])
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    assert!(gone, "{}", adm(tag, &["sessions"]));
    d
}

#[test]
fn srp_io_on_sigint_reports_logs_out_and_exits_within_a_second() {
    let _d = srp_io_interrupted(libc::SIGINT, "SIGINT", "int", "127.0.203.1", "127.0.203.2");
    // The clean run's only CHECK CONDITION was the new nexus's unit
    // attention: no error at LUN 0 (issue 26: `errors 1` after a clean run).
    let show = adm("int", &["show"]);
    let lun0 = &show["lun_stats"][0];
    assert_eq!(lun0["lun"], 0, "{show}");
    assert_eq!(lun0["errors"], 0, "{show}");
    assert!(lun0["unit_attentions"].as_u64() >= Some(1), "{show}");
    let devices = adm("int", &["devices"]);
    assert_eq!(devices[0]["stats"]["errors"], 0, "{devices}");
}

#[test]
fn srp_io_on_sigterm_reports_logs_out_and_exits_within_a_second() {
    let _d = srp_io_interrupted(
        libc::SIGTERM,
        "SIGTERM",
        "term",
        "127.0.203.11",
        "127.0.203.12",
    );
}

/// Newstyle NBD: the handshake with NBD_OPT_EXPORT_NAME (proto.md), then
/// READ requests of `len` bytes.
struct NbdClient(std::os::unix::net::UnixStream);

impl NbdClient {
    fn connect(path: &std::path::Path) -> NbdClient {
        let mut s = std::os::unix::net::UnixStream::connect(path).expect("connect to srp nbd");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).expect("NBDMAGIC IHAVEOPT flags");
        assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT");
        // Client flags: FIXED_NEWSTYLE | NO_ZEROES.
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
        opt.extend_from_slice(&0u32.to_be_bytes()); // the default export
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).expect("export size and flags");
        NbdClient(s)
    }

    fn send_read(&mut self, handle: u64, offset: u64, len: u32) {
        let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
        req.extend_from_slice(&0u16.to_be_bytes()); // flags
        req.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        req.extend_from_slice(&handle.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        self.0.write_all(&req).unwrap();
    }

    /// The simple reply's error field and handle, then its data.
    fn reply(&mut self, len: usize) -> std::io::Result<(u32, u64)> {
        let mut r = [0u8; 16];
        self.0.read_exact(&mut r)?;
        let mut data = vec![0u8; len];
        self.0.read_exact(&mut data)?;
        Ok((
            u32::from_be_bytes(r[4..8].try_into().unwrap()),
            u64::from_be_bytes(r[8..16].try_into().unwrap()),
        ))
    }
}

/// `srp nbd` stopped by SIGTERM while a READ waits on a target that has
/// stopped answering (srptd frozen by SIGSTOP): it says it is stopping,
/// names why it cannot finish cleanly, and is gone within a second, not
/// after fast_io_fail_tmo (15 s).
#[test]
fn srp_nbd_exits_within_a_second_on_sigterm_with_commands_to_a_dead_target() {
    let (target, ours) = ("127.0.203.21", "127.0.203.22");
    let d = srptd(target, "nbd");
    let nbd_sock = sock("nbd-export");
    let _ = std::fs::remove_file(&nbd_sock);
    let mut nbd = Proc::start(
        "srp nbd",
        Command::new(common::srp_bin())
            .args(["nbd", "--dest", target, "--ip", ours, "--socket"])
            .arg(&nbd_sock)
            .stderr(Stdio::piped()),
    );
    nbd.wait_line("served at", 60);
    let mut client = NbdClient::connect(&nbd_sock);
    client.send_read(1, 0, 4096);
    assert_eq!(client.reply(4096).expect("a live target answers"), (0, 1));

    // The target stops answering; a READ goes out to it and stays there.
    kill(d.child.id(), libc::SIGSTOP);
    // Stopped once /proc says so (state T), not when kill returns.
    let stat = format!("/proc/{}/stat", d.child.id());
    let stopped = within(Duration::from_secs(5), || {
        std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    });
    assert!(stopped, "srptd did not stop");
    client.send_read(2, 1 << 20, 4096);
    client
        .0
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        client.reply(4096).is_err(),
        "a frozen target answered the READ"
    );

    let (status, took) = signal_and_wait(&mut nbd.child, libc::SIGTERM);
    let out = nbd.rest(10).join("\n");
    let err = stderr_of(&mut nbd.child);
    println!("{out}\n{err}\n(exit {status:?} {took:?} after SIGTERM)");
    kill(d.child.id(), libc::SIGCONT);
    assert!(took < WITHIN, "exit took {took:?}");
    assert!(
        out.contains("srp: SIGTERM: stopping NBD (1 connections open)"),
        "{out}"
    );
    assert!(
        err.contains("still stopping 750 ms after SIGTERM")
            && err.contains("waiting on a peer that does not answer"),
        "{err}"
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    let _ = std::fs::remove_file(&nbd_sock);
}

/// `srpstack quickstart` interrupted in its first phase: that phase's
/// partial report, the rest skipped, the stack stopped and its LUN file
/// removed, exit 130 within a second.
#[test]
fn srpstack_quickstart_on_sigint_reports_and_stops_within_a_second() {
    let mut qs = Proc::start(
        "srpstack quickstart",
        Command::new(env!("CARGO_BIN_EXE_srpstack"))
            .args(["quickstart", "--runtime", "60", "--size", "64M"])
            .args([
                "--target-ip",
                "127.0.203.31",
                "--initiator-ip",
                "127.0.203.32",
            ])
            .stderr(Stdio::piped()),
    );
    qs.wait_line("logged in in", 60);
    let (status, took) = signal_and_wait(&mut qs.child, libc::SIGINT);
    let out = qs.rest(10).join("\n");
    let err = stderr_of(&mut qs.child);
    println!("{out}\n{err}\n(exit {status:?} {took:?} after SIGINT)");
    assert!(took < WITHIN, "exit took {took:?}");
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        out.contains("sequential write, 1 MiB")
            && out.contains("interrupted after")
            && !out.contains("random 70% read"),
        "{out}"
    );
    assert!(
        out.contains("logged out, target stopped, temporary LUN file removed"),
        "{out}"
    );
    assert!(
        err.contains("srpstack: SIGINT: stopped; the report above holds what was done so far"),
        "{err}"
    );
}

/// `srp luns` and `srp reset`, short commands, interrupted while their
/// login waits on an address where nothing answers (a 10 s wait
/// otherwise): each exits within a second with 128+signal and says why.
#[test]
fn short_commands_waiting_on_a_silent_target_exit_within_a_second() {
    let bin = common::srp_bin();
    for (cmd, sig, code) in [("luns", libc::SIGINT, 130), ("reset", libc::SIGTERM, 143)] {
        // Nothing listens at 127.0.203.40: the login waits for the CM's
        // answer until its timeout.
        let mut child = Command::new(&bin)
            .args([cmd, "--dest", "127.0.203.40:5555", "--ip", "127.0.203.41"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start srp");
        // It says it is logging in before it waits.
        let mut err = child.stderr.take().expect("stderr");
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        let said = within(Duration::from_secs(30), || {
            let n = err.read(&mut buf).unwrap_or(0);
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            n == 0 || seen.contains("logging in")
        });
        assert!(said && seen.contains("logging in"), "srp {cmd}: {seen}");
        let (status, took) = signal_and_wait(&mut child, sig);
        let _ = err.read_to_string(&mut seen);
        assert!(
            took < WITHIN,
            "srp {cmd} took {took:?} after signal {sig}: {seen}"
        );
        assert_eq!(status.code(), Some(code), "srp {cmd}: {seen}");
        assert!(seen.contains("srp: "), "srp {cmd} said nothing: {seen}");
    }
}
