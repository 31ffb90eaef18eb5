//! Device management (IBA 16.3): the agent an I/O unit answers discovery
//! with, and the queries an initiator discovers I/O controllers by, as
//! `srp_daemon` walks them: IOUnitInfo, then the IOControllerProfile of
//! each slot that holds a controller, then its ServiceEntries.
//!
//! The answering side is sans-IO ([`IoUnit::answer`]: a request MAD in, the
//! response MAD out) with a thin driver ([`DmService`]) on a port's QP1. An
//! upper-layer client (the SRP target) registers its controller with
//! [`DmService::register_ioc`] and the slot is freed when the returned
//! handle drops. Requests the agent does not serve get a status: an
//! unknown attribute "method/attribute combination unsupported", a slot
//! without a controller or an entry range past its end "invalid attribute
//! value".
//!
//! DM MADs carry 40 reserved bytes after the common header; attribute data
//! starts at byte 64.

use crate::agent::{CmAgent, CmError, MadAgent, MadAgentCloser, MadWait};
use crate::gsi::{status_reply, MadBytes};
use rdma_mad::dm::{
    emit_service_entries, parse_service_entries, ClassPortInfo, DmAttr, IoUnitInfo, IocProfile,
    ServiceEntry, DM_CLASS_VERSION,
};
use rdma_mad::mad::{MadHeaderRepr, MadStatus, Method, MgmtClass, StatusCode, MAD_SIZE};
use rdma_types::{Gid, Guid};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where DM attribute data starts in the MAD.
pub const DM_DATA: usize = 64;
/// Slots an I/O unit offers.
pub const MAX_SLOTS: u8 = 16;
/// Service entries one MAD carries.
const ENTRIES_PER_MAD: usize = 4;

/// An I/O controller: its profile and services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ioc {
    /// IOControllerProfile (its `service_entries` count is set from `services`).
    pub profile: IocProfile,
    /// ServiceEntries.
    pub services: Vec<ServiceEntry>,
}

/// What an SRP I/O controller profile advertises of the target's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IocLimits {
    /// Receive queue depth (srpt_srq_size).
    pub send_queue_depth: u16,
    /// Largest request IU (srp_max_req_size).
    pub send_size: u32,
    /// Largest RDMA transfer (srp_max_rdma_size).
    pub rdma_size: u32,
}

impl Default for IocLimits {
    /// ib_srpt's defaults: 128 receives of 4148 bytes, 64 KiB RDMA.
    fn default() -> IocLimits {
        IocLimits {
            send_queue_depth: 128,
            send_size: 4148,
            rdma_size: 65536,
        }
    }
}

impl Ioc {
    /// The I/O controller of an SRP target port, filled in as Linux
    /// ib_srpt fills it: the port GUID as IOC GUID and service ID, I/O
    /// class 0x0100 (SRP r16a), subclass 0x609e, protocol 0x0108, and one
    /// service entry `SRP.T10:<id_ext>` (id_ext = the GUID).
    pub fn srp(guid: Guid, limits: &IocLimits, name: &str) -> Ioc {
        let mut id_string = [0u8; 64];
        let n = name.len().min(64);
        id_string[..n].copy_from_slice(&name.as_bytes()[..n]);
        Ioc {
            profile: IocProfile {
                guid,
                vendor_id: 0x0002c9,
                device_id: 0x0000_1000,
                device_version: 1,
                subsys_vendor_id: 0x0002c9,
                subsys_device_id: 0x0000_1000,
                io_class: rdma_mad::dm::IO_CLASS_SRP,
                io_subclass: 0x609e,
                protocol: 0x0108,
                protocol_version: 0x0001,
                send_queue_depth: limits.send_queue_depth,
                rdma_read_depth: 4,
                send_size: limits.send_size,
                rdma_size: limits.rdma_size,
                // Send and RDMA read/write, both directions (ib_srpt's mask).
                cap_mask: 0x33,
                service_entries: 1,
                id_string,
            },
            services: vec![ServiceEntry::srp(guid.0, guid.0)],
        }
    }
}

