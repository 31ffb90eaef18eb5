//! Persistent reservations (SPC-4 5.9, 6.15-6.16): registrations per I_T
//! nexus, one reservation per logical unit, conflict rules of SPC-4
//! table 48 (simplified to read/write/other classes).

use crate::cdb::Command;
use crate::sense::{Asc, Sense, SenseKey};
use crate::target::Nexus;
use std::collections::BTreeMap;

/// Reservation type (SPC-4 table 202).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    fn from_u8(v: u8) -> Option<PrType> {
        Some(match v {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
    fn registrants_share(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }
    fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

#[derive(Debug, Clone, Default)]
pub struct PrState {
    generation: u32,
    keys: BTreeMap<Nexus, u64>,
    /// Holder (ignored for all-registrants types) and type.
    reservation: Option<(Nexus, PrType)>,
    /// Activate persist through power loss (SPC-4 5.9.5), set by REGISTER.
    aptpl: bool,
}

/// Unit attentions a PR OUT leaves for other nexuses.
pub type Notices = Vec<(Nexus, Asc)>;

/// Failure of a PR OUT: RESERVATION CONFLICT status or CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrError {
    Conflict,
    Check(Sense),
}

impl From<Sense> for PrError {
    fn from(s: Sense) -> PrError {
        PrError::Check(s)
    }
}

fn conflict() -> PrError {
    PrError::Conflict
}

impl PrState {
    fn holds(&self, n: &Nexus) -> bool {
        match &self.reservation {
            Some((_, t)) if t.all_registrants() => self.keys.contains_key(n),
            Some((h, _)) => h == n,
            None => false,
        }
    }

    /// SPC-4 5.9.1: does `cmd` from `n` conflict with the reservation?
    pub fn conflicts(&self, n: &Nexus, cmd: &Command) -> bool {
        let Some((_, t)) = &self.reservation else {
            return false;
        };
        if self.holds(n) || (t.registrants_share() && self.keys.contains_key(n)) {
            return false;
        }
        match cmd {
            Command::Read { .. } | Command::Verify { .. } => t.exclusive_access(),
            Command::Write { .. }
            | Command::WriteSame { .. }
            | Command::Unmap { .. }
            | Command::CompareAndWrite { .. }
            | Command::ModeSelect { .. }
            | Command::SyncCache { .. } => true,
            _ => false,
        }
    }

    /// PERSISTENT RESERVE IN: READ KEYS (0) or READ RESERVATION (1).
    pub fn pr_in(&self, sa: u8) -> Result<Vec<u8>, Sense> {
        let mut d = self.generation.to_be_bytes().to_vec();
        match sa {
            0 => {
                d.extend_from_slice(&((self.keys.len() * 8) as u32).to_be_bytes());
                for k in self.keys.values() {
                    d.extend_from_slice(&k.to_be_bytes());
                }
            }
            1 => match &self.reservation {
                None => d.extend_from_slice(&[0; 4]),
                Some((h, t)) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    let key = if t.all_registrants() {
                        0
                    } else {
                        self.keys.get(h).copied().unwrap_or(0)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, *t as u8, 0, 0]);
                }
            },
            _ => return Err(Sense::invalid_field(1, Some(4))),
        }
        Ok(d)
    }

    /// PERSISTENT RESERVE OUT. Returns the unit attentions to raise.
    pub fn pr_out(
        &mut self,
        n: &Nexus,
        sa: u8,
        type_byte: u8,
        p: &[u8],
    ) -> Result<Notices, PrError> {
        if p.len() < 24 {
            return Err(
                Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR).into(),
            );
        }
        let key = u64::from_be_bytes(p[0..8].try_into().unwrap_or([0; 8]));
        let sa_key = u64::from_be_bytes(p[8..16].try_into().unwrap_or([0; 8]));
        let mine = self.keys.get(n).copied();
        let mut notices = Notices::new();
        match sa {
            0 | 6 => {
                // REGISTER / REGISTER AND IGNORE EXISTING KEY.
                if sa == 0 && mine.unwrap_or(0) != key {
                    return Err(conflict());
                }
                self.aptpl = p[20] & 0x01 != 0;
                if sa_key == 0 {
                    if mine.is_some() {
                        self.unregister(n, &mut notices);
                    }
                } else {
                    self.keys.insert(n.clone(), sa_key);
                }
                self.generation = self.generation.wrapping_add(1);
            }
            1 => {
                let t = PrType::from_u8(type_byte & 0x0f)
                    .ok_or(PrError::Check(Sense::invalid_field(2, None)))?;
                if mine != Some(key) {
                    return Err(conflict());
                }
                match &self.reservation {
                    None => self.reservation = Some((n.clone(), t)),
                    Some((_, cur)) if *cur == t && self.holds(n) => {}
                    Some(_) => return Err(conflict()),
                }
            }
            2 => {
                if mine != Some(key) {
                    return Err(conflict());
                }
                if let Some((_, cur)) = self.reservation {
                    if !self.holds(n) {
                        return Ok(notices);
                    }
                    if cur as u8 != type_byte & 0x0f {
                        return Err(Sense::new(
                            SenseKey::IllegalRequest,
                            Asc::INVALID_RELEASE_OF_PR,
                        )
                        .into());
                    }
                    self.reservation = None;
                    if cur.registrants_share() {
                        self.notify_others(n, Asc::RESERVATIONS_RELEASED, &mut notices);
                    }
                }
            }
            3 => {
                if mine != Some(key) {
                    return Err(conflict());
                }
                self.notify_others(n, Asc::RESERVATIONS_PREEMPTED, &mut notices);
                self.keys.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
            }
            4 | 5 => {
                // PREEMPT (AND ABORT; no tasks are ever queued in this core).
                let t = PrType::from_u8(type_byte & 0x0f)
                    .ok_or(PrError::Check(Sense::invalid_field(2, None)))?;
                if mine != Some(key) {
                    return Err(conflict());
                }
                let victims: Vec<Nexus> = self
                    .keys
                    .iter()
                    .filter(|(v, &k)| k == sa_key && *v != n)
                    .map(|(v, _)| v.clone())
                    .collect();
                let holder_key = self
                    .reservation
                    .as_ref()
                    .and_then(|(h, _)| self.keys.get(h).copied());
                if victims.is_empty() && holder_key != Some(sa_key) && sa_key != key {
                    return Err(conflict());
                }
                if self.reservation.is_some()
                    && (holder_key == Some(sa_key)
                        || self
                            .reservation
                            .as_ref()
                            .is_some_and(|(_, t)| t.all_registrants()))
                {
                    self.reservation = Some((n.clone(), t));
                }
                for v in victims {
                    self.keys.remove(&v);
                    notices.push((v, Asc::REGISTRATIONS_PREEMPTED));
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(Sense::invalid_field(1, Some(4)).into()),
        }
        Ok(notices)
    }

    fn unregister(&mut self, n: &Nexus, notices: &mut Notices) {
        self.keys.remove(n);
        if let Some((h, t)) = self.reservation.clone() {
            let last = t.all_registrants() && self.keys.is_empty();
            if (!t.all_registrants() && &h == n) || last {
                self.reservation = None;
                if t.registrants_share() {
                    self.notify_others(n, Asc::RESERVATIONS_RELEASED, notices);
                }
            }
        }
    }

    fn notify_others(&self, n: &Nexus, asc: Asc, notices: &mut Notices) {
        notices.extend(
            self.keys
                .keys()
                .filter(|k| *k != n)
                .map(|k| (k.clone(), asc)),
        );
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

impl PrState {
    /// Whether the state must be kept across restarts.
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }

    /// Text form for the APTPL file: one line per fact, names hex-encoded.
    pub fn to_text(&self) -> String {
        let mut out = format!("generation {}\n", self.generation);
        for (n, k) in &self.keys {
            out += &format!(
                "key {} {} {k:016x}\n",
                hex(&n.initiator),
                hex(&n.target_port)
            );
        }
        if let Some((n, t)) = &self.reservation {
            out += &format!(
                "reservation {} {} {}\n",
                hex(&n.initiator),
                hex(&n.target_port),
                *t as u8
            );
        }
        out
    }

    /// Parses [`PrState::to_text`]; `None` on any malformed line.
    pub fn from_text(text: &str) -> Option<PrState> {
        let mut st = PrState {
            aptpl: true,
            ..Default::default()
        };
        for line in text.lines() {
            let w: Vec<&str> = line.split(' ').collect();
            match w.as_slice() {
                ["generation", g] => st.generation = g.parse().ok()?,
                ["key", i, p, k] => {
                    st.keys.insert(
                        Nexus::new(&unhex(i)?, &unhex(p)?),
                        u64::from_str_radix(k, 16).ok()?,
                    );
                }
                ["reservation", i, p, t] => {
                    let t = PrType::from_u8(t.parse().ok()?)?;
                    st.reservation = Some((Nexus::new(&unhex(i)?, &unhex(p)?), t));
                }
                [""] => {}
                _ => return None,
            }
        }
        Some(st)
    }
}
