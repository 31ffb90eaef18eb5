//! QP state transitions (IBA 10.3.1, figure 130; attribute rules of
//! 11.2.5.2, the same facts as Linux `ib_modify_qp_is_ok`). One table.

use crate::types::QpAttr;
use crate::VerbsError;
use rdma_types::{QpState, QpType};

/// One modifiable attribute, as a bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Attr {
    /// `port`
    Port = 1 << 0,
    /// `pkey_index`
    PkeyIndex = 1 << 1,
    /// `qkey`
    Qkey = 1 << 2,
    /// `access`
    Access = 1 << 3,
    /// `path_mtu`
    PathMtu = 1 << 4,
    /// `dest_qpn`
    DestQpn = 1 << 5,
    /// `rq_psn`
    RqPsn = 1 << 6,
    /// `sq_psn`
    SqPsn = 1 << 7,
    /// `av`
    Av = 1 << 8,
    /// `max_dest_rd_atomic`
    MaxDestRdAtomic = 1 << 9,
    /// `max_rd_atomic`
    MaxRdAtomic = 1 << 10,
    /// `min_rnr_timer`
    MinRnrTimer = 1 << 11,
    /// `timeout`
    Timeout = 1 << 12,
    /// `retry_cnt`
    RetryCnt = 1 << 13,
    /// `rnr_retry`
    RnrRetry = 1 << 14,
    /// `en_sqd_async_notify`
    SqdNotify = 1 << 15,
    /// `alt_path`
    AltPath = 1 << 16,
    /// `path_mig_state`
    PathMigState = 1 << 17,
}

const ALL_ATTRS: [(Attr, &str); 18] = [
    (Attr::Port, "port"),
    (Attr::PkeyIndex, "pkey_index"),
    (Attr::Qkey, "qkey"),
    (Attr::Access, "access"),
    (Attr::PathMtu, "path_mtu"),
    (Attr::DestQpn, "dest_qpn"),
    (Attr::RqPsn, "rq_psn"),
    (Attr::SqPsn, "sq_psn"),
    (Attr::Av, "av"),
    (Attr::MaxDestRdAtomic, "max_dest_rd_atomic"),
    (Attr::MaxRdAtomic, "max_rd_atomic"),
    (Attr::MinRnrTimer, "min_rnr_timer"),
    (Attr::Timeout, "timeout"),
    (Attr::RetryCnt, "retry_cnt"),
    (Attr::RnrRetry, "rnr_retry"),
    (Attr::SqdNotify, "en_sqd_async_notify"),
    (Attr::AltPath, "alt_path"),
    (Attr::PathMigState, "path_mig_state"),
];

/// Bit set of attributes present in `attr` (state excluded).
pub fn mask_of(attr: &QpAttr) -> u32 {
    let mut m = 0;
    let mut set = |present: bool, a: Attr| {
        if present {
            m |= a as u32
        }
    };
    set(attr.port.is_some(), Attr::Port);
    set(attr.pkey_index.is_some(), Attr::PkeyIndex);
    set(attr.qkey.is_some(), Attr::Qkey);
    set(attr.access.is_some(), Attr::Access);
    set(attr.path_mtu.is_some(), Attr::PathMtu);
    set(attr.dest_qpn.is_some(), Attr::DestQpn);
    set(attr.rq_psn.is_some(), Attr::RqPsn);
    set(attr.sq_psn.is_some(), Attr::SqPsn);
    set(attr.av.is_some(), Attr::Av);
    set(attr.max_dest_rd_atomic.is_some(), Attr::MaxDestRdAtomic);
    set(attr.max_rd_atomic.is_some(), Attr::MaxRdAtomic);
    set(attr.min_rnr_timer.is_some(), Attr::MinRnrTimer);
    set(attr.timeout.is_some(), Attr::Timeout);
    set(attr.retry_cnt.is_some(), Attr::RetryCnt);
    set(attr.rnr_retry.is_some(), Attr::RnrRetry);
    set(attr.en_sqd_async_notify.is_some(), Attr::SqdNotify);
    set(attr.alt_path.is_some(), Attr::AltPath);
    set(attr.path_mig_state.is_some(), Attr::PathMigState);
    m
}

