//! Sizes and durations as people write them on command lines and in
//! configuration files: one parser for each, so `64M` and `30s` mean the
//! same to every binary and every key.
//!
//! Sizes are bytes, with an optional unit `K`, `M`, `G` or `T` (any case,
//! with or without a trailing `B` or `iB`), all powers of 1024, as SCST's
//! and fio's sizes are: `4096`, `4k`, `64M`, `2GiB`. Durations are a
//! number, possibly with a fraction, and a unit `ms`, `s`, `m` or `h`:
//! `500ms`, `1.5s`, `2m`. A plain number counts in the unit the option or
//! key has always documented ([`TimeUnit`]), so `--sm-wait-ms 30000` and
//! `--runtime 10` keep their meaning while `--sm-wait-ms 30s` also works.
//!
//! [`format_size`] writes a byte count back for people (`119.6 MiB`).
//!
//! Errors name the input as written and the forms accepted. Nothing here
//! panics on any input.

use core::fmt;
use std::time::Duration;

/// The forms a size may take, for error messages.
const SIZE_FORMS: &str =
    "write bytes or a number with K, M, G or T (powers of 1024), e.g. 4096, 4k, 64M, 1G";

/// Why a size cannot be read; each names the size as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// No digits in front.
    NoNumber(String),
    /// More than the quantity holds (`max`: `u64::MAX` bytes, or the
    /// largest value of a narrower type).
    TooLarge {
        /// The size as written.
        size: String,
        /// The most the quantity holds.
        max: u64,
    },
    /// A unit other than B, K, M, G, T (with or without B / iB).
    UnknownUnit {
        /// The size as written.
        size: String,
        /// The unit found.
        unit: String,
    },
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NoNumber(s) => {
                write!(f, "`{s}` is not a size: no number in front; {SIZE_FORMS}")
            }
            SizeError::TooLarge { size, max } => {
                write!(f, "`{size}` is not a size: more than {max} bytes")
            }
            SizeError::UnknownUnit { size, unit } => {
                write!(
                    f,
                    "`{size}` is not a size: unknown unit `{unit}`; {SIZE_FORMS}"
                )
            }
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a size in bytes: `512`, `4k`, `64M`, `1G`, `2TiB` (powers of
/// 1024; spaces around the number and unit are allowed).
///
/// # Errors
/// No number in front, an unknown unit, or more than `u64::MAX` bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    parse_size_in(s, 1)
}

/// [`parse_size`] where a plain number counts `plain` bytes: for an
/// option that has always been a count of larger units (`--ram-mib 64`,
/// now also `--ram-mib 1G`).
///
/// # Errors
/// As [`parse_size`].
pub fn parse_size_in(s: &str, plain: u64) -> Result<u64, SizeError> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(SizeError::NoNumber(s.to_string()));
    }
    let too_large = || SizeError::TooLarge {
        size: s.to_string(),
        max: u64::MAX,
    };
    let n: u64 = t[..digits].parse().map_err(|_| too_large())?;
    let unit = t[digits..].trim();
    let mult = match unit.to_ascii_uppercase().as_str() {
        "" => plain,
        "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => {
            return Err(SizeError::UnknownUnit {
                size: s.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    n.checked_mul(mult).ok_or_else(too_large)
}

/// [`parse_size`] into a narrower type (`u32`, `usize`): a command line's
/// `value_parser = rdma_types::units::size::<u32>`.
///
/// # Errors
/// As [`parse_size`], and a size the type cannot hold.
pub fn size<T: TryFrom<u64> + Bounded>(s: &str) -> Result<T, SizeError> {
    let n = parse_size(s)?;
    T::try_from(n).map_err(|_| SizeError::TooLarge {
        size: s.to_string(),
        max: T::MAX_U64,
    })
}

/// A byte count for people, the way [`parse_size`] reads one back
/// (powers of 1024): whole units as they are, others with one decimal:
/// `512 B`, `4 KiB`, `119.6 MiB`, `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    // Past 1023.95 the one decimal would round up to 1024.0 of a unit.
    while unit + 1 < UNITS.len() && bytes as f64 / (1u64 << (10 * (unit + 1))) as f64 >= 1023.95 {
        unit += 1;
    }
    let scale = 1u64 << (10 * (unit + 1));
    if bytes.is_multiple_of(scale) {
        return format!("{} {}", bytes / scale, UNITS[unit]);
    }
    format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
}

/// The largest value of an unsigned type, as a `u64`, for [`size`]'s
/// error.
pub trait Bounded {
    /// `Self::MAX` as `u64` (saturated).
    const MAX_U64: u64;
}

impl Bounded for u16 {
    const MAX_U64: u64 = u16::MAX as u64;
}
impl Bounded for u32 {
    const MAX_U64: u64 = u32::MAX as u64;
}
impl Bounded for u64 {
    const MAX_U64: u64 = u64::MAX;
}
impl Bounded for usize {
    const MAX_U64: u64 = if usize::BITS >= 64 {
        u64::MAX
    } else {
        usize::MAX as u64
    };
}

/// What a plain number (no unit) counts in a given option or key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Milliseconds (`--sm-wait-ms`, `keepalive_ms`).
    Millis,
    /// Seconds (`--runtime`, `--reconnect-delay`).
    Secs,
}

