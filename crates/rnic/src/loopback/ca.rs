//! CAs attached to the fabric, opened, closed and removed; PDs.

use super::*;

impl Fabric {
    /// Attaches a CA to the fabric.
    pub fn add_ca(&self, cfg: CaConfig) -> Result<(), VerbsError> {
        let mut st = self.lock();
        if st.devices.iter().any(|d| d.guid == cfg.guid && !d.removed) {
            return Err(VerbsError::Busy("a CA with this GUID is attached"));
        }
        let ports = cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| PortAttr {
                port: PortNum(i as u8 + 1),
                state: if p.active {
                    PortState::Active
                } else {
                    PortState::Down
                },
                max_mtu: Mtu::Mtu4096,
                active_mtu: p.mtu,
                lid: p.lid,
                sm_lid: Lid(1),
                sm_gid: None,
                gids: vec![p.gid],
                pkeys: p.pkeys.clone(),
            })
            .collect();
        st.paths_changed();
        st.devices.push(Device {
            guid: cfg.guid,
            ports,
            keys: KeyTable::new(),
            qpns: IdMap::default(),
            next_qpn: 2,
            opens: vec![],
            removed: false,
        });
        Ok(())
    }

    /// Detaches a CA (raises CaRemoval to its owners; it cannot be opened
    /// again).
    pub fn remove_ca(&self, guid: Guid) -> Result<(), VerbsError> {
        self.with(|st, out| {
            let d = st
                .devices
                .iter()
                .position(|d| d.guid == guid && !d.removed)
                .ok_or(VerbsError::NoSuchCa)?;
            st.devices[d].removed = true;
            st.paths_changed();
            for ca in st.devices[d].opens.clone() {
                let ctx = match st.obj(ca) {
                    Obj::Ca { ctx, .. } => *ctx,
                    _ => 0,
                };
                st.event(ca, AsyncEventKind::CaRemoval, ctx, None, out);
            }
            Ok(())
        })
    }

    pub(super) fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> verbs::Result<CaHandle> {
        let mut st = self.lock();
        let d = st
            .devices
            .iter()
            .position(|d| d.guid == guid && !d.removed)
            .ok_or(VerbsError::NoSuchCa)?;
        let h = st.alloc(Obj::Ca {
            dev: d,
            handler,
            ctx,
            children: 0,
        });
        st.devices[d].opens.push(h.index as usize);
        Ok(CaHandle(h))
    }

    pub(super) fn query_ca(&self, ca: CaHandle) -> verbs::Result<CaAttr> {
        let st = self.lock();
        let dev = &st.devices[st.ca_dev(st.ca(ca)?)];
        Ok(CaAttr {
            guid: dev.guid,
            num_ports: dev.ports.len() as u8,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: MAX_CQE,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_srq: 1 << 16,
            max_mw: 1 << 16,
            max_inline_data: 0,
            atomics: !self.lacks(verbs::Feature::Atomics),
        })
    }

    pub(super) fn close_ca(&self, ca: CaHandle) -> verbs::Result<()> {
        self.destroy_simple(ca.0, ResourceKind::Ca)
    }

    pub(super) fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> verbs::Result<PdHandle> {
        let mut st = self.lock();
        let c = st.ca(ca)?;
        st.adjust_children(c, 1);
        Ok(PdHandle(st.alloc(Obj::Pd {
            ca: c,
            ctx,
            children: 0,
        })))
    }

    pub(super) fn dealloc_pd(&self, pd: PdHandle) -> verbs::Result<()> {
        self.destroy_simple(pd.0, ResourceKind::Pd)
    }
}
