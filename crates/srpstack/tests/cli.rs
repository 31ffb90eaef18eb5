//! The `srpstack` binary as a user runs it.

#[path = "common/report.rs"]
mod report;

use std::process::Command;

fn srpstack(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_srpstack"))
        .args(args)
        .output()
        .expect("run srpstack")
}

#[test]
fn quickstart_exports_a_lun_verifies_io_and_cleans_up() {
    // Soft RoCE on addresses of this test's own (other tests may use 127.0.0.1/2).
    let out = srpstack(&[
        "quickstart",
        "--size",
        "16M",
        "--runtime",
        "1",
        "--target-ip",
        "127.0.90.1",
        "--initiator-ip",
        "127.0.90.2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("provider     softroce: RoCEv2 over UDP"),
        "{text}"
    );
    // Target name: the port GID (IPv4-mapped 127.0.90.1) with colons.
    assert!(
        text.contains("target       0000:0000:0000:0000:0000:ffff:7f00:5a01"),
        "{text}"
    );
    assert!(text.contains("32768 blocks of 512 B (16 MiB)"), "{text}");
    report::verified_clean(&text);
    // Issue 26: each phase says what ended it, sizes are in human units,
    // and the fill's 16 I/Os of 1 MiB print no p99 or p99.9.
    assert!(
        text.contains("size cap of 16 MiB reached before the 60.0 s runtime"),
        "{text}"
    );
    assert!(
        text.contains("runtime of 1.0 s reached")
            || text.contains("size cap of 64 MiB reached before the 1.0 s runtime"),
        "{text}"
    );
    assert!(!text.contains(" bytes, 0 verify failures"), "{text}");
    let fill = text
        .lines()
        .find(|l| l.trim_start().starts_with("write "))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = fill.split_whitespace().collect();
    assert_eq!(cols[1..2], ["16"], "{text}");
    assert_eq!(cols[5..7], ["-", "-"], "{text}");
    // The fill pass writes all 16 MiB and reads all of it back.
    let verified: f64 = text
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_suffix(" MiB read back and verified against what was written")
        })
        .and_then(|n| n.trim().parse().ok())
        .expect("a verified-bytes line");
    assert!(verified >= 16.0, "{text}");
    // The access layer counted every verbs object both sides made, and all
    // were destroyed at logout.
    assert!(text.contains("verbs objects left behind: 0"), "{text}");
    // The temporary fileio image is gone.
    let path = text
        .split_whitespace()
        .find(|w| w.contains("srpstack-lun0-"))
        .expect("the LUN file is named");
    assert!(
        !std::path::Path::new(path.trim_end_matches(',')).exists(),
        "{path} left behind"
    );
}

#[test]
fn quickstart_over_a_lossy_link_from_the_environment() {
    let run = |faults: &str, a: &str, b: &str| {
        Command::new(env!("CARGO_BIN_EXE_srpstack"))
            .args([
                "quickstart",
                "--size",
                "8M",
                "--runtime",
                "1",
                "--target-ip",
                a,
                "--initiator-ip",
                b,
            ])
            .env("SOFTROCE_FAULTS", faults)
            .output()
            .expect("run srpstack")
    };
    // 2 % of datagrams dropped on both NICs: the transport retransmits and
    // every block still reads back as written.
    let out = run("loss=0.02,seed=11", "127.0.90.5", "127.0.90.6");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report::verified_clean(&text);
    let retransmitted: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("soft RoCE"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|w| w.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("a soft RoCE counters line");
    assert!(
        retransmitted > 0,
        "loss injected but nothing retransmitted:\n{text}"
    );
    assert!(
        text.contains("(SOFTROCE_FAULTS loss=0.02,seed=11)"),
        "{text}"
    );

    // A spec the injector cannot take stops the run with the variable named.
    let out = run("loss=2", "127.0.90.7", "127.0.90.8");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("SOFTROCE_FAULTS") && err.contains("'loss' must be within 0..=1"),
        "{err}"
    );
}

