//! What the target says changed under the initiator, and who waits for it.
//!
//! A target reports a LUN added or removed with the unit attention
//! REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh) and a resized LUN with
//! CAPACITY DATA HAS CHANGED (2Ah/09h) (SPC-4 table D.1), each on the next
//! command of every nexus it concerns; an SRP target also says it at once
//! in an SRP_AER_REQ carrying the same sense data (SRP r16a 6.12), which
//! reaches an idle initiator. Either way the initiator must look again
//! (REPORT LUNS, READ CAPACITY): that is the rescan the SCSI midlayer does
//! on these sense codes, and `srpd` does on a [`TargetChanges`].
//!
//! A [`TargetChanges`] is shared by every session of one login (sessions
//! take it from [`crate::session::SessionConfig::changes`], so it outlives
//! reconnects) and by whoever rescans. Noting a change only bumps a
//! counter under a short lock and wakes the waiter: no callback runs in
//! the session's poll thread.

use scsi::sense::{decode_key_asc, Asc};
use scsi::SenseKey;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What one sense datum says changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// REPORTED LUNS DATA HAS CHANGED: LUNs came or went.
    Luns,
    /// CAPACITY DATA HAS CHANGED: a LUN was resized.
    Capacity,
}

impl Change {
    /// The change a unit attention's (or an AER's) sense data reports;
    /// `None` for any other sense.
    pub fn of_sense(sense: &[u8]) -> Option<Change> {
        match decode_key_asc(sense)? {
            (SenseKey::UnitAttention, Asc::REPORTED_LUNS_DATA_CHANGED) => Some(Change::Luns),
            (SenseKey::UnitAttention, Asc::CAPACITY_DATA_CHANGED) => Some(Change::Capacity),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Bumped on every change noted (or rescan asked for).
    generation: u64,
    closed: bool,
}

/// Changes of one target, counted, for one waiter that rescans.
#[derive(Debug, Default)]
pub struct TargetChanges {
    st: Mutex<State>,
    cv: Condvar,
}

impl TargetChanges {
    /// No change seen yet.
    pub fn new() -> TargetChanges {
        TargetChanges::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a change (or a rescan asked for by hand) and wakes the waiter.
    pub fn note(&self) {
        self.lock().generation += 1;
        self.cv.notify_all();
    }

    /// Notes the change `sense` reports, if it reports one; returns it.
    pub fn note_sense(&self, sense: &[u8]) -> Option<Change> {
        let c = Change::of_sense(sense)?;
        self.note();
        Some(c)
    }

    /// Changes noted so far.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Waits at most `timeout` for a change after generation `seen`;
    /// returns the generation then (`seen` if none came), or `None` once
    /// [`TargetChanges::close`] was called.
    pub fn wait_past(&self, seen: u64, timeout: Duration) -> Option<u64> {
        let st = self.lock();
        let (st, _) = self
            .cv
            .wait_timeout_while(st, timeout, |s| s.generation == seen && !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        (!st.closed).then_some(st.generation)
    }

    /// Ends every wait, now and later (the login is going).
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scsi::sense::Sense;

    #[test]
    fn the_two_sense_codes_are_changes_and_others_are_not() {
        let ua = |asc| Sense::new(SenseKey::UnitAttention, asc).to_fixed();
        assert_eq!(
            Change::of_sense(&ua(Asc::REPORTED_LUNS_DATA_CHANGED)),
            Some(Change::Luns)
        );
        assert_eq!(
            Change::of_sense(&ua(Asc::CAPACITY_DATA_CHANGED)),
            Some(Change::Capacity)
        );
        assert_eq!(Change::of_sense(&ua(Asc(0x29, 0x00))), None, "power on");
        let not_ua = Sense::new(SenseKey::IllegalRequest, Asc::CAPACITY_DATA_CHANGED).to_fixed();
        assert_eq!(Change::of_sense(&not_ua), None);
        assert_eq!(Change::of_sense(&[0x70, 0]), None, "too short");
    }

    #[test]
    fn a_waiter_sees_changes_noted_before_and_during_its_wait() {
        let c = std::sync::Arc::new(TargetChanges::new());
        let seen = c.generation();
        assert_eq!(c.wait_past(seen, Duration::ZERO), Some(seen));
        let ua = Sense::new(SenseKey::UnitAttention, Asc::CAPACITY_DATA_CHANGED).to_fixed();
        assert_eq!(c.note_sense(&ua), Some(Change::Capacity));
        assert_eq!(c.wait_past(seen, Duration::ZERO), Some(seen + 1));
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.wait_past(seen + 1, Duration::from_secs(30)));
        c.note();
        assert_eq!(t.join().unwrap(), Some(seen + 2));
        c.close();
        assert_eq!(c.wait_past(seen + 2, Duration::from_secs(30)), None);
    }
}
