//! Body of the `cm_input` fuzz target, shared with a deterministic test:
//! any sequence of messages from any peers, consumer calls and time steps
//! must leave the endpoint without a panic, with every timer finite, and
//! with the number of live connections bounded by what was created.

use crate::{Cm, CmConfig, CmEvent, CmMsg, ConnId, MsgKind, RejReason, Timing};
use rdma_types::{CmRetries, Duration, Instant, Pkey, Psn, Qpn, TimeoutExp};

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
    /// A byte as a 5-bit wire field takes it: the CM never sees more.
    fn exp(&mut self) -> TimeoutExp {
        TimeoutExp::from_bits(self.u8())
    }
}

/// Runs one input; returns the number of steps taken.
pub fn cm_input(data: &[u8]) -> usize {
    let mut inp = Input(data);
    let cfg = CmConfig {
        response_timeout: TimeoutExp::from_bits(8),
        max_retries: CmRetries::from_bits(inp.u8() % 4),
        timewait: Duration::from_millis(1),
        ..CmConfig::default()
    };
    let mut cm: Cm<u8> = Cm::new(cfg, 1 + u32::from(inp.u8()));
    cm.listen(7);
    let mut now = Instant::ZERO;
    let mut known: Vec<ConnId> = Vec::new();
    let mut steps = 0;
    while !inp.0.is_empty() && steps < 1000 {
        steps += 1;
        let peer = inp.u8() % 4;
        // Small comm IDs so messages hit live connections often.
        let (l, r) = (inp.u32() % 8, inp.u32() % 300);
        let msg = match inp.u8() % 10 {
            0 => CmMsg::Req {
                local_comm_id: l,
                service_id: u64::from(inp.u8() % 9),
                qpn: Qpn::from_bits(inp.u32()),
                psn: Psn::new(inp.u32()),
                pkey: Pkey(inp.u8().into()),
                timing: Timing {
                    packet_life_time: inp.exp(),
                    local_cm_response_timeout: inp.exp(),
                    remote_cm_response_timeout: inp.exp(),
                },
                private_data: vec![0; usize::from(inp.u8())],
            },
            1 => CmMsg::Mra {
                local_comm_id: l,
                remote_comm_id: r,
                msg: MsgKind::Req,
                service_timeout: inp.exp(),
            },
            2 => CmMsg::Rej {
                local_comm_id: l,
                remote_comm_id: r,
                msg: MsgKind::Rep,
                reason: RejReason(u16::from(inp.u8())),
                private_data: vec![],
            },
            3 => CmMsg::Rep {
                local_comm_id: l,
                remote_comm_id: r,
                qpn: Qpn::from_bits(inp.u32()),
                psn: Psn::new(0),
                private_data: vec![],
            },
            4 => CmMsg::Rtu {
                local_comm_id: l,
                remote_comm_id: r,
            },
            5 => CmMsg::Dreq {
                local_comm_id: l,
                remote_comm_id: r,
            },
            6 => CmMsg::Drep {
                local_comm_id: l,
                remote_comm_id: r,
            },
            7 => {
                let req = crate::ReqInfo {
                    service_id: 7,
                    qpn: Qpn::from_bits(inp.u32()),
                    psn: Psn::new(1),
                    pkey: Pkey(0x8000 | u16::from(inp.u8())),
                    timing: cfg.timing(inp.exp()),
                    private_data: vec![],
                };
                known.push(cm.connect_req(now, vec![peer, (peer + 1) % 4], req));
                continue;
            }
            8 => {
                if let Some(&c) = known.get(usize::from(inp.u8()) % known.len().max(1)) {
                    match inp.u8() % 6 {
                        0 => drop(cm.accept(now, c, Qpn::from_bits(5), Psn::new(5), vec![])),
                        1 => drop(cm.reject(c, RejReason::CONSUMER_DEFINED, vec![1])),
                        2 => drop(cm.hold_rtu(c)),
                        3 => drop(cm.ready(c)),
                        4 => drop(cm.reject_reply(c, RejReason::CONSUMER_DEFINED, vec![])),
                        _ => drop(cm.disconnect(now, c)),
                    }
                }
                continue;
            }
            _ => {
                now += Duration::from_micros(u64::from(inp.u32() % 100_000));
                cm.handle_timeout(now);
                continue;
            }
        };
        cm.handle_msg(now, peer, msg);
        while cm.poll_transmit().is_some() {}
        while let Some(e) = cm.poll_event() {
            if let CmEvent::Request { conn, .. } = e {
                known.push(conn);
            }
        }
        if let Some(t) = cm.poll_timeout() {
            // The longest wait is an MRA's 5-bit service timeout (~2.4 h).
            assert!(
                t <= now + Duration::from_secs(3 * 3600),
                "timer {t} runs away from {now}"
            );
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    #[test]
    fn fuzz_body_runs_on_pseudo_random_scripts() {
        let mut x: u64 = 0xdead_beef_1234_5678;
        let mut steps = 0;
        for _ in 0..2000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = (x >> 33) as usize % 400;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    (x >> 56) as u8
                })
                .collect();
            steps += super::cm_input(&data);
        }
        assert!(steps > 20_000, "scripts exercised the endpoint: {steps}");
    }

    /// The `cm_input` target's committed seeds and regression inputs
    /// (`fuzz/seeds/cm_input`, `fuzz/regressions/cm_input`).
    #[test]
    fn cm_input_replays_its_committed_inputs() {
        rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "cm_input", |data| {
            super::cm_input(data);
        });
    }
}
