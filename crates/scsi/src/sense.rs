//! Sense data (SPC-4 4.5): sense keys, additional sense codes and the fixed
//! (4.5.3) and descriptor (4.5.2) formats, with the sense-key-specific field
//! pointer for ILLEGAL REQUEST (4.5.2.4.2).

macro_rules! sense_keys {
    ($( $variant:ident = $value:expr, $name:expr; )*) => {
        /// Sense key (SPC-4 table 27).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum SenseKey { $( $variant, )* Unknown(u8) }
        impl From<u8> for SenseKey {
            fn from(v: u8) -> Self { match v { $( $value => SenseKey::$variant, )* o => SenseKey::Unknown(o) } }
        }
        impl From<SenseKey> for u8 {
            fn from(k: SenseKey) -> u8 { match k { $( SenseKey::$variant => $value, )* SenseKey::Unknown(v) => v } }
        }
        impl core::fmt::Display for SenseKey {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self { $( SenseKey::$variant => f.write_str($name), )* SenseKey::Unknown(v) => write!(f, "sense key 0x{v:x}") }
            }
        }
    };
}

sense_keys! {
    NoSense = 0x0, "NO SENSE";
    NotReady = 0x2, "NOT READY";
    MediumError = 0x3, "MEDIUM ERROR";
    HardwareError = 0x4, "HARDWARE ERROR";
    IllegalRequest = 0x5, "ILLEGAL REQUEST";
    UnitAttention = 0x6, "UNIT ATTENTION";
    DataProtect = 0x7, "DATA PROTECT";
    AbortedCommand = 0xb, "ABORTED COMMAND";
    Miscompare = 0xe, "MISCOMPARE";
}

macro_rules! ascs {
    ($( $const:ident = ($asc:expr, $ascq:expr), $name:expr; )*) => {
        /// Additional sense code and qualifier (SPC-4 table D.1).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Asc(pub u8, pub u8);
        impl Asc {
            $( pub const $const: Asc = Asc($asc, $ascq); )*
            pub fn name(self) -> Option<&'static str> {
                match (self.0, self.1) { $( ($asc, $ascq) => Some($name), )* _ => None }
            }
        }
    };
}

ascs! {
    NO_ADDITIONAL = (0x00, 0x00), "NO ADDITIONAL SENSE INFORMATION";
    WRITE_ERROR = (0x0c, 0x00), "WRITE ERROR";
    UNRECOVERED_READ_ERROR = (0x11, 0x00), "UNRECOVERED READ ERROR";
    MISCOMPARE_DURING_VERIFY = (0x1d, 0x00), "MISCOMPARE DURING VERIFY OPERATION";
    INVALID_FIELD_IN_PARAMETER_LIST = (0x26, 0x00), "INVALID FIELD IN PARAMETER LIST";
    PARAMETER_LIST_LENGTH_ERROR = (0x1a, 0x00), "PARAMETER LIST LENGTH ERROR";
    INVALID_COMMAND_OPERATION_CODE = (0x20, 0x00), "INVALID COMMAND OPERATION CODE";
    LBA_OUT_OF_RANGE = (0x21, 0x00), "LOGICAL BLOCK ADDRESS OUT OF RANGE";
    INVALID_FIELD_IN_CDB = (0x24, 0x00), "INVALID FIELD IN CDB";
    LOGICAL_UNIT_NOT_SUPPORTED = (0x25, 0x00), "LOGICAL UNIT NOT SUPPORTED";
    WRITE_PROTECTED = (0x27, 0x00), "WRITE PROTECTED";
    NOT_READY_TO_READY_CHANGE = (0x28, 0x00), "NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED";
    MEDIUM_NOT_PRESENT = (0x3a, 0x00), "MEDIUM NOT PRESENT";
    MEDIUM_REMOVAL_PREVENTED = (0x53, 0x02), "MEDIUM REMOVAL PREVENTED";
    POWER_ON_RESET = (0x29, 0x00), "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED";
    MODE_PARAMETERS_CHANGED = (0x2a, 0x01), "MODE PARAMETERS CHANGED";
    CAPACITY_DATA_CHANGED = (0x2a, 0x09), "CAPACITY DATA HAS CHANGED";
    RESERVATIONS_PREEMPTED = (0x2a, 0x03), "RESERVATIONS PREEMPTED";
    RESERVATIONS_RELEASED = (0x2a, 0x04), "RESERVATIONS RELEASED";
    REGISTRATIONS_PREEMPTED = (0x2a, 0x05), "REGISTRATIONS PREEMPTED";
    INVALID_RELEASE_OF_PR = (0x26, 0x04), "INVALID RELEASE OF PERSISTENT RESERVATION";
    BUS_DEVICE_RESET = (0x29, 0x03), "BUS DEVICE RESET FUNCTION OCCURRED";
    I_T_NEXUS_LOSS = (0x29, 0x07), "I_T NEXUS LOSS OCCURRED";
    COMMANDS_CLEARED_BY_ANOTHER = (0x2f, 0x00), "COMMANDS CLEARED BY ANOTHER INITIATOR";
    OVERLAPPED_COMMANDS = (0x4e, 0x00), "OVERLAPPED COMMANDS ATTEMPTED";
    REPORTED_LUNS_DATA_CHANGED = (0x3f, 0x0e), "REPORTED LUNS DATA HAS CHANGED";
    SAVING_PARAMETERS_NOT_SUPPORTED = (0x39, 0x00), "SAVING PARAMETERS NOT SUPPORTED";
    INVALID_MESSAGE_ERROR = (0x49, 0x00), "INVALID MESSAGE ERROR";
    INTERNAL_TARGET_FAILURE = (0x44, 0x00), "INTERNAL TARGET FAILURE";
    GUARD_CHECK_FAILED = (0x10, 0x01), "LOGICAL BLOCK GUARD CHECK FAILED";
    APP_TAG_CHECK_FAILED = (0x10, 0x02), "LOGICAL BLOCK APPLICATION TAG CHECK FAILED";
    REF_TAG_CHECK_FAILED = (0x10, 0x03), "LOGICAL BLOCK REFERENCE TAG CHECK FAILED";
    LU_NOT_ACCESSIBLE_TRANSITION = (0x04, 0x0a), "LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION";
    LU_NOT_ACCESSIBLE_STANDBY = (0x04, 0x0b), "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE";
    LU_NOT_ACCESSIBLE_UNAVAILABLE = (0x04, 0x0c), "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE";
    ASYMMETRIC_ACCESS_STATE_CHANGED = (0x2a, 0x06), "ASYMMETRIC ACCESS STATE CHANGED";
}

