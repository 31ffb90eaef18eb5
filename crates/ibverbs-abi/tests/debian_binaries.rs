//! Debian's own rdma-core binaries (ibverbs-utils), unmodified, through
//! this library on one NIC daemon (issue 28's "must show", first part):
//! each test runs its daemon in this process on an address of its own in
//! 127.92.0.0/16 and the binaries as child processes with
//! `LD_LIBRARY_PATH` naming the library.

mod common;

use common::{serve_and_connect, Daemon};
use rdma_testkit::need;
use std::net::{IpAddr, Ipv4Addr};

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 92, 0, last))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn ibv_devinfo_and_ibv_devices_show_the_daemons_nic() {
    if !need::tools(&["ibv_devinfo", "ibv_devices"]) {
        return;
    }
    let d = Daemon::start(ip(1));
    let out = d.command("ibv_devinfo").arg("-v").output().unwrap();
    let o = text(&out.stdout);
    assert!(out.status.success(), "{o}{}", text(&out.stderr));
    for want in [
        "hca_id:\tnicd0",
        "transport:\t\t\tInfiniBand (0)",
        "phys_port_cnt:\t\t\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.92.0.1, RoCE v2",
        "max_mw:\t\t\t\t0",
    ] {
        assert!(o.contains(want), "no {want:?} in\n{o}");
    }
    // The node GUID the daemon's CA has, as ibv_devinfo prints it.
    assert!(o.contains("node_guid:\t\t\t0000:0000:0000:9201"), "{o}");
    let out = d.command("ibv_devices").output().unwrap();
    let o = text(&out.stdout);
    assert!(out.status.success(), "{o}");
    assert!(o.contains("nicd0") && o.contains("0000000000009201"), "{o}");
}

#[test]
fn without_a_daemon_the_list_is_empty_and_says_how_to_start_one() {
    if !need::tool("ibv_devinfo") {
        return;
    }
    let libdir = common::library_dir();
    let out = std::process::Command::new("ibv_devinfo")
        .env("LD_LIBRARY_PATH", &libdir)
        .env(nicd::SOCKET_ENV, "/nonexistent/ibverbs-abi/nicd.sock")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&libdir);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success());
    assert!(
        e.contains("No IB devices found") || o.contains("No IB devices found"),
        "{o}{e}"
    );
    assert!(
        e.contains("no NIC daemon at /nonexistent/ibverbs-abi/nicd.sock")
            && e.contains("nicd --ip ADDRESS"),
        "{e}"
    );
}

/// `tool` (`ibv_rc_pingpong` or `ibv_ud_pingpong`) as server and
/// client, validating every buffer (`-c`), over RoCE GID 0 (`-g 0`);
/// `extra` adds options to both.
fn pingpong(tool: &str, last: u8, port: u16, extra: &[&str]) {
    let d = Daemon::start(ip(last));
    let port_s = port.to_string();
    let mut args = vec!["-d", "nicd0", "-g", "0", "-p", &port_s, "-c", "-n", "200"];
    args.extend_from_slice(extra);
    let (c, s) = serve_and_connect(
        d.command(tool).args(&args),
        port,
        d.command(tool).args(&args).arg(ip(last).to_string()),
        60,
    );
    for (who, out) in [("server", &s), ("client", &c)] {
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{who}: {o}{e}");
        assert!(o.contains("200 iters in"), "{who}: {o}{e}");
        assert!(o.contains("GID ::ffff:127.92.0."), "{who}: {o}");
        assert!(
            !e.contains("Couldn't") && !e.contains("Invalid"),
            "{who}: {e}"
        );
    }
}

#[test]
fn ibv_rc_pingpong_both_roles_exchange_and_validate() {
    if !need::tool("ibv_rc_pingpong") {
        return;
    }
    pingpong("ibv_rc_pingpong", 2, 19202, &[]);
}

#[test]
fn ibv_rc_pingpong_sleeps_on_completion_events() {
    if !need::tool("ibv_rc_pingpong") {
        return;
    }
    pingpong("ibv_rc_pingpong", 3, 19203, &["-e"]);
}

