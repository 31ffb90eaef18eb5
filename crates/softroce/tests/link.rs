//! Link down/up and loss at the driver level: two nodes on 127.0.156.x
//! exchange RC traffic through real UDP sockets (ephemeral ports) while one
//! node's link is cut with `Node::set_link_up`, or while its fault injector
//! drops a packet (the capture then shows the NAK and go-back-N, checked
//! with our parser and tshark).

use rdma_sim::FaultConfig;
use rdma_types::{Instant, Lkey, Mtu, Qpn, Rkey, WcStatus};
use roce::{Completion, QpConfig, QpEvent, SendOp, SendWqe, Sge};
use softroce::{FlatMemory, Node, NodeConfig, QpHandle};
use std::time::{Duration, Instant as StdInstant};

const KEY: u32 = 7;
const LEN: usize = 64 * 1024;

struct Pair {
    a: Node,
    b: Node,
    qa: QpHandle,
    ma: FlatMemory,
    mb: FlatMemory,
    epoch: StdInstant,
}

/// An RC QP on 127.0.156.`a_host` connected to one on 127.0.156.`b_host`,
/// with ACK timeout exponent `timeout` and `retry_cnt` retries.
fn pair(a_host: u8, b_host: u8, timeout: u8, retry_cnt: u8) -> Pair {
    pair_of(
        NodeConfig::new(format!("127.0.156.{a_host}:0").parse().unwrap()),
        NodeConfig::new(format!("127.0.156.{b_host}:0").parse().unwrap()),
        timeout,
        retry_cnt,
    )
}

/// [`pair`] with the nodes' configurations given.
fn pair_of(ca: NodeConfig, cb: NodeConfig, timeout: u8, retry_cnt: u8) -> Pair {
    let mut a = Node::bind(ca).unwrap();
    let mut b = Node::bind(cb).unwrap();
    let ma = FlatMemory::new(KEY, LEN);
    ma.with(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i * 13 % 251) as u8)
    });
    let mb = FlatMemory::new(KEY, LEN);
    let mut cfg = QpConfig::rc(Qpn::new(0).unwrap(), Qpn::new(0).unwrap());
    cfg.pmtu = Mtu::Mtu1024;
    cfg.timeout = timeout;
    cfg.retry_cnt = retry_cnt;
    let qa = a.create_qp(cfg.clone(), Box::new(ma.clone()));
    let qb = b.create_qp(cfg, Box::new(mb.clone()));
    Node::connect_pair(&mut a, qa, &mut b, qb);
    Pair {
        a,
        b,
        qa,
        ma,
        mb,
        epoch: StdInstant::now(),
    }
}

impl Pair {
    /// Drives both nodes until `done` holds for A's completions or `limit`
    /// of real time passes; returns the completions.
    fn run(&mut self, limit: Duration, done: impl Fn(&[Completion]) -> bool) -> Vec<Completion> {
        let mut wcs = Vec::new();
        let deadline = StdInstant::now() + limit;
        while !done(&wcs) && StdInstant::now() < deadline {
            let now = Instant::from_std(self.epoch, StdInstant::now());
            let busy = self.a.poll(now) | self.b.poll(now);
            while let Some(c) = self.a.poll_completion(self.qa) {
                wcs.push(c);
            }
            if !busy {
                // Idle: block in the kernel until traffic or 200 us.
                let _ = self.a.wait(Duration::from_micros(200));
            }
        }
        wcs
    }

    fn write(&mut self, id: u64, off: u64, len: u32) {
        self.a.qp_mut(self.qa).unwrap().post_send(SendWqe::new(
            id,
            SendOp::Write {
                raddr: off,
                rkey: Rkey(KEY),
            },
            vec![Sge {
                addr: off,
                len,
                lkey: Lkey(KEY),
            }],
        ));
    }
}

fn bytes(m: &FlatMemory, off: usize, len: usize) -> Vec<u8> {
    m.with(|b| b[off..off + len].to_vec())
}

