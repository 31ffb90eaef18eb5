//! The daemon lends members of its NICs' shared ports (`nicd::shared`):
//! one block per client and NIC, the QPs of a `nicd::Direct` client in
//! it, and the block back in the daemon's hands once the client is gone.

mod common;

use common::{fresh_ip, One};
use nicd::server::PortLender;
use rdma_types::{Guid, QpType};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};

use rdma_types::{AccessFlags, WcStatus};
use std::time::Duration;
use verbs::conformance::Node;
use verbs::{RemoteAddr, SendOpcode, SendWr, VerbsError};

#[test]
fn a_clients_block_goes_back_when_it_leaves() {
    let ip = fresh_ip(200);
    let guid = rnic::softroce::ip_guid(ip);
    let soft = SoftRoce::new(vec![SoftCa { guid, ip }], ROCE_PORT);
    let shared = nicd::shared::SharedPorts::new(soft.clone(), ROCE_PORT);
    shared.share(ip).unwrap();
    let server = nicd::Server::new(soft.clone());
    server.lend_ports_with(shared.clone());
    server.claim_nics().unwrap();
    let path = std::env::temp_dir().join(format!("nicd-shared-{}.sock", std::process::id()));
    server.serve(nicd::server::bind(&path, false).unwrap());
    let lent = || {
        shared
            .lent()
            .into_iter()
            .find(|(g, _)| *g == guid)
            .unwrap()
            .1
    };
    assert_eq!(lent(), vec![0]);

    let client = nicd::Direct::new(nicd::NicdProvider::connect(&path).unwrap());
    let f = One(client.clone(), guid);
    let n = Node::open(&f, guid, 16);
    let q = n.qp(QpType::Rc, None, 1);
    let block = roce_udp::qpn_block(n.p.qp_num(q).unwrap().value());
    assert_eq!(lent(), vec![0, block]);
    // An operator sees who holds it (`nicd --clients`).
    let admin = nicd::NicdProvider::connect(&path).unwrap();
    let who = admin.lent_ports().unwrap();
    assert_eq!(who.len(), 1, "{who:?}");
    assert_eq!((who[0].guid, who[0].block), (guid, block));
    let me = admin.daemon_clients().unwrap();
    assert!(me.iter().any(|c| c.peer.id == who[0].client), "{me:?}");
    // One member per client and NIC: a second open of the CA keeps it.
    let again = Node::open(&f, guid, 16);
    assert_eq!(lent(), vec![0, block]);
    drop((n, again, f, client));
    // Only the operator's connection is left.
    assert!(server.wait_until(Duration::from_secs(10), |clients, _| clients.len() == 1));
    assert_eq!(lent(), vec![0], "given back");
    assert_eq!(admin.lent_ports().unwrap(), vec![]);
    // Lent again to the next client.
    let next = nicd::Direct::new(nicd::NicdProvider::connect(&path).unwrap());
    let f = One(next, guid);
    let n = Node::open(&f, guid, 16);
    let q = n.qp(QpType::Rc, None, 1);
    assert_eq!(roce_udp::qpn_block(n.p.qp_num(q).unwrap().value()), block);
    // A port the daemon does not share: refused in words.
    let e = shared.lend(Guid(0x99)).unwrap_err();
    assert!(matches!(e, VerbsError::NotSupported(m) if m.contains("not shared")));
    let _ = std::fs::remove_file(&path);
}

/// A daemon on a fresh address of `host` that lets each client register
/// `max_registered` bytes, and two clients with their QPs in their own
/// processes, each a node with an RC QP (A's 1 and B's 2), not yet
/// connected.
fn two_clients(host: u8, max_registered: u64) -> (common::Daemon, [(Node, verbs::QpHandle); 2]) {
    let limits = nicd::Limits {
        max_registered,
        ..nicd::Limits::default()
    };
    let d = common::Daemon::start_shared(&[fresh_ip(host)], limits, false);
    let g = d.guids[0];
    let node = |n| {
        let node = Node::open(&One(nicd::Direct::new(d.client()), g), g, 16);
        let q = node.qp(QpType::Rc, None, n);
        (node, q)
    };
    let pair = [node(1), node(2)];
    (d, pair)
}

