//! `rperftest`: tests that speak perftest's own out-of-band exchange, so
//! Linux's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw` and
//! `ib_atomic_lat` (perftest 4.5-0.17 as packaged in Debian bookworm,
//! which calls itself version 6.06) can be the peer in either role. RC
//! transport over RoCEv2, or over iWARP with `-R`.
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
//! RDMA CM mode (`-R`, what perftest needs on iWARP): the same steps,
//! carried as SENDs on an RDMA CM connection of their own, with the test
//! QP connected by RDMA CM; see [`cm`]. WRITE, READ and SEND only.
//!
//! Not supported (the command line refuses them): UC/UD/XRC/DC (`-c`),
//! several QPs (`-q`), bidirectional (`-b`), all sizes (`-a`), atomics
//! and latency with `-R`, events, inline, post lists.
//!
//! The codec below is pure (byte vectors in, values out); [`script`] is
//! the order of steps for a role and verb, and [`run`] drives it over a
//! socket and the soft RoCE NIC (`rnic::softroce`).

pub mod atomic;
pub mod cm;

pub use atomic::AtomicOp;
use atomic::{AtomicModel, ATOMIC_SIZE};
use rdma_types::{AccessFlags, Gid, Mtu, Psn, QpState, Qpn, Rkey, WcStatus};

mod exchange;
mod nic;
mod report;
mod session;
mod traffic;

use cm::CmLink;
pub use cm::DEST_BIN_LEN;
pub use exchange::*;
use nic::*;
pub use report::*;
use session::*;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use traffic::*;
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
    /// The NIC could not be opened.
    Device(crate::device::NicError),
    /// The stop flag ([`PerftestConfig::stop`]) ended a wait for the
    /// peer before the test began.
    Interrupted,
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
            PerftestError::Device(e) => write!(f, "{e}"),
            PerftestError::Interrupted => write!(f, "interrupted before the test began"),
        }
    }
}

impl std::error::Error for PerftestError {}

fn bad(s: impl Into<String>) -> PerftestError {
    PerftestError::Exchange(s.into())
}

// ---------------------------------------------------------------- codec --

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
    /// Write `"done\0"` and close (RDMA CM mode: disconnect).
    Done,
    /// RDMA CM mode: swap zeroed dest structs (the fences around the
    /// test's connection).
    Fence,
    /// RDMA CM mode: connect the test's QP through RDMA CM.
    CmConnect,
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

/// The steps of a test: [`script`], with perftest's RDMA CM mode's
/// connection of the test QP (`rdma_cm`) fenced in after the MTU swap.
pub fn steps(verb: Verb, latency: bool, client: bool, rdma_cm: bool) -> Vec<Step> {
    let mut s = script(verb, latency, client).to_vec();
    if rdma_cm {
        let at = s.iter().position(|x| *x == Step::Mtu).map_or(0, |i| i + 1);
        s.splice(at..at, [Step::Fence, Step::CmConnect, Step::Fence]);
    }
    s
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
    /// The address a server listens on (TCP).
    pub bind: IpAddr,
    /// The server to connect to; `None` serves.
    pub server: Option<IpAddr>,
    /// TCP port of the exchange (RDMA CM mode: the RDMA CM port).
    pub port: u16,
    /// perftest's RDMA CM mode (`-R`): the exchange and the test's QP
    /// connect through RDMA CM.
    pub rdma_cm: bool,
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
    /// Report Gb/s instead of MB/s.
    pub report_gbits: bool,
    /// Give up when the peer or the transfer is silent this long.
    pub timeout: Duration,
    /// The NIC: our soft RoCE NIC, or an rdma-core device's port (`-d`).
    pub nic: crate::device::NicChoice,
    /// Set on an interrupt: the run stops posting, reports what completed
    /// ([`PerftestReport::interrupted`]) and skips the rest of the
    /// exchange; a wait for the peer ends.
    pub stop: Arc<AtomicBool>,
}

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
    /// An interrupt ended the run ([`PerftestConfig::stop`]): the numbers
    /// printed cover what completed; the steps after it (reports, checks,
    /// the close) were skipped.
    pub interrupted: bool,
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
        if self.rdma_cm && (self.verb == Verb::Atomic || self.latency) {
            return Err(PerftestError::Usage(
                "-R (RDMA CM) works with write, read and send; atomics use perftest's TCP exchange"
                    .into(),
            ));
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
        Ok(())
    }
}

