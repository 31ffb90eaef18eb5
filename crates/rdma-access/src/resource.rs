//! Resource tracking with hierarchical cleanup, event routing and plug and
//! play, over any verbs provider.
//!
//! An [`AccessLayer`] wraps a provider. Each consumer is a [`Client`]; every
//! object a client creates through it (CA, PD, CQ, SRQ, QP, MR, MW, AH, and
//! upper-layer objects such as CM ids, MAD agents or SA subscriptions
//! registered with [`Client::track`]) is a node in the client's tree, under
//! its CA and PD. [`Client::destroy`] removes an object with everything
//! under it; closing or dropping the client removes all of it; a CA that
//! goes away (the provider's CA-removal event) takes its subtree with it.
//! Teardown follows the verbs dependency order: tracked upper-layer objects
//! first, then CM ids (a connection is disconnected, a REQ in flight
//! abandoned, a listen ended, before its QP goes), then SA subscriptions
//! (their InformInfo deleted while the port can still send), then MAD
//! agents (unregistered from the port's QP1), then QPs and MWs, then MRs,
//! SRQs, CQs and AHs, then PDs, then the CA (within a kind, children
//! before their parent). A CM agent joins a client's tree with
//! [`crate::CmAgent::track_in`]: its CM ids, MAD agents and SA
//! subscriptions are then counted under [`Kind::CmId`], [`Kind::MadAgent`]
//! and [`Kind::SaSubscription`], as children of the agent's node under
//! the CA it uses (with the agent's special QPs and buffers: its own
//! verbs objects when it runs over the client, adopted ones when it was
//! made over the bare provider, as an IB node's port is), so that the
//! CA's removal or destruction ends them first; they leave the tree by
//! themselves when they end (timewait over, REJ, timeout, agent dropped,
//! unsubscribed). Each destroy goes through the provider's
//! asynchronous destroy path, so a completion callback still running for
//! an object is allowed to finish; the provider promises `on_destroyed` is
//! the last callback for it.
//!
//! Counters of live objects, per kind and per client and for the whole
//! layer ([`AccessLayer::live`], [`Client::live`]), let tests prove that
//! nothing leaks.
//!
//! Thread model: the client's own `EventHandler` (given at
//! [`Client::open_ca`]) receives every completion and asynchronous event of
//! the objects under that CA, with the context value the client gave each
//! object, on the provider's thread and never under a provider lock, as
//! the verbs layer promises. Work requests and polling go straight to the
//! provider ([`Client::provider`]): the slices it takes are the batching.
//! The layer only looks at CA-removal events on the way (to tear the tree
//! down) and hands everything on.
//!
//! Plug and play: [`AccessLayer::register_pnp`] reports every CA already
//! present, and each of its ports that is active, at once; then port
//! events (active, down, LID change, P_Key change, SM change) and CA
//! removal as they happen. The verbs provider interface has no word for
//! a CA that arrives later (the loopback fabric attaches CAs at any time,
//! soft RoCE has its CAs from the start): whoever attaches one calls
//! [`AccessLayer::rescan`], which reports it (and its active ports) to
//! every registered client and watches it from then on, as Linux's
//! `ib_register_client` add callback on a new device.

use rdma_types::{AccessFlags, Guid, PortNum, Rkey};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use verbs::{
    AhAttr, AhHandle, AsyncEvent, AsyncEventKind, CaHandle, Context, CqHandle, CqInit,
    EventHandler, MemBuf, MrHandle, MrInfo, MwHandle, MwType, PdHandle, PortState, Provider,
    QpHandle, QpInit, SrqAttr, SrqHandle, VerbsError,
};

/// Kinds of tracked objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An upper-layer object with a close hook ([`Client::track`]).
    Tracked,
    /// A CM id: a connection (from its REQ to the end of timewait) or a
    /// listen, of a tracked CM agent.
    CmId,
    /// An InformInfo subscription with the SA.
    SaSubscription,
    /// A MAD agent registered on a port's QP1 (the CM agent's own CM
    /// class registration is one).
    MadAgent,
    /// Queue pair.
    Qp,
    /// Memory window.
    Mw,
    /// Memory region.
    Mr,
    /// Shared receive queue.
    Srq,
    /// Completion queue.
    Cq,
    /// Address handle.
    Ah,
    /// Protection domain.
    Pd,
    /// Channel adapter (an open of it).
    Ca,
}

