//! ServiceRecords in the SA over the simulator: register (Set) with a
//! lease, query by ID, name or GID (Get / GetTable), replace, delete, and
//! leases that run out.

use ib_sm::sim::{gid, run_query, sm, table, N};
use ib_sm::sm::{service_comp, SA_ERR_NO_RECORDS};
use rdma_mad::sa::{SaAttr, ServiceRecord, SA_HDR_LEN};
use rdma_sim::Simulator;
use rdma_types::{Duration, Gid, Pkey};

const HOSTS: u8 = 3;
const SET: u8 = 0x02;
const GET: u8 = 0x01;
const GET_TABLE: u8 = 0x12;
const DELETE: u8 = 0x15;

fn up() -> Simulator<N> {
    let mut sim = ib_sm::sim::fabric(7, 0.0, None, HOSTS).unwrap();
    let r = sim.run_until(Duration::from_secs(10), |s| {
        ib_sm::sim::all_active(s, HOSTS)
    });
    assert_eq!(r, rdma_sim::RunOutcome::Done);
    sim
}

fn rec(id: u64, g: Gid, name: &str, lease: u32) -> [u8; ServiceRecord::LEN] {
    let mut service_name = [0u8; 64];
    service_name[..name.len()].copy_from_slice(name.as_bytes());
    let mut service_data = [0u8; 64];
    service_data[0] = id as u8;
    let r = ServiceRecord {
        service_id: id,
        service_gid: g,
        service_pkey: Pkey(0xffff),
        service_lease: lease,
        service_key: [0; 16],
        service_name,
        service_data,
    };
    let mut b = [0u8; ServiceRecord::LEN];
    r.emit(&mut b);
    b
}

/// (status, method, records) of one request from host `n`.
fn ask(
    sim: &mut Simulator<N>,
    n: u8,
    method: u8,
    mask: u64,
    data: &[u8],
) -> (u16, u8, Vec<ServiceRecord>) {
    let segs = run_query(sim, n, method, SaAttr::ServiceRecord, mask, data)
        .unwrap_or_else(|| panic!("method {method:#x} from {n} never answered"));
    let status = u16::from_be_bytes([segs[0][4], segs[0][5]]);
    let recs = if method == GET_TABLE && status == 0 {
        table(&segs).unwrap().1
    } else if status == 0 {
        vec![segs[0][SA_HDR_LEN..SA_HDR_LEN + ServiceRecord::LEN].to_vec()]
    } else {
        Vec::new()
    };
    let recs = recs
        .iter()
        .map(|b| ServiceRecord::parse(&b[..ServiceRecord::LEN]).unwrap())
        .collect();
    (status, segs[0][3], recs)
}

#[test]
fn services_register_query_replace_delete_and_expire() {
    let mut sim = up();
    // Host 2 registers two services, host 3 one; leases of 60 s and forever.
    let a = rec(0x1000, gid(2), "SRP.T10:0002c90300a00001", 60);
    let b = rec(0x2000, gid(2), "other", u32::MAX);
    let c = rec(0x1000, gid(3), "SRP.T10:0002c90300a00002", u32::MAX);
    for (n, r) in [(2, &a), (2, &b), (3, &c)] {
        let (status, method, got) = ask(&mut sim, n, SET, 0, r);
        assert_eq!((status, method), (0, 0x81), "Set answers GetResp");
        assert_eq!(
            got[0].service_name,
            ServiceRecord::parse(r).unwrap().service_name
        );
    }
    assert_eq!(sm(&mut sim).sm.stats().services, 3);

    // By ServiceID: both providers of 0x1000, in a table.
    let (status, _, got) = ask(&mut sim, 4, GET_TABLE, service_comp::ID, &a);
    assert_eq!(status, 0);
    let mut gids: Vec<Gid> = got.iter().map(|r| r.service_gid).collect();
    gids.sort_by_key(|g| g.0);
    assert_eq!(gids, vec![gid(2), gid(3)]);
    // By name: exactly one, with its data.
    let (status, _, got) = ask(&mut sim, 4, GET, service_comp::NAME, &c);
    assert_eq!(status, 0);
    assert_eq!((got[0].service_gid, got[0].service_data[0]), (gid(3), 0x00));
    // By GID: host 2's two.
    let (_, _, got) = ask(&mut sim, 4, GET_TABLE, service_comp::GID, &b);
    assert_eq!(got.len(), 2);
    // Nothing by an unknown ID.
    let (status, _, _) = ask(
        &mut sim,
        4,
        GET,
        service_comp::ID,
        &rec(0x9999, gid(2), "", 0),
    );
    assert_eq!(status, SA_ERR_NO_RECORDS);

    // Registering the same ID, GID and P_Key again replaces the record.
    let a2 = rec(0x1000, gid(2), "renamed", 60);
    assert_eq!(ask(&mut sim, 2, SET, 0, &a2).0, 0);
    let (_, _, got) = ask(
        &mut sim,
        4,
        GET_TABLE,
        service_comp::ID | service_comp::GID,
        &a2,
    );
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].service_name[..7], b"renamed");

    // Delete answers DeleteResp with what it removed.
    let (status, method, got) = ask(
        &mut sim,
        2,
        DELETE,
        service_comp::ID | service_comp::GID | service_comp::PKEY,
        &b,
    );
    assert_eq!((status, method, got.len()), (0, 0x95, 1));
    let (status, _, _) = ask(&mut sim, 4, GET, service_comp::ID, &b);
    assert_eq!(status, SA_ERR_NO_RECORDS, "deleted");
    // Deleting it again finds nothing.
    assert_eq!(
        ask(
            &mut sim,
            2,
            DELETE,
            service_comp::ID | service_comp::GID,
            &b
        )
        .0,
        SA_ERR_NO_RECORDS
    );

    // 61 s later the 60 s lease of host 2's 0x1000 has run out; host 3's
    // indefinite one stays.
    let until = sim.now() + Duration::from_secs(61);
    sim.run_until(Duration::from_secs(62), |s| s.now() >= until);
    let (_, _, got) = ask(&mut sim, 4, GET_TABLE, service_comp::ID, &a);
    assert_eq!(
        got.iter().map(|r| r.service_gid).collect::<Vec<_>>(),
        vec![gid(3)]
    );
    assert_eq!(sm(&mut sim).sm.stats().services, 1);
}

#[test]
fn a_short_service_record_is_refused() {
    let mut sim = up();
    let segs = run_query(&mut sim, 2, SET, SaAttr::ServiceRecord, 0, &[0u8; 10]).unwrap();
    // The MAD is padded to 256 bytes, so the record parses; a SET with a
    // zero record is still a valid registration of service 0. What must
    // never happen is no answer, or a crash.
    assert_eq!(u16::from_be_bytes([segs[0][4], segs[0][5]]) & 0x7fff, 0);
}
