//! Interrupts (issue 26, item 5): a tool running a workload stops on
//! SIGINT or SIGTERM with a report of what it did, logs out so the target
//! drops the session at once, and exits within a second, even while its
//! commands wait on a target that no longer answers (frozen by SIGSTOP or
//! killed). `srp io`, `srp nbd`, `srp fuse`, `srpstack`, the short `srp`
//! commands and the rdma-perf tools (rperf, rperftest, rrping,
//! rpingpong). Real processes and real signals on loopback addresses of
//! their own (127.0.203.x); every wait is bounded.

mod common;
use common::Proc;

use rdma_testkit::need;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
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

/// Sends `sig` to `p` and waits (bounded) for it to exit: its status, how
/// long that took, the rest of its stdout and its stderr (printed too).
fn stop(p: &mut Proc, sig: i32) -> (ExitStatus, Duration, String, String) {
    let (status, took) = signal_and_wait(&mut p.child, sig);
    let out = p.rest(10).join("\n");
    let err = stderr_of(&mut p.child);
    println!("{out}\n{err}\n(exit {status:?} {took:?} after signal {sig})");
    (status, took, out, err)
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Waits (bounded) until `/proc` says process `pid` is stopped (state T):
/// a SIGSTOP has taken effect, not merely been sent.
fn wait_stopped(pid: u32) {
    let stat = format!("/proc/{pid}/stat");
    let stopped = within(Duration::from_secs(5), || {
        std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    });
    assert!(stopped, "process {pid} did not stop");
}

/// How a target stops answering: frozen (SIGSTOP, resumed at the end of
/// the test) or killed.
#[derive(Clone, Copy, Debug)]
enum Dead {
    Stopped,
    Killed,
}

impl Dead {
    fn make(self, d: &mut Proc) {
        match self {
            Dead::Stopped => {
                kill(d.child.id(), libc::SIGSTOP);
                wait_stopped(d.child.id());
            }
            Dead::Killed => {
                d.child.kill().expect("kill srptd");
                d.child.wait().expect("reap srptd");
            }
        }
    }
}

/// srptd on `target` (its control socket `tag`'s) and `srp io` from
/// `ours` with a long workload, once the target has counted the session's
/// commands.
fn srp_io_running(tag: &str, target: &str, ours: &str) -> (Proc, Proc) {
    let d = srptd(target, tag);
    let io = Proc::start(
        "srp io",
        common::tool(common::srp_bin())
            .args(["io", "--dest", target, "--ip", ours])
            .args(["--size", "100G", "--region", "8M"])
            .stderr(Stdio::piped()),
    );
    io.wait_line("srp: logged in to", 60);
    let runs = within(Duration::from_secs(30), || {
        adm(tag, &["sessions"])
            .as_array()
            .and_then(|s| s.first())
            .and_then(|s| s["commands"].as_u64())
            .is_some_and(|n| n > 100)
    });
    assert!(runs, "no I/O reached the target");
    (d, io)
}

/// `srp io` interrupted mid-run by `sig`: the partial report, the logout
/// and the exit status, and the target without the session at once.
/// Returns the target, still running.
fn srp_io_interrupted(sig: i32, name: &str, tag: &str, target: &str, ours: &str) -> Proc {
    let (d, mut io) = srp_io_running(tag, target, ours);
    let (status, took, out, err) = stop(&mut io, sig);
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
/// READ and WRITE requests.
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

    /// Sends a request: `command` (0 READ, 1 WRITE) with `payload`.
    fn send(&mut self, command: u16, handle: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
        req.extend_from_slice(&0u16.to_be_bytes()); // flags
        req.extend_from_slice(&command.to_be_bytes());
        req.extend_from_slice(&handle.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(payload);
        self.0.write_all(&req).unwrap();
    }

    fn send_read(&mut self, handle: u64, offset: u64, len: u32) {
        self.send(0, handle, offset, len, &[]);
    }

    fn send_write(&mut self, handle: u64, offset: u64, data: &[u8]) {
        self.send(1, handle, offset, data.len() as u32, data);
    }

    /// The simple reply's error field and handle, then its `len` bytes of
    /// data.
    fn reply(&mut self, len: usize) -> std::io::Result<(u32, u64, Vec<u8>)> {
        let mut r = [0u8; 16];
        self.0.read_exact(&mut r)?;
        let mut data = vec![0u8; len];
        self.0.read_exact(&mut data)?;
        Ok((
            u32::from_be_bytes(r[4..8].try_into().unwrap()),
            u64::from_be_bytes(r[8..16].try_into().unwrap()),
            data,
        ))
    }

    /// Whether the server closed the connection (within 5 s).
    fn closed(&mut self) -> bool {
        self.0
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        matches!(self.0.read(&mut [0u8; 1]), Ok(0))
    }
}

/// `srp nbd` from `ours` to srptd on `target` (control socket `tag`'s),
/// served on a Unix socket of its own with a client connected: srptd,
/// `srp nbd`, the client and the socket's path.
fn srp_nbd(tag: &str, target: &str, ours: &str) -> (Proc, Proc, NbdClient, PathBuf) {
    let d = srptd(target, tag);
    let nbd_sock = sock(&format!("{tag}-export"));
    let _ = std::fs::remove_file(&nbd_sock);
    let nbd = Proc::start(
        "srp nbd",
        common::tool(common::srp_bin())
            .args(["nbd", "--dest", target, "--ip", ours, "--socket"])
            .arg(&nbd_sock)
            .stderr(Stdio::piped()),
    );
    nbd.wait_line("served at", 60);
    let client = NbdClient::connect(&nbd_sock);
    (d, nbd, client, nbd_sock)
}

/// `srp nbd` stopped by `sig` after a WRITE and a READ through it, with
/// a client still connected: the summary of what it served, the client
/// cut off, logged out (srptd has no session at once), exit 0 within a
/// second.
#[test]
fn srp_nbd_on_sigint_reports_stops_serving_logs_out_and_exits_within_a_second() {
    let (target, ours) = ("127.0.203.25", "127.0.203.26");
    let (_d, mut nbd, mut client, nbd_sock) = srp_nbd("nbd-live", target, ours);
    let data = vec![0xa5u8; 64 << 10];
    client.send_write(1, 1 << 20, &data);
    assert_eq!(client.reply(0).expect("WRITE answered"), (0, 1, vec![]));
    client.send_read(2, 1 << 20, 64 << 10);
    assert_eq!(client.reply(64 << 10).expect("READ answered"), (0, 2, data));
    assert_eq!(
        adm("nbd-live", &["sessions"]).as_array().map(Vec::len),
        Some(1)
    );

    let (status, took, out, err) = stop(&mut nbd, libc::SIGINT);
    assert!(took < WITHIN, "exit took {took:?}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        out.contains("srp: SIGINT: stopping NBD (1 connections open)")
            && out.contains(
                "srp: LUN 0: 2 requests, 1 reads (64 KiB), 1 writes (64 KiB), 0 errors before SIGINT"
            )
            && out.contains("srp: NBD stopped")
            && out.contains(&format!("srp: SIGINT: logged out of {target}:5555")),
        "{out}"
    );
    assert!(client.closed(), "the NBD client is still connected");
    assert!(!nbd_sock.exists(), "{} is left", nbd_sock.display());
    let gone = within(Duration::from_secs(1), || {
        adm("nbd-live", &["sessions"])
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    assert!(gone, "{}", adm("nbd-live", &["sessions"]));
}

/// `srp nbd` stopped by `sig` while a READ waits on a target that `dead`
/// made silent: it says what it served (the READ still waiting named),
/// cuts the client off, and is gone within a second with 128 + `sig` and
/// no logout, rather than after fast_io_fail_tmo (15 s).
fn srp_nbd_at_a_dead_target(dead: Dead, sig: i32, name: &str, tag: &str, target: &str, ours: &str) {
    let (mut d, mut nbd, mut client, nbd_sock) = srp_nbd(tag, target, ours);
    client.send_write(1, 0, &[0x5a; 4096]);
    assert_eq!(client.reply(0).expect("a live target answers").0, 0);
    client.send_read(2, 0, 4096);
    assert_eq!(client.reply(4096).expect("a live target answers").0, 0);

    // The target stops answering; a READ goes out to it and stays there.
    dead.make(&mut d);
    client.send_read(3, 1 << 20, 4096);
    client
        .0
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        client.reply(4096).is_err(),
        "a {dead:?} target answered the READ"
    );

    let (status, took, out, err) = stop(&mut nbd, sig);
    if let Dead::Stopped = dead {
        kill(d.child.id(), libc::SIGCONT);
    }
    assert!(took < WITHIN, "{name}: exit took {took:?}");
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    assert!(
        out.contains(&format!("srp: {name}: stopping NBD (1 connections open)"))
            && out.contains(&format!(
                "srp: LUN 0: 3 requests, 1 reads (4 KiB), 1 writes (4 KiB), 0 errors, 1 in flight before {name}"
            ))
            && !out.contains("logged out"),
        "{out}"
    );
    assert!(
        err.contains(&format!(
            "srp: {name}: 1 NBD connections still inside a device call 250 ms after the shutdown began: \
             a request still waits on {target}:5555, which does not answer; exiting without logout"
        )) && !err.contains("still stopping"),
        "{err}"
    );
    assert!(client.closed(), "the NBD client is still connected");
    let _ = std::fs::remove_file(&nbd_sock);
}

#[test]
fn srp_nbd_exits_within_a_second_on_sigterm_with_commands_to_a_dead_target() {
    srp_nbd_at_a_dead_target(
        Dead::Stopped,
        libc::SIGTERM,
        "SIGTERM",
        "nbd",
        "127.0.203.21",
        "127.0.203.22",
    );
}

#[test]
fn srp_nbd_exits_within_a_second_on_sigint_with_commands_to_a_killed_target() {
    srp_nbd_at_a_dead_target(
        Dead::Killed,
        libc::SIGINT,
        "SIGINT",
        "nbd-killed",
        "127.0.203.23",
        "127.0.203.24",
    );
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
    let (status, took, out, err) = stop(&mut qs, libc::SIGINT);
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
        let mut child = common::tool(&bin)
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

/// `srp io` interrupted by `sig` while its commands wait on a target that
/// `dead` made silent: the partial report (what completed before, the
/// jobs still waiting named), no cache flush or logout that would wait on
/// the target too, and the exit within a second.
fn srp_io_at_a_dead_target(dead: Dead, sig: i32, name: &str, tag: &str, target: &str, ours: &str) {
    let (mut d, mut io) = srp_io_running(tag, target, ours);
    // Its four jobs keep a command each at the target: from now on they
    // wait on it (or, its last answers on the way, the flush does).
    dead.make(&mut d);

    let (status, took, out, err) = stop(&mut io, sig);
    if let Dead::Stopped = dead {
        kill(d.child.id(), libc::SIGCONT);
    }
    assert!(took < WITHIN, "{name}: exit took {took:?}");
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    assert!(out.contains("interrupted after"), "{out}");
    // Mostly the jobs' commands wait on the target. But when its last
    // answers were still on the way as it went (a loaded machine), the
    // jobs come back; then the cache flush is what meets the silence,
    // and it is given up within the grace.
    let waiting = out.contains("jobs still waiting on the device, their I/O in flight not counted");
    let flush_unanswered = err.contains(&format!(
        "srp: {name}: SYNCHRONIZE CACHE got no answer from {target}:5555 within 250 ms: exiting without it or logout"
    ));
    assert!(waiting || flush_unanswered, "{out}\n{err}");
    assert!(out.contains("0 verify failures, 0 I/O errors"), "{out}");
    let total = out
        .lines()
        .find(|l| l.starts_with("total "))
        .unwrap_or_else(|| panic!("no total row: {out}"));
    let ios: u64 = total.split_whitespace().nth(1).unwrap().parse().unwrap();
    // The target had counted over 100 commands, a few of them the
    // login's (INQUIRY, READ CAPACITY, ...) and four still in flight.
    assert!(ios > 50, "the I/Os done before are counted: {out}");
    assert!(
        err.contains(&format!(
            "srp: {name}: stopped; the report holds what was done so far"
        )) && (flush_unanswered
            || err.contains(&format!(
                "srp: {name}: I/O still waits on {target}:5555, which does not answer: exiting without SYNCHRONIZE CACHE or logout"
            ))),
        "{err}"
    );
}

#[test]
fn srp_io_at_a_stopped_target_reports_and_exits_within_a_second_on_sigterm() {
    srp_io_at_a_dead_target(
        Dead::Stopped,
        libc::SIGTERM,
        "SIGTERM",
        "io-stopped",
        "127.0.203.51",
        "127.0.203.52",
    );
}

#[test]
fn srp_io_at_a_killed_target_reports_and_exits_within_a_second_on_sigint() {
    srp_io_at_a_dead_target(
        Dead::Killed,
        libc::SIGINT,
        "SIGINT",
        "io-killed",
        "127.0.203.53",
        "127.0.203.54",
    );
}

/// Whether FUSE mounts work here; if not, the test is skipped (a failure
/// under `CI=true`).
fn fuse_here() -> bool {
    need::fuse() && need::tool("fusermount3")
}

/// Whether `dir` is a mount point now.
fn mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&dir))
}

/// `srp fuse` on `target` from `ours`, mounted on a fresh directory.
fn srp_fuse(target: &str, ours: &str, tag: &str) -> (Proc, PathBuf) {
    let mnt = std::env::temp_dir().join(format!("interrupts-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    let fuse = Proc::start(
        "srp fuse",
        common::tool(common::srp_bin())
            .args(["fuse", "--dest", target, "--ip", ours, "--mountpoint"])
            .arg(&mnt)
            .stderr(Stdio::piped()),
    );
    fuse.wait_line("srp: mounted 1 LUNs", 60);
    (fuse, mnt)
}

/// `srp fuse` stopped by SIGINT after reads and writes through its file:
/// the summary of what was done, unmounted, logged out (the target has no
/// session at once), exit 0 within a second.
#[test]
fn srp_fuse_on_sigint_reports_unmounts_logs_out_and_exits_within_a_second() {
    if !fuse_here() {
        return;
    }
    let (target, ours) = ("127.0.203.55", "127.0.203.56");
    let _d = srptd(target, "fuse");
    let (mut fuse, mnt) = srp_fuse(target, ours, "fuse");
    let file = mnt.join("lun0");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .expect("open lun0");
        let data = vec![0x5a; 1 << 20];
        f.write_all_at(&data, 0).unwrap();
        let mut back = vec![0u8; 1 << 20];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "lun0 read back other bytes");
    }
    assert_eq!(adm("fuse", &["sessions"]).as_array().map(Vec::len), Some(1));

    let (status, took, out, err) = stop(&mut fuse, libc::SIGINT);
    assert!(took < WITHIN, "exit took {took:?}");
    assert_eq!(status.code(), Some(0), "{err}");
    // What was done: the 1 MiB written and read back (in requests of at
    // most the kernel's max_read/max_write), and no error.
    let summary = out
        .lines()
        .find(|l| l.starts_with("srp: lun0: ") && l.ends_with(" before SIGINT"))
        .unwrap_or_else(|| panic!("no summary for lun0: {out}"));
    assert!(
        summary.contains(" reads (1 MiB), ")
            && summary.contains(" writes (1 MiB), 0 errors")
            && !summary.contains("in flight"),
        "{summary}"
    );
    assert!(
        out.contains(&format!("srp: SIGINT: unmounting {}", mnt.display()))
            && out.contains("srp: unmounted")
            && out.contains(&format!("srp: SIGINT: logged out of {target}:5555")),
        "{out}"
    );
    assert!(!mounted(&mnt), "{} is still mounted", mnt.display());
    let gone = within(Duration::from_secs(1), || {
        adm("fuse", &["sessions"])
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    assert!(gone, "{}", adm("fuse", &["sessions"]));
    let _ = std::fs::remove_dir(&mnt);
}

/// `srp fuse` stopped by SIGTERM while a read through its file waits on a
/// target that stopped answering (frozen): the summary names the request
/// in flight, the mount is gone (the read gets an error, not a hang), and
/// the exit, 143 without a logout, comes within a second rather than
/// after fast_io_fail_tmo (15 s).
#[test]
fn srp_fuse_exits_within_a_second_on_sigterm_with_a_read_at_a_stopped_target() {
    if !fuse_here() {
        return;
    }
    let (target, ours) = ("127.0.203.57", "127.0.203.58");
    let mut d = srptd(target, "fuse-stopped");
    let (mut fuse, mnt) = srp_fuse(target, ours, "fuse-stopped");
    let file = mnt.join("lun0");
    let f = std::fs::File::open(&file).expect("open lun0");
    let mut first = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut first, 0).expect("a live target answers");

    Dead::Stopped.make(&mut d);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let _ = tx.send(std::os::unix::fs::FileExt::read_exact_at(
            &f,
            &mut buf,
            1 << 20,
        ));
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a frozen target answered the read"
    );

    let (status, took, out, err) = stop(&mut fuse, libc::SIGTERM);
    kill(d.child.id(), libc::SIGCONT);
    assert!(took < WITHIN, "exit took {took:?}");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(
        out.contains(
            "srp: lun0: 1 reads (4 KiB), 0 writes (0 B), 0 errors, 1 in flight before SIGTERM"
        ),
        "{out}"
    );
    assert!(
        err.contains("a request still waits on 127.0.203.57:5555, which does not answer; exiting without logout"),
        "{err}"
    );
    assert!(!mounted(&mnt), "{} is still mounted", mnt.display());
    // The read that waited ends with an error (the connection aborted).
    let read = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the read still hangs");
    assert!(read.is_err(), "{read:?}");
    let _ = std::fs::remove_dir(&mnt);
}

