//! An RC ping-pong that speaks `ibv_rc_pingpong`'s out-of-band exchange, so
//! rdma-core's own tool can be the peer (client or server).
//!
//! The exchange (rdma-core `libibverbs/examples/rc_pingpong.c`, TCP port
//! 18515 by default): the client sends `"LLLL:QQQQQQ:PPPPPP:GGGG...G"` --
//! LID, QPN and PSN in hex, and the GID as 32 hex digits in wire order --
//! as 52 bytes including the terminating NUL; the server answers the same
//! way; the client then sends `"done"` with its NUL (5 bytes). Then both
//! sides ping-pong SENDs of `size` bytes, `iters` times, the client first.
//! On RoCE the LID is 0 and the GID is the IPv4-mapped address of the port,
//! which `-g 1` selects on Linux rxe; our node's address is that GID's IP
//! with UDP port 4791.
//!
//! With `--device` (an rdma-core device's port) or `--nicd` (the NIC
//! daemon's soft RoCE NIC at `--bind`), the QP is made through the verbs
//! (RC only); the exchange and the turn rule ([`Turns`]) are the same.
//!
//! An interrupt ([`PingPongConfig::stop`]) ends the ping-pong where it is
//! (and a server's wait for its client): the two lines count the
//! exchanges done, marked as interrupted. As with rc_pingpong, leaving
//! is closing the QP: the peer learns of it from its retries, or, waiting
//! for a message, from its stall timeout (30 s).

use crate::device::{Nic, NicChoice, NicError};
use rdma_types::{AccessFlags, Gid, Instant, Lkey, Mtu, Psn, QpState, Qpn, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use softroce::{FlatMemory, Node, NodeConfig};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

/// Bytes of the exchange message, NUL included.
pub const MSG_LEN: usize = 52;

/// One side's address as the exchange carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// Port GID.
    pub gid: Gid,
}

impl Dest {
    /// The 52-byte message, NUL-terminated.
    pub fn to_msg(self) -> [u8; MSG_LEN] {
        let hex: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{hex}",
            self.lid,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF
        );
        let mut out = [0u8; MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a peer's message.
    ///
    /// # Errors
    /// Says which field is wrong.
    pub fn from_msg(msg: &[u8]) -> Result<Dest, DestError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| DestError::NotText)?;
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() != 4 {
            return Err(DestError::NotFourFields(text.to_string()));
        }
        let bad = |field: &'static str, value: &str| DestError::BadField {
            field,
            value: value.to_string(),
            text: text.to_string(),
        };
        let hex = |s: &str, what| u32::from_str_radix(s, 16).map_err(|_| bad(what, s));
        Ok(Dest {
            lid: hex(parts[0], "LID")? as u16,
            qpn: hex(parts[1], "QPN")? & 0xFF_FFFF,
            psn: hex(parts[2], "PSN")? & 0xFF_FFFF,
            gid: Gid::parse_hex(parts[3]).ok_or_else(|| bad("GID", parts[3]))?,
        })
    }
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct PingPongConfig {
    /// Local RoCE address (ip:4791).
    pub bind: SocketAddr,
    /// Peer TCP address to connect to (client) or local one to listen on.
    pub tcp: SocketAddr,
    /// Whether this side connects (client) or listens (server).
    pub client: bool,
    /// Message size.
    pub size: usize,
    /// Exchanges.
    pub iters: u64,
    /// Path MTU.
    pub mtu: Mtu,
    /// GID index: 1 (or any >= 1) puts our IPv4-mapped GID in the message;
    /// `None` sends a zero GID like rc_pingpong without `-g`.
    pub gid_index: Option<u32>,
    /// Receives kept posted.
    pub rx_depth: u64,
    /// UD instead of RC, like `ibv_ud_pingpong` (Q_Key 0x11111111; each
    /// receive buffer has 40 bytes of GRH in front of the message).
    pub ud: bool,
    /// UDP GSO and GRO on our node's socket (`NodeConfig::gso`/`gro`;
    /// `rpingpong` maps `SOFTROCE_GSO` onto it: [`softroce::gso_from_env`]).
    pub gso: bool,
    /// A NIC through the verbs instead of our own soft RoCE node: an
    /// rdma-core device's port (`bind` then unused) or the NIC daemon's
    /// NIC at `bind`; it announces the port's GID 0 (the one rdma-core's
    /// tools pick) whatever `gid_index` says.
    pub nic: Option<NicChoice>,
    /// Set on an interrupt: the ping-pong ends where it is and reports
    /// the exchanges done ([`PingPongResult::interrupted`]).
    pub stop: Arc<AtomicBool>,
}

