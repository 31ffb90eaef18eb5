#![no_main]
use libfuzzer_sys::fuzz_target;

// MADs (length-prefixed) into a port's dispatcher with DM, SA and CM
// agents and requests in flight; the body asserts the reply rules.
fuzz_target!(|data: &[u8]| {
    rdma_access::gsi::fuzz_dispatch(data);
});
