//! Requests sent again until answered, sans-IO: the retry discipline of
//! MAD requesters (IBA 13.4.6.4: a request unanswered after its timeout
//! is sent again, a bounded number of times, then given up), shared by the
//! GSI dispatcher ([`crate::gsi`]) and the subnet manager's SMPs.
//!
//! The table holds what the caller needs to send a request again and to
//! act on its answer, keyed by transaction ID; it sends nothing itself:
//! [`Retries::expire`] says which requests are due again and which ran
//! out of retries.

use rdma_types::{Duration, Instant};
use std::collections::HashMap;

/// One request waiting for its answer.
#[derive(Debug, Clone)]
pub struct Sent<T> {
    /// What the caller keeps for it (the MAD, where it went, why).
    pub req: T,
    timeout: Duration,
    retries_left: u32,
    deadline: Instant,
}

/// What came of a request whose timeout passed.
#[derive(Debug)]
pub enum Due<'a, T> {
    /// Send it again (its timer is armed anew).
    Resend(&'a T),
    /// Out of retries: removed from the table.
    GaveUp(T),
}

/// Requests waiting for their answers, by transaction ID.
#[derive(Debug, Clone)]
pub struct Retries<T> {
    sent: HashMap<u64, Sent<T>>,
}

impl<T> Default for Retries<T> {
    fn default() -> Self {
        Retries {
            sent: HashMap::new(),
        }
    }
}

impl<T> Retries<T> {
    /// Takes note of request `tid`, sent at `now`: due again after
    /// `timeout`, `retries` more times.
    pub fn insert(&mut self, tid: u64, now: Instant, timeout: Duration, retries: u32, req: T) {
        self.sent.insert(
            tid,
            Sent {
                req,
                timeout,
                retries_left: retries,
                deadline: now + timeout,
            },
        );
    }

    /// Puts back a request taken out with [`Retries::remove`], with the
    /// retries it had left and its timer as it was.
    pub fn restore(&mut self, tid: u64, sent: Sent<T>) {
        self.sent.insert(tid, sent);
    }

    /// The request `tid`, if it waits.
    pub fn get_mut(&mut self, tid: u64) -> Option<&mut T> {
        self.sent.get_mut(&tid).map(|s| &mut s.req)
    }

    /// Progress on request `tid` (a segment of its answer): its timeout
    /// starts again from `now`.
    pub fn rearm(&mut self, tid: u64, now: Instant) {
        if let Some(s) = self.sent.get_mut(&tid) {
            s.deadline = now + s.timeout;
        }
    }

    /// Request `tid` is answered (or abandoned): out of the table.
    pub fn remove(&mut self, tid: u64) -> Option<Sent<T>> {
        self.sent.remove(&tid)
    }

    /// Keeps only the requests `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.sent.retain(|_, s| keep(&s.req));
    }

    /// No request waits.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// When [`Retries::expire`] is next due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.sent.values().map(|s| s.deadline).min()
    }

    /// Calls `on` for every request whose timeout has passed at `now`, in
    /// transaction-ID order: [`Due::Resend`] (its timer armed again and one
    /// retry used) or [`Due::GaveUp`] (removed).
    pub fn expire(&mut self, now: Instant, mut on: impl FnMut(u64, Due<'_, T>)) {
        let mut due: Vec<u64> = self
            .sent
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(tid, _)| *tid)
            .collect();
        due.sort_unstable();
        for tid in due {
            let Some(s) = self.sent.get_mut(&tid) else {
                continue;
            };
            if s.retries_left > 0 {
                s.retries_left -= 1;
                s.deadline = now + s.timeout;
                on(tid, Due::Resend(&s.req));
            } else if let Some(s) = self.sent.remove(&tid) {
                on(tid, Due::GaveUp(s.req));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1000)
    }

    /// What `expire` said at `now`, as (tid, resent or gave up).
    fn expired(r: &mut Retries<&'static str>, now: Instant) -> Vec<(u64, &'static str)> {
        let mut out = Vec::new();
        r.expire(now, |tid, d| {
            out.push(match d {
                Due::Resend(_) => (tid, "resend"),
                Due::GaveUp(_) => (tid, "gave up"),
            })
        });
        out
    }

    #[test]
    fn a_request_is_sent_again_its_retries_then_given_up() {
        let mut r = Retries::default();
        r.insert(7, at(0), Duration::from_millis(100), 2, "smp");
        assert_eq!(r.next_deadline(), Some(at(100)));
        assert!(expired(&mut r, at(99)).is_empty());
        assert_eq!(expired(&mut r, at(100)), [(7, "resend")]);
        assert_eq!(r.next_deadline(), Some(at(200)));
        assert_eq!(expired(&mut r, at(200)), [(7, "resend")]);
        assert_eq!(expired(&mut r, at(300)), [(7, "gave up")]);
        assert!(r.is_empty() && r.next_deadline().is_none());
    }

    #[test]
    fn progress_rearms_and_a_removed_request_can_be_restored() {
        let mut r = Retries::default();
        r.insert(1, at(0), Duration::from_millis(100), 1, "a");
        r.insert(2, at(0), Duration::from_millis(100), 0, "b");
        r.rearm(1, at(90));
        assert_eq!(expired(&mut r, at(100)), [(2, "gave up")]);
        let s = r.remove(1).unwrap();
        assert_eq!(s.req, "a");
        r.restore(1, s);
        assert_eq!(expired(&mut r, at(190)), [(1, "resend")]);
        r.retain(|req| *req != "a");
        assert!(r.is_empty());
    }
}
