//! Several paths to one logical unit as one block device, as dm-multipath
//! does over Linux SRP.
//!
//! A path is anything that reaches the LU and can say whether it is up
//! ([`PathDevice`]); in practice a [`RemoteDisk`] whose remote port fails
//! I/O fast (`fast_io_fail_tmo` 0) and reconnects in the background. Paths
//! are grouped by the LU's device identifier (the NAA designator of VPD
//! page 0x83): [`Multipath::new`] refuses paths to different LUs or of a
//! different size.
//!
//! Policies: [`Policy::Failover`] sends everything down the first path that
//! is up, in the order given (a priority list); [`Policy::RoundRobin`]
//! rotates over the paths that are up. An I/O that fails on a path with a
//! transport error (`ConnectionAborted`, `NotConnected`) is sent again on
//! another path without the caller seeing the error; when no path is up it
//! waits for one to come back (dm-multipath's `queue_if_no_path`) for at
//! most `no_path_timeout`. A SCSI error (sense data, any other error kind)
//! is the caller's, unretried.
//!
//! A retried write is the same write again, so sending it twice is
//! harmless as long as nothing else writes that block meanwhile: the
//! contract of any block device whose caller has not seen the write
//! complete.
//!
//! ALUA (SPC-4 5.16), as dm-multipath's `prio alua` with Linux's
//! `scsi_dh_alua`: when the LU reports target port groups (INQUIRY TPGS,
//! the group of each path's port in VPD 0x83), the device reads their
//! states with REPORT TARGET PORT GROUPS at the first I/O, again whenever
//! a path's commands met ASYMMETRIC ACCESS STATE CHANGED (2A/06) or a
//! path reconnected, and whenever a port refused a command for its state.
//! I/O goes to the paths of active/optimized groups (and paths that
//! report no group); to active/non-optimized ones only when no optimized
//! path is up; never to standby, unavailable or transitioning ones. A
//! command a port refused for its state (NOT READY 04/0Ah, 04/0Bh,
//! 04/0Ch) did not run: it goes to the next path, or, when no path is in
//! an active group (a transition under way), is sent again every
//! [`ALUA_RETRY`] with the states read again, until `no_path_timeout`.
//!
//! When a path fails, every I/O on it is sent elsewhere at once, as
//! dm-multipath's fail_path and requeue: the session fails all its
//! outstanding commands (`TransportFailed`) the moment its QP errors or
//! its port goes down, and tears the dead connection down on a thread of
//! its own, so no I/O waits for a DREQ over a dead link. A command that
//! was in flight then is in doubt: an old copy of it may still reach the
//! old target (a retransmission the sending host held while it could not
//! resolve the far end, sent when the link answers again) and run there
//! after the retry. So a write or UNMAP in doubt, although retried at
//! once, completes to the caller only after the [`crate::fence`] hold;
//! only then may the caller write the block again, and by then no old
//! copy is left to land over the newer data. Reads are not held.

use crate::disk::alua_refusal;
use crate::fence::{Doubt, IN_DOUBT_HOLD};
use crate::remote::RemoteDisk;
use crate::rport::RportState;
use blockload::BlockDevice;
use scsi::alua::ReportedGroup;
use scsi::AccessState;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One way to reach a logical unit.
pub trait PathDevice: BlockDevice {
    /// The LU's device identifier (NAA designator), if it reported one.
    fn device_id(&self) -> Option<String>;
    /// Whether I/O sent now would go out (the path is connected).
    fn is_up(&self) -> bool;
    /// Waits up to `timeout` for the path to come up.
    fn wait_up(&self, timeout: Duration) -> bool;
    /// `write_at`, except that an attempt left in doubt
    /// ([`crate::fence`]) is not waited out here: its doubt comes back
    /// beside the result, for the caller to settle once it is done with
    /// all its paths.
    fn write_unsettled(&self, lba: u64, buf: &[u8]) -> (io::Result<()>, Doubt) {
        unsettled(self.write_at(lba, buf))
    }
    /// `unmap`, with its doubt as for [`PathDevice::write_unsettled`].
    fn unmap_unsettled(&self, lba: u64, blocks: u64) -> (io::Result<()>, Doubt) {
        unsettled(self.unmap(lba, blocks))
    }
    /// The target port group of the path's target port, when the LU
    /// reports ALUA (INQUIRY TPGS, VPD 0x83); `None`: no ALUA here.
    fn target_port_group(&self) -> Option<u16> {
        None
    }
    /// A number that changes when the path's commands met ASYMMETRIC
    /// ACCESS STATE CHANGED, or its session was replaced.
    fn alua_changes(&self) -> u64 {
        0
    }
    /// REPORT TARGET PORT GROUPS through this path.
    fn report_target_port_groups(&self) -> io::Result<Vec<ReportedGroup>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this path does not report target port groups",
        ))
    }
}

/// A result with the doubt its error carries.
fn unsettled(r: io::Result<()>) -> (io::Result<()>, Doubt) {
    let mut doubt = Doubt::NONE;
    if let Err(e) = &r {
        doubt.note(e);
    }
    (r, doubt)
}

