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

/// Compiles and runs a program printing `expr=value` for each of
/// `exprs`; the values as the C side has them.
fn c_values(exprs: &[&str]) -> Vec<i64> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ibverbs-abi-layout-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for e in exprs {
        src.push_str(&format!("  printf(\"%lld\\n\", (long long)({e}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, src).unwrap();
    let out = Command::new("gcc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc against {HEADER}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

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
    let c = c_values(&exprs);
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
    let c = c_values(&exprs);
    let wrong: Vec<String> = CONSTANTS
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| *rust != **c)
        .map(|((e, rust), c)| format!("{e}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "constants differ:\n{}", wrong.join("\n"));
}

/// The versioned names a binary imports from libibverbs (`objdump -T`).
fn imports(bin: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(bin).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("*UND*") && l.contains("IBVERBS"))
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let ver = f.next()?.trim_matches(|c| c == '(' || c == ')');
            Some((name.to_string(), ver.to_string()))
        })
        .collect()
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
    let ours: Vec<(String, String)> = imports_defined(&lib);
    for tool in [
        "ibv_devinfo",
        "ibv_devices",
        "ibv_rc_pingpong",
        "ibv_ud_pingpong",
    ] {
        let bin = need::which(tool).unwrap();
        let want = imports(&bin);
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
    let exported = imports_defined(&lib);
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
    let ours = imports_defined(&common::library());
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
        for (name, ver) in imports(file) {
            assert!(
                ours.contains(&(name.clone(), ver.clone())),
                "{} imports {name}@{ver}, which the library does not export",
                file.display()
            );
        }
    }
}

/// The versioned names `lib` defines (`objdump -T`; each function's
/// unversioned `ibverbs_abi_` twin left out).
fn imports_defined(lib: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(" g ") && (l.contains(" DF ") || l.contains(" DO ")) && !l.contains("*UND*")
        })
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let ver = f.next()?.trim_matches(|c| c == '(' || c == ')');
            (ver != "Base").then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}
