//! Arbitrary bytes, cut into arbitrary chunks, into the MPA FPDU receiver.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = iwarp::fuzz::receiver(data);
});
