//! Two engines over a byte-stream model that cuts and joins the stream at
//! random places (seeded), and one engine fed hand-built FPDUs.

use std::collections::VecDeque;

use rdma_sim::Rng;
use rdma_types::{Duration, Instant};

use crate::ddp::{DdpPacket, Placement, SegmentRepr};
use crate::fuzz::{established_responder, TestMemory};
use crate::mpa::{self, FpduReceiver, FrameKind, FrameRepr, IrdOrd};
use crate::rdmap::{qn, Opcode, ReadRequestRepr};
use crate::terminate::TerminateRepr;
use crate::Msn;
use crate::{
    Completion, Config, Connection, Event, MpaRefusal, RecvWqe, Role, STag, SendOp, SendWqe, Sge,
    State, TermCause, WcKind, WcStatus,
};

enum Answer {
    Accept(Vec<u8>),
    Reject(Vec<u8>),
}

struct Node {
    c: Connection,
    mem: TestMemory,
    completions: Vec<Completion>,
    events: Vec<Event>,
}

impl Node {
    fn new(cfg: Config) -> Node {
        Node {
            c: Connection::new(cfg, Instant::ZERO).unwrap(),
            mem: TestMemory::default(),
            completions: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// Initiator `a`, responder `b`, and the two directions of the stream.
struct Net {
    a: Node,
    b: Node,
    a_to_b: VecDeque<u8>,
    b_to_a: VecDeque<u8>,
    /// Bytes ever put on a -> b, to corrupt one at a fixed stream offset.
    a_sent: usize,
    corrupt_a_to_b: Option<usize>,
    answer: Answer,
    rng: Rng,
    now: Instant,
}

impl Net {
    fn new(seed: u64, a: Config, b: Config) -> Net {
        Net {
            a: Node::new(a),
            b: Node::new(b),
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            a_sent: 0,
            corrupt_a_to_b: None,
            answer: Answer::Accept(Vec::new()),
            rng: Rng::new(seed),
            now: Instant::ZERO,
        }
    }

    fn pair(seed: u64) -> Net {
        Net::new(
            seed,
            Config::new(Role::Initiator),
            Config::new(Role::Responder),
        )
    }

    /// One round: both transmit everything, each direction delivers a
    /// random piece. Returns whether anything moved.
    fn step(&mut self) -> bool {
        let mut moved = false;
        let mut out = Vec::new();
        while self.a.c.poll_transmit(self.now, &mut self.a.mem, &mut out) {}
        if let Some(at) = self
            .corrupt_a_to_b
            .and_then(|at| at.checked_sub(self.a_sent))
        {
            if let Some(b) = out.get_mut(at) {
                *b ^= 0x10;
            }
        }
        self.a_sent += out.len();
        self.a_to_b.extend(out.drain(..));
        while self.b.c.poll_transmit(self.now, &mut self.b.mem, &mut out) {}
        self.b_to_a.extend(out.drain(..));
        for q in [true, false] {
            let queue = if q {
                &mut self.a_to_b
            } else {
                &mut self.b_to_a
            };
            if queue.is_empty() {
                continue;
            }
            let max = if self.rng.chance(0.2) { 50_000 } else { 700 };
            let n = (1 + self.rng.below(max) as usize).min(queue.len());
            let chunk: Vec<u8> = queue.drain(..n).collect();
            let node = if q { &mut self.b } else { &mut self.a };
            node.c.handle_bytes(self.now, &chunk, &mut node.mem);
            moved = true;
        }
        for node in [&mut self.a, &mut self.b] {
            while let Some(c) = node.c.poll_completion() {
                node.completions.push(c);
            }
            while let Some(e) = node.c.poll_event() {
                node.events.push(e);
            }
        }
        if self.b.c.state() == State::RequestReceived {
            match &self.answer {
                Answer::Accept(pd) => self.b.c.accept(pd).unwrap(),
                Answer::Reject(pd) => self.b.c.reject(pd),
            }
            moved = true;
        }
        self.now = Instant::from_micros(self.now.total_micros() + 1);
        moved || !self.a_to_b.is_empty() || !self.b_to_a.is_empty()
    }

    fn run(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                return;
            }
        }
        panic!("no quiescence");
    }
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    rng.fill(&mut v);
    v
}

#[test]
fn establish_v2_with_private_data_and_ird_ord() {
    let mut a = Config::new(Role::Initiator);
    a.private_data = b"hello".to_vec();
    a.ord = 16;
    a.ird = 3;
    let mut b = Config::new(Role::Responder);
    b.ird = 4;
    b.ord = 9;
    b.crc = false;
    let mut net = Net::new(1, a, b);
    net.answer = Answer::Accept(b"world".to_vec());
    net.run();
    assert_eq!(
        net.b.events[0],
        Event::ConnectRequest {
            private_data: b"hello".to_vec(),
            ird_ord: Some(IrdOrd {
                ird: 3,
                ord: 16,
                ..IrdOrd::default()
            })
        }
    );
    // b issues no more reads than a serves (3); a no more than b serves (4).
    assert_eq!(
        net.b.events[1],
        Event::Established {
            private_data: b"hello".to_vec(),
            crc: true,
            ird: 4,
            ord: 3
        }
    );
    assert_eq!(
        net.a.events,
        [Event::Established {
            private_data: b"world".to_vec(),
            crc: true,
            ird: 3,
            ord: 4
        }]
    );
    assert_eq!(
        (net.a.c.state(), net.b.c.state()),
        (State::Established, State::Established)
    );
}

#[test]
fn establish_v1_and_crc_off_when_neither_wants_it() {
    let mut a = Config::new(Role::Initiator);
    a.revision = 1;
    a.crc = false;
    let mut b = Config::new(Role::Responder);
    b.crc = false;
    let mut net = Net::new(2, a, b);
    net.run();
    assert_eq!(
        net.b.events[0],
        Event::ConnectRequest {
            private_data: vec![],
            ird_ord: None
        }
    );
    assert!(matches!(
        net.a.events[..],
        [Event::Established {
            crc: false,
            ird: 16,
            ord: 16,
            ..
        }]
    ));
}

/// a writes and sends to b; b's memory must match byte for byte.
fn write_and_send(seed: u64) {
    let mut rng = Rng::new(seed);
    let mut a = Config::new(Role::Initiator);
    let mut b = Config::new(Role::Responder);
    // Small MULPDUs make many segments; some runs use the 1500-byte path.
    let mulpdu = if seed % 3 == 0 {
        1442
    } else {
        47 + rng.below(400) as u16
    };
    a.mulpdu = mulpdu;
    b.mulpdu = mulpdu;
    a.crc = seed % 2 == 0;
    b.crc = seed % 5 == 0;
    let mut net = Net::new(seed, a, b);
    let wlen = 1 + rng.below(60_000) as u32;
    let slen = rng.below(5000) as u32;
    let src = random_bytes(&mut rng, 70_000);
    net.a
        .mem
        .register(STag(10), 0x500, src.clone(), false, false);
    net.b
        .mem
        .register(STag(20), 0x10000, vec![0; 70_000], false, true);
    net.b.mem.register(STag(21), 0, vec![0; 8192], false, false);
    net.b.c.post_recv(RecvWqe {
        wr_id: 100,
        buf: Sge {
            stag: STag(21),
            to: 0,
            len: 8192,
        },
    });
    let woff = rng.below(1000) as u32;
    net.a.c.post_send(SendWqe {
        wr_id: 1,
        op: SendOp::Write {
            local: Sge {
                stag: STag(10),
                to: 0x500,
                len: wlen,
            },
            remote_stag: STag(20),
            remote_to: 0x10000 + u64::from(woff),
        },
    });
    net.a.c.post_send(SendWqe {
        wr_id: 2,
        op: SendOp::Send {
            local: Sge {
                stag: STag(10),
                to: 0x600,
                len: slen,
            },
            solicited: true,
            invalidate: None,
        },
    });
    net.run();
    let w = net.b.mem.bytes(STag(20));
    let woff = woff as usize;
    let wlen = wlen as usize;
    assert!(
        w[..woff].iter().all(|b| *b == 0),
        "seed {seed}: before the write"
    );
    assert_eq!(
        &w[woff..woff + wlen],
        &src[..wlen],
        "seed {seed}: the write"
    );
    assert!(
        w[woff + wlen..].iter().all(|b| *b == 0),
        "seed {seed}: after the write"
    );
    let r = net.b.mem.bytes(STag(21));
    assert_eq!(
        &r[..slen as usize],
        &src[0x100..0x100 + slen as usize],
        "seed {seed}: the send"
    );
    assert!(r[slen as usize..].iter().all(|b| *b == 0));
    let ok = |wr_id, kind, byte_len| Completion {
        wr_id,
        kind,
        status: WcStatus::Success,
        byte_len,
        invalidated: None,
        solicited: false,
    };
    assert_eq!(
        net.a.completions,
        [ok(1, WcKind::Write, wlen as u32), ok(2, WcKind::Send, slen)]
    );
    assert_eq!(
        net.b.completions,
        [Completion {
            solicited: true,
            ..ok(100, WcKind::Recv, slen)
        }]
    );
    assert_eq!(
        (net.a.c.state(), net.b.c.state()),
        (State::Established, State::Established)
    );
}

#[test]
fn write_and_send_byte_for_byte_over_a_cut_stream() {
    for seed in 0..40 {
        write_and_send(seed);
    }
}

#[test]
fn sends_in_order_and_send_with_invalidate() {
    let mut net = Net::pair(3);
    net.a
        .mem
        .register(STag(10), 0, (0..=255).collect(), false, false);
    net.b.mem.register(STag(21), 0, vec![0; 1024], false, false);
    net.b.mem.register(STag(30), 0, vec![0; 16], true, true);
    for i in 0..4 {
        net.b.c.post_recv(RecvWqe {
            wr_id: 100 + i,
            buf: Sge {
                stag: STag(21),
                to: 256 * i,
                len: 256,
            },
        });
    }
    for i in 0..4u32 {
        let invalidate = (i == 2).then_some(STag(30));
        let local = Sge {
            stag: STag(10),
            to: u64::from(i),
            len: 10 + i,
        };
        net.a.c.post_send(SendWqe {
            wr_id: u64::from(i),
            op: SendOp::Send {
                local,
                solicited: i == 3,
                invalidate,
            },
        });
    }
    net.run();
    let got: Vec<_> = net
        .b
        .completions
        .iter()
        .map(|c| (c.wr_id, c.byte_len, c.invalidated, c.solicited))
        .collect();
    assert_eq!(
        got,
        [
            (100, 10, None, false),
            (101, 11, None, false),
            (102, 12, Some(STag(30)), false),
            (103, 13, None, true)
        ]
    );
    assert!(!net.b.mem.regions.contains_key(&30), "invalidated");
    let r = net.b.mem.bytes(STag(21));
    for i in 0..4usize {
        assert_eq!(
            &r[256 * i..256 * i + 10 + i],
            &(i as u8..).take(10 + i).collect::<Vec<_>>()[..]
        );
    }
}

#[test]
fn rdma_read_byte_for_byte() {
    for seed in 0..10 {
        let mut net = Net::pair(100 + seed);
        let mut rng = Rng::new(seed);
        let src = random_bytes(&mut rng, 50_000);
        net.b
            .mem
            .register(STag(40), 0x9000, src.clone(), true, false);
        net.a
            .mem
            .register(STag(11), 0, vec![0; 50_000], false, false);
        let len = 1 + rng.below(50_000) as u32;
        net.a.c.post_send(SendWqe {
            wr_id: 7,
            op: SendOp::Read {
                local: Sge {
                    stag: STag(11),
                    to: 0,
                    len,
                },
                remote_stag: STag(40),
                remote_to: 0x9000,
            },
        });
        net.run();
        assert_eq!(
            &net.a.mem.bytes(STag(11))[..len as usize],
            &src[..len as usize],
            "seed {seed}"
        );
        assert!(matches!(
            net.a.completions[..],
            [Completion { wr_id: 7, kind: WcKind::Read, status: WcStatus::Success, byte_len, .. }] if byte_len == len
        ));
    }
}

#[test]
fn reads_wait_for_ord_credit() {
    let mut a = Config::new(Role::Initiator);
    a.ord = 2;
    let mut net = Net::new(4, a, Config::new(Role::Responder));
    net.run();
    net.b.mem.register(STag(40), 0, vec![9; 100], true, false);
    net.a.mem.register(STag(11), 0, vec![0; 500], false, false);
    for i in 0..5u64 {
        let local = Sge {
            stag: STag(11),
            to: 100 * i,
            len: 100,
        };
        net.a.c.post_send(SendWqe {
            wr_id: i,
            op: SendOp::Read {
                local,
                remote_stag: STag(40),
                remote_to: 0,
            },
        });
    }
    let mut out = Vec::new();
    let mut n = 0;
    while net.a.c.poll_transmit(net.now, &mut net.a.mem, &mut out) {
        n += 1;
    }
    assert_eq!(n, 2, "two Read Requests, then no credit");
    net.a_to_b.extend(out);
    net.run();
    assert_eq!(
        net.a
            .completions
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(net.a.mem.bytes(STag(11)).iter().all(|b| *b == 9));
}

#[test]
fn crc_corruption_terminates_both_ends() {
    for seed in 0..20 {
        let mut net = Net::pair(200 + seed);
        net.a.mem.register(STag(10), 0, vec![1; 4000], false, false);
        net.b.mem.register(STag(20), 0, vec![0; 4000], false, true);
        net.b.c.post_recv(RecvWqe {
            wr_id: 9,
            buf: Sge {
                stag: STag(20),
                to: 0,
                len: 10,
            },
        });
        net.a.c.post_send(SendWqe {
            wr_id: 1,
            op: SendOp::Write {
                local: Sge {
                    stag: STag(10),
                    to: 0,
                    len: 4000,
                },
                remote_stag: STag(20),
                remote_to: 0,
            },
        });
        // Past the 24-byte MPA request, somewhere in the Write's FPDUs.
        net.corrupt_a_to_b = Some(24 + 2 + seed as usize * 97);
        net.run();
        assert_eq!(
            net.b.events.last(),
            Some(&Event::TerminateSent {
                cause: TermCause::MpaCrc
            }),
            "seed {seed}"
        );
        assert_eq!(
            net.a.events.last(),
            Some(&Event::TerminateReceived {
                code: TermCause::MpaCrc.code()
            })
        );
        assert_eq!(
            (net.a.c.state(), net.b.c.state()),
            (State::Terminated, State::Terminated)
        );
        assert_eq!(net.b.completions.len(), 1);
        assert_eq!(net.b.completions[0].status, WcStatus::Flushed);
    }
}

#[test]
fn a_peer_wanting_markers_is_refused_with_a_reject_reply() {
    let mut c = Connection::new(Config::new(Role::Responder), Instant::ZERO).unwrap();
    let mut mem = TestMemory::default();
    let req = FrameRepr {
        markers: true,
        ..FrameRepr::ours(FrameKind::Request, true, 1, None, &[])
    };
    let mut b = Vec::new();
    req.emit(&mut b);
    c.handle_bytes(Instant::ZERO, &b, &mut mem);
    assert_eq!(
        c.poll_event(),
        Some(Event::MpaRefused {
            reason: MpaRefusal::MarkersRequired
        })
    );
    assert_eq!(c.state(), State::Closed);
    let mut out = Vec::new();
    assert!(c.poll_transmit(Instant::ZERO, &mut mem, &mut out));
    let (rep, _) = FrameRepr::parse(&out, FrameKind::Reply).unwrap();
    assert!(rep.reject && !rep.markers);
    assert!(!c.poll_transmit(Instant::ZERO, &mut mem, &mut out));
}

#[test]
fn a_rejected_request_closes_and_flushes() {
    let mut net = Net::pair(5);
    net.answer = Answer::Reject(b"no LUNs".to_vec());
    net.a.mem.register(STag(10), 0, vec![0; 8], false, false);
    let local = Sge {
        stag: STag(10),
        to: 0,
        len: 8,
    };
    net.a.c.post_send(SendWqe {
        wr_id: 3,
        op: SendOp::Send {
            local,
            solicited: false,
            invalidate: None,
        },
    });
    net.run();
    assert_eq!(
        net.a.events,
        [Event::Rejected {
            private_data: b"no LUNs".to_vec()
        }]
    );
    assert_eq!(
        (net.a.c.state(), net.b.c.state()),
        (State::Closed, State::Closed)
    );
    assert_eq!(net.a.completions[0].status, WcStatus::Flushed);
}

#[test]
fn the_initiator_gives_up_on_a_missing_reply() {
    let mut c = Connection::new(Config::new(Role::Initiator), Instant::from_millis(5)).unwrap();
    assert_eq!(c.poll_timeout(), Some(Instant::from_millis(10_005)));
    c.handle_timeout(Instant::from_millis(10_004));
    assert_eq!((c.poll_event(), c.state()), (None, State::AwaitingReply));
    c.post_recv(RecvWqe {
        wr_id: 1,
        buf: Sge {
            stag: STag(1),
            to: 0,
            len: 1,
        },
    });
    c.handle_timeout(Instant::from_millis(10_005));
    assert_eq!(
        (c.poll_event(), c.state()),
        (Some(Event::MpaTimeout), State::Closed)
    );
    assert_eq!(
        c.poll_completion().map(|c| c.status),
        Some(WcStatus::Flushed)
    );
    assert_eq!(c.poll_timeout(), None);
    let _ = Duration::ZERO;
}

/// The TERMINATE the connection wrote: its cause and body.
fn sent_terminate(c: &mut Connection, mem: &mut TestMemory, crc: bool) -> TerminateRepr {
    let mut out = Vec::new();
    while c.poll_transmit(Instant::ZERO, mem, &mut out) {}
    let mut rx = FpduReceiver::new(crc, crate::ddp::TAGGED_HEADER_LEN);
    let mut s = &out[..];
    let mut last = None;
    while let Some(u) = rx.poll(&mut s).unwrap() {
        last = Some(u.to_vec());
    }
    let u = last.expect("an FPDU");
    let p = DdpPacket::new_checked(&u[..]).unwrap();
    let seg = SegmentRepr::parse(&p).unwrap();
    assert_eq!(seg.opcode, Opcode::Terminate);
    assert!(seg.last);
    assert!(matches!(
        seg.placement,
        Placement::Untagged {
            qn: qn::TERMINATE,
            mo: 0,
            ..
        }
    ));
    TerminateRepr::parse(p.payload()).unwrap()
}

fn reply_to(c: &mut Connection, mem: &mut TestMemory, rep: FrameRepr) {
    let mut b = Vec::new();
    rep.emit(&mut b);
    c.handle_bytes(Instant::ZERO, &b, mem);
}

#[test]
fn replies_we_cannot_live_with_terminate() {
    let base = FrameRepr::ours(FrameKind::Reply, true, 2, Some((4, 4)), &[]);
    let cases = [
        (
            FrameRepr {
                ird_ord: Some(IrdOrd {
                    ird: 4,
                    ord: 17,
                    ..IrdOrd::default()
                }),
                ..base.clone()
            },
            TermCause::MpaInsufficientIrd,
        ),
        (
            FrameRepr {
                ird_ord: Some(IrdOrd {
                    peer_to_peer: true,
                    write_rtr: true,
                    ..IrdOrd::default()
                }),
                ..base.clone()
            },
            TermCause::MpaNoMatchingRtr,
        ),
        (
            FrameRepr {
                crc: false,
                ..base.clone()
            },
            TermCause::MpaInvalidFrame,
        ),
        (
            FrameRepr {
                markers: true,
                ..base.clone()
            },
            TermCause::MpaInvalidFrame,
        ),
    ];
    for (rep, cause) in cases {
        let mut mem = TestMemory::default();
        let mut c = Connection::new(Config::new(Role::Initiator), Instant::ZERO).unwrap();
        let mut out = Vec::new();
        assert!(c.poll_transmit(Instant::ZERO, &mut mem, &mut out)); // the request
        let crc = rep.crc;
        reply_to(&mut c, &mut mem, rep);
        assert_eq!(c.state(), State::Terminated, "{cause:?}");
        let t = sent_terminate(&mut c, &mut mem, crc);
        assert_eq!(t.code, cause.code());
        assert_eq!((t.segment_len, t.ddp_header), (None, None));
    }
    // The acceptable one.
    let mut mem = TestMemory::default();
    let mut c = Connection::new(Config::new(Role::Initiator), Instant::ZERO).unwrap();
    reply_to(&mut c, &mut mem, base);
    assert_eq!(c.state(), State::Established);
}

#[test]
fn bytes_before_the_reply_are_refused() {
    let mut c = Connection::new(Config::new(Role::Responder), Instant::ZERO).unwrap();
    let mut mem = TestMemory::default();
    let mut b = Vec::new();
    FrameRepr::ours(FrameKind::Request, true, 1, None, &[1, 2]).emit(&mut b);
    b.extend_from_slice(&[0, 14]);
    c.handle_bytes(Instant::ZERO, &b, &mut mem);
    assert!(matches!(c.poll_event(), Some(Event::ConnectRequest { .. })));
    assert_eq!(
        c.poll_event(),
        Some(Event::MpaRefused {
            reason: MpaRefusal::EarlyData
        })
    );
    assert_eq!(c.state(), State::Closed);
}

fn untagged(opcode: Opcode, q: u32, msn: u32, mo: u32, last: bool, inv: u32) -> SegmentRepr {
    SegmentRepr {
        last,
        opcode,
        placement: Placement::Untagged {
            inv_stag: STag(inv),
            qn: q,
            msn: Msn(msn),
            mo,
        },
    }
}

fn tagged(opcode: Opcode, stag: u32, to: u64) -> SegmentRepr {
    SegmentRepr {
        last: true,
        opcode,
        placement: Placement::Tagged {
            stag: STag(stag),
            to,
        },
    }
}

fn ulpdu(h: SegmentRepr, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    h.emit(&mut u);
    u.extend_from_slice(payload);
    u
}

fn read_req(src_stag: u32, src_to: u64, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    ReadRequestRepr {
        sink_stag: STag(77),
        sink_to: 0,
        size,
        src_stag: STag(src_stag),
        src_to,
    }
    .emit(&mut b);
    b
}

#[test]
fn placement_errors_terminate_with_the_rfc_codes() {
    // The established responder (CRC off): STag 1 is 4 KiB at 0x1000,
    // remote read and write; STag 2 is 4 KiB local only; STag 3 another
    // stream's. Receives are posted per case.
    let rr = read_req(1, 0x1000, 16);
    let cases: Vec<(&str, Vec<u8>, usize, TermCause)> = vec![
        (
            "write, unknown STag",
            ulpdu(tagged(Opcode::RdmaWrite, 99, 0), &[1; 4]),
            1,
            TermCause::DdpInvalidStag,
        ),
        (
            "write past the end",
            ulpdu(tagged(Opcode::RdmaWrite, 1, 0x1ffa), &[1; 10]),
            1,
            TermCause::DdpBaseBounds,
        ),
        (
            "write below the base",
            ulpdu(tagged(Opcode::RdmaWrite, 1, 0xfff), &[1; 2]),
            1,
            TermCause::DdpBaseBounds,
        ),
        (
            "write, no remote write",
            ulpdu(tagged(Opcode::RdmaWrite, 2, 0), &[1; 4]),
            1,
            TermCause::RdmapAccessRights,
        ),
        (
            "write, other stream",
            ulpdu(tagged(Opcode::RdmaWrite, 3, 0), &[1; 4]),
            1,
            TermCause::DdpStagNotAssociated,
        ),
        (
            "write, TO wraps",
            ulpdu(tagged(Opcode::RdmaWrite, 1, u64::MAX - 3), &[1; 10]),
            1,
            TermCause::DdpToWrap,
        ),
        (
            "send, no buffer",
            ulpdu(untagged(Opcode::Send, 0, 1, 0, true, 0), &[1; 4]),
            0,
            TermCause::DdpNoBuffer,
        ),
        (
            "send, MSN ahead",
            ulpdu(untagged(Opcode::Send, 0, 2, 0, true, 0), &[1; 4]),
            1,
            TermCause::DdpMsnRange,
        ),
        (
            "send, MO not 0",
            ulpdu(untagged(Opcode::Send, 0, 1, 5, true, 0), &[1; 4]),
            1,
            TermCause::DdpInvalidMo,
        ),
        (
            "send too long",
            ulpdu(untagged(Opcode::Send, 0, 1, 0, true, 0), &[1; 17]),
            1,
            TermCause::DdpTooLong,
        ),
        (
            "queue 3",
            ulpdu(untagged(Opcode::Send, 3, 1, 0, true, 0), &[]),
            1,
            TermCause::DdpInvalidQn,
        ),
        (
            "send on queue 1",
            ulpdu(untagged(Opcode::Send, 1, 1, 0, true, 0), &[]),
            1,
            TermCause::RdmapUnexpectedOpcode,
        ),
        (
            "invalidate unknown STag",
            ulpdu(untagged(Opcode::SendInvalidate, 0, 1, 0, true, 55), &[1; 4]),
            1,
            TermCause::RdmapCannotInvalidate,
        ),
        (
            "read, unknown STag",
            ulpdu(
                untagged(Opcode::ReadRequest, 1, 1, 0, true, 0),
                &read_req(99, 0, 4),
            ),
            0,
            TermCause::RdmapInvalidStag,
        ),
        (
            "read, no remote read",
            ulpdu(
                untagged(Opcode::ReadRequest, 1, 1, 0, true, 0),
                &read_req(2, 0, 4),
            ),
            0,
            TermCause::RdmapAccessRights,
        ),
        (
            "read past the end",
            ulpdu(
                untagged(Opcode::ReadRequest, 1, 1, 0, true, 0),
                &read_req(1, 0x1000, 4097),
            ),
            0,
            TermCause::RdmapBaseBounds,
        ),
        (
            "read, TO wraps",
            ulpdu(
                untagged(Opcode::ReadRequest, 1, 1, 0, true, 0),
                &read_req(1, u64::MAX, 2),
            ),
            0,
            TermCause::RdmapToWrap,
        ),
        (
            "read, MSN 2 first",
            ulpdu(untagged(Opcode::ReadRequest, 1, 2, 0, true, 0), &rr),
            0,
            TermCause::DdpMsnRange,
        ),
        (
            "read request short",
            ulpdu(untagged(Opcode::ReadRequest, 1, 1, 0, true, 0), &rr[..20]),
            0,
            TermCause::DdpTooLong,
        ),
        (
            "unasked read response",
            ulpdu(tagged(Opcode::ReadResponse, 1, 0x1000), &[1; 4]),
            0,
            TermCause::RdmapUnexpectedOpcode,
        ),
    ];
    for (what, u, recvs, cause) in cases {
        let (mut c, mut mem) = established_responder();
        mem.register(STag(3), 0, vec![0; 64], true, true);
        mem.regions.get_mut(&3).unwrap().foreign = true;
        while c.poll_event().is_some() {}
        let mut out = Vec::new();
        while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {} // the reply
        for i in 0..recvs {
            c.post_recv(RecvWqe {
                wr_id: i as u64,
                buf: Sge {
                    stag: STag(2),
                    to: 0,
                    len: 16,
                },
            });
        }
        let mut f = Vec::new();
        mpa::emit_fpdu(&u, false, &mut f);
        c.handle_bytes(Instant::ZERO, &f, &mut mem);
        assert_eq!(
            c.poll_event(),
            Some(Event::TerminateSent { cause }),
            "{what}"
        );
        assert_eq!(c.state(), State::Terminated, "{what}");
        let t = sent_terminate(&mut c, &mut mem, false);
        assert_eq!(t.code, cause.code(), "{what}");
        assert_eq!(t.segment_len, Some(u.len() as u16), "{what}");
        let hlen = if u[0] & 0x80 != 0 { 14 } else { 18 };
        assert_eq!(
            t.ddp_header.as_deref(),
            Some(&u[..hlen]),
            "{what}: quotes the DDP header"
        );
        assert_eq!(
            t.rdma_header.is_some(),
            u[1] & 0xf == 1 && u.len() >= 18 + 28,
            "{what}"
        );
        // Every receive flushed, nothing placed in memory the check refused.
        let flushed = std::iter::from_fn(|| c.poll_completion())
            .filter(|c| c.status == WcStatus::Flushed)
            .count();
        assert!(flushed >= recvs.saturating_sub(1), "{what}");
        assert!(mem.bytes(STag(1)).iter().all(|b| *b == 0), "{what}");
        // Bytes after the TERMINATE are ignored.
        c.handle_bytes(Instant::ZERO, &f, &mut mem);
        assert_eq!(c.poll_event(), None);
    }
}

#[test]
fn more_reads_than_ird_terminate() {
    let (mut c, mut mem) = established_responder();
    let mut out = Vec::new();
    while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
    while c.poll_event().is_some() {}
    // IRD is 16: the seventeenth outstanding request has no buffer.
    for msn in 1..=17 {
        let mut f = Vec::new();
        mpa::emit_fpdu(
            &ulpdu(
                untagged(Opcode::ReadRequest, 1, msn, 0, true, 0),
                &read_req(1, 0x1000, 8),
            ),
            false,
            &mut f,
        );
        c.handle_bytes(Instant::ZERO, &f, &mut mem);
        if msn <= 16 {
            assert_eq!(c.poll_event(), None, "{msn}");
        }
    }
    assert_eq!(
        c.poll_event(),
        Some(Event::TerminateSent {
            cause: TermCause::DdpNoBuffer
        })
    );
}

#[test]
fn a_terminate_from_the_peer_flushes_everything() {
    let (mut c, mut mem) = established_responder();
    while c.poll_event().is_some() {}
    c.post_recv(RecvWqe {
        wr_id: 1,
        buf: Sge {
            stag: STag(2),
            to: 0,
            len: 16,
        },
    });
    let local = Sge {
        stag: STag(2),
        to: 0,
        len: 16,
    };
    c.post_send(SendWqe {
        wr_id: 2,
        op: SendOp::Write {
            local,
            remote_stag: STag(5),
            remote_to: 0,
        },
    });
    let mut body = Vec::new();
    TerminateRepr {
        code: TermCause::DdpInvalidStag.code(),
        segment_len: None,
        ddp_header: None,
        rdma_header: None,
    }
    .emit(&mut body);
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(untagged(Opcode::Terminate, 2, 1, 0, true, 0), &body),
        false,
        &mut f,
    );
    // Split in two, mid-header.
    c.handle_bytes(Instant::ZERO, &f[..7], &mut mem);
    c.handle_bytes(Instant::ZERO, &f[7..], &mut mem);
    assert_eq!(
        c.poll_event(),
        Some(Event::TerminateReceived {
            code: TermCause::DdpInvalidStag.code()
        })
    );
    let done: Vec<_> = std::iter::from_fn(|| c.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(done, [(2, WcStatus::Flushed), (1, WcStatus::Flushed)]);
    // Posts after the end complete at once, flushed.
    c.post_recv(RecvWqe {
        wr_id: 3,
        buf: local,
    });
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((3, WcStatus::Flushed))
    );
}

#[test]
fn config_errors() {
    let mut cfg = Config::new(Role::Initiator);
    cfg.private_data = vec![0; 509];
    assert!(Connection::new(cfg.clone(), Instant::ZERO).is_err());
    cfg.revision = 1;
    assert!(Connection::new(cfg.clone(), Instant::ZERO).is_ok());
    cfg.revision = 3;
    assert!(Connection::new(cfg.clone(), Instant::ZERO).is_err());
    cfg.revision = 2;
    cfg.private_data.clear();
    cfg.mulpdu = 46;
    assert!(Connection::new(cfg, Instant::ZERO).is_err());
}

#[test]
fn fuzz_connection_seeds_and_garbage() {
    let n = rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "connection", |d| {
        crate::fuzz::connection(d);
    });
    assert!(n >= 3);
    // The seeds reach deep: a Write, a two-segment Send, a Read, then the
    // peer's TERMINATE; and a bad STag ends in ours.
    let seed = |name: &str| {
        std::fs::read(format!(
            "{}/fuzz/seeds/connection/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let (events, completed) = crate::fuzz::connection(&seed("write-send-read-terminate"));
    assert_eq!(
        events,
        [Event::TerminateReceived {
            code: TermCause::DdpInvalidStag.code()
        }]
    );
    assert_eq!(completed, 2, "the receive and the send");
    let (events, _) = crate::fuzz::connection(&seed("bad-stag"));
    assert_eq!(
        events,
        [Event::TerminateSent {
            cause: TermCause::DdpInvalidStag
        }]
    );
    for seed in 0..300 {
        let mut rng = Rng::new(9000 + seed);
        let mut d = vec![0; rng.below(2000) as usize];
        rng.fill(&mut d);
        crate::fuzz::connection(&d);
    }
}

#[test]
fn garbage_after_establishment_terminates_and_never_panics() {
    for seed in 0..100 {
        let mut net = Net::pair(300 + seed);
        net.run();
        let mut rng = Rng::new(seed);
        let n = 1 + rng.below(3000) as usize;
        let junk = random_bytes(&mut rng, n);
        net.b.c.handle_bytes(net.now, &junk, &mut net.b.mem);
        let e = net.b.c.poll_event();
        // With CRCs on, garbage is a CRC or framing error (or, rarely, not
        // yet a whole FPDU).
        assert!(
            matches!(
                e,
                Some(Event::TerminateSent {
                    cause: TermCause::MpaCrc | TermCause::MpaFraming
                }) | None
            ),
            "seed {seed}: {e:?}"
        );
        if e.is_some() {
            net.run();
            assert!(
                matches!(net.a.events.last(), Some(Event::TerminateReceived { .. })),
                "seed {seed}"
            );
        }
    }
}

#[test]
fn a_v1_responder_answers_a_v2_request_in_v1() {
    let mut b = Config::new(Role::Responder);
    b.revision = 1;
    let mut net = Net::new(6, Config::new(Role::Initiator), b);
    // Watch the reply on the wire.
    while net
        .a
        .c
        .poll_transmit(net.now, &mut net.a.mem, &mut Vec::new())
    {}
    let mut req = Vec::new();
    FrameRepr::ours(FrameKind::Request, true, 2, Some((1, 1)), &[]).emit(&mut req);
    net.b.c.handle_bytes(net.now, &req, &mut net.b.mem);
    net.b.c.accept(b"ok").unwrap();
    let mut out = Vec::new();
    assert!(net.b.c.poll_transmit(net.now, &mut net.b.mem, &mut out));
    let (rep, _) = FrameRepr::parse(&out, FrameKind::Reply).unwrap();
    assert_eq!(
        (rep.revision, rep.ird_ord, &rep.private_data[..]),
        (1, None, &b"ok"[..])
    );
    // Our v2 initiator takes the v1 reply: no IRD/ORD change.
    net.a.c.handle_bytes(net.now, &out, &mut net.a.mem);
    assert!(matches!(
        net.a.c.poll_event(),
        Some(Event::Established {
            ird: 16,
            ord: 16,
            ..
        })
    ));
}

#[test]
fn a_refused_invalidate_completes_the_receive_with_its_status() {
    let (mut c, mut mem) = established_responder();
    while c.poll_event().is_some() {}
    c.post_recv(RecvWqe {
        wr_id: 8,
        buf: Sge {
            stag: STag(2),
            to: 0,
            len: 16,
        },
    });
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(
            untagged(Opcode::SendSeInvalidate, 0, 1, 0, true, 55),
            b"abc",
        ),
        false,
        &mut f,
    );
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    let done = c.poll_completion().unwrap();
    assert_eq!(
        (done.wr_id, done.status, done.byte_len),
        (8, WcStatus::InvalidateRefused, 3)
    );
    assert_eq!(&mem.bytes(STag(2))[..3], b"abc");
    assert_eq!(
        c.poll_event(),
        Some(Event::TerminateSent {
            cause: TermCause::RdmapCannotInvalidate
        })
    );
}

#[test]
fn memory_refusing_our_own_send_or_read_response_terminates() {
    // A send from an unregistered STag: the send fails locally.
    let (mut c, mut mem) = established_responder();
    while c.poll_event().is_some() {}
    let mut out = Vec::new();
    while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
    let local = Sge {
        stag: STag(66),
        to: 0,
        len: 4,
    };
    c.post_send(SendWqe {
        wr_id: 4,
        op: SendOp::Send {
            local,
            solicited: false,
            invalidate: None,
        },
    });
    let t = sent_terminate(&mut c, &mut mem, false);
    assert_eq!(t.code, TermCause::RdmapLocalCatastrophic.code());
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((4, WcStatus::LocalProtection))
    );

    // A Read whose source is invalidated after the request was checked.
    let (mut c, mut mem) = established_responder();
    while c.poll_event().is_some() {}
    while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(
            untagged(Opcode::ReadRequest, 1, 1, 0, true, 0),
            &read_req(1, 0x1000, 8),
        ),
        false,
        &mut f,
    );
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    assert_eq!(c.poll_event(), None);
    mem.regions.remove(&1);
    let t = sent_terminate(&mut c, &mut mem, false);
    assert_eq!(t.code, TermCause::RdmapInvalidStag.code());
}

