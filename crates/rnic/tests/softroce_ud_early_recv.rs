//! A UD QP's receives posted in INIT (before RTR) are kept: rdma-core's
//! ibv_ud_pingpong posts its whole receive queue in INIT. Soft RoCE
//! built a UD QP's engine at RESET->INIT and again at INIT->RTR, and the
//! second engine had lost them (found running ibv_ud_pingpong through
//! crates/ibverbs-abi). A Q_Key given at INIT->RTR still reaches the
//! engine built at INIT.

use rdma_types::{AccessFlags, Guid, PortNum, Psn, Qkey, QpState, QpType, WcOpcode, WcStatus};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{
    AhAttr, CqInit, IgnoreEvents, MemBuf, Provider, QpAttr, QpInit, RecvWr, SendOpcode, SendWr,
    Sge, UdDest, WorkCompletion,
};

#[test]
fn ud_receives_posted_in_init_take_datagrams() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 92, 1, 1));
    let p = SoftRoce::new(
        vec![SoftCa {
            guid: Guid(0x9211),
            ip,
        }],
        ROCE_PORT,
    );
    let ca = p.open_ca(Guid(0x9211), 0, Arc::new(IgnoreEvents)).unwrap();
    let pd = p.alloc_pd(ca, 0).unwrap();
    let gid = p.query_port(ca, PortNum(1)).unwrap().gids[0];
    let buf = MemBuf::new(8192);
    let mr = p
        .reg_mr(pd, &buf, buf.addr(), 8192, AccessFlags::LOCAL_WRITE, 0)
        .unwrap();
    let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 0).unwrap();
    let ud = || {
        let mut init = QpInit::rc(cq, 4, 4);
        init.qp_type = QpType::Ud;
        p.create_qp(pd, &init, 0).unwrap()
    };
    let (qa, qb) = (ud(), ud());
    let qkey = Qkey(0x1111_1111);
    for q in [qa, qb] {
        let init = QpAttr {
            state: Some(QpState::Init),
            port: Some(PortNum(1)),
            pkey_index: Some(0),
            // The Q_Key in force comes at INIT->RTR below.
            qkey: Some(Qkey(0x2222)),
            ..Default::default()
        };
        p.modify_qp(q, &init).unwrap();
    }
    buf.write_at(0, &[0x5a; 64]);
    let recv = RecvWr {
        wr_id: 7,
        sges: verbs::sges![Sge {
            addr: buf.addr() + 4096,
            length: 40 + 64,
            lkey: mr.lkey,
        }],
    };
    p.post_recv(qb, &[recv]).unwrap();
    for q in [qa, qb] {
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            qkey: Some(qkey),
            ..Default::default()
        };
        p.modify_qp(q, &rtr).unwrap();
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(1)),
            ..Default::default()
        };
        p.modify_qp(q, &rts).unwrap();
    }
    let ah = p.create_ah(pd, &AhAttr::roce(gid)).unwrap();
    let mut w = SendWr::new(
        1,
        SendOpcode::Send,
        vec![Sge {
            addr: buf.addr(),
            length: 64,
            lkey: mr.lkey,
        }],
    );
    w.ud = Some(UdDest {
        ah,
        remote_qpn: p.qp_num(qb).unwrap(),
        remote_qkey: qkey,
    });
    p.post_send(qa, &[w]).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
    while got.len() < 2 && Instant::now() < deadline {
        p.wait_cq(cq, Duration::from_millis(100)).ok();
        let n = p.poll_cq(cq, &mut out).unwrap();
        got.extend_from_slice(&out[..n]);
    }
    let r = got
        .iter()
        .find(|w| w.wr_id == 7)
        .expect("the receive posted in INIT completes");
    assert_eq!(
        (r.status, r.opcode, r.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 104)
    );
    assert_eq!(buf.to_vec(4096 + 40, 64), vec![0x5a; 64]);
}
