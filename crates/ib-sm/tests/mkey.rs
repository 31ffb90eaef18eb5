//! M_Key protection across the simulated fabric (`ib_sm::sim`): the SM
//! gives every port its M_Key and protect level and uses the key in every
//! SMP; a second SM that does not know the key is refused (counted in the
//! ports' M_KeyViolations, reported to the master by trap 256 and on to
//! trap subscribers) while the master, with the right key, goes on
//! managing the ports; at protect level 1 the key stays hidden from the
//! second SM, which says so and leaves the ports alone; and once the
//! master dies the lease runs out, the ports show their key, and the
//! second SM takes the fabric over with its own key.

use ib_sm::sim::{add_sm, addr, all_active, fabric_with, gid, host, sm, sm_node, subscribe, N};
use ib_sm::sm::SmState;
use ib_sm::{SmConfig, SmEvent};
use rdma_access::sma::{state, TRAP_BAD_MKEY};
use rdma_sim::{RunOutcome, Simulator};
use rdma_types::{Duration, Guid};

const HOSTS: u8 = 3;
const KEY: u64 = 0x5eed_0000_cafe_f00d;
const WRONG: u64 = 0x0bad_0bad_0bad_0bad;
const LEASE_SECS: u16 = 3;
/// Simulator node id and address number of the second SM.
const ROGUE: usize = HOSTS as usize + 1;
const ROGUE_ADDR: u8 = 20;
const ROGUE_LID: u16 = 50;

fn cfg(guid: u64, mkey: u64, protect: u8) -> SmConfig {
    let mut c = SmConfig::new(Guid(guid));
    c.sweep_interval = Duration::from_secs(1);
    c.timeout = Duration::from_millis(100);
    c.retries = 2;
    c.mkey = mkey;
    c.mkey_protect = protect;
    c.mkey_lease = LEASE_SECS;
    c
}

/// The master (key `KEY` at `protect`) brings the hosts up; host 3
/// subscribes to every trap.
fn protected_fabric(seed: u64, protect: u8) -> Simulator<N> {
    let mut sim = fabric_with(seed, 0.0, cfg(0xabc, KEY, protect), HOSTS);
    let r = sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS));
    assert_eq!(r, RunOutcome::Done, "the fabric did not come up");
    for n in 2..2 + HOSTS {
        let s = &host(&mut sim, n).sma;
        assert_eq!((s.mkey(), s.mkey_protect()), (KEY, protect), "host {n}");
        assert_eq!(
            s.mkey_violations(),
            0,
            "host {n}: the master's key is right"
        );
    }
    assert!(subscribe(&mut sim, 3));
    sim
}

/// A second SM with the wrong key, sweeping the hosts (and not the
/// master, so nothing stops it from being master of what it can reach).
fn add_rogue(sim: &mut Simulator<N>, protect: u8) {
    let mut c = cfg(0xbad, WRONG, protect);
    c.lid = ROGUE_LID;
    let endpoints = (2..2 + HOSTS).map(|n| (addr(n), gid(n))).collect();
    let now = sim.now();
    add_sm(sim, ROGUE_ADDR, c, endpoints, now, false);
}

fn managed_by(sim: &mut Simulator<N>, sm_lid: u16, key: u64) -> bool {
    (2..2 + HOSTS).all(|n| {
        let s = &host(sim, n).sma;
        s.port_state() == state::ACTIVE && s.sm_lid() == sm_lid && s.mkey() == key
    })
}

