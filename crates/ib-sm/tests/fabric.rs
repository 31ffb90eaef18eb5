//! The subnet manager over the simulator (`ib_sm::sim`): an SM and four
//! hosts, each host a subnet management agent plus a small SA client.

use ib_sm::sim::{addr, gid, host, port_guid, sm, N};
use ib_sm::sm::{path_comp, portinfo_comp, SA_ERR_NO_RECORDS};
use ib_sm::SmEvent;
use rdma_access::gsi::MadBytes;
use rdma_access::sma::state;
use rdma_mad::rmpp::RmppHeader;
use rdma_mad::sa::{PathRecord, SaAttr, SaHeader, SA_HDR_LEN};
use rdma_mad::smp::{cap, BadKeyTrap, NodeInfo, PortInfo};
use rdma_sim::Simulator;
use rdma_types::{Duration, Guid, Pkey};

const HOSTS: u8 = 4;

fn fabric(seed: u64, loss: f64, partitions: Option<&str>) -> Simulator<N> {
    ib_sm::sim::fabric(seed, loss, partitions, HOSTS).unwrap()
}

fn all_active(sim: &mut Simulator<N>) -> bool {
    ib_sm::sim::all_active(sim, HOSTS)
}

fn run_query(
    sim: &mut Simulator<N>,
    n: u8,
    method: u8,
    attr: SaAttr,
    mask: u64,
    data: &[u8],
) -> Vec<MadBytes> {
    ib_sm::sim::run_query(sim, n, method, attr, mask, data)
        .unwrap_or_else(|| panic!("query {attr:?} from {n} never finished"))
}

fn table(segs: &[MadBytes]) -> (SaHeader, Vec<Vec<u8>>) {
    ib_sm::sim::table(segs).unwrap()
}

fn subscribe(sim: &mut Simulator<N>, n: u8) {
    assert!(
        ib_sm::sim::subscribe(sim, n),
        "InformInfo subscription refused"
    );
}

#[test]
fn sm_brings_ports_active_and_sa_answers_paths_and_port_records() {
    let mut sim = fabric(1, 0.0, None);
    let r = sim.run_until(Duration::from_secs(10), all_active);
    assert_eq!(r, rdma_sim::RunOutcome::Done);
    let mut lids: Vec<u16> = (2..2 + HOSTS)
        .map(|n| host(&mut sim, n).sma.lid())
        .collect();
    assert!(lids.iter().all(|l| *l > 1), "{lids:?}");
    lids.sort();
    lids.dedup();
    assert_eq!(lids.len(), usize::from(HOSTS), "unique LIDs");
    assert!((2..2 + HOSTS).all(|n| host(&mut sim, n).sma.sm_lid() == 1));
    assert_eq!(
        host(&mut sim, 3).sma.pkeys()[0],
        Pkey(0xffff),
        "default partition, full"
    );

    // PathRecord Get from host 3 to host 5's GID.
    let mut q = [0u8; 64];
    q[8..24].copy_from_slice(&gid(5).0);
    let segs = run_query(&mut sim, 3, 0x01, SaAttr::PathRecord, path_comp::DGID, &q);
    let p = PathRecord::parse(&segs[0][SA_HDR_LEN..]).unwrap();
    assert_eq!((p.sgid, p.dgid), (gid(3), gid(5)));
    assert_eq!(p.dlid, host(&mut sim, 5).sma.lid());
    assert_eq!(p.slid, host(&mut sim, 3).sma.lid());
    assert_eq!(p.pkey, Pkey(0xffff));

    // GetTable of every path from host 3: four destinations (itself too).
    let segs = run_query(&mut sim, 3, 0x12, SaAttr::PathRecord, 0, &[0u8; 64]);
    let (_, recs) = table(&segs);
    assert_eq!(recs.len(), usize::from(HOSTS));

    // NodeRecord table: 4 records of 112 bytes need 3 RMPP segments.
    let segs = run_query(&mut sim, 4, 0x12, SaAttr::NodeRecord, 0, &[0u8; 108]);
    assert!(segs.len() >= 2, "RMPP: {} segments", segs.len());
    let (hdr, recs) = table(&segs);
    assert_eq!(hdr.attr_offset, 14);
    let guids: Vec<Guid> = recs
        .iter()
        .map(|r| NodeInfo::parse(&r[4..44]).unwrap().port_guid)
        .collect();
    assert_eq!(guids.len(), usize::from(HOSTS));
    assert!(guids.contains(&port_guid(5)));

    // PortInfoRecord with capability-mask matching: only host 2 does DM.
    let mut q = [0u8; 68];
    PortInfo::new_checked(&mut q[4..68])
        .unwrap()
        .set_capability_mask(cap::IS_DEVICE_MGMT_SUPPORTED);
    let segs = run_query(
        &mut sim,
        5,
        0x12,
        SaAttr::PortInfoRecord,
        portinfo_comp::CAPMASK,
        &q,
    );
    let (_, recs) = table(&segs);
    assert_eq!(recs.len(), 1);
    let lid2 = host(&mut sim, 2).sma.lid();
    assert_eq!(u16::from_be_bytes([recs[0][0], recs[0][1]]), lid2);

    // A Get that matches nothing: ERR_NO_RECORDS; an unknown attribute.
    let mut q = [0u8; 64];
    q[8..24].copy_from_slice(&gid(99).0);
    let segs = run_query(&mut sim, 3, 0x01, SaAttr::PathRecord, path_comp::DGID, &q);
    assert_eq!(
        u16::from_be_bytes([segs[0][4], segs[0][5]]),
        SA_ERR_NO_RECORDS
    );
    let segs = run_query(&mut sim, 3, 0x01, SaAttr::from(0x0038), 0, &[]);
    assert_eq!(u16::from_be_bytes([segs[0][4], segs[0][5]]), 0x000C);
}

