//! The per-unit stamp written by verifying workloads.
//!
//! Layout of one 512-byte unit (little endian):
//!
//! | bytes   | field                                     |
//! |---------|-------------------------------------------|
//! | 0..8    | magic `BLKLOAD1`                          |
//! | 8..16   | byte offset of the unit on the device     |
//! | 16..20  | generation (1 for the first write)        |
//! | 20..24  | job seed                                  |
//! | 24..28  | CRC32 of the unit with these 4 bytes zero |
//! | 28..512 | filler from (offset, generation, seed)    |

use crate::Rng;

/// Bytes per stamped unit.
pub const UNIT: usize = 512;

const MAGIC: &[u8; 8] = b"BLKLOAD1";

/// Why a unit did not hold what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// All zeros: never written, or the write was lost.
    Zeros,
    /// Not a stamp, or the CRC does not match: corrupt data.
    Corrupt,
    /// A valid stamp written for another offset: misplaced data.
    Misplaced {
        /// Offset the unit's stamp names.
        holds: u64,
    },
    /// An older or newer generation than the last acknowledged write.
    Generation {
        /// Generation found.
        found: u32,
        /// Generation expected.
        expected: u32,
    },
    /// A valid stamp from another run or job.
    Seed {
        /// Seed found.
        found: u32,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Zeros => f.write_str("zeros where data was written (lost write)"),
            Mismatch::Corrupt => f.write_str("corrupt data (stamp or CRC wrong)"),
            Mismatch::Misplaced { holds } => {
                write!(
                    f,
                    "misplaced data: holds the unit written for offset {holds:#x}"
                )
            }
            Mismatch::Generation { found, expected } if found < expected => write!(
                f,
                "stale data: generation {found}, last acknowledged write was {expected}"
            ),
            Mismatch::Generation { found, expected } => write!(
                f,
                "generation {found} newer than the last acknowledged write {expected}"
            ),
            Mismatch::Seed { found } => write!(f, "data from another run (seed {found:#x})"),
        }
    }
}

/// Fills `unit` with the stamp for `offset`, `gen`, `seed`.
pub fn fill_unit(unit: &mut [u8], offset: u64, gen: u32, seed: u32) {
    assert_eq!(unit.len(), UNIT, "a unit is {UNIT} bytes");
    unit[0..8].copy_from_slice(MAGIC);
    unit[8..16].copy_from_slice(&offset.to_le_bytes());
    unit[16..20].copy_from_slice(&gen.to_le_bytes());
    unit[20..24].copy_from_slice(&seed.to_le_bytes());
    unit[24..28].fill(0);
    let mut rng = Rng::new(offset ^ ((gen as u64) << 40) ^ ((seed as u64) << 8));
    for chunk in unit[28..].chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let crc = crc32fast::hash(unit);
    unit[24..28].copy_from_slice(&crc.to_le_bytes());
}

/// Checks that `unit` holds the stamp for `offset`, `gen`, `seed`.
pub fn check_unit(unit: &[u8], offset: u64, gen: u32, seed: u32) -> Result<(), Mismatch> {
    if unit.len() != UNIT || &unit[0..8] != MAGIC {
        return Err(if unit.iter().all(|&b| b == 0) {
            Mismatch::Zeros
        } else {
            Mismatch::Corrupt
        });
    }
    let mut copy = [0u8; UNIT];
    copy.copy_from_slice(unit);
    let stored = u32::from_le_bytes(copy[24..28].try_into().unwrap());
    copy[24..28].fill(0);
    if crc32fast::hash(&copy) != stored {
        return Err(Mismatch::Corrupt);
    }
    let holds = u64::from_le_bytes(unit[8..16].try_into().unwrap());
    let found_gen = u32::from_le_bytes(unit[16..20].try_into().unwrap());
    let found_seed = u32::from_le_bytes(unit[20..24].try_into().unwrap());
    if holds != offset {
        return Err(Mismatch::Misplaced { holds });
    }
    if found_seed != seed {
        return Err(Mismatch::Seed { found: found_seed });
    }
    if found_gen != gen {
        return Err(Mismatch::Generation {
            found: found_gen,
            expected: gen,
        });
    }
    Ok(())
}

/// `len` bytes as they belong at byte offset `at`, for tests that move
/// hundreds of MiB in big transfers: every unit starts with its own byte
/// offset, then noise shifted by the unit number, so a misplaced unit
/// shows. Built by copies, which a debug build does at memcpy speed (the
/// CRC'd stamp of [`fill_unit`] costs seconds per 100 MiB there).
pub fn offset_units(at: u64, len: usize) -> Vec<u8> {
    assert_eq!(len % UNIT, 0, "whole units of {UNIT} bytes");
    let noise: Vec<u8> = (0..2 * UNIT).map(|i| (i * 13 + i / 7) as u8).collect();
    let mut v = vec![0u8; len];
    for (k, unit) in v.chunks_exact_mut(UNIT).enumerate() {
        let off = at + (k * UNIT) as u64;
        let n = (off / UNIT as u64 % 509) as usize;
        unit.copy_from_slice(&noise[n..n + UNIT]);
        unit[..8].copy_from_slice(&off.to_le_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_units_say_where_they_belong_and_differ() {
        let v = offset_units(8 * UNIT as u64, 3 * UNIT);
        for (k, u) in v.chunks(UNIT).enumerate() {
            let off = u64::from_le_bytes(u[..8].try_into().unwrap());
            assert_eq!(off, ((8 + k) * UNIT) as u64);
        }
        assert_ne!(v[8..UNIT], v[UNIT + 8..2 * UNIT], "noise shifts per unit");
        assert_eq!(offset_units(9 * UNIT as u64, UNIT), v[UNIT..2 * UNIT]);
    }

    #[test]
    fn a_stamp_checks_and_every_kind_of_damage_is_named() {
        let mut u = [0u8; UNIT];
        assert_eq!(check_unit(&u, 0, 1, 7), Err(Mismatch::Zeros));
        fill_unit(&mut u, 4096, 3, 7);
        assert_eq!(check_unit(&u, 4096, 3, 7), Ok(()));
        assert_eq!(
            check_unit(&u, 4096, 4, 7),
            Err(Mismatch::Generation {
                found: 3,
                expected: 4
            })
        );
        assert_eq!(
            check_unit(&u, 8192, 3, 7),
            Err(Mismatch::Misplaced { holds: 4096 })
        );
        assert_eq!(check_unit(&u, 4096, 3, 8), Err(Mismatch::Seed { found: 7 }));
        let mut flipped = u;
        flipped[300] ^= 0x10;
        assert_eq!(check_unit(&flipped, 4096, 3, 7), Err(Mismatch::Corrupt));
        let mut other = [0u8; UNIT];
        fill_unit(&mut other, 4096, 2, 7);
        assert_ne!(other[28..], u[28..], "filler depends on the generation");
        assert!(Mismatch::Generation {
            found: 1,
            expected: 2
        }
        .to_string()
        .starts_with("stale data"));
    }
}
