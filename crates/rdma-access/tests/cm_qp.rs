//! The CM readying the consumers' QPs (`CmAgent::connect_qp`,
//! `Incoming::accept_qp`, as Linux rdma_connect / rdma_accept with a QP):
//! two ports on the loopback provider and on soft RoCE (127.0.176.x),
//! both RC QPs in RTS with the negotiated attributes, a SEND through; a
//! QP that cannot be readied refuses the connection with a REJ.

mod mad_common;

use mad_common::{loopback_cas, soft_pair};
use rdma_access::{CmAgent, CmConfig, CmError, ConnQp, QpParams};
use rdma_types::{AccessFlags, Guid, Psn, QpState, Qpn, WcOpcode, WcStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{
    CqHandle, CqInit, IgnoreEvents, MemBuf, MrInfo, Provider, QpAttr, QpHandle, QpInit, RecvWr,
    SendOpcode, SendWr, Sge, WorkCompletion,
};

const T: Duration = Duration::from_secs(10);
const SVC: u64 = 0x0106_0000_0000_4242;

fn cm() -> CmConfig {
    CmConfig {
        response_timeout: rdma_types::TimeoutExp::from_bits(15),
        max_retries: rdma_types::CmRetries::from_bits(3),
        timewait: rdma_types::Duration::from_millis(100),
        packet_life_time: rdma_types::TimeoutExp::from_bits(12),
        ..CmConfig::default()
    }
}

/// Two providers' worth of CAs A and B with their agents.
fn ports(kind: &str, host: u8) -> (Arc<dyn Provider>, Arc<CmAgent>, Arc<CmAgent>) {
    let p: Arc<dyn Provider> = if kind == "loopback" {
        loopback_cas(&[0xa, 0xb])
    } else {
        soft_pair(176, host, 0xa, 0xb)
    };
    let a = CmAgent::start_with(p.clone(), Guid(0xa), 0x100, cm()).unwrap();
    let b = CmAgent::start_with(p.clone(), Guid(0xb), 0x200, cm()).unwrap();
    (p, a, b)
}

/// A consumer's RC QP with a CQ and 4 KiB of registered memory.
struct Side {
    p: Arc<dyn Provider>,
    cq: CqHandle,
    qp: QpHandle,
    buf: MemBuf,
    mr: MrInfo,
}

impl Side {
    fn new(p: &Arc<dyn Provider>, guid: Guid) -> Side {
        let ca = p.open_ca(guid, 0, Arc::new(IgnoreEvents)).unwrap();
        let pd = p.alloc_pd(ca, 0).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 0).unwrap();
        let qp = p.create_qp(pd, &QpInit::rc(cq, 4, 4), 0).unwrap();
        let buf = MemBuf::new(4096);
        let mr = p
            .reg_mr(pd, &buf, buf.addr(), 4096, AccessFlags::LOCAL_WRITE, 0)
            .unwrap();
        Side {
            p: p.clone(),
            cq,
            qp,
            buf,
            mr,
        }
    }

    fn conn_qp(&self, params: QpParams) -> ConnQp {
        ConnQp {
            params,
            ..ConnQp::new(self.p.clone(), self.qp)
        }
    }

    fn attr(&self) -> QpAttr {
        self.p.query_qp(self.qp).unwrap()
    }

    /// Posts a receive of the whole buffer.
    fn recv(&self, wr_id: u64) {
        let sges = self.sge(4096);
        self.p
            .post_recv(
                self.qp,
                &[RecvWr {
                    wr_id,
                    sges: sges.into(),
                }],
            )
            .unwrap();
    }

    fn qpn(&self) -> Qpn {
        self.p.qp_num(self.qp).unwrap()
    }

    fn sge(&self, len: u32) -> Vec<Sge> {
        vec![Sge {
            addr: self.buf.addr(),
            length: len,
            lkey: self.mr.lkey,
        }]
    }

    /// The next completion, polled for at most 10 s.
    fn completion(&self) -> WorkCompletion {
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
        let end = Instant::now() + T;
        while Instant::now() < end {
            if self.p.poll_cq(self.cq, &mut wc).unwrap() == 1 {
                return wc[0];
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no completion in {T:?}");
    }
}

const ACTIVE: QpParams = QpParams {
    responder_resources: 4,
    initiator_depth: 2,
    retry_count: 5,
    rnr_retry_count: 6,
};
const PASSIVE: QpParams = QpParams {
    responder_resources: 8,
    initiator_depth: 3,
    retry_count: 1,
    rnr_retry_count: 4,
};

fn connect_and_send(kind: &str, host: u8) {
    let (p, a, b) = ports(kind, host);
    let (sa, sb) = (Side::new(&p, Guid(0xa)), Side::new(&p, Guid(0xb)));
    assert_eq!(sa.attr().state, Some(QpState::Reset));
    let requests = b.listen(SVC);
    // The passive consumer takes its QP to INIT itself to post a receive
    // before the connection exists; the CM goes on from there.
    sb.p.modify_qp(
        sb.qp,
        &QpAttr {
            state: Some(QpState::Init),
            port: Some(rdma_types::PortNum(1)),
            pkey_index: Some(0),
            access: Some(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        },
    )
    .unwrap();
    sb.recv(9);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        assert_eq!(inc.params, ACTIVE, "what the REQ offered");
        assert_eq!(inc.timing.packet_life_time.value(), 12);
        inc.accept_qp(&sb.conn_qp(PASSIVE), Psn::new(0x2222), b"yes".to_vec())
            .unwrap();
        sb
    });
    let path = a.path_to(b.gid());
    assert_eq!(path.packet_life_time.value(), 12);
    let est = a
        .connect_qp(
            &path,
            SVC,
            &sa.conn_qp(ACTIVE),
            Psn::new(0x1111),
            b"hi".to_vec(),
            T,
        )
        .unwrap();
    let sb = server.join().unwrap();
    assert_eq!(&est.private_data[..3], b"yes");
    assert_eq!(est.remote_qpn, sb.qpn());

    let (qa, qb) = (sa.attr(), sb.attr());
    assert_eq!(qa.state, Some(QpState::Rts), "{kind}: active");
    assert_eq!(qb.state, Some(QpState::Rts), "{kind}: passive");
    // Each QP points at the other, and the PSNs cross.
    assert_eq!((qa.dest_qpn, qb.dest_qpn), (Some(sb.qpn()), Some(sa.qpn())));
    assert_eq!(
        (qa.sq_psn, qa.rq_psn),
        (Some(Psn::new(0x2222)), Some(Psn::new(0x1111)))
    );
    assert_eq!(
        (qb.sq_psn, qb.rq_psn),
        (Some(Psn::new(0x1111)), Some(Psn::new(0x2222)))
    );
    assert_eq!(qa.path_mtu, Some(a.mtu()));
    assert_eq!(qb.path_mtu, Some(b.mtu()));
    // The local ACK timeout is the path's packet lifetime + 1, on both.
    assert_eq!((qa.timeout, qb.timeout), (Some(13), Some(13)));
    // Retries: the REQ's count on both; RNR retries as the other side
    // asked.
    assert_eq!((qa.retry_cnt, qb.retry_cnt), (Some(5), Some(5)));
    assert_eq!((qa.rnr_retry, qb.rnr_retry), (Some(4), Some(6)));
    // READs: the responder takes what the requester sends at most.
    // B takes min(8, A's depth 2) = 2 and sends min(3, A's 4) = 3.
    assert_eq!(
        (qb.max_dest_rd_atomic, qb.max_rd_atomic),
        (Some(2), Some(3))
    );
    assert_eq!(
        (qa.max_dest_rd_atomic, qa.max_rd_atomic),
        (Some(3), Some(2))
    );

    sa.buf.write_at(0, b"through the CM's QPs");
    p.post_send(sa.qp, &[SendWr::new(1, SendOpcode::Send, sa.sge(20))])
        .unwrap();
    let wc = sa.completion();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{kind}");
    let wc = sb.completion();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 20)
    );
    assert_eq!(sb.buf.to_vec(0, 20), b"through the CM's QPs");
}

