//! Two subnet managers over the simulator (`ib_sm::sim::two_sms`): the
//! election by SMInfo, a standby polling the master, the takeover when
//! the master goes silent (keeping the LIDs it gave), the handover to an
//! SM of higher priority joining later; and trap 144 from an SMA through
//! the SM to a subscriber.

use ib_sm::sim::{addr, gid, host, sm_node, two_sms, N};
use ib_sm::sm::{portinfo_comp, SmState};
use ib_sm::SmEvent;
use rdma_access::sma::{ca_capability_mask, state};
use rdma_mad::sa::SaAttr;
use rdma_mad::smp::{cap, PortInfo, SmInfo};
use rdma_sim::{RunOutcome, Simulator};
use rdma_types::{Duration, Guid};

const HOSTS: u8 = 3;
/// Simulator node ids of the two SMs.
const A: usize = 0;
const B: usize = HOSTS as usize + 1;
const LID_A: u16 = 1;
const LID_B: u16 = 100;

fn state(sim: &mut Simulator<N>, id: usize) -> SmState {
    sm_node(sim, id).sm.state()
}

/// Every host ACTIVE with `sm_lid` as its master SM LID.
fn hosts_managed_by(sim: &mut Simulator<N>, sm_lid: u16) -> bool {
    (2..2 + HOSTS).all(|n| {
        let s = &host(sim, n).sma;
        s.port_state() == state::ACTIVE && s.sm_lid() == sm_lid
    })
}

fn lids(sim: &mut Simulator<N>) -> Vec<u16> {
    (2..2 + HOSTS).map(|n| host(sim, n).sma.lid()).collect()
}

/// Runs until `a` is master, `b` standby polling it, and the hosts follow
/// `a`.
fn elected(sim: &mut Simulator<N>, a: usize, b: usize, lid: u16) {
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, a) == SmState::Master
            && state(s, b) == SmState::Standby
            && hosts_managed_by(s, lid)
    });
    assert_eq!(r, RunOutcome::Done, "no election");
}

#[test]
fn the_higher_priority_sm_is_master_and_the_other_polls_it() {
    let mut sim = two_sms(1, HOSTS, 1, 5, LID_B, Duration::ZERO);
    elected(&mut sim, B, A, LID_B);
    let b_guid = sm_node(&mut sim, B).sm.sm_info().guid;
    let (at, info) = sm_node(&mut sim, A).sm.master().expect("standby follows B");
    assert_eq!((at, info.guid), (addr(HOSTS + 2), b_guid));
    // LIDs: unique, and neither SM's own.
    let mut l = lids(&mut sim);
    l.sort();
    l.dedup();
    assert_eq!(l.len(), usize::from(HOSTS));
    assert!(l.iter().all(|x| *x != LID_A && *x != LID_B), "{l:?}");
    // The standby keeps polling, and the master's ActCount advances.
    let polls0 = sm_node(&mut sim, A).sm.stats().polls;
    let act0 = sm_node(&mut sim, A).sm.master().unwrap().1.act_count;
    sim.run_idle(Duration::from_secs(3));
    let polls1 = sm_node(&mut sim, A).sm.stats().polls;
    let act1 = sm_node(&mut sim, A).sm.master().unwrap().1.act_count;
    assert!(polls1 >= polls0 + 4, "polls {polls0} -> {polls1}");
    assert!(act1 > act0, "ActCount {act0} -> {act1}");
    assert_eq!(state(&mut sim, A), SmState::Standby);
    assert_eq!(
        sm_node(&mut sim, A).sm.stats().sweeps,
        0,
        "a standby does not sweep"
    );
    assert!(hosts_managed_by(&mut sim, LID_B));
}

#[test]
fn equal_priorities_elect_the_lower_guid() {
    let mut sim = two_sms(2, HOSTS, 3, 3, LID_B, Duration::ZERO);
    let (ga, gb) = (
        sm_node(&mut sim, A).sm.sm_info().guid,
        sm_node(&mut sim, B).sm.sm_info().guid,
    );
    assert!(ga.0 < gb.0);
    elected(&mut sim, A, B, LID_A);
}