#[test]
fn fuzz_setup_seeds_and_garbage() {
    let n = rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "setup", |d| {
        crate::fuzz::setup(d);
    });
    assert!(n >= 5);
    let seed = |name: &str| {
        std::fs::read(format!(
            "{}/fuzz/seeds/setup/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let ev = crate::fuzz::setup(&seed("request-accept"));
    assert!(
        matches!(
            &ev[..],
            [
                Event::ConnectRequest { .. },
                Event::Established {
                    ird: 16,
                    ord: 8,
                    ..
                }
            ]
        ),
        "{ev:?}"
    );
    let ev = crate::fuzz::setup(&seed("request-markers"));
    assert_eq!(
        ev,
        [Event::MpaRefused {
            reason: MpaRefusal::MarkersRequired
        }]
    );
    let ev = crate::fuzz::setup(&seed("reply"));
    assert!(
        matches!(&ev[..], [Event::Established { ord: 8, .. }]),
        "{ev:?}"
    );
    let ev = crate::fuzz::setup(&seed("reply-reject"));
    assert_eq!(
        ev,
        [Event::Rejected {
            private_data: b"no".to_vec()
        }]
    );
    for s in 0..300 {
        let mut rng = Rng::new(20_000 + s);
        let mut d = vec![0; rng.below(800) as usize];
        rng.fill(&mut d);
        crate::fuzz::setup(&d);
    }
}

/// Both ends post a random mix of Writes, Sends and Reads at once, with
/// Read Responses interleaving with each side's own messages; every byte
/// must land where it was aimed.
#[test]
fn mixed_traffic_both_ways_byte_for_byte() {
    const SRC: STag = STag(1);
    const DST: STag = STag(2); // remote-writable, Writes land here
    const RCV: STag = STag(3); // receive buffers
    const SINK: STag = STag(4); // Read sinks
    const SIZE: usize = 200_000;
    for seed in 0..12 {
        let mut rng = Rng::new(700 + seed);
        let mut a = Config::new(Role::Initiator);
        let mut b = Config::new(Role::Responder);
        let mulpdu = 47 + rng.below(3000) as u16;
        (a.mulpdu, b.mulpdu) = (mulpdu, mulpdu);
        (a.ord, a.ird, b.ord, b.ird) = (3, 2, 2, 3);
        let mut net = Net::new(seed, a, b);
        let srcs = [random_bytes(&mut rng, SIZE), random_bytes(&mut rng, SIZE)];
        for (node, src) in [&mut net.a, &mut net.b].into_iter().zip(&srcs) {
            node.mem.register(SRC, 0, src.clone(), true, false);
            node.mem.register(DST, 0, vec![0; SIZE], false, true);
            node.mem.register(RCV, 0, vec![0; SIZE], false, false);
            node.mem.register(SINK, 0, vec![0; SIZE], false, false);
        }
        // Expected contents of each node's DST, RCV and SINK, and the
        // cursors that keep every operation's target range its own.
        let mut expect = [
            [vec![0u8; SIZE], vec![0u8; SIZE], vec![0u8; SIZE]],
            [vec![0u8; SIZE], vec![0u8; SIZE], vec![0u8; SIZE]],
        ];
        let mut cursor = [[0usize; 3]; 2];
        let mut ops = [0usize; 2];
        for i in 0..30u64 {
            let from = rng.below(2) as usize;
            let to = 1 - from;
            let len = rng.below(8000) as usize;
            let at = rng.below((SIZE - len) as u64) as usize;
            let kind = rng.below(3) as usize;
            // A Read moves data from `to` into `from`'s sink.
            let (region, owner) = if kind == 2 { (2, from) } else { (kind, to) };
            let off = cursor[owner][region];
            if off + len > SIZE {
                continue;
            }
            cursor[owner][region] += len;
            let local = Sge {
                stag: SRC,
                to: at as u64,
                len: len as u32,
            };
            let op = match kind {
                0 => {
                    expect[to][0][off..off + len].copy_from_slice(&srcs[from][at..at + len]);
                    SendOp::Write {
                        local,
                        remote_stag: DST,
                        remote_to: off as u64,
                    }
                }
                1 => {
                    expect[to][1][off..off + len].copy_from_slice(&srcs[from][at..at + len]);
                    let node = if to == 0 { &mut net.a } else { &mut net.b };
                    node.c.post_recv(RecvWqe {
                        wr_id: i,
                        buf: Sge {
                            stag: RCV,
                            to: off as u64,
                            len: len as u32,
                        },
                    });
                    SendOp::Send {
                        local,
                        solicited: false,
                        invalidate: None,
                    }
                }
                _ => {
                    expect[from][2][off..off + len].copy_from_slice(&srcs[to][at..at + len]);
                    SendOp::Read {
                        local: Sge {
                            stag: SINK,
                            to: off as u64,
                            len: len as u32,
                        },
                        remote_stag: SRC,
                        remote_to: at as u64,
                    }
                }
            };
            ops[from] += 1;
            let node = if from == 0 { &mut net.a } else { &mut net.b };
            node.c.post_send(SendWqe { wr_id: i, op });
        }
        net.run();
        for (n, node) in [&net.a, &net.b].into_iter().enumerate() {
            for (r, stag) in [DST, RCV, SINK].into_iter().enumerate() {
                assert!(
                    node.mem.bytes(stag) == &expect[n][r][..],
                    "seed {seed}: node {n} region {r}"
                );
            }
            let sends = node
                .completions
                .iter()
                .filter(|c| c.kind != WcKind::Recv)
                .count();
            assert_eq!(sends, ops[n], "seed {seed}: node {n}");
            assert!(
                node.completions
                    .iter()
                    .all(|c| c.status == WcStatus::Success),
                "seed {seed}"
            );
            assert_eq!(node.c.state(), State::Established);
        }
    }
}

/// An established responder whose reply went out and whose events were
/// taken.
fn quiet_responder() -> (Connection, TestMemory) {
    let (mut c, mut mem) = established_responder();
    while c.poll_event().is_some() {}
    let mut out = Vec::new();
    while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
    (c, mem)
}

/// One Send FPDU (CRC off) of `data`, MSN `msn`, for an established
/// responder.
fn send_fpdu(msn: u32, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(untagged(Opcode::Send, qn::SEND, msn, 0, true, 0), data),
        false,
        &mut f,
    );
    f
}

#[test]
fn a_receive_that_cannot_take_the_send_completes_with_the_local_error() {
    // Too small: the receive says so, the peer gets "too long".
    let (mut c, mut mem) = quiet_responder();
    let small = Sge {
        stag: STag(2),
        to: 0,
        len: 4,
    };
    c.post_recv(RecvWqe {
        wr_id: 1,
        buf: small,
    });
    c.handle_bytes(Instant::ZERO, &send_fpdu(1, b"eight by"), &mut mem);
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((1, WcStatus::LocalLength))
    );
    assert_eq!(c.poll_completion(), None, "completed once");
    assert_eq!(
        sent_terminate(&mut c, &mut mem, false).code,
        TermCause::DdpTooLong.code()
    );
    // A buffer memory refuses: a protection error, nothing placed.
    let (mut c, mut mem) = quiet_responder();
    let gone = Sge {
        stag: STag(99),
        to: 0,
        len: 64,
    };
    c.post_recv(RecvWqe {
        wr_id: 2,
        buf: gone,
    });
    c.handle_bytes(Instant::ZERO, &send_fpdu(1, b"data"), &mut mem);
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((2, WcStatus::LocalProtection))
    );
    assert_eq!(
        sent_terminate(&mut c, &mut mem, false).code,
        TermCause::DdpLocalCatastrophic.code()
    );
}

