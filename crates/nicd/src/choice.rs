//! Which soft RoCE NIC a tool runs on: the daemon's (the default, so
//! every process on the host shares an address, as every process shares
//! a Linux rxe device) or one of the tool's own, in its process.
//!
//! A tool takes `--nicd [SOCKET]` (the daemon, at a socket of the user's
//! choice) and `--own-nic` (a NIC of its own). With neither, it runs on
//! its own NIC when
//! - it was given an option only a NIC of its own can honour (a UDP port
//!   other than 4791, an MTU, injected faults, a capture): the daemon's
//!   NIC is configured where the daemon starts, not by its clients;
//! - or `NICD_MODE=own` is in its environment (for scripts and test suites
//!   that pin every tool at once);
//!
//! and on the daemon's otherwise, which is started when none answers
//! ([`crate::ondemand`]). The tool says which in one line
//! ([`Which::line`]), with the reason when it is its own.
//!
//! So on the `ib` fabric too: the daemon serves a port of a managed
//! subnet at the tool's address (`nicd --ib-ip`, or added on demand,
//! [`crate::connect_at`]) beside its RoCE ports at others.

use std::path::{Path, PathBuf};

/// The environment variable that sends every tool to a NIC of its own
/// when it is `own` (as `--own-nic`); `daemon` or empty: the default.
pub const MODE_ENV: &str = "NICD_MODE";

/// Where a tool's soft RoCE NIC is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// The daemon's, through its socket.
    Daemon {
        /// The daemon's socket.
        socket: PathBuf,
    },
    /// One of the tool's own.
    Own {
        /// What asked for it, for the tool's line: `--own-nic`,
        /// `NICD_MODE=own`, `--udp-port 5000` ...
        why: String,
    },
}

/// What a tool was given that bears on the choice.
#[derive(Debug, Clone, Default)]
pub struct Asked<'a> {
    /// `--nicd [SOCKET]` (an empty path: the option without a value).
    pub nicd: Option<&'a Path>,
    /// `--own-nic`.
    pub own_nic: bool,
    /// The first option given that only a NIC of the tool's own honours
    /// (`--udp-port 5000`), if any.
    pub own_only: Option<String>,
    /// `$NICD_MODE` (binaries read it; the library reads no environment).
    pub env: Option<String>,
}

impl<'a> Asked<'a> {
    /// The options with `$NICD_MODE` read from the environment.
    /// `$SOFTROCE_FAULTS` stands in for `own_only` when that is `None`:
    /// faults are injected by a NIC of the tool's own.
    pub fn from_env(nicd: Option<&'a Path>, own_nic: bool, own_only: Option<String>) -> Self {
        let faults = rnic::softroce::FAULTS_ENV;
        let own_only = own_only.or_else(|| {
            std::env::var_os(faults)
                .filter(|v| !v.is_empty())
                .map(|_| format!("${faults}"))
        });
        Asked {
            nicd,
            own_nic,
            own_only,
            env: std::env::var(MODE_ENV).ok(),
        }
    }
}

/// The first of `given` (`(given, what)`) that is given, as
/// [`Asked::own_only`] wants it.
pub fn first_given(given: &[(bool, String)]) -> Option<String> {
    given.iter().find(|(on, _)| *on).map(|(_, w)| w.clone())
}

/// [`choose`] for a tool given `--nicd`, `--own-nic`, a UDP port and
/// `more` options only a NIC of its own honours (`(given, what)`), with
/// `$NICD_MODE` and `$SOFTROCE_FAULTS` read ([`Asked::from_env`]): a UDP
/// port other than 4791 asks for a NIC of the tool's own.
///
/// # Errors
/// As [`choose`]'s.
pub fn choose_for(
    nicd: Option<&Path>,
    own_nic: bool,
    udp_port: u16,
    more: &[(bool, String)],
) -> Result<Which, String> {
    let port = (
        udp_port != rnic::softroce::ROCE_PORT,
        format!("--udp-port {udp_port}"),
    );
    let given: Vec<(bool, String)> = std::iter::once(port).chain(more.iter().cloned()).collect();
    choose(&Asked::from_env(nicd, own_nic, first_given(&given)))
}

