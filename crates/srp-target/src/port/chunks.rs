//! The registered chunk pool that RDMA READs land in and RDMA WRITEs go
//! out of.

use super::*;

/// A data-out piece in an RDMA chunk: (offset in the command's buffer,
/// chunk, length).
pub(super) type Fetched = (u64, usize, u32);

/// A finished command's data-in.
pub(super) enum InData {
    /// Built by the core (small commands, or no chunks were free): copied
    /// into a chunk per RDMA WRITE.
    Vec(Vec<u8>),
    /// Read by the store straight into chunks reserved for the command
    /// (`Target::submit_attr_into`); byte `k` of the data is in chunk
    /// `chunks[k / chunk_size]`. WRITEs go out of them with no copy.
    Chunks { chunks: Vec<usize>, len: usize },
    /// `len` bytes of a registered memory store from byte `at` (a READ
    /// given by reference): WRITEs go out of the store itself.
    Store {
        mem: MemBuf,
        lkey: Lkey,
        at: u64,
        len: usize,
    },
}

impl InData {
    pub(super) fn chunks(&self) -> &[usize] {
        match self {
            InData::Vec(_) | InData::Store { .. } => &[],
            InData::Chunks { chunks, .. } => chunks,
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            InData::Vec(v) => v.len(),
            InData::Chunks { len, .. } | InData::Store { len, .. } => *len,
        }
    }
}

/// Data-in at least this long is read into reserved chunks, not a vector.
pub(super) const DIRECT_IN_MIN: u32 = 4 << 10;

/// Where an RDMA op's local side lives.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpInfo {
    /// The chunk the op took from the pool (none for a WRITE out of its
    /// command's reserved chunks).
    pub(super) chunk: Option<usize>,
    pub(super) cmd: CmdId,
    pub(super) local: Local,
    pub(super) len: u32,
    /// Its number among the QP's requests (`Conn::queued_wrs`).
    pub(super) seq: u64,
}

impl Inner {
    /// The L_Key of a memory store's registration, registering it on its
    /// first READ; registrations of stores nobody else holds any more (a
    /// LUN removed, a store resized) are let go meanwhile. `None` when
    /// registering fails (the READ is copied through chunks instead): said
    /// once, and not tried again for that store.
    pub(super) fn store_lkey(&self, mem: &MemBuf) -> Option<Lkey> {
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, mr, _)) = stores
            .iter()
            .find(|(m, ..)| m.addr() == mem.addr() && m.len() == mem.len())
        {
            return mr.map(|mr| mr.lkey);
        }
        stores.retain(|(m, mr, ours)| {
            let held = m.holders() > *ours;
            if let (false, Some(mr)) = (held, mr) {
                let _ = self.provider.dereg_mr(mr.handle);
            }
            held
        });
        let before = mem.holders();
        let mr = self
            .provider
            .reg_mr(
                self.pd,
                mem,
                mem.addr(),
                mem.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .map_err(|e| {
                tracing::warn!(
                    "cannot register a memory store of {} bytes for READs ({e}): \
                     its READs are copied",
                    mem.len()
                )
            })
            .ok();
        // The holders the registration adds (the provider's, and this
        // list's): once no more hold it, the store has let it go and no
        // command still sends from it.
        let ours = mem.holders() - before + 1;
        stores.push((mem.clone(), mr, ours));
        mr.map(|mr| mr.lkey)
    }

    /// The SGEs of `[offset, offset + len)` of data-in held in reserved
    /// chunks (`placed` bytes of it real). Bytes past `placed` are zeroed
    /// first: whatever an earlier command left in a chunk never leaves.
    pub(super) fn reserved_sges(
        &self,
        chunks: &[usize],
        placed: usize,
        offset: usize,
        len: usize,
    ) -> verbs::Sges {
        let cs = self.chunk_size as usize;
        let mut sges = verbs::Sges::new();
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let Some(&chunk) = chunks.get(at / cs) else {
                // Past the reserved chunks (more than the command's
                // data-in length): the channel never asks for that; send
                // nothing rather than someone else's bytes.
                break;
            };
            let within = at % cs;
            let n = (cs - within).min(end - at);
            let base = chunk * cs + within;
            if at + n > placed {
                let from = placed.max(at);
                self.chunk_buf
                    .write_at(base + (from - at), &vec![0u8; at + n - from]);
            }
            sges.push(Sge {
                addr: self.chunk_buf.addr() + base as u64,
                length: n as u32,
                lkey: self.chunk_mr.lkey,
            });
            at += n;
        }
        sges
    }

    /// Copies data-out of `len` bytes out of its RDMA chunks and gives the
    /// chunks back (ops waiting for one go out).
    pub(super) fn gather(&self, len: u32, mut parts: Vec<Fetched>) -> Vec<u8> {
        let mut v = vec![0u8; len as usize];
        parts.sort_by_key(|p| p.0);
        for &(offset, chunk, plen) in &parts {
            let start = (offset as usize).min(v.len());
            let end = (offset as usize + plen as usize).min(v.len());
            self.chunk_buf
                .read_at(chunk * self.chunk_size as usize, &mut v[start..end]);
        }
        if !parts.is_empty() {
            let mut st = self.lock();
            st.free_chunks.extend(parts.iter().map(|p| p.1));
            self.retry_waiting(&mut st);
        }
        v
    }

    /// Views of chunks a command holds: the first `n` bytes (at most a
    /// chunk) of each `(chunk, n)`, for the SCSI core to read into or
    /// write from with no copy in between.
    ///
    /// # Safety
    /// Until the views are dropped, each chunk must be the calling
    /// command's alone (off the free list for it, and not freed while the
    /// views live) and named by no work request in flight, so that nothing
    /// else reads or writes those bytes; the pairs name distinct chunks.
    pub(super) unsafe fn chunk_views<I: Iterator<Item = (usize, usize)>>(
        &self,
        pieces: I,
    ) -> impl Iterator<Item = &mut [u8]> {
        let cs = self.chunk_size as usize;
        pieces.map(move |(chunk, n)| {
            // SAFETY: the chunk is this command's alone (the caller's
            // promise), so this is the only view of its bytes; `chunk * cs
            // + n.min(cs)` is inside `chunk_buf` (chunks * chunk_size bytes).
            unsafe { std::slice::from_raw_parts_mut(self.chunk_buf.ptr_at(chunk * cs), n.min(cs)) }
        })
    }

    /// Chunks for `len` bytes of data-in, if the pool can spare them and
    /// still keep `spill_below` for RDMA in flight.
    pub(super) fn reserve_chunks(&self, len: u32) -> Option<Vec<usize>> {
        let need = len.div_ceil(self.chunk_size) as usize;
        let mut st = self.lock();
        let free = st.free_chunks.len();
        if free < need + self.spill_below {
            return None;
        }
        Some(st.free_chunks.split_off(free - need))
    }
}