/// Runs one side of a test.
///
/// # Errors
/// Bad values, exchange or socket trouble, a failed transfer or different
/// data.
pub fn run(cfg: &PerftestConfig) -> Result<PerftestReport, PerftestError> {
    cfg.validate()?;
    // Before the peer is waited for: a missing library or device is
    // said at once.
    let dev = crate::device::Nic::open(&cfg.nic).map_err(PerftestError::Device)?;
    let client = cfg.server.is_some();
    let waiting = || {
        println!();
        println!("************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
        let _ = std::io::stdout().flush();
    };
    let chan = if cfg.rdma_cm {
        let mut l = CmLink::open(cfg, &dev)?;
        if !client {
            waiting();
        }
        if let Err(e) = l.start(cfg, &dev) {
            l.close();
            return Err(e);
        }
        Chan::Cm(Box::new(l))
    } else {
        let stream = if let Some(server) = cfg.server {
            let to = SocketAddr::new(server, cfg.port);
            TcpStream::connect_timeout(&to, cfg.timeout)
                .map_err(|e| PerftestError::Io(format!("connect to {to}"), e))?
        } else {
            let at = SocketAddr::new(cfg.bind, cfg.port);
            let l = TcpListener::bind(at)
                .map_err(|e| PerftestError::Io(format!("listen on {at}"), e))?;
            waiting();
            accept_within(&l, cfg.timeout, &cfg.stop).map_err(|e| match e.kind() {
                std::io::ErrorKind::Interrupted => PerftestError::Interrupted,
                _ => PerftestError::Io(format!("accept on {at}"), e),
            })?
        };
        let io = |e| PerftestError::Io("socket options".into(), e);
        stream
            .set_read_timeout(Some(crate::STOP_POLL))
            .map_err(io)?;
        stream.set_write_timeout(Some(cfg.timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        Chan::Tcp(stream)
    };
    let mut s = Session {
        cfg,
        link: Link {
            chan,
            client,
            timeout: cfg.timeout,
            stop: cfg.stop.clone(),
        },
        peer_version: None,
        sys: SysData {
            cycle_buffer: CYCLE_BUFFER,
            cache_line: CACHE_LINE,
        },
        mtu: cfg.mtu,
        dev: Some(dev),
        nic: None,
        mine: None,
        peer: None,
        receiver: None,
        local: None,
        remote: None,
        latency: None,
        verified: Vec::new(),
    };
    // An interrupt ends the script after the step it came in (a run
    // reports what completed) or in a wait for the peer.
    let mut interrupted = false;
    let mut result = Ok(());
    for step in steps(cfg.verb, cfg.latency, client, cfg.rdma_cm) {
        interrupted = cfg.stop.load(Ordering::Relaxed);
        if interrupted {
            break;
        }
        result = s.step(step);
        interrupted = matches!(result, Err(PerftestError::Interrupted));
        if result.is_err() {
            break;
        }
    }
    let counters = s.nic.as_ref().and_then(|n| n.dev.soft_counters());
    // The exchange's QP before the CA closes with the test's objects.
    if let Chan::Cm(l) = &mut s.link.chan {
        l.close();
    }
    if let Some(n) = s.nic.take() {
        n.close();
    }
    if !interrupted {
        result?;
    }
    let peer = s.peer_version.ok_or(if interrupted {
        PerftestError::Interrupted
    } else {
        bad("no version exchanged")
    })?;
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
        interrupted,
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
            rdma_cm: false,
            size: 8,
            iters: 1000,
            duration: None,
            tx_depth: 128,
            rx_depth: 512,
            mtu: Mtu::Mtu1024,
            outs: None,
            gid_index: None,
            report_gbits: false,
            timeout: Duration::from_secs(1),
            stop: Default::default(),
            nic: crate::device::NicChoice::Soft {
                ip: "127.0.0.1".parse().unwrap(),
                udp_port: 4791,
                mtu: Mtu::Mtu1024,
                opts: rnic::softroce::NicOptions::default(),
            },
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
