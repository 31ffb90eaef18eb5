//! Identifiers and keys of the IBA: GIDs, GUIDs, LIDs, QPNs, P_Keys, Q_Keys,
//! memory keys, MTUs and the QP state and type enumerations.

use crate::OutOfRange;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier (IBA 4.1.1). For RoCEv2 it is an IPv6 address
/// or an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// Builds a GID from a subnet prefix and an interface ID (port GUID).
    pub fn from_prefix_guid(prefix: u64, guid: Guid) -> Gid {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&prefix.to_be_bytes());
        b[8..].copy_from_slice(&guid.0.to_be_bytes());
        Gid(b)
    }

    /// The RoCEv2 GID of an IP address (IPv4 addresses are mapped).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for in RoCEv2: IPv4 when mapped.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// Whether the GID is an IPv4-mapped address.
    pub fn is_ipv4_mapped(self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// IPv4 address when the GID is IPv4-mapped.
    pub fn to_ipv4(self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The upper 64 bits.
    pub fn subnet_prefix(self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The lower 64 bits.
    pub fn interface_id(self) -> Guid {
        Guid(u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes")))
    }

    /// SCST's name form: hex with a colon after every fourth digit,
    /// e.g. `fe80:0000:0000:0000:0002:c903:0005:f34f`.
    pub fn to_scst_name(self) -> String {
        let mut s = String::with_capacity(39);
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                s.push(':');
            }
            s.push_str(&format!("{:02x}{:02x}", pair[0], pair[1]));
        }
        s
    }

    /// Parses 32 hex digits, optionally separated by colons in any places
    /// (accepts both SCST names and plain hex as used in SRP login strings).
    pub fn parse_hex(s: &str) -> Option<Gid> {
        let digits: Vec<u8> = s.bytes().filter(|&c| c != b':').collect();
        if digits.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, chunk) in digits.chunks(2).enumerate() {
            let hex = std::str::from_utf8(chunk).ok()?;
            out[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(Gid(out))
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl core::fmt::Display for Gid {
    /// Shown as an IPv6 address, the way `ibv_devinfo` and `rdma` show GIDs.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl core::fmt::Debug for Gid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// A 64-bit globally unique identifier (node, port, system image, IOC).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Guid(pub u64);

impl Guid {
    /// Parses 16 hex digits, with optional colons and optional `0x` prefix.
    pub fn parse_hex(s: &str) -> Option<Guid> {
        let s = s.strip_prefix("0x").unwrap_or(s);
        let digits: String = s.chars().filter(|&c| c != ':').collect();
        if digits.is_empty() || digits.len() > 16 {
            return None;
        }
        u64::from_str_radix(&digits, 16).ok().map(Guid)
    }
}

impl core::fmt::Display for Guid {
    /// `ibv_devinfo` form: `0002:c903:0005:f34e`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            v >> 48,
            (v >> 32) & 0xffff,
            (v >> 16) & 0xffff,
            v & 0xffff
        )
    }
}

impl core::fmt::Debug for Guid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Guid({self})")
    }
}

/// A 16-bit local identifier (IBA 4.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lid(pub u16);

impl Lid {
    /// The reserved LID 0: "not yet assigned".
    pub const UNASSIGNED: Lid = Lid(0);
    /// The permissive LID 0xFFFF (directed-route SMPs; RoCE uses it too).
    pub const PERMISSIVE: Lid = Lid(0xFFFF);
    /// First multicast LID (IBA 4.1.3: 0xC000..=0xFFFE).
    pub const MULTICAST_BASE: u16 = 0xC000;

    /// Whether this is a valid unicast LID (0x0001..=0xBFFF).
    pub const fn is_unicast(self) -> bool {
        self.0 >= 1 && self.0 < Self::MULTICAST_BASE
    }

    /// Whether this is a multicast LID.
    pub const fn is_multicast(self) -> bool {
        self.0 >= Self::MULTICAST_BASE && self.0 != 0xFFFF
    }
}

impl core::fmt::Display for Lid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 24-bit queue pair number. QP0 is the SMI QP, QP1 the GSI QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// The subnet management QP.
    pub const SMI: Qpn = Qpn(0);
    /// The general services QP.
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN 0xFFFFFF.
    pub const MULTICAST: Qpn = Qpn(0xFF_FFFF);
    /// Mask of the 24 valid bits.
    pub const MASK: u32 = 0x00FF_FFFF;

    /// Builds a QPN; fails if the value does not fit 24 bits.
    pub const fn new(value: u32) -> Result<Qpn, OutOfRange> {
        if value > Self::MASK {
            Err(OutOfRange {
                what: "QPN",
                value: value as u64,
            })
        } else {
            Ok(Qpn(value))
        }
    }

    /// Builds a QPN from the low 24 bits of `value` (wire fields).
    pub const fn from_bits(value: u32) -> Qpn {
        Qpn(value & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl core::fmt::Display for Qpn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A partition key (IBA 10.9). Bit 15 is the membership bit: 1 = full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pkey(pub u16);

impl Pkey {
    /// The default partition, full membership.
    pub const DEFAULT: Pkey = Pkey(0xFFFF);
    /// The invalid P_Key 0x0000 / 0x8000 base (IBA 10.9.1.2).
    pub const INVALID: Pkey = Pkey(0);
    const FULL_BIT: u16 = 0x8000;

    /// The 15-bit partition number.
    pub const fn base(self) -> u16 {
        self.0 & 0x7FFF
    }

    /// Whether this is a full member key.
    pub const fn is_full(self) -> bool {
        self.0 & Self::FULL_BIT != 0
    }

    /// Whether the key is valid (non-zero partition number).
    pub const fn is_valid(self) -> bool {
        self.base() != 0
    }

    /// IBA 10.9.3 P_Key match: same partition number, at least one side
    /// full member, neither invalid.
    pub const fn matches(self, other: Pkey) -> bool {
        self.is_valid()
            && other.is_valid()
            && self.base() == other.base()
            && (self.is_full() || other.is_full())
    }
}

impl core::fmt::Display for Pkey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A queue key for UD and GSI traffic (IBA 10.2.4). The high bit marks a
/// controlled Q_Key that unprivileged consumers may not send with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qkey(pub u32);

impl Qkey {
    /// The well-known GSI Q_Key (IBA 13.4.6.2... QP1 uses 0x80010000).
    pub const GSI: Qkey = Qkey(0x8001_0000);

    /// Whether the Q_Key is a controlled one.
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

/// A local memory key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lkey(pub u32);

/// A remote memory key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rkey(pub u32);

impl core::fmt::Display for Lkey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

impl core::fmt::Display for Rkey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A port number on a CA; ports count from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PortNum(pub u8);

/// Path MTU (IBA 9.7.5.1.1 and the PortInfo encoding: 1 = 256 .. 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

/// A path MTU that is not one of the five IB sizes ([`Mtu::parse`]); the
/// message names it and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtuError(pub String);

impl core::fmt::Display for MtuError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "`{}` is not an IB path MTU: use 256, 512, 1024, 2048 or 4096 bytes \
             (1024 on a 1500-byte Ethernet link, 4096 on loopback or a 9000-byte one)",
            self.0
        )
    }
}

impl std::error::Error for MtuError {}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        128 << (self as usize)
    }

    /// The IBA enumeration value (1..=5).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// From the IBA enumeration value.
    pub const fn from_code(code: u8) -> Result<Mtu, OutOfRange> {
        match code {
            1 => Ok(Mtu::Mtu256),
            2 => Ok(Mtu::Mtu512),
            3 => Ok(Mtu::Mtu1024),
            4 => Ok(Mtu::Mtu2048),
            5 => Ok(Mtu::Mtu4096),
            _ => Err(OutOfRange {
                what: "MTU code",
                value: code as u64,
            }),
        }
    }

    /// From a byte count, which must be one of the five sizes.
    pub const fn from_bytes(bytes: usize) -> Result<Mtu, OutOfRange> {
        match bytes {
            256 => Ok(Mtu::Mtu256),
            512 => Ok(Mtu::Mtu512),
            1024 => Ok(Mtu::Mtu1024),
            2048 => Ok(Mtu::Mtu2048),
            4096 => Ok(Mtu::Mtu4096),
            _ => Err(OutOfRange {
                what: "MTU",
                value: bytes as u64,
            }),
        }
    }

    /// A path MTU as written on a command line or in a configuration
    /// key: `1024`, or a size with its unit (`4k`, [`crate::units`]).
    ///
    /// # Errors
    /// Anything but the five IB sizes, with the sizes that would do.
    pub fn parse(s: &str) -> Result<Mtu, MtuError> {
        crate::units::parse_size(s)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| Mtu::from_bytes(n).ok())
            .ok_or_else(|| MtuError(s.trim().to_string()))
    }

    /// The largest IB MTU whose packets fit an IP MTU of `ip_mtu` bytes
    /// with RoCEv2 headers (IPv6 40 + UDP 8 + BTH 12 + largest ext 28 + ICRC 4),
    /// the way rxe derives `active_mtu` from the netdev MTU.
    pub fn for_ip_mtu(ip_mtu: usize) -> Option<Mtu> {
        const OVERHEAD: usize = 40 + 8 + 12 + 28 + 4;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() + OVERHEAD <= ip_mtu)
    }
}

