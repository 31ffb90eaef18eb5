//! The daemon's side of the shared-memory rings (protocol version 2).
//!
//! Work queues (SQ, RQ, SRQ): one poller thread per connection takes
//! what the client produced, checks every entry as a post on the socket
//! is checked ([`Server::send_wr`]: handles the client's own, inline
//! data inside its registrations) and posts it to the provider: in each
//! pass the receive rings before the sends whose producer index it read
//! before them, so a receive posted before a send is the NIC's before
//! the send leaves. It spins
//! a while ([`Server::set_ring_spin`]) after its last work, then sets
//! [`flags::SLEEPING`] in every ring, looks once more, and sleeps on the
//! client's doorbell eventfd (at most [`SLEEP_MAX`], so a connection's
//! end or a bogus descriptor never holds it).
//!
//! A ring the client broke (an index that jumped past the capacity, an
//! entry that does not decode, a handle not its own, inline data outside
//! its memory, a WR the provider refuses) is dead: [`flags::DEAD`] set,
//! the QP moved to the error state and a `QpFatal` event sent; the
//! entries after it are not taken. The client then posts on the socket.
//! Nothing a client writes reaches another client or panics the daemon:
//! indices are read once per pass and checked, entries copied out once
//! and decoded from the copy.
//!
//! CQs: the provider's CQ stays armed by the daemon; its callback (on
//! the NIC's thread, no lock of the provider held) moves completions
//! into the ring at once ([`CqRing::pump`]), re-arms and looks again. The
//! ring holds the CQ's `cqe` entries, so a consumer that lets more
//! pile up overruns as with the provider's own CQ (`CqError`). The
//! client arms `req_notify_cq` by bumping the ring's arm word; a pump
//! that moves a completion after a bump sends `Completion` on the event
//! socket. A solicited-only arm goes on the socket and turns the ring
//! into [`flags::DELEGATED`] for good: completions stay in the
//! provider's CQ, and the client polls them on the socket once the ring
//! is empty (a `WorkCompletion` does not say whether it was solicited).
//!
//! Waiters: a client that must know its receive (or inline send) was
//! taken, or that waits for a completion, sleeps on a futex on the
//! ring's consumer (producer) index with [`flags::WAITER`] set; the
//! drain (pump) wakes it after it moves the index.
//!
//! Locking: each ring's state has a mutex. A work queue's comes before
//! a CQ's, never after: a drain (and a socket verb served after it)
//! holds its work queue's while it posts or moves the QP to ERR, whose
//! completion callbacks (inline, with soft RoCE) pump CQ rings; a pump
//! holds its CQ's across `poll_cq` and `req_notify_cq` only, which call
//! nothing back.

use super::{bad, Outbox, Server};
use crate::proto::{self, Event, Kind};
use crate::ring::{decode_entry, encode_entry, flags, Ring};
use rdma_types::{QpState, WcOpcode, WcStatus};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use verbs::{
    AsyncEvent, AsyncEventKind, CaHandle, CqHandle, Handle, Provider, QpAttr, QpHandle, RecvWr,
    SendWr, SrqHandle, VerbsError, WorkCompletion,
};

/// Longest sleep of the poller between looks at its stop flag.
pub(super) const SLEEP_MAX: Duration = Duration::from_millis(200);

/// Sleep of a poller whose provider queue was full (it retries then).
const STALL_RETRY: Duration = Duration::from_millis(1);

