//! Runs the body of the `initiator_session` fuzz target
//! (`fuzz/initiator_body.rs`) over deterministic pseudo-random and mutated
//! scripts, so CI exercises it without nightly or cargo-fuzz.

include!("../fuzz/initiator_body.rs");

/// xorshift64*: small, deterministic, good enough to pick bytes.
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

/// Hand-written scripts that reach the interesting states: a login
/// accepted with credits, commands, answers, timeouts, task management.
fn seeds() -> Vec<Vec<u8>> {
    let head = [0x03, 3, 64, 5, 0, 0]; // ext sg + immediate, 4 in IU, q 6
    let login = [0, 10, 255, 6, 0x80]; // LOGIN_RSP: 10 credits, big IU, imm
    let mut busy = head.to_vec();
    busy.extend_from_slice(&login);
    busy.extend_from_slice(&[0, 0x11, 8, 4, 8]); // 8 segments: external table
    for i in 0..6u8 {
        busy.extend_from_slice(&[0, 1 + (i % 3), 3 + i, 4]); // submit
    }
    busy.extend_from_slice(&[2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // answer one
    busy.extend_from_slice(&[5, 0, 5, 1]); // send completions
    busy.extend_from_slice(&[6, 255, 6, 255, 4, 3, 1, 0, 0, 0, 0, 5]); // timeout, TMF failed
    busy.extend_from_slice(&[6, 200, 9, 7, 0, 8]); // time, disconnect, relogin
    busy.extend_from_slice(&login);
    busy.extend_from_slice(&[0, 1, 1, 1, 4, 0, 0, 0, 0, 0, 0, 0, 4, 2, 0, 0, 0, 0, 0]);
    let mut quiet = head.to_vec();
    quiet.extend_from_slice(&login);
    quiet.extend_from_slice(&[0, 3, 40, 1, 7, 1, 8, 0, 3, 0, 0, 0x80, 9]);
    vec![busy, quiet, vec![], vec![0xff; 64]]
}

fn add(a: &mut SessionStats, b: SessionStats) {
    a.logins += b.logins;
    a.submitted += b.submitted;
    a.answered += b.answered;
    a.aborted += b.aborted;
    a.reset += b.reset;
    a.failed += b.failed;
    a.tmfs += b.tmfs;
    a.reconnects += b.reconnects;
    a.ext_tables += b.ext_tables;
    a.immediates += b.immediates;
}

#[test]
fn initiator_session_seeds() {
    let mut st = SessionStats::default();
    for s in seeds() {
        add(&mut st, run_initiator_session(&s));
    }
    eprintln!("{st:?}");
    assert!(
        st.logins >= 3 && st.submitted >= 5 && st.answered >= 1,
        "{st:?}"
    );
    assert!(st.tmfs >= 1 && st.ext_tables >= 1, "{st:?}");
}

#[test]
fn initiator_session_mutations() {
    let seeds = seeds();
    let mut rng = Rng(0x5e55_1011_d00d_f00d);
    let mut st = SessionStats::default();
    for i in 0..3000 {
        let mut input = seeds[i % seeds.len()].clone();
        for _ in 0..1 + rng.next() % 8 {
            let at = (rng.next() as usize) % (input.len() + 1);
            match rng.next() % 3 {
                0 if at < input.len() => input[at] = rng.byte(),
                1 => input.insert(at, rng.byte()),
                _ => {
                    let n = (rng.next() % 16) as usize;
                    for _ in 0..n {
                        input.push(rng.byte());
                    }
                }
            }
        }
        add(&mut st, run_initiator_session(&input));
    }
    eprintln!("{st:?}");
    // The mutated scripts reach every outcome, not just the login.
    for (what, n) in [
        ("answered", st.answered),
        ("aborted", st.aborted),
        ("reset", st.reset),
        ("failed", st.failed),
        ("reconnects", st.reconnects),
        ("ext_tables", st.ext_tables),
        ("immediates", st.immediates),
    ] {
        assert!(n > 0, "no run reached {what}: {st:?}");
    }
}

#[test]
fn initiator_session_random() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for _ in 0..2000 {
        let n = (rng.next() % 600) as usize;
        let input: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
        run_initiator_session(&input);
    }
}

/// A longer soak: `cargo test -p srp --test initiator_fuzz -- --ignored`
/// (iterations from `SRP_INITIATOR_FUZZ_ITERS`, default 200 000).
#[test]
#[ignore]
fn initiator_session_soak() {
    let iters: u64 = std::env::var("SRP_INITIATOR_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let seeds = seeds();
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    for i in 0..iters {
        let mut input = seeds[(i as usize) % seeds.len()].clone();
        for _ in 0..1 + rng.next() % 32 {
            let at = (rng.next() as usize) % (input.len() + 1);
            if at < input.len() && rng.next() % 2 == 0 {
                input[at] = rng.byte();
            } else {
                input.insert(at, rng.byte());
            }
        }
        run_initiator_session(&input);
    }
}

/// The `initiator_session` target's committed seeds and regression inputs
/// (`fuzz/seeds/initiator_session`, `fuzz/regressions/initiator_session`).
#[test]
fn initiator_session_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "initiator_session", |data| {
        run_initiator_session(data);
    });
}
