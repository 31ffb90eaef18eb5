//! The subnet management agent of a port, sans-IO (the seeds place it in
//! the access layer, above the CA driver): it answers the subnet manager's
//! SMPs about this node and port, and turns the SM's Set(PortInfo) and
//! Set(P_KeyTable) into actions the driver applies through the provider.
//!
//! Answered: Get of NodeInfo, NodeDescription, PortInfo, P_KeyTable (block
//! 0) and GUIDInfo (block 0); Set of PortInfo (LID, LMC, master SM LID,
//! subnet timeout, port state, the M_Key fields), P_KeyTable and GUIDInfo.
//! The port's GUID table has [`GUID_CAP`] entries (PortInfo:GUIDCap), one
//! block: IBA 14.2.5.5 lets the SM assign entries 1 and up (alias GUIDs),
//! while entry 0 is the port GUID and read-only, so a Set's entry 0 is
//! ignored and the response shows the table as it now is. Soft RoCE
//! addresses a port by GID, so the aliases are kept for the SM to read
//! back ([`Sma::guids`]) and no provider is told. The LMC
//! (IBA 7.11.1: the port answers to its base LID and the 2^LMC - 1 LIDs
//! above it) is kept in PortInfo only: soft RoCE reaches a port by GID,
//! so no provider is told; the SM and SA use the range in their records. Port state moves
//! only as IBA 14.2.5.6 allows a CA port: INIT to ARMED, ARMED to ACTIVE,
//! anything to DOWN (after which the link retrains and the port is back in
//! INIT); a Set asking for anything else is refused with "invalid
//! attribute value" and changes nothing. Other attributes get
//! "method/attribute unsupported", other methods "method unsupported".
//! Directed-route SMPs are answered when this port is their end (hop
//! pointer equal to hop count, as for a CA); LID-routed ones always.
//!
//! M_Key (IBA 14.2.4): the SM sets PortInfo:M_Key, M_KeyProtectBits and
//! M_KeyLeasePeriod. An SMP's M_Key is good when it equals the port's or
//! the port's is 0. With a wrong key a Get is still answered at protect
//! level 0 (the key shown) and 1 (PortInfo:M_Key shown as 0), and refused
//! at 2 and 3; a Set and a TrapRepress are always refused. A refusal is
//! silent (no response: the requester sees a timeout), counts in
//! PortInfo:M_KeyViolations (saturating), starts the lease timer if it is
//! not running and the period is not 0, and raises trap 256 (Bad M_Key)
//! to the SM. Any Get, Set or TrapRepress with a good key stops the timer;
//! when it runs out the protect bits go to 0, so a new SM can read the key
//! (the lease exists for an SM that died holding it). Time comes in with
//! each SMP ([`Sma::handle`]) and [`Sma::handle_timeout`].
//!
//! Traps: when the port's CapabilityMask changes while an SM manages it
//! (master SM LID set), the agent raises trap 144 (IBA 14.2.5.1: a
//! LID-routed Trap(Notice) to the SM, producer CA, data details LID,
//! new CapabilityMask); a refused M_Key raises trap 256 (type security,
//! details: requester LID, method, attribute, modifier, the bad M_Key, and
//! for a directed-route SMP its hop count and return path); packets the
//! port dropped for their P_Key ([`Sma::note_pkey_violations`], from the
//! driver, which has them from the provider) count in
//! PortInfo:P_KeyViolations (saturating; an SM's Set writes it) and raise
//! trap 257 (type security, details [`BadKeyTrap`]: the sender's LID, QP
//! and GID, ours, the P_Key). [`Sma::trap`]
//! is the oldest unrepressed one until the SM's TrapRepress with its TID
//! arrives, so the driver sends it and sends it again until then; at most
//! one of each number waits (a newer one replaces it).

use crate::gsi::{status_reply, MadBytes};
use rdma_mad::mad::{MadHeaderRepr, MadStatus, Method, MgmtClass, StatusCode, MAD_SIZE};
use rdma_mad::smp::{cap, BadKeyTrap, NodeInfo, Notice, PortInfo, Smp, SmpAttr};
use rdma_types::{Duration, Gid, Guid, Instant, Pkey};
use std::collections::VecDeque;

/// Trap 144: a port's CapabilityMask changed (IBA 14.2.5.1).
pub const TRAP_CAPABILITY_MASK_CHANGE: u16 = 144;
/// Trap 256: an SMP came with a bad M_Key (IBA 14.2.4.3).
pub const TRAP_BAD_MKEY: u16 = Notice::TRAP_BAD_MKEY;
/// Trap 257: the port dropped a packet for its P_Key (IBA 14.2.5.1).
pub const TRAP_BAD_PKEY: u16 = Notice::TRAP_BAD_PKEY;
/// Where an SMP's M_Key is.
const SMP_MKEY: std::ops::Range<usize> = 24..32;

/// Entries of the port's GUID table (PortInfo:GUIDCap): one GUIDInfo block.
pub const GUID_CAP: usize = 8;

/// Where SMP attribute data starts.
pub const SMP_DATA: usize = 64;
/// Port states (PortInfo:PortState).
pub mod state {
    /// Down.
    pub const DOWN: u8 = 1;
    /// Initialize.
    pub const INIT: u8 = 2;
    /// Armed.
    pub const ARMED: u8 = 3;
    /// Active.
    pub const ACTIVE: u8 = 4;

    /// A state in opensm's and saquery's words (`DOWN`, `INIT`, `ARMED`,
    /// `ACTIVE`); `None` for a value that is none of them.
    pub fn name(s: u8) -> Option<&'static str> {
        match s {
            DOWN => Some("DOWN"),
            INIT => Some("INIT"),
            ARMED => Some("ARMED"),
            ACTIVE => Some("ACTIVE"),
            _ => None,
        }
    }
}

