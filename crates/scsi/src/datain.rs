//! Data-in straight into the transport's buffers.
//!
//! A transport that moves data by DMA (RDMA WRITE from registered memory)
//! would otherwise copy every READ twice: the store into a fresh vector,
//! the vector into registered memory. [`DataInSink`] hands the core the
//! transport's own buffers as a scatter list, and the store reads into
//! them directly ([`crate::Backend::read_vectored`]).

/// The transport's buffers for one command's data-in, in order. The core
/// fills them from the front; [`DataInSink::placed`] says how far.
pub struct DataInSink<'s, 'b> {
    pieces: &'s mut [&'b mut [u8]],
    pub(crate) placed: Option<usize>,
    copied: bool,
}

impl<'s, 'b> DataInSink<'s, 'b> {
    pub fn new(pieces: &'s mut [&'b mut [u8]]) -> DataInSink<'s, 'b> {
        DataInSink {
            pieces,
            placed: None,
            copied: false,
        }
    }

    /// Bytes the pieces hold together.
    pub fn capacity(&self) -> usize {
        self.pieces.iter().map(|p| p.len()).sum()
    }

    /// Bytes of data-in written to the pieces (0 before the command ran,
    /// and for a command that failed or has no data-in).
    pub fn placed(&self) -> usize {
        self.placed.unwrap_or(0)
    }

    /// Whether the store read into the pieces itself, with no copy in
    /// between (false when the core copied a result vector in).
    pub fn read_direct(&self) -> bool {
        self.placed.is_some() && !self.copied
    }

    /// The first `len` bytes of the pieces, as a scatter list (the last
    /// piece cut short). `len` is at most [`DataInSink::capacity`].
    pub(crate) fn pieces_for(&mut self, len: usize) -> Vec<&mut [u8]> {
        let mut left = len;
        let mut out = Vec::with_capacity(self.pieces.len());
        for p in self.pieces.iter_mut() {
            if left == 0 {
                break;
            }
            let n = p.len().min(left);
            out.push(&mut p[..n]);
            left -= n;
        }
        out
    }

    /// Copies a result vector in (commands the store does not read for).
    pub(crate) fn copy_in(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        for p in self.pieces.iter_mut() {
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
