//! A node on its own thread: the event loop of the soft RoCE NIC.
//!
//! The thread receives, fires timers, hands completion notifications to a
//! callback and to blocked waiters, and sleeps in the kernel on the socket
//! and a waker until traffic, a timer deadline, or work for it arrives: an
//! idle NIC costs no CPU.
//!
//! Sending is not the thread's alone. A post ([`Driver::with_node`]) hands
//! work to the engines and sends what they make from the posting thread
//! itself, as Linux siw sends from `post_send`, so a request never waits
//! for the NIC thread to wake. A post made from a completion callback (on
//! the thread itself) is sent once the callbacks are done, in one batch
//! with the ACKs of what the round received; when the callbacks posted
//! nothing, those ACKs wait up to [`ACK_HOLD`] for another thread's post
//! (the consumer they woke) to ride with.
//!
//! Receiving is not the thread's alone either. A consumer thread waiting
//! for its completions may receive for the node itself
//! ([`Driver::drive`]): it sleeps on the socket in the NIC thread's place,
//! runs the receive round, and delivers the completions of its own QPs on
//! its thread (those of other QPs go to the NIC thread's callbacks). While
//! a consumer drives, and for [`DRIVEN_RECENT`] after, the NIC thread
//! leaves the socket to it and wakes every [`ACK_HOLD`] at the latest for
//! timers, held ACKs and whatever arrived between two drives, so a packet
//! wakes one thread, the one waiting for it. A wake that finds a consumer
//! drove within the last 50 µs leaves the socket to it too; while wakes
//! find consumers still driving, each comes twice as late, up to
//! [`DRIVEN_RECENT`] (a datagram no consumer takes waits that long at
//! most); one that finds them gone comes at [`ACK_HOLD`] again. Work a
//! consumer hands over wakes the thread at once.
//!
//! Work can also come from elsewhere: a [`Feeder`] (a NIC daemon's
//! client rings) is asked for it on every turn of the thread, its posts
//! leave with the round's ACKs, and its descriptor (a doorbell) wakes the
//! thread's sleep, so the thread that receives for the node is also the
//! one that takes its consumers' work, and no other thread is woken.
//!
//! Locking: the node's lock is never held across a system call. A sender
//! takes a batch out of the node under the lock, lets go, sends, and takes
//! the lock again to give the buffers back; the thread receives into its
//! own buffers without the lock and takes it to hand the datagrams to the
//! QPs. One thread at a time sends (the `sending` flag): batches leave in
//! the order they were taken out, and each holds its packets in the order
//! the engines made them, so no packet of a QP overtakes an earlier one.
//! A thread that finds another sending leaves its work `pending`, and the
//! sender sends it before it lets go of the flag. (A node with a capture
//! file writes it under the lock: a diagnostic mode, not the fast path.)

use crate::node::{Node, QpHandle, RX_BUDGET};
use rdma_types::Instant;
use roce::Completion;
use roce_udp::{wait_readable, wait_readable_or, RoceSocket, Waker};
use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant as StdInstant};

/// Called on the driver thread, without locks held, for each QP that got
/// completions.
pub type CompletionCallback = Box<dyn Fn(QpHandle) + Send + Sync>;

/// Work the NIC thread takes in on each turn, from producers outside the
/// node (a NIC daemon's client rings; see the module docs). Called on
/// the NIC thread without the node's lock; what it posts (through the
/// provider, which reaches the node with [`Driver::with_node`]) is sent
/// once the turn is over, with the round's ACKs.
pub trait Feeder: Send + Sync {
    /// Takes the work waiting and posts it.
    fn feed(&self) -> Fed;
    /// The thread is about to sleep: have the producers wake it (their
    /// flags set) and look once more. `true`: work came meanwhile, the
    /// thread does not sleep.
    fn sleeping(&self) -> bool;
    /// The thread is awake again: the descriptor emptied, the producers'
    /// flags cleared.
    fn awake(&self);
    /// The descriptor that becomes readable when work comes in.
    fn fd(&self) -> RawFd;
}

/// What [`Feeder::feed`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fed {
    /// Work requests taken.
    pub taken: usize,
    /// A queue was full: work is left that no producer will announce,
    /// so the thread asks again within [`FEED_RETRY`].
    pub stalled: bool,
}

