//! Changes to a running daemon: a reloaded configuration, devices and LUNs
//! added, removed and resized, each applied to the running configuration
//! too.

use super::*;

impl Daemon {
    /// Applies `next` to the running target: new devices are opened, LUN
    /// maps, groups and their initiators change to what `next` says (unit
    /// attentions and SRP_AER_REQ as for `srptadm` changes), `enabled` is
    /// followed. Sessions stay up. A mapped ram device whose `size` alone
    /// grew is resized in place, as `srptadm resize` does (CAPACITY DATA
    /// HAS CHANGED and an SRP_AER_REQ to whoever sees it); a vcdrom device
    /// whose `filename` alone changed gets the new disc, as `srptadm
    /// change-medium` gives it (28/00 to whoever sees it). Refused as a
    /// whole, with nothing changed, when a device that stays mapped
    /// changed its definition otherwise or shrank; target parameters that
    /// need a restart are kept and named.
    pub fn reload(&self, next: Config) -> Result<Value, AdminError> {
        use std::collections::{BTreeMap, BTreeSet};
        let mut cfg = lock(&self.cfg);
        let text = |d: &DeviceSection| toml::to_string(d).unwrap_or_default();
        // What follows DRBD is fixed at start (its poller and stores).
        let drbd = |c: &Config| {
            let devs: Vec<String> = c
                .devices
                .iter()
                .filter(|d| d.drbd_minor.is_some())
                .map(text)
                .collect();
            let follows: Vec<(u16, Option<String>)> = c
                .target_groups
                .iter()
                .map(|g| {
                    (
                        *g.group_id.get_ref(),
                        g.follow.as_ref().map(|f| f.get_ref().clone()),
                    )
                })
                .collect();
            (c.drbd.clone(), devs, follows)
        };
        if drbd(&cfg) != drbd(&next) {
            return Err(AdminError::DrbdNeedsRestart(
                "[drbd], a device with drbd_minor or a target group's follow".into(),
            ));
        }
        let old_devs: BTreeMap<String, String> = cfg
            .devices
            .iter()
            .map(|d| (d.name.get_ref().clone(), text(d)))
            .collect();
        let maps = |c: &Config| -> BTreeMap<Option<String>, BTreeMap<u32, String>> {
            let set = |ls: &[LunEntry]| {
                ls.iter()
                    .map(|l| (*l.lun.get_ref(), l.device.get_ref().clone()))
                    .collect::<BTreeMap<_, _>>()
            };
            let mut m = BTreeMap::new();
            m.insert(None, set(&c.luns));
            for g in &c.groups {
                m.insert(Some(g.name.get_ref().clone()), set(&g.luns));
            }
            m
        };
        let (old_maps, new_maps) = (maps(&cfg), maps(&next));
        // A changed device must not be mapped before or after.
        let mut changed = Vec::new();
        for d in &next.devices {
            let name = d.name.get_ref();
            if old_devs.get(name).is_some_and(|t| *t != text(d)) {
                changed.push(name.clone());
            }
        }
        let mapped = |m: &BTreeMap<Option<String>, BTreeMap<u32, String>>, dev: &str| {
            m.values().any(|s| s.values().any(|d| d == dev))
        };
        // Mapped ram devices that only grew: resized below, not rebuilt.
        let mut grown: Vec<(String, u64)> = Vec::new();
        // vcdrom devices whose image alone changed: their disc is changed
        // below (as `srptadm change-medium` does), not rebuilt.
        let mut discs: Vec<(String, Option<std::path::PathBuf>)> = Vec::new();
        changed.retain(|name| {
            let find = |c: &Config| c.devices.iter().find(|d| d.name.get_ref() == name).cloned();
            let (Some(old), Some(new)) = (find(&cfg), find(&next)) else {
                return true;
            };
            if *new.handler.get_ref() == Handler::VCdrom {
                let mut same = new.clone();
                same.filename = old.filename.clone();
                if text(&same) == text(&old) {
                    discs.push((name.clone(), new.filename.map(|f| f.get_ref().clone())));
                    return false;
                }
            }
            let mut same = new.clone();
            same.size = old.size.clone();
            let bytes = new
                .size
                .as_ref()
                .and_then(|s| crate::config::parse_size(s.get_ref()).ok());
            match bytes {
                Some(b)
                    if text(&same) == text(&old)
                        && *new.handler.get_ref() == Handler::Ram
                        && mapped(&new_maps, name) =>
                {
                    grown.push((name.clone(), b));
                    false
                }
                _ => true,
            }
        });
        for (name, bytes) in &grown {
            let dev = lock(&self.devices)
                .get(name)
                .cloned()
                .ok_or_else(|| AdminError::NoDevice(name.clone()))?;
            let bs = u64::from(dev.block_size());
            let was = dev.blocks() * bs;
            if *bytes == 0 || bytes % bs != 0 {
                return Err(AdminError::NotBlockMultiple {
                    device: name.clone(),
                    bytes: *bytes,
                    block_size: bs,
                });
            }
            if *bytes < was {
                return Err(AdminError::Shrink {
                    device: name.clone(),
                    was,
                    bytes: *bytes,
                });
            }
        }
        if let Some(d) = changed
            .iter()
            .find(|d| mapped(&old_maps, d) || mapped(&new_maps, d))
        {
            return Err(AdminError::ChangedWhileMapped(d.clone()));
        }
        // Every new disc must open before anything changes.
        for (name, image) in &discs {
            scsi::VCdrom::new(image.as_deref()).map_err(|source| AdminError::Medium {
                device: name.clone(),
                source,
            })?;
        }
        // Open new and changed devices before touching any map.
        let (mut opened, mut created) = (BTreeMap::new(), Vec::new());
        for (i, d) in next.devices.iter().enumerate() {
            let name = d.name.get_ref();
            if !old_devs.contains_key(name) || changed.contains(name) {
                let (device, made) = build_device(d).map_err(|e| device_error(&next, i, e))?;
                created.extend(made);
                opened.insert(name.clone(), device);
            }
        }
        created.into_iter().for_each(CreatedFile::keep);
        let mut devices = lock(&self.devices);
        devices.extend(opened);
        let mut lun_changes = 0;
        // Unmap what goes or changes, then map what comes.
        for (group, old) in &old_maps {
            let new = new_maps.get(group);
            for (n, dev) in old {
                if new.and_then(|m| m.get(n)) != Some(dev) {
                    self.scsi.remove_lun(group.as_deref(), lun(*n)?);
                    lun_changes += 1;
                }
            }
        }
        let old_groups: BTreeSet<&String> = cfg.groups.iter().map(|g| g.name.get_ref()).collect();
        let new_groups: BTreeSet<&String> = next.groups.iter().map(|g| g.name.get_ref()).collect();
        for g in old_groups.difference(&new_groups) {
            self.scsi.remove_group(g);
            lun_changes += 1;
        }
        for g in &next.groups {
            let name = g.name.get_ref();
            self.scsi.add_group(name);
            let old_inits: Vec<String> = cfg
                .groups
                .iter()
                .find(|o| o.name.get_ref() == name)
                .map(|o| o.initiators.iter().map(|i| i.get_ref().clone()).collect())
                .unwrap_or_default();
            let new_inits: Vec<String> = g.initiators.iter().map(|i| i.get_ref().clone()).collect();
            for i in old_inits.iter().filter(|i| !new_inits.contains(i)) {
                self.scsi.remove_initiator(name, i);
                lun_changes += 1;
            }
            for i in new_inits.iter().filter(|i| !old_inits.contains(i)) {
                self.scsi.add_initiator(name, i);
                lun_changes += 1;
            }
        }
        for (group, new) in &new_maps {
            let old = old_maps.get(group);
            for (n, dev) in new {
                if old.and_then(|m| m.get(n)) != Some(dev) {
                    let d = devices
                        .get(dev)
                        .cloned()
                        .ok_or_else(|| AdminError::NoDevice(dev.clone()))?;
                    self.scsi.add_lun(group.as_deref(), lun(*n)?, d);
                    lun_changes += 1;
                }
            }
        }
        let kept: BTreeSet<String> = next
            .devices
            .iter()
            .map(|d| d.name.get_ref().clone())
            .collect();
        devices.retain(|name, _| kept.contains(name));
        // New discs in vcdrom drives (checked above; a file that changed
        // since is refused here, the drive keeping its disc).
        let mut media = Vec::new();
        for (name, image) in &discs {
            let Some(dev) = devices.get(name).cloned() else {
                continue;
            };
            self.scsi
                .change_medium(&dev, image.as_deref())
                .map_err(|source| AdminError::Medium {
                    device: name.clone(),
                    source,
                })?;
            media.push(json!({
                "device": name,
                "image": image.as_ref().map(|p| p.display().to_string()),
            }));
        }
        // Grown devices, through a LUN that maps them now.
        let mut resized = Vec::new();
        let mut capacity_told = 0;
        for (name, bytes) in &grown {
            let Some(dev) = devices.get(name).cloned() else {
                continue;
            };
            let bs = u64::from(dev.block_size());
            let was = dev.blocks() * bs;
            if *bytes == was {
                continue;
            }
            let at = new_maps
                .iter()
                .find_map(|(g, m)| m.iter().find(|(_, d)| *d == name).map(|(n, _)| (g, *n)));
            if let Some((group, n)) = at {
                self.scsi
                    .resize(group.as_deref(), lun(n)?, bytes / bs)
                    .map_err(|source| AdminError::Resize {
                        device: name.clone(),
                        source,
                    })?;
                capacity_told += self
                    .targets
                    .iter()
                    .map(|t| t.port().capacity_changed(&dev))
                    .sum::<usize>();
                resized.push(json!({ "device": name, "size": bytes, "was": was }));
            }
        }
        drop(devices);
        // Target parameters: only `enabled` changes live, per target; a
        // target added or removed needs a restart.
        let mut restart = Vec::new();
        let key = |s: &crate::config::TargetSection| {
            toml::to_string(&{
                let mut s = s.clone();
                s.enabled = true;
                s
            })
            .unwrap_or_default()
        };
        if cfg.targets.len() != next.targets.len() {
            restart.push(format!(
                "{} targets instead of {}",
                next.targets.len(),
                cfg.targets.len()
            ));
        }
        let mut applied = next;
        let mut enabled = Vec::new();
        let new_targets = std::mem::take(&mut applied.targets);
        applied.targets = cfg.targets.clone();
        for (i, (t, rt)) in new_targets.iter().zip(&self.targets).enumerate() {
            if key(&applied.targets[i]) != key(t) {
                restart.push(format!(
                    "{} parameters other than enabled",
                    applied.target_key(i)
                ));
            }
            if t.enabled != rt.port().enabled() {
                rt.port().set_enabled(t.enabled);
            }
            applied.targets[i].enabled = t.enabled;
            enabled.push(t.enabled);
        }
        // Target port groups: the file's states and members (a state
        // `srptadm set-group-state` gave and the file does not say is
        // lost, as any runtime edit not written with write-config).
        let mut alua = applied.alua();
        let now = self.scsi.alua();
        for g in &mut alua.groups {
            if self.group_follows(g.id).is_some() {
                if let Some(n) = now.groups.iter().find(|n| n.id == g.id) {
                    g.state = n.state;
                }
            }
        }
        let alua_changed = self.scsi.set_alua(alua);
        *cfg = applied;
        drop(cfg);
        let told = if lun_changes > 0 {
            self.luns_changed()
        } else {
            0
        };
        Ok(json!({
            "lun_map_changes": lun_changes,
            "resized": resized,
            "media_changed": media,
            "aer_sent": told + capacity_told,
            // One target: its state, as before several were possible.
            "enabled": if enabled.len() == 1 { json!(enabled[0]) } else { json!(enabled) },
            "needs_restart": restart,
            "alua_changed": alua_changed,
        }))
    }

