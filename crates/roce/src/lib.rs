//! A sans-IO InfiniBand transport engine: the requester, responder and
//! completer of one queue pair, for RC, UC and UD (IBA chapter 9).
//!
//! The engine owns the transport state of a QP -- PSNs, the send queue with
//! its segmentation and retransmission cursor, the receive side's expected
//! PSN and MSN, the responder resources that answer duplicate READs and
//! atomics -- and nothing else. It never touches a socket, a thread or a
//! clock: the driver feeds it decoded packets and the current [`Instant`],
//! and drains packets to send, completions and events.
//!
//! Call order, per QP:
//! 1. [`Qp::post_send`] / [`Qp::post_recv`] as the consumer posts work;
//! 2. [`Qp::handle_packet`] for every packet addressed to the QP;
//! 3. [`Qp::poll_transmit`] until `None` (bounded: one packet per call);
//! 4. [`Qp::handle_timeout`] once [`Qp::poll_timeout`] has passed;
//! 5. [`Qp::poll_completion`] and [`Qp::poll_event`] until `None`.
//!
//! Memory is reached only through the [`Memory`] trait the driver implements
//! over its key tables, so every local and remote access is checked by the
//! same code the other providers use. A failed check never touches memory.
//! Payloads of at least 512 bytes that lie in one SGE (SEND, WRITE, READ
//! responses) are lent by memory that can ([`Memory::pin_local`],
//! [`Memory::pin_remote`], same checks) instead of copied:
//! [`Qp::poll_transmit_lent`] returns them as [`Payload::Pinned`], which
//! keeps the region's allocation alive until the driver drops it.
//! [`Qp::poll_transmit_into`] does the same into a packet the driver keeps
//! from one call to the next (the soft RoCE node's send path): the packet
//! is built where it lies, not moved out through the engine's layers.
//!
//! Window binds and local invalidates ([`SendOp::BindMw`],
//! [`SendOp::LocalInv`]) are send-queue entries that never reach the wire:
//! they take no PSN, run through [`Memory`] when the send cursor reaches
//! them (every entry before them has been sent), are not run again when
//! go-back-N passes over them, and complete in queue order. SEND with
//! invalidate asks [`Memory::invalidate`] at the responder; a key it
//! refuses completes the receive with a remote invalid request error and
//! NAKs Invalid Request.
//!
//! What it refuses to do: parse bytes (the driver hands in a decoded
//! [`Packet`] built on `rdma-wire`'s reprs; the opcode table and AETH codes
//! are `rdma-wire`'s), choose addresses (UD destinations arrive resolved), or
//! decide policy such as which QP a packet belongs to.
//!
//! [`Instant`]: rdma_types::Instant

#![deny(clippy::undocumented_unsafe_blocks)]

mod flat;
mod mem;
mod packet;
mod qp;
mod req;
mod resp;
mod wqe;

pub use flat::FlatMemory;
pub use mem::{apply_atomic, Memory, MemoryError, RemoteAccess};
pub use packet::{MiddleRun, Packet, Payload, Pinned};
pub use qp::{Qp, QpConfig, QpCounters, QpEvent};
pub use wqe::{Completion, MwBindOp, RecvWqe, SendOp, SendWqe, Sge, UdDest};

#[doc(hidden)]
pub mod fuzz;

#[cfg(test)]
mod tests;
