//! The daemon's client with its QPs' transport in this process
//! ([`Direct`]): the same path as a NIC of the tool's own, on the
//! daemon's address.
//!
//! For each CA it opens, the client borrows a member of the NIC's shared
//! port ([`crate::shared`]: a socket of the port's `SO_REUSEPORT` group
//! and a block of QP numbers the kernel steers to it) and runs a soft
//! RoCE node of its own on it (`rnic::softroce`, [`SharedPort`]). Every
//! verb of the data path goes to that node: PDs, CQs, SRQs, RC/UC/UD QPs,
//! registrations, windows, posts and polls, with no hand-off to the
//! daemon. What the daemon keeps is the port: its QP1 (GSI QPs are the
//! daemon client's, so the CM, SA client and DM agent work as before),
//! its attributes and their changes, the limits, and the list of who
//! holds what.
//!
//! A PD, CQ, MR and AH are made on both sides: the node's is the
//! consumer's handle (and keys), the daemon's half serves a GSI QP (its
//! sends read MADs through the daemon's registration; an MR registered
//! here counts against the client's limit there). A QP's half is only
//! counted there (`Request::CountQp`): against the client's QP limit,
//! and in the daemon's list of who holds what. A GSI QP, and every
//! object of a CA whose port the daemon does not share (an `ib` port),
//! are the daemon client's alone, under handles of this provider's own
//! ([`SYNTHETIC`]).
//!
//! Callbacks reach the consumer's handler once: the node's for its
//! objects (halves included), the daemon's for GSI QPs, the CA's port
//! events and its removal, and for every object of an unshared CA.

use crate::client::NicdProvider;
use rdma_types::{AccessFlags, Guid, Pkey, PortNum, Qpn, Rkey};
use rnic::softroce::{NicOptions, SharedPort, SoftCa, SoftRoce};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use verbs::{
    AhAttr, AhHandle, AsyncEvent, CaAttr, CaHandle, Context, CqHandle, CqInit, EventHandler,
    Handle, MemBuf, MrHandle, MrInfo, MwBind, MwHandle, MwType, PdHandle, PkeyViolations, PortAttr,
    PortModify, Provider, QpAttr, QpHandle, QpInit, RecvWr, ResourceKind, Result, SendWr, SrqAttr,
    SrqHandle, VerbsError, WorkCompletion,
};

/// The bit of a handle's index that marks it as this provider's own,
/// standing for a handle of the daemon client (the node's indices stay
/// below it).
pub const SYNTHETIC: u32 = 1 << 23;

/// The daemon client's half of a paired object, or the daemon client's
/// object behind a synthetic handle.
#[derive(Clone, Copy)]
struct CtlObj {
    h: Handle,
    /// Made under a paired PD (a GSI QP on a shared CA): its SGEs' keys
    /// and AHs are the node's and are translated.
    paired: bool,
}

#[derive(Default)]
struct State {
    /// Node handle -> the daemon client's half (CA, PD, CQ, MR, AH).
    halves: HashMap<(u8, Handle), Handle>,
    /// Synthetic handle -> the daemon client's object.
    ctl: HashMap<(u8, Handle), CtlObj>,
    next: u32,
    /// A GSI QP's CQs (node handles), to forget them with the QP.
    gsi_qp_cqs: HashMap<Handle, (CqHandle, CqHandle)>,
    /// Node L_Key -> the daemon's, of each paired MR.
    lkeys: HashMap<u32, u32>,
    /// A paired MR's node L_Key, by its node handle.
    mr_lkeys: HashMap<Handle, u32>,
    /// MRs of memory the daemon cannot reach (private memory), only
    /// counted there: the daemon's half of their PD, by node handle.
    counted_mrs: HashMap<Handle, Handle>,
}

/// The member of each shared CA's port this client holds, by the daemon
/// session it was lent in (the daemon's pid): kept for the CA's next
/// opens in that session, dropped when the daemon removes the CA (it
/// went: a new daemon's group must not meet our socket).
type Lent = HashMap<Guid, (u32, Arc<std::os::fd::OwnedFd>, std::ops::Range<u32>)>;

