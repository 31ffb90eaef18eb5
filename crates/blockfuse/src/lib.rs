//! Block devices as files, through FUSE.
//!
//! `blockfuse` mounts a directory in which every [`BlockDevice`] handed to
//! [`mount`] appears as one regular file (`<mnt>/lun0`, …) of fixed size
//! `num_blocks * block_size`. It is the user-space counterpart of the
//! `/dev/sdX` that Linux `ib_srp` creates: fio, dd (`conv=notrunc`) and
//! `losetup` + `mkfs` work on the file, and every byte they move becomes a
//! block read or write on the device (for our SRP initiator, a SCSI command
//! to a remote LUN).
//!
//! How FUSE operations map to block operations:
//! - `read` reads the blocks covering the range and returns the bytes asked
//!   for; short at the end of the device, empty past it.
//! - `write` of whole blocks is passed through; a write that starts or ends
//!   inside a block does read-modify-write of those edge blocks while
//!   holding the device's lock exclusively (whole-block writes hold it
//!   shared), so concurrent unaligned writes to one block are not lost.
//!   Large transfers are split at [`Options::max_io`]. The mechanics are
//!   [`blockload::bytes::ByteView`], shared with the NBD server.
//! - `fsync` always calls [`BlockDevice::flush`] (SYNCHRONIZE CACHE);
//!   `flush` (each `close`) of a descriptor opened for writing does when
//!   anything was written to the device since the last flush, so a close
//!   after reads only waits on nothing while a path is down.
//! - `fallocate(PUNCH_HOLE|KEEP_SIZE)` unmaps the whole blocks of the range
//!   ([`BlockDevice::unmap`]) and zeroes the partial ones; `ZERO_RANGE`
//!   writes zeroes; plain allocation inside the file succeeds doing nothing.
//! - `open` with `O_DIRECT`, and by default every open
//!   ([`DirectIo::Always`]), gets `FOPEN_DIRECT_IO`: no page cache sits
//!   between the caller and the device, so what fio measures and what
//!   `fsync` flushes is the device itself.
//! - Device errors become `EIO`.
//!
//! The mount's owner may change the directory while it is mounted, as a
//! SCSI rescan changes `/dev`: [`Mount::add`] shows one more device,
//! [`Mount::remove`] takes one away (descriptors still open on it get
//! `ENODEV`: an inode number is never given to another device), and a
//! file's size is its device's size now (`num_blocks` on every request),
//! with [`Mount::resized`] telling the kernel to drop what it cached.
//!
//! What it refuses: growing or shrinking a file (`truncate` to any other
//! size is `EINVAL`, writes starting at or past the end are `ENOSPC`,
//! `fallocate` past the end without `KEEP_SIZE` is `ENOSPC`), creating,
//! removing or renaming entries, changing mode or owner (`EPERM`), writes
//! on a read-only mount (`EROFS`), punching holes in devices without unmap
//! (`EOPNOTSUPP`), device names that are not plain file names or repeat.
//! Access is limited to the mounting user unless [`Options::allow_other`]
//! or [`Options::allow_root`] is set.
//!
//! The session runs on background threads; [`Mount::unmount`] (or drop)
//! unmounts, detaching lazily and then aborting the FUSE connection if the
//! files stay busy, and joins within a bounded time. [`Mount::stats`] says
//! what was read and written through each file, and how many requests are
//! inside a device call now (a device that stopped answering holds them,
//! and the session cannot end before they return).

#![deny(clippy::undocumented_unsafe_blocks)]

mod fs;
mod lun;

use blockload::BlockDevice;
use fuser::{Config, INodeNo, MountOption, Notifier, SessionACL, SessionUnmounter};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// When opens bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectIo {
    /// Every open is direct I/O (the default): the device sees exactly
    /// the I/O the application issues.
    Always,
    /// Only `O_DIRECT` opens; others go through the page cache.
    WhenRequested,
}

