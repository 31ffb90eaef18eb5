//! A LUN that survives its connection: [`RemoteDisk`] runs the remote port
//! state machine ([`crate::rport`]) over a [`Disk`], as Linux
//! `scsi_transport_srp` does over ib_srp.
//!
//! When the transport fails (the QP errors, the target logs out or goes
//! away), commands are held, a background thread logs in again at once and
//! then every `reconnect_delay`, and held commands are sent again on the
//! new session. After `fast_io_fail_tmo` they fail instead of waiting;
//! after `dev_loss_tmo` the port is given up. The device keeps its
//! identity: a reconnect that reaches a LUN with another NAA designator is
//! treated as a failed attempt, never as the same disk.
//!
//! A login attempt while the path's local port is DOWN fails at once (no
//! CM REQ goes into a dead link, see [`crate::session`]); a
//! [`PortWatch`] on that port starts the next attempt the moment the port
//! is ACTIVE again ([`Rport::port_active`]) rather than at the next
//! `reconnect_delay`, so a path is back within milliseconds of its link.
//!
//! Only transport failures are retried. A SCSI error (sense data) is the
//! caller's, unretried, as the seed asks. A write or UNMAP that was in
//! flight when the transport failed completes no earlier than the
//! [`crate::fence`] hold after the failure, however soon the retry ends.

use crate::disk::{Disk, DiskInfo};
use crate::fence::{Doubt, IN_DOUBT_HOLD};
use crate::rport::{IoVerdict, Rport, RportAction, RportConfig, RportState};
use crate::session::PortWatch;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Logs in and opens the LUN; called again for every reconnect.
pub type Open = Box<dyn Fn() -> io::Result<Disk> + Send + Sync>;

/// Counters and state, for `srp list`-like reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteStats {
    /// The port state now.
    pub state: RportState,
    /// Transport failures seen.
    pub failures: u64,
    /// Successful reconnects.
    pub reconnects: u64,
    /// Longest time from a failure to I/O flowing again.
    pub longest_outage: std::time::Duration,
}

struct State {
    disk: Option<Arc<Disk>>,
    /// Bumped on every new session, so one failure is counted once.
    generation: u64,
    rport: Rport,
    failed_at: Option<std::time::Instant>,
    longest_outage: std::time::Duration,
    stop: bool,
    /// The background thread is inside `open` (a login attempt).
    connecting: bool,
    /// How long a write in doubt holds its completion ([`crate::fence`]).
    in_doubt_hold: std::time::Duration,
}

struct Shared {
    open: Open,
    st: Mutex<State>,
    cv: Condvar,
    epoch: std::time::Instant,
    info: DiskInfo,
    /// Logical blocks now: the last session's capacity ([`RemoteDisk::recheck`]).
    blocks: std::sync::atomic::AtomicU64,
    /// PortActive of the path's local port (none when the provider could
    /// not open the CA a second time: attempts then wait reconnect_delay).
    _watch: Option<PortWatch>,
}

/// A LUN whose connection is restored behind the caller's back.
pub struct RemoteDisk {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

fn is_transport(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionAborted
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_micros(self.epoch.elapsed().as_micros() as u64)
    }

