//! Splitting a transfer over data buffer descriptors into RDMA work requests.

use crate::wire::DirectBuf;
use rdma_types::Rkey;

/// One RDMA READ or WRITE: `len` bytes between the initiator's memory at
/// `remote_va` and bytes `local_offset..local_offset + len` of the command's
/// data buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Initiator virtual address.
    pub remote_va: u64,
    /// Initiator memory key.
    pub rkey: Rkey,
    /// Bytes to move, `1..=max_rdma_size`.
    pub len: u32,
    /// Offset in the command's data buffer.
    pub local_offset: u64,
}

/// The segments of one transfer: most have one or two, held without an
/// allocation.
pub type Segments = smallvec::SmallVec<[Segment; 4]>;

/// Cut the first `len` bytes described by `descs` (in order, SRP r16a 5.5.3)
/// into segments of at most `max_rdma_size` bytes that never cross a
/// descriptor. Zero-length descriptors are skipped; if the descriptors hold
/// fewer than `len` bytes, the segments cover what they hold. Remote
/// addresses wrap rather than overflow (the initiator's HCA checks them).
pub fn plan_rdma(descs: &[DirectBuf], len: u64, max_rdma_size: u32) -> Segments {
    let max = u64::from(max_rdma_size.max(1));
    let mut out = Segments::new();
    let mut local = 0u64;
    for d in descs {
        let mut done = 0u64;
        let avail = u64::from(d.len);
        while done < avail && local < len {
            let n = (avail - done).min(max).min(len - local);
            out.push(Segment {
                remote_va: d.va.wrapping_add(done),
                rkey: d.key,
                len: n as u32,
                local_offset: local,
            });
            done += n;
            local += n;
        }
        if local >= len {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(va: u64, key: u32, len: u32) -> DirectBuf {
        DirectBuf {
            va,
            key: Rkey(key),
            len,
        }
    }

    #[test]
    fn splits_at_max_and_at_descriptor_edges() {
        let s = plan_rdma(
            &[
                d(0x1000, 1, 10),
                d(0x9000, 2, 3),
                d(0, 3, 0),
                d(0x5000, 4, 5),
            ],
            18,
            4,
        );
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.remote_va, s.rkey.0, s.len, s.local_offset))
            .collect();
        assert_eq!(
            got,
            vec![
                (0x1000, 1, 4, 0),
                (0x1004, 1, 4, 4),
                (0x1008, 1, 2, 8),
                (0x9000, 2, 3, 10),
                (0x5000, 4, 4, 13),
                (0x5004, 4, 1, 17),
            ]
        );
    }

    #[test]
    fn short_transfer_stops_early_and_zero_is_empty() {
        let s = plan_rdma(&[d(0, 1, 100), d(500, 2, 100)], 7, 65536);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].len, 7);
        assert!(plan_rdma(&[d(0, 1, 100)], 0, 65536).is_empty());
    }
}
