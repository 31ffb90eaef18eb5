//! Path failover over a real network link (issue 8): the test makes two
//! network namespaces of its own (`srp-nsfo-<pid>-<side>-t` and `-i`, or
//! `$SRPSTACK_TEST_NETNS` for the prefix), a target and an initiator, joined by two
//! veth pairs (10.201.1.0/24 and 10.201.2.0/24, which exist only inside
//! those namespaces). Two `srptd` run in the target namespace, one per
//! address, exporting the same fileio image under the same device name
//! (so one LU, one NAA, behind both). The initiator is this test binary
//! itself, run again by `ip netns exec` in the initiator namespace: it
//! logs in over both links as `srp io --dest A --dest B` does (a
//! reconnecting remote port per path, one failover multipath device over
//! them) and runs a verified random read/write workload.
//!
//! While the workload runs, one veth end of path A is set down with
//! `ip link set ... down`: either the target's end (the far end: the
//! initiator's link loses carrier) or the initiator's own end (its routes
//! go too). The workload must
//! see no error and no bad data; the time from the link going down to the
//! first I/O completed over path B is measured and printed (the goal is
//! under 1 s; the assertion is a loose bound against a hang). Then the
//! link comes back: path A logs in again, and a further verified run is
//! carried by path A again (failover policy: the first path that is up).
//!
//! Path A's failure is found by the port event: the soft RoCE port follows
//! the carrier of the interface under its address (`softroce::link`), so
//! either cut takes it DOWN at once (the far end's cut takes the carrier
//! of ours) and the session fails on `PortDown`, without waiting for the
//! RC transport's retries (local ACK timeout 14, about 67 ms, 7 retries:
//! about 0.55 s; still the way with `SOFTROCE_FOLLOW_LINK=0`). The
//! sessions keep the default SRP command timeout (30 s), as `srp io` does
//! (`SRP_NSFO_CMD_TIMEOUT_MS` sets another, `SRP_NSFO_PROBE_MS` the
//! probe interval, 0 for none). When the target had acknowledged every
//! command of ours at the cut and nothing tells us of it, the session's
//! liveness probe (a zero-length RDMA WRITE after 250 ms of silence while
//! commands wait) gives the transport something to retry.
//! When the link is back the port is ACTIVE again and path A logs in at
//! once (no login is sent while the port is DOWN, and `PortActive` starts
//! the next attempt): the time from link up to path A running again is
//! printed and asserted loosely (under 2 s).
//!
//! The longest I/O across the cut is printed: with the dead session torn
//! down off the I/O path it is the failover time, not that plus the DREQ's
//! wait.
//!
//! The stale-copy tests cut path A's far end with link following off
//! everywhere and write while it is down: the kernel holds the write's
//! datagrams in its unresolved neighbour entry and sends them when the
//! link is back, so path A's target runs the write late, after it was
//! retried on path B. They check the fence of `srp_initiator::fence`
//! (the block keeps the rewrite that followed) and that without it the
//! old copy wins (the lost write of issue 33, reproduced).
//!
//! Without root, `ip` or network namespaces the tests are skipped, or
//! fail under `CI=true` (`rdma_testkit::need`). The namespaces are deleted on every way
//! out (a drop guard), which also ends whatever still runs inside them.

mod common;

use common::netns::{base_name, ms, sessions, Link, Netns};
use common::Proc;
use rdma_testkit::netns::ip;
use srp_initiator::disk::Disk;
use srp_initiator::fence::Doubt;
use srp_initiator::multipath::{Multipath, PathDevice, Policy};
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::RportConfig;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set in the initiator process: the target namespace's name.
const ENV_TARGET_NS: &str = "SRP_NSFO_TARGET_NS";
/// Set in the initiator process: which end of path A to cut (`far`/`near`).
const ENV_SIDE: &str = "SRP_NSFO_SIDE";
/// Set in the initiator process: path A's `srptd` control socket.
const ENV_SOCK_A: &str = "SRP_NSFO_SOCK_A";
/// The hold of a write in doubt, in ms (`srp_initiator::fence`; its
/// default when unset).
const ENV_HOLD_MS: &str = "SRP_NSFO_HOLD_MS";

