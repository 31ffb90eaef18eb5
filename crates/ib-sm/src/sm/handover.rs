//! Several SMs on one subnet (IBA 14.4): SMInfo exchanged and answered,
//! the master elected by priority and GUID, standbys polling it and taking
//! over when it goes.

use super::*;

/// SMInfo:SMState (IBA 14.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmState {
    /// Not active: neither sweeps nor polls (after a DISABLE).
    NotActive,
    /// Discovering: the first sweep, reading only, looking for other SMs.
    Discovering,
    /// Standby: polls the master's SMInfo, takes over when it goes.
    Standby,
    /// Master: sweeps and configures the subnet.
    Master,
}

impl SmState {
    /// The SMInfo:SMState code.
    pub fn code(self) -> u8 {
        match self {
            SmState::NotActive => 0,
            SmState::Discovering => 1,
            SmState::Standby => 2,
            SmState::Master => 3,
        }
    }
}

/// True if SM `a` outranks SM `b`: higher priority, then lower GUID.
pub fn outranks(a: &SmInfo, b: &SmInfo) -> bool {
    a.priority > b.priority || (a.priority == b.priority && a.guid.0 < b.guid.0)
}

impl<P: Copy + Eq + std::fmt::Debug> SubnetManager<P> {
    /// The SM's port takes itself as master SM (its LID stays).
    pub(super) fn become_master(&mut self) {
        let lid = self.own.lid();
        self.own.assume(lid, lid, state::ACTIVE);
    }

    pub(super) fn set_state(&mut self, st: SmState) {
        if self.state != st {
            self.state = st;
            self.events.push_back(SmEvent::State(st));
        }
    }

    /// A master's Get(SMInfo) of the SM at node `i` (IBA 14.4.1), beside
    /// any sweep of the node.
    pub(super) fn poll_peer(&mut self, now: Instant, i: usize) {
        if self.nodes[i].polling {
            return;
        }
        self.nodes[i].polling = true;
        let to = self.nodes[i].addr;
        let m = smp(Method::Get, SmpAttr::SmInfo, 0);
        self.send(now, Some(i), to, QP_SMI, Some(Want::PeerPoll), m);
    }

    /// Records what the SM at node `i` said of itself; a master logs a
    /// standby it did not know.
    pub(super) fn peer_seen(&mut self, i: usize, info: SmInfo) {
        let n = &mut self.nodes[i];
        if n.sm.is_some_and(|s| s.guid != info.guid) {
            n.standby_logged = false;
        }
        n.sm = Some(info);
        if !n.standby_logged
            && self.state == SmState::Master
            && info.guid != self.cfg.guid
            && info.sm_state == SmState::Standby.code()
        {
            n.standby_logged = true;
            self.events.push_back(SmEvent::StandbyFound {
                guid: info.guid,
                priority: info.priority,
            });
        }
    }

    /// Node `i` has no SM (any more); a master logs a standby gone.
    pub(super) fn peer_gone(&mut self, i: usize) {
        let logged = std::mem::take(&mut self.nodes[i].standby_logged);
        if let Some(s) = self.nodes[i].sm.take() {
            if logged && self.state == SmState::Master {
                self.events.push_back(SmEvent::StandbyLost { guid: s.guid });
            }
        }
    }

