//! What the device tests share: how they say they did not run.

/// Where the device tests do run.
pub const WHERE: &str =
    "they run against Linux rxe in a VM: interop/run scenario rdmacore-conformance-ours";

/// Records that this test needs `what` and did not run because of `why`:
/// a skip through `rdma_testkit::need` (recorded in `RDMA_TEST_SKIPS`;
/// under `CI=true` a failure). `cargo test` does not run these tests (they
/// are `test = false`): this is for a run by hand on a machine without a
/// device.
pub fn not_here(what: &str, why: &str) {
    rdma_testkit::need::have(what, Some(why.to_string()), WHERE);
}
