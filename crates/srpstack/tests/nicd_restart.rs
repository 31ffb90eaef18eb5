//! The NIC daemon killed and started again under srptd and srpd
//! (issue 27): both run through one `nicd` on 127.127.28.1, srpd logged
//! in to srptd with its LUN a file; `kill -9` of the daemon; a new
//! daemon on the same socket; srptd starts its target port on it again
//! and srpd's LUN reconnects through it: the same file name verifies
//! again. Then the same on a managed subnet: the daemon's `ib` ports,
//! ibsm on one of them, srpd logged in by the SA's path; after the
//! restart (and a new SM) srpd's port joins the subnet anew and the LUN
//! file verifies again. Skipped without FUSE (a failure under
//! `CI=true`).
//!
//! Addresses: 127.127.28.1, 127.127.28.11-13.

mod common;

use common::{
    assert_nicd_clients, bin_of, ibsm_bin, sa_login_string, sock_of, srp, srpd_bin, srptd_bin,
    text, tool, write_read_back, Proc,
};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const IP: &str = "127.127.28.1";

fn nicd(sock: &std::path::Path) -> Proc {
    let p = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--ip", IP, "--socket"])
            .arg(sock),
    );
    p.wait_line("serving", 60);
    p
}

/// `kill -9` of the daemon: no goodbye; its socket file stays behind.
fn kill_9(mut daemon: Proc) {
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
}

/// srpd logs out of "tgt"; srpd and srptd stop; their files go.
fn log_out_and_stop(
    srpd_sock: &std::path::Path,
    srpd: Proc,
    target: Proc,
    dir: &std::path::Path,
    sock: &std::path::Path,
) {
    let out = srp(srpd_sock, &["logout", "tgt"]);
    assert!(out.status.success(), "{}", text(&out));
    drop(srpd);
    drop(target);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(sock);
}

/// Writes and reads back `lun` until it works (after a reconnect), at
/// most 90 s.
fn comes_back(lun: &std::path::Path, seed: u32) {
    let end = Instant::now() + Duration::from_secs(90);
    let mut tries = 0;
    loop {
        tries += 1;
        if std::panic::catch_unwind(|| write_read_back(lun, seed)).is_ok() {
            return;
        }
        assert!(
            Instant::now() < end,
            "srpd's LUN file did not come back after {tries} tries"
        );
    }
}

/// srptd through the daemon at `sock` with a 16 MiB RAM LUN, its
/// control socket named by `tag`, `more` options before them; started
/// once it listens.
fn srptd_through(sock: &std::path::Path, tag: &str, more: &[&str]) -> Proc {
    let target = Proc::start(
        "srptd",
        tool(srptd_bin())
            .arg("--nicd")
            .arg(sock)
            .args(more)
            .args(["--ram-mib", "16", "--control-socket"])
            .arg(sock_of("nicd_restart", tag)),
    );
    target.wait_line("listening on", 60);
    target
}

/// srpd through the daemon at `sock` (`more`: its address and fabric),
/// reconnecting every 300 ms and failing I/O after `fail_secs`, its
/// mount root and control socket in a fresh directory named by `tag`:
/// (srpd, the directory, the mount root, the control socket).
fn srpd_through(
    sock: &std::path::Path,
    tag: &str,
    more: &[&str],
    fail_secs: &str,
) -> (Proc, PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let srpd_sock = dir.join("srpd.sock");
    let srpd = Proc::start(
        "srpd",
        tool(srpd_bin())
            .arg("--nicd")
            .arg(sock)
            .args(more)
            .arg("--mount-root")
            .arg(&root)
            .arg("--control-socket")
            .arg(&srpd_sock)
            .args(["--reconnect-delay", "300ms", "--dev-loss-tmo", "off"])
            .args(["--fast-io-fail-tmo", fail_secs]),
    );
    srpd.wait_line("srpd: ready on", 60);
    (srpd, dir, root, srpd_sock)
}

