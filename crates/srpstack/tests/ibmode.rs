//! The IB-managed mode end to end on 127.0.140.x: `ibsm run` brings up
//! `srptd --fabric ib`, `srpd --fabric ib` and `srp discover --sa` ports;
//! discovery through the SA finds the target and prints its login string;
//! srpd logs in along SA PathRecords and data written through the LUN file
//! reads back; a target started while the discover loop waits is found
//! through trap 64 long before the rescan period, and its departure is
//! noted through trap 65; a partition the target is not in, an unknown
//! P_Key and a fabric without an SM give clear errors. When the master SM
//! dies and the standby takes over, the discover loop subscribes again at
//! the new master, whose trap 64 then brings a new target.
//!
//! Skipped when the machine lacks FUSE, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::{gid_hex as gid_of, ibsm_bin, run, tool, Proc};
use rdma_types::Gid;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn gid_hex(last: u8) -> String {
    gid_of(ip(last))
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 140, last))
}

/// `ibsm run` at 127.0.140.`at` for the nodes `nodes`, sweeping every
/// 200 ms unless `extra` (arguments after those) says otherwise.
fn ibsm(at: u8, nodes: &[u8], extra: &[&str]) -> Proc {
    let mut cmd = tool(ibsm_bin());
    cmd.args(["run", "--addr", &ip(at).to_string()]);
    for n in nodes {
        cmd.args(["--node", &ip(*n).to_string()]);
    }
    if !extra.contains(&"--sweep-interval-ms") {
        cmd.args(["--sweep-interval-ms", "200"]);
    }
    cmd.args(["--timeout-ms", "100", "--retries", "1"])
        .args(extra);
    let p = Proc::start("ibsm", &mut cmd);
    p.wait_line("ibsm: SM and SA at", 20);
    p
}

fn srptd(last: u8, sock: &Path) -> Proc {
    let p = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--fabric", "ib", "--sm-wait-ms", "10000"])
            .args(["--ip", &ip(last).to_string(), "--ram-mib", "8"])
            .arg("--control-socket")
            .arg(sock),
    );
    let l = p.wait_line("ACTIVE on the managed subnet", 20);
    assert!(l.contains("LID "), "{l}");
    p.wait_line("listening on", 20);
    p
}

fn srp() -> Command {
    common::tool(common::srp_bin())
}

