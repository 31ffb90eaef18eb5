//! CAs: the slot the provider keeps of each (settings that outlive opens),
//! the device an open holds (node, NIC thread, key table, routes), open and
//! close, PDs, fault injection, capture, removal and counters.

use super::*;

/// How long a reopen waits for the CA's previous node to let go of its
/// socket (a completion callback running on that node's thread delays it).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One CA of the provider, open or not.
#[derive(Default)]
pub(super) struct CaSlot {
    /// The device while at least one open holds it, and how many do.
    pub(super) open: Option<(Arc<CaRt>, u32)>,
    /// Detached by `remove_ca`: it cannot be opened again.
    pub(super) removed: bool,
    /// Faults for the node, applied when it binds (the first open).
    pub(super) faults: Option<FaultConfig>,
    /// The pcap file the node writes every packet to, taken when it binds.
    pub(super) capture: Option<std::path::PathBuf>,
    /// The port was taken down (`set_port_active`): the cable stays pulled
    /// while nobody has the CA open, and a new open finds it so.
    pub(super) down: bool,
    /// The personality the port gets at the next first open.
    pub(super) personality: Personality,
    /// When the latest node let go of its socket: a reopen waits for it
    /// (the node can outlive `close_ca` a little, see `open_ca`).
    pub(super) released: Option<softroce::Released>,
    /// The member of a shared port the node uses instead of binding
    /// (`SoftRoce::share_port`), and the QP numbers it hands out.
    pub(super) shared: Option<SharedPort>,
}

/// A CA's place in a port shared by processes ([`SoftRoce::share_port`]).
#[derive(Clone, Debug)]
pub struct SharedPort {
    /// A bound socket of the port's `roce_udp::PortGroup`.
    pub socket: Arc<std::os::fd::OwnedFd>,
    /// The QP numbers of the member's block.
    pub qpns: std::ops::Range<u32>,
}

impl SharedPort {
    /// Whether QP1 (and QP0) are this CA's: the block's owner has them.
    pub(super) fn has_special_qps(&self) -> bool {
        self.qpns.start <= 1
    }
}

/// A CA's device, shared by every open of it: its node, key table and
/// completion routes.
pub(super) struct CaRt {
    pub(super) driver: OnceLock<Driver>,
    pub(super) keys: Arc<Mutex<KeyTable>>,
    pub(super) routes: Mutex<HashMap<u32, Route>>,
    pub(super) gid: Gid,
    pub(super) guid: Guid,
    /// Port 1 as `query_port` reports it (changed by port control).
    pub(super) port: Mutex<PortStatus>,
    /// The port's personality.
    pub(super) personality: Personality,
    /// QP0 and QP1 are the node's (not a member of a shared port that
    /// lacks them).
    pub(super) special_qps: bool,
}

impl CaRt {
    pub(super) fn node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.driver
            .get()
            .expect("driver started with the CA")
            .with_node(f)
    }

    /// Reads the node without waking its thread (counters).
    pub(super) fn inspect<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.driver
            .get()
            .expect("driver started with the CA")
            .inspect(f)
    }
}

impl SoftRoce {
    /// Gives CA `guid` the `personality` it has from its next first open
    /// (the node's port starts over then, as after a reset).
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is open.
    pub fn set_personality(&self, guid: Guid, personality: Personality) -> Result<()> {
        self.closed_ca(guid, "the CA is open; choose its personality before", |s| {
            s.personality = personality
        })
    }

    /// The personality CA `guid` has (or will have at its next open).
    pub fn personality(&self, guid: Guid) -> Personality {
        self.with_slot(guid, |s| s.personality).unwrap_or_default()
    }