impl PathDevice for RemoteDisk {
    fn device_id(&self) -> Option<String> {
        self.info().naa.clone()
    }
    fn is_up(&self) -> bool {
        self.stats().state == RportState::Running
    }
    fn wait_up(&self, timeout: Duration) -> bool {
        self.wait_running(timeout)
    }
    fn write_unsettled(&self, lba: u64, buf: &[u8]) -> (io::Result<()>, Doubt) {
        self.io(|d| d.write(lba, buf))
    }
    fn unmap_unsettled(&self, lba: u64, blocks: u64) -> (io::Result<()>, Doubt) {
        self.io(|d| d.unmap(lba, blocks))
    }
    fn target_port_group(&self) -> Option<u16> {
        self.info().alua.and_then(|a| a.group)
    }
    fn alua_changes(&self) -> u64 {
        RemoteDisk::alua_changes(self)
    }
    fn report_target_port_groups(&self) -> io::Result<Vec<ReportedGroup>> {
        RemoteDisk::report_target_port_groups(self)
    }
}

/// How long I/O waits before it is sent again when no path is in an
/// active target port group (a transition under way), the states read
/// again each time.
pub const ALUA_RETRY: Duration = Duration::from_millis(100);

/// A path's ALUA state not known (or no ALUA): the path is used.
const STATE_UNKNOWN: u8 = 0xff;

/// How I/O is spread over the paths that are up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Everything on the first path that is up (priority order).
    Failover,
    /// Each I/O on the next path that is up.
    RoundRobin,
}

/// A path policy name other than failover, round-robin (or rr).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path policy `{0}` is not one of failover, round-robin")]
pub struct PolicyError(pub String);

impl std::str::FromStr for Policy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Policy, PolicyError> {
        match s {
            "failover" => Ok(Policy::Failover),
            "round-robin" | "rr" => Ok(Policy::RoundRobin),
            _ => Err(PolicyError(s.to_string())),
        }
    }
}

/// A path's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStats {
    /// The name the path was given.
    pub name: String,
    /// Up now.
    pub up: bool,
    /// I/Os completed on it.
    pub ios: u64,
    /// I/Os that failed on it with a transport error (and went elsewhere).
    pub failures: u64,
    /// Its target port group's asymmetric access state as last read
    /// (`None`: no ALUA, or not read yet; `Some("offline")` and the like
    /// for states read as a code [`AccessState`] does not name).
    pub alua: Option<String>,
    /// Commands its port refused for the group's state.
    pub refusals: u64,
}

/// A failed-over I/O: it failed on one path and completed on another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// The path it first failed on.
    pub from: String,
    /// The path it completed on.
    pub to: String,
    /// When it first failed.
    pub failed_at: Instant,
    /// When it completed.
    pub done_at: Instant,
}

/// Failovers kept for [`Multipath::failovers`].
const KEEP_FAILOVERS: usize = 64;

struct Slot {
    name: String,
    dev: Arc<dyn PathDevice>,
    ios: AtomicU64,
    failures: AtomicU64,
    refusals: AtomicU64,
    /// Its group's ASYMMETRIC ACCESS STATE code, or [`STATE_UNKNOWN`].
    alua_state: AtomicU8,
    /// [`PathDevice::alua_changes`] when the states were last read.
    alua_seen: AtomicU64,
}

impl Slot {
    /// Where the path stands for I/O: 0 active/optimized (or no ALUA),
    /// 1 active/non-optimized, `None` not to be used.
    fn rank(&self) -> Option<u8> {
        match self.alua_state.load(Ordering::Relaxed) {
            STATE_UNKNOWN => Some(0),
            code => match AccessState::from_code(code) {
                Some(AccessState::ActiveOptimized) => Some(0),
                Some(AccessState::ActiveNonOptimized) => Some(1),
                _ => None,
            },
        }
    }

    fn alua_name(&self) -> Option<String> {
        match self.alua_state.load(Ordering::Relaxed) {
            STATE_UNKNOWN => None,
            code => Some(match AccessState::from_code(code) {
                Some(s) => s.name().to_string(),
                None if code == 0xe => "offline".into(),
                None => format!("state {code:#x}"),
            }),
        }
    }
}

/// One LU reached over several paths.
pub struct Multipath {
    paths: Vec<Slot>,
    policy: Policy,
    no_path_timeout: Duration,
    next: AtomicUsize,
    id: String,
    block_size: u32,
    blocks: u64,
    failovers: Mutex<std::collections::VecDeque<Failover>>,
    in_doubt_hold: Duration,
    /// Some path reports a target port group.
    alua: bool,
    /// The states must be read again (first I/O, a refusal).
    alua_stale: AtomicBool,
    /// One reader of the states at a time.
    alua_reading: Mutex<()>,
}

/// Transport errors: the path failed, not the command.
fn is_path_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::NotConnected
    )
}

