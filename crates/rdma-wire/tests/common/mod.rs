//! Reading the capture frames in `testdata/roce/` (shared by the tests).

#![allow(dead_code)] // each test binary uses part of this

/// The three capture files.
pub const CAPTURES: [&str; 3] = [
    "linux-rxe-rc-pingpong-and-rping.hex",
    "linux-ib_srp-to-lio-srpt-over-rxe.hex",
    "userspace-cm-req-to-linux-rxe.hex",
];

/// Frames of one file: (frame number in the capture, Ethernet frame).
pub fn frames(name: &str) -> Vec<(u32, Vec<u8>)> {
    let path = format!("{}/../../testdata/roce/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (n, hex) = l.split_once(' ').expect("<frame> <hex>");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (n.parse().expect("frame number"), bytes)
        })
        .collect()
}

/// Every frame of every file, with its file name.
pub fn all_frames() -> Vec<(&'static str, u32, Vec<u8>)> {
    CAPTURES
        .iter()
        .flat_map(|&name| frames(name).into_iter().map(move |(n, b)| (name, n, b)))
        .collect()
}
