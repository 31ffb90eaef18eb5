//! What the tests that make network namespaces of their own share: running
//! `ip`, and telling up front whether this machine lets them (root and an
//! `ip` command), so they can skip (`need::netns`) rather than fail.

use std::process::Command;

/// Runs `ip args`; the error says what failed and why.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
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
