//! CDB parsing (SPC-4 4.2, SBC-3 5) into typed commands, driven by the
//! opcode table. Every field the core does not support is refused with a
//! field pointer, never ignored silently.

use crate::opcode::Opcode;
use crate::sense::{Asc, Sense, SenseKey};

/// Data transfer direction of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    None,
    /// Target to initiator.
    In,
    /// Initiator to target.
    Out,
}

/// What a transport must move for a command, known before execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub dir: DataDir,
    /// Bytes the CDB asks for (allocation length or transfer length).
    pub len: u64,
}

/// What a 32-byte READ or WRITE tells the device server to expect in the
/// protection information (SBC-3 5.18, 5.38).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// EXPECTED INITIAL LOGICAL BLOCK REFERENCE TAG: the first block's,
    /// incremented per block.
    pub reference: u32,
    /// EXPECTED LOGICAL BLOCK APPLICATION TAG, compared under `app_mask`.
    pub app: u16,
    /// LOGICAL BLOCK APPLICATION TAG MASK: bits compared; 0 checks none.
    pub app_mask: u16,
}

/// A parsed command with validated fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    PrIn {
        sa: u8,
        alloc: u32,
    },
    PrOut {
        sa: u8,
        type_byte: u8,
        param_len: u32,
    },
    /// MODE SELECT(6/10) with its parameter list length.
    ModeSelect {
        ten: bool,
        param_len: u32,
    },
    /// VERIFY: `bytchk` 0 checks the medium can be read; 1 compares the
    /// data-out with the blocks; 3 compares one block of data-out with
    /// every block (SBC-3 5.33).
    Verify {
        lba: u64,
        blocks: u32,
        bytchk: u8,
    },
    /// WRITE SAME: one block of data-out repeated over the range.
    WriteSame {
        lba: u64,
        blocks: u32,
        unmap: bool,
    },
    Unmap {
        param_len: u32,
    },
    /// COMPARE AND WRITE: 2 x blocks of data-out (verify, then write).
    CompareAndWrite {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    /// REPORT SUPPORTED OPERATION CODES (SPC-4 6.35).
    ReportOpcodes {
        options: u8,
        opcode: u8,
        alloc: u32,
    },
    TestUnitReady,
    RequestSense {
        desc: bool,
        alloc: u32,
    },
    Inquiry {
        evpd: bool,
        page: u8,
        alloc: u32,
    },
    ModeSense {
        ten: bool,
        dbd: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
    },
    StartStopUnit,
    PreventAllow,
    ReadCapacity10,
    ReadCapacity16 {
        alloc: u32,
    },
    /// READ(6/10/12/16/32); `protect` is RDPROTECT (0 for READ(6));
    /// `expect` is READ(32)'s (only 32-byte CDBs carry it).
    Read {
        lba: u64,
        blocks: u32,
        fua: bool,
        protect: u8,
        expect: Option<Expected>,
    },
    /// WRITE(6/10/12/16) and WRITE AND VERIFY; `protect` is WRPROTECT:
    /// non-zero, the data-out carries 8 bytes of protection information
    /// after each block.
    Write {
        lba: u64,
        blocks: u32,
        fua: bool,
        protect: u8,
        expect: Option<Expected>,
    },
    SyncCache {
        lba: u64,
        blocks: u32,
    },
    ReportLuns {
        select: u8,
        alloc: u32,
    },
    /// REPORT TARGET PORT GROUPS (SPC-4 6.36); `extended`: PARAMETER DATA
    /// FORMAT 001b.
    ReportTargetPortGroups {
        extended: bool,
        alloc: u32,
    },
    /// SET TARGET PORT GROUPS (SPC-4 6.44).
    SetTargetPortGroups {
        param_len: u32,
    },
}

/// Length of the CDB an operation code starts: the opcode table's, or for
/// codes not in it the group code's (SPC-4 4.2.5.1; groups 3, 6 and 7 have
/// no fixed length).
pub fn cdb_len_of(op: u8) -> Option<usize> {
    Opcode::from(op).cdb_len().or(match op >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    })
}

