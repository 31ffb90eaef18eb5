//! What `rperftest atomic` sends and what it expects back, as pure values:
//! the requester's model of the responder's 8-byte slots, used by the
//! client to check every returned value as its completion arrives and by
//! our server to check its slots once the client is done.
//!
//! perftest (`ctx_set_send_reg_wqes`, `perftest_resources.h`) sends
//! FETCH_AND_ADD with add value 1 (`ATOMIC_ADD_VALUE`) and CMP_AND_SWAP
//! with compare 0 and swap 0 (`ATOMIC_SWAP_VALUE`, the compare left zero),
//! 8 bytes each; its buffers start random, so against a Linux responder
//! the first value returned from a slot is its initial value and every
//! later one follows from it (IBA 9.4.5: the responder returns the value
//! before the operation, and executes an RC QP's atomics in PSN order).
//!
//! Between two of our tools the initial values are known (our pattern),
//! so every returned value is checked exactly, and CMP_AND_SWAP makes real
//! swaps ("chained"): the compare is the value the slot holds after the
//! operations posted before it, except every fourth visit, whose compare
//! is off by one bit and must leave the slot alone; each swap value is
//! distinct. perftest's compare 0 would never match our pattern, so it
//! would never swap at all.

use std::collections::VecDeque;

/// The atomic operation (perftest's `-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicOp {
    /// Fetch-and-add of 1 (`IBV_WR_ATOMIC_FETCH_AND_ADD`).
    #[value(name = "FETCH_AND_ADD")]
    FetchAdd,
    /// Compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`).
    #[value(name = "CMP_AND_SWAP")]
    CmpSwap,
}

impl AtomicOp {
    /// perftest's name (`atomicTypesStr`).
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::FetchAdd => "FETCH_AND_ADD",
            AtomicOp::CmpSwap => "CMP_AND_SWAP",
        }
    }

    /// The other one.
    pub fn other(self) -> AtomicOp {
        match self {
            AtomicOp::FetchAdd => AtomicOp::CmpSwap,
            AtomicOp::CmpSwap => AtomicOp::FetchAdd,
        }
    }
}

/// perftest's add value.
pub const ADD_VALUE: u64 = 1;
/// perftest's swap value (its compare is 0 too).
pub const SWAP_VALUE: u64 = 0;
/// Bytes of an atomic's target and result.
pub const ATOMIC_SIZE: usize = 8;
/// High bits of our chained swap values (the low bits are the message
/// number), so each swap writes a value the slot never held.
const SWAP_TAG: u64 = 0x5eed_0000_0000_0000;

/// The compare, add or swap operands of one work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operands {
    /// `compare_add` of the work request.
    pub compare_add: u64,
    /// `swap` of the work request.
    pub swap: u64,
}

/// What one posted atomic must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Exactly this value.
    Exact(u64),
    /// The slot's first returned value plus this (unknown initial value).
    FromFirst(u64),
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The value after every posted operation, when the initial is known.
    now: Option<u64>,
    /// The first value returned (unknown initial value).
    first: Option<u64>,
    /// Operations posted to it.
    visits: u64,
    /// CMP_AND_SWAPs whose compare matches.
    swaps: u64,
}

/// A returned atomic value the model does not predict, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtomicCheckError {
    #[error("a completion for an atomic that was never posted")]
    NeverPosted,
    /// Operation `k` on `slot` returned `got`; `why` says what `want` is.
    #[error("{op} {k} (slot {slot}) returned {got:#018x}, expected {want:#018x}: {why}")]
    Mismatch {
        op: &'static str,
        k: u64,
        slot: usize,
        got: u64,
        want: u64,
        why: &'static str,
    },
}

/// The requester's model of the responder's slots.
#[derive(Debug, Clone)]
pub struct AtomicModel {
    op: AtomicOp,
    chained: bool,
    slots: Vec<Slot>,
    /// Posted, not yet completed: (message, slot, expectation), in order.
    pending: VecDeque<(u64, usize, Expect)>,
    posted: u64,
    completed: u64,
}