/// What the driver must do after a Set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmaAction {
    /// The port's LID is now this.
    Lid(u16),
    /// The master SM is at this LID.
    SmLid(u16),
    /// The port state is now this (see [`state`]).
    State(u8),
    /// The P_Key table changed.
    Pkeys,
    /// The master SM now answers at this GID: the Sets come from it (an
    /// action of [`crate::sma_agent::SmaAgent`], which sees where an SMP
    /// came from; never of [`Sma::handle`]).
    SmGid(Gid),
}

/// Who the node and port are.
#[derive(Debug, Clone)]
pub struct SmaConfig {
    /// Node GUID.
    pub node_guid: Guid,
    /// Port GUID.
    pub port_guid: Guid,
    /// NodeDescription (up to 64 bytes).
    pub description: String,
    /// PortInfo:CapabilityMask (see `rdma_mad::smp::cap`).
    pub capability_mask: u32,
}

/// The agent of one CA port.
#[derive(Debug, Clone)]
pub struct Sma {
    node: NodeInfo,
    port: [u8; 64],
    pkeys: [u16; 32],
    /// GUIDInfo block 0: entry 0 is the port GUID, the rest the SM's.
    guids: [u64; GUID_CAP],
    description: String,
    /// Unrepressed traps, oldest first, one per trap number at most.
    traps: VecDeque<MadBytes>,
    trap_tid: u64,
    /// When M_KeyProtectBits go to 0 unless a good M_Key comes first.
    lease_end: Option<Instant>,
}

impl Sma {
    /// A port whose link is up, in INIT, with no LID, and the default
    /// partition (full member) in P_Key slot 0.
    pub fn new(cfg: SmaConfig) -> Sma {
        let node = NodeInfo {
            base_version: 1,
            class_version: 1,
            node_type: 1,
            num_ports: 1,
            system_image_guid: cfg.node_guid,
            node_guid: cfg.node_guid,
            port_guid: cfg.port_guid,
            partition_cap: 32,
            device_id: 0x1000,
            revision: 1,
            local_port_num: 1,
            vendor_id: 0x0002c9,
        };
        let mut port = [0u8; 64];
        {
            let mut p = PortInfo::new_checked(&mut port[..]).expect("64 bytes");
            p.set_gid_prefix(0xfe80_0000_0000_0000);
            p.set_capability_mask(cfg.capability_mask);
            p.set_local_port_num(1);
            p.set_port_state(state::INIT);
            p.set_phys_state(5); // LinkUp
            p.set_mtu_cap(5); // 4096
            p.set_guid_cap(GUID_CAP as u8);
            p.set_resp_time_value(18);
        }
        let mut pkeys = [0u16; 32];
        pkeys[0] = 0xffff;
        let mut guids = [0u64; GUID_CAP];
        guids[0] = cfg.port_guid.0;
        Sma {
            node,
            port,
            pkeys,
            guids,
            description: cfg.description,
            traps: VecDeque::new(),
            trap_tid: 0,
            lease_end: None,
        }
    }

    /// The port's LID (0 until the SM assigns one).
    pub fn lid(&self) -> u16 {
        self.port_info().lid()
    }

    /// PortInfo:LMC: the port's LIDs are [`Sma::lid`] and the
    /// `2^lmc - 1` above it.
    pub fn lmc(&self) -> u8 {
        self.port_info().lmc()
    }

    /// The master SM's LID.
    pub fn sm_lid(&self) -> u16 {
        self.port_info().sm_lid()
    }

    /// The port state (see [`state`]).
    pub fn port_state(&self) -> u8 {
        self.port_info().port_state()
    }

    /// The P_Key table (block 0).
    pub fn pkeys(&self) -> [Pkey; 32] {
        self.pkeys.map(Pkey)
    }

    /// The port's GUID.
    pub fn port_guid(&self) -> Guid {
        self.node.port_guid
    }

    /// The GUID table (GUIDInfo block 0): entry 0 is the port GUID, the
    /// others what the SM assigned (0: unassigned).
    pub fn guids(&self) -> [Guid; GUID_CAP] {
        self.guids.map(Guid)
    }

    /// PortInfo:CapabilityMask.
    pub fn capability_mask(&self) -> u32 {
        self.port_info().capability_mask()
    }

    /// Changes the capability mask (a client registering a service, as the
    /// DM agent sets IsDeviceManagementSupported).
    /// If the mask changed and an SM manages the port, trap 144 is raised
    /// (see [`Sma::trap`]); a newer change replaces an unanswered trap.
    pub fn set_capability_mask(&mut self, mask: u32) {
        if mask == self.capability_mask() {
            return;
        }
        PortInfo::new_checked(&mut self.port[..])
            .expect("64 bytes")
            .set_capability_mask(mask);
        if self.sm_lid() == 0 {
            return; // nobody to tell: the SM reads the mask when it comes
        }
        // Data details of trap 144: reserved 2, LID 2, reserved 1, flags 1,
        // new CapabilityMask 4, reserved 2, change flags 2, CapabilityMask2.
        let mut details = [0u8; 54];
        details[2..4].copy_from_slice(&self.lid().to_be_bytes());
        details[6..10].copy_from_slice(&mask.to_be_bytes());
        self.raise_trap(TRAP_CAPABILITY_MASK_CHANGE, 4, details); // informational
    }

