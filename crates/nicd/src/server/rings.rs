//! The daemon's side of the shared-memory rings (protocol version 2).
//!
//! Work queues (SQ, RQ, SRQ): the thread of the NIC that holds the
//! client's queues (with a [`DataPath`]: soft RoCE), or else one poller
//! thread per connection, takes what the client produced, checks every
//! entry as a post on the socket is checked ([`Server::send_wr`]:
//! handles the client's own, inline data inside its registrations) and
//! posts it to the provider: in each pass the receive rings before the
//! sends whose producer index it read before them, so a receive posted
//! before a send is the NIC's before the send leaves.
//!
//! The NIC's thread takes a connection's rings through its
//! [`ConnFeeder`] there on every turn, after its receive round's
//! completion callbacks, so what it takes leaves with the round's ACKs;
//! before it sleeps it sets [`flags::SLEEPING`] in the rings and looks
//! once more, and the client's doorbell eventfd is among what wakes it.
//! It does not spin. A client with queues on a second NIC has them taken
//! by the same thread, the first NIC's, whose posts to the second's
//! queues send from it: the order of its receives and sends across the
//! two NICs (one pass takes the receives first) needs one thread, and
//! two would share its doorbell.
//!
//! The poller spins a while ([`Server::set_ring_spin`]) after its last
//! work, then sets the flags, looks once more, and sleeps on the
//! doorbell (at most [`SLEEP_MAX`], so a connection's end or a bogus
//! descriptor never holds it).
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
//! that moves a completion after a bump answers it: through the client's
//! completion eventfd when it gave one (the ring's notified word set to
//! the arm, then a write, from the NIC's thread: no other thread of the
//! daemon or the client's reader wakes), else with `Completion` on the
//! event socket. A solicited-only arm goes on the socket and turns the ring
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

use super::{bad, DataPath, Outbox, Server};
use crate::proto::{self, Event, Kind};
use crate::ring::{decode_entry, encode_entry, flags, Ring};
use rdma_types::{QpState, WcOpcode, WcStatus};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
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
    /// The client's completion eventfd ([`proto::Request::CompletionNotice`]).
    notice: Mutex<Option<Arc<OwnedFd>>>,
    stop: AtomicBool,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The NICs' threads that take rings in, when the daemon has them.
    data_path: Option<Arc<dyn DataPath>>,
    /// This connection's feeder at the NIC whose thread takes its rings
    /// (all of them, whatever NIC each is on: see [`ConnRings::feed`]).
    feeder: Mutex<Option<Arc<ConnFeeder>>>,
    /// The server and the client, from [`ConnRings::start`].
    server: Mutex<Weak<Server>>,
    owner: AtomicU64,
}

impl ConnRings {
    pub(super) fn new(
        provider: Arc<dyn Provider>,
        out: Arc<Outbox>,
        data_path: Option<Arc<dyn DataPath>>,
    ) -> Arc<ConnRings> {
        Arc::new(ConnRings {
            provider,
            out,
            cqs: Mutex::new(Arc::new(Vec::new())),
            wqs: Mutex::new(Arc::new(Vec::new())),
            doorbell: Mutex::new(None),
            notice: Mutex::new(None),
            stop: AtomicBool::new(false),
            poller: Mutex::new(None),
            data_path,
            feeder: Mutex::new(None),
            server: Mutex::new(Weak::new()),
            owner: AtomicU64::new(0),
        })
    }

