//! Registered-memory backing store.
//!
//! # Concurrency contract
//!
//! A [`MemBuf`] is shared memory: the consumer, the provider (a NIC
//! thread) and, through RDMA, remote peers may touch the same bytes at the
//! same time, as a CPU and a real HCA's DMA engine do. Rust makes a data
//! race undefined behaviour, so the two ways in are:
//!
//! - **Safe access** ([`MemBuf::read_at`], [`MemBuf::write_at`],
//!   [`MemBuf::fill`], [`MemBuf::to_vec`], [`MemBuf::copy_from`],
//!   [`MemBuf::atomic_u64`]) is made of atomic operations on the buffer's
//!   aligned 8-byte words: relaxed loads and stores of whole words, and a
//!   compare-and-swap of the whole word for a write that covers part of
//!   one. Safe accesses racing on the same bytes are therefore defined: a
//!   racing reader sees each word either before or after a write (a copy
//!   of several words may mix them, as DMA does), and nothing is UB. Every
//!   access has the same size (8 bytes): racing atomics of different
//!   sizes on the same bytes are not allowed by the memory model. Which
//!   write a reader sees is ordered by something else (a completion, a
//!   lock), as on real hardware.
//! - **Plain access** (slices, the kernel's iovecs) only through the
//!   `unsafe` [`MemBuf::ptr_at`]: its caller promises that no other access
//!   to those bytes in this process, safe or not, happens while its view
//!   is in use (for a buffer a work request names: until the request
//!   completes).
//!
//! The cost: the compiler never vectorises atomics, so a copy in Rust
//! moves one word per instruction instead of `memcpy`'s vector registers,
//! plus at most two compare-and-swaps for the ends of a write. On x86-64
//! processors with AVX, long copies move 16 bytes per instruction instead
//! (see [`wide`]): those processors carry out an aligned 16-byte SSE load
//! or store (`movdqa`) as one atomic access (Intel SDM vol. 3A,
//! "Guaranteed Atomic Operations"; AMD APM vol. 2, "Access Atomicity"),
//! which is one of the executions of the two relaxed 8-byte atomics on
//! the same bytes that the contract promises: to every racing access it
//! looks the same as those two, issued back to back.
//!
//! # Shared buffers (another process's view)
//!
//! A buffer made by [`MemBuf::new_shared`] is a `memfd` mapping
//! (`MAP_SHARED`), sealed against shrinking, whose descriptor
//! ([`MemBuf::shared_fd`]) can be passed to another process: the NIC
//! daemon maps it with [`MemBuf::map_shared`] and its NIC reads and
//! writes the same bytes, as an HCA's DMA engine reads a process's
//! pinned pages. The mapping there keeps the owner's address
//! ([`MemBuf::addr`] is the owner's, the address its SGEs and R_Key
//! ranges name); only the bytes are reached through the daemon's own
//! mapping. To this process the other one is like a remote peer: it may
//! change the bytes at any time, and every access here is still an
//! atomic word, so nothing it does is a data race in this process. The
//! seal is what lets the daemon trust the size: a client cannot shrink
//! the file under the daemon's mapping (a fault, SIGBUS, in the daemon).
//!
//! [`MemBuf::set_shared_by_default`] makes [`MemBuf::new`] itself return
//! shared buffers from then on (the NIC daemon's client provider turns
//! it on when it connects), so a consumer written for an in-process NIC
//! registers memory the daemon can reach without a change.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;

/// The size of every access (see the module docs).
const WORD: usize = 8;

struct Raw {
    ptr: *mut u8,
    len: usize,
    /// The address SGEs and R_Key ranges name: `ptr`, but for a mapping
    /// of another process's buffer ([`MemBuf::map_shared`]), the owner's.
    addr: u64,
    backing: Backing,
}

/// Where a buffer's bytes come from.
enum Backing {
    /// The allocator's.
    Heap,
    /// A private anonymous mapping (a large buffer).
    Anon,
    /// A shared mapping of a memfd (of ours, or received), `mapped`
    /// bytes long.
    Shared { fd: OwnedFd, mapped: usize },
}

/// Whether [`MemBuf::new`] makes shared buffers.
static SHARED_BY_DEFAULT: AtomicBool = AtomicBool::new(false);

/// Buffers from this size on are anonymous mappings: their pages cost no
/// memory until first touched, so a target's send slots or receive ring
/// sized for the worst case cost what is used (the allocator zeroes an
/// aligned block by writing it, which commits every page at once).
const MAP_FROM: usize = 64 << 10;

// SAFETY: the allocation is owned by `Raw` and freed only on drop. Safe
// access goes through bounds-checked atomic word operations, so sharing
// it between threads races on no plain memory; plain access is `unsafe`
// (`MemBuf::ptr_at`) with its caller's promise of exclusivity (see the
// module docs).
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: mapped in `MemBuf::new` with this length; no view
            // outlives the last `MemBuf` holding this `Raw`.
            Backing::Anon => unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            },
            // SAFETY: mapped in `MemBuf::shared_mapping` with this
            // length; no view outlives the last `MemBuf` holding this
            // `Raw`. The descriptor closes after.
            Backing::Shared { mapped, .. } => unsafe {
                libc::munmap(self.ptr.cast(), *mapped);
            },
            // SAFETY: allocated in `MemBuf::new` with this layout.
            Backing::Heap => unsafe { dealloc(self.ptr, layout(self.len)) },
        }
    }
}

