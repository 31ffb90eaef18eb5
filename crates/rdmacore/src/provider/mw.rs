//! Memory windows, where the device has them (its capability flags say
//! which types): type 1 bound by the bind verb, type 2 by a BindMw work
//! request (`post`), both invalidated as the device does it.
//!
//! A window keeps the MR it was bound to from being deregistered
//! (`Busy`): the device refuses to deregister such a region, and the
//! buffer must outlive every key a peer may still use. A window counts
//! as bound from the post of its bind until the provider sees it
//! unbound: deallocated, bound to another region, or (type 2) a local
//! invalidate of its key posted, or a receive that invalidated it
//! polled. A local invalidate of a type 2 window that is not bound is
//! refused at post (`post`), as Linux 6.1's rxe cannot take it.

use super::ca::CaRt;
use super::events;
use super::objects::Obj;
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys::{self, raw};
use rdma_types::{AccessFlags, QpState, Rkey};
use std::sync::Arc;
use verbs::{
    Context, MwBind, MwHandle, MwType, PdHandle, QpHandle, ResourceKind, Result, VerbsError,
};

/// `enum ibv_mw_type` of `kind`.
pub(super) fn mw_type_raw(kind: MwType) -> u32 {
    match kind {
        MwType::Type1 => raw::IBV_MW_TYPE_1,
        MwType::Type2 => raw::IBV_MW_TYPE_2,
    }
}

/// Whether a device with `cap_flags` (`device_cap_flags`) and `max_mw`
/// windows has windows of `kind`. Type 2 is either flavour (2A or 2B):
/// both are bound by a work request and associated with a QP.
pub(super) fn has_windows(cap_flags: u32, max_mw: i32, kind: MwType) -> bool {
    let flags = match kind {
        MwType::Type1 => raw::device_cap::MEM_WINDOW,
        MwType::Type2 => raw::device_cap::MEM_WINDOW_TYPE_2A | raw::device_cap::MEM_WINDOW_TYPE_2B,
    };
    max_mw > 0 && cap_flags & flags != 0
}

impl CaRt {
    /// Whether the device has windows of `kind`.
    pub(super) fn has_windows(&self, kind: MwType) -> bool {
        has_windows(self.attr.device_cap_flags, self.attr.max_mw, kind)
    }
}

/// The checks a bind of `len` bytes at `addr` with `access` makes against
/// the MR it names (registered over `[mr_addr, +mr_len)` with `mr_access`)
/// before the device sees it: a type 1 bind is synchronous here, so what
/// the device would only refuse with a failed completion (and a QP in
/// error) is refused at once.
pub(super) fn check_bind(
    mr_range: Option<(u64, u64)>,
    mr_access: AccessFlags,
    addr: u64,
    len: u64,
    access: AccessFlags,
) -> Result<()> {
    // C10-73: the region must allow binding.
    if !mr_access.contains(AccessFlags::MW_BIND) {
        return Err(bad(
            "the MR was registered without MW_BIND: register it with that right to bind windows to it",
        ));
    }
    // C10-74: a writable window needs a locally writable region.
    let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access & writes != AccessFlags::NONE && !mr_access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(bad(
            "a window with remote write or atomic rights needs an MR with LOCAL_WRITE",
        ));
    }
    // C10-75: the window lies inside the region.
    if let Some((start, size)) = mr_range {
        let inside = addr >= start
            && addr
                .checked_add(len)
                .zip(start.checked_add(size))
                .is_some_and(|(end, mr_end)| end <= mr_end);
        if !inside {
            return Err(bad(format!(
                "window [{addr:#x}, +{len}) is not inside its MR [{start:#x}, +{size})"
            )));
        }
    }
    Ok(())
}

impl RdmaCore {
    pub(super) fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> Result<(MwHandle, Rkey)> {
        let (rt, hw_pd) = {
            let st = self.lock();
            let (ca, hw_pd) = st.pd_of(st.pd(pd)?);
            (st.rt(ca), hw_pd)
        };
        if !rt.has_windows(kind) {
            return Err(VerbsError::NotSupported(match kind {
                MwType::Type1 => "type 1 memory windows on this device",
                MwType::Type2 => "type 2 memory windows on this device",
            }));
        }
        let mw = Arc::new(
            sys::Mw::new(&hw_pd, mw_type_raw(kind)).map_err(|e| convert::error("alloc_mw", e))?,
        );
        let rkey = Rkey(mw.rkey());
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_of(p).0;
        st.adjust(p, 1);
        if kind == MwType::Type2 {
            st.type2_windows += 1;
        }
        let h = st.insert(
            Obj::Mw {
                ca,
                pd: p,
                mw,
                kind,
                ctx,
                bound: None,
            },
            None,
        );
        Ok((MwHandle(h), rkey))
    }

