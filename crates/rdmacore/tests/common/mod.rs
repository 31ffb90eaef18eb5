//! What the device tests share: how they say they did not run.

use std::io::Write;

/// Where the device tests do run.
pub const WHERE: &str =
    "they run against Linux rxe in a VM: interop/run scenario rdmacore-conformance-ours";

/// Records that this test needs `what` and did not run because of `why`:
/// a skip through `rdma_testkit::need` (recorded in `RDMA_TEST_SKIPS`).
/// Under `CI=true` it is not a failure: CI's kernel has no RDMA at all,
/// and CI runs these tests in the VM scenario, so a line says so instead.
pub fn not_here(what: &str, why: &str) {
    if rdma_testkit::need::in_ci() {
        // Straight to fd 2, past libtest's capture.
        let _ = writeln!(
            std::io::stderr().lock(),
            "NOT RUN (CI): {what}: {why} ({WHERE})"
        );
    } else {
        rdma_testkit::need::have(what, Some(why.to_string()), WHERE);
    }
}
