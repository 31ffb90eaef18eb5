//! The provider end to end on two CAs over loopback addresses.

use super::*;
use verbs::conformance::{connect, Feature, Fixture, Node as TNode};

struct Two(Arc<SoftRoce>);

impl Fixture for Two {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0xa1), Guid(0xb2))
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

/// `n` signalled SENDs of `len` bytes from `from`'s QP `qf` to `to`'s
/// `qt` (each filled with its number xor `mark`): every one lands in
/// order, intact, in the receive posted for it.
fn sends_arrive_in_order(
    from: &TNode,
    qf: QpHandle,
    to: &TNode,
    qt: QpHandle,
    n: u64,
    len: u32,
    mark: u8,
) {
    let recvs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i,
            sges: verbs::sges![to.sge(i * u64::from(len), len)],
        })
        .collect();
    to.p.post_recv(qt, &recvs).unwrap();
    for i in 0..n {
        let at = (i * u64::from(len)) as usize;
        from.buf.write_at(at, &vec![i as u8 ^ mark; len as usize]);
        let mut w = SendWr::new(i, SendOpcode::Send, vec![from.sge(at as u64, len)]);
        w.flags = verbs::SendFlags::SIGNALED;
        from.p.post_send(qf, &[w]).unwrap();
    }
    for i in 0..n {
        let wc = to.wc();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, len)
        );
        let got = to.buf.to_vec((i * u64::from(len)) as usize, len as usize);
        assert!(got.iter().all(|&x| x == i as u8 ^ mark), "message {i}");
    }
}

/// A lossy sender still delivers every SEND in order, by retransmitting;
/// the counters show it. Faults are refused once the CA is open.
#[test]
fn seeded_loss_is_recovered_and_counted() {
    let ca = |g: u64, last: u8| SoftCa {
        guid: Guid(g),
        ip: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 91, last)),
    };
    let p = SoftRoce::new(vec![ca(0xa1, 201), ca(0xb2, 202)], ROCE_PORT);
    assert!(matches!(
        p.set_faults(Guid(0x99), None),
        Err(VerbsError::NoSuchCa)
    ));
    p.set_faults(Guid(0xa1), Some(FaultConfig::lossy(7, 0.2)))
        .unwrap();
    assert_eq!(p.counters(Guid(0xa1)), None, "not open yet");
    let f = Two(p.clone());
    let (a, b) = (
        TNode::open(&f, Guid(0xa1), 512),
        TNode::open(&f, Guid(0xb2), 512),
    );
    assert!(matches!(
        p.set_faults(Guid(0xa1), None),
        Err(VerbsError::Busy(_))
    ));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    const N: u64 = 60;
    sends_arrive_in_order(&a, qa, &b, qb, N, 1000, 0x5a);
    for i in 0..N {
        let wc = a.wc();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    let c = p.counters(Guid(0xa1)).unwrap();
    assert!(c.retransmits > 0, "{c:?}");
    assert!(c.tx_packets > N, "{c:?}");
    let r = p.counters(Guid(0xb2)).unwrap();
    assert!(
        r.out_of_sequence + r.duplicates > 0 || c.timeouts > 0,
        "{r:?} {c:?}"
    );
    // The totals outlive the QP that counted them.
    a.p.destroy_qp(qa).unwrap();
    let after = p.counters(Guid(0xa1)).unwrap();
    assert_eq!(after.retransmits, c.retransmits, "{after:?}");
    assert!(after.tx_packets >= c.tx_packets, "{after:?}");
}

/// Sends one 32 KiB message from CA 0xa1 to CA 0xb2 of `p` (4096-byte
/// packets: a run GSO may send at once); the sender's GSO sends and the
/// CAs' counters after it.
fn one_big_send(p: &Arc<SoftRoce>) -> (u64, SoftCaCounters) {
    const LEN: u32 = 32 << 10;
    let f = Two(p.clone());
    let (a, b) = (
        TNode::open(&f, Guid(0xa1), 64),
        TNode::open(&f, Guid(0xb2), 64),
    );
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 1,
            sges: verbs::sges![b.sge(0, LEN)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, &vec![0x5a; LEN as usize]);
    let mut w = SendWr::new(1, SendOpcode::Send, vec![a.sge(0, LEN)]);
    w.flags = verbs::SendFlags::SIGNALED;
    a.p.post_send(qa, &[w]).unwrap();
    let wc = b.wc();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, LEN));
    assert_eq!(a.wc().status, WcStatus::Success);
    assert!(b.buf.to_vec(0, LEN as usize).iter().all(|&x| x == 0x5a));
    let gso = p
        .device(Guid(0xa1))
        .unwrap()
        .inspect(|n| n.stats().tx_gso_sends);
    (gso, p.counters(Guid(0xa1)).unwrap())
}

