//! What the tests share: the built library under the name applications
//! load, a NIC daemon in this process on 127.92.x.y, a wait for a TCP
//! listener (the pingpong servers' address exchange), C programs against
//! Debian's headers and `objdump -T` (rdmacm-abi's tests use them too).

#![allow(dead_code)]

use rdma_types::Guid;
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Runs `cargo build -q ARGS` into this test's target dir and profile
/// and returns the profile's directory: cargo builds only the rlib of the
/// library and no other package's binaries for these tests, so what an
/// earlier build left there could be stale (the way srpstack's tests
/// build their binaries).
pub fn build_in_profile(args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/<test>-<hash>
    let profile = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-q"])
        .args(args)
        .arg("--target-dir")
        .arg(profile.parent().unwrap())
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success(), "cargo build {args:?}");
    profile
}

/// `libibverbs_abi.so` of this test's profile, built first.
pub fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let lib = build_in_profile(&["-p", "ibverbs-abi", "--lib"]).join("libibverbs_abi.so");
            assert!(lib.exists(), "{} not built", lib.display());
            lib
        })
        .clone()
}

/// Our tool `name` of crates/rdma-perf (`rpingpong`, `rperftest`) of
/// this test's profile, built first.
pub fn rdma_perf_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_in_profile(&["-p", "rdma-perf", "--bins"]))
        .join(name)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh directory holding the library as `libibverbs.so.1`: what
/// `LD_LIBRARY_PATH` names.
pub fn library_dir() -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ibverbs-abi-lib-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(library(), dir.join("libibverbs.so.1")).unwrap();
    dir
}

/// A NIC daemon on its own threads, serving a soft RoCE CA on `ip`.
pub struct Daemon {
    pub soft: Arc<SoftRoce>,
    pub server: Arc<nicd::Server>,
    pub socket: PathBuf,
    pub libdir: PathBuf,
}

impl Daemon {
    pub fn start(ip: IpAddr) -> Daemon {
        let soft = SoftRoce::new(
            vec![SoftCa {
                guid: Guid(0x9201),
                ip,
            }],
            ROCE_PORT,
        );
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let socket =
            std::env::temp_dir().join(format!("ibverbs-abi-nicd-{}-{n}.sock", std::process::id()));
        let listener = nicd::server::bind(&socket, false).unwrap();
        let server = nicd::Server::new(soft.clone());
        server.serve(listener);
        Daemon {
            soft,
            server,
            socket,
            libdir: library_dir(),
        }
    }

    /// `tool args` through the library, on this daemon.
    pub fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.env("LD_LIBRARY_PATH", &self.libdir)
            .env(nicd::SOCKET_ENV, &self.socket)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.libdir);
    }
}

/// Whether something listens on TCP `port` (any address, IPv4 or v6),
/// from /proc/net/tcp{,6}: state 0A is LISTEN.
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let mut c = l.split_whitespace();
                let local = c.nth(1).unwrap_or("");
                let state = c.nth(1).unwrap_or("");
                local.ends_with(&want) && state == "0A"
            })
    })
}

/// Waits (bounded) until `child` listens on `port`; panics with its
/// output if it exits or the time runs out.
pub fn wait_listening(child: &mut Child, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..20_000 {
        if listening(port) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server exited ({status}) before listening on {port}");
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("nothing listens on {port}");
}

/// Starts `server`, waits until it listens on `port`, then runs `client`
/// against it: the outputs of both (client, server), each killed if it
/// runs past `secs`.
pub fn serve_and_connect(
    server: &mut Command,
    port: u16,
    client: &mut Command,
    secs: u64,
) -> (Output, Output) {
    let piped = |c: &mut Command| {
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut s = piped(server);
    wait_listening(&mut s, port);
    let c = piped(client);
    (finish(c, secs), finish(s, secs))
}

/// The output of `child`, killed if it runs past `secs`.
pub fn finish(mut child: Child, secs: u64) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match child.try_wait().unwrap() {
            Some(_) => return child.wait_with_output().unwrap(),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "still running after {secs} s: stdout {} stderr {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Compiles (gcc) and runs a program including `<header>` that prints
/// the value of each of `exprs`; the values as the C side has them.
pub fn c_values(header: &str, exprs: &[&str]) -> Vec<i64> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ibverbs-abi-layout-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = format!(
        "#include <stddef.h>\n#include <stdio.h>\n#include <{header}>\nint main(void) {{\n"
    );
    for e in exprs {
        src.push_str(&format!("  printf(\"%lld\\n\", (long long)({e}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, src).unwrap();
    let out = Command::new("gcc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc against <{header}>: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// The versioned names a binary imports under versions containing
/// `node` (`IBVERBS`, `RDMACM`) (`objdump -T`).
pub fn imports(bin: &Path, node: &str) -> Vec<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(bin).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("*UND*") && l.contains(node))
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let ver = f.next()?.trim_matches(|c| c == '(' || c == ')');
            Some((name.to_string(), ver.to_string()))
        })
        .collect()
}

/// The versioned names `lib` defines (`objdump -T`; each function's
/// unversioned twin left out).
pub fn imports_defined(lib: &Path) -> Vec<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(" g ") && (l.contains(" DF ") || l.contains(" DO ")) && !l.contains("*UND*")
        })
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let ver = f.next()?.trim_matches(|c| c == '(' || c == ')');
            (ver != "Base").then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}
