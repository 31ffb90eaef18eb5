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
//! [`Waker`] lets another thread interrupt [`RoceSocket::wait`], so a driver
//! loop can sleep in the kernel when idle instead of spinning a core.
//!
//! What it refuses to do: connect sockets (that changes the IPv4 ID the
//! kernel picks), or block without a timeout.

mod socket;
mod waker;

pub use socket::{wait_readable, Received, RoceSocket, SocketStats, ROCE_PORT};
pub use waker::Waker;
