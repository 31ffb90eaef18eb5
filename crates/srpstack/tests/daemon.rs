//! `srptd` as an operator runs it: a configuration file with devices, LUN
//! masking groups and the control socket; `srptadm` changes LUN maps at
//! runtime; initiators in other processes (`srp luns`) and in this one see
//! the result; SIGTERM logs everyone out.

mod common;

use common::Proc;
use rdma_types::Guid;
use serde_json::Value;
use srp_initiator::session::{Session, SessionConfig, Xfer};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Daemon {
    proc: Proc,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    fn wait_line(&self, what: &str) -> String {
        self.proc.wait_line(what, 20)
    }
    fn sock(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }
    fn adm(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_srptadm"))
            .arg("--socket")
            .arg(self.sock())
            .arg("--json")
            .args(args)
            .output()
            .expect("run srptadm");
        if out.status.success() {
            Ok(serde_json::from_slice(&out.stdout).expect("JSON"))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// `srptd --check --config path`.
fn check(path: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_srptd"))
        .args(["--check", "--config"])
        .arg(path)
        .output()
        .expect("run srptd --check")
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("srptd-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const INIT_A: u64 = 0xaa01;
const INIT_B: u64 = 0xbb02;

fn config(dir: &Path, ip: &str) -> String {
    format!(
        r#"
[target]
ip = "{ip}"
rdma_cm_port = 5555
control_socket = "{sock}"
metrics = "127.0.0.1:0"

[[device]]
name = "shared"
handler = "ram"
size = "4M"

[[device]]
name = "secret"
handler = "vdisk_fileio"
filename = "{file}"
size = "2M"

[[lun]]
lun = 0
device = "shared"

[[group]]
name = "db"
initiators = ["0x000000000000{INIT_A:04x}*"]
lun = [{{ lun = 0, device = "secret" }}, {{ lun = 1, device = "shared" }}]
"#,
        sock = dir.join("ctl.sock").display(),
        file = dir.join("secret.img").display(),
    )
}

fn start(tag: &str, ip: &str) -> Daemon {
    let dir = tempdir(tag);
    let cfg = dir.join("srptd.toml");
    std::fs::write(&cfg, config(&dir, ip)).unwrap();
    let proc = Proc::start(
        "srptd",
        Command::new(env!("CARGO_BIN_EXE_srptd"))
            .arg("--config")
            .arg(&cfg),
    );
    let d = Daemon { proc, dir };
    d.wait_line("listening on");
    d
}

/// `srp luns` from another process: the LUN numbers and device IDs shown.
fn luns_of(dest: &str, ip: &str, ext: u64) -> Vec<(u64, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["luns", "--json", "--dest", dest, "--ip", ip])
        .args(["--initiator-ext", &format!("{ext:x}")])
        .output()
        .expect("run srp");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v.as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["lun"].as_u64().unwrap(),
                l["naa"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn naa_of(d: &Daemon, device: &str) -> String {
    let devs = d.adm(&["devices"]).unwrap();
    devs.as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == device)
        .map(|x| x["naa"].as_str().unwrap().to_string())
        .unwrap()
}

#[test]
fn check_reports_file_line_and_key() {
    let dir = tempdir("check");
    let cfg = dir.join("bad.toml");
    let text = config(&dir, "127.0.0.1").replace("device = \"secret\"", "device = \"nosuch\"");
    std::fs::write(&cfg, &text).unwrap();
    let out = check(&cfg);
    assert!(!out.status.success());
    let line = text.lines().position(|l| l.contains("nosuch")).unwrap() + 1;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "bad.toml:{line}: group[0].lun[0].device: no device named `nosuch`"
        )),
        "{err}"
    );
    std::fs::write(&cfg, config(&dir, "127.0.0.1")).unwrap();
    let out = check(&cfg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lun_masking_runtime_changes_aer_and_graceful_stop() {
    let d = start("mask", "127.0.97.1");
    let dest = "127.0.97.1:5555";
    let (shared, secret) = (naa_of(&d, "shared"), naa_of(&d, "secret"));
    assert_ne!(shared, secret);

    // Group member: its own LUN 0, and the shared disk at LUN 1.
    assert_eq!(
        luns_of(dest, "127.0.97.2", INIT_A),
        [(0, secret.clone()), (1, shared.clone())]
    );
    // Outside every group: the default LUNs only.
    assert_eq!(luns_of(dest, "127.0.97.3", INIT_B), [(0, shared.clone())]);

    // Runtime: a new device for initiator B's group.
    d.adm(&["add-device", "extra", "--handler", "ram", "--size", "1M"])
        .unwrap();
    d.adm(&["add-group", "web"]).unwrap();
    d.adm(&["add-lun", "0", "extra", "--group", "web"]).unwrap();
    d.adm(&["add-lun", "2", "shared", "--group", "web"])
        .unwrap();
    let bname = format!("0x{INIT_B:016x}{:016x}", srpstack::INITIATOR_GUID);
    d.adm(&["add-initiator", "web", &bname]).unwrap();
    let extra = naa_of(&d, "extra");
    assert_eq!(
        luns_of(dest, "127.0.97.3", INIT_B),
        [(0, extra), (2, shared.clone())]
    );
    // Refusals name the problem.
    let e = d
        .adm(&["add-lun", "1", "nosuch", "--group", "web"])
        .unwrap_err();
    assert!(e.contains("no device named `nosuch`"), "{e}");
    let e = d.adm(&["remove-device", "extra"]).unwrap_err();
    assert!(e.contains("mapped at LUN 0 of group `web`"), "{e}");
    let e = d.adm(&["add-initiator", "web", "host-b"]).unwrap_err();
    assert!(e.contains("must start with 0x"), "{e}");

    // The verbs objects the target port holds through the access layer,
    // before anyone logs in.
    let idle = d.adm(&["show"]).unwrap()["verbs_objects"]
        .as_i64()
        .expect("show has verbs_objects");
    // An initiator logged in here, in group db, using LUN 0 and LUN 1.
    let guid = Guid(srpstack::INITIATOR_GUID);
    let ip: std::net::IpAddr = "127.0.97.4".parse().unwrap();
    let provider = rnic::softroce::SoftRoce::new(vec![rnic::softroce::SoftCa { guid, ip }], 4791);
    let agent = rdma_access::CmAgent::start(provider.clone(), guid, 0x7700).unwrap();
    let conn = Arc::new(srpstack::RdmaCmConnector {
        agent,
        src: ip,
        dst: dest.parse().unwrap(),
        timeout: Duration::from_secs(10),
    });
    let chan = srp::initiator::ChannelConfig::new(
        INIT_A,
        guid,
        srpstack::TARGET_GUID,
        Guid(srpstack::TARGET_GUID),
    );
    let session =
        Arc::new(Session::connect(provider, guid, conn, SessionConfig::new(chan)).unwrap());
    let lun0 = srp_initiator::disk::Disk::open(session.clone(), 0).unwrap();
    let _lun1 = srp_initiator::disk::Disk::open(session.clone(), 1).unwrap();
    assert_eq!(lun0.info().naa.as_deref(), Some(secret.as_str()));

    // The session is listed with its initiator name and credits.
    let sessions = d.adm(&["sessions"]).unwrap();
    let me = format!("0x{INIT_A:016x}{:016x}", srpstack::INITIATOR_GUID);
    let row = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["initiator"] == me.as_str())
        .unwrap_or_else(|| panic!("{sessions}"));
    assert!(row["credits"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(row["luns"], serde_json::json!([0, 1]));

    // Removing LUN 1 under it: SRP_AER_REQ arrives, LUN 1 is gone, and
    // LUN 0 reports REPORTED LUNS DATA HAS CHANGED once.
    let aers = session.stats().aers;
    let r = d.adm(&["remove-lun", "1", "--group", "db"]).unwrap();
    assert!(r["aer_sent"].as_u64().unwrap() >= 1, "{r}");
    let end = Instant::now() + Duration::from_secs(10);
    while session.stats().aers == aers {
        assert!(Instant::now() < end, "no SRP_AER_REQ reached the initiator");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tur = |lun: u64| {
        session
            .execute(srp::wire::Lun::from_u64(lun << 48), &[0; 6], Xfer::None)
            .unwrap()
    };
    let r = tur(1);
    assert_eq!(
        srp_initiator::disk::sense_triple(&r.sense),
        (0x5, 0x25, 0x00)
    );
    let r = tur(0);
    assert_eq!(
        srp_initiator::disk::sense_triple(&r.sense),
        (0x6, 0x3f, 0x0e)
    );
    assert!(tur(0).good());

    // Metrics: the channel and the device counters.
    let addr = d.wait_line("metrics on http://");
    let addr = addr
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    assert!(
        body.contains(&format!("srptd_channel_commands_total{{initiator=\"{me}\"")),
        "{body}"
    );
    assert!(
        body.contains("srptd_device_read_bytes_total{device=\"secret\"}"),
        "{body}"
    );
    // The NIC's own counters: this session's traffic went through it.
    let sent: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("srptd_nic_packets_sent_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no NIC packet counter in\n{body}"));
    assert!(sent > 0, "{body}");
    let show = d.adm(&["show"]).unwrap();
    assert!(show["nic_packets_sent"].as_u64() >= Some(sent), "{show}");
    assert!(show["nic_retransmits"].is_u64(), "{show}");
    // The channel's QP, CQ and memory are counted by the access layer.
    assert!(
        show["verbs_objects"].as_i64() > Some(idle),
        "{show} vs {idle}"
    );
    assert!(body.contains("\nsrptd_verbs_objects "), "{body}");

    // The running configuration, saved and valid, has the runtime changes.
    let saved = d.dir.join("saved.toml");
    d.adm(&["write-config", saved.to_str().unwrap()]).unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(
        text.contains("name = \"web\"") && text.contains(&bname),
        "{text}"
    );
    let out = check(&saved);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 devices, 1 default LUNs, 2 groups"));

    // Another user may not use the control socket (needs root to try).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt;
        let out = Command::new(env!("CARGO_BIN_EXE_srptadm"))
            .arg("--socket")
            .arg(d.sock())
            .arg("show")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Permission denied") || err.contains("permission denied"),
            "{err}"
        );
    } else {
        println!("SKIPPED: the other-user check needs root");
    }

    // SIGTERM: the initiator is logged out, the daemon stops cleanly.
    // SAFETY: kill with a child's pid and a valid signal.
    unsafe { libc::kill(d.proc.child.id() as i32, libc::SIGTERM) };
    d.wait_line("stopped cleanly");
    let end = Instant::now() + Duration::from_secs(10);
    while !session.is_closed() {
        assert!(Instant::now() < end, "the session did not see the logout");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!d.sock().exists());
}

#[test]
fn sighup_reloads_lun_maps_without_dropping_sessions() {
    let d = start("reload", "127.0.98.1");
    let dest = "127.0.98.1:5555";
    let cfg_path = d.dir.join("srptd.toml");
    let base = config(&d.dir, "127.0.98.1");
    let hup = |d: &Daemon| {
        // SAFETY: kill with a child's pid and a valid signal.
        unsafe { libc::kill(d.proc.child.id() as i32, libc::SIGHUP) };
    };

    // A session outside every group: the default LUN 0 only.
    let guid = Guid(srpstack::INITIATOR_GUID);
    let ip: std::net::IpAddr = "127.0.98.2".parse().unwrap();
    let provider = rnic::softroce::SoftRoce::new(vec![rnic::softroce::SoftCa { guid, ip }], 4791);
    let agent = rdma_access::CmAgent::start(provider.clone(), guid, 0x7800).unwrap();
    let conn = Arc::new(srpstack::RdmaCmConnector {
        agent,
        src: ip,
        dst: dest.parse().unwrap(),
        timeout: Duration::from_secs(10),
    });
    let chan = srp::initiator::ChannelConfig::new(
        INIT_B,
        guid,
        srpstack::TARGET_GUID,
        Guid(srpstack::TARGET_GUID),
    );
    let session =
        Arc::new(Session::connect(provider, guid, conn, SessionConfig::new(chan)).unwrap());
    srp_initiator::disk::Disk::open(session.clone(), 0).unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&session).unwrap(), [0]);

    // The file gains default LUN 1; SIGHUP applies it under the session.
    let aers = session.stats().aers;
    std::fs::write(
        &cfg_path,
        format!("{base}\n[[lun]]\nlun = 1\ndevice = \"secret\"\n"),
    )
    .unwrap();
    hup(&d);
    let line = d.wait_line("srptd: reload");
    assert!(
        line.contains("reloaded") && line.contains("\"lun_map_changes\":1"),
        "{line}"
    );
    assert_eq!(srp_initiator::disk::report_luns(&session).unwrap(), [0, 1]);
    assert!(!session.is_closed());
    let end = Instant::now() + Duration::from_secs(10);
    while session.stats().aers == aers {
        assert!(Instant::now() < end, "no SRP_AER_REQ after the reload");
        std::thread::sleep(Duration::from_millis(10));
    }

    // A broken file changes nothing and says where it is broken.
    std::fs::write(
        &cfg_path,
        format!("{base}\n[[lun]]\nlun = 1\ndevice = \"nosuch\"\n"),
    )
    .unwrap();
    hup(&d);
    let line = d.wait_line("srptd: reload");
    assert!(
        line.contains("refused") && line.contains("no device named `nosuch`"),
        "{line}"
    );
    // A device that stays mapped may not change under its initiators.
    std::fs::write(
        &cfg_path,
        format!("{base}\n[[lun]]\nlun = 1\ndevice = \"secret\"\n")
            .replace("size = \"4M\"", "size = \"8M\""),
    )
    .unwrap();
    let e = d.adm(&["reload"]).unwrap_err();
    assert!(e.contains("device `shared` changed while mapped"), "{e}");
    assert_eq!(srp_initiator::disk::report_luns(&session).unwrap(), [0, 1]);
    let luns = d.adm(&["luns"]).unwrap();
    assert_eq!(luns["default"].as_array().unwrap().len(), 2, "{luns}");
}