/// Registering all of `buf` on `n` is refused: past the client's limit
/// (in words), the daemon's first such refusal.
fn refused_past_the_limit(d: &common::Daemon, n: &Node, buf: &verbs::MemBuf) {
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let e = (n.p)
        .reg_mr(n.pd, buf, buf.addr(), buf.len() as u64, all, 10)
        .unwrap_err();
    assert!(e.to_string().contains("--max-registered"), "{e}");
    assert_eq!(d.server.limit_refusals(), 1);
}

/// Two clients with their QPs in their own processes, on one NIC: an RDMA
/// WRITE of one with the other's R_Key past that registration (or with a
/// key of its own) ends in a remote access error and changes nothing;
/// registrations count against the client's limit at the daemon, and one
/// past it is refused (in words, counted).
#[test]
fn clients_own_memory_stays_theirs_and_within_their_limit() {
    let (d, [(a, qa), (b, qb)]) = two_clients(201, 192 << 10);
    let block = |n: &Node, q| roce_udp::qpn_block(n.p.qp_num(q).unwrap().value());
    assert!(block(&a, qa) != block(&b, qb) && block(&a, qa) != 0);
    verbs::conformance::connect(&a, qa, &b, qb, QpType::Rc, 7);
    a.buf.write_at(0, &[0x5a; 4096]);
    b.buf.write_at(0, &[0xa5; 64]);
    let write = |to: u64, rkey| {
        let mut w = SendWr::new(7, SendOpcode::RdmaWrite, vec![b.sge(0, 64)]);
        w.flags = verbs::SendFlags::SIGNALED;
        w.remote = RemoteAddr { addr: to, rkey };
        b.p.post_send(qb, &[w]).unwrap();
        b.wc().status
    };
    // Past A's registration with A's key.
    assert_eq!(
        write(a.mr.addr + a.mr.len, a.mr.rkey),
        WcStatus::RemAccessErr
    );
    assert_eq!(a.buf.to_vec(0, 4096), vec![0x5a; 4096]);
    // A's memory with a key A never gave (each client's node has keys of
    // its own: B's may be the same number as A's): the QP is in error
    // now; a new pair.
    let (qa, qb) = (a.qp(QpType::Rc, None, 3), b.qp(QpType::Rc, None, 4));
    verbs::conformance::connect(&a, qa, &b, qb, QpType::Rc, 7);
    let mut w = SendWr::new(8, SendOpcode::RdmaWrite, vec![b.sge(0, 64)]);
    w.flags = verbs::SendFlags::SIGNALED;
    w.remote = RemoteAddr {
        addr: a.mr.addr,
        rkey: rdma_types::Rkey(a.mr.rkey.0 ^ 0x00ff_ff00),
    };
    b.p.post_send(qb, &[w]).unwrap();
    assert_eq!(b.wc().status, WcStatus::RemAccessErr);
    assert_eq!(a.buf.to_vec(0, 4096), vec![0x5a; 4096]);

    // 64 KiB each so far (the nodes' buffers) and the rings of the
    // daemon's CQ halves; 64 more fit in 192, 128 more do not.
    let more = verbs::MemBuf::new(64 << 10);
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    a.p.reg_mr(a.pd, &more, more.addr(), 64 << 10, all, 9)
        .unwrap();
    refused_past_the_limit(&d, &a, &verbs::MemBuf::new(128 << 10));
}

