//! Reading the report `srp io` (and `srpstack`) prints: a run passes only
//! if it verified something, not merely if nothing failed.

/// The bytes every "... ; verified N bytes, F verify failures, E I/O
/// errors" line of `text` verified, summed, after checking each line says
/// 0 and 0.
///
/// # Panics
/// If no such line is there, one names a failure, or nothing was verified:
/// "0 verify failures" of a run that checked nothing proves nothing.
#[allow(dead_code)]
pub fn verified_clean(text: &str) -> u64 {
    let mut lines = 0;
    let mut bytes = 0;
    for l in text.lines() {
        let Some((_, r)) = l.split_once("; verified ") else {
            continue;
        };
        let (n, rest) = r.split_once(" bytes, ").unwrap_or((r, ""));
        assert_eq!(
            rest.trim_end(),
            "0 verify failures, 0 I/O errors",
            "a run with failures:\n{text}"
        );
        bytes += n
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("verified bytes {n:?}:\n{text}"));
        lines += 1;
    }
    assert!(lines > 0, "no verify report:\n{text}");
    assert!(bytes > 0, "nothing was verified:\n{text}");
    bytes
}
