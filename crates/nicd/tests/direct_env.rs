//! `nicd::direct`, what a tool runs its QPs on when it uses the daemon's
//! NIC (`nicd::data_path`): its node takes the soft RoCE options of the
//! tool's environment, as a NIC of the tool's own would
//! (`SOFTROCE_GSO=0` here), but for link following, which the daemon's
//! node does. The only test of this file: it sets the environment.

mod common;

use common::{fresh_ip, One};
use verbs::conformance::Node;

#[test]
fn the_node_of_a_tools_own_qps_takes_the_environments_options() {
    let d = common::Daemon::start_shared(&[fresh_ip(210)], nicd::Limits::default(), false);
    let g = d.guids[0];
    let node_options = |gso: Option<&str>| {
        match gso {
            Some(v) => std::env::set_var("SOFTROCE_GSO", v),
            None => std::env::remove_var("SOFTROCE_GSO"),
        }
        let direct = nicd::direct(d.client());
        let _n = Node::open(&One(direct.clone(), g), g, 16);
        let node = direct.nic().expect("a node of this process");
        node.options().clone()
    };
    let off = node_options(Some("0"));
    assert!(!off.gso, "{off:?}");
    assert!(!off.follow_link, "{off:?}");
    let unset = node_options(None);
    assert!(unset.gso && !unset.follow_link, "{unset:?}");
}