/// Applies the attributes `new` gives on top of `acc`, the attributes a
/// provider keeps for a QP across modify calls (the state included; the
/// migration state is the provider's to track, not kept here).
pub fn merge(acc: &mut QpAttr, new: &QpAttr) {
    macro_rules! take {
        ($($f:ident),*) => { $( if new.$f.is_some() { acc.$f = new.$f; } )* };
    }
    take!(
        state,
        port,
        pkey_index,
        qkey,
        access,
        path_mtu,
        dest_qpn,
        rq_psn,
        sq_psn,
        av,
        max_dest_rd_atomic,
        max_rd_atomic,
        min_rnr_timer,
        timeout,
        retry_cnt,
        rnr_retry,
        en_sqd_async_notify,
        alt_path
    );
}

const fn m(list: &[Attr]) -> u32 {
    let mut v = 0;
    let mut i = 0;
    while i < list.len() {
        v |= list[i] as u32;
        i += 1;
    }
    v
}

use Attr::*;

/// (required, optional) masks per type class: RC, UC, UD, special (QP0/1).
/// `None` = transition not allowed for that class.
type Rule = [Option<(u32, u32)>; 4];

/// The table. Transitions to RESET and ERR from any state are handled
/// before it (always allowed, no attributes).
const TABLE: &[(QpState, QpState, Rule)] = {
    use QpState::*;
    const RC_INIT: u32 = m(&[PkeyIndex, Port, Access]);
    const UD_INIT: u32 = m(&[PkeyIndex, Port, Qkey]);
    const SP_INIT: u32 = m(&[PkeyIndex, Qkey]);
    // Alternate path and migration state: connected QPs only (IBA
    // 11.2.5.2; Linux `ib_modify_qp_is_ok` lists the same transitions).
    const RC_RTS_OPT: u32 = m(&[Access, MinRnrTimer, AltPath, PathMigState]);
    const UC_RTS_OPT: u32 = m(&[Access, AltPath, PathMigState]);
    &[
        (
            Reset,
            Init,
            [
                Some((RC_INIT, 0)),
                Some((RC_INIT, 0)),
                Some((UD_INIT, 0)),
                Some((SP_INIT, 0)),
            ],
        ),
        (
            Init,
            Init,
            [
                Some((0, RC_INIT)),
                Some((0, RC_INIT)),
                Some((0, UD_INIT)),
                Some((0, SP_INIT)),
            ],
        ),
        (
            Init,
            Rtr,
            [
                Some((
                    m(&[Av, PathMtu, DestQpn, RqPsn, MaxDestRdAtomic, MinRnrTimer]),
                    m(&[PkeyIndex, Access, AltPath]),
                )),
                Some((
                    m(&[Av, PathMtu, DestQpn, RqPsn]),
                    m(&[PkeyIndex, Access, AltPath]),
                )),
                Some((0, m(&[PkeyIndex, Qkey]))),
                Some((0, m(&[PkeyIndex, Qkey]))),
            ],
        ),
        (
            Rtr,
            Rts,
            [
                Some((
                    m(&[SqPsn, Timeout, RetryCnt, RnrRetry, MaxRdAtomic]),
                    RC_RTS_OPT,
                )),
                Some((m(&[SqPsn]), UC_RTS_OPT)),
                Some((m(&[SqPsn]), m(&[Qkey]))),
                Some((m(&[SqPsn]), m(&[Qkey]))),
            ],
        ),
        (
            Rts,
            Rts,
            [
                Some((0, RC_RTS_OPT)),
                Some((0, UC_RTS_OPT)),
                Some((0, m(&[Qkey]))),
                Some((0, m(&[Qkey]))),
            ],
        ),
        (Rts, Sqd, [Some((0, m(&[SqdNotify]))); 4]),
        (
            Sqd,
            Rts,
            [
                Some((0, RC_RTS_OPT)),
                Some((0, UC_RTS_OPT)),
                Some((0, m(&[Qkey]))),
                Some((0, m(&[Qkey]))),
            ],
        ),
        (
            Sqd,
            Sqd,
            [
                Some((
                    0,
                    m(&[
                        PkeyIndex,
                        Av,
                        Timeout,
                        RetryCnt,
                        RnrRetry,
                        MaxRdAtomic,
                        MaxDestRdAtomic,
                        Access,
                        MinRnrTimer,
                        AltPath,
                        PathMigState,
                    ]),
                )),
                Some((0, m(&[PkeyIndex, Av, Access, AltPath, PathMigState]))),
                Some((0, m(&[PkeyIndex, Qkey]))),
                Some((0, m(&[PkeyIndex, Qkey]))),
            ],
        ),
        // SQE exists only for unreliable service (IBA 10.3.1.6).
        (
            Sqe,
            Rts,
            [
                None,
                Some((0, m(&[Access]))),
                Some((0, m(&[Qkey]))),
                Some((0, m(&[Qkey]))),
            ],
        ),
    ]
};

