//! `srp_daemon`-style rules files: which discovered targets to log in to,
//! and with which extra login options.
//!
//! Each non-empty, non-comment line is `a` (allow) or `d` (disallow),
//! optionally followed by comma-separated conditions on the target
//! (`id_ext`, `ioc_guid`, `dgid`, `service_id`, `pkey`) and, on allow lines,
//! login options (`queue_size=128,max_cmd_per_lun=32,...`, any key the
//! login string accepts). The first line whose conditions all match
//! decides; a target no line matches is allowed, as with srp_daemon. `#`
//! starts a comment.

use crate::login::LoginOptions;
use rdma_types::{Gid, Pkey};
use thiserror::Error;

/// What discovery found about a target port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// Identifier extension of the target port.
    pub id_ext: u64,
    /// IO controller GUID.
    pub ioc_guid: u64,
    /// Port GID.
    pub dgid: Gid,
    /// Service ID.
    pub service_id: u64,
    /// Partition key.
    pub pkey: Pkey,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cond {
    IdExt(u64),
    IocGuid(u64),
    Dgid(Gid),
    ServiceId(u64),
    Pkey(u16),
}

impl Cond {
    fn matches(&self, t: &TargetInfo) -> bool {
        match self {
            Cond::IdExt(v) => t.id_ext == *v,
            Cond::IocGuid(v) => t.ioc_guid == *v,
            Cond::Dgid(v) => t.dgid == *v,
            Cond::ServiceId(v) => t.service_id == *v,
            // Membership bit aside, the partition must be the same.
            Cond::Pkey(v) => t.pkey.0 & 0x7FFF == v & 0x7FFF,
        }
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    allow: bool,
    conds: Vec<Cond>,
    options: String,
    /// Line number in the file, for messages.
    pub line: usize,
}

/// The decision for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Log in or not.
    pub allow: bool,
    /// Extra login options (`key=value,...`) of the allowing rule.
    pub options: String,
    /// The deciding line, `None` for the default.
    pub line: Option<usize>,
}

/// A rules file that does not parse; says where and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("rules file line {line}: {msg}")]
pub struct RulesError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub msg: String,
}

/// A parsed rules file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

fn hex64(line: usize, key: &str, v: &str) -> Result<u64, RulesError> {
    let d = v.strip_prefix("0x").unwrap_or(v);
    if d.is_empty() || d.len() > 16 {
        return Err(RulesError {
            line,
            msg: format!("{key}={v}: expected up to 16 hex digits"),
        });
    }
    u64::from_str_radix(d, 16).map_err(|_| RulesError {
        line,
        msg: format!("{key}={v}: expected hex digits"),
    })
}