/// The allocation for `len` bytes: whole words (the last word of the
/// buffer is accessed whole), page-aligned.
fn layout(len: usize) -> Layout {
    let size = len.max(1).checked_next_multiple_of(WORD);
    size.and_then(|s| Layout::from_size_align(s, PAGE).ok())
        .expect("MemBuf size overflows Layout")
}

/// The bytes mapped for a shared buffer of `len`: whole pages, at least
/// one.
fn mapped_size(len: usize) -> std::io::Result<usize> {
    len.max(1).checked_next_multiple_of(PAGE).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "shared buffer size overflows",
        )
    })
}

/// A page-aligned zeroed buffer shared through `Arc`. [`MemBuf::addr`] is
/// its virtual address as used in SGEs, MR ranges and RDMA addresses.
/// Access to it from several threads at once is defined (see the module
/// docs for the contract).
#[derive(Clone)]
pub struct MemBuf(Arc<Raw>);

impl core::fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MemBuf({:#x}+{})", self.addr(), self.len())
    }
}

/// The word `bytes` (8 of them) make.
fn word_of(bytes: &[u8]) -> u64 {
    let mut w = [0; WORD];
    w.copy_from_slice(bytes);
    u64::from_ne_bytes(w)
}

impl MemBuf {
    /// Allocates `len` zeroed bytes aligned to 4096: a shared buffer
    /// ([`MemBuf::new_shared`]) when [`MemBuf::set_shared_by_default`]
    /// says so (a private one if that fails, say for want of file
    /// descriptors: registering it with the daemon's client is then
    /// refused, with the reason), else private memory.
    pub fn new(len: usize) -> MemBuf {
        if SHARED_BY_DEFAULT.load(Ordering::Relaxed) {
            if let Ok(b) = MemBuf::new_shared(len) {
                return b;
            }
        }
        MemBuf::new_private(len)
    }

    /// Makes [`MemBuf::new`] return shared buffers (`true`) or private
    /// ones (`false`, the default) from now on, in the whole process.
    pub fn set_shared_by_default(shared: bool) {
        SHARED_BY_DEFAULT.store(shared, Ordering::Relaxed);
    }

