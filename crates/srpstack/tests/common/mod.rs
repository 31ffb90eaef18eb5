//! What the process tests share: a child process whose stdout lines are
//! read on a thread, so a test can wait (bounded) for a line; [`netns`],
//! the namespaces and veth links of the tests that cut a real link.

pub mod netns;
pub mod report;

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process, killed on drop.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// The lines [`Proc::wait_line`] read past.
    passed_over: RefCell<Vec<String>>,
    name: &'static str,
}

impl Proc {
    /// Starts `cmd` with its stdout piped.
    pub fn start(name: &'static str, cmd: &mut Command) -> Proc {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Proc {
            child,
            lines,
            passed_over: RefCell::default(),
            name,
        }
    }

    /// Waits at most `secs` for a line containing `what`; returns it.
    pub fn wait_line(&self, what: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) if l.contains(what) => return l,
                Ok(l) => self.passed_over.borrow_mut().push(l),
                Err(e) => panic!("{} never said `{what}`: {e}", self.name),
            }
        }
    }

    /// How many of the lines [`Proc::wait_line`] read past contain `what`.
    #[allow(dead_code)]
    pub fn passed_over_containing(&self, what: &str) -> usize {
        self.passed_over
            .borrow()
            .iter()
            .filter(|l| l.contains(what))
            .count()
    }

    /// Every further line until the process closes its stdout (exits),
    /// waiting at most `secs`.
    #[allow(dead_code)]
    pub fn rest(&self, secs: u64) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut out = Vec::new();
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) => out.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => return out,
                Err(e) => panic!("{} still running after {secs} s: {e}", self.name),
            }
        }
    }

    /// Sends SIGTERM.
    #[allow(dead_code)]
    pub fn term(&mut self) {
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The packages whose binaries these tests run: srptd (srptd, srptadm),
/// srp-cli (srp, srpd), ib-tools (ibsm, ibstat, saquery), rdma-perf
/// (rperf, rperftest, rpingpong, rrping) and nicd.
const BIN_PACKAGES: [&str; 5] = ["srptd", "srp-cli", "ib-tools", "rdma-perf", "nicd"];

/// Every binary of [`BIN_PACKAGES`] (srpstack's own is
/// `CARGO_BIN_EXE_srpstack`).
#[allow(dead_code)]
pub const BINARIES: [&str; 11] = [
    "srptd",
    "srptadm",
    "srp",
    "srpd",
    "rperf",
    "rperftest",
    "rpingpong",
    "rrping",
    "ibsm",
    "ibstat",
    "saquery",
];

/// The binary `name` of one of [`BIN_PACKAGES`]. Cargo builds no other
/// package's binaries for these tests, so the first call builds them all,
/// in one `cargo build` per test process, into the same target directory
/// and profile as the test (a no-op when a workspace build made them
/// already).
#[allow(dead_code)]
pub fn bin_of(name: &str) -> std::path::PathBuf {
    static PROFILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PROFILE
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            // <target>/<profile>/deps/<test>-<hash>
            let profile = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-q", "--bins"]);
            for p in BIN_PACKAGES {
                cmd.args(["-p", p]);
            }
            cmd.arg("--target-dir")
                .arg(profile.parent().unwrap())
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            assert!(
                cmd.status().unwrap().success(),
                "cargo build --bins -p {}",
                BIN_PACKAGES.join(" -p ")
            );
            profile
        })
        .join(name)
}

/// A command of one of the tools, on a soft RoCE NIC of its own
/// (`NICD_MODE=own`): the tests start their processes at addresses of their
/// own and look at what each one's NIC does. A test of the NIC daemon
/// gives `--nicd`, which wins over `NICD_MODE=own`; the daemon as the
/// default is tested with `NICD` removed (`nicd_default`).
#[allow(dead_code)]
pub fn tool(path: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(path);
    c.env("NICD_MODE", "own");
    c
}

/// `srptd`, built if need be ([`bin_of`]).
#[allow(dead_code)]
pub fn srptd_bin() -> std::path::PathBuf {
    bin_of("srptd")
}

/// A control socket path of this test process: `<test>-<pid>-<tag>.sock`
/// in the temporary directory.
#[allow(dead_code)]
pub fn sock_of(test: &str, tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{test}-{}-{tag}.sock", std::process::id()))
}

/// `srptd` on `ip` with a 64 MiB RAM LUN (as the README starts it) and
/// its control socket at `sock`, listening.
#[allow(dead_code)]
pub fn srptd_ram64(ip: &str, sock: &std::path::Path) -> Proc {
    let d = Proc::start(
        "srptd",
        tool(srptd_bin())
            .args(["--ip", ip, "--ram-mib", "64", "--control-socket"])
            .arg(sock),
    );
    d.wait_line("listening on", 60);
    d
}

/// `srptd` on `ip` exporting the fileio image `dir/shared0.img` (16 MiB)
/// as device `shared0`, LUN 0, with its config and control socket
/// `dir/<tag>.toml` and `dir/<tag>.sock`, listening: started twice on two
/// addresses, one LU (the same NAA) behind two target ports.
#[allow(dead_code)]
pub fn srptd_sharing(dir: &std::path::Path, ip: &str, tag: &str) -> (Proc, std::path::PathBuf) {
    let sock = dir.join(format!("{tag}.sock"));
    let cfg = dir.join(format!("{tag}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"{ip}\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"shared0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"16M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"shared0\"\n",
            sock.display(),
            dir.join("shared0.img").display()
        ),
    )
    .unwrap();
    (start_srptd(&cfg), sock)
}

