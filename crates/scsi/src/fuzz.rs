//! Fuzz target bodies, shared by `fuzz/` (cargo-fuzz) and the deterministic
//! test that runs them on stable.

use crate::*;
use std::sync::Arc;

/// Input: byte 0 = CDB length (bits 5..0, modulo 33) and protection
/// information (bits 7..6: none, type 1, type 2, type 3), then the
/// CDB, then data-out. Executes it on a small thin-provisioned ram LUN,
/// through a port of an active/optimized target port group and then
/// through one of a standby group (explicit ALUA, so SET TARGET PORT
/// GROUPS parses the data-out and may swap them);
/// the data-out is also parsed as a TransportID. Panics only if the core
/// misbehaves:
/// a CDB with an unknown opcode or fewer bytes than its opcode's CDB length
/// must get CHECK CONDITION, and data-in never exceeds the expected length.
pub fn cdb_execute(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let protection = match n >> 6 {
        0 => None,
        1 => Some(PiType::Type1),
        2 => Some(PiType::Type2),
        _ => Some(PiType::Type3),
    };
    let n = ((n & 0x3f) as usize % 33).min(rest.len());
    let (cdb, out) = rest.split_at(n);
    // The data-out read as REPORT TARGET PORT GROUPS data, as an
    // initiator reads a target's.
    if let Ok((groups, _)) = crate::alua::parse_report(out) {
        assert!(groups.iter().map(|g| 8 + 4 * g.ports.len()).sum::<usize>() <= out.len());
    }
    if let Ok((id, used)) = TransportId::parse(out) {
        assert!(used <= out.len());
        let name = id.initiator_name();
        let back = TransportId::from_initiator_name(&name);
        assert!(back.is_some_and(|b| b.initiator_name() == name), "{name}");
    }
    let cfg = DeviceConfig {
        thin: true,
        protection,
        ..Default::default()
    };
    let store = match protection {
        Some(_) => Ram::with_pi(64 * 512, 512),
        None => Ram::new(64 * 512),
    };
    let dev = match Device::new(cfg, Arc::new(store)) {
        Ok(d) => Arc::new(d),
        Err(_) => return,
    };
    let t = Target::new();
    let Ok(lun) = Lun::new(0) else {
        return;
    };
    t.add_lun(None, lun, dev);
    // "p" is relative port 1, "s" 2; group 2 also holds a remote port.
    let _ = t.set_relative_port_id("p", 1);
    let _ = t.set_relative_port_id("s", 2);
    let group = |id, state, ports: &[u16]| PortGroup {
        id,
        state,
        preferred: false,
        ports: ports.to_vec(),
        status: Default::default(),
    };
    t.set_alua(Alua {
        groups: vec![
            group(1, AccessState::ActiveOptimized, &[1]),
            group(2, AccessState::Standby, &[2, 7]),
        ],
        explicit: true,
        transition_secs: 0,
    });
    let expected = out.len().max(512) as u64;
    let nexus = Nexus::new("fuzz", "p");
    t.execute(&nexus, lun, &[0; 6], &[], 0);
    let r = t.execute(&nexus, lun, cdb, out, expected);
    let op = Opcode::from(cdb.first().copied().unwrap_or(0));
    let malformed = match op.cdb_len() {
        None => true,
        Some(l) => cdb.len() < l,
    };
    if malformed {
        assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}");
    }
    assert!(r.data_in.len() as u64 <= expected);
    if let Some(s) = r.sense {
        assert!(s.to_fixed().len() == 18 && s.to_descriptor().len() <= 252);
    }
    // The same through the standby port (after the first: an ACA the
    // first command set makes this one's answer ACA ACTIVE or BUSY).
    let standby = Nexus::new("fuzz", "s");
    t.execute(&standby, lun, &[0; 6], &[], 0);
    let r = t.execute(&standby, lun, cdb, out, expected);
    assert!(r.data_in.len() as u64 <= expected);
}