    /// Queues trap `number` (a LID-routed Trap(Notice) to the master SM,
    /// producer CA), replacing an unrepressed one of the same number.
    fn raise_trap(&mut self, number: u16, notice_type: u8, details: [u8; 54]) {
        self.trap_tid += 1;
        let mut m = [0u8; MAD_SIZE];
        // LID-routed, to the master SM LID.
        MadHeaderRepr::new(
            MgmtClass::SubnLid,
            1,
            Method::Trap,
            0x5411_0000_0000_0000 | self.trap_tid,
            SmpAttr::Notice.into(),
        )
        .emit(&mut m);
        // The port's own M_Key, so the SM's TrapRepress (our trap with the
        // method changed) passes the check.
        Smp::new_unchecked(&mut m[..]).set_mkey(self.mkey());
        let notice = Notice {
            is_generic: true,
            notice_type,
            producer_type: 1, // channel adapter
            trap_number: number,
            issuer_lid: self.lid(),
            toggle: false,
            count: 0,
            data_details: details,
            issuer_gid: Gid([0; 16]),
        };
        // An SMP carries 64 bytes of data: the notice without its issuer
        // GID, which the SM fills in from the sender when it forwards it.
        let mut full = [0u8; Notice::LEN];
        notice.emit(&mut full);
        m[SMP_DATA..SMP_DATA + 64].copy_from_slice(&full[..64]);
        self.traps.retain(|t| trap_number(t) != number);
        self.traps.push_back(m);
    }

    /// The oldest trap the SM has not yet repressed: to send, and to send
    /// again until [`Sma::handle`] sees its TrapRepress.
    pub fn trap(&self) -> Option<&MadBytes> {
        self.traps.front()
    }

    /// Gives up the oldest unrepressed trap (the driver sent it enough
    /// times); the next, if any, becomes [`Sma::trap`].
    pub fn abandon_trap(&mut self) {
        self.traps.pop_front();
    }

    /// Traps waiting for their TrapRepress.
    pub fn traps_pending(&self) -> usize {
        self.traps.len()
    }

    /// PortInfo:M_Key (0: no protection).
    pub fn mkey(&self) -> u64 {
        self.port_info().mkey()
    }

    /// PortInfo:M_KeyProtectBits (0 to 3).
    pub fn mkey_protect(&self) -> u8 {
        self.port_info().mkey_protect()
    }

    /// PortInfo:M_KeyViolations.
    pub fn mkey_violations(&self) -> u16 {
        self.port_info().mkey_violations()
    }

    /// PortInfo:P_KeyViolations.
    pub fn pkey_violations(&self) -> u16 {
        self.port_info().pkey_violations()
    }

    /// The port dropped `count` packets for their P_Key (IBA 10.9.3), the
    /// latest as `last` tells: PortInfo:P_KeyViolations counts them
    /// (saturating) and, if an SM manages the port, trap 257 reports the
    /// latest (LID2 and GID2, ours, filled in where `last` lacks them; a
    /// newer one replaces an unrepressed one).
    pub fn note_pkey_violations(&mut self, count: u64, mut last: BadKeyTrap) {
        let mut p = PortInfo::new_checked(&mut self.port[..]).expect("64 bytes");
        let n = u64::from(p.pkey_violations()).saturating_add(count);
        p.set_pkey_violations(n.min(u64::from(u16::MAX)) as u16);
        if self.sm_lid() == 0 || count == 0 {
            return;
        }
        if last.lid2 == 0 {
            last.lid2 = self.lid();
        }
        self.raise_trap(TRAP_BAD_PKEY, 2, last.emit()); // security
    }

