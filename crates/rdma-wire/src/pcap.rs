//! Classic pcap writer (the libpcap file format: a 24-byte global header,
//! then a 16-byte record header before each packet), so the soft NIC can
//! write captures that tshark/Wireshark decode as RoCEv2, and a reader of
//! the same format for tests that check what a node captured.

use std::io::{self, Write};

use rdma_types::Instant;

/// Link type of the records (tcpdump.org link-layer header types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// LINKTYPE_ETHERNET (1): records start with an Ethernet header.
    Ethernet,
    /// LINKTYPE_RAW (101): records start with an IPv4 or IPv6 header.
    Raw,
}

impl LinkType {
    /// The number in the global header.
    pub const fn code(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::Raw => 101,
        }
    }
}

/// Magic of a microsecond-resolution pcap file.
pub const MAGIC: u32 = 0xA1B2_C3D4;
/// Largest record written whole; longer packets are cut (and the record
/// says their original length).
pub const SNAPLEN: u32 = 262_144;

/// Writes a pcap stream to `W`.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header (native byte order, which the magic tells
    /// readers).
    ///
    /// # Errors
    /// Whatever `out` returns.
    pub fn new(mut out: W, link: LinkType) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC.to_ne_bytes());
        h[4..6].copy_from_slice(&2u16.to_ne_bytes()); // version 2.4
        h[6..8].copy_from_slice(&4u16.to_ne_bytes());
        // thiszone and sigfigs: 0
        h[16..20].copy_from_slice(&SNAPLEN.to_ne_bytes());
        h[20..24].copy_from_slice(&link.code().to_ne_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Appends one packet stamped `ts` (our clock: microseconds since the
    /// driver's epoch).
    ///
    /// # Errors
    /// Whatever the writer returns.
    pub fn write_packet(&mut self, ts: Instant, data: &[u8]) -> io::Result<()> {
        let us = ts.total_micros();
        let orig = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let incl = orig.min(SNAPLEN);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((us / 1_000_000) as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&((us % 1_000_000) as u32).to_ne_bytes());
        h[8..12].copy_from_slice(&incl.to_ne_bytes());
        h[12..16].copy_from_slice(&orig.to_ne_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&data[..incl as usize])
    }

    /// Flushes and returns the writer.
    ///
    /// # Errors
    /// Whatever the flush returns.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One record of a classic pcap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Timestamp in microseconds.
    pub ts_micros: u64,
    /// The captured bytes (at most the snap length).
    pub data: &'a [u8],
}

/// Reads a classic microsecond pcap file (either byte order): its link
/// type code and its records.
///
/// # Errors
/// A bad magic number or a record running past the end of the file.
pub fn read(bytes: &[u8]) -> Result<(u32, Vec<Record<'_>>), &'static str> {
    if bytes.len() < 24 {
        return Err("shorter than a pcap global header");
    }
    let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
    let swap = if magic == MAGIC.to_ne_bytes() {
        false
    } else if magic == MAGIC.swap_bytes().to_ne_bytes() {
        true
    } else {
        return Err("not a microsecond pcap file (bad magic)");
    };
    let u32_at = |o: usize| {
        let v = u32::from_ne_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        if swap {
            v.swap_bytes()
        } else {
            v
        }
    };
    let link = u32_at(20);
    let mut out = Vec::new();
    let mut off = 24;
    while off < bytes.len() {
        if off + 16 > bytes.len() {
            return Err("truncated record header");
        }
        let ts = u64::from(u32_at(off)) * 1_000_000 + u64::from(u32_at(off + 4));
        let incl = u32_at(off + 8) as usize;
        off += 16;
        let data = bytes
            .get(off..off + incl)
            .ok_or("record runs past the end of the file")?;
        out.push(Record {
            ts_micros: ts,
            data,
        });
        off += incl;
    }
    Ok((link, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back what the writer wrote, independently of it.
    fn read_back(b: &[u8]) -> (u32, Vec<(u64, Vec<u8>)>) {
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        assert_eq!(u32_at(0), MAGIC);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 2);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 4);
        let link = u32_at(20);
        let mut off = 24;
        let mut out = Vec::new();
        while off < b.len() {
            let (sec, usec, incl, orig) = (
                u32_at(off),
                u32_at(off + 4),
                u32_at(off + 8),
                u32_at(off + 12),
            );
            assert_eq!(incl, orig);
            off += 16;
            out.push((
                u64::from(sec) * 1_000_000 + u64::from(usec),
                b[off..off + incl as usize].to_vec(),
            ));
            off += incl as usize;
        }
        (link, out)
    }

    #[test]
    fn writes_records_that_read_back() {
        let mut w = PcapWriter::new(Vec::new(), LinkType::Raw).unwrap();
        w.write_packet(Instant::from_micros(1_500_000), b"abc")
            .unwrap();
        w.write_packet(Instant::from_micros(2_000_001), &[7u8; 100])
            .unwrap();
        let bytes = w.into_inner().unwrap();
        let (link, recs) = read_back(&bytes);
        assert_eq!(link, 101);
        assert_eq!(
            recs,
            vec![(1_500_000, b"abc".to_vec()), (2_000_001, vec![7u8; 100])]
        );
        // The public reader agrees, and refuses what is not pcap.
        let (link2, recs2) = read(&bytes).unwrap();
        assert_eq!(link2, 101);
        assert_eq!(recs2.len(), 2);
        assert_eq!(
            (recs2[1].ts_micros, recs2[1].data),
            (2_000_001, &[7u8; 100][..])
        );
        assert!(read(b"not a pcap file at all, really").is_err());
        assert!(read(&bytes[..bytes.len() - 1]).is_err());
    }
}
