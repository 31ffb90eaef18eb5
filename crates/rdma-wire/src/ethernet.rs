//! Ethernet II framing, only to carry RoCEv2 captures and pcap output: no
//! VLAN tags (refused), no FCS (captures on Linux do not include it).

use crate::bytes::{be16, need, put16};
use crate::ParseError;

/// Ethernet header length.
pub const HEADER_LEN: usize = 14;

/// Minimum frame length without FCS; shorter frames are padded on the wire.
pub const MIN_FRAME_LEN: usize = 60;

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

/// EtherType values RoCEv2 rides on; others are kept as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x86DD.
    Ipv6,
    /// Anything else (ARP, VLAN, RoCEv1 0x8915, ...).
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x86DD => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Ipv6 => 0x86DD,
            EtherType::Unknown(o) => o,
        }
    }
}

/// A view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct EthernetPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetPacket<T> {
    /// Wraps a buffer unchecked; getters panic if it is shorter than 14.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetPacket { buffer }
    }
    /// Wraps a buffer of at least 14 bytes.
    ///
    /// # Errors
    /// [`ParseError::Truncated`].
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        need("Ethernet", HEADER_LEN, buffer.as_ref().len())?;
        Ok(EthernetPacket { buffer })
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        a
    }
    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        a
    }
    /// EtherType.
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be16(&self.buffer.as_ref()[field::ETHERTYPE]))
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetPacket<T> {
    /// Sets the destination MAC.
    pub fn set_dst(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a);
    }
    /// Sets the source MAC.
    pub fn set_src(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a);
    }
    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, t: EtherType) {
        put16(&mut self.buffer.as_mut()[field::ETHERTYPE], t.into());
    }
}

/// A parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &EthernetPacket<T>) -> EthernetRepr {
        EthernetRepr {
            dst: p.dst(),
            src: p.src(),
            ethertype: p.ethertype(),
        }
    }
    /// Header length (14).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 14 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut EthernetPacket<T>) {
        p.set_dst(self.dst);
        p.set_src(self.src);
        p.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet header of frame 5 of userspace-cm-req-to-linux-rxe.pcapng.
    const HDR: [u8; 14] = [
        0x52, 0x54, 0x00, 0x77, 0x00, 0x02, // destination (qemu VM)
        0x36, 0xd0, 0x4c, 0x88, 0x74, 0x68, // source (host bridge side)
        0x86, 0xdd, // EtherType IPv6
    ];

    #[test]
    fn round_trip() {
        let r = EthernetRepr::parse(&EthernetPacket::new_checked(&HDR[..]).unwrap());
        assert_eq!(r.ethertype, EtherType::Ipv6);
        assert_eq!(r.dst, [0x52, 0x54, 0, 0x77, 0, 2]);
        let mut out = [0u8; 14];
        r.emit(&mut EthernetPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, HDR);
        assert!(EthernetPacket::new_checked(&HDR[..13]).is_err());
        assert_eq!(EtherType::from(0x0806), EtherType::Unknown(0x0806));
    }
}
