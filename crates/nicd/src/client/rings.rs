//! The client's side of the shared-memory rings (protocol version 2):
//! posts and polls without a system call on a busy queue.
//!
//! A post goes into the ring when the client knows it for one the daemon
//! will take as the socket would: a QP it last moved to RTS (SQ) or to
//! INIT, RTR or RTS (RQ), an opcode of the QP's type, no more SGEs than
//! the QP's, inline data only inside the client's own registrations in
//! the QP's PD, no datagram, window or partition fields. Anything else,
//! a full ring and a ring the daemon gave up on ([`flags::DEAD`]) go on
//! the socket, where the daemon first takes what the ring holds, so
//! posts keep their order and the socket's errors stay exactly the
//! provider's (`BadWr` indices counted from the first WR of the call).
//!
//! After a post the client writes the doorbell only when the ring's
//! flags say the daemon's poller sleeps (and no post before it did).
//! A send with inline data returns only once the daemon took it (the
//! inline bytes are the caller's again), and so does a receive on a
//! queue being filled before its QP runs (a peer told of it out of band
//! may send at once): the post spins briefly, then sleeps on the ring's
//! consumer index (a futex the daemon wakes, [`flags::WAITER`]). A
//! receive on a running queue (an RTS QP's, or an SRQ, the daemon took
//! from before) returns at once, and the client's next send waits for
//! it instead ([`Rings::fence`]), so a peer that learns of it from us
//! finds it in the NIC.
//!
//! A poll reads the CQ ring; `wait_cq` sleeps on its producer index (the
//! same way); an arm for any completion bumps the ring's arm word. A
//! solicited-only arm goes on the socket, and so do the polls and waits
//! of the ring it delegates ([`flags::DELEGATED`]) once it is empty.

use crate::proto::RingSpec;
use crate::ring::{decode_entry, encode_entry, flags, Ring, CQE_SIZE, MAX_SLOTS};
use rdma_types::{QpState, QpType};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use verbs::{
    Handle, MemBuf, QpInit, RecvWr, SendFlags, SendOpcode, SendWr, Sge, SrqAttr, VerbsError,
    WorkCompletion,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What this client did, to count system calls per post and poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests on the socket (a `sendmsg` each, and a wait for the
    /// answer).
    pub socket_calls: u64,
    /// Doorbells written (a `write` each).
    pub doorbells: u64,
    /// Sleeps on a ring's index: until the daemon took a receive or an
    /// inline send, or moved a completion in for `wait_cq` (a `futex`
    /// each).
    pub take_waits: u64,
    /// WRs posted through a ring.
    pub ring_posts: u64,
    /// Polls served from a ring.
    pub ring_polls: u64,
    /// Receive posts on a running queue that returned without waiting
    /// for the daemon to take them (a later send waited instead).
    pub deferred_receives: u64,
    /// Sends that waited for such receives first.
    pub fenced_sends: u64,
    /// CQ handlers run because the daemon answered an arm on the
    /// completion eventfd (not with an event on the socket).
    pub notices: u64,
}

#[derive(Default)]
pub(super) struct Count {
    doorbells: AtomicU64,
    take_waits: AtomicU64,
    ring_posts: AtomicU64,
    ring_polls: AtomicU64,
    deferred_receives: AtomicU64,
    fenced_sends: AtomicU64,
    pub(super) notices: AtomicU64,
}

impl Count {
    pub(super) fn get(&self) -> Counters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            socket_calls: 0,
            doorbells: l(&self.doorbells),
            take_waits: l(&self.take_waits),
            ring_posts: l(&self.ring_posts),
            ring_polls: l(&self.ring_polls),
            deferred_receives: l(&self.deferred_receives),
            fenced_sends: l(&self.fenced_sends),
            notices: l(&self.notices),
        }
    }
}

struct Producer {
    prod: u64,
    entry: Vec<u8>,
}

/// A work queue ring, producing.
pub(super) struct WqRing {
    ring: Ring,
    max_sge: usize,
    prod: Mutex<Producer>,
}