/// The controllers of an I/O unit, by slot (sans-IO).
#[derive(Debug, Default)]
pub struct IoUnit {
    slots: Vec<Option<Ioc>>,
    change_id: u16,
}

impl IoUnit {
    /// An I/O unit with no controllers.
    pub fn new() -> IoUnit {
        IoUnit {
            slots: vec![None; MAX_SLOTS as usize],
            change_id: 0,
        }
    }

    /// Puts `ioc` in the first free slot (1-based); `None` if all are taken.
    pub fn add(&mut self, mut ioc: Ioc) -> Option<u8> {
        ioc.services.truncate(255);
        ioc.profile.service_entries = ioc.services.len() as u8;
        let i = self.slots.iter().position(Option::is_none)?;
        self.slots[i] = Some(ioc);
        self.change_id = self.change_id.wrapping_add(1);
        Some(i as u8 + 1)
    }

    /// Empties 1-based `slot`.
    pub fn remove(&mut self, slot: u8) {
        if let Some(s) = slot
            .checked_sub(1)
            .and_then(|i| self.slots.get_mut(i as usize))
        {
            if s.take().is_some() {
                self.change_id = self.change_id.wrapping_add(1);
            }
        }
    }

    /// The IOUnitInfo attribute now.
    pub fn unit_info(&self) -> IoUnitInfo {
        let mut list = [0u8; 128];
        for (i, s) in self.slots.iter().enumerate() {
            if s.is_some() {
                // 4 bits per slot, slot 1 in the high nibble; 1 = present.
                list[i / 2] |= if i % 2 == 0 { 0x10 } else { 0x01 };
            }
        }
        IoUnitInfo {
            change_id: self.change_id,
            max_controllers: MAX_SLOTS,
            diag_rom: 0,
            controller_list: list,
        }
    }

    /// The response to DM request `req`.
    pub fn answer(&self, req: &MadBytes) -> MadBytes {
        let status = |code| status_reply(req, MadStatus::from_code(code));
        if Method::from(req[3]) != Method::Get {
            return status(StatusCode::MethodUnsupported);
        }
        let attr = DmAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let modifier = u32::from_be_bytes(req[20..24].try_into().expect("4 bytes"));
        let mut r = status_reply(req, MadStatus::OK);
        let data = &mut r[DM_DATA..];
        match attr {
            DmAttr::ClassPortInfo => {
                let Ok(mut c) = ClassPortInfo::parse(&[0u8; 72]) else {
                    return status(StatusCode::MethodAttrUnsupported);
                };
                c.base_version = 1;
                c.class_version = DM_CLASS_VERSION;
                c.resp_time_value = 18;
                c.emit(data);
            }
            DmAttr::IoUnitInfo => self.unit_info().emit(data),
            DmAttr::IoControllerProfile => match self.slot(modifier) {
                Some(ioc) => ioc.profile.emit(data),
                None => return status(StatusCode::InvalidAttrValue),
            },
            DmAttr::ServiceEntries => {
                // Slot in bits 31-16, last entry in 15-8, first in 7-0.
                let (first, last) = (
                    (modifier & 0xFF) as usize,
                    ((modifier >> 8) & 0xFF) as usize,
                );
                let Some(ioc) = self.slot(modifier >> 16) else {
                    return status(StatusCode::InvalidAttrValue);
                };
                if first > last || last >= ioc.services.len() || last - first >= ENTRIES_PER_MAD {
                    return status(StatusCode::InvalidAttrValue);
                }
                emit_service_entries(&ioc.services[first..=last], data);
            }
            _ => return status(StatusCode::MethodAttrUnsupported),
        }
        r
    }

    fn slot(&self, slot: u32) -> Option<&Ioc> {
        let i = usize::try_from(slot).ok()?.checked_sub(1)?;
        self.slots.get(i)?.as_ref()
    }
}