    /// Takes the client's doorbell; starts the poller unless the NICs'
    /// threads take the rings.
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
        if !crate::efd::set_nonblocking(&fd) {
            return Err(bad("the doorbell descriptor cannot be made non-blocking"));
        }
        let fd = Arc::new(fd);
        *d = Some(fd.clone());
        *lock(&self.server) = Arc::downgrade(server);
        self.owner.store(owner, Ordering::SeqCst);
        if self.data_path.is_some() {
            return Ok(());
        }
        drop(d);
        self.start_poller(server, owner, fd)
    }

    /// Starts the thread that polls the rings no NIC's thread takes.
    fn start_poller(
        self: &Arc<Self>,
        server: &Arc<Server>,
        owner: u64,
        fd: Arc<OwnedFd>,
    ) -> verbs::Result<()> {
        let mut poller = lock(&self.poller);
        if poller.is_some() {
            return Ok(());
        }
        server.ring_pollers.fetch_add(1, Ordering::Relaxed);
        let (me, s) = (self.clone(), server.clone());
        let h = std::thread::Builder::new()
            .name("nicd-rings".into())
            .spawn(move || {
                me.poll_loop(&s, owner, &fd);
                s.ring_pollers.fetch_sub(1, Ordering::Relaxed);
            })
            .map_err(|_| {
                server.ring_pollers.fetch_sub(1, Ordering::Relaxed);
                VerbsError::OutOfResources("nicd threads")
            })?;
        *poller = Some(h);
        Ok(())
    }

    /// Takes the client's completion eventfd: the CQ rings made from now
    /// on answer their arms there.
    pub(super) fn set_notice(&self, fd: OwnedFd) -> verbs::Result<()> {
        if !self.has_doorbell() {
            return Err(bad("CompletionNotice before the Doorbell request"));
        }
        if !lock(&self.cqs).is_empty() {
            return Err(bad("CompletionNotice after a CQ ring was made"));
        }
        let mut n = lock(&self.notice);
        if n.is_some() {
            return Err(bad("the completion eventfd was already given"));
        }
        // Written from the NIC's thread, which must never block on it
        // (a client can fill an eventfd's counter): non-blocking, which
        // the client shares, and so waits with poll before it reads.
        if !crate::efd::is_eventfd(&fd) || !crate::efd::set_nonblocking(&fd) {
            return Err(bad(
                "the completion notice descriptor is not an eventfd that can be made non-blocking",
            ));
        }
        *n = Some(Arc::new(fd));
        Ok(())
    }

    /// The client's completion eventfd, if it gave one.
    pub(super) fn notice(&self) -> Option<Arc<OwnedFd>> {
        lock(&self.notice).clone()
    }

    /// Whether the client gave its doorbell (so rings may be made).
    pub(super) fn has_doorbell(&self) -> bool {
        lock(&self.doorbell).is_some()
    }

    /// Stops the poller and the feeders and waits for them (the
    /// connection ended): no ring is taken in after this returns.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let feeder = lock(&self.feeder).take();
        if let Some(f) = feeder {
            self.retire(&f);
        }
        self.kick();
        if let Some(h) = lock(&self.poller).take() {
            let _ = h.join();
        }
    }

    /// Wakes the poller.
    fn kick(&self) {
        if let Some(fd) = &*lock(&self.doorbell) {
            crate::efd::write_one(fd);
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

    pub(super) fn add_wq(self: &Arc<Self>, wq: Arc<WqRing>) {
        let wq = match self.feed(wq) {
            Ok(()) => return,
            Err(wq) => wq,
        };
        {
            let mut g = lock(&self.wqs);
            let mut v = (**g).clone();
            v.push(wq);
            *g = Arc::new(v);
        }
        // A ring no NIC's thread takes: the poller's (started now, when
        // NICs' threads took the others).
        let server = lock(&self.server).upgrade();
        let fd = lock(&self.doorbell).clone();
        if let (Some(server), Some(fd)) = (server, fd) {
            let owner = self.owner.load(Ordering::SeqCst);
            if let Err(e) = self.start_poller(&server, owner, fd) {
                tracing::warn!("nicd: no ring poller ({e}): the client's ring waits");
            }
        }
        self.kick();
    }

    /// Stops feeder `f` (a pass in progress is waited for) and takes it
    /// from its NIC's thread.
    fn retire(&self, f: &ConnFeeder) {
        f.stop();
        if let (Some(dp), Some(id)) = (&self.data_path, f.id.get()) {
            dp.detach(f.guid, *id);
        }
    }

    /// Gives `wq` to the thread of the NIC that holds its QP or SRQ,
    /// through this connection's feeder there (made and attached on
    /// first use); back when there is no such thread.
    fn feed(&self, wq: Arc<WqRing>) -> Result<(), Arc<WqRing>> {
        let Some(dp) = &self.data_path else {
            return Err(wq);
        };
        let Some(guid) = dp.home(wq.raw) else {
            return Err(wq);
        };
        let mut feeder = lock(&self.feeder);
        if self.stop.load(Ordering::SeqCst) {
            return Err(wq);
        }
        if let Some(f) = feeder.as_ref() {
            // On a second NIC too: two NICs' threads would each take
            // their own rings, so a receive the client posted on one
            // before a send on the other could reach its NIC after the
            // send left (one pass takes receives before sends), and both
            // would watch one doorbell. The first NIC's thread posts to
            // the second's queues, which send from it.
            f.add(wq);
            return Ok(());
        }
        let (Some(doorbell), server) = (lock(&self.doorbell).clone(), lock(&self.server).clone())
        else {
            return Err(wq);
        };
        let f = Arc::new(ConnFeeder {
            guid,
            id: std::sync::OnceLock::new(),
            rings: Mutex::new(Arc::new(vec![wq.clone()])),
            doorbell,
            server,
            owner: self.owner.load(Ordering::SeqCst),
            provider: self.provider.clone(),
            out: self.out.clone(),
            pass: Mutex::new(Pass::default()),
        });
        match dp.attach(guid, f.clone()) {
            Some(id) => {
                let _ = f.id.set(id);
                *feeder = Some(f);
                Ok(())
            }
            None => Err(wq),
        }
    }

    /// The ring of `kind` of the client's object `index`.
    pub(super) fn wq(&self, index: u32, kind: WqKind) -> Option<Arc<WqRing>> {
        let found = |w: &&Arc<WqRing>| w.index == index && w.kind.same(kind);
        if let Some(w) = lock(&self.wqs).iter().find(found) {
            return Some(w.clone());
        }
        let feeder = lock(&self.feeder);
        feeder
            .as_ref()
            .and_then(|f| lock(&f.rings).iter().find(found).cloned())
    }

    /// Takes the rings of object `index` out of the poller's hands
    /// (before it is destroyed); [`ConnRings::add_wq`] puts them back.
    pub(super) fn remove_wqs(&self, index: u32) -> Vec<Arc<WqRing>> {
        let mut gone = take_out(&self.wqs, index);
        if let Some(f) = lock(&self.feeder).as_ref() {
            gone.extend(take_out(&f.rings, index));
        }
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
            let (work, stalled) =
                drain_pass(&wqs, server, &*self.provider, &self.out, owner, &mut sends);
            if work > 0 {
                idle = Instant::now();
                continue;
            }
            if !stalled && idle.elapsed() < server.ring_spin() {
                std::hint::spin_loop();
                continue;
            }
            if !going_to_sleep(&wqs) {
                let wait = if stalled { STALL_RETRY } else { SLEEP_MAX };
                crate::efd::wait(doorbell, wait);
            }
            woken(&wqs);
            idle = Instant::now();
        }
    }
}

