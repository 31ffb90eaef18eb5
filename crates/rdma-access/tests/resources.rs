//! The access layer's resource tree, on the loopback provider and on the
//! soft RoCE NIC (127.0.110.x): one of every object (verbs objects, and a
//! tracked CM agent's connection, listen, MAD agent and SA subscription)
//! and nothing left after the client goes, a client dropped while work is
//! in flight, a CA removed under a client, and plug-and-play events with
//! their context.

mod mad_common;

use mad_common::{loopback_cas, soft_pair};
use rdma_access::dm::DmService;
use rdma_access::gsi::status_reply;
use rdma_access::resource::{AccessLayer, Client, Kind, PnpEvent};
use rdma_access::sa::{SaClient, SaTiming};
use rdma_access::{CmAgent, CmConfig, CmError, MadWait};
use rdma_mad::mad::{MadStatus, Method};
use rdma_mad::sa::{InformInfo, SaAttr, SA_HDR_LEN};
use rdma_types::{AccessFlags, Guid, Lid, PortNum, Psn, QpType, Qpn};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use verbs::{
    AhAttr, AsyncEvent, AsyncEventKind, CqInit, EventHandler, MemBuf, MwType, Provider, QpCaps,
    QpInit, SrqAttr, VerbsError,
};

#[derive(Default)]
struct Seen {
    completions: AtomicU64,
    events: Mutex<Vec<AsyncEvent>>,
}

impl EventHandler for Seen {
    fn on_completion(&self, _cq: u64) {
        self.completions.fetch_add(1, Ordering::SeqCst);
    }
    fn on_async_event(&self, e: AsyncEvent) {
        self.events.lock().unwrap().push(e);
    }
}

fn loopback() -> (Arc<dyn Provider>, Guid, Guid) {
    (loopback_cas(&[0xa1, 0xa2]), Guid(0xa1), Guid(0xa2))
}

fn soft(net: u8) -> (Arc<rnic::softroce::SoftRoce>, Guid, Guid) {
    (soft_pair(110, net, 0xb1, 0xb2), Guid(0xb1), Guid(0xb2))
}

