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
    pub(super) fn alloc(&self, st: &mut State, pages: usize) -> Option<Vec<(usize, usize)>> {
        if pages == 0 {
            return Some(Vec::new());
        }
        let seg_pages = self.seg_pages(pages);
        let mut runs = Vec::new();
        let mut left = pages;
        let mut from = 0;
        while left > 0 {
            let want = left.min(seg_pages);
            let Some(start) = find_free(&st.pages, from, want) else {
                self.free(st, &runs);
                return None;
            };
            for p in &mut st.pages[start..start + want] {
                *p = true;
            }
            runs.push((start, want));
            left -= want;
            // Leave a gap so consecutive segments are not contiguous.
            from = start + want + usize::from(self.max_segment != 0);
        }
        Some(runs)
    }

    pub(super) fn free(&self, st: &mut State, runs: &[(usize, usize)]) {
        for &(start, n) in runs {
            for p in &mut st.pages[start..start + n] {
                *p = false;
            }
        }
    }

    pub(super) fn segments(&self, runs: &[(usize, usize)], len: usize) -> Vec<DirectBuf> {
        let mut left = len;
        let mut segs = Vec::new();
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

pub(super) fn find_free(pages: &[bool], from: usize, want: usize) -> Option<usize> {
    let mut run = 0;
    let start_at = if from + want <= pages.len() { from } else { 0 };
    for (i, &used) in pages.iter().enumerate().skip(start_at) {
        if used {
            run = 0;
        } else {
            run += 1;
            if run == want {
                return Some(i + 1 - want);
            }
        }
    }
    if start_at > 0 {
        return find_free(pages, 0, want);
    }
    None
}