    /// A type 1 bind: posted by the driver as an unsignaled bind WR on
    /// `qp`'s send queue (it completes only with `sq_sig_all`, as a
    /// BIND_MW of wr_id 0, or in error). The new R_Key is returned at
    /// once; the device applies the bind in send-queue order, so a key
    /// told to the peer by a later SEND on the same QP is valid when it
    /// arrives (rxe applies it before the post returns).
    pub(super) fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        let (hw_qp, hw_mw, hw_mr, mw_slot, mr_slot) = {
            let st = self.lock();
            let q = st.qp_obj(st.qp(qp)?);
            if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                return Err(VerbsError::InvalidState(q.state));
            }
            let w = st.mw(bind.mw)?;
            let (mw, pd) = match st.obj(w) {
                Obj::Mw { ca, .. } if *ca != q.ca => return Err(VerbsError::InvalidHandle),
                Obj::Mw {
                    kind: MwType::Type2,
                    ..
                } => {
                    return Err(bad(
                        "type 2 windows are bound with a BindMw work request (post_send)",
                    ))
                }
                Obj::Mw { mw, pd, .. } => (mw.clone(), *pd),
                _ => unreachable!("checked MW"),
            };
            let m = st.mr(bind.mr)?;
            let mr = match st.obj(m) {
                Obj::Mr { ca, .. } if *ca != q.ca => return Err(VerbsError::InvalidHandle),
                Obj::Mr { pd: p, .. } if *p != pd => {
                    return Err(bad("the window and the MR are in different PDs"))
                }
                Obj::Mr { mr, access, .. } => {
                    check_bind(Some(mr.range()), *access, bind.addr, bind.len, bind.access)?;
                    mr.clone()
                }
                _ => unreachable!("checked MR"),
            };
            // o10-36.2.2: a type 1 window is addressed by virtual address.
            if bind.access.contains(AccessFlags::ZERO_BASED) {
                return Err(bad("a type 1 window cannot be zero-based"));
            }
            (q.qp.clone(), mw, mr, w, m)
        };
        let rkey = hw_mw
            .bind(&hw_qp, &hw_mr, bind.addr, bind.len, bind.access.bits())
            .map_err(|e| convert::post_error("bind_mw", e))?;
        let mut st = self.lock();
        // Both are still what they were, or the bind raced their destroy
        // (the window's device object keeps the MR alive either way).
        if st.mw(bind.mw) == Ok(mw_slot) && st.mr(bind.mr) == Ok(mr_slot) {
            st.note_bind(mw_slot, mr_slot);
        }
        Ok(Rkey(rkey))
    }

    pub(super) fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        let (rt, hw, ctx) = {
            let mut st = self.lock();
            let i = st.mw(mw)?;
            let (ca, pd, hw, ctx, bound) = match st.remove(i, None) {
                Some(Obj::Mw {
                    ca,
                    pd,
                    mw,
                    ctx,
                    bound,
                    kind,
                }) => {
                    if kind == MwType::Type2 {
                        st.type2_windows -= 1;
                    }
                    (ca, pd, mw, ctx, bound)
                }
                _ => unreachable!("checked MW"),
            };
            if let Some(m) = bound {
                st.count_window(m, -1);
            }
            st.adjust(pd, -1);
            (st.rt(ca), hw, ctx)
        };
        // Deallocated here (then its MR may go) unless a post holds it.
        drop(hw);
        events::retire(&rt, mw.0, ResourceKind::Mw, ctx);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_types_follow_the_capability_flags_and_the_count() {
        use raw::device_cap::*;
        // Linux rxe: type 1 and type 2B.
        let rxe = MEM_WINDOW | MEM_WINDOW_TYPE_2B;
        assert!(has_windows(rxe, 4096, MwType::Type1));
        assert!(has_windows(rxe, 4096, MwType::Type2));
        assert!(has_windows(MEM_WINDOW_TYPE_2A, 1, MwType::Type2));
        assert!(!has_windows(MEM_WINDOW_TYPE_2A, 1, MwType::Type1));
        assert!(!has_windows(MEM_WINDOW, 1, MwType::Type2));
        // No windows to allocate: none, whatever the flags say.
        assert!(!has_windows(rxe, 0, MwType::Type1));
        assert!(!has_windows(0, 4096, MwType::Type1));
        assert_eq!(mw_type_raw(MwType::Type1), 1);
        assert_eq!(mw_type_raw(MwType::Type2), 2);
    }

    #[test]
    fn a_bind_outside_its_mr_or_without_the_rights_is_refused() {
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let mr = Some((0x1000, 0x1000));
        let w = AccessFlags::REMOTE_WRITE;
        assert!(check_bind(mr, all, 0x1000, 0x1000, w).is_ok());
        assert!(check_bind(mr, all, 0x1800, 0x800, w).is_ok());
        assert!(check_bind(mr, all, 0x1800, 0x801, w).is_err());
        assert!(check_bind(mr, all, 0xfff, 16, w).is_err());
        assert!(check_bind(mr, all, u64::MAX, 2, w).is_err());
        assert!(check_bind(mr, AccessFlags::LOCAL_WRITE, 0x1000, 8, w).is_err());
        assert!(check_bind(mr, AccessFlags::MW_BIND, 0x1000, 8, w).is_err());
        assert!(check_bind(
            mr,
            AccessFlags::MW_BIND,
            0x1000,
            8,
            AccessFlags::REMOTE_READ
        )
        .is_ok());
        match check_bind(mr, all, 0x3000, 8, w) {
            Err(VerbsError::InvalidArgument(m)) => {
                assert!(m.contains("0x3000") && m.contains("0x1000"), "{m}")
            }
            r => panic!("{r:?}"),
        }
    }
}
