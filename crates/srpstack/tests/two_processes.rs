//! SRP between two processes over the soft RoCE NIC: `srptd` serves logins
//! by RDMA CM on one loopback address, `srp io` logs in from another.

mod common;
use common::report;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Log = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// The control socket of the test's `srptd` on `ip`.
fn control_socket(ip: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("srptd-two-{}-{ip}.sock", std::process::id()))
}

/// `srptd` on `ip` with a 16 MiB RAM LUN, listening; its log after the
/// first line is the caller's to read.
fn srptd_logging(ip: &str) -> (Daemon, Log) {
    let mut child = common::tool(common::srptd_bin())
        .args(["--ip", ip, "--ram-mib", "16", "--control-socket"])
        .arg(control_socket(ip))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start srptd");
    let out = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(out).lines();
    let first = lines.next().expect("srptd prints a line").expect("utf-8");
    assert!(first.contains("listening on"), "{first}");
    (Daemon(child), lines)
}

fn srptd(ip: &str) -> Daemon {
    let (d, mut lines) = srptd_logging(ip);
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    d
}

#[test]
fn login_by_rdma_cm_and_verified_io_between_processes() {
    let _d = srptd("127.0.99.1");
    let out = common::tool(common::srp_bin())
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
    let out = common::tool(common::srp_bin())
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
    let out = common::tool(common::srp_bin())
        .args(["io", "--dest", "127.0.99.1:5555", "--ip", "127.0.99.4"])
        .args([
            "--service-id",
            // srptd's ioc_guid: 0002c903 and its address, 127.0.99.1.
            "0002c9037f006301",
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
    let out = common::tool(common::srp_bin())
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
    let out = common::tool(common::srp_bin())
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
    report::verified_clean(&text);
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

/// Two hosts running `srp` with the defaults (initiator_ext 1) are two
/// initiators to the target: each port's GUID comes from its address, so
/// their initiator port IDs differ and both stay logged in. With one GUID
/// for every host they were one initiator, and each SINGLE login ended
/// the other's channel, so the target never held both.
#[test]
fn two_hosts_with_default_names_stay_logged_in_side_by_side() {
    let target = "127.0.98.1";
    let _d = srptd(target);
    let sock = control_socket(target);
    let hosts = ["127.0.98.2", "127.0.98.3"];
    // Far more I/O than the test waits for: each is stopped once seen.
    let mut io: Vec<_> = hosts
        .iter()
        .map(|ip| {
            common::tool(common::srp_bin())
                .args(["io", "--dest", "127.0.98.1:5555", "--ip", ip])
                .args(["--size", "68719476736", "--region", "1048576"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Daemon)
                .expect("run srp")
        })
        .collect();
    let name = |ip: &str| {
        let guid = rnic::softroce::ip_guid(ip.parse().unwrap()).0;
        format!("0x{:016x}{guid:016x}", 1)
    };
    let want: std::collections::BTreeSet<String> = hosts.iter().map(|ip| name(ip)).collect();
    let initiators = || -> std::collections::BTreeSet<String> {
        srptd::daemon::request(&sock, &srptd::daemon::Request::Sessions)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s["initiator"].as_str().map(str::to_string))
            .collect()
    };
    let t0 = std::time::Instant::now();
    let mut seen = initiators();
    while seen != want && t0.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        seen = initiators();
    }
    assert_eq!(seen, want, "the target's sessions");
    // Both still running: neither gave up on a login.
    for d in &mut io {
        assert!(d.0.try_wait().unwrap().is_none(), "an srp io ended early");
    }
}

/// A login that names another target port (an initiator still using an
/// old id_ext/ioc_guid, say) is refused, and srptd's log names both the
/// port it asked for and this one.
#[test]
fn a_login_to_another_target_port_id_is_refused_and_logged_with_both_ids() {
    let ip = "127.0.98.11";
    let (_d, lines) = srptd_logging(ip);
    let out = common::tool(common::srp_bin())
        .args(["io", "--dest", "127.0.98.11:5555", "--ip", "127.0.98.12"])
        .args([
            "--id-ext",
            "0002c90300a00001",
            "--ioc-guid",
            "0002c90300a00001",
        ])
        .args(["--size", "1048576"])
        .output()
        .expect("run srp");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unable to associate RDMA channel"), "{err}");
    // srptd logs the refusal before the initiator hears of it.
    let rejected = lines
        .map_while(Result::ok)
        .find(|l| l.contains("rejected"))
        .expect("a rejection in srptd's log");
    let ours = rnic::softroce::ip_guid(ip.parse().unwrap()).0;
    assert!(
        rejected.contains("it names target port id_ext 0002c90300a00001 ioc_guid 0002c90300a00001")
            && rejected.contains(&format!(
                "this port is id_ext {ours:016x} ioc_guid {ours:016x}"
            )),
        "{rejected}"
    );
}
