//! THE opcode table (SPC-4 / SBC-3 operation codes this core implements).
//!
//! Parsing ([`crate::cdb`]), `Display` and the supported-command list all
//! derive from this one table; a test cross-checks the parser against it.

use crate::cdb::DataDir;

/// The table's direction column: `Varies` when the service action decides
/// (variable-length CDBs: READ(32) is data-in, WRITE(32) data-out).
macro_rules! direction {
    (Varies) => {
        None
    };
    ($dir:ident) => {
        Some(DataDir::$dir)
    };
}

macro_rules! opcodes {
    ($( $variant:ident = $value:expr, $name:expr, $len:expr, $dir:ident, [$($sa:expr),*]; )*) => {
        /// A SCSI operation code; codes not in the table are `Unknown`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( $variant, )*
            Unknown(u8),
        }

        /// Every byte's opcode, built once at compile time: a CDB's first
        /// byte is looked up on every command, and a `match` over the
        /// table compiles to a search (about 15 instructions a lookup
        /// against 3).
        const BY_BYTE: [Opcode; 256] = {
            let mut t = [Opcode::Unknown(0); 256];
            let mut v = 0;
            while v < 256 {
                t[v] = Opcode::Unknown(v as u8);
                v += 1;
            }
            $( t[$value as usize] = Opcode::$variant; )*
            t
        };

        impl From<u8> for Opcode {
            fn from(v: u8) -> Self {
                BY_BYTE[v as usize]
            }
        }

        impl From<Opcode> for u8 {
            fn from(op: Opcode) -> u8 {
                match op {
                    $( Opcode::$variant => $value, )*
                    Opcode::Unknown(v) => v,
                }
            }
        }

        impl Opcode {
            /// Every implemented opcode, in table order.
            pub const ALL: &'static [Opcode] = &[$( Opcode::$variant, )*];

            /// Name as the standard spells it.
            pub fn name(self) -> Option<&'static str> {
                match self { $( Opcode::$variant => Some($name), )* Opcode::Unknown(_) => None }
            }

            /// CDB length in bytes.
            pub fn cdb_len(self) -> Option<usize> {
                match self { $( Opcode::$variant => Some($len), )* Opcode::Unknown(_) => None }
            }

            /// Service actions implemented (empty: the opcode has none).
            pub fn service_actions(self) -> &'static [u16] {
                match self { $( Opcode::$variant => &[$($sa),*], )* Opcode::Unknown(_) => &[] }
            }

            /// Data direction when the command transfers data (`None`
            /// also when the service action decides).
            pub fn direction(self) -> Option<DataDir> {
                match self { $( Opcode::$variant => direction!($dir), )* Opcode::Unknown(_) => None }
            }
        }
    };
}

opcodes! {
    TestUnitReady = 0x00, "TEST UNIT READY", 6, None, [];
    RequestSense = 0x03, "REQUEST SENSE", 6, In, [];
    Read6 = 0x08, "READ(6)", 6, In, [];
    Write6 = 0x0a, "WRITE(6)", 6, Out, [];
    Inquiry = 0x12, "INQUIRY", 6, In, [];
    ModeSelect6 = 0x15, "MODE SELECT(6)", 6, Out, [];
    ModeSense6 = 0x1a, "MODE SENSE(6)", 6, In, [];
    StartStopUnit = 0x1b, "START STOP UNIT", 6, None, [];
    PreventAllowMediumRemoval = 0x1e, "PREVENT ALLOW MEDIUM REMOVAL", 6, None, [];
    ReadCapacity10 = 0x25, "READ CAPACITY(10)", 10, In, [];
    Read10 = 0x28, "READ(10)", 10, In, [];
    Write10 = 0x2a, "WRITE(10)", 10, Out, [];
    WriteAndVerify10 = 0x2e, "WRITE AND VERIFY(10)", 10, Out, [];
    Verify10 = 0x2f, "VERIFY(10)", 10, None, [];
    SynchronizeCache10 = 0x35, "SYNCHRONIZE CACHE(10)", 10, None, [];
    WriteSame10 = 0x41, "WRITE SAME(10)", 10, Out, [];
    Unmap = 0x42, "UNMAP", 10, Out, [];
    ModeSelect10 = 0x55, "MODE SELECT(10)", 10, Out, [];
    VariableLength = 0x7f, "VARIABLE LENGTH", 32, Varies, [0x0009, 0x000b];
    PersistentReserveIn = 0x5e, "PERSISTENT RESERVE IN", 10, In, [0, 1, 2, 3];
    PersistentReserveOut = 0x5f, "PERSISTENT RESERVE OUT", 10, Out, [0, 1, 2, 3, 4, 5, 6, 7];
    ModeSense10 = 0x5a, "MODE SENSE(10)", 10, In, [];
    Read16 = 0x88, "READ(16)", 16, In, [];
    CompareAndWrite = 0x89, "COMPARE AND WRITE", 16, Out, [];
    Write16 = 0x8a, "WRITE(16)", 16, Out, [];
    WriteAndVerify16 = 0x8e, "WRITE AND VERIFY(16)", 16, Out, [];
    Verify16 = 0x8f, "VERIFY(16)", 16, None, [];
    SynchronizeCache16 = 0x91, "SYNCHRONIZE CACHE(16)", 16, None, [];
    WriteSame16 = 0x93, "WRITE SAME(16)", 16, Out, [];
    ServiceActionIn16 = 0x9e, "SERVICE ACTION IN(16)", 16, In, [0x10];
    ReportLuns = 0xa0, "REPORT LUNS", 12, In, [];
    MaintenanceIn = 0xa3, "MAINTENANCE IN", 12, In, [0x0a, 0x0c];
    MaintenanceOut = 0xa4, "MAINTENANCE OUT", 12, Out, [0x0a];
    Read12 = 0xa8, "READ(12)", 12, In, [];
    Write12 = 0xaa, "WRITE(12)", 12, Out, [];
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown opcode 0x{:02x}", u8::from(*self)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_byte() {
        for v in 0..=255u8 {
            assert_eq!(u8::from(Opcode::from(v)), v);
        }
        assert_eq!(Opcode::from(0x35), Opcode::SynchronizeCache10);
        assert_eq!(Opcode::from(0x91).to_string(), "SYNCHRONIZE CACHE(16)");
        assert_eq!(Opcode::from(0xff).to_string(), "unknown opcode 0xff");
    }

    /// No two rows of the table share a byte (the lookup table would keep
    /// the last one silently).
    #[test]
    fn every_row_is_found_by_its_byte() {
        for &op in Opcode::ALL {
            assert_eq!(Opcode::from(u8::from(op)), op);
        }
    }
}