impl Rules {
    /// Parses a rules file.
    ///
    /// # Errors
    /// The first bad line, with its number.
    pub fn parse(text: &str) -> Result<Rules, RulesError> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let body = raw.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            // By character, not byte: the first one may be multi-byte UTF-8.
            let mut chars = body.chars();
            let kind = chars.next().unwrap_or_default();
            let rest = chars.as_str();
            let allow = match kind {
                'a' => true,
                'd' => false,
                other => {
                    return Err(RulesError {
                        line,
                        msg: format!(
                            "a rule starts with 'a' (allow) or 'd' (disallow), not '{other}'"
                        ),
                    })
                }
            };
            if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
                return Err(RulesError {
                    line,
                    msg: format!("'{kind}' must be followed by white space, got '{body}'"),
                });
            }
            let mut conds = Vec::new();
            let mut options = Vec::new();
            for item in rest
                .trim()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                let Some((key, v)) = item.split_once('=') else {
                    return Err(RulesError {
                        line,
                        msg: format!("'{item}' is not key=value"),
                    });
                };
                match key {
                    "id_ext" => conds.push(Cond::IdExt(hex64(line, key, v)?)),
                    "ioc_guid" => conds.push(Cond::IocGuid(hex64(line, key, v)?)),
                    "service_id" => conds.push(Cond::ServiceId(hex64(line, key, v)?)),
                    "dgid" => conds.push(Cond::Dgid(
                        Gid::parse_hex(v)
                            .filter(|_| v.len() == 32)
                            .ok_or_else(|| RulesError {
                                line,
                                msg: format!("dgid={v}: expected 32 hex digits"),
                            })?,
                    )),
                    "pkey" => conds.push(Cond::Pkey(
                        u16::from_str_radix(v.strip_prefix("0x").unwrap_or(v), 16).map_err(
                            |_| RulesError {
                                line,
                                msg: format!("pkey={v}: expected a 16-bit hex P_Key"),
                            },
                        )?,
                    )),
                    _ => options.push(item.to_string()),
                }
            }
            let options = options.join(",");
            if !options.is_empty() {
                if !allow {
                    return Err(RulesError {
                        line,
                        msg: format!("login options on a disallow rule: '{options}'"),
                    });
                }
                // The login string parser is the one authority on options.
                LoginOptions::parse(&format!("id_ext=1,ioc_guid=1,dest=127.0.0.1:1,{options}"))
                    .map_err(|e| RulesError {
                        line,
                        msg: e.to_string(),
                    })?;
            }
            rules.push(Rule {
                allow,
                conds,
                options,
                line,
            });
        }
        Ok(Rules { rules })
    }

    /// Decides for one discovered target.
    pub fn decide(&self, t: &TargetInfo) -> Decision {
        for r in &self.rules {
            if r.conds.iter().all(|c| c.matches(t)) {
                return Decision {
                    allow: r.allow,
                    options: r.options.clone(),
                    line: Some(r.line),
                };
            }
        }
        Decision {
            allow: true,
            options: String::new(),
            line: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(id_ext: u64, ioc: u64) -> TargetInfo {
        TargetInfo {
            id_ext,
            ioc_guid: ioc,
            dgid: Gid::parse_hex("fe800000000000000002c90200402bd5").unwrap(),
            service_id: ioc,
            pkey: Pkey(0xffff),
        }
    }

    #[test]
    fn the_rdma_core_example_file() {
        // The example shipped with rdma-core, comments removed from the rules.
        let text = "## example\n\
            d       dgid=fe800000000000000002c90200402bd5\n\
            a       ioc_guid=00a0b80200402bd7\n\
            a       pkey=ffff\n\
            a       id_ext=200500A0B81146A1,ioc_guid=00a0b80200402bef\n\
            d\n";
        let r = Rules::parse(text).unwrap();
        // The dgid rule comes first and matches the target's port.
        assert_eq!(
            r.decide(&target(1, 0x00a0_b802_0040_2bd7)),
            Decision {
                allow: false,
                options: String::new(),
                line: Some(2)
            }
        );
        let mut other = target(1, 0x00a0_b802_0040_2bd7);
        other.dgid = Gid::ZERO;
        assert_eq!(r.decide(&other).line, Some(3));
        let mut lim = other.clone();
        lim.ioc_guid = 5;
        lim.pkey = Pkey(0x7fff);
        assert_eq!(
            r.decide(&lim),
            Decision {
                allow: true,
                options: String::new(),
                line: Some(4)
            },
            "limited member of the same partition"
        );
        lim.pkey = Pkey(0x8001);
        assert_eq!(r.decide(&lim).line, Some(6), "falls to the final disallow");
    }

    #[test]
    fn options_ride_on_allow_rules_and_default_is_allow() {
        let r = Rules::parse("a   queue_size=128,max_cmd_per_lun=32  # every target\n").unwrap();
        assert_eq!(
            r.decide(&target(1, 2)),
            Decision {
                allow: true,
                options: "queue_size=128,max_cmd_per_lun=32".into(),
                line: Some(1)
            }
        );
        assert_eq!(
            Rules::parse("# nothing\n\n").unwrap().decide(&target(1, 2)),
            Decision {
                allow: true,
                options: String::new(),
                line: None
            }
        );
    }

    /// Found by the `rules_file` fuzz target: a line starting with a
    /// multi-byte character was split inside it and panicked.
    #[test]
    fn a_multi_byte_first_character_is_an_error_not_a_panic() {
        let crash = std::str::from_utf8(b"\xd1\xa0<").unwrap();
        let e = Rules::parse(crash).unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.msg.ends_with("not '\u{460}'"), "got '{}'", e.msg);
        let e = Rules::parse("# ok\n\u{e9} ioc_guid=1\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.msg.ends_with("not '\u{e9}'"), "got '{}'", e.msg);
        let e = Rules::parse("a\u{a0}ioc_guid=1").map(|r| r.decide(&target(1, 1)).allow);
        assert_eq!(
            e,
            Ok(true),
            "a non-ASCII space after the kind is white space"
        );
        let e = Rules::parse("d\u{460}").unwrap_err();
        assert!(
            e.msg.contains("must be followed by white space"),
            "got '{}'",
            e.msg
        );
    }

    #[test]
    fn every_error_names_its_line() {
        let cases = [
            (
                "x ioc_guid=1",
                "line 1: a rule starts with 'a' (allow) or 'd' (disallow), not 'x'",
            ),
            ("aioc_guid=1", "line 1: 'a' must be followed by white space"),
            ("\na ioc_guid", "line 2: 'ioc_guid' is not key=value"),
            (
                "a ioc_guid=xyz",
                "line 1: ioc_guid=xyz: expected hex digits",
            ),
            ("a dgid=fe80", "dgid=fe80: expected 32 hex digits"),
            ("a pkey=fffff", "pkey=fffff: expected a 16-bit hex P_Key"),
            ("d queue_size=4", "login options on a disallow rule"),
            ("a queue_size=0", "line 1: bad queue_size parameter '0'"),
            (
                "a frobnicate=1",
                "line 1: unknown parameter or missing value 'frobnicate=1'",
            ),
        ];
        for (text, want) in cases {
            let e = Rules::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: got '{e}', want '{want}'");
        }
    }
}