#[test]
fn a_port_that_leaves_and_returns_gives_traps_65_then_64() {
    let mut sim = fabric(2, 0.0, None);
    assert_eq!(
        sim.run_until(Duration::from_secs(10), all_active),
        rdma_sim::RunOutcome::Done
    );
    subscribe(&mut sim, 3);
    let lid4 = host(&mut sim, 4).sma.lid();
    // Host 4's link to the SM goes down: the next sweep misses it.
    sim.set_link_up(addr(1).ip(), addr(4).ip(), false);
    let r = sim.run_until(Duration::from_secs(10), |s| {
        host(s, 3).notices.iter().any(|n| n.trap_number == 65)
    });
    assert_eq!(r, rdma_sim::RunOutcome::Done, "no trap 65");
    let n = host(&mut sim, 3).notices.last().copied().unwrap();
    assert_eq!(n.trap_gid(), Some(gid(4)));
    assert!(sm(&mut sim)
        .events
        .contains(&SmEvent::PortDown { guid: port_guid(4) }));
    assert_eq!(sm(&mut sim).sm.active_ports().len(), usize::from(HOSTS) - 1);
    // It comes back (its link retrained into INIT): trap 64, same LID.
    host(&mut sim, 4).sma.link_retrained();
    sim.set_link_up(addr(1).ip(), addr(4).ip(), true);
    let r = sim.run_until(Duration::from_secs(10), |s| {
        host(s, 3)
            .notices
            .iter()
            .filter(|n| n.trap_number == 64)
            .count()
            >= 1
            && host(s, 4).sma.port_state() == state::ACTIVE
    });
    assert_eq!(r, rdma_sim::RunOutcome::Done, "no trap 64");
    let n = host(&mut sim, 3).notices.last().copied().unwrap();
    assert_eq!((n.trap_number, n.trap_gid()), (64, Some(gid(4))));
    assert_eq!(
        host(&mut sim, 4).sma.lid(),
        lid4,
        "the LID is kept per port GUID"
    );
}

#[test]
fn partitions_program_pkey_tables_and_limit_paths() {
    // Hosts 2 and 3 in "storage" (2 full, 3 limited), 4 limited too; host
    // 5 a full member of the default partition, the others limited ones.
    let parts = format!(
        "Default=0x7fff : {:#x}=full ;\nstorage=0x0010 : {:#x}=full, {:#x}, {:#x} ;",
        port_guid(5).0,
        port_guid(2).0,
        port_guid(3).0,
        port_guid(4).0
    );
    let mut sim = fabric(3, 0.0, Some(&parts));
    assert_eq!(
        sim.run_until(Duration::from_secs(10), all_active),
        rdma_sim::RunOutcome::Done
    );
    // The default partition in entry 0 of every table: a limited member
    // where the file does not name the port (opensm's rule).
    let table = |sim: &mut Simulator<N>, h| host(sim, h).sma.pkeys()[..3].to_vec();
    let (full, limited) = (|k: u16| Pkey(0x8000 | k), Pkey);
    let default = limited(0x7fff);
    assert_eq!(table(&mut sim, 2), [default, full(0x10), Pkey(0)]);
    assert_eq!(table(&mut sim, 3), [default, limited(0x10), Pkey(0)]);
    assert_eq!(table(&mut sim, 5), [full(0x7fff), Pkey(0), Pkey(0)]);
    let path = |sim: &mut Simulator<N>, from: u8, to: u8| {
        let mut q = [0u8; 64];
        q[8..24].copy_from_slice(&gid(to).0);
        let segs = run_query(sim, from, 0x01, SaAttr::PathRecord, path_comp::DGID, &q);
        let st = u16::from_be_bytes([segs[0][4], segs[0][5]]);
        (st == 0).then(|| PathRecord::parse(&segs[0][SA_HDR_LEN..]).unwrap().pkey)
    };
    assert_eq!(path(&mut sim, 3, 2), Some(Pkey(0x8010)), "limited to full");
    assert_eq!(path(&mut sim, 3, 4), None, "limited to limited");
    assert_eq!(
        path(&mut sim, 3, 5),
        Some(Pkey(0xffff)),
        "the default partition, 5 its full member"
    );
}