    /// The current disk, waiting while the port is blocked.
    fn current(&self) -> io::Result<(Arc<Disk>, u64)> {
        let mut st = self.lock();
        loop {
            // The background thread may be busy in a reconnect attempt:
            // feed due timers here too, so `fast_io_fail_tmo` is on time.
            let now = self.now();
            if st.rport.poll_timeout().is_some_and(|t| t <= now) {
                st.rport.handle_timeout(now);
                self.cv.notify_all();
            }
            match st.rport.io_verdict() {
                IoVerdict::Send => {
                    if let Some(d) = &st.disk {
                        return Ok((d.clone(), st.generation));
                    }
                }
                IoVerdict::Hold => {}
                IoVerdict::FailFast => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "SRP remote port failed (fast_io_fail_tmo passed); reconnecting",
                    ))
                }
                IoVerdict::Gone => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "SRP remote port lost (dev_loss_tmo passed)",
                    ))
                }
            }
            st = match st.rport.poll_timeout() {
                Some(at) => {
                    let wait = std::time::Duration::from_micros(
                        at.total_micros()
                            .saturating_sub(self.now().total_micros())
                            .max(1),
                    );
                    self.cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// The path's local port became ACTIVE.
    fn port_active(&self) {
        let mut st = self.lock();
        st.rport.port_active();
        self.cv.notify_all();
    }

    /// The session of `generation` failed.
    fn failed(&self, generation: u64) {
        let mut st = self.lock();
        if st.generation != generation || st.rport.state() != RportState::Running {
            return;
        }
        let now = self.now();
        st.rport.transport_failed(now);
        st.failed_at = Some(std::time::Instant::now());
        let old = st.disk.take();
        self.cv.notify_all();
        // The old session goes (if this was its last user) outside the
        // lock: `is_up` and new commands must not wait on its teardown.
        drop(st);
        drop(old);
    }

    /// The background thread: timers and reconnect attempts.
    fn run(&self) {
        let mut st = self.lock();
        while !st.stop {
            while let Some(action) = st.rport.poll_action() {
                match action {
                    RportAction::Reconnect => {
                        st.connecting = true;
                        drop(st);
                        let attempt = (self.open)().and_then(|d| {
                            // Same LUN or nothing: the device keeps its identity.
                            if d.info().naa != self.info.naa {
                                return Err(io::Error::other(format!(
                                    "reconnected to another LU (NAA {:?}, expected {:?})",
                                    d.info().naa,
                                    self.info.naa
                                )));
                            }
                            Ok(d)
                        });
                        st = self.lock();
                        st.connecting = false;
                        let ok = attempt.is_ok();
                        if let Ok(d) = attempt {
                            self.blocks
                                .store(d.blocks(), std::sync::atomic::Ordering::Relaxed);
                            st.disk = Some(Arc::new(d));
                            st.generation += 1;
                        }
                        let now = self.now();
                        st.rport.reconnect_done(now, ok);
                    }
                    RportAction::ResumeIo => {
                        if let Some(at) = st.failed_at.take() {
                            st.longest_outage = st.longest_outage.max(at.elapsed());
                        }
                    }
                    RportAction::BlockIo | RportAction::FailIo | RportAction::Remove => {}
                }
                self.cv.notify_all();
            }
            if st.stop {
                break;
            }
            st = match st.rport.poll_timeout() {
                Some(at) => {
                    let now = self.now();
                    let wait = std::time::Duration::from_micros(
                        at.total_micros().saturating_sub(now.total_micros()),
                    );
                    let (mut st, _) = self
                        .cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner());
                    let now = self.now();
                    st.rport.handle_timeout(now);
                    st
                }
                None => {
                    // Path checker: an idle session can end (the target
                    // logged it out, the port went down) with no I/O to
                    // notice; look every CHECK_INTERVAL.
                    let (mut st, _) = self
                        .cv
                        .wait_timeout(st, CHECK_INTERVAL)
                        .unwrap_or_else(|e| e.into_inner());
                    let dead = st.rport.state() == RportState::Running
                        && st.disk.as_ref().is_some_and(|d| d.any_channel_closed());
                    if dead {
                        let generation = st.generation;
                        drop(st);
                        self.failed(generation);
                        st = self.lock();
                    }
                    st
                }
            };
        }
    }
}

