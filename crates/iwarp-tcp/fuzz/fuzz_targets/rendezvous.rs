//! Arbitrary MPA private data as the verbs-only setup's rendezvous.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    iwarp_tcp::fuzz::rendezvous(data);
});
