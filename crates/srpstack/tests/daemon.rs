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
    /// The line that said it serves (its first target's).
    started: String,
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
    /// The metrics endpoint's answer (the daemon said where it is), with
    /// its HTTP status line.
    fn metrics(&self) -> String {
        let line = self.wait_line("metrics on http://");
        let addr = line
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
        body
    }
    fn sock(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }
    fn adm(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(common::srptadm_bin())
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
    common::tool(common::srptd_bin())
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
    start_with(tag, |dir| config(dir, ip))
}

/// Starts `srptd` on the configuration `text(dir)` and waits until it serves.
fn start_with(tag: &str, text: impl FnOnce(&Path) -> String) -> Daemon {
    start_args(tag, &[], text)
}

/// [`start_with`] with more command line arguments.
fn start_args(tag: &str, args: &[&str], text: impl FnOnce(&Path) -> String) -> Daemon {
    let dir = tempdir(tag);
    let cfg = dir.join("srptd.toml");
    std::fs::write(&cfg, text(&dir)).unwrap();
    let proc = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(args)
            .arg("--config")
            .arg(&cfg),
    );
    let started = proc.wait_line("listening on", 20);
    Daemon { proc, dir, started }
}

/// How a test initiator reaches the target: RDMA CM to an address and
/// port, or IB CM to a GID and service ID.
enum Via {
    RdmaCm(&'static str),
    IbCm(&'static str, u64),
}

/// An initiator session from this process (initiator port ID `ext` and
/// `srpstack::INITIATOR_GUID`, NIC on `ip`) to the target, or why not.
fn try_login(ip: &str, via: Via, ext: u64, tid_base: u32) -> Result<Arc<Session>, String> {
    try_login_with(ip, via, ext, tid_base, |_| {})
}

/// [`try_login`] with the session's configuration changed by `tune`.
fn try_login_with(
    ip: &str,
    via: Via,
    ext: u64,
    tid_base: u32,
    tune: impl FnOnce(&mut SessionConfig),
) -> Result<Arc<Session>, String> {
    let guid = Guid(srpstack::INITIATOR_GUID);
    let ip: std::net::IpAddr = ip.parse().unwrap();
    let provider = rnic::softroce::SoftRoce::new(vec![rnic::softroce::SoftCa { guid, ip }], 4791);
    let agent = rdma_access::CmAgent::start(provider.clone(), guid, tid_base).unwrap();
    let timeout = Duration::from_secs(10);
    // srptd's port GUID, its target port ID, comes from its address.
    let target_ip = match via {
        Via::RdmaCm(dest) => dest.parse::<std::net::SocketAddr>().unwrap().ip(),
        Via::IbCm(target, _) => target.parse().unwrap(),
    };
    let target_guid = rnic::softroce::ip_guid(target_ip);
    let conn: Arc<dyn srp_initiator::session::Connector> = match via {
        Via::RdmaCm(dest) => Arc::new(srp_initiator::connectors::RdmaCmConnector {
            agent,
            src: ip,
            dst: dest.parse().unwrap(),
            timeout,
        }),
        Via::IbCm(target, service_id) => Arc::new(srp_initiator::connectors::IbCmConnector {
            agent,
            dgid: rdma_types::Gid::from_ip(target.parse().unwrap()),
            service_id,
            timeout,
        }),
    };
    let chan = srp::initiator::ChannelConfig::new(ext, guid, target_guid.0, target_guid);
    let mut cfg = SessionConfig::new(chan);
    tune(&mut cfg);
    Session::connect(provider, guid, conn, cfg)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// An RDMA CM session to `dest` (see [`try_login`]).
fn login(ip: &str, dest: &'static str, ext: u64, tid_base: u32) -> Arc<Session> {
    try_login(ip, Via::RdmaCm(dest), ext, tid_base).unwrap()
}

/// `srp luns` from another process: the LUN numbers and device IDs shown.
fn luns_of(dest: &str, ip: &str, ext: u64) -> Vec<(u64, String)> {
    let out = common::tool(common::srp_bin())
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

/// `srptd --config path` where it must refuse to start: its standard
/// error. Fails the test if srptd is still running after 30 s.
fn start_refused(cfg: &Path) -> String {
    let mut child = common::tool(common::srptd_bin())
        .arg("--config")
        .arg(cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn srptd");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    // Standard error ends when srptd exits.
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let Ok(err) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("srptd started on {}", cfg.display());
    };
    assert!(!child.wait().unwrap().success(), "{err}");
    err
}

/// The names in `dir`.
fn entries(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A file whose LUN 0 is device `f0` (`f0` is its table after the name),
/// after a fileio device `new0` that a start creates, with the control
/// socket in `dir`; `target` is more of the `[target]` table.
fn with_f0(dir: &Path, target: &str, f0: &str) -> String {
    format!(
        "[target]\nip = \"127.0.174.1\"\ncontrol_socket = \"{}\"\n{target}\n\
         [[device]]\nname = \"new0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"1M\"\n\n\
         [[device]]\nname = \"f0\"\n{f0}\n\n[[lun]]\nlun = 0\ndevice = \"f0\"\n",
        dir.join("ctl.sock").display(),
        dir.join("new0.img").display(),
    )
}

/// `file:line: key: ` of the line of `text` holding `needle`.
fn place(text: &str, needle: &str, key: &str) -> String {
    let line = text
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no `{needle}` in\n{text}"))
        + 1;
    format!("broken.toml:{line}: {key}: ")
}

#[test]
fn check_opens_every_path_a_start_opens_and_start_errors_name_the_key() {
    let dir = tempdir("paths");
    let d = dir.display().to_string();
    std::fs::write(dir.join("empty.img"), b"").unwrap();
    std::fs::write(dir.join("odd.img"), vec![0u8; 1000]).unwrap();
    std::fs::write(dir.join("plain"), b"not a directory").unwrap();
    std::fs::create_dir(dir.join("images")).unwrap();
    let ram = "handler = \"ram\"\nsize = \"1M\"";
    let fileio = |path: &str, more: &str| {
        format!("handler = \"vdisk_fileio\"\nfilename = \"{path}\"\n{more}")
    };
    let blockio = |path: &str| format!("handler = \"vdisk_blockio\"\nfilename = \"{path}\"");
    let passthrough = |path: &str| format!("handler = \"pass-through\"\nfilename = \"{path}\"");
    let long = format!("{d}/{}.sock", "s".repeat(120));
    // (what, file, the line's needle, key, a word of the fix)
    let mut cases: Vec<(&str, String, String, &str, &str)> = vec![
        (
            "missing file",
            with_f0(&dir, "", &fileio(&format!("{d}/absent.img"), "")),
            "absent.img".into(),
            "device[1].filename",
            "set `size`",
        ),
        (
            "missing directory",
            with_f0(
                &dir,
                "",
                &fileio(&format!("{d}/nodir/f0.img"), "size = \"1M\""),
            ),
            "nodir".into(),
            "device[1].filename",
            "mkdir -p",
        ),
        (
            "a RAM device larger than the machine's memory",
            with_f0(&dir, "", "handler = \"ram\"\nsize = \"64T\""),
            "64T".into(),
            "device[1].size",
            "lower `size`",
        ),
        (
            "read-only and missing",
            with_f0(
                &dir,
                "",
                &fileio(
                    &format!("{d}/absent.img"),
                    "size = \"1M\"\nread_only = true",
                ),
            ),
            "absent.img".into(),
            "device[1].filename",
            "existing file",
        ),
        (
            "a directory",
            with_f0(&dir, "", &fileio(&format!("{d}/images"), "size = \"1M\"")),
            "images".into(),
            "device[1].filename",
            "name a file",
        ),
        (
            "an empty file without size",
            with_f0(&dir, "", &fileio(&format!("{d}/empty.img"), "")),
            "empty.img".into(),
            "device[1].filename",
            "set `size`",
        ),
        (
            "a length no block size divides",
            with_f0(&dir, "", &fileio(&format!("{d}/odd.img"), "")),
            "odd.img".into(),
            "device[1].filename",
            "truncate",
        ),
        (
            "a character device",
            with_f0(&dir, "", &fileio("/dev/null", "")),
            "/dev/null".into(),
            "device[1].filename",
            "regular file",
        ),
        (
            "a file where a directory belongs",
            with_f0(
                &dir,
                "",
                &fileio(&format!("{d}/plain/f0.img"), "size = \"1M\""),
            ),
            "plain/f0.img".into(),
            "device[1].filename",
            "not a directory",
        ),
        (
            "blockio on a missing path",
            with_f0(&dir, "", &blockio(&format!("{d}/absent.img"))),
            "absent.img".into(),
            "device[1].filename",
            "creates none",
        ),
        (
            "blockio on a directory",
            with_f0(&dir, "", &blockio(&format!("{d}/images"))),
            "images".into(),
            "device[1].filename",
            "name a file",
        ),
        (
            "pass-through on a missing sg node",
            with_f0(&dir, "", &passthrough(&format!("{d}/sg-absent"))),
            "sg-absent".into(),
            "device[1].filename",
            "lsscsi -g",
        ),
        (
            "pass-through on a character device of another driver",
            with_f0(&dir, "", &passthrough("/dev/null")),
            "/dev/null".into(),
            "device[1].filename",
            "not one of the sg driver (major 21)",
        ),
        (
            "pass-through on a regular file",
            with_f0(&dir, "", &passthrough(&format!("{d}/odd.img"))),
            "odd.img".into(),
            "device[1].filename",
            "not a character device",
        ),
        (
            "control socket in a missing directory",
            with_f0(&dir, "", ram).replace("ctl.sock", "nodir/ctl.sock"),
            "nodir/ctl.sock".into(),
            "target.control_socket",
            "create it",
        ),
        (
            "control socket under a file",
            with_f0(&dir, "", ram).replace("ctl.sock", "plain/ctl.sock"),
            "plain/ctl.sock".into(),
            "target.control_socket",
            "not a directory",
        ),
        (
            "control socket path taken by a file",
            with_f0(&dir, "", ram).replace("ctl.sock", "empty.img"),
            "empty.img".into(),
            "target.control_socket",
            "remove it",
        ),
        (
            "control socket path too long",
            with_f0(&dir, "", ram).replace(&format!("{d}/ctl.sock"), &long),
            long.clone(),
            "target.control_socket",
            "shorter",
        ),
        (
            "an address of another host",
            with_f0(&dir, "", ram).replace("127.0.174.1", "192.0.2.1"),
            "192.0.2.1".into(),
            "target.ip",
            "not an address of this host",
        ),
        (
            "metrics on an address of another host",
            with_f0(&dir, "metrics = \"192.0.2.1:9100\"", ram),
            "metrics".into(),
            "target.metrics",
            "not an address of this host",
        ),
    ];
    // A file even root cannot open for writing (sysfs refuses a write
    // open of a read-only attribute): mode bits do not stop root.
    let locked = "/sys/kernel/uevent_seqnum";
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(locked)
        .is_err()
        && std::fs::File::open(locked).is_ok()
    {
        cases.push((
            "a file that cannot be opened read-write",
            with_f0(&dir, "", &fileio(locked, "")),
            locked.into(),
            "device[1].filename",
            "read_only = true",
        ));
    } else {
        rdma_testkit::need::part("the unwritable-file case").skip(
            &format!("a file that cannot be opened read-write: {locked} opens read-write here"),
            "a kernel whose sysfs refuses writes to read-only attributes",
        );
    }
    let cfg = dir.join("broken.toml");
    for (what, text, needle, key, fix) in &cases {
        std::fs::write(&cfg, text).unwrap();
        let at = place(text, needle, key);
        let out = check(&cfg);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{what}: --check passed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            err.contains(&at) && err.contains(fix),
            "{what}: want `{at}` and `{fix}`:\n{err}"
        );
        let before = entries(&dir);
        let err = start_refused(&cfg);
        assert!(
            err.contains(&at) && err.contains(fix),
            "{what}: start: want `{at}` and `{fix}`:\n{err}"
        );
        assert_eq!(
            entries(&dir),
            before,
            "{what}: a failed start left files behind: {err}"
        );
    }
    // The same device, fixed, passes.
    std::fs::write(
        &cfg,
        with_f0(
            &dir,
            "",
            &fileio(&format!("{d}/images/f0.img"), "size = \"1M\""),
        ),
    )
    .unwrap();
    let out = check(&cfg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.join("images/f0.img").exists() && !dir.join("new0.img").exists(),
        "--check created a file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_start_that_fails_after_check_names_the_key_and_leaves_nothing() {
    let dir = tempdir("late");
    let cfg = dir.join("broken.toml");
    // Busy ports are what another running srptd explains: --check notes
    // them, start refuses, naming the key.
    let udp = std::net::UdpSocket::bind("127.0.174.2:4791").unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics = tcp.local_addr().unwrap();
    let ram = "handler = \"ram\"\nsize = \"1M\"";
    let cases = [
        (
            "a UDP port in use",
            with_f0(&dir, "udp_port = 4791", ram).replace("127.0.174.1", "127.0.174.2"),
            "udp_port".to_string(),
            "target.udp_port",
        ),
        (
            "a metrics port in use",
            with_f0(&dir, &format!("metrics = \"{metrics}\""), ram),
            "metrics".into(),
            "target.metrics",
        ),
    ];
    for (what, text, needle, key) in &cases {
        std::fs::write(&cfg, text).unwrap();
        let at = place(text, needle, key);
        let out = check(&cfg);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains("note") && said.contains(&at),
            "{what}: want a note at `{at}`:\n{said}"
        );
        let before = entries(&dir);
        let err = start_refused(&cfg);
        assert!(
            err.contains(&at) && err.contains("in use"),
            "{what}: want `{at}`:\n{err}"
        );
        assert_eq!(
            entries(&dir),
            before,
            "{what}: a failed start left files behind: {err}"
        );
    }
    drop((udp, tcp));
    // No subnet manager: found only once everything else has started.
    let text = with_f0(&dir, "fabric = \"ib\"\nsm_wait_ms = 300", ram)
        .replace("127.0.174.1", "127.0.174.3");
    std::fs::write(&cfg, &text).unwrap();
    let out = check(&cfg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = entries(&dir);
    let err = start_refused(&cfg);
    let at = place(&text, "sm_wait_ms", "target.sm_wait_ms");
    assert!(
        err.contains(&at) && err.contains("ibsm run"),
        "want `{at}`:\n{err}"
    );
    assert_eq!(
        entries(&dir),
        before,
        "a failed start left files behind: {err}"
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
    // `srp` names its port by its address's GUID.
    let bname = format!(
        "0x{INIT_B:016x}{:016x}",
        rnic::softroce::ip_guid("127.0.97.3".parse().unwrap()).0
    );
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
    let idle_show = d.adm(&["show"]).unwrap();
    let idle = idle_show["verbs_objects"]
        .as_i64()
        .expect("show has verbs_objects");
    // The CM agent is tracked too: its listens (RDMA CM port and IB
    // service ID) are CM ids, its CM class and DM registrations MAD agents.
    let idle_cm_ids = idle_show["cm_ids"].as_i64().expect("show has cm_ids");
    // The SRQ holds what logins' credits need, not srpt_srq_size.
    let idle_recvs = idle_show["receive_buffers_posted"]
        .as_u64()
        .expect("show has receive_buffers_posted");
    assert!(
        (1..idle_show["srpt_srq_size"].as_u64().unwrap()).contains(&idle_recvs),
        "{idle_show}"
    );
    assert!(idle_cm_ids >= 1, "{idle_show}");
    assert!(idle_show["mad_agents"].as_i64() >= Some(1), "{idle_show}");
    assert_eq!(
        idle_show["sa_subscriptions"].as_i64(),
        Some(0),
        "{idle_show}"
    );
    // An initiator logged in here, in group db, using LUN 0 and LUN 1.
    let session = login("127.0.97.4", dest, INIT_A, 0x7700);
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
    let body = d.metrics();
    let t = target_name("127.0.97.1");
    assert!(
        body.contains(&format!(
            "srptd_channel_commands_total{{target=\"{t}\",initiator=\"{me}\""
        )),
        "{body}"
    );
    assert!(
        body.contains("srptd_device_read_bytes_total{device=\"secret\"}"),
        "{body}"
    );
    // The NIC's own counters: this session's traffic went through it.
    let sent: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("srptd_nic_packets_sent_total{{target=\"{t}\"}} ")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no NIC packet counter in\n{body}"));
    assert!(sent > 0, "{body}");
    let show = d.adm(&["show"]).unwrap();
    assert!(show["nic_packets_sent"].as_u64() >= Some(sent), "{show}");
    assert!(show["nic_retransmits"].is_u64(), "{show}");
    // The channel's QP, CQ and memory are counted by the access layer,
    // and its connection is one more CM id.
    assert!(
        show["verbs_objects"].as_i64() > Some(idle),
        "{show} vs {idle}"
    );
    assert!(
        show["cm_ids"].as_i64() > Some(idle_cm_ids),
        "{show} vs {idle_show}"
    );
    // The live channels' credits have receive buffers (windows and
    // reserves), still far fewer than srpt_srq_size.
    let sessions = d.adm(&["sessions"]).unwrap();
    let promised: u64 = sessions
        .as_array()
        .expect("sessions are a list")
        .iter()
        .map(|s| s["window"].as_u64().expect("a window") + u64::from(srp::target::RESERVED_RECV))
        .sum();
    let posted = show["receive_buffers_posted"].as_u64().unwrap();
    assert!(promised > 0 && posted >= promised, "{show} vs {sessions}");
    assert!(posted < show["srpt_srq_size"].as_u64().unwrap(), "{show}");
    let text = Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(d.sock())
        .arg("show")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("cm_ids ")) && text.contains("\nmad_agents "),
        "{text}"
    );
    assert!(
        body.contains(&format!("\nsrptd_verbs_objects{{target=\"{t}\"}} ")),
        "{body}"
    );

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
        let out = Command::new(common::srptadm_bin())
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
        rdma_testkit::need::part("the other-user check").root();
    }

    // SIGTERM: the initiator is logged out, the daemon stops cleanly.
    // SAFETY: kill with a child's pid and a valid signal.
    unsafe { libc::kill(d.proc.child.id() as i32, libc::SIGTERM) };
    d.wait_line("stopped cleanly, 0 verbs objects left");
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
    let session = login("127.0.98.2", dest, INIT_B, 0x7800);
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
        line.contains("reloaded the configuration: 1 LUN map change,"),
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
            .replace("size = \"4M\"", "size = \"4M\"\nrotational = true"),
    )
    .unwrap();
    let e = d.adm(&["reload"]).unwrap_err();
    assert!(e.contains("device `shared` changed while mapped"), "{e}");
    assert_eq!(srp_initiator::disk::report_luns(&session).unwrap(), [0, 1]);
    let luns = d.adm(&["luns"]).unwrap();
    assert_eq!(luns["default"].as_array().unwrap().len(), 2, "{luns}");

    // A mapped ram device whose size alone grew is resized live, as
    // `srptadm resize` does: its initiators hear CAPACITY DATA HAS CHANGED.
    let grown = format!("{base}\n[[lun]]\nlun = 1\ndevice = \"secret\"\n")
        .replace("size = \"4M\"", "size = \"8M\"");
    std::fs::write(&cfg_path, &grown).unwrap();
    let aers = session.stats().aers;
    hup(&d);
    // (The refusal above logged a line too.)
    let line = d.wait_line("srptd: reloaded");
    assert!(
        line.contains("device shared grown from 4 MiB to 8 MiB"),
        "{line}"
    );
    let end = Instant::now() + Duration::from_secs(10);
    while session.stats().aers == aers {
        assert!(Instant::now() < end, "no SRP_AER_REQ after the grow");
        std::thread::sleep(Duration::from_millis(10));
    }
    let devs = d.adm(&["devices"]).unwrap();
    let shared = devs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "shared")
        .unwrap();
    assert_eq!(shared["size"], 8 << 20, "{devs}");
    // Shrinking it back is refused, nothing changed.
    std::fs::write(&cfg_path, grown.replace("size = \"8M\"", "size = \"4M\"")).unwrap();
    let e = d.adm(&["reload"]).unwrap_err();
    assert!(
        e.contains("shrinking from 8388608 to 4194304 bytes is refused"),
        "{e}"
    );
}

/// A `[target]` section on `ip` (RDMA CM port 5555) with the control
/// socket in `dir`, metrics off.
fn target_section(dir: &Path, ip: &str) -> String {
    format!(
        "[target]\nip = \"{ip}\"\nrdma_cm_port = 5555\ncontrol_socket = \"{}\"\n",
        dir.join("ctl.sock").display()
    )
}

impl Daemon {
    /// `srptadm` without `--json`: the text a person reads.
    fn adm_text(&self, args: &[&str]) -> String {
        let out = Command::new(common::srptadm_bin())
            .arg("--socket")
            .arg(self.sock())
            .args(args)
            .output()
            .expect("run srptadm");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }
}

/// The relative target port designator (type 4, association: target
/// port) of LUN 0's VPD page 83h (SPC-4 7.8.6), as the initiator reads it.
fn relative_port_id(s: &Session) -> Option<u16> {
    let mut page = vec![0u8; 255];
    let r = s
        .execute(
            srp::wire::Lun::from_u64(0),
            &[0x12, 0x01, 0x83, 0x00, 0xff, 0x00],
            Xfer::InTo(&mut page),
        )
        .unwrap();
    assert!(
        r.good(),
        "INQUIRY VPD 83h: {}",
        srp_initiator::disk::describe(&r)
    );
    let end = (4 + u16::from_be_bytes([page[2], page[3]]) as usize).min(page.len());
    let mut at = 4;
    while at + 4 <= end {
        let (kind, len) = (page[at + 1], page[at + 3] as usize);
        if kind & 0x3f == 0x14 && len == 4 && at + 8 <= end {
            return Some(u16::from_be_bytes([page[at + 6], page[at + 7]]));
        }
        at += 4 + len;
    }
    None
}

/// The SCST target name of the port on `ip`: its GID with a colon after
/// every fourth hex digit.
fn target_name(ip: &str) -> String {
    let gid = rdma_types::Gid::from_ip(ip.parse().unwrap());
    gid.0
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn admin_names_enable_disable_groups_and_text_output() {
    let d = start_with("admin", |dir| {
        format!(
            "{}[[device]]\nname = \"d0\"\nhandler = \"ram\"\nsize = \"1M\"\n\
             [[device]]\nname = \"d1\"\nhandler = \"ram\"\nsize = \"1M\"\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n\
             [[group]]\nname = \"db\"\ninitiators = [\"0x000000000000{INIT_A:04x}*\"]\n\
             lun = [{{ lun = 0, device = \"d1\" }}, {{ lun = 5, device = \"d0\" }}]\n",
            target_section(dir, "127.0.154.3") + "rel_tgt_id = 7\n"
        )
    });
    let dest = "127.0.154.3:5555";
    let name = target_name("127.0.154.3");
    assert_eq!(name.len(), 39, "{name}");
    let show = d.adm(&["show"]).unwrap();
    assert_eq!(show["target"], name.as_str(), "{show}");
    assert_eq!(show["enabled"], true, "{show}");
    // The human form: one `key value` line per field, same values.
    let text = d.adm_text(&["show"]);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| {
                let (key, v) = l.split_once(' ')?;
                (key == k).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no `{k}` line in\n{text}"))
    };
    assert_eq!(field("target"), name);
    assert_eq!(field("rdma_cm_port"), "5555");
    assert_eq!(
        field("srp_max_req_size"),
        show["srp_max_req_size"].to_string()
    );

    // A group member sees the group's LUNs; the session is listed by its
    // initiator port ID in the text table too.
    let s = login("127.0.154.4", dest, INIT_A, 0x15410);
    assert_eq!(srp_initiator::disk::report_luns(&s).unwrap(), [0, 5]);
    // rel_tgt_id is the relative target port identifier of VPD 83h.
    assert_eq!(relative_port_id(&s), Some(7));
    let me = format!("0x{INIT_A:016x}{:016x}", srpstack::INITIATOR_GUID);
    let table = d.adm_text(&["sessions"]);
    let row = table
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(2) == Some(me.as_str()))
        .unwrap_or_else(|| panic!("no row for {me} in\n{table}"));
    assert!(row.trim_end().ends_with("[0,5]"), "{row}");

    // remove-initiator: the default LUNs; add it back; remove-group: the
    // default LUNs again, and the group is gone from the maps.
    let pattern = format!("0x000000000000{INIT_A:04x}*");
    let e = d.adm(&["remove-initiator", "db", "0xnobody*"]).unwrap_err();
    assert!(e.contains("is not in group `db`"), "{e}");
    d.adm(&["remove-initiator", "db", &pattern]).unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&s).unwrap(), [0]);
    d.adm(&["add-initiator", "db", &pattern]).unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&s).unwrap(), [0, 5]);
    d.adm(&["remove-group", "db"]).unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&s).unwrap(), [0]);
    assert_eq!(d.adm(&["luns"]).unwrap()["groups"], serde_json::json!([]));
    let e = d.adm(&["remove-group", "db"]).unwrap_err();
    assert!(e.contains("no group `db`"), "{e}");

    // disable: the session is logged out and logins are refused; enable:
    // logins work again.
    assert_eq!(d.adm(&["disable"]).unwrap()["enabled"], false);
    let end = Instant::now() + Duration::from_secs(10);
    while !s.is_closed() {
        assert!(Instant::now() < end, "disable left the session open");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(d.adm(&["show"]).unwrap()["enabled"], false);
    let refused = try_login("127.0.154.5", Via::RdmaCm(dest), INIT_B, 0x15420);
    assert!(refused.is_err(), "a disabled target took a login");
    d.adm(&["enable"]).unwrap();
    let s2 = try_login("127.0.154.6", Via::RdmaCm(dest), INIT_B, 0x15430).unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&s2).unwrap(), [0]);
    assert_eq!(d.adm(&["show"]).unwrap()["enabled"], true);

    // Metrics are off unless configured: no endpoint was announced.
    let mut d = d;
    d.proc.term();
    let lines = d.proc.rest(15);
    assert!(
        lines.iter().any(|l| l.contains("stopped cleanly")),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("metrics")), "{lines:?}");
}

