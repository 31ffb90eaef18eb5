//! The table a provider keeps its objects in, behind the typed handles
//! ([`crate::Handle`]): a slot per object, reused after release with its
//! generation bumped, so a stale handle is refused with `InvalidHandle`
//! instead of reaching the slot's next object.
//!
//! The table knows nothing of what it holds: a provider stores its own
//! object enum and checks the kind itself. Slot indices stay valid while
//! the object lives, so a provider may keep them (a QP's CQ by index) as
//! long as its own reference counts keep the object alive.

use crate::{Handle, Result, VerbsError};

struct Slot<T> {
    gen: u32,
    obj: Option<T>,
}

/// Objects by slot, handed out as index + generation.
pub struct HandleTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> HandleTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        HandleTable::default()
    }

    /// Stores `obj` in a free slot (the generation after the slot's last
    /// one) or a new one (generation 1), and returns its handle.
    pub fn alloc(&mut self, obj: T) -> Handle {
        if let Some(i) = self.free.pop() {
            let s = &mut self.slots[i];
            s.gen = s.gen.wrapping_add(1);
            s.obj = Some(obj);
            Handle {
                index: i as u32,
                generation: s.gen,
            }
        } else {
            self.slots.push(Slot {
                gen: 1,
                obj: Some(obj),
            });
            Handle {
                index: (self.slots.len() - 1) as u32,
                generation: 1,
            }
        }
    }

    /// Empties slot `i` for reuse and returns what it held.
    ///
    /// # Panics
    /// `i` is not a slot of this table.
    pub fn release(&mut self, i: usize) -> Option<T> {
        let o = self.slots[i].obj.take();
        if o.is_some() {
            self.free.push(i);
        }
        o
    }

    /// The slot of a live object named by `h`.
    ///
    /// # Errors
    /// `InvalidHandle` when `h` names no slot, an empty one, or an object
    /// released since (another generation).
    #[inline]
    pub fn slot(&self, h: Handle) -> Result<usize> {
        match self.slots.get(h.index as usize) {
            Some(s) if s.gen == h.generation && s.obj.is_some() => Ok(h.index as usize),
            _ => Err(VerbsError::InvalidHandle),
        }
    }

    /// The object in live slot `i`.
    ///
    /// # Panics
    /// Slot `i` is empty or does not exist (a provider's own bug: it got
    /// `i` from [`HandleTable::slot`] or kept it for a live object).
    #[inline]
    pub fn get(&self, i: usize) -> &T {
        self.slots[i].obj.as_ref().expect("live slot")
    }

    /// The object in live slot `i`, to change.
    ///
    /// # Panics
    /// As [`HandleTable::get`].
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> &mut T {
        self.slots[i].obj.as_mut().expect("live slot")
    }

    /// Every live object with its slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.obj.as_ref().map(|o| (i, o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_slot_is_reused_and_its_old_handle_refused() {
        let mut t = HandleTable::new();
        let a = t.alloc("a");
        let b = t.alloc("b");
        assert_eq!((a.index, a.generation, b.index), (0, 1, 1));
        assert_eq!(t.slot(a).map(|i| *t.get(i)), Ok("a"));
        assert_eq!(t.release(0), Some("a"));
        assert_eq!(t.slot(a), Err(VerbsError::InvalidHandle));
        // Releasing twice frees the slot once.
        assert_eq!(t.release(0), None);
        let c = t.alloc("c");
        assert_eq!((c.index, c.generation), (0, 2));
        assert_eq!(t.slot(a), Err(VerbsError::InvalidHandle));
        *t.get_mut(t.slot(c).unwrap()) = "c2";
        let live: Vec<_> = t.iter().map(|(i, o)| (i, *o)).collect();
        assert_eq!(live, [(0, "c2"), (1, "b")]);
        let d = t.alloc("d");
        assert_eq!((d.index, d.generation), (2, 1));
        let nowhere = Handle {
            index: 9,
            generation: 1,
        };
        assert_eq!(t.slot(nowhere), Err(VerbsError::InvalidHandle));
    }
}
