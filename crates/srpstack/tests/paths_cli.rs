//! `srp io` over two paths, as a user runs it: two `srptd` processes
//! (127.0.89.1 and .3) export the same fileio image under the same device
//! name, so the LU has the same NAA behind both, and `srp io` is given
//! both (`--dest` twice, one `--ip` each). One daemon is SIGKILLed while
//! the verified workload runs: the workload finishes on the other path
//! with no error and no bad data.
//!
//! And `srp io --ch-count 4`: four channels of one I_T nexus (channel 0
//! SINGLE, the others MULTI, as ib_srp logs in), all carrying commands.

mod common;

use common::Proc;
use std::process::Command;
use std::time::{Duration, Instant};

/// `srptadm --json sessions` of the `srptd` behind `sock`.
fn sessions(sock: &std::path::Path) -> Vec<serde_json::Value> {
    let out = Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(sock)
        .args(["--json", "sessions"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().cloned().unwrap_or_default()
}

/// Commands `srptd` behind `sock` has accepted.
fn commands(sock: &std::path::Path) -> u64 {
    sessions(sock)
        .iter()
        .filter_map(|s| s["commands"].as_u64())
        .sum()
}

#[test]
fn srp_io_over_two_paths_survives_one_target_killed() {
    let dir = std::env::temp_dir().join(format!("srp-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut a, sock_a) = common::srptd_sharing(&dir, "127.0.89.1", "a");
    let (_b, sock_b) = common::srptd_sharing(&dir, "127.0.89.3", "b");

    let io = Proc::start(
        "srp io",
        common::tool(common::srp_bin()).args([
            "io",
            "--dest",
            "127.0.89.1:5555",
            "--ip",
            "127.0.89.2",
            "--dest",
            "127.0.89.3:5555",
            "--ip",
            "127.0.89.4",
            "--path-policy",
            "round-robin",
            "--reconnect-delay",
            "1",
            "--region",
            "4194304",
            "--size",
            "41943040",
        ]),
    );
    let first = io.wait_line("srp: logged in", 30);
    assert!(first.contains("(2 paths, 1 channel each)"), "{first}");
    // Both daemons serve commands (round robin), then A dies.
    let end = Instant::now() + Duration::from_secs(60);
    while commands(&sock_a) < 500 || commands(&sock_b) < 500 {
        assert!(Instant::now() < end, "round robin did not use both paths");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed = Instant::now();
    let rest = io.rest(120).join("\n");
    println!(
        "{first}\n{rest}\n(srp io finished {:?} after the kill)",
        killed.elapsed()
    );
    let verified = common::report::verified_clean(&rest);
    assert!(verified >= 4 << 20, "{rest}");
    let mut io = io;
    assert!(io.child.wait().unwrap().success(), "{rest}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn srp_io_spreads_over_four_channels_of_one_nexus() {
    let dir = std::env::temp_dir().join(format!("srp-chan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_d, sock) = common::srptd_sharing(&dir, "127.0.89.11", "c");
    let io = Proc::start(
        "srp io",
        common::tool(common::srp_bin()).args([
            "io",
            "--dest",
            "127.0.89.11:5555",
            "--ip",
            "127.0.89.12",
            "--ch-count",
            "4",
            "--iodepth",
            "8",
            "--region",
            "4194304",
            "--size",
            "41943040",
        ]),
    );
    let first = io.wait_line("srp: logged in", 30);
    assert!(first.contains("4 channels each"), "{first}");
    // While it runs: four sessions of one initiator, each with commands.
    let end = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let s = sessions(&sock);
        let busy = s
            .iter()
            .filter(|x| x["commands"].as_u64().unwrap_or(0) >= 100)
            .count();
        if busy == 4 {
            break s;
        }
        assert!(Instant::now() < end, "not 4 busy channels: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let names: std::collections::HashSet<_> =
        seen.iter().map(|x| x["initiator"].to_string()).collect();
    assert_eq!(names.len(), 1, "one I_T nexus: {seen:?}");
    let rest = io.rest(120).join("\n");
    common::report::verified_clean(&rest);
    let mut io = io;
    assert!(io.child.wait().unwrap().success(), "{rest}");
    let _ = std::fs::remove_dir_all(&dir);
}
