//! Optional device capabilities: what a provider (or one configured to
//! leave some out, like the loopback's `Fabric::without`) may lack. The
//! conformance suite (cargo feature `conformance`) skips the cases of a
//! declared gap and checks the provider answers `NotSupported` there.

/// Optional features a provider may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Unreliable connected QPs.
    Uc,
    /// UD QPs and address handles.
    Ud,
    /// QP0/QP1.
    SpecialQp,
    /// Shared receive queues.
    Srq,
    /// Memory windows.
    Mw,
    /// Atomics.
    Atomics,
    /// Port up/down, LID/P_Key change and CA removal controlled by tests.
    PortControl,
    /// The SQE state (IBA 10.3.1.6): a UC/UD send error stops the send
    /// queue only, and modify SQE->RTS resumes it. A provider lacking it
    /// takes the QP to ERR instead, which the SQE case checks.
    Sqe,
    /// Path migration (APM, IBA 17.2.8): alternate paths in modify-QP,
    /// forced and automatic migration, the PathMigrated event. The
    /// fixture's CAs need an active port 2 for the alternate path. A
    /// provider lacking it refuses an alternate path with `NotSupported`.
    Apm,
    /// P_Key tables set by the fixture as an SM would (the conformance
    /// fixture's `set_pkeys`); a RoCE port's table is fixed.
    PkeyControl,
    /// Immediate data (SEND and RDMA WRITE with immediate). iWARP's RDMAP
    /// (RFC 5040) has none; a provider lacking it refuses those opcodes
    /// with `NotSupported`.
    Immediate,
    /// The responder's verdict in the requester's completion: a SEND or
    /// RDMA WRITE the responder refuses completes with RemAccessErr,
    /// RemInvReqErr or RemOpErr, and a SEND finding no receive waits (RNR)
    /// or fails with RnrRetryExcErr. iWARP lacks it: a Send or Write
    /// completes once TCP took it (RFC 5040 5.x), a refusal comes back as
    /// a TERMINATE that takes the requester's QP to ERR with `QpFatal`,
    /// and a Send with no receive posted is such a refusal; a requester's
    /// local error ends the stream too, flushing the responder's
    /// receives. The cases check that behaviour instead.
    RemoteErrorCompletion,
    /// A QP1 that carries whatever a consumer posts to the QP1 it names.
    /// A provider whose QP1 is a place at a port several processes share
    /// (the NIC daemon's client: the daemon picks each MAD's process by
    /// its contents, and refuses what is not a MAD a client may send)
    /// makes GSI QPs but lacks this: the special-QP case checks them made
    /// (QPN 1, one per port, no QP0 on RoCE) and skips the raw send.
    RawGsi,
}