    /// Runs `f` on a copy of the configuration; keeps the copy if `f`
    /// succeeds (it applies the change to the running target itself).
    pub(super) fn edit(
        &self,
        f: impl FnOnce(&mut Config) -> Result<Value, AdminError>,
    ) -> Result<Value, AdminError> {
        let mut cfg = lock(&self.cfg);
        let mut next = cfg.clone();
        let v = f(&mut next)?;
        *cfg = next;
        Ok(v)
    }

    pub(super) fn add_device(&self, text: &str) -> Result<Value, AdminError> {
        let d: DeviceSection = toml::from_str(text).map_err(AdminError::DeviceToml)?;
        let name = d.name.get_ref().clone();
        if d.drbd_minor.is_some() {
            return Err(AdminError::DrbdNeedsRestart(format!(
                "device `{name}` with drbd_minor"
            )));
        }
        let mut cfg = lock(&self.cfg);
        let mut next = cfg.clone();
        next.devices.push(d.clone());
        next.check().map_err(AdminError::Invalid)?;
        // The table came in the request, not from the file: no line.
        let (dev, made) =
            build_device(&d).map_err(|(_, key, message)| AdminError::Device { key, message })?;
        made.into_iter().for_each(CreatedFile::keep);
        let size = dev.blocks() * u64::from(dev.block_size());
        lock(&self.devices).insert(name.clone(), dev);
        *cfg = next;
        Ok(json!({ "added": name, "size": size }))
    }

