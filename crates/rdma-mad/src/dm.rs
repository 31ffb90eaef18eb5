//! Device management (IBA 16.3) attributes used by SRP discovery, and the
//! ClassPortInfo attribute shared by every GS class (IBA 13.4.8.1).

use crate::bytes::*;
use crate::{check_len, Result};
use rdma_types::{Gid, Guid};

/// DM class version.
pub const DM_CLASS_VERSION: u8 = 1;
/// IOControllerProfile I/O class for SRP (SRP r16a annex).
pub const IO_CLASS_SRP: u16 = 0x0100;

open_enum! {
    /// DM attribute IDs (IBA 16.3.3, table 283).
    pub enum DmAttr(u16) {
        /// ClassPortInfo.
        ClassPortInfo = 0x0001 => "ClassPortInfo",
        /// Notice.
        Notice = 0x0002 => "Notice",
        /// IOUnitInfo.
        IoUnitInfo = 0x0010 => "IOUnitInfo",
        /// IOControllerProfile.
        IoControllerProfile = 0x0011 => "IOControllerProfile",
        /// ServiceEntries.
        ServiceEntries = 0x0012 => "ServiceEntries",
        /// DiagnosticTimeout.
        DiagnosticTimeout = 0x0020 => "DiagnosticTimeout",
        /// PrepareToTest.
        PrepareToTest = 0x0021 => "PrepareToTest",
        /// TestDeviceOnce.
        TestDeviceOnce = 0x0022 => "TestDeviceOnce",
        /// TestDeviceLoop.
        TestDeviceLoop = 0x0023 => "TestDeviceLoop",
        /// DiagCode.
        DiagCode = 0x0024 => "DiagCode",
    }
}

/// IOUnitInfo, 132 bytes (IBA 16.3.3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoUnitInfo {
    /// Change ID.
    pub change_id: u16,
    /// Number of controller slots.
    pub max_controllers: u8,
    /// Diag device ID and option ROM bits.
    pub diag_rom: u8,
    /// Controller list: one nibble per slot (1 = present), slot 1 in the high nibble of byte 0.
    pub controller_list: [u8; 128],
}

impl IoUnitInfo {
    /// Wire length.
    pub const LEN: usize = 132;

    /// Parses 132 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(IoUnitInfo {
            change_id: u16_at(b, 0),
            max_controllers: b[2],
            diag_rom: b[3],
            controller_list: b[4..132].try_into().unwrap(),
        })
    }

    /// Writes 132 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        put_u16(b, 0, self.change_id);
        b[2] = self.max_controllers;
        b[3] = self.diag_rom;
        b[4..132].copy_from_slice(&self.controller_list);
    }

    /// Slot state (4 bits) of 1-based `slot`; `None` outside 1..=max.
    pub fn slot(&self, slot: u8) -> Option<u8> {
        if slot == 0 || slot > self.max_controllers {
            return None;
        }
        let i = (slot - 1) as usize;
        let byte = self.controller_list[i / 2];
        Some(if i & 1 == 0 { byte >> 4 } else { byte & 0xf })
    }
}

/// IOControllerProfile, 128 bytes (IBA 16.3.3.4; srp_daemon `srp_dm_ioc_prof`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IocProfile {
    /// IOC GUID.
    pub guid: Guid,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// Device ID.
    pub device_id: u32,
    /// Device version.
    pub device_version: u16,
    /// Subsystem vendor ID (24 bits).
    pub subsys_vendor_id: u32,
    /// Subsystem ID.
    pub subsys_device_id: u32,
    /// I/O class (0x0100 SRP).
    pub io_class: u16,
    /// I/O subclass.
    pub io_subclass: u16,
    /// Protocol.
    pub protocol: u16,
    /// Protocol version.
    pub protocol_version: u16,
    /// Send message queue depth.
    pub send_queue_depth: u16,
    /// RDMA read depth.
    pub rdma_read_depth: u8,
    /// Send message size.
    pub send_size: u32,
    /// Max RDMA transfer size.
    pub rdma_size: u32,
    /// Operation capability mask.
    pub cap_mask: u8,
    /// Number of service entries.
    pub service_entries: u8,
    /// ID string, 64 bytes NUL padded.
    pub id_string: [u8; 64],
}

impl IocProfile {
    /// Wire length.
    pub const LEN: usize = 128;

