//! Arbitrary bytes as a target's answers: VPD 0x83, sense, REPORT TARGET
//! PORT GROUPS data.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    srp_initiator::fuzz::target_answers(data);
});
