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
    rdma_testkit::fuzz::seeds(env!("CARGO_MANIFEST_DIR"), "frame")
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
    rdma_testkit::fuzz::mutated(&seeds(), 20_000, 0x2701_2701, nicd::fuzz::frame);
}

/// A daemon that makes up error texts: past the client's cap each new one
/// decodes as the one overflow text (memory stays bounded), texts kept
/// before still decode as sent, and the fuzz body accepts the one lossy
/// decoding (the crash CI found once the fuzzer had made up 4096 texts).
#[test]
fn made_up_error_texts_stop_being_kept_at_the_cap() {
    use verbs::VerbsError;
    let busy = |text: String| {
        let f = proto::frame(
            Kind::Response,
            7,
            &Answer::Err(VerbsError::Busy(leak(text))),
        );
        let (_, _, body) = proto::split(&f[4..]).unwrap();
        match proto::decode::<Answer>(body).unwrap() {
            Err(VerbsError::Busy(s)) => (f, s),
            other => panic!("{other:?}"),
        }
    };
    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }
    let (_, first) = busy("text 0".into());
    assert_eq!(first, "text 0");
    let mut overflowed = None;
    for i in 1..5000 {
        let (f, s) = busy(format!("text {i}"));
        if s == proto::TEXTS_OVERFLOW {
            overflowed = Some(f);
            break;
        }
        assert_eq!(s, format!("text {i}"));
    }
    let f = overflowed.expect("the cap is reached within 5000 texts");
    assert_eq!(
        busy("text 0".into()).1,
        "text 0",
        "a kept text still decodes as sent"
    );
    nicd::fuzz::frame(&f[4..]);
}

#[test]
fn ring_entry_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "ring_entry",
        nicd::fuzz::ring_entry,
    );
}

/// Every ring seed decodes (so the target starts inside the format), and
/// the seeds with bytes changed, cut and added never panic the decoder.
#[test]
fn ring_entry_seeds_decode_and_mutations_never_panic() {
    use nicd::ring::decode_entry;
    use verbs::{RecvWr, SendWr, WorkCompletion};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/ring_entry");
    let mut all: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    all.sort();
    assert!(all.len() >= 4);
    for s in &all {
        let ok = match s[0] {
            0 => decode_entry::<SendWr>(&s[1..]).is_ok(),
            1 => decode_entry::<RecvWr>(&s[1..]).is_ok(),
            _ => decode_entry::<WorkCompletion>(&s[1..]).is_ok(),
        };
        assert!(ok, "{s:?}");
    }
    let mut x: u64 = 0x4e52_4731;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20_000 {
        let mut f = all[round % all.len()].clone();
        for _ in 0..1 + next() % 4 {
            let at = 1 + (next() as usize) % (f.len() - 1).max(1);
            match next() % 4 {
                0 if at < f.len() => f[at] = next() as u8,
                1 => f.truncate(at),
                2 => f.insert(at.min(f.len()), next() as u8),
                _ if at < f.len() => f[at] ^= 1 << (next() % 8),
                _ => {}
            }
        }
        nicd::fuzz::ring_entry(&f);
    }
}

#[test]
fn qp1_router_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "qp1_router",
        nicd::fuzz::qp1_router,
    );
}

#[test]
fn qp1_router_survives_mutated_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/qp1_router");
    let mut all: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    all.sort();
    assert!(all.len() >= 5);
    let mut x: u64 = 0x9191_0001;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..5_000 {
        let mut f = all[round % all.len()].clone();
        for _ in 0..1 + next() % 8 {
            let at = (next() as usize) % f.len().max(1);
            if !f.is_empty() {
                f[at] = next() as u8;
            }
        }
        nicd::fuzz::qp1_router(&f);
    }
}
