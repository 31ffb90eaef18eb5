//! ALUA on the target (SPC-4 5.16): the target port groups kept with the
//! LUN maps, the commands a group's state refuses, REPORT and SET TARGET
//! PORT GROUPS, and the unit attention a change raises.

use super::*;
use crate::alua::{parse_set, AccessState, Alua, StatusCode};

/// Why a group's state was not changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AluaError {
    #[error("no target port group {0} (the groups are {1})")]
    NoGroup(u16, String),
}

impl Target {
    /// Replaces the target port groups (srptd's configuration, at start
    /// and on reload). When a group's state, or the group of a port,
    /// differs from before, every nexus that has reached a logical unit
    /// gets ASYMMETRIC ACCESS STATE CHANGED (2A/06). Returns whether it
    /// did.
    pub fn set_alua(&self, alua: Alua) -> bool {
        let mut st = self.lock();
        let changed = alua_differs(&st.alua, &alua);
        st.alua = alua;
        if changed {
            st.alua_changed(None);
        }
        changed
    }

    /// The target port groups as they are now.
    pub fn alua(&self) -> Alua {
        self.lock_to_read().alua.clone()
    }

    /// An implicit transition (SPC-4 5.16.2.7: `srptadm`, a cluster
    /// manager): group `id` goes to `state`, and every nexus that has
    /// reached a logical unit gets ASYMMETRIC ACCESS STATE CHANGED.
    /// Returns the state it left (the same state again raises nothing).
    ///
    /// # Errors
    /// No group has that identifier.
    pub fn set_group_state(&self, id: u16, state: AccessState) -> Result<AccessState, AluaError> {
        let mut st = self.lock();
        let ids: Vec<String> = st.alua.groups.iter().map(|g| g.id.to_string()).collect();
        let Some(g) = st.alua.groups.iter_mut().find(|g| g.id == id) else {
            let list = if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            };
            return Err(AluaError::NoGroup(id, list));
        };
        let old = g.state;
        if old != state {
            g.state = state;
            g.status = StatusCode::Implicit;
            st.alua_changed(None);
        }
        Ok(old)
    }
}

/// Whether two settings differ in what an initiator sees of the groups.
fn alua_differs(a: &Alua, b: &Alua) -> bool {
    let key = |x: &Alua| {
        let mut v: Vec<(u16, AccessState, bool, Vec<u16>)> = x
            .groups
            .iter()
            .map(|g| {
                let mut p = g.ports.clone();
                p.sort();
                (g.id, g.state, g.preferred, p)
            })
            .collect();
        v.sort_by_key(|e| e.0);
        (v, x.explicit)
    };
    key(a) != key(b)
}

impl State {
    /// Raises ASYMMETRIC ACCESS STATE CHANGED on every known nexus and
    /// LUN that reaches a logical unit, but `except` (the nexus of a SET
    /// TARGET PORT GROUPS, SPC-4 5.16.2.8). Every logical unit is in the
    /// one logical unit group, so every nexus learns of any change:
    /// an initiator told through its other path finds the new state too.
    pub(super) fn alua_changed(&mut self, except: Option<&Nexus>) {
        let affected: Vec<(Nexus, Lun)> = self
            .known
            .iter()
            .filter(|(n, l)| {
                Some(n) != except && self.set_for(&n.initiator, &n.target_port).contains_key(l)
            })
            .cloned()
            .collect();
        for key in affected {
            self.ua
                .entry(key)
                .or_default()
                .push(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
    }

    /// The ALUA side of a command to a mapped logical unit, after unit
    /// attentions: `Some` with the answer when ALUA decides it (a state
    /// refusing it, REPORT or SET TARGET PORT GROUPS), `None` to run it.
    /// `rtpi` is the relative identifier of the nexus's target port.
    pub(super) fn alua_command(
        &mut self,
        nexus: &Nexus,
        rtpi: u16,
        cmd: &Command,
        cdb: &[u8],
        data_out: &[u8],
    ) -> Option<Result<Vec<u8>, Sense>> {
        if let Some(g) = self.alua.group_of(rtpi) {
            if let Err(s) = g.state.admit(cdb) {
                return Some(Err(s));
            }
        }
        // Without groups (TPGS 00b) neither command is supported: the
        // service action is the invalid field, as for any other unknown.
        let unsupported = Sense::invalid_field(1, Some(4));
        match *cmd {
            Command::ReportTargetPortGroups { extended, .. } => {
                Some(if self.alua.groups.is_empty() {
                    Err(unsupported)
                } else {
                    Ok(self.alua.report(extended))
                })
            }
            Command::SetTargetPortGroups { param_len } => {
                if self.alua.groups.is_empty() || !self.alua.explicit {
                    return Some(Err(unsupported));
                }
                let p = data_out.get(..param_len as usize).unwrap_or(data_out);
                let known: Vec<u16> = self.alua.groups.iter().map(|g| g.id).collect();
                Some(parse_set(p, &known).map(|set| {
                    let mut changed = false;
                    for (id, state) in set {
                        if let Some(g) = self.alua.groups.iter_mut().find(|g| g.id == id) {
                            changed |= g.state != state;
                            g.state = state;
                            g.status = StatusCode::Explicit;
                        }
                    }
                    if changed {
                        self.alua_changed(Some(nexus));
                    }
                    Vec::new()
                }))
            }
            _ => None,
        }
    }

    /// What INQUIRY adds for ALUA: the TPGS field, and the group of the
    /// target port of relative identifier `rtpi` for VPD 83h.
    pub(super) fn alua_inquiry(&self, rtpi: u16) -> (u8, Option<u16>) {
        (self.alua.tpgs(), self.alua.group_of(rtpi).map(|g| g.id))
    }
}
