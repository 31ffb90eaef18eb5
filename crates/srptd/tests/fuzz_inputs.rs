//! The fuzz targets' committed seeds and regression inputs, replayed
//! (`fuzz/seeds/<target>`, `fuzz/regressions/<target>`): every seed must
//! also be what it claims to be, a file srptd takes or a request it parses,
//! so the targets start from inside the formats.

use srptd::config::Config;
use srptd::daemon::Request;
use std::path::Path;

#[test]
fn srptd_config_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "srptd_config",
        srptd::fuzz::srptd_config,
    );
}

#[test]
fn control_request_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(
        env!("CARGO_MANIFEST_DIR"),
        "control_request",
        srptd::fuzz::control_request,
    );
}

/// The hand-written seeds are valid: the shipped configuration files
/// parse, and each request line names a command.
#[test]
fn the_hand_written_seeds_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    for f in ["etc-srptd.toml", "etc-srptd-two-ports.toml"] {
        let p = dir.join("srptd_config").join(f);
        Config::load(&p).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut parsed = 0;
    for e in std::fs::read_dir(dir.join("control_request")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("req-") {
            let line = std::fs::read_to_string(&p).unwrap();
            serde_json::from_str::<Request>(&line).unwrap_or_else(|e| panic!("{name}: {e}"));
            parsed += 1;
        }
    }
    assert_eq!(parsed, 17, "one request per command");
}
