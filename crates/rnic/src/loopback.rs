//! The in-process loopback fabric: CAs attached to one [`Fabric`], which
//! implements [`verbs::Provider`] for all of them.

use core::result::Result;
use rdma_types::{
    AccessFlags, Gid, Guid, IdMap, Lid, Mtu, Pkey, PortNum, Qkey, QpState, QpType, Qpn, Rkey,
    WcOpcode, WcStatus,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::kit;
use verbs::kit::cq::Cq;
use verbs::kit::handle_table::HandleTable;
use verbs::kit::keys::{KeyTable, Target};
use verbs::kit::qp_table;
use verbs::kit::rq::RecvQueue;
use verbs::*;

/// Size of the GRH placed before UD payloads in receive buffers (IBA 8.3).
pub const GRH_LEN: usize = 40;

/// Configuration of one port of a loopback CA.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// Base LID.
    pub lid: Lid,
    /// GID table entry 0.
    pub gid: Gid,
    /// P_Key table.
    pub pkeys: Vec<Pkey>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Initially active.
    pub active: bool,
}

/// Configuration of a loopback CA.
#[derive(Debug, Clone)]
pub struct CaConfig {
    /// Node GUID (used by `open_ca`).
    pub guid: Guid,
    /// Ports, numbered from 1.
    pub ports: Vec<PortConfig>,
}

impl CaConfig {
    /// A one-port CA with LID `lid`, GID from the default prefix, default
    /// P_Key, MTU 4096, port active.
    pub fn simple(guid: u64, lid: u16) -> CaConfig {
        CaConfig {
            guid: Guid(guid),
            ports: vec![PortConfig {
                lid: Lid(lid),
                gid: Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(guid)),
                pkeys: vec![Pkey::DEFAULT],
                mtu: Mtu::Mtu4096,
                active: true,
            }],
        }
    }

    /// Like [`CaConfig::simple`] with a second port (LID `lid + 0x100`, GID
    /// from port GUID `guid + 1`): room for an alternate path.
    pub fn dual_port(guid: u64, lid: u16) -> CaConfig {
        let mut c = CaConfig::simple(guid, lid);
        let mut p2 = c.ports[0].clone();
        p2.lid = Lid(lid.wrapping_add(0x100));
        p2.gid = Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(guid.wrapping_add(1)));
        c.ports.push(p2);
        c
    }
}

struct Device {
    guid: Guid,
    ports: Vec<PortAttr>,
    keys: KeyTable,
    /// QPN (special QPs: `port << 24 | qpn`) -> slot.
    qpns: IdMap<u32, usize>,
    next_qpn: u32,
    opens: Vec<usize>,
    removed: bool,
}

struct Qp {
    ca: usize,
    dev: usize,
    pd: usize,
    init: QpInit,
    send_cq: usize,
    recv_cq: usize,
    srq: Option<usize>,
    qpn: u32,
    state: QpState,
    attr: QpAttr,
    rq: RecvQueue,
    pending: VecDeque<SendWr>,
    ctx: u64,
    established: bool,
    /// Path migration state (the alternate path is `attr.alt_path`).
    mig: MigState,
}

enum Obj {
    Ca {
        dev: usize,
        handler: Arc<dyn EventHandler>,
        ctx: u64,
        children: u32,
    },
    Pd {
        ca: usize,
        ctx: u64,
        children: u32,
    },
    Cq {
        ca: usize,
        pd: usize,
        ctx: u64,
        cq: Arc<Cq>,
        users: u32,
    },
    Srq {
        ca: usize,
        pd: usize,
        ctx: u64,
        rq: RecvQueue,
        users: u32,
    },
    Qp(Box<Qp>),
    Ah {
        pd: usize,
        attr: AhAttr,
    },
    Mr {
        ca: usize,
        pd: usize,
        key: u32,
        ctx: u64,
    },
    Mw {
        ca: usize,
        pd: usize,
        key: u32,
        kind: MwType,
        ctx: u64,
    },
}

enum Cb {
    Completion(Arc<dyn EventHandler>, u64),
    Async(Arc<dyn EventHandler>, AsyncEvent),
    Destroyed(Arc<dyn EventHandler>, ResourceKind, u64),
}

#[derive(Default)]
struct State {
    devices: Vec<Device>,
    /// Every verbs object, behind its handle.
    objs: HandleTable<Obj>,
    /// Checked gather list of the WR being executed, kept between WRs so
    /// the data path allocates nothing; emptied after each WR (it holds
    /// buffer references).
    gather: Vec<(Target, usize)>,
    /// Checked scatter list of the receive WR being filled, likewise.
    scatter: Vec<(Target, usize)>,
}

/// The simulated fabric and its provider.
pub struct Fabric {
    state: Mutex<State>,
    cbq: Mutex<(VecDeque<Cb>, bool)>,
    lacks: Vec<verbs::Feature>,
}

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

impl State {
    fn alloc(&mut self, obj: Obj) -> Handle {
        self.objs.alloc(obj)
    }

    fn release(&mut self, i: usize) -> Option<Obj> {
        self.objs.release(i)
    }

    fn slot(&self, h: Handle) -> Result<usize, VerbsError> {
        self.objs.slot(h)
    }

    fn obj(&self, i: usize) -> &Obj {
        self.objs.get(i)
    }

    fn obj_mut(&mut self, i: usize) -> &mut Obj {
        self.objs.get_mut(i)
    }