#[test]
fn loopback_qps_are_readied_by_the_cm() {
    connect_and_send("loopback", 0);
}

#[test]
fn soft_roce_qps_are_readied_by_the_cm() {
    connect_and_send("softroce", 11);
}

/// `e` says readying the QP failed at `step` ("QP to RTR", ...).
fn refused_at(e: &CmError, step: &str) {
    assert!(
        matches!(e, CmError::Verbs { what, .. } if *what == step),
        "{e}"
    );
}

#[test]
fn a_qp_that_cannot_be_readied_refuses_the_connection() {
    // An RNR timer code past 31 is refused at RTR (loopback checks it).
    let broken = |s: &Side| ConnQp {
        min_rnr_timer: 40,
        ..s.conn_qp(QpParams::DEFAULT)
    };
    // The passive side's: REJ consumer defined for the REQ.
    let (p, a, b) = ports("loopback", 0);
    let (sa, sb) = (Side::new(&p, Guid(0xa)), Side::new(&p, Guid(0xb)));
    let requests = b.listen(SVC);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        let e = inc
            .accept_qp(&broken(&sb), Psn::new(1), vec![])
            .unwrap_err();
        refused_at(&e, "QP to RTR");
        (sb, requests)
    });
    let path = a.path_to(b.gid());
    let connect = |s: &Side| {
        a.connect_qp(
            &path,
            SVC,
            &s.conn_qp(QpParams::DEFAULT),
            Psn::new(1),
            vec![],
            T,
        )
    };
    let e = connect(&sa).unwrap_err();
    assert!(matches!(e, CmError::Rejected { code: 28, .. }), "{e:?}");
    let (sb, requests) = server.join().unwrap();

    // The active side's: the REP is refused, the passive side's
    // connection ends with it.
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        inc.accept_qp(&sb.conn_qp(QpParams::DEFAULT), Psn::new(1), vec![])
            .unwrap();
        inc.conn
    });
    let sa2 = Side::new(&p, Guid(0xa));
    let e = a
        .connect_qp(&path, SVC, &broken(&sa2), Psn::new(1), vec![], T)
        .unwrap_err();
    refused_at(&e, "QP to RTR");
    let b_conn = server.join().unwrap();
    let end = Instant::now() + T;
    while b.state(b_conn) != rdma_cm::ConnState::Closed && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(b.state(b_conn), rdma_cm::ConnState::Closed, "REJ reached B");
    // A QP in the error state is not connected.
    p.modify_qp(
        sa.qp,
        &QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        },
    )
    .unwrap();
    let e = connect(&sa).unwrap_err();
    refused_at(&e, "QP to INIT");
}