impl core::fmt::Display for Asc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "ASC/ASCQ {:02x}/{:02x}", self.0, self.1),
        }
    }
}

/// Response code of fixed-format sense data, current error (SPC-4 4.5.1).
pub const FIXED_CURRENT: u8 = 0x70;
/// Response code of fixed-format sense data, deferred error.
pub const FIXED_DEFERRED: u8 = 0x71;
/// Response code of descriptor-format sense data, current error.
pub const DESCRIPTOR_CURRENT: u8 = 0x72;
/// Response code of descriptor-format sense data, deferred error.
pub const DESCRIPTOR_DEFERRED: u8 = 0x73;

/// The sense key and ASC/ASCQ of received sense data: descriptor format
/// when the response code (byte 0, VALID masked off) is 72h or 73h, else
/// read as fixed format (70h/71h). `None` when the data is too short to
/// hold them (fewer than 4 bytes of descriptor sense, 14 of fixed).
pub fn decode_key_asc(sense: &[u8]) -> Option<(SenseKey, Asc)> {
    match sense.first().map(|b| b & 0x7f) {
        Some(DESCRIPTOR_CURRENT | DESCRIPTOR_DEFERRED) if sense.len() >= 4 => {
            Some((SenseKey::from(sense[1] & 0x0f), Asc(sense[2], sense[3])))
        }
        Some(_) if sense.len() >= 14 => {
            Some((SenseKey::from(sense[2] & 0x0f), Asc(sense[12], sense[13])))
        }
        _ => None,
    }
}

/// Where in the CDB (or parameter list) a bad field sits (SPC-4 4.5.2.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// true: the field is in the CDB; false: in the parameter data.
    pub in_cdb: bool,
    pub byte: u16,
    /// Bit of the byte, or `None` for the whole byte.
    pub bit: Option<u8>,
}

/// Sense data of one CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: SenseKey,
    pub asc: Asc,
    pub field: Option<FieldPointer>,
    /// INFORMATION field (e.g. the first bad LBA), if valid.
    pub information: Option<u64>,
}

impl Sense {
    pub fn new(key: SenseKey, asc: Asc) -> Sense {
        Sense {
            key,
            asc,
            field: None,
            information: None,
        }
    }

