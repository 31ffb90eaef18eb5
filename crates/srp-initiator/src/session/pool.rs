//! The data pool: runs of registered pages lent to commands, and the
//! direct descriptors that point into them.

use super::*;

impl Inner {
    /// Pages per segment of a `pages`-page buffer: all of them, or
    /// `max_segment`'s worth when buffers are split.
    /// Descriptors one command may carry: `sg_tablesize` (at most
    /// [`MAX_EXT_DESCRIPTORS`]) with external tables, else no more than
    /// fit in the IU (`cmd_sg_entries`), as ib_srp limits `sg_tablesize`
    /// to `cmd_sg_entries` when it cannot use external tables.
    pub(super) fn max_descriptors(&self) -> usize {
        if self.register_always {
            // A window per descriptor and one for a table, within the
            // send queue's room (see `WINDOWS_PER_CMD`).
            return (WINDOWS_PER_CMD - 1).min(if self.allow_ext_sg {
                usize::MAX
            } else {
                usize::from(self.cmd_sg_entries)
            });
        }
        let sg = (self.sg_tablesize as usize).min(MAX_EXT_DESCRIPTORS);
        if self.allow_ext_sg {
            sg
        } else {
            sg.min(usize::from(self.cmd_sg_entries))
        }
    }

    pub(super) fn seg_pages(&self, pages: usize) -> usize {
        if self.max_segment == 0 {
            pages
        } else {
            (self.max_segment as usize).div_ceil(self.page).max(1)
        }
    }

    /// First-fit runs of free pages; split into runs of `max_segment` placed
    /// one page apart when segments are asked for.
    pub(super) fn alloc(&self, st: &mut State, pages: usize) -> Option<Runs> {
        if pages == 0 {
            return Some(Runs::new());
        }
        if self.max_segment == 0 {
            // Unsplit: one run, without the loop.
            let start = st.pages.find_free(0, pages)?;
            st.pages.set(start, pages, true);
            let mut runs = Runs::new();
            runs.push((start, pages));
            return Some(runs);
        }
        let seg_pages = self.seg_pages(pages);
        let mut runs = Runs::new();
        let mut left = pages;
        let mut from = 0;
        while left > 0 {
            let want = left.min(seg_pages);
            let Some(start) = st.pages.find_free(from, want) else {
                self.free(st, &runs);
                return None;
            };
            st.pages.set(start, want, true);
            runs.push((start, want));
            left -= want;
            // Leave a gap so consecutive segments are not contiguous.
            from = start + want + usize::from(self.max_segment != 0);
        }
        Some(runs)
    }

    /// Copies a command's data out of its pool pages, `runs` in order
    /// (as [`Inner::segments`] lays the data out), into `dst` until it is
    /// full. A command keeps its runs, not its segments: less to move.
    pub(super) fn copy_out(&self, runs: &[(usize, usize)], dst: &mut [u8]) {
        let mut at = 0;
        for &(start, pages) in runs {
            if at >= dst.len() {
                break;
            }
            let n = (pages * self.page).min(dst.len() - at);
            self.pool.read_at(start * self.page, &mut dst[at..at + n]);
            at += n;
        }
    }

    /// [`Inner::free`] of a finished command's pages, waking the callers
    /// that wait for pages (or a credit) if any do.
    pub(super) fn give_back(&self, st: &mut State, runs: &[(usize, usize)]) {
        self.free(st, runs);
        if st.cv_waiters > 0 {
            self.cv.notify_all();
        }
    }

    pub(super) fn free(&self, st: &mut State, runs: &[(usize, usize)]) {
        for &(start, n) in runs {
            st.pages.set(start, n, false);
        }
    }

    /// A free window (a new one when none is) for the bytes `d` points
    /// at, with the R_Key it gets (the window's key with the next value
    /// in its low byte, IBA 10.6.7.2.1), written into `d`: the window,
    /// its key before and after, and the work request that binds it.
    ///
    /// # Errors
    /// A NIC that cannot make another window.
    pub(super) fn window_for(
        &self,
        st: &mut State,
        d: &mut DirectBuf,
    ) -> Result<((MwHandle, Rkey, Rkey), SendWr), SessionError> {
        let (w, old) = match st.windows.pop() {
            Some(w) => w,
            None => {
                let w = self
                    .provider
                    .alloc_mw(self.pd, MwType::Type2, 0)
                    .map_err(|err| SessionError::Verbs {
                        what: "allocate a memory window (register_always)",
                        err,
                    })?;
                st.windows_made.push(w.0);
                w
            }
        };
        let new = Rkey((old.0 & !0xff) | (old.0.wrapping_add(1) & 0xff));
        d.key = new;
        let mut wr = SendWr::new(KIND_MW, SendOpcode::BindMw, Vec::new());
        // Unsignaled: a failed bind still completes (in error) and fails
        // the connection; the SRP_CMD behind it is what the target sees.
        wr.flags = SendFlags(0);
        wr.bind_mw = Some(MwBind {
            mw: w,
            rkey: new,
            mr: self.pool_mr.handle,
            addr: d.va,
            len: u64::from(d.len),
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        });
        Ok(((w, old, new), wr))
    }

