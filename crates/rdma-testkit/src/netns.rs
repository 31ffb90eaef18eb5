//! What the tests that make network namespaces of their own share: running
//! `ip`, and telling up front whether this machine lets them (root and an
//! `ip` command), so they can skip (`need::netns`) rather than fail.

use std::process::Command;

/// Why `ip args` failed; each names the command line.
#[derive(Debug, thiserror::Error)]
pub enum IpError {
    /// `ip` could not be run at all.
    #[error("ip {args}: {source}")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    /// `ip` ran and failed; what it wrote to stderr.
    #[error("ip {args}: {stderr}")]
    Failed { args: String, stderr: String },
}

/// Test setup code that reports in words (`Result<_, String>`) uses `?`.
impl From<IpError> for String {
    fn from(e: IpError) -> String {
        e.to_string()
    }
}

/// Runs `ip args`; the error says what failed and why.
pub fn ip(args: &[&str]) -> Result<(), IpError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| IpError::Spawn {
            args: args.join(" "),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(IpError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Why this machine cannot make network namespaces, if it cannot.
pub fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`ip -V` failed: {}", o.status)),
        Err(e) => Some(format!("no `ip` command: {e}")),
    }
}
