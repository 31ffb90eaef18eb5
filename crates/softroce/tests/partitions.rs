//! The port's P_Key table on the receive path (IBA 10.9.3), two nodes on
//! 127.0.61.x: node B holds the default partition as a limited member and
//! 0x0010 as a full one. A's GSI datagrams in the limited default
//! partition are dropped and counted (two limited members), in 0x0010 and
//! as a full default member they arrive and their receives say the P_Key;
//! a handle made for a partition sends in it; SMPs to QP0 pass whatever
//! they carry; an RC QP takes only its own partition.

use rdma_types::{Instant, Lkey, Pkey, Qkey, QpType, Qpn, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge, UdDest};
use softroce::{FlatMemory, Node, NodeConfig, QpHandle};
use std::time::{Duration, Instant as StdInstant};

const KEY: u32 = 3;

fn special(node: &mut Node, qpn: Qpn, mem: &FlatMemory) -> QpHandle {
    let mut cfg = QpConfig::rc(qpn, Qpn::from_bits(0));
    cfg.qp_type = if qpn == Qpn::SMI {
        QpType::Smi
    } else {
        QpType::Gsi
    };
    cfg.qkey = Qkey::GSI;
    let qp = node.create_special_qp(cfg, Box::new(mem.clone())).unwrap();
    node.qp_mut(qp).unwrap().set_rts();
    for i in 0..8 {
        node.qp_mut(qp).unwrap().post_recv(RecvWqe {
            wr_id: i,
            sges: vec![Sge {
                addr: i * 512,
                len: 512,
                lkey: Lkey(KEY),
            }],
        });
    }
    qp
}

/// Polls both nodes until `done(b)` holds, at most 2 s; drains A's GSI
/// send completions on the way.
fn pump(a: &mut Node, b: &mut Node, mut done: impl FnMut(&mut Node) -> bool) -> bool {
    let epoch = StdInstant::now();
    while epoch.elapsed() < Duration::from_secs(2) {
        let now = Instant::from_std(epoch, StdInstant::now());
        a.poll(now);
        b.poll(now);
        while a.poll_completion(QpHandle(Qpn::GSI)).is_some() {}
        if done(b) {
            return true;
        }
        let _ = b.wait(Duration::from_millis(5));
    }
    false
}

/// The next receive completed on `qp` of `b`, with its packet's P_Key.
fn receive(a: &mut Node, b: &mut Node, qp: QpHandle) -> Option<(u64, Option<Pkey>)> {
    let mut got = None;
    pump(a, b, |b| {
        got = b.poll_completion_with_pkey(qp);
        got.is_some()
    });
    got.map(|(c, pkey)| {
        assert!(c.is_recv && c.status == WcStatus::Success, "{c:?}");
        (c.wr_id, pkey)
    })
}

/// Waits for `b` to count a P_Key violation more than `seen`.
fn refused(a: &mut Node, b: &mut Node, seen: u64) -> bool {
    pump(a, b, |b| b.stats().rx_pkey_violations > seen)
}

fn send(a: &mut Node, ah: softroce::AhId, dest: Qpn, qkey: Qkey, from: QpHandle) {
    let mut w = SendWqe::new(
        1,
        SendOp::Send,
        vec![Sge {
            addr: 0,
            len: 256,
            lkey: Lkey(KEY),
        }],
    );
    w.ud = Some(UdDest {
        qpn: dest,
        qkey,
        ah: ah.0,
    });
    a.qp_mut(from).unwrap().post_send(w);
}