#[test]
fn bad_arguments_get_clear_errors() {
    let out = srpstack(&["quickstart", "--size", "3x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`3x` is not a size"), "{err}");

    let out = srpstack(&["quickstart", "--size", "1000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must be at least 1 MiB"), "{err}");

    let out = srpstack(&["bench", "--provider", "bogus", "--runtime", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("provider `bogus` is not available"), "{err}");

    let out = srpstack(&[
        "quickstart",
        "--target-ip",
        "127.0.0.5",
        "--initiator-ip",
        "127.0.0.5",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("need different addresses"), "{err}");
}

#[test]
fn bench_reports_json_with_latency_percentiles() {
    let out = srpstack(&[
        "bench",
        "--provider",
        "loopback",
        "--ram",
        "8M",
        "--rw",
        "randrw",
        "--bs",
        "4K",
        "--iodepth",
        "4",
        "--runtime",
        "1",
        "--verify",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(v["provider"], "loopback");
    assert_eq!(v["verify_failures"], 0);
    assert!(v["read"]["ios"].as_u64().unwrap() > 0);
    assert!(v["write"]["ios"].as_u64().unwrap() > 0);
    let p50 = v["read"]["lat_p50_us"].as_f64().unwrap();
    let p99 = v["read"]["lat_p99_us"].as_f64().unwrap();
    assert!(p50 > 0.0 && p99 >= p50, "{v}");
}

/// `--ios N` stops after exactly N I/Os (what `bench/cost` differences
/// two runs by), and the report gives what the whole process spent per
/// I/O over the timed window; with `--verify` it gives none, as the
/// prefill and the read-back would count.
#[test]
fn bench_counts_ios_and_reports_cost_per_io() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--provider",
            "loopback",
            "--ram",
            "8M",
            "--iodepth",
            "8",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = srpstack(&args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON report")
    };
    for (engine, ios) in [("queue", 1000), ("queue", 1), ("threads", 1000)] {
        let n = ios.to_string();
        let v = run(&["--engine", engine, "--ios", &n, "--rw", "randrw"]);
        assert_eq!(v["total"]["ios"], ios, "{engine} --ios {ios}: {v}");
        assert_eq!(v["stopped"], "size", "{v}");
        let per_io = &v["per_io"];
        for key in [
            "context_switches",
            "voluntary_switches",
            "involuntary_switches",
            "cpu_us",
            "user_us",
            "system_us",
        ] {
            let x = per_io[key]
                .as_f64()
                .unwrap_or_else(|| panic!("per_io.{key} missing: {v}"));
            assert!(x.is_finite() && x >= 0.0, "per_io.{key} = {x}: {v}");
        }
        let sum = per_io["voluntary_switches"].as_f64().unwrap()
            + per_io["involuntary_switches"].as_f64().unwrap();
        assert!(
            (per_io["context_switches"].as_f64().unwrap() - sum).abs() < 1e-9,
            "{v}"
        );
        // A thousand I/Os cannot take a second of CPU each.
        assert!(per_io["cpu_us"].as_f64().unwrap() < 1e6, "{v}");
    }
    let v = run(&["--ios", "200", "--verify"]);
    assert_eq!(v["total"]["ios"], 200, "{v}");
    assert!(v["per_io"].is_null(), "{v}");

    for (args, says) in [
        (&["--ios", "0"][..], "--ios must be at least 1"),
        (
            &["--ios", "10", "--engine", "threads"][..],
            "must be a multiple of --iodepth 8",
        ),
    ] {
        let mut all = vec!["bench", "--provider", "loopback", "--iodepth", "8"];
        all.extend_from_slice(args);
        let out = srpstack(&all);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The queued engine (one thread, many SRP commands in flight through
/// `Session::start` / `wait_any`) against the threaded one, both verified,
/// over the soft RoCE NIC.
#[test]
fn bench_engines_both_verify_over_soft_roce() {
    for (engine, ip) in [("queue", "127.0.90.11"), ("threads", "127.0.90.13")] {
        let peer = ip.replace(".11", ".12").replace(".13", ".14");
        let out = srpstack(&[
            "bench",
            "--target-ip",
            ip,
            "--initiator-ip",
            &peer,
            "--ram",
            "16M",
            "--rw",
            "randrw",
            "--bs",
            "8K",
            "--iodepth",
            "16",
            "--engine",
            engine,
            "--runtime",
            "1",
            "--verify",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{engine}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        assert_eq!(v["verify_failures"], 0, "{engine}: {v}");
        assert_eq!(v["io_errors"], 0, "{engine}: {v}");
        assert!(v["verified_bytes"].as_u64().unwrap() > 0, "{engine}: {v}");
        let jobs = v["jobs"].as_u64().unwrap();
        assert_eq!(jobs, if engine == "queue" { 1 } else { 16 }, "{v}");
    }
    let out = srpstack(&["bench", "--provider", "loopback", "--engine", "fibers"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine `fibers`"));
}
