//! Every command line of README.md, as written (issue 26): each line of
//! its ```sh blocks runs here against real daemons on the loopback
//! addresses it names, or is listed in [`NOT_HERE`] with why this host
//! cannot run it and what runs it instead. A README line that is neither
//! fails the test, so a new command cannot slip in unrun.
//!
//! A line is what the shell would see: `\` continuations joined, comments
//! dropped. How it runs:
//! - `target/release/X`, and `cargo run --release -p P [--bin X] -- ARGS`
//!   (X is P without `--bin`), are our binary X as this test's profile
//!   built it ([`common::bin_of`]; srpstack's own for `srpstack`), with
//!   every argument exactly as written; `mkdir` and `fio` are the host's;
//! - in a scratch directory holding a copy of the repository's `etc/`, so
//!   `etc/srptd.toml` is found as written and what `srptadm write-config`
//!   writes is the copy;
//! - a line ending in `&`, and one that serves until stopped (`rperf
//!   server`, `ibsm run`), starts in the background; the test waits
//!   (bounded) for the line it prints when ready. At the end of its block
//!   it must still run, or have ended with success; it is then stopped
//!   with SIGTERM and must exit with success. `srp discover --rescan
//!   --login` is stopped so once it has logged in, as its user would stop
//!   it before the next line ([`serves`]);
//! - `...` stands for what [`ELIDED`] says; a `[bracketed]` part runs both
//!   without and with it;
//! - a daemon a line needs that its block does not start ([`NEEDS`]) the
//!   test starts first, with a control socket of its own; the README's own
//!   daemons and tools use the default control sockets as written
//!   (`/run/srptd.sock`, `/run/srpd.sock` as root), so the run needs root.
//!
//! `--help` has no examples to run: no clap definition has an
//! `after_help`/`after_long_help`, and
//! [`no_help_text_has_examples_to_run`] keeps it so (`--help` of every
//! binary and every subcommand).

mod common;

use common::Proc;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// A README line this host cannot run, why, and what runs it instead.
struct NotHere {
    line: &'static str,
    why: &'static str,
    covered_by: &'static str,
    /// When not empty: our binary runs with the line's arguments here and
    /// must stop saying one of these (what this host lacks: the device,
    /// RDMA, the address), not with a usage error: the arguments parse.
    refused_with: &'static [&'static str],
}

/// How a binary asked for rdma-core device `rxe0` says it is not there:
/// no RDMA in the kernel, no libibverbs, or no such device.
const NO_DEVICE: &[&str] = &["no RDMA in this kernel", "libibverbs", "rxe0"];

/// Why the libibverbs ABI section's lines are not run here, and what runs
/// them.
const LIBIBVERBS_WHY: &str = "the libibverbs ABI section: a shell session (the library's directory on LD_LIBRARY_PATH for the lines after it, the daemon left running), and rdma-core's tools from ibverbs-utils";
const LIBIBVERBS_COVERED: &str = "crates/ibverbs-abi/tests/debian_binaries.rs (the same tools through the library on a NIC daemon, both pingpong roles validated)";

/// The same for the librdmacm ABI section.
const LIBRDMACM_WHY: &str = "the librdmacm ABI section: a shell session (both libraries' directory on LD_LIBRARY_PATH, the daemon left running), and rping from rdmacm-utils";
const LIBRDMACM_COVERED: &str = "crates/rdmacm-abi/tests/debian_binaries.rs (Debian's rping through both libraries on a NIC daemon, both roles, every ping validated)";

/// Why the High availability section's lines are not run here, and what
/// runs them.
const HA_WHY: &str = "the High availability section: a DRBD resource r0 (the drbd kernel module, drbd-utils) on a target host whose srptd exports /dev/drbd0";
const HA_COVERED: &str = "interop ha-drbd-linux and ha-drbd-ours (in the target VMs: drbdadm primary, the OCF agent's promote = srptadm set-role r0 primary, srptadm roles); crates/srpstack/tests/drbd_role.rs and ocf.rs (set-role both ways and roles against srptd on a fake DRBD device)";

