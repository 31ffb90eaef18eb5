//! Commands whose outcome is in doubt, and how long a write in doubt keeps
//! its caller waiting.
//!
//! A command that was sent on a channel that then failed (its QP errored,
//! its port went down) ends with `TransportFailed`: the target may have
//! executed it, may never have seen it, or may still see it later. The
//! last is not theory. When the far end of an Ethernet link goes down, the
//! Linux host that sent into it keeps the datagrams its neighbour entry
//! could not resolve (the entry is INCOMPLETE) and sends them the moment
//! the link answers ARP again, up to `mcast_solicit` × `retrans_time_ms`
//! (3 × 1 s by default) after they were sent. A retransmission of the old
//! QP that waited there reaches a target that never noticed the outage,
//! and its responder executes it as the next command of a live channel
//! (issue 33: a block read back older than its last acknowledged write).
//!
//! The retry of such a write on another path (or on a new login) is
//! harmless by itself: both copies carry the same data. What breaks is a
//! *later* write of the same block landing before the old copy. The
//! caller only writes a block again once it has seen the previous write
//! complete, so the fence is on the completion: a write or UNMAP that was
//! in doubt on some attempt completes (successfully on another path, or
//! with an error) no earlier than [`IN_DOUBT_HOLD`] after the failure was
//! noticed, by which time every old copy has been delivered or dropped.
//! Reads are not held, and the retry itself goes out at once, so failover
//! stays as fast as before for everything else. Linux has the same hazard
//! and holds much longer: ib_srp fails commands of a broken channel only
//! after `fast_io_fail_tmo` (15 s by default).

use std::error::Error;
use std::fmt;
use std::io;
use std::time::{Duration, Instant};

/// How long after a failure was noticed a write in doubt may complete:
/// Linux's default neighbour resolution time (3 s, see the module
/// documentation) plus room for the target to take in and run what it
/// received late.
pub const IN_DOUBT_HOLD: Duration = Duration::from_secs(5);

/// The error payload of a command that was sent and whose channel failed
/// before it was answered; its kind is `ConnectionAborted`.
#[derive(Debug)]
pub struct InDoubt {
    /// When the failure was noticed.
    pub since: Instant,
    what: String,
}

impl fmt::Display for InDoubt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (outcome unknown: the channel failed)", self.what)
    }
}

impl Error for InDoubt {}

/// A `ConnectionAborted` error for a command in doubt from now on.
pub fn in_doubt(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        InDoubt {
            since: Instant::now(),
            what,
        },
    )
}

/// The latest failure among one operation's attempts that left it in
/// doubt, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Doubt(Option<Instant>);

impl Doubt {
    /// No attempt in doubt.
    pub const NONE: Doubt = Doubt(None);

    /// Takes note of an attempt's error (only [`in_doubt`] errors count).
    pub fn note(&mut self, e: &io::Error) {
        if let Some(d) = e.get_ref().and_then(|i| i.downcast_ref::<InDoubt>()) {
            self.merge(Doubt(Some(d.since)));
        }
    }

    /// Takes note of another layer's doubt.
    pub fn merge(&mut self, other: Doubt) {
        self.0 = self.0.max(other.0);
    }

    /// When the operation may complete, if it must wait at all.
    pub fn until(self, hold: Duration) -> Option<Instant> {
        self.0.map(|since| since + hold)
    }

    /// Waits until the operation may complete.
    pub fn settle(self, hold: Duration) {
        if let Some(until) = self.until(hold) {
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_in_doubt_errors_count_and_the_latest_wins() {
        let mut d = Doubt::NONE;
        d.note(&io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "never sent",
        ));
        assert_eq!(d, Doubt::NONE);
        let first = in_doubt("WRITE(16)".into());
        d.note(&first);
        let t1 = d.until(Duration::ZERO).unwrap();
        let second = in_doubt("WRITE(16)".into());
        d.note(&first);
        assert_eq!(d.until(Duration::ZERO), Some(t1));
        d.note(&second);
        assert!(d.until(Duration::ZERO).unwrap() >= t1);
        assert!(second.to_string().contains("outcome unknown"), "{second}");
        assert_eq!(second.kind(), io::ErrorKind::ConnectionAborted);
    }
}
