//! Names SCST's ib_srpt shows: the target by its port GID, a session by the
//! initiator port identifier.

use rdma_types::Gid;
use srp::wire::PortId;

/// Target name: the port GID in hex with a colon after every fourth digit
/// (SCST srpt README), e.g. `fe80:0000:0000:0000:0002:c903:000e:8acd`.
pub fn target_name(gid: Gid) -> String {
    let hex: Vec<String> = gid
        .0
        .chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect();
    hex.join(":")
}

/// Session (initiator) name: `0x` and the 16-byte initiator port
/// identifier in hex, as ib_srpt names sessions by port ID.
pub fn initiator_name(id: &PortId) -> String {
    let mut s = String::from("0x");
    for b in id.0 {
        s += &format!("{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::Guid;

    #[test]
    fn names_follow_srpt() {
        let gid = Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0x0002_c903_000e_8acd));
        assert_eq!(target_name(gid), "fe80:0000:0000:0000:0002:c903:000e:8acd");
        let mut id = [0u8; 16];
        id[15] = 0x42;
        id[0] = 0xab;
        assert_eq!(
            initiator_name(&PortId(id)),
            "0xab000000000000000000000000000042"
        );
    }
}
