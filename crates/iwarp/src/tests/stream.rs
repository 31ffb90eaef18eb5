//! The FPDU receiver over a byte stream cut at random places (seeded), and
//! what it does with corruption.

use rdma_sim::Rng;

use crate::ddp::TAGGED_HEADER_LEN;
use crate::mpa::{self, FpduReceiver};
use crate::TermCause;

/// Random ULPDUs (each at least a tagged header long) and their FPDUs
/// joined into one stream.
fn stream(rng: &mut Rng, count: usize, crc: bool) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut ulpdus = Vec::new();
    let mut bytes = Vec::new();
    for _ in 0..count {
        let span = if rng.chance(0.1) { 9000 } else { 300 };
        let len = TAGGED_HEADER_LEN + rng.below(span) as usize;
        let mut u = vec![0; len];
        rng.fill(&mut u);
        mpa::emit_fpdu(&u, crc, &mut bytes);
        ulpdus.push(u);
    }
    (ulpdus, bytes)
}

/// Feeds `bytes` in random chunks; returns the ULPDUs and the first error.
fn receive(
    rng: &mut Rng,
    rx: &mut FpduReceiver,
    bytes: &[u8],
) -> (Vec<Vec<u8>>, Option<TermCause>) {
    let mut got = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        // Mostly small pieces, sometimes large joins of many FPDUs.
        let max = if rng.chance(0.2) { 20_000 } else { 40 };
        let n = (1 + rng.below(max) as usize).min(bytes.len() - at);
        let mut chunk = &bytes[at..at + n];
        at += n;
        loop {
            match rx.poll(&mut chunk) {
                Ok(Some(u)) => got.push(u.to_vec()),
                Ok(None) => break,
                Err(e) => return (got, Some(e)),
            }
        }
    }
    (got, None)
}

#[test]
fn fpdus_split_and_joined_anywhere() {
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        let crc = seed % 4 != 3;
        let count = 1 + rng.below(40) as usize;
        let (sent, bytes) = stream(&mut rng, count, crc);
        let mut rx = FpduReceiver::new(crc, TAGGED_HEADER_LEN);
        let (got, err) = receive(&mut rng, &mut rx, &bytes);
        assert_eq!(err, None, "seed {seed}");
        assert_eq!(got, sent, "seed {seed}");
        assert!(!rx.mid_fpdu());
    }
}

#[test]
fn one_byte_at_a_time() {
    let mut rng = Rng::new(7);
    let (sent, bytes) = stream(&mut rng, 5, true);
    let mut rx = FpduReceiver::new(true, TAGGED_HEADER_LEN);
    let mut got = Vec::new();
    for b in bytes.chunks(1) {
        let mut c = b;
        while let Some(u) = rx.poll(&mut c).unwrap() {
            got.push(u.to_vec());
        }
    }
    assert_eq!(got, sent);
}

#[test]
fn corruption_is_a_crc_terminate() {
    for seed in 0..200 {
        let mut rng = Rng::new(1000 + seed);
        let count = 2 + rng.below(10) as usize;
        let (sent, mut bytes) = stream(&mut rng, count, true);
        // Corrupt one byte of one FPDU, anywhere but its length field.
        let victim = rng.below(sent.len() as u64) as usize;
        let start: usize = sent[..victim].iter().map(|u| mpa::fpdu_len(u.len())).sum();
        let len = mpa::fpdu_len(sent[victim].len());
        let at = start + 2 + rng.below(len as u64 - 2) as usize;
        bytes[at] ^= 1 << rng.below(8);
        let mut rx = FpduReceiver::new(true, TAGGED_HEADER_LEN);
        let (got, err) = receive(&mut rng, &mut rx, &bytes);
        assert_eq!(err, Some(TermCause::MpaCrc), "seed {seed}");
        assert_eq!(
            got,
            sent[..victim],
            "seed {seed}: FPDUs before the bad one arrive intact"
        );
        // Failed for good.
        assert_eq!(rx.poll(&mut &[0u8; 8][..]), Err(TermCause::MpaCrc));
        // Without CRCs the same stream passes, corrupted byte and all.
        let mut rx = FpduReceiver::new(false, TAGGED_HEADER_LEN);
        let (got, err) = receive(&mut rng, &mut rx, &bytes);
        assert_eq!((got.len(), err), (sent.len(), None), "seed {seed}");
    }
}

#[test]
fn impossible_length_is_a_framing_terminate() {
    for len in 0..TAGGED_HEADER_LEN as u16 {
        let mut rx = FpduReceiver::new(true, TAGGED_HEADER_LEN);
        let b = len.to_be_bytes();
        assert_eq!(rx.poll(&mut &b[..]), Err(TermCause::MpaFraming), "{len}");
    }
    // The largest length is possible: it buffers, bounded, and waits.
    let mut rx = FpduReceiver::new(true, TAGGED_HEADER_LEN);
    let mut b = &[0xff, 0xff, 0, 0, 0][..];
    assert_eq!(rx.poll(&mut b), Ok(None));
    assert!(rx.mid_fpdu());
}

#[test]
fn fuzz_receiver_seeds() {
    let n = rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "receiver", |d| {
        crate::fuzz::receiver(d);
    });
    let _ = n;
    // Pseudo-random inputs, and valid streams with random chunking bytes.
    for seed in 0..300 {
        let mut rng = Rng::new(5000 + seed);
        let mut d = vec![0; rng.below(600) as usize];
        rng.fill(&mut d);
        crate::fuzz::receiver(&d);
        let (sent, bytes) = stream(&mut rng, 3, seed % 2 == 0);
        let mut input = vec![u8::from(seed % 2 == 0)];
        for c in bytes.chunks(1 + rng.below(200) as usize) {
            input.push(c.len() as u8);
            input.extend_from_slice(c);
        }
        assert_eq!(crate::fuzz::receiver(&input), sent.len(), "seed {seed}");
    }
}