/// One pass over `wqs`: receives before sends. Each SQ's producer index
/// is read first, then every receive ring is taken, then each SQ up to
/// the index read. A receive the client posted before a send is the
/// NIC's before that send leaves, so a peer that answers the send finds
/// it (and the client's send need not wait for its receives to be
/// taken). Returns the entries taken and whether a provider queue was
/// full.
fn drain_pass(
    wqs: &[Arc<WqRing>],
    server: &Server,
    p: &dyn Provider,
    out: &Outbox,
    owner: u64,
    sends: &mut Vec<u64>,
) -> (usize, bool) {
    let mut work = 0;
    let mut stalled = false;
    sends.clear();
    sends.extend(wqs.iter().map(|w| w.ring.producer()));
    for sends_now in [false, true] {
        for (w, &upto) in wqs.iter().zip(sends.iter()) {
            let send = matches!(w.kind, WqKind::Send { .. });
            if send != sends_now {
                continue;
            }
            let upto = send.then_some(upto);
            let (n, s) = w.drain(server, p, out, owner, upto);
            work += n;
            stalled |= s;
        }
    }
    (work, stalled)
}

/// Takes the rings of object `index` out of `list`.
fn take_out(list: &Mutex<Arc<Vec<Arc<WqRing>>>>, index: u32) -> Vec<Arc<WqRing>> {
    let mut g = lock(list);
    let gone: Vec<_> = g.iter().filter(|w| w.index == index).cloned().collect();
    if !gone.is_empty() {
        *g = Arc::new(g.iter().filter(|w| w.index != index).cloned().collect());
    }
    gone
}

