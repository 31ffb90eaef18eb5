//! `srpd --device` where this host can run it: the refusals that come
//! before any device is touched, and a device that cannot be opened (no
//! libibverbs, or no RDMA in the kernel: test hosts have neither rxe nor
//! an RDMA NIC), which must end srpd with one line saying why and leave
//! no control socket behind. Logins through a device are proven in the
//! project's VMs (`interop/run scenario vm-srp-rdmacore-initiator`).

use std::path::PathBuf;
use std::process::{Command, Output};

/// A scratch directory with a mount root in it.
fn scratch(tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("srpd-device-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    (dir, root)
}

fn srpd(dir: &std::path::Path, root: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_srpd"))
        .env("NICD_MODE", "own")
        .args(args)
        .arg("--mount-root")
        .arg(root)
        .arg("--control-socket")
        .arg(dir.join("srpd.sock"))
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_device_that_cannot_open_ends_srpd_in_one_line_without_a_socket_left() {
    let (dir, root) = scratch("open");
    // No device has this name on any host.
    let o = srpd(&dir, &root, &["--device", "nosuchdev9:1"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{e}");
    let line = lines[0];
    assert!(line.starts_with("srpd: "), "{line}");
    // Whichever step this host fails at, the line names the cause and
    // what to do about it.
    let said = [
        // No libibverbs: the package to install.
        "apt-get install libibverbs1",
        // libibverbs, but no RDMA in this kernel.
        "load ib_uverbs",
        // RDMA, but no such device: the devices there are.
        "no RDMA device named nosuchdev9",
    ];
    assert!(said.iter().any(|s| line.contains(s)), "{line}");
    assert!(
        !dir.join("srpd.sock").exists(),
        "control socket left behind"
    );
    assert!(String::from_utf8_lossy(&o.stdout).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ib_fabric_is_refused_with_a_device_before_it_is_opened() {
    let (dir, root) = scratch("ib");
    let o = srpd(&dir, &root, &["--device", "rxe0", "--fabric", "ib"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.starts_with("srpd: --fabric ib runs our soft RoCE ports")
            && e.trim_end().ends_with("drop --fabric ib to use --device"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_name_that_is_no_name_is_a_usage_error() {
    let (dir, root) = scratch("name");
    for bad in ["rxe 0", "rxe0:0"] {
        let o = srpd(&dir, &root, &["--device", bad]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {e}");
        assert!(
            e.contains("--device") && (e.contains("NAME:PORT") || e.contains("from 1 to 255")),
            "{bad}: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn srp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_srp"))
        .env("NICD_MODE", "own")
        .args(args)
        .output()
        .unwrap()
}

/// A RoCE port has no subnet administrator: `srp discover --device --sa`
/// says so and what to give instead, before any device is opened (so on
/// every host), rather than waiting for an SA that never answers.
#[test]
fn discovery_from_a_device_by_sa_is_refused_with_what_to_give_instead() {
    let o = srp(&["discover", "--device", "rxe0", "--sa"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(
        e.trim_end(),
        "srp: srp discover --device: no subnet administrator on a RoCE port; give the \
         target's GID/IP (--target ADDRESS); an InfiniBand port's SA is not asked through \
         the kernel yet"
    );
}

/// `srp discover --device` on a device this host cannot open: one line
/// with the cause and the fix, whichever step fails here.
#[test]
fn discovery_from_a_device_that_cannot_open_says_why_in_one_line() {
    let o = srp(&[
        "discover",
        "--device",
        "nosuchdev9",
        "--target",
        "127.124.0.1",
        "--timeout-ms",
        "10",
    ]);
    says_in_one_line_why_nosuchdev9_cannot_open(&o);
}

/// `o` failed with one line saying why device nosuchdev9 cannot be opened
/// here (no libibverbs, no ib_uverbs, or no such device) and what to do.
fn says_in_one_line_why_nosuchdev9_cannot_open(o: &std::process::Output) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{e}");
    let said = [
        "apt-get install libibverbs1",
        "load ib_uverbs",
        "no RDMA device named nosuchdev9",
    ];
    assert!(said.iter().any(|s| lines[0].contains(s)), "{e}");
}

/// `--device` with `--login` (srp_daemon -e through srpd --device) is a
/// walk like any other: on a device this host cannot open it ends in one
/// line with the cause and the fix, before srpd is asked anything (there
/// is none at this socket). The RDMA CM login string it hands srpd is
/// `Found::rdma_cm_login_string` (srp-initiator's discovery tests), the
/// login itself is shown in the VMs (`interop/run scenario
/// vm-srp-discover-rdmacore`).
#[test]
fn discovery_from_a_device_with_login_opens_the_device_first() {
    let dir = std::env::temp_dir().join(format!("srp-disc-login-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srpd.sock");
    let o = srp(&[
        "discover",
        "--device",
        "nosuchdev9",
        "--target",
        "127.24.0.1",
        "--login",
        "--control-socket",
        sock.to_str().unwrap(),
        "--timeout-ms",
        "10",
    ]);
    says_in_one_line_why_nosuchdev9_cannot_open(&o);
    assert!(!sock.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
