//! One address, one NIC daemon, on a managed subnet (issue 27): on
//! 127.97.0.1 `nicd --fabric ib` owns the soft RoCE NIC and runs the
//! port's SMA; `ibsm` (the SM and SA, QP0 lent by the daemon's SMA),
//! `srptd` (its DM agent and logins at the daemon's QP1), `srp discover
//! --sa` (the SA's records, then srptd's DM agent), `srpd` (logged in to
//! srptd by the string discovery printed, its LUN a file under its mount
//! root) and `rperf server`/`client` all run at once through the daemon;
//! `saquery --nicd` asks the same SA from the same port.
//! fio verifies srpd's LUN file while `rperf --verify` runs, and the
//! daemon lists every one of them among its clients. Without the daemon
//! each would need an address of its own. Skipped without FUSE or fio (a
//! failure under `CI=true`).
//!
//! Addresses: 127.97.0.1 only (no other test uses 127.97.0.0/16).

mod common;

use common::{
    assert_nicd_clients, bin_of, ibsm_bin, sa_login_string, sock_of, srp, srp_bin, srptd_bin,
    start_srpd, text, tool, Proc,
};
use std::process::Command;

const IP: &str = "127.97.0.1";

#[test]
fn sm_target_initiator_discovery_and_rperf_on_one_address() {
    if !rdma_testkit::need::fuse() || !rdma_testkit::need::tools(&["fusermount3", "fio"]) {
        return;
    }
    let sock = sock_of("nicd_one_address", "nicd");
    let _ = std::fs::remove_file(&sock);
    let nicd = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--fabric", "ib", "--ip", IP, "--socket"])
            .arg(&sock)
            .env("SOFTROCE_FOLLOW_LINK", "0"),
    );
    nicd.wait_line("nicd: serving 127.97.0.1", 30);

    // The SM on the daemon's port: the port it manages is its own, the
    // one every other tool here uses.
    let sm = Proc::start(
        "ibsm",
        tool(ibsm_bin())
            .args(["run", "--addr", IP, "--node", IP, "--nicd"])
            .arg(&sock)
            .args(["--sweep-interval-ms", "200", "--timeout-ms", "100"]),
    );
    sm.wait_line("ibsm: SM and SA at 127.97.0.1 (LID 1)", 30);

    let target = Proc::start(
        "srptd",
        tool(srptd_bin())
            .arg("--nicd")
            .arg(&sock)
            .args(["--fabric", "ib", "--sm-wait-ms", "10000"])
            .args(["--ip", IP, "--ram-mib", "32", "--control-socket"])
            .arg(sock_of("nicd_one_address", "srptd")),
    );
    let l = target.wait_line("ACTIVE on the managed subnet", 30);
    assert!(l.contains("LID 1"), "{l}");
    target.wait_line("listening on", 30);

    let perf_server = Proc::start(
        "rperf server",
        tool(bin_of("rperf"))
            .args(["server", "--nicd"])
            .arg(&sock)
            .args(["--bind", "127.97.0.1:4791", "--oob", "127.97.0.1:18797"]),
    );
    perf_server.wait_line("listening on 127.97.0.1:18797", 30);

    // Discovery through the SA (the SM's, on this very port) finds srptd's
    // I/O controller at the daemon's QP1.
    let login = sa_login_string(&sock, IP, IP);

    // saquery at the daemon's port: its SA by default (the port's SM),
    // which lists the port as one with device management (srptd's).
    let q = tool(bin_of("saquery"))
        .args(["--nicd"])
        .arg(&sock)
        .args(["--ip", IP, "ports", "--dm"])
        .output()
        .unwrap();
    let out = text(&q);
    assert!(q.status.success(), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("1 ") && l.contains("ACTIVE")),
        "{out}"
    );
    assert!(out.contains("1 port records"), "{out}");

    // srpd logs in by that string, along the SA's path.
    let dir = std::env::temp_dir().join(format!("nicd_one_address-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let srpd_sock = dir.join("srpd.sock");
    let nicd_arg = sock.to_str().unwrap();
    let srpd = start_srpd(
        IP,
        &root,
        &srpd_sock,
        &[
            "--nicd",
            nicd_arg,
            "--fabric",
            "ib",
            "--sm-wait-ms",
            "10000",
        ],
    );
    let out = srp(&srpd_sock, &["login", &login, "--name", "tgt"]);
    assert!(out.status.success(), "{}", text(&out));

    // fio verifies the LUN file while rperf verifies its WRITEs.
    let lun = root.join("tgt/lun0");
    let fio = Command::new("fio")
        .args(["--name=one-address", "--rw=randrw", "--bs=4k", "--size=16m"])
        .arg(format!("--filename={}", lun.display()))
        .args(["--direct=1", "--ioengine=psync"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_state_save=0"])
        .arg("--output-format=json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let perf = tool(bin_of("rperf"))
        .args(["client", "--nicd"])
        .arg(&sock)
        .args(["--bind", "127.97.0.1:4791", "--server", "127.97.0.1:18797"])
        .args(["--iters", "2000", "--verify"])
        .output()
        .unwrap();
    let fio = fio.wait_with_output().unwrap();
    let (fio_out, perf_out) = (
        text(&fio),
        String::from_utf8_lossy(&perf.stdout).into_owned(),
    );
    assert!(fio.status.success(), "{fio_out}");
    let at = fio_out.find("\n{").map_or(0, |i| i + 1);
    let end = fio_out.rfind('}').map_or(fio_out.len(), |i| i + 1);
    let v: serde_json::Value = serde_json::from_str(&fio_out[at..end])
        .unwrap_or_else(|e| panic!("fio JSON: {e}\n{fio_out}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let moved = job["read"]["io_bytes"].as_u64().unwrap_or(0)
        + job["write"]["io_bytes"].as_u64().unwrap_or(0);
    assert!(moved >= 16 << 20, "fio moved {moved} bytes");
    assert!(perf.status.success(), "{}", text(&perf));
    let row = perf_out
        .lines()
        .find(|l| l.trim_start().starts_with("write"))
        .unwrap_or_else(|| panic!("no result row: {perf_out}"));
    assert!(row.trim_end().ends_with("yes"), "not verified: {row}");

    // One daemon served them all.
    assert_nicd_clients(&sock, &[("ibsm", &sm), ("srptd", &target), ("srpd", &srpd)]);
    let out = srp(&srpd_sock, &["logout", "tgt"]);
    assert!(out.status.success(), "{}", text(&out));
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
    drop(perf_server);
    drop(target);
    drop(sm);
    drop(nicd);
    let _ = std::fs::remove_file(&sock);
}

/// `--fabric ib` at an address a daemon serves on the `roce` fabric: each
/// tool says in one line that the daemon's port there is on the other
/// fabric and what to do, instead of waiting for an SM that cannot come
/// (127.97.0.2); saquery, which takes either, finds no SM to ask.
#[test]
fn the_ib_fabric_on_a_roce_daemon_is_refused_in_words() {
    let sock = sock_of("nicd_one_address_roce", "nicd");
    let _ = std::fs::remove_file(&sock);
    let nicd = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--ip", "127.97.0.2", "--socket"])
            .arg(&sock),
    );
    nicd.wait_line("nicd: serving 127.97.0.2", 30);
    let want = "the NIC daemon serves 127.97.0.2 on the roce fabric, not the ib one, and no \
                subnet manager runs there: give this tool another address (the daemon adds an \
                ib port there), or --own-nic";
    let target = tool(srptd_bin())
        .arg("--nicd")
        .arg(&sock)
        .args(["--fabric", "ib", "--ip", "127.97.0.2", "--ram-mib", "8"])
        .arg("--control-socket")
        .arg(sock_of("nicd_one_address_roce", "srptd"))
        .output()
        .unwrap();
    assert!(!target.status.success());
    assert!(text(&target).contains(want), "{}", text(&target));
    let found = tool(srp_bin())
        .args(["discover", "--sa", "--nicd"])
        .arg(&sock)
        .args(["--ip", "127.97.0.2"])
        .output()
        .unwrap();
    assert!(!found.status.success());
    assert!(text(&found).contains(want), "{}", text(&found));
    // saquery has no SM to default to there.
    let q = tool(bin_of("saquery"))
        .arg("--nicd")
        .arg(&sock)
        .args(["--ip", "127.97.0.2", "nodes"])
        .output()
        .unwrap();
    assert!(!q.status.success());
    assert!(
        text(&q).contains("the NIC daemon's port at 127.97.0.2 knows no SM")
            && text(&q).contains("give --sa ADDRESS"),
        "{}",
        text(&q)
    );
    drop(nicd);
    let _ = std::fs::remove_file(&sock);
}
