//! A waiting caller drives the CQ itself: caller-driven progress.
//!
//! A caller whose answer has not come takes the reaper role, unless another
//! thread holds it: it polls the CQ through the verbs API and handles what
//! it finds with the same code as the provider's callback and the poll
//! thread ([`Inner::drain_cq_locked`]), answers for other callers included
//! (they are woken as ever, through `State::wake`). While a caller holds
//! the role nobody arms the CQ, and a callback the arm before it raises
//! does nothing, so no thread works on a completion the caller is about to
//! poll anyway.
//! The caller polls for a while learned from how long answers take
//! ([`verbs::spin::Spin`]). Where the provider lets a consumer's thread
//! move its NIC ([`Provider::drive_cq`]: soft RoCE receives on it; the NIC
//! daemon's client sleeps on the CQ's ring, which the daemon wakes), with
//! few commands outstanding or as the session's only waiting caller, it
//! spends that while looking at the NIC there instead, and then waits
//! there, still the reaper, so the datagram with its answer wakes it and
//! no NIC thread; then it gives the role up: it arms the CQ, polls once more
//! (what came before the arm), and parks until the callback's drain wakes
//! it, as a waiter that is not the reaper always does.
//!
//! Invariants: one reaper at a time (`State::reaper`, under the session
//! lock, as every poll of the CQ is, so completions are handled in the
//! order the CQ gives them); the CQ is armed whenever no caller holds the
//! role (a reaper arms as it leaves, and a drain by anyone else while it
//! holds the role leaves the arming to it). A callback that comes while a
//! caller holds the role (from the arm before it) does nothing
//! (`Inner::reaper_polls`): the reaper polls after it, and arms again as
//! it leaves.

use super::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The longest a caller polls the CQ before it sleeps.
pub(super) const SPIN_MAX: Duration = Duration::from_micros(50);

/// The longest a caller looks at its NIC in the provider without sleeping
/// ([`Provider::drive_cq`], soft RoCE) before it sleeps there, as learned
/// by a [`Spin`] of its own. Longer than [`SPIN_MAX`]: at depth the
/// answers come in bursts a round trip of the target's batch apart, and a
/// reaper that sleeps between them costs the target's NIC thread a wake-up
/// of it inside each send. 4 KiB random reads QD32 over soft RoCE, one
/// process on 2 cores: 171-173k IOPS and 0.04 sleeps an I/O with 50 µs,
/// 155-168k with 100 µs, 189-210k and 0.007 with 200 µs, 199-204k with
/// 500 µs.
pub(super) const DRIVE_SPIN_MAX: Duration = Duration::from_micros(200);

/// The longest a reaping caller waits in the provider
/// ([`Provider::drive_cq`]) before it looks at the session again: how late
/// it sees an answer another thread handled (a failed connection ends
/// every command on the poll thread).
const DRIVE_SLICE: Duration = Duration::from_millis(2);

/// The most commands outstanding for which a reaping caller drives the
/// provider while other callers wait too. With many callers (a thread per
/// command), a deeper queue keeps the NIC thread at work better than the
/// one reaper does (soft RoCE, 4 KiB random writes, a thread per I/O, 32
/// at once: 50-56k IOPS with the NIC thread receiving, 36-39k with the
/// reaper driving). The session's only waiting caller drives at any depth:
/// one thread keeping 32 random writes in flight does 147-154k IOPS so,
/// 110-118k leaving the receiving to the NIC thread (random reads at
/// QD32 lose 4-7 %: in one process on 2 cores, the initiator's receiving
/// no longer runs beside its completions).
const DRIVE_MAX_QUEUE: usize = 4;

/// How a reaping caller's answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// While it polled the CQ, or within the spin budget while the
    /// provider looked for it without sleeping.
    Polling,
    /// While it drove the provider, or as it gave the role up.
    Driving,
}

