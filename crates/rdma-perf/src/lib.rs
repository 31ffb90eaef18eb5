//! `rperf`: bandwidth, message rate and latency of the soft RoCE NIC between
//! two processes, in the spirit of perftest's `ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw` and `ib_send_lat`.
//!
//! The server and the client each own a soft RoCE [`softroce::Node`]. They
//! meet over a TCP connection (the out-of-band exchange, one JSON line each
//! way: RoCE address, QPN, first PSN, R_Key and buffer size), connect an RC
//! QP pair, and the client drives the test while the server's node answers.
//! At the end the client asks for a digest of the server's buffer, so a
//! `--verify` run proves every written byte landed.
//!
//! `--baseline` measures plain UDP between the same two addresses in the
//! same run (the client blasts datagrams of the path MTU, the server counts
//! them) and reports our/baseline ratios. Both ends of the baseline use the
//! node's own socket layer (`roce_udp`: `sendmmsg` batches, GSO runs,
//! `recvmmsg` with GRO, the same buffer sizes), so the ratio compares our
//! transport with the best plain UDP the same I/O can do. A second phase,
//! the floor, adds what any RoCE NIC in user space must do per byte: a
//! CRC-32 of each datagram computed by the sender and checked by the
//! receiver, which then copies the payload into place. Ours over the floor
//! is the cost of the transport itself.
//!
//! Each side also measures the CPU time its thread spent moving data (its
//! polls that had work, sampled; the baseline's send and receive calls),
//! reported as nanoseconds per byte: on a machine whose cores are shared,
//! wall-clock bandwidth follows the neighbours' load, while the CPU cost
//! of a byte on each side says where the time goes and which side limits
//! the rate when both are CPU-bound (polls that found nothing are left
//! out: the side that waits for its peer polls in a loop).
//!
//! `--duration SECS` runs for a time instead of a count (with `--iters`
//! too, whichever ends first): posting stops when it has passed, and the
//! report counts the messages that completed.
//!
//! Interrupts (every tool here): the binary hands SIGINT and SIGTERM to
//! `daemon_ctl::signals::TermSignals::watch` and passes its flag in the
//! configuration (`stop`). A run that sees it stops posting, waits at most
//! [`DRAIN`] for the work requests in flight, reports what completed in
//! its usual format marked as interrupted, skips the rest of the exchange
//! (the peer may be what stopped answering) and disconnects; a wait for a
//! peer (accept, the exchange, RDMA CM) ends on it too. An `rperf` server
//! cut off mid-test says what its QP took from the client ([`Served`]);
//! the client sees the connection close at once ([`PerfError::ServerLeft`]).
//! [`exit_code`] then exits as a shell reports an interrupted command.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod device;
pub mod fuzz;
mod onverbs;
pub mod perftest;
pub mod pingpong;
pub mod rping;

use rdma_sim::FaultConfig;

mod baseline;

use baseline::*;
use rdma_types::{Duration, Instant, Lkey, Mtu, Psn, Qpn, Rkey, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use serde::{Deserialize, Serialize};
use softroce::{FlatMemory, Node, NodeConfig, QpHandle};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant as StdInstant;

/// How long an interrupted run waits for the work requests it has in
/// flight before it reports without them (a peer that stopped answering
/// never completes them).
pub const DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// How often a wait for a peer (accept, a read of the exchange) looks at
/// the stop flag.
pub(crate) const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// The exit status of a tool of this crate: after an interrupt, 128 + the
/// signal's number (130 for SIGINT, 143 for SIGTERM), saying on standard
/// error that the report holds what was done so far; else success or
/// failure as `ok` says.
pub fn exit_code(
    tool: &str,
    interrupt: &daemon_ctl::signals::Interrupt,
    ok: bool,
) -> std::process::ExitCode {
    match interrupt.signal() {
        Some(sig) => {
            eprintln!(
                "{tool}: {}: stopped; the report holds what was done so far",
                daemon_ctl::signals::name(sig)
            );
            std::process::ExitCode::from(daemon_ctl::signals::exit_status(sig))
        }
        None if ok => std::process::ExitCode::SUCCESS,
        None => std::process::ExitCode::FAILURE,
    }
}

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// RDMA WRITE (ib_write_bw).
    Write,
    /// RDMA READ (ib_read_bw).
    Read,
    /// SEND/RECV (ib_send_bw; with `--qd 1`, ib_send_lat).
    Send,
}

/// The memory key both sides register their buffer under.
const KEY: u32 = 0x5151;

/// What each side tells the other over TCP.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Hello {
    roce: SocketAddr,
    qpn: u32,
    psn: u32,
    rkey: u32,
    len: usize,
    /// Path MTU this side wants; both use the smaller.
    mtu: usize,
    /// Client only: what the server must do (post receives for SEND).
    op: Option<Op>,
    /// Client only: how many SENDs to expect.
    sends: Option<u64>,
    /// Client only: the server writes back as much at the same time.
    #[serde(default)]
    bidir: Option<Bidir>,
    /// The GID to reach this side at, when it is on a device (a soft
    /// side is at the GID of `roce`'s address).
    #[serde(default)]
    gid: Option<[u8; 16]>,
    /// Where the buffer starts in RDMA addresses (a soft side's are
    /// offsets: 0).
    #[serde(default)]
    vaddr: u64,
}

/// What a bidirectional WRITE test asks the server to send back.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Bidir {
    qd: usize,
    iters: u64,
    /// Offset in the client's buffer the server writes to.
    remote_base: u64,
}

/// Messages after the hello.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Control {
    /// Client: the test is over; tell me your buffer digest.
    Done,
    /// Server: FNV-1a 64 of the buffer, its receive count, for a
    /// bidirectional test how long its own writes took, and the CPU time
    /// of its turns that had work, up to the client's Done.
    Digest {
        fnv: u64,
        received: u64,
        #[serde(default)]
        reverse_seconds: Option<f64>,
        #[serde(default)]
        cpu_seconds: Option<f64>,
    },
    /// Client: baseline starting, count datagrams on this UDP port. With
    /// `floor`, also check each datagram's trailing CRC-32 and copy its
    /// payload into place in a region of `region` bytes.
    Baseline {
        port: u16,
        #[serde(default)]
        floor: bool,
        #[serde(default)]
        region: usize,
    },
    /// Client: a plain-TCP baseline (a test on our soft iWARP NIC):
    /// listen on this port and read `chunk` bytes at a time into a region
    /// of `region` bytes until the stream ends.
    TcpBaseline {
        port: u16,
        region: usize,
        chunk: usize,
    },
    /// Server: the TCP baseline's listener is up.
    TcpReady,
    /// Server: datagrams and bytes of the baseline received, and the CPU
    /// time receiving them took.
    BaselineResult {
        datagrams: u64,
        bytes: u64,
        #[serde(default)]
        cpu_seconds: Option<f64>,
    },
}

