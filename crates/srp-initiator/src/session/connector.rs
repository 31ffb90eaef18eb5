//! How a session reaches its target: the [`Connector`] a login goes
//! through (RDMA CM, IB CM, or a direct call in tests) and what it is told
//! and answers.

use super::*;

/// This side's QP, for the CM REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: Qpn,
    /// Starting PSN in the CM message: the first PSN this side expects to
    /// receive; the peer sends from it (IBA 12.7.25, as Linux ib_cm does).
    pub psn: Psn,
    /// Port GID.
    pub gid: Gid,
    /// Port LID (0 on RoCE).
    pub lid: Lid,
    /// Path MTU.
    pub mtu: Mtu,
}

/// What the CM brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    /// The target's QP.
    pub peer: QpInfo,
    /// REP private data (SRP_LOGIN_RSP).
    pub private_data: Vec<u8>,
    /// The connector's handle of the connection, for `disconnect`.
    pub handle: u64,
    /// The first PSN this side receives when the CM chose it, not the
    /// session (librdmacm: the kernel's CM announces its own in the REQ);
    /// `None`: the session's `QpInfo::psn`.
    pub local_psn: Option<Psn>,
}

/// Where a login was sent, as the errors that say nothing took it name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginAddress {
    /// RDMA CM: the target's address and port (ib_srp's `dest=`).
    RdmaCm(std::net::SocketAddr),
    /// IB CM: a service ID at a port's GID (ib_srp's `service_id=`).
    IbCm {
        /// The target port's GID.
        dgid: Gid,
        /// The service ID.
        service_id: u64,
    },
}

impl LoginAddress {
    /// Which kind of address this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            LoginAddress::RdmaCm(_) => "RDMA CM port",
            LoginAddress::IbCm { .. } => "IB CM",
        }
    }
}

impl std::fmt::Display for LoginAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoginAddress::RdmaCm(a) => write!(f, "{a}"),
            LoginAddress::IbCm { dgid, service_id } => {
                write!(f, "service ID {service_id:016x} of {dgid}")
            }
        }
    }
}

/// Why a connection attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The target answered with a REJ carrying this private data
    /// (SRP_LOGIN_REJ for a consumer-defined reject).
    #[error("connection rejected")]
    Rejected(Vec<u8>),
    /// Nothing answered the REQ after every retry: no CM at the address,
    /// so no target running there (or no host).
    #[error("nothing answered SRP logins at {0} ({kind})", kind = .0.kind())]
    NoAnswer(LoginAddress),
    /// The peer's CM answered that nothing listens there (REJ reason 8,
    /// invalid service ID, IBA 12.6.7.2): the target listens elsewhere.
    #[error(
        "nothing listens for SRP logins at {0} ({kind}; its CM rejected the login: invalid service ID)",
        kind = .0.kind()
    )]
    NoListener(LoginAddress),
    /// No answer, no route, or a CM-level reject; in words.
    #[error("connection failed: {0}")]
    Failed(String),
}

/// A connection manager as the session needs it: send a REQ with the login
/// and this QP, and get the REP (or REJ) back.
pub trait Connector: Send + Sync {
    /// Connects; `login` is the REQ private data.
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError>;
    /// Tears the connection down (DREQ); idempotent.
    fn disconnect(&self, handle: u64);
    /// Which private-data layout the login uses.
    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// Login private data layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginForm {
    /// 64-byte SRP_LOGIN_REQ (IB CM).
    IbCm,
    /// 56-byte SRP_LOGIN_REQ after the RDMA CM header.
    RdmaCm,
}
