//! RC transfers: SEND, WRITE, READ, atomics, and the errors a transfer meets
//! (access, protection, length, RNR, bad WRs in a batch).

use crate::conformance::*;

/// SEND (multi-SGE gather and scatter), SEND with immediate, comm established.
pub fn rc_send(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    a.buf.write_at(0, b"hello, ");
    a.buf.write_at(100, b"world");
    b.p.post_recv(qb, &[recv(7, vec![b.sge(1000, 4), b.sge(2000, 100)])])
        .unwrap();
    let imm = !f.lacks().contains(&Feature::Immediate);
    let op = if imm {
        SendOpcode::SendWithImm
    } else {
        SendOpcode::Send
    };
    let mut w = send(1, op, vec![a.sge(0, 7), a.sge(100, 5)]);
    w.imm = if imm { 0xabcd } else { 0 };
    a.p.post_send(qa, &[w.clone()]).unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.qp_ctx),
        (1, WcStatus::Success, WcOpcode::Send, 10)
    );
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm, r.qp_ctx),
        (7, WcStatus::Success, WcOpcode::Recv, 12, w.imm, 20)
    );
    assert_eq!(r.wc_flags.contains(WcFlags::WITH_IMM), imm);
    assert_eq!(b.buf.to_vec(1000, 4), b"hell");
    assert_eq!(b.buf.to_vec(2000, 8), b"o, world");
    assert!(
        !b.rec.events().iter().any(|e| matches!(
            e,
            Ev::Async(AsyncEvent {
                kind: AsyncEventKind::CommEstablished,
                ..
            })
        )),
        "RTS peer: no event"
    );
    // Unsignaled SEND: no requester completion, receive still completes.
    b.p.post_recv(qb, &[recv(8, vec![b.sge(0, 64)])]).unwrap();
    let mut w = send(2, SendOpcode::Send, vec![a.sge(0, 5)]);
    w.flags = SendFlags::default();
    a.p.post_send(qa, &[w]).unwrap();
    assert_eq!(b.wc().wr_id, 8);
    a.no_wc();
    // A first message reaching a QP still in RTR raises CommEstablished.
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 33));
    connect_opts(&a, qa, &b, qb, QpType::Rc, 0, false);
    b.p.post_recv(qb, &[recv(1, vec![])]).unwrap();
    a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![])])
        .unwrap();
    assert_eq!(b.wc().status, WcStatus::Success);
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::CommEstablished,
            ctx: 33,
            ..
        })
    )));
    if !imm {
        unsupported(a.p.post_send(qa, &[send(2, SendOpcode::SendWithImm, vec![])]));
        return Outcome::Skipped(Feature::Immediate);
    }
    Outcome::Passed
}

/// RDMA WRITE and WRITE with immediate.
pub fn rc_write(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    a.buf.write_at(0, &[0x5a; 4096]);
    a.p.post_send(
        qa,
        &[rdma(
            1,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 4096)],
            b.buf.addr() + 8192,
            b.mr.rkey,
        )],
    )
    .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    until_placed(f, &a, qa, &b);
    assert_eq!(b.buf.to_vec(8192, 4096), vec![0x5a; 4096]);
    assert_eq!(b.buf.to_vec(8191, 1), [0]);
    assert_eq!(b.buf.to_vec(8192 + 4096, 1), [0]);
    b.no_wc();
    if f.lacks().contains(&Feature::Immediate) {
        let w = rdma(
            2,
            SendOpcode::RdmaWriteWithImm,
            vec![],
            b.buf.addr(),
            b.mr.rkey,
        );
        unsupported(a.p.post_send(qa, &[w]));
        return Outcome::Skipped(Feature::Immediate);
    }
    b.p.post_recv(qb, &[recv(9, vec![])]).unwrap();
    let mut w = rdma(
        2,
        SendOpcode::RdmaWriteWithImm,
        vec![a.sge(0, 16)],
        b.buf.addr(),
        b.mr.rkey,
    );
    w.imm = 42;
    a.p.post_send(qa, &[w]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.opcode, r.imm, r.byte_len),
        (9, WcOpcode::RecvRdmaWithImm, 42, 16)
    );
    assert_eq!(b.buf.to_vec(0, 16), vec![0x5a; 16]);
    Outcome::Passed
}

/// RDMA READ.
pub fn rc_read(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _qb) = rc_pair(f);
    b.buf.write_at(300, b"remote bytes");
    a.p.post_send(
        qa,
        &[rdma(
            1,
            SendOpcode::RdmaRead,
            vec![a.sge(50, 6), a.sge(500, 6)],
            b.buf.addr() + 300,
            b.mr.rkey,
        )],
    )
    .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 12)
    );
    assert_eq!(a.buf.to_vec(50, 6), b"remote");
    assert_eq!(a.buf.to_vec(500, 6), b" bytes");
    Outcome::Passed
}