/// Settings shared by both roles.
#[derive(Debug, Clone)]
pub struct Common {
    /// RoCE address of this node.
    pub bind: SocketAddr,
    /// Path MTU.
    pub mtu: Mtu,
    /// Faults injected on this node's send path.
    pub faults: Option<FaultConfig>,
    /// pcap capture of this node's traffic.
    pub capture: Option<PathBuf>,
    /// Buffer size in bytes.
    pub buffer: usize,
    /// UDP GSO and GRO on this node's socket (`NodeConfig::gso`/`gro`;
    /// `rperf` maps `SOFTROCE_GSO` onto it: [`softroce::gso_from_env`]).
    pub gso: bool,
    /// Set on an interrupt: a client stops posting and reports what
    /// completed ([`Report::interrupted`]), a server stops serving
    /// ([`Served::interrupted`], or [`PerfError::Interrupted`] while it
    /// waits for a client).
    pub stop: Arc<AtomicBool>,
    /// Run on this NIC through the verbs (`rperf --device`: an rdma-core
    /// device) instead of a soft RoCE node at `bind`; `bind`, `faults`,
    /// `capture` and `gso` are then unused, the QP counters of the
    /// reports are 0 (the device keeps its own), and so is a WRITE or
    /// READ server's CPU per byte (the device answers without it).
    pub device: Option<Arc<device::Nic>>,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Shared settings.
    pub common: Common,
    /// The server's TCP address.
    pub server: SocketAddr,
    /// Operation.
    pub op: Op,
    /// Message size.
    pub size: usize,
    /// Work requests in flight.
    pub qd: usize,
    /// Messages to move (at most, with `duration`).
    pub iters: u64,
    /// Move messages for this long instead of a count: posting stops once
    /// it has passed, and the report counts what completed.
    pub duration: Option<std::time::Duration>,
    /// Check every byte.
    pub verify: bool,
    /// Also measure plain UDP between the same addresses.
    pub baseline: bool,
    /// WRITE only: the server writes back as much at the same time.
    pub bidir: bool,
}

/// Results of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: usize,
    /// Queue depth.
    pub qd: usize,
    /// Messages moved.
    pub iters: u64,
    /// Wall time of the transfer, seconds.
    pub seconds: f64,
    /// Goodput, Gbit/s.
    pub gbit_per_s: f64,
    /// Messages per second.
    pub msg_per_s: f64,
    /// Post-to-completion latency percentiles, microseconds.
    pub lat_us_p50: f64,
    /// 99th percentile.
    pub lat_us_p99: f64,
    /// 99.9th percentile.
    pub lat_us_p999: f64,
    /// Packets retransmitted by the client's QP.
    pub retransmits: u64,
    /// Retransmission timeouts at the client's QP.
    pub timeouts: u64,
    /// Whether `--verify` checked the data (and it matched).
    pub verified: bool,
    /// Bidirectional WRITE: the server's goodput toward us, Gbit/s.
    pub reverse_gbit_per_s: Option<f64>,
    /// Plain-UDP goodput between the same addresses, Gbit/s.
    pub baseline_gbit_per_s: Option<f64>,
    /// Plain-UDP datagram rate.
    pub baseline_pkt_per_s: Option<f64>,
    /// Our goodput over the baseline's.
    pub ratio_to_baseline: Option<f64>,
    /// What the baseline ran over: `UDP` (soft RoCE, a device) or `TCP`
    /// (our soft iWARP NIC).
    pub baseline_over: Option<&'static str>,
    /// CPU time of the client's polls that had work, per byte moved,
    /// nanoseconds (sampled: see the crate docs).
    pub client_cpu_ns_per_byte: f64,
    /// The same for the server.
    pub server_cpu_ns_per_byte: Option<f64>,
    /// Baseline: the sender's CPU time per byte the kernel took (it never
    /// waits).
    pub baseline_client_cpu_ns_per_byte: Option<f64>,
    /// Baseline: the receiver's CPU time of receive calls that found
    /// data, per byte received.
    pub baseline_server_cpu_ns_per_byte: Option<f64>,
    /// The floor: plain UDP plus a CRC-32 of every datagram computed by
    /// the sender and checked by the receiver, which also copies each
    /// payload into place. Gbit/s of payload.
    pub floor_gbit_per_s: Option<f64>,
    /// Our goodput over the floor's.
    pub ratio_to_floor: Option<f64>,
    /// The floor's sender CPU per byte.
    pub floor_client_cpu_ns_per_byte: Option<f64>,
    /// The floor's receiver CPU per byte.
    pub floor_server_cpu_ns_per_byte: Option<f64>,
    /// A WRITE test's floor in a WRITE's packet shape: each message's
    /// first datagram longer than the rest, as the RETH makes a RoCE
    /// NIC's, so a message takes two segmented sends (see `udp_phase`).
    /// Gbit/s of payload.
    pub shaped_floor_gbit_per_s: Option<f64>,
    /// Our goodput over the shaped floor's.
    pub ratio_to_shaped_floor: Option<f64>,
    /// An interrupt ended the run ([`Common::stop`]): the numbers cover
    /// the messages that completed; the server's CPU, `--verify` and
    /// `--baseline` were skipped.
    pub interrupted: bool,
    /// The rdma-core device the client ran on (`--device`); `None`: our
    /// soft RoCE NIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// CPU time the calling thread has used, seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for clock_gettime.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// What went wrong; each says what to check.
#[derive(Debug)]
pub enum PerfError {
    /// Socket, TCP or file trouble.
    Io(std::io::Error),
    /// The peer broke the exchange protocol.
    Protocol(String),
    /// A work request failed.
    Completion(String),
    /// `--verify` found different bytes.
    Verify(String),
    /// A server was interrupted ([`Common::stop`]) while it waited for
    /// a client.
    Interrupted,
    /// The server closed the connection in the middle of the test
    /// (interrupted, or gone): its output says why.
    ServerLeft {
        /// Messages that completed before.
        done: u64,
    },
    /// The device (`--device`) refused a setup step or a post.
    Device(String),
}

impl std::fmt::Display for PerfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerfError::Io(e) => write!(f, "I/O error: {e}"),
            PerfError::Protocol(s) => write!(f, "exchange with the peer failed: {s}"),
            PerfError::Completion(s) => write!(f, "work request failed: {s}"),
            PerfError::Verify(s) => write!(f, "data verification failed: {s}"),
            PerfError::Interrupted => write!(f, "interrupted"),
            PerfError::ServerLeft { done } => write!(
                f,
                "the server closed the connection after {done} messages completed: see its output"
            ),
            PerfError::Device(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for PerfError {}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> Self {
        PerfError::Io(e)
    }
}

