//! A hostile peer aims well-formed (valid ICRC) but wrong packets at one QP
//! of a node: wrong P_Key, wrong Q_Key, WRITE to an invalid R_Key, and
//! truncated junk. The spec's answers (silent drops, a remote access NAK)
//! happen, the port counts the P_Key violation and keeps its details, and
//! the node keeps serving its other QPs.

use rdma_types::{Instant, Lkey, Pkey, Psn, Qkey, QpType, Qpn, Rkey, WcStatus};
use rdma_wire::{
    BthRepr, DethRepr, ExtHeaders, IbRepr, IpRepr, Opcode, RethRepr, RoceRepr, Syndrome,
    UdpChecksum, UdpRepr,
};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use softroce::{FlatMemory, Node, NodeConfig};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant as StdInstant};

fn bth(opcode: Opcode, pkey: Pkey, qp: Qpn, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: 0,
        pkey,
        fecn: false,
        becn: false,
        dest_qp: qp,
        ack_req: true,
        psn: Psn::new(psn),
    }
}

/// Sends a correctly framed RoCEv2 datagram (good ICRC) from `sock`.
fn send(sock: &UdpSocket, dst: SocketAddr, ib: IbRepr<'_>) {
    let src = sock.local_addr().unwrap();
    let roce = RoceRepr {
        ip: IpRepr::rocev2(src.ip(), dst.ip(), 0).unwrap(),
        udp: UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            checksum: UdpChecksum::None,
        },
        ib,
    };
    let mut buf = vec![0u8; roce.udp_payload_len()];
    let n = roce.emit_udp_payload(&mut buf).unwrap();
    sock.send_to(&buf[..n], dst).unwrap();
}

fn rc_cfg() -> QpConfig {
    let mut c = QpConfig::rc(Qpn::from_bits(0), Qpn::from_bits(0));
    c.timeout = 8;
    c
}

