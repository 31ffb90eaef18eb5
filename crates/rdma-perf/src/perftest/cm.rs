//! perftest's RDMA CM mode (`-R`): the exchange over a connection of its
//! own, the test's QP connected by RDMA CM too.
//!
//! With `-R`, perftest 4.5-0.17 (`perftest_communication.c`) keeps the
//! swaps of the TCP mode but carries each one as a SEND on an RC QP that
//! RDMA CM connected to the server's port (no private data). Each side
//! keeps one receive of 56 bytes posted (before the CM connect or accept,
//! and again after each message arrives); the client SENDs first in each
//! swap, the server after its receive completed. The sizes are the TCP
//! mode's, except the dest message: the C `struct pingpong_dest` in
//! binary, 56 bytes on 64-bit Linux (see [`DEST_BIN_LEN`]). Two extra
//! dest swaps (of zeroed structs, before the test's values exist) fence
//! the test's own CM connection, to the same port: the server listens
//! after the first, the client connects (retrying while nothing listens
//! yet) and then swaps the second. The test QP is never moved by the
//! exchanged values (the CM did it); only the RKEY and VADDR are used.
//! The close is the last dest swap; no `"done"` follows. The client then
//! disconnects the test connection; both ends drop the exchange's.
//!
//! Not spoken: `ib_send_bw` on an iWARP device (`send_bw.c`) returns
//! receive credits to its client by RDMA WRITEs to a buffer named in the
//! dest swap, which our SEND client neither offers nor our server writes;
//! `send -R` works between two `rperftest`s (not tried against perftest).

use super::*;
use rdma_access::rdmacm::Service;
use rdma_access::{CmError, ConnId};
use std::sync::mpsc::Receiver;

/// Bytes of a binary dest message (`struct pingpong_dest` on LP64):
/// `lid`, `out_reads`, `qpn`, `psn`, `rkey` (big-endian 32-bit), 4 bytes
/// of padding, `vaddr` (big-endian 64-bit) at 24, the GID at 32, `srqn`
/// at 48 and `gid_index` at 52.
pub const DEST_BIN_LEN: usize = 56;

/// The largest message a side's receive takes.
const RECV_LEN: usize = DEST_BIN_LEN;

/// perftest's client tries its test connection this many times, 100 ms
/// apart, while the server is not listening yet.
const CONNECT_TRIES: u32 = 10;

/// The REJ reason "invalid service ID" (IBA 12.6.7.2): nothing listens
/// on the port (our iWARP CM reports a refused TCP connect so too).
const INVALID_SERVICE_ID: u16 = 8;

