//! Arbitrary stream bytes and posts into an established iWARP responder.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = iwarp::fuzz::connection(data);
});
