//! Port control: what a port's subnet management agent sets on the port
//! ([`Provider::modify_port`](crate::Provider::modify_port)) and what the
//! port tells it back
//! ([`Provider::take_pkey_violations`](crate::Provider::take_pkey_violations)).
//!
//! The seeds split the SMA between the access layer (which parses the
//! SM's SMPs and decides) and the provider (which owns the port): these
//! two verbs are the line between them. Linux draws it elsewhere: its
//! `ib_modify_port` sets only capability mask bits, shutdown, the init
//! type and a Q_Key counter reset, because on an InfiniBand HCA the SMA
//! lives in firmware or in the driver's `process_mad`, which applies
//! SubnSet(PortInfo) and SubnSet(P_KeyTable) to the port itself. Here
//! the SMA is ours, so the provider takes what those Sets carry: base
//! LID and LMC, master SM LID and SL, port state (IBA 14.2.5.6), the
//! P_Key table (14.2.5.7) and the alias GUIDs (GUIDInfo, 14.2.5.5).

use rdma_types::{Gid, Guid, Lid, Pkey};

use crate::PortState;

/// What [`Provider::modify_port`](crate::Provider::modify_port) changes:
/// each field that is `Some` (the attribute mask is which fields are set).
/// A provider that cannot change one of them refuses the whole call with
/// `NotSupported` and changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortModify {
    /// Base LID (PortInfo:LID).
    pub lid: Option<Lid>,
    /// LID Mask Control: the port answers to 2^LMC LIDs from its base
    /// (PortInfo:LMC, 0..=7).
    pub lmc: Option<u8>,
    /// The master SM's LID (PortInfo:MasterSMLID); a change raises
    /// `SmChange`.
    pub sm_lid: Option<Lid>,
    /// Where the master SM answers on a fabric where a LID routes
    /// nothing (soft RoCE's `ib` personality): the GID its Sets came
    /// from, which the port's SMA knows and its other consumers (an SA
    /// client in another process) read back in `PortAttr::sm_gid`.
    pub sm_gid: Option<Gid>,
    /// The SL to reach the master SM (PortInfo:MasterSMSL, 0..=15).
    pub sm_sl: Option<u8>,
    /// The port's logical state as the SM moves it (PortInfo:PortState);
    /// entering or leaving ACTIVE raises `PortActive` / `PortDown`.
    pub state: Option<PortState>,
    /// The whole P_Key table (P_KeyTable); empty slots (P_Key 0) are left
    /// out. Raises `PkeyChange`.
    pub pkeys: Option<Vec<Pkey>>,
    /// The port's GUID table after entry 0 (GUIDInfo: the alias GUIDs an
    /// SM assigns; entry 0 is the port GUID and not the SM's to change).
    pub alias_guids: Option<Vec<Guid>>,
}

impl PortModify {
    /// Nothing to change.
    pub fn new() -> PortModify {
        PortModify::default()
    }

    /// Sets the base LID.
    pub fn lid(mut self, lid: Lid) -> PortModify {
        self.lid = Some(lid);
        self
    }

    /// Sets the LMC.
    pub fn lmc(mut self, lmc: u8) -> PortModify {
        self.lmc = Some(lmc);
        self
    }

    /// Sets the master SM LID.
    pub fn sm_lid(mut self, lid: Lid) -> PortModify {
        self.sm_lid = Some(lid);
        self
    }

    /// Sets where the master SM answers (see the field).
    pub fn sm_gid(mut self, gid: Gid) -> PortModify {
        self.sm_gid = Some(gid);
        self
    }

    /// Sets the master SM SL.
    pub fn sm_sl(mut self, sl: u8) -> PortModify {
        self.sm_sl = Some(sl);
        self
    }

    /// Sets the port state.
    pub fn state(mut self, state: PortState) -> PortModify {
        self.state = Some(state);
        self
    }

    /// Replaces the P_Key table.
    pub fn pkeys(mut self, pkeys: Vec<Pkey>) -> PortModify {
        self.pkeys = Some(pkeys);
        self
    }

    /// Replaces the alias GUIDs.
    pub fn alias_guids(mut self, guids: Vec<Guid>) -> PortModify {
        self.alias_guids = Some(guids);
        self
    }

    /// Whether the call would change nothing.
    pub fn is_empty(&self) -> bool {
        *self == PortModify::default()
    }

    /// Checks the fields' IBA ranges (LMC 0..=7, SL 0..=15).
    ///
    /// # Errors
    /// `InvalidArgument` naming the field out of range.
    pub fn check(&self) -> crate::Result<()> {
        if self.lmc.is_some_and(|l| l > 7) {
            return Err(crate::VerbsError::InvalidArgument(
                "LMC beyond 7 (IBA 14.2.5.6)".into(),
            ));
        }
        if self.sm_sl.is_some_and(|s| s > 15) {
            return Err(crate::VerbsError::InvalidArgument(
                "master SM SL beyond 15".into(),
            ));
        }
        Ok(())
    }
}

/// What a port dropped for its P_Key since the last
/// [`Provider::take_pkey_violations`](crate::Provider::take_pkey_violations):
/// how many, and the latest (what trap 257 reports, IBA 14.2.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PkeyViolations {
    /// Packets dropped.
    pub count: u64,
    /// The latest of them.
    pub latest: rdma_types::PkeyViolation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modify_is_a_mask_of_fields() {
        assert!(PortModify::new().is_empty());
        let m = PortModify::new().lid(Lid(3)).state(PortState::Active);
        assert_eq!(
            (m.lid, m.state, m.sm_lid),
            (Some(Lid(3)), Some(PortState::Active), None)
        );
        assert!(!m.is_empty());
        assert!(m.check().is_ok());
        assert!(PortModify::new().lmc(8).check().is_err());
        assert!(PortModify::new().sm_sl(16).check().is_err());
        assert!(PortModify::new().lmc(7).sm_sl(15).check().is_ok());
    }
}
