//! What a test needs from the machine, and what happens when it is
//! missing: one place for every tool, device and privilege our tests use.
//!
//! A test asks before it starts (`if !need::tool("fio") { return; }`), or
//! before an optional part (`need::part("the qemu-img part").tool(..)`).
//! When the thing is missing:
//! - under `CI=true` the test fails, naming it and the package or step that
//!   brings it: CI proves that `.ci/run` installed what the tests use;
//! - otherwise the test prints `SKIPPED <test>: <what> (<remedy>)` on
//!   stderr, past libtest's output capture so it shows in a passing run,
//!   and appends the same to the file `RDMA_TEST_SKIPS` names, if set.
//!   `.ci/test` sets it and ends with one line of what was skipped.
//!
//! Tools are looked up on `PATH` (then `/usr/sbin`, `/sbin`), as a shell
//! would: hiding a tool from `PATH` hides it from the tests.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Each tool a test runs and the Debian package that brings it (the
/// packages `.ci/run` installs).
const PACKAGES: &[(&str, &str)] = &[
    ("tshark", "tshark"),
    ("fio", "fio"),
    ("fusermount3", "fuse3"),
    ("qemu-img", "qemu-utils"),
    ("nbdinfo", "libnbd-bin"),
    ("nbdcopy", "libnbd-bin"),
    ("mkfs.ext4", "e2fsprogs"),
    ("fsck.ext4", "e2fsprogs"),
    ("losetup", "mount"),
    ("mount", "mount"),
    ("umount", "mount"),
    ("ip", "iproute2"),
    ("sha1sum", "coreutils"),
    ("man", "man-db"),
    ("systemd-analyze", "systemd"),
    ("ibv_devinfo", "ibverbs-utils"),
    ("ibv_devices", "ibverbs-utils"),
    ("ibv_rc_pingpong", "ibverbs-utils"),
    ("ibv_ud_pingpong", "ibverbs-utils"),
    ("objdump", "binutils"),
    ("gcc", "gcc"),
    ("ib_write_bw", "perftest"),
    ("ib_read_bw", "perftest"),
    ("ib_send_bw", "perftest"),
    ("ib_write_lat", "perftest"),
    ("rping", "rdmacm-utils"),
    ("ldd", "libc-bin"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("ocf-tester", "resource-agents"),
];

/// The Debian package that brings `tool`, if the table knows it.
pub fn package_of(tool: &str) -> Option<&'static str> {
    PACKAGES.iter().find(|(t, _)| *t == tool).map(|(_, p)| *p)
}

/// The path `tool` runs from, as a shell finds it (`PATH`, then
/// `/usr/sbin` and `/sbin`, which a non-root `PATH` may lack).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// True when this run is CI's (`CI=true`), where a missing tool fails.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether the whole test or one part of it is being asked for.
#[derive(Debug, Clone, Copy)]
pub struct Scope {
    part: Option<&'static str>,
}

/// The whole test needs it: when missing, the test should return.
pub const WHOLE: Scope = Scope { part: None };

/// One part of the test needs it (e.g. "the ext4 part"): when missing,
/// the test goes on without that part.
pub fn part(what: &'static str) -> Scope {
    Scope { part: Some(what) }
}

/// [`Scope::tool`] for the whole test.
pub fn tool(name: &str) -> bool {
    WHOLE.tool(name)
}

/// [`Scope::tools`] for the whole test.
pub fn tools(names: &[&str]) -> bool {
    WHOLE.tools(names)
}

/// [`Scope::fuse`] for the whole test.
pub fn fuse() -> bool {
    WHOLE.fuse()
}

/// [`Scope::netns`] for the whole test.
pub fn netns() -> bool {
    WHOLE.netns()
}

/// [`Scope::root`] for the whole test.
pub fn root() -> bool {
    WHOLE.root()
}

/// [`Scope::have`] for the whole test.
pub fn have(what: &str, missing: Option<String>, remedy: &str) -> bool {
    WHOLE.have(what, missing, remedy)
}

impl Scope {
    /// True if `name` is on `PATH`; else [`Scope::skip`] naming its package.
    pub fn tool(self, name: &str) -> bool {
        if which(name).is_some() {
            return true;
        }
        let remedy = match package_of(name) {
            Some(p) => format!("apt-get install {p}"),
            None => "install it".into(),
        };
        self.skip(&format!("{name} is not installed"), &remedy);
        false
    }