fn class(t: QpType) -> usize {
    match t {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud => 2,
        QpType::Smi | QpType::Gsi => 3,
    }
}

/// Checks a modify request against the table. `from` is the current state;
/// the target is `attr.state` (absent: stay in `from`, which must itself be
/// a listed self-transition). Returns the new state.
pub fn check(qp_type: QpType, from: QpState, attr: &QpAttr) -> Result<QpState, VerbsError> {
    let to = attr.state.unwrap_or(from);
    let given = mask_of(attr);
    let (req, opt) = if to == QpState::Reset || to == QpState::Err {
        (0, 0)
    } else {
        TABLE
            .iter()
            .find(|(f, t, _)| *f == from && *t == to)
            .and_then(|(_, _, rule)| rule[class(qp_type)])
            .ok_or(VerbsError::InvalidTransition { from, to })?
    };
    for (a, name) in ALL_ATTRS {
        let bit = a as u32;
        if req & bit != 0 && given & bit == 0 {
            return Err(VerbsError::MissingAttribute {
                attr: name,
                from,
                to,
            });
        }
        if (req | opt) & bit == 0 && given & bit != 0 {
            return Err(VerbsError::UnexpectedAttribute {
                attr: name,
                from,
                to,
            });
        }
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{AccessFlags, Mtu, PortNum, Psn, Qkey, Qpn};
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};

    fn rc_init() -> QpAttr {
        QpAttr {
            state: Some(Init),
            port: Some(PortNum(1)),
            pkey_index: Some(0),
            access: Some(AccessFlags::NONE),
            ..Default::default()
        }
    }

    #[test]
    fn reset_and_err_reachable_from_everywhere() {
        for from in [Reset, Init, Rtr, Rts, Sqd, Sqe, QpState::Err] {
            for to in [Reset, QpState::Err] {
                let a = QpAttr {
                    state: Some(to),
                    ..Default::default()
                };
                assert_eq!(check(QpType::Rc, from, &a), Ok(to));
            }
        }
    }

    #[test]
    fn forbidden_transitions() {
        let a = |s| QpAttr {
            state: Some(s),
            ..Default::default()
        };
        assert_eq!(
            check(QpType::Rc, Reset, &a(Rts)),
            Err(VerbsError::InvalidTransition {
                from: Reset,
                to: Rts
            })
        );
        assert_eq!(
            check(QpType::Rc, Init, &a(Rts)),
            Err(VerbsError::InvalidTransition {
                from: Init,
                to: Rts
            })
        );
        assert_eq!(
            check(QpType::Rc, QpState::Err, &a(Init)),
            Err(VerbsError::InvalidTransition {
                from: QpState::Err,
                to: Init
            })
        );
        // SQE is unreliable-only.
        assert_eq!(
            check(QpType::Rc, Sqe, &a(Rts)),
            Err(VerbsError::InvalidTransition { from: Sqe, to: Rts })
        );
        assert_eq!(check(QpType::Uc, Sqe, &a(Rts)), Ok(Rts));
        // Nobody moves a QP into SQE by modify.
        assert!(check(QpType::Ud, Rts, &a(Sqe)).is_err());
    }

    #[test]
    fn required_and_unexpected_attributes() {
        assert_eq!(check(QpType::Rc, Reset, &rc_init()), Ok(Init));
        let mut a = rc_init();
        a.access = None;
        assert_eq!(
            check(QpType::Rc, Reset, &a),
            Err(VerbsError::MissingAttribute {
                attr: "access",
                from: Reset,
                to: Init
            })
        );
        let mut a = rc_init();
        a.qkey = Some(Qkey(1));
        assert_eq!(
            check(QpType::Rc, Reset, &a),
            Err(VerbsError::UnexpectedAttribute {
                attr: "qkey",
                from: Reset,
                to: Init
            })
        );
        // UD wants a Q_Key instead of access rights.
        let ud = QpAttr {
            state: Some(Init),
            port: Some(PortNum(1)),
            pkey_index: Some(0),
            qkey: Some(Qkey(7)),
            ..Default::default()
        };
        assert_eq!(check(QpType::Ud, Reset, &ud), Ok(Init));
        // Special QPs have their port fixed at creation.
        assert!(matches!(
            check(QpType::Gsi, Reset, &ud),
            Err(VerbsError::UnexpectedAttribute { attr: "port", .. })
        ));
    }

    #[test]
    fn alternate_path_only_where_the_table_allows() {
        let alt = crate::AltPath {
            av: crate::AhAttr::roce(rdma_types::Gid::ZERO),
            port: PortNum(1),
            pkey_index: 0,
            timeout: 14,
        };
        let a = |s| QpAttr {
            state: Some(s),
            alt_path: Some(alt),
            path_mig_state: Some(crate::MigState::Rearm),
            ..Default::default()
        };
        for t in [QpType::Rc, QpType::Uc] {
            assert_eq!(check(t, Rts, &a(Rts)), Ok(Rts));
            assert_eq!(check(t, Sqd, &a(Rts)), Ok(Rts));
            assert_eq!(check(t, Sqd, &a(Sqd)), Ok(Sqd));
        }
        // Not for datagrams, not at INIT, not out of SQE.
        assert!(matches!(
            check(QpType::Ud, Rts, &a(Rts)),
            Err(VerbsError::UnexpectedAttribute {
                attr: "alt_path",
                ..
            })
        ));
        let mut init = rc_init();
        init.alt_path = Some(alt);
        assert!(check(QpType::Rc, Reset, &init).is_err());
        assert!(check(QpType::Uc, Sqe, &a(Rts)).is_err());
        // INIT->RTR loads a path but cannot arm it yet.
        let rtr = QpAttr {
            state: Some(Rtr),
            av: Some(alt.av),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(Qpn::from_bits(5)),
            rq_psn: Some(Psn::new(0)),
            alt_path: Some(alt),
            ..Default::default()
        };
        assert_eq!(check(QpType::Uc, Init, &rtr), Ok(Rtr));
        let mut armed = rtr;
        armed.path_mig_state = Some(crate::MigState::Rearm);
        assert!(matches!(
            check(QpType::Uc, Init, &armed),
            Err(VerbsError::UnexpectedAttribute {
                attr: "path_mig_state",
                ..
            })
        ));
    }

    #[test]
    fn rc_connect_sequence() {
        let rtr = QpAttr {
            state: Some(Rtr),
            av: Some(crate::AhAttr {
                dlid: rdma_types::Lid(1),
                port: PortNum(1),
                grh: false,
                dgid: rdma_types::Gid::ZERO,
                sgid_index: 0,
                sl: 0,
                hop_limit: 64,
            }),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(Qpn::from_bits(5)),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        };
        assert_eq!(check(QpType::Rc, Init, &rtr), Ok(Rtr));
        let mut no_psn = rtr;
        no_psn.rq_psn = None;
        assert!(matches!(
            check(QpType::Rc, Init, &no_psn),
            Err(VerbsError::MissingAttribute { attr: "rq_psn", .. })
        ));
        // UC does not take responder resources.
        assert!(matches!(
            check(QpType::Uc, Init, &rtr),
            Err(VerbsError::UnexpectedAttribute {
                attr: "max_dest_rd_atomic",
                ..
            })
        ));
        let rts = QpAttr {
            state: Some(Rts),
            sq_psn: Some(Psn::new(0)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        };
        assert_eq!(check(QpType::Rc, Rtr, &rts), Ok(Rts));
        let sqd = QpAttr {
            state: Some(Sqd),
            en_sqd_async_notify: Some(true),
            ..Default::default()
        };
        assert_eq!(check(QpType::Rc, Rts, &sqd), Ok(Sqd));
        assert_eq!(
            check(
                QpType::Rc,
                Sqd,
                &QpAttr {
                    state: Some(Rts),
                    ..Default::default()
                }
            ),
            Ok(Rts)
        );
    }
}