#[test]
fn discovery_login_and_traps_through_the_sa() {
    if !rdma_testkit::need::fuse() {
        return;
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("srp-ibmode-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    // Partitions: storage (0x0010) holds the discover port (.4, full) and
    // the first target (.2, limited); solo (0x0020) only srpd's port (.3).
    let g = |last| rnic::softroce::ip_guid(ip(last)).0;
    let parts = dir.join("partitions.conf");
    std::fs::write(
        &parts,
        format!(
            "Default=0x7fff : ALL=full ;\nstorage=0x0010 : {:#x}=full, {:#x} ;\nsolo=0x0020 : {:#x}=full ;\n",
            g(4),
            g(2),
            g(3)
        ),
    )
    .unwrap();
    let _sm = ibsm(1, &[2, 3, 4, 5], &["--partitions", parts.to_str().unwrap()]);
    let _t1 = srptd(2, &dir.join("t1.sock"));
    // The target's CM agent (the ib port's) is tracked by its access
    // layer: its listens are CM ids, its DM agent a MAD agent.
    let out = Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(dir.join("t1.sock"))
        .args(["--json", "show"])
        .output()
        .unwrap();
    let show: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(show["cm_ids"].as_i64() >= Some(1), "{show}");
    assert!(show["mad_agents"].as_i64() >= Some(1), "{show}");
    let sock = dir.join("srpd.sock");
    let srpd = Proc::start(
        "srpd",
        common::tool(common::srpd_bin())
            .args(["--fabric", "ib", "--sm-wait-ms", "10000"])
            .args(["--ip", &ip(3).to_string()])
            .arg("--mount-root")
            .arg(&root)
            .arg("--control-socket")
            .arg(&sock),
    );
    srpd.wait_line("srpd: ready on", 20);

    // One walk through the SA: the target's login string, with the dgid
    // of its port and its ib GUID as id_ext and ioc_guid.
    let t1_guid = rnic::softroce::ip_guid(ip(2)).0;
    let want = format!(
        "id_ext={t1_guid:016x},ioc_guid={t1_guid:016x},dgid={},pkey=ffff,service_id={t1_guid:016x}",
        gid_hex(2)
    );
    let (ok, out) = run(srp()
        .args(["discover", "--sa", "--ip", &ip(4).to_string()])
        .args(["--timeout-ms", "200", "--pkey", "ffff"]));
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("id_ext=")).count(),
        1,
        "{out}"
    );
    assert!(out.contains(&want), "{out}");
    // The same walk in partition 0x0010 (srp_daemon -p): the path, and so
    // the login string, carry its P_Key.
    let (ok, out) = run(srp()
        .args(["discover", "--sa", "--ip", &ip(4).to_string()])
        .args(["--timeout-ms", "200", "--pkey", "8010"]));
    assert!(ok, "{out}");
    assert!(
        out.contains(&want.replace("pkey=ffff", "pkey=8010")),
        "{out}"
    );

    // srpd in partition 0x0020: the SA has no path to the target there.
    let in_solo = want.replace("pkey=ffff", "pkey=8020");
    let (ok, out) = run(srp()
        .args(["login", &in_solo, "--control-socket"])
        .arg(&sock));
    assert!(!ok, "{out}");
    assert!(
        out.contains("has no path from 127.0.140.3") && out.contains("in partition 8020"),
        "{out}"
    );
    // A partition srpd's port is not in at all.
    let (ok, out) = run(srp()
        .args([
            "login",
            &want.replace("pkey=ffff", "pkey=1234"),
            "--control-socket",
        ])
        .arg(&sock));
    assert!(
        !ok && out.contains("P_Key 1234: port 127.0.140.3 is not a member"),
        "{out}"
    );

    // Along a good path, a login the target refuses: the SRP_LOGIN_REJ in
    // words, not a path failure.
    let (ok, out) = run(srp()
        .args([
            "login",
            &want.replace(&format!("id_ext={t1_guid:016x}"), "id_ext=00000000000000ff"),
            "--control-socket",
        ])
        .arg(&sock));
    assert!(!ok, "{out}");
    assert!(
        out.contains("SRP login rejected: unable to associate RDMA channel with I_T nexus"),
        "{out}"
    );

    // The discover loop with a long rescan period: the target there now is
    // logged in through srpd (paths from the SA).
    let mut discover = Proc::start(
        "srp discover",
        srp()
            .args(["discover", "--sa", "--ip", &ip(4).to_string()])
            .args(["--timeout-ms", "200", "--rescan", "60", "--login", "-v"])
            .arg("--control-socket")
            .arg(&sock),
    );
    discover.wait_line("subscribed to traps 64/65", 20);
    let first = discover.wait_line("# logged in as", 20);
    let first = first.rsplit(' ').next().unwrap().to_string();
    let (ok, out) = run(srp()
        .args(["list", "--json", "--control-socket"])
        .arg(&sock));
    assert!(ok, "{out}");
    assert!(out.contains(&want), "{out}");

    // Verified write then read through the LUN file.
    let file = root.join(&first).join("lun0");
    common::write_read_back(&file, 7);

    // A second target comes up while the loop waits out its 60 s: trap
    // 64 has it scanned and logged in at once.
    let appeared = Instant::now();
    let t2 = srptd(5, &dir.join("t2.sock"));
    let l = discover.wait_line("# trap 64", 20);
    assert!(l.contains("::ffff:127.0.140.5"), "{l}");
    let l = discover.wait_line("# logged in as", 20);
    assert!(!l.ends_with(&format!(" {first}")), "{l}");
    let took = appeared.elapsed();
    assert!(took < Duration::from_secs(20), "{took:?}");
    eprintln!(
        "second target logged in {} ms after it started",
        took.as_millis()
    );
    // It goes away: the SM's next sweep misses it, trap 65 says so.
    drop(t2);
    let l = discover.wait_line("# trap 65", 20);
    assert!(l.contains("::ffff:127.0.140.5"), "{l}");

    discover.term();
    let rest = discover.rest(20);
    // The first scan and the one trap 64 started, plus one retry for
    // each scan that had failures (on a loaded machine a 200 ms MAD
    // timeout can expire while the new target starts).
    let retries = discover.passed_over_containing("had failures")
        + rest.iter().filter(|l| l.contains("had failures")).count();
    let scans = format!("stopped after {} scans", 2 + retries);
    assert!(rest.iter().any(|l| l.contains(&scans)), "{scans}: {rest:?}");
    assert!(discover.child.wait().unwrap().success());
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("ibmode test: {} ms", started.elapsed().as_millis());
}