/// The provider's options take effect as given, with no environment
/// variable involved: GSO off sends every packet on its own; faults of
/// the options reach a CA without its own.
#[test]
fn options_turn_gso_off_and_inject_faults_without_the_environment() {
    let ca = |g: u64, last: u8| SoftCa {
        guid: Guid(g),
        ip: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 91, last)),
    };
    // Each provider on addresses of its own: a dropped one's nodes let go
    // of their sockets a little later.
    let with = |o: NicOptions, last: u8| {
        SoftRoce::with_options(
            vec![ca(0xa1, last), ca(0xb2, last + 1)],
            ROCE_PORT,
            Mtu::Mtu4096,
            o,
        )
    };
    let off = NicOptions {
        gso: false,
        ..NicOptions::default()
    };
    let p = with(off.clone(), 211);
    assert_eq!(p.options(), &off);
    let (gso, _) = one_big_send(&p);
    assert_eq!(gso, 0, "GSO is off");
    // The same send with the defaults is segmented, where the kernel can.
    let (gso, _) = one_big_send(&with(NicOptions::default(), 213));
    if gso == 0 {
        rdma_testkit::need::part("the send with GSO on")
            .skip("UDP GSO: no send was segmented", "Linux 4.18 or later");
    }
    let lossy = NicOptions {
        faults: Some(FaultConfig::lossy(7, 0.2)),
        ..NicOptions::default()
    };
    let (_, c) = one_big_send(&with(lossy, 215));
    assert!(c.retransmits > 0, "{c:?}");
}

/// A CA on a lent member of a shared port (as the NIC daemon lends one to
/// a client): RC traffic with a peer flows through the member, its QP
/// numbers are the member's block, QP1 is refused, and the port's owner
/// (a provider on member 0 of the same address) sees none of it.
#[test]
fn a_ca_on_a_shared_port_runs_rc_in_its_block_and_leaves_qp1_to_the_owner() {
    let ip = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 91, 210));
    let mut group = roce_udp::PortGroup::bind(SocketAddr::new(ip, 0)).unwrap();
    let port = group.local_addr().port();
    let one = |g: u64, ip| SoftRoce::new(vec![SoftCa { guid: Guid(g), ip }], port);
    let owner = one(0xa1, ip);
    owner
        .share_port(
            Guid(0xa1),
            Some(SharedPort {
                socket: Arc::new(group.owner().unwrap()),
                qpns: roce_udp::block_qpns(0),
            }),
        )
        .unwrap();
    let client = one(0xa1, ip);
    let (block, fd) = group.lend().unwrap();
    client
        .share_port(
            Guid(0xa1),
            Some(SharedPort {
                socket: Arc::new(fd),
                qpns: roce_udp::block_qpns(block),
            }),
        )
        .unwrap();
    let peer = one(0xb2, IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 91, 211)));
    let o = TNode::open(&Two(owner.clone()), Guid(0xa1), 4096);
    let (a, b) = (
        TNode::open(&Two(client.clone()), Guid(0xa1), 1 << 16),
        TNode::open(&Two(peer.clone()), Guid(0xb2), 1 << 16),
    );
    assert!(matches!(
        client.share_port(Guid(0xa1), None),
        Err(VerbsError::Busy(_))
    ));
    let gsi = a.p.create_qp(
        a.pd,
        &QpInit {
            qp_type: QpType::Gsi,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            caps: verbs::QpCaps::default(),
            sq_sig_all: false,
            port: Some(PortNum(1)),
        },
        9,
    );
    assert!(
        matches!(gsi, Err(VerbsError::NotSupported(m)) if m.contains("owner")),
        "{gsi:?}"
    );
    // The owner keeps QP1.
    o.qp(QpType::Gsi, None, 9);
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    assert_eq!(roce_udp::qpn_block(a.p.qp_num(qa).unwrap().value()), block);
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    const N: u64 = 16;
    sends_arrive_in_order(&b, qb, &a, qa, N, 3000, 0x3c);
    let seen = owner.counters(Guid(0xa1)).unwrap();
    assert_eq!(seen.rx_datagrams, 0, "{seen:?}");
    assert!(client.counters(Guid(0xa1)).unwrap().rx_datagrams >= N);
}