#[test]
fn a_wrong_key_is_refused_and_counted_the_right_one_works() {
    let mut sim = protected_fabric(41, 2);
    let sweeps0 = sm(&mut sim).sm.stats().sweeps;
    add_rogue(&mut sim, 2);
    sim.run_idle(Duration::from_secs(4));

    // Every host refused the second SM's SMPs and counted them.
    for n in 2..2 + HOSTS {
        let v = host(&mut sim, n).sma.mkey_violations();
        assert!(v >= 3, "host {n}: {v} violations");
    }
    let rogue = &sm_node(&mut sim, ROGUE).sm;
    assert!(
        rogue.active_ports().is_empty(),
        "{:?}",
        rogue.active_ports()
    );
    // The master heard of it by trap 256 (repressed), and forwarded it.
    let master = sm(&mut sim);
    assert!(master.sm.stats().bad_mkey_traps >= u64::from(HOSTS));
    let bad: Vec<Guid> = master
        .events
        .iter()
        .filter_map(|e| match e {
            SmEvent::BadMkey {
                guid, method, attr, ..
            } => {
                assert_eq!((*method, *attr), (0x01, 0x0011), "Get(NodeInfo)");
                Some(*guid)
            }
            _ => None,
        })
        .collect();
    for n in 2..2 + HOSTS {
        assert!(bad.contains(&ib_sm::sim::port_guid(n)), "host {n}: {bad:?}");
    }
    let notices = &host(&mut sim, 3).notices;
    assert!(
        notices.iter().any(|n| n.trap_number == TRAP_BAD_MKEY),
        "no trap 256 reached the subscriber"
    );
    // The master, with the right key, goes on sweeping the same ports;
    // its good accesses keep stopping the lease, so protection holds.
    assert!(sm(&mut sim).sm.stats().sweeps >= sweeps0 + 3);
    assert!(!sm(&mut sim)
        .events
        .iter()
        .any(|e| matches!(e, SmEvent::PortDown { .. })));
    assert!(managed_by(&mut sim, 1, KEY));
    for n in 2..2 + HOSTS {
        assert_eq!(host(&mut sim, n).sma.mkey_protect(), 2, "host {n}");
    }
}

#[test]
fn protect_level_1_hides_the_key_and_the_other_sm_leaves_the_ports_alone() {
    let mut sim = protected_fabric(42, 1);
    add_rogue(&mut sim, 1);
    sim.run_idle(Duration::from_secs(3));
    let rogue = sm_node(&mut sim, ROGUE);
    let refused = rogue
        .events
        .iter()
        .filter(|e| matches!(e, SmEvent::MkeyRefused { .. }))
        .count();
    // Once per port, not once per sweep.
    assert_eq!(refused, usize::from(HOSTS), "{:?}", rogue.events);
    assert_eq!(rogue.sm.stats().mkey_refused, u64::from(HOSTS));
    assert!(rogue.sm.stats().sweeps >= 2);
    assert!(!rogue
        .events
        .iter()
        .any(|e| matches!(e, SmEvent::MkeyLearned { .. })));
    // Its Gets were answered (no violation at level 1) and it sent no Set.
    for n in 2..2 + HOSTS {
        assert_eq!(host(&mut sim, n).sma.mkey_violations(), 0, "host {n}");
    }
    assert!(managed_by(&mut sim, 1, KEY));
}

#[test]
fn the_lease_runs_out_after_the_master_dies_and_a_new_sm_takes_over() {
    let mut sim = protected_fabric(43, 2);
    add_rogue(&mut sim, 2);
    sim.run_idle(Duration::from_secs(2));
    assert!(managed_by(&mut sim, 1, KEY));
    sm(&mut sim).dead = true;
    let t0 = sim.now();
    let r = sim.run_until(Duration::from_secs(15), |s| {
        managed_by(s, ROGUE_LID, WRONG)
            && sm_node(s, ROGUE).sm.active_ports().len() == usize::from(HOSTS)
    });
    assert_eq!(r, RunOutcome::Done, "the second SM never got the ports");
    let took = sim.now().saturating_since(t0);
    // No sooner than the lease after the master's last good access (at
    // most a sweep interval before it died), and within a lease plus a
    // couple of sweeps.
    assert!(
        took >= Duration::from_secs(u64::from(LEASE_SECS) - 1),
        "took {took:?}"
    );
    assert!(took < Duration::from_secs(7), "took {took:?}");
    let rogue = sm_node(&mut sim, ROGUE);
    assert_eq!(rogue.sm.state(), SmState::Master);
    let learned = rogue
        .events
        .iter()
        .filter(|e| matches!(e, SmEvent::MkeyLearned { .. }))
        .count();
    assert_eq!(learned, usize::from(HOSTS), "{:?}", rogue.events);
    // The ports hold the new SM's key and protection again.
    for n in 2..2 + HOSTS {
        assert_eq!(host(&mut sim, n).sma.mkey_protect(), 2, "host {n}");
    }
    println!("takeover of a protected fabric after the master died: {took:?}");
}