/// Most WRs posted to the provider in one call.
const BATCH: usize = 32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's rings.
pub(super) struct ConnRings {
    provider: Arc<dyn Provider>,
    out: Arc<Outbox>,
    /// CQ rings (copied on change, so a callback takes a snapshot).
    cqs: Mutex<Arc<Vec<Arc<CqRing>>>>,
    /// Work queue rings (likewise, for the poller).
    wqs: Mutex<Arc<Vec<Arc<WqRing>>>>,
    doorbell: Mutex<Option<Arc<OwnedFd>>>,
    stop: AtomicBool,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl ConnRings {
    pub(super) fn new(provider: Arc<dyn Provider>, out: Arc<Outbox>) -> Arc<ConnRings> {
        Arc::new(ConnRings {
            provider,
            out,
            cqs: Mutex::new(Arc::new(Vec::new())),
            wqs: Mutex::new(Arc::new(Vec::new())),
            doorbell: Mutex::new(None),
            stop: AtomicBool::new(false),
            poller: Mutex::new(None),
        })
    }

    /// Takes the client's doorbell and starts the poller.
    pub(super) fn start(
        self: &Arc<Self>,
        server: &Arc<Server>,
        owner: u64,
        fd: OwnedFd,
    ) -> verbs::Result<()> {
        let mut d = lock(&self.doorbell);
        if d.is_some() {
            return Err(bad("the doorbell was already given"));
        }
        // SAFETY: plain calls on a descriptor we own; no memory passed.
        let ok = unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(bad("the doorbell descriptor cannot be made non-blocking"));
        }
        let fd = Arc::new(fd);
        *d = Some(fd.clone());
        let (me, server) = (self.clone(), server.clone());
        let h = std::thread::Builder::new()
            .name("nicd-rings".into())
            .spawn(move || me.poll_loop(&server, owner, &fd))
            .map_err(|_| VerbsError::OutOfResources("nicd threads"))?;
        *lock(&self.poller) = Some(h);
        Ok(())
    }

    /// Whether the client gave its doorbell (so rings may be made).
    pub(super) fn has_doorbell(&self) -> bool {
        lock(&self.doorbell).is_some()
    }

    /// Stops the poller and waits for it (the connection ended).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
        if let Some(h) = lock(&self.poller).take() {
            let _ = h.join();
        }
    }

    /// Wakes the poller.
    fn kick(&self) {
        if let Some(fd) = &*lock(&self.doorbell) {
            ring_doorbell(fd);
        }
    }

    pub(super) fn add_cq(&self, cq: Arc<CqRing>) {
        let mut g = lock(&self.cqs);
        let mut v = (**g).clone();
        v.push(cq);
        *g = Arc::new(v);
    }

    pub(super) fn cq(&self, index: u32) -> Option<Arc<CqRing>> {
        lock(&self.cqs).iter().find(|c| c.index == index).cloned()
    }

    pub(super) fn remove_cq(&self, index: u32) -> Option<Arc<CqRing>> {
        let mut g = lock(&self.cqs);
        let c = g.iter().find(|c| c.index == index).cloned()?;
        *g = Arc::new(g.iter().filter(|c| c.index != index).cloned().collect());
        Some(c)
    }

    pub(super) fn add_wq(&self, wq: Arc<WqRing>) {
        {
            let mut g = lock(&self.wqs);
            let mut v = (**g).clone();
            v.push(wq);
            *g = Arc::new(v);
        }
        self.kick();
    }

    /// The ring of `kind` of the client's object `index`.
    pub(super) fn wq(&self, index: u32, kind: WqKind) -> Option<Arc<WqRing>> {
        let g = lock(&self.wqs);
        g.iter()
            .find(|w| w.index == index && w.kind.same(kind))
            .cloned()
    }

    /// Takes the rings of object `index` out of the poller's hands
    /// (before it is destroyed); [`ConnRings::add_wq`] puts them back.
    pub(super) fn remove_wqs(&self, index: u32) -> Vec<Arc<WqRing>> {
        let mut g = lock(&self.wqs);
        let gone: Vec<_> = g.iter().filter(|w| w.index == index).cloned().collect();
        *g = Arc::new(g.iter().filter(|w| w.index != index).cloned().collect());
        // A pass of the poller in progress finishes with the ring's lock.
        for w in &gone {
            drop(lock(&w.st));
        }
        gone
    }

    /// The provider's callback for CQ context `ctx` of the client's CA
    /// `ca`: pumps its rings; `true` when the client must hear of it on
    /// the socket (no ring of that context, or a delegated one).
    pub(super) fn on_completion(&self, ca: CaHandle, ctx: u64) -> bool {
        let cqs = lock(&self.cqs).clone();
        let mut forward = true;
        for c in cqs.iter().filter(|c| c.ca == ca && c.ctx == ctx) {
            forward &= c.callback(&*self.provider, &self.out);
        }
        forward
    }

    fn poll_loop(&self, server: &Server, owner: u64, doorbell: &OwnedFd) {
        let mut idle = Instant::now();
        let mut sends = Vec::new();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let wqs = lock(&self.wqs).clone();
            let mut work = 0;
            let mut stalled = false;
            // Receives before sends: each SQ's producer index is read
            // first, then every receive ring is taken, then each SQ up
            // to the index read. A receive the client posted before a
            // send is the NIC's before that send leaves, so a peer that
            // answers the send finds it (and the client's send need not
            // wait for its receives to be taken).
            sends.clear();
            sends.extend(wqs.iter().map(|w| w.ring.producer()));
            for sends_now in [false, true] {
                for (w, &upto) in wqs.iter().zip(&sends) {
                    let send = matches!(w.kind, WqKind::Send { .. });
                    if send != sends_now {
                        continue;
                    }
                    let upto = send.then_some(upto);
                    let (n, s) = w.drain(server, &*self.provider, &self.out, owner, upto);
                    work += n;
                    stalled |= s;
                }
            }
            if work > 0 {
                idle = Instant::now();
                continue;
            }
            if !stalled && idle.elapsed() < server.ring_spin() {
                std::hint::spin_loop();
                continue;
            }
            // Dekker with the client: flag, then look; it stores its
            // producer index, then reads the flag.
            for w in wqs.iter() {
                w.ring.clear_flags(flags::RUNG);
                w.ring.set_flags(flags::SLEEPING);
            }
            fence(Ordering::SeqCst);
            if !wqs.iter().any(|w| w.has_work()) {
                let wait = if stalled { STALL_RETRY } else { SLEEP_MAX };
                sleep_on(doorbell, wait);
            }
            let awake = flags::SLEEPING | flags::RUNG;
            wqs.iter().for_each(|w| w.ring.clear_flags(awake));
            idle = Instant::now();
        }
    }
}

