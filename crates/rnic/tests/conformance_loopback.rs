//! The verbs conformance suite against the loopback provider.

use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result};

struct Loop {
    fabric: Arc<Fabric>,
    lacks: Vec<Feature>,
}

impl Loop {
    fn new() -> Loop {
        Loop::without(&[])
    }

    fn without(lacks: &[Feature]) -> Loop {
        let fabric = Fabric::without(lacks);
        // Port 2 carries the alternate path of the APM cases.
        fabric.add_ca(CaConfig::dual_port(0x1111, 1)).unwrap();
        fabric.add_ca(CaConfig::dual_port(0x2222, 2)).unwrap();
        Loop {
            fabric,
            lacks: lacks.to_vec(),
        }
    }
}

impl Fixture for Loop {
    fn provider(&self) -> Arc<dyn Provider> {
        self.fabric.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0x1111), Guid(0x2222))
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.fabric.set_port_active(guid, PortNum(1), active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.fabric.set_lid(guid, PortNum(1), lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.fabric.remove_ca(guid)
    }
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.fabric.set_pkeys(guid, PortNum(1), pkeys.to_vec())
    }
    fn lacks(&self) -> Vec<Feature> {
        self.lacks.clone()
    }
}

verbs::conformance_tests!(Loop::new());

/// The same suite against a loopback CA without memory windows, SRQs,
/// atomics and path migration: those cases must print SKIPPED and pass
/// only because the provider answers `NotSupported`.
mod limited {
    use super::*;
    verbs::conformance_tests!(Loop::without(&[
        Feature::Mw,
        Feature::Srq,
        Feature::Atomics,
        Feature::Apm
    ]));
}

/// What the generic `local_qp_operation_error` case lets a provider choose,
/// pinned for the loopback: a UD SEND through a destroyed address handle
/// is accepted at post and completes with LocQpOpErr; the QP goes to SQE
/// (IBA 10.3.1.6), the WR behind it flushes, and SQE->RTS sends again.
#[test]
fn ud_stale_address_handle_is_loc_qp_op_err_then_sqe() {
    use rdma_types::{Qkey, QpState, QpType, WcStatus};
    use verbs::conformance::{ud_rts, Node};
    use verbs::{QpAttr, RecvWr, SendOpcode, SendWr, UdDest};
    let f = Loop::new();
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(&f, g1, 64), Node::open(&f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Ud, None, 1), b.qp(QpType::Ud, None, 2));
    ud_rts(&a, qa);
    ud_rts(&b, qb);
    let stale = a.p.create_ah(a.pd, &b.av()).unwrap();
    a.p.destroy_ah(stale).unwrap();
    let good = a.p.create_ah(a.pd, &b.av()).unwrap();
    let wr = |id, ah| {
        let mut w = SendWr::new(id, SendOpcode::Send, vec![a.sge(0, 8)]);
        w.ud = Some(UdDest {
            ah,
            remote_qpn: b.p.qp_num(qb).unwrap(),
            remote_qkey: Qkey(0x1111),
        });
        w
    };
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 9,
            sges: verbs::sges![b.sge(0, 100)],
        }],
    )
    .unwrap();
    a.p.post_send(qa, &[wr(1, stale), wr(2, good)]).unwrap();
    let w = a.wc();
    assert_eq!((w.wr_id, w.status), (1, WcStatus::LocQpOpErr));
    let w = a.wc();
    assert_eq!((w.wr_id, w.status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Sqe));
    b.no_wc();
    a.p.modify_qp(
        qa,
        &QpAttr {
            state: Some(QpState::Rts),
            ..Default::default()
        },
    )
    .unwrap();
    a.buf.write_at(0, b"after sq");
    a.p.post_send(qa, &[wr(3, good)]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (9, WcStatus::Success));
    assert_eq!(b.buf.to_vec(40, 8), b"after sq");
}