const KINDS: [Kind; 12] = [
    Kind::Tracked,
    Kind::CmId,
    Kind::SaSubscription,
    Kind::MadAgent,
    Kind::Qp,
    Kind::Mw,
    Kind::Mr,
    Kind::Srq,
    Kind::Cq,
    Kind::Ah,
    Kind::Pd,
    Kind::Ca,
];

/// Live objects per kind.
#[derive(Debug, Default)]
struct Counters([AtomicI64; 12]);

impl Counters {
    fn add(&self, k: Kind, n: i64) {
        self.0[k as usize].fetch_add(n, Ordering::SeqCst);
    }
    fn get(&self, k: Kind) -> i64 {
        self.0[k as usize].load(Ordering::SeqCst)
    }
    fn total(&self) -> i64 {
        KINDS.iter().map(|k| self.get(*k)).sum()
    }
}

/// A tracked object of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResId(u64);

enum Handle {
    Ca(CaHandle),
    Pd(PdHandle),
    Cq(CqHandle),
    Srq(SrqHandle),
    Qp(QpHandle),
    Mr(MrHandle),
    Mw(MwHandle),
    Ah(AhHandle),
    /// An upper-layer object of the given kind and its close hook.
    Tracked(Kind, Option<Box<dyn FnOnce() + Send>>),
}

impl Handle {
    fn kind(&self) -> Kind {
        match self {
            Handle::Ca(_) => Kind::Ca,
            Handle::Pd(_) => Kind::Pd,
            Handle::Cq(_) => Kind::Cq,
            Handle::Srq(_) => Kind::Srq,
            Handle::Qp(_) => Kind::Qp,
            Handle::Mr(_) => Kind::Mr,
            Handle::Mw(_) => Kind::Mw,
            Handle::Ah(_) => Kind::Ah,
            Handle::Tracked(k, _) => *k,
        }
    }
}

struct Node {
    handle: Handle,
    parent: Option<ResId>,
}

#[derive(Default)]
struct Tree {
    next: u64,
    nodes: BTreeMap<ResId, Node>,
    closed: bool,
}

struct ClientInner {
    name: String,
    al: Arc<AlInner>,
    live: Counters,
    tree: Mutex<Tree>,
}

struct AlInner {
    provider: Arc<dyn Provider>,
    live: Counters,
    pnp: Mutex<Pnp>,
}

#[derive(Default)]
struct Pnp {
    listeners: Vec<Arc<dyn Fn(PnpEvent) + Send + Sync>>,
    opened: Vec<(Guid, CaHandle)>,
}

/// A plug-and-play event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PnpEvent {
    /// A CA is there (reported at registration for CAs already present).
    CaAdded(Guid),
    /// A CA is being removed.
    CaRemoved(Guid),
    /// A port became active (also reported at registration).
    PortActive(Guid, PortNum),
    /// A port went down.
    PortDown(Guid, PortNum),
    /// A port's LID changed.
    LidChange(Guid, PortNum),
    /// A port's P_Key table changed.
    PkeyChange(Guid, PortNum),
    /// A port's master SM changed (a new master set its SM LID): SA
    /// clients subscribe to traps again and re-register services, since
    /// the new master's SA does not inherit the old one's state (as Linux
    /// clients and srp_daemon re-register on IB_EVENT_SM_CHANGE).
    SmChange(Guid, PortNum),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The access layer over one provider.
#[derive(Clone)]
pub struct AccessLayer {
    inner: Arc<AlInner>,
}

