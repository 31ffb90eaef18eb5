//! Our own time types. Protocol cores take `Instant` as input and never read a
//! clock; drivers convert from `std::time` at the edge.

use core::ops::{Add, AddAssign, Sub, SubAssign};

/// A point in time, in microseconds since an arbitrary epoch chosen by the
/// driver (process start for real drivers, zero for the simulator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    micros: u64,
}

/// A span of time in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    micros: u64,
}

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant { micros: 0 };

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Instant { micros }
    }

    /// An instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Instant {
            micros: millis * 1000,
        }
    }

    /// Microseconds since the epoch.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Milliseconds since the epoch (truncated).
    pub const fn total_millis(self) -> u64 {
        self.micros / 1000
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.micros.saturating_sub(earlier.micros))
    }

    /// Converts a `std::time::Instant` measured against `epoch`; for drivers.
    pub fn from_std(epoch: std::time::Instant, now: std::time::Instant) -> Self {
        // In 64 bits (`as_micros` multiplies in 128): 584,000 years of
        // microseconds fit.
        let d = now.saturating_duration_since(epoch);
        Instant::from_micros(d.as_secs() * 1_000_000 + u64::from(d.subsec_micros()))
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration { micros: 0 };
    /// The largest representable span; used as "never".
    pub const MAX: Duration = Duration { micros: u64::MAX };

    /// A span of `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Self {
        Duration { micros }
    }

    /// A span of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Duration {
            micros: millis.saturating_mul(1000),
        }
    }

    /// A span of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration {
            micros: secs.saturating_mul(1_000_000),
        }
    }

    /// Length in microseconds.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Length in milliseconds (truncated).
    pub const fn total_millis(self) -> u64 {
        self.micros / 1000
    }

    /// The IBA local ACK timeout encoding: 4.096 us * 2^`exp` (IBA 9.7.6.1.3
    /// and 11.2.4.2). `exp` is the 5-bit `timeout` attribute; 0 means
    /// "infinite", returned as `None`.
    pub fn from_ack_timeout_exp(exp: u8) -> Option<Duration> {
        (exp != 0).then(|| crate::TimeoutExp::saturating(exp).duration())
    }

    /// Converts to `std::time::Duration`; for drivers.
    pub const fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_micros(self.micros)
    }

    /// Converts from `std::time::Duration`, saturating.
    pub fn from_std(d: std::time::Duration) -> Self {
        Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// Multiplies, saturating.
    pub const fn saturating_mul(self, n: u64) -> Duration {
        Duration {
            micros: self.micros.saturating_mul(n),
        }
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_add(rhs.micros),
        }
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_sub(rhs.micros),
        }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero when `rhs` is later than `self`.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_add(rhs.micros),
        }
    }
}

impl AddAssign for Duration {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub for Duration {
    type Output = Duration;
    fn sub(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(rhs.micros),
        }
    }
}

impl SubAssign for Duration {
    fn sub_assign(&mut self, rhs: Duration) {
        *self = *self - rhs;
    }
}

impl core::fmt::Display for Instant {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.micros / 1_000_000,
            self.micros % 1_000_000
        )
    }
}

impl core::fmt::Display for Duration {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.micros >= 1_000_000 {
            write!(
                f,
                "{}.{:03}s",
                self.micros / 1_000_000,
                (self.micros / 1000) % 1000
            )
        } else if self.micros >= 1000 {
            write!(f, "{}.{:03}ms", self.micros / 1000, self.micros % 1000)
        } else {
            write!(f, "{}us", self.micros)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!(t + Duration::from_millis(2), Instant::from_millis(7));
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::from_millis(2), Duration::from_millis(3));
        assert_eq!(
            Instant::from_micros(u64::MAX) + Duration::from_micros(1),
            Instant::from_micros(u64::MAX)
        );
    }

    #[test]
    fn ack_timeout_encoding() {
        // IBA 9.7.6.1.3: 4.096 us * 2^timeout; 0 = infinite.
        assert_eq!(Duration::from_ack_timeout_exp(0), None);
        assert_eq!(
            Duration::from_ack_timeout_exp(1),
            Some(Duration::from_micros(8))
        );
        // 14 -> 67.1 ms, the common default.
        assert_eq!(
            Duration::from_ack_timeout_exp(14),
            Some(Duration::from_micros(67_108))
        );
        // 31 is the largest encodable value (~2.4 hours).
        assert_eq!(
            Duration::from_ack_timeout_exp(31),
            Some(Duration::from_micros(8_796_093_022))
        );
    }

    #[test]
    fn display() {
        assert_eq!(Duration::from_micros(12).to_string(), "12us");
        assert_eq!(Duration::from_micros(1500).to_string(), "1.500ms");
        assert_eq!(Duration::from_millis(2500).to_string(), "2.500s");
        assert_eq!(Instant::from_micros(1_000_002).to_string(), "1.000002s");
    }
}