/// A port's SMA reports packets its port dropped for their P_Key by trap
/// 257: the SM represses it, counts it, names the offending port from the
/// GID in its details, and forwards it to subscribers.
#[test]
fn a_bad_pkey_trap_is_logged_with_the_offender_and_forwarded() {
    let mut sim = fabric(7, 0.0, None);
    assert_eq!(
        sim.run_until(Duration::from_secs(10), all_active),
        rdma_sim::RunOutcome::Done
    );
    subscribe(&mut sim, 2);
    let lid3 = host(&mut sim, 3).sma.lid();
    let now = sim.now();
    let bad = BadKeyTrap {
        key: 0x7fff,
        qp1: 1,
        qp2: 1,
        gid1: gid(4),
        gid2: gid(3),
        ..Default::default()
    };
    host(&mut sim, 3).note_pkey_violations(now, 2, bad);
    let r = sim.run_until(Duration::from_secs(5), |s| {
        host(s, 3).sma.trap().is_none() && host(s, 2).notices.iter().any(|n| n.trap_number == 257)
    });
    assert_eq!(r, rdma_sim::RunOutcome::Done, "not repressed or forwarded");
    assert_eq!(host(&mut sim, 3).sma.pkey_violations(), 2);
    let n = *host(&mut sim, 2)
        .notices
        .iter()
        .find(|n| n.trap_number == 257)
        .unwrap();
    assert_eq!(
        (n.issuer_lid, n.issuer_gid, n.notice_type),
        (lid3, gid(3), 2)
    );
    assert_eq!(
        BadKeyTrap::parse(&n.data_details),
        BadKeyTrap { lid2: lid3, ..bad }
    );
    let master = sm(&mut sim);
    assert_eq!(master.sm.stats().bad_pkey_traps, 1);
    assert!(
        master.events.contains(&SmEvent::BadPkey {
            guid: port_guid(3),
            pkey: Pkey(0x7fff),
            from: gid(4),
            from_guid: Some(port_guid(4)),
            src_qp: 1,
            dest_qp: 1,
        }),
        "{:?}",
        master.events
    );
}

#[test]
fn the_fabric_converges_and_answers_under_five_percent_loss() {
    let mut retries = 0;
    for seed in [11, 12, 13] {
        let mut sim = fabric(seed, 0.05, None);
        let r = sim.run_until(Duration::from_secs(30), all_active);
        assert_eq!(r, rdma_sim::RunOutcome::Done, "seed {seed}");
        let segs = run_query(&mut sim, 4, 0x12, SaAttr::NodeRecord, 0, &[0u8; 108]);
        let (_, recs) = table(&segs);
        assert_eq!(recs.len(), usize::from(HOSTS), "seed {seed}");
        retries += sm(&mut sim).sm.stats().retries;
    }
    assert!(retries > 0, "5 % loss over three runs cost no resend");
}

