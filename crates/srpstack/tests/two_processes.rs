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
        .arg(std::env::temp_dir().join(format!("srptd-two-{}.sock", std::process::id())))
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
