//! The verbs conformance suite against the soft RoCE provider: two CAs on
//! their own loopback addresses, every packet through real UDP sockets.

mod common;

use common::Soft;
use rnic::softroce::ROCE_PORT;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};

/// Each fixture gets its own pair of addresses, so cases can run in parallel.
static NEXT: AtomicU32 = AtomicU32::new(0);

fn fixture() -> Soft {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let ip = |k: u32| {
        IpAddr::V4(Ipv4Addr::new(
            127,
            77,
            (n / 100) as u8,
            (2 * (n % 100) + k) as u8 + 1,
        ))
    };
    Soft::pair(ip(0), ip(1), ROCE_PORT)
}

verbs::conformance_tests!(fixture());