impl AtomicModel {
    /// A model of `initial.len()` slots. `initial` holds each slot's value
    /// when known (our own server's pattern), `None` otherwise (a Linux
    /// peer). `chained` asks for real swaps (both sides ours; needs known
    /// initial values).
    pub fn new(op: AtomicOp, chained: bool, initial: &[Option<u64>]) -> AtomicModel {
        AtomicModel {
            op,
            chained: chained && op == AtomicOp::CmpSwap,
            slots: initial
                .iter()
                .map(|&now| Slot {
                    now,
                    ..Slot::default()
                })
                .collect(),
            pending: VecDeque::new(),
            posted: 0,
            completed: 0,
        }
    }

    /// The operands of the next message, which targets `slot`; remembers
    /// what it must return.
    ///
    /// # Panics
    /// If `slot` is out of range, or a chained model lacks the slot's
    /// initial value (both are caller bugs).
    pub fn post(&mut self, slot: usize) -> Operands {
        let k = self.posted;
        self.posted += 1;
        let s = &mut self.slots[slot];
        let visit = s.visits;
        s.visits += 1;
        let (ops, expect) = match (self.op, s.now) {
            (AtomicOp::FetchAdd, Some(v)) => {
                s.now = Some(v.wrapping_add(ADD_VALUE));
                (fetch_add(), Expect::Exact(v))
            }
            (AtomicOp::FetchAdd, None) => (fetch_add(), Expect::FromFirst(visit * ADD_VALUE)),
            (AtomicOp::CmpSwap, now) if self.chained => {
                let v = now.expect("a chained model knows every initial value");
                let compare = if visit % 4 == 3 { v ^ 1 } else { v };
                let swap = SWAP_TAG | k;
                if compare == v {
                    s.now = Some(swap);
                    s.swaps += 1;
                }
                (
                    Operands {
                        compare_add: compare,
                        swap,
                    },
                    Expect::Exact(v),
                )
            }
            // perftest's compare 0, swap 0: the slot keeps its value (a
            // zero swapped for zero is no change either).
            (AtomicOp::CmpSwap, Some(v)) => (cmp_swap(), Expect::Exact(v)),
            (AtomicOp::CmpSwap, None) => (cmp_swap(), Expect::FromFirst(0)),
        };
        self.pending.push_back((k, slot, expect));
        ops
    }

    /// Checks the value returned by the oldest posted message (atomics
    /// complete in order on an RC QP).
    ///
    /// # Errors
    /// The value differs from the model's, in words; or nothing is posted.
    pub fn complete(&mut self, got: u64) -> Result<(), AtomicCheckError> {
        let (k, slot, expect) = self
            .pending
            .pop_front()
            .ok_or(AtomicCheckError::NeverPosted)?;
        self.completed += 1;
        let s = &mut self.slots[slot];
        let want = match expect {
            Expect::Exact(v) => v,
            Expect::FromFirst(d) => s.first.get_or_insert(got.wrapping_sub(d)).wrapping_add(d),
        };
        if got != want {
            let why = match (self.op, expect) {
                (AtomicOp::FetchAdd, Expect::Exact(_)) => {
                    "the slot's initial value plus 1 per earlier FETCH_AND_ADD"
                }
                (AtomicOp::FetchAdd, Expect::FromFirst(_)) => {
                    "the slot's first returned value plus 1 per earlier FETCH_AND_ADD"
                }
                (AtomicOp::CmpSwap, _) if self.chained => {
                    "the slot's value after the earlier swaps whose compare matched"
                }
                (AtomicOp::CmpSwap, _) => {
                    "the slot's unchanged value (compare 0, swap 0 changes nothing)"
                }
            };
            return Err(AtomicCheckError::Mismatch {
                op: self.op.name(),
                k,
                slot,
                got,
                want,
                why,
            });
        }
        Ok(())
    }

