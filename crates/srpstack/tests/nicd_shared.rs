//! One address, one NIC daemon, the tools at once (issue 27): on
//! 127.91.0.1 `nicd` owns the soft RoCE NIC (UDP port 4791), and
//! `srptd`, `srpd` (logged in to srptd, its LUN a file under its mount
//! root), `srp discover`, `srp io` and `rperf server`/`client` all run on
//! it together through their `--nicd` option, the logins and discovery
//! through the daemon's shared QP1. `srp io` verifies what it reads
//! back, `rperf --verify` its WRITEs, and a pattern written through
//! srpd's LUN file reads back, all at the same time. Without the daemon
//! each would need an address of its own. The srpd part is skipped
//! without FUSE (a failure under `CI=true`).
//!
//! `rpingpong --nicd`: both ends of an ibv_rc_pingpong exchange on one
//! address, through the daemon.
//!
//! Addresses: 127.91.0.1 to 127.91.0.3 (no other test uses
//! 127.91.0.0/16).

mod common;

use common::{assert_nicd_clients, bin_of, sock_of, srp, srp_bin, srpd_bin, srptd_bin, tool, Proc};
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::{Command, Stdio};

const IP: &str = "127.91.0.1";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `nicd` serving `ip` on a socket of its own (named with `tag`), and
/// `srptd` through it with a 16 MiB RAM LUN, both ready: the socket and
/// the two.
fn nicd_and_srptd(ip: &str, tag: &str) -> (std::path::PathBuf, Proc, Proc) {
    let sock = sock_of("nicd_shared", &format!("nicd{tag}"));
    let _ = std::fs::remove_file(&sock);
    let nicd = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--ip", ip, "--socket"])
            .arg(&sock),
    );
    nicd.wait_line("serving", 60);
    let target = Proc::start(
        "srptd",
        tool(srptd_bin())
            .arg("--nicd")
            .arg(&sock)
            .args(["--ip", ip, "--ram-mib", "16", "--control-socket"])
            .arg(sock_of("nicd_shared", &format!("srptd{tag}"))),
    );
    target.wait_line(&format!("listening on {ip}:5555"), 60);
    (sock, nicd, target)
}

