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

/// Optional features a provider may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Unreliable connected QPs.
    Uc,
    /// UD QPs and address handles.
    Ud,
    /// QP0/QP1.
    SpecialQp,
    /// Shared receive queues.
    Srq,
    /// Memory windows.
    Mw,
    /// Atomics.
    Atomics,
    /// Port up/down, LID/P_Key change and CA removal controlled by tests.
    PortControl,
    /// The SQE state (IBA 10.3.1.6): a UC/UD send error stops the send
    /// queue only, and modify SQE->RTS resumes it. A provider lacking it
    /// takes the QP to ERR instead, which the SQE case checks.
    Sqe,
    /// Path migration (APM, IBA 17.2.8): alternate paths in modify-QP,
    /// forced and automatic migration, the PathMigrated event. The
    /// fixture's CAs need an active port 2 for the alternate path. A
    /// provider lacking it refuses an alternate path with `NotSupported`.
    Apm,
    /// P_Key tables set by the fixture as an SM would
    /// ([`Fixture::set_pkeys`]); a RoCE port's table is fixed.
    PkeyControl,
}

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
    RecvWr { wr_id, sges }
}

fn unsupported<T: core::fmt::Debug>(r: Result<T>) {
    let ok = match &r {
        Err(VerbsError::NotSupported(_)) => true,
        Err(VerbsError::BadWr { cause, .. }) => matches!(**cause, VerbsError::NotSupported(_)),
        _ => false,
    };
    assert!(ok, "lacking provider must answer NotSupported, got {r:?}");
}

/// The cases, one function each.
pub mod cases {
    use super::*;

    /// Query CA and port; open by unknown GUID fails.
    pub fn query_ca_port(f: &dyn Fixture) -> Outcome {
        let (g1, _) = f.guids();
        let n = Node::open(f, g1, 16);
        let ca = n.p.query_ca(n.ca).unwrap();
        assert_eq!(ca.guid, g1);
        assert!(ca.num_ports >= 1 && ca.max_qp_wr >= 64 && ca.max_sge >= 4);
        assert!(n.p.list_cas().contains(&g1));
        assert_eq!(n.port.state, PortState::Active);
        // IB ports have a unicast LID; RoCE ports have none (LID 0) and a
        // GID that is an IP address (not the fe80::/64 subnet prefix).
        let roce = n
            .port
            .gids
            .first()
            .is_some_and(|g| g.0[..2] != [0xfe, 0x80]);
        assert!(
            (n.port.lid.is_unicast() && n.port.lid != Lid(0)) || (roce && n.port.lid == Lid(0)),
            "LID {:?} on a port with GID {:?}",
            n.port.lid,
            n.port.gids.first()
        );
        assert!(!n.port.gids.is_empty() && n.port.gids[0] != Gid::ZERO);
        assert_eq!(
            n.p.find_pkey(n.ca, PortNum(1), rdma_types::Pkey::DEFAULT)
                .unwrap(),
            0
        );
        assert!(n.port.active_mtu.bytes() <= n.port.max_mtu.bytes());
        assert!(n.p.query_port(n.ca, PortNum(99)).is_err());
        assert!(n
            .p
            .open_ca(Guid(0xdead_beef_0bad), 0, n.rec.clone())
            .is_err());
        Outcome::Passed
    }

