//! Memory windows, SEND with invalidate and inline data on the soft RoCE
//! provider beyond what the conformance suite covers: the error paths
//! (invalidating an MR's key or another PD's window, access after unbind,
//! invalidate or dealloc, a type 2 window used from another QP, bind
//! errors), inline data copied at post time, and the IETH and NAK on the
//! wire as our parser and tshark read them.
//!
//! Every fixture is two CAs on its own pair of 127.0.150.x addresses
//! (1-20) with RoCEv2 on UDP port 47150.

mod common;

use common::Soft;
use rdma_types::{AccessFlags, Guid, Lkey, QpType, Rkey, WcOpcode, WcStatus};
use rdma_wire::{NakCode, Syndrome};
use rnic::softroce::MAX_INLINE_DATA;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU8, Ordering};

use verbs::conformance::{connect, rc_pair, Node};
use verbs::{
    MemBuf, MwBind, MwType, QpCaps, QpInit, RecvWr, SendFlags, SendOpcode, SendWr, Sge, VerbsError,
    WcFlags,
};

const PORT: u16 = 47150;

/// The next free pair of 127.0.150.x addresses (10 pairs, 7 used).
static NEXT: AtomicU8 = AtomicU8::new(0);

impl Soft {
    fn new() -> Soft {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 10, "only 127.0.150.1-20 are ours");
        let ip = |k: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 150, 2 * n + k + 1));
        Soft::pair(ip(0), ip(1), PORT)
    }
}

fn rdma(wr_id: u64, op: SendOpcode, sge: Sge, addr: u64, rkey: Rkey) -> SendWr {
    let mut w = SendWr::new(wr_id, op, vec![sge]);
    w.remote.addr = addr;
    w.remote.rkey = rkey;
    w
}

fn recv(n: &Node, qp: verbs::QpHandle, wr_id: u64, off: u64, len: u32) {
    n.p.post_recv(
        qp,
        &[RecvWr {
            wr_id,
            sges: verbs::sges![n.sge(off, len)],
        }],
    )
    .unwrap();
}

fn send_inv(wr_id: u64, sge: Sge, rkey: Rkey) -> SendWr {
    let mut w = SendWr::new(wr_id, SendOpcode::SendWithInv, vec![sge]);
    w.invalidate_rkey = rkey;
    w
}