#[test]
fn the_table_decides_what_each_qp_receives() {
    let mut a = Node::bind(NodeConfig::new("127.0.61.1:0".parse().unwrap())).unwrap();
    let mut b = Node::bind(NodeConfig::new("127.0.61.2:0".parse().unwrap())).unwrap();
    let (ma, mb) = (FlatMemory::new(KEY, 1 << 16), FlatMemory::new(KEY, 1 << 16));
    assert_eq!(b.pkeys(), &[Pkey::DEFAULT], "the default P_Key alone");
    b.set_pkeys(&[Pkey(0x7fff), Pkey(0), Pkey(0x8010)]);
    assert_eq!(b.pkeys(), &[Pkey(0x7fff), Pkey(0x8010)], "empty slots out");
    a.set_pkeys(&[Pkey(0x7fff), Pkey(0x8010)]);
    let gsi_a = special(&mut a, Qpn::GSI, &ma);
    a.qp_mut(gsi_a)
        .unwrap()
        .update_config(|c| c.pkey = Pkey(0x7fff));
    let gsi_b = special(&mut b, Qpn::GSI, &mb);
    let smi_b = special(&mut b, Qpn::SMI, &mb);
    let to_b = a.create_ah(b.local_addr());

    // A limited member to a limited member: dropped and counted.
    send(&mut a, to_b, Qpn::GSI, Qkey::GSI, gsi_a);
    assert!(refused(&mut a, &mut b, 0));
    assert!(b.poll_completion(gsi_b).is_none());
    assert_eq!(b.stats().rx_pkey_violations, 1);
    let (n, v) = b.take_pkey_violations().unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        (v.pkey, v.src_qp, v.dest_qp),
        (Pkey(0x7fff), Some(Qpn::GSI), Qpn::GSI)
    );
    assert_eq!(v.src_gid.to_ip(), a.local_addr().ip());
    assert_eq!(v.dst_gid.to_ip(), b.local_addr().ip());

    // In 0x0010, through a handle made for it: delivered, with its key.
    let in_0010 = a.ah_in_partition(to_b, Pkey(0x8010)).unwrap();
    assert_eq!(a.ah_in_partition(to_b, Pkey(0x8010)), Some(in_0010), "kept");
    send(&mut a, in_0010, Qpn::GSI, Qkey::GSI, gsi_a);
    assert_eq!(
        receive(&mut a, &mut b, gsi_b),
        Some((0, Some(Pkey(0x8010))))
    );
    // A full member of the default partition reaches a limited one.
    let full = a.ah_in_partition(to_b, Pkey::DEFAULT).unwrap();
    send(&mut a, full, Qpn::GSI, Qkey::GSI, gsi_a);
    assert_eq!(
        receive(&mut a, &mut b, gsi_b),
        Some((1, Some(Pkey::DEFAULT)))
    );
    // SMPs are not partitioned.
    let odd = a.ah_in_partition(to_b, Pkey(0x1234)).unwrap();
    send(&mut a, odd, Qpn::SMI, Qkey(0), gsi_a);
    assert_eq!(
        receive(&mut a, &mut b, smi_b),
        Some((0, Some(Pkey(0x1234))))
    );

    // An RC QP of 0x0010 takes its partition only, even one the table
    // holds: 0xffff matches the table's 0x7fff, not the QP's key.
    let mut cfg = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
    cfg.pkey = Pkey(0x8010);
    let (qa, qb) = (
        a.create_qp(cfg.clone(), Box::new(ma.clone())),
        b.create_qp(cfg, Box::new(mb.clone())),
    );
    Node::connect_pair(&mut a, qa, &mut b, qb);
    b.qp_mut(qb).unwrap().post_recv(RecvWqe {
        wr_id: 5,
        sges: vec![Sge {
            addr: 0x8000,
            len: 64,
            lkey: Lkey(KEY),
        }],
    });
    let msg = |a: &mut Node| {
        a.qp_mut(qa).unwrap().post_send(SendWqe::new(
            9,
            SendOp::Send,
            vec![Sge {
                addr: 0,
                len: 8,
                lkey: Lkey(KEY),
            }],
        ))
    };
    a.qp_mut(qa)
        .unwrap()
        .update_config(|c| c.pkey = Pkey::DEFAULT);
    msg(&mut a);
    assert!(refused(&mut a, &mut b, 1));
    assert!(b.poll_completion(qb).is_none());
    let (_, v) = b.take_pkey_violations().unwrap();
    assert_eq!(
        (v.pkey, v.dest_qp, v.src_qp),
        (Pkey::DEFAULT, qb.0, Some(qa.0))
    );
    assert_eq!(b.qp_mut(qb).unwrap().counters().pkey_violations, 0);
    // Back in its partition, the resent SEND lands.
    a.qp_mut(qa)
        .unwrap()
        .update_config(|c| c.pkey = Pkey(0x8010));
    assert_eq!(receive(&mut a, &mut b, qb), Some((5, None)));
    assert!(b.stats().rx_pkey_violations >= 2);
}