/// Path `k` (1 or 2): veths `srp<k>t`/`srp<k>i`, 10.201.<k>.1 (target)
/// and .2 (initiator).
fn link(k: u8) -> Link {
    Link {
        target_dev: format!("srp{k}t"),
        initiator_dev: format!("srp{k}i"),
        target_ip: IpAddr::from([10, 201, k, 1]),
        initiator_ip: IpAddr::from([10, 201, k, 2]),
    }
}

/// Sets up the namespaces and the targets, runs the initiator half in the
/// initiator namespace, and checks what it printed.
fn failover_over_a_veth(side: &str) {
    let out = in_namespaces(side, "initiator_in_namespace", &[]);
    assert!(
        out.iter().any(|l| l.starts_with("failover: ")),
        "no failover figures"
    );
}

/// Makes the namespaces (named after `tag`) and both targets (with `env`),
/// runs the ignored test `inner` as the initiator in the initiator
/// namespace (with `env` too, and the target namespace's name, `tag` and
/// path A's control socket), and returns what it printed once it passed.
fn in_namespaces(tag: &str, inner: &str, env: &[(&str, &str)]) -> Vec<String> {
    if !rdma_testkit::need::netns() {
        return Vec::new();
    }
    let ns = match Netns::create(&base_name("srp-nsfo", tag), &[link(1), link(2)]) {
        Ok(ns) => ns,
        Err(e) => {
            rdma_testkit::need::WHOLE.skip(&format!("network namespaces: {e}"), "run as root");
            return Vec::new();
        }
    };
    let (t_a, sock_a) = ns.srptd(0, env);
    let _targets = [t_a, ns.srptd(1, env).0];
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.initiator()])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            inner,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_TARGET_NS, ns.target())
        .env(ENV_SIDE, tag)
        .env(ENV_SOCK_A, &sock_a)
        .envs(env.iter().copied());
    let ini = Proc::start("initiator", &mut cmd);
    let out = ini.rest(90);
    println!("{}", out.join("\n"));
    let mut ini = ini;
    let status = ini.child.wait().unwrap();
    assert!(status.success(), "the initiator failed: {status}");
    // The initiator's test harness ran the one test and it passed (a
    // filter that matched nothing would also exit 0).
    assert!(
        out.iter().any(|l| l.contains("1 passed")),
        "the initiator test did not run"
    );
    out
}

#[test]
fn veth_down_at_the_target_end_fails_over_without_errors() {
    failover_over_a_veth("far");
}

#[test]
fn veth_down_at_the_initiator_end_fails_over_without_errors() {
    failover_over_a_veth("near");
}

/// Issue 33's lost write, made to happen: with link following off
/// everywhere (so path A's port stays ACTIVE and the target's channel
/// alive), the far end of path A goes down, then a write W1 goes to A.
/// Its SEND and every retransmission wait in the initiator namespace's
/// neighbour queue (the entry is INCOMPLETE); the QP runs out of retries,
/// W1 is in doubt and completes over path B, the link comes back, and the
/// kernel sends what it held: path A's target runs W1 late. The writer
/// rewrites the block (W2) as soon as W1 completes. With the hold the old
/// copy lands before W1 completes, and the block keeps W2; with a hold of
/// 0 the old copy lands over W2 (checked too, so the scenario is known to
/// reproduce the loss).
fn stale_copy_of_a_write_in_doubt(tag: &str, hold_ms: Option<&str>) -> Option<Vec<String>> {
    // For the two srptd (the initiator half turns following off itself).
    let mut env = vec![("SOFTROCE_FOLLOW_LINK", "0")];
    if let Some(h) = hold_ms {
        env.push((ENV_HOLD_MS, h));
    }
    let out = in_namespaces(tag, "stale_initiator_in_namespace", &env);
    (!out.is_empty()).then_some(out)
}