/// The Q_Key `ibv_ud_pingpong` uses.
pub const UD_PINGPONG_QKEY: u32 = 0x1111_1111;

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PingPongResult {
    /// Bytes moved both ways.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
    /// The peer's address as exchanged.
    pub remote: Dest,
    /// An interrupt ended the ping-pong before all its exchanges.
    pub interrupted: bool,
}

/// Why a peer's exchange message cannot be read; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestError {
    #[error("exchange message is not text")]
    NotText,
    #[error("exchange message {0:?} is not LID:QPN:PSN:GID")]
    NotFourFields(String),
    #[error("bad {field} {value:?} in {text:?}")]
    BadField {
        field: &'static str,
        value: String,
        text: String,
    },
}

/// Why a ping-pong run failed.
#[derive(Debug, thiserror::Error)]
pub enum PingPongError {
    #[error("size {0} is too large")]
    TooLarge(usize),
    #[error("UD messages must fit the MTU ({mtu}), not {size}")]
    UdTooLarge { mtu: usize, size: usize },
    #[error("cannot bind {bind}: {source}")]
    Bind {
        bind: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The TCP exchange of QP addresses.
    #[error("out-of-band exchange on {tcp}: {source}")]
    Exchange {
        tcp: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error(
        "the peer sent a zero GID: on RoCE run it with -g <RoCEv2 GID index> (1 on Linux rxe)"
    )]
    ZeroGid,
    #[error("own QP vanished")]
    QpVanished,
    #[error("Failed status {status} ({code}) for wr_id {wr_id}")]
    Completion {
        status: WcStatus,
        code: u32,
        wr_id: u64,
    },
    #[error("no progress for 30 s ({sent} sent, {received} received of {iters})")]
    Stalled {
        sent: u64,
        received: u64,
        iters: u64,
    },
    #[error("--ud is served on rpingpong's own soft RoCE NIC only, not with --device or --nicd")]
    UdOnDevice,
    /// The stop flag ended the wait for a client.
    #[error("interrupted while waiting for a client on {0}")]
    Interrupted(SocketAddr),
    /// Opening the rdma-core device.
    #[error(transparent)]
    Nic(#[from] NicError),
    #[error("{what}: {source}")]
    Verbs {
        what: &'static str,
        #[source]
        source: verbs::VerbsError,
    },
}

/// rc_pingpong's rule: the client sends first; each side sends its next
/// message once its previous send and the peer's message both completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turns {
    iters: u64,
    sent: u64,
    received: u64,
    send_pending: bool,
    recv_pending: bool,
}

impl Turns {
    fn new(iters: u64) -> Turns {
        Turns {
            iters,
            sent: 0,
            received: 0,
            send_pending: false,
            recv_pending: true,
        }
    }

    /// Whether this side sends first (the client); then it is pending.
    fn starts(&mut self, client: bool) -> bool {
        self.send_pending = client;
        client
    }

    /// A completion (a receive or a send); whether to post the next send.
    fn completed(&mut self, recv: bool) -> bool {
        if recv {
            self.received += 1;
            self.recv_pending = false;
        } else {
            self.sent += 1;
            self.send_pending = false;
        }
        let next = self.sent < self.iters && !self.send_pending && !self.recv_pending;
        if next {
            self.send_pending = true;
            self.recv_pending = true;
        }
        next
    }

