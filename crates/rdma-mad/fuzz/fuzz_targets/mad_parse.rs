#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rdma_mad::fuzz::parse_all(data));
