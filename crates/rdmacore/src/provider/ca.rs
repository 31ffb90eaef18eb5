//! CAs: what an open holds (its libibverbs context, event thread, GID
//! views), open and close, CA and port queries, PDs.

use super::cq::CqRt;
use super::events::{self, Dispatch};
use super::objects::Obj;
use super::{bad, RdmaCore};
use crate::convert;
use crate::gid::{self, GidView};
use crate::sys::{self, raw};
use rdma_types::{Guid, Lid, Pkey, PortNum};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use verbs::{
    CaAttr, CaHandle, Context, EventHandler, Handle, MwType, PdHandle, PortAttr, PortState,
    ResourceKind, Result, VerbsError,
};

/// One open of a CA: its own libibverbs context (so its asynchronous
/// events, port events included, reach this open's handler) and the
/// thread that waits on that context's descriptors.
pub(crate) struct CaRt {
    pub(super) dev: Arc<sys::Device>,
    /// The device's node GUID.
    pub(super) guid: Guid,
    /// Set when something other than the device told of its removal (the
    /// kernel's RDMA CM, [`RdmaCore::device_removed`]); the event thread
    /// delivers `CaRemoval` once.
    pub(super) removal: AtomicBool,
    pub(super) handler: Arc<dyn EventHandler>,
    /// The consumer's context of the open (in `CaRemoval`).
    pub(super) ctx: Context,
    /// The open's own handle, set once it is in the table.
    pub(super) handle: OnceLock<Handle>,
    pub(super) attr: raw::ibv_device_attr,
    /// The `wc_flags` bit of an invalidating receive on this device
    /// (`convert::with_inv_flag`).
    pub(super) with_inv: u32,
    gid_override: Option<u32>,
    /// GID views by port, dropped when the device says its table changed.
    gids: Mutex<HashMap<u8, GidView>>,
    /// The consumer context of each QP by number (for completions).
    qp_ctx: Mutex<HashMap<u32, Context>>,
    /// The CQs whose channels the event thread waits on.
    pub(super) cqs: Mutex<Vec<Arc<CqRt>>>,
    /// The GSI QPs whose user MAD files the event thread waits on.
    pub(super) gsis: Mutex<Vec<Arc<super::gsi::GsiRt>>>,
    pub(super) waker: sys::Waker,
    pub(super) stop: AtomicBool,
    pub(super) dispatch: Mutex<Dispatch>,
    pub(super) dispatched: Condvar,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    pub(super) thread_id: OnceLock<ThreadId>,
    /// The largest inline size an RC QP gets (probed once, see
    /// [`CaRt::max_inline`]).
    max_inline: OnceLock<u32>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CaRt {
    /// Stops the event thread (it ends after the callback it may be in).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Whether the caller is this CA's event thread.
    pub(super) fn on_event_thread(&self) -> bool {
        self.thread_id.get() == Some(&std::thread::current().id())
    }

    pub(super) fn ports(&self) -> u8 {
        self.attr.phys_port_cnt
    }

    /// Refuses a port the CA does not have.
    pub(super) fn check_port(&self, port: u8) -> Result<()> {
        if port == 0 || port > self.ports() {
            return Err(bad(format!(
                "port {port}: {} has {} port(s), numbered from 1",
                self.dev.name(),
                self.ports()
            )));
        }
        Ok(())
    }

    fn query_port_raw(&self, port: u8) -> Result<raw::ibv_port_attr> {
        self.check_port(port)?;
        self.dev
            .query_port(port)
            .map_err(|e| convert::error("query_port", e))
    }

    /// Port `port`'s GID view, read from the device when not cached.
    fn gid_view(&self, port: u8, table_len: Option<usize>) -> Result<GidView> {
        if let Some(v) = guard(&self.gids).get(&port) {
            return Ok(v.clone());
        }
        let len = match table_len {
            Some(l) => l,
            None => usize::try_from(self.query_port_raw(port)?.gid_tbl_len).unwrap_or(0),
        };
        let entries = self.dev.gid_table(port, len);
        let (v, honoured) = gid::view(&entries, self.gid_override);
        if !honoured {
            tracing::warn!(
                device = %self.dev.name(),
                port,
                "GID index {:?} is not a valid entry of the port's table; using the automatic choice",
                self.gid_override
            );
        }
        guard(&self.gids).insert(port, v.clone());
        Ok(v)
    }

    /// Forgets the GID views (the device's table changed).
    pub(super) fn gids_changed(&self) {
        guard(&self.gids).clear();
    }

    /// The device's GID index of view position `pos` on `port`.
    pub(super) fn device_gid_index(&self, port: u8, pos: u8) -> Result<u8> {
        let v = self.gid_view(port, None)?;
        v.device_index(pos)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or_else(|| {
                bad(format!(
                    "GID index {pos} is not in port {port}'s table of {} valid GIDs",
                    v.gids.len()
                ))
            })
    }

    /// Refuses a path MTU above `port`'s active MTU, naming both (and the
    /// interface under the port, whose MTU sets it on RoCE): the device
    /// would take it and its packets would be dropped on the way.
    pub(super) fn check_path_mtu(&self, port: u8, mtu: rdma_types::Mtu) -> Result<()> {
        let p = self.query_port_raw(port)?;
        if !(1..=5).contains(&p.active_mtu) {
            return Ok(());
        }
        let active = convert::mtu(p.active_mtu);
        if mtu <= active {
            return Ok(());
        }
        let root = std::path::Path::new(crate::port::SYSFS);
        let netdev = crate::port::netdev(root, self.dev.name(), port).map(|n| {
            let m = crate::port::netdev_mtu(root, &n);
            (n, m)
        });
        Err(bad(crate::port::path_mtu_too_large(
            mtu,
            active,
            self.dev.name(),
            port,
            netdev,
        )))
    }

    /// The number of P_Key table entries of `port`.
    pub(super) fn pkey_table_len(&self, port: u8) -> Result<u16> {
        Ok(self.query_port_raw(port)?.pkey_tbl_len)
    }

    pub(super) fn set_qp_ctx(&self, qpn: u32, ctx: Option<Context>) {
        let mut m = guard(&self.qp_ctx);
        match ctx {
            Some(c) => m.insert(qpn, c),
            None => m.remove(&qpn),
        };
    }

    /// The consumer context of QP `qpn` (0 once it is destroyed).
    pub(super) fn qp_ctx(&self, qpn: u32) -> Context {
        guard(&self.qp_ctx).get(&qpn).copied().unwrap_or(0)
    }

    pub(super) fn cq_list(&self) -> MutexGuard<'_, Vec<Arc<CqRt>>> {
        guard(&self.cqs)
    }