    /// Invalidates the windows of a command that has its answer (queued
    /// behind whatever this thread posts next) and frees them: a later
    /// bind of one is behind the invalidation on the same queue.
    pub(super) fn invalidate(&self, st: &mut State, windows: Vec<(MwHandle, Rkey)>) {
        for (w, rkey) in windows {
            let mut wr = SendWr::new(KIND_MW, SendOpcode::LocalInv, Vec::new());
            wr.flags = SendFlags(0);
            wr.invalidate_rkey = rkey;
            st.posts.push(NO_SLOT, wr);
            st.windows.push((w, rkey));
        }
    }

    pub(super) fn segments(&self, runs: &[(usize, usize)], len: usize) -> Segs {
        let mut left = len;
        let mut segs = Segs::new();
        for &(start, n) in runs {
            let bytes = (n * self.page).min(left);
            segs.push(DirectBuf {
                va: self.pool.addr() + (start * self.page) as u64,
                key: self.pool_mr.rkey,
                len: bytes as u32,
            });
            left -= bytes;
        }
        segs
    }
}

/// A command's runs of pool pages (first page, pages): most commands
/// have one or two, held without an allocation.
pub(super) type Runs = smallvec::SmallVec<[(usize, usize); 2]>;

/// A command's data descriptors, one per run.
pub(super) type Segs = smallvec::SmallVec<[DirectBuf; 2]>;

/// Which pool pages are lent out, a bit a page: a look for a free page
/// reads a word for 64 pages (a `bool` a page cost a look at each page
/// in use before the first free one, on every command).
pub(super) struct PageMap {
    words: Vec<u64>,
    len: usize,
}

impl PageMap {
    /// `len` pages, all free.
    pub(super) fn new(len: usize) -> PageMap {
        PageMap {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Marks pages `start..start + n` used (`true`) or free.
    pub(super) fn set(&mut self, start: usize, n: usize, used: bool) {
        let end = start + n;
        assert!(
            end <= self.len,
            "pages {start}+{n} past the pool's {}",
            self.len
        );
        let mut i = start;
        while i < end {
            let bit = i % 64;
            let k = (64 - bit).min(end - i);
            let mask = (u64::MAX >> (64 - k)) << bit;
            if used {
                self.words[i / 64] |= mask;
            } else {
                self.words[i / 64] &= !mask;
            }
            i += k;
        }
    }

    /// First fit: where the first run of `want` free pages starting at
    /// `from` or later begins, or, when there is none (or `from + want`
    /// passes the end), the first one from the start.
    pub(super) fn find_free(&self, from: usize, want: usize) -> Option<usize> {
        let start_at = if from + want <= self.len { from } else { 0 };
        self.find_from(start_at, want)
            .or_else(|| (start_at > 0).then(|| self.find_from(0, want)).flatten())
    }

    /// The first run of `want` free pages starting at `from` or later.
    #[inline]
    fn find_from(&self, from: usize, want: usize) -> Option<usize> {
        if want == 1 {
            // Most commands: the first free page is the run.
            return self.next(from, self.len, false);
        }
        let mut at = from;
        loop {
            let start = self.next(at, self.len, false)?;
            if start + want > self.len {
                return None;
            }
            match self.next(start, start + want, true) {
                None => return Some(start),
                // The run is cut short there: look past it.
                Some(used) => at = used + 1,
            }
        }
    }

    /// The first page in `at..end` that is `used` (or free).
    fn next(&self, at: usize, end: usize, used: bool) -> Option<usize> {
        if at >= end {
            return None;
        }
        let flip = if used { 0 } else { u64::MAX };
        let mut w = at / 64;
        let mut bits = (self.words[w] ^ flip) & (u64::MAX << (at % 64));
        loop {
            if bits != 0 {
                let p = w * 64 + bits.trailing_zeros() as usize;
                return (p < end).then_some(p);
            }
            w += 1;
            if w * 64 >= end {
                return None;
            }
            bits = self.words[w] ^ flip;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PageMap;

    /// The first fit as a `bool` a page finds it: the model.
    fn model_find(pages: &[bool], from: usize, want: usize) -> Option<usize> {
        let start_at = if from + want <= pages.len() { from } else { 0 };
        let fit = |s: usize| (s..s + want).all(|p| !pages[p]);
        let last = pages.len().checked_sub(want)?;
        (start_at..=last)
            .find(|&s| fit(s))
            .or_else(|| (0..=last).find(|&s| fit(s)))
    }

    #[test]
    fn the_page_map_finds_what_a_page_by_page_search_finds() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for len in [1, 5, 63, 64, 65, 130, 200] {
            let mut map = PageMap::new(len);
            let mut model = vec![false; len];
            for _ in 0..3000 {
                let want = 1 + rnd(len.min(70));
                let from = rnd(len + 3);
                let found = map.find_free(from, want);
                assert_eq!(
                    found,
                    model_find(&model, from, want),
                    "len {len} from {from} want {want}"
                );
                match found {
                    Some(s) if rnd(3) > 0 => {
                        map.set(s, want, true);
                        model[s..s + want].fill(true);
                    }
                    _ => {
                        // Free a random stretch.
                        let s = rnd(len);
                        let n = rnd(len - s + 1);
                        map.set(s, n, false);
                        model[s..s + n].fill(false);
                    }
                }
            }
        }
    }
}
