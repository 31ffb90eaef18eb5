//! A target port's contracts that need no initiator: what its disconnect
//! hook may do, and what a failed start or login leaves behind. Logins are
//! handed to the port directly, as a CM would, over the in-process loopback
//! provider; the port runs on the test's clock (`PortDrive::Caller`).

use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, PortNum, Psn, Qpn};
use srp::target::{LoginForm, TargetConfig};
use srp::wire::{BufFormats, LoginReq, LoginReqFlags, PortId, Tag};
use srp_target::{CloseReason, ConnId, LoginOutcome, PeerQp, PortDrive, PortOptions, TargetPort};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::{
    CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrHandle, MrInfo, PdHandle, PortAttr,
    Provider, QpAttr, QpHandle, QpInit, RecvWr, SendWr, SrqAttr, SrqHandle, VerbsError,
    WorkCompletion,
};

const TARGET_GUID: u64 = 0x7a;

fn target_port_id() -> PortId {
    PortId(*b"\x00\x00\x00\x00\x00\x00\x00\x7a\x00\x02\xc9\x03\x00\x00\x00\x7a")
}

/// A small target: few buffers, so a port starts fast.
fn config() -> TargetConfig {
    let mut cfg = TargetConfig::new(target_port_id(), "t");
    cfg.srq_size = 16;
    cfg.sq_size = 4;
    cfg.max_rdma_size = 4096;
    cfg.max_table_len = 4096;
    cfg
}

/// Driven by the test, no keepalives, logins pending for `login_timeout`.
fn options(login_timeout: Duration) -> PortOptions {
    PortOptions {
        workers: 1,
        chunks: 2,
        login_timeout,
        keepalive: None,
        drive: PortDrive::Caller,
        ..PortOptions::default()
    }
}

fn fabric() -> Arc<rnic::loopback::Fabric> {
    let f = rnic::loopback::Fabric::new();
    f.add_ca(rnic::loopback::CaConfig::simple(TARGET_GUID, 1))
        .expect("a fresh fabric takes the CA");
    f
}

/// Initiator `n`'s SRP_LOGIN_REQ (IB CM form) and its QP.
fn login_from(n: u8) -> (Vec<u8>, PeerQp) {
    let mut initiator = [0u8; 16];
    initiator[15] = n;
    let req = LoginReq {
        tag: Tag(u64::from(n)),
        req_it_iu_len: 4148,
        req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
        flags: LoginReqFlags(0),
        imm_data_offset: 0,
        initiator_port_id: PortId(initiator),
        target_port_id: target_port_id(),
    };
    let mut b = vec![0u8; req.buffer_len()];
    req.emit(&mut b).expect("sized by buffer_len");
    let peer = PeerQp {
        qpn: Qpn::from_bits(0x100 + u32::from(n)),
        psn: Psn::new(0),
        gid: Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0x100 + u64::from(n))),
        lid: Lid(0),
        mtu: Mtu::Mtu1024,
        initiator_depth: 4,
        ack_timeout: 14,
        local_psn: None,
    };
    (b, peer)
}

fn accepted(outcome: LoginOutcome) -> ConnId {
    match outcome {
        LoginOutcome::Accepted { conn, .. } => conn,
        LoginOutcome::Rejected { reason, .. } => panic!("login rejected: {reason}"),
    }
}

/// Runs `f` on a thread of its own and waits for it at most 10 s: a
/// deadlock fails the test instead of hanging it.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not return within 10 s: deadlock"))
}

