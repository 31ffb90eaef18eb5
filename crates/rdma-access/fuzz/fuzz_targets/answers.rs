#![no_main]
use libfuzzer_sys::fuzz_target;

// Any bytes as a DM request to an I/O unit and as an SA response to read.
fuzz_target!(|data: &[u8]| {
    rdma_access::sa::fuzz_answers(data);
});