#[test]
fn rdma_cm_port_zero_turns_rdma_cm_off() {
    let d = start_with("cmoff", |dir| {
        format!(
            "{}[[device]]\nname = \"d0\"\nhandler = \"ram\"\nsize = \"1M\"\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            target_section(dir, "127.0.154.7").replace("rdma_cm_port = 5555", "rdma_cm_port = 0")
        )
    });
    assert_eq!(d.adm(&["show"]).unwrap()["rdma_cm_port"], 0);
    // Neither the usual port nor port 0 takes an RDMA CM login...
    for (ip, dest) in [
        ("127.0.154.8", "127.0.154.7:5555"),
        ("127.0.154.10", "127.0.154.7:0"),
    ] {
        let r = try_login(ip, Via::RdmaCm(dest), INIT_A, 0x15440);
        assert!(r.is_err(), "RDMA CM login to {dest} accepted");
    }
    // ... while IB CM on the ioc_guid does.
    let s = try_login(
        "127.0.154.9",
        Via::IbCm(
            "127.0.154.7",
            rnic::softroce::ip_guid("127.0.154.7".parse().unwrap()).0,
        ),
        INIT_A,
        0x15450,
    )
    .unwrap();
    assert_eq!(srp_initiator::disk::report_luns(&s).unwrap(), [0]);
}

