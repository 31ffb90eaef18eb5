//! Header-level compatibility with Debian's rdma-core (issue 28): every
//! size, offset and constant of `ibverbs_abi::rdmacm::abi`, printed by a
//! C program compiled against Debian's `<rdma/rdma_cma.h>`
//! (librdmacm-dev), compared with the Rust side; and the symbols and
//! versions of the built `librdmacm.so.1` against what Debian's rping,
//! perftest and fio import.

mod common;

use ibverbs_abi::rdmacm::abi::{layout, CONSTANTS};
use rdma_testkit::need;
use std::process::Command;

const HEADER: &str = "/usr/include/rdma/rdma_cma.h";

fn have_header() -> bool {
    need::tool("gcc")
        && need::have(
            "rdma-core's <rdma/rdma_cma.h>",
            (!std::path::Path::new(HEADER).exists()).then(|| format!("no {HEADER}")),
            "apt-get install librdmacm-dev",
        )
}

#[test]
fn every_size_and_offset_matches_debians_rdma_cma_h() {
    if !have_header() {
        return;
    }
    let all = layout();
    let exprs: Vec<&str> = all.iter().map(|(e, _)| *e).collect();
    let c = common::c_values("rdma/rdma_cma.h", &exprs);
    assert_eq!(c.len(), all.len());
    let wrong: Vec<String> = all
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| *rust as i64 != **c)
        .map(|((e, rust), c)| format!("{e}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layouts differ:\n{}", wrong.join("\n"));
}

#[test]
fn every_constant_matches_debians_rdma_cma_h() {
    if !have_header() {
        return;
    }
    let exprs: Vec<&str> = CONSTANTS.iter().map(|(e, _)| *e).collect();
    let c = common::c_values("rdma/rdma_cma.h", &exprs);
    let wrong: Vec<String> = CONSTANTS
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| *rust != **c)
        .map(|((e, rust), c)| format!("{e}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "constants differ:\n{}", wrong.join("\n"));
}

#[test]
fn the_event_names_are_the_headers_enum() {
    use ibverbs_abi::rdmacm::abi::EVENT_NAMES;
    for (i, n) in EVENT_NAMES.iter().enumerate() {
        let c = CONSTANTS.iter().find(|(name, _)| name == n);
        assert_eq!(c.map(|(_, v)| *v), Some(i as i64), "{n}");
    }
}

#[test]
fn the_library_exports_what_rping_perftest_and_fio_import() {
    if !need::tools(&["objdump", "rping", "ib_write_bw", "ib_send_bw", "fio"]) {
        return;
    }
    let lib = common::rdmacm_library();
    let ours = common::imports_defined(&lib);
    for tool in ["rping", "ib_write_bw", "ib_send_bw", "fio"] {
        let bin = need::which(tool).unwrap();
        let want = common::imports(&bin, "RDMACM");
        assert!(want.len() >= 10, "{tool} imports {want:?}");
        for (name, ver) in want {
            assert!(
                ours.contains(&(name.clone(), ver.clone())),
                "{tool} imports {name}@{ver}, which {} does not export",
                lib.display()
            );
        }
    }
    let out = Command::new("objdump")
        .arg("-p")
        .arg(&lib)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("SONAME               librdmacm.so.1"),
        "{text}"
    );
    // Exactly the list, and the list is the one ibverbs-abi implements.
    let mut listed: Vec<(String, String)> = rdmacm_abi::EXPORTS
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let mut exported = ours.clone();
    listed.sort();
    exported.sort();
    assert_eq!(exported, listed);
    let mut implemented: Vec<(&str, &str)> = ibverbs_abi::rdmacm::exports::EXPORTS.to_vec();
    let mut forwarded: Vec<(&str, &str)> = rdmacm_abi::EXPORTS.to_vec();
    implemented.sort();
    forwarded.sort();
    assert_eq!(forwarded, implemented);
    // Each forwards to a name libibverbs.so.1 exports.
    let verbs = Command::new("objdump")
        .arg("-T")
        .arg(common::library())
        .output()
        .unwrap();
    let verbs = String::from_utf8_lossy(&verbs.stdout);
    for (name, _) in rdmacm_abi::EXPORTS {
        let want = format!(" ibverbs_abi_{name}\n");
        assert!(
            verbs.contains(&want),
            "libibverbs.so.1 lacks ibverbs_abi_{name}"
        );
    }
}

/// A program that calls what the library refuses gets rdma-core's
/// convention, -1 and errno, not a crash; and the event channel's
/// descriptor is one the program can poll.
#[test]
fn refused_calls_answer_minus_one_and_errno() {
    if !have_header() {
        return;
    }
    let d = common::daemon(std::net::IpAddr::from([127, 128, 0, 40]));
    let dir = std::env::temp_dir().join(format!("rdmacm-abi-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("refused.c");
    std::fs::write(
        &src,
        r#"#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>
int main(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    if (!ch) { perror("channel"); return 1; }
    int r;
    errno = 0;
    r = rdma_create_id(ch, &id, NULL, RDMA_PS_UDP);
    printf("udp %d %d\n", r, errno == EOPNOTSUPP);
    if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) { perror("create_id"); return 1; }
    errno = 0;
    r = rdma_notify(id, IBV_EVENT_COMM_EST);
    printf("notify %d %d\n", r, errno == ENOSYS);
    errno = 0;
    r = rdma_migrate_id(id, ch);
    printf("migrate %d %d\n", r, errno == ENOSYS);
    errno = 0;
    r = rdma_accept(id, NULL);
    printf("accept %d %d\n", r, errno == EOPNOTSUPP || errno == EINVAL);
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    printf("poll %d\n", poll(&p, 1, 0));
    printf("event %s\n", rdma_event_str(RDMA_CM_EVENT_ESTABLISHED));
    int n = -1;
    struct ibv_context **devs = rdma_get_devices(&n);
    printf("devices %d %s\n", n, devs && devs[0] ? ibv_get_device_name(devs[0]->device) : "-");
    rdma_free_devices(devs);
    printf("destroy %d\n", rdma_destroy_id(id));
    rdma_destroy_event_channel(ch);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("refused");
    // Compiled against Debian's headers and libraries, run on ours.
    let out = Command::new("gcc")
        .arg(&src)
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
    let out = d.command(exe.to_str().unwrap()).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "udp -1 1",
        "notify -1 1",
        "migrate -1 1",
        "accept -1 1",
        "poll 0",
        "event RDMA_CM_EVENT_ESTABLISHED",
        "devices 1 nicd0",
        "destroy 0",
    ] {
        assert!(o.lines().any(|l| l == want), "no {want:?} in\n{o}");
    }
}