/// The disconnect hook runs with no lock of the port held, its own slot
/// included: it may drive the port so that the port closes another
/// channel (whose hook then runs nested), and it may set the hook. Before,
/// the hook ran holding its slot's lock, and both deadlocked.
#[test]
fn the_disconnect_hook_may_close_another_channel_and_set_the_hook() {
    let timeout = Duration::from_secs(1);
    let port = Arc::new(
        TargetPort::start(
            fabric(),
            Guid(TARGET_GUID),
            config(),
            Arc::new(scsi::Target::new()),
            options(timeout),
        )
        .expect("the port starts"),
    );
    // Two logins never established: A times out at t0 + 1 s, B at
    // t0 + 1.6 s.
    let t0 = Instant::now();
    port.poll_at(t0);
    let (data, peer) = login_from(1);
    let a = accepted(port.login(&data, LoginForm::IbCm, peer));
    port.poll_at(t0 + Duration::from_millis(600));
    let (data, peer) = login_from(2);
    let b = accepted(port.login(&data, LoginForm::IbCm, peer));

    let calls: Arc<Mutex<Vec<(ConnId, String)>>> = Arc::default();
    let weak = Arc::downgrade(&port);
    let log = calls.clone();
    port.on_disconnect(move |conn, why: &CloseReason| {
        log.lock().unwrap().push((conn, why.to_string()));
        let Some(port) = weak.upgrade() else { return };
        if conn == a {
            // From A's hook, time passes until B's login times out too: the
            // port closes B on this thread and runs the hook for it here.
            port.poll_at(t0 + Duration::from_millis(1700));
        } else {
            // From B's hook, the hook is replaced.
            let log = log.clone();
            port.on_disconnect(move |conn, _| log.lock().unwrap().push((conn, "later".into())));
        }
    });
    let p = port.clone();
    bounded("poll_at running the disconnect hooks", move || {
        p.poll_at(t0 + Duration::from_millis(1100))
    });
    let calls = calls.lock().unwrap().clone();
    let order: Vec<ConnId> = calls.iter().map(|c| c.0).collect();
    assert_eq!(
        order,
        [a, b],
        "A's hook, then B's from inside it: {calls:?}"
    );
    assert!(
        calls.iter().all(|c| c.1.contains("login_timeout")),
        "{calls:?}"
    );
    assert!(port.sessions().is_empty(), "{:?}", port.sessions());
    // The hook holds the port only weakly: nothing to let go of first.
    port.stop();
}

/// The shared receive queue holds buffers for the credits the channels
/// were promised, not for its whole size: an IU then lands in one of a
/// few hundred buffers the caches hold, not one of 4095 (34 MB). Each
/// login adds its window's, before its LOGIN_RSP goes, up to the SRQ's
/// size.
#[test]
fn receive_buffers_follow_the_credits_promised() {
    let mut cfg = config();
    cfg.srq_size = 1000;
    cfg.max_credits = 100;
    let port = TargetPort::start(
        fabric(),
        Guid(TARGET_GUID),
        cfg,
        Arc::new(scsi::Target::new()),
        options(Duration::from_secs(60)),
    )
    .expect("the port starts");
    let idle = port.receive_buffers_posted();
    assert!((1..100).contains(&idle), "with no channel: {idle}");
    let mut last = idle;
    for n in 1..=12u8 {
        let (data, peer) = login_from(n);
        accepted(port.login(&data, LoginForm::IbCm, peer));
        let posted = port.receive_buffers_posted();
        // Every channel's window (100) and reserve (3), at most the SRQ.
        let promised = usize::from(n) * 103;
        assert!(posted >= promised.min(1000), "{n} logins: {posted}");
        assert!(posted <= 1000, "{n} logins: {posted}");
        assert!(posted > last || posted == 1000, "{n} logins: {posted}");
        last = posted;
    }
    assert_eq!(last, 1000, "12 windows of 100 take the whole SRQ");
    port.stop();
}

