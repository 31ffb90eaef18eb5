//! The verbs conformance suite over the NIC daemon's client provider
//! with both ends of each case on one soft RoCE CA of the daemon: the
//! client's rings are taken by that NIC's own thread (with two CAs, as
//! in `conformance_nicd.rs`, a poller takes them). All cases but
//! `special_qps`, which opens a QP1 at each end (a client has one per
//! port; `conformance_nicd.rs` runs it).

mod common;

verbs::conformance_tests!(@cases common::Two::one_nic(160);
    query_ca_port, stale_handles_and_destroy, busy_resources, qp_state_machine, rc_send, rc_write, rc_read,
    rc_atomics, remote_access_errors_and_flush, local_protection_error, receive_too_small, rnr,
    batch_post_reports_index, cq_notify_wait_overflow, mr_rereg_dereg, mw_type1, mw_type2_and_invalidate, mw_refusals,
    ud_send_grh, srq_limit, uc_basics, port_and_ca_events, destroy_from_callback,
    local_qp_operation_error, remote_operational_error, sqe_and_resume, pkey_change,
    apm_forced_migration, apm_port_down);

/// The rings of this suite's client are the NIC thread's: no poller.
#[test]
fn the_nics_thread_takes_the_rings() {
    let f = common::Two::one_nic(160);
    verbs::conformance::run("rc_send", &f, verbs::conformance::cases::rc_send);
    let posts = f.client.counters().ring_posts;
    assert!(posts > 0, "no post went by a ring");
    assert_eq!(f.daemon.server.ring_pollers(), 0);
}