/// Writes 1 to an eventfd (a full or bogus one: nothing to do).
pub(super) fn ring_doorbell(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local array to our descriptor.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// Waits until `fd` is readable or `wait` passes, then empties it.
fn sleep_on(fd: &OwnedFd, wait: Duration) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the call's duration.
    let _ = unsafe { libc::poll(&mut p, 1, wait.as_millis().max(1) as libc::c_int) };
    let mut b = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local array; the
    // descriptor is non-blocking.
    let _ = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
}

/// What a work queue ring feeds.
#[derive(Debug, Clone, Copy)]
pub(super) enum WqKind {
    /// A QP's SQ; the client's index of its PD.
    Send { pd: u32 },
    /// A QP's RQ.
    Recv,
    /// An SRQ.
    Srq,
}

impl WqKind {
    fn same(self, o: WqKind) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&o)
    }
}

struct WqState {
    /// The daemon's own consumer index (the shared one is only written).
    cons: u64,
    dead: bool,
    entry: Vec<u8>,
}

/// A work queue's ring (see the module docs).
pub(super) struct WqRing {
    ring: Ring,
    kind: WqKind,
    /// The provider's QP or SRQ.
    raw: Handle,
    /// The client's index of the QP or SRQ.
    index: u32,
    /// The client's CA and the QP's context, for its `QpFatal`.
    ca: CaHandle,
    ctx: u64,
    st: Mutex<WqState>,
}

impl WqRing {
    pub(super) fn new(
        ring: Ring,
        kind: WqKind,
        raw: Handle,
        index: u32,
        ca: CaHandle,
        ctx: u64,
    ) -> Arc<WqRing> {
        // Until the poller has looked at it, posts ring the doorbell.
        ring.set_flags(flags::SLEEPING);
        let entry = vec![0; ring.spec().entry_size as usize];
        Arc::new(WqRing {
            ring,
            kind,
            raw,
            index,
            ca,
            ctx,
            st: Mutex::new(WqState {
                cons: 0,
                dead: false,
                entry,
            }),
        })
    }

    fn has_work(&self) -> bool {
        let st = lock(&self.st);
        !st.dead && self.ring.producer() != st.cons
    }

    /// Takes what the client produced (up to producer index `upto`
    /// when given, an index read earlier): how many entries, and
    /// whether the provider's queue was full.
    fn drain(
        &self,
        server: &Server,
        p: &dyn Provider,
        out: &Outbox,
        owner: u64,
        upto: Option<u64>,
    ) -> (usize, bool) {
        let mut st = lock(&self.st);
        self.drain_locked(&mut st, server, p, out, owner, upto)
    }

