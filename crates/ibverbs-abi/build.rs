//! Links the cdylib as rdma-core's libibverbs: its SONAME, and a version
//! script naming each exported function under its version node. The
//! functions and versions are the `symbols!` lists at the end of
//! src/exports.rs and src/private.rs (one `name @ "VERSION",` per line),
//! which also bind each with `.symver`; this script is written from
//! those lists.

use std::collections::BTreeMap;
use std::fmt::Write;

/// The version nodes of rdma-core 44's libibverbs.so.1 that Debian's
/// binaries name (`objdump -T`), oldest first: each inherits the one
/// before it, as in rdma-core.
const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];
const PRIVATE: &str = "IBVERBS_PRIVATE_34";

/// The files under `src/` with a `symbols!` list.
const SOURCES: &[&str] = &["exports.rs", "private.rs"];

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for file in SOURCES {
        let src = format!("{dir}/src/{file}");
        println!("cargo:rerun-if-changed={src}");
        let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let list = text
            .split("\nsymbols! {\n")
            .nth(1)
            .and_then(|t| t.split("\n}").next())
            .unwrap_or_else(|| panic!("a `symbols! {{` list in {src}"));
        for line in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (name, ver) = line
                .trim_end_matches(',')
                .split_once(" @ ")
                .unwrap_or_else(|| panic!("`name @ \"VERSION\",` expected in symbols!: {line}"));
            let ver = ver.trim_matches('"');
            let node = NODES
                .iter()
                .chain([&PRIVATE])
                .find(|n| **n == ver)
                .unwrap_or_else(|| panic!("{name}: version {ver} is not one of build.rs's NODES"));
            by_node.entry(node).or_default().push(name.to_string());
        }
    }
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for node in NODES.iter().chain([&PRIVATE]) {
        let names = by_node.get(node).cloned().unwrap_or_default();
        let global = if names.is_empty() {
            String::new()
        } else {
            format!("global: {}; ", names.join("; "))
        };
        let local = if prev.is_none() { "local: *; " } else { "" };
        let parent = match prev {
            Some(p) if *node != PRIVATE => format!(" {p}"),
            _ => String::new(),
        };
        writeln!(map, "{node} {{ {global}{local}}}{parent};").expect("write to a String");
        prev = Some(node);
    }
    let path = format!("{out}/exports.map");
    std::fs::write(&path, map).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
