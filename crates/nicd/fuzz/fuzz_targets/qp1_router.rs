//! Arbitrary bytes as steps through the shared QP1's MAD router.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nicd::fuzz::qp1_router(data);
});
