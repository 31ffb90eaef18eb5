//! Arbitrary bytes into a fresh iWARP connection, MPA request/reply first.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = iwarp::fuzz::setup(data);
});
