//! Real processes on 127.0.155.x: `ibsm run --lmc 1` gives two `ib`
//! nodes' ports two LIDs each (even base, PortInfo:LMC 1), and `saquery`
//! lists the four paths between them, one per (SLID, DLID) pair, best
//! first; `--max` limits them, and the access layer's
//! `SaClient::all_paths` gets the same four.

mod common;

use common::{saquery, Ibsm};
use rdma_access::sa::{SaClient, SaTiming};
use rdma_access::sma::state;
use rdma_access::IbNode;
use rdma_types::{Gid, Guid};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 155, last))
}

/// The (slid, dlid) of each `slid A dlid B ...` line, in order.
fn lid_pairs(out: &str) -> Vec<(u16, u16)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["slid", s, "dlid", d, ..] => Some((s.parse().ok()?, d.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn saquery_lists_a_path_per_lid_pair_with_lmc_1() {
    let guid = |l: u8| Guid(0x1550_0000 | u64::from(l));
    let p = SoftRoce::new(
        [2u8, 3]
            .iter()
            .map(|&l| SoftCa {
                guid: guid(l),
                ip: ip(l),
            })
            .collect(),
        ROCE_PORT,
    );
    let nodes: Vec<IbNode> = [2u8, 3]
        .iter()
        .map(|&l| {
            common::ib_node(
                p.clone(),
                guid(l),
                &format!("lmc-node-{l}"),
                false,
                u32::from(l) << 16,
            )
            .unwrap()
        })
        .collect();
    let (a, n2, n3) = (ip(1).to_string(), ip(2).to_string(), ip(3).to_string());
    let sm = Ibsm::start(
        "lmc",
        &[
            "--addr",
            &a,
            "--node",
            &n2,
            "--node",
            &n3,
            "--lmc",
            "1",
            "--sweep-interval-ms",
            "300",
        ],
    );
    for n in &nodes {
        assert!(
            n.sma().wait_state(state::ACTIVE, Duration::from_secs(10)),
            "{}",
            sm.output()
        );
    }
    let base: Vec<u16> = nodes.iter().map(|n| n.sma().lid()).collect();
    for (n, b) in nodes.iter().zip(&base) {
        assert_eq!(n.sma().lmc(), 1);
        assert!(*b >= 2 && b.is_multiple_of(2), "base LID {b}");
    }
    assert_ne!(base[0], base[1]);
    let out = sm.wait_output(Duration::from_secs(5), |o| {
        o.matches("ACTIVE, LIDs").count() == 2
    });
    assert!(out.contains("LMC 1"), "{out}");

    // The SA lists a node once the SM has finished with it: ask until the
    // paths are there (bounded).
    let end = Instant::now() + Duration::from_secs(5);
    let out = loop {
        let (ok, out) = saquery(
            "127.0.155.1",
            "127.0.155.9",
            &["paths", "--sgid", &n2, "--dgid", &n3, "--max", "0"],
        );
        if ok && out.contains("4 path records") {
            break out;
        }
        assert!(Instant::now() < end, "{out}\n{}", sm.output());
        std::thread::sleep(Duration::from_millis(50));
    };
    let (b2, b3) = (base[0], base[1]);
    let pairs = lid_pairs(&out);
    assert_eq!(
        pairs,
        vec![(b2, b3), (b2 + 1, b3 + 1), (b2, b3 + 1), (b2 + 1, b3)],
        "{out}"
    );
    assert_eq!(out.matches("preference 0").count(), 2, "{out}");
    // --max limits; the default (4) gets them all here.
    let (ok, out) = saquery(
        "127.0.155.1",
        "127.0.155.9",
        &["paths", "--sgid", &n2, "--dgid", &n3, "--max", "2"],
    );
    assert!(ok, "{out}");
    assert_eq!(lid_pairs(&out), vec![(b2, b3), (b2 + 1, b3 + 1)], "{out}");
    let (ok, out) = saquery(
        "127.0.155.1",
        "127.0.155.9",
        &["paths", "--sgid", &n2, "--dgid", &n3, "--max", "1"],
    );
    assert!(ok && out.contains("1 path records"), "{out}");
    assert_eq!(lid_pairs(&out), vec![(b2, b3)], "{out}");
    // NodeRecords name ports by their base LIDs.
    let (ok, out) = saquery("127.0.155.1", "127.0.155.9", &["nodes"]);
    assert!(ok && out.contains("2 node records"), "{out}");
    for b in &base {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{b} "))),
            "{out}"
        );
    }

    // The access layer's call for every path of a pair.
    let sa = SaClient::new(nodes[0].agent(), Gid::from_ip(ip(1)), SaTiming::default()).unwrap();
    let all = sa
        .all_paths(Gid::from_ip(ip(2)), Gid::from_ip(ip(3)), None)
        .unwrap();
    let got: HashSet<(u16, u16)> = all.iter().map(|p| (p.slid, p.dlid)).collect();
    assert_eq!(got.len(), 4);
    assert_eq!((all[0].slid, all[0].dlid), (b2, b3), "best first");
}
