//! `rrping`: librdmacm's `rping` over our stack, so Linux's own tool can be
//! the peer in either role. The facts of the protocol (from rping.c):
//!
//! - RDMA CM on TCP port space port 7174 by default; one RC QP.
//! - Each side SENDs 16-byte `rping_rdma_info` messages, `{buf: be64,
//!   rkey: be32, size: be32}`, naming one of its registered buffers.
//! - Per ping: the client fills its source buffer with
//!   `"rdma-ping-<n>: "` followed by a rotating run of the letters
//!   `A`..`z` (the run starts one letter later each ping) and a final NUL,
//!   and advertises it; the server RDMA READs it, SENDs to say "go on",
//!   receives the client's sink buffer, RDMA WRITEs what it read there
//!   (`strlen + 1` bytes), and SENDs again; the client then compares sink
//!   with source (`-V`).
//! - The client disconnects after `-C` pings; the server ends with it.
//!
//! An interrupt ([`RpingConfig::stop`]) ends the ping in progress on
//! either side: the report counts the pings done before it
//! ([`RpingReport::interrupted`]), and the side disconnects (DREQ,
//! waiting at most [`crate::DRAIN`] for the DREP). A server still
//! waiting for a client reports no pings and no connection
//! ([`RpingReport::connected`]).

use crate::device::{Nic, NicChoice, NicError};
use rdma_types::{AccessFlags, Gid, Mtu, Psn, Qpn, WcStatus};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{MemBuf, Provider, RecvWr, RemoteAddr, SendOpcode, SendWr, Sge, WorkCompletion};

/// rping's default port.
pub const RPING_PORT: u16 = 7174;
/// Smallest buffer rping accepts (`RPING_MIN_BUFSIZE`).
pub const MIN_SIZE: usize = 16;

