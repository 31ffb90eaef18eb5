//! GSI QPs (QP1) on an rdma-core device: the kernel owns the device's
//! QP1, so a GSI QP here is the port's user MAD file (`sys::umad`), and
//! the access layer's CM agent, DM agent and SA client run over it as
//! over any QP1.
//!
//! - A **send** is one MAD gathered from the consumer's MRs and written
//!   with a header addressed from the WR's AH (LID, and on RoCE the GRH
//!   the kernel needs: destination GID, our GID's device index, hop
//!   limit). It goes through a kernel agent of its class and version: the
//!   one registered to serve them for a response, else (and for requests)
//!   a client agent registered on first use. A request waits in the
//!   kernel for its response for [`KERNEL_WAIT_MS`] and is never resent
//!   by the kernel: the access layer resends (`rdma_access::gsi`), each
//!   send under a transaction ID of its own (`umad::TidMap`), since the
//!   kernel refuses a second send of an ID still waiting and puts its own
//!   agent number in the ID's upper half; the response gets the access
//!   layer's ID back. Its completion is immediate, and a signaled one
//!   waits in the CQ ahead of the device's (`cq`).
//! - A **receive** is a MAD the kernel hands this file: one for a class
//!   the consumer serves ([`RdmaCore::gsi_register`]: a kernel agent
//!   with those methods), or a response to one of our requests. It fills
//!   the next posted receive as a NIC would (40 bytes that name the
//!   sender, `rdma_access::ud_grh`, then the MAD) on the CA's event
//!   thread, which polls the file with the CQs' channels.
//!
//! What it refuses: a CM MAD (the kernel's CM owns the class; connections
//! go through RDMA CM, `crate::cm`, so [`RdmaCore::gsi_listen`] is
//! refused and the CM class is never registered), and on a RoCE port an
//! SA MAD: there is no subnet administrator there ([`NO_SA_ON_ROCE`]).

