//! Helpers for integration tests: tshark on a capture, one row of fields per
//! packet, with the malformed and expert-severity checks every capture test
//! makes. Tests only; nothing in the stack depends on it.

use std::path::Path;
use std::process::Command;

/// Where Debian puts tshark (`.ci/run` installs it).
pub const TSHARK: &str = "/usr/bin/tshark";

/// Expert info severities of warning (0x600000) and above are failures.
const EXPERT_WARN: u32 = 0x60_0000;

/// Runs tshark on `pcap`, decoding the given UDP ports as RoCEv2 as well as
/// 4791, and returns `fields` for every packet. `None` (after printing a
/// visible SKIPPED line naming `test`) when tshark is not installed.
///
/// # Panics
/// If tshark fails, or marks a packet malformed, or raises an expert
/// warning or error: the test's verdict.
pub fn tshark_fields(
    test: &str,
    pcap: &Path,
    roce_ports: &[u16],
    fields: &[&str],
) -> Option<Vec<Vec<String>>> {
    if !Path::new(TSHARK).exists() {
        eprintln!("SKIPPED tshark half of {test}: {TSHARK} not installed (.ci/run installs it)");
        return None;
    }
    let mut args: Vec<String> = vec!["-r".into(), pcap.display().to_string()];
    for p in roce_ports {
        args.push("-d".into());
        args.push(format!("udp.port=={p},infiniband"));
    }
    args.extend(["-T", "fields"].map(String::from));
    for f in fields
        .iter()
        .chain(&["_ws.malformed", "_ws.expert.severity"])
    {
        args.push("-e".into());
        args.push((*f).to_string());
    }
    let out = Command::new(TSHARK)
        .args(&args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split('\t').map(String::from).collect())
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let malformed = row.get(fields.len()).is_some_and(|c| !c.is_empty());
        assert!(!malformed, "tshark: packet {} malformed: {row:?}", i + 1);
        let worst = row.get(fields.len() + 1).map_or(0, |c| {
            c.split(',')
                .filter_map(|v| v.parse::<u32>().ok())
                .max()
                .unwrap_or(0)
        });
        assert!(
            worst < EXPERT_WARN,
            "tshark: packet {} has an expert warning or error: {row:?}",
            i + 1
        );
    }
    Some(
        rows.into_iter()
            .map(|mut r| {
                r.truncate(fields.len());
                r
            })
            .collect(),
    )
}
