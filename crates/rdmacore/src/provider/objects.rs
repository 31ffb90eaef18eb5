//! The verbs objects behind their handles (`verbs::kit::handle_table`),
//! and the lookups every verb starts with.

use super::ca::CaRt;
use super::cq::CqRt;
use crate::sys;
use rdma_types::{AccessFlags, QpState};
use std::collections::HashMap;
use std::sync::Arc;
use verbs::kit::handle_table::HandleTable;
use verbs::{Context, Handle, MwType, QpAttr, QpInit, Result, VerbsError};

pub(super) enum Obj {
    Ca {
        rt: Arc<CaRt>,
        ctx: Context,
        /// PDs.
        children: u32,
    },
    Pd {
        ca: usize,
        pd: Arc<sys::Pd>,
        ctx: Context,
        /// CQs, SRQs, QPs, AHs, MRs.
        children: u32,
    },
    Cq {
        ca: usize,
        pd: usize,
        cq: Arc<CqRt>,
        /// QPs.
        users: u32,
    },
    Srq {
        ca: usize,
        pd: usize,
        srq: Arc<sys::Srq>,
        ctx: Context,
        key: u64,
        /// The work requests asked for at creation (the limit's bound).
        max_wr: u32,
        max_sge: u32,
        /// QPs.
        users: u32,
    },
    Qp(Box<QpObj>),
    Ah {
        ca: usize,
        pd: usize,
        ah: Arc<sys::Ah>,
        /// What it was made with, and the device's index of its source
        /// GID: what a MAD sent through the kernel (`gsi`) is addressed by.
        attr: verbs::AhAttr,
        sgid: u8,
    },
    /// A GSI QP, served through the kernel's user MAD interface (`gsi`).
    Gsi {
        ca: usize,
        pd: usize,
        send_cq: usize,
        recv_cq: usize,
        gsi: Arc<super::gsi::GsiRt>,
    },
    Mr {
        ca: usize,
        pd: usize,
        mr: Arc<sys::Mr>,
        ctx: Context,
        /// The rights it was registered with.
        access: AccessFlags,
        /// Windows bound to it, as far as the provider saw (see `mw`).
        windows: u32,
    },
    Mw {
        ca: usize,
        pd: usize,
        mw: Arc<sys::Mw>,
        kind: MwType,
        ctx: Context,
        /// The MR slot it was last bound to.
        bound: Option<usize>,
    },
}

pub(super) struct QpObj {
    pub(super) ca: usize,
    pub(super) pd: usize,
    pub(super) send_cq: usize,
    pub(super) recv_cq: usize,
    pub(super) srq: Option<usize>,
    pub(super) qp: Arc<sys::Qp>,
    pub(super) init: QpInit,
    /// What the device gave (at least what was asked).
    pub(super) caps: sys::raw::ibv_qp_cap,
    pub(super) ctx: Context,
    pub(super) key: u64,
    /// The state of the last modify or query (the device moves a QP to
    /// ERR or SQE on its own; `query_qp` asks it).
    pub(super) state: QpState,
    /// Every attribute given since RESET.
    pub(super) attr: QpAttr,
}

/// Every object of the provider, and the keys the device hands back in
/// asynchronous events (`qp_context`, `cq_context`, `srq_context`).
#[derive(Default)]
pub(super) struct State {
    pub(super) objs: HandleTable<Obj>,
    pub(super) by_key: HashMap<u64, Handle>,
    /// Type 2 windows alive: while there are none, a local invalidate or
    /// an invalidating receive looks for no window.
    pub(super) type2_windows: usize,
}

macro_rules! lookup {
    ($($name:ident: $h:ty => $pat:pat,)*) => {$(
        /// The slot of a live object of this kind named by the handle.
        pub(super) fn $name(&self, h: $h) -> Result<usize> {
            let i = self.objs.slot(h.0)?;
            matches!(self.objs.get(i), $pat)
                .then_some(i)
                .ok_or(VerbsError::InvalidHandle)
        }
    )*};
}

impl State {
    lookup! {
        ca: verbs::CaHandle => Obj::Ca { .. },
        pd: verbs::PdHandle => Obj::Pd { .. },
        cq: verbs::CqHandle => Obj::Cq { .. },
        srq: verbs::SrqHandle => Obj::Srq { .. },
        qp: verbs::QpHandle => Obj::Qp(_),
        gsi: verbs::QpHandle => Obj::Gsi { .. },
        ah: verbs::AhHandle => Obj::Ah { .. },
        mr: verbs::MrHandle => Obj::Mr { .. },
        mw: verbs::MwHandle => Obj::Mw { .. },
    }