/// How soon the thread asks a stalled [`Feeder`] again.
pub const FEED_RETRY: Duration = Duration::from_millis(1);

/// A [`Feeder`]'s place at a driver ([`Driver::add_feeder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeederId(u64);

type Feeders = Arc<Vec<(FeederId, Arc<dyn Feeder>)>>;

struct Shared {
    node: Mutex<Node>,
    ready: Condvar,
    waker: Arc<Waker>,
    fd: RawFd,
    /// The descriptors of the send and receive handles (the node's is
    /// `fd`), for [`Driver::retire_socket`].
    handle_fds: [RawFd; 2],
    stop: AtomicBool,
    loops: AtomicU64,
    /// Looks before a sleep that found work ([`Driver::looks_found`]).
    looks_found: AtomicU64,
    /// Threads blocked in `wait_completion` (changed under the node's
    /// lock): without any, the thread skips the condvar wake-up, a system
    /// call per round with completions.
    waiters: AtomicU64,
    /// A thread is sending: only it uses `tx`.
    sending: AtomicBool,
    /// Work was handed to the node that may not have been sent yet: the
    /// sender looks again before it lets go of `sending`.
    pending: AtomicBool,
    /// The sender's handle on the node's socket (taken only by the thread
    /// that set `sending`, so never waited for).
    tx: Mutex<RoceSocket>,
    /// The receiver's handle: the NIC thread's, or a driving consumer's
    /// (held across a receive round and its hand-over to the node, so
    /// datagrams reach the node in the order they were received).
    rx: Mutex<RoceSocket>,
    /// A consumer thread is in [`Driver::drive`]: the NIC thread does not
    /// receive.
    driven: AtomicBool,
    /// When a drive last began or ended (node clock, microseconds; 0:
    /// never).
    driven_at: AtomicU64,
    /// QPs whose completions a driving consumer received but left to the
    /// NIC thread's callbacks (not its own).
    handed: Mutex<Vec<QpHandle>>,
    /// The thread has work to do before it sleeps: completions a sender
    /// collected, or a timer sooner than its planned wake-up.
    posted: AtomicBool,
    /// The thread is about to sleep or sleeping in the kernel: only then
    /// does `posted` need the waker (a system call).
    sleeping: AtomicBool,
    /// When the thread plans to wake by itself, set under the node's lock
    /// when it computes it (the node's clock: microseconds since `epoch`,
    /// as the deadlines), 0 while it is awake and will compute it again:
    /// a sender compares its QPs' deadlines with it under the same lock.
    planned: AtomicU64,
    /// Until when the ACKs the thread built after its callbacks wait for a
    /// post to ride with (node clock, microseconds; 0: none held), set and
    /// cleared under the node's lock.
    acks_held_until: AtomicU64,
    /// Holds in a row whose ACKs left with no request beside them (by
    /// their deadline, or with a post that sent nothing, a receive): the
    /// consumer's answer, if any, comes too late to ride (a NIC daemon's
    /// client, a process away) or never (a sink of one-way SENDs). From
    /// [`HOLD_MISSES`] on, only every [`HOLD_PROBE`]th round holds.
    hold_misses: AtomicU64,
    /// Rounds that could have held since the last hold (for the probe).
    hold_skipped: AtomicU64,
    epoch: StdInstant,
    callback: Option<CompletionCallback>,
    /// The feeders, replaced (not changed) when one comes or goes, so
    /// the thread takes a snapshot per turn.
    feeders: Mutex<Feeders>,
    next_feeder: AtomicU64,
    /// Set when this is dropped: fields drop in declaration order, so the
    /// node (and its socket) is gone by then.
    released: SetOnDrop,
}

