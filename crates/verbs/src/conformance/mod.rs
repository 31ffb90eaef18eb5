//! Conformance suite generic over providers (the rdma-core `tests/` idea).
//!
//! A provider crate implements [`Fixture`] and expands
//! [`conformance_tests!`](crate::conformance_tests) in an integration test;
//! that yields one `#[test]` per case. A case for a feature the fixture
//! declares missing asserts the provider answers `NotSupported`, prints
//! `SKIPPED <case>: <reason>` and passes; the `skip_list_matches_gaps` test
//! checks the skipped set equals the declared gaps. Two refinements: a
//! provider lacking [`Feature::Sqe`] must take the QP to ERR instead
//! (checked), and `pkey_change` is skipped for [`Feature::PkeyControl`]
//! when the fixture cannot set a P_Key table ([`Fixture::set_pkeys`]
//! answers `NotSupported`, e.g. on a RoCE port), a gap the fixture must
//! declare like any other.
//!
//! Path migration ([`Feature::Apm`]): `apm_forced_migration` arms an
//! alternate path through port 2 on both QPs of an RC pair, forces the
//! migration (RTS->RTS with `Migrated`) and sees `PathMigrated` at both
//! owners (the peer follows its first packet on the alternate path) and
//! traffic both ways; it also checks the refusals (`Migrated` or `Rearm`
//! with nothing armed, `Armed` asked by the consumer, reloading an armed
//! path, an alternate path on UD). `apm_port_down` takes port 1 down
//! under armed QPs: the SEND after completes without error and both
//! owners get `PathMigrated`. A provider lacking APM refuses an alternate
//! path with `NotSupported` (soft RoCE today).
//!
//! iWARP's model ([`Feature::Immediate`], [`Feature::RemoteErrorCompletion`]):
//! a provider without immediate data refuses those opcodes, and the SEND
//! and WRITE cases run without them; one whose requesters complete a SEND
//! or WRITE when it is sent learns of the responder's refusal by a
//! TERMINATE, so the error cases check the requester's `QpFatal` and ERR
//! state instead of the responder's status in its completion
//! ([`refused_at_requester`]), and `rnr` checks that a SEND with no
//! receive ends both QPs.
//!
//! Completions are awaited with `wait_cq` (bounded by a generous timeout),
//! never by sleeping, so asynchronous providers run the same cases.
//!
//! Error statuses: every [`WcStatus`] a provider completes a WR with has a
//! case (LocLenErr, LocQpOpErr, LocProtErr, WrFlushErr, MwBindErr,
//! RemInvReqErr, RemAccessErr, RemOpErr, RetryExcErr, RnrRetryExcErr).
//! Not covered, on purpose and visibly:
//! - `LocAccessErr`: no provider completes a WR with it. Both name it as
//!   the cause when a responder refuses an RDMA or atomic request, but
//!   no receive WQE is consumed then, so the responder's owner sees an
//!   affiliated `QpFatal` (checked in `remote_access_errors_and_flush`).
//! - `BadRespErr`: only a wire provider can meet a malformed or
//!   unexpected response; no verb makes a peer send one, so it is tested
//!   in the `roce` engine's own tests, not here.

use crate::*;
use rdma_types::{
    AccessFlags, Gid, Guid, Lid, Mtu, Pkey, PortNum, Psn, Qkey, QpState, QpType, Rkey, WcOpcode,
    WcStatus,
};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The gaps a fixture declares; always compiled (a provider may take a
/// list of them), re-exported here for the suite's users.
pub use crate::caps::Feature;

/// What a provider crate supplies to run the suite.
pub trait Fixture {
    /// The provider, with two CAs attached to one fabric (ports active).
    fn provider(&self) -> Arc<dyn Provider>;
    /// GUIDs of the two CAs.
    fn guids(&self) -> (Guid, Guid);
    /// Brings port 1 of `guid` up or down.
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()>;
    /// Changes the LID of port 1 of `guid`.
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()>;
    /// Detaches the CA.
    fn remove_ca(&self, guid: Guid) -> Result<()>;
    /// Replaces the P_Key table of port 1 of `guid` (as an SM would),
    /// which raises `PkeyChange`. `NotSupported` when the fixture cannot
    /// (a RoCE port's table is fixed): the case is then skipped, and the
    /// fixture must declare [`Feature::PkeyControl`] missing.
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        let _ = (guid, pkeys);
        Err(VerbsError::NotSupported(
            "P_Key table control in this fixture",
        ))
    }
    /// Declared gaps.
    fn lacks(&self) -> Vec<Feature>;
}