impl Dest {
    /// The binary message of the RDMA CM mode.
    pub fn to_bin(&self) -> [u8; DEST_BIN_LEN] {
        let mut m = [0u8; DEST_BIN_LEN];
        let words = [
            u32::from(self.lid),
            u32::from(self.out_reads),
            self.qpn,
            self.psn,
            self.rkey,
        ];
        for (i, w) in words.iter().enumerate() {
            m[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
        m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        m[32..48].copy_from_slice(&self.gid.0);
        m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        m
    }

    /// Reads a peer's binary message.
    ///
    /// # Errors
    /// The wrong length, or a LID, OUT_READS, QPN or PSN out of range
    /// (the struct's `int`s hold 16- and 24-bit values).
    pub fn from_bin(m: &[u8]) -> Result<Dest, PerftestError> {
        if m.len() != DEST_BIN_LEN {
            return Err(bad(format!(
                "RDMA CM dest message is {} bytes, not {DEST_BIN_LEN} (is the peer perftest with -R on 64-bit Linux?)",
                m.len()
            )));
        }
        let word = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        let check = |i: usize, what: &str, max: u32| {
            let v = word(i);
            if v > max {
                Err(bad(format!(
                    "{what} {v:#x} out of range (at most {max:#x}) in RDMA CM dest message {m:02x?}"
                )))
            } else {
                Ok(v)
            }
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[32..48]);
        Ok(Dest {
            lid: check(0, "LID", 0xffff)? as u16,
            out_reads: check(4, "OUT_READS", 0xffff)? as u16,
            qpn: check(8, "QPN", 0xff_ffff)?,
            psn: check(12, "PSN", 0xff_ffff)?,
            rkey: word(16),
            vaddr: u64::from_be_bytes(m[24..32].try_into().unwrap_or([0; 8])),
            gid: Gid(gid),
            srqn: word(48),
        })
    }
}

/// Flags the CM's disconnect hook sets.
#[derive(Default)]
struct Gone {
    conns: std::sync::Mutex<Vec<ConnId>>,
}

impl Gone {
    fn has(&self, c: Option<ConnId>) -> bool {
        c.is_some_and(|c| {
            self.conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&c)
        })
    }
}

/// The exchange's connection: RDMA CM, a QP of its own, one receive
/// posted.
pub(super) struct CmLink {
    cm: Arc<dyn Service>,
    /// A server's listener: the exchange's request, then the test's.
    requests: Option<Receiver<rdma_access::rdmacm::Listened>>,
    /// The address a client connects from.
    src: IpAddr,
    p: Arc<dyn Provider>,
    rc: crate::device::RcQp,
    conn: Option<ConnId>,
    /// The test's connection, once made.
    data: Option<ConnId>,
    gone: Arc<Gone>,
    /// A receive that completed while we waited for our SEND's.
    early: Option<WorkCompletion>,
}

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;
/// Where our SENDs are built, after the receive buffer.
const SEND_AT: usize = 64;

/// The first PSN a QP of ours sends (the CM may choose otherwise).
fn our_psn(salt: u32) -> Psn {
    Psn::new(
        (std::process::id().wrapping_mul(2_654_435_761) ^ salt.wrapping_mul(0x9e37)) & 0xff_ffff,
    )
}

impl CmLink {
    /// Opens the exchange's QP on `dev`; a server listens on its port
    /// ([`CmLink::start`] connects).
    pub(super) fn open(
        cfg: &PerftestConfig,
        dev: &crate::device::Nic,
    ) -> Result<CmLink, PerftestError> {
        let setup = |what: &'static str| {
            move |e: verbs::VerbsError| {
                PerftestError::Setup(format!("RDMA CM exchange: {what}: {e}"))
            }
        };
        let (cm, addrs) = dev
            .rdma_cm(std::process::id() << 8)
            .map_err(PerftestError::Device)?;
        let src = match cfg.bind {
            ip if !ip.is_unspecified() && addrs.contains(&ip) => ip,
            _ => addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied()
                .ok_or_else(|| {
                    PerftestError::Setup(format!("{} has no IP address for RDMA CM", dev.name()))
                })?,
        };
        let requests = if cfg.server.is_none() {
            Some(cm.listen(cfg.port).map_err(|e| {
                PerftestError::Setup(format!("RDMA CM listen on port {}: {e}", cfg.port))
            })?)
        } else {
            None
        };
        let gone = Arc::new(Gone::default());
        let g = gone.clone();
        cm.on_disconnect(Arc::new(move |c| {
            g.conns.lock().unwrap_or_else(|e| e.into_inner()).push(c)
        }));
        let p = dev.provider().clone();
        let rc = dev
            .rc_qp(16, 4, 4, SEND_AT + RECV_LEN, AccessFlags::LOCAL_WRITE)
            .map_err(|(what, e)| setup(what)(e))?;
        Ok(CmLink {
            cm,
            requests,
            src,
            p,
            rc,
            conn: None,
            data: None,
            gone,
            early: None,
        })
    }

    /// Connects the exchange: a client to the server, a server by taking
    /// the first request on its port.
    pub(super) fn start(
        &mut self,
        cfg: &PerftestConfig,
        dev: &crate::device::Nic,
    ) -> Result<(), PerftestError> {
        let setup = |e: verbs::VerbsError| PerftestError::Setup(format!("RDMA CM exchange: {e}"));
        dev.init_qp(self.rc.qp, AccessFlags::LOCAL_WRITE)
            .map_err(setup)?;
        self.post_recv()?;
        let psn = our_psn(1);
        let conn = attach(
            cfg,
            dev,
            &*self.cm,
            self.requests.as_ref(),
            self.src,
            &self.p,
            self.rc.qp,
            psn,
            1,
            "the exchange",
        )?;
        self.conn = Some(conn);
        Ok(())
    }

    fn post_recv(&self) -> Result<(), PerftestError> {
        self.p
            .post_recv(
                self.rc.qp,
                &[RecvWr {
                    wr_id: RECV_ID,
                    sges: verbs::sges![Sge {
                        addr: self.rc.mem.addr(),
                        length: RECV_LEN as u32,
                        lkey: self.rc.mr.lkey,
                    }],
                }],
            )
            .map_err(|e| bad(format!("post a receive for the exchange: {e}")))
    }