#[test]
fn the_standby_takes_over_a_silent_master_keeping_its_lids() {
    let mut sim = two_sms(3, HOSTS, 5, 1, LID_B, Duration::ZERO);
    elected(&mut sim, A, B, LID_A);
    let before = lids(&mut sim);
    let a_guid = sm_node(&mut sim, A).sm.sm_info().guid;
    sm_node(&mut sim, B).events.clear();
    sm_node(&mut sim, A).dead = true;
    let t0 = sim.now();
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, B) == SmState::Master
            && hosts_managed_by(s, LID_B)
            && sm_node(s, B).sm.active_ports().len() == usize::from(HOSTS)
    });
    assert_eq!(r, RunOutcome::Done, "no takeover");
    let took = sim.now().saturating_since(t0);
    // Poll interval 500 ms + 3 tries of 100 ms, then one sweep.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(lids(&mut sim), before, "the new master renumbered");
    let ev = sm_node(&mut sim, B).events.clone();
    assert!(ev.contains(&SmEvent::MasterLost { guid: a_guid }), "{ev:?}");
    assert!(ev.contains(&SmEvent::State(SmState::Master)), "{ev:?}");
    let mut active: Vec<Guid> = sm_node(&mut sim, B)
        .sm
        .active_ports()
        .iter()
        .map(|p| p.0)
        .collect();
    active.sort();
    let mut want: Vec<Guid> = (2..2 + HOSTS).map(ib_sm::sim::port_guid).collect();
    want.sort();
    assert_eq!(active, want);
    // The hosts' SA now answers from B.
    let segs = ib_sm::sim::run_query(&mut sim, 2, 0x12, SaAttr::PortInfoRecord, 0, &[0; 68])
        .expect("the new master's SA answers");
    let (_, recs) = ib_sm::sim::table(&segs).unwrap();
    assert_eq!(recs.len(), usize::from(HOSTS));
}

#[test]
fn a_higher_priority_sm_joining_later_gets_a_handover() {
    let mut sim = two_sms(4, HOSTS, 1, 9, LID_B, Duration::from_secs(3));
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, A) == SmState::Master && hosts_managed_by(s, LID_A)
    });
    assert_eq!(r, RunOutcome::Done);
    let before = lids(&mut sim);
    sm_node(&mut sim, B).dead = false; // B starts: it sweeps from 3 s on
    elected(&mut sim, B, A, LID_B);
    assert!(sim.now() > rdma_types::Instant::ZERO + Duration::from_secs(3));
    assert_eq!(lids(&mut sim), before, "handover renumbered");
    let ev = &sm_node(&mut sim, A).events;
    assert!(ev.contains(&SmEvent::State(SmState::Standby)), "{ev:?}");
    let ev = &sm_node(&mut sim, B).events;
    assert!(
        !ev.iter().any(|e| matches!(e, SmEvent::MasterLost { .. })),
        "a handover, not a takeover: {ev:?}"
    );
    // The new master acknowledged the HANDOVER (IBA 14.4.1): the old one
    // heard it from B, once.
    let b_guid = sm_node(&mut sim, B).sm.sm_info().guid;
    let acked = |s: &mut Simulator<N>| {
        sm_node(s, A)
            .events
            .iter()
            .filter(|e| **e == SmEvent::HandoverAcknowledged { guid: b_guid })
            .count()
    };
    let r = sim.run_until(Duration::from_secs(5), |s| acked(s) > 0);
    assert_eq!(r, RunOutcome::Done, "no ACKNOWLEDGE reached the old master");
    sim.run_until(Duration::from_secs(2), |_| false);
    assert_eq!(acked(&mut sim), 1);
    assert_eq!(
        sm_node(&mut sim, A).sm.stats().sminfo_refused,
        0,
        "it was legal"
    );
}

/// Set(SMInfo) from `guid` in state `sm_state` with `key` and control
/// `modifier`, as the SM at address 2 would send it.
fn sminfo_set(guid: u64, key: u64, sm_state: SmState, modifier: u32) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x81, 1, 0x02]); // directed route, Set
    m[8..16].copy_from_slice(&0x5151u64.to_be_bytes());
    m[16..18].copy_from_slice(&0x0020u16.to_be_bytes()); // SMInfo
    m[20..24].copy_from_slice(&modifier.to_be_bytes());
    SmInfo {
        guid: Guid(guid),
        sm_key: key,
        act_count: 1,
        priority: 3,
        sm_state: sm_state.code(),
    }
    .emit(&mut m[64..64 + SmInfo::LEN]);
    m
}

