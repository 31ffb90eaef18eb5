//! Completion queues: the device's CQ, a completion channel each, and the
//! bookkeeping that lets callbacks (`req_notify_cq`) and blocking waits
//! (`wait_cq`) share the one arm a CQ has.
//!
//! A device CQ is armed for its next (or next solicited) completion, once;
//! the event lands on its channel, which the CA's event thread alone
//! reads (two readers of one channel could each miss the other's event).
//! The thread counts the event, wakes `wait_cq` sleepers and, when the
//! consumer had armed the CQ, calls `on_completion`.
//!
//! `wait_cq` cannot look into a CQ without taking its entries, so what it
//! takes waits here, ahead of the device's, for the next `poll_cq`. It
//! arms the CQ for any completion and sleeps on the thread's count. One
//! case it cannot share: while the consumer's arm is solicited-only, an
//! arm for any completion would turn the consumer's callback into one for
//! any completion too (the event does not say what armed it), so the wait
//! polls every millisecond instead.

use super::ca::CaRt;
use super::events;
use super::objects::Obj;
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys::{self, raw::ibv_wc};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use verbs::{
    Context, CqHandle, CqInit, PdHandle, ResourceKind, Result, VerbsError, WorkCompletion,
};

/// How many completions one device poll takes for `wait_cq`.
const WAIT_BATCH: usize = 16;

/// The poll interval of a wait that may not arm (see the module docs).
const SOLICITED_POLL: Duration = Duration::from_millis(1);

#[derive(Default)]
struct Arms {
    /// Completions of GSI QPs (`gsi`), which no device queue holds: they
    /// come out first.
    soft: VecDeque<WorkCompletion>,
    /// Completions `wait_cq` took from the device, oldest first.
    taken: VecDeque<ibv_wc>,
    /// The consumer's arm: `Some(solicited_only)`.
    consumer: Option<bool>,
    /// What the device is armed for: `Some(solicited_only)`.
    device: Option<bool>,
    /// Channel events seen.
    events: u64,
}

/// A CQ and its arms.
pub(crate) struct CqRt {
    pub(super) hw: Arc<sys::Cq>,
    pub(super) ctx: Context,
    pub(super) key: u64,
    arms: Mutex<Arms>,
    event: Condvar,
    /// The channel broke (the device went away): the event thread leaves
    /// it out.
    pub(super) broken: AtomicBool,
    /// A GSI completion fired the consumer's arm outside the event
    /// thread: the thread calls the handler.
    soft_fired: AtomicBool,
}

impl CqRt {
    fn arms(&self) -> MutexGuard<'_, Arms> {
        self.arms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms the device for `solicited_only` unless it is armed for as
    /// much already.
    fn arm_device(&self, a: &mut Arms, solicited_only: bool) -> Result<()> {
        let needed = match a.device {
            None => true,
            Some(s) => s && !solicited_only,
        };
        if needed {
            self.hw
                .req_notify(solicited_only)
                .map_err(|e| convert::error("req_notify_cq", e))?;
            a.device = Some(solicited_only);
        }
        Ok(())
    }

    /// The consumer's arm (IBA 11.4.2.2: a request for any completion
    /// wins over a solicited-only one).
    fn arm(&self, solicited_only: bool) -> Result<()> {
        let mut a = self.arms();
        let s = solicited_only && a.consumer != Some(false);
        self.arm_device(&mut a, s)?;
        a.consumer = Some(s);
        Ok(())
    }

    /// The event thread took an event of this CQ's channel: wakes the
    /// waiters and says whether the consumer's arm fired.
    pub(super) fn on_event(&self) -> bool {
        let mut a = self.arms();
        a.events += 1;
        a.device = None;
        let fired = a.consumer.take().is_some();
        self.event.notify_all();
        fired
    }

    /// A GSI QP's completion: queued ahead of the device's, waiters
    /// woken; whether it fired the consumer's arm (the caller then has
    /// the event thread call the handler).
    pub(super) fn push_soft(&self, wc: WorkCompletion) -> bool {
        let mut a = self.arms();
        a.soft.push_back(wc);
        a.events += 1;
        self.event.notify_all();
        a.consumer.take().is_some()
    }

