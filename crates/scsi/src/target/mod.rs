//! The target: LUN maps (SCST masking model), I_T nexuses, unit attentions,
//! and the entry points a transport calls.

use crate::bufs::Buffers;
use crate::cdb::{control_byte, naca, Command, DataDir, Plan};
use crate::emulation::Device;
use crate::lun::Lun;
use crate::pr::PrError;
use crate::sense::{Asc, Sense, SenseKey};
use crate::task::{ServiceResponse, Tmf, TmfResponse};
use crate::transport_id::TransportId;
use crate::ua::UaQueue;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

mod groups;
mod luns;
mod ordering;
mod route;
mod run;

pub use groups::AluaError;
use luns::State;
pub use luns::{GroupMap, LunMaps, PortMap};
use ordering::*;
pub use route::Route;
pub(crate) use run::add_relative_port;
use run::{is_read_or_write, is_write, naca_supported};

/// An I_T nexus: initiator port name and target port name. Every command
/// names one, and the core keys its task sets, tasks and unit attentions
/// by it: a clone shares the names, and a hash is the one made once.
#[derive(Debug, Clone, Eq, PartialOrd, Ord)]
pub struct Nexus {
    pub initiator: Arc<str>,
    pub target_port: Arc<str>,
    /// A hash of both names (last: the order is the names').
    hash: u64,
}

/// Equal names, as derived, but asked cheaply first: different hashes
/// differ, and clones of one nexus (what map lookups on every command
/// compare) share their names.
impl PartialEq for Nexus {
    fn eq(&self, other: &Nexus) -> bool {
        self.hash == other.hash
            && (Arc::ptr_eq(&self.initiator, &other.initiator) || self.initiator == other.initiator)
            && (Arc::ptr_eq(&self.target_port, &other.target_port)
                || self.target_port == other.target_port)
    }
}

impl std::hash::Hash for Nexus {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Task sets kept while idle, at most (see `submit_attr_into`).
const IDLE_TASK_SETS_KEPT: usize = 64;

/// Nexuses a task set keeps a count for while it is 0, at most.
const NEXUS_COUNTS_KEPT: usize = 64;

/// Maps keyed by what the core makes itself (nexuses, LUNs, tags): a hash
/// of a word, not SipHash over names on every command. A tag is the
/// initiator's choice, but collisions it could make cost only its own
/// lookups, bounded by its queue depth.
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;
pub(crate) type FastSet<K> = rustc_hash::FxHashSet<K>;

impl Nexus {
    pub fn new(initiator: &str, target_port: &str) -> Nexus {
        use std::hash::{Hash, Hasher};
        // Fixed keys: equal names, equal hash, in every nexus made.
        let mut h = std::hash::DefaultHasher::new();
        initiator.hash(&mut h);
        target_port.hash(&mut h);
        Nexus {
            initiator: initiator.into(),
            target_port: target_port.into(),
            hash: h.finish(),
        }
    }

    /// The nexus of the initiator port a TransportID names, on
    /// `target_port` (the initiator named as [`TransportId::initiator_name`]
    /// says: an SRP port is `0x` and its 32 hex digits, as srp-target names
    /// sessions).
    pub fn from_transport_id(id: &TransportId, target_port: &str) -> Nexus {
        Nexus::new(&id.initiator_name(), target_port)
    }

    /// The TransportID of this nexus's initiator port (`None` only for a
    /// name no TransportID can hold).
    pub fn transport_id(&self) -> Option<TransportId> {
        TransportId::from_initiator_name(&self.initiator)
    }
}

/// SCSI status (SAM-5 5.3.1); each variant's value is its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    /// A pass-through device's PRE-FETCH found the blocks' cache room
    /// (SBC-3 5.9); the emulation never answers it.
    ConditionMet = 0x04,
    /// A command from a nexus other than the faulted one, NACA=0, while an
    /// ACA condition is in effect (SAM-5 5.9.2.3).
    Busy = 0x08,
    ReservationConflict = 0x18,
    /// A command the ACA condition does not admit (SAM-5 5.9.2).
    AcaActive = 0x30,
    TaskAborted = 0x40,
    /// The logical unit's task set already holds its queue depth
    /// (`DeviceConfig::queue_depth`), some of it this nexus's tasks; the
    /// command did not run. (A nexus with no task there gets `Busy`.)
    TaskSetFull = 0x28,
}