    /// Each slot's value after every posted operation (`None` where the
    /// initial value is unknown and nothing came back yet).
    pub fn values(&self) -> Vec<Option<u64>> {
        self.slots
            .iter()
            .map(|s| {
                s.now.or_else(|| {
                    let add = if self.op == AtomicOp::FetchAdd {
                        ADD_VALUE
                    } else {
                        0
                    };
                    s.first.map(|f| f.wrapping_add(s.visits * add))
                })
            })
            .collect()
    }

    /// Slots visited at least once.
    pub fn slots_used(&self) -> usize {
        self.slots.iter().filter(|s| s.visits > 0).count()
    }

    /// CMP_AND_SWAPs whose compare matched (chained models).
    pub fn swaps(&self) -> u64 {
        self.slots.iter().map(|s| s.swaps).sum()
    }

    /// What the completed messages proved, in words.
    pub fn summary(&self) -> String {
        let (n, used) = (self.completed, self.slots_used());
        let known = self.slots.iter().all(|s| s.visits == 0 || s.now.is_some());
        match (self.op, known) {
            (AtomicOp::FetchAdd, true) => format!(
                "every FETCH_AND_ADD returned its slot's initial value plus 1 per earlier one \
                 ({n} in {used} slot{}, all returned values of a slot distinct)",
                plural(used)
            ),
            (AtomicOp::FetchAdd, false) => format!(
                "every FETCH_AND_ADD returned the value before it on its slot plus 1 \
                 ({n} in {used} slot{}, all returned values of a slot distinct; \
                 each slot now holds its first returned value + visits)",
                plural(used)
            ),
            (AtomicOp::CmpSwap, _) if self.chained => format!(
                "every CMP_AND_SWAP returned its slot's value after the earlier swaps \
                 ({n} in {used} slot{}, {} compares matched and swapped, the rest left the slot alone)",
                plural(used),
                self.swaps()
            ),
            (AtomicOp::CmpSwap, true) => format!(
                "every CMP_AND_SWAP (compare 0, swap 0) returned its slot's unchanged initial value \
                 ({n} in {used} slot{})",
                plural(used)
            ),
            (AtomicOp::CmpSwap, false) => format!(
                "every CMP_AND_SWAP (compare 0, swap 0) of a slot returned the same value as the first \
                 ({n} in {used} slot{})",
                plural(used)
            ),
        }
    }
}

fn fetch_add() -> Operands {
    Operands {
        compare_add: ADD_VALUE,
        swap: 0,
    }
}

