//! The body of the `qp_input` fuzz target, shared with a deterministic test
//! so CI runs it without a nightly toolchain. It decodes the input as a
//! script: which QP type, then a sequence of packets (every field from the
//! bytes), posts and time steps; the engine must never panic, must only
//! touch memory through [`crate::Memory`] (a [`crate::FlatMemory`] that
//! refuses anything outside its 64 KiB), and must complete each WQE once.

use crate::{Packet, Qp, QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use rdma_types::{Duration, Instant, Lkey, Pkey, Psn, Qkey, QpType, Qpn, Rkey};
use rdma_wire::{AethRepr, AtomicEthRepr, DethRepr, Opcode, RethRepr, Syndrome};

/// A cursor over the fuzz input; reads past the end give zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs one fuzz input; returns how many steps it took. Panics only on
/// an engine bug.
pub fn qp_input(data: &[u8]) -> usize {
    let mut inp = Input(data);
    let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(inp.u8() % 3)];
    let mut cfg = QpConfig::rc(Qpn::from_bits(2), Qpn::from_bits(3));
    cfg.qp_type = qp_type;
    cfg.qkey = Qkey(7);
    // Any byte for the attributes that come from outside (a CM REP, a
    // consumer's modify QP), not only the IBA's ranges: the engine must
    // not overflow on them.
    cfg.timeout = inp.u8();
    cfg.retry_cnt = inp.u8();
    cfg.rnr_retry = inp.u8();
    cfg.min_rnr_timer = inp.u8();
    cfg.max_rd_atomic = inp.u8();
    cfg.max_dest_rd_atomic = inp.u8();
    let mut qp = Qp::new(cfg);
    qp.set_rts();
    let mut mem = crate::FlatMemory::new(1, 65536);
    let mut now = Instant::ZERO;
    let mut posted = 0u64;
    let mut recvs = 0u64;
    let mut completed = std::collections::BTreeSet::new();
    let mut steps = 0;
    while !inp.done() && steps < 2000 {
        steps += 1;
        match inp.u8() % 6 {
            0 => {
                let op = match inp.u8() % 6 {
                    0 => SendOp::Send,
                    1 => SendOp::Write {
                        raddr: inp.u64() % 70_000,
                        rkey: Rkey(inp.u32() % 3),
                    },
                    2 => SendOp::Read {
                        raddr: inp.u64() % 70_000,
                        rkey: Rkey(1),
                    },
                    3 => SendOp::FetchAdd {
                        raddr: inp.u64() % 70_000,
                        rkey: Rkey(1),
                        add: 1,
                    },
                    4 => SendOp::LocalInv(Rkey(inp.u32() % 3)),
                    _ => SendOp::SendImm(inp.u32()),
                };
                let len = inp.u32() % 9000;
                let mut w = SendWqe::new(
                    posted,
                    op,
                    vec![Sge {
                        addr: u64::from(inp.u32() % 70_000),
                        len,
                        lkey: Lkey(inp.u32() % 3),
                    }],
                );
                w.ud = Some(crate::UdDest {
                    qpn: Qpn::from_bits(3),
                    qkey: Qkey(7),
                    ah: 0,
                });
                posted += 1;
                qp.post_send(w);
            }
            1 => {
                recvs += 1;
                qp.post_recv(RecvWqe {
                    wr_id: 1 << 40 | recvs,
                    sges: vec![Sge {
                        addr: u64::from(inp.u32() % 70_000),
                        len: inp.u32() % 9000,
                        lkey: Lkey(1),
                    }],
                })
            }
            2 | 3 => {
                let mut p: Packet<Vec<u8>> = Packet::new(
                    Opcode::from_code(inp.u8()),
                    Pkey(0xFFFF ^ u16::from(inp.u8() & 1)),
                    Qpn::from_bits(2),
                    Psn::new(inp.u32() % 64),
                );
                p.bth.ack_req = inp.u8() & 1 == 1;
                let flags = inp.u8();
                if flags & 1 != 0 {
                    p.ext.reth = Some(RethRepr {
                        va: inp.u64() % 70_000,
                        rkey: Rkey(inp.u32() % 3),
                        dma_len: inp.u32() % 20_000,
                    });
                }
                if flags & 2 != 0 {
                    p.ext.aeth = Some(AethRepr {
                        syndrome: Syndrome::from_byte(inp.u8()),
                        msn: inp.u32() & 0xFF_FFFF,
                    });
                }
                if flags & 4 != 0 {
                    p.ext.atomic_eth = Some(AtomicEthRepr {
                        va: inp.u64() % 70_000,
                        rkey: Rkey(1),
                        swap_add: inp.u64(),
                        compare: inp.u64(),
                    });
                }
                if flags & 8 != 0 {
                    p.ext.deth = Some(DethRepr {
                        qkey: Qkey(inp.u32() % 9),
                        src_qp: Qpn::from_bits(inp.u32()),
                    });
                }
                p.payload = vec![0x5a; usize::from(inp.u8()) * 17];
                qp.handle_packet(now, &p.as_received(), &mut mem);
            }
            4 => {
                now += Duration::from_micros(u64::from(inp.u32() % 2_000_000));
                qp.handle_timeout(now);
            }
            // Every other such step, the middle packets of messages and
            // READ responses as the soft RoCE node sends them
            // (`poll_middles`, `poll_middle_responses`, runs of 1 to 5)
            // where it can.
            _ => loop {
                let most = 1 + steps % 5;
                if steps % 2 == 0
                    && (qp.poll_middles(now, &mut mem, most).is_some()
                        || qp.poll_middle_responses(&mut mem, most).is_some())
                {
                    continue;
                }
                if qp.poll_transmit(now, &mut mem).is_none() {
                    break;
                }
            },
        }
        while let Some(c) = qp.poll_completion() {
            assert!(
                completed.insert((c.is_recv, c.wr_id)),
                "WQE {} completed twice",
                c.wr_id
            );
        }
        while qp.poll_event().is_some() {}
    }
    steps
}

#[cfg(test)]
mod tests {
    #[test]
    fn fuzz_body_runs_on_pseudo_random_scripts() {
        let mut x: u64 = 0x1234_5678_9abc_def0;
        let mut steps = 0;
        for _ in 0..3000 {
            // Step the generator for the length too, or a zero length
            // would repeat forever.
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = (x >> 33) as usize % 600;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            steps += super::qp_input(&data);
        }
        assert!(
            steps > 50_000,
            "the scripts exercised the engine: {steps} steps"
        );
    }

    /// The `qp_input` target's committed seeds and regression inputs
    /// (`fuzz/seeds/qp_input`, `fuzz/regressions/qp_input`).
    #[test]
    fn qp_input_replays_its_committed_inputs() {
        rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "qp_input", |data| {
            super::qp_input(data);
        });
    }
}
