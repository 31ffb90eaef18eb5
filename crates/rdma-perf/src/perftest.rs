//! `rperftest`: tests that speak perftest's own out-of-band exchange, so
//! Linux's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw` and
//! `ib_atomic_lat` (perftest 4.5-0.17 as packaged in Debian bookworm,
//! which calls itself version 6.06) can be the peer in either role. RC
//! transport over RoCEv2.
//!
//! The exchange (perftest `src/perftest_communication.c`, `write_bw.c`,
//! `read_bw.c`, `send_bw.c`), on a TCP connection to port 18515 by default.
//! Every step is a fixed-size swap: the client writes its part then reads
//! the server's, the server reads then writes. Integers are big-endian.
//!
//! 1. Version: 16 bytes, a NUL-terminated decimal string (`"6.06"`). Both
//!    sides refuse a peer below 5.70 (read with C `atof`). We put the tag
//!    `rperftest` after the NUL, where perftest never looks, so two of our
//!    tools know each other and can check data exactly.
//! 2. System data (peer version >= 5.32): cycle buffer (page size, 4 bytes)
//!    then cache line size (4 bytes); both sides use the larger of each.
//! 3. MTU (peer version >= 5.31): two bytes, the IBA MTU code as decimal
//!    text plus NUL (`"3\0"` is 1024); both sides use the smaller.
//! 4. Dest, 108 bytes: `LID:OUT_READS:QPN:PSN:RKEY:VADDR:` then 16 GID
//!    bytes as `xx:` and `SRQN:` (`%04x:%04x:%06x:%06x:%08x:%016llx:` ...
//!    `%08x:`), NUL-padded. `OUT_READS` is the RDMA READ depth the sender
//!    accepts as a responder; `VADDR` and `RKEY` name its target buffer.
//!    On RoCE the GID is the port's GID at the `-x` index (IPv4-mapped).
//! 5. The QPs go to RTR/RTS; then the dest message is swapped twice more
//!    (WRITE/READ) or once more plus a "receives are posted" one (SEND).
//! 6. The client moves `-n` messages of `-s` bytes, `-t` in flight. The
//!    target address walks the peer's buffer in steps of the size rounded
//!    up to the cache line, wrapping at the cycle buffer, when the size is
//!    at most half the cycle buffer; otherwise every message hits `VADDR`.
//! 7. WRITE/READ: a dest swap says the client is done, then the reports
//!    (size u64, iterations u64, peak, average and message rate as IEEE
//!    doubles, five swaps of 8 bytes); the server prints the client's.
//!    SEND: no reports; the server times its own receives.
//! 8. Close: one more dest swap, then each side writes `"done\0"`.
//!
//! What is verified (perftest itself checks nothing): every completion's
//! status; SEND receives carry exactly `-s` bytes. Between two of our
//! tools: WRITE targets hold the client's pattern slot by slot, READs bring
//! back the server's pattern, SENDs carry the client's pattern, and nothing
//! outside the written slots changed. With a Linux peer (random buffers):
//! our WRITE server checks every slot was written and nothing outside was;
//! our READ client checks every READ of a slot brought back the same bytes;
//! our READ server checks its source was not written. Not checked: what our
//! WRITE or SEND client lands at a Linux server (its QP grants no remote
//! READ and its buffers are random).
//!
//! Duration runs (`-D SECS`, WRITE and READ clients): the client posts
//! until the time has passed (or `-n` were posted) and reports the count it
//! completed, which the server's checks follow; perftest's server needs no
//! `-D` for that. SEND refuses `-D` (the server counts `-n` receives).
//!
//! Atomics (`atomic_bw.c`, `atomic_lat.c`): 8-byte messages (perftest
//! refuses another `-s`), FETCH_AND_ADD of 1 or CMP_AND_SWAP with compare
//! 0 and swap 0 (`-A`); the responder depth is the device's, as for READ.
//! Bandwidth runs the WRITE/READ steps above over perftest's address walk
//! (64 slots 64 bytes apart). Latency (`--lat`, ib_atomic_lat) swaps the
//! dest message twice before the QPs connect and twice after, then the
//! client posts one atomic at a time to the peer's `VADDR` (no walk) and
//! the close swap ends it: no reports; the client prints perftest's
//! latency line (the times between consecutive posts, each post after the
//! previous completion, the two largest dropped). What is checked is in
//! [`atomic`]: every returned value (FETCH_AND_ADD: a slot's values count
//! up by 1, so all distinct; CMP_AND_SWAP: the slot's value), exactly
//! between two of our tools, which also swap for real; our server checks
//! each slot's final value against the client's count (bandwidth: the
//! client's report; latency: our `-n`) and that nothing else changed.
//!
//! Not supported (the command line refuses them): UC/UD/XRC/DC (`-c`),
//! several QPs (`-q`), bidirectional (`-b`), all sizes (`-a`), RDMA CM
//! (`-R`), events, inline, post lists.
//!
//! The codec below is pure (byte vectors in, values out); [`script`] is
//! the order of steps for a role and verb, and [`run`] drives it over a
//! socket and the soft RoCE NIC (`rnic::softroce`).

pub mod atomic;

pub use atomic::AtomicOp;
use atomic::{AtomicModel, ATOMIC_SIZE};
use rdma_types::{AccessFlags, Gid, Guid, Mtu, PortNum, Psn, QpState, Qpn, Rkey, WcStatus};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{
    AhAttr, CqInit, MemBuf, Provider, QpAttr, QpInit, RecvWr, RemoteAddr, SendOpcode, SendWr, Sge,
    WorkCompletion,
};

/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Bytes of the version field.
pub const VERSION_LEN: usize = 16;
/// Bytes of a dest message with a GID (`KEY_MSG_SIZE_GID`).
pub const DEST_LEN: usize = 108;
/// The version we announce: bookworm's perftest's.
pub const OUR_VERSION: &str = "6.06";
/// Oldest peer perftest talks to.
pub const MIN_PEER_VERSION: f64 = 5.70;
/// Our cycle buffer (a page).
pub const CYCLE_BUFFER: u32 = 4096;
/// Our cache line size.
pub const CACHE_LINE: u32 = 64;
/// Largest message size we take (perftest's `-a` top, 8 MiB).
pub const MAX_SIZE: usize = 1 << 23;
/// Largest cycle buffer or cache line a peer may ask for.
const MAX_SYS: u32 = 1 << 24;
/// What follows the NUL of our version field.
const TAG: &[u8] = b"rperftest";
/// Fill of our buffers where nobody should write.
const CANARY: u8 = 0xa5;
/// perftest computes no peak above this many iterations.
const PEAK_MAX_ITERS: u64 = 20_000;

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Verb {
    /// RDMA WRITE (`ib_write_bw`).
    Write,
    /// RDMA READ (`ib_read_bw`).
    Read,
    /// SEND/RECV (`ib_send_bw`).
    Send,
    /// Atomics (`ib_atomic_bw`, `ib_atomic_lat`).
    Atomic,
}

impl Verb {
    /// perftest's name for the verb (`testsStr`).
    pub fn name(self) -> &'static str {
        match self {
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Send => "Send",
            Verb::Atomic => "Atomic",
        }
    }

    /// Whether the peer's buffer is a responder's target (RKey, VAddr).
    fn remote(self) -> bool {
        self != Verb::Send
    }

    /// Whether the responder answers with data (READ responses, atomic
    /// ACKs), so the depth of such requests is negotiated (`OUT_READS`).
    fn reads(self) -> bool {
        matches!(self, Verb::Read | Verb::Atomic)
    }
}

/// What went wrong; each says what to check.
#[derive(Debug)]
pub enum PerftestError {
    /// Bad command-line values.
    Usage(String),
    /// The peer broke perftest's exchange.
    Exchange(String),
    /// Socket trouble.
    Io(String, std::io::Error),
    /// The NIC refused a setup step.
    Setup(String),
    /// A work request failed or the transfer stalled.
    Transfer(String),
    /// Data differed from what was expected.
    Verify(String),
}

impl std::fmt::Display for PerftestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerftestError::Usage(s) => write!(f, "{s}"),
            PerftestError::Exchange(s) => write!(f, "perftest exchange with the peer failed: {s}"),
            PerftestError::Io(what, e) => write!(f, "{what}: {e}"),
            PerftestError::Setup(s) => write!(f, "NIC setup failed: {s}"),
            PerftestError::Transfer(s) => write!(f, "transfer failed: {s}"),
            PerftestError::Verify(s) => write!(f, "data verification failed: {s}"),
        }
    }
}

impl std::error::Error for PerftestError {}

fn bad(s: impl Into<String>) -> PerftestError {
    PerftestError::Exchange(s.into())
}

