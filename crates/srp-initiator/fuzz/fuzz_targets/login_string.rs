//! Arbitrary bytes as a login string.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    srp_initiator::fuzz::login_string(data);
});
