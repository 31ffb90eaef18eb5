//! A port's GIDs as this provider shows them: the one to use first.
//!
//! The verbs consumers of this workspace address a RoCE peer with the
//! port's GID 0 (`AhAttr::roce`, the conformance suite, the CM agents),
//! as soft RoCE numbers its table. A device's table starts with entries
//! no peer can route to (rxe: `fe80::` from the MAC, then
//! `::ffff:a.b.c.d`; a ConnectX: RoCE v1 and v2 of each address). So the
//! provider shows a *view*: position 0 is the entry rdma-core's tools
//! would pick, the other valid entries follow in table order, and a GID
//! index in an address vector is a position in the view, mapped to the
//! device's index when it reaches the device.

use crate::sys::raw::{ibv_gid_entry, IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2};
use rdma_types::Gid;

/// A port's GIDs, the preferred one first, with the device's index of
/// each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct GidView {
    /// The GIDs, view order.
    pub gids: Vec<Gid>,
    /// The device's table index of each.
    pub index: Vec<u32>,
}

impl GidView {
    /// The device's index of view position `pos`.
    pub(crate) fn device_index(&self, pos: u8) -> Option<u32> {
        self.index.get(usize::from(pos)).copied()
    }
}

/// How good an entry is as a port's GID: an IPv4-mapped address first (a
/// RoCE peer reached by IPv4), then RoCE v2 over v1 over IB, as perftest's
/// `get_best_gid_index` ranks them (an unknown type ranks as IB).
fn rank(e: &ibv_gid_entry) -> (bool, u8) {
    let version = match e.gid_type {
        IBV_GID_TYPE_ROCE_V2 => 2,
        IBV_GID_TYPE_ROCE_V1 => 1,
        IBV_GID_TYPE_IB => 0,
        _ => 0,
    };
    (Gid(e.gid.raw).is_ipv4_mapped(), version)
}

/// The view of `entries` (a port's valid entries in table order). The
/// first entry of the best rank leads, or the entry at device index
/// `override_index` when there is one (`None` in `.1` when the override
/// names no valid entry: the automatic choice leads then).
pub(crate) fn view(entries: &[ibv_gid_entry], override_index: Option<u32>) -> (GidView, bool) {
    let valid: Vec<&ibv_gid_entry> = entries.iter().filter(|e| e.gid.raw != [0; 16]).collect();
    let forced = override_index.and_then(|i| valid.iter().position(|e| e.gid_index == i));
    let best = forced.or_else(|| {
        // The first of the highest rank: `max_by_key` keeps the last of
        // equals, so compare against the earlier position.
        valid
            .iter()
            .enumerate()
            .max_by(|(i, a), (j, b)| rank(a).cmp(&rank(b)).then(j.cmp(i)))
            .map(|(i, _)| i)
    });
    let mut v = GidView::default();
    let order = best
        .into_iter()
        .chain((0..valid.len()).filter(|i| Some(*i) != best));
    for i in order {
        v.gids.push(Gid(valid[i].gid.raw));
        v.index.push(valid[i].gid_index);
    }
    (v, override_index.is_none() || forced.is_some())
}

/// The device index of the port's first RoCE v2 entry that is not an
/// IPv4 address (its interface's IPv6 link-local address, on rxe): what
/// MADs go from when they must carry a GRH (see `umad::neighbour_link_local`).
pub(crate) fn ipv6_roce_v2(entries: &[ibv_gid_entry]) -> Option<u32> {
    entries
        .iter()
        .find(|e| {
            e.gid_type == IBV_GID_TYPE_ROCE_V2
                && e.gid.raw != [0; 16]
                && !Gid(e.gid.raw).is_ipv4_mapped()
        })
        .map(|e| e.gid_index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::raw::ibv_gid;
    use std::net::{IpAddr, Ipv4Addr};

    fn e(index: u32, gid: Gid, gid_type: u32) -> ibv_gid_entry {
        ibv_gid_entry {
            gid: ibv_gid { raw: gid.0 },
            gid_index: index,
            port_num: 1,
            gid_type,
            ndev_ifindex: 0,
        }
    }

    fn link_local() -> Gid {
        Gid::parse_hex("fe80000000000000505400fffe770011").unwrap()
    }

    fn v4(last: u8) -> Gid {
        Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 77, 0, last)))
    }

    /// MADs that need a GRH go from the RoCE v2 entry of the link-local
    /// address: rxe's first entry, a ConnectX's second; none where the
    /// port has only IPv4 entries or only RoCE v1 ones.
    #[test]
    fn mads_go_from_the_roce_v2_link_local_entry() {
        let rxe = [e(0, link_local(), 2), e(1, v4(11), 2)];
        assert_eq!(ipv6_roce_v2(&rxe), Some(0));
        let cx = [
            e(0, link_local(), 1),
            e(1, link_local(), 2),
            e(2, v4(11), 1),
            e(3, v4(11), 2),
        ];
        assert_eq!(ipv6_roce_v2(&cx), Some(1));
        assert_eq!(ipv6_roce_v2(&[e(0, v4(11), 2)]), None);
        assert_eq!(ipv6_roce_v2(&[e(0, link_local(), 1)]), None);
    }

    /// rxe's table: fe80:: from the MAC, then the interface's IPv4
    /// address, both RoCE v2 (what `ibv_devinfo -v` shows in the VMs).
    #[test]
    fn rxe_puts_its_ipv4_gid_first() {
        let t = [e(0, link_local(), 2), e(1, v4(11), 2)];
        let (v, ok) = view(&t, None);
        assert!(ok);
        assert_eq!(v.gids, [v4(11), link_local()]);
        assert_eq!(v.index, [1, 0]);
        assert_eq!(v.device_index(0), Some(1));
        assert_eq!(v.device_index(2), None);
    }

    /// A ConnectX in RoCE mode: v1 and v2 of each address; the v2 entry
    /// of the IPv4 address wins, as perftest picks it.
    #[test]
    fn roce_v2_of_the_ipv4_address_wins() {
        let t = [
            e(0, link_local(), 1),
            e(1, link_local(), 2),
            e(2, v4(5), 1),
            e(3, v4(5), 2),
            e(4, v4(6), 2),
        ];
        let (v, _) = view(&t, None);
        assert_eq!(v.index, [3, 0, 1, 2, 4]);
    }

    /// An IB port: all entries IB, the port GID (index 0) stays first;
    /// empty entries are left out; an unknown type ranks as IB.
    #[test]
    fn an_ib_port_keeps_its_port_gid_first() {
        let t = [
            e(0, link_local(), 0),
            e(1, Gid::ZERO, 0),
            e(2, Gid([0xfe; 16]), u32::MAX),
        ];
        let (v, _) = view(&t, None);
        assert_eq!(v.index, [0, 2]);
    }

    #[test]
    fn an_override_leads_unless_it_names_no_entry() {
        let t = [e(0, link_local(), 2), e(1, v4(11), 2)];
        let (v, ok) = view(&t, Some(0));
        assert!(ok);
        assert_eq!(v.index, [0, 1]);
        let (v, ok) = view(&t, Some(7));
        assert!(!ok);
        assert_eq!(v.index, [1, 0]);
        assert_eq!(view(&[], None), (GidView::default(), true));
    }
}
