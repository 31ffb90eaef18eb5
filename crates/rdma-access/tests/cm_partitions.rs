//! CM messages travel in their connection's partition (IBA 12.6.5), as
//! Linux's ib_cm sends them, not in QP1's default one: two soft RoCE ports
//! of a managed subnet (127.0.158.x) that are only limited members of the
//! default partition but share a full one connect in it. Since ports check
//! every packet's P_Key (issue 22), a REQ in the default partition between
//! two limited members is dropped by the receiving port.

use rdma_access::CmAgent;
use rdma_types::{Guid, Pkey, Psn, Qpn};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

#[test]
fn ports_sharing_only_a_non_default_partition_connect_in_it() {
    let ip = |k| IpAddr::V4(Ipv4Addr::new(127, 0, 158, k));
    let (a, b) = (Guid(0x5151), Guid(0x5252));
    let p = SoftRoce::new(
        vec![SoftCa { guid: a, ip: ip(1) }, SoftCa { guid: b, ip: ip(2) }],
        ROCE_PORT,
    );
    for g in [a, b] {
        p.set_personality(g, Personality::Ib).unwrap();
    }
    let ca = CmAgent::start(p.clone(), a, 0x100).unwrap();
    let cb = CmAgent::start(p.clone(), b, 0x200).unwrap();
    // opensm's tables for ports the partitions file names only in 0x0010:
    // limited members of the default partition, full members of 0x0010.
    let table = [Pkey(0x7fff), Pkey(0x8010)];
    p.set_pkeys(a, &table).unwrap();
    p.set_pkeys(b, &table).unwrap();
    let requests = cb.listen(0x99);
    let server = std::thread::spawn(move || {
        let inc = requests
            .recv_timeout(Duration::from_secs(10))
            .expect("the REQ reached the passive side");
        let pkey = inc.pkey;
        assert!(inc.accept(Qpn::from_bits(0x77), Psn::new(2), Vec::new()));
        (pkey, requests)
    });
    let est = ca.connect_in_partition(
        cb.gid(),
        Pkey(0x8010),
        0x99,
        Qpn::from_bits(0x66),
        Psn::new(1),
        b"in 0x0010".to_vec(),
        Duration::from_secs(10),
    );
    let (pkey, _requests) = server.join().unwrap();
    assert_eq!(pkey, Pkey(0x8010));
    let est = est.expect("connected in the shared partition");
    assert_eq!(est.remote_qpn, Qpn::from_bits(0x77));
    // No packet of the exchange was refused by either port.
    for g in [a, b] {
        assert_eq!(p.counters(g).unwrap().pkey_violations, 0, "{g:?}");
    }
    // The disconnect goes in the partition too.
    assert!(
        ca.disconnect_wait(est.conn, Duration::from_secs(10)),
        "DREP came"
    );
}
