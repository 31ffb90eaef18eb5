//! Work completion status and opcode (IBA 11.4.2.1), numbered as in
//! libibverbs so that logs read the same as rdma-core's.

/// Completion status of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Completed successfully.
    Success = 0,
    /// Local length error: a message or SGE exceeded a limit.
    LocLenErr = 1,
    /// Local QP operation error (internal consistency).
    LocQpOpErr = 2,
    /// Local EE context operation error.
    LocEecOpErr = 3,
    /// Local protection error: an L_Key or range check failed.
    LocProtErr = 4,
    /// Flushed because the QP entered the error state.
    WrFlushErr = 5,
    /// Memory window bind failed.
    MwBindErr = 6,
    /// Bad response from the responder (unexpected opcode).
    BadRespErr = 7,
    /// Local access error: a received message hit a protection error.
    LocAccessErr = 8,
    /// Remote invalid request (NAK invalid request).
    RemInvReqErr = 9,
    /// Remote access error (NAK remote access).
    RemAccessErr = 10,
    /// Remote operation error (NAK remote operational).
    RemOpErr = 11,
    /// Transport retry counter exceeded.
    RetryExcErr = 12,
    /// RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// Local RDD violation.
    LocRddViolErr = 14,
    /// Remote invalid RD request.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number.
    InvEecnErr = 17,
    /// Invalid EE context state.
    InvEecStateErr = 18,
    /// Fatal error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// General error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Every status, in code order (libibverbs' `enum ibv_wc_status`,
    /// 0..=21).
    pub const ALL: [WcStatus; 22] = {
        use WcStatus::*;
        [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ]
    };

    /// The status of code `code` (libibverbs' numbering), if there is one.
    pub fn from_code(code: u32) -> Option<WcStatus> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// Whether the status is a success.
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }

    /// The words `ibv_wc_status_str` would print.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of work request a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// SEND (with or without immediate/invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare and swap.
    CompSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// Memory window bind.
    BindMw,
    /// Local invalidate.
    LocalInv,
    /// A received SEND.
    Recv,
    /// A received RDMA WRITE with immediate (consumes a receive WQE).
    RecvRdmaWithImm,
}

impl core::fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            WcOpcode::Send => "SEND",
            WcOpcode::RdmaWrite => "RDMA_WRITE",
            WcOpcode::RdmaRead => "RDMA_READ",
            WcOpcode::CompSwap => "COMP_SWAP",
            WcOpcode::FetchAdd => "FETCH_ADD",
            WcOpcode::BindMw => "BIND_MW",
            WcOpcode::LocalInv => "LOCAL_INV",
            WcOpcode::Recv => "RECV",
            WcOpcode::RecvRdmaWithImm => "RECV_RDMA_WITH_IMM",
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_match_libibverbs() {
        // enum ibv_wc_status in rdma-core verbs.h
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
        assert_eq!(WcStatus::RemAccessErr as u32, 10);
        assert_eq!(WcStatus::RetryExcErr as u32, 12);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::GeneralErr as u32, 21);
        assert!(WcStatus::Success.is_success());
        assert!(!WcStatus::LocProtErr.is_success());
        assert_eq!(
            WcStatus::RetryExcErr.to_string(),
            "transport retry counter exceeded"
        );
    }
}
