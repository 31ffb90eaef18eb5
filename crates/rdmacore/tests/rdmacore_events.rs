//! Port and device events of a real device, caused through the kernel:
//! its network interface down and up (PortDown, PortActive; while it is
//! down, `find_port` refuses the port naming the interface to bring up),
//! a path MTU above the port's and an inline size above the device's
//! refused naming both values, then the device deleted under open
//! objects, which the consumer then destroys without a failure.
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

use rdma_types::{AccessFlags, Guid, Mtu, PortNum, Psn, QpState, Qpn};
use rdmacore::{DeviceLookupError, DeviceSpec, RdmaCore};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::conformance::{Ev, Recorder};
use verbs::{
    AhAttr, AsyncEvent, AsyncEventKind, CqInit, PortState, Provider, QpAttr, QpInit, ResourceKind,
    VerbsError,
};

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
    let spec: DeviceSpec = dev.parse().unwrap();
    match p.find_port(&spec) {
        Err(DeviceLookupError::PortNotActive(d)) => {
            eprintln!("find_port {dev} while {netdev} is down: {d}");
            assert_eq!(d.netdev.as_deref(), Some(netdev), "{d}");
            assert_eq!((d.port, d.state), (1, "DOWN"), "{d}");
            assert!(
                d.to_string().contains(&format!("ip link set {netdev} up")),
                "{d}"
            );
        }
        r => panic!("find_port {dev} with {netdev} down: {r:?}"),
    }
    run("ip", &["link", "set", "dev", netdev, "up"]);
    assert!(
        rec.wait_for(port_event(AsyncEventKind::PortActive)),
        "{:?}",
        rec.events()
    );
    assert_eq!(p.find_port(&spec), Ok(guid));
    let two: DeviceSpec = format!("{dev}:2").parse().unwrap();
    let e = p.find_port(&two).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceLookupError::NoSuchPort {
                port: 2,
                ports: 1,
                ..
            }
        ),
        "{e}"
    );

    // Objects open when the device goes.
    let pd = p.alloc_pd(ca, 1).unwrap();
    let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 2).unwrap();
    let qp = p.create_qp(pd, &QpInit::rc(cq, 4, 4), 3).unwrap();
    refusals_name_the_limits(&p, ca, pd, qp, cq, netdev);
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
        (ResourceKind::Qp, 4),
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

/// A path MTU above the port's active MTU, and an inline size above the
/// device's, are refused naming both values; the limits themselves are
/// taken. `qp` (RC, in RESET) ends in RTR on itself.
fn refusals_name_the_limits(
    p: &RdmaCore,
    ca: verbs::CaHandle,
    pd: verbs::PdHandle,
    qp: verbs::QpHandle,
    cq: verbs::CqHandle,
    netdev: &str,
) {
    let port = p.query_port(ca, PortNum(1)).unwrap();
    let init = QpAttr {
        state: Some(QpState::Init),
        port: Some(PortNum(1)),
        pkey_index: Some(0),
        access: Some(AccessFlags::REMOTE_WRITE),
        ..Default::default()
    };
    p.modify_qp(qp, &init).unwrap();
    let rtr = |mtu| QpAttr {
        state: Some(QpState::Rtr),
        av: Some(AhAttr::roce(port.gids[0])),
        path_mtu: Some(mtu),
        dest_qpn: Some(p.qp_num(qp).unwrap()),
        rq_psn: Some(Psn::new(0)),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(1),
        ..Default::default()
    };
    assert!(port.active_mtu < Mtu::Mtu4096, "{netdev} has a jumbo MTU");
    match p.modify_qp(qp, &rtr(Mtu::Mtu4096)) {
        Err(VerbsError::InvalidArgument(m)) => {
            eprintln!("path MTU 4096 on {netdev}: {m}");
            let active = format!("active MTU {}", port.active_mtu.bytes());
            assert!(m.contains("path MTU 4096") && m.contains(&active), "{m}");
            assert!(m.contains(netdev), "{m}");
        }
        r => panic!("path MTU 4096 over a port of {:?}: {r:?}", port.active_mtu),
    }
    p.modify_qp(qp, &rtr(port.active_mtu)).unwrap();
    let _: Qpn = p.qp_num(qp).unwrap();

    let max = p.query_ca(ca).unwrap().max_inline_data;
    eprintln!("max_inline_data {max}");
    assert!(max > 0, "the device takes inline data (rxe does)");
    let mut ask = QpInit::rc(cq, 4, 4);
    ask.caps.max_inline = max;
    let q = p.create_qp(pd, &ask, 4).unwrap();
    p.destroy_qp(q).unwrap();
    ask.caps.max_inline = max + 1;
    match p.create_qp(pd, &ask, 5) {
        Err(VerbsError::InvalidArgument(m)) => {
            assert!(m.contains(&format!("takes at most {max}")), "{m}")
        }
        r => panic!("{} inline bytes: {r:?}", max + 1),
    }
}
