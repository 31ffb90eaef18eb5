//! The subnet management agent of a real port: [`crate::sma::Sma`] (the
//! sans-IO answers) on the port's QP0, through the port's MAD driver
//! ([`CmAgent`]), for the managed-subnet (`ib`) personality.
//!
//! [`SmaAgent::start`] registers the SMP classes (directed route and
//! LID-routed, version 1, Get and Set) on the port's dispatcher and answers
//! them on its own thread. What a Set changes (LID, master SM LID, port
//! state, P_Key table) goes to the caller's `apply` before the response
//! leaves, so when the SM reads the answer the port is already in the
//! state it reports: the caller turns each [`SmaAction`] into the
//! provider's port control (`Provider::modify_port`, as
//! [`crate::ib_node::port_control`] does).
//!
//! Where the SA is: SMPs come from the SM's port, and our SM serves the SA
//! on that same port, so the source GID of the last Set is kept as
//! [`SmaAgent::sm_gid`], the address an SA client of this port asks. (On
//! InfiniBand a node reaches the SA through the master SM LID; over UDP a
//! LID routes nothing, so the GID stands in for it.)
//!
//! Traps: [`SmaAgent::set_capability_mask`] (a DM agent registering, say)
//! makes the SMA raise trap 144, an SMP refused for its M_Key trap 256,
//! packets the port dropped for their P_Key trap 257 (see [`crate::sma`];
//! the thread asks the source [`SmaAgent::watch_pkey_violations`] gave it
//! at every turn, about every 20 ms); the thread sends the oldest to the
//! SM (the GID of the last Set) and again every 500 ms until the SM's
//! TrapRepress arrives, or gives it up after 8 sends and goes on to the
//! next.
//!
//! M_Key: the SMA checks it as [`crate::sma`] says, on the real clock
//! (the lease is in seconds); [`SmaAgent::mkey_violations`] counts the
//! refusals.
//!
//! What it refuses: a port without QP0 (a `roce` port): `start` fails.

use crate::agent::{CmAgent, CmError, MadAgent, MadWait};
use crate::sma::{Sma, SmaAction, SmaConfig};
use rdma_mad::mad::Method;
use rdma_mad::smp::BadKeyTrap;
use rdma_types::{Gid, Pkey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Directed-route SMP class.
const SMP_DIRECTED: u8 = 0x81;
/// LID-routed SMP class.
const SMP_LID_ROUTED: u8 = 0x01;
/// How long the thread waits on one class before looking at the other and
/// at the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// Time between sends of an unrepressed trap.
const TRAP_RESEND: Duration = Duration::from_millis(500);
/// Sends of one trap at most.
const TRAP_SENDS: u32 = 8;

/// Applies a Set's effect to the port; gets the SMA as it is after the Set
/// (the new P_Key table, for [`SmaAction::Pkeys`]).
pub type Apply = dyn Fn(SmaAction, &Sma) + Send + Sync;

/// Where the port's P_Key violations come from (the provider's counter):
/// the violations since the last call and the latest of them, `None` if
/// there were none. Called on the SMA's thread with none of its locks held.
pub type PkeyViolations = dyn Fn() -> Option<(u64, BadKeyTrap)> + Send + Sync;

struct Status {
    sma: Sma,
    sm: Option<Gid>,
    smps: u64,
    /// The pending trap's TID, when it is next sent, and sends left.
    trap_due: Option<(u64, std::time::Instant, u32)>,
    traps_sent: u64,
    /// Zero of the SMA's clock.
    epoch: std::time::Instant,
}

impl Status {
    /// Now on the SMA's (sans-IO) clock.
    fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_std(self.epoch, std::time::Instant::now())
    }
}

