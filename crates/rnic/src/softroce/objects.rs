//! The verbs objects behind their handles (`verbs::kit::handle_table`),
//! and the lookups every verb starts with.

use super::*;

pub(super) enum Obj {
    Ca {
        rt: Arc<CaRt>,
        handler: Arc<dyn EventHandler>,
        ctx: Context,
        children: u32,
    },
    Pd {
        ca: usize,
        ctx: Context,
        children: u32,
    },
    Cq {
        pd: usize,
        ctx: Context,
        cq: Arc<Cq>,
        users: u32,
    },
    Srq {
        ca: usize,
        pd: usize,
        ctx: Context,
        rq: Arc<Mutex<RecvQueue>>,
        users: u32,
    },
    Qp(Box<QpObj>),
    Ah {
        pd: usize,
        id: softroce::AhId,
    },
    Mr {
        ca: usize,
        pd: usize,
        /// Key-table index.
        key: u32,
        /// The current L_Key (inline data is found by address in any MR).
        lkey: u32,
        ctx: Context,
    },
    Mw {
        ca: usize,
        pd: usize,
        /// Key-table index.
        index: u32,
        kind: MwType,
        ctx: Context,
    },
}

pub(super) struct QpObj {
    pub(super) ca: usize,
    pub(super) pd: usize,
    pub(super) init: QpInit,
    pub(super) qpn: Qpn,
    pub(super) state: QpState,
    pub(super) attr: QpAttr,
    /// Receives posted before the engine exists (RESET/INIT).
    pub(super) early: RecvQueue,
    pub(super) access: Arc<AtomicU32>,
    pub(super) ctx: Context,
    pub(super) engine: bool,
}

#[derive(Default)]
pub(super) struct State {
    /// Every verbs object, behind its handle.
    pub(super) objs: HandleTable<Obj>,
}

impl State {
    pub(super) fn alloc(&mut self, obj: Obj) -> Handle {
        self.objs.alloc(obj)
    }

    pub(super) fn release(&mut self, i: usize) -> Option<Obj> {
        self.objs.release(i)
    }

    pub(super) fn slot(&self, h: Handle) -> Result<usize> {
        self.objs.slot(h)
    }

    pub(super) fn obj(&self, i: usize) -> &Obj {
        self.objs.get(i)
    }

    pub(super) fn obj_mut(&mut self, i: usize) -> &mut Obj {
        self.objs.get_mut(i)
    }

    pub(super) fn ca(&self, h: CaHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Ca { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    pub(super) fn pd(&self, h: PdHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Pd { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    pub(super) fn cq(&self, h: CqHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Cq { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    pub(super) fn srq(&self, h: SrqHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Srq { .. })
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    pub(super) fn qp(&self, h: QpHandle) -> Result<usize> {
        let i = self.slot(h.0)?;
        matches!(self.obj(i), Obj::Qp(_))
            .then_some(i)
            .ok_or(VerbsError::InvalidHandle)
    }

    pub(super) fn qp_mut(&mut self, i: usize) -> &mut QpObj {
        match self.obj_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!("checked by State::qp"),
        }
    }

    pub(super) fn rt(&self, ca: usize) -> Arc<CaRt> {
        match self.obj(ca) {
            Obj::Ca { rt, .. } => rt.clone(),
            _ => unreachable!("a CA slot"),
        }
    }

    pub(super) fn handler(&self, ca: usize) -> Arc<dyn EventHandler> {
        match self.obj(ca) {
            Obj::Ca { handler, .. } => handler.clone(),
            _ => unreachable!("a CA slot"),
        }
    }

    pub(super) fn pd_ca(&self, pd: usize) -> usize {
        match self.obj(pd) {
            Obj::Pd { ca, .. } => *ca,
            _ => unreachable!("a PD slot"),
        }
    }

    pub(super) fn adjust(&mut self, i: usize, delta: i32) {
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

    pub(super) fn cq_arc(&self, i: usize) -> (Arc<Cq>, Context) {
        match self.obj(i) {
            Obj::Cq { cq, ctx, .. } => (cq.clone(), *ctx),
            _ => unreachable!("a CQ slot"),
        }
    }

    /// Whether two CA opens are of one device (one key table).
    pub(super) fn same_device(&self, a: usize, b: usize) -> bool {
        a == b || Arc::ptr_eq(&self.rt(a), &self.rt(b))
    }
}
