//! A node's port in a managed subnet (`ib` mode): its MAD driver
//! ([`CmAgent`], with QP0) and its SMA ([`SmaAgent`]), wired to the
//! provider's port control both ways through the verbs only, so any
//! provider whose port has a QP0 can host an SMA (the seeds' split of the
//! SMA between access layer and driver).
//!
//! The SM's Sets reach the port through [`Provider::modify_port`]
//! ([`port_control`]); the port's own events reach the SMA: a pulled
//! cable (`PortDown`) puts it back in INIT, so when the link returns the
//! SM's next sweep activates it again, and a packet dropped for its P_Key
//! ([`Provider::take_pkey_violations`], [`pkey_violations`]) is counted in
//! PortInfo and reported by trap 257.
//!
//! What it leaves to the caller: making the port one with a QP0 (soft
//! RoCE: the `ib` personality, set before the CA's first open); without
//! one [`IbNode::start`] fails.

use crate::sma::{state, Sma, SmaAction, SmaConfig};
use crate::sma_agent::SmaAgent;
use crate::{CmAgent, CmError};
use rdma_mad::smp::BadKeyTrap;
use rdma_types::{Guid, Lid, PortNum};
use std::sync::{Arc, OnceLock, Weak};
use verbs::{CaHandle, PortModify, PortState, Provider, VerbsError};

/// Why a node's port did not start; says which CA, as the tools print it.
#[derive(Debug, thiserror::Error)]
pub enum IbNodeError {
    /// The CA could not be opened (unknown, removed, ...).
    #[error("CA {:#x}: {err}", guid.0)]
    Open {
        /// The CA.
        guid: Guid,
        /// The provider's answer.
        err: VerbsError,
    },
    /// Its MAD driver or SMA could not start (no QP0: not an `ib` port).
    #[error("CA {:#x}: {err}", guid.0)]
    Port {
        /// The CA.
        guid: Guid,
        /// What failed.
        err: CmError,
    },
}

/// A node's `ib` port (see the module docs).
pub struct IbNode {
    p: Arc<dyn Provider>,
    guid: Guid,
    dev: CaHandle,
    agent: Option<Arc<CmAgent>>,
    sma: Option<Arc<SmaAgent>>,
}

/// Port events of the node's CA, for its SMA.
struct LinkWatch(OnceLock<Weak<SmaAgent>>);

impl verbs::EventHandler for LinkWatch {
    fn on_completion(&self, _: verbs::Context) {}
    fn on_async_event(&self, e: verbs::AsyncEvent) {
        if e.kind == verbs::AsyncEventKind::PortDown {
            if let Some(sma) = self.0.get().and_then(Weak::upgrade) {
                sma.link_retrained();
            }
        }
    }
}

impl IbNode {
    /// Opens CA `guid` of `p`, a CA whose port 1 has a QP0, and starts its
    /// port: CM agent (comm IDs from `first_comm_id`) and SMA
    /// (`description`; device management offered if `dm`).
    ///
    /// # Errors
    /// The CA cannot be opened, or its port cannot start (no QP0).
    pub fn start(
        p: Arc<dyn Provider>,
        guid: Guid,
        description: &str,
        dm: bool,
        first_comm_id: u32,
    ) -> Result<IbNode, IbNodeError> {
        let watch = Arc::new(LinkWatch(OnceLock::new()));
        let dev = p
            .open_ca(guid, 0, watch.clone())
            .map_err(|err| IbNodeError::Open { guid, err })?;
        let started = CmAgent::start(p.clone(), guid, first_comm_id).and_then(|agent| {
            let cfg = sma_config(guid, description, dm);
            SmaAgent::start(&agent, cfg, port_control(p.clone(), dev))
                .map(|sma| (agent, Arc::new(sma)))
        });
        let (agent, sma) = match started {
            Ok(x) => x,
            Err(e) => {
                let _ = p.close_ca(dev);
                return Err(IbNodeError::Port { guid, err: e });
            }
        };
        let _ = watch.0.set(Arc::downgrade(&sma));
        sma.watch_pkey_violations(pkey_violations(p.clone(), dev));
        Ok(IbNode {
            p,
            guid,
            dev,
            agent: Some(agent),
            sma: Some(sma),
        })
    }

    /// The port's MAD driver: CM, MAD agents, SA clients.
    pub fn agent(&self) -> &Arc<CmAgent> {
        self.agent.as_ref().expect("until dropped")
    }

    /// The port's SMA.
    pub fn sma(&self) -> &SmaAgent {
        self.sma.as_ref().expect("until dropped")
    }

    /// The CA's GUID.
    pub fn guid(&self) -> Guid {
        self.guid
    }

    /// The port as the provider reports it.
    ///
    /// # Errors
    /// The provider refused the query.
    pub fn port(&self) -> Result<verbs::PortAttr, VerbsError> {
        self.p.query_port(self.dev, PortNum(1))
    }
}

impl Drop for IbNode {
    fn drop(&mut self) {
        self.sma.take();
        self.agent.take();
        let _ = self.p.close_ca(self.dev);
    }
}

/// The SMA description of a one-port CA `guid` (node and port GUID both
/// `guid`, which a partitions file names), offering device management if
/// `dm`.
pub fn sma_config(guid: Guid, description: &str, dm: bool) -> SmaConfig {
    SmaConfig {
        node_guid: guid,
        port_guid: guid,
        description: description.into(),
        capability_mask: crate::sma::ca_capability_mask(dm),
    }
}

/// What a node's SMA was told, applied to port 1 of open CA `ca` through
/// [`Provider::modify_port`]: the `apply` of [`SmaAgent::start`]. ARMED
/// has no verbs state of its own and stays INIT until ACTIVE; DOWN is
/// INIT too (the link retrains at once).
pub fn port_control(p: Arc<dyn Provider>, ca: CaHandle) -> impl Fn(SmaAction, &Sma) + Send + Sync {
    move |action, sma| {
        let m = match action {
            SmaAction::Lid(l) => PortModify::new().lid(Lid(l)),
            SmaAction::SmLid(l) => PortModify::new().sm_lid(Lid(l)),
            SmaAction::State(s) if s == state::ACTIVE => PortModify::new().state(PortState::Active),
            SmaAction::State(_) => PortModify::new().state(PortState::Init),
            SmaAction::Pkeys => PortModify::new().pkeys(sma.pkeys().to_vec()),
            SmaAction::SmGid(g) => PortModify::new().sm_gid(g),
        };
        // The CA is open while its SMA runs; a failure here means it is
        // closing, and the port goes with it.
        let _ = p.modify_port(ca, PortNum(1), &m);
    }
}

/// What port 1 of open CA `ca` dropped for its P_Key since the last call
/// ([`Provider::take_pkey_violations`]), as the SMA takes it
/// ([`SmaAgent::watch_pkey_violations`]): the count and the latest as
/// trap 257's details. RoCEv2 packets carry no LIDs and no SL: LID1 and
/// SL are 0, and the SMA fills in LID2, its own. A provider that counts
/// none reports none.
pub fn pkey_violations(
    p: Arc<dyn Provider>,
    ca: CaHandle,
) -> impl Fn() -> Option<(u64, BadKeyTrap)> + Send + Sync {
    move || {
        let v = p.take_pkey_violations(ca, PortNum(1)).ok()??;
        let l = v.latest;
        let details = BadKeyTrap {
            key: u32::from(l.pkey.0),
            qp1: l.src_qp.map_or(0, |q| q.value()),
            qp2: l.dest_qp.value(),
            gid1: l.src_gid,
            gid2: l.dst_gid,
            ..Default::default()
        };
        Some((v.count, details))
    }
}
