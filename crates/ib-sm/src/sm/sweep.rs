//! The sweep: every port read, given its LIDs (LMC ranges), its P_Key
//! table and PortInfo, brought to ACTIVE, and lost when it stops answering.

use super::*;

impl<P: Copy + Eq + std::fmt::Debug> SubnetManager<P> {
    pub(super) fn start_sweep(&mut self, now: Instant) {
        self.next_sweep = now + self.cfg.sweep_interval;
        if self.state == SmState::Master {
            self.stats.sweeps += 1;
        }
        for i in 0..self.nodes.len() {
            if !self.nodes[i].busy {
                self.nodes[i].stage = Stage::Reading;
                self.ask(
                    now,
                    i,
                    Want::NodeInfo,
                    smp(Method::Get, SmpAttr::NodeInfo, 0),
                );
            }
        }
        self.sweep_progress(now);
    }

    /// After every answer or loss: a discovering SM decides once nothing
    /// is being read; a master gives new LIDs once every port has said
    /// which it holds.
    pub(super) fn sweep_progress(&mut self, now: Instant) {
        if self.nodes.iter().any(|n| n.stage == Stage::Reading) {
            return;
        }
        match self.state {
            SmState::Discovering => self.decide(now),
            SmState::Master => {
                for i in 0..self.nodes.len() {
                    if self.nodes[i].stage != Stage::Parked {
                        continue;
                    }
                    let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
                    if !self.lid_of.contains_key(&guid) {
                        let Some(l) = self.fresh_lid() else {
                            // No LIDs left: the port waits for a sweep
                            // after one frees.
                            self.nodes[i].stage = Stage::Idle;
                            self.nodes[i].busy = false;
                            continue;
                        };
                        self.lid_of.insert(guid, l);
                    }
                    self.configure(now, i, true);
                }
            }
            _ => {}
        }
    }

    /// LIDs per port: `2^lmc`.
    pub(super) fn span(&self) -> u16 {
        1 << self.cfg.lmc.min(7)
    }

    /// The LID range of the port with this GUID (base LID and the
    /// `2^lmc - 1` above it), once assigned.
    pub fn lids(&self, guid: Guid) -> Option<std::ops::RangeInclusive<u16>> {
        let base = self.lid(guid)?;
        Some(base..=base + (self.span() - 1))
    }

    /// PortInfo:LMC of the ports this SM configures.
    pub fn lmc(&self) -> u8 {
        self.cfg.lmc.min(7)
    }

    /// True if the range of `2^lmc` LIDs from `base` is free: unicast,
    /// aligned, clear of the SM's own LID (unless `owner` is the SM's own
    /// port, swept as a node where other processes share it: the NIC
    /// daemon's) and of every range assigned.
    /// For the port `owner` keeping the LID it reported, that is all; a
    /// fresh range (`owner` `None`) must also miss every LID a port
    /// reported (it may keep it yet).
    pub(super) fn range_free(&self, base: u16, owner: Option<Guid>) -> bool {
        let span = self.span();
        let end = u32::from(base) + u32::from(span); // exclusive
        let hits =
            |b: u16, n: u16| u32::from(b) < end && u32::from(base) < u32::from(b) + u32::from(n);
        base != 0
            && base.is_multiple_of(span)
            && end <= 0xc000
            && (owner == Some(self.cfg.guid) || !hits(self.lid_now(), 1))
            && !self
                .lid_of
                .iter()
                .any(|(g, b)| Some(*g) != owner && hits(*b, span))
            && (owner.is_some()
                || !self.nodes.iter().any(|n| {
                    PortInfo::new_checked(&n.port[..])
                        .is_ok_and(|p| p.lid() != 0 && hits(p.lid(), 1 << p.lmc()))
                }))
    }

    /// The base of a LID range no port holds or reported, nor holding the
    /// SM's own LID (aligned to `2^lmc`, IBA 7.11.1); `None` when the
    /// unicast LIDs are used up.
    pub(super) fn fresh_lid(&mut self) -> Option<u16> {
        let span = u32::from(self.span());
        for _ in 0..=0xc000 / span {
            // The next aligned base from the cursor, wrapping to the
            // first (LID 0 is no LID) past the unicast LIDs.
            let l = match u32::from(self.next_lid).div_ceil(span) * span {
                l if l == 0 || l + span > 0xc000 => span,
                l => l,
            };
            self.next_lid = (l + span) as u16; // at most 0xc000
            if self.range_free(l as u16, None) {
                return Some(l as u16);
            }
        }
        None
    }

