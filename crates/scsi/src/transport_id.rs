//! TransportIDs (SPC-4 7.6.4): how a parameter list names an initiator
//! port, and the initiator names this core gives them.
//!
//! The core names an initiator by a string ([`crate::Nexus::initiator`]);
//! each TransportID format maps to one canonical name, so a TransportID in
//! PERSISTENT RESERVE OUT REGISTER AND MOVE names a nexus, and READ FULL
//! STATUS can report each registrant's TransportID:
//!
//! | protocol | TransportID | initiator name |
//! |---|---|---|
//! | SRP (4) | format 0, 24 bytes, 16-byte initiator port identifier | `0x` + 32 hex digits (ib_srpt's session name) |
//! | FC (0) | format 0, 24 bytes, 8-byte N_Port name | 8 hex bytes joined by `:` (`21:00:00:24:ff:31:4c:48`) |
//! | iSCSI (5) | format 0: iSCSI name; format 1: name, `,i,0x`, ISID | the name; or `name,i,0x<isid>` |
//!
//! A name no transport format fits (test names such as `"a"`) gets the
//! core's own form under protocol identifier Fh (no specific protocol):
//! laid out as an iSCSI format 0 TransportID, so it round-trips.

use core::fmt;

/// SCSI transport protocol identifier (SPC-4 table 444); open code space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolId {
    Fc,
    Srp,
    Iscsi,
    /// Fh: no specific protocol (the core's private name form).
    None,
    Unknown(u8),
}

impl From<u8> for ProtocolId {
    fn from(v: u8) -> Self {
        match v & 0x0f {
            0x0 => ProtocolId::Fc,
            0x4 => ProtocolId::Srp,
            0x5 => ProtocolId::Iscsi,
            0xf => ProtocolId::None,
            o => ProtocolId::Unknown(o),
        }
    }
}

impl From<ProtocolId> for u8 {
    fn from(p: ProtocolId) -> u8 {
        match p {
            ProtocolId::Fc => 0x0,
            ProtocolId::Srp => 0x4,
            ProtocolId::Iscsi => 0x5,
            ProtocolId::None => 0xf,
            ProtocolId::Unknown(v) => v & 0x0f,
        }
    }
}

/// A validated TransportID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportId {
    /// SRP: the 16-byte initiator port identifier (SPC-4 7.6.4.5).
    Srp([u8; 16]),
    /// Fibre Channel: the N_Port name (SPC-4 7.6.4.2).
    Fc([u8; 8]),
    /// iSCSI: the iSCSI name, with the ISID (hex text) for format 01b
    /// (SPC-4 7.6.4.6).
    Iscsi { name: String, isid: Option<String> },
    /// Protocol Fh: a name no transport format fits (this core's form).
    Name(String),
}

/// Why bytes are not a TransportID this core accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransportIdError {
    #[error("TransportID shorter than its format ({0} bytes)")]
    Truncated(usize),
    #[error("TransportID protocol {0:#x} format {1} not supported")]
    Unsupported(u8, u8),
    #[error("TransportID name is not null-terminated UTF-8")]
    BadName,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Length of an iSCSI-style name field: the name, a null, padding to a
/// multiple of 4, at least 20 bytes (SPC-4 7.6.4.6).
fn name_field_len(name: &str) -> usize {
    (name.len() + 1).div_ceil(4).max(5) * 4
}

/// Longest name field an ADDITIONAL LENGTH (16 bits) can carry.
const MAX_NAME_FIELD: usize = 0xfffc;