    /// Runs `then` (a post or `modify_qp` on the socket) after what the
    /// ring holds, so they keep their order; a post (`is_post`) is
    /// refused while ring entries wait for room in the provider's queue.
    pub(super) fn after_drain<T>(
        &self,
        server: &Server,
        owner: u64,
        out: &Outbox,
        is_post: bool,
        then: impl FnOnce() -> verbs::Result<T>,
    ) -> verbs::Result<T> {
        let mut st = lock(&self.st);
        let p = &*server.provider;
        let (_, stalled) = self.drain_locked(&mut st, server, p, out, owner, None);
        if stalled && is_post {
            return Err(VerbsError::BadWr {
                index: 0,
                cause: Box::new(VerbsError::QueueFull),
            });
        }
        then()
    }

    fn drain_locked(
        &self,
        st: &mut WqState,
        server: &Server,
        p: &dyn Provider,
        out: &Outbox,
        owner: u64,
        upto: Option<u64>,
    ) -> (usize, bool) {
        if st.dead {
            return (0, false);
        }
        let prod = match upto {
            // A socket verb's drain took more meanwhile.
            Some(i) if i <= st.cons => return (0, false),
            Some(i) => i,
            None => self.ring.producer(),
        };
        let avail = prod.wrapping_sub(st.cons);
        if avail > self.ring.spec().capacity as u64 {
            let why = format!(
                "producer index went from {} to {prod}, past the ring's {} entries",
                st.cons,
                self.ring.spec().capacity
            );
            self.kill(st, server, p, out, &why);
            return (0, false);
        }
        let mut done = 0;
        while st.cons != prod {
            let n = (prod - st.cons).min(BATCH as u64);
            let (posted, outcome) = match self.kind {
                WqKind::Send { pd } => {
                    let mut wrs = Vec::with_capacity(n as usize);
                    let mut bad_entry = None;
                    for i in st.cons..st.cons + n {
                        self.ring.read(i, &mut st.entry);
                        let w = decode_entry::<SendWr>(&st.entry)
                            .map_err(|e| bad(format!("send entry {i}: {e}")))
                            .and_then(|w| server.send_wr(owner, pd, w));
                        match w {
                            Ok(w) => wrs.push(w),
                            Err(e) => {
                                bad_entry = Some(format!("send entry {i}: {e}"));
                                break;
                            }
                        }
                    }
                    let r = post_all(wrs.len(), || p.post_send(QpHandle(self.raw), &wrs));
                    (r.0, r.1.or(bad_entry.map(Outcome::Bad)))
                }
                WqKind::Recv | WqKind::Srq => {
                    let mut wrs = Vec::with_capacity(n as usize);
                    let mut bad_entry = None;
                    for i in st.cons..st.cons + n {
                        self.ring.read(i, &mut st.entry);
                        match decode_entry::<RecvWr>(&st.entry) {
                            Ok(w) => wrs.push(w),
                            Err(e) => {
                                bad_entry = Some(format!("receive entry {i}: {e}"));
                                break;
                            }
                        }
                    }
                    let r = post_all(wrs.len(), || match self.kind {
                        WqKind::Srq => p.post_srq_recv(SrqHandle(self.raw), &wrs),
                        _ => p.post_recv(QpHandle(self.raw), &wrs),
                    });
                    (r.0, r.1.or(bad_entry.map(Outcome::Bad)))
                }
            };
            st.cons += posted as u64;
            done += posted;
            self.ring.set_consumer(st.cons);
            // Dekker with a client that waits: index, then its flag.
            fence(Ordering::SeqCst);
            if posted > 0 && self.ring.flags() & flags::WAITER != 0 {
                self.ring.clear_flags(flags::WAITER);
                self.ring.wake_consumer();
            }
            match outcome {
                None => {}
                Some(Outcome::Full) => return (done, true),
                Some(Outcome::Bad(why)) => {
                    self.kill(st, server, p, out, &why);
                    return (done, false);
                }
            }
        }
        (done, false)
    }

    /// The client broke this ring: stop taking it, move the QP to the
    /// error state and tell the client (see the module docs).
    fn kill(&self, st: &mut WqState, server: &Server, p: &dyn Provider, out: &Outbox, why: &str) {
        st.dead = true;
        let _ = self.ring.set_flags(flags::DEAD);
        self.ring.wake_consumer();
        server.ring_refusals.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("nicd: a client's {:?} ring refused: {why}", self.kind);
        if matches!(self.kind, WqKind::Srq) {
            return;
        }
        let err = QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        };
        let _ = p.modify_qp(QpHandle(self.raw), &err);
        let e = Event::Async {
            ca: self.ca,
            event: AsyncEvent {
                kind: AsyncEventKind::QpFatal,
                ctx: self.ctx,
                port: None,
            },
        };
        out.send(proto::frame(Kind::Event, 0, &e));
    }
}