const NOT_HERE: &[NotHere] = &[
    NotHere {
        line: "drbdadm primary r0",
        why: HA_WHY,
        covered_by: HA_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "target/release/srptadm set-role r0 primary",
        why: HA_WHY,
        covered_by: HA_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "target/release/srptadm roles",
        why: HA_WHY,
        covered_by: HA_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "target/release/srptadm set-role r0 secondary",
        why: HA_WHY,
        covered_by: HA_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "drbdadm secondary r0",
        why: HA_WHY,
        covered_by: HA_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "interop/run scenario ha-drbd-linux",
        why: "builds a Debian VM image and runs three qemu VMs as root",
        covered_by: "interop ha-drbd-linux (a documented one-command run, not in CI's list)",
        refused_with: &[],
    },
    NotHere {
        line: "interop/run scenario ha-drbd-ours",
        why: "builds a Debian VM image and runs three qemu VMs as root",
        covered_by: "interop ha-drbd-ours (a documented one-command run, not in CI's list)",
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p ibverbs-abi -p rdmacm-abi -p nicd",
        why: LIBRDMACM_WHY,
        covered_by: LIBRDMACM_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "cp target/release/librdmacm_abi.so /tmp/nicd-verbs/librdmacm.so.1",
        why: LIBRDMACM_WHY,
        covered_by: LIBRDMACM_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "LD_LIBRARY_PATH=/tmp/nicd-verbs rping -s -a 127.0.0.1 -v &",
        why: LIBRDMACM_WHY,
        covered_by: LIBRDMACM_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "LD_LIBRARY_PATH=/tmp/nicd-verbs rping -c -a 127.0.0.1 -v -V -C 10",
        why: LIBRDMACM_WHY,
        covered_by: LIBRDMACM_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p ibverbs-abi -p nicd",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "mkdir -p /tmp/nicd-verbs",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "cp target/release/libibverbs_abi.so /tmp/nicd-verbs/libibverbs.so.1",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "target/release/nicd --ip 127.0.0.1 &",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "LD_LIBRARY_PATH=/tmp/nicd-verbs ibv_devinfo",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "LD_LIBRARY_PATH=/tmp/nicd-verbs ibv_rc_pingpong -g 0 -c &",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "LD_LIBRARY_PATH=/tmp/nicd-verbs ibv_rc_pingpong -g 0 -c 127.0.0.1",
        why: LIBIBVERBS_WHY,
        covered_by: LIBIBVERBS_COVERED,
        refused_with: &[],
    },
    NotHere {
        line: "cargo run --release -p srpstack -- quickstart",
        why: "the quickstart; CI runs it as written after the tests",
        covered_by: "tests/cli.rs quickstart_exports_a_lun_verifies_io_and_cleans_up (same subcommand); .ci/run",
        refused_with: &[],
    },
    NotHere {
        line: ".ci/test",
        why: "the test suite this test is part of",
        covered_by: ".ci/run",
        refused_with: &[],
    },
    NotHere {
        line: ".ci/test --workspace",
        why: "the test suite this test is part of",
        covered_by: ".ci/run",
        refused_with: &[],
    },
    NotHere {
        line: "cargo fmt --all -- --check",
        why: "a CI check of the sources, not a command of ours",
        covered_by: ".ci/run",
        refused_with: &[],
    },
    NotHere {
        line: "cargo clippy --workspace --all-targets -- -D warnings",
        why: "a CI check of the sources, not a command of ours",
        covered_by: ".ci/run",
        refused_with: &[],
    },
    NotHere {
        line: "bench/compare",
        why: "installs nbdkit and tgtd with apt-get and runs for minutes",
        covered_by: "run by hand (bench/compare itself verifies every row)",
        refused_with: &[],
    },
    NotHere {
        line: "bench/nicd",
        why: "five rounds of four workloads each way: minutes of a busy machine",
        covered_by: "tests/bench_nicd.rs (bench/nicd --quick --rounds 1, every row checked)",
        refused_with: &[],
    },
    NotHere {
        line: "bench/cost",
        why: "runs srpstack under callgrind and perf stat for minutes (installs valgrind and perf with apt-get)",
        covered_by: "tests/cli.rs bench_counts_ios_and_reports_cost_per_io (srpstack bench --ios, the per-I/O report it reads); run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p rdma-perf",
        why: "a build; this test builds the binaries itself in its own profile",
        covered_by: "common::bin_of",
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p srptd -p srp-cli",
        why: "a build; this test builds the binaries itself in its own profile",
        covered_by: "common::bin_of",
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p srptd",
        why: "a build; this test builds the binaries itself in its own profile",
        covered_by: "common::bin_of",
        refused_with: &[],
    },
    NotHere {
        line: "cargo build --release -p rdma-perf -p srpstack -p srptd -p srp-cli",
        why: "a build; this test builds the binaries itself in its own profile",
        covered_by: "common::bin_of",
        refused_with: &[],
    },
    NotHere {
        line: "target/release/rpingpong --bind 10.0.0.2 -g 1",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop rxe-rc-pingpong-ours; rdma-perf tests/pingpong.rs on loopback",
        refused_with: &["cannot bind 10.0.0.2:4791"],
    },
    NotHere {
        line: "target/release/rpingpong 10.0.0.2 --bind 10.0.0.1 -g 1",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop rxe-rc-pingpong-ours; rdma-perf tests/pingpong.rs on loopback",
        refused_with: &["cannot bind 10.0.0.1:4791"],
    },
    NotHere {
        line: "target/release/rrping -s -a 10.0.0.2 -C 10 -v",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop rping-ours; rdma-perf tests/rping.rs on loopback",
        refused_with: &["cannot bind 10.0.0.2:4791"],
    },
    NotHere {
        line: "target/release/rrping -c -a 10.0.0.2 -I 10.0.0.1 -C 10 -v -V",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop rping-ours; rdma-perf tests/rping.rs on loopback",
        refused_with: &["cannot bind 10.0.0.1:4791"],
    },
    NotHere {
        line: "target/release/rperftest write --bind 10.0.0.2 -s 65536 -n 1000 --report_gbits",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop perftest-ours; rdma-perf tests/perftest.rs on loopback",
        refused_with: &["cannot bind 10.0.0.2:4791"],
    },
    NotHere {
        line: "target/release/rperftest write 10.0.0.2 --bind 10.0.0.1 -s 65536 -n 1000 --report_gbits",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop perftest-ours; rdma-perf tests/perftest.rs on loopback",
        refused_with: &["cannot bind 10.0.0.1:4791"],
    },
    NotHere {
        line: "target/release/rperftest atomic --bind 10.0.0.2 -A CMP_AND_SWAP --lat",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop perftest-atomic-ours; rdma-perf tests/perftest.rs on loopback",
        refused_with: &["cannot bind 10.0.0.2:4791"],
    },
    NotHere {
        line: "target/release/rperftest atomic 10.0.0.2 --bind 10.0.0.1 -A CMP_AND_SWAP --lat",
        why: "10.0.0.1 and 10.0.0.2 are two hosts' addresses (a Linux rxe peer)",
        covered_by: "interop perftest-atomic-ours; rdma-perf tests/perftest.rs on loopback",
        refused_with: &["cannot bind 10.0.0.1:4791"],
    },
    NotHere {
        line: "RPINGPONG=$PWD/target/release/rpingpong interop/run scenario rxe-rc-pingpong-ours",
        why: "builds a Debian VM image and runs qemu VMs as root",
        covered_by: "interop rxe-rc-pingpong-ours (.ci/run where VMs can run)",
        refused_with: &[],
    },
    NotHere {
        line: "SRPTD=$PWD/target/release/srptd interop/run scenario linux-srp-initiator-ours",
        why: "builds a Debian VM image and runs qemu VMs as root",
        covered_by: "interop linux-srp-initiator-ours (.ci/run where VMs can run)",
        refused_with: &[],
    },
    NotHere {
        line: "SRP_CLI=$PWD/target/release/srp interop/run scenario ours-srp-initiator-linux",
        why: "builds a Debian VM image and runs qemu VMs as root",
        covered_by: "interop ours-srp-initiator-linux (.ci/run where VMs can run)",
        refused_with: &[],
    },
    NotHere {
        line: "target/release/srptd --device rxe0 --rdma-cm-port 5555 --ram-mib 64",
        why: "needs the rdma-core device rxe0 (Linux rxe)",
        covered_by: "interop vm-srp-rdmacore, srp-compare-rdmacore",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "target/release/srp io --device rxe0 --dest 10.0.0.1:5555 --id-ext 505400fffe77000b --size 64M",
        why: "needs the rdma-core device rxe0 (Linux rxe) and a target at 10.0.0.1",
        covered_by: "interop vm-srp-rdmacore-initiator",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "target/release/srp discover --device rxe0 --target 10.0.0.2",
        why: "needs the rdma-core device rxe0 (Linux rxe), ib_umad, and a target at 10.0.0.2",
        covered_by: "interop vm-srp-discover-rdmacore",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "target/release/srpd --device rxe0 --mount-root /mnt",
        why: "needs the rdma-core device rxe0 (Linux rxe)",
        covered_by: "interop vm-srp-rdmacore-initiator",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "target/release/rperf server --device rxe0 --oob 10.0.0.1:18515",
        why: "needs the rdma-core device rxe0 (Linux rxe) and the address 10.0.0.1",
        covered_by: "interop rperf-rdmacore",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "target/release/rperf client --device rxe0 --server 10.0.0.1:18515 --op write --verify",
        why: "needs the rdma-core device rxe0 (Linux rxe) and a server at 10.0.0.1",
        covered_by: "interop rperf-rdmacore",
        refused_with: NO_DEVICE,
    },
    NotHere {
        line: "cargo bench -p rdma-wire --bench wire",
        why: "a benchmark: a release build and minutes of measuring",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo bench -p roce --bench engine",
        why: "a benchmark: a release build and minutes of measuring",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo bench -p rnic --bench loopback",
        why: "a benchmark: a release build and minutes of measuring",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo bench -p softroce --bench send_path",
        why: "a benchmark: a release build and minutes of measuring",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo bench -p scsi --bench core -- iops_table",
        why: "a benchmark: a release build and minutes of measuring",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo test --release -p rdma-perf one_gib -- --ignored --nocapture",
        why: "an #[ignore]d test: 1 GiB each way in a release build",
        covered_by: "run by hand",
        refused_with: &[],
    },
    NotHere {
        line: "cargo install cargo-fuzz",
        why: "installs a tool from crates.io",
        covered_by: ".ci/run installs it",
        refused_with: &[],
    },
    NotHere {
        line: "cd crates/<crate>/fuzz && cargo fuzz list",
        why: "cargo-fuzz, and <crate> is a placeholder",
        covered_by: "fuzz/run-all in .ci/run; the fuzz bodies run under cargo test (rdma_testkit::fuzz::replay)",
        refused_with: &[],
    },
    NotHere {
        line: "RUSTC_BOOTSTRAP=1 cargo fuzz run <target> -- -max_total_time=60",
        why: "cargo-fuzz with sanitizer builds, and <target> is a placeholder",
        covered_by: "fuzz/run-all in .ci/run",
        refused_with: &[],
    },
    NotHere {
        line: "cargo +nightly fuzz run <target> -- -max_total_time=60",
        why: "a nightly toolchain, and <target> is a placeholder",
        covered_by: "fuzz/run-all in .ci/run",
        refused_with: &[],
    },
    NotHere {
        line: "RUSTC_BOOTSTRAP=1 cargo fuzz tmin <target> artifacts/<target>/crash-<hash>",
        why: "minimises a crash that is not there; placeholders",
        covered_by: "fuzz/README.md",
        refused_with: &[],
    },
    NotHere {
        line: "fuzz/run-all -t 60",
        why: "every fuzz target for 60 s under cargo-fuzz",
        covered_by: ".ci/run runs fuzz/run-all -t 5",
        refused_with: &[],
    },
];

