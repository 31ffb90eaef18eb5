//! The in-process loopback fabric: CAs attached to one [`Fabric`], which
//! implements [`verbs::Provider`] for all of them.

use core::result::Result;
use rdma_types::{
    AccessFlags, Gid, Guid, IdMap, Lid, Mtu, Pkey, PortNum, Qkey, QpState, QpType, Qpn, Rkey,
    WcOpcode, WcStatus,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::kit;
use verbs::kit::cq::Cq;
use verbs::kit::handle_table::HandleTable;
use verbs::kit::keys::{KeyTable, Target};
use verbs::kit::qp_table;
use verbs::kit::rq::RecvQueue;
use verbs::*;

mod ca;
mod cq;
mod exec;
mod mr;
mod objects;
mod port;
mod post;
mod qp;
mod srq;

use exec::wc_opcode;
use objects::{Cb, Device, Obj, Peer, Qp, State};

/// Size of the GRH placed before UD payloads in receive buffers (IBA 8.3).
pub const GRH_LEN: usize = 40;

/// Configuration of one port of a loopback CA.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// Base LID.
    pub lid: Lid,
    /// GID table entry 0.
    pub gid: Gid,
    /// P_Key table.
    pub pkeys: Vec<Pkey>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Initially active.
    pub active: bool,
}

/// Configuration of a loopback CA.
#[derive(Debug, Clone)]
pub struct CaConfig {
    /// Node GUID (used by `open_ca`).
    pub guid: Guid,
    /// Ports, numbered from 1.
    pub ports: Vec<PortConfig>,
}

impl CaConfig {
    /// A one-port CA with LID `lid`, GID from the default prefix, default
    /// P_Key, MTU 4096, port active.
    pub fn simple(guid: u64, lid: u16) -> CaConfig {
        CaConfig {
            guid: Guid(guid),
            ports: vec![PortConfig {
                lid: Lid(lid),
                gid: Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(guid)),
                pkeys: vec![Pkey::DEFAULT],
                mtu: Mtu::Mtu4096,
                active: true,
            }],
        }
    }

    /// Like [`CaConfig::simple`] with a second port (LID `lid + 0x100`, GID
    /// from port GUID `guid + 1`): room for an alternate path.
    pub fn dual_port(guid: u64, lid: u16) -> CaConfig {
        let mut c = CaConfig::simple(guid, lid);
        let mut p2 = c.ports[0].clone();
        p2.lid = Lid(lid.wrapping_add(0x100));
        p2.gid = Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(guid.wrapping_add(1)));
        c.ports.push(p2);
        c
    }
}

/// The simulated fabric and its provider.
pub struct Fabric {
    state: Mutex<State>,
    cbq: Mutex<(VecDeque<Cb>, bool)>,
    lacks: Vec<verbs::Feature>,
}

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

const MAX_QP_WR: u32 = 16384;
const MAX_SGE: u32 = 32;
const MAX_CQE: u32 = 1 << 20;

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Arc<Fabric> {
        Fabric::without(&[])
    }

    /// A fabric whose CAs lack `features` (memory windows, SRQ, atomics are
    /// honoured), answering `NotSupported` for them: models a smaller HCA
    /// and exercises the conformance suite's skip path.
    pub fn without(features: &[verbs::Feature]) -> Arc<Fabric> {
        Arc::new(Fabric {
            state: Mutex::new(State::default()),
            cbq: Mutex::new((VecDeque::new(), false)),
            lacks: features.to_vec(),
        })
    }

    fn lacks(&self, f: verbs::Feature) -> bool {
        self.lacks.contains(&f)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delivers callbacks in order without holding the state lock. A
    /// callback that calls back into the provider only queues.
    fn dispatch(&self, cbs: Vec<Cb>) {
        if cbs.is_empty() {
            // Nothing new: any queued callback has a running dispatcher.
            return;
        }
        let mut q = self.cbq.lock().unwrap_or_else(|e| e.into_inner());
        q.0.extend(cbs);
        if q.1 {
            return;
        }
        q.1 = true;
        while let Some(cb) = q.0.pop_front() {
            drop(q);
            match cb {
                Cb::Completion(h, ctx) => h.on_completion(ctx),
                Cb::Async(h, ev) => h.on_async_event(ev),
                Cb::Destroyed(h, k, ctx) => h.on_destroyed(k, ctx),
            }
            q = self.cbq.lock().unwrap_or_else(|e| e.into_inner());
        }
        q.1 = false;
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut State, &mut Vec<Cb>) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut out = Vec::new();
        let r = {
            let mut st = self.lock();
            f(&mut st, &mut out)
        };
        self.dispatch(out);
        r
    }
}