    pub(super) fn node_lost(&mut self, now: Instant, i: usize, want: Want) {
        if want == Want::Handover {
            return; // the peer stays standby; this SM stays master
        }
        if want == Want::Acknowledge {
            // Optional in IBA 14.4.1 (opensm does not send it); the old
            // master's silence is the sweeps' business.
            return;
        }
        if want == Want::PeerPoll {
            self.nodes[i].polling = false;
            self.peer_gone(i);
            return;
        }
        let keyed = PortInfo::new_checked(&self.nodes[i].port[..])
            .is_ok_and(|p| p.mkey() != 0 || p.mkey_protect() != 0);
        if keyed && matches!(want, Want::SetPortInfo | Want::SetPkeys) {
            // A keyed port answered the sweep's Gets but drops our Sets: a
            // wrong M_Key (IBA 14.2.4.1). Alive, not ours. (An unkeyed one
            // cannot refuse: it is gone.)
            self.mkey_refused(now, i);
            return;
        }
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if want == Want::Poll && self.master == Some(i) && self.state == SmState::Standby {
            // The master is gone: take over (IBA 14.4.1), keeping the LIDs
            // it gave (the sweep reads them from the ports).
            let guid = n.sm.map_or(Guid(0), |x| x.guid);
            n.sm = None;
            self.master = None;
            self.events.push_back(SmEvent::MasterLost { guid });
            self.set_state(SmState::Master);
            self.become_master();
            self.start_sweep(now);
            return;
        }
        self.peer_gone(i);
        self.sweep_progress(now);
        let n = &mut self.nodes[i];
        if n.in_service {
            n.in_service = false;
            let gid = n.gid;
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::PortDown { guid });
            self.trap(now, Notice::TRAP_GID_OUT_OF_SERVICE, gid);
        }
    }

    /// Node `i` will not take this SM's Sets for its M_Key: logged (once
    /// until it takes one), and left alone until the next sweep.
    pub(super) fn mkey_refused(&mut self, now: Instant, i: usize) {
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if !n.refused_logged {
            n.refused_logged = true;
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.stats.mkey_refused += 1;
            self.events.push_back(SmEvent::MkeyRefused { guid });
        }
        self.sweep_progress(now);
    }

    /// The P_Key table this port should have: the default partition in
    /// entry 0 (the entry QP1 sends its requests with, so they reach the
    /// SA), the port a full member if the partitions say so and a limited
    /// one otherwise (opensm's rule); then the others in the file's order.
    pub(super) fn pkeys_for(&self, port: Guid) -> [u16; 32] {
        let mut t = [0u16; 32];
        let full = |p: &Partition| p.pkey == DEFAULT_PKEY && p.membership(port) == Some(true);
        t[0] = DEFAULT_PKEY
            | if self.cfg.partitions.iter().any(full) {
                0x8000
            } else {
                0
            };
        let mut k = 1;
        for p in self
            .cfg
            .partitions
            .iter()
            .filter(|p| p.pkey != DEFAULT_PKEY)
        {
            if let Some(full) = p.membership(port) {
                if k < 32 {
                    t[k] = p.pkey | if full { 0x8000 } else { 0 };
                    k += 1;
                }
            }
        }
        t
    }

    pub(super) fn smp_answer(&mut self, now: Instant, i: usize, want: Want, mad: &MadBytes) {
        let ok = u16::from_be_bytes([mad[4], mad[5]]) & 0x7fff == 0;
        let data = &mad[SMP_DATA..SMP_DATA + 64];
        match want {
            Want::Poll => {
                // Any answer shows the master alive.
                self.nodes[i].busy = false;
                self.stats.polls += 1;
                if let Ok(info) = SmInfo::parse(&data[..SmInfo::LEN]) {
                    self.nodes[i].sm = Some(info);
                }
                return;
            }
            Want::Handover => {
                if ok && self.state == SmState::Master {
                    self.follow(now, i);
                }
                return;
            }
            // The old master took it (it answers any Set): nothing to do.
            Want::Acknowledge => return,
            Want::PeerPoll => {
                self.nodes[i].polling = false;
                if let Ok(info) = SmInfo::parse(&data[..SmInfo::LEN]) {
                    self.stats.standby_polls += 1;
                    self.peer_seen(i, info);
                }
                return;
            }
            _ => {}
        }
        if !ok {
            // The port refused: start over at the next sweep.
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
            self.sweep_progress(now);
            return;
        }
        match want {
            Want::Poll | Want::Handover | Want::PeerPoll | Want::Acknowledge => {}
            Want::SmInfo => {
                let Ok(peer) = SmInfo::parse(&data[..SmInfo::LEN]) else {
                    self.after_read(now, i);
                    return;
                };
                self.peer_seen(i, peer);
                let me = self.sm_info();
                if self.state == SmState::Master && peer.guid != me.guid && outranks(&peer, &me) {
                    if peer.sm_state == SmState::Master.code() {
                        // Two masters: the lesser yields.
                        self.nodes[i].busy = false;
                        self.nodes[i].stage = Stage::Idle;
                        self.follow(now, i);
                        return;
                    }
                    if peer.sm_state == SmState::Standby.code() {
                        // An SM that outranks this one joined: hand over.
                        let mut m = smp(Method::Set, SmpAttr::SmInfo, sminfo_control::HANDOVER);
                        me.emit(&mut m[SMP_DATA..SMP_DATA + SmInfo::LEN]);
                        self.handed_to = Some(peer.guid);
                        let to = self.nodes[i].addr;
                        self.send(now, Some(i), to, QP_SMI, Some(Want::Handover), m);
                    }
                }
                self.after_read(now, i);
            }
            Want::NodeInfo => {
                let Ok(info) = NodeInfo::parse(data) else {
                    self.nodes[i].busy = false;
                    return;
                };
                self.nodes[i].info = Some(info);
                self.ask(
                    now,
                    i,
                    Want::NodeDescription,
                    smp(Method::Get, SmpAttr::NodeDescription, 0),
                );
            }
            Want::NodeDescription => {
                self.nodes[i].desc.copy_from_slice(data);
                self.ask(
                    now,
                    i,
                    Want::PortInfo,
                    smp(Method::Get, SmpAttr::PortInfo, 0),
                );
            }
            Want::PortInfo => {
                self.nodes[i].port.copy_from_slice(data);
                let pi = PortInfo::new_checked(data).expect("64 bytes");
                let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
                if pi.mkey() != 0 && pi.mkey() != self.nodes[i].mkey {
                    // Shown (level 0, or the lease ran out): use it until
                    // our Set gives the port our key.
                    self.nodes[i].mkey = pi.mkey();
                    self.events.push_back(SmEvent::MkeyLearned { guid });
                } else if pi.mkey() == 0 && pi.mkey_protect() == 1 && self.nodes[i].mkey != 0 {
                    // Hidden from our key (level 1): a Set would only
                    // count against us.
                    self.mkey_refused(now, i);
                    return;
                }
                if pi.capability_mask() & cap::IS_SM != 0 {
                    self.ask(now, i, Want::SmInfo, smp(Method::Get, SmpAttr::SmInfo, 0));
                } else {
                    self.peer_gone(i);
                    self.after_read(now, i);
                }
            }
            Want::SetPortInfo => {
                self.nodes[i].port.copy_from_slice(data);
                // The port holds our key now.
                self.nodes[i].mkey = self.cfg.mkey;
                self.nodes[i].refused_logged = false;
                self.configure(now, i, false);
            }
            Want::SetPkeys => {
                self.nodes[i].pkeys_done = true;
                let armed = PortInfo::new_checked(&self.nodes[i].port[..])
                    .is_ok_and(|p| p.port_state() == state::ARMED);
                if armed {
                    self.configure(now, i, false);
                } else {
                    self.in_service(now, i);
                }
            }
        }
    }

    /// Configures node `i` whose PortInfo was just read (`first`) or set:
    /// its LID (the one it already has if no other port holds it: a new
    /// master keeps the old one's LIDs), the master SM LID, the state walk
    /// to ACTIVE with the P_Key table set while the port is ARMED (as
    /// opensm sets partitions before activating, so a port is never
    /// ACTIVE with a table the SM has not given it); an ACTIVE port gets
    /// its table again (partitions may have changed).
    pub(super) fn configure(&mut self, now: Instant, i: usize, first: bool) {
        if self.state != SmState::Master {
            // Mastership went elsewhere mid-sweep: leave the port alone.
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
            return;
        }
        let guid = self.nodes[i].info.map_or(Guid(0), |x| x.port_guid);
        let pi = PortInfo::new_checked(&self.nodes[i].port[..]).expect("64 bytes");
        let (reported, port_state, sm_lid) = (pi.lid(), pi.port_state(), pi.sm_lid());
        let violations = (pi.mkey_violations(), pi.pkey_violations());
        let port_lmc = pi.lmc();
        let keyed = pi.mkey() == self.cfg.mkey
            && pi.mkey_protect() == self.cfg.mkey_protect
            && pi.mkey_lease_period() == self.cfg.mkey_lease;
        let lmc = self.lmc();
        let lid = match self.lid_of.get(&guid) {
            Some(l) => *l,
            // The port's own LID is kept if its range (with our LMC) is
            // aligned and free, as opensm keeps a discovered LID.
            None if self.range_free(reported, Some(guid)) => {
                self.lid_of.insert(guid, reported);
                reported
            }
            None => {
                // A new LID once every port has said which it holds.
                self.nodes[i].stage = Stage::Parked;
                return;
            }
        };
        if first {
            self.nodes[i].pkeys_done = false;
        }
        let pkeys_done = self.nodes[i].pkeys_done;
        self.nodes[i].stage = Stage::Configuring;
        self.nodes[i].lid = lid;
        let next = match port_state {
            state::INIT => Some(state::ARMED),
            state::ARMED if !pkeys_done => None,
            state::ARMED => Some(state::ACTIVE),
            _ if reported != lid || port_lmc != lmc || sm_lid != self.lid_now() || !keyed => {
                Some(0)
            }
            _ => None,
        };
        match next {
            Some(st) if first || st != 0 => {
                let mut m = smp(Method::Set, SmpAttr::PortInfo, 0);
                let mut p =
                    PortInfo::new_checked(&mut m[SMP_DATA..SMP_DATA + 64]).expect("64 bytes");
                p.set_lid(lid);
                p.set_lmc(lmc);
                p.set_sm_lid(self.lid_now());
                p.set_subnet_timeout(18);
                p.set_port_state(st);
                p.set_mkey(self.cfg.mkey);
                p.set_mkey_protect(self.cfg.mkey_protect);
                p.set_mkey_lease_period(self.cfg.mkey_lease);
                // M_KeyViolations and P_KeyViolations are writable: keep
                // the port's counts.
                p.set_mkey_violations(violations.0);
                p.set_pkey_violations(violations.1);
                self.ask(now, i, Want::SetPortInfo, m);
            }
            _ if pkeys_done => self.in_service(now, i),
            _ => {
                let wanted = self.pkeys_for(guid);
                let mut m = smp(Method::Set, SmpAttr::PkeyTable, 0);
                for (k, v) in wanted.iter().enumerate() {
                    m[SMP_DATA + 2 * k..SMP_DATA + 2 * k + 2].copy_from_slice(&v.to_be_bytes());
                }
                self.ask(now, i, Want::SetPkeys, m);
            }
        }
    }

    /// Node `i` is configured: the sweep is done with it; a port new to
    /// service is logged and trap 64 goes to subscribers.
    pub(super) fn in_service(&mut self, now: Instant, i: usize) {
        let n = &mut self.nodes[i];
        n.busy = false;
        n.stage = Stage::Idle;
        if !n.in_service {
            n.in_service = true;
            let (gid, lid) = (n.gid, n.lid);
            let guid = n.info.map_or(Guid(0), |x| x.port_guid);
            self.events.push_back(SmEvent::PortUp { guid, lid });
            self.trap(now, Notice::TRAP_GID_IN_SERVICE, gid);
        }
    }

    /// A node's port is read: a master configures it, a discovering or
    /// standby SM only looks.
    pub(super) fn after_read(&mut self, now: Instant, i: usize) {
        if self.state == SmState::Master {
            self.configure(now, i, true);
        } else {
            self.nodes[i].busy = false;
            self.nodes[i].stage = Stage::Idle;
        }
        self.sweep_progress(now);
    }
}