#[test]
fn without_an_sm_or_with_a_foreign_pkey_the_errors_are_clear() {
    // No SM sweeps .20 or .21: bounded waits, then errors that say why.
    let sock = std::env::temp_dir().join(format!("srp-ibmode-nosm-{}.sock", std::process::id()));
    let (ok, out) = run(common::tool(common::srptd_bin())
        .args([
            "--fabric",
            "ib",
            "--sm-wait-ms",
            "300",
            "--ip",
            "127.0.140.20",
        ])
        .arg("--control-socket")
        .arg(&sock));
    assert!(!ok, "{out}");
    assert!(
        out.contains("still INIT after 300 ms: no subnet manager configured it"),
        "{out}"
    );
    let (ok, out) = run(srp().args([
        "discover",
        "--sa",
        "--ip",
        "127.0.140.21",
        "--sm-wait-ms",
        "300",
    ]));
    assert!(!ok, "{out}");
    assert!(out.contains("ibsm run --node 127.0.140.21"), "{out}");
    // An SM is there, but our port is not in partition 0x1234.
    let _sm = ibsm(30, &[31], &[]);
    let (ok, out) = run(srp()
        .args(["discover", "--sa", "--ip", "127.0.140.31", "--pkey", "1234"])
        .args(["--sm-wait-ms", "5000"]));
    assert!(!ok, "{out}");
    assert!(
        out.contains("P_Key 1234: port 127.0.140.31 is not a member of that partition (its P_Key table: ffff)"),
        "{out}"
    );
    // Bad input on the command line.
    let (ok, out) = run(srp().args(["discover", "--sa", "--pkey", "nonsense"]));
    assert!(!ok && out.contains("not a 16-bit hex P_Key"), "{out}");
    let (ok, out) = run(srp().args(["discover", "--sa", "--target", "127.0.140.2"]));
    assert!(!ok && out.contains("cannot be used with"), "{out}");
}