// ---------------------------------------------------------------- codec --

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
fn atof(s: &str) -> f64 {
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

/// A bandwidth result (`struct bw_report_data`'s exchanged fields).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Best rate over any run of messages, in report units (0 if none).
    pub bw_peak: f64,
    /// Average rate, in report units.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five 8-byte fields in exchange order.
    pub fn to_fields(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Reads the five fields.
    pub fn from_fields(f: [[u8; 8]; 5]) -> BwReport {
        let d = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        BwReport {
            size: u64::from_be_bytes(f[0]),
            iters: u64::from_be_bytes(f[1]),
            bw_peak: d(f[2]),
            bw_avg: d(f[3]),
            msg_rate: d(f[4]),
        }
    }

    /// Computes a report from per-message post and completion times
    /// (seconds from any epoch, in message order) the way perftest does:
    /// the average over first post to last completion, the peak as the
    /// best rate of any run of messages (none above 20000 messages).
    pub fn from_times(size: u64, posted: &[f64], completed: &[f64], gbits: bool) -> BwReport {
        let n = posted.len().min(completed.len());
        let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
        if n == 0 {
            return BwReport {
                size,
                iters: 0,
                bw_peak: 0.0,
                bw_avg: 0.0,
                msg_rate: 0.0,
            };
        }
        let mut r = BwReport::from_span(size, n as u64, completed[n - 1] - posted[0], gbits);
        if n as u64 <= PEAK_MAX_ITERS {
            // perftest samples completions every cq_mod (100) messages.
            let step = 100.min(n);
            let mut best = f64::INFINITY;
            for (i, &p) in posted[..n].iter().enumerate() {
                let mut j = (i + 1).div_ceil(step) * step - 1;
                while j < n {
                    best = best.min((completed[j] - p) / (j - i + 1) as f64);
                    j += step;
                }
                best = best.min((completed[n - 1] - p) / (n - i) as f64);
            }
            if best > 0.0 && best.is_finite() {
                r.bw_peak = size as f64 / best / unit;
            }
        }
        r
    }

    /// A report of `iters` messages in `seconds`, without a peak.
    pub fn from_span(size: u64, iters: u64, seconds: f64, gbits: bool) -> BwReport {
        let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
        let t = seconds.max(1e-9);
        BwReport {
            size,
            iters,
            bw_peak: 0.0,
            bw_avg: size as f64 * iters as f64 / t / unit,
            msg_rate: iters as f64 / t / 1e6,
        }
    }

    /// perftest's result line: two decimals (`REPORT_FMT`), or six when
    /// the average is under 0.1 Gb/s (`REPORT_FMT_EXT`, which perftest
    /// uses only for Gb/s), so a slow run does not read as 0.00.
    pub fn line(&self, gbits: bool) -> String {
        if gbits && self.bw_avg < 0.1 {
            format!(
                " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
                self.size, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
            )
        } else {
            format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                self.size, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
            )
        }
    }
}

/// A latency result (`print_report_lat`), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Smallest sample.
    pub min: f64,
    /// The second largest sample: perftest leaves the two largest out of
    /// the statistics and prints the smaller of them as the max.
    pub max: f64,
    /// The median.
    pub typical: f64,
    /// The mean.
    pub avg: f64,
    /// The standard deviation.
    pub stdev: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
}

/// Samples perftest drops from the top (`LAT_MEASURE_TAIL`).
const LAT_TAIL: usize = 2;
/// Fewest iterations perftest runs (`MIN_ITER`).
pub const MIN_ITERS: u64 = 5;

impl LatReport {
    /// perftest's report from post times (seconds, in message order; each
    /// post after the previous completion): the samples are the times
    /// between consecutive posts, one round trip each for READ and atomics
    /// (`rtt_factor` 1). Sorted, the two largest left out of the median,
    /// mean and deviation; the max and the percentiles index the sorted
    /// samples at the kept count, and at it times 0.99 and 0.999 rounded
    /// up, as perftest's do. The standard deviation is the
    /// true one (perftest truncates each difference to an integer).
    /// `None` with fewer than [`MIN_ITERS`] posts.
    pub fn from_posts(size: u64, posted: &[f64]) -> Option<LatReport> {
        if (posted.len() as u64) < MIN_ITERS {
            return None;
        }
        let mut d: Vec<f64> = posted.windows(2).map(|w| (w[1] - w[0]) * 1e6).collect();
        d.sort_by(f64::total_cmp);
        let m = d.len() - LAT_TAIL;
        let typical = if (m - 1) % 2 == 1 {
            (d[m / 2] + d[m / 2 - 1]) / 2.0
        } else {
            d[m / 2]
        };
        let avg = d[..m].iter().sum::<f64>() / m as f64;
        let var = d[..m].iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / m as f64;
        let at = |q: f64| d[((m as f64 * q).ceil() as usize).min(d.len() - 1)];
        Some(LatReport {
            size,
            iters: posted.len() as u64,
            min: d[0],
            max: d[m],
            typical,
            avg,
            stdev: var.sqrt(),
            p99: at(0.99),
            p999: at(0.999),
        })
    }

    /// perftest's result line (`REPORT_FMT_LAT`).
    pub fn line(&self) -> String {
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.size,
            self.iters,
            self.min,
            self.max,
            self.typical,
            self.avg,
            self.stdev,
            self.p99,
            self.p999
        )
    }
}

/// perftest's latency result header (`RESULT_FMT_LAT`).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// A dashed line as perftest prints around results.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's result header for MB/s or Gb/s.
pub fn result_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// One step of the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Swap version fields.
    Version,
    /// Swap cycle buffer then cache line sizes.
    SysData,
    /// Swap MTU fields.
    Mtu,
    /// Swap dest messages.
    Dest,
    /// Bring the QP to RTR and RTS with the peer's dest.
    Connect,
    /// Server, SEND: post the receives.
    PostReceives,
    /// The measured transfer (passive for a WRITE/READ server).
    Run,
    /// Server, WRITE/READ: check the target buffer (local; after the
    /// reports, which say how many messages the client moved).
    Check,
    /// Swap the five report fields.
    Reports,
    /// Write `"done\0"` and close.
    Done,
}

/// The steps of a test, in order, as perftest's tools run them
/// (`latency`: ib_atomic_lat's, the only latency test we have).
pub fn script(verb: Verb, latency: bool, client: bool) -> &'static [Step] {
    use Step::*;
    match (verb, latency, client) {
        // atomic_lat.c: two swaps before the QPs connect, two after; the
        // server then waits in the close swap while the client runs.
        (_, true, true) => &[
            Version, SysData, Mtu, Dest, Dest, Connect, Dest, Dest, Run, Dest, Done,
        ],
        (_, true, false) => &[
            Version, SysData, Mtu, Dest, Dest, Connect, Dest, Dest, Dest, Check, Done,
        ],
        (Verb::Send, _, true) => &[
            Version, SysData, Mtu, Dest, Connect, Dest, Dest, Dest, Run, Dest, Done,
        ],
        (Verb::Send, _, false) => &[
            Version,
            SysData,
            Mtu,
            Dest,
            Connect,
            Dest,
            Dest,
            PostReceives,
            Dest,
            Run,
            Dest,
            Done,
        ],
        (_, _, true) => &[
            Version, SysData, Mtu, Dest, Connect, Dest, Dest, Run, Dest, Reports, Dest, Done,
        ],
        (_, _, false) => &[
            Version, SysData, Mtu, Dest, Connect, Dest, Dest, Run, Dest, Reports, Check, Dest, Done,
        ],
    }
}

/// Where message `k` lands in a buffer, relative to its start: perftest's
/// walk (step = size rounded up to the cache line, wrap at the cycle
/// buffer) when the size is at most half the cycle buffer, else 0.
pub fn slot_offset(k: u64, size: usize, sys: SysData) -> usize {
    let cycle = sys.cycle_buffer as usize;
    if size > cycle / 2 {
        return 0;
    }
    let inc = slot_step(size, sys);
    (k as usize % (cycle / inc)) * inc
}

/// The address step between messages.
fn slot_step(size: usize, sys: SysData) -> usize {
    let line = sys.cache_line as usize;
    if size > line {
        size.div_ceil(line) * line
    } else {
        line
    }
}

/// Slots the walk visits.
fn slot_count(size: usize, sys: SysData) -> usize {
    let cycle = sys.cycle_buffer as usize;
    if size > cycle / 2 {
        1
    } else {
        cycle / slot_step(size, sys)
    }
}

/// Bytes of one side's target buffer (perftest's `BUFF_SIZE`).
pub fn buffer_size(size: usize, sys: SysData) -> usize {
    size.max(sys.cycle_buffer as usize)
}

/// Our deterministic buffer content at offset `off` of a half.
pub fn pattern_byte(off: usize) -> u8 {
    (off.wrapping_mul(131).wrapping_add(off >> 12) % 251) as u8
}

fn pattern(off: usize, len: usize) -> Vec<u8> {
    (off..off + len).map(pattern_byte).collect()
}

// --------------------------------------------------------------- driver --

