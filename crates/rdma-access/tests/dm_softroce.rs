//! The port's MAD services over the soft RoCE NIC on 127.0.111.x: the DM
//! agent, the CM and status replies share QP1; requests to nobody retry
//! and time out; discovery and CM connections complete under 5 % loss
//! (the NIC's fault injector at both ends).

mod mad_common;
use mad_common::{dm_and_cm_share_qp1, dm_and_cm_under_loss, pair, Kind};

#[test]
fn dm_discovery_status_replies_timeouts_and_cm_share_qp1() {
    let p = pair(Kind::SoftRoce, 1, 0.0);
    assert!(!p.a.has_smi(), "RoCE has no QP0");
    dm_and_cm_share_qp1(&p);
}

#[test]
fn dm_discovery_and_cm_complete_under_five_percent_loss() {
    dm_and_cm_under_loss(&pair(Kind::SoftRoce, 3, 0.05));
}
