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
    let Some(t) = fuzz_target(protection) else {
        return;
    };
    let Ok(lun) = Lun::new(0) else {
        return;
    };
    let expected = out.len().max(512) as u64;
    let nexus = Nexus::new("fuzz", "p");
    // The same command, twice, through a route on a target of its own
    // (the first makes the route, the second takes it as it stands):
    // answered and stored as without one.
    let routed = fuzz_target(protection).map(|t2| {
        t2.execute(&nexus, lun, &[0; 6], &[], 0);
        let mut route = Route::default();
        let mut once = || {
            t2.route(&nexus, lun, &mut route);
            t2.submit_routed(
                &route,
                &nexus,
                lun,
                1,
                TaskAttr::Simple,
                cdb,
                out,
                expected,
                None,
            )
        };
        (once(), once(), t2)
    });
    t.execute(&nexus, lun, &[0; 6], &[], 0);
    let r = t.execute(&nexus, lun, cdb, out, expected);
    if let Some((first, second, t2)) = routed {
        assert_eq!(first, r, "{cdb:02x?} through a new route");
        let again = t.execute(&nexus, lun, cdb, out, expected);
        assert_eq!(second, again, "{cdb:02x?} through a kept route");
        let read_all = [0x28, 0, 0, 0, 0, 0, 0, 0, 64, 0];
        let a = t.execute(&nexus, lun, &read_all, &[], 64 * 512);
        let b = t2.execute(&nexus, lun, &read_all, &[], 64 * 512);
        assert_eq!(a.data_in, b.data_in, "{cdb:02x?}: the stores differ");
    }
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

/// [`cdb_execute`]'s target: a small thin-provisioned ram LUN 0 (with
/// `protection`), ports "p" (relative 1, an active/optimized group) and
/// "s" (relative 2, a standby group with a remote port too), explicit
/// ALUA.
fn fuzz_target(protection: Option<PiType>) -> Option<Target> {
    let cfg = DeviceConfig {
        thin: true,
        protection,
        ..Default::default()
    };
    let store = match protection {
        Some(_) => Ram::with_pi(64 * 512, 512),
        None => Ram::new(64 * 512),
    };
    let dev = Arc::new(Device::new(cfg, Arc::new(store)).ok()?);
    let t = Target::new();
    t.add_lun(None, Lun::new(0).ok()?, dev);
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
    Some(t)
}

/// Blocks of the image [`vcdrom_execute`] reads.
const FUZZ_DISC_BLOCKS: u64 = 8;

/// The image every [`vcdrom_execute`] run reads: made once per process in
/// the temporary directory, each byte a function of its offset.
fn fuzz_disc() -> Option<&'static std::path::Path> {
    static DISC: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DISC.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("scsi-fuzz-disc-{}.iso", std::process::id()));
        std::fs::write(&p, fuzz_disc_bytes()).ok()?;
        Some(p)
    })
    .as_deref()
}

fn fuzz_disc_bytes() -> Vec<u8> {
    (0..FUZZ_DISC_BLOCKS * crate::vcdrom::CD_BLOCK)
        .map(|i| (i as u8) ^ ((i >> 11) as u8).wrapping_mul(77))
        .collect()
}

/// Input: commands, each a byte (bits 4..0: CDB length modulo 17; bit 5:
/// eject first; bit 6: load the disc first; bit 7: expected length 64
/// bytes instead of 20 KiB), then the CDB. Executes them on a virtual
/// CD-ROM LUN over an 8-block image. Panics only if the handler
/// misbehaves: data-in never exceeds the expected length, a READ that
/// answers GOOD returns the image's bytes at its LBA, and an opcode the
/// drive does not know gets CHECK CONDITION.
pub fn vcdrom_execute(data: &[u8]) {
    let Some(disc) = fuzz_disc() else {
        return;
    };
    let Ok(cd) = VCdrom::new(Some(disc)) else {
        return;
    };
    let Ok(dev) = Device::vcdrom(DeviceConfig::default(), cd) else {
        return;
    };
    let dev = Arc::new(dev);
    let t = Target::new();
    let Ok(lun) = Lun::new(0) else {
        return;
    };
    t.add_lun(None, lun, dev.clone());
    let nexus = Nexus::new("fuzz", "p");
    t.execute(&nexus, lun, &[0; 6], &[], 0);
    let bytes = fuzz_disc_bytes();
    let mut rest = data;
    for _ in 0..64 {
        let Some((&b, after)) = rest.split_first() else {
            return;
        };
        let n = (b as usize & 0x1f) % 17;
        let (cdb, after) = after.split_at(n.min(after.len()));
        rest = after;
        if b & 0x20 != 0 {
            let _ = t.change_medium(&dev, None);
        }
        if b & 0x40 != 0 {
            let _ = t.change_medium(&dev, Some(disc));
        }
        let expected: u64 = if b & 0x80 != 0 { 64 } else { 20 << 10 };
        let r = t.execute(&nexus, lun, cdb, &[], expected);
        assert!(r.data_in.len() as u64 <= expected, "{cdb:02x?}");
        let lba = match cdb {
            [0x28, _, a, b, c, d, ..] if cdb.len() >= 10 => {
                Some(u32::from_be_bytes([*a, *b, *c, *d]) as u64)
            }
            [0xa8, _, a, b, c, d, ..] if cdb.len() >= 12 => {
                Some(u32::from_be_bytes([*a, *b, *c, *d]) as u64)
            }
            [0x88, _, rest @ ..] if cdb.len() >= 16 => {
                Some(u64::from_be_bytes(rest[..8].try_into().expect("8 bytes")))
            }
            _ => None,
        };
        if let (Some(lba), Status::Good) = (lba, r.status) {
            let at = (lba * crate::vcdrom::CD_BLOCK) as usize;
            assert!(
                bytes.get(at..at + r.data_in.len()) == Some(&r.data_in[..]),
                "READ at {lba} returned other bytes"
            );
        }
        let known = [
            0x00, 0x03, 0x12, 0x25, 0x28, 0xa8, 0x88, 0x9e, 0x43, 0x46, 0x4a, 0x1a, 0x5a, 0x1e,
            0x1b, 0x35, 0xa0, 0x5e, 0x5f, 0xa3, 0xa4,
        ];
        if cdb.first().is_some_and(|op| !known.contains(op)) {
            assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}");
        }
    }
}