/// How to run.
#[derive(Debug, Clone)]
pub struct RpingConfig {
    /// Serve (`-s`) instead of connecting (`-c`).
    pub server: bool,
    /// Client: the address to connect from; `None`: the NIC's first
    /// (IPv4 first). A server listens on all of the NIC's.
    pub local: Option<IpAddr>,
    /// The server's address (client only).
    pub peer: Option<IpAddr>,
    /// RDMA CM port.
    pub port: u16,
    /// Pings (`-C`); the server stops when the client leaves.
    pub count: u64,
    /// Buffer size (`-S`).
    pub size: usize,
    /// Print each ping's data (`-v`).
    pub verbose: bool,
    /// Compare what came back (`-V`).
    pub validate: bool,
    /// Give up when nothing happens for this long.
    pub idle_timeout: Duration,
    /// The NIC: our soft RoCE NIC (whose MTU is the path MTU's bound),
    /// or an rdma-core device's port, where the kernel's RDMA CM
    /// connects.
    pub nic: NicChoice,
    /// Set on an interrupt: the ping in progress is given up, the
    /// connection closed, and the pings done so far reported.
    pub stop: Arc<AtomicBool>,
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpingReport {
    /// Pings completed.
    pub pings: u64,
    /// Pings whose data was checked and matched.
    pub validated: u64,
    /// An interrupt ended the run ([`RpingConfig::stop`]).
    pub interrupted: bool,
    /// The connection was made (a server interrupted while it waited
    /// for a client had none).
    pub connected: bool,
}

/// The source buffer of ping `n` (rping's pattern), `size` bytes.
pub fn ping_pattern(n: u64, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{n}: ").into_bytes();
    b.truncate(size);
    let mut c = b'A' + (n % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// An `rping_rdma_info` message.
pub fn info(buf: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&buf.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..16].copy_from_slice(&size.to_be_bytes());
    m
}

/// Reads an `rping_rdma_info` message.
pub fn parse_info(m: &[u8]) -> Option<(u64, u32, u32)> {
    let m = m.get(..16)?;
    Some((
        u64::from_be_bytes(m[..8].try_into().ok()?),
        u32::from_be_bytes(m[8..12].try_into().ok()?),
        u32::from_be_bytes(m[12..16].try_into().ok()?),
    ))
}

/// Why an rping run failed.
#[derive(Debug, thiserror::Error)]
pub enum RpingError {
    #[error("size {0} is below rping's minimum of {MIN_SIZE}")]
    TooSmall(usize),
    /// Opening the NIC or starting RDMA CM on it.
    #[error(transparent)]
    Nic(#[from] NicError),
    #[error("listen on port {port}: {source}")]
    Listen {
        port: u16,
        #[source]
        source: rdma_access::CmError,
    },
    #[error("{src} is not an address of {nic} (it has {have:?})")]
    NotOurs {
        src: IpAddr,
        nic: String,
        have: Vec<IpAddr>,
    },
    /// Opening the NIC or making a verbs object.
    #[error(transparent)]
    Verbs(#[from] verbs::VerbsError),
    #[error("QP to INIT: {0}")]
    QpInit(#[source] verbs::VerbsError),
    #[error("connect the QP: {0}")]
    ConnectQp(#[source] verbs::VerbsError),
    #[error("no client connected")]
    NoClient,
    #[error("bad connection request: {0}")]
    BadRequest(String),
    #[error("the connection went away before we accepted")]
    AcceptLost,
    #[error("a client needs the server's address")]
    NoPeer,
    #[error("connect to {peer}:{port}: {source}")]
    Connect {
        peer: IpAddr,
        port: u16,
        #[source]
        source: rdma_access::CmError,
    },
    #[error("post receive: {0}")]
    PostRecv(#[source] verbs::VerbsError),
    #[error("post {op:?}: {source}")]
    Post {
        op: SendOpcode,
        #[source]
        source: verbs::VerbsError,
    },
    #[error("completion error: {0}")]
    Completion(WcStatus),
    #[error("nothing happened for {0:?}")]
    Idle(Duration),
    #[error("the server left")]
    ServerLeft,
    #[error("data mismatch in ping {0}")]
    Mismatch(u64),
    #[error("short rping message")]
    ShortMessage,
    /// The stop flag ended a wait ([`RpingConfig::stop`]).
    #[error("interrupted")]
    Interrupted,
}

/// Offsets in the one registered buffer.
const RECV: usize = 0;
const SEND: usize = 64;
const RDMA: usize = 128;

struct Link {
    p: Arc<dyn Provider>,
    cq: verbs::CqHandle,
    qp: verbs::QpHandle,
    mem: MemBuf,
    mr: verbs::MrInfo,
    size: usize,
    start: usize,
    idle: Duration,
    gone: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Link {
    fn addr(&self, off: usize) -> u64 {
        self.mem.addr() + off as u64
    }

    fn post_recv(&self) -> Result<(), RpingError> {
        self.p
            .post_recv(
                self.qp,
                &[RecvWr {
                    wr_id: 1,
                    sges: verbs::sges![Sge {
                        addr: self.addr(RECV),
                        length: 16,
                        lkey: self.mr.lkey,
                    }],
                }],
            )
            .map_err(RpingError::PostRecv)
    }

    fn post(
        &self,
        op: SendOpcode,
        off: usize,
        len: usize,
        remote: Option<(u64, u32)>,
    ) -> Result<(), RpingError> {
        let mut wr = SendWr::new(
            2,
            op,
            vec![Sge {
                addr: self.addr(off),
                length: len as u32,
                lkey: self.mr.lkey,
            }],
        );
        if let Some((addr, rkey)) = remote {
            wr.remote = RemoteAddr {
                addr,
                rkey: rdma_types::Rkey(rkey),
            };
        }
        self.p
            .post_send(self.qp, &[wr])
            .map_err(|source| RpingError::Post { op, source })
    }

    /// Waits for the next completion; `Ok(None)` when the peer left.
    fn next(&self) -> Result<Option<WorkCompletion>, RpingError> {
        let mut wc = [WorkCompletion::new(
            0,
            WcStatus::Success,
            rdma_types::WcOpcode::Send,
            0,
        )];
        let end = Instant::now() + self.idle;
        loop {
            if self.p.poll_cq(self.cq, &mut wc)? == 1 {
                if wc[0].status != WcStatus::Success {
                    if self.gone.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    return Err(RpingError::Completion(wc[0].status));
                }
                return Ok(Some(wc[0]));
            }
            if self.gone.load(Ordering::SeqCst) {
                return Ok(None);
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(RpingError::Interrupted);
            }
            if Instant::now() > end {
                return Err(RpingError::Idle(self.idle));
            }
            let _ = self.p.req_notify_cq(self.cq, false);
            let _ = self.p.wait_cq(self.cq, Duration::from_millis(20));
        }
    }

    /// Waits for a completion of this kind (send-side ones in order).
    fn wait(&self, recv: bool) -> Result<Option<WorkCompletion>, RpingError> {
        loop {
            match self.next()? {
                None => return Ok(None),
                Some(wc) if (wc.wr_id == 1) == recv => return Ok(Some(wc)),
                Some(_) => {}
            }
        }
    }

    fn received(&self) -> Option<(u64, u32, u32)> {
        parse_info(&self.mem.to_vec(RECV, 16))
    }
}

/// Runs rping as configured.
///
/// # Errors
/// Setup, connection, a transfer or a data comparison failed.
pub fn run(cfg: &RpingConfig) -> Result<RpingReport, RpingError> {
    if cfg.size < MIN_SIZE {
        return Err(RpingError::TooSmall(cfg.size));
    }
    let nic = Nic::open(&cfg.nic)?;
    let (cm, addrs) = nic.rdma_cm(std::process::id() << 8)?;
    let p = nic.provider().clone();
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let crate::device::RcQp {
        pd,
        cq,
        qp,
        mem,
        mr,
    } = nic
        .rc_qp(
            64,
            16,
            4,
            RDMA + 2 * cfg.size,
            AccessFlags::LOCAL_WRITE | remote,
        )
        .map_err(|(_, e)| e)?;
    nic.init_qp(qp, remote).map_err(RpingError::QpInit)?;
    let qpn = p.qp_num(qp)?;
    let psn = Psn::new(std::process::id() & 0xff_ffff);
    let gone = Arc::new(AtomicBool::new(false));
    let link = Link {
        p: p.clone(),
        cq,
        qp,
        mem,
        mr,
        size: cfg.size,
        start: RDMA + cfg.size,
        idle: cfg.idle_timeout,
        gone: gone.clone(),
        stop: cfg.stop.clone(),
    };
    link.post_recv()?;
    // `rq_psn`: ours, unless the CM chose it (the kernel's announces its
    // own).
    let to_rtr_rts = |peer: Gid, remote_qpn: Qpn, remote_psn: Psn, rq_psn: Psn, mtu: Mtu| {
        nic.cm_rtr_rts(qp, peer, remote_qpn, remote_psn, rq_psn, mtu, 16)
            .map_err(RpingError::ConnectQp)
    };
    let g = gone.clone();
    cm.on_disconnect(Arc::new(move |_| g.store(true, Ordering::SeqCst)));
    let report = if cfg.server {
        let requests = cm.listen(cfg.port).map_err(|source| RpingError::Listen {
            port: cfg.port,
            source,
        })?;
        let at: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "rrping: server listening on {}:{} ({})",
            at.join(", "),
            cfg.port,
            nic.name()
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let end = Instant::now() + cfg.idle_timeout;
        let req = loop {
            if cfg.stop.load(Ordering::Relaxed) {
                return Ok(RpingReport {
                    interrupted: true,
                    ..RpingReport::default()
                });
            }
            match requests.recv_timeout(crate::STOP_POLL) {
                Ok(r) => break r.map_err(|e| RpingError::BadRequest(e.0))?,
                Err(_) if Instant::now() < end => {}
                Err(_) => return Err(RpingError::NoClient),
            }
        };
        let conn = req.conn;
        to_rtr_rts(
            req.peer,
            req.remote_qpn,
            req.remote_psn,
            req.local_psn.unwrap_or(psn),
            req.mtu,
        )?;
        if !req.accept(qpn, psn, Vec::new()) {
            return Err(RpingError::AcceptLost);
        }
        let r = interruptible(|r| serve(&link, cfg, r))?;
        if r.interrupted {
            cm.disconnect_wait(conn, crate::DRAIN);
        }
        r
    } else {
        let peer = cfg.peer.ok_or(RpingError::NoPeer)?;
        let src = source(cfg.local, &addrs, nic.name())?;
        let est = cm
            .connect(
                src,
                SocketAddr::new(peer, cfg.port),
                qpn,
                psn,
                &[],
                cfg.idle_timeout,
            )
            .map_err(|source| RpingError::Connect {
                peer,
                port: cfg.port,
                source,
            })?;
        to_rtr_rts(
            Gid::from_ip(peer),
            est.remote_qpn,
            est.remote_psn,
            est.local_psn.unwrap_or(psn),
            nic.port_attr().active_mtu,
        )?;
        let r = interruptible(|r| ping(&link, cfg, r));
        let interrupted = r.as_ref().is_ok_and(|r| r.interrupted);
        cm.disconnect_wait(
            est.conn,
            if interrupted {
                crate::DRAIN
            } else {
                Duration::from_secs(2)
            },
        );
        r?
    };
    drop(link);
    let _ = p.destroy_qp(qp);
    let _ = p.dereg_mr(mr.handle);
    let _ = p.destroy_cq(cq);
    let _ = p.dealloc_pd(pd);
    Ok(report)
}

/// The client's source address: `asked` if the NIC has it, else the
/// NIC's first IPv4 address (or first of any).
fn source(asked: Option<IpAddr>, have: &[IpAddr], nic: &str) -> Result<IpAddr, RpingError> {
    let not_ours = |src| RpingError::NotOurs {
        src,
        nic: nic.to_string(),
        have: have.to_vec(),
    };
    match asked {
        Some(a) if have.contains(&a) => Ok(a),
        Some(a) => Err(not_ours(a)),
        None => have
            .iter()
            .find(|a| a.is_ipv4())
            .or(have.first())
            .copied()
            .ok_or(not_ours(IpAddr::from([0, 0, 0, 0]))),
    }
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Runs `f` on a report it fills: its report once it returns, also when
/// an interrupt ended it ([`RpingReport::interrupted`]).
fn interruptible(
    f: impl FnOnce(&mut RpingReport) -> Result<(), RpingError>,
) -> Result<RpingReport, RpingError> {
    let mut r = RpingReport {
        connected: true,
        ..RpingReport::default()
    };
    match f(&mut r) {
        Ok(()) => Ok(r),
        Err(RpingError::Interrupted) => Ok(RpingReport {
            interrupted: true,
            ..r
        }),
        Err(e) => Err(e),
    }
}

fn ping(l: &Link, cfg: &RpingConfig, r: &mut RpingReport) -> Result<(), RpingError> {
    for n in 0..cfg.count {
        let src = ping_pattern(n, l.size);
        l.mem.write_at(l.start, &src);
        l.mem.write_at(RDMA, &vec![0u8; l.size]);
        l.mem
            .write_at(SEND, &info(l.addr(l.start), l.mr.rkey.0, l.size as u32));
        l.post(SendOpcode::Send, SEND, 16, None)?;
        l.wait(false)?.ok_or(RpingError::ServerLeft)?;
        // The server read our buffer and says go on.
        l.wait(true)?.ok_or(RpingError::ServerLeft)?;
        l.post_recv()?;
        l.mem
            .write_at(SEND, &info(l.addr(RDMA), l.mr.rkey.0, l.size as u32));
        l.post(SendOpcode::Send, SEND, 16, None)?;
        l.wait(false)?.ok_or(RpingError::ServerLeft)?;
        // The server wrote it back.
        l.wait(true)?.ok_or(RpingError::ServerLeft)?;
        l.post_recv()?;
        let back = l.mem.to_vec(RDMA, l.size);
        if cfg.validate {
            if back != src {
                return Err(RpingError::Mismatch(n));
            }
            r.validated += 1;
        }
        if cfg.verbose {
            println!("ping data: {}", text(&back));
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        r.pings += 1;
    }
    Ok(())
}

fn serve(l: &Link, cfg: &RpingConfig, r: &mut RpingReport) -> Result<(), RpingError> {
    loop {
        // The client's source buffer.
        if l.wait(true)?.is_none() {
            return Ok(());
        }
        let (addr, rkey, len) = l.received().ok_or(RpingError::ShortMessage)?;
        l.post_recv()?;
        let len = (len as usize).min(l.size);
        l.post(SendOpcode::RdmaRead, RDMA, len, Some((addr, rkey)))?;
        if l.wait(false)?.is_none() {
            return Ok(());
        }
        let got = l.mem.to_vec(RDMA, len);
        if cfg.verbose {
            println!("server ping data: {}", text(&got));
        }
        l.mem
            .write_at(SEND, &info(l.addr(RDMA), l.mr.rkey.0, l.size as u32));
        l.post(SendOpcode::Send, SEND, 16, None)?;
        if l.wait(false)?.is_none() {
            return Ok(());
        }
        // The client's sink buffer.
        if l.wait(true)?.is_none() {
            return Ok(());
        }
        let (addr, rkey, sink) = l.received().ok_or(RpingError::ShortMessage)?;
        l.post_recv()?;
        let n = got
            .iter()
            .position(|&c| c == 0)
            .map_or(len, |i| i + 1)
            .min(sink as usize);
        l.post(SendOpcode::RdmaWrite, RDMA, n, Some((addr, rkey)))?;
        if l.wait(false)?.is_none() {
            return Ok(());
        }
        l.post(SendOpcode::Send, SEND, 16, None)?;
        if l.wait(false)?.is_none() {
            return Ok(());
        }
        r.pings += 1;
        if cfg.count > 0 && r.pings >= cfg.count {
            // rping's server also ends after -C pings; wait for the DREQ.
            let end = Instant::now() + Duration::from_secs(5);
            while !l.gone.load(Ordering::SeqCst)
                && !l.stop.load(Ordering::Relaxed)
                && Instant::now() < end
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_connects_from_an_address_of_its_nic() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let have = [ip("fe80::1"), ip("10.0.0.2"), ip("10.0.0.3")];
        // IPv4 first, as rping's users expect on RoCE.
        assert_eq!(source(None, &have, "rxe0").unwrap(), ip("10.0.0.2"));
        assert_eq!(
            source(Some(ip("10.0.0.3")), &have, "rxe0").unwrap(),
            ip("10.0.0.3")
        );
        let e = source(Some(ip("10.0.0.9")), &have, "rxe0")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("10.0.0.9 is not an address of rxe0 (it has ["),
            "{e}"
        );
        assert!(source(None, &[], "rxe0").is_err());
    }

    #[test]
    fn pattern_and_info_match_rping() {
        let b = ping_pattern(0, 64);
        assert_eq!(&b[..16], b"rdma-ping-0: ABC");
        assert_eq!(b.len(), 64);
        assert_eq!(b[63], 0);
        // The run starts one letter later each ping and wraps after 'z'.
        assert_eq!(&ping_pattern(1, 20)[..14], b"rdma-ping-1: B");
        assert_eq!(ping_pattern(57, 20)[14], b'z', "after \"rdma-ping-57: \"");
        assert_eq!(ping_pattern(58, 20)[14], b'A');
        let i = info(0x1122_3344_5566_7788, 0xaabb_ccdd, 64);
        assert_eq!(
            i,
            [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 64]
        );
        assert_eq!(
            parse_info(&i),
            Some((0x1122_3344_5566_7788, 0xaabb_ccdd, 64))
        );
        assert_eq!(parse_info(&i[..15]), None);
    }
}