/// Agents on port 2 of two-port CAs (a device's second port, as
/// `srptd --device mlx5_0:2` serves it): the connection's QPs are readied
/// on port 2 and carry a SEND, and the DM agent answers at port 2's GID
/// while port 1, which has no agent, answers nothing.
#[test]
fn agents_on_a_second_port_ready_qps_and_serve_dm_there() {
    let f = rnic::loopback::Fabric::new();
    f.add_ca(rnic::loopback::CaConfig::dual_port(0xa, 1))
        .unwrap();
    f.add_ca(rnic::loopback::CaConfig::dual_port(0xb, 2))
        .unwrap();
    let p: Arc<dyn Provider> = f;
    let two = rdma_types::PortNum(2);
    let a = CmAgent::start_on(p.clone(), Guid(0xa), two, 0x300, cm()).unwrap();
    let b = CmAgent::start_on(p.clone(), Guid(0xb), two, 0x400, cm()).unwrap();
    let port_gid = |guid, port| {
        p.query_port(
            p.open_ca(Guid(guid), 0, Arc::new(IgnoreEvents)).unwrap(),
            port,
        )
        .unwrap()
        .gids[0]
    };
    assert_eq!(b.gid(), port_gid(0xb, two));
    assert_ne!(b.gid(), port_gid(0xb, rdma_types::PortNum(1)));

    let dm = rdma_access::dm::DmService::start(&b).unwrap();
    let ioc =
        rdma_access::dm::Ioc::srp(Guid(0xb), &rdma_access::dm::IocLimits::default(), "port 2");
    let _slot = dm.register_ioc(ioc).unwrap();
    let found = rdma_access::dm::query_iocs(&a, b.gid(), Duration::from_millis(500), 2).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1.profile.guid, Guid(0xb));
    let nobody = rdma_access::dm::query_iocs(
        &a,
        port_gid(0xb, rdma_types::PortNum(1)),
        Duration::from_millis(200),
        0,
    );
    assert!(nobody.is_err(), "port 1 has no DM agent: {nobody:?}");

    let (sa, sb) = (Side::new(&p, Guid(0xa)), Side::new(&p, Guid(0xb)));
    let requests = b.listen(SVC);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        inc.accept_qp(&sb.conn_qp(PASSIVE), Psn::new(0x2222), Vec::new())
            .unwrap();
        sb
    });
    a.connect_qp(
        &a.path_to(b.gid()),
        SVC,
        &sa.conn_qp(ACTIVE),
        Psn::new(0x1111),
        Vec::new(),
        T,
    )
    .unwrap();
    let sb = server.join().unwrap();
    let (qa, qb) = (sa.attr(), sb.attr());
    assert_eq!(
        (qa.state, qb.state),
        (Some(QpState::Rts), Some(QpState::Rts))
    );
    assert_eq!((qa.port, qb.port), (Some(two), Some(two)));
    sb.recv(9);
    sa.buf.write_at(0, b"over port 2");
    p.post_send(sa.qp, &[SendWr::new(1, SendOpcode::Send, sa.sge(11))])
        .unwrap();
    assert_eq!(sa.completion().status, WcStatus::Success);
    let wc = sb.completion();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 11)
    );
    assert_eq!(sb.buf.to_vec(0, 11), b"over port 2");
}
