//! One test run as perftest's script of steps: exchanges, NIC setup,
//! headers, traffic and reports, in the order its client and server
//! take them.

use super::*;

pub(super) fn print_dest(side: &str, d: &Dest, verb: Verb) {
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
/// forever; we keep every wait bounded), or with `Interrupted` once `stop`
/// is set.
pub(super) fn accept_within(
    l: &TcpListener,
    timeout: Duration,
    stop: &AtomicBool,
) -> std::io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let end = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::Relaxed) {
                    return Err(std::io::ErrorKind::Interrupted.into());
                }
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
pub(super) struct Session<'a> {
    pub(super) cfg: &'a PerftestConfig,
    pub(super) link: Link,
    pub(super) peer_version: Option<PeerVersion>,
    pub(super) sys: SysData,
    pub(super) mtu: Mtu,
    /// The CA and port, until the NIC's objects are made on it.
    pub(super) dev: Option<crate::device::Nic>,
    pub(super) nic: Option<Nic>,
    pub(super) mine: Option<Dest>,
    pub(super) peer: Option<Dest>,
    pub(super) receiver: Option<Receiver>,
    pub(super) local: Option<BwReport>,
    pub(super) remote: Option<BwReport>,
    pub(super) latency: Option<LatReport>,
    pub(super) verified: Vec<String>,
}

/// A value an earlier step of the script provides.
pub(super) fn need<'o, T>(o: &'o Option<T>, what: &str) -> Result<&'o T, PerftestError> {
    o.as_ref()
        .ok_or_else(|| bad(format!("internal: a step ran before {what} existed")))
}

impl Session<'_> {
    pub(super) fn peer_is_ours(&self) -> bool {
        self.peer_version.as_ref().is_some_and(|v| v.rperftest)
    }

    /// SEND server: distinct receive buffers, at most 32 MiB of them.
    pub(super) fn recv_bufs(&self) -> usize {
        (self.cfg.rx_depth as usize)
            .min(self.cfg.iters as usize)
            .min((32 << 20) / slot_step(self.cfg.size, self.sys))
            .max(1)
    }

    pub(super) fn step(&mut self, step: Step) -> Result<(), PerftestError> {
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
                // Ours is at most our port's active MTU.
                let ours = self.dev.as_ref().map_or(cfg.mtu, |d| d.path_mtu(cfg.mtu));
                let theirs = self.link.swap(&mtu_field(ours), 2, "MTUs")?;
                self.mtu = agree_mtu(ours, [theirs[0], theirs[1]]);
                // Resources exist from here, sized for the agreed walk.
                self.open_nic()?;
            }
            Step::Dest => {
                let m = *need(&self.mine, "our dest")?;
                let d = if cfg.rdma_cm {
                    let theirs = self.link.swap(&m.to_bin(), DEST_BIN_LEN, "QP addresses")?;
                    Dest::from_bin(&theirs)?
                } else {
                    let theirs = self.link.swap(&m.to_msg(), DEST_LEN, "QP addresses")?;
                    Dest::from_msg(&theirs)?
                };
                if self.peer.is_none() {
                    // With RDMA CM perftest checks no GID types (the CM
                    // found the path; an iWARP GID is no address).
                    if !cfg.rdma_cm && d.gid.is_ipv4_mapped() != m.gid.is_ipv4_mapped() {
                        return Err(bad(format!(
                            "GID types differ (ours {}, the peer's {}): use an IPv4 GID on both sides (-x)",
                            m.gid, d.gid
                        )));
                    }
                    self.peer = Some(d);
                }
            }
            Step::Fence => {
                self.link.swap(
                    &[0u8; DEST_BIN_LEN],
                    DEST_BIN_LEN,
                    "the fence around the test's RDMA CM connection",
                )?;
            }
            Step::CmConnect => {
                let n = need(&self.nic, "the NIC")?;
                n.init(cfg.verb)?;
                let Chan::Cm(l) = &mut self.link.chan else {
                    return Err(bad("internal: an RDMA CM step without RDMA CM"));
                };
                l.connect_test(cfg, n)?;
            }
            Step::Connect => {
                let (m, d) = (
                    *need(&self.mine, "our dest")?,
                    *need(&self.peer, "the peer's dest")?,
                );
                // With RDMA CM the CM connected the QP already.
                if !cfg.rdma_cm {
                    need(&self.nic, "the NIC")?.connect(cfg.verb, &m, &d, self.mtu)?;
                }
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
                        let Some(r) = LatReport::from_posts(cfg.size as u64, &p) else {
                            if cfg.stop.load(Ordering::Relaxed) {
                                println!(" ({} messages: too few for a latency report)", p.len());
                                return Ok(());
                            }
                            return Err(PerftestError::Transfer(format!(
                                "{} messages are too few for a latency report",
                                p.len()
                            )));
                        };
                        println!("{}", r.line());
                        self.latency = Some(r);
                        return Ok(());
                    }
                    BwReport::from_times(cfg.size as u64, &p, &c, cfg.report_gbits)
                } else if let Some(rx) = self.receiver.as_mut() {
                    let (secs, got) = rx.run(n, cfg, self.sys, ours, &mut self.verified)?;
                    // perftest times a SEND server from its first receive
                    // to its last and computes no peak.
                    BwReport::from_span(cfg.size as u64, got, secs, cfg.report_gbits)
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
                let ours = self.peer_is_ours();
                match &mut self.link.chan {
                    // perftest writes "done" and closes without reading;
                    // read the peer's so neither side sees a reset.
                    Chan::Tcp(s) => {
                        let _ = s.write_all(b"done\0");
                        let mut tail = [0u8; 5];
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let _ = s.read_exact(&mut tail);
                    }
                    Chan::Cm(l) => l.finish(self.link.client, ours, cfg.timeout),
                }
            }
        }
        Ok(())
    }

    pub(super) fn open_nic(&mut self) -> Result<(), PerftestError> {
        let cfg = self.cfg;
        let target = if cfg.verb == Verb::Send && !self.link.client {
            self.recv_bufs() * slot_step(cfg.size, self.sys)
        } else {
            0
        };
        let dev = self
            .dev
            .take()
            .ok_or_else(|| bad("internal: the NIC was opened twice"))?;
        let n = Nic::open(cfg, dev, self.sys, target)?;
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

    pub(super) fn print_header(&self, m: &Dest, d: &Dest) {
        let cfg = self.cfg;
        println!("{RESULT_LINE}");
        println!("                    {}", cfg.title());
        println!(
            " Connection type : RC\t\tDevice         : {}",
            need(&self.nic, "the NIC").map_or("?", |n| n.dev.name())
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
