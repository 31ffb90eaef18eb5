//! Protection information (SBC-3 4.22, T10 DIF): 8 bytes per logical
//! block, a CRC guard over the block's data, an application tag and a
//! reference tag.
//!
//! A logical unit formatted with protection ([`PiType`] in
//! `DeviceConfig::protection`) keeps one [`Tuple`] per block in its
//! store's PI space ([`crate::Backend::read_pi`]). On the wire (data-in
//! with RDPROTECT != 0, data-out with WRPROTECT != 0) each block is
//! followed by its 8 bytes; with RDPROTECT/WRPROTECT 0 the target strips
//! the tuples on reads (after checking them) and generates them on writes.
//!
//! Types 1, 2 and 3. Type 2 carries PI only in READ(32)/WRITE(32), whose
//! CDBs name the expected initial reference tag and an expected
//! application tag with a mask; those are the only commands whose
//! application tag is checked (READ/WRITE(10/12/16) carry no expected
//! value and there is no application tag mode page). The tag is stored as
//! sent and never modified (the control page says ATO=1).
//!
//! Escapes (SBC-3 4.22.4): an application tag of FFFFh turns checking off
//! for the block (types 1 and 2), or, with a reference tag of FFFF_FFFFh,
//! type 3. A block never written since the store was formatted holds
//! all-ones PI.

use crate::sense::{Asc, Sense, SenseKey};

/// Bytes of protection information per logical block.
pub const PI_LEN: usize = 8;

/// Protection type a logical unit is formatted with (SBC-3 4.22.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PiType {
    /// The reference tag is the low 32 bits of the LBA and is checked.
    Type1,
    /// The reference tag of the first block is the one a 32-byte CDB
    /// names (EXPECTED INITIAL LOGICAL BLOCK REFERENCE TAG), incremented
    /// per block; READ/WRITE(10/12/16) may not carry PI.
    Type2,
    /// The reference tag belongs to the application client; not checked.
    Type3,
}

impl PiType {
    /// P_TYPE of READ CAPACITY(16): the type minus one.
    pub fn p_type(self) -> u8 {
        match self {
            PiType::Type1 => 0,
            PiType::Type2 => 1,
            PiType::Type3 => 2,
        }
    }

    /// SPT of the Extended INQUIRY Data VPD page (SPC-4 7.8.7): the one
    /// type this logical unit supports.
    pub fn spt(self) -> u8 {
        match self {
            PiType::Type1 => 0b000,
            PiType::Type2 => 0b010,
            PiType::Type3 => 0b100,
        }
    }
}