impl Status {
    const ALL: [Status; 8] = [
        Status::Good,
        Status::CheckCondition,
        Status::ConditionMet,
        Status::Busy,
        Status::ReservationConflict,
        Status::AcaActive,
        Status::TaskAborted,
        Status::TaskSetFull,
    ];

    /// The status code (SAM-5 table 33), as a transport sends it.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The status a received code names; `None` for the codes this core
    /// never answers with (INTERMEDIATE, obsolete and reserved values).
    pub fn from_code(code: u8) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.code() == code)
    }
}

impl From<Status> for u8 {
    fn from(s: Status) -> u8 {
        s.code()
    }
}

/// Residual against the transport's expected transfer length (SAM-5 5.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    None,
    /// Fewer bytes moved than expected.
    Under(u64),
    /// The command wanted more bytes than expected.
    Over(u64),
}

impl Residual {
    fn of(expected: u64, wanted: u64, moved: u64) -> Residual {
        if wanted > expected {
            Residual::Over(wanted - expected)
        } else if moved < expected {
            Residual::Under(expected - moved)
        } else {
            Residual::None
        }
    }
}

/// Outcome of one command; CHECK CONDITION is data, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResponse {
    pub status: Status,
    pub sense: Option<Sense>,
    /// Sense data as a pass-through device gave it, sent instead of
    /// `sense` (which then holds its key and ASC, when they could be read).
    pub device_sense: Option<Vec<u8>>,
    pub data_in: Vec<u8>,
    pub residual: Residual,
    /// The LU's control page D_SENSE: transports send descriptor sense.
    pub descriptor_sense: bool,
}

impl ScsiResponse {
    /// Sense bytes in the format the LU's control page selects (SPC-4 7.5.8).
    pub fn sense_bytes(&self) -> Option<Vec<u8>> {
        if let Some(d) = &self.device_sense {
            return Some(d.clone());
        }
        self.sense.map(|s| {
            if self.descriptor_sense {
                s.to_descriptor()
            } else {
                s.to_fixed()
            }
        })
    }

    fn check(sense: Sense, expected: u64) -> ScsiResponse {
        ScsiResponse {
            sense: Some(sense),
            ..ScsiResponse::status_only(Status::CheckCondition, expected)
        }
    }

    /// A status without data or sense: nothing of `expected` moved.
    fn status_only(status: Status, expected: u64) -> ScsiResponse {
        ScsiResponse {
            status,
            sense: None,
            device_sense: None,
            data_in: Vec::new(),
            residual: if expected > 0 {
                Residual::Under(expected)
            } else {
                Residual::None
            },
            descriptor_sense: false,
        }
    }
}

/// A SCSI target: LUN maps plus per-nexus state. Shared by reference
/// between transport threads.
#[derive(Default)]
pub struct Target {
    state: Mutex<State>,
    tasks: Mutex<crate::task::Tasks>,
    /// Task sets and ACA conditions by logical unit (device identity).
    order: Mutex<Order>,
    order_cv: std::sync::Condvar,
    /// Tasks waiting on `order_cv`, counted under `order`: a command that
    /// ends with nobody waiting makes no futex call (one per command, the
    /// only system call of a READ run to completion on the loopback).
    order_waiters: AtomicUsize,
    /// ACA conditions in effect (`order.aca.len()`), so commands with
    /// NACA=0 skip the ACA rules without taking the lock when there are none.
    aca_live: AtomicUsize,
    /// Tasks that are not SIMPLE in all task sets, counted under `order`:
    /// while there are none (and no ACA), any unit that never blocks runs
    /// a SIMPLE task at once, which a transport may ask without the lock.
    not_simple_live: AtomicUsize,
    /// Times `state` was locked for a change (or may have been): a
    /// [`Route`] made at one count holds while the count stays.
    epoch: AtomicU64,
}

/// Task attributes (SAM-5 8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttr {
    /// May run in any order relative to other SIMPLE tasks.
    #[default]
    Simple,
    /// Runs after every older task and before every newer one.
    Ordered,
    /// Runs at once, ahead of the enabled tasks.
    HeadOfQueue,
    /// The one task the faulted nexus may run while its ACA condition is
    /// in effect (SAM-5 8.6.5); refused when there is none.
    Aca,
}