    /// Stale handles are refused; destroy reports `on_destroyed` with ctx.
    pub fn stale_handles_and_destroy(f: &dyn Fixture) -> Outcome {
        let n = Node::open(f, f.guids().0, 16);
        let pd = n.p.alloc_pd(n.ca, 77).unwrap();
        n.p.dealloc_pd(pd).unwrap();
        assert!(n
            .rec
            .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Pd, 77)));
        assert_eq!(n.p.dealloc_pd(pd), Err(VerbsError::InvalidHandle));
        assert_eq!(
            n.p.create_cq(pd, &CqInit { cqe: 4 }, 0),
            Err(VerbsError::InvalidHandle)
        );
        // A fresh object in the same slot does not revive the old handle.
        let _pd2 = n.p.alloc_pd(n.ca, 78).unwrap();
        assert_eq!(n.p.dealloc_pd(pd), Err(VerbsError::InvalidHandle));
        // Wrong handle kind.
        assert_eq!(
            n.p.poll_cq(CqHandle(n.pd.0), &mut []),
            Err(VerbsError::InvalidHandle)
        );
        Outcome::Passed
    }

    /// Objects in use refuse destruction with `Busy`.
    pub fn busy_resources(f: &dyn Fixture) -> Outcome {
        let n = Node::open(f, f.guids().0, 16);
        assert!(matches!(n.p.dealloc_pd(n.pd), Err(VerbsError::Busy(_))));
        let qp = n.qp(QpType::Rc, None, 5);
        assert!(matches!(n.p.destroy_cq(n.cq), Err(VerbsError::Busy(_))));
        n.p.destroy_qp(qp).unwrap();
        assert!(n.rec.wait_for(|e| *e == Ev::Destroyed(ResourceKind::Qp, 5)));
        n.p.destroy_cq(n.cq).unwrap();
        assert!(n
            .rec
            .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Cq, 100)));
        Outcome::Passed
    }

    /// The QP state machine with attribute validation per transition.
    pub fn qp_state_machine(f: &dyn Fixture) -> Outcome {
        let n = Node::open(f, f.guids().0, 16);
        let qp = n.qp(QpType::Rc, None, 5);
        assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Reset));
        let st = |s| QpAttr {
            state: Some(s),
            ..Default::default()
        };
        assert_eq!(
            n.p.modify_qp(qp, &st(QpState::Rts)),
            Err(VerbsError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
        assert!(matches!(
            n.p.modify_qp(qp, &st(QpState::Init)),
            Err(VerbsError::MissingAttribute { .. })
        ));
        let bad_pkey = QpAttr {
            state: Some(QpState::Init),
            port: Some(PortNum(1)),
            pkey_index: Some(999),
            access: Some(AccessFlags::NONE),
            ..Default::default()
        };
        assert!(matches!(
            n.p.modify_qp(qp, &bad_pkey),
            Err(VerbsError::InvalidArgument(_))
        ));
        assert_eq!(
            n.p.query_qp(qp).unwrap().state,
            Some(QpState::Reset),
            "refused modify changes nothing"
        );
        to_init(&n, qp, QpType::Rc);
        assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Init));
        let e =
            n.p.post_send(qp, &[send(1, SendOpcode::Send, vec![])])
                .unwrap_err();
        assert_eq!(
            e,
            VerbsError::BadWr {
                index: 0,
                cause: Box::new(VerbsError::InvalidState(QpState::Init))
            }
        );
        assert!(matches!(
            n.p.modify_qp(qp, &st(QpState::Rtr)),
            Err(VerbsError::MissingAttribute { .. })
        ));
        n.p.modify_qp(qp, &st(QpState::Err)).unwrap();
        assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Err));
        assert!(matches!(
            n.p.modify_qp(qp, &st(QpState::Rts)),
            Err(VerbsError::InvalidTransition { .. })
        ));
        n.p.modify_qp(qp, &st(QpState::Reset)).unwrap();
        // Full RC path incl. SQD and back.
        let (a, qa, _b, _qb) = rc_pair(f);
        a.p.modify_qp(
            qa,
            &QpAttr {
                state: Some(QpState::Sqd),
                en_sqd_async_notify: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(a.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::SqDrained,
                ctx: 10,
                ..
            })
        )));
        a.p.modify_qp(
            qa,
            &QpAttr {
                state: Some(QpState::Sqd),
                timeout: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
        a.p.modify_qp(qa, &st(QpState::Rts)).unwrap();
        assert_eq!(a.p.query_qp(qa).unwrap().timeout, Some(10));
        Outcome::Passed
    }

    /// SEND (multi-SGE gather and scatter), SEND with immediate, comm established.
    pub fn rc_send(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        a.buf.write_at(0, b"hello, ");
        a.buf.write_at(100, b"world");
        b.p.post_recv(qb, &[recv(7, vec![b.sge(1000, 4), b.sge(2000, 100)])])
            .unwrap();
        let mut w = send(1, SendOpcode::SendWithImm, vec![a.sge(0, 7), a.sge(100, 5)]);
        w.imm = 0xabcd;
        a.p.post_send(qa, &[w]).unwrap();
        let wc = a.wc();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.qp_ctx),
            (1, WcStatus::Success, WcOpcode::Send, 10)
        );
        let r = b.wc();
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len, r.imm, r.qp_ctx),
            (7, WcStatus::Success, WcOpcode::Recv, 12, 0xabcd, 20)
        );
        assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
        assert_eq!(b.buf.to_vec(1000, 4), b"hell");
        assert_eq!(b.buf.to_vec(2000, 8), b"o, world");
        assert!(
            !b.rec.events().iter().any(|e| matches!(
                e,
                Ev::Async(AsyncEvent {
                    kind: AsyncEventKind::CommEstablished,
                    ..
                })
            )),
            "RTS peer: no event"
        );
        // Unsignaled SEND: no requester completion, receive still completes.
        b.p.post_recv(qb, &[recv(8, vec![b.sge(0, 64)])]).unwrap();
        let mut w = send(2, SendOpcode::Send, vec![a.sge(0, 5)]);
        w.flags = SendFlags::default();
        a.p.post_send(qa, &[w]).unwrap();
        assert_eq!(b.wc().wr_id, 8);
        a.no_wc();
        // A first message reaching a QP still in RTR raises CommEstablished.
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 33));
        connect_opts(&a, qa, &b, qb, QpType::Rc, 0, false);
        b.p.post_recv(qb, &[recv(1, vec![])]).unwrap();
        a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![])])
            .unwrap();
        assert_eq!(b.wc().status, WcStatus::Success);
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::CommEstablished,
                ctx: 33,
                ..
            })
        )));
        Outcome::Passed
    }

    /// RDMA WRITE and WRITE with immediate.
    pub fn rc_write(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        a.buf.write_at(0, &[0x5a; 4096]);
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 4096)],
                b.buf.addr() + 8192,
                b.mr.rkey,
            )],
        )
        .unwrap();
        let wc = a.wc();
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert_eq!(b.buf.to_vec(8192, 4096), vec![0x5a; 4096]);
        assert_eq!(b.buf.to_vec(8191, 1), [0]);
        assert_eq!(b.buf.to_vec(8192 + 4096, 1), [0]);
        b.no_wc();
        b.p.post_recv(qb, &[recv(9, vec![])]).unwrap();
        let mut w = rdma(
            2,
            SendOpcode::RdmaWriteWithImm,
            vec![a.sge(0, 16)],
            b.buf.addr(),
            b.mr.rkey,
        );
        w.imm = 42;
        a.p.post_send(qa, &[w]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert_eq!(
            (r.wr_id, r.opcode, r.imm, r.byte_len),
            (9, WcOpcode::RecvRdmaWithImm, 42, 16)
        );
        assert_eq!(b.buf.to_vec(0, 16), vec![0x5a; 16]);
        Outcome::Passed
    }

    /// RDMA READ.
    pub fn rc_read(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _qb) = rc_pair(f);
        b.buf.write_at(300, b"remote bytes");
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaRead,
                vec![a.sge(50, 6), a.sge(500, 6)],
                b.buf.addr() + 300,
                b.mr.rkey,
            )],
        )
        .unwrap();
        let wc = a.wc();
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::RdmaRead, 12)
        );
        assert_eq!(a.buf.to_vec(50, 6), b"remote");
        assert_eq!(a.buf.to_vec(500, 6), b" bytes");
        Outcome::Passed
    }

    /// Compare-and-swap and fetch-and-add; misaligned target refused.
    pub fn rc_atomics(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Atomics) {
            let mut w = rdma(
                1,
                SendOpcode::AtomicFetchAdd,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                b.mr.rkey,
            );
            w.compare_add = 1;
            unsupported(a.p.post_send(qa, &[w]));
            return Outcome::Skipped(Feature::Atomics);
        }
        b.buf.write_at(64, &5u64.to_ne_bytes());
        let at = |id, op, cmp, swap| {
            let mut w = rdma(id, op, vec![a.sge(0, 8)], b.buf.addr() + 64, b.mr.rkey);
            w.compare_add = cmp;
            w.swap = swap;
            w
        };
        a.p.post_send(qa, &[at(1, SendOpcode::AtomicCmpSwp, 5, 9)])
            .unwrap();
        assert_eq!(
            (a.wc().opcode, a.buf.to_vec(0, 8)),
            (WcOpcode::CompSwap, 5u64.to_ne_bytes().to_vec())
        );
        assert_eq!(b.buf.to_vec(64, 8), 9u64.to_ne_bytes());
        a.p.post_send(qa, &[at(2, SendOpcode::AtomicCmpSwp, 5, 1)])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(
            b.buf.to_vec(64, 8),
            9u64.to_ne_bytes(),
            "compare failed: no swap"
        );
        a.p.post_send(qa, &[at(3, SendOpcode::AtomicFetchAdd, 100, 0)])
            .unwrap();
        assert_eq!(
            (a.wc().opcode, a.buf.to_vec(0, 8)),
            (WcOpcode::FetchAdd, 9u64.to_ne_bytes().to_vec())
        );
        assert_eq!(b.buf.to_vec(64, 8), 109u64.to_ne_bytes());
        let mut w = at(4, SendOpcode::AtomicFetchAdd, 1, 0);
        w.remote.addr += 4;
        a.p.post_send(qa, &[w]).unwrap();
        assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
        assert_eq!(b.buf.to_vec(64, 8), 109u64.to_ne_bytes());
        Outcome::Passed
    }

    /// Bad R_Key, out of range, missing right: RemAccessErr, memory
    /// untouched, QP to ERR, later WRs and receives flushed. The responder
    /// goes to ERR too, with an affiliated QpFatal (no receive WQE reports
    /// its LocAccessErr; IBA 9.9.3.1).
    pub fn remote_access_errors_and_flush(f: &dyn Fixture) -> Outcome {
        for case in 0..4 {
            let (a, qa, b, qb) = rc_pair(f);
            a.buf.write_at(0, &[0xee; 64]);
            let (addr, rkey, op) = match case {
                0 => (
                    b.buf.addr(),
                    Rkey(b.mr.rkey.0 ^ 0x80),
                    SendOpcode::RdmaWrite,
                ),
                1 => (b.buf.addr() + 65536 - 32, b.mr.rkey, SendOpcode::RdmaWrite),
                2 => (b.buf.addr() - 64, b.mr.rkey, SendOpcode::RdmaRead),
                _ => {
                    let m2 =
                        b.p.reg_mr(
                            b.pd,
                            &b.buf,
                            b.buf.addr(),
                            4096,
                            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                            0,
                        )
                        .unwrap();
                    (b.buf.addr(), m2.rkey, SendOpcode::RdmaWrite)
                }
            };
            a.p.post_recv(qa, &[recv(50, vec![a.sge(1024, 8)])])
                .unwrap();
            a.p.post_send(qa, &[rdma(1, op, vec![a.sge(0, 64)], addr, rkey)])
                .unwrap();
            let wc = a.wc();
            assert_eq!(
                (wc.wr_id, wc.status),
                (1, WcStatus::RemAccessErr),
                "case {case}"
            );
            assert_eq!(
                b.buf.to_vec(0, 65536),
                vec![0; 65536],
                "case {case}: remote memory touched"
            );
            assert_eq!(a.buf.to_vec(64, 8), vec![0; 8]);
            assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
            let fatal = Ev::Async(AsyncEvent {
                kind: AsyncEventKind::QpFatal,
                ctx: 20,
                port: None,
            });
            // The event comes on its own, with no completion to carry it.
            assert!(b.rec.wait_for(|e| *e == fatal), "case {case}: no QpFatal");
            // A receive posted now flushes.
            b.p.post_recv(qb, &[recv(60, vec![b.sge(0, 8)])]).unwrap();
            let r = b.wc();
            assert_eq!((r.wr_id, r.status), (60, WcStatus::WrFlushErr));
            assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
            let r = a.wc();
            assert_eq!((r.wr_id, r.status), (50, WcStatus::WrFlushErr));
            a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![])])
                .unwrap();
            let w = a.wc();
            assert_eq!((w.wr_id, w.status), (2, WcStatus::WrFlushErr));
        }
        Outcome::Passed
    }

    /// Bad L_Key: LocProtErr.
    pub fn local_protection_error(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 64)])]).unwrap();
        let mut s = a.sge(0, 8);
        s.lkey = rdma_types::Lkey(s.lkey.0 ^ 0x40);
        a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![s])])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::LocProtErr);
        b.no_wc();
        // RDMA READ into a buffer registered without LOCAL_WRITE.
        let (a, qa, b, _) = rc_pair(f);
        let ro =
            a.p.reg_mr(a.pd, &a.buf, a.buf.addr(), 4096, AccessFlags::NONE, 0)
                .unwrap();
        let s = Sge {
            addr: a.buf.addr(),
            length: 8,
            lkey: ro.lkey,
        };
        a.p.post_send(
            qa,
            &[rdma(
                2,
                SendOpcode::RdmaRead,
                vec![s],
                b.buf.addr(),
                b.mr.rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::LocProtErr);
        Outcome::Passed
    }

    /// Receive buffer too small: LocLenErr at the responder, RemInvReqErr at the requester.
    pub fn receive_too_small(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 4)])]).unwrap();
        a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!(b.wc().status, WcStatus::LocLenErr);
        assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
        Outcome::Passed
    }

    /// RNR: rnr_retry 0 fails at once; 7 waits for a receive.
    pub fn rnr(f: &dyn Fixture) -> Outcome {
        let (a, qa, _b, _qb) = rc_pair(f);
        a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::RnrRetryExcErr);
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
        connect(&a, qa, &b, qb, QpType::Rc, 7);
        a.buf.write_at(0, b"late");
        a.p.post_send(
            qa,
            &[
                send(1, SendOpcode::Send, vec![a.sge(0, 4)]),
                send(2, SendOpcode::Send, vec![a.sge(0, 4)]),
            ],
        )
        .unwrap();
        a.no_wc();
        b.p.post_recv(qb, &[recv(5, vec![b.sge(0, 16)])]).unwrap();
        assert_eq!((b.wc().wr_id, b.buf.to_vec(0, 4)), (5, b"late".to_vec()));
        let w = a.wc();
        assert_eq!((w.wr_id, w.status), (1, WcStatus::Success));
        a.no_wc(); // WR 2 still waits, in order
        b.p.post_recv(qb, &[recv(6, vec![b.sge(0, 16)])]).unwrap();
        assert_eq!(a.wc().wr_id, 2);
        Outcome::Passed
    }

    /// Batches: the first bad WR's index is reported; earlier ones ran.
    pub fn batch_post_reports_index(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _) = rc_pair(f);
        let too_many = vec![a.sge(0, 1); 64];
        let e =
            a.p.post_send(
                qa,
                &[
                    rdma(
                        1,
                        SendOpcode::RdmaWrite,
                        vec![a.sge(0, 1)],
                        b.buf.addr(),
                        b.mr.rkey,
                    ),
                    send(2, SendOpcode::Send, too_many),
                ],
            )
            .unwrap_err();
        assert!(matches!(e, VerbsError::BadWr { index: 1, .. }), "{e:?}");
        assert_eq!(a.wc().wr_id, 1);
        a.no_wc();
        Outcome::Passed
    }

    /// CQ: arm/notify, solicited-only, blocking wait timeout, overflow event.
    pub fn cq_notify_wait_overflow(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        assert_eq!(
            a.p.wait_cq(a.cq, Duration::from_millis(5)),
            Err(VerbsError::Timeout)
        );
        b.p.req_notify_cq(b.cq, true).unwrap();
        b.p.post_recv(qb, &[recv(1, vec![]), recv(2, vec![])])
            .unwrap();
        a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![])])
            .unwrap();
        b.wc();
        assert!(
            !b.rec.events().contains(&Ev::Completion(100)),
            "solicited-only arm fired on unsolicited"
        );
        let mut w = send(2, SendOpcode::Send, vec![]);
        w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
        a.p.post_send(qa, &[w]).unwrap();
        assert!(b.rec.wait_for(|e| *e == Ev::Completion(100)));
        // Overflow.
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 2), Node::open(f, g2, 64));
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
        connect(&a, qa, &b, qb, QpType::Rc, 0);
        for i in 0..3 {
            a.p.post_send(
                qa,
                &[rdma(
                    i,
                    SendOpcode::RdmaWrite,
                    vec![a.sge(0, 8)],
                    b.buf.addr(),
                    b.mr.rkey,
                )],
            )
            .unwrap();
        }
        assert!(a.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::CqError,
                ctx: 100,
                ..
            })
        )));
        Outcome::Passed
    }

    /// Re-registration changes keys; deregistration with a bound window is refused.
    pub fn mr_rereg_dereg(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _) = rc_pair(f);
        let m =
            b.p.reg_mr(b.pd, &b.buf, b.buf.addr(), 4096, all_access(), 9)
                .unwrap();
        assert!(matches!(
            b.p.reg_mr(b.pd, &b.buf, b.buf.addr(), 10, AccessFlags::REMOTE_WRITE, 0),
            Err(VerbsError::InvalidArgument(_))
        ));
        assert!(matches!(
            b.p.reg_mr(b.pd, &b.buf, b.buf.addr() + 1, 65536, AccessFlags::NONE, 0),
            Err(VerbsError::InvalidArgument(_))
        ));
        let m2 =
            b.p.rereg_mr(m.handle, &b.buf, b.buf.addr() + 4096, 4096, all_access())
                .unwrap();
        assert_ne!(m.rkey, m2.rkey);
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr() + 4096,
                m2.rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        a.p.post_send(
            qa,
            &[rdma(
                2,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                m.rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::RemAccessErr, "old key must die");
        if f.lacks().contains(&Feature::Mw) {
            unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
            return Outcome::Skipped(Feature::Mw);
        }
        let (c, qc, d, _qd) = rc_pair(f);
        let (mw, _) = c.p.alloc_mw(c.pd, MwType::Type1, 4).unwrap();
        c.p.bind_mw(
            qc,
            &MwBind {
                mw,
                rkey: Rkey(0),
                mr: c.mr.handle,
                addr: c.buf.addr(),
                len: 64,
                access: AccessFlags::REMOTE_READ,
            },
        )
        .unwrap();
        assert!(matches!(
            c.p.dereg_mr(c.mr.handle),
            Err(VerbsError::Busy(_))
        ));
        c.p.dealloc_mw(mw).unwrap();
        c.p.dereg_mr(c.mr.handle).unwrap();
        assert!(c.rec.wait_for(|e| *e == Ev::Destroyed(ResourceKind::Mr, 3)));
        let _ = d;
        Outcome::Passed
    }

    /// Type 1 window bind; access through it; bounds and rights of the window.
    pub fn mw_type1(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Mw) {
            unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
            return Outcome::Skipped(Feature::Mw);
        }
        let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
        let rkey =
            b.p.bind_mw(
                qb,
                &MwBind {
                    mw,
                    rkey: Rkey(0),
                    mr: b.mr.handle,
                    addr: b.buf.addr() + 4096,
                    len: 128,
                    access: AccessFlags::REMOTE_WRITE,
                },
            )
            .unwrap();
        a.buf.write_at(0, &[7; 128]);
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 128)],
                b.buf.addr() + 4096,
                rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(b.buf.to_vec(4096, 128), vec![7; 128]);
        a.p.post_send(
            qa,
            &[rdma(
                2,
                SendOpcode::RdmaRead,
                vec![a.sge(0, 8)],
                b.buf.addr() + 4096,
                rkey,
            )],
        )
        .unwrap();
        assert_eq!(
            a.wc().status,
            WcStatus::RemAccessErr,
            "window has no read right"
        );
        let (a, qa, b, qb) = rc_pair(f);
        let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
        let rkey =
            b.p.bind_mw(
                qb,
                &MwBind {
                    mw,
                    rkey: Rkey(0),
                    mr: b.mr.handle,
                    addr: b.buf.addr(),
                    len: 128,
                    access: AccessFlags::REMOTE_WRITE,
                },
            )
            .unwrap();
        a.p.post_send(
            qa,
            &[rdma(
                3,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr() + 124,
                rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::RemAccessErr, "beyond the window");
        assert_eq!(b.buf.to_vec(0, 256), vec![0; 256]);
        Outcome::Passed
    }

    /// Type 2 window: bind WR, SEND with invalidate, local invalidate.
    pub fn mw_type2_and_invalidate(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Mw) {
            unsupported(b.p.alloc_mw(b.pd, MwType::Type2, 0));
            return Outcome::Skipped(Feature::Mw);
        }
        let (mw, k0) = b.p.alloc_mw(b.pd, MwType::Type2, 4).unwrap();
        let rkey = with_tag(k0, 0x33);
        let mut bw = send(1, SendOpcode::BindMw, vec![]);
        bw.bind_mw = Some(MwBind {
            mw,
            rkey,
            mr: b.mr.handle,
            addr: b.buf.addr(),
            len: 256,
            access: AccessFlags::REMOTE_WRITE,
        });
        b.p.post_send(qb, &[bw.clone()]).unwrap();
        let wc = b.wc();
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::BindMw)
        );
        a.p.post_send(
            qa,
            &[rdma(
                2,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        b.p.post_recv(qb, &[recv(3, vec![b.sge(1024, 16)])])
            .unwrap();
        let mut inv = send(4, SendOpcode::SendWithInv, vec![]);
        inv.invalidate_rkey = rkey;
        a.p.post_send(qa, &[inv]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert!(r.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(r.invalidated_rkey, rkey);
        a.p.post_send(
            qa,
            &[rdma(
                5,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::RemAccessErr, "invalidated window");
        // Local invalidate on a fresh pair.
        let (_a, _qa, b, qb) = rc_pair(f);
        let (mw, k0) = b.p.alloc_mw(b.pd, MwType::Type2, 4).unwrap();
        let rkey = with_tag(k0, 0x44);
        let mut bw = send(1, SendOpcode::BindMw, vec![]);
        bw.bind_mw = Some(MwBind {
            mw,
            rkey,
            mr: b.mr.handle,
            addr: b.buf.addr(),
            len: 256,
            access: AccessFlags::REMOTE_READ,
        });
        b.p.post_send(qb, &[bw]).unwrap();
        assert_eq!(b.wc().status, WcStatus::Success);
        let mut li = send(2, SendOpcode::LocalInv, vec![]);
        li.invalidate_rkey = rkey;
        b.p.post_send(qb, &[li.clone()]).unwrap();
        let w = b.wc();
        assert_eq!(
            (w.opcode, w.status),
            (WcOpcode::LocalInv, WcStatus::Success)
        );
        li.wr_id = 3;
        b.p.post_send(qb, &[li]).unwrap();
        assert_eq!(
            b.wc().status,
            WcStatus::MwBindErr,
            "second invalidate fails"
        );
        Outcome::Passed
    }

    /// SEND with invalidate of a key that is not a bound type 2 window (an
    /// MR's, a type 1 window's) completes in error at both ends (rxe's
    /// class J: remote invalid request); a deallocated window's key is
    /// refused and writes nothing.
    pub fn mw_refusals(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Mw) {
            unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
            return Outcome::Skipped(Feature::Mw);
        }
        let bind1 = |b: &Node, qb: QpHandle| {
            let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
            let rkey =
                b.p.bind_mw(
                    qb,
                    &MwBind {
                        mw,
                        rkey: Rkey(0),
                        mr: b.mr.handle,
                        addr: b.buf.addr(),
                        len: 64,
                        access: AccessFlags::REMOTE_WRITE,
                    },
                )
                .unwrap();
            (mw, rkey)
        };
        for what in ["an MR's key", "a type 1 window"] {
            let (a, qa, b, qb) = rc_pair(f);
            let key = if what == "an MR's key" {
                b.mr.rkey
            } else {
                bind1(&b, qb).1
            };
            b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 16)])]).unwrap();
            let mut inv = send(2, SendOpcode::SendWithInv, vec![a.sge(0, 8)]);
            inv.invalidate_rkey = key;
            a.p.post_send(qa, &[inv]).unwrap();
            assert_eq!(a.wc().status, WcStatus::RemInvReqErr, "{what}");
            let r = b.wc();
            assert_eq!((r.wr_id, r.status), (1, WcStatus::RemInvReqErr), "{what}");
            assert!(!r.wc_flags.contains(WcFlags::WITH_INV), "{what}");
        }
        let (mw, rkey) = bind1(&b, qb);
        a.buf.write_at(0, &[5; 8]);
        let write = |id| {
            rdma(
                id,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                rkey,
            )
        };
        a.p.post_send(qa, &[write(3)]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(b.buf.to_vec(0, 8), vec![5; 8]);
        b.p.dealloc_mw(mw).unwrap();
        b.buf.write_at(0, &[0; 8]);
        a.p.post_send(qa, &[write(4)]).unwrap();
        assert_eq!(a.wc().status, WcStatus::RemAccessErr, "deallocated window");
        assert_eq!(b.buf.to_vec(0, 8), vec![0; 8]);
        Outcome::Passed
    }

    /// UD SEND with the 40-byte GRH in the receive buffer; Q_Key mismatch drops.
    pub fn ud_send_grh(f: &dyn Fixture) -> Outcome {
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        if f.lacks().contains(&Feature::Ud) {
            unsupported(a.p.create_ah(a.pd, &b.av()));
            return Outcome::Skipped(Feature::Ud);
        }
        let (qa, qb) = (a.qp(QpType::Ud, None, 1), b.qp(QpType::Ud, None, 2));
        ud_rts(&a, qa);
        ud_rts(&b, qb);
        let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 200)])]).unwrap();
        a.buf.write_at(0, &[9; 100]);
        let mut w = send(1, SendOpcode::Send, vec![a.sge(0, 100)]);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: b.p.qp_num(qb).unwrap(),
            remote_qkey: Qkey(0x1111),
        });
        a.p.post_send(qa, &[w.clone()]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert_eq!(
            (r.status, r.byte_len, r.src_qp),
            (WcStatus::Success, 140, a.p.qp_num(qa).unwrap())
        );
        assert!(r.wc_flags.contains(WcFlags::GRH));
        assert_eq!(b.buf.to_vec(40, 100), vec![9; 100]);
        let sgid = a.port.gids[0].0;
        if sgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
            // RoCEv2 over IPv4 (IBA A17.4.5.1): the 40-byte area holds the
            // IPv4 header in its last 20 bytes; the source address is at 12.
            assert_eq!(b.buf.to_vec(20, 1), vec![0x45], "IPv4 header");
            assert_eq!(b.buf.to_vec(32, 4), sgid[12..].to_vec(), "IPv4 source");
        } else {
            assert_eq!(b.buf.to_vec(8, 16), sgid, "GRH source GID");
        }
        // Wrong Q_Key: silently dropped.
        b.p.post_recv(qb, &[recv(2, vec![b.sge(0, 200)])]).unwrap();
        w.ud.as_mut().unwrap().remote_qkey = Qkey(0x2222);
        a.p.post_send(qa, &[w.clone()]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        b.no_wc();
        // RDMA on UD is refused at post.
        assert!(matches!(
            a.p.post_send(qa, &[rdma(3, SendOpcode::RdmaWrite, vec![], 0, Rkey(0))]),
            Err(VerbsError::BadWr { index: 0, .. })
        ));
        Outcome::Passed
    }

    /// QP1 per port: GSI Q_Key, one per port.
    pub fn special_qps(f: &dyn Fixture) -> Outcome {
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        if f.lacks().contains(&Feature::SpecialQp) {
            let init = QpInit {
                qp_type: QpType::Gsi,
                send_cq: a.cq,
                recv_cq: a.cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
                port: Some(PortNum(1)),
            };
            unsupported(a.p.create_qp(a.pd, &init, 0));
            return Outcome::Skipped(Feature::SpecialQp);
        }
        let (qa, qb) = (a.qp(QpType::Gsi, None, 1), b.qp(QpType::Gsi, None, 2));
        assert_eq!(a.p.qp_num(qa).unwrap().value(), 1);
        let init = QpInit {
            qp_type: QpType::Gsi,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: true,
            port: Some(PortNum(1)),
        };
        assert!(matches!(
            a.p.create_qp(a.pd, &init, 0),
            Err(VerbsError::Busy(_))
        ));
        // QP0 exists on IB ports; RoCE has no subnet management (IBA
        // A16.4.1), so a RoCE provider refuses it.
        let roce = a
            .port
            .gids
            .first()
            .is_some_and(|g| g.0[..2] != [0xfe, 0x80]);
        let smi_init = QpInit {
            qp_type: QpType::Smi,
            ..init
        };
        if roce {
            unsupported(a.p.create_qp(a.pd, &smi_init, 3));
        } else {
            let smi = a.qp(QpType::Smi, None, 3);
            assert_eq!(a.p.qp_num(smi).unwrap().value(), 0);
        }
        for (n, q) in [(&a, qa), (&b, qb)] {
            to_init(n, q, QpType::Gsi);
            n.p.modify_qp(
                q,
                &QpAttr {
                    state: Some(QpState::Rtr),
                    ..Default::default()
                },
            )
            .unwrap();
            n.p.modify_qp(
                q,
                &QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(Psn::new(0)),
                    ..Default::default()
                },
            )
            .unwrap();
        }
        let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 296)])]).unwrap();
        let mut w = send(1, SendOpcode::Send, vec![a.sge(0, 256)]);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: rdma_types::Qpn::GSI,
            remote_qkey: Qkey::GSI,
        });
        a.p.post_send(qa, &[w]).unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert_eq!((r.byte_len, r.src_qp.value()), (296, 1));
        Outcome::Passed
    }

    /// SRQ shared by two QPs; limit event fires once.
    pub fn srq_limit(f: &dyn Fixture) -> Outcome {
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        if f.lacks().contains(&Feature::Srq) {
            unsupported(b.p.create_srq(
                b.pd,
                &SrqAttr {
                    max_wr: 8,
                    max_sge: 1,
                    limit: 0,
                },
                0,
            ));
            return Outcome::Skipped(Feature::Srq);
        }
        let srq =
            b.p.create_srq(
                b.pd,
                &SrqAttr {
                    max_wr: 8,
                    max_sge: 1,
                    limit: 0,
                },
                55,
            )
            .unwrap();
        let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, Some(srq), 2));
        connect(&a, qa, &b, qb, QpType::Rc, 0);
        assert!(
            b.p.post_recv(qb, &[recv(0, vec![])]).is_err(),
            "QP with SRQ takes no own receives"
        );
        b.p.post_srq_recv(
            srq,
            &(0..4)
                .map(|i| recv(i, vec![b.sge(i * 64, 64)]))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert!(b.p.modify_srq(srq, 9).is_err());
        b.p.modify_srq(srq, 3).unwrap();
        assert_eq!(b.p.query_srq(srq).unwrap().limit, 3);
        let lim = |b: &Node| {
            b.rec
                .events()
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        Ev::Async(AsyncEvent {
                            kind: AsyncEventKind::SrqLimitReached,
                            ctx: 55,
                            ..
                        })
                    )
                })
                .count()
        };
        a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!((b.wc().wr_id, lim(&b)), (0, 0));
        a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!(b.wc().wr_id, 1);
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::SrqLimitReached,
                ..
            })
        )));
        a.p.post_send(qa, &[send(3, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        b.wc();
        assert_eq!(lim(&b), 1, "limit event is one-shot");
        assert!(matches!(b.p.destroy_srq(srq), Err(VerbsError::Busy(_))));
        Outcome::Passed
    }

    /// UC: WRITE works, READ refused at post, no RNR (message dropped).
    pub fn uc_basics(f: &dyn Fixture) -> Outcome {
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        if f.lacks().contains(&Feature::Uc) {
            let init = QpInit {
                qp_type: QpType::Uc,
                send_cq: a.cq,
                recv_cq: a.cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
                port: None,
            };
            unsupported(a.p.create_qp(a.pd, &init, 0));
            return Outcome::Skipped(Feature::Uc);
        }
        let (qa, qb) = (a.qp(QpType::Uc, None, 1), b.qp(QpType::Uc, None, 2));
        connect(&a, qa, &b, qb, QpType::Uc, 0);
        a.buf.write_at(0, b"uc!");
        // UC completes at the sender when the packet leaves: a SEND behind
        // the WRITE, seen by the receiver, proves the WRITE landed (one
        // path delivers in order).
        b.p.post_recv(qb, &[recv(9, vec![b.sge(100, 16)])]).unwrap();
        a.p.post_send(
            qa,
            &[
                rdma(
                    1,
                    SendOpcode::RdmaWrite,
                    vec![a.sge(0, 3)],
                    b.buf.addr(),
                    b.mr.rkey,
                ),
                send(4, SendOpcode::Send, vec![a.sge(0, 2)]),
            ],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 2));
        assert_eq!(b.buf.to_vec(0, 3), b"uc!");
        assert!(matches!(
            a.p.post_send(qa, &[rdma(2, SendOpcode::RdmaRead, vec![], 0, Rkey(0))]),
            Err(VerbsError::BadWr { .. })
        ));
        a.p.post_send(qa, &[send(3, SendOpcode::Send, vec![a.sge(0, 3)])])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        b.no_wc();
        Outcome::Passed
    }

    /// A WR the QP cannot execute: a bad opcode for the type is refused at
    /// post (both providers check it there); a UD SEND whose address handle
    /// was destroyed is either refused at post or completes with
    /// LocQpOpErr (IBA 11.4.1.1 allows both), and nothing arrives.
    pub fn local_qp_operation_error(f: &dyn Fixture) -> Outcome {
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        if f.lacks().contains(&Feature::Ud) {
            unsupported(a.p.create_ah(a.pd, &b.av()));
            return Outcome::Skipped(Feature::Ud);
        }
        let (qa, qb) = (a.qp(QpType::Ud, None, 1), b.qp(QpType::Ud, None, 2));
        ud_rts(&a, qa);
        ud_rts(&b, qb);
        let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
        let dest = UdDest {
            ah,
            remote_qpn: b.p.qp_num(qb).unwrap(),
            remote_qkey: Qkey(0x1111),
        };
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 200)])]).unwrap();
        let mut w = rdma(
            1,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            b.mr.rkey,
        );
        w.ud = Some(dest);
        assert!(matches!(
            a.p.post_send(qa, &[w]),
            Err(VerbsError::BadWr { index: 0, .. })
        ));
        a.p.destroy_ah(ah).unwrap();
        let mut w = send(2, SendOpcode::Send, vec![a.sge(0, 8)]);
        w.ud = Some(dest);
        match a.p.post_send(qa, &[w]) {
            // Soft RoCE checks handles before it numbers the WRs.
            Err(VerbsError::BadWr { index: 0, .. } | VerbsError::InvalidArgument(_)) => a.no_wc(),
            Ok(()) => {
                let wc = a.wc();
                assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocQpOpErr));
                let want = if f.lacks().contains(&Feature::Sqe) {
                    QpState::Err
                } else {
                    QpState::Sqe
                };
                assert_eq!(a.p.query_qp(qa).unwrap().state, Some(want));
            }
            Err(e) => panic!("stale address handle: {e:?}"),
        }
        b.no_wc();
        Outcome::Passed
    }

    /// A SEND into a receive whose SGE has a bad L_Key: LocProtErr at the
    /// responder, RemOpErr at the requester (IBA 9.7.5.2.4: Remote
    /// Operational Error NAK), both QPs in ERR, no byte written.
    pub fn remote_operational_error(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        let mut bad = b.sge(0, 64);
        bad.lkey = rdma_types::Lkey(bad.lkey.0 ^ 0x40);
        b.p.post_recv(qb, &[recv(1, vec![bad])]).unwrap();
        a.buf.write_at(0, &[7; 8]);
        a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        let r = b.wc();
        assert_eq!((r.wr_id, r.status), (1, WcStatus::LocProtErr));
        let w = a.wc();
        assert_eq!((w.wr_id, w.status), (2, WcStatus::RemOpErr));
        assert_eq!(b.buf.to_vec(0, 8), vec![0; 8]);
        assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
        assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
        Outcome::Passed
    }

    /// A UC send error moves the QP to SQE (IBA 10.3.1.6): the WRs behind
    /// it flush, receives still complete, and modify SQE->RTS resumes
    /// sending. A provider lacking SQE takes the QP to ERR instead.
    pub fn sqe_and_resume(f: &dyn Fixture) -> Outcome {
        if f.lacks().contains(&Feature::Uc) {
            return uc_basics(f);
        }
        let (g1, g2) = f.guids();
        let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
        let (qa, qb) = (a.qp(QpType::Uc, None, 1), b.qp(QpType::Uc, None, 2));
        connect(&a, qa, &b, qb, QpType::Uc, 0);
        let mut bad = a.sge(0, 8);
        bad.lkey = rdma_types::Lkey(bad.lkey.0 ^ 0x40);
        a.p.post_send(
            qa,
            &[
                send(1, SendOpcode::Send, vec![bad]),
                send(2, SendOpcode::Send, vec![a.sge(0, 8)]),
            ],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::LocProtErr);
        let w = a.wc();
        assert_eq!((w.wr_id, w.status), (2, WcStatus::WrFlushErr));
        let state = a.p.query_qp(qa).unwrap().state;
        if f.lacks().contains(&Feature::Sqe) {
            assert_eq!(state, Some(QpState::Err));
            return Outcome::Skipped(Feature::Sqe);
        }
        assert_eq!(state, Some(QpState::Sqe));
        a.p.post_recv(qa, &[recv(3, vec![a.sge(100, 16)])]).unwrap();
        b.buf.write_at(0, b"in sqe");
        b.p.post_send(qb, &[send(4, SendOpcode::Send, vec![b.sge(0, 6)])])
            .unwrap();
        assert_eq!(b.wc().status, WcStatus::Success);
        let r = a.wc();
        assert_eq!((r.wr_id, r.status, r.byte_len), (3, WcStatus::Success, 6));
        assert_eq!(a.buf.to_vec(100, 6), b"in sqe");
        a.p.post_send(qa, &[send(5, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::WrFlushErr, "SQE flushes new sends");
        a.p.modify_qp(
            qa,
            &QpAttr {
                state: Some(QpState::Rts),
                ..Default::default()
            },
        )
        .unwrap();
        b.p.post_recv(qb, &[recv(6, vec![b.sge(100, 16)])]).unwrap();
        a.buf.write_at(0, b"resumed!");
        a.p.post_send(qa, &[send(7, SendOpcode::Send, vec![a.sge(0, 8)])])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let r = b.wc();
        assert_eq!((r.wr_id, r.status, r.byte_len), (6, WcStatus::Success, 8));
        assert_eq!(b.buf.to_vec(100, 8), b"resumed!");
        Outcome::Passed
    }

    /// A new P_Key table raises PkeyChange on the port and shows in
    /// `query_port`.
    pub fn pkey_change(f: &dyn Fixture) -> Outcome {
        let (_, g2) = f.guids();
        let b = Node::open(f, g2, 16);
        let table = [Pkey::DEFAULT, Pkey(0x8010)];
        match f.set_pkeys(g2, &table) {
            Err(VerbsError::NotSupported(_)) if f.lacks().contains(&Feature::PortControl) => {
                return Outcome::Skipped(Feature::PortControl);
            }
            Err(VerbsError::NotSupported(why)) => {
                // The fixture cannot make the event: a declared gap or a
                // failure (`run` checks the declaration).
                println!("pkey_change: the fixture cannot set the table ({why})");
                return Outcome::Skipped(Feature::PkeyControl);
            }
            r => r.unwrap(),
        }
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::PkeyChange,
                ctx: 0,
                port: Some(PortNum(1)),
            })
        )));
        let pkeys = b.p.query_port(b.ca, PortNum(1)).unwrap().pkeys;
        assert_eq!(&pkeys[..table.len()], &table[..]);
        Outcome::Passed
    }

    /// RTS->RTS with an alternate path and/or a migration state.
    fn apm_modify(alt: Option<AltPath>, mig: Option<MigState>) -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            alt_path: alt,
            path_mig_state: mig,
            ..Default::default()
        }
    }

    fn path_migrated(ctx: u64) -> impl Fn(&Ev) -> bool {
        move |e| {
            matches!(e, Ev::Async(AsyncEvent {
                kind: AsyncEventKind::PathMigrated,
                ctx: c,
                port: None,
            }) if *c == ctx)
        }
    }

    fn refused(r: Result<()>) {
        assert!(
            matches!(r, Err(VerbsError::InvalidArgument(_))),
            "expected a refusal, got {r:?}"
        );
    }

    /// The lacking provider's answer to an alternate path.
    fn apm_unsupported(a: &Node, qa: QpHandle, b: &Node) -> Outcome {
        let alt = b.alt_path_to(PortNum(2));
        unsupported(a.p.modify_qp(qa, &apm_modify(Some(alt), Some(MigState::Rearm))));
        let q = a.p.query_qp(qa).unwrap();
        assert_eq!((q.state, q.alt_path), (Some(QpState::Rts), None));
        Outcome::Skipped(Feature::Apm)
    }

    /// Loads an alternate path through port 2 on both QPs and rearms them;
    /// the provider arms at once. Returns (a's, b's) alternate path.
    fn arm_pair(a: &Node, qa: QpHandle, b: &Node, qb: QpHandle) -> (AltPath, AltPath) {
        let alts = (b.alt_path_to(PortNum(2)), a.alt_path_to(PortNum(2)));
        for (n, q, alt) in [(a, qa, alts.0), (b, qb, alts.1)] {
            n.p.modify_qp(q, &apm_modify(Some(alt), Some(MigState::Rearm)))
                .unwrap();
            let got = n.p.query_qp(q).unwrap();
            assert_eq!(got.path_mig_state, Some(MigState::Armed));
            assert_eq!(got.alt_path, Some(alt));
        }
        alts
    }

    /// A signaled SEND of `msg` from `x` lands in a receive `id` of `y`;
    /// both complete successfully.
    fn send_ok(x: &Node, qx: QpHandle, y: &Node, qy: QpHandle, id: u64, msg: &[u8]) {
        y.p.post_recv(qy, &[recv(id, vec![y.sge(1000, 64)])])
            .unwrap();
        x.buf.write_at(0, msg);
        x.p.post_send(
            qx,
            &[send(id, SendOpcode::Send, vec![x.sge(0, msg.len() as u32)])],
        )
        .unwrap();
        let w = x.wc();
        assert_eq!((w.wr_id, w.status), (id, WcStatus::Success), "{msg:?}");
        let r = y.wc();
        assert_eq!(
            (r.wr_id, r.status, r.byte_len),
            (id, WcStatus::Success, msg.len() as u32)
        );
        assert_eq!(y.buf.to_vec(1000, msg.len()), msg);
    }

    /// Path migration forced by the consumer (IBA 17.2.8): invalid
    /// requests are refused; loading an alternate path and asking for
    /// Rearm arms it; RTS->RTS with Migrated switches the QP to the
    /// alternate path and raises PathMigrated with the QP's context; the
    /// peer migrates when the first packet reaches it on its alternate
    /// path (MigReq); traffic flows both ways after; a new alternate path
    /// can be loaded and armed again.
    pub fn apm_forced_migration(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Apm) {
            return apm_unsupported(&a, qa, &b);
        }
        let q = a.p.query_qp(qa).unwrap();
        assert_eq!(
            (q.path_mig_state, q.alt_path),
            (Some(MigState::Migrated), None)
        );
        // Nothing armed: no forced migration, no Rearm; Armed is the
        // provider's to set.
        refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated))));
        refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Rearm))));
        let alt = b.alt_path_to(PortNum(2));
        refused(a.p.modify_qp(qa, &apm_modify(Some(alt), Some(MigState::Armed))));
        // UD has no alternate path.
        if !f.lacks().contains(&Feature::Ud) {
            let u = a.qp(QpType::Ud, None, 30);
            ud_rts(&a, u);
            assert!(matches!(
                a.p.modify_qp(u, &apm_modify(Some(alt), None)),
                Err(VerbsError::UnexpectedAttribute {
                    attr: "alt_path",
                    ..
                })
            ));
        }
        let (alt_a, _) = arm_pair(&a, qa, &b, qb);
        // An armed alternate path cannot be replaced.
        refused(a.p.modify_qp(qa, &apm_modify(Some(alt_a), Some(MigState::Rearm))));
        send_ok(&a, qa, &b, qb, 1, b"on the primary path");
        assert!(!a.rec.events().iter().any(path_migrated(10)));
        a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated)))
            .unwrap();
        assert!(a.rec.wait_for(path_migrated(10)));
        let q = a.p.query_qp(qa).unwrap();
        assert_eq!(q.path_mig_state, Some(MigState::Migrated));
        assert_eq!(q.alt_path, None);
        assert_eq!((q.av, q.port), (Some(alt_a.av), Some(PortNum(2))));
        assert!(!b.rec.events().iter().any(path_migrated(20)));
        send_ok(&a, qa, &b, qb, 2, b"on the alternate path");
        assert!(b.rec.wait_for(path_migrated(20)));
        let q = b.p.query_qp(qb).unwrap();
        assert_eq!(
            (q.path_mig_state, q.port),
            (Some(MigState::Migrated), Some(PortNum(2)))
        );
        send_ok(&b, qb, &a, qa, 3, b"and back");
        // Migrated again while Migrated: refused.
        refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated))));
        // The old primary path becomes the new alternate.
        let back = b.alt_path_to(PortNum(1));
        a.p.modify_qp(qa, &apm_modify(Some(back), Some(MigState::Rearm)))
            .unwrap();
        let q = a.p.query_qp(qa).unwrap();
        assert_eq!(
            (q.path_mig_state, q.alt_path),
            (Some(MigState::Armed), Some(back))
        );
        Outcome::Passed
    }

    /// Automatic path migration: with the alternate path armed on both
    /// QPs, port 1 of the first CA goes down; the SEND after it completes
    /// without an error (the QP moved to port 2), both owners get
    /// PathMigrated, and traffic flows both ways on the alternate path.
    pub fn apm_port_down(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, qb) = rc_pair(f);
        if f.lacks().contains(&Feature::Apm) {
            return apm_unsupported(&a, qa, &b);
        }
        let (g1, _) = f.guids();
        if f.lacks().contains(&Feature::PortControl) {
            unsupported(f.set_port_active(g1, false));
            return Outcome::Skipped(Feature::PortControl);
        }
        arm_pair(&a, qa, &b, qb);
        send_ok(&a, qa, &b, qb, 1, b"before");
        f.set_port_active(g1, false).unwrap();
        assert!(a.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::PortDown,
                port: Some(PortNum(1)),
                ..
            })
        )));
        send_ok(&a, qa, &b, qb, 2, b"after the port went down");
        assert!(a.rec.wait_for(path_migrated(10)));
        assert!(b.rec.wait_for(path_migrated(20)));
        for (n, q) in [(&a, qa), (&b, qb)] {
            let got = n.p.query_qp(q).unwrap();
            assert_eq!(
                (got.state, got.path_mig_state, got.port),
                (
                    Some(QpState::Rts),
                    Some(MigState::Migrated),
                    Some(PortNum(2))
                )
            );
        }
        send_ok(&b, qb, &a, qa, 3, b"back on port 2");
        f.set_port_active(g1, true).unwrap();
        Outcome::Passed
    }

    /// Port down/up, LID change, CA removal events; RC over a down port fails.
    pub fn port_and_ca_events(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _qb) = rc_pair(f);
        let (_, g2) = f.guids();
        if f.lacks().contains(&Feature::PortControl) {
            unsupported(f.set_port_active(g2, false));
            return Outcome::Skipped(Feature::PortControl);
        }
        f.set_port_active(g2, false).unwrap();
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::PortDown,
                port: Some(PortNum(1)),
                ..
            })
        )));
        assert_eq!(
            b.p.query_port(b.ca, PortNum(1)).unwrap().state,
            PortState::Down
        );
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                b.mr.rkey,
            )],
        )
        .unwrap();
        assert_eq!(a.wc().status, WcStatus::RetryExcErr);
        f.set_port_active(g2, true).unwrap();
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::PortActive,
                ..
            })
        )));
        f.set_lid(g2, Lid(0x77)).unwrap();
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::LidChange,
                ..
            })
        )));
        assert_eq!(b.p.query_port(b.ca, PortNum(1)).unwrap().lid, Lid(0x77));
        f.remove_ca(g2).unwrap();
        assert!(b.rec.wait_for(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::CaRemoval,
                ctx: 1,
                ..
            })
        )));
        assert!(b.p.open_ca(g2, 0, b.rec.clone()).is_err());
        Outcome::Passed
    }

    /// Destroying a QP from inside its CQ callback neither blocks nor
    /// deadlocks; `on_destroyed` comes after the callback.
    pub fn destroy_from_callback(f: &dyn Fixture) -> Outcome {
        let (a, qa, b, _) = rc_pair(f);
        let p = a.p.clone();
        *a.rec.hook.lock().unwrap() = Some(Box::new(move |_| {
            p.destroy_qp(qa).unwrap();
        }));
        a.p.req_notify_cq(a.cq, false).unwrap();
        a.p.post_send(
            qa,
            &[rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                b.mr.rkey,
            )],
        )
        .unwrap();
        assert!(a
            .rec
            .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Qp, 10)));
        let ev = a.rec.events();
        let c = ev.iter().position(|e| *e == Ev::Completion(100)).unwrap();
        let d = ev
            .iter()
            .position(|e| *e == Ev::Destroyed(ResourceKind::Qp, 10))
            .unwrap();
        assert!(c < d);
        assert_eq!(a.p.query_qp(qa), Err(VerbsError::InvalidHandle));
        Outcome::Passed
    }
}

/// Type 2 bind key: the window's key with a new low byte (IBA 10.6.7.2.1).
fn with_tag(k: Rkey, tag: u8) -> Rkey {
    Rkey((k.0 & !0xff) | tag as u32)
}

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
