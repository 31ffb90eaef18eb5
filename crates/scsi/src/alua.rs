//! Asymmetric logical unit access (ALUA, SPC-4 5.16): target port groups,
//! their asymmetric access states, what each state lets a command do, and
//! the parameter data of REPORT TARGET PORT GROUPS (SPC-4 6.36) and SET
//! TARGET PORT GROUPS (SPC-4 6.44).
//!
//! The groups are the target's: every logical unit of a [`crate::Target`]
//! is in one logical unit group, so a port group's state holds for all of
//! them (SCST's device group holding every device). Ports are named by
//! relative target port identifier, so a group may hold ports of another
//! target that serves the same logical units (another host on a
//! replicated disk, SCST's remote targets): they are reported, and only
//! the local ones run commands here. A target port in no group is not
//! asymmetric: every command runs through it and REPORT
//! TARGET PORT GROUPS does not list it. With no group at all the target
//! reports no ALUA (INQUIRY TPGS 00b) and refuses both commands.

use crate::sense::{Asc, Sense, SenseKey};

/// An asymmetric access state (SPC-4 table 120 / 6.36's ASYMMETRIC
/// ACCESS STATE field): the ones this target can be in. Logical block
/// dependent (4h) and offline (Eh) are not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

/// One table per fact: the state, its code, SCST's configuration word,
/// its supported-state bit in a descriptor's byte 1 (SPC-4 6.36: T_SUP
/// bit 7, U_SUP bit 3, S_SUP bit 2, AN_SUP bit 1, AO_SUP bit 0), and
/// the sense of a command it refuses (SPC-4 5.16.2.4).
const STATES: [(AccessState, u8, &str, u8, Option<Asc>); 5] = [
    (AccessState::ActiveOptimized, 0x0, "active", 0x01, None),
    (
        AccessState::ActiveNonOptimized,
        0x1,
        "nonoptimized",
        0x02,
        None,
    ),
    (
        AccessState::Standby,
        0x2,
        "standby",
        0x04,
        Some(Asc::LU_NOT_ACCESSIBLE_STANDBY),
    ),
    (
        AccessState::Unavailable,
        0x3,
        "unavailable",
        0x08,
        Some(Asc::LU_NOT_ACCESSIBLE_UNAVAILABLE),
    ),
    (
        AccessState::Transitioning,
        0xf,
        "transitioning",
        0x80,
        Some(Asc::LU_NOT_ACCESSIBLE_TRANSITION),
    ),
];

impl AccessState {
    fn row(self) -> &'static (AccessState, u8, &'static str, u8, Option<Asc>) {
        // Every variant has its row (the table test checks it).
        STATES.iter().find(|r| r.0 == self).unwrap_or(&STATES[0])
    }

    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        self.row().1
    }

    /// The state a code names; `None` for logical block dependent,
    /// offline and the reserved codes.
    pub fn from_code(code: u8) -> Option<AccessState> {
        STATES.iter().find(|r| r.1 == code).map(|r| r.0)
    }

    /// The word srptd's configuration and `srptadm` use (SCST's
    /// `state` attribute: `active`, `nonoptimized`, `standby`,
    /// `unavailable`, `transitioning`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Every state's word, for messages that list them.
    pub fn names() -> impl Iterator<Item = &'static str> {
        STATES.iter().map(|r| r.2)
    }

    /// Whether the state serves I/O (active/optimized or
    /// active/non-optimized).
    pub fn is_active(self) -> bool {
        self.row().4.is_none()
    }

    /// The supported-states byte of every descriptor this target
    /// reports: T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP.
    pub fn supported_bits() -> u8 {
        STATES.iter().fold(0, |b, r| b | r.3)
    }

    /// Whether a command with `cdb` may run through a port in this state
    /// (SPC-4 5.16.2.4.2 to 5.16.2.4.5); a refused one ends with CHECK
    /// CONDITION, NOT READY and the state's LOGICAL UNIT NOT ACCESSIBLE
    /// code.
    ///
    /// # Errors
    /// The sense of the refusal.
    pub fn admit(self, cdb: &[u8]) -> Result<(), Sense> {
        let Some(asc) = self.row().4 else {
            return Ok(());
        };
        let op = cdb.first().copied().unwrap_or(0);
        let sa = cdb.get(1).map_or(0, |b| b & 0x1f);
        // Every non-active state: INQUIRY, REPORT LUNS, REQUEST SENSE and
        // REPORT TARGET PORT GROUPS (how an initiator finds the way out).
        let always = matches!(op, 0x12 | 0xa0 | 0x03) || (op == 0xa3 && sa == 0x0a);
        let stpg = op == 0xa4 && sa == 0x0a;
        let allowed = match self {
            // Standby also: MODE SENSE/SELECT, PERSISTENT RESERVE IN/OUT
            // (so a reservation can be moved to the standby side first),
            // SET TARGET PORT GROUPS; and READ CAPACITY(10/16), which
            // SPC-4 leaves to the device server (LIO answers it too), so
            // an initiator can size a standby path before it fails over.
            AccessState::Standby => {
                always
                    || stpg
                    || matches!(op, 0x15 | 0x1a | 0x55 | 0x5a | 0x5e | 0x5f | 0x25)
                    || (op == 0x9e && sa == 0x10)
            }
            AccessState::Unavailable => always || stpg,
            _ => always,
        };
        if allowed {
            Ok(())
        } else {
            Err(Sense::new(SenseKey::NotReady, asc))
        }
    }
}