/// Mount settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Files are 0444 and every write is `EROFS`.
    pub read_only: bool,
    /// Let every user reach the files (FUSE `allow_other`).
    pub allow_other: bool,
    /// Let root reach the files besides the mounting user.
    pub allow_root: bool,
    /// Page cache policy.
    pub direct_io: DirectIo,
    /// Threads serving FUSE requests (I/Os in flight at once).
    pub threads: usize,
    /// Largest single device call in bytes (rounded down to whole blocks,
    /// at least one block).
    pub max_io: usize,
    /// How long [`Mount::unmount`] waits at each step (after unmounting,
    /// after aborting the connection).
    pub unmount_timeout: Duration,
    /// Source name shown in `/proc/mounts`.
    pub fsname: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            read_only: false,
            allow_other: false,
            allow_root: false,
            direct_io: DirectIo::Always,
            threads: 4,
            max_io: 1 << 20,
            unmount_timeout: Duration::from_secs(10),
            fsname: "blockfuse".into(),
        }
    }
}

/// What was done through one file since it was shown ([`Mount::stats`]),
/// counted as the kernel asked for it (a large `read` split into several
/// device calls is one read; errors are `EIO`s).
pub use blockload::counts::IoStats as FileStats;

/// A mounted blockfuse directory; unmounted by [`Mount::unmount`] or drop.
pub struct Mount {
    mountpoint: PathBuf,
    table: Arc<fs::Table>,
    /// Tells the kernel to drop cached entries and attributes.
    notifier: Notifier,
    max_io: usize,
    unmounter: Option<SessionUnmounter>,
    done: Option<mpsc::Receiver<io::Result<()>>>,
    thread: Option<JoinHandle<()>>,
    /// The connection's name under /sys/fs/fuse/connections.
    conn: Option<u64>,
    timeout: Duration,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("mountpoint", &self.mountpoint)
            .field("names", &self.names())
            .field("mounted", &self.done.is_some())
            .finish()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// `name` as the name of a device's file: a plain file name.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 255
        || name.contains(['/', '\0'])
    {
        return Err(invalid(format!("`{name}` is not usable as a file name")));
    }
    Ok(())
}

/// Mounts `devices` as files named by their strings in the existing
/// directory `mountpoint` and serves them on background threads.
///
/// # Errors
/// `InvalidInput` for a name that is empty, `.`, `..`, longer than 255
/// bytes, contains `/` or NUL, or repeats, and for a device of block size 0;
/// otherwise whatever mounting returns (no `/dev/fuse`, no permission, the
/// mount point is not a directory).
pub fn mount(
    mountpoint: impl AsRef<Path>,
    devices: Vec<(String, Arc<dyn BlockDevice>)>,
    options: Options,
) -> io::Result<Mount> {
    let mountpoint = mountpoint.as_ref().canonicalize()?;
    let mut luns = Vec::with_capacity(devices.len());
    for (name, dev) in devices {
        check_name(&name)?;
        if luns.iter().any(|l: &lun::Lun| l.name == name) {
            return Err(invalid(format!("device name `{name}` given twice")));
        }
        luns.push(lun::Lun::new(name, dev, options.max_io)?);
    }
    let table = Arc::new(fs::Table::new(luns));
    let fs = fs::BlockFs::new(table.clone(), &options);

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(options.fsname.clone()),
        MountOption::Subtype("blockfuse".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        if options.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.acl = if options.allow_other {
        SessionACL::All
    } else if options.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;

    let mut session = fuser::Session::new(fs, &mountpoint, &config)?;
    let unmounter = session.unmount_callable();
    let notifier = session.notifier();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("blockfuse".into())
        .spawn(move || {
            let _ = tx.send(session.run());
        })?;
    // Only now: stat on the mount point is a FUSE request the session
    // must be running to answer.
    let conn = std::fs::metadata(&mountpoint).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        conn_of(m.dev())
    });
    Ok(Mount {
        mountpoint,
        table,
        notifier,
        max_io: options.max_io,
        unmounter: Some(unmounter),
        done: Some(rx),
        thread: Some(thread),
        conn,
        timeout: options.unmount_timeout,
    })
}

