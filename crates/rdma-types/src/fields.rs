//! Small wire fields with a range narrower than their carrier byte: a
//! value of these types is always in range, so arithmetic on it cannot
//! overflow whatever a peer or a caller put in the byte.

use crate::{Duration, OutOfRange};

/// A 5-bit IBA time exponent: 4.096 us * 2^`n`, `n` in 0..=31 (IBA
/// 12.7.27 and 12.7.34: a CM MAD's CM response timeouts, an MRA's service
/// timeout, a REQ's local ACK timeout and a path's packet lifetime; IBA
/// 9.7.6.1.3: a QP's local ACK timeout, where 0 means "no timeout"; see
/// [`Duration::from_ack_timeout_exp`] for that meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TimeoutExp(u8);

impl TimeoutExp {
    /// The largest exponent (about 2.4 hours).
    pub const MAX: TimeoutExp = TimeoutExp(31);

    /// An exponent; fails past 31.
    pub const fn new(n: u8) -> Result<TimeoutExp, OutOfRange> {
        if n > Self::MAX.0 {
            Err(OutOfRange {
                what: "time exponent",
                value: n as u64,
            })
        } else {
            Ok(TimeoutExp(n))
        }
    }

    /// The low 5 bits of `bits` (a 5-bit wire field).
    pub const fn from_bits(bits: u8) -> TimeoutExp {
        TimeoutExp(bits & Self::MAX.0)
    }

    /// `n`, or 31 if it is larger (a wider field, e.g. a PathRecord's
    /// 6-bit PacketLifeTime, where more than 31 is a longer wait than
    /// anything the CM can say).
    pub const fn saturating(n: u8) -> TimeoutExp {
        if n > Self::MAX.0 {
            Self::MAX
        } else {
            TimeoutExp(n)
        }
    }

    /// The exponent, 0..=31.
    pub const fn value(self) -> u8 {
        self.0
    }

    /// `self + n`, at most 31 (one more is twice as long: a round trip
    /// from a one-way packet lifetime, IBA 9.7.6.1.3).
    pub const fn saturating_add(self, n: u8) -> TimeoutExp {
        Self::saturating(self.0.saturating_add(n))
    }

    /// `self - n`, at least 0.
    pub const fn saturating_sub(self, n: u8) -> TimeoutExp {
        TimeoutExp(self.0.saturating_sub(n))
    }

    /// The time it stands for: 4.096 us * 2^n (0 is 4.096 us).
    pub const fn duration(self) -> Duration {
        Duration::from_micros((4096u64 << self.0) / 1000)
    }
}

impl core::fmt::Display for TimeoutExp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({})", self.0, self.duration())
    }
}

/// A 4-bit retry count (0..=15): a REQ's Max CM Retries (IBA 12.6.5), how
/// many times a CM message is sent again before the sender gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CmRetries(u8);

impl CmRetries {
    /// The most retries the field can say.
    pub const MAX: CmRetries = CmRetries(15);

    /// A count; fails past 15.
    pub const fn new(n: u8) -> Result<CmRetries, OutOfRange> {
        if n > Self::MAX.0 {
            Err(OutOfRange {
                what: "CM retry count",
                value: n as u64,
            })
        } else {
            Ok(CmRetries(n))
        }
    }

    /// The low 4 bits of `bits` (the wire field).
    pub const fn from_bits(bits: u8) -> CmRetries {
        CmRetries(bits & Self::MAX.0)
    }

    /// The count, 0..=15.
    pub const fn value(self) -> u8 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_exponents_stay_in_five_bits() {
        assert_eq!(TimeoutExp::new(31).map(TimeoutExp::value), Ok(31));
        assert!(TimeoutExp::new(32).is_err());
        assert_eq!(TimeoutExp::from_bits(0xff).value(), 31);
        assert_eq!(TimeoutExp::from_bits(0x21).value(), 1);
        assert_eq!(TimeoutExp::saturating(63), TimeoutExp::MAX);
        // The add that overflowed a u8 in the CM (lifetime 255 + 1).
        assert_eq!(
            TimeoutExp::saturating(255).saturating_add(1),
            TimeoutExp::MAX
        );
        assert_eq!(TimeoutExp::MAX.saturating_add(u8::MAX), TimeoutExp::MAX);
        assert_eq!(TimeoutExp::from_bits(0).saturating_sub(1).value(), 0);
    }

    #[test]
    fn time_exponents_mean_4_096_us_doubled() {
        assert_eq!(
            TimeoutExp::from_bits(0).duration(),
            Duration::from_micros(4)
        );
        // 14: the common QP timeout, 67.1 ms; 20: Linux's CM response
        // timeout, 4.29 s; 31: about 2.4 hours.
        assert_eq!(
            TimeoutExp::from_bits(14).duration(),
            Duration::from_micros(67_108)
        );
        assert_eq!(
            TimeoutExp::from_bits(20).duration(),
            Duration::from_micros(4_294_967)
        );
        assert_eq!(
            TimeoutExp::MAX.duration(),
            Duration::from_micros(8_796_093_022)
        );
        // The QP meaning agrees past 0.
        for n in 1..=31 {
            let e = TimeoutExp::from_bits(n);
            assert_eq!(Duration::from_ack_timeout_exp(n), Some(e.duration()));
        }
    }

    #[test]
    fn cm_retries_stay_in_four_bits() {
        assert_eq!(CmRetries::new(15).map(CmRetries::value), Ok(15));
        assert!(CmRetries::new(16).is_err());
        assert_eq!(CmRetries::from_bits(0xff), CmRetries::MAX);
    }
}
