//! srptd's control socket: the admin [`Request`]s `srptadm` sends, the
//! socket made mode 0600 and checked for the peer's user, one JSON line per
//! request and answer.

use super::*;

/// One admin request, as JSON on the control socket (`{"cmd": "..."}`).
/// The same type is `srptadm`'s command line (each variant a subcommand,
/// its help from the `about` texts), so the two cannot drift apart; the
/// two whose command line differs from their JSON (`add-device` takes
/// flags and sends TOML, `set log-level`) are `srptadm`'s own.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Subcommand)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Target name, address, parameters, state.
    #[command(about = "Target name, address, SRP parameters")]
    Show,
    /// Channels with credits and commands in flight.
    #[command(about = "Logged-in channels: initiator, credits, commands in flight")]
    Sessions,
    /// Devices with handler, size and counters.
    #[command(about = "Devices with handler, size, IDs and counters")]
    Devices,
    /// The default LUNs and the groups.
    #[command(about = "Default LUNs and groups")]
    Luns,
    /// Adds a device given as a `[[device]]` table body in TOML.
    #[command(skip)]
    AddDevice { toml: String },
    #[command(about = "Remove a device that no LUN maps")]
    RemoveDevice { name: String },
    /// Grows a device to `size` (K/M/G/T suffixes): CAPACITY DATA HAS
    /// CHANGED for every nexus that sees it and SRP_AER_REQ to its
    /// initiators (SCST's `resync_size`).
    #[command(
        about = "Grow a ram device to SIZE (e.g. 64M): initiators that see it get \
                 CAPACITY DATA HAS CHANGED and an SRP_AER_REQ. Shrinking is refused"
    )]
    Resize { device: String, size: String },
    /// Maps a device; `group` absent means the default LUNs.
    #[command(about = "Map a device at a LUN (of a group, or the default LUNs)")]
    AddLun {
        #[arg(long)]
        group: Option<String>,
        lun: u32,
        device: String,
    },
    #[command(about = "Unmap a LUN")]
    RemoveLun {
        #[arg(long)]
        group: Option<String>,
        lun: u32,
    },
    #[command(about = "Create a LUN group")]
    AddGroup { name: String },
    #[command(about = "Remove a group; its initiators see the default LUNs again")]
    RemoveGroup { name: String },
    #[command(about = "Add an initiator name (0x + 32 hex digits, or a prefix ending in *)")]
    AddInitiator { group: String, initiator: String },
    #[command(about = "Remove an initiator name from a group")]
    RemoveInitiator { group: String, initiator: String },
    /// Accept logins on `target` (a name or address), or on every target.
    #[command(about = "Accept logins")]
    Enable {
        /// Only this target (its name or address); all without it.
        #[arg(long)]
        #[serde(default)]
        target: Option<String>,
    },
    /// Refuse logins on `target`, or on every target, and log its
    /// initiators out.
    #[command(about = "Refuse logins and log every initiator out")]
    Disable {
        /// Only this target (its name or address); all without it.
        #[arg(long)]
        #[serde(default)]
        target: Option<String>,
    },
    /// Saves the running configuration (to the file it was loaded from
    /// when `path` is absent).
    #[command(
        about = "Save the running configuration (to the file srptd was started from \
                 when no path is given)"
    )]
    WriteConfig { path: Option<PathBuf> },
    /// Re-reads the configuration file and applies what changed in
    /// devices, LUN maps, groups and `enabled`, without dropping sessions.
    #[command(about = "Re-read srptd's configuration file and apply it (as SIGHUP does)")]
    Reload,
    /// Changes the log threshold while running (SCST's `trace_level`).
    #[command(skip)]
    SetLogLevel { level: crate::log::Level },
}

impl Request {
    /// The event a successful request is logged as, and whether it
    /// changed anything (queries are logged at debug level).
    pub(super) fn event(&self) -> (&'static str, bool) {
        match self {
            Request::Show | Request::Sessions | Request::Devices | Request::Luns => {
                ("admin_query", false)
            }
            Request::AddDevice { .. } => ("device_added", true),
            Request::RemoveDevice { .. } => ("device_removed", true),
            Request::Resize { .. } => ("device_resized", true),
            Request::AddLun { .. } => ("lun_added", true),
            Request::RemoveLun { .. } => ("lun_removed", true),
            Request::AddGroup { .. } => ("group_added", true),
            Request::RemoveGroup { .. } => ("group_removed", true),
            Request::AddInitiator { .. } => ("initiator_added", true),
            Request::RemoveInitiator { .. } => ("initiator_removed", true),
            Request::Enable { .. } => ("target_enabled", true),
            Request::Disable { .. } => ("target_disabled", true),
            Request::WriteConfig { .. } => ("config_written", true),
            Request::Reload => ("reloaded", true),
            Request::SetLogLevel { .. } => ("log_level_set", true),
        }
    }
}

/// A request's arguments for a log line: its JSON without `cmd`.
pub(super) fn args_of(asked: &Value) -> String {
    match asked {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("cmd");
            Value::Object(m).to_string()
        }
        v => v.to_string(),
    }
}

/// The effective user ID of a socket's peer.
pub(super) fn peer_uid(s: &UnixStream) -> Option<u32> {
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
    (r == 0).then_some(cred.uid)
}

/// What is at a control socket's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SocketPath {
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
pub(super) fn control_path(path: &Path) -> std::io::Result<SocketPath> {
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
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let l = l?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves the control socket: one JSON request per line, one JSON answer
/// per line (`{"ok": true, "data": ...}` or `{"ok": false, "error": ...}`).
pub fn serve_control(daemon: Arc<Daemon>, listener: UnixListener) -> std::thread::JoinHandle<()> {
    serve_lines(listener, "srptd", move |line| {
        match serde_json::from_str::<Request>(line) {
            Ok(req) => match daemon.handle(req) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e.to_string() }),
            },
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
        }
    })
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

/// Serves `GET /metrics` in the Prometheus text format on `addr`.
pub fn serve_metrics(
    daemon: Arc<Daemon>,
    addr: std::net::SocketAddr,
) -> std::io::Result<(std::net::SocketAddr, std::thread::JoinHandle<()>)> {
    use std::io::Read;
    let l = std::net::TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    let t = std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics ") {
                ("200 OK", daemon.metrics())
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let _ = write!(
                c,
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok((local, t))
}

/// Why a request over a control socket got no answer's data.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No daemon listens at the socket (or it is not ours to use).
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

/// A client of the control socket (what `srptadm` uses).
pub fn request(path: &Path, req: &Request) -> Result<Value, RequestError> {
    request_to(path, "srptd", req)
}

/// Sends one request line to the control socket of daemon `who` at `path`
/// and returns its answer's data (or its error).
pub fn request_to(path: &Path, who: &str, req: &impl Serialize) -> Result<Value, RequestError> {
    let p = || path.to_path_buf();
    let mut s =
        UnixStream::connect(path).map_err(|source| RequestError::Connect { path: p(), source })?;
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
