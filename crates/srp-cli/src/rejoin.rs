//! srpd across a CA's removal and return: the NIC daemon restarting
//! (`srpd --nicd`), or an rdma-core device deleted and added again
//! (`srpd --device`, Linux `rdma link delete rxe0` / `rdma link add`).
//!
//! Each CA's CM service (our CM agent on a soft CA, the kernel's RDMA CM
//! on a device) sits in a [`Slot`], which its logins' connectors reach
//! RDMA CM through, and a watcher thread puts a new service in the slot
//! when the CA comes back. A port of the NIC daemon on the `ib` fabric
//! sits in an [`IbSlot`] the same way: its logins' paths come from the SA
//! through whichever port the slot holds, and a new one joins the subnet
//! once the daemon serves the address again and an SM brought it ACTIVE
//! ([`WatchedIb`]).
//!
//! When the CA goes, the provider tells every open of it of the removal:
//! each login's channels fail and its LUNs wait in the remote port state
//! machine (their files stay, their I/O fails or waits as
//! `fast_io_fail_tmo` says), the access layer releases the sessions'
//! verbs objects, and the CA's CM service ends with it. The watcher sees
//! that, and every [`WATCH_EVERY`] tries to start a service on the CA
//! again ([`Comeback::again`]); then the LUNs' next reconnect
//! (`reconnect_delay`) logs in through it, and their files serve again
//! under the same names.

use rdma_access::rdmacm::{ConnHook, Listened, Service};
use rdma_access::sa::SaClient;
use rdma_access::subnet::{IbPort, SaPortError, SubnetPort};
use rdma_access::{CmAgent, CmError, ConnId, Established};
use rdma_types::{Guid, Psn, Qpn};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// How often the watcher looks for a removed service, and tries again to
/// start one while its CA is away.
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// The CM service of one CA now; a new one replaces it after the CA's
/// removal and return.
pub struct Slot<S> {
    cur: RwLock<Arc<S>>,
    /// The hooks set through [`Service`], set again on each new service.
    hooks: Mutex<(Option<ConnHook>, Option<ConnHook>)>,
}

/// The slot of a soft CA's CM agent.
pub type AgentSlot = Slot<CmAgent>;

impl<S: Service> Slot<S> {
    /// A slot holding `service`.
    pub fn new(service: Arc<S>) -> Arc<Slot<S>> {
        Arc::new(Slot {
            cur: RwLock::new(service),
            hooks: Mutex::new((None, None)),
        })
    }

    /// The service now.
    pub fn get(&self) -> Arc<S> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `service` in place of the removed one.
    pub fn replace(&self, service: Arc<S>) {
        let (disc, est) = self.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = disc {
            service.on_disconnect(h);
        }
        if let Some(h) = est {
            service.on_established(h);
        }
        *self.cur.write().unwrap_or_else(|e| e.into_inner()) = service;
    }
}

impl<S: Service> Service for Slot<S> {
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError> {
        self.get().listen(port)
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
        self.get()
            .connect(src, dst, qpn, psn, private_data, timeout)
    }

    fn disconnect(&self, conn: ConnId) {
        self.get().disconnect(conn)
    }

    fn disconnect_wait(&self, conn: ConnId, within: Duration) -> bool {
        self.get().disconnect_wait(conn, within)
    }

    fn on_disconnect(&self, hook: ConnHook) {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(hook.clone());
        self.get().on_disconnect(hook)
    }

    fn on_established(&self, hook: ConnHook) {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(hook.clone());
        self.get().on_established(hook)
    }
}

/// A CA whose CM service the watcher keeps: how to see it gone and
/// bring it back. Called on the watcher thread only.
pub trait Comeback: Send {
    /// Whether the CA's service ended with the CA's removal.
    fn gone(&self) -> bool;
    /// One try to start the service on the CA again and put it in its
    /// slot.
    ///
    /// # Errors
    /// The CA is not back yet (or came back unusable), in words.
    fn again(&mut self) -> Result<(), String>;
    /// What srpd says when the CA went.
    fn went(&self) -> String;
    /// What srpd says when it is back.
    fn back(&self) -> String;
}

/// A soft CA of the NIC daemon, whose agent the watcher starts again when
/// the daemon is back (the client provider connects anew by itself).
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
    /// The provider agents are made on, tracked in its client.
    pub cm: Arc<rdma_access::resource::TrackedProvider>,
    /// Agents started again so far.
    pub round: u32,
}