impl core::fmt::Display for Mtu {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// Queue pair states (IBA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain.
    Sqd,
    /// Send queue error (UC/UD only).
    Sqe,
    /// Error.
    Err,
}

impl core::fmt::Display for QpState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        };
        f.write_str(s)
    }
}

/// Transport service types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// QP0, the subnet management interface (UD semantics, VL15).
    Smi,
    /// QP1, the general services interface (UD semantics).
    Gsi,
}

impl QpType {
    /// Whether the type is datagram (UD, SMI, GSI).
    pub const fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Smi | QpType::Gsi)
    }
}

impl core::fmt::Display for QpType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::Smi => "SMI",
            QpType::Gsi => "GSI",
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_from_ipv4_is_mapped() {
        let g = Gid::from_ip("192.168.5.1".parse().unwrap());
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_string(), "::ffff:192.168.5.1");
        assert_eq!(g.to_ip(), "192.168.5.1".parse::<IpAddr>().unwrap());
        let g6 = Gid::from_ip("fd00::1".parse().unwrap());
        assert!(!g6.is_ipv4_mapped());
        assert_eq!(g6.to_ipv4(), None);
    }

    #[test]
    fn gid_scst_name_round_trip() {
        let g = Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0x0002_c903_0005_f34f));
        let name = g.to_scst_name();
        assert_eq!(name, "fe80:0000:0000:0000:0002:c903:0005:f34f");
        assert_eq!(Gid::parse_hex(&name), Some(g));
        assert_eq!(Gid::parse_hex("fe800000000000000002c9030005f34f"), Some(g));
        assert_eq!(Gid::parse_hex("fe80"), None);
        assert_eq!(Gid::parse_hex("zz800000000000000002c9030005f34f"), None);
        assert_eq!(g.interface_id(), Guid(0x0002_c903_0005_f34f));
    }

    #[test]
    fn guid_format_and_parse() {
        let g = Guid(0x0002_c903_0005_f34e);
        assert_eq!(g.to_string(), "0002:c903:0005:f34e");
        assert_eq!(Guid::parse_hex("0002c9030005f34e"), Some(g));
        assert_eq!(Guid::parse_hex("0x0002c9030005f34e"), Some(g));
        assert_eq!(Guid::parse_hex("0002:c903:0005:f34e"), Some(g));
        assert_eq!(Guid::parse_hex("10002c9030005f34e"), None);
    }

    #[test]
    fn pkey_matching_rules() {
        let full = Pkey(0xFFFF);
        let limited = Pkey(0x7FFF);
        assert!(full.matches(limited));
        assert!(
            !limited.matches(limited),
            "two limited members may not talk"
        );
        assert!(!Pkey(0x8001).matches(Pkey(0x8002)));
        assert!(
            !Pkey(0x8000).matches(Pkey(0x8000)),
            "partition 0 is invalid"
        );
    }

    #[test]
    fn qpn_is_24_bits() {
        assert!(Qpn::new(0x100_0000).is_err());
        assert_eq!(Qpn::from_bits(0x1234_5678).value(), 0x34_5678);
    }

    #[test]
    fn mtus_as_written() {
        assert_eq!(Mtu::parse("1024"), Ok(Mtu::Mtu1024));
        assert_eq!(Mtu::parse(" 4k "), Ok(Mtu::Mtu4096));
        for bad in ["1500", "9000", "0", "", "big", "99999999999999999999"] {
            let e = Mtu::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{}`", bad.trim()))
                    && e.contains("256, 512, 1024, 2048 or 4096"),
                "{e}"
            );
        }
    }

    #[test]
    fn mtu_codes() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::from_code(3), Ok(Mtu::Mtu1024));
        assert!(Mtu::from_code(6).is_err());
        assert!(Mtu::from_bytes(1500).is_err());
        // A 1500-byte Ethernet link gives 1024, as rxe reports.
        assert_eq!(Mtu::for_ip_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_ip_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_ip_mtu(65536), Some(Mtu::Mtu4096));
    }

    #[test]
    fn lid_classes() {
        assert!(Lid(1).is_unicast());
        assert!(!Lid(0).is_unicast());
        assert!(Lid(0xC000).is_multicast());
        assert!(!Lid::PERMISSIVE.is_multicast());
    }
}
