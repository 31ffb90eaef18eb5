//! `tests/c_program.c`, compiled against Debian's `<infiniband/verbs.h>`
//! and linked against this library (not rdma-core's), run on a NIC
//! daemon in this process on 127.92.2.1: refusals with EOPNOTSUPP, the
//! header's inline extended verbs, data moved into registered heap
//! memory, events (see the program's own comment).

mod common;

use rdma_testkit::need;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

#[test]
fn a_c_program_linked_against_the_library_sees_rdma_cores_behaviour() {
    if !need::tool("gcc")
        || !need::have(
            "rdma-core's <infiniband/verbs.h>",
            (!std::path::Path::new("/usr/include/infiniband/verbs.h").exists())
                .then(|| "no /usr/include/infiniband/verbs.h".to_string()),
            "apt-get install libibverbs-dev",
        )
    {
        return;
    }
    let d = common::Daemon::start(IpAddr::V4(Ipv4Addr::new(127, 92, 2, 1)));
    let exe = d.libdir.join("c_program");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c_program.c");
    let out = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-O1", src, "-o"])
        .arg(&exe)
        .arg("-L")
        .arg(&d.libdir)
        .arg("-l:libibverbs.so.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = d
        .command(exe.to_str().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::finish(run, 60);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success() && o.trim_end() == "OK", "{o}{e}");
    // The read-only registration was refused with its reason.
    assert!(e.contains("only private writable memory"), "{e}");
}
