//! Path migration (APM) rules of modify-QP (IBA 17.2.8 and the path
//! migration rows of the modify-QP attribute table, 11.2.5.2), one place
//! for every provider that migrates.
//!
//! The state machine the consumer sees: a QP starts (and returns on RESET)
//! in `Migrated` with no alternate path. The consumer loads an alternate
//! path ([`crate::QpAttr::alt_path`]) and asks for `Rearm`; the provider
//! arms at once, since the path is loaded by then, so `query_qp` reports
//! `Armed`. While `Armed` the alternate path is in use as the fallback and
//! cannot be replaced. Migration -- forced by the consumer (RTS->RTS with
//! `Migrated`) or taken by the provider when the primary path fails --
//! makes the alternate the primary path, forgets the alternate, and
//! leaves the QP `Migrated` until the consumer loads a new one and rearms.
//!
//! [`qp_table::check`](super::qp_table::check) has already decided which
//! transitions and QP types take these attributes; this module checks the
//! values against the current migration state.

use crate::types::{MigState, QpAttr};
use crate::VerbsError;
use rdma_types::QpState;

/// What a valid modify does to the QP's path migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigStep {
    /// The migration state after the modify.
    pub state: MigState,
    /// A forced migration: the provider makes the alternate path the
    /// primary one and raises `PathMigrated` to the QP's owner.
    pub migrate: bool,
}

fn bad(msg: &str) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

/// Checks the path migration part of a modify from `from` to `to`, with the
/// QP now in migration state `cur` and an alternate path loaded or not.
pub fn check(
    from: QpState,
    to: QpState,
    cur: MigState,
    alt_loaded: bool,
    attr: &QpAttr,
) -> Result<MigStep, VerbsError> {
    let keep = MigStep {
        state: cur,
        migrate: false,
    };
    match to {
        QpState::Reset => {
            return Ok(MigStep {
                state: MigState::Migrated,
                migrate: false,
            })
        }
        QpState::Err => return Ok(keep),
        _ => {}
    }
    if let Some(alt) = &attr.alt_path {
        if cur == MigState::Armed {
            return Err(bad(
                "the alternate path cannot be reloaded while Armed (migrate first)",
            ));
        }
        if alt.timeout > 31 {
            return Err(bad("alternate path timeout out of range"));
        }
    }
    match attr.path_mig_state {
        None => Ok(keep),
        Some(MigState::Armed) => Err(bad(
            "path_mig_state Armed is the provider's to set: ask for Rearm",
        )),
        Some(MigState::Rearm) if !alt_loaded && attr.alt_path.is_none() => {
            Err(bad("Rearm without an alternate path loaded"))
        }
        Some(MigState::Rearm) => Ok(MigStep {
            state: MigState::Armed,
            migrate: false,
        }),
        Some(MigState::Migrated)
            if from == QpState::Rts && to == QpState::Rts && cur == MigState::Armed =>
        {
            Ok(MigStep {
                state: MigState::Migrated,
                migrate: true,
            })
        }
        Some(MigState::Migrated) => Err(bad(
            "a forced migration (Migrated) needs RTS->RTS with the path Armed",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AhAttr, AltPath};
    use rdma_types::{Gid, Lid, PortNum};
    use MigState::{Armed, Migrated, Rearm};
    use QpState::{Err as E, Reset, Rtr, Rts, Sqd};

    fn alt() -> AltPath {
        AltPath {
            av: AhAttr {
                dlid: Lid(9),
                port: PortNum(2),
                grh: false,
                dgid: Gid::ZERO,
                sgid_index: 0,
                sl: 0,
                hop_limit: 64,
            },
            port: PortNum(2),
            pkey_index: 0,
            timeout: 14,
        }
    }

    fn a(alt_path: Option<AltPath>, mig: Option<MigState>) -> QpAttr {
        QpAttr {
            alt_path,
            path_mig_state: mig,
            ..Default::default()
        }
    }

    #[test]
    fn load_then_rearm_arms() {
        let s = check(Rtr, Rts, Migrated, false, &a(Some(alt()), Some(Rearm))).unwrap();
        assert_eq!((s.state, s.migrate), (Armed, false));
        // Loaded earlier (INIT->RTR), armed later.
        let s = check(Rts, Rts, Migrated, true, &a(None, Some(Rearm))).unwrap();
        assert_eq!(s.state, Armed);
        // Loading alone does not arm.
        let s = check(Rtr, Rts, Migrated, false, &a(Some(alt()), None)).unwrap();
        assert_eq!(s.state, Migrated);
    }

    #[test]
    fn forced_migration_only_from_armed_in_rts() {
        let s = check(Rts, Rts, Armed, true, &a(None, Some(Migrated))).unwrap();
        assert_eq!((s.state, s.migrate), (Migrated, true));
        for (from, to, cur) in [
            (Rts, Rts, Migrated),
            (Sqd, Rts, Armed),
            (Rtr, Rts, Armed),
            (Sqd, Sqd, Armed),
        ] {
            assert!(
                matches!(
                    check(from, to, cur, true, &a(None, Some(Migrated))),
                    Err(VerbsError::InvalidArgument(_))
                ),
                "{from:?}->{to:?} in {cur:?}"
            );
        }
    }

    #[test]
    fn refusals() {
        // Rearm needs a path; Armed is not the consumer's to set; an armed
        // alternate cannot be replaced; timeouts are 5 bits.
        assert!(check(Rts, Rts, Migrated, false, &a(None, Some(Rearm))).is_err());
        assert!(check(Rts, Rts, Migrated, true, &a(None, Some(Armed))).is_err());
        assert!(check(Rts, Rts, Armed, true, &a(Some(alt()), Some(Rearm))).is_err());
        let mut long = alt();
        long.timeout = 32;
        assert!(check(Rtr, Rts, Migrated, false, &a(Some(long), None)).is_err());
    }

    #[test]
    fn reset_forgets_and_err_keeps() {
        assert_eq!(
            check(Rts, Reset, Armed, true, &a(None, None))
                .unwrap()
                .state,
            Migrated
        );
        assert_eq!(
            check(Rts, E, Armed, true, &a(None, None)).unwrap().state,
            Armed
        );
    }
}
