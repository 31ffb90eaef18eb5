//! Objects: opening and querying, handles, busy and destroyed resources, the
//! QP state machine, CQs.

use crate::conformance::*;

/// Query CA and port; open by unknown GUID fails.
pub fn query_ca_port(f: &dyn Fixture) -> Outcome {
    let (g1, _) = f.guids();
    let n = Node::open(f, g1, 16);
    let ca = n.p.query_ca(n.ca).unwrap();
    assert_eq!(ca.guid, g1);
    assert!(ca.num_ports >= 1 && ca.max_qp_wr >= 64 && ca.max_sge >= 4);
    assert!(n.p.list_cas().contains(&g1));
    assert_eq!(n.port.state, PortState::Active);
    // IB ports have a unicast LID; RoCE ports have none (LID 0) and a
    // GID that is an IP address (not the fe80::/64 subnet prefix).
    let roce = n
        .port
        .gids
        .first()
        .is_some_and(|g| g.0[..2] != [0xfe, 0x80]);
    assert!(
        (n.port.lid.is_unicast() && n.port.lid != Lid(0)) || (roce && n.port.lid == Lid(0)),
        "LID {:?} on a port with GID {:?}",
        n.port.lid,
        n.port.gids.first()
    );
    assert!(!n.port.gids.is_empty() && n.port.gids[0] != Gid::ZERO);
    assert_eq!(
        n.p.find_pkey(n.ca, PortNum(1), rdma_types::Pkey::DEFAULT)
            .unwrap(),
        0
    );
    assert!(n.port.active_mtu.bytes() <= n.port.max_mtu.bytes());
    assert!(n.p.query_port(n.ca, PortNum(99)).is_err());
    assert!(n
        .p
        .open_ca(Guid(0xdead_beef_0bad), 0, n.rec.clone())
        .is_err());
    Outcome::Passed
}

/// Stale handles are refused; destroy reports `on_destroyed` with ctx.
pub fn stale_handles_and_destroy(f: &dyn Fixture) -> Outcome {
    let n = Node::open(f, f.guids().0, 16);
    let pd = n.p.alloc_pd(n.ca, 77).unwrap();
    n.p.dealloc_pd(pd).unwrap();
    assert!(n
        .rec
        .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Pd, 77)));
    assert_eq!(n.p.dealloc_pd(pd), Err(VerbsError::InvalidHandle));
    assert_eq!(
        n.p.create_cq(pd, &CqInit { cqe: 4 }, 0),
        Err(VerbsError::InvalidHandle)
    );
    // A fresh object in the same slot does not revive the old handle.
    let _pd2 = n.p.alloc_pd(n.ca, 78).unwrap();
    assert_eq!(n.p.dealloc_pd(pd), Err(VerbsError::InvalidHandle));
    // Wrong handle kind.
    assert_eq!(
        n.p.poll_cq(CqHandle(n.pd.0), &mut []),
        Err(VerbsError::InvalidHandle)
    );
    Outcome::Passed
}

/// Objects in use refuse destruction with `Busy`.
pub fn busy_resources(f: &dyn Fixture) -> Outcome {
    let n = Node::open(f, f.guids().0, 16);
    assert!(matches!(n.p.dealloc_pd(n.pd), Err(VerbsError::Busy(_))));
    let qp = n.qp(QpType::Rc, None, 5);
    assert!(matches!(n.p.destroy_cq(n.cq), Err(VerbsError::Busy(_))));
    n.p.destroy_qp(qp).unwrap();
    assert!(n.rec.wait_for(|e| *e == Ev::Destroyed(ResourceKind::Qp, 5)));
    n.p.destroy_cq(n.cq).unwrap();
    assert!(n
        .rec
        .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Cq, 100)));
    Outcome::Passed
}