use super::ca::CaRt;
use super::cq::CqRt;
use super::objects::{Obj, State};
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys::{self, umad::UmadFile};
use crate::umad::{Grh, TidMap, UmadHeader, HDR_LEN};
use rdma_types::{Gid, QpState, Qpn, WcOpcode, WcStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::{
    Context, PdHandle, QpAttr, QpHandle, QpInit, RecvWr, ResourceKind, Result, SendWr, Sge,
    VerbsError, WcFlags, WorkCompletion,
};

/// A MAD's size (RMPP segments are MADs too; the kernel does no RMPP
/// for our agents).
const MAD: usize = 256;

/// How long the kernel keeps a request of ours waiting for its response.
/// Longer than the access layer's usual wait (its resends go out under
/// new IDs meanwhile, see the module docs), short enough that a file
/// holds few of them.
pub(crate) const KERNEL_WAIT_MS: u32 = 2000;

/// Subnet administration.
const SA_CLASS: u8 = 0x03;
/// Communication management.
const CM_CLASS: u8 = 0x07;

/// What a query of the SA on a RoCE port is told.
pub const NO_SA_ON_ROCE: &str = "no subnet administrator on a RoCE port; give the target's GID/IP";

/// A receive posted to a GSI QP: where its bytes go, resolved at post.
struct Recv {
    wr_id: u64,
    /// Each SGE's MR, the offset into its buffer, and the length.
    sges: Vec<(Arc<sys::Mr>, usize, usize)>,
}

struct GsiState {
    state: QpState,
    pkey_index: u16,
    recvs: VecDeque<Recv>,
    /// Kernel agents serving requests, by class and version.
    servers: HashMap<(u8, u8), u32>,
    /// Kernel agents that only send requests, by class and version.
    clients: HashMap<(u8, u8), u32>,
    tids: TidMap,
    /// Peers reached by their link-local GID in place of the IPv4 one
    /// the consumer named (see [`GsiRt::route`]): link-local to IPv4.
    peers: HashMap<Gid, Gid>,
    /// MADs dropped for want of a posted receive.
    overruns: u64,
}

/// One GSI QP: its port's user MAD file and what is posted to it.
pub(crate) struct GsiRt {
    file: UmadFile,
    pub(super) ctx: Context,
    roce: bool,
    /// The port it is QP1 of.
    port: u8,
    /// The device index of the port's IPv6 RoCE v2 GID (RoCE only).
    v6_sgid: Option<u8>,
    sig_all: bool,
    pub(super) send_cq: Arc<CqRt>,
    pub(super) recv_cq: Arc<CqRt>,
    st: Mutex<GsiState>,
    /// The file failed (the device went away): the event thread leaves
    /// it out.
    pub(super) broken: std::sync::atomic::AtomicBool,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn bad_wr(index: usize, cause: VerbsError) -> VerbsError {
    VerbsError::BadWr {
        index,
        cause: Box::new(cause),
    }
}

impl GsiRt {
    /// Where a MAD to `attr`'s GID goes, and from which of our GIDs. On
    /// RoCE a peer named by IPv4 address is sent to by its IPv6
    /// link-local GID (from the ARP entry its AH's creation made), from
    /// ours: the kernel pairs a response with its request by GRH, which
    /// RoCEv2 over IPv4 lacks (`umad::neighbour_link_local`), and what
    /// comes back from that GID is reported as from the IPv4 one. A peer
    /// named by an IPv6 GID is answered from our IPv6 GID.
    fn route(&self, st: &mut GsiState, mut attr: verbs::AhAttr, sgid: u8) -> (verbs::AhAttr, u8) {
        let Some(v6) = self.v6_sgid.filter(|_| self.roce) else {
            return (attr, sgid);
        };
        let Some(v4) = attr.dgid.to_ipv4().filter(|_| attr.dgid.is_ipv4_mapped()) else {
            return (attr, v6);
        };
        let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        match crate::umad::neighbour_link_local(&arp, v4) {
            Some(ll) => {
                if st.peers.len() >= TidMap::CAP {
                    st.peers.clear();
                }
                st.peers.insert(ll, attr.dgid);
                attr.dgid = ll;
                (attr, v6)
            }
            None => {
                tracing::debug!(peer = %v4, "no ARP entry: a MAD goes by IPv4, its response may be dropped");
                (attr, sgid)
            }
        }
    }

    /// The descriptor the event thread polls.
    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.file.fd()
    }

    /// The kernel agent that sends a MAD of `class`/`version`: the
    /// serving one for a response, else the client (registered now if
    /// need be).
    fn agent_for(&self, st: &mut GsiState, class: u8, version: u8, response: bool) -> Result<u32> {
        if response {
            if let Some(a) = st.servers.get(&(class, version)) {
                return Ok(*a);
            }
        }
        if let Some(a) = st.clients.get(&(class, version)) {
            return Ok(*a);
        }
        let a = self
            .file
            .register(class, version, &[])
            .map_err(|e| convert::error("register a MAD agent", e))?;
        st.clients.insert((class, version), a);
        Ok(a)
    }

    /// Reads every MAD waiting into posted receives (called on the
    /// event thread); whether the receive CQ's handler must hear.
    pub(super) fn drain(&self) -> bool {
        let mut buf = vec![0u8; HDR_LEN + MAD];
        let mut fired = false;
        // Bounded: at most this many MADs per wake-up; the rest keep the
        // descriptor readable for the next round.
        for _ in 0..256 {
            let n = match self.file.recv(&mut buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(file = self.file.path(), "read a MAD: {e}");
                    self.broken
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            };
            let Some(h) = UmadHeader::parse(&buf[..n]) else {
                continue;
            };
            if h.status != 0 {
                // A request of ours whose response did not come within
                // the kernel's wait: the access layer resends or gives up.
                tracing::debug!(
                    file = self.file.path(),
                    "a request timed out in the kernel (status {})",
                    h.status
                );
                continue;
            }
            let mut mad = buf[HDR_LEN..n].to_vec();
            if mad.len() < 24 {
                continue;
            }
            let mut st = guard(&self.st);
            if mad[3] & 0x80 != 0 {
                let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap_or_default());
                mad[8..16].copy_from_slice(&st.tids.restore(tid).to_be_bytes());
            }
            let Some(r) = st.recvs.pop_front() else {
                st.overruns += 1;
                continue;
            };
            let pkey_index = h.pkey_index;
            let sgid = h.grh.map_or(Gid([0; 16]), |g| g.gid);
            let sgid = st.peers.get(&sgid).copied().unwrap_or(sgid);
            drop(st);
            let mut bytes = rdma_access::ud_grh(sgid).to_vec();
            bytes.extend_from_slice(&mad);
            let room: usize = r.sges.iter().map(|s| s.2).sum();
            let status = if room < bytes.len() {
                WcStatus::LocLenErr
            } else {
                let mut at = 0;
                for (mr, off, len) in &r.sges {
                    let k = (*len).min(bytes.len() - at);
                    mr.buf().write_at(*off, &bytes[at..at + k]);
                    at += k;
                }
                WcStatus::Success
            };
            let mut wc = WorkCompletion::new(r.wr_id, status, WcOpcode::Recv, self.ctx);
            if status == WcStatus::Success {
                wc.byte_len = bytes.len() as u32;
            }
            wc.src_qp = Qpn::from_bits(h.qpn);
            wc.pkey_index = pkey_index;
            wc.wc_flags = WcFlags::GRH;
            fired |= self.recv_cq.push_soft(wc);
        }
        fired
    }
}

