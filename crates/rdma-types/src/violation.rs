//! What a port reports of a packet it dropped for its P_Key.

use crate::{Gid, Pkey, Qpn};

/// A packet the port dropped for its P_Key, with what trap 257 (Bad
/// P_Key, IBA 14.2.5.1) tells the SM of it: who sent it, from and to
/// which QP, in which partition. RoCEv2 carries no LIDs and no SL,
/// so none are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PkeyViolation {
    /// The P_Key the packet carried.
    pub pkey: Pkey,
    /// The sender's GID (on RoCEv2, its IP address).
    pub src_gid: Gid,
    /// Ours.
    pub dst_gid: Gid,
    /// The sender's QP: a datagram's DETH names it; for a connected QP,
    /// the peer QP it is connected to; `None` when nobody knows.
    pub src_qp: Option<Qpn>,
    /// The QP the packet was for.
    pub dest_qp: Qpn,
}
