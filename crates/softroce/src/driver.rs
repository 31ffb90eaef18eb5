//! A node on its own thread: the event loop of the soft RoCE NIC.
//!
//! The thread polls the node (bounded rounds), hands completion
//! notifications to a callback and to blocked waiters, and sleeps in the
//! kernel on the socket and a waker until traffic, a timer deadline, or a
//! consumer's post arrives: an idle NIC costs no CPU. A post made from a
//! completion callback (on the thread itself) needs no wake-up: the thread
//! polls again before it sleeps.

use crate::node::{Node, QpHandle};
use rdma_types::Instant;
use roce::Completion;
use roce_udp::{wait_readable, Waker};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant as StdInstant};

/// Called on the driver thread, without locks held, for each QP that got
/// completions.
pub type CompletionCallback = Box<dyn Fn(QpHandle) + Send + Sync>;

struct Shared {
    node: Mutex<Node>,
    ready: Condvar,
    waker: Arc<Waker>,
    fd: RawFd,
    stop: AtomicBool,
    loops: AtomicU64,
    /// Threads blocked in `wait_completion` (changed under the node's
    /// lock): without any, the thread skips the condvar wake-up, a system
    /// call per round with completions.
    waiters: AtomicU64,
    /// Work was handed to the node since the thread's last round began:
    /// poll again before sleeping.
    posted: AtomicBool,
    /// The thread is about to sleep or sleeping in the kernel: only then
    /// does a post write the waker (two system calls and an empty round
    /// saved per post while the thread is awake, and for every post from a
    /// completion callback, which runs on the thread itself).
    sleeping: AtomicBool,
    /// Set before `sleeping`: when the sleeping thread wakes by itself
    /// (the node's clock: microseconds since `epoch`, as the deadlines).
    sleep_until: AtomicU64,
    epoch: StdInstant,
    callback: Option<CompletionCallback>,
    /// Set when this is dropped: fields drop in declaration order, so the
    /// node (and its socket) is gone by then.
    released: SetOnDrop,
}

/// Tells when a [`Driver`]'s node is gone, socket closed: its address can
/// be bound again. Dropping the driver stops its thread, but the node may
/// outlive the drop: when the last owner of the driver is a completion
/// callback on the driver thread itself, the thread cannot be joined, and
/// the node goes when the thread ends.
#[derive(Clone)]
pub struct Released(Arc<Latch>);

struct Latch {
    done: Mutex<bool>,
    cond: Condvar,
    thread: OnceLock<ThreadId>,
}

struct SetOnDrop(Released);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        let l = &self.0 .0;
        *l.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        l.cond.notify_all();
    }
}

