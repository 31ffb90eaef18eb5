//! srptd's SRP login service: [`srp_target::cm::serve_cm`] for a target
//! port, its [`LoginEvent`]s written as srptd's log records.

use crate::log::{Log, Record};
use srp_target::cm::{Listen, LoginEvent};
use srp_target::TargetPort;
use std::sync::Arc;

/// Serves SRP logins for `target` until the CM stops
/// ([`srp_target::cm::serve_cm`]: RDMA CM through `rdma_cm`, IB CM
/// through `ib_cm` when the CA has a CM agent), logging what happens as
/// srptd's records: `login_accepted`, `login_rejected`,
/// `request_refused`, `listen_failed` and `logout` (with who closed the
/// channel and why).
///
/// # Errors
/// The RDMA CM listen failed.
pub fn serve_logins(
    rdma_cm: Arc<dyn rdma_access::rdmacm::Service>,
    ib_cm: Option<Arc<rdma_access::CmAgent>>,
    target: Arc<TargetPort>,
    listen: Listen,
    log: Log,
) -> Result<Vec<std::thread::JoinHandle<()>>, rdma_access::CmError> {
    let name = target.name().to_string();
    srp_target::cm::serve_cm(rdma_cm, ib_cm, target, listen, move |ev| {
        let record = match ev {
            LoginEvent::ListenFailed { what, error } => {
                Record::warn("listen_failed", format!("not listening on {what}: {error}"))
                    .target(name.clone())
                    .field("where", &what)
                    .field("error", &error)
            }
            LoginEvent::RequestRefused { error } => {
                Record::warn("request_refused", format!("refused a request: {error}"))
                    .target(name.clone())
                    .field("error", error.to_string())
            }
            LoginEvent::Accepted {
                src,
                pkey,
                initiator,
                conn,
            } => {
                let r = Record::info(
                    "login_accepted",
                    format!(
                        "login from {src} in P_Key {:04x} accepted (channel {})",
                        pkey.0, conn.0
                    ),
                )
                .target(name.clone())
                .field("src", &src)
                .field("pkey", format!("{:04x}", pkey.0))
                .field("channel", conn.0);
                match initiator {
                    Some(i) => r.session(i),
                    None => r,
                }
            }
            LoginEvent::Rejected {
                src,
                pkey,
                initiator,
                reason,
            } => {
                let r = Record::warn(
                    "login_rejected",
                    format!(
                        "login from {src} in P_Key {:04x} rejected: {reason}",
                        pkey.0
                    ),
                )
                .target(name.clone())
                .field("src", &src)
                .field("pkey", format!("{:04x}", pkey.0))
                .field("reason", reason.to_string());
                match initiator {
                    Some(i) => r.session(i),
                    None => r,
                }
            }
            LoginEvent::Closed {
                conn,
                initiator,
                reason,
            } => Record::info(
                "logout",
                format!(
                    "channel {} of {initiator} closed by the {}: {reason}",
                    conn.0,
                    reason.by().as_str()
                ),
            )
            .target(name.clone())
            .session(initiator)
            .field("channel", conn.0)
            .field("by", reason.by().as_str())
            .field("reason", reason.to_string()),
        };
        log.emit(record);
    })
}
