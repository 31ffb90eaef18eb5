//! `bench/nicd --quick` (issue 27's measurement of the NIC daemon) runs
//! to its table with this build's tools: every workload measured on NICs
//! of the tools' own, through the daemon (QPs in the tools' processes)
//! and through its rings (`NICD_DATA=daemon`), in the same run, with a
//! ratio (or a latency difference) for each. Tiny counts: this checks
//! that the script works, not how fast anything is.
//!
//! Addresses: 127.0.0.41-48 (the script's; no other test uses them).

mod common;

use std::process::Command;

#[test]
fn bench_nicd_prints_every_workload_three_ways_with_its_ratios() {
    let rperf = common::bin_of("rperf");
    let bin = rperf.parent().unwrap();
    assert!(bin.join("srpstack").exists(), "{}", bin.display());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/nicd");
    let out = Command::new(script)
        .args(["--quick", "--rounds", "1"])
        .env("BENCH_NICD_BIN", bin)
        .output()
        .unwrap();
    let text = common::text(&out);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for (row, unit) in [
        ("rperf 64 KiB WRITE QD16, Gbit/s", "x"),
        ("rperf 4 KiB SEND QD32, kmsg/s", "x"),
        ("rperf 8 B SEND QD1 p50, us", " us"),
        ("srpstack bench 4K randread QD32, kIOPS", "x"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row:?}: {stdout}"));
        // workload, in-process, through nicd, the ratio, the goal.
        let cols: Vec<&str> = line[row.len()..].split_whitespace().collect();
        let own: f64 = cols[0].parse().unwrap_or_else(|_| panic!("{line}"));
        let nicd: f64 = cols[1].parse().unwrap_or_else(|_| panic!("{line}"));
        // ... then the rings' cell and its ratio (a latency's: "+N us").
        let rings = cols[cols.len() - if unit == "x" { 2 } else { 3 }];
        let rings: f64 = rings.parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(own > 0.0 && nicd > 0.0 && rings > 0.0, "{line}");
        // Both ratios there: through nicd's (before the goal), the rings'.
        assert!(
            cols[2].ends_with(unit.trim()) || cols[3] == unit.trim(),
            "{line}"
        );
        assert!(line.ends_with(unit), "{line}");
    }
}
