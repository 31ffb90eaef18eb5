//! Work a NIC thread takes in from elsewhere (a NIC daemon's client
//! rings): a feeder's descriptor wakes the thread, what it posts leaves
//! with the round's ACKs; and the ACK hold stops when nothing rides.

use rdma_types::{Lkey, Qpn, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use roce_udp::Waker;
use softroce::{Driver, Fed, Feeder, FlatMemory, Node, NodeConfig, QpHandle};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

fn pair(a: &str, b: &str) -> (Node, Node, QpHandle, QpHandle, FlatMemory, FlatMemory) {
    let (ma, mb) = (FlatMemory::new(1, 1 << 16), FlatMemory::new(1, 1 << 16));
    ma.with(|m| m.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8));
    let mut na = Node::bind(NodeConfig::new(format!("{a}:0").parse().unwrap())).unwrap();
    let mut nb = Node::bind(NodeConfig::new(format!("{b}:0").parse().unwrap())).unwrap();
    let cfg = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
    let qa = na.create_qp(cfg.clone(), Box::new(ma.clone()));
    let qb = nb.create_qp(cfg, Box::new(mb.clone()));
    Node::connect_pair(&mut na, qa, &mut nb, qb);
    (na, nb, qa, qb, ma, mb)
}

fn sge(addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr,
        len,
        lkey: Lkey(1),
    }]
}

/// A producer outside the node, as a NIC daemon's client ring: SENDs
/// queued for QP `qp`, announced on `bell` while the thread sleeps.
struct Queue {
    driver: OnceLock<Weak<Driver>>,
    qp: QpHandle,
    sends: Mutex<Vec<SendWqe>>,
    bell: Waker,
    asleep: std::sync::atomic::AtomicBool,
    sleeps: AtomicU64,
    feeds: AtomicU64,
}

impl Queue {
    fn new(qp: QpHandle) -> Arc<Queue> {
        Arc::new(Queue {
            driver: OnceLock::new(),
            qp,
            sends: Mutex::new(Vec::new()),
            bell: Waker::new().unwrap(),
            asleep: false.into(),
            sleeps: AtomicU64::new(0),
            feeds: AtomicU64::new(0),
        })
    }

    /// Queues a SEND; rings the bell when the thread sleeps.
    fn push(&self, w: SendWqe) {
        self.sends.lock().unwrap().push(w);
        if self.asleep.load(Ordering::SeqCst) {
            self.bell.wake();
        }
    }
}

impl Feeder for Queue {
    fn feed(&self) -> Fed {
        self.feeds.fetch_add(1, Ordering::Relaxed);
        let taken: Vec<SendWqe> = std::mem::take(&mut *self.sends.lock().unwrap());
        let n = taken.len();
        if let Some(d) = self.driver.get().and_then(Weak::upgrade) {
            d.with_node(|node| {
                for w in taken {
                    node.qp_mut(self.qp).unwrap().post_send(w);
                }
            });
        }
        Fed {
            taken: n,
            stalled: false,
        }
    }

    fn sleeping(&self) -> bool {
        self.asleep.store(true, Ordering::SeqCst);
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        !self.sends.lock().unwrap().is_empty()
    }

    fn awake(&self) {
        self.asleep.store(false, Ordering::SeqCst);
        self.bell.drain();
    }

    fn fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }
}

/// Polls `n` (on this thread) until `want` completions of `qp` came.
fn completions(n: &mut Node, qp: QpHandle, want: usize) -> Vec<(u64, WcStatus)> {
    let epoch = Instant::now();
    let mut got = Vec::new();
    while got.len() < want {
        assert!(epoch.elapsed() < Duration::from_secs(10), "got {got:?}");
        n.poll(rdma_types::Instant::from_std(epoch, Instant::now()));
        while let Some(c) = n.poll_completion(qp) {
            got.push((c.wr_id, c.status));
        }
        let _ = n.wait(Duration::from_millis(20));
    }
    got
}