/// The header a MAD goes out with through kernel agent `agent`: to the
/// AH's address (a GRH whenever the AH has one, and always on RoCE, where
/// the kernel resolves the peer's MAC from it; our GID is `sgid`, the
/// device's index), to the WR's QP and Q_Key, in partition `pkey_index`;
/// a request waits [`KERNEL_WAIT_MS`] for its response, which the kernel
/// never resends.
fn send_header(
    agent: u32,
    attr: &verbs::AhAttr,
    sgid: u8,
    roce: bool,
    ud: &verbs::UdDest,
    pkey_index: u16,
    response: bool,
) -> UmadHeader {
    UmadHeader {
        agent,
        status: 0,
        timeout_ms: if response { 0 } else { KERNEL_WAIT_MS },
        retries: 0,
        length: 0,
        qpn: ud.remote_qpn.value(),
        qkey: ud.remote_qkey.0,
        lid: attr.dlid.0,
        sl: attr.sl,
        grh: (attr.grh || roce).then_some(Grh {
            gid: attr.dgid,
            gid_index: sgid,
            // A hop limit of 0 would be an IP TTL of 0 on RoCEv2.
            hop_limit: attr.hop_limit.max(1),
            traffic_class: 0,
            flow_label: 0,
        }),
        pkey_index,
    }
}

