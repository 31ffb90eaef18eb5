//! Memory registration of an application's ordinary memory.
//!
//! The NIC daemon reaches a region only through a memfd it maps
//! (`nicd::client`), but an rdma-core application registers whatever it
//! has: heap from `malloc`/`memalign`, a static array, a stack buffer.
//! So registration moves the application's pages into a memfd without
//! moving their addresses: the pages covering the range are copied into
//! a new memfd, which is then mapped over them (`MAP_SHARED |
//! MAP_FIXED`, one `mmap` that replaces the old pages), and that memfd
//! is what the daemon maps. From then on the application and the daemon's
//! NIC touch the same physical pages, as an HCA's DMA does with pinned
//! pages: no copy on any post or completion.
//!
//! Cost and limits, written down:
//! - One copy of the registered pages (whole pages: the range rounded
//!   out to 4 KiB) at registration, and an `mmap`; nothing per I/O.
//! - The pages stay memfd pages after deregistration (the application
//!   still owns the memory; it reads and writes as before).
//! - A write by another thread to those pages between the copy and the
//!   `mmap` is lost: register memory no other thread is writing, as
//!   rdma-core's documentation asks of fork safety anyway. The threads
//!   of this library allocate from an allocator of their own
//!   (mimalloc, `lib.rs`), so they never write the application's heap
//!   (whose bookkeeping sits in the pages around a `malloc`ed buffer).
//! - Only private writable mappings are moved (heap, anonymous, a
//!   program's data); a range in a shared or read-only mapping is
//!   refused (`EINVAL`), since moving it would change what others see.
//! - The moved pages are marked `MADV_DONTFORK` (what `ibv_fork_init`
//!   asks of registered memory), so a child never shares them.
//! - A range inside pages an earlier live registration moved is served
//!   from that memfd; one that starts inside them and goes past their
//!   end grows that memfd (the earlier registration keeps its start);
//!   any other partial overlap is refused (`EINVAL`): the earlier
//!   region's memfd would no longer be the pages the application sees.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use verbs::MemBuf;

const PAGE: u64 = 4096;

/// A moved range of pages and the live registrations on it.
struct Region {
    buf: MemBuf,
    users: usize,
}

/// Moved regions by first page address.
static REGIONS: Mutex<BTreeMap<u64, Region>> = Mutex::new(BTreeMap::new());

fn regions() -> MutexGuard<'static, BTreeMap<u64, Region>> {
    REGIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a range cannot be registered, as the errno to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The errno.
    pub errno: i32,
    /// Why, for the log.
    pub why: String,
}

fn refused(errno: i32, why: impl Into<String>) -> Refused {
    Refused {
        errno,
        why: why.into(),
    }
}

/// The page range covering `[addr, addr + len)`.
pub fn page_span(addr: u64, len: u64) -> Option<(u64, u64)> {
    let end = addr.checked_add(len.max(1))?;
    let lo = addr & !(PAGE - 1);
    let hi = end.checked_next_multiple_of(PAGE)?;
    Some((lo, hi))
}

/// The shared buffer covering `[addr, addr + len)` of this process,
/// moving its pages into a memfd first if no registration did (see the
/// module docs). Each call must be paired with a [`release`] of the
/// returned buffer's address.
///
/// # Errors
/// `EINVAL` for an empty or wrapping range, a range not in private
/// writable memory, or one partly over an earlier region; the system's
/// errno when a memfd or mapping cannot be made.
pub fn share(addr: u64, len: u64) -> Result<MemBuf, Refused> {
    if len == 0 {
        return Err(refused(libc::EINVAL, "an empty memory region"));
    }
    let (lo, hi) = page_span(addr, len).ok_or_else(|| refused(libc::EINVAL, "the range wraps"))?;
    let mut map = regions();
    // The region starting at or before `lo`, and any starting inside.
    if let Some((&start, len)) = map.range(..=lo).next_back().map(|(s, r)| (s, r.buf.len())) {
        let end = start + len as u64;
        let clear_above = map.range(end..hi.max(end)).next().is_none();
        let r = map.get_mut(&start).expect("the region just found");
        if lo >= start && hi <= end {
            r.users += 1;
            return Ok(r.buf.clone());
        }
        if lo < end {
            // Past the region's end only (two buffers of one struct
            // registered one after the other, as fio's rdma engine
            // does): the region grows, so both registrations stay on
            // one memfd whose start the earlier one's MR maps.
            if hi > end && clear_above {
                check_private_writable(end, hi)?;
                let buf = grow(&r.buf, end, hi)?;
                r.buf = buf.clone();
                r.users += 1;
                return Ok(buf);
            }
            return Err(overlap(lo, hi, start, end));
        }
    }
    if let Some((&start, r)) = map.range(lo..hi).next() {
        return Err(overlap(lo, hi, start, start + r.buf.len() as u64));
    }
    check_private_writable(lo, hi)?;
    let buf = move_pages(lo, hi)?;
    map.insert(
        lo,
        Region {
            buf: buf.clone(),
            users: 1,
        },
    );
    Ok(buf)
}

