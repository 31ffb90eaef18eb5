//! Runs every fuzz target's body over a few thousand deterministic inputs:
//! the capture frames, flipped, overwritten, truncated and extended, with
//! and without their checksums repaired (so mutations also get past the
//! IPv4 checksum and ICRC and reach the round trip), plus random bytes.
//! Errors are fine; a panic fails the test. `RDMA_WIRE_FUZZ_RUNS=N`
//! scales every loop to N inputs for a longer local run.

use rdma_wire::{fuzz, icrc};

mod common;

/// Inputs per loop: the default, or `RDMA_WIRE_FUZZ_RUNS`.
fn runs(default: usize) -> usize {
    std::env::var("RDMA_WIRE_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One capture frame per opcode and IP version keeps the run short.
fn seeds() -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    common::all_frames()
        .into_iter()
        .map(|(_, _, b)| b)
        .filter(|b| seen.insert((b[12], b[if b[12] == 0x08 { 42 } else { 62 }])))
        .collect()
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => {
                let n = rng.below(b.len() + 1);
                b.truncate(n);
            }
            3 => {
                let n = rng.below(8);
                b.extend((0..n).map(|_| rng.next() as u8));
            }
            4 if b.len() > 42 => {
                // Aim at the IB headers: BTH opcode, pad count, first ext byte.
                let i = 42 + [0, 1, 12, 13].get(rng.below(4)).copied().unwrap_or(0);
                if i < b.len() {
                    b[i] = rng.next() as u8;
                }
            }
            _ => {}
        }
    }
    b
}

/// Makes the IPv4 header checksum and the ICRC right again, where the
/// frame's shape still allows it.
fn repair(b: &mut [u8]) {
    if b.len() < 14 + 48 + 4 {
        return;
    }
    let ip = &mut b[14..];
    if ip[0] == 0x45 {
        let mut p = rdma_wire::Ipv4Packet::new_unchecked(&mut ip[..]);
        p.fill_checksum();
    }
    let ip_len = match ip[0] >> 4 {
        4 => usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        6 => 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
        _ => return,
    };
    if ip_len > ip.len() {
        return;
    }
    if let Ok(c) = icrc::compute_ip_packet(&ip[..ip_len]) {
        icrc::write_trailer(&mut ip[..ip_len], c);
    }
}

/// Runs every body on a frame and on its slices; returns how many parsed.
fn run_all(b: &[u8]) -> [bool; 6] {
    let ip = b.get(14..).unwrap_or(&[]);
    let ib_off = if b.get(12) == Some(&0x86) { 62 } else { 42 };
    let ib = b.get(ib_off..).unwrap_or(&[]);
    [
        fuzz::roce_frame(b),
        fuzz::ip_udp(ip),
        fuzz::icrc(ip),
        fuzz::ib_packet(ib),
        fuzz::bth(ib),
        fuzz::ext(ib.get(12..).unwrap_or(&[])),
    ]
}

#[test]
fn mutated_capture_frames_never_panic() {
    let seeds = seeds();
    assert!(seeds.len() >= 10, "one seed per opcode and IP version");
    let mut rng = Rng(0x005E_ED0F_D00D);
    let mut parsed = [0usize; 6];
    let runs = runs(6000);
    for i in 0..runs {
        let seed = &seeds[rng.below(seeds.len())];
        let mut b = mutate(&mut rng, seed);
        if i % 2 == 0 {
            repair(&mut b);
        }
        for (n, ok) in parsed.iter_mut().zip(run_all(&b)) {
            *n += usize::from(ok);
        }
    }
    eprintln!("parsed per body (of {runs}): {parsed:?}");
    // Every body got past its parser many times, so the round trips ran.
    for (name, n) in ["roce_frame", "ip_udp", "icrc", "ib_packet", "bth", "ext"]
        .iter()
        .zip(parsed)
    {
        assert!(
            n > runs / 20,
            "{name}: only {n} of {runs} mutated inputs parsed"
        );
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(42);
    for _ in 0..runs(4000) {
        let len = rng.below(200);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Half the time, look like IPv4 or IPv6 in Ethernet so parsers get further.
        if len > 20 && rng.below(2) == 0 {
            b[12] = 0x08;
            b[13] = 0x00;
            b[14] = 0x45;
        }
        run_all(&b);
    }
}

/// The socket receive path: capture IB parts (BTH through ICRC) behind a
/// selector byte, mutated, the ICRC recomputed for the assumed headers on
/// half of them so mutations reach the round trip.
#[test]
fn mutated_datagrams_never_panic() {
    let seeds: Vec<Vec<u8>> = seeds()
        .into_iter()
        .map(|f| f[if f[12] == 0x86 { 62 } else { 42 }..].to_vec())
        .collect();
    let mut rng = Rng(7);
    let mut parsed = 0;
    let runs = runs(4000);
    for i in 0..runs {
        let mut b = vec![rng.next() as u8];
        let seed = &seeds[rng.below(seeds.len())];
        b.extend(mutate(&mut rng, seed));
        if i % 2 == 0 && b.len() >= 1 + 12 + 4 {
            let (ip, udp) = fuzz::datagram_headers(b[0]);
            let end = b.len() - 4;
            if let Ok(c) = icrc::compute(&ip, &udp, &b[1..end]) {
                icrc::write_trailer(&mut b[1..], c);
            }
        }
        parsed += usize::from(fuzz::datagram(&b));
    }
    assert!(
        parsed > runs / 20,
        "only {parsed} of {runs} mutated datagrams parsed"
    );
}

/// The `bth` target's committed seeds and regression inputs
/// (`fuzz/seeds/bth`, `fuzz/regressions/bth`).
#[test]
fn bth_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "bth", |data| {
        fuzz::bth(data);
    });
}

/// The `ext` target's committed seeds and regression inputs
/// (`fuzz/seeds/ext`, `fuzz/regressions/ext`).
#[test]
fn ext_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "ext", |data| {
        fuzz::ext(data);
    });
}

/// The `ip_udp` target's committed seeds and regression inputs
/// (`fuzz/seeds/ip_udp`, `fuzz/regressions/ip_udp`).
#[test]
fn ip_udp_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "ip_udp", |data| {
        fuzz::ip_udp(data);
    });
}

/// The `ib_packet` target's committed seeds and regression inputs
/// (`fuzz/seeds/ib_packet`, `fuzz/regressions/ib_packet`).
#[test]
fn ib_packet_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "ib_packet", |data| {
        fuzz::ib_packet(data);
    });
}

/// The `icrc` target's committed seeds and regression inputs
/// (`fuzz/seeds/icrc`, `fuzz/regressions/icrc`).
#[test]
fn icrc_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "icrc", |data| {
        fuzz::icrc(data);
    });
}

/// The `roce_frame` target's committed seeds and regression inputs
/// (`fuzz/seeds/roce_frame`, `fuzz/regressions/roce_frame`).
#[test]
fn roce_frame_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "roce_frame", |data| {
        fuzz::roce_frame(data);
    });
}

/// The `datagram` target's committed seeds and regression inputs
/// (`fuzz/seeds/datagram`, `fuzz/regressions/datagram`).
#[test]
fn datagram_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "datagram", |data| {
        fuzz::datagram(data);
    });
}
