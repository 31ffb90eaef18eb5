//! Runs the body of the `cm_login` fuzz target (`fuzz/cm_login_body.rs`)
//! over deterministic pseudo-random scripts and over its committed seeds
//! and regression inputs, so CI exercises it without cargo-fuzz.

include!("../fuzz/cm_login_body.rs");

#[test]
fn cm_login_holds_its_invariants_on_pseudo_random_scripts() {
    let mut x: u64 = 0x5eed_0022_cafe_f00d;
    let mut total = LoginRun::default();
    for _ in 0..150 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let len = 16 + (x >> 33) as usize % 1200;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let r = run_cm_login(&data);
        total.steps += r.steps;
        total.accepted += r.accepted;
        total.refused += r.refused;
        total.established += r.established;
        total.ended_by_cm += r.ended_by_cm;
        total.closed_by_target += r.closed_by_target;
        total.most_pending = total.most_pending.max(r.most_pending);
    }
    println!("{total:?}");
    assert!(total.steps > 5_000, "{total:?}");
    assert!(total.accepted > 50, "logins accepted: {total:?}");
}

#[test]
fn cm_login_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "cm_login", |data| {
        run_cm_login(data);
    });
}