/// A type 2 bind WR of window `mw` (allocated with key `k0`) over
/// `[off, off+len)` of the node's buffer with key tag `tag`.
fn bind_wr(
    n: &Node,
    wr_id: u64,
    (mw, k0): (verbs::MwHandle, Rkey),
    tag: u8,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> SendWr {
    let mut w = SendWr::new(wr_id, SendOpcode::BindMw, vec![]);
    let rkey = Rkey((k0.0 & !0xff) | u32::from(tag));
    w.bind_mw = Some(MwBind {
        mw,
        rkey,
        mr: n.mr.handle,
        addr: n.buf.addr() + off,
        len,
        access,
    });
    w
}

/// Binds a type 2 window on `qp` and returns its R_Key.
fn bind_type2(
    n: &Node,
    qp: verbs::QpHandle,
    tag: u8,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> (verbs::MwHandle, Rkey) {
    let (mw, k0) = n.p.alloc_mw(n.pd, MwType::Type2, 40).unwrap();
    let w = bind_wr(n, 900, (mw, k0), tag, off, len, access);
    let rkey = w.bind_mw.unwrap().rkey;
    n.p.post_send(qp, &[w]).unwrap();
    let wc = n.wc();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (900, WcOpcode::BindMw, WcStatus::Success)
    );
    (mw, rkey)
}

fn bind_type1(
    n: &Node,
    qp: verbs::QpHandle,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> (verbs::MwHandle, Rkey) {
    let (mw, _) = n.p.alloc_mw(n.pd, MwType::Type1, 41).unwrap();
    let rkey =
        n.p.bind_mw(
            qp,
            &MwBind {
                mw,
                rkey: Rkey(0),
                mr: n.mr.handle,
                addr: n.buf.addr() + off,
                len,
                access,
            },
        )
        .unwrap();
    (mw, rkey)
}

#[test]
fn device_reports_windows_and_inline_data() {
    let f = Soft::new();
    let n = Node::open(&f, Guid(0x1111), 16);
    let attr = n.p.query_ca(n.ca).unwrap();
    assert!(attr.max_mw > 0);
    assert_eq!(attr.max_inline_data, MAX_INLINE_DATA);
    let mut init = QpInit::rc(n.cq, 4, 4);
    init.caps = QpCaps {
        max_inline: MAX_INLINE_DATA + 1,
        ..QpCaps::default()
    };
    assert!(matches!(
        n.p.create_qp(n.pd, &init, 1),
        Err(VerbsError::InvalidArgument(_))
    ));
    init.caps.max_inline = MAX_INLINE_DATA;
    n.p.create_qp(n.pd, &init, 1).unwrap();
}

/// Inline SEND and RDMA WRITE: the bytes are taken at post time (the
/// buffer is overwritten as soon as the post returns), no L_Key needed,
/// memory of another PD on the CA will do; beyond max_inline, with READ,
/// or from memory nobody registered, the post is refused.
#[test]
fn inline_data_is_copied_at_post_time_without_an_lkey() {
    let f = Soft::new();
    let (a, qa, b, qb) = rc_pair(&f);
    // A second open of A's CA: another PD, its own registered buffer.
    let other = Node::open(&f, Guid(0x1111), 16);
    let msg: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    for (round, (buf, base)) in [(&a.buf, 0u64), (&other.buf, 256)].into_iter().enumerate() {
        buf.write_at(base as usize, &msg);
        recv(&b, qb, 10 + round as u64, 2048 * round as u64, 64);
        let mut w = SendWr::new(
            1 + round as u64,
            SendOpcode::Send,
            vec![Sge {
                addr: buf.addr() + base,
                length: 48,
                lkey: Lkey(0),
            }],
        );
        w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
        a.p.post_send(qa, &[w]).unwrap();
        buf.write_at(base as usize, &[0xee; 48]);
        let s = a.wc();
        assert_eq!((s.status, s.opcode), (WcStatus::Success, WcOpcode::Send));
        let r = b.wc();
        assert_eq!((r.status, r.byte_len), (WcStatus::Success, 48));
        assert_eq!(b.buf.to_vec(2048 * round, 48), msg, "round {round}");
    }
    // Inline RDMA WRITE from two pieces.
    a.buf.write_at(100, &msg[..20]);
    a.buf.write_at(300, &msg[20..]);
    let mut w = rdma(
        3,
        SendOpcode::RdmaWrite,
        Sge {
            addr: a.buf.addr() + 100,
            length: 20,
            lkey: Lkey(0),
        },
        b.buf.addr() + 8192,
        b.mr.rkey,
    );
    w.sges.push(Sge {
        addr: a.buf.addr() + 300,
        length: 28,
        lkey: Lkey(0),
    });
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    a.p.post_send(qa, &[w]).unwrap();
    a.buf.write_at(100, &[0; 20]);
    a.buf.write_at(300, &[0; 28]);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(8192, 48), msg);
    // Refusals: 65 bytes > max_inline 64 (QpCaps::default), READ, memory
    // no region holds.
    let inline = |sge: Sge, op: SendOpcode| {
        let mut w = rdma(4, op, sge, b.buf.addr(), b.mr.rkey);
        w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
        w
    };
    let loose = MemBuf::new(64);
    for w in [
        inline(a.sge(0, 65), SendOpcode::RdmaWrite),
        inline(a.sge(0, 8), SendOpcode::RdmaRead),
        inline(
            Sge {
                addr: loose.addr(),
                length: 8,
                lkey: Lkey(0),
            },
            SendOpcode::RdmaWrite,
        ),
    ] {
        match a.p.post_send(qa, std::slice::from_ref(&w)) {
            Err(VerbsError::BadWr { index: 0, cause }) => {
                assert!(matches!(*cause, VerbsError::InvalidArgument(_)), "{cause}")
            }
            other => panic!("{w:?}: {other:?}"),
        }
    }
    a.no_wc();
}

/// SEND with invalidate of a key the responder may not invalidate: the
/// receive completes with a remote invalid request error, the sender
/// gets the Invalid Request NAK, and the key keeps working.
#[test]
fn send_with_invalidate_of_an_mr_key_or_another_pds_window_fails() {
    let f = Soft::new();
    // An MR's R_Key.
    let (a, qa, b, qb) = rc_pair(&f);
    recv(&b, qb, 1, 0, 64);
    a.p.post_send(qa, &[send_inv(2, a.sge(0, 8), b.mr.rkey)])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (1, WcStatus::RemInvReqErr));
    assert!(!r.wc_flags.contains(WcFlags::WITH_INV));
    // A type 2 window of another PD on B's CA (bound on a QP of that PD),
    // and a type 1 window of B's own PD (o10-37.2.26: never invalidated).
    let (a, qa, b, qb) = rc_pair(&f);
    let (a2, qa2, b2, qb2) = rc_pair(&f);
    let (_mw, foreign) = bind_type2(&b2, qb2, 0x21, 0, 256, AccessFlags::REMOTE_WRITE);
    recv(&b, qb, 3, 0, 64);
    a.p.post_send(qa, &[send_inv(4, a.sge(0, 8), foreign)])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
    assert_eq!(b.wc().status, WcStatus::RemInvReqErr);
    // The window was not touched: its own QP still writes through it.
    a2.buf.write_at(0, &[9; 8]);
    a2.p.post_send(
        qa2,
        &[rdma(
            5,
            SendOpcode::RdmaWrite,
            a2.sge(0, 8),
            b2.buf.addr(),
            foreign,
        )],
    )
    .unwrap();
    assert_eq!(a2.wc().status, WcStatus::Success);
    assert_eq!(b2.buf.to_vec(0, 8), vec![9; 8]);
    let (a, qa, b, qb) = rc_pair(&f);
    let (_mw, t1) = bind_type1(&b, qb, 0, 256, AccessFlags::REMOTE_WRITE);
    recv(&b, qb, 6, 0, 64);
    a.p.post_send(qa, &[send_inv(7, a.sge(0, 8), t1)]).unwrap();
    assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
    assert_eq!(b.wc().status, WcStatus::RemInvReqErr);
}

