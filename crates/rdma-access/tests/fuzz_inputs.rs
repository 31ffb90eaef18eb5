//! The fuzz targets' committed seeds and regression inputs, replayed
//! (their pseudo-random twins are unit tests of `gsi` and `sa`).

/// The `dispatcher` target's committed seeds and regression inputs
/// (`fuzz/seeds/dispatcher`, `fuzz/regressions/dispatcher`).
#[test]
fn dispatcher_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "dispatcher", |data| {
        rdma_access::gsi::fuzz_dispatch(data);
    });
}

/// The `answers` target's committed seeds and regression inputs
/// (`fuzz/seeds/answers`, `fuzz/regressions/answers`).
#[test]
fn answers_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "answers", |data| {
        rdma_access::sa::fuzz_answers(data);
    });
}
