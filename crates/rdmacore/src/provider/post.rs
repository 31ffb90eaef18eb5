//! Posting work requests: checked here in order, the good prefix handed
//! to the driver in one call, the first bad one reported by index
//! (`BadWr`), as the verbs contract has it.

use super::objects::{Obj, State};
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys::{self, raw::ibv_sge, PostError, Remote, SendDesc};
use rdma_types::{QpState, QpType, Rkey};
use std::ops::Range;
use std::sync::Arc;
use verbs::{
    MrHandle, MwBind, MwHandle, MwType, QpHandle, RecvWr, Result, SendOpcode, SendWr, Sge,
    SrqHandle, VerbsError,
};

fn sge(s: &Sge) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey.0,
    }
}

fn bad_wr(index: usize, cause: VerbsError) -> VerbsError {
    VerbsError::BadWr {
        index,
        cause: Box::new(cause),
    }
}

fn posted(op: &'static str, r: std::result::Result<(), PostError>) -> Result<()> {
    r.map_err(|e| bad_wr(e.index, convert::post_error(op, e.errno)))
}

/// The SGEs of every WR in one array, and each WR's range of it.
fn flatten<'a>(lists: impl Iterator<Item = &'a [Sge]>) -> (Vec<ibv_sge>, Vec<Range<usize>>) {
    let mut flat = Vec::new();
    let mut ranges = Vec::new();
    for l in lists {
        let start = flat.len();
        flat.extend(l.iter().map(sge));
        ranges.push(start..flat.len());
    }
    (flat, ranges)
}

/// What a send WR needs beyond itself: its AH (UD), its window and
/// region (a bind), the key of a type 2 window a local invalidate
/// unbinds.
struct Checked {
    ah: Option<Arc<sys::Ah>>,
    bind: Option<BindObjs>,
    window: Option<Rkey>,
}

/// The objects a type 2 bind WR names.
struct BindObjs {
    mw: Arc<sys::Mw>,
    mr: Arc<sys::Mr>,
    named: Named,
}

/// A window and a region: their handles and slots.
#[derive(Clone, Copy)]
struct Named {
    mw: (MwHandle, usize),
    mr: (MrHandle, usize),
}

