//! What two perftest processes exchange before a test, byte for byte: the
//! version string, the system data (cycle buffer, cache line), the MTU and
//! the destination message.

use super::*;

/// Our version field: `"6.06"`, NUL, then our tag.
pub fn version_field() -> [u8; VERSION_LEN] {
    let mut f = [0u8; VERSION_LEN];
    f[..OUR_VERSION.len()].copy_from_slice(OUR_VERSION.as_bytes());
    let at = OUR_VERSION.len() + 1;
    f[at..at + TAG.len()].copy_from_slice(TAG);
    f
}

/// A peer's version field, read.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerVersion {
    /// The text up to the NUL.
    pub text: String,
    /// Its leading decimal number, as C `atof` reads it (0 if none).
    pub value: f64,
    /// The field carries our tag: the peer is `rperftest`.
    pub rperftest: bool,
}

/// The leading decimal number of `s` the way `atof` takes it.
pub(super) fn atof(s: &str) -> f64 {
    let t = s.trim_start();
    let mut end = 0;
    let b = t.as_bytes();
    if end < b.len() && (b[end] == b'+' || b[end] == b'-') {
        end += 1;
    }
    let mut dot = false;
    while end < b.len() && (b[end].is_ascii_digit() || (b[end] == b'.' && !dot)) {
        dot |= b[end] == b'.';
        end += 1;
    }
    t[..end].parse().unwrap_or(0.0)
}

/// Reads a peer's 16-byte version field and applies perftest's rule.
///
/// # Errors
/// The field is not text, or names a version below 5.70.
pub fn parse_version(field: &[u8]) -> Result<PeerVersion, PerftestError> {
    if field.len() != VERSION_LEN {
        return Err(bad(format!(
            "version field is {} bytes, not {VERSION_LEN}",
            field.len()
        )));
    }
    let end = field.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
    let text = std::str::from_utf8(&field[..end])
        .map_err(|_| bad(format!("version field {field:02x?} is not text")))?
        .to_string();
    let value = atof(&text);
    if value < MIN_PEER_VERSION {
        return Err(bad(format!(
            "peer version {text:?} is not a perftest version >= {MIN_PEER_VERSION:.2} \
             (perftest refuses older peers too; is the peer perftest on the right port?)"
        )));
    }
    let rest = &field[(end + 1).min(VERSION_LEN)..];
    let rperftest = rest.starts_with(TAG);
    Ok(PeerVersion {
        text,
        value,
        rperftest,
    })
}

/// A 4-byte system-data field (big-endian).
pub fn sys_field(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// What both sides use for the cycle buffer and cache line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysData {
    /// Bytes the target address wraps at.
    pub cycle_buffer: u32,
    /// Step granularity of the target address.
    pub cache_line: u32,
}

/// Combines ours with the peer's two fields: the larger of each.
///
/// # Errors
/// A peer value of 0 or above 16 MiB.
pub fn agree_sys(ours: SysData, cycle: [u8; 4], line: [u8; 4]) -> Result<SysData, PerftestError> {
    let (c, l) = (u32::from_be_bytes(cycle), u32::from_be_bytes(line));
    for (what, v) in [("cycle buffer", c), ("cache line size", l)] {
        if v == 0 || v > MAX_SYS {
            return Err(bad(format!("peer {what} {v} is not in 1..={MAX_SYS}")));
        }
    }
    Ok(SysData {
        cycle_buffer: ours.cycle_buffer.max(c),
        cache_line: ours.cache_line.max(l),
    })
}

/// The 2-byte MTU field: the IBA code as decimal text and a NUL.
pub fn mtu_field(mtu: Mtu) -> [u8; 2] {
    [b'0' + mtu.code(), 0]
}

/// The path MTU both use: the smaller, ours if the peer's field is not a
/// valid MTU code (perftest's rule).
pub fn agree_mtu(ours: Mtu, field: [u8; 2]) -> Mtu {
    let digits: String = field
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .map(|&b| b as char)
        .collect();
    match digits
        .parse::<u8>()
        .ok()
        .and_then(|c| Mtu::from_code(c).ok())
    {
        Some(m) if m.bytes() < ours.bytes() => m,
        _ => ours,
    }
}

/// One side's QP and buffer, as the dest message carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// RDMA READs this side accepts in flight as a responder.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN this side sends.
    pub psn: u32,
    /// R_Key of the target buffer.
    pub rkey: u32,
    /// Address of the target buffer.
    pub vaddr: u64,
    /// Port GID.
    pub gid: Gid,
    /// XRC/DC SRQ number (0 for RC).
    pub srqn: u32,
}

impl Dest {
    /// The 108-byte message.
    pub fn to_msg(&self) -> [u8; DEST_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            text += &format!("{b:02x}:");
        }
        text += &format!("{:08x}:", self.srqn);
        let mut out = [0u8; DEST_LEN];
        let n = text.len().min(DEST_LEN - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a peer's message.
    ///
    /// # Errors
    /// Names the field that is missing or not hex, or out of range.
    pub fn from_msg(msg: &[u8]) -> Result<Dest, PerftestError> {
        if msg.len() != DEST_LEN {
            return Err(bad(format!(
                "dest message is {} bytes, not {DEST_LEN}",
                msg.len()
            )));
        }
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad("dest message is not text"))?;
        let parts: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, SRQN, and what follows the last ':'.
        if parts.len() < 23 {
            return Err(bad(format!(
                "dest message {text:?} is not LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID(16):SRQN"
            )));
        }
        let field = |i: usize, what: &str, max: u64| -> Result<u64, PerftestError> {
            let s = parts[i];
            let v = (!s.is_empty() && s.len() <= 16)
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
                .ok_or_else(|| bad(format!("bad {what} {s:?} in dest message {text:?}")))?;
            if v > max {
                return Err(bad(format!("{what} {s} out of range in {text:?}")));
            }
            Ok(v)
        };
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = field(6 + i, "GID byte", 0xff)? as u8;
        }
        Ok(Dest {
            lid: field(0, "LID", 0xffff)? as u16,
            out_reads: field(1, "OUT_READS", 0xffff)? as u16,
            qpn: field(2, "QPN", 0xff_ffff)? as u32,
            psn: field(3, "PSN", 0xff_ffff)? as u32,
            rkey: field(4, "RKEY", 0xffff_ffff)? as u32,
            vaddr: field(5, "VADDR", u64::MAX)?,
            gid: Gid(gid),
            srqn: field(22, "SRQN", 0xffff_ffff)? as u32,
        })
    }
}