/// Fixture `inner`'s CAs, controls and gaps, its verbs reached through
/// `provider`: something that holds `inner`'s provider (a set of
/// providers, an access layer's client), whose handles must work as the
/// inner provider's do.
pub struct Through<F> {
    pub inner: F,
    pub provider: Arc<dyn Provider>,
}

impl<F: Fixture> Fixture for Through<F> {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.inner.guids()
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.inner.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.inner.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.inner.remove_ca(guid)
    }
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.inner.set_pkeys(guid, pkeys)
    }
    fn lacks(&self) -> Vec<Feature> {
        self.inner.lacks()
    }
}

/// Result of one case.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Ran and passed.
    Passed,
    /// The provider lacks the feature (and said `NotSupported`).
    Skipped(Feature),
}

/// Runs one case, printing a visible line when it is skipped.
pub fn run(name: &str, f: &dyn Fixture, case: fn(&dyn Fixture) -> Outcome) {
    if let Outcome::Skipped(feat) = case(f) {
        println!("SKIPPED {name}: provider lacks {feat:?}");
        assert!(
            f.lacks().contains(&feat),
            "{name} skipped for {feat:?}, which the fixture does not declare missing"
        );
    }
}

/// Consumer events recorded by [`Recorder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// `on_completion(ctx)`.
    Completion(u64),
    /// `on_async_event`.
    Async(AsyncEvent),
    /// `on_destroyed`.
    Destroyed(ResourceKind, u64),
}

/// A callback run inside `on_completion`.
pub type Hook = Box<dyn FnMut(u64) + Send>;

/// An event handler that records everything.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<Ev>>,
    cond: Condvar,
    /// Called from `on_completion` (used to destroy from a callback).
    pub hook: Mutex<Option<Hook>>,
}

impl Recorder {
    fn push(&self, e: Ev) {
        self.events.lock().unwrap().push(e);
        self.cond.notify_all();
    }
    /// Snapshot.
    pub fn events(&self) -> Vec<Ev> {
        self.events.lock().unwrap().clone()
    }
    /// Waits until `pred` holds for some recorded event.
    pub fn wait_for(&self, pred: impl Fn(&Ev) -> bool) -> bool {
        let g = self.events.lock().unwrap();
        let (g, _) = self
            .cond
            .wait_timeout_while(g, Duration::from_secs(10), |v| !v.iter().any(&pred))
            .unwrap();
        g.iter().any(pred)
    }
}

impl EventHandler for Recorder {
    fn on_completion(&self, cq_ctx: u64) {
        self.push(Ev::Completion(cq_ctx));
        let mut h = self.hook.lock().unwrap();
        if let Some(f) = h.as_mut() {
            f(cq_ctx);
        }
    }
    fn on_async_event(&self, event: AsyncEvent) {
        self.push(Ev::Async(event));
    }
    fn on_destroyed(&self, kind: ResourceKind, ctx: u64) {
        self.push(Ev::Destroyed(kind, ctx));
    }
}