    /// `len` zeroed bytes of this process only (the allocator's, or an
    /// anonymous mapping when large), whatever
    /// [`MemBuf::set_shared_by_default`] says: for memory no other
    /// process needs to reach.
    pub fn new_private(len: usize) -> MemBuf {
        if len >= MAP_FROM {
            if let Ok(b) = MemBuf::map_anon(len) {
                return b;
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
            addr: ptr as u64,
            backing: Backing::Heap,
        }))
    }

    /// `len` zeroed bytes in a fresh private anonymous mapping.
    fn map_anon(len: usize) -> std::io::Result<MemBuf> {
        // SAFETY: a fresh private anonymous mapping; nothing else refers
        // to it. Its pages read as zero (whole pages: the last word is
        // inside them).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MemBuf(Arc::new(Raw {
            ptr: ptr.cast(),
            len,
            addr: ptr as u64,
            backing: Backing::Anon,
        })))
    }

    /// A RAM disk's memory: `len` zeroed bytes (shared when
    /// [`MemBuf::set_shared_by_default`] says so), in transparent huge
    /// pages (a store read all over: one TLB entry and one fault per
    /// 2 MiB instead of per 4 KiB), every page committed now
    /// ([`MemBuf::commit`]).
    ///
    /// # Errors
    /// The system's, when it cannot map or back `len` bytes (`ENOMEM`):
    /// an error to report, where [`MemBuf::new`] would abort.
    pub fn for_store(len: usize) -> std::io::Result<MemBuf> {
        if len == 0 {
            return Ok(MemBuf::new(0));
        }
        let b = if SHARED_BY_DEFAULT.load(Ordering::Relaxed) {
            MemBuf::new_shared(len)?
        } else {
            MemBuf::map_anon(len)?
        };
        // SAFETY: advice on the mapping just made, whole; it changes how
        // its pages are backed, never their contents.
        unsafe { libc::madvise(b.0.ptr.cast(), len, libc::MADV_HUGEPAGE) };
        b.commit()?;
        Ok(b)
    }

    /// Commits every page now rather than at first touch (a RAM disk whose
    /// memory is all there before its first write, as LIO's rd_mcp
    /// allocates its pages when the device is enabled): the kernel's
    /// `MADV_POPULATE_WRITE` (Linux 5.14), or else a write of each page's
    /// first word (an atomic OR of zero: the bytes stay as they are).
    ///
    /// # Errors
    /// The system's, when it cannot back the pages (`ENOMEM`, or
    /// `EFAULT`/`EHWPOISON` from the mapping).
    pub fn commit(&self) -> std::io::Result<()> {
        if !matches!(self.0.backing, Backing::Heap) {
            // SAFETY: advice on this buffer's own mapping, whole; it backs
            // pages, never changes their contents.
            let r =
                unsafe { libc::madvise(self.0.ptr.cast(), self.0.len, libc::MADV_POPULATE_WRITE) };
            if r == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            // EINVAL: a kernel before 5.14, which does not know the advice.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
        let words = self.0.len.div_ceil(WORD);
        for i in (0..words).step_by(PAGE / WORD) {
            self.word(i).fetch_or(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `len` zeroed bytes in a new memfd, mapped shared and sealed
    /// against shrinking, whose descriptor ([`MemBuf::shared_fd`]) another
    /// process may map (see the module docs).
    ///
    /// # Errors
    /// The system's, from `memfd_create`, `ftruncate`, `fcntl` or `mmap`
    /// (out of file descriptors or memory).
    pub fn new_shared(len: usize) -> std::io::Result<MemBuf> {
        let size = mapped_size(len)?;
        // SAFETY: the name is a NUL-terminated string; the flags are
        // valid. The descriptor returned is ours alone.
        let fd = unsafe {
            libc::memfd_create(
                c"verbs-membuf".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned
        // by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on a descriptor we own; no memory passed.
        let ok = unsafe {
            libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) == 0
                && libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
                ) == 0
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
        MemBuf::shared_mapping(fd, len, size, None)
    }

    /// Maps a shared buffer of another process, received as `fd`: `len`
    /// bytes that its owner knows at `addr` (which [`MemBuf::addr`]
    /// returns here too, see the module docs).
    ///
    /// # Errors
    /// `InvalidInput` when `addr` is not page-aligned, the descriptor is
    /// not a memfd sealed against shrinking, or is smaller than `len`
    /// bytes rounded up to a page; else the system's, from `mmap`.
    pub fn map_shared(fd: OwnedFd, len: usize, addr: u64) -> std::io::Result<MemBuf> {
        use std::io::{Error, ErrorKind};
        let size = mapped_size(len)?;
        if !addr.is_multiple_of(PAGE as u64) || addr.checked_add(len as u64).is_none() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("shared buffer address {addr:#x} is not page-aligned or wraps"),
            ));
        }
        // SAFETY: a plain call on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "shared buffer is not a memfd sealed against shrinking (MemBuf::new_shared makes one)",
            ));
        }
        // SAFETY: `st` is a plain struct valid for writes; the
        // descriptor is ours.
        let file_size = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Err(Error::last_os_error());
            }
            st.st_size as u64
        };
        if file_size < size as u64 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("shared buffer file holds {file_size} bytes, less than the {size} mapped"),
            ));
        }
        MemBuf::shared_mapping(fd, len, size, Some(addr))
    }

    /// Maps `size` bytes of `fd` shared; the buffer is `len` of them,
    /// named at `addr` (at the mapping itself when `None`).
    fn shared_mapping(
        fd: OwnedFd,
        len: usize,
        size: usize,
        addr: Option<u64>,
    ) -> std::io::Result<MemBuf> {
        // SAFETY: a fresh shared mapping of a file at least `size` bytes
        // long that cannot shrink (sealed: checked by the callers), so
        // every page mapped is backed; nothing in this process refers to
        // it yet. Whole pages: the last word is inside them.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MemBuf(Arc::new(Raw {
            ptr: ptr.cast(),
            len,
            addr: addr.unwrap_or(ptr as u64),
            backing: Backing::Shared { fd, mapped: size },
        })))
    }

    /// The memfd of a shared buffer ([`MemBuf::new_shared`],
    /// [`MemBuf::map_shared`]), to pass to another process; `None` for
    /// private memory.
    pub fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.0.backing {
            Backing::Shared { fd, .. } => Some(fd.as_fd()),
            _ => None,
        }
    }

    /// Virtual address of the first byte (for a mapping of another
    /// process's buffer, the owner's: see the module docs).
    pub fn addr(&self) -> u64 {
        self.0.addr
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

    /// Words `first..first + n` of the buffer (word `i` is bytes
    /// `8i..8i+8`). Panics outside the allocation.
    fn words(&self, first: usize, n: usize) -> &[AtomicU64] {
        assert!(
            first
                .checked_add(n)
                .is_some_and(|e| e <= self.0.len.div_ceil(WORD)),
            "MemBuf word out of bounds"
        );
        // SAFETY: the words are inside the allocation (whole words, see
        // `layout`; a mapping is whole pages), 8-aligned (the base is
        // page-aligned) and valid while `self` holds the allocation;
        // `AtomicU64` has the size and alignment of `u64`. Every safe
        // access to the buffer is an 8-byte atomic on such a word; plain
        // access (`ptr_at`) promises not to race with it.
        unsafe { std::slice::from_raw_parts(self.0.ptr.add(first * WORD).cast(), n) }
    }

    /// Word `i` of the buffer.
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words(i, 1)[0]
    }

    /// Writes `bytes` into word `i` from byte `at` on, keeping the others
    /// (a compare-and-swap of the whole word).
    fn write_part(&self, i: usize, at: usize, bytes: &[u8]) {
        let _ = self
            .word(i)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut w = old.to_ne_bytes();
                w[at..at + bytes.len()].copy_from_slice(bytes);
                Some(u64::from_ne_bytes(w))
            });
    }

    /// How `len` bytes at `off` fall on words: bytes before the first
    /// word boundary, whole words, bytes after the last.
    fn split(off: usize, len: usize) -> (usize, usize, usize) {
        let head = ((WORD - off % WORD) % WORD).min(len);
        let words = (len - head) / WORD;
        (head, words, len - head - words * WORD)
    }

    /// Copies out `out.len()` bytes at offset `off`. Panics out of bounds.
    pub fn read_at(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        let (head, words, _) = Self::split(off, out.len());
        let (h, rest) = out.split_at_mut(head);
        if head > 0 {
            let w = self.word(off / WORD).load(Ordering::Relaxed).to_ne_bytes();
            h.copy_from_slice(&w[off % WORD..off % WORD + head]);
        }
        let first = (off + head) / WORD;
        let (mid, tail) = rest.split_at_mut(words * WORD);
        load_words(self.words(first, words), mid);
        if !tail.is_empty() {
            let w = self.word(first + words).load(Ordering::Relaxed);
            tail.copy_from_slice(&w.to_ne_bytes()[..tail.len()]);
        }
    }

    /// Copies `data` in at offset `off`. Panics out of bounds.
    pub fn write_at(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        let (head, words, _) = Self::split(off, data.len());
        let (h, rest) = data.split_at(head);
        if head > 0 {
            self.write_part(off / WORD, off % WORD, h);
        }
        let first = (off + head) / WORD;
        let (mid, tail) = rest.split_at(words * WORD);
        store_words(self.words(first, words), mid);
        if !tail.is_empty() {
            self.write_part(first + words, 0, tail);
        }
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) {
        // The bytes past `len` in the last word are the allocation's own
        // (see `layout`): nothing reads them.
        let w = u64::from_ne_bytes([byte; WORD]);
        for a in self.words(0, self.0.len.div_ceil(WORD)) {
            a.store(w, Ordering::Relaxed);
        }
    }

    /// Returns a copy of `len` bytes at `off`.
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read_at(off, &mut v);
        v
    }

    /// How many `MemBuf`s (clones of this one) hold the allocation now.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// A reference that keeps the allocation alive (not any registration
    /// of it), for bytes lent to a packet until it is sent.
    pub fn keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.0.clone()
    }

    /// Raw pointer to byte `off`, for plain (non-atomic) access: slices,
    /// the kernel's iovecs.
    ///
    /// # Safety
    /// `off + len` must be within the buffer for whatever the caller does,
    /// and while the caller reads or writes through the pointer (or a
    /// view made from it) nothing else in this process may access those
    /// bytes: no safe access of any `MemBuf` of this allocation, no other
    /// view (see the module docs). The kernel reading them for a send is
    /// not such an access.
    pub unsafe fn ptr_at(&self, off: usize) -> *mut u8 {
        self.0.ptr.add(off)
    }

    /// Copies `len` bytes from `src` at `src_off` to `self` at `dst_off`
    /// (like a DMA engine; ranges may overlap in the same buffer, as
    /// `memmove`'s).
    pub fn copy_from(&self, dst_off: usize, src: &MemBuf, src_off: usize, len: usize) {
        self.check(dst_off, len);
        src.check(src_off, len);
        // When the destination lies after the source in the same buffer,
        // copy from the end, so no byte is overwritten before it is read.
        let backward = Arc::ptr_eq(&self.0, &src.0) && dst_off > src_off;
        if dst_off % WORD != src_off % WORD {
            return self.copy_bounced(dst_off, src, src_off, len, backward);
        }
        // Same alignment: word to word, the partial ends a word each.
        let (head, words, tail) = Self::split(dst_off, len);
        let d = self.words((dst_off + head) / WORD, words);
        let s = src.words((src_off + head) / WORD, words);
        let end = head + words * WORD;
        // The ends lie within one word each, at the same place in the
        // source's word as in the destination's.
        let head_part = (dst_off / WORD, src_off / WORD, dst_off % WORD, head);
        let tail_part = ((dst_off + end) / WORD, (src_off + end) / WORD, 0, tail);
        if backward {
            self.copy_part(src, tail_part);
            let mid = |(d, s): (&AtomicU64, &AtomicU64)| {
                d.store(s.load(Ordering::Relaxed), Ordering::Relaxed)
            };
            d.iter().zip(s).rev().for_each(mid);
            self.copy_part(src, head_part);
        } else {
            self.copy_part(src, head_part);
            copy_words(d, s);
            self.copy_part(src, tail_part);
        }
    }

    /// Copies `n` bytes at byte `at` of word `si` of `src` to the same
    /// bytes of word `di` of `self`, the word's other bytes kept: one
    /// load and one update (an IU's last few bytes cost a bounce through
    /// the stack and ~240 instructions before).
    fn copy_part(&self, src: &MemBuf, (di, si, at, n): (usize, usize, usize, usize)) {
        if n == 0 {
            return;
        }
        // Bytes `at..at + n` of the word's native byte order.
        let ones = u64::MAX >> (8 * (WORD - n));
        let mask = if cfg!(target_endian = "little") {
            ones << (8 * at)
        } else {
            ones << (8 * (WORD - at - n))
        };
        let bytes = src.word(si).load(Ordering::Relaxed) & mask;
        let _ = self
            .word(di)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(old & !mask | bytes)
            });
    }

    /// [`MemBuf::copy_from`] through a buffer on the stack, a piece at a
    /// time, from the end when `backward`.
    fn copy_bounced(
        &self,
        dst_off: usize,
        src: &MemBuf,
        src_off: usize,
        len: usize,
        backward: bool,
    ) {
        // The ends of an aligned copy are 0 to 7 bytes, an IU a few dozen:
        // zeroing 512 bytes for them cost more than the copy.
        if len == 0 {
            return;
        }
        let mut small = [0u8; 64];
        let mut big;
        let tmp: &mut [u8] = if len <= small.len() {
            &mut small
        } else {
            big = [0u8; 512];
            &mut big
        };
        let pieces = len.div_ceil(tmp.len());
        for p in 0..pieces {
            let p = if backward { pieces - 1 - p } else { p };
            let at = p * tmp.len();
            let n = tmp.len().min(len - at);
            src.read_at(src_off + at, &mut tmp[..n]);
            self.write_at(dst_off + at, &tmp[..n]);
        }
    }

    /// 8-byte atomic at `off` (must be 8-byte aligned): `f(old) -> new`,
    /// returns the old value. Used for IBA atomics (9.4.5).
    pub fn atomic_u64(&self, off: usize, f: impl Fn(u64) -> u64) -> u64 {
        self.check(off, 8);
        assert!(
            (self.addr() as usize + off) & 7 == 0,
            "atomic on unaligned address"
        );
        let a = self.word(off / WORD);
        let mut cur = a.load(Ordering::SeqCst);
        loop {
            match a.compare_exchange_weak(cur, f(cur), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(old) => return old,
                Err(now) => cur = now,
            }
        }
    }
}

