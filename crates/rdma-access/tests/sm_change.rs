//! A port's master SM LID changing reaches the access layer's PnP
//! clients as `PnpEvent::SmChange` (soft RoCE raises the verbs
//! `SmChange` event when the SMA is told of a new master), once per
//! change: the same SM LID again is no change.

use rdma_access::resource::{AccessLayer, PnpEvent};
use rdma_types::{Guid, Lid, PortNum};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn a_new_master_sm_lid_is_an_sm_change_event() {
    let guid = Guid(0x1500_0020);
    let p = SoftRoce::new(
        vec![SoftCa {
            guid,
            ip: IpAddr::V4(Ipv4Addr::new(127, 0, 150, 20)),
        }],
        ROCE_PORT,
    );
    p.set_personality(guid, Personality::Ib).unwrap();
    let events: Arc<Mutex<Vec<PnpEvent>>> = Arc::default();
    let al = AccessLayer::new(p.clone());
    let ev = events.clone();
    al.register_pnp(move |e| ev.lock().unwrap().push(e))
        .unwrap();
    let change = PnpEvent::SmChange(guid, PortNum(1));
    let count = || {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| **e == change)
            .count()
    };
    let wait = |n: usize| {
        let end = Instant::now() + Duration::from_secs(5);
        while count() < n && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        count()
    };
    assert_eq!(count(), 0);
    p.set_sm_lid(guid, Lid(1)).unwrap();
    assert_eq!(wait(1), 1);
    p.set_sm_lid(guid, Lid(1)).unwrap(); // the same master: no event
    p.set_sm_lid(guid, Lid(2)).unwrap(); // a new one
    assert_eq!(wait(2), 2);
    assert_eq!(count(), 2, "the repeated SM LID raised nothing");
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, PnpEvent::LidChange(..))),
        "an SM change is not a LID change"
    );
}
