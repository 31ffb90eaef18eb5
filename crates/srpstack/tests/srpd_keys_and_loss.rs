//! `srpd` with a real `srptd` on 127.0.178.x, as an operator runs them:
//!
//! - the tuning keys of a login string take effect (`tl_retry_count` is
//!   the QP's retry count in `srp list`, `max_sect` splits a write into
//!   commands of that size);
//! - a target that goes away (srptd killed): a write held by the blocked
//!   remote port fails once `fast_io_fail_tmo` has passed, new I/O then
//!   fails at once, and after `dev_loss_tmo` the LUN is reported lost;
//! - a target back before `fast_io_fail_tmo`: the held write completes on
//!   the new login and nothing written is lost.
//!
//! Skipped when the machine lacks FUSE, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::{srp, text, wait_for, Proc};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn list(sock: &Path) -> serde_json::Value {
    let o = srp(sock, &["list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A target (srptd on `.{t}`) with one 8 MiB fileio LUN and an initiator
/// (srpd on `.{t+1}`) with the given remote port timers.
struct Pair {
    dir: PathBuf,
    target_ip: String,
    tcfg: PathBuf,
    target: Option<Proc>,
    /// The running srptd's control socket.
    tsock: PathBuf,
    _srpd: Proc,
    sock: PathBuf,
    root: PathBuf,
}

impl Pair {
    fn start(tag: &str, t: u8, timers: &[&str]) -> Pair {
        let dir = std::env::temp_dir().join(format!("srpd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("mnt");
        std::fs::create_dir_all(&root).unwrap();
        let target_ip = format!("127.0.178.{t}");
        let tcfg = dir.join("srptd.toml");
        std::fs::write(
            &tcfg,
            format!(
                "[target]\nip = \"{target_ip}\"\n\n\
                 [[device]]\nname = \"disk0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"8M\"\n\n\
                 [[lun]]\nlun = 0\ndevice = \"disk0\"\n",
                dir.join("lun0.img").display()
            ),
        )
        .unwrap();
        let mut p = Pair {
            target: None,
            tsock: PathBuf::new(),
            _srpd: Proc::start(
                "srpd",
                common::tool(common::srpd_bin())
                    .args(["--ip", &format!("127.0.178.{}", t + 1)])
                    .args(if timers.contains(&"--login-timeout-ms") {
                        &[][..]
                    } else {
                        &["--login-timeout-ms", "1000"][..]
                    })
                    .args(timers)
                    .arg("--mount-root")
                    .arg(&root)
                    .arg("--control-socket")
                    .arg(dir.join("srpd.sock")),
            ),
            sock: dir.join("srpd.sock"),
            dir,
            target_ip,
            tcfg,
            root,
        };
        p._srpd.wait_line("srpd: ready on", 20);
        p.start_target(0);
        p
    }

    /// Starts srptd (again), with a control socket of its own each time.
    fn start_target(&mut self, round: u32) {
        let sock = self.dir.join(format!("srptd-{round}.sock"));
        let t = Proc::start(
            "srptd",
            common::tool(common::srptd_bin())
                .arg("--config")
                .arg(&self.tcfg)
                .arg("--control-socket")
                .arg(&sock),
        );
        t.wait_line("listening on", 20);
        self.target = Some(t);
        self.tsock = sock;
    }

    /// The target goes away at once (no logout, no DREQ).
    fn kill_target(&mut self) {
        let mut t = self.target.take().expect("a target runs");
        t.child.kill().unwrap();
        t.child.wait().unwrap();
    }

    fn login_string(&self, extra: &str) -> String {
        // srptd's target port ID is the GUID of its address.
        let guid = rnic::softroce::ip_guid(self.target_ip.parse().unwrap()).0;
        let mut s = format!(
            "id_ext={guid:016x},ioc_guid={guid:016x},dest={}:5555",
            self.target_ip
        );
        if !extra.is_empty() {
            s.push(',');
            s.push_str(extra);
        }
        s
    }

    fn login(&self, name: &str, extra: &str) {
        let o = srp(
            &self.sock,
            &["login", &self.login_string(extra), "--name", name],
        );
        assert!(o.status.success(), "{}", text(&o));
    }

    fn lun0(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.root.join(name).join("lun0"))
            .unwrap()
    }

    /// The LUN's remote port state in `srp list`.
    fn state(&self) -> String {
        list(&self.sock)[0]["luns"][0]["state"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    }

    /// WRITEs the target's LUN 0 executed (`srptadm show`). Counted at
    /// the target, not by the initiator's completed commands: every
    /// close of a LUN file, including the copies a process closes when it
    /// starts another, is a FUSE FLUSH and so a SYNCHRONIZE CACHE.
    fn target_writes(&self) -> u64 {
        let out = Command::new(common::srptadm_bin())
            .arg("--socket")
            .arg(&self.tsock)
            .args(["--json", "show"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["lun_stats"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["lun"] == 0)
            .map(|l| l["writes"].as_u64().unwrap_or(0))
            .sum()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = srp(&self.sock, &["logout", "t"]);
    }
}

fn fuse_missing() -> bool {
    !rdma_testkit::need::fuse()
}

/// A page-aligned buffer for O_DIRECT.
fn aligned(len: usize, seed: u8) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; len + 4096];
    let off = v.as_ptr().align_offset(4096);
    for (i, b) in v[off..off + len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(seed);
    }
    (v, off)
}

fn write_at(f: &mut std::fs::File, at: u64, len: usize, seed: u8) -> std::io::Result<()> {
    let (v, off) = aligned(len, seed);
    f.seek(SeekFrom::Start(at))?;
    f.write_all(&v[off..off + len])
}

fn check_at(f: &mut std::fs::File, at: u64, len: usize, seed: u8) {
    let (want, woff) = aligned(len, seed);
    let (mut got, goff) = aligned(len, 0);
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut got[goff..goff + len]).unwrap();
    assert!(
        got[goff..goff + len] == want[woff..woff + len],
        "data at {at} differs"
    );
}

#[test]
fn srpd_applies_tl_retry_count_and_max_sect() {
    if fuse_missing() {
        return;
    }
    let p = Pair::start("keys", 11, &["--reconnect-delay", "1"]);
    p.login(
        "t",
        "tl_retry_count=3,max_sect=16,max_cmd_per_lun=2,target_can_queue=4,comp_vector=5",
    );
    let v = list(&p.sock);
    assert_eq!(v[0]["channels"][0]["retry_cnt"], 3, "{v}");
    let mut f = p.lun0("t");
    let before = p.target_writes();
    write_at(&mut f, 1 << 20, 64 << 10, 1).unwrap();
    // 64 KiB in WRITEs of 16 sectors (8 KiB).
    assert_eq!(p.target_writes() - before, 8);
    check_at(&mut f, 1 << 20, 64 << 10, 1);
    drop(f);
    let o = srp(&p.sock, &["logout", "t"]);
    assert!(o.status.success(), "{}", text(&o));

    // Defaults: retry count 7, 1024 sectors per command.
    p.login("t", "");
    assert_eq!(list(&p.sock)[0]["channels"][0]["retry_cnt"], 7);
    let mut f = p.lun0("t");
    let before = p.target_writes();
    write_at(&mut f, 2 << 20, 64 << 10, 2).unwrap();
    assert_eq!(p.target_writes() - before, 1);
    check_at(&mut f, 1 << 20, 64 << 10, 1);
    check_at(&mut f, 2 << 20, 64 << 10, 2);
}

#[test]
fn a_held_write_fails_after_fast_io_fail_tmo_and_the_lun_is_lost_after_dev_loss_tmo() {
    if fuse_missing() {
        return;
    }
    // dev_loss_tmo far past fast_io_fail_tmo, so the state tells which
    // timer failed an I/O however slow the machine; reconnect attempts that
    // wait 4 s for the (absent) target, so an `srp list` stuck behind one
    // shows.
    let mut p = Pair::start(
        "loss",
        13,
        &[
            "--reconnect-delay",
            "1",
            "--fast-io-fail-tmo",
            "2",
            "--dev-loss-tmo",
            "10",
            "--login-timeout-ms",
            "4000",
        ],
    );
    p.login("t", "");
    let mut f = p.lun0("t");
    write_at(&mut f, 0, 4096, 1).unwrap();
    assert_eq!(p.state(), "running");

    drop(f);

    p.kill_target();
    // The write goes out, is not acknowledged, the transport gives up
    // (about 0.55 s) and the port blocks; the write is held until
    // fast_io_fail_tmo (2 s) has passed, then fails: by that timer, not
    // dev_loss_tmo's (the state says which). (I/O while the target is away
    // runs in processes of its own, see `dd`.)
    let t0 = Instant::now();
    // (No LUN file is open in this process while I/O is held: a process
    // it starts would close its copy at exec, and FUSE sends a FLUSH for
    // that close, which is held too.)
    let (ok, held, err) = dd(&p, &["if=/dev/zero", "bs=4096", "seek=2", "count=1"]);
    assert!(!ok, "a write with the target away succeeded");
    // Held at least fast_io_fail_tmo: a lower bound, which load cannot break.
    assert!(
        held >= Duration::from_secs(2),
        "held write failed after {held:?} ({err})"
    );
    eprintln!("held write failed after {} ms", held.as_millis());
    assert_eq!(p.state(), "failfast", "failed by fast_io_fail_tmo");
    // New I/O fails at once: not held until dev_loss_tmo (the LUN is still
    // in fail-fast after it failed), whatever the time it took.
    for args in [
        &["if=/dev/zero", "bs=4096", "seek=4", "count=1"][..],
        &["of=/dev/null", "bs=4096", "count=1"][..],
    ] {
        let (ok, took, err) = dd(&p, args);
        eprintln!("fail-fast {args:?} took {} ms", took.as_millis());
        assert!(!ok, "{args:?} succeeded in fail-fast ({err})");
        assert_eq!(p.state(), "failfast", "{args:?} was held");
    }
    // dev_loss_tmo (10 s after the failure): the LUN is gone for good.
    // `srp list` answers at once all along, also while a reconnect
    // attempt waits (up to the login timeout, 4 s) for the target.
    let mut slowest = Duration::ZERO;
    wait_for("the LUN to be reported lost", 30, || {
        let t = Instant::now();
        let lost = p.state() == "lost";
        slowest = slowest.max(t.elapsed());
        lost
    });
    eprintln!(
        "lost after {} ms; slowest srp list {} ms",
        t0.elapsed().as_millis(),
        slowest.as_millis()
    );
    // Half the login timeout: one list stuck behind an attempt would wait
    // for the rest of it (the bound is the feature, and generous).
    assert!(
        slowest < Duration::from_secs(2),
        "srp list took {slowest:?}"
    );
    // Not lost before dev_loss_tmo: a lower bound.
    assert!(
        t0.elapsed() >= Duration::from_secs(9),
        "lost after {:?}",
        t0.elapsed()
    );
    // A target back after that changes nothing: lost is final.
    p.start_target(1);
    let (ok, took, err) = dd(&p, &["if=/dev/zero", "bs=4096", "count=1"]);
    assert!(!ok, "I/O to a lost LUN succeeded after {took:?}");
    eprintln!(
        "I/O to the lost LUN failed after {} ms ({err})",
        took.as_millis()
    );
    assert_eq!(p.state(), "lost");
}

/// Runs `dd` on the LUN file of login `t` with O_DIRECT (`oflag` when it
/// writes, `iflag` when it reads), in a process of its own, so that this
/// test holds no LUN file open while I/O is held (see above). Returns whether dd
/// succeeded, how long it took, and what it said.
fn dd(p: &Pair, args: &[&str]) -> (bool, Duration, String) {
    let lun = p.root.join("t/lun0").display().to_string();
    let writes = args.iter().any(|a| a.starts_with("if="));
    let mut cmd = Command::new("dd");
    cmd.args(args);
    if writes {
        cmd.arg(format!("of={lun}"))
            .args(["oflag=direct", "conv=notrunc"]);
    } else {
        cmd.arg(format!("if={lun}")).arg("iflag=direct");
    }
    let t = Instant::now();
    let out = cmd.output().unwrap();
    (out.status.success(), t.elapsed(), text(&out))
}

#[test]
fn a_target_back_before_fast_io_fail_tmo_loses_nothing() {
    if fuse_missing() {
        return;
    }
    // fast_io_fail_tmo long enough that a slow machine's restart of the
    // target still comes before it: the held writes must then succeed.
    let mut p = Pair::start(
        "back",
        15,
        &[
            "--reconnect-delay",
            "1",
            "--fast-io-fail-tmo",
            "20",
            "--dev-loss-tmo",
            "40",
        ],
    );
    p.login("t", "");
    let mut f = p.lun0("t");
    for k in 0..16u64 {
        write_at(&mut f, k * 65536, 65536, k as u8).unwrap();
    }
    // No LUN file open in this process while the target is away: every
    // process it starts would close its copy at exec, and FUSE sends a
    // FLUSH (SYNCHRONIZE CACHE) for that close, held like any I/O.
    drop(f);

    // Held writes, from a process of their own (dd, O_DIRECT).
    let held: Vec<u8> = (16..24u8)
        .flat_map(|k| {
            let (v, off) = aligned(65536, k);
            v[off..off + 65536].to_vec()
        })
        .collect();
    std::fs::write(p.dir.join("held.bin"), &held).unwrap();
    p.kill_target();
    let t0 = Instant::now();
    let mut dd = Command::new("dd")
        .arg(format!("if={}", p.dir.join("held.bin").display()))
        .arg(format!("of={}", p.root.join("t/lun0").display()))
        .args([
            "bs=65536",
            "seek=16",
            "count=8",
            "oflag=direct",
            "conv=notrunc,fsync",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the port to block", 10, || p.state() == "blocked");
    assert!(
        dd.try_wait().unwrap().is_none(),
        "dd ended while the target was away"
    );
    p.start_target(1);
    let mut status = None;
    wait_for("the held writes", 40, || {
        status = dd.try_wait().unwrap();
        status.is_some()
    });
    let took = t0.elapsed();
    eprintln!(
        "held writes done {} ms after the target went away",
        took.as_millis()
    );
    let mut err = String::new();
    dd.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    // Done, not failed: before fast_io_fail_tmo, on the new login.
    assert!(status.unwrap().success(), "dd: {err}");
    assert_eq!(p.state(), "running");
    let v = list(&p.sock);
    assert!(v[0]["luns"][0]["reconnects"].as_u64().unwrap() >= 1, "{v}");
    assert!(v[0]["luns"][0]["failures"].as_u64().unwrap() >= 1, "{v}");
    // Everything written before, during and after the outage is there,
    // through the LUN and in the target's image.
    let mut f = p.lun0("t");
    write_at(&mut f, 24 * 65536, 65536, 24).unwrap();
    for k in 0..25u64 {
        check_at(&mut f, k * 65536, 65536, k as u8);
    }
    drop(f);
    let mut img = std::fs::File::open(p.dir.join("lun0.img")).unwrap();
    for k in 0..25u64 {
        let (want, off) = aligned(65536, k as u8);
        let mut got = vec![0u8; 65536];
        img.seek(SeekFrom::Start(k * 65536)).unwrap();
        img.read_exact(&mut got).unwrap();
        assert!(got == want[off..off + 65536], "image block {k} differs");
    }
}