/// What `...` stands for in a line: the arguments the line before it wrote
/// out (rperf), or nothing (the defaults are the rest).
const ELIDED: &[(&str, &str)] = &[
    (
        "target/release/rperf client ... --size 65536 --duration 4 --baseline",
        "--bind 127.0.0.1:4791 --server 127.0.0.2:18515",
    ),
    (
        "target/release/rperf client ... --faults loss=0.01,reorder=0.01,seed=7 --capture client.pcap",
        "--bind 127.0.0.1:4791 --server 127.0.0.2:18515",
    ),
    (
        "target/release/srp io --dest 127.0.0.1:5555 --ip 127.0.0.2 --abort-every-ms 150 ...",
        "",
    ),
];

/// A daemon a README line needs that its block does not start.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Need {
    /// `srptd --ip 127.0.0.1 --ram-mib 64`, as "SRP between processes"
    /// starts it, with a control socket of the test's.
    Srptd,
    /// `srpd --ip 127.0.0.3` on the default control socket (the README's
    /// `srp discover --login` hands its logins there).
    Srpd,
    /// One LU behind two `srptd` (127.0.0.1 and 127.0.0.4) sharing an image.
    TwoPorts,
}

const NEEDS: &[(&str, &[Need])] = &[
    (
        "target/release/srp discover --target 127.0.0.1 --ip 127.0.0.2 [--rescan 60 --login]",
        &[Need::Srptd, Need::Srpd],
    ),
    (
        "target/release/srp io --dest 127.0.0.1:5555 --ip 127.0.0.2 --abort-every-ms 150 ...",
        &[Need::Srptd],
    ),
    (
        "target/release/srp io --dest 127.0.0.1:5555 --ip 127.0.0.2 --dest 127.0.0.4:5555 --ip 127.0.0.5 --path-policy round-robin",
        &[Need::TwoPorts],
    ),
    (
        "mkdir -p /tmp/srp && target/release/srpd --ip 127.0.0.2 --mount-root /tmp/srp &",
        &[Need::Srptd],
    ),
];