/// SMInfo Sets are taken only with the SM_Key and from an SM whose state
/// may send them (a master hands over, disables, asks for standby or
/// discovery; a standby acknowledges); others get "invalid attribute
/// value" and change nothing. A HANDOVER taken makes the SM master and
/// is acknowledged: Set(SMInfo, ACKNOWLEDGE) back to the sender, with
/// the key.
#[test]
fn sminfo_sets_need_the_key_and_the_senders_state_and_a_handover_is_acknowledged() {
    const KEY: u64 = 0x00c0_ffee;
    let mut cfg = ib_sm::SmConfig::new(Guid(0x51));
    cfg.sm_key = KEY;
    let t0 = rdma_types::Instant::ZERO;
    let mut sm = ib_sm::SubnetManager::new(cfg, vec![(2u8, gid(2))], t0);
    let answer = |sm: &mut ib_sm::SubnetManager<u8>, m: [u8; 256]| {
        while sm.poll_transmit().is_some() {}
        sm.handle_mad(t0, 2, ib_sm::sm::QP_SMI, &m);
        let mut out = Vec::new();
        while let Some(o) = sm.poll_transmit() {
            out.push(o);
        }
        let resp = out
            .iter()
            .position(|o| o.mad[3] == 0x81 && o.mad[8..16] == m[8..16])
            .map(|i| out.remove(i))
            .expect("every SMInfo Set is answered");
        (u16::from_be_bytes([resp.mad[4], resp.mad[5]]) & 0x7fff, out)
    };
    let start = sm.state();
    assert_ne!(start, SmState::Master);
    let invalid = 7 << 2; // "invalid attribute value"
    for (key, sender, modifier) in [
        (KEY, SmState::Standby, 1),  // a HANDOVER from a standby
        (KEY, SmState::Master, 2),   // an ACKNOWLEDGE from a master
        (0xbad, SmState::Master, 1), // a HANDOVER with the wrong key
        (KEY, SmState::Discovering, 3),
    ] {
        let (status, _) = answer(&mut sm, sminfo_set(0x52, key, sender, modifier));
        assert_eq!(status, invalid, "{sender:?} control {modifier}");
        assert_eq!(sm.state(), start, "{sender:?} control {modifier}");
    }
    assert_eq!(sm.stats().sminfo_refused, 4);
    let (status, out) = answer(&mut sm, sminfo_set(0x52, KEY, SmState::Master, 1));
    assert_eq!(status, 0);
    assert_eq!(sm.state(), SmState::Master);
    let ack = out
        .iter()
        .find(|o| o.mad[3] == 0x02 && o.mad[16..18] == [0x00, 0x20])
        .expect("an ACKNOWLEDGE");
    assert_eq!((ack.to, ack.qp), (2, ib_sm::sm::QP_SMI));
    assert_eq!(u32::from_be_bytes(ack.mad[20..24].try_into().unwrap()), 2);
    let info = SmInfo::parse(&ack.mad[64..64 + SmInfo::LEN]).unwrap();
    assert_eq!((info.guid, info.sm_key), (Guid(0x51), KEY));
    assert_eq!(info.sm_state, start.code(), "the state the HANDOVER found");
}

#[test]
fn trap_144_reaches_subscribers_and_the_sa_and_is_repressed() {
    let mut sim = ib_sm::sim::fabric(5, 0.0, None, 4).unwrap();
    let r = sim.run_until(Duration::from_secs(10), |s| ib_sm::sim::all_active(s, 4));
    assert_eq!(r, RunOutcome::Done);
    assert!(ib_sm::sim::subscribe(&mut sim, 3));
    // Before: host 4 does not offer device management.
    let mut q = [0u8; 68];
    PortInfo::new_checked(&mut q[4..68])
        .unwrap()
        .set_capability_mask(cap::IS_DEVICE_MGMT_SUPPORTED);
    let dm_lids = |sim: &mut Simulator<N>| -> Vec<u16> {
        let segs = ib_sm::sim::run_query(
            sim,
            5,
            0x12,
            SaAttr::PortInfoRecord,
            portinfo_comp::CAPMASK,
            &q,
        )
        .expect("SA answers");
        let (_, recs) = ib_sm::sim::table(&segs).unwrap();
        recs.iter()
            .map(|r| u16::from_be_bytes([r[0], r[1]]))
            .collect()
    };
    let lid4 = host(&mut sim, 4).sma.lid();
    assert!(!dm_lids(&mut sim).contains(&lid4));
    // A DM agent registers on host 4: its SMA raises trap 144.
    let now = sim.now();
    host(&mut sim, 4).set_capability_mask(now, ca_capability_mask(true));
    let r = sim.run_until(Duration::from_secs(5), |s| {
        host(s, 4).sma.trap().is_none() && host(s, 3).notices.iter().any(|n| n.trap_number == 144)
    });
    assert_eq!(r, RunOutcome::Done, "trap not repressed or not forwarded");
    let n = *host(&mut sim, 3)
        .notices
        .iter()
        .find(|n| n.trap_number == 144)
        .unwrap();
    assert_eq!((n.issuer_lid, n.issuer_gid), (lid4, gid(4)));
    assert_eq!(
        u32::from_be_bytes(n.data_details[6..10].try_into().unwrap()),
        ca_capability_mask(true)
    );
    assert_eq!(host(&mut sim, 4).traps_sent, 1, "repressed the first time");
    let ev = &ib_sm::sim::sm(&mut sim).events;
    assert!(ev.contains(&SmEvent::CapabilityChange {
        guid: ib_sm::sim::port_guid(4),
        mask: ca_capability_mask(true)
    }));
    // The SA's PortInfoRecords show it at once.
    assert!(dm_lids(&mut sim).contains(&lid4));
}