    /// The open device of CA `guid` and the handlers of every open of it.
    pub(super) fn opens(&self, guid: Guid) -> Result<(Arc<CaRt>, Vec<CaOpen>)> {
        let rt = self.device(guid).ok_or(VerbsError::NoSuchCa)?;
        let st = self.lock();
        let opens = st
            .objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Ca {
                    rt: r,
                    handler,
                    ctx,
                    ..
                } if Arc::ptr_eq(r, &rt) => Some((handler.clone(), *ctx)),
                _ => None,
            })
            .collect();
        Ok((rt, opens))
    }

    /// Detaches open CA `guid`, as a hot-unplugged NIC: its link goes down,
    /// every open gets `CaRemoval` (with its context) and the CA cannot be
    /// opened again. Owners destroy their resources as after any removal.
    ///
    /// # Errors
    /// `NoSuchCa` when the CA is not open.
    pub fn remove_ca(&self, guid: Guid) -> Result<()> {
        let (rt, opens) = self.opens(guid)?;
        self.with_slot(guid, |s| s.removed = true)?;
        rt.port.lock().unwrap_or_else(|e| e.into_inner()).state = PortState::Down;
        rt.node(|n| n.set_link_up(false));
        for (h, ctx) in opens {
            h.on_async_event(AsyncEvent {
                kind: AsyncEventKind::CaRemoval,
                ctx,
                port: None,
            });
        }
        Ok(())
    }

    /// Injects `faults` on the send path of CA `guid` (`None`: the
    /// provider's, [`NicOptions::faults`], by default a clean link). The
    /// node takes its faults when it binds, at the first open of the CA,
    /// so this must come before that.
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is already open.
    pub fn set_faults(&self, guid: Guid, faults: Option<FaultConfig>) -> Result<()> {
        self.closed_ca(guid, "the CA is open; set faults before", |s| {
            s.faults = faults
        })
    }

    /// Writes every packet CA `guid` sends and receives to the pcap file
    /// `path` (`None`: no capture). Like faults, taken when the node binds
    /// at the first open of the CA.
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is already open.
    pub fn set_capture(&self, guid: Guid, path: Option<std::path::PathBuf>) -> Result<()> {
        self.closed_ca(guid, "the CA is open; set the capture before", |s| {
            s.capture = path
        })
    }

    /// Lets go of open CA `guid`'s socket (a member of a shared port whose
    /// owner went, which must not stay in the port's group): its port
    /// goes down and its node neither sends nor receives again. The CA
    /// stays open until closed; opened again after that, it binds (or
    /// takes the shared port it is given) anew.
    ///
    /// # Errors
    /// `NoSuchCa` when the CA is not open; the socket could not be let go.
    pub fn retire_socket(&self, guid: Guid) -> Result<()> {
        let rt = self.device(guid).ok_or(VerbsError::NoSuchCa)?;
        // The slot's descriptor of the member too.
        self.with_slot(guid, |s| s.shared = None)?;
        rt.port.lock().unwrap_or_else(|e| e.into_inner()).state = PortState::Down;
        match rt.driver.get() {
            Some(d) => d
                .retire_socket()
                .map_err(|e| bad(format!("letting go of the CA's socket: {e}"))),
            None => Ok(()),
        }
    }

    /// Has CA `guid` run on `port`, a member of a port shared by
    /// processes, from its next first open: its node receives on the
    /// member's socket instead of binding the CA's address, and numbers
    /// its QPs in the member's block. A CA whose block lacks QP1 refuses
    /// GSI and SMI QPs (the block's owner, the NIC daemon, serves them).
    /// `None`: bind the address as usual.
    ///
    /// # Errors
    /// `NoSuchCa` for an unknown GUID; `Busy` when the CA is already open.
    pub fn share_port(&self, guid: Guid, port: Option<SharedPort>) -> Result<()> {
        self.closed_ca(guid, "the CA is open; share its port before", |s| {
            s.shared = port
        })
    }

    /// Runs `f` on the slot of CA `guid` if the CA is not open (what a
    /// node takes at bind time may still change), else `Busy(busy)`.
    fn closed_ca(&self, guid: Guid, busy: &'static str, f: impl FnOnce(&mut CaSlot)) -> Result<()> {
        self.with_slot(guid, |s| match s.open {
            Some(_) => Err(VerbsError::Busy(busy)),
            None => {
                f(s);
                Ok(())
            }
        })?
    }

    /// Runs `f` on the slot of CA `guid`, under the slots' lock.
    pub(super) fn with_slot<R>(&self, guid: Guid, f: impl FnOnce(&mut CaSlot) -> R) -> Result<R> {
        self.slots()
            .get_mut(&guid.0)
            .map(f)
            .ok_or(VerbsError::NoSuchCa)
    }

    /// The device of CA `guid` while it is open.
    pub(super) fn device(&self, guid: Guid) -> Option<Arc<CaRt>> {
        let slots = self.slots();
        slots.get(&guid.0)?.open.as_ref().map(|(rt, _)| rt.clone())
    }

    pub(super) fn slots(&self) -> MutexGuard<'_, HashMap<u64, CaSlot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters of CA `guid` while it is open (`None` when it is not).
    pub fn counters(&self, guid: Guid) -> Option<SoftCaCounters> {
        let rt = self.device(guid)?;
        let qpns: Vec<u32> = rt.routes_lock().keys().copied().collect();
        Some(rt.node(|n| {
            let s = n.stats();
            let mut k = n.retired_qp_counters();
            for q in qpns {
                if let Some(qp) = n.qp_mut(softroce::QpHandle(Qpn::from_bits(q))) {
                    k += qp.counters();
                }
            }
            SoftCaCounters {
                tx_packets: s.tx_packets,
                rx_datagrams: s.rx_datagrams,
                rx_bad_icrc: s.rx_bad_icrc,
                retransmits: k.retransmits,
                timeouts: k.timeouts,
                duplicates: k.duplicates,
                out_of_sequence: k.out_of_sequence,
                seq_naks_received: k.seq_naks_received,
                pkey_violations: k.pkey_violations + s.rx_pkey_violations,
            }
        }))
    }

    pub(super) fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        let cfg = self.ca_config(guid).ok_or(VerbsError::NoSuchCa)?;
        // The previous node of this CA may still hold its socket: the last
        // reference to a closed CA can be a completion callback on its NIC
        // thread, which cannot be joined there, so the node goes when the
        // thread ends, soon after. Wait for it (unlocked: the callback may
        // call the provider), then look again.
        let mut waited = None;
        let mut slots = loop {
            let slots = self.slots();
            let s = slots.get(&guid.0).ok_or(VerbsError::NoSuchCa)?;
            if s.removed {
                return Err(VerbsError::NoSuchCa);
            }
            if s.open.is_some() || waited.is_some() {
                break slots;
            }
            let Some(prev) = s.released.clone().filter(|r| !r.is_released()) else {
                break slots;
            };
            drop(slots);
            waited = Some(prev.wait(RELEASE_WAIT));
        };
        let s = slots.get_mut(&guid.0).ok_or(VerbsError::NoSuchCa)?;
        let rt = match &mut s.open {
            Some((rt, opens)) => {
                *opens += 1;
                rt.clone()
            }
            None => {
                let addr = SocketAddr::new(cfg.ip, self.udp_port);
                let mut ncfg = NodeConfig::new(addr);
                if let Some(sp) = &s.shared {
                    ncfg.socket = Some(sp.socket.clone());
                    ncfg.qpns = sp.qpns.clone();
                }
                let mut ncfg = ncfg.with_random_first_qpn();
                ncfg.faults = s.faults.clone().or_else(|| self.options.faults.clone());
                ncfg.gso = self.options.gso;
                ncfg.gro = self.options.gso;
                ncfg.capture = s.capture.clone();
                let mut node = Node::bind(ncfg).map_err(|e| {
                    let why = match waited {
                        Some(false) => format!(
                            " (the CA's previous node had not closed it; waited up to {} s)",
                            RELEASE_WAIT.as_secs()
                        ),
                        _ if e.kind() == std::io::ErrorKind::AddrInUse => {
                            " (held by another provider or process: another tool's NIC, or the \
                             NIC daemon's, whose clients `nicd --clients` lists)"
                                .to_string()
                        }
                        _ => String::new(),
                    };
                    bad(format!("cannot bind {addr}: {e}{why}"))
                })?;
                let pulled = s.down;
                if pulled {
                    node.set_link_up(false);
                }
                let personality = s.personality;
                let rt = Arc::new(CaRt {
                    driver: OnceLock::new(),
                    keys: Arc::new(Mutex::new(KeyTable::new())),
                    routes: Mutex::new(HashMap::new()),
                    gid: Gid::from_ip(cfg.ip),
                    guid,
                    port: Mutex::new(PortStatus {
                        state: match (pulled, personality) {
                            (true, _) => PortState::Down,
                            (false, Personality::Roce) => PortState::Active,
                            (false, Personality::Ib) => PortState::Init,
                        },
                        lid: Lid(0),
                        sm_lid: Lid(0),
                        sm_gid: None,
                        pkeys: Vec::new(),
                    }),
                    personality,
                    special_qps: s.shared.as_ref().is_none_or(SharedPort::has_special_qps),
                });
                let weak: Weak<CaRt> = Arc::downgrade(&rt);
                let driver = Driver::start(
                    node,
                    Some(Box::new(move |qp| {
                        if let Some(rt) = weak.upgrade() {
                            rt.deliver(qp);
                        }
                    })),
                )
                .map_err(|e| bad(format!("cannot start the NIC thread: {e}")))?;
                s.released = Some(driver.released());
                let _ = rt.driver.set(driver);
                s.open = Some((rt.clone(), 1));
                rt
            }
        };
        drop(slots);
        let h = self.lock().alloc(Obj::Ca {
            rt,
            handler,
            ctx,
            children: 0,
        });
        Ok(CaHandle(h))
    }

    pub(super) fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        Ok(CaAttr {
            guid: st.rt(i).guid,
            num_ports: 1,
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 12,
            max_mw: 1 << 16,
            max_inline_data: MAX_INLINE_DATA,
            atomics: true,
        })
    }

    pub(super) fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let (rt, handler, ctx) = {
            let mut st = self.lock();
            let i = st.ca(ca)?;
            if let Obj::Ca { children, .. } = st.obj(i) {
                if *children > 0 {
                    return Err(VerbsError::Busy("CA has live objects"));
                }
            }
            match st.release(i) {
                Some(Obj::Ca {
                    rt, handler, ctx, ..
                }) => (rt, handler, ctx),
                _ => unreachable!("checked CA"),
            }
        };
        let _ = self.with_slot(rt.guid, |s| {
            if let Some((_, opens)) = &mut s.open {
                *opens -= 1;
                if *opens == 0 {
                    // The driver thread stops when the last reference goes.
                    s.open = None;
                }
            }
        });
        drop(rt);
        handler.on_destroyed(ResourceKind::Ca, ctx);
        Ok(())
    }

    pub(super) fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let mut st = self.lock();
        let i = st.ca(ca)?;
        st.adjust(i, 1);
        Ok(PdHandle(st.alloc(Obj::Pd {
            ca: i,
            ctx,
            children: 0,
        })))
    }

    pub(super) fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.pd(pd)?;
            let (ca, ctx, children) = match st.obj(i) {
                Obj::Pd { ca, ctx, children } => (*ca, *ctx, *children),
                _ => unreachable!("checked PD"),
            };
            if children > 0 {
                return Err(VerbsError::Busy("PD has live objects"));
            }
            st.release(i);
            st.adjust(ca, -1);
            (st.handler(ca), ctx)
        };
        rt.on_destroyed(ResourceKind::Pd, ctx);
        Ok(())
    }
}