impl AccessLayer {
    /// Wraps `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> AccessLayer {
        AccessLayer {
            inner: Arc::new(AlInner {
                provider,
                live: Counters::default(),
                pnp: Mutex::new(Pnp::default()),
            }),
        }
    }

    /// A new client named `name` (for messages).
    pub fn client(&self, name: &str) -> Client {
        Client {
            inner: Arc::new(ClientInner {
                name: name.to_string(),
                al: self.inner.clone(),
                live: Counters::default(),
                tree: Mutex::new(Tree::default()),
            }),
        }
    }

    /// Live objects of `kind` over every client.
    pub fn live(&self, kind: Kind) -> i64 {
        self.inner.live.get(kind)
    }

    /// Live objects of every kind over every client.
    pub fn live_total(&self) -> i64 {
        self.inner.live.total()
    }

    /// Registers for plug-and-play events: `f` hears at once of every CA
    /// present and of its active ports, then of changes as they happen.
    ///
    /// # Errors
    /// A CA could not be opened to watch it.
    pub fn register_pnp(
        &self,
        f: impl Fn(PnpEvent) + Send + Sync + 'static,
    ) -> Result<(), VerbsError> {
        let f: Arc<dyn Fn(PnpEvent) + Send + Sync> = Arc::new(f);
        let p = &self.inner.provider;
        let mut pnp = lock(&self.inner.pnp);
        for guid in p.list_cas() {
            let ca = match pnp.opened.iter().find(|(g, _)| *g == guid) {
                Some((_, ca)) => *ca,
                None => self.watch(&mut pnp, guid)?,
            };
            self.announce(ca, guid, &f);
        }
        pnp.listeners.push(f);
        Ok(())
    }

    /// Looks for CAs the provider has that the layer does not watch yet
    /// (attached after the clients registered, or again after a removal):
    /// each is reported to every registered client as
    /// [`PnpEvent::CaAdded`], with its active ports, and watched from
    /// then on. Returns their GUIDs. A CA that cannot be opened (removed
    /// meanwhile) is not reported.
    pub fn rescan(&self) -> Vec<Guid> {
        let mut pnp = lock(&self.inner.pnp);
        let mut added = Vec::new();
        for guid in self.inner.provider.list_cas() {
            if pnp.opened.iter().any(|(g, _)| *g == guid) {
                continue;
            }
            if let Ok(ca) = self.watch(&mut pnp, guid) {
                added.push((guid, ca));
            }
        }
        let listeners = pnp.listeners.clone();
        drop(pnp);
        for (guid, ca) in &added {
            for l in &listeners {
                self.announce(*ca, *guid, l);
            }
        }
        added.into_iter().map(|(g, _)| g).collect()
    }

    /// Opens CA `guid` to hear its events.
    fn watch(&self, pnp: &mut Pnp, guid: Guid) -> Result<CaHandle, VerbsError> {
        let watch = Arc::new(PnpWatch {
            guid,
            al: Arc::downgrade(&self.inner),
        });
        let ca = self.inner.provider.open_ca(guid, 0, watch)?;
        pnp.opened.push((guid, ca));
        Ok(ca)
    }

    /// Tells `f` of CA `guid` and its active ports.
    fn announce(&self, ca: CaHandle, guid: Guid, f: &Arc<dyn Fn(PnpEvent) + Send + Sync>) {
        let p = &self.inner.provider;
        f(PnpEvent::CaAdded(guid));
        let ports = p.query_ca(ca).map_or(1, |a| a.num_ports.max(1));
        for n in 1..=ports {
            if p.query_port(ca, PortNum(n))
                .is_ok_and(|a| a.state == PortState::Active)
            {
                f(PnpEvent::PortActive(guid, PortNum(n)));
            }
        }
    }
}

impl Drop for AlInner {
    fn drop(&mut self) {
        let opened = std::mem::take(&mut lock(&self.pnp).opened);
        for (_, ca) in opened {
            let _ = self.provider.close_ca(ca);
        }
    }
}

struct PnpWatch {
    guid: Guid,
    al: Weak<AlInner>,
}

impl EventHandler for PnpWatch {
    fn on_completion(&self, _cq: Context) {}
    fn on_async_event(&self, e: AsyncEvent) {
        let Some(al) = self.al.upgrade() else { return };
        let port = e.port.unwrap_or(PortNum(1));
        let ev = match e.kind {
            AsyncEventKind::PortActive => PnpEvent::PortActive(self.guid, port),
            AsyncEventKind::PortDown => PnpEvent::PortDown(self.guid, port),
            AsyncEventKind::LidChange => PnpEvent::LidChange(self.guid, port),
            AsyncEventKind::PkeyChange => PnpEvent::PkeyChange(self.guid, port),
            AsyncEventKind::SmChange => PnpEvent::SmChange(self.guid, port),
            AsyncEventKind::CaRemoval => PnpEvent::CaRemoved(self.guid),
            _ => return,
        };
        let listeners = {
            let mut pnp = lock(&al.pnp);
            if ev == PnpEvent::CaRemoved(self.guid) {
                // Gone: a CA attached again under the GUID is new to a
                // rescan. Its open ends with the CA.
                if let Some(i) = pnp.opened.iter().position(|(g, _)| *g == self.guid) {
                    let (_, ca) = pnp.opened.remove(i);
                    let _ = al.provider.close_ca(ca);
                }
            }
            pnp.listeners.clone()
        };
        for l in listeners {
            l(ev);
        }
    }
}

/// Sits between the provider and a client's handler for one CA: tears the
/// CA's subtree down on removal, hands every event on.
struct CaWatch {
    client: Weak<ClientInner>,
    ca: ResId,
    user: Arc<dyn EventHandler>,
}

