//! Quantities of the iWARP layers.

use core::fmt;

/// A steering tag naming a tagged buffer (RFC 5041).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct STag(pub u32);

impl fmt::Display for STag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "STag {:#010x}", self.0)
    }
}

/// A DDP message sequence number of one untagged queue (RFC 5041:
/// starts at 1 and wraps modulo 2^32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Msn(pub u32);

impl Msn {
    /// The first MSN of every queue.
    pub const FIRST: Msn = Msn(1);

    /// The MSN after this one.
    #[must_use]
    pub fn next(self) -> Msn {
        Msn(self.0.wrapping_add(1))
    }
}