fn send_line<T: Serialize>(s: &mut TcpStream, v: &T) -> Result<(), PerfError> {
    let mut line = serde_json::to_string(v).map_err(|e| PerfError::Protocol(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    Ok(())
}

fn read_line<T: for<'de> Deserialize<'de>>(r: &mut BufReader<TcpStream>) -> Result<T, PerfError> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(PerfError::Protocol("peer closed the connection".into()));
    }
    serde_json::from_str(&line)
        .map_err(|e| PerfError::Protocol(format!("bad message {line:?}: {e}")))
}

/// The deterministic content of byte `i` of a buffer.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) % 251) as u8
}

/// FNV-1a 64's offset basis.
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64 of `data`.
fn fnv(data: &[u8]) -> u64 {
    fnv_update(FNV_START, data)
}

/// FNV-1a 64 continued over `data` from state `h`.
fn fnv_update(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Empty polls before a tool's loop on its own soft RoCE node sleeps in
/// the kernel (each poll is a receive: a system call).
const SPIN_POLLS: u32 = 64;

/// The longest a side on the verbs (an rdma-core device, the NIC daemon)
/// polls its CQ before it sleeps ([`verbs::spin::Spin`]): its polls are
/// cheap (no system call), so it polls by time, not by count.
const VERBS_SPIN_MAX: std::time::Duration = std::time::Duration::from_micros(50);

/// Receives a SEND test's server keeps posted.
const RECVS_POSTED: u64 = 512;

/// How long a SEND test's server waits, once the client is done, for
/// receives it has not counted yet.
const RECV_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A side's registered buffer: the soft node's, or one registered on a
/// device (which may write it at any time: it is read by copies).
#[derive(Clone)]
enum Buffer {
    Flat(FlatMemory),
    Mem(verbs::MemBuf),
}

/// Bytes handled at once when filling or hashing a device's buffer.
const CHUNK: usize = 1 << 20;

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Flat(m) => m.len(),
            Buffer::Mem(m) => m.len(),
        }
    }

    /// Every byte `i` set to `pattern(i)`.
    fn fill_pattern(&self) {
        match self {
            Buffer::Flat(m) => {
                m.with(|b| b.iter_mut().enumerate().for_each(|(i, x)| *x = pattern(i)))
            }
            Buffer::Mem(m) => {
                for at in (0..m.len()).step_by(CHUNK) {
                    let n = CHUNK.min(m.len() - at);
                    let chunk: Vec<u8> = (at..at + n).map(pattern).collect();
                    m.write_at(at, &chunk);
                }
            }
        }
    }

    /// A copy of `n` bytes at `off`.
    fn copy(&self, off: usize, n: usize) -> Vec<u8> {
        match self {
            Buffer::Flat(m) => m.with(|b| b[off..off + n].to_vec()),
            Buffer::Mem(m) => m.to_vec(off, n),
        }
    }

    /// `n` zero bytes at `off`.
    fn zero(&self, off: usize, n: usize) {
        match self {
            Buffer::Flat(m) => m.with(|b| b[off..off + n].fill(0)),
            Buffer::Mem(m) => m.write_at(off, &vec![0; n]),
        }
    }

    /// FNV-1a 64 of the lower half (what a server reports).
    fn fnv_lower_half(&self) -> u64 {
        let half = self.len() / 2;
        match self {
            Buffer::Flat(m) => m.with(|b| fnv(&b[..half])),
            Buffer::Mem(m) => (0..half).step_by(CHUNK).fold(FNV_START, |h, at| {
                fnv_update(h, &m.to_vec(at, CHUNK.min(half - at)))
            }),
        }
    }
}

/// What the engine under a side is.
enum Engine {
    /// Our soft RoCE node (boxed: it is large beside the other) and its
    /// QP.
    Soft { node: Box<Node>, qp: QpHandle },
    /// A QP on a NIC behind the verbs (`--device`).
    Verbs(onverbs::VerbsQp),
}

/// A completion, from either engine.
struct Done {
    wr_id: u64,
    status: WcStatus,
    opcode: rdma_types::WcOpcode,
    is_recv: bool,
}

struct Side {
    engine: Engine,
    idle_polls: u32,
    /// A verbs engine's idle spell: since when it found nothing to do,
    /// and how long it polls before it sleeps in this one.
    idle: Option<(StdInstant, std::time::Duration)>,
    /// How long a verbs engine polls before it sleeps, learned from its
    /// idle spells.
    spin: verbs::spin::Spin,
    /// Turns so far, and the CPU time of the turns that had work,
    /// estimated from every [`CPU_SAMPLE_EVERY`]th turn.
    turns: u64,
    busy_cpu: f64,
    mem: Buffer,
    epoch: StdInstant,
    /// Where the peer's buffer starts in its RDMA addresses (offsets are
    /// added to it).
    peer_base: u64,
    /// The first failure of the engine that no completion reports (a
    /// post the device refused).
    failed: Option<String>,
}

impl Side {
    /// A side with a buffer of `common.buffer` bytes and a QP whose send
    /// queue starts at `psn`, with room for `send` and `recv` work
    /// requests (a device's QP is made that deep; the soft node's grow).
    fn new(common: &Common, psn: u32, send: usize, recv: usize) -> Result<Side, PerfError> {
        let (engine, mem) = match &common.device {
            Some(nic) => {
                let q = onverbs::VerbsQp::new(nic.clone(), common.buffer, send, recv, common.mtu)
                    .map_err(PerfError::Device)?;
                let mem = Buffer::Mem(q.mem.clone());
                (Engine::Verbs(q), mem)
            }
            None => {
                let mut cfg = NodeConfig::new(common.bind);
                cfg.faults = common.faults.clone();
                cfg.capture = common.capture.clone();
                cfg.gso = common.gso;
                cfg.gro = common.gso;
                let mut node = Node::bind(cfg)?;
                let mem = FlatMemory::new(KEY, common.buffer);
                let mut qcfg = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
                qcfg.pmtu = common.mtu;
                qcfg.sq_psn = Psn::new(psn);
                // 4.096 us << 14 = 67 ms: short enough for loopback, long enough that a
                // process descheduled on a busy 2-core CI box does not burn its retries.
                qcfg.timeout = 14;
                let qp = node.create_qp(qcfg, Box::new(mem.clone()));
                let node = Box::new(node);
                (Engine::Soft { node, qp }, Buffer::Flat(mem))
            }
        };
        Ok(Side {
            engine,
            idle_polls: 0,
            idle: None,
            spin: verbs::spin::Spin::new(VERBS_SPIN_MAX),
            turns: 0,
            busy_cpu: 0.0,
            mem,
            epoch: StdInstant::now(),
            peer_base: 0,
            failed: None,
        })
    }

