//! 24-bit packet sequence numbers with wrapping comparison (IBA 9.7.1).

use core::cmp::Ordering;

/// A packet sequence number: 24 bits, arithmetic modulo 2^24.
///
/// Ordering is defined over a window of half the sequence space: `a < b`
/// when `b` is at most 2^23 - 1 ahead of `a` (IBA 9.7.5.1.2 treats the other
/// half as "behind", i.e. duplicates). `Psn` therefore implements
/// `PartialOrd` but not `Ord`: the relation is not transitive around the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 valid bits.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half the sequence space: the window for comparisons.
    pub const HALF: u32 = 0x0080_0000;

    /// Builds a PSN, keeping only the low 24 bits.
    pub const fn new(value: u32) -> Self {
        Psn(value & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance from `other` to `self` in the range -2^23 .. 2^23.
    /// Positive when `self` is ahead of `other`.
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to
        // sign-extend it.
        (((self.0.wrapping_sub(other.0)) << 8) as i32) >> 8
    }

    /// Number of PSNs from `start` up to (not including) `self`, modulo 2^24.
    pub const fn distance_from(self, start: Psn) -> u32 {
        self.0.wrapping_sub(start.0) & Self::MASK
    }
}

impl PartialOrd for Psn {
    fn partial_cmp(&self, other: &Psn) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl core::fmt::Display for Psn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0x1FF_FFFF).value(), 0xFF_FFFF);
        assert_eq!(Psn::new(0xFF_FFFF).next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xFF_FFFF));
        assert_eq!(Psn::new(5).add(0xFF_FFFF), Psn::new(4));
    }

    #[test]
    fn compares_across_the_wrap() {
        let last = Psn::new(0xFF_FFFE);
        let first = Psn::new(1);
        assert!(last < first, "1 is 3 ahead of 0xFFFFFE");
        assert!(first > last);
        assert_eq!(first.diff(last), 3);
        assert_eq!(last.diff(first), -3);
        assert_eq!(first.distance_from(last), 3);
    }

    #[test]
    fn half_window_boundary() {
        let a = Psn::new(0);
        assert!(Psn::new(Psn::HALF - 1) > a);
        // Exactly half way is "behind" (negative): -2^23.
        assert!(Psn::new(Psn::HALF) < a);
        assert_eq!(Psn::new(Psn::HALF).diff(a), -(Psn::HALF as i32));
    }
}
