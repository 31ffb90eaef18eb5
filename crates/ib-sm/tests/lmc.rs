//! LID Mask Control over the simulator (`ib_sm::sim`): an SM with LMC 2
//! and three hosts. Every port gets four LIDs from a base aligned to 4,
//! the SA finds a port by any of them, and PathRecord lists one path per
//! (SLID, DLID) pair in opensm's order, NumbPath and the SLID/DLID
//! components narrowing it.

use ib_sm::sim::{fabric_with, gid, host, port_guid, sm, N};
use ib_sm::sm::{path_comp, portinfo_comp};
use ib_sm::SmConfig;
use rdma_access::gsi::MadBytes;
use rdma_access::sma::state;
use rdma_mad::sa::{PathRecord, SaAttr, SA_HDR_LEN};
use rdma_mad::smp::{NodeInfo, PortInfo};
use rdma_sim::{RunOutcome, Simulator};
use rdma_types::{Duration, Guid};
use std::collections::HashSet;

const HOSTS: u8 = 3;

fn cfg(lmc: u8) -> SmConfig {
    let mut c = SmConfig::new(Guid(0xabc));
    c.sweep_interval = Duration::from_secs(1);
    c.lmc = lmc;
    c
}

fn up(sim: &mut Simulator<N>) {
    let r = sim.run_until(Duration::from_secs(10), |s| {
        ib_sm::sim::all_active(s, HOSTS)
    });
    assert_eq!(r, RunOutcome::Done);
}

fn query(
    sim: &mut Simulator<N>,
    method: u8,
    attr: SaAttr,
    mask: u64,
    data: &[u8],
) -> Vec<MadBytes> {
    ib_sm::sim::run_query(sim, 2, method, attr, mask, data)
        .unwrap_or_else(|| panic!("query {attr:?} never finished"))
}

/// A PathRecord query from host 2 to host 3 with `f` applied.
fn path_query(f: impl FnOnce(&mut PathRecord)) -> [u8; 64] {
    let mut q = PathRecord::parse(&[0u8; 64]).unwrap();
    q.sgid = gid(2);
    q.dgid = gid(3);
    f(&mut q);
    let mut b = [0u8; 64];
    q.emit(&mut b);
    b
}

fn paths(segs: &[MadBytes]) -> Vec<PathRecord> {
    let (_, recs) = ib_sm::sim::table(segs).unwrap();
    recs.iter().map(|r| PathRecord::parse(r).unwrap()).collect()
}

fn status(m: &MadBytes) -> u16 {
    u16::from_be_bytes([m[4], m[5]]) & 0x7fff
}

