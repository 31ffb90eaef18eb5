//! SIGTERM, SIGINT and SIGHUP for the daemons, taken synchronously: block them in
//! every thread, then wait for one in the main thread (no handler runs in
//! signal context). A tool at work hands them to a thread of their own
//! instead ([`TermSignals::watch`]): its work stops on a flag, and the
//! thread bounds how long stopping may take.

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

/// How long a tool may take to stop after an interrupt before
/// [`TermSignals::watch`] ends it: so that it is gone within a second.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(750);

/// A signal's name for messages: `SIGINT`, `SIGTERM`, `SIGHUP`, or its
/// number.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}

/// The exit status a shell gives a process that `sig` ended: 128 + its
/// number (130 for SIGINT, 143 for SIGTERM).
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(128 + sig.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// The first termination signal a [`TermSignals::watch`] thread took, for
/// the tool's exit status ([`exit_status`]); `None` before any.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

static CAUGHT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// An interrupt of a tool at work, taken by a thread of its own
/// ([`TermSignals::watch`]): a flag the work polls, and a wait for it.
#[derive(Clone)]
pub struct Interrupt(std::sync::Arc<Noticed>);

struct Noticed {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sig: std::sync::Mutex<Option<i32>>,
    cv: std::sync::Condvar,
}

impl Interrupt {
    /// Set once a signal came: the work stops, reports and logs out.
    pub fn flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.0.stop.clone()
    }

    /// The signal that came, if one did.
    pub fn signal(&self) -> Option<i32> {
        *self.0.sig.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the signal; returns its number.
    pub fn wait(&self) -> i32 {
        let mut sig = self.0.sig.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(s) = *sig {
                return s;
            }
            sig = self.0.cv.wait(sig).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl TermSignals {
    /// Hands the blocked signals to a thread of their own. The first one
    /// sets the [`Interrupt`] (and [`caught`]); the tool then stops its
    /// work, prints what it did and logs out. Should that take longer than
    /// `grace` (I/O or a logout waiting on a peer that no longer
    /// answers), or should a second signal come, the thread ends the
    /// process at once with [`exit_status`], saying why on standard error
    /// as `who`: an interrupt never waits on the network longer than
    /// `grace`.
    pub fn watch(self, who: &'static str, grace: std::time::Duration) -> Interrupt {
        let noticed = std::sync::Arc::new(Noticed {
            stop: Default::default(),
            sig: std::sync::Mutex::new(None),
            cv: std::sync::Condvar::new(),
        });
        let n = noticed.clone();
        let watcher = move || {
            let sig = self.wait();
            CAUGHT.store(sig, std::sync::atomic::Ordering::SeqCst);
            n.stop.store(true, std::sync::atomic::Ordering::SeqCst);
            *n.sig.lock().unwrap_or_else(|e| e.into_inner()) = Some(sig);
            n.cv.notify_all();
            let why = match self.wait_timeout(grace) {
                Some(again) => format!("{} again: exiting at once", name(again)),
                None => format!(
                    "still stopping {} ms after {}: I/O or a logout is waiting on a peer that does not answer; exiting without them",
                    grace.as_millis(),
                    name(sig)
                ),
            };
            eprintln!("{who}: {why}");
            std::process::exit(exit_status(sig).into());
        };
        // Without the thread the signals stay blocked: the tool runs on
        // as if none came, which is all it could do anyway.
        let _ = std::thread::Builder::new()
            .name("signals".into())
            .spawn(watcher);
        Interrupt(noticed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_exit_statuses_as_a_shell_gives_them() {
        assert_eq!(name(libc::SIGINT), "SIGINT");
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(99), "signal 99");
        assert_eq!(exit_status(libc::SIGINT), 130);
        assert_eq!(exit_status(libc::SIGTERM), 143);
        assert_eq!(exit_status(-5), 128);
        assert_eq!(exit_status(1000), 255);
    }
}