#[test]
fn an_old_copy_of_a_write_in_doubt_lands_before_its_completion() {
    if let Some(out) = stale_copy_of_a_write_in_doubt("stale", None) {
        assert!(
            out.iter()
                .any(|l| l.starts_with("block after the rewrite: W2")),
            "{}",
            out.join("\n")
        );
    }
}

#[test]
fn without_the_hold_the_old_copy_lands_over_the_rewrite() {
    if let Some(out) = stale_copy_of_a_write_in_doubt("stale0", Some("0")) {
        assert!(
            out.iter()
                .any(|l| l.starts_with("block after the rewrite: W1")),
            "{}",
            out.join("\n")
        );
    }
}

/// The initiator half of the stale-copy tests (run by them in the
/// initiator namespace they make): prints which write the block holds at
/// the end, and the timings.
#[test]
#[ignore = "run by the netns tests inside the initiator namespace they make"]
fn stale_initiator_in_namespace() {
    use blockload::BlockDevice;
    let target_ns = std::env::var(ENV_TARGET_NS).expect("run by stale_copy_of_a_write_in_doubt");
    let sock_a = std::path::PathBuf::from(std::env::var(ENV_SOCK_A).expect("path A's socket"));
    let hold = std::env::var(ENV_HOLD_MS)
        .ok()
        .map(|v| Duration::from_millis(v.parse().expect("hold in ms")));
    let ips = [link(1).initiator_ip, link(2).initiator_ip];
    let cas = rnic::softroce::SoftCa::at_each(&ips);
    // Link following off here too: path A's port stays ACTIVE.
    let provider = rnic::softroce::SoftRoce::with_options(
        cas.clone(),
        rnic::softroce::ROCE_PORT,
        rdma_types::Mtu::from_bytes(1024).unwrap(),
        rnic::softroce::NicOptions {
            follow_link: false,
            ..Default::default()
        },
    );
    // Path A does not log in again: a new login would end its old
    // channel at the target, and with it the late command.
    let (a, b) = (
        path(&provider, &cas[0], 1, None),
        path(&provider, &cas[1], 2, Some(Duration::from_millis(250))),
    );
    let mut m = Multipath::new(
        vec![
            ("A".into(), a.clone() as Arc<dyn PathDevice>),
            ("B".into(), b.clone() as Arc<dyn PathDevice>),
        ],
        Policy::Failover,
        Duration::from_secs(60),
    )
    .expect("both paths reach the same LU");
    if let Some(h) = hold {
        m = m.with_in_doubt_hold(h);
    }
    let m = Arc::new(m);
    const LBA: u64 = 100;
    let block = |tag: u8| [tag; 512];
    m.write_at(LBA, &block(0)).expect("W0 over path A");
    let before = sessions(&sock_a);
    assert_eq!(
        before.len(),
        1,
        "path A's target has one session: {before:?}"
    );

    // The far end of A goes down; nothing on our side notices.
    let vt = link(1).target_dev;
    let cut = Instant::now();
    ip(&["-n", &target_ns, "link", "set", &vt, "down"]).unwrap();
    // The kernel drops its neighbour entry for A's target once it sees
    // the carrier go (up to 1 s later): from then on what we send there
    // waits in the new, unresolved entry instead of being dropped.
    let target_a = link(1).target_ip.to_string();
    let dev_a = link(1).initiator_dev;
    wait_for("the neighbour entry of A's target dropped", 10, || {
        let out = Command::new("ip")
            .args(["neigh", "show", &target_a, "dev", &dev_a])
            .output()
            .expect("ip neigh");
        !String::from_utf8_lossy(&out.stdout).contains("lladdr")
    });
    let writer = {
        let m = m.clone();
        std::thread::spawn(move || {
            m.write_at(LBA, &block(1))
                .expect("W1 completes over path B");
            let w1_done = Instant::now();
            // The caller saw W1 complete: it writes the block again.
            m.write_at(LBA, &block(2)).expect("W2");
            w1_done
        })
    };
    // W1 failed on A (in doubt) and was sent again on B, which did it.
    wait_for("W1 again over path B", 20, || b.done_since(cut).0 >= 1);
    let on_b = Instant::now();
    // Without a hold W1 completes at once and the writer's W2 follows:
    // the link comes back only after W2 is done, so the old copy lands
    // after the rewrite whatever the scheduler does (under load W2 could
    // otherwise run after it). With the hold W1 cannot complete until
    // the old copy has landed, so the link comes back at once.
    let mut writer = Some(writer);
    let early = match hold {
        Some(h) if h.is_zero() => writer.take().map(|w| w.join().unwrap()),
        _ => None,
    };
    ip(&["-n", &target_ns, "link", "set", &vt, "up"]).unwrap();
    let up = Instant::now();
    // The kernel resolves the neighbour again and sends what it held:
    // path A's old session takes in W1 (its SEND, retransmitted).
    let late = wait_for("W1's old copy reaching path A's target", 10, || {
        sessions(&sock_a)
            .iter()
            .any(|(conn, n)| before.iter().any(|(c, n0)| c == conn && n > n0))
    });
    let w1_done = match writer {
        Some(w) => w.join().unwrap(),
        None => early.expect("joined before the link came back"),
    };
    let mut buf = [0u8; 512];
    m.read_at(LBA, &mut buf).unwrap();
    let rel = |t: Instant| ms(t.saturating_duration_since(cut));
    println!(
        "link down; W1 done on B at +{}, link up at +{}, the old copy of W1 reached A at +{}, \
         W1 completed to the caller at +{} (hold {})",
        rel(on_b),
        rel(up),
        rel(late),
        rel(w1_done),
        hold.map_or("default".into(), ms)
    );
    let holds = match buf[0] {
        2 if buf == block(2) => "W2",
        1 if buf == block(1) => "W1",
        0 if buf == block(0) => "W0",
        _ => "something else",
    };
    println!("block after the rewrite: {holds}");
}

