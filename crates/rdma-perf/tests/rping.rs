//! Our rping client against our rping server, two processes on loopback
//! addresses over the soft RoCE NIC: every ping's data is read by the
//! server, written back and validated by the client.

mod common;

use common::{ends_well, serve};
use std::process::Command;

#[test]
fn rrping_client_and_server_validate_every_ping() {
    let (mut server, first, lines) = serve(
        env!("CARGO_BIN_EXE_rrping"),
        &["-s", "-a", "127.0.118.1", "-C", "25", "-S", "100", "-v"],
    );
    assert!(first.contains("listening"), "{first}");
    let client = Command::new(env!("CARGO_BIN_EXE_rrping"))
        .env("NICD_MODE", "own")
        .args([
            "-c",
            "-a",
            "127.0.118.1",
            "-I",
            "127.0.118.2",
            "-C",
            "25",
            "-S",
            "100",
            "-v",
            "-V",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(out.contains("rrping: 25 pings, 25 validated"), "{out}");
    assert!(out.contains("ping data: rdma-ping-24: Y"), "{out}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    ends_well(&mut server, "rrping server", 30, &rest);
    assert_eq!(
        rest.iter()
            .filter(|l| l.starts_with("server ping data: rdma-ping-"))
            .count(),
        25
    );
    assert!(
        rest.iter().any(|l| l.contains("rrping: 25 pings")),
        "{rest:?}"
    );

    // A client with nobody to talk to fails with the reason.
    let alone = Command::new(env!("CARGO_BIN_EXE_rrping"))
        .env("NICD_MODE", "own")
        .args([
            "-c",
            "-a",
            "127.0.118.9",
            "-I",
            "127.0.118.2",
            "-C",
            "1",
            "--timeout",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!alone.status.success());
    assert!(String::from_utf8_lossy(&alone.stderr).contains("connect to 127.0.118.9"));
}
