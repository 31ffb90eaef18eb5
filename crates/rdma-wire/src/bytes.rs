//! Big-endian field access for the views. Callers pass slices of the
//! exact field width (the views' `field` ranges), so the conversions below
//! cannot fail once a view has been checked.

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

pub(crate) fn put16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits of `v`.
pub(crate) fn put24(b: &mut [u8], v: u32) {
    b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn put32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes());
}

/// `Err(Truncated)` unless `have >= need`.
pub(crate) fn need(what: &'static str, need: usize, have: usize) -> Result<(), crate::ParseError> {
    if have < need {
        Err(crate::ParseError::Truncated { what, need, have })
    } else {
        Ok(())
    }
}