    fn done(&self) -> bool {
        self.sent >= self.iters && self.received >= self.iters
    }

    fn stalled(&self) -> PingPongError {
        PingPongError::Stalled {
            sent: self.sent,
            received: self.received,
            iters: self.iters,
        }
    }
}

/// How long without a completion is a stall.
const STALL: Duration = Duration::from_secs(30);

fn exchange(cfg: &PingPongConfig, mine: Dest) -> Result<Dest, PingPongError> {
    let io = |source| PingPongError::Exchange {
        tcp: cfg.tcp,
        source,
    };
    if cfg.client {
        let mut s = TcpStream::connect_timeout(&cfg.tcp, Duration::from_secs(30)).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        s.write_all(&mine.to_msg()).map_err(io)?;
        let mut msg = [0u8; MSG_LEN];
        s.read_exact(&mut msg).map_err(io)?;
        s.write_all(b"done\0").map_err(io)?;
        Ok(Dest::from_msg(&msg)?)
    } else {
        let l = TcpListener::bind(cfg.tcp).map_err(io)?;
        println!("rpingpong: waiting on {}", cfg.tcp);
        let _ = std::io::stdout().flush();
        l.set_nonblocking(true).map_err(io)?;
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if cfg.stop.load(Ordering::Relaxed) {
                        return Err(PingPongError::Interrupted(cfg.tcp));
                    }
                    std::thread::sleep(crate::STOP_POLL);
                }
                Err(e) => return Err(io(e)),
            }
        };
        s.set_nonblocking(false).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        let mut msg = [0u8; MSG_LEN];
        s.read_exact(&mut msg).map_err(io)?;
        let peer = Dest::from_msg(&msg)?;
        s.write_all(&mine.to_msg()).map_err(io)?;
        let mut done = [0u8; 5];
        s.read_exact(&mut done).map_err(io)?;
        Ok(peer)
    }
}

