//! LUN encoding per SAM-5 4.7: peripheral device addressing (LUN < 256) and
//! flat space addressing (LUN < 16384) in the first level of the 8-byte field.

use thiserror::Error;

/// A logical unit number (the single-level value, 0..16384).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lun(u16);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LunError {
    #[error("LUN {0} does not fit flat space addressing (max 16383)")]
    TooLarge(u32),
    #[error("LUN field {0:016x}: unsupported address method or multi-level LUN")]
    Unsupported(u64),
}

impl Lun {
    pub const MAX: u16 = 0x3fff;

    pub fn new(v: u32) -> Result<Lun, LunError> {
        if v > Lun::MAX as u32 {
            return Err(LunError::TooLarge(v));
        }
        Ok(Lun(v as u16))
    }

    pub fn value(self) -> u16 {
        self.0
    }

    /// The 8-byte LUN field (big-endian as carried in SRP_CMD and REPORT LUNS).
    pub fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        if self.0 < 256 {
            b[1] = self.0 as u8; // peripheral device addressing, bus 0
        } else {
            b[0] = 0x40 | (self.0 >> 8) as u8; // flat space addressing
            b[1] = self.0 as u8;
        }
        b
    }

    pub fn decode(b: [u8; 8]) -> Result<Lun, LunError> {
        let raw = u64::from_be_bytes(b);
        if b[2..].iter().any(|&x| x != 0) {
            return Err(LunError::Unsupported(raw));
        }
        match b[0] >> 6 {
            0b00 if b[0] == 0 => Ok(Lun(b[1] as u16)),
            0b01 => Ok(Lun((((b[0] & 0x3f) as u16) << 8) | b[1] as u16)),
            _ => Err(LunError::Unsupported(raw)),
        }
    }
}

impl core::fmt::Display for Lun {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "LUN {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors() {
        // Peripheral: byte 0 = 00b method, bus 0; byte 1 = LUN 5.
        assert_eq!(Lun::new(5).unwrap().encode(), [0, 5, 0, 0, 0, 0, 0, 0]);
        // Flat: byte 0 = 01b method | high 6 bits (0x01); byte 1 = 0x2c -> 300.
        assert_eq!(
            Lun::new(300).unwrap().encode(),
            [0x41, 0x2c, 0, 0, 0, 0, 0, 0]
        );
        for v in [0u32, 1, 255, 256, 1000, 16383] {
            let l = Lun::new(v).unwrap();
            assert_eq!(Lun::decode(l.encode()), Ok(l));
        }
        assert_eq!(Lun::new(16384), Err(LunError::TooLarge(16384)));
        // Peripheral with non-zero bus, logical unit method, second level: refused.
        assert!(Lun::decode([0x01, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Lun::decode([0x80, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Lun::decode([0, 1, 0, 1, 0, 0, 0, 0]).is_err());
    }
}
