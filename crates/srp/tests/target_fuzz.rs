//! Runs the body of the `target_session` fuzz target
//! (`fuzz/target_session_body.rs`) over deterministic pseudo-random and
//! structured scripts, so CI exercises it without nightly or cargo-fuzz.

include!("../fuzz/target_session_body.rs");

/// xorshift64*: small and deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

fn add(total: &mut Reached, r: Reached) {
    total.scsi += r.scsi;
    total.rdma += r.rdma;
    total.tables += r.tables;
    total.rsps += r.rsps;
    total.tmfs += r.tmfs;
    total.logouts += r.logouts;
}

#[test]
fn random_scripts() {
    let mut rng = Rng(0x5eed_0007);
    let mut total = Reached::default();
    for _ in 0..10_000 {
        let n = (rng.next() % 600) as usize;
        let data: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
        add(&mut total, run_target_session(&data));
    }
    eprintln!("random: {total:?}");
    assert!(
        total.scsi > 100 && total.rsps > 100 && total.logouts > 100,
        "{total:?}"
    );
}

/// Scripts biased towards the paths that matter: commands, completions in
/// order, SCSI results, TMFs; with the occasional raw IU or failure.
#[test]
fn structured_scripts() {
    let mut rng = Rng(0xfeed_beef);
    let mut total = Reached::default();
    for _ in 0..10_000 {
        let mut data: Vec<u8> = (0..5).map(|_| rng.byte()).collect();
        for _ in 0..(rng.next() % 80) {
            let op = match rng.next() % 20 {
                0..=4 => 1,
                5..=11 => 4,
                12..=14 => 8,
                15 => 3,
                16 => 9,
                17 => 0,
                18 => 7,
                _ => 10 + (rng.next() % 2) as u8,
            };
            data.push(op);
            for _ in 0..(rng.next() % 12) {
                data.push(rng.byte());
            }
        }
        add(&mut total, run_target_session(&data));
    }
    eprintln!("structured: {total:?}");
    for (what, n) in [
        ("SCSI commands", total.scsi),
        ("RDMA ops", total.rdma),
        ("table reads", total.tables),
        ("responses", total.rsps),
        ("TMFs", total.tmfs),
        ("T_LOGOUTs", total.logouts),
    ] {
        assert!(n > 50, "only {n} {what}: {total:?}");
    }
}

#[test]
fn empty_and_tiny_inputs() {
    let _ = run_target_session(&[]);
    for b in 0..=255u8 {
        let _ = run_target_session(&[b]);
        let _ = run_target_session(&[0, 0, 0, 0, 0, b]);
    }
}

/// The `target_session` target's committed seeds and regression inputs
/// (`fuzz/seeds/target_session`, `fuzz/regressions/target_session`).
#[test]
fn target_session_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "target_session", |data| {
        let _ = run_target_session(data);
    });
}