fn overlap(lo: u64, hi: u64, start: u64, end: u64) -> Refused {
    refused(
        libc::EINVAL,
        format!(
            "pages {lo:#x}..{hi:#x} partly overlap the registered pages {start:#x}..{end:#x}: \
             register the whole range once, or ranges on pages of their own"
        ),
    )
}

/// Ends a registration on the region starting at `start` (a buffer's
/// [`MemBuf::addr`] from [`share`]); the last one forgets the region (its
/// pages stay the application's, in the memfd).
pub fn release(start: u64) {
    let mut map = regions();
    if let Some(r) = map.get_mut(&start) {
        r.users -= 1;
        if r.users == 0 {
            map.remove(&start);
        }
    }
}

/// Refuses a range not wholly inside private writable mappings
/// (`/proc/self/maps`).
fn check_private_writable(lo: u64, hi: u64) -> Result<(), Refused> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| refused(libc::EINVAL, format!("/proc/self/maps: {e}")))?;
    let mut at = lo;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= at || a > at {
            continue;
        }
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            return Err(refused(
                libc::EINVAL,
                format!(
                    "pages {lo:#x}..{hi:#x} lie in a mapping with permissions {perms}: only \
                     private writable memory (heap, anonymous, data) can be registered"
                ),
            ));
        }
        at = b;
        if at >= hi {
            return Ok(());
        }
    }
    Err(refused(
        libc::EFAULT,
        format!("pages {lo:#x}..{at:#x}..{hi:#x} are not all mapped"),
    ))
}