/// The QP state machine with attribute validation per transition.
pub fn qp_state_machine(f: &dyn Fixture) -> Outcome {
    let n = Node::open(f, f.guids().0, 16);
    let qp = n.qp(QpType::Rc, None, 5);
    assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Reset));
    let st = |s| QpAttr {
        state: Some(s),
        ..Default::default()
    };
    assert_eq!(
        n.p.modify_qp(qp, &st(QpState::Rts)),
        Err(VerbsError::InvalidTransition {
            from: QpState::Reset,
            to: QpState::Rts
        })
    );
    assert!(matches!(
        n.p.modify_qp(qp, &st(QpState::Init)),
        Err(VerbsError::MissingAttribute { .. })
    ));
    let bad_pkey = QpAttr {
        state: Some(QpState::Init),
        port: Some(PortNum(1)),
        pkey_index: Some(999),
        access: Some(AccessFlags::NONE),
        ..Default::default()
    };
    assert!(matches!(
        n.p.modify_qp(qp, &bad_pkey),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert_eq!(
        n.p.query_qp(qp).unwrap().state,
        Some(QpState::Reset),
        "refused modify changes nothing"
    );
    to_init(&n, qp, QpType::Rc);
    assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Init));
    let e =
        n.p.post_send(qp, &[send(1, SendOpcode::Send, vec![])])
            .unwrap_err();
    assert_eq!(
        e,
        VerbsError::BadWr {
            index: 0,
            cause: Box::new(VerbsError::InvalidState(QpState::Init))
        }
    );
    assert!(matches!(
        n.p.modify_qp(qp, &st(QpState::Rtr)),
        Err(VerbsError::MissingAttribute { .. })
    ));
    n.p.modify_qp(qp, &st(QpState::Err)).unwrap();
    assert_eq!(n.p.query_qp(qp).unwrap().state, Some(QpState::Err));
    assert!(matches!(
        n.p.modify_qp(qp, &st(QpState::Rts)),
        Err(VerbsError::InvalidTransition { .. })
    ));
    n.p.modify_qp(qp, &st(QpState::Reset)).unwrap();
    // Full RC path incl. SQD and back.
    let (a, qa, _b, _qb) = rc_pair(f);
    a.p.modify_qp(
        qa,
        &QpAttr {
            state: Some(QpState::Sqd),
            en_sqd_async_notify: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(a.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::SqDrained,
            ctx: 10,
            ..
        })
    )));
    a.p.modify_qp(
        qa,
        &QpAttr {
            state: Some(QpState::Sqd),
            timeout: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    a.p.modify_qp(qa, &st(QpState::Rts)).unwrap();
    assert_eq!(a.p.query_qp(qa).unwrap().timeout, Some(10));
    Outcome::Passed
}

/// CQ: arm/notify, solicited-only, blocking wait timeout (and one of
/// `Duration::MAX`), overflow event.
pub fn cq_notify_wait_overflow(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    assert_eq!(
        a.p.wait_cq(a.cq, Duration::from_millis(5)),
        Err(VerbsError::Timeout)
    );
    b.p.req_notify_cq(b.cq, true).unwrap();
    b.p.post_recv(qb, &[recv(1, vec![]), recv(2, vec![])])
        .unwrap();
    // The longest timeout there is (what a consumer that means "for
    // ever" passes) blocks until the SEND, posted from another thread a
    // moment later, completes: no deadline overflows or turns negative.
    // (Were the post first, the wait might find its completion there.)
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![])])
                .unwrap();
        });
        assert_eq!(a.p.wait_cq(a.cq, Duration::MAX), Ok(()));
    });
    b.wc();
    assert!(
        !b.rec.events().contains(&Ev::Completion(100)),
        "solicited-only arm fired on unsolicited"
    );
    let mut w = send(2, SendOpcode::Send, vec![]);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    a.p.post_send(qa, &[w]).unwrap();
    assert!(b.rec.wait_for(|e| *e == Ev::Completion(100)));
    // Overflow.
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 2), Node::open(f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 0);
    for i in 0..3 {
        a.p.post_send(
            qa,
            &[rdma(
                i,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 8)],
                b.buf.addr(),
                b.mr.rkey,
            )],
        )
        .unwrap();
    }
    assert!(a.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::CqError,
            ctx: 100,
            ..
        })
    )));
    Outcome::Passed
}

/// Destroying a QP from inside its CQ callback neither blocks nor
/// deadlocks; `on_destroyed` comes after the callback.
pub fn destroy_from_callback(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _) = rc_pair(f);
    let p = a.p.clone();
    *a.rec.hook.lock().unwrap() = Some(Box::new(move |_| {
        p.destroy_qp(qa).unwrap();
    }));
    a.p.req_notify_cq(a.cq, false).unwrap();
    a.p.post_send(
        qa,
        &[rdma(
            1,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            b.mr.rkey,
        )],
    )
    .unwrap();
    assert!(a
        .rec
        .wait_for(|e| *e == Ev::Destroyed(ResourceKind::Qp, 10)));
    let ev = a.rec.events();
    let c = ev.iter().position(|e| *e == Ev::Completion(100)).unwrap();
    let d = ev
        .iter()
        .position(|e| *e == Ev::Destroyed(ResourceKind::Qp, 10))
        .unwrap();
    assert!(c < d);
    assert_eq!(a.p.query_qp(qa), Err(VerbsError::InvalidHandle));
    Outcome::Passed
}