impl TimeUnit {
    fn nanos(self) -> u128 {
        match self {
            TimeUnit::Millis => 1_000_000,
            TimeUnit::Secs => 1_000_000_000,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TimeUnit::Millis => "milliseconds",
            TimeUnit::Secs => "seconds",
        }
    }
}

/// Why a duration cannot be read; each names the duration as written and
/// what a plain number would have counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// No digits in front (a sign, a word).
    NoNumber {
        /// The duration as written.
        text: String,
        /// What a plain number counts here.
        plain: TimeUnit,
    },
    /// Longer than a `std::time::Duration` holds.
    TooLong {
        /// The duration as written.
        text: String,
        /// What a plain number counts here.
        plain: TimeUnit,
    },
    /// A unit other than ms, s, m, h.
    UnknownUnit {
        /// The duration as written.
        text: String,
        /// The unit found.
        unit: String,
        /// What a plain number counts here.
        plain: TimeUnit,
    },
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, why, plain) = match self {
            DurationError::NoNumber { text, plain } => (text, "no number in front".into(), plain),
            DurationError::TooLong { text, plain } => (text, "too long".into(), plain),
            DurationError::UnknownUnit { text, unit, plain } => {
                (text, format!("unknown unit `{unit}`"), plain)
            }
        };
        write!(
            f,
            "`{text}` is not a duration: {why}; write a number of {} or one with ms, s, m or h, e.g. 500ms, 30s, 2m",
            plain.name()
        )
    }
}

impl std::error::Error for DurationError {}

/// Parses a duration: `500ms`, `30s`, `1.5s`, `2m`, `1h`; a plain number
/// (`30000`, `0.5`) counts in `plain`. Spaces around the number and unit
/// are allowed; digits of a fraction beyond nanoseconds are dropped.
///
/// # Errors
/// No number in front (a sign, a word), an unknown unit, or longer than
/// `std::time::Duration` holds.
pub fn parse_duration(s: &str, plain: TimeUnit) -> Result<Duration, DurationError> {
    let t = s.trim();
    let int_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (frac, rest) = match t[int_end..].strip_prefix('.') {
        Some(after) => {
            let n = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            (&after[..n], &after[n..])
        }
        None => ("", &t[int_end..]),
    };
    if int_end == 0 && frac.is_empty() {
        return Err(DurationError::NoNumber {
            text: s.to_string(),
            plain,
        });
    }
    let unit_nanos: u128 = match rest.trim() {
        "" => plain.nanos(),
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => {
            return Err(DurationError::UnknownUnit {
                text: s.to_string(),
                unit: other.to_string(),
                plain,
            })
        }
    };
    let too_long = || DurationError::TooLong {
        text: s.to_string(),
        plain,
    };
    // The whole part, then at most 18 digits of fraction (beyond a
    // nanosecond of an hour), all in u128 nanoseconds.
    let whole: u128 = if int_end == 0 {
        0
    } else {
        t[..int_end].parse().map_err(|_| too_long())?
    };
    let frac = &frac[..frac.len().min(18)];
    let frac_nanos = if frac.is_empty() {
        0
    } else {
        let digits: u128 = frac.parse().map_err(|_| too_long())?;
        digits * unit_nanos / 10u128.pow(frac.len() as u32)
    };
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(frac_nanos))
        .ok_or_else(too_long)?;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// [`parse_duration`] where a plain number counts milliseconds: a command
