//! What the tests share: ibverbs-abi's test kit (the NIC daemon in this
//! process, the built libraries, C programs against Debian's headers,
//! `objdump -T`), with this crate's `librdmacm.so.1` beside its
//! `libibverbs.so.1`.

#![allow(dead_code)]

#[path = "../../../ibverbs-abi/tests/common/mod.rs"]
mod verbs_common;

pub use verbs_common::*;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `librdmacm_abi.so` of this test's profile, built first.
pub fn rdmacm_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let lib = build_in_profile(&["-p", "rdmacm-abi", "--lib"]).join("librdmacm_abi.so");
            assert!(lib.exists(), "{} not built", lib.display());
            lib
        })
        .clone()
}

/// A NIC daemon on `ip` whose library directory holds both libraries.
pub fn daemon(ip: IpAddr) -> Daemon {
    let d = Daemon::start(ip);
    std::fs::copy(rdmacm_library(), d.libdir.join("librdmacm.so.1")).unwrap();
    d
}

/// Spawns `c` with its output piped.
pub fn spawn(c: &mut Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `client` until it is not refused for want of a listener
/// (rping's server says nothing when it listens): each attempt's REQ
/// finds the server listening or is rejected at once (the daemon's REJ
/// for a service nobody listens on). At most 100 attempts in 30 s; the
/// last attempt's output.
pub fn connect_when_listening(
    client: &mut dyn FnMut() -> Command,
    refused: &str,
    secs: u64,
) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    for attempt in 1..=100 {
        let out = finish(spawn(&mut client()), secs);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Shown when the test fails: which attempts were refused, and how.
        eprintln!("client attempt {attempt} ({}): {all}", out.status);
        if !all.contains(refused) || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the client was refused 100 times: nothing listens");
}