/// Compare-and-swap and fetch-and-add; misaligned target refused.
pub fn rc_atomics(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Atomics) {
        let mut w = rdma(
            1,
            SendOpcode::AtomicFetchAdd,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            b.mr.rkey,
        );
        w.compare_add = 1;
        unsupported(a.p.post_send(qa, &[w]));
        return Outcome::Skipped(Feature::Atomics);
    }
    b.buf.write_at(64, &5u64.to_ne_bytes());
    let at = |id, op, cmp, swap| {
        let mut w = rdma(id, op, vec![a.sge(0, 8)], b.buf.addr() + 64, b.mr.rkey);
        w.compare_add = cmp;
        w.swap = swap;
        w
    };
    a.p.post_send(qa, &[at(1, SendOpcode::AtomicCmpSwp, 5, 9)])
        .unwrap();
    assert_eq!(
        (a.wc().opcode, a.buf.to_vec(0, 8)),
        (WcOpcode::CompSwap, 5u64.to_ne_bytes().to_vec())
    );
    assert_eq!(b.buf.to_vec(64, 8), 9u64.to_ne_bytes());
    a.p.post_send(qa, &[at(2, SendOpcode::AtomicCmpSwp, 5, 1)])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(
        b.buf.to_vec(64, 8),
        9u64.to_ne_bytes(),
        "compare failed: no swap"
    );
    a.p.post_send(qa, &[at(3, SendOpcode::AtomicFetchAdd, 100, 0)])
        .unwrap();
    assert_eq!(
        (a.wc().opcode, a.buf.to_vec(0, 8)),
        (WcOpcode::FetchAdd, 9u64.to_ne_bytes().to_vec())
    );
    assert_eq!(b.buf.to_vec(64, 8), 109u64.to_ne_bytes());
    let mut w = at(4, SendOpcode::AtomicFetchAdd, 1, 0);
    w.remote.addr += 4;
    a.p.post_send(qa, &[w]).unwrap();
    assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
    assert_eq!(b.buf.to_vec(64, 8), 109u64.to_ne_bytes());
    Outcome::Passed
}

/// Bad R_Key, out of range, missing right: RemAccessErr, memory
/// untouched, QP to ERR, later WRs and receives flushed. The responder
/// goes to ERR too, with an affiliated QpFatal (no receive WQE reports
/// its LocAccessErr; IBA 9.9.3.1). Lacking
/// [`Feature::RemoteErrorCompletion`], a WRITE completes when sent and
/// the requester learns by `QpFatal` (a READ still fails RemAccessErr).
pub fn remote_access_errors_and_flush(f: &dyn Fixture) -> Outcome {
    for case in 0..4 {
        let (a, qa, b, qb) = rc_pair(f);
        a.buf.write_at(0, &[0xee; 64]);
        let (addr, rkey, op) = match case {
            0 => (
                b.buf.addr(),
                Rkey(b.mr.rkey.0 ^ 0x80),
                SendOpcode::RdmaWrite,
            ),
            1 => (b.buf.addr() + 65536 - 32, b.mr.rkey, SendOpcode::RdmaWrite),
            2 => (b.buf.addr() - 64, b.mr.rkey, SendOpcode::RdmaRead),
            _ => {
                let m2 =
                    b.p.reg_mr(
                        b.pd,
                        &b.buf,
                        b.buf.addr(),
                        4096,
                        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                        0,
                    )
                    .unwrap();
                (b.buf.addr(), m2.rkey, SendOpcode::RdmaWrite)
            }
        };
        a.p.post_recv(qa, &[recv(50, vec![a.sge(1024, 8)])])
            .unwrap();
        a.p.post_send(qa, &[rdma(1, op, vec![a.sge(0, 64)], addr, rkey)])
            .unwrap();
        if op == SendOpcode::RdmaRead {
            let wc = a.wc();
            assert_eq!(
                (wc.wr_id, wc.status),
                (1, WcStatus::RemAccessErr),
                "case {case}"
            );
        } else {
            refused_at_requester(f, &a, qa, 10, 1, WcStatus::RemAccessErr);
        }
        assert_eq!(
            b.buf.to_vec(0, 65536),
            vec![0; 65536],
            "case {case}: remote memory touched"
        );
        assert_eq!(a.buf.to_vec(64, 8), vec![0; 8]);
        assert_eq!(a.p.query_qp(qa).unwrap().state, Some(QpState::Err));
        let fatal = qp_fatal(20);
        // The event comes on its own, with no completion to carry it.
        assert!(b.rec.wait_for(|e| *e == fatal), "case {case}: no QpFatal");
        // A receive posted now flushes.
        b.p.post_recv(qb, &[recv(60, vec![b.sge(0, 8)])]).unwrap();
        let r = b.wc();
        assert_eq!((r.wr_id, r.status), (60, WcStatus::WrFlushErr));
        assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
        let r = a.wc();
        assert_eq!((r.wr_id, r.status), (50, WcStatus::WrFlushErr));
        a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![])])
            .unwrap();
        let w = a.wc();
        assert_eq!((w.wr_id, w.status), (2, WcStatus::WrFlushErr));
    }
    if !remote_status(f) {
        return Outcome::Skipped(Feature::RemoteErrorCompletion);
    }
    Outcome::Passed
}

