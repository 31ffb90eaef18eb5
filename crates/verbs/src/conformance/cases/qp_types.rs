//! QP types beyond RC: UD with its GRH, the special QPs, SRQs, UC, and the
//! send-queue errors (LocQpOpErr, RemOpErr, SQE).

use crate::conformance::*;

/// UD SEND with the 40-byte GRH in the receive buffer; Q_Key mismatch drops.
pub fn ud_send_grh(f: &dyn Fixture) -> Outcome {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    if f.lacks().contains(&Feature::Ud) {
        unsupported(a.p.create_ah(a.pd, &b.av()));
        return Outcome::Skipped(Feature::Ud);
    }
    let (qa, qb) = (a.qp(QpType::Ud, None, 1), b.qp(QpType::Ud, None, 2));
    ud_rts(&a, qa);
    ud_rts(&b, qb);
    let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
    b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 200)])]).unwrap();
    a.buf.write_at(0, &[9; 100]);
    let mut w = send(1, SendOpcode::Send, vec![a.sge(0, 100)]);
    w.ud = Some(UdDest {
        ah,
        remote_qpn: b.p.qp_num(qb).unwrap(),
        remote_qkey: Qkey(0x1111),
    });
    a.p.post_send(qa, &[w.clone()]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.status, r.byte_len, r.src_qp),
        (WcStatus::Success, 140, a.p.qp_num(qa).unwrap())
    );
    assert!(r.wc_flags.contains(WcFlags::GRH));
    assert_eq!(b.buf.to_vec(40, 100), vec![9; 100]);
    let sgid = a.port.gids[0].0;
    if sgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        // RoCEv2 over IPv4 (IBA A17.4.5.1): the 40-byte area holds the
        // IPv4 header in its last 20 bytes; the source address is at 12.
        assert_eq!(b.buf.to_vec(20, 1), vec![0x45], "IPv4 header");
        assert_eq!(b.buf.to_vec(32, 4), sgid[12..].to_vec(), "IPv4 source");
    } else {
        assert_eq!(b.buf.to_vec(8, 16), sgid, "GRH source GID");
    }
    // Wrong Q_Key: silently dropped.
    b.p.post_recv(qb, &[recv(2, vec![b.sge(0, 200)])]).unwrap();
    w.ud.as_mut().unwrap().remote_qkey = Qkey(0x2222);
    a.p.post_send(qa, &[w.clone()]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    b.no_wc();
    // RDMA on UD is refused at post.
    assert!(matches!(
        a.p.post_send(qa, &[rdma(3, SendOpcode::RdmaWrite, vec![], 0, Rkey(0))]),
        Err(VerbsError::BadWr { index: 0, .. })
    ));
    Outcome::Passed
}

/// QP1 per port: GSI Q_Key, one per port.
pub fn special_qps(f: &dyn Fixture) -> Outcome {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    if f.lacks().contains(&Feature::SpecialQp) {
        let init = QpInit {
            qp_type: QpType::Gsi,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: true,
            port: Some(PortNum(1)),
        };
        unsupported(a.p.create_qp(a.pd, &init, 0));
        return Outcome::Skipped(Feature::SpecialQp);
    }
    let (qa, qb) = (a.qp(QpType::Gsi, None, 1), b.qp(QpType::Gsi, None, 2));
    assert_eq!(a.p.qp_num(qa).unwrap().value(), 1);
    let init = QpInit {
        qp_type: QpType::Gsi,
        send_cq: a.cq,
        recv_cq: a.cq,
        srq: None,
        caps: QpCaps::default(),
        sq_sig_all: true,
        port: Some(PortNum(1)),
    };
    assert!(matches!(
        a.p.create_qp(a.pd, &init, 0),
        Err(VerbsError::Busy(_))
    ));
    // QP0 exists on IB ports; RoCE has no subnet management (IBA
    // A16.4.1), so a RoCE provider refuses it.
    let roce = a
        .port
        .gids
        .first()
        .is_some_and(|g| g.0[..2] != [0xfe, 0x80]);
    let smi_init = QpInit {
        qp_type: QpType::Smi,
        ..init
    };
    if roce {
        unsupported(a.p.create_qp(a.pd, &smi_init, 3));
    } else {
        let smi = a.qp(QpType::Smi, None, 3);
        assert_eq!(a.p.qp_num(smi).unwrap().value(), 0);
    }
    if f.lacks().contains(&Feature::RawGsi) {
        return Outcome::Skipped(Feature::RawGsi);
    }
    for (n, q) in [(&a, qa), (&b, qb)] {
        to_init(n, q, QpType::Gsi);
        n.p.modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
        )
        .unwrap();
        n.p.modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(Psn::new(0)),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
    b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 296)])]).unwrap();
    let mut w = send(1, SendOpcode::Send, vec![a.sge(0, 256)]);
    w.ud = Some(UdDest {
        ah,
        remote_qpn: rdma_types::Qpn::GSI,
        remote_qkey: Qkey::GSI,
    });
    a.p.post_send(qa, &[w]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.byte_len, r.src_qp.value()), (296, 1));
    Outcome::Passed
}