fn cmp_swap() -> Operands {
    Operands {
        compare_add: 0,
        swap: SWAP_VALUE,
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The values a responder's slots must hold after `n` messages of `op`
/// from a requester whose model starts at `initial`, message `k` hitting
/// slot `slot_of(k)`.
pub fn final_values(
    op: AtomicOp,
    chained: bool,
    initial: &[u64],
    n: u64,
    slot_of: impl Fn(u64) -> usize,
) -> Vec<u64> {
    let init: Vec<Option<u64>> = initial.iter().copied().map(Some).collect();
    let mut m = AtomicModel::new(op, chained, &init);
    for k in 0..n {
        m.post(slot_of(k));
        m.pending.clear();
    }
    m.values()
        .into_iter()
        .zip(initial)
        .map(|(v, &i)| v.unwrap_or(i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_add_with_known_initials_expects_exact_values() {
        let mut m = AtomicModel::new(AtomicOp::FetchAdd, false, &[Some(10), Some(u64::MAX)]);
        let ops: Vec<Operands> = (0..4).map(|k| m.post(k % 2)).collect();
        assert!(ops.iter().all(|o| o.compare_add == 1 && o.swap == 0));
        // Slot 1 wraps: IBA atomics add modulo 2^64.
        for got in [10, u64::MAX, 11, 0] {
            m.complete(got).unwrap();
        }
        assert_eq!(m.values(), vec![Some(12), Some(1)]);
        m.post(0);
        let e = m.complete(13).unwrap_err().to_string();
        assert!(
            e.contains("FETCH_AND_ADD 4 (slot 0) returned 0x000000000000000d"),
            "{e}"
        );
        assert!(e.contains("expected 0x000000000000000c"), "{e}");
        assert!(m.complete(1).is_err(), "nothing posted");
    }

    #[test]
    fn fetch_add_against_unknown_initials_learns_from_the_first() {
        let mut m = AtomicModel::new(AtomicOp::FetchAdd, false, &[None, None]);
        // Both slots posted twice before anything completes (tx depth > slots).
        for k in 0..4 {
            m.post(k % 2);
        }
        for got in [0xabc, 7, 0xabd, 8] {
            m.complete(got).unwrap();
        }
        assert_eq!(m.values(), vec![Some(0xabe), Some(9)]);
        assert!(m.summary().contains("4 in 2 slots"), "{}", m.summary());
        // A repeated value (an atomic executed twice, or a lost one) fails.
        m.post(0);
        assert!(m.complete(0xabd).is_err());
    }

    #[test]
    fn perftest_cmp_swap_keeps_the_value() {
        let mut m = AtomicModel::new(AtomicOp::CmpSwap, false, &[None]);
        for _ in 0..3 {
            assert_eq!(
                m.post(0),
                Operands {
                    compare_add: 0,
                    swap: 0
                }
            );
        }
        m.complete(0x1234).unwrap();
        m.complete(0x1234).unwrap();
        assert!(m
            .complete(0)
            .unwrap_err()
            .to_string()
            .contains("unchanged value"));
        // The chained flag needs known initial values; without them it
        // is perftest's compare 0, swap 0.
        let mut k = AtomicModel::new(AtomicOp::CmpSwap, false, &[Some(5)]);
        k.post(0);
        k.complete(5).unwrap();
        assert_eq!(k.values(), vec![Some(5)]);
    }

    #[test]
    fn chained_cmp_swap_swaps_three_of_four_visits() {
        let mut m = AtomicModel::new(AtomicOp::CmpSwap, true, &[Some(100)]);
        let ops: Vec<Operands> = (0..5).map(|_| m.post(0)).collect();
        assert_eq!(ops[0].compare_add, 100);
        assert_eq!(ops[1].compare_add, SWAP_TAG);
        assert_eq!(ops[2].compare_add, SWAP_TAG | 1);
        // Fourth visit: compare off by one bit, no swap.
        assert_eq!(ops[3].compare_add, (SWAP_TAG | 2) ^ 1);
        assert_eq!(ops[4].compare_add, SWAP_TAG | 2);
        for got in [100, SWAP_TAG, SWAP_TAG | 1, SWAP_TAG | 2, SWAP_TAG | 2] {
            m.complete(got).unwrap();
        }
        assert_eq!(m.swaps(), 4);
        assert_eq!(m.values(), vec![Some(SWAP_TAG | 4)]);
        assert_eq!(
            final_values(AtomicOp::CmpSwap, true, &[100], 5, |_| 0),
            vec![SWAP_TAG | 4]
        );
        assert!(
            m.summary().contains("4 compares matched"),
            "{}",
            m.summary()
        );
    }

    #[test]
    fn final_values_follow_the_walk() {
        // 64 slots, 200 messages: slots 0..8 visited 4 times, the rest 3.
        let init: Vec<u64> = (0..64).map(|i| i * 1000).collect();
        let f = final_values(AtomicOp::FetchAdd, false, &init, 200, |k| (k % 64) as usize);
        assert_eq!(f[0], 4);
        assert_eq!(f[7], 7000 + 4);
        assert_eq!(f[8], 8000 + 3);
        let same = final_values(AtomicOp::CmpSwap, false, &init, 200, |k| (k % 64) as usize);
        assert_eq!(same, init);
    }

    #[test]
    fn names_are_perftest_s() {
        use clap::ValueEnum;
        assert_eq!(
            AtomicOp::from_str("CMP_AND_SWAP", false),
            Ok(AtomicOp::CmpSwap)
        );
        assert_eq!(
            AtomicOp::from_str("FETCH_AND_ADD", false),
            Ok(AtomicOp::FetchAdd)
        );
        assert_eq!(AtomicOp::FetchAdd.other().name(), "CMP_AND_SWAP");
    }
}
