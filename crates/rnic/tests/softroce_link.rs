//! A soft RoCE port follows the link under its address (`softroce::link`),
//! as Linux rxe's follows its netdev: the test makes two network
//! namespaces of its own (`carrier-<pid>-<tag>-a` and `-b`) joined by a
//! veth pair, `cl0a` (10.201.73.1/24, in `a`) and `cl0b` (10.201.73.2/24,
//! in `b`), opens a CA on cl0a's address from a thread inside `a`, and
//! sets the veth ends down and up with `ip link`: the far end down (cl0a
//! loses carrier) and the near end down (cl0a itself is down) each raise
//! `PortDown` and leave the port DOWN; up again raises `PortActive`. The
//! time from `ip link` to the event is printed.
//!
//! The far end goes down twice, the second time less than a second after
//! the last change: the two ends have the same ifindex, each in its own
//! namespace, so the kernel's link watcher holds that carrier news back
//! until a second after its last run (as for a physical NIC), and only the
//! watcher's own look at the interface flags sees it sooner.
//!
//! Without root or network namespaces the tests are skipped, or fail under
//! `CI=true` (`rdma_testkit::need`). The namespaces are deleted on every way out (a drop guard).

use rdma_testkit::netns::{cannot_run, ip};
use rdma_types::{Guid, PortNum};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::IpAddr;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::{AsyncEvent, AsyncEventKind, Context, EventHandler, PortState, Provider};

const GUID: Guid = Guid(0x0073_0001);

/// The test's namespaces, deleted on drop (the veth pair goes with them).
struct Netns(String);

impl Netns {
    /// Namespaces `a` and `b` with the veth pair cl0a/cl0b between them,
    /// addressed and up (`up`: false leaves cl0b down, so cl0a has no
    /// carrier).
    fn create(tag: &str, up: bool) -> Result<Netns, String> {
        if let Some(why) = cannot_run() {
            return Err(why);
        }
        let ns = Netns(format!("carrier-{}-{tag}", std::process::id()));
        for side in ["a", "b"] {
            let name = ns.name(side);
            // A leftover of a crashed run with the same pid would block us.
            let _ = ip(&["netns", "del", &name]);
            ip(&["netns", "add", &name])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
        }
        let (a, b) = (ns.name("a"), ns.name("b"));
        ip(&[
            "link", "add", "name", "cl0a", "netns", &a, "type", "veth", "peer", "name", "cl0b",
            "netns", &b,
        ])?;
        ip(&["-n", &a, "addr", "add", "10.201.73.1/24", "dev", "cl0a"])?;
        ip(&["-n", &b, "addr", "add", "10.201.73.2/24", "dev", "cl0b"])?;
        ip(&["-n", &a, "link", "set", "cl0a", "up"])?;
        if up {
            ip(&["-n", &b, "link", "set", "cl0b", "up"])?;
        }
        Ok(ns)
    }

    fn name(&self, side: &str) -> String {
        format!("{}-{side}", self.0)
    }

    /// Sets veth end `dev` (cl0a in `a`, cl0b in `b`) up or down.
    fn set(&self, dev: &str, up: bool) {
        let ns = self.name(if dev == "cl0a" { "a" } else { "b" });
        ip(&[
            "-n",
            &ns,
            "link",
            "set",
            dev,
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }

    /// Runs `f` on a thread that entered namespace `a` (threads it starts,
    /// the NIC's among them, are in it too); the caller's thread stays put.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = format!("/run/netns/{}", self.name("a"));
        std::thread::spawn(move || {
            let f_ns = std::fs::File::open(&path).expect("the namespace's file");
            use std::os::fd::AsRawFd;
            // SAFETY: setns with a namespace descriptor we hold open; it
            // changes only this thread's network namespace.
            let r = unsafe { libc::setns(f_ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for side in ["a", "b"] {
            if let Err(e) = ip(&["netns", "del", &self.name(side)]) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// Sends each async event's kind down a channel.
struct Events(Mutex<Sender<AsyncEventKind>>);

impl EventHandler for Events {
    fn on_completion(&self, _: Context) {}
    fn on_async_event(&self, e: AsyncEvent) {
        let _ = self.0.lock().unwrap().send(e.kind);
    }
}

/// Waits (at most 5 s) for event `kind`, failing on any other; returns
/// how long it took from `since`.
fn expect(rx: &Receiver<AsyncEventKind>, kind: AsyncEventKind, since: Instant) -> Duration {
    let end = since + Duration::from_secs(5);
    match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
        Ok(k) if k == kind => since.elapsed(),
        Ok(k) => panic!("expected {kind:?}, got {k:?}"),
        Err(e) => panic!("no {kind:?} within 5 s: {e}"),
    }
}

fn state(p: &SoftRoce, ca: verbs::CaHandle) -> PortState {
    p.query_port(ca, PortNum(1)).unwrap().state
}

/// A provider with one CA on cl0a's address, opened; its events arrive on
/// the receiver.
fn open() -> (Arc<SoftRoce>, verbs::CaHandle, Receiver<AsyncEventKind>) {
    let p = SoftRoce::new(
        vec![SoftCa {
            guid: GUID,
            ip: IpAddr::from([10, 201, 73, 1]),
        }],
        ROCE_PORT,
    );
    let (tx, rx) = channel();
    let ca = p
        .open_ca(GUID, 0, Arc::new(Events(Mutex::new(tx))))
        .unwrap();
    (p, ca, rx)
}

/// Makes the namespaces (`up` as for [`Netns::create`]) and runs `f`
/// inside `a` with the CA opened there (closed after); skipped (`need`)
/// instead when namespaces cannot be made.
fn in_namespace(
    tag: &str,
    up: bool,
    f: impl FnOnce(&Netns, &SoftRoce, verbs::CaHandle, &Receiver<AsyncEventKind>) + Send + 'static,
) {
    let ns = match Netns::create(tag, up) {
        Ok(ns) => Arc::new(ns),
        Err(e) => {
            rdma_testkit::need::WHOLE.skip(&format!("network namespaces: {e}"), "run as root");
            return;
        }
    };
    let n = ns.clone();
    ns.run(move || {
        let (p, ca, rx) = open();
        f(&n, &p, ca, &rx);
        p.close_ca(ca).unwrap();
    });
}

#[test]
fn port_goes_down_with_its_link_and_comes_back_with_it() {
    in_namespace("port", true, |n, p, ca, rx| {
        assert_eq!(state(p, ca), PortState::Active);
        for (end, dev) in [("far", "cl0b"), ("far", "cl0b"), ("near", "cl0a")] {
            let t = Instant::now();
            n.set(dev, false);
            let down = expect(rx, AsyncEventKind::PortDown, t);
            assert_eq!(state(p, ca), PortState::Down);
            let t = Instant::now();
            n.set(dev, true);
            let up = expect(rx, AsyncEventKind::PortActive, t);
            assert_eq!(state(p, ca), PortState::Active);
            println!(
                "{end} end ({dev}) down: PortDown after {:.1} ms; up: PortActive after {:.1} ms",
                down.as_secs_f64() * 1e3,
                up.as_secs_f64() * 1e3
            );
        }
    });
}

#[test]
fn a_port_opened_on_a_link_without_carrier_starts_down() {
    in_namespace("start", false, |n, p, ca, rx| {
        assert_eq!(state(p, ca), PortState::Down);
        let t = Instant::now();
        n.set("cl0b", true);
        expect(rx, AsyncEventKind::PortActive, t);
        assert_eq!(state(p, ca), PortState::Active);
    });
}