    /// Parses 128 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(IocProfile {
            guid: Guid(u64_at(b, 0)),
            vendor_id: u32_at(b, 8) & 0xFF_FFFF,
            device_id: u32_at(b, 12),
            device_version: u16_at(b, 16),
            subsys_vendor_id: u32_at(b, 20) & 0xFF_FFFF,
            subsys_device_id: u32_at(b, 24),
            io_class: u16_at(b, 28),
            io_subclass: u16_at(b, 30),
            protocol: u16_at(b, 32),
            protocol_version: u16_at(b, 34),
            send_queue_depth: u16_at(b, 40),
            rdma_read_depth: b[43],
            send_size: u32_at(b, 44),
            rdma_size: u32_at(b, 48),
            cap_mask: b[52],
            service_entries: b[54],
            id_string: b[64..128].try_into().unwrap(),
        })
    }

    /// Always 128.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 128 bytes (reserved zero).
    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        put_u64(b, 0, self.guid.0);
        put_u32(b, 8, self.vendor_id & 0xFF_FFFF);
        put_u32(b, 12, self.device_id);
        put_u16(b, 16, self.device_version);
        put_u32(b, 20, self.subsys_vendor_id & 0xFF_FFFF);
        put_u32(b, 24, self.subsys_device_id);
        put_u16(b, 28, self.io_class);
        put_u16(b, 30, self.io_subclass);
        put_u16(b, 32, self.protocol);
        put_u16(b, 34, self.protocol_version);
        put_u16(b, 40, self.send_queue_depth);
        b[43] = self.rdma_read_depth;
        put_u32(b, 44, self.send_size);
        put_u32(b, 48, self.rdma_size);
        b[52] = self.cap_mask;
        b[54] = self.service_entries;
        b[64..128].copy_from_slice(&self.id_string);
    }

    /// The ID string up to its first NUL.
    pub fn id(&self) -> String {
        let end = self.id_string.iter().position(|&c| c == 0).unwrap_or(64);
        String::from_utf8_lossy(&self.id_string[..end]).into_owned()
    }
}

/// One service entry: 40-byte name and 8-byte service ID (IBA 16.3.3.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// Name, NUL padded ("SRP.T10:<id_ext in 16 hex digits>" for SRP).
    pub name: [u8; 40],
    /// Service ID.
    pub id: u64,
}

impl ServiceEntry {
    /// Wire length.
    pub const LEN: usize = 48;

    /// An SRP entry named after its identifier extension.
    pub fn srp(id_ext: u64, service_id: u64) -> ServiceEntry {
        let mut name = [0u8; 40];
        let s = format!("SRP.T10:{id_ext:016X}");
        name[..s.len()].copy_from_slice(s.as_bytes());
        ServiceEntry {
            name,
            id: service_id,
        }
    }

    /// The name up to its first NUL.
    pub fn name_str(&self) -> String {
        let end = self.name.iter().position(|&c| c == 0).unwrap_or(40);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// ServiceEntries block: up to 4 entries (192 bytes).
pub fn parse_service_entries(b: &[u8], count: usize) -> Result<Vec<ServiceEntry>> {
    let count = count.min(4);
    check_len(b, count * ServiceEntry::LEN)?;
    Ok((0..count)
        .map(|i| {
            let e = &b[i * 48..i * 48 + 48];
            ServiceEntry {
                name: e[..40].try_into().unwrap(),
                id: u64_at(e, 40),
            }
        })
        .collect())
}

/// Writes up to 4 entries.
pub fn emit_service_entries(entries: &[ServiceEntry], b: &mut [u8]) {
    for (i, e) in entries.iter().take(4).enumerate() {
        b[i * 48..i * 48 + 40].copy_from_slice(&e.name);
        put_u64(b, i * 48 + 40, e.id);
    }
}

/// ClassPortInfo, 72 bytes (IBA 13.4.8.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPortInfo {
    /// Base version.
    pub base_version: u8,
    /// Class version.
    pub class_version: u8,
    /// Capability mask.
    pub capability_mask: u16,
    /// Capability mask 2 (27 bits).
    pub capability_mask2: u32,
    /// Response time value (5 bits).
    pub resp_time_value: u8,
    /// Redirect GID.
    pub redirect_gid: Gid,
    /// Redirect TC/SL/FL word.
    pub redirect_tc_sl_fl: u32,
    /// Redirect LID.
    pub redirect_lid: u16,
    /// Redirect P_Key.
    pub redirect_pkey: u16,
    /// Redirect QP (24 bits).
    pub redirect_qp: u32,
    /// Redirect Q_Key.
    pub redirect_qkey: u32,
    /// Trap GID.
    pub trap_gid: Gid,
    /// Trap TC/SL/FL word.
    pub trap_tc_sl_fl: u32,
    /// Trap LID.
    pub trap_lid: u16,
    /// Trap P_Key.
    pub trap_pkey: u16,
    /// Trap hop limit and QP word.
    pub trap_hl_qp: u32,
    /// Trap Q_Key.
    pub trap_qkey: u32,
}

impl ClassPortInfo {
    /// Wire length.
    pub const LEN: usize = 72;

