//! A CA closed and opened again at once binds its address again, even when
//! the previous instance's NIC thread still holds its socket for a while:
//! a completion callback on that thread held the device when the consumer
//! closed it, so the last reference (and the socket) went only when the
//! callback returned (seen as a flaky `srp-initiator` test that opens three
//! sessions in a row on one soft RoCE CA: `cannot bind ...: Address already
//! in use`).
//!
//! Two CAs on 127.0.92.1 and .2, RoCEv2 on UDP port 47192.

mod common;

use common::Soft;
use rdma_types::WcStatus;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc;
use std::time::Duration;
use verbs::conformance::{rc_pair, Recorder};
use verbs::{Provider, SendOpcode, SendWr};

#[test]
fn reopen_waits_for_the_previous_instance_to_let_go_of_its_socket() {
    let ip = |k: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 92, k));
    let f = Soft::pair(ip(1), ip(2), 47192);
    let (a, qa, b, _qb) = rc_pair(&f);
    // The first completion callback on a's NIC thread (holding a's device)
    // says so, then waits until the CA is closed and lingers.
    let (entered_tx, entered) = mpsc::channel();
    let (closed, closed_rx) = mpsc::channel::<()>();
    let mut once = Some((entered_tx, closed_rx));
    *a.rec.hook.lock().unwrap() = Some(Box::new(move |_| {
        if let Some((entered, closed)) = once.take() {
            entered.send(()).unwrap();
            let _ = closed.recv_timeout(Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(300));
        }
    }));
    a.p.req_notify_cq(a.cq, false).unwrap();
    let mut w = SendWr::new(1, SendOpcode::RdmaWrite, vec![a.sge(0, 64)]);
    w.remote.addr = b.buf.addr();
    w.remote.rkey = b.mr.rkey;
    a.p.post_send(qa, &[w]).unwrap();
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let p = a.p.clone();
    p.destroy_qp(qa).unwrap();
    p.dereg_mr(a.mr.handle).unwrap();
    p.destroy_cq(a.cq).unwrap();
    p.dealloc_pd(a.pd).unwrap();
    p.close_ca(a.ca).unwrap();
    closed.send(()).unwrap();
    // The callback still holds the old device (and its socket) here.
    let rec = std::sync::Arc::new(Recorder::default());
    let ca = p
        .open_ca(f.provider.list_cas()[0], 1, rec)
        .expect("a reopen waits for the closed instance's socket");
    p.close_ca(ca).unwrap();
}
