//! Hostile MADs against the SM/SA and the SMA, deterministic: random bytes,
//! random SA requests, and bit-flipped copies of real traffic from a
//! simulated sweep. Nothing panics; every SA request the SA accepts as one
//! (base version 1, class SA, a request method that wants an answer) gets
//! an answer with its own transaction ID, and nothing else does; the fabric
//! still answers a path query afterwards.

use ib_sm::sim::{addr, all_active, fabric, host, run_query, sm};
use ib_sm::sm::{QP_GSI, QP_SMI};
use rdma_access::gsi::MadBytes;
use rdma_mad::sa::SaAttr;
use rdma_sim::Rng;
use rdma_types::Duration;

const HOSTS: u8 = 3;

/// Does the SA owe `m` an answer?
fn wants_answer(m: &[u8]) -> bool {
    // The fabric's SM has SM_Key 0.
    ib_sm::fuzz::sa_owes_answer(m, 0)
}

#[test]
fn the_sm_and_sa_survive_hostile_mads_and_answer_each_request_once() {
    let mut sim = fabric(21, 0.0, None, HOSTS).unwrap();
    assert_eq!(
        sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS)),
        rdma_sim::RunOutcome::Done
    );
    let real: Vec<(u8, MadBytes)> = sm(&mut sim).log.clone();
    assert!(real.len() > 10);
    let mut rng = Rng::new(0x5eed);
    let from = addr(3);
    let now = sim.now();
    let (mut answered, mut owed) = (0u64, 0u64);
    for i in 0..6000u64 {
        let (qp, bytes): (u8, Vec<u8>) = match i % 3 {
            0 => {
                let len = rng.below(300) as usize;
                let mut b = vec![0u8; len];
                rng.fill(&mut b);
                (rng.below(2) as u8, b)
            }
            1 => {
                // A plausible SA request with random everything after the class.
                let mut b = vec![0u8; 256];
                rng.fill(&mut b);
                b[0] = 1;
                b[1] = 0x03;
                b[2] = if rng.chance(0.9) {
                    2
                } else {
                    rng.below(256) as u8
                };
                let methods = [
                    0x01u8, 0x02, 0x03, 0x05, 0x06, 0x12, 0x14, 0x15, 0x81, 0x92, 0x7f,
                ];
                b[3] = methods[rng.below(methods.len() as u64) as usize];
                // Mostly an ordinary client's SM_Key (0): a random one is
                // dropped before the records are looked at.
                if rng.chance(0.95) {
                    b[36..44].fill(0);
                }
                let attrs = [0x0011u16, 0x0012, 0x0035, 0x0003, 0x0031, 0x0002, 0xffff];
                let a = attrs[rng.below(attrs.len() as u64) as usize];
                b[16..18].copy_from_slice(&a.to_be_bytes());
                (QP_GSI, b)
            }
            _ => {
                let (qp, m) = real[rng.below(real.len() as u64) as usize];
                let mut b = m.to_vec();
                for _ in 0..=rng.below(8) {
                    let bit = rng.below(256 * 8) as usize;
                    b[bit / 8] ^= 1 << (bit % 8);
                }
                (qp, b)
            }
        };
        let tid = bytes.get(8..16).map(|t| t.to_vec());
        let owes = qp == QP_GSI && wants_answer(&bytes);
        let s = &mut sm(&mut sim).sm;
        s.handle_mad(now, from, qp, &bytes);
        let mut out = Vec::new();
        while let Some(o) = s.poll_transmit() {
            out.push(o);
        }
        if owes {
            owed += 1;
            assert!(
                !out.is_empty(),
                "request {i} got no answer: {:02x?}",
                &bytes[..24]
            );
            for o in &out {
                assert_eq!(o.to, from);
                assert_eq!(Some(o.mad[8..16].to_vec()), tid, "request {i}: TID");
                assert_ne!(o.mad[3] & 0x80, 0, "request {i}: a response method");
            }
            answered += 1;
        } else if qp == QP_GSI {
            assert!(
                out.iter().all(|o| o.to != from || o.qp != QP_GSI),
                "input {i} wanted no answer but got one: {:02x?}",
                &bytes[..bytes.len().min(24)]
            );
        }
    }
    assert!(owed > 1000, "the inputs reached the SA ({owed})");
    assert_eq!(answered, owed);
    // Still a working SA.
    let mut q = [0u8; 64];
    q[8..24].copy_from_slice(&ib_sm::sim::gid(4).0);
    let segs = run_query(
        &mut sim,
        3,
        0x01,
        SaAttr::PathRecord,
        ib_sm::sm::path_comp::DGID,
        &q,
    )
    .expect("the SA still answers");
    assert_eq!(u16::from_be_bytes([segs[0][4], segs[0][5]]), 0);
}

