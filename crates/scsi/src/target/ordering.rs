//! Task ordering per logical unit: SIMPLE, ORDERED, HEAD OF QUEUE and ACA
//! tasks admitted and settled in the order SAM asks, and the ACA state.

use super::*;

/// The key of a logical unit's task set and ACA condition.
pub(super) fn lu_key(dev: &Arc<Device>) -> usize {
    Arc::as_ptr(dev) as usize
}

/// Task sets and ACA conditions, by logical unit ([`lu_key`]).
#[derive(Default)]
pub(super) struct Order {
    pub(super) sets: FastMap<usize, TaskSet>,
    pub(super) aca: FastMap<usize, Aca>,
}

/// An ACA condition on one logical unit (SAM-5 5.9): a command with NACA=1
/// ended in CHECK CONDITION. The task set is shared by every nexus (the
/// control page's TST is 000b) and QERR is 00b: the tasks it holds are
/// blocked, not aborted, until the condition ends.
pub(super) struct Aca {
    /// Holds the device, so its address (the key) is not reused meanwhile.
    pub(super) _dev: Arc<Device>,
    /// The faulted I_T nexus.
    pub(super) faulted: Nexus,
    /// The faulted nexus's ACA task in the task set (LUN, tag); one at a time.
    pub(super) task: Option<(Lun, u64)>,
}

/// PERSISTENT RESERVE OUT with PREEMPT AND ABORT: the one command another
/// nexus may run during ACA, since it can end the condition (SPC-4
/// 5.12.11.2.6).
pub(super) fn preempt_and_abort(cdb: &[u8]) -> bool {
    cdb.len() > 1 && cdb[0] == 0x5f && cdb[1] & 0x1f == 5
}

impl Order {
    /// Whether task `seq` of logical unit `k` may start now.
    pub(super) fn may_start(&self, k: usize, seq: u64, attr: TaskAttr) -> bool {
        let aca = self.aca.contains_key(&k);
        self.sets
            .get(&k)
            .is_none_or(|s| s.may_start(seq, attr, aca))
    }

    /// The task manager's rules for a new command while an ACA condition
    /// may be in effect (SAM-5 5.9.2). `Ok(true)`: the command is the
    /// faulted nexus's ACA task. `Err`: the response that ends it now.
    pub(super) fn admit(
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
    pub(super) fn settle(
        &mut self,
        k: usize,
        dev: &Arc<Device>,
        nexus: &Nexus,
        aca_task: Option<(Lun, u64)>,
        cdb: &[u8],
        status: Status,
    ) {
        if aca_task.is_none() && status != Status::CheckCondition {
            return;
        }
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
pub(super) struct TaskSet {
    pub(super) next: u64,
    active: BTreeMap<u64, TaskAttr>,
    /// Tasks in `active` that are not SIMPLE: while there are none, a
    /// SIMPLE task starts without a look at the others.
    not_simple: usize,
    /// Tasks in `active` per nexus (for TASK SET FULL against BUSY).
    pub(super) per_nexus: FastMap<Nexus, usize>,
    /// The nexuses of the SIMPLE tasks running inline (see
    /// [`Target::submit_routed`]), one entry each: they are in the set
    /// (its length, an ORDERED task's wait) without a number in `active`.
    pub(super) inline: Vec<Nexus>,
}

impl TaskSet {
    /// Task `seq` entered the set.
    pub(super) fn enter(&mut self, seq: u64, attr: TaskAttr) {
        if attr != TaskAttr::Simple {
            self.not_simple += 1;
        }
        if let Some(old) = self.active.insert(seq, attr) {
            // Never: each task has a number of its own.
            if old != TaskAttr::Simple {
                self.not_simple -= 1;
            }
        }
    }

    /// Task `seq` ended; whether it was not SIMPLE.
    pub(super) fn leave(&mut self, seq: u64) -> bool {
        let not_simple = self
            .active
            .remove(&seq)
            .is_some_and(|a| a != TaskAttr::Simple);
        if not_simple {
            self.not_simple -= 1;
        }
        not_simple
    }

    /// Tasks in the set.
    pub(super) fn len(&self) -> usize {
        self.active.len() + self.inline.len()
    }

    /// Whether `nexus` has a task in the set (TASK SET FULL, not BUSY,
    /// when there is no room).
    pub(super) fn has_tasks_of(&self, nexus: &Nexus) -> bool {
        self.per_nexus.get(nexus).is_some_and(|&n| n > 0) || self.inline.contains(nexus)
    }

    /// An inline task of `nexus` ended.
    pub(super) fn leave_inline(&mut self, nexus: &Nexus) {
        if let Some(i) = self.inline.iter().position(|n| n == nexus) {
            self.inline.swap_remove(i);
        }
    }

    /// Whether every task in the set is SIMPLE.
    pub(super) fn all_simple(&self) -> bool {
        self.not_simple == 0
    }

    /// Whether task `seq` may start: an ORDERED task waits for every older
    /// task, any task waits for an older ORDERED one, HEAD OF QUEUE waits
    /// for nothing (SAM-5 8.6). While an ACA condition is in effect only
    /// the ACA task may start; the others are blocked (SAM-5 5.9.2.1).
    pub(super) fn may_start(&self, seq: u64, attr: TaskAttr, aca: bool) -> bool {
        if aca {
            return attr == TaskAttr::Aca;
        }
        if attr == TaskAttr::Simple && self.all_simple() {
            return true;
        }
        let mut older = self.active.range(..seq).map(|(_, a)| *a);
        match attr {
            TaskAttr::HeadOfQueue | TaskAttr::Aca => true,
            // Inline tasks entered while the set was all SIMPLE: each is
            // older than any ORDERED task.
            TaskAttr::Ordered => {
                self.inline.is_empty() && older.all(|a| a == TaskAttr::HeadOfQueue)
            }
            TaskAttr::Simple => older.all(|a| a != TaskAttr::Ordered),
        }
    }
}
