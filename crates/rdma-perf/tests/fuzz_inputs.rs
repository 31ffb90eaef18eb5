//! The fuzz target's committed seeds and regression inputs replayed
//! (`fuzz/seeds/peer_messages`, `fuzz/regressions/peer_messages`), every
//! seed a message its parser takes (so the target starts inside the
//! formats), and a pseudo-random loop of the seeds with bytes changed,
//! cut and added.

use rdma_perf::{perftest, pingpong, rping};
use std::path::Path;

#[test]
fn peer_messages_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "peer_messages",
        rdma_perf::fuzz::peer_messages,
    );
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/peer_messages");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn every_seed_is_a_message_its_parser_takes() {
    let all = seeds();
    assert!(all.len() >= 5);
    let mut kinds = [false; 5];
    for s in all {
        let (which, msg) = s.split_first().unwrap();
        let ok = match which % 5 {
            0 => perftest::parse_version(msg).is_ok(),
            1 => perftest::Dest::from_msg(msg).is_ok(),
            2 => perftest::Dest::from_bin(msg).is_ok(),
            3 => pingpong::Dest::from_msg(msg).is_ok(),
            _ => rping::parse_info(msg).is_some(),
        };
        assert!(ok, "{s:?}");
        kinds[(which % 5) as usize] = true;
    }
    assert_eq!(kinds, [true; 5], "a seed for every parser");
}

#[test]
fn mutated_seeds_never_panic() {
    let all = seeds();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let mut m = all[(next() % all.len() as u64) as usize].clone();
        for _ in 0..=next() % 4 {
            match next() % 4 {
                0 if m.len() > 1 => {
                    let i = 1 + (next() % (m.len() as u64 - 1)) as usize;
                    m[i] = next() as u8;
                }
                1 => m.truncate((next() % (m.len() as u64 + 1)) as usize),
                2 => m.push(next() as u8),
                _ => {}
            }
        }
        rdma_perf::fuzz::peer_messages(&m);
    }
}
