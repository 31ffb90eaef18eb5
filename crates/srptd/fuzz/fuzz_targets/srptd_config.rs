//! Arbitrary bytes as srptd's configuration file.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    srptd::fuzz::srptd_config(data);
});