impl RdmaCore {
    /// Creates a GSI QP: the user MAD file of its port.
    pub(super) fn create_gsi(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        let port = init.port.map_or(1, |p| p.0);
        let (rt, scq, rcq) = {
            let st = self.lock();
            let p = st.pd(pd)?;
            let (ca, _) = st.pd_of(p);
            let scq = st.cq_rt(st.cq(init.send_cq)?);
            let rcq = st.cq_rt(st.cq(init.recv_cq)?);
            (st.rt(ca), scq, rcq)
        };
        rt.check_port(port)?;
        let roce = rt.is_roce(port)?;
        let v6_sgid = if roce { rt.mad_gid_index(port)? } else { None };
        let file = UmadFile::open(rt.dev.name(), port)
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        let gsi = Arc::new(GsiRt {
            file,
            ctx,
            roce,
            port,
            v6_sgid,
            sig_all: init.sq_sig_all,
            send_cq: scq,
            recv_cq: rcq,
            st: Mutex::new(GsiState {
                state: QpState::Reset,
                pkey_index: 0,
                recvs: VecDeque::new(),
                servers: HashMap::new(),
                clients: HashMap::new(),
                tids: TidMap::default(),
                peers: HashMap::new(),
                overruns: 0,
            }),
            broken: std::sync::atomic::AtomicBool::new(false),
        });
        let h = {
            let mut st = self.lock();
            let p = st.pd(pd)?;
            let s = st.cq(init.send_cq)?;
            let r = st.cq(init.recv_cq)?;
            let ca = st.pd_of(p).0;
            // One QP1 per port (IBA 10.2.5), per open of the CA here.
            let taken = st.objs.iter().any(
                |(_, o)| matches!(o, Obj::Gsi { ca: c, gsi, .. } if *c == ca && gsi.port == port),
            );
            if taken {
                return Err(VerbsError::Busy(
                    "this CA open has a GSI QP on the port already",
                ));
            }
            for i in [p, s, r] {
                st.adjust(i, 1);
            }
            st.insert(
                Obj::Gsi {
                    ca,
                    pd: p,
                    send_cq: s,
                    recv_cq: r,
                    gsi: gsi.clone(),
                },
                None,
            )
        };
        rt.gsi_list().push(gsi);
        rt.waker.wake();
        Ok(QpHandle(h))
    }

    /// The GSI QP behind `qp`, if it is one.
    pub(super) fn gsi_of(&self, qp: QpHandle) -> Option<(Arc<GsiRt>, Arc<CaRt>)> {
        let st = self.lock();
        let i = st.gsi(qp).ok()?;
        match st.obj(i) {
            Obj::Gsi { gsi, ca, .. } => Some((gsi.clone(), st.rt(*ca))),
            _ => None,
        }
    }

    pub(super) fn modify_gsi(g: &GsiRt, attr: &QpAttr) {
        let mut st = guard(&g.st);
        if let Some(s) = attr.state {
            st.state = s;
            if s == QpState::Reset || s == QpState::Err {
                // IBA 10.3.1: receives are flushed; none completes here.
                st.recvs.clear();
            }
        }
        if let Some(i) = attr.pkey_index {
            st.pkey_index = i;
        }
    }

    pub(super) fn query_gsi(g: &GsiRt) -> QpAttr {
        let st = guard(&g.st);
        QpAttr {
            state: Some(st.state),
            pkey_index: Some(st.pkey_index),
            qkey: Some(rdma_types::Qkey::GSI),
            ..Default::default()
        }
    }

    pub(super) fn destroy_gsi(&self, qp: QpHandle) -> Result<()> {
        let (rt, gsi) = {
            let mut st = self.lock();
            let i = st.gsi(qp)?;
            let (ca, pd, s, r, gsi) = match st.remove(i, None) {
                Some(Obj::Gsi {
                    ca,
                    pd,
                    send_cq,
                    recv_cq,
                    gsi,
                }) => (ca, pd, send_cq, recv_cq, gsi),
                _ => unreachable!("checked GSI QP"),
            };
            for j in [pd, s, r] {
                st.adjust(j, -1);
            }
            (st.rt(ca), gsi)
        };
        rt.gsi_list().retain(|x| !Arc::ptr_eq(x, &gsi));
        rt.waker.wake();
        let ctx = gsi.ctx;
        // The file (and the kernel's agents on it) closes when the event
        // thread lets go too.
        drop(gsi);
        super::events::retire(&rt, qp.0, ResourceKind::Qp, ctx);
        Ok(())
    }

    /// The MR of `s` on CA slot `ca`, and the offset of its bytes in the
    /// MR's buffer.
    fn sge_place(st: &State, ca: usize, s: &Sge) -> Option<(Arc<sys::Mr>, usize)> {
        st.objs.iter().find_map(|(_, o)| match o {
            Obj::Mr { ca: c, mr, .. }
                if *c == ca && mr.lkey() == s.lkey.0 && mr.covers(s.addr, s.length.into()) =>
            {
                Some((mr.clone(), (s.addr - mr.buf().addr()) as usize))
            }
            _ => None,
        })
    }