/// A sleeping NIC thread wakes at a feeder's descriptor, takes its work
/// and sends it; the feeder was told before the sleep and after it.
#[test]
fn a_feeders_bell_wakes_the_thread_and_its_posts_leave() {
    let (a, mut b, qa, qb, ma, mb) = pair("127.125.30.1", "127.125.30.2");
    let da = Arc::new(Driver::start(a, None).unwrap());
    let q = Queue::new(qa);
    let _ = q.driver.set(Arc::downgrade(&da));
    da.add_feeder(q.clone());
    for i in 0..5u64 {
        b.qp_mut(qb).unwrap().post_recv(RecvWqe {
            wr_id: 100 + i,
            sges: sge(i * 256, 256),
        });
    }
    for i in 0..5u64 {
        // Each SEND after the thread went to sleep: only the bell wakes it.
        let epoch = Instant::now();
        while !q.asleep.load(Ordering::SeqCst) {
            assert!(
                epoch.elapsed() < Duration::from_secs(10),
                "the thread never slept"
            );
            std::thread::yield_now();
        }
        q.push(SendWqe::new(i, SendOp::Send, sge(i * 256, 200)));
        let got = completions(&mut b, qb, 1);
        assert_eq!(got, [(100 + i, WcStatus::Success)]);
        let c = da
            .wait_completion(qa, Duration::from_secs(10))
            .expect("A's SEND completes");
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
    }
    assert_eq!(
        mb.with(|m| (0..5)
            .flat_map(|i| m[i * 256..i * 256 + 200].to_vec())
            .collect::<Vec<_>>()),
        ma.with(|m| (0..5)
            .flat_map(|i| m[i * 256..i * 256 + 200].to_vec())
            .collect::<Vec<_>>())
    );
    assert!(
        q.sleeps.load(Ordering::Relaxed) >= 5,
        "told before each sleep"
    );
}

/// A callback that only tells a producer (as a NIC daemon's CQ ring
/// tells its client), whose answer then comes through the feeder in the
/// same turn: the answer and the round's ACK of B's SEND leave in one
/// GSO send.
#[test]
fn a_feeders_answer_rides_with_the_rounds_ack() {
    let (a, mut b, qa, qb, ma, mb) = pair("127.125.30.3", "127.125.30.4");
    a_recv(&mut b, qb);
    let q = Queue::new(qa);
    let answerer = q.clone();
    let cb: softroce::CompletionCallback = Box::new(move |qp| {
        let Some(d) = answerer.driver.get().and_then(Weak::upgrade) else {
            return;
        };
        // Only B's SEND (receive 9) is answered, not the answer's own
        // completion.
        let got =
            d.with_node(|n| std::iter::from_fn(|| n.poll_completion(qp)).any(|c| c.wr_id == 9));
        if got {
            answerer.push(SendWqe::new(2, SendOp::Send, sge(64, 100)));
        }
    });
    let da = Arc::new(Driver::start(a, Some(cb)).unwrap());
    let _ = q.driver.set(Arc::downgrade(&da));
    da.with_node(|n| {
        n.qp_mut(qa).unwrap().post_recv(RecvWqe {
            wr_id: 9,
            sges: sge(0, 256),
        })
    });
    da.add_feeder(q.clone());
    b.qp_mut(qb)
        .unwrap()
        .post_send(SendWqe::new(1, SendOp::Send, sge(0, 40)));
    let mut got = completions(&mut b, qb, 2);
    got.sort_by_key(|(id, _)| *id);
    assert_eq!(got, [(1, WcStatus::Success), (8, WcStatus::Success)]);
    assert_eq!(
        mb.with(|m| m[..100].to_vec()),
        ma.with(|m| m[64..164].to_vec())
    );
    let sa = da.inspect(|n| n.stats());
    if sa.tx_gso_sends == 0 {
        // This kernel does not segment UDP sends: nothing to tell.
        return;
    }
    assert_eq!(sa.tx_gso_sends, 1, "{sa:?}");
}

fn a_recv(b: &mut Node, qb: QpHandle) {
    b.qp_mut(qb).unwrap().post_recv(RecvWqe {
        wr_id: 8,
        sges: sge(0, 256),
    });
}

/// A receiver whose consumer never answers (a sink of one-way SENDs):
/// after two holds with nothing riding, its ACKs stop waiting, so the
/// sender's completions no longer wait out the hold.
#[test]
fn holding_acks_stops_when_nothing_rides() {
    let (mut a, b, qa, qb, _ma, _mb) = pair("127.125.30.5", "127.125.30.6");
    let db = Driver::start(b, Some(Box::new(|_qp| {}))).unwrap();
    db.with_node(|n| {
        for i in 0..8 {
            n.qp_mut(qb).unwrap().post_recv(RecvWqe {
                wr_id: i,
                sges: sge(i * 256, 256),
            });
        }
    });
    assert!(db.holds_acks(), "a fresh driver holds");
    for i in 0..4u64 {
        a.qp_mut(qa)
            .unwrap()
            .post_send(SendWqe::new(i, SendOp::Send, sge(0, 8)));
        assert_eq!(completions(&mut a, qa, 1), [(i, WcStatus::Success)]);
    }
    assert!(
        !db.holds_acks(),
        "still holding after four unanswered SENDs"
    );
}