impl std::fmt::Display for AccessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A state word that names no state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown asymmetric access state `{0}` (expected one of: active, nonoptimized, standby, unavailable, transitioning)")]
pub struct UnknownState(pub String);

impl std::str::FromStr for AccessState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<AccessState, UnknownState> {
        STATES
            .iter()
            .find(|r| r.2 == s)
            .map(|r| r.0)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// What last changed a group's state: REPORT TARGET PORT GROUPS' STATUS
/// CODE (SPC-4 6.36).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusCode {
    /// 00h: no status.
    #[default]
    None,
    /// 01h: altered by a SET TARGET PORT GROUPS command.
    Explicit,
    /// 02h: altered by implicit asymmetric logical unit access behavior
    /// (here: srptd's configuration or `srptadm`).
    Implicit,
}

impl StatusCode {
    pub fn code(self) -> u8 {
        match self {
            StatusCode::None => 0,
            StatusCode::Explicit => 1,
            StatusCode::Implicit => 2,
        }
    }
}

/// One target port group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    /// TARGET PORT GROUP (SPC-4 3.1.148); 0 is allowed by the standard
    /// but srptd asks for 1 and up, as SCST's `group_id`.
    pub id: u16,
    pub state: AccessState,
    /// PREF: this group is a preferred path (SPC-4 6.36).
    pub preferred: bool,
    /// Relative target port identifiers of its ports (SPC-4 3.1.120;
    /// [`crate::Target::set_relative_port_id`] gives local ports theirs).
    pub ports: Vec<u16>,
    pub status: StatusCode,
}

/// The ALUA settings of a target: its groups and whether SET TARGET PORT
/// GROUPS may change them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alua {
    pub groups: Vec<PortGroup>,
    /// Explicit transitions allowed (INQUIRY TPGS 11b instead of 01b).
    pub explicit: bool,
    /// IMPLICIT TRANSITION TIME of the extended header: seconds an
    /// implicit transition may take, 0 when not said (SPC-4 6.36).
    pub transition_secs: u8,
}

impl Alua {
    /// The group holding the target port of relative identifier `rtpi`.
    pub fn group_of(&self, rtpi: u16) -> Option<&PortGroup> {
        self.groups.iter().find(|g| g.ports.contains(&rtpi))
    }

    /// INQUIRY's TPGS field (SPC-4 6.6.2, byte 5 bits 5..4): 00b no ALUA,
    /// 01b implicit only, 11b implicit and explicit.
    pub fn tpgs(&self) -> u8 {
        match (self.groups.is_empty(), self.explicit) {
            (true, _) => 0,
            (false, false) => 0b01,
            (false, true) => 0b11,
        }
    }

