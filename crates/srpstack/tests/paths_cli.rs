//! `srp io` over two paths, as a user runs it: two `srptd` processes
//! (127.0.89.1 and .3) export the same fileio image under the same device
//! name, so the LU has the same NAA behind both, and `srp io` is given
//! both (`--dest` twice, one `--ip` each). One daemon is SIGKILLed while
//! the verified workload runs: the workload finishes on the other path
//! with no error and no bad data.

mod common;

use common::Proc;
use std::process::Command;
use std::time::{Duration, Instant};

fn srptd(dir: &std::path::Path, ip: &str, tag: &str) -> (Proc, std::path::PathBuf) {
    let sock = dir.join(format!("{tag}.sock"));
    let cfg = dir.join(format!("{tag}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"{ip}\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"shared0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"16M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"shared0\"\n",
            sock.display(),
            dir.join("shared0.img").display()
        ),
    )
    .unwrap();
    let p = Proc::start(
        "srptd",
        Command::new(env!("CARGO_BIN_EXE_srptd"))
            .arg("--config")
            .arg(&cfg),
    );
    p.wait_line("listening on", 20);
    (p, sock)
}

/// Commands `srptd` behind `sock` has accepted (`srptadm sessions`).
fn commands(sock: &std::path::Path) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_srptadm"))
        .arg("--socket")
        .arg(sock)
        .args(["--json", "sessions"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s["commands"].as_u64()).sum())
        .unwrap_or(0)
}

#[test]
fn srp_io_over_two_paths_survives_one_target_killed() {
    let dir = std::env::temp_dir().join(format!("srp-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut a, sock_a) = srptd(&dir, "127.0.89.1", "a");
    let (_b, sock_b) = srptd(&dir, "127.0.89.3", "b");

    let io = Proc::start(
        "srp io",
        Command::new(env!("CARGO_BIN_EXE_srp")).args([
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
    assert!(first.contains("(2 paths)"), "{first}");
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
    assert!(rest.contains(" 0 verify failures, 0 I/O errors"), "{rest}");
    let verified: u64 = rest
        .split("verified ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a verified-bytes figure");
    assert!(verified >= 4 << 20, "{rest}");
    let mut io = io;
    assert!(io.child.wait().unwrap().success(), "{rest}");
    let _ = std::fs::remove_dir_all(&dir);
}
