//! Deterministic runs of the fuzz bodies (CI has no nightly for cargo-fuzz).

use crate::fuzz::{parse_all, rmpp_round_trip};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let text = include_str!("../../../testdata/mad/cm_mads.hex");
    let mut v: Vec<Vec<u8>> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().nth(3))
        .map(|h| {
            (0..h.len() / 2)
                .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    let mut smp = vec![0u8; 256];
    smp[0] = 1;
    smp[1] = 0x81;
    v.push(smp);
    v
}

#[test]
fn fuzz_parse_all_deterministic() {
    let seeds = seeds();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..6000 {
        let mut input = seeds[i % seeds.len()].clone();
        let flips = 1 + rng.next() % 16;
        for _ in 0..flips {
            let r = rng.next();
            let pos = (r % input.len() as u64) as usize;
            input[pos] = (r >> 32) as u8;
        }
        if i % 7 == 0 {
            input.truncate((rng.next() % 257) as usize);
        }
        if i % 11 == 0 && input.len() > 1 {
            input[1] = [0x01, 0x03, 0x06, 0x07, 0x81][i % 5];
        }
        parse_all(&input);
    }
}

#[test]
fn fuzz_rmpp_deterministic() {
    let mut rng = Rng(42);
    for i in 0..2000 {
        let len = (rng.next() % 1200) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut segs = crate::rmpp::segment(&[0u8; 56], 56, &data, 0)
            .unwrap()
            .concat();
        if i % 2 == 0 {
            let pos = (rng.next() % segs.len() as u64) as usize;
            segs[pos] = rng.next() as u8;
        }
        rmpp_round_trip(&segs);
        rmpp_round_trip(&segs[..(rng.next() as usize % (segs.len() + 1))]);
    }
}

/// The `mad_parse` target's committed seeds and regression inputs
/// (`fuzz/seeds/mad_parse`, `fuzz/regressions/mad_parse`).
#[test]
fn mad_parse_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "mad_parse", |data| {
        parse_all(data);
    });
}

/// The `rmpp_reassemble` target's committed seeds and regression inputs
/// (`fuzz/seeds/rmpp_reassemble`, `fuzz/regressions/rmpp_reassemble`).
#[test]
fn rmpp_reassemble_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "rmpp_reassemble", |data| {
        rmpp_round_trip(data);
    });
}