impl SoftRoce {
    /// The CA that holds QP or SRQ `of`.
    ///
    /// # Errors
    /// `InvalidHandle` when `of` is no QP or SRQ of this provider.
    pub fn ca_of(&self, of: verbs::Handle) -> Result<Guid> {
        let st = self.lock();
        let ca = match st.qp(QpHandle(of)) {
            Ok(i) => match st.obj(i) {
                Obj::Qp(q) => q.ca,
                _ => unreachable!("checked QP"),
            },
            Err(_) => match st.obj(st.srq(SrqHandle(of))?) {
                Obj::Srq { ca, .. } => *ca,
                _ => unreachable!("checked SRQ"),
            },
        };
        Ok(st.rt(ca).guid)
    }

    /// Has the NIC thread of open CA `guid` take in `f`'s work on each of
    /// its turns ([`softroce::Feeder`]): a NIC daemon's client rings then
    /// need no thread of their own. Returns the feeder's place there,
    /// for [`SoftRoce::remove_feeder`].
    ///
    /// # Errors
    /// `NoSuchCa` when CA `guid` is not open.
    pub fn add_feeder(
        &self,
        guid: Guid,
        f: Arc<dyn softroce::Feeder>,
    ) -> Result<softroce::FeederId> {
        let rt = self.device(guid).ok_or(VerbsError::NoSuchCa)?;
        let driver = rt.driver.get().ok_or(VerbsError::NoSuchCa)?;
        Ok(driver.add_feeder(f))
    }

    /// Stops feeder `id` at CA `guid` (nothing when the CA is closed: its
    /// thread is gone with its feeders).
    pub fn remove_feeder(&self, guid: Guid, id: softroce::FeederId) {
        if let Some(d) = self.device(guid).as_ref().and_then(|rt| rt.driver.get()) {
            d.remove_feeder(id);
        }
    }
}
