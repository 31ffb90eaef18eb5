//! `saquery` against `ibsm run` on loopback (127.0.121.x): two ib nodes
//! come up, one registers a service, and the tool lists nodes, ports (the
//! ibstat view), paths and services the SA knows; bad input and an absent
//! SA give clear errors.

use rdma_access::sa::{SaClient, SaTiming};
use rdma_access::sma::state;
use rdma_access::IbNode;
use rdma_mad::sa::ServiceRecord;
use rdma_types::{Gid, Guid, Pkey};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
mod common;

use common::saquery;
use std::process::{Child, Command};
use std::time::Duration;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 121, last))
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn saquery_lists_what_the_sa_knows() {
    let p = SoftRoce::new(
        [2u8, 3]
            .iter()
            .map(|&l| SoftCa {
                guid: Guid(0x1210_0000 | u64::from(l)),
                ip: ip(l),
            })
            .collect(),
        ROCE_PORT,
    );
    let nodes: Vec<IbNode> = [(2u8, true), (3, false)]
        .iter()
        .map(|&(l, dm)| {
            common::ib_node(
                p.clone(),
                Guid(0x1210_0000 | u64::from(l)),
                &format!("saquery-node-{l}"),
                dm,
                u32::from(l) << 16,
            )
            .unwrap()
        })
        .collect();
    let _sm = Kill(
        Command::new(env!("CARGO_BIN_EXE_ibsm"))
            .env("NICD_MODE", "own")
            .args(["run", "--addr", "127.0.121.1", "--node", "127.0.121.2"])
            .args(["--node", "127.0.121.3", "--sweep-interval-ms", "300"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for n in &nodes {
        assert!(n.sma().wait_state(state::ACTIVE, Duration::from_secs(10)));
    }
    let sa = SaClient::new(nodes[0].agent(), Gid::from_ip(ip(1)), SaTiming::default()).unwrap();
    let mut name = [0u8; 64];
    name[..16].copy_from_slice(b"SRP.T10:00c0ffee");
    let rec = ServiceRecord {
        service_id: 0x00c0_ffee,
        service_gid: Gid::from_ip(ip(2)),
        service_pkey: Pkey(0xffff),
        service_lease: u32::MAX,
        service_key: [0; 16],
        service_name: name,
        service_data: [0; 64],
    };
    sa.register_service(&rec).unwrap();

    // The SA lists a node once the SM has finished with it; ask until both
    // are there (bounded).
    let mut out = String::new();
    for _ in 0..50 {
        let (ok, o) = saquery("127.0.121.1", "127.0.121.9", &["nodes"]);
        out = o;
        if ok && out.contains("2 node records") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(out.contains("2 node records"), "{out}");
    assert!(
        out.contains("saquery-node-2") && out.contains("saquery-node-3"),
        "{out}"
    );
    assert!(out.contains("0000000012100002"), "{out}");

    let (ok, out) = saquery("127.0.121.1", "127.0.121.9", &["ports"]);
    assert!(ok, "{out}");
    assert_eq!(out.matches(" ACTIVE ").count(), 2, "{out}");
    // Only node 2 offers device management (srp_daemon's query).
    let (ok, out) = saquery("127.0.121.1", "127.0.121.9", &["ports", "--dm"]);
    assert!(ok && out.contains("1 port records"), "{out}");
    assert!(out.contains("IsDeviceManagementSupported"), "{out}");

    let (ok, out) = saquery(
        "127.0.121.1",
        "127.0.121.9",
        &["paths", "--sgid", "127.0.121.2", "--dgid", "127.0.121.3"],
    );
    assert!(ok, "{out}");
    assert!(out.contains("1 path records"), "{out}");
    assert!(
        out.contains("dgid 0000:0000:0000:0000:0000:ffff:7f00:7903"),
        "{out}"
    );

    let (ok, out) = saquery(
        "127.0.121.1",
        "127.0.121.9",
        &["services", "--name", "SRP.T10:00c0ffee"],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("id 0000000000c0ffee") && out.contains("lease indefinite"),
        "{out}"
    );
    sa.delete_service(&rec).unwrap();
    let (ok, out) = saquery("127.0.121.1", "127.0.121.9", &["services"]);
    assert!(ok && out.contains("0 service records"), "{out}");

    // Bad input.
    let (ok, out) = saquery(
        "127.0.121.1",
        "127.0.121.9",
        &["paths", "--sgid", "nonsense", "--dgid", "127.0.121.3"],
    );
    assert!(
        !ok && out.contains("neither an IP address nor a 128-bit GID"),
        "{out}"
    );
}

#[test]
fn saquery_without_an_sa_times_out_clearly() {
    let o = Command::new(env!("CARGO_BIN_EXE_saquery"))
        .env("NICD_MODE", "own")
        .args([
            "--sa",
            "127.0.121.30",
            "--ip",
            "127.0.121.31",
            "--timeout-ms",
            "50",
            "nodes",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("SA at 127.0.121.30"), "{err}");
}