/// A memory with a shared receive queue in front of [`TestMemory`].
struct Shared {
    mem: TestMemory,
    queue: VecDeque<RecvWqe>,
}

impl crate::Memory for Shared {
    fn read_local(&mut self, s: STag, to: u64, out: &mut [u8]) -> Result<(), crate::MemoryError> {
        self.mem.read_local(s, to, out)
    }
    fn write_local(&mut self, s: STag, to: u64, d: &[u8]) -> Result<(), crate::MemoryError> {
        self.mem.write_local(s, to, d)
    }
    fn remote_check(
        &mut self,
        s: STag,
        to: u64,
        len: u64,
        a: crate::Access,
    ) -> Result<(), crate::MemoryError> {
        self.mem.remote_check(s, to, len, a)
    }
    fn remote_write(&mut self, s: STag, to: u64, d: &[u8]) -> Result<(), crate::MemoryError> {
        self.mem.remote_write(s, to, d)
    }
    fn remote_read(&mut self, s: STag, to: u64, o: &mut [u8]) -> Result<(), crate::MemoryError> {
        self.mem.remote_read(s, to, o)
    }
    fn invalidate(&mut self, s: STag) -> Result<(), crate::MemoryError> {
        self.mem.invalidate(s)
    }
    fn shared_recv(&mut self) -> Option<RecvWqe> {
        self.queue.pop_front()
    }
}

