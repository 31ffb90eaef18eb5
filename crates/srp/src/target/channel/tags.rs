//! The initiator's tags of a channel's live commands.
//!
//! The initiator chooses its tags; most choose them from a small range
//! (Linux's ib_srp: the block layer's tag, an index below the queue
//! depth, with the hardware queue above bit 16). A slot per low-bit
//! pattern finds those with one comparison; a tag whose slot is taken
//! goes to a B-tree, so no choice of tags makes a lookup slower than
//! the tree's.

use super::CmdId;
use crate::wire::Tag;
use std::collections::BTreeMap;

/// Slots at least (a channel's window is usually smaller).
const MIN_SLOTS: usize = 64;
/// Slots at most: 64 KiB of them.
const MAX_SLOTS: usize = 4096;

/// Live tags and their commands; a tag is in its slot or in the tree,
/// never both.
#[derive(Debug)]
pub(super) struct Tags {
    /// `(tag, id)` by the tag's low bits; id 0 (no command has it) is a
    /// free slot.
    slots: Box<[(u64, u64)]>,
    /// The tags whose slot was taken when they came.
    spill: BTreeMap<Tag, CmdId>,
}

impl Tags {
    /// Room for about `window` tags in slots.
    pub(super) fn new(window: u32) -> Tags {
        let n = (window as usize)
            .next_power_of_two()
            .clamp(MIN_SLOTS, MAX_SLOTS);
        Tags {
            slots: vec![(0, 0); n].into_boxed_slice(),
            spill: BTreeMap::new(),
        }
    }

    fn slot(&self, tag: Tag) -> usize {
        tag.0 as usize & (self.slots.len() - 1)
    }

    /// The command holding `tag`.
    pub(super) fn get(&self, tag: Tag) -> Option<CmdId> {
        let (t, id) = self.slots[self.slot(tag)];
        if id != 0 && t == tag.0 {
            return Some(CmdId(id));
        }
        if self.spill.is_empty() {
            return None;
        }
        self.spill.get(&tag).copied()
    }

    /// Whether a live command holds `tag`.
    pub(super) fn contains(&self, tag: Tag) -> bool {
        self.get(tag).is_some()
    }

    /// Gives `tag` to command `id`; the caller saw it free
    /// ([`Tags::contains`]).
    pub(super) fn insert(&mut self, tag: Tag, id: CmdId) {
        debug_assert!(!self.contains(tag) && id.0 != 0);
        let s = self.slot(tag);
        match &mut self.slots[s] {
            slot @ (_, 0) => *slot = (tag.0, id.0),
            _ => {
                self.spill.insert(tag, id);
            }
        }
    }

    /// Drops `tag` if command `id` holds it (a later command may have
    /// reused the tag).
    pub(super) fn forget(&mut self, tag: Tag, id: CmdId) {
        let s = self.slot(tag);
        if self.slots[s] == (tag.0, id.0) {
            self.slots[s] = (0, 0);
        } else if let std::collections::btree_map::Entry::Occupied(e) = self.spill.entry(tag) {
            if *e.get() == id {
                e.remove();
            }
        }
    }

    /// Drops every tag.
    pub(super) fn clear(&mut self) {
        self.slots.fill((0, 0));
        self.spill.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Tags that share low bits, reused tags and tags of other commands
    /// behave as a plain map of live tags, in slots and in the tree.
    #[test]
    fn tags_behave_as_a_map_whatever_their_bits() {
        let mut t = Tags::new(16);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut next = 1;
        // Colliding (multiples of 64), small, and large tags, in a
        // fixed pseudo-random order.
        let mut x = 0x9e37_79b9_u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let tag = match x % 3 {
                0 => (x >> 8) % 8 * 64,
                1 => (x >> 8) % 100,
                _ => ((x >> 8) % 4) | (1 << 40),
            };
            let live = model.get(&tag).copied();
            assert_eq!(t.get(Tag(tag)), live.map(CmdId), "tag {tag}");
            match live {
                None => {
                    t.insert(Tag(tag), CmdId(next));
                    model.insert(tag, next);
                    next += 1;
                }
                Some(id) if x & (1 << 20) != 0 => {
                    // Another command's id leaves it in place.
                    t.forget(Tag(tag), CmdId(id + 1_000_000));
                    assert_eq!(t.get(Tag(tag)), Some(CmdId(id)));
                    t.forget(Tag(tag), CmdId(id));
                    model.remove(&tag);
                }
                Some(_) => {}
            }
        }
        assert!(!t.spill.is_empty(), "collisions went to the tree");
        t.clear();
        assert!(model.keys().all(|&k| !t.contains(Tag(k))));
    }
}