impl Released {
    /// Whether the node is gone already.
    pub fn is_released(&self) -> bool {
        *self.0.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout` for the node to go; whether it went. Called
    /// on the driver thread itself (from a completion callback), it does
    /// not wait: the node goes only once that thread returns.
    pub fn wait(&self, timeout: Duration) -> bool {
        let l = &self.0;
        let done = l.done.lock().unwrap_or_else(|e| e.into_inner());
        if l.thread.get() == Some(&std::thread::current().id()) {
            return *done;
        }
        *l.cond
            .wait_timeout_while(done, timeout, |d| !*d)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

/// A [`Node`] driven by its own thread. Dropping it stops the thread.
pub struct Driver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Longest sleep with nothing to do. Every source of work wakes the thread
/// itself (a datagram, a post, a timer deadline, the drop), so this is
/// only a bound on a wake-up that went missing; it was 100 ms, which made
/// an idle node wake 10 times a second (a few per cent of a core in a TCG
/// guest).
const IDLE_SLEEP: Duration = Duration::from_secs(5);
/// Poll rounds per wake-up before sleeping again (bounded work).
const ROUNDS: usize = 16;

impl Driver {
    /// Starts the thread.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(node: Node, callback: Option<CompletionCallback>) -> std::io::Result<Driver> {
        let released = Released(Arc::new(Latch {
            done: Mutex::new(false),
            cond: Condvar::new(),
            thread: OnceLock::new(),
        }));
        let shared = Arc::new(Shared {
            waker: node.waker(),
            fd: node.raw_fd(),
            node: Mutex::new(node),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            loops: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            posted: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            sleep_until: AtomicU64::new(0),
            epoch: StdInstant::now(),
            callback,
            released: SetOnDrop(released.clone()),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("softroce".into())
            .spawn(move || run(&s))?;
        let _ = released.0.thread.set(thread.thread().id());
        Ok(Driver {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Node> {
        self.shared.node.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the node (to post work, create QPs, read counters), and
    /// sees that new work goes out at once: a running thread loops once
    /// more; for a sleeping one, what `f` made to send is sent from here
    /// (as Linux siw sends from `post_send`), and the thread is woken only
    /// when that made completions to deliver or a timer (a retransmission)
    /// falls before it would wake by itself.
    pub fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut node = self.lock();
        let r = f(&mut node);
        if self.shared.sleeping.load(Ordering::SeqCst) {
            let now = Instant::from_std(self.shared.epoch, StdInstant::now());
            let ready = node.send_posted(now);
            // On the node's own clock, as the thread computed its wake-up:
            // a deadline it already slept for is never "sooner" by the
            // microseconds between its reading of the clock and its sleep.
            let sooner = node
                .next_deadline()
                .is_some_and(|d| d.total_micros() < self.shared.sleep_until.load(Ordering::SeqCst));
            drop(node);
            if ready || sooner {
                self.shared.posted.store(true, Ordering::SeqCst);
                self.shared.waker.wake();
            }
            return r;
        }
        drop(node);
        // Either the thread sees `posted` before it sleeps, or this sees
        // `sleeping` and wakes it (both SeqCst: one of the two loads
        // observes the other side's store).
        self.shared.posted.store(true, Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::SeqCst) {
            self.shared.waker.wake();
        }
        r
    }

    /// Runs `f` on the node to read it (counters, what the port kept)
    /// without waking the thread: a reader asking often costs the NIC no
    /// wake-ups. Work handed to the node here waits for the thread's next
    /// round; use [`Driver::with_node`] for that.
    pub fn inspect<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        f(&mut self.lock())
    }

    /// The next completion of `qp`, waiting up to `timeout` for one.
    pub fn wait_completion(&self, qp: QpHandle, timeout: Duration) -> Option<Completion> {
        let deadline = StdInstant::now() + timeout;
        let mut node = self.lock();
        loop {
            if let Some(c) = node.poll_completion(qp) {
                return Some(c);
            }
            let left = deadline.checked_duration_since(StdInstant::now())?;
            self.shared.waiters.fetch_add(1, Ordering::SeqCst);
            node = self
                .shared
                .ready
                .wait_timeout(node, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            self.shared.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// What tells when the node is gone (after the driver is dropped):
    /// wait on it before binding the node's address again.
    pub fn released(&self) -> Released {
        self.shared.released.0.clone()
    }

    /// Loop iterations so far (how often the thread woke up).
    pub fn loops(&self) -> u64 {
        self.shared.loops.load(Ordering::Relaxed)
    }
}

fn run(s: &Shared) {
    while !s.stop.load(Ordering::Acquire) {
        s.loops.fetch_add(1, Ordering::Relaxed);
        let (ready, mut deadline, mut now) = {
            let mut node = s.node.lock().unwrap_or_else(|e| e.into_inner());
            // Posts made before this point are in the node: this round
            // sees them.
            s.posted.store(false, Ordering::SeqCst);
            let mut now = Instant::from_std(s.epoch, StdInstant::now());
            // Another round only when this one left work behind: an empty
            // receive would cost a system call, and what arrives meanwhile
            // wakes the sleep below at once.
            for _ in 0..ROUNDS {
                if !node.poll_holding(now) || !node.has_more() {
                    break;
                }
                now = Instant::from_std(s.epoch, StdInstant::now());
            }
            (node.take_ready(), node.next_deadline(), now)
        };
        if !ready.is_empty() {
            // A waiter counted itself under the lock before this round's
            // poll (then it is seen here) or checks for completions after
            // it (then it finds this round's).
            if s.waiters.load(Ordering::SeqCst) > 0 {
                s.ready.notify_all();
            }
            if let Some(cb) = &s.callback {
                for qp in &ready {
                    cb(*qp);
                }
            }
            // What the rounds held (`Node::poll_holding`) leaves now, in
            // one batch with what the callbacks posted; posts made after
            // this point are seen by the check below.
            let mut node = s.node.lock().unwrap_or_else(|e| e.into_inner());
            s.posted.store(false, Ordering::SeqCst);
            now = Instant::from_std(s.epoch, StdInstant::now());
            if node.send_posted(now) {
                continue;
            }
            // What was sent may have armed a retransmission timer.
            deadline = node.next_deadline();
        }
        if s.posted.load(Ordering::SeqCst) {
            continue;
        }
        let sleep = deadline.map_or(IDLE_SLEEP, |d| {
            d.saturating_since(now).to_std().min(IDLE_SLEEP)
        });
        if !sleep.is_zero() {
            let until = now.total_micros() + sleep.as_micros() as u64;
            s.sleep_until.store(until, Ordering::SeqCst);
            s.sleeping.store(true, Ordering::SeqCst);
            if !s.posted.load(Ordering::SeqCst) {
                let _ = wait_readable(s.fd, Some(&s.waker), sleep);
            }
            s.sleeping.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.waker.wake();
        if let Some(t) = self.thread.take() {
            // The last owner may be a completion callback on the driver
            // thread itself: it cannot join itself, and it stops anyway.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
