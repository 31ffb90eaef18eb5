//! Arbitrary bytes as a line on srptd's control socket.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    srptd::fuzz::control_request(data);
});