#[test]
fn lmc_2_gives_each_port_an_aligned_range_of_four() {
    let mut sim = fabric_with(3, 0.0, cfg(2), HOSTS);
    up(&mut sim);
    let mut seen = HashSet::new();
    for n in 2..2 + HOSTS {
        let (base, lmc) = (host(&mut sim, n).sma.lid(), host(&mut sim, n).sma.lmc());
        assert_eq!(lmc, 2, "host {n}: PortInfo:LMC set through its SMA");
        assert!(
            base >= 4 && base.is_multiple_of(4),
            "host {n}: base LID {base}"
        );
        assert_eq!(sm(&mut sim).sm.lids(port_guid(n)), Some(base..=base + 3));
        for l in base..=base + 3 {
            assert!(seen.insert(l), "LID {l} given twice");
        }
    }
    assert!(!seen.contains(&1), "the SM's own LID is nobody else's");

    // Any LID of a range finds the port; its records show the base LID
    // and LMC.
    let b3 = host(&mut sim, 3).sma.lid();
    let mut q = [0u8; 72];
    q[0..2].copy_from_slice(&(b3 + 3).to_be_bytes());
    let segs = query(&mut sim, 0x01, SaAttr::NodeRecord, 1, &q[..64]);
    assert_eq!(status(&segs[0]), 0);
    assert_eq!(&segs[0][SA_HDR_LEN..SA_HDR_LEN + 2], &b3.to_be_bytes());
    let info = NodeInfo::parse(&segs[0][SA_HDR_LEN + 4..SA_HDR_LEN + 44]).unwrap();
    assert_eq!(info.port_guid, port_guid(3));
    q[0..2].copy_from_slice(&(b3 + 2).to_be_bytes());
    let segs = query(
        &mut sim,
        0x01,
        SaAttr::PortInfoRecord,
        portinfo_comp::LID,
        &q,
    );
    assert_eq!(&segs[0][SA_HDR_LEN..SA_HDR_LEN + 2], &b3.to_be_bytes());
    let pi = PortInfo::new_checked(&segs[0][SA_HDR_LEN + 4..SA_HDR_LEN + 68]).unwrap();
    assert_eq!(
        (pi.lid(), pi.lmc(), pi.port_state()),
        (b3, 2, state::ACTIVE)
    );
    // A LID in no range: no records.
    let unused = (4..0xbffc).step_by(4).find(|l| !seen.contains(l)).unwrap();
    q[0..2].copy_from_slice(&(unused + 1).to_be_bytes());
    let segs = query(&mut sim, 0x01, SaAttr::NodeRecord, 1, &q[..64]);
    assert_eq!(status(&segs[0]), ib_sm::sm::SA_ERR_NO_RECORDS);
}

#[test]
fn path_records_enumerate_lid_pairs_as_opensm_orders_them() {
    let mut sim = fabric_with(4, 0.0, cfg(2), HOSTS);
    up(&mut sim);
    let b2 = host(&mut sim, 2).sma.lid();
    let b3 = host(&mut sim, 3).sma.lid();
    let pair = path_comp::SGID | path_comp::DGID;

    // GetTable for the pair: all 16 (SLID, DLID) pairs, in several RMPP
    // segments (16 x 64 bytes is more than one MAD holds).
    let segs = query(
        &mut sim,
        0x12,
        SaAttr::PathRecord,
        pair,
        &path_query(|_| {}),
    );
    assert!(segs.len() > 1, "RMPP: {} segments", segs.len());
    let all = paths(&segs);
    assert_eq!(all.len(), 16);
    let lids: HashSet<(u16, u16)> = all.iter().map(|p| (p.slid, p.dlid)).collect();
    assert_eq!(lids.len(), 16, "distinct pairs");
    for p in &all {
        assert!((b2..b2 + 4).contains(&p.slid) && (b3..b3 + 4).contains(&p.dlid));
        assert_eq!((p.sgid, p.dgid), (gid(2), gid(3)));
    }
    // First the pairs at equal offsets (preference 0), then the others
    // source-major (preference 2).
    let head: Vec<(u16, u16, u8)> = all[..6]
        .iter()
        .map(|p| (p.slid, p.dlid, p.preference))
        .collect();
    assert_eq!(
        head,
        vec![
            (b2, b3, 0),
            (b2 + 1, b3 + 1, 0),
            (b2 + 2, b3 + 2, 0),
            (b2 + 3, b3 + 3, 0),
            (b2, b3 + 1, 2),
            (b2, b3 + 2, 2),
        ]
    );
    assert!(all[4..]
        .iter()
        .all(|p| p.preference == 2 && p.slid - b2 != p.dlid - b3));

    // NumbPath 2: the two best.
    let q = path_query(|q| q.numb_path = 2);
    let two = paths(&query(
        &mut sim,
        0x12,
        SaAttr::PathRecord,
        pair | path_comp::NUMB_PATH,
        &q,
    ));
    let two: Vec<(u16, u16)> = two.iter().map(|p| (p.slid, p.dlid)).collect();
    assert_eq!(two, vec![(b2, b3), (b2 + 1, b3 + 1)]);

    // A Get: the first path, base to base.
    let segs = query(
        &mut sim,
        0x01,
        SaAttr::PathRecord,
        pair,
        &path_query(|_| {}),
    );
    let p = PathRecord::parse(&segs[0][SA_HDR_LEN..]).unwrap();
    assert_eq!((p.slid, p.dlid), (b2, b3));

    // A Get naming DLID base+1 (with the DGID): that DLID, from the base.
    let q = path_query(|q| q.dlid = b3 + 1);
    let segs = query(
        &mut sim,
        0x01,
        SaAttr::PathRecord,
        pair | path_comp::DLID,
        &q,
    );
    let p = PathRecord::parse(&segs[0][SA_HDR_LEN..]).unwrap();
    assert_eq!((p.slid, p.dlid, p.dgid), (b2, b3 + 1, gid(3)));
    // DLID alone (no DGID) finds the port by it too; with SLID both ends
    // are fixed: one path.
    let q = path_query(|q| {
        q.dlid = b3 + 3;
        q.slid = b2 + 2;
    });
    let mask = path_comp::SGID | path_comp::DLID | path_comp::SLID;
    let one = paths(&query(&mut sim, 0x12, SaAttr::PathRecord, mask, &q));
    let one: Vec<(u16, u16)> = one.iter().map(|p| (p.slid, p.dlid)).collect();
    assert_eq!(one, vec![(b2 + 2, b3 + 3)]);
}