impl EventHandler for CaWatch {
    fn on_completion(&self, cq: Context) {
        self.user.on_completion(cq);
    }
    fn on_async_event(&self, e: AsyncEvent) {
        // The consumer hears of the removal first, while its objects exist.
        self.user.on_async_event(e);
        if e.kind == AsyncEventKind::CaRemoval {
            if let Some(c) = self.client.upgrade() {
                c.destroy(self.ca);
            }
        }
    }
    fn on_destroyed(&self, kind: verbs::ResourceKind, ctx: Context) {
        self.user.on_destroyed(kind, ctx);
    }
}

/// A consumer of the access layer; dropping it destroys everything it made.
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// The provider, for posting work requests and polling (pass-through).
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.inner.al.provider
    }

    /// The client's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Live objects of `kind` of this client.
    pub fn live(&self, kind: Kind) -> i64 {
        self.inner.live.get(kind)
    }

    /// Live objects of every kind of this client.
    pub fn live_total(&self) -> i64 {
        self.inner.live.total()
    }

    /// Opens CA `guid`; `handler` gets every callback of the objects under it.
    ///
    /// # Errors
    /// The provider refused.
    pub fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<(ResId, CaHandle), VerbsError> {
        let c = &self.inner;
        // The id is reserved first so the watch knows which subtree is its.
        let id = c.reserve()?;
        let watch = Arc::new(CaWatch {
            client: Arc::downgrade(c),
            ca: id,
            user: handler,
        });
        let ca = c.al.provider.open_ca(guid, ctx, watch)?;
        match c.insert(id, Handle::Ca(ca), None) {
            Ok(()) => Ok((id, ca)),
            Err(h) => {
                // Closed meanwhile: do not leak what was just made.
                c.release(h);
                Err(c.closed_error())
            }
        }
    }

    fn handle_of<T>(&self, id: ResId, f: impl Fn(&Handle) -> Option<T>) -> Result<T, VerbsError> {
        let t = lock(&self.inner.tree);
        t.nodes.get(&id).and_then(|n| f(&n.handle)).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("{id:?} is not a live object of the right kind"))
        })
    }

    /// Allocates a PD on CA `ca`.
    ///
    /// # Errors
    /// `ca` is not this client's live CA, or the provider refused.
    pub fn alloc_pd(&self, ca: ResId, ctx: Context) -> Result<(ResId, PdHandle), VerbsError> {
        let h = self.handle_of(ca, |h| match h {
            Handle::Ca(c) => Some(*c),
            _ => None,
        })?;
        let pd = self.provider().alloc_pd(h, ctx)?;
        Ok((self.inner.add(Handle::Pd(pd), Some(ca))?, pd))
    }

    fn pd(&self, pd: ResId) -> Result<PdHandle, VerbsError> {
        self.handle_of(pd, |h| match h {
            Handle::Pd(p) => Some(*p),
            _ => None,
        })
    }

    /// Creates a CQ under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    pub fn create_cq(
        &self,
        pd: ResId,
        init: &CqInit,
        ctx: Context,
    ) -> Result<(ResId, CqHandle), VerbsError> {
        let cq = self.provider().create_cq(self.pd(pd)?, init, ctx)?;
        Ok((self.inner.add(Handle::Cq(cq), Some(pd))?, cq))
    }

    /// Creates an SRQ under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    pub fn create_srq(
        &self,
        pd: ResId,
        attr: &SrqAttr,
        ctx: Context,
    ) -> Result<(ResId, SrqHandle), VerbsError> {
        let srq = self.provider().create_srq(self.pd(pd)?, attr, ctx)?;
        Ok((self.inner.add(Handle::Srq(srq), Some(pd))?, srq))
    }

    /// Creates a QP under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    pub fn create_qp(
        &self,
        pd: ResId,
        init: &QpInit,
        ctx: Context,
    ) -> Result<(ResId, QpHandle), VerbsError> {
        let qp = self.provider().create_qp(self.pd(pd)?, init, ctx)?;
        Ok((self.inner.add(Handle::Qp(qp), Some(pd))?, qp))
    }

    /// Registers `[addr, addr+len)` of `buf` under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    #[allow(clippy::too_many_arguments)]
    pub fn reg_mr(
        &self,
        pd: ResId,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<(ResId, MrInfo), VerbsError> {
        let mr = self
            .provider()
            .reg_mr(self.pd(pd)?, buf, addr, len, access, ctx)?;
        Ok((self.inner.add(Handle::Mr(mr.handle), Some(pd))?, mr))
    }

    /// Allocates a memory window under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    pub fn alloc_mw(
        &self,
        pd: ResId,
        kind: MwType,
        ctx: Context,
    ) -> Result<(ResId, MwHandle, Rkey), VerbsError> {
        let (mw, rkey) = self.provider().alloc_mw(self.pd(pd)?, kind, ctx)?;
        Ok((self.inner.add(Handle::Mw(mw), Some(pd))?, mw, rkey))
    }

    /// Creates an address handle under `pd`.
    ///
    /// # Errors
    /// As [`Client::alloc_pd`].
    pub fn create_ah(&self, pd: ResId, attr: &AhAttr) -> Result<(ResId, AhHandle), VerbsError> {
        let ah = self.provider().create_ah(self.pd(pd)?, attr)?;
        Ok((self.inner.add(Handle::Ah(ah), Some(pd))?, ah))
    }

    /// Tracks an upper-layer object (a CM id, a MAD agent, an SA
    /// subscription) under `parent`: `close` runs when it is destroyed,
    /// before any verbs object of the client's tree goes.
    ///
    /// # Errors
    /// `parent` is not live, or the client is closed.
    pub fn track(
        &self,
        parent: Option<ResId>,
        close: impl FnOnce() + Send + 'static,
    ) -> Result<ResId, VerbsError> {
        if let Some(p) = parent {
            self.handle_of(p, |_| Some(()))?;
        }
        self.inner.add(
            Handle::Tracked(Kind::Tracked, Some(Box::new(close))),
            parent,
        )
    }

    /// A handle on this client's tree for the access layer's own
    /// upper-layer objects; it does not keep the client alive.
    pub(crate) fn tracker(&self) -> Tracker {
        Tracker(Arc::downgrade(&self.inner))
    }

    /// Destroys `id` and everything under it, in dependency order.
    pub fn destroy(&self, id: ResId) {
        self.inner.destroy(id);
    }

    /// Destroys everything; later creations are refused.
    pub fn close(&self) {
        self.inner.close();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.inner.close();
    }
}