#[test]
fn other_qps_keep_working_while_one_is_attacked() {
    let mut a = Node::bind(NodeConfig::new("127.0.60.1:0".parse().unwrap())).unwrap();
    let mut b = Node::bind(NodeConfig::new("127.0.60.2:0".parse().unwrap())).unwrap();
    let (ma, mb) = (FlatMemory::new(1, 1 << 20), FlatMemory::new(1, 1 << 20));
    ma.with(|m| m.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8));
    // The victim: an RC QP on B whose peer is the attacker's socket, and a
    // UD QP on B with Q_Key 0x1234.
    let attacker = UdpSocket::bind("127.0.60.3:0").unwrap();
    let victim = b.create_qp(rc_cfg(), Box::new(mb.clone()));
    b.qp_mut(victim)
        .unwrap()
        .update_config(|c| c.dest_qpn = Qpn::from_bits(0x99));
    b.set_remote(victim, attacker.local_addr().unwrap());
    b.qp_mut(victim).unwrap().set_rts();
    let mut ud_cfg = rc_cfg();
    ud_cfg.qp_type = QpType::Ud;
    ud_cfg.qkey = Qkey(0x1234);
    let ud = b.create_qp(ud_cfg, Box::new(mb.clone()));
    b.qp_mut(ud).unwrap().set_rts();
    b.qp_mut(ud).unwrap().post_recv(RecvWqe {
        wr_id: 7,
        sges: vec![Sge {
            addr: 0,
            len: 4096,
            lkey: Lkey(1),
        }],
    });
    // The innocent pair: A's QP <-> B's QP, doing WRITEs.
    let qa = a.create_qp(rc_cfg(), Box::new(ma.clone()));
    let qb = b.create_qp(rc_cfg(), Box::new(mb.clone()));
    Node::connect_pair(&mut a, qa, &mut b, qb);

    let dst = b.local_addr();
    let epoch = StdInstant::now();
    let now = || Instant::from_std(epoch, StdInstant::now());
    let pump = |a: &mut Node, b: &mut Node| {
        let t = now();
        a.poll(t);
        b.poll(t);
    };

    // 1. Wrong P_Key on the victim RC QP: dropped silently.
    let payload = [0xAAu8; 16];
    send(
        &attacker,
        dst,
        IbRepr::new(
            bth(Opcode::RcSendOnly, Pkey(0x8001), victim.0, 0),
            ExtHeaders::default(),
            &payload,
        ),
    );
    // 2. Wrong Q_Key on the UD QP: dropped silently; then a right one lands.
    let deth = |q: u32| ExtHeaders {
        deth: Some(DethRepr {
            qkey: Qkey(q),
            src_qp: Qpn::from_bits(0x99),
        }),
        ..Default::default()
    };
    send(
        &attacker,
        dst,
        IbRepr::new(
            bth(Opcode::UdSendOnly, Pkey::DEFAULT, ud.0, 0),
            deth(0x9999),
            &payload,
        ),
    );
    send(
        &attacker,
        dst,
        IbRepr::new(
            bth(Opcode::UdSendOnly, Pkey::DEFAULT, ud.0, 1),
            deth(0x1234),
            &payload,
        ),
    );
    // 3. Junk: empty, truncated, random.
    for junk in [&[][..], &[0x0a, 0x00][..], &[0x5a; 40][..]] {
        attacker.send_to(junk, dst).unwrap();
    }
    // 4. RDMA WRITE to an R_Key the victim's memory does not have.
    let reth = ExtHeaders {
        reth: Some(RethRepr {
            va: 0,
            rkey: Rkey(0xdead),
            dma_len: 16,
        }),
        ..Default::default()
    };
    send(
        &attacker,
        dst,
        IbRepr::new(
            bth(Opcode::RcWriteOnly, Pkey::DEFAULT, victim.0, 0),
            reth,
            &payload,
        ),
    );

    // Meanwhile the innocent pair moves 64 WRITEs of 4 KiB.
    for i in 0..64u64 {
        let w = SendWqe::new(
            i,
            SendOp::Write {
                raddr: i * 4096,
                rkey: Rkey(1),
            },
            vec![Sge {
                addr: i * 4096,
                len: 4096,
                lkey: Lkey(1),
            }],
        );
        a.qp_mut(qa).unwrap().post_send(w);
    }
    let mut done = Vec::new();
    let deadline = StdInstant::now() + Duration::from_secs(20);
    let mut ud_wc = None;
    while (done.len() < 64 || ud_wc.is_none()) && StdInstant::now() < deadline {
        pump(&mut a, &mut b);
        while let Some(c) = a.poll_completion(qa) {
            done.push(c);
        }
        if let Some(c) = b.poll_completion(ud) {
            ud_wc = Some(c);
        }
    }
    assert_eq!(done.len(), 64, "the innocent pair completed everything");
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        mb.with(|m| m[..64 * 4096].to_vec()),
        ma.with(|m| m[..64 * 4096].to_vec())
    );
    let ud_wc = ud_wc.expect("the right Q_Key was delivered");
    assert_eq!(
        (ud_wc.wr_id, ud_wc.byte_len, ud_wc.src_qp),
        (7, 40 + 16, Some(Qpn::from_bits(0x99)))
    );

    // The attacker got a remote-access NAK for the bad WRITE, and nothing else
    // (no answer to the wrong P_Key or to junk).
    attacker
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 2048];
    let n = attacker.recv(&mut buf).expect("a NAK came back");
    let ib = IbRepr::parse(&buf[..n]).unwrap();
    assert_eq!(ib.bth.opcode, Opcode::RcAcknowledge);
    assert!(
        matches!(
            ib.ext.aeth.unwrap().syndrome,
            Syndrome::Nak(rdma_wire::NakCode::RemoteAccessError)
        ),
        "{:?}",
        ib.ext.aeth
    );
    assert!(attacker.recv(&mut buf).is_err(), "no further answers");
    let vq = b.qp_mut(victim).unwrap();
    assert!(vq.is_error(), "the victim QP went to error (IBA class C)");
    // The port refused the wrong P_Key before the QP saw it, and kept
    // what a trap 257 reports.
    assert_eq!(vq.counters().pkey_violations, 0);
    assert_eq!(b.stats().rx_pkey_violations, 1);
    let (n, v) = b.take_pkey_violations().expect("a violation kept");
    assert_eq!(n, 1);
    assert_eq!(
        (v.pkey, v.src_qp, v.dest_qp),
        (Pkey(0x8001), Some(Qpn::from_bits(0x99)), victim.0)
    );
    assert_eq!(v.src_gid.to_ip(), attacker.local_addr().unwrap().ip());
    assert!(b.take_pkey_violations().is_none(), "taken once");
    assert_eq!(b.qp_mut(ud).unwrap().counters().qkey_violations, 1);
    let s = b.stats();
    assert!(s.rx_malformed >= 3, "junk counted: {s:?}");
    assert_eq!(s.rx_bad_icrc, 0, "the attacker's ICRCs were valid");
}