    /// True if every tool in `names` is on `PATH`; else skips once,
    /// naming the first missing one.
    pub fn tools(self, names: &[&str]) -> bool {
        names.iter().all(|n| self.tool(n))
    }

    /// True if FUSE can be mounted here: `/dev/fuse` (the kernel's side;
    /// `fusermount3`, when a test needs it, is asked for as a tool).
    pub fn fuse(self) -> bool {
        self.have(
            "FUSE",
            (!Path::new("/dev/fuse").exists()).then(|| "no /dev/fuse".into()),
            "modprobe fuse; in a container, pass --device /dev/fuse; apt-get install fuse3",
        )
    }

    /// True if the test may make network namespaces (root and `ip`).
    pub fn netns(self) -> bool {
        self.have(
            "network namespaces",
            crate::netns::cannot_run(),
            "run as root with iproute2 (apt-get install iproute2)",
        )
    }

    /// True if the test runs as root.
    pub fn root(self) -> bool {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        self.have(
            "root",
            (euid != 0).then(|| format!("running as uid {euid}")),
            "run the tests as root",
        )
    }

    /// True when `missing` is `None`; else [`Scope::skip`] with
    /// "`what`: `missing`". For checks only the test can make (a loop
    /// device attaches, an IPv6 socket binds).
    pub fn have(self, what: &str, missing: Option<String>, remedy: &str) -> bool {
        match missing {
            None => true,
            Some(why) => {
                self.skip(&format!("{what}: {why}"), remedy);
                false
            }
        }
    }

    /// Records that the test (or its part) does not run because `what` is
    /// missing; `remedy` says how to get it.
    ///
    /// # Panics
    /// Under `CI=true`: a missing tool or capability is a failure there.
    pub fn skip(self, what: &str, remedy: &str) {
        let test = current_test();
        let whole = match self.part {
            None => "the test".to_string(),
            Some(p) => p.to_string(),
        };
        if in_ci() {
            panic!(
                "{test}: {what} ({remedy}); under CI=true a missing tool or capability \
                 fails the test (.ci/run installs what the tests use)"
            );
        }
        let line = format!("SKIPPED {test}: {whole} did not run: {what} ({remedy})\n");
        // Straight to fd 2: libtest captures print!/eprint! of passing tests.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        if let Some(ledger) = std::env::var_os("RDMA_TEST_SKIPS") {
            let kind = if self.part.is_some() { "part" } else { "whole" };
            let row = format!("{test}\t{kind}\t{what}\t{remedy}\n");
            // One short write to an O_APPEND file: rows of parallel tests
            // do not interleave.
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(ledger)
            {
                let _ = f.write_all(row.as_bytes());
            }
        }
    }
}

/// `crate::binary::test` for the running test: libtest names each test's
/// thread after it; the binary's file name (less cargo's hash) says which
/// crate's test file it is.
fn current_test() -> String {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => s,
        })
        .unwrap_or_else(|| "?".into());
    match std::thread::current().name() {
        Some(t) if t != "main" => format!("{bin}::{t}"),
        _ => bin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_found_on_path_and_a_missing_one_names_its_package() {
        assert!(which("sh").is_some());
        assert!(which("no-such-tool-anywhere").is_none());
        assert_eq!(package_of("nbdcopy"), Some("libnbd-bin"));
        assert_eq!(package_of("fusermount3"), Some("fuse3"));
    }

    /// `.ci/run` installs by its own `TOOLS` table: each tool there must
    /// be one we know, from the same package.
    #[test]
    fn ci_installs_each_tool_from_the_package_named_here() {
        let run = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.ci/run"))
            .expect(".ci/run");
        let line = run
            .lines()
            .find_map(|l| l.strip_prefix("TOOLS=\""))
            .expect("TOOLS=\"...\" in .ci/run");
        let pairs: Vec<&str> = line.trim_end_matches('"').split_whitespace().collect();
        assert!(pairs.len() >= 7, "{pairs:?}");
        for tp in pairs {
            let (tool, package) = tp.split_once(':').expect("tool:package");
            assert_eq!(package_of(tool), Some(package), "{tool} in .ci/run");
        }
    }

    #[test]
    fn the_test_name_is_the_binary_and_the_test_thread() {
        let t = current_test();
        assert!(
            t.ends_with("::need::tests::the_test_name_is_the_binary_and_the_test_thread"),
            "{t}"
        );
        assert!(t.starts_with("rdma_testkit::"), "{t}");
    }
}
