//! Body of the `sm_input` fuzz target, shared with a deterministic test:
//! any sequence of MADs on QP0 and QP1 from any of a few nodes, and time
//! steps, into one subnet manager. Nothing may panic; while the SM is
//! master, every MAD the SA owes an answer (base version 1, class SA, a
//! request method) gets at least one answer to its sender carrying its TID
//! and a response method (before, the SA answers nothing); no other MAD on
//! QP1 draws a QP1 answer with its TID.

use crate::sm::{SmConfig, SmState, SubnetManager, QP_GSI};
use rdma_types::{Duration, Gid, Guid, Instant};

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
}

/// Does the SA of an SM whose SM_Key is `sm_key` owe `m` an answer? Not
/// a response, Send, Trap or TrapRepress; and a request of the SA's
/// class version with a non-zero SM_Key other than the SM's is dropped
/// (IBA C15-0.1.5), while one of another version gets "bad version".
pub fn sa_owes_answer(m: &[u8], sm_key: u64) -> bool {
    let key = m
        .get(36..44)
        .map_or(0, |k| u64::from_be_bytes(k.try_into().expect("8 bytes")));
    m.len() >= 256
        && m[0] == 1
        && m[1] == 0x03
        && m[3] & 0x80 == 0
        && !matches!(m[3], 0x03 | 0x05 | 0x07)
        && (m[2] != rdma_mad::sa::SA_CLASS_VERSION || key == 0 || key == sm_key)
}

/// What one input did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fed {
    /// MADs handed to the SM.
    pub mads: usize,
    /// Of those, requests the SA answered.
    pub answered: usize,
}

/// Runs one input.
pub fn sm_input(data: &[u8]) -> Fed {
    let mut inp = Input(data);
    let nodes: Vec<(u8, Gid)> = (1..=3u8)
        .map(|i| {
            (
                i,
                Gid::from_ip(std::net::Ipv4Addr::new(127, 0, 9, i).into()),
            )
        })
        .collect();
    let mut cfg = SmConfig::new(Guid(0x5111));
    cfg.timeout = Duration::from_millis(1 + u64::from(inp.u8() % 50));
    cfg.retries = u32::from(inp.u8() % 4);
    let step = cfg.timeout;
    let mut now = Instant::ZERO;
    let mut sm = SubnetManager::new(cfg, nodes, now);
    // No node answers, so discovery ends with this SM master (bounded:
    // at most 4 tries of each SMP), and its SA answers.
    for _ in 0..16 {
        if sm.state() == SmState::Master {
            break;
        }
        sm.handle_timeout(now);
        now += step;
    }
    while sm.poll_transmit().is_some() {}
    let mut fed = Fed::default();
    while !inp.0.is_empty() && fed.mads < 500 {
        match inp.u8() % 8 {
            0 => {
                now += Duration::from_millis(u64::from(inp.u8()) * 4);
                sm.handle_timeout(now);
            }
            k => {
                let from = 1 + k % 3;
                let qp = inp.u8() & 1;
                // Mostly whole MADs with a plausible start, some short ones.
                let len = if inp.u8() < 230 {
                    256
                } else {
                    usize::from(inp.u8())
                };
                let mut m = vec![0u8; len];
                let body = inp.bytes(len);
                m[..body.len()].copy_from_slice(body);
                if len >= 4 && qp == QP_GSI && k < 5 {
                    m[0] = 1;
                    m[1] = 0x03;
                    m[2] = 2;
                    // Mostly an ordinary client's SM_Key (0), so the
                    // records are looked at, not dropped for the key.
                    if k < 4 && len >= 44 {
                        m[36..44].fill(0);
                    }
                }
                fed.mads += 1;
                let owes = qp == QP_GSI && sa_owes_answer(&m, 0) && sm.state() == SmState::Master;
                let tid = m.get(8..16).map(<[u8]>::to_vec);
                sm.handle_mad(now, from, qp, &m);
                let mut answered = false;
                while let Some(o) = sm.poll_transmit() {
                    // Reports and the SM's own requests carry its TIDs;
                    // an answer carries the request's.
                    let reply = o.to == from
                        && o.qp == QP_GSI
                        && qp == QP_GSI
                        && tid.as_deref() == Some(&o.mad[8..16]);
                    if reply {
                        assert!(
                            owes && sm.state() == SmState::Master,
                            "an answer to a MAD that wants none: {:02x?}",
                            &m[..len.min(24)]
                        );
                        assert_ne!(o.mad[3] & 0x80, 0, "the answer's method is a response");
                        answered = true;
                    }
                }
                assert!(!owes || answered, "no answer to {:02x?}", &m[..24]);
                fed.answered += usize::from(answered);
            }
        }
    }
    fed
}