#[test]
fn ibv_rc_pingpong_with_large_messages_across_pages() {
    if !need::tool("ibv_rc_pingpong") {
        return;
    }
    pingpong("ibv_rc_pingpong", 4, 19204, &["-s", "65536", "-m", "1024"]);
}

/// UD: its receives are posted in INIT, its sends carry an AH with a
/// GRH (RoCE), each receive holds the 40-byte GRH before the payload.
#[test]
fn ibv_ud_pingpong_both_roles_exchange_and_validate() {
    if !need::tool("ibv_ud_pingpong") {
        return;
    }
    pingpong("ibv_ud_pingpong", 5, 19205, &[]);
}

#[test]
fn ibv_ud_pingpong_sleeps_on_completion_events() {
    if !need::tool("ibv_ud_pingpong") {
        return;
    }
    pingpong("ibv_ud_pingpong", 6, 19206, &["-e", "-s", "1024"]);
}

/// perftest's `tool` as server and client, `-n 200` iterations over RoCE
/// GID 0: both end with success and print their result line.
fn perftest(tool: &str, last: u8, port: u16) {
    let d = Daemon::start(ip(last));
    let port_s = port.to_string();
    let args = ["-d", "nicd0", "-x", "0", "-p", &port_s, "-n", "200"];
    let (c, s) = serve_and_connect(
        d.command(tool).args(args),
        port,
        d.command(tool).args(args).arg(ip(last).to_string()),
        120,
    );
    for (who, out) in [("server", &s), ("client", &c)] {
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{tool} {who}: {o}{e}");
        assert!(o.contains("Device         : nicd0"), "{tool} {who}: {o}");
        assert!(
            o.contains("Link type       : Ethernet"),
            "{tool} {who}: {o}"
        );
        // The result line: message size, then the iterations.
        let result = o
            .lines()
            .skip_while(|l| !l.contains("#bytes"))
            .nth(1)
            .unwrap_or_default();
        let words: Vec<&str> = result.split_whitespace().collect();
        assert!(
            words.len() >= 3 && words[1] == "200",
            "{tool} {who}: no result line in {o}"
        );
    }
}

#[test]
fn perftest_ib_write_bw_both_roles() {
    if need::tool("ib_write_bw") {
        perftest("ib_write_bw", 10, 19210);
    }
}

#[test]
fn perftest_ib_read_bw_both_roles() {
    if need::tool("ib_read_bw") {
        perftest("ib_read_bw", 11, 19211);
    }
}

#[test]
fn perftest_ib_send_bw_both_roles() {
    // Its client leaves a CQ to ibv_close_device, which releases it.
    if need::tool("ib_send_bw") {
        perftest("ib_send_bw", 12, 19212);
    }
}

#[test]
fn perftest_ib_write_lat_both_roles() {
    if need::tool("ib_write_lat") {
        perftest("ib_write_lat", 13, 19213);
    }
}

/// Debian's pingpong `tool` through the library against our own
/// `rpingpong` on its own soft RoCE node (`ud`: `--ud`), each role once:
/// the exchange is ibv_rc_pingpong's, the packets RoCEv2 between two
/// addresses.
fn against_rpingpong(tool: &str, ud: bool, last: u8, ports: [u16; 2]) {
    let d = Daemon::start(ip(last));
    let ours = ip(last + 1).to_string();
    let rp = common::rdma_perf_bin("rpingpong");
    let rp_args = |port: u16| {
        let mut a = vec![
            "--bind".to_string(),
            ours.clone(),
            "-p".into(),
            port.to_string(),
            "-n".into(),
            "100".into(),
            "-s".into(),
            "1024".into(),
            "-g".into(),
            "0".into(),
        ];
        if ud {
            a.push("--ud".into());
        }
        a
    };
    let tool_args = |port: u16| {
        ["-d", "nicd0", "-g", "0", "-n", "100", "-s", "1024", "-p"]
            .iter()
            .map(|s| s.to_string())
            .chain([port.to_string()])
            .collect::<Vec<_>>()
    };
    // rpingpong serves, Debian's tool is the client.
    let (c, s) = serve_and_connect(
        std::process::Command::new(&rp)
            .env("NICD_MODE", "own")
            .args(rp_args(ports[0])),
        ports[0],
        d.command(tool).args(tool_args(ports[0])).arg(&ours),
        60,
    );
    let (co, so) = (text(&c.stdout), text(&s.stdout));
    assert!(c.status.success(), "{tool} client: {co}{}", text(&c.stderr));
    assert!(
        s.status.success(),
        "rpingpong server: {so}{}",
        text(&s.stderr)
    );
    assert!(co.contains("100 iters in"), "{co}");
    // Debian's tool serves, rpingpong is the client.
    let (c, s) = serve_and_connect(
        d.command(tool).args(tool_args(ports[1])),
        ports[1],
        std::process::Command::new(&rp)
            .env("NICD_MODE", "own")
            .args(rp_args(ports[1]))
            .arg(ip(last).to_string()),
        60,
    );
    let so = text(&s.stdout);
    assert!(
        c.status.success(),
        "rpingpong client: {}{}",
        text(&c.stdout),
        text(&c.stderr)
    );
    assert!(s.status.success(), "{tool} server: {so}{}", text(&s.stderr));
    assert!(so.contains("100 iters in"), "{so}");
}