    pub(super) fn remove_device(&self, name: &str) -> Result<Value, AdminError> {
        self.edit(|c| {
            let i = c
                .devices
                .iter()
                .position(|d| d.name.get_ref() == name)
                .ok_or_else(|| AdminError::NoDevice(name.to_string()))?;
            let used = |ls: &[LunEntry]| {
                ls.iter()
                    .find(|l| l.device.get_ref() == name)
                    .map(|l| *l.lun.get_ref())
            };
            if let Some(l) = used(&c.luns) {
                return Err(AdminError::MappedAtDefault {
                    device: name.to_string(),
                    lun: l,
                });
            }
            for g in &c.groups {
                if let Some(l) = used(&g.luns) {
                    return Err(AdminError::MappedInGroup {
                        device: name.to_string(),
                        lun: l,
                        group: g.name.get_ref().clone(),
                    });
                }
            }
            c.devices.remove(i);
            lock(&self.devices).remove(name);
            Ok(json!({ "removed": name }))
        })
    }

    /// Grows device `name` to `size`. Shrinking is refused: SCST allows
    /// it, but blocks past the new end would be lost while initiators may
    /// still hold them in use (file systems, partition tables); remove the
    /// LUN and map a smaller device instead. The device must be mapped:
    /// the SCSI core resizes through a LUN, raising the unit attention on
    /// every nexus that reaches the device by any LUN.
    pub(super) fn resize(&self, name: &str, size: &str) -> Result<Value, AdminError> {
        self.edit(|c| {
            let bytes = crate::config::parse_size(size)?;
            let d = c
                .devices
                .iter_mut()
                .find(|d| d.name.get_ref() == name)
                .ok_or_else(|| AdminError::NoDevice(name.to_string()))?;
            let handler = *d.handler.get_ref();
            let dev = lock(&self.devices)
                .get(name)
                .cloned()
                .ok_or_else(|| AdminError::NoDevice(name.to_string()))?;
            let bs = u64::from(dev.block_size());
            let was = dev.blocks() * bs;
            if bytes == 0 || bytes % bs != 0 {
                return Err(AdminError::NotBlockMultiple {
                    device: name.to_string(),
                    bytes,
                    block_size: bs,
                });
            }
            if bytes < was {
                return Err(AdminError::Shrink {
                    device: name.to_string(),
                    was,
                    bytes,
                });
            }
            if bytes == was {
                return Ok(json!({ "device": name, "size": bytes, "was": was, "aer_sent": 0 }));
            }
            if handler != Handler::Ram {
                return Err(AdminError::NotResizable {
                    device: name.to_string(),
                    handler: handler.name(),
                });
            }
            let mapped = c
                .luns
                .iter()
                .map(|l| (None, l))
                .chain(
                    c.groups
                        .iter()
                        .flat_map(|g| g.luns.iter().map(move |l| (Some(g.name.get_ref()), l))),
                )
                .find(|(_, l)| l.device.get_ref() == name)
                .map(|(g, l)| (g.cloned(), *l.lun.get_ref()));
            let Some((group, n)) = mapped else {
                return Err(AdminError::NotMapped(name.to_string()));
            };
            self.scsi
                .resize(group.as_deref(), lun(n)?, bytes / bs)
                .map_err(|source| AdminError::Resize {
                    device: name.to_string(),
                    source,
                })?;
            d.size = Some(spanned(size.trim().to_string()));
            let told: usize = self
                .targets
                .iter()
                .map(|t| t.port().capacity_changed(&dev))
                .sum();
            Ok(json!({ "device": name, "size": bytes, "was": was, "aer_sent": told }))
        })
    }

