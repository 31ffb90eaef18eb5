//! SRP between two processes over the soft RoCE NIC: `srptd` serves logins
//! by RDMA CM on one loopback address, `srp io` logs in from another.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn srptd(ip: &str) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_srptd"))
        .args(["--ip", ip, "--ram-mib", "16", "--control-socket"])
        .arg(std::env::temp_dir().join(format!("srptd-two-{}-{ip}.sock", std::process::id())))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start srptd");
    let out = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(out).lines();
    let first = lines.next().expect("srptd prints a line").expect("utf-8");
    assert!(first.contains("listening on"), "{first}");
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Daemon(child)
}

#[test]
fn login_by_rdma_cm_and_verified_io_between_processes() {
    let _d = srptd("127.0.99.1");
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args([
            "io",
            "--dest",
            "127.0.99.1:5555",
            "--ip",
            "127.0.99.2",
            "--size",
            "8388608",
            "--region",
            "2097152",
            "--json",
        ])
        .output()
        .expect("run srp");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(r["verify_failures"], 0, "{r}");
    assert_eq!(r["io_errors"], 0, "{r}");
    assert!(r["verified_bytes"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        r["read"]["bytes"].as_u64().unwrap() + r["write"]["bytes"].as_u64().unwrap(),
        8 << 20
    );

    // A port nobody listens on: the CM refuses, and the user is told why.
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["io", "--dest", "127.0.99.1:5556", "--ip", "127.0.99.3"])
        .output()
        .expect("run srp");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("open LUN 0 over 127.0.99.3 -> 127.0.99.1:5556: login:")
            && err.contains("invalid service ID"),
        "{err}"
    );

    // The same target by IB CM: service ID = ioc_guid, the 64-byte login
    // as the REQ private data (ib_srp's service_id=).
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["io", "--dest", "127.0.99.1:5555", "--ip", "127.0.99.4"])
        .args([
            "--service-id",
            "0002c90300a00001",
            "--size",
            "4194304",
            "--json",
        ])
        .output()
        .expect("run srp");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(
        (r["verify_failures"].as_u64(), r["io_errors"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    assert!(r["verified_bytes"].as_u64().unwrap() > 0, "{r}");
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["io", "--dest", "127.0.99.1:5555", "--ip", "127.0.99.5"])
        .args(["--service-id", "1234"])
        .output()
        .expect("run srp");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid service ID"), "{err}");
}

#[test]
fn abort_task_under_io_is_answered_and_loses_nothing() {
    let _d = srptd("127.0.99.21");
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["io", "--dest", "127.0.99.21:5555", "--ip", "127.0.99.22"])
        .args(["--bs", "1048576", "--iodepth", "8", "--size", "67108864"])
        .args(["--region", "8388608", "--abort-every-ms", "20"])
        .output()
        .expect("run srp");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" 0 verify failures, 0 I/O errors"), "{text}");
    // "srp: ABORT TASK asked N times: C function complete, F failed ..."
    let line = text
        .lines()
        .find(|l| l.starts_with("srp: ABORT TASK asked "))
        .unwrap_or_else(|| panic!("no abort summary in\n{text}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (asked, complete, failed, resets) = (nums[0], nums[1], nums[2], nums[4]);
    assert!(asked > 0 && complete + failed > 0, "{line}");
    // Our target answers ABORT TASK FUNCTION COMPLETE whether or not the
    // command was still there (SAM-5 7.2), so no abort fails and nothing
    // escalates to a LUN reset.
    assert_eq!((failed, resets), (0, 0), "{line}");
    println!("{line}");
}
