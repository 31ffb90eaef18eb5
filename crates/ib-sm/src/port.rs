//! The subnet manager on a real port: [`SmPort`] carries the sans-IO
//! [`SubnetManager`]'s MADs over a verbs provider's QP0 (SMPs) and QP1 (SA
//! requests, Reports), with the clock. The other end is a node's port:
//! `rdma_access::IbNode`, its SMA driving the port through the verbs.
//!
//! The SM owns both special QPs of its CA (no other MAD agent can run on
//! that port); peers are named by GID, which on soft RoCE is the IP
//! address: the SM is told its nodes' addresses because UDP has no
//! switches to discover through. One thread drives it, calling
//! [`SmPort::step`]: each step waits for a completion or the SM's next
//! timer, at most the time it is given, then feeds what came and sends
//! what the SM queued.

use crate::sm::{QP_GSI, QP_SMI};
use crate::{SmConfig, SmEvent, SubnetManager};
use rdma_access::gsi::MadBytes;
use rdma_mad::mad::{Method, MgmtClass, MAD_SIZE};
use rdma_types::{Gid, Guid, Instant, PortNum, Qkey, QpType};
use rdma_types::{Qpn, WcOpcode, WcStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use verbs::{
    AhAttr, AhHandle, CaHandle, CqHandle, CqInit, MemBuf, MrInfo, PdHandle, Provider, QpHandle,
    RecvWr, SendOpcode, SendWr, Sge, UdDest, VerbsError, WorkCompletion,
};

/// The area in front of a UD receive (GRH, or on RoCEv2 the IP header).
const GRH: usize = 40;
const RECVS: u32 = 64;
const SENDS: u32 = 64;
const KIND_SEND: u64 = 1 << 56;
const KIND_SMI: u64 = 1 << 55;

/// Why the SM's port could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SM port: {what}: {err}")]
pub struct SmPortError {
    /// What was being done.
    pub what: &'static str,
    /// The provider's answer.
    pub err: VerbsError,
}

fn err(what: &'static str) -> impl FnOnce(VerbsError) -> SmPortError {
    move |err| SmPortError { what, err }
}

/// Counters of the port's MAD traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmPortStats {
    /// MADs received (both QPs).
    pub received: u64,
    /// MADs sent.
    pub sent: u64,
    /// Received on the wrong QP (an SMP on QP1 or the reverse), dropped.
    pub misrouted: u64,
}

/// A MAD as it crossed the port, for captures and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// QP 0 or 1.
    pub qp: u8,
    /// True if we sent it.
    pub sent: bool,
    /// The MAD.
    pub mad: Box<MadBytes>,
}

/// A verbs object made while opening, to destroy if a later step fails.
enum Undo {
    Pd(PdHandle),
    Cq(CqHandle),
    Qp(QpHandle),
    Mr(verbs::MrHandle),
}

struct Ring {
    qp: QpHandle,
    buf: MemBuf,
    mr: MrInfo,
}

/// The SM and SA on port 1 of one CA (see the module docs).
pub struct SmPort {
    provider: Arc<dyn Provider>,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    /// QP0 and QP1, by number.
    rings: [Ring; 2],
    send_buf: MemBuf,
    send_mr: MrInfo,
    free: Vec<u32>,
    backlog: VecDeque<(Gid, u8, Box<MadBytes>)>,
    ahs: HashMap<Gid, AhHandle>,
    gid: Gid,
    epoch: std::time::Instant,
    sm: SubnetManager<Gid>,
    stats: SmPortStats,
    log: Option<Vec<Logged>>,
}

/// A special QP of port 1 in RTS with its receive ring posted.
fn special(
    p: &Arc<dyn Provider>,
    pd: PdHandle,
    cq: CqHandle,
    qp_type: QpType,
    qkey: Qkey,
    tag: u64,
) -> Result<Ring, SmPortError> {
    let qp = rdma_access::special_qp(p, pd, cq, qp_type, qkey, PortNum(1))
        .map_err(err("bring a special QP to RTS"))?;
    let (buf, mr) = match rdma_access::recv_ring(p, pd) {
        Ok(r) => r,
        Err(e) => {
            let _ = p.destroy_qp(qp);
            return Err(err("register receive buffers")(e));
        }
    };
    let ring = Ring { qp, buf, mr };
    let wrs: Vec<RecvWr> = (0..RECVS).map(|i| ring.recv_wr(i, tag)).collect();
    if let Err(e) = p.post_recv(qp, &wrs) {
        let _ = p.destroy_qp(qp);
        let _ = p.dereg_mr(ring.mr.handle);
        return Err(err("post receives")(e));
    }
    Ok(ring)
}

