//! The verbs conformance suite against the rdma-core provider on the
//! devices of this machine: the two named by `RDMACORE_TEST_DEVICES`
//! (`rxe1,rxe2`; one name: both CAs are that device, its QPs talking
//! through its loopback), else the first two with port 1 ACTIVE (or the
//! one there is, twice).
//!
//! `cargo test` leaves this binary out (`test = false`); run by hand on a
//! machine without an rdma-core device (CI's: its kernel has no RDMA) it
//! skips every case with the reason; the interop scenario
//! `rdmacore-conformance-ours` runs this binary in a VM with two Linux rxe
//! devices on a veth pair.
//!
//! What the fixture declares missing: QP0/QP1 (the kernel's), APM (not
//! served yet), port control (a test cannot pull a kernel device's cable
//! or set its LID), memory windows, atomics or SRQs when the device says
//! it has none, and per driver what it is known to lack (rxe: the SQE
//! state; a UC send error takes its QP to ERR).

mod common;

use rdma_types::{Guid, Lid, PortNum};
use rdmacore::RdmaCore;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use verbs::conformance::{Feature, Fixture};
use verbs::{IgnoreEvents, PortState, Provider, VerbsError};

/// What every case of the run shares.
#[derive(Clone)]
struct Devices {
    p: Arc<RdmaCore>,
    guids: (Guid, Guid),
    lacks: Vec<Feature>,
}

impl Fixture for Devices {
    fn provider(&self) -> Arc<dyn Provider> {
        self.p.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _guid: Guid, _active: bool) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control of a kernel device"))
    }
    fn set_lid(&self, _guid: Guid, _lid: Lid) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control of a kernel device"))
    }
    fn remove_ca(&self, _guid: Guid) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control of a kernel device"))
    }
    fn lacks(&self) -> Vec<Feature> {
        self.lacks.clone()
    }
}

/// Gaps of a driver found by running the suite on it, by device name
/// prefix.
const KNOWN_GAPS: &[(&str, &[Feature])] = &[("rxe", &[Feature::Sqe])];

/// Whether port 1 of `guid` is ACTIVE.
fn active(p: &RdmaCore, guid: Guid) -> bool {
    let Ok(ca) = p.open_ca(guid, 0, Arc::new(IgnoreEvents)) else {
        return false;
    };
    let up = p
        .query_port(ca, PortNum(1))
        .is_ok_and(|a| a.state == PortState::Active);
    let _ = p.close_ca(ca);
    up
}

fn setup() -> Result<Devices, String> {
    let p = RdmaCore::new().map_err(|e| e.to_string())?;
    let names: Vec<String> = match std::env::var("RDMACORE_TEST_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
        _ => {
            let devs = p.devices().map_err(|e| e.to_string())?;
            let up: Vec<String> = devs
                .into_iter()
                .filter(|d| active(&p, d.guid))
                .map(|d| d.name)
                .take(2)
                .collect();
            if up.is_empty() {
                return Err(format!(
                    "no RDMA device with an ACTIVE port (libibverbs at {})",
                    p.library()
                ));
            }
            up
        }
    };
    let (a, b) = match names.as_slice() {
        [a] => (a, a),
        [a, b] => (a, b),
        _ => {
            return Err(format!(
                "RDMACORE_TEST_DEVICES names {} devices, not 1 or 2",
                names.len()
            ))
        }
    };
    let guids = (
        p.guid_of(a).map_err(|e| e.to_string())?,
        p.guid_of(b).map_err(|e| e.to_string())?,
    );
    let ca = p
        .open_ca(guids.0, 0, Arc::new(IgnoreEvents))
        .map_err(|e| format!("open {a}: {e}"))?;
    let attr = p.query_ca(ca).map_err(|e| format!("query {a}: {e}"));
    let _ = p.close_ca(ca);
    let attr = attr?;
    // GSI QPs are made (through the kernel's user MAD interface), but
    // carry only MADs the kernel lets a user agent send: no raw QP1 sends.
    let mut lacks = vec![Feature::RawGsi, Feature::PortControl, Feature::Apm];
    if attr.max_mw == 0 {
        lacks.push(Feature::Mw);
    }
    if !attr.atomics {
        lacks.push(Feature::Atomics);
    }
    if attr.max_srq == 0 {
        lacks.push(Feature::Srq);
    }
    for (prefix, gaps) in KNOWN_GAPS {
        if a.starts_with(prefix) {
            lacks.extend_from_slice(gaps);
        }
    }
    let mut out = std::io::stderr().lock();
    let _ = writeln!(
        out,
        "rdmacore conformance: {a} ({:?}) and {b} ({:?}), max_mw {}, max_inline_data {}, \
         declared gaps {lacks:?}",
        guids.0, guids.1, attr.max_mw, attr.max_inline_data
    );
    Ok(Devices { p, guids, lacks })
}

/// The devices, found once per run; `None` (the case returns) when this
/// machine has none, which is recorded as the case's skip.
fn fixture() -> Option<Devices> {
    static DEVICES: OnceLock<Result<Devices, String>> = OnceLock::new();
    match DEVICES.get_or_init(setup) {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            common::not_here("an rdma-core device", why);
            None
        }
    }
}

verbs::conformance_tests!(match fixture() {
    Some(f) => f,
    None => return,
});
