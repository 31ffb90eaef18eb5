//! `need`: a missing tool fails the test under `CI=true` naming the tool
//! and its package, and is a visible, recorded skip otherwise. The probe
//! runs in a child of this test binary with an empty `PATH`.

use std::process::{Command, Output};

/// Does nothing unless a parent test runs it (`RDMA_TESTKIT_PROBE`): then
/// it asks for fio and for part of itself for qemu-img.
#[test]
fn probe() {
    if std::env::var_os("RDMA_TESTKIT_PROBE").is_none() {
        return;
    }
    if !rdma_testkit::need::part("the image part").tool("qemu-img") {
        println!("probe: went on without the image part");
    }
    if !rdma_testkit::need::tool("fio") {
        return;
    }
    panic!("fio found on an empty PATH");
}

fn run_probe(ci: Option<&str>, ledger: &std::path::Path) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["probe", "--exact", "--nocapture", "--test-threads", "2"])
        .env("RDMA_TESTKIT_PROBE", "1")
        .env("PATH", "/nonexistent")
        .env("RDMA_TEST_SKIPS", ledger)
        .env_remove("CI");
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    cmd.output().unwrap()
}

fn ledger(tag: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("need-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn a_missing_tool_fails_under_ci_naming_it_and_its_package() {
    let file = ledger("ci");
    let out = run_probe(Some("true"), &file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    // The first thing missing fails it, even for an optional part.
    assert!(
        err.contains("need::probe: qemu-img is not installed (apt-get install qemu-utils)"),
        "{err}"
    );
    assert!(err.contains("under CI=true"), "{err}");
    assert!(!file.exists(), "nothing is recorded as skipped in CI");
}

#[test]
fn a_missing_tool_is_a_visible_and_recorded_skip_elsewhere() {
    for ci in [None, Some("false")] {
        let file = ledger("local");
        let out = run_probe(ci, &file);
        let err = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{err}\n{stdout}");
        assert!(
            err.contains(
                "SKIPPED need::probe: the image part did not run: qemu-img is not installed \
                 (apt-get install qemu-utils)"
            ),
            "{err}"
        );
        assert!(
            err.contains(
                "SKIPPED need::probe: the test did not run: fio is not installed (apt-get install fio)"
            ),
            "{err}"
        );
        assert!(stdout.contains("probe: went on without the image part"));
        let rows = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            rows,
            "need::probe\tpart\tqemu-img is not installed\tapt-get install qemu-utils\n\
             need::probe\twhole\tfio is not installed\tapt-get install fio\n"
        );
        std::fs::remove_file(&file).unwrap();
    }
}
