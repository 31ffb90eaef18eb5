//! `srpd --nicd` across a restart of the NIC daemon: each soft CA's CM
//! agent sits in an [`AgentSlot`], which its logins' connectors reach
//! RDMA CM through, and a watcher thread starts a new agent in the slot
//! when the daemon's return brings the CA back.
//!
//! When the daemon dies, the client provider tells every open CA of its
//! removal: each login's channels fail and its LUNs wait in the remote
//! port state machine (their files stay), and the CA's CM agent is
//! removed. The watcher sees that, and every [`WATCH_EVERY`] tries to
//! start an agent on the CA again (the provider connects anew when the
//! daemon is back); then the LUNs' next reconnect logs in through it,
//! and their files serve again under the same names.

use rdma_access::rdmacm::{ConnHook, Listened, Service};
use rdma_access::{CmAgent, CmError, ConnId, Established};
use rdma_types::{Guid, Psn, Qpn};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// How often the watcher looks for a removed agent, and tries again to
/// start one while the daemon is away.
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// The CM agent of one soft CA now; a new one replaces it after the
/// CA's removal and return.
pub struct AgentSlot {
    cur: RwLock<Arc<CmAgent>>,
    /// The hooks set through [`Service`], set again on each new agent.
    hooks: Mutex<(Option<ConnHook>, Option<ConnHook>)>,
}

impl AgentSlot {
    /// A slot holding `agent`.
    pub fn new(agent: Arc<CmAgent>) -> Arc<AgentSlot> {
        Arc::new(AgentSlot {
            cur: RwLock::new(agent),
            hooks: Mutex::new((None, None)),
        })
    }

    /// The agent now.
    pub fn get(&self) -> Arc<CmAgent> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `agent` in place of the removed one.
    fn replace(&self, agent: Arc<CmAgent>) {
        let (disc, est) = self.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = disc {
            Service::on_disconnect(&*agent, h);
        }
        if let Some(h) = est {
            Service::on_established(&*agent, h);
        }
        *self.cur.write().unwrap_or_else(|e| e.into_inner()) = agent;
    }
}

impl Service for AgentSlot {
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError> {
        Service::listen(&*self.get(), port)
    }

    fn connect(
        &self,
        src: IpAddr,
        dst: std::net::SocketAddr,
        qpn: Qpn,
        psn: Psn,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Established, CmError> {
        Service::connect(&*self.get(), src, dst, qpn, psn, private_data, timeout)
    }

    fn disconnect(&self, conn: ConnId) {
        Service::disconnect(&*self.get(), conn)
    }

    fn disconnect_wait(&self, conn: ConnId, within: Duration) -> bool {
        Service::disconnect_wait(&*self.get(), conn, within)
    }

    fn on_disconnect(&self, hook: ConnHook) {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(hook.clone());
        Service::on_disconnect(&*self.get(), hook)
    }

    fn on_established(&self, hook: ConnHook) {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(hook.clone());
        Service::on_established(&*self.get(), hook)
    }
}

/// One soft CA the watcher keeps an agent on.
pub struct Watched {
    /// The CA's address (for the log).
    pub ip: IpAddr,
    /// Its GUID.
    pub guid: Guid,
    /// Its agent.
    pub slot: Arc<AgentSlot>,
    /// The first communication ID of its agents (each new one moves
    /// past the last's).
    pub first_comm_id: u32,
}

/// Starts the watcher of `cas`: agents are made on `cm` and tracked in
/// its client. It ends once `stop` is set.
///
/// # Errors
/// The thread cannot be started.
pub fn watch(
    cas: Vec<Watched>,
    cm: Arc<rdma_access::resource::TrackedProvider>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("srpd-rejoin".into())
        .spawn(move || {
            let mut round: u32 = 0;
            let mut waiting = vec![false; cas.len()];
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(WATCH_EVERY);
                for (w, away) in cas.iter().zip(waiting.iter_mut()) {
                    if !w.slot.get().is_removed() {
                        continue;
                    }
                    if !*away {
                        *away = true;
                        eprintln!(
                            "srpd: {}: the NIC daemon's CA went away; its LUNs wait for it",
                            w.ip
                        );
                    }
                    round = round.wrapping_add(1);
                    let first = w.first_comm_id.wrapping_add(round << 20);
                    let Ok(agent) = CmAgent::start(cm.clone(), w.guid, first) else {
                        continue;
                    };
                    if let Err(e) = agent.track_in(cm.client()) {
                        tracing::warn!("srpd: {}: track the new CM agent: {e}", w.ip);
                    }
                    w.slot.replace(agent);
                    *away = false;
                    eprintln!(
                        "srpd: {}: the NIC daemon is back; logins reconnect through it",
                        w.ip
                    );
                }
            }
        })
        .map(|_| ())
}
