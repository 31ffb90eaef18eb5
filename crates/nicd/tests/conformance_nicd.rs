//! The verbs conformance suite over the NIC daemon's client provider: a
//! daemon in this process serving two soft RoCE CAs on loopback
//! addresses, every verb through its socket, every packet through real
//! UDP sockets. Gaps: those of soft RoCE (APM, P_Key control) and raw
//! QP1 sends (a client's QP1 is a place at the daemon's shared QP1,
//! which routes MADs by their contents: `tests/cm.rs` runs the CM over it).

mod common;

verbs::conformance_tests!(common::Two::new(0));