impl Ring {
    fn recv_wr(&self, i: u32, tag: u64) -> RecvWr {
        rdma_access::recv_wr(&self.buf, &self.mr, i, tag)
    }
}

impl SmPort {
    /// Opens CA `guid` of `provider`, takes its QP0 and QP1, and starts an
    /// SM (`cfg`) for the ports at `nodes`; the first sweep starts at the
    /// first [`SmPort::step`].
    ///
    /// # Errors
    /// The CA cannot be opened, has no QP0 (a `roce` port), or a verb
    /// failed.
    pub fn open(
        provider: Arc<dyn Provider>,
        guid: Guid,
        cfg: SmConfig,
        nodes: &[Gid],
    ) -> Result<SmPort, SmPortError> {
        let p = &provider;
        let ca = p
            .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
            .map_err(err("open the CA"))?;
        // What exists so far, undone in reverse if a later step fails.
        let mut made: Vec<Undo> = Vec::new();
        let r = (|| {
            let port = p.query_port(ca, PortNum(1)).map_err(err("query port 1"))?;
            let gid = port.gids.first().copied().ok_or(SmPortError {
                what: "port GID",
                err: VerbsError::InvalidArgument("the port has no GID".into()),
            })?;
            let pd = p.alloc_pd(ca, 0).map_err(err("allocate a PD"))?;
            made.push(Undo::Pd(pd));
            let cqe = 2 * RECVS + SENDS + 1;
            let cq = p
                .create_cq(pd, &CqInit { cqe }, 0)
                .map_err(err("create the CQ"))?;
            made.push(Undo::Cq(cq));
            let smi = special(p, pd, cq, QpType::Smi, Qkey(0), KIND_SMI)?;
            made.extend([Undo::Qp(smi.qp), Undo::Mr(smi.mr.handle)]);
            let gsi = special(p, pd, cq, QpType::Gsi, Qkey::GSI, 0)?;
            made.extend([Undo::Qp(gsi.qp), Undo::Mr(gsi.mr.handle)]);
            // Where several processes share the port's QP1 (the NIC
            // daemon's), the SA's requests come to us only once asked for.
            let sa_methods = [
                Method::Get,
                Method::Set,
                Method::GetTable,
                Method::GetTraceTable,
                Method::GetMulti,
                Method::Delete,
            ]
            .map(u8::from);
            p.gsi_register(gsi.qp, MgmtClass::SubnAdm.into(), 2, &sa_methods, true)
                .map_err(err("serve the SA's requests at QP1"))?;
            let (send_buf, send_mr) =
                rdma_access::send_ring(p, pd).map_err(err("register send buffers"))?;
            Ok((gid, pd, cq, [smi, gsi], send_buf, send_mr))
        })();
        let (gid, pd, cq, rings, send_buf, send_mr) = match r {
            Ok(x) => x,
            Err(e) => {
                for u in made.into_iter().rev() {
                    let _ = match u {
                        Undo::Pd(h) => p.dealloc_pd(h),
                        Undo::Cq(h) => p.destroy_cq(h),
                        Undo::Qp(h) => p.destroy_qp(h),
                        Undo::Mr(h) => p.dereg_mr(h),
                    };
                }
                let _ = p.close_ca(ca);
                return Err(e);
            }
        };
        let epoch = std::time::Instant::now();
        let endpoints = nodes.iter().map(|g| (*g, *g)).collect();
        Ok(SmPort {
            sm: SubnetManager::new(cfg, endpoints, Instant::ZERO),
            provider,
            ca,
            pd,
            cq,
            rings,
            send_buf,
            send_mr,
            free: (0..SENDS).rev().collect(),
            backlog: VecDeque::new(),
            ahs: HashMap::new(),
            gid,
            epoch,
            stats: SmPortStats::default(),
            log: None,
        })
    }

    /// The SM's port GID: where its SA answers.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The subnet manager.
    pub fn sm(&self) -> &SubnetManager<Gid> {
        &self.sm
    }

    /// What the SM noticed since the last call.
    pub fn poll_event(&mut self) -> Option<SmEvent> {
        self.sm.poll_event()
    }

    /// Counters.
    pub fn stats(&self) -> SmPortStats {
        self.stats
    }

