//! What the whole process spent over a stretch of time, from
//! `getrusage(RUSAGE_SELF)`: every thread counts (the target's, the
//! initiator's, the provider's, the workload's), and so do threads that
//! ended within the stretch, since the kernel folds an exiting thread's
//! counters into its process's. `srpstack bench` takes the difference over
//! its timed window and divides it by the I/Os done in it.
//!
//! What it cannot say: system calls (the kernel keeps no count of them per
//! process; `bench/cost` counts them with `perf stat -e
//! raw_syscalls:sys_enter`) and instructions (`bench/cost`, under
//! callgrind).

use serde::Serialize;
use std::time::Duration;

/// The process's counters at one moment, or what it spent between two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// CPU time in user mode, all threads.
    pub user: Duration,
    /// CPU time in the kernel on the process's behalf, all threads.
    pub system: Duration,
    /// Context switches because a thread waited (a futex, a socket, a
    /// sleep): `ru_nvcsw`.
    pub voluntary_switches: u64,
    /// Context switches because a thread was preempted (its slice ended,
    /// or another thread had to run): `ru_nivcsw`.
    pub involuntary_switches: u64,
}

impl Usage {
    /// The counters now.
    ///
    /// # Errors
    ///
    /// What `getrusage` answers; with `RUSAGE_SELF` and a valid buffer it
    /// has no reason to fail.
    pub fn now() -> std::io::Result<Usage> {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `ru` is a writable `rusage` the kernel fills in whole on
        // success; it is read only then.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getrusage succeeded, so `ru` is initialised (and it was
        // zeroed before).
        let ru = unsafe { ru.assume_init() };
        let time = |t: libc::timeval| {
            Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000)
        };
        Ok(Usage {
            user: time(ru.ru_utime),
            system: time(ru.ru_stime),
            voluntary_switches: ru.ru_nvcsw.max(0) as u64,
            involuntary_switches: ru.ru_nivcsw.max(0) as u64,
        })
    }

    /// What was spent from `earlier` to `self`.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
        }
    }

    /// This stretch's spending per I/O; `None` when no I/O was done.
    pub fn per_io(&self, ios: u64) -> Option<PerIo> {
        if ios == 0 {
            return None;
        }
        let n = ios as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
        Some(PerIo {
            context_switches: (self.voluntary_switches + self.involuntary_switches) as f64 / n,
            voluntary_switches: self.voluntary_switches as f64 / n,
            involuntary_switches: self.involuntary_switches as f64 / n,
            cpu_us: us(self.user + self.system),
            user_us: us(self.user),
            system_us: us(self.system),
        })
    }
}

/// A stretch's [`Usage`] divided by the I/Os done in it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PerIo {
    /// Voluntary and involuntary together.
    pub context_switches: f64,
    /// [`Usage::voluntary_switches`] per I/O.
    pub voluntary_switches: f64,
    /// [`Usage::involuntary_switches`] per I/O.
    pub involuntary_switches: f64,
    /// CPU time, user and system, microseconds.
    pub cpu_us: f64,
    /// User-mode CPU time, microseconds.
    pub user_us: f64,
    /// Kernel CPU time, microseconds.
    pub system_us: f64,
}

impl std::fmt::Display for PerIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} context switches ({:.2} voluntary, {:.2} involuntary), {:.1} us CPU ({:.1} user, {:.1} system)",
            self.context_switches,
            self.voluntary_switches,
            self.involuntary_switches,
            self.cpu_us,
            self.user_us,
            self.system_us
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_waits_and_ends_still_counts() {
        let before = Usage::now().unwrap();
        // A thread that sleeps twice (two voluntary switches at least) and
        // has ended before the second sample.
        std::thread::spawn(|| {
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .join()
        .unwrap();
        let spent = Usage::now().unwrap().since(&before);
        assert!(spent.voluntary_switches >= 2, "{spent:?}");
        let p = spent.per_io(2).unwrap();
        assert!(p.voluntary_switches >= 1.0, "{p:?}");
        assert_eq!(
            p.context_switches,
            p.voluntary_switches + p.involuntary_switches
        );
        assert!(spent.per_io(0).is_none());
    }

    #[test]
    fn since_never_goes_below_zero() {
        let later = Usage::default();
        let earlier = Usage {
            voluntary_switches: 5,
            user: Duration::from_millis(3),
            ..Usage::default()
        };
        assert_eq!(later.since(&earlier), Usage::default());
    }
}
