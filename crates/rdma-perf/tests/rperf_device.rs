//! `rperf --device` where this host can run it: the soft NIC's options
//! refused with a device before anything is opened, and a device that
//! cannot be opened (no libibverbs, or no RDMA in this kernel: test hosts
//! have neither rxe nor an RDMA NIC) ending rperf in one line that names
//! the cause. The test itself through the verbs runs in the library's
//! tests (`onverbs`) and, on Linux rxe, in `interop/run scenario
//! rperf-rdmacore`.

use std::process::{Command, Output};

fn rperf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rperf"))
        .env("NICD_MODE", "own")
        .args(args)
        .output()
        .expect("run rperf")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn soft_nic_options_are_refused_with_a_device() {
    // Nothing listens on port 9 of TEST-NET-1: a refusal must come first.
    let client = ["client", "--server", "192.0.2.1:9", "--device", "rxe0"];
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["--faults", "loss=0.1"],
            "--faults",
            "injected by our soft RoCE NIC",
        ),
        (
            &["--capture", "/tmp/x.pcap"],
            "--capture",
            "tcpdump or dumpcap",
        ),
        (
            &["--bind", "127.0.0.1:4791"],
            "--bind",
            "the port and its GID are used",
        ),
        (&["--baseline"], "--baseline", "plain UDP"),
    ];
    for (extra, opt, why) in cases {
        let args: Vec<&str> = client.iter().chain(extra).copied().collect();
        let o = rperf(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(
            e.starts_with(&format!("rperf: {opt} does not go with --device rxe0:1: "))
                && e.contains(why)
                && e.trim_end()
                    .ends_with(&format!("drop {opt}, or --device to run on our soft NIC")),
            "{args:?}: {e}"
        );
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    }
    // The server too.
    let o = rperf(&["server", "--device", "rxe0", "--faults", "loss=0.1"]);
    assert!(
        stderr(&o).starts_with("rperf: --faults does not go with --device rxe0:1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_device_that_cannot_open_ends_rperf_in_one_line() {
    let o = rperf(&[
        "server",
        "--device",
        "nosuchdev9",
        "--oob",
        "127.0.0.1:0",
        "--clients",
        "1",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{e}");
    let said = [
        "apt-get install libibverbs1",
        "load ib_uverbs",
        "no RDMA device named nosuchdev9",
    ];
    assert!(said.iter().any(|s| lines[0].contains(s)), "{e}");
    // It never said it listens: a script waiting for that line is not
    // fooled.
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("listening"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn softroce0_is_the_soft_nic_so_its_options_stay() {
    // `--device softroce0` names our soft NIC: --faults is no conflict,
    // and what fails is only the client's connection to nobody.
    let o = rperf(&[
        "client",
        "--server",
        "127.0.0.1:9",
        "--device",
        "softroce0",
        "--bind",
        "127.0.86.9:4791",
        "--faults",
        "loss=0.1",
        "--iters",
        "1",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(!e.contains("does not go with --device"), "{e}");
    assert!(e.contains("I/O error"), "{e}");
}
