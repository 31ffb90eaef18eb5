//! Completion queue ring (IBA 11.4.2): bounded, overflow detected (the CQ
//! enters error and the provider raises `CqError`), arm/solicited notify,
//! blocking wait on a condition variable (no spinning).
//!
//! The ring never calls anybody: [`Cq::push`] returns what the provider
//! must deliver once it has dropped its own locks.

use crate::types::WorkCompletion;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Debug, Default)]
struct Inner {
    ring: VecDeque<WorkCompletion>,
    /// `Some(solicited_only)` when armed.
    armed: Option<bool>,
    overflowed: bool,
    /// Threads blocked in `wait` (notify only then: a futex wake is a syscall).
    waiters: u32,
}

/// What the provider must do after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushOutcome {
    /// Call `on_completion` (the arm fired and is now cleared).
    pub notify: bool,
    /// The ring overflowed: raise `CqError` (first time only).
    pub overflow: bool,
}

/// A completion queue ring.
#[derive(Debug)]
pub struct Cq {
    cap: usize,
    inner: Mutex<Inner>,
    cond: Condvar,
}

impl Cq {
    /// A ring of `cap` entries.
    pub fn new(cap: usize) -> Cq {
        Cq {
            cap,
            inner: Mutex::new(Inner::default()),
            cond: Condvar::new(),
        }
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Adds a completion. `solicited` marks a receive of a solicited
    /// message (or any error completion, which always notifies).
    #[inline]
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> PushOutcome {
        let mut g = self.inner.lock().unwrap();
        let mut out = PushOutcome::default();
        if g.overflowed {
            return out;
        }
        if g.ring.len() >= self.cap {
            g.overflowed = true;
            out.overflow = true;
            let wake = g.waiters > 0;
            drop(g);
            if wake {
                self.cond.notify_all();
            }
            return out;
        }
        g.ring.push_back(wc);
        let fire = match g.armed {
            Some(sol_only) => !sol_only || solicited || !wc.status.is_success(),
            None => false,
        };
        if fire {
            g.armed = None;
            out.notify = true;
        }
        let wake = g.waiters > 0;
        drop(g);
        if wake {
            self.cond.notify_all();
        }
        out
    }

    /// Moves up to `out.len()` completions out; returns the count.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut g = self.inner.lock().unwrap();
        let n = out.len().min(g.ring.len());
        // The ring's two halves copied as slices, not entry by entry.
        let (a, b) = g.ring.as_slices();
        let na = n.min(a.len());
        out[..na].copy_from_slice(&a[..na]);
        out[na..n].copy_from_slice(&b[..n - na]);
        g.ring.drain(..n);
        n
    }

    /// Number of queued completions.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().ring.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the ring overflowed (the CQ is in error).
    pub fn overflowed(&self) -> bool {
        self.inner.lock().unwrap().overflowed
    }

    /// Arms the notification. Returns true if completions are already
    /// queued and not solicited-only, so the caller may notify at once
    /// (ibverbs semantics: arming does not fire for old entries; we do not
    /// fire either, the return value is informational).
    pub fn arm(&self, solicited_only: bool) -> bool {
        let mut g = self.inner.lock().unwrap();
        // Solicited-only never weakens an existing any-completion arm.
        g.armed = Some(match g.armed {
            Some(false) => false,
            _ => solicited_only,
        });
        !g.ring.is_empty()
    }

    /// Blocks until the ring is non-empty (or overflowed); false on timeout.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut g = self.inner.lock().unwrap();
        g.waiters += 1;
        let (mut g, _) = self
            .cond
            .wait_timeout_while(g, timeout, |i| i.ring.is_empty() && !i.overflowed)
            .unwrap();
        g.waiters -= 1;
        !g.ring.is_empty() || g.overflowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{WcOpcode, WcStatus};
    use std::sync::Arc;

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, 0)
    }

    #[test]
    fn fifo_poll_and_overflow() {
        let cq = Cq::new(2);
        assert_eq!(cq.push(wc(1), false), PushOutcome::default());
        cq.push(wc(2), false);
        assert_eq!(
            cq.push(wc(3), false),
            PushOutcome {
                notify: false,
                overflow: true
            }
        );
        assert!(!cq.push(wc(4), false).overflow, "overflow reported once");
        assert!(cq.overflowed());
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn poll_across_the_ring_wrap_keeps_order() {
        // Pushes and polls that leave the ring's entries in two pieces
        // (its end and its start): a poll takes both, oldest first.
        let cq = Cq::new(8);
        let mut out = [wc(0); 8];
        let mut next = 0;
        let mut expect = 0;
        for round in 0..40 {
            for _ in 0..(round % 3 + 1) {
                next += 1;
                cq.push(wc(next), false);
            }
            let n = cq.poll(&mut out[..round % 4 + 1]);
            for got in &out[..n] {
                expect += 1;
                assert_eq!(got.wr_id, expect);
            }
        }
        let n = cq.poll(&mut out);
        for got in &out[..n] {
            expect += 1;
            assert_eq!(got.wr_id, expect);
        }
        assert_eq!((expect, cq.len()), (next, 0));
        assert!(!cq.overflowed());
    }

    #[test]
    fn arm_fires_once_and_solicited_only() {
        let cq = Cq::new(8);
        assert!(!cq.push(wc(1), false).notify, "not armed");
        cq.arm(false);
        assert!(cq.push(wc(2), false).notify);
        assert!(!cq.push(wc(3), false).notify, "one-shot");
        cq.arm(true);
        assert!(!cq.push(wc(4), false).notify);
        assert!(cq.push(wc(5), true).notify);
        cq.arm(true);
        let mut e = wc(6);
        e.status = WcStatus::RemAccessErr;
        assert!(cq.push(e, false).notify, "errors always notify");
    }

    #[test]
    fn wait_times_out_then_wakes() {
        let cq = Arc::new(Cq::new(4));
        assert!(!cq.wait(Duration::from_millis(1)));
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait(Duration::from_secs(30)));
        cq.push(wc(1), false);
        assert!(t.join().unwrap());
    }
}