    /// Puts `image` (none: no disc) in the vcdrom device `name`; the
    /// running configuration's `filename` follows.
    pub(super) fn change_medium(
        &self,
        name: &str,
        image: Option<std::path::PathBuf>,
    ) -> Result<Value, AdminError> {
        self.edit(|c| {
            let d = c
                .devices
                .iter_mut()
                .find(|d| d.name.get_ref() == name)
                .ok_or_else(|| AdminError::NoDevice(name.to_string()))?;
            let handler = *d.handler.get_ref();
            if handler != Handler::VCdrom {
                return Err(AdminError::NoMedium {
                    device: name.to_string(),
                    handler: handler.name(),
                });
            }
            let dev = lock(&self.devices)
                .get(name)
                .cloned()
                .ok_or_else(|| AdminError::NoDevice(name.to_string()))?;
            self.scsi
                .change_medium(&dev, image.as_deref())
                .map_err(|source| AdminError::Medium {
                    device: name.to_string(),
                    source,
                })?;
            let cd = dev.vcdrom_handler();
            let loaded = cd.and_then(|c| c.image());
            let size = cd.map_or(0, |c| c.blocks() * scsi::vcdrom::CD_BLOCK);
            d.filename = image.map(spanned);
            Ok(json!({
                "device": name,
                "image": loaded.map(|p| p.display().to_string()),
                "size": size,
            }))
        })
    }

