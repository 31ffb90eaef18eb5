//! LUN maps (SCST's masking model): the default set, security groups and
//! their initiator patterns, relative port IDs, and the unit attentions a
//! change raises.

use super::*;

pub(super) type LunSet = BTreeMap<Lun, Arc<Device>>;

/// One group of [`LunMaps`].
#[derive(Clone)]
pub struct GroupMap {
    pub name: String,
    /// Initiator name patterns that belong to the group.
    pub initiators: Vec<String>,
    pub luns: Vec<(Lun, Arc<Device>)>,
}

/// What [`Target::lun_maps`] returns.
#[derive(Clone)]
pub struct LunMaps {
    pub default: Vec<(Lun, Arc<Device>)>,
    pub groups: Vec<GroupMap>,
    /// Target ports with a default set of their own, by port name.
    pub ports: Vec<PortMap>,
}

/// A target port's own default set in [`LunMaps`].
#[derive(Clone)]
pub struct PortMap {
    pub port: String,
    pub luns: Vec<(Lun, Arc<Device>)>,
}

/// Initiator name matching: exact, or by prefix when `pattern` ends in `*`
/// (SCST accepts wildcards in group initiator names).
pub(super) fn initiator_matches(pattern: &str, initiator: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => initiator.starts_with(prefix),
        None => pattern == initiator,
    }
}

#[derive(Default)]
pub(super) struct State {
    /// The target's default LUN set.
    pub(super) default: LunSet,
    /// Named groups, each replacing the default set for its initiators
    /// (SCST security groups). A group named after an initiator with no
    /// explicit membership applies to that initiator.
    pub(super) groups: HashMap<String, LunSet>,
    /// Initiator name patterns -> group name, in the order added; the
    /// first match wins. A pattern ending in `*` matches by prefix.
    pub(super) members: Vec<(String, String)>,
    /// Target ports whose initiators outside every group see a default
    /// set of the port's own instead of the target's (SCST's LUNs per
    /// target), by port name.
    pub(super) port_sets: HashMap<String, LunSet>,
    pub(super) ua: FastMap<(Nexus, Lun), UaQueue>,
    /// (nexus, LUN) pairs that have seen their power-on unit attention.
    pub(super) known: FastSet<(Nexus, Lun)>,
    /// Relative target port identifiers (SPC-4 3.1.120) by target port
    /// name, numbered from 1 as ports are first seen.
    pub(super) ports: BTreeMap<String, u16>,
    /// Target port groups and their asymmetric access states.
    pub(super) alua: crate::alua::Alua,
}

impl State {
    /// The relative target port identifier of `port`, assigned now if new.
    pub(super) fn port_id(&mut self, port: &str) -> u16 {
        if let Some(&id) = self.ports.get(port) {
            return id;
        }
        // 0 is reserved; the last identifier is reused past 65535 ports.
        let id = (self.ports.len() + 1).min(0xffff) as u16;
        self.ports.insert(port.to_string(), id);
        id
    }

    /// The group `initiator` belongs to, if any.
    pub(super) fn group_of<'a>(&'a self, initiator: &'a str) -> Option<&'a str> {
        self.members
            .iter()
            .find(|(pat, _)| initiator_matches(pat, initiator))
            .map(|(_, g)| g.as_str())
            .or_else(|| {
                // Asked on every command: no hashing of the name when
                // there are no groups.
                (!self.groups.is_empty() && self.groups.contains_key(initiator))
                    .then_some(initiator)
            })
    }

    /// The LUNs `initiator` sees through target port `port`: its
    /// group's, else the port's own default set, else the target's.
    pub(super) fn set_for(&self, initiator: &str, port: &str) -> &LunSet {
        static EMPTY: LunSet = BTreeMap::new();
        match self.group_of(initiator) {
            Some(g) => self.groups.get(g).unwrap_or(&EMPTY),
            None if self.port_sets.is_empty() => &self.default,
            None => self.port_sets.get(port).unwrap_or(&self.default),
        }
    }

    /// Raises REPORTED LUNS DATA HAS CHANGED on every known nexus that
    /// `which` accepts (it sees the maps as they are now).
    fn inventory_changed(&mut self, which: impl Fn(&State, &Nexus) -> bool) {
        let affected: Vec<(Nexus, Lun)> = self
            .known
            .iter()
            .filter(|(n, _)| which(self, n))
            .cloned()
            .collect();
        for key in affected {
            self.ua
                .entry(key)
                .or_default()
                .push(Asc::REPORTED_LUNS_DATA_CHANGED);
        }
    }

    /// [`State::inventory_changed`] for the initiators `which` accepts.
    pub(super) fn luns_changed_for(&mut self, which: impl Fn(&str) -> bool) {
        self.inventory_changed(|_, n| which(&n.initiator));
    }

