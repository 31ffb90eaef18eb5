//! The conformance suite's `pkey_change` case on soft RoCE `ib` ports,
//! whose P_Key table an SM sets (a `roce` port's table is fixed, so
//! `conformance_softroce` skips the case), and P_Keys on QP1. Addresses
//! 127.0.157.1-4.

use rdma_types::{Guid, Lid, Pkey, PortNum};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use verbs::conformance::{cases, Feature, Fixture, Outcome};
use verbs::{IgnoreEvents, Provider, Result};

struct Ib(Arc<SoftRoce>);

impl Fixture for Ib {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(0x1111), Guid(0x2222))
    }
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.0.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.0.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.0.remove_ca(guid)
    }
    fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.0.set_pkeys(guid, pkeys)
    }
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Sqe]
    }
}

#[test]
fn pkey_change_on_ib_ports() {
    let ip = |k| IpAddr::V4(Ipv4Addr::new(127, 0, 157, k));
    let p = SoftRoce::new(
        vec![
            SoftCa {
                guid: Guid(0x1111),
                ip: ip(1),
            },
            SoftCa {
                guid: Guid(0x2222),
                ip: ip(2),
            },
        ],
        ROCE_PORT,
    );
    for g in [Guid(0x1111), Guid(0x2222)] {
        p.set_personality(g, Personality::Ib).unwrap();
    }
    let f = Ib(p.clone());
    assert_eq!(cases::pkey_change(&f), Outcome::Passed);
    // The case ran for real: the table it set is what the port reports.
    let ca = p.open_ca(Guid(0x2222), 0, Arc::new(IgnoreEvents)).unwrap();
    let pkeys = p.query_port(ca, PortNum(1)).unwrap().pkeys;
    assert!(pkeys.contains(&Pkey(0x8010)), "{pkeys:?}");
}

/// A GSI QP (QP1) of an `ib` port through the verbs, with a registered
/// ring: receives of 40 + 256 bytes at `RECV`, sends from 0.
struct Gsi {
    p: Arc<SoftRoce>,
    pd: verbs::PdHandle,
    cq: verbs::CqHandle,
    qp: verbs::QpHandle,
    mr: verbs::MrInfo,
    buf: verbs::MemBuf,
}

const RECV: u64 = 4096;

impl Gsi {
    fn new(p: &Arc<SoftRoce>, guid: Guid) -> Gsi {
        use rdma_types::{AccessFlags, Qkey, QpState, QpType};
        use verbs::{CqInit, QpAttr, QpInit};
        let ca = p.open_ca(guid, 0, Arc::new(IgnoreEvents)).unwrap();
        let pd = p.alloc_pd(ca, 0).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 0).unwrap();
        let mut init = QpInit::rc(cq, 4, 4);
        init.qp_type = QpType::Gsi;
        init.sq_sig_all = true;
        let qp = p.create_qp(pd, &init, 0).unwrap();
        for attr in [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                qkey: Some(Qkey::GSI),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(rdma_types::Psn::new(0)),
                ..Default::default()
            },
        ] {
            p.modify_qp(qp, &attr).unwrap();
        }
        let buf = verbs::MemBuf::new(8192);
        let mr = p
            .reg_mr(
                pd,
                &buf,
                buf.addr(),
                buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .unwrap();
        let g = Gsi {
            p: p.clone(),
            pd,
            cq,
            qp,
            mr,
            buf,
        };
        for i in 0..4 {
            g.p.post_recv(
                qp,
                &[verbs::RecvWr {
                    wr_id: 100 + i,
                    sges: verbs::sges![g.sge(RECV + i * 512, 40 + 256)],
                }],
            )
            .unwrap();
        }
        g
    }

    fn sge(&self, off: u64, len: u32) -> verbs::Sge {
        verbs::Sge {
            addr: self.buf.addr() + off,
            length: len,
            lkey: self.mr.lkey,
        }
    }

    /// Sends 256 bytes to QP1 at `to`, in the partition of table entry
    /// `pkey_index` (`None`: the QP's).
    fn send(&self, to: rdma_types::Gid, pkey_index: Option<u16>) -> Result<()> {
        use rdma_types::{Qkey, Qpn};
        let ah = self.p.create_ah(self.pd, &verbs::AhAttr::roce(to))?;
        let mut w = verbs::SendWr::new(1, verbs::SendOpcode::Send, vec![self.sge(0, 256)]);
        w.ud = Some(verbs::UdDest {
            ah,
            remote_qpn: Qpn::GSI,
            remote_qkey: Qkey::GSI,
        });
        w.pkey_index = pkey_index;
        self.p.post_send(self.qp, &[w])
    }

    /// The next completion within 2 s, if any, skipping sends'.
    fn recv(&self, within: std::time::Duration) -> Option<verbs::WorkCompletion> {
        let end = std::time::Instant::now() + within;
        let mut wc = [verbs::WorkCompletion::new(
            0,
            rdma_types::WcStatus::Success,
            rdma_types::WcOpcode::Send,
            0,
        )];
        loop {
            while self.p.poll_cq(self.cq, &mut wc).unwrap() == 1 {
                if wc[0].wr_id >= 100 {
                    return Some(wc[0]);
                }
            }
            let left = end.checked_duration_since(std::time::Instant::now())?;
            let _ = self.p.wait_cq(self.cq, left);
        }
    }
}

