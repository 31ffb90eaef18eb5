//! Drive one SRP initiator channel with a fuzzed script of operations and
//! received IUs; see `initiator_body.rs` for the properties checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../initiator_body.rs");

fuzz_target!(|data: &[u8]| {
    run_initiator_session(data);
});
