//! The MPA private data of the verbs-only connection setup: which two QPs
//! a stream joins (iWARP carries no QP numbers; RoCE-style verbs name the
//! peer's QPN at INIT->RTR, so the request says it).
//!
//! Layout, 12 bytes, network order: `"iwQP"`, the initiator's QPN, the
//! responder's QPN. The reply repeats it with the roles kept.

/// The magic that starts our private data.
pub const MAGIC: [u8; 4] = *b"iwQP";

/// Length of the private data.
pub const LEN: usize = 12;

/// The two QPs of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendezvous {
    /// The connecting QP.
    pub initiator_qpn: u32,
    /// The QP asked for at the listening CA.
    pub responder_qpn: u32,
}

impl Rendezvous {
    /// Parses private data; `None` when it is not ours (another
    /// consumer's, e.g. an RDMA CM's).
    pub fn parse(pd: &[u8]) -> Option<Rendezvous> {
        if pd.len() != LEN || pd[..4] != MAGIC {
            return None;
        }
        let word = |i: usize| u32::from_be_bytes([pd[i], pd[i + 1], pd[i + 2], pd[i + 3]]);
        Some(Rendezvous {
            initiator_qpn: word(4),
            responder_qpn: word(8),
        })
    }

    /// The private data.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&self.initiator_qpn.to_be_bytes());
        v.extend_from_slice(&self.responder_qpn.to_be_bytes());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_data() {
        let r = Rendezvous {
            initiator_qpn: 0x11,
            responder_qpn: 0x0102_0304,
        };
        let b = r.emit();
        assert_eq!(
            b,
            [
                b'i', b'w', b'Q', b'P', // magic
                0, 0, 0, 0x11, // initiator QPN
                1, 2, 3, 4, // responder QPN
            ]
        );
        assert_eq!(Rendezvous::parse(&b), Some(r));
        assert_eq!(Rendezvous::parse(&b[..11]), None);
        assert_eq!(Rendezvous::parse(b"iwQX\0\0\0\x11\x01\x02\x03\x04"), None);
    }
}
