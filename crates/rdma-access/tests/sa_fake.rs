//! The SA client against a fake SA on the other port (loopback provider
//! and soft RoCE on 127.0.111.x): paths (one by Get, several by an RMPP
//! GetTable bigger than one MAD), node records, port-info records matched
//! by capability mask, service records, an InformInfo subscription whose
//! Report is answered with a ReportResp and delivered once; the GetTable
//! reassembles under 5 % MAD loss too.

mod mad_common;
use mad_common::{pair, Kind, Pair};
use rdma_access::gsi::status_reply;
use rdma_access::sa::{
    node_comp, path_comp, portinfo_comp, service_comp, PathQuery, SaClient, SaTiming,
    NODE_RECORD_LEN, PORTINFO_RECORD_LEN,
};
use rdma_mad::mad::{MadStatus, Method, StatusCode};
use rdma_mad::sa::{InformInfo, PathRecord, SaAttr, SaHeader, ServiceRecord, SA_HDR_LEN};
use rdma_mad::smp::{NodeInfo, Notice, PortInfo};
use rdma_types::{Gid, Guid, Pkey};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CAP_DM: u32 = 1 << 19;

fn node_record(k: u16) -> Vec<u8> {
    let mut b = vec![0u8; NODE_RECORD_LEN];
    b[0..2].copy_from_slice(&k.to_be_bytes());
    NodeInfo {
        base_version: 1,
        class_version: 1,
        node_type: 1,
        num_ports: 1,
        system_image_guid: Guid(0x100 + u64::from(k)),
        node_guid: Guid(0x100 + u64::from(k)),
        port_guid: Guid(0x200 + u64::from(k)),
        partition_cap: 1,
        device_id: 0,
        revision: 0,
        local_port_num: 1,
        vendor_id: 0x2c9,
    }
    .emit(&mut b[4..44]);
    let d = format!("node {k}");
    b[44..44 + d.len()].copy_from_slice(d.as_bytes());
    b
}

fn port_record(lid: u16, caps: u32) -> Vec<u8> {
    let mut b = vec![0u8; PORTINFO_RECORD_LEN];
    b[0..2].copy_from_slice(&lid.to_be_bytes());
    b[2] = 1;
    let mut p = PortInfo::new_checked(&mut b[4..68]).unwrap();
    p.set_lid(lid);
    p.set_capability_mask(caps);
    b
}

fn service(id: u64, name: &str) -> ServiceRecord {
    let mut service_name = [0u8; 64];
    service_name[..name.len()].copy_from_slice(name.as_bytes());
    ServiceRecord {
        service_id: id,
        service_gid: Gid([7; 16]),
        service_pkey: Pkey(0xffff),
        service_lease: 0xffff_ffff,
        service_key: [0; 16],
        service_name,
        service_data: [0; 64],
    }
}

/// The fake SA's counters.
#[derive(Default)]
struct Seen {
    tables: AtomicU32,
    reports_answered: AtomicU32,
}