    pub(super) fn gsi_list(&self) -> MutexGuard<'_, Vec<Arc<super::gsi::GsiRt>>> {
        guard(&self.gsis)
    }

    /// The device's GID index an AH to `dgid` goes from, given view
    /// position `pos`: that entry, unless it is an IPv4 address and `dgid`
    /// is not (a peer known by its IPv6 GID, such as one whose MADs came
    /// from its link-local GID): then the port's IPv6 RoCE v2 entry, as
    /// RoCEv2 cannot carry an IPv4 source to an IPv6 destination.
    pub(super) fn sgid_for(&self, port: u8, pos: u8, dgid: rdma_types::Gid) -> Result<u8> {
        let dev = self.device_gid_index(port, pos)?;
        let v = self.gid_view(port, None)?;
        let mapped = v
            .gids
            .get(usize::from(pos))
            .is_some_and(|g| g.is_ipv4_mapped());
        if mapped && !dgid.is_ipv4_mapped() {
            if let Some(i) = self.mad_gid_index(port)? {
                return Ok(i);
            }
        }
        Ok(dev)
    }

    /// The device index of `port`'s IPv6 RoCE v2 GID, which MADs needing
    /// a GRH go from (`gid::ipv6_roce_v2`).
    pub(super) fn mad_gid_index(&self, port: u8) -> Result<Option<u8>> {
        let len = usize::try_from(self.query_port_raw(port)?.gid_tbl_len).unwrap_or(0);
        let entries = self.dev.gid_table(port, len);
        Ok(crate::gid::ipv6_roce_v2(&entries).and_then(|i| u8::try_from(i).ok()))
    }

    /// Whether `port` is Ethernet (RoCE): no LIDs, no SA, GMPs with a GRH.
    pub(super) fn is_roce(&self, port: u8) -> Result<bool> {
        Ok(self.query_port_raw(port)?.link_layer != crate::port::LINK_LAYER_IB)
    }

    /// The most inline data bytes an RC QP of one SGE takes on this
    /// device. `ibv_device_attr` does not say, so it is asked the way the
    /// rdma-core man pages advise: create QPs asking for a size, keep the
    /// largest the device accepts, and read back what it granted there.
    /// Probed on first use with a PD and CQ of its own (a dozen QP
    /// creations), then kept; 0 when the device takes none or the probe
    /// cannot run.
    pub(super) fn max_inline(&self) -> u32 {
        *self.max_inline.get_or_init(|| {
            let probe = || -> std::result::Result<u32, sys::Errno> {
                let pd = sys::Pd::new(&self.dev)?;
                let cq = Arc::new(sys::Cq::new(&self.dev, 1, 0)?);
                Ok(largest_inline(|inline| {
                    let c = sys::QpCreate {
                        qp_type: raw::IBV_QPT_RC,
                        send_cq: &cq,
                        recv_cq: &cq,
                        srq: None,
                        cap: raw::ibv_qp_cap {
                            max_send_wr: 1,
                            max_recv_wr: 1,
                            max_send_sge: 1,
                            max_recv_sge: 1,
                            max_inline_data: inline,
                        },
                        sq_sig_all: false,
                        qp_context: 0,
                    };
                    sys::Qp::new(&pd, &c)
                        .ok()
                        .map(|(_qp, cap)| cap.max_inline_data)
                }))
            };
            probe().unwrap_or_else(|e| {
                tracing::warn!(device = %self.dev.name(), "cannot probe the inline data limit ({e}); reporting 0");
                0
            })
        })
    }
}