    /// Starts keeping every MAD sent and received (for a capture check).
    pub fn keep_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The MADs kept since [`SmPort::keep_log`].
    pub fn take_log(&mut self) -> Vec<Logged> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, std::time::Instant::now())
    }

    /// One round: waits at most `max_wait` for a MAD or the SM's next
    /// timer, handles what came and what is due, and sends what the SM
    /// queued. Bounded: at most one CQ's worth of completions.
    pub fn step(&mut self, max_wait: std::time::Duration) {
        let now = self.now();
        let wait = self
            .sm
            .poll_timeout()
            .map_or(max_wait, |t| t.saturating_since(now).to_std().min(max_wait));
        if !wait.is_zero() {
            // A timeout is no error here: the timers below are due then.
            let _ = self.provider.wait_cq(self.cq, wait);
        }
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        for _ in 0..(2 * RECVS + SENDS).div_ceil(32) {
            let n = self.provider.poll_cq(self.cq, &mut wcs).unwrap_or(0);
            for wc in &wcs[..n] {
                self.on_wc(wc);
            }
            if n < wcs.len() {
                break;
            }
        }
        let now = self.now();
        if self.sm.poll_timeout().is_some_and(|t| t <= now) {
            self.sm.handle_timeout(now);
        }
        self.flush();
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        if wc.wr_id & KIND_SEND != 0 {
            self.free.push((wc.wr_id & !KIND_SEND) as u32);
            return;
        }
        let qp = if wc.wr_id & KIND_SMI != 0 {
            QP_SMI
        } else {
            QP_GSI
        };
        let i = (wc.wr_id & 0xffff_ffff) as u32;
        if i >= RECVS {
            return;
        }
        let ring = &self.rings[usize::from(qp)];
        let off = i as usize * (GRH + MAD_SIZE);
        let bytes = (wc.status == WcStatus::Success && wc.byte_len as usize >= GRH + MAD_SIZE)
            .then(|| ring.buf.to_vec(off, GRH + MAD_SIZE));
        let tag = if qp == QP_SMI { KIND_SMI } else { 0 };
        let _ = self.provider.post_recv(ring.qp, &[ring.recv_wr(i, tag)]);
        let Some(bytes) = bytes else {
            return;
        };
        self.stats.received += 1;
        let mad = &bytes[GRH..];
        // SMPs (LID-routed 0x01, directed route 0x81) belong on QP0 only.
        if matches!(mad[1], 0x01 | 0x81) != (qp == QP_SMI) {
            self.stats.misrouted += 1;
            return;
        }
        if let Some(log) = self.log.as_mut() {
            let mut m = Box::new([0u8; MAD_SIZE]);
            m.copy_from_slice(mad);
            log.push(Logged {
                qp,
                sent: false,
                mad: m,
            });
        }
        let now = self.now();
        self.sm
            .handle_mad(now, rdma_access::source_gid(&bytes[..GRH]), qp, mad);
    }

    /// Sends what the SM queued, as send slots allow (the rest waits).
    fn flush(&mut self) {
        while let Some(o) = self.sm.poll_transmit() {
            self.backlog.push_back((o.to, o.qp, o.mad));
        }
        while let Some(&slot) = self.free.last() {
            let Some((peer, qp, mad)) = self.backlog.pop_front() else {
                break;
            };
            let ah = match self.ahs.get(&peer) {
                Some(a) => *a,
                None => match self.provider.create_ah(self.pd, &AhAttr::roce(peer)) {
                    Ok(a) => {
                        self.ahs.insert(peer, a);
                        a
                    }
                    Err(_) => continue,
                },
            };
            let (ring, qkey) = if qp == QP_SMI {
                (&self.rings[0], Qkey(0))
            } else {
                (&self.rings[1], Qkey::GSI)
            };
            let off = slot as usize * MAD_SIZE;
            self.send_buf.write_at(off, &mad[..]);
            let mut wr = SendWr::new(
                KIND_SEND | u64::from(slot),
                SendOpcode::Send,
                vec![Sge {
                    addr: self.send_buf.addr() + off as u64,
                    length: MAD_SIZE as u32,
                    lkey: self.send_mr.lkey,
                }],
            );
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: Qpn::from_bits(u32::from(qp)),
                remote_qkey: qkey,
            });
            if self.provider.post_send(ring.qp, &[wr]).is_ok() {
                self.free.pop();
                self.stats.sent += 1;
                if let Some(log) = self.log.as_mut() {
                    log.push(Logged {
                        qp,
                        sent: true,
                        mad,
                    });
                }
            }
        }
    }
}

impl Drop for SmPort {
    fn drop(&mut self) {
        let p = &self.provider;
        for (_, a) in self.ahs.drain() {
            let _ = p.destroy_ah(a);
        }
        for r in &self.rings {
            let _ = p.destroy_qp(r.qp);
            let _ = p.dereg_mr(r.mr.handle);
        }
        let _ = p.dereg_mr(self.send_mr.handle);
        let _ = p.destroy_cq(self.cq);
        let _ = p.dealloc_pd(self.pd);
        let _ = p.close_ca(self.ca);
    }
}