impl Multipath {
    /// Groups `paths` (name, device) into one device.
    ///
    /// # Errors
    /// No paths, a path without a device identifier, or paths that reach
    /// different LUs (identifier, block size or capacity differ).
    pub fn new(
        paths: Vec<NamedPath>,
        policy: Policy,
        no_path_timeout: Duration,
    ) -> io::Result<Multipath> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let (first_name, first) = paths
            .first()
            .ok_or_else(|| invalid("a multipath device needs at least one path".into()))?;
        let id = first.device_id().ok_or_else(|| {
            invalid(format!(
                "path {first_name}: the LU reports no NAA device identifier (VPD 0x83), so paths cannot be grouped"
            ))
        })?;
        let (block_size, blocks) = (first.block_size(), first.num_blocks());
        for (name, dev) in &paths[1..] {
            match dev.device_id() {
                Some(other) if other == id => {}
                other => {
                    return Err(invalid(format!(
                        "path {name} reaches LU {}, not {id} like path {first_name}",
                        other.as_deref().unwrap_or("(no identifier)")
                    )))
                }
            }
            if (dev.block_size(), dev.num_blocks()) != (block_size, blocks) {
                return Err(invalid(format!(
                    "path {name} sees {} blocks of {} B, path {first_name} {blocks} of {block_size} B",
                    dev.num_blocks(),
                    dev.block_size()
                )));
            }
        }
        let alua = paths.iter().any(|(_, d)| d.target_port_group().is_some());
        Ok(Multipath {
            paths: paths
                .into_iter()
                .map(|(name, dev)| Slot {
                    name,
                    dev,
                    ios: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    refusals: AtomicU64::new(0),
                    alua_state: AtomicU8::new(STATE_UNKNOWN),
                    alua_seen: AtomicU64::new(0),
                })
                .collect(),
            policy,
            no_path_timeout,
            next: AtomicUsize::new(0),
            id,
            block_size,
            blocks,
            failovers: Mutex::new(std::collections::VecDeque::new()),
            in_doubt_hold: IN_DOUBT_HOLD,
            alua,
            alua_stale: AtomicBool::new(alua),
            alua_reading: Mutex::new(()),
        })
    }

    /// How long a write or UNMAP in doubt on a failed path holds its
    /// completion ([`crate::fence`]; [`IN_DOUBT_HOLD`] unless set).
    pub fn with_in_doubt_hold(mut self, hold: Duration) -> Multipath {
        self.in_doubt_hold = hold;
        self
    }

    /// The LU's device identifier.
    pub fn device_id(&self) -> &str {
        &self.id
    }

    /// Per-path counters, in path order.
    pub fn path_stats(&self) -> Vec<PathStats> {
        self.paths
            .iter()
            .map(|p| PathStats {
                name: p.name.clone(),
                up: p.dev.is_up(),
                ios: p.ios.load(Ordering::Relaxed),
                failures: p.failures.load(Ordering::Relaxed),
                alua: p.alua_name(),
                refusals: p.refusals.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Reads the target port groups' states again if a path met a state
    /// change (or reconnected) since, or a refusal made them stale: REPORT
    /// TARGET PORT GROUPS through the first path that is up and answers.
    /// Another thread reading them meanwhile is not waited for.
    fn refresh_alua(&self) {
        if !self.alua {
            return;
        }
        let moved = self
            .paths
            .iter()
            .any(|p| p.dev.alua_changes() != p.alua_seen.load(Ordering::Relaxed));
        if !moved && !self.alua_stale.load(Ordering::Relaxed) {
            return;
        }
        let Ok(_reading) = self.alua_reading.try_lock() else {
            return;
        };
        // Noted before asking: a change during the question asks again.
        for p in &self.paths {
            p.alua_seen.store(p.dev.alua_changes(), Ordering::Relaxed);
        }
        self.alua_stale.store(false, Ordering::Relaxed);
        for asked in self.paths.iter().filter(|p| p.dev.is_up()) {
            let Ok(groups) = asked.dev.report_target_port_groups() else {
                continue;
            };
            for p in &self.paths {
                let code = p
                    .dev
                    .target_port_group()
                    .and_then(|g| groups.iter().find(|r| r.id == g))
                    .map_or(STATE_UNKNOWN, |r| r.state_code);
                let was = p.alua_state.swap(code, Ordering::Relaxed);
                if was != code {
                    tracing::debug!(
                        lu = %self.id,
                        path = %p.name,
                        state = p.alua_name().as_deref().unwrap_or("unknown"),
                        "target port group state"
                    );
                }
            }
            return;
        }
        self.alua_stale.store(true, Ordering::Relaxed);
    }

    /// The paths one I/O tries, in order: those that are up in the best
    /// rank present first (active/optimized or no ALUA, then
    /// active/non-optimized), each rank in the policy's order.
    fn candidates(&self) -> Vec<usize> {
        let order: Vec<usize> = self.order().collect();
        let mut out = Vec::with_capacity(order.len());
        for rank in 0..=1 {
            out.extend(
                order
                    .iter()
                    .copied()
                    .filter(|&i| self.paths[i].rank() == Some(rank) && self.paths[i].dev.is_up()),
            );
        }
        out
    }

    /// The paths and their states, for an error.
    fn states(&self) -> String {
        let list: Vec<String> = self
            .paths
            .iter()
            .map(|p| {
                let up = if p.dev.is_up() { "up" } else { "down" };
                match p.alua_name() {
                    Some(s) => format!("{} {up}, {s}", p.name),
                    None => format!("{} {up}", p.name),
                }
            })
            .collect();
        list.join("; ")
    }

    /// The latest failed-over I/Os (at most 64), oldest first: a
    /// failover long after the first ones still shows.
    pub fn failovers(&self) -> Vec<Failover> {
        let log = self.failovers.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect()
    }

    /// Path indices in the order this I/O should try them.
    fn order(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.paths.len();
        let start = match self.policy {
            Policy::Failover => 0,
            Policy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        (0..n).map(move |k| (start + k) % n)
    }

    /// Runs `f` on the paths in order until one takes it; beside the
    /// result, the doubt its failed attempts left.
    fn io<T>(
        &self,
        f: impl Fn(&dyn PathDevice) -> (io::Result<T>, Doubt),
    ) -> (io::Result<T>, Doubt) {
        let mut doubt = Doubt::NONE;
        let start = Instant::now();
        let mut first_failure: Option<(usize, Instant)> = None;
        let mut last_error = None;
        loop {
            self.refresh_alua();
            for i in self.candidates() {
                let p = &self.paths[i];
                let (r, d) = f(p.dev.as_ref());
                doubt.merge(d);
                match r {
                    Ok(v) => {
                        p.ios.fetch_add(1, Ordering::Relaxed);
                        if let Some((from, failed_at)) = first_failure {
                            let mut log = self.failovers.lock().unwrap_or_else(|e| e.into_inner());
                            if log.len() == KEEP_FAILOVERS {
                                log.pop_front();
                            }
                            log.push_back(Failover {
                                from: self.paths[from].name.clone(),
                                to: p.name.clone(),
                                failed_at,
                                done_at: Instant::now(),
                            });
                        }
                        return (Ok(v), doubt);
                    }
                    Err(e) => {
                        if let Some(refusal) = alua_refusal(&e) {
                            // Not run: the port's group is not active
                            // (any more). Next path; the states are read
                            // again before the next try.
                            p.alua_state.store(refusal.state.code(), Ordering::Relaxed);
                            p.refusals.fetch_add(1, Ordering::Relaxed);
                            self.alua_stale.store(true, Ordering::Relaxed);
                            first_failure.get_or_insert((i, Instant::now()));
                            last_error = Some(e);
                        } else if is_path_error(&e) {
                            p.failures.fetch_add(1, Ordering::Relaxed);
                            first_failure.get_or_insert((i, Instant::now()));
                            last_error = Some(e);
                        } else {
                            return (Err(e), doubt);
                        }
                    }
                }
            }
            // No path took it.
            let left = self.no_path_timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                let e = io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!(
                        "no path to LU {} for {:?} ({}){}",
                        self.id,
                        self.no_path_timeout,
                        self.states(),
                        last_error
                            .as_ref()
                            .map(|e| format!("; last error: {e}"))
                            .unwrap_or_default()
                    ),
                );
                return (Err(e), doubt);
            }
            if self.alua && self.paths.iter().any(|p| p.dev.is_up()) {
                // Paths are up but none in an active group: a transition
                // (or a failover between groups) under way. Ask again
                // after a while, as scsi_dh_alua does.
                self.alua_stale.store(true, Ordering::Relaxed);
                std::thread::sleep(left.min(ALUA_RETRY));
                continue;
            }
            // Wait for a path to come back.
            let slice = left.min(Duration::from_millis(20));
            let _ = self.paths.iter().any(|p| p.dev.wait_up(slice));
        }
    }
}

impl BlockDevice for Multipath {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        // One buffer across attempts; a failed attempt may have filled part
        // of it, the retry overwrites all of it.
        let cell = Mutex::new(buf);
        self.io(|d| {
            let mut b = cell.lock().unwrap_or_else(|e| e.into_inner());
            (d.read_at(lba, &mut b), Doubt::NONE)
        })
        .0
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let (r, doubt) = self.io(|d| d.write_unsettled(lba, buf));
        doubt.settle(self.in_doubt_hold);
        r
    }
    fn flush(&self) -> io::Result<()> {
        self.io(|d| (d.flush(), Doubt::NONE)).0
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        let (r, doubt) = self.io(|d| d.unmap_unsettled(lba, blocks));
        doubt.settle(self.in_doubt_hold);
        r
    }
}