/// Every SMP and SA MAD of a sweep, queries, a subscription and traps,
/// as tshark sees them: no malformed packet or expert warning, and the
/// classes and attributes are the ones we meant.
#[test]
fn tshark_decodes_the_sms_smps_and_sa_mads() {
    let mut sim = fabric(5, 0.0, None);
    assert_eq!(
        sim.run_until(Duration::from_secs(10), all_active),
        rdma_sim::RunOutcome::Done
    );
    subscribe(&mut sim, 3);
    let mut q = [0u8; 64];
    q[8..24].copy_from_slice(&gid(5).0);
    run_query(&mut sim, 3, 0x01, SaAttr::PathRecord, path_comp::DGID, &q);
    run_query(&mut sim, 4, 0x12, SaAttr::NodeRecord, 0, &[0u8; 108]);
    run_query(&mut sim, 4, 0x12, SaAttr::PortInfoRecord, 0, &[0u8; 68]);
    sim.set_link_up(addr(1).ip(), addr(4).ip(), false);
    sim.run_until(Duration::from_secs(10), |s| {
        host(s, 3).notices.iter().any(|n| n.trap_number == 65)
    });
    let log = sm(&mut sim).log.clone();
    // tshark does not reassemble RMPP: a segment of a multi-MAD table,
    // which cuts records where the 200-byte segment ends (as Linux and
    // opensm do), decodes with "trailing stray characters". Those are
    // checked apart: RMPP DATA of the SA, not malformed.
    let multi =
        |m: &MadBytes| RmppHeader::parse(m).is_ok_and(|h| h.active() && h.flags & 0x6 != 0x6);
    let (segments, log): (Vec<_>, Vec<_>) = log.into_iter().partition(|(_, m)| multi(m));
    assert!(
        segments.len() >= 3,
        "the NodeRecord table took several segments"
    );
    let frames: Vec<Vec<u8>> = log
        .iter()
        .enumerate()
        .map(|(i, (qp, m))| rdma_testkit::mad_frame(*qp, m, i as u32))
        .collect();
    let path = std::env::temp_dir().join(format!("ib-sm-tshark-{}.pcap", std::process::id()));
    std::fs::write(&path, rdma_testkit::pcap(&frames)).unwrap();
    let rows = rdma_testkit::tshark_fields(
        "tshark_decodes_the_sms_smps_and_sa_mads",
        &path,
        &[],
        &["infiniband.mad.mgmtclass", "infiniband.mad.attributeid"],
    );
    let seg_frames: Vec<Vec<u8>> = segments
        .iter()
        .enumerate()
        .map(|(i, (qp, m))| rdma_testkit::mad_frame(*qp, m, i as u32))
        .collect();
    std::fs::write(&path, rdma_testkit::pcap(&seg_frames)).unwrap();
    let seg_rows = std::process::Command::new(rdma_testkit::TSHARK)
        .arg("-r")
        .arg(&path)
        .args([
            "-T",
            "fields",
            "-e",
            "infiniband.mad.mgmtclass",
            "-e",
            "infiniband.rmpp.rmpptype",
        ])
        .args(["-e", "_ws.malformed"])
        .output();
    let _ = std::fs::remove_file(&path);
    let Some(rows) = rows else { return };
    let seg_rows = String::from_utf8_lossy(&seg_rows.unwrap().stdout).to_string();
    assert_eq!(seg_rows.lines().count(), segments.len());
    for l in seg_rows.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(
            (f[0], f[1], f.get(2).copied().unwrap_or("")),
            ("0x03", "0x01", ""),
            "{l}"
        );
    }
    assert_eq!(rows.len(), log.len());
    let seen: std::collections::BTreeSet<(String, String)> = rows
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    for want in [
        ("0x81", "0x0011"), // DR SMP NodeInfo
        ("0x81", "0x0015"), // PortInfo
        ("0x81", "0x0016"), // P_KeyTable
        ("0x03", "0x0035"), // SA PathRecord
        ("0x03", "0x0011"), // NodeRecord
        ("0x03", "0x0012"), // PortInfoRecord
        ("0x03", "0x0003"), // InformInfo
        ("0x03", "0x0002"), // Notice (Report)
    ] {
        assert!(
            seen.contains(&(want.0.to_string(), want.1.to_string())),
            "tshark did not show class {} attribute {}: {seen:?}",
            want.0,
            want.1
        );
    }
}

#[test]
fn no_port_is_active_before_it_has_its_pkey_table() {
    // The SM sets the P_Key table while the port is ARMED, then activates
    // it (as opensm does), so a client that waits for ACTIVE finds its
    // partitions there. Checked after every simulator round, with loss.
    let parts = "Default=0x7fff : ALL=full ;\nstorage=0x10 : ALL=full ;\n";
    let mut sim = fabric(8, 0.05, Some(parts));
    let mut early = Vec::new();
    let r = sim.run_until(Duration::from_secs(20), |s| {
        for n in 2..2 + HOSTS {
            let h = host(s, n);
            if h.sma.port_state() == state::ACTIVE && !h.sma.pkeys().contains(&Pkey(0x8010)) {
                early.push(n);
            }
        }
        all_active(s)
    });
    assert_eq!(r, rdma_sim::RunOutcome::Done);
    assert!(
        early.is_empty(),
        "ACTIVE without the table: hosts {early:?}"
    );
    assert!(
        (2..2 + HOSTS).all(|n| host(&mut sim, n).sma.pkeys()[..2] == [Pkey(0xffff), Pkey(0x8010)])
    );
}