/// The byte a verified write puts at absolute byte `off` in pass `seed`:
/// every 512-byte sector differs from its neighbours and from other passes.
fn stamp(seed: u8, off: u64) -> u8 {
    ((off >> 9) as u8).wrapping_mul(13) ^ (off as u8).wrapping_mul(31) ^ seed
}

/// Writes stamped data through `disk` at a few places and sizes (one
/// block, eight blocks, and 300 KiB, which spans several RDMA chunks),
/// reads each back through the target, and checks that `backing` holds
/// it at the same offset once the write was acknowledged.
fn verified_io(disk: &srp_initiator::disk::Disk, backing: &Path, seed: u8) {
    use std::os::unix::fs::FileExt;
    let bs = disk.info().block_size as u64;
    let file = std::fs::File::open(backing).unwrap();
    for (lba, bytes) in [(0, bs), (7, 8 * bs), (100, 300 * 1024 / bs * bs)] {
        let at = lba * bs;
        let data: Vec<u8> = (at..at + bytes).map(|o| stamp(seed, o)).collect();
        disk.write(lba, &data)
            .unwrap_or_else(|e| panic!("WRITE {bytes} bytes at LBA {lba} (bs {bs}): {e}"));
        let mut back = vec![0; data.len()];
        disk.read(lba, &mut back)
            .unwrap_or_else(|e| panic!("READ {bytes} bytes at LBA {lba} (bs {bs}): {e}"));
        assert!(back == data, "read back differs at LBA {lba} (bs {bs})");
        let mut on_disk = vec![0; data.len()];
        file.read_exact_at(&mut on_disk, at).unwrap();
        assert!(
            on_disk == data,
            "{} does not hold the acknowledged write at LBA {lba}",
            backing.display()
        );
    }
}

/// `lun`'s answer to the INQUIRY `cdb` (64 bytes at most).
fn inquiry(s: &Session, lun: u64, cdb: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0u8; 64];
    let r = s
        .execute(
            srp::wire::Lun::from_u64(lun << 48),
            &cdb,
            Xfer::InTo(&mut d),
        )
        .unwrap();
    assert!(r.good(), "INQUIRY: {}", srp_initiator::disk::describe(&r));
    d
}

