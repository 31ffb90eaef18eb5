//! The provider trait and the consumer's event handler.

use crate::handles::*;
use crate::mem::MemBuf;
use crate::port::{PkeyViolations, PortModify};
use crate::types::*;
use crate::{Result, VerbsError};
use rdma_types::{AccessFlags, Guid, Pkey, PortNum};
use std::sync::Arc;

/// Consumer cookie handed back in every callback instead of a handle.
pub type Context = u64;

/// The owner's callbacks. Providers call these from their own threads (or
/// from inside a verb), never while holding an internal lock, so a handler
/// may call any verb, including `destroy_*` on the object it is called for.
pub trait EventHandler: Send + Sync {
    /// A CQ armed with [`Provider::req_notify_cq`] has a new completion.
    fn on_completion(&self, cq_ctx: Context);
    /// An asynchronous event.
    fn on_async_event(&self, event: AsyncEvent);
    /// The object is gone and no callback for it will follow.
    fn on_destroyed(&self, kind: ResourceKind, ctx: Context) {
        let _ = (kind, ctx);
    }
}

/// A handler for consumers that poll and ignore asynchronous events.
#[derive(Debug, Clone, Copy, Default)]
pub struct IgnoreEvents;

impl EventHandler for IgnoreEvents {
    fn on_completion(&self, _cq_ctx: Context) {}
    fn on_async_event(&self, _event: AsyncEvent) {}
}

macro_rules! unsupported {
    ($what:literal) => {
        Err(VerbsError::NotSupported($what))
    };
}

/// A verbs provider. Methods are grouped by object and sorted; every one
/// defaults to `NotSupported`.
#[allow(unused_variables)]
pub trait Provider: Send + Sync {
    /// Short name ("loopback", "softroce").
    fn name(&self) -> &'static str;

    /// Whether handlers may run on a consumer's thread inside one of this
    /// provider's calls (the loopback provider completes work, and calls
    /// the peer's handlers, inside `post_send`). When false, handlers run
    /// on the provider's own threads only, so a handler may block on a
    /// lock its consumer holds while posting; when true it must not.
    fn handlers_nest(&self) -> bool {
        false
    }