#[test]
fn traffic_stops_while_the_link_is_down_and_recovers_within_the_retry_budget() {
    // Timeout 2^12 * 4.096 us = 16.8 ms, 7 retries: a budget of ~134 ms;
    // the link stays down ~30 ms of it.
    let mut p = pair(1, 2, 12, 7);
    // First a WRITE on a good link.
    p.write(1, 0, 3000);
    let wcs = p.run(Duration::from_secs(10), |w| !w.is_empty());
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);

    p.a.set_link_up(false);
    let b_rx = p.b.stats().rx_datagrams;
    p.write(2, 8192, 5000);
    let down_until = StdInstant::now() + Duration::from_millis(30);
    let wcs = p.run(Duration::from_secs(1), |_| StdInstant::now() >= down_until);
    assert!(wcs.is_empty(), "nothing completes while down: {wcs:?}");
    assert_eq!(p.b.stats().rx_datagrams, b_rx, "nothing reached B");
    assert!(p.a.stats().link_down_drops >= 5, "{:?}", p.a.stats());
    assert_eq!(bytes(&p.mb, 8192, 5000), vec![0; 5000], "B untouched");

    p.a.set_link_up(true);
    let wcs = p.run(Duration::from_secs(10), |w| !w.is_empty());
    assert_eq!(
        wcs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(2, WcStatus::Success)]
    );
    assert_eq!(bytes(&p.mb, 8192, 5000), bytes(&p.ma, 8192, 5000));
    assert!(p.b.stats().rx_datagrams > b_rx);
    let c = p.a.qp_mut(p.qa).unwrap().counters();
    assert!(c.timeouts >= 1, "the requester retried: {c:?}");
    assert!(p.a.poll_event(p.qa).is_none(), "the QP did not go to error");
}

#[test]
fn link_down_longer_than_the_retry_budget_is_retry_exceeded() {
    // Timeout 2^10 * 4.096 us = 4.2 ms, 2 retries: gives up after ~13 ms.
    let mut p = pair(3, 4, 10, 2);
    p.a.set_link_up(false);
    p.write(1, 0, 3000);
    p.write(2, 4096, 3000);
    let started = StdInstant::now();
    let wcs = p.run(Duration::from_secs(10), |w| w.len() == 2);
    assert_eq!(
        wcs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // Not before the budget: three timeouts of 4.2 ms each.
    assert!(started.elapsed() >= Duration::from_millis(12));
    assert_eq!(
        p.a.poll_event(p.qa),
        Some(QpEvent::Error(WcStatus::RetryExcErr))
    );
    assert_eq!(p.a.qp_mut(p.qa).unwrap().counters().timeouts, 3);
    // Restoring the link does not revive an errored QP.
    p.a.set_link_up(true);
    p.write(3, 0, 100);
    let wcs = p.run(Duration::from_secs(10), |w| !w.is_empty());
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::WrFlushErr);
    assert_eq!(bytes(&p.mb, 0, 3000), vec![0; 3000]);
}

/// Seed of A's 10 % loss: the first pass of a 16-packet WRITE loses exactly
/// one packet and the go-back-N pass loses none (the decisions follow the
/// order A offers datagrams, which a NAK-driven retransmission keeps).
const LOSS_SEED: u64 = 7;

