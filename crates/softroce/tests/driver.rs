//! Nodes on their own threads: consumers post from another thread, block
//! for completions, get callbacks, and an idle NIC sleeps.

use rdma_types::{Lkey, Qpn, Rkey, WcStatus};
use roce::{QpConfig, SendOp, SendWqe, Sge};
use softroce::{Driver, FlatMemory, Node, NodeConfig, QpHandle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn driver_pair(cb_count: Arc<AtomicU64>) -> (Driver, Driver, QpHandle, FlatMemory, FlatMemory) {
    let mut a = Node::bind(NodeConfig::new("127.0.70.1:0".parse().unwrap())).unwrap();
    let mut b = Node::bind(NodeConfig::new("127.0.70.2:0".parse().unwrap())).unwrap();
    let (ma, mb) = (FlatMemory::new(1, 1 << 20), FlatMemory::new(1, 1 << 20));
    ma.with(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 253) as u8)
    });
    let cfg = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
    let qa = a.create_qp(cfg.clone(), Box::new(ma.clone()));
    let qb = b.create_qp(cfg, Box::new(mb.clone()));
    a.qp_mut(qa).unwrap().update_config(|c| c.dest_qpn = qb.0);
    b.qp_mut(qb).unwrap().update_config(|c| c.dest_qpn = qa.0);
    a.set_remote(qa, b.local_addr());
    b.set_remote(qb, a.local_addr());
    a.qp_mut(qa).unwrap().set_rts();
    b.qp_mut(qb).unwrap().set_rts();
    let cb: softroce::CompletionCallback = Box::new(move |_qp| {
        cb_count.fetch_add(1, Ordering::Relaxed);
    });
    (
        Driver::start(a, Some(cb)).unwrap(),
        Driver::start(b, None).unwrap(),
        qa,
        ma,
        mb,
    )
}

#[test]
fn post_from_another_thread_and_block_for_completions() {
    let callbacks = Arc::new(AtomicU64::new(0));
    let (da, _db, qa, ma, mb) = driver_pair(callbacks.clone());
    for i in 0..100u64 {
        let off = i * 8192;
        da.with_node(|n| {
            n.qp_mut(qa).unwrap().post_send(SendWqe::new(
                i,
                SendOp::Write {
                    raddr: off,
                    rkey: Rkey(1),
                },
                vec![Sge {
                    addr: off,
                    len: 8192,
                    lkey: Lkey(1),
                }],
            ))
        });
    }
    for i in 0..100u64 {
        let c = da
            .wait_completion(qa, Duration::from_secs(10))
            .expect("completion within 10 s");
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
    }
    assert_eq!(
        mb.with(|m| m[..800 * 1024].to_vec()),
        ma.with(|m| m[..800 * 1024].to_vec())
    );
    assert!(
        callbacks.load(Ordering::Relaxed) >= 1,
        "the CQ callback ran"
    );
    // Nothing more is coming: waiting times out instead of hanging.
    assert!(da.wait_completion(qa, Duration::from_millis(50)).is_none());
}

#[test]
fn an_idle_driver_sleeps_in_the_kernel() {
    let (da, db, _qa, _ma, _mb) = driver_pair(Arc::new(AtomicU64::new(0)));
    let (a0, b0) = (da.loops(), db.loops());
    // An observation window, not synchronisation: count wake-ups while idle.
    std::thread::sleep(Duration::from_millis(500));
    let (a1, b1) = (da.loops() - a0, db.loops() - b0);
    // 100 ms idle sleeps: about 5 wake-ups each; a spinning loop would make millions.
    assert!(a1 <= 20 && b1 <= 20, "idle wake-ups: {a1} and {b1}");
}
