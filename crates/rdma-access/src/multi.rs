//! Several verbs providers behind one: the access layer's view of a host
//! with NICs of more than one kind (seed 004, goals 4a/4b: RNICs of
//! several vendors in use at once), such as our soft RoCE NIC beside an
//! rdma-core device, or two rdma-core devices and the loopback fabric.
//!
//! [`Providers`] is itself a [`Provider`]: [`Provider::list_cas`] lists
//! every provider's CAs, and [`Provider::open_ca`] goes to the provider
//! that has the GUID (the first, when two list the same one). Every
//! handle a provider gives back carries that provider's place in the
//! set, in the top 8 bits of its index, so each later call goes to the
//! provider that made the object, with no table to look it up in. A
//! handle of one provider named in a call on another's object (a CQ of
//! the loopback fabric given to a soft RoCE QP) is refused with
//! `InvalidHandle`, as a stale handle is: objects of two NICs never mix.
//! Callbacks reach the consumer as each provider makes them (they carry
//! consumer contexts, never handles).
//!
//! Handles cost nothing on the data path: a post or a poll strips the
//! tag and calls the provider. Only a work request that names a handle
//! (a UD destination's address handle, a window bind) is copied to be
//! translated.

use rdma_types::{AccessFlags, Guid, PortNum, Rkey};
use std::sync::Arc;
use verbs::{
    AhAttr, AhHandle, CaAttr, CaHandle, Context, CqHandle, CqInit, EventHandler, Handle, MemBuf,
    MrHandle, MrInfo, MwBind, MwHandle, MwType, PdHandle, PkeyViolations, PortAttr, PortModify,
    Provider, QpAttr, QpHandle, QpInit, RecvWr, Result, SendWr, SrqAttr, SrqHandle, VerbsError,
    WorkCompletion,
};

/// Bits of a handle's index left to the provider that made it.
const INDEX_BITS: u32 = 24;
/// Providers one set can hold (the tag is 8 bits).
pub const MAX_PROVIDERS: usize = 1 << (32 - INDEX_BITS);
/// A provider whose handles' indices stay below this can be in a set;
/// a handle past it is refused (`OutOfResources`) when the set would
/// hand it out.
pub const INDEX_LIMIT: u32 = 1 << INDEX_BITS;

/// Several providers as one (see the module docs).
pub struct Providers {
    all: Vec<Arc<dyn Provider>>,
}

/// A handle type's raw handle, both ways.
trait Tagged: Copy {
    fn raw(self) -> Handle;
    fn with(h: Handle) -> Self;
}

macro_rules! tagged {
    ($($t:ty),*) => {$(
        impl Tagged for $t {
            fn raw(self) -> Handle {
                self.0
            }
            fn with(h: Handle) -> Self {
                Self(h)
            }
        }
    )*};
}
tagged!(CaHandle, PdHandle, CqHandle, QpHandle, SrqHandle, MrHandle, MwHandle, AhHandle);

impl Providers {
    /// The set of `all`, in order (a GUID two of them list is the
    /// first's).
    ///
    /// # Errors
    /// `InvalidArgument` for no provider or more than [`MAX_PROVIDERS`].
    pub fn new(all: Vec<Arc<dyn Provider>>) -> Result<Providers> {
        if all.is_empty() || all.len() > MAX_PROVIDERS {
            return Err(VerbsError::InvalidArgument(format!(
                "a set of providers holds 1 to {MAX_PROVIDERS}, not {}",
                all.len()
            )));
        }
        Ok(Providers { all })
    }