impl RdmaCore {
    pub(super) fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let (hw, ca, checked, refused, regions) = {
            let st = self.lock();
            let q = st.qp_obj(st.qp(qp)?);
            let qp_type = q.init.qp_type;
            let atomics = st.rt(q.ca).attr.atomic_cap != 0;
            let mut checked = Vec::with_capacity(wrs.len());
            let mut refused = None;
            let mut inline = false;
            // Type 2 windows bound by earlier WRs of this batch.
            let mut bound_here = Vec::new();
            for (i, w) in wrs.iter().enumerate() {
                let r = (|| {
                    if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                        return Err(VerbsError::InvalidState(q.state));
                    }
                    if !convert::opcode_allowed(qp_type, w.opcode) {
                        return Err(bad(format!("{:?} on a {qp_type} QP", w.opcode)));
                    }
                    if matches!(
                        w.opcode,
                        SendOpcode::AtomicCmpSwp | SendOpcode::AtomicFetchAdd
                    ) && !atomics
                    {
                        return Err(VerbsError::NotSupported("atomics on this device"));
                    }
                    if w.sges.len() > q.caps.max_send_sge as usize {
                        return Err(VerbsError::OutOfResources("SGEs of a send WR"));
                    }
                    if w.flags.contains(verbs::SendFlags::INLINE) {
                        if w.total_len() > u64::from(q.caps.max_inline_data) {
                            return Err(bad(format!(
                                "{} inline bytes; the QP takes {}",
                                w.total_len(),
                                q.caps.max_inline_data
                            )));
                        }
                        inline = true;
                    }
                    let ah = match (qp_type, &w.ud) {
                        (QpType::Ud, Some(d)) => match st.obj(st.ah(d.ah)?) {
                            Obj::Ah { ca, ah, .. } if *ca == q.ca => Some(ah.clone()),
                            _ => return Err(VerbsError::InvalidHandle),
                        },
                        (QpType::Ud, None) => return Err(bad("a UD send needs a destination")),
                        _ => None,
                    };
                    let bind = match (w.opcode, &w.bind_mw) {
                        (SendOpcode::BindMw, Some(b)) => Some(bind_objs(&st, q.ca, b)?),
                        (SendOpcode::BindMw, None) => {
                            return Err(bad("a BindMw work request without its bind_mw"))
                        }
                        _ => None,
                    };
                    let window = match w.opcode {
                        SendOpcode::LocalInv => {
                            local_inv_window(&st, q.ca, w.invalidate_rkey, &bound_here)?
                        }
                        _ => None,
                    };
                    Ok(Checked { ah, bind, window })
                })();
                match r {
                    Ok(c) => {
                        if let (Some(_), Some(b)) = (&c.bind, &w.bind_mw) {
                            bound_here.push(b.rkey);
                        }
                        checked.push(c)
                    }
                    Err(e) => {
                        refused = Some(bad_wr(i, e));
                        break;
                    }
                }
            }
            let regions = if inline { st.mrs_of(q.ca) } else { Vec::new() };
            (q.qp.clone(), q.ca, checked, refused, regions)
        };
        let n = checked.len();
        if n > 0 {
            let (flat, ranges) = flatten(wrs[..n].iter().map(|w| w.sges.as_slice()));
            let descs: Vec<SendDesc<'_>> = wrs[..n]
                .iter()
                .zip(&checked)
                .zip(ranges)
                .map(|((w, c), r)| desc(w, c, &flat[r]))
                .collect();
            let r = hw.post_send(&descs, &regions);
            let done = r.as_ref().map_or_else(|e| e.index, |()| n);
            let binds: Vec<Named> = checked[..done]
                .iter()
                .filter_map(|c| c.bind.as_ref().map(|b| b.named))
                .collect();
            let unbinds: Vec<Rkey> = checked[..done].iter().filter_map(|c| c.window).collect();
            if !binds.is_empty() || !unbinds.is_empty() {
                self.note_binds(ca, &binds, &unbinds);
            }
            posted("post_send", r)?;
        }
        refused.map_or(Ok(()), Err)
    }

    /// What the WRs handed to the device did to windows (see `mw`): the
    /// bind WRs' windows are bound to their regions (`binds`, where the
    /// handles still name the objects the post used), then the local
    /// invalidates' type 2 windows of CA slot `ca` are unbound
    /// (`unbinds`: a batch that binds and invalidates one window leaves
    /// it unbound).
    fn note_binds(&self, ca: usize, binds: &[Named], unbinds: &[Rkey]) {
        let mut st = self.lock();
        for b in binds {
            if st.mw(b.mw.0) == Ok(b.mw.1) && st.mr(b.mr.0) == Ok(b.mr.1) {
                st.note_bind(b.mw.1, b.mr.1);
            }
        }
        for k in unbinds {
            if let Some((w, _)) = st.type2_window(ca, k.0) {
                st.unbind(w);
            }
        }
    }

    pub(super) fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let (hw, refused, n) = {
            let st = self.lock();
            let q = st.qp_obj(st.qp(qp)?);
            let check = |w: &RecvWr| {
                if q.state == QpState::Reset {
                    return Err(VerbsError::InvalidState(q.state));
                }
                if q.srq.is_some() {
                    return Err(bad("the QP takes its receives from its SRQ"));
                }
                if w.sges.len() > q.caps.max_recv_sge as usize {
                    return Err(VerbsError::OutOfResources("SGEs of a receive WR"));
                }
                Ok(())
            };
            let refused = wrs
                .iter()
                .enumerate()
                .find_map(|(i, w)| check(w).err().map(|e| (i, e)));
            let n = refused.as_ref().map_or(wrs.len(), |(i, _)| *i);
            (q.qp.clone(), refused, n)
        };
        posted("post_recv", with_recv_descs(&wrs[..n], |d| hw.post_recv(d)))?;
        refused.map_or(Ok(()), |(i, e)| Err(bad_wr(i, e)))
    }

    pub(super) fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let (hw, max_sge) = {
            let st = self.lock();
            match st.obj(st.srq(srq)?) {
                Obj::Srq { srq, max_sge, .. } => (srq.clone(), *max_sge),
                _ => unreachable!("checked SRQ"),
            }
        };
        let refused = wrs
            .iter()
            .position(|w| w.sges.len() > max_sge as usize)
            .map(|i| (i, VerbsError::OutOfResources("SGEs of a receive WR")));
        let n = refused.as_ref().map_or(wrs.len(), |(i, _)| *i);
        posted(
            "post_srq_recv",
            with_recv_descs(&wrs[..n], |d| hw.post_recv(d)),
        )?;
        refused.map_or(Ok(()), |(i, e)| Err(bad_wr(i, e)))
    }
}