/// One of every object under one CA; returns the QP handle.
fn one_of_each(al: &AccessLayer, c: &rdma_access::resource::Client, guid: Guid) -> verbs::QpHandle {
    let (ca, cah) = c.open_ca(guid, 7, Arc::new(Seen::default())).unwrap();
    let (pd, _) = c.alloc_pd(ca, 1).unwrap();
    let (_, cq) = c.create_cq(pd, &CqInit { cqe: 16 }, 2).unwrap();
    let (_, srq) = c
        .create_srq(
            pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                limit: 0,
            },
            3,
        )
        .unwrap();
    let (_, qp) = c
        .create_qp(
            pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: Some(srq),
                caps: QpCaps {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline: 0,
                },
                sq_sig_all: true,
                port: None,
            },
            4,
        )
        .unwrap();
    let buf = MemBuf::new(4096);
    c.reg_mr(pd, &buf, buf.addr(), 4096, AccessFlags::LOCAL_WRITE, 5)
        .unwrap();
    match c.alloc_mw(pd, MwType::Type1, 6) {
        Ok(_) | Err(VerbsError::NotSupported(_)) => {}
        Err(e) => panic!("alloc_mw: {e}"),
    }
    let port = c.provider().query_port(cah, PortNum(1));
    let dgid = port
        .map(|p| p.gids.first().copied().unwrap_or(rdma_types::Gid::ZERO))
        .unwrap();
    c.create_ah(
        pd,
        &AhAttr {
            dlid: Lid(1),
            port: PortNum(1),
            grh: true,
            dgid,
            sgid_index: 0,
            sl: 0,
            hop_limit: 64,
        },
    )
    .unwrap();
    let closed = Arc::new(AtomicU64::new(0));
    let k = closed.clone();
    c.track(Some(pd), move || {
        k.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    for kind in [
        Kind::Ca,
        Kind::Pd,
        Kind::Cq,
        Kind::Srq,
        Kind::Qp,
        Kind::Mr,
        Kind::Ah,
        Kind::Tracked,
    ] {
        assert_eq!(c.live(kind), 1, "{kind:?}");
    }
    assert!(al.live_total() >= 8);
    qp
}

const SERVICE: u64 = 0x0000_0000_0106_1f90;

fn cm_config() -> CmConfig {
    CmConfig {
        response_timeout: rdma_types::TimeoutExp::from_bits(15),
        max_retries: rdma_types::CmRetries::from_bits(15),
        timewait: rdma_types::Duration::from_millis(200),
        // 8 ms there and back: the response time rules.
        packet_life_time: rdma_types::TimeoutExp::from_bits(10),
        ..CmConfig::default()
    }
}

fn first_comm_id(salt: u32) -> u32 {
    (std::process::id() << 8) ^ (salt << 24)
}

/// The far end of a tracked client's CM objects: an agent that accepts
/// every REQ for [`SERVICE`] and answers SA Sets as an SA (GetResp,
/// status 0), counting the InformInfo deletes and the DREQs it hears.
struct Far {
    agent: Arc<CmAgent>,
    stop: Arc<AtomicBool>,
    deletes: Arc<AtomicU64>,
    dreqs: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Far {
    fn start(agent: Arc<CmAgent>) -> Far {
        let stop = Arc::new(AtomicBool::new(false));
        let deletes = Arc::new(AtomicU64::new(0));
        let dreqs = Arc::new(AtomicU64::new(0));
        let d = dreqs.clone();
        agent.on_disconnect(move |_| {
            d.fetch_add(1, Ordering::SeqCst);
        });
        let incoming = agent.listen(SERVICE);
        let s = stop.clone();
        let acceptor = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Ok(inc) = incoming.recv_timeout(Duration::from_millis(20)) {
                    inc.accept(Qpn::from_bits(0x99), Psn::new(0), Vec::new());
                }
            }
        });
        let sa = agent.mad_agent(0x03, 2, &[u8::from(Method::Set)]).unwrap();
        let (s, del) = (stop.clone(), deletes.clone());
        let sa = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Some((peer, req)) = sa.recv(Duration::from_millis(20)) else {
                    continue;
                };
                let attr = SaAttr::from(u16::from_be_bytes([req[16], req[17]]));
                if attr == SaAttr::InformInfo
                    && InformInfo::parse(&req[SA_HDR_LEN..]).is_ok_and(|i| i.subscribe == 0)
                {
                    del.fetch_add(1, Ordering::SeqCst);
                }
                sa.send(peer, status_reply(&req, MadStatus::OK));
            }
        });
        Far {
            agent,
            stop,
            deletes,
            dreqs,
            threads: vec![acceptor, sa],
        }
    }
}

