//! Reading the report `srp io` (and `srpstack`) prints: a run passes only
//! if it verified something, not merely if nothing failed.

/// The bytes every "... ; verified 119.6 MiB (...), F verify failures, E I/O
/// errors" line of `text` verified, summed (each to the precision its unit
/// prints), after checking each line says 0 and 0.
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
        let (n, rest) = r.split_once(", ").unwrap_or((r, ""));
        // "119.6 MiB (80.0 MiB in the read-back)": the first size.
        let n = n.split(" (").next().unwrap_or(n);
        assert_eq!(
            rest.trim_end(),
            "0 verify failures, 0 I/O errors",
            "a run with failures:\n{text}"
        );
        bytes += size_of(n).unwrap_or_else(|| panic!("verified size {n:?}:\n{text}"));
        lines += 1;
    }
    assert!(lines > 0, "no verify report:\n{text}");
    assert!(bytes > 0, "nothing was verified:\n{text}");
    bytes
}

/// `119.6 MiB` (as `rdma_types::units::format_size` writes it) in bytes.
fn size_of(s: &str) -> Option<u64> {
    let (n, unit) = s.split_once(' ')?;
    let n: f64 = n.parse().ok()?;
    let mult = match unit {
        "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    Some((n * mult as f64) as u64)
}
