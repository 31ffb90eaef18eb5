//! Header-level compatibility with Debian's rdma-core (issue 28): every
//! size, offset and constant `ibverbs_abi::abi` relies on, printed by a C
//! program compiled with gcc against Debian's `<infiniband/verbs.h>`
//! (libibverbs-dev), compared with the Rust side; and the symbol versions
//! of the built library against what Debian's binaries import.

mod common;

use ibverbs_abi::abi::{CONSTANTS, LAYOUT};
use rdma_testkit::need;
use std::process::Command;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

fn have_header() -> bool {
    need::tool("gcc")
        && need::have(
            "rdma-core's <infiniband/verbs.h>",
            (!std::path::Path::new(HEADER).exists()).then(|| format!("no {HEADER}")),
            "apt-get install libibverbs-dev",
        )
}

#[test]
fn every_size_and_offset_matches_debians_header() {
    if !have_header() {
        return;
    }
    let exprs: Vec<&str> = LAYOUT.iter().map(|(e, _)| *e).collect();
    let c = common::c_values("infiniband/verbs.h", &exprs);
    assert_eq!(c.len(), LAYOUT.len());
    let wrong: Vec<String> = LAYOUT
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| *rust as i64 != **c)
        .map(|((e, rust), c)| format!("{e}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layouts differ:\n{}", wrong.join("\n"));
}

#[test]
fn every_constant_matches_debians_header() {
    if !have_header() {
        return;
    }
    let exprs: Vec<&str> = CONSTANTS.iter().map(|(e, _)| *e).collect();
    let c = common::c_values("infiniband/verbs.h", &exprs);
    let wrong: Vec<String> = CONSTANTS
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| *rust != **c)
        .map(|((e, rust), c)| format!("{e}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "constants differ:\n{}", wrong.join("\n"));
}

#[test]
fn the_library_exports_what_debians_verbs_tools_import() {
    if !need::tools(&[
        "objdump",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_ud_pingpong",
    ]) {
        return;
    }
    let lib = common::library();
    let ours: Vec<(String, String)> = common::imports_defined(&lib);
    for tool in [
        "ibv_devinfo",
        "ibv_devices",
        "ibv_rc_pingpong",
        "ibv_ud_pingpong",
    ] {
        let bin = need::which(tool).unwrap();
        let want = common::imports(&bin, "IBVERBS");
        assert!(want.len() >= 4, "{tool} imports {want:?}");
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
        text.contains("SONAME               libibverbs.so.1"),
        "{text}"
    );
    // Nothing but the versioned verbs is exported.
    let exported = common::imports_defined(&lib);
    assert_eq!(
        exported.len(),
        ibverbs_abi::exports::EXPORTS.len() + ibverbs_abi::private::EXPORTS.len(),
        "{exported:?}"
    );
}

/// perftest links librdmacm and two of rdma-core's provider libraries
/// (libmlx5, libefa), all bound at load (`-z now`): every versioned name
/// they import from libibverbs must be there.
#[test]
fn the_library_exports_what_perftest_and_its_libraries_import() {
    if !need::tools(&["objdump", "ldd", "ib_write_bw"]) {
        return;
    }
    let ours = common::imports_defined(&common::library());
    let bin = need::which("ib_write_bw").unwrap();
    let out = Command::new("ldd").arg(&bin).output().unwrap();
    let libs: Vec<std::path::PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(" => ").nth(1)?.split(' ').next().map(Into::into))
        .filter(|p: &std::path::PathBuf| {
            ["librdmacm", "libmlx5", "libefa"]
                .iter()
                .any(|n| p.to_string_lossy().contains(n))
        })
        .collect();
    assert_eq!(libs.len(), 3, "{libs:?}");
    for file in libs.iter().chain([&bin]) {
        for (name, ver) in common::imports(file, "IBVERBS") {
            assert!(
                ours.contains(&(name.clone(), ver.clone())),
                "{} imports {name}@{ver}, which the library does not export",
                file.display()
            );
        }
    }
}
