//! Ports: P_Key tables, path migration (APM), port and CA events.

use crate::conformance::*;

/// A new P_Key table raises PkeyChange on the port and shows in
/// `query_port`.
pub fn pkey_change(f: &dyn Fixture) -> Outcome {
    let (_, g2) = f.guids();
    let b = Node::open(f, g2, 16);
    let table = [Pkey::DEFAULT, Pkey(0x8010)];
    match f.set_pkeys(g2, &table) {
        Err(VerbsError::NotSupported(_)) if f.lacks().contains(&Feature::PortControl) => {
            return Outcome::Skipped(Feature::PortControl);
        }
        Err(VerbsError::NotSupported(why)) => {
            // The fixture cannot make the event: a declared gap or a
            // failure (`run` checks the declaration).
            println!("pkey_change: the fixture cannot set the table ({why})");
            return Outcome::Skipped(Feature::PkeyControl);
        }
        r => r.unwrap(),
    }
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::PkeyChange,
            ctx: 0,
            port: Some(PortNum(1)),
        })
    )));
    let pkeys = b.p.query_port(b.ca, PortNum(1)).unwrap().pkeys;
    assert_eq!(&pkeys[..table.len()], &table[..]);
    Outcome::Passed
}

/// RTS->RTS with an alternate path and/or a migration state.
fn apm_modify(alt: Option<AltPath>, mig: Option<MigState>) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        alt_path: alt,
        path_mig_state: mig,
        ..Default::default()
    }
}

fn path_migrated(ctx: u64) -> impl Fn(&Ev) -> bool {
    move |e| {
        matches!(e, Ev::Async(AsyncEvent {
            kind: AsyncEventKind::PathMigrated,
            ctx: c,
            port: None,
        }) if *c == ctx)
    }
}

fn refused(r: Result<()>) {
    assert!(
        matches!(r, Err(VerbsError::InvalidArgument(_))),
        "expected a refusal, got {r:?}"
    );
}

/// The lacking provider's answer to an alternate path.
fn apm_unsupported(a: &Node, qa: QpHandle, b: &Node) -> Outcome {
    let alt = b.alt_path_to(PortNum(2));
    unsupported(a.p.modify_qp(qa, &apm_modify(Some(alt), Some(MigState::Rearm))));
    let q = a.p.query_qp(qa).unwrap();
    assert_eq!((q.state, q.alt_path), (Some(QpState::Rts), None));
    Outcome::Skipped(Feature::Apm)
}

/// Loads an alternate path through port 2 on both QPs and rearms them;
/// the provider arms at once. Returns (a's, b's) alternate path.
fn arm_pair(a: &Node, qa: QpHandle, b: &Node, qb: QpHandle) -> (AltPath, AltPath) {
    let alts = (b.alt_path_to(PortNum(2)), a.alt_path_to(PortNum(2)));
    for (n, q, alt) in [(a, qa, alts.0), (b, qb, alts.1)] {
        n.p.modify_qp(q, &apm_modify(Some(alt), Some(MigState::Rearm)))
            .unwrap();
        let got = n.p.query_qp(q).unwrap();
        assert_eq!(got.path_mig_state, Some(MigState::Armed));
        assert_eq!(got.alt_path, Some(alt));
    }
    alts
}

/// A signaled SEND of `msg` from `x` lands in a receive `id` of `y`;
/// both complete successfully.
fn send_ok(x: &Node, qx: QpHandle, y: &Node, qy: QpHandle, id: u64, msg: &[u8]) {
    y.p.post_recv(qy, &[recv(id, vec![y.sge(1000, 64)])])
        .unwrap();
    x.buf.write_at(0, msg);
    x.p.post_send(
        qx,
        &[send(id, SendOpcode::Send, vec![x.sge(0, msg.len() as u32)])],
    )
    .unwrap();
    let w = x.wc();
    assert_eq!((w.wr_id, w.status), (id, WcStatus::Success), "{msg:?}");
    let r = y.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (id, WcStatus::Success, msg.len() as u32)
    );
    assert_eq!(y.buf.to_vec(1000, msg.len()), msg);
}

