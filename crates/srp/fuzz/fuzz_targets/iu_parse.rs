//! Fuzz every SRP IU parser; see `iu_body.rs` for the properties checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../iu_body.rs");

fuzz_target!(|data: &[u8]| {
    let _ = check_iu_bytes(data);
});
