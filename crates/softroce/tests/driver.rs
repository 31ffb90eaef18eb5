//! Nodes on their own threads: consumers post from another thread, block
//! for completions, get callbacks, and an idle NIC sleeps.

use rdma_types::{Lkey, Qpn, Rkey, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use softroce::{Driver, FlatMemory, Node, NodeConfig, QpHandle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Nodes at `a` and `b` (port 0) with an RC QP each, connected, over
/// `ma` and `mb`, made with `cfg` (its QP numbers are the nodes' to pick).
fn rc_pair(
    a: &str,
    b: &str,
    cfg: QpConfig,
    ma: FlatMemory,
    mb: FlatMemory,
) -> (Node, Node, QpHandle, QpHandle) {
    let mut na = Node::bind(NodeConfig::new(format!("{a}:0").parse().unwrap())).unwrap();
    let mut nb = Node::bind(NodeConfig::new(format!("{b}:0").parse().unwrap())).unwrap();
    let qa = na.create_qp(cfg.clone(), Box::new(ma));
    let qb = nb.create_qp(cfg, Box::new(mb));
    Node::connect_pair(&mut na, qa, &mut nb, qb);
    (na, nb, qa, qb)
}

/// The default RC configuration.
fn rc() -> QpConfig {
    QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0))
}

fn driver_pair(cb_count: Arc<AtomicU64>) -> (Driver, Driver, QpHandle, FlatMemory, FlatMemory) {
    let (ma, mb) = (FlatMemory::new(1, 1 << 20), FlatMemory::new(1, 1 << 20));
    ma.with(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 253) as u8)
    });
    let (a, b, qa, _) = rc_pair("127.0.70.1", "127.0.70.2", rc(), ma.clone(), mb.clone());
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

/// A completion callback that posts the next operation does so on the
/// driver thread: the thread must send it before it sleeps (without a
/// waker write to itself). A post that waited for the idle sleep would
/// wait for nothing else: nothing is in flight, so no datagram and no
/// timer ends that sleep (5 s). 40 chained WRITEs take milliseconds when
/// none waits, and a few hundred on a loaded machine.
#[test]
fn a_post_from_the_completion_callback_goes_out_before_the_thread_sleeps() {
    const CHAIN: u64 = 40;
    let mem = || FlatMemory::new(1, 1 << 16);
    let (a, b, qa, _) = rc_pair("127.0.160.30", "127.0.160.31", rc(), mem(), mem());
    let write = |i: u64| {
        let op = SendOp::Write {
            raddr: 0,
            rkey: Rkey(1),
        };
        let sge = Sge {
            addr: 0,
            len: 64,
            lkey: Lkey(1),
        };
        SendWqe::new(i, op, vec![sge])
    };
    let slot: Arc<std::sync::OnceLock<Driver>> = Arc::new(std::sync::OnceLock::new());
    let weak = Arc::downgrade(&slot);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let next = AtomicU64::new(1);
    let cb: softroce::CompletionCallback = Box::new(move |qp| {
        let Some(slot) = weak.upgrade() else { return };
        let Some(d) = slot.get() else { return };
        let mut finished = 0;
        d.with_node(|n| {
            while let Some(c) = n.poll_completion(qp) {
                assert_eq!(c.status, WcStatus::Success);
                finished += 1;
            }
        });
        for _ in 0..finished {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i < CHAIN {
                d.with_node(|n| n.qp_mut(qp).unwrap().post_send(write(i)));
            } else if i == CHAIN {
                let _ = done_tx.send(());
            }
        }
    });
    let _db = Driver::start(b, None).unwrap();
    let started = std::time::Instant::now();
    let _ = slot.set(Driver::start(a, Some(cb)).unwrap());
    slot.get()
        .unwrap()
        .with_node(|n| n.qp_mut(qa).unwrap().post_send(write(0)));
    done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the chain of WRITEs completed");
    let took = started.elapsed();
    println!("{CHAIN} chained WRITEs took {took:?}");
    // The bound is the feature (no post slept through an idle sleep) and
    // generous: one that did alone would take the 5 s this is under.
    assert!(
        took < Duration::from_millis(4500),
        "{CHAIN} chained WRITEs took {took:?}: a post waited for the idle sleep"
    );
}