    pub fn invalid_field(byte: u16, bit: Option<u8>) -> Sense {
        Sense {
            key: SenseKey::IllegalRequest,
            asc: Asc::INVALID_FIELD_IN_CDB,
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
            information: None,
        }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` (and `bit`) of
    /// the parameter data.
    pub fn invalid_param(byte: u16, bit: Option<u8>) -> Sense {
        Sense {
            key: SenseKey::IllegalRequest,
            asc: Asc::INVALID_FIELD_IN_PARAMETER_LIST,
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit,
            }),
            information: None,
        }
    }

    fn sks(&self) -> Option<[u8; 3]> {
        self.field.map(|p| {
            let mut b0 = 0x80; // SKSV
            if p.in_cdb {
                b0 |= 0x40; // C/D
            }
            if let Some(bit) = p.bit {
                b0 |= 0x08 | (bit & 7); // BPV + bit pointer
            }
            let [hi, lo] = p.byte.to_be_bytes();
            [b0, hi, lo]
        })
    }

    /// Fixed format (SPC-4 4.5.3), 18 bytes, current error.
    pub fn to_fixed(&self) -> Vec<u8> {
        let mut b = vec![0u8; 18];
        b[0] = FIXED_CURRENT;
        b[2] = u8::from(self.key) & 0x0f;
        if let Some(info) = self.information {
            b[0] |= 0x80; // VALID
            b[3..7].copy_from_slice(&(info as u32).to_be_bytes());
        }
        b[7] = 10; // additional sense length
        b[12] = self.asc.0;
        b[13] = self.asc.1;
        if let Some(s) = self.sks() {
            b[15..18].copy_from_slice(&s);
        }
        b
    }

    /// Descriptor format (SPC-4 4.5.2): information and sense-key-specific
    /// descriptors when present.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut b = vec![
            DESCRIPTOR_CURRENT,
            u8::from(self.key) & 0x0f,
            self.asc.0,
            self.asc.1,
            0,
            0,
            0,
            0,
        ];
        if let Some(info) = self.information {
            b.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(s) = self.sks() {
            b.extend_from_slice(&[0x02, 0x06, 0, 0, s[0], s[1], s[2], 0]);
        }
        b[7] = (b.len() - 8) as u8;
        b
    }
}

impl core::fmt::Display for Sense {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.key, self.asc)?;
        if let Some(p) = self.field {
            write!(f, " (byte {}", p.byte)?;
            if let Some(bit) = p.bit {
                write!(f, " bit {bit}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_with_field_pointer() {
        let s = Sense::invalid_field(1, Some(3));
        let b = s.to_fixed();
        assert_eq!(
            b,
            [
                0x70, // current error, fixed, VALID clear
                0x00, 0x05, // obsolete, ILLEGAL REQUEST
                0, 0, 0, 0,  // information
                10, // additional length
                0, 0, 0, 0, // command-specific
                0x24, 0x00, // INVALID FIELD IN CDB
                0x00, // FRU
                0xcb, 0x00, 0x01, // SKSV|C/D|BPV|bit 3, field byte 1
            ]
        );
        assert_eq!(
            s.to_string(),
            "ILLEGAL REQUEST: INVALID FIELD IN CDB (byte 1 bit 3)"
        );
    }

    #[test]
    fn descriptor_with_information() {
        let mut s = Sense::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
        s.information = Some(0x1_0000_0000);
        let b = s.to_descriptor();
        assert_eq!(
            b,
            [
                0x72, 0x05, 0x21, 0x00, // descriptor format, key, ASC/ASCQ
                0, 0, 0, 12, // reserved, additional length 12
                0x00, 0x0a, 0x80, 0, // information descriptor, VALID
                0, 0, 0, 1, 0, 0, 0, 0, // information = 0x1_0000_0000
            ]
        );
    }

    #[test]
    fn key_and_asc_of_either_format() {
        let s = Sense::new(SenseKey::UnitAttention, Asc::CAPACITY_DATA_CHANGED);
        let want = Some((SenseKey::UnitAttention, Asc::CAPACITY_DATA_CHANGED));
        assert_eq!(decode_key_asc(&s.to_fixed()), want);
        assert_eq!(decode_key_asc(&s.to_descriptor()), want);
        // VALID set, deferred error.
        let mut fixed = s.to_fixed();
        fixed[0] = 0x80 | FIXED_DEFERRED;
        assert_eq!(decode_key_asc(&fixed), want);
        // Too short for the format its response code names.
        assert_eq!(decode_key_asc(&fixed[..13]), None);
        assert_eq!(decode_key_asc(&[DESCRIPTOR_CURRENT, 0x06, 0x2a]), None);
        assert_eq!(decode_key_asc(&[]), None);
    }
}
