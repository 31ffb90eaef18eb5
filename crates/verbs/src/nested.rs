//! For consumers that handle completions right in a provider's callback:
//! a lock guard that counts, per thread, the consumer locks held, so a
//! callback can tell it runs inside its own consumer's call into the
//! provider (a provider may call back on the calling thread, see
//! [`crate::Provider::handlers_nest`]) and must not take the lock again.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

thread_local! {
    static HOLDING: Cell<u32> = const { Cell::new(0) };
}

/// A held consumer lock, counted while held.
pub struct Counted<'a, T>(Option<MutexGuard<'a, T>>);

impl<'a, T> Counted<'a, T> {
    /// Locks `m` (a poisoned lock is taken as it is).
    pub fn lock(m: &'a Mutex<T>) -> Counted<'a, T> {
        Counted::from_guard(m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts a guard taken elsewhere (after a condition-variable wait).
    pub fn from_guard(g: MutexGuard<'a, T>) -> Counted<'a, T> {
        HOLDING.with(|h| h.set(h.get() + 1));
        Counted(Some(g))
    }

    /// Gives the guard back, no longer counted (to wait on a condition
    /// variable).
    pub fn into_guard(mut self) -> MutexGuard<'a, T> {
        HOLDING.with(|h| h.set(h.get() - 1));
        self.0.take().expect("held")
    }
}

impl<T> std::ops::Deref for Counted<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("held")
    }
}

impl<T> std::ops::DerefMut for Counted<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held")
    }
}

impl<T> Drop for Counted<'_, T> {
    fn drop(&mut self) {
        if self.0.take().is_some() {
            HOLDING.with(|h| h.set(h.get() - 1));
        }
    }
}

/// Whether this thread holds no counted lock, so a callback running on it
/// may block on one.
pub fn may_lock_here() -> bool {
    HOLDING.with(|h| h.get() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_locks_are_counted_per_thread() {
        let (a, b) = (Mutex::new(1), Mutex::new(2));
        assert!(may_lock_here());
        let ga = Counted::lock(&a);
        assert!(!may_lock_here());
        // Another thread is not affected.
        assert!(std::thread::scope(|s| s
            .spawn(may_lock_here)
            .join()
            .unwrap()));
        let gb = Counted::lock(&b);
        let raw = gb.into_guard();
        assert!(!may_lock_here(), "a still held");
        drop(ga);
        assert!(may_lock_here(), "the raw guard is not counted");
        let gb = Counted::from_guard(raw);
        assert_eq!(*gb, 2);
        drop(gb);
        assert!(may_lock_here());
    }
}