/// Runs one side of the ping-pong.
///
/// # Errors
/// Exchange trouble, a failed work request, or a peer that stops answering.
pub fn run(cfg: &PingPongConfig) -> Result<PingPongResult, PingPongError> {
    if cfg.size > cfg.mtu.bytes() * 1024 {
        return Err(PingPongError::TooLarge(cfg.size));
    }
    if let Some(choice) = &cfg.nic {
        return run_verbs(cfg, choice);
    }
    let mut ncfg = NodeConfig::new(cfg.bind);
    ncfg.gso = cfg.gso;
    ncfg.gro = cfg.gso;
    let mut node = Node::bind(ncfg).map_err(|source| PingPongError::Bind {
        bind: cfg.bind,
        source,
    })?;
    if cfg.ud && cfg.size > cfg.mtu.bytes() {
        return Err(PingPongError::UdTooLarge {
            mtu: cfg.mtu.bytes(),
            size: cfg.size,
        });
    }
    // [send buffer | receive buffer with room for the GRH]
    let mem = FlatMemory::new(1, cfg.size.max(1) * 2 + 40);
    let mut qcfg = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
    if cfg.ud {
        qcfg.qp_type = rdma_types::QpType::Ud;
        qcfg.qkey = rdma_types::Qkey(UD_PINGPONG_QKEY);
    }
    qcfg.pmtu = cfg.mtu;
    qcfg.timeout = 14;
    qcfg.retry_cnt = 7;
    qcfg.rnr_retry = 7;
    qcfg.min_rnr_timer = 12;
    let psn = first_psn();
    qcfg.sq_psn = Psn::new(psn);
    let qp = node.create_qp(qcfg, Box::new(mem.clone()));
    let gid = match cfg.gid_index {
        Some(_) => Gid::from_ip(cfg.bind.ip()),
        None => Gid::ZERO,
    };
    let mine = Dest {
        lid: 0,
        qpn: qp.0.value(),
        psn,
        gid,
    };
    print_dest("local ", &mine);
    let remote = exchange(cfg, mine)?;
    print_dest("remote", &remote);
    if remote.gid == Gid::ZERO {
        return Err(PingPongError::ZeroGid);
    }
    let peer_ip: IpAddr = remote.gid.to_ip();
    {
        let q = node.qp_mut(qp).ok_or(PingPongError::QpVanished)?;
        q.update_config(|c| {
            c.dest_qpn = Qpn::from_bits(remote.qpn);
            c.rq_psn = Psn::new(remote.psn);
        });
        let c = q.config().clone();
        *q = roce::Qp::new(c);
        q.set_rts();
    }
    let peer_addr = SocketAddr::new(peer_ip, cfg.bind.port());
    node.set_remote(qp, peer_addr);
    let ah = node.create_ah(peer_addr);
    let ud = cfg.ud.then_some(roce::UdDest {
        qpn: Qpn::from_bits(remote.qpn),
        qkey: rdma_types::Qkey(UD_PINGPONG_QKEY),
        ah: ah.0,
    });

    let size = cfg.size as u32;
    let grh = if cfg.ud { 40 } else { 0 };
    let recv = |n: u64| RecvWqe {
        wr_id: 1 << 32 | n,
        sges: vec![Sge {
            addr: u64::from(size),
            len: size + grh,
            lkey: Lkey(1),
        }],
    };
    let mut routs = 0;
    while routs < cfg.rx_depth {
        node.qp_mut(qp)
            .ok_or(PingPongError::QpVanished)?
            .post_recv(recv(routs));
        routs += 1;
    }
    let send = |n: u64| {
        let mut w = SendWqe::new(
            n,
            SendOp::Send,
            vec![Sge {
                addr: 0,
                len: size,
                lkey: Lkey(1),
            }],
        );
        w.ud = ud;
        w
    };
    let epoch = StdInstant::now();
    let mut turns = Turns::new(cfg.iters);
    if turns.starts(cfg.client) {
        node.qp_mut(qp)
            .ok_or(PingPongError::QpVanished)?
            .post_send(send(0));
    }
    let start = StdInstant::now();
    let mut last_progress = StdInstant::now();
    while !turns.done() && !cfg.stop.load(Ordering::Relaxed) {
        let now = Instant::from_std(epoch, StdInstant::now());
        if !node.poll(now) {
            let _ = node.wait(Duration::from_micros(500));
        }
        while let Some(c) = node.poll_completion(qp) {
            if c.status != WcStatus::Success {
                return Err(PingPongError::Completion {
                    status: c.status,
                    code: c.status as u32,
                    wr_id: c.wr_id,
                });
            }
            last_progress = StdInstant::now();
            if c.is_recv {
                node.qp_mut(qp)
                    .ok_or(PingPongError::QpVanished)?
                    .post_recv(recv(routs));
                routs += 1;
            }
            if c.is_recv && turns.received == 0 {
                tracing::info!("rpingpong: first message received; running");
            }
            if turns.completed(c.is_recv) {
                node.qp_mut(qp)
                    .ok_or(PingPongError::QpVanished)?
                    .post_send(send(turns.sent));
            }
        }
        if last_progress.elapsed() > STALL {
            return Err(turns.stalled());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // Let the last ACKs go out before the socket closes.
    let linger = StdInstant::now();
    while linger.elapsed() < Duration::from_millis(50) {
        let now = Instant::from_std(epoch, StdInstant::now());
        if !node.poll(now) {
            let _ = node.wait(Duration::from_millis(5));
        }
    }
    Ok(finish(cfg, &turns, seconds, remote))
}

/// The result, and rc_pingpong's two lines for the exchanges done
/// (all of them, unless an interrupt came first).
fn finish(cfg: &PingPongConfig, turns: &Turns, seconds: f64, remote: Dest) -> PingPongResult {
    let iters = turns.sent.min(turns.received);
    let bytes = cfg.size as u64 * iters * 2;
    println!(
        "{bytes} bytes in {seconds:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / seconds / 1e6
    );
    println!(
        "{iters} iters in {seconds:.2} seconds = {:.2} usec/iter",
        seconds * 1e6 / iters.max(1) as f64
    );
    let interrupted = !turns.done();
    if interrupted {
        println!(
            "interrupted after {iters} of {} iters: partial numbers",
            cfg.iters
        );
    }
    PingPongResult {
        bytes,
        seconds,
        remote,
        interrupted,
    }
}

fn print_dest(side: &str, d: &Dest) {
    println!(
        "  {side} address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid, d.qpn, d.psn, d.gid
    );
}

/// Our first PSN.
fn first_psn() -> u32 {
    (std::process::id().wrapping_mul(2_654_435_761) ^ 0x5a5a5a) & 0xFF_FFFF
}

/// [`run`] on a NIC through the verbs (an rdma-core device's port, the
/// NIC daemon's): one RC QP.
fn run_verbs(cfg: &PingPongConfig, choice: &NicChoice) -> Result<PingPongResult, PingPongError> {
    if cfg.ud {
        return Err(PingPongError::UdOnDevice);
    }
    let nic = Nic::open(choice)?;
    // The daemon's NIC said its line as it opened.
    if !matches!(choice, NicChoice::Nicd { .. }) {
        eprintln!("rpingpong: NIC {}", nic.name());
    }
    let p = nic.provider().clone();
    let depth = u32::try_from(cfg.rx_depth)
        .unwrap_or(u32::MAX)
        .clamp(1, 4096);
    // [send buffer | receive buffer]
    let rc = nic
        .rc_qp(
            depth + 2,
            2,
            depth,
            cfg.size.max(1) * 2,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(|(what, source)| PingPongError::Verbs { what, source })?;
    let result = pingpong_verbs(cfg, &nic, rc.qp, rc.cq, &rc.mem, rc.mr.lkey);
    rc.release(p.as_ref());
    result
}

fn pingpong_verbs(
    cfg: &PingPongConfig,
    nic: &Nic,
    qp: verbs::QpHandle,
    cq: verbs::CqHandle,
    mem: &verbs::MemBuf,
    lkey: Lkey,
) -> Result<PingPongResult, PingPongError> {
    let p = nic.provider();
    let v = |what: &'static str| move |source| PingPongError::Verbs { what, source };
    let modify = |what, attr: verbs::QpAttr| p.modify_qp(qp, &attr).map_err(v(what));
    nic.init_qp(qp, AccessFlags::LOCAL_WRITE)
        .map_err(v("QP to INIT"))?;
    let psn = first_psn();
    let mine = Dest {
        lid: nic.port_attr().lid.0,
        qpn: p.qp_num(qp).map_err(v("QP number"))?.value(),
        psn,
        gid: nic.port_attr().gids.first().copied().unwrap_or(Gid::ZERO),
    };
    print_dest("local ", &mine);
    let remote = exchange(cfg, mine)?;
    print_dest("remote", &remote);
    if remote.gid == Gid::ZERO {
        return Err(PingPongError::ZeroGid);
    }
    modify(
        "QP to RTR",
        verbs::QpAttr {
            state: Some(QpState::Rtr),
            av: Some(nic.av(remote.gid)),
            path_mtu: Some(nic.path_mtu(cfg.mtu)),
            dest_qpn: Some(Qpn::from_bits(remote.qpn)),
            rq_psn: Some(Psn::new(remote.psn)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..Default::default()
        },
    )?;
    modify(
        "QP to RTS",
        verbs::QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(psn)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..Default::default()
        },
    )?;
    let size = cfg.size as u32;
    let sge = |off: u64| verbs::Sge {
        addr: mem.addr() + off,
        length: size,
        lkey,
    };
    const RECV: u64 = 1 << 32;
    let post_recv = || {
        p.post_recv(
            qp,
            &[verbs::RecvWr {
                wr_id: RECV,
                sges: verbs::sges![sge(u64::from(size))],
            }],
        )
        .map_err(v("post a receive"))
    };
    let post_send = |n: u64| {
        p.post_send(
            qp,
            &[verbs::SendWr::new(n, verbs::SendOpcode::Send, vec![sge(0)])],
        )
        .map_err(v("post a send"))
    };
    for _ in 0..cfg.rx_depth.clamp(1, 4096) {
        post_recv()?;
    }
    let mut turns = Turns::new(cfg.iters);
    let start = StdInstant::now();
    if turns.starts(cfg.client) {
        post_send(0)?;
    }
    let mut wc =
        [verbs::WorkCompletion::new(0, WcStatus::Success, rdma_types::WcOpcode::Send, 0); 16];
    let mut last_progress = StdInstant::now();
    while !turns.done() && !cfg.stop.load(Ordering::Relaxed) {
        let n = p.poll_cq(cq, &mut wc).map_err(v("poll the CQ"))?;
        for c in &wc[..n] {
            if c.status != WcStatus::Success {
                return Err(PingPongError::Completion {
                    status: c.status,
                    code: c.status as u32,
                    wr_id: c.wr_id,
                });
            }
            let recv = c.wr_id == RECV;
            if recv {
                post_recv()?;
            }
            if recv && turns.received == 0 {
                tracing::info!("rpingpong: first message received; running");
            }
            if turns.completed(recv) {
                post_send(turns.sent)?;
            }
        }
        if n > 0 {
            last_progress = StdInstant::now();
            continue;
        }
        if last_progress.elapsed() > STALL {
            return Err(turns.stalled());
        }
        // This thread drives a soft NIC in this process while it waits;
        // else `wait_cq` looks at the CQ itself: no arm (see `onverbs`).
        let ms = Duration::from_millis(20);
        if !p
            .drive_cq(cq, Duration::from_micros(50), ms)
            .unwrap_or(false)
        {
            let _ = p.wait_cq(cq, ms);
        }
    }
    Ok(finish(cfg, &turns, start.elapsed().as_secs_f64(), remote))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_format_matches_rc_pingpong() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("10.77.0.11".parse().unwrap()),
        };
        let m = d.to_msg();
        assert_eq!(m.len(), 52);
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a4d000b"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::from_msg(&m), Ok(d));
    }

    #[test]
    fn the_client_sends_first_and_each_side_waits_for_both_completions() {
        let mut c = Turns::new(2);
        assert!(c.starts(true));
        // Our send completes first: nothing to do until the peer's message.
        assert!(!c.completed(false));
        assert!(c.completed(true));
        // The second round: its receive first, then its send.
        assert!(!c.completed(true));
        assert!(!c.done());
        // Two sent: no third send.
        assert!(!c.completed(false));
        assert!(c.done());
        let mut s = Turns::new(1);
        assert!(!s.starts(false));
        // The server answers each message it received.
        assert!(s.completed(true));
        assert!(!s.done());
        assert!(!s.completed(false));
        assert!(s.done());
        assert!(s.stalled().to_string().contains("1 sent, 1 received of 1"));
    }

    #[test]
    fn bad_messages_name_the_field() {
        let refused = |m: &[u8]| Dest::from_msg(m).unwrap_err().to_string();
        assert!(refused(b"zz").contains("LID:QPN:PSN:GID"));
        assert!(refused(b"0000:xyz:000000:00000000000000000000ffff0a4d000b").contains("bad QPN"));
        assert!(refused(b"0000:000001:000000:0000").contains("bad GID"));
        assert!(refused(&[0xff; 52]).contains("not text"));
    }
}