    fn hello(&mut self, psn: u32) -> Hello {
        let len = self.mem.len();
        let (roce, qpn, rkey, mtu, gid, vaddr) = match &mut self.engine {
            Engine::Soft { node, qp } => (
                node.local_addr(),
                qp.0.value(),
                KEY,
                node.qp_mut(*qp).map_or(1024, |q| q.config().pmtu.bytes()),
                None,
                0,
            ),
            Engine::Verbs(q) => {
                let gid = q.gid();
                // A soft peer reaches us at the address of our GID.
                let ip = gid.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |g| {
                    let v6 = std::net::Ipv6Addr::from(g.0);
                    v6.to_ipv4_mapped()
                        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
                });
                (
                    SocketAddr::new(ip, 4791),
                    q.qpn(),
                    q.rkey(),
                    q.mtu().bytes(),
                    gid.map(|g| g.0),
                    q.base(),
                )
            }
        };
        Hello {
            roce,
            qpn,
            psn,
            rkey,
            len,
            mtu,
            op: None,
            sends: None,
            bidir: None,
            gid,
            vaddr,
        }
    }

    /// Connects our QP to the peer's; `psn` is our send queue's first.
    fn connect(&mut self, peer: &Hello, psn: u32) -> Result<(), PerfError> {
        self.peer_base = peer.vaddr;
        match &mut self.engine {
            Engine::Soft { node, qp } => {
                let q = node.qp_mut(*qp).expect("own QP");
                q.update_config(|c| {
                    c.dest_qpn = Qpn::from_bits(peer.qpn);
                    c.rq_psn = Psn::new(peer.psn);
                    if let Ok(m) = Mtu::from_bytes(peer.mtu) {
                        c.pmtu = c.pmtu.min(m);
                    }
                });
                // The responder was built at creation; rebuild so it expects the
                // peer's first PSN.
                let cfg = q.config().clone();
                *q = roce::Qp::new(cfg);
                q.set_rts();
                node.set_remote(*qp, peer.roce);
                Ok(())
            }
            Engine::Verbs(q) => {
                let dgid = peer
                    .gid
                    .map_or_else(|| rdma_types::Gid::from_ip(peer.roce.ip()), rdma_types::Gid);
                let mtu = Mtu::from_bytes(peer.mtu).unwrap_or(Mtu::Mtu1024);
                q.connect(dgid, peer.qpn, peer.psn, psn, mtu)
                    .map_err(PerfError::Device)
            }
        }
    }

    /// Posts one WRITE, READ or SEND of `len` bytes from offset `local`
    /// of our buffer to offset `remote` of the peer's. A post a device
    /// refuses is kept in [`Side::failed`].
    fn post_send(&mut self, wr_id: u64, op: Op, local: u64, len: u32, remote: u64, rkey: u32) {
        let raddr = self.peer_base.wrapping_add(remote);
        match &mut self.engine {
            Engine::Soft { node, qp } => {
                let sop = match op {
                    Op::Write => SendOp::Write {
                        raddr,
                        rkey: Rkey(rkey),
                    },
                    Op::Read => SendOp::Read {
                        raddr,
                        rkey: Rkey(rkey),
                    },
                    Op::Send => SendOp::Send,
                };
                let sge = Sge {
                    addr: local,
                    len,
                    lkey: Lkey(KEY),
                };
                node.qp_mut(*qp)
                    .expect("own QP")
                    .post_send(SendWqe::new(wr_id, sop, vec![sge]));
            }
            Engine::Verbs(q) => {
                let remote = verbs::RemoteAddr {
                    addr: raddr,
                    rkey: Rkey(rkey),
                };
                if let Err(e) = q.post_send(wr_id, op, local, len, remote) {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }

    /// Hands a device what was posted since the last turn (a soft node
    /// takes each post at once).
    fn flush(&mut self) {
        if let Engine::Verbs(q) = &mut self.engine {
            if let Err(e) = q.flush() {
                self.failed.get_or_insert(e);
            }
        }
    }

    /// Posts one receive of `len` bytes at offset `local`.
    fn post_recv(&mut self, wr_id: u64, local: u64, len: u32) {
        match &mut self.engine {
            Engine::Soft { node, qp } => node.qp_mut(*qp).expect("own QP").post_recv(RecvWqe {
                wr_id,
                sges: vec![Sge {
                    addr: local,
                    len,
                    lkey: Lkey(KEY),
                }],
            }),
            Engine::Verbs(q) => {
                if let Err(e) = q.post_recv(wr_id, local, len) {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }

    /// The next completion of our QP.
    fn poll_completion(&mut self) -> Option<Done> {
        match &mut self.engine {
            Engine::Soft { node, qp } => node.poll_completion(*qp).map(|c| Done {
                wr_id: c.wr_id,
                status: c.status,
                opcode: c.opcode,
                is_recv: c.is_recv,
            }),
            Engine::Verbs(q) => q.next().map(|c| Done {
                wr_id: c.wr_id,
                status: c.status,
                opcode: c.opcode,
                is_recv: matches!(
                    c.opcode,
                    rdma_types::WcOpcode::Recv | rdma_types::WcOpcode::RecvRdmaWithImm
                ),
            }),
        }
    }

    /// A failure no completion reported, as an error.
    fn check(&self) -> Result<(), PerfError> {
        match &self.failed {
            Some(e) => Err(PerfError::Device(e.clone())),
            None => Ok(()),
        }
    }

    /// Our QP's counters (a device's are its own: 0 here).
    fn counters(&mut self) -> roce::QpCounters {
        match &mut self.engine {
            Engine::Soft { node, qp } => node.qp_mut(*qp).expect("own QP").counters(),
            Engine::Verbs(_) => roce::QpCounters::default(),
        }
    }

    /// Why the QP refused a request, if it did (the soft node says).
    fn last_error(&mut self) -> Option<String> {
        match &mut self.engine {
            Engine::Soft { node, qp } => node
                .qp_mut(*qp)
                .and_then(|q| q.last_error())
                .map(|e| e.to_string()),
            Engine::Verbs(_) => None,
        }
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, StdInstant::now())
    }

    /// Whether the side has been idle long enough to sleep in its turns.
    fn sleeps(&self) -> bool {
        match self.idle {
            // A verbs engine in an idle spell: by time.
            Some((since, budget)) => since.elapsed() >= budget,
            None => self.idle_polls >= SPIN_POLLS,
        }
    }

    /// One round of work; sleeps briefly in the kernel when idle. Returns
    /// whether the node (or the device's CQ) had work.
    fn turn(&mut self) -> bool {
        self.turns += 1;
        let sample = self.turns.is_multiple_of(CPU_SAMPLE_EVERY);
        let cpu0 = if sample { thread_cpu_seconds() } else { 0.0 };
        let now = self.now();
        let sleep = match &self.engine {
            Engine::Verbs(_) => self.sleeps(),
            Engine::Soft { .. } => self.idle_polls + 1 >= SPIN_POLLS,
        };
        let busy = match &mut self.engine {
            Engine::Soft { node, .. } => node.poll(now),
            Engine::Verbs(q) => match q.poll(sleep) {
                Ok(b) => b,
                Err(e) => {
                    self.failed.get_or_insert(e);
                    false
                }
            },
        };
        if busy {
            self.idle_polls = 0;
            // A spell that ended within the longest spin teaches the
            // spin, polled through or not: the next one polls that long.
            if let Some((since, _)) = self.idle.take() {
                let waited = since.elapsed();
                self.spin.learn(waited, waited <= self.spin.max());
            }
            if sample {
                self.busy_cpu += (thread_cpu_seconds() - cpu0) * CPU_SAMPLE_EVERY as f64;
            }
            return true;
        }
        // Poll a little longer before sleeping: on a busy link the next
        // datagram is microseconds away, and a sleep costs two context
        // switches. Bounded, so an idle tool still sleeps (a device's
        // poll above slept already).
        self.idle_polls += 1;
        if matches!(self.engine, Engine::Verbs(_)) && self.idle.is_none() {
            self.idle = Some((StdInstant::now(), self.spin.next_budget()));
        }
        if self.idle_polls < SPIN_POLLS {
            return false;
        }
        if let Engine::Soft { node, .. } = &mut self.engine {
            let wait = node
                .next_deadline()
                .map_or(std::time::Duration::from_millis(1), |d| {
                    std::time::Duration::from_micros(
                        d.saturating_since(now).total_micros().clamp(1, 1000),
                    )
                });
            let _ = node.wait(wait);
        }
        false
    }
}

/// One turn in this many has its CPU time measured (a system call each
/// end): the CPU time of the turns that had work, scaled up, is what a
/// side spent on the transfer itself, without the polls that found
/// nothing -- a side waiting for its peer polls a lot.
const CPU_SAMPLE_EVERY: u64 = 8;

/// Turns between looks at the TCP control connection (or at the clock,
/// for a deadline): each look is a system call the plain-UDP baseline
/// does not make, so a busy data path -- and one spinning briefly for its
/// peer's next packet -- looks only now and then. A side idle long
/// enough to sleep looks every turn.
const CONTROL_EVERY: u32 = 64;

/// Keeps up to `slots` work requests of one operation in flight until
/// `iters` completed; both the client and (bidirectional) the server use it.
struct Mover {
    op: Op,
    size: usize,
    slots: usize,
    iters: u64,
    /// Local buffer offset of the sources (WRITE/SEND) or destinations (READ).
    local_base: u64,
    /// Remote buffer offset of the targets.
    remote_base: u64,
    rkey: u32,
    verify_read: bool,
    posted: u64,
    done: u64,
    posted_at: Vec<StdInstant>,
    hist: hdrhistogram::Histogram<u64>,
    start: StdInstant,
    seconds: Option<f64>,
    /// No new work requests after this (a timed run).
    stop_posting: Option<StdInstant>,
}

impl Mover {
    #[allow(clippy::too_many_arguments)]
    fn new(
        op: Op,
        size: usize,
        slots: usize,
        iters: u64,
        local_base: u64,
        remote_base: u64,
        rkey: u32,
        verify_read: bool,
    ) -> Mover {
        Mover {
            op,
            size,
            slots,
            iters,
            local_base,
            remote_base,
            rkey,
            verify_read,
            posted: 0,
            done: 0,
            posted_at: vec![StdInstant::now(); slots],
            hist: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            start: StdInstant::now(),
            seconds: (iters == 0).then_some(0.0),
            stop_posting: None,
        }
    }

    /// A timed run: posts until `d` has passed (or `iters` were posted).
    fn for_duration(mut self, d: std::time::Duration) -> Mover {
        self.stop_posting = Some(self.start + d);
        self
    }

    fn posting_over(&self) -> bool {
        self.stop_posting.is_some_and(|t| StdInstant::now() >= t)
    }

    fn finished(&self) -> bool {
        self.done >= self.iters || (self.done == self.posted && self.posting_over())
    }

    /// Posts what the queue depth allows.
    fn post(&mut self, side: &mut Side) {
        let size = self.size as u64;
        if self.posting_over() {
            return;
        }
        while self.posted < self.iters && self.posted - self.done < self.slots as u64 {
            let slot = (self.posted % self.slots as u64) as usize;
            side.post_send(
                self.posted,
                self.op,
                self.local_base + slot as u64 * size,
                self.size as u32,
                self.remote_base + slot as u64 * size,
                self.rkey,
            );
            self.posted_at[slot] = StdInstant::now();
            self.posted += 1;
        }
    }

    /// Accounts one send-queue completion.
    fn complete(&mut self, side: &Side, c: &Done) -> Result<(), PerfError> {
        if c.status != WcStatus::Success {
            return Err(PerfError::Completion(format!(
                "WR {} ({}): {}",
                c.wr_id, c.opcode, c.status
            )));
        }
        let slot = (c.wr_id % self.slots as u64) as usize;
        let _ = self
            .hist
            .record(self.posted_at[slot].elapsed().as_micros().max(1) as u64);
        if self.verify_read && self.op == Op::Read {
            let base = self.local_base as usize + slot * self.size;
            let remote = self.remote_base as usize + slot * self.size;
            let n = self.size;
            let ok = side
                .mem
                .copy(base, n)
                .iter()
                .enumerate()
                .all(|(i, &x)| x == pattern(remote + i));
            if !ok {
                return Err(PerfError::Verify(format!(
                    "READ {} brought back different bytes",
                    c.wr_id
                )));
            }
            side.mem.zero(base, n);
        }
        self.done += 1;
        if self.finished() && self.seconds.is_none() {
            self.seconds = Some(self.start.elapsed().as_secs_f64());
        }
        Ok(())
    }
}

/// What a server did for one client ([`run_server`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The client's RoCE address.
    pub client: SocketAddr,
    /// The operation it measured.
    pub op: Option<Op>,
    /// Its message size in bytes.
    pub size: usize,
    /// RoCE packets the server's QP accepted from it (requests, and the
    /// ACKs of a bidirectional test).
    pub rx_packets: u64,
    /// RoCE packets the server's QP sent it (ACKs, READ responses).
    pub tx_packets: u64,
    /// SENDs received (a SEND test).
    pub received: u64,
    /// An interrupt ended the test ([`Common::stop`]): the client was cut
    /// off (its TCP connection closed) in the middle.
    pub interrupted: bool,
}

impl Served {
    /// One line for people: `client 127.0.0.1:4791 (write, 65536-byte
    /// messages): 1200 RoCE packets received, 75 sent`.
    pub fn summary(&self) -> String {
        let op = self
            .op
            .map_or("?".to_string(), |o| format!("{o:?}").to_lowercase());
        let mut s = format!(
            "client {} ({op}, {}-byte messages): {} RoCE packets received, {} sent",
            self.client, self.size, self.rx_packets, self.tx_packets
        );
        if self.op == Some(Op::Send) {
            s += &format!(", {} SENDs received", self.received);
        }
        s
    }
}

/// Serves one client; returns when it is done, or cut off by an
/// interrupt ([`Served::interrupted`]).
///
/// # Errors
/// Socket trouble or a broken exchange; [`PerfError::Interrupted`] when
/// the interrupt came before a client did.
pub fn run_server(common: &Common, listener: &TcpListener) -> Result<Served, PerfError> {
    listener.set_nonblocking(true)?;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if common.stop.load(Ordering::Relaxed) {
                    return Err(PerfError::Interrupted);
                }
                std::thread::sleep(STOP_POLL);
            }
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let peer: Hello = read_line(&mut reader)?;
    // Receives kept posted (a SEND test), and our own WRITEs in flight
    // (a bidirectional one).
    let reverse_qd = peer.bidir.map_or(1, |b| b.qd.max(1));
    let mut side = Side::new(common, 0x1000, reverse_qd, RECVS_POSTED as usize)?;
    // READ tests read a known pattern; WRITE tests start from zeros so a
    // write that never landed shows in the digest.
    if peer.op == Some(Op::Read) {
        side.mem.fill_pattern();
    }
    send_line(&mut writer, &side.hello(0x1000))?;
    side.connect(&peer, 0x1000)?;
    let mut cpu_seconds = None;
    let mut received = 0u64;
    let mut posted = 0u64;
    let want = peer.sends.unwrap_or(0);
    let slots = (side.mem.len() / peer.len.max(1)).max(1) as u64;
    let post_recv = |side: &mut Side, n: u64| {
        let size = peer.len as u64;
        side.post_recv(n, (n % slots) * size, size as u32);
    };
    if peer.op == Some(Op::Send) {
        while posted < want.min(RECVS_POSTED) {
            post_recv(&mut side, posted);
            posted += 1;
        }
        side.flush();
    }
    // Bidirectional WRITE: write back from our upper region into the
    // client's third region while the client writes to us.
    let mut reverse = peer.bidir.filter(|_| peer.op == Some(Op::Write)).map(|b| {
        let local_base = (side.mem.len() / 2) as u64;
        Mover::new(
            Op::Write,
            peer.len,
            b.qd.max(1),
            b.iters,
            local_base,
            b.remote_base,
            peer.rkey,
            false,
        )
    });
    let mut done_asked = false;
    let mut done_asked_at = None;
    writer.set_nonblocking(false)?;
    reader.get_mut().set_nonblocking(true)?;
    let mut turns = 0u32;
    let served = |side: &mut Side, received, interrupted| {
        let c = side.counters();
        Served {
            client: peer.roce,
            op: peer.op,
            size: peer.len,
            rx_packets: c.rx_packets,
            tx_packets: c.tx_packets,
            received,
            interrupted,
        }
    };
    loop {
        if let Some(m) = reverse.as_mut() {
            m.post(&mut side);
        }
        side.turn();
        while let Some(c) = side.poll_completion() {
            if c.is_recv {
                if c.status == WcStatus::Success {
                    received += 1;
                }
                if posted < want {
                    post_recv(&mut side, posted);
                    posted += 1;
                }
            } else if let Some(m) = reverse.as_mut() {
                m.complete(&side, &c)?;
            }
        }
        side.check()?;
        // The digest goes out once our own writes (if any) are done too,
        // and every SEND the client saw acknowledged was counted here (a
        // device may report a receive after the ACK went out; a missing
        // one is given RECV_GRACE, then reported as missing).
        let counted = received >= want
            || done_asked_at.is_some_and(|t: StdInstant| t.elapsed() >= RECV_GRACE);
        if done_asked && counted && reverse.as_ref().is_none_or(Mover::finished) {
            done_asked = false;
            let digest = side.mem.fnv_lower_half();
            let reverse_seconds = reverse.as_ref().and_then(|m| m.seconds);
            send_line(
                &mut writer,
                &Control::Digest {
                    fnv: digest,
                    received,
                    reverse_seconds,
                    cpu_seconds,
                },
            )?;
        }
        turns = turns.wrapping_add(1);
        if !side.sleeps() && !turns.is_multiple_of(CONTROL_EVERY) {
            continue;
        }
        if common.stop.load(Ordering::Relaxed) {
            // Returning closes the connection: the client sees it at once.
            return Ok(served(&mut side, received, true));
        }
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => {
                if let Some(why) = side.last_error() {
                    tracing::warn!("rperf server: the QP refused a request: {why}");
                }
                return Ok(served(&mut side, received, false));
            }
            Ok(_) => match serde_json::from_str::<Control>(&line) {
                Ok(Control::Done) => {
                    done_asked = true;
                    done_asked_at = Some(StdInstant::now());
                    cpu_seconds = Some(side.busy_cpu);
                }
                Ok(Control::Baseline {
                    port,
                    floor,
                    region,
                }) => {
                    // One baseline phase; the client may ask for another,
                    // and leaves when it has them all.
                    let addr = SocketAddr::new(common.bind.ip(), port);
                    let r = baseline_sink(addr, &mut reader, Sink::new(floor, region))?;
                    send_line(&mut writer, &r)?;
                }
                Ok(Control::TcpBaseline {
                    port,
                    region,
                    chunk,
                }) => {
                    let addr = SocketAddr::new(common.bind.ip(), port);
                    reader.get_mut().set_nonblocking(false)?;
                    let r = tcp_sink(addr, region, chunk, &mut writer)?;
                    reader.get_mut().set_nonblocking(true)?;
                    send_line(&mut writer, &r)?;
                }
                Ok(other) => return Err(PerfError::Protocol(format!("unexpected {other:?}"))),
                Err(e) => return Err(PerfError::Protocol(format!("bad message {line:?}: {e}"))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs the client side and returns the report.
///
/// # Errors
/// Socket trouble, a failed work request, or different bytes under `--verify`.
pub fn run_client(cfg: &ClientConfig) -> Result<Report, PerfError> {
    let slots = cfg.qd.max(1);
    if cfg.bidir && cfg.duration.is_some() {
        return Err(PerfError::Protocol(
            "a bidirectional test counts messages; it cannot run for a duration".into(),
        ));
    }
    let mut common = cfg.common.clone();
    common.buffer = common.buffer.max(cfg.size * slots * 3);
    let mut side = Side::new(&common, 0x2000, slots, 1)?;
    side.mem.fill_pattern();
    let stream = TcpStream::connect(cfg.server)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut hello = side.hello(0x2000);
    hello.len = cfg.size;
    hello.op = Some(cfg.op);
    hello.sends = Some(if cfg.op == Op::Send { cfg.iters } else { 0 });
    hello.bidir = cfg.bidir.then_some(Bidir {
        qd: slots,
        iters: cfg.iters,
        remote_base: (2 * slots * cfg.size) as u64,
    });
    send_line(&mut writer, &hello)?;
    let peer: Hello = read_line(&mut reader)?;
    if cfg.op != Op::Send && peer.len / 2 < cfg.size * slots {
        return Err(PerfError::Protocol(format!(
            "half the server buffer ({} bytes) is smaller than size x qd = {}",
            peer.len / 2,
            cfg.size * slots
        )));
    }
    side.connect(&peer, 0x2000)?;

    // Our buffer: [write/send sources | READ destinations | what the server
    // writes back in a bidirectional test].
    let local_base = if cfg.op == Op::Read {
        (slots * cfg.size) as u64
    } else {
        0
    };
    let mut mover = Mover::new(
        cfg.op, cfg.size, slots, cfg.iters, local_base, 0, peer.rkey, cfg.verify,
    );
    if let Some(d) = cfg.duration {
        mover = mover.for_duration(d);
    }
    let size = cfg.size as u64;
    let deadline =
        StdInstant::now() + std::time::Duration::from_secs(600) + cfg.duration.unwrap_or_default();
    let mut turns = 0u32;
    let busy_start = side.busy_cpu;
    // When the stop flag was seen: posting ends, what is in flight has
    // DRAIN to complete.
    let mut interrupted: Option<StdInstant> = None;
    // The server says nothing until we are done; its closing the
    // connection (an interrupt, a crash) ends the test at once, not after
    // the QP's retries.
    reader.get_mut().set_nonblocking(true)?;
    while !mover.finished() {
        if interrupted.is_none() && common.stop.load(Ordering::Relaxed) {
            let now = StdInstant::now();
            interrupted = Some(now);
            mover.stop_posting = Some(now);
        }
        if interrupted.is_some_and(|t| t.elapsed() >= DRAIN) {
            break;
        }
        mover.post(&mut side);
        side.turn();
        while let Some(c) = side.poll_completion() {
            mover.complete(&side, &c)?;
            if mover.done == 1 {
                tracing::info!(server = %cfg.server, "rperf client: first {:?} completed; running", cfg.op);
            }
        }
        side.check()?;
        turns = turns.wrapping_add(1);
        if !side.sleeps() && !turns.is_multiple_of(CONTROL_EVERY) {
            continue;
        }
        if StdInstant::now() > deadline {
            return Err(PerfError::Completion(format!(
                "timed out with {} of {} done",
                mover.done, cfg.iters
            )));
        }
        match reader.fill_buf() {
            Ok([]) => return Err(PerfError::ServerLeft { done: mover.done }),
            // Kept for the exchange that follows.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    reader.get_mut().set_nonblocking(false)?;
    let client_cpu = side.busy_cpu - busy_start;
    let seconds = mover
        .seconds
        .unwrap_or_else(|| mover.start.elapsed().as_secs_f64());
    // Messages moved: all asked for, or what a timed run completed.
    let iters = mover.done;
    let hist = mover.hist;
    let counters = side.counters();

    // An interrupted run reports what completed without asking the
    // server, which may be what stopped answering.
    let interrupted = interrupted.is_some();
    let (verified, reverse_seconds, server_cpu) = if interrupted {
        (false, None, None)
    } else {
        send_line(&mut writer, &Control::Done)?;
        // Keep our node answering (a bidirectional server may still be
        // writing to us) while waiting for the digest.
        reader.get_mut().set_nonblocking(true)?;
        let (digest, received, reverse_seconds, server_cpu) = loop {
            side.turn();
            while side.poll_completion().is_some() {}
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) => return Err(PerfError::Protocol("peer closed the connection".into())),
                Ok(_) => match serde_json::from_str::<Control>(&line) {
                    Ok(Control::Digest {
                        fnv,
                        received,
                        reverse_seconds,
                        cpu_seconds,
                    }) => break (fnv, received, reverse_seconds, cpu_seconds),
                    Ok(other) => {
                        return Err(PerfError::Protocol(format!(
                            "expected a digest, got {other:?}"
                        )))
                    }
                    Err(e) => {
                        return Err(PerfError::Protocol(format!("bad message {line:?}: {e}")))
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            if StdInstant::now() > deadline {
                return Err(PerfError::Protocol("no digest from the server".into()));
            }
        };
        reader.get_mut().set_nonblocking(false)?;
        let mut verified = false;
        if cfg.verify {
            match cfg.op {
                Op::Write => {
                    // The server's buffer started zeroed; each slot written at
                    // least once now holds our pattern for that slot.
                    let written = (slots as u64).min(iters) as usize * cfg.size;
                    // The server hashes the lower half of its buffer (the
                    // upper half is where a bidirectional test writes from).
                    let mut img = vec![0u8; peer.len / 2];
                    img[..written].copy_from_slice(&side.mem.copy(0, written));
                    let expect = fnv(&img);
                    if expect != digest {
                        return Err(PerfError::Verify(
                            "the server's buffer differs from what was written".into(),
                        ));
                    }
                }
                Op::Send => {
                    if received != iters {
                        return Err(PerfError::Verify(format!(
                            "server received {received} of {iters} SENDs"
                        )));
                    }
                }
                Op::Read => {}
            }
            verified = true;
        }
        (verified, reverse_seconds, server_cpu)
    };

    let mut report = Report {
        op: cfg.op,
        size: cfg.size,
        qd: slots,
        iters,
        seconds,
        gbit_per_s: (iters * size) as f64 * 8.0 / seconds / 1e9,
        msg_per_s: iters as f64 / seconds,
        lat_us_p50: hist.value_at_quantile(0.5) as f64,
        lat_us_p99: hist.value_at_quantile(0.99) as f64,
        lat_us_p999: hist.value_at_quantile(0.999) as f64,
        retransmits: counters.retransmits,
        timeouts: counters.timeouts,
        verified,
        reverse_gbit_per_s: reverse_seconds
            .filter(|&t| t > 0.0)
            .map(|t| (iters * size) as f64 * 8.0 / t / 1e9),
        baseline_gbit_per_s: None,
        baseline_pkt_per_s: None,
        ratio_to_baseline: None,
        baseline_over: None,
        client_cpu_ns_per_byte: per_byte_ns(client_cpu, iters * size),
        server_cpu_ns_per_byte: server_cpu.map(|c| per_byte_ns(c, iters * size)),
        baseline_client_cpu_ns_per_byte: None,
        baseline_server_cpu_ns_per_byte: None,
        floor_gbit_per_s: None,
        ratio_to_floor: None,
        floor_client_cpu_ns_per_byte: None,
        floor_server_cpu_ns_per_byte: None,
        shaped_floor_gbit_per_s: None,
        ratio_to_shaped_floor: None,
        interrupted,
        device: common
            .device
            .as_ref()
            .map(|n| format!("{} port {}", n.name(), n.port().0)),
    };
    let iwarp = common.device.as_ref().is_some_and(|n| n.is_iwarp());
    if cfg.baseline && !interrupted && iwarp {
        // iWARP runs over TCP: its baseline is plain TCP between the
        // same two addresses, no floor (TCP has no datagrams to check).
        let port = peer.roce.port().wrapping_add(1000);
        let dst = SocketAddr::new(peer.roce.ip(), port);
        let plain = tcp_phase(
            &common,
            cfg.size * slots,
            cfg.size,
            dst,
            &mut reader,
            &mut writer,
        )?;
        report.set_baseline("TCP", &plain);
    } else if cfg.baseline && !interrupted {
        let port = peer.roce.port().wrapping_add(1000);
        let dst = SocketAddr::new(peer.roce.ip(), port);
        // Plain UDP, the floor, and for a WRITE of several packets the
        // floor in its packet shape: one after the other, the same bytes.
        let mut phase = |floor, shape| {
            udp_phase(
                &common,
                cfg.size * slots,
                dst,
                floor,
                shape,
                &mut reader,
                &mut writer,
            )
        };
        let plain = phase(false, None)?;
        report.set_baseline("UDP", &plain);
        let floor = phase(true, None)?;
        report.floor_gbit_per_s = Some(floor.gbit_per_s);
        report.ratio_to_floor = ratio_of(report.gbit_per_s, floor.gbit_per_s);
        report.floor_client_cpu_ns_per_byte = Some(floor.client_cpu_ns_per_byte);
        report.floor_server_cpu_ns_per_byte = floor.server_cpu_ns_per_byte;
        if cfg.op == Op::Write && cfg.size > common.mtu.bytes() {
            let shaped = phase(true, Some(cfg.size))?;
            report.shaped_floor_gbit_per_s = Some(shaped.gbit_per_s);
            report.ratio_to_shaped_floor = ratio_of(report.gbit_per_s, shaped.gbit_per_s);
        }
    }
    Ok(report)
}

impl Report {
    /// Takes the baseline measured `over` plain TCP or UDP, and our ratio
    /// to it.
    fn set_baseline(&mut self, over: &'static str, plain: &baseline::UdpPhase) {
        self.baseline_over = Some(over);
        self.baseline_gbit_per_s = Some(plain.gbit_per_s);
        self.baseline_pkt_per_s = Some(plain.pkt_per_s);
        self.ratio_to_baseline = ratio_of(self.gbit_per_s, plain.gbit_per_s);
        self.baseline_client_cpu_ns_per_byte = Some(plain.client_cpu_ns_per_byte);
        self.baseline_server_cpu_ns_per_byte = plain.server_cpu_ns_per_byte;
    }

    /// A perftest-like table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        s += " op     #bytes   qd  #iterations  BW[Gb/s]  MsgRate[Mpps]  lat p50[us]  p99[us]  p99.9[us]  retrans  timeouts  verified\n";
        s += &format!(
            " {:<6} {:<8} {:<3} {:<12} {:<9.3} {:<14.4} {:<12.1} {:<8.1} {:<10.1} {:<8} {:<9} {}\n",
            format!("{:?}", self.op).to_lowercase(),
            self.size,
            self.qd,
            self.iters,
            self.gbit_per_s,
            self.msg_per_s / 1e6,
            self.lat_us_p50,
            self.lat_us_p99,
            self.lat_us_p999,
            self.retransmits,
            self.timeouts,
            if self.verified { "yes" } else { "no" }
        );
        if let Some(d) = &self.device {
            // The NIC daemon's soft NIC is a device of another process too.
            let kind = if d.contains("nicd at") {
                "the NIC daemon's"
            } else if d.starts_with(device::IWARP_DEVICE) {
                "our soft iWARP NIC"
            } else {
                "rdma-core device"
            };
            s += &format!(
                " on {kind} {d} (retrans and timeouts are the device's own: not counted here)\n"
            );
        }
        if self.interrupted {
            s += &format!(
                " interrupted after {} messages: partial numbers; server CPU, verify and baseline skipped\n",
                self.iters
            );
        }
        if let Some(g) = self.reverse_gbit_per_s {
            s += &format!(" reverse direction (server to client, at the same time): {g:.3} Gb/s; both: {:.3} Gb/s\n", g + self.gbit_per_s);
        }
        if let (Some(b), Some(p), Some(r)) = (
            self.baseline_gbit_per_s,
            self.baseline_pkt_per_s,
            self.ratio_to_baseline,
        ) {
            s += &match self.baseline_over {
                Some("TCP") => format!(
                    " baseline plain TCP: {b:.3} Gb/s, {p:.0} writes/s of {} B; ours/baseline = {r:.2}\n",
                    self.size
                ),
                _ => format!(
                    " baseline plain UDP: {b:.3} Gb/s, {p:.0} datagrams/s; ours/baseline = {r:.2}\n"
                ),
            };
        }
        if let (Some(f), Some(r), Some(b)) = (
            self.floor_gbit_per_s,
            self.ratio_to_floor,
            self.baseline_gbit_per_s,
        ) {
            s += &format!(
                " floor (plain UDP + CRC-32 at both ends + the receiver's copy into place): {f:.3} Gb/s; ours/floor = {r:.2}; floor/baseline = {}\n",
                ratio(f, b)
            );
        }
        if let (Some(f), Some(r)) = (self.shaped_floor_gbit_per_s, self.ratio_to_shaped_floor) {
            s += &format!(
                " floor in a WRITE's packet shape (the first datagram of each message 16 bytes longer, as its RETH makes it: two segmented sends a message): {f:.3} Gb/s; ours/shaped floor = {r:.2}\n"
            );
        }
        let ns = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        s += &format!(
            " CPU ns/byte: client {} server {}",
            ns(Some(self.client_cpu_ns_per_byte)),
            ns(self.server_cpu_ns_per_byte)
        );
        if let (Some(bc), Some(bs)) = (
            self.baseline_client_cpu_ns_per_byte,
            self.baseline_server_cpu_ns_per_byte,
        ) {
            s += &format!(
                "; baseline client {} server {}; baseline/ours client {} server {}",
                ns(Some(bc)),
                ns(Some(bs)),
                ratio(bc, self.client_cpu_ns_per_byte),
                self.server_cpu_ns_per_byte
                    .map_or("-".to_string(), |o| ratio(bs, o)),
            );
        }
        if let (Some(fc), Some(fs)) = (
            self.floor_client_cpu_ns_per_byte,
            self.floor_server_cpu_ns_per_byte,
        ) {
            s += &format!("; floor client {} server {}", ns(Some(fc)), ns(Some(fs)));
        }
        s += "\n";
        s
    }
}

/// `ours` over `base`, when `base` moved anything.
fn ratio_of(ours: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| ours / base)
}

/// Nanoseconds of CPU per byte (0 for no bytes).
fn per_byte_ns(cpu_seconds: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        cpu_seconds * 1e9 / bytes as f64
    }
}

fn ratio(num: f64, den: f64) -> String {
    if den > 0.0 {
        format!("{:.2}", num / den)
    } else {
        "-".to_string()
    }
}

/// Parses a `--loss`-style fault spec into a config (re-exported for the CLI).
pub fn parse_faults(spec: &str) -> Result<FaultConfig, rdma_sim::FaultSpecError> {
    FaultConfig::parse(spec)
}

/// A duration helper for the CLI.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
