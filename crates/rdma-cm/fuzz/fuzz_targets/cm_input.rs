//! Arbitrary CM messages, consumer calls and time steps into one endpoint.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rdma_cm::fuzz::cm_input(data);
});