#[test]
fn a_send_with_no_receive_of_its_own_takes_a_shared_one() {
    let (mut c, mem) = quiet_responder();
    let mut m = Shared {
        mem,
        queue: VecDeque::new(),
    };
    let buf = Sge {
        stag: STag(2),
        to: 100,
        len: 64,
    };
    m.queue.push_back(RecvWqe { wr_id: 7, buf });
    c.handle_bytes(Instant::ZERO, &send_fpdu(1, b"shared"), &mut m);
    let done = c.poll_completion().unwrap();
    assert_eq!(
        (done.wr_id, done.status, done.byte_len),
        (7, WcStatus::Success, 6)
    );
    assert_eq!(&m.mem.bytes(STag(2))[100..106], b"shared");
    // The next finds the queue empty: no buffer.
    c.handle_bytes(Instant::ZERO, &send_fpdu(2, b"again"), &mut m);
    assert_eq!(
        c.poll_event(),
        Some(Event::TerminateSent {
            cause: TermCause::DdpNoBuffer
        })
    );
}

#[test]
fn a_read_into_a_refused_sink_is_never_asked_for() {
    let (mut c, mut mem) = quiet_responder();
    let sink = Sge {
        stag: STag(42),
        to: 0,
        len: 16,
    };
    c.post_send(SendWqe {
        wr_id: 3,
        op: SendOp::Read {
            local: sink,
            remote_stag: STag(9),
            remote_to: 0,
        },
    });
    // Only a TERMINATE goes out, no Read Request.
    let t = sent_terminate(&mut c, &mut mem, false);
    assert_eq!(t.code, TermCause::RdmapLocalCatastrophic.code());
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((3, WcStatus::LocalProtection))
    );
}