/// SRQ shared by two QPs; limit event fires once.
pub fn srq_limit(f: &dyn Fixture) -> Outcome {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    if f.lacks().contains(&Feature::Srq) {
        unsupported(b.p.create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                limit: 0,
            },
            0,
        ));
        return Outcome::Skipped(Feature::Srq);
    }
    let srq =
        b.p.create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                limit: 0,
            },
            55,
        )
        .unwrap();
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, Some(srq), 2));
    connect(&a, qa, &b, qb, QpType::Rc, 0);
    assert!(
        b.p.post_recv(qb, &[recv(0, vec![])]).is_err(),
        "QP with SRQ takes no own receives"
    );
    b.p.post_srq_recv(
        srq,
        &(0..4)
            .map(|i| recv(i, vec![b.sge(i * 64, 64)]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(b.p.modify_srq(srq, 9).is_err());
    b.p.modify_srq(srq, 3).unwrap();
    assert_eq!(b.p.query_srq(srq).unwrap().limit, 3);
    let lim = |b: &Node| {
        b.rec
            .events()
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Ev::Async(AsyncEvent {
                        kind: AsyncEventKind::SrqLimitReached,
                        ctx: 55,
                        ..
                    })
                )
            })
            .count()
    };
    a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!((b.wc().wr_id, lim(&b)), (0, 0));
    a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!(b.wc().wr_id, 1);
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::SrqLimitReached,
            ..
        })
    )));
    a.p.post_send(qa, &[send(3, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    b.wc();
    assert_eq!(lim(&b), 1, "limit event is one-shot");
    assert!(matches!(b.p.destroy_srq(srq), Err(VerbsError::Busy(_))));
    Outcome::Passed
}

/// UC: WRITE works, READ refused at post, no RNR (message dropped).
pub fn uc_basics(f: &dyn Fixture) -> Outcome {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    if f.lacks().contains(&Feature::Uc) {
        let init = QpInit {
            qp_type: QpType::Uc,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: true,
            port: None,
        };
        unsupported(a.p.create_qp(a.pd, &init, 0));
        return Outcome::Skipped(Feature::Uc);
    }
    let (qa, qb) = (a.qp(QpType::Uc, None, 1), b.qp(QpType::Uc, None, 2));
    connect(&a, qa, &b, qb, QpType::Uc, 0);
    a.buf.write_at(0, b"uc!");
    // UC completes at the sender when the packet leaves: a SEND behind
    // the WRITE, seen by the receiver, proves the WRITE landed (one
    // path delivers in order).
    b.p.post_recv(qb, &[recv(9, vec![b.sge(100, 16)])]).unwrap();
    a.p.post_send(
        qa,
        &[
            rdma(
                1,
                SendOpcode::RdmaWrite,
                vec![a.sge(0, 3)],
                b.buf.addr(),
                b.mr.rkey,
            ),
            send(4, SendOpcode::Send, vec![a.sge(0, 2)]),
        ],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 2));
    assert_eq!(b.buf.to_vec(0, 3), b"uc!");
    assert!(matches!(
        a.p.post_send(qa, &[rdma(2, SendOpcode::RdmaRead, vec![], 0, Rkey(0))]),
        Err(VerbsError::BadWr { .. })
    ));
    a.p.post_send(qa, &[send(3, SendOpcode::Send, vec![a.sge(0, 3)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    b.no_wc();
    Outcome::Passed
}

/// A WR the QP cannot execute: a bad opcode for the type is refused at
/// post (both providers check it there); a UD SEND whose address handle
/// was destroyed is either refused at post or completes with
/// LocQpOpErr (IBA 11.4.1.1 allows both), and nothing arrives.
pub fn local_qp_operation_error(f: &dyn Fixture) -> Outcome {
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    if f.lacks().contains(&Feature::Ud) {
        unsupported(a.p.create_ah(a.pd, &b.av()));
        return Outcome::Skipped(Feature::Ud);
    }
    let (qa, qb) = (a.qp(QpType::Ud, None, 1), b.qp(QpType::Ud, None, 2));
    ud_rts(&a, qa);
    ud_rts(&b, qb);
    let ah = a.p.create_ah(a.pd, &b.av()).unwrap();
    let dest = UdDest {
        ah,
        remote_qpn: b.p.qp_num(qb).unwrap(),
        remote_qkey: Qkey(0x1111),
    };
    b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 200)])]).unwrap();
    let mut w = rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![a.sge(0, 8)],
        b.buf.addr(),
        b.mr.rkey,
    );
    w.ud = Some(dest);
    assert!(matches!(
        a.p.post_send(qa, &[w]),
        Err(VerbsError::BadWr { index: 0, .. })
    ));
    a.p.destroy_ah(ah).unwrap();
    let mut w = send(2, SendOpcode::Send, vec![a.sge(0, 8)]);
    w.ud = Some(dest);
    match a.p.post_send(qa, &[w]) {
        // Soft RoCE checks handles before it numbers the WRs.
        Err(VerbsError::BadWr { index: 0, .. } | VerbsError::InvalidArgument(_)) => a.no_wc(),
        Ok(()) => {
            let wc = a.wc();
            assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocQpOpErr));
            let want = if f.lacks().contains(&Feature::Sqe) {
                QpState::Err
            } else {
                QpState::Sqe
            };
            assert_eq!(a.p.query_qp(qa).unwrap().state, Some(want));
        }
        Err(e) => panic!("stale address handle: {e:?}"),
    }
    b.no_wc();
    Outcome::Passed
}

