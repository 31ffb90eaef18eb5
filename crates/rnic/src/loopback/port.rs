//! Ports: state, LID and P_Key control with their events, and the paths
//! over them (which port a path leaves from, whether it is up, path
//! migration when it is not, IBA 17.2.8).

use super::*;

impl Fabric {
    fn port_event(
        &self,
        guid: Guid,
        port: PortNum,
        f: impl FnOnce(&mut PortAttr) -> Option<AsyncEventKind>,
    ) -> Result<(), VerbsError> {
        self.with(|st, out| {
            st.paths_changed();
            let d = st
                .devices
                .iter()
                .position(|d| d.guid == guid && !d.removed)
                .ok_or(VerbsError::NoSuchCa)?;
            let p = st.devices[d]
                .ports
                .get_mut((port.0 as usize).wrapping_sub(1))
                .ok_or_else(|| bad("no such port"))?;
            if let Some(kind) = f(p) {
                for ca in st.devices[d].opens.clone() {
                    st.event(ca, kind, 0, Some(port), out);
                }
                if kind == AsyncEventKind::PortDown {
                    // A local port failure moves armed QPs to their
                    // alternate path at once (after the PortDown event).
                    let armed: Vec<usize> = st
                        .objs
                        .iter()
                        .filter(|(_, o)| {
                            matches!(o, Obj::Qp(q) if q.dev == d && q.mig == MigState::Armed)
                        })
                        .map(|(i, _)| i)
                        .collect();
                    for qi in armed {
                        st.migrate_if_failed(qi, out);
                    }
                }
            }
            st.progress_all(out);
            Ok(())
        })
    }

    /// Brings a port up or down (raises PortActive / PortDown).
    pub fn set_port_active(
        &self,
        guid: Guid,
        port: PortNum,
        active: bool,
    ) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            let new = if active {
                PortState::Active
            } else {
                PortState::Down
            };
            (p.state != new).then(|| {
                p.state = new;
                if active {
                    AsyncEventKind::PortActive
                } else {
                    AsyncEventKind::PortDown
                }
            })
        })
    }

    /// Changes a port's LID (raises LidChange).
    pub fn set_lid(&self, guid: Guid, port: PortNum, lid: Lid) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            p.lid = lid;
            Some(AsyncEventKind::LidChange)
        })
    }

    /// Replaces a port's P_Key table (raises PkeyChange).
    pub fn set_pkeys(&self, guid: Guid, port: PortNum, pkeys: Vec<Pkey>) -> Result<(), VerbsError> {
        self.port_event(guid, port, |p| {
            p.pkeys = pkeys;
            Some(AsyncEventKind::PkeyChange)
        })
    }

    pub(super) fn query_port(&self, ca: CaHandle, port: PortNum) -> verbs::Result<PortAttr> {
        let st = self.lock();
        let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
        dev.ports
            .get((port.0 as usize).wrapping_sub(1))
            .cloned()
            .ok_or_else(|| bad(format!("no port {}", port.0)))
    }

    /// LID, master SM LID, state and P_Key table, as an SMA would set
    /// them, each with its event (a port leaving ACTIVE also migrates its
    /// armed QPs, as a pulled cable does). LMC, SM SL and alias GUIDs are
    /// refused: the fabric finds a port by its base LID or GID only.
    pub(super) fn modify_port(
        &self,
        ca: CaHandle,
        port: PortNum,
        m: &PortModify,
    ) -> verbs::Result<()> {
        m.check()?;
        if m.lmc.is_some() || m.sm_sl.is_some() || m.alias_guids.is_some() {
            return Err(VerbsError::NotSupported(
                "LMC, SM SL and alias GUIDs on the loopback fabric",
            ));
        }
        let guid = {
            let st = self.lock();
            let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
            if dev.ports.get((port.0 as usize).wrapping_sub(1)).is_none() {
                return Err(bad(format!("no port {}", port.0)));
            }
            dev.guid
        };
        if let Some(lid) = m.lid {
            self.set_lid(guid, port, lid)?;
        }
        if let Some(lid) = m.sm_lid {
            self.port_event(guid, port, |p| {
                (std::mem::replace(&mut p.sm_lid, lid) != lid).then_some(AsyncEventKind::SmChange)
            })?;
        }
        if let Some(gid) = m.sm_gid {
            self.port_event(guid, port, |p| {
                p.sm_gid = Some(gid);
                None
            })?;
        }
        if let Some(pkeys) = &m.pkeys {
            let table = pkeys.iter().copied().filter(|k| k.0 & 0x7fff != 0);
            self.set_pkeys(guid, port, table.collect())?;
        }
        if let Some(state) = m.state {
            self.port_event(guid, port, |p| {
                let was = std::mem::replace(&mut p.state, state) == PortState::Active;
                match (was, state == PortState::Active) {
                    (false, true) => Some(AsyncEventKind::PortActive),
                    (true, false) => Some(AsyncEventKind::PortDown),
                    _ => None,
                }
            })?;
        }
        Ok(())
    }
}

