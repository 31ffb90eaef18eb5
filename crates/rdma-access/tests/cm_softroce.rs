//! The CM agent over the soft RoCE NIC: two CAs on loopback addresses,
//! CM MADs on QP1 through real UDP sockets.

use rdma_access::{rdmacm, CmAgent, CmError};
use rdma_types::{Guid, Psn, Qpn};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

fn pair(net: u8) -> (Arc<CmAgent>, Arc<CmAgent>, IpAddr, IpAddr) {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 111, net));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 111, net + 1));
    let p = SoftRoce::new(
        vec![
            SoftCa {
                guid: Guid(0xa),
                ip: a_ip,
            },
            SoftCa {
                guid: Guid(0xb),
                ip: b_ip,
            },
        ],
        ROCE_PORT,
    );
    let a = CmAgent::start(p.clone(), Guid(0xa), 0x1000).unwrap();
    let b = CmAgent::start(p, Guid(0xb), 0x2000).unwrap();
    (a, b, a_ip, b_ip)
}

const T: Duration = Duration::from_secs(10);

#[test]
fn rdma_cm_connect_accept_disconnect() {
    let (a, b, a_ip, b_ip) = pair(31);
    let requests = rdmacm::listen(&b, 5555);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        let req = rdmacm::decode(inc).map_err(|(_, e)| e).unwrap();
        assert_eq!(req.src.ip(), a_ip);
        assert_eq!(&req.private_data[..5], b"login");
        assert_eq!(req.incoming.remote_qpn, Qpn::from_bits(0x42));
        assert!(req
            .incoming
            .accept(Qpn::from_bits(0x77), Psn::new(0x1234), b"welcome".to_vec()));
        req.incoming.conn
    });
    let est = rdmacm::connect(
        &a,
        a_ip,
        b_ip,
        5555,
        Qpn::from_bits(0x42),
        Psn::new(0x99),
        b"login",
        T,
    )
    .unwrap();
    let b_conn = server.join().unwrap();
    assert_eq!(est.remote_qpn, Qpn::from_bits(0x77));
    assert_eq!(est.remote_psn, Psn::new(0x1234));
    assert_eq!(&est.private_data[..7], b"welcome");

    // Disconnect from the active side: the passive side's hook hears it.
    let (tx, rx) = mpsc::channel();
    b.on_disconnect(move |c| {
        let _ = tx.send(c);
    });
    a.disconnect(est.conn);
    assert_eq!(rx.recv_timeout(T).unwrap(), b_conn);
}

#[test]
fn rejects_carry_private_data_and_decoded_reasons() {
    let (a, b, a_ip, b_ip) = pair(33);
    let requests = rdmacm::listen(&b, 7000);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).unwrap();
        assert!(inc.reject(b"no thanks".to_vec()));
    });
    let e =
        rdmacm::connect(&a, a_ip, b_ip, 7000, Qpn::from_bits(5), Psn::new(0), b"", T).unwrap_err();
    server.join().unwrap();
    match e {
        CmError::Rejected {
            code,
            reason,
            private_data,
        } => {
            assert_eq!(code, 28);
            assert_eq!(reason, "consumer defined");
            assert_eq!(&private_data[..9], b"no thanks");
        }
        other => panic!("{other:?}"),
    }
    // Nobody listens on this port: the CM itself refuses.
    let e =
        rdmacm::connect(&a, a_ip, b_ip, 7001, Qpn::from_bits(6), Psn::new(0), b"", T).unwrap_err();
    assert!(
        matches!(e, CmError::Rejected { code: 8, .. }),
        "invalid service ID: {e:?}"
    );
    assert!(e.to_string().contains("rejected"), "{e}");
}
