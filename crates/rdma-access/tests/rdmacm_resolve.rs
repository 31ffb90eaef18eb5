//! RDMA CM address and route resolution (librdmacm's rdma_resolve_addr /
//! rdma_resolve_route) over soft RoCE CAs at 127.0.176.x, and connect
//! going through them.

mod mad_common;

use mad_common::soft_pair;
use rdma_access::rdmacm::{self, ResolveError};
use rdma_access::{CmAgent, CmConfig, CmError};
use rdma_types::{Gid, Guid, Pkey, PortNum, Psn, Qpn};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn ip(h: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 176, h))
}

/// CAs 0xa and 0xb at 127.0.176.`host` and `host + 1`, their agents with
/// a packet lifetime of 14.
fn two(host: u8) -> (Arc<CmAgent>, Arc<CmAgent>) {
    let p = soft_pair(176, host, 0xa, 0xb);
    let cfg = CmConfig {
        response_timeout: rdma_types::TimeoutExp::from_bits(15),
        max_retries: rdma_types::CmRetries::from_bits(2),
        packet_life_time: rdma_types::TimeoutExp::from_bits(14),
        ..CmConfig::default()
    };
    let a = CmAgent::start_with(p.clone(), Guid(0xa), 0x100, cfg).unwrap();
    let b = CmAgent::start_with(p, Guid(0xb), 0x200, cfg).unwrap();
    (a, b)
}

#[test]
fn an_address_resolves_to_the_port_that_has_it_and_a_mapped_gid() {
    let (a, b) = two(21);
    let agents = [a.clone(), b.clone()];
    for (src, ca) in [(ip(21), Guid(0xa)), (ip(22), Guid(0xb))] {
        let r = rdmacm::resolve_addr(&agents, ip(40), Some(src)).unwrap();
        assert_eq!((r.ca, r.port, r.src, r.dst), (ca, PortNum(1), src, ip(40)));
        assert_eq!((r.sgid, r.sgid_index), (Gid::from_ip(src), 0));
    }
    let r = rdmacm::resolve_addr(&agents, ip(22), Some(ip(21))).unwrap();
    // RoCEv2: an IPv4 address is the GID ::ffff:a.b.c.d.
    let mut mapped = [0u8; 16];
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&[127, 0, 176, 22]);
    assert_eq!(r.dgid, Gid(mapped));

    // No source named: a destination on this host is served by its own
    // port, as Linux binds a local destination to the device that has it.
    let r = rdmacm::resolve_addr(&agents, ip(22), None).unwrap();
    assert_eq!((r.ca, r.src), (Guid(0xb), ip(22)));
    // An unspecified source is no source.
    let r = rdmacm::resolve_addr(&agents, ip(21), Some(Ipv4Addr::UNSPECIFIED.into())).unwrap();
    assert_eq!(r.ca, Guid(0xa));
    // References do as well as Arcs.
    assert_eq!(
        rdmacm::resolve_addr(&[&*b], ip(21), Some(ip(22)))
            .unwrap()
            .ca,
        Guid(0xb)
    );
}

#[test]
fn addresses_no_port_serves_fail_with_words() {
    let (a, b) = two(23);
    let agents = [a, b];
    let e = rdmacm::resolve_addr(&agents, ip(24), Some(ip(99))).unwrap_err();
    assert_eq!(e, ResolveError::NoDevice(ip(99)));
    assert_eq!(
        e.to_string(),
        "no local RDMA device for address 127.0.176.99"
    );
    // No source, a destination elsewhere: the kernel's source address
    // (127.0.0.1 or the like) has no CA here.
    let e = rdmacm::resolve_addr(&agents, ip(98), None).unwrap_err();
    match &e {
        ResolveError::NoDeviceForRoute { src, dst } => {
            assert_eq!(*dst, ip(98));
            assert!(src.is_loopback(), "{src}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("name the source address"), "{e}");
    for (dst, src) in [
        (IpAddr::V4(Ipv4Addr::UNSPECIFIED), Some(ip(23))),
        (IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1)), Some(ip(23))),
        ("::1".parse().unwrap(), Some(ip(23))),
    ] {
        let e = rdmacm::resolve_addr(&agents, dst, src).unwrap_err();
        assert!(
            matches!(e, ResolveError::Unreachable { .. }),
            "{dst}: {e:?}"
        );
        assert!(e.to_string().starts_with("cannot reach"), "{e}");
    }
}

#[test]
fn a_route_has_the_gids_partition_mtu_and_packet_lifetime() {
    let (a, b) = two(25);
    let r = rdmacm::resolve_addr(&[&*a, &*b], ip(26), Some(ip(25))).unwrap();
    let path = rdmacm::resolve_route(&a, &r).unwrap();
    assert_eq!(path.sgid, Gid::from_ip(ip(25)));
    assert_eq!(path.dgid, Gid::from_ip(ip(26)));
    assert_eq!(path.pkey, Pkey::DEFAULT);
    assert_eq!(path.mtu, a.mtu());
    assert_eq!(path.packet_life_time.value(), 14);
    // The route is the resolved CA's.
    let e = rdmacm::resolve_route(&b, &r).unwrap_err();
    assert_eq!(
        e,
        ResolveError::WrongDevice {
            src: ip(25),
            resolved: Guid(0xa),
            asked: Guid(0xb)
        }
    );
}

#[test]
fn connect_resolves_its_source_first() {
    let (a, b) = two(27);
    let requests = rdmacm::listen(&b, 4000);
    let server = std::thread::spawn(move || {
        let inc = requests.recv_timeout(T).expect("a request");
        // The REQ's timing is the route's.
        assert_eq!(inc.timing.packet_life_time.value(), 14);
        assert!(inc.accept(Qpn::from_bits(0x77), Psn::new(1), vec![]));
        requests
    });
    let est = rdmacm::connect(
        &a,
        ip(27),
        ip(28),
        4000,
        Qpn::from_bits(5),
        Psn::new(0),
        b"",
        T,
    )
    .unwrap();
    assert_eq!(est.remote_qpn, Qpn::from_bits(0x77));
    let requests = server.join().unwrap();
    // A source the agent's port does not have (B's, or nobody's): no REQ
    // leaves.
    for src in [ip(28), ip(97)] {
        let e = rdmacm::connect(
            &a,
            src,
            ip(28),
            4000,
            Qpn::from_bits(6),
            Psn::new(0),
            b"",
            T,
        )
        .unwrap_err();
        assert_eq!(e, CmError::Resolve(ResolveError::NoDevice(src)));
        assert_eq!(
            e.to_string(),
            format!("no local RDMA device for address {src}")
        );
    }
    assert!(
        requests.recv_timeout(Duration::from_millis(300)).is_err(),
        "a REQ went out"
    );
}