/// After unbind (type 1 rebind to length 0), dealloc, or a local
/// invalidate, the old R_Key is refused with a remote access error (the
/// responder NAKs, the requester completes in error) and nothing is
/// written; a type 2 window answers only the QP it was bound on, and
/// only inside its range with its rights.
#[test]
fn window_keys_die_with_unbind_dealloc_and_invalidate() {
    let f = Soft::new();
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let write = |a: &Node, qa, id, b: &Node, off: u64, rkey| {
        a.buf.write_at(0, &[0x42; 16]);
        a.p.post_send(
            qa,
            &[rdma(
                id,
                SendOpcode::RdmaWrite,
                a.sge(0, 16),
                b.buf.addr() + off,
                rkey,
            )],
        )
        .unwrap();
        a.wc().status
    };
    // Type 1: works, then unbind kills the key.
    let (a, qa, b, qb) = rc_pair(&f);
    let (mw, k) = bind_type1(&b, qb, 4096, 256, rw);
    assert_eq!(write(&a, qa, 1, &b, 4096, k), WcStatus::Success);
    assert_eq!(b.buf.to_vec(4096, 16), vec![0x42; 16]);
    let k2 =
        b.p.bind_mw(
            qb,
            &MwBind {
                mw,
                rkey: Rkey(0),
                mr: b.mr.handle,
                addr: b.buf.addr(),
                len: 0,
                access: rw,
            },
        )
        .unwrap();
    assert_ne!(k, k2);
    assert_eq!(write(&a, qa, 2, &b, 4112, k), WcStatus::RemAccessErr);
    assert_eq!(b.buf.to_vec(4112, 16), vec![0; 16]);
    // Type 1: dealloc kills the key; the MR can go once no window is bound.
    let (a, qa, b, qb) = rc_pair(&f);
    let (mw, k) = bind_type1(&b, qb, 4096, 256, rw);
    assert!(matches!(
        b.p.dereg_mr(b.mr.handle),
        Err(VerbsError::Busy(_))
    ));
    b.p.dealloc_mw(mw).unwrap();
    assert!(matches!(b.p.dealloc_mw(mw), Err(VerbsError::InvalidHandle)));
    assert_eq!(write(&a, qa, 3, &b, 4096, k), WcStatus::RemAccessErr);
    assert_eq!(b.buf.to_vec(4096, 16), vec![0; 16]);
    b.p.dereg_mr(b.mr.handle).unwrap();
    // Type 2: bound on qb, so the QP of another pair on the same CAs is
    // refused; READ inside the range works, past its end does not.
    let (a, qa, b, qb) = rc_pair(&f);
    let (_mw, k) = bind_type2(&b, qb, 0x99, 8192, 128, AccessFlags::REMOTE_READ);
    b.buf.write_at(8192, &[0x17; 128]);
    a.p.post_send(
        qa,
        &[rdma(
            4,
            SendOpcode::RdmaRead,
            a.sge(0, 128),
            b.buf.addr() + 8192,
            k,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(a.buf.to_vec(0, 128), vec![0x17; 128]);
    assert_eq!(
        write(&a, qa, 5, &b, 8192, k),
        WcStatus::RemAccessErr,
        "no write right"
    );
    let a3 = Node::open(&f, Guid(0x1111), 16);
    let q3 = a3.qp(QpType::Rc, None, 30);
    let qb3 = b.qp(QpType::Rc, None, 31);
    connect(&a3, q3, &b, qb3, QpType::Rc, 0);
    a3.p.post_send(
        q3,
        &[rdma(
            6,
            SendOpcode::RdmaRead,
            a3.sge(0, 8),
            b.buf.addr() + 8192,
            k,
        )],
    )
    .unwrap();
    assert_eq!(
        a3.wc().status,
        WcStatus::RemAccessErr,
        "window of another QP"
    );
    let (a, qa, b, qb) = rc_pair(&f);
    let (_mw, k) = bind_type2(&b, qb, 0x98, 8192, 128, AccessFlags::REMOTE_READ);
    a.p.post_send(
        qa,
        &[rdma(
            7,
            SendOpcode::RdmaRead,
            a.sge(0, 8),
            b.buf.addr() + 8192 + 124,
            k,
        )],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemAccessErr, "past the window");
    // Type 2: local invalidate kills the key.
    let (a, qa, b, qb) = rc_pair(&f);
    let (_mw, k) = bind_type2(&b, qb, 0x55, 0, 256, rw);
    assert_eq!(write(&a, qa, 8, &b, 0, k), WcStatus::Success);
    let mut li = SendWr::new(9, SendOpcode::LocalInv, vec![]);
    li.invalidate_rkey = k;
    b.p.post_send(qb, &[li]).unwrap();
    let w = b.wc();
    assert_eq!(
        (w.opcode, w.status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    b.buf.write_at(0, &[0; 16]);
    assert_eq!(write(&a, qa, 10, &b, 0, k), WcStatus::RemAccessErr);
    assert_eq!(b.buf.to_vec(0, 16), vec![0; 16]);
}

/// Bind WRs that must fail complete with a bind error in their turn: a
/// type 1 window, a window of another PD, an MR without the bind right,
/// a range past the MR; a local invalidate of an MR's key too.
#[test]
fn bad_binds_and_local_invalidates_complete_with_bind_errors() {
    let f = Soft::new();
    let rw = AccessFlags::REMOTE_WRITE;
    let (_a, _qa, b, qb) = rc_pair(&f);
    let (t1, k1) = b.p.alloc_mw(b.pd, MwType::Type1, 1).unwrap();
    let other = Node::open(&f, Guid(0x2222), 16);
    let (foreign, kf) = other.p.alloc_mw(other.pd, MwType::Type2, 2).unwrap();
    let plain_buf = MemBuf::new(4096);
    let plain =
        b.p.reg_mr(
            b.pd,
            &plain_buf,
            plain_buf.addr(),
            4096,
            AccessFlags::LOCAL_WRITE,
            3,
        )
        .unwrap();
    let (mw, k0) = b.p.alloc_mw(b.pd, MwType::Type2, 4).unwrap();
    let mut no_bind_right = bind_wr(&b, 3, (mw, k0), 1, 0, 64, rw);
    if let Some(x) = no_bind_right.bind_mw.as_mut() {
        x.mr = plain.handle;
        x.addr = plain_buf.addr();
    }
    let cases = [
        bind_wr(&b, 1, (t1, k1), 1, 0, 64, rw),
        bind_wr(&b, 2, (foreign, kf), 1, 0, 64, rw),
        no_bind_right,
        bind_wr(&b, 4, (mw, k0), 1, 65536 - 32, 64, rw),
    ];
    // A failed bind takes its QP to error: a fresh QP of B's PD per case.
    let peer = Node::open(&f, Guid(0x1111), 16);
    for w in cases {
        let q = b.qp(QpType::Rc, None, 50);
        let qpeer = peer.qp(QpType::Rc, None, 51);
        connect(&b, q, &peer, qpeer, QpType::Rc, 0);
        b.p.post_send(q, std::slice::from_ref(&w)).unwrap();
        let c = b.wc();
        assert_eq!(
            (c.wr_id, c.opcode, c.status),
            (w.wr_id, WcOpcode::BindMw, WcStatus::MwBindErr),
            "{w:?}"
        );
    }
    let mut li = SendWr::new(5, SendOpcode::LocalInv, vec![]);
    li.invalidate_rkey = b.mr.rkey;
    b.p.post_send(qb, &[li]).unwrap();
    let c = b.wc();
    assert_eq!(
        (c.opcode, c.status),
        (WcOpcode::LocalInv, WcStatus::MwBindErr)
    );
}

/// The wire: a SEND with invalidate goes out as RC SEND Only with
/// Invalidate (0x17) carrying the window's R_Key in its IETH; a WRITE
/// with the invalidated key draws a Remote Access Error NAK, a SEND with
/// invalidate of an MR's key an Invalid Request NAK; our parser (with the
/// ICRC) and tshark read the capture alike, nothing malformed.
#[test]
fn send_with_invalidate_on_the_wire() {
    let f = Soft::new();
    let dir = std::env::temp_dir().join(format!("softroce-mw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("a.pcap");
    f.provider
        .set_capture(Guid(0x1111), Some(cap.clone()))
        .unwrap();
    let (a, qa, b, qb) = rc_pair(&f);
    let (_mw, k) = bind_type2(&b, qb, 0x3c, 0, 256, AccessFlags::REMOTE_WRITE);
    recv(&b, qb, 1, 1024, 64);
    a.p.post_send(qa, &[send_inv(2, a.sge(0, 8), k)]).unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r.invalidated_rkey, k);
    // The invalidated key: a Remote Access Error NAK.
    a.p.post_send(
        qa,
        &[rdma(3, SendOpcode::RdmaWrite, a.sge(0, 8), b.buf.addr(), k)],
    )
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemAccessErr);
    // An MR's key in the IETH, on a fresh pair: an Invalid Request NAK.
    let (a, qa, b, qb) = rc_pair(&f);
    recv(&b, qb, 3, 1024, 64);
    a.p.post_send(qa, &[send_inv(4, a.sge(0, 8), b.mr.rkey)])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::RemInvReqErr);
    let mr_key = b.mr.rkey;
    drop((a, b));
    let bytes = std::fs::read(&cap).unwrap();
    let (_, records) = rdma_wire::pcap::read(&bytes).unwrap();
    let mut rows = Vec::new();
    for rec in &records {
        let p = rdma_wire::RoceRepr::parse(rec.data).expect("parses with a good ICRC");
        rows.push((
            p.ib.bth.opcode.code(),
            p.ib.ext.ieth.map(|i| i.rkey),
            p.ib.ext.aeth.map(|x| x.syndrome),
        ));
    }
    let invs: Vec<Rkey> = rows
        .iter()
        .filter(|r| r.0 == 0x17)
        .filter_map(|r| r.1)
        .collect();
    assert_eq!(invs, vec![k, mr_key], "two SEND Only with Invalidate");
    let naks: Vec<Syndrome> = rows
        .iter()
        .filter_map(|r| r.2)
        .filter(|s| matches!(s, Syndrome::Nak(_)))
        .collect();
    assert_eq!(
        naks,
        vec![
            Syndrome::Nak(NakCode::RemoteAccessError),
            Syndrome::Nak(NakCode::InvalidRequest)
        ],
        "{rows:?}"
    );
    if let Some(t) = rdma_testkit::tshark_fields_without(
        "send_with_invalidate_on_the_wire",
        &cap,
        &[PORT],
        &[
            "infiniband.bth.opcode",
            "infiniband.ieth",
            "infiniband.aeth.syndrome",
        ],
        &["rpcordma"],
    ) {
        let ops: Vec<String> = t.iter().map(|r| r[0].clone()).collect();
        let ours: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
        assert_eq!(ops, ours, "tshark decodes every opcode as we do");
        let ieth: Vec<String> = t
            .iter()
            .filter(|r| r[0] == "23")
            .map(|r| r[1].clone())
            .collect();
        // tshark repeats the IETH field ("0000013c,0000013c").
        let want = [format!("{:08x}", k.0), format!("{:08x}", mr_key.0)];
        assert_eq!(ieth.len(), 2);
        for (got, want) in ieth.iter().zip(want) {
            assert_eq!(
                got.split(',').next(),
                Some(want.as_str()),
                "tshark's IETH R_Key"
            );
        }
        let naks: Vec<&str> = t
            .iter()
            .map(|r| r[2].as_str())
            .filter(|s| *s == "97" || *s == "98")
            .collect();
        assert_eq!(naks, ["98", "97"], "tshark's NAK syndromes (0x62, 0x61)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SEND with invalidate exists for RC only: on UC the post is refused
/// (the engine would have had no opcode for it).
#[test]
fn uc_refuses_send_with_invalidate() {
    let f = Soft::new();
    let a = Node::open(&f, Guid(0x1111), 16);
    let b = Node::open(&f, Guid(0x2222), 16);
    let (qa, qb) = (a.qp(QpType::Uc, None, 1), b.qp(QpType::Uc, None, 2));
    connect(&a, qa, &b, qb, QpType::Uc, 0);
    match a.p.post_send(qa, &[send_inv(1, a.sge(0, 8), b.mr.rkey)]) {
        Err(VerbsError::BadWr { index: 0, cause }) => {
            assert!(matches!(*cause, VerbsError::InvalidArgument(_)), "{cause}")
        }
        other => panic!("{other:?}"),
    }
    // The QP still sends.
    recv(&b, qb, 2, 0, 64);
    a.p.post_send(qa, &[SendWr::new(3, SendOpcode::Send, vec![a.sge(0, 8)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().status, WcStatus::Success);
}