    pub(super) fn add_lun(
        &self,
        group: Option<String>,
        n: u32,
        device: String,
    ) -> Result<Value, AdminError> {
        self.edit(|c| {
            let l = lun(n)?;
            let entry = LunEntry {
                lun: spanned(n),
                device: spanned(device.clone()),
            };
            match &group {
                Some(g) => group_mut(c, g)?.luns.push(entry),
                None => c.luns.push(entry),
            }
            c.check().map_err(AdminError::Invalid)?;
            let dev = lock(&self.devices)
                .get(&device)
                .cloned()
                .ok_or_else(|| AdminError::NoDevice(device.clone()))?;
            let size = dev.blocks() * u64::from(dev.block_size());
            self.scsi.add_lun(group.as_deref(), l, dev);
            let told = self.luns_changed();
            Ok(json!({ "group": group, "lun": n, "device": device, "size": size, "aer_sent": told }))
        })
    }

    pub(super) fn remove_lun(&self, group: Option<String>, n: u32) -> Result<Value, AdminError> {
        self.edit(|c| {
            let l = lun(n)?;
            let luns = match &group {
                Some(g) => &mut group_mut(c, g)?.luns,
                None => &mut c.luns,
            };
            let i =
                luns.iter()
                    .position(|e| *e.lun.get_ref() == n)
                    .ok_or_else(|| match &group {
                        Some(g) => AdminError::NoLunInGroup {
                            group: g.clone(),
                            lun: n,
                        },
                        None => AdminError::NoDefaultLun(n),
                    })?;
            let gone = luns.remove(i);
            self.scsi.remove_lun(group.as_deref(), l);
            let told = self.luns_changed();
            Ok(json!({
                "group": group,
                "removed_lun": n,
                "device": gone.device.get_ref(),
                "aer_sent": told
            }))
        })
    }
}

pub(super) fn group_mut<'a>(
    c: &'a mut Config,
    name: &str,
) -> Result<&'a mut GroupSection, AdminError> {
    c.groups
        .iter_mut()
        .find(|g| g.name.get_ref() == name)
        .ok_or_else(|| AdminError::NoGroup(name.to_string()))
}
