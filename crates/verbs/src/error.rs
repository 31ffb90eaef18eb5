//! The one error type of the verbs interface.

use rdma_types::QpState;

/// Why a verb was refused. Completion errors are [`rdma_types::WcStatus`]
/// in a work completion, not this type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// The provider does not implement this verb or feature.
    #[error("not supported by this provider: {0}")]
    NotSupported(&'static str),
    /// The handle is unknown, of another CA, or already destroyed.
    #[error("invalid or stale handle")]
    InvalidHandle,
    /// No CA with this GUID is attached.
    #[error("no such CA")]
    NoSuchCa,
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The QP state transition is not allowed (IBA 10.3.1).
    #[error("invalid QP transition {from} -> {to}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute for the transition is missing.
    #[error("missing attribute {attr} for QP transition {from} -> {to}")]
    MissingAttribute {
        /// Attribute name.
        attr: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// An attribute not allowed for the transition was given.
    #[error("attribute {attr} not allowed for QP transition {from} -> {to}")]
    UnexpectedAttribute {
        /// Attribute name.
        attr: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The object is in use (an MR with a bound window, a PD with children).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The work queue is full.
    #[error("work queue full")]
    QueueFull,
    /// A limit (queue depth, SGE count, table size) was exceeded.
    #[error("out of resources: {0}")]
    OutOfResources(&'static str),
    /// The QP state does not allow posting this queue.
    #[error("QP in state {0} does not accept this work request")]
    InvalidState(QpState),
    /// A batch post failed at `index`; WRs before it were posted.
    #[error("work request {index} refused: {cause}")]
    BadWr {
        /// Index of the first refused WR in the batch.
        index: usize,
        /// Why it was refused.
        cause: Box<VerbsError>,
    },
    /// A blocking wait timed out.
    #[error("timed out")]
    Timeout,
}