/// QPs a client runs itself count at the daemon: against its QP limit
/// (one past it refused in words, counted), in what `nicd --clients`
/// lists, and back to nothing once destroyed or once the client is gone.
#[test]
fn a_clients_own_qps_count_at_the_daemon() {
    let limits = nicd::Limits {
        max_qps: 2,
        ..nicd::Limits::default()
    };
    let d = common::Daemon::start_shared(&[fresh_ip(202)], limits, false);
    let g = d.guids[0];
    let f = One(nicd::Direct::new(d.client()), g);
    let n = Node::open(&f, g, 16);
    let admin = d.client();
    let qps_of = |admin: &nicd::NicdProvider| -> usize {
        let all = admin.daemon_clients().unwrap();
        all.iter()
            .flat_map(|c| c.objects.iter())
            .filter(|(k, _)| *k == verbs::ResourceKind::Qp)
            .map(|(_, n)| n)
            .sum()
    };
    let (q1, _q2) = (n.qp(QpType::Rc, None, 1), n.qp(QpType::Rc, None, 2));
    // Both run in this process (on its block), and both are listed.
    assert_ne!(roce_udp::qpn_block(n.p.qp_num(q1).unwrap().value()), 0);
    assert_eq!(qps_of(&admin), 2);
    let e =
        n.p.create_qp(n.pd, &verbs::QpInit::rc(n.cq, 4, 4), 3)
            .unwrap_err();
    assert!(
        matches!(&e, VerbsError::OutOfResources(m) if m.contains("--max-qps")),
        "{e:?}"
    );
    assert_eq!(d.server.limit_refusals(), 1);
    // What it destroys it may make again.
    n.p.destroy_qp(q1).unwrap();
    assert_eq!(qps_of(&admin), 1);
    n.qp(QpType::Rc, None, 3);
    assert_eq!(qps_of(&admin), 2);
    drop((n, f));
    assert!(d
        .server
        .wait_until(Duration::from_secs(10), |clients, _| clients.len() == 1));
    assert_eq!(qps_of(&admin), 0);
}

/// Memory the daemon cannot reach (private, as srptd's RAM store) still
/// registers in a client's own node: a peer's RDMA WRITE lands in it,
/// and its bytes count against the client's limit at the daemon (one
/// past it refused, room again once deregistered).
#[test]
fn private_memory_registers_in_the_clients_node_and_counts_at_the_daemon() {
    let (d, [(a, qa), (b, qb)]) = two_clients(203, 256 << 10);
    verbs::conformance::connect(&a, qa, &b, qb, QpType::Rc, 7);
    let mrs = || -> usize {
        let all = d.client().daemon_clients().unwrap();
        all.iter()
            .flat_map(|c| c.objects.iter())
            .filter(|(k, _)| *k == verbs::ResourceKind::Mr)
            .map(|(_, n)| n)
            .sum()
    };
    let before = mrs();
    let private = verbs::MemBuf::new_private(64 << 10);
    assert!(private.shared_fd().is_none());
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr =
        a.p.reg_mr(a.pd, &private, private.addr(), 64 << 10, all, 9)
            .unwrap();
    assert_eq!(mrs(), before + 1, "counted at the daemon");
    b.buf.write_at(0, &[0xc3; 64]);
    let mut w = SendWr::new(7, SendOpcode::RdmaWrite, vec![b.sge(0, 64)]);
    w.remote = RemoteAddr {
        addr: mr.addr + 4096,
        rkey: mr.rkey,
    };
    b.p.post_send(qb, &[w]).unwrap();
    assert_eq!(b.wc().status, WcStatus::Success);
    assert_eq!(private.to_vec(4096, 64), vec![0xc3; 64]);
    // 64 KiB for each node's buffer, the daemon's CQ halves' rings, and
    // these 64: 128 more are past the 256.
    let past = verbs::MemBuf::new_private(128 << 10);
    refused_past_the_limit(&d, &a, &past);
    a.p.dereg_mr(mr.handle).unwrap();
    assert_eq!(mrs(), before);
    let mr =
        a.p.reg_mr(a.pd, &past, past.addr(), 128 << 10, all, 10)
            .unwrap();
    a.p.dereg_mr(mr.handle).unwrap();
}
