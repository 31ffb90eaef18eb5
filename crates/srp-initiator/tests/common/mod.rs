//! The in-process connector the initiator's tests log in with.

use srp::target::LoginForm as TargetForm;
use srp_initiator::session::{ConnectError, Connected, Connector, LoginForm, QpInfo};
use srp_target::{LoginOutcome, PeerQp, TargetPort};
use std::sync::Arc;

/// Logs in by calling the target port's login entry point directly, the
/// way a CM would with the REQ's private data.
pub struct Direct {
    pub port: Arc<TargetPort>,
    /// The LID the target port answers with (0 on RoCE).
    pub lid: rdma_types::Lid,
    /// Called after each disconnect reached the target (a test's gate).
    pub on_disconnect: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Connector for Direct {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let peer = PeerQp {
            qpn: local.qpn,
            psn: local.psn,
            gid: local.gid,
            lid: local.lid,
            mtu: local.mtu,
        };
        match self.port.login(login, TargetForm::RdmaCm, peer) {
            LoginOutcome::Accepted {
                conn,
                local: t,
                rsp,
            } => Ok(Connected {
                peer: QpInfo {
                    qpn: t.qpn,
                    psn: t.psn,
                    gid: self.port.gid(),
                    lid: self.lid,
                    mtu: local.mtu,
                },
                private_data: rsp,
                handle: conn.0,
            }),
            LoginOutcome::Rejected { rej, .. } => Err(ConnectError::Rejected(rej)),
        }
    }
    fn disconnect(&self, handle: u64) {
        self.port.disconnected(srp_target::ConnId(handle));
        if let Some(f) = &self.on_disconnect {
            f();
        }
    }
    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}