/// Bad L_Key: LocProtErr. (Lacking [`Feature::RemoteErrorCompletion`],
/// the error ends the stream too, so the peer's receive flushes.)
pub fn local_protection_error(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 64)])]).unwrap();
    let mut s = a.sge(0, 8);
    s.lkey = rdma_types::Lkey(s.lkey.0 ^ 0x40);
    a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![s])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::LocProtErr);
    if remote_status(f) {
        b.no_wc();
    } else {
        // The requester's error ends the stream (a TERMINATE): nothing
        // arrives, the receive flushes.
        let r = b.wc();
        assert_eq!((r.wr_id, r.status), (1, WcStatus::WrFlushErr));
        assert_eq!(b.buf.to_vec(0, 64), vec![0; 64]);
    }
    // RDMA READ into a buffer registered without LOCAL_WRITE.
    let (a, qa, b, _) = rc_pair(f);
    let ro =
        a.p.reg_mr(a.pd, &a.buf, a.buf.addr(), 4096, AccessFlags::NONE, 0)
            .unwrap();
    let s = Sge {
        addr: a.buf.addr(),
        length: 8,
        lkey: ro.lkey,
    };
    a.p.post_send(
        qa,
        &[rdma(
            2,
            SendOpcode::RdmaRead,
            vec![s],
            b.buf.addr(),
            b.mr.rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::LocProtErr);
    Outcome::Passed
}

/// Receive buffer too small: LocLenErr at the responder, RemInvReqErr at the requester.
pub fn receive_too_small(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 4)])]).unwrap();
    a.p.post_send(qa, &[send(2, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!(b.wc().status, WcStatus::LocLenErr);
    refused_at_requester(f, &a, qa, 10, 2, WcStatus::RemInvReqErr);
    if !remote_status(f) {
        return Outcome::Skipped(Feature::RemoteErrorCompletion);
    }
    Outcome::Passed
}

/// RNR: rnr_retry 0 fails at once; 7 waits for a receive.
pub fn rnr(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    a.p.post_send(qa, &[send(1, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    if !remote_status(f) {
        // No RNR: a Send finding no receive ends both QPs (RFC 5041 7.x,
        // "no buffer available").
        refused_at_requester(f, &a, qa, 10, 1, WcStatus::RnrRetryExcErr);
        assert!(
            b.rec.wait_for(|e| *e == qp_fatal(20)),
            "responder: no QpFatal"
        );
        assert_eq!(b.p.query_qp(qb).unwrap().state, Some(QpState::Err));
        return Outcome::Skipped(Feature::RemoteErrorCompletion);
    }
    assert_eq!(a.wc().status, WcStatus::RnrRetryExcErr);
    let (g1, g2) = f.guids();
    let (a, b) = (Node::open(f, g1, 64), Node::open(f, g2, 64));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    a.buf.write_at(0, b"late");
    a.p.post_send(
        qa,
        &[
            send(1, SendOpcode::Send, vec![a.sge(0, 4)]),
            send(2, SendOpcode::Send, vec![a.sge(0, 4)]),
        ],
    )
    .unwrap();
    a.no_wc();
    b.p.post_recv(qb, &[recv(5, vec![b.sge(0, 16)])]).unwrap();
    assert_eq!((b.wc().wr_id, b.buf.to_vec(0, 4)), (5, b"late".to_vec()));
    let w = a.wc();
    assert_eq!((w.wr_id, w.status), (1, WcStatus::Success));
    a.no_wc(); // WR 2 still waits, in order
    b.p.post_recv(qb, &[recv(6, vec![b.sge(0, 16)])]).unwrap();
    assert_eq!(a.wc().wr_id, 2);
    Outcome::Passed
}

/// Batches: the first bad WR's index is reported; earlier ones ran.
pub fn batch_post_reports_index(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _) = rc_pair(f);
    let too_many = vec![a.sge(0, 1); 64];
    let e =
        a.p.post_send(
            qa,
            &[
                rdma(
                    1,
                    SendOpcode::RdmaWrite,
                    vec![a.sge(0, 1)],
                    b.buf.addr(),
                    b.mr.rkey,
                ),
                send(2, SendOpcode::Send, too_many),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, VerbsError::BadWr { index: 1, .. }), "{e:?}");
    assert_eq!(a.wc().wr_id, 1);
    a.no_wc();
    Outcome::Passed
}
