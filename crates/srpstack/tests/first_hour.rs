//! What a storage engineer meets in the first hour (issue 26): the
//! README's own commands accepted as written, and the usual mistakes
//! answered with their cause and their fix. Real processes on loopback
//! addresses of their own (127.0.201.x); every wait is bounded.

mod common;
use common::{run, Proc};

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A control socket path of this test process.
fn sock(tag: &str) -> PathBuf {
    common::sock_of("first-hour", tag)
}

/// `srptd` on `ip` with a 64 MiB RAM LUN (as the README starts it),
/// listening.
fn srptd(ip: &str, tag: &str) -> Proc {
    common::srptd_ram64(ip, &sock(tag))
}

fn srp(args: &[&str]) -> (bool, String) {
    run(common::tool(common::srp_bin()).args(args))
}

/// README, "SRP between processes": `srp io --dest 127.0.0.1:5555 --ip
/// 127.0.0.2 --rw randrw --bs 4096 --size 64M` against `srptd --ip
/// 127.0.0.1 --rdma-cm-port 5555 --ram-mib 64`, on this test's addresses.
#[test]
fn the_readme_commands_run_as_written() {
    let _d = srptd("127.0.201.1", "readme");
    let (ok, out) = srp(&[
        "io",
        "--dest",
        "127.0.201.1:5555",
        "--ip",
        "127.0.201.2",
        "--rw",
        "randrw",
        "--bs",
        "4096",
        "--size",
        "64M",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("0 verify failures, 0 I/O errors"), "{out}");
    assert!(
        out.contains("srp: logging in to 127.0.201.1:5555 from 127.0.201.2 ..."),
        "{out}"
    );

    // README, "Running the target daemon": sizes with suffixes.
    let adm = |args: &[&str]| {
        run(Command::new(common::srptadm_bin())
            .arg("--control-socket")
            .arg(sock("readme"))
            .args(args))
    };
    let (ok, out) = adm(&["add-device", "extra", "--handler", "ram", "--size", "64M"]);
    assert!(ok, "{out}");
    let (ok, out) = adm(&["add-lun", "1", "extra"]);
    assert!(ok, "{out}");
    let (ok, out) = adm(&["resize", "extra", "128M"]);
    assert!(
        ok && out.contains("resized device extra from 64 MiB to 128 MiB"),
        "{out}"
    );

    // --dest without a port: srptd's default, 5555.
    let (ok, out) = srp(&["luns", "--dest", "127.0.201.1", "--ip", "127.0.201.3"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("logging in to 127.0.201.1:5555") && out.contains("LUN 1 "),
        "{out}"
    );
}

/// A port nothing listens on, the target's own address as ours, and a
/// `--dest` that is no address: each refused at once, naming the cause and
/// the fix.
#[test]
fn wrong_port_own_address_and_bad_dest_say_what_to_do() {
    let _d = srptd("127.0.201.11", "mistakes");
    let t0 = Instant::now();
    let (ok, out) = srp(&["io", "--dest", "127.0.201.11:5556", "--ip", "127.0.201.12"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("nothing listens for SRP logins at 127.0.201.11:5556 (RDMA CM port")
            && out.contains("srptd's default is 5555"),
        "{out}"
    );
    // The target's CM answered at once; nothing waited for a timeout.
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());

    // The target's address as ours: srptd holds UDP 4791 there.
    let (ok, out) = srp(&["io", "--dest", "127.0.201.11", "--ip", "127.0.201.11"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("UDP 127.0.201.11:4791 (RoCEv2) is in use")
            && out.contains("(srptd? the NIC daemon? `nicd --clients` lists its clients)")
            && out.contains("pick another local address with --ip, or drop --own-nic"),
        "{out}"
    );
    assert!(
        !out.contains("logging in"),
        "refused before any login: {out}"
    );

    let (ok, out) = srp(&["io", "--dest", "srptd-host", "--ip", "127.0.201.13"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("`srptd-host` is not a target address")
            && out.contains("the address alone for port 5555"),
        "{out}"
    );
}

/// No srptd at the address: the wait is announced when it starts, and the
/// end says what nothing answered and what to check.
#[test]
fn no_target_says_it_waits_and_what_to_check() {
    let mut child = common::tool(common::srp_bin())
        .args(["io", "--dest", "127.0.201.21", "--ip", "127.0.201.22"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run srp");
    let (tx, lines) = mpsc::channel();
    let err = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(20))
        .expect("srp says which NIC it runs on");
    assert_eq!(
        first,
        "srp: NIC: its own soft RoCE NIC at 127.0.201.22 (NICD_MODE=own)"
    );
    let second = lines
        .recv_timeout(Duration::from_secs(20))
        .expect("srp says it is logging in");
    assert_eq!(
        second,
        "srp: logging in to 127.0.201.21:5555 from 127.0.201.22 ..."
    );
    // Said while the attempt runs, not after it.
    assert!(child.try_wait().unwrap().is_none(), "srp ended already");
    let end = Instant::now() + Duration::from_secs(60);
    let mut rest = Vec::new();
    loop {
        match lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) => rest.push(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(e) => {
                let _ = child.kill();
                panic!("srp still waiting after 60 s: {e}");
            }
        }
    }
    let status = child.wait().unwrap();
    let rest = rest.join("\n");
    assert!(!status.success(), "{rest}");
    assert!(
        rest.contains(
            "nothing answered SRP logins at 127.0.201.21:5555 (RDMA CM port): is srptd running there? (its default port is 5555)"
        ),
        "{rest}"
    );
}

/// No daemon at the control socket (nothing there, or a socket left by
/// one that died): srptadm and srp's srpd commands name the daemon, the
/// path and the fix.
#[test]
fn no_daemon_at_the_control_socket_says_start_it() {
    let none = sock("none");
    let stale = sock("stale");
    let _ = std::fs::remove_file(&stale);
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    for path in [&none, &stale] {
        let (ok, out) = run(Command::new(common::srptadm_bin())
            .arg("-s")
            .arg(path)
            .arg("show"));
        assert!(!ok, "{out}");
        assert!(
            out.contains(&format!("no srptd at {}", path.display()))
                && out.contains("start srptd, or pass --control-socket"),
            "{out}"
        );
        for args in [
            &["list"][..],
            &["logout", "t1"],
            &["login", "id_ext=1,ioc_guid=1,dest=127.0.201.31:5555"],
        ] {
            let (ok, out) = run(common::tool(common::srp_bin())
                .args(args)
                .arg("--control-socket")
                .arg(path));
            assert!(!ok, "{out}");
            assert!(
                out.contains(&format!("no srpd at {}", path.display()))
                    && out.contains("start srpd, or pass --control-socket"),
                "{args:?}: {out}"
            );
        }
    }
    let _ = std::fs::remove_file(&stale);
}

/// Every binary answers `--version` (package name and version), and
/// `srptd --help` names the defaults of the options that override its
/// file.
#[test]
fn every_binary_answers_version_and_srptd_help_shows_defaults() {
    let mut paths: Vec<(PathBuf, &str)> = common::BINARIES
        .iter()
        .map(|name| (common::bin_of(name), *name))
        .collect();
    paths.push((env!("CARGO_BIN_EXE_srpstack").into(), "srpstack"));
    for (path, name) in &paths {
        let (ok, out) = run(Command::new(path).arg("--version"));
        assert!(ok, "{name} --version: {out}");
        // `<name> <version>`, one line.
        let line = out.trim_end();
        let version = line.strip_prefix(&format!("{name} "));
        assert!(
            version.is_some_and(|v| !v.is_empty() && !v.contains('\n')),
            "{name} --version: {out}"
        );
    }
    let (ok, help) = run(common::tool(common::srptd_bin()).arg("--help"));
    assert!(ok, "{help}");
    for (opt, default) in [
        ("--ip", "[default: 127.0.0.1]"),
        ("--udp-port", "[default: 4791]"),
        ("--rdma-cm-port", "[default: 5555]"),
        ("--fabric", "[default: roce]"),
        ("--sm-wait-ms", "[default: 30000]"),
        ("--ram-mib", "[default: 64]"),
        ("--metrics", "[default: off]"),
        ("--log-level", "[default: info]"),
    ] {
        // The default is said in the option's own entry, before the next.
        let entry = help
            .split_once(&format!("      {opt} "))
            .map(|(_, rest)| rest.split("\n      --").next().unwrap_or(rest))
            .unwrap_or_else(|| panic!("{opt} missing from\n{help}"));
        assert!(
            entry.contains(default),
            "{opt}: {default} missing in {entry}"
        );
    }
}