#[test]
fn srptd_srp_and_rperf_share_one_address_through_nicd() {
    let (sock, nicd, target) = nicd_and_srptd(IP, "");
    let perf_server = Proc::start(
        "rperf server",
        tool(bin_of("rperf"))
            .args(["server", "--nicd"])
            .arg(&sock)
            .args(["--bind", "127.91.0.1:4791", "--oob", "127.91.0.1:18791"]),
    );
    perf_server.wait_line("listening on 127.91.0.1:18791", 60);

    // Discovery asks srptd's DM agent through the daemon's QP1.
    let found = tool(srp_bin())
        .args(["discover", "--nicd"])
        .arg(&sock)
        .args(["--ip", IP, "--target", IP])
        .output()
        .unwrap();
    let out = text(&found.stdout);
    assert!(found.status.success(), "{out}{}", text(&found.stderr));
    // srptd's port GUID is its address's (0002c903, then 127.91.0.1).
    assert!(
        out.contains("id_ext=0002c9037f5b0001")
            && out.contains("dgid=00000000000000000000ffff7f5b0001"),
        "{out}"
    );
    assert!(
        text(&found.stderr)
            .contains("srp: NIC: the NIC daemon's soft RoCE NIC at 127.91.0.1 (pid "),
        "{}",
        text(&found.stderr)
    );

    // srpd logged in to srptd: its LUN 0 a file under its mount root.
    let dir = std::env::temp_dir().join(format!("nicd_shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let srpd_sock = dir.join("srpd.sock");
    let srpd = rdma_testkit::need::part("the srpd part").fuse().then(|| {
        let p = Proc::start(
            "srpd",
            tool(srpd_bin())
                .arg("--nicd")
                .arg(&sock)
                .args(["--ip", IP, "--mount-root"])
                .arg(&root)
                .arg("--control-socket")
                .arg(&srpd_sock),
        );
        p.wait_line("srpd: ready on", 60);
        let target = "id_ext=0002c9037f5b0001,ioc_guid=0002c9037f5b0001,dest=127.91.0.1:5555";
        let login = srp(&srpd_sock, &["login", target, "--name", "tgt"]);
        assert!(
            login.status.success(),
            "{}{}",
            text(&login.stdout),
            text(&login.stderr)
        );
        p
    });
    let lun_file = root.join("tgt/lun0");
    let file_io = srpd.as_ref().map(|_| {
        let lun_file = lun_file.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&lun_file)
                .unwrap();
            for round in 0..8u32 {
                let pattern: Vec<u8> = (0..65536u32)
                    .map(|i| (i.wrapping_mul(31) ^ round) as u8)
                    .collect();
                // Past `srp io`'s region (the LUN's first 8 MiB).
                let at = u64::from(8 + round) << 20;
                f.seek(SeekFrom::Start(at)).unwrap();
                f.write_all(&pattern).unwrap();
                f.sync_all().unwrap();
                let mut back = vec![0u8; pattern.len()];
                f.seek(SeekFrom::Start(at)).unwrap();
                f.read_exact(&mut back).unwrap();
                assert!(back == pattern, "srpd's LUN file read back other data");
            }
        })
    });

    // Verified SRP I/O and verified RDMA WRITEs at the same time.
    let io = tool(srp_bin())
        .args(["io", "--nicd"])
        .arg(&sock)
        .args(["--ip", IP, "--dest", "127.91.0.1:5555", "--size", "8M"])
        .args(["--region", "8M"])
        .args(["--rw", "randrw", "--bs", "4096"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let perf = tool(bin_of("rperf"))
        .args(["client", "--nicd"])
        .arg(&sock)
        .args(["--bind", "127.91.0.1:4791", "--server", "127.91.0.1:18791"])
        .args(["--iters", "2000", "--verify"])
        .output()
        .unwrap();
    let io = io.wait_with_output().unwrap();
    if let Some(t) = file_io {
        t.join().expect("srpd's file I/O verified");
    }
    let (io_out, perf_out) = (text(&io.stdout), text(&perf.stdout));
    assert!(io.status.success(), "{io_out}{}", text(&io.stderr));
    assert!(
        io_out.contains(", 0 verify failures, 0 I/O errors") && io_out.contains("verified"),
        "{io_out}"
    );
    assert!(perf.status.success(), "{perf_out}{}", text(&perf.stderr));
    let row = perf_out
        .lines()
        .find(|l| l.trim_start().starts_with("write"))
        .unwrap_or_else(|| panic!("no result row: {perf_out}"));
    assert!(row.trim_end().ends_with("yes"), "not verified: {row}");
    assert!(perf_out.contains("on the NIC daemon's"), "{perf_out}");

    // The daemon lists srptd among its clients; one NIC served them all.
    assert_nicd_clients(&sock, &[("srptd", &target)]);
    if let Some(p) = &srpd {
        assert_nicd_clients(&sock, &[("srpd", p)]);
        let out = srp(&srpd_sock, &["logout", "tgt"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
    drop(perf_server);
    // Its RAM LUN's memory, which the daemon cannot reach, registered in
    // srptd's own node: READs went out of it, nothing in its log (its
    // stdout, to its end) to warn about.
    let mut target = target;
    target.term();
    let log = target.rest(30);
    let warned = "cannot register a memory store";
    assert_eq!(target.passed_over_containing(warned), 0);
    assert!(!log.iter().any(|l| l.contains(warned)), "{log:?}");
    drop(nicd);
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn rpingpong_server_and_client_on_one_address_through_nicd() {
    let sock = sock_of("nicd_shared_pingpong", "nicd");
    let _ = std::fs::remove_file(&sock);
    let nicd = Proc::start(
        "nicd",
        Command::new(bin_of("nicd"))
            .args(["--ip", "127.91.0.2", "--socket"])
            .arg(&sock),
    );
    nicd.wait_line("serving", 60);
    let pingpong = || {
        let mut c = tool(bin_of("rpingpong"));
        c.args([
            "--bind",
            "127.91.0.2",
            "-p",
            "18652",
            "-n",
            "300",
            "-s",
            "3000",
        ])
        .arg("--nicd")
        .arg(&sock);
        c
    };
    let server = Proc::start("rpingpong server", &mut pingpong());
    server.wait_line("waiting on", 30);
    let out = pingpong().arg("127.91.0.2").output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1800000 bytes in"), "{stdout}");
    assert!(
        stderr.contains("rpingpong: NIC: the NIC daemon's soft RoCE NIC at 127.91.0.2 (pid "),
        "{stderr}"
    );
    // The server ran its 300 exchanges too, on the same NIC.
    assert!(
        server
            .rest(30)
            .iter()
            .any(|l| l.contains("1800000 bytes in")),
        "the server did not finish its exchanges"
    );
    drop(server);
    drop(nicd);
    let _ = std::fs::remove_file(&sock);
}

/// `kill -9` of one `srp io` in the middle of its verified I/O, through
/// the daemon (its QPs in its own process): srptd's channel for it
/// closes (the daemon ends its CM connection with a DREQ), another
/// `srp io` running meanwhile verifies to its end, and the daemon lists
/// the killed one no more.
#[test]
fn a_killed_srp_io_ends_its_channel_and_the_others_io_verifies() {
    const AT: &str = "127.91.0.3";
    let (sock, _nicd, target) = nicd_and_srptd(AT, "-kill");
    // Each client an initiator port of its own (a second login of one
    // port would end the first's channels, as SRP has it).
    let io = |size: &str, rw: &str, port: &str| {
        let mut c = tool(srp_bin());
        c.args(["io", "--nicd"])
            .arg(&sock)
            .args(["--ip", AT, "--dest", "127.91.0.3:5555", "--size", size])
            .args(["--region", "4M", "--rw", rw, "--bs", "4096"])
            .args(["--initiator-ext", port]);
        c
    };
    // The victim: far more than it will do before it is killed, reading
    // only (the others verify what they write to the same blocks).
    let mut victim = io("64G", "randread", "a1")
        .arg("--no-verify")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = target.wait_line("accepted (channel", 60);
    // A whole verified run of another client first: by its end the
    // victim's login is long established (a kill before the CM's RTU
    // would leave srptd's channel to its login timeout) and at work.
    let before = io("16M", "randrw", "a2").output().unwrap();
    assert!(before.status.success(), "{}", text(&before.stderr));
    target.wait_line("accepted (channel", 60);
    // The survivor, logged in and at work before the kill.
    let survivor = io("96M", "randrw", "a3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    target.wait_line("accepted (channel", 60);
    victim.kill().unwrap();
    victim.wait().unwrap();
    let channel = first
        .split("(channel ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no channel number: {first}"));
    let closed = target.wait_line(&format!("channel {channel} of "), 60);
    assert!(closed.contains("closed"), "{closed}");
    let out = survivor.wait_with_output().unwrap();
    let io_out = text(&out.stdout);
    assert!(out.status.success(), "{io_out}{}", text(&out.stderr));
    assert!(
        io_out.contains(", 0 verify failures, 0 I/O errors") && io_out.contains("verified"),
        "{io_out}"
    );
    let listed = Command::new(bin_of("nicd"))
        .args(["--clients", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let listed = text(&listed.stdout);
    assert!(
        !listed.contains(&format!("pid {} ", victim.id())),
        "the killed client is still listed: {listed}"
    );
    assert_nicd_clients(&sock, &[("srptd", &target)]);
}