/// Partitions on QP1 through the verbs (127.0.157.3-4): a GSI QP made
/// before the SM's table sends with the key its index names once the
/// table comes (the limited 0x7fff, no longer the default 0xffff); two
/// limited members do not hear each other and the receiver counts it; a
/// WR naming another entry sends in that partition, and the receive says
/// which entry matched, the one to answer with.
#[test]
fn gsi_sends_in_a_partition_it_holds_and_the_port_refuses_others() {
    let ip = |k| IpAddr::V4(Ipv4Addr::new(127, 0, 157, k));
    let (a, b) = (Guid(0x3333), Guid(0x4444));
    let p = SoftRoce::new(
        vec![SoftCa { guid: a, ip: ip(3) }, SoftCa { guid: b, ip: ip(4) }],
        ROCE_PORT,
    );
    for g in [a, b] {
        p.set_personality(g, Personality::Ib).unwrap();
    }
    let (qa, qb) = (Gsi::new(&p, a), Gsi::new(&p, b));
    let table = [Pkey(0x7fff), Pkey(0x8010)];
    p.set_pkeys(a, &table).unwrap();
    p.set_pkeys(b, &table).unwrap();
    let short = std::time::Duration::from_millis(300);
    let gid_b = rdma_types::Gid::from_ip(ip(4));
    let violations = |g| p.counters(g).unwrap().pkey_violations;

    // The QP's own entry, 0x7fff, to a limited member: refused.
    qa.send(gid_b, None).unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while violations(b) == 0 {
        assert!(std::time::Instant::now() < end, "no violation counted");
        let _ = qb.recv(std::time::Duration::from_millis(10));
    }
    assert!(
        qb.recv(short).is_none(),
        "a limited member heard a limited one"
    );
    let (n, v) = p.take_pkey_violations(b).expect("the violation is kept");
    assert_eq!((n, v.pkey), (1, Pkey(0x7fff)));
    assert_eq!(v.src_gid, rdma_types::Gid::from_ip(ip(3)));
    assert_eq!(violations(a), 0);

    // Entry 1, 0x8010: delivered; the receiver's matching entry is 1.
    qa.send(gid_b, Some(1)).unwrap();
    let wc = qb
        .recv(std::time::Duration::from_secs(2))
        .expect("delivered");
    assert_eq!(
        (wc.status, wc.pkey_index),
        (rdma_types::WcStatus::Success, 1)
    );
    assert_eq!(violations(b), 1);
    // An entry the table does not have is refused at the post.
    assert!(matches!(
        qa.send(gid_b, Some(2)),
        Err(verbs::VerbsError::BadWr { index: 0, .. })
    ));
}