/// A path that notes when each of its I/Os completed or failed.
struct Timed {
    inner: Arc<RemoteDisk>,
    done: Mutex<Vec<Instant>>,
    failed: Mutex<Vec<Instant>>,
}

impl Timed {
    fn new(inner: Arc<RemoteDisk>) -> Timed {
        Timed {
            inner,
            done: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
        }
    }

    fn note<T>(&self, r: io::Result<T>) -> io::Result<T> {
        let now = Instant::now();
        let log = if r.is_ok() { &self.done } else { &self.failed };
        log.lock().unwrap().push(now);
        r
    }

    /// Completed I/Os at or after `t`, and the first of them.
    fn done_since(&self, t: Instant) -> (usize, Option<Instant>) {
        let d = self.done.lock().unwrap();
        let after: Vec<_> = d.iter().filter(|x| **x >= t).collect();
        (after.len(), after.first().map(|x| **x))
    }

    /// The first I/O that failed at or after `t`.
    fn first_failure_since(&self, t: Instant) -> Option<Instant> {
        self.failed
            .lock()
            .unwrap()
            .iter()
            .find(|x| **x >= t)
            .copied()
    }
}

impl blockload::BlockDevice for Timed {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.note(self.inner.read_at(lba, buf))
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.note(self.inner.write_at(lba, buf))
    }
    fn flush(&self) -> io::Result<()> {
        self.note(self.inner.flush())
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        self.note(self.inner.unmap(lba, blocks))
    }
}

