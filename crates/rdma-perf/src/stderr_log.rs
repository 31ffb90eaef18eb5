//! The binaries' tracing subscriber: the library's events on stderr,
//! warnings and worse unless `RUST_LOG` says otherwise (for example
//! `RUST_LOG=rdma_perf=debug`). Each binary includes this file (`mod
//! stderr_log;`): choosing where logs go is a binary's business, not the
//! library's.

/// Installs the subscriber; when one is installed already, it stays.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .try_init();
}
