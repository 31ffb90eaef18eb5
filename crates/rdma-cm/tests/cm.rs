//! Two (or three) CM endpoints on a virtual clock joined by seeded faulty
//! links: connect, reject, timeouts, path lists, disconnects, stale
//! connections and MAD loss.

use rdma_cm::{Cm, CmConfig, CmEvent, CmMsg, ConnId, ConnState, RejReason, ReqInfo};
use rdma_sim::{FaultConfig, FaultInjector, Payload};
use rdma_types::{CmRetries, Duration, Instant, Pkey, Psn, Qpn, TimeoutExp};
use std::collections::BTreeMap;

#[derive(Clone)]
struct Mad(u8, CmMsg);

impl Payload for Mad {
    fn bit_len(&self) -> u64 {
        1
    }
    fn flip_bit(&mut self, _: u64) {
        // A corrupted MAD fails its ICRC and is dropped: model that.
        self.0 = u8::MAX;
    }
}

/// Endpoints by address (1, 2, ...); links by (from, to).
struct Net {
    now: Instant,
    cms: BTreeMap<u8, Cm<u8>>,
    links: BTreeMap<(u8, u8), FaultInjector<Mad>>,
    faults: FaultConfig,
    events: BTreeMap<u8, Vec<CmEvent<u8>>>,
    sent: Vec<(u8, u8, CmMsg)>,
    down: Vec<u8>,
}

const SVC: u64 = 0x0106_0000_0000_1234;

fn cfg() -> CmConfig {
    CmConfig {
        response_timeout: e(12),
        max_retries: CmRetries::new(3).unwrap(),
        timewait: Duration::from_millis(50),
        // Paths of the tests are short: the 16.8 ms response time rules.
        packet_life_time: e(0),
        ..CmConfig::default()
    }
}

/// A time exponent the test knows is in range.
fn e(n: u8) -> TimeoutExp {
    TimeoutExp::new(n).unwrap()
}

impl Net {
    fn new(nodes: &[u8], faults: FaultConfig) -> Net {
        let cms = nodes
            .iter()
            .map(|&n| (n, Cm::new(cfg(), u32::from(n) * 1000)))
            .collect();
        Net {
            now: Instant::ZERO,
            cms,
            links: BTreeMap::new(),
            faults,
            events: BTreeMap::new(),
            sent: vec![],
            down: vec![],
        }
    }

    fn cm(&mut self, n: u8) -> &mut Cm<u8> {
        self.cms.get_mut(&n).unwrap()
    }

    /// Node 1 connects at time zero over `paths` to `service` (QPN 1, PSN
    /// 1, no private data).
    fn connect_plain(&mut self, paths: Vec<u8>, service: u64) -> ConnId {
        self.cm(1).connect(
            Instant::ZERO,
            paths,
            service,
            Qpn::from_bits(1),
            Psn::new(1),
            vec![],
        )
    }

    fn round(&mut self) -> bool {
        let mut busy = false;
        let now = self.now;
        let nodes: Vec<u8> = self.cms.keys().copied().collect();
        for n in &nodes {
            while let Some((to, msg)) = self.cms.get_mut(n).unwrap().poll_transmit() {
                busy = true;
                self.sent.push((*n, to, msg.clone()));
                let seed = self.faults.seed ^ (u64::from(*n) << 8 | u64::from(to));
                let link = self.links.entry((*n, to)).or_insert_with(|| {
                    FaultInjector::new(FaultConfig {
                        seed,
                        ..self.faults.clone()
                    })
                });
                link.push(now, Mad(*n, msg));
            }
        }
        let mut arrivals = Vec::new();
        for ((_, to), link) in self.links.iter_mut() {
            while let Some(m) = link.pop_ready(now) {
                arrivals.push((*to, m));
            }
        }
        for (to, Mad(from, msg)) in arrivals {
            busy = true;
            if from == u8::MAX || self.down.contains(&to) {
                continue;
            }
            if let Some(cm) = self.cms.get_mut(&to) {
                cm.handle_msg(now, from, msg);
            }
        }
        for n in &nodes {
            let cm = self.cms.get_mut(n).unwrap();
            if cm.poll_timeout().is_some_and(|t| t <= now) {
                busy = true;
                cm.handle_timeout(now);
            }
            while let Some(e) = cm.poll_event() {
                busy = true;
                self.events.entry(*n).or_default().push(e);
            }
        }
        busy
    }