impl State {
    /// The node's L_Keys of paired MRs in `sges` made the daemon's.
    fn ctl_keys(&self, sges: &mut [verbs::Sge]) {
        for s in sges {
            if let Some(k) = self.lkeys.get(&s.lkey.0) {
                s.lkey = rdma_types::Lkey(*k);
            }
        }
    }
}

fn kind(k: ResourceKind) -> u8 {
    k as u8
}

/// The NIC daemon's client with the data path in this process (see the
/// module docs).
pub struct Direct {
    ctl: Arc<NicdProvider>,
    /// The node's options (link following aside: the daemon's node
    /// follows the link and says so).
    options: NicOptions,
    nic: Arc<OnceLock<Arc<SoftRoce>>>,
    st: Mutex<State>,
    lent: Arc<Mutex<Lent>>,
    /// Node CQs a GSI QP completes on: the daemon's half, and how many
    /// such QPs (read on every poll and arm, apart from the other state).
    gsi_cqs: std::sync::RwLock<HashMap<Handle, (Handle, usize)>>,
}

/// Which side a consumer's handle stands for.
enum At<'a> {
    Nic(&'a SoftRoce, Handle),
    Ctl(CtlObj),
}

impl Direct {
    /// Over a connected daemon client, its node with the default options.
    pub fn new(ctl: Arc<NicdProvider>) -> Arc<Direct> {
        Direct::with_options(ctl, NicOptions::default())
    }

    /// Over a connected daemon client, its node with `options` (GSO and
    /// faults as a tool's own NIC takes them: [`crate::data_path`]).
    pub fn with_options(ctl: Arc<NicdProvider>, options: NicOptions) -> Arc<Direct> {
        Arc::new(Direct {
            ctl,
            options,
            nic: Arc::default(),
            st: Mutex::new(State {
                next: 1,
                ..State::default()
            }),
            lent: Arc::default(),
            gsi_cqs: std::sync::RwLock::default(),
        })
    }

    /// The daemon client underneath.
    pub fn daemon(&self) -> &Arc<NicdProvider> {
        &self.ctl
    }

    /// The node provider of this process, once a CA is open on a shared
    /// port (its counters, for tools and tests).
    pub fn nic(&self) -> Option<Arc<SoftRoce>> {
        self.nic.get().cloned()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node provider, borrowed (the posts' and polls' way).
    fn nic_ref(&self) -> Result<&Arc<SoftRoce>> {
        self.nic.get().ok_or(VerbsError::InvalidHandle)
    }

    fn at(&self, k: ResourceKind, h: Handle) -> Result<At<'_>> {
        if h.index & SYNTHETIC != 0 {
            let o = self.lock().ctl.get(&(kind(k), h)).copied();
            return o.map(At::Ctl).ok_or(VerbsError::InvalidHandle);
        }
        Ok(At::Nic(self.nic_ref()?, h))
    }

    fn half(&self, k: ResourceKind, h: Handle) -> Result<Handle> {
        self.lock()
            .halves
            .get(&(kind(k), h))
            .copied()
            .ok_or(VerbsError::InvalidHandle)
    }

    /// A synthetic handle for the daemon client's `h`.
    fn adopt(&self, k: ResourceKind, h: Handle, paired: bool) -> Handle {
        let mut st = self.lock();
        let n = st.next;
        st.next = (n + 1) % SYNTHETIC;
        if st.next == 0 {
            st.next = 1;
        }
        let mine = Handle {
            index: SYNTHETIC | n,
            generation: h.generation ^ h.index,
        };
        st.ctl.insert((kind(k), mine), CtlObj { h, paired });
        mine
    }

    fn forget(&self, k: ResourceKind, h: Handle) {
        let mut st = self.lock();
        st.ctl.remove(&(kind(k), h));
        st.halves.remove(&(kind(k), h));
    }

    /// The node provider, made with the first lent member (its UDP port
    /// is the daemon's).
    fn nic_for(&self, port: u16, mtu: rdma_types::Mtu) -> Arc<SoftRoce> {
        self.nic
            .get_or_init(|| {
                let options = NicOptions {
                    // The daemon's node follows the link and says so.
                    follow_link: false,
                    ..self.options.clone()
                };
                SoftRoce::with_options(Vec::new(), port, mtu, options)
            })
            .clone()
    }