    // ---- CA ----
    /// GUIDs of the CAs this provider can open.
    fn list_cas(&self) -> Vec<Guid> {
        Vec::new()
    }
    /// Opens a CA by GUID; `handler` receives every callback of every object
    /// created under it.
    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        unsupported!("open_ca")
    }
    /// CA capabilities.
    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        unsupported!("query_ca")
    }
    /// Closes the CA (asynchronous, like every destroy).
    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        unsupported!("close_ca")
    }

    // ---- port ----
    /// Port attributes (GIDs, LID, state, MTU, P_Key table).
    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        unsupported!("query_port")
    }
    /// Index of `pkey` in the port's table.
    fn find_pkey(&self, ca: CaHandle, port: PortNum, pkey: Pkey) -> Result<u16> {
        let attr = self.query_port(ca, port)?;
        attr.pkeys
            .iter()
            .position(|p| p.0 == pkey.0)
            .map(|i| i as u16)
            .ok_or_else(|| {
                VerbsError::InvalidArgument(format!("P_Key {:#06x} not in table", pkey.0))
            })
    }

    /// Applies what the port's subnet management agent was told (see
    /// [`PortModify`]): all of `modify` or, on an error, none of it. A
    /// provider whose port has no SMA of ours (a RoCE port, a NIC whose
    /// firmware runs the SMA) refuses with `NotSupported`.
    fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()> {
        unsupported!("modify_port")
    }
    /// The packets the port dropped for their P_Key since the last call
    /// (for the SMA's PortInfo:P_KeyViolations and trap 257); `None` when
    /// there were none.
    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        unsupported!("take_pkey_violations")
    }

    // ---- PD ----
    /// Allocates a protection domain on the CA.
    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        unsupported!("alloc_pd")
    }
    /// Frees a PD; refused with `Busy` while objects live in it.
    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        unsupported!("dealloc_pd")
    }

    // ---- CQ ----
    /// Creates a CQ in a PD (seed deviation: CQs belong to a PD).
    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        unsupported!("create_cq")
    }
    /// Destroys a CQ; refused with `Busy` while a QP uses it.
    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        unsupported!("destroy_cq")
    }
    /// Polls up to `out.len()` completions; returns how many were written.
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        unsupported!("poll_cq")
    }
    /// Arms the CQ: the next (solicited only, if `solicited_only`) completion
    /// calls `on_completion` once.
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        unsupported!("req_notify_cq")
    }
    /// Blocks until the CQ is non-empty or `timeout` passes (`Timeout`).
    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        unsupported!("wait_cq")
    }
    /// For a consumer thread about to wait for completions on `cq`: waits
    /// up to `timeout` doing on this thread what the provider's own thread
    /// would do to make them (a software NIC receives and handles what
    /// arrived for its port; a NIC daemon's client sleeps on the CQ's
    /// shared ring, which the daemon wakes), so the one thread woken is
    /// the one waiting.
    /// Completions of QPs whose CQs are all `cq` land in it here (an armed
    /// `cq` calls its handler on this thread, which must hold no lock that
    /// handler takes); those of other QPs are left to the provider's
    /// threads. Returns `Ok(false)`, having waited for nothing, when the
    /// provider has no such work for a consumer's thread (the default:
    /// hardware, or another thread drives it now): the caller then waits
    /// its own way (an armed CQ's callback, [`Provider::wait_cq`]).
    /// For the first `spin` of the wait it looks without sleeping: a
    /// consumer that expects its answer within that long saves the sleep
    /// and the wake-up, which on a busy host cost more than the answer.
    fn drive_cq(
        &self,
        cq: CqHandle,
        spin: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        Ok(false)
    }

    // ---- SRQ ----
    /// Creates a shared receive queue.
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        unsupported!("create_srq")
    }
    /// Sets the SRQ limit (re-arms the limit event).
    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        unsupported!("modify_srq")
    }
    /// Current SRQ attributes.
    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        unsupported!("query_srq")
    }
    /// Destroys an SRQ.
    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        unsupported!("destroy_srq")
    }

    // ---- QP ----
    /// Creates a QP in RESET.
    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        unsupported!("create_qp")
    }
    /// The QP number.
    fn qp_num(&self, qp: QpHandle) -> Result<rdma_types::Qpn> {
        unsupported!("qp_num")
    }
    /// Modifies the QP; `attr.state` selects the transition, whose required
    /// and optional attributes are checked by [`crate::kit::qp_table`]
    /// (and the path migration ones by [`crate::kit::apm`]; a provider
    /// without path migration answers `NotSupported` to an alternate path).
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        unsupported!("modify_qp")
    }
    /// Current attributes (state always set).
    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        unsupported!("query_qp")
    }
    /// Destroys a QP (asynchronous).
    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        unsupported!("destroy_qp")
    }

    // ---- AH ----
    /// Creates an address handle.
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        unsupported!("create_ah")
    }
    /// Destroys an address handle.
    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        unsupported!("destroy_ah")
    }

    // ---- MR ----
    /// Registers `[addr, addr+len)` inside `buf`.
    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        unsupported!("reg_mr")
    }
    /// Re-registers: new range/access, new keys, same handle.
    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        unsupported!("rereg_mr")
    }
    /// Deregisters; refused with `Busy` while a window is bound.
    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        unsupported!("dereg_mr")
    }

    // ---- MW ----
    /// Allocates a memory window; returns it with its initial R_Key (a
    /// type 2 bind WR gives this key with a new low byte, IBA 10.6.7.2.1).
    fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> Result<(MwHandle, rdma_types::Rkey)> {
        unsupported!("alloc_mw")
    }
    /// Binds a type 1 window (synchronous form; returns the new R_Key).
    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<rdma_types::Rkey> {
        unsupported!("bind_mw")
    }
    /// Deallocates a window.
    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        unsupported!("dealloc_mw")
    }

    // ---- post/poll ----
    /// Posts send WRs in order; on failure `BadWr{index}` says which WR was
    /// refused (those before it were posted).
    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        unsupported!("post_send")
    }
    /// Posts receive WRs.
    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        unsupported!("post_recv")
    }
    /// Posts receive WRs to an SRQ.
    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        unsupported!("post_srq_recv")
    }

    // ---- QP1 shared by processes ----
    // Unlike the verbs above these default to success: on a provider whose
    // port's QP1 belongs to the consumer alone (every provider but the NIC
    // daemon's client) there is nothing to tell.
    /// Tells a provider whose port's QP1 several processes share (the NIC
    /// daemon's client) that the owner of GSI QP `qp` serves unsolicited
    /// requests of `methods` of management class `class`, version
    /// `version` (`serve`), so the daemon hands them to it, or serves
    /// them no longer (`!serve`). Refused (`Busy`) when another process
    /// serves one of them, or (`InvalidArgument`) for a class the caller
    /// may not serve.
    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        Ok(())
    }
    /// As [`Provider::gsi_register`] for the CM: connection requests for
    /// `service_id` go to the owner of GSI QP `qp` (`listen`) or no longer
    /// (`!listen`). Refused (`Busy`) when another process listens on it.
    fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bare;
    impl Provider for Bare {
        fn name(&self) -> &'static str {
            "bare"
        }
    }

    #[test]
    fn unimplemented_verbs_say_not_supported() {
        let p: &dyn Provider = &Bare;
        let h = crate::Handle {
            index: 0,
            generation: 0,
        };
        assert_eq!(
            p.alloc_pd(CaHandle(h), 0),
            Err(VerbsError::NotSupported("alloc_pd"))
        );
        assert_eq!(
            p.post_send(QpHandle(h), &[]),
            Err(VerbsError::NotSupported("post_send"))
        );
        assert_eq!(
            p.alloc_mw(PdHandle(h), MwType::Type2, 0),
            Err(VerbsError::NotSupported("alloc_mw"))
        );
        assert!(p.list_cas().is_empty());
        assert_eq!(
            VerbsError::NotSupported("alloc_mw").to_string(),
            "not supported by this provider: alloc_mw"
        );
    }
}
