//! Arbitrary bytes as a rules file.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    srp_initiator::fuzz::rules_file(data);
});
