//! SRP over our soft iWARP NIC with the real binaries (issue 31, item 3):
//! `srptd` from a configuration with `iwarp = true` and a RAM LUN on
//! 127.31.0.1; `srp io --iwarp` doing verified I/O against it by the same
//! `--dest` as over RoCE; `srpd --iwarp` logging in with the Linux login
//! string of a soft RoCE target there, its LUN file read and written,
//! logout seen by the target; configurations that cannot work refused
//! with the key, the cause and the fix.

mod common;

use common::{srp, text, wait_for};
use std::path::Path;

// srptd's target port ID is the GUID of its address, over iWARP as over
// RoCE: 0002c903 and 127.31.0.1.
const TARGET: &str = "id_ext=0002c9037f1f0001,ioc_guid=0002c9037f1f0001,dest=127.31.0.1:5555";

/// Channels `srptd` behind `sock` holds.
fn target_sessions(sock: &Path) -> usize {
    let v = common::srptadm_json(sock, &["sessions"]);
    v.as_array().map_or(0, |a| a.len())
}

/// A configuration of one iWARP target on 127.31.0.1 with a 32 MiB RAM
/// LUN and its control socket in `dir`, plus `extra` lines in `[target]`.
fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.31.0.1\"\niwarp = true\ncontrol_socket = \"{}\"\n{extra}\n\
             [[device]]\nname = \"ram0\"\nhandler = \"ram\"\nsize = \"32M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"ram0\"\n",
            dir.join("srptd.sock").display()
        ),
    )
    .unwrap();
    cfg
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("iwarp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn srp_io_and_srpd_log_in_to_srptd_over_iwarp() {
    let dir = scratch("login");
    let tsock = dir.join("srptd.sock");
    let target = common::start_srptd(&config(&dir, ""));
    let _ = &target;
    // `srptadm show` says the port is iWARP, and shows none of soft
    // RoCE's settings (its UDP port, its fabric), which do not apply.
    let show = common::srptadm_json(&tsock, &["show"]);
    assert_eq!(show["iwarp"], true, "{show}");
    assert_eq!(show["ip"], "127.31.0.1", "{show}");
    assert!(
        show.get("udp_port").is_none() && show.get("fabric").is_none(),
        "{show}"
    );

    // srp io: the same --dest as over RoCE, verified random I/O.
    let out = common::tool(common::srp_bin())
        .args([
            "io",
            "--iwarp",
            "--ip",
            "127.31.0.2",
            "--dest",
            "127.31.0.1",
            "--size",
            "16M",
            "--region",
            "8M",
            "--bs",
            "16k",
        ])
        .output()
        .unwrap();
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("over iWARP"), "{report}");
    let verified = common::report::verified_clean(&report);
    assert!(verified >= 4 << 20, "verified {verified} bytes:\n{report}");
    wait_for("srp io's logout at the target", 10, || {
        target_sessions(&tsock) == 0
    });

    // srpd: the Linux login string of a soft RoCE target at that address.
    if !rdma_testkit::need::fuse() {
        return;
    }
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let sock = dir.join("srpd.sock");
    let mut srpd = common::start_srpd("127.31.0.3", &root, &sock, &["--iwarp"]);
    for round in 0..2 {
        let login = srp(&sock, &["login", TARGET, "--name", "iw"]);
        assert!(login.status.success(), "round {round}: {}", text(&login));
        assert_eq!(target_sessions(&tsock), 1, "round {round}");
        let lun0 = root.join("iw/lun0");
        assert_eq!(std::fs::metadata(&lun0).unwrap().len(), 32 << 20);
        common::write_read_back(&lun0, 7 + round);
        let list = srp(&sock, &["list"]);
        assert!(text(&list).contains("iWARP"), "{}", text(&list));
        let logout = srp(&sock, &["logout", "iw"]);
        assert!(logout.status.success(), "{}", text(&logout));
        wait_for("srpd's logout at the target", 10, || {
            target_sessions(&tsock) == 0
        });
    }
    // An IB CM login cannot go over iWARP: refused with the way that works.
    let ib = srp(
        &sock,
        &[
            "login",
            "id_ext=1,ioc_guid=1,dgid=00000000000000000000ffff7f1f0001,pkey=ffff,service_id=1",
        ],
    );
    assert!(!ib.status.success());
    assert!(
        text(&ib).contains("iWARP does not have") && text(&ib).contains("dest=ip:port"),
        "{}",
        text(&ib)
    );
    srpd.term();
    let rest = srpd.rest(20).join("\n");
    assert!(rest.contains("0 verbs objects left"), "{rest}");
}