/// Copies of whole 64-byte blocks in 16-byte accesses, the buffer's side
/// aligned (`movdqa`, atomic on processors with AVX; see the module
/// docs), a plain slice's side unaligned (`movdqu`: no other thread
/// touches a slice). Inline assembly, because the compiler never
/// vectorises atomics and has no 16-byte atomic; the assembly's accesses
/// to the buffer are, to the Rust memory model, two relaxed 8-byte
/// atomics per 16 bytes, which racing safe accesses are allowed to meet.
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod wide {
    /// Words a copy must have before the wide path is worth its setup.
    pub(super) const MIN_WORDS: usize = 16;

    /// Whether this processor makes aligned 16-byte SSE accesses atomic
    /// (it has AVX; the answer is cached by the standard library).
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx")
    }

    macro_rules! copy_blocks {
        ($name:ident, $load:literal, $store:literal) => {
            /// Copies `blocks` (at least 1) 64-byte blocks from `src` to
            /// `dst`, first byte first: an odd block alone, then two a
            /// step (eight loads, then eight stores).
            ///
            /// # Safety
            /// `src` is readable and `dst` writable for `64 * blocks`
            /// bytes; a side accessed with `movdqa` is 16-byte aligned;
            /// ranges that overlap have `dst` before `src` (each step
            /// loads all it moves before it stores, and stores only below
            /// what later steps load); AVX is [`available`].
            pub(super) unsafe fn $name(dst: *mut u8, src: *const u8, blocks: usize) {
                debug_assert!(blocks > 0);
                std::arch::asm!(
                    "test {n}, 1",
                    "jz 3f",
                    concat!($load, " xmm0, [{s}]"),
                    concat!($load, " xmm1, [{s} + 16]"),
                    concat!($load, " xmm2, [{s} + 32]"),
                    concat!($load, " xmm3, [{s} + 48]"),
                    concat!($store, " [{d}], xmm0"),
                    concat!($store, " [{d} + 16], xmm1"),
                    concat!($store, " [{d} + 32], xmm2"),
                    concat!($store, " [{d} + 48], xmm3"),
                    "add {s}, 64",
                    "add {d}, 64",
                    "3:",
                    "shr {n}, 1",
                    "jz 4f",
                    "2:",
                    concat!($load, " xmm0, [{s}]"),
                    concat!($load, " xmm1, [{s} + 16]"),
                    concat!($load, " xmm2, [{s} + 32]"),
                    concat!($load, " xmm3, [{s} + 48]"),
                    concat!($load, " xmm4, [{s} + 64]"),
                    concat!($load, " xmm5, [{s} + 80]"),
                    concat!($load, " xmm6, [{s} + 96]"),
                    concat!($load, " xmm7, [{s} + 112]"),
                    concat!($store, " [{d}], xmm0"),
                    concat!($store, " [{d} + 16], xmm1"),
                    concat!($store, " [{d} + 32], xmm2"),
                    concat!($store, " [{d} + 48], xmm3"),
                    concat!($store, " [{d} + 64], xmm4"),
                    concat!($store, " [{d} + 80], xmm5"),
                    concat!($store, " [{d} + 96], xmm6"),
                    concat!($store, " [{d} + 112], xmm7"),
                    "add {s}, 128",
                    "add {d}, 128",
                    "dec {n}",
                    "jnz 2b",
                    "4:",
                    s = inout(reg) src => _,
                    d = inout(reg) dst => _,
                    n = inout(reg) blocks => _,
                    out("xmm0") _,
                    out("xmm1") _,
                    out("xmm2") _,
                    out("xmm3") _,
                    out("xmm4") _,
                    out("xmm5") _,
                    out("xmm6") _,
                    out("xmm7") _,
                    options(nostack),
                );
            }
        };
    }

    // Buffer to slice, slice to buffer, buffer to buffer.
    copy_blocks!(load, "movdqa", "movdqu");
    copy_blocks!(store, "movdqu", "movdqa");
    copy_blocks!(copy, "movdqa", "movdqa");
}