#[test]
fn srptd_and_srpd_come_back_with_the_nic_daemon() {
    if !rdma_testkit::need::part("nicd restart under srpd").fuse() {
        return;
    }
    let sock = sock_of("nicd_restart", "nicd");
    let _ = std::fs::remove_file(&sock);
    let daemon = nicd(&sock);
    let target = srptd_through(&sock, "srptd", &["--ip", IP]);
    let (srpd, dir, root, srpd_sock) = srpd_through(&sock, "nicd_restart", &["--ip", IP], "30");
    let login = srp(
        &srpd_sock,
        &[
            "login",
            "id_ext=0002c9037f7f1c01,ioc_guid=0002c9037f7f1c01,dest=127.127.28.1:5555",
            "--name",
            "tgt",
        ],
    );
    assert!(login.status.success(), "{}", text(&login));
    let lun = root.join("tgt/lun0");
    write_read_back(&lun, 7);

    kill_9(daemon);
    let _daemon = nicd(&sock);

    // srptd's port serves again on the new daemon (its log says so on
    // stdout); srpd's LUN logs in again through it and the same file
    // reads back what is written, within a bounded wait (I/O waits for
    // the reconnect, which is tried every 300 ms, and fails after 30 s).
    target.wait_line("the NIC daemon at", 60);
    target.wait_line("the NIC daemon is back: target", 60);
    comes_back(&lun, 11);
    let list = srp(&srpd_sock, &["list"]);
    assert!(list.status.success(), "{}", text(&list));
    assert!(text(&list).contains("tgt"), "{}", text(&list));
    // Both are clients of the new daemon.
    assert_nicd_clients(&sock, &[("srptd", &target), ("srpd", &srpd)]);
    log_out_and_stop(&srpd_sock, srpd, target, &dir, &sock);
}

const SM: &str = "127.127.28.11";
const T: &str = "127.127.28.12";
const I: &str = "127.127.28.13";

/// A daemon with `ib` ports at SM, T and I, and an SM on SM's port.
fn ib_subnet(sock: &std::path::Path) -> (Proc, Proc) {
    let daemon = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args([
                "--fabric", "ib", "--ip", SM, "--ip", T, "--ip", I, "--socket",
            ])
            .arg(sock)
            .env("SOFTROCE_FOLLOW_LINK", "0"),
    );
    daemon.wait_line("serving", 60);
    let sm = Proc::start(
        "ibsm",
        tool(ibsm_bin())
            .args(["run", "--addr", SM, "--node", T, "--node", I, "--nicd"])
            .arg(sock)
            .args(["--sweep-interval-ms", "200", "--timeout-ms", "100"]),
    );
    sm.wait_line("ibsm: SM and SA at 127.127.28.11", 30);
    (daemon, sm)
}

/// srpd on the daemon's `ib` port, logged in by the SA's path: after
/// `kill -9` of the daemon, a new daemon and a new SM, its port joins
/// the subnet anew (it says so) and its LUN file verifies again.
#[test]
fn srpd_on_the_ib_fabric_joins_again_after_the_daemon_restarts() {
    if !rdma_testkit::need::part("nicd restart under srpd on ib").fuse() {
        return;
    }
    let sock = sock_of("nicd_restart", "nicd-ib");
    let _ = std::fs::remove_file(&sock);
    let (daemon, sm) = ib_subnet(&sock);
    let ib = ["--fabric", "ib", "--sm-wait-ms", "20000"];
    let target = srptd_through(&sock, "srptd-ib", &[&ib[..], &["--ip", T]].concat());
    let (srpd, dir, root, srpd_sock) = srpd_through(
        &sock,
        "nicd_restart_ib",
        &[&ib[..], &["--ip", I]].concat(),
        "60",
    );
    // The login string by the SA's records, as srp_daemon finds it.
    let login = sa_login_string(&sock, I, T);
    let l = srp(&srpd_sock, &["login", &login, "--name", "tgt"]);
    assert!(l.status.success(), "{}", text(&l));
    let lun = root.join("tgt/lun0");
    write_read_back(&lun, 5);

    // kill -9 of the daemon; the SM on it goes too.
    kill_9(daemon);
    drop(sm);
    srpd.wait_line("the NIC daemon's ib port went away", 60);
    let (_daemon, _sm) = ib_subnet(&sock);
    srpd.wait_line("the NIC daemon's ib port is back on the subnet", 90);
    comes_back(&lun, 13);
    assert_nicd_clients(&sock, &[("srptd", &target), ("srpd", &srpd)]);
    log_out_and_stop(&srpd_sock, srpd, target, &dir, &sock);
}