impl WqRing {
    fn new(ring: Ring, max_sge: u32) -> WqRing {
        ring.init();
        WqRing {
            ring,
            max_sge: max_sge as usize,
            prod: Mutex::new(Producer {
                prod: 0,
                entry: Vec::with_capacity(256),
            }),
        }
    }
}

/// A QP's rings and what the client knows of it.
pub(super) struct QpRings {
    sq: WqRing,
    rq: Option<WqRing>,
    qp_type: QpType,
    pd: Handle,
    max_inline: u32,
    /// The state the client last moved it to.
    state: Mutex<QpState>,
}

struct Consumer {
    cons: u64,
    entry: Vec<u8>,
}

/// A CQ ring, consuming.
pub(super) struct CqRing {
    ring: Ring,
    cons: Mutex<Consumer>,
    /// The daemon's CA index of the CQ and its context (its handler's).
    ca: u32,
    ctx: u64,
    /// The notified arm sequence last answered (the notice thread's).
    seen: AtomicU64,
}

/// What a ring post did: how many WRs went in; the rest go on the
/// socket.
pub(super) type Taken = usize;

/// The rings of a connection.
pub(super) struct Rings {
    doorbell: OwnedFd,
    cqs: RwLock<HashMap<Handle, Arc<CqRing>>>,
    qps: RwLock<HashMap<Handle, Arc<QpRings>>>,
    srqs: RwLock<HashMap<Handle, Arc<WqRing>>>,
    /// The client's registrations: (MR, PD, addr, len).
    mrs: RwLock<Vec<(Handle, Handle, u64, u64)>>,
    /// Receives posted without waiting for the daemon to take them, by
    /// ring (up to which producer index): every send waits for them
    /// first ([`Rings::fence`]).
    unconfirmed: Mutex<Vec<(WqHold, u64)>>,
    /// Whether `unconfirmed` may hold any (a send's cheap look).
    any_unconfirmed: std::sync::atomic::AtomicBool,
    pub(super) count: Count,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Bytes of a ring entry holding a `T` with `sges` SGEs (`T` built by
/// `f`), whole powers of two.
fn entry_for<T: crate::proto::Wire>(f: impl Fn(verbs::Sges) -> T, sges: u32) -> usize {
    let widest = Sge {
        addr: u64::MAX,
        length: u32::MAX,
        lkey: rdma_types::Lkey(u32::MAX),
    };
    let sges = verbs::sges![widest; sges.min(4096) as usize];
    let mut b = Vec::new();
    encode_entry(&f(sges), &mut b);
    b.len()
}

/// A memfd of `len` bytes for rings.
fn rings_buf(len: u64) -> verbs::Result<MemBuf> {
    MemBuf::new_shared(len as usize)
        .map_err(|e| VerbsError::InvalidArgument(format!("a memfd for rings: {e}")))
}

impl Rings {
    pub(super) fn new(doorbell: OwnedFd) -> Rings {
        Rings {
            doorbell,
            cqs: RwLock::new(HashMap::new()),
            qps: RwLock::new(HashMap::new()),
            srqs: RwLock::new(HashMap::new()),
            mrs: RwLock::new(Vec::new()),
            unconfirmed: Mutex::new(Vec::new()),
            any_unconfirmed: std::sync::atomic::AtomicBool::new(false),
            count: Count::default(),
        }
    }

    pub(super) fn doorbell(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.doorbell.as_fd()
    }

    /// A CQ ring for `cqe` entries: its memfd and cut; `None` when the
    /// CQ is too deep for a ring (it is made on the socket).
    pub(super) fn cq_layout(cqe: u32) -> Option<verbs::Result<(MemBuf, RingSpec)>> {
        if cqe == 0 || cqe > MAX_SLOTS {
            return None;
        }
        let spec = RingSpec::new(0, CQE_SIZE as usize, cqe);
        Some(rings_buf(spec.end()).map(|b| (b, spec)))
    }

    /// Adds CQ `index` of the daemon's CA `ca` with context `ctx`.
    pub(super) fn add_cq(
        &self,
        index: Handle,
        buf: MemBuf,
        spec: RingSpec,
        ca: u32,
        ctx: u64,
    ) -> verbs::Result<()> {
        let ring = Ring::new(buf, spec).map_err(VerbsError::InvalidArgument)?;
        ring.init();
        let cq = CqRing {
            ring,
            cons: Mutex::new(Consumer {
                cons: 0,
                entry: vec![0; spec.entry_size as usize],
            }),
            ca,
            ctx,
            seen: AtomicU64::new(0),
        };
        write(&self.cqs).insert(index, Arc::new(cq));
        Ok(())
    }

    /// A QP's rings: memfd, SQ cut, RQ cut; `None` when a queue is too
    /// deep or empty (made on the socket).
    #[allow(clippy::type_complexity)]
    pub(super) fn qp_layout(
        init: &QpInit,
    ) -> Option<verbs::Result<(MemBuf, RingSpec, Option<RingSpec>)>> {
        let c = init.caps;
        if matches!(init.qp_type, QpType::Smi | QpType::Gsi)
            || c.max_send_wr == 0
            || c.max_send_wr > MAX_SLOTS
            || c.max_recv_wr > MAX_SLOTS
            || (init.srq.is_none() && c.max_recv_wr == 0)
        {
            return None;
        }
        let send = entry_for(|s| SendWr::new(0, SendOpcode::Send, s), c.max_send_sge);
        let sq = RingSpec::new(0, send, c.max_send_wr);
        let rq = init.srq.is_none().then(|| {
            let recv = entry_for(|sges| RecvWr { wr_id: 0, sges }, c.max_recv_sge);
            RingSpec::new(sq.end().next_multiple_of(4096), recv, c.max_recv_wr)
        });
        let end = rq.map_or(sq.end(), |r| r.end());
        Some(rings_buf(end).map(|b| (b, sq, rq)))
    }

    pub(super) fn add_qp(
        &self,
        index: Handle,
        init: &QpInit,
        pd: Handle,
        buf: MemBuf,
        sq: RingSpec,
        rq: Option<RingSpec>,
    ) -> verbs::Result<()> {
        let inv = VerbsError::InvalidArgument;
        let sq = WqRing::new(
            Ring::new(buf.clone(), sq).map_err(inv)?,
            init.caps.max_send_sge,
        );
        let rq = match rq {
            Some(r) => Some(WqRing::new(
                Ring::new(buf, r).map_err(inv)?,
                init.caps.max_recv_sge,
            )),
            None => None,
        };
        let q = QpRings {
            sq,
            rq,
            qp_type: init.qp_type,
            pd,
            max_inline: init.caps.max_inline,
            state: Mutex::new(QpState::Reset),
        };
        write(&self.qps).insert(index, Arc::new(q));
        Ok(())
    }

    /// An SRQ's ring: memfd and cut; `None` when too deep.
    pub(super) fn srq_layout(attr: &SrqAttr) -> Option<verbs::Result<(MemBuf, RingSpec)>> {
        if attr.max_wr == 0 || attr.max_wr > MAX_SLOTS {
            return None;
        }
        let recv = entry_for(|sges| RecvWr { wr_id: 0, sges }, attr.max_sge);
        let spec = RingSpec::new(0, recv, attr.max_wr);
        Some(rings_buf(spec.end()).map(|b| (b, spec)))
    }

    pub(super) fn add_srq(
        &self,
        index: Handle,
        attr: &SrqAttr,
        buf: MemBuf,
        spec: RingSpec,
    ) -> verbs::Result<()> {
        let ring = Ring::new(buf, spec).map_err(VerbsError::InvalidArgument)?;
        write(&self.srqs).insert(index, Arc::new(WqRing::new(ring, attr.max_sge)));
        Ok(())
    }

    /// Forgets the rings of object `index` (destroyed).
    pub(super) fn forget(&self, index: Handle) {
        write(&self.cqs).remove(&index);
        let q = write(&self.qps).remove(&index);
        let s = write(&self.srqs).remove(&index);
        write(&self.mrs).retain(|m| m.0 != index);
        // A destroyed queue's receives are nobody's to wait for.
        let gone: Option<*const WqRing> = match (&q, &s) {
            (Some(q), _) => q.rq.as_ref().map(|r| r as *const WqRing),
            (_, Some(s)) => Some(&**s as *const WqRing),
            _ => None,
        };
        if let Some(gone) = gone {
            lock(&self.unconfirmed).retain(|(h, _)| !std::ptr::eq(h.ring_ptr(), gone));
        }
    }

    /// Notes a registration (inline data may lie in it); `pd` `None`
    /// for a re-registration (the PD it had).
    pub(super) fn add_mr(&self, index: Handle, pd: Option<Handle>, addr: u64, len: u64) {
        let mut m = write(&self.mrs);
        let old = m.iter().position(|m| m.0 == index).map(|i| m.remove(i));
        if let Some(pd) = pd.or(old.map(|o| o.1)) {
            m.push((index, pd, addr, len));
        }
    }

    /// Notes a QP's new state after a `modify_qp` that succeeded.
    pub(super) fn set_state(&self, index: Handle, state: QpState) {
        if let Some(q) = read(&self.qps).get(&index) {
            *lock(&q.state) = state;
        }
    }

    /// Whether the daemon would take `w` from the SQ ring of `q` as it
    /// would from the socket (see the module docs).
    fn send_fits(&self, q: &QpRings, w: &SendWr) -> bool {
        use SendOpcode as O;
        let op = match q.qp_type {
            QpType::Rc => matches!(
                w.opcode,
                O::Send | O::SendWithImm | O::RdmaWrite | O::RdmaWriteWithImm | O::RdmaRead
            ),
            QpType::Uc => matches!(
                w.opcode,
                O::Send | O::SendWithImm | O::RdmaWrite | O::RdmaWriteWithImm
            ),
            _ => false,
        };
        if !op
            || w.sges.len() > q.sq.max_sge
            || w.ud.is_some()
            || w.bind_mw.is_some()
            || w.pkey_index.is_some()
        {
            return false;
        }
        if !w.flags.contains(SendFlags::INLINE) {
            return true;
        }
        let total: u64 = w.sges.iter().map(|s| s.length as u64).sum();
        let mrs = read(&self.mrs);
        total <= q.max_inline as u64
            && w.sges.iter().all(|s| {
                mrs.iter().any(|&(_, pd, addr, len)| {
                    pd == q.pd
                        && s.addr >= addr
                        && (s.addr - addr)
                            .checked_add(s.length as u64)
                            .is_some_and(|e| e <= len)
                })
            })
    }

    /// Waits until the daemon took every receive posted without waiting
    /// (see [`Rings::post_recv`]): called before a send leaves on the
    /// socket, so a peer that learns of a receive from it finds it in the
    /// NIC (a send on a ring needs not: the daemon's poller takes the
    /// receive rings before the sends it saw). Free when there are none.
    pub(super) fn fence(&self) {
        if !self.any_unconfirmed.load(Ordering::Acquire) {
            return;
        }
        let pending = {
            let mut u = lock(&self.unconfirmed);
            self.any_unconfirmed.store(false, Ordering::Release);
            std::mem::take(&mut *u)
        };
        if !pending.is_empty() {
            self.count.fenced_sends.fetch_add(1, Ordering::Relaxed);
        }
        for (h, prod) in pending {
            if let Some(r) = h.ring() {
                if r.ring.consumer() < prod && !taken(r, prod, &self.count) {
                    // The daemon is slow to take it (its poller has the
                    // doorbell): the send goes anyway.
                    tracing::debug!("nicd client: a receive not taken within the fence's wait");
                }
            }
        }
    }

    /// Posts the first WRs of `wrs` that fit into the SQ ring of QP
    /// `index`, then `rest` (the socket) with the others, holding the
    /// ring so nothing overtakes.
    pub(super) fn post_send(
        &self,
        index: Handle,
        wrs: &[SendWr],
        rest: impl Fn(&[SendWr]) -> verbs::Result<()>,
    ) -> verbs::Result<()> {
        let Some(q) = read(&self.qps).get(&index).cloned() else {
            return rest(wrs);
        };
        let mut g = lock(&q.sq.prod);
        let open = *lock(&q.state) == QpState::Rts;
        // Inline data is the daemon's to copy before the post returns
        // (the buffer is the caller's again after).
        let inline = |w: &SendWr| w.flags.contains(SendFlags::INLINE);
        let n = if open {
            self.produce(&q.sq, &mut g, wrs, |w| self.send_fits(&q, w))
        } else {
            0
        };
        if wrs[..n].iter().any(inline) && !taken(&q.sq, g.prod, &self.count) {
            rest(&[])?;
        }
        finish(n, wrs, rest)
    }

    /// [`Rings::post_send`] for receives of QP `index` (or of SRQ
    /// `index` when `srq`).
    pub(super) fn post_recv(
        &self,
        index: Handle,
        srq: bool,
        wrs: &[RecvWr],
        rest: impl Fn(&[RecvWr]) -> verbs::Result<()>,
    ) -> verbs::Result<()> {
        let (wq, open) = if srq {
            let Some(s) = read(&self.srqs).get(&index).cloned() else {
                return rest(wrs);
            };
            (WqHold::Srq(s), true)
        } else {
            let Some(q) = read(&self.qps).get(&index).cloned() else {
                return rest(wrs);
            };
            if q.rq.is_none() {
                return rest(wrs);
            }
            let open = matches!(*lock(&q.state), QpState::Init | QpState::Rtr | QpState::Rts);
            (WqHold::Qp(q), open)
        };
        let Some(r) = wq.ring() else {
            return rest(wrs);
        };
        let mut g = lock(&r.prod);
        let n = if open {
            self.produce(r, &mut g, wrs, |w| w.sges.len() <= r.max_sge)
        } else {
            0
        };
        // A receive must be the NIC's before a peer can be told of it.
        // On a queue that runs (an RTS QP's, or an SRQ, the daemon took
        // from before) the peer learns of it by a send of ours, so the
        // receive is left to the daemon, which takes it before any later
        // send of the rings (a send on the socket waits for it,
        // [`Rings::fence`]): a server that answers each completion with
        // a new receive does not wait for the daemon each time.
        // Otherwise (a queue being filled before its QP is announced,
        // perhaps out of band) the post waits here.
        let running = match &wq {
            WqHold::Qp(q) => *lock(&q.state) == QpState::Rts,
            WqHold::Srq(_) => true,
        };
        if n > 0 && running && r.ring.consumer() > 0 {
            let prod = g.prod;
            let mut u = lock(&self.unconfirmed);
            match u.iter_mut().find(|(h, _)| std::ptr::eq(h.ring_ptr(), r)) {
                Some((_, p)) => *p = prod,
                None => u.push((wq.clone(), prod)),
            }
            self.any_unconfirmed.store(true, Ordering::Release);
            self.count.deferred_receives.fetch_add(1, Ordering::Relaxed);
            return finish(n, wrs, rest);
        }
        if n > 0 && !taken(r, g.prod, &self.count) {
            // The socket's post of nothing takes the ring first.
            rest(&[])?;
        }
        finish(n, wrs, rest)
    }

    /// Writes the first WRs that `fit` while there is room; publishes
    /// them and rings the doorbell if the daemon sleeps.
    fn produce<T: crate::proto::Wire>(
        &self,
        r: &WqRing,
        g: &mut Producer,
        wrs: &[T],
        fit: impl Fn(&T) -> bool,
    ) -> usize {
        if r.ring.flags() & flags::DEAD != 0 {
            return 0;
        }
        let cap = r.ring.spec().capacity as u64;
        let mut cons = r.ring.consumer();
        let mut n = 0;
        for w in wrs {
            if !fit(w) {
                break;
            }
            if g.prod.wrapping_sub(cons) >= cap {
                cons = r.ring.consumer();
                if g.prod.wrapping_sub(cons) >= cap {
                    break;
                }
            }
            encode_entry(w, &mut g.entry);
            if !r.ring.write(g.prod, &g.entry) {
                break;
            }
            g.prod += 1;
            n += 1;
        }
        if n > 0 {
            r.ring.set_producer(g.prod);
            // Dekker with the poller: publish, then read its flag.
            fence(Ordering::SeqCst);
            // The first post to see the poller asleep wakes it.
            if r.ring.flags() & flags::SLEEPING != 0
                && r.ring.set_flags(flags::RUNG) & flags::RUNG == 0
            {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live local array to our
                // eventfd.
                let _ = unsafe { libc::write(self.doorbell.as_raw_fd(), one.as_ptr().cast(), 8) };
                self.count.doorbells.fetch_add(1, Ordering::Relaxed);
            }
            self.count.ring_posts.fetch_add(n as u64, Ordering::Relaxed);
        }
        n
    }

    /// Polls CQ `index`'s ring: `None` when it has none; else how many
    /// completions, and whether the rest must come from the socket (a
    /// delegated ring found empty).
    pub(super) fn poll_cq(
        &self,
        index: Handle,
        out: &mut [WorkCompletion],
    ) -> Option<verbs::Result<(usize, bool)>> {
        let c = read(&self.cqs).get(&index).cloned()?;
        let mut g = lock(&c.cons);
        let mut prod = c.ring.producer();
        if prod == g.cons && c.ring.flags() & flags::DELEGATED != 0 {
            // The flag came after the daemon's last entry: look again.
            prod = c.ring.producer();
            if prod == g.cons {
                return Some(Ok((0, true)));
            }
        }
        let avail = prod.wrapping_sub(g.cons).min(c.ring.spec().slots as u64);
        let n = (avail as usize).min(out.len());
        for (k, o) in out.iter_mut().take(n).enumerate() {
            let Consumer { cons, entry } = &mut *g;
            c.ring.read(*cons + k as u64, entry);
            match decode_entry::<WorkCompletion>(entry) {
                Ok(wc) => *o = wc,
                Err(e) => {
                    return Some(Err(VerbsError::InvalidArgument(format!(
                        "a malformed completion from nicd: {e}"
                    ))))
                }
            }
        }
        g.cons += n as u64;
        if n > 0 {
            c.ring.set_consumer(g.cons);
        }
        self.count.ring_polls.fetch_add(1, Ordering::Relaxed);
        Some(Ok((n, false)))
    }

    /// The connection ended: every ring is dead (posts go to the socket,
    /// which refuses them) and whoever sleeps on one is woken.
    pub(super) fn end_all(&self) {
        for c in read(&self.cqs).values() {
            c.ring.set_flags(flags::DEAD);
            c.ring.wake_producer();
        }
        let qps = read(&self.qps);
        let wqs = qps
            .values()
            .flat_map(|q| std::iter::once(&q.sq).chain(q.rq.as_ref()));
        let srqs = read(&self.srqs);
        for w in wqs.chain(srqs.values().map(|w| &**w)) {
            w.ring.set_flags(flags::DEAD);
            w.ring.wake_consumer();
        }
    }

    /// Appends the CA and context of each CQ whose notified word moved
    /// since the last call (the daemon answered its arm through the
    /// completion eventfd).
    pub(super) fn notified(&self, out: &mut Vec<(u32, u64)>) {
        for c in read(&self.cqs).values() {
            let n = c.ring.notified();
            if c.seen.swap(n, Ordering::SeqCst) != n {
                out.push((c.ca, c.ctx));
            }
        }
    }

    /// Arms CQ `index` for any completion through its ring: `false` when
    /// it must go on the socket.
    pub(super) fn arm(&self, index: Handle) -> bool {
        let Some(c) = read(&self.cqs).get(&index).cloned() else {
            return false;
        };
        if c.ring.flags() & (flags::DELEGATED | flags::DEAD) != 0 {
            return false;
        }
        c.ring.bump_arm();
        true
    }

    /// `wait_cq` (and `drive_cq`) on CQ `index`'s ring: `None` when it must go on the
    /// socket (no ring, or a delegated one); else whether a completion
    /// (or the CQ's overrun) came within `timeout`. Sleeps on the ring's
    /// producer index (a futex the daemon wakes), never longer than
    /// `timeout`.
    /// For the first `spin` it looks without sleeping (no system call).
    pub(super) fn wait_cq(&self, index: Handle, spin: Duration, timeout: Duration) -> Option<bool> {
        let c = read(&self.cqs).get(&index).cloned()?;
        let cons = lock(&c.cons).cons;
        let ready = || c.ring.producer() != cons || c.ring.flags() & flags::DEAD != 0;
        if ready() {
            return Some(true);
        }
        if c.ring.flags() & flags::DELEGATED != 0 {
            return None;
        }
        let start = Instant::now();
        let spin = spin.min(timeout);
        while start.elapsed() < spin {
            if ready() {
                return Some(true);
            }
            std::hint::spin_loop();
        }
        // Bounded: each round sleeps until a wake-up or the time left.
        for _ in 0..1024 {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            // Dekker with the daemon's pump: flag, then index.
            let _ = c.ring.set_flags(flags::WAITER);
            let prod = c.ring.producer();
            if ready() {
                return Some(true);
            }
            c.ring.wait_producer(prod as u32, left);
            self.count.take_waits.fetch_add(1, Ordering::Relaxed);
        }
        Some(ready())
    }
}

/// How long a post that must be taken spins for the poller (awake)
/// before it sleeps on the ring's consumer index.
const TAKE_SPIN: Duration = Duration::from_micros(20);

/// Longest sleep for the poller to take a post, before the post asks on
/// the socket instead.
const TAKE_SLEEP: Duration = Duration::from_millis(50);

/// Whether the daemon took the ring's entries up to `prod` (or gave the
/// ring up): spins [`TAKE_SPIN`], then sleeps on the consumer index (a
/// futex the daemon wakes), [`TAKE_SLEEP`] at most.
fn taken(r: &WqRing, prod: u64, count: &Count) -> bool {
    let done = || r.ring.consumer() == prod || r.ring.flags() & flags::DEAD != 0;
    let start = Instant::now();
    while start.elapsed() < TAKE_SPIN {
        if done() {
            return true;
        }
        std::hint::spin_loop();
    }
    // Bounded: each round sleeps until a wake-up or the time left.
    for _ in 0..64 {
        let left = TAKE_SLEEP.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        // Dekker with the daemon: flag, then index.
        let _ = r.ring.set_flags(flags::WAITER);
        let cons = r.ring.consumer();
        if done() {
            return true;
        }
        r.ring.wait_consumer(cons as u32, left);
        count.take_waits.fetch_add(1, Ordering::Relaxed);
    }
    done()
}

/// A work queue held while posting.
#[derive(Clone)]
enum WqHold {
    Qp(Arc<QpRings>),
    Srq(Arc<WqRing>),
}

impl WqHold {
    /// The receive ring's address (to know it again).
    fn ring_ptr(&self) -> *const WqRing {
        self.ring().map_or(std::ptr::null(), |r| r as *const WqRing)
    }

    fn ring(&self) -> Option<&WqRing> {
        match self {
            WqHold::Qp(q) => q.rq.as_ref(),
            WqHold::Srq(s) => Some(s),
        }
    }
}

/// After `n` WRs went into a ring: the others on the socket, their
/// `BadWr` index counted from the call's first WR.
fn finish<T>(n: Taken, wrs: &[T], rest: impl Fn(&[T]) -> verbs::Result<()>) -> verbs::Result<()> {
    if n == wrs.len() {
        return Ok(());
    }
    rest(&wrs[n..]).map_err(|e| match e {
        VerbsError::BadWr { index, cause } => VerbsError::BadWr {
            index: index + n,
            cause,
        },
        e if n > 0 => VerbsError::BadWr {
            index: n,
            cause: Box::new(e),
        },
        e => e,
    })
}
