//! The fuzz target's committed seeds and regression inputs replayed
//! (`fuzz/seeds/peer_messages`, `fuzz/regressions/peer_messages`), every
//! seed a message its parser takes (so the target starts inside the
//! formats), and a pseudo-random loop of the seeds with bytes changed,
//! cut and added.

use rdma_perf::{perftest, pingpong, rping};

#[test]
fn peer_messages_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "peer_messages",
        rdma_perf::fuzz::peer_messages,
    );
}

fn seeds() -> Vec<Vec<u8>> {
    rdma_testkit::fuzz::seeds(env!("CARGO_MANIFEST_DIR"), "peer_messages")
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
    rdma_testkit::fuzz::mutated(
        &seeds(),
        20_000,
        0x9e37_79b9_7f4a_7c15,
        rdma_perf::fuzz::peer_messages,
    );
}
