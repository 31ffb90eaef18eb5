//! The SRP initiator: what Linux `ib_srp`, `scsi_transport_srp` and
//! `srp_daemon` do, as a library.
//!
//! [`session`] runs one SRP channel over a verbs provider (login through a
//! [`session::Connector`], commands with data in a registered pool, the
//! channel's timers and error handling), and [`disk`] makes a LUN behind it
//! a block device. [`connectors`] are how a session reaches its target
//! over the access layer (`rdma-access`): RDMA CM, IB CM, and IB CM along
//! the subnet administrator's paths. [`discovery`] is `srp_daemon`'s walk
//! of the device management agents, login strings out.
//!
//! The sans-IO parts: the parser of
//! Linux-compatible login strings ([`login`]), `srp_daemon`-style rules
//! files ([`rules`]) and the remote port state machine with its timers
//! ([`rport`]). Both are sans-IO: time comes in as
//! [`rdma_types::Instant`], actions go out as values.
//!
//! What it refuses to do: guess a missing mandatory login key, accept a key
//! Linux would not accept, or read a clock.

#![forbid(unsafe_code)]

pub mod changes;
pub mod connectors;
pub mod discovery;
pub mod disk;
pub mod fence;
#[doc(hidden)]
pub mod fuzz;
pub mod login;
pub mod multipath;
pub mod path_login;
pub mod remote;
pub mod rport;
pub mod rules;
pub mod session;