/// A dropped driver's node lets go of its address: `Released` says when,
/// and the address binds again then.
#[test]
fn released_says_when_the_address_binds_again() {
    let node = Node::bind(NodeConfig::new("127.0.70.9:0".parse().unwrap())).unwrap();
    let addr = node.local_addr();
    let d = Driver::start(node, None).unwrap();
    let released = d.released();
    assert!(!released.is_released());
    assert!(!released.wait(Duration::from_millis(10)));
    drop(d);
    assert!(released.wait(Duration::from_secs(5)));
    Node::bind(NodeConfig::new(addr)).unwrap();
}

/// Several threads post to one QP at once while its NIC thread receives
/// the ACKs: each post is sent from its own thread unless another is
/// sending, and one sender at a time keeps the packets in the order the
/// engine made them. A packet that overtook an earlier one would reach
/// the responder out of sequence (counted, and NAKed); on loopback with
/// no loss none may, and every WRITE lands.
#[test]
fn concurrent_posters_keep_each_qps_packets_in_order() {
    const THREADS: u64 = 3;
    const EACH: u64 = 60;
    const LEN: u64 = 4096 * 3;
    let size = (THREADS * EACH * LEN) as usize;
    let (ma, mb) = (FlatMemory::new(1, size), FlatMemory::new(1, size));
    ma.with(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 251) as u8)
    });
    let (a, b, qa, qb) = rc_pair("127.125.20.1", "127.125.20.2", rc(), ma.clone(), mb.clone());
    let da = Arc::new(Driver::start(a, None).unwrap());
    let db = Driver::start(b, None).unwrap();
    let posters: Vec<_> = (0..THREADS)
        .map(|t| {
            let da = da.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let off = (t * EACH + i) * LEN;
                    let op = SendOp::Write {
                        raddr: off,
                        rkey: Rkey(1),
                    };
                    let sge = Sge {
                        addr: off,
                        len: LEN as u32,
                        lkey: Lkey(1),
                    };
                    da.with_node(|n| {
                        n.qp_mut(qa)
                            .unwrap()
                            .post_send(SendWqe::new(off, op, vec![sge]))
                    });
                }
            })
        })
        .collect();
    for p in posters {
        p.join().unwrap();
    }
    for _ in 0..THREADS * EACH {
        let c = da
            .wait_completion(qa, Duration::from_secs(20))
            .expect("completion within 20 s");
        assert_eq!(c.status, WcStatus::Success, "WRITE {:#x}", c.wr_id);
    }
    assert!(
        mb.with(|m| m.to_vec()) == ma.with(|m| m.to_vec()),
        "every WRITE landed"
    );
    let ka = da.inspect(|n| n.qp_mut(qa).unwrap().counters());
    let kb = db.inspect(|n| n.qp_mut(qb).unwrap().counters());
    assert_eq!(
        (kb.out_of_sequence, ka.seq_naks_received),
        (0, 0),
        "packets overtook earlier ones: responder {kb:?}, requester {ka:?}"
    );
    assert!(kb.rx_packets >= THREADS * EACH * 3, "{kb:?}");
}

