//! A C program built against Debian's `<rdma/rdma_cma.h>` and librdmacm,
//! run on this crate's library (tests/cm_program.c): what Debian's
//! programs leave out, a non-blocking channel, a reject and an accept
//! each with private data both ways, a disconnect both sides see.

mod common;

use rdma_testkit::need;
use std::process::Command;

#[test]
fn reject_accept_private_data_and_disconnect_from_c() {
    if !need::tool("gcc")
        || !need::have(
            "rdma-core's <rdma/rdma_cma.h>",
            (!std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists())
                .then(|| "no /usr/include/rdma/rdma_cma.h".to_string()),
            "apt-get install librdmacm-dev",
        )
    {
        return;
    }
    let d = common::daemon(std::net::IpAddr::from([127, 128, 0, 50]));
    let dir = std::env::temp_dir().join(format!("rdmacm-abi-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("cm_program");
    let out = Command::new("gcc")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cm_program.c"))
        .arg("-o")
        .arg(&exe)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let child = common::spawn(
        d.command(exe.to_str().unwrap())
            .args(["127.128.0.50", "17150"]),
    );
    let out = common::finish(child, 60);
    let _ = std::fs::remove_dir_all(&dir);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{o}{e}");
    let want = [
        "nonblocking -1 1",
        "listening on 17150",
        "route paths 1",
        "request \"hello-rdmacm\" listener 1 port 1",
        // IBA 12.6.7.2: reason 28, consumer defined.
        "rejected 28 \"no-thanks\"",
        "route paths 1",
        "request \"again\"",
        "established \"welcome\" qp 1",
        // IBV_QPS_RTS.
        "both established, client QP state 3",
        "both disconnected",
        "done",
    ];
    let got: Vec<&str> = o.lines().collect();
    assert_eq!(got, want, "{o}{e}");
}