    /// The end of discovery (IBA 14.4.1): a master found is followed; else
    /// an SM that outranks this one; else this one is master.
    pub(super) fn decide(&mut self, now: Instant) {
        let me = self.sm_info();
        let mut best: Option<(usize, SmInfo)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(peer) = n.sm else { continue };
            if peer.guid == me.guid || peer.sm_state == SmState::NotActive.code() {
                continue;
            }
            let key = |x: &SmInfo| (x.sm_state == SmState::Master.code(), outranks(x, &me));
            let better = match &best {
                None => key(&peer) != (false, false),
                Some((_, b)) => key(&peer) > key(b) || (key(&peer) == key(b) && outranks(&peer, b)),
            };
            if better {
                best = Some((i, peer));
            }
        }
        match best {
            Some((i, _)) => self.follow(now, i),
            None => {
                self.set_state(SmState::Master);
                self.become_master();
                self.start_sweep(now);
            }
        }
    }

    /// Becomes standby polling the SM at node `i`.
    pub(super) fn follow(&mut self, now: Instant, i: usize) {
        self.master = Some(i);
        for n in &mut self.nodes {
            n.standby_logged = false;
        }
        self.set_state(SmState::Standby);
        for n in &mut self.nodes {
            if n.stage == Stage::Parked {
                n.stage = Stage::Idle;
                n.busy = false;
            }
        }
        self.next_sweep = now + self.cfg.poll_interval;
    }

    /// An SMP to the SM's own port: SMInfo from another SM, a trap from
    /// an SMA, anything else to the port's own SMA.
    pub(super) fn smp_request(&mut self, now: Instant, from: P, req: &MadBytes) {
        let method = Method::from(req[3]);
        let attr = SmpAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let directed = req[1] == 0x81;
        let out = |m: MadBytes| Outgoing {
            to: from,
            qp: QP_SMI,
            mad: Box::new(m),
        };
        if method == Method::Trap {
            self.sma_trap(now, from, req);
            return;
        }
        if attr != SmpAttr::SmInfo || !matches!(method, Method::Get | Method::Set) {
            if let Some((r, _)) = self.own.handle(now, req) {
                self.tx.push_back(out(r));
            }
            return;
        }
        if directed && req[6] != req[7] {
            return;
        }
        if method == Method::Get && self.state == SmState::Master {
            // An SM asking for ours: if we do not know it, ask for its
            // (a new standby shows at once, not at the next sweep).
            if let Some(i) = self.nodes.iter().position(|n| n.addr == from) {
                if self.nodes[i].sm.is_none() {
                    self.poll_peer(now, i);
                }
            }
        }
        let peer = SmInfo::parse(&req[SMP_DATA..SMP_DATA + SmInfo::LEN]).ok();
        let keyed = peer.is_some_and(|p| p.sm_key == self.cfg.sm_key);
        let mut status = MadStatus::OK;
        if method == Method::Set {
            let modifier = u32::from_be_bytes(req[20..24].try_into().expect("4 bytes"));
            let from_node = self.nodes.iter().position(|n| n.addr == from);
            // The Set carries its sender's SMInfo: only a master sends
            // HANDOVER, DISABLE, STANDBY and DISCOVER, only a standby
            // ACKNOWLEDGE (the legality opensm checks too).
            let sender = peer.map_or(SmState::NotActive.code(), |p| p.sm_state);
            let legal = match modifier {
                sminfo_control::ACKNOWLEDGE => sender == SmState::Standby.code(),
                _ => sender == SmState::Master.code(),
            };
            match modifier {
                _ if !keyed || !legal => {
                    self.stats.sminfo_refused += 1;
                    status = MadStatus::from_code(StatusCode::InvalidAttrValue);
                }
                sminfo_control::HANDOVER
                    if matches!(self.state, SmState::Standby | SmState::Discovering) =>
                {
                    // Acknowledged (IBA 14.4.1) with the SMInfo the
                    // HANDOVER found, a standby's (what opensm's check of
                    // an ACKNOWLEDGE wants), sent again until answered.
                    let mut ack = smp(Method::Set, SmpAttr::SmInfo, sminfo_control::ACKNOWLEDGE);
                    self.sm_info()
                        .emit(&mut ack[SMP_DATA..SMP_DATA + SmInfo::LEN]);
                    self.master = None;
                    self.set_state(SmState::Master);
                    self.become_master();
                    self.start_sweep(now);
                    self.send(now, from_node, from, QP_SMI, Some(Want::Acknowledge), ack);
                }
                sminfo_control::ACKNOWLEDGE => {
                    // The SM this one handed over to took it (opensm's
                    // old master does nothing more either).
                    let guid = peer.map_or(Guid(0), |p| p.guid);
                    if self.handed_to == Some(guid) {
                        self.handed_to = None;
                        self.events
                            .push_back(SmEvent::HandoverAcknowledged { guid });
                    }
                }
                sminfo_control::DISABLE => {
                    self.master = None;
                    self.set_state(SmState::NotActive);
                }
                sminfo_control::DISCOVER => {
                    self.master = None;
                    self.set_state(SmState::Discovering);
                    self.start_sweep(now);
                }
                sminfo_control::STANDBY if from_node.is_some() => {
                    self.follow(now, from_node.expect("some"));
                }
                _ => status = MadStatus::from_code(StatusCode::InvalidAttrValue),
            }
        }
        let mut r = status_reply(req, status);
        let mut me = self.sm_info();
        if !keyed {
            me.sm_key = 0; // the key is shown only to who knows it
        }
        me.emit(&mut r[SMP_DATA..SMP_DATA + SmInfo::LEN]);
        if directed {
            r[4] |= 0x80;
        }
        self.tx.push_back(out(r));
    }

    /// A Trap from a port's SMA: repressed (always, so a resent one stops
    /// too) and, the first time, forwarded as a Report to subscribers.
    /// Trap 144 also updates the port's CapabilityMask the SA answers with.
    pub(super) fn sma_trap(&mut self, now: Instant, from: P, req: &MadBytes) {
        if SmpAttr::from(u16::from_be_bytes([req[16], req[17]])) != SmpAttr::Notice {
            return;
        }
        let mut r = *req;
        r[3] = u8::from(Method::TrapRepress);
        if req[1] == 0x81 {
            r[4] |= 0x80;
        }
        self.tx.push_back(Outgoing {
            to: from,
            qp: QP_SMI,
            mad: Box::new(r),
        });
        let tid = u64::from_be_bytes(req[8..16].try_into().expect("8 bytes"));
        if self.traps_seen.contains(&(from, tid)) {
            return;
        }
        if self.traps_seen.len() >= 64 {
            self.traps_seen.pop_front();
        }
        self.traps_seen.push_back((from, tid));
        self.stats.traps += 1;
        let mut full = [0u8; Notice::LEN];
        full[..64].copy_from_slice(&req[SMP_DATA..SMP_DATA + 64]);
        let Ok(mut notice) = Notice::parse(&full) else {
            return;
        };
        let node = self.nodes.iter().position(|n| n.addr == from);
        if let Some(i) = node {
            notice.issuer_gid = self.nodes[i].gid;
        }
        if notice.is_generic && notice.trap_number == TRAP_BAD_MKEY {
            self.stats.bad_mkey_traps += 1;
            let d = &notice.data_details;
            let guid = node
                .and_then(|i| self.nodes[i].info)
                .map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::BadMkey {
                guid,
                requester: u16::from_be_bytes([d[2], d[3]]),
                method: d[5],
                attr: u16::from_be_bytes([d[6], d[7]]),
            });
        }
        if notice.is_generic && notice.trap_number == TRAP_BAD_PKEY {
            self.stats.bad_pkey_traps += 1;
            let d = BadKeyTrap::parse(&notice.data_details);
            let guid_of = |n: &Node<P>| n.info.map_or(Guid(0), |x| x.port_guid);
            let guid = node.map_or(Guid(0), |i| guid_of(&self.nodes[i]));
            let from_guid = self.nodes.iter().find(|n| n.gid == d.gid1).map(guid_of);
            self.events.push_back(SmEvent::BadPkey {
                guid,
                pkey: Pkey(d.key as u16),
                from: d.gid1,
                from_guid,
                src_qp: d.qp1,
                dest_qp: d.qp2,
            });
        }
        if notice.is_generic && notice.trap_number == TRAP_CAPABILITY_MASK_CHANGE {
            let mask = u32::from_be_bytes(notice.data_details[6..10].try_into().expect("4"));
            if let Some(i) = node {
                let n = &mut self.nodes[i];
                PortInfo::new_checked(&mut n.port[..])
                    .expect("64 bytes")
                    .set_capability_mask(mask);
                let guid = n.info.map_or(Guid(0), |x| x.port_guid);
                self.events
                    .push_back(SmEvent::CapabilityChange { guid, mask });
            }
        }
        self.report(now, &notice);
    }
}
