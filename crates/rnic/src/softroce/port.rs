//! Port 1 of a CA: its state, LID, SM LID and P_Key table (port control,
//! IBA 14.2.5.6 as the SMA applies it), the pulled cable, P_Key violations.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct PortStatus {
    pub(super) state: PortState,
    pub(super) lid: Lid,
    pub(super) sm_lid: Lid,
    /// Where the master SM answers (`PortModify::sm_gid`).
    pub(super) sm_gid: Option<Gid>,
    /// The P_Key table an SM set (`ib`); empty: the default partition.
    pub(super) pkeys: Vec<Pkey>,
}

/// One open of a CA: its handler and context.
pub(super) type CaOpen = (Arc<dyn EventHandler>, Context);

/// An unaffiliated event of port 1 to every open of a CA (no provider
/// lock held).
fn port_event(opens: &[CaOpen], kind: AsyncEventKind) {
    for (h, _) in opens {
        h.on_async_event(AsyncEvent {
            kind,
            ctx: 0,
            port: Some(PortNum(1)),
        });
    }
}

impl CaRt {
    /// Port 1's P_Key table as `query_port` reports it.
    pub(super) fn pkey_table(&self) -> Vec<Pkey> {
        let p = self.port.lock().unwrap_or_else(|e| e.into_inner());
        if p.pkeys.is_empty() {
            vec![Pkey::DEFAULT]
        } else {
            p.pkeys.clone()
        }
    }
}

/// The index of the entry of `table` that admits P_Key `k`: the same key
/// if the table holds it, else the first that matches (IBA 10.9.3).
pub(super) fn pkey_index_of(table: &[Pkey], k: Pkey) -> Option<u16> {
    table
        .iter()
        .position(|t| *t == k)
        .or_else(|| table.iter().position(|t| t.matches(k)))
        .map(|i| i as u16)
}

