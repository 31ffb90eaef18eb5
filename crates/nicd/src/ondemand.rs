//! Starting the daemon on demand: a tool given `--nicd` when no daemon
//! answers on the socket starts one itself, for the addresses it was
//! asked for, and the daemon leaves again once it has had no client for
//! a while (`nicd --idle-exit`).
//!
//! Two tools starting at once end with one daemon: each looks for a
//! daemon and starts one while holding an exclusive `flock` on the lock
//! file beside the socket (`<socket>.lock`), and keeps holding it until
//! it is connected ([`Ensured`]); the daemon takes the same lock before
//! it leaves for want of clients, and leaves only if it still has none.
//! So a tool never connects to a daemon that is just leaving, and a
//! second tool finds the first one's daemon.
//!
//! The daemon started here is a process of its own group (a Ctrl-C to
//! the tool does not reach it), its output in `<socket>.log`, its
//! readiness seen by its socket answering (polled, with a deadline).

use rdma_access::subnet::Fabric;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a tool starts the daemon when none answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDemand {
    /// The daemon leaves after this long without a client.
    pub idle_exit: Duration,
    /// The `nicd` program (`None`: the one beside the tool's own
    /// executable, else `nicd` on `PATH`).
    pub program: Option<PathBuf>,
    /// How long to wait for its socket to answer.
    pub wait: Duration,
}

/// The environment variable a tool maps onto [`OnDemand::idle_exit`]
/// ([`OnDemand::from_env`]; a duration, `30s`, `500ms`).
pub const IDLE_EXIT_ENV: &str = "NICD_IDLE_EXIT";

/// The environment variable a tool maps onto [`OnDemand::program`].
pub const PROGRAM_ENV: &str = "NICD_PROGRAM";

/// A daemon started on demand leaves after this long without a client.
pub const DEFAULT_IDLE_EXIT: Duration = Duration::from_secs(30);

impl Default for OnDemand {
    fn default() -> OnDemand {
        OnDemand {
            idle_exit: DEFAULT_IDLE_EXIT,
            program: None,
            wait: Duration::from_secs(20),
        }
    }
}

impl OnDemand {
    /// The defaults with `NICD_IDLE_EXIT` and `NICD_PROGRAM` applied
    /// (for binaries; the library reads no environment).
    ///
    /// # Errors
    /// `NICD_IDLE_EXIT` is not a duration: in words naming it.
    pub fn from_env() -> Result<OnDemand, String> {
        let mut o = OnDemand::default();
        if let Some(v) = std::env::var_os(IDLE_EXIT_ENV).filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy();
            o.idle_exit = rdma_types::units::secs(&v).map_err(|e| {
                format!("{IDLE_EXIT_ENV}={v}: {e} (give a duration such as 30s or 500ms)")
            })?;
        }
        if let Some(v) = std::env::var_os(PROGRAM_ENV).filter(|v| !v.is_empty()) {
            o.program = Some(v.into());
        }
        Ok(o)
    }
}

/// The daemon a tool started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// Its process ID.
    pub pid: u32,
    /// The program run.
    pub program: PathBuf,
    /// Where its output goes.
    pub log: PathBuf,
    /// How long it stays without a client.
    pub idle_exit: Duration,
}

impl std::fmt::Display for Started {
    /// The one line a tool prints: `started the NIC daemon (nicd, pid
    /// 1234; its log /run/user/1000/nicd.sock.log; it leaves after 30s
    /// without a client)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "started the NIC daemon ({}, pid {}; its log {}; it leaves after {:?} without a client)",
            self.program.display(),
            self.pid,
            self.log.display(),
            self.idle_exit
        )
    }
}

/// A daemon answers on the socket: started by this call or there
/// before. Holds the start lock until dropped: connect before dropping
/// it, so the daemon cannot leave in between.
#[must_use = "connect while holding it"]
pub struct Ensured {
    /// The daemon this call started, if it did.
    pub started: Option<Started>,
    /// `None` when the lock file could not be made but a daemon answers
    /// (another user's daemon, its socket in a directory of theirs).
    _lock: Option<File>,
}

