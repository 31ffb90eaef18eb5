//! Eventfds, as both ends use them: the client's doorbell (the daemon
//! waits on it) and its completion notice (the client waits on it).
//! Every one is non-blocking (the daemon makes the client's so, since
//! the two share its open file description), so a wait polls first.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A new eventfd, non-blocking and closed on exec.
pub(crate) fn new() -> std::io::Result<OwnedFd> {
    // SAFETY: no pointers; flags valid.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just returned by eventfd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes 1 (a full or bogus descriptor: nothing to do).
pub(crate) fn write_one(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local array to our descriptor.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// Waits until `fd` is readable or `timeout` passes (1 ms at least),
/// then reads it back to zero.
pub(crate) fn wait(fd: &OwnedFd, timeout: Duration) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd, for the call's duration.
    let _ = unsafe { libc::poll(&mut p, 1, ms) };
    drain(fd);
}

/// Reads `fd` back to zero (non-blocking: nothing to read is fine).
pub(crate) fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local array; the
    // descriptor is non-blocking.
    let _ = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
}

/// Makes `fd` non-blocking (its open file description, which a client's
/// descriptor passed to the daemon shares); `false` when that fails.
pub(crate) fn set_nonblocking(fd: &OwnedFd) -> bool {
    // SAFETY: plain calls on a descriptor we own; no memory passed.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        fl >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
    }
}

/// Whether `fd` is an eventfd (its `/proc` link names the kind of
/// anonymous inode): a client's descriptor, checked before the daemon
/// writes to it.
pub(crate) fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}