/// How to run.
#[derive(Debug, Clone)]
pub struct PerftestConfig {
    /// The operation.
    pub verb: Verb,
    /// Which atomic (`-A`; atomic tests only).
    pub atomic: AtomicOp,
    /// Measure latency (ib_atomic_lat) instead of bandwidth; atomics only.
    pub latency: bool,
    /// Our NIC's address (our GID is its IPv4-mapped form).
    pub bind: IpAddr,
    /// The server to connect to; `None` serves.
    pub server: Option<IpAddr>,
    /// TCP port of the exchange.
    pub port: u16,
    /// RoCEv2 UDP port.
    pub udp_port: u16,
    /// Message size (`-s`).
    pub size: usize,
    /// Messages (`-n`; at most, with `duration`).
    pub iters: u64,
    /// Client: post for this long (`-D`), then finish what is in flight.
    pub duration: Option<Duration>,
    /// Work requests in flight (`-t`).
    pub tx_depth: u32,
    /// Receives kept posted (`-r`, SEND server).
    pub rx_depth: u32,
    /// Our port's MTU (`-m`).
    pub mtu: Mtu,
    /// READs or atomics in flight (`-o`), as responder and requester;
    /// `None` is the device's maximum. Only READ and atomic tests use
    /// more than 1.
    pub outs: Option<u8>,
    /// GID index (`-x`); `None` takes the best (the IPv4-mapped one).
    pub gid_index: Option<u32>,
    /// Device (`-d`); must name ours if given.
    pub device: Option<String>,
    /// Report Gb/s instead of MB/s.
    pub report_gbits: bool,
    /// Give up when the peer or the transfer is silent this long.
    pub timeout: Duration,
}

/// Our one device's name, as `-d` takes it.
pub const DEVICE_NAME: &str = "softroce0";

/// What a run did.
#[derive(Debug, Clone)]
pub struct PerftestReport {
    /// What we measured ourselves (client; SEND server).
    pub local: Option<BwReport>,
    /// Our latency client's result.
    pub latency: Option<LatReport>,
    /// What the peer reported (WRITE/READ server).
    pub remote: Option<BwReport>,
    /// The path MTU used.
    pub mtu: Mtu,
    /// The peer's version field.
    pub peer: PeerVersion,
    /// What was verified, in words.
    pub verified: Vec<String>,
    /// Our NIC's counters at the end (retransmissions, timeouts, ...).
    pub counters: Option<rnic::softroce::SoftCaCounters>,
}

impl PerftestConfig {
    /// perftest's title of the test (`ctx_print_test_info`).
    pub fn title(&self) -> String {
        let op = if self.verb == Verb::Atomic {
            format!("{} ", self.atomic.name())
        } else {
            String::new()
        };
        let kind = if self.latency { "Latency" } else { "BW" };
        format!("{} {op}{kind} Test", self.verb.name())
    }

    /// Checks values perftest would refuse.
    ///
    /// # Errors
    /// Says which value is wrong.
    pub fn validate(&self) -> Result<(), PerftestError> {
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(PerftestError::Usage(format!(
                "size {} is not in 1..={MAX_SIZE}",
                self.size
            )));
        }
        if self.iters == 0 || self.iters > 1 << 32 {
            return Err(PerftestError::Usage(format!(
                "iterations {} not in 1..=2^32",
                self.iters
            )));
        }
        if self.verb == Verb::Atomic && self.size != ATOMIC_SIZE {
            return Err(PerftestError::Usage(format!(
                "atomics move {ATOMIC_SIZE} bytes; -s {} is not allowed (perftest refuses it too)",
                self.size
            )));
        }
        if self.latency {
            if self.verb != Verb::Atomic {
                return Err(PerftestError::Usage(
                    "--lat works with atomic only (ib_atomic_lat); write, read and send measure bandwidth"
                        .into(),
                ));
            }
            if self.duration.is_some() {
                return Err(PerftestError::Usage(
                    "-D works with bandwidth tests; a latency run counts -n".into(),
                ));
            }
            if self.iters < MIN_ITERS {
                return Err(PerftestError::Usage(format!(
                    "a latency run needs at least {MIN_ITERS} iterations, not {}",
                    self.iters
                )));
            }
        }
        if let Some(d) = self.duration {
            if self.verb == Verb::Send {
                return Err(PerftestError::Usage(
                    "-D works with write and read and atomic bandwidth; a send server counts -n receives".into(),
                ));
            }
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(PerftestError::Usage(format!(
                    "duration {d:?} not in 1 s..=1 day"
                )));
            }
        }
        if self.tx_depth == 0 || self.tx_depth > 4096 {
            return Err(PerftestError::Usage(format!(
                "tx depth {} not in 1..=4096",
                self.tx_depth
            )));
        }
        if self.rx_depth == 0 || self.rx_depth > 4096 {
            return Err(PerftestError::Usage(format!(
                "rx depth {} not in 1..=4096",
                self.rx_depth
            )));
        }
        if let Some(d) = &self.device {
            if d != DEVICE_NAME {
                return Err(PerftestError::Usage(format!(
                    "no device {d:?}; the only one is {DEVICE_NAME} (the soft RoCE NIC at {})",
                    self.bind
                )));
            }
        }
        Ok(())
    }
}

/// The TCP link, with perftest's swap rule.
struct Link {
    s: TcpStream,
    client: bool,
}

impl Link {
    fn swap(&mut self, mine: &[u8], len: usize, what: &str) -> Result<Vec<u8>, PerftestError> {
        let mut theirs = vec![0u8; len];
        let io = |e: std::io::Error| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                bad(format!("peer silent while swapping {what}"))
            } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
                bad(format!("peer closed the connection while swapping {what}"))
            } else {
                PerftestError::Io(format!("swapping {what}"), e)
            }
        };
        if self.client {
            self.s.write_all(mine).map_err(io)?;
            self.s.read_exact(&mut theirs).map_err(io)?;
        } else {
            self.s.read_exact(&mut theirs).map_err(io)?;
            self.s.write_all(mine).map_err(io)?;
        }
        Ok(theirs)
    }
}

/// The verbs objects of one test.
struct Nic {
    p: Arc<dyn Provider>,
    ca: verbs::CaHandle,
    pd: verbs::PdHandle,
    cq: verbs::CqHandle,
    qp: verbs::QpHandle,
    mem: MemBuf,
    mr: verbs::MrInfo,
    /// Bytes of each half: [local sources / READ sinks | target].
    half: usize,
    out_reads: u8,
    gid: Gid,
    soft: Arc<rnic::softroce::SoftRoce>,
    guid: Guid,
}

