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
    const LEN: u32 = 1000;
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: i,
            sges: vec![b.sge(i * LEN as u64, LEN)],
        })
        .collect();
    b.p.post_recv(qb, &recvs).unwrap();
    for i in 0..N {
        let at = (i * LEN as u64) as usize;
        a.buf.write_at(at, &vec![i as u8 ^ 0x5a; LEN as usize]);
        let mut w = SendWr::new(i, SendOpcode::Send, vec![a.sge(at as u64, LEN)]);
        w.flags = verbs::SendFlags::SIGNALED;
        a.p.post_send(qa, &[w]).unwrap();
    }
    for i in 0..N {
        let wc = b.wc();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, LEN)
        );
        let got = b.buf.to_vec((i * LEN as u64) as usize, LEN as usize);
        assert!(got.iter().all(|&x| x == i as u8 ^ 0x5a), "message {i}");
    }
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
