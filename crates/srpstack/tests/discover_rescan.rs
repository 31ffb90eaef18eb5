//! srp_daemon's continuous mode: `srp discover --rescan N --login` walks
//! its target addresses every N seconds and hands srpd the targets that
//! appeared since, never one it already holds; SIGTERM stops it.
//!
//! Skipped when the machine lacks FUSE, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::Proc;
use std::path::Path;

fn srptd(ip: &str, sock: &Path) -> Proc {
    let p = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--ip", ip, "--ram-mib", "8"])
            .arg("--control-socket")
            .arg(sock),
    );
    p.wait_line("listening on", 20);
    p
}

#[test]
fn rescans_log_in_to_targets_that_appear_and_only_once() {
    if !rdma_testkit::need::fuse() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-rescan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let _first = srptd("127.0.119.1", &dir.join("t1.sock"));
    let sock = dir.join("srpd.sock");
    let srpd = Proc::start(
        "srpd",
        common::tool(common::srpd_bin())
            .args(["--ip", "127.0.119.3"])
            .arg("--mount-root")
            .arg(&root)
            .arg("--control-socket")
            .arg(&sock),
    );
    srpd.wait_line("srpd: ready on", 20);

    let mut discover = Proc::start(
        "srp discover",
        common::tool(common::srp_bin())
            .args([
                "discover",
                "--target",
                "127.0.119.1",
                "--target",
                "127.0.119.2",
            ])
            .args([
                "--ip",
                "127.0.119.4",
                "--timeout-ms",
                "100",
                "--rescan",
                "1",
            ])
            .args(["--login", "-v", "--control-socket"])
            .arg(&sock),
    );
    // Scan 1: the first target is there and is logged in; nobody at .2 yet.
    let l = discover.wait_line("# logged in as", 30);
    assert!(l.ends_with("t0"), "{l}");
    // Two more scans pass without a second login of it.
    discover.wait_line("# scan 3", 30);
    // The second target appears and the next scan logs in to it.
    let _second = srptd("127.0.119.2", &dir.join("t2.sock"));
    let l = discover.wait_line("# logged in as", 30);
    assert!(l.ends_with("t1"), "{l}");
    discover.term();
    let rest = discover.rest(30);
    assert!(rest.iter().any(|l| l.contains("stopped after")), "{rest:?}");
    assert!(
        !rest.iter().any(|l| l.contains("logged in as")),
        "logged in again: {rest:?}"
    );
    let status = discover.child.wait().unwrap();
    assert!(status.success());
    // srpd holds exactly the two logins, one per target.
    let out = common::tool(common::srp_bin())
        .args(["list", "--json", "--control-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets.len(), 2, "{v}");
    assert!(targets
        .iter()
        .any(|t| t.contains("dgid=00000000000000000000ffff7f007701")));
    assert!(targets
        .iter()
        .any(|t| t.contains("dgid=00000000000000000000ffff7f007702")));
    assert!(root.join("t0/lun0").exists() && root.join("t1/lun0").exists());
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
}
