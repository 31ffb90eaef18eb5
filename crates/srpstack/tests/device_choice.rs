//! `--device` on srptd and srp where no rdma-core device can be used
//! (this host's kernel has no RDMA; CI's machines may lack libibverbs
//! too): every way it cannot work ends at once with one line naming the
//! cause and the fix, never a panic or a wait. The device path itself is
//! proven against Linux rxe in the VMs (interop scenarios
//! vm-srp-rdmacore, vm-srp-rdmacore-initiator).

mod common;
use common::run;

use std::process::Command;
use std::time::{Duration, Instant};

/// What a device that cannot be used may be told as, whatever this
/// machine has: libibverbs missing (the package named), no RDMA in the
/// kernel (the module named), or no such device (the ones there are).
fn says_why_the_device_cannot_be_used(out: &str) -> bool {
    out.contains("apt-get install libibverbs1")
        || out.contains("no RDMA in this kernel")
        || out.contains("no RDMA device named rxe9")
}

/// The last non-empty line of `out` (the error), and that there is one
/// error line, not a backtrace.
fn error_line(out: &str) -> &str {
    assert!(!out.contains("panicked"), "{out}");
    out.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

#[test]
fn srptd_on_a_device_it_cannot_use_says_why_at_once() {
    let bin = common::srptd_bin();
    let start = Instant::now();
    let (ok, out) = run(Command::new(bin).args([
        "--device",
        "rxe9",
        "--control-socket",
        common::sock_of("device-choice", "srptd").to_str().unwrap(),
    ]));
    assert!(!ok, "{out}");
    assert!(start.elapsed() < Duration::from_secs(10), "{out}");
    let line = error_line(&out);
    assert!(says_why_the_device_cannot_be_used(line), "{out}");
}

#[test]
fn srptd_refuses_a_device_spec_it_cannot_parse() {
    let (ok, out) = run(common::tool(common::srptd_bin()).args(["--device", "rxe0:0"]));
    assert!(!ok, "{out}");
    assert!(out.contains("from 1 to 255"), "{out}");
}

#[test]
fn srp_on_a_device_needs_the_target_port_id_and_a_usable_device() {
    // Without --id-ext: said before any device is looked at.
    let (ok, out) = run(common::tool(common::srp_bin()).args([
        "io",
        "--device",
        "rxe9",
        "--dest",
        "127.0.0.1:5555",
    ]));
    assert!(!ok, "{out}");
    assert!(
        error_line(&out).contains("with --device, give the target's --id-ext"),
        "{out}"
    );

    // With it: the device cannot be used here, said in one line.
    let bin = common::srp_bin();
    let start = Instant::now();
    let (ok, out) = run(Command::new(bin).args([
        "io",
        "--device",
        "rxe9",
        "--dest",
        "127.0.0.1:5555",
        "--id-ext",
        "505400fffe77000b",
    ]));
    assert!(!ok, "{out}");
    assert!(start.elapsed() < Duration::from_secs(10), "{out}");
    assert!(
        says_why_the_device_cannot_be_used(error_line(&out)),
        "{out}"
    );

    // IB CM is not served on a device yet: said, not tried.
    let (ok, out) = run(common::tool(common::srp_bin()).args([
        "luns",
        "--device",
        "rxe9",
        "--dest",
        "127.0.0.1:5555",
        "--id-ext",
        "1",
        "--service-id",
        "1",
    ]));
    assert!(!ok, "{out}");
    assert!(
        error_line(&out).contains("IB CM logins are not served on rdma-core device rxe9")
            && error_line(&out).contains("dest=ip:port"),
        "{out}"
    );
}