impl Target {
    pub fn new() -> Target {
        Target::default()
    }

    /// The state, to change or to read: every [`Route`] made before is
    /// stale from here on.
    fn lock(&self) -> MutexGuard<'_, State> {
        let st = self.lock_to_read();
        // Under the lock, before any change: a route is made under it too,
        // so it can never record a count that a change is still behind.
        self.epoch.fetch_add(1, SeqCst);
        st
    }

    /// The state, for what leaves routes as they are: reads, and the
    /// first-sight entries of a nexus a route is being made for.
    fn lock_to_read(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device `nexus` reaches at `lun` (what a transport labels its
    /// per-LUN counters with).
    pub fn device(&self, nexus: &Nexus, lun: Lun) -> Option<Arc<Device>> {
        self.lock_to_read()
            .set_for(&nexus.initiator, &nexus.target_port)
            .get(&lun)
            .cloned()
    }

    /// Runs `f` on the task sets and ACA conditions; when it ends a
    /// condition, the tasks it blocked are woken.
    fn with_order<R>(&self, f: impl FnOnce(&mut Order) -> R) -> R {
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let before = order.aca.len();
        let r = f(&mut order);
        let after = order.aca.len();
        self.aca_live.store(after, SeqCst);
        drop(order);
        if after < before {
            self.wake_ordered();
        }
        r
    }

    /// Wakes the tasks waiting for their turn, if any. Call it after
    /// changing `order` (under its lock or after): a waiter counts itself
    /// under the lock before it sleeps, so it is either counted here or
    /// saw the change before sleeping.
    fn wake_ordered(&self) {
        if self.order_waiters.load(SeqCst) > 0 {
            self.order_cv.notify_all();
        }
    }

    /// Ends the ACA conditions `which` accepts (by LU key and condition),
    /// aborting their ACA tasks when `abort_task`.
    fn clear_aca(&self, abort_task: bool, which: impl Fn(usize, &Aca) -> bool) {
        let ended: Vec<(Nexus, Option<(Lun, u64)>)> = self.with_order(|o| {
            let keys: Vec<usize> = o
                .aca
                .iter()
                .filter(|(k, a)| which(**k, a))
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| o.aca.remove(k))
                .map(|a| (a.faulted, a.task))
                .collect()
        });
        if !abort_task {
            return;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        for (n, task) in ended {
            if let Some((l, tag)) = task {
                tasks.abort(|x, y, z| *x == n && y == l && z == tag);
            }
        }
    }

    /// Executes a tagged command that task management can abort. Call it
    /// on a transport worker thread; a TMF from another thread marks it.
    pub fn submit(
        &self,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
    ) -> ScsiResponse {
        self.submit_attr(nexus, lun, tag, TaskAttr::Simple, cdb, data_out, expected)
    }

    /// Tasks in the task set of the logical unit `nexus` reaches at `lun`
    /// (waiting or running, from every nexus).
    pub fn task_set_len(&self, nexus: &Nexus, lun: Lun) -> usize {
        let key = self.device(nexus, lun).map(|d| lu_key(&d));
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        key.and_then(|k| order.sets.get(&k)).map_or(0, |s| s.len())
    }

    /// The faulted nexus of the ACA condition in effect on the logical
    /// unit `nexus` reaches at `lun`, if any.
    pub fn aca_faulted(&self, nexus: &Nexus, lun: Lun) -> Option<Nexus> {
        let k = lu_key(&self.device(nexus, lun)?);
        self.with_order(|o| o.aca.get(&k).map(|a| a.faulted.clone()))
    }

    /// Whether a SIMPLE command to `lun` would start at once (no older
    /// ORDERED or HEAD OF QUEUE task of the logical unit is active) and
    /// only touch memory (a RAM or null store), so a transport may run it
    /// on its own thread. A hint: a task submitted meanwhile can still make
    /// the command wait.
    pub fn runs_without_blocking(&self, nexus: &Nexus, lun: Lun) -> bool {
        match self.device(nexus, lun) {
            Some(dev) => self.device_runs_without_blocking(&dev),
            None => true, // answered from the LUN map alone
        }
    }

    /// [`Target::runs_without_blocking`] for a command to `dev`, which the
    /// caller looked up already ([`Target::device`]).
    pub fn device_runs_without_blocking(&self, dev: &Arc<Device>) -> bool {
        if !dev.never_blocks() {
            return false;
        }
        if self.aca_live.load(SeqCst) == 0 && self.not_simple_live.load(SeqCst) == 0 {
            return true;
        }
        let key = lu_key(dev);
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        !order.aca.contains_key(&key) && order.sets.get(&key).is_none_or(|s| s.all_simple())
    }

    /// [`Target::submit`] with a task attribute: the command enters the
    /// logical unit's task set now and starts only when its attribute
    /// allows (an ORDERED task after every older task, any task after an
    /// older ORDERED one, HEAD OF QUEUE at once). A task aborted while it
    /// waits ends with TASK ABORTED without running.
    ///
    /// While an ACA condition is in effect on the logical unit (SAM-5 5.9)
    /// the faulted nexus may run one ACA task; its other commands end with
    /// ACA ACTIVE, other nexuses' with ACA ACTIVE (NACA=1 or ACA attribute)
    /// or BUSY, and tasks already in the task set wait for the end of the
    /// condition.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_attr(
        &self,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        attr: TaskAttr,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
    ) -> ScsiResponse {
        self.submit_attr_into(nexus, lun, tag, attr, cdb, data_out, expected, None)
    }

    /// [`Target::submit_attr`] with the data in the transport's own buffers
    /// ([`Buffers`]): data-in goes into them (a READ is read by the store
    /// straight into the pieces) and the response's `data_in` stays empty;
    /// a WRITE's data-out pieces are written from where they are (pass an
    /// empty `data_out` with them). The
    /// pieces' contents count only for a GOOD status; an aborted command
    /// may have filled them.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_attr_into(
        &self,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        attr: TaskAttr,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let dev = self.device(nexus, lun);
        self.submit_to(dev, nexus, lun, tag, attr, cdb, data_out, expected, bufs)
    }

    /// [`Target::submit_attr_into`] for a transport that looked the
    /// logical unit up already: `dev` is what [`Target::device`] gave it
    /// for `nexus` and `lun` (a map change since counts the command
    /// where it was addressed, as one during the command does).
    #[allow(clippy::too_many_arguments)]
    pub fn submit_to(
        &self,
        dev: Option<Arc<Device>>,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        attr: TaskAttr,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let route = Route::unrouted(dev);
        self.submit_routed(&route, nexus, lun, tag, attr, cdb, data_out, expected, bufs)
    }

    /// [`Target::submit_to`] with the device from `route`, which
    /// [`Target::route`] made for `nexus` and `lun`: while nothing changed
    /// since, a READ or WRITE skips the look at the LUN maps, unit
    /// attentions and group states under the state lock.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_routed(
        &self,
        route: &Route,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        attr: TaskAttr,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        // Only a WRITE takes its data-out in pieces; anything else that
        // has data-out parses it, so it gets it in one. A pass-through
        // device takes any command's pieces, but PERSISTENT RESERVE OUT
        // (the core's).
        let dev = route.device();
        let passed = dev.is_some_and(|d| d.pass_through_handler().is_some());
        let gathered;
        let (data_out, mut bufs) = match bufs {
            Some(b)
                if b.has_data_out()
                    && !is_write(cdb)
                    && (!passed || crate::passthrough::core_parses_data_out(cdb)) =>
            {
                gathered = b.gather_data_out();
                (&gathered[..], None)
            }
            b => (data_out, b),
        };
        let Some(dev) = dev else {
            // No logical unit: no task set, nothing but an error to run.
            return self.run_in_order(
                None, route, attr, nexus, lun, tag, cdb, data_out, expected, bufs,
            );
        };
        let k = lu_key(dev);
        let depth = dev.config.queue_depth.max(1) as usize;
        if attr == TaskAttr::Simple
            && is_read_or_write(cdb)
            && dev.never_blocks()
            && route.plain_for(self, nexus, lun)
        {
            let b = bufs.as_deref_mut();
            if let Some(r) =
                self.run_inline(route, k, depth, nexus, lun, cdb, data_out, expected, b)
            {
                return r;
            }
        }
        let entered = self.with_order(|o| {
            // SAM-5 5.3.1: no room in the task set, nothing runs; TASK
            // SET FULL to a nexus with tasks of its own there (it will
            // get room as they end), BUSY to one without.
            if let Some(set) = o.sets.get(&k).filter(|s| s.len() >= depth) {
                let status = if set.has_tasks_of(nexus) {
                    Status::TaskSetFull
                } else {
                    Status::Busy
                };
                return Err(ScsiResponse::status_only(status, expected));
            }
            match o.admit(k, nexus, (lun, tag), attr, cdb, expected) {
                Err(r) => {
                    o.settle(k, dev, nexus, None, cdb, r.status);
                    Err(r)
                }
                Ok(aca_task) => {
                    // A PREEMPT AND ABORT admitted during ACA runs
                    // as the ACA task would: it is what ends the
                    // condition (SPC-4 5.12.11.2.6).
                    let attr = if o.aca.contains_key(&k) && preempt_and_abort(cdb) {
                        TaskAttr::Aca
                    } else {
                        attr
                    };
                    let set = o.sets.entry(k).or_default();
                    let seq = set.next;
                    set.next += 1;
                    set.enter(seq, attr);
                    if attr != TaskAttr::Simple {
                        self.not_simple_live.fetch_add(1, SeqCst);
                    }
                    // The nexus is cloned only for its first task here.
                    match set.per_nexus.get_mut(nexus) {
                        Some(n) => *n += 1,
                        None => {
                            set.per_nexus.insert(nexus.clone(), 1);
                        }
                    }
                    Ok((seq, aca_task.then_some((lun, tag)), attr))
                }
            }
        });
        let (seq, aca_task, attr) = match entered {
            Ok(e) => e,
            Err(r) => {
                return ScsiResponse {
                    descriptor_sense: dev.mode_state().d_sense,
                    ..r
                }
            }
        };
        let r = self.run_in_order(
            Some((k, seq)),
            route,
            attr,
            nexus,
            lun,
            tag,
            cdb,
            data_out,
            expected,
            bufs,
        );
        self.with_order(|o| {
            o.settle(k, dev, nexus, aca_task, cdb, r.status);
            if let Some(set) = o.sets.get_mut(&k) {
                if set.leave(seq) {
                    self.not_simple_live.fetch_sub(1, SeqCst);
                }
                // A nexus's count stays at 0 (a command run to completion
                // takes it there every time: no remove and insert each),
                // unless the set counts for many nexuses.
                if let Some(n) = set.per_nexus.get_mut(nexus) {
                    *n -= 1;
                    if *n == 0 && set.per_nexus.len() > NEXUS_COUNTS_KEPT {
                        set.per_nexus.remove(nexus);
                    }
                }
                // An idle set is kept (its maps keep their room), unless
                // many logical units have one.
                if set.len() == 0 && o.sets.len() > IDLE_TASK_SETS_KEPT {
                    o.sets.remove(&k);
                }
            }
        });
        self.wake_ordered();
        r
    }

    /// A SIMPLE READ or WRITE through a current, plain route to a unit
    /// that never blocks, run to completion here while the logical unit's
    /// task set holds only SIMPLE tasks, has room and no ACA condition:
    /// it enters the set as an inline task (no number, no abort flag),
    /// so ORDERED tasks that come meanwhile wait for it and the set's
    /// depth counts it. `None` (nothing done) when the set does not allow
    /// it: the command takes the task set's way.
    ///
    /// Not registered for task management: a function that comes from
    /// another thread while it runs (a worker may run it while the port's
    /// thread takes an ABORT TASK, LOGICAL UNIT RESET or another nexus's
    /// CLEAR TASK SET) does not mark it, and it ends GOOD, as a task that
    /// completed just before the function would (its I/O was done either
    /// way: an aborted task's runs to its end too), not TASK ABORTED; a
    /// CLEAR TASK SET raises no COMMANDS CLEARED attention for it. A
    /// transport answers a function only after the commands it was
    /// running (SRP holds the TMF response behind them), so no initiator
    /// learns of the function first. Tag overlaps on a channel are the
    /// transport's to catch before the core (SRP's are).
    #[allow(clippy::too_many_arguments)]
    fn run_inline(
        &self,
        route: &Route,
        k: usize,
        depth: usize,
        nexus: &Nexus,
        lun: Lun,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> Option<ScsiResponse> {
        let dev = route.device()?;
        {
            let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
            if !o.aca.is_empty() {
                return None;
            }
            let set = o.sets.entry(k).or_default();
            if !set.all_simple() || set.len() >= depth {
                return None;
            }
            set.inline.push(nexus.clone());
        }
        let r = self.run(nexus, lun, Some(route), cdb, data_out, expected, bufs);
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        // A CHECK CONDITION with NACA=1 establishes ACA as for any task.
        o.settle(k, dev, nexus, None, cdb, r.status);
        self.aca_live.store(o.aca.len(), SeqCst);
        if let Some(set) = o.sets.get_mut(&k) {
            set.leave_inline(nexus);
            if set.len() == 0 && o.sets.len() > IDLE_TASK_SETS_KEPT {
                o.sets.remove(&k);
            }
        }
        drop(o);
        // An ORDERED task may have waited for this one.
        self.wake_ordered();
        Some(r)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_in_order(
        &self,
        entry: Option<(usize, u64)>,
        route: &Route,
        attr: TaskAttr,
        nexus: &Nexus,
        lun: Lun,
        tag: u64,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let flag = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start(nexus, lun, tag);
        let Some(flag) = flag else {
            return ScsiResponse::check(
                Sense::new(SenseKey::AbortedCommand, Asc::OVERLAPPED_COMMANDS),
                expected,
            );
        };
        let aborted = || flag.load(std::sync::atomic::Ordering::SeqCst);
        if let Some((k, seq)) = entry {
            let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
            while !aborted() && !order.may_start(k, seq, attr) {
                self.order_waiters.fetch_add(1, SeqCst);
                order = self.order_cv.wait(order).unwrap_or_else(|e| e.into_inner());
                self.order_waiters.fetch_sub(1, SeqCst);
            }
        }
        let r = if aborted() {
            None
        } else {
            Some(self.run(nexus, lun, Some(route), cdb, data_out, expected, bufs))
        };
        // The flag's last value comes from `finish`: it may serve another
        // task from then on.
        drop(flag);
        let aborted = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finish(nexus, lun, tag);
        match r {
            Some(r) if !aborted => r,
            _ => ScsiResponse::status_only(Status::TaskAborted, expected),
        }
    }

    /// A task management function from `nexus` for `lun` (SAM-5 7), with
    /// the two outcomes transports written before CLEAR ACA know; see
    /// [`Target::tmf`] for the exact service response.
    pub fn task_management(&self, nexus: &Nexus, lun: Lun, tmf: Tmf) -> TmfResponse {
        self.tmf(nexus, lun, tmf).into()
    }

    /// A task management function from `nexus` for `lun` (SAM-5 7).
    ///
    /// It returns at once: the tasks it aborts are only marked. One waiting
    /// for its turn ends then; one inside the backend finishes that I/O
    /// (a WRITE may still change the medium) and its `submit` returns
    /// TASK ABORTED afterwards. A transport therefore sends the function's
    /// response only once the `submit` calls of the tasks it aborts have
    /// returned, and sends their data and status (a task that completed
    /// before the mark is answered normally) ahead of it: an initiator
    /// told FUNCTION COMPLETE reuses the aborted commands' buffers and tags.
    pub fn tmf(&self, nexus: &Nexus, lun: Lun, tmf: Tmf) -> ServiceResponse {
        let r = self.task_management_inner(nexus, lun, tmf);
        // Tasks waiting for their turn in a task set see their abort.
        let _order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        self.wake_ordered();
        r
    }

    fn task_management_inner(&self, nexus: &Nexus, lun: Lun, tmf: Tmf) -> ServiceResponse {
        let Some(dev) = self.device(nexus, lun) else {
            return ServiceResponse::IncorrectLun;
        };
        let k = lu_key(&dev);
        if tmf == Tmf::ClearAca {
            // SAM-5 7.3: only the faulted nexus ends the condition; with
            // none in effect there is nothing to do.
            let faulted = self.with_order(|o| o.aca.get(&k).map(|a| a.faulted.clone()));
            match faulted {
                Some(f) if f != *nexus => return ServiceResponse::FunctionRejected,
                Some(_) => self.clear_aca(true, |key, _| key == k),
                None => {}
            }
            return ServiceResponse::FunctionComplete;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        match tmf {
            Tmf::AbortTask(tag) => {
                tasks.abort(|n, l, t| n == nexus && l == lun && t == tag);
            }
            Tmf::AbortTaskSet => {
                tasks.abort(|n, l, _| n == nexus && l == lun);
            }
            Tmf::ClearTaskSet => {
                // Every nexus's tasks on the LU; the others are told (SAM-5 7.4).
                let hit = tasks.abort(|_, l, _| l == lun);
                drop(tasks);
                self.raise_where(&dev, Asc::COMMANDS_CLEARED_BY_ANOTHER, |n| {
                    n != nexus && hit.contains(n)
                });
            }
            Tmf::LogicalUnitReset => {
                tasks.abort(|_, l, _| l == lun);
                drop(tasks);
                // A pass-through device is reset too (SG_SCSI_RESET): the
                // commands it holds end, and so does whatever the reset
                // clears in the device. This thread waits for it.
                if let Some(p) = dev.pass_through_handler() {
                    p.reset();
                }
                // A reset ends the LU's ACA condition (SAM-5 5.9.3).
                self.clear_aca(false, |key, _| key == k);
                // SAM-5 7.7: a unit attention for every nexus, including this one.
                self.raise_where(&dev, Asc::BUS_DEVICE_RESET, |_| true);
            }
            Tmf::ItNexusReset => {
                tasks.abort(|n, _, _| n == nexus);
                drop(tasks);
                // So does the loss of the faulted nexus (SAM-5 5.9.3).
                self.clear_aca(false, |_, a| a.faulted == *nexus);
                let st = &mut *self.lock();
                let keys: Vec<(Nexus, Lun)> = st
                    .known
                    .iter()
                    .filter(|(n, _)| n == nexus)
                    .cloned()
                    .collect();
                for key in keys {
                    st.ua.entry(key).or_default().push(Asc::I_T_NEXUS_LOSS);
                }
            }
            Tmf::ClearAca => {}
        }
        ServiceResponse::FunctionComplete
    }

    /// Direction and length a CDB implies for this nexus and LUN, before
    /// execution. A CDB that will fail gives its CHECK CONDITION now.
    /// A pass-through device's commands are not parsed: the transport
    /// decides (see [`crate::passthrough`]), and this says `Err` for a CDB
    /// the opcode table does not know.
    pub fn plan(&self, nexus: &Nexus, lun: Lun, cdb: &[u8]) -> Result<Plan, Sense> {
        let (_, cmd) = Command::parse(cdb)?;
        let dev = self.device(nexus, lun);
        naca_supported(dev.as_deref(), cdb)?;
        if let Some(d) = &dev {
            d.protect_supported(&cmd)?;
        }
        Ok(cmd.plan(dev.map_or(512, |d| d.block_size())))
    }

    /// Executes one command, as an untagged SIMPLE task that does not
    /// wait in the task set (see [`Target::submit_attr`] for the ACA
    /// rules it follows). `expected` is the transport's expected transfer
    /// length (data-in buffer or data-out bytes), for residuals.
    pub fn execute(
        &self,
        nexus: &Nexus,
        lun: Lun,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
    ) -> ScsiResponse {
        if !naca(cdb) && self.aca_live.load(SeqCst) == 0 {
            return self.run(nexus, lun, None, cdb, data_out, expected, None);
        }
        let Some(dev) = self.device(nexus, lun) else {
            return self.run(nexus, lun, None, cdb, data_out, expected, None);
        };
        let k = lu_key(&dev);
        let admitted = self.with_order(|o| {
            let a = o.admit(k, nexus, (lun, 0), TaskAttr::Simple, cdb, expected);
            if let Err(r) = &a {
                o.settle(k, &dev, nexus, None, cdb, r.status);
            }
            a
        });
        if let Err(r) = admitted {
            return ScsiResponse {
                descriptor_sense: dev.mode_state().d_sense,
                ..r
            };
        }
        let r = self.run(nexus, lun, None, cdb, data_out, expected, None);
        self.with_order(|o| o.settle(k, &dev, nexus, None, cdb, r.status));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn status_codes_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
            assert_eq!(u8::from(s), s.code());
        }
        assert_eq!(Status::CheckCondition.code(), 0x02);
        assert_eq!(Status::TaskSetFull.code(), 0x28);
        // CONDITION MET passes from a pass-through device; INTERMEDIATE
        // (10h, obsolete) is a status this core never answers with.
        assert_eq!(Status::from_code(0x04), Some(Status::ConditionMet));
        assert_eq!(Status::from_code(0x10), None);
    }
}