    pub(super) fn obj(&self, i: usize) -> &Obj {
        self.objs.get(i)
    }

    pub(super) fn obj_mut(&mut self, i: usize) -> &mut Obj {
        self.objs.get_mut(i)
    }

    /// The device runtime of CA slot `ca`.
    pub(super) fn rt(&self, ca: usize) -> Arc<CaRt> {
        match self.obj(ca) {
            Obj::Ca { rt, .. } => rt.clone(),
            _ => unreachable!("a CA slot"),
        }
    }

    /// CA slot and PD of PD slot `pd`.
    pub(super) fn pd_of(&self, pd: usize) -> (usize, Arc<sys::Pd>) {
        match self.obj(pd) {
            Obj::Pd { ca, pd, .. } => (*ca, pd.clone()),
            _ => unreachable!("a PD slot"),
        }
    }

    pub(super) fn qp_obj(&self, i: usize) -> &QpObj {
        match self.obj(i) {
            Obj::Qp(q) => q,
            _ => unreachable!("a QP slot"),
        }
    }

    pub(super) fn qp_mut(&mut self, i: usize) -> &mut QpObj {
        match self.obj_mut(i) {
            Obj::Qp(q) => q,
            _ => unreachable!("a QP slot"),
        }
    }

    pub(super) fn cq_rt(&self, i: usize) -> Arc<CqRt> {
        match self.obj(i) {
            Obj::Cq { cq, .. } => cq.clone(),
            _ => unreachable!("a CQ slot"),
        }
    }

    /// Counts a child in (`+1`) or out (`-1`) of slot `i`.
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

    /// Stores `obj`, known to the device by `key` when it has one.
    pub(super) fn insert(&mut self, obj: Obj, key: Option<u64>) -> Handle {
        let h = self.objs.alloc(obj);
        if let Some(k) = key {
            self.by_key.insert(k, h);
        }
        h
    }

    /// Empties slot `i` (and its key).
    pub(super) fn remove(&mut self, i: usize, key: Option<u64>) -> Option<Obj> {
        if let Some(k) = key {
            self.by_key.remove(&k);
        }
        self.objs.release(i)
    }

    /// The live object a device key names: its handle and slot.
    pub(super) fn by_key(&self, key: u64) -> Option<(Handle, usize)> {
        let h = *self.by_key.get(&key)?;
        self.objs.slot(h).ok().map(|i| (h, i))
    }

    /// Records that window slot `mw` is now bound to MR slot `mr` (and no
    /// longer to the one before), for the MRs' window counts.
    pub(super) fn note_bind(&mut self, mw: usize, mr: usize) {
        let before = match self.obj_mut(mw) {
            Obj::Mw { bound, .. } => bound.replace(mr),
            _ => unreachable!("a MW slot"),
        };
        if before == Some(mr) {
            return;
        }
        if let Some(old) = before {
            self.count_window(old, -1);
        }
        self.count_window(mr, 1);
    }

    /// CA slot `ca`'s type 2 window whose R_Key is `rkey`: its slot and
    /// whether it is bound (as far as the provider saw).
    pub(super) fn type2_window(&self, ca: usize, rkey: u32) -> Option<(usize, bool)> {
        if self.type2_windows == 0 {
            return None;
        }
        self.objs.iter().find_map(|(i, o)| match o {
            Obj::Mw {
                ca: c,
                kind: MwType::Type2,
                mw,
                bound,
                ..
            } if *c == ca && mw.rkey() == rkey => Some((i, bound.is_some())),
            _ => None,
        })
    }

    /// Window slot `mw` is no longer bound (invalidated).
    pub(super) fn unbind(&mut self, mw: usize) {
        let before = match self.obj_mut(mw) {
            Obj::Mw { bound, .. } => bound.take(),
            _ => None,
        };
        if let Some(m) = before {
            self.count_window(m, -1);
        }
    }

    /// Counts a window in (`+1`) or out (`-1`) of MR slot `mr`.
    pub(super) fn count_window(&mut self, mr: usize, delta: i32) {
        if let Obj::Mr { windows, .. } = self.obj_mut(mr) {
            *windows = windows.wrapping_add_signed(delta);
        }
    }

    /// The MRs of CA slot `ca` (inline data must come from one of them).
    pub(super) fn mrs_of(&self, ca: usize) -> Vec<Arc<sys::Mr>> {
        self.objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Mr { ca: c, mr, .. } if *c == ca => Some(mr.clone()),
                _ => None,
            })
            .collect()
    }
}