/// Why a drain stopped early.
enum Outcome {
    /// The provider's queue is full: retried later.
    Full,
    /// A bad entry or a refused WR: the ring dies.
    Bad(String),
}

/// Posts `n` WRs with `post`: how many the provider took, and why it
/// stopped if it did.
fn post_all(n: usize, post: impl FnOnce() -> verbs::Result<()>) -> (usize, Option<Outcome>) {
    if n == 0 {
        return (0, None);
    }
    match post() {
        Ok(()) => (n, None),
        Err(VerbsError::QueueFull) => (0, Some(Outcome::Full)),
        Err(VerbsError::BadWr { index, cause }) if *cause == VerbsError::QueueFull => {
            (index.min(n), Some(Outcome::Full))
        }
        Err(VerbsError::BadWr { index, cause }) => (
            index.min(n),
            Some(Outcome::Bad(format!("the NIC refused a WR: {cause}"))),
        ),
        Err(e) => (
            0,
            Some(Outcome::Bad(format!("the NIC refused the post: {e}"))),
        ),
    }
}

struct CqState {
    /// The daemon's producer index.
    prod: u64,
    /// The client's arm sequence last answered.
    fired: u64,
    /// Armed on the socket (a client arming that way).
    socket_armed: bool,
    delegated: bool,
    /// Delegated while the daemon's own arm (any completion) was set:
    /// the provider kept it (a solicited-only arm never narrows one), so
    /// its next callback is the daemon's, not the client's.
    stale_any: bool,
    dead: bool,
    scratch: Vec<WorkCompletion>,
    entry: Vec<u8>,
}

/// A CQ's ring (see the module docs).
pub(super) struct CqRing {
    ring: Ring,
    raw: CqHandle,
    /// The client's index of the CQ, its CA and the CQ's context.
    index: u32,
    ca: CaHandle,
    ctx: u64,
    st: Mutex<CqState>,
    changed: Condvar,
}