/// MEDIUM ROTATION RATE of `lun`'s VPD page B1h (SBC-3 6.5.2).
fn rotation_rate(s: &Session, lun: u64) -> u16 {
    let mut page = vec![0u8; 64];
    let r = s
        .execute(
            srp::wire::Lun::from_u64(lun << 48),
            &[0x12, 0x01, 0xb1, 0x00, 64, 0x00],
            Xfer::InTo(&mut page),
        )
        .unwrap();
    assert!(
        r.good(),
        "INQUIRY VPD B1h: {}",
        srp_initiator::disk::describe(&r)
    );
    assert_eq!(page[1], 0xb1);
    u16::from_be_bytes([page[4], page[5]])
}

/// A loop device over a file, detached on drop.
struct LoopDev(String);

impl LoopDev {
    /// `losetup --find --show file`, or why not.
    fn attach(file: &Path) -> Result<LoopDev, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root".into());
        }
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(LoopDev(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn blockio_lun_over_a_file_and_a_loop_device() {
    let make = |dir: &Path, name: &str| {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
        p
    };
    let mut backing = Vec::new();
    let mut loopdev = None;
    let d = start_with("blockio", |dir| {
        let (f512, f4k) = (make(dir, "b512.img"), make(dir, "b4k.img"));
        let mut t = target_section(dir, "127.0.154.1");
        for (i, (name, path, bs)) in [("b512", &f512, 512), ("b4k", &f4k, 4096)]
            .into_iter()
            .enumerate()
        {
            // The first behind a non-volatile cache, on a removable medium.
            let more = if i == 0 {
                "removable = true\nnv_cache = true\n"
            } else {
                ""
            };
            t += &format!(
                "[[device]]\nname = \"{name}\"\nhandler = \"vdisk_blockio\"\n\
                 filename = \"{}\"\nblock_size = {bs}\n{more}[[lun]]\nlun = {i}\ndevice = \"{name}\"\n",
                path.display()
            );
        }
        // And fileio with the page cache bypassed, every write durable
        // before it completes, reported as a rotating disk.
        let fdirect = make(dir, "fdirect.img");
        t += &format!(
            "[[device]]\nname = \"fdirect\"\nhandler = \"vdisk_fileio\"\n\
             filename = \"{}\"\no_direct = true\nwrite_through = true\nrotational = true\n\
             [[lun]]\nlun = 2\ndevice = \"fdirect\"\n",
            fdirect.display()
        );
        backing = vec![f512, f4k, fdirect];
        let img = make(dir, "loop.img");
        match LoopDev::attach(&img) {
            Ok(l) => {
                t += &format!(
                    "[[device]]\nname = \"loop\"\nhandler = \"vdisk_blockio\"\n\
                     filename = \"{}\"\n[[lun]]\nlun = 3\ndevice = \"loop\"\n",
                    l.0
                );
                backing.push(img);
                loopdev = Some(l);
            }
            Err(why) => {
                rdma_testkit::need::part("the loop device LUN").skip(
                    &format!("a loop device: {why}"),
                    "root and /dev/loop-control (modprobe loop)",
                );
            }
        }
        t
    });
    let session = login("127.0.154.2", "127.0.154.1:5555", INIT_A, 0x15400);
    for (lun, file) in backing.iter().enumerate() {
        let disk = srp_initiator::disk::Disk::open(session.clone(), lun as u16).unwrap();
        assert_eq!(disk.info().blocks * disk.info().block_size as u64, 8 << 20);
        verified_io(&disk, file, 0x5a ^ lun as u8);
    }
    // VPD B1h MEDIUM ROTATION RATE: 0000h (not reported) for the
    // rotational device, 0001h (non-rotating) for the others.
    assert_eq!(rotation_rate(&session, 2), 0);
    assert_eq!(rotation_rate(&session, 0), 1);
    // RMB in standard INQUIRY and NV_SUP in VPD 86h: LUN 0's, not LUN 1's.
    for (lun, set) in [(0u64, true), (1, false)] {
        let inq = inquiry(&session, lun, [0x12, 0, 0, 0, 36, 0]);
        assert_eq!(inq[1] & 0x80 != 0, set, "LUN {lun} RMB");
        let vpd = inquiry(&session, lun, [0x12, 1, 0x86, 0, 64, 0]);
        assert_eq!(vpd[6] & 0x02 != 0, set, "LUN {lun} NV_SUP");
    }
    let devs = d.adm(&["devices"]).unwrap();
    let fd = devs
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "fdirect")
        .unwrap();
    assert_eq!(
        (&fd["o_direct"], &fd["write_through"]),
        (&Value::Bool(true), &Value::Bool(true))
    );
    // Nothing failed on the target's side either.
    let devs = d.adm(&["devices"]).unwrap();
    for dev in devs.as_array().unwrap() {
        assert_eq!(dev["stats"]["errors"], 0, "{dev}");
        assert!(dev["stats"]["writes"].as_u64() >= Some(3), "{dev}");
    }
    drop(d);
    drop(loopdev);
}

#[test]
fn sigterm_under_verified_writes_loses_nothing_acknowledged() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let mut d = start_with("sigterm", |dir| {
        format!(
            "{}[[device]]\nname = \"disk\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\n\
             size = \"256M\"\n[[lun]]\nlun = 0\ndevice = \"disk\"\n",
            target_section(dir, "127.0.154.11"),
            dir.join("disk.img").display()
        )
    });
    let img = d.dir.join("disk.img");
    let s = login("127.0.154.12", "127.0.154.11:5555", INIT_A, 0x15460);
    let disk = Arc::new(srp_initiator::disk::Disk::open(s.clone(), 0).unwrap());
    let bs = disk.info().block_size as u64;
    // Four writers, each on its own LBA range, never writing a block twice:
    // a write is acknowledged (recorded) only when WRITE returned GOOD, and
    // then read back and compared while the target still serves.
    const WRITERS: u64 = 4;
    const BLOCKS: u64 = 32; // 16 KiB per write
    let per_writer = disk.info().blocks / WRITERS / BLOCKS;
    let acked: Arc<Mutex<Vec<(u64, u8)>>> = Arc::default();
    let failed = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (disk, acked, failed) = (disk.clone(), acked.clone(), failed.clone());
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    let lba = (w * per_writer + i) * BLOCKS;
                    let seed = (w * 64 + i) as u8;
                    let at = lba * bs;
                    let data: Vec<u8> = (at..at + BLOCKS * bs).map(|o| stamp(seed, o)).collect();
                    if disk.write(lba, &data).is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    acked.lock().unwrap().push((lba, seed));
                    let mut back = vec![0; data.len()];
                    match disk.read(lba, &mut back) {
                        Ok(()) => assert!(back == data, "LBA {lba} read back differs"),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    // Stop the daemon in the middle of the run.
    let end = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 200 {
        assert!(Instant::now() < end, "the writers made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    d.proc.term();
    let lines = d.proc.rest(20);
    let status = d.proc.child.wait().unwrap();
    for t in threads {
        t.join().expect("writer");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("stopped cleanly, 0 verbs objects left")),
        "{lines:?}"
    );
    assert!(status.success(), "srptd exited {status}");
    assert!(s.is_closed());
    // Every acknowledged write is in the file.
    let acked = acked.lock().unwrap();
    let file = std::fs::File::open(&img).unwrap();
    let mut buf = vec![0; (BLOCKS * bs) as usize];
    for &(lba, seed) in acked.iter() {
        file.read_exact_at(&mut buf, lba * bs).unwrap();
        let at = lba * bs;
        assert!(
            buf.iter().zip(at..).all(|(b, o)| *b == stamp(seed, o)),
            "acknowledged write at LBA {lba} is not in {}",
            img.display()
        );
    }
    let failed = failed.load(Ordering::Relaxed);
    println!(
        "{} writes acknowledged and found in the file; {failed} writers stopped on an error",
        acked.len()
    );
    assert!(
        acked.len() < (WRITERS * per_writer) as usize,
        "SIGTERM came after the run"
    );
}

/// The test initiator harness against srptd over soft RoCE: 100 MiB
/// written and read back verified, in 4 MiB commands except the
/// immediate data: 24 MiB whose 1024 descriptors per command only fit an
/// external table (fetched by the target with RDMA READ), 24 MiB through
/// indirect tables in the IU (64 KiB segments), 48 MiB through one direct
/// descriptor each, 4 MiB written as immediate data; then a logout the
/// target sees. Some 4 s in a debug build on a loaded 2-core machine.
#[test]
fn soft_roce_external_tables_immediate_data_bulk_and_logout() {
    let d = start_with("harness", |dir| {
        format!(
            "{}[[device]]\nname = \"d0\"\nhandler = \"ram\"\nsize = \"128M\"\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            target_section(dir, "127.0.154.13")
        )
    });
    let dest = "127.0.154.13:5555";
    // Every 512-byte sector says where it belongs.
    let stamped = blockload::offset_units;
    const MIB: u64 = 1 << 20;
    let chunk = 4 << 20;
    // Writes `mib` MiB at byte offset `at` in commands of `piece` bytes,
    // reads them back in 4 MiB commands and compares; returns the bytes.
    let verified =
        |disk: &srp_initiator::disk::Disk, at: u64, mib: u64, piece: usize, what: &str| {
            let t0 = Instant::now();
            for (i, off) in (at..at + mib * MIB).step_by(chunk).enumerate() {
                let data = stamped(off, chunk);
                for (k, p) in data.chunks(piece).enumerate() {
                    let before = disk.session().stats().completed;
                    disk.write((off + (k * piece) as u64) / 512, p).unwrap();
                    // One command per piece: no splitting behind our back.
                    assert_eq!(disk.session().stats().completed - before, 1, "{what} {i}");
                }
            }
            let wrote = t0.elapsed();
            let mut back = vec![0u8; chunk];
            for off in (at..at + mib * MIB).step_by(chunk) {
                let before = disk.session().stats().completed;
                disk.read(off / 512, &mut back).unwrap();
                assert_eq!(disk.session().stats().completed - before, 1, "{what}");
                let want = stamped(off, chunk);
                assert!(back == want, "{what}: MiB {} differs", off / MIB);
            }
            println!(
                "{what}: {mib} MiB over soft RoCE, write {wrote:?}, read {:?}",
                t0.elapsed() - wrote
            );
            mib
        };
    let mut total = 0;

    // External tables: one descriptor fits the IU, segments of 4 KiB.
    let ext = try_login_with("127.0.154.14", Via::RdmaCm(dest), INIT_A, 0x15470, |c| {
        c.channel.cmd_sg_entries = 1;
        c.channel.allow_ext_sg = true;
        c.max_segment = 4096;
    })
    .unwrap();
    let disk = srp_initiator::disk::Disk::open(ext.clone(), 0).unwrap();
    assert_eq!(disk.max_transfer(), 4 << 20, "tables lift the IU's limit");
    total += verified(&disk, 0, 24, chunk, "external tables");
    drop(disk);
    // Indirect tables in the IU: 64 descriptors of 64 KiB per command.
    let inl = try_login_with("127.0.154.16", Via::RdmaCm(dest), INIT_A, 0x15478, |c| {
        c.channel.cmd_sg_entries = 255;
        c.max_segment = 64 << 10;
    })
    .unwrap();
    let disk = srp_initiator::disk::Disk::open(inl.clone(), 0).unwrap();
    assert_eq!(disk.max_transfer(), 4 << 20);
    total += verified(&disk, 24 * MIB, 24, chunk, "indirect in the IU");
    drop(disk);

    // Direct descriptors and immediate data, and the logout.
    let s = login("127.0.154.15", dest, INIT_B, 0x15480);
    let neg = s.negotiated();
    let imm = neg.max_it_iu_len - u32::from(neg.imm_data_offset.expect("immediate data"));
    let imm = (imm as usize / 512) * 512;
    assert!(imm >= 4096, "{neg:?}");
    let disk = srp_initiator::disk::Disk::open(s.clone(), 0).unwrap();
    total += verified(&disk, 48 * MIB, 48, chunk, "direct");
    total += verified(&disk, 96 * MIB, 4, imm, "immediate data");
    assert_eq!(total, 100);
    drop(disk);
    let me = format!("0x{INIT_B:016x}{:016x}", srpstack::INITIATOR_GUID);
    let listed = |d: &Daemon| {
        d.adm(&["sessions"])
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["initiator"] == me.as_str())
    };
    assert!(listed(&d));
    Arc::try_unwrap(s).ok().expect("the only owner").close();
    let end = Instant::now() + Duration::from_secs(10);
    while listed(&d) {
        assert!(Instant::now() < end, "the target did not see the logout");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A LUN seen through one session, as a multipath path: up while its
/// channel is.
struct SessionPath(srp_initiator::disk::Disk);

impl blockload::BlockDevice for SessionPath {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.0.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_at(lba, buf)
    }
}

impl srp_initiator::multipath::PathDevice for SessionPath {
    fn device_id(&self) -> Option<String> {
        self.0.info().naa.clone()
    }
    fn is_up(&self) -> bool {
        !self.0.any_channel_closed()
    }
    fn wait_up(&self, _timeout: Duration) -> bool {
        self.is_up()
    }
}

/// Two srptd export one file under one device name (one LU, two target
/// ports); four writers with verify go through a multipath device over
/// both. SIGTERM to the first daemon mid-run: whatever it had in flight
/// fails over to the second, no writer sees an error, every write is in
/// the file, and the stopped daemon exits 0 with no verbs objects left.
#[test]
fn sigterm_on_one_of_two_paths_loses_no_write() {
    use blockload::BlockDevice;
    use srp_initiator::multipath::{Multipath, PathDevice, Policy};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let img = std::env::temp_dir().join(format!("srptd-test-2paths-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&img);
    let cfg = |dir: &Path, ip: &str| {
        format!(
            "{}[[device]]\nname = \"disk\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\n\
             size = \"64M\"\n[[lun]]\nlun = 0\ndevice = \"disk\"\n",
            target_section(dir, ip),
            img.display()
        )
    };
    let mut a = start_with("2paths-a", |dir| cfg(dir, "127.0.154.16"));
    let b = start_with("2paths-b", |dir| cfg(dir, "127.0.154.18"));
    let path = |ip, dest, tid| -> Arc<dyn PathDevice> {
        let s = login(ip, dest, INIT_A, tid);
        Arc::new(SessionPath(srp_initiator::disk::Disk::open(s, 0).unwrap()))
    };
    let pa = path("127.0.154.17", "127.0.154.16:5555", 0x15490);
    let pb = path("127.0.154.19", "127.0.154.18:5555", 0x154a0);
    let m = Arc::new(
        Multipath::new(
            vec![("A".into(), pa.clone()), ("B".into(), pb)],
            Policy::RoundRobin,
            Duration::from_secs(10),
        )
        .expect("one LU behind both"),
    );
    let bs = m.block_size() as u64;
    const WRITERS: u64 = 4;
    const WRITES: u64 = 150;
    const BLOCKS: u64 = 32;
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (m, done) = (m.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..WRITES {
                    let lba = (w * WRITES + i) * BLOCKS;
                    let at = lba * bs;
                    let seed = (w * 64 + i) as u8 ^ 0xa5;
                    let data: Vec<u8> = (at..at + BLOCKS * bs).map(|o| stamp(seed, o)).collect();
                    m.write_at(lba, &data)
                        .unwrap_or_else(|e| panic!("write at LBA {lba}: {e}"));
                    let mut back = vec![0; data.len()];
                    m.read_at(lba, &mut back)
                        .unwrap_or_else(|e| panic!("read at LBA {lba}: {e}"));
                    assert!(back == data, "LBA {lba} read back differs");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < 100 {
        assert!(Instant::now() < end, "the writers made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.proc.term();
    let at_term = done.load(Ordering::Relaxed);
    let lines = a.proc.rest(20);
    let status = a.proc.child.wait().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("stopped cleanly, 0 verbs objects left")),
        "{lines:?}"
    );
    assert!(status.success(), "srptd A exited {status}");
    for t in threads {
        t.join().expect("no writer saw an error");
    }
    assert!(!pa.is_up(), "path A is down");
    assert!(
        (at_term as u64) < WRITERS * WRITES,
        "SIGTERM came after the run"
    );
    let file = std::fs::File::open(&img).unwrap();
    let mut buf = vec![0; (BLOCKS * bs) as usize];
    for w in 0..WRITERS {
        for i in 0..WRITES {
            let lba = (w * WRITES + i) * BLOCKS;
            let seed = (w * 64 + i) as u8 ^ 0xa5;
            file.read_exact_at(&mut buf, lba * bs).unwrap();
            let at = lba * bs;
            assert!(
                buf.iter().zip(at..).all(|(b, o)| *b == stamp(seed, o)),
                "the write at LBA {lba} is not in the file"
            );
        }
    }
    let stats = m.path_stats();
    println!(
        "{} writes done at SIGTERM, {} in all; failovers {}; paths {stats:?}",
        at_term,
        WRITERS * WRITES,
        m.failovers().len()
    );
    drop(b);
    let _ = std::fs::remove_file(&img);
}

/// The value of the metrics series `name{labels}` in `body`.
fn series(body: &str, name_labels: &str) -> Option<u64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name_labels)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn per_lun_counters_count_exact_io_in_show_and_metrics() {
    let ip = "127.0.172.1";
    let d = start_with("lunstats", |dir| {
        format!(
            "{}metrics = \"127.0.0.1:0\"\n\n\
             [[device]]\nname = \"alpha\"\nhandler = \"ram\"\nsize = \"4M\"\n\n\
             [[device]]\nname = \"beta\"\nhandler = \"ram\"\nsize = \"1M\"\nblock_size = 4096\n\n\
             [[lun]]\nlun = 0\ndevice = \"alpha\"\n\n[[lun]]\nlun = 5\ndevice = \"beta\"\n",
            target_section(dir, ip)
        )
    });
    let session = login("127.0.172.2", "127.0.172.1:5555", INIT_A, 0x7a00);
    let lun = |n: u64| srp::wire::Lun::from_u64(n << 48);
    let rw10 = |op: u8, lba: u32, blocks: u16| {
        let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&blocks.to_be_bytes());
        c
    };
    // What the initiator saw, per LUN: [commands, reads, writes, read
    // bytes, write bytes, CHECK CONDITIONs for errors, unit attentions]. A
    // new nexus first gets a unit attention: the target counts it apart
    // from the errors (issue 26: `errors 1` after a clean run).
    let mut seen = [[0u64; 7]; 2];
    let mut run = |at: usize, cdb: Vec<u8>, xfer: Xfer| {
        let (n, out) = (
            if at == 0 { 0 } else { 5 },
            match &xfer {
                Xfer::Out(b) => b.len() as u64,
                _ => 0,
            },
        );
        let r = session.execute(lun(n), &cdb, xfer).unwrap();
        let s = &mut seen[at];
        s[0] += 1;
        if r.status == srp::initiator::Status::Scsi(0x02) {
            match srp_initiator::disk::sense_triple(&r.sense).0 {
                0x6 => s[6] += 1,
                _ => s[5] += 1,
            }
        }
        if r.good() && cdb[0] == 0x28 {
            s[1] += 1;
            s[3] += r.data.len() as u64;
        }
        if r.good() && cdb[0] == 0x2a {
            s[2] += 1;
            s[4] += out;
        }
        r
    };
    // Settle any unit attention with TEST UNIT READY first.
    for at in [0, 1] {
        for _ in 0..3 {
            if run(at, vec![0; 6], Xfer::None).good() {
                break;
            }
        }
    }
    let data = vec![0x5au8; 8 * 512];
    for i in 0..3 {
        assert!(run(0, rw10(0x2a, i * 8, 8), Xfer::Out(&data)).good());
    }
    for i in 0..2 {
        let r = run(0, rw10(0x28, i * 16, 16), Xfer::In(16 * 512));
        assert!(r.good() && r.data.len() == 8192);
    }
    let r = run(1, rw10(0x28, 0, 2), Xfer::In(8192));
    assert!(r.good() && r.data.len() == 8192);
    let four_k = vec![7u8; 4096];
    assert!(run(1, rw10(0x2a, 3, 1), Xfer::Out(&four_k)).good());
    // Past the end of beta's 256 blocks: CHECK CONDITION, no bytes.
    let r = run(1, rw10(0x28, 256, 1), Xfer::In(4096));
    assert_eq!(
        srp_initiator::disk::sense_triple(&r.sense),
        (0x5, 0x21, 0x00)
    );
    // A LOGICAL UNIT RESET counts as a task management function at LUN 5.
    session.reset_lun(lun(5)).unwrap();
    assert_eq!(seen[0][1..5], [2, 3, 16384, 12288]);
    assert_eq!(seen[1][1..5], [1, 1, 8192, 4096]);
    assert_eq!(seen[1][5], 1, "the read past the end is the one error");
    assert_eq!(seen[0][5], 0, "LUN 0 had no error");
    assert!(
        seen[0][6] >= 1 && seen[1][6] >= 1,
        "each LUN of the new nexus first answered with a unit attention: {seen:?}"
    );

    let show = d.adm(&["show"]).unwrap();
    let rows = show["lun_stats"].as_array().expect("lun_stats in show");
    assert_eq!(rows.len(), 2, "{show}");
    for (row, (n, dev, s, tmfs)) in rows
        .iter()
        .zip([(0, "alpha", seen[0], 0), (5, "beta", seen[1], 1)])
    {
        let want = serde_json::json!({
            "lun": n, "device": dev, "commands": s[0], "reads": s[1], "writes": s[2],
            "read_bytes": s[3], "write_bytes": s[4], "errors": s[5],
            "unit_attentions": s[6], "tmfs": tmfs,
        });
        assert_eq!(row, &want, "{show}");
    }
    // The text form has the table.
    let text = d.adm_text(&["show"]);
    let beta = text
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["5", "beta"]))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = beta.split_whitespace().collect();
    let (errors, uas) = (seen[1][5].to_string(), seen[1][6].to_string());
    assert_eq!(cols[5..], ["8192", "4096", &errors, "1", &uas], "{text}");

    // The metrics endpoint: one labelled series per LUN and device.
    let body = d.metrics();
    let t = target_name(ip);
    let at = |name: &str, n: u32, dev: &str| {
        series(
            &body,
            &format!("srptd_lun_{name}_total{{target=\"{t}\",lun=\"{n}\",device=\"{dev}\"}}"),
        )
        .unwrap_or_else(|| panic!("no srptd_lun_{name}_total for LUN {n} in\n{body}"))
    };
    assert_eq!(at("read_bytes", 0, "alpha"), 16384);
    assert_eq!(at("write_bytes", 0, "alpha"), 12288);
    assert_eq!(at("commands", 0, "alpha"), seen[0][0]);
    assert_eq!(at("read_bytes", 5, "beta"), 8192);
    assert_eq!(at("errors", 5, "beta"), seen[1][5]);
    assert_eq!(at("errors", 0, "alpha"), 0);
    assert_eq!(at("unit_attentions", 0, "alpha"), seen[0][6]);
    assert_eq!(at("tmfs", 5, "beta"), 1);
    assert!(
        body.contains("# TYPE srptd_lun_reads_total counter"),
        "{body}"
    );

    // The session's own counters: every SRP_CMD sent (both LUNs), the one
    // TMF, no AER; idle, so nothing in flight and every credit back with
    // the initiator.
    let me = format!("0x{INIT_A:016x}{:016x}", srpstack::INITIATOR_GUID);
    let commands = seen[0][0] + seen[1][0];
    let sessions = d.adm(&["sessions"]).unwrap();
    let rows = sessions.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{sessions}");
    let row = &rows[0];
    assert_eq!(row["initiator"], me.as_str(), "{sessions}");
    assert_eq!(row["commands"], commands, "{sessions}");
    assert_eq!(row["tmfs"], 1, "{sessions}");
    assert_eq!(row["aers"], 0, "{sessions}");
    assert_eq!(row["in_flight"], 0, "{sessions}");
    assert_eq!(row["credits"], row["window"], "{sessions}");
    assert_eq!(row["luns"], serde_json::json!([0, 5]), "{sessions}");
    let window = row["window"].as_u64().unwrap();
    assert!(window > 1, "{sessions}");
    let conn = row["conn"].as_u64().unwrap();
    let text = d.adm_text(&["sessions"]);
    let line = text
        .lines()
        .find(|l| l.contains(&me))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    let want = [
        window.to_string(),
        window.to_string(),
        "0".into(),
        commands.to_string(),
        "1".into(),
        "0".into(),
    ];
    assert_eq!(cols[3..9], want, "{text}");
    // (The metrics above were read after the same I/O.)
    let at = |name: &str| {
        series(
            &body,
            &format!("srptd_channel_{name}{{target=\"{t}\",initiator=\"{me}\",conn=\"{conn}\"}}"),
        )
        .unwrap_or_else(|| panic!("no srptd_channel_{name} for the session in\n{body}"))
    };
    assert_eq!(at("commands_total"), commands);
    assert_eq!(at("tmfs_total"), 1);
    assert_eq!(at("aers_total"), 0);
    assert_eq!(at("in_flight"), 0);
    assert_eq!(at("credits"), window);
}

/// Two `[[target]]` tables: two ports (addresses, RDMA CM ports,
/// rel_tgt_ids) of one SCSI target sharing its LUNs.
fn two_targets(dir: &Path) -> String {
    format!(
        "[[target]]\nip = \"127.0.172.11\"\nrdma_cm_port = 5555\nrel_tgt_id = 1\n\
         control_socket = \"{}\"\n\n\
         [[target]]\nip = \"127.0.172.12\"\nrdma_cm_port = 5556\nrel_tgt_id = 2\n\n\
         [[device]]\nname = \"disk\"\nhandler = \"ram\"\nsize = \"2M\"\n\n\
         [[lun]]\nlun = 0\ndevice = \"disk\"\n",
        dir.join("ctl.sock").display()
    )
}

/// A `[[target]]` with default LUNs of its own (SCST's LUNs per target):
/// through it an initiator sees those, through the other port the file's
/// `[[lun]]` set; `srptadm sessions` lists each session's LUNs;
/// write-config keeps the list; a device it names that does not exist is
/// refused with file, line and key.
#[test]
fn a_target_with_luns_of_its_own() {
    let text = |dir: &Path| {
        format!(
            "[[target]]\nip = \"127.0.173.11\"\nrdma_cm_port = 5555\nrel_tgt_id = 1\n\
             control_socket = \"{}\"\n\n\
             [[target]]\nip = \"127.0.173.12\"\nrdma_cm_port = 5556\nrel_tgt_id = 2\n\
             lun = [{{ lun = 0, device = \"own\" }}, {{ lun = 5, device = \"own5\" }}]\n\n\
             [[device]]\nname = \"disk\"\nhandler = \"ram\"\nsize = \"2M\"\n\
             [[device]]\nname = \"own\"\nhandler = \"ram\"\nsize = \"1M\"\n\
             [[device]]\nname = \"own5\"\nhandler = \"ram\"\nsize = \"1M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"disk\"\n",
            dir.join("ctl.sock").display()
        )
    };
    let d = start_with("ownluns", text);
    d.wait_line(&format!(
        "target {} listening on 127.0.173.12:5556",
        target_name("127.0.173.12")
    ));
    let shared = luns_of("127.0.173.11:5555", "127.0.173.13", INIT_A);
    assert_eq!(shared, [(0, naa_of(&d, "disk"))]);
    let own = luns_of("127.0.173.12:5556", "127.0.173.14", INIT_B);
    assert_eq!(own, [(0, naa_of(&d, "own")), (5, naa_of(&d, "own5"))]);

    let s1 = login("127.0.173.13", "127.0.173.11:5555", INIT_A, 0x7d00);
    let s2 = login("127.0.173.14", "127.0.173.12:5556", INIT_B, 0x7e00);
    let sessions = d.adm(&["sessions"]).unwrap();
    let luns: Vec<Value> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["luns"].clone())
        .collect();
    assert_eq!(luns, [serde_json::json!([0]), serde_json::json!([0, 5])]);
    drop((s1, s2));

    let saved = d.dir.join("saved.toml");
    d.adm(&["write-config", saved.to_str().unwrap()]).unwrap();
    let again = srptd::config::Config::load(&saved).unwrap();
    let devs = |t: usize| -> Vec<String> {
        again.targets[t]
            .luns
            .iter()
            .map(|l| l.device.get_ref().clone())
            .collect()
    };
    assert!(devs(0).is_empty());
    assert_eq!(devs(1), ["own", "own5"]);

    let broken = d.dir.join("broken.toml");
    let bad = text(&d.dir).replace("device = \"own5\" }]", "device = \"gone\" }]");
    std::fs::write(&broken, &bad).unwrap();
    let out = check(&broken);
    let err = String::from_utf8_lossy(&out.stderr);
    let at = place(&bad, "gone", "target[1].lun[1].device");
    assert!(
        !out.status.success() && err.contains(&at) && err.contains("no device named `gone`"),
        "want `{at}`:\n{err}"
    );
}

#[test]
fn two_targets_in_one_file_serve_two_initiators() {
    let d = start_with("twotgt", two_targets);
    // A line per target.
    d.wait_line(&format!(
        "target {} listening on 127.0.172.12:5556",
        target_name("127.0.172.12")
    ));
    let (t1, t2) = (target_name("127.0.172.11"), target_name("127.0.172.12"));
    let s1 = login("127.0.172.13", "127.0.172.11:5555", INIT_A, 0x7b00);
    let s2 = login("127.0.172.14", "127.0.172.12:5556", INIT_B, 0x7c00);
    // Each port has its own relative port identifier; behind both is the
    // same logical unit: what one writes the other reads.
    assert_eq!(relative_port_id(&s1), Some(1));
    assert_eq!(relative_port_id(&s2), Some(2));
    let d1 = srp_initiator::disk::Disk::open(s1.clone(), 0).unwrap();
    let d2 = srp_initiator::disk::Disk::open(s2.clone(), 0).unwrap();
    assert_eq!(d1.info().naa, d2.info().naa);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    d1.write(16, &block).unwrap();
    let mut back = vec![0u8; 4096];
    d2.read(16, &mut back).unwrap();
    assert!(back == block, "target 2 does not read what target 1 wrote");

    // show lists both (the top level is the first), sessions name their target.
    let show = d.adm(&["show"]).unwrap();
    assert_eq!(show["target"], t1.as_str(), "{show}");
    let targets = show["targets"].as_array().unwrap();
    let field = |k: &str| targets.iter().map(|t| t[k].clone()).collect::<Vec<_>>();
    assert_eq!(field("target"), [t1.as_str(), t2.as_str()], "{show}");
    assert_eq!(field("rdma_cm_port"), [5555, 5556], "{show}");
    assert_eq!(field("rel_tgt_id"), [1, 2], "{show}");
    assert_eq!(field("sessions"), [1, 1], "{show}");
    let sessions = d.adm(&["sessions"]).unwrap();
    let by_target: Vec<(String, String)> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["target"].as_str().unwrap().into(),
                s["initiator"].as_str().unwrap().into(),
            )
        })
        .collect();
    let name = |ext: u64| format!("0x{ext:016x}{:016x}", srpstack::INITIATOR_GUID);
    assert_eq!(
        by_target,
        [(t1.clone(), name(INIT_A)), (t2.clone(), name(INIT_B))]
    );
    let text = d.adm_text(&["show"]);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("target ")).count(),
        2,
        "{text}"
    );

    // Disabling one target (by address) logs out its session only.
    let r = d.adm(&["disable", "--target", "127.0.172.12"]).unwrap();
    assert_eq!(r["targets"], serde_json::json!([t2]), "{r}");
    let end = Instant::now() + Duration::from_secs(10);
    while !s2.is_closed() {
        assert!(Instant::now() < end, "disable left target 2's session open");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!s1.is_closed());
    d1.read(16, &mut back).unwrap();
    assert!(back == block);
    let e = d.adm(&["enable", "--target", "nosuch"]).unwrap_err();
    assert!(e.contains("no target `nosuch`"), "{e}");

    // write-config keeps both targets (and target 2 disabled); the file is valid.
    let saved = d.dir.join("saved.toml");
    d.adm(&["write-config", saved.to_str().unwrap()]).unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(text.matches("[[target]]").count(), 2, "{text}");
    let out = check(&saved);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("2 targets, 1 devices"),
        "{said}"
    );
    let again = srptd::config::Config::load(&saved).unwrap();
    assert_eq!(
        again.targets.iter().map(|t| t.enabled).collect::<Vec<_>>(),
        [true, false]
    );

    // reload follows each target's `enabled` and names what needs a
    // restart: here target 1 off, target 2 on again on another port.
    let file = two_targets(&d.dir)
        .replacen("rel_tgt_id = 1\n", "rel_tgt_id = 1\nenabled = false\n", 1)
        .replace("rdma_cm_port = 5556", "rdma_cm_port = 5557");
    std::fs::write(d.dir.join("srptd.toml"), file).unwrap();
    let r = d.adm(&["reload"]).unwrap();
    assert_eq!(r["enabled"], serde_json::json!([false, true]), "{r}");
    assert_eq!(
        r["needs_restart"],
        serde_json::json!(["target[1] parameters other than enabled"]),
        "{r}"
    );
    let end = Instant::now() + Duration::from_secs(10);
    while !s1.is_closed() {
        assert!(Instant::now() < end, "reload left target 1's session open");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Target 2 serves again, still on the port it started with.
    let s3 = login("127.0.172.15", "127.0.172.12:5556", INIT_B, 0x7e00);
    assert_eq!(relative_port_id(&s3), Some(2));
    let show = d.adm(&["show"]).unwrap();
    let enabled: Vec<Value> = show["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["enabled"].clone())
        .collect();
    assert_eq!(enabled, [false, true], "{show}");
}

#[test]
fn check_names_the_target_that_clashes() {
    let dir = tempdir("twotgt-check");
    let cfg = dir.join("two.toml");
    let good = two_targets(&dir);
    let refused = |text: &str, needle: &str, key: &str| {
        std::fs::write(&cfg, text).unwrap();
        let out = check(&cfg);
        assert!(!out.status.success(), "{text}");
        // The last line with `needle`: the second target's.
        let lines: Vec<&str> = text.lines().collect();
        let line = lines.iter().rposition(|l| l.contains(needle)).unwrap() + 1;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let at = match key {
            "" => format!("two.toml:{line}: "),
            k => format!("two.toml:{line}: {k}: "),
        };
        assert!(err.contains(&at), "{err}");
        err
    };
    let e = refused(
        &good.replace("rel_tgt_id = 2", "rel_tgt_id = 1"),
        "rel_tgt_id = 1",
        "target[1].rel_tgt_id",
    );
    assert!(e.contains("target[0]'s rel_tgt_id too"), "{e}");
    let e = refused(
        &good.replace("\"127.0.172.12\"", "\"127.0.172.11\""),
        "127.0.172.11",
        "target[1].ip",
    );
    assert!(e.contains("cannot share a port"), "{e}");
    let e = refused(
        &good.replace("rel_tgt_id = 2\n", "rel_tgt_id = 2\nmetrics = 9100\n"),
        "metrics = 9100",
        "target[1].metrics",
    );
    assert!(e.contains("set it in the first target"), "{e}");
    let e = refused(
        &good.replace("rdma_cm_port = 5556", "rdma_cm_prot = 5556"),
        "rdma_cm_prot",
        "",
    );
    assert!(e.contains("rdma_cm_prot"), "{e}");
    // The one-table form still works, and several port options with
    // several targets are refused rather than applied to one.
    std::fs::write(&cfg, &good).unwrap();
    assert!(check(&cfg).status.success());
    let out = common::tool(common::srptd_bin())
        .args(["--ip", "127.0.172.20", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("override a single target"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_logs_one_record_per_line_and_runtime_log_level() {
    let ip = "127.0.172.21";
    let mut d = start_args("jsonlog", &["--log-format", "json"], |dir| {
        format!(
            "{}\n[[device]]\nname = \"d0\"\nhandler = \"ram\"\nsize = \"1M\"\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            target_section(dir, ip)
        )
    });
    let t = target_name(ip);
    let me = format!("0x{INIT_A:016x}{:016x}", srpstack::INITIATOR_GUID);
    // A login and a logout; a login refused while the target is disabled.
    let s = login("127.0.172.22", "127.0.172.21:5555", INIT_A, 0x7d00);
    assert!(s
        .execute(srp::wire::Lun::from_u64(0), &[0; 6], Xfer::None)
        .is_ok());
    match Arc::try_unwrap(s) {
        Ok(s) => s.close(),
        Err(_) => panic!("the session is shared"),
    }
    d.adm(&["disable"]).unwrap();
    let refused = try_login(
        "127.0.172.23",
        Via::RdmaCm("127.0.172.21:5555"),
        INIT_B,
        0x7d10,
    );
    assert!(refused.is_err());
    d.adm(&["enable"]).unwrap();
    // Admin changes are events; queries only at debug level, which
    // srptadm switches on while srptd runs.
    d.adm(&["add-lun", "3", "d0"]).unwrap();
    d.adm(&["add-lun", "4", "nosuch"]).unwrap_err();
    d.adm(&["luns"]).unwrap();
    let r = d.adm(&["set", "log-level", "debug"]).unwrap();
    assert_eq!(
        (r["was"].as_str(), r["log_level"].as_str()),
        (Some("info"), Some("debug"))
    );
    assert_eq!(d.adm(&["show"]).unwrap()["log_level"], "debug");
    d.proc.term();
    // Every line: those before the one `start_args` waited for, if any,
    // were not JSON-checked; the daemon writes none before it.
    let mut lines = vec![d.started.clone()];
    lines.extend(d.proc.rest(15));
    let records: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for r in &records {
        for k in ["ts", "level", "event", "fields", "msg"] {
            assert!(!r[k].is_null(), "no {k} in {r}");
        }
    }
    let at = |e: &str| {
        records
            .iter()
            .position(|r| r["event"] == e)
            .unwrap_or_else(|| panic!("no {e} in {lines:#?}"))
    };
    let find =
        |event: &str| -> Vec<&Value> { records.iter().filter(|r| r["event"] == event).collect() };
    let one = |event: &str| -> &Value {
        let v = find(event);
        assert_eq!(v.len(), 1, "{event} in {lines:#?}");
        v[0]
    };
    let l = one("target_listening");
    assert_eq!(
        (l["target"].as_str(), l["fields"]["rdma_cm_port"].as_u64()),
        (Some(t.as_str()), Some(5555))
    );
    let a = one("login_accepted");
    assert_eq!(
        (a["target"].as_str(), a["session"].as_str()),
        (Some(t.as_str()), Some(me.as_str()))
    );
    let channel = a["fields"]["channel"].as_u64().expect("channel");
    assert_eq!(a["fields"]["pkey"], "ffff");
    let o = one("logout");
    assert_eq!(o["session"].as_str(), Some(me.as_str()));
    assert_eq!(
        (o["fields"]["channel"].as_u64(), o["fields"]["by"].as_str()),
        (Some(channel), Some("initiator"))
    );
    let rej = one("login_rejected");
    assert_eq!(rej["level"], "warn");
    assert_eq!(
        rej["session"].as_str(),
        Some(format!("0x{INIT_B:016x}{:016x}", srpstack::INITIATOR_GUID).as_str())
    );
    assert!(
        !rej["fields"]["reason"].as_str().unwrap().is_empty(),
        "{rej}"
    );
    assert_eq!(
        one("target_disabled")["fields"]["targets"],
        serde_json::json!([t])
    );
    assert!(
        at("target_disabled") < at("login_rejected") && at("login_rejected") < at("target_enabled")
    );
    let added = one("lun_added");
    assert_eq!(
        (
            added["fields"]["lun"].as_u64(),
            added["fields"]["device"].as_str()
        ),
        (Some(3), Some("d0"))
    );
    let no = one("admin_refused");
    assert!(
        no["fields"]["error"].as_str().unwrap().contains("nosuch"),
        "{no}"
    );
    // `luns` ran at info level (not logged), `show` after the switch.
    let queries = find("admin_query");
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(
        (
            queries[0]["level"].as_str(),
            queries[0]["fields"]["cmd"].as_str()
        ),
        (Some("debug"), Some("show"))
    );
    assert_eq!(one("stopped")["fields"]["verbs_objects_left"], 0);
    // In order: listening, login, logout, ..., stopped.
    assert!(at("target_listening") < at("login_accepted") && at("login_accepted") < at("logout"));
    assert_eq!(at("stopped"), records.len() - 1);
}

#[test]
fn text_logs_stay_the_default_and_fatal_errors_follow_the_format() {
    let dir = tempdir("fatal");
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[target]\nip = \"127.0.172.30\"\nrel_tgt_id = 0\n").unwrap();
    let run = |fmt: &[&str]| {
        let out = common::tool(common::srptd_bin())
            .args(fmt)
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    };
    let text = run(&[]);
    assert!(
        text.starts_with("srptd: ") && text.contains("target.rel_tgt_id"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&run(&["--log-format", "json"])).unwrap();
    assert_eq!(
        (json["level"].as_str(), json["event"].as_str()),
        (Some("error"), Some("fatal"))
    );
    assert!(
        json["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("rel_tgt_id"),
        "{json}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// READ CAPACITY(10) at `lun`: (last LBA, block length), or the sense of
/// its CHECK CONDITION.
fn read_capacity(s: &Session, lun: u64) -> Result<(u32, u32), (u8, u8, u8)> {
    let r = s
        .execute(
            srp::wire::Lun::from_u64(lun << 48),
            &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Xfer::In(8),
        )
        .unwrap();
    if !r.good() {
        return Err(srp_initiator::disk::sense_triple(&r.sense));
    }
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    Ok((be(&r.data[0..4]), be(&r.data[4..8])))
}

/// `srptadm resize` grows a ram device under two initiators that see it
/// at different LUNs (a group's and the default set): each gets an
/// SRP_AER_REQ with CAPACITY DATA HAS CHANGED naming its own LUN, then
/// the unit attention on its next command, and READ CAPACITY shows the
/// new size; blocks past the old end take data. Shrinking, a fileio
/// device and an unknown device are refused with a reason, and
/// `write-config` keeps the new size.
#[test]
fn resize_raises_capacity_ua_and_aer_per_initiator_lun() {
    let ip = "127.0.177.1";
    let dest = "127.0.177.1:5555";
    let d = start_with("resize", |dir| {
        format!(
            "{}\n[[device]]\nname = \"grow\"\nhandler = \"ram\"\nsize = \"4M\"\n\n\
             [[device]]\nname = \"file\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"1M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"grow\"\n\n[[lun]]\nlun = 1\ndevice = \"file\"\n\n\
             [[group]]\nname = \"db\"\ninitiators = [\"0x000000000000{INIT_A:04x}*\"]\n\
             lun = [{{ lun = 3, device = \"grow\" }}]\n",
            target_section(dir, ip),
            dir.join("file.img").display()
        )
    });
    // INIT_A sees `grow` at LUN 3 (its group), INIT_B at LUN 0 (default).
    let a = login("127.0.177.2", dest, INIT_A, 0x17700);
    let b = login("127.0.177.3", dest, INIT_B, 0x17710);
    let old_last = (4u32 << 20) / 512 - 1;
    for (s, n) in [(&a, 3), (&b, 0)] {
        // A new nexus may first get POWER ON OR RESET.
        let mut got = read_capacity(s, n);
        for _ in 0..3 {
            if got.is_ok() {
                break;
            }
            got = read_capacity(s, n);
        }
        assert_eq!(got, Ok((old_last, 512)), "LUN {n} before");
    }

    // Refusals change nothing.
    let e = d.adm(&["resize", "grow", "2M"]).unwrap_err();
    assert!(
        e.contains("shrinking from 4194304 to 2097152 bytes is refused"),
        "{e}"
    );
    let e = d.adm(&["resize", "file", "8M"]).unwrap_err();
    assert!(e.contains("vdisk_fileio device cannot be resized"), "{e}");
    let e = d.adm(&["resize", "nosuch", "8M"]).unwrap_err();
    assert!(e.contains("no device `nosuch`"), "{e}");
    let e = d.adm(&["resize", "grow", "5000000"]).unwrap_err();
    assert!(
        e.contains("not a positive multiple of its block size 512"),
        "{e}"
    );
    for (s, n) in [(&a, 3), (&b, 0)] {
        assert_eq!(read_capacity(s, n), Ok((old_last, 512)), "LUN {n}");
        assert_eq!(s.stats().aers, 0);
    }

    let r = d.adm(&["resize", "grow", "8M"]).unwrap();
    assert_eq!(r["size"], 8 << 20, "{r}");
    assert_eq!(r["was"], 4 << 20, "{r}");
    assert_eq!(r["aer_sent"], 2, "one AER per session: {r}");
    let capacity_changed = (0x6, 0x2a, 0x09);
    for (s, n) in [(&a, 3u64), (&b, 0)] {
        // The AER names the LUN this initiator sees the device at.
        let end = Instant::now() + Duration::from_secs(10);
        let mut aers = Vec::new();
        while aers.is_empty() {
            assert!(Instant::now() < end, "no SRP_AER_REQ at LUN {n}");
            for ev in s.take_events() {
                if let srp::initiator::Event::Aer { lun, sense } = ev {
                    aers.push((lun, srp_initiator::disk::sense_triple(&sense)));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            aers,
            [(srp::wire::Lun::from_u64(n << 48), capacity_changed)],
            "LUN {n}"
        );
        // The unit attention comes with the next command, once.
        assert_eq!(read_capacity(s, n), Err(capacity_changed), "LUN {n}");
        assert_eq!(read_capacity(s, n), Ok(((8u32 << 20) / 512 - 1, 512)));
    }
    // Blocks past the old end hold data.
    let disk = srp_initiator::disk::Disk::open(b.clone(), 0).unwrap();
    assert_eq!(disk.info().blocks, (8 << 20) / 512);
    let data: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    disk.write((6 << 20) / 512, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    disk.read((6 << 20) / 512, &mut back).unwrap();
    assert!(back == data, "data past the old end");
    drop(disk);

    // The sessions counted their AER; the devices list and the saved
    // configuration have the new size; growing to the same size again
    // is no change.
    let sessions = d.adm(&["sessions"]).unwrap();
    for row in sessions.as_array().unwrap() {
        assert_eq!(row["aers"], 1, "{sessions}");
    }
    let devs = d.adm(&["devices"]).unwrap();
    let grow = devs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "grow")
        .unwrap();
    assert_eq!(grow["size"], 8 << 20, "{devs}");
    let r = d.adm(&["resize", "grow", "8M"]).unwrap();
    assert_eq!(r["aer_sent"], 0, "{r}");
    let saved = d.dir.join("saved.toml");
    d.adm(&["write-config", saved.to_str().unwrap()]).unwrap();
    let cfg = srptd::config::Config::load(&saved).unwrap();
    let dev = cfg
        .devices
        .iter()
        .find(|x| x.name.get_ref() == "grow")
        .unwrap();
    assert_eq!(dev.size.as_ref().map(|s| s.get_ref().as_str()), Some("8M"));
    let text = d.adm_text(&["resize", "grow", "16M"]);
    assert!(
        text.starts_with("resized device grow from 8 MiB to 16 MiB; 2 sessions told"),
        "srptadm answers in words: {text}"
    );
}

/// The target's path MTU: `--mtu` and the file's `mtu` key, shown by
/// `srptadm show`, and a value that is no IB MTU refused with the sizes
/// that would do (file, line and key for the file).
#[test]
fn mtu_is_set_shown_and_checked() {
    let d = start_args("mtu", &["--mtu", "1024"], |dir| config(dir, "127.0.103.1"));
    let show = d.adm(&["show"]).unwrap();
    assert_eq!(show["mtu"], 1024, "{show}");
    let s = login("127.0.103.2", "127.0.103.1:5555", 0x103, 0x10300);
    let r = s
        .execute(
            srp::wire::Lun::from_u64(0),
            &[0u8; 6],
            srp_initiator::session::Xfer::None,
        )
        .unwrap();
    assert!(r.good() || !r.sense.is_empty(), "commands flow at MTU 1024");
    drop(s);

    let bad = common::tool(common::srptd_bin())
        .args(["--mtu", "1500", "--ram-mib", "1"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let e = String::from_utf8_lossy(&bad.stderr);
    assert!(
        e.contains("`1500` is not an IB path MTU")
            && e.contains("1024 on a 1500-byte Ethernet link"),
        "{e}"
    );
    let dir = tempdir("mtu-file");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        config(&dir, "127.0.103.1").replacen("rdma_cm_port", "mtu = 9000\nrdma_cm_port", 1),
    )
    .unwrap();
    let e = start_refused(&cfg);
    assert!(
        e.contains(&format!(
            "{}:4: target.mtu: `9000` is not an IB path MTU",
            cfg.display()
        )),
        "{e}"
    );
}