    /// Runs until `done` holds or nothing is left (bounded).
    fn run(&mut self, mut done: impl FnMut(&mut Net) -> bool) {
        for _ in 0..1_000_000 {
            if done(self) {
                return;
            }
            if self.round() {
                continue;
            }
            let next = self
                .cms
                .values()
                .filter_map(|c| c.poll_timeout())
                .chain(self.links.values().filter_map(|l| l.next_release()))
                .min();
            match next {
                Some(t) if t <= Instant::from_millis(600_000) => self.now = self.now.max(t),
                _ => return,
            }
        }
        panic!("livelock");
    }

    fn settle(&mut self) {
        self.run(|_| false);
    }

    fn take(&mut self, n: u8) -> Vec<CmEvent<u8>> {
        std::mem::take(self.events.entry(n).or_default())
    }

    fn count(&self, from: u8, pred: impl Fn(&CmMsg) -> bool) -> usize {
        self.sent
            .iter()
            .filter(|(f, _, m)| *f == from && pred(m))
            .count()
    }
}

fn is_req(m: &CmMsg) -> bool {
    matches!(m, CmMsg::Req { .. })
}

/// Connects 1 -> 2 with the passive side accepting; returns both handles.
fn establish(net: &mut Net) -> (ConnId, ConnId) {
    net.cm(2).listen(SVC);
    let now = net.now;
    let a = net.cm(1).connect(
        now,
        vec![2],
        SVC,
        Qpn::from_bits(0x11),
        Psn::new(100),
        b"login".to_vec(),
    );
    let mut b = None;
    net.run(|n| {
        for e in n.take(2) {
            let CmEvent::Request { conn, peer, req } = e else {
                // Keep what is not the request for the test to look at.
                n.events.entry(2).or_default().push(e);
                continue;
            };
            {
                assert_eq!(
                    (peer, req.qpn, req.psn, req.private_data.as_slice()),
                    (1, Qpn::from_bits(0x11), Psn::new(100), &b"login"[..])
                );
                let now = n.now;
                n.cm(2).accept(
                    now,
                    conn,
                    Qpn::from_bits(0x22),
                    Psn::new(200),
                    b"welcome".to_vec(),
                );
                b = Some(conn);
            }
        }
        n.cm(1).state(a) == ConnState::Established
            && b.is_some_and(|b| n.cm(2).state(b) == ConnState::Established)
    });
    (a, b.expect("the passive side saw the REQ"))
}

#[test]
fn connect_accept_establishes_both_sides() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    let (a, b) = establish(&mut net);
    net.settle();
    let ea = net.take(1);
    assert!(
        ea.contains(&CmEvent::Established {
            conn: a,
            remote_qpn: Qpn::from_bits(0x22),
            remote_psn: Psn::new(200),
            private_data: b"welcome".to_vec()
        }),
        "{ea:?}"
    );
    let eb = net.take(2);
    assert!(
        eb.contains(&CmEvent::Established {
            conn: b,
            remote_qpn: Qpn::from_bits(0x11),
            remote_psn: Psn::new(100),
            private_data: vec![]
        }),
        "{eb:?}"
    );
    // REQ, REP, RTU: one each, no retries on a clean link.
    assert_eq!(net.count(1, is_req), 1);
    assert_eq!(net.count(2, |m| matches!(m, CmMsg::Rep { .. })), 1);
    assert_eq!(net.count(1, |m| matches!(m, CmMsg::Rtu { .. })), 1);
}

#[test]
fn consumer_reject_surfaces_reason_and_private_data() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.cm(2).listen(SVC);
    let a = net.connect_plain(vec![2], SVC);
    net.run(|n| {
        for e in n.take(2) {
            if let CmEvent::Request { conn, .. } = e {
                n.cm(2)
                    .reject(conn, RejReason::CONSUMER_DEFINED, b"srp-rej".to_vec());
            }
        }
        n.cm(1).state(a) == ConnState::Closed
    });
    let e = net.take(1);
    assert_eq!(
        e,
        vec![CmEvent::Rejected {
            conn: a,
            reason: RejReason::CONSUMER_DEFINED,
            private_data: b"srp-rej".to_vec()
        }]
    );
}

#[test]
fn unknown_service_is_rejected() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    let a = net.connect_plain(vec![2], 0xdead);
    net.settle();
    assert_eq!(
        net.take(1),
        vec![CmEvent::Rejected {
            conn: a,
            reason: RejReason::INVALID_SERVICE_ID,
            private_data: vec![]
        }]
    );
}