#[test]
fn an_aligned_lid_a_port_holds_is_kept_and_an_unaligned_one_moved() {
    let mut sim = fabric_with(5, 0.0, cfg(2), HOSTS);
    // Ports left with LIDs by an earlier SM: 8 (aligned to 4) and 13 (not).
    host(&mut sim, 2).sma.assume(8, 0, state::INIT);
    host(&mut sim, 3).sma.assume(13, 0, state::INIT);
    up(&mut sim);
    assert_eq!(host(&mut sim, 2).sma.lid(), 8, "kept");
    let moved = host(&mut sim, 3).sma.lid();
    assert!(
        moved.is_multiple_of(4) && moved != 8 && moved != 12,
        "moved to {moved}"
    );
    // Sweeps later, still the same.
    let t = sim.now() + Duration::from_secs(3);
    sim.run_until(Duration::from_secs(3), |s| s.now() >= t);
    assert_eq!(host(&mut sim, 3).sma.lid(), moved);
}

#[test]
fn lmc_7_ranges_of_128_and_the_per_pair_cap() {
    let mut sim = fabric_with(6, 0.0, cfg(7), 2);
    let r = sim.run_until(Duration::from_secs(10), |s| ib_sm::sim::all_active(s, 2));
    assert_eq!(r, RunOutcome::Done);
    let (b2, b3) = (host(&mut sim, 2).sma.lid(), host(&mut sim, 3).sma.lid());
    for b in [b2, b3] {
        assert!(b >= 128 && b.is_multiple_of(128), "base LID {b}");
    }
    assert_ne!(b2, b3);
    // 128 x 128 pairs; a GetTable without NumbPath gets the first 256 in
    // opensm's order: the 128 at equal offsets, then from b2 to the rest.
    let pair = path_comp::SGID | path_comp::DGID;
    let all = paths(&query(
        &mut sim,
        0x12,
        SaAttr::PathRecord,
        pair,
        &path_query(|_| {}),
    ));
    assert_eq!(all.len(), ib_sm::sm::MAX_PATHS_PER_PAIR);
    assert!(all[..128]
        .iter()
        .enumerate()
        .all(|(k, p)| (p.slid, p.dlid, p.preference) == (b2 + k as u16, b3 + k as u16, 0)));
    assert_eq!((all[128].slid, all[128].dlid), (b2, b3 + 1));
    // b2 to b3+1..b3+127 fill 128..=254; then b2+1 to b3.
    assert_eq!((all[254].slid, all[254].dlid), (b2, b3 + 127));
    assert_eq!((all[255].slid, all[255].dlid), (b2 + 1, b3));
}