/// Why [`ensure`] found no daemon and could not start one.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The lock file beside the socket.
    #[error("cannot lock {path} (to start the NIC daemon): {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The program would not run.
    #[error(
        "no NIC daemon at {socket}, and `{program}` would not start ({source}): install nicd \
         beside this tool or on PATH, name it with {PROGRAM_ENV}, or start it by hand with \
         `nicd --ip ADDRESS --socket {socket}`; or give the tool --own-nic for a NIC in its own \
         process"
    )]
    Spawn {
        /// The socket.
        socket: String,
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// It ran and stopped before its socket answered.
    #[error("the NIC daemon started for {socket} stopped ({status}): {said} (its log: {log})")]
    Exited {
        /// The socket.
        socket: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// The last line of its log.
        said: String,
        /// Its log.
        log: String,
    },
    /// It runs, but its socket did not answer in time.
    #[error(
        "the NIC daemon started for {socket} (pid {pid}) did not answer within {waited:?} (its \
         log: {log})"
    )]
    Slow {
        /// The socket.
        socket: String,
        /// Its process ID.
        pid: u32,
        /// How long we waited.
        waited: Duration,
        /// Its log.
        log: String,
    },
}

/// The lock file of `socket`: `<socket>.lock`.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".lock");
    s.into()
}

/// The log of a daemon started for `socket`: `<socket>.log`.
pub fn log_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".log");
    s.into()
}

/// Takes the start lock of `socket` (blocking while another holder
/// starts a daemon or one leaves).
///
/// # Errors
/// The lock file cannot be made or locked.
pub fn lock(socket: &Path) -> Result<File, StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = lock_path(socket);
    let err = |source| StartError::Lock {
        path: path.clone(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(err)?;
    f.lock().map_err(err)?;
    Ok(f)
}

/// Whether a daemon accepts connections at `socket`.
pub fn answers(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

/// Makes sure a daemon answers at `socket`: when none does, starts
/// `nicd --socket SOCKET --ip IP... --idle-exit D` (`--ib-ip IP...` on
/// the `ib` fabric) as `how` says and waits (at most `how.wait`) for its
/// socket to answer.
///
/// A daemon that answers already is used whatever addresses it serves
/// (connecting names one it does not serve, [`crate::connect_at`]).
///
/// # Errors
/// See [`StartError`].
pub fn ensure(
    socket: &Path,
    ips: &[IpAddr],
    fabric: Fabric,
    how: &OnDemand,
) -> Result<Ensured, StartError> {
    let lock = match lock(socket) {
        Ok(l) => l,
        // Not ours to start (a directory we cannot write in): use the
        // daemon that answers, if one does.
        Err(_) if answers(socket) => {
            return Ok(Ensured {
                started: None,
                _lock: None,
            })
        }
        Err(e) => return Err(e),
    };
    if answers(socket) {
        return Ok(Ensured {
            started: None,
            _lock: Some(lock),
        });
    }
    let program = how.program.clone().unwrap_or_else(beside_us);
    let log = log_path(socket);
    let socket_s = socket.display().to_string();
    let spawn_err = |source| StartError::Spawn {
        socket: socket_s.clone(),
        program: program.display().to_string(),
        source,
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(spawn_err)?;
    let err = out.try_clone().map_err(spawn_err)?;
    // It runs in `/`: paths given relative to here are made absolute
    // (a bare program name is looked up on PATH).
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let exe = if program.components().count() > 1 {
        abs(&program)
    } else {
        program.clone()
    };
    let mut cmd = Command::new(&exe);
    cmd.arg("--socket").arg(abs(socket));
    let flag = match fabric {
        Fabric::Roce => "--ip",
        Fabric::Ib => "--ib-ip",
    };
    for ip in ips {
        cmd.arg(flag).arg(ip.to_string());
    }
    cmd.arg("--idle-exit")
        .arg(format!("{}ms", how.idle_exit.as_millis()))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // Its own process group: the tool's Ctrl-C is not its end. In `/`,
    // so it holds no directory of the tool's busy (a mount to unmount).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.current_dir("/");
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let pid = child.id();
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if answers(socket) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StartError::Exited {
                socket: socket_s,
                status,
                said: last_line(&log),
                log: log.display().to_string(),
            });
        }
        if start.elapsed() >= how.wait {
            return Err(StartError::Slow {
                socket: socket_s,
                pid,
                waited: how.wait,
                log: log.display().to_string(),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    // Reaped when it leaves, so it is no zombie of a long-lived tool.
    let _ = std::thread::Builder::new()
        .name("nicd-reap".into())
        .spawn(move || {
            let _ = child.wait();
        });
    Ok(Ensured {
        started: Some(Started {
            pid,
            program,
            log,
            idle_exit: how.idle_exit,
        }),
        _lock: Some(lock),
    })
}

/// This process's program name (`srpd`), for the line a tool prints
/// when it started the daemon.
pub fn tool_name() -> String {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "nicd client".into())
}

/// `nicd` beside this process's executable, else `nicd` (on `PATH`).
fn beside_us() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("nicd")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nicd"))
}

/// The last non-empty line of `log` (what a daemon said as it failed).
fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "it said nothing".into())
}
