//! The SRP initiator: what Linux `ib_srp`, `scsi_transport_srp` and
//! `srp_daemon` do, as a library.
//!
//! Today this crate holds the parts that need no transport: the parser of
//! Linux-compatible login strings ([`login`]), `srp_daemon`-style rules
//! files ([`rules`]) and the remote port state machine with its timers
//! ([`rport`]). Both are sans-IO: time comes in as
//! [`rdma_types::Instant`], actions go out as values.
//!
//! What it refuses to do: guess a missing mandatory login key, accept a key
//! Linux would not accept, or read a clock.

#[doc(hidden)]
pub mod fuzz;
pub mod login;
pub mod rport;
pub mod rules;