/// Serves SA queries on port A until `stop`; after a subscription it
/// sends one Report (trap 64) and counts its ReportResp.
fn fake_sa(p: &Pair, stop: Arc<AtomicBool>, seen: Arc<Seen>) -> std::thread::JoinHandle<()> {
    let agent = p.a.mad_agent(0x03, 2, &[0x01, 0x02, 0x12]).unwrap();
    std::thread::spawn(move || {
        let t = Duration::from_millis(40);
        while !stop.load(Ordering::Relaxed) {
            let Some((peer, req)) = agent.recv(Duration::from_millis(20)) else {
                continue;
            };
            let hdr = SaHeader::parse(&req[..]).unwrap();
            let data = &req[SA_HDR_LEN..];
            let method = Method::from(req[3]);
            let attr = SaAttr::from(u16::from_be_bytes([req[16], req[17]]));
            let (recs, len): (Vec<Vec<u8>>, usize) = match attr {
                SaAttr::PathRecord => {
                    let q = PathRecord::parse(data).unwrap();
                    assert_ne!(hdr.comp_mask & path_comp::SGID, 0);
                    assert_ne!(hdr.comp_mask & path_comp::DGID, 0);
                    let n = if hdr.comp_mask & path_comp::NUMB_PATH != 0 {
                        q.numb_path
                    } else {
                        1
                    };
                    let recs = (0..n)
                        .map(|k| {
                            let mut r = q;
                            r.slid = 1;
                            r.dlid = 2;
                            r.sl = k % 16;
                            r.numb_path = 0;
                            r.mtu = 5;
                            r.service_id = u64::from(k);
                            let mut b = vec![0u8; PathRecord::LEN];
                            r.emit(&mut b);
                            b
                        })
                        .collect();
                    (recs, PathRecord::LEN)
                }
                SaAttr::NodeRecord => {
                    let want = u16::from_be_bytes([data[0], data[1]]);
                    let recs = (1..=3u16)
                        .filter(|&k| hdr.comp_mask & node_comp::LID == 0 || k == want)
                        .map(node_record)
                        .collect();
                    (recs, NODE_RECORD_LEN)
                }
                SaAttr::PortInfoRecord => {
                    let want = PortInfo::new_checked(&data[4..68])
                        .unwrap()
                        .capability_mask();
                    let recs = [(1u16, CAP_DM | 1), (2, 1), (3, CAP_DM), (4, 0)]
                        .into_iter()
                        .filter(|&(_, c)| {
                            hdr.comp_mask & portinfo_comp::CAPMASK == 0 || c & want == want
                        })
                        .map(|(l, c)| port_record(l, c))
                        .collect();
                    (recs, PORTINFO_RECORD_LEN)
                }
                SaAttr::ServiceRecord => {
                    let id = u64::from_be_bytes(data[0..8].try_into().unwrap());
                    let recs = [service(0x10, "srp a"), service(0x11, "srp b")]
                        .into_iter()
                        .filter(|s| hdr.comp_mask & service_comp::ID == 0 || s.service_id == id)
                        .map(|s| {
                            let mut b = vec![0u8; ServiceRecord::LEN];
                            s.emit(&mut b);
                            b
                        })
                        .collect();
                    (recs, ServiceRecord::LEN)
                }
                SaAttr::InformInfo if method == Method::Set => {
                    let info = InformInfo::parse(data).unwrap();
                    let mut r = status_reply(&req, MadStatus::OK);
                    r[SA_HDR_LEN..].copy_from_slice(&req[SA_HDR_LEN..]);
                    agent.send(peer, r);
                    if info.subscribe == 1 {
                        let mut m = [0u8; 256];
                        m[..4].copy_from_slice(&[1, 0x03, 2, u8::from(Method::Report)]);
                        m[16..18].copy_from_slice(&u16::from(SaAttr::Notice).to_be_bytes());
                        let mut details = [0u8; 54];
                        details[6..22].copy_from_slice(&info.gid.0);
                        Notice {
                            is_generic: true,
                            notice_type: 3,
                            producer_type: 4,
                            trap_number: info.trap_number,
                            issuer_lid: 1,
                            toggle: false,
                            count: 0,
                            data_details: details,
                            issuer_gid: Gid([0; 16]),
                        }
                        .emit(&mut m[SA_HDR_LEN..SA_HDR_LEN + Notice::LEN]);
                        let resp = agent.request(peer, m, t, 20).unwrap();
                        assert_eq!(resp[3], u8::from(Method::ReportResp));
                        assert_eq!(resp[SA_HDR_LEN..], m[SA_HDR_LEN..], "notice echoed");
                        seen.reports_answered.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                _ => {
                    let r = status_reply(
                        &req,
                        MadStatus::from_code(StatusCode::MethodAttrUnsupported),
                    );
                    agent.send(peer, r);
                    continue;
                }
            };
            let stride = len.div_ceil(8) * 8;
            let mut head = status_reply(&req, MadStatus::OK);
            SaHeader {
                attr_offset: (stride / 8) as u16,
                ..hdr
            }
            .emit(&mut head);
            if method == Method::Get {
                if let Some(r) = recs.first() {
                    head[SA_HDR_LEN..SA_HDR_LEN + r.len()].copy_from_slice(r);
                } else {
                    head[4..6].copy_from_slice(&0x0300u16.to_be_bytes());
                }
                agent.send(peer, head);
                continue;
            }
            let mut table = vec![0u8; recs.len() * stride];
            for (k, r) in recs.iter().enumerate() {
                table[k * stride..k * stride + r.len()].copy_from_slice(r);
            }
            seen.tables.fetch_add(1, Ordering::Relaxed);
            agent
                .send_rmpp(peer, &head[..SA_HDR_LEN], &table, t, 10)
                .unwrap();
        }
    })
}

fn timing() -> SaTiming {
    SaTiming {
        timeout: Duration::from_millis(60),
        retries: 20,
    }
}

fn queries(kind: Kind, host: u8) {
    let p = pair(kind, host, 0.0);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let sa = fake_sa(&p, stop.clone(), seen.clone());
    let c = SaClient::new(&p.b, p.a.gid(), timing()).unwrap();
    // A second client on the port would take the same Report method.
    assert!(SaClient::new(&p.b, p.a.gid(), timing()).is_err());
    let q = PathQuery {
        sgid: p.b.gid(),
        dgid: p.a.gid(),
        max_paths: 1,
        pkey: None,
        service_id: None,
    };
    let one = c.path_records(&q).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].sgid, one[0].dgid, one[0].dlid), (q.sgid, q.dgid, 2));
    // Twelve paths: 768 bytes, four RMPP segments.
    let before = p.b.gsi_stats().rmpp_segments_in;
    let many = c.path_records(&PathQuery { max_paths: 12, ..q }).unwrap();
    assert_eq!(many.len(), 12);
    assert_eq!(
        many.iter().map(|r| r.service_id).collect::<Vec<_>>(),
        (0..12).collect::<Vec<u64>>()
    );
    assert!(many.iter().all(|r| r.sgid == q.sgid && r.dgid == q.dgid));
    assert_eq!(p.b.gsi_stats().rmpp_segments_in - before, 4);
    // The SA sees the last ACK of its one transfer (the Get was one MAD).
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while p.a.gsi_stats().rmpp_sent < 1 {
        assert!(std::time::Instant::now() < end, "no final ACK");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(p.a.gsi_stats().rmpp_sent, 1);
    assert_eq!(
        p.a.gsi_stats().rmpp_segments_out,
        4,
        "no resends without loss"
    );

    let nodes = c.node_records(None).unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.lid, n.description.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "node 1"), (2, "node 2"), (3, "node 3")]
    );
    assert_eq!(nodes[1].info.port_guid, Guid(0x202));
    let n2 = c.node_records(Some(2)).unwrap();
    assert_eq!(n2.len(), 1);
    assert_eq!(n2[0].lid, 2);

    let dm_ports = c.port_info_records(None, Some(CAP_DM)).unwrap();
    assert_eq!(
        dm_ports.iter().map(|r| r.lid).collect::<Vec<_>>(),
        vec![1, 3]
    );
    assert!(dm_ports.iter().all(|r| r.capability_mask() & CAP_DM != 0));
    assert_eq!(c.port_info_records(None, None).unwrap().len(), 4);

    let svcs = c.service_records(Some(0x11), None).unwrap();
    assert_eq!(svcs.len(), 1);
    assert_eq!(svcs[0].name(), "srp b");
    assert_eq!(c.service_records(None, None).unwrap().len(), 2);

    // Subscribe: the SA's Report is answered and delivered once.
    let notices = c.notices().unwrap();
    c.subscribe(64).unwrap();
    let (from, n) = notices.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(from, p.a.gid());
    assert_eq!(n.trap_number, 64);
    assert_eq!(&n.data_details[6..22], &p.b.gid().0);
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while seen.reports_answered.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < end,
            "no ReportResp reached the SA"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    c.unsubscribe(64).unwrap();
    assert!(notices.recv_timeout(Duration::from_millis(100)).is_err());
    stop.store(true, Ordering::Relaxed);
    sa.join().unwrap();
}

