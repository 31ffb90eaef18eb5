//! Port and device events of a real device, caused through the kernel:
//! its network interface down and up (PortDown, PortActive), then the
//! device deleted under open objects, which the consumer then destroys
//! without a failure.
//!
//! Deletion: a driver that can disassociate its user contexts (mlx5,
//! mlx4, ...) lets the kernel go on at once and raise DEVICE_FATAL,
//! `CaRemoval` here. rxe cannot (no `disassociate_ucontext`): the kernel
//! raises nothing and `rdma link delete` waits until every process has
//! closed the device. The test checks whichever the driver does: the
//! event (when not rxe), and in both cases that the delete completes once
//! the owner has destroyed its objects and closed the CA.
//!
//! It takes an interface down and deletes a device, so it runs only where
//! it is told which: `RDMACORE_TEST_EVENTS=DEVICE:NETDEV` (`rxe2:vb`, set
//! by the interop scenario `rdmacore-conformance-ours` in its VM, as
//! root, with `ip` and `rdma` from iproute2). Elsewhere it is skipped with
//! the reason.

mod common;

use rdma_types::{Guid, PortNum};
use rdmacore::RdmaCore;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::conformance::{Ev, Recorder};
use verbs::{AsyncEvent, AsyncEventKind, CqInit, PortState, Provider, QpInit, ResourceKind};

/// How long a driver that disassociates has to raise `CaRemoval`.
const REMOVAL_WAIT: Duration = Duration::from_secs(10);

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(st.success(), "{cmd} {args:?}: {st}");
}

fn port_event(kind: AsyncEventKind) -> impl Fn(&Ev) -> bool {
    move |e| matches!(e, Ev::Async(AsyncEvent { kind: k, ctx: 0, port: Some(PortNum(1)) }) if *k == kind)
}

#[test]
fn link_down_up_and_device_removal_reach_the_owner() {
    let spec = std::env::var("RDMACORE_TEST_EVENTS").unwrap_or_default();
    let Some((dev, netdev)) = spec.split_once(':') else {
        common::not_here(
            "a device and interface it may take down (RDMACORE_TEST_EVENTS=DEVICE:NETDEV)",
            "not given",
        );
        return;
    };
    let p = RdmaCore::new().unwrap();
    let guid: Guid = p.guid_of(dev).unwrap();
    let rec = Arc::new(Recorder::default());
    let ca = p.open_ca(guid, 7, rec.clone()).unwrap();
    assert_eq!(
        p.query_port(ca, PortNum(1)).unwrap().state,
        PortState::Active
    );

    run("ip", &["link", "set", "dev", netdev, "down"]);
    assert!(
        rec.wait_for(port_event(AsyncEventKind::PortDown)),
        "{:?}",
        rec.events()
    );
    assert_eq!(p.query_port(ca, PortNum(1)).unwrap().state, PortState::Down);
    run("ip", &["link", "set", "dev", netdev, "up"]);
    assert!(
        rec.wait_for(port_event(AsyncEventKind::PortActive)),
        "{:?}",
        rec.events()
    );

    // Objects open when the device goes.
    let pd = p.alloc_pd(ca, 1).unwrap();
    let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 2).unwrap();
    let qp = p.create_qp(pd, &QpInit::rc(cq, 4, 4), 3).unwrap();
    // In the background: on rxe it returns only once the CA is closed.
    let mut delete = Command::new("rdma")
        .args(["link", "delete", dev])
        .spawn()
        .expect("run rdma link delete");
    let removal = Ev::Async(AsyncEvent {
        kind: AsyncEventKind::CaRemoval,
        ctx: 7,
        port: None,
    });
    let deadline = Instant::now() + REMOVAL_WAIT;
    while Instant::now() < deadline && !rec.events().contains(&removal) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let removed = rec.events().contains(&removal);
    eprintln!(
        "{dev}: CaRemoval {}",
        if removed { "raised" } else { "not raised" }
    );
    if dev.starts_with("rxe") {
        assert!(!removed, "rxe raised DEVICE_FATAL: update the docs above");
    } else {
        assert!(
            removed,
            "no CaRemoval within {REMOVAL_WAIT:?}: {:?}",
            rec.events()
        );
    }
    // The owner cleans up as after any removal: every destroy succeeds.
    p.destroy_qp(qp).unwrap();
    p.destroy_cq(cq).unwrap();
    p.dealloc_pd(pd).unwrap();
    p.close_ca(ca).unwrap();
    for (kind, ctx) in [
        (ResourceKind::Qp, 3),
        (ResourceKind::Cq, 2),
        (ResourceKind::Pd, 1),
        (ResourceKind::Ca, 7),
    ] {
        assert!(rec.wait_for(|e| *e == Ev::Destroyed(kind, ctx)), "{kind:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = delete.try_wait().expect("wait for rdma") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "rdma link delete {dev} still waits after the CA closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "rdma link delete {dev}: {status}");
    assert!(p.open_ca(guid, 0, rec.clone()).is_err());
    assert!(!p.list_cas().contains(&guid));
}