/// Automatic migration on a failure the requester only sees by sending:
/// the peer's port 1 goes down (not ours). The loopback sees both ends,
/// so the SEND finds the primary path dead and the alternate alive,
/// migrates instead of completing with RetryExcErr, and the peer
/// follows when the packet reaches its alternate port. Without an armed
/// alternate path the same SEND fails (the control).
#[test]
fn apm_migrates_on_remote_port_down() {
    use rdma_types::{QpState, QpType, WcStatus};
    use verbs::conformance::{connect, rc_pair, Ev, Node};
    use verbs::{AsyncEventKind, MigState, QpAttr, RecvWr, SendOpcode, SendWr};
    let f = Loop::new();
    let (g1, g2) = f.guids();
    let (a, qa, b, qb) = rc_pair(&f);
    // A second pair on the same CAs that is not armed.
    let (a2, b2) = (Node::open(&f, g1, 64), Node::open(&f, g2, 64));
    let (qa2, qb2) = (a2.qp(QpType::Rc, None, 11), b2.qp(QpType::Rc, None, 21));
    connect(&a2, qa2, &b2, qb2, QpType::Rc, 0);
    for (n, q, peer) in [(&a, qa, &b), (&b, qb, &a)] {
        n.p.modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Rts),
                alt_path: Some(peer.alt_path_to(PortNum(2))),
                path_mig_state: Some(MigState::Rearm),
                ..Default::default()
            },
        )
        .unwrap();
    }
    f.set_port_active(g2, false).unwrap();
    // Nothing migrates until traffic finds the path dead: a's own port is up.
    assert!(!a
        .rec
        .events()
        .iter()
        .any(|e| matches!(e, Ev::Async(ev) if ev.kind == AsyncEventKind::PathMigrated)));
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 5,
            sges: verbs::sges![b.sge(0, 64)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, b"detour");
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 6)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status, r.byte_len), (5, WcStatus::Success, 6));
    assert_eq!(b.buf.to_vec(0, 6), b"detour");
    for (n, q, ctx) in [(&a, qa, 10), (&b, qb, 20)] {
        assert!(n.rec.wait_for(
            |e| matches!(e, Ev::Async(ev) if ev.kind == AsyncEventKind::PathMigrated && ev.ctx == ctx)
        ));
        assert_eq!(n.p.query_qp(q).unwrap().port, Some(PortNum(2)));
    }
    a2.p.post_send(qa2, &[SendWr::new(2, SendOpcode::Send, vec![a2.sge(0, 6)])])
        .unwrap();
    assert_eq!(a2.wc().status, WcStatus::RetryExcErr);
}

/// A connected QP finds its peer once and reuses it while nothing that
/// decides the path changes: the next WR after such a change must see
/// it. Here the peer's port goes down, and (on a second pair) the peer
/// QP is destroyed and a new QP in its slot is connected back to the
/// requester; a WR sent before each change warms the path.
#[test]
fn path_changes_reach_the_next_wr() {
    use rdma_types::{AccessFlags, Mtu};
    use rdma_types::{Psn, QpState, QpType, WcStatus};
    use verbs::conformance::{connect, rc_pair, Node};
    use verbs::{QpAttr, RecvWr, SendOpcode, SendWr};
    let f = Loop::new();
    let (g1, g2) = f.guids();
    let recv = |n: &Node, q, id| {
        n.p.post_recv(
            q,
            &[RecvWr {
                wr_id: id,
                sges: verbs::sges![n.sge(0, 64)],
            }],
        )
        .unwrap();
    };
    let send = |n: &Node, q, id| {
        n.p.post_send(q, &[SendWr::new(id, SendOpcode::Send, vec![n.sge(0, 8)])])
            .unwrap();
    };

    // The peer's port goes down.
    let (a, qa, b, qb) = rc_pair(&f);
    recv(&b, qb, 1);
    recv(&b, qb, 2);
    send(&a, qa, 1);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 1);
    f.set_port_active(g2, false).unwrap();
    send(&a, qa, 2);
    assert_eq!(a.wc().status, WcStatus::RetryExcErr);
    b.no_wc();
    f.set_port_active(g2, true).unwrap();

    // The peer QP is replaced by one that takes its slot and is
    // connected to the requester, under another QPN.
    let (a, b) = (Node::open(&f, g1, 64), Node::open(&f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 11), b.qp(QpType::Rc, None, 21));
    connect(&a, qa, &b, qb, QpType::Rc, 0);
    recv(&b, qb, 3);
    send(&a, qa, 3);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 3);
    let old = b.p.qp_num(qb).unwrap();
    b.p.destroy_qp(qb).unwrap();
    let qn = b.qp(QpType::Rc, None, 22);
    assert_ne!(b.p.qp_num(qn).unwrap(), old);
    for attr in [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(PortNum(1)),
            access: Some(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(a.av()),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(a.p.qp_num(qa).unwrap()),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        },
    ] {
        b.p.modify_qp(qn, &attr).unwrap();
    }
    recv(&b, qn, 4);
    send(&a, qa, 4);
    assert_eq!(a.wc().status, WcStatus::RetryExcErr);
    b.no_wc();
}
