//! Persistent reservations (SPC-4 5.9, 6.15-6.16): registrations per I_T
//! nexus, one reservation per logical unit, conflict rules of SPC-4
//! table 48 (simplified to read/write/other classes).
//!
//! PR IN: READ KEYS, READ RESERVATION, REPORT CAPABILITIES, READ FULL
//! STATUS (with each registrant's TransportID). PR OUT: every service
//! action including REGISTER AND MOVE (a TransportID and a relative target
//! port identifier name the destination nexus). Not supported, and said
//! so by REPORT CAPABILITIES: SPEC_I_PT and ALL_TG_PT (refused), RESERVE(6)
//! compatibility (CRH 0).

use crate::cdb::Command;
use crate::sense::{Asc, Sense, SenseKey};
use crate::target::Nexus;
use crate::transport_id::TransportId;
use std::collections::BTreeMap;

/// What PR commands need to know of the target beyond the logical unit.
#[derive(Debug, Clone, Copy)]
pub struct PrEnv<'a> {
    /// Relative target port identifiers by target port name.
    pub ports: &'a BTreeMap<String, u16>,
    /// APTPL state survives a restart (the device has a PR file): PTPL_C.
    pub ptpl_capable: bool,
    /// REGISTER AND MOVE: the initiator the TransportID names has this
    /// logical unit in its LUN map (the target knows; true when moot).
    pub move_dest_sees_lu: bool,
}

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
    /// Whether some nexus (or every registrant) holds a reservation.
    pub fn is_reserved(&self) -> bool {
        self.reservation.is_some()
    }

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

    /// SPC-4 5.9.1 for a pass-through unit's command: the rule of
    /// [`PrState::conflicts`] when the opcode table knows the command;
    /// otherwise one that moves data-in reads (a conflict under the
    /// exclusive access types), and any other may change the medium (a
    /// conflict under every type; a tape's REWIND or a changer's MOVE
    /// MEDIUM from a non-holder must not run).
    pub fn conflicts_passed(&self, n: &Nexus, cdb: &[u8], data_in: bool) -> bool {
        if let Ok((_, cmd)) = Command::parse(cdb) {
            return self.conflicts(n, &cmd);
        }
        let Some((_, t)) = &self.reservation else {
            return false;
        };
        if self.holds(n) || (t.registrants_share() && self.keys.contains_key(n)) {
            return false;
        }
        if data_in {
            t.exclusive_access()
        } else {
            true
        }
    }

    /// PERSISTENT RESERVE IN: READ KEYS (0), READ RESERVATION (1), REPORT
    /// CAPABILITIES (2), READ FULL STATUS (3).
    pub fn pr_in(&self, sa: u8, env: PrEnv<'_>) -> Result<Vec<u8>, Sense> {
        if sa == 2 {
            return Ok(self.capabilities(env));
        }
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
            3 => {
                // SPC-4 6.15.5: one descriptor per registered I_T nexus.
                let mut body = Vec::new();
                for (n, k) in &self.keys {
                    let mut e = k.to_be_bytes().to_vec();
                    e.extend_from_slice(&[0; 4]);
                    match &self.reservation {
                        Some((_, t)) if self.holds(n) => e.extend_from_slice(&[0x01, *t as u8]),
                        _ => e.extend_from_slice(&[0, 0]),
                    }
                    e.extend_from_slice(&[0; 4]);
                    let rtpi = env.ports.get(&*n.target_port).copied().unwrap_or(0);
                    e.extend_from_slice(&rtpi.to_be_bytes());
                    let tid = n.transport_id().map(|t| t.emit()).unwrap_or_default();
                    e.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    e.extend_from_slice(&tid);
                    body.extend_from_slice(&e);
                }
                d.extend_from_slice(&(body.len() as u32).to_be_bytes());
                d.extend_from_slice(&body);
            }
            _ => return Err(Sense::invalid_field(1, Some(4))),
        }
        Ok(d)
    }

    /// SPC-4 6.15.4 REPORT CAPABILITIES: what this core really does.
    fn capabilities(&self, env: PrEnv<'_>) -> Vec<u8> {
        let mut d = vec![0u8; 8];
        d[1] = 8; // LENGTH
                  // RLR_C 0, CRH 0 (no RESERVE(6)/(10)), SIP_C 0, ATP_C 0.
        if env.ptpl_capable {
            d[2] |= 0x01; // PTPL_C
        }
        d[3] = 0x80; // TMV: the type mask is valid; ALLOW COMMANDS 000b
        if self.aptpl {
            d[3] |= 0x01; // PTPL_A
        }
        // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
        d[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
        d[5] = 0x01;
        d
    }

    /// PERSISTENT RESERVE OUT. Returns the unit attentions to raise.
    pub fn pr_out(
        &mut self,
        n: &Nexus,
        sa: u8,
        type_byte: u8,
        p: &[u8],
        env: PrEnv<'_>,
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
                // SPEC_I_PT (bit 3) and ALL_TG_PT (bit 2): SIP_C and ATP_C
                // are 0 (SPC-4 6.16.3).
                if p[20] & 0x08 != 0 {
                    return Err(Sense::invalid_param(20, Some(3)).into());
                }
                if p[20] & 0x04 != 0 {
                    return Err(Sense::invalid_param(20, Some(2)).into());
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
            7 => self.register_and_move(n, key, sa_key, p, env)?,
            _ => return Err(Sense::invalid_field(1, Some(4)).into()),
        }
        Ok(notices)
    }

    /// REGISTER AND MOVE (SPC-4 5.12.8, 6.16.4): registers the nexus the
    /// TransportID and relative target port identifier name with the
    /// service action key, moves the issuer's reservation to it (same
    /// type; the CDB's TYPE is ignored) and, with UNREG, unregisters the
    /// issuer.
    fn register_and_move(
        &mut self,
        n: &Nexus,
        key: u64,
        sa_key: u64,
        p: &[u8],
        env: PrEnv<'_>,
    ) -> Result<(), PrError> {
        if self.keys.get(n) != Some(&key) {
            return Err(conflict());
        }
        if sa_key == 0 {
            return Err(Sense::invalid_param(8, None).into());
        }
        let unreg = p[17] & 0x02 != 0;
        let aptpl = p[17] & 0x01 != 0;
        let rtpi = u16::from_be_bytes([p[18], p[19]]);
        let tid_len = u32::from_be_bytes([p[20], p[21], p[22], p[23]]) as usize;
        let Some(tid) = p.get(24..24usize.saturating_add(tid_len)) else {
            return Err(
                Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR).into(),
            );
        };
        let Some(port) = env
            .ports
            .iter()
            .find(|(_, &id)| id == rtpi)
            .map(|(name, _)| name.clone())
        else {
            return Err(Sense::invalid_param(18, None).into());
        };
        let dest = match TransportId::parse(tid) {
            Ok((t, used)) if used == tid.len() => Nexus::from_transport_id(&t, &port),
            _ => return Err(Sense::invalid_param(24, None).into()),
        };
        // The TransportID may not name the issuer's own initiator port,
        // nor one that cannot reach this logical unit.
        if dest.initiator == n.initiator || !env.move_dest_sees_lu {
            return Err(Sense::invalid_param(24, None).into());
        }
        match &self.reservation {
            // As LIO does: nothing to move is a bad request, not a conflict.
            None => return Err(Sense::invalid_field(1, Some(4)).into()),
            Some((_, t)) if t.all_registrants() => return Err(conflict()),
            Some((h, _)) if h != n => return Err(conflict()),
            Some(_) => {}
        }
        let t = self.reservation.as_ref().map(|(_, t)| *t);
        self.keys.insert(dest.clone(), sa_key);
        self.reservation = t.map(|t| (dest, t));
        if unreg {
            self.keys.remove(n);
        }
        self.aptpl = aptpl;
        self.generation = self.generation.wrapping_add(1);
        Ok(())
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
