//! `ibsm` as a user runs it: a simulated fabric comes up and the SA
//! answers; a partitions file is checked, errors named by line and column.

mod common;

use std::process::Command;

fn ibsm(args: &[&str]) -> (bool, String) {
    common::output_of(
        Command::new(env!("CARGO_BIN_EXE_ibsm"))
            .env("NICD_MODE", "own")
            .args(args),
    )
}

#[test]
fn simulate_brings_hosts_up_and_lists_paths() {
    let (ok, out) = ibsm(&["simulate", "--hosts", "3", "--loss", "0.05", "--seed", "4"]);
    assert!(ok, "{out}");
    assert_eq!(out.matches(" ACTIVE, LID ").count(), 3, "{out}");
    assert!(out.contains("PathRecords from host 2 (3):"), "{out}");
    assert!(out.contains("3 hosts ACTIVE"), "{out}");
    let (ok, out) = ibsm(&["simulate", "--loss", "0.9"]);
    assert!(!ok && out.contains("--loss"), "{out}");
}

#[test]
fn check_validates_partitions_files() {
    let dir = std::env::temp_dir().join(format!("ibsm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.conf");
    std::fs::write(
        &good,
        "Default=0x7fff : ALL=full ;\nstorage=0x10 : 0x11=full, 0x22 ;\n",
    )
    .unwrap();
    let (ok, out) = ibsm(&["check", good.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(
        out.contains("storage 0x0010: 0x0000000000000011=full, 0x0000000000000022=limited"),
        "{out}"
    );
    let bad = dir.join("bad.conf");
    std::fs::write(
        &bad,
        "Default=0x7fff : ALL=full ;\nx=0x10 : 0x11=sometimes ;\n",
    )
    .unwrap();
    let (ok, out) = ibsm(&["check", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        out.contains("line 2 column 10") && out.contains("sometimes"),
        "{out}"
    );
    let (ok, out) = ibsm(&["check", "/nonexistent/partitions.conf"]);
    assert!(!ok && out.contains("/nonexistent"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_refuses_bad_mkey_options_before_touching_the_network() {
    // 127.0.152.30: never bound, since the options fail first.
    let base = ["run", "--addr", "127.0.152.30", "--node", "127.0.152.29"];
    for (extra, want) in [
        (&["--mkey", "0xzz"][..], "not a 64-bit hex number"),
        (
            &["--mkey", "1_0000_0000_0000_0000"][..],
            "not a 64-bit hex number",
        ),
        (
            &["--mkey", "0x10000000000000000"][..],
            "not a 64-bit hex number",
        ),
        (&["--mkey-protect", "4"][..], "--mkey-protect"),
        (&["--mkey-lease-secs", "70000"][..], "--mkey-lease-secs"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let (ok, out) = ibsm(&args);
        assert!(!ok, "{extra:?} accepted: {out}");
        assert!(out.contains(want), "{extra:?}: {out}");
        assert!(!out.contains("panicked"), "{out}");
    }
}

#[test]
fn simulate_with_lmc_lists_a_path_per_lid_pair() {
    let (ok, out) = ibsm(&["simulate", "--hosts", "2", "--lmc", "1"]);
    assert!(ok, "{out}");
    // Two hosts, two LIDs each: from host 2, 4 paths to itself and 4 to
    // host 3.
    assert_eq!(out.matches(" ACTIVE, LIDs ").count(), 2, "{out}");
    assert!(out.contains("PathRecords from host 2 (8):"), "{out}");
    assert_eq!(out.matches("preference 0").count(), 4, "{out}");
    assert_eq!(out.matches("preference 2").count(), 4, "{out}");
    for bad in ["8", "255", "x"] {
        let (ok, out) = ibsm(&["simulate", "--lmc", bad]);
        assert!(!ok && out.contains("--lmc"), "{bad}: {out}");
        let run = ["run", "--addr", "127.0.155.30", "--node", "127.0.155.29"];
        let (ok, out) = ibsm(&[&run[..], &["--lmc", bad]].concat());
        assert!(!ok && out.contains("--lmc"), "{bad}: {out}");
    }
}