    /// Parses 72 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        let w = u32_at(b, 4);
        Ok(ClassPortInfo {
            base_version: b[0],
            class_version: b[1],
            capability_mask: u16_at(b, 2),
            capability_mask2: w >> 5,
            resp_time_value: (w & 0x1f) as u8,
            redirect_gid: Gid(b[8..24].try_into().unwrap()),
            redirect_tc_sl_fl: u32_at(b, 24),
            redirect_lid: u16_at(b, 28),
            redirect_pkey: u16_at(b, 30),
            redirect_qp: u32_at(b, 32) & 0xFF_FFFF,
            redirect_qkey: u32_at(b, 36),
            trap_gid: Gid(b[40..56].try_into().unwrap()),
            trap_tc_sl_fl: u32_at(b, 56),
            trap_lid: u16_at(b, 60),
            trap_pkey: u16_at(b, 62),
            trap_hl_qp: u32_at(b, 64),
            trap_qkey: u32_at(b, 68),
        })
    }

    /// Writes 72 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.class_version;
        put_u16(b, 2, self.capability_mask);
        put_u32(
            b,
            4,
            self.capability_mask2 << 5 | (self.resp_time_value & 0x1f) as u32,
        );
        b[8..24].copy_from_slice(&self.redirect_gid.0);
        put_u32(b, 24, self.redirect_tc_sl_fl);
        put_u16(b, 28, self.redirect_lid);
        put_u16(b, 30, self.redirect_pkey);
        put_u32(b, 32, self.redirect_qp & 0xFF_FFFF);
        put_u32(b, 36, self.redirect_qkey);
        b[40..56].copy_from_slice(&self.trap_gid.0);
        put_u32(b, 56, self.trap_tc_sl_fl);
        put_u16(b, 60, self.trap_lid);
        put_u16(b, 62, self.trap_pkey);
        put_u32(b, 64, self.trap_hl_qp);
        put_u32(b, 68, self.trap_qkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-made IOControllerProfile of an SRP target (IBA 16.3.3.4, srp_daemon layout).
    #[test]
    fn ioc_profile_vector() {
        let mut b = [0u8; 128];
        b[0..8].copy_from_slice(&[0x00, 0x02, 0xc9, 0x03, 0x00, 0x01, 0x02, 0x03]); // IOC GUID
        b[8..12].copy_from_slice(&[0x00, 0x00, 0x02, 0xc9]); // vendor 0x0002c9
        b[12..16].copy_from_slice(&[0x00, 0x00, 0x67, 0x32]); // device ID
        b[28..30].copy_from_slice(&[0x01, 0x00]); // I/O class SRP
        b[30..32].copy_from_slice(&[0x60, 0x9e]); // subclass (SRP OUI low bits)
        b[32..34].copy_from_slice(&[0x01, 0x08]); // protocol 0x0108
        b[34..36].copy_from_slice(&[0x00, 0x01]); // protocol version 1
        b[40..42].copy_from_slice(&[0x00, 0x80]); // send queue depth 128
        b[43] = 0x04; // RDMA read depth 4
        b[44..48].copy_from_slice(&[0x00, 0x00, 0x10, 0x00]); // send size 4096
        b[48..52].copy_from_slice(&[0x00, 0x10, 0x00, 0x00]); // RDMA size 1 MiB
        b[52] = 0x30; // cap mask: RDMA read+write from IOC
        b[54] = 0x01; // 1 service entry
        b[64..71].copy_from_slice(b"ours IO"); // ID string
        let p = IocProfile::parse(&b).unwrap();
        assert_eq!(p.io_class, IO_CLASS_SRP);
        assert_eq!(p.vendor_id, 0x2c9);
        assert_eq!(p.rdma_size, 1 << 20);
        assert_eq!(p.id(), "ours IO");
        let mut out = [0u8; 128];
        p.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn service_entries_and_iou() {
        let e = ServiceEntry::srp(0x0002c90300010203, 0x0002c90300010203);
        assert_eq!(e.name_str(), "SRP.T10:0002C90300010203");
        let mut b = [0u8; 192];
        emit_service_entries(std::slice::from_ref(&e), &mut b);
        assert_eq!(
            &b[40..48],
            &[0x00, 0x02, 0xc9, 0x03, 0x00, 0x01, 0x02, 0x03]
        );
        assert_eq!(parse_service_entries(&b, 1).unwrap(), vec![e]);
        let mut iou = [0u8; 132];
        iou[2] = 2; // 2 slots
        iou[4] = 0x10; // slot 1 present, slot 2 empty
        let i = IoUnitInfo::parse(&iou).unwrap();
        assert_eq!((i.slot(1), i.slot(2), i.slot(3)), (Some(1), Some(0), None));
    }

    #[test]
    fn class_port_info_round_trip() {
        let mut b = [0u8; 72];
        b[0] = 1;
        b[1] = 2;
        b[2..4].copy_from_slice(&[0x02, 0x00]);
        b[4..8].copy_from_slice(&[0x00, 0x00, 0x00, 0x12]); // resp time 18
        b[36..40].copy_from_slice(&[0x80, 0x01, 0x00, 0x00]); // redirect Q_Key (GSI)
        let c = ClassPortInfo::parse(&b).unwrap();
        assert_eq!(c.resp_time_value, 18);
        let mut out = [0u8; 72];
        c.emit(&mut out);
        assert_eq!(out, b);
    }
}
