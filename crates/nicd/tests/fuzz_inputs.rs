//! The fuzz target's committed seeds and regression inputs replayed
//! (`fuzz/seeds/frame`, `fuzz/regressions/frame`), every seed a frame
//! that decodes (so the target starts inside the format), and a
//! pseudo-random loop of the seeds with bytes changed, cut and added.

use nicd::proto::{self, Answer, Event, Kind, Request};
use std::path::Path;

#[test]
fn frame_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "frame", nicd::fuzz::frame);
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/frame");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn every_seed_is_a_frame_that_decodes() {
    let all = seeds();
    assert!(all.len() >= 10);
    for s in all {
        let (kind, _, body) = proto::split(&s).unwrap();
        let ok = match kind {
            Kind::Request => proto::decode::<Request>(body).is_ok(),
            Kind::Response => proto::decode::<Answer>(body).is_ok(),
            Kind::Event => proto::decode::<Event>(body).is_ok(),
        };
        assert!(ok, "{s:?}");
    }
}

#[test]
fn mutated_seeds_never_panic() {
    let mut x: u64 = 0x2701_2701;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let all = seeds();
    for round in 0..20_000 {
        let mut f = all[round % all.len()].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % f.len().max(1);
            match next() % 4 {
                0 if !f.is_empty() => f[at] = next() as u8,
                1 => f.truncate(at),
                2 => f.insert(at.min(f.len()), next() as u8),
                _ if !f.is_empty() => f[at] ^= 1 << (next() % 8),
                _ => {}
            }
        }
        nicd::fuzz::frame(&f);
    }
}
