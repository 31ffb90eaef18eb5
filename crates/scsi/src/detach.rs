//! A store that is closed and opened again under a logical unit that
//! stays: a replicated disk (DRBD) that this host may only open while it
//! holds the primary role. The logical unit keeps its size, block size
//! and identity while closed, so READ CAPACITY and INQUIRY still answer
//! and an initiator's standby path keeps its disk; a command that reaches
//! the store while it is closed gets NOT READY, LOGICAL UNIT NOT
//! ACCESSIBLE, TARGET PORT IN STANDBY STATE (04/0B) instead of touching it.
//!
//! Closing is a drain: no command starts on the store from the moment
//! [`Detachable::close`] is called, and it returns only when every
//! command that had started has finished (or at its deadline, saying how
//! many had not). So a writer never reaches a store after this host gave
//! up its role.

use crate::backend::Backend;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A command's hold on a store: while it lives the store is not closed
/// under it. [`Backend::hold`] hands one out.
pub struct Hold<'a> {
    gate: Option<&'a Detachable>,
}

impl Hold<'_> {
    /// The hold of a store that never closes.
    pub fn free() -> Hold<'static> {
        Hold { gate: None }
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.gate {
            d.leave();
        }
    }
}

/// The store is closed: a command that needs it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// Commands still on the store when [`Detachable::close`]'s deadline
/// came; the store is closed to new ones all the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} commands were still running on the store when the wait ended")]
pub struct StillRunning(pub usize);

/// A store that may be closed and opened again: the backend of a
/// logical unit on a DRBD device. Size and smallest block are fixed
/// when made; a store opened later must have that size.
pub struct Detachable {
    size: u64,
    min_block: u32,
    store: RwLock<Option<Arc<dyn Backend>>>,
    open: AtomicBool,
    /// Commands holding the store ([`Hold`]s alive).
    running: AtomicUsize,
    drained: (Mutex<()>, Condvar),
}

/// A store opened again with another size than the logical unit's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store holds {have} bytes, the logical unit {want}: the device was resized under it (restart srptd to take the new size)")]
pub struct SizeChanged {
    pub have: u64,
    pub want: u64,
}

impl Detachable {
    /// A closed store of `size` bytes whose I/O is in units of
    /// `min_block` bytes (the device's logical block size).
    pub fn closed(size: u64, min_block: u32) -> Detachable {
        Detachable {
            size,
            min_block: min_block.max(1),
            store: RwLock::new(None),
            open: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            drained: (Mutex::new(()), Condvar::new()),
        }
    }

    /// Whether commands reach the store now.
    pub fn is_open(&self) -> bool {
        self.open.load(SeqCst)
    }

    /// Puts `store` under the logical unit; commands reach it from now.
    ///
    /// # Errors
    /// The store's size is not the logical unit's (it stays closed).
    pub fn open_with(&self, store: Arc<dyn Backend>) -> Result<(), SizeChanged> {
        if store.size() != self.size {
            return Err(SizeChanged {
                have: store.size(),
                want: self.size,
            });
        }
        *self.store.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
        self.open.store(true, SeqCst);
        Ok(())
    }

    /// Refuses new commands, waits up to `within` for the running ones,
    /// then flushes and drops the store (closing its file, so that DRBD
    /// may demote). Closing a closed store does nothing.
    ///
    /// # Errors
    /// Commands were still running at the deadline: the store is kept
    /// (they still use it) but no command starts on it; call again.
    pub fn close(&self, within: Duration) -> Result<(), StillRunning> {
        self.open.store(false, SeqCst);
        let deadline = Instant::now() + within;
        let (m, cv) = &self.drained;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = self.running.load(SeqCst);
            if n == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StillRunning(n));
            }
            g = cv
                .wait_timeout(g, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        let store = self.store.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = store {
            // What the page cache or the device's cache holds goes down
            // before the peer may become primary.
            let _ = s.flush();
        }
        Ok(())
    }

    fn leave(&self) {
        if self.running.fetch_sub(1, SeqCst) == 1 && !self.open.load(SeqCst) {
            let _g = self.drained.0.lock().unwrap_or_else(|e| e.into_inner());
            self.drained.1.notify_all();
        }
    }

    fn with<T>(&self, f: impl FnOnce(&dyn Backend) -> io::Result<T>) -> io::Result<T> {
        let s = self.store.read().unwrap_or_else(|e| e.into_inner());
        match s.as_deref() {
            Some(b) => f(b),
            None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the store is closed",
            )),
        }
    }
}

impl Backend for Detachable {
    fn size(&self) -> u64 {
        self.size
    }
    fn min_block_size(&self) -> u32 {
        self.min_block
    }
    fn hold(&self) -> Result<Hold<'_>, Closed> {
        // Counted before the check, and close() clears `open` before it
        // counts: one of the two sees the other (both SeqCst).
        self.running.fetch_add(1, SeqCst);
        let hold = Hold { gate: Some(self) };
        if self.open.load(SeqCst) {
            Ok(hold)
        } else {
            Err(Closed)
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.with(|b| b.read(offset, buf))
    }
    fn read_vectored(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        self.with(|b| b.read_vectored(offset, bufs))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.with(|b| b.write(offset, data, fua))
    }
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]], fua: bool) -> io::Result<()> {
        self.with(|b| b.write_vectored(offset, bufs, fua))
    }
    fn flush(&self) -> io::Result<()> {
        self.with(|b| b.flush())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.with(|b| b.unmap(offset, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Ram;

    #[test]
    fn a_closed_store_refuses_holds_and_opens_only_at_its_size() {
        let d = Detachable::closed(4096, 512);
        assert!(d.hold().is_err());
        assert_eq!(
            d.open_with(Arc::new(Ram::new(8192))),
            Err(SizeChanged {
                have: 8192,
                want: 4096
            })
        );
        assert!(!d.is_open());
        d.open_with(Arc::new(Ram::new(4096))).unwrap();
        let h = d.hold().expect("open");
        d.write(0, &[7; 512], false).unwrap();
        drop(h);
        d.close(Duration::from_secs(1)).unwrap();
        assert!(d.hold().is_err());
        assert_eq!(
            d.read(0, &mut [0; 512]).unwrap_err().kind(),
            io::ErrorKind::NotConnected
        );
    }

    #[test]
    fn close_waits_for_the_running_command_and_stops_new_ones() {
        let d = Arc::new(Detachable::closed(4096, 512));
        d.open_with(Arc::new(Ram::new(4096))).unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let d2 = d.clone();
        let cmd = std::thread::spawn(move || {
            let _h = d2.hold().expect("open");
            held_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            // Still allowed: it started before the close.
            d2.write(0, &[9; 512], false)
        });
        held_rx.recv().unwrap();
        // The running command holds it: a short close gives up, but no
        // new command gets in meanwhile.
        assert_eq!(d.close(Duration::from_millis(50)), Err(StillRunning(1)));
        assert!(d.hold().is_err());
        go_tx.send(()).unwrap();
        d.close(Duration::from_secs(10)).unwrap();
        cmd.join().unwrap().unwrap();
        assert!(!d.is_open());
    }
}
