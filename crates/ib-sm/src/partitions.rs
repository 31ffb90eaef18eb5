//! Partitions, in the spirit of opensm's `partitions.conf`.
//!
//! One definition per statement, ended by `;` (line breaks are free):
//!
//! ```text
//! # comment
//! Default=0x7fff : ALL=full ;
//! storage=0x0010 : 0x0002c90300a00001=full, 0x0002c90300b00001 ;
//! ```
//!
//! `name=PKEY` names a partition and its 15-bit key (the membership bit is
//! ours to set); members are port GUIDs in hex or `ALL`, each `=full` or
//! `=limited` (limited when not said, as in opensm). Two limited members
//! cannot talk to each other; a full member talks to everyone in the
//! partition. Without a file, every port is a full member of the default
//! partition 0x7fff. With one, a port the default partition does not
//! name is still its limited member, as opensm has it: a port's QP1 sends
//! requests in the default partition, and must reach the SA (whose port
//! is a full member) whatever else it is in. Errors name the line and
//! column.

use rdma_types::Guid;

/// One partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Its name.
    pub name: String,
    /// The 15-bit key.
    pub pkey: u16,
    /// Members: `None` for ALL, with full membership or not.
    pub members: Vec<(Option<Guid>, bool)>,
}

impl Partition {
    /// The membership of `port`: `Some(true)` full, `Some(false)` limited.
    pub fn membership(&self, port: Guid) -> Option<bool> {
        let mut found = None;
        for (g, full) in &self.members {
            if g.is_none() || *g == Some(port) {
                found = Some(found.unwrap_or(false) | *full);
            }
        }
        found
    }
}

/// A partitions file that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("partitions line {line} column {column}: {msg}")]
pub struct PartitionError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub msg: String,
}

/// The default partition's key (without the membership bit).
pub const DEFAULT_PKEY: u16 = 0x7fff;

/// The membership of `port` in `p` (see [`Partition::membership`]), a
/// port the default partition does not name being its limited member.
pub fn membership(p: &Partition, port: Guid) -> Option<bool> {
    p.membership(port)
        .or((p.pkey == DEFAULT_PKEY).then_some(false))
}

/// The partitions every port is in when there is no file.
pub fn default_partitions() -> Vec<Partition> {
    vec![Partition {
        name: "Default".into(),
        pkey: DEFAULT_PKEY,
        members: vec![(None, true)],
    }]
}

/// Parses a partitions file.
///
/// # Errors
/// The first syntax error, with its place.
pub fn parse(text: &str) -> Result<Vec<Partition>, PartitionError> {
    // Strip comments, keep offsets for positions.
    let mut clean = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.find('#') {
            Some(i) => {
                clean.push_str(&line[..i]);
                clean.extend(std::iter::repeat_n(
                    ' ',
                    line.len() - i - usize::from(line.ends_with('\n')),
                ));
                if line.ends_with('\n') {
                    clean.push('\n');
                }
            }
            None => clean.push_str(line),
        }
    }
    let pos = |off: usize| {
        let before = &clean[..off.min(clean.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        (line, column)
    };
    let err = |off: usize, msg: String| {
        let (line, column) = pos(off);
        PartitionError { line, column, msg }
    };
    let mut out: Vec<Partition> = Vec::new();
    let mut start = 0;
    for stmt in clean.split_inclusive(';') {
        let here = start;
        start += stmt.len();
        let body = stmt.trim_end_matches(';');
        if body.trim().is_empty() {
            if !stmt.ends_with(';') {
                continue;
            }
            return Err(err(here, "empty definition before `;`".into()));
        }
        if !stmt.ends_with(';') {
            let lead = body.len() - body.trim_start().len();
            return Err(err(here + lead, "definition not ended by `;`".into()));
        }
        let Some(colon) = body.find(':') else {
            let lead = body.len() - body.trim_start().len();
            return Err(err(here + lead, "expected `name=PKEY : members`".into()));
        };
        let head = &body[..colon];
        let lead = head.len() - head.trim_start().len();
        let Some((name, key)) = head.trim().split_once('=') else {
            return Err(err(here + lead, "expected `name=PKEY` before `:`".into()));
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(err(here + lead, "a partition needs a name".into()));
        }
        let key_text = key.trim().split(',').next().unwrap_or("").trim();
        let key_off = here + lead + head.trim().find('=').map_or(0, |i| i + 1);
        let pkey = u16::from_str_radix(key_text.trim_start_matches("0x"), 16)
            .ok()
            .filter(|k| *k & 0x7fff != 0 && *k <= 0x7fff)
            .ok_or_else(|| {
                err(
                    key_off,
                    format!("`{key_text}` is not a P_Key from 0x0001 to 0x7fff"),
                )
            })?;
        if out.iter().any(|p| p.pkey == pkey || p.name == name) {
            return Err(err(
                here + lead,
                format!("partition `{name}` ({pkey:#06x}) defined twice"),
            ));
        }
        let mut members = Vec::new();
        let mut off = here + colon + 1;
        for m in body[colon + 1..].split(',') {
            let this = off + (m.len() - m.trim_start().len());
            off += m.len() + 1;
            let m = m.trim();
            if m.is_empty() {
                continue;
            }
            let (who, kind) = match m.split_once('=') {
                Some((w, k)) => (w.trim(), k.trim()),
                None => (m, "limited"),
            };
            let full = match kind {
                "full" => true,
                "limited" => false,
                other => {
                    return Err(err(
                        this,
                        format!("membership `{other}`: use full or limited"),
                    ))
                }
            };
            let guid = if who.eq_ignore_ascii_case("ALL") {
                None
            } else {
                Some(Guid(
                    u64::from_str_radix(who.trim_start_matches("0x"), 16)
                        .map_err(|_| err(this, format!("`{who}` is not ALL or a port GUID")))?,
                ))
            };
            members.push((guid, full));
        }
        out.push(Partition {
            name: name.to_string(),
            pkey,
            members,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_opensm_style_definitions() {
        let p = parse(
            "# fabric\nDefault=0x7fff : ALL=full ;\nstorage=0x0010 :\n  0x11=full, # target\n  0x22 ;\n",
        )
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].pkey, 0x0010);
        assert_eq!(p[1].membership(Guid(0x11)), Some(true));
        assert_eq!(p[1].membership(Guid(0x22)), Some(false));
        assert_eq!(p[1].membership(Guid(0x33)), None);
        assert_eq!(p[0].membership(Guid(0x33)), Some(true));
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = parse("a=0x10 : ALL ;\nb=0x9999 : ALL ;").unwrap_err();
        assert_eq!((e.line, e.column), (2, 3), "{e}");
        let e = parse("a=0x10 : 0x11=half ;").unwrap_err();
        assert_eq!((e.line, e.column), (1, 10), "{e}");
        assert!(e.msg.contains("half"));
        let e = parse("a=0x10 : ALL ;\n  b=0x11 : xyz ;").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse("a=0x10 : ALL").unwrap_err();
        assert!(e.msg.contains("`;`"), "{e}");
        let e = parse("a=0x10 : ALL ; a=0x11 : ALL ;").unwrap_err();
        assert!(e.msg.contains("twice"), "{e}");
        assert!(parse("nocolon ;").is_err());
    }
}
