//! The tools over our soft iWARP NIC (`--iwarp`), two processes on
//! loopback addresses: rrping's client validates every ping its server
//! read and wrote back (RDMA CM over TCP and MPA), and rperf moves
//! verified RDMA WRITEs and READs (QPs set up by the verbs alone) with
//! its baseline plain TCP between the same two addresses.

mod common;

use common::{ends_well, serve};
use std::process::{Command, Output};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn rrping_validates_every_ping_over_iwarp() {
    let (mut server, first, _lines) = serve(
        env!("CARGO_BIN_EXE_rrping"),
        &["--iwarp", "-s", "-a", "127.31.3.1", "-C", "20", "-S", "100"],
    );
    assert!(
        first.contains("listening") && first.contains("softiwarp0"),
        "{first}"
    );
    let client = Command::new(env!("CARGO_BIN_EXE_rrping"))
        .env("NICD_MODE", "own")
        .args([
            "--iwarp",
            "-c",
            "-a",
            "127.31.3.1",
            "-I",
            "127.31.3.2",
            "-C",
            "20",
            "-S",
            "100",
            "-V",
        ])
        .output()
        .unwrap();
    let out = text(&client);
    assert!(client.status.success(), "{out}");
    assert!(out.contains("rrping: 20 pings, 20 validated"), "{out}");
    ends_well(&mut server, "rrping --iwarp server", 60, &out);
}

#[test]
fn rperf_writes_and_reads_verified_over_iwarp_against_plain_tcp() {
    for (op, baseline) in [("write", true), ("read", false)] {
        let (mut server, first, lines) = serve(
            env!("CARGO_BIN_EXE_rperf"),
            &[
                "server",
                "--iwarp",
                "--bind",
                "127.31.3.3:4791",
                "--oob",
                "127.31.3.3:18515",
            ],
        );
        assert!(first.contains("listening"), "{first}");
        let mut args = vec![
            "client",
            "--iwarp",
            "--bind",
            "127.31.3.4:4791",
            "--server",
            "127.31.3.3:18515",
            "--op",
            op,
            "--iters",
            "300",
            "--verify",
        ];
        if baseline {
            args.push("--baseline");
        }
        let client = Command::new(env!("CARGO_BIN_EXE_rperf"))
            .env("NICD_MODE", "own")
            .args(&args)
            .output()
            .unwrap();
        let out = text(&client);
        assert!(client.status.success(), "{op}: {out}");
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(op))
            .unwrap_or_else(|| panic!("no {op} row: {out}"));
        assert!(row.trim_end().ends_with("yes"), "not verified: {out}");
        assert!(out.contains("on our soft iWARP NIC softiwarp0"), "{out}");
        if baseline {
            // ours/baseline = R, R a positive number.
            let ratio: f64 = out
                .lines()
                .find_map(|l| l.split_once("baseline plain TCP: ").map(|(_, r)| r))
                .and_then(|r| r.rsplit_once("ours/baseline = "))
                .and_then(|(_, r)| r.trim().parse().ok())
                .unwrap_or_else(|| panic!("no TCP baseline ratio: {out}"));
            assert!(ratio > 0.0, "{out}");
        }
        // Read to the end (the server's exit), so it never writes to a
        // closed pipe.
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        ends_well(&mut server, "rperf --iwarp server", 60, &rest);
    }
}