#[test]
fn a_lost_trap_144_is_sent_again_and_forwarded_once() {
    let mut sim = ib_sm::sim::fabric(6, 0.0, None, 2).unwrap();
    let r = sim.run_until(Duration::from_secs(10), |s| ib_sm::sim::all_active(s, 2));
    assert_eq!(r, RunOutcome::Done);
    assert!(ib_sm::sim::subscribe(&mut sim, 2));
    // The first TrapRepress is lost on its way to host 3.
    host(&mut sim, 3).lose_represses = 1;
    let now = sim.now();
    host(&mut sim, 3).set_capability_mask(now, ca_capability_mask(true));
    let r = sim.run_until(Duration::from_secs(5), |s| host(s, 3).sma.trap().is_none());
    assert_eq!(r, RunOutcome::Done);
    assert_eq!(host(&mut sim, 3).traps_sent, 2);
    assert_eq!(
        ib_sm::sim::sm(&mut sim).sm.stats().traps,
        1,
        "one trap, sent twice"
    );
    sim.run_idle(Duration::from_millis(500));
    let n = host(&mut sim, 2)
        .notices
        .iter()
        .filter(|n| n.trap_number == 144)
        .count();
    assert_eq!(n, 1, "forwarded once");
}

#[test]
fn a_standby_whose_lid_was_taken_gets_another_and_masters_with_it() {
    // B is configured with LID 2 but starts after A gave 2 to a host: A
    // moves B's port to a free LID, and B is master with that one later.
    let mut sim = two_sms(7, HOSTS, 5, 1, 2, Duration::from_secs(3));
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, A) == SmState::Master && hosts_managed_by(s, LID_A)
    });
    assert_eq!(r, RunOutcome::Done);
    let before = lids(&mut sim);
    assert!(before.contains(&2), "{before:?}");
    sm_node(&mut sim, B).dead = false;
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, B) == SmState::Standby && sm_node(s, B).sm.lid_now() != 2
    });
    assert_eq!(r, RunOutcome::Done, "B kept a LID a host holds");
    let lid_b = sm_node(&mut sim, B).sm.lid_now();
    assert!(!before.contains(&lid_b) && lid_b != LID_A, "{lid_b}");
    sm_node(&mut sim, A).dead = true;
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, B) == SmState::Master && hosts_managed_by(s, lid_b)
    });
    assert_eq!(r, RunOutcome::Done, "no takeover at LID {lid_b}");
    assert_eq!(lids(&mut sim), before);
}

#[test]
fn of_two_masters_after_a_split_the_lesser_yields() {
    let mut sim = two_sms(8, HOSTS, 5, 1, LID_B, Duration::ZERO);
    let (ia, ib) = (addr(1).ip(), addr(HOSTS + 2).ip());
    sim.set_link_up(ia, ib, false);
    let r = sim.run_until(Duration::from_secs(10), |s| {
        state(s, A) == SmState::Master && state(s, B) == SmState::Master
    });
    assert_eq!(r, RunOutcome::Done, "the split did not make two masters");
    sim.set_link_up(ia, ib, true);
    elected(&mut sim, A, B, LID_A);
    let ev = &sm_node(&mut sim, B).events;
    assert!(ev.contains(&SmEvent::State(SmState::Standby)), "{ev:?}");
    // Stable afterwards: one master, every host on it, LIDs unique, and
    // the standby polling it.
    let polls = sm_node(&mut sim, B).sm.stats().polls;
    sim.run_idle(Duration::from_secs(3));
    assert_eq!(state(&mut sim, B), SmState::Standby);
    assert!(sm_node(&mut sim, B).sm.stats().polls >= polls + 4);
    assert!(hosts_managed_by(&mut sim, LID_A));
    let mut l = lids(&mut sim);
    l.sort();
    l.dedup();
    assert_eq!(l.len(), usize::from(HOSTS));
}