/// Where the CM agent puts its CM ids, MAD agents and SA subscriptions:
/// a client's tree, held weakly (a client that is gone tracks nothing).
#[derive(Clone)]
pub(crate) struct Tracker(Weak<ClientInner>);

impl Tracker {
    /// A node of `kind` under `parent` (a root if `None`) whose `close`
    /// runs when the client closes or the parent is destroyed (its CA
    /// removed, say).
    ///
    /// # Errors
    /// The client is closed or gone, or `parent` is no longer in the tree
    /// (destroyed meanwhile: the object must not be made).
    pub(crate) fn track(
        &self,
        kind: Kind,
        parent: Option<ResId>,
        close: impl FnOnce() + Send + 'static,
    ) -> Result<ResId, VerbsError> {
        let c = self
            .0
            .upgrade()
            .ok_or_else(|| VerbsError::InvalidArgument("the client is gone".into()))?;
        let mut t = lock(&c.tree);
        if t.closed {
            return Err(c.closed_error());
        }
        if let Some(p) = parent.filter(|p| !t.nodes.contains_key(p)) {
            // Refused: the hook is dropped, not run; the caller still
            // owns the object and ends it itself.
            return Err(VerbsError::InvalidArgument(format!(
                "{p:?} left the tree of client {}",
                c.name
            )));
        }
        t.next += 1;
        let id = ResId(t.next);
        let handle = Handle::Tracked(kind, Some(Box::new(close)));
        t.nodes.insert(id, Node { handle, parent });
        c.live.add(kind, 1);
        c.al.live.add(kind, 1);
        Ok(id)
    }

    /// The node of CA open `ca` in the client's tree, if the client made
    /// it (an agent started over [`Client::into_provider`]).
    pub(crate) fn ca_node(&self, ca: CaHandle) -> Option<ResId> {
        let c = self.0.upgrade()?;
        let t = lock(&c.tree);
        t.nodes
            .iter()
            .find(|(_, n)| matches!(n.handle, Handle::Ca(h) if h == ca))
            .map(|(id, _)| *id)
    }

    /// Destroys `id` and its subtree, as [`Client::destroy`].
    pub(crate) fn destroy(&self, id: ResId) {
        if let Some(c) = self.0.upgrade() {
            c.destroy(id);
        }
    }