/// Grows region `buf` (ending at `end`) to `hi`: pages `end..hi` are
/// copied onto the end of its memfd, which is then mapped over them; the
/// registrations on the region keep the memfd's first part.
fn grow(buf: &MemBuf, end: u64, hi: u64) -> Result<MemBuf, Refused> {
    let sys = |what: &str| {
        let e = std::io::Error::last_os_error();
        refused(
            e.raw_os_error().unwrap_or(libc::ENOMEM),
            format!("{what}: {e}"),
        )
    };
    let fd = buf
        .shared_fd()
        .ok_or_else(|| refused(libc::EINVAL, "a region that is not a memfd"))?
        .try_clone_to_owned()
        .map_err(|_| sys("dup of the region's memfd"))?;
    let old = (end - buf.addr()) as usize;
    let add = (hi - end) as usize;
    // SAFETY: `end..hi` is mapped readable (checked by the caller);
    // pwrite only reads it. Growing a memfd sealed against shrinking is
    // allowed, and the daemon's mappings of its first part stay.
    let copied = unsafe {
        libc::ftruncate(fd.as_raw_fd(), (old + add) as libc::off_t) == 0
            && libc::pwrite(
                fd.as_raw_fd(),
                end as *const libc::c_void,
                add,
                old as libc::off_t,
            ) == add as isize
    };
    if !copied {
        return Err(sys("copying the pages onto the region's memfd"));
    }
    // SAFETY: as in `move_pages`: the application's private pages
    // `end..hi` replaced by the memfd part holding their copy.
    let p = unsafe {
        libc::mmap(
            end as *mut libc::c_void,
            add,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            old as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(sys("mapping the memfd over the pages"));
    }
    // SAFETY: advice on pages just mapped; failure only loses the advice.
    unsafe { libc::madvise(p, add, libc::MADV_DONTFORK) };
    MemBuf::map_shared(fd, old + add, buf.addr()).map_err(|e| {
        refused(
            e.raw_os_error().unwrap_or(libc::ENOMEM),
            format!("a view of the memfd: {e}"),
        )
    })
}

/// Copies pages `lo..hi` into a new memfd and maps it over them.
fn move_pages(lo: u64, hi: u64) -> Result<MemBuf, Refused> {
    let size = (hi - lo) as usize;
    let sys = |what: &str| {
        let e = std::io::Error::last_os_error();
        refused(
            e.raw_os_error().unwrap_or(libc::ENOMEM),
            format!("{what}: {e}"),
        )
    };
    // SAFETY: the name is NUL-terminated; the descriptor is ours alone.
    let fd = unsafe {
        libc::memfd_create(
            c"ibverbs-abi-mr".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(sys("memfd_create"));
    }
    // SAFETY: just returned by memfd_create, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `lo..hi` is mapped readable (checked by the caller against
    // /proc/self/maps); pwrite only reads it. The seal keeps the file
    // from shrinking under the daemon's mapping.
    let copied = unsafe {
        libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) == 0
            && libc::pwrite(fd.as_raw_fd(), lo as *const libc::c_void, size, 0) == size as isize
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
            ) == 0
    };
    if !copied {
        return Err(sys("copying the pages into a memfd"));
    }
    // SAFETY: replaces the application's private pages `lo..hi` with the
    // memfd holding their copy: the same bytes at the same addresses,
    // readable and writable as before (checked: a private rw mapping).
    // This is the one place the application's address space changes.
    let p = unsafe {
        libc::mmap(
            lo as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(sys("mapping the memfd over the pages"));
    }
    // SAFETY: advice on pages just mapped; failure only loses the advice.
    unsafe { libc::madvise(p, size, libc::MADV_DONTFORK) };
    MemBuf::map_shared(fd, size, lo).map_err(|e| {
        refused(
            e.raw_os_error().unwrap_or(libc::ENOMEM),
            format!("a view of the memfd: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_rounded_out_to_whole_pages() {
        assert_eq!(page_span(0x1010, 0x10), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x1000, 0x1000), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x1fff, 2), Some((0x1000, 0x3000)));
        assert_eq!(page_span(u64::MAX - 2, 8), None);
    }

    #[test]
    fn registered_heap_keeps_its_bytes_and_shares_them_with_the_memfd() {
        // Pages of its own: moving heap pages shared with other tests'
        // objects would race with their threads (see the module docs).
        // SAFETY: a fresh private anonymous mapping, ours alone, never
        // unmapped (a test's few pages).
        let v: &mut [u8] = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                5 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::slice::from_raw_parts_mut(p.cast(), 5 * 4096)
        };
        for (i, b) in v.iter_mut().enumerate() {
            *b = i as u8;
        }
        // From the second page: the first stays the application's own.
        let base = v.as_ptr() as u64;
        let addr = base + 4096 + 100;
        let buf = share(addr, 5000).unwrap();
        assert_eq!(buf.addr(), base + 4096);
        // The application still sees its bytes at its addresses.
        assert!(v.iter().enumerate().all(|(i, b)| *b == i as u8));
        // The memfd holds the same pages: a write through the
        // application's address shows in the shared buffer.
        v[4096 + 200] = 0xee;
        let off = (base + 4096 + 200 - buf.addr()) as usize;
        let mut one = [0u8];
        buf.read_at(off, &mut one);
        assert_eq!(one[0], 0xee);
        // A second registration inside shares the region.
        let again = share(addr + 8, 16).unwrap();
        assert_eq!(again.addr(), buf.addr());
        let (lo, hi) = page_span(addr, 5000).unwrap();
        assert_eq!(hi - lo, 2 * 4096);
        // One from inside past the end grows it: one memfd, the first
        // registration's bytes where they were, the new page's bytes
        // kept and shared.
        let grown = share(hi - 8, 4096).unwrap();
        assert_eq!((grown.addr(), grown.len()), (lo, 3 * 4096));
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, b)| *b == i as u8 || i == 4096 + 200));
        v[3 * 4096 + 7] = 0x5a;
        grown.read_at(2 * 4096 + 7, &mut one);
        assert_eq!(one[0], 0x5a);
        buf.read_at(off, &mut one);
        assert_eq!(one[0], 0xee);
        // One starting before the region and ending inside is refused.
        let err = share(lo - 8, 16).unwrap_err();
        assert_eq!(err.errno, libc::EINVAL, "{}", err.why);
        release(lo);
        release(lo);
        assert!(regions().get(&lo).is_some());
        release(lo);
        assert!(regions().get(&lo).is_none());
        assert_eq!(share(0, 0).unwrap_err().errno, libc::EINVAL);
    }

    #[test]
    fn read_only_memory_is_refused() {
        static TEXT: [u8; 64] = [7; 64];
        let err = share(TEXT.as_ptr() as u64, 64).unwrap_err();
        assert_eq!(err.errno, libc::EINVAL, "{}", err.why);
        assert!(err.why.contains("private writable"), "{}", err.why);
    }
}