/// Each verb but a few one-liners is the inherent method of the same name
/// in the file of its object (`ca`, `port`, `cq`, `srq`, `qp`, `mr`,
/// `post`), visible in this module only (see `forward_verbs!`).
impl Provider for Fabric {
    fn name(&self) -> &'static str {
        "loopback"
    }

    /// Work completes inside `post_send`, which calls the peer's handlers
    /// on the posting thread.
    fn handlers_nest(&self) -> bool {
        true
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.lock()
            .devices
            .iter()
            .filter(|d| !d.removed)
            .map(|d| d.guid)
            .collect()
    }

    forward_verbs! {
        fn open_ca(
            &self,
            guid: Guid,
            ctx: Context,
            handler: Arc<dyn EventHandler>,
        ) -> verbs::Result<CaHandle>;
        fn query_ca(&self, ca: CaHandle) -> verbs::Result<CaAttr>;
        fn close_ca(&self, ca: CaHandle) -> verbs::Result<()>;
        fn query_port(&self, ca: CaHandle, port: PortNum) -> verbs::Result<PortAttr>;
        fn modify_port(&self, ca: CaHandle, port: PortNum, m: &PortModify) -> verbs::Result<()>;
        fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> verbs::Result<PdHandle>;
        fn dealloc_pd(&self, pd: PdHandle) -> verbs::Result<()>;
        fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> verbs::Result<CqHandle>;
        fn destroy_cq(&self, cq: CqHandle) -> verbs::Result<()>;
        fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> verbs::Result<usize>;
        fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> verbs::Result<()>;
        fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> verbs::Result<()>;
        fn create_srq(
            &self,
            pd: PdHandle,
            attr: &SrqAttr,
            ctx: Context,
        ) -> verbs::Result<SrqHandle>;
        fn modify_srq(&self, srq: SrqHandle, limit: u32) -> verbs::Result<()>;
        fn query_srq(&self, srq: SrqHandle) -> verbs::Result<SrqAttr>;
        fn destroy_srq(&self, srq: SrqHandle) -> verbs::Result<()>;
        fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> verbs::Result<QpHandle>;
        fn qp_num(&self, qp: QpHandle) -> verbs::Result<Qpn>;
        fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> verbs::Result<()>;
        fn query_qp(&self, qp: QpHandle) -> verbs::Result<QpAttr>;
        fn destroy_qp(&self, qp: QpHandle) -> verbs::Result<()>;
        fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> verbs::Result<AhHandle>;
        fn destroy_ah(&self, ah: AhHandle) -> verbs::Result<()>;
        fn reg_mr(
            &self,
            pd: PdHandle,
            buf: &MemBuf,
            addr: u64,
            len: u64,
            access: AccessFlags,
            ctx: Context,
        ) -> verbs::Result<MrInfo>;
        fn rereg_mr(
            &self,
            mr: MrHandle,
            buf: &MemBuf,
            addr: u64,
            len: u64,
            access: AccessFlags,
        ) -> verbs::Result<MrInfo>;
        fn dereg_mr(&self, mr: MrHandle) -> verbs::Result<()>;
        fn alloc_mw(
            &self,
            pd: PdHandle,
            kind: MwType,
            ctx: Context,
        ) -> verbs::Result<(MwHandle, Rkey)>;
        fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> verbs::Result<Rkey>;
        fn dealloc_mw(&self, mw: MwHandle) -> verbs::Result<()>;
        fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> verbs::Result<()>;
        fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> verbs::Result<()>;
        fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> verbs::Result<()>;
    }
}
