//! Big-endian field access shared by the views. Callers check lengths first
//! (`new_checked`), so these index directly.

pub fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

pub fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(b[off..off + 8].try_into().unwrap())
}

/// The high 24 bits of the 32-bit word at `off` (QPN/PSN/EECN fields).
pub fn u24_at(b: &[u8], off: usize) -> u32 {
    u32_at(b, off) >> 8
}

pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

/// Writes the high 24 bits of the word at `off`, keeping its low byte.
pub fn put_u24(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Reads `width` bits of byte `off`, `shift` bits from its low end.
pub fn bits(b: &[u8], off: usize, shift: u8, width: u8) -> u8 {
    (b[off] >> shift) & ((1u16 << width) - 1) as u8
}

/// Writes `width` bits of byte `off`, `shift` bits from its low end.
pub fn put_bits(b: &mut [u8], off: usize, shift: u8, width: u8, v: u8) {
    let mask = (((1u16 << width) - 1) as u8) << shift;
    b[off] = (b[off] & !mask) | ((v << shift) & mask);
}