#[test]
fn the_sma_survives_hostile_smps() {
    let mut sim = fabric(22, 0.0, None, HOSTS).unwrap();
    assert_eq!(
        sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS)),
        rdma_sim::RunOutcome::Done
    );
    let smps: Vec<MadBytes> = sm(&mut sim)
        .log
        .iter()
        .filter(|(qp, _)| *qp == QP_SMI)
        .map(|(_, m)| *m)
        .collect();
    let mut rng = Rng::new(0xbeef);
    let h = host(&mut sim, 2);
    let mut answered = 0;
    for i in 0..5000u64 {
        let mut b = if i % 2 == 0 {
            smps[rng.below(smps.len() as u64) as usize].to_vec()
        } else {
            let mut b = vec![0u8; rng.below(300) as usize];
            rng.fill(&mut b);
            b
        };
        for _ in 0..=rng.below(6) {
            if !b.is_empty() {
                let bit = rng.below(b.len() as u64 * 8) as usize;
                b[bit / 8] ^= 1 << (bit % 8);
            }
        }
        let t = rdma_types::Instant::ZERO + Duration::from_millis(i * 10);
        if let Some((r, _)) = h.sma.handle(t, &b) {
            answered += 1;
            assert_ne!(r[3] & 0x80, 0, "answers are responses");
            assert_eq!(&r[8..16], &b[8..16], "same TID");
        }
    }
    assert!(answered > 500, "{answered}");
    // Whatever the Sets did, the port kept a coherent state.
    assert!((1..=4).contains(&h.sma.port_state()));
}

/// The `sm_input` fuzz target's body over deterministic inputs: random
/// bytes, and inputs built from real MADs of a simulated sweep.
#[test]
fn sm_input_fuzz_body_runs_clean() {
    let mut sim = fabric(22, 0.0, None, HOSTS).unwrap();
    sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS));
    let real: Vec<(u8, MadBytes)> = sm(&mut sim).log.clone();
    let mut rng = Rng::new(0xf022);
    let (mut fed, mut answered) = (0, 0);
    for i in 0..1500u64 {
        let mut data = vec![0u8; 2 + rng.below(2000) as usize];
        rng.fill(&mut data);
        if i % 2 == 0 {
            // Splice real MADs in where a body would start.
            let (qp, m) = real[rng.below(real.len() as u64) as usize];
            let at = 2.min(data.len());
            let mut spliced = data[..at].to_vec();
            spliced.extend_from_slice(&[1, qp, 0]);
            spliced.extend_from_slice(&m[..]);
            spliced.extend_from_slice(&data[at..]);
            data = spliced;
        }
        let f = ib_sm::fuzz::sm_input(&data);
        fed += f.mads;
        answered += f.answered;
    }
    println!("{fed} MADs fed, {answered} SA requests answered");
    assert!(fed > 5000, "the inputs reached the SM ({fed} MADs)");
    assert!(
        answered > 300,
        "the inputs reached the SA ({answered} answers)"
    );
}

/// The `sm_input` target's committed seeds and regression inputs
/// (`fuzz/seeds/sm_input`, `fuzz/regressions/sm_input`).
#[test]
fn sm_input_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "sm_input", |data| {
        ib_sm::fuzz::sm_input(data);
    });
}
