//! Registered-memory backing store.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;

struct Raw {
    ptr: *mut u8,
    len: usize,
    /// Mapped anonymous memory (a large buffer), not the allocator's.
    mapped: bool,
}

/// Buffers from this size on are anonymous mappings: their pages cost no
/// memory until first touched, so a target's send slots or receive ring
/// sized for the worst case cost what is used (the allocator zeroes an
/// aligned block by writing it, which commits every page at once).
const MAP_FROM: usize = 64 << 10;

// SAFETY: the allocation is owned by `Raw` and freed only on drop; access
// goes through bounds-checked methods. Concurrent access to the same bytes
// is the consumer's business, exactly like DMA on a real HCA (ordering is
// given by completions).
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in `MemBuf::new` with this length; no view
            // outlives the last `MemBuf` holding this `Raw`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        } else {
            // SAFETY: allocated in `MemBuf::new` with this layout.
            unsafe { dealloc(self.ptr, layout(self.len)) }
        }
    }
}

fn layout(len: usize) -> Layout {
    Layout::from_size_align(len.max(1), PAGE).expect("MemBuf size overflows Layout")
}

/// A page-aligned zeroed buffer shared through `Arc`. [`MemBuf::addr`] is
/// its virtual address as used in SGEs, MR ranges and RDMA addresses.
#[derive(Clone)]
pub struct MemBuf(Arc<Raw>);

impl core::fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MemBuf({:#x}+{})", self.addr(), self.len())
    }
}

impl MemBuf {
    /// Allocates `len` zeroed bytes aligned to 4096.
    pub fn new(len: usize) -> MemBuf {
        if len >= MAP_FROM {
            // SAFETY: a fresh private anonymous mapping; nothing else
            // refers to it. Its pages read as zero.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                return MemBuf(Arc::new(Raw {
                    ptr: ptr.cast(),
                    len,
                    mapped: true,
                }));
            }
        }
        let l = layout(len);
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(l) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(l);
        }
        MemBuf(Arc::new(Raw {
            ptr,
            len,
            mapped: false,
        }))
    }

    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.0.ptr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Whether `[addr, addr+len)` lies inside the buffer.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr()
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.addr() + self.len() as u64)
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.0.len),
            "MemBuf access out of bounds"
        );
    }

    /// Copies out `out.len()` bytes at offset `off`. Panics out of bounds.
    pub fn read_at(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        // SAFETY: bounds checked above.
        unsafe { core::ptr::copy_nonoverlapping(self.0.ptr.add(off), out.as_mut_ptr(), out.len()) }
    }

    /// Copies `data` in at offset `off`. Panics out of bounds.
    pub fn write_at(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: bounds checked above.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.0.ptr.add(off), data.len()) }
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: whole allocation.
        unsafe { core::ptr::write_bytes(self.0.ptr, byte, self.0.len) }
    }

    /// Returns a copy of `len` bytes at `off`.
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read_at(off, &mut v);
        v
    }

    /// A reference that keeps the allocation alive (not any registration
    /// of it), for bytes lent to a packet until it is sent.
    pub fn keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.0.clone()
    }

    /// Raw pointer to byte `off`.
    ///
    /// # Safety
    /// `off + len` must be within the buffer for whatever the caller does,
    /// and the caller must not create overlapping `&mut` views.
    pub unsafe fn ptr_at(&self, off: usize) -> *mut u8 {
        self.0.ptr.add(off)
    }

    /// Copies `len` bytes from `src` at `src_off` to `self` at `dst_off`
    /// (like a DMA engine; ranges may be in the same buffer).
    pub fn copy_from(&self, dst_off: usize, src: &MemBuf, src_off: usize, len: usize) {
        self.check(dst_off, len);
        src.check(src_off, len);
        // SAFETY: both ranges bounds checked; `copy` allows overlap.
        unsafe { core::ptr::copy(src.0.ptr.add(src_off), self.0.ptr.add(dst_off), len) }
    }

    /// 8-byte atomic at `off` (must be 8-byte aligned): `f(old) -> new`,
    /// returns the old value. Used for IBA atomics (9.4.5).
    pub fn atomic_u64(&self, off: usize, f: impl Fn(u64) -> u64) -> u64 {
        self.check(off, 8);
        assert!(
            (self.addr() as usize + off) & 7 == 0,
            "atomic on unaligned address"
        );
        // SAFETY: in bounds and aligned; AtomicU64 has u64 layout.
        let a = unsafe { &*(self.0.ptr.add(off) as *const AtomicU64) };
        let mut cur = a.load(Ordering::SeqCst);
        loop {
            match a.compare_exchange_weak(cur, f(cur), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(old) => return old,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_bounded() {
        let b = MemBuf::new(100);
        assert_eq!(b.addr() % 4096, 0);
        assert_eq!(b.to_vec(0, 100), vec![0; 100]);
        b.write_at(98, &[1, 2]);
        assert_eq!(b.to_vec(97, 3), vec![0, 1, 2]);
        assert!(b.contains(b.addr() + 99, 1));
        assert!(!b.contains(b.addr() + 99, 2));
        assert!(!b.contains(b.addr() - 1, 1));
        assert!(std::panic::catch_unwind(|| b.write_at(99, &[1, 2])).is_err());
    }

    #[test]
    fn atomic_returns_old_value() {
        let b = MemBuf::new(16);
        assert_eq!(b.atomic_u64(8, |v| v + 5), 0);
        assert_eq!(b.atomic_u64(8, |v| v + 5), 5);
        assert_eq!(b.to_vec(8, 8), 10u64.to_ne_bytes().to_vec());
    }
}
