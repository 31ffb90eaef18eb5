//! Byte buffers kept for reuse between IUs.

/// Byte buffers a channel hands out and takes back: at most `N` kept,
/// none with more room than the limit `give` is told, so a steady flow of
/// IUs of one size allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct SpareBufs<const N: usize>(Vec<Vec<u8>>);

impl<const N: usize> SpareBufs<N> {
    /// An empty buffer, with the room of a kept one if there is one.
    pub(crate) fn take(&mut self) -> Vec<u8> {
        let mut v = self.0.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Keeps `buf` for a later `take` while fewer than `N` are kept and
    /// its room is at most `max` bytes; drops it otherwise.
    pub(crate) fn give(&mut self, buf: Vec<u8>, max: usize) {
        if self.0.len() < N && buf.capacity() > 0 && buf.capacity() <= max {
            self.0.push(buf);
        }
    }
}
