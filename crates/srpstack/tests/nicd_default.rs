//! The NIC daemon as every tool's default (issue 27): with no option
//! and no `NICD_MODE`, `srptd`, `srp`, `rperf` and `ibstat` run on the
//! daemon's soft RoCE NIC, one started on demand for the first of them,
//! and all share one address; each says so in one line. Plain `ibstat`
//! lists the daemon's CA. `--own-nic`,
//! `NICD_MODE=own` and the options only a NIC of the tool's own honours
//! give one, and the line says why; contradictions are refused in words.
//! The `ib` fabric too: `ibsm`, `srptd --fabric ib` and `saquery` share
//! one daemon, whose `ib` ports sit beside its RoCE ones.
//!
//! Each test has a daemon socket of its own (`NICD_SOCKET`), so no
//! daemon of the host is touched, and a short `NICD_IDLE_EXIT`, so the
//! daemon a test started leaves once its clients have.
//!
//! Addresses: 127.126.0.0/16 (no other test uses it).

mod common;

use common::{bin_of, ibsm_bin, sock_of, srp_bin, srptd_bin, text, wait_for, Proc};
use std::process::Command;

/// A tool with the daemon as its default: no `NICD_MODE`, the daemon at
/// `sock`, leaving 500 ms after its last client.
fn by_default(bin: std::path::PathBuf, sock: &std::path::Path) -> Command {
    let mut c = Command::new(bin);
    c.env_remove("NICD_MODE")
        .env("NICD_SOCKET", sock)
        .env("NICD_IDLE_EXIT", "500ms");
    c
}

/// Runs `cmd` (tool `tool`) to its end, which must succeed having said
/// it ran on the daemon's NIC at `ip`; its output.
fn on_the_daemons_nic(tool: &str, ip: &str, cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "{tool}: NIC: the NIC daemon's soft RoCE NIC at {ip} (pid "
        )),
        "{out}"
    );
    out
}

/// srptd's stderr, kept in a file.
fn stderr_file(tag: &str) -> (std::fs::File, std::path::PathBuf) {
    let p = std::env::temp_dir().join(format!("nicd_default-{}-{tag}.err", std::process::id()));
    (std::fs::File::create(&p).unwrap(), p)
}

#[test]
fn srptd_srp_rperf_and_ibstat_share_one_address_through_the_daemon_by_default() {
    const IP: &str = "127.126.0.1";
    let sock = sock_of("nicd_default", "nicd");
    let _ = std::fs::remove_file(&sock);
    let (err, err_path) = stderr_file("srptd");
    let target = Proc::start(
        "srptd",
        by_default(srptd_bin(), &sock)
            .args(["--ip", IP, "--ram-mib", "16", "--control-socket"])
            .arg(sock_of("nicd_default", "srptd"))
            .stderr(err),
    );
    target.wait_line("listening on 127.126.0.1:5555", 60);
    let said = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        said.contains("srptd: started the NIC daemon")
            && said.contains(&format!(
                "srptd: NIC: the NIC daemon's soft RoCE NIC at {IP} (pid "
            ))
            && said.contains(&format!(
                "{}; --own-nic for one of srptd's own)",
                sock.display()
            )),
        "{said}"
    );

    // srp at the same address: its own NIC would find UDP 4791 taken.
    let out = on_the_daemons_nic(
        "srp",
        IP,
        by_default(srp_bin(), &sock)
            .args(["io", "--dest", "127.126.0.1:5555", "--ip", IP])
            .args(["--rw", "randrw", "--bs", "4096", "--size", "2M"]),
    );
    assert!(!out.contains("started the NIC daemon"), "{out}");

    // rperf, server and client, on the same address too.
    let server = Proc::start(
        "rperf server",
        by_default(bin_of("rperf"), &sock).args([
            "server",
            "--bind",
            "127.126.0.1:4791",
            "--oob",
            "127.126.0.1:18726",
        ]),
    );
    server.wait_line("listening on 127.126.0.1:18726", 60);
    // ibstat --ip lists the daemon's CA and its clients: srptd and the
    // rperf server.
    let st = by_default(bin_of("ibstat"), &sock)
        .args(["--ip", IP])
        .output()
        .unwrap();
    let listed = text(&st);
    assert!(st.status.success(), "{listed}");
    assert!(listed.contains(&format!("nicd {IP}")), "{listed}");
    for (who, p) in [("srptd", &target), ("rperf server", &server)] {
        let line = listed
            .lines()
            .find(|l| l.contains(&format!("pid {}", p.child.id())))
            .unwrap_or_else(|| panic!("{who} is not listed among the daemon's clients: {listed}"));
        // Each runs its QPs itself, on a block of the NIC's port.
        assert!(line.contains("its own QPs on"), "{who}: {line}");
    }
    // Plain `ibstat` lists the daemon that serves, as it lists rdma-core
    // devices (none on this host's kernel, or some: either way the
    // daemon's CA is there).
    let st = by_default(bin_of("ibstat"), &sock).output().unwrap();
    let bare = text(&st);
    assert!(st.status.success(), "{bare}");
    assert!(
        bare.contains(&format!("CA 'nicd {IP}'"))
            && bare.contains(&format!("pid {}", target.child.id())),
        "{bare}"
    );
    on_the_daemons_nic(
        "rperf",
        IP,
        by_default(bin_of("rperf"), &sock)
            .args(["client", "--bind", "127.126.0.1:4791"])
            .args(["--server", "127.126.0.1:18726", "--op", "write"])
            .args(["--size", "4096", "--iters", "200", "--verify"]),
    );

    drop(server);
    drop(target);
    // Without clients the daemon started on demand leaves, and takes its
    // socket with it (watched without connecting: a connection is a
    // client).
    wait_for("the daemon started on demand to leave", 20, || {
        !sock.exists()
    });
    let _ = std::fs::remove_file(&err_path);
}