impl Mount {
    /// The mount directory (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The path of the file for device `name`, if there is one.
    pub fn path_of(&self, name: &str) -> Option<PathBuf> {
        self.table.ino_of(name).map(|_| self.mountpoint.join(name))
    }

    /// The names of the files, in the order they were added.
    pub fn names(&self) -> Vec<String> {
        self.table
            .read()
            .iter()
            .map(|(_, l)| l.name.clone())
            .collect()
    }

    /// Each file's [`FileStats`], in the order they were added.
    pub fn stats(&self) -> Vec<(String, FileStats)> {
        self.table
            .read()
            .iter()
            .map(|(_, l)| (l.name.clone(), l.stats()))
            .collect()
    }

    /// Shows `dev` as one more file, `name`; returns its path.
    ///
    /// # Errors
    /// `InvalidInput` for a name [`mount`] would refuse or one already
    /// shown, and for a device of block size 0.
    pub fn add(&self, name: &str, dev: Arc<dyn BlockDevice>) -> io::Result<PathBuf> {
        check_name(name)?;
        let lun = lun::Lun::new(name.to_string(), dev, self.max_io)?;
        self.table
            .add(lun)
            .ok_or_else(|| invalid(format!("device name `{name}` is shown already")))?;
        // The directory's listing changed; no negative entry is cached
        // (lookups of missing names are not), so the name resolves now.
        let _ = self.notifier.inval_inode(INodeNo::ROOT, 0, 0);
        Ok(self.mountpoint.join(name))
    }

    /// Takes the file `name` away; false if there was none. Descriptors
    /// open on it get `ENODEV` from now on.
    pub fn remove(&self, name: &str) -> bool {
        if self.table.remove(name).is_none() {
            return false;
        }
        let _ = self
            .notifier
            .inval_entry(INodeNo::ROOT, std::ffi::OsStr::new(name));
        let _ = self.notifier.inval_inode(INodeNo::ROOT, 0, 0);
        true
    }

    /// Tells the kernel that the device behind `name` changed size (its
    /// cached attributes go; the next `stat` asks the device); false if
    /// there is no such file.
    pub fn resized(&self, name: &str) -> bool {
        let Some(ino) = self.table.ino_of(name) else {
            return false;
        };
        let _ = self.notifier.inval_inode(INodeNo(ino), 0, 0);
        true
    }

    /// Unmounts and waits for the session to end.
    ///
    /// If the files are busy (open, or a loop device over them), the mount
    /// is detached lazily; if the session has not ended within the timeout
    /// the FUSE connection is aborted (pending and later I/O on the files
    /// fails with `ENOTCONN`). A mount that unmounted at once but whose
    /// session goes on is held only by a copy in another mount namespace
    /// (made by `ip netns exec` or `unshare -m` while it was mounted, with
    /// private propagation): its connection is aborted after a second, and
    /// the unmount succeeds.
    ///
    /// # Errors
    /// The session's own error, `TimedOut` if even the abort did not end
    /// it within the timeout (its thread is then left behind), or `Other`
    /// saying the connection had to be aborted.
    pub fn unmount(mut self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> io::Result<()> {
        let Some(done) = self.done.take() else {
            return Ok(());
        };
        // Who kept the mount busy, for the error if it has to be aborted.
        let mut busy = None;
        if let Some(mut u) = self.unmounter.take() {
            if let Err(e) = u.unmount() {
                busy = Some((e, holders(&self.mountpoint)));
                // Busy: take it out of the namespace now; the session ends
                // when the last user lets go (or we abort below).
                lazy_detach(&self.mountpoint);
            }
        }
        // Unmounted, yet the session may go on: a mount namespace made
        // while we were mounted (`ip netns exec`, `unshare -m`) holds a
        // copy of the mount, and with private propagation (no `shared:`
        // in mountinfo, as on most containers) our unmount never reaches
        // it. Nobody here uses the files any more: after a short wait the
        // connection is aborted, which ends the copy's I/O as it ends ours,
        // and that is no error.
        let first_wait = if busy.is_none() {
            self.timeout.min(COPY_WAIT)
        } else {
            self.timeout
        };
        let mut aborted = false;
        let mut in_flight = 0;
        let result = match done.recv_timeout(first_wait) {
            Ok(r) => r,
            Err(_) => {
                in_flight = self.stats().iter().map(|(_, s)| s.in_flight).sum();
                aborted = self.conn.is_some_and(abort_connection);
                match done.recv_timeout(self.timeout) {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("FUSE session on {} did not end", self.mountpoint.display()),
                        ))
                    }
                }
            }
        };
        if let Some(t) = self.thread.take() {
            // It has sent its result, so it is returning.
            let _ = t.join();
        }
        if aborted && result.is_ok() {
            let Some((e, users)) = &busy else {
                // Only another namespace's copy kept it (see above). Should
                // the unmount have done nothing after all, the dead mount
                // goes too.
                if still_ours(&self.mountpoint, self.conn) {
                    lazy_detach(&self.mountpoint);
                }
                return Ok(());
            };
            let why = if users.is_empty() {
                format!("unmount said \"{e}\"; no process had a file or directory open in it")
            } else {
                format!("unmount said \"{e}\"; in use by {}", users.join(", "))
            };
            return Err(io::Error::other(format!(
                "{} stayed busy for {:?} ({why}; {in_flight} requests inside a device call); \
                 the FUSE connection was aborted",
                self.mountpoint.display(),
                self.timeout
            )));
        }
        result
    }
}

