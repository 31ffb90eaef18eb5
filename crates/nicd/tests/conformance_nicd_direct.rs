//! The verbs conformance suite over the daemon's client with the data
//! path in this process (`nicd::Direct`) against a `nicd` process: each
//! CA's QPs run on a node of this process, on a member of the daemon's
//! shared port; QP1, port attributes and registrations' accounting stay
//! the daemon's. Port control is the daemon's own NIC's, out of this
//! process's reach: declared missing, as for `conformance_nicd_process.rs`.

mod common;

use common::fresh_ip;
use rdma_types::{Guid, Lid};
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result, VerbsError};

struct Spawned {
    nicd: Child,
    client: Arc<nicd::Direct>,
    guids: (Guid, Guid),
    socket: std::path::PathBuf,
}

impl Spawned {
    fn new() -> Spawned {
        let (a, b) = (fresh_ip(150), fresh_ip(150));
        let socket =
            std::env::temp_dir().join(format!("nicd-direct-{}-{a}.sock", std::process::id()));
        let mut nicd = Command::new(env!("CARGO_BIN_EXE_nicd"))
            .args(["--ip", &a.to_string(), "--ip", &b.to_string(), "--socket"])
            .arg(&socket)
            .env("SOFTROCE_FOLLOW_LINK", "0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(nicd.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("nicd: serving"), "{line:?}");
        let guid = |ip: IpAddr| rnic::softroce::ip_guid(ip);
        let client = nicd::Direct::new(nicd::NicdProvider::connect(&socket).unwrap());
        Spawned {
            nicd,
            client,
            guids: (guid(a), guid(b)),
            socket,
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.nicd.kill();
        let _ = self.nicd.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Fixture for Spawned {
    fn provider(&self) -> Arc<dyn Provider> {
        self.client.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    /// Soft RoCE's gaps, raw QP1 sends (the daemon's QP1 is shared and
    /// routes by contents), and port control (the pkey_change case asks
    /// for it first).
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Apm, Feature::PortControl, Feature::RawGsi]
    }
}

verbs::conformance_tests!(Spawned::new());

/// The QPs run in this process: their numbers are in the blocks the
/// daemon lent (one per NIC), SENDs between them are this process's
/// node's datagrams, and QP1 is the daemon's (a GSI QP works through
/// it). A second client gets blocks of its own.
#[test]
fn qps_run_here_in_blocks_lent_to_this_client() {
    use verbs::conformance::{connect, Node};
    use verbs::{RecvWr, SendOpcode, SendWr};
    let f = Spawned::new();
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
            sges: vec![b.sge(0, 64)],
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
    struct By(Arc<nicd::Direct>, (Guid, Guid));
    impl Fixture for By {
        fn provider(&self) -> Arc<dyn Provider> {
            self.0.clone()
        }
        fn guids(&self) -> (Guid, Guid) {
            self.1
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
    let by = By(other, f.guids);
    let c = Node::open(&by, ga, 64);
    let qc = c.qp(rdma_types::QpType::Rc, None, 4);
    let bc = block(&c, qc);
    assert!(bc != 0 && bc != ba, "block {bc} against {ba}");
}