impl State {
    pub(super) fn device_of_port(&self, av: &AhAttr) -> Option<(usize, PortNum)> {
        for (d, dev) in self.devices.iter().enumerate() {
            if dev.removed {
                continue;
            }
            for p in &dev.ports {
                let hit = if av.grh {
                    p.gids.first() == Some(&av.dgid)
                } else {
                    p.lid == av.dlid
                };
                if hit {
                    return Some((d, p.port));
                }
            }
        }
        None
    }

    pub(super) fn port_active(&self, dev: usize, port: PortNum) -> bool {
        self.devices[dev]
            .ports
            .get((port.0 as usize).wrapping_sub(1))
            .is_some_and(|p| p.state == PortState::Active)
    }

    pub(super) fn qp_port(&self, q: &Qp) -> PortNum {
        q.init.port.or(q.attr.port).unwrap_or(PortNum(1))
    }

    /// Whether a path from local `port` of `dev` along `av` reaches an
    /// active port.
    fn path_up(&self, dev: usize, port: PortNum, av: &AhAttr) -> bool {
        self.port_active(dev, port)
            && self
                .device_of_port(av)
                .is_some_and(|(d, p)| self.port_active(d, p))
    }

    /// Makes the alternate path of `qi` its primary path (IBA 17.2.8): the
    /// QP is `Migrated` with no alternate, and its owner gets PathMigrated.
    pub(super) fn migrate(&mut self, qi: usize, out: &mut Vec<Cb>) {
        self.paths_changed();
        let q = self.qp(qi);
        let Some(alt) = q.attr.alt_path.take() else {
            return;
        };
        q.attr.av = Some(alt.av);
        q.attr.port = Some(alt.port);
        q.attr.pkey_index = Some(alt.pkey_index);
        if q.init.qp_type == QpType::Rc {
            q.attr.timeout = Some(alt.timeout);
        }
        q.mig = MigState::Migrated;
        q.attr.path_mig_state = Some(MigState::Migrated);
        let (ca, ctx) = (q.ca, q.ctx);
        self.event(ca, AsyncEventKind::PathMigrated, ctx, None, out);
    }

    /// Automatic migration of an armed QP whose primary path is down while
    /// its alternate is up (the loopback sees both ends of a path, so a
    /// failed path is known without waiting for retries to run out).
    pub(super) fn migrate_if_failed(&mut self, qi: usize, out: &mut Vec<Cb>) {
        let q = self.qpr(qi);
        if q.mig != MigState::Armed {
            return;
        }
        let (Some(av), Some(alt)) = (q.attr.av, q.attr.alt_path) else {
            return;
        };
        let (dev, port) = (q.dev, self.qp_port(q));
        if !self.path_up(dev, port, &av) && self.path_up(dev, alt.port, &alt.av) {
            self.migrate(qi, out);
        }
    }
}