/// One opened CA with a PD and a CQ.
pub struct Node {
    /// Provider.
    pub p: Arc<dyn Provider>,
    /// CA.
    pub ca: CaHandle,
    /// PD.
    pub pd: PdHandle,
    /// CQ (ctx 100).
    pub cq: CqHandle,
    /// Handler.
    pub rec: Arc<Recorder>,
    /// Port 1 attributes at open time.
    pub port: PortAttr,
    /// A 64 KiB buffer registered with every right.
    pub buf: MemBuf,
    /// Its registration.
    pub mr: MrInfo,
}

/// Every MR right.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::MW_BIND
}

impl Node {
    /// Opens `guid`.
    pub fn open(f: &dyn Fixture, guid: Guid, cqe: u32) -> Node {
        let p = f.provider();
        let rec = Arc::new(Recorder::default());
        let ca = p.open_ca(guid, 1, rec.clone()).unwrap();
        let pd = p.alloc_pd(ca, 2).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe }, 100).unwrap();
        let port = p.query_port(ca, PortNum(1)).unwrap();
        let buf = MemBuf::new(65536);
        let mr = p
            .reg_mr(pd, &buf, buf.addr(), 65536, all_access(), 3)
            .unwrap();
        Node {
            p,
            ca,
            pd,
            cq,
            rec,
            port,
            buf,
            mr,
        }
    }

    /// SGE over `[off, off+len)` of the node buffer.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off,
            length: len,
            lkey: self.mr.lkey,
        }
    }

    /// Posts one receive `wr_id` on `q` into `[off, off+len)` of the node
    /// buffer; panics if the provider refuses it.
    pub fn post_one_recv(&self, q: QpHandle, wr_id: u64, off: u64, len: u32) {
        self.p
            .post_recv(q, &[recv(wr_id, vec![self.sge(off, len)])])
            .unwrap();
    }

    /// Address vector to this node's port 1.
    pub fn av(&self) -> AhAttr {
        AhAttr {
            dlid: self.port.lid,
            port: PortNum(1),
            grh: true,
            dgid: self.port.gids[0],
            sgid_index: 0,
            sl: 0,
            hop_limit: 64,
        }
    }

    /// The alternate path from a peer's `port` to this node's `port`
    /// (port 1 when the CA has no such port: only a provider refusing
    /// alternate paths is asked to load that).
    pub fn alt_path_to(&self, port: PortNum) -> AltPath {
        let attr = self
            .p
            .query_port(self.ca, port)
            .unwrap_or_else(|_| self.port.clone());
        AltPath {
            av: AhAttr {
                dlid: attr.lid,
                port,
                grh: true,
                dgid: attr.gids[0],
                sgid_index: 0,
                sl: 0,
                hop_limit: 64,
            },
            port,
            pkey_index: 0,
            timeout: 14,
        }
    }

    /// A QP of `t` on the node CQ.
    pub fn qp(&self, t: QpType, srq: Option<SrqHandle>, ctx: u64) -> QpHandle {
        let port = matches!(t, QpType::Smi | QpType::Gsi).then_some(PortNum(1));
        let init = QpInit {
            qp_type: t,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq,
            caps: QpCaps::default(),
            sq_sig_all: false,
            port,
        };
        self.p.create_qp(self.pd, &init, ctx).unwrap()
    }

    /// Next completion (waits up to 10 s).
    pub fn wc(&self) -> WorkCompletion {
        let mut out = [WorkCompletion::new(
            0,
            WcStatus::GeneralErr,
            WcOpcode::Send,
            0,
        )];
        for _ in 0..100 {
            if self.p.poll_cq(self.cq, &mut out).unwrap() == 1 {
                return out[0];
            }
            let _ = self.p.wait_cq(self.cq, Duration::from_millis(100));
        }
        panic!("no completion within 10 s");
    }

    /// Asserts the CQ is empty.
    pub fn no_wc(&self) {
        let mut out = [WorkCompletion::new(
            0,
            WcStatus::GeneralErr,
            WcOpcode::Send,
            0,
        )];
        assert_eq!(
            self.p.poll_cq(self.cq, &mut out).unwrap(),
            0,
            "unexpected completion {:?}",
            out[0]
        );
    }
}