/// The window (type 2, of CA slot `ca`) and region a bind WR names.
fn bind_objs(st: &State, ca: usize, b: &MwBind) -> Result<BindObjs> {
    let w = st.mw(b.mw)?;
    let mw = match st.obj(w) {
        Obj::Mw { ca: c, .. } if *c != ca => return Err(VerbsError::InvalidHandle),
        Obj::Mw {
            kind: MwType::Type1,
            ..
        } => {
            return Err(bad(
                "a type 1 window is bound with bind_mw, not a work request",
            ))
        }
        Obj::Mw { mw, .. } => mw.clone(),
        _ => unreachable!("checked MW"),
    };
    let m = st.mr(b.mr)?;
    let mr = match st.obj(m) {
        Obj::Mr { ca: c, mr, .. } if *c == ca => mr.clone(),
        _ => return Err(VerbsError::InvalidHandle),
    };
    Ok(BindObjs {
        mw,
        mr,
        named: Named {
            mw: (b.mw, w),
            mr: (b.mr, m),
        },
    })
}

/// The type 2 window of CA slot `ca` a local invalidate of `rkey` names,
/// if any (an MR's key, or a key of another CA's, is the device's to
/// judge). One that is not bound, neither on the provider's books nor by
/// a bind earlier in the batch (`bound_here`: the keys those gave), is
/// refused: the IBA completes it in error, but Linux 6.1's rxe
/// dereferences the window's cleared QP on a second invalidation and
/// takes the kernel down, so it never reaches the device.
fn local_inv_window(
    st: &State,
    ca: usize,
    rkey: Rkey,
    bound_here: &[Rkey],
) -> Result<Option<Rkey>> {
    if bound_here.contains(&rkey) {
        return Ok(Some(rkey));
    }
    match st.type2_window(ca, rkey.0) {
        Some((_, true)) => Ok(Some(rkey)),
        Some((_, false)) => Err(bad(format!(
            "local invalidate of R_Key {:#x}: that type 2 window is not bound (never bound, \
             or already invalidated here or by the peer)",
            rkey.0
        ))),
        None => Ok(None),
    }
}

/// `post` over `wrs` as the driver takes receive WRs (their SGEs in one
/// flat array).
fn with_recv_descs<R>(wrs: &[RecvWr], post: impl FnOnce(&[sys::RecvDesc<'_>]) -> R) -> R {
    let (flat, ranges) = flatten(wrs.iter().map(|w| w.sges.as_slice()));
    let descs: Vec<sys::RecvDesc<'_>> = wrs
        .iter()
        .zip(ranges)
        .map(|(w, r)| sys::RecvDesc {
            wr_id: w.wr_id,
            sges: &flat[r],
        })
        .collect();
    post(&descs)
}

/// A checked send WR as the driver takes it.
fn desc<'a>(w: &SendWr, c: &'a Checked, sges: &'a [ibv_sge]) -> SendDesc<'a> {
    use SendOpcode::*;
    let imm_or_inv = match w.opcode {
        SendWithImm | RdmaWriteWithImm => w.imm.to_be(),
        SendWithInv | LocalInv => w.invalidate_rkey.0,
        _ => 0,
    };
    let remote = match (w.opcode, &c.ah, &w.ud) {
        (_, Some(ah), Some(d)) => Remote::Ud {
            ah,
            qpn: d.remote_qpn.value(),
            qkey: d.remote_qkey.0,
        },
        (RdmaWrite | RdmaWriteWithImm | RdmaRead, _, _) => Remote::Rdma {
            addr: w.remote.addr,
            rkey: w.remote.rkey.0,
        },
        (BindMw, _, _) => match (&c.bind, &w.bind_mw) {
            (Some(o), Some(b)) => Remote::Bind {
                mw: &o.mw,
                rkey: b.rkey.0,
                mr: &o.mr,
                addr: b.addr,
                len: b.len,
                access: b.access.bits(),
            },
            // Checked before.
            _ => Remote::None,
        },
        (AtomicCmpSwp | AtomicFetchAdd, _, _) => Remote::Atomic {
            addr: w.remote.addr,
            compare_add: w.compare_add,
            swap: w.swap,
            rkey: w.remote.rkey.0,
        },
        _ => Remote::None,
    };
    SendDesc {
        wr_id: w.wr_id,
        opcode: convert::wr_opcode(w.opcode),
        flags: convert::send_flags(w.flags),
        imm_or_inv,
        sges,
        remote,
    }
}
