//! Arbitrary bytes as a frame on nicd's socket (after its length field).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nicd::fuzz::frame(data);
});