    /// False once the client is closed or gone.
    pub(crate) fn is_open(&self) -> bool {
        self.0.upgrade().is_some_and(|c| !lock(&c.tree).closed)
    }

    /// The object ended by itself: its node leaves without its hook.
    pub(crate) fn untrack(&self, id: ResId) {
        let Some(c) = self.0.upgrade() else { return };
        let gone = lock(&c.tree).nodes.remove(&id);
        if let Some(n) = gone {
            let kind = n.handle.kind();
            c.live.add(kind, -1);
            c.al.live.add(kind, -1);
        }
    }
}

impl ClientInner {
    fn closed_error(&self) -> VerbsError {
        VerbsError::InvalidArgument(format!("client {} is closed", self.name))
    }

    fn reserve(&self) -> Result<ResId, VerbsError> {
        let mut t = lock(&self.tree);
        if t.closed {
            return Err(self.closed_error());
        }
        t.next += 1;
        Ok(ResId(t.next))
    }

    /// Puts a node in the tree; a client closed since the id was reserved
    /// gives the handle back (its close already collected the tree).
    fn insert(&self, id: ResId, handle: Handle, parent: Option<ResId>) -> Result<(), Handle> {
        let kind = handle.kind();
        let mut t = lock(&self.tree);
        if t.closed {
            return Err(handle);
        }
        t.nodes.insert(id, Node { handle, parent });
        self.live.add(kind, 1);
        self.al.live.add(kind, 1);
        Ok(())
    }

    fn add(&self, handle: Handle, parent: Option<ResId>) -> Result<ResId, VerbsError> {
        let placed = match self.reserve() {
            Ok(id) => self.insert(id, handle, parent).map(|()| id),
            Err(_) => Err(handle),
        };
        placed.map_err(|h| {
            // Closed meanwhile: do not leak what was just made.
            self.release(h);
            self.closed_error()
        })
    }

    /// Gives one object back to the provider (errors ignored: a removed CA
    /// has already taken it).
    fn release(&self, handle: Handle) {
        let p = &self.al.provider;
        let _ = match handle {
            Handle::Ca(h) => p.close_ca(h),
            Handle::Pd(h) => p.dealloc_pd(h),
            Handle::Cq(h) => p.destroy_cq(h),
            Handle::Srq(h) => p.destroy_srq(h),
            Handle::Qp(h) => p.destroy_qp(h),
            Handle::Mr(h) => p.dereg_mr(h),
            Handle::Mw(h) => p.dealloc_mw(h),
            Handle::Ah(h) => p.destroy_ah(h),
            Handle::Tracked(_, mut close) => {
                if let Some(f) = close.take() {
                    f();
                }
                Ok(())
            }
        };
    }

    /// Takes `root` and its descendants out of the tree and releases them
    /// in dependency order, outside the lock.
    fn destroy(&self, root: ResId) {
        let taken: Vec<Node> = {
            let mut t = lock(&self.tree);
            if !t.nodes.contains_key(&root) {
                return;
            }
            let mut ids = vec![root];
            let mut i = 0;
            while i < ids.len() {
                let here = ids[i];
                ids.extend(
                    t.nodes
                        .iter()
                        .filter(|(_, n)| n.parent == Some(here))
                        .map(|(id, _)| *id),
                );
                i += 1;
            }
            ids.iter().filter_map(|id| t.nodes.remove(id)).collect()
        };
        // By kind; within a kind, children before their parents (the
        // reverse of the walk): a CM agent's MAD agents and its own CM
        // registration are all MAD agents, and the registration, their
        // parent, goes last.
        let mut taken: Vec<(usize, Node)> = taken.into_iter().enumerate().collect();
        taken.sort_by_key(|(i, n)| (n.handle.kind(), std::cmp::Reverse(*i)));
        for (_, n) in taken {
            let kind = n.handle.kind();
            self.release(n.handle);
            self.live.add(kind, -1);
            self.al.live.add(kind, -1);
        }
    }

    fn close(&self) {
        let roots: Vec<ResId> = {
            let mut t = lock(&self.tree);
            t.closed = true;
            // Roots, and nodes whose parent went first (a provider may let
            // a PD go while objects under it live on).
            t.nodes
                .iter()
                .filter(|(_, n)| n.parent.is_none_or(|p| !t.nodes.contains_key(&p)))
                .map(|(id, _)| *id)
                .collect()
        };
        // Tracked roots and CAs alike; each takes its subtree.
        let mut all: Vec<ResId> = roots;
        all.sort_by_key(|id| {
            lock(&self.tree)
                .nodes
                .get(id)
                .map_or(Kind::Ca, |n| n.handle.kind())
        });
        for id in all {
            self.destroy(id);
        }
    }
}