thread_local! {
    /// The driver whose thread this is (null on any other thread): a post
    /// made from its completion callbacks is sent after them.
    static DRIVING: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

/// Rounds of taking out and sending a post's batch before the posting
/// thread leaves what is still pending to the NIC thread (bounded work
/// for a poster while other threads keep posting).
const FLUSH_TURNS: usize = 8;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Node> {
        self.node.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, StdInstant::now())
    }

    /// A consumer drives now (for `driven_at`; never 0).
    fn note_drive(&self) {
        let now = self.now().total_micros().max(1);
        self.driven_at.store(now, Ordering::Relaxed);
    }

    /// Whether a consumer drives, or drove within `window` before `now`.
    fn driven_within(&self, now: Instant, window: Duration) -> bool {
        let last = self.driven_at.load(Ordering::Relaxed);
        self.driven.load(Ordering::SeqCst)
            || (last != 0 && now.total_micros().saturating_sub(last) < window.as_micros() as u64)
    }

    /// Has the thread look again before it sleeps (work left for it, the
    /// feeders changed), waking it if it sleeps.
    fn poke(&self) {
        self.posted.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) && !self.on_own_thread() {
            self.waker.wake();
        }
    }

    fn feeders(&self) -> Feeders {
        self.feeders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn on_own_thread(&self) -> bool {
        DRIVING.with(|d| std::ptr::eq(d.get(), self))
    }

    /// Under the node's lock, after work was handed to it from another
    /// thread: whether the NIC thread must do something before it sleeps
    /// (deliver completions, or wake sooner for a timer), noted in
    /// `posted`. Returns whether it must be woken for it (after the lock
    /// is let go: the waker is a system call).
    fn note_work(&self, node: &Node) -> bool {
        let planned = self.planned.load(Ordering::Relaxed);
        // On the node's own clock, as the thread computed its wake-up: a
        // deadline it already planned for is never "sooner".
        let sooner = planned != 0
            && node
                .next_deadline()
                .is_some_and(|d| d.total_micros() < planned);
        if !(node.has_ready() || sooner) {
            return false;
        }
        // Either the thread sees `posted` before it sleeps, or this sees
        // `sleeping` and wakes it (both SeqCst: one of the two loads
        // observes the other side's store).
        self.posted.store(true, Ordering::SeqCst);
        self.sleeping.load(Ordering::SeqCst) && !self.on_own_thread()
    }

    /// Sends what the node has to send, unless another thread is sending
    /// (it sends this too: `pending` is set). `held` is the node's lock
    /// when the caller has it.
    fn flush<'a>(&'a self, mut held: Option<MutexGuard<'a, Node>>) {
        for _ in 0..FLUSH_TURNS {
            if self.sending.swap(true, Ordering::SeqCst) {
                return;
            }
            self.pending.store(false, Ordering::SeqCst);
            let mut node = held.take().unwrap_or_else(|| self.lock());
            let mut batch = node.take_batch(self.now());
            // Held ACKs, if any, are in this batch: whether a request
            // rides with them tells whether holding pays.
            if self.acks_held_until.swap(0, Ordering::Relaxed) != 0 {
                let misses = match batch.only_acks() {
                    true => self.hold_misses.load(Ordering::Relaxed) + 1,
                    false => 0,
                };
                self.hold_misses.store(misses, Ordering::Relaxed);
            }
            if node.has_touched() {
                // A QP stopped at its send budget: another turn.
                self.pending.store(true, Ordering::SeqCst);
            }
            let wake = self.note_work(&node);
            drop(node);
            if wake {
                self.waker.wake();
            }
            if !batch.is_empty() {
                batch.send(&mut self.tx.lock().unwrap_or_else(|e| e.into_inner()));
                self.lock().finish_batch(batch);
            }
            // Whoever set `pending` before this store either found the
            // flag taken (and this sees `pending`) or takes it itself.
            self.sending.store(false, Ordering::SeqCst);
            if !self.pending.load(Ordering::SeqCst) {
                return;
            }
        }
        // Still more after the bounded turns: the NIC thread sends it.
        self.poke();
    }
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
/// itself (a datagram, a timer deadline, completions a sender collected,
/// the drop), so this is only a bound on a wake-up that went missing; it
/// was 100 ms, which made an idle node wake 10 times a second (a few per
/// cent of a core in a TCG guest).
const IDLE_SLEEP: Duration = Duration::from_secs(5);
/// Receive rounds per wake-up before sleeping again (bounded work).
const ROUNDS: usize = 16;