/// srptd's NIC line when started as `args` (with `env`), and that no
/// daemon answers at its socket: the NIC was its own.
fn own_nic_line(tag: &str, ip: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let sock = sock_of("nicd_default", tag);
    let _ = std::fs::remove_file(&sock);
    let (err, err_path) = stderr_file(tag);
    let mut cmd = by_default(srptd_bin(), &sock);
    cmd.args(["--ip", ip, "--ram-mib", "16", "--control-socket"])
        .arg(sock_of("nicd_default", &format!("{tag}-srptd")))
        .args(args)
        .envs(env.iter().copied())
        .stderr(err);
    let target = Proc::start("srptd", &mut cmd);
    target.wait_line(&format!("listening on {ip}:5555"), 60);
    drop(target);
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "a daemon answers at {}",
        sock.display()
    );
    let said = std::fs::read_to_string(&err_path).unwrap();
    let _ = std::fs::remove_file(&err_path);
    said.lines()
        .find(|l| l.starts_with("srptd: NIC: "))
        .unwrap_or_else(|| panic!("no NIC line: {said}"))
        .to_string()
}

#[test]
fn a_nic_of_its_own_when_asked_and_the_line_says_why() {
    assert_eq!(
        own_nic_line("own", "127.126.1.1", &["--own-nic"], &[]),
        "srptd: NIC: its own soft RoCE NIC at 127.126.1.1 (--own-nic)"
    );
    assert_eq!(
        own_nic_line("env", "127.126.1.2", &[], &[("NICD_MODE", "own")]),
        "srptd: NIC: its own soft RoCE NIC at 127.126.1.2 (NICD_MODE=own)"
    );
    assert_eq!(
        own_nic_line("port", "127.126.1.3", &["--udp-port", "4796"], &[]),
        "srptd: NIC: its own soft RoCE NIC at 127.126.1.3 (target.udp_port = 4796)"
    );
    assert_eq!(
        own_nic_line("mtu", "127.126.1.4", &["--mtu", "1024"], &[]),
        "srptd: NIC: its own soft RoCE NIC at 127.126.1.4 (target.mtu = 1024)"
    );
}