#[test]
fn ibv_rc_pingpong_through_the_library_and_our_rpingpong_both_roles() {
    if need::tool("ibv_rc_pingpong") {
        against_rpingpong("ibv_rc_pingpong", false, 20, [19220, 19221]);
    }
}

#[test]
fn ibv_ud_pingpong_through_the_library_and_our_rpingpong_both_roles() {
    if need::tool("ibv_ud_pingpong") {
        against_rpingpong("ibv_ud_pingpong", true, 22, [19222, 19223]);
    }
}

/// perftest's `tool` through the library against our `rperftest VERB`
/// on its own soft RoCE node, each side in both roles; rperftest checks
/// the data (`verified:`).
fn against_rperftest(tool: &str, verb: &str, last: u8, ports: [u16; 2]) {
    let d = Daemon::start(ip(last));
    let ours = ip(last + 1).to_string();
    let rp = common::rdma_perf_bin("rperftest");
    let rp_args = |port: u16| {
        [verb, "--bind", &ours, "-x", "0", "-n", "200", "-p"]
            .iter()
            .map(|s| s.to_string())
            .chain([port.to_string()])
            .collect::<Vec<_>>()
    };
    let tool_args = |port: u16| {
        ["-d", "nicd0", "-x", "0", "-n", "200", "-p"]
            .iter()
            .map(|s| s.to_string())
            .chain([port.to_string()])
            .collect::<Vec<_>>()
    };
    let check = |who: &str, out: &std::process::Output| {
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{who}: {o}{e}");
        o + &e
    };
    // rperftest serves.
    let (c, s) = serve_and_connect(
        std::process::Command::new(&rp)
            .env("NICD_MODE", "own")
            .args(rp_args(ports[0])),
        ports[0],
        d.command(tool).args(tool_args(ports[0])).arg(&ours),
        120,
    );
    let co = check(&format!("{tool} client"), &c);
    let so = check("rperftest server", &s);
    assert!(co.contains("Device         : nicd0"), "{co}");
    assert!(so.contains("verified:"), "{so}");
    // perftest's tool serves.
    let (c, s) = serve_and_connect(
        d.command(tool).args(tool_args(ports[1])),
        ports[1],
        std::process::Command::new(&rp)
            .env("NICD_MODE", "own")
            .args(rp_args(ports[1]))
            .arg(ip(last).to_string()),
        120,
    );
    let co = check("rperftest client", &c);
    check(&format!("{tool} server"), &s);
    assert!(co.contains("verified:"), "{co}");
}

#[test]
fn perftest_through_the_library_and_our_rperftest_both_roles() {
    for (i, (tool, verb)) in [
        ("ib_write_bw", "write"),
        ("ib_read_bw", "read"),
        ("ib_send_bw", "send"),
    ]
    .into_iter()
    .enumerate()
    {
        if need::tool(tool) {
            let i = i as u8;
            let port = 19230 + 2 * u16::from(i);
            against_rperftest(tool, verb, 30 + 2 * i, [port, port + 1]);
        }
    }
}
