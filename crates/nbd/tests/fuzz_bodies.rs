//! Runs each fuzz target's body over a few thousand deterministic inputs
//! (valid messages, then mutated), so CI exercises them without nightly.

mod common;

use common::Rng;

/// Flips, overwrites, truncates or extends `seed` at random.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] = [0, 0xff, 0x7f, 0x80, rng.next() as u8][rng.below(5) as usize];
            }
            2 => v.truncate(rng.below(v.len() as u64 + 1) as usize),
            3 => v.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
            _ => {}
        }
    }
    v
}

fn request(flags: u16, command: u16, offset: u64, length: u32, payload: usize) -> Vec<u8> {
    let mut v = 0x2560_9513u32.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&command.to_be_bytes());
    v.extend_from_slice(&42u64.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&length.to_be_bytes());
    v.extend(std::iter::repeat_n(0xa5, payload));
    v
}

#[test]
fn requests_body() {
    let seeds: Vec<Vec<u8>> = vec![
        [request(0, 1, 100, 1000, 1000), request(0, 0, 0, 8192, 0)].concat(),
        [
            request(1, 6, 511, 3000, 0),
            request(2, 6, 0, 512, 0),
            request(0, 4, 0, 8192, 0),
        ]
        .concat(),
        [request(0, 3, 0, 0, 0), request(0, 2, 0, 0, 0)].concat(),
        request(0, 0, 8190, 4, 0),
        request(0, 1, 0, 1 << 25, 64),
        request(0, 7, 0, 512, 0),
    ];
    let mut rng = Rng(0x5eed_0001);
    for seed in &seeds {
        nbd::fuzz::requests(seed);
    }
    for _ in 0..4000 {
        let seed = &seeds[rng.below(seeds.len() as u64) as usize];
        nbd::fuzz::requests(&mutate(&mut rng, seed));
    }
    for _ in 0..500 {
        let junk: Vec<u8> = (0..rng.below(200)).map(|_| rng.next() as u8).collect();
        nbd::fuzz::requests(&junk);
    }
}

fn option(code: u32, data: &[u8]) -> Vec<u8> {
    let mut v = b"IHAVEOPT".to_vec();
    v.extend_from_slice(&code.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn handshake_body() {
    let go = [0, 0, 0, 3, b'l', b'u', b'n', 0, 2, 0, 3, 0, 1];
    let seeds: Vec<Vec<u8>> = vec![
        [&[0, 0, 0, 3][..], &option(7, &go)].concat(),
        [
            &[0, 0, 0, 1][..],
            &option(8, &[]),
            &option(6, &[0, 0, 0, 0, 0, 0]),
            &option(3, &[]),
            &option(1, b"lun"),
        ]
        .concat(),
        [&[0, 0, 0, 3][..], &option(1, b"")].concat(),
        [&[0, 0, 0, 1][..], &option(9, &[1, 2]), &option(2, &[])].concat(),
    ];
    let mut rng = Rng(0x5eed_0002);
    for seed in &seeds {
        nbd::fuzz::handshake(seed);
    }
    for _ in 0..4000 {
        let seed = &seeds[rng.below(seeds.len() as u64) as usize];
        nbd::fuzz::handshake(&mutate(&mut rng, seed));
    }
    for _ in 0..200 {
        nbd::fuzz::go_data(&mutate(&mut rng, &go));
    }
}

/// The `requests` target's committed seeds and regression inputs
/// (`fuzz/seeds/requests`, `fuzz/regressions/requests`).
#[test]
fn requests_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "requests", |data| {
        nbd::fuzz::requests(data);
    });
}

/// The `handshake` target's committed seeds and regression inputs
/// (`fuzz/seeds/handshake`, `fuzz/regressions/handshake`).
#[test]
fn handshake_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "handshake", |data| {
        nbd::fuzz::handshake(data);
    });
}

/// The `go_data` target's committed seeds and regression inputs
/// (`fuzz/seeds/go_data`, `fuzz/regressions/go_data`).
#[test]
fn go_data_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "go_data", |data| {
        nbd::fuzz::go_data(data);
    });
}
