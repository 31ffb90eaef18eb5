//! The SRP initiator's command line (`srp`) and its resident daemon
//! (`srpd`): what rdma-core's srptools (`srp_daemon`, `ibsrpdm`) and
//! Linux's `ib_srp` sysfs files are to a Linux host.
//!
//! The library part is [`initd`], srpd's registry of logins and its
//! control socket; the SRP initiator itself (sessions, the remote port
//! state machine, multipath, discovery, connectors) is `srp-initiator`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod initd;

/// Writes the libraries' `tracing` events to standard error: warnings and
/// errors, or what `RUST_LOG` asks for (`RUST_LOG=srp_initiator=debug`).
pub fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
