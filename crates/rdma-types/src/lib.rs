//! Plain value types shared by every layer of the stack.
//!
//! This crate sits at the bottom: it depends on nothing and holds only values
//! with the arithmetic the InfiniBand Architecture Specification (IBA) allows
//! on them. Protocol code never reads an OS clock; it receives [`Instant`]s
//! from its driver, so a simulator can run it on a virtual clock.
//!
//! It also holds the one parser of sizes and durations as people write
//! them (`units`: `64M`, `30s`), which every binary's command line and
//! configuration file uses.
//!
//! What it refuses to do: I/O, allocation-heavy work, anything with state.

#![forbid(unsafe_code)]

mod fields;
mod flags;
pub mod idmap;
pub mod idring;
mod ids;
mod psn;
mod time;
pub mod units;
pub mod view;
mod violation;
mod wc;

pub use fields::{CmRetries, TimeoutExp};
pub use flags::AccessFlags;
pub use idmap::{remove_if_any, IdMap, IdSet};
pub use idring::{IdRing, RingId};
pub use ids::{
    Gid, Guid, Lid, Lkey, Mtu, MtuError, Pkey, PortNum, Qkey, QpState, QpType, Qpn, Rkey,
};
pub use psn::Psn;
pub use time::{Duration, Instant};
pub use violation::PkeyViolation;
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

/// Defines an open code space (opcodes, classes, reasons, status codes): an
/// enum with `Unknown(n)`, conversions both ways, `ALL`, `text()` and
/// `Display`, all from one table. Used by the wire crates. An unknown
/// value displays as `unknown (0x..)`, or as `<words> 0x..` when the
/// table gives its words after the type (`pub enum Reason(u32), "unknown
/// reason" { .. }`).
#[macro_export]
macro_rules! open_enum {
    (@unknown $f:ident, $v:expr) => {
        write!($f, "unknown ({:#x})", $v)
    };
    (@unknown $f:ident, $v:expr, $words:literal) => {
        write!($f, concat!($words, " {:#x}"), $v)
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident($ty:ty) $(, $unknown:literal)? {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr => $text:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this table does not name.
            Unknown($ty),
        }

        impl $name {
            /// Every named value, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The name in words, or `None` for `Unknown`.
            pub fn text(self) -> Option<&'static str> {
                match self {
                    $( $name::$variant => Some($text), )*
                    $name::Unknown(_) => None,
                }
            }
        }

        impl From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )*
                    $name::Unknown(other) => other,
                }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.text() {
                    Some(t) => f.write_str(t),
                    None => $crate::open_enum!(@unknown f, <$ty>::from(*self) $(, $unknown)?),
                }
            }
        }
    };
}
