//! What `ibstat` and `ibv_devinfo` show of a CA: its GUIDs and limits,
//! and per port the state, LIDs, capability mask, MTUs, GIDs, P_Keys and
//! alias GUIDs. [`query`] reads what the verbs interface knows; a port
//! whose SMA runs in this process (the `ib` personality) adds what only
//! the SMA knows with [`PortView::from_sma`] (ARMED, LMC, the SM-assigned
//! GUIDs, the capability mask the SM reads). [`CaInfo::human`] prints the
//! ibstat layout, [`json`] a machine-readable form of the same fields.

use crate::sma::state;
use crate::sma_agent::SmaAgent;
use rdma_mad::smp::cap_names;
use rdma_types::{Gid, Guid, Mtu, Pkey, PortNum};
use std::fmt::Write as _;
use verbs::{CaAttr, CaHandle, PortState, Provider, VerbsError};

/// One CA as the tools list it.
#[derive(Debug, Clone)]
pub struct CaInfo {
    /// Name shown (the tools use the personality and address).
    pub name: String,
    /// "InfiniBand" for an `ib` port, "Ethernet" for RoCE.
    pub link_layer: &'static str,
    /// The CA's attributes (GUID and limits).
    pub attr: CaAttr,
    /// Its ports, from 1.
    pub ports: Vec<PortView>,
}

/// One port as the tools list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortView {
    /// Port number.
    pub port: PortNum,
    /// PortInfo:PortState (see [`state`]).
    pub state: u8,
    /// Base LID.
    pub lid: u16,
    /// LMC.
    pub lmc: u8,
    /// The master SM's LID.
    pub sm_lid: u16,
    /// PortInfo:CapabilityMask.
    pub capability_mask: u32,
    /// GUIDInfo: entry 0 is the port GUID, later ones aliases (0: unset).
    pub guids: Vec<Guid>,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// GID table.
    pub gids: Vec<Gid>,
    /// P_Key table.
    pub pkeys: Vec<Pkey>,
}

impl PortView {
    /// The port as its SMA (in this process) sees it, over `self`: the
    /// state with ARMED, the LMC, the capability mask and GUID table.
    pub fn from_sma(mut self, sma: &SmaAgent) -> PortView {
        self.state = sma.port_state();
        self.lid = sma.lid();
        self.lmc = sma.lmc();
        self.sm_lid = sma.sm_lid();
        self.capability_mask = sma.capability_mask();
        self.guids = sma.guids().to_vec();
        self
    }
}

/// Reads CA `ca` (open on `p`) and its ports through the verbs
/// interface. Verbs has no capability mask: `capability_mask` is what the
/// caller's stack offers on the port (see [`PortView::from_sma`] for a
/// port with an SMA); the GUID table is the port GUID alone.
///
/// # Errors
/// The provider refused a query.
pub fn query(
    p: &dyn Provider,
    ca: CaHandle,
    name: &str,
    link_layer: &'static str,
    capability_mask: u32,
) -> Result<CaInfo, VerbsError> {
    let attr = p.query_ca(ca)?;
    let ports = (1..=attr.num_ports.max(1))
        .map(|n| {
            let a = p.query_port(ca, PortNum(n))?;
            Ok(PortView {
                port: a.port,
                state: match a.state {
                    PortState::Down => state::DOWN,
                    PortState::Init => state::INIT,
                    PortState::Active => state::ACTIVE,
                },
                lid: a.lid.0,
                lmc: 0,
                sm_lid: a.sm_lid.0,
                capability_mask,
                guids: vec![attr.guid],
                active_mtu: a.active_mtu,
                max_mtu: a.max_mtu,
                gids: a.gids,
                pkeys: a.pkeys,
            })
        })
        .collect::<Result<Vec<_>, VerbsError>>()?;
    Ok(CaInfo {
        name: name.to_string(),
        link_layer,
        attr,
        ports,
    })
}

/// PortInfo:PortState in ibstat's words.
pub fn state_name(s: u8) -> &'static str {
    match s {
        state::DOWN => "Down",
        state::INIT => "Initializing",
        state::ARMED => "Armed",
        state::ACTIVE => "Active",
        _ => "Unknown",
    }
}