impl Drop for Far {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A CM agent of `c` on `guid` (started over `provider`), with one of
/// each upper-layer object: a connection to `far` (returned last), a MAD
/// agent, an SA client subscribed to trap 64 at `far`. The counters show
/// them.
fn cm_objects(
    c: &Client,
    provider: Arc<dyn Provider>,
    guid: Guid,
    far: &Far,
    salt: u32,
) -> (
    Arc<CmAgent>,
    rdma_access::MadAgent,
    SaClient,
    rdma_access::ConnId,
) {
    let agent = CmAgent::start_with(provider, guid, first_comm_id(salt), cm_config()).unwrap();
    agent.track_in(c).unwrap();
    assert!(agent.track_in(c).is_err(), "one tree per agent");
    let before = c.live(Kind::CmId);
    let est = agent
        .connect(
            far.agent.gid(),
            SERVICE,
            Qpn::from_bits(0x55),
            Psn::new(1),
            Vec::new(),
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(est.remote_qpn, Qpn::from_bits(0x99));
    assert_eq!(c.live(Kind::CmId), before + 1, "the connection is a CM id");
    let mad = agent.mad_agent(0x04, 1, &[]).unwrap();
    let sa = SaClient::new(
        &agent,
        far.agent.gid(),
        SaTiming {
            timeout: Duration::from_millis(300),
            retries: 10,
        },
    )
    .unwrap();
    sa.subscribe(64).unwrap();
    // The agent's own CM registration, the MAD agent, the SA client's.
    assert_eq!(c.live(Kind::MadAgent), 3);
    assert_eq!(c.live(Kind::SaSubscription), 1);
    // An object that ends by itself leaves the tree.
    sa.subscribe(65).unwrap();
    assert_eq!(c.live(Kind::SaSubscription), 2);
    sa.unsubscribe(65).unwrap();
    assert_eq!(c.live(Kind::SaSubscription), 1);
    let m2 = agent.mad_agent(0x05, 1, &[]).unwrap();
    assert_eq!(c.live(Kind::MadAgent), 4);
    drop(m2);
    assert_eq!(c.live(Kind::MadAgent), 3);
    (agent, mad, sa, est.conn)
}

/// Waits (at most 10 s) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn every_object_goes_with_its_client(p: Arc<dyn Provider>, guid: Guid, peer: Guid) {
    let al = AccessLayer::new(p.clone());
    let far =
        Far::start(CmAgent::start_with(p.clone(), peer, first_comm_id(1), cm_config()).unwrap());
    // The client's CM agent reaches the NIC through the client itself, so
    // its QP1 and buffers are in the tree too.
    let tp = al.client("test").into_provider();
    let c = tp.client();
    let qp = one_of_each(&al, c, guid);
    let (agent, mad, sa, _) = cm_objects(c, tp.clone(), guid, &far, 2);
    assert!(
        c.live(Kind::Qp) >= 2,
        "the consumer's QP and the agent's QP1"
    );
    assert!(p.query_qp(qp).is_ok());
    c.close();
    for kind in [
        Kind::CmId,
        Kind::SaSubscription,
        Kind::MadAgent,
        Kind::Qp,
        Kind::Ca,
    ] {
        assert_eq!(al.live(kind), 0, "{kind:?}");
    }
    assert_eq!(al.live_total(), 0, "nothing leaks");
    assert!(p.query_qp(qp).is_err(), "the provider's QP is gone too");
    // The connection was disconnected and the subscription deleted before
    // the agent's QP1 went: the far end heard both.
    eventually("no DREQ reached the far end", || {
        far.dreqs.load(Ordering::SeqCst) == 1
    });
    eventually("no InformInfo delete reached the SA", || {
        far.deletes.load(Ordering::SeqCst) == 2 // trap 65 by hand, 64 by the close
    });
    // What is left of the client's agent refuses work.
    let again = agent.connect(
        far.agent.gid(),
        SERVICE,
        Qpn::from_bits(0x56),
        Psn::new(1),
        Vec::new(),
        Duration::from_secs(1),
    );
    assert_eq!(again, Err(CmError::Stopped));
    assert!(agent.mad_agent(0x06, 1, &[]).is_err());
    drop((sa, mad, agent));
    assert_eq!(al.live_total(), 0);
    drop(tp);
    // A closed client refuses new objects, and the counters stay at zero.
    let c = al.client("second");
    c.close();
    assert!(c.open_ca(guid, 0, Arc::new(Seen::default())).is_err());
    assert_eq!(al.live_total(), 0);
}

#[test]
fn nothing_leaks_on_loopback() {
    let (p, a, b) = loopback();
    every_object_goes_with_its_client(p, a, b);
}

#[test]
fn nothing_leaks_on_soft_roce() {
    let (p, a, b) = soft(1);
    every_object_goes_with_its_client(p, a, b);
}

#[test]
fn destroying_a_pd_takes_its_children_in_order() {
    let (p, a, _) = loopback();
    let al = AccessLayer::new(p);
    let c = al.client("pd");
    let (ca, _) = c.open_ca(a, 0, Arc::new(Seen::default())).unwrap();
    let (pd, _) = c.alloc_pd(ca, 0).unwrap();
    let (_, cq) = c.create_cq(pd, &CqInit { cqe: 4 }, 0).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    c.track(Some(pd), move || o.lock().unwrap().push("tracked"))
        .unwrap();
    c.create_qp(pd, &QpInit::rc(cq, 1, 1), 0).unwrap();
    // The provider refuses to destroy a CQ a QP still uses: the order matters.
    c.destroy(pd);
    assert_eq!(c.live_total(), 1, "only the CA is left");
    assert_eq!(c.live(Kind::Ca), 1);
    assert_eq!(*order.lock().unwrap(), vec!["tracked"]);
    assert!(c.alloc_pd(pd, 0).is_err(), "a destroyed PD is not a CA");
}

/// Work in flight when the client goes: RDMA WRITEs posted to a peer QP,
/// completion callbacks running; the client is dropped at once.
#[test]
fn a_client_dropped_with_work_in_flight_leaves_nothing() {
    let (p, a, b) = soft(3);
    let al = AccessLayer::new(p.clone());
    let peer = al.client("peer");
    let c = al.client("busy");
    let seen = Arc::new(Seen::default());
    let mk = |cl: &rdma_access::resource::Client, guid: Guid, h: Arc<Seen>| {
        let (ca, cah) = cl.open_ca(guid, 0, h).unwrap();
        let port = cl.provider().query_port(cah, PortNum(1)).unwrap();
        let (pd, _) = cl.alloc_pd(ca, 0).unwrap();
        let (_, cq) = cl.create_cq(pd, &CqInit { cqe: 256 }, 9).unwrap();
        let (_, qp) = cl.create_qp(pd, &QpInit::rc(cq, 128, 8), 0).unwrap();
        let buf = MemBuf::new(1 << 20);
        let (_, mr) = cl
            .reg_mr(
                pd,
                &buf,
                buf.addr(),
                1 << 20,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                0,
            )
            .unwrap();
        let _ = cl.provider().req_notify_cq(cq, false);
        (qp, buf, mr, port)
    };
    let (qa, ba, ma, pa) = mk(&c, a, seen.clone());
    let (qb, bb, mb, pb) = mk(&peer, b, Arc::new(Seen::default()));
    // The CM objects: the peer's agent is tracked by the peer client (its
    // listen and its side of the connection are CM ids there).
    let far_agent = CmAgent::start_with(p.clone(), b, first_comm_id(3), cm_config()).unwrap();
    far_agent.track_in(&peer).unwrap();
    let far = Far::start(far_agent);
    assert_eq!(peer.live(Kind::CmId), 1, "the far end's listen");
    let p_dyn: Arc<dyn Provider> = p.clone();
    let (agent, mad, sa, _) = cm_objects(&c, p_dyn, a, &far, 4);
    assert_eq!(peer.live(Kind::CmId), 2, "its listen and its connection");
    for (qp, other, oq) in [(qa, &pb, qb), (qb, &pa, qa)] {
        let prov = c.provider();
        prov.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(rdma_types::QpState::Init),
                port: Some(PortNum(1)),
                pkey_index: Some(0),
                access: Some(AccessFlags::REMOTE_WRITE),
                ..Default::default()
            },
        )
        .unwrap();
        prov.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(rdma_types::QpState::Rtr),
                av: Some(AhAttr::roce(other.gids[0])),
                path_mtu: Some(rdma_types::Mtu::Mtu1024),
                dest_qpn: Some(prov.qp_num(oq).unwrap()),
                rq_psn: Some(rdma_types::Psn::new(0)),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )
        .unwrap();
        prov.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(rdma_types::QpState::Rts),
                sq_psn: Some(rdma_types::Psn::new(0)),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let wrs: Vec<verbs::SendWr> = (0..100u64)
        .map(|i| {
            let mut w = verbs::SendWr::new(
                i,
                verbs::SendOpcode::RdmaWrite,
                vec![verbs::Sge {
                    addr: ba.addr(),
                    length: 8192,
                    lkey: ma.lkey,
                }],
            );
            w.remote = verbs::RemoteAddr {
                addr: bb.addr() + (i % 64) * 8192,
                rkey: mb.rkey,
            };
            w
        })
        .collect();
    c.provider().post_send(qa, &wrs).unwrap();
    // Wait until completions are flowing, so callbacks run while we drop.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while seen.completions.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < end, "no completion callback");
        std::thread::yield_now();
    }
    // A request in flight from the MAD agent when the client goes.
    // Resent every 50 ms, it would wait some 55 s for its last answer.
    let asker = std::thread::spawn(move || {
        let mut q = [0u8; 256];
        q[..4].copy_from_slice(&[1, 0x04, 1, 0x01]);
        let nobody = rdma_types::Gid::from_ip("127.0.110.60".parse().unwrap());
        let r = mad.request(nobody, q, Duration::from_millis(50), 1000);
        (r, mad)
    });
    eventually("the request was never resent", || {
        agent.gsi_stats().retries > 0
    });
    drop(c);
    // The far agent's QP1 and buffers are in the peer's tree.
    assert_eq!(al.live(Kind::Qp), 2, "only the peer's QP and QP1");
    assert_eq!(al.live(Kind::Mr), 3, "the peer's MR and QP1's two");
    assert_eq!(al.live(Kind::SaSubscription), 0);
    assert_eq!(al.live(Kind::MadAgent), 2, "the far end's agent and SA");
    let t0 = std::time::Instant::now();
    let (r, mad) = asker.join().unwrap();
    assert!(r.is_err());
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the waiting request ended with its agent, not with its timeout"
    );
    // The far end heard the DREQ: its connection went through timewait
    // and left the peer's tree; the subscription was deleted.
    eventually("the far end's connection is still live", || {
        al.live(Kind::CmId) == 1
    });
    assert_eq!(far.dreqs.load(Ordering::SeqCst), 1);
    eventually("no InformInfo delete reached the SA", || {
        far.deletes.load(Ordering::SeqCst) == 2
    });
    drop((sa, mad, agent, far));
    drop(peer);
    assert_eq!(al.live_total(), 0);
}

