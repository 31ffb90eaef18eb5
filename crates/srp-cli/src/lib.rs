//! The SRP initiator's command line (`srp`) and its resident daemon
//! (`srpd`): what rdma-core's srptools (`srp_daemon`, `ibsrpdm`) and
//! Linux's `ib_srp` sysfs files are to a Linux host.
//!
//! The library part is [`initd`], srpd's registry of logins and its
//! control socket, [`args`], what the two command lines share, and
//! [`device`], logins from an rdma-core device (`--device`), and
//! [`iwarp`], logins over our soft iWARP NIC (`--iwarp`); the SRP
//! initiator itself (sessions, the remote port
//! state machine, multipath, discovery, connectors) is `srp-initiator`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod args;
pub mod device;
pub mod initd;
pub mod iwarp;
pub mod rejoin;