fn phys_state(s: u8) -> &'static str {
    if s == state::DOWN {
        "Polling"
    } else {
        "LinkUp"
    }
}

impl CaInfo {
    /// The ibstat layout (one tab per level).
    pub fn human(&self) -> String {
        let a = &self.attr;
        let mut o = String::new();
        let _ = writeln!(o, "CA '{}'", self.name);
        let _ = writeln!(o, "\tCA type: soft RoCE");
        let _ = writeln!(o, "\tNumber of ports: {}", self.ports.len());
        let _ = writeln!(o, "\tNode GUID: 0x{:016x}", a.guid.0);
        let _ = writeln!(o, "\tSystem image GUID: 0x{:016x}", a.guid.0);
        let _ = writeln!(
            o,
            "\tLimits: max_qp {} max_qp_wr {} max_sge {} max_cq {} max_cqe {} max_mr {} max_pd {} max_srq {} max_mw {} max_inline_data {} max_qp_rd_atom {} atomics {}",
            a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_mr, a.max_pd,
            a.max_srq, a.max_mw, a.max_inline_data, a.max_qp_rd_atom,
            if a.atomics { "yes" } else { "no" }
        );
        for p in &self.ports {
            let _ = writeln!(o, "\tPort {}:", p.port.0);
            let _ = writeln!(o, "\t\tState: {}", state_name(p.state));
            let _ = writeln!(o, "\t\tPhysical state: {}", phys_state(p.state));
            let _ = writeln!(o, "\t\tBase lid: {}", p.lid);
            let _ = writeln!(o, "\t\tLMC: {}", p.lmc);
            let _ = writeln!(o, "\t\tSM lid: {}", p.sm_lid);
            let _ = writeln!(
                o,
                "\t\tCapability mask: 0x{:08x} ({})",
                p.capability_mask,
                cap_names(p.capability_mask).join(", ")
            );
            let port_guid = p.guids.first().copied().unwrap_or(a.guid);
            let _ = writeln!(o, "\t\tPort GUID: 0x{:016x}", port_guid.0);
            for (i, g) in p.guids.iter().enumerate().skip(1) {
                if g.0 != 0 {
                    let _ = writeln!(o, "\t\tAlias GUID[{i}]: 0x{:016x}", g.0);
                }
            }
            let _ = writeln!(o, "\t\tLink layer: {}", self.link_layer);
            let _ = writeln!(o, "\t\tActive MTU: {}", p.active_mtu);
            let _ = writeln!(o, "\t\tMax MTU: {}", p.max_mtu);
            for (i, g) in p.gids.iter().enumerate() {
                let _ = writeln!(o, "\t\tGID[{i}]: {g}");
            }
            for (i, k) in p.pkeys.iter().enumerate() {
                let _ = writeln!(o, "\t\tP_Key[{i}]: 0x{:04x}", k.0);
            }
        }
        o
    }