/// Whether `cdb` reads the medium (`In`: READ(6/10/12/16/32)) or writes
/// it (`Out`: WRITE(6/10/12/16/32), WRITE AND VERIFY(10/16)), by its
/// operation code (and a 32-byte CDB's service action) alone: what
/// [`Command::parse`] would make a `Read` or `Write` of, when it accepts
/// the rest of the CDB. For a transport's counters, which count only
/// commands that ended GOOD: on an emulated unit those are the ones the
/// parser accepted; a unit that passes its commands on (or the virtual
/// CD-ROM, which ignores byte 1) may end GOOD a READ or WRITE the parser
/// refuses (protection fields set), and such a command counts too.
pub fn medium_direction(cdb: &[u8]) -> Option<DataDir> {
    match Opcode::from(*cdb.first()?) {
        Opcode::Read6 | Opcode::Read10 | Opcode::Read12 | Opcode::Read16 => Some(DataDir::In),
        Opcode::Write6
        | Opcode::Write10
        | Opcode::Write12
        | Opcode::Write16
        | Opcode::WriteAndVerify10
        | Opcode::WriteAndVerify16 => Some(DataDir::Out),
        Opcode::VariableLength => match cdb.get(8..10)? {
            [0, 0x09] => Some(DataDir::In),
            [0, 0x0b] => Some(DataDir::Out),
            _ => None,
        },
        _ => None,
    }
}

/// The NACA bit of the CONTROL byte (SAM-5 5.3): the last byte of the CDB
/// as [`cdb_len_of`] finds it; false when the CDB is shorter than that.
pub fn naca(cdb: &[u8]) -> bool {
    control_byte(cdb).is_some_and(|(_, c)| c & 0x04 != 0)
}

/// Offset and value of the CONTROL byte, when the CDB has one.
pub fn control_byte(cdb: &[u8]) -> Option<(usize, u8)> {
    let len = cdb_len_of(*cdb.first()?)?;
    cdb.get(len - 1).map(|&c| (len - 1, c))
}

fn be(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |a, &x| (a << 8) | x as u64)
}

fn ilrq(asc: Asc) -> Sense {
    Sense::new(SenseKey::IllegalRequest, asc)
}

