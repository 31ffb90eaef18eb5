//! What srptd and srpd share as daemons: a control socket that carries
//! one JSON request per line and one JSON answer per line, made mode 0600
//! and checked for the peer's user; its default path; the client side
//! (`srptadm`, `srp`); SIGTERM, SIGINT and SIGHUP taken synchronously;
//! and, for the command-line tools, the libraries' `tracing` events on
//! standard error ([`log_to_stderr`]).
//!
//! An answer is `{"ok": true, "data": ...}` or `{"ok": false, "error":
//! "..."}`; [`request_to`] turns the second into [`RequestError::Refused`]
//! with the daemon's words.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod signals;

use serde::Serialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The control socket of daemon `name`: `/run/<name>.sock` for root,
/// `$TMPDIR/<name>-<uid>.sock` for others.
pub fn control_socket_of(name: &str) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    match unsafe { libc::geteuid() } {
        0 => PathBuf::from(format!("/run/{name}.sock")),
        uid => std::env::temp_dir().join(format!("{name}-{uid}.sock")),
    }
}

/// Writes the libraries' `tracing` events to standard error: warnings and
/// errors, or what `RUST_LOG` asks for (`RUST_LOG=srp_initiator=debug`).
/// When a subscriber is installed already, it stays.
pub fn log_to_stderr() {
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

/// The directory a path's file is (or would be) in.
pub fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The credentials of a socket's peer (`SO_PEERCRED`: its process,
/// effective user and group when it connected).
///
/// # Errors
/// The system's.
pub fn peer_cred(s: &UnixStream) -> std::io::Result<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(cred)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The effective user ID of a socket's peer.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    peer_cred(s).ok().map(|c| c.uid)
}

/// What is at a control socket's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketPath {
    /// Nothing: binding creates the socket.
    Free,
    /// A socket nobody listens on (left by a daemon that died): binding
    /// replaces it.
    Stale,
    /// A socket a daemon listens on.
    Listening,
}

/// What is at `path`, or why no control socket can be bound there: a
/// path too long for a socket address, a directory that does not exist
/// or is not one, a file that is not a socket.
pub fn control_path(path: &Path) -> std::io::Result<SocketPath> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    if std::os::unix::net::SocketAddr::from_pathname(path).is_err() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{shown} is {} bytes long, more than a Unix socket address holds (107): choose a shorter path",
                path.as_os_str().len()
            ),
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{shown} exists and is not a socket: remove it or choose another path"),
        )),
        Ok(_) if UnixStream::connect(path).is_ok() => Ok(SocketPath::Listening),
        Ok(_) => Ok(SocketPath::Stale),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let dir = dir_of(path);
            match std::fs::metadata(dir) {
                Ok(_) => Ok(SocketPath::Free),
                Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "directory {} does not exist: create it or choose another path",
                        dir.display()
                    ),
                )),
                Err(e) => Err(e),
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Err(Error::new(
            e.kind(),
            format!("{shown}: a part of the path is not a directory: choose another path"),
        )),
        Err(e) => Err(e),
    }
}