#[test]
fn an_abandoned_req_is_not_sent_again_when_the_link_comes_back() {
    // A consumer gave up waiting (an SRP initiator's login attempt over a
    // dead link): a REQ retried after the link is back would log in behind
    // its back and end its newer channel.
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.cm(2).listen(SVC);
    net.down.push(2);
    let a = net.connect_plain(vec![2], SVC);
    net.run(|n| n.count(1, is_req) == 2);
    assert!(net.cm(1).abandon(a));
    assert!(!net.cm(1).abandon(a), "already gone");
    net.down.clear();
    net.settle();
    assert_eq!(net.count(1, is_req), 2, "no REQ after the abandon");
    assert!(net.take(1).is_empty(), "no event for an abandoned attempt");
    assert!(net.take(2).is_empty(), "the passive side saw nothing");
    // An established connection is not abandoned.
    let (c, _) = establish(&mut net);
    assert!(!net.cm(1).abandon(c));
    assert_eq!(net.cm(1).state(c), ConnState::Established);
}

#[test]
fn a_forgotten_connection_sends_nothing_in_any_state() {
    // A removed CA: its connections end where they stand, with no DREQ,
    // no REJ and no retry (the port cannot send), and no event.
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    let (a, b) = establish(&mut net);
    net.take(1);
    net.take(2);
    let sent = net.sent.len();
    assert!(net.cm(1).forget(a));
    assert!(!net.cm(1).forget(a), "already gone");
    assert_eq!(net.cm(1).state(a), ConnState::Closed);
    assert_eq!(net.cm(1).poll_timeout(), None, "no timer left");
    // A REQ still retried is forgotten as well; and so is a listen.
    net.down.push(2);
    let r = net.connect_plain(vec![2], SVC);
    let reqs_since = |n: &Net| {
        n.sent[sent..]
            .iter()
            .filter(|(f, _, m)| *f == 1 && is_req(m))
            .count()
    };
    net.run(|n| reqs_since(n) == 2);
    assert!(net.cm(1).forget(r));
    net.cm(2).unlisten(SVC);
    net.down.clear();
    net.settle();
    assert_eq!(reqs_since(&net), 2, "no REQ after the forget");
    assert!(
        net.sent[sent..]
            .iter()
            .all(|(f, _, m)| *f != 1 || is_req(m)),
        "only the REQs left node 1: no DREQ, no REJ"
    );
    assert!(
        net.take(1).is_empty(),
        "no event for a forgotten connection"
    );
    assert_eq!(
        net.cm(2).state(b),
        ConnState::Established,
        "the peer learns by itself"
    );
    // After the unlisten a new REQ is refused.
    let late = net.connect_plain(vec![2], SVC);
    net.settle();
    assert!(matches!(
        net.take(1).as_slice(),
        [CmEvent::Rejected { conn, reason: RejReason::INVALID_SERVICE_ID, .. }] if *conn == late
    ));
}

#[test]
fn dead_peer_times_out_after_every_retry() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.down.push(2);
    let a = net.connect_plain(vec![2], SVC);
    net.settle();
    assert_eq!(net.take(1), vec![CmEvent::TimedOut { conn: a }]);
    assert_eq!(net.count(1, is_req), 4, "first try + 3 retries");
    // 4 response timeouts of 4.096 us * 2^12 = 16.8 ms each, on virtual time.
    assert!(net.now >= Instant::from_micros(4 * 16_777), "{}", net.now);
    assert!(
        net.sent.iter().any(|(f, _, m)| *f == 1
            && matches!(
                m,
                CmMsg::Rej {
                    reason: RejReason::TIMEOUT,
                    ..
                }
            )),
        "REJ timeout sent"
    );
}

#[test]
fn next_path_is_tried_when_one_is_dead() {
    let mut net = Net::new(&[1, 2, 3], FaultConfig::default());
    net.down.push(3); // path 3 is dead; 2 is alive
    net.cm(2).listen(SVC);
    let a = net.connect_plain(vec![3, 2], SVC);
    net.run(|n| {
        for e in n.take(2) {
            if let CmEvent::Request { conn, .. } = e {
                let now = n.now;
                n.cm(2)
                    .accept(now, conn, Qpn::from_bits(2), Psn::new(2), vec![]);
            }
        }
        n.cm(1).state(a) == ConnState::Established
    });
    let to: Vec<u8> = net
        .sent
        .iter()
        .filter(|(f, _, m)| *f == 1 && is_req(m))
        .map(|(_, t, _)| *t)
        .collect();
    assert_eq!(
        to,
        vec![3, 3, 3, 3, 2],
        "4 tries on the dead path, then the next"
    );
}

