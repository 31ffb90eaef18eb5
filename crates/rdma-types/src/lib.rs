//! Plain value types shared by every layer of the stack.
//!
//! This crate sits at the bottom: it depends on nothing and holds only values
//! with the arithmetic the InfiniBand Architecture Specification (IBA) allows
//! on them. Protocol code never reads an OS clock; it receives [`Instant`]s
//! from its driver, so a simulator can run it on a virtual clock.
//!
//! What it refuses to do: I/O, allocation-heavy work, anything with state.

mod flags;
mod ids;
mod psn;
mod time;
mod wc;

pub use flags::AccessFlags;
pub use ids::{Gid, Guid, Lid, Lkey, Mtu, Pkey, PortNum, Qkey, QpState, QpType, Qpn, Rkey};
pub use psn::Psn;
pub use time::{Duration, Instant};
pub use wc::{WcOpcode, WcStatus};

/// Error returned when a value is out of range for its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    /// What was being built ("QPN", "PSN", "MTU", ...).
    pub what: &'static str,
    /// The offending value.
    pub value: u64,
}

impl core::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} out of range: {}", self.what, self.value)
    }
}

impl std::error::Error for OutOfRange {}