/// One call of a verb: its name and how many calls of it came before, plus
/// one.
type Call = (&'static str, usize);

/// A provider passing every verb to the loopback but failing one chosen
/// call (`fail`, with OutOfResources), and listing the calls of the verbs that make or
/// set up something.
struct Faulty {
    inner: Arc<dyn Provider>,
    calls: Mutex<(HashMap<&'static str, usize>, Vec<Call>)>,
    fail: Mutex<Option<Call>>,
}

impl Faulty {
    fn new() -> Arc<Faulty> {
        Arc::new(Faulty {
            inner: fabric(),
            calls: Mutex::default(),
            fail: Mutex::default(),
        })
    }

    /// The calls so far, in order.
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().1.clone()
    }

    fn gate(&self, verb: &'static str) -> verbs::Result<()> {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.0.entry(verb).or_default();
        *n += 1;
        let call = (verb, *n);
        calls.1.push(call);
        if *self.fail.lock().unwrap() == Some(call) {
            return Err(VerbsError::OutOfResources("injected by the test"));
        }
        Ok(())
    }
}

impl Provider for Faulty {
    fn name(&self) -> &'static str {
        "faulty loopback"
    }
    fn handlers_nest(&self) -> bool {
        self.inner.handlers_nest()
    }
    fn list_cas(&self) -> Vec<Guid> {
        self.inner.list_cas()
    }
    fn open_ca(
        &self,
        guid: Guid,
        ctx: u64,
        handler: Arc<dyn EventHandler>,
    ) -> verbs::Result<CaHandle> {
        self.gate("open_ca")?;
        self.inner.open_ca(guid, ctx, handler)
    }
    fn query_ca(&self, ca: CaHandle) -> verbs::Result<verbs::CaAttr> {
        self.inner.query_ca(ca)
    }
    fn close_ca(&self, ca: CaHandle) -> verbs::Result<()> {
        self.inner.close_ca(ca)
    }
    fn query_port(&self, ca: CaHandle, port: PortNum) -> verbs::Result<PortAttr> {
        self.gate("query_port")?;
        self.inner.query_port(ca, port)
    }
    fn alloc_pd(&self, ca: CaHandle, ctx: u64) -> verbs::Result<PdHandle> {
        self.gate("alloc_pd")?;
        self.inner.alloc_pd(ca, ctx)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> verbs::Result<()> {
        self.inner.dealloc_pd(pd)
    }
    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: u64) -> verbs::Result<CqHandle> {
        self.gate("create_cq")?;
        self.inner.create_cq(pd, init, ctx)
    }
    fn destroy_cq(&self, cq: CqHandle) -> verbs::Result<()> {
        self.inner.destroy_cq(cq)
    }
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> verbs::Result<usize> {
        self.inner.poll_cq(cq, out)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> verbs::Result<()> {
        self.gate("req_notify_cq")?;
        self.inner.req_notify_cq(cq, solicited_only)
    }
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: u64) -> verbs::Result<SrqHandle> {
        self.gate("create_srq")?;
        self.inner.create_srq(pd, attr, ctx)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> verbs::Result<()> {
        self.inner.destroy_srq(srq)
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: u64) -> verbs::Result<QpHandle> {
        self.gate("create_qp")?;
        self.inner.create_qp(pd, init, ctx)
    }
    fn qp_num(&self, qp: QpHandle) -> verbs::Result<Qpn> {
        self.gate("qp_num")?;
        self.inner.qp_num(qp)
    }
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> verbs::Result<()> {
        self.gate("modify_qp")?;
        self.inner.modify_qp(qp, attr)
    }
    fn query_qp(&self, qp: QpHandle) -> verbs::Result<QpAttr> {
        self.inner.query_qp(qp)
    }
    fn destroy_qp(&self, qp: QpHandle) -> verbs::Result<()> {
        self.inner.destroy_qp(qp)
    }
    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: u64,
    ) -> verbs::Result<MrInfo> {
        self.gate("reg_mr")?;
        self.inner.reg_mr(pd, buf, addr, len, access, ctx)
    }
    fn dereg_mr(&self, mr: MrHandle) -> verbs::Result<()> {
        self.inner.dereg_mr(mr)
    }
    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> verbs::Result<()> {
        self.inner.post_send(qp, wrs)
    }
    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.inner.post_recv(qp, wrs)
    }
    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.gate("post_srq_recv")?;
        self.inner.post_srq_recv(srq, wrs)
    }
}

/// A port over a [`Faulty`] loopback through a client of the access
/// layer, which counts the verbs objects the port holds.
struct Counted {
    faulty: Arc<Faulty>,
    access: rdma_access::resource::AccessLayer,
    /// Kept open, as a daemon's is: closing it would release whatever the
    /// port left.
    _client: Arc<rdma_access::resource::TrackedProvider>,
    port: Result<TargetPort, srp_target::PortError>,
}

/// Starts a counted port whose provider fails `fail` when it comes.
fn start_counted(fail: Option<Call>) -> Counted {
    let faulty = Faulty::new();
    *faulty.fail.lock().unwrap() = fail;
    let access = rdma_access::resource::AccessLayer::new(faulty.clone());
    let client = access.client("srp target").into_provider();
    let port = TargetPort::start(
        client.clone(),
        Guid(TARGET_GUID),
        config(),
        Arc::new(scsi::Target::new()),
        options(Duration::from_secs(10)),
    );
    Counted {
        faulty,
        access,
        _client: client,
        port,
    }
}

/// The kinds of verbs object a port makes.
const VERBS_KINDS: [rdma_access::resource::Kind; 6] = {
    use rdma_access::resource::Kind;
    [Kind::Qp, Kind::Mr, Kind::Srq, Kind::Cq, Kind::Pd, Kind::Ca]
};

