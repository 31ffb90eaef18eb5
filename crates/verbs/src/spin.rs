//! How long a consumer polls its CQ before it sleeps, learned from how
//! long its recent waits took ([`Spin`]).
//!
//! Polling catches a completion microseconds after it lands, where a
//! sleep costs two context switches and a wake-up; but a consumer that
//! polls in vain takes a core from the threads that make its completion
//! (on a machine of few cores, the completion then comes later). So the
//! budget follows the waits: twice those that ended within the longest
//! spin, nothing after one that did not.

use std::time::Duration;

/// One wait in this many polls for the whole longest spin, so a budget
/// gone to nothing grows again when completions get quicker.
pub const PROBE_EVERY: u32 = 64;

/// A learned polling budget (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Spin {
    /// The longest budget.
    max: Duration,
    /// The current budget.
    budget: Duration,
    /// Waits so far (wrapping), for the probes.
    waits: u32,
}

impl Spin {
    /// A budget of at most `max`, starting there.
    pub fn new(max: Duration) -> Spin {
        Spin {
            max,
            budget: max,
            waits: 0,
        }
    }

    /// The longest budget.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The budget for the next wait: the learned one, or the longest for
    /// one wait in [`PROBE_EVERY`].
    pub fn next_budget(&mut self) -> Duration {
        self.waits = self.waits.wrapping_add(1);
        if self.waits.is_multiple_of(PROBE_EVERY) {
            self.max
        } else {
            self.budget
        }
    }

    /// Learns from one wait that took `waited`, its completion found while
    /// polling (`polled`: the next wait polls twice as long, up to the
    /// longest) or after a sleep (the next polls less).
    pub fn learn(&mut self, waited: Duration, polled: bool) {
        let goal = if polled {
            (waited * 2).min(self.max)
        } else {
            Duration::ZERO
        };
        // A moving average: one odd wait moves it a quarter of the way.
        self.budget = (self.budget * 3 + goal) / 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_follows_short_waits_and_fades_for_long_ones() {
        let max = Duration::from_micros(50);
        let mut s = Spin::new(max);
        assert_eq!(s.next_budget(), max, "the first wait polls");
        for _ in 0..32 {
            s.learn(Duration::from_micros(10), true);
        }
        let b = s.next_budget();
        assert!(
            b > Duration::from_micros(15) && b <= Duration::from_micros(30),
            "{b:?}"
        );
        for _ in 0..32 {
            s.learn(Duration::from_micros(40), true);
        }
        assert_eq!(s.next_budget().as_micros(), 49, "capped at the longest");
        for _ in 0..32 {
            s.learn(Duration::from_micros(40), false);
        }
        assert!(s.next_budget() < Duration::from_micros(1), "polled in vain");
        // Faded, it still polls the whole time now and then.
        let probes = (0..PROBE_EVERY).filter(|_| s.next_budget() == max).count();
        assert_eq!(probes, 1);
    }
}