    /// Waits for our SEND's completion (`recv` false) or the peer's
    /// message (`recv` true).
    fn wait(
        &mut self,
        recv: bool,
        what: &str,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<WorkCompletion, PerftestError> {
        if recv {
            if let Some(wc) = self.early.take() {
                return Ok(wc);
            }
        }
        let mut wc = [empty_wc()];
        let end = Instant::now() + timeout;
        loop {
            let n = self
                .p
                .poll_cq(self.rc.cq, &mut wc)
                .map_err(|e| bad(format!("poll the exchange's CQ: {e}")))?;
            if n == 1 {
                let c = wc[0];
                if c.status != WcStatus::Success {
                    // A flush: the QP went to ERR, which a disconnect does
                    // before the CM's hook says so; give the hook a moment.
                    let settle = Instant::now() + Duration::from_secs(1);
                    while c.status == WcStatus::WrFlushErr
                        && !self.gone.has(self.conn)
                        && Instant::now() < settle
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if self.gone.has(self.conn) {
                        return Err(bad(format!(
                            "peer closed the connection while swapping {what}"
                        )));
                    }
                    return Err(bad(format!(
                        "the exchange's {} completed with status {} while swapping {what}",
                        if c.wr_id == RECV_ID {
                            "receive"
                        } else {
                            "SEND"
                        },
                        c.status
                    )));
                }
                match (c.wr_id == RECV_ID, recv) {
                    (true, true) | (false, false) => return Ok(c),
                    (true, false) => self.early = Some(c),
                    (false, true) => {}
                }
                continue;
            }
            if self.gone.has(self.conn) {
                return Err(bad(format!(
                    "peer closed the connection while swapping {what}"
                )));
            }
            if stop.load(Ordering::Relaxed) {
                return Err(PerftestError::Interrupted);
            }
            if Instant::now() >= end {
                return Err(bad(format!("peer silent while swapping {what}")));
            }
            let _ = self.p.req_notify_cq(self.rc.cq, false);
            let _ = self.p.wait_cq(self.rc.cq, crate::STOP_POLL);
        }
    }

    fn send(
        &mut self,
        mine: &[u8],
        what: &str,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<(), PerftestError> {
        self.rc.mem.write_at(SEND_AT, mine);
        self.p
            .post_send(
                self.rc.qp,
                &[SendWr::new(
                    SEND_ID,
                    SendOpcode::Send,
                    vec![Sge {
                        addr: self.rc.mem.addr() + SEND_AT as u64,
                        length: mine.len() as u32,
                        lkey: self.rc.mr.lkey,
                    }],
                )],
            )
            .map_err(|e| bad(format!("post the SEND of {what}: {e}")))?;
        self.wait(false, what, timeout, stop).map(|_| ())
    }

    fn receive(
        &mut self,
        len: usize,
        what: &str,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<Vec<u8>, PerftestError> {
        let c = self.wait(true, what, timeout, stop)?;
        let got = self.rc.mem.to_vec(0, (c.byte_len as usize).min(RECV_LEN));
        self.post_recv()?;
        if c.byte_len as usize != len {
            return Err(bad(format!(
                "peer sent {} bytes where {len} were due while swapping {what} \
                 (is the peer perftest with -R, the same test on both sides?)",
                c.byte_len
            )));
        }
        Ok(got)
    }

    /// perftest's swap over SEND/RECV: the client sends first.
    pub(super) fn swap(
        &mut self,
        client: bool,
        mine: &[u8],
        len: usize,
        what: &str,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<Vec<u8>, PerftestError> {
        if client {
            self.send(mine, what, timeout, stop)?;
            self.receive(len, what, timeout, stop)
        } else {
            let theirs = self.receive(len, what, timeout, stop)?;
            self.send(mine, what, timeout, stop)?;
            Ok(theirs)
        }
    }

    /// Connects the test's QP (in INIT) by RDMA CM to the same port.
    pub(super) fn connect_test(
        &mut self,
        cfg: &PerftestConfig,
        nic: &Nic,
    ) -> Result<(), PerftestError> {
        let c = attach(
            cfg,
            &nic.dev,
            &*self.cm,
            self.requests.as_ref(),
            self.src,
            &nic.p,
            nic.qp,
            our_psn(2),
            nic.out_reads,
            "the test",
        )?;
        self.data = Some(c);
        Ok(())
    }

    /// The end, after the close swap. The last SEND's completion on the
    /// server may come after the client read it: siw fails it when the
    /// connection closes first, and perftest's server then fails. So a
    /// client facing perftest waits (bounded) for the server to go, then
    /// disconnects the test's connection and the exchange's; a client
    /// facing rperftest, whose server waits for it, goes at once. A
    /// server waits (bounded) for the client to go.
    pub(super) fn finish(&self, client: bool, peer_is_ours: bool, timeout: Duration) {
        if !client || !peer_is_ours {
            let end = Instant::now() + timeout.min(Duration::from_secs(5));
            while !self.gone.has(self.conn) && !self.gone.has(self.data) && Instant::now() < end {
                std::thread::sleep(crate::STOP_POLL);
            }
        }
        if client {
            if let Some(d) = self.data {
                self.cm.disconnect_wait(d, Duration::from_secs(2));
            }
            if let Some(c) = self.conn {
                self.cm.disconnect_wait(c, Duration::from_secs(2));
            }
        }
    }

    pub(super) fn close(&mut self) {
        for c in [self.data.take(), self.conn.take()].into_iter().flatten() {
            if !self.gone.has(Some(c)) {
                self.cm.disconnect(c);
            }
        }
        self.rc.release(self.p.as_ref());
    }
}

/// Makes one RDMA CM connection for QP `qp` (in INIT): a client connects
/// (retrying while the server is not listening yet), a server takes the
/// next request on its listener; then the QP goes to RTR and RTS.
#[allow(clippy::too_many_arguments)]
fn attach(
    cfg: &PerftestConfig,
    dev: &crate::device::Nic,
    cm: &dyn Service,
    requests: Option<&Receiver<rdma_access::rdmacm::Listened>>,
    src: IpAddr,
    p: &Arc<dyn Provider>,
    qp: verbs::QpHandle,
    psn: Psn,
    depth: u8,
    what: &str,
) -> Result<ConnId, PerftestError> {
    let qpn = p
        .qp_num(qp)
        .map_err(|e| PerftestError::Setup(e.to_string()))?;
    let to_rts = |peer: Gid, remote_qpn: Qpn, remote_psn: Psn, rq_psn: Psn, mtu: Mtu| {
        let mtu = if mtu.bytes() < cfg.mtu.bytes() {
            mtu
        } else {
            cfg.mtu
        };
        dev.cm_rtr_rts(qp, peer, remote_qpn, remote_psn, rq_psn, mtu, depth)
            .map_err(|e| PerftestError::Setup(format!("QP of {what} to RTR/RTS: {e}")))
    };
    if let Some(rx) = requests {
        let end = Instant::now() + cfg.timeout;
        let req = loop {
            if cfg.stop.load(Ordering::Relaxed) {
                return Err(PerftestError::Interrupted);
            }
            match rx.recv_timeout(crate::STOP_POLL) {
                Ok(Ok(r)) => break r,
                Ok(Err(e)) => {
                    return Err(bad(format!(
                        "a request for {what} on port {} was no RDMA CM request: {}",
                        cfg.port, e.0
                    )))
                }
                Err(_) if Instant::now() < end => {}
                Err(_) => {
                    return Err(bad(format!(
                        "no RDMA CM connection for {what} within {:?} on port {}",
                        cfg.timeout, cfg.port
                    )))
                }
            }
        };
        let conn = req.conn;
        let rq = req.local_psn.unwrap_or(psn);
        to_rts(req.peer, req.remote_qpn, req.remote_psn, rq, req.mtu)?;
        if !req.accept(qpn, psn, Vec::new()) {
            return Err(bad(format!(
                "the RDMA CM connection for {what} went away before we accepted"
            )));
        }
        Ok(conn)
    } else {
        let server = cfg
            .server
            .ok_or_else(|| bad("internal: a client without a server"))?;
        let dst = SocketAddr::new(server, cfg.port);
        let mut tries = 0;
        let est = loop {
            tries += 1;
            match cm.connect(src, dst, qpn, psn, &[], cfg.timeout) {
                Ok(e) => break e,
                // Nothing listens yet: perftest's server listens for the
                // test's connection only after the first fence swap.
                Err(CmError::Rejected { code, .. })
                    if code == INVALID_SERVICE_ID && tries < CONNECT_TRIES =>
                {
                    if cfg.stop.load(Ordering::Relaxed) {
                        return Err(PerftestError::Interrupted);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(PerftestError::Setup(format!(
                        "RDMA CM connect for {what} to {dst}: {e} (is the server running with -R on that port?)"
                    )))
                }
            }
        };
        let rq = est.local_psn.unwrap_or(psn);
        to_rts(
            Gid::from_ip(server),
            est.remote_qpn,
            est.remote_psn,
            rq,
            dev.port_attr().active_mtu,
        )?;
        Ok(est.conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest() -> Dest {
        Dest {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            rkey: 0xdead_beef,
            vaddr: 0x7f00_1122_3344,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
            srqn: 0,
        }
    }

    #[test]
    fn the_binary_dest_is_perftest_s_struct_big_endian() {
        let m = dest().to_bin();
        assert_eq!(&m[..4], &[0, 0, 0, 0]);
        assert_eq!(&m[4..8], &[0, 0, 0, 0x80]);
        assert_eq!(&m[8..12], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&m[12..16], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(&m[16..20], &[0xde, 0xad, 0xbe, 0xef]);
        // Padding, then the 64-bit address at 24.
        assert_eq!(&m[20..24], &[0; 4]);
        assert_eq!(&m[24..32], &[0, 0, 0x7f, 0, 0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&m[42..48], &[0xff, 0xff, 10, 77, 0, 2]);
        assert_eq!(Dest::from_bin(&m).unwrap(), dest());
        // perftest leaves its padding and gid_index as they come: ignored.
        let mut linux = m;
        linux[20..24].copy_from_slice(&[0x55; 4]);
        linux[52..56].copy_from_slice(&[0, 0, 0, 3]);
        assert_eq!(Dest::from_bin(&linux).unwrap(), dest());
    }

    #[test]
    fn malformed_binary_dests_name_the_problem() {
        let m = dest().to_bin();
        let e = Dest::from_bin(&m[..40]).unwrap_err().to_string();
        assert!(e.contains("40 bytes, not 56"), "{e}");
        assert!(e.contains("-R"), "{e}");
        let e = Dest::from_bin(&[0u8; 108]).unwrap_err().to_string();
        assert!(e.contains("108 bytes"), "{e}");
        let mut q = m;
        q[8] = 1; // QPN above 24 bits
        let e = Dest::from_bin(&q).unwrap_err().to_string();
        assert!(e.contains("QPN 0x1123456 out of range"), "{e}");
        let mut p = m;
        p[12..16].copy_from_slice(&[0xff; 4]);
        let e = Dest::from_bin(&p).unwrap_err().to_string();
        assert!(e.contains("PSN 0xffffffff out of range"), "{e}");
        let mut l = m;
        l[1] = 1;
        assert!(Dest::from_bin(&l).unwrap_err().to_string().contains("LID"));
        let mut o = m;
        o[5] = 1;
        assert!(Dest::from_bin(&o)
            .unwrap_err()
            .to_string()
            .contains("OUT_READS"));
        // Any 56 bytes parse or say why; none panics.
        for seed in 0u32..2000 {
            let b: Vec<u8> = (0..DEST_BIN_LEN as u32)
                .map(|i| {
                    (seed.wrapping_mul(2_654_435_761) ^ i.wrapping_mul(40_503)).to_le_bytes()
                        [i as usize % 4]
                })
                .collect();
            let _ = Dest::from_bin(&b);
        }
    }

    #[test]
    fn rdma_cm_fences_the_test_connection_after_the_mtu() {
        use Step::*;
        for (verb, client) in [
            (Verb::Write, true),
            (Verb::Write, false),
            (Verb::Read, true),
            (Verb::Read, false),
            (Verb::Send, true),
            (Verb::Send, false),
        ] {
            let s = steps(verb, false, client, true);
            assert_eq!(&s[..6], &[Version, SysData, Mtu, Fence, CmConnect, Fence]);
            assert_eq!(&s[6..], &script(verb, false, client)[3..]);
            assert_eq!(
                steps(verb, false, client, false),
                script(verb, false, client)
            );
        }
    }
}