#[test]
fn a_captured_loss_shows_one_sequence_nak_and_go_back_n_in_order() {
    let dir = std::env::temp_dir().join(format!("softroce-loss-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("b.pcap");
    let mut ca = NodeConfig::new("127.0.156.5:0".parse().unwrap());
    ca.faults = Some(FaultConfig::lossy(LOSS_SEED, 0.1));
    // B records what it received and what it answered.
    let mut cb = NodeConfig::new("127.0.156.6:0".parse().unwrap());
    cb.capture = Some(cap.clone());
    // 67 ms timeout: the NAK, not the timer, must drive the retransmission.
    let mut p = pair_of(ca, cb, 14, 7);
    const PKTS: u32 = 16;
    p.write(1, 0, PKTS * 1024);
    let wcs = p.run(Duration::from_secs(20), |w| !w.is_empty());
    assert_eq!(
        wcs.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::Success]
    );
    assert_eq!(
        bytes(&p.mb, 0, PKTS as usize * 1024),
        bytes(&p.ma, 0, PKTS as usize * 1024)
    );
    let c = p.a.qp_mut(p.qa).unwrap().counters();
    assert_eq!((c.seq_naks_received, c.timeouts), (1, 0), "{c:?}");
    let ports = [p.a.local_addr().port(), p.b.local_addr().port()];
    drop(p);

    // Our parser: every record decodes with a good ICRC.
    let raw = std::fs::read(&cap).unwrap();
    let (_, records) = rdma_wire::pcap::read(&raw).unwrap();
    let pkts: Vec<(u8, u32, Option<u8>)> = records
        .iter()
        .map(|r| {
            let r = rdma_wire::RoceRepr::parse(r.data).expect("a good ICRC");
            let syndrome = r.ib.ext.aeth.map(|a| a.syndrome.to_byte());
            (r.ib.bth.opcode.code(), r.ib.bth.psn.value(), syndrome)
        })
        .collect();
    let requests: Vec<u32> = pkts
        .iter()
        .filter(|p| (0x06..=0x08).contains(&p.0))
        .map(|p| p.1)
        .collect();
    let responses: Vec<(u32, u8)> = pkts
        .iter()
        .filter(|p| p.0 == 0x11)
        .map(|p| (p.1, p.2.expect("AETH")))
        .collect();
    // The one PSN missing from the first pass.
    let missing = (0..PKTS)
        .position(|i| requests.get(i as usize) != Some(&i))
        .expect("a packet was lost") as u32;
    let mut want: Vec<u32> = (0..PKTS).filter(|&i| i != missing).collect();
    want.extend(missing..PKTS);
    assert_eq!(
        requests, want,
        "first pass without {missing}, then go-back-N from it"
    );
    // One NAK (PSN sequence error: syndrome 011 00000) naming the missing
    // PSN, then the ACK of the last PSN (credit code 0: no receives posted),
    // and its copy if B polled 2 ms after it before A's completion ended the
    // run (`AckRepeat`: on a loaded machine it sometimes does).
    let copies = responses.len().saturating_sub(2);
    assert!(copies <= 1, "{responses:?}");
    assert_eq!(
        responses,
        [vec![(missing, 0x60)], vec![(PKTS - 1, 0x00); 1 + copies]].concat()
    );
    // The NAK comes before any retransmission in B's capture.
    let nak_at = pkts.iter().position(|p| p.0 == 0x11).unwrap();
    let first_pass_end = want.len() - (PKTS - missing) as usize;
    let requests_before_nak = pkts[..nak_at]
        .iter()
        .filter(|p| (0x06..=0x08).contains(&p.0))
        .count();
    assert!(requests_before_nak <= first_pass_end);

    if let Some(rows) = rdma_testkit::tshark_fields(
        "a_captured_loss_shows_one_sequence_nak_and_go_back_n_in_order",
        &cap,
        &ports,
        &[
            "infiniband.bth.opcode",
            "infiniband.bth.psn",
            "infiniband.aeth.syndrome",
        ],
    ) {
        let num = |s: &str| -> u32 {
            s.strip_prefix("0x")
                .map_or_else(|| s.parse(), |h| u32::from_str_radix(h, 16))
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        let theirs: Vec<(u8, u32, Option<u8>)> = rows
            .iter()
            .map(|r| {
                (
                    num(&r[0]) as u8,
                    num(&r[1]),
                    (!r[2].is_empty()).then(|| num(&r[2]) as u8),
                )
            })
            .collect();
        assert_eq!(
            theirs, pkts,
            "tshark reads opcodes, PSNs and AETH syndromes as we do"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_scheduled_outage_from_the_fault_spec_is_survived_or_exceeds_the_budget() {
    // `link_down_ms` as the tools take it (SOFTROCE_FAULTS, rperf --faults):
    // the link goes down with the first datagram, for 40 ms; a 134 ms
    // retry budget rides it out.
    let mut ca = NodeConfig::new("127.0.156.7:0".parse().unwrap());
    ca.faults = Some(FaultConfig::parse("link_down_ms=40,link_down_at_ms=0").unwrap());
    let cb = NodeConfig::new("127.0.156.8:0".parse().unwrap());
    let mut p = pair_of(ca, cb, 12, 7);
    let started = StdInstant::now();
    p.write(1, 0, 3000);
    let wcs = p.run(Duration::from_secs(10), |w| !w.is_empty());
    assert_eq!(
        wcs.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::Success]
    );
    assert!(started.elapsed() >= Duration::from_millis(40));
    assert_eq!(bytes(&p.mb, 0, 3000), bytes(&p.ma, 0, 3000));
    let c = p.a.qp_mut(p.qa).unwrap().counters();
    assert!(c.timeouts >= 2, "retried through the outage: {c:?}");

    // The same outage against a 2 x 4.2 ms budget: retry exceeded.
    let mut ca = NodeConfig::new("127.0.156.9:0".parse().unwrap());
    ca.faults = Some(FaultConfig::parse("link_down_ms=200,link_down_at_ms=0").unwrap());
    let cb = NodeConfig::new("127.0.156.10:0".parse().unwrap());
    let mut p = pair_of(ca, cb, 10, 1);
    p.write(1, 0, 3000);
    let wcs = p.run(Duration::from_secs(10), |w| !w.is_empty());
    assert_eq!(
        wcs.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::RetryExcErr]
    );
    assert_eq!(bytes(&p.mb, 0, 3000), vec![0; 3000]);
}
