//! `srp io` over two links, one of them cut with `ip link`: the soft RoCE
//! port under the cut link goes DOWN at once (`softroce::link` follows the
//! interface's carrier, as Linux rxe follows its netdev), the session on
//! it fails on the port error, and multipath moves the I/O to the other
//! path; the transport's retries need not run out first.
//!
//! The test makes two network namespaces of its own,
//! `carrier-<pid>-<tag>-t` (target) and `-i` (initiator; the prefix is
//! `$SRPSTACK_TEST_NETNS` when set), joined by two
//! veth pairs (10.201.81.0/24 and 10.201.82.0/24, which exist only inside
//! them). Two `srptd` run in the target namespace, one per address,
//! exporting the same fileio image under the same device name (one LU, one
//! NAA, behind both); `srp io` runs in the initiator namespace with both
//! (`--dest` twice, one `--ip` each; failover policy: path A carries the
//! I/O while it is up) doing a verified random read/write workload.
//!
//! Once path A has carried some hundreds of commands, one veth end of path
//! A is set down: the initiator's own (`near`) or the target's (`far`: the
//! initiator's end loses carrier). The time from the cut to the first
//! command the path B daemon receives afterwards is the failover time
//! (read from its control socket every 2 ms, so at most that late); it is
//! printed, and asserted only against a hang (this is measured on a loaded
//! machine). The link comes back up: the time from then to path A logged
//! in again (a session path A's daemon did not have at the cut, seen on
//! its control socket every 2 ms) is printed and, with link following,
//! asserted loosely (under 2 s): the port's `PortActive` starts the login
//! at once, and no login went into the port while it was DOWN (it used to
//! take about 4.3 s, the CM's REQ retry). `srp io` must end with no I/O
//! error and no bad data.
//!
//! The `timeouts_only` tests run the same cuts with `SOFTROCE_FOLLOW_LINK=0`
//! for every process: the dead path is then found only by the transport's
//! retries, the figure to compare; nothing says the link is back either,
//! so a login sent into the outage waits for the CM's next REQ (sent
//! again soon at first, then less often).
//!
//! Without root, `ip` or network namespaces the tests are skipped, or
//! fail under `CI=true` (`rdma_testkit::need`). The namespaces are deleted on every way
//! out (a drop guard), which also ends whatever still runs inside them.

mod common;

use common::netns::{base_name, commands, ms, sessions, Link, Netns};
use common::Proc;
use rdma_testkit::netns::ip;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// Path `k` (1 or 2): veths `cl<k>t`/`cl<k>i`, 10.201.8<k>.1 (target) and
/// .2 (initiator).
fn link(k: u8) -> Link {
    Link {
        target_dev: format!("cl{k}t"),
        initiator_dev: format!("cl{k}i"),
        target_ip: IpAddr::from([10, 201, 80 + k, 1]),
        initiator_ip: IpAddr::from([10, 201, 80 + k, 2]),
    }
}