/// The ACK of a received SEND may wait after the callbacks for a post to
/// ride with; with none coming it still leaves (by its own 200 µs
/// deadline, and at the latest when the responder's ACK repeat falls due,
/// 2 ms on), long before the sender's retransmission timer (here ~1 s) or
/// the receiver's idle sleep (5 s): the sender sees every SEND complete
/// and never times out.
#[test]
fn a_held_ack_leaves_by_its_deadline_when_nothing_is_posted() {
    const SENDS: u64 = 20;
    let mut cfg = rc();
    cfg.timeout = 18;
    let mem = || FlatMemory::new(1, 1 << 16);
    let (mut a, b, qa, qb) = rc_pair("127.125.20.3", "127.125.20.4", cfg, mem(), mem());
    for i in 0..SENDS {
        let sges = vec![Sge {
            addr: i * 64,
            len: 64,
            lkey: Lkey(1),
        }];
        a.qp_mut(qa).unwrap().post_recv(RecvWqe { wr_id: i, sges });
    }
    let received = Arc::new(AtomicU64::new(0));
    let cb: softroce::CompletionCallback = {
        let received = received.clone();
        Box::new(move |_qp| {
            received.fetch_add(1, Ordering::Relaxed);
        })
    };
    let _da = Driver::start(a, Some(cb)).unwrap();
    let db = Driver::start(b, None).unwrap();
    let started = std::time::Instant::now();
    for i in 0..SENDS {
        let sge = Sge {
            addr: 0,
            len: 64,
            lkey: Lkey(1),
        };
        db.with_node(|n| {
            n.qp_mut(qb)
                .unwrap()
                .post_send(SendWqe::new(i, SendOp::Send, vec![sge]))
        });
        let c = db
            .wait_completion(qb, Duration::from_secs(20))
            .expect("the SEND completed");
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
    }
    let took = started.elapsed();
    let k = db.inspect(|n| n.qp_mut(qb).unwrap().counters());
    assert_eq!(
        (k.timeouts, k.retransmits),
        (0, 0),
        "an ACK waited for the sender's timer ({SENDS} SENDs took {took:?})"
    );
    assert!(
        received.load(Ordering::Relaxed) >= 1,
        "the receiver's callback ran"
    );
}

/// What a completion callback posts leaves with the ACKs its round made,
/// the request first and the (shorter) ACK after it, so both ride one GSO
/// send, one buffer at the peer; each arrives with its ICRC right (segment
/// 1 carries the Identification-1 correction) and does its work: B's SEND
/// completes, A's answer lands.
#[test]
fn an_answer_posted_from_a_callback_and_its_rounds_ack_ride_one_gso_send() {
    let ma = FlatMemory::new(1, 1 << 12);
    ma.with(|m| m.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8));
    let mb = FlatMemory::new(1, 1 << 12);
    let (mut a, mut b, qa, qb) =
        rc_pair("127.125.20.5", "127.125.20.6", rc(), ma.clone(), mb.clone());
    let sge = |addr, len| {
        vec![Sge {
            addr,
            len,
            lkey: Lkey(1),
        }]
    };
    a.qp_mut(qa).unwrap().post_recv(RecvWqe {
        wr_id: 9,
        sges: sge(0, 256),
    });
    b.qp_mut(qb).unwrap().post_recv(RecvWqe {
        wr_id: 8,
        sges: sge(0, 256),
    });
    // A answers B's SEND from its completion callback.
    let slot: Arc<std::sync::OnceLock<Driver>> = Arc::new(std::sync::OnceLock::new());
    let weak = Arc::downgrade(&slot);
    let cb: softroce::CompletionCallback = Box::new(move |qp| {
        let Some(slot) = weak.upgrade() else { return };
        let Some(d) = slot.get() else { return };
        d.with_node(|n| {
            // Only B's SEND (receive 9) is answered: the answer's own
            // completion must not post another.
            while let Some(c) = n.poll_completion(qp) {
                if c.wr_id == 9 {
                    let answer = SendWqe::new(2, SendOp::Send, sge(64, 100));
                    n.qp_mut(qp).unwrap().post_send(answer);
                }
            }
        });
    });
    let _ = slot.set(Driver::start(a, Some(cb)).unwrap());
    let da = slot.get().unwrap();
    b.qp_mut(qb)
        .unwrap()
        .post_send(SendWqe::new(1, SendOp::Send, sge(0, 40)));
    let epoch = std::time::Instant::now();
    let deadline = epoch + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "B got {got:?}");
        b.poll(rdma_types::Instant::from_std(
            epoch,
            std::time::Instant::now(),
        ));
        while let Some(c) = b.poll_completion(qb) {
            got.push((c.wr_id, c.status));
        }
        let _ = b.wait(Duration::from_millis(50));
    }
    got.sort_by_key(|(id, _)| *id);
    assert_eq!(got, [(1, WcStatus::Success), (8, WcStatus::Success)]);
    assert_eq!(b.stats().rx_bad_icrc, 0, "{:?}", b.stats());
    assert_eq!(
        mb.with(|m| m[..100].to_vec()),
        ma.with(|m| m[64..164].to_vec())
    );
    // The answer and the ACK left as one GSO send; later copies of the
    // ACK (the responder repeats its newest after 2 ms) go alone.
    let sa = da.inspect(|n| n.stats());
    if sa.tx_gso_sends == 0 && !gso_works() {
        rdma_testkit::need::WHOLE.skip("UDP GSO: no send was segmented", "Linux 4.18 or later");
        return;
    }
    let ka = da.inspect(|n| n.qp_mut(qa).unwrap().counters());
    assert_eq!(sa.tx_gso_sends, 1, "{sa:?} {ka:?}");
}

