//! The SRP target over a verbs provider: what SCST's and LIO's ib_srpt do.
//!
//! [`TargetPort`] binds one port of one CA. It owns a protection domain, a
//! shared receive queue of `srpt_srq_size` buffers of `srp_max_req_size`
//! bytes, a pool of registered chunks of `srp_max_rdma_size` bytes for RDMA
//! READ and WRITE, and per channel an RC QP with a send CQ and
//! `srpt_sq_size` send slots. The protocol itself is `srp::target`, sans-IO:
//! this crate turns its outputs into work requests and SCSI calls, and
//! completions back into its inputs.
//!
//! # Connections
//!
//! The port does not speak a connection manager. A CM (IB CM or RDMA CM)
//! hands it the login: [`TargetPort::login`] takes the REQ private data and
//! the initiator's QP (number, PSN, GID, MTU), creates and connects the
//! target QP, and answers the REP private data (SRP_LOGIN_RSP) and the
//! target QP, or the REJ private data (SRP_LOGIN_REJ). When the connection
//! is gone the CM calls [`TargetPort::disconnected`]; when the target wants
//! a channel gone (logout, protocol violation) it calls the hook set with
//! [`TargetPort::on_disconnect`] so the CM sends a DREQ. Tests connect
//! directly, calling `login` with their own QP.
//!
//! # What peers cannot hold
//!
//! A login is pending from its REP until the CM's RTU
//! ([`TargetPort::established`]): every way it ends before that (a REJ of
//! the REP, a DREQ, the CM giving up on the RTU, the CA gone) releases its
//! channel at once, and one not established within
//! [`PortOptions::login_timeout`] is closed by the port. Pending logins
//! are bounded per initiator port (more are refused) and per port (the
//! oldest is dropped for a new one), so a flood of half-open logins keeps
//! no good initiator out. Credits are not reserved in the SRQ (see
//! `srp::target`), so the number of initiators is bounded only by
//! `max_channels`. An established channel with nothing moving gets a
//! keepalive ([`PortOptions::keepalive`]): a zero-length RDMA WRITE its
//! initiator's NIC acknowledges without its software, so a live idle
//! initiator is never disturbed and a dead one's channel is freed. Every
//! close the port starts carries its [`CloseReason`].
//!
//! # Threads and locks
//!
//! One lock guards the port's state (channels, the sans-IO target, the
//! chunk pool). Who takes it, and what runs under it:
//!
//! - **Completions.** When the calling thread holds no counted lock
//!   (`verbs::nested::may_lock_here`), the completion callback drains the
//!   CQ right there, on the provider's thread (or, for a provider that
//!   calls back from inside its own calls, on the thread whose post made
//!   the completion), under the port lock: no thread hand-off per IU.
//!   Otherwise, and for a [`PortDrive::Caller`] port on such a provider,
//!   it only queues a wake-up for the port's poll thread, which drains
//!   the CQ under the lock. Async
//!   events take nothing: a QP error surfaces as flushed completions.
//! - **SCSI commands** run on a small worker pool (the SCSI core is
//!   synchronous), outside the lock, or inline on the thread that took
//!   the lock when the command is small and its store never blocks (run
//!   to completion); results come back under the lock. A device with
//!   threads of its own (`scsi::DeviceConfig::threads_num`, SCST's
//!   `threads_num`) has its commands run on those instead, started the
//!   first time the port runs one of its commands and joined at stop, so
//!   a device whose I/O hangs holds up no other device's commands.
//! - **Work requests** are queued under the lock and posted once it is
//!   let go, in order, by one thread at a time: a provider that calls back
//!   on the posting thread (the loopback fabric) may then have the
//!   initiator's handlers, and ours, run right there.
//! - **The CM's calls** ([`TargetPort::login`], [`TargetPort::established`],
//!   [`TargetPort::disconnected`]) take the lock; the caller must not hold
//!   a lock a completion callback takes.
//! - **The disconnect hook** ([`TargetPort::on_disconnect`]) runs after
//!   the lock (and the hook's own slot) is released, on the thread that
//!   closed the channel, so it may call back into the port, set the hook,
//!   or call a CM that calls the port; a call of its that closes another
//!   channel runs the hook again, nested.
//! - **The login service's callbacks** ([`cm::Logins`], [`cm::serve`]:
//!   the event sink and the REQ's answer) run with no lock of the service
//!   or of the port held.
//!
//! The code is split along those lines: `port/connections.rs` (logins,
//! bounds, keepalives, closing), `port/completions.rs` (CQs, IUs in, work
//! requests out), `port/chunks.rs` (the registered chunk pool),
//! `port/execution.rs` (SCSI and task management), `port/stats.rs`.

#![deny(clippy::undocumented_unsafe_blocks)]

//! # Memory
//!
//! Data moves through fixed chunks of `srp_max_rdma_size` bytes: an RDMA
//! READ lands in a chunk and is gathered into the SCSI command's data-out
//! buffer, data-in is copied into chunks that RDMA WRITE sends. When the
//! pool is empty, RDMA operations wait for a chunk. A READ from a
//! [`MemStore`] goes out of the store's own memory, registered once per
//! port. The initiator's memory
//! is only ever touched through its R_Keys by the provider, which checks them.

pub mod cm;
mod names;
mod port;
mod store;

pub use names::{initiator_name, target_name};
pub use port::{
    ChannelPhase, CloseReason, ConnId, LocalQp, LoginOutcome, LoginRefusal, LunCounters, LunStats,
    OtherTargetPort, PartitionError, PeerQp, PortDrive, PortError, PortOptions, SessionInfo,
    SetupError, TargetPort, INLINE_ENV, INLINE_MAX,
};
pub use store::MemStore;