#[test]
fn a_removed_ca_takes_its_tree_and_tells_the_client() {
    let (p, a, _) = soft(5);
    let al = AccessLayer::new(p.clone());
    let c = al.client("unplug");
    let seen = Arc::new(Seen::default());
    let (ca, _) = c.open_ca(a, 0, seen.clone()).unwrap();
    let (pd, _) = c.alloc_pd(ca, 0).unwrap();
    c.create_cq(pd, &CqInit { cqe: 4 }, 0).unwrap();
    assert_eq!(c.live_total(), 3);
    p.remove_ca(a).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while c.live_total() != 0 {
        assert!(
            std::time::Instant::now() < end,
            "the tree was not torn down"
        );
        std::thread::yield_now();
    }
    assert!(seen
        .events
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.kind == AsyncEventKind::CaRemoval));
    assert_eq!(al.live_total(), 0);
}

fn pnp_reports_present_cas_and_port_changes(
    p: Arc<dyn Provider>,
    guid: Guid,
    down: impl Fn(),
    up: impl Fn(),
    lid: impl Fn(),
) {
    let al = AccessLayer::new(p);
    let (tx, rx) = mpsc::channel();
    al.register_pnp(move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    let t = Duration::from_secs(10);
    let mut first: Vec<PnpEvent> = Vec::new();
    while let Ok(e) = rx.recv_timeout(Duration::from_millis(1)) {
        first.push(e);
    }
    assert!(first.contains(&PnpEvent::CaAdded(guid)), "{first:?}");
    assert!(
        first.contains(&PnpEvent::PortActive(guid, PortNum(1))),
        "{first:?}"
    );
    let wait_for = |want: PnpEvent| loop {
        match rx.recv_timeout(t) {
            Ok(e) if e == want => break,
            Ok(_) => {}
            Err(_) => panic!("no {want:?}"),
        }
    };
    down();
    wait_for(PnpEvent::PortDown(guid, PortNum(1)));
    up();
    wait_for(PnpEvent::PortActive(guid, PortNum(1)));
    lid();
    wait_for(PnpEvent::LidChange(guid, PortNum(1)));
}

#[test]
fn pnp_on_loopback() {
    let f = loopback_cas(&[0xc1]);
    let (d, u, l) = (f.clone(), f.clone(), f.clone());
    pnp_reports_present_cas_and_port_changes(
        f,
        Guid(0xc1),
        move || d.set_port_active(Guid(0xc1), PortNum(1), false).unwrap(),
        move || u.set_port_active(Guid(0xc1), PortNum(1), true).unwrap(),
        move || l.set_lid(Guid(0xc1), PortNum(1), Lid(9)).unwrap(),
    );
}

#[test]
fn pnp_on_soft_roce() {
    let (p, a, _) = soft(7);
    let (d, u, l) = (p.clone(), p.clone(), p.clone());
    pnp_reports_present_cas_and_port_changes(
        p,
        a,
        move || d.set_port_active(a, false).unwrap(),
        move || u.set_port_active(a, true).unwrap(),
        move || l.set_lid(a, Lid(9)).unwrap(),
    );
}

/// A client closing mid-handshake: its REQ still unanswered is abandoned
/// (the blocked `connect` returns `Stopped` at once, not at its
/// deadline), and a REQ its consumer has not yet answered is rejected
/// (the active side hears REJ 28), before anything of it is left.
#[test]
fn handshakes_in_flight_end_with_their_client() {
    let (p, a, b) = loopback();
    let al = AccessLayer::new(p.clone());
    let c = al.client("active");
    let agent = CmAgent::start_with(p.clone(), a, first_comm_id(5), cm_config()).unwrap();
    agent.track_in(&c).unwrap();
    let nobody = rdma_types::Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0xdead));
    let ag = agent.clone();
    let pending = std::thread::spawn(move || {
        ag.connect(
            nobody,
            SERVICE,
            Qpn::from_bits(0x57),
            Psn::new(1),
            Vec::new(),
            Duration::from_secs(60),
        )
    });
    eventually("the REQ is not a CM id", || c.live(Kind::CmId) == 1);
    let t0 = std::time::Instant::now();
    c.close();
    assert_eq!(pending.join().unwrap(), Err(CmError::Stopped));
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(al.live_total(), 0);
    drop(agent);

    let passive = al.client("passive");
    let pa = CmAgent::start_with(p.clone(), b, first_comm_id(6), cm_config()).unwrap();
    pa.track_in(&passive).unwrap();
    let incoming = pa.listen(SERVICE);
    let active = CmAgent::start_with(p.clone(), a, first_comm_id(7), cm_config()).unwrap();
    let to = pa.gid();
    let asking = std::thread::spawn(move || {
        let r = active.connect(
            to,
            SERVICE,
            Qpn::from_bits(0x58),
            Psn::new(1),
            Vec::new(),
            Duration::from_secs(30),
        );
        (r, active)
    });
    let inc = incoming.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(passive.live(Kind::CmId), 2, "the listen and the REQ");
    passive.close();
    let (r, active) = asking.join().unwrap();
    match r {
        Err(CmError::Rejected { code, .. }) => assert_eq!(code, 28),
        other => panic!("{other:?}"),
    }
    assert!(
        !inc.accept(Qpn::from_bits(0x59), Psn::new(0), Vec::new()),
        "a rejected REQ cannot be accepted later"
    );
    assert_eq!(al.live_total(), 0);
    drop((active, pa));
}

