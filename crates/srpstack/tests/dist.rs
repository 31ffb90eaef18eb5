//! What ships beside the binaries (issue 26, item 6): man pages and shell
//! completions generated from the clap definitions (`BINARY --write-docs
//! DIR`, crate `cli-docs`), each page rendered by `man -l` without a
//! warning; the systemd units in `dist/systemd` accepted by `systemd-analyze
//! verify`, with the binaries they start and the man pages they name.
//!
//! Skipped without man or systemd-analyze, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::{bin_of, text};
use rdma_testkit::need;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every binary with a command line and its man section.
const BINARIES: [(&str, &str); 13] = [
    ("srptd", "8"),
    ("srptadm", "8"),
    ("srpd", "8"),
    ("srp", "1"),
    ("ibsm", "8"),
    ("ibstat", "8"),
    ("saquery", "8"),
    ("rperf", "1"),
    ("rperftest", "1"),
    ("rpingpong", "1"),
    ("rrping", "1"),
    ("srpstack", "1"),
    ("nicd", "8"),
];

/// A fresh directory under the temp dir.
fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("srp-dist-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs every binary with `--write-docs dir`; the files each wrote.
fn write_docs(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for (b, _) in BINARIES {
        let out = Command::new(bin_of(b))
            .arg("--write-docs")
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{b} --write-docs: {}", text(&out));
        all.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from),
        );
    }
    all
}

#[test]
fn man_pages_and_completions_come_from_the_command_lines_and_render() {
    let dir = tempdir("docs");
    let files = write_docs(&dir);
    for (b, section) in BINARIES {
        let page = dir.join(format!("man/man{section}/{b}.{section}"));
        assert!(files.contains(&page), "{b}'s page missing: {files:?}");
        for shell in [
            format!("bash/{b}"),
            format!("zsh/_{b}"),
            format!("fish/{b}.fish"),
        ] {
            let f = dir.join("completions").join(shell);
            assert!(
                std::fs::metadata(&f).is_ok_and(|m| m.len() > 0),
                "{}",
                f.display()
            );
        }
    }
    // One page per subcommand, named as man(1) expects.
    for want in [
        "man8/srptadm-add-lun.8",
        "man8/srptadm-resize.8",
        "man1/srp-rescan.1",
    ] {
        assert!(
            files.contains(&dir.join("man").join(want)),
            "{want}: {files:?}"
        );
    }
    // The pages say what the command lines take (they are made from them).
    let srptd = std::fs::read_to_string(dir.join("man/man8/srptd.8")).unwrap();
    assert!(
        srptd.contains("\\-\\-mtu") && srptd.contains("\\-\\-config"),
        "{srptd}"
    );
    let bash = std::fs::read_to_string(dir.join("completions/bash/srptadm")).unwrap();
    assert!(
        bash.contains("add-lun") && bash.contains("remove-initiator"),
        "{bash}"
    );
    if need::tool("bash") {
        for (b, _) in BINARIES {
            let (ok, out) = common::run(
                Command::new("bash")
                    .arg("-n")
                    .arg(dir.join(format!("completions/bash/{b}"))),
            );
            assert!(ok, "bash completion of {b}: {out}");
        }
    }
    if !need::tool("man") {
        return;
    }
    let pages: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.starts_with(dir.join("man")))
        .collect();
    assert!(pages.len() > 20, "{pages:?}");
    for p in pages {
        let out = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(p)
            .env("MANWIDTH", "80")
            .output()
            .unwrap();
        // Bold and underline come as overstrikes (`X\bX`): keep the letters.
        let raw = String::from_utf8_lossy(&out.stdout);
        let mut shown = String::new();
        for c in raw.chars() {
            if c == '\u{8}' {
                shown.pop();
            } else {
                shown.push(c);
            }
        }
        let name = p.file_stem().unwrap().to_string_lossy();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "man -l {}: {}",
            p.display(),
            text(&out)
        );
        assert!(
            shown.contains("NAME") && shown.contains("SYNOPSIS"),
            "{name}: {shown}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd");
    let srptd = std::fs::read_to_string(units.join("srptd.service")).unwrap();
    let srpd = std::fs::read_to_string(units.join("srpd.service")).unwrap();
    // SIGHUP reloads srptd's file; SIGTERM logs out (both daemons).
    assert!(
        srptd.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "{srptd}"
    );
    assert!(
        srptd.contains("ExecStartPre=/usr/local/sbin/srptd --check"),
        "{srptd}"
    );
    assert!(srpd.contains("--mount-root /run/srp"), "{srpd}");
    // Both run on the NIC daemon's NICs by default: its unit, not one
    // they start in their own cgroups.
    for unit in [&srptd, &srpd] {
        assert!(
            unit.contains("Wants=network-online.target nicd.service"),
            "{unit}"
        );
    }
    let nicd = std::fs::read_to_string(units.join("nicd.service")).unwrap();
    if !need::tool("systemd-analyze") {
        return;
    }
    // The units as installed: their binaries where they start them from
    // (here, this build's), their man pages on the MANPATH.
    let dir = tempdir("units");
    let bins = bin_of("srptd").parent().unwrap().to_path_buf();
    let mut paths = Vec::new();
    for (name, body) in [
        ("srptd.service", &srptd),
        ("srpd.service", &srpd),
        ("nicd.service", &nicd),
    ] {
        let p = dir.join(name);
        let here = format!("{}/", bins.display());
        std::fs::write(&p, body.replace("/usr/local/sbin/", &here)).unwrap();
        paths.push(p);
    }
    let docs = dir.join("docs");
    write_docs(&docs);
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .env("MANPATH", docs.join("man"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