impl Inner {
    /// Waits until `answered` gives the answer, reaping the CQ while no
    /// other thread does; returns the lock and the answer. `answered` is
    /// called under the lock each time the state may have changed; when
    /// it gives nothing it must leave the caller registered in
    /// `State::parked` for what it waits for, so whoever handles that
    /// answer wakes it.
    pub(super) fn wait_answer<'a, T>(
        &'a self,
        mut st: Locked<'a>,
        mut answered: impl FnMut(&mut State) -> Option<T>,
    ) -> (Locked<'a>, T) {
        // An answer there at once (another caller's reaping brought it)
        // says nothing of how long answers take: only a wait teaches. The
        // clock is read once there is something to wait for (`finish`
        // after `wait_any` never waits).
        let mut start = None;
        let mut polled = false;
        let answer = loop {
            if let Some(a) = answered(&mut st) {
                break a;
            }
            if start.is_none() {
                st.waiting += 1;
            }
            let start = *start.get_or_insert_with(Instant::now);
            // What this thread batched goes out as the lock is let go.
            st.stop_batching();
            if st.reaper.is_none() {
                let (s, found) = self.reap(st, &mut answered, start);
                st = s;
                if let Some((a, how)) = found {
                    polled = how == Found::Polling;
                    break a;
                }
            }
            drop(st);
            // Bounded, so a lost wake-up costs time, never a hang.
            std::thread::park_timeout(Duration::from_millis(200));
            st = self.lock();
        };
        if let Some(start) = start {
            st.waiting -= 1;
            st.reap_spin().learn(start.elapsed(), polled);
        }
        (st, answer)
    }

    /// Holds the reaper role: polls the CQ until `answered` gives the
    /// answer or the spin budget is spent, then, while the provider lets
    /// this thread move its NIC ([`Provider::drive_cq`]), waits in it;
    /// then gives the role up (arming the CQ). Returns the lock and the
    /// answer, if it came, and how.
    fn reap<'a, T>(
        &'a self,
        mut st: Locked<'a>,
        answered: &mut impl FnMut(&mut State) -> Option<T>,
        start: Instant,
    ) -> (Locked<'a>, Option<(T, Found)>) {
        st.reaper = Some(current_id());
        self.reaper_polls.store(true, Ordering::SeqCst);
        // Where the provider lets this thread wait for the answer inside
        // it, polling the CQ first only takes a core from the threads that
        // make the answer (and the NIC thread, looking now and then, would
        // hand it over to the poll): drive at once, the spin budget spent
        // in the provider looking at its NIC without sleeping (soft RoCE
        // at QD1: twice the I/Os a second of sleeping there at once).
        let drive = st.channel.outstanding() <= DRIVE_MAX_QUEUE || st.waiting == 1;
        st.drove = drive && st.provider_drives;
        let budget = st.reap_spin().next_budget();
        let (until, drive_spin) = if st.drove {
            (start, budget)
        } else {
            (start + budget, Duration::ZERO)
        };
        let found = loop {
            // Let go between polls: the posts queued go out (a provider
            // that completes work inside the post may answer right there),
            // the callers owed a wake-up get it, and others may take the
            // lock.
            drop(st);
            st = self.lock();
            if let Some(a) = answered(&mut st) {
                break Some(a);
            }
            if self.poll_cq_locked(&mut st, true) > 0 {
                self.drain_channel(&mut st);
                if let Some(a) = answered(&mut st) {
                    break Some(a);
                }
            } else if Instant::now() >= until {
                break None;
            } else {
                std::hint::spin_loop();
            }
        };
        let mut found = found.map(|a| (a, Found::Polling));
        while found.is_none() && !st.closed && drive {
            drop(st);
            let drove = self
                .provider
                .drive_cq(
                    self.cq,
                    drive_spin.saturating_sub(start.elapsed()),
                    DRIVE_SLICE,
                )
                .unwrap_or(false);
            st = self.lock();
            st.provider_drives = drove;
            if self.poll_cq_locked(&mut st, true) > 0 {
                self.drain_channel(&mut st);
            }
            // An answer within the longest spin teaches the spin as a
            // poll's does, though this one's budget may have been shorter:
            // the next wait looks for as long as this one took, twice.
            let how = if start.elapsed() <= st.reap_spin().max() {
                Found::Polling
            } else {
                Found::Driving
            };
            found = answered(&mut st).map(|a| (a, how));
            if !drove {
                break;
            }
        }
        // Giving the role up: arm the CQ, then take what came before the
        // arm (it raises no callback).
        st.reaper = None;
        self.reaper_polls.store(false, Ordering::SeqCst);
        let armed = self.provider.req_notify_cq(self.cq, false).is_ok();
        if self.poll_cq_locked(&mut st, armed) > 0 {
            self.drain_channel(&mut st);
        }
        let found = found.or_else(|| answered(&mut st).map(|a| (a, Found::Driving)));
        (st, found)
    }
}