/// Binds the control socket at `path` with mode 0600, replacing a stale
/// socket file (one nobody listens on) but nothing else.
pub fn bind_control(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    match control_path(path)? {
        SocketPath::Free => {}
        SocketPath::Stale => std::fs::remove_file(path)?,
        SocketPath::Listening => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{}: another daemon is listening", path.display()),
            ))
        }
    }
    // Bound in a directory only we can enter, made 0600 there, then moved
    // into place: nobody else can connect before the mode is set. (A
    // umask would do it too, but it is the whole process's: a thread
    // creating files meanwhile, or a child started meanwhile, got 0600
    // files; a test's `cargo build` once made binaries nobody could run.)
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let private = dir.join(format!(".{name}.{}.bind", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&private)?;
    let bound = (|| {
        let tmp = private.join("s");
        let l = UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(l)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Serves a control socket whose requests and answers are lines of JSON:
/// `answer` turns each request line into its answer. Only the daemon's own
/// user may connect (`who` names the daemon in the refusal).
pub fn serve_lines(
    listener: UnixListener,
    who: &'static str,
    answer: impl Fn(&str) -> Value + Send + Sync + 'static,
) -> std::thread::JoinHandle<()> {
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if peer_uid(&conn) != Some(me) {
                let _ = writeln!(
                    conn,
                    "{}",
                    json!({"ok": false, "error": format!("permission denied: not the owner of {who}")})
                );
                continue;
            }
            let answer = answer.clone();
            std::thread::spawn(move || {
                let Ok(read) = conn.try_clone() else { return };
                for line in BufReader::new(read).lines().take(10_000) {
                    let Ok(line) = line else { return };
                    if writeln!(conn, "{}", answer(&line)).is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// Why a request over a control socket got no answer's data.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Nothing at the socket's path, or a socket nobody listens on (a
    /// daemon that died): the daemon is not running there.
    #[error(
        "no {who} at {} ({source}): start {who}, or pass --control-socket if it uses another socket",
        path.display()
    )]
    NoDaemon {
        who: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The socket cannot be reached (not ours to use, say).
    #[error("connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The socket refused a read timeout.
    #[error("{0}")]
    Timeout(#[source] std::io::Error),
    /// The request does not serialise.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("send to {}: {source}", path.display())]
    Send {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read from {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The answer is not JSON (not the daemon asked for?).
    #[error("bad answer from {who}: {source}")]
    BadAnswer {
        who: String,
        #[source]
        source: serde_json::Error,
    },
    /// The daemon refused the request, in its words.
    #[error("{0}")]
    Refused(String),
    #[error("{0} refused without a reason")]
    RefusedWithoutReason(String),
}

/// Sends one request line to the control socket of daemon `who` at `path`
/// and returns its answer's data (or its error).
pub fn request_to(path: &Path, who: &str, req: &impl Serialize) -> Result<Value, RequestError> {
    let p = || path.to_path_buf();
    let mut s = UnixStream::connect(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            RequestError::NoDaemon {
                who: who.to_string(),
                path: p(),
                source,
            }
        }
        _ => RequestError::Connect { path: p(), source },
    })?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .map_err(RequestError::Timeout)?;
    let line = serde_json::to_string(req).map_err(RequestError::Encode)?;
    writeln!(s, "{line}").map_err(|source| RequestError::Send { path: p(), source })?;
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .map_err(|source| RequestError::Read { path: p(), source })?;
    let v: Value = serde_json::from_str(&answer).map_err(|source| RequestError::BadAnswer {
        who: who.to_string(),
        source,
    })?;
    if v["ok"] == json!(true) {
        Ok(v["data"].clone())
    } else {
        Err(v["error"]
            .as_str()
            .map(|e| RequestError::Refused(e.to_string()))
            .unwrap_or_else(|| RequestError::RefusedWithoutReason(who.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No daemon: nothing at the path, or a socket left by one that died.
    /// The error names the daemon, the path, and what to do.
    #[test]
    fn a_missing_daemon_is_named_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("daemon-ctl-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("none.sock");
        let e = request_to(&path, "srptd", &json!({"cmd": "show"})).unwrap_err();
        assert!(matches!(e, RequestError::NoDaemon { .. }), "{e:?}");
        let m = e.to_string();
        assert!(
            m.starts_with(&format!("no srptd at {}", path.display()))
                && m.contains("start srptd, or pass --control-socket"),
            "{m}"
        );
        // A stale socket: bound, then its listener gone.
        let stale = dir.join("stale.sock");
        drop(bind_control(&stale).unwrap());
        let e = request_to(&stale, "srpd", &json!({"cmd": "list"})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("no srpd at {}", stale.display())),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The socket is 0600 and answers at its path, and the process's
    /// umask is never changed (a thread creating files meanwhile would get
    /// it): a file made while binding keeps the usual mode.
    #[test]
    fn the_control_socket_is_private_without_touching_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("daemon-ctl-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut modes = Vec::new();
                for i in 0..2000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) && i > 10 {
                        break;
                    }
                    let f = dir.join(format!("f{}", i % 4));
                    std::fs::write(&f, b"x").unwrap();
                    modes.push(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777);
                    std::fs::remove_file(&f).unwrap();
                }
                modes
            })
        };
        for _ in 0..20 {
            let l = bind_control(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let _c = UnixStream::connect(&path).unwrap();
            let (_s, _) = l.accept().unwrap();
            drop(l);
            std::fs::remove_file(&path).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let modes = watcher.join().unwrap();
        let first = modes[0];
        // With the old umask 0177 while binding, files made meanwhile came
        // out 0600 now and then.
        assert!(modes.iter().all(|m| *m == first), "modes seen: {modes:?}");
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