impl SoftRoce {
    /// [`Provider::modify_port`] of port 1 of open CA `guid`, for tools
    /// and tests that hold no handle of it: the port state alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_port_state(&self, guid: Guid, state: PortState) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().state(state))
    }

    /// [`Provider::modify_port`] by GUID: the master SM's LID alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_sm_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().sm_lid(lid))
    }

    /// [`Provider::modify_port`] by GUID: the P_Key table alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_pkeys(&self, guid: Guid, pkeys: &[Pkey]) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().pkeys(pkeys.to_vec()))
    }

    /// [`Provider::modify_port`] by GUID: the LID alone.
    ///
    /// # Errors
    /// As [`Provider::modify_port`]'s.
    pub fn set_lid(&self, guid: Guid, lid: Lid) -> Result<()> {
        self.modify_port_of(guid, &PortModify::new().lid(lid))
    }

    /// Port control of port 1 of open CA `guid` (see the module docs and
    /// [`Provider::modify_port`]). The LID raises `LidChange`; a new
    /// master SM LID `SmChange`. The state and P_Key table are an `ib`
    /// port's only: ACTIVE raises `PortActive`, leaving ACTIVE `PortDown`
    /// (a port error, IBA 11.6.3; the link is not touched, see
    /// [`SoftRoce::set_port_active`] for a pulled cable). A new table
    /// (empty slots, P_Key 0, left out) raises `PkeyChange`; the port
    /// checks received packets against it from then on, and each QP's key
    /// becomes the new entry at its index (QP0's stays the default: SMPs
    /// are not partitioned). LMC, master SM SL and alias GUIDs are
    /// refused: a soft RoCE port is reached by its GID, so they would
    /// route nothing (the SMA keeps them for the SM to read back).
    fn modify_port_of(&self, guid: Guid, m: &PortModify) -> Result<()> {
        m.check()?;
        if m.lmc.is_some() || m.sm_sl.is_some() || m.alias_guids.is_some() {
            return Err(VerbsError::NotSupported(
                "LMC, SM SL and alias GUIDs on soft RoCE (a port is reached by its GID)",
            ));
        }
        let (rt, opens) = self.opens(guid)?;
        if rt.personality != Personality::Ib {
            if m.state.is_some() {
                return Err(bad("only an ib port's state is set by an SM"));
            }
            if m.pkeys.is_some() {
                return Err(bad("only an ib port's P_Key table is set by an SM"));
            }
        }
        if let Some(lid) = m.lid {
            rt.port.lock().unwrap_or_else(|e| e.into_inner()).lid = lid;
            port_event(&opens, AsyncEventKind::LidChange);
        }
        if let Some(lid) = m.sm_lid {
            let old = std::mem::replace(
                &mut rt.port.lock().unwrap_or_else(|e| e.into_inner()).sm_lid,
                lid,
            );
            if old != lid {
                port_event(&opens, AsyncEventKind::SmChange);
            }
        }
        if let Some(gid) = m.sm_gid {
            rt.port.lock().unwrap_or_else(|e| e.into_inner()).sm_gid = Some(gid);
        }
        if let Some(pkeys) = &m.pkeys {
            self.replace_pkeys(&rt, pkeys);
            port_event(&opens, AsyncEventKind::PkeyChange);
        }
        if let Some(state) = m.state {
            let old = {
                let mut p = rt.port.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::replace(&mut p.state, state)
            };
            match (old == PortState::Active, state == PortState::Active) {
                (false, true) => port_event(&opens, AsyncEventKind::PortActive),
                (true, false) => port_event(&opens, AsyncEventKind::PortDown),
                _ => {}
            }
        }
        Ok(())
    }

    /// Gives `rt`'s port the P_Key table `pkeys` and every QP engine of
    /// it the key at its index.
    fn replace_pkeys(&self, rt: &Arc<CaRt>, pkeys: &[Pkey]) {
        let table: Vec<Pkey> = pkeys
            .iter()
            .copied()
            .filter(|k| k.0 & 0x7fff != 0)
            .collect();
        rt.port.lock().unwrap_or_else(|e| e.into_inner()).pkeys = table;
        let table = rt.pkey_table();
        // Under the handle table's lock, as modify_qp builds engines: one
        // built before this saw the old table and is here.
        let st = self.lock();
        let qps: Vec<(Qpn, u16)> = st
            .objs
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Qp(q)
                    if q.engine
                        && q.init.qp_type != QpType::Smi
                        && Arc::ptr_eq(&st.rt(q.ca), rt) =>
                {
                    Some((q.qpn, q.attr.pkey_index.unwrap_or(0)))
                }
                _ => None,
            })
            .collect();
        rt.node(|n| {
            n.set_pkeys(&table);
            for (qpn, ix) in qps {
                let e = n.qp_mut(softroce::QpHandle(qpn));
                if let (Some(e), Some(k)) = (e, table.get(usize::from(ix))) {
                    e.update_config(|c| c.pkey = *k);
                }
            }
        });
    }

    /// The P_Key violations port 1 of open CA `guid` counted since the
    /// last call, and the latest of them (what trap 257 reports); `None`
    /// when there were none or the CA is not open.
    pub fn take_pkey_violations(&self, guid: Guid) -> Option<(u64, PkeyViolation)> {
        let rt = self.device(guid)?;
        // The SMA asks every few tens of milliseconds: no wake-ups.
        rt.inspect(|n| n.take_pkey_violations())
    }

    /// The GUID of open CA `ca`, whose only port is `port`.
    pub(super) fn port_one(&self, ca: CaHandle, port: PortNum) -> Result<Guid> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} does not exist", port.0)));
        }
        Ok(st.rt(i).guid)
    }

    /// Takes port 1 of CA `guid` down (its link drops every datagram both
    /// ways, like a pulled cable) or brings it back, raising `PortDown` /
    /// `PortActive` to every open of the CA. The state outlives the opens:
    /// a CA nobody has open keeps it, and the next open finds it.
    ///
    /// # Errors
    /// `NoSuchCa` for a GUID this provider does not have.
    pub fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.with_slot(guid, |s| s.down = !active)?;
        let Ok((rt, opens)) = self.opens(guid) else {
            return Ok(()); // not open: the next open starts in this state
        };
        let new = match (active, rt.personality) {
            (false, _) => PortState::Down,
            (true, Personality::Roce) => PortState::Active,
            // The link trained: INIT until the SM activates it again.
            (true, Personality::Ib) => PortState::Init,
        };
        let changed = {
            let mut p = rt.port.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut p.state, new) != new
        };
        rt.node(|n| n.set_link_up(active));
        if changed && new != PortState::Init {
            let kind = if active {
                AsyncEventKind::PortActive
            } else {
                AsyncEventKind::PortDown
            };
            port_event(&opens, kind);
        }
        Ok(())
    }

    pub(super) fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        let st = self.lock();
        let i = st.ca(ca)?;
        if port.0 != 1 {
            return Err(bad(format!("port {} does not exist", port.0)));
        }
        let rt = st.rt(i);
        let ps = rt.port.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let pkeys = rt.pkey_table();
        Ok(PortAttr {
            port,
            state: ps.state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.mtu,
            lid: ps.lid,
            sm_lid: ps.sm_lid,
            sm_gid: ps.sm_gid,
            gids: vec![rt.gid],
            pkeys,
        })
    }

    pub(super) fn modify_port(
        &self,
        ca: CaHandle,
        port: PortNum,
        modify: &PortModify,
    ) -> Result<()> {
        let guid = self.port_one(ca, port)?;
        self.modify_port_of(guid, modify)
    }
}