impl Comeback for Watched {
    fn gone(&self) -> bool {
        self.slot.get().is_removed()
    }

    fn again(&mut self) -> Result<(), String> {
        self.round = self.round.wrapping_add(1);
        let first = self.first_comm_id.wrapping_add(self.round << 20);
        let agent = CmAgent::start(self.cm.clone(), self.guid, first).map_err(|e| e.to_string())?;
        if let Err(e) = agent.track_in(self.cm.client()) {
            tracing::warn!("srpd: {}: track the new CM agent: {e}", self.ip);
        }
        self.slot.replace(agent);
        Ok(())
    }

    fn went(&self) -> String {
        format!(
            "{}: the NIC daemon's CA went away; its LUNs wait for it",
            self.ip
        )
    }

    fn back(&self) -> String {
        format!(
            "{}: the NIC daemon is back; logins reconnect through it",
            self.ip
        )
    }
}

/// The NIC daemon's port on the managed subnet now; a port that joins
/// again after the daemon's restart replaces it.
pub struct IbSlot {
    cur: RwLock<Arc<IbPort>>,
}

impl IbSlot {
    /// A slot holding `port`.
    pub fn new(port: Arc<IbPort>) -> Arc<IbSlot> {
        Arc::new(IbSlot {
            cur: RwLock::new(port),
        })
    }

    /// The port now.
    pub fn get(&self) -> Arc<IbPort> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, port: Arc<IbPort>) {
        *self.cur.write().unwrap_or_else(|e| e.into_inner()) = port;
    }
}

impl SubnetPort for IbSlot {
    fn agent(&self) -> Arc<CmAgent> {
        self.get().agent().clone()
    }
    fn lid(&self) -> u16 {
        self.get().lid()
    }
    fn sm_lid(&self) -> u16 {
        self.get().sm_lid()
    }
    fn name(&self) -> String {
        self.get().ip().to_string()
    }
    fn sa(&self) -> Result<Arc<SaClient>, SaPortError> {
        self.get().sa()
    }
    fn renew_sa(&self) {
        self.get().renew_sa()
    }
}

/// A port of the NIC daemon on the `ib` fabric, which the watcher joins
/// to the subnet again when the daemon is back: the daemon asked to serve
/// the address on the `ib` fabric again (a daemon started anew may not),
/// then the port joined once an SM made it ACTIVE. Its agent goes in
/// `slot` too, for logins by RDMA CM.
pub struct WatchedIb {
    /// The daemon's client (it connects anew by itself).
    pub client: Arc<nicd::NicdProvider>,
    /// The port's address.
    pub ip: IpAddr,
    /// Its GUID.
    pub guid: Guid,
    /// The port.
    pub port: Arc<IbSlot>,
    /// Its agent.
    pub slot: Arc<AgentSlot>,
    /// The access layer's client its agents are tracked in.
    pub cm: Arc<rdma_access::resource::TrackedProvider>,
    /// The first communication ID of its agents (as [`Watched`]'s).
    pub first_comm_id: u32,
    /// Ports joined again so far.
    pub round: u32,
    /// A port joined again that no SM has made ACTIVE yet.
    pub pending: Option<IbPort>,
}

impl Comeback for WatchedIb {
    fn gone(&self) -> bool {
        self.port.get().agent().is_removed()
    }

    fn again(&mut self) -> Result<(), String> {
        let port = match self.pending.take() {
            // One that an earlier daemon's removal ended is made anew.
            Some(p) if !p.agent().is_removed() => p,
            _ => {
                self.client
                    .add_nic_on(self.ip, nicd::Fabric::Ib)
                    .map_err(|e| e.to_string())?;
                self.round = self.round.wrapping_add(1);
                let first = self.first_comm_id.wrapping_add(self.round << 20);
                let p: Arc<dyn verbs::Provider> = self.client.clone();
                IbPort::join(p, self.guid, self.ip, first).map_err(|e| e.to_string())?
            }
        };
        if let Err(e) = port.wait_active(Duration::ZERO) {
            self.pending = Some(port);
            return Err(e.to_string());
        }
        let agent = port.agent().clone();
        if let Err(e) = agent.track_in(self.cm.client()) {
            tracing::warn!("srpd: {}: track the new CM agent: {e}", self.ip);
        }
        self.slot.replace(agent);
        self.port.replace(Arc::new(port));
        Ok(())
    }

