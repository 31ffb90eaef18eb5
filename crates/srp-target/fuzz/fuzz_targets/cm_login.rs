//! The target's CM login path: REQ/REP/RTU/REJ/DREQ/MRA sequences with
//! arbitrary private data from several initiator ports, time passing and
//! target-side closes; see `cm_login_body.rs` for the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../cm_login_body.rs");

fuzz_target!(|data: &[u8]| {
    run_cm_login(data);
});