/// `srptadm` ([`bin_of`]).
#[allow(dead_code)]
pub fn srptadm_bin() -> std::path::PathBuf {
    bin_of("srptadm")
}

/// `srp` ([`bin_of`]).
#[allow(dead_code)]
pub fn srp_bin() -> std::path::PathBuf {
    bin_of("srp")
}

/// `srpd` ([`bin_of`]).
#[allow(dead_code)]
pub fn srpd_bin() -> std::path::PathBuf {
    bin_of("srpd")
}

/// `ibsm` ([`bin_of`]).
#[allow(dead_code)]
pub fn ibsm_bin() -> std::path::PathBuf {
    bin_of("ibsm")
}

/// `srptd --config cfg`, once it listens.
#[allow(dead_code)]
pub fn start_srptd(cfg: &std::path::Path) -> Proc {
    let p = Proc::start("srptd", tool(srptd_bin()).arg("--config").arg(cfg));
    p.wait_line("listening on", 20);
    p
}

/// Asserts that the NIC daemon at `sock` lists each of `procs` (by
/// name, for the message) among its clients (`nicd --clients`).
#[allow(dead_code)]
pub fn assert_nicd_clients(sock: &std::path::Path, procs: &[(&str, &Proc)]) {
    let out = Command::new(bin_of("nicd"))
        .args(["--clients", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    for (who, p) in procs {
        assert!(
            listed.contains(&format!("pid {}", p.child.id())),
            "{who} is not a client of the daemon at {}: {listed}",
            sock.display()
        );
    }
}

/// `srpd` on `ip` with its LUN files under `root` and its control socket
/// at `sock` (and `more` arguments), once it is ready.
#[allow(dead_code)]
pub fn start_srpd(ip: &str, root: &std::path::Path, sock: &std::path::Path, more: &[&str]) -> Proc {
    let p = Proc::start(
        "srpd",
        tool(srpd_bin())
            .args(["--ip", ip])
            .args(more)
            .arg("--mount-root")
            .arg(root)
            .arg("--control-socket")
            .arg(sock),
    );
    p.wait_line("srpd: ready on", 20);
    p
}

/// The GID of an IP address in hex, as login strings write `dgid=`.
#[allow(dead_code)]
pub fn gid_hex(ip: std::net::IpAddr) -> String {
    rdma_types::Gid::from_ip(ip)
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Runs `cmd` to its end: success, and stdout then stderr.
#[allow(dead_code)]
pub fn run(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().unwrap();
    (o.status.success(), text(&o))
}

/// `srptadm --socket SOCK ARGS...` to its end: success, and its output.
#[allow(dead_code)]
pub fn srptadm(sock: &std::path::Path, args: &[&str]) -> (bool, String) {
    run(Command::new(srptadm_bin())
        .arg("--socket")
        .arg(sock)
        .args(args))
}

/// `srptadm --json ARGS...`, which must succeed: its answer, parsed.
#[allow(dead_code)]
pub fn srptadm_json(sock: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (ok, out) = srptadm(sock, &all);
    assert!(ok, "srptadm {args:?}: {out}");
    serde_json::from_str(out.lines().next().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A finished process's stdout then stderr.
#[allow(dead_code)]
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `srp discover --sa` at the NIC daemon's port at `ip` (daemon socket
/// `nicd`), as srp_daemon finds targets: the login string it prints for
/// the target port at `target` (srptd's, its ID the GUID of that
/// address).
#[allow(dead_code)]
pub fn sa_login_string(nicd: &std::path::Path, ip: &str, target: &str) -> String {
    let found = tool(srp_bin())
        .args(["discover", "--sa", "--nicd"])
        .arg(nicd)
        .args(["--ip", ip, "--timeout-ms", "500", "--pkey", "ffff"])
        .output()
        .unwrap();
    let out = text(&found);
    assert!(found.status.success(), "{out}");
    let guid = rnic::softroce::ip_guid(target.parse().unwrap()).0;
    out.lines()
        .find(|l| l.starts_with(&format!("id_ext={guid:016x},ioc_guid={guid:016x},dgid=")))
        .unwrap_or_else(|| panic!("no login string for srptd's port at {target}: {out}"))
        .to_string()
}

/// Runs the `srp` CLI with `args` against the `srpd` behind `sock`.
#[allow(dead_code)]
pub fn srp(sock: &std::path::Path, args: &[&str]) -> Output {
    tool(srp_bin())
        .args(args)
        .arg("--control-socket")
        .arg(sock)
        .output()
        .unwrap()
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after
/// `secs`.
#[allow(dead_code)]
pub fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes 8 KiB of a pattern (`seed` varies it) at 1 MiB into the LUN
/// file `file`, syncs, reads it back and checks it.
#[allow(dead_code)]
pub fn write_read_back(file: &std::path::Path, seed: u32) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let block: Vec<u8> = (0..8192u32).map(|i| (i * seed + 3) as u8).collect();
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&block).unwrap();
        f.sync_all().unwrap();
    }
    let mut back = vec![0u8; block.len()];
    let mut f = std::fs::File::open(file).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(
        back == block,
        "data read back from {} differs",
        file.display()
    );
}
