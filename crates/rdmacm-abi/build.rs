//! Links the cdylib as rdma-core's librdmacm: its SONAME, and a version
//! script naming each exported function under its version node, from
//! the `forward!` list of src/lib.rs (one `fn name(...) -> ... => "VERSION";`
//! per line), which also binds each with `.symver`.

use std::collections::BTreeMap;
use std::fmt::Write;

/// The version nodes of rdma-core 44's librdmacm.so.1, oldest first:
/// each inherits the one before it.
const NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let src = format!("{dir}/src/lib.rs");
    println!("cargo:rerun-if-changed={src}");
    let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let list = text
        .split("\nforward! {\n")
        .nth(1)
        .and_then(|t| t.split("\n}").next())
        .unwrap_or_else(|| panic!("a `forward! {{` list in {src}"));
    let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    // Entries may span lines: each ends with `@ "VERSION";`.
    for entry in list.split(';').map(str::trim).filter(|l| !l.is_empty()) {
        let name = entry
            .split('(')
            .next()
            .map(|n| n.trim().trim_start_matches("fn ").trim())
            .unwrap_or_else(|| panic!("`name(...)` expected in forward!: {entry}"));
        let ver = entry
            .rsplit_once(" => ")
            .map(|(_, v)| v.trim().trim_matches('"'))
            .unwrap_or_else(|| panic!("`=> \"VERSION\"` expected in forward!: {entry}"));
        let node = NODES
            .iter()
            .find(|n| **n == ver)
            .unwrap_or_else(|| panic!("{name}: version {ver} is not one of build.rs's NODES"));
        by_node.entry(node).or_default().push(name.to_string());
    }
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for node in NODES {
        let names = by_node.get(node).cloned().unwrap_or_default();
        let global = if names.is_empty() {
            String::new()
        } else {
            format!("global: {}; ", names.join("; "))
        };
        let local = if prev.is_none() { "local: *; " } else { "" };
        let parent = prev.map(|p| format!(" {p}")).unwrap_or_default();
        writeln!(map, "{node} {{ {global}{local}}}{parent};").expect("write to a String");
        prev = Some(node);
    }
    let path = format!("{out}/exports.map");
    std::fs::write(&path, map).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
}