    fn json_into(&self, o: &mut String) {
        let a = &self.attr;
        let _ = write!(
            o,
            "{{\"name\":{},\"link_layer\":{},\"node_guid\":\"0x{:016x}\",\"sys_image_guid\":\"0x{:016x}\",\"num_ports\":{}",
            json_str(&self.name),
            json_str(self.link_layer),
            a.guid.0,
            a.guid.0,
            self.ports.len()
        );
        let _ = write!(
            o,
            ",\"limits\":{{\"max_qp\":{},\"max_qp_wr\":{},\"max_sge\":{},\"max_cq\":{},\"max_cqe\":{},\"max_mr\":{},\"max_pd\":{},\"max_srq\":{},\"max_mw\":{},\"max_inline_data\":{},\"max_qp_rd_atom\":{},\"atomics\":{}}}",
            a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_mr, a.max_pd,
            a.max_srq, a.max_mw, a.max_inline_data, a.max_qp_rd_atom, a.atomics
        );
        o.push_str(",\"ports\":[");
        for (n, p) in self.ports.iter().enumerate() {
            if n > 0 {
                o.push(',');
            }
            let list = |items: Vec<String>| items.join(",");
            let _ = write!(
                o,
                "{{\"port\":{},\"state\":{},\"phys_state\":{},\"lid\":{},\"lmc\":{},\"sm_lid\":{},\"capability_mask\":\"0x{:08x}\",\"capabilities\":[{}],\"port_guid\":\"0x{:016x}\",\"guids\":[{}],\"active_mtu\":{},\"max_mtu\":{},\"gids\":[{}],\"pkeys\":[{}]}}",
                p.port.0,
                json_str(state_name(p.state)),
                json_str(phys_state(p.state)),
                p.lid,
                p.lmc,
                p.sm_lid,
                p.capability_mask,
                list(cap_names(p.capability_mask).into_iter().map(json_str).collect()),
                p.guids.first().copied().unwrap_or(a.guid).0,
                list(p.guids.iter().map(|g| format!("\"0x{:016x}\"", g.0)).collect()),
                p.active_mtu.bytes(),
                p.max_mtu.bytes(),
                list(p.gids.iter().map(|g| json_str(&g.to_string())).collect()),
                list(p.pkeys.iter().map(|k| format!("\"0x{:04x}\"", k.0)).collect()),
            );
        }
        o.push_str("]}");
    }
}

/// `{"cas":[...]}` with every field of [`CaInfo::human`].
pub fn json(cas: &[CaInfo]) -> String {
    let mut o = String::from("{\"cas\":[");
    for (i, c) in cas.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        c.json_into(&mut o);
    }
    o.push_str("]}");
    o
}

/// A JSON string literal of `s`.
fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", u32::from(c));
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic::loopback::{CaConfig, Fabric};
    use std::sync::Arc;

    struct Quiet;
    impl verbs::EventHandler for Quiet {
        fn on_completion(&self, _: u64) {}
        fn on_async_event(&self, _: verbs::AsyncEvent) {}
    }

    #[test]
    fn a_loopback_ca_is_listed_in_both_forms() {
        let f = Fabric::new();
        f.add_ca(CaConfig::simple(0x1234, 5)).unwrap();
        let ca = f.open_ca(Guid(0x1234), 0, Arc::new(Quiet)).unwrap();
        let port = f.query_port(ca, PortNum(1)).unwrap();
        let mut info = query(f.as_ref(), ca, "lo \"a\"", "InfiniBand", 1 << 16).unwrap();
        assert_eq!(info.attr.guid, Guid(0x1234));
        assert_eq!(info.ports.len(), 1);
        let p = &info.ports[0];
        assert_eq!((p.lid, p.state), (port.lid.0, state::ACTIVE));
        assert_eq!((&p.gids, &p.pkeys), (&port.gids, &port.pkeys));
        info.ports[0].guids.push(Guid(0xa1a5));
        let h = info.human();
        assert!(h.contains("\tNode GUID: 0x0000000000001234\n"), "{h}");
        assert!(h.contains("\t\tState: Active\n"), "{h}");
        assert!(
            h.contains(&format!("\t\tBase lid: {}\n", port.lid.0)),
            "{h}"
        );
        assert!(
            h.contains("Capability mask: 0x00010000 (IsCommunicationManagementSupported)"),
            "{h}"
        );
        assert!(h.contains("\t\tAlias GUID[1]: 0x000000000000a1a5\n"), "{h}");
        assert!(
            h.contains(&format!("\t\tGID[0]: {}\n", port.gids[0])),
            "{h}"
        );
        assert!(h.contains("\t\tP_Key[0]: 0xffff\n"), "{h}");
        let j = json(&[info]);
        assert!(j.starts_with("{\"cas\":[{\"name\":\"lo \\\"a\\\"\""), "{j}");
        assert!(j.contains("\"state\":\"Active\""), "{j}");
        assert!(
            j.contains("\"guids\":[\"0x0000000000001234\",\"0x000000000000a1a5\"]"),
            "{j}"
        );
        assert!(j.contains("\"pkeys\":[\"0xffff\"]"), "{j}");
        assert!(j.ends_with("}]}]}"), "{j}");
        f.close_ca(ca).unwrap();
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