/// Whether a copy of `words` words starting at `at` (a buffer word) takes
/// the wide path, and how many words go before it to align `at` to 16
/// bytes (0 or 1).
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn wide_plan(at: *const AtomicU64, words: usize) -> Option<usize> {
    (words >= wide::MIN_WORDS && wide::available()).then_some((at as usize / WORD) % 2)
}

/// Words copied per step by the loops below: eight loads, then eight
/// stores, with one bound check and one branch for all of them. Atomic
/// accesses are never merged or vectorised by the compiler, so a loop of
/// one word per step spends more on its own bookkeeping than on the copy
/// (about 4.5 instructions per word against 2.3).
const UNROLL: usize = 8;

/// Relaxed loads of `src` into `out` (`out.len() == 8 * src.len()`).
fn load_words(src: &[AtomicU64], out: &mut [u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if let Some(head) = wide_plan(src.as_ptr(), src.len()) {
        let blocks = (src.len() - head) / UNROLL;
        let (src_head, rest) = src.split_at(head);
        let (src_mid, src_tail) = rest.split_at(blocks * UNROLL);
        let (out_head, rest) = out.split_at_mut(head * WORD);
        let (out_mid, out_tail) = rest.split_at_mut(blocks * UNROLL * WORD);
        load_words_narrow(src_head, out_head);
        // SAFETY: `src_mid` is `blocks` 64-byte blocks of the buffer, 16-byte
        // aligned (`head` words skipped to align it), `out_mid` as long and
        // this call's alone; a slice never overlaps the buffer's words
        // (it would have to be a plain view of them, which `ptr_at`
        // forbids while safe accesses run); `wide_plan` checked AVX.
        unsafe { wide::load(out_mid.as_mut_ptr(), src_mid.as_ptr().cast(), blocks) };
        load_words_narrow(src_tail, out_tail);
        return;
    }
    load_words_narrow(src, out);
}

/// [`load_words`] a word at a time (eight per step).
fn load_words_narrow(src: &[AtomicU64], out: &mut [u8]) {
    let (outs, out_rest) = out.as_chunks_mut::<{ UNROLL * WORD }>();
    let (srcs, src_rest) = src.as_chunks::<UNROLL>();
    for (o, s) in outs.iter_mut().zip(srcs) {
        let v: [u64; UNROLL] = std::array::from_fn(|k| s[k].load(Ordering::Relaxed));
        for (o, v) in o.as_chunks_mut::<WORD>().0.iter_mut().zip(v) {
            *o = v.to_ne_bytes();
        }
    }
    for (o, s) in out_rest.chunks_exact_mut(WORD).zip(src_rest) {
        o.copy_from_slice(&s.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Relaxed stores of `data` into `dst` (`data.len() == 8 * dst.len()`).
fn store_words(dst: &[AtomicU64], data: &[u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if let Some(head) = wide_plan(dst.as_ptr(), dst.len()) {
        let blocks = (dst.len() - head) / UNROLL;
        let (dst_head, rest) = dst.split_at(head);
        let (dst_mid, dst_tail) = rest.split_at(blocks * UNROLL);
        let (data_head, rest) = data.split_at(head * WORD);
        let (data_mid, data_tail) = rest.split_at(blocks * UNROLL * WORD);
        store_words_narrow(dst_head, data_head);
        // SAFETY: as in `load_words`, the other way: `dst_mid` is `blocks`
        // aligned blocks of the buffer, `data_mid` as long, not the
        // buffer's bytes.
        unsafe { wide::store(dst_mid.as_ptr() as *mut u8, data_mid.as_ptr(), blocks) };
        store_words_narrow(dst_tail, data_tail);
        return;
    }
    store_words_narrow(dst, data);
}

/// [`store_words`] a word at a time (eight per step).
fn store_words_narrow(dst: &[AtomicU64], data: &[u8]) {
    let (datas, data_rest) = data.as_chunks::<{ UNROLL * WORD }>();
    let (dsts, dst_rest) = dst.as_chunks::<UNROLL>();
    for (d, v) in dsts.iter().zip(datas) {
        for (d, w) in d.iter().zip(v.as_chunks::<WORD>().0) {
            d.store(u64::from_ne_bytes(*w), Ordering::Relaxed);
        }
    }
    for (d, w) in dst_rest.iter().zip(data_rest.chunks_exact(WORD)) {
        d.store(word_of(w), Ordering::Relaxed);
    }
}

/// Relaxed word-by-word copy from `src` to `dst`, first word first (the
/// caller copies overlapping ranges backward itself).
fn copy_words(dst: &[AtomicU64], src: &[AtomicU64]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if let Some(head) = wide_plan(dst.as_ptr(), dst.len()) {
        let (d, s) = (dst.as_ptr() as usize, src.as_ptr() as usize);
        // Both sides aligned alike, and far enough apart that a 64-byte
        // block never reads what the same call wrote.
        if (d ^ s) % 16 == 0 && d.abs_diff(s) >= UNROLL * WORD {
            let blocks = (dst.len() - head) / UNROLL;
            let (dst_head, rest) = dst.split_at(head);
            let (dst_mid, dst_tail) = rest.split_at(blocks * UNROLL);
            let (src_head, rest) = src.split_at(head);
            let (src_mid, src_tail) = rest.split_at(blocks * UNROLL);
            copy_words_narrow(dst_head, src_head);
            // SAFETY: `dst_mid` and `src_mid` are `blocks` 16-byte aligned
            // blocks of buffers; a forward copy of blocks at least one
            // block apart reads each source byte before any block of this
            // call writes it when `dst` is before `src`, and the caller
            // never makes a forward copy with `dst` after an overlapping
            // `src` (it copies those backward, word by word).
            unsafe { wide::copy(dst_mid.as_ptr() as *mut u8, src_mid.as_ptr().cast(), blocks) };
            copy_words_narrow(dst_tail, src_tail);
            return;
        }
    }
    copy_words_narrow(dst, src);
}

/// [`copy_words`] a word at a time (eight per step).
fn copy_words_narrow(dst: &[AtomicU64], src: &[AtomicU64]) {
    let (dsts, dst_rest) = dst.as_chunks::<UNROLL>();
    let (srcs, src_rest) = src.as_chunks::<UNROLL>();
    for (d, s) in dsts.iter().zip(srcs) {
        let v: [u64; UNROLL] = std::array::from_fn(|k| s[k].load(Ordering::Relaxed));
        for (d, v) in d.iter().zip(v) {
            d.store(v, Ordering::Relaxed);
        }
    }
    for (d, s) in dst_rest.iter().zip(src_rest) {
        d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads, writes and copies of every length up to a few blocks, at
    /// every offset within two words (so both the wide path, with and
    /// without its aligning word, and the word loops run), give the bytes
    /// a plain model gives.
    #[test]
    fn copies_of_every_shape_match_a_plain_model() {
        let n = 1024;
        let b = MemBuf::new(n);
        let c = MemBuf::new(n);
        let pattern: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
        for len in (0..300).chain([511, 512, 513, 700]) {
            for off in 0..16 {
                if off + len > n {
                    continue;
                }
                b.fill(0);
                let mut model = vec![0u8; n];
                b.write_at(off, &pattern[..len]);
                model[off..off + len].copy_from_slice(&pattern[..len]);
                assert_eq!(b.to_vec(0, n), model, "write_at({off}, {len})");
                let mut out = vec![0u8; len];
                b.read_at(off, &mut out);
                assert_eq!(out, &model[off..off + len], "read_at({off}, {len})");
                // Into another buffer at each alignment, and within this
                // one forward (the destination before the source).
                for dst_off in [0, 8, 16 + off % 8] {
                    c.fill(0xee);
                    c.copy_from(dst_off, &b, off, len);
                    let mut want = vec![0xeeu8; n];
                    want[dst_off..dst_off + len].copy_from_slice(&model[off..off + len]);
                    assert_eq!(c.to_vec(0, n), want, "copy {len} from {off} to {dst_off}");
                }
                if off >= 8 && len > 0 {
                    let mut want = model.clone();
                    want.copy_within(off..off + len, off - 8);
                    b.copy_from(off - 8, &b, off, len);
                    assert_eq!(b.to_vec(0, n), want, "move {len} from {off} back 8");
                }
            }
        }
    }

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

    /// Pages of `b` the kernel has backed now (`mincore`).
    fn resident_pages(b: &MemBuf) -> usize {
        let pages = b.len().div_ceil(PAGE);
        let mut v = vec![0u8; pages];
        // SAFETY: the range is this buffer's own mapping (page-aligned,
        // whole pages); `v` has one byte per page.
        let r = unsafe { libc::mincore(b.0.ptr.cast(), b.len(), v.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        v.iter().filter(|p| *p & 1 == 1).count()
    }

    /// A store's pages are all backed when it is made, a plain buffer's
    /// when first touched; the bytes read as zero either way, and
    /// committing again keeps what was written.
    #[test]
    fn a_store_is_committed_when_made() {
        let len = 4 << 20;
        let plain = MemBuf::new(len);
        assert_eq!(resident_pages(&plain), 0);
        let store = MemBuf::for_store(len).unwrap();
        assert_eq!(resident_pages(&store), len / PAGE);
        assert_eq!(store.to_vec(len - 8, 8), vec![0; 8]);
        store.write_at(12_345, b"kept");
        store.commit().unwrap();
        assert_eq!(store.to_vec(12_345, 4), b"kept");
        assert_eq!(MemBuf::for_store(0).unwrap().len(), 0);
        let too_big = MemBuf::for_store(usize::MAX / 2).unwrap_err();
        assert_eq!(too_big.raw_os_error(), Some(libc::ENOMEM), "{too_big}");
    }

    /// A shared buffer's bytes are the same through a second mapping of
    /// its descriptor (what the NIC daemon makes), which keeps the
    /// owner's address; a descriptor that is not a sealed memfd, or too
    /// small, is refused.
    #[test]
    fn shared_buffers_map_elsewhere_with_the_owners_address() {
        let a = MemBuf::new_shared(10_000).unwrap();
        let fd = a.shared_fd().unwrap().try_clone_to_owned().unwrap();
        let b = MemBuf::map_shared(fd, a.len(), a.addr()).unwrap();
        assert_eq!(b.addr(), a.addr());
        // SAFETY: only read to compare; nothing writes meanwhile.
        assert_ne!(unsafe { b.ptr_at(0) }, unsafe { a.ptr_at(0) });
        a.write_at(9_990, b"0123456789");
        assert_eq!(b.to_vec(9_990, 10), b"0123456789");
        b.write_at(0, &[7; 3]);
        assert_eq!(a.to_vec(0, 4), [7, 7, 7, 0]);
        assert_eq!(b.atomic_u64(8, |v| v + 1), 0);
        assert_eq!(a.to_vec(8, 8), 1u64.to_ne_bytes());
        // Larger than the file (10_000 rounds to 12_288 bytes).
        let fd = a.shared_fd().unwrap().try_clone_to_owned().unwrap();
        let e = MemBuf::map_shared(fd, 12_289, a.addr()).unwrap_err();
        assert!(e.to_string().contains("less than"), "{e}");
        // Not page-aligned.
        let fd = a.shared_fd().unwrap().try_clone_to_owned().unwrap();
        assert!(MemBuf::map_shared(fd, 100, a.addr() + 8).is_err());
        // Not a sealed memfd: a file the owner could shrink.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let e = MemBuf::map_shared(f.into(), 100, 0).unwrap_err();
        assert!(e.to_string().contains("sealed"), "{e}");
        assert!(MemBuf::new(10).shared_fd().is_none());
    }

    #[test]
    fn atomic_returns_old_value() {
        let b = MemBuf::new(16);
        assert_eq!(b.atomic_u64(8, |v| v + 5), 0);
        assert_eq!(b.atomic_u64(8, |v| v + 5), 5);
        assert_eq!(b.to_vec(8, 8), 10u64.to_ne_bytes().to_vec());
    }

    /// Every offset and length around word boundaries, and across the
    /// eight-word steps of the copy loops, reads back what was written,
    /// and bytes outside the write keep their value (the ends of a write
    /// are compare-and-swaps of their words).
    #[test]
    fn unaligned_reads_and_writes_match_a_plain_model() {
        let b = MemBuf::new(211);
        let mut model = vec![0u8; 211];
        let mut n = 0u8;
        for off in 0..24 {
            for len in 0..=(211 - off).min(150) {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        n = n.wrapping_add(37);
                        n
                    })
                    .collect();
                b.write_at(off, &data);
                model[off..off + len].copy_from_slice(&data);
                assert_eq!(b.to_vec(0, 211), model, "write {len} at {off}");
                assert_eq!(b.to_vec(off, len), data, "read {len} at {off}");
            }
        }
        b.fill(0xa5);
        assert_eq!(b.to_vec(0, 211), vec![0xa5; 211]);
    }

    /// `copy_from` is a `memmove`: overlapping ranges of one buffer, either
    /// direction, equal or different word alignment, and between buffers.
    #[test]
    fn copy_from_moves_like_memmove() {
        let b = MemBuf::new(3000);
        let init: Vec<u8> = (0..3000).map(|i| (i * 7 % 251) as u8).collect();
        for (dst, src, len) in [
            (8, 0, 2000),
            (0, 8, 2000),
            (13, 5, 1900),
            (5, 13, 1900),
            (3, 0, 2500),
            (0, 3, 2500),
            (1000, 1000, 100),
            (7, 1, 6),
            // Same place in their words, the ends partial: forward,
            // backward (overlapping), within one word, and words apart.
            (21, 5, 30),
            (5, 21, 30),
            (2, 10, 5),
            (10, 2, 5),
            (101, 37, 3),
            (37, 101, 11),
        ] {
            b.write_at(0, &init);
            let mut model = init.clone();
            model.copy_within(src..src + len, dst);
            b.copy_from(dst, &b.clone(), src, len);
            assert_eq!(b.to_vec(0, 3000), model, "{len} from {src} to {dst}");
        }
        let other = MemBuf::new(100);
        other.copy_from(3, &b, 17, 90);
        assert_eq!(other.to_vec(3, 90), b.to_vec(17, 90));
    }

    /// Threads writing and reading the same bytes at once through the safe
    /// API: defined behaviour (every access is an atomic word), and each
    /// aligned word a reader sees is one some writer wrote whole. A data
    /// race is undefined behaviour, not a result a test can observe, so
    /// this shows the guarantee, not the old race (that one ThreadSanitizer
    /// reports: see the commit that made the copies atomic).
    #[test]
    fn racing_safe_accesses_see_whole_words() {
        let b = MemBuf::new(4096);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = [0x11u8, 0x22]
            .into_iter()
            .map(|v| {
                let (b, stop) = (b.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        b.write_at(0, &[v; 4096]);
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let seen = b.to_vec(0, 4096);
            for w in seen.chunks_exact(8) {
                assert!(w.iter().all(|x| *x == w[0]), "torn word {w:?}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().for_each(|t| t.join().unwrap());
    }
}