impl Driver {
    /// Starts the thread.
    ///
    /// # Errors
    /// The thread could not be spawned, or the socket's descriptor not
    /// duplicated (the thread receives through a handle of its own).
    pub fn start(node: Node, callback: Option<CompletionCallback>) -> std::io::Result<Driver> {
        let released = Released(Arc::new(Latch {
            done: Mutex::new(false),
            cond: Condvar::new(),
            thread: OnceLock::new(),
        }));
        let tx = node.socket_handle()?;
        let rx = node.socket_handle()?;
        let handle_fds = {
            use std::os::fd::AsRawFd;
            [tx.as_raw_fd(), rx.as_raw_fd()]
        };
        let rx = Mutex::new(rx);
        let shared = Arc::new(Shared {
            waker: node.waker(),
            fd: node.raw_fd(),
            handle_fds,
            node: Mutex::new(node),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            loops: AtomicU64::new(0),
            looks_found: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            sending: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            tx: Mutex::new(tx),
            rx,
            driven: AtomicBool::new(false),
            driven_at: AtomicU64::new(0),
            handed: Mutex::new(Vec::new()),
            posted: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            planned: AtomicU64::new(0),
            acks_held_until: AtomicU64::new(0),
            hold_misses: AtomicU64::new(0),
            hold_skipped: AtomicU64::new(0),
            epoch: StdInstant::now(),
            callback,
            feeders: Mutex::new(Arc::new(Vec::new())),
            next_feeder: AtomicU64::new(1),
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
        self.shared.lock()
    }

    /// Lets go of the node's socket: its three descriptors (the node's,
    /// the send and the receive handle) refer to an unbound socket from
    /// now on, so the bound one closes once nobody else holds it (a
    /// member of a shared port whose owner went, which must not stay in
    /// the port's group); the link is down, nothing more is sent or
    /// received. For good: a CA opened again binds anew.
    ///
    /// # Errors
    /// No socket for the swap, or `dup2` refused.
    pub fn retire_socket(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let s = &*self.shared;
        let local = self.inspect(|n| n.local_addr());
        let fresh = std::net::UdpSocket::bind(std::net::SocketAddr::new(
            match local {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
            },
            0,
        ))?;
        self.with_node(|n| n.set_link_up(false));
        for fd in [s.fd, s.handle_fds[0], s.handle_fds[1]] {
            // SAFETY: both descriptors are open (ours for the driver's
            // life, `fresh` until the end of this function); dup2 swaps
            // what `fd` refers to in one step.
            if unsafe { libc::dup2(fresh.as_raw_fd(), fd) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        s.poke();
        Ok(())
    }

    /// Runs `f` on the node (to post work, create QPs, read counters), then
    /// sends what it made from this thread (as Linux siw sends from
    /// `post_send`), unless another thread is sending, which then sends it
    /// too. The NIC thread is woken only when that made completions to
    /// deliver or armed a timer (a retransmission) before it would wake by
    /// itself. On the NIC thread (a completion callback) the post leaves
    /// once the callbacks are done, with the round's ACKs.
    pub fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        let s = &*self.shared;
        let mut node = self.lock();
        let r = f(&mut node);
        s.pending.store(true, Ordering::SeqCst);
        if s.on_own_thread() {
            return r;
        }
        s.flush(Some(node));
        r
    }

    /// Runs `f` on the node to read it (counters, what the port kept)
    /// without waking the thread: a reader asking often costs the NIC no
    /// wake-ups. Work handed to the node here waits for the next send; use
    /// [`Driver::with_node`] for that.
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

    /// Receives for the node on this thread, in the NIC thread's place:
    /// waits up to `timeout` for a datagram on the socket (looking without
    /// sleeping for the first `spin` of it), runs the
    /// receive round, and calls `here` for each QP that got completions;
    /// `here` delivers those of the caller's own QPs and says so, and the
    /// others go to the NIC thread's callbacks. Returns false, having done
    /// nothing, when another consumer drives or on the NIC thread itself;
    /// the caller then waits its own way.
    pub fn drive(
        &self,
        spin: Duration,
        timeout: Duration,
        here: impl Fn(QpHandle) -> bool,
    ) -> bool {
        let s = &*self.shared;
        if s.on_own_thread() || s.driven.swap(true, Ordering::SeqCst) {
            return false;
        }
        s.note_drive();
        if look_then_wait(s.fd, spin, timeout) {
            let ready = {
                let mut rx = s.rx.lock().unwrap_or_else(|e| e.into_inner());
                receive_rounds(s, Some(&mut rx), false)
            };
            if !ready.is_empty() {
                if s.waiters.load(Ordering::SeqCst) > 0 {
                    s.ready.notify_all();
                }
                let others: Vec<QpHandle> = ready.into_iter().filter(|qp| !here(*qp)).collect();
                if !others.is_empty() {
                    s.handed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(others);
                    s.posted.store(true, Ordering::SeqCst);
                    if s.sleeping.load(Ordering::SeqCst) {
                        s.waker.wake();
                    }
                }
                after_callbacks(s);
            }
        }
        s.note_drive();
        s.driven.store(false, Ordering::SeqCst);
        true
    }

    /// Whether the round's ACKs wait for a post to ride with ([`ACK_HOLD`]):
    /// false once [`HOLD_MISSES`] holds in a row had nothing ride (but
    /// for the probe every [`HOLD_PROBE`]th round).
    pub fn holds_acks(&self) -> bool {
        self.shared.hold_misses.load(Ordering::Relaxed) < HOLD_MISSES
    }

    /// Has the NIC thread take in `f`'s work on every turn and wake at its
    /// descriptor (at most [`roce_udp::WAIT_ALSO_MAX`] feeders wake it so;
    /// the others are asked at its other wake-ups).
    pub fn add_feeder(&self, f: Arc<dyn Feeder>) -> FeederId {
        let s = &*self.shared;
        let id = FeederId(s.next_feeder.fetch_add(1, Ordering::Relaxed));
        {
            let mut all = s.feeders.lock().unwrap_or_else(|e| e.into_inner());
            let mut next = Vec::clone(&all);
            next.push((id, f));
            *all = Arc::new(next);
        }
        s.poke();
        id
    }

    /// Stops asking feeder `id` (the thread may be in its last call).
    pub fn remove_feeder(&self, id: FeederId) {
        let s = &*self.shared;
        {
            let mut all = s.feeders.lock().unwrap_or_else(|e| e.into_inner());
            let next: Vec<_> = all.iter().filter(|(i, _)| *i != id).cloned().collect();
            *all = Arc::new(next);
        }
        s.poke();
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

    /// Looks before a sleep that found a datagram or a post, so the
    /// thread did not sleep ([`NIC_SPIN_MAX`]).
    pub fn looks_found(&self) -> u64 {
        self.shared.looks_found.load(Ordering::Relaxed)
    }
}

/// Whether `fd` became readable: looked at without sleeping (a `ppoll`
/// that does not block) for up to `spin`, then waited for up to `timeout`.
fn look_then_wait(fd: std::os::fd::RawFd, spin: Duration, timeout: Duration) -> bool {
    look(fd, spin, || false) || wait_readable(fd, None, timeout).unwrap_or(false)
}

/// Whether `fd` became readable or `also` said yes while looked at
/// without sleeping (a `ppoll` that does not block) for up to `spin`.
fn look(fd: std::os::fd::RawFd, spin: Duration, also: impl Fn() -> bool) -> bool {
    if spin.is_zero() {
        return false;
    }
    let until = StdInstant::now() + spin;
    loop {
        if also() || wait_readable(fd, None, Duration::ZERO).unwrap_or(false) {
            return true;
        }
        if StdInstant::now() >= until {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// Receive rounds: up to [`ROUNDS`] while each stops at its budget, with
/// `rx` (none: no receiving, only the node's timers and what senders left
/// ready), until one makes completions to deliver; returns their QPs, the
/// round's ACKs held back for the callbacks' posts to ride with. `nic`:
/// run by the NIC thread, which then has seen the work noted for it.
fn receive_rounds(s: &Shared, mut rx: Option<&mut RoceSocket>, nic: bool) -> Vec<QpHandle> {
    // Another round only when this one stopped at a budget: an empty
    // receive would cost a system call, and what arrives meanwhile
    // wakes the sleep at once.
    for _ in 0..ROUNDS {
        let now = s.now();
        // Received without the lock, taken for the first datagram.
        let mut held = None;
        let (n, gro) = match rx.as_deref_mut() {
            Some(rx) => {
                let gro_before = rx.stats().gro_buffers;
                let n = rx.recv_batch(RX_BUDGET, |r, data| {
                    held.get_or_insert_with(|| s.lock())
                        .deliver_one(now, r, data)
                });
                (n, rx.stats().gro_buffers - gro_before)
            }
            None => (0, 0),
        };
        let mut node = held.unwrap_or_else(|| s.lock());
        if nic {
            // Work noted for the thread before this point is seen by
            // this round.
            s.posted.store(false, Ordering::SeqCst);
            s.planned.store(0, Ordering::Relaxed);
        }
        node.begin_round(n, gro);
        node.after_receive(now);
        let more = node.has_more();
        if node.has_ready() {
            // What the round built (the ACKs of what it received) is
            // held back until the callbacks are done, so it leaves in
            // one batch with what they post in answer (a target's ACK
            // of a command with the command's data and response), and
            // the peer wakes once for all of them.
            return node.take_ready();
        }
        s.pending.store(true, Ordering::SeqCst);
        s.flush(Some(node));
        if !more || rx.is_none() {
            break;
        }
    }
    Vec::new()
}

/// After the callbacks of a round's completions: what they posted is
/// built and sent with the round's ACKs, or, when there are only ACKs,
/// those wait up to [`ACK_HOLD`] for a post to ride with.
fn after_callbacks(s: &Shared) {
    s.pending.store(true, Ordering::SeqCst);
    let mut node = s.lock();
    let now = s.now();
    node.build_pending(now);
    if !hold_acks(s, &node, now) {
        s.flush(Some(node));
        return;
    }
    if s.on_own_thread() {
        return;
    }
    // A consumer held them: the NIC thread must wake by their deadline.
    let until = s.acks_held_until.load(Ordering::Relaxed);
    let planned = s.planned.load(Ordering::Relaxed);
    if planned != 0 && planned > until {
        s.posted.store(true, Ordering::SeqCst);
        drop(node);
        if s.sleeping.load(Ordering::SeqCst) {
            s.waker.wake();
        }
    }
}

/// A consumer whose last drive is this recent is still at it: the NIC
/// thread leaves its socket alone even between two of its drives.
const CONSUMER_ACTIVE: Duration = Duration::from_micros(50);

/// How long after a consumer's drive the NIC thread keeps leaving the
/// socket to consumers (looking itself every [`ACK_HOLD`]): a consumer
/// waiting for one answer after another drives again within microseconds.
pub const DRIVEN_RECENT: Duration = Duration::from_millis(1);

/// The NIC thread.
fn run(s: &Shared) {
    DRIVING.with(|d| d.set(s));
    let mut spin = NicSpin::default();
    // How long the thread sleeps while it leaves the socket to consumers,
    // and whether its last sleep was one of those.
    let mut hold = ACK_HOLD;
    let mut left = false;
    while !s.stop.load(Ordering::Acquire) {
        s.loops.fetch_add(1, Ordering::Relaxed);
        // A consumer that drove a moment ago drives again within
        // microseconds: what its socket holds is its to take.
        let woke = s.now();
        let active = s.driven_within(woke, CONSUMER_ACTIVE);
        let recent = s.driven_within(woke, DRIVEN_RECENT);
        let mut ready = if active {
            receive_rounds(s, None, true)
        } else {
            let mut rx = s.rx.lock().unwrap_or_else(|e| e.into_inner());
            receive_rounds(s, Some(&mut rx), true)
        };
        ready.append(&mut s.handed.lock().unwrap_or_else(|e| e.into_inner()));
        // A wake while consumers drive that finds them still at it: the
        // next comes later (up to DRIVEN_RECENT); one that finds them gone
        // comes at ACK_HOLD again.
        if std::mem::take(&mut left) {
            hold = match recent {
                true => (hold * 2).min(DRIVEN_RECENT),
                false => ACK_HOLD,
            };
        }
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
        }
        // The feeders' work, after the callbacks (a receive they re-post
        // in answer to a completion) and sent with the round's ACKs.
        let feeders = s.feeders();
        let mut fed = Fed::default();
        for (_, f) in feeders.iter() {
            let r = f.feed();
            fed.taken += r.taken;
            fed.stalled |= r.stalled;
        }
        if fed.taken > 0 {
            // What the consumers answered is here (a receive re-posted
            // sends nothing): the round's ACKs go with it, or now.
            s.pending.store(true, Ordering::SeqCst);
            s.flush(None);
        } else if !ready.is_empty() {
            after_callbacks(s);
        }
        let node = s.lock();
        if node.has_ready() || s.posted.load(Ordering::SeqCst) || fed.taken > 0 {
            continue;
        }
        // What was sent may have armed a retransmission timer; held ACKs
        // leave by their own deadline.
        let now = s.now();
        let held = s.acks_held_until.load(Ordering::Relaxed);
        let acks = (held != 0).then(|| Instant::from_micros(held));
        let mut sleep = node
            .next_deadline()
            .into_iter()
            .chain(acks)
            .min()
            .map_or(IDLE_SLEEP, |d| {
                d.saturating_since(now).to_std().min(IDLE_SLEEP)
            });
        // Consumers drive (or did a moment ago): the socket is theirs.
        let leave_socket = s.driven_within(now, DRIVEN_RECENT);
        if leave_socket {
            sleep = sleep.min(hold);
        } else {
            hold = ACK_HOLD;
        }
        // A stalled feeder, or one past those whose descriptor the
        // sleep watches, is asked again soon.
        if fed.stalled || feeders.len() > roce_udp::WAIT_ALSO_MAX {
            sleep = sleep.min(FEED_RETRY);
        }
        if sleep.is_zero() {
            continue;
        }
        left = leave_socket;
        s.planned.store(
            now.total_micros() + sleep.as_micros() as u64,
            Ordering::Relaxed,
        );
        drop(node);
        // Only the socket and posts wake a spin: with feeders (the NIC
        // daemon's rings) it would miss their doorbells.
        if !leave_socket && feeders.is_empty() && spin_for_work(s, &mut spin, sleep) {
            continue;
        }
        s.sleeping.store(true, Ordering::SeqCst);
        if !s.posted.load(Ordering::SeqCst) {
            let fd = if leave_socket { -1 } else { s.fd };
            // Every feeder sets its producers' flags before any sleep.
            let came = feeders.iter().fold(false, |c, (_, f)| f.sleeping() | c);
            if !came {
                let mut also = [-1; roce_udp::WAIT_ALSO_MAX];
                for (slot, (_, f)) in also.iter_mut().zip(feeders.iter()) {
                    *slot = f.fd();
                }
                let n = feeders.len().min(also.len());
                let _ = wait_readable_or(fd, Some(&s.waker), &also[..n], sleep);
            }
            feeders.iter().for_each(|(_, f)| f.awake());
        }
        s.sleeping.store(false, Ordering::SeqCst);
    }
}

/// The longest the NIC thread looks at its socket and for posts before it
/// sleeps ([`spin_for_work`]).
pub const NIC_SPIN_MAX: Duration = Duration::from_micros(50);

/// Looks in a row that found nothing, after which the NIC thread sleeps
/// at once (the traffic stopped, or comes slower than a look lasts) but
/// for one look in [`SPIN_PROBE`].
const SPIN_MISSES: u32 = 4;

/// While looks are off, one chance in this many to look, to learn whether
/// datagrams come within one again.
const SPIN_PROBE: u32 = 32;

/// Whether the NIC thread looks before it sleeps: for the whole
/// [`NIC_SPIN_MAX`] while its looks keep finding work, not after
/// [`SPIN_MISSES`] found none in a row. (A budget learned from how soon
/// each look found a datagram, as consumers learn theirs, settled around
/// half the gains of looking for the whole time: under load the gaps
/// between rounds vary more than a short budget covers.)
#[derive(Debug, Default)]
struct NicSpin {
    misses: u32,
    chances: u32,
}

impl NicSpin {
    fn look(&mut self) -> bool {
        if self.misses < SPIN_MISSES {
            return true;
        }
        self.chances = self.chances.wrapping_add(1);
        self.chances.is_multiple_of(SPIN_PROBE)
    }

    fn learn(&mut self, found: bool) {
        self.misses = if found {
            0
        } else {
            self.misses.saturating_add(1)
        };
    }
}

/// Before the NIC thread sleeps for up to `sleep`: whether a datagram or a
/// post came while it looked without sleeping, for up to [`NIC_SPIN_MAX`]
/// ([`NicSpin`] says whether to look at all). Under load the next datagram
/// often comes within microseconds, and the sleep would cost the sender a
/// wake-up of this thread inside its `sendmmsg` and this thread two
/// context switches (4 KiB randread QD32 over soft RoCE in one process: a
/// fifth of the machine's time in `sock_def_readable`'s wake-up and
/// `ppoll`'s switch). The thread is not marked sleeping meanwhile, so a
/// post sets only its flag, which the look sees.
fn spin_for_work(s: &Shared, spin: &mut NicSpin, sleep: Duration) -> bool {
    if !spin.look() {
        return false;
    }
    let found = look(s.fd, NIC_SPIN_MAX.min(sleep), || {
        s.posted.load(Ordering::SeqCst)
    });
    spin.learn(found);
    if found {
        s.looks_found.fetch_add(1, Ordering::Relaxed);
    }
    found
}

/// How long the ACKs a round made wait after its callbacks for a post to
/// ride with. A consumer woken by a completion usually posts its next
/// request within microseconds; its ACK then leaves in the same send, and
/// the peer wakes once for both. Far below any retransmission timeout
/// (IBA 9.7.6.1.3: the least is 8 µs times 2^timeout, and peers use 14 or
/// more, ~67 ms), and longer than a loopback round trip, so the thread
/// seldom wakes for the deadline alone.
const ACK_HOLD: Duration = Duration::from_micros(200);

/// Holds in a row that nothing rode with, after which holding stops but
/// for a probe now and then ([`HOLD_PROBE`]).
const HOLD_MISSES: u64 = 2;

/// While holding is off, one round in this many that could hold does, to
/// learn whether answers ride again.
const HOLD_PROBE: u64 = 32;

/// After the callbacks, under the node's lock with what they posted built:
/// whether the outgoing batch is plain ACKs that may wait for a post to
/// ride with ([`ACK_HOLD`], from the first such round on: a hold is never
/// extended), as long as recent holds had a request ride with them
/// ([`HOLD_MISSES`]). A posting thread's send takes them along.
fn hold_acks(s: &Shared, node: &Node, now: Instant) -> bool {
    if !node.only_acks_out() {
        return false;
    }
    let held = s.acks_held_until.load(Ordering::Relaxed);
    if held == 0 {
        if s.hold_misses.load(Ordering::Relaxed) >= HOLD_MISSES {
            let skipped = s.hold_skipped.fetch_add(1, Ordering::Relaxed) + 1;
            if skipped < HOLD_PROBE {
                return false;
            }
        }
        s.hold_skipped.store(0, Ordering::Relaxed);
        let until = now.total_micros() + ACK_HOLD.as_micros() as u64;
        s.acks_held_until.store(until, Ordering::Relaxed);
        return true;
    }
    held > now.total_micros()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// Voluntary context switches of the calling thread so far.
    fn voluntary_switches() -> i64 {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: a valid out-pointer for getrusage.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: getrusage filled it.
        unsafe { ru.assume_init() }.ru_nvcsw
    }

    #[test]
    fn the_nic_looks_while_looks_find_work_and_probes_after_misses() {
        let mut s = NicSpin::default();
        for _ in 0..100 {
            assert!(s.look(), "looks while they find work");
            s.learn(true);
        }
        for _ in 0..SPIN_MISSES {
            assert!(s.look(), "a few misses in a row still look");
            s.learn(false);
        }
        let looks = (0..SPIN_PROBE * 4).filter(|_| s.look()).count();
        assert_eq!(looks, 4, "after the misses, one look in {SPIN_PROBE}");
        s.learn(true);
        assert!(s.look(), "a probe that found work brings the looks back");
    }

    #[test]
    fn a_datagram_within_the_spin_is_seen_without_sleeping() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let (go, ready) = std::sync::mpsc::channel::<()>();
        let sender = std::thread::spawn(move || {
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            ready.recv().unwrap();
            std::thread::sleep(Duration::from_millis(5));
            tx.send_to(b"x", to).unwrap();
        });
        let before = voluntary_switches();
        go.send(()).unwrap();
        let seen = look_then_wait(rx.as_raw_fd(), Duration::from_secs(10), Duration::ZERO);
        let slept = voluntary_switches() - before;
        sender.join().unwrap();
        assert!(seen, "the datagram came within the spin");
        assert_eq!(slept, 0, "the spin looked without sleeping");
    }

    #[test]
    fn after_the_spin_the_wait_sleeps_until_its_timeout() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let start = StdInstant::now();
        let before = voluntary_switches();
        let seen = look_then_wait(
            rx.as_raw_fd(),
            Duration::from_millis(2),
            Duration::from_millis(20),
        );
        assert!(!seen, "nothing was sent");
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(voluntary_switches() > before, "the wait slept");
    }
}