impl Command {
    /// Parses a CDB. Errors are the sense data the target must return.
    pub fn parse(cdb: &[u8]) -> Result<(Opcode, Command), Sense> {
        let Some(&op) = cdb.first() else {
            return Err(ilrq(Asc::INVALID_COMMAND_OPERATION_CODE));
        };
        let op = Opcode::from(op);
        let Some(len) = op.cdb_len() else {
            return Err(ilrq(Asc::INVALID_COMMAND_OPERATION_CODE));
        };
        if cdb.len() < len {
            // The transport delivered fewer bytes than the opcode's CDB: the
            // opcode byte is all we can trust (SPC-4 4.2.1).
            return Err(Sense::invalid_field(0, None));
        }
        let c = &cdb[..len];
        // The CONTROL byte's NACA bit is the target's to judge: it depends
        // on the logical unit's NormACA (see `naca`).
        let cmd = match op {
            Opcode::TestUnitReady => Command::TestUnitReady,
            Opcode::RequestSense => Command::RequestSense {
                desc: c[1] & 1 != 0,
                alloc: c[4] as u32,
            },
            Opcode::Inquiry => {
                let evpd = c[1] & 1 != 0;
                if c[1] & 0xfe != 0 {
                    return Err(Sense::invalid_field(1, None));
                }
                if !evpd && c[2] != 0 {
                    return Err(Sense::invalid_field(2, None));
                }
                Command::Inquiry {
                    evpd,
                    page: c[2],
                    alloc: be(&c[3..5]) as u32,
                }
            }
            Opcode::ModeSense6 | Opcode::ModeSense10 => {
                let ten = op == Opcode::ModeSense10;
                let alloc = if ten { be(&c[7..9]) } else { c[4] as u64 } as u32;
                Command::ModeSense {
                    ten,
                    dbd: c[1] & 0x08 != 0,
                    pc: c[2] >> 6,
                    page: c[2] & 0x3f,
                    subpage: c[3],
                    alloc,
                }
            }
            Opcode::ModeSelect6 | Opcode::ModeSelect10 => {
                // PF must be 1; SP (save pages) unsupported.
                if c[1] & 0x01 != 0 {
                    return Err(Sense::new(
                        SenseKey::IllegalRequest,
                        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
                    ));
                }
                if c[1] & 0x10 == 0 {
                    return Err(Sense::invalid_field(1, Some(4)));
                }
                let ten = op == Opcode::ModeSelect10;
                let param_len = if ten { be(&c[7..9]) } else { c[4] as u64 } as u32;
                Command::ModeSelect { ten, param_len }
            }
            Opcode::PersistentReserveIn => match c[1] & 0x1f {
                sa @ 0..=3 => Command::PrIn {
                    sa,
                    alloc: be(&c[7..9]) as u32,
                },
                _ => return Err(Sense::invalid_field(1, Some(4))),
            },
            Opcode::PersistentReserveOut => {
                let sa = c[1] & 0x1f;
                if sa > 7 {
                    return Err(Sense::invalid_field(1, Some(4)));
                }
                if c[2] >> 4 != 0 {
                    return Err(Sense::invalid_field(2, Some(7))); // scope: LU only
                }
                Command::PrOut {
                    sa,
                    type_byte: c[2],
                    param_len: be(&c[5..9]) as u32,
                }
            }
            Opcode::StartStopUnit => Command::StartStopUnit,
            Opcode::PreventAllowMediumRemoval => Command::PreventAllow,
            Opcode::ReadCapacity10 => {
                if c[8] & 1 != 0 {
                    return Err(Sense::invalid_field(8, Some(0))); // PMI obsolete
                }
                Command::ReadCapacity10
            }
            Opcode::ServiceActionIn16 => match c[1] & 0x1f {
                0x10 => Command::ReadCapacity16 {
                    alloc: be(&c[10..14]) as u32,
                },
                _ => return Err(Sense::invalid_field(1, Some(4))),
            },
            Opcode::Read6 | Opcode::Write6 => {
                let lba = be(&c[1..4]) & 0x1f_ffff;
                // SBC-3 5.16: transfer length 0 means 256 blocks.
                let blocks = if c[4] == 0 { 256 } else { c[4] as u32 };
                if op == Opcode::Read6 {
                    Command::Read {
                        lba,
                        blocks,
                        fua: false,
                        protect: 0,
                        expect: None,
                    }
                } else {
                    Command::Write {
                        lba,
                        blocks,
                        fua: false,
                        protect: 0,
                        expect: None,
                    }
                }
            }
            Opcode::Read10
            | Opcode::Write10
            | Opcode::Read12
            | Opcode::Write12
            | Opcode::Read16
            | Opcode::Write16 => {
                // RDPROTECT/WRPROTECT (bits 7..5): 110b and 111b are
                // reserved (SBC-3 tables 95, 101); the others are the
                // device's to judge (it may have no protection information).
                let protect = c[1] >> 5;
                if protect >= 6 {
                    return Err(Sense::invalid_field(1, Some(7)));
                }
                let fua = c[1] & 0x08 != 0;
                let (lba, blocks) = match len {
                    10 => (be(&c[2..6]), be(&c[7..9])),
                    12 => (be(&c[2..6]), be(&c[6..10])),
                    _ => (be(&c[2..10]), be(&c[10..14])),
                };
                let blocks = blocks as u32;
                match op {
                    Opcode::Read10 | Opcode::Read12 | Opcode::Read16 => Command::Read {
                        lba,
                        blocks,
                        fua,
                        protect,
                        expect: None,
                    },
                    _ => Command::Write {
                        lba,
                        blocks,
                        fua,
                        protect,
                        expect: None,
                    },
                }
            }
            Opcode::VariableLength => {
                // SPC-4 4.2.3: byte 7 ADDITIONAL CDB LENGTH (18h for the
                // 32-byte READ and WRITE), bytes 8-9 SERVICE ACTION.
                if c[7] != 0x18 {
                    return Err(Sense::invalid_field(7, None));
                }
                let sa = be(&c[8..10]);
                if sa != 0x0009 && sa != 0x000b {
                    return Err(Sense::invalid_field(8, None));
                }
                let protect = c[10] >> 5;
                if protect >= 6 {
                    return Err(Sense::invalid_field(10, Some(7)));
                }
                let lba = be(&c[12..20]);
                let blocks = be(&c[28..32]) as u32;
                let fua = c[10] & 0x08 != 0;
                let expect = Some(Expected {
                    reference: be(&c[20..24]) as u32,
                    app: be(&c[24..26]) as u16,
                    app_mask: be(&c[26..28]) as u16,
                });
                if sa == 0x0009 {
                    Command::Read {
                        lba,
                        blocks,
                        fua,
                        protect,
                        expect,
                    }
                } else {
                    Command::Write {
                        lba,
                        blocks,
                        fua,
                        protect,
                        expect,
                    }
                }
            }
            Opcode::WriteAndVerify10
            | Opcode::WriteAndVerify16
            | Opcode::Verify10
            | Opcode::Verify16 => {
                // Protection information (bits 7..5) is not supported.
                if c[1] & 0xe0 != 0 {
                    return Err(Sense::invalid_field(1, Some(7)));
                }
                let verify = matches!(op, Opcode::Verify10 | Opcode::Verify16);
                // BYTCHK (bits 2..1): 10b is reserved; 11b only for VERIFY.
                let bytchk = (c[1] >> 1) & 0x3;
                if bytchk == 2 || (bytchk == 3 && !verify) {
                    return Err(Sense::invalid_field(1, Some(2)));
                }
                let (lba, blocks) = if len == 10 {
                    (be(&c[2..6]), be(&c[7..9]))
                } else {
                    (be(&c[2..10]), be(&c[10..14]))
                };
                let blocks = blocks as u32;
                if verify {
                    Command::Verify {
                        lba,
                        blocks,
                        bytchk,
                    }
                } else {
                    // The write must reach the medium before it is verified.
                    Command::Write {
                        lba,
                        blocks,
                        fua: true,
                        protect: 0,
                        expect: None,
                    }
                }
            }
            Opcode::WriteSame10 | Opcode::WriteSame16 => {
                // Only UNMAP (bit 3) supported; ANCHOR, NDOB, protection refused.
                if c[1] & 0xf7 != 0 {
                    return Err(Sense::invalid_field(1, None));
                }
                let (lba, blocks) = if len == 10 {
                    (be(&c[2..6]), be(&c[7..9]))
                } else {
                    (be(&c[2..10]), be(&c[10..14]))
                };
                if blocks == 0 {
                    // WSNZ=1 in the block limits page (SBC-3 6.5.3).
                    return Err(Sense::invalid_field(if len == 10 { 7 } else { 10 }, None));
                }
                Command::WriteSame {
                    lba,
                    blocks: blocks as u32,
                    unmap: c[1] & 0x08 != 0,
                }
            }
            Opcode::Unmap => {
                if c[1] & 0x01 != 0 {
                    return Err(Sense::invalid_field(1, Some(0))); // ANCHOR
                }
                Command::Unmap {
                    param_len: be(&c[7..9]) as u32,
                }
            }
            Opcode::CompareAndWrite => {
                if c[1] & 0xe0 != 0 {
                    return Err(Sense::invalid_field(1, Some(7)));
                }
                Command::CompareAndWrite {
                    lba: be(&c[2..10]),
                    blocks: c[13] as u32,
                    fua: c[1] & 0x08 != 0,
                }
            }
            Opcode::MaintenanceIn => match c[1] & 0x1f {
                0x0a => match c[1] >> 5 {
                    // PARAMETER DATA FORMAT: 000b length only, 001b extended.
                    f @ (0 | 1) => Command::ReportTargetPortGroups {
                        extended: f == 1,
                        alloc: be(&c[6..10]) as u32,
                    },
                    _ => return Err(Sense::invalid_field(1, Some(7))),
                },
                0x0c => {
                    let options = c[2] & 0x07;
                    if options > 1 || c[2] & 0x80 != 0 {
                        return Err(Sense::invalid_field(2, None));
                    }
                    Command::ReportOpcodes {
                        options,
                        opcode: c[3],
                        alloc: be(&c[6..10]) as u32,
                    }
                }
                _ => return Err(Sense::invalid_field(1, Some(4))),
            },
            Opcode::MaintenanceOut => match c[1] & 0x1f {
                0x0a => Command::SetTargetPortGroups {
                    param_len: be(&c[6..10]) as u32,
                },
                _ => return Err(Sense::invalid_field(1, Some(4))),
            },
            Opcode::SynchronizeCache10 => Command::SyncCache {
                lba: be(&c[2..6]),
                blocks: be(&c[7..9]) as u32,
            },
            Opcode::SynchronizeCache16 => Command::SyncCache {
                lba: be(&c[2..10]),
                blocks: be(&c[10..14]) as u32,
            },
            Opcode::ReportLuns => Command::ReportLuns {
                select: c[2],
                alloc: be(&c[6..10]) as u32,
            },
            Opcode::Unknown(_) => return Err(ilrq(Asc::INVALID_COMMAND_OPERATION_CODE)),
        };
        Ok((op, cmd))
    }

