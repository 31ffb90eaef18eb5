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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

/// An I_T nexus: initiator port name and target port name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nexus {
    pub initiator: String,
    pub target_port: String,
}

impl Nexus {
    pub fn new(initiator: &str, target_port: &str) -> Nexus {
        Nexus {
            initiator: initiator.into(),
            target_port: target_port.into(),
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

/// SCSI status (SAM-5 5.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Good,
    CheckCondition,
    /// A command from a nexus other than the faulted one, NACA=0, while an
    /// ACA condition is in effect (SAM-5 5.9.2.3).
    Busy,
    ReservationConflict,
    /// A command the ACA condition does not admit (SAM-5 5.9.2).
    AcaActive,
    TaskAborted,
    /// The logical unit's task set already holds its queue depth
    /// (`DeviceConfig::queue_depth`), some of it this nexus's tasks; the
    /// command did not run. (A nexus with no task there gets `Busy`.)
    TaskSetFull,
}

impl From<Status> for u8 {
    fn from(s: Status) -> u8 {
        match s {
            Status::Good => 0x00,
            Status::CheckCondition => 0x02,
            Status::Busy => 0x08,
            Status::ReservationConflict => 0x18,
            Status::AcaActive => 0x30,
            Status::TaskSetFull => 0x28,
            Status::TaskAborted => 0x40,
        }
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
    pub data_in: Vec<u8>,
    pub residual: Residual,
    /// The LU's control page D_SENSE: transports send descriptor sense.
    pub descriptor_sense: bool,
}

impl ScsiResponse {
    /// Sense bytes in the format the LU's control page selects (SPC-4 7.5.8).
    pub fn sense_bytes(&self) -> Option<Vec<u8>> {
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

type LunSet = BTreeMap<Lun, Arc<Device>>;

/// One group of [`LunMaps`].
#[derive(Clone)]
pub struct GroupMap {
    pub name: String,
    /// Initiator name patterns that belong to the group.
    pub initiators: Vec<String>,
    pub luns: Vec<(Lun, Arc<Device>)>,
}

/// What [`Target::lun_maps`] returns.
#[derive(Clone)]
pub struct LunMaps {
    pub default: Vec<(Lun, Arc<Device>)>,
    pub groups: Vec<GroupMap>,
}

/// Initiator name matching: exact, or by prefix when `pattern` ends in `*`
/// (SCST accepts wildcards in group initiator names).
fn initiator_matches(pattern: &str, initiator: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => initiator.starts_with(prefix),
        None => pattern == initiator,
    }
}

#[derive(Default)]
struct State {
    /// The target's default LUN set.
    default: LunSet,
    /// Named groups, each replacing the default set for its initiators
    /// (SCST security groups). A group named after an initiator with no
    /// explicit membership applies to that initiator.
    groups: HashMap<String, LunSet>,
    /// Initiator name patterns -> group name, in the order added; the
    /// first match wins. A pattern ending in `*` matches by prefix.
    members: Vec<(String, String)>,
    ua: HashMap<(Nexus, Lun), UaQueue>,
    /// (nexus, LUN) pairs that have seen their power-on unit attention.
    known: HashSet<(Nexus, Lun)>,
    /// Relative target port identifiers (SPC-4 3.1.120) by target port
    /// name, numbered from 1 as ports are first seen.
    ports: BTreeMap<String, u16>,
}

impl State {
    /// The relative target port identifier of `port`, assigned now if new.
    fn port_id(&mut self, port: &str) -> u16 {
        if let Some(&id) = self.ports.get(port) {
            return id;
        }
        // 0 is reserved; the last identifier is reused past 65535 ports.
        let id = (self.ports.len() + 1).min(0xffff) as u16;
        self.ports.insert(port.to_string(), id);
        id
    }

    /// The group `initiator` belongs to, if any.
    fn group_of<'a>(&'a self, initiator: &'a str) -> Option<&'a str> {
        self.members
            .iter()
            .find(|(pat, _)| initiator_matches(pat, initiator))
            .map(|(_, g)| g.as_str())
            .or_else(|| self.groups.contains_key(initiator).then_some(initiator))
    }

    fn set_for(&self, initiator: &str) -> &LunSet {
        static EMPTY: LunSet = BTreeMap::new();
        match self.group_of(initiator) {
            Some(g) => self.groups.get(g).unwrap_or(&EMPTY),
            None => &self.default,
        }
    }

    /// Raises REPORTED LUNS DATA HAS CHANGED on every known nexus of the
    /// initiators `which` accepts.
    fn luns_changed_for(&mut self, which: impl Fn(&str) -> bool) {
        let affected: Vec<(Nexus, Lun)> = self
            .known
            .iter()
            .filter(|(n, _)| which(&n.initiator))
            .cloned()
            .collect();
        for key in affected {
            self.ua
                .entry(key)
                .or_default()
                .push(Asc::REPORTED_LUNS_DATA_CHANGED);
        }
    }

    fn ua_mut(&mut self, nexus: &Nexus, lun: Lun) -> &mut UaQueue {
        if self.known.insert((nexus.clone(), lun)) {
            self.ua
                .entry((nexus.clone(), lun))
                .or_default()
                .push(Asc::POWER_ON_RESET);
        }
        self.ua.entry((nexus.clone(), lun)).or_default()
    }

    /// Raises REPORTED LUNS DATA HAS CHANGED on every known nexus of the
    /// initiators whose visible set changed (`None`: those using the default).
    fn luns_changed(&mut self, group: Option<&str>) {
        let affected: Vec<(Nexus, Lun)> = self
            .known
            .iter()
            .filter(|(n, _)| self.group_of(&n.initiator) == group)
            .cloned()
            .collect();
        for key in affected {
            self.ua
                .entry(key)
                .or_default()
                .push(Asc::REPORTED_LUNS_DATA_CHANGED);
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
    /// ACA conditions in effect (`order.aca.len()`), so commands with
    /// NACA=0 skip the ACA rules without taking the lock when there are none.
    aca_live: AtomicUsize,
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

/// The key of a logical unit's task set and ACA condition.
fn lu_key(dev: &Arc<Device>) -> usize {
    Arc::as_ptr(dev) as usize
}

/// Task sets and ACA conditions, by logical unit ([`lu_key`]).
#[derive(Default)]
struct Order {
    sets: HashMap<usize, TaskSet>,
    aca: HashMap<usize, Aca>,
}

/// An ACA condition on one logical unit (SAM-5 5.9): a command with NACA=1
/// ended in CHECK CONDITION. The task set is shared by every nexus (the
/// control page's TST is 000b) and QERR is 00b: the tasks it holds are
/// blocked, not aborted, until the condition ends.
struct Aca {
    /// Holds the device, so its address (the key) is not reused meanwhile.
    _dev: Arc<Device>,
    /// The faulted I_T nexus.
    faulted: Nexus,
    /// The faulted nexus's ACA task in the task set (LUN, tag); one at a time.
    task: Option<(Lun, u64)>,
}

/// PERSISTENT RESERVE OUT with PREEMPT AND ABORT: the one command another
/// nexus may run during ACA, since it can end the condition (SPC-4
/// 5.12.11.2.6).
fn preempt_and_abort(cdb: &[u8]) -> bool {
    cdb.len() > 1 && cdb[0] == 0x5f && cdb[1] & 0x1f == 5
}

impl Order {
    /// Whether task `seq` of logical unit `k` may start now.
    fn may_start(&self, k: usize, seq: u64, attr: TaskAttr) -> bool {
        let aca = self.aca.contains_key(&k);
        self.sets
            .get(&k)
            .is_none_or(|s| s.may_start(seq, attr, aca))
    }

    /// The task manager's rules for a new command while an ACA condition
    /// may be in effect (SAM-5 5.9.2). `Ok(true)`: the command is the
    /// faulted nexus's ACA task. `Err`: the response that ends it now.
    fn admit(
        &mut self,
        k: usize,
        nexus: &Nexus,
        task: (Lun, u64),
        attr: TaskAttr,
        cdb: &[u8],
        expected: u64,
    ) -> Result<bool, ScsiResponse> {
        let refuse = |s| Err(ScsiResponse::status_only(s, expected));
        let Some(aca) = self.aca.get_mut(&k) else {
            if attr == TaskAttr::Aca {
                // SAM-5 8.6.5: an ACA task without an ACA condition.
                return Err(ScsiResponse::check(
                    Sense::new(SenseKey::IllegalRequest, Asc::INVALID_MESSAGE_ERROR),
                    expected,
                ));
            }
            return Ok(false);
        };
        if aca.faulted == *nexus {
            // SAM-5 5.9.2.2: the faulted nexus runs one ACA task at a time
            // and nothing else.
            if attr == TaskAttr::Aca && aca.task.is_none() {
                aca.task = Some(task);
                return Ok(true);
            }
            return refuse(Status::AcaActive);
        }
        // SAM-5 5.9.2.3, one task set for all nexuses: ACA ACTIVE to an
        // initiator that knows ACA (ACA attribute or NACA=1), BUSY to one
        // that may not.
        if attr == TaskAttr::Aca {
            return refuse(Status::AcaActive);
        }
        if preempt_and_abort(cdb) {
            return Ok(false);
        }
        refuse(if naca(cdb) {
            Status::AcaActive
        } else {
            Status::Busy
        })
    }

    /// After a command of `nexus` ended with `status` (SAM-5 5.9.1): a
    /// CHECK CONDITION with NACA=1 establishes ACA for the nexus; one that
    /// ends the ACA task (or a PREEMPT AND ABORT) during ACA keeps the
    /// condition (NACA=1, now for this nexus) or ends it (NACA=0).
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &mut self,
        k: usize,
        dev: &Arc<Device>,
        nexus: &Nexus,
        aca_task: Option<(Lun, u64)>,
        cdb: &[u8],
        status: Status,
    ) {
        if let Some(a) = self.aca.get_mut(&k) {
            if aca_task.is_some() && a.task == aca_task {
                a.task = None;
            }
        }
        if status != Status::CheckCondition {
            return;
        }
        let naca = naca(cdb) && dev.config.norm_aca;
        match self.aca.get_mut(&k) {
            None if naca => {
                self.aca.insert(
                    k,
                    Aca {
                        _dev: dev.clone(),
                        faulted: nexus.clone(),
                        task: None,
                    },
                );
            }
            None => {}
            Some(a) => {
                let owns = (aca_task.is_some() && a.faulted == *nexus) || preempt_and_abort(cdb);
                if owns && naca {
                    a.faulted = nexus.clone();
                } else if owns {
                    self.aca.remove(&k);
                }
            }
        }
    }
}

/// The tasks of one logical unit that entered the task set and have not
/// ended, by arrival number.
#[derive(Default)]
struct TaskSet {
    next: u64,
    active: BTreeMap<u64, TaskAttr>,
    /// Tasks in `active` per nexus (for TASK SET FULL against BUSY).
    per_nexus: HashMap<Nexus, usize>,
}

impl TaskSet {
    /// Whether task `seq` may start: an ORDERED task waits for every older
    /// task, any task waits for an older ORDERED one, HEAD OF QUEUE waits
    /// for nothing (SAM-5 8.6). While an ACA condition is in effect only
    /// the ACA task may start; the others are blocked (SAM-5 5.9.2.1).
    fn may_start(&self, seq: u64, attr: TaskAttr, aca: bool) -> bool {
        if aca {
            return attr == TaskAttr::Aca;
        }
        let mut older = self.active.range(..seq).map(|(_, a)| *a);
        match attr {
            TaskAttr::HeadOfQueue | TaskAttr::Aca => true,
            TaskAttr::Ordered => older.all(|a| a == TaskAttr::HeadOfQueue),
            TaskAttr::Simple => older.all(|a| a != TaskAttr::Ordered),
        }
    }
}

impl Target {
    pub fn new() -> Target {
        Target::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device `nexus` reaches at `lun` (what a transport labels its
    /// per-LUN counters with).
    pub fn device(&self, nexus: &Nexus, lun: Lun) -> Option<Arc<Device>> {
        self.lock().set_for(&nexus.initiator).get(&lun).cloned()
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
            self.order_cv.notify_all();
        }
        r
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

    /// Maps `dev` at `lun` in the default set (`group: None`) or in the
    /// group of initiator name `group`; returns the device it replaced.
    pub fn add_lun(&self, group: Option<&str>, lun: Lun, dev: Arc<Device>) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = match group {
            Some(g) => st.groups.entry(g.to_string()).or_default().insert(lun, dev),
            None => st.default.insert(lun, dev),
        };
        st.luns_changed(group);
        old
    }

    pub fn remove_lun(&self, group: Option<&str>, lun: Lun) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = match group {
            Some(g) => st.groups.get_mut(g).and_then(|s| s.remove(&lun)),
            None => st.default.remove(&lun),
        };
        if old.is_some() {
            st.luns_changed(group);
        }
        old
    }

    /// Creates an empty LUN group (no effect if it exists).
    pub fn add_group(&self, group: &str) {
        self.lock().groups.entry(group.to_string()).or_default();
    }

    /// Removes a group with its LUNs and memberships; its initiators fall
    /// back to the default set. Returns false if there was no such group.
    pub fn remove_group(&self, group: &str) -> bool {
        let mut st = self.lock();
        let existed = st.groups.remove(group).is_some();
        let before = st.members.len();
        let patterns: Vec<String> = st
            .members
            .iter()
            .filter(|(_, g)| g == group)
            .map(|(p, _)| p.clone())
            .collect();
        st.members.retain(|(_, g)| g != group);
        let removed_members = st.members.len() != before;
        if existed || removed_members {
            st.luns_changed_for(|i| i == group || patterns.iter().any(|p| initiator_matches(p, i)));
        }
        existed || removed_members
    }

    /// Adds initiator name `pattern` (a trailing `*` matches by prefix) to
    /// `group`, creating the group if needed. An initiator matching
    /// patterns of several groups belongs to the first added.
    pub fn add_initiator(&self, group: &str, pattern: &str) {
        let mut st = self.lock();
        st.groups.entry(group.to_string()).or_default();
        if !st.members.iter().any(|(p, g)| p == pattern && g == group) {
            st.members.push((pattern.to_string(), group.to_string()));
        }
        st.luns_changed_for(|i| initiator_matches(pattern, i));
    }

    /// Removes initiator `pattern` from `group`; false if it was not there.
    pub fn remove_initiator(&self, group: &str, pattern: &str) -> bool {
        let mut st = self.lock();
        let before = st.members.len();
        st.members.retain(|(p, g)| !(p == pattern && g == group));
        let removed = st.members.len() != before;
        if removed {
            st.luns_changed_for(|i| initiator_matches(pattern, i));
        }
        removed
    }

    /// A snapshot of the LUN maps: the default set, then each group with
    /// its initiator patterns.
    pub fn lun_maps(&self) -> LunMaps {
        let st = self.lock();
        let luns = |set: &LunSet| set.iter().map(|(l, d)| (*l, d.clone())).collect();
        let mut groups: Vec<GroupMap> = st
            .groups
            .iter()
            .map(|(name, set)| GroupMap {
                name: name.clone(),
                initiators: st
                    .members
                    .iter()
                    .filter(|(_, g)| g == name)
                    .map(|(p, _)| p.clone())
                    .collect(),
                luns: luns(set),
            })
            .collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        LunMaps {
            default: luns(&st.default),
            groups,
        }
    }

    /// The relative target port identifier of target port `name` (SPC-4
    /// 3.1.120): what PERSISTENT RESERVE OUT REGISTER AND MOVE names a
    /// port by and READ FULL STATUS reports. Assigned from 1 in the order
    /// ports are first seen (by a command or by this call).
    pub fn relative_port_id(&self, name: &str) -> u16 {
        self.lock().port_id(name)
    }

    /// Gives target port `name` relative port identifier `id` (SCST's
    /// `rel_tgt_id`; 0 is reserved and refused), before its first command.
    /// Identifiers numbered later do not avoid it: set every port's or none.
    pub fn set_relative_port_id(&self, name: &str, id: u16) -> Result<(), &'static str> {
        if id == 0 {
            return Err("relative port identifier 0 is reserved");
        }
        self.lock().ports.insert(name.to_string(), id);
        Ok(())
    }

    /// The LUNs `initiator` sees, as REPORT LUNS would list them.
    pub fn visible_luns(&self, initiator: &str) -> Vec<Lun> {
        self.lock().set_for(initiator).keys().copied().collect()
    }

    /// Resizes the device mapped at `lun` (in `group` or the default set) to
    /// `blocks` and raises CAPACITY DATA HAS CHANGED on every known nexus
    /// that reaches that device through any LUN (SBC-3 4.6).
    pub fn resize(&self, group: Option<&str>, lun: Lun, blocks: u64) -> std::io::Result<()> {
        let st = self.lock();
        let set = match group {
            Some(g) => st.groups.get(g),
            None => Some(&st.default),
        };
        let dev = set
            .and_then(|s| s.get(&lun))
            .cloned()
            .ok_or(std::io::ErrorKind::NotFound)?;
        dev.resize(blocks)?;
        drop(st);
        self.raise_where(&dev, Asc::CAPACITY_DATA_CHANGED, |_| true);
        Ok(())
    }

    /// Queues `asc` for every known nexus accepted by `which` that reaches
    /// `dev` through any LUN.
    fn raise_where(&self, dev: &Arc<Device>, asc: Asc, which: impl Fn(&Nexus) -> bool) {
        let st = &mut *self.lock();
        let affected: Vec<(Nexus, Lun)> = st
            .known
            .iter()
            .filter(|(n, l)| {
                which(n)
                    && st
                        .set_for(&n.initiator)
                        .get(l)
                        .is_some_and(|d| Arc::ptr_eq(d, dev))
            })
            .cloned()
            .collect();
        for key in affected {
            st.ua.entry(key).or_default().push(asc);
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
        key.and_then(|k| order.sets.get(&k))
            .map_or(0, |s| s.active.len())
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
        let Some(dev) = self.device(nexus, lun) else {
            return true; // answered from the LUN map alone
        };
        if !dev.never_blocks() {
            return false;
        }
        let key = lu_key(&dev);
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        !order.aca.contains_key(&key)
            && order
                .sets
                .get(&key)
                .is_none_or(|s| s.active.values().all(|a| *a == TaskAttr::Simple))
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
        // Only a WRITE takes its data-out in pieces; anything else that
        // has data-out parses it, so it gets it in one.
        let gathered;
        let (data_out, bufs) = match bufs {
            Some(b) if b.has_data_out() && !is_write(cdb) => {
                gathered = b.gather_data_out();
                (&gathered[..], None)
            }
            b => (data_out, b),
        };
        let Some(dev) = self.device(nexus, lun) else {
            // No logical unit: no task set, nothing but an error to run.
            return self.run_in_order(None, attr, nexus, lun, tag, cdb, data_out, expected, bufs);
        };
        let k = lu_key(&dev);
        let depth = dev.config.queue_depth.max(1) as usize;
        let entered = self.with_order(|o| {
            // SAM-5 5.3.1: no room in the task set, nothing runs; TASK
            // SET FULL to a nexus with tasks of its own there (it will
            // get room as they end), BUSY to one without.
            if let Some(set) = o.sets.get(&k).filter(|s| s.active.len() >= depth) {
                let status = if set.per_nexus.get(nexus).is_some_and(|&n| n > 0) {
                    Status::TaskSetFull
                } else {
                    Status::Busy
                };
                return Err(ScsiResponse::status_only(status, expected));
            }
            match o.admit(k, nexus, (lun, tag), attr, cdb, expected) {
                Err(r) => {
                    o.settle(k, &dev, nexus, None, cdb, r.status);
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
                    set.active.insert(seq, attr);
                    *set.per_nexus.entry(nexus.clone()).or_default() += 1;
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
            o.settle(k, &dev, nexus, aca_task, cdb, r.status);
            if let Some(set) = o.sets.get_mut(&k) {
                set.active.remove(&seq);
                if let Some(n) = set.per_nexus.get_mut(nexus) {
                    *n -= 1;
                    if *n == 0 {
                        set.per_nexus.remove(nexus);
                    }
                }
                if set.active.is_empty() {
                    o.sets.remove(&k);
                }
            }
        });
        self.order_cv.notify_all();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn run_in_order(
        &self,
        entry: Option<(usize, u64)>,
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
                order = self.order_cv.wait(order).unwrap_or_else(|e| e.into_inner());
            }
        }
        let r = if aborted() {
            None
        } else {
            Some(self.run(nexus, lun, cdb, data_out, expected, bufs))
        };
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finish(nexus, lun, tag);
        match r {
            Some(r) if !aborted() => r,
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
        self.order_cv.notify_all();
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
            return self.run(nexus, lun, cdb, data_out, expected, None);
        }
        let Some(dev) = self.device(nexus, lun) else {
            return self.run(nexus, lun, cdb, data_out, expected, None);
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
        let r = self.run(nexus, lun, cdb, data_out, expected, None);
        self.with_order(|o| o.settle(k, &dev, nexus, None, cdb, r.status));
        r
    }

    /// Runs one command once the task manager has let it start.
    fn run(
        &self,
        nexus: &Nexus,
        lun: Lun,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        mut bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let cmd = match Command::parse(cdb) {
            Ok((_, c)) => c,
            Err(s) => return ScsiResponse::check(s, expected),
        };
        let mut st = self.lock();
        let rtpi = st.port_id(&nexus.target_port);
        let dev = st.set_for(&nexus.initiator).get(&lun).cloned();
        let bs = dev.as_ref().map_or(512, |d| d.block_size());
        let d_sense = dev.as_ref().is_some_and(|d| d.mode_state().d_sense);
        if let Err(s) = naca_supported(dev.as_deref(), cdb) {
            return ScsiResponse {
                descriptor_sense: d_sense,
                ..ScsiResponse::check(s, expected)
            };
        }
        let result = match (&cmd, dev) {
            (Command::ReportLuns { select, .. }, _) => {
                let luns: Vec<Lun> = st.set_for(&nexus.initiator).keys().copied().collect();
                if dev_known(&st, nexus, lun) {
                    st.ua_mut(nexus, lun).clear(Asc::REPORTED_LUNS_DATA_CHANGED);
                }
                report_luns(*select, &luns)
            }
            (Command::RequestSense { desc, .. }, dev) => {
                // SPC-4 6.29: a pending unit attention is reported (and
                // cleared) as the parameter data.
                let sense = match dev {
                    None => Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED),
                    Some(_) => match st.ua_mut(nexus, lun).pop() {
                        Some(asc) => Sense::new(SenseKey::UnitAttention, asc),
                        None => Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL),
                    },
                };
                Ok(if *desc {
                    sense.to_descriptor()
                } else {
                    sense.to_fixed()
                })
            }
            (Command::Inquiry { evpd: false, .. }, None) => {
                // SPC-4 6.6.2: peripheral qualifier 011b, type 1Fh for a LUN
                // that is not mapped.
                let mut d = vec![0u8; 36];
                d[0] = 0x7f;
                d[2] = 0x06;
                d[3] = 0x02;
                d[4] = 31;
                Ok(d)
            }
            (_, None) => Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::LOGICAL_UNIT_NOT_SUPPORTED,
            )),
            (cmd, Some(dev)) => {
                let ua = st.ua_mut(nexus, lun);
                // INQUIRY is never blocked by a unit attention (SAM-5 5.14).
                let blocked = !matches!(cmd, Command::Inquiry { .. });
                match if blocked { ua.pop() } else { None } {
                    Some(asc) => Err(Sense::new(SenseKey::UnitAttention, asc)),
                    None => {
                        let ports = match cmd {
                            Command::PrIn { .. } | Command::PrOut { .. } => st.ports.clone(),
                            _ => BTreeMap::new(),
                        };
                        // REGISTER AND MOVE: whether the initiator its
                        // TransportID names reaches this LU at all.
                        let move_dest_sees_lu = match cmd {
                            Command::PrOut { sa: 7, .. } => data_out
                                .get(24..)
                                .and_then(|b| TransportId::parse(b).ok())
                                .is_none_or(|(id, _)| {
                                    st.set_for(&id.initiator_name())
                                        .values()
                                        .any(|d| Arc::ptr_eq(d, &dev))
                                }),
                            _ => true,
                        };
                        drop(st);
                        let env = crate::pr::PrEnv {
                            ports: &ports,
                            ptpl_capable: dev.config.pr_file.is_some(),
                            move_dest_sees_lu,
                        };
                        let conflict = ScsiResponse {
                            descriptor_sense: d_sense,
                            ..ScsiResponse::status_only(Status::ReservationConflict, expected)
                        };
                        match cmd {
                            Command::PrIn { sa, .. } => dev
                                .pr
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .pr_in(*sa, env),
                            Command::PrOut {
                                sa,
                                type_byte,
                                param_len,
                            } => {
                                let p = data_out.get(..*param_len as usize).unwrap_or(data_out);
                                let mut pr = dev.pr.lock().unwrap_or_else(|e| e.into_inner());
                                let r = pr.pr_out(nexus, *sa, *type_byte, p, env);
                                if r.is_ok() && dev.persist_pr(&pr).is_err() {
                                    // SPC-4 5.9.5: the state could not be kept; say so.
                                    return ScsiResponse::check(
                                        Sense::new(SenseKey::HardwareError, Asc::WRITE_ERROR),
                                        expected,
                                    );
                                }
                                drop(pr);
                                match r {
                                    Ok(notices) => {
                                        if *sa == 5 {
                                            // PREEMPT AND ABORT: the preempted nexuses'
                                            // tasks on this LU are aborted (SPC-4 5.9.11.5).
                                            let victims: Vec<&Nexus> =
                                                notices.iter().map(|(n, _)| n).collect();
                                            self.tasks
                                                .lock()
                                                .unwrap_or_else(|e| e.into_inner())
                                                .abort(|n, l, _| l == lun && victims.contains(&n));
                                            // ... and their ACA condition ends
                                            // (SPC-4 5.12.11.2.6).
                                            let k = lu_key(&dev);
                                            self.clear_aca(false, |key, a| {
                                                key == k && victims.contains(&&a.faulted)
                                            });
                                        }
                                        for (n, asc) in notices {
                                            self.raise_where(&dev, asc, |x| *x == n);
                                        }
                                        Ok(Vec::new())
                                    }
                                    Err(PrError::Conflict) => return conflict,
                                    Err(PrError::Check(s)) => Err(s),
                                }
                            }
                            _ => {
                                if dev
                                    .pr
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .conflicts(nexus, cmd)
                                {
                                    return conflict;
                                }
                                let before = dev.mode_state();
                                let mut r =
                                    dev.execute_into(cmd, cdb, data_out, bufs.as_deref_mut());
                                if let (
                                    Command::Inquiry {
                                        page: 0x83,
                                        evpd: true,
                                        ..
                                    },
                                    Ok(d),
                                ) = (cmd, &mut r)
                                {
                                    add_relative_port(d, rtpi);
                                }
                                if dev.mode_state() != before {
                                    // SPC-4 6.9: other nexuses learn of the change.
                                    self.raise_where(&dev, Asc::MODE_PARAMETERS_CHANGED, |x| {
                                        x != nexus
                                    });
                                }
                                r
                            }
                        }
                    }
                }
            }
        };
        match result {
            Err(s) => ScsiResponse {
                descriptor_sense: d_sense,
                ..ScsiResponse::check(s, expected)
            },
            Ok(mut data) => {
                let plan = cmd.plan(bs);
                let moved = match plan.dir {
                    DataDir::In => {
                        let room = plan.len.min(expected);
                        data.truncate(room as usize);
                        match bufs {
                            Some(bufs) => {
                                if bufs.placed.is_none() {
                                    bufs.copy_in(&data);
                                    data = Vec::new();
                                }
                                (bufs.placed() as u64).min(room)
                            }
                            None => data.len() as u64,
                        }
                    }
                    DataDir::Out => {
                        let pieces = bufs.as_ref().map_or(0, |b| b.data_out_len());
                        plan.len.min(expected).min((data_out.len() + pieces) as u64)
                    }
                    DataDir::None => 0,
                };
                ScsiResponse {
                    status: Status::Good,
                    sense: None,
                    data_in: data,
                    residual: Residual::of(expected, plan.len, moved),
                    descriptor_sense: d_sense,
                }
            }
        }
    }
}

/// WRITE(6/10/12/16): the commands whose data-out the store takes in
/// pieces ([`Buffers::data_out`]).
fn is_write(cdb: &[u8]) -> bool {
    matches!(cdb.first(), Some(0x0a | 0x2a | 0xaa | 0x8a))
}

/// NACA=1 needs a logical unit with NormACA (SAM-5 5.3, SPC-4 6.6.2);
/// otherwise the CONTROL byte's bit 2 is an invalid field.
fn naca_supported(dev: Option<&Device>, cdb: &[u8]) -> Result<(), Sense> {
    match control_byte(cdb) {
        Some((at, c)) if c & 0x04 != 0 && !dev.is_some_and(|d| d.config.norm_aca) => {
            Err(Sense::invalid_field(at as u16, Some(2)))
        }
        _ => Ok(()),
    }
}

/// Appends the relative target port designator of the nexus's port to
/// device identification VPD data (SPC-4 7.8.6.6: association 01b target
/// port, type 4, PIV 0), so an initiator learns the identifier REGISTER AND
/// MOVE takes.
fn add_relative_port(page: &mut Vec<u8>, rtpi: u16) {
    page.extend_from_slice(&[0x01, 0x14, 0x00, 0x04, 0, 0]);
    page.extend_from_slice(&rtpi.to_be_bytes());
    let len = (page.len().saturating_sub(4)).min(0xffff) as u16;
    if let Some(h) = page.get_mut(2..4) {
        h.copy_from_slice(&len.to_be_bytes());
    }
}

fn dev_known(st: &State, nexus: &Nexus, lun: Lun) -> bool {
    st.set_for(&nexus.initiator).contains_key(&lun)
}

/// SPC-4 6.33 REPORT LUNS parameter data. SELECT REPORT 0, 1 (well-known:
/// none here, so empty) and 2 are accepted.
fn report_luns(select: u8, luns: &[Lun]) -> Result<Vec<u8>, Sense> {
    let list: &[Lun] = match select {
        0 | 2 => luns,
        1 => &[],
        _ => return Err(Sense::invalid_field(2, None)),
    };
    let mut d = ((list.len() * 8) as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&[0; 4]);
    for l in list {
        d.extend_from_slice(&l.encode());
    }
    Ok(d)
}
