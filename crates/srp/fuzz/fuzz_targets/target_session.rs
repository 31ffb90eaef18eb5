//! SRP target session: a script of IUs, completions, SCSI results and
//! events against one channel while another runs beside it.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../target_session_body.rs");

fuzz_target!(|data: &[u8]| {
    let _ = run_target_session(data);
});