/// Path migration forced by the consumer (IBA 17.2.8): invalid
/// requests are refused; loading an alternate path and asking for
/// Rearm arms it; RTS->RTS with Migrated switches the QP to the
/// alternate path and raises PathMigrated with the QP's context; the
/// peer migrates when the first packet reaches it on its alternate
/// path (MigReq); traffic flows both ways after; a new alternate path
/// can be loaded and armed again.
pub fn apm_forced_migration(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Apm) {
        return apm_unsupported(&a, qa, &b);
    }
    let q = a.p.query_qp(qa).unwrap();
    assert_eq!(
        (q.path_mig_state, q.alt_path),
        (Some(MigState::Migrated), None)
    );
    // Nothing armed: no forced migration, no Rearm; Armed is the
    // provider's to set.
    refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated))));
    refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Rearm))));
    let alt = b.alt_path_to(PortNum(2));
    refused(a.p.modify_qp(qa, &apm_modify(Some(alt), Some(MigState::Armed))));
    // UD has no alternate path.
    if !f.lacks().contains(&Feature::Ud) {
        let u = a.qp(QpType::Ud, None, 30);
        ud_rts(&a, u);
        assert!(matches!(
            a.p.modify_qp(u, &apm_modify(Some(alt), None)),
            Err(VerbsError::UnexpectedAttribute {
                attr: "alt_path",
                ..
            })
        ));
    }
    let (alt_a, _) = arm_pair(&a, qa, &b, qb);
    // An armed alternate path cannot be replaced.
    refused(a.p.modify_qp(qa, &apm_modify(Some(alt_a), Some(MigState::Rearm))));
    send_ok(&a, qa, &b, qb, 1, b"on the primary path");
    assert!(!a.rec.events().iter().any(path_migrated(10)));
    a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated)))
        .unwrap();
    assert!(a.rec.wait_for(path_migrated(10)));
    let q = a.p.query_qp(qa).unwrap();
    assert_eq!(q.path_mig_state, Some(MigState::Migrated));
    assert_eq!(q.alt_path, None);
    assert_eq!((q.av, q.port), (Some(alt_a.av), Some(PortNum(2))));
    assert!(!b.rec.events().iter().any(path_migrated(20)));
    send_ok(&a, qa, &b, qb, 2, b"on the alternate path");
    assert!(b.rec.wait_for(path_migrated(20)));
    let q = b.p.query_qp(qb).unwrap();
    assert_eq!(
        (q.path_mig_state, q.port),
        (Some(MigState::Migrated), Some(PortNum(2)))
    );
    send_ok(&b, qb, &a, qa, 3, b"and back");
    // Migrated again while Migrated: refused.
    refused(a.p.modify_qp(qa, &apm_modify(None, Some(MigState::Migrated))));
    // The old primary path becomes the new alternate.
    let back = b.alt_path_to(PortNum(1));
    a.p.modify_qp(qa, &apm_modify(Some(back), Some(MigState::Rearm)))
        .unwrap();
    let q = a.p.query_qp(qa).unwrap();
    assert_eq!(
        (q.path_mig_state, q.alt_path),
        (Some(MigState::Armed), Some(back))
    );
    Outcome::Passed
}

/// Automatic path migration: with the alternate path armed on both
/// QPs, port 1 of the first CA goes down; the SEND after it completes
/// without an error (the QP moved to port 2), both owners get
/// PathMigrated, and traffic flows both ways on the alternate path.
pub fn apm_port_down(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, qb) = rc_pair(f);
    if f.lacks().contains(&Feature::Apm) {
        return apm_unsupported(&a, qa, &b);
    }
    let (g1, _) = f.guids();
    if f.lacks().contains(&Feature::PortControl) {
        unsupported(f.set_port_active(g1, false));
        return Outcome::Skipped(Feature::PortControl);
    }
    arm_pair(&a, qa, &b, qb);
    send_ok(&a, qa, &b, qb, 1, b"before");
    f.set_port_active(g1, false).unwrap();
    assert!(a.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::PortDown,
            port: Some(PortNum(1)),
            ..
        })
    )));
    send_ok(&a, qa, &b, qb, 2, b"after the port went down");
    assert!(a.rec.wait_for(path_migrated(10)));
    assert!(b.rec.wait_for(path_migrated(20)));
    for (n, q) in [(&a, qa), (&b, qb)] {
        let got = n.p.query_qp(q).unwrap();
        assert_eq!(
            (got.state, got.path_mig_state, got.port),
            (
                Some(QpState::Rts),
                Some(MigState::Migrated),
                Some(PortNum(2))
            )
        );
    }
    send_ok(&b, qb, &a, qa, 3, b"back on port 2");
    f.set_port_active(g1, true).unwrap();
    Outcome::Passed
}

/// Port down/up, LID change, CA removal events; RC over a down port fails.
pub fn port_and_ca_events(f: &dyn Fixture) -> Outcome {
    let (a, qa, b, _qb) = rc_pair(f);
    let (_, g2) = f.guids();
    if f.lacks().contains(&Feature::PortControl) {
        unsupported(f.set_port_active(g2, false));
        return Outcome::Skipped(Feature::PortControl);
    }
    f.set_port_active(g2, false).unwrap();
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::PortDown,
            port: Some(PortNum(1)),
            ..
        })
    )));
    assert_eq!(
        b.p.query_port(b.ca, PortNum(1)).unwrap().state,
        PortState::Down
    );
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
    assert_eq!(a.wc().status, WcStatus::RetryExcErr);
    f.set_port_active(g2, true).unwrap();
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::PortActive,
            ..
        })
    )));
    f.set_lid(g2, Lid(0x77)).unwrap();
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::LidChange,
            ..
        })
    )));
    assert_eq!(b.p.query_port(b.ca, PortNum(1)).unwrap().lid, Lid(0x77));
    f.remove_ca(g2).unwrap();
    assert!(b.rec.wait_for(|e| matches!(
        e,
        Ev::Async(AsyncEvent {
            kind: AsyncEventKind::CaRemoval,
            ctx: 1,
            ..
        })
    )));
    assert!(b.p.open_ca(g2, 0, b.rec.clone()).is_err());
    Outcome::Passed
}