impl TransportId {
    /// Parses the TransportID at the start of `b`; returns it and the
    /// bytes it occupies.
    pub fn parse(b: &[u8]) -> Result<(TransportId, usize), TransportIdError> {
        let Some(&b0) = b.first() else {
            return Err(TransportIdError::Truncated(0));
        };
        let format = b0 >> 6;
        let proto = ProtocolId::from(b0);
        let fixed = |n: usize| {
            if b.len() < n {
                Err(TransportIdError::Truncated(b.len()))
            } else {
                Ok(n)
            }
        };
        match (proto, format) {
            (ProtocolId::Srp, 0) => {
                let n = fixed(24)?;
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[8..24]);
                Ok((TransportId::Srp(id), n))
            }
            (ProtocolId::Fc, 0) => {
                let n = fixed(24)?;
                let mut wwn = [0u8; 8];
                wwn.copy_from_slice(&b[8..16]);
                Ok((TransportId::Fc(wwn), n))
            }
            (ProtocolId::Iscsi | ProtocolId::None, 0 | 1) => {
                let hdr = fixed(4)?;
                let add = u16::from_be_bytes([b[2], b[3]]) as usize;
                let n = fixed(hdr + add)?;
                let text = &b[hdr..n];
                let end = text
                    .iter()
                    .position(|&c| c == 0)
                    .ok_or(TransportIdError::BadName)?;
                let s = std::str::from_utf8(&text[..end]).map_err(|_| TransportIdError::BadName)?;
                if s.is_empty() || name_field_len(s) > MAX_NAME_FIELD {
                    return Err(TransportIdError::BadName);
                }
                let id = match (proto, format) {
                    (ProtocolId::None, 0) => TransportId::Name(s.into()),
                    (ProtocolId::Iscsi, 0) => TransportId::Iscsi {
                        name: s.into(),
                        isid: None,
                    },
                    (ProtocolId::Iscsi, _) => {
                        // SPC-4 7.6.4.6: "<name>,i,0x<ISID>".
                        let (name, isid) =
                            s.split_once(",i,0x").ok_or(TransportIdError::BadName)?;
                        TransportId::Iscsi {
                            name: name.into(),
                            isid: Some(isid.to_ascii_lowercase()),
                        }
                    }
                    _ => return Err(TransportIdError::Unsupported(u8::from(proto), format)),
                };
                Ok((id, n))
            }
            _ => Err(TransportIdError::Unsupported(u8::from(proto), format)),
        }
    }

    /// The TransportID's bytes.
    pub fn emit(&self) -> Vec<u8> {
        match self {
            TransportId::Srp(id) => {
                let mut d = vec![0u8; 24];
                d[0] = ProtocolId::Srp.into();
                d[8..24].copy_from_slice(id);
                d
            }
            TransportId::Fc(wwn) => {
                let mut d = vec![0u8; 24];
                d[0] = ProtocolId::Fc.into();
                d[8..16].copy_from_slice(wwn);
                d
            }
            TransportId::Iscsi { .. } | TransportId::Name(_) => {
                let (b0, text) = match self {
                    TransportId::Iscsi { name, isid: None } => (0x05, name.clone()),
                    TransportId::Iscsi {
                        name,
                        isid: Some(i),
                    } => (0x45, format!("{name},i,0x{i}")),
                    TransportId::Name(n) => (0x0f, n.clone()),
                    _ => unreachable!("matched above"),
                };
                let len = name_field_len(&text);
                let mut d = vec![0u8; 4 + len];
                d[0] = b0;
                d[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                d[4..4 + text.len()].copy_from_slice(text.as_bytes());
                d
            }
        }
    }

    /// The initiator name the core uses for this initiator port.
    pub fn initiator_name(&self) -> String {
        match self {
            TransportId::Srp(id) => format!("0x{}", hex(id)),
            TransportId::Fc(wwn) => wwn
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
            TransportId::Iscsi { name, isid: None } => name.clone(),
            TransportId::Iscsi {
                name,
                isid: Some(i),
            } => format!("{name},i,0x{i}"),
            TransportId::Name(n) => n.clone(),
        }
    }

    /// The TransportID of an initiator name (the inverse of
    /// [`TransportId::initiator_name`]); names of no transport format get
    /// [`TransportId::Name`]. `None` only for a name too long for a
    /// TransportID (or empty, or holding a null).
    pub fn from_initiator_name(name: &str) -> Option<TransportId> {
        if name.is_empty() || name.contains('\0') || name_field_len(name) > MAX_NAME_FIELD {
            return None;
        }
        if let Some(id) = name.strip_prefix("0x").and_then(unhex::<16>) {
            if format!("0x{}", hex(&id)) == name {
                return Some(TransportId::Srp(id));
            }
        }
        let parts: Vec<&str> = name.split(':').collect();
        if parts.len() == 8 && parts.iter().all(|p| p.len() == 2) {
            if let Some(wwn) = unhex::<8>(&parts.concat()) {
                if TransportId::Fc(wwn).initiator_name() == name {
                    return Some(TransportId::Fc(wwn));
                }
            }
        }
        let lower = name.to_ascii_lowercase();
        if ["iqn.", "eui.", "naa."]
            .iter()
            .any(|p| lower.starts_with(p))
        {
            return Some(match name.split_once(",i,0x") {
                Some((n, isid)) => TransportId::Iscsi {
                    name: n.into(),
                    isid: Some(isid.into()),
                },
                None => TransportId::Iscsi {
                    name: name.into(),
                    isid: None,
                },
            });
        }
        Some(TransportId::Name(name.into()))
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self {
            TransportId::Srp(_) => "SRP",
            TransportId::Fc(_) => "FC",
            TransportId::Iscsi { .. } => "iSCSI",
            TransportId::Name(_) => "name",
        };
        write!(f, "{proto} {}", self.initiator_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SRP TransportID (SPC-4 7.6.4.5): byte 0 protocol identifier 4,
    /// format 00b; bytes 1..8 reserved; bytes 8..24 the initiator port
    /// identifier (ib_srp builds it from the initiator extension and the
    /// port GUID).
    #[test]
    fn srp_vector() {
        let bytes: [u8; 24] = [
            0x04, // format 00b, protocol identifier 4 (SRP)
            0, 0, 0, 0, 0, 0, 0, // reserved
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id extension
            0x00, 0x02, 0xc9, 0x03, 0x00, 0x0e, 0x8a, 0xcd, // port GUID
        ];
        let (id, n) = TransportId::parse(&bytes).unwrap();
        assert_eq!(n, 24);
        assert_eq!(id.initiator_name(), "0x00000000000000000002c903000e8acd");
        assert_eq!(id.emit(), bytes);
        assert_eq!(
            TransportId::from_initiator_name(&id.initiator_name()),
            Some(id)
        );
        assert_eq!(
            TransportId::parse(&bytes[..23]),
            Err(TransportIdError::Truncated(23))
        );
    }

    #[test]
    fn fc_and_iscsi_vectors() {
        let mut fc = [0u8; 24];
        fc[8..16].copy_from_slice(&[0x21, 0, 0, 0x24, 0xff, 0x31, 0x4c, 0x48]);
        let (id, _) = TransportId::parse(&fc).unwrap();
        assert_eq!(id.initiator_name(), "21:00:00:24:ff:31:4c:48");
        assert_eq!(
            TransportId::from_initiator_name("21:00:00:24:ff:31:4c:48"),
            Some(id)
        );

        // iSCSI format 00b: 4-byte header, "iqn.x" + null, padded to 20.
        let mut is = vec![0x05, 0, 0, 20];
        is.extend_from_slice(b"iqn.x\0");
        is.resize(24, 0);
        let (id, n) = TransportId::parse(&is).unwrap();
        assert_eq!(n, 24);
        assert_eq!(id.initiator_name(), "iqn.x");
        assert_eq!(id.emit(), is);

        // Format 01b with an ISID.
        let name = "iqn.1994-05.com.example:h1,i,0x23d000000001";
        let id = TransportId::from_initiator_name(name).unwrap();
        let b = id.emit();
        assert_eq!(b[0], 0x45);
        assert_eq!(b.len() % 4, 0);
        assert_eq!(TransportId::parse(&b).unwrap(), (id.clone(), b.len()));
        assert_eq!(id.initiator_name(), name);

        // Missing null, unsupported protocol (SAS), empty input.
        let mut bad = vec![0x05, 0, 0, 4];
        bad.extend_from_slice(b"iqn.");
        assert_eq!(TransportId::parse(&bad), Err(TransportIdError::BadName));
        assert_eq!(
            TransportId::parse(&[0x06; 24]),
            Err(TransportIdError::Unsupported(6, 0))
        );
        assert_eq!(TransportId::parse(&[]), Err(TransportIdError::Truncated(0)));
    }

    #[test]
    fn other_names_round_trip_as_protocol_f() {
        for name in [
            "a",
            "initiator-b",
            "0x12",
            "0xAB000000000000000000000000000042",
        ] {
            let id = TransportId::from_initiator_name(name).unwrap();
            assert!(matches!(id, TransportId::Name(_)), "{name}");
            let b = id.emit();
            assert_eq!(b[0], 0x0f);
            assert_eq!(TransportId::parse(&b).unwrap().0.initiator_name(), name);
        }
        assert_eq!(TransportId::from_initiator_name(""), None);
        // The longest name an ADDITIONAL LENGTH can carry, and one more.
        let long = "n".repeat(0xfffc - 1);
        let b = TransportId::from_initiator_name(&long).unwrap().emit();
        assert_eq!(b.len(), 4 + 0xfffc);
        assert_eq!(TransportId::parse(&b).unwrap().0.initiator_name(), long);
        assert_eq!(TransportId::from_initiator_name(&format!("{long}n")), None);
        let mut over = vec![0x0f, 0, 0xff, 0xff];
        over.extend(std::iter::repeat_n(b'n', 0xfffe));
        over.push(0);
        assert_eq!(TransportId::parse(&over), Err(TransportIdError::BadName));
    }
}
