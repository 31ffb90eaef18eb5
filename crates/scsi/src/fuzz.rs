//! Fuzz target bodies, shared by `fuzz/` (cargo-fuzz) and the deterministic
//! test that runs them on stable.

use crate::*;
use std::sync::Arc;

/// Input: byte 0 = CDB length, then the CDB, then data-out. Executes it on
/// a small thin-provisioned ram LUN. Panics only if the core misbehaves:
/// a CDB with an unknown opcode or fewer bytes than its opcode's CDB length
/// must get CHECK CONDITION, and data-in never exceeds the expected length.
pub fn cdb_execute(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 33).min(rest.len());
    let (cdb, out) = rest.split_at(n);
    let cfg = DeviceConfig {
        thin: true,
        ..Default::default()
    };
    let dev = match Device::new(cfg, Arc::new(Ram::new(64 * 512))) {
        Ok(d) => Arc::new(d),
        Err(_) => return,
    };
    let t = Target::new();
    let Ok(lun) = Lun::new(0) else {
        return;
    };
    t.add_lun(None, lun, dev);
    let nexus = Nexus::new("fuzz", "p");
    t.execute(&nexus, lun, &[0; 6], &[], 0);
    let expected = out.len().max(512) as u64;
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
}