    /// [`State::inventory_changed`] for the nexuses through `port` of
    /// initiators outside every group.
    pub(super) fn port_luns_changed(&mut self, port: &str) {
        self.inventory_changed(|st, n| {
            &*n.target_port == port && st.group_of(&n.initiator).is_none()
        });
    }

    pub(super) fn ua_mut(&mut self, nexus: &Nexus, lun: Lun) -> &mut UaQueue {
        // `ua` holds a queue for every known nexus and LUN (nothing takes
        // one out): one search finds it, or makes it at first sight.
        match self.ua.entry((nexus.clone(), lun)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                self.known.insert(v.key().clone());
                let q = v.insert(UaQueue::default());
                q.push(Asc::POWER_ON_RESET);
                q
            }
        }
    }

    /// [`State::inventory_changed`] for the initiators whose visible set
    /// changed (`None`: those using the target's default set, through a
    /// port without a set of its own).
    pub(super) fn luns_changed(&mut self, group: Option<&str>) {
        self.inventory_changed(|st, n| {
            let g = st.group_of(&n.initiator);
            g == group && (g.is_some() || !st.port_sets.contains_key(&*n.target_port))
        });
    }
}

impl Target {
    /// Maps `dev` at `lun` in the default set (`group: None`) or in the
    /// group of initiator name `group`; returns the device it replaced.
    pub fn add_lun(&self, group: Option<&str>, lun: Lun, dev: Arc<Device>) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = match group {
            Some(g) => st.groups.entry(g.to_string()).or_default().insert(lun, dev),
            None => st.default.insert(lun, dev),
        };
        st.luns_changed(group);
        old
    }

    pub fn remove_lun(&self, group: Option<&str>, lun: Lun) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = match group {
            Some(g) => st.groups.get_mut(g).and_then(|s| s.remove(&lun)),
            None => st.default.remove(&lun),
        };
        if old.is_some() {
            st.luns_changed(group);
        }
        old
    }

    /// Maps `dev` at `lun` in target port `port`'s own default set, which
    /// from then on replaces the target's default set for the initiators
    /// outside every group that come through that port (SCST's LUNs of
    /// one target). Returns the device it replaces.
    pub fn add_port_lun(&self, port: &str, lun: Lun, dev: Arc<Device>) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = st
            .port_sets
            .entry(port.to_string())
            .or_default()
            .insert(lun, dev);
        st.port_luns_changed(port);
        old
    }

    /// Unmaps `lun` from port `port`'s own set (which stays, perhaps
    /// empty, in place of the target's default set).
    pub fn remove_port_lun(&self, port: &str, lun: Lun) -> Option<Arc<Device>> {
        let mut st = self.lock();
        let old = st.port_sets.get_mut(port).and_then(|s| s.remove(&lun));
        if old.is_some() {
            st.port_luns_changed(port);
        }
        old
    }

    /// Creates an empty LUN group (no effect if it exists).
    pub fn add_group(&self, group: &str) {
        self.lock().groups.entry(group.to_string()).or_default();
    }

    /// Removes a group with its LUNs and memberships; its initiators fall
    /// back to the default set. Returns false if there was no such group.
    pub fn remove_group(&self, group: &str) -> bool {
        let mut st = self.lock();
        let existed = st.groups.remove(group).is_some();
        let before = st.members.len();
        let patterns: Vec<String> = st
            .members
            .iter()
            .filter(|(_, g)| g == group)
            .map(|(p, _)| p.clone())
            .collect();
        st.members.retain(|(_, g)| g != group);
        let removed_members = st.members.len() != before;
        if existed || removed_members {
            st.luns_changed_for(|i| i == group || patterns.iter().any(|p| initiator_matches(p, i)));
        }
        existed || removed_members
    }

    /// Adds initiator name `pattern` (a trailing `*` matches by prefix) to
    /// `group`, creating the group if needed. An initiator matching
    /// patterns of several groups belongs to the first added.
    pub fn add_initiator(&self, group: &str, pattern: &str) {
        let mut st = self.lock();
        st.groups.entry(group.to_string()).or_default();
        if !st.members.iter().any(|(p, g)| p == pattern && g == group) {
            st.members.push((pattern.to_string(), group.to_string()));
        }
        st.luns_changed_for(|i| initiator_matches(pattern, i));
    }

    /// Removes initiator `pattern` from `group`; false if it was not there.
    pub fn remove_initiator(&self, group: &str, pattern: &str) -> bool {
        let mut st = self.lock();
        let before = st.members.len();
        st.members.retain(|(p, g)| !(p == pattern && g == group));
        let removed = st.members.len() != before;
        if removed {
            st.luns_changed_for(|i| initiator_matches(pattern, i));
        }
        removed
    }

    /// A snapshot of the LUN maps: the default set, then each group with
    /// its initiator patterns.
    pub fn lun_maps(&self) -> LunMaps {
        let st = self.lock_to_read();
        let luns = |set: &LunSet| set.iter().map(|(l, d)| (*l, d.clone())).collect();
        let mut groups: Vec<GroupMap> = st
            .groups
            .iter()
            .map(|(name, set)| GroupMap {
                name: name.clone(),
                initiators: st
                    .members
                    .iter()
                    .filter(|(_, g)| g == name)
                    .map(|(p, _)| p.clone())
                    .collect(),
                luns: luns(set),
            })
            .collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        let mut ports: Vec<PortMap> = st
            .port_sets
            .iter()
            .map(|(p, set)| PortMap {
                port: p.clone(),
                luns: luns(set),
            })
            .collect();
        ports.sort_by(|a, b| a.port.cmp(&b.port));
        LunMaps {
            default: luns(&st.default),
            groups,
            ports,
        }
    }

    /// The relative target port identifier of target port `name` (SPC-4
    /// 3.1.120): what PERSISTENT RESERVE OUT REGISTER AND MOVE names a
    /// port by and READ FULL STATUS reports. Assigned from 1 in the order
    /// ports are first seen (by a command or by this call).
    pub fn relative_port_id(&self, name: &str) -> u16 {
        self.lock().port_id(name)
    }

    /// Gives target port `name` relative port identifier `id` (SCST's
    /// `rel_tgt_id`; 0 is reserved and refused), before its first command.
    /// Identifiers numbered later do not avoid it: set every port's or none.
    pub fn set_relative_port_id(&self, name: &str, id: u16) -> Result<(), &'static str> {
        if id == 0 {
            return Err("relative port identifier 0 is reserved");
        }
        self.lock().ports.insert(name.to_string(), id);
        Ok(())
    }

    /// The LUNs `initiator` sees through target port `port`, as REPORT
    /// LUNS would list them.
    pub fn visible_luns(&self, initiator: &str, port: &str) -> Vec<Lun> {
        self.lock_to_read()
            .set_for(initiator, port)
            .keys()
            .copied()
            .collect()
    }

    /// Resizes the device mapped at `lun` (in `group` or the default set) to
    /// `blocks` and raises CAPACITY DATA HAS CHANGED on every known nexus
    /// that reaches that device through any LUN (SBC-3 4.6).
    pub fn resize(&self, group: Option<&str>, lun: Lun, blocks: u64) -> std::io::Result<()> {
        let st = self.lock();
        let set = match group {
            Some(g) => st.groups.get(g),
            None => Some(&st.default),
        };
        let dev = set
            .and_then(|s| s.get(&lun))
            .cloned()
            .ok_or(std::io::ErrorKind::NotFound)?;
        dev.resize(blocks)?;
        drop(st);
        self.raise_where(&dev, Asc::CAPACITY_DATA_CHANGED, |_| true);
        Ok(())
    }

    /// Changes the medium of the virtual CD-ROM `dev` (see
    /// [`crate::vcdrom`]): the image at `image`, or none (eject), and
    /// raises NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED on every
    /// known nexus that reaches it (MMC-6 4.1.6.2), as a drive does when
    /// its tray closes on another disc.
    ///
    /// # Errors
    /// The image cannot be the medium (the drive keeps what it had), or
    /// `dev` is not a virtual CD-ROM ([`crate::vcdrom::ImageError::NotCdrom`]).
    pub fn change_medium(
        &self,
        dev: &Arc<Device>,
        image: Option<&std::path::Path>,
    ) -> Result<(), crate::vcdrom::ImageError> {
        let cd = dev
            .vcdrom_handler()
            .ok_or(crate::vcdrom::ImageError::NotCdrom)?;
        match image {
            Some(p) => cd.load(p)?,
            None => {
                cd.eject();
            }
        }
        self.raise_where(dev, Asc::NOT_READY_TO_READY_CHANGE, |_| true);
        Ok(())
    }

    /// Queues `asc` for every known nexus accepted by `which` that reaches
    /// `dev` through any LUN.
    pub(super) fn raise_where(&self, dev: &Arc<Device>, asc: Asc, which: impl Fn(&Nexus) -> bool) {
        let st = &mut *self.lock();
        let affected: Vec<(Nexus, Lun)> = st
            .known
            .iter()
            .filter(|(n, l)| {
                which(n)
                    && st
                        .set_for(&n.initiator, &n.target_port)
                        .get(l)
                        .is_some_and(|d| Arc::ptr_eq(d, dev))
            })
            .cloned()
            .collect();
        for key in affected {
            st.ua.entry(key).or_default().push(asc);
        }
    }
}
