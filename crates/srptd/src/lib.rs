//! The SRP target daemon's library: what `srptd` runs and `srptadm`
//! speaks to, apart from their command lines.
//!
//! - [`config`]: srptd's configuration file (TOML, `scst.conf` for
//!   ib_srpt in other words), parsed with file, line and key in every
//!   error, and written back as `srptadm write-config` saves it;
//! - [`daemon`]: a configuration brought to life (devices, LUN maps, one
//!   SRP target port per `[[target]]`, logins by RDMA CM and IB CM), the
//!   admin [`daemon::Request`]s of the control socket (one type, the
//!   daemon's and `srptadm`'s alike), reload, reports and metrics;
//! - [`drbd`]: DRBD roles read from DRBD 8.4's status file, and when a
//!   device that follows one should be open (sans-IO);
//! - [`log`]: srptd's log records, as text or JSON lines.
//!
//! The SRP and SCSI logic is below, in `srp-target` and `scsi`; the
//! control socket's plumbing, shared with srpd, in `daemon-ctl`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod daemon;
pub mod drbd;
#[doc(hidden)]
pub mod fuzz;
pub mod log;
