//! The verbs conformance suite against the soft iWARP provider: two NICs
//! on their own loopback addresses (127.94.x.y), every byte through real
//! kernel TCP streams.

mod common;

use common::Iwarp;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};

/// Each fixture gets its own pair of addresses, so cases run in parallel.
static NEXT: AtomicU32 = AtomicU32::new(0);

fn fixture() -> Iwarp {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let ip = |k: u32| {
        IpAddr::V4(Ipv4Addr::new(
            127,
            94,
            (n / 100) as u8,
            (2 * (n % 100) + k) as u8 + 1,
        ))
    };
    common::pair(ip(0), ip(1))
}

verbs::conformance_tests!(fixture());