fn table_under_loss(kind: Kind, host: u8) {
    let p = pair(kind, host, 0.05);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let sa = fake_sa(&p, stop.clone(), seen.clone());
    let c = SaClient::new(&p.b, p.a.gid(), timing()).unwrap();
    let q = PathQuery {
        sgid: p.b.gid(),
        dgid: p.a.gid(),
        max_paths: 40, // 2560 bytes: 13 segments
        pkey: None,
        service_id: None,
    };
    for _ in 0..6 {
        let got = c.path_records(&q).unwrap();
        assert_eq!(
            got.iter().map(|r| r.service_id).collect::<Vec<_>>(),
            (0..40).collect::<Vec<u64>>()
        );
    }
    let (a, b) = (p.a.gsi_stats(), p.b.gsi_stats());
    eprintln!("{kind:?} under loss: SA {a:?}\n client {b:?}");
    assert!(
        a.rmpp_segments_out > 6 * 13 || b.retries > 0,
        "5 % loss over ~160 MADs cost resends: {a:?} {b:?}"
    );
    stop.store(true, Ordering::Relaxed);
    sa.join().unwrap();
}

#[test]
fn sa_queries_and_notices_over_loopback() {
    queries(Kind::Loopback, 0);
}

#[test]
fn sa_queries_and_notices_over_soft_roce() {
    queries(Kind::SoftRoce, 11);
}

#[test]
fn sa_rmpp_table_under_five_percent_loss_over_loopback() {
    table_under_loss(Kind::Loopback, 0);
}

#[test]
fn sa_rmpp_table_under_five_percent_loss_over_soft_roce() {
    table_under_loss(Kind::SoftRoce, 13);
}