/// `srptd --check` of `cfg`: its failure's text.
fn refused(cfg: &Path) -> String {
    let (ok, out) = common::run(
        common::tool(common::srptd_bin())
            .arg("--check")
            .arg("--config")
            .arg(cfg),
    );
    assert!(!ok, "accepted: {out}");
    out
}

#[test]
fn iwarp_configurations_that_cannot_work_are_refused_with_the_fix() {
    let dir = scratch("config");
    let cfg = config(&dir, "device = \"siw0\"\n");
    let m = refused(&cfg);
    assert!(
        m.contains("srptd.toml:3: target.iwarp:")
            && m.contains("iwarp and device both choose the port's NIC")
            && m.contains("remove one"),
        "{m}"
    );
    let cfg = config(&dir, "fabric = \"ib\"\n");
    let m = refused(&cfg);
    assert!(
        m.contains("target.iwarp") && m.contains("remove fabric = \"ib\""),
        "{m}"
    );
    let cfg = config(&dir, "rdma_cm_port = 0\nib_cm = true\n");
    let m = refused(&cfg);
    assert!(
        m.contains("target.iwarp") && m.contains("set rdma_cm_port"),
        "{m}"
    );
    // An address this host does not have (TEST-NET-1).
    let text = std::fs::read_to_string(config(&dir, "")).unwrap();
    std::fs::write(&cfg, text.replace("127.31.0.1", "192.0.2.1")).unwrap();
    let m = refused(&cfg);
    assert!(
        m.contains("target.ip")
            && m.contains("192.0.2.1 is not an address of this host")
            && m.contains("iWARP"),
        "{m}"
    );
    // Another process's iWARP NIC on the address: refused before start.
    let held = std::net::TcpListener::bind(("127.31.0.7", 4794)).unwrap();
    let (ok, out) = common::run(
        common::tool(common::srptd_bin())
            .args(["--iwarp", "--ip", "127.31.0.7", "--ram-mib", "8"])
            .arg("--control-socket")
            .arg(dir.join("y.sock")),
    );
    assert!(
        !ok && out.contains("TCP 127.31.0.7:4794, the iWARP NIC's own port, is in use"),
        "{out}"
    );
    drop(held);
    // A login where nothing listens: said at once, with srptd's port.
    let (ok, out) = common::run(common::tool(common::srp_bin()).args([
        "io",
        "--iwarp",
        "--ip",
        "127.31.0.6",
        "--dest",
        "127.31.0.5:5556",
    ]));
    assert!(
        !ok && out.contains("nothing listens for SRP logins at 127.31.0.5:5556")
            && out.contains("srptd's default is 5555"),
        "{out}"
    );
    // The binaries' flags: what iWARP cannot go with.
    let (ok, out) =
        common::run(common::tool(common::srptd_bin()).args(["--iwarp", "--device", "siw0"]));
    assert!(!ok && out.contains("cannot be used with"), "{out}");
    let (ok, e) = common::run(
        common::tool(common::srpd_bin())
            .args(["--iwarp", "--fabric", "ib", "--ip", "127.31.0.4"])
            .arg("--mount-root")
            .arg(&dir)
            .arg("--control-socket")
            .arg(dir.join("x.sock")),
    );
    assert!(!ok, "{e}");
    assert!(e.contains("--fabric ib does not go with --iwarp"), "{e}");
}