#[test]
fn the_discover_loop_follows_a_new_master_sm() {
    let dir = std::env::temp_dir().join(format!("srp-ibmode-ho-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Two SMs listing each other: A (LID 1, priority 5) is master, B
    // (LID 2) standby, polling A every 100 ms.
    let sms = |me: u8, peer: u8, lid: &'static str, prio: &'static str| {
        ibsm(
            me,
            &[peer, 42, 43],
            &[
                "--lid",
                lid,
                "--priority",
                prio,
                "--poll-interval-ms",
                "100",
            ],
        )
    };
    let mut sm_a = sms(40, 41, "1", "5");
    let sm_b = sms(41, 40, "2", "1");
    sm_b.wait_line("SM state STANDBY", 20);
    let mut discover = Proc::start(
        "srp discover",
        srp()
            .args(["discover", "--sa", "--ip", &ip(42).to_string()])
            .args(["--timeout-ms", "200", "--rescan", "60", "-v"]),
    );
    discover.wait_line("subscribed to traps 64/65 (SM LID 1)", 20);
    let l = discover.wait_line("# scan 1 done", 20);
    assert!(l.ends_with("0 SRP target ports"), "{l}");
    // The master dies without a word; B takes over, the port's SM LID
    // moves to 2 and the loop subscribes at B.
    let killed = Instant::now();
    sm_a.child.kill().unwrap();
    sm_a.child.wait().unwrap();
    discover.wait_line("SM LID 1 -> 2: subscribing again", 20);
    discover.wait_line("subscribed to traps 64/65 (SM LID 2)", 20);
    eprintln!(
        "subscribed at the new master {} ms after the old one died",
        killed.elapsed().as_millis()
    );
    // B's trap 64 for a target that comes up now: scanned at once. (B,
    // master now, may first report ports it found on taking over, such
    // as the discover loop's own: those are not the one awaited.)
    let _t = srptd(43, &dir.join("t.sock"));
    let l = discover.wait_line("# trap 64: port ::ffff:127.0.140.43 in service", 20);
    assert!(l.ends_with("scanning"), "{l}");
    let g = rnic::softroce::ip_guid(ip(43)).0;
    let l = discover.wait_line("id_ext=", 20);
    assert!(
        l.starts_with(&format!(
            "id_ext={g:016x},ioc_guid={g:016x},dgid={}",
            gid_hex(43)
        )),
        "{l}"
    );
    discover.term();
    assert!(discover.child.wait().unwrap().success());
    drop(sm_b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `SaPathConnector` on its own, in-process against `ibsm run`: while the
/// target's port answers nothing, the path from the first query and the
/// one from a fresh query are both tried and the error names each.
#[test]
fn sa_path_login_tries_a_fresh_query_when_every_path_failed() {
    use rdma_access::subnet::IbPort;
    use rdma_types::{Guid, Lid, Mtu, Pkey, Psn, Qpn};
    use rnic::softroce::ip_guid as ib_guid;
    use srp_initiator::connectors::SaPathConnector;
    use srp_initiator::session::{ConnectError, Connector, QpInfo};
    let (gi, gt) = (ib_guid(ip(51)), ib_guid(ip(52)));
    let p = rnic::softroce::SoftRoce::new(
        vec![
            rnic::softroce::SoftCa {
                guid: gi,
                ip: ip(51),
            },
            rnic::softroce::SoftCa {
                guid: gt,
                ip: ip(52),
            },
        ],
        rnic::softroce::ROCE_PORT,
    );
    let start = |g: Guid, at: u8, id: u32| {
        p.set_personality(g, rnic::softroce::Personality::Ib)
            .unwrap();
        Arc::new(IbPort::start(p.clone(), g, ip(at), "t", false, id).unwrap())
    };
    let (init, target) = (start(gi, 51, 0x51 << 16), start(gt, 52, 0x52 << 16));
    // The ports are up before the SM: its first sweep takes them, the
    // next comes in a minute, so the SA keeps the target's path while its
    // port is mute.
    let _sm = ibsm(50, &[51, 52], &["--sweep-interval-ms", "60000"]);
    for x in [&init, &target] {
        x.wait_active(Duration::from_secs(10)).unwrap();
    }
    const SID: u64 = 0x0140_5200_0000_0001;
    let conn = SaPathConnector {
        port: init.clone(),
        dgid: Gid::from_ip(ip(52)),
        pkey: Pkey(0xffff),
        service_id: SID,
        timeout: Duration::from_millis(300),
        max_paths: 4,
    };
    let local = QpInfo {
        qpn: Qpn::from_bits(0x51),
        psn: Psn::new(1),
        gid: Gid::from_ip(ip(51)),
        lid: Lid(init.lid()),
        mtu: Mtu::Mtu1024,
    };
    // The target's cable pulled: nothing reaches it, nothing comes back,
    // and the SM will not notice before its next sweep.
    p.set_port_active(gt, false).unwrap();
    let t0 = Instant::now();
    let Err(ConnectError::Failed(why)) = conn.connect(b"login", local) else {
        panic!("connected to a port without a link");
    };
    assert!(
        why.contains("query 1 path 1 (DLID ")
            && why.contains("query 2 path 1 (DLID ")
            && why.contains("timed out"),
        "{why}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(target);
}