    /// REPORT TARGET PORT GROUPS parameter data (SPC-4 6.36), every group
    /// in order of its identifier, each port by its relative target port
    /// identifier. `extended` is PARAMETER DATA FORMAT 001b: the
    /// 8-byte header with FORMAT TYPE and IMPLICIT TRANSITION TIME, not
    /// the 4-byte length.
    pub fn report(&self, extended: bool) -> Vec<u8> {
        let mut d = vec![0u8; if extended { 8 } else { 4 }];
        if extended {
            d[4] = 0x10; // FORMAT TYPE 001b (bits 6..4)
            d[5] = self.transition_secs;
        }
        let mut groups: Vec<&PortGroup> = self.groups.iter().collect();
        groups.sort_by_key(|g| g.id);
        for g in groups {
            let ports = &g.ports[..g.ports.len().min(255)];
            d.push(u8::from(g.preferred) << 7 | g.state.code());
            d.push(AccessState::supported_bits());
            d.extend_from_slice(&g.id.to_be_bytes());
            d.push(0); // reserved
            d.push(g.status.code());
            d.push(0); // vendor specific
            d.push(ports.len() as u8); // TARGET PORT COUNT
            for p in ports {
                d.extend_from_slice(&[0, 0]); // obsolete
                d.extend_from_slice(&p.to_be_bytes());
            }
        }
        // RETURN DATA LENGTH: the bytes after the first four.
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        d
    }
}

/// One target port group descriptor of REPORT TARGET PORT GROUPS data,
/// as an initiator reads it: the state as its code, since a target may
/// report states this one never takes (offline, logical block dependent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedGroup {
    pub id: u16,
    /// ASYMMETRIC ACCESS STATE (byte 0 bits 3..0).
    pub state_code: u8,
    pub preferred: bool,
    /// STATUS CODE (byte 5).
    pub status: u8,
    /// Relative target port identifiers.
    pub ports: Vec<u16>,
}

impl ReportedGroup {
    /// The state, when it is one of [`AccessState`]'s.
    pub fn state(&self) -> Option<AccessState> {
        AccessState::from_code(self.state_code)
    }
}

/// REPORT TARGET PORT GROUPS data that does not hold what it says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("REPORT TARGET PORT GROUPS data is {have} bytes, fewer than its {need}-byte header")]
    Short { have: usize, need: usize },
    #[error(
        "REPORT TARGET PORT GROUPS descriptor at byte {at} runs past the data's end ({len} bytes)"
    )]
    Cut { at: usize, len: usize },
}

/// Reads REPORT TARGET PORT GROUPS parameter data (SPC-4 6.36) of either
/// header format (the FORMAT TYPE of byte 4 tells the extended one): the
/// groups, and the IMPLICIT TRANSITION TIME when the header has it. The
/// descriptors end where RETURN DATA LENGTH or the data ends, whichever is
/// first (an allocation length may have cut the data).
///
/// # Errors
/// A header shorter than its format, or a descriptor cut in the middle.
pub fn parse_report(data: &[u8]) -> Result<(Vec<ReportedGroup>, Option<u8>), ReportError> {
    let short = |need| ReportError::Short {
        have: data.len(),
        need,
    };
    let len = data.get(0..4).ok_or(short(4))?;
    let end = (u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize)
        .saturating_add(4)
        .min(data.len());
    let extended = data.get(4).is_some_and(|b| b & 0x70 == 0x10);
    let (mut at, time) = if extended {
        (8, Some(*data.get(5).ok_or(short(8))?))
    } else {
        (4, None)
    };
    if extended && data.len() < 8 {
        return Err(short(8));
    }
    let mut groups = Vec::new();
    while at < end {
        let cut = ReportError::Cut { at, len: end };
        let d = data
            .get(at..at + 8)
            .filter(|_| at + 8 <= end)
            .ok_or(cut.clone())?;
        let count = d[7] as usize;
        let ports = data
            .get(at + 8..at + 8 + 4 * count)
            .filter(|_| at + 8 + 4 * count <= end)
            .ok_or(cut)?;
        groups.push(ReportedGroup {
            id: u16::from_be_bytes([d[2], d[3]]),
            state_code: d[0] & 0x0f,
            preferred: d[0] & 0x80 != 0,
            status: d[5],
            ports: ports
                .chunks(4)
                .map(|p| u16::from_be_bytes([p[2], p[3]]))
                .collect(),
        });
        at += 8 + 4 * count;
    }
    Ok((groups, time))
}