#[test]
fn contradictions_are_refused_in_words() {
    let sock = sock_of("nicd_default", "refused");
    // Both at once: clap names the conflict.
    let o = by_default(srptd_bin(), &sock)
        .args(["--nicd", "--own-nic", "--ip", "127.126.2.1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("cannot be used with"), "{}", text(&o));
    // --nicd with an option only a NIC of srp's own honours.
    let o = by_default(srp_bin(), &sock)
        .args(["luns", "--dest", "127.126.2.1:5555", "--ip", "127.126.2.2"])
        .args(["--udp-port", "4796", "--nicd"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--udp-port 4796 sets up a NIC of this tool's own")
            && text(&o).contains("drop --udp-port 4796, or --nicd"),
        "{}",
        text(&o)
    );
    // A NICD_MODE that is neither.
    let o = by_default(srp_bin(), &sock)
        .args(["luns", "--dest", "127.126.2.1:5555", "--ip", "127.126.2.2"])
        .env("NICD_MODE", "shared")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("NICD_MODE=shared: give NICD_MODE=own"),
        "{}",
        text(&o)
    );
    // Nothing was started for any of them.
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_err());
}

/// The `ib` fabric through the daemon by default: `ibsm run` starts one
/// on demand with an `ib` port at the SM's address; `srptd --fabric ib`
/// at another address has it add an `ib` port there (with its SMA),
/// which the SM brings ACTIVE; `saquery` at a third address asks the SA
/// through the same daemon (from a RoCE port the daemon adds there) and
/// finds srptd's port with device management. A tool of the `ib` fabric
/// at that RoCE port's address is refused in words: no SM runs there.
#[test]
fn ibsm_srptd_on_ib_and_saquery_share_the_daemon_by_default() {
    const SM: &str = "127.126.3.1";
    const T: &str = "127.126.3.2";
    const Q: &str = "127.126.3.3";
    let sock = sock_of("nicd_default", "nicd-ib");
    let _ = std::fs::remove_file(&sock);
    let quiet = |mut c: Command| {
        c.env("SOFTROCE_FOLLOW_LINK", "0");
        c
    };
    let (err, err_path) = stderr_file("ibsm");
    let sm = Proc::start(
        "ibsm",
        quiet(by_default(ibsm_bin(), &sock))
            .args(["run", "--addr", SM, "--node", T])
            .args(["--sweep-interval-ms", "200", "--timeout-ms", "100"])
            .stderr(err),
    );
    sm.wait_line("ibsm: SM and SA at 127.126.3.1 (LID 1)", 60);
    let said = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        said.contains("ibsm: started the NIC daemon")
            && said.contains(&format!(
                "ibsm: NIC: the NIC daemon's soft RoCE NIC at {SM} (pid "
            )),
        "{said}"
    );

    let target = Proc::start(
        "srptd",
        quiet(by_default(srptd_bin(), &sock))
            .args(["--fabric", "ib", "--sm-wait-ms", "20000"])
            .args(["--ip", T, "--ram-mib", "16", "--control-socket"])
            .arg(sock_of("nicd_default", "srptd-ib")),
    );
    let l = target.wait_line("ACTIVE on the managed subnet", 60);
    assert!(l.contains("LID"), "{l}");
    target.wait_line("listening on", 30);

    let q = quiet(by_default(bin_of("saquery"), &sock))
        .args(["--ip", Q, "--sa", SM, "ports", "--dm"])
        .output()
        .unwrap();
    let out = text(&q);
    assert!(q.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "saquery: NIC: the NIC daemon's soft RoCE NIC at {Q} (pid "
        )),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.contains("ACTIVE")) && out.contains("1 port records"),
        "srptd's port, with device management, ACTIVE: {out}"
    );

    // The daemon serves saquery's address on the roce fabric.
    let o = quiet(by_default(srptd_bin(), &sock))
        .args([
            "--fabric",
            "ib",
            "--ip",
            Q,
            "--ram-mib",
            "8",
            "--control-socket",
        ])
        .arg(sock_of("nicd_default", "srptd-ib-refused"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "the NIC daemon serves 127.126.3.3 on the roce fabric, not the ib one, and no subnet \
             manager runs there"
        ),
        "{}",
        text(&o)
    );

    drop(target);
    drop(sm);
    wait_for("the daemon started on demand to leave", 20, || {
        !sock.exists()
    });
}

/// rperftest on the daemon's NIC, its QPs in its own process, reports
/// that node's counters as it does those of a NIC of its own.
#[test]
fn rperftest_on_the_daemons_nic_reports_its_qps_counters() {
    const IP: &str = "127.126.4.1";
    let sock = sock_of("nicd_default", "counters");
    let _ = std::fs::remove_file(&sock);
    let common = ["-p", "18539", "-s", "3000", "-n", "200", "--timeout", "20"];
    let server = Proc::start(
        "rperftest server",
        by_default(bin_of("rperftest"), &sock)
            .args(["write", "--bind", IP])
            .args(common),
    );
    server.wait_line("Waiting for client", 60);
    let out = on_the_daemons_nic(
        "rperftest",
        IP,
        by_default(bin_of("rperftest"), &sock)
            .args(["write", IP, "--bind", IP])
            .args(common),
    );
    assert!(out.contains("verified: 200 completions"), "{out}");
    let sent: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix(" NIC: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no NIC counters: {out}"));
    // 200 WRITEs of 3000 bytes, one 4096-byte packet each.
    assert!(sent >= 200, "{out}");
    server.rest(30);
}