    fn gsi_ca(&self, qp: QpHandle) -> Result<usize> {
        let st = self.lock();
        match st.obj(st.gsi(qp)?) {
            Obj::Gsi { ca, .. } => Ok(*ca),
            _ => unreachable!("checked GSI QP"),
        }
    }

    pub(super) fn gsi_post_recv(&self, qp: QpHandle, g: &GsiRt, wrs: &[RecvWr]) -> Result<()> {
        let ca = self.gsi_ca(qp)?;
        let mut resolved = Vec::with_capacity(wrs.len());
        {
            let st = self.lock();
            for (i, wr) in wrs.iter().enumerate() {
                let mut sges = Vec::with_capacity(wr.sges.len());
                for s in &wr.sges {
                    let (mr, off) = Self::sge_place(&st, ca, s).ok_or_else(|| {
                        bad_wr(
                            i,
                            bad(format!(
                                "a receive's buffer at {:#x} (+{}) lies in no MR of L_Key {:#x}",
                                s.addr, s.length, s.lkey.0
                            )),
                        )
                    })?;
                    sges.push((mr, off, s.length as usize));
                }
                resolved.push(Recv {
                    wr_id: wr.wr_id,
                    sges,
                });
            }
        }
        let mut st = guard(&g.st);
        if st.state == QpState::Reset {
            return Err(VerbsError::InvalidState(st.state));
        }
        st.recvs.extend(resolved);
        Ok(())
    }