/// A path with its name.
pub type NamedPath = (String, Arc<dyn PathDevice>);

/// Groups paths by the LU they reach (device identifier), keeping the
/// order in which each LU was first seen; the names of paths without an
/// identifier are returned apart.
pub fn group_by_device(paths: Vec<NamedPath>) -> (Vec<Vec<NamedPath>>, Vec<String>) {
    let mut groups: Vec<(String, Vec<NamedPath>)> = Vec::new();
    let mut loose = Vec::new();
    for (name, dev) in paths {
        match dev.device_id() {
            Some(id) => match groups.iter_mut().find(|(g, _)| *g == id) {
                Some((_, v)) => v.push((name, dev)),
                None => groups.push((id, vec![(name, dev)])),
            },
            None => loose.push(name),
        }
    }
    (groups.into_iter().map(|(_, v)| v).collect(), loose)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockload::RamDevice;
    use std::sync::atomic::AtomicBool;

    /// A path over a shared RAM LU that can be cut: while down, I/O fails
    /// with `ConnectionAborted`.
    struct TestPath {
        lu: Arc<RamDevice>,
        id: Option<String>,
        up: AtomicBool,
        /// Fail this many more I/Os with a medium error.
        medium_errors: AtomicU64,
    }

    impl TestPath {
        fn new(lu: &Arc<RamDevice>, id: &str) -> Arc<TestPath> {
            Arc::new(TestPath {
                lu: lu.clone(),
                id: Some(id.into()),
                up: AtomicBool::new(true),
                medium_errors: AtomicU64::new(0),
            })
        }
        fn check(&self) -> io::Result<()> {
            if !self.up.load(Ordering::SeqCst) {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "cut"));
            }
            if self
                .medium_errors
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(io::Error::other("MEDIUM ERROR"));
            }
            Ok(())
        }
    }

    impl BlockDevice for TestPath {
        fn block_size(&self) -> u32 {
            self.lu.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.lu.num_blocks()
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
            self.check()?;
            self.lu.read_at(lba, buf)
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
            self.check()?;
            self.lu.write_at(lba, buf)
        }
    }

    impl PathDevice for TestPath {
        fn device_id(&self) -> Option<String> {
            self.id.clone()
        }
        fn is_up(&self) -> bool {
            self.up.load(Ordering::SeqCst)
        }
        fn wait_up(&self, timeout: Duration) -> bool {
            // Tests flip `up` from the same thread before waiting; no
            // other thread brings a path back here.
            let _ = timeout;
            self.is_up()
        }
    }

    /// The paths named p0, p1, ...
    fn named(paths: &[&Arc<TestPath>]) -> Vec<NamedPath> {
        paths
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("p{i}"), (*p).clone() as Arc<dyn PathDevice>))
            .collect()
    }

    fn mp(paths: &[&Arc<TestPath>], policy: Policy) -> Multipath {
        Multipath::new(named(paths), policy, Duration::from_millis(100)).unwrap()
    }

    #[test]
    fn round_robin_spreads_and_a_cut_path_is_skipped_without_errors() {
        let lu = Arc::new(RamDevice::new(512, 64));
        let (a, b) = (TestPath::new(&lu, "naa1"), TestPath::new(&lu, "naa1"));
        let m = mp(&[&a, &b], Policy::RoundRobin);
        for i in 0..10u8 {
            m.write_at(i as u64, &[i; 512]).unwrap();
        }
        let s = m.path_stats();
        assert_eq!((s[0].ios, s[1].ios), (5, 5), "{s:?}");
        a.up.store(false, Ordering::SeqCst);
        let mut buf = [0u8; 512];
        for i in 0..10u8 {
            m.read_at(i as u64, &mut buf).unwrap();
            assert_eq!(buf, [i; 512]);
        }
        let s = m.path_stats();
        assert_eq!(s[1].ios, 15, "{s:?}");
        assert_eq!(s[0].ios, 5, "a cut path gets nothing: {s:?}");
    }

    /// A LU on which writes sent on a failed path may still land late:
    /// each such write lands at its due time, which is applied (in due
    /// order) before any later access, as the old target would run a
    /// retransmission its initiator's host released once the link was
    /// back.
    struct LateLu {
        lu: RamDevice,
        late: Mutex<Vec<(Instant, u64, Vec<u8>)>>,
    }

    impl LateLu {
        fn land_due(&self) {
            let mut late = self.late.lock().unwrap();
            let now = Instant::now();
            late.sort_by_key(|l| l.0);
            while late.first().is_some_and(|l| l.0 <= now) {
                let (_, lba, data) = late.remove(0);
                self.lu.write_at(lba, &data).unwrap();
            }
        }
    }

    /// A path whose writes are left in doubt while `cut`: the write fails
    /// with a transport error, and its old copy lands `late` after.
    struct DoubtPath {
        lu: Arc<LateLu>,
        cut: AtomicBool,
        late: Duration,
    }

    impl BlockDevice for DoubtPath {
        fn block_size(&self) -> u32 {
            512
        }
        fn num_blocks(&self) -> u64 {
            64
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
            self.lu.land_due();
            self.lu.lu.read_at(lba, buf)
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
            self.lu.land_due();
            if self.cut.load(Ordering::SeqCst) {
                let e = crate::fence::in_doubt("WRITE(16)".into());
                let due = Instant::now() + self.late;
                self.lu.late.lock().unwrap().push((due, lba, buf.to_vec()));
                return Err(e);
            }
            self.lu.lu.write_at(lba, buf)
        }
    }

    impl PathDevice for DoubtPath {
        fn device_id(&self) -> Option<String> {
            Some("naa1".into())
        }
        fn is_up(&self) -> bool {
            true
        }
        fn wait_up(&self, _: Duration) -> bool {
            true
        }
    }

    /// Issue 33's lost write: a write in doubt on path A completes on
    /// path B, the caller writes the block again, and A's old copy of
    /// the first write lands after it. With the fence the first write
    /// completes only after the hold, past the old copy's landing, so
    /// the block keeps the newer data; without it (hold 0) the old copy
    /// wins.
    fn late_copy_after_rewrite(hold: Duration) -> ([u8; 512], Duration) {
        let lu = Arc::new(LateLu {
            lu: RamDevice::new(512, 64),
            late: Mutex::new(Vec::new()),
        });
        let path = |cut| {
            Arc::new(DoubtPath {
                lu: lu.clone(),
                cut: AtomicBool::new(cut),
                late: Duration::from_millis(700),
            }) as Arc<dyn PathDevice>
        };
        let m = Multipath::new(
            vec![("a".into(), path(true)), ("b".into(), path(false))],
            Policy::Failover,
            Duration::from_millis(100),
        )
        .unwrap()
        .with_in_doubt_hold(hold);
        let sent = Instant::now();
        m.write_at(9, &[1; 512]).unwrap();
        let took = sent.elapsed();
        // The caller saw the first write complete: it may write again.
        let b = &m.paths[1].dev;
        b.write_at(9, &[2; 512]).unwrap();
        // Long after every old copy's due time.
        lu.late
            .lock()
            .unwrap()
            .iter_mut()
            .for_each(|l| l.0 = l.0.min(Instant::now()));
        let mut buf = [0u8; 512];
        b.read_at(9, &mut buf).unwrap();
        (buf, took)
    }

    #[test]
    fn a_write_in_doubt_completes_only_after_its_old_copy_can_land() {
        let hold = Duration::from_millis(1500);
        let (block, took) = late_copy_after_rewrite(hold);
        assert!(took >= hold, "completed after {took:?}, before the hold");
        assert_eq!(block, [2; 512], "the old copy landed over the newer write");
        // The same with the fence off: the old copy lands over the newer
        // write (what the fence is for).
        let (block, _) = late_copy_after_rewrite(Duration::ZERO);
        assert_eq!(block, [1; 512], "without the hold the old copy wins");
    }

    #[test]
    fn an_io_failing_on_its_path_completes_on_another_and_is_logged() {
        let lu = Arc::new(RamDevice::new(512, 64));
        let (a, b) = (TestPath::new(&lu, "naa1"), TestPath::new(&lu, "naa1"));
        // `is_up` is read before the I/O: make the path fail under it.
        struct Flaky(Arc<TestPath>, AtomicBool);
        impl BlockDevice for Flaky {
            fn block_size(&self) -> u32 {
                512
            }
            fn num_blocks(&self) -> u64 {
                64
            }
            fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
                self.0.read_at(lba, buf)
            }
            fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
                if self.1.swap(false, Ordering::SeqCst) {
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "QP error"));
                }
                self.0.write_at(lba, buf)
            }
        }
        impl PathDevice for Flaky {
            fn device_id(&self) -> Option<String> {
                self.0.device_id()
            }
            fn is_up(&self) -> bool {
                true
            }
            fn wait_up(&self, _: Duration) -> bool {
                true
            }
        }
        let flaky = Arc::new(Flaky(a, AtomicBool::new(true)));
        let m = Multipath::new(
            vec![
                ("flaky".into(), flaky as Arc<dyn PathDevice>),
                ("b".into(), b as Arc<dyn PathDevice>),
            ],
            Policy::Failover,
            Duration::from_millis(100),
        )
        .unwrap();
        m.write_at(3, &[7; 512]).unwrap();
        let mut buf = [0u8; 512];
        lu.read_at(3, &mut buf).unwrap();
        assert_eq!(buf, [7; 512]);
        let f = m.failovers();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].from.as_str(), f[0].to.as_str()), ("flaky", "b"));
        let s = m.path_stats();
        assert_eq!((s[0].failures, s[1].ios), (1, 1), "{s:?}");
        // Failover policy: back on the first path once it works.
        m.write_at(4, &[8; 512]).unwrap();
        assert_eq!(m.path_stats()[0].ios, 1);
    }

    #[test]
    fn scsi_errors_are_not_retried_and_no_path_times_out() {
        let lu = Arc::new(RamDevice::new(512, 64));
        let (a, b) = (TestPath::new(&lu, "naa1"), TestPath::new(&lu, "naa1"));
        let m = mp(&[&a, &b], Policy::Failover);
        a.medium_errors.store(1, Ordering::SeqCst);
        let e = m.write_at(0, &[1; 512]).unwrap_err();
        assert_eq!(e.to_string(), "MEDIUM ERROR");
        assert_eq!(m.path_stats()[1].ios, 0, "not sent again elsewhere");

        a.up.store(false, Ordering::SeqCst);
        b.up.store(false, Ordering::SeqCst);
        let e = m.write_at(0, &[1; 512]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
        assert!(e.to_string().starts_with("no path to LU naa1"), "{e}");
    }

    #[test]
    fn paths_to_different_lus_are_refused_and_grouped_apart() {
        let lu = Arc::new(RamDevice::new(512, 64));
        let other = Arc::new(RamDevice::new(512, 128));
        let (a, b, c) = (
            TestPath::new(&lu, "naa1"),
            TestPath::new(&lu, "naa2"),
            TestPath::new(&other, "naa1"),
        );
        let err = |paths: &[&Arc<TestPath>]| {
            Multipath::new(named(paths), Policy::Failover, Duration::from_secs(1))
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            err(&[&a, &b]),
            "path p1 reaches LU naa2, not naa1 like path p0"
        );
        assert_eq!(
            err(&[&a, &c]),
            "path p1 sees 128 blocks of 512 B, path p0 64 of 512 B"
        );
        let none = Arc::new(TestPath {
            lu: lu.clone(),
            id: None,
            up: AtomicBool::new(true),
            medium_errors: AtomicU64::new(0),
        });
        assert!(err(&[&none]).contains("no NAA device identifier"));
        assert_eq!(
            Multipath::new(vec![], Policy::Failover, Duration::from_secs(1))
                .err()
                .unwrap()
                .to_string(),
            "a multipath device needs at least one path"
        );
        let (groups, loose) = group_by_device(vec![
            ("a".into(), a as Arc<dyn PathDevice>),
            ("b".into(), b as Arc<dyn PathDevice>),
            ("c".into(), c as Arc<dyn PathDevice>),
            ("none".into(), none as Arc<dyn PathDevice>),
        ]);
        let names: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(|(n, _)| n.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["a", "c"], vec!["b"]]);
        assert_eq!(loose, vec!["none".to_string()]);
        assert_eq!("rr".parse::<Policy>().unwrap(), Policy::RoundRobin);
        assert!("best"
            .parse::<Policy>()
            .unwrap_err()
            .to_string()
            .contains("`best`"));
    }

    /// The target side of ALUA for [`AluaPath`]s: each group's state
    /// code, and a count of the state changes the paths have "seen".
    struct Groups {
        states: Mutex<Vec<(u16, u8)>>,
        changes: AtomicU64,
        rtpg: AtomicU64,
    }

    impl Groups {
        fn new(states: &[(u16, AccessState)]) -> Arc<Groups> {
            Arc::new(Groups {
                states: Mutex::new(states.iter().map(|(g, s)| (*g, s.code())).collect()),
                changes: AtomicU64::new(0),
                rtpg: AtomicU64::new(0),
            })
        }
        fn set(&self, group: u16, state: AccessState) {
            for e in self.states.lock().unwrap().iter_mut() {
                if e.0 == group {
                    e.1 = state.code();
                }
            }
        }
        fn state(&self, group: u16) -> Option<AccessState> {
            let st = self.states.lock().unwrap();
            st.iter()
                .find(|e| e.0 == group)
                .and_then(|e| AccessState::from_code(e.1))
        }
    }

    /// A path through a port of target port group `group`: media access
    /// refused as the target refuses it (NOT READY and the state's ASC)
    /// unless the group is active.
    struct AluaPath {
        lu: Arc<RamDevice>,
        groups: Arc<Groups>,
        group: u16,
    }

    impl AluaPath {
        fn check(&self, what: &str) -> io::Result<()> {
            use scsi::{Asc, Sense, SenseKey};
            let asc = match self.groups.state(self.group) {
                Some(s) if s.is_active() => return Ok(()),
                Some(AccessState::Standby) => Asc::LU_NOT_ACCESSIBLE_STANDBY,
                Some(AccessState::Unavailable) => Asc::LU_NOT_ACCESSIBLE_UNAVAILABLE,
                _ => Asc::LU_NOT_ACCESSIBLE_TRANSITION,
            };
            let sense = Sense::new(SenseKey::NotReady, asc).to_fixed();
            let r = crate::disk::AluaRefusal::of_sense(what, &sense).unwrap();
            Err(io::Error::other(r))
        }
    }

    impl BlockDevice for AluaPath {
        fn block_size(&self) -> u32 {
            512
        }
        fn num_blocks(&self) -> u64 {
            64
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
            self.check("READ(16)")?;
            self.lu.read_at(lba, buf)
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
            self.check("WRITE(16)")?;
            self.lu.write_at(lba, buf)
        }
    }

    impl PathDevice for AluaPath {
        fn device_id(&self) -> Option<String> {
            Some("naa1".into())
        }
        fn is_up(&self) -> bool {
            true
        }
        fn wait_up(&self, _: Duration) -> bool {
            true
        }
        fn target_port_group(&self) -> Option<u16> {
            Some(self.group)
        }
        fn alua_changes(&self) -> u64 {
            self.groups.changes.load(Ordering::SeqCst)
        }
        fn report_target_port_groups(&self) -> io::Result<Vec<ReportedGroup>> {
            self.groups.rtpg.fetch_add(1, Ordering::SeqCst);
            let st = self.groups.states.lock().unwrap();
            Ok(st
                .iter()
                .map(|&(id, code)| ReportedGroup {
                    id,
                    state_code: code,
                    preferred: false,
                    status: 0,
                    ports: vec![id],
                })
                .collect())
        }
    }

    fn alua_pair(groups: &Arc<Groups>, policy: Policy) -> Multipath {
        let lu = Arc::new(RamDevice::new(512, 64));
        let path = |group| {
            Arc::new(AluaPath {
                lu: lu.clone(),
                groups: groups.clone(),
                group,
            }) as Arc<dyn PathDevice>
        };
        Multipath::new(
            vec![("a".into(), path(1)), ("b".into(), path(2))],
            policy,
            Duration::from_secs(20),
        )
        .unwrap()
    }

    fn ios_refusals(m: &Multipath) -> [(u64, u64); 2] {
        let s = m.path_stats();
        [(s[0].ios, s[0].refusals), (s[1].ios, s[1].refusals)]
    }

    #[test]
    fn alua_sends_io_to_the_active_group_only_and_follows_changes() {
        use AccessState::*;
        let groups = Groups::new(&[(1, Standby), (2, ActiveOptimized)]);
        // Round robin would use both paths; the standby one gets nothing,
        // not even a refused try: the states are read before the first I/O.
        let m = alua_pair(&groups, Policy::RoundRobin);
        for i in 0..10u8 {
            m.write_at(i as u64, &[i; 512]).unwrap();
        }
        assert_eq!(ios_refusals(&m), [(0, 0), (10, 0)]);
        let s = m.path_stats();
        assert_eq!(s[0].alua.as_deref(), Some("standby"));
        assert_eq!(s[1].alua.as_deref(), Some("active"));

        // A change the paths were told of (2A/06): read again before the
        // next I/O, which goes to the newly active group at once.
        groups.set(1, ActiveOptimized);
        groups.set(2, Standby);
        groups.changes.fetch_add(1, Ordering::SeqCst);
        for i in 0..10u8 {
            m.write_at(i as u64, &[i + 1; 512]).unwrap();
        }
        assert_eq!(ios_refusals(&m), [(10, 0), (10, 0)]);

        // A change nobody was told of yet: the refused I/O goes to the
        // other path, which the fresh states name active.
        groups.set(1, Standby);
        groups.set(2, ActiveOptimized);
        m.write_at(0, &[9; 512]).unwrap();
        assert_eq!(ios_refusals(&m), [(10, 1), (11, 0)]);
        let mut buf = [0u8; 512];
        m.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [9; 512]);

        // Non-optimized only while no optimized path is up.
        groups.set(1, ActiveNonOptimized);
        groups.changes.fetch_add(1, Ordering::SeqCst);
        m.write_at(1, &[1; 512]).unwrap();
        assert_eq!(ios_refusals(&m)[1].0, 13, "b (optimized) took it");
        groups.set(2, Unavailable);
        groups.changes.fetch_add(1, Ordering::SeqCst);
        m.write_at(1, &[1; 512]).unwrap();
        assert_eq!(ios_refusals(&m), [(11, 1), (13, 0)], "a (non-optimized)");
    }

    #[test]
    fn alua_transition_waits_for_an_active_group() {
        use AccessState::*;
        let groups = Groups::new(&[(1, Transitioning), (2, Standby)]);
        let m = Arc::new(alua_pair(&groups, Policy::Failover));
        let writer = {
            let m = m.clone();
            std::thread::spawn(move || m.write_at(5, &[5; 512]))
        };
        // The writer keeps reading the states while no group is active.
        let end = Instant::now() + Duration::from_secs(10);
        while groups.rtpg.load(Ordering::SeqCst) < 3 {
            assert!(Instant::now() < end, "the states were not read again");
            std::thread::yield_now();
        }
        assert!(
            !writer.is_finished(),
            "the write completed with no active group"
        );
        groups.set(2, ActiveOptimized);
        writer.join().unwrap().unwrap();
        assert_eq!(ios_refusals(&m)[1].0, 1);
        // With no group ever active, the wait ends at no_path_timeout
        // with the paths' states in the error.
        groups.set(2, Unavailable);
        groups.set(1, Standby);
        groups.changes.fetch_add(1, Ordering::SeqCst);
        let lu = Arc::new(RamDevice::new(512, 64));
        let path = |group| {
            Arc::new(AluaPath {
                lu: lu.clone(),
                groups: groups.clone(),
                group,
            }) as Arc<dyn PathDevice>
        };
        let short = Multipath::new(
            vec![("a".into(), path(1)), ("b".into(), path(2))],
            Policy::Failover,
            Duration::from_millis(300),
        )
        .unwrap();
        let e = short.write_at(0, &[1; 512]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
        assert!(
            e.to_string().contains("(a up, standby; b up, unavailable)"),
            "{e}"
        );
    }
}
