//! The NIC side of a test: the TCP link to the peer, the verbs objects of
//! one end (CA, PD, CQ, QP, buffer and its MR), connecting and polling.

use super::*;

/// How the exchange travels.
pub(super) enum Chan {
    /// perftest's TCP socket. Read with a short timeout
    /// ([`crate::STOP_POLL`]), so a wait for the peer sees the stop flag.
    Tcp(TcpStream),
    /// RDMA CM mode (`-R`): SENDs on a QP of its own.
    Cm(Box<CmLink>),
}

/// The link to the peer, with perftest's swap rule.
pub(super) struct Link {
    pub(super) chan: Chan,
    pub(super) client: bool,
    /// How long the peer may be silent.
    pub(super) timeout: Duration,
    pub(super) stop: Arc<AtomicBool>,
}

impl Link {
    pub(super) fn swap(
        &mut self,
        mine: &[u8],
        len: usize,
        what: &str,
    ) -> Result<Vec<u8>, PerftestError> {
        let s = match &mut self.chan {
            Chan::Tcp(s) => s,
            Chan::Cm(l) => return l.swap(self.client, mine, len, what, self.timeout, &self.stop),
        };
        let mut theirs = vec![0u8; len];
        let io = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::Interrupted {
                PerftestError::Interrupted
            } else if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                bad(format!("peer silent while swapping {what}"))
            } else if matches!(
                e.kind(),
                // A peer that closes with our bytes unread resets the
                // connection instead: the same departure.
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ) {
                bad(format!("peer closed the connection while swapping {what}"))
            } else {
                PerftestError::Io(format!("swapping {what}"), e)
            }
        };
        let stop = &*self.stop;
        if self.client {
            s.write_all(mine).map_err(io)?;
            read_exact(s, &mut theirs, self.timeout, stop).map_err(io)?;
        } else {
            read_exact(s, &mut theirs, self.timeout, stop).map_err(io)?;
            s.write_all(mine).map_err(io)?;
        }
        Ok(theirs)
    }
}

/// Fills `buf` from the peer: `TimedOut` after `timeout` without a
/// byte, `Interrupted` once the stop flag is set.
fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut got = 0;
    let mut last = Instant::now();
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                last = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) {
                    return Err(ErrorKind::Interrupted.into());
                }
                if last.elapsed() >= timeout {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The verbs objects of one test.
pub(super) struct Nic {
    pub(super) p: Arc<dyn Provider>,
    pub(super) pd: verbs::PdHandle,
    pub(super) cq: verbs::CqHandle,
    pub(super) qp: verbs::QpHandle,
    pub(super) mem: MemBuf,
    pub(super) mr: verbs::MrInfo,
    /// Bytes of each half: [local sources / READ sinks | target].
    pub(super) half: usize,
    pub(super) out_reads: u8,
    pub(super) gid: Gid,
    /// `gid`'s index in our port's table.
    pub(super) sgid_index: u8,
    /// The CA and port, closed after the objects on it.
    pub(super) dev: crate::device::Nic,
}

impl Nic {
    pub(super) fn open(
        cfg: &PerftestConfig,
        dev: crate::device::Nic,
        sys: SysData,
        target: usize,
    ) -> Result<Nic, PerftestError> {
        let e = |what: &str| {
            let what = what.to_string();
            move |err: verbs::VerbsError| PerftestError::Setup(format!("{what}: {err}"))
        };
        let p = dev.provider().clone();
        let ca = dev.ca();
        let attr = p.query_ca(ca).map_err(e("query the CA"))?;
        if cfg.verb == Verb::Atomic && !attr.atomics {
            return Err(PerftestError::Setup(
                "the NIC does not support atomics".into(),
            ));
        }
        let port = dev.port_attr();
        let (sgid_index, gid) = match cfg.gid_index {
            Some(i) => port.gids.get(i as usize).map(|g| (i, *g)).ok_or_else(|| {
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
                .position(|g| g.is_ipv4_mapped())
                .or((!port.gids.is_empty()).then_some(0))
                .map(|i| (i as u32, port.gids[i]))
                .ok_or_else(|| PerftestError::Setup("our port has no GID".into()))?,
        };
        let sgid_index = u8::try_from(sgid_index)
            .map_err(|_| PerftestError::Usage(format!("GID index {sgid_index} is above 255")))?;
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
            pd,
            cq,
            qp,
            mem,
            mr,
            half,
            out_reads,
            gid,
            sgid_index,
            dev,
        })
    }

    pub(super) fn target_addr(&self) -> u64 {
        self.mem.addr() + self.half as u64
    }

    /// The QP to INIT with the access the test needs.
    pub(super) fn init(&self, verb: Verb) -> Result<(), PerftestError> {
        let access = match verb {
            Verb::Write => AccessFlags::REMOTE_WRITE,
            Verb::Read => AccessFlags::REMOTE_READ,
            Verb::Send => AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            Verb::Atomic => AccessFlags::REMOTE_ATOMIC,
        };
        self.dev
            .init_qp(self.qp, access)
            .map_err(|e| PerftestError::Setup(format!("QP to INIT: {e}")))
    }

    pub(super) fn connect(
        &self,
        verb: Verb,
        mine: &Dest,
        peer: &Dest,
        mtu: Mtu,
    ) -> Result<(), PerftestError> {
        self.init(verb)?;
        let step = |what: &str, attr: QpAttr| {
            self.p
                .modify_qp(self.qp, &attr)
                .map_err(|e| PerftestError::Setup(format!("QP to {what}: {e}")))
        };
        step(
            "RTR",
            QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr {
                    sgid_index: self.sgid_index,
                    ..self.dev.av(peer.gid)
                }),
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
    pub(super) fn poll(
        &self,
        out: &mut [WorkCompletion],
        idle: &mut u32,
    ) -> Result<usize, PerftestError> {
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

    pub(super) fn close(self) {
        let _ = self.p.destroy_qp(self.qp);
        let _ = self.p.dereg_mr(self.mr.handle);
        let _ = self.p.destroy_cq(self.cq);
        let _ = self.p.dealloc_pd(self.pd);
        drop(self.dev);
    }
}

pub(super) fn empty_wc() -> WorkCompletion {
    WorkCompletion::new(0, WcStatus::Success, rdma_types::WcOpcode::Send, 0)
}

pub(super) fn wc_error(c: &WorkCompletion, done: u64, of: u64) -> PerftestError {
    PerftestError::Transfer(format!(
        "completion with error: status {} ({}) for wr_id {} after {done} of {of} messages",
        c.status, c.status as u32, c.wr_id
    ))
}
