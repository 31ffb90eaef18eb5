//! A table for identifiers handed out in sequence, looked up by their low
//! bits.
//!
//! Command ids, RDMA op ids and send ids come from counters of our own and
//! live briefly: the ones alive at once are a window of the sequence a few
//! dozen wide (or, as an initiator's tags, differ in their low bits, the
//! slot of the command). [`IdRing`] keeps each in slot `id % slots` of a ring, so a
//! lookup is an index and one compare, not a hash and a probe. When a new
//! id lands on a slot a live one holds (the window outgrew the ring), the
//! ring doubles, up to [`RING_MAX`] slots; past that, or when doubling does
//! not separate the two, the newcomer goes to an [`IdMap`] beside the
//! ring. A straggler (a command that waits minutes while millions pass)
//! therefore costs one entry there, never a ring the size of the gap.
//!
//! As with [`IdMap`], never key it with something a peer chose.

use crate::IdMap;

/// Slots a ring starts with.
const RING_MIN: usize = 64;

/// Slots a ring grows to, at most.
pub const RING_MAX: usize = 4096;

/// A key of an [`IdRing`]: an identifier from a counter of our own.
pub trait RingId: Copy + Eq {
    /// The identifier as a number (distinct keys, distinct numbers).
    fn ring_index(self) -> u64;
}

impl RingId for u64 {
    fn ring_index(self) -> u64 {
        self
    }
}

impl RingId for u32 {
    fn ring_index(self) -> u64 {
        u64::from(self)
    }
}

/// A map from sequentially issued ids (see the module docs).
pub struct IdRing<K, V> {
    slots: Vec<Option<(K, V)>>,
    in_ring: usize,
    overflow: IdMap<u64, (K, V)>,
}

impl<K, V> Default for IdRing<K, V> {
    fn default() -> Self {
        IdRing {
            slots: Vec::new(),
            in_ring: 0,
            overflow: IdMap::default(),
        }
    }
}

impl<K: RingId + std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for IdRing<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: RingId, V> IdRing<K, V> {
    #[inline]
    fn slot(&self, k: K) -> usize {
        (k.ring_index() as usize) & (self.slots.len().wrapping_sub(1))
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.in_ring + self.overflow.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `k`.
    #[inline]
    pub fn get(&self, k: &K) -> Option<&V> {
        if let Some(Some((key, v))) = self.slots.get(self.slot(*k)) {
            if key == k {
                return Some(v);
            }
        }
        if self.overflow.is_empty() {
            return None;
        }
        self.overflow.get(&k.ring_index()).map(|(_, v)| v)
    }

    /// The value of `k`, to change.
    #[inline]
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        let i = self.slot(*k);
        // Two looks, so the borrow of the ring ends before the overflow's.
        if matches!(self.slots.get(i), Some(Some((key, _))) if key == k) {
            return self.slots[i].as_mut().map(|(_, v)| v);
        }
        if self.overflow.is_empty() {
            return None;
        }
        self.overflow.get_mut(&k.ring_index()).map(|(_, v)| v)
    }

