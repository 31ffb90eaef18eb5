//! Memory access rights (IBA 10.6.3.1 and 11.2.8.1).

use core::ops::{BitAnd, BitOr, BitOrAssign};

/// Access rights of a memory region, memory window or QP.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No rights beyond local read, which every registration has.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// Local write (required for any remote write or atomic, IBA 10.6.3.1).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1 << 0);
    /// Remote peers may RDMA WRITE.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// Remote peers may RDMA READ.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// Remote peers may issue atomics.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// Memory windows may be bound to the region.
    pub const MW_BIND: AccessFlags = AccessFlags(1 << 4);
    /// Zero-based addressing for windows (type 2).
    pub const ZERO_BASED: AccessFlags = AccessFlags(1 << 5);

    const NAMES: [(AccessFlags, &'static str); 6] = [
        (Self::LOCAL_WRITE, "LOCAL_WRITE"),
        (Self::REMOTE_WRITE, "REMOTE_WRITE"),
        (Self::REMOTE_READ, "REMOTE_READ"),
        (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (Self::MW_BIND, "MW_BIND"),
        (Self::ZERO_BASED, "ZERO_BASED"),
    ];

    /// All defined bits.
    pub const ALL: AccessFlags = AccessFlags(0x3F);

    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Builds from raw bits, `None` if undefined bits are set.
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 != 0 {
            None
        } else {
            Some(AccessFlags(bits))
        }
    }

    /// Whether every right in `other` is present.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the combination is legal for a memory region: remote write
    /// and remote atomic require local write (IBA 10.6.3.1, C10-80).
    pub const fn is_valid_for_mr(self) -> bool {
        let needs_local = Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0;
        self.0 & needs_local == 0 || self.0 & Self::LOCAL_WRITE.0 != 0
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: AccessFlags) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for AccessFlags {
    type Output = AccessFlags;
    fn bitand(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 & rhs.0)
    }
}

impl core::fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut first = true;
        for (flag, name) in Self::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_needs_local_write() {
        assert!(!AccessFlags::REMOTE_WRITE.is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_ATOMIC.is_valid_for_mr());
        assert!((AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE).is_valid_for_mr());
        assert!(AccessFlags::REMOTE_READ.is_valid_for_mr());
    }

    #[test]
    fn bits_round_trip_and_reject_unknown() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(AccessFlags::from_bits(f.bits()), Some(f));
        assert_eq!(AccessFlags::from_bits(1 << 20), None);
        assert_eq!(format!("{f:?}"), "LOCAL_WRITE|REMOTE_READ");
    }
}
