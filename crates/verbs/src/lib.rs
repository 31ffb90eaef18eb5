//! The verbs provider interface.
//!
//! One object-safe trait, [`Provider`], is the contract between RDMA
//! consumers (access layer, SRP, tools) and whatever moves the bytes (the
//! in-process loopback fabric in `rnic`, the soft RoCE NIC). Its methods are
//! grouped and sorted: CA, port, PD, CQ, SRQ, QP, AH, MR, MW, post/poll.
//! Every method has a default body returning [`VerbsError::NotSupported`],
//! so a provider that lacks a feature says so clearly instead of panicking.
//!
//! Deviations from the IBA verbs (chapter 11), taken from the HCA driver kit
//! seed and kept on purpose:
//! - a CA is opened by its GUID ([`Provider::open_ca`]);
//! - a PD implies its CA, a CQ is created in a PD;
//! - callbacks hand back the consumer's [`Context`] cookie, never a handle;
//! - post and poll take batches; post reports the index of the first bad WR;
//! - destroy is asynchronous: the handle is dead at once, and
//!   [`EventHandler::on_destroyed`] is delivered once no callback for the
//!   object is running or pending, so destroying from inside a callback
//!   neither blocks nor deadlocks. Providers never call a handler while
//!   holding an internal lock.
//!
//! Handles are small `Copy` values (index + generation) so a stale handle is
//! detected ([`VerbsError::InvalidHandle`]) instead of aliasing a new object.
//!
//! Memory is a [`MemBuf`]: an owned, page-aligned allocation shared through
//! `Arc`, whose address is the virtual address used in SGEs and R_Key
//! ranges. Providers never touch memory outside registered ranges.
//!
//! [`kit`] holds the pieces every provider must implement identically: the
//! QP state-transition table with per-transition attribute rules (IBA
//! 10.3.1, table like Linux `ib_modify_qp_is_ok`), the key table with
//! bounds/access checks for MRs and MWs (IBA 10.6), and the CQ ring with
//! overflow detection and arm/notify.
//!
//! `conformance` (cargo feature `conformance`, off by default: enable it
//! from the dev-dependencies of the crates that run it) is the
//! provider-generic test suite: a provider crate implements
//! `conformance::Fixture` and expands
//! `verbs::conformance_tests!(ctor)` to get one `#[test]` per case; cases
//! for features the fixture declares missing check for `NotSupported` and
//! print `SKIPPED <case>: <reason>`. The gaps themselves, [`Feature`], are
//! always compiled.
//!
//! Path migration (APM, IBA 17.2.8): [`QpAttr::alt_path`] loads an
//! alternate path and [`QpAttr::path_mig_state`] arms it or forces a
//! migration, under the rules of [`kit::apm`]; a provider that migrates
//! raises [`AsyncEventKind::PathMigrated`] to the QP's owner. The loopback
//! provider migrates; soft RoCE refuses alternate paths (`NotSupported`).
//!
//! Port control ([`Provider::modify_port`], [`PortModify`]): the access
//! layer's SMA sets a port's LID, LMC, master SM, state, P_Key table and
//! alias GUIDs through the provider, and learns from it what the port
//! dropped for its P_Key ([`Provider::take_pkey_violations`]); no SMA
//! reaches a provider's own methods.
//!
//! What this crate refuses: I/O, threads, wire formats. It depends only on
//! `rdma-types`.

#![deny(clippy::undocumented_unsafe_blocks)]

mod caps;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod handles;
pub mod kit;
mod mem;
pub mod nested;
mod port;
mod provider;
pub mod spin;
mod types;

pub use caps::Feature;
pub use error::VerbsError;
pub use handles::{
    AhHandle, CaHandle, CqHandle, Handle, MrHandle, MwHandle, PdHandle, QpHandle, SrqHandle,
};
pub use mem::MemBuf;
pub use port::{PkeyViolations, PortModify};
pub use provider::{Context, EventHandler, IgnoreEvents, Provider};
pub use types::*;

/// Builds [`Sges`] as `vec!` builds a `Vec`: `sges![sge]`,
/// `sges![a, b]`, `sges![]`.
pub use smallvec::smallvec as sges;

/// Result of every verb.
pub type Result<T> = core::result::Result<T, VerbsError>;