/// A DM Get request for `attr` with `modifier` (transaction ID filled in
/// when sent).
pub fn get_request(attr: DmAttr, modifier: u32) -> MadBytes {
    let mut m = [0u8; MAD_SIZE];
    MadHeaderRepr {
        attr_mod: modifier,
        ..MadHeaderRepr::new(
            MgmtClass::DevMgt,
            DM_CLASS_VERSION,
            Method::Get,
            0,
            attr.into(),
        )
    }
    .emit(&mut m);
    m
}

/// The DM agent of a port: answers discovery for the controllers
/// registered with it, on its own thread, until dropped.
pub struct DmService {
    unit: Arc<Mutex<IoUnit>>,
    /// Wakes the serving thread for good (drop).
    closer: MadAgentCloser,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A registered controller; its slot empties when this drops.
pub struct IocHandle {
    unit: Arc<Mutex<IoUnit>>,
    slot: u8,
}

impl IocHandle {
    /// The controller's 1-based slot.
    pub fn slot(&self) -> u8 {
        self.slot
    }
}

impl Drop for IocHandle {
    fn drop(&mut self) {
        self.unit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(self.slot);
    }
}

impl DmService {
    /// Registers the DM class (Get) on `port` and starts answering.
    ///
    /// # Errors
    /// Another agent already serves DM Get on the port.
    pub fn start(port: &CmAgent) -> Result<DmService, CmError> {
        let agent = port.mad_agent(
            u8::from(MgmtClass::DevMgt),
            DM_CLASS_VERSION,
            &[u8::from(Method::Get), u8::from(Method::Set)],
        )?;
        let unit = Arc::new(Mutex::new(IoUnit::new()));
        let closer = agent.closer();
        let u = unit.clone();
        let thread = std::thread::Builder::new()
            .name("dm-agent".into())
            .spawn(move || serve(agent, u))
            .map_err(|e| CmError::Mad(format!("start the DM thread: {e}")))?;
        Ok(DmService {
            unit,
            closer,
            thread: Some(thread),
        })
    }

