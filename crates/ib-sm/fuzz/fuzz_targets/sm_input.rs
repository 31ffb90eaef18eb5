//! Arbitrary SMPs, SA MADs and time steps into one subnet manager.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ib_sm::fuzz::sm_input(data);
});