    fn ca(&self, h: CaHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Ca { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn pd(&self, h: PdHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Pd { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn pd_ca(&self, pd: usize) -> usize {
        match self.obj(pd) {
            Obj::Pd { ca, .. } => *ca,
            _ => unreachable!(),
        }
    }

    fn ca_dev(&self, ca: usize) -> usize {
        match self.obj(ca) {
            Obj::Ca { dev, .. } => *dev,
            _ => unreachable!(),
        }
    }

    fn handler(&self, ca: usize) -> Arc<dyn EventHandler> {
        match self.obj(ca) {
            Obj::Ca { handler, .. } => handler.clone(),
            _ => unreachable!(),
        }
    }

    fn adjust_children(&mut self, i: usize, delta: i32) {
        match self.obj_mut(i) {
            Obj::Ca { children, .. } | Obj::Pd { children, .. } => {
                *children = children.wrapping_add_signed(delta)
            }
            Obj::Cq { users, .. } | Obj::Srq { users, .. } => {
                *users = users.wrapping_add_signed(delta)
            }
            _ => {}
        }
    }

    fn qp_idx(&self, h: QpHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Qp(_) => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn qp(&mut self, i: usize) -> &mut Qp {
        match self.obj_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!(),
        }
    }

    fn qpr(&self, i: usize) -> &Qp {
        match self.obj(i) {
            Obj::Qp(q) => q,
            _ => unreachable!(),
        }
    }

    fn cq_idx(&self, h: CqHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Cq { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn srq_idx(&self, h: SrqHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Srq { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn event(
        &self,
        ca: usize,
        kind: AsyncEventKind,
        ctx: u64,
        port: Option<PortNum>,
        out: &mut Vec<Cb>,
    ) {
        out.push(Cb::Async(self.handler(ca), AsyncEvent { kind, ctx, port }));
    }

    /// Pushes a completion; queues notify / overflow callbacks.
    fn complete(&self, cq: usize, wc: WorkCompletion, solicited: bool, out: &mut Vec<Cb>) {
        if let Obj::Cq { ca, ctx, cq, .. } = self.obj(cq) {
            let r = cq.push(wc, solicited);
            if r.notify {
                out.push(Cb::Completion(self.handler(*ca), *ctx));
            }
            if r.overflow {
                self.event(*ca, AsyncEventKind::CqError, *ctx, None, out);
            }
        }
    }

    fn device_of_port(&self, av: &AhAttr) -> Option<(usize, PortNum)> {
        for (d, dev) in self.devices.iter().enumerate() {
            if dev.removed {
                continue;
            }
            for p in &dev.ports {
                let hit = if av.grh {
                    p.gids.first() == Some(&av.dgid)
                } else {
                    p.lid == av.dlid
                };
                if hit {
                    return Some((d, p.port));
                }
            }
        }
        None
    }

    fn port_active(&self, dev: usize, port: PortNum) -> bool {
        self.devices[dev]
            .ports
            .get((port.0 as usize).wrapping_sub(1))
            .is_some_and(|p| p.state == PortState::Active)
    }

    fn qp_port(&self, q: &Qp) -> PortNum {
        q.init.port.or(q.attr.port).unwrap_or(PortNum(1))
    }

    /// Whether a path from local `port` of `dev` along `av` reaches an
    /// active port.
    fn path_up(&self, dev: usize, port: PortNum, av: &AhAttr) -> bool {
        self.port_active(dev, port)
            && self
                .device_of_port(av)
                .is_some_and(|(d, p)| self.port_active(d, p))
    }

    /// Makes the alternate path of `qi` its primary path (IBA 17.2.8): the
    /// QP is `Migrated` with no alternate, and its owner gets PathMigrated.
    fn migrate(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        let Some(alt) = q.attr.alt_path.take() else {
            return;
        };
        q.attr.av = Some(alt.av);
        q.attr.port = Some(alt.port);
        q.attr.pkey_index = Some(alt.pkey_index);
        if q.init.qp_type == QpType::Rc {
            q.attr.timeout = Some(alt.timeout);
        }
        q.mig = MigState::Migrated;
        q.attr.path_mig_state = Some(MigState::Migrated);
        let (ca, ctx) = (q.ca, q.ctx);
        self.event(ca, AsyncEventKind::PathMigrated, ctx, None, out);
    }

    /// Automatic migration of an armed QP whose primary path is down while
    /// its alternate is up (the loopback sees both ends of a path, so a
    /// failed path is known without waiting for retries to run out).
    fn migrate_if_failed(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qpr(qi);
        if q.mig != MigState::Armed {
            return;
        }
        let (Some(av), Some(alt)) = (q.attr.av, q.attr.alt_path) else {
            return;
        };
        let (dev, port) = (q.dev, self.qp_port(q));
        if !self.path_up(dev, port, &av) && self.path_up(dev, alt.port, &alt.av) {
            self.migrate(qi, out);
        }
    }

    /// Gathers/scatters: checks every SGE with `needs`, appending the
    /// targets to `into` (left empty on failure).
    fn sg(
        &self,
        dev: usize,
        pd: usize,
        sges: &[Sge],
        needs: AccessFlags,
        into: &mut Vec<(Target, usize)>,
    ) -> Result<(), WcStatus> {
        let keys = &self.devices[dev].keys;
        for s in sges.iter().filter(|s| s.length > 0) {
            match keys.local(pd as u32, s.lkey, s.addr, s.length as u64, needs) {
                Ok(t) => into.push((t, s.length as usize)),
                Err(e) => {
                    into.clear();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Runs `f` with the receive WR's checked scatter list (the reused
    /// `scatter` vector, emptied afterwards).
    fn with_scatter<T>(
        &mut self,
        dev: usize,
        pd: usize,
        sges: &[Sge],
        f: impl FnOnce(&mut State, Result<&[(Target, usize)], WcStatus>) -> T,
    ) -> T {
        let mut dst = std::mem::take(&mut self.scatter);
        let r = self.sg(dev, pd, sges, AccessFlags::LOCAL_WRITE, &mut dst);
        let out = f(self, r.map(|()| &dst[..]));
        dst.clear();
        self.scatter = dst;
        out
    }

    /// Moves a QP to ERR, flushing its send and receive queues.
    fn enter_error(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        if q.state == QpState::Err {
            return;
        }
        q.state = QpState::Err;
        let pending: Vec<SendWr> = q.pending.drain(..).collect();
        let recvs = q.rq.drain();
        let (scq, rcq, ctx) = (q.send_cq, q.recv_cq, q.ctx);
        for wr in pending {
            self.complete(
                scq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wc_opcode(wr.opcode), ctx),
                false,
                out,
            );
        }
        for wr in recvs {
            self.complete(
                rcq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, ctx),
                false,
                out,
            );
        }
    }

    /// Moves a UC/UD QP to SQE, flushing its send queue only.
    fn enter_sqe(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        q.state = QpState::Sqe;
        q.attr.state = Some(QpState::Sqe);
        let pending: Vec<SendWr> = q.pending.drain(..).collect();
        let (scq, ctx) = (q.send_cq, q.ctx);
        for wr in pending {
            self.complete(
                scq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wc_opcode(wr.opcode), ctx),
                false,
                out,
            );
        }
    }

    /// A responder error no receive completion reports (a bad RDMA or
    /// atomic request): the responder's QP goes to ERR and its owner gets
    /// an affiliated QpFatal (IBA 9.9.3.1: local access violation /
    /// invalid request work queue errors).
    fn responder_fatal(&mut self, pi: usize, out: &mut Vec<Cb>) {
        let (ca, ctx) = (self.qpr(pi).ca, self.qpr(pi).ctx);
        self.enter_error(pi, out);
        self.event(ca, AsyncEventKind::QpFatal, ctx, None, out);
    }

    fn take_recv(&mut self, qi: usize, out: &mut Vec<Cb>) -> Option<RecvWr> {
        match self.qpr(qi).srq {
            Some(si) => {
                let (wr, fire) = match self.obj_mut(si) {
                    Obj::Srq { rq, .. } => rq.take()?,
                    _ => return None,
                };
                if fire {
                    if let Obj::Srq { ca, ctx, .. } = self.obj(si) {
                        self.event(*ca, AsyncEventKind::SrqLimitReached, *ctx, None, out);
                    }
                }
                Some(wr)
            }
            None => self.qp(qi).rq.take().map(|(wr, _)| wr),
        }
    }

    /// Runs the send queue of `qi` as far as it goes.
    /// Runs the send queue of `qi` as far as it goes.
    fn progress(&mut self, qi: usize, out: &mut Vec<Cb>) {
        loop {
            let q = self.qp(qi);
            if q.state != QpState::Rts {
                return;
            }
            let Some(wr) = q.pending.pop_front() else {
                return;
            };
            if !self.run_one(qi, &wr, out) {
                self.qp(qi).pending.push_front(wr);
                return;
            }
        }
    }

    /// Executes one WR and completes it; false if it must wait (RNR).
    fn run_one(&mut self, qi: usize, wr: &SendWr, out: &mut Vec<Cb>) -> bool {
        let q = self.qpr(qi);
        let sig = q.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let (scq, ctx) = (q.send_cq, q.ctx);
        let rnr_retry = q.attr.rnr_retry.unwrap_or(0);
        let status = match self.execute(qi, wr, out) {
            Exec::Rnr if rnr_retry == 0 => Err(WcStatus::RnrRetryExcErr),
            Exec::Rnr => return false,
            Exec::Done(r) => r,
        };
        match status {
            Ok(byte_len) => {
                if sig {
                    let mut wc =
                        WorkCompletion::new(wr.wr_id, WcStatus::Success, wc_opcode(wr.opcode), ctx);
                    wc.byte_len = byte_len;
                    self.complete(scq, wc, false, out);
                }
            }
            Err(st) => {
                // An error completion moves an RC QP to ERR (IBA 10.8.3),
                // a UC/UD QP to SQE (IBA 10.3.1.6); both flush the sends
                // behind it. In SQE the receive queue keeps working.
                self.complete(
                    scq,
                    WorkCompletion::new(wr.wr_id, st, wc_opcode(wr.opcode), ctx),
                    false,
                    out,
                );
                if self.qpr(qi).init.qp_type == QpType::Rc {
                    self.enter_error(qi, out);
                } else {
                    self.enter_sqe(qi, out);
                }
            }
        }
        true
    }

    fn execute(&mut self, qi: usize, wr: &SendWr, out: &mut Vec<Cb>) -> Exec {
        let q = self.qpr(qi);
        let (dev, pd, qpn) = (q.dev, q.pd, q.qpn);
        // Local-only operations.
        match wr.opcode {
            SendOpcode::LocalInv => {
                return Exec::Done(
                    self.devices[dev]
                        .keys
                        .invalidate(pd as u32, wr.invalidate_rkey)
                        .map(|_| 0)
                        .map_err(|_| WcStatus::MwBindErr),
                )
            }
            SendOpcode::BindMw => {
                let Some(b) = wr.bind_mw else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (Ok(mwi), Ok(mri)) = (self.slot(b.mw.0), self.slot(b.mr.0)) else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (
                    Obj::Mw {
                        key: mwk,
                        kind: MwType::Type2,
                        ..
                    },
                    Obj::Mr { key: mrk, .. },
                ) = (self.obj(mwi), self.obj(mri))
                else {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                };
                let (mwk, mrk) = (*mwk, *mrk);
                if b.rkey.0 >> 8 != mwk >> 8 {
                    return Exec::Done(Err(WcStatus::MwBindErr));
                }
                let r = self.devices[dev].keys.bind_mw(
                    pd as u32,
                    mwk >> 8,
                    mrk >> 8,
                    b.addr,
                    b.len,
                    b.access,
                    b.rkey.0 as u8,
                    qpn,
                );
                if let (Ok(k), Obj::Mw { key, .. }) = (r, self.obj_mut(mwi)) {
                    *key = k;
                }
                return Exec::Done(r.map(|_| 0));
            }
            _ => {}
        }
        let needs_local = match wr.opcode {
            SendOpcode::RdmaRead | SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => {
                AccessFlags::LOCAL_WRITE
            }
            _ => AccessFlags::NONE,
        };
        let mut local = std::mem::take(&mut self.gather);
        let r = match self.sg(dev, pd, &wr.sges, needs_local, &mut local) {
            Ok(()) => self.transfer(qi, wr, &local, out),
            Err(e) => Exec::Done(Err(e)),
        };
        local.clear();
        self.gather = local;
        r
    }

    /// The part of `execute` that moves data: `local` is the WR's checked
    /// gather (or, for READ and atomics, scatter) list.
    fn transfer(
        &mut self,
        qi: usize,
        wr: &SendWr,
        local: &[(Target, usize)],
        out: &mut Vec<Cb>,
    ) -> Exec {
        if !self.qpr(qi).init.qp_type.is_datagram() {
            self.migrate_if_failed(qi, out);
        }
        let q = self.qpr(qi);
        let (dev, qpn, qt) = (q.dev, q.qpn, q.init.qp_type);
        let len: u64 = wr.total_len();
        let port = self.qp_port(self.qpr(qi));
        if !self.port_active(dev, port) {
            return Exec::Done(if qt == QpType::Rc {
                Err(WcStatus::RetryExcErr)
            } else {
                Ok(len as u32)
            });
        }
        if qt.is_datagram() {
            return Exec::Done(self.ud_send(qi, wr, local, out));
        }
        // Connected: find the peer.
        let q = self.qpr(qi);
        let (Some(av), Some(dq)) = (q.attr.av, q.attr.dest_qpn) else {
            return Exec::Done(Err(WcStatus::RetryExcErr));
        };
        let peer = self
            .device_of_port(&av)
            .filter(|(d, p)| self.port_active(*d, *p))
            .and_then(|(d, p)| Some((self.devices[d].qpns.get(&dq.value()).copied()?, p)))
            .filter(|&(pi, _)| {
                let p = self.qpr(pi);
                matches!(
                    p.state,
                    QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
                ) && p.attr.dest_qpn.map(|x| x.value()) == Some(qpn)
                    && p.init.qp_type == qt
            });
        if let Some((pi, at)) = peer {
            // MigReq (IBA 17.2.8, BTH:MigReq): a migrated requester that
            // reaches an armed responder on the responder's alternate path
            // makes the responder migrate too.
            let p = self.qpr(pi);
            let on_alt = p.attr.alt_path.is_some_and(|alt| {
                alt.port == at && self.device_of_port(&alt.av) == Some((dev, port))
            });
            if self.qpr(qi).mig == MigState::Migrated && p.mig == MigState::Armed && on_alt {
                self.migrate(pi, out);
            }
        }
        let Some((pi, _)) = peer else {
            return Exec::Done(if qt == QpType::Rc {
                Err(WcStatus::RetryExcErr)
            } else {
                Ok(len as u32)
            });
        };
        let mtu_ok = self.qpr(qi).attr.path_mtu.is_some();
        debug_assert!(mtu_ok);
        let (pdev, ppd, pctx, prcq, paccess) = {
            let p = self.qpr(pi);
            (
                p.dev,
                p.pd,
                p.ctx,
                p.recv_cq,
                p.attr.access.unwrap_or(AccessFlags::NONE),
            )
        };
        if self.qpr(pi).state == QpState::Rtr && !self.qpr(pi).established {
            self.qp(pi).established = true;
            let ca = self.qpr(pi).ca;
            self.event(ca, AsyncEventKind::CommEstablished, pctx, None, out);
        }
        let remote = |st: &State, needs: AccessFlags, l: u64| -> Result<Target, WcStatus> {
            if !paccess.contains(needs) {
                return Err(WcStatus::RemAccessErr);
            }
            st.devices[pdev].keys.remote(
                ppd as u32,
                wr.remote.rkey,
                wr.remote.addr,
                l,
                needs,
                dq.value(),
            )
        };
        let rc = qt == QpType::Rc;
        match wr.opcode {
            // Zero length: no memory touched, no key checked (as the soft
            // RoCE responder); SRP initiators send it as a liveness probe.
            SendOpcode::RdmaWrite if len == 0 => Exec::Done(Ok(0)),
            SendOpcode::RdmaWrite => match remote(self, AccessFlags::REMOTE_WRITE, len) {
                Ok(t) => {
                    copy_sg(local, &[(t, len as usize)]);
                    Exec::Done(Ok(len as u32))
                }
                Err(e) if rc => {
                    self.responder_fatal(pi, out);
                    Exec::Done(Err(e))
                }
                Err(_) => Exec::Done(Ok(len as u32)),
            },
            SendOpcode::RdmaRead => match remote(self, AccessFlags::REMOTE_READ, len) {
                Ok(t) => {
                    copy_sg(&[(t, len as usize)], local);
                    Exec::Done(Ok(len as u32))
                }
                Err(e) => {
                    self.responder_fatal(pi, out);
                    Exec::Done(Err(e))
                }
            },
            SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd => {
                if len != 8 || local.len() != 1 {
                    return Exec::Done(Err(WcStatus::LocLenErr));
                }
                if wr.remote.addr & 7 != 0 {
                    self.responder_fatal(pi, out);
                    return Exec::Done(Err(WcStatus::RemInvReqErr));
                }
                match remote(self, AccessFlags::REMOTE_ATOMIC, 8) {
                    Ok(t) => {
                        let (cmp, swap) = (wr.compare_add, wr.swap);
                        let old = if wr.opcode == SendOpcode::AtomicCmpSwp {
                            t.buf.atomic_u64(t.off, |v| if v == cmp { swap } else { v })
                        } else {
                            t.buf.atomic_u64(t.off, |v| v.wrapping_add(cmp))
                        };
                        local[0].0.buf.write_at(local[0].0.off, &old.to_ne_bytes());
                        Exec::Done(Ok(8))
                    }
                    Err(e) => {
                        self.responder_fatal(pi, out);
                        Exec::Done(Err(e))
                    }
                }
            }
            SendOpcode::RdmaWriteWithImm
            | SendOpcode::Send
            | SendOpcode::SendWithImm
            | SendOpcode::SendWithInv => {
                let target = if wr.opcode == SendOpcode::RdmaWriteWithImm {
                    match remote(self, AccessFlags::REMOTE_WRITE, len) {
                        Ok(t) => Some(t),
                        Err(e) if rc => {
                            self.responder_fatal(pi, out);
                            return Exec::Done(Err(e));
                        }
                        Err(_) => return Exec::Done(Ok(len as u32)),
                    }
                } else {
                    None
                };
                let Some(rwr) = self.take_recv(pi, out) else {
                    // RC: RNR NAK (IBA 9.7.5.2.8); UC: message dropped.
                    return if rc {
                        Exec::Rnr
                    } else {
                        Exec::Done(Ok(len as u32))
                    };
                };
                let mut wc =
                    WorkCompletion::new(rwr.wr_id, WcStatus::Success, WcOpcode::Recv, pctx);
                wc.byte_len = len as u32;
                wc.src_qp = Qpn::from_bits(qpn);
                let mut fail = None;
                if let Some(t) = target {
                    copy_sg(local, &[(t, len as usize)]);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                } else {
                    fail = self.with_scatter(pdev, ppd, &rwr.sges, |_, dst| match dst {
                        Ok(dst) if dst.iter().map(|d| d.1 as u64).sum::<u64>() >= len => {
                            copy_sg(local, dst);
                            None
                        }
                        Ok(_) => Some((WcStatus::LocLenErr, WcStatus::RemInvReqErr)),
                        Err(e) => Some((e, WcStatus::RemOpErr)),
                    });
                }
                if matches!(
                    wr.opcode,
                    SendOpcode::SendWithImm | SendOpcode::RdmaWriteWithImm
                ) {
                    wc.imm = wr.imm;
                    wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
                }
                if fail.is_none() && wr.opcode == SendOpcode::SendWithInv {
                    match self.devices[pdev]
                        .keys
                        .invalidate(ppd as u32, wr.invalidate_rkey)
                    {
                        Ok(()) => {
                            wc.invalidated_rkey = wr.invalidate_rkey;
                            wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
                        }
                        Err(_) => fail = Some((WcStatus::RemInvReqErr, WcStatus::RemInvReqErr)),
                    }
                }
                if let Some((resp, req)) = fail {
                    wc.status = resp;
                    self.complete(prcq, wc, true, out);
                    self.enter_error(pi, out);
                    return Exec::Done(Err(req));
                }
                self.complete(prcq, wc, wr.flags.contains(SendFlags::SOLICITED), out);
                Exec::Done(Ok(len as u32))
            }
            SendOpcode::LocalInv | SendOpcode::BindMw => unreachable!(),
        }
    }

    fn ud_send(
        &mut self,
        qi: usize,
        wr: &SendWr,
        local: &[(Target, usize)],
        out: &mut Vec<Cb>,
    ) -> Result<u32, WcStatus> {
        let len = wr.total_len();
        let q = self.qpr(qi);
        let (dev, qpn, own_qkey, port) = (
            q.dev,
            q.qpn,
            q.attr.qkey.unwrap_or(Qkey(0)),
            self.qp_port(q),
        );
        let Some(ud) = wr.ud else {
            return Err(WcStatus::LocQpOpErr);
        };
        let av = match self.slot(ud.ah.0).map(|i| self.obj(i)) {
            Ok(Obj::Ah { attr, .. }) => *attr,
            _ => return Err(WcStatus::LocQpOpErr),
        };
        let mtu = self.devices[dev].ports[port.0 as usize - 1].active_mtu;
        if len as usize > mtu.bytes() {
            return Err(WcStatus::LocLenErr);
        }
        let sport = &self.devices[dev].ports[port.0 as usize - 1];
        let (sgid, slid) = (sport.gids[0], sport.lid);
        let Some((pdev, pport)) = self
            .device_of_port(&av)
            .filter(|(d, p)| self.port_active(*d, *p))
        else {
            return Ok(len as u32);
        };
        let key = if ud.remote_qpn.value() <= 1 {
            (pport.0 as u32) << 24 | ud.remote_qpn.value()
        } else {
            ud.remote_qpn.value()
        };
        let Some(&pi) = self.devices[pdev].qpns.get(&key) else {
            return Ok(len as u32);
        };
        let p = self.qpr(pi);
        let qkey = if ud.remote_qkey.0 & 0x8000_0000 != 0 {
            own_qkey
        } else {
            ud.remote_qkey
        };
        if !p.init.qp_type.is_datagram()
            || !matches!(
                p.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            || p.attr.qkey != Some(qkey)
        {
            return Ok(len as u32); // silently dropped (IBA 10.2.4: Q_Key violation)
        }
        let (ppd, pctx, prcq, ppkey) = (p.pd, p.ctx, p.recv_cq, p.attr.pkey_index.unwrap_or(0));
        let dgid = self.devices[pdev].ports[pport.0 as usize - 1].gids[0];
        let Some(rwr) = self.take_recv(pi, out) else {
            return Ok(len as u32);
        };
        let mut wc = WorkCompletion::new(rwr.wr_id, WcStatus::Success, WcOpcode::Recv, pctx);
        self.with_scatter(pdev, ppd, &rwr.sges, |st, dst| match dst {
            Ok(dst) if dst.iter().map(|d| d.1).sum::<usize>() >= GRH_LEN + len as usize => {
                let mut grh = [0u8; GRH_LEN];
                grh[0] = 0x60; // IP version 6 (IBA 8.3.1)
                grh[4..6].copy_from_slice(&(len as u16).to_be_bytes());
                grh[6] = 0x1b; // next header: IBA transport
                grh[7] = av.hop_limit;
                grh[8..24].copy_from_slice(&sgid.0);
                grh[24..40].copy_from_slice(&dgid.0);
                let g = MemBuf::new(GRH_LEN);
                g.write_at(0, &grh);
                let mut src = vec![(Target { buf: g, off: 0 }, GRH_LEN)];
                src.extend(local.iter().cloned());
                copy_sg(&src, dst);
                wc.byte_len = (GRH_LEN as u64 + len) as u32;
                wc.src_qp = Qpn::from_bits(qpn);
                wc.slid = slid;
                wc.pkey_index = ppkey;
                wc.wc_flags = WcFlags::GRH;
                if wr.opcode == SendOpcode::SendWithImm {
                    wc.imm = wr.imm;
                    wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
                }
                st.complete(prcq, wc, wr.flags.contains(SendFlags::SOLICITED), out);
            }
            Ok(_) => {
                wc.status = WcStatus::LocLenErr;
                st.complete(prcq, wc, true, out);
            }
            Err(e) => {
                wc.status = e;
                st.complete(prcq, wc, true, out);
            }
        });
        Ok(len as u32)
    }

    fn progress_all(&mut self, out: &mut Vec<Cb>) {
        let waiting: Vec<usize> = self
            .objs
            .iter()
            .filter(|(_, o)| matches!(o, Obj::Qp(q) if !q.pending.is_empty() && q.state == QpState::Rts))
            .map(|(i, _)| i)
            .collect();
        for i in waiting {
            self.progress(i, out);
        }
    }
}

enum Exec {
    Done(Result<u32, WcStatus>),
    Rnr,
}

fn wc_opcode(op: SendOpcode) -> WcOpcode {
    match op {
        SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv => WcOpcode::Send,
        SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        SendOpcode::RdmaRead => WcOpcode::RdmaRead,
        SendOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
        SendOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
        SendOpcode::LocalInv => WcOpcode::LocalInv,
        SendOpcode::BindMw => WcOpcode::BindMw,
    }
}

/// Copies the gather list into the scatter list (which is long enough).
fn copy_sg(src: &[(Target, usize)], dst: &[(Target, usize)]) {
    let (mut di, mut doff) = (0, 0);
    for (s, slen) in src {
        let mut soff = 0;
        while soff < *slen {
            let (d, dlen) = &dst[di];
            let n = (slen - soff).min(dlen - doff);
            d.buf.copy_from(d.off + doff, &s.buf, s.off + soff, n);
            soff += n;
            doff += n;
            if doff == *dlen {
                di += 1;
                doff = 0;
            }
        }
    }
}

const MAX_QP_WR: u32 = 16384;
const MAX_SGE: u32 = 32;
const MAX_CQE: u32 = 1 << 20;

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Arc<Fabric> {
        Fabric::without(&[])
    }

    /// A fabric whose CAs lack `features` (memory windows, SRQ, atomics are
    /// honoured), answering `NotSupported` for them: models a smaller HCA
    /// and exercises the conformance suite's skip path.
    pub fn without(features: &[verbs::Feature]) -> Arc<Fabric> {
        Arc::new(Fabric {
            state: Mutex::new(State::default()),
            cbq: Mutex::new((VecDeque::new(), false)),
            lacks: features.to_vec(),
        })
    }

    fn lacks(&self, f: verbs::Feature) -> bool {
        self.lacks.contains(&f)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delivers callbacks in order without holding the state lock. A
    /// callback that calls back into the provider only queues.
    fn dispatch(&self, cbs: Vec<Cb>) {
        if cbs.is_empty() {
            // Nothing new: any queued callback has a running dispatcher.
            return;
        }
        let mut q = self.cbq.lock().unwrap_or_else(|e| e.into_inner());
        q.0.extend(cbs);
        if q.1 {
            return;
        }
        q.1 = true;
        while let Some(cb) = q.0.pop_front() {
            drop(q);
            match cb {
                Cb::Completion(h, ctx) => h.on_completion(ctx),
                Cb::Async(h, ev) => h.on_async_event(ev),
                Cb::Destroyed(h, k, ctx) => h.on_destroyed(k, ctx),
            }
            q = self.cbq.lock().unwrap_or_else(|e| e.into_inner());
        }
        q.1 = false;
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut State, &mut Vec<Cb>) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut out = Vec::new();
        let r = {
            let mut st = self.lock();
            f(&mut st, &mut out)
        };
        self.dispatch(out);
        r
    }

    /// Attaches a CA to the fabric.
    pub fn add_ca(&self, cfg: CaConfig) -> Result<(), VerbsError> {
        let mut st = self.lock();
        if st.devices.iter().any(|d| d.guid == cfg.guid && !d.removed) {
            return Err(VerbsError::Busy("a CA with this GUID is attached"));
        }
        let ports = cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| PortAttr {
                port: PortNum(i as u8 + 1),
                state: if p.active {
                    PortState::Active
                } else {
                    PortState::Down
                },
                max_mtu: Mtu::Mtu4096,
                active_mtu: p.mtu,
                lid: p.lid,
                sm_lid: Lid(1),
                gids: vec![p.gid],
                pkeys: p.pkeys.clone(),
            })
            .collect();
        st.devices.push(Device {
            guid: cfg.guid,
            ports,
            keys: KeyTable::new(),
            qpns: IdMap::default(),
            next_qpn: 2,
            opens: vec![],
            removed: false,
        });
        Ok(())
    }

    fn port_event(
        &self,
        guid: Guid,
        port: PortNum,
        f: impl FnOnce(&mut PortAttr) -> Option<AsyncEventKind>,
    ) -> Result<(), VerbsError> {
        self.with(|st, out| {
            let d = st
                .devices
                .iter()
                .position(|d| d.guid == guid && !d.removed)
                .ok_or(VerbsError::NoSuchCa)?;
            let p = st.devices[d]
                .ports
                .get_mut((port.0 as usize).wrapping_sub(1))
                .ok_or_else(|| bad("no such port"))?;
            if let Some(kind) = f(p) {
                for ca in st.devices[d].opens.clone() {
                    st.event(ca, kind, 0, Some(port), out);
                }
                if kind == AsyncEventKind::PortDown {
                    // A local port failure moves armed QPs to their
                    // alternate path at once (after the PortDown event).
                    let armed: Vec<usize> = st
                        .objs
                        .iter()
                        .filter(|(_, o)| {
                            matches!(o, Obj::Qp(q) if q.dev == d && q.mig == MigState::Armed)
                        })
                        .map(|(i, _)| i)
                        .collect();
                    for qi in armed {
                        st.migrate_if_failed(qi, out);
                    }
                }
            }
            st.progress_all(out);
            Ok(())
        })
    }

    /// Brings a port up or down (raises PortActive / PortDown).
    pub fn set_port_active(
        &self,
        guid: Guid,
        port: PortNum,
        active: bool,
    ) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            let new = if active {
                PortState::Active
            } else {
                PortState::Down
            };
            (p.state != new).then(|| {
                p.state = new;
                if active {
                    AsyncEventKind::PortActive
                } else {
                    AsyncEventKind::PortDown
                }
            })
        })
    }

    /// Changes a port's LID (raises LidChange).
    pub fn set_lid(&self, guid: Guid, port: PortNum, lid: Lid) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            p.lid = lid;
            Some(AsyncEventKind::LidChange)
        })
    }

    /// Replaces a port's P_Key table (raises PkeyChange).
    pub fn set_pkeys(&self, guid: Guid, port: PortNum, pkeys: Vec<Pkey>) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            p.pkeys = pkeys;
            Some(AsyncEventKind::PkeyChange)
        })
    }

    /// Detaches a CA (raises CaRemoval to its owners; it cannot be opened
    /// again).
    pub fn remove_ca(&self, guid: Guid) -> Result<(), VerbsError> {
        self.with(|st, out| {
            let d = st
                .devices
                .iter()
                .position(|d| d.guid == guid && !d.removed)
                .ok_or(VerbsError::NoSuchCa)?;
            st.devices[d].removed = true;
            for ca in st.devices[d].opens.clone() {
                let ctx = match st.obj(ca) {
                    Obj::Ca { ctx, .. } => *ctx,
                    _ => 0,
                };
                st.event(ca, AsyncEventKind::CaRemoval, ctx, None, out);
            }
            Ok(())
        })
    }

    fn destroy_simple(&self, h: Handle, kind: ResourceKind) -> Result<(), VerbsError> {
        self.with(|st, out| {
            let i = st.slot(h)?;
            let (ca, parent) = match (st.obj(i), kind) {
                (Obj::Pd { ca, children, .. }, ResourceKind::Pd) => {
                    if *children > 0 {
                        return Err(VerbsError::Busy("PD still has resources"));
                    }
                    (*ca, Some(*ca))
                }
                (Obj::Cq { ca, pd, users, .. }, ResourceKind::Cq) => {
                    if *users > 0 {
                        return Err(VerbsError::Busy("CQ is used by a QP"));
                    }
                    (*ca, Some(*pd))
                }
                (Obj::Srq { ca, pd, users, .. }, ResourceKind::Srq) => {
                    if *users > 0 {
                        return Err(VerbsError::Busy("SRQ is used by a QP"));
                    }
                    (*ca, Some(*pd))
                }
                (Obj::Ah { pd, .. }, ResourceKind::Ah) => (st.pd_ca(*pd), Some(*pd)),
                (Obj::Mr { ca, pd, key, .. }, ResourceKind::Mr) => {
                    let (ca, pd, key) = (*ca, *pd, *key);
                    let dev = st.ca_dev(ca);
                    st.devices[dev].keys.dereg_mr(key >> 8)?;
                    (ca, Some(pd))
                }
                (Obj::Mw { ca, pd, key, .. }, ResourceKind::Mw) => {
                    let (ca, pd, key) = (*ca, *pd, *key);
                    let dev = st.ca_dev(ca);
                    st.devices[dev].keys.dealloc_mw(key >> 8)?;
                    (ca, Some(pd))
                }
                (Obj::Ca { children, dev, .. }, ResourceKind::Ca) => {
                    if *children > 0 {
                        return Err(VerbsError::Busy("CA still has PDs"));
                    }
                    let (d, me) = (*dev, i);
                    st.devices[d].opens.retain(|&o| o != me);
                    (i, None)
                }
                _ => return Err(VerbsError::InvalidHandle),
            };
            let ctx = match st.obj(i) {
                Obj::Ca { ctx, .. }
                | Obj::Pd { ctx, .. }
                | Obj::Cq { ctx, .. }
                | Obj::Srq { ctx, .. }
                | Obj::Mr { ctx, .. }
                | Obj::Mw { ctx, .. } => *ctx,
                _ => 0,
            };
            let h = st.handler(ca);
            if let Some(p) = parent {
                st.adjust_children(p, -1);
            }
            st.release(i);
            out.push(Cb::Destroyed(h, kind, ctx));
            Ok(())
        })
    }
}

