//! UDP socket I/O for a software RoCEv2 NIC.
//!
//! One [`RoceSocket`] per node address (RoCEv2 uses destination port 4791;
//! tests pick their own). It knows nothing of InfiniBand: it moves
//! datagrams in batches (`sendmmsg`/`recvmmsg`), and sets the options that
//! make us byte-compatible with Linux rxe (see `INTEROP.md`):
//!
//! - IPv4 sockets send with `IP_PMTUDISC_DO` from an unconnected socket, so
//!   the kernel puts Identification 0 and DF in every header. The ICRC
//!   covers the Identification field, so the sender must know it.
//! - IPv6 sockets set `UDP_NO_CHECK6_RX`, because rxe sends UDP checksum 0,
//!   which IPv6 otherwise forbids and the kernel drops.
//!
//! Where the kernel has them, it uses the UDP offloads: a run of
//! equal-size datagrams to one peer leaves as one segmented send
//! (`UDP_SEGMENT`, see [`RoceSocket::gso_runs`]), and the kernel may hand
//! received datagrams over coalesced (`UDP_GRO`), which [`RoceSocket::recv_batch`]
//! splits again. A 1 MiB RDMA transfer is then ~17 kernel sends instead of
//! 256. The catch for RoCEv2: the kernel numbers the IPv4 Identification of
//! a run's segments 0, 1, 2, … and the ICRC covers it, so the caller
//! patches the ICRC of segment `k` for Identification `k` (the soft RoCE
//! node does, with `rdma_wire::icrc::Ipv4IdentDelta`); a receiver learns
//! each datagram's place in a coalesced buffer from [`Received::segment`].
//!
//! A datagram may be handed over in pieces ([`RoceSocket::send_runs_vectored`]):
//! the kernel gathers them (iovecs), so a sender need not copy headers and
//! payload into one buffer first; with [`RoceSocket::send_runs_gather`]
//! and [`RoceSocket::gso_runs_into`] a send allocates nothing.
//!
//! [`Waker`] lets another thread interrupt [`RoceSocket::wait`], so a driver
//! loop can sleep in the kernel when idle instead of spinning a core.
//!
//! [`PortGroup`] shares one address and port between processes: a
//! `SO_REUSEPORT` group whose kernel-side program gives each datagram to
//! the socket of its destination QP number's block.
//!
//! What it refuses to do: connect sockets (that changes the IPv4 ID the
//! kernel picks), or block without a timeout.

#![deny(clippy::undocumented_unsafe_blocks)]

mod group;
mod socket;
mod waker;

pub use group::{block_qpns, qpn_block, PortGroup, QPN_BLOCKS, QPN_BLOCK_BITS};
pub use socket::{
    wait_readable, wait_readable_or, Gather, Received, RoceSocket, SocketStats, ROCE_PORT,
    WAIT_ALSO_MAX,
};
pub use waker::Waker;