/// A SEND into a receive whose SGE has a bad L_Key: LocProtErr at the
/// responder, RemOpErr at the requester (IBA 9.7.5.2.4: Remote
/// Operational Error NAK), both QPs in ERR, no byte written.
pub fn remote_operational_error(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    let mut bad = b.sge(0, 64);
    bad.lkey = rdma_types::Lkey(bad.lkey.0 ^ 0x40);
    b.p.post_recv(qb, &[recv(1, vec![bad])]).unwrap();
    a.buf.write_at(0, &[7; 8]);
    a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (1, WcStatus::LocProtErr));
    refused_at_requester(f, &a, qa, 10, 2, WcStatus::RemOpErr);
    assert_eq!(b.buf.to_vec(0, 8), vec![0; 8]);
    assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
    assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
    if !remote_status(f) {
        return Outcome::Skipped(Feature::RemoteErrorCompletion);
    }
    Outcome::Passed
}

/// A UC send error moves the QP to SQE (IBA 10.3.1.6): the WRs behind
/// it flush, receives still complete, and modify SQE->RTS resumes
/// sending. A provider lacking SQE takes the QP to ERR instead.
pub fn sqe_and_resume(f: &dyn Fixture) -> Outcome {
    if f.lacks().contains(&Feature::Uc) {
        return uc_basics(f);
    }
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Uc, None, 1), b.qp(QpType::Uc, None, 2));
    connect(&a, qa, &b, qb, QpType::Uc, 0);
    let mut bad = a.sge(0, 8);
    bad.lkey = rdma_types::Lkey(bad.lkey.0 ^ 0x40);
    a.p.post_send(
        qa,
        &[
            send(1, SendOpcode::Send, vec![bad]),
            send(2, SendOpcode::Send, vec![a.sge(0, 8)]),
        ],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::LocProtErr);
    let w = a.wc();
    assert_eq!((w.wr_id, w.status), (2, WcStatus::WrFlushErr));
    let state = a.p.query_qp(qa).unwrap().state;
    if f.lacks().contains(&Feature::Sqe) {
        assert_eq!(state, Some(QpState::Err));
        return Outcome::Skipped(Feature::Sqe);
    }
    assert_eq!(state, Some(QpState::Sqe));
    a.p.post_recv(qa, &[recv(3, vec![a.sge(100, 16)])]).unwrap();
    b.buf.write_at(0, b"in sqe");
    b.p.post_send(qb, &[send(4, SendOpcode::Send, vec![b.sge(0, 6)])])
        .unwrap();
    assert_eq!(b.wc().status, WcStatus::Success);
    let r = a.wc();
    assert_eq!((r.wr_id, r.status, r.byte_len), (3, WcStatus::Success, 6));
    assert_eq!(a.buf.to_vec(100, 6), b"in sqe");
    a.p.post_send(qa, &[send(5, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::WrFlushErr, "SQE flushes new sends");
    a.p.modify_qp(
        qa,
        &QpAttr {
            state: Some(QpState::Rts),
            ..Default::default()
        },
    )
    .unwrap();
    b.p.post_recv(qb, &[recv(6, vec![b.sge(100, 16)])]).unwrap();
    a.buf.write_at(0, b"resumed!");
    a.p.post_send(qa, &[send(7, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status, r.byte_len), (6, WcStatus::Success, 8));
    assert_eq!(b.buf.to_vec(100, 8), b"resumed!");
    Outcome::Passed
}
