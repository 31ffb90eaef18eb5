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
        let seg_pages = self.seg_pages(pages);
        let mut runs = Runs::new();
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

    /// Copies the pool's bytes that `segs` describe, in order, into
    /// `dst` until it is full.
    pub(super) fn copy_out(&self, segs: &[DirectBuf], dst: &mut [u8]) {
        let mut at = 0;
        for s in segs {
            if at >= dst.len() {
                break;
            }
            let n = (s.len as usize).min(dst.len() - at);
            self.pool
                .read_at((s.va - self.pool.addr()) as usize, &mut dst[at..at + n]);
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
            for p in &mut st.pages[start..start + n] {
                *p = false;
            }
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
            st.posts.push((NO_SLOT, wr));
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