impl Nic {
    fn open(cfg: &PerftestConfig, sys: SysData, target: usize) -> Result<Nic, PerftestError> {
        let e = |what: &str| {
            let what = what.to_string();
            move |err: verbs::VerbsError| PerftestError::Setup(format!("{what}: {err}"))
        };
        let guid = Guid(0x0002_c903_00d0_0001);
        let provider = rnic::softroce::SoftRoce::with_mtu(
            vec![rnic::softroce::SoftCa { guid, ip: cfg.bind }],
            cfg.udp_port,
            cfg.mtu,
        );
        let p: Arc<dyn Provider> = provider.clone();
        let ca = p
            .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
            .map_err(e(&format!("open the NIC at {}", cfg.bind)))?;
        let attr = p.query_ca(ca).map_err(e("query the CA"))?;
        if cfg.verb == Verb::Atomic && !attr.atomics {
            return Err(PerftestError::Setup(
                "the NIC does not support atomics".into(),
            ));
        }
        let port = p.query_port(ca, PortNum(1)).map_err(e("query port 1"))?;
        let gid = match cfg.gid_index {
            Some(i) => *port.gids.get(i as usize).ok_or_else(|| {
                PerftestError::Usage(format!(
                    "GID index {i} is not in our port's GID table ({} entr{}: {})",
                    port.gids.len(),
                    if port.gids.len() == 1 { "y" } else { "ies" },
                    port.gids
                        .iter()
                        .enumerate()
                        .map(|(i, g)| format!("{i} = {g}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
            // perftest's get_best_gid_index: an IPv4-mapped GID first.
            None => port
                .gids
                .iter()
                .copied()
                .find(|g| g.is_ipv4_mapped())
                .or_else(|| port.gids.first().copied())
                .ok_or_else(|| PerftestError::Setup("our port has no GID".into()))?,
        };
        let pd = p.alloc_pd(ca, 0).map_err(e("allocate a PD"))?;
        let depth = cfg.tx_depth.max(cfg.rx_depth);
        let cq = p
            .create_cq(
                pd,
                &CqInit {
                    cqe: 2 * depth + 16,
                },
                0,
            )
            .map_err(e("create the CQ"))?;
        let qp = p
            .create_qp(pd, &QpInit::rc(cq, cfg.tx_depth + 4, cfg.rx_depth + 4), 0)
            .map_err(e("create the QP"))?;
        // An atomic client's results land in one slot per work request in
        // flight, so each is read before anything can land on it again.
        let results = if cfg.verb == Verb::Atomic {
            cfg.tx_depth as usize * ATOMIC_SIZE
        } else {
            0
        };
        let half = buffer_size(cfg.size, sys).max(results);
        let mem = MemBuf::new(half + half.max(target));
        let mr = p
            .reg_mr(
                pd,
                &mem,
                mem.addr(),
                mem.len() as u64,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_ATOMIC,
                0,
            )
            .map_err(e("register the buffer"))?;
        // perftest's ctx_set_out_reads: -o, at most the device's maximum.
        let max = attr.max_qp_rd_atom.max(1);
        let out_reads = if cfg.verb.reads() {
            cfg.outs.map_or(max, |o| o.clamp(1, max))
        } else {
            1
        };
        Ok(Nic {
            p,
            ca,
            pd,
            cq,
            qp,
            mem,
            mr,
            half,
            out_reads,
            gid,
            soft: provider,
            guid,
        })
    }

    fn target_addr(&self) -> u64 {
        self.mem.addr() + self.half as u64
    }

    fn connect(&self, verb: Verb, mine: &Dest, peer: &Dest, mtu: Mtu) -> Result<(), PerftestError> {
        let access = match verb {
            Verb::Write => AccessFlags::REMOTE_WRITE,
            Verb::Read => AccessFlags::REMOTE_READ,
            Verb::Send => AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            Verb::Atomic => AccessFlags::REMOTE_ATOMIC,
        };
        let step = |what: &str, attr: QpAttr| {
            self.p
                .modify_qp(self.qp, &attr)
                .map_err(|e| PerftestError::Setup(format!("QP to {what}: {e}")))
        };
        step(
            "INIT",
            QpAttr {
                state: Some(QpState::Init),
                port: Some(PortNum(1)),
                pkey_index: Some(0),
                access: Some(access),
                ..Default::default()
            },
        )?;
        step(
            "RTR",
            QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr::roce(peer.gid)),
                path_mtu: Some(mtu),
                dest_qpn: Some(Qpn::from_bits(peer.qpn)),
                rq_psn: Some(Psn::new(peer.psn)),
                max_dest_rd_atomic: Some(self.out_reads),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )?;
        step(
            "RTS",
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(Psn::new(mine.psn)),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                // The peer's responder depth, at most ours.
                max_rd_atomic: Some(peer.out_reads.clamp(1, u16::from(self.out_reads)) as u8),
                ..Default::default()
            },
        )
    }

    /// Polls up to `out.len()` completions, sleeping briefly when idle.
    fn poll(&self, out: &mut [WorkCompletion], idle: &mut u32) -> Result<usize, PerftestError> {
        let n = self
            .p
            .poll_cq(self.cq, out)
            .map_err(|e| PerftestError::Transfer(format!("poll the CQ: {e}")))?;
        if n > 0 {
            *idle = 0;
            return Ok(n);
        }
        *idle += 1;
        if *idle > 64 {
            let _ = self.p.req_notify_cq(self.cq, false);
            let n = self
                .p
                .poll_cq(self.cq, out)
                .map_err(|e| PerftestError::Transfer(format!("poll the CQ: {e}")))?;
            if n > 0 {
                return Ok(n);
            }
            let _ = self.p.wait_cq(self.cq, Duration::from_millis(2));
        }
        Ok(0)
    }

    fn close(self) {
        let _ = self.p.destroy_qp(self.qp);
        let _ = self.p.dereg_mr(self.mr.handle);
        let _ = self.p.destroy_cq(self.cq);
        let _ = self.p.dealloc_pd(self.pd);
        let _ = self.p.close_ca(self.ca);
    }
}

fn empty_wc() -> WorkCompletion {
    WorkCompletion::new(0, WcStatus::Success, rdma_types::WcOpcode::Send, 0)
}

fn wc_error(c: &WorkCompletion, done: u64, of: u64) -> PerftestError {
    PerftestError::Transfer(format!(
        "completion with error: status {} ({}) for wr_id {} after {done} of {of} messages",
        c.status, c.status as u32, c.wr_id
    ))
}

/// Client: moves the messages, returns (post times, completion times).
fn client_run(
    nic: &Nic,
    cfg: &PerftestConfig,
    sys: SysData,
    peer: &Dest,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(Vec<f64>, Vec<f64>), PerftestError> {
    let n = cfg.iters;
    let size = cfg.size;
    // A latency run has one message in flight (perftest's tx depth 1).
    let depth = if cfg.latency {
        1
    } else {
        u64::from(cfg.tx_depth).min(n)
    };
    let mut atomics = (cfg.verb == Verb::Atomic).then(|| atomic_model(cfg, sys, peer_is_ours));
    let epoch = Instant::now();
    let stop_posting = cfg.duration.map(|d| epoch + d);
    let room = (n as usize).min(1 << 20);
    let mut posted_at = Vec::with_capacity(room);
    let mut done_at = Vec::with_capacity(room);
    // READ with a Linux peer: the first bytes seen per slot.
    let mut seen: Vec<Option<Vec<u8>>> = vec![None; slot_count(size, sys)];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wc = vec![empty_wc(); 64];
    let mut idle = 0u32;
    let mut last_progress = Instant::now();
    let opcode = match (cfg.verb, cfg.atomic) {
        (Verb::Write, _) => SendOpcode::RdmaWrite,
        (Verb::Read, _) => SendOpcode::RdmaRead,
        (Verb::Send, _) => SendOpcode::Send,
        (Verb::Atomic, AtomicOp::FetchAdd) => SendOpcode::AtomicFetchAdd,
        (Verb::Atomic, AtomicOp::CmpSwap) => SendOpcode::AtomicCmpSwp,
    };
    // An atomic's result slot: one per message in flight.
    let result_at = |k: u64| (k % depth) as usize * ATOMIC_SIZE;
    loop {
        let over = stop_posting.is_some_and(|t| Instant::now() >= t);
        if done >= n || (over && done == posted) {
            break;
        }
        let mut batch = Vec::new();
        while !over && posted < n && posted - done < depth {
            // The peer's slot: perftest's walk, or its VADDR when timing
            // latency (no walk in run_iter_lat).
            let off = if cfg.latency {
                0
            } else {
                slot_offset(posted, size, sys)
            };
            let local = if atomics.is_some() {
                result_at(posted)
            } else {
                off
            };
            let mut wr = SendWr::new(
                posted,
                opcode,
                vec![Sge {
                    addr: nic.mem.addr() + local as u64,
                    length: size as u32,
                    lkey: nic.mr.lkey,
                }],
            );
            if cfg.verb.remote() {
                wr.remote = RemoteAddr {
                    addr: peer.vaddr.wrapping_add(off as u64),
                    rkey: Rkey(peer.rkey),
                };
            }
            if let Some(m) = atomics.as_mut() {
                let o = m.post(off / slot_step(size, sys));
                wr.compare_add = o.compare_add;
                wr.swap = o.swap;
            }
            batch.push(wr);
            posted += 1;
        }
        if !batch.is_empty() {
            let t = epoch.elapsed().as_secs_f64();
            posted_at.extend(std::iter::repeat_n(t, batch.len()));
            nic.p
                .post_send(nic.qp, &batch)
                .map_err(|e| PerftestError::Transfer(format!("post send: {e}")))?;
        }
        let got = nic.poll(&mut wc, &mut idle)?;
        for c in &wc[..got] {
            if c.status != WcStatus::Success {
                return Err(wc_error(c, done, n));
            }
            if c.wr_id != done {
                return Err(PerftestError::Transfer(format!(
                    "completion for message {} when {done} was next",
                    c.wr_id
                )));
            }
            if cfg.verb == Verb::Read {
                let off = slot_offset(done, size, sys);
                let got = nic.mem.to_vec(off, size);
                let slot = off / slot_step(size, sys);
                if peer_is_ours {
                    if got != pattern(off, size) {
                        return Err(PerftestError::Verify(format!(
                            "READ {done} (slot {slot}) brought back bytes other than the server's pattern"
                        )));
                    }
                } else if let Some(first) = &seen[slot] {
                    if *first != got {
                        return Err(PerftestError::Verify(format!(
                            "READ {done} of slot {slot} brought back different bytes than the first READ of it"
                        )));
                    }
                } else {
                    seen[slot] = Some(got);
                }
            }
            if let Some(m) = atomics.as_mut() {
                let got = nic.mem.to_vec(result_at(done), ATOMIC_SIZE);
                let got = u64::from_ne_bytes(got.try_into().unwrap_or([0; 8]));
                m.complete(got).map_err(PerftestError::Verify)?;
            }
            done += 1;
            done_at.push(epoch.elapsed().as_secs_f64());
            last_progress = Instant::now();
        }
        if last_progress.elapsed() > cfg.timeout {
            return Err(PerftestError::Transfer(format!(
                "no completion for {:?} ({done} of {n} done)",
                cfg.timeout
            )));
        }
    }
    let n = done;
    verified.push(format!("{n} completions, all successful and in order"));
    if cfg.verb == Verb::Read {
        verified.push(if peer_is_ours {
            format!("every READ brought back the server's pattern ({n} x {size} bytes)")
        } else {
            format!(
                "every READ of a slot brought back the same bytes as the first ({} slots)",
                seen.iter().filter(|s| s.is_some()).count()
            )
        });
    }
    if let Some(m) = &atomics {
        verified.push(m.summary());
    }
    Ok((posted_at, done_at))
}

/// The atomic slots of the walk (one when timing latency: every message
/// hits the peer's `VADDR`).
fn atomic_slots(cfg: &PerftestConfig, sys: SysData) -> usize {
    if cfg.latency {
        1
    } else {
        slot_count(ATOMIC_SIZE, sys)
    }
}

/// Our server's initial value of atomic slot `s`: its pattern.
fn atomic_initial(s: usize, sys: SysData) -> u64 {
    let p = pattern(s * slot_step(ATOMIC_SIZE, sys), ATOMIC_SIZE);
    u64::from_ne_bytes(p.try_into().unwrap_or([0; 8]))
}

/// The client's model of the server's slots: exact (and with real swaps)
/// when the server is ours and so holds our pattern.
fn atomic_model(cfg: &PerftestConfig, sys: SysData, peer_is_ours: bool) -> AtomicModel {
    let initial: Vec<Option<u64>> = (0..atomic_slots(cfg, sys))
        .map(|s| peer_is_ours.then(|| atomic_initial(s, sys)))
        .collect();
    AtomicModel::new(cfg.atomic, peer_is_ours, &initial)
}

/// SEND server: receive buffers, one per posted receive, so a message is
/// checked before anything can land on it again.
struct Receiver {
    bufs: usize,
    posted: u64,
}

impl Receiver {
    fn post(&mut self, nic: &Nic, cfg: &PerftestConfig, sys: SysData) -> Result<(), PerftestError> {
        let off = nic.half + (self.posted as usize % self.bufs) * slot_step(cfg.size, sys);
        nic.p
            .post_recv(
                nic.qp,
                &[RecvWr {
                    wr_id: self.posted,
                    sges: vec![Sge {
                        addr: nic.mem.addr() + off as u64,
                        length: cfg.size as u32,
                        lkey: nic.mr.lkey,
                    }],
                }],
            )
            .map_err(|e| PerftestError::Transfer(format!("post receive: {e}")))?;
        self.posted += 1;
        Ok(())
    }

    /// Posts the first receives (before the client may send).
    fn start(
        nic: &Nic,
        cfg: &PerftestConfig,
        sys: SysData,
        bufs: usize,
    ) -> Result<Receiver, PerftestError> {
        let mut r = Receiver { bufs, posted: 0 };
        while r.posted < cfg.iters.min(bufs as u64) {
            r.post(nic, cfg, sys)?;
        }
        Ok(r)
    }

    /// Receives `iters` messages; returns seconds from the first to the last.
    fn run(
        &mut self,
        nic: &Nic,
        cfg: &PerftestConfig,
        sys: SysData,
        peer_is_ours: bool,
        verified: &mut Vec<String>,
    ) -> Result<f64, PerftestError> {
        let (n, size) = (cfg.iters, cfg.size);
        let step = slot_step(size, sys);
        let mut wc = vec![empty_wc(); 64];
        let mut idle = 0u32;
        let mut done = 0u64;
        let mut first: Option<Instant> = None;
        let mut last_progress = Instant::now();
        while done < n {
            let got = nic.poll(&mut wc, &mut idle)?;
            for c in &wc[..got] {
                if c.status != WcStatus::Success {
                    return Err(wc_error(c, done, n));
                }
                first.get_or_insert_with(Instant::now);
                if c.byte_len as usize != size {
                    return Err(PerftestError::Verify(format!(
                        "SEND {done} carried {} bytes, not {size}",
                        c.byte_len
                    )));
                }
                if peer_is_ours {
                    let at = nic.half + (c.wr_id as usize % self.bufs) * step;
                    let src = slot_offset(done, size, sys);
                    if nic.mem.to_vec(at, size) != pattern(src, size) {
                        return Err(PerftestError::Verify(format!(
                            "SEND {done} does not carry the client's pattern of slot {}",
                            src / step
                        )));
                    }
                }
                done += 1;
                if self.posted < n {
                    self.post(nic, cfg, sys)?;
                }
                last_progress = Instant::now();
            }
            if last_progress.elapsed() > cfg.timeout {
                return Err(PerftestError::Transfer(format!(
                    "no SEND arrived for {:?} ({done} of {n} received)",
                    cfg.timeout
                )));
            }
        }
        verified.push(format!(
            "{n} receives, all successful with {size} bytes each"
        ));
        if peer_is_ours {
            verified.push("every SEND carried the client's pattern".into());
        }
        Ok(first.map_or(0.0, |t| t.elapsed().as_secs_f64()))
    }
}

/// WRITE/READ server: checks the target buffer after the client is done.
fn server_check(
    nic: &Nic,
    cfg: &PerftestConfig,
    sys: SysData,
    client: Option<BwReport>,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(), PerftestError> {
    let size = cfg.size;
    // The client's own count (perftest wants -n equal on both sides, but
    // the slots written follow what the client did).
    let iters = match client {
        Some(r) if r.size != size as u64 => {
            return Err(PerftestError::Verify(format!(
            "the client moved {}-byte messages, we were told -s {size}: run both with the same -s",
            r.size
        )))
        }
        Some(r) => r.iters,
        None => cfg.iters,
    };
    let base = nic.half;
    let region = nic.mem.to_vec(base, nic.half);
    if cfg.verb == Verb::Atomic {
        return atomic_server_check(&region, cfg, sys, iters, peer_is_ours, verified);
    }
    if cfg.verb == Verb::Read {
        if region != pattern(0, nic.half) {
            return Err(PerftestError::Verify(
                "the READ source buffer changed during the test".into(),
            ));
        }
        verified.push("the READ source buffer was not written".into());
        return Ok(());
    }
    let slots = (slot_count(size, sys) as u64).min(iters) as usize;
    let step = slot_step(size, sys);
    let mut written = vec![false; nic.half];
    for s in 0..slots {
        let off = slot_offset(s as u64, size, sys);
        written[off..off + size].iter_mut().for_each(|w| *w = true);
        let got = &region[off..off + size];
        if peer_is_ours {
            if got != pattern(off, size).as_slice() {
                return Err(PerftestError::Verify(format!(
                    "slot {} does not hold the client's pattern",
                    off / step
                )));
            }
        } else if size >= 16 && got.iter().all(|&b| b == CANARY) {
            return Err(PerftestError::Verify(format!(
                "slot {} was never written",
                off / step
            )));
        }
    }
    if let Some(i) = (0..nic.half).find(|&i| !written[i] && region[i] != CANARY) {
        return Err(PerftestError::Verify(format!(
            "byte {i} of the target buffer, outside every written slot, changed"
        )));
    }
    verified.push(if peer_is_ours {
        format!("all {slots} written slots hold the client's pattern; nothing else changed")
    } else {
        format!("all {slots} slots were written; nothing outside them changed")
    });
    Ok(())
}

/// Atomic server: each slot of `region` (our target, which started as our
/// pattern) holds what `iters` atomics of the client's leave there, and
/// nothing else changed.
fn atomic_server_check(
    region: &[u8],
    cfg: &PerftestConfig,
    sys: SysData,
    iters: u64,
    peer_is_ours: bool,
    verified: &mut Vec<String>,
) -> Result<(), PerftestError> {
    let slots = atomic_slots(cfg, sys);
    let step = slot_step(ATOMIC_SIZE, sys);
    let initial: Vec<u64> = (0..slots).map(|s| atomic_initial(s, sys)).collect();
    let finals = |op: AtomicOp| {
        atomic::final_values(op, peer_is_ours, &initial, iters, |k| {
            (k % slots as u64) as usize
        })
    };
    let want = finals(cfg.atomic);
    let held: Vec<u64> = (0..slots)
        .map(|s| {
            let b = &region[s * step..s * step + ATOMIC_SIZE];
            u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
        })
        .collect();
    if held != want {
        let other = cfg.atomic.other();
        if held == finals(other) {
            return Err(PerftestError::Verify(format!(
                "the slots hold what {iters} {} would leave, not {iters} {}: run both sides with the same -A",
                other.name(),
                cfg.atomic.name()
            )));
        }
        let s = (0..slots).find(|&s| held[s] != want[s]).unwrap_or(0);
        let visits = iters / slots as u64 + u64::from((s as u64) < iters % slots as u64);
        return Err(PerftestError::Verify(format!(
            "atomic slot {s} holds {:#018x}, expected {:#018x} (initially {:#018x}, {visits} {} of {iters} in all{})",
            held[s],
            want[s],
            initial[s],
            cfg.atomic.name(),
            if cfg.latency {
                "; a latency server counts its own -n: run both sides with the same -n"
            } else {
                ""
            }
        )));
    }
    let mut written = vec![false; region.len()];
    for s in 0..slots {
        written[s * step..s * step + ATOMIC_SIZE]
            .iter_mut()
            .for_each(|w| *w = true);
    }
    let start = pattern(0, region.len());
    if let Some(i) = (0..region.len()).find(|&i| !written[i] && region[i] != start[i]) {
        return Err(PerftestError::Verify(format!(
            "byte {i} of the atomic target buffer, outside every slot, changed"
        )));
    }
    let used = (slots as u64).min(iters);
    let (subject, hold, its) = if used == 1 {
        ("the atomic slot".to_string(), "holds", "its")
    } else {
        (format!("all {used} atomic slots"), "hold", "their")
    };
    verified.push(match cfg.atomic {
        AtomicOp::FetchAdd => format!(
            "{subject} {hold} {its} initial value plus 1 per FETCH_AND_ADD ({iters} in all); nothing else changed"
        ),
        AtomicOp::CmpSwap if peer_is_ours => format!(
            "{subject} {hold} the last swap whose compare matched ({iters} CMP_AND_SWAP in all); nothing else changed"
        ),
        AtomicOp::CmpSwap => format!(
            "{subject} kept {its} nonzero initial value ({iters} CMP_AND_SWAP of compare 0, swap 0); nothing else changed"
        ),
    });
    Ok(())
}

fn print_dest(side: &str, d: &Dest, verb: Verb) {
    let mut s = format!(
        " {side} address: LID {:#06x} QPN {:#08x} PSN {:#08x}",
        d.lid, d.qpn, d.psn
    );
    if verb.reads() {
        s += &format!(" OUT {:#04x}", d.out_reads);
    }
    if verb.remote() {
        s += &format!(" RKey {:#010x} VAddr {:#018x}", d.rkey, d.vaddr);
    }
    println!("{s}");
    let gid: Vec<String> = d.gid.0.iter().map(|b| format!("{b:02}")).collect();
    println!(" GID: {}", gid.join(":"));
}

/// Accepts one connection, giving up after `timeout` (perftest waits
/// forever; we keep every wait bounded).
fn accept_within(l: &TcpListener, timeout: Duration) -> std::io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let end = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > end {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no client connected within {timeout:?}"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// One test in progress: the link and what the exchange agreed so far.
struct Session<'a> {
    cfg: &'a PerftestConfig,
    link: Link,
    peer_version: Option<PeerVersion>,
    sys: SysData,
    mtu: Mtu,
    nic: Option<Nic>,
    mine: Option<Dest>,
    peer: Option<Dest>,
    receiver: Option<Receiver>,
    local: Option<BwReport>,
    remote: Option<BwReport>,
    latency: Option<LatReport>,
    verified: Vec<String>,
}

/// A value an earlier step of the script provides.
fn need<'o, T>(o: &'o Option<T>, what: &str) -> Result<&'o T, PerftestError> {
    o.as_ref()
        .ok_or_else(|| bad(format!("internal: a step ran before {what} existed")))
}

impl Session<'_> {
    fn peer_is_ours(&self) -> bool {
        self.peer_version.as_ref().is_some_and(|v| v.rperftest)
    }

    /// SEND server: distinct receive buffers, at most 32 MiB of them.
    fn recv_bufs(&self) -> usize {
        (self.cfg.rx_depth as usize)
            .min(self.cfg.iters as usize)
            .min((32 << 20) / slot_step(self.cfg.size, self.sys))
            .max(1)
    }

    fn step(&mut self, step: Step) -> Result<(), PerftestError> {
        let cfg = self.cfg;
        match step {
            Step::Version => {
                let theirs = self.link.swap(&version_field(), VERSION_LEN, "versions")?;
                self.peer_version = Some(parse_version(&theirs)?);
            }
            Step::SysData => {
                let sys = self.sys;
                let c = self
                    .link
                    .swap(&sys_field(sys.cycle_buffer), 4, "cycle buffer sizes")?;
                let l = self
                    .link
                    .swap(&sys_field(sys.cache_line), 4, "cache line sizes")?;
                let four = |v: Vec<u8>| -> [u8; 4] { v.try_into().unwrap_or([0; 4]) };
                self.sys = agree_sys(sys, four(c), four(l))?;
            }
            Step::Mtu => {
                let theirs = self.link.swap(&mtu_field(cfg.mtu), 2, "MTUs")?;
                self.mtu = agree_mtu(cfg.mtu, [theirs[0], theirs[1]]);
                // Resources exist from here, sized for the agreed walk.
                self.open_nic()?;
            }
            Step::Dest => {
                let m = *need(&self.mine, "our dest")?;
                let theirs = self.link.swap(&m.to_msg(), DEST_LEN, "QP addresses")?;
                let d = Dest::from_msg(&theirs)?;
                if self.peer.is_none() {
                    if d.gid.is_ipv4_mapped() != m.gid.is_ipv4_mapped() {
                        return Err(bad(format!(
                            "GID types differ (ours {}, the peer's {}): use an IPv4 GID on both sides (-x)",
                            m.gid, d.gid
                        )));
                    }
                    self.peer = Some(d);
                }
            }
            Step::Connect => {
                let (m, d) = (
                    *need(&self.mine, "our dest")?,
                    *need(&self.peer, "the peer's dest")?,
                );
                need(&self.nic, "the NIC")?.connect(cfg.verb, &m, &d, self.mtu)?;
                self.print_header(&m, &d);
            }
            Step::PostReceives => {
                let bufs = self.recv_bufs();
                let n = need(&self.nic, "the NIC")?;
                self.receiver = Some(Receiver::start(n, cfg, self.sys, bufs)?);
            }
            Step::Run => {
                let ours = self.peer_is_ours();
                let n = need(&self.nic, "the NIC")?;
                let r = if self.link.client {
                    let d = need(&self.peer, "the peer's dest")?;
                    let (p, c) = client_run(n, cfg, self.sys, d, ours, &mut self.verified)?;
                    if cfg.latency {
                        let r = LatReport::from_posts(cfg.size as u64, &p).ok_or_else(|| {
                            PerftestError::Transfer(format!(
                                "{} messages are too few for a latency report",
                                p.len()
                            ))
                        })?;
                        println!("{}", r.line());
                        self.latency = Some(r);
                        return Ok(());
                    }
                    BwReport::from_times(cfg.size as u64, &p, &c, cfg.report_gbits)
                } else if let Some(rx) = self.receiver.as_mut() {
                    let secs = rx.run(n, cfg, self.sys, ours, &mut self.verified)?;
                    // perftest times a SEND server from its first receive
                    // to its last and computes no peak.
                    BwReport::from_span(cfg.size as u64, cfg.iters, secs, cfg.report_gbits)
                } else {
                    // WRITE/READ/atomic server: our NIC answers; the
                    // client times.
                    return Ok(());
                };
                println!("{}", r.line(cfg.report_gbits));
                self.local = Some(r);
            }
            Step::Check => {
                let ours = self.peer_is_ours();
                let n = need(&self.nic, "the NIC")?;
                server_check(n, cfg, self.sys, self.remote, ours, &mut self.verified)?;
            }
            Step::Reports => {
                let mine = self.local.unwrap_or(BwReport::from_span(
                    cfg.size as u64,
                    0,
                    1.0,
                    cfg.report_gbits,
                ));
                let mut got = [[0u8; 8]; 5];
                for (g, f) in got.iter_mut().zip(mine.to_fields()) {
                    g.copy_from_slice(&self.link.swap(&f, 8, "bandwidth reports")?);
                }
                if !self.link.client {
                    let r = BwReport::from_fields(got);
                    println!("{}", r.line(cfg.report_gbits));
                    self.remote = Some(r);
                }
            }
            Step::Done => {
                println!("{RESULT_LINE}");
                // perftest writes "done" and closes without reading; read
                // the peer's so neither side sees a reset.
                let _ = self.link.s.write_all(b"done\0");
                let mut tail = [0u8; 5];
                let _ = self.link.s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = self.link.s.read_exact(&mut tail);
            }
        }
        Ok(())
    }

    fn open_nic(&mut self) -> Result<(), PerftestError> {
        let cfg = self.cfg;
        let target = if cfg.verb == Verb::Send && !self.link.client {
            self.recv_bufs() * slot_step(cfg.size, self.sys)
        } else {
            0
        };
        let n = Nic::open(cfg, self.sys, target)?;
        // Sources carry the pattern, a READ source too; a WRITE or SEND
        // target starts as canary.
        n.mem.write_at(0, &pattern(0, n.half));
        let t = n.mem.len() - n.half;
        match cfg.verb {
            // An atomic target's slots start as the pattern too: our
            // client knows every initial value.
            Verb::Read | Verb::Atomic => n.mem.write_at(n.half, &pattern(0, t)),
            _ => n.mem.write_at(n.half, &vec![CANARY; t]),
        }
        let qpn =
            n.p.qp_num(n.qp)
                .map_err(|e| PerftestError::Setup(e.to_string()))?;
        self.mine = Some(Dest {
            lid: 0,
            out_reads: u16::from(n.out_reads),
            qpn: qpn.value(),
            psn: (std::process::id().wrapping_mul(2_654_435_761) ^ 0x00c0_ffee) & 0xff_ffff,
            rkey: n.mr.rkey.0,
            vaddr: n.target_addr(),
            gid: n.gid,
            srqn: 0,
        });
        self.nic = Some(n);
        Ok(())
    }

    fn print_header(&self, m: &Dest, d: &Dest) {
        let cfg = self.cfg;
        println!("{RESULT_LINE}");
        println!("                    {}", cfg.title());
        println!(
            " Connection type : RC\t\tDevice         : {DEVICE_NAME} ({})",
            cfg.bind
        );
        println!(
            " Mtu             : {}[B]\t\tTX depth       : {}",
            self.mtu.bytes(),
            if cfg.latency {
                1
            } else {
                u64::from(cfg.tx_depth).min(cfg.iters)
            }
        );
        println!(
            " Peer version    : {}{}",
            self.peer_version.as_ref().map_or("", |v| v.text.as_str()),
            if self.peer_is_ours() {
                " (rperftest)"
            } else {
                ""
            }
        );
        println!("{RESULT_LINE}");
        print_dest("local", m, cfg.verb);
        print_dest("remote", d, cfg.verb);
        println!("{RESULT_LINE}");
        if !cfg.latency {
            println!("{}", result_header(cfg.report_gbits));
        } else if self.link.client {
            println!("{LAT_HEADER}");
        }
        let _ = std::io::stdout().flush();
    }
}

/// Runs one side of a test.
///
/// # Errors
/// Bad values, exchange or socket trouble, a failed transfer or different
/// data.
pub fn run(cfg: &PerftestConfig) -> Result<PerftestReport, PerftestError> {
    cfg.validate()?;
    let client = cfg.server.is_some();
    let stream = if let Some(server) = cfg.server {
        let to = SocketAddr::new(server, cfg.port);
        TcpStream::connect_timeout(&to, cfg.timeout)
            .map_err(|e| PerftestError::Io(format!("connect to {to}"), e))?
    } else {
        let at = SocketAddr::new(cfg.bind, cfg.port);
        let l =
            TcpListener::bind(at).map_err(|e| PerftestError::Io(format!("listen on {at}"), e))?;
        println!();
        println!("************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
        let _ = std::io::stdout().flush();
        accept_within(&l, cfg.timeout)
            .map_err(|e| PerftestError::Io(format!("accept on {at}"), e))?
    };
    let io = |e| PerftestError::Io("socket options".into(), e);
    stream.set_read_timeout(Some(cfg.timeout)).map_err(io)?;
    stream.set_write_timeout(Some(cfg.timeout)).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let mut s = Session {
        cfg,
        link: Link { s: stream, client },
        peer_version: None,
        sys: SysData {
            cycle_buffer: CYCLE_BUFFER,
            cache_line: CACHE_LINE,
        },
        mtu: cfg.mtu,
        nic: None,
        mine: None,
        peer: None,
        receiver: None,
        local: None,
        remote: None,
        latency: None,
        verified: Vec::new(),
    };
    let result = script(cfg.verb, cfg.latency, client)
        .iter()
        .try_for_each(|&step| s.step(step));
    let counters = s.nic.as_ref().and_then(|n| n.soft.counters(n.guid));
    if let Some(n) = s.nic.take() {
        n.close();
    }
    result?;
    let peer = s.peer_version.ok_or_else(|| bad("no version exchanged"))?;
    if let Some(r) = s.remote {
        if r.iters != cfg.iters {
            s.verified.push(format!(
                "note: the client moved {} messages, we were told -n {}",
                r.iters, cfg.iters
            ));
        }
    }
    Ok(PerftestReport {
        local: s.local,
        latency: s.latency,
        remote: s.remote,
        mtu: s.mtu,
        peer,
        verified: s.verified,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_field_is_perftest_text_with_our_tag_after_the_nul() {
        let f = version_field();
        // "6.06" NUL "rperftest" NUL NUL
        assert_eq!(&f[..5], b"6.06\0");
        assert_eq!(&f[5..14], b"rperftest");
        assert_eq!(&f[14..], &[0, 0]);
        let v = parse_version(&f).unwrap();
        assert_eq!(v.text, "6.06");
        assert!((v.value - 6.06).abs() < 1e-9);
        assert!(v.rperftest);
        // Linux perftest: strncpy pads with NULs.
        let mut linux = [0u8; 16];
        linux[..4].copy_from_slice(b"5.93");
        let v = parse_version(&linux).unwrap();
        assert!(!v.rperftest);
        assert_eq!(v.text, "5.93");
    }

    #[test]
    fn old_or_garbage_versions_are_refused_like_perftest() {
        let mut old = [0u8; 16];
        old[..4].copy_from_slice(b"5.60");
        assert!(parse_version(&old)
            .unwrap_err()
            .to_string()
            .contains("5.60"));
        let junk = *b"GET / HTTP/1.1\r\n";
        assert!(parse_version(&junk)
            .unwrap_err()
            .to_string()
            .contains(">= 5.70"));
        assert!(parse_version(&[0xff; 16])
            .unwrap_err()
            .to_string()
            .contains("not text"));
        assert!(parse_version(&[0; 3]).is_err());
        assert_eq!(atof("  6.06abc"), 6.06);
        assert_eq!(atof("x"), 0.0);
        assert_eq!(atof("10"), 10.0);
    }

    #[test]
    fn sys_data_takes_the_larger_and_refuses_zero() {
        let ours = SysData {
            cycle_buffer: 4096,
            cache_line: 64,
        };
        // A 64 KiB-page peer (ppc64) with 128-byte lines.
        let s = agree_sys(ours, [0, 1, 0, 0], [0, 0, 0, 0x80]).unwrap();
        assert_eq!(s.cycle_buffer, 65536);
        assert_eq!(s.cache_line, 128);
        assert_eq!(sys_field(4096), [0, 0, 0x10, 0]);
        assert!(agree_sys(ours, [0; 4], [0, 0, 0, 64]).is_err());
        assert!(agree_sys(ours, [0xff; 4], [0, 0, 0, 64]).is_err());
    }

    #[test]
    fn mtu_field_is_the_code_as_text_and_the_smaller_wins() {
        assert_eq!(mtu_field(Mtu::Mtu1024), *b"3\0");
        assert_eq!(mtu_field(Mtu::Mtu4096), *b"5\0");
        assert_eq!(agree_mtu(Mtu::Mtu4096, *b"3\0"), Mtu::Mtu1024);
        assert_eq!(agree_mtu(Mtu::Mtu1024, *b"5\0"), Mtu::Mtu1024);
        // Not a code: ours stays (perftest's valid_mtu_size rule).
        assert_eq!(agree_mtu(Mtu::Mtu2048, *b"9\0"), Mtu::Mtu2048);
        assert_eq!(agree_mtu(Mtu::Mtu2048, *b"x\0"), Mtu::Mtu2048);
    }

    #[test]
    fn dest_message_matches_perftest_format() {
        let d = Dest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x5555_0000_1000,
            gid: Gid::from_ip("10.77.0.11".parse().unwrap()),
            srqn: 0,
        };
        let m = d.to_msg();
        let text = concat!(
            "0000:0010:000011:abcdef:12345678:0000555500001000:",
            "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0b:",
            "00000000:"
        );
        assert_eq!(text.len(), 107);
        assert_eq!(&m[..107], text.as_bytes());
        assert_eq!(m[107], 0);
        assert_eq!(Dest::from_msg(&m).unwrap(), d);
    }

    #[test]
    fn garbage_dest_messages_name_the_problem() {
        let e = |m: &[u8]| {
            let mut b = [0u8; DEST_LEN];
            b[..m.len()].copy_from_slice(m);
            Dest::from_msg(&b).unwrap_err().to_string()
        };
        assert!(e(b"hello").contains("not LID:OUT_READS"));
        let good = Dest {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 1,
            rkey: 2,
            vaddr: 3,
            gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            srqn: 0,
        }
        .to_msg();
        let mut m = good;
        m[10] = b'z'; // inside the QPN
        assert!(Dest::from_msg(&m)
            .unwrap_err()
            .to_string()
            .contains("bad QPN"));
        let mut m = good;
        m[50] = b'g'; // first GID byte
        assert!(Dest::from_msg(&m)
            .unwrap_err()
            .to_string()
            .contains("bad GID byte"));
        assert!(Dest::from_msg(&[0xff; DEST_LEN])
            .unwrap_err()
            .to_string()
            .contains("not text"));
        assert!(Dest::from_msg(&good[..50]).is_err());
        // Wider than 24 bits.
        assert!(e(b"0000:0001:1000000:000001:00000002:0000000000000003:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:00000000:")
            .contains("QPN 1000000 out of range"));
    }

    #[test]
    fn report_fields_are_big_endian_and_round_trip() {
        let r = BwReport {
            size: 65536,
            iters: 1000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.002,
        };
        let f = r.to_fields();
        assert_eq!(f[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(f[1], [0, 0, 0, 0, 0, 0, 0x03, 0xe8]);
        // 1.5 = 0x3ff8000000000000
        assert_eq!(f[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(BwReport::from_fields(f), r);
    }

    #[test]
    fn report_numbers_follow_perftest_units() {
        // 1000 messages of 1 MiB, one every millisecond: 1000 MiB/s.
        let p: Vec<f64> = (0..1000).map(|i| i as f64 * 1e-3).collect();
        let c: Vec<f64> = (0..1000).map(|i| (i + 1) as f64 * 1e-3).collect();
        let r = BwReport::from_times(1 << 20, &p, &c, false);
        assert!((r.bw_avg - 1000.0).abs() < 1e-6, "{r:?}");
        assert!((r.msg_rate - 0.001).abs() < 1e-9);
        assert!((r.bw_peak - 1000.0).abs() < 1e-6);
        let g = BwReport::from_times(1 << 20, &p, &c, true);
        assert!((g.bw_avg - 1000.0 * 1_048_576.0 * 8.0 / 1e9).abs() < 1e-6);
        assert!(
            g.line(true).starts_with(" 1048576    1000 "),
            "{}",
            g.line(true)
        );
        // Under 0.1 Gb/s perftest prints six decimals: 300 READs of 200
        // bytes in 0.147 s is 0.003265 Gb/s, not 0.00.
        let slow = BwReport::from_span(200, 300, 0.147, true);
        let line = slow.line(true);
        let avg: f64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert!((avg - 0.003265).abs() < 1e-6, "{line}");
        assert!(slow.line(false).contains("0.00"), "{}", slow.line(false));
    }

    #[test]
    fn the_address_walk_is_perftest_s() {
        let sys = SysData {
            cycle_buffer: 4096,
            cache_line: 64,
        };
        // 100 bytes step by 128, 32 slots, wrapping.
        assert_eq!(slot_offset(1, 100, sys), 128);
        assert_eq!(slot_offset(31, 100, sys), 31 * 128);
        assert_eq!(slot_offset(32, 100, sys), 0);
        // Small messages step by a cache line.
        assert_eq!(slot_offset(3, 2, sys), 192);
        // Above half the cycle buffer: always the base.
        assert_eq!(slot_offset(7, 2049, sys), 0);
        assert_eq!(buffer_size(2, sys), 4096);
        assert_eq!(buffer_size(65536, sys), 65536);
    }

    #[test]
    fn scripts_are_perftest_s_order() {
        use Step::*;
        let dests = |s: &[Step]| s.iter().filter(|x| **x == Dest).count();
        // WRITE/READ/atomic bandwidth: 3 swaps before the run, 1 after, 1
        // to close.
        assert_eq!(dests(script(Verb::Write, false, true)), 5);
        assert_eq!(dests(script(Verb::Read, false, false)), 5);
        assert_eq!(
            script(Verb::Atomic, false, true),
            script(Verb::Write, false, true)
        );
        assert_eq!(
            script(Verb::Atomic, false, false),
            script(Verb::Read, false, false)
        );
        // SEND: 4 before (the last after receives are posted), 1 to close.
        assert_eq!(dests(script(Verb::Send, false, true)), 5);
        let s = script(Verb::Send, false, false);
        let post = s.iter().position(|x| *x == PostReceives).unwrap();
        assert_eq!(s[post + 1], Dest);
        assert!(!script(Verb::Send, false, true).contains(&Reports));
        // A WRITE server checks once the client is done and has reported.
        let w = script(Verb::Write, false, false);
        let check = w.iter().position(|x| *x == Check).unwrap();
        assert_eq!((w[check - 2], w[check - 1]), (Dest, Reports));
        // atomic_lat.c: 2 swaps, connect, 2 swaps; the client runs, then
        // both close; no reports. The server checks after the close swap.
        let (c, sv) = (
            script(Verb::Atomic, true, true),
            script(Verb::Atomic, true, false),
        );
        assert_eq!(&c[3..6], &[Dest, Dest, Connect]);
        assert_eq!(&sv[3..6], &[Dest, Dest, Connect]);
        assert_eq!(dests(c), 5);
        assert_eq!(dests(sv), 5);
        assert!(!c.contains(&Reports) && !sv.contains(&Reports) && !sv.contains(&Run));
        assert_eq!(&c[c.len() - 3..], &[Run, Dest, Done]);
        assert_eq!(&sv[sv.len() - 3..], &[Dest, Check, Done]);
        for v in [Verb::Write, Verb::Read, Verb::Send, Verb::Atomic] {
            for c in [true, false] {
                for l in [false, true] {
                    let s = script(v, l, c);
                    assert_eq!(&s[..3], &[Version, SysData, Mtu]);
                    assert_eq!(s.last(), Some(&Done));
                }
            }
        }
    }

    fn cfg(verb: Verb) -> PerftestConfig {
        PerftestConfig {
            verb,
            atomic: AtomicOp::FetchAdd,
            latency: false,
            bind: "127.0.0.1".parse().unwrap(),
            server: None,
            port: DEFAULT_PORT,
            udp_port: 4791,
            size: 8,
            iters: 1000,
            duration: None,
            tx_depth: 128,
            rx_depth: 512,
            mtu: Mtu::Mtu1024,
            outs: None,
            gid_index: None,
            device: None,
            report_gbits: false,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn atomic_options_are_checked_like_perftest() {
        let mut c = cfg(Verb::Atomic);
        assert!(c.validate().is_ok());
        assert_eq!(c.title(), "Atomic FETCH_AND_ADD BW Test");
        c.latency = true;
        c.atomic = AtomicOp::CmpSwap;
        assert_eq!(c.title(), "Atomic CMP_AND_SWAP Latency Test");
        assert!(c.validate().is_ok());
        c.iters = 4;
        assert!(c.validate().unwrap_err().to_string().contains("at least 5"));
        c.iters = 10;
        c.duration = Some(Duration::from_secs(1));
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("-D works with bandwidth"));
        let mut c = cfg(Verb::Atomic);
        c.size = 16;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("atomics move 8 bytes"));
        let mut w = cfg(Verb::Write);
        assert_eq!(w.title(), "RDMA_Write BW Test");
        w.latency = true;
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--lat works with atomic only"));
    }

    #[test]
    fn latency_report_follows_print_report_lat() {
        // Posts 10 us apart except two slow gaps, which are dropped.
        let mut t = 0.0;
        let mut posts = vec![t];
        for i in 0..10 {
            t += if i == 3 || i == 7 {
                1e-3
            } else {
                10e-6 + i as f64 * 1e-6
            };
            posts.push(t);
        }
        let r = LatReport::from_posts(8, &posts).unwrap();
        assert_eq!(r.iters, 11);
        // Kept samples: 10, 11, 12, 14, 15, 16, 18, 19 us (8; median the
        // mean of the middle two), max the largest kept.
        assert!((r.min - 10.0).abs() < 1e-6, "{r:?}");
        assert!((r.max - 1000.0).abs() < 1e-6, "{r:?}");
        assert!((r.typical - 14.5).abs() < 1e-6, "{r:?}");
        assert!((r.avg - 14.375).abs() < 1e-6, "{r:?}");
        let line = r.line();
        assert!(line.starts_with(" 8       11          10.00 "), "{line:?}");
        assert_eq!(line.split_whitespace().count(), 9);
        assert!(LatReport::from_posts(8, &posts[..4]).is_none());
    }

    #[test]
    fn atomic_server_check_names_what_differs() {
        let sys = SysData {
            cycle_buffer: 4096,
            cache_line: 64,
        };
        let c = cfg(Verb::Atomic);
        let mut region = pattern(0, 4096);
        // 100 fetch-and-adds: slots 0..36 visited twice, the rest once.
        for s in 0..64 {
            let at = s * 64;
            let v = atomic_initial(s, sys) + if s < 36 { 2 } else { 1 };
            region[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        let mut v = Vec::new();
        atomic_server_check(&region, &c, sys, 100, false, &mut v).unwrap();
        assert!(
            v[0].contains("all 64 atomic slots hold their initial value plus 1"),
            "{v:?}"
        );
        let e = atomic_server_check(&region, &c, sys, 101, false, &mut v).unwrap_err();
        assert!(e.to_string().contains("atomic slot 36 holds"), "{e}");
        assert!(e.to_string().contains("2 FETCH_AND_ADD of 101"), "{e}");
        // The client ran compare 0 / swap 0 while we were told FETCH_AND_ADD.
        let e = atomic_server_check(&pattern(0, 4096), &c, sys, 100, false, &mut v).unwrap_err();
        assert!(
            e.to_string().contains("run both sides with the same -A"),
            "{e}"
        );
        region[8] ^= 1;
        let e = atomic_server_check(&region, &c, sys, 100, false, &mut v).unwrap_err();
        assert!(
            e.to_string().contains("byte 8 of the atomic target buffer"),
            "{e}"
        );
    }
}