/// A connection's rings on one NIC, taken in by that NIC's thread (see
/// the module docs).
pub(super) struct ConnFeeder {
    guid: rdma_types::Guid,
    id: std::sync::OnceLock<rnic::softroce::FeederId>,
    rings: Mutex<Arc<Vec<Arc<WqRing>>>>,
    doorbell: Arc<OwnedFd>,
    server: Weak<Server>,
    owner: u64,
    provider: Arc<dyn Provider>,
    out: Arc<Outbox>,
    /// Held across a pass.
    pass: Mutex<Pass>,
}

/// A feeder's pass state.
#[derive(Default)]
struct Pass {
    /// The connection ended, or its rings went to the poller.
    stopped: bool,
    /// The SQs' producer indices of a pass.
    sends: Vec<u64>,
}

impl ConnFeeder {
    fn add(&self, wq: Arc<WqRing>) {
        let mut g = lock(&self.rings);
        let mut v = (**g).clone();
        v.push(wq);
        *g = Arc::new(v);
    }

    /// No pass after this returns (one in progress is waited for).
    fn stop(&self) {
        lock(&self.pass).stopped = true;
    }
}

impl rnic::softroce::Feeder for ConnFeeder {
    fn feed(&self) -> rnic::softroce::Fed {
        let mut pass = lock(&self.pass);
        let Some(server) = self.server.upgrade().filter(|_| !pass.stopped) else {
            return rnic::softroce::Fed::default();
        };
        let wqs = lock(&self.rings).clone();
        let (taken, stalled) = drain_pass(
            &wqs,
            &server,
            &*self.provider,
            &self.out,
            self.owner,
            &mut pass.sends,
        );
        rnic::softroce::Fed { taken, stalled }
    }

    fn sleeping(&self) -> bool {
        if lock(&self.pass).stopped {
            return false;
        }
        going_to_sleep(&lock(&self.rings).clone())
    }

    fn awake(&self) {
        // Once stopped, the doorbell is the poller's to empty.
        let pass = lock(&self.pass);
        if pass.stopped {
            return;
        }
        crate::efd::drain(&self.doorbell);
        woken(&lock(&self.rings));
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.doorbell.as_raw_fd()
    }
}

/// About to sleep on the client's doorbell: flags every ring `SLEEPING`
/// (its `RUNG` cleared), then looks once more. Dekker with the client,
/// which stores its producer index, then reads the flag. Returns whether
/// work came meanwhile (then no sleep).
fn going_to_sleep(wqs: &[Arc<WqRing>]) -> bool {
    for w in wqs {
        w.ring.clear_flags(flags::RUNG);
        w.ring.set_flags(flags::SLEEPING);
    }
    fence(Ordering::SeqCst);
    wqs.iter().any(|w| w.has_work())
}

/// Awake again: posts need not ring.
fn woken(wqs: &[Arc<WqRing>]) {
    let awake = flags::SLEEPING | flags::RUNG;
    wqs.iter().for_each(|w| w.ring.clear_flags(awake));
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
    /// The client's completion eventfd: arms are answered there.
    notice: Option<Arc<OwnedFd>>,
    st: Mutex<CqState>,
    changed: Condvar,
}

impl CqRing {
    pub(super) fn new(
        ring: Ring,
        raw: CqHandle,
        index: u32,
        ca: CaHandle,
        ctx: u64,
        notice: Option<Arc<OwnedFd>>,
    ) -> CqRing {
        let blank = WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0);
        let n = (ring.spec().capacity as usize).min(BATCH);
        CqRing {
            ring,
            raw,
            index,
            ca,
            ctx,
            notice,
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
            match &self.notice {
                // An arm through the ring, answered through the
                // client's eventfd (the notified word first).
                Some(fd) if !st.socket_armed => {
                    self.ring.set_notified(arm);
                    crate::efd::write_one(fd);
                }
                _ => {
                    let e = Event::Completion {
                        ca: self.ca,
                        cq_ctx: self.ctx,
                    };
                    out.send(proto::frame(Kind::Event, 0, &e));
                }
            }
            st.socket_armed = false;
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