    pub(super) fn gsi_post_send(
        &self,
        qp: QpHandle,
        g: &GsiRt,
        rt: &CaRt,
        wrs: &[SendWr],
    ) -> Result<()> {
        let ca = self.gsi_ca(qp)?;
        for (i, wr) in wrs.iter().enumerate() {
            let Some(ud) = wr.ud else {
                return Err(bad_wr(i, bad("a GSI send names its destination (UD)")));
            };
            let (mut mad, attr, sgid) = {
                let st = self.lock();
                let (attr, sgid) = match st.ah(ud.ah).map(|a| st.obj(a)) {
                    Ok(Obj::Ah { attr, sgid, .. }) => (*attr, *sgid),
                    _ => return Err(bad_wr(i, VerbsError::InvalidHandle)),
                };
                let mut mad = Vec::with_capacity(MAD);
                for s in &wr.sges {
                    let Some((mr, off)) = Self::sge_place(&st, ca, s) else {
                        return Err(bad_wr(
                            i,
                            bad(format!(
                                "a GSI send's data at {:#x} (+{}) lies in no MR of L_Key {:#x}",
                                s.addr, s.length, s.lkey.0
                            )),
                        ));
                    };
                    let mut b = vec![0; s.length as usize];
                    mr.buf().read_at(off, &mut b);
                    mad.extend_from_slice(&b);
                }
                (mad, attr, sgid)
            };
            if mad.len() < 24 || mad.len() > MAD {
                return Err(bad_wr(
                    i,
                    bad(format!("a MAD is 24 to {MAD} bytes, not {}", mad.len())),
                ));
            }
            let (class, version, response) = (mad[1], mad[2], mad[3] & 0x80 != 0);
            if class == CM_CLASS {
                return Err(bad_wr(
                    i,
                    bad("the kernel's CM owns the CM class on an rdma-core device: connect by RDMA CM"),
                ));
            }
            if class == SA_CLASS && g.roce {
                return Err(bad_wr(i, bad(NO_SA_ON_ROCE)));
            }
            let mut out = vec![0u8; HDR_LEN + mad.len()];
            {
                let mut st = guard(&g.st);
                if st.state != QpState::Rts {
                    return Err(bad_wr(i, VerbsError::InvalidState(st.state)));
                }
                let agent = g
                    .agent_for(&mut st, class, version, response)
                    .map_err(|e| bad_wr(i, e))?;
                if !response {
                    let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap_or_default());
                    let wire = st.tids.sent(tid);
                    mad[8..16].copy_from_slice(&wire.to_be_bytes());
                }
                let pkey_index = wr.pkey_index.unwrap_or(st.pkey_index);
                let (attr, sgid) = g.route(&mut st, attr, sgid);
                send_header(agent, &attr, sgid, g.roce, &ud, pkey_index, response).emit(&mut out);
            }
            out[HDR_LEN..].copy_from_slice(&mad);
            g.file
                .send(&out)
                .map_err(|e| bad_wr(i, convert::error("send a MAD", e)))?;
            if g.sig_all || wr.flags.contains(verbs::SendFlags::SIGNALED) {
                let wc = WorkCompletion::new(wr.wr_id, WcStatus::Success, WcOpcode::Send, g.ctx);
                if g.send_cq.push_soft(wc) {
                    // The handler hears on the event thread, never in a verb.
                    g.send_cq.note_soft_fired();
                    rt.waker.wake();
                }
            }
        }
        Ok(())
    }

    pub(super) fn gsi_serve(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        let Some((g, _)) = self.gsi_of(qp) else {
            // Not a GSI QP of ours: nothing is shared, nothing to tell.
            return Ok(());
        };
        if class == CM_CLASS {
            // The kernel's CM serves it; connections go through RDMA CM.
            return Ok(());
        }
        let mut st = guard(&g.st);
        if let Some(old) = st.servers.remove(&(class, version)) {
            let _ = g.file.unregister(old);
        }
        if serve {
            let a = g.file.register(class, version, methods).map_err(|e| match e.0 {
                libc::EINVAL | libc::EBUSY => VerbsError::Busy(
                    "another process serves this management class on the port (ib_umad refused the registration)",
                ),
                _ => convert::error("register a MAD agent", e),
            })?;
            st.servers.insert((class, version), a);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{Lid, Qkey};

    fn ud() -> verbs::UdDest {
        verbs::UdDest {
            ah: verbs::AhHandle(verbs::Handle {
                index: 0,
                generation: 0,
            }),
            remote_qpn: Qpn::GSI,
            remote_qkey: Qkey::GSI,
        }
    }

    /// What the access layer's CM agent asks for a RoCE peer
    /// (`AhAttr::roce`) becomes a header addressed by GID, with our GID's
    /// device index; a request waits in the kernel, a response does not.
    #[test]
    fn a_roce_peer_is_addressed_by_gid_and_only_requests_wait() {
        let peer = Gid::from_ip([10, 77, 0, 11].into());
        let attr = verbs::AhAttr::roce(peer);
        let h = send_header(4, &attr, 1, true, &ud(), 0, false);
        assert_eq!((h.agent, h.qpn, h.qkey, h.lid), (4, 1, 0x8001_0000, 0));
        assert_eq!((h.timeout_ms, h.retries), (KERNEL_WAIT_MS, 0));
        let g = h.grh.expect("RoCE needs a GRH");
        assert_eq!((g.gid, g.gid_index, g.hop_limit), (peer, 1, 64));
        let r = send_header(4, &attr, 1, true, &ud(), 3, true);
        assert_eq!((r.timeout_ms, r.pkey_index), (0, 3));
        // On RoCE a GRH even when the AH has none; TTL never 0.
        let bare = verbs::AhAttr {
            grh: false,
            hop_limit: 0,
            ..attr
        };
        let g = send_header(4, &bare, 0, true, &ud(), 0, false).grh.unwrap();
        assert_eq!(g.hop_limit, 1);
        // On InfiniBand a LID-routed peer goes without one.
        let ib = verbs::AhAttr {
            grh: false,
            dlid: Lid(7),
            ..attr
        };
        let h = send_header(4, &ib, 0, false, &ud(), 0, false);
        assert_eq!((h.lid, h.grh), (7, None));
    }
}