#[test]
fn without_a_key_nothing_changes() {
    let mut sim = fabric_with(44, 0.0, cfg(0xabc, 0, 0), HOSTS);
    let r = sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS));
    assert_eq!(r, RunOutcome::Done);
    add_rogue(&mut sim, 0);
    sm(&mut sim).dead = true;
    // An unprotected fabric: the second SM takes it at its first sweeps.
    let r = sim.run_until(Duration::from_secs(5), |s| managed_by(s, ROGUE_LID, WRONG));
    assert_eq!(r, RunOutcome::Done);
    for n in 2..2 + HOSTS {
        assert_eq!(host(&mut sim, n).sma.mkey_violations(), 0, "host {n}");
    }
}

/// The SA and the SM_Key: a request whose SA header carries no key is an
/// ordinary client's and sees every PortInfoRecord with its M_Key zeroed;
/// one carrying the SM's key is trusted and sees the ports' keys; one
/// carrying another key is dropped unanswered (IBA C15-0.1.5, as opensm
/// does) and counted.
#[test]
fn the_sa_shows_m_keys_to_trusted_requests_only_and_drops_wrong_sm_keys() {
    const SM_KEY: u64 = 0x0123_4567_89ab_cdef;
    let mut c = cfg(0xabc, KEY, 1);
    c.sm_key = SM_KEY;
    let mut sim = ib_sm::sim::fabric_with(11, 0.0, c, HOSTS);
    let r = sim.run_until(Duration::from_secs(10), |s| all_active(s, HOSTS));
    assert_eq!(r, RunOutcome::Done, "the fabric did not come up");
    let mkeys = |sim: &mut Simulator<N>, key: u64| {
        host(sim, 2).sa_sm_key = key;
        let segs = ib_sm::sim::run_query(
            sim,
            2,
            0x12, // GetTable
            rdma_mad::sa::SaAttr::PortInfoRecord,
            0,
            &[0u8; 68],
        )?;
        let (_, recs) = ib_sm::sim::table(&segs).expect("a table");
        Some(
            recs.iter()
                .map(|r| {
                    rdma_mad::smp::PortInfo::new_checked(&r[4..68])
                        .expect("64 bytes")
                        .mkey()
                })
                .collect::<Vec<u64>>(),
        )
    };
    let plain = mkeys(&mut sim, 0).expect("an untrusted request is answered");
    assert!(plain.len() >= usize::from(HOSTS), "{plain:x?}");
    assert!(plain.iter().all(|k| *k == 0), "M_Key shown: {plain:x?}");
    let trusted = mkeys(&mut sim, SM_KEY).expect("a trusted request is answered");
    assert_eq!(trusted.len(), plain.len());
    assert_eq!(
        trusted.iter().filter(|k| **k == KEY).count(),
        usize::from(HOSTS),
        "every host's M_Key: {trusted:x?}"
    );
    assert_eq!(sm(&mut sim).sm.stats().sa_bad_sm_key, 0);
    let answered = sm(&mut sim).sm.stats().sa_requests;
    assert_eq!(mkeys(&mut sim, WRONG), None, "a wrong SM_Key was answered");
    let st = sm(&mut sim).sm.stats();
    assert!(st.sa_bad_sm_key >= 1);
    assert_eq!(
        st.sa_requests - answered,
        st.sa_bad_sm_key,
        "each one dropped"
    );
}