/// The lines a child writes on `r`, as they come.
fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits (bounded) for a line of `rx` containing `what`; the lines read.
fn wait_for(rx: &mpsc::Receiver<String>, what: &str, secs: u64) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) => {
                let hit = l.contains(what);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(e) => panic!("never said `{what}` ({e}): {seen:?}"),
        }
    }
}

/// Every further line of `rx` until the child closes it (exits).
fn rest_of(rx: &mpsc::Receiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(10)) {
        out.push(l);
    }
    out
}

/// An rdma-perf tool, its stdout and stderr read line by line; killed on
/// drop. Its info events say when its transfer runs.
struct Tool {
    child: Child,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
}

impl Tool {
    fn start(bin: &str, args: &[&str]) -> Tool {
        let mut child = common::tool(common::bin_of(bin))
            .args(args)
            .env("RUST_LOG", "rdma_perf=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let out = lines_of(child.stdout.take().unwrap());
        let err = lines_of(child.stderr.take().unwrap());
        Tool { child, out, err }
    }

    /// Waits (bounded) for the tool to say on stderr that its transfer
    /// runs.
    fn running(&self) {
        wait_for(&self.err, "running", 60);
    }

    /// Sends `sig` to `tool`: it exits within a second with 128 + `sig`,
    /// saying on stderr that its report holds what was done so far.
    /// Returns its stdout and stderr from here on.
    fn interrupt(&mut self, tool: &str, sig: i32) -> (String, String) {
        let (status, took) = signal_and_wait(&mut self.child, sig);
        let out = rest_of(&self.out).join("\n");
        let err = rest_of(&self.err).join("\n");
        println!("{tool}: {out}\n{err}\n(exit {status:?} {took:?} after signal {sig})");
        assert!(took < WITHIN, "{tool}: exit took {took:?}");
        assert_eq!(status.code(), Some(128 + sig), "{tool}: {err}");
        let said = format!(
            "{tool}: {}: stopped; the report holds what was done so far",
            if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            }
        );
        assert!(err.contains(&said), "{tool}: {err}");
        (out, err)
    }

