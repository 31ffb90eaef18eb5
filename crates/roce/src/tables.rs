//! Encoded timer and credit values of the AETH (IBA 9.7.5.2.8, 9.7.7.2.5).
//!
//! TODO(wire): move next to the AETH codec in `rdma-wire` once it lands.

use rdma_types::Duration;

/// RNR NAK timer field (5 bits) to the minimum wait, IBA table 45.
/// Code 0 is the longest wait, 655.36 ms.
pub fn rnr_timer_decode(code: u8) -> Duration {
    // Microseconds for codes 1..=31; code 0 handled below.
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(MICROS[usize::from(code & 0x1F)])
}

/// End-to-end credit values by 5-bit code (IBA table 46); code 31 means
/// "invalid": the responder does not limit the requester.
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The largest code whose credit value does not exceed `available`
/// receive WQEs; `None` (no limit) encodes as 31.
pub fn credit_count_encode(available: Option<u32>) -> u8 {
    match available {
        None => 31,
        Some(n) => CREDITS.iter().rposition(|&c| c <= n).unwrap_or(0) as u8,
    }
}

/// Credit code to receive WQEs; `None` for code 31 (unlimited).
pub fn credit_count_decode(code: u8) -> Option<u32> {
    CREDITS.get(usize::from(code & 0x1F)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_timer_codes() {
        assert_eq!(rnr_timer_decode(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer_decode(1), Duration::from_micros(10));
        assert_eq!(rnr_timer_decode(14), Duration::from_micros(1_280));
        assert_eq!(rnr_timer_decode(31), Duration::from_micros(491_520));
    }

    #[test]
    fn credits_round_down_and_round_trip() {
        assert_eq!(credit_count_encode(Some(0)), 0);
        assert_eq!(
            credit_count_encode(Some(5)),
            4,
            "5 WQEs: code 5 means 6, too many; code 4 means 4"
        );
        assert_eq!(credit_count_decode(credit_count_encode(Some(5))), Some(4));
        assert_eq!(credit_count_encode(Some(100)), 13);
        assert_eq!(credit_count_encode(Some(1_000_000)), 30);
        assert_eq!(credit_count_encode(None), 31);
        assert_eq!(credit_count_decode(31), None);
        for code in 0..31u8 {
            assert_eq!(credit_count_encode(credit_count_decode(code)), code);
        }
    }
}
