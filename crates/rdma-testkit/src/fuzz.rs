//! A crate's committed fuzz inputs, replayed by its deterministic tests: each
//! cargo-fuzz target has a small seed corpus in `fuzz/seeds/<target>/`
//! (inputs that reach deep into it, kept by `fuzz/run-all --update-seeds`)
//! and, once a crash was found, its minimised input in
//! `fuzz/regressions/<target>/` (saved by `fuzz/run-all`). `cargo test`
//! runs the target's body on every one, so a crash the fuzzer found stays
//! fixed without nightly or cargo-fuzz.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The committed inputs of `target` of the crate at `crate_dir` (its
/// `CARGO_MANIFEST_DIR`): seeds first, then regressions, each set in name
/// order.
pub fn committed_inputs(crate_dir: &str, target: &str) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for set in ["seeds", "regressions"] {
        let dir = Path::new(crate_dir).join("fuzz").join(set).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        all.extend(files);
    }
    all
}

/// Runs `body` (the fuzz target's body) on every committed input of
/// `target` and returns how many ran.
///
/// # Panics
/// If the target has no committed seed (every target keeps a few, so the
/// test exercises it beyond its first checks), or if `body` panics on any
/// input: the message names every input that failed.
pub fn replay(crate_dir: &str, target: &str, body: impl Fn(&[u8])) -> usize {
    let inputs = committed_inputs(crate_dir, target);
    let seeds = Path::new(crate_dir).join("fuzz/seeds").join(target);
    assert!(
        inputs.iter().any(|p| p.starts_with(&seeds)),
        "fuzz target {target} has no committed seed in {} (fuzz/run-all --update-seeds)",
        seeds.display()
    );
    let mut failed = Vec::new();
    for path in &inputs {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "fuzz target {target} fails on {} of its {} committed inputs: {}",
        failed.len(),
        inputs.len(),
        failed.join(", ")
    );
    inputs.len()
}

/// The seeds of `target` of the crate at `crate_dir` (its
/// `CARGO_MANIFEST_DIR`), their contents in name order.
///
/// # Panics
/// If `fuzz/seeds/<target>` cannot be read.
pub fn seeds(crate_dir: &str, target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(crate_dir).join("fuzz/seeds").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// Runs `body` on `rounds` inputs made from `seeds` (taken in turn) by
/// one to four random edits each: a byte overwritten or a bit flipped,
/// the input cut short, a byte inserted. Deterministic for a given
/// `salt`: a failure repeats.
pub fn mutated(seeds: &[Vec<u8>], rounds: usize, salt: u64, body: impl Fn(&[u8])) {
    assert!(!seeds.is_empty(), "no seeds to mutate");
    let mut x = salt | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..rounds {
        let mut f = seeds[round % seeds.len()].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % f.len().max(1);
            match next() % 4 {
                0 if !f.is_empty() => f[at] = next() as u8,
                1 => f.truncate(at),
                2 => f.insert(at.min(f.len()), next() as u8),
                _ if !f.is_empty() => f[at] ^= 1 << (next() % 8),
                _ => {}
            }
        }
        body(&f);
    }
}