    /// The providers, in order.
    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        &self.all
    }

    /// The provider that has CA `guid`.
    pub fn provider_of(&self, guid: Guid) -> Option<&Arc<dyn Provider>> {
        self.all.iter().find(|p| p.list_cas().contains(&guid))
    }

    /// `h` as its provider knows it, and which provider that is.
    fn split<H: Tagged>(&self, h: H) -> Result<(usize, H)> {
        let raw = h.raw();
        let which = (raw.index >> INDEX_BITS) as usize;
        if which >= self.all.len() {
            return Err(VerbsError::InvalidHandle);
        }
        Ok((
            which,
            H::with(Handle {
                index: raw.index & ((1 << INDEX_BITS) - 1),
                generation: raw.generation,
            }),
        ))
    }

    /// `h` of provider `which`, as the set's consumer sees it.
    fn tag<H: Tagged>(which: usize, h: H) -> Result<H> {
        let raw = h.raw();
        if raw.index >> INDEX_BITS != 0 {
            return Err(VerbsError::OutOfResources(
                "a provider's handle index past 2^24 (the set keeps the top 8 bits)",
            ));
        }
        Ok(H::with(Handle {
            index: raw.index | (which as u32) << INDEX_BITS,
            generation: raw.generation,
        }))
    }

    /// `h` stripped for provider `which`; a handle of another provider is
    /// `InvalidHandle`.
    fn same<H: Tagged>(&self, which: usize, h: H) -> Result<H> {
        match self.split(h)? {
            (w, inner) if w == which => Ok(inner),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    fn on<H: Tagged>(&self, h: H) -> Result<(&Arc<dyn Provider>, usize, H)> {
        let (which, inner) = self.split(h)?;
        Ok((&self.all[which], which, inner))
    }

    fn mr_info(which: usize, mut info: MrInfo) -> Result<MrInfo> {
        info.handle = Self::tag(which, info.handle)?;
        Ok(info)
    }

    fn bind(&self, which: usize, b: &MwBind) -> Result<MwBind> {
        Ok(MwBind {
            mw: self.same(which, b.mw)?,
            mr: self.same(which, b.mr)?,
            ..*b
        })
    }
}

impl Provider for Providers {
    fn name(&self) -> &'static str {
        "providers"
    }

    fn handlers_nest(&self) -> bool {
        self.all.iter().any(|p| p.handlers_nest())
    }

    fn list_cas(&self) -> Vec<Guid> {
        let mut out = Vec::new();
        for p in &self.all {
            for g in p.list_cas() {
                if !out.contains(&g) {
                    out.push(g);
                }
            }
        }
        out
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        let which = self
            .all
            .iter()
            .position(|p| p.list_cas().contains(&guid))
            .ok_or(VerbsError::NoSuchCa)?;
        Self::tag(which, self.all[which].open_ca(guid, ctx, handler)?)
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let (p, _, ca) = self.on(ca)?;
        p.query_ca(ca)
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let (p, _, ca) = self.on(ca)?;
        p.close_ca(ca)
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let (p, _, ca) = self.on(ca)?;
        p.query_port(ca, port)
    }

    fn find_pkey(&self, ca: CaHandle, port: PortNum, pkey: rdma_types::Pkey) -> Result<u16> {
        let (p, _, ca) = self.on(ca)?;
        p.find_pkey(ca, port, pkey)
    }

    fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()> {
        let (p, _, ca) = self.on(ca)?;
        p.modify_port(ca, port, modify)
    }

    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        let (p, _, ca) = self.on(ca)?;
        p.take_pkey_violations(ca, port)
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let (p, which, ca) = self.on(ca)?;
        Self::tag(which, p.alloc_pd(ca, ctx)?)
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let (p, _, pd) = self.on(pd)?;
        p.dealloc_pd(pd)
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        let (p, which, pd) = self.on(pd)?;
        Self::tag(which, p.create_cq(pd, init, ctx)?)
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        let (p, _, cq) = self.on(cq)?;
        p.destroy_cq(cq)
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let (p, _, cq) = self.on(cq)?;
        p.poll_cq(cq, out)
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let (p, _, cq) = self.on(cq)?;
        p.req_notify_cq(cq, solicited_only)
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        let (p, _, cq) = self.on(cq)?;
        p.wait_cq(cq, timeout)
    }

    fn drive_cq(
        &self,
        cq: CqHandle,
        spin: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        let (p, _, cq) = self.on(cq)?;
        p.drive_cq(cq, spin, timeout)
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        let (p, which, pd) = self.on(pd)?;
        Self::tag(which, p.create_srq(pd, attr, ctx)?)
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        let (p, _, srq) = self.on(srq)?;
        p.modify_srq(srq, limit)
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        let (p, _, srq) = self.on(srq)?;
        p.query_srq(srq)
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        let (p, _, srq) = self.on(srq)?;
        p.destroy_srq(srq)
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        let (p, which, pd) = self.on(pd)?;
        let init = QpInit {
            send_cq: self.same(which, init.send_cq)?,
            recv_cq: self.same(which, init.recv_cq)?,
            srq: init.srq.map(|s| self.same(which, s)).transpose()?,
            ..*init
        };
        Self::tag(which, p.create_qp(pd, &init, ctx)?)
    }

    fn qp_num(&self, qp: QpHandle) -> Result<rdma_types::Qpn> {
        let (p, _, qp) = self.on(qp)?;
        p.qp_num(qp)
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        let (p, _, qp) = self.on(qp)?;
        p.modify_qp(qp, attr)
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        let (p, _, qp) = self.on(qp)?;
        p.query_qp(qp)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let (p, _, qp) = self.on(qp)?;
        p.destroy_qp(qp)
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let (p, which, pd) = self.on(pd)?;
        Self::tag(which, p.create_ah(pd, attr)?)
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        let (p, _, ah) = self.on(ah)?;
        p.destroy_ah(ah)
    }

    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        let (p, which, pd) = self.on(pd)?;
        Self::mr_info(which, p.reg_mr(pd, buf, addr, len, access, ctx)?)
    }

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let (p, which, mr) = self.on(mr)?;
        Self::mr_info(which, p.rereg_mr(mr, buf, addr, len, access)?)
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        let (p, _, mr) = self.on(mr)?;
        p.dereg_mr(mr)
    }

    fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)> {
        let (p, which, pd) = self.on(pd)?;
        let (mw, rkey) = p.alloc_mw(pd, kind, ctx)?;
        Ok((Self::tag(which, mw)?, rkey))
    }

    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        let (p, which, qp) = self.on(qp)?;
        p.bind_mw(qp, &self.bind(which, bind)?)
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        let (p, _, mw) = self.on(mw)?;
        p.dealloc_mw(mw)
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        let (p, which, qp) = self.on(qp)?;
        if wrs.iter().all(|w| w.ud.is_none() && w.bind_mw.is_none()) {
            return p.post_send(qp, wrs);
        }
        // Handles inside the requests: translated on a copy. A request
        // naming another provider's object is refused as the provider
        // refuses a bad one: those before it are posted.
        let mut inner = Vec::with_capacity(wrs.len());
        for (index, w) in wrs.iter().enumerate() {
            let mut w = w.clone();
            let fixed = (|| -> Result<()> {
                if let Some(ud) = &mut w.ud {
                    ud.ah = self.same(which, ud.ah)?;
                }
                if let Some(b) = &mut w.bind_mw {
                    *b = self.bind(which, b)?;
                }
                Ok(())
            })();
            if let Err(cause) = fixed {
                p.post_send(qp, &inner)?;
                return Err(VerbsError::BadWr {
                    index,
                    cause: Box::new(cause),
                });
            }
            inner.push(w);
        }
        p.post_send(qp, &inner)
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        let (p, _, qp) = self.on(qp)?;
        p.post_recv(qp, wrs)
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        let (p, _, srq) = self.on(srq)?;
        p.post_srq_recv(srq, wrs)
    }

    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        let (p, _, qp) = self.on(qp)?;
        p.gsi_register(qp, class, version, methods, serve)
    }

    fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<()> {
        let (p, _, qp) = self.on(qp)?;
        p.gsi_listen(qp, service_id, listen)
    }
}
