//! Plug and play beyond the CAs present at registration: a CA attached
//! later is reported by a rescan (and watched from then on), P_Key table
//! changes and CA removals reach registered clients, on the loopback
//! fabric and on soft RoCE (127.0.176.x).

use rdma_access::resource::{AccessLayer, PnpEvent};
use rdma_types::{Guid, Pkey, PortNum};
use rnic::loopback::{CaConfig, Fabric};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn register(al: &AccessLayer) -> Receiver<PnpEvent> {
    let (tx, rx) = mpsc::channel();
    al.register_pnp(move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    rx
}

/// What arrived so far, without waiting.
fn drain(rx: &Receiver<PnpEvent>) -> Vec<PnpEvent> {
    rx.try_iter().collect()
}

fn wait_for(rx: &Receiver<PnpEvent>, want: PnpEvent) {
    let end = std::time::Instant::now() + T;
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(e) if e == want => return,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("no {want:?} within {T:?}");
}

#[test]
fn a_ca_attached_after_registration_is_reported_and_watched() {
    let f = Fabric::new();
    f.add_ca(CaConfig::simple(0xc1, 1)).unwrap();
    let al = AccessLayer::new(f.clone());
    let (early, late) = (register(&al), register(&al));
    for rx in [&early, &late] {
        assert_eq!(
            drain(rx),
            vec![
                PnpEvent::CaAdded(Guid(0xc1)),
                PnpEvent::PortActive(Guid(0xc1), PortNum(1))
            ]
        );
    }
    assert!(al.rescan().is_empty(), "nothing new yet");
    f.add_ca(CaConfig::simple(0xc2, 2)).unwrap();
    assert_eq!(al.rescan(), vec![Guid(0xc2)]);
    for rx in [&early, &late] {
        assert_eq!(
            drain(rx),
            vec![
                PnpEvent::CaAdded(Guid(0xc2)),
                PnpEvent::PortActive(Guid(0xc2), PortNum(1))
            ]
        );
    }
    assert!(al.rescan().is_empty(), "reported once");
    // Watched from then on: its port events reach the clients.
    f.set_port_active(Guid(0xc2), PortNum(1), false).unwrap();
    wait_for(&early, PnpEvent::PortDown(Guid(0xc2), PortNum(1)));
    // A client registering now hears of both at once.
    let now = register(&al);
    let got = drain(&now);
    assert!(got.contains(&PnpEvent::CaAdded(Guid(0xc1))), "{got:?}");
    assert!(got.contains(&PnpEvent::CaAdded(Guid(0xc2))), "{got:?}");
}

#[test]
fn pkey_changes_and_removals_reach_registered_clients_on_loopback() {
    let f = Fabric::new();
    f.add_ca(CaConfig::simple(0xd1, 1)).unwrap();
    let al = AccessLayer::new(f.clone());
    let rx = register(&al);
    drain(&rx);
    f.set_pkeys(Guid(0xd1), PortNum(1), vec![Pkey::DEFAULT, Pkey(0x8010)])
        .unwrap();
    wait_for(&rx, PnpEvent::PkeyChange(Guid(0xd1), PortNum(1)));
    f.remove_ca(Guid(0xd1)).unwrap();
    wait_for(&rx, PnpEvent::CaRemoved(Guid(0xd1)));
    assert!(al.rescan().is_empty(), "a removed CA is not added");
    // Attached again under the same GUID: a new CA to the clients.
    f.add_ca(CaConfig::simple(0xd1, 1)).unwrap();
    assert_eq!(al.rescan(), vec![Guid(0xd1)]);
    assert_eq!(
        drain(&rx),
        vec![
            PnpEvent::CaAdded(Guid(0xd1)),
            PnpEvent::PortActive(Guid(0xd1), PortNum(1))
        ]
    );
    f.set_pkeys(Guid(0xd1), PortNum(1), vec![Pkey::DEFAULT])
        .unwrap();
    wait_for(&rx, PnpEvent::PkeyChange(Guid(0xd1), PortNum(1)));
}

#[test]
fn pkey_changes_and_removals_reach_registered_clients_on_soft_roce() {
    let ca = |g, h| SoftCa {
        guid: Guid(g),
        ip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 176, h)),
    };
    let p = SoftRoce::new(vec![ca(0xe1, 31), ca(0xe2, 32)], ROCE_PORT);
    // Only an ib port has a P_Key table an SM sets.
    p.set_personality(Guid(0xe1), Personality::Ib).unwrap();
    let al = AccessLayer::new(p.clone());
    let rx = register(&al);
    let first = drain(&rx);
    assert!(first.contains(&PnpEvent::CaAdded(Guid(0xe1))), "{first:?}");
    assert!(first.contains(&PnpEvent::CaAdded(Guid(0xe2))), "{first:?}");
    p.set_pkeys(Guid(0xe1), &[Pkey::DEFAULT, Pkey(0x8020)])
        .unwrap();
    wait_for(&rx, PnpEvent::PkeyChange(Guid(0xe1), PortNum(1)));
    p.remove_ca(Guid(0xe2)).unwrap();
    wait_for(&rx, PnpEvent::CaRemoved(Guid(0xe2)));
    // Soft RoCE lists a removed CA still, but it cannot be opened: not
    // reported as added.
    assert!(al.rescan().is_empty());
}