#[test]
fn a_read_the_peer_refuses_completes_with_remote_access() {
    let (mut c, mut mem) = quiet_responder();
    let sink = Sge {
        stag: STag(2),
        to: 0,
        len: 16,
    };
    c.post_send(SendWqe {
        wr_id: 4,
        op: SendOp::Read {
            local: sink,
            remote_stag: STag(9),
            remote_to: 0,
        },
    });
    let mut out = Vec::new();
    while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
    let mut body = Vec::new();
    TerminateRepr {
        code: TermCause::RdmapInvalidStag.code(),
        segment_len: None,
        ddp_header: None,
        rdma_header: None,
    }
    .emit(&mut body);
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(
            untagged(Opcode::Terminate, qn::TERMINATE, 1, 0, true, 0),
            &body,
        ),
        false,
        &mut f,
    );
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((4, WcStatus::RemoteAccess))
    );
}

#[test]
fn a_closed_stream_flushes_with_an_event_and_an_abort_without() {
    let (mut c, mut mem) = quiet_responder();
    let buf = Sge {
        stag: STag(2),
        to: 0,
        len: 16,
    };
    c.post_recv(RecvWqe { wr_id: 1, buf });
    c.handle_stream_closed();
    assert_eq!(c.poll_event(), Some(Event::StreamClosed));
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((1, WcStatus::Flushed))
    );
    // Once ended, a second close says nothing.
    c.handle_stream_closed();
    assert_eq!(c.poll_event(), None);

    let (mut c, mut mem2) = quiet_responder();
    c.post_recv(RecvWqe { wr_id: 2, buf });
    c.abort();
    assert_eq!(c.poll_event(), None);
    assert_eq!(
        c.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((2, WcStatus::Flushed))
    );
    let mut out = Vec::new();
    assert!(
        !c.poll_transmit(Instant::ZERO, &mut mem2, &mut out),
        "nothing sent"
    );
    let _ = &mut mem;
}