/// Every call a start makes, failed in turn: the start fails and leaves no
/// verbs object open.
#[test]
fn a_start_failing_at_any_verb_leaves_no_verbs_object() {
    let c = start_counted(None);
    let made = c.faulty.calls();
    assert!(made.contains(&("create_cq", 1)) && made.contains(&("reg_mr", 2)));
    drop(c.port.expect("the port starts"));
    assert_eq!(c.access.live_total(), 0, "after a stop");
    for call in made {
        let c = start_counted(Some(call));
        let err = c
            .port
            .err()
            .unwrap_or_else(|| panic!("{call:?} failed, the start did not"));
        assert!(err.to_string().contains("injected"), "{call:?}: {err}");
        let left = c.access.live_total();
        assert_eq!(left, 0, "left open when {call:?} failed ({err})");
    }
}

/// Every call a login makes, failed in turn: the login is refused and
/// leaves no verbs object of its channel open (or, where the port gets
/// by without the call, is accepted). Before, a failed `qp_num` left the
/// channel's QP, send CQ and send MR open.
#[test]
fn a_login_failing_at_any_verb_leaves_no_verbs_object() {
    // The calls of one login, after the start's.
    let c = start_counted(None);
    let port = c.port.expect("the port starts");
    let (started, idle) = (c.faulty.calls().len(), c.access.live_total());
    let (data, peer) = login_from(1);
    let conn = accepted(port.login(&data, LoginForm::IbCm, peer));
    let made = c.faulty.calls().split_off(started);
    assert!(made.iter().any(|c| c.0 == "qp_num"), "{made:?}");
    port.disconnected(conn);
    assert_eq!(c.access.live_total(), idle, "after a disconnect");
    drop(port);

    let mut refused = Vec::new();
    for call in made {
        let c = start_counted(Some(call));
        let (access, port) = (&c.access, c.port.expect("the port starts"));
        assert_eq!(access.live_total(), idle);
        match port.login(&data, LoginForm::IbCm, peer) {
            LoginOutcome::Rejected { reason, .. } => {
                assert!(
                    matches!(reason, srp_target::LoginRefusal::Channel(_)),
                    "{call:?}: {reason}"
                );
                assert!(
                    reason.to_string().contains("injected"),
                    "{call:?}: {reason}"
                );
                refused.push(call.0);
            }
            LoginOutcome::Accepted { conn, .. } => port.disconnected(conn),
        }
        assert_eq!(
            access.live_total(),
            idle,
            "left open when {call:?} failed: {:?}",
            VERBS_KINDS.map(|k| (k, access.live(k)))
        );
    }
    for verb in ["create_cq", "create_qp", "reg_mr", "modify_qp", "qp_num"] {
        assert!(refused.contains(&verb), "{verb} never refused: {refused:?}");
    }
}

/// The port's own refusals are typed, and read as srptd's log always had
/// them.
#[test]
fn the_ports_own_login_refusals_say_what_to_raise() {
    let port = TargetPort::start(
        fabric(),
        Guid(TARGET_GUID),
        config(),
        Arc::new(scsi::Target::new()),
        PortOptions {
            max_pending_per_initiator: 1,
            ..options(Duration::from_secs(10))
        },
    )
    .expect("the port starts");
    let refusal = |outcome| match outcome {
        LoginOutcome::Rejected { reason, .. } => reason,
        LoginOutcome::Accepted { .. } => panic!("accepted"),
    };
    let (data, mut peer) = login_from(1);
    accepted(port.login(&data, LoginForm::IbCm, peer));
    let r = refusal(port.login(&data, LoginForm::IbCm, peer));
    assert_eq!(
        r,
        srp_target::LoginRefusal::TooManyPending {
            pending: 1,
            limit: 1
        }
    );
    assert_eq!(
        r.to_string(),
        "the initiator has 1 logins not yet established, the most one initiator port may have (max_pending_per_initiator = 1 raises it)"
    );
    peer.initiator_depth = 0;
    let r = refusal(port.login(&data, LoginForm::IbCm, peer));
    assert_eq!(r, srp_target::LoginRefusal::NoRdmaRead);
    assert_eq!(
        r.to_string(),
        "the initiator's QP takes no RDMA READ (REQ responder resources 0): the target could not fetch data-out"
    );
}