/// The processes with a descriptor, working directory or root under
/// `mountpoint`, as "pid N (comm)", and the loop devices over its files;
/// what `fuser -m` would list, read from /proc and /sys (processes we may
/// not look at are left out).
fn holders(mountpoint: &Path) -> Vec<String> {
    let under = |p: &Path| p.starts_with(mountpoint);
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dir = entry.path();
        let link = |n: &str| std::fs::read_link(dir.join(n)).ok();
        let mut uses =
            link("cwd").is_some_and(|p| under(&p)) || link("root").is_some_and(|p| under(&p));
        if !uses {
            if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
                uses = fds
                    .flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|p| under(&p)));
            }
        }
        if uses {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    // A loop device holds its backing file from the kernel.
    if let Ok(blocks) = std::fs::read_dir("/sys/block") {
        for b in blocks.flatten() {
            let backing = std::fs::read_to_string(b.path().join("loop/backing_file"));
            if backing.is_ok_and(|f| under(Path::new(f.trim()))) {
                found.push(format!("/dev/{}", b.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// How long a session may go on after a successful unmount before its
/// connection is aborted: only a mount namespace's copy of the mount keeps
/// it then (see [`Mount::unmount`]).
const COPY_WAIT: Duration = Duration::from_secs(1);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Whether `path` is still the root of connection `conn`'s mount here
/// (an aborted one answers `ENOTCONN`).
fn still_ours(path: &Path, conn: Option<u64>) -> bool {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Err(e) => e.raw_os_error() == Some(libc::ENOTCONN),
        Ok(m) => conn == Some(conn_of(m.dev())),
    }
}

/// fusectl's name of a connection: the kernel's dev_t, major << 20 | minor.
fn conn_of(dev: u64) -> u64 {
    (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev))
}

fn lazy_detach(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Writes to /sys/fs/fuse/connections/<conn>/abort, mounting fusectl there
/// first if needed. True if the write succeeded.
fn abort_connection(conn: u64) -> bool {
    let dir = Path::new("/sys/fs/fuse/connections");
    let abort = dir.join(conn.to_string()).join("abort");
    if !abort.exists() {
        let fstype = c"fusectl";
        if let Ok(target) = CString::new(dir.as_os_str().as_bytes()) {
            // SAFETY: all pointers are valid NUL-terminated strings or null.
            unsafe {
                libc::mount(
                    fstype.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
        }
    }
    std::fs::write(abort, b"1").is_ok()
}