/// How often a running port's session is checked for having ended.
const CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl RemoteDisk {
    /// Opens the LUN with `open` and keeps it open under `cfg`'s timers.
    ///
    /// # Errors
    /// The first `open` failing, or timers Linux would refuse.
    pub fn open(open: Open, cfg: RportConfig) -> io::Result<RemoteDisk> {
        let rport = Rport::new(cfg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let disk = open()?;
        let info = disk.info().clone();
        let shared = Arc::new_cyclic(|me: &std::sync::Weak<Shared>| {
            let me = me.clone();
            let watch = disk
                .session()
                .watch_port(Box::new(move || {
                    if let Some(s) = me.upgrade() {
                        s.port_active();
                    }
                }))
                .ok();
            Shared {
                open,
                st: Mutex::new(State {
                    disk: Some(Arc::new(disk)),
                    generation: 0,
                    rport,
                    failed_at: None,
                    longest_outage: std::time::Duration::ZERO,
                    stop: false,
                    connecting: false,
                    in_doubt_hold: IN_DOUBT_HOLD,
                }),
                cv: Condvar::new(),
                epoch: std::time::Instant::now(),
                blocks: std::sync::atomic::AtomicU64::new(info.blocks),
                info,
                _watch: watch,
            }
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("srp-rport".into())
            .spawn(move || s.run())?;
        Ok(RemoteDisk {
            shared,
            thread: Some(thread),
        })
    }

    /// What the LUN said when first opened.
    pub fn info(&self) -> &DiskInfo {
        &self.shared.info
    }

    /// Logical blocks now (what the target said last; [`RemoteDisk::info`]
    /// keeps what it said at open).
    pub fn blocks(&self) -> u64 {
        // The current disk follows capacity changes its own I/O meets.
        if let Some(d) = &self.shared.lock().disk {
            let b = d.blocks();
            self.shared
                .blocks
                .store(b, std::sync::atomic::Ordering::Relaxed);
            return b;
        }
        self.shared
            .blocks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Looks at the LU again ([`Disk::recheck`], over a reconnect if
    /// need be); returns the blocks now.
    ///
    /// # Errors
    /// As [`Disk::recheck`]: `NotFound` when the LUN is another LU now.
    pub fn recheck(&self) -> io::Result<u64> {
        let blocks = self.io(|d| d.recheck()).0?;
        self.shared
            .blocks
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
        Ok(blocks)
    }

    /// State and counters.
    pub fn stats(&self) -> RemoteStats {
        let st = self.shared.lock();
        RemoteStats {
            state: st.rport.state(),
            failures: st.rport.failures(),
            reconnects: st.rport.reconnects(),
            longest_outage: st.longest_outage,
        }
    }

    /// Waits up to `timeout` for the port to be running (I/O flowing).
    pub fn wait_running(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if st.rport.state() == RportState::Running && st.disk.is_some() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// How long a write or UNMAP in doubt holds its completion
    /// ([`crate::fence`]; [`IN_DOUBT_HOLD`] unless set).
    pub fn set_in_doubt_hold(&self, hold: std::time::Duration) {
        self.shared.lock().in_doubt_hold = hold;
    }

    /// REPORT TARGET PORT GROUPS on the current session (waiting for a
    /// reconnect as any command does).
    ///
    /// # Errors
    /// As [`Disk::report_target_port_groups`].
    pub fn report_target_port_groups(&self) -> io::Result<Vec<scsi::alua::ReportedGroup>> {
        self.io(|d| d.report_target_port_groups()).0
    }

    /// A number that changes when the current session met an ASYMMETRIC
    /// ACCESS STATE CHANGED unit attention, or the session was replaced
    /// by a reconnect (which may have crossed a change unseen).
    pub fn alua_changes(&self) -> u64 {
        let st = self.shared.lock();
        let seen = st.disk.as_ref().map_or(0, |d| d.alua_changes());
        (st.generation << 32).wrapping_add(seen)
    }

    /// Runs `f` on the current session's disk; on a transport failure,
    /// waits for the reconnect and runs it again. Beside the result: the
    /// doubt an attempt left, for the caller to settle.
    pub(crate) fn io<T>(&self, f: impl Fn(&Disk) -> io::Result<T>) -> (io::Result<T>, Doubt) {
        let mut doubt = Doubt::NONE;
        loop {
            let (disk, generation) = match self.shared.current() {
                Ok(current) => current,
                Err(e) => return (Err(e), doubt),
            };
            match f(&disk) {
                Err(e) if is_transport(&e) => {
                    doubt.note(&e);
                    self.shared.failed(generation);
                }
                other => return (other, doubt),
            }
        }
    }

    /// Waits out an operation's doubt, then gives its result.
    fn settled<T>(&self, (r, doubt): (io::Result<T>, Doubt)) -> io::Result<T> {
        // The port lock only when there is a doubt: not on every write.
        if doubt != Doubt::NONE {
            let hold = self.shared.lock().in_doubt_hold;
            doubt.settle(hold);
        }
        r
    }
}

impl Drop for RemoteDisk {
    /// Stops the background thread. One inside a login attempt is not
    /// waited for (that can take the connector's whole timeout): it ends
    /// by itself when the attempt returns, and its new session, if any,
    /// is closed then.
    fn drop(&mut self) {
        let connecting = {
            let mut st = self.shared.lock();
            st.stop = true;
            st.connecting
        };
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            if !connecting {
                let _ = t.join();
            }
        }
    }
}

impl blockload::BlockDevice for RemoteDisk {
    fn block_size(&self) -> u32 {
        self.shared.info.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        // One buffer across attempts: a failed attempt may have filled
        // part of it; the retry overwrites all of it.
        let cell = std::sync::Mutex::new(buf);
        self.io(|d| {
            let mut b = cell.lock().unwrap_or_else(|e| e.into_inner());
            d.read(lba, &mut b)
        })
        .0
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.settled(self.io(|d| d.write(lba, buf)))
    }
    fn flush(&self) -> io::Result<()> {
        self.io(|d| d.flush()).0
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        self.settled(self.io(|d| d.unmap(lba, blocks)))
    }
}