impl PathDevice for Timed {
    fn device_id(&self) -> Option<String> {
        self.inner.device_id()
    }
    fn is_up(&self) -> bool {
        self.inner.is_up()
    }
    fn wait_up(&self, timeout: Duration) -> bool {
        self.inner.wait_up(timeout)
    }
    // The multipath device above settles a write in doubt, as it would
    // over the remote port itself.
    fn write_unsettled(&self, lba: u64, buf: &[u8]) -> (io::Result<()>, Doubt) {
        let (r, doubt) = self.inner.write_unsettled(lba, buf);
        (self.note(r), doubt)
    }
    fn unmap_unsettled(&self, lba: u64, blocks: u64) -> (io::Result<()>, Doubt) {
        let (r, doubt) = self.inner.unmap_unsettled(lba, blocks);
        (self.note(r), doubt)
    }
}

/// Path `k`: this namespace's address of link `k` logging in to the
/// `srptd` across it by RDMA CM, as `srp io --dest` does, kept by a remote
/// port that fails I/O at once (multipath sends it elsewhere) and tries to
/// reconnect every `reconnect` (250 ms in the failover tests; `None`:
/// never).
fn path(
    provider: &Arc<rnic::softroce::SoftRoce>,
    ca: &rnic::softroce::SoftCa,
    k: u8,
    reconnect: Option<Duration>,
) -> Arc<Timed> {
    let agent = rdma_access::CmAgent::start(
        provider.clone(),
        ca.guid,
        (std::process::id() << 8) | k as u32,
    )
    .expect("CM agent");
    let connector = Arc::new(srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: ca.ip,
        dst: SocketAddr::new(link(k).target_ip, 5555),
        // A login over the dead link gives up soon, so the next attempt
        // after the link is back is not long in coming.
        timeout: Duration::from_secs(1),
    });
    let chan = srp::initiator::ChannelConfig::new(
        1,
        ca.guid,
        rnic::softroce::ip_guid(link(k).target_ip).0,
        rnic::softroce::ip_guid(link(k).target_ip),
    );
    let mut cfg = srp_initiator::session::SessionConfig::new(chan);
    if let Some(ms) = std::env::var("SRP_NSFO_CMD_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        cfg.channel.cmd_timeout = rdma_types::Duration::from_millis(ms);
    }
    // The liveness probe's interval (0: no probes), to compare.
    if let Some(ms) = std::env::var("SRP_NSFO_PROBE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        cfg.probe_interval = (ms > 0).then(|| rdma_types::Duration::from_millis(ms));
    }
    let sessions: Arc<dyn verbs::Provider> =
        rdma_access::resource::AccessLayer::new(provider.clone())
            .client("netns failover")
            .into_provider();
    let login = Arc::new(srp_initiator::path_login::PathLogin::new(
        format!("{} -> {}", ca.ip, link(k).target_ip),
        sessions,
        ca.guid,
        connector,
        cfg,
    ));
    let open = Box::new(move || {
        let mut ch = login.channels()?;
        Disk::open(ch.remove(0), 0)
    });
    let rport = RportConfig {
        reconnect_delay: reconnect.map(|d| rdma_types::Duration::from_micros(d.as_micros() as u64)),
        fast_io_fail_tmo: Some(rdma_types::Duration::ZERO),
        dev_loss_tmo: Some(rdma_types::Duration::from_secs(120)),
    };
    let d = RemoteDisk::open(open, rport).unwrap_or_else(|e| panic!("path {k} login: {e}"));
    Arc::new(Timed::new(Arc::new(d)))
}

/// The multipath device as the workload sees it, noting every I/O that
/// took longer than 100 ms (when it started, how long, read or write).
struct Slow {
    inner: Arc<Multipath>,
    slow: Mutex<Vec<(Instant, Duration, &'static str)>>,
}

impl Slow {
    fn note<T>(&self, start: Instant, what: &'static str, r: io::Result<T>) -> io::Result<T> {
        let took = start.elapsed();
        if took > Duration::from_millis(100) {
            self.slow.lock().unwrap().push((start, took, what));
        }
        r
    }
}

impl blockload::BlockDevice for Slow {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        let t = Instant::now();
        self.note(t, "read", self.inner.read_at(lba, buf))
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let t = Instant::now();
        self.note(t, "write", self.inner.write_at(lba, buf))
    }
    fn flush(&self) -> io::Result<()> {
        let t = Instant::now();
        self.note(t, "flush", self.inner.flush())
    }
}

