//! Hash maps keyed by identifiers this process chose itself.
//!
//! Tags, work-request ids, QPNs and connection numbers are small integers
//! handed out by our own counters, looked up several times per I/O. The
//! standard library's SipHash protects maps whose keys an attacker picks;
//! for keys we pick it is pure cost (it was a fifth of the instructions of
//! a 4 KiB read at queue depth 32). [`IdMap`] hashes with one multiply per
//! word instead.
//!
//! Never key an [`IdMap`] with something a peer chose (an initiator's SRP
//! tag, a remote QPN): a peer could then pick keys that collide.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` for locally chosen integer keys (see the module docs).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A `HashSet` for locally chosen integer keys (see the module docs).
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// `map.remove(key)`, skipped when `map` is empty: a map most commands
/// leave empty then costs them a length check, not a lookup.
pub fn remove_if_any<K: std::hash::Hash + Eq, V>(map: &mut IdMap<K, V>, key: &K) -> Option<V> {
    if map.is_empty() {
        None
    } else {
        map.remove(key)
    }
}

/// Multiplicative (Fibonacci) hashing of each word written: sequential
/// keys spread over the high bits, which hashbrown uses for its control
/// bytes.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        for &b in chunks.remainder() {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(v)
    }

    #[test]
    fn sequential_keys_differ_in_the_high_bits() {
        // hashbrown takes its 7-bit control tag from the top bits: keys
        // 0..128 must not all share one.
        let tops: IdSet<u64> = (0u64..128).map(|k| hash(k) >> 57).collect();
        assert!(
            tops.len() > 64,
            "only {} distinct top-7-bit values",
            tops.len()
        );
    }

    #[test]
    fn byte_writes_see_every_byte() {
        assert_ne!(
            hash([1u8, 2, 3, 4, 5, 6, 7, 8, 9]),
            hash([1u8, 2, 3, 4, 5, 6, 7, 8, 10])
        );
        assert_ne!(hash([0u8; 9].as_slice()), hash([0u8; 10].as_slice()));
    }

    #[test]
    fn a_map_works_as_a_map() {
        let mut m: IdMap<u32, u32> = IdMap::default();
        for k in 0..10_000u32 {
            m.insert(k.wrapping_mul(4096), k);
        }
        assert_eq!(m.len(), 10_000);
        assert!((0..10_000u32).all(|k| m[&k.wrapping_mul(4096)] == k));
    }
}