/// A [`Client`] seen as a verbs provider: every call goes to the provider
/// underneath, and every object created through it is a node of the
/// client's tree (under its CA or PD), so consumers written against the
/// verbs interface (the SRP target and initiator) get the access layer's
/// tracking, hierarchical cleanup and leak counters without knowing it.
/// Destroying an object through it is the provider's destroy of that one
/// object (its refusals, such as `Busy`, come back unchanged); closing or
/// dropping the client takes whatever is left.
pub struct TrackedProvider {
    client: Client,
    ids: Mutex<std::collections::HashMap<(Kind, verbs::Handle), ResId>>,
}

impl Client {
    /// This client as a verbs provider (see [`TrackedProvider`]).
    pub fn into_provider(self) -> Arc<TrackedProvider> {
        Arc::new(TrackedProvider {
            client: self,
            ids: Mutex::new(Default::default()),
        })
    }
}

impl TrackedProvider {
    /// The client underneath (its counters, its `close`).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The node of a handle this client made; a stale or foreign handle
    /// is `InvalidHandle`, as the provider would say.
    fn id(&self, kind: Kind, h: verbs::Handle) -> Result<ResId, VerbsError> {
        lock(&self.ids)
            .get(&(kind, h))
            .copied()
            .ok_or(VerbsError::InvalidHandle)
    }

    fn note(&self, kind: Kind, h: verbs::Handle, id: ResId) {
        lock(&self.ids).insert((kind, h), id);
    }