/// The README lines share addresses and the default control sockets.
static README: Mutex<()> = Mutex::new(());

/// A line of a ```sh block of README.md: continuations joined, comment
/// dropped, runs of blanks made one.
struct Line {
    block: usize,
    text: String,
}

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn lines(readme: &str) -> Vec<Line> {
    let (mut out, mut block, mut in_sh, mut joined) = (Vec::new(), 0, None, String::new());
    for raw in readme.lines() {
        if raw.trim_start().starts_with("```") {
            in_sh = match in_sh {
                Some(_) => None,
                None => {
                    block += 1;
                    Some(raw.trim() == "```sh")
                }
            };
            continue;
        }
        if in_sh != Some(true) {
            continue;
        }
        if let Some(head) = raw.trim_end().strip_suffix('\\') {
            joined.push_str(head);
            joined.push(' ');
            continue;
        }
        joined.push_str(raw);
        let text = words_of(&uncommented(&joined)).join(" ");
        joined.clear();
        if !text.is_empty() {
            out.push(Line { block, text });
        }
    }
    out
}

/// `s` up to a `#` that starts a shell comment (at the start or after a
/// blank, outside quotes).
fn uncommented(s: &str) -> String {
    let (mut quote, mut prev) = (None, ' ');
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return s[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    s.to_string()
}

/// The shell's words of `s` (quotes removed), in the README's subset of
/// the shell: blanks, single and double quotes.
fn words_of(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in s.chars() {
        match (quote, c) {
            (None, '\'' | '"') => (quote, any) = (Some(c), true),
            (Some(q), _) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            _ => {
                cur.push(c);
                any = true;
            }
        }
    }
    assert!(quote.is_none(), "unclosed quote in `{s}`");
    if any {
        out.push(cur);
    }
    out
}

/// A program of a README line, as this test runs it.
#[derive(Debug, PartialEq)]
enum Program {
    /// One of our binaries, by name.
    Ours(String),
    /// A tool of the host.
    Host(&'static str),
}

impl Program {
    fn command(&self) -> Command {
        match self {
            Program::Ours(n) if n == "srpstack" => Command::new(env!("CARGO_BIN_EXE_srpstack")),
            Program::Ours(n) => {
                let p = common::bin_of(n);
                assert!(
                    p.is_file(),
                    "{n}: no such binary of ours at {}",
                    p.display()
                );
                // The tools' default NIC is the NIC daemon's, as for a
                // user; one they start leaves soon after its last
                // client, so each block starts with none ([`nicd_gone`]).
                let mut c = Command::new(p);
                c.env_remove("NICD_MODE").env("NICD_IDLE_EXIT", "200ms");
                c
            }
            Program::Host(n) => Command::new(n),
        }
    }

    fn name(&self) -> &str {
        match self {
            Program::Ours(n) => n,
            Program::Host(n) => n,
        }
    }
}

/// The program and arguments of one simple command: `target/release/X
/// ARGS`, `cargo run --release -p P [--bin X] -- ARGS`, `mkdir`, `fio`;
/// `None` for anything else.
fn program(words: &[String]) -> Option<(Program, Vec<String>)> {
    let (first, rest) = words.split_first()?;
    if let Some(bin) = first.strip_prefix("target/release/") {
        return Some((Program::Ours(bin.into()), rest.to_vec()));
    }
    if let Some(host) = ["mkdir", "fio"].into_iter().find(|h| first == h) {
        return Some((Program::Host(host), rest.to_vec()));
    }
    let (opts, args) = rest.split_at(rest.iter().position(|w| w == "--")?);
    let (mut package, mut bin) = (None, None);
    let mut opts = opts.iter().map(String::as_str);
    (first == "cargo" && opts.next() == Some("run")).then_some(())?;
    while let Some(o) = opts.next() {
        match o {
            "--release" => {}
            "-p" => package = opts.next(),
            "--bin" => bin = opts.next(),
            _ => return None,
        }
    }
    let name = bin.or(package)?;
    Some((Program::Ours(name.into()), args[1..].to_vec()))
}

/// One simple command of a line, and whether it runs in the background.
struct Step {
    program: Program,
    args: Vec<String>,
    background: bool,
}

/// The ways this test runs `line` (two when it has a `[bracketed]` part:
/// without it, then with it), each as its `&&`-joined steps. `Err` says
/// why the test cannot.
fn runs_of(line: &str) -> Result<Vec<Vec<Step>>, String> {
    let mut words = words_of(line);
    if let Some(at) = words.iter().position(|w| w == "...") {
        let (_, with) = ELIDED
            .iter()
            .find(|(l, _)| *l == line)
            .ok_or("`...` that ELIDED does not spell out")?;
        words.splice(at..=at, with.split_whitespace().map(String::from));
    }
    let variants = match (
        words.iter().position(|w| w.starts_with('[')),
        words.iter().position(|w| w.ends_with(']')),
    ) {
        (Some(a), Some(b)) if a <= b => {
            let mut with = words.clone();
            with[a].remove(0);
            with[b].pop();
            let without = [&words[..a], &words[b + 1..]].concat();
            vec![without, with]
        }
        (None, None) => vec![words],
        _ => return Err("unbalanced [optional] part".into()),
    };
    variants
        .into_iter()
        .map(|mut words| {
            let background = words.last().is_some_and(|w| w == "&");
            if background {
                words.pop();
            }
            let parts: Vec<&[String]> = words.split(|w| w == "&&").collect();
            let last = parts.len() - 1;
            parts
                .into_iter()
                .enumerate()
                .map(|(i, part)| {
                    let (program, args) = program(part).ok_or_else(|| {
                        format!("no program this test runs: `{}`", part.join(" "))
                    })?;
                    Ok(Step {
                        program,
                        args,
                        background: i == last && background,
                    })
                })
                .collect()
        })
        .collect()
}

/// A command that serves until stopped: what it prints once it is ready,
/// and whether the lines after it use it (kept to the end of its block)
/// or not (stopped once ready, as its user would with Ctrl-C before the
/// next line).
struct Serves {
    ready: &'static str,
    kept: bool,
}

/// How `step` serves; `None` for a command that runs to its end.
fn serves(step: &Step) -> Option<Serves> {
    let arg = |a: &str| step.args.iter().any(|w| w == a);
    let first = step.args.first().map(String::as_str).unwrap_or("");
    let (ready, kept) = match (step.program.name(), first) {
        ("srptd", _) if !arg("--check") => ("listening on", true),
        ("srpd", _) => ("srpd: ready on", true),
        ("ibsm", "run") => ("ibsm: SM and SA at", true),
        ("rperf", "server") => ("rperf server: listening on", true),
        ("srp", "fuse") => ("srp: mounted", true),
        ("srp", "nbd") => ("served at nbd://127.0.0.1:10809", true),
        ("srp", "discover") if arg("--rescan") && arg("--login") => ("# logged in as", false),
        _ => return None,
    };
    Some(Serves { ready, kept })
}

/// Every README line is run here or listed in [`NOT_HERE`], and every
/// table names lines the README has.
#[test]
fn every_readme_line_is_run_or_listed() {
    let all = lines(&readme());
    assert!(all.len() > 40, "{} lines: is README.md parsed?", all.len());
    let mut unaccounted = Vec::new();
    for l in &all {
        if let Some(n) = NOT_HERE.iter().find(|n| n.line == l.text) {
            assert!(!n.why.is_empty() && !n.covered_by.is_empty(), "{}", n.line);
            eprintln!(
                "not run here: {}: {}; instead: {}",
                n.line, n.why, n.covered_by
            );
            continue;
        }
        match runs_of(&l.text) {
            Ok(runs) => {
                for step in runs.iter().flatten() {
                    assert!(
                        !step.background || serves(step).is_some_and(|s| s.kept),
                        "`{}` runs in the background: say in serves() what it prints when ready",
                        l.text
                    );
                }
            }
            Err(why) => unaccounted.push(format!("{}  ({why})", l.text)),
        }
    }
    assert!(
        unaccounted.is_empty(),
        "README lines neither run by this test nor listed in NOT_HERE:\n{}",
        unaccounted.join("\n")
    );
    let keys = NOT_HERE
        .iter()
        .map(|n| n.line)
        .chain(ELIDED.iter().map(|e| e.0))
        .chain(NEEDS.iter().map(|n| n.0));
    for k in keys {
        assert!(
            all.iter().any(|l| l.text == k),
            "not a README line any more: `{k}`"
        );
    }
}

/// The lines [`NOT_HERE`] runs for their arguments: each stops for the
/// device or address this host lacks, not with a usage error.
#[test]
fn lines_that_cannot_run_here_still_parse() {
    let _one = README.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let _leftovers = Leftovers(vec![dir.clone()]);
    for n in NOT_HERE {
        if n.refused_with.is_empty() {
            continue;
        }
        let runs = runs_of(n.line).unwrap();
        assert!(
            runs.len() == 1 && runs[0].len() == 1,
            "`{}`: one command expected",
            n.line
        );
        let step = &runs[0][0];
        let (ok, out) = run_to_end(step, &dir, 20);
        assert!(!ok, "`{}` ran here: {out}", n.line);
        assert!(
            !out.contains("try '--help'") && !out.contains("Usage:"),
            "`{}` is a usage error: {out}",
            n.line
        );
        assert!(
            n.refused_with.iter().any(|r| out.contains(r)),
            "`{}` does not say why it cannot run: {out}",
            n.line
        );
        eprintln!("{}: {}", n.line, out.trim());
    }
}

/// The scratch directory the README's lines run in.
fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("readme-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A background command of a block: the README line, and the process.
struct Running {
    line: String,
    proc: Proc,
}

/// Stops what a block started, newest first: each must still run (or
/// have ended with success), and exit with success on SIGTERM.
fn stop_all(bg: &mut Vec<Running>) {
    while let Some(mut r) = bg.pop() {
        if let Some(status) = r.proc.child.try_wait().unwrap() {
            assert!(
                status.success(),
                "`{}` ended before its block did: {status}",
                r.line
            );
            continue;
        }
        r.proc.term();
        r.proc.rest(20);
        let status = r.proc.child.wait().unwrap();
        assert!(status.success(), "`{}` on SIGTERM: {status}", r.line);
    }
}

/// Starts what `need` says, with control sockets of this test's.
fn start_need(need: Need, dir: &Path) -> Vec<Proc> {
    match need {
        Need::Srptd => vec![common::srptd_ram64(
            "127.0.0.1",
            &dir.join("srptd-need.sock"),
        )],
        Need::Srpd => {
            let root = dir.join("srpd-need");
            std::fs::create_dir_all(&root).unwrap();
            let sock = daemon_ctl::control_socket_of("srpd");
            vec![common::start_srpd("127.0.0.3", &root, &sock, &[])]
        }
        Need::TwoPorts => {
            let shared = dir.join("two-ports");
            std::fs::create_dir_all(&shared).unwrap();
            vec![
                common::srptd_sharing(&shared, "127.0.0.1", "a").0,
                common::srptd_sharing(&shared, "127.0.0.4", "b").0,
            ]
        }
    }
}

/// Runs `step` in `dir` to its end (at most `secs`): success, and its
/// stdout then stderr.
fn run_to_end(step: &Step, dir: &Path, secs: u64) -> (bool, String) {
    let err_path = dir.join("step.err");
    let err = std::fs::File::create(&err_path).unwrap();
    let mut cmd = step.program.command();
    let mut p = Proc::start(
        "README line",
        cmd.args(&step.args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stderr(err),
    );
    let out = p.rest(secs).join("\n");
    let status = p.child.wait().unwrap();
    (
        status.success(),
        out + "\n" + &std::fs::read_to_string(&err_path).unwrap(),
    )
}

/// Each line of README.md this host can run, run as written, block by
/// block in the README's order, against real daemons.
#[test]
fn the_readme_runs_as_written() {
    if !host_runs_the_readme() {
        return;
    }
    let _one = README.lock().unwrap_or_else(|e| e.into_inner());
    for (who, sock) in [("srptd", "srptd"), ("srpd", "srpd")] {
        let path = daemon_ctl::control_socket_of(sock);
        assert!(
            std::os::unix::net::UnixStream::connect(&path).is_err(),
            "a {who} serves at {} already; the README's commands use that default socket",
            path.display()
        );
    }
    // One that the tools of a test run just before started leaves 200 ms
    // after them.
    nicd_gone("the tests before this one ended (the README's commands use that default socket)");
    assert!(
        std::os::unix::net::UnixStream::connect(nicd_socket()).is_err(),
        "a NIC daemon serves at {} already; the README's commands use that default socket",
        nicd_socket().display()
    );
    let dir = scratch();
    let etc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc");
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    for f in std::fs::read_dir(&etc).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join("etc").join(f.file_name().unwrap())).unwrap();
    }
    // What the README's lines create outside the scratch directory, if
    // they do: removed at the end, passed or not.
    let _leftovers = Leftovers(
        [
            "/var/tmp/srptd-disk0.img",
            "/tmp/srp",
            dir.to_str().unwrap(),
        ]
        .into_iter()
        .map(PathBuf::from)
        .filter(|p| !p.exists() || *p == dir)
        .collect(),
    );

    let all = lines(&readme());
    // The block's background lines, and the daemons started for its NEEDS.
    let (mut bg, mut under, mut needs) = (Vec::new(), Vec::new(), Vec::new());
    let mut ran = 0;
    for (i, l) in all.iter().enumerate() {
        if NOT_HERE.iter().any(|n| n.line == l.text) {
            continue;
        }
        for need in NEEDS.iter().filter(|n| n.0 == l.text).flat_map(|n| n.1) {
            if !needs.contains(need) {
                needs.push(*need);
                under.extend(start_need(*need, &dir).into_iter().map(|proc| Running {
                    line: format!("{need:?}, for `{}`", l.text),
                    proc,
                }));
            }
        }
        for steps in runs_of(&l.text).unwrap_or_else(|e| panic!("`{}`: {e}", l.text)) {
            for step in steps {
                eprintln!("README: {} {}", step.program.name(), step.args.join(" "));
                match serves(&step) {
                    Some(serves) => {
                        let mut cmd = step.program.command();
                        let p =
                            Proc::start("README daemon", cmd.args(&step.args).current_dir(&dir));
                        p.wait_line(serves.ready, 60);
                        let mut once = vec![Running {
                            line: l.text.clone(),
                            proc: p,
                        }];
                        match serves.kept {
                            true => bg.append(&mut once),
                            false => stop_all(&mut once),
                        }
                    }
                    None => {
                        let (ok, out) = run_to_end(&step, &dir, 300);
                        assert!(ok, "README line `{}` failed:\n{out}", l.text);
                    }
                }
                ran += 1;
            }
        }
        if all.get(i + 1).is_none_or(|next| next.block != l.block) {
            stop_all(&mut bg);
            stop_all(&mut under);
            needs.clear();
            nicd_gone("its block's tools ended");
        }
    }
    assert!(ran > 30, "ran only {ran} commands");
    // `srptadm write-config` wrote the copy srptd was started with.
    let written = std::fs::read_to_string(dir.join("etc/srptd.toml")).unwrap();
    assert!(written.contains("\"extra\""), "{written}");
}

/// The NIC daemon's default socket for this user (the README's tools
/// start a daemon there when none serves).
fn nicd_socket() -> PathBuf {
    nicd::socket_for(Path::new(""))
}

/// Waits (bounded) for a NIC daemon a block's tools started to leave,
/// which it does once they have (`NICD_IDLE_EXIT`, 200 ms here), so the
/// next block's NICs of their own find their addresses free. Its socket
/// goes with it; watched without connecting, since a connection is a
/// client.
fn nicd_gone(after: &str) {
    let sock = nicd_socket();
    let start = std::time::Instant::now();
    let mut tried = start;
    while sock.exists() {
        let now = std::time::Instant::now();
        assert!(
            now < start + std::time::Duration::from_secs(20),
            "the NIC daemon at {} is still there 20 s after {after}",
            sock.display()
        );
        // Once a second: a socket nothing listens on is one a daemon
        // that failed to start left behind.
        if now > tried + std::time::Duration::from_secs(1) {
            tried = now;
            if std::os::unix::net::UnixStream::connect(&sock)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            {
                return;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Files and directories a run made, removed when it ends.
struct Leftovers(Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p)
                .or_else(|_| std::fs::remove_dir(p))
                .or_else(|_| std::fs::remove_dir_all(p));
        }
    }
}

/// What the run needs from the host: root (the default control sockets
/// are under /run), FUSE and fio.
fn host_runs_the_readme() -> bool {
    rdma_testkit::need::root()
        && rdma_testkit::need::fuse()
        && rdma_testkit::need::tools(&["fio", "fusermount3"])
}

/// No `--help` of ours, of any subcommand, carries examples this test
/// would have to run: no line of any of them opens with "Example".
#[test]
fn no_help_text_has_examples_to_run() {
    let bins = common::BINARIES
        .iter()
        .map(|b| common::bin_of(b))
        .chain([PathBuf::from(env!("CARGO_BIN_EXE_srpstack"))]);
    let mut helps = Vec::new();
    for bin in bins {
        helps_of(&bin, &mut Vec::new(), &mut helps);
    }
    assert!(helps.len() > 40, "{} help texts", helps.len());
    for (cmd, text) in &helps {
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().to_lowercase().starts_with("example")),
            "`{cmd} --help` has examples: run them in this test\n{text}"
        );
    }
}

/// `bin sub... --help`, and the same of each subcommand it lists.
fn helps_of(bin: &Path, sub: &mut Vec<String>, out: &mut Vec<(String, String)>) {
    let (ok, text) = common::run(Command::new(bin).args(&*sub).arg("--help"));
    let cmd = format!("{} {}", bin.display(), sub.join(" "));
    assert!(ok, "{cmd} --help: {text}");
    // "Commands:" then one "  name  description" line each.
    let subs: Vec<String> = text
        .lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .map(String::from)
        .collect();
    out.push((cmd, text));
    for s in subs {
        sub.push(s);
        helps_of(bin, sub, out);
        sub.pop();
    }
}

/// The first fenced block after the line of README.md that starts with
/// `intro`, without its fences.
fn block_after(readme: &str, intro: &str) -> String {
    let from = readme
        .find(intro)
        .unwrap_or_else(|| panic!("README.md has no `{intro}`"));
    let rest = &readme[from..];
    let open = rest.find("\n```").expect("a fenced block") + 1;
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    body[..body.find("\n```").expect("a closing fence")].to_string()
}

/// The here-document `cat >PATH <<...` of a scenario file, with `vars`
/// put in for their values.
fn heredoc(scenario: &str, path: &str, vars: &[(&str, &str)]) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../interop/scenarios")
        .join(scenario);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let start = text
        .lines()
        .position(|l| l.trim_start().starts_with(&format!("cat >{path} <<")))
        .unwrap_or_else(|| panic!("{scenario} writes no {path}"));
    let mut body: Vec<&str> = Vec::new();
    for l in text.lines().skip(start + 1) {
        if l == "EOF" {
            break;
        }
        body.push(l);
    }
    let mut s = body.join("\n");
    for (k, v) in vars {
        s = s.replace(k, v);
    }
    s
}

/// The High availability section shows "the exact configs the scenarios
/// use": the scenarios' here-documents, as host a writes them.
#[test]
fn the_high_availability_configs_are_the_scenarios() {
    let r = readme();
    let a = [
        ("$ip", "10.77.0.11"),
        ("$SRP_PORT", "5555"),
        ("$rel", "1"),
        ("$loopdev", "/dev/loop0"),
        ("$a", "10.77.0.11"),
        ("$b", "10.77.0.12"),
    ];
    assert_eq!(
        block_after(&r, "The configuration both target hosts"),
        heredoc("_ha-drbd.sh", "/etc/srptd.toml", &a)
    );
    assert_eq!(
        block_after(&r, "Their DRBD resource"),
        heredoc("_ha-drbd.sh", "/etc/drbd.conf", &a)
    );
    assert_eq!(
        block_after(&r, "The Linux initiator's `/etc/multipath.conf`"),
        heredoc("ha-drbd-linux.sh", "/etc/multipath.conf", &[])
    );
}
