//! Arbitrary bytes as an entry of nicd's shared-memory rings (a kind
//! byte, then the slot).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nicd::fuzz::ring_entry(data);
});