    fn went(&self) -> String {
        format!(
            "{}: the NIC daemon's ib port went away; its LUNs wait for it",
            self.ip
        )
    }

    fn back(&self) -> String {
        format!(
            "{}: the NIC daemon's ib port is back on the subnet; logins reconnect through it",
            self.ip
        )
    }
}

/// Starts the watcher of `cas`, which ends once `stop` is set. Its
/// events go to srpd's standard output, where scripts read its others.
///
/// # Errors
/// The thread cannot be started.
pub fn watch(
    mut cas: Vec<Box<dyn Comeback>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("srpd-rejoin".into())
        .spawn(move || {
            let mut away = vec![None::<String>; cas.len()];
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(WATCH_EVERY);
                for (w, away) in cas.iter_mut().zip(away.iter_mut()) {
                    if away.is_none() {
                        if !w.gone() {
                            continue;
                        }
                        println!("srpd: {}", w.went());
                        *away = Some(String::new());
                    }
                    match w.again() {
                        Ok(()) => {
                            *away = None;
                            println!("srpd: {}", w.back());
                        }
                        // Each new reason once, at debug level: the
                        // device may take a while to come back.
                        Err(e) if away.as_deref() != Some(e.as_str()) => {
                            tracing::debug!("srpd: not back yet: {e}");
                            *away = Some(e);
                        }
                        Err(_) => {}
                    }
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Sender};

    /// A CM service that only records the hooks it was given.
    #[derive(Default)]
    struct Hooks {
        set: Mutex<Vec<&'static str>>,
    }

    impl Service for Hooks {
        fn listen(&self, _port: u16) -> Result<Receiver<Listened>, CmError> {
            Err(CmError::Stopped)
        }
        fn connect(
            &self,
            _src: IpAddr,
            _dst: std::net::SocketAddr,
            _qpn: Qpn,
            _psn: Psn,
            _private_data: &[u8],
            _timeout: Duration,
        ) -> Result<Established, CmError> {
            Err(CmError::Stopped)
        }
        fn disconnect(&self, _conn: ConnId) {}
        fn disconnect_wait(&self, _conn: ConnId, _within: Duration) -> bool {
            true
        }
        fn on_disconnect(&self, _hook: ConnHook) {
            self.set.lock().unwrap().push("disconnect");
        }
        fn on_established(&self, _hook: ConnHook) {
            self.set.lock().unwrap().push("established");
        }
    }

    #[test]
    fn a_new_service_in_the_slot_gets_the_hooks_the_old_one_had() {
        let first = Arc::new(Hooks::default());
        let slot = Slot::new(first.clone());
        slot.on_disconnect(Arc::new(|_| {}));
        slot.on_established(Arc::new(|_| {}));
        assert_eq!(*first.set.lock().unwrap(), ["disconnect", "established"]);
        let second = Arc::new(Hooks::default());
        slot.replace(second.clone());
        assert_eq!(*second.set.lock().unwrap(), ["disconnect", "established"]);
        assert!(Arc::ptr_eq(&slot.get(), &second));
    }

    /// A CA that went and answers "not back" twice before it is.
    struct Flaky {
        gone: Arc<AtomicBool>,
        tries: u32,
        back: Sender<u32>,
    }

    impl Comeback for Flaky {
        fn gone(&self) -> bool {
            self.gone.load(Ordering::Acquire)
        }
        fn again(&mut self) -> Result<(), String> {
            self.tries += 1;
            if self.tries < 3 {
                return Err("not yet".into());
            }
            self.gone.store(false, Ordering::Release);
            let _ = self.back.send(self.tries);
            Ok(())
        }
        fn went(&self) -> String {
            "flaky went".into()
        }
        fn back(&self) -> String {
            "flaky is back".into()
        }
    }

    #[test]
    fn the_watcher_tries_again_until_the_ca_is_back_and_ends_when_told() {
        let gone = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let t = watch(
            vec![Box::new(Flaky {
                gone: gone.clone(),
                tries: 0,
                back: tx,
            })],
            stop.clone(),
        )
        .unwrap();
        // Nothing is tried while the CA is there.
        assert!(rx.recv_timeout(WATCH_EVERY * 3).is_err());
        gone.store(true, Ordering::Release);
        let tries = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the watcher brought the CA back");
        assert_eq!(tries, 3);
        assert!(!gone.load(Ordering::Acquire));
        stop.store(true, Ordering::Release);
        t.join().unwrap();
    }
}
