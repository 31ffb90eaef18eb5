//! Two (or three) CM endpoints on a virtual clock joined by seeded faulty
//! links: connect, reject, timeouts, path lists, disconnects, stale
//! connections and MAD loss.

use rdma_cm::{Cm, CmConfig, CmEvent, CmMsg, ConnId, ConnState, RejReason, ReqInfo};
use rdma_sim::{FaultConfig, FaultInjector, Payload};
use rdma_types::{Duration, Instant, Pkey, Psn, Qpn};
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
        response_timeout: 12,
        max_retries: 3,
        timewait: Duration::from_millis(50),
    }
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
    // Linux's timing (2^20 * 4.096 us, about 4.3 s): the link is down for
    // the first 3 s, as when a login starts during an outage.
    let mut a: Cm<u8> = Cm::new(CmConfig::default(), 1000);
    let mut b: Cm<u8> = Cm::new(CmConfig::default(), 2000);
    b.listen(SVC);
    let full = Duration::from_ack_timeout_exp(20).unwrap();
    assert_eq!(
        rdma_cm::REQ_FIRST_RESEND,
        Duration::from_ack_timeout_exp(16).unwrap()
    );
    let up_at = Instant::from_millis(3000);
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
    let first = rdma_cm::REQ_FIRST_RESEND;
    assert_eq!(
        gaps,
        vec![
            first,
            first.saturating_mul(2),
            first.saturating_mul(4),
            first.saturating_mul(8),
            // Twice 2^19 in whole microseconds, a hair under 2^20's.
            first.saturating_mul(16).min(full),
            full,
            full
        ]
    );
    // The REQ after the link came back reached the passive side 1.03 s
    // later (at 15 x 268 ms), not at the first full response timeout
    // (4.3 s).
    let got = received.expect("the passive side got the REQ");
    assert_eq!(got, Instant::ZERO + first.saturating_mul(15));
    assert!(got - up_at < Duration::from_millis(1100));
}