/// The most inline bytes asked for that a probe accepts.
const INLINE_PROBE_MAX: u32 = 4096;

/// What a device grants at the largest inline size `create` accepts
/// (`None`: refused) up to [`INLINE_PROBE_MAX`], found by bisection:
/// devices refuse every size above their limit. What it grants there is
/// the answer (at least the size asked, when the device rounds up; less,
/// when it ignores the request).
fn largest_inline(create: impl Fn(u32) -> Option<u32>) -> u32 {
    let Some(mut granted) = create(0) else {
        return 0;
    };
    if let Some(g) = create(INLINE_PROBE_MAX) {
        return g;
    }
    // `lo` is accepted, `hi` refused.
    let (mut lo, mut hi) = (0, INLINE_PROBE_MAX);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match create(mid) {
            Some(g) => {
                lo = mid;
                granted = g;
            }
            None => hi = mid,
        }
    }
    granted
}

/// A non-negative `int` limit as `u32`.
fn limit(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl RdmaCore {
    /// Device `guid` is going away, as the kernel's RDMA CM said
    /// (`RDMA_CM_EVENT_DEVICE_REMOVAL`): Linux tells a verbs user nothing
    /// itself when the driver cannot take its objects away (rxe), and
    /// waits until every user closed the device. Every open of it gets
    /// `CaRemoval` once, on its event thread, as a fatal device event
    /// gives it, so consumers release their objects and close it.
    pub fn device_removed(&self, guid: Guid) {
        let rts: Vec<Arc<CaRt>> = self
            .lock()
            .objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Ca { rt, .. } if rt.guid == guid => Some(rt.clone()),
                _ => None,
            })
            .collect();
        for rt in rts {
            rt.removal.store(true, Ordering::Release);
            rt.waker.wake();
        }
    }

    pub(super) fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        let dev = match sys::Device::open(&self.verbs, guid.0) {
            Ok(Some(d)) => d,
            Ok(None) => return Err(VerbsError::NoSuchCa),
            Err(e) => return Err(convert::error("open_ca", e)),
        };
        let attr = dev
            .query_device()
            .map_err(|e| convert::error("query_device", e))?;
        let waker = sys::Waker::new()
            .map_err(|e| bad(format!("cannot make the event thread's eventfd: {e}")))?;
        let rt = Arc::new(CaRt {
            dev,
            guid,
            removal: AtomicBool::new(false),
            handler,
            ctx,
            handle: OnceLock::new(),
            with_inv: convert::with_inv_flag(attr.vendor_id),
            attr,
            gid_override: self.opts.gid_index,
            gids: Mutex::new(HashMap::new()),
            qp_ctx: Mutex::new(HashMap::new()),
            cqs: Mutex::new(Vec::new()),
            gsis: Mutex::new(Vec::new()),
            waker,
            stop: AtomicBool::new(false),
            dispatch: Mutex::new(Dispatch::default()),
            dispatched: Condvar::new(),
            thread: Mutex::new(None),
            thread_id: OnceLock::new(),
            max_inline: OnceLock::new(),
        });
        let h = self.lock().insert(
            Obj::Ca {
                rt: rt.clone(),
                ctx,
                children: 0,
            },
            None,
        );
        let _ = rt.handle.set(h);
        if let Err(e) = events::start(&rt, self.st.clone()) {
            if let Ok(i) = self.lock().ca(CaHandle(h)) {
                self.lock().remove(i, None);
            }
            return Err(bad(format!("cannot start the CA's event thread: {e}")));
        }
        Ok(CaHandle(h))
    }

    pub(super) fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        let rt = {
            let st = self.lock();
            st.rt(st.ca(ca)?)
        };
        let a = &rt.attr;
        Ok(CaAttr {
            guid: Guid(u64::from_be(a.node_guid)),
            num_ports: a.phys_port_cnt,
            max_qp: limit(a.max_qp),
            max_qp_wr: limit(a.max_qp_wr),
            max_sge: limit(a.max_sge),
            max_cq: limit(a.max_cq),
            max_cqe: limit(a.max_cqe),
            max_mr: limit(a.max_mr),
            max_pd: limit(a.max_pd),
            max_qp_rd_atom: u8::try_from(a.max_qp_rd_atom.max(0)).unwrap_or(u8::MAX),
            max_srq: limit(a.max_srq),
            max_mw: if rt.has_windows(MwType::Type1) || rt.has_windows(MwType::Type2) {
                limit(a.max_mw)
            } else {
                0
            },
            max_inline_data: rt.max_inline(),
            atomics: a.atomic_cap != 0,
        })
    }

    pub(super) fn close_ca(&self, ca: CaHandle) -> Result<()> {
        let (rt, ctx) = {
            let mut st = self.lock();
            let i = st.ca(ca)?;
            match st.obj(i) {
                Obj::Ca { children, .. } if *children > 0 => {
                    return Err(VerbsError::Busy("CA has live objects"))
                }
                _ => {}
            }
            match st.remove(i, None) {
                Some(Obj::Ca { rt, ctx, .. }) => (rt, ctx),
                _ => unreachable!("checked CA"),
            }
        };
        rt.stop();
        if !rt.on_event_thread() {
            let t = guard(&rt.thread).take();
            if let Some(t) = t {
                let _ = t.join();
            }
        }
        events::retire(&rt, ca.0, ResourceKind::Ca, ctx);
        Ok(())
    }

    pub(super) fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let rt = {
            let st = self.lock();
            st.rt(st.ca(ca)?)
        };
        let p = rt.query_port_raw(port.0)?;
        // The view is read afresh: a query is where a consumer learns of
        // a changed table.
        rt.gids_changed();
        let view = rt.gid_view(port.0, usize::try_from(p.gid_tbl_len).ok())?;
        let mut pkeys: Vec<Pkey> = (0..p.pkey_tbl_len)
            .map_while(|i| rt.dev.query_pkey(port.0, i).ok().map(Pkey))
            .collect();
        while pkeys.last().is_some_and(|k| k.0 == 0) {
            pkeys.pop();
        }
        Ok(PortAttr {
            port,
            state: match p.state {
                raw::IBV_PORT_ACTIVE | raw::IBV_PORT_ACTIVE_DEFER => PortState::Active,
                raw::IBV_PORT_INIT | raw::IBV_PORT_ARMED => PortState::Init,
                _ => PortState::Down,
            },
            max_mtu: convert::mtu(p.max_mtu),
            active_mtu: convert::mtu(p.active_mtu),
            lid: Lid(p.lid),
            sm_lid: Lid(p.sm_lid),
            // The SM LID routes on a device's fabric.
            sm_gid: None,
            gids: view.gids,
            pkeys,
        })
    }

    pub(super) fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        let rt = {
            let st = self.lock();
            st.rt(st.ca(ca)?)
        };
        let pd = sys::Pd::new(&rt.dev).map_err(|e| convert::error("alloc_pd", e))?;
        let mut st = self.lock();
        // The CA may have been closed meanwhile (its handle is then dead).
        let i = st.ca(ca)?;
        st.adjust(i, 1);
        Ok(PdHandle(st.insert(
            Obj::Pd {
                ca: i,
                pd,
                ctx,
                children: 0,
            },
            None,
        )))
    }

    pub(super) fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        let (rt, ctx, hw) = {
            let mut st = self.lock();
            let i = st.pd(pd)?;
            let (ca, ctx, children) = match st.obj(i) {
                Obj::Pd {
                    ca, ctx, children, ..
                } => (*ca, *ctx, *children),
                _ => unreachable!("checked PD"),
            };
            if children > 0 {
                return Err(VerbsError::Busy("PD has live objects"));
            }
            let hw = match st.remove(i, None) {
                Some(Obj::Pd { pd, .. }) => pd,
                _ => unreachable!("checked PD"),
            };
            st.adjust(ca, -1);
            (st.rt(ca), ctx, hw)
        };
        // Freed here, outside the lock (the device call may sleep).
        drop(hw);
        events::retire(&rt, pd.0, ResourceKind::Pd, ctx);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A device that takes up to `limit` inline bytes and grants what it
    /// is asked rounded up to `round`, counting the QPs made.
    fn device(limit: u32, round: u32, made: &Cell<u32>) -> impl Fn(u32) -> Option<u32> + '_ {
        move |asked| {
            made.set(made.get() + 1);
            (asked <= limit).then(|| asked.div_ceil(round) * round)
        }
    }

    #[test]
    fn the_inline_probe_finds_the_largest_size_the_device_takes() {
        let made = Cell::new(0);
        // Linux rxe: 256, granted as asked (one SGE is 16 bytes).
        assert_eq!(largest_inline(device(256, 1, &made)), 256);
        assert!(made.get() <= 14, "{} QPs", made.get());
        // A device that rounds up what it grants reports the grant.
        assert_eq!(largest_inline(device(220, 16, &Cell::new(0))), 224);
        for limit in [0, 1, 63, 64, 4095] {
            assert_eq!(largest_inline(device(limit, 1, &Cell::new(0))), limit);
        }
        // Takes anything: the grant at the probe's largest ask.
        assert_eq!(
            largest_inline(device(u32::MAX, 1, &Cell::new(0))),
            INLINE_PROBE_MAX
        );
        // Takes no QP at all, or ignores the ask.
        assert_eq!(largest_inline(|_| None), 0);
        assert_eq!(largest_inline(|a| (a <= 512).then_some(0)), 0);
    }
}