    /// Whether `k` has a value.
    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// Takes `k`'s value out.
    #[inline]
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let i = self.slot(*k);
        if matches!(self.slots.get(i), Some(Some((key, _))) if key == k) {
            self.in_ring -= 1;
            return self.slots[i].take().map(|(_, v)| v);
        }
        if self.overflow.is_empty() {
            return None;
        }
        self.overflow.remove(&k.ring_index()).map(|(_, v)| v)
    }

    /// Sets `k`'s value; returns the one it replaced.
    #[inline]
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        // The usual case, inline: a free slot and nothing aside.
        if self.overflow.is_empty() && !self.slots.is_empty() {
            let i = self.slot(k);
            if self.slots[i].is_none() {
                self.slots[i] = Some((k, v));
                self.in_ring += 1;
                return None;
            }
        }
        self.insert_slow(k, v)
    }

    fn insert_slow(&mut self, k: K, v: V) -> Option<V> {
        if !self.overflow.is_empty() {
            if let Some((_, old)) = self.overflow.get_mut(&k.ring_index()) {
                return Some(std::mem::replace(old, v));
            }
        }
        if self.slots.is_empty() {
            self.slots.resize_with(RING_MIN, || None);
        }
        loop {
            let i = self.slot(k);
            match &mut self.slots[i] {
                None => {
                    self.slots[i] = Some((k, v));
                    self.in_ring += 1;
                    return None;
                }
                Some((key, old)) if *key == k => return Some(std::mem::replace(old, v)),
                Some((other, _)) => {
                    // Two ids share a slot while their low bits up to the
                    // ring's size agree: doubling helps if they differ
                    // somewhere below RING_MAX.
                    let apart = (k.ring_index() ^ other.ring_index()) & (RING_MAX as u64 - 1);
                    if self.slots.len() < RING_MAX && apart != 0 {
                        self.grow();
                        continue;
                    }
                    self.overflow.insert(k.ring_index(), (k, v));
                    return None;
                }
            }
        }
    }

    /// Doubles the ring; an entry that meets another in the new one goes
    /// to the overflow map.
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots.resize_with(old.len() * 2, || None);
        self.in_ring = 0;
        for (k, v) in old.into_iter().flatten() {
            let i = self.slot(k);
            if self.slots[i].is_none() {
                self.slots[i] = Some((k, v));
                self.in_ring += 1;
            } else {
                self.overflow.insert(k.ring_index(), (k, v));
            }
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots
            .iter()
            .flatten()
            .chain(self.overflow.values())
            .map(|(k, v)| (k, v))
    }

    /// Every entry, the values to change, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.slots
            .iter_mut()
            .flatten()
            .chain(self.overflow.values_mut())
            .map(|(k, v)| (&*k, v))
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Every value, to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots
            .iter_mut()
            .flatten()
            .chain(self.overflow.values_mut())
            .map(|(_, v)| v)
    }

    /// Removes every entry (the ring keeps its size).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.in_ring = 0;
        self.overflow.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random inserts, replacements, removals and lookups, against a
    /// `BTreeMap`: sequential windows (the usual case), stragglers far
    /// behind, and keys that collide in the ring.
    #[test]
    fn it_behaves_as_a_map() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20u64 {
            let mut ring: IdRing<u64, u64> = IdRing::default();
            let mut model = BTreeMap::new();
            let mut next = round * 1_000_003;
            for step in 0..20_000u64 {
                let r = rnd();
                let k = match r % 10 {
                    // A new id in sequence.
                    0..=3 => {
                        next += 1 + (r >> 8) % 3;
                        next
                    }
                    // One far away (a straggler or a collision).
                    4 => (r >> 8) % (RING_MAX as u64 * 8),
                    // One near the window.
                    _ => next.saturating_sub((r >> 8) % 200),
                };
                match (r >> 4) % 4 {
                    0 | 1 => assert_eq!(ring.insert(k, step), model.insert(k, step)),
                    2 => assert_eq!(ring.remove(&k), model.remove(&k)),
                    _ => {
                        if let Some(v) = ring.get_mut(&k) {
                            *v += 1;
                        }
                        if let Some(v) = model.get_mut(&k) {
                            *v += 1;
                        }
                    }
                }
                assert_eq!(ring.get(&k), model.get(&k));
                assert_eq!(ring.len(), model.len());
            }
            for (k, v) in ring.iter_mut() {
                *v += k;
            }
            let mut all: Vec<(u64, u64)> = ring.iter().map(|(k, v)| (*k, *v)).collect();
            all.sort();
            assert_eq!(
                all,
                model
                    .into_iter()
                    .map(|(k, v)| (k, v + k))
                    .collect::<Vec<_>>()
            );
            assert!(ring.slots.len() <= RING_MAX);
        }
    }

    #[test]
    fn a_sliding_window_stays_in_the_ring() {
        let mut ring: IdRing<u64, ()> = IdRing::default();
        for id in 0..100_000u64 {
            ring.insert(id, ());
            if id >= 40 {
                assert!(ring.remove(&(id - 40)).is_some());
            }
        }
        assert_eq!(ring.len(), 40);
        assert!(ring.overflow.is_empty());
        assert_eq!(ring.slots.len(), RING_MIN);
    }

    #[test]
    fn tags_apart_in_their_low_bits_stay_in_the_ring() {
        // An initiator's tags: generation << 32 | slot, 200 slots.
        let mut ring: IdRing<u64, ()> = IdRing::default();
        for round in 0..50u64 {
            for slot in 0..200u64 {
                let gen = (round * 7 + slot * 13) % 1000;
                if round > 0 {
                    let old = ((round - 1) * 7 + slot * 13) % 1000;
                    assert!(ring.remove(&(old << 32 | slot)).is_some());
                }
                ring.insert(gen << 32 | slot, ());
            }
        }
        assert_eq!(ring.len(), 200);
        assert!(ring.overflow.is_empty());
        assert_eq!(ring.slots.len(), 256);
    }

    #[test]
    fn a_straggler_costs_one_entry_not_a_ring_the_size_of_the_gap() {
        let mut ring: IdRing<u64, ()> = IdRing::default();
        ring.insert(0, ());
        for id in 1..1_000_000u64 {
            ring.insert(id, ());
            ring.remove(&(id.saturating_sub(32).max(1)));
        }
        assert!(ring.contains_key(&0));
        assert!(ring.slots.len() <= RING_MAX);
        assert!(ring.overflow.len() <= 1, "{}", ring.overflow.len());
    }
}
