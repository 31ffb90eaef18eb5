#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rdma_perf::fuzz::peer_messages(data));