/// What a consumer of a CM agent heard of a CA removal.
#[derive(Default)]
struct Told {
    removed: Mutex<Vec<rdma_access::Removed>>,
    disconnects: AtomicU64,
}

/// A CA removed under a tracked CM agent with one of every upper-layer
/// object on it (a connection, a listen, a MAD agent, an SA
/// subscription) and work in flight (a REQ nobody answers, a MAD request
/// being resent): the CA's teardown ends them all before the agent's QPs,
/// the consumer hears of each CM id (a removal event, as rdma_cm's
/// RDMA_CM_EVENT_DEVICE_REMOVAL, and the disconnect hook for the
/// connections), the waiting callers return at once, and every counter
/// of the client reaches zero. `through_client`: the agent reaches the
/// NIC through the client (its CA open is the client's); otherwise it
/// was made over the provider itself, as an IB node's port, and the
/// tree adopts its CA, QP1, QP0 and buffers.
fn a_removed_ca_ends_its_cm_ids(
    p: Arc<dyn Provider>,
    remove: impl FnOnce(),
    guid: Guid,
    peer: Guid,
    nobody: rdma_types::Gid,
    through_client: bool,
    qp0: bool,
) {
    let al = AccessLayer::new(p.clone());
    let far =
        Far::start(CmAgent::start_with(p.clone(), peer, first_comm_id(8), cm_config()).unwrap());
    let tp = al.client("removed").into_provider();
    let c = tp.client();
    one_of_each(&al, c, guid);
    let over: Arc<dyn Provider> = if through_client {
        tp.clone()
    } else {
        p.clone()
    };
    let (agent, mad, sa, est) = cm_objects(c, over, guid, &far, 9);
    // A DM service: its thread sleeps until a request comes, so it must
    // hear the removal (before, it asked again and again, at once).
    let dm = DmService::start(&agent).unwrap();
    assert!(dm.is_serving());
    let told = Arc::new(Told::default());
    let (t, weak) = (told.clone(), Arc::downgrade(&agent));
    agent.on_device_removal(move |r| {
        // A hook may call the agent back: it runs without its lock.
        if let (rdma_access::Removed::Conn(conn), Some(a)) = (r, weak.upgrade()) {
            a.disconnect(conn);
            assert_eq!(a.state(conn), rdma_cm::ConnState::Closed);
        }
        t.removed.lock().unwrap().push(r);
    });
    let t = told.clone();
    agent.on_disconnect(move |_| {
        t.disconnects.fetch_add(1, Ordering::SeqCst);
    });
    let listen = agent.listen(0x4242);
    // The consumer's QP, the agent's QP1, and its QP0 where the CA has
    // one (loopback: yes; a soft RoCE port in the roce personality: no).
    assert_eq!(agent.has_smi(), qp0);
    assert_eq!(c.live(Kind::Qp), 2 + i64::from(qp0));
    assert_eq!(
        c.live(Kind::Mr),
        1 + 2 + i64::from(qp0),
        "QP1's two, QP0's one"
    );
    assert_eq!(c.live(Kind::Ca), 2, "the consumer's open and the agent's");
    // In flight: a REQ to nobody, a MAD request resent to nobody.
    let ag = agent.clone();
    let connecting = std::thread::spawn(move || {
        ag.connect(
            nobody,
            SERVICE,
            Qpn::from_bits(0x5a),
            Psn::new(1),
            Vec::new(),
            Duration::from_secs(60),
        )
    });
    let asking = std::thread::spawn(move || {
        let mut q = [0u8; 256];
        q[..4].copy_from_slice(&[1, 0x04, 1, 0x01]);
        let r = mad.request(nobody, q, Duration::from_millis(50), 1000);
        (r, mad)
    });
    eventually("the REQ in flight is not a CM id", || {
        c.live(Kind::CmId) == 3
    });
    eventually("the MAD request was never resent", || {
        agent.gsi_stats().retries > 0
    });
    assert_eq!(c.live(Kind::SaSubscription), 1);
    assert_eq!(c.live(Kind::MadAgent), 4);
    let t0 = std::time::Instant::now();
    remove();
    eventually("the removed CA's tree is still there", || {
        c.live_total() == 0
    });
    for kind in [
        Kind::CmId,
        Kind::SaSubscription,
        Kind::MadAgent,
        Kind::Qp,
        Kind::Mr,
        Kind::Cq,
        Kind::Pd,
        Kind::Ca,
    ] {
        assert_eq!(c.live(kind), 0, "{kind:?}");
    }
    assert_eq!(
        connecting.join().unwrap(),
        Err(CmError::DeviceRemoved),
        "the waiting connect is told"
    );
    let (r, mad) = asking.join().unwrap();
    assert!(r.is_err());
    assert!(
        matches!(mad.wait(Duration::from_secs(60)), MadWait::Closed),
        "a removed CA's MAD agent says so at once"
    );
    eventually("the DM service still serves a removed CA", || {
        !dm.is_serving()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the callers waited for their timeouts, not for the removal"
    );
    assert!(
        listen.recv_timeout(Duration::from_secs(5)).is_err(),
        "the listen channel is disconnected"
    );
    // Each CM id once: the connection, the REQ in flight, the listen.
    let removed = told.removed.lock().unwrap().clone();
    assert_eq!(removed.len(), 3, "{removed:?}");
    assert!(removed.contains(&rdma_access::Removed::Listen(0x4242)));
    assert!(removed.contains(&rdma_access::Removed::Conn(est)));
    assert!(
        removed
            .iter()
            .any(|r| matches!(r, rdma_access::Removed::Conn(c) if *c != est)),
        "the REQ in flight: {removed:?}"
    );
    assert_eq!(
        told.disconnects.load(Ordering::SeqCst),
        1,
        "the established connection (the waiting connect got its error)"
    );
    assert!(agent.is_removed());
    let again = agent.connect(
        far.agent.gid(),
        SERVICE,
        Qpn::from_bits(0x5b),
        Psn::new(1),
        Vec::new(),
        Duration::from_secs(1),
    );
    assert_eq!(again, Err(CmError::DeviceRemoved));
    assert!(agent.mad_agent(0x06, 1, &[]).is_err());
    assert!(sa.subscribe(65).is_err());
    drop((sa, mad, dm, agent));
    assert_eq!(c.live_total(), 0);
    drop(tp);
    drop(far);
    assert_eq!(al.live_total(), 0);
}

/// [`a_removed_ca_ends_its_cm_ids`] on soft RoCE CAs 0xd1 and 0xd2 at
/// 127.0.171.`net` and the next address, 0xd1 removed.
fn a_removed_soft_ca_ends_its_cm_ids(net: u8, through_client: bool) {
    let p = soft_pair(171, net, 0xd1, 0xd2);
    let (r, a) = (p.clone(), Guid(0xd1));
    let nobody = rdma_types::Gid::from_ip("127.0.171.99".parse().unwrap());
    a_removed_ca_ends_its_cm_ids(
        p,
        move || r.remove_ca(a).unwrap(),
        a,
        Guid(0xd2),
        nobody,
        through_client,
        false,
    );
}

#[test]
fn a_removed_ca_ends_the_cm_ids_of_an_agent_over_its_client() {
    a_removed_soft_ca_ends_its_cm_ids(1, true);
}

#[test]
fn a_removed_ca_ends_the_cm_ids_of_an_adopted_agent_on_soft_roce() {
    a_removed_soft_ca_ends_its_cm_ids(3, false);
}

/// On the loopback fabric the port has a QP0 too: the tree adopts both
/// special QPs.
#[test]
fn a_removed_ca_ends_the_cm_ids_and_special_qps_of_an_adopted_agent() {
    let f = loopback_cas(&[0xc1, 0xc2]);
    let r = f.clone();
    let nobody = rdma_types::Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0xdead));
    let remove = move || r.remove_ca(Guid(0xc1)).unwrap();
    a_removed_ca_ends_its_cm_ids(f, remove, Guid(0xc1), Guid(0xc2), nobody, false, true);
}

