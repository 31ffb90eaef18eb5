//! An NBD server for any [`blockload::BlockDevice`].
//!
//! The Network Block Device protocol (NetworkBlockDevice/nbd `doc/proto.md`,
//! cited below as "proto.md §section") is how qemu-img, nbdcopy, nbdfuse,
//! fio's `nbd` engine and the Linux `nbd` driver reach a disk over a
//! socket. This crate serves one export (reachable under its own name and
//! under the default name `""`) backed by an `Arc<dyn BlockDevice>`, for
//! example a LUN behind our SRP initiator.
//!
//! Layers, bottom up:
//! - [`wire`]: views and reprs for every message (greeting, option
//!   header and reply, `NBD_OPT_GO` data, info items, request, simple
//!   reply). Parsing never panics on any input.
//! - [`handshake`]: the fixed newstyle option haggling as a sans-IO state
//!   machine: feed it exactly [`handshake::Handshake::want`] bytes, write
//!   out what it appends, stop when it says so.
//! - [`transmission`]: one request in, one simple reply out, against a
//!   byte-addressed [`volume::Volume`] (NBD's policies over
//!   [`blockload::bytes::ByteView`]) that turns unaligned requests into
//!   read-modify-write of the edge blocks.
//! - [`server`]: sockets and threads. One thread per connection, replies
//!   in request order; pipelined requests are read from a buffer and their
//!   replies are flushed only when the buffer runs dry. [`Stats`] counts
//!   the requests, what they moved and what waits on the device; a
//!   shutdown can be bounded ([`ServerHandle::shutdown_within`]) when the
//!   device may have stopped answering.
//!
//! Contract: the advertised size constraints are the protocol defaults
//! (minimum block 1, preferred = device block size but at least 512,
//! maximum payload 32 MiB), so every client may send byte-granular
//! requests; a write that covers part of a block becomes read-modify-write
//! under an exclusive lock, while whole-block writes share the lock.
//! `NBD_CMD_FLUSH`, `NBD_CMD_FLAG_FUA` and `CAN_MULTI_CONN` map to the
//! device's `flush`, which covers all connections. TRIM maps to `unmap` of
//! whole blocks and is a no-op where the device cannot unmap. Device
//! errors become `NBD_EIO`.
//!
//! What it refuses (proto.md gives each as allowed):
//! - TLS, structured replies, extended headers, metadata contexts and
//!   block status: `NBD_REP_ERR_UNSUP`, so clients fall back to simple
//!   replies. Oldstyle negotiation is not offered; a client that does not
//!   set `NBD_FLAG_C_FIXED_NEWSTYLE` is answered as if it had (proto.md
//!   "Client flags" allows it).
//! - More than one export: the server has one, under its name and `""`.
//! - `NBD_CMD_CACHE`, `NBD_CMD_BLOCK_STATUS`, `NBD_CMD_RESIZE`, unknown
//!   commands and flags not valid for a command: `NBD_EINVAL`.
//! - A READ longer than 32 MiB: `NBD_EINVAL`; a WRITE longer than 32 MiB,
//!   option data over 64 KiB, more than 64 options, a request with the
//!   wrong magic, or unknown client flags: hard disconnect (proto.md
//!   "Size constraints" and "Termination of the session").
//! - Out-of-range requests: `NBD_ENOSPC` for writes and write-zeroes,
//!   `NBD_EINVAL` for reads and trims (proto.md "Error values"). Writes
//!   to a read-only export: `NBD_EPERM`.

#![forbid(unsafe_code)]

#[macro_use]
extern crate rdma_types;

pub mod handshake;
pub mod server;
pub mod transmission;
pub mod volume;
pub mod wire;

#[doc(hidden)]
pub mod fuzz;

pub use server::{Busy, Export, ListenAddr, Server, ServerHandle, Stats};

/// Why the server hung up on a client (a hard disconnect, proto.md
/// "Termination of the session"), or why a session ended cleanly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Hangup {
    /// Client flags with bits this server does not know.
    #[error("unknown client flags {0:#x}")]
    ClientFlags(u32),
    /// An option or request header without its magic.
    #[error("wrong magic in an option or request header")]
    BadMagic,
    /// Option data longer than [`handshake::MAX_OPTION_DATA`].
    #[error("option data of {0} bytes is too long")]
    OptionTooLong(u32),
    /// More than [`handshake::MAX_OPTIONS`] options.
    #[error("too many options")]
    TooManyOptions,
    /// `NBD_OPT_EXPORT_NAME` with a name this server does not export.
    #[error("no export named `{0}`")]
    UnknownExport(String),
    /// A WRITE payload longer than [`transmission::MAX_PAYLOAD`].
    #[error("write payload of {0} bytes is too long")]
    PayloadTooLong(u32),
    /// Input shorter than the state machine asked for.
    #[error("truncated input")]
    Truncated,
    /// The client sent `NBD_OPT_ABORT` (clean).
    #[error("client aborted the handshake")]
    Aborted,
    /// The client sent `NBD_CMD_DISC` (clean).
    #[error("client disconnected")]
    Disconnected,
}

impl Hangup {
    /// True if the client ended the session by the rules, not by an error.
    pub fn is_clean(&self) -> bool {
        matches!(self, Hangup::Aborted | Hangup::Disconnected)
    }
}