fn to_init(n: &Node, qp: QpHandle, t: QpType) {
    let mut a = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        ..Default::default()
    };
    match t {
        QpType::Rc | QpType::Uc => {
            a.port = Some(PortNum(1));
            a.access = Some(
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            );
        }
        QpType::Ud => {
            a.port = Some(PortNum(1));
            a.qkey = Some(Qkey(0x1111));
        }
        _ => a.qkey = Some(Qkey::GSI),
    }
    n.p.modify_qp(qp, &a).unwrap();
}

/// Takes a UD QP from RESET to RTS (Q_Key 0x1111).
pub fn ud_rts(n: &Node, q: QpHandle) {
    to_init(n, q, QpType::Ud);
    for state in [QpState::Rtr, QpState::Rts] {
        let a = QpAttr {
            state: Some(state),
            sq_psn: (state == QpState::Rts).then_some(Psn::new(0)),
            ..Default::default()
        };
        n.p.modify_qp(q, &a).unwrap();
    }
}

/// Connects two RC/UC QPs with `rnr_retry`.
pub fn connect(a: &Node, qa: QpHandle, b: &Node, qb: QpHandle, t: QpType, rnr_retry: u8) {
    connect_opts(a, qa, b, qb, t, rnr_retry, true)
}

/// Like [`connect`]; `b_rts: false` leaves `qb` in RTR.
pub fn connect_opts(
    a: &Node,
    qa: QpHandle,
    b: &Node,
    qb: QpHandle,
    t: QpType,
    rnr_retry: u8,
    b_rts: bool,
) {
    for (n, q, peer, pq) in [(a, qa, b, qb), (b, qb, a, qa)] {
        to_init(n, q, t);
        let rc = t == QpType::Rc;
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(peer.av()),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(peer.p.qp_num(pq).unwrap()),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: rc.then_some(4),
            min_rnr_timer: rc.then_some(1),
            ..Default::default()
        };
        n.p.modify_qp(q, &rtr).unwrap();
    }
    for (n, q) in [(a, qa), (b, qb)]
        .into_iter()
        .take(if b_rts { 2 } else { 1 })
    {
        let rc = t == QpType::Rc;
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            timeout: rc.then_some(14),
            retry_cnt: rc.then_some(7),
            rnr_retry: rc.then_some(rnr_retry),
            max_rd_atomic: rc.then_some(4),
            ..Default::default()
        };
        n.p.modify_qp(q, &rts).unwrap();
    }
}

/// Two nodes with a connected RC pair (rnr_retry 0).
pub fn rc_pair(f: &dyn Fixture) -> (Node, QpHandle, Node, QpHandle) {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 256), Node::open(f, g2, 256));
    let (qa, qb) = (a.qp(QpType::Rc, None, 10), b.qp(QpType::Rc, None, 20));
    connect(&a, qa, &b, qb, QpType::Rc, 0);
    (a, qa, b, qb)
}

fn send(wr_id: u64, op: SendOpcode, sges: Vec<Sge>) -> SendWr {
    SendWr::new(wr_id, op, sges)
}

fn rdma(wr_id: u64, op: SendOpcode, sges: Vec<Sge>, addr: u64, rkey: Rkey) -> SendWr {
    let mut w = SendWr::new(wr_id, op, sges);
    w.remote = RemoteAddr { addr, rkey };
    w
}

fn recv(wr_id: u64, sges: Vec<Sge>) -> RecvWr {
    RecvWr {
        wr_id,
        sges: sges.into(),
    }
}

fn unsupported<T: core::fmt::Debug>(r: Result<T>) {
    let ok = match &r {
        Err(VerbsError::NotSupported(_)) => true,
        Err(VerbsError::BadWr { cause, .. }) => matches!(**cause, VerbsError::NotSupported(_)),
        _ => false,
    };
    assert!(ok, "lacking provider must answer NotSupported, got {r:?}");
}