struct Shared {
    st: Mutex<Status>,
    changed: Condvar,
    violations: Mutex<Option<Arc<PkeyViolations>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Status> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The SMA of one port, answering on its own thread until dropped.
pub struct SmaAgent {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SmaAgent {
    /// Starts the SMA of `port` (which must have a QP0) as `cfg` describes
    /// it: link up, INIT, no LID, until an SM says otherwise.
    ///
    /// # Errors
    /// The port has no QP0, another agent serves SMPs on it, or the
    /// thread cannot start.
    pub fn start(
        port: &CmAgent,
        cfg: SmaConfig,
        apply: impl Fn(SmaAction, &Sma) + Send + Sync + 'static,
    ) -> Result<SmaAgent, CmError> {
        if !port.has_smi() {
            return Err(CmError::Mad(
                "the port has no QP0 (a roce port answers no SMPs)".into(),
            ));
        }
        let methods = [u8::from(Method::Get), u8::from(Method::Set)];
        let directed = port.mad_agent(SMP_DIRECTED, 1, &methods)?;
        // LID-routed also hears the SM's TrapRepress of our traps.
        let routed = port.mad_agent(
            SMP_LID_ROUTED,
            1,
            &[
                u8::from(Method::Get),
                u8::from(Method::Set),
                u8::from(Method::TrapRepress),
            ],
        )?;
        let shared = Arc::new(Shared {
            st: Mutex::new(Status {
                sma: Sma::new(cfg),
                sm: None,
                smps: 0,
                trap_due: None,
                traps_sent: 0,
                epoch: std::time::Instant::now(),
            }),
            changed: Condvar::new(),
            violations: Mutex::new(None),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (sh, st) = (shared.clone(), stop.clone());
        let apply: Box<Apply> = Box::new(apply);
        let thread = std::thread::Builder::new()
            .name("sma".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    for (agent, wait) in [(&directed, POLL), (&routed, Duration::ZERO)] {
                        match agent.wait(wait) {
                            MadWait::Request(peer, mad) => {
                                answer(&sh, agent, &*apply, peer, &mad[..])
                            }
                            MadWait::TimedOut => {}
                            // The CA was removed: asking again would
                            // return at once, a busy loop until the drop.
                            MadWait::Closed => return,
                        }
                    }
                    note_violations(&sh);
                    send_trap(&sh, &routed);
                }
            })
            .map_err(|e| CmError::Mad(format!("start the SMA thread: {e}")))?;
        Ok(SmaAgent {
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// The port's LID (0 until an SM gives one).
    pub fn lid(&self) -> u16 {
        self.shared.lock().sma.lid()
    }

    /// PortInfo:LMC: the port's LIDs are [`SmaAgent::lid`] and the
    /// `2^lmc - 1` above it.
    pub fn lmc(&self) -> u8 {
        self.shared.lock().sma.lmc()
    }

    /// The port state (see [`crate::sma::state`]).
    pub fn port_state(&self) -> u8 {
        self.shared.lock().sma.port_state()
    }

    /// The master SM's LID.
    pub fn sm_lid(&self) -> u16 {
        self.shared.lock().sma.sm_lid()
    }

    /// The GID the last Set came from: the SM's port, where its SA answers
    /// (see the module docs). `None` before any Set.
    pub fn sm_gid(&self) -> Option<Gid> {
        self.shared.lock().sm
    }

    /// The P_Key table (block 0).
    pub fn pkeys(&self) -> [Pkey; 32] {
        self.shared.lock().sma.pkeys()
    }

    /// The port's GUID table (GUIDInfo block 0; see [`crate::sma::Sma::guids`]).
    pub fn guids(&self) -> [rdma_types::Guid; crate::sma::GUID_CAP] {
        self.shared.lock().sma.guids()
    }

    /// SMPs answered so far.
    pub fn smps(&self) -> u64 {
        self.shared.lock().smps
    }

    /// Waits at most `within` for the port to reach `state`; true if it
    /// did.
    pub fn wait_state(&self, state: u8, within: Duration) -> bool {
        let g = self.shared.lock();
        let (g, _) = self
            .shared
            .changed
            .wait_timeout_while(g, within, |s| s.sma.port_state() != state)
            .unwrap_or_else(|e| e.into_inner());
        g.sma.port_state() == state
    }

    /// PortInfo:CapabilityMask.
    pub fn capability_mask(&self) -> u32 {
        self.shared.lock().sma.capability_mask()
    }

    /// Changes PortInfo:CapabilityMask; if it changed while an SM manages
    /// the port, trap 144 goes to the SM (see the module docs).
    pub fn set_capability_mask(&self, mask: u32) {
        self.shared.lock().sma.set_capability_mask(mask);
    }

    /// PortInfo:M_KeyViolations: SMPs refused for a wrong M_Key.
    pub fn mkey_violations(&self) -> u16 {
        self.shared.lock().sma.mkey_violations()
    }

    /// Takes the port's P_Key violations from `source` from now on (see
    /// [`PkeyViolations`]): counted in PortInfo:P_KeyViolations, reported
    /// by trap 257. Replaces an earlier source.
    pub fn watch_pkey_violations(
        &self,
        source: impl Fn() -> Option<(u64, BadKeyTrap)> + Send + Sync + 'static,
    ) {
        *self
            .shared
            .violations
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(source));
    }

    /// PortInfo:P_KeyViolations: packets the port dropped for their P_Key
    /// (as far as the source of [`SmaAgent::watch_pkey_violations`] told).
    pub fn pkey_violations(&self) -> u16 {
        self.shared.lock().sma.pkey_violations()
    }

    /// PortInfo:M_Key and M_KeyProtectBits now (the lease applied).
    pub fn mkey(&self) -> (u64, u8) {
        let mut st = self.shared.lock();
        let now = st.now();
        st.sma.handle_timeout(now);
        (st.sma.mkey(), st.sma.mkey_protect())
    }

    /// True while a trap waits for the SM's TrapRepress (or its last
    /// resend).
    pub fn trap_pending(&self) -> bool {
        self.shared.lock().sma.trap().is_some()
    }

    /// Traps sent so far (resends too).
    pub fn traps_sent(&self) -> u64 {
        self.shared.lock().traps_sent
    }

    /// The link went down and came back: the port is in INIT again, and an
    /// SM's next sweep activates it.
    pub fn link_retrained(&self) {
        self.shared.lock().sma.link_retrained();
        self.shared.changed.notify_all();
    }
}

/// Answers one SMP: the Set's effects are applied first, then the
/// response goes back to `peer`.
fn answer(sh: &Shared, agent: &MadAgent, apply: &Apply, peer: Gid, smp: &[u8]) {
    let (resp, actions, after) = {
        let mut st = sh.lock();
        let now = st.now();
        let Some((resp, mut actions)) = st.sma.handle(now, smp) else {
            return;
        };
        st.smps += 1;
        if Method::from(smp[3]) == Method::Set && st.sm != Some(peer) {
            st.sm = Some(peer);
            // Before the Set's own effects: when the port reads ACTIVE
            // its consumers find the SA where it is.
            actions.insert(0, SmaAction::SmGid(peer));
        }
        (resp, actions, st.sma.clone())
    };
    for a in actions {
        apply(a, &after);
    }
    sh.changed.notify_all();
    agent.send(peer, resp);
}

/// Hands the SMA what the port's violation source counted since the last
/// look (the source is called without our locks).
fn note_violations(sh: &Shared) {
    let source = sh
        .violations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((count, last)) = source.and_then(|f| f()) {
        sh.lock().sma.note_pkey_violations(count, last);
    }
}

/// Sends the SMA's oldest unrepressed trap to the SM when it is due;
/// gives it up after [`TRAP_SENDS`] sends. Also ends a due M_Key lease.
fn send_trap(sh: &Shared, agent: &MadAgent) {
    let (to, mad) = {
        let mut st = sh.lock();
        let sans_io_now = st.now();
        st.sma.handle_timeout(sans_io_now);
        let now = std::time::Instant::now();
        let (Some(trap), Some(sm)) = (st.sma.trap().copied(), st.sm) else {
            return;
        };
        let tid = u64::from_be_bytes(trap[8..16].try_into().expect("8 bytes"));
        let (due, left) = match st.trap_due {
            Some((t, due, left)) if t == tid => (due, left),
            _ => (now, TRAP_SENDS),
        };
        if due > now {
            return;
        }
        if left == 0 {
            st.sma.abandon_trap();
            st.trap_due = None;
            return;
        }
        st.trap_due = Some((tid, now + TRAP_RESEND, left - 1));
        st.traps_sent += 1;
        (sm, trap)
    };
    agent.send(to, mad);
}

impl Drop for SmaAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
