//! The NIC daemon started on demand by the tools (issue 27): srptd
//! given `--nicd` finds no daemon on the socket, starts `nicd` (the one
//! beside it) for its address and says so in one line; `srp discover
//! --nicd` then finds that daemon and starts none; once srptd is gone
//! the daemon leaves after its idle time (`NICD_IDLE_EXIT`), removing
//! its socket.
//!
//! Addresses: 127.127.29.1 only.

mod common;

use common::{bin_of, sock_of, srp_bin, srptd_bin, tool, wait_for, Proc};
use std::process::{Command, Stdio};

const IP: &str = "127.127.29.1";

#[test]
fn srptd_starts_the_daemon_and_srp_uses_it() {
    // The daemon the tools run is the one beside them.
    let _ = bin_of("nicd");
    let sock = sock_of("nicd_ondemand", "nicd");
    let _ = std::fs::remove_file(&sock);
    // `<socket>.log` and `<socket>.lock` (nicd::ondemand).
    let log = std::path::PathBuf::from(format!("{}.log", sock.display()));
    let lock = std::path::PathBuf::from(format!("{}.lock", sock.display()));
    let _ = std::fs::remove_file(&log);
    let err_path = sock.with_extension("srptd-stderr");
    let err = std::fs::File::create(&err_path).unwrap();
    let target = Proc::start(
        "srptd",
        tool(srptd_bin())
            .arg("--nicd")
            .arg(&sock)
            .args(["--ip", IP, "--ram-mib", "16", "--control-socket"])
            .arg(sock_of("nicd_ondemand", "srptd"))
            .env("NICD_IDLE_EXIT", "1s")
            .stderr(Stdio::from(err)),
    );
    target.wait_line("listening on 127.127.29.1:5555", 60);
    let said = std::fs::read_to_string(&err_path).unwrap();
    let started: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("srptd: started the NIC daemon ("))
        .collect();
    assert_eq!(started.len(), 1, "{said}");
    assert!(
        started[0].contains("leaves after 1s without a client"),
        "{said}"
    );

    let found = tool(srp_bin())
        .args(["discover", "--nicd"])
        .arg(&sock)
        .args(["--ip", IP, "--target", IP])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&found.stdout),
        String::from_utf8_lossy(&found.stderr),
    );
    assert!(found.status.success(), "{out}{err}");
    assert!(out.contains("id_ext=0002c9037f7f1d01"), "{out}");
    assert!(!err.contains("started the NIC daemon"), "{err}");

    // ibstat lists the daemon's CA and its clients: srptd, with what it
    // holds.
    let stat = tool(bin_of("ibstat"))
        .arg("--nicd")
        .arg(&sock)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&stat.stdout);
    assert!(
        stat.status.success(),
        "{listed}{}",
        String::from_utf8_lossy(&stat.stderr)
    );
    assert!(listed.contains("CA 'nicd 127.127.29.1'"), "{listed}");
    assert!(listed.contains("State: Active"), "{listed}");
    let srptd_line = listed
        .lines()
        .find(|l| l.contains(&format!("pid {} ", target.child.id())))
        .unwrap_or_else(|| panic!("srptd is no client: {listed}"));
    // Its QP1 place at the daemon, and its own QPs on a block of the
    // NIC's port.
    assert!(
        srptd_line.contains("(srptd)")
            && srptd_line.contains(" QP")
            && srptd_line.contains("its own QPs on"),
        "{srptd_line}"
    );

    // srptd gone: no client left, the daemon leaves within its idle
    // time and takes its socket with it.
    drop(target);
    wait_for("the daemon to leave", 60, || !sock.exists());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("no client for 1s: leaving"), "{said}");
    for p in [err_path, log, lock] {
        let _ = std::fs::remove_file(p);
    }
}

/// `srpstack bench --nicd`: both ends' NICs in a daemon it starts for
/// their two addresses; every read verified. (Addresses 127.127.29.2
/// and .3.)
#[test]
fn bench_runs_through_a_daemon_it_starts() {
    let _ = bin_of("nicd");
    let sock = sock_of("nicd_ondemand", "bench");
    let _ = std::fs::remove_file(&sock);
    let out = Command::new(env!("CARGO_BIN_EXE_srpstack"))
        .args(["bench", "--nicd"])
        .arg(&sock)
        .args([
            "--target-ip",
            "127.127.29.2",
            "--initiator-ip",
            "127.127.29.3",
        ])
        .args(["--ram", "16M", "--rw", "randrw", "--iodepth", "8"])
        .args(["--ios", "2000", "--verify"])
        .env("NICD_IDLE_EXIT", "1s")
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}{se}");
    assert!(se.contains("srpstack: started the NIC daemon ("), "{se}");
    assert!(so.contains(", 0 verify failures, 0 I/O errors"), "{so}");
    wait_for("the daemon to leave", 60, || !sock.exists());
    for ext in ["log", "lock"] {
        let _ = std::fs::remove_file(format!("{}.{ext}", sock.display()));
    }
}
