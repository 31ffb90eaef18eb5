//! The IB-managed mode end to end on 127.0.140.x: a subnet manager (the
//! `ibsm run` engine, `ib_sm::port::SmPort`, stepped by a thread of the
//! test: Cargo builds no other package's binaries for this one) brings up
//! `srptd --fabric ib`, `srpd --fabric ib` and `srp discover --sa` ports;
//! discovery through the SA finds the target and prints its login string;
//! srpd logs in along SA PathRecords and data written through the LUN file
//! reads back; a target started while the discover loop waits is found
//! through trap 64 long before the rescan period, and its departure is
//! noted through trap 65; a partition the target is not in, an unknown
//! P_Key and a fabric without an SM give clear errors.
//!
//! Prints "SKIPPED: ..." and passes when the machine lacks FUSE.

mod common;

use common::Proc;
use ib_sm::port::SmPort;
use ib_sm::SmConfig;
use rdma_types::{Gid, Guid, Lid};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 140, last))
}

fn gid_hex(last: u8) -> String {
    Gid::from_ip(ip(last))
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The SM and SA at 127.0.140.`at`, sweeping the nodes `nodes` every
/// 200 ms, as `ibsm run` does; stopped on drop.
struct Sm {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sm {
    fn start(at: u8, nodes: &[u8], partitions: &str) -> Sm {
        let guid = Guid(0x0140_0000_0000_0000 | u64::from(at));
        let nic = SoftRoce::new(vec![SoftCa { guid, ip: ip(at) }], ROCE_PORT);
        nic.set_personality(guid, Personality::Ib).unwrap();
        let mut cfg = SmConfig::new(guid);
        cfg.sweep_interval = rdma_types::Duration::from_millis(200);
        cfg.timeout = rdma_types::Duration::from_millis(100);
        cfg.retries = 1;
        if !partitions.is_empty() {
            cfg.partitions = ib_sm::parse_partitions(partitions).unwrap();
        }
        let gids: Vec<Gid> = nodes.iter().map(|&n| Gid::from_ip(ip(n))).collect();
        let mut port = SmPort::open(nic.clone(), guid, cfg, &gids).unwrap();
        nic.set_lid(guid, Lid(1)).unwrap();
        nic.set_sm_lid(guid, Lid(1)).unwrap();
        nic.set_port_state(guid, verbs::PortState::Active).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < end {
                port.step(Duration::from_millis(20));
                while port.poll_event().is_some() {}
            }
            drop(nic);
        });
        Sm {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Sm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn srptd(last: u8, sock: &Path) -> Proc {
    let p = Proc::start(
        "srptd",
        Command::new(env!("CARGO_BIN_EXE_srptd"))
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

fn run(cmd: &mut Command) -> (bool, String) {
    let o: Output = cmd.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn srp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_srp"))
}

#[test]
fn discovery_login_and_traps_through_the_sa() {
    if !Path::new("/dev/fuse").exists() {
        println!("SKIPPED: no /dev/fuse (apt-get install fuse3)");
        return;
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("srp-ibmode-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    // srpd's port (.3) alone is in partition 0x0010, as a full member.
    let srpd_guid = srpstack::ib::ib_guid(ip(3));
    let _sm = Sm::start(
        1,
        &[2, 3, 4, 5, 6],
        &format!(
            "Default=0x7fff : ALL=full ;\nstorage=0x0010 : {:#x}=full ;\n",
            srpd_guid.0
        ),
    );
    let _t1 = srptd(2, &dir.join("t1.sock"));
    let sock = dir.join("srpd.sock");
    let srpd = Proc::start(
        "srpd",
        Command::new(env!("CARGO_BIN_EXE_srpd"))
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
    let t1_guid = srpstack::ib::ib_guid(ip(2)).0;
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

    // srpd in partition 0x0010: the SA has no path to the target there.
    let in_storage = want.replace("pkey=ffff", "pkey=8010");
    let (ok, out) = run(srp()
        .args(["login", &in_storage, "--control-socket"])
        .arg(&sock));
    assert!(!ok, "{out}");
    assert!(
        out.contains("has no path from 127.0.140.3") && out.contains("in partition 8010"),
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
    let block: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&block).unwrap();
        f.sync_all().unwrap();
    }
    let mut back = vec![0u8; block.len()];
    let mut f = std::fs::File::open(&file).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(back == block, "data read back differs");
    drop(f);

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
    assert!(
        rest.iter().any(|l| l.contains("stopped after 2 scans")),
        "{rest:?}"
    );
    assert!(discover.child.wait().unwrap().success());
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("ibmode test: {} ms", started.elapsed().as_millis());
}

#[test]
fn without_an_sm_or_with_a_foreign_pkey_the_errors_are_clear() {
    // No SM sweeps .20 or .21: bounded waits, then errors that say why.
    let sock = std::env::temp_dir().join(format!("srp-ibmode-nosm-{}.sock", std::process::id()));
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_srptd"))
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
    let _sm = Sm::start(30, &[31], "");
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