fn standby_events(sim: &mut Simulator<N>, guid: Guid) -> (usize, usize) {
    let ev = &sm_node(sim, A).events;
    let found = ev
        .iter()
        .filter(|e| matches!(e, SmEvent::StandbyFound { guid: g, .. } if *g == guid))
        .count();
    let lost = ev
        .iter()
        .filter(|e| matches!(e, SmEvent::StandbyLost { guid: g } if *g == guid))
        .count();
    (found, lost)
}

#[test]
fn the_master_polls_its_standby_and_notices_it_go_and_come_back() {
    let mut sim = two_sms(9, HOSTS, 5, 1, LID_B, Duration::ZERO);
    elected(&mut sim, A, B, LID_A);
    let b = sm_node(&mut sim, B).sm.sm_info();
    assert_eq!(standby_events(&mut sim, b.guid), (1, 0));
    assert!(sm_node(&mut sim, A)
        .events
        .contains(&SmEvent::StandbyFound {
            guid: b.guid,
            priority: 1
        }));
    // Polled every 500 ms, beside the sweeps.
    let p0 = sm_node(&mut sim, A).sm.stats().standby_polls;
    sim.run_idle(Duration::from_secs(3));
    let p1 = sm_node(&mut sim, A).sm.stats().standby_polls;
    assert!(p1 >= p0 + 5, "standby polls {p0} -> {p1}");
    assert_eq!(standby_events(&mut sim, b.guid), (1, 0), "found once");

    // The standby goes silent: noticed within a poll and its resends.
    sm_node(&mut sim, B).dead = true;
    let t0 = sim.now();
    let r = sim.run_until(Duration::from_secs(5), |s| standby_events(s, b.guid).1 == 1);
    assert_eq!(r, RunOutcome::Done, "the standby's loss went unnoticed");
    let took = sim.now().saturating_since(t0);
    assert!(took <= Duration::from_millis(900), "took {took:?}");
    assert!(sm_node(&mut sim, A).sm.peers().is_empty());
    assert_eq!(state(&mut sim, A), SmState::Master);

    // It comes back (still standby): its poll of the master makes the
    // master ask for its SMInfo at once.
    sm_node(&mut sim, B).dead = false;
    let t0 = sim.now();
    let r = sim.run_until(Duration::from_secs(5), |s| standby_events(s, b.guid).0 == 2);
    assert_eq!(r, RunOutcome::Done, "the standby's return went unnoticed");
    let took = sim.now().saturating_since(t0);
    assert!(took <= Duration::from_millis(700), "took {took:?}");
    assert_eq!(state(&mut sim, B), SmState::Standby);
}

#[test]
fn only_the_master_s_sa_answers() {
    let mut sim = two_sms(10, HOSTS, 5, 1, LID_B, Duration::ZERO);
    elected(&mut sim, A, B, LID_A);
    // A NodeRecord Get from host 2, to each SM.
    let mut q = [0u8; 256];
    q[..4].copy_from_slice(&[1, 0x03, 2, 0x01]);
    q[8..16].copy_from_slice(&0x77u64.to_be_bytes());
    q[16..18].copy_from_slice(&u16::from(SaAttr::NodeRecord).to_be_bytes());
    for (id, answers) in [(B, false), (A, true)] {
        let now = sim.now();
        let s = &mut sm_node(&mut sim, id).sm;
        while s.poll_transmit().is_some() {}
        s.handle_mad(now, addr(2), ib_sm::sm::QP_GSI, &q);
        let mut got = false;
        while let Some(o) = s.poll_transmit() {
            got |= o.qp == ib_sm::sm::QP_GSI && o.to == addr(2) && o.mad[8..16] == q[8..16];
        }
        assert_eq!(got, answers, "SM {id}");
    }
    let (a, b) = (
        sm_node(&mut sim, A).sm.stats(),
        sm_node(&mut sim, B).sm.stats(),
    );
    assert_eq!(
        (b.sa_ignored, b.sa_requests),
        (1, 0),
        "the standby drops it"
    );
    assert_eq!(a.sa_ignored, 0);
    assert!(a.sa_requests >= 1);
}