/// A verified random read/write over the first 4 MiB of `dev` for
/// `runtime`, on its own thread.
fn workload(
    dev: Arc<dyn blockload::BlockDevice>,
    runtime: Duration,
) -> std::thread::JoinHandle<blockload::Report> {
    std::thread::spawn(move || {
        let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
        w.jobs = 4;
        w.iodepth = 4;
        w.verify = true;
        w.region = Some(4 << 20);
        w.size = Some(1 << 40);
        w.runtime = runtime;
        blockload::run(dev, &w, |_| {}).unwrap()
    })
}

/// Waits (bounded by `secs`) until `cond` holds; the time it first held.
fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) -> Instant {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return Instant::now();
        }
        assert!(Instant::now() < end, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The initiator half, run by the tests above inside the initiator
/// namespace (and only there: it needs the namespaces they make).
#[test]
#[ignore = "run by the netns tests inside the initiator namespace they make"]
fn initiator_in_namespace() {
    let target_ns = std::env::var(ENV_TARGET_NS).expect("run by failover_over_a_veth");
    let side = std::env::var(ENV_SIDE).expect("run by failover_over_a_veth");
    let ips = [link(1).initiator_ip, link(2).initiator_ip];
    let cas = rnic::softroce::SoftCa::at_each(&ips);
    // 1024-byte packets fit the 1500-byte veth links.
    let provider = rnic::softroce::SoftRoce::with_mtu(
        cas.clone(),
        rnic::softroce::ROCE_PORT,
        rdma_types::Mtu::from_bytes(1024).unwrap(),
    );
    let every = Some(Duration::from_millis(250));
    let (a, b) = (
        path(&provider, &cas[0], 1, every),
        path(&provider, &cas[1], 2, every),
    );
    let m = Arc::new(
        Multipath::new(
            vec![
                ("A".into(), a.clone() as Arc<dyn PathDevice>),
                ("B".into(), b.clone() as Arc<dyn PathDevice>),
            ],
            Policy::Failover,
            Duration::from_secs(60),
        )
        .expect("both paths reach the same LU"),
    );
    let start = Instant::now();
    let seen = Arc::new(Slow {
        inner: m.clone(),
        slow: Mutex::new(Vec::new()),
    });
    let run = workload(seen.clone(), Duration::from_secs(4));

    // Path A carries the I/O (failover policy), then its link goes down.
    wait_for("I/O on path A", 20, || a.done_since(start).0 >= 200);
    let (vt, vi) = (link(1).target_dev, link(1).initiator_dev);
    let cut_args: Vec<&str> = match side.as_str() {
        "far" => vec!["-n", &target_ns, "link", "set", &vt, "down"],
        _ => vec!["link", "set", &vi, "down"],
    };
    // Checked before the cut: at the initiator end the link watcher sees it
    // at once, and an I/O can complete on B before `ip` has even returned.
    assert_eq!(b.done_since(start).0, 0, "path B idle while A is up");
    let cut = Instant::now();
    ip(&cut_args).unwrap();
    let cut_ran = cut.elapsed();
    wait_for("I/O completed on path B", 10, || b.done_since(cut).0 >= 1);
    // Some I/O on B, so the workload clearly goes on without A.
    wait_for("more I/O on path B", 10, || b.done_since(cut).0 >= 100);
    let detected = a.first_failure_since(cut);
    let first_b = b.done_since(cut).1.expect("an I/O on B");

    // The link comes back: A logs in again.
    let up_args: Vec<&str> = match side.as_str() {
        "far" => vec!["-n", &target_ns, "link", "set", &vt, "up"],
        _ => vec!["link", "set", &vi, "up"],
    };
    let up = Instant::now();
    ip(&up_args).unwrap();
    let back = wait_for("path A up again", 20, || a.is_up());
    let r = run.join().unwrap();
    let end = Instant::now();
    let (a_after, first_a) = a.done_since(up);

    // A further verified run: path A, the first path, carries it again.
    let (a_before, b_before) = (a.done_since(start).0, b.done_since(start).0);
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.jobs = 4;
    w.verify = true;
    w.region = Some(4 << 20);
    w.size = Some(1 << 20);
    let again = blockload::run(m.clone(), &w, |_| {}).unwrap();

    let failed_over: Vec<_> = m
        .failovers()
        .into_iter()
        .filter(|f| f.failed_at >= cut)
        .collect();
    println!("{}", r.table());
    let rel = |t: Instant| {
        if t >= cut {
            format!("+{}", ms(t - cut))
        } else {
            format!("-{}", ms(cut - t))
        }
    };
    // The I/Os the cut held up: how many, and the longest of them.
    let slow = seen.slow.lock().unwrap().clone();
    if let Some((t, took, what)) = slow.iter().max_by_key(|s| s.1) {
        println!(
            "{} I/Os took over 100 ms; the longest, a {what} started {} from link down, took {}",
            slow.len(),
            rel(*t),
            ms(*took)
        );
    }
    println!(
        "link down ({side} end of path A, `ip {}` took {}): first I/O failed on A after {}, first I/O completed on B after {}; {} I/Os failed over",
        cut_args.join(" "),
        ms(cut_ran),
        detected.map(|d| ms(d - cut)).unwrap_or_else(|| "(none failed)".into()),
        ms(first_b - cut),
        failed_over.len()
    );
    println!(
        "failover: {} from link down to the first I/O completed on the other path",
        ms(first_b - cut)
    );
    // Every I/O running at the cut took at least until then.
    let longest = slow
        .iter()
        .filter(|s| s.0 + s.1 >= cut)
        .map(|s| s.1)
        .max()
        .unwrap_or_default();
    println!(
        "max I/O latency across the cut: {} ({} I/Os over 100 ms)",
        ms(longest),
        slow.len()
    );
    println!(
        "link up: path A logged in again after {}; {a_after} I/Os on A after that{} (workload ended {} after link up)",
        ms(back - up),
        first_a
            .map(|t| format!(", the first after {}", ms(t - up)))
            .unwrap_or_default(),
        ms(end.saturating_duration_since(up))
    );
    println!(
        "a further run after the link came back: {} I/Os on path A, {} on path B ({}); path A {:?}, path B {:?}",
        a.done_since(start).0 - a_before,
        b.done_since(start).0 - b_before,
        again.table().lines().last().unwrap_or(""),
        a.inner.stats(),
        b.inner.stats()
    );
    assert!(r.ok(), "{}", r.table());
    assert!(r.verified_bytes >= 1 << 20, "{}", r.table());
    assert!(detected.is_some(), "no I/O was in flight on A at the cut");
    assert!(!failed_over.is_empty(), "no I/O failed over");
    // A bound against a hang, not the goal (the figure is printed above).
    assert!(first_b - cut < Duration::from_secs(10));
    assert!(a.inner.stats().reconnects >= 1, "{:?}", a.inner.stats());
    // Attempts are refused while the port is down, so the first one after
    // the link is back logs in (within 250 ms, plus the login). The bound
    // guards against what this replaced, a login sent into the dead link
    // that waited for the CM's REQ retry (about 4.4 s), with room for a
    // busy machine (about 1.1 s seen under load on both cores).
    assert!(
        back - up < Duration::from_secs(4),
        "path A logged in again {} after link up",
        ms(back - up)
    );
    assert!(again.ok(), "{}", again.table());
    assert_eq!(
        b.done_since(start).0,
        b_before,
        "the run after the link came back went to B, not A"
    );
}
