//! The GUID a soft RoCE CA takes from its address.

use rdma_types::Guid;

/// The GUID of the CA at `ip` (`ibsm`, `srptd`, `srpd`, `srp` and `ibstat`
/// agree on it, in the managed mode and in plain RoCE alike): the
/// Mellanox-style prefix 0002c903, then the IPv4 address (also for an
/// IPv4-mapped IPv6 one), or 32 bits folded from all 128 of another IPv6
/// address, so hosts whose addresses differ only in the prefix (fd00:1::10
/// and fd00:2::10) get GUIDs of their own.
pub fn ip_guid(ip: std::net::IpAddr) -> Guid {
    let low = match ip {
        std::net::IpAddr::V4(a) => u32::from(a),
        std::net::IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => u32::from(v4),
            // FNV-1a over the 16 bytes, folded to 32 bits.
            None => {
                let h = a.octets().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                (h ^ (h >> 32)) as u32
            }
        },
    };
    Guid(0x0002_c903_0000_0000 | u64::from(low))
}

#[cfg(test)]
mod tests {
    use super::ip_guid;

    #[test]
    fn guids_follow_ipv4_and_tell_ipv6_prefixes_apart() {
        let g = |s: &str| ip_guid(s.parse().unwrap()).0;
        assert_eq!(g("10.77.0.2"), 0x0002_c903_0a4d_0002);
        // An IPv4-mapped address is the IPv4 host.
        assert_eq!(g("::ffff:10.77.0.2"), g("10.77.0.2"));
        // Two hosts with one interface ID in two prefixes are two GUIDs.
        assert_ne!(g("fd00:1::10"), g("fd00:2::10"));
        assert_ne!(g("fd00:1::10"), g("fd00:1::11"));
        assert_eq!(g("fd00:1::10") >> 32, 0x0002_c903);
    }
}