/// line's `value_parser = rdma_types::units::millis` for `--*-ms` options.
///
/// # Errors
/// As [`parse_duration`].
pub fn millis(s: &str) -> Result<Duration, DurationError> {
    parse_duration(s, TimeUnit::Millis)
}

/// [`parse_duration`] where a plain number counts seconds.
///
/// # Errors
/// As [`parse_duration`].
pub fn secs(s: &str) -> Result<Duration, DurationError> {
    parse_duration(s, TimeUnit::Secs)
}

/// A duration in whole milliseconds, saturated at `u64::MAX`: for the
/// keys and fields kept in milliseconds.
pub fn as_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        for (n, s) in [
            (0, "0 B"),
            (512, "512 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (4096, "4 KiB"),
            (125_440_000, "119.6 MiB"),
            ((1 << 20) - 1, "1.0 MiB"),
            (64 << 20, "64 MiB"),
            (3 << 29, "1.5 GiB"),
            (3 << 30, "3 GiB"),
            (1 << 40, "1 TiB"),
            (u64::MAX, "16.0 EiB"),
        ] {
            assert_eq!(format_size(n), s, "{n}");
        }
        // What it prints reads back as the same size.
        let back = parse_size("64M").map(format_size);
        assert_eq!(back.as_deref(), Ok("64 MiB"));
    }

    #[test]
    fn sizes_in_every_form() {
        for (s, n) in [
            ("0", 0),
            ("512", 512),
            ("4k", 4 << 10),
            ("4K", 4 << 10),
            ("4KB", 4 << 10),
            ("4KiB", 4 << 10),
            ("64M", 64 << 20),
            ("64 MiB", 64 << 20),
            (" 1G ", 1 << 30),
            ("2gib", 2 << 30),
            ("1T", 1 << 40),
            ("100B", 100),
            ("18446744073709551615", u64::MAX),
            ("16777215T", 16777215 << 40),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_forms() {
        for (s, want) in [
            ("", SizeError::NoNumber("".into())),
            ("M", SizeError::NoNumber("M".into())),
            ("-1", SizeError::NoNumber("-1".into())),
            (
                "1.5G",
                SizeError::UnknownUnit {
                    size: "1.5G".into(),
                    unit: ".5G".into(),
                },
            ),
            (
                "64X",
                SizeError::UnknownUnit {
                    size: "64X".into(),
                    unit: "X".into(),
                },
            ),
            (
                "3x",
                SizeError::UnknownUnit {
                    size: "3x".into(),
                    unit: "x".into(),
                },
            ),
            (
                "99999999999999999999",
                SizeError::TooLarge {
                    size: "99999999999999999999".into(),
                    max: u64::MAX,
                },
            ),
            (
                "20000000T",
                SizeError::TooLarge {
                    size: "20000000T".into(),
                    max: u64::MAX,
                },
            ),
        ] {
            assert_eq!(parse_size(s), Err(want), "{s}");
        }
        let m = parse_size("64X").unwrap_err().to_string();
        assert_eq!(parse_size_in("64", 1 << 20), Ok(64 << 20));
        assert_eq!(parse_size_in("1G", 1 << 20), Ok(1 << 30));
        assert_eq!(parse_size_in("512B", 1 << 20), Ok(512));
        assert!(parse_size_in("17592186044416", 1 << 20).is_err());
        assert!(
            m.contains("`64X` is not a size") && m.contains("4k, 64M, 1G"),
            "{m}"
        );
    }

    #[test]
    fn narrow_sizes_refuse_what_the_type_cannot_hold() {
        assert_eq!(
            size::<u32>("4G"),
            Err(SizeError::TooLarge {
                size: "4G".into(),
                max: u32::MAX as u64
            })
        );
        assert_eq!(size::<u32>("4095M"), Ok(4095 << 20));
        assert_eq!(size::<usize>("64k"), Ok(65536));
        assert_eq!(
            size::<u16>("64K"),
            Err(SizeError::TooLarge {
                size: "64K".into(),
                max: 65535
            })
        );
        let m = size::<u32>("8G").unwrap_err().to_string();
        assert!(m.contains("more than 4294967295 bytes"), "{m}");
    }

    #[test]
    fn durations_in_every_form() {
        let ms = Duration::from_millis;
        for (s, plain, d) in [
            ("500ms", TimeUnit::Secs, ms(500)),
            ("30s", TimeUnit::Millis, ms(30_000)),
            ("2m", TimeUnit::Millis, ms(120_000)),
            ("1h", TimeUnit::Secs, ms(3_600_000)),
            ("1.5s", TimeUnit::Millis, ms(1500)),
            (".25s", TimeUnit::Millis, ms(250)),
            ("2.", TimeUnit::Secs, ms(2000)),
            (" 10 s ", TimeUnit::Millis, ms(10_000)),
            ("30000", TimeUnit::Millis, ms(30_000)),
            ("10", TimeUnit::Secs, ms(10_000)),
            ("0.5", TimeUnit::Secs, ms(500)),
            ("0", TimeUnit::Secs, Duration::ZERO),
            ("1.0000000001s", TimeUnit::Secs, Duration::new(1, 0)),
            (
                "0.123456789123456789123s",
                TimeUnit::Secs,
                Duration::new(0, 123_456_789),
            ),
        ] {
            assert_eq!(parse_duration(s, plain), Ok(d), "{s}");
        }
        assert_eq!(millis("15000"), Ok(ms(15_000)));
        assert_eq!(secs("15"), Ok(ms(15_000)));
        assert_eq!(as_millis(ms(1234)), 1234);
        assert_eq!(as_millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn bad_durations_name_the_input_the_forms_and_the_plain_unit() {
        let p = TimeUnit::Millis;
        for (s, want) in [
            (
                "",
                DurationError::NoNumber {
                    text: "".into(),
                    plain: p,
                },
            ),
            (
                "s",
                DurationError::NoNumber {
                    text: "s".into(),
                    plain: p,
                },
            ),
            (
                ".s",
                DurationError::NoNumber {
                    text: ".s".into(),
                    plain: p,
                },
            ),
            (
                "-1s",
                DurationError::NoNumber {
                    text: "-1s".into(),
                    plain: p,
                },
            ),
            (
                "off",
                DurationError::NoNumber {
                    text: "off".into(),
                    plain: p,
                },
            ),
            (
                "5x",
                DurationError::UnknownUnit {
                    text: "5x".into(),
                    unit: "x".into(),
                    plain: p,
                },
            ),
            (
                "5 S",
                DurationError::UnknownUnit {
                    text: "5 S".into(),
                    unit: "S".into(),
                    plain: p,
                },
            ),
            (
                "1.2.3",
                DurationError::UnknownUnit {
                    text: "1.2.3".into(),
                    unit: ".3".into(),
                    plain: p,
                },
            ),
            (
                "99999999999999999999999999999999999999999",
                DurationError::TooLong {
                    text: "99999999999999999999999999999999999999999".into(),
                    plain: p,
                },
            ),
            (
                "18446744073709551616s",
                DurationError::TooLong {
                    text: "18446744073709551616s".into(),
                    plain: p,
                },
            ),
            (
                "9999999999999999999h",
                DurationError::TooLong {
                    text: "9999999999999999999h".into(),
                    plain: p,
                },
            ),
        ] {
            assert_eq!(parse_duration(s, p), Err(want), "{s}");
        }
        let m = millis("5x").unwrap_err().to_string();
        assert!(
            m.contains("`5x` is not a duration")
                && m.contains("500ms, 30s, 2m")
                && m.contains("a number of milliseconds"),
            "{m}"
        );
        assert!(secs("x")
            .unwrap_err()
            .to_string()
            .contains("a number of seconds"));
    }

    #[test]
    fn no_input_panics() {
        // Every short string over an alphabet of the parsers' characters.
        let alphabet = [
            '0', '9', '.', ' ', 'k', 'M', 's', 'm', 'h', 'B', 'i', '-', 'é',
        ];
        let mut words = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for w in &words {
                for c in alphabet {
                    next.push(format!("{w}{c}"));
                }
            }
            for w in &next {
                let _ = parse_size(w);
                let _ = parse_duration(w, TimeUnit::Secs);
            }
            words = next;
        }
    }
}