    /// Destroys one object by the provider's own call; the node leaves the
    /// tree only when the provider agreed.
    fn destroy_one(
        &self,
        kind: Kind,
        h: verbs::Handle,
        call: impl FnOnce(&dyn Provider) -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError> {
        let Ok(id) = self.id(kind, h) else {
            // Not ours (or the CA's removal already took it): the
            // provider says what it thinks of the handle.
            return call(self.client.provider().as_ref());
        };
        call(self.client.provider().as_ref())?;
        lock(&self.ids).remove(&(kind, h));
        let c = &self.client.inner;
        if lock(&c.tree).nodes.remove(&id).is_some() {
            c.live.add(kind, -1);
            c.al.live.add(kind, -1);
        }
        Ok(())
    }
}

impl Provider for TrackedProvider {
    fn name(&self) -> &'static str {
        self.client.provider().name()
    }
    fn handlers_nest(&self) -> bool {
        self.client.provider().handlers_nest()
    }
    fn list_cas(&self) -> Vec<Guid> {
        self.client.provider().list_cas()
    }
    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle, VerbsError> {
        let (id, ca) = self.client.open_ca(guid, ctx, handler)?;
        self.note(Kind::Ca, ca.0, id);
        Ok(ca)
    }
    fn query_ca(&self, ca: CaHandle) -> Result<verbs::CaAttr, VerbsError> {
        self.client.provider().query_ca(ca)
    }
    fn close_ca(&self, ca: CaHandle) -> Result<(), VerbsError> {
        // Closing a CA takes what is still open under it, as the access
        // layer promises.
        match self.id(Kind::Ca, ca.0) {
            Ok(id) => {
                lock(&self.ids).remove(&(Kind::Ca, ca.0));
                self.client.destroy(id);
                Ok(())
            }
            Err(_) => self.client.provider().close_ca(ca),
        }
    }
    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<verbs::PortAttr, VerbsError> {
        self.client.provider().query_port(ca, port)
    }
    fn find_pkey(
        &self,
        ca: CaHandle,
        port: PortNum,
        pkey: rdma_types::Pkey,
    ) -> Result<u16, VerbsError> {
        self.client.provider().find_pkey(ca, port, pkey)
    }
    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle, VerbsError> {
        let (id, pd) = self.client.alloc_pd(self.id(Kind::Ca, ca.0)?, ctx)?;
        self.note(Kind::Pd, pd.0, id);
        Ok(pd)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Pd, pd.0, |p| p.dealloc_pd(pd))
    }
    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle, VerbsError> {
        let (id, cq) = self.client.create_cq(self.id(Kind::Pd, pd.0)?, init, ctx)?;
        self.note(Kind::Cq, cq.0, id);
        Ok(cq)
    }
    fn destroy_cq(&self, cq: CqHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Cq, cq.0, |p| p.destroy_cq(cq))
    }
    fn poll_cq(
        &self,
        cq: CqHandle,
        out: &mut [verbs::WorkCompletion],
    ) -> Result<usize, VerbsError> {
        self.client.provider().poll_cq(cq, out)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError> {
        self.client.provider().req_notify_cq(cq, solicited_only)
    }
    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<(), VerbsError> {
        self.client.provider().wait_cq(cq, timeout)
    }
    fn drive_cq(
        &self,
        cq: CqHandle,
        spin: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<bool, VerbsError> {
        self.client.provider().drive_cq(cq, spin, timeout)
    }
    fn create_srq(
        &self,
        pd: PdHandle,
        attr: &SrqAttr,
        ctx: Context,
    ) -> Result<SrqHandle, VerbsError> {
        let (id, srq) = self
            .client
            .create_srq(self.id(Kind::Pd, pd.0)?, attr, ctx)?;
        self.note(Kind::Srq, srq.0, id);
        Ok(srq)
    }
    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<(), VerbsError> {
        self.client.provider().modify_srq(srq, limit)
    }
    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr, VerbsError> {
        self.client.provider().query_srq(srq)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Srq, srq.0, |p| p.destroy_srq(srq))
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle, VerbsError> {
        let (id, qp) = self.client.create_qp(self.id(Kind::Pd, pd.0)?, init, ctx)?;
        self.note(Kind::Qp, qp.0, id);
        Ok(qp)
    }
    fn qp_num(&self, qp: QpHandle) -> Result<rdma_types::Qpn, VerbsError> {
        self.client.provider().qp_num(qp)
    }
    fn modify_qp(&self, qp: QpHandle, attr: &verbs::QpAttr) -> Result<(), VerbsError> {
        self.client.provider().modify_qp(qp, attr)
    }
    fn query_qp(&self, qp: QpHandle) -> Result<verbs::QpAttr, VerbsError> {
        self.client.provider().query_qp(qp)
    }
    fn destroy_qp(&self, qp: QpHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Qp, qp.0, |p| p.destroy_qp(qp))
    }
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, VerbsError> {
        let (id, ah) = self.client.create_ah(self.id(Kind::Pd, pd.0)?, attr)?;
        self.note(Kind::Ah, ah.0, id);
        Ok(ah)
    }
    fn destroy_ah(&self, ah: AhHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Ah, ah.0, |p| p.destroy_ah(ah))
    }
    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo, VerbsError> {
        let (id, mr) = self
            .client
            .reg_mr(self.id(Kind::Pd, pd.0)?, buf, addr, len, access, ctx)?;
        self.note(Kind::Mr, mr.handle.0, id);
        Ok(mr)
    }
    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        self.client.provider().rereg_mr(mr, buf, addr, len, access)
    }
    fn dereg_mr(&self, mr: MrHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Mr, mr.0, |p| p.dereg_mr(mr))
    }
    fn alloc_mw(
        &self,
        pd: PdHandle,
        kind: MwType,
        ctx: Context,
    ) -> Result<(MwHandle, Rkey), VerbsError> {
        let (id, mw, rkey) = self.client.alloc_mw(self.id(Kind::Pd, pd.0)?, kind, ctx)?;
        self.note(Kind::Mw, mw.0, id);
        Ok((mw, rkey))
    }
    fn bind_mw(&self, qp: QpHandle, bind: &verbs::MwBind) -> Result<Rkey, VerbsError> {
        self.client.provider().bind_mw(qp, bind)
    }
    fn dealloc_mw(&self, mw: MwHandle) -> Result<(), VerbsError> {
        self.destroy_one(Kind::Mw, mw.0, |p| p.dealloc_mw(mw))
    }
    fn post_send(&self, qp: QpHandle, wrs: &[verbs::SendWr]) -> Result<(), VerbsError> {
        self.client.provider().post_send(qp, wrs)
    }
    fn post_recv(&self, qp: QpHandle, wrs: &[verbs::RecvWr]) -> Result<(), VerbsError> {
        self.client.provider().post_recv(qp, wrs)
    }
    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[verbs::RecvWr]) -> Result<(), VerbsError> {
        self.client.provider().post_srq_recv(srq, wrs)
    }
    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<(), VerbsError> {
        self.client
            .provider()
            .gsi_register(qp, class, version, methods, serve)
    }
    fn gsi_listen(&self, qp: QpHandle, service_id: u64, listen: bool) -> Result<(), VerbsError> {
        self.client.provider().gsi_listen(qp, service_id, listen)
    }
}