    /// Marks that the consumer's handler is owed a call (see
    /// [`CqRt::push_soft`]).
    pub(super) fn note_soft_fired(&self) {
        self.soft_fired
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether a call is owed (cleared).
    pub(super) fn take_soft_fired(&self) -> bool {
        self.soft_fired
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Takes up to `WAIT_BATCH` completions from the device into
    /// `a.taken`.
    fn take(&self, a: &mut Arms) -> Result<usize> {
        let mut buf = [ibv_wc::default(); WAIT_BATCH];
        let n = self
            .hw
            .poll(&mut buf)
            .map_err(|e| convert::error("poll_cq", e))?;
        a.taken.extend(&buf[..n]);
        Ok(n)
    }

    fn poll(&self, rt: &CaRt, out: &mut [WorkCompletion]) -> Result<usize> {
        let mut a = self.arms();
        let mut n = 0;
        while n < out.len() {
            let Some(w) = a.soft.pop_front() else { break };
            out[n] = w;
            n += 1;
        }
        while n < out.len() {
            let Some(w) = a.taken.pop_front() else { break };
            out[n] = convert::work_completion(&w, rt.qp_ctx(w.qp_num), rt.with_inv);
            n += 1;
        }
        let mut buf = [ibv_wc::default(); WAIT_BATCH];
        while n < out.len() {
            let want = (out.len() - n).min(WAIT_BATCH);
            let got = self
                .hw
                .poll(&mut buf[..want])
                .map_err(|e| convert::error("poll_cq", e))?;
            for w in &buf[..got] {
                out[n] = convert::work_completion(w, rt.qp_ctx(w.qp_num), rt.with_inv);
                n += 1;
            }
            if got < want {
                break;
            }
        }
        Ok(n)
    }

    fn wait(&self, timeout: Duration) -> Result<()> {
        // A timeout past the clock's range waits for ever.
        let deadline = Instant::now().checked_add(timeout);
        let mut a = self.arms();
        loop {
            if !a.soft.is_empty() || !a.taken.is_empty() || self.take(&mut a)? > 0 {
                return Ok(());
            }
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(VerbsError::Timeout);
            }
            if a.consumer == Some(true) {
                drop(a);
                std::thread::sleep(left.min(SOLICITED_POLL));
                a = self.arms();
                continue;
            }
            let seen = a.events;
            self.arm_device(&mut a, false)?;
            // A completion that came before the arm raises no event.
            if self.take(&mut a)? > 0 {
                return Ok(());
            }
            a = self
                .event
                .wait_timeout_while(a, left, |a| a.events == seen)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl RdmaCore {
    pub(super) fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let rt = {
            let st = self.lock();
            let (ca, _) = st.pd_of(st.pd(pd)?);
            st.rt(ca)
        };
        let max = u32::try_from(rt.attr.max_cqe.max(1)).unwrap_or(1);
        if init.cqe == 0 || init.cqe > max {
            return Err(bad(format!(
                "{} CQ entries ({} takes 1..={max})",
                init.cqe,
                rt.dev.name()
            )));
        }
        let key = self.key();
        let hw =
            sys::Cq::new(&rt.dev, init.cqe, key).map_err(|e| convert::error("create_cq", e))?;
        let cq = Arc::new(CqRt {
            hw: Arc::new(hw),
            ctx,
            key,
            arms: Mutex::new(Arms::default()),
            event: Condvar::new(),
            broken: AtomicBool::new(false),
            soft_fired: AtomicBool::new(false),
        });
        let h = {
            let mut st = self.lock();
            let p = st.pd(pd)?;
            let (ca, _) = st.pd_of(p);
            st.adjust(p, 1);
            st.insert(
                Obj::Cq {
                    ca,
                    pd: p,
                    cq: cq.clone(),
                    users: 0,
                },
                Some(key),
            )
        };
        rt.cq_list().push(cq);
        rt.waker.wake();
        Ok(CqHandle(h))
    }

    pub(super) fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let (rt, c) = {
            let mut st = self.lock();
            let i = st.cq(cq)?;
            let (ca, pd, users) = match st.obj(i) {
                Obj::Cq { ca, pd, users, .. } => (*ca, *pd, *users),
                _ => unreachable!("checked CQ"),
            };
            if users > 0 {
                return Err(VerbsError::Busy("CQ used by a QP"));
            }
            let c = st.cq_rt(i);
            st.remove(i, Some(c.key));
            st.adjust(pd, -1);
            (st.rt(ca), c)
        };
        rt.cq_list().retain(|x| !Arc::ptr_eq(x, &c));
        rt.waker.wake();
        let ctx = c.ctx;
        // The device CQ goes when the event thread lets go of it too.
        drop(c);
        events::retire(&rt, cq.0, ResourceKind::Cq, ctx);
        Ok(())
    }

    fn cq_and_ca(&self, cq: CqHandle) -> Result<(Arc<CqRt>, Arc<CaRt>)> {
        let st = self.lock();
        let i = st.cq(cq)?;
        let ca = match st.obj(i) {
            Obj::Cq { ca, .. } => *ca,
            _ => unreachable!("checked CQ"),
        };
        Ok((st.cq_rt(i), st.rt(ca)))
    }

    pub(super) fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let (c, rt) = self.cq_and_ca(cq)?;
        let n = c.poll(&rt, out)?;
        let invalidated = out[..n]
            .iter()
            .filter(|w| w.wc_flags.contains(verbs::WcFlags::WITH_INV))
            .map(|w| w.invalidated_rkey.0);
        self.note_invalidated(cq, invalidated);
        Ok(n)
    }

    /// A peer's SEND with invalidate unbound these R_Keys of this CA's
    /// type 2 windows (see `mw`).
    fn note_invalidated(&self, cq: CqHandle, rkeys: impl Iterator<Item = u32>) {
        let mut rkeys = rkeys.peekable();
        if rkeys.peek().is_none() {
            return;
        }
        let mut st = self.lock();
        let Ok(ca) = st.cq(cq).map(|i| match st.obj(i) {
            Obj::Cq { ca, .. } => *ca,
            _ => unreachable!("checked CQ"),
        }) else {
            return;
        };
        for k in rkeys {
            if let Some((w, _)) = st.type2_window(ca, k) {
                st.unbind(w);
            }
        }
    }

    pub(super) fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        self.cq_and_ca(cq)?.0.arm(solicited_only)
    }

    pub(super) fn wait_cq(&self, cq: CqHandle, timeout: Duration) -> Result<()> {
        self.cq_and_ca(cq)?.0.wait(timeout)
    }
}