    /// Opens CA `guid` on the node, with a member of its shared port
    /// (borrowed once per daemon session); `None` when the daemon shares
    /// none for it.
    fn open_nic(
        &self,
        guid: Guid,
        ctl_ca: CaHandle,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<Option<CaHandle>> {
        let session = self.ctl.daemon_pid();
        let lent = || self.lent.lock().unwrap_or_else(|e| e.into_inner());
        let have = lent().get(&guid).cloned();
        let (fd, qpns) = match have {
            Some((pid, fd, qpns)) if pid == session => (fd, qpns),
            _ => match self.ctl.share_port(ctl_ca) {
                Ok((qpns, fd)) => {
                    let fd = Arc::new(fd);
                    lent().insert(guid, (session, fd.clone(), qpns.clone()));
                    (fd, qpns)
                }
                Err(VerbsError::NotSupported(_)) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let attr = self.ctl.query_port(ctl_ca, PortNum(1))?;
        let ip =
            attr.gids.first().map(|g| g.to_ip()).ok_or_else(|| {
                VerbsError::InvalidArgument("the daemon's port has no GID".into())
            })?;
        let port = socket2::SockRef::from(&*fd)
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .ok_or_else(|| VerbsError::InvalidArgument("the lent socket has no address".into()))?;
        let nic = self.nic_for(port, attr.active_mtu);
        if !nic.list_cas().contains(&guid) {
            nic.add_ca(SoftCa { guid, ip })?;
        }
        // A CA not open (its first open, or after every close) takes
        // the member; one open keeps the member it has.
        let _ = nic.share_port(guid, Some(SharedPort { socket: fd, qpns }));
        nic.open_ca(guid, ctx, handler).map(Some)
    }
}

/// The consumer's handler, as the daemon client calls it for a CA: the
/// halves' destructions are the node's to tell; the CA's removal (the
/// daemon went) also lets go of the member of its port; everything else
/// passes.
struct CtlSide {
    to: Arc<dyn EventHandler>,
    /// The CA is served by the daemon client alone (set once the open
    /// knows whether the daemon shares its port).
    alone: Arc<std::sync::atomic::AtomicBool>,
    lent: Arc<Mutex<Lent>>,
    nic: Arc<OnceLock<Arc<SoftRoce>>>,
    guid: Guid,
}

impl EventHandler for CtlSide {
    fn on_completion(&self, cq_ctx: Context) {
        self.to.on_completion(cq_ctx);
    }
    fn on_async_event(&self, event: AsyncEvent) {
        if event.kind == verbs::AsyncEventKind::CaRemoval {
            // Our member of the port's group goes now, so a daemon in
            // this one's place finds the port free (it waits for that),
            // whenever the consumer closes the CA.
            let mut l = self.lent.lock().unwrap_or_else(|e| e.into_inner());
            l.remove(&self.guid);
            drop(l);
            if let Some(n) = self.nic.get() {
                let _ = n.retire_socket(self.guid);
            }
        }
        self.to.on_async_event(event);
    }
    fn on_destroyed(&self, k: ResourceKind, ctx: Context) {
        if self.alone.load(std::sync::atomic::Ordering::Relaxed) || k == ResourceKind::Qp {
            self.to.on_destroyed(k, ctx);
        }
    }
}

/// Each verb on the side its first handle stands for.
macro_rules! either {
    ($self:ident, $k:expr, $h:expr, |$p:ident, $x:ident| $body:expr) => {
        match $self.at($k, $h.0)? {
            At::Nic(n, $x) => {
                let $p: &dyn Provider = &*n;
                $body
            }
            At::Ctl(o) => {
                let $x = o.h;
                let $p: &dyn Provider = &*$self.ctl;
                $body
            }
        }
    };
}

impl Direct {
    /// Makes an object under `parent` (kind `pk`) on both sides (a
    /// shared CA's) or on the daemon client's alone.
    fn make<H: Copy>(
        &self,
        pk: ResourceKind,
        parent: Handle,
        k: ResourceKind,
        make: impl Fn(&dyn Provider, Handle) -> Result<(H, Handle)>,
        undo: impl FnOnce(&dyn Provider, Handle),
        wrap: impl FnOnce(Handle) -> H,
    ) -> Result<H> {
        match self.at(pk, parent)? {
            At::Nic(n, h) => {
                let ctl_parent = self.half(pk, h)?;
                let (out, nh) = make(n, h)?;
                match make(&*self.ctl, ctl_parent) {
                    Ok((_, ch)) => {
                        self.lock().halves.insert((kind(k), nh), ch);
                        Ok(out)
                    }
                    Err(e) => {
                        undo(n, nh);
                        Err(e)
                    }
                }
            }
            At::Ctl(o) => {
                let (_, ch) = make(&*self.ctl, o.h)?;
                Ok(wrap(self.adopt(k, ch, false)))
            }
        }
    }

    /// Destroys an object of both sides (node first: its refusal, a
    /// `Busy`, stops both) or of the daemon client's.
    fn unmake(
        &self,
        k: ResourceKind,
        h: Handle,
        destroy: impl Fn(&dyn Provider, Handle) -> Result<()>,
    ) -> Result<()> {
        match self.at(k, h)? {
            At::Nic(n, h) => {
                let half = self.half(k, h).ok();
                destroy(n, h)?;
                if let Some(c) = half {
                    let _ = destroy(&*self.ctl, c);
                }
                self.forget(k, h);
                Ok(())
            }
            At::Ctl(o) => {
                destroy(&*self.ctl, o.h)?;
                self.forget(k, h);
                Ok(())
            }
        }
    }

    /// `make`, and should it fail, the daemon's count `counted` (of
    /// kind `k`, made for it) gone again.
    fn or_uncount<T>(
        &self,
        counted: Option<Handle>,
        k: ResourceKind,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        make().inspect_err(|_| match (counted, k) {
            (Some(c), ResourceKind::Qp) => drop(self.ctl.destroy_qp(QpHandle(c))),
            (Some(c), _) => drop(self.ctl.dereg_mr(MrHandle(c))),
            (None, _) => {}
        })
    }

    /// A send WR of a QP of the daemon client's with its AH (and, under
    /// a paired PD, the node's keys) made the daemon's.
    fn to_ctl_send(&self, paired: bool, mut w: SendWr) -> Result<SendWr> {
        let st = self.lock();
        if paired {
            st.ctl_keys(&mut w.sges);
        }
        if let Some(ud) = &mut w.ud {
            let ah = (kind(ResourceKind::Ah), ud.ah.0);
            let h = match ud.ah.0.index & SYNTHETIC {
                0 => st.halves.get(&ah).copied(),
                _ => st.ctl.get(&ah).map(|o| o.h),
            };
            ud.ah = AhHandle(h.ok_or(VerbsError::InvalidHandle)?);
        }
        if let Some(b) = &mut w.bind_mw {
            for (k, h) in [
                (ResourceKind::Mw, &mut b.mw.0),
                (ResourceKind::Mr, &mut b.mr.0),
            ] {
                if let Some(o) = st.ctl.get(&(kind(k), *h)) {
                    *h = o.h;
                }
            }
        }
        Ok(w)
    }

    fn to_ctl_recv(&self, mut w: RecvWr) -> RecvWr {
        self.lock().ctl_keys(&mut w.sges);
        w
    }

    /// The daemon's half of node CQ `cq` when a GSI QP completes there.
    fn gsi_half(&self, cq: CqHandle) -> Option<Handle> {
        let g = self.gsi_cqs.read().unwrap_or_else(|e| e.into_inner());
        g.get(&cq.0).map(|(half, _)| *half)
    }
}

impl Provider for Direct {
    fn name(&self) -> &'static str {
        "nicd"
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.ctl.list_cas()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        // The daemon client's CA first: whether it is shared decides what
        // its handler passes on, so that waits for the answer below.
        let alone = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let ctl_ca = self.ctl.open_ca(
            guid,
            ctx,
            Arc::new(CtlSide {
                to: handler.clone(),
                alone: alone.clone(),
                lent: self.lent.clone(),
                nic: self.nic.clone(),
                guid,
            }),
        )?;
        match self.open_nic(guid, ctl_ca, ctx, handler) {
            Ok(Some(ca)) => {
                alone.store(false, std::sync::atomic::Ordering::Relaxed);
                self.lock()
                    .halves
                    .insert((kind(ResourceKind::Ca), ca.0), ctl_ca.0);
                Ok(ca)
            }
            Ok(None) => Ok(CaHandle(self.adopt(ResourceKind::Ca, ctl_ca.0, false))),
            Err(e) => {
                let _ = self.ctl.close_ca(ctl_ca);
                Err(e)
            }
        }
    }

    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        match self.at(ResourceKind::Ca, ca.0)? {
            At::Nic(_, h) => self.ctl.query_ca(CaHandle(self.half(ResourceKind::Ca, h)?)),
            At::Ctl(o) => self.ctl.query_ca(CaHandle(o.h)),
        }
    }

    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        self.unmake(ResourceKind::Ca, ca.0, |p, h| p.close_ca(CaHandle(h)))
    }

    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        self.ctl.query_port(self.ctl_ca(ca)?, port)
    }

    fn find_pkey(&self, ca: CaHandle, port: PortNum, pkey: Pkey) -> Result<u16> {
        self.ctl.find_pkey(self.ctl_ca(ca)?, port, pkey)
    }

    fn modify_port(&self, ca: CaHandle, port: PortNum, modify: &PortModify) -> Result<()> {
        self.ctl.modify_port(self.ctl_ca(ca)?, port, modify)
    }

    fn take_pkey_violations(&self, ca: CaHandle, port: PortNum) -> Result<Option<PkeyViolations>> {
        self.ctl.take_pkey_violations(self.ctl_ca(ca)?, port)
    }

    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        self.make(
            ResourceKind::Ca,
            ca.0,
            ResourceKind::Pd,
            |p, h| p.alloc_pd(CaHandle(h), ctx).map(|pd| (pd, pd.0)),
            |p, h| {
                let _ = p.dealloc_pd(PdHandle(h));
            },
            PdHandle,
        )
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        self.unmake(ResourceKind::Pd, pd.0, |p, h| p.dealloc_pd(PdHandle(h)))
    }

    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        self.make(
            ResourceKind::Pd,
            pd.0,
            ResourceKind::Cq,
            |p, h| p.create_cq(PdHandle(h), init, ctx).map(|c| (c, c.0)),
            |p, h| {
                let _ = p.destroy_cq(CqHandle(h));
            },
            CqHandle,
        )
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        self.unmake(ResourceKind::Cq, cq.0, |p, h| p.destroy_cq(CqHandle(h)))
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        if cq.0.index & SYNTHETIC == 0 {
            let nic = self.nic_ref()?;
            let mut n = 0;
            if let Some(half) = self.gsi_half(cq) {
                n = self.ctl.poll_cq(CqHandle(half), out)?;
            }
            return Ok(n + nic.poll_cq(cq, &mut out[n..])?);
        }
        either!(self, ResourceKind::Cq, cq, |p, h| p
            .poll_cq(CqHandle(h), out))
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        if cq.0.index & SYNTHETIC == 0 {
            if let Some(half) = self.gsi_half(cq) {
                self.ctl.req_notify_cq(CqHandle(half), solicited_only)?;
            }
            return self.nic_ref()?.req_notify_cq(cq, solicited_only);
        }
        either!(self, ResourceKind::Cq, cq, |p, h| p
            .req_notify_cq(CqHandle(h), solicited_only))
    }

    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        either!(self, ResourceKind::Cq, cq, |p, h| p
            .wait_cq(CqHandle(h), timeout))
    }

    fn drive_cq(
        &self,
        cq: CqHandle,
        spin: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        either!(self, ResourceKind::Cq, cq, |p, h| p.drive_cq(
            CqHandle(h),
            spin,
            timeout
        ))
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        match self.at(ResourceKind::Pd, pd.0)? {
            At::Nic(n, h) => n.create_srq(PdHandle(h), attr, ctx),
            At::Ctl(o) => {
                let s = self.ctl.create_srq(PdHandle(o.h), attr, ctx)?;
                Ok(SrqHandle(self.adopt(ResourceKind::Srq, s.0, false)))
            }
        }
    }

    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        either!(self, ResourceKind::Srq, srq, |p, h| p
            .modify_srq(SrqHandle(h), limit))
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        either!(self, ResourceKind::Srq, srq, |p, h| p
            .query_srq(SrqHandle(h)))
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        self.unmake(ResourceKind::Srq, srq.0, |p, h| p.destroy_srq(SrqHandle(h)))
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        use rdma_types::QpType;
        match self.at(ResourceKind::Pd, pd.0)? {
            At::Nic(n, h) if !matches!(init.qp_type, QpType::Gsi | QpType::Smi) => {
                // Counted at the daemon first (its QP limit, its list of
                // who holds what), as the QP's half: `destroy_qp` ends
                // both.
                let pd_half = PdHandle(self.half(ResourceKind::Pd, h)?);
                let counted = self.ctl.count_qp(pd_half)?.map(|c| c.0);
                let q = self.or_uncount(counted, ResourceKind::Qp, || {
                    n.create_qp(PdHandle(h), init, ctx)
                })?;
                if let Some(c) = counted {
                    (self.lock().halves).insert((kind(ResourceKind::Qp), q.0), c);
                }
                Ok(q)
            }
            At::Nic(_, h) => {
                // QP1 (and QP0) are the daemon's port's: its halves.
                let cq = |c: CqHandle| self.half(ResourceKind::Cq, c.0).map(CqHandle);
                let mut ci = *init;
                ci.send_cq = cq(init.send_cq)?;
                ci.recv_cq = cq(init.recv_cq)?;
                if init.srq.is_some() {
                    return Err(VerbsError::InvalidArgument(
                        "a special QP has no SRQ".into(),
                    ));
                }
                let q = self
                    .ctl
                    .create_qp(PdHandle(self.half(ResourceKind::Pd, h)?), &ci, ctx)?;
                let mine = self.adopt(ResourceKind::Qp, q.0, true);
                let mut g = self.gsi_cqs.write().unwrap_or_else(|e| e.into_inner());
                for (c, half) in [(init.send_cq, ci.send_cq), (init.recv_cq, ci.recv_cq)] {
                    g.entry(c.0).or_insert((half.0, 0)).1 += 1;
                }
                drop(g);
                (self.lock().gsi_qp_cqs).insert(mine, (init.send_cq, init.recv_cq));
                Ok(QpHandle(mine))
            }
            At::Ctl(o) => {
                let mut ci = *init;
                ci.send_cq = CqHandle(self.ctl_of(ResourceKind::Cq, init.send_cq.0)?);
                ci.recv_cq = CqHandle(self.ctl_of(ResourceKind::Cq, init.recv_cq.0)?);
                ci.srq = (init.srq)
                    .map(|s| self.ctl_of(ResourceKind::Srq, s.0).map(SrqHandle))
                    .transpose()?;
                let q = self.ctl.create_qp(PdHandle(o.h), &ci, ctx)?;
                Ok(QpHandle(self.adopt(ResourceKind::Qp, q.0, false)))
            }
        }
    }

    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        either!(self, ResourceKind::Qp, qp, |p, h| p.qp_num(QpHandle(h)))
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        either!(self, ResourceKind::Qp, qp, |p, h| p
            .modify_qp(QpHandle(h), attr))
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        either!(self, ResourceKind::Qp, qp, |p, h| p.query_qp(QpHandle(h)))
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        self.unmake(ResourceKind::Qp, qp.0, |p, h| p.destroy_qp(QpHandle(h)))?;
        let cqs = self.lock().gsi_qp_cqs.remove(&qp.0);
        if let Some((s, r)) = cqs {
            let mut g = self.gsi_cqs.write().unwrap_or_else(|e| e.into_inner());
            for c in [s, r] {
                if let Some((_, n)) = g.get_mut(&c.0) {
                    *n -= 1;
                    if *n == 0 {
                        g.remove(&c.0);
                    }
                }
            }
        }
        Ok(())
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        self.make(
            ResourceKind::Pd,
            pd.0,
            ResourceKind::Ah,
            |p, h| p.create_ah(PdHandle(h), attr).map(|a| (a, a.0)),
            |p, h| {
                let _ = p.destroy_ah(AhHandle(h));
            },
            AhHandle,
        )
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        self.unmake(ResourceKind::Ah, ah.0, |p, h| p.destroy_ah(AhHandle(h)))
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
        match self.at(ResourceKind::Pd, pd.0)? {
            At::Nic(n, h) => {
                let half = self.half(ResourceKind::Pd, h)?;
                if buf.shared_fd().is_none() {
                    // Private memory, which the daemon cannot map: made in
                    // the node alone, and counted at the daemon against
                    // this client's limit. A GSI QP's sends cannot read
                    // it (the daemon holds no registration of it).
                    let counted = self.ctl.count_mr(PdHandle(half), len)?.map(|c| c.0);
                    let i = self.or_uncount(counted, ResourceKind::Mr, || {
                        n.reg_mr(PdHandle(h), buf, addr, len, access, ctx)
                    })?;
                    let mut st = self.lock();
                    if let Some(c) = counted {
                        st.halves.insert((kind(ResourceKind::Mr), i.handle.0), c);
                    }
                    st.counted_mrs.insert(i.handle.0, half);
                    return Ok(i);
                }
                let i = n.reg_mr(PdHandle(h), buf, addr, len, access, ctx)?;
                // The daemon counts it against this client's limit (and a
                // GSI QP's MADs are read through it).
                match self.ctl.reg_mr(PdHandle(half), buf, addr, len, access, ctx) {
                    Ok(c) => {
                        let mut st = self.lock();
                        st.halves
                            .insert((kind(ResourceKind::Mr), i.handle.0), c.handle.0);
                        st.lkeys.insert(i.lkey.0, c.lkey.0);
                        st.mr_lkeys.insert(i.handle.0, i.lkey.0);
                        Ok(i)
                    }
                    Err(e) => {
                        let _ = n.dereg_mr(i.handle);
                        Err(e)
                    }
                }
            }
            At::Ctl(o) => {
                let mut c = self
                    .ctl
                    .reg_mr(PdHandle(o.h), buf, addr, len, access, ctx)?;
                c.handle = MrHandle(self.adopt(ResourceKind::Mr, c.handle.0, false));
                Ok(c)
            }
        }
    }

    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        match self.at(ResourceKind::Mr, mr.0)? {
            At::Nic(n, h) => {
                let counted_under = self.lock().counted_mrs.get(&h).copied();
                if let Some(pd_half) = counted_under {
                    let old = self.half(ResourceKind::Mr, h).ok();
                    // Counted anew for its new length, then the old count
                    // goes; the daemon never held the memory.
                    let c = self.ctl.count_mr(PdHandle(pd_half), len)?.map(|c| c.0);
                    let i = self.or_uncount(c, ResourceKind::Mr, || {
                        n.rereg_mr(MrHandle(h), buf, addr, len, access)
                    })?;
                    if let Some(old) = old {
                        let _ = self.ctl.dereg_mr(MrHandle(old));
                    }
                    let mut st = self.lock();
                    match c {
                        Some(c) => st.halves.insert((kind(ResourceKind::Mr), h), c),
                        None => st.halves.remove(&(kind(ResourceKind::Mr), h)),
                    };
                    return Ok(i);
                }
                let half = self.half(ResourceKind::Mr, h)?;
                let c = self.ctl.rereg_mr(MrHandle(half), buf, addr, len, access)?;
                let i = n.rereg_mr(MrHandle(h), buf, addr, len, access)?;
                let mut st = self.lock();
                if let Some(old) = st.mr_lkeys.insert(h, i.lkey.0) {
                    st.lkeys.remove(&old);
                }
                st.lkeys.insert(i.lkey.0, c.lkey.0);
                Ok(i)
            }
            At::Ctl(o) => {
                let mut i = self.ctl.rereg_mr(MrHandle(o.h), buf, addr, len, access)?;
                i.handle = mr;
                Ok(i)
            }
        }
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        self.unmake(ResourceKind::Mr, mr.0, |p, h| p.dereg_mr(MrHandle(h)))?;
        let mut st = self.lock();
        st.counted_mrs.remove(&mr.0);
        if let Some(k) = st.mr_lkeys.remove(&mr.0) {
            st.lkeys.remove(&k);
        }
        Ok(())
    }

    fn alloc_mw(&self, pd: PdHandle, kind_: MwType, ctx: Context) -> Result<(MwHandle, Rkey)> {
        match self.at(ResourceKind::Pd, pd.0)? {
            At::Nic(n, h) => n.alloc_mw(PdHandle(h), kind_, ctx),
            At::Ctl(o) => {
                let (w, k) = self.ctl.alloc_mw(PdHandle(o.h), kind_, ctx)?;
                Ok((MwHandle(self.adopt(ResourceKind::Mw, w.0, false)), k))
            }
        }
    }

    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        match self.at(ResourceKind::Qp, qp.0)? {
            At::Nic(n, h) => n.bind_mw(QpHandle(h), bind),
            At::Ctl(o) => {
                let mut b = *bind;
                b.mw = MwHandle(self.ctl_of(ResourceKind::Mw, bind.mw.0)?);
                b.mr = MrHandle(self.ctl_of(ResourceKind::Mr, bind.mr.0)?);
                self.ctl.bind_mw(QpHandle(o.h), &b)
            }
        }
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        self.unmake(ResourceKind::Mw, mw.0, |p, h| p.dealloc_mw(MwHandle(h)))
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        if qp.0.index & SYNTHETIC == 0 {
            return self.nic_ref()?.post_send(qp, wrs);
        }
        let At::Ctl(o) = self.at(ResourceKind::Qp, qp.0)? else {
            return Err(VerbsError::InvalidHandle);
        };
        let wrs: Vec<SendWr> = (wrs.iter().cloned())
            .map(|w| self.to_ctl_send(o.paired, w))
            .collect::<Result<_>>()?;
        self.ctl.post_send(QpHandle(o.h), &wrs)
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        if qp.0.index & SYNTHETIC == 0 {
            return self.nic_ref()?.post_recv(qp, wrs);
        }
        let At::Ctl(o) = self.at(ResourceKind::Qp, qp.0)? else {
            return Err(VerbsError::InvalidHandle);
        };
        if !o.paired {
            return self.ctl.post_recv(QpHandle(o.h), wrs);
        }
        let wrs: Vec<RecvWr> = wrs.iter().cloned().map(|w| self.to_ctl_recv(w)).collect();
        self.ctl.post_recv(QpHandle(o.h), &wrs)
    }

    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        either!(self, ResourceKind::Srq, srq, |p, h| p
            .post_srq_recv(SrqHandle(h), wrs))
    }

    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        let q = self.ctl_of(ResourceKind::Qp, qp.0)?;
        self.ctl
            .gsi_register(QpHandle(q), class, version, methods, serve)
    }

    fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<()> {
        let q = self.ctl_of(ResourceKind::Qp, qp.0)?;
        self.ctl.gsi_listen(QpHandle(q), service_id, listen)
    }
}

impl Direct {
    /// The daemon client's CA behind `ca`.
    fn ctl_ca(&self, ca: CaHandle) -> Result<CaHandle> {
        match self.at(ResourceKind::Ca, ca.0)? {
            At::Nic(_, h) => self.half(ResourceKind::Ca, h).map(CaHandle),
            At::Ctl(o) => Ok(CaHandle(o.h)),
        }
    }

    /// The daemon client's object behind synthetic handle `h`.
    fn ctl_of(&self, k: ResourceKind, h: Handle) -> Result<Handle> {
        match self.at(k, h)? {
            At::Ctl(o) => Ok(o.h),
            At::Nic(..) => Err(VerbsError::InvalidHandle),
        }
    }
}
