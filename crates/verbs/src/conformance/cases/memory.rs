//! Memory: MR re-registration and deregistration, type 1 and type 2 windows,
//! invalidation.

use crate::conformance::*;

/// Re-registration changes keys; deregistration with a bound window is refused.
pub fn mr_rereg_dereg(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _) = rc_pair(f);
    let m =
        b.p.reg_mr(b.pd, &b.buf, b.buf.addr(), 4096, all_access(), 9)
            .unwrap();
    assert!(matches!(
        b.p.reg_mr(b.pd, &b.buf, b.buf.addr(), 10, AccessFlags::REMOTE_WRITE, 0),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(matches!(
        b.p.reg_mr(b.pd, &b.buf, b.buf.addr() + 1, 65536, AccessFlags::NONE, 0),
        Err(VerbsError::InvalidArgument(_))
    ));
    let m2 =
        b.p.rereg_mr(m.handle, &b.buf, b.buf.addr() + 4096, 4096, all_access())
            .unwrap();
    assert_ne!(m.rkey, m2.rkey);
    a.buf.write_at(0, &[0xa5; 8]);
    a.p.post_send(
        qa,
        &[rdma(
            1,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr() + 4096,
            m2.rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    a.p.post_send(
        qa,
        &[rdma(
            2,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            m.rkey,
        )],
    )
    .unwrap();
    // The old key must die.
    refused_at_requester(f, &a, qa, 10, 2, WcStatus::RemAccessErr);
    assert_eq!(
        b.buf.to_vec(0, 8),
        vec![0; 8],
        "written through the old key"
    );
    if f.lacks().contains(&Feature::Mw) {
        unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
        return Outcome::Skipped(Feature::Mw);
    }
    let (c, qc, d, _qd) = rc_pair(f);
    let (mw, _) = c.p.alloc_mw(c.pd, MwType::Type1, 4).unwrap();
    c.p.bind_mw(
        qc,
        &MwBind {
            mw,
            rkey: Rkey(0),
            mr: c.mr.handle,
            addr: c.buf.addr(),
            len: 64,
            access: AccessFlags::REMOTE_READ,
        },
    )
    .unwrap();
    assert!(matches!(
        c.p.dereg_mr(c.mr.handle),
        Err(VerbsError::Busy(_))
    ));
    c.p.dealloc_mw(mw).unwrap();
    c.p.dereg_mr(c.mr.handle).unwrap();
    assert!(c.rec.wait_for(|e| *e == Ev::Destroyed(ResourceKind::Mr, 3)));
    let _ = d;
    Outcome::Passed
}

/// Type 1 window bind; access through it; bounds and rights of the window.
pub fn mw_type1(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Mw) {
        unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
        return Outcome::Skipped(Feature::Mw);
    }
    let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
    let rkey =
        b.p.bind_mw(
            qb,
            &MwBind {
                mw,
                rkey: Rkey(0),
                mr: b.mr.handle,
                addr: b.buf.addr() + 4096,
                len: 128,
                access: AccessFlags::REMOTE_WRITE,
            },
        )
        .unwrap();
    a.buf.write_at(0, &[7; 128]);
    a.p.post_send(
        qa,
        &[rdma(
            1,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 128)],
            b.buf.addr() + 4096,
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(4096, 128), vec![7; 128]);
    a.p.post_send(
        qa,
        &[rdma(
            2,
            SendOpcode::RdmaRead,
            vec![a.sge(0, 8)],
            b.buf.addr() + 4096,
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(
        a.wc().status,
        WcStatus::RemAccessErr,
        "window has no read right"
    );
    let (a, qa, b, qb) = rc_pair(f);
    let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
    let rkey =
        b.p.bind_mw(
            qb,
            &MwBind {
                mw,
                rkey: Rkey(0),
                mr: b.mr.handle,
                addr: b.buf.addr(),
                len: 128,
                access: AccessFlags::REMOTE_WRITE,
            },
        )
        .unwrap();
    a.p.post_send(
        qa,
        &[rdma(
            3,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr() + 124,
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemAccessErr, "beyond the window");
    assert_eq!(b.buf.to_vec(0, 256), vec![0; 256]);
    Outcome::Passed
}

/// Type 2 window: bind WR, SEND with invalidate, local invalidate.
pub fn mw_type2_and_invalidate(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Mw) {
        unsupported(b.p.alloc_mw(b.pd, MwType::Type2, 0));
        return Outcome::Skipped(Feature::Mw);
    }
    let (mw, k0) = b.p.alloc_mw(b.pd, MwType::Type2, 4).unwrap();
    let rkey = with_tag(k0, 0x33);
    let mut bw = send(1, SendOpcode::BindMw, vec![]);
    bw.bind_mw = Some(MwBind {
        mw,
        rkey,
        mr: b.mr.handle,
        addr: b.buf.addr(),
        len: 256,
        access: AccessFlags::REMOTE_WRITE,
    });
    b.p.post_send(qb, &[bw.clone()]).unwrap();
    let wc = b.wc();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    a.p.post_send(
        qa,
        &[rdma(
            2,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    b.p.post_recv(qb, &[recv(3, vec![b.sge(1024, 16)])])
        .unwrap();
    let mut inv = send(4, SendOpcode::SendWithInv, vec![]);
    inv.invalidate_rkey = rkey;
    a.p.post_send(qa, &[inv]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r.invalidated_rkey, rkey);
    a.p.post_send(
        qa,
        &[rdma(
            5,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            rkey,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemAccessErr, "invalidated window");
    // Local invalidate on a fresh pair.
    let (_a, _qa, b, qb) = rc_pair(f);
    let (mw, k0) = b.p.alloc_mw(b.pd, MwType::Type2, 4).unwrap();
    let rkey = with_tag(k0, 0x44);
    let mut bw = send(1, SendOpcode::BindMw, vec![]);
    bw.bind_mw = Some(MwBind {
        mw,
        rkey,
        mr: b.mr.handle,
        addr: b.buf.addr(),
        len: 256,
        access: AccessFlags::REMOTE_READ,
    });
    b.p.post_send(qb, &[bw]).unwrap();
    assert_eq!(b.wc().status, WcStatus::Success);
    let mut li = send(2, SendOpcode::LocalInv, vec![]);
    li.invalidate_rkey = rkey;
    b.p.post_send(qb, &[li.clone()]).unwrap();
    let w = b.wc();
    assert_eq!(
        (w.opcode, w.status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    li.wr_id = 3;
    b.p.post_send(qb, &[li]).unwrap();
    assert_eq!(
        b.wc().status,
        WcStatus::MwBindErr,
        "second invalidate fails"
    );
    Outcome::Passed
}

/// SEND with invalidate of a key that is not a bound type 2 window (an
/// MR's, a type 1 window's) completes in error at both ends (rxe's
/// class J: remote invalid request); a deallocated window's key is
/// refused and writes nothing.
pub fn mw_refusals(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Mw) {
        unsupported(b.p.alloc_mw(b.pd, MwType::Type1, 0));
        return Outcome::Skipped(Feature::Mw);
    }
    let bind1 = |b: &Node, qb: QpHandle| {
        let (mw, _) = b.p.alloc_mw(b.pd, MwType::Type1, 4).unwrap();
        let rkey =
            b.p.bind_mw(
                qb,
                &MwBind {
                    mw,
                    rkey: Rkey(0),
                    mr: b.mr.handle,
                    addr: b.buf.addr(),
                    len: 64,
                    access: AccessFlags::REMOTE_WRITE,
                },
            )
            .unwrap();
        (mw, rkey)
    };
    for what in ["an MR's key", "a type 1 window"] {
        let (a, qa, b, qb) = rc_pair(f);
        let key = if what == "an MR's key" {
            b.mr.rkey
        } else {
            bind1(&b, qb).1
        };
        b.p.post_recv(qb, &[recv(1, vec![b.sge(0, 16)])]).unwrap();
        let mut inv = send(2, SendOpcode::SendWithInv, vec![a.sge(0, 8)]);
        inv.invalidate_rkey = key;
        a.p.post_send(qa, &[inv]).unwrap();
        assert_eq!(a.wc().status, WcStatus::RemInvReqErr, "{what}");
        let r = b.wc();
        assert_eq!((r.wr_id, r.status), (1, WcStatus::RemInvReqErr), "{what}");
        assert!(!r.wc_flags.contains(WcFlags::WITH_INV), "{what}");
    }
    let (mw, rkey) = bind1(&b, qb);
    a.buf.write_at(0, &[5; 8]);
    let write = |id| {
        rdma(
            id,
            SendOpcode::RdmaWrite,
            vec![a.sge(0, 8)],
            b.buf.addr(),
            rkey,
        )
    };
    a.p.post_send(qa, &[write(3)]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(0, 8), vec![5; 8]);
    b.p.dealloc_mw(mw).unwrap();
    b.buf.write_at(0, &[0; 8]);
    a.p.post_send(qa, &[write(4)]).unwrap();
    assert_eq!(a.wc().status, WcStatus::RemAccessErr, "deallocated window");
    assert_eq!(b.buf.to_vec(0, 8), vec![0; 8]);
    Outcome::Passed
}

/// Type 2 bind key: the window's key with a new low byte (IBA 10.6.7.2.1).
fn with_tag(k: Rkey, tag: u8) -> Rkey {
    Rkey((k.0 & !0xff) | tag as u32)
}
