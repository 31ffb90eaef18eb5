//! The port's MAD services over the loopback provider: the DM agent, the
//! CM and status replies share QP1; requests to nobody retry and time
//! out; discovery and CM connections complete under 5 % MAD loss.

mod mad_common;
use mad_common::{dm_and_cm_share_qp1, dm_and_cm_under_loss, pair, Kind};

#[test]
fn loopback_dm_cm_status_and_timeout_share_qp1() {
    dm_and_cm_share_qp1(&pair(Kind::Loopback, 0, 0.0));
}

#[test]
fn loopback_dm_and_cm_complete_under_five_percent_loss() {
    dm_and_cm_under_loss(&pair(Kind::Loopback, 0, 0.05));
}