    /// Waits (bounded) for the tool to end by itself; its status and
    /// stderr.
    fn ends(&mut self, secs: u64) -> (ExitStatus, String) {
        let mut status = None;
        let ended = within(Duration::from_secs(secs), || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        assert!(ended, "still running {secs} s after its peer left");
        (status.unwrap(), rest_of(&self.err).join("\n"))
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after `before` and up to the next space in `text`.
fn number_after(text: &str, before: &str) -> u64 {
    let at = text
        .find(before)
        .unwrap_or_else(|| panic!("no `{before}`: {text}"))
        + before.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{before}`: {text}"))
}

/// `rperf server` on `ip`, listening.
fn rperf_server(ip: &str) -> Tool {
    let srv = Tool::start(
        "rperf",
        &[
            "server",
            "--bind",
            &format!("{ip}:4791"),
            "--oob",
            &format!("{ip}:18515"),
        ],
    );
    wait_for(&srv.out, "listening on", 60);
    srv
}

/// `rperf server` on `server` and a client from `client` running a
/// 60 s WRITE test against it, once messages complete.
fn rperf_running(server: &str, client: &str) -> (Tool, Tool) {
    let srv = rperf_server(server);
    let cli = Tool::start(
        "rperf",
        &[
            "client",
            "--bind",
            &format!("{client}:4791"),
            "--server",
            &format!("{server}:18515"),
            "--duration",
            "60",
        ],
    );
    cli.running();
    (srv, cli)
}

/// `rperf client` interrupted mid-run: its table of the messages that
/// completed, marked interrupted, exit 130 within a second; the server
/// sees it leave and ends.
#[test]
fn rperf_client_on_sigint_reports_what_completed_and_exits_within_a_second() {
    let (server, client) = ("127.0.203.61", "127.0.203.62");
    let (mut srv, mut cli) = rperf_running(server, client);
    let (out, _) = cli.interrupt("rperf", libc::SIGINT);
    assert!(out.contains("#iterations  BW[Gb/s]"), "{out}");
    let n = number_after(&out, " interrupted after ");
    assert!(n > 0, "{out}");
    assert!(
        out.contains(&format!(
            " interrupted after {n} messages: partial numbers; server CPU, verify and baseline skipped"
        )),
        "{out}"
    );
    // The client's leaving (its TCP connection closed) ends the server's
    // one client.
    let (status, err) = srv.ends(10);
    assert!(status.success(), "rperf server: {status}: {err}");
}

/// `rperf server` interrupted mid-run: whom it was serving and what its
/// QP took from the client, the connection closed, exit 130 within a
/// second; the client sees the server leave at once (not after its QP's
/// retries) and says so.
#[test]
fn rperf_server_on_sigint_mid_run_reports_and_exits_within_a_second() {
    let (server, client) = ("127.0.203.71", "127.0.203.72");
    let (mut srv, mut cli) = rperf_running(server, client);
    let (out, _) = srv.interrupt("rperf", libc::SIGINT);
    let said = format!(
        "rperf server: interrupted while serving client {client}:4791 (write, 65536-byte messages): "
    );
    let report = out
        .lines()
        .find(|l| l.starts_with(&said))
        .unwrap_or_else(|| panic!("no report: {out}"));
    assert!(
        number_after(report, "messages): ") > 0
            && report.ends_with(" sent; connection closed, 0 clients served before"),
        "{report}"
    );
    let (status, err) = cli.ends(2);
    assert_eq!(status.code(), Some(1), "rperf client: {err}");
    assert!(
        err.contains("rperf: the server closed the connection after ")
            && err.contains(" messages completed: see its output"),
        "rperf client: {err}"
    );
}

/// Servers waiting for a client, interrupted: each exits within a second
/// with 128 + signal and says it was still waiting.
#[test]
fn servers_waiting_for_a_client_exit_within_a_second_saying_so() {
    let rrping = "127.0.203.73";
    let mut srv = Tool::start("rrping", &["-s", "-a", rrping]);
    wait_for(&srv.out, "server listening on", 60);
    let (out, _) = srv.interrupt("rrping", libc::SIGTERM);
    assert!(
        out.contains("rrping: 0 pings; interrupted while waiting for a client"),
        "{out}"
    );

    let (out, _) = rperf_server("127.0.203.74").interrupt("rperf", libc::SIGINT);
    assert!(
        out.contains("rperf server: interrupted after serving 0 clients"),
        "{out}"
    );

    let rperftest = "127.0.203.75";
    let mut srv = Tool::start("rperftest", &["write", "--bind", rperftest, "-p", "18515"]);
    wait_for(&srv.out, "Waiting for client to connect", 60);
    let (_, err) = srv.interrupt("rperftest", libc::SIGINT);
    assert!(
        err.contains("rperftest: interrupted before the test began"),
        "{err}"
    );
}

/// `rperftest write` client interrupted mid-run by SIGTERM: perftest's
/// result line for the messages that completed, marked interrupted, exit
/// 143 within a second; the server sees the connection close.
#[test]
fn rperftest_client_on_sigterm_reports_what_completed_and_exits_within_a_second() {
    let (server, client) = ("127.0.203.63", "127.0.203.64");
    let mut srv = Tool::start("rperftest", &["write", "--bind", server, "-p", "18515"]);
    wait_for(&srv.out, "Waiting for client to connect", 60);
    let mut cli = Tool::start(
        "rperftest",
        &["write", server, "--bind", client, "-p", "18515", "-D", "60"],
    );
    cli.running();
    let (out, _) = cli.interrupt("rperftest", libc::SIGTERM);
    // The result line under perftest's header: size, then iterations.
    let mut lines = out.lines().skip_while(|l| !l.contains("#iterations"));
    lines.next();
    let result = lines
        .next()
        .unwrap_or_else(|| panic!("no result line: {out}"));
    let iters: u64 = result
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{result}"));
    assert!(
        result.trim_start().starts_with("65536 ") && iters > 0,
        "{result}"
    );
    assert!(
        out.contains(&format!(" verified: {iters} completions, all successful and in order"))
            && out.contains(
                "rperftest: RDMA_Write BW Test interrupted: partial numbers, the rest of the exchange skipped"
            ),
        "{out}"
    );
    let (_, err) = srv.ends(10);
    assert!(err.contains("peer closed the connection"), "{err}");
}

/// `rrping` interrupted mid-run, either side: its count of the pings
/// done, marked interrupted, and a disconnect the other side sees at
/// once; exit 128 + signal within a second.
#[test]
fn rrping_on_sigint_or_sigterm_reports_disconnects_and_exits_within_a_second() {
    for (interrupted, sig, server, client) in [
        ("client", libc::SIGINT, "127.0.203.65", "127.0.203.66"),
        ("server", libc::SIGTERM, "127.0.203.67", "127.0.203.68"),
    ] {
        let mut srv = Tool::start("rrping", &["-s", "-a", server, "-C", "0"]);
        wait_for(&srv.out, "server listening on", 60);
        let mut cli = Tool::start(
            "rrping",
            &[
                "-c", "-a", server, "-I", client, "-C", "1000000", "-v", "-V",
            ],
        );
        wait_for(&cli.out, "ping data: rdma-ping-3:", 60);
        let (it, other) = if interrupted == "client" {
            (&mut cli, &mut srv)
        } else {
            (&mut srv, &mut cli)
        };
        let (out, _) = it.interrupt("rrping", sig);
        let report = out
            .lines()
            .find(|l| l.starts_with("rrping: ") && l.contains(" pings"))
            .unwrap_or_else(|| panic!("{interrupted}: no report: {out}"));
        assert!(
            number_after(report, "rrping: ") >= 3
                && report.ends_with("; interrupted, disconnected"),
            "{interrupted}: {report}"
        );
        // The other side learns of it from the disconnect, not a timeout.
        let (status, err) = other.ends(2);
        if interrupted == "client" {
            assert!(status.success(), "server: {status}: {err}");
        } else {
            assert!(err.contains("rrping: the server left"), "client: {err}");
        }
    }
}

/// `rpingpong` client interrupted mid-run: rc_pingpong's two lines for
/// the exchanges done, marked interrupted, exit 130 within a second. (Its
/// peer, as rc_pingpong's, only notices from its own stall timeout.)
#[test]
fn rpingpong_on_sigint_reports_the_exchanges_done_and_exits_within_a_second() {
    let (server, client) = ("127.0.203.69", "127.0.203.70");
    let srv = Tool::start(
        "rpingpong",
        &["--bind", server, "-g", "1", "-n", "100000000"],
    );
    wait_for(&srv.out, "rpingpong: waiting on", 60);
    let mut cli = Tool::start(
        "rpingpong",
        &[server, "--bind", client, "-g", "1", "-n", "100000000"],
    );
    cli.running();
    let (out, _) = cli.interrupt("rpingpong", libc::SIGINT);
    let iters = number_after(&out, "interrupted after ");
    assert!(
        iters > 0
            && out.contains(&format!("{iters} iters in "))
            && out.contains(&format!("{} bytes in ", iters * 4096 * 2))
            && out.contains(&format!(
                "interrupted after {iters} of 100000000 iters: partial numbers"
            )),
        "{out}"
    );
}