/// The affiliated `QpFatal` of the QP with context `ctx`.
pub fn qp_fatal(ctx: u64) -> Ev {
    Ev::Async(AsyncEvent {
        kind: AsyncEventKind::QpFatal,
        ctx,
        port: None,
    })
}

/// Whether requesters see the responder's verdict (else iWARP's TERMINATE
/// model, [`Feature::RemoteErrorCompletion`]).
pub fn remote_status(f: &dyn Fixture) -> bool {
    !f.lacks().contains(&Feature::RemoteErrorCompletion)
}

/// A requester's SEND or WRITE the responder refused: its completion says
/// `want`, or (lacking [`Feature::RemoteErrorCompletion`]) it completed
/// when sent and the requester's QP (context `ctx`) is in ERR by a
/// TERMINATE with `QpFatal`.
pub fn refused_at_requester(
    f: &dyn Fixture,
    a: &Node,
    qa: QpHandle,
    ctx: u64,
    wr_id: u64,
    want: WcStatus,
) {
    let wc = a.wc();
    if remote_status(f) {
        assert_eq!((wc.wr_id, wc.status), (wr_id, want));
    } else {
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
        assert!(
            a.rec.wait_for(|e| *e == qp_fatal(ctx)),
            "requester: no QpFatal"
        );
    }
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
}

/// Returns once the WRITEs `a` posted on `qa` are placed at `b`. With
/// completions that carry the responder's verdict they are already;
/// otherwise (iWARP) a 1-byte RDMA READ behind them proves it, since a
/// responder serves a Read only after the messages before it (RFC 5040
/// 5.5). The READ lands in the last byte of `a`'s buffer.
pub fn until_placed(f: &dyn Fixture, a: &Node, qa: QpHandle, b: &Node) {
    if remote_status(f) {
        return;
    }
    let w = rdma(
        0xfe_11ce,
        SendOpcode::RdmaRead,
        vec![a.sge(65535, 1)],
        b.buf.addr(),
        b.mr.rkey,
    );
    a.p.post_send(qa, &[w]).unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (0xfe_11ce, WcStatus::Success));
}

/// The cases, one function each.
pub mod cases;

/// Expands to one `#[test]` per conformance case for the fixture built by
/// `$ctor` (an expression producing a `impl Fixture`).
#[macro_export]
macro_rules! conformance_tests {
    ($ctor:expr) => {
        $crate::conformance_tests!(@cases $ctor;
            query_ca_port, stale_handles_and_destroy, busy_resources, qp_state_machine, rc_send, rc_write, rc_read,
            rc_atomics, remote_access_errors_and_flush, local_protection_error, receive_too_small, rnr,
            batch_post_reports_index, cq_notify_wait_overflow, mr_rereg_dereg, mw_type1, mw_type2_and_invalidate, mw_refusals,
            ud_send_grh, special_qps, srq_limit, uc_basics, port_and_ca_events, destroy_from_callback,
            local_qp_operation_error, remote_operational_error, sqe_and_resume, pkey_change,
            apm_forced_migration, apm_port_down);
    };
    (@cases $ctor:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let f = $ctor;
                $crate::conformance::run(stringify!($name), &f, $crate::conformance::cases::$name);
            }
        )*
        #[test]
        fn skip_list_matches_gaps() {
            let f = $ctor;
            let mut skipped = Vec::new();
            $(
                if let $crate::conformance::Outcome::Skipped(feat) = $crate::conformance::cases::$name(&$ctor) {
                    if !skipped.contains(&feat) { skipped.push(feat); }
                }
            )*
            let mut lacks = $crate::conformance::Fixture::lacks(&f);
            let key = |x: &$crate::conformance::Feature| format!("{x:?}");
            skipped.sort_by_key(key);
            lacks.sort_by_key(key);
            assert_eq!(skipped, lacks, "skipped cases must match the declared gaps");
        }
    };
}
