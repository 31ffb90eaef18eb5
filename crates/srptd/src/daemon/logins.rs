//! srptd's SRP login service: [`srp_target::cm::serve`] for a target
//! port, its [`LoginEvent`]s written as srptd's log records.

use crate::log::{Log, Record};
use srp_target::cm::{Listen, LoginEvent};
use srp_target::TargetPort;
use std::sync::Arc;

/// Serves SRP logins for `target` until the agent stops
/// ([`srp_target::cm::serve`]), logging what happens as srptd's records:
/// `login_accepted`, `login_rejected`, `request_refused` and `logout`
/// (with who closed the channel and why).
pub fn serve_logins(
    agent: Arc<rdma_access::CmAgent>,
    target: Arc<TargetPort>,
    listen: Listen,
    log: Log,
) -> Vec<std::thread::JoinHandle<()>> {
    let name = target.name().to_string();
    srp_target::cm::serve(agent, target, listen, move |ev| {
        let record = match ev {
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
