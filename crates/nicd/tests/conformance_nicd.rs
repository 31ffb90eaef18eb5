//! The verbs conformance suite over the NIC daemon's client provider: a
//! daemon in this process serving two soft RoCE CAs on loopback
//! addresses, every verb through its socket, every packet through real
//! UDP sockets. Gaps: those of soft RoCE (APM, P_Key control) and
//! QP0/QP1, which the daemon does not serve yet.

mod common;

verbs::conformance_tests!(common::Two::new(0));