    /// True while the serving thread runs: until the service drops or its
    /// CA is removed.
    pub fn is_serving(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Offers `ioc` in the next free slot.
    ///
    /// # Errors
    /// Every slot is taken.
    pub fn register_ioc(&self, ioc: Ioc) -> Result<IocHandle, CmError> {
        let slot = self
            .unit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(ioc)
            .ok_or_else(|| {
                CmError::Mad(format!("all {MAX_SLOTS} I/O controller slots are taken"))
            })?;
        Ok(IocHandle {
            unit: self.unit.clone(),
            slot,
        })
    }
}

impl Drop for DmService {
    fn drop(&mut self) {
        self.closer.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers requests until the agent closes (the service's drop, or its CA's
/// removal): the thread sleeps until a request comes, with no periodic
/// wake-up.
fn serve(agent: MadAgent, unit: Arc<Mutex<IoUnit>>) {
    loop {
        match agent.wait(Duration::from_secs(3600)) {
            MadWait::Request(peer, req) => {
                let resp = unit.lock().unwrap_or_else(|e| e.into_inner()).answer(&req);
                agent.send(peer, resp);
            }
            MadWait::TimedOut => {}
            MadWait::Closed => return,
        }
    }
}

/// Asks the DM agent of the port with GID `peer` for its I/O controllers
/// (IOUnitInfo, then each present slot's profile and service entries), as
/// `srp_daemon` does. Each MAD waits `timeout` and is sent again up to
/// `retries` times.
///
/// # Errors
/// No answer, an error status, or a malformed attribute.
pub fn query_iocs(
    port: &CmAgent,
    peer: Gid,
    timeout: Duration,
    retries: u32,
) -> Result<Vec<(u8, Ioc)>, CmError> {
    let agent = port.mad_agent(u8::from(MgmtClass::DevMgt), DM_CLASS_VERSION, &[])?;
    let ask = |attr: DmAttr, modifier: u32| -> Result<Box<MadBytes>, CmError> {
        let r = agent.request(peer, get_request(attr, modifier), timeout, retries)?;
        let status = MadStatus(u16::from_be_bytes([r[4], r[5]]));
        if !status.is_ok() {
            return Err(CmError::Mad(format!(
                "{attr} (modifier {modifier:#x}): {status}"
            )));
        }
        Ok(r)
    };
    let bad = |what: &str, e: rdma_mad::Error| CmError::Mad(format!("{what}: {e}"));
    let r = ask(DmAttr::IoUnitInfo, 0)?;
    let info = IoUnitInfo::parse(&r[DM_DATA..]).map_err(|e| bad("IOUnitInfo", e))?;
    let mut out = Vec::new();
    for slot in 1..=info.max_controllers {
        if info.slot(slot) != Some(1) {
            continue;
        }
        let r = ask(DmAttr::IoControllerProfile, u32::from(slot))?;
        let profile =
            IocProfile::parse(&r[DM_DATA..]).map_err(|e| bad("IOControllerProfile", e))?;
        let mut services = Vec::new();
        let n = usize::from(profile.service_entries);
        let mut first = 0;
        while first < n {
            let last = (first + ENTRIES_PER_MAD - 1).min(n - 1);
            let modifier = (u32::from(slot) << 16) | ((last as u32) << 8) | first as u32;
            let r = ask(DmAttr::ServiceEntries, modifier)?;
            services.extend(
                parse_service_entries(&r[DM_DATA..], last - first + 1)
                    .map_err(|e| bad("ServiceEntries", e))?,
            );
            first = last + 1;
        }
        out.push((slot, Ioc { profile, services }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ioc(guid: u64, services: usize) -> Ioc {
        let mut i = Ioc::srp(Guid(guid), &IocLimits::default(), "srptd");
        i.services = (0..services)
            .map(|k| ServiceEntry::srp(guid + k as u64, guid))
            .collect();
        i
    }

    fn status(r: &MadBytes) -> u16 {
        u16::from_be_bytes([r[4], r[5]])
    }

    #[test]
    fn answers_walk_unit_info_profiles_and_entries() {
        let mut u = IoUnit::new();
        assert_eq!(u.add(ioc(0x1111, 1)), Some(1));
        assert_eq!(u.add(ioc(0x2222, 6)), Some(2));
        u.remove(1);
        let r = u.answer(&get_request(DmAttr::IoUnitInfo, 0));
        assert_eq!(status(&r), 0);
        assert_eq!(r[3], 0x81);
        let info = IoUnitInfo::parse(&r[DM_DATA..]).unwrap();
        assert_eq!((info.slot(1), info.slot(2)), (Some(0), Some(1)));
        assert_eq!(info.change_id, 3);
        let r = u.answer(&get_request(DmAttr::IoControllerProfile, 2));
        let p = IocProfile::parse(&r[DM_DATA..]).unwrap();
        assert_eq!((p.guid, p.service_entries), (Guid(0x2222), 6));
        // Entries 4..=5 of slot 2.
        let r = u.answer(&get_request(
            DmAttr::ServiceEntries,
            (2 << 16) | (5 << 8) | 4,
        ));
        let e = parse_service_entries(&r[DM_DATA..], 2).unwrap();
        assert_eq!(e[1].name_str(), "SRP.T10:0000000000002227");
        // Refusals.
        let r = u.answer(&get_request(DmAttr::IoControllerProfile, 1));
        assert_eq!(status(&r), 0x001C, "empty slot");
        let r = u.answer(&get_request(DmAttr::ServiceEntries, (2 << 16) | (6 << 8)));
        assert_eq!(status(&r), 0x001C, "past the last entry");
        let r = u.answer(&get_request(DmAttr::ServiceEntries, (2 << 16) | (4 << 8)));
        assert_eq!(status(&r), 0x001C, "more than four in one MAD");
        let r = u.answer(&get_request(DmAttr::DiagCode, 0));
        assert_eq!(status(&r), 0x000C);
        let mut set = get_request(DmAttr::IoUnitInfo, 0);
        set[3] = 0x02;
        assert_eq!(status(&u.answer(&set)), 0x0008);
    }
}