impl CqRing {
    pub(super) fn new(ring: Ring, raw: CqHandle, index: u32, ca: CaHandle, ctx: u64) -> CqRing {
        let blank = WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0);
        let n = (ring.spec().capacity as usize).min(BATCH);
        CqRing {
            ring,
            raw,
            index,
            ca,
            ctx,
            st: Mutex::new(CqState {
                prod: 0,
                fired: 0,
                socket_armed: false,
                delegated: false,
                stale_any: false,
                dead: false,
                scratch: vec![blank; n],
                entry: Vec::with_capacity(64),
            }),
            changed: Condvar::new(),
        }
    }

    /// Moves the provider's completions into the ring and keeps the
    /// provider armed (a delegated ring is left alone).
    pub(super) fn pump(&self, p: &dyn Provider, out: &Outbox) {
        let mut st = lock(&self.st);
        if !st.delegated {
            self.pump_locked(&mut st, p, out);
        }
    }

    /// The provider's callback: a pump; `true` when it answers the
    /// client's own arm of a delegated ring (the client hears of it).
    fn callback(&self, p: &dyn Provider, out: &Outbox) -> bool {
        let mut st = lock(&self.st);
        if !st.delegated {
            self.pump_locked(&mut st, p, out);
            return false;
        }
        if st.stale_any {
            // The daemon's arm fired; the client's, merged into it, is
            // set again. A solicited completion that fired it is missed
            // (the provider does not say which it was): the price of
            // arming a ring CQ solicited-only.
            st.stale_any = false;
            let _ = p.req_notify_cq(self.raw, true);
            return false;
        }
        true
    }

    fn pump_locked(&self, st: &mut CqState, p: &dyn Provider, out: &Outbox) {
        if st.dead {
            return;
        }
        let mut moved = self.move_all(st, p, out);
        // Armed before the last look: a completion after it calls back.
        let _ = p.req_notify_cq(self.raw, false);
        moved += self.move_all(st, p, out);
        if moved == 0 {
            return;
        }
        fence(Ordering::SeqCst);
        if self.ring.flags() & flags::WAITER != 0 {
            self.ring.clear_flags(flags::WAITER);
            self.ring.wake_producer();
        }
        let arm = self.ring.arm();
        if arm != st.fired || st.socket_armed {
            st.fired = arm;
            st.socket_armed = false;
            let e = Event::Completion {
                ca: self.ca,
                cq_ctx: self.ctx,
            };
            out.send(proto::frame(Kind::Event, 0, &e));
        }
        self.changed.notify_all();
    }

    /// Moves completions while there is room (bounded: each round moves
    /// one at least, and the room is the ring's capacity at most, twice
    /// over for a client consuming meanwhile).
    fn move_all(&self, st: &mut CqState, p: &dyn Provider, out: &Outbox) -> usize {
        let cap = self.ring.spec().capacity as u64;
        let mut moved = 0;
        for _ in 0..2 * cap + 2 {
            if st.dead {
                break;
            }
            let used = st.prod.wrapping_sub(self.ring.consumer());
            if used > cap {
                self.overrun(st, out, "its consumer index passed the producer's");
                break;
            }
            let room = (cap - used) as usize;
            // A full ring polls one: if there is one, the CQ overran.
            let want = room.clamp(1, st.scratch.len());
            let n = match p.poll_cq(self.raw, &mut st.scratch[..want]) {
                Ok(n) => n.min(want),
                Err(_) => 0,
            };
            if n == 0 {
                break;
            }
            if room == 0 {
                self.overrun(st, out, "more completions than its entries");
                break;
            }
            for k in 0..n {
                let wc = st.scratch[k];
                encode_entry(&wc, &mut st.entry);
                self.ring.write(st.prod, &st.entry);
                st.prod += 1;
            }
            self.ring.set_producer(st.prod);
            moved += n;
            if n < want {
                break;
            }
        }
        moved
    }

    /// The CQ overran (IBA 11.4.2.1: an affiliated CQ error).
    fn overrun(&self, st: &mut CqState, out: &Outbox, why: &str) {
        st.dead = true;
        let _ = self.ring.set_flags(flags::DEAD);
        self.ring.wake_producer();
        tracing::info!("nicd: a client's CQ ring overran: {why}");
        let e = Event::Async {
            ca: self.ca,
            event: AsyncEvent {
                kind: AsyncEventKind::CqError,
                ctx: self.ctx,
                port: None,
            },
        };
        out.send(proto::frame(Kind::Event, 0, &e));
        self.changed.notify_all();
    }

    /// `ReqNotifyCq` on the socket.
    pub(super) fn arm_socket(
        &self,
        p: &dyn Provider,
        out: &Outbox,
        solicited_only: bool,
    ) -> verbs::Result<()> {
        let mut st = lock(&self.st);
        if st.delegated {
            return p.req_notify_cq(self.raw, solicited_only);
        }
        if !solicited_only {
            st.socket_armed = true;
            self.pump_locked(&mut st, p, out);
            return Ok(());
        }
        // What is in the provider's CQ now goes first, in the ring.
        self.pump_locked(&mut st, p, out);
        st.delegated = true;
        st.stale_any = !st.dead;
        let _ = self.ring.set_flags(flags::DELEGATED);
        p.req_notify_cq(self.raw, true)
    }

    /// `PollCq` on the socket: a delegated ring's completions (the client
    /// found its ring empty); else a pump, and nothing.
    pub(super) fn poll_socket(
        &self,
        p: &dyn Provider,
        out: &Outbox,
        wcs: &mut [WorkCompletion],
    ) -> verbs::Result<usize> {
        let mut st = lock(&self.st);
        if st.delegated {
            drop(st);
            return p.poll_cq(self.raw, wcs);
        }
        self.pump_locked(&mut st, p, out);
        Ok(0)
    }

    /// Whether `WaitCq` must wait on the provider (a delegated ring).
    pub(super) fn delegated(&self) -> bool {
        lock(&self.st).delegated
    }

    /// Waits until the ring holds a completion (or the CQ overran), at
    /// most `timeout`.
    pub(super) fn wait(&self, p: &dyn Provider, out: &Outbox, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut st = lock(&self.st);
        self.pump_locked(&mut st, p, out);
        loop {
            if st.dead || st.prod != self.ring.consumer() {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
