//! MAD agents sharing QP1 with the CM, over the soft RoCE NIC on loopback
//! addresses: a DM agent answers discovery for a registered I/O
//! controller, unserved classes get status replies, a request to nobody
//! retries and times out, an RDMA CM connection works on the same QP1
//! meanwhile, and discovery completes under 5 % loss both ways.

use rdma_access::dm::{query_iocs, DmService, Ioc};
use rdma_access::{rdmacm, CmAgent, CmError};
use rdma_mad::dm::{IocProfile, ServiceEntry, IO_CLASS_SRP};
use rdma_sim::FaultConfig;
use rdma_types::{Gid, Guid, Psn, Qpn};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pair(net: u8, loss: f64) -> (Arc<CmAgent>, Arc<CmAgent>, IpAddr, IpAddr) {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, net, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, net, 2));
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
    if loss > 0.0 {
        for (g, seed) in [(0xa, 7), (0xb, 8)] {
            let f = FaultConfig {
                seed,
                loss,
                ..Default::default()
            };
            p.set_faults(Guid(g), Some(f)).unwrap();
        }
    }
    let a = CmAgent::start(p.clone(), Guid(0xa), 0x1000).unwrap();
    let b = CmAgent::start(p, Guid(0xb), 0x2000).unwrap();
    (a, b, a_ip, b_ip)
}

fn srp_ioc(guid: u64) -> Ioc {
    let mut id_string = [0u8; 64];
    id_string[..9].copy_from_slice(b"test IOC ");
    Ioc {
        profile: IocProfile {
            guid: Guid(guid),
            vendor_id: 0x2c9,
            device_id: 0x1,
            device_version: 1,
            subsys_vendor_id: 0,
            subsys_device_id: 0,
            io_class: IO_CLASS_SRP,
            io_subclass: 0x609e,
            protocol: 0x0108,
            protocol_version: 1,
            send_queue_depth: 128,
            rdma_read_depth: 4,
            send_size: 4148,
            rdma_size: 65536,
            cap_mask: 0x33,
            service_entries: 0,
            id_string,
        },
        // Six entries: two ServiceEntries MADs (four per MAD).
        services: (0..6u64)
            .map(|k| ServiceEntry::srp(guid + k, guid))
            .collect(),
    }
}

const T: Duration = Duration::from_millis(200);

#[test]
fn dm_discovery_status_replies_timeouts_and_cm_share_qp1() {
    let (a, b, a_ip, b_ip) = pair(115, 0.0);
    let dm = DmService::start(&a).unwrap();
    // A second DM server on the same port is refused.
    assert!(matches!(DmService::start(&a), Err(CmError::Mad(_))));
    let ioc = dm.register_ioc(srp_ioc(0x0002_c903_00a0_0001)).unwrap();
    assert_eq!(ioc.slot(), 1);

    let found = query_iocs(&b, a.gid(), T, 3).unwrap();
    assert_eq!(found.len(), 1);
    let (slot, got) = &found[0];
    assert_eq!(*slot, 1);
    assert_eq!(got.profile.guid, Guid(0x0002_c903_00a0_0001));
    assert_eq!(got.profile.io_class, IO_CLASS_SRP);
    assert_eq!(got.profile.service_entries, 6);
    assert_eq!(got.services, srp_ioc(0x0002_c903_00a0_0001).services);
    assert_eq!(got.services[0].name_str(), "SRP.T10:0002C90300A00001");

    // The controller leaves with its handle.
    drop(ioc);
    assert!(query_iocs(&b, a.gid(), T, 3).unwrap().is_empty());

    // A class nobody serves: the port answers "bad version" at once.
    let perf = b.mad_agent(0x04, 1, &[]).unwrap();
    let mut get = rdma_access::dm::get_request(rdma_mad::dm::DmAttr::ClassPortInfo, 0);
    get[1] = 0x04;
    let r = perf.request(a.gid(), get, T, 0).unwrap();
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0x0004));
    assert!(a.gsi_stats().status_replies >= 1);

    // Nobody at this address: three retries, then a timeout.
    let nobody = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 115, 9)));
    let start = Instant::now();
    let before = b.gsi_stats().retries;
    assert_eq!(
        query_iocs(&b, nobody, Duration::from_millis(50), 3),
        Err(CmError::TimedOut)
    );
    assert_eq!(b.gsi_stats().retries - before, 3);
    assert!(start.elapsed() >= Duration::from_millis(150));

    // The CM on the same QP1 still connects.
    let requests = rdmacm::listen(&a, 5555);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(Duration::from_secs(10)).unwrap();
        let req = rdmacm::decode(inc).map_err(|(_, e)| e).unwrap();
        req.incoming
            .accept(Qpn::from_bits(0x77), Psn::new(1), Vec::new())
    });
    let est = rdmacm::connect(
        &b,
        b_ip,
        a_ip,
        5555,
        Qpn::from_bits(0x42),
        Psn::new(2),
        b"hello",
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(server.join().unwrap());
    assert_eq!(est.remote_qpn, Qpn::from_bits(0x77));
    drop(dm);
}

#[test]
fn dm_discovery_completes_under_five_percent_loss() {
    let (a, b, _, _) = pair(116, 0.05);
    let dm = DmService::start(&a).unwrap();
    let _ioc = dm.register_ioc(srp_ioc(0x77)).unwrap();
    let _ioc2 = dm.register_ioc(srp_ioc(0x78)).unwrap();
    for _ in 0..10 {
        let found = query_iocs(&b, a.gid(), Duration::from_millis(30), 20).unwrap();
        assert_eq!(
            found
                .iter()
                .map(|(s, i)| (*s, i.services.len()))
                .collect::<Vec<_>>(),
            vec![(1, 6), (2, 6)]
        );
    }
    assert!(
        b.gsi_stats().retries > 0,
        "5 % loss over 80 MADs cost retries"
    );
}