    /// Whether the command reads or writes the medium (or flushes it):
    /// what a closed store ([`crate::Detachable`]) refuses.
    pub fn uses_store(&self) -> bool {
        matches!(
            self,
            Command::Read { .. }
                | Command::Write { .. }
                | Command::Verify { .. }
                | Command::WriteSame { .. }
                | Command::Unmap { .. }
                | Command::CompareAndWrite { .. }
                | Command::SyncCache { .. }
        )
    }

    /// RDPROTECT or WRPROTECT of a READ or WRITE (0 for other commands).
    pub fn protect(&self) -> u8 {
        match *self {
            Command::Read { protect, .. } | Command::Write { protect, .. } => protect,
            _ => 0,
        }
    }

    /// Direction and length the command implies, for a LUN of `block_size`.
    /// A READ with RDPROTECT or a WRITE with WRPROTECT moves 8 bytes of
    /// protection information per block besides the data (SBC-3 4.22).
    pub fn plan(&self, block_size: u32) -> Plan {
        let bytes = |blocks: u32| blocks as u64 * block_size as u64;
        let with_pi = |blocks: u32, protect: u8| {
            bytes(blocks)
                + if protect != 0 {
                    blocks as u64 * crate::pi::PI_LEN as u64
                } else {
                    0
                }
        };
        match *self {
            Command::RequestSense { alloc, .. }
            | Command::Inquiry { alloc, .. }
            | Command::ModeSense { alloc, .. }
            | Command::ReadCapacity16 { alloc }
            | Command::ReportLuns { alloc, .. }
            | Command::ReportOpcodes { alloc, .. }
            | Command::ReportTargetPortGroups { alloc, .. } => Plan {
                dir: DataDir::In,
                len: alloc as u64,
            },
            Command::ReadCapacity10 => Plan {
                dir: DataDir::In,
                len: 8,
            },
            Command::Read {
                blocks, protect, ..
            } => Plan {
                dir: DataDir::In,
                len: with_pi(blocks, protect),
            },
            Command::Write {
                blocks, protect, ..
            } => Plan {
                dir: DataDir::Out,
                len: with_pi(blocks, protect),
            },
            Command::WriteSame { .. } => Plan {
                dir: DataDir::Out,
                len: block_size as u64,
            },
            Command::PrIn { alloc, .. } => Plan {
                dir: DataDir::In,
                len: alloc as u64,
            },
            Command::PrOut { param_len, .. } => Plan {
                dir: DataDir::Out,
                len: param_len as u64,
            },
            Command::ModeSelect { param_len, .. } => Plan {
                dir: DataDir::Out,
                len: param_len as u64,
            },
            Command::Unmap { param_len } | Command::SetTargetPortGroups { param_len } => Plan {
                dir: DataDir::Out,
                len: param_len as u64,
            },
            Command::CompareAndWrite { blocks, .. } => Plan {
                dir: DataDir::Out,
                len: 2 * bytes(blocks),
            },
            Command::Verify {
                blocks, bytchk: 1, ..
            } => Plan {
                dir: DataDir::Out,
                len: bytes(blocks),
            },
            Command::Verify {
                blocks, bytchk: 3, ..
            } if blocks > 0 => Plan {
                dir: DataDir::Out,
                len: bytes(1),
            },
            Command::TestUnitReady
            | Command::StartStopUnit
            | Command::PreventAllow
            | Command::Verify { .. }
            | Command::SyncCache { .. } => Plan {
                dir: DataDir::None,
                len: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `medium_direction` calls a CDB a READ or a WRITE exactly when the
    /// parser makes a `Read` or `Write` of it: every operation code, and a
    /// 32-byte CDB with each of its service actions.
    #[test]
    fn medium_direction_agrees_with_the_parser() {
        let mut cdbs = Vec::new();
        for op in 0..=255u8 {
            let mut c = [0u8; 32];
            c[0] = op;
            cdbs.push(c);
        }
        for sa in 0..=0x20u8 {
            let mut c = [0u8; 32];
            (c[0], c[7], c[9]) = (0x7f, 0x18, sa);
            cdbs.push(c);
        }
        for c in cdbs {
            let parsed = match Command::parse(&c) {
                Ok((_, Command::Read { .. })) => Some(DataDir::In),
                Ok((_, Command::Write { .. })) => Some(DataDir::Out),
                _ => None,
            };
            assert_eq!(medium_direction(&c), parsed, "{:02x?}", &c[..10]);
        }
    }

    /// The parser and the table agree: every table opcode with a zeroed CDB of
    /// the table's length either parses or is refused with a field pointer
    /// (never INVALID COMMAND OPERATION CODE), and the planned direction is
    /// the table's (or None for a zero-length transfer).
    #[test]
    fn parser_agrees_with_table() {
        for &op in Opcode::ALL {
            let mut cdb = vec![0u8; op.cdb_len().unwrap()];
            cdb[0] = op.into();
            if op == Opcode::ServiceActionIn16 {
                cdb[1] = 0x10;
            }
            if op == Opcode::MaintenanceIn {
                cdb[1] = 0x0c;
            }
            // A non-zero length so data-moving commands show their direction.
            let last = cdb.len() - 2;
            cdb[last] = 1;
            match Command::parse(&cdb) {
                Ok((parsed, cmd)) => {
                    assert_eq!(parsed, op);
                    let plan = cmd.plan(512);
                    if plan.dir != DataDir::None {
                        assert_eq!(Some(plan.dir), op.direction(), "{op}");
                    }
                }
                Err(s) => assert_ne!(s.asc, Asc::INVALID_COMMAND_OPERATION_CODE, "{op}"),
            }
        }
        for v in 0..=255u8 {
            if matches!(Opcode::from(v), Opcode::Unknown(_)) {
                let e = Command::parse(&[v, 0, 0, 0, 0, 0]).unwrap_err();
                assert_eq!(e.asc, Asc::INVALID_COMMAND_OPERATION_CODE);
            }
        }
    }

    #[test]
    fn read10_fields() {
        // READ(10): opcode, FUA, LBA 0x01020304, group, length 8, control.
        let cdb = [0x28, 0x08, 1, 2, 3, 4, 0, 0, 8, 0];
        let (_, c) = Command::parse(&cdb).unwrap();
        assert_eq!(
            c,
            Command::Read {
                lba: 0x0102_0304,
                blocks: 8,
                fua: true,
                protect: 0,
                expect: None
            }
        );
        assert_eq!(
            c.plan(4096),
            Plan {
                dir: DataDir::In,
                len: 32768
            }
        );
        // Truncated CDB and reserved RDPROTECT 110b.
        assert_eq!(
            Command::parse(&cdb[..9]).unwrap_err(),
            Sense::invalid_field(0, None)
        );
        let mut bad = cdb;
        bad[1] = 0xc0;
        assert_eq!(
            Command::parse(&bad).unwrap_err(),
            Sense::invalid_field(1, Some(7))
        );
        // RDPROTECT 001b: 8 bytes of PI per block in the data-in.
        let mut pi = cdb;
        pi[1] = 0x20;
        let (_, c) = Command::parse(&pi).unwrap();
        assert_eq!(c.protect(), 1);
        assert_eq!(c.plan(512).len, 8 * 520);
        // WRITE(16) with WRPROTECT 001b: 520 bytes per 512-byte block out.
        let w16 = [0x8a, 0x20, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0];
        let (_, c) = Command::parse(&w16).unwrap();
        assert_eq!(
            c.plan(512),
            Plan {
                dir: DataDir::Out,
                len: 1040
            }
        );
    }
}