/// Slicing-by-8 tables: `t[0][x]` is the CRC register after byte `x`
/// from a zero register, `t[k][x]` the same followed by `k` zero bytes.
const fn crc_tables() -> [[u16; 256]; 8] {
    let mut t = [[0u16; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut b = 0;
        while b < 8 {
            c = if c & 0x8000 != 0 {
                (c << 1) ^ 0x8bb7
            } else {
                c << 1
            };
            b += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let p = t[k - 1][i];
            t[k][i] = (p << 8) ^ t[0][(p >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

static CRC_TABLES: [[u16; 256]; 8] = crc_tables();

/// The guard: CRC-16 with polynomial 8BB7h, initial value 0, no
/// reflection, no final XOR (SBC-3 4.22.4.2). Eight bytes per step: the
/// register's two bytes fold into the first two, and each byte's effect
/// after the bytes that follow it comes from its table.
pub fn crc16_t10dif(data: &[u8]) -> u16 {
    let t = &CRC_TABLES;
    let mut crc = 0u16;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let [hi, lo] = crc.to_be_bytes();
        crc = t[7][(c[0] ^ hi) as usize]
            ^ t[6][(c[1] ^ lo) as usize]
            ^ t[5][c[2] as usize]
            ^ t[4][c[3] as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    chunks.remainder().iter().fold(crc, |crc, &b| {
        (crc << 8) ^ t[0][((crc >> 8) as u8 ^ b) as usize]
    })
}

/// One block's protection information (SBC-3 figure 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub guard: u16,
    pub app: u16,
    pub reference: u32,
}

impl Tuple {
    /// What a freshly formatted block holds: all ones (both escapes).
    pub const FORMATTED: Tuple = Tuple {
        guard: 0xffff,
        app: 0xffff,
        reference: 0xffff_ffff,
    };

    /// Reads the 8 bytes at the start of `b` (callers pass 8 bytes).
    pub fn parse(b: &[u8]) -> Tuple {
        let mut a = [0u8; PI_LEN];
        let n = b.len().min(PI_LEN);
        a[..n].copy_from_slice(&b[..n]);
        Tuple {
            guard: u16::from_be_bytes([a[0], a[1]]),
            app: u16::from_be_bytes([a[2], a[3]]),
            reference: u32::from_be_bytes([a[4], a[5], a[6], a[7]]),
        }
    }

    pub fn emit(&self) -> [u8; PI_LEN] {
        let mut a = [0u8; PI_LEN];
        a[0..2].copy_from_slice(&self.guard.to_be_bytes());
        a[2..4].copy_from_slice(&self.app.to_be_bytes());
        a[4..8].copy_from_slice(&self.reference.to_be_bytes());
        a
    }

    /// The tuple the target generates for `data` when the initiator sends
    /// none: application tag 0, the given reference tag (see
    /// [`Want::generated_reference`]).
    pub fn generate(data: &[u8], reference: u32) -> Tuple {
        Tuple {
            guard: crc16_t10dif(data),
            app: 0,
            reference,
        }
    }

    /// Checking is off for this block (SBC-3 4.22.4).
    fn escaped(&self, ty: PiType) -> bool {
        match ty {
            PiType::Type1 | PiType::Type2 => self.app == 0xffff,
            PiType::Type3 => self.app == 0xffff && self.reference == 0xffff_ffff,
        }
    }

    /// Checks the tuple of block `data` at `lba` against what the command
    /// expects; the sense of the first failed check (ABORTED COMMAND,
    /// INFORMATION = the LBA).
    pub fn check(
        &self,
        ty: PiType,
        checks: Checks,
        want: Want,
        data: &[u8],
        lba: u64,
    ) -> Result<(), Sense> {
        if self.escaped(ty) {
            return Ok(());
        }
        let fail = |asc| {
            let mut s = Sense::new(SenseKey::AbortedCommand, asc);
            s.information = Some(lba);
            Err(s)
        };
        if checks.guard && self.guard != crc16_t10dif(data) {
            return fail(Asc::GUARD_CHECK_FAILED);
        }
        if let Some((app, mask)) = want.app {
            if checks.app && (self.app ^ app) & mask != 0 {
                return fail(Asc::APP_TAG_CHECK_FAILED);
            }
        }
        if let Some(r) = want.reference {
            if checks.reference && self.reference != r {
                return fail(Asc::REF_TAG_CHECK_FAILED);
            }
        }
        Ok(())
    }
}

/// What one block's tuple should hold, as far as the command says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Want {
    /// Expected reference tag; `None`: not checked.
    pub reference: Option<u32>,
    /// Expected application tag and the mask of bits compared.
    pub app: Option<(u16, u16)>,
}

impl Want {
    /// Block `k` of a command starting at `lba`: type 1 expects the LBA's
    /// low 32 bits, type 2 the 32-byte CDB's initial tag plus `k` (nothing
    /// without one), type 3 nothing; the application tag only where a
    /// 32-byte CDB gives a value and mask.
    pub fn of(ty: PiType, expect: Option<crate::cdb::Expected>, lba: u64, k: u64) -> Want {
        let reference = match (ty, expect) {
            (PiType::Type1, _) => Some((lba + k) as u32),
            (PiType::Type2, Some(e)) => Some(e.reference.wrapping_add(k as u32)),
            _ => None,
        };
        Want {
            reference,
            app: expect
                .filter(|e| e.app_mask != 0)
                .map(|e| (e.app, e.app_mask)),
        }
    }

    /// The reference tag the target writes when it generates the tuple of
    /// block `k`: the expected one, else the LBA's low 32 bits (type 1,
    /// and type 2 written by a 10/12/16-byte CDB), else FFFF_FFFFh (type
    /// 3, as LIO seeds it; the application tag 0 keeps it checked).
    pub fn generated_reference(
        ty: PiType,
        expect: Option<crate::cdb::Expected>,
        lba: u64,
        k: u64,
    ) -> u32 {
        match (ty, Want::of(ty, expect, lba, k).reference) {
            (_, Some(r)) => r,
            (PiType::Type3, None) => 0xffff_ffff,
            _ => (lba + k) as u32,
        }
    }
}

/// Which fields the device server checks for one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub guard: bool,
    pub app: bool,
    pub reference: bool,
}

impl Checks {
    /// Every field.
    pub const ALL: Checks = Checks {
        guard: true,
        app: true,
        reference: true,
    };

    /// SBC-3 tables 95 and 101 (RDPROTECT, WRPROTECT; VRPROTECT alike):
    /// 000b on a protected LU and 001b/101b check every field, 010b the
    /// application and reference tags, 011b nothing, 100b the guard.
    /// 110b/111b are reserved (`None`).
    pub fn of(protect: u8) -> Option<Checks> {
        let (guard, tags) = match protect {
            0 | 1 | 5 => (true, true),
            2 => (false, true),
            3 => (false, false),
            4 => (true, false),
            _ => return None,
        };
        Some(Checks {
            guard,
            app: tags,
            reference: tags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-16/T10-DIF vectors: "123456789" is the check value of the
    /// reveng CRC catalogue; "abc" and the 79-digit string are Linux
    /// crypto/testmgr.h crct10dif vectors; 512 bytes of FFh and of 00h
    /// were computed with python crcmod (poly 0x18BB7, init 0, not
    /// reflected), which reproduces the published ones.
    #[test]
    fn crc_vectors() {
        assert_eq!(crc16_t10dif(b"123456789"), 0xd0db);
        assert_eq!(crc16_t10dif(b"abc"), 0x443b);
        let digits: Vec<u8> = b"1234567890".repeat(8)[..79].to_vec();
        assert_eq!(crc16_t10dif(&digits), 0x4b70);
        assert_eq!(crc16_t10dif(&[0xff; 512]), 0xe6a1);
        assert_eq!(crc16_t10dif(&[0; 512]), 0);
    }

    /// The sliced CRC equals a bit-at-a-time division for every length
    /// up to 40 and every alignment of the 8-byte steps.
    #[test]
    fn sliced_crc_matches_bitwise() {
        fn bitwise(data: &[u8]) -> u16 {
            let mut crc = 0u16;
            for &b in data {
                crc ^= (b as u16) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 {
                        (crc << 1) ^ 0x8bb7
                    } else {
                        crc << 1
                    };
                }
            }
            crc
        }
        let data: Vec<u8> = (0..48u32).map(|i| (i * 73 + 11) as u8).collect();
        for start in 0..8 {
            for len in 0..=40 {
                let d = &data[start..start + len];
                assert_eq!(crc16_t10dif(d), bitwise(d), "start {start} len {len}");
            }
        }
        assert_eq!(bitwise(b"123456789"), 0xd0db);
    }

    #[test]
    fn tuple_bytes_and_checks() {
        // Guard 0xE6A1, app tag 0x0102, reference tag 0x00000007.
        let b = [0xe6, 0xa1, 0x01, 0x02, 0x00, 0x00, 0x00, 0x07];
        let t = Tuple::parse(&b);
        assert_eq!(
            t,
            Tuple {
                guard: 0xe6a1,
                app: 0x0102,
                reference: 7
            }
        );
        assert_eq!(t.emit(), b);
        let all = Checks::of(1).unwrap();
        assert_eq!(all, Checks::ALL);
        let data = [0xff; 512];
        let chk =
            |t: &Tuple, ty, c, d: &[u8], lba| t.check(ty, c, Want::of(ty, None, lba, 0), d, lba);
        assert_eq!(chk(&t, PiType::Type1, all, &data, 7), Ok(()));
        let e = chk(&t, PiType::Type1, all, &data, 8).unwrap_err();
        assert_eq!((e.asc, e.information), (Asc::REF_TAG_CHECK_FAILED, Some(8)));
        // Type 3 never checks the reference tag; 010b skips the guard.
        assert_eq!(chk(&t, PiType::Type3, all, &data, 8), Ok(()));
        let e = chk(&t, PiType::Type3, all, &[0; 512], 8).unwrap_err();
        assert_eq!(e.asc, Asc::GUARD_CHECK_FAILED);
        assert_eq!(
            chk(&t, PiType::Type1, Checks::of(2).unwrap(), &[0; 512], 7),
            Ok(())
        );
        // Escapes: app tag FFFFh (types 1, 2); plus ref FFFF_FFFFh (type 3).
        let esc = Tuple { app: 0xffff, ..t };
        assert_eq!(chk(&esc, PiType::Type1, all, &[0; 512], 9), Ok(()));
        assert!(chk(&esc, PiType::Type3, all, &[0; 512], 9).is_err());
        assert_eq!(
            chk(&Tuple::FORMATTED, PiType::Type3, all, &[1; 512], 9),
            Ok(())
        );
        // Type 2 with a 32-byte CDB's expectations: initial reference tag 5
        // (block 2 of the command expects 7), application tag 0x01xx under
        // mask FF00h.
        let e = crate::cdb::Expected {
            reference: 5,
            app: 0x01ff,
            app_mask: 0xff00,
        };
        assert_eq!(
            t.check(
                PiType::Type2,
                all,
                Want::of(PiType::Type2, Some(e), 100, 2),
                &data,
                102
            ),
            Ok(())
        );
        let bad_app = crate::cdb::Expected { app: 0x0202, ..e };
        let err = t
            .check(
                PiType::Type2,
                all,
                Want::of(PiType::Type2, Some(bad_app), 100, 2),
                &data,
                102,
            )
            .unwrap_err();
        assert_eq!(err.asc, Asc::APP_TAG_CHECK_FAILED);
        let err = t
            .check(
                PiType::Type2,
                all,
                Want::of(PiType::Type2, Some(e), 100, 3),
                &data,
                103,
            )
            .unwrap_err();
        assert_eq!(err.asc, Asc::REF_TAG_CHECK_FAILED);
        // Without a 32-byte CDB type 2 expects no reference tag.
        assert_eq!(Want::of(PiType::Type2, None, 100, 3), Want::default());
        assert_eq!(Want::generated_reference(PiType::Type2, None, 100, 3), 103);
        assert_eq!(Want::generated_reference(PiType::Type2, Some(e), 100, 3), 8);
        assert_eq!(
            Want::generated_reference(PiType::Type3, None, 100, 3),
            0xffff_ffff
        );
        assert_eq!(Checks::of(6), None);
        assert_eq!(Checks::of(7), None);
    }
}
