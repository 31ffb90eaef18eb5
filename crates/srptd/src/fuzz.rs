//! Bodies of the fuzz targets in `fuzz/` (srptd's configuration file and
//! its control socket's requests), shared with the deterministic test
//! `tests/fuzz_inputs.rs`. Bad input gets an error, never a panic, and what
//! srptd writes it reads back the same.

use crate::config::{check_initiator, parse_size, Config, DeviceSection};
use crate::daemon::Request;
use std::path::Path;

/// `data` as an srptd configuration file: it parses and validates or is
/// refused with an error that names a line of the file; what parses is
/// saved as `srptadm write-config` saves it, and the saved file parses
/// back and saves the same.
pub fn srptd_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.toml");
    let cfg = match Config::parse(text, path) {
        Ok(cfg) => cfg,
        Err(e) => {
            // A line past the end is no place in the file.
            assert!(
                e.line <= text.split('\n').count(),
                "error at line {} of a {}-line file: {e}",
                e.line,
                text.split('\n').count()
            );
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    for t in &cfg.targets {
        let _ = t.pkey.get_ref().pkeys();
    }
    let saved = cfg.to_toml();
    let back = Config::parse(&saved, path)
        .unwrap_or_else(|e| panic!("srptd refuses the file it saved: {e}\n{saved}"));
    assert_eq!(back.to_toml(), saved, "saved twice, the files differ");
}

/// A config with one ram device `d0` at LUN 0, to which control requests
/// apply their edits.
const BASE: &str = r#"
[target]
ip = "127.0.0.1"

[[device]]
name = "d0"
handler = "ram"
size = "1M"

[[lun]]
lun = 0
device = "d0"
"#;

/// `data` as a line on srptd's control socket: a request parses or is
/// refused; one that parses goes back out as srptadm would send it and
/// parses the same; the values the daemon parses further before it
/// changes anything (a device's TOML, a size, an initiator name) get a
/// value or an error, and an added device is checked with the running
/// configuration as srptd checks it.
pub fn control_request(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(req) = serde_json::from_str::<Request>(line) else {
        return;
    };
    let sent = serde_json::to_string(&req).expect("a request serialises");
    let back: Request = serde_json::from_str(&sent)
        .unwrap_or_else(|e| panic!("srptd refuses what srptadm sends ({e}): {sent}"));
    assert_eq!(
        serde_json::to_string(&back).expect("a request serialises"),
        sent
    );
    match req {
        Request::AddDevice { toml } => {
            let Ok(d) = toml::from_str::<DeviceSection>(&toml) else {
                return;
            };
            let mut cfg = Config::parse(BASE, Path::new("base.toml")).expect("the base parses");
            cfg.devices.push(d);
            if let Err(e) = cfg.check() {
                assert!(!e.key.is_empty() || !e.message.is_empty());
            }
        }
        Request::Resize { size, .. } => {
            let _ = parse_size(&size);
        }
        Request::AddInitiator { initiator, .. } | Request::RemoveInitiator { initiator, .. } => {
            let _ = check_initiator(&initiator);
        }
        _ => {}
    }
}
