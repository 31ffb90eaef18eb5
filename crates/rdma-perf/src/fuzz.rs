//! Body of the fuzz target in `fuzz/` (`peer_messages`), shared with the
//! deterministic test `tests/fuzz_inputs.rs`: the messages a peer sends
//! the tools beside the RDMA traffic, which come from whoever connects.
//! The first byte picks the parser, the rest is the message:
//! - 0: perftest's 16-byte version field (`rperftest`);
//! - 1: perftest's text dest message (`rperftest`, Ethernet exchange);
//! - 2: perftest's binary dest message (`rperftest -R`, RDMA CM private
//!   data);
//! - 3: `ibv_rc_pingpong`'s dest message (`rpingpong`);
//! - 4: `rping`'s buffer advertisement (`rrping`).
//!
//! A message that parses must come out of the tool's own writer the
//! same. Must not panic on any input.

use crate::perftest;
use crate::{pingpong, rping};

/// See the module docs.
pub fn peer_messages(data: &[u8]) {
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => {
            if let Ok(v) = perftest::parse_version(msg) {
                assert!(v.value >= 5.70, "{v:?}");
            }
        }
        1 => {
            if let Ok(d) = perftest::Dest::from_msg(msg) {
                assert_eq!(perftest::Dest::from_msg(&d.to_msg()).ok(), Some(d));
            }
        }
        2 => {
            if let Ok(d) = perftest::Dest::from_bin(msg) {
                assert_eq!(perftest::Dest::from_bin(&d.to_bin()).ok(), Some(d));
            }
        }
        3 => {
            if let Ok(d) = pingpong::Dest::from_msg(msg) {
                assert_eq!(pingpong::Dest::from_msg(&d.to_msg()).ok(), Some(d));
            }
        }
        _ => {
            if let Some((buf, rkey, size)) = rping::parse_info(msg) {
                assert_eq!(
                    rping::parse_info(&rping::info(buf, rkey, size)),
                    Some((buf, rkey, size))
                );
            }
        }
    }
}
