//! Arbitrary packets, posts and time steps into RC/UC/UD QPs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = roce::fuzz::qp_input(data);
});