#[test]
fn zero_length_writes_and_reads_name_no_memory() {
    let (mut c, mut mem) = quiet_responder();
    // A zero-length Write to STag 0 (a liveness probe): nothing happens.
    let mut f = Vec::new();
    mpa::emit_fpdu(&ulpdu(tagged(Opcode::RdmaWrite, 0, 0), &[]), false, &mut f);
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    assert_eq!((c.poll_event(), c.state()), (None, State::Established));
    // A zero-length Read of STag 0: an empty last Read Response.
    let mut f = Vec::new();
    mpa::emit_fpdu(
        &ulpdu(
            untagged(Opcode::ReadRequest, qn::READ_REQUEST, 1, 0, true, 0),
            &read_req(0, 0, 0),
        ),
        false,
        &mut f,
    );
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    assert_eq!((c.poll_event(), c.state()), (None, State::Established));
    let mut out = Vec::new();
    assert!(c.poll_transmit(Instant::ZERO, &mut mem, &mut out));
    let mut rx = FpduReceiver::new(false, crate::ddp::TAGGED_HEADER_LEN);
    let mut s = &out[..];
    let u = rx.poll(&mut s).unwrap().unwrap().to_vec();
    let p = DdpPacket::new_checked(&u[..]).unwrap();
    let seg = SegmentRepr::parse(&p).unwrap();
    assert_eq!(
        (seg.opcode, seg.last, p.payload().len()),
        (Opcode::ReadResponse, true, 0)
    );
    // A non-empty Write to STag 0 still terminates.
    let mut f = Vec::new();
    mpa::emit_fpdu(&ulpdu(tagged(Opcode::RdmaWrite, 0, 0), b"x"), false, &mut f);
    c.handle_bytes(Instant::ZERO, &f, &mut mem);
    assert!(matches!(c.poll_event(), Some(Event::TerminateSent { .. })));
}