/// Every `ms` milliseconds (bounded by `secs`), until `f` returns a value.
fn poll<T>(secs: u64, ms: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// What one cut measured.
struct Cut {
    /// From link down (the start of the `ip` command) to the first command
    /// on path B.
    failover: Duration,
    /// How long the `ip` command that took the link down ran: on a busy
    /// host (VMs and namespaces coming and going take the kernel's
    /// routing lock) it once took 5 s, all of it before the link went down
    /// or counted in `failover` as if it were ours.
    cut_ran: Duration,
    /// From link up to path A logged in again (a session its `srptd` did
    /// not have at the cut).
    relogin: Duration,
}

/// Runs the whole scenario: cut path A's `side` end with link following
/// `follow` ("1" on, "0" off), then bring it back; what it measured.
fn cut_under_srp_io(tag: &str, side: &str, follow: &str) -> Option<Cut> {
    if !rdma_testkit::need::netns() {
        return None;
    }
    let s = match Netns::create(&base_name("carrier", tag), &[link(1), link(2)]) {
        Ok(s) => s,
        Err(e) => {
            rdma_testkit::need::WHOLE.skip(&format!("network namespaces: {e}"), "run as root");
            return None;
        }
    };
    let env = [("SOFTROCE_FOLLOW_LINK", follow)];
    // With link following, reconnect attempts 30 s apart: only the port's
    // PortActive brings path A back soon, which the bound in `cut_within`
    // then tells apart from the next attempt. Without it, 1 s.
    let reconnect_delay = if follow == "1" { "30" } else { "1" };
    let (_a, sock_a) = s.srptd(0, &env);
    let (_b, sock_b) = s.srptd(1, &env);
    let (a, b) = (link(1), link(2));
    let io = Proc::start(
        "srp io",
        Command::new("ip")
            .args(["netns", "exec", s.initiator()])
            .arg(common::srp_bin())
            .args(["io", "--dest", &format!("{}:5555", a.target_ip)])
            .args(["--ip", &a.initiator_ip.to_string()])
            .args(["--dest", &format!("{}:5555", b.target_ip)])
            .args(["--ip", &b.initiator_ip.to_string()])
            // 1024-byte packets fit the 1500-byte veth links.
            .args(["--mtu", "1024", "--path-policy", "failover"])
            .args(["--reconnect-delay", reconnect_delay, "--region", "4194304"])
            // Enough to outlast the cut and path A's login after it.
            .args(["--size", "100663296"])
            .env("SOFTROCE_FOLLOW_LINK", follow)
            .env("NICD_MODE", "own"),
    );
    let first = io.wait_line("srp: logged in", 30);
    assert!(first.contains("(2 paths, 1 channel each)"), "{first}");

    // Path A carries the I/O (failover policy), then its link goes down.
    poll(30, 5, || (commands(&sock_a) >= 500).then_some(())).expect("path A carried no I/O");
    let before_b = commands(&sock_b);
    // A thread watches B from before the cut: the first command on B
    // after it, seen at most 2 ms late (later on a busy machine; the loop
    // is bounded in time).
    let watch = {
        let sock_b = sock_b.clone();
        std::thread::spawn(move || {
            poll(60, 2, || {
                let polled = Instant::now();
                (commands(&sock_b) > before_b).then_some(polled)
            })
        })
    };
    let far = side == "far";
    let down = s.set_link(0, far, false);
    let down: Vec<&str> = down.iter().map(String::as_str).collect();
    let cut = Instant::now();
    ip(&down).unwrap();
    let cut_ran = cut.elapsed();
    let moved = watch
        .join()
        .unwrap()
        .expect("no I/O on path B within 60 s")
        .saturating_duration_since(cut);
    // Path A's session from before the cut is dead, and its remote port
    // has begun reconnecting during the outage.
    let at_failover = sessions(&sock_a);
    let old_a: Vec<String> = at_failover.iter().map(|s| s.0.clone()).collect();
    // Commands path A's old sessions were seen to accept after the
    // failover: a command the initiator may have retried on path B already
    // (issue 33: a block once read back older than its last acknowledged
    // write). Printed, not asserted: it tells a late target from others.
    let mut late = 0u64;
    let mut late_seen: Option<Duration> = None;
    let up = s.set_link(0, far, true);
    let up: Vec<&str> = up.iter().map(String::as_str).collect();
    let back = Instant::now();
    ip(&up).unwrap();
    // Path A logs in again: a session its target did not have at the cut
    // (seen at most 2 ms late), and, the first path that is up, carries
    // the I/O again (if the workload lasts that long: noted, not
    // required).
    let mut io = io;
    let mut relogin = None;
    let a_back = poll(60, 2, || {
        let now = sessions(&sock_a);
        for (conn, n) in &now {
            if let Some((_, before)) = at_failover.iter().find(|(c, _)| c == conn) {
                if *n > *before && late_seen.is_none() {
                    late_seen = Some(cut.elapsed());
                }
                late = late.max(n.saturating_sub(*before));
            }
        }
        if relogin.is_none() && now.iter().any(|(conn, _)| !old_a.contains(conn)) {
            relogin = Some(back.elapsed());
        }
        if now
            .iter()
            .any(|(conn, n)| !old_a.contains(conn) && *n >= 100)
        {
            return Some(Some(back.elapsed()));
        }
        io.child.try_wait().unwrap().is_some().then_some(None)
    })
    .flatten();
    let rest = io.rest(240).join("\n");
    let follow = if follow == "0" { "off" } else { "on" };
    println!(
        "{first}\n{rest}\nlink following {follow}: `ip {}` ({side} end of path A, took {})",
        down.join(" "),
        ms(cut_ran),
    );
    println!(
        "link up: path A logged in again {}; carried I/O again {}",
        relogin.map_or("(not before the workload ended)".into(), |t| format!(
            "after {}",
            ms(t)
        )),
        a_back.map_or("(not before the workload ended)".into(), |t| format!(
            "after {}",
            ms(t)
        ))
    );
    println!(
        "failover: {} from link down to I/O on the other path ({side} end, link following {follow}); \
         path A's old session accepted {late} commands after it{}",
        ms(moved),
        late_seen.map_or(String::new(), |t| format!(
            " (first seen {} after link down)",
            ms(t)
        )),
    );
    common::report::verified_clean(&rest);
    assert!(io.child.wait().unwrap().success(), "{rest}");
    Some(Cut {
        failover: moved,
        cut_ran,
        relogin: relogin.expect("path A did not log in again before the workload ended"),
    })
}

/// Runs [`cut_under_srp_io`] and bounds what it measured: the failover
/// under `failover` and, where given, the login after the link is back
/// under `relogin`.
fn cut_within(tag: &str, side: &str, follow: &str, failover: Duration, relogin: Option<Duration>) {
    let Some(c) = cut_under_srp_io(tag, side, follow) else {
        return;
    };
    // The bound starts when `ip` has surely done its work: what the tool
    // itself took is not the initiator's.
    assert!(
        c.failover < failover + c.cut_ran,
        "failover took {} ({} of it in `ip` itself)",
        ms(c.failover),
        ms(c.cut_ran)
    );
    if let Some(relogin) = relogin {
        assert!(c.relogin < relogin, "login took {}", ms(c.relogin));
    }
}

#[test]
fn srp_io_fails_over_at_once_when_its_own_link_goes_down() {
    // Bounds against a hang, not the goals (the figures are printed). The
    // port's PortActive starts the login at once (it used to wait for the
    // CM's REQ retry, about 4.4 s); without it, the next attempt is 30 s
    // away: 10 s tells the two apart, with room for a busy machine.
    let s = Duration::from_secs;
    cut_within("near", "near", "1", s(5), Some(s(10)));
}

#[test]
fn srp_io_fails_over_at_once_when_the_far_end_of_its_link_goes_down() {
    let s = Duration::from_secs;
    cut_within("far", "far", "1", s(5), Some(s(10)));
}

#[test]
fn timeouts_only_with_link_following_off_far_end() {
    // Only the transport (or the command timeout) notices; bounded
    // against a hang. No port event says the link is back either: the
    // login waits for the CM's next REQ (printed, not asserted).
    cut_within("tmof", "far", "0", Duration::from_secs(60), None);
}

#[test]
fn timeouts_only_with_link_following_off_near_end() {
    cut_within("tmon", "near", "0", Duration::from_secs(60), None);
}