/// Whether this kernel segments UDP sends (GSO), by trying it: a 32 KiB
/// WRITE is 32 equal packets.
fn gso_works() -> bool {
    gso_probe().unwrap_or(false)
}

fn gso_probe() -> Option<bool> {
    let mem = || FlatMemory::new(1, 1 << 16);
    let (mut a, _b, qa, _) = rc_pair("127.125.20.7", "127.125.20.8", rc(), mem(), mem());
    let op = SendOp::Write {
        raddr: 0,
        rkey: Rkey(1),
    };
    let sges = vec![Sge {
        addr: 0,
        len: 1 << 15,
        lkey: Lkey(1),
    }];
    a.qp_mut(qa).unwrap().post_send(SendWqe::new(0, op, sges));
    a.poll(rdma_types::Instant::from_micros(1));
    Some(a.stats().tx_gso_sends > 0)
}

/// A consumer driving the receiving node ([`Driver::drive`]): the SENDs
/// that reach it while it waits in `drive` are delivered on its thread
/// (`here`), those of QPs it says are not its own go to the NIC thread's
/// callback, and whichever thread receives, every completion arrives once.
#[test]
fn a_driving_consumer_receives_its_completions_and_hands_on_the_others() {
    const SENDS: u64 = 40;
    let mem = || FlatMemory::new(1, 1 << 16);
    let (a, mut b, qa, qb) = rc_pair("127.125.21.1", "127.125.21.2", rc(), mem(), mem());
    post_64_byte_receives(&mut b, qb, SENDS);
    let (by_nic, cb) = counted_callbacks();
    let da = Driver::start(a, None).unwrap();
    let db = Driver::start(b, Some(cb)).unwrap();
    let received = |db: &Driver| -> u64 {
        db.inspect(|n| std::iter::from_fn(|| n.poll_completion(qb)).count() as u64)
    };
    let (mut here, mut got) = (0u64, 0u64);
    for round in 0..2u64 {
        // First the consumer takes its QP's completions, then it leaves
        // them to the NIC thread.
        let mine = round == 0;
        for i in round * SENDS / 2..(round + 1) * SENDS / 2 {
            let sge = Sge {
                addr: 0,
                len: 64,
                lkey: Lkey(1),
            };
            da.with_node(|n| {
                n.qp_mut(qa)
                    .unwrap()
                    .post_send(SendWqe::new(i, SendOp::Send, vec![sge]))
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let took = std::cell::Cell::new(0);
                db.drive(Duration::ZERO, Duration::from_millis(20), |qp| {
                    assert_eq!(qp, qb);
                    took.set(took.get() + u64::from(mine));
                    mine
                });
                here += took.get();
                got += received(&db);
                if got > i {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "SEND {i} lost");
            }
            let c = da
                .wait_completion(qa, Duration::from_secs(10))
                .expect("the SEND completed");
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
    }
    assert_eq!(got, SENDS, "each receive completed once");
    assert!(here > 0, "none came through the consumer");
    assert!(by_nic.load(Ordering::Relaxed) > 0, "none was handed on");
}

/// `n` receives of 64 bytes on `qb`, in 16 slots of its region.
fn post_64_byte_receives(b: &mut softroce::Node, qb: QpHandle, n: u64) {
    for i in 0..n {
        let sges = vec![Sge {
            addr: (i % 16) * 64,
            len: 64,
            lkey: Lkey(1),
        }];
        b.qp_mut(qb).unwrap().post_recv(RecvWqe { wr_id: i, sges });
    }
}

/// A completion callback that counts its calls, and the count.
fn counted_callbacks() -> (Arc<AtomicU64>, softroce::CompletionCallback) {
    let n = Arc::new(AtomicU64::new(0));
    let counter = n.clone();
    let cb: softroce::CompletionCallback = Box::new(move |_qp| {
        counter.fetch_add(1, Ordering::Relaxed);
    });
    (n, cb)
}

/// Datagrams that come while the NIC thread looks (a stream of them, each
/// sent right after the last) are found without a sleep; once they stop,
/// the thread goes back to sleeping: its loop count stands still.
#[test]
fn a_nic_thread_looks_for_datagrams_under_load_and_sleeps_when_idle() {
    let node = Node::bind(NodeConfig::new("127.0.70.11:0".parse().unwrap())).unwrap();
    let to = node.local_addr();
    let d = Driver::start(node, None).unwrap();
    let tx = std::net::UdpSocket::bind("127.0.70.12:0").unwrap();
    // Not RoCE: each is dropped on arrival, after it woke the thread.
    for _ in 0..3000 {
        tx.send_to(&[0u8; 64], to).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.looks_found() == 0 && std::time::Instant::now() < deadline {
        for _ in 0..200 {
            tx.send_to(&[0u8; 64], to).unwrap();
        }
    }
    assert!(d.looks_found() > 0, "no datagram was found by a look");
    // Idle: after a few looks in vain the thread sleeps (its idle sleep is
    // seconds), so its loops stand still over a tenth of a second.
    let settled = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = d.loops();
        std::thread::sleep(Duration::from_millis(100));
        if d.loops() == before {
            break;
        }
        assert!(
            std::time::Instant::now() < settled,
            "the NIC thread kept looping while idle"
        );
    }
}

/// A consumer that drove busily and then stopped leaves nothing stranded:
/// the NIC thread, which left the socket to it (waking later and later
/// while it drove), takes what comes after, within DRIVEN_RECENT of its
/// last wake.
#[test]
fn what_comes_after_a_busy_consumer_stopped_is_taken_by_the_nic_thread() {
    let mem = || FlatMemory::new(1, 1 << 16);
    let (a, mut b, qa, qb) = rc_pair("127.125.22.1", "127.125.22.2", rc(), mem(), mem());
    post_64_byte_receives(&mut b, qb, 4);
    let (by_nic, cb) = counted_callbacks();
    let da = Driver::start(a, None).unwrap();
    let db = Driver::start(b, Some(cb)).unwrap();
    // Busy: a few thousand drives that find nothing, 5 ms or more.
    let busy = std::time::Instant::now();
    while busy.elapsed() < Duration::from_millis(5) {
        db.drive(Duration::ZERO, Duration::ZERO, |_| false);
    }
    // Stopped. A SEND arrives: nobody drives, the NIC thread takes it.
    let sge = Sge {
        addr: 0,
        len: 64,
        lkey: Lkey(1),
    };
    let sent = std::time::Instant::now();
    da.with_node(|n| {
        n.qp_mut(qa)
            .unwrap()
            .post_send(SendWqe::new(1, SendOp::Send, vec![sge]))
    });
    let c = da
        .wait_completion(qa, Duration::from_secs(10))
        .expect("the SEND was acknowledged");
    assert_eq!(c.status, WcStatus::Success);
    assert!(by_nic.load(Ordering::Relaxed) >= 1, "the receive completed");
    println!("acknowledged after {:?}", sent.elapsed());
}