/// The P_Keys of the REQs node 1 sent.
fn req_pkeys(net: &Net) -> Vec<(u8, Pkey)> {
    net.sent
        .iter()
        .filter_map(|(f, to, m)| match m {
            CmMsg::Req { pkey, .. } if *f == 1 => Some((*to, *pkey)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_req_partition_key_reaches_the_passive_side_on_every_try() {
    // Path 3 is dead: the REQ goes there 4 times, then to 2, always with
    // the requester's partition.
    let mut net = Net::new(&[1, 2, 3], FaultConfig::default());
    net.down.push(3);
    net.cm(2).listen(SVC);
    let req = ReqInfo {
        service_id: SVC,
        qpn: Qpn::from_bits(0x31),
        psn: Psn::new(7),
        pkey: Pkey(0x8010),
        timing: cfg().timing(e(0)),
        private_data: b"p".to_vec(),
    };
    let a = net
        .cm(1)
        .connect_req(Instant::ZERO, vec![3, 2], req.clone());
    let mut seen = Vec::new();
    net.run(|n| {
        for e in n.take(2) {
            if let CmEvent::Request { conn, req, .. } = e {
                let now = n.now;
                n.cm(2)
                    .accept(now, conn, Qpn::from_bits(2), Psn::new(2), vec![]);
                seen.push(req);
            }
        }
        n.cm(1).state(a) == ConnState::Established
    });
    let mut want = req;
    want.private_data.resize(1, 0);
    assert_eq!(seen, vec![want], "one request, with the REQ's P_Key");
    let k = Pkey(0x8010);
    assert_eq!(
        req_pkeys(&net),
        vec![(3, k), (3, k), (3, k), (3, k), (2, k)]
    );

    // `connect` is the default partition.
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.cm(2).listen(SVC);
    net.connect_plain(vec![2], SVC);
    net.settle();
    // Nobody answers: the REQ is sent again, each time in the default
    // partition.
    let sent = req_pkeys(&net);
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert!(sent.iter().all(|s| *s == (2, Pkey::DEFAULT)), "{sent:?}");
    let got: Vec<Pkey> = net
        .take(2)
        .into_iter()
        .filter_map(|e| match e {
            CmEvent::Request { req, .. } => Some(req.pkey),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![Pkey::DEFAULT]);
}

#[test]
fn disconnect_from_either_side_and_timewait() {
    for initiator in [1u8, 2] {
        let mut net = Net::new(&[1, 2], FaultConfig::default());
        let (a, b) = establish(&mut net);
        net.settle();
        net.take(1);
        net.take(2);
        let (me, conn, other, oconn) = if initiator == 1 {
            (1, a, 2, b)
        } else {
            (2, b, 1, a)
        };
        let now = net.now;
        assert!(net.cm(me).disconnect(now, conn));
        net.run(|n| {
            n.cm(me).state(conn) == ConnState::Timewait
                && n.cm(other).state(oconn) == ConnState::Timewait
        });
        net.settle();
        assert_eq!(
            net.take(me),
            vec![
                CmEvent::Disconnected { conn },
                CmEvent::TimewaitExit { conn }
            ]
        );
        assert_eq!(
            net.take(other),
            vec![
                CmEvent::DisconnectRequested { conn: oconn },
                CmEvent::Disconnected { conn: oconn },
                CmEvent::TimewaitExit { conn: oconn }
            ]
        );
        assert_eq!(net.cm(me).state(conn), ConnState::Closed);
    }
}

#[test]
fn simultaneous_disconnect() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    let (a, b) = establish(&mut net);
    net.settle();
    let now = net.now;
    assert!(net.cm(1).disconnect(now, a));
    assert!(net.cm(2).disconnect(now, b));
    net.settle();
    assert_eq!(net.cm(1).state(a), ConnState::Closed);
    assert_eq!(net.cm(2).state(b), ConnState::Closed);
    assert_eq!(
        net.count(1, |m| matches!(m, CmMsg::Dreq { .. })),
        1,
        "no DREQ retries: the peer's DREQ answered"
    );
    assert!(net.take(1).contains(&CmEvent::TimewaitExit { conn: a }));
}

#[test]
fn stale_connection_is_rejected_and_the_old_one_dropped() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    let (_a, b) = establish(&mut net);
    net.settle();
    net.take(2);
    net.take(1);
    // Node 1 reboots: a fresh CM (new comm IDs) asks again for the same QP.
    net.cms.insert(1, Cm::new(cfg(), 777_000));
    let now = net.now;
    let a2 = net
        .cm(1)
        .connect(now, vec![2], SVC, Qpn::from_bits(0x11), Psn::new(5), vec![]);
    net.settle();
    assert_eq!(
        net.take(1),
        vec![CmEvent::Rejected {
            conn: a2,
            reason: RejReason::STALE_CONN,
            private_data: vec![]
        }]
    );
    let e2 = net.take(2);
    assert!(
        e2.contains(&CmEvent::DisconnectRequested { conn: b }),
        "{e2:?}"
    );
}

#[test]
fn slow_consumer_gets_an_mra_and_the_requester_waits() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.cm(2).listen(SVC);
    let a = net.connect_plain(vec![2], SVC);
    // Hold the REQ unanswered across two response timeouts.
    let mut pending = None;
    net.run(|n| {
        for e in n.take(2) {
            if let CmEvent::Request { conn, .. } = e {
                pending = Some(conn);
            }
        }
        n.now >= Instant::from_micros(2 * 16_777 + 100)
    });
    assert!(
        net.count(2, |m| matches!(m, CmMsg::Mra { .. })) >= 1,
        "duplicate REQ answered with MRA"
    );
    let now = net.now;
    assert!(net.cm(2).accept(
        now,
        pending.unwrap(),
        Qpn::from_bits(2),
        Psn::new(2),
        vec![]
    ));
    net.run(|n| n.cm(1).state(a) == ConnState::Established);
    assert_eq!(net.cm(1).state(a), ConnState::Established);
}

#[test]
fn connections_establish_under_five_percent_mad_loss() {
    let mut retried = 0;
    for seed in 0..20u64 {
        let mut net = Net::new(
            &[1, 2],
            FaultConfig {
                seed,
                loss: 0.05,
                duplicate: 0.02,
                reorder: 0.02,
                ..FaultConfig::default()
            },
        );
        net.cm(2).listen(SVC);
        let conns: Vec<ConnId> = (0..25u32)
            .map(|i| {
                net.cm(1).connect(
                    Instant::ZERO,
                    vec![2],
                    SVC,
                    Qpn::from_bits(0x100 + i),
                    Psn::new(i),
                    vec![],
                )
            })
            .collect();
        net.run(|n| {
            for e in n.take(2) {
                if let CmEvent::Request { conn, .. } = e {
                    let now = n.now;
                    n.cm(2)
                        .accept(now, conn, Qpn::from_bits(0x500), Psn::new(9), vec![]);
                }
            }
            conns
                .iter()
                .all(|c| n.cm(1).state(*c) == ConnState::Established)
        });
        let up = conns
            .iter()
            .filter(|c| net.cm(1).state(**c) == ConnState::Established)
            .count();
        assert_eq!(up, 25, "seed {seed}: every connection established");
        retried += net.count(1, is_req) + net.count(2, |m| matches!(m, CmMsg::Rep { .. })) - 50;
    }
    assert!(retried > 10, "loss forced REQ/REP retries: {retried}");
}

#[test]
fn a_lost_req_is_resent_soon_then_less_often_up_to_the_response_timeout() {
    // Linux's timing (response timeout 2^20 * 4.096 us, about 4.3 s, and
    // rdma_cm's RoCE packet lifetime 16): the link is down for the first
    // 2 s, as when a login starts during an outage.
    let mut a: Cm<u8> = Cm::new(CmConfig::default(), 1000);
    let mut b: Cm<u8> = Cm::new(CmConfig::default(), 2000);
    b.listen(SVC);
    let timing = rdma_cm::Timing {
        packet_life_time: e(16),
        local_cm_response_timeout: e(20),
        remote_cm_response_timeout: e(20),
    };
    let full = timing.rep_wait();
    assert_eq!(
        rdma_cm::REQ_FIRST_RESEND,
        Duration::from_ack_timeout_exp(16).unwrap()
    );
    // The path's round trip plus 268 ms of the peer's 4.3 s.
    let first = timing.first_req_wait();
    assert_eq!(
        first,
        Duration::from_ack_timeout_exp(17).unwrap() + rdma_cm::REQ_FIRST_RESEND
    );
    let up_at = Instant::from_millis(2000);
    a.connect(
        Instant::ZERO,
        vec![2],
        SVC,
        Qpn::from_bits(1),
        Psn::new(1),
        vec![],
    );
    let mut now = Instant::ZERO;
    let mut sends = Vec::new();
    let mut received = None;
    for _ in 0..100 {
        while let Some((to, msg)) = a.poll_transmit() {
            assert_eq!(to, 2);
            assert!(is_req(&msg), "{msg:?}");
            sends.push(now);
            if now >= up_at && received.is_none() {
                b.handle_msg(now, 1, msg);
                received = b.poll_event().map(|_| now);
            }
        }
        match a.poll_timeout() {
            Some(t) if sends.len() < 8 => {
                now = t;
                a.handle_timeout(now);
            }
            _ => break,
        }
    }
    let gaps: Vec<Duration> = sends.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        vec![
            first,
            first.saturating_mul(2),
            first.saturating_mul(4).min(full),
            full,
            full,
            full,
            full
        ]
    );
    // The first REQ after the link came back (the third, at 3 x 805 ms)
    // reached the passive side, not the one after a whole wait (4.8 s).
    let got = received.expect("the passive side got the REQ");
    assert_eq!(got, Instant::ZERO + first.saturating_mul(3));
    assert!(got - up_at < Duration::from_millis(500));
}

/// A REQ from node 1 over a path with packet lifetime `plt`, the peer
/// expected to answer within 2^12 * 4.096 us.
fn req_over(plt: u8) -> ReqInfo {
    ReqInfo {
        service_id: SVC,
        qpn: Qpn::from_bits(0x31),
        psn: Psn::new(7),
        pkey: Pkey::DEFAULT,
        timing: rdma_cm::Timing {
            packet_life_time: e(plt),
            local_cm_response_timeout: e(14),
            remote_cm_response_timeout: e(12),
        },
        private_data: vec![],
    }
}

/// 4.096 us * 2^exp, in microseconds, by hand (twice a packet lifetime
/// of 2^n is 2^(n+1)).
fn us(exp: u32) -> u64 {
    (4096u64 << exp) / 1000
}

#[test]
fn the_req_is_retried_after_two_packet_lifetimes_plus_the_peer_response_time() {
    // IBA 12.7.27 / Linux ib_cm: the REQ waits 2 * 4.096 us *
    // 2^PacketLifeTime + 4.096 us * 2^RemoteCMResponseTimeout.
    let mut first_retry = Vec::new();
    for plt in [10u8, 14, 18] {
        let mut net = Net::new(&[1, 2], FaultConfig::default());
        net.down.push(2);
        let a = net.cm(1).connect_req(Instant::ZERO, vec![2], req_over(plt));
        net.run(|n| n.count(1, is_req) == 2);
        let want = us(u32::from(plt) + 1) + us(12);
        assert_eq!(net.now, Instant::from_micros(want), "packet lifetime {plt}");
        assert_eq!(
            net.cm(1).response_wait(a),
            Some(Duration::from_micros(want))
        );
        // The REQ says so to the passive side (as the local ACK timeout).
        assert!(net.sent.iter().all(|(_, _, m)| matches!(
            m,
            CmMsg::Req { timing, .. } if timing.packet_life_time == e(plt)
                && timing.local_ack_timeout() == e(plt + 1)
        )));
        first_retry.push(net.now);
    }
    // Each step of 4 in the exponent waits 16 times longer for the path.
    let path = |i: usize| {
        first_retry[i]
            .saturating_since(Instant::ZERO)
            .total_micros()
            - us(12)
    };
    assert_eq!((path(1) / path(0), path(2) / path(1)), (16, 16));
}

#[test]
fn the_rep_waits_for_the_rtu_as_long_as_the_req_says() {
    // The passive side's own response time (cfg 12) does not matter: the
    // requester told it how long it takes to answer a REP (14), and the
    // path's lifetime counts twice.
    let mut cm: Cm<u8> = Cm::new(cfg(), 500);
    cm.listen(SVC);
    let mut req = req_over(10);
    req.private_data = vec![1];
    let t0 = Instant::from_millis(3);
    cm.handle_msg(
        t0,
        1,
        CmMsg::Req {
            local_comm_id: 9,
            service_id: SVC,
            qpn: req.qpn,
            psn: req.psn,
            pkey: req.pkey,
            timing: req.timing,
            private_data: vec![],
        },
    );
    let Some(CmEvent::Request { conn, req: got, .. }) = cm.poll_event() else {
        panic!("no request")
    };
    assert_eq!(got.timing, req.timing);
    assert!(cm.accept(t0, conn, Qpn::from_bits(2), Psn::new(2), vec![]));
    let want = Duration::from_micros(us(11) + us(14));
    assert_eq!(cm.poll_timeout(), Some(t0 + want));
    assert_eq!(cm.response_wait(conn), Some(want));
}

/// An MRA from node 2 at `at` for connection `a`'s REQ, asking for
/// 2^`service_timeout` * 4.096 us.
fn mra_for_req(cm: &mut Cm<u8>, at: Instant, a: ConnId, service_timeout: u8) {
    cm.handle_msg(
        at,
        2,
        CmMsg::Mra {
            local_comm_id: 77,
            remote_comm_id: a.0,
            msg: rdma_cm::MsgKind::Req,
            service_timeout: e(service_timeout),
        },
    );
}

#[test]
fn an_mra_delays_the_timeout_by_its_service_timeout() {
    let mut cm: Cm<u8> = Cm::new(cfg(), 100);
    let a = cm.connect_req(Instant::ZERO, vec![2], req_over(10));
    let req_wait = Instant::from_micros(us(11) + us(12));
    assert_eq!(cm.poll_timeout(), Some(req_wait));
    assert!(matches!(cm.poll_transmit(), Some((2, CmMsg::Req { .. }))));
    // The passive consumer needs 2^20 * 4.096 us (4.3 s).
    let t1 = Instant::from_millis(1);
    mra_for_req(&mut cm, t1, a, 20);
    let mra_wait = t1 + Duration::from_micros(us(20) + us(11));
    assert_eq!(cm.poll_timeout(), Some(mra_wait));
    // Where the REQ's own wait ended, nothing is sent again.
    cm.handle_timeout(req_wait);
    assert!(cm.poll_transmit().is_none(), "REQ resent despite the MRA");
    assert_eq!(cm.state(a), ConnState::ReqSent);
    // At the end of the MRA's wait the REQ goes again.
    cm.handle_timeout(mra_wait);
    assert!(matches!(cm.poll_transmit(), Some((2, CmMsg::Req { .. }))));
    // A shorter service timeout waits less.
    let mut cm: Cm<u8> = Cm::new(cfg(), 100);
    let a = cm.connect_req(Instant::ZERO, vec![2], req_over(10));
    mra_for_req(&mut cm, t1, a, 16);
    assert_eq!(
        cm.poll_timeout(),
        Some(t1 + Duration::from_micros(us(16) + us(11)))
    );
}

#[test]
fn waits_stay_within_the_configured_floor_and_ceiling() {
    let bounded = CmConfig {
        min_timeout: Duration::from_millis(5),
        max_timeout: Duration::from_secs(2),
        ..cfg()
    };
    let mut cm: Cm<u8> = Cm::new(bounded, 100);
    // 8 us + 4 us by the numbers: the floor.
    let mut tiny = req_over(0);
    tiny.timing.remote_cm_response_timeout = e(0);
    let a = cm.connect_req(Instant::ZERO, vec![2], tiny);
    assert_eq!(cm.response_wait(a), Some(Duration::from_millis(5)));
    // 2.4 hours by the numbers: the ceiling.
    let b = cm.connect_req(Instant::ZERO, vec![2], req_over(30));
    assert_eq!(cm.response_wait(b), Some(Duration::from_secs(2)));
    assert_eq!(cm.poll_timeout(), Some(Instant::from_millis(5)));
}

/// The longest times a REQ and an MRA can say (every 5-bit field 31, the
/// packet lifetime one past what the local ACK timeout can carry) make
/// the longest waits, not an overflow: a REQ whose lifetime byte was 255
/// panicked adding one for the round trip (fuzz target `cm_input`,
/// fuzz/regressions/cm_input).
#[test]
fn the_longest_times_on_the_wire_wait_longest() {
    let unbounded = CmConfig {
        max_timeout: Duration::MAX,
        ..cfg()
    };
    let mut cm: Cm<u8> = Cm::new(unbounded, 100);
    cm.listen(SVC);
    let longest = rdma_cm::Timing {
        packet_life_time: TimeoutExp::MAX,
        local_cm_response_timeout: TimeoutExp::MAX,
        remote_cm_response_timeout: TimeoutExp::MAX,
    };
    assert_eq!(longest.local_ack_timeout(), TimeoutExp::MAX);
    let req = CmMsg::Req {
        local_comm_id: 9,
        service_id: SVC,
        qpn: Qpn::from_bits(0x31),
        psn: Psn::new(7),
        pkey: Pkey::DEFAULT,
        timing: longest,
        private_data: vec![],
    };
    cm.handle_msg(Instant::ZERO, 2, req);
    let Some(CmEvent::Request { conn, .. }) = cm.poll_event() else {
        panic!("no request event");
    };
    assert!(cm.accept(Instant::ZERO, conn, Qpn::from_bits(5), Psn::new(5), vec![]));
    // A round trip of 2^31 (the ACK timeout can say no more) and the
    // requester's response time of 2^31: 4.9 hours.
    let rtu_wait = TimeoutExp::MAX.duration() + TimeoutExp::MAX.duration();
    assert_eq!(cm.response_wait(conn), Some(rtu_wait));
    assert_eq!(cm.poll_timeout(), Some(Instant::ZERO + rtu_wait));
    // An MRA for a REQ of ours, with the longest service timeout.
    let a = cm.connect_req(Instant::ZERO, vec![2], req_over(31));
    mra_for_req(&mut cm, Instant::ZERO, a, 31);
    assert!(cm.poll_timeout().is_some());
}

#[test]
fn a_held_rtu_waits_for_the_consumer_who_sends_it_or_rejects_the_rep() {
    for ok in [true, false] {
        let mut net = Net::new(&[1, 2], FaultConfig::default());
        net.cm(2).listen(SVC);
        let a = net.connect_plain(vec![2], SVC);
        assert!(net.cm(1).hold_rtu(a));
        let mut b = None;
        net.run(|n| {
            for e in n.take(2) {
                if let CmEvent::Request { conn, .. } = e {
                    let now = n.now;
                    n.cm(2)
                        .accept(now, conn, Qpn::from_bits(0x22), Psn::new(5), b"r".to_vec());
                    b = Some(conn);
                }
            }
            n.cm(1).state(a) == ConnState::RepRcvd
        });
        let b = b.unwrap();
        let mut reply = net.take(1);
        assert!(
            matches!(reply.as_slice(), [CmEvent::Reply { conn, remote_qpn, remote_psn, private_data }]
                if *conn == a && *remote_qpn == Qpn::from_bits(0x22)
                    && *remote_psn == Psn::new(5) && private_data[0] == b'r'),
            "{reply:?}"
        );
        assert_eq!(net.count(1, |m| matches!(m, CmMsg::Rtu { .. })), 0);
        assert!(!net.cm(1).hold_rtu(a), "only before the REP");
        if ok {
            assert!(net.cm(1).ready(a));
            assert!(!net.cm(1).ready(a), "once");
            net.run(|n| n.cm(2).state(b) == ConnState::Established);
            reply = net.take(1);
            assert!(
                matches!(reply.as_slice(), [CmEvent::Established { conn, .. }] if *conn == a),
                "{reply:?}"
            );
            assert_eq!(net.cm(1).state(a), ConnState::Established);
            assert_eq!(net.count(1, |m| matches!(m, CmMsg::Rtu { .. })), 1);
        } else {
            assert!(net
                .cm(1)
                .reject_reply(a, RejReason::CONSUMER_DEFINED, b"qp".to_vec()));
            net.run(|n| n.cm(2).state(b) == ConnState::Closed);
            assert_eq!(net.cm(1).state(a), ConnState::Closed);
            assert!(
                net.take(2).contains(&CmEvent::Rejected {
                    conn: b,
                    reason: RejReason::CONSUMER_DEFINED,
                    private_data: b"qp".to_vec()
                }),
                "the passive side hears the REJ of its REP"
            );
            assert_eq!(net.count(1, |m| matches!(m, CmMsg::Rtu { .. })), 0);
        }
    }
}

/// A passive consumer that gives up on a REP still waiting for its RTU (a
/// login it will not keep) gets the connection refused and forgotten at
/// once: one REJ of the REP, no more REP resends, no timer, and the
/// active side learns it was rejected.
#[test]
fn disconnecting_a_rep_that_waits_for_its_rtu_refuses_it_at_once() {
    let mut net = Net::new(&[1, 2], FaultConfig::default());
    net.cm(2).listen(SVC);
    // The active side holds its RTU, so the REP stays unanswered.
    let a = net.connect_plain(vec![2], SVC);
    net.cm(1).hold_rtu(a);
    let mut b = None;
    net.run(|n| {
        for e in n.take(2) {
            if let CmEvent::Request { conn, .. } = e {
                let now = n.now;
                n.cm(2)
                    .accept(now, conn, Qpn::from_bits(0x22), Psn::new(200), vec![]);
                b = Some(conn);
            }
        }
        b.is_some_and(|b| n.cm(2).state(b) == ConnState::RepSent)
            && n.cm(1).state(a) == ConnState::RepRcvd
    });
    let b = b.expect("the passive side saw the REQ");
    let now = net.now;
    assert!(net.cm(2).disconnect(now, b));
    assert_eq!(net.cm(2).state(b), ConnState::Closed);
    assert_eq!(net.cm(2).poll_timeout(), None, "nothing left to resend");
    net.settle();
    assert_eq!(net.count(2, |m| matches!(m, CmMsg::Rep { .. })), 1);
    assert_eq!(
        net.count(2, |m| matches!(
            m,
            CmMsg::Rej {
                reason: RejReason::CONSUMER_DEFINED,
                ..
            }
        )),
        1
    );
    assert!(
        net.take(1)
            .iter()
            .any(|e| matches!(e, CmEvent::Rejected { conn, .. } if *conn == a)),
        "the active side was told"
    );
}
