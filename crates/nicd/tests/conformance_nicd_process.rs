//! The verbs conformance suite over the client provider against a `nicd`
//! process (as users run it): every region registered is a memfd the
//! daemon maps in its own address space, so every RDMA READ, WRITE and
//! atomic of the suite crosses processes. Port control is the daemon's
//! own NIC's, out of this process's reach: declared missing here (the
//! in-process fixture, `conformance_nicd.rs`, runs those cases).

mod common;

verbs::conformance_tests!(common::Spawned::start(150, |p| p));