    /// When the M_Key lease runs out (protection drops to level 0) unless
    /// a good M_Key comes first; `None` while no lease is running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.lease_end
    }

    /// Ends the M_Key lease if it is due (IBA 14.2.4.4: the protect bits
    /// go to 0; the key stays).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.lease_end.is_some_and(|t| t <= now) {
            self.lease_end = None;
            PortInfo::new_checked(&mut self.port[..])
                .expect("64 bytes")
                .set_mkey_protect(0);
        }
    }

    /// An SMP with a bad M_Key was refused: counted, the lease started,
    /// trap 256 raised (if an SM manages the port).
    fn mkey_violation(&mut self, now: Instant, req: &MadBytes) {
        let mut p = PortInfo::new_checked(&mut self.port[..]).expect("64 bytes");
        p.set_mkey_violations(p.mkey_violations().saturating_add(1));
        let lease = p.mkey_lease_period();
        if self.lease_end.is_none() && lease != 0 {
            self.lease_end = Some(now + Duration::from_secs(u64::from(lease)));
        }
        if self.sm_lid() == 0 {
            return;
        }
        // Data details of trap 256: reserved 2, requester LID 2, reserved
        // 1, method 1, attribute ID 2, modifier 4, M_Key 8, reserved 1,
        // DR notice / truncated / hop count 1, DR return path 30. Over UDP
        // the requester's LID is known only from a directed-route SMP's
        // DrSLID.
        let directed = req[1] == 0x81;
        let mut d = [0u8; 54];
        if directed {
            d[2..4].copy_from_slice(&req[32..34]);
        }
        d[5] = req[3];
        d[6..8].copy_from_slice(&req[16..18]);
        d[8..12].copy_from_slice(&req[20..24]);
        d[12..20].copy_from_slice(&req[SMP_MKEY]);
        if directed {
            let hops = req[7] & 0x3f;
            let truncated = usize::from(hops) + 1 > 30;
            d[21] = 0x80 | if truncated { 0x40 } else { 0 } | hops;
            d[22..52].copy_from_slice(&req[192..222]);
        }
        self.raise_trap(TRAP_BAD_MKEY, 2, d); // security
    }

    /// Sets what the SM's own port is when the SM configures it itself
    /// (no SMPs): its LID, the master SM LID, and the port state.
    pub fn assume(&mut self, lid: u16, sm_lid: u16, port_state: u8) {
        let mut p = PortInfo::new_checked(&mut self.port[..]).expect("64 bytes");
        p.set_lid(lid);
        p.set_sm_lid(sm_lid);
        p.set_port_state(port_state);
    }

    /// The link went down and came back (a cable pulled, a port reset):
    /// the port is back in INIT and keeps nothing the SM set but its LID.
    pub fn link_retrained(&mut self) {
        PortInfo::new_checked(&mut self.port[..])
            .expect("64 bytes")
            .set_port_state(state::INIT);
    }

    fn port_info(&self) -> PortInfo<&[u8]> {
        PortInfo::new_checked(&self.port[..]).expect("64 bytes")
    }

    /// Answers SMP `smp` arriving at `now`; `None` when there is nothing
    /// to answer (a response, a Trap, a TrapRepress, a directed-route SMP
    /// that does not end here, one refused for its M_Key, or fewer than
    /// 256 bytes).
    pub fn handle(&mut self, now: Instant, smp: &[u8]) -> Option<(MadBytes, Vec<SmaAction>)> {
        let req: &MadBytes = smp.get(..MAD_SIZE)?.try_into().ok()?;
        if req[0] != 1 || !matches!(req[1], 0x01 | 0x81) || req[3] & 0x80 != 0 {
            return None;
        }
        let directed = req[1] == 0x81;
        if directed && req[6] != req[7] {
            return None; // not the end of the path: we are no switch
        }
        self.handle_timeout(now);
        let method = Method::from(req[3]);
        let key = u64::from_be_bytes(req[SMP_MKEY].try_into().expect("8 bytes"));
        let good_key = self.mkey() == 0 || key == self.mkey();
        if matches!(method, Method::Get | Method::Set | Method::TrapRepress) {
            if good_key {
                self.lease_end = None;
            } else if method != Method::Get || self.mkey_protect() >= 2 {
                self.mkey_violation(now, req);
                return None; // silently: the requester only sees a timeout
            }
        }
        // A wrong key's Get at protect level 1 sees PortInfo:M_Key as 0.
        let hide_key = !good_key && self.mkey_protect() == 1;
        if method == Method::TrapRepress {
            // The SM heard our trap: stop sending it. Nothing answers a
            // TrapRepress (IBA 13.4.7).
            self.traps.retain(|t| t[8..16] != req[8..16]);
            return None;
        }
        let finish = |mut r: MadBytes| {
            // The SMP header past the common one comes back as it came:
            // M_Key, DrSLID, DrDLID (IBA 14.2.1.2).
            r[24..40].copy_from_slice(&req[24..40]);
            if directed {
                r[4] |= 0x80; // D bit: returning
            }
            r
        };
        let status = |code| finish(status_reply(req, MadStatus::from_code(code)));
        if !matches!(method, Method::Get | Method::Set) {
            return Some((status(StatusCode::MethodUnsupported), Vec::new()));
        }
        let attr = SmpAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let modifier = u32::from_be_bytes(req[20..24].try_into().expect("4 bytes"));
        let mut actions = Vec::new();
        if method == Method::Set {
            let data = &req[SMP_DATA..SMP_DATA + 64];
            match attr {
                SmpAttr::PortInfo => match self.set_port_info(data) {
                    Ok(a) => actions = a,
                    Err(()) => return Some((status(StatusCode::InvalidAttrValue), Vec::new())),
                },
                SmpAttr::PkeyTable if modifier == 0 => {
                    for (i, k) in self.pkeys.iter_mut().enumerate() {
                        *k = u16::from_be_bytes([data[2 * i], data[2 * i + 1]]);
                    }
                    actions.push(SmaAction::Pkeys);
                }
                SmpAttr::GuidInfo if modifier == 0 => {
                    // Entry 0 is the port GUID: read-only (IBA 14.2.5.5).
                    for (i, g) in self.guids.iter_mut().enumerate().skip(1) {
                        *g = u64::from_be_bytes(data[8 * i..8 * i + 8].try_into().expect("8"));
                    }
                }
                SmpAttr::PkeyTable | SmpAttr::GuidInfo => {
                    return Some((status(StatusCode::InvalidAttrValue), Vec::new()))
                }
                _ => return Some((status(StatusCode::MethodAttrUnsupported), Vec::new())),
            }
        }
        let mut r = status_reply(req, MadStatus::OK);
        let data = &mut r[SMP_DATA..SMP_DATA + 64];
        match attr {
            SmpAttr::NodeInfo => self.node.emit(data),
            SmpAttr::NodeDescription => {
                let d = self.description.as_bytes();
                let n = d.len().min(64);
                data[..n].copy_from_slice(&d[..n]);
            }
            SmpAttr::PortInfo => {
                data.copy_from_slice(&self.port);
                if hide_key {
                    data[..8].fill(0);
                }
            }
            SmpAttr::PkeyTable if modifier == 0 => {
                for (i, k) in self.pkeys.iter().enumerate() {
                    data[2 * i..2 * i + 2].copy_from_slice(&k.to_be_bytes());
                }
            }
            SmpAttr::GuidInfo if modifier == 0 => {
                for (i, g) in self.guids.iter().enumerate() {
                    data[8 * i..8 * i + 8].copy_from_slice(&g.to_be_bytes());
                }
            }
            SmpAttr::PkeyTable | SmpAttr::GuidInfo => {
                return Some((status(StatusCode::InvalidAttrValue), Vec::new()))
            }
            _ => return Some((status(StatusCode::MethodAttrUnsupported), Vec::new())),
        }
        Some((finish(r), actions))
    }

    fn set_port_info(&mut self, data: &[u8]) -> Result<Vec<SmaAction>, ()> {
        let want = PortInfo::new_checked(data).map_err(|_| ())?;
        let now = self.port_state();
        let next = match want.port_state() {
            0 => now,
            state::DOWN => state::INIT, // down, then the link retrains
            state::ARMED if now == state::INIT || now == state::ARMED => state::ARMED,
            state::ACTIVE if now == state::ARMED || now == state::ACTIVE => state::ACTIVE,
            _ => return Err(()),
        };
        let mut actions = Vec::new();
        let mut p = PortInfo::new_checked(&mut self.port[..]).expect("64 bytes");
        if want.lid() != 0 && want.lid() != p.lid() {
            p.set_lid(want.lid());
            actions.push(SmaAction::Lid(want.lid()));
        }
        // LMC is read-write on a CA port (IBA 14.2.5.6); a Set always
        // carries it, so an SM without LMC puts it back to 0.
        p.set_lmc(want.lmc());
        if want.sm_lid() != p.sm_lid() {
            p.set_sm_lid(want.sm_lid());
            actions.push(SmaAction::SmLid(want.sm_lid()));
        }
        p.set_subnet_timeout(want.subnet_timeout());
        p.set_mkey(want.mkey());
        p.set_mkey_protect(want.mkey_protect());
        p.set_mkey_lease_period(want.mkey_lease_period());
        p.set_mkey_violations(want.mkey_violations());
        p.set_pkey_violations(want.pkey_violations());
        if next != now {
            p.set_port_state(next);
            actions.push(SmaAction::State(next));
        }
        Ok(actions)
    }
}