/// SET TARGET PORT GROUPS parameter list (SPC-4 6.44): four reserved
/// bytes, then 4-byte descriptors (byte 0 bits 3..0 the state asked
/// for, bytes 2..3 the group). Each group must be known and named once,
/// and the state one an initiator may ask for: active/optimized,
/// active/non-optimized, standby or unavailable.
///
/// # Errors
/// INVALID FIELD IN PARAMETER LIST pointing at the bad byte, or
/// PARAMETER LIST LENGTH ERROR for a list that is not whole descriptors.
pub fn parse_set(data: &[u8], known: &[u16]) -> Result<Vec<(u16, AccessState)>, Sense> {
    if data.len() < 4 || (data.len() - 4) % 4 != 0 {
        return Err(Sense::new(
            SenseKey::IllegalRequest,
            Asc::PARAMETER_LIST_LENGTH_ERROR,
        ));
    }
    let mut out: Vec<(u16, AccessState)> = Vec::new();
    for (i, d) in data[4..].chunks(4).enumerate() {
        let at = (4 + 4 * i) as u16;
        let state = match AccessState::from_code(d[0] & 0x0f) {
            Some(s) if s != AccessState::Transitioning && d[0] & 0xf0 == 0 => s,
            _ => return Err(Sense::invalid_param(at, None)),
        };
        let id = u16::from_be_bytes([d[2], d[3]]);
        if !known.contains(&id) || out.iter().any(|(g, _)| *g == id) {
            return Err(Sense::invalid_param(at + 2, None));
        }
        out.push((id, state));
    }
    Ok(out)
}

/// The target port group designator of VPD 83h (SPC-4 7.8.6.7:
/// association 01b target port, type 5h, binary, 4 bytes: two reserved,
/// then the group), appended to a device identification page whose
/// PAGE LENGTH is updated.
pub(crate) fn add_group_designator(page: &mut Vec<u8>, group: u16) {
    page.extend_from_slice(&[0x01, 0x15, 0x00, 0x04, 0, 0]);
    page.extend_from_slice(&group.to_be_bytes());
    let len = (page.len().saturating_sub(4)).min(0xffff) as u16;
    if let Some(h) = page.get_mut(2..4) {
        h.copy_from_slice(&len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_table_is_whole() {
        for (s, code, name, _, _) in STATES {
            assert_eq!(AccessState::from_code(code), Some(s));
            assert_eq!(s.code(), code);
            assert_eq!(name.parse::<AccessState>(), Ok(s));
        }
        // Logical block dependent and offline are not offered.
        assert_eq!(AccessState::from_code(0x4), None);
        assert_eq!(AccessState::from_code(0xe), None);
        assert_eq!(AccessState::supported_bits(), 0x8f);
        let e = "optimized".parse::<AccessState>().unwrap_err();
        assert!(e.to_string().contains("`optimized`"), "{e}");
        assert!(e.to_string().contains("nonoptimized, standby"), "{e}");
    }

    #[test]
    fn report_parses_back_in_both_formats() {
        let alua = Alua {
            groups: vec![
                PortGroup {
                    id: 7,
                    state: AccessState::Standby,
                    preferred: false,
                    ports: vec![3, 300],
                    status: StatusCode::Implicit,
                },
                PortGroup {
                    id: 1,
                    state: AccessState::ActiveOptimized,
                    preferred: true,
                    ports: vec![1],
                    status: StatusCode::None,
                },
            ],
            explicit: false,
            transition_secs: 30,
        };
        for extended in [false, true] {
            let (groups, time) = parse_report(&alua.report(extended)).unwrap();
            assert_eq!(time, extended.then_some(30));
            let group = |id, state: AccessState, preferred, status, ports: &[u16]| ReportedGroup {
                id,
                state_code: state.code(),
                preferred,
                status,
                ports: ports.to_vec(),
            };
            assert_eq!(
                groups,
                vec![
                    group(1, AccessState::ActiveOptimized, true, 0, &[1]),
                    group(7, AccessState::Standby, false, 2, &[3, 300]),
                ]
            );
        }
        // Offline (Eh) is read as its code.
        let d = [0, 0, 0, 8, 0x0e, 0x8f, 0, 9, 0, 0, 0, 0];
        let (g, _) = parse_report(&d).unwrap();
        assert_eq!((g[0].id, g[0].state_code, g[0].state()), (9, 0x0e, None));
        // Cut by the allocation length: the whole descriptors only... a
        // descriptor cut in the middle is an error, not a guess.
        let full = alua.report(false);
        assert_eq!(parse_report(&full[..4]).unwrap().0, vec![]);
        assert!(matches!(
            parse_report(&full[..10]),
            Err(ReportError::Cut { at: 4, .. })
        ));
        assert_eq!(
            parse_report(&[0, 0]),
            Err(ReportError::Short { have: 2, need: 4 })
        );
        assert_eq!(
            parse_report(&[0, 0, 0, 4, 0x10, 0]),
            Err(ReportError::Short { have: 6, need: 8 })
        );
    }
}
