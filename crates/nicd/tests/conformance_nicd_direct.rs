//! The verbs conformance suite over the daemon's client with the data
//! path in this process (`nicd::Direct`) against a `nicd` process: each
//! CA's QPs run on a node of this process, on a member of the daemon's
//! shared port; QP1, port attributes and registrations' accounting stay
//! the daemon's. Port control is the daemon's own NIC's, out of this
//! process's reach: declared missing, as for `conformance_nicd_process.rs`.

mod common;

use common::{One, Spawned};

verbs::conformance_tests!(Spawned::start(150, nicd::Direct::new));

/// The QPs run in this process: their numbers are in the blocks the
/// daemon lent (one per NIC), SENDs between them are this process's
/// node's datagrams, and QP1 is the daemon's (a GSI QP works through
/// it). A second client gets blocks of its own.
#[test]
fn qps_run_here_in_blocks_lent_to_this_client() {
    use verbs::conformance::{connect, Node};
    use verbs::{RecvWr, SendOpcode, SendWr};
    let f = Spawned::start(150, nicd::Direct::new);
    let (ga, gb) = f.guids;
    let (a, b) = (Node::open(&f, ga, 64), Node::open(&f, gb, 64));
    let (qa, qb) = (
        a.qp(rdma_types::QpType::Rc, None, 1),
        b.qp(rdma_types::QpType::Rc, None, 2),
    );
    let block = |n: &Node, q| roce_udp::qpn_block(n.p.qp_num(q).unwrap().value());
    let (ba, bb) = (block(&a, qa), block(&b, qb));
    assert!(ba != 0 && bb != 0, "blocks {ba} {bb}: not the daemon's");
    connect(&a, qa, &b, qb, rdma_types::QpType::Rc, 7);
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 5,
            sges: verbs::sges![b.sge(0, 64)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, b"direct");
    a.p.post_send(qa, &[SendWr::new(9, SendOpcode::Send, vec![a.sge(0, 6)])])
        .unwrap();
    let wc = b.wc();
    assert_eq!((wc.wr_id, wc.byte_len), (5, 6));
    assert_eq!(b.buf.to_vec(0, 6), b"direct");
    let nic = f.client.nic().expect("a node in this process");
    assert!(nic.counters(gb).unwrap().rx_datagrams >= 1);
    // QP1 is the daemon's, reached through it.
    a.qp(rdma_types::QpType::Gsi, None, 3);

    // Another client of the same daemon: blocks of its own.
    let other = nicd::Direct::new(nicd::NicdProvider::connect(&f.socket).unwrap());
    let by = One(other, ga);
    let c = Node::open(&by, ga, 64);
    let qc = c.qp(rdma_types::QpType::Rc, None, 4);
    let bc = block(&c, qc);
    assert!(bc != 0 && bc != ba, "block {bc} against {ba}");
}
