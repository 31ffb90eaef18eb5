//! Two network namespaces of a test's own, a target side and an initiator
//! side, joined by veth pairs whose addresses exist only inside them: the
//! tests that cut a real link (`ip link set ... down`) under SRP I/O.
//! Dropping a [`Netns`] ends every process still inside the namespaces
//! and deletes them (their veths go with them) and the scratch directory.

#![allow(dead_code)]

use super::Proc;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use rdma_testkit::netns::ip;

/// One veth pair between the namespaces, with a /24 address at each end.
#[derive(Debug, Clone)]
pub struct Link {
    /// The target namespace's end.
    pub target_dev: String,
    /// The initiator namespace's end.
    pub initiator_dev: String,
    /// The target's address.
    pub target_ip: IpAddr,
    /// The initiator's address.
    pub initiator_ip: IpAddr,
}

/// The namespaces `<base>-t` (target) and `<base>-i` (initiator), their
/// links, and a scratch directory `<tmp>/<base>`.
pub struct Netns {
    names: Vec<String>,
    links: Vec<Link>,
    /// Scratch directory (configs, control sockets, the shared image).
    pub dir: PathBuf,
}

impl Netns {
    /// Makes both namespaces and `links`, addressed and up. `base` should
    /// hold the test's pid, so runs side by side do not collide.
    ///
    /// # Errors
    /// The first `ip` command that failed (what was made is removed).
    pub fn create(base: &str, links: &[Link]) -> Result<Netns, String> {
        let dir = std::env::temp_dir().join(base);
        let mut ns = Netns {
            names: Vec::new(),
            links: links.to_vec(),
            dir,
        };
        let _ = std::fs::remove_dir_all(&ns.dir);
        std::fs::create_dir_all(&ns.dir).map_err(|e| format!("{}: {e}", ns.dir.display()))?;
        for side in ["t", "i"] {
            let name = format!("{base}-{side}");
            // A leftover of a crashed run with the same pid would block us.
            let _ = ip(&["netns", "del", &name]);
            ip(&["netns", "add", &name])?;
            ns.names.push(name.clone());
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
        }
        let (t, i) = (ns.target().to_owned(), ns.initiator().to_owned());
        for l in links {
            // Both ends are made inside the namespaces: nothing appears
            // in the namespace the test runs in.
            ip(&[
                "link",
                "add",
                "name",
                &l.initiator_dev,
                "netns",
                &i,
                "type",
                "veth",
                "peer",
                "name",
                &l.target_dev,
                "netns",
                &t,
            ])?;
            let (at, ai) = (
                format!("{}/24", l.target_ip),
                format!("{}/24", l.initiator_ip),
            );
            ip(&["-n", &t, "addr", "add", &at, "dev", &l.target_dev])?;
            ip(&["-n", &i, "addr", "add", &ai, "dev", &l.initiator_dev])?;
            ip(&["-n", &t, "link", "set", &l.target_dev, "up"])?;
            ip(&["-n", &i, "link", "set", &l.initiator_dev, "up"])?;
        }
        Ok(ns)
    }

    /// The target namespace's name.
    pub fn target(&self) -> &str {
        &self.names[0]
    }

    /// The initiator namespace's name.
    pub fn initiator(&self) -> &str {
        &self.names[1]
    }

    /// `ip` arguments that set link `k`'s `far` (target) or near
    /// (initiator) end up or down, run from the test's own namespace.
    pub fn set_link(&self, k: usize, far: bool, up: bool) -> Vec<String> {
        let l = &self.links[k];
        let (ns, dev) = if far {
            (self.target(), &l.target_dev)
        } else {
            (self.initiator(), &l.initiator_dev)
        };
        ["-n", ns, "link", "set", dev, if up { "up" } else { "down" }]
            .map(String::from)
            .to_vec()
    }

    /// `srptd` in the target namespace on link `k`'s target address,
    /// exporting `dir/shared0.img` as device `shared0` (so every such
    /// daemon serves one LU, one NAA), with `env` set; its control socket.
    pub fn srptd(&self, k: usize, env: &[(&str, &str)]) -> (Proc, PathBuf) {
        let cfg = self.dir.join(format!("t{k}.toml"));
        let sock = self.dir.join(format!("t{k}.sock"));
        std::fs::write(
            &cfg,
            format!(
                "[target]\nip = \"{}\"\ncontrol_socket = \"{}\"\n\n\
                 [[device]]\nname = \"shared0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"16M\"\n\n\
                 [[lun]]\nlun = 0\ndevice = \"shared0\"\n",
                self.links[k].target_ip,
                sock.display(),
                self.dir.join("shared0.img").display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.target()])
            .arg(super::srptd_bin())
            .arg("--config")
            .arg(&cfg)
            .env("NICD_MODE", "own");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let p = Proc::start("srptd", &mut cmd);
        p.wait_line("listening on", 20);
        (p, sock)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for name in &self.names {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill with a pid read from the kernel and a
                        // valid signal; only processes inside our namespace.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("warning: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The sessions of the `srptd` behind `sock`: connection and commands
/// accepted (none when it does not answer).
pub fn sessions(sock: &Path) -> Vec<(String, u64)> {
    srptd::daemon::request(sock, &srptd::daemon::Request::Sessions)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|s| (s["conn"].to_string(), s["commands"].as_u64().unwrap_or(0)))
        .collect()
}

/// Commands the `srptd` behind `sock` has accepted, over its sessions.
pub fn commands(sock: &Path) -> u64 {
    sessions(sock).iter().map(|s| s.1).sum()
}

/// The namespace base name of a test: `<prefix>-<pid>-<tag>`, with the
/// prefix from `SRPSTACK_TEST_NETNS` when set (so engineers running side
/// by side can tell their namespaces apart), else `default`.
pub fn base_name(default: &str, tag: &str) -> String {
    let prefix = std::env::var("SRPSTACK_TEST_NETNS").unwrap_or_else(|_| default.to_owned());
    format!("{prefix}-{}-{tag}", std::process::id())
}

/// A duration in milliseconds, for the figures the tests print.
pub fn ms(d: std::time::Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
