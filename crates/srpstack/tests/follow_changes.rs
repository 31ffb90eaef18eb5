//! The initiator follows the target's changes (issue 26, item 7): `srptd`
//! exports LUN 0 on 127.0.102.1 and `srpd` on 127.0.102.2 logs in; while
//! fio writes and verifies LUN 0 through its file, `srptadm add-lun`,
//! `resize` and `remove-lun` change the target, and each change shows in
//! srpd's mount within 2 s (an SRP_AER_REQ or a unit attention makes srpd
//! rescan): the new LUN's file appears, grows, and goes; a descriptor still
//! open on the removed LUN gets an error, not another LUN's data. `srp
//! rescan` answers in words. fio ends with no verify error.
//!
//! Skipped without FUSE or fio, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::{srp, text};
use rdma_testkit::need;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TARGET: &str = "id_ext=0002c9037f006601,ioc_guid=0002c9037f006601,dest=127.0.102.1:5555";

/// How long a change may take to show in the mount.
const WITHIN: Duration = Duration::from_secs(2);

/// Runs `srptadm` against the target behind `sock`; panics if refused.
fn srptadm(sock: &Path, args: &[&str]) -> String {
    let out = Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "srptadm {args:?}: {}", text(&out));
    text(&out)
}

/// Polls `cond` until it holds, at most [`WITHIN`]; returns how long it took.
fn within_2s(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < WITHIN,
            "{what}: not within {WITHIN:?} of the target's change"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// Commands srpd's login `t` has completed (all channels).
fn completed(sock: &Path) -> u64 {
    let out = srp(sock, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["channels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["completed"].as_u64())
        .sum()
}

/// Waits until fio has moved at least 100 more commands through srpd.
fn fio_running(sock: &Path) {
    let from = completed(sock);
    common::wait_for("fio's I/O on LUN 0", 20, || completed(sock) >= from + 100);
}

fn len_of(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

#[test]
fn lun_files_follow_add_resize_and_remove_while_fio_verifies_lun0() {
    if !need::fuse() || !need::tools(&["fusermount3", "fio"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-follow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let tsock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.0.102.1\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"d0\"\nhandler = \"ram\"\nsize = \"32M\"\n\n\
             [[device]]\nname = \"extra\"\nhandler = \"ram\"\nsize = \"8M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            tsock.display()
        ),
    )
    .unwrap();
    let target = common::start_srptd(&cfg);
    let sock = dir.join("srpd.sock");
    let srpd = common::start_srpd("127.0.102.2", &root, &sock, &[]);
    let login = srp(&sock, &["login", TARGET, "--name", "t"]);
    assert!(login.status.success(), "{}", text(&login));
    let lun0 = root.join("t/lun0");
    let lun3 = root.join("t/lun3");
    assert_eq!(len_of(&lun0), Some(32 << 20));
    assert_eq!(len_of(&lun3), None);

    // fio writes and verifies LUN 0 the whole time the target changes.
    let fio = Command::new("fio")
        .args(["--name=lun0", "--rw=randwrite", "--bs=4k", "--size=16m"])
        .arg(format!("--filename={}", lun0.display()))
        .args(["--direct=1", "--ioengine=psync", "--loops=1000"])
        .args(["--time_based", "--runtime=60"])
        .args(["--verify=crc32c", "--verify_backlog=16", "--verify_fatal=1"])
        .args(["--verify_state_save=0", "--output-format=json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let fio_pid = fio.id();
    fio_running(&sock);

    // Added: the file appears.
    let t = Instant::now();
    let said = srptadm(&tsock, &["add-lun", "3", "extra"]);
    assert!(
        said.starts_with("added LUN 3 (extra, 8 MiB) to the default LUNs; 1 session told"),
        "srptadm answers in words: {said}"
    );
    within_2s("LUN 3's file appearing", || len_of(&lun3) == Some(8 << 20));
    let appeared = t.elapsed();
    srpd.wait_line("t: LUN 3 appeared (8 MiB)", 5);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let old = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lun3)
        .unwrap();
    old.write_all_at(&pattern, 4 << 20).unwrap();

    // Resized: the file grows, and the new end takes I/O.
    let t = Instant::now();
    let said = srptadm(&tsock, &["resize", "extra", "24M"]);
    assert!(
        said.starts_with("resized device extra from 8 MiB to 24 MiB"),
        "{said}"
    );
    within_2s("LUN 3's file growing", || len_of(&lun3) == Some(24 << 20));
    let resized = t.elapsed();
    srpd.wait_line("t: LUN 3 resized from 8 MiB to 24 MiB", 5);
    old.write_all_at(&pattern, 20 << 20).unwrap();
    let mut back = vec![0u8; 4096];
    old.read_exact_at(&mut back, 20 << 20).unwrap();
    assert!(back == pattern, "data at the grown end reads back wrong");

    // On demand: nothing changed since.
    let again = srp(&sock, &["rescan", "t"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("t: no change"), "{}", text(&again));

    // Removed: the file goes; the open descriptor gets errors.
    let t = Instant::now();
    let said = srptadm(&tsock, &["remove-lun", "3"]);
    assert!(
        said.starts_with("removed LUN 3 (extra) from the default LUNs"),
        "{said}"
    );
    within_2s("LUN 3's file going", || !lun3.exists());
    let removed = t.elapsed();
    srpd.wait_line("t: LUN 3 went away", 5);
    let e = old.read_exact_at(&mut back, 4 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");

    // Mapped again (the same device, so the same LU): a fresh file that
    // `srp rescan` reports if the AER has not brought it already; the old
    // descriptor still reaches nothing.
    srptadm(&tsock, &["add-lun", "3", "extra"]);
    within_2s("LUN 3's file coming back", || {
        len_of(&lun3) == Some(24 << 20)
    });
    assert!(old.read_exact_at(&mut back, 4 << 20).is_err());
    let fresh = std::fs::File::open(&lun3).unwrap();
    fresh.read_exact_at(&mut back, 4 << 20).unwrap();
    assert!(
        back == pattern,
        "the LU's data did not survive its unmapping"
    );
    drop((old, fresh));

    // fio saw no error on LUN 0 through all of it, and still runs.
    fio_running(&sock);
    // SAFETY: kill(2) of our own child, not yet reaped; SIGINT makes fio
    // stop and write its report (its exit status then says "signal", so
    // the report and stderr are what tell).
    unsafe { libc::kill(fio_pid as i32, libc::SIGINT) };
    let out = fio.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("verify") && !stderr.contains("error"),
        "fio: {stderr}"
    );
    let report = String::from_utf8_lossy(&out.stdout);
    let at = report.find("\n{").map_or(0, |i| i + 1);
    let v: serde_json::Value =
        serde_json::from_str(&report[at..]).unwrap_or_else(|e| panic!("fio JSON: {e}\n{report}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let written = job["write"]["io_bytes"].as_u64().unwrap();
    let verified = job["read"]["io_bytes"].as_u64().unwrap();
    assert!(
        written > 0 && verified > 0,
        "fio wrote {written} and verified {verified} bytes"
    );
    eprintln!(
        "LUN 3 appeared after {appeared:?}, resized after {resized:?}, removed after {removed:?}; \
         fio wrote {written} bytes to LUN 0 and verified {verified}"
    );
    let out = srp(&sock, &["logout", "t"]);
    assert!(out.status.success(), "{}", text(&out));
    drop((srpd, target));
    let _ = std::fs::remove_dir_all(&dir);
}