impl Provider for Fabric {
    fn name(&self) -> &'static str {
        "loopback"
    }

    /// Work completes inside `post_send`, which calls the peer's handlers
    /// on the posting thread.
    fn handlers_nest(&self) -> bool {
        true
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.lock()
            .devices
            .iter()
            .filter(|d| !d.removed)
            .map(|d| d.guid)
            .collect()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> verbs::Result<CaHandle> {
        let mut st = self.lock();
        let d = st
            .devices
            .iter()
            .position(|d| d.guid == guid && !d.removed)
            .ok_or(VerbsError::NoSuchCa)?;
        let h = st.alloc(Obj::Ca {
            dev: d,
            handler,
            ctx,
            children: 0,
        });
        st.devices[d].opens.push(h.index as usize);
        Ok(CaHandle(h))
    }

    fn query_ca(&self, ca: CaHandle) -> verbs::Result<CaAttr> {
        let st = self.lock();
        let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
        Ok(CaAttr {
            guid: dev.guid,
            num_ports: dev.ports.len() as u8,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: MAX_CQE,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 16,
            max_mw: 1 << 16,
            max_inline_data: 0,
            atomics: !self.lacks(verbs::Feature::Atomics),
        })
    }

    fn close_ca(&self, ca: CaHandle) -> verbs::Result<()> {
        self.destroy_simple(ca.0, ResourceKind::Ca)
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> verbs::Result<PortAttr> {
        let st = self.lock();
        let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
        dev.ports
            .get((port.0 as usize).wrapping_sub(1))
            .cloned()
            .ok_or_else(|| bad(format!("no port {}", port.0)))
    }

    /// LID, master SM LID, state and P_Key table, as an SMA would set
    /// them, each with its event (a port leaving ACTIVE also migrates its
    /// armed QPs, as a pulled cable does). LMC, SM SL and alias GUIDs are
    /// refused: the fabric finds a port by its base LID or GID only.
    fn modify_port(&self, ca: CaHandle, port: PortNum, m: &PortModify) -> verbs::Result<()> {
        m.check()?;
        if m.lmc.is_some() || m.sm_sl.is_some() || m.alias_guids.is_some() {
            return Err(VerbsError::NotSupported(
                "LMC, SM SL and alias GUIDs on the loopback fabric",
            ));
        }
        let guid = {
            let st = self.lock();
            let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
            if dev.ports.get((port.0 as usize).wrapping_sub(1)).is_none() {
                return Err(bad(format!("no port {}", port.0)));
            }
            dev.guid
        };
        if let Some(lid) = m.lid {
            self.set_lid(guid, port, lid)?;
        }
        if let Some(lid) = m.sm_lid {
            self.port_event(guid, port, |p| {
                (std::mem::replace(&mut p.sm_lid, lid) != lid).then_some(AsyncEventKind::SmChange)
            })?;
        }
        if let Some(pkeys) = &m.pkeys {
            let table = pkeys.iter().copied().filter(|k| k.0 & 0x7fff != 0);
            self.set_pkeys(guid, port, table.collect())?;
        }
        if let Some(state) = m.state {
            self.port_event(guid, port, |p| {
                let was = std::mem::replace(&mut p.state, state) == PortState::Active;
                match (was, state == PortState::Active) {
                    (false, true) => Some(AsyncEventKind::PortActive),
                    (true, false) => Some(AsyncEventKind::PortDown),
                    _ => None,
                }
            })?;
        }
        Ok(())
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> verbs::Result<PdHandle> {
        let mut st = self.lock();
        let c = st.ca(ca)?;
        st.adjust_children(c, 1);
        Ok(PdHandle(st.alloc(Obj::Pd {
            ca: c,
            ctx,
            children: 0,
        })))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> verbs::Result<()> {
        self.destroy_simple(pd.0, ResourceKind::Pd)
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> verbs::Result<CqHandle> {
        if init.cqe == 0 || init.cqe > MAX_CQE {
            return Err(bad(format!("cqe {} not in 1..={MAX_CQE}", init.cqe)));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        st.adjust_children(p, 1);
        Ok(CqHandle(st.alloc(Obj::Cq {
            ca,
            pd: p,
            ctx,
            cq: Arc::new(Cq::new(init.cqe as usize)),
            users: 0,
        })))
    }

    fn destroy_cq(&self, cq: CqHandle) -> verbs::Result<()> {
        self.destroy_simple(cq.0, ResourceKind::Cq)
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> verbs::Result<usize> {
        // Polled under the state lock (state, then CQ: the order `complete`
        // takes them in), which saves cloning the CQ's Arc on every poll.
        let st = self.lock();
        match st.obj(st.cq_idx(cq)?) {
            Obj::Cq { cq, .. } => Ok(cq.poll(out)),
            _ => unreachable!(),
        }
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> verbs::Result<()> {
        self.cq_arc(cq)?.arm(solicited_only);
        Ok(())
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> verbs::Result<()> {
        if self.cq_arc(cq)?.wait(timeout) {
            Ok(())
        } else {
            Err(VerbsError::Timeout)
        }
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> verbs::Result<SrqHandle> {
        if self.lacks(verbs::Feature::Srq) {
            return Err(VerbsError::NotSupported("create_srq"));
        }
        if attr.max_wr == 0 || attr.max_wr > MAX_QP_WR || attr.max_sge > MAX_SGE {
            return Err(bad("SRQ max_wr/max_sge out of range"));
        }
        let mut rq = RecvQueue::new(attr.max_wr, attr.max_sge);
        rq.set_limit(attr.limit)?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        st.adjust_children(p, 1);
        Ok(SrqHandle(st.alloc(Obj::Srq {
            ca,
            pd: p,
            ctx,
            rq,
            users: 0,
        })))
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> verbs::Result<()> {
        let mut st = self.lock();
        let i = st.srq_idx(srq)?;
        match st.obj_mut(i) {
            Obj::Srq { rq, .. } => rq.set_limit(limit),
            _ => unreachable!(),
        }
    }

    fn query_srq(&self, srq: SrqHandle) -> verbs::Result<SrqAttr> {
        let st = self.lock();
        match st.obj(st.srq_idx(srq)?) {
            Obj::Srq { rq, .. } => Ok(SrqAttr {
                max_wr: rq.max_wr(),
                max_sge: rq.max_sge(),
                limit: rq.limit(),
            }),
            _ => unreachable!(),
        }
    }

    fn destroy_srq(&self, srq: SrqHandle) -> verbs::Result<()> {
        self.destroy_simple(srq.0, ResourceKind::Srq)
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> verbs::Result<QpHandle> {
        let c = init.caps;
        if c.max_send_wr > MAX_QP_WR
            || c.max_recv_wr > MAX_QP_WR
            || c.max_send_sge > MAX_SGE
            || c.max_recv_sge > MAX_SGE
        {
            return Err(VerbsError::OutOfResources(
                "QP capabilities exceed the CA's limits",
            ));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let scq = st.cq_idx(init.send_cq)?;
        let rcq = st.cq_idx(init.recv_cq)?;
        let srq = init.srq.map(|s| st.srq_idx(s)).transpose()?;
        for i in [scq, rcq].into_iter().chain(srq) {
            let owner = match st.obj(i) {
                Obj::Cq { ca, .. } | Obj::Srq { ca, .. } => *ca,
                _ => unreachable!(),
            };
            if st.ca_dev(owner) != dev {
                return Err(bad("CQ/SRQ belongs to another CA"));
            }
        }
        let special = matches!(init.qp_type, QpType::Smi | QpType::Gsi);
        let (qpn, key) = if special {
            let port = init.port.ok_or_else(|| bad("special QP needs a port"))?;
            if port.0 == 0 || port.0 as usize > st.devices[dev].ports.len() {
                return Err(bad(format!("no port {}", port.0)));
            }
            let n = if init.qp_type == QpType::Smi { 0 } else { 1 };
            let key = (port.0 as u32) << 24 | n;
            if st.devices[dev].qpns.contains_key(&key) {
                return Err(VerbsError::Busy("special QP already exists on this port"));
            }
            (n, key)
        } else {
            if init.port.is_some() {
                return Err(bad("port is given at INIT for non-special QPs"));
            }
            let d = &mut st.devices[dev];
            let n = d.next_qpn;
            d.next_qpn = if n + 1 > Qpn::MASK - 1 { 2 } else { n + 1 };
            (n, n)
        };
        let qp = Qp {
            ca,
            dev,
            pd: p,
            init: *init,
            send_cq: scq,
            recv_cq: rcq,
            srq,
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            rq: RecvQueue::new(c.max_recv_wr, c.max_recv_sge),
            pending: VecDeque::new(),
            ctx,
            established: false,
            mig: MigState::Migrated,
        };
        st.adjust_children(p, 1);
        st.adjust_children(scq, 1);
        st.adjust_children(rcq, 1);
        if let Some(s) = srq {
            st.adjust_children(s, 1);
        }
        let h = st.alloc(Obj::Qp(Box::new(qp)));
        st.devices[dev].qpns.insert(key, h.index as usize);
        Ok(QpHandle(h))
    }

    fn qp_num(&self, qp: QpHandle) -> verbs::Result<Qpn> {
        let st = self.lock();
        Ok(Qpn::from_bits(st.qpr(st.qp_idx(qp)?).qpn))
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            let q = st.qpr(i);
            let to = qp_table::check(q.init.qp_type, q.state, attr)?;
            let dev = &st.devices[q.dev];
            let port = attr.port.or(q.attr.port).or(q.init.port);
            if let Some(p) = attr.port {
                if p.0 == 0 || p.0 as usize > dev.ports.len() {
                    return Err(bad(format!("no port {}", p.0)));
                }
            }
            if let (Some(pk), Some(p)) = (attr.pkey_index, port) {
                if pk as usize >= dev.ports[p.0 as usize - 1].pkeys.len() {
                    return Err(bad(format!("pkey_index {pk} beyond the table")));
                }
            }
            if let (Some(m), Some(p)) = (attr.path_mtu, port) {
                if m.bytes() > dev.ports[p.0 as usize - 1].max_mtu.bytes() {
                    return Err(bad("path_mtu above the port's MTU"));
                }
            }
            if attr.rnr_retry.is_some_and(|r| r > 7)
                || attr.retry_cnt.is_some_and(|r| r > 7)
                || attr.timeout.is_some_and(|t| t > 31)
                || attr.min_rnr_timer.is_some_and(|t| t > 31)
            {
                return Err(bad("retry/timer field out of range"));
            }
            if attr.access.is_some_and(|a| {
                a.contains(AccessFlags::MW_BIND) || a.contains(AccessFlags::ZERO_BASED)
            }) {
                return Err(bad("QP access takes only remote rights"));
            }
            if self.lacks(verbs::Feature::Apm)
                && (attr.alt_path.is_some() || attr.path_mig_state.is_some())
            {
                return Err(VerbsError::NotSupported("alternate paths (APM)"));
            }
            if let Some(alt) = &attr.alt_path {
                let p = dev
                    .ports
                    .get((alt.port.0 as usize).wrapping_sub(1))
                    .ok_or_else(|| bad(format!("no port {} for the alternate path", alt.port.0)))?;
                if alt.pkey_index as usize >= p.pkeys.len() {
                    return Err(bad("alternate pkey_index beyond the table"));
                }
            }
            let step = kit::apm::check(q.state, to, q.mig, q.attr.alt_path.is_some(), attr)?;
            let from = q.state;
            let notify = attr.en_sqd_async_notify == Some(true);
            let qm = st.qp(i);
            merge(&mut qm.attr, attr);
            qm.attr.state = Some(to);
            qm.mig = step.state;
            qm.attr.path_mig_state = Some(step.state);
            if step.migrate {
                st.migrate(i, out);
            }
            let qm = st.qp(i);
            match to {
                QpState::Reset => {
                    qm.state = to;
                    qm.pending.clear();
                    qm.rq.drain();
                    qm.attr = QpAttr::default();
                    qm.established = false;
                    qm.mig = MigState::Migrated;
                }
                QpState::Err => st.enter_error(i, out),
                _ => {
                    qm.state = to;
                    if to == QpState::Sqd && from != QpState::Sqd && notify {
                        // Loopback executes synchronously: the SQ is drained now.
                        let (ca, ctx) = (qm.ca, qm.ctx);
                        st.event(ca, AsyncEventKind::SqDrained, ctx, None, out);
                    }
                    st.progress_all(out);
                }
            }
            Ok(())
        })
    }

    fn query_qp(&self, qp: QpHandle) -> verbs::Result<QpAttr> {
        let st = self.lock();
        let q = st.qpr(st.qp_idx(qp)?);
        let mut a = q.attr;
        a.state = Some(q.state);
        a.path_mig_state = (!q.init.qp_type.is_datagram()).then_some(q.mig);
        Ok(a)
    }

    fn destroy_qp(&self, qp: QpHandle) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            let q = st.qpr(i);
            let key = if q.qpn <= 1 {
                (st.qp_port(q).0 as u32) << 24 | q.qpn
            } else {
                q.qpn
            };
            let (dev, pd, scq, rcq, srq, ca, ctx) =
                (q.dev, q.pd, q.send_cq, q.recv_cq, q.srq, q.ca, q.ctx);
            st.devices[dev].qpns.remove(&key);
            for p in [pd, scq, rcq].into_iter().chain(srq) {
                st.adjust_children(p, -1);
            }
            let h = st.handler(ca);
            st.release(i);
            out.push(Cb::Destroyed(h, ResourceKind::Qp, ctx));
            Ok(())
        })
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> verbs::Result<AhHandle> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let dev = st.ca_dev(st.pd_ca(p));
        if attr.port.0 == 0 || attr.port.0 as usize > st.devices[dev].ports.len() {
            return Err(bad(format!("no port {}", attr.port.0)));
        }
        st.adjust_children(p, 1);
        Ok(AhHandle(st.alloc(Obj::Ah { pd: p, attr: *attr })))
    }

    fn destroy_ah(&self, ah: AhHandle) -> verbs::Result<()> {
        self.destroy_simple(ah.0, ResourceKind::Ah)
    }

    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> verbs::Result<MrInfo> {
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let (_, key) = st.devices[dev]
            .keys
            .reg_mr(p as u32, buf, addr, len, access)?;
        st.adjust_children(p, 1);
        let h = st.alloc(Obj::Mr {
            ca,
            pd: p,
            key,
            ctx,
        });
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: rdma_types::Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> verbs::Result<MrInfo> {
        let mut st = self.lock();
        let i = st.slot(mr.0)?;
        let Obj::Mr { ca, key, .. } = st.obj(i) else {
            return Err(VerbsError::InvalidHandle);
        };
        let (ca, old) = (*ca, *key);
        let dev = st.ca_dev(ca);
        let new = st.devices[dev]
            .keys
            .rereg_mr(old >> 8, buf, addr, len, access)?;
        if let Obj::Mr { key, .. } = st.obj_mut(i) {
            *key = new;
        }
        Ok(MrInfo {
            handle: mr,
            lkey: rdma_types::Lkey(new),
            rkey: Rkey(new),
            addr,
            len,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> verbs::Result<()> {
        self.destroy_simple(mr.0, ResourceKind::Mr)
    }

    fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> verbs::Result<(MwHandle, Rkey)> {
        if self.lacks(verbs::Feature::Mw) {
            return Err(VerbsError::NotSupported("alloc_mw"));
        }
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_ca(p);
        let dev = st.ca_dev(ca);
        let (_, key) = st.devices[dev].keys.alloc_mw(p as u32, kind);
        st.adjust_children(p, 1);
        Ok((
            MwHandle(st.alloc(Obj::Mw {
                ca,
                pd: p,
                key,
                kind,
                ctx,
            })),
            Rkey(key),
        ))
    }

    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> verbs::Result<Rkey> {
        let mut st = self.lock();
        let qi = st.qp_idx(qp)?;
        let (dev, pd, qpn, state) = {
            let q = st.qpr(qi);
            (q.dev, q.pd, q.qpn, q.state)
        };
        if state != QpState::Rts {
            return Err(VerbsError::InvalidState(state));
        }
        let mwi = st.slot(bind.mw.0)?;
        let mri = st.slot(bind.mr.0)?;
        let (Obj::Mw { key: mwk, kind, .. }, Obj::Mr { key: mrk, .. }) = (st.obj(mwi), st.obj(mri))
        else {
            return Err(VerbsError::InvalidHandle);
        };
        if *kind != MwType::Type1 {
            return Err(bad("type 2 windows are bound with a BindMw work request"));
        }
        let (mwk, mrk) = (*mwk, *mrk);
        let k = st.devices[dev]
            .keys
            .bind_mw(
                pd as u32,
                mwk >> 8,
                mrk >> 8,
                bind.addr,
                bind.len,
                bind.access,
                0,
                qpn,
            )
            .map_err(|s| bad(format!("bind refused: {s}")))?;
        if let Obj::Mw { key, .. } = st.obj_mut(mwi) {
            *key = k;
        }
        Ok(Rkey(k))
    }

    fn dealloc_mw(&self, mw: MwHandle) -> verbs::Result<()> {
        self.destroy_simple(mw.0, ResourceKind::Mw)
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            for (index, wr) in wrs.iter().enumerate() {
                let q = st.qpr(i);
                let qt = q.init.qp_type;
                let cause = if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                    Some(VerbsError::InvalidState(q.state))
                } else if wr.sges.len() > q.init.caps.max_send_sge as usize {
                    Some(VerbsError::InvalidArgument(format!(
                        "{} SGEs > max_send_sge",
                        wr.sges.len()
                    )))
                } else if q.pending.len() >= q.init.caps.max_send_wr as usize {
                    Some(VerbsError::QueueFull)
                } else if qt.is_datagram()
                    && !matches!(wr.opcode, SendOpcode::Send | SendOpcode::SendWithImm)
                {
                    Some(VerbsError::InvalidArgument(format!(
                        "{:?} on a datagram QP",
                        wr.opcode
                    )))
                } else if qt == QpType::Uc
                    && matches!(
                        wr.opcode,
                        SendOpcode::RdmaRead
                            | SendOpcode::AtomicCmpSwp
                            | SendOpcode::AtomicFetchAdd
                    )
                {
                    Some(VerbsError::InvalidArgument(format!(
                        "{:?} on a UC QP",
                        wr.opcode
                    )))
                } else if self.lacks(verbs::Feature::Atomics)
                    && matches!(
                        wr.opcode,
                        SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd
                    )
                {
                    Some(VerbsError::NotSupported("atomics"))
                } else if qt.is_datagram() && wr.ud.is_none() {
                    Some(VerbsError::InvalidArgument(
                        "datagram WR without destination".into(),
                    ))
                } else {
                    None
                };
                if let Some(c) = cause {
                    return Err(VerbsError::BadWr {
                        index,
                        cause: Box::new(c),
                    });
                }
                let q = st.qp(i);
                if matches!(q.state, QpState::Err | QpState::Sqe) {
                    let (scq, ctx) = (q.send_cq, q.ctx);
                    st.complete(
                        scq,
                        WorkCompletion::new(
                            wr.wr_id,
                            WcStatus::WrFlushErr,
                            wc_opcode(wr.opcode),
                            ctx,
                        ),
                        false,
                        out,
                    );
                    continue;
                }
                if q.pending.is_empty() && q.state == QpState::Rts {
                    // Fast path: nothing queued ahead, run without copying the WR.
                    if !st.run_one(i, wr, out) {
                        st.qp(i).pending.push_back(wr.clone());
                    }
                } else {
                    q.pending.push_back(wr.clone());
                    st.progress(i, out);
                }
            }
            Ok(())
        })
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.qp_idx(qp)?;
            let q = st.qp(i);
            if q.srq.is_some() {
                return Err(bad("QP uses an SRQ"));
            }
            if q.state == QpState::Reset {
                return Err(VerbsError::BadWr {
                    index: 0,
                    cause: Box::new(VerbsError::InvalidState(q.state)),
                });
            }
            q.rq.post(wrs)?;
            if q.state == QpState::Err {
                st.flush_rq(i, out);
            }
            st.progress_all(out);
            Ok(())
        })
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.with(|st, out| {
            let i = st.srq_idx(srq)?;
            match st.obj_mut(i) {
                Obj::Srq { rq, .. } => rq.post(wrs)?,
                _ => unreachable!(),
            }
            st.progress_all(out);
            Ok(())
        })
    }
}

impl State {
    fn flush_rq(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qp(qi);
        let recvs = q.rq.drain();
        let (rcq, ctx) = (q.recv_cq, q.ctx);
        for wr in recvs {
            self.complete(
                rcq,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, ctx),
                false,
                out,
            );
        }
    }
}

impl Fabric {
    fn cq_arc(&self, cq: CqHandle) -> verbs::Result<Arc<Cq>> {
        let st = self.lock();
        match st.obj(st.cq_idx(cq)?) {
            Obj::Cq { cq, .. } => Ok(cq.clone()),
            _ => unreachable!(),
        }
    }
}

fn merge(dst: &mut QpAttr, a: &QpAttr) {
    macro_rules! m {
        ($($f:ident),*) => {$( if a.$f.is_some() { dst.$f = a.$f; } )*};
    }
    m!(
        port,
        pkey_index,
        qkey,
        access,
        path_mtu,
        dest_qpn,
        rq_psn,
        sq_psn,
        av,
        max_dest_rd_atomic,
        max_rd_atomic,
        min_rnr_timer,
        timeout,
        retry_cnt,
        rnr_retry,
        en_sqd_async_notify,
        alt_path
    );
}
