//! Task management (SAM-5 7): commands in flight are tracked per (nexus,
//! LUN, tag); a task management function marks them aborted, and an aborted
//! command completes as TASK ABORTED, never GOOD, even if its I/O finished.
//!
//! Execution stays on the caller's thread (`Target::submit`); the TMF is
//! called from any other thread. Task attributes and ACA conditions are
//! the target's (`Target::submit_attr`).

use crate::lun::Lun;
use crate::target::Nexus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A task management function (SAM-5 7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tmf {
    AbortTask(u64),
    AbortTaskSet,
    ClearTaskSet,
    LogicalUnitReset,
    ItNexusReset,
    /// Ends the ACA condition of the logical unit if this nexus is the
    /// faulted one, aborting its ACA task (SAM-5 7.3).
    ClearAca,
}

/// Service response of a TMF (SAM-5 7.11), as [`crate::Target::tmf`]
/// gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceResponse {
    FunctionComplete,
    /// The function was refused (CLEAR ACA from a nexus that is not the
    /// faulted one).
    FunctionRejected,
    IncorrectLun,
}

/// The two outcomes [`crate::Target::task_management`] reports, for
/// transports written before CLEAR ACA: a rejected function shows as
/// `IncorrectLun` (both are a failed function to SRP, r16a table 24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfResponse {
    FunctionComplete,
    IncorrectLun,
}

impl From<ServiceResponse> for TmfResponse {
    fn from(r: ServiceResponse) -> TmfResponse {
        match r {
            ServiceResponse::FunctionComplete => TmfResponse::FunctionComplete,
            ServiceResponse::FunctionRejected | ServiceResponse::IncorrectLun => {
                TmfResponse::IncorrectLun
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct Tasks {
    live: crate::target::FastMap<(Nexus, Lun, u64), Arc<AtomicBool>>,
    /// Abort flags of ended tasks, for the next ones (no allocation per
    /// task). An ended task's own copy is never read again: `finish`
    /// hands it the flag's last value.
    spare: Vec<Arc<AtomicBool>>,
}

/// Abort flags kept for reuse, at most.
const SPARE_FLAGS: usize = 256;

impl Tasks {
    /// Registers a task; `None` if the tag is already in use on the nexus
    /// (OVERLAPPED COMMANDS ATTEMPTED, SAM-5 5.8.3).
    pub(crate) fn start(&mut self, n: &Nexus, lun: Lun, tag: u64) -> Option<Arc<AtomicBool>> {
        // One search, one clone of the nexus.
        match self.live.entry((n.clone(), lun, tag)) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(v) => {
                let flag = match self.spare.pop() {
                    Some(f) => {
                        f.store(false, Ordering::SeqCst);
                        f
                    }
                    None => Arc::new(AtomicBool::new(false)),
                };
                Some(v.insert(flag).clone())
            }
        }
    }

    /// Ends a task; whether it was aborted. Nothing marks it after this,
    /// so the answer is final, and its flag may serve another task.
    pub(crate) fn finish(&mut self, n: &Nexus, lun: Lun, tag: u64) -> bool {
        let Some(flag) = self.live.remove(&(n.clone(), lun, tag)) else {
            return false;
        };
        let aborted = flag.load(Ordering::SeqCst);
        if self.spare.len() < SPARE_FLAGS {
            self.spare.push(flag);
        }
        aborted
    }

    /// Marks matching tasks aborted; returns the nexuses that lost tasks.
    pub(crate) fn abort(&mut self, which: impl Fn(&Nexus, Lun, u64) -> bool) -> Vec<Nexus> {
        let mut hit = Vec::new();
        for ((n, l, t), f) in &self.live {
            if which(n, *l, *t) {
                f.store(true, Ordering::SeqCst);
                hit.push(n.clone());
            }
        }
        hit.sort();
        hit.dedup();
        hit
    }
}
