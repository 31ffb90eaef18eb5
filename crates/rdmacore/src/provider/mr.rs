//! Memory regions over the consumer's `MemBuf`s (its address is the VA the
//! device is given; the MR keeps the buffer alive while registered).

use super::events;
use super::objects::Obj;
use super::{bad, RdmaCore};
use crate::convert;
use crate::sys;
use rdma_types::{AccessFlags, Lkey, Rkey};
use std::sync::Arc;
use verbs::{Context, MemBuf, MrHandle, MrInfo, PdHandle, ResourceKind, Result, VerbsError};

/// The checks every registration makes before the device sees it.
fn check(buf: &MemBuf, addr: u64, len: u64, access: AccessFlags) -> Result<()> {
    if !buf.contains(addr, len) {
        return Err(bad(format!(
            "[{addr:#x}, +{len}) is not inside the buffer {buf:?}"
        )));
    }
    if !access.is_valid_for_mr() {
        return Err(bad(format!(
            "access {access:?}: remote write or atomic rights need LOCAL_WRITE (IBA 10.6.3.1)"
        )));
    }
    Ok(())
}

/// Why an MR with a window on it stays (IBA 10.6.7.1: a region with
/// bound windows cannot be deregistered).
fn bound_window() -> VerbsError {
    VerbsError::Busy(
        "MR has a memory window bound: deallocate or invalidate the window, or bind it elsewhere, first",
    )
}

fn info(handle: MrHandle, mr: &sys::Mr, addr: u64, len: u64) -> MrInfo {
    MrInfo {
        handle,
        lkey: Lkey(mr.lkey()),
        rkey: Rkey(mr.rkey()),
        addr,
        len,
    }
}

impl RdmaCore {
    fn hw_pd(&self, pd: PdHandle) -> Result<Arc<sys::Pd>> {
        let st = self.lock();
        Ok(st.pd_of(st.pd(pd)?).1)
    }

    pub(super) fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        check(buf, addr, len, access)?;
        let hw_pd = self.hw_pd(pd)?;
        let mr = sys::Mr::new(&hw_pd, buf, addr, len, access.bits())
            .map_err(|e| convert::error("reg_mr", e))?;
        let mut st = self.lock();
        let p = st.pd(pd)?;
        let ca = st.pd_of(p).0;
        st.adjust(p, 1);
        let mr = Arc::new(mr);
        let h = MrHandle(st.insert(
            Obj::Mr {
                ca,
                pd: p,
                mr: mr.clone(),
                ctx,
                access,
                windows: 0,
            },
            None,
        ));
        Ok(info(h, &mr, addr, len))
    }

    /// A new registration first, then the old one goes: the keys change
    /// (the old R_Key is dead once this returns), the handle stays.
    pub(super) fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        check(buf, addr, len, access)?;
        let hw_pd = {
            let st = self.lock();
            match st.obj(st.mr(mr)?) {
                Obj::Mr { windows, .. } if *windows > 0 => return Err(bound_window()),
                Obj::Mr { pd, .. } => st.pd_of(*pd).1,
                _ => unreachable!("checked MR"),
            }
        };
        let new = Arc::new(
            sys::Mr::new(&hw_pd, buf, addr, len, access.bits())
                .map_err(|e| convert::error("rereg_mr", e))?,
        );
        let old = {
            let mut st = self.lock();
            let i = st.mr(mr)?;
            match st.obj_mut(i) {
                // A window bound meanwhile keeps the old registration.
                Obj::Mr { windows, .. } if *windows > 0 => return Err(bound_window()),
                Obj::Mr {
                    mr: m, access: a, ..
                } => {
                    *a = access;
                    std::mem::replace(m, new.clone())
                }
                _ => unreachable!("checked MR"),
            }
        };
        drop(old);
        Ok(info(mr, &new, addr, len))
    }

    pub(super) fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let (rt, hw, ctx) = {
            let mut st = self.lock();
            let i = st.mr(mr)?;
            if let Obj::Mr { windows, .. } = st.obj(i) {
                if *windows > 0 {
                    return Err(bound_window());
                }
            }
            let (ca, pd, hw, ctx) = match st.remove(i, None) {
                Some(Obj::Mr {
                    ca, pd, mr, ctx, ..
                }) => (ca, pd, mr, ctx),
                _ => unreachable!("checked MR"),
            };
            st.adjust(pd, -1);
            (st.rt(ca), hw, ctx)
        };
        drop(hw);
        events::retire(&rt, mr.0, ResourceKind::Mr, ctx);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_outside_the_buffer_or_without_local_write_are_refused() {
        let b = MemBuf::new(4096);
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(check(&b, b.addr(), 4096, all).is_ok());
        assert!(check(&b, b.addr() + 1, 4096, AccessFlags::NONE).is_err());
        assert!(check(&b, b.addr() - 1, 1, AccessFlags::NONE).is_err());
        assert!(check(&b, b.addr(), 10, AccessFlags::REMOTE_WRITE).is_err());
        assert!(check(&b, b.addr(), 10, AccessFlags::REMOTE_ATOMIC).is_err());
        assert!(check(&b, b.addr(), 10, AccessFlags::REMOTE_READ).is_ok());
    }
}
