//! SIGTERM, SIGINT and SIGHUP for the daemons, taken synchronously: block them in
//! every thread, then wait for one in the main thread (no handler runs in
//! signal context).

/// The blocked termination signals.
pub struct TermSignals(libc::sigset_t);

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and in every thread it creates
/// afterwards: call it before starting threads.
pub fn block_term() -> TermSignals {
    // SAFETY: the set is initialised by sigemptyset before use; the mask
    // change affects this thread and threads created afterwards.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        TermSignals(set)
    }
}

impl TermSignals {
    /// Waits for SIGTERM, SIGINT or SIGHUP; returns its number.
    pub fn wait(&self) -> i32 {
        let mut sig = 0;
        // SAFETY: the set was initialised by block_term; sig is a valid out
        // pointer.
        unsafe { libc::sigwait(&self.0, &mut sig) };
        sig
    }

    /// Waits at most `d` for SIGTERM, SIGINT or SIGHUP; returns its number,
    /// or `None` when the time ran out first.
    pub fn wait_timeout(&self, d: std::time::Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the set was initialised by block_term; a null info
        // pointer is allowed; ts is a valid timespec.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}
