//! A command's data in the transport's own buffers.
//!
//! A transport that moves data by DMA (RDMA from registered memory) would
//! otherwise copy every transfer once more than needed: a READ from the
//! store into a fresh vector and then into registered memory; a WRITE's
//! data-out from registered memory into one vector for the store.
//! [`Buffers`] hands the core the transport's buffers as scatter lists:
//! the store reads into the data-in pieces ([`crate::Backend::read_vectored`])
//! and writes from the data-out pieces ([`crate::Backend::write_vectored`]).
//! Commands that need their data in one piece (parameter lists, COMPARE
//! AND WRITE, protection information) get it gathered by the core.
//!
//! A transport that can reach the store's memory itself
//! ([`crate::Backend::memory`]) asks for a READ's data-in by reference
//! ([`Buffers::by_reference`]): the core checks the command as always and,
//! instead of copying, says which bytes of the store are the data
//! ([`Buffers::reference`]). Every other command's data-in comes back in
//! the response's vector.

/// The transport's buffers of one command, in order.
pub struct Buffers<'s, 'b> {
    data_in: &'s mut [&'b mut [u8]],
    data_out: &'s [&'b [u8]],
    pub(crate) placed: Option<usize>,
    copied: bool,
    /// Data-in by reference: at most this many bytes.
    by_reference: Option<usize>,
    /// The store's bytes that are the data-in (offset, length).
    pub(crate) reference: Option<(u64, usize)>,
}

impl<'s, 'b> Buffers<'s, 'b> {
    /// Buffers for a command's data-in: the core fills them from the front
    /// and [`Buffers::placed`] says how far.
    pub fn data_in(pieces: &'s mut [&'b mut [u8]]) -> Buffers<'s, 'b> {
        Buffers {
            data_in: pieces,
            data_out: &[],
            placed: None,
            copied: false,
            by_reference: None,
            reference: None,
        }
    }

    /// A command's data-out, in pieces (pass an empty flat `data_out` with
    /// it).
    pub fn data_out(pieces: &'s [&'b [u8]]) -> Buffers<'s, 'b> {
        Buffers {
            data_in: &mut [],
            data_out: pieces,
            placed: None,
            copied: false,
            by_reference: None,
            reference: None,
        }
    }

    /// A READ's data-in, up to `capacity` bytes, by reference to the
    /// store's memory where the store has it ([`crate::Backend::memory`]);
    /// otherwise, and for commands other than READ, the data-in comes back
    /// in the response's vector.
    pub fn by_reference(capacity: usize) -> Buffers<'s, 'b> {
        Buffers {
            by_reference: Some(capacity),
            ..Buffers::data_in(&mut [])
        }
    }

    /// Bytes the data-in pieces hold together (the most a reference may
    /// cover, for [`Buffers::by_reference`]).
    pub fn capacity(&self) -> usize {
        self.by_reference
            .unwrap_or_else(|| self.data_in.iter().map(|p| p.len()).sum())
    }

    /// The bytes of the store (offset, length) that are the data-in, when
    /// the core gave it by reference.
    pub fn reference(&self) -> Option<(u64, usize)> {
        self.reference
    }

    /// Whether the data-in may be given by reference.
    pub(crate) fn wants_reference(&self) -> bool {
        self.by_reference.is_some()
    }

    /// Whether there are pieces to place data-in in.
    pub(crate) fn has_data_in(&self) -> bool {
        !self.data_in.is_empty()
    }

    /// Bytes of data-out the pieces hold together.
    pub fn data_out_len(&self) -> usize {
        self.data_out.iter().map(|p| p.len()).sum()
    }

    /// Bytes of data-in written to the pieces (0 before the command ran,
    /// and for a command that failed or has no data-in).
    pub fn placed(&self) -> usize {
        self.placed.unwrap_or(0)
    }

    /// Whether the store read into the data-in pieces itself, with no copy
    /// in between (false when the core copied a result vector in, or gave
    /// the data-in by reference).
    pub fn read_direct(&self) -> bool {
        self.placed.is_some() && !self.copied && self.reference.is_none()
    }

    /// The first `len` bytes of the data-in pieces, as a scatter list (the
    /// last piece cut short). `len` is at most [`Buffers::capacity`].
    pub(crate) fn data_in_for(&mut self, len: usize) -> Vec<&mut [u8]> {
        let mut left = len;
        let mut out = Vec::with_capacity(self.data_in.len());
        for p in self.data_in.iter_mut() {
            if left == 0 {
                break;
            }
            let n = p.len().min(left);
            out.push(&mut p[..n]);
            left -= n;
        }
        out
    }

    /// The first `len` bytes of data-out as a scatter list, or `None` when
    /// the pieces hold fewer.
    pub(crate) fn data_out_for(&self, len: usize) -> Option<Vec<&[u8]>> {
        let mut left = len;
        let mut out = Vec::with_capacity(self.data_out.len());
        for p in self.data_out {
            if left == 0 {
                break;
            }
            let n = p.len().min(left);
            out.push(&p[..n]);
            left -= n;
        }
        (left == 0).then_some(out)
    }

    /// Whether data-out came in pieces.
    pub(crate) fn has_data_out(&self) -> bool {
        !self.data_out.is_empty()
    }

    /// The data-out pieces in one vector (commands that parse their data).
    pub(crate) fn gather_data_out(&self) -> Vec<u8> {
        self.data_out.concat()
    }

    /// Copies a result vector in (commands the store does not read for).
    pub(crate) fn copy_in(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        for p in self.data_in.iter_mut() {
            if done == data.len() {
                break;
            }
            let n = p.len().min(data.len() - done);
            p[..n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.placed = Some(done);
        self.copied = true;
        done
    }
}