#[test]
fn the_initiator_holds_its_first_fpdu_after_the_reply_as_configured() {
    let mut c = Connection::new(
        Config {
            first_fpdu_hold: Duration::from_millis(20),
            ..Config::new(Role::Initiator)
        },
        Instant::ZERO,
    )
    .unwrap();
    let mut mem = TestMemory::default();
    // The request goes at once, hold or not.
    let mut out = Vec::new();
    assert!(c.poll_transmit(Instant::ZERO, &mut mem, &mut out));
    c.post_send(empty_send(7));
    let rep = FrameRepr::ours(FrameKind::Reply, true, 2, Some((16, 16)), &[]);
    let mut b = Vec::new();
    rep.emit(&mut b);
    c.handle_bytes(Instant::from_millis(5), &b, &mut mem);
    assert_eq!(c.state(), State::Established);
    // Held: nothing to send until 5 + 20 ms, which is the next timer.
    assert_eq!(c.poll_timeout(), Some(Instant::from_millis(25)));
    out.clear();
    assert!(!c.poll_transmit(Instant::from_millis(24), &mut mem, &mut out));
    assert!(out.is_empty());
    c.handle_timeout(Instant::from_millis(24));
    assert_eq!(c.poll_timeout(), Some(Instant::from_millis(25)));
    c.handle_timeout(Instant::from_millis(25));
    assert_eq!(c.poll_timeout(), None);
    assert!(c.poll_transmit(Instant::from_millis(25), &mut mem, &mut out));
    assert!(!out.is_empty(), "the Send after the hold");
    // Without a hold (the default) the Send goes with the reply's arrival.
    let mut d = Connection::new(Config::new(Role::Initiator), Instant::ZERO).unwrap();
    out.clear();
    assert!(d.poll_transmit(Instant::ZERO, &mut mem, &mut out));
    d.post_send(empty_send(8));
    d.handle_bytes(Instant::from_millis(5), &b, &mut mem);
    assert_eq!(d.poll_timeout(), None);
    out.clear();
    assert!(d.poll_transmit(Instant::from_millis(5), &mut mem, &mut out));
}

/// A zero-length SEND with `wr_id` (no memory touched).
fn empty_send(wr_id: u64) -> SendWqe {
    SendWqe {
        wr_id,
        op: SendOp::Send {
            local: Sge {
                stag: STag(0),
                to: 0,
                len: 0,
            },
            solicited: false,
            invalidate: None,
        },
    }
}