/// An agent in no client's tree hears of its CA's removal by itself: its
/// connection and listen end, the consumer is told, work is refused.
#[test]
fn an_untracked_agent_ends_its_cm_ids_when_its_ca_goes() {
    let f = loopback_cas(&[0xe1, 0xe2]);
    let far = Far::start(
        CmAgent::start_with(f.clone(), Guid(0xe2), first_comm_id(10), cm_config()).unwrap(),
    );
    let agent = CmAgent::start_with(f.clone(), Guid(0xe1), first_comm_id(11), cm_config()).unwrap();
    let told = Arc::new(Told::default());
    let t = told.clone();
    agent.on_device_removal(move |r| t.removed.lock().unwrap().push(r));
    let t = told.clone();
    agent.on_disconnect(move |_| {
        t.disconnects.fetch_add(1, Ordering::SeqCst);
    });
    let listen = agent.listen(0x4343);
    let est = agent
        .connect(
            far.agent.gid(),
            SERVICE,
            Qpn::from_bits(0x5c),
            Psn::new(1),
            Vec::new(),
            Duration::from_secs(10),
        )
        .unwrap();
    f.remove_ca(Guid(0xe1)).unwrap();
    eventually("the removal was not told", || {
        told.removed.lock().unwrap().len() == 2
    });
    let removed = told.removed.lock().unwrap().clone();
    assert!(removed.contains(&rdma_access::Removed::Conn(est.conn)));
    assert!(removed.contains(&rdma_access::Removed::Listen(0x4343)));
    assert_eq!(told.disconnects.load(Ordering::SeqCst), 1);
    assert_eq!(agent.state(est.conn), rdma_cm::ConnState::Closed);
    assert!(listen.recv_timeout(Duration::from_secs(1)).is_err());
    assert!(agent.is_removed());
    let again = agent.connect(
        far.agent.gid(),
        SERVICE,
        Qpn::from_bits(0x5d),
        Psn::new(1),
        Vec::new(),
        Duration::from_secs(1),
    );
    assert_eq!(again, Err(CmError::DeviceRemoved));
}