/// The trap number of a queued trap SMP.
fn trap_number(t: &MadBytes) -> u16 {
    u16::from_be_bytes([t[SMP_DATA + 4], t[SMP_DATA + 5]])
}

/// PortInfo:CapabilityMask of a plain CA port: notices, traps, CM, and
/// device management when the node offers I/O controllers.
pub fn ca_capability_mask(device_management: bool) -> u32 {
    let mut m = cap::IS_TRAP_SUPPORTED | cap::IS_CM_SUPPORTED | cap::IS_SYS_IMAGE_GUID_SUPPORTED;
    if device_management {
        m |= cap::IS_DEVICE_MGMT_SUPPORTED;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smp(method: u8, attr: SmpAttr, directed: bool) -> MadBytes {
        let mut m = [0u8; MAD_SIZE];
        m[0] = 1;
        m[1] = if directed { 0x81 } else { 0x01 };
        m[2] = 1;
        m[3] = method;
        m[8..16].copy_from_slice(&7u64.to_be_bytes());
        m[16..18].copy_from_slice(&u16::from(attr).to_be_bytes());
        m
    }

    fn sma() -> Sma {
        Sma::new(SmaConfig {
            node_guid: Guid(0x10),
            port_guid: Guid(0x11),
            description: "host-a".into(),
            capability_mask: ca_capability_mask(true),
        })
    }

    fn status(r: &MadBytes) -> u16 {
        u16::from_be_bytes([r[4], r[5]]) & 0x7fff
    }

    #[test]
    fn gets_describe_the_node_and_port() {
        let mut s = sma();
        let (r, a) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::NodeInfo, true))
            .unwrap();
        assert!(a.is_empty());
        assert_eq!(r[3], 0x81);
        assert_eq!(r[4] & 0x80, 0x80, "directed route response has D set");
        let n = NodeInfo::parse(&r[SMP_DATA..]).unwrap();
        assert_eq!(
            (n.node_guid, n.port_guid, n.node_type),
            (Guid(0x10), Guid(0x11), 1)
        );
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::PortInfo, false))
            .unwrap();
        let p = PortInfo::new_checked(&r[SMP_DATA..]).unwrap();
        assert_eq!(p.port_state(), state::INIT);
        assert_ne!(p.capability_mask() & cap::IS_DEVICE_MGMT_SUPPORTED, 0);
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::NodeDescription, false))
            .unwrap();
        assert_eq!(&r[SMP_DATA..SMP_DATA + 6], b"host-a");
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::GuidInfo, false))
            .unwrap();
        assert_eq!(&r[SMP_DATA..SMP_DATA + 8], &0x11u64.to_be_bytes());
        // Refusals and silence.
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::SwitchInfo, false))
            .unwrap();
        assert_eq!(status(&r), 0x000C);
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x05, SmpAttr::NodeInfo, false))
            .unwrap();
        assert_eq!(status(&r), 0x0008);
        assert!(s
            .handle(Instant::ZERO, &smp(0x81, SmpAttr::NodeInfo, false))
            .is_none());
        let mut through = smp(0x01, SmpAttr::NodeInfo, true);
        through[7] = 2; // hop count 2, pointer 0: not for us
        assert!(s.handle(Instant::ZERO, &through).is_none());
        assert!(s.handle(Instant::ZERO, &[1, 1, 1]).is_none());
    }

    #[test]
    fn set_guid_info_assigns_aliases_and_keeps_entry_0() {
        let mut s = sma();
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::PortInfo, false))
            .unwrap();
        let p = PortInfo::new_checked(&r[SMP_DATA..]).unwrap();
        assert_eq!(usize::from(p.guid_cap()), GUID_CAP);
        // The SM tries to overwrite entry 0 and assigns entries 1 and 7.
        let mut m = smp(0x02, SmpAttr::GuidInfo, true);
        m[SMP_DATA..SMP_DATA + 8].copy_from_slice(&0xdeadu64.to_be_bytes());
        m[SMP_DATA + 8..SMP_DATA + 16].copy_from_slice(&0x0002_c903_0000_0a01u64.to_be_bytes());
        m[SMP_DATA + 56..SMP_DATA + 64].copy_from_slice(&0x0002_c903_0000_0a07u64.to_be_bytes());
        let (r, a) = s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(status(&r), 0);
        assert_eq!(r[3], 0x81, "GetResp to a Set");
        assert!(a.is_empty(), "nothing for the provider to do");
        assert_eq!(&r[SMP_DATA..SMP_DATA + 8], &0x11u64.to_be_bytes());
        assert_eq!(
            &r[SMP_DATA + 8..SMP_DATA + 16],
            &0x0002_c903_0000_0a01u64.to_be_bytes()
        );
        let g = s.guids();
        assert_eq!(
            (g[0], g[1], g[2], g[7]),
            (
                Guid(0x11),
                Guid(0x0002_c903_0000_0a01),
                Guid(0),
                Guid(0x0002_c903_0000_0a07)
            )
        );
        assert_eq!(s.port_guid(), Guid(0x11));
        // A later Get shows the table as set.
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::GuidInfo, false))
            .unwrap();
        assert_eq!(
            &r[SMP_DATA + 56..SMP_DATA + 64],
            &0x0002_c903_0000_0a07u64.to_be_bytes()
        );
        // A block past the table is refused and changes nothing.
        let mut m = smp(0x02, SmpAttr::GuidInfo, false);
        m[20..24].copy_from_slice(&1u32.to_be_bytes());
        m[SMP_DATA + 8..SMP_DATA + 16].copy_from_slice(&5u64.to_be_bytes());
        let (r, _) = s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(status(&r), 0x001C, "invalid attribute value");
        assert_eq!(s.guids(), g);
        // A Set with a wrong M_Key is refused like any other Set.
        s.handle(Instant::ZERO, &set_mkey(0, 0x42, 1, 0)).unwrap();
        let mut m = with_key(0x02, SmpAttr::GuidInfo, 0x43);
        m[SMP_DATA + 8..SMP_DATA + 16].copy_from_slice(&6u64.to_be_bytes());
        assert!(s.handle(Instant::ZERO, &m).is_none());
        assert_eq!(s.guids(), g);
    }

    #[test]
    fn sets_assign_lid_and_walk_the_port_states() {
        let mut s = sma();
        let set = |lid: u16, sm: u16, st: u8| {
            let mut m = smp(0x02, SmpAttr::PortInfo, true);
            let mut p = PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).unwrap();
            p.set_lid(lid);
            p.set_sm_lid(sm);
            p.set_port_state(st);
            m
        };
        // ACTIVE straight from INIT is refused and changes nothing.
        let (r, a) = s.handle(Instant::ZERO, &set(5, 1, state::ACTIVE)).unwrap();
        assert_eq!(status(&r), 0x001C);
        assert!(a.is_empty());
        assert_eq!((s.lid(), s.port_state()), (0, state::INIT));
        let (r, a) = s.handle(Instant::ZERO, &set(5, 1, state::ARMED)).unwrap();
        assert_eq!(status(&r), 0);
        assert_eq!(
            a,
            vec![
                SmaAction::Lid(5),
                SmaAction::SmLid(1),
                SmaAction::State(state::ARMED)
            ]
        );
        let (_, a) = s.handle(Instant::ZERO, &set(5, 1, state::ACTIVE)).unwrap();
        assert_eq!(a, vec![SmaAction::State(state::ACTIVE)]);
        assert_eq!((s.lid(), s.sm_lid(), s.port_state()), (5, 1, state::ACTIVE));
        // P_Key table.
        let mut m = smp(0x02, SmpAttr::PkeyTable, false);
        m[SMP_DATA..SMP_DATA + 4].copy_from_slice(&[0x80, 0x01, 0x00, 0x02]);
        let (r, a) = s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(a, vec![SmaAction::Pkeys]);
        assert_eq!(&r[SMP_DATA..SMP_DATA + 4], &[0x80, 0x01, 0x00, 0x02]);
        assert_eq!(s.pkeys()[1], Pkey(0x0002));
        // DOWN: the link retrains into INIT.
        let (_, a) = s.handle(Instant::ZERO, &set(0, 1, state::DOWN)).unwrap();
        assert_eq!(a, vec![SmaAction::State(state::INIT)]);
        assert_eq!(s.lid(), 5, "LID 0 in a Set leaves the LID alone");
    }

    #[test]
    fn set_port_info_takes_the_lmc_and_get_shows_it() {
        let mut s = sma();
        assert_eq!(s.lmc(), 0);
        let mut m = smp(0x02, SmpAttr::PortInfo, true);
        let mut p = PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).unwrap();
        p.set_lid(8);
        p.set_lmc(3);
        p.set_sm_lid(1);
        let (r, _) = s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(status(&r), 0);
        assert_eq!((s.lid(), s.lmc()), (8, 3));
        assert_eq!(PortInfo::new_checked(&r[SMP_DATA..]).unwrap().lmc(), 3);
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::PortInfo, false))
            .unwrap();
        assert_eq!(PortInfo::new_checked(&r[SMP_DATA..]).unwrap().lmc(), 3);
        // A Set without LMC (an SM that uses none) puts it back to 0.
        PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64])
            .unwrap()
            .set_lmc(0);
        s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(s.lmc(), 0);
    }

    #[test]
    fn capability_change_raises_trap_144_until_repressed() {
        let mut s = sma();
        // No SM yet: nobody to tell.
        s.set_capability_mask(ca_capability_mask(false));
        assert!(s.trap().is_none());
        s.assume(7, 1, state::ACTIVE);
        s.set_capability_mask(ca_capability_mask(false)); // unchanged
        assert!(s.trap().is_none());
        s.set_capability_mask(ca_capability_mask(true));
        let t = *s.trap().expect("trap raised");
        assert_eq!((t[1], t[3]), (0x01, 0x05), "LID-routed Trap");
        assert_eq!(u16::from_be_bytes([t[16], t[17]]), 0x0002, "Notice");
        let mut full = [0u8; Notice::LEN];
        full[..64].copy_from_slice(&t[SMP_DATA..SMP_DATA + 64]);
        let n = Notice::parse(&full).unwrap();
        assert_eq!((n.trap_number, n.issuer_lid, n.producer_type), (144, 7, 1));
        assert_eq!(&n.data_details[2..4], &7u16.to_be_bytes());
        assert_eq!(
            u32::from_be_bytes(n.data_details[6..10].try_into().unwrap()),
            ca_capability_mask(true)
        );
        // A TrapRepress with another TID leaves it; the right one clears it.
        let mut rep = t;
        rep[3] = 0x07;
        rep[15] ^= 0xff;
        assert!(s.handle(Instant::ZERO, &rep).is_none());
        assert!(s.trap().is_some());
        rep[15] ^= 0xff;
        assert!(
            s.handle(Instant::ZERO, &rep).is_none(),
            "nothing answers a TrapRepress"
        );
        assert!(s.trap().is_none());
    }

    /// Sets PortInfo with the M_Key fields, carrying `key` in the SMP.
    fn set_mkey(key: u64, mkey: u64, protect: u8, lease: u16) -> MadBytes {
        let mut m = smp(0x02, SmpAttr::PortInfo, true);
        m[SMP_MKEY].copy_from_slice(&key.to_be_bytes());
        let mut p = PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).unwrap();
        p.set_sm_lid(1);
        p.set_mkey(mkey);
        p.set_mkey_protect(protect);
        p.set_mkey_lease_period(lease);
        m
    }

    fn with_key(method: u8, attr: SmpAttr, key: u64) -> MadBytes {
        let mut m = smp(method, attr, true);
        m[SMP_MKEY].copy_from_slice(&key.to_be_bytes());
        m
    }

    const K: u64 = 0x1122_3344_5566_7788;
    const BAD: u64 = 0xbad;

    #[test]
    fn mkey_protect_levels_gate_gets_and_sets() {
        let t = Instant::ZERO;
        // Level 0 and 1: a wrong key's Get is answered (key shown, then
        // hidden) and counts nothing; its Set is refused and counted.
        for (level, shown) in [(0, K), (1, 0)] {
            let mut s = sma();
            assert!(s.handle(t, &set_mkey(0, K, level, 0)).is_some());
            assert_eq!((s.mkey(), s.mkey_protect()), (K, level));
            let (r, _) = s
                .handle(t, &with_key(0x01, SmpAttr::PortInfo, BAD))
                .unwrap();
            assert_eq!(status(&r), 0);
            assert_eq!(PortInfo::new_checked(&r[SMP_DATA..]).unwrap().mkey(), shown);
            assert_eq!(&r[SMP_MKEY], &BAD.to_be_bytes(), "the SMP's key comes back");
            let (r, _) = s.handle(t, &with_key(0x01, SmpAttr::PortInfo, K)).unwrap();
            assert_eq!(PortInfo::new_checked(&r[SMP_DATA..]).unwrap().mkey(), K);
            assert_eq!(
                s.mkey_violations(),
                0,
                "a Get below level 2 is no violation"
            );
            assert!(
                s.handle(t, &set_mkey(BAD, 0, 0, 0)).is_none(),
                "level {level}"
            );
            assert_eq!((s.mkey(), s.mkey_violations()), (K, 1));
        }
        // Level 2 (and 3): a wrong key's Get is refused too, silently.
        for level in [2, 3] {
            let mut s = sma();
            s.handle(t, &set_mkey(0, K, level, 0)).unwrap();
            assert!(s
                .handle(t, &with_key(0x01, SmpAttr::NodeInfo, BAD))
                .is_none());
            assert!(s.handle(t, &with_key(0x01, SmpAttr::PortInfo, 0)).is_none());
            assert_eq!(s.mkey_violations(), 2);
            let (r, _) = s.handle(t, &with_key(0x01, SmpAttr::NodeInfo, K)).unwrap();
            assert_eq!(status(&r), 0);
            // The right key changes the key; the old one is wrong then.
            let (r, _) = s.handle(t, &set_mkey(K, K + 1, level, 0)).unwrap();
            assert_eq!(status(&r), 0);
            assert!(s.handle(t, &with_key(0x01, SmpAttr::NodeInfo, K)).is_none());
            assert_eq!(s.mkey_violations(), 1, "the Set wrote M_KeyViolations 0");
        }
        // A port with M_Key 0 takes any key.
        let mut s = sma();
        assert!(s
            .handle(t, &with_key(0x02, SmpAttr::PkeyTable, BAD))
            .is_some());
        assert_eq!(s.mkey_violations(), 0);
    }

    #[test]
    fn violations_saturate_and_raise_trap_256() {
        let mut s = sma();
        let t = Instant::ZERO;
        s.handle(t, &set_mkey(0, K, 2, 0)).unwrap();
        assert!(s.trap().is_none());
        let mut bad = with_key(0x02, SmpAttr::PkeyTable, BAD);
        bad[20..24].copy_from_slice(&3u32.to_be_bytes());
        bad[32..34].copy_from_slice(&9u16.to_be_bytes()); // DrSLID
        assert!(s.handle(t, &bad).is_none());
        let trap = *s.trap().expect("trap 256 raised");
        assert_eq!((trap[1], trap[3]), (0x01, 0x05), "LID-routed Trap");
        assert_eq!(&trap[SMP_MKEY], &K.to_be_bytes(), "carries the port's key");
        let mut full = [0u8; Notice::LEN];
        full[..64].copy_from_slice(&trap[SMP_DATA..SMP_DATA + 64]);
        let n = Notice::parse(&full).unwrap();
        assert_eq!((n.trap_number, n.notice_type, n.producer_type), (256, 2, 1));
        let d = n.data_details;
        assert_eq!(&d[2..4], &9u16.to_be_bytes(), "requester LID");
        assert_eq!(d[5], 0x02, "method");
        assert_eq!(&d[6..8], &u16::from(SmpAttr::PkeyTable).to_be_bytes());
        assert_eq!(&d[8..12], &3u32.to_be_bytes(), "modifier");
        assert_eq!(&d[12..20], &BAD.to_be_bytes(), "the bad key");
        assert_eq!(d[21], 0x80, "directed route, hop count 0");
        // A second violation replaces the unrepressed 256; a 144 queues
        // behind it.
        assert!(s.handle(t, &bad).is_none());
        s.set_capability_mask(0);
        assert_eq!(s.traps_pending(), 2);
        let first = *s.trap().unwrap();
        assert_ne!(first[8..16], trap[8..16], "the newer 256 replaced the old");
        // The SM's TrapRepress (the trap echoed) clears it; a repress with
        // the wrong key is itself a violation and clears nothing.
        let mut rep = first;
        rep[3] = 0x07;
        rep[SMP_MKEY].copy_from_slice(&BAD.to_be_bytes());
        assert!(s.handle(t, &rep).is_none());
        assert_eq!(s.traps_pending(), 2);
        rep[SMP_MKEY].copy_from_slice(&K.to_be_bytes());
        assert!(s.handle(t, &rep).is_none());
        assert_eq!(trap_number(s.trap().unwrap()), TRAP_CAPABILITY_MASK_CHANGE);
        assert_eq!(s.mkey_violations(), 3);
        // The counter stops at 0xffff.
        let mut m = set_mkey(K, K, 2, 0);
        PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64])
            .unwrap()
            .set_mkey_violations(0xfffe);
        s.handle(t, &m).unwrap();
        for _ in 0..3 {
            assert!(s.handle(t, &bad).is_none());
        }
        assert_eq!(s.mkey_violations(), 0xffff);
    }

    #[test]
    fn the_lease_drops_protection_unless_a_good_key_comes() {
        let mut s = sma();
        let t0 = Instant::ZERO;
        let secs = |n| t0 + Duration::from_secs(n);
        s.handle(t0, &set_mkey(0, K, 2, 10)).unwrap();
        assert_eq!(s.poll_timeout(), None, "no lease before a violation");
        // A violation at 1 s starts the 10 s lease; more do not restart it.
        assert!(s
            .handle(secs(1), &with_key(0x01, SmpAttr::NodeInfo, BAD))
            .is_none());
        assert_eq!(s.poll_timeout(), Some(secs(11)));
        assert!(s
            .handle(secs(5), &with_key(0x01, SmpAttr::NodeInfo, BAD))
            .is_none());
        assert_eq!(s.poll_timeout(), Some(secs(11)));
        // A good key stops it.
        assert!(s
            .handle(secs(6), &with_key(0x01, SmpAttr::NodeInfo, K))
            .is_some());
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(secs(20));
        assert_eq!(s.mkey_protect(), 2);
        // Violated again at 20 s and left alone: at 30 s protection is 0,
        // so a Get with any key reads the key, which a Set then needs.
        assert!(s
            .handle(secs(20), &with_key(0x01, SmpAttr::PortInfo, BAD))
            .is_none());
        assert!(s
            .handle(secs(29), &with_key(0x01, SmpAttr::PortInfo, BAD))
            .is_none());
        let (r, _) = s
            .handle(secs(30), &with_key(0x01, SmpAttr::PortInfo, BAD))
            .unwrap();
        assert_eq!(s.mkey_protect(), 0);
        assert_eq!(s.poll_timeout(), None);
        let learned = PortInfo::new_checked(&r[SMP_DATA..]).unwrap().mkey();
        assert_eq!(learned, K);
        assert!(s.handle(secs(30), &set_mkey(BAD, 0, 0, 0)).is_none());
        assert!(s.handle(secs(30), &set_mkey(learned, BAD, 2, 10)).is_some());
        assert_eq!((s.mkey(), s.mkey_protect()), (BAD, 2));
        // Lease period 0: protection never lapses.
        s.handle(secs(30), &set_mkey(BAD, K, 2, 0)).unwrap();
        assert!(s
            .handle(secs(31), &with_key(0x01, SmpAttr::NodeInfo, BAD))
            .is_none());
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(secs(100_000));
        assert_eq!(s.mkey_protect(), 2);
    }

    #[test]
    fn pkey_violations_count_and_raise_trap_257() {
        let mut s = sma();
        let bad = |qp1| BadKeyTrap {
            key: 0x7fff,
            qp1,
            qp2: 1,
            gid1: Gid([9; 16]),
            ..Default::default()
        };
        // No SM yet: counted, nobody to tell.
        s.note_pkey_violations(2, bad(1));
        assert_eq!(s.pkey_violations(), 2);
        assert!(s.trap().is_none());
        s.assume(7, 1, state::ACTIVE);
        s.note_pkey_violations(3, bad(0x44));
        assert_eq!(s.pkey_violations(), 5);
        let t = *s.trap().expect("trap 257 raised");
        assert_eq!((t[1], t[3]), (0x01, 0x05), "LID-routed Trap");
        let mut full = [0u8; Notice::LEN];
        full[..64].copy_from_slice(&t[SMP_DATA..SMP_DATA + 64]);
        let n = Notice::parse(&full).unwrap();
        assert_eq!((n.trap_number, n.notice_type, n.issuer_lid), (257, 2, 7));
        let d = BadKeyTrap::parse(&n.data_details);
        assert_eq!(
            d,
            BadKeyTrap {
                lid2: 7,
                ..bad(0x44)
            },
            "our LID filled in"
        );
        // A newer one replaces it; Get(PortInfo) shows the count, which
        // saturates, and a Set writes.
        s.note_pkey_violations(1, bad(0x45));
        assert_eq!(s.traps_pending(), 1);
        let (r, _) = s
            .handle(Instant::ZERO, &smp(0x01, SmpAttr::PortInfo, false))
            .unwrap();
        assert_eq!(
            PortInfo::new_checked(&r[SMP_DATA..])
                .unwrap()
                .pkey_violations(),
            6
        );
        s.note_pkey_violations(u64::MAX, bad(1));
        assert_eq!(s.pkey_violations(), 0xffff);
        let mut m = smp(0x02, SmpAttr::PortInfo, true);
        let mut p = PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).unwrap();
        p.set_sm_lid(1);
        p.set_pkey_violations(0);
        s.handle(Instant::ZERO, &m).unwrap();
        assert_eq!(s.pkey_violations(), 0);
    }
}
