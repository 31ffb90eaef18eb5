//! The fabric's state: devices, the verbs objects behind their handles
//! (`verbs::kit::handle_table`), the callbacks a verb queues, and the
//! lookups every verb starts with.

use super::*;

pub(super) struct Device {
    pub(super) guid: Guid,
    pub(super) ports: Vec<PortAttr>,
    pub(super) keys: KeyTable,
    /// QPN (special QPs: `port << 24 | qpn`) -> slot.
    pub(super) qpns: IdMap<u32, usize>,
    pub(super) next_qpn: u32,
    pub(super) opens: Vec<usize>,
    pub(super) removed: bool,
}

pub(super) struct Qp {
    pub(super) ca: usize,
    pub(super) dev: usize,
    pub(super) pd: usize,
    pub(super) init: QpInit,
    pub(super) send_cq: usize,
    pub(super) recv_cq: usize,
    pub(super) srq: Option<usize>,
    pub(super) qpn: u32,
    pub(super) state: QpState,
    pub(super) attr: QpAttr,
    pub(super) rq: RecvQueue,
    pub(super) pending: VecDeque<SendWr>,
    pub(super) ctx: u64,
    pub(super) established: bool,
    /// Path migration state (the alternate path is `attr.alt_path`).
    pub(super) mig: MigState,
    /// Where the path last led (connected QPs), valid while
    /// `State::paths` is unchanged.
    pub(super) peer: Option<Peer>,
}

/// A connected QP's resolved path (its port, the peer's slot and port,
/// the peer's QPN), as `transfer` found it when `State::paths` was
/// `epoch`. Only connected QPs set it.
#[derive(Clone, Copy)]
pub(super) struct Peer {
    pub(super) epoch: u64,
    pub(super) port: PortNum,
    pub(super) slot: usize,
    pub(super) at: PortNum,
    pub(super) dqpn: Qpn,
}

pub(super) enum Obj {
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

pub(super) enum Cb {
    Completion(Arc<dyn EventHandler>, u64),
    Async(Arc<dyn EventHandler>, AsyncEvent),
    Destroyed(Arc<dyn EventHandler>, ResourceKind, u64),
}

#[derive(Default)]
pub(super) struct State {
    pub(super) devices: Vec<Device>,
    /// Every verbs object, behind its handle.
    pub(super) objs: HandleTable<Obj>,
    /// Checked gather list of the WR being executed, kept between WRs so
    /// the data path allocates nothing; emptied after each WR (it holds
    /// buffer references).
    pub(super) gather: Vec<(Target, usize)>,
    /// Checked scatter list of the receive WR being filled, likewise.
    pub(super) scatter: Vec<(Target, usize)>,
    /// Some QP may hold send WRs waiting (for a receive, or for RTS): set
    /// whenever one is queued, cleared by `progress_all` once none is, so
    /// the posts that call it (every receive) skip its scan of every
    /// object when nothing waits.
    pub(super) backlog: bool,
    /// Bumped by every change that may change where a path leads or
    /// whether it is up (ports, CAs, QPs created, modified, destroyed or
    /// migrated): a QP's cached `peer` from another count is stale.
    pub(super) paths: u64,
}

impl State {
    /// Invalidates every QP's cached peer.
    pub(super) fn paths_changed(&mut self) {
        self.paths += 1;
    }

    pub(super) fn alloc(&mut self, obj: Obj) -> Handle {
        self.objs.alloc(obj)
    }

    pub(super) fn release(&mut self, i: usize) -> Option<Obj> {
        self.objs.release(i)
    }

    pub(super) fn slot(&self, h: Handle) -> Result<usize, VerbsError> {
        self.objs.slot(h)
    }

    #[inline]
    pub(super) fn obj(&self, i: usize) -> &Obj {
        self.objs.get(i)
    }

    #[inline]
    pub(super) fn obj_mut(&mut self, i: usize) -> &mut Obj {
        self.objs.get_mut(i)
    }

    pub(super) fn ca(&self, h: CaHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Ca { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    pub(super) fn pd(&self, h: PdHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Pd { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    pub(super) fn pd_ca(&self, pd: usize) -> usize {
        match self.obj(pd) {
            Obj::Pd { ca, .. } => *ca,
            _ => unreachable!(),
        }
    }

    pub(super) fn ca_dev(&self, ca: usize) -> usize {
        match self.obj(ca) {
            Obj::Ca { dev, .. } => *dev,
            _ => unreachable!(),
        }
    }

    pub(super) fn handler(&self, ca: usize) -> Arc<dyn EventHandler> {
        match self.obj(ca) {
            Obj::Ca { handler, .. } => handler.clone(),
            _ => unreachable!(),
        }
    }

    pub(super) fn adjust_children(&mut self, i: usize, delta: i32) {
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

    pub(super) fn qp_idx(&self, h: QpHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Qp(_) => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    #[inline(always)]
    pub(super) fn qp(&mut self, i: usize) -> &mut Qp {
        match self.obj_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!(),
        }
    }

    #[inline(always)]
    pub(super) fn qpr(&self, i: usize) -> &Qp {
        match self.obj(i) {
            Obj::Qp(q) => q,
            _ => unreachable!(),
        }
    }

    pub(super) fn cq_idx(&self, h: CqHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Cq { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    pub(super) fn srq_idx(&self, h: SrqHandle) -> Result<usize, VerbsError> {
        let i = self.slot(h.0)?;
        match self.obj(i) {
            Obj::Srq { .. } => Ok(i),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    pub(super) fn event(
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
    pub(super) fn complete(
        &self,
        cq: usize,
        wc: WorkCompletion,
        solicited: bool,
        out: &mut Vec<Cb>,
    ) {
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
}

impl Fabric {
    pub(super) fn destroy_simple(&self, h: Handle, kind: ResourceKind) -> Result<(), VerbsError> {
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

    pub(super) fn cq_arc(&self, cq: CqHandle) -> verbs::Result<Arc<Cq>> {
        let st = self.lock();
        match st.obj(st.cq_idx(cq)?) {
            Obj::Cq { cq, .. } => Ok(cq.clone()),
            _ => unreachable!(),
        }
    }
}