/// Chooses as the module says.
///
/// # Errors
/// `--nicd` with `--own-nic`, `--nicd` with an option of a NIC of the
/// tool's own, or `$NICD_MODE` neither `own`, `daemon` nor empty: in words naming
/// the fix.
pub fn choose(a: &Asked) -> Result<Which, String> {
    match (a.nicd, a.own_nic, &a.own_only) {
        (Some(_), true, _) => Err(
            "--nicd (the NIC daemon's NIC) and --own-nic (a NIC of this tool's own) exclude \
             each other: give one"
                .into(),
        ),
        (Some(_), false, Some(opt)) => Err(format!(
            "{opt} sets up a NIC of this tool's own, and --nicd asks for the NIC daemon's, which \
             is set up where the daemon starts (`nicd --help`): drop {opt}, or --nicd"
        )),
        (Some(s), false, None) => Ok(Which::Daemon {
            socket: crate::socket_for(s),
        }),
        (None, true, _) => Ok(Which::Own {
            why: "--own-nic".into(),
        }),
        (None, false, Some(opt)) => Ok(Which::Own { why: opt.clone() }),
        (None, false, None) => match a.env.as_deref().map(str::trim) {
            Some("own") => Ok(Which::Own {
                why: format!("{MODE_ENV}=own"),
            }),
            None | Some("" | "daemon") => Ok(Which::Daemon {
                socket: crate::socket_for(Path::new("")),
            }),
            Some(v) => Err(format!(
                "{MODE_ENV}={v}: give {MODE_ENV}=own for a NIC of each tool's own, or \
                 {MODE_ENV}=daemon (or leave it unset) for the NIC daemon's"
            )),
        },
    }
}

impl Which {
    /// The daemon's socket, when it is the daemon's NIC.
    pub fn socket(&self) -> Option<&Path> {
        match self {
            Which::Daemon { socket } => Some(socket),
            Which::Own { .. } => None,
        }
    }

    /// The one line a tool prints once its NIC is open: `srptd: NIC:
    /// the NIC daemon's at 127.0.0.1 (pid 12, /run/nicd.sock)` or
    /// `srptd: NIC: its own at 127.0.0.1 (--own-nic)`. `at` names the
    /// addresses; `pid` is the daemon's.
    pub fn line(&self, tool: &str, at: &str, pid: Option<u32>) -> String {
        match self {
            Which::Daemon { socket } => format!(
                "{tool}: NIC: the NIC daemon's soft RoCE NIC at {at} ({}{}; --own-nic for one \
                 of {tool}'s own)",
                pid.map(|p| format!("pid {p}, ")).unwrap_or_default(),
                socket.display()
            ),
            Which::Own { why } => format!("{tool}: NIC: its own soft RoCE NIC at {at} ({why})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked<'a>(
        nicd: Option<&'a Path>,
        own: bool,
        only: Option<&str>,
        env: Option<&str>,
    ) -> Asked<'a> {
        Asked {
            nicd,
            own_nic: own,
            own_only: only.map(str::to_owned),
            env: env.map(str::to_owned),
        }
    }

    #[test]
    fn the_daemon_unless_asked_otherwise() {
        let s = Path::new("/tmp/x.sock");
        assert_eq!(
            choose(&asked(Some(s), false, None, Some("own"))).unwrap(),
            Which::Daemon {
                socket: s.to_owned()
            },
            "--nicd beats $NICD_MODE"
        );
        assert!(matches!(
            choose(&asked(None, false, None, None)).unwrap(),
            Which::Daemon { .. }
        ));
        assert!(matches!(
            choose(&asked(None, false, None, Some("daemon"))).unwrap(),
            Which::Daemon { .. }
        ));
        assert_eq!(
            choose(&asked(None, true, None, Some("daemon"))).unwrap(),
            Which::Own {
                why: "--own-nic".into()
            }
        );
        assert_eq!(
            choose(&asked(None, false, Some("--udp-port 5000"), None)).unwrap(),
            Which::Own {
                why: "--udp-port 5000".into()
            }
        );
        assert_eq!(
            choose(&asked(None, false, None, Some("own"))).unwrap(),
            Which::Own {
                why: "NICD_MODE=own".into()
            }
        );
        assert_eq!(
            first_given(&[(false, "a".into()), (true, "b".into()), (true, "c".into())]),
            Some("b".into())
        );
    }

    #[test]
    fn contradictions_are_refused_in_words() {
        let s = Path::new("");
        let e = choose(&asked(Some(s), true, None, None)).unwrap_err();
        assert!(e.contains("exclude each other"), "{e}");
        let e = choose(&asked(Some(s), false, Some("--mtu 1024"), None)).unwrap_err();
        assert!(e.contains("drop --mtu 1024, or --nicd"), "{e}");
        let e = choose(&asked(None, false, None, Some("maybe"))).unwrap_err();
        assert!(
            e.contains("NICD_MODE=maybe") && e.contains("NICD_MODE=own"),
            "{e}"
        );
    }

    #[test]
    fn the_line_says_which_and_why() {
        let d = Which::Daemon {
            socket: "/run/nicd.sock".into(),
        };
        assert_eq!(
            d.line("srptd", "127.0.0.1", Some(42)),
            "srptd: NIC: the NIC daemon's soft RoCE NIC at 127.0.0.1 (pid 42, /run/nicd.sock; \
             --own-nic for one of srptd's own)"
        );
        let o = Which::Own {
            why: "NICD_MODE=own".into(),
        };
        assert_eq!(
            o.line("srp", "127.0.0.2", None),
            "srp: NIC: its own soft RoCE NIC at 127.0.0.2 (NICD_MODE=own)"
        );
    }
}
