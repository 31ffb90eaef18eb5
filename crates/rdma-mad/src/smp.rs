//! Subnet management packets (IBA 14.2): LID-routed and directed-route
//! layouts and the common SMP attributes.

use crate::bytes::*;
use crate::mad::{MgmtClass, MAD_SIZE};
use crate::{check_len, Error, Result};
use rdma_types::{Gid, Guid, Pkey};

/// SMP attribute data length.
pub const SMP_DATA_LEN: usize = 64;

mod field {
    use core::ops::Range;
    pub const STATUS: usize = 4;
    pub const HOP_PTR: usize = 6;
    pub const HOP_CNT: usize = 7;
    pub const MKEY: usize = 24;
    pub const DR_SLID: usize = 32;
    pub const DR_DLID: usize = 34;
    pub const DATA: Range<usize> = 64..128;
    pub const INITIAL_PATH: Range<usize> = 128..192;
    pub const RETURN_PATH: Range<usize> = 192..256;
}

open_enum! {
    /// SMP attribute IDs (IBA 14.2.5, table 145).
    pub enum SmpAttr(u16) {
        /// Notice (traps).
        Notice = 0x0002 => "Notice",
        /// NodeDescription.
        NodeDescription = 0x0010 => "NodeDescription",
        /// NodeInfo.
        NodeInfo = 0x0011 => "NodeInfo",
        /// SwitchInfo.
        SwitchInfo = 0x0012 => "SwitchInfo",
        /// GUIDInfo.
        GuidInfo = 0x0014 => "GUIDInfo",
        /// PortInfo.
        PortInfo = 0x0015 => "PortInfo",
        /// P_KeyTable.
        PkeyTable = 0x0016 => "P_KeyTable",
        /// SLtoVLMappingTable.
        SlToVlTable = 0x0017 => "SLtoVLMappingTable",
        /// VLArbitrationTable.
        VlArbTable = 0x0018 => "VLArbitrationTable",
        /// LinearForwardingTable.
        LinearFwdTable = 0x0019 => "LinearForwardingTable",
        /// RandomForwardingTable.
        RandomFwdTable = 0x001A => "RandomForwardingTable",
        /// MulticastForwardingTable.
        McastFwdTable = 0x001B => "MulticastForwardingTable",
        /// SMInfo.
        SmInfo = 0x0020 => "SMInfo",
        /// VendorDiag.
        VendorDiag = 0x0030 => "VendorDiag",
        /// LedInfo.
        LedInfo = 0x0031 => "LedInfo",
    }
}

/// A view of an SMP (either routing kind).
#[derive(Debug, Clone)]
pub struct Smp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Smp<T> {
    /// Wraps a buffer without checking (getters may panic if short).
    pub fn new_unchecked(buffer: T) -> Self {
        Smp { buffer }
    }

    /// Wraps a 256-byte MAD of class 0x01 or 0x81.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), MAD_SIZE)?;
        let class = MgmtClass::from(buffer.as_ref()[1]);
        if !class.is_smp() {
            return Err(Error::WrongKind { expected: "SMP" });
        }
        Ok(Smp { buffer })
    }

    /// True for directed-route SMPs (class 0x81).
    pub fn is_directed(&self) -> bool {
        self.buffer.as_ref()[1] == u8::from(MgmtClass::SubnDirected)
    }
    /// D bit: direction (directed route only; 1 = returning).
    pub fn direction(&self) -> bool {
        self.is_directed() && u16_at(self.buffer.as_ref(), field::STATUS) & 0x8000 != 0
    }
    /// Status without the D bit for directed route.
    pub fn status(&self) -> u16 {
        let s = u16_at(self.buffer.as_ref(), field::STATUS);
        if self.is_directed() {
            s & 0x7fff
        } else {
            s
        }
    }
    /// Hop pointer (directed route).
    pub fn hop_pointer(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_PTR]
    }
    /// Hop count (directed route).
    pub fn hop_count(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_CNT]
    }
    /// M_Key.
    pub fn mkey(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::MKEY)
    }
    /// DrSLID (directed route).
    pub fn dr_slid(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::DR_SLID)
    }
    /// DrDLID (directed route).
    pub fn dr_dlid(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::DR_DLID)
    }
    /// The 64 bytes of SMP data.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
    /// Initial path (directed route): port numbers for hops 1..=hop count.
    pub fn initial_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::INITIAL_PATH]
    }
    /// Return path (directed route).
    pub fn return_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::RETURN_PATH]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Smp<T> {
    /// Sets the D bit (directed route).
    pub fn set_direction(&mut self, d: bool) {
        let b = self.buffer.as_mut();
        b[field::STATUS] = (b[field::STATUS] & 0x7f) | ((d as u8) << 7);
    }
    /// Sets the hop pointer.
    pub fn set_hop_pointer(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_PTR] = v;
    }
    /// Sets the hop count.
    pub fn set_hop_count(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_CNT] = v;
    }
    /// Sets the M_Key.
    pub fn set_mkey(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), field::MKEY, v);
    }
    /// Sets DrSLID.
    pub fn set_dr_slid(&mut self, v: u16) {
        put_u16(self.buffer.as_mut(), field::DR_SLID, v);
    }
    /// Sets DrDLID.
    pub fn set_dr_dlid(&mut self, v: u16) {
        put_u16(self.buffer.as_mut(), field::DR_DLID, v);
    }
    /// The 64 bytes of SMP data, mutable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
    /// Initial path, mutable.
    pub fn initial_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::INITIAL_PATH]
    }
    /// Return path, mutable.
    pub fn return_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::RETURN_PATH]
    }
}

/// NodeInfo, 40 bytes (IBA 14.2.5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    /// Base version.
    pub base_version: u8,
    /// Class version.
    pub class_version: u8,
    /// Node type: 1 CA, 2 switch, 3 router.
    pub node_type: u8,
    /// Number of physical ports.
    pub num_ports: u8,
    /// System image GUID.
    pub system_image_guid: Guid,
    /// Node GUID.
    pub node_guid: Guid,
    /// Port GUID.
    pub port_guid: Guid,
    /// P_Key table size.
    pub partition_cap: u16,
    /// Device ID.
    pub device_id: u16,
    /// Revision.
    pub revision: u32,
    /// Port the SMP arrived on.
    pub local_port_num: u8,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
}

impl NodeInfo {
    /// Wire length.
    pub const LEN: usize = 40;

    /// Parses 40 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(NodeInfo {
            base_version: b[0],
            class_version: b[1],
            node_type: b[2],
            num_ports: b[3],
            system_image_guid: Guid(u64_at(b, 4)),
            node_guid: Guid(u64_at(b, 12)),
            port_guid: Guid(u64_at(b, 20)),
            partition_cap: u16_at(b, 28),
            device_id: u16_at(b, 30),
            revision: u32_at(b, 32),
            local_port_num: b[36],
            vendor_id: u32_at(b, 36) & 0xFF_FFFF,
        })
    }

    /// Always 40.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 40 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.class_version;
        b[2] = self.node_type;
        b[3] = self.num_ports;
        put_u64(b, 4, self.system_image_guid.0);
        put_u64(b, 12, self.node_guid.0);
        put_u64(b, 20, self.port_guid.0);
        put_u16(b, 28, self.partition_cap);
        put_u16(b, 30, self.device_id);
        put_u32(b, 32, self.revision);
        put_u32(
            b,
            36,
            (self.local_port_num as u32) << 24 | (self.vendor_id & 0xFF_FFFF),
        );
    }
}

/// NodeDescription: 64 bytes of UTF-8, NUL padded (IBA 14.2.5.2).
pub fn node_description(b: &[u8]) -> Result<String> {
    check_len(b, 64)?;
    let end = b[..64].iter().position(|&c| c == 0).unwrap_or(64);
    Ok(String::from_utf8_lossy(&b[..end]).into_owned())
}

/// P_KeyTable block: 32 P_Keys (IBA 14.2.5.7).
pub fn pkey_table(b: &[u8]) -> Result<[Pkey; 32]> {
    check_len(b, 64)?;
    Ok(core::array::from_fn(|i| Pkey(u16_at(b, 2 * i))))
}

/// GUIDInfo block: 8 GUIDs (IBA 14.2.5.5).
pub fn guid_info(b: &[u8]) -> Result<[Guid; 8]> {
    check_len(b, 64)?;
    Ok(core::array::from_fn(|i| Guid(u64_at(b, 8 * i))))
}

macro_rules! cap_bits {
    ($( $name:ident = $bit:expr => $text:expr, )*) => {
        /// PortInfo:CapabilityMask bits (IBA 14.2.5.6, table 151).
        pub mod cap {
            $( #[doc = $text] pub const $name: u32 = 1 << $bit; )*
            /// (bit, name) for every bit named here.
            pub const NAMES: &[(u32, &str)] = &[ $( ($name, $text), )* ];
        }
    };
}

cap_bits! {
    IS_SM = 1 => "IsSM",
    IS_NOTICE_SUPPORTED = 2 => "IsNoticeSupported",
    IS_TRAP_SUPPORTED = 3 => "IsTrapSupported",
    IS_OPTIONAL_IPD_SUPPORTED = 4 => "IsOptionalIPDSupported",
    IS_AUTO_MIGRATION_SUPPORTED = 5 => "IsAutomaticMigrationSupported",
    IS_SL_MAPPING_SUPPORTED = 6 => "IsSLMappingSupported",
    IS_MKEY_NVRAM = 7 => "IsMKeyNVRAM",
    IS_PKEY_NVRAM = 8 => "IsPKeyNVRAM",
    IS_LED_INFO_SUPPORTED = 9 => "IsLEDInfoSupported",
    IS_SM_DISABLED = 10 => "IsSMdisabled",
    IS_SYS_IMAGE_GUID_SUPPORTED = 11 => "IsSystemImageGUIDSupported",
    IS_PKEY_SW_EXT_PORT_TRAP_SUPPORTED = 12 => "IsPKeySwitchExternalPortTrapSupported",
    IS_EXTENDED_SPEEDS_SUPPORTED = 14 => "IsExtendedSpeedsSupported",
    IS_CAP_MASK2_SUPPORTED = 15 => "IsCapabilityMask2Supported",
    IS_CM_SUPPORTED = 16 => "IsCommunicationManagementSupported",
    IS_SNMP_TUNNEL_SUPPORTED = 17 => "IsSNMPTunnelingSupported",
    IS_REINIT_SUPPORTED = 18 => "IsReinitSupported",
    IS_DEVICE_MGMT_SUPPORTED = 19 => "IsDeviceManagementSupported",
    IS_VENDOR_CLASS_SUPPORTED = 20 => "IsVendorClassSupported",
    IS_DR_NOTICE_SUPPORTED = 21 => "IsDRNoticeSupported",
    IS_CAP_MASK_NOTICE_SUPPORTED = 22 => "IsCapabilityMaskNoticeSupported",
    IS_BOOT_MGMT_SUPPORTED = 23 => "IsBootManagementSupported",
    IS_LINK_ROUND_TRIP_LATENCY_SUPPORTED = 24 => "IsLinkRoundTripLatencySupported",
    IS_CLIENT_REREGISTRATION_SUPPORTED = 25 => "IsClientReregistrationSupported",
    IS_OTHER_LOCAL_CHANGES_NOTICE_SUPPORTED = 26 => "IsOtherLocalChangesNoticeSupported",
    IS_LINK_SPEED_WIDTH_PAIRS_SUPPORTED = 27 => "IsLinkSpeedWidthPairsTableSupported",
}

/// Names of the capability bits set in `mask`.
pub fn cap_names(mask: u32) -> Vec<&'static str> {
    cap::NAMES
        .iter()
        .filter(|(b, _)| mask & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// A view of PortInfo, 64 bytes (IBA 14.2.5.6); every byte is kept.
#[derive(Debug, Clone)]
pub struct PortInfo<T: AsRef<[u8]>> {
    buffer: T,
}

macro_rules! pi_fields {
    ($( $(#[$m:meta])* $get:ident / $set:ident : $ty:ty = $rd:expr , $wr:expr ; )*) => {
        impl<T: AsRef<[u8]>> PortInfo<T> {
            $( $(#[$m])* pub fn $get(&self) -> $ty { let b = self.buffer.as_ref(); #[allow(clippy::redundant_closure_call)] ($rd)(b) } )*
        }
        impl<T: AsRef<[u8]> + AsMut<[u8]>> PortInfo<T> {
            $( #[doc = concat!("Sets `", stringify!($get), "`.")] pub fn $set(&mut self, v: $ty) { let b = self.buffer.as_mut(); #[allow(clippy::redundant_closure_call)] ($wr)(b, v) } )*
        }
    };
}

impl<T: AsRef<[u8]>> PortInfo<T> {
    /// Wraps at least 64 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), 64)?;
        Ok(PortInfo { buffer })
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

pi_fields! {
    /// M_Key.
    mkey / set_mkey: u64 = |b: &[u8]| u64_at(b, 0), |b: &mut [u8], v| put_u64(b, 0, v);
    /// GID prefix.
    gid_prefix / set_gid_prefix: u64 = |b: &[u8]| u64_at(b, 8), |b: &mut [u8], v| put_u64(b, 8, v);
    /// Base LID.
    lid / set_lid: u16 = |b: &[u8]| u16_at(b, 16), |b: &mut [u8], v| put_u16(b, 16, v);
    /// Master SM LID.
    sm_lid / set_sm_lid: u16 = |b: &[u8]| u16_at(b, 18), |b: &mut [u8], v| put_u16(b, 18, v);
    /// Capability mask (see [`cap`]).
    capability_mask / set_capability_mask: u32 = |b: &[u8]| u32_at(b, 20), |b: &mut [u8], v| put_u32(b, 20, v);
    /// M_KeyLeasePeriod, seconds (0: the lease never ends; IBA 14.2.4.4).
    mkey_lease_period / set_mkey_lease_period: u16 = |b: &[u8]| u16_at(b, 26), |b: &mut [u8], v| put_u16(b, 26, v);
    /// Local port number.
    local_port_num / set_local_port_num: u8 = |b: &[u8]| b[28], |b: &mut [u8], v| b[28] = v;
    /// Link width active.
    link_width_active / set_link_width_active: u8 = |b: &[u8]| b[31], |b: &mut [u8], v| b[31] = v;
    /// Link speed supported (4 bits).
    link_speed_supported / set_link_speed_supported: u8 = |b: &[u8]| bits(b, 32, 4, 4), |b: &mut [u8], v| put_bits(b, 32, 4, 4, v);
    /// Port state: 1 Down, 2 Init, 3 Armed, 4 Active.
    port_state / set_port_state: u8 = |b: &[u8]| bits(b, 32, 0, 4), |b: &mut [u8], v| put_bits(b, 32, 0, 4, v);
    /// Physical state: 2 Polling, 3 Disabled, 5 LinkUp.
    phys_state / set_phys_state: u8 = |b: &[u8]| bits(b, 33, 4, 4), |b: &mut [u8], v| put_bits(b, 33, 4, 4, v);
    /// M_KeyProtectBits (2 bits, IBA 14.2.4.1): 0 Gets show the M_Key,
    /// 1 Gets hide it from the wrong key, 2 and 3 Gets need the key.
    mkey_protect / set_mkey_protect: u8 = |b: &[u8]| bits(b, 34, 6, 2), |b: &mut [u8], v| put_bits(b, 34, 6, 2, v);
    /// LMC (3 bits).
    lmc / set_lmc: u8 = |b: &[u8]| bits(b, 34, 0, 3), |b: &mut [u8], v| put_bits(b, 34, 0, 3, v);
    /// Link speed active (4 bits).
    link_speed_active / set_link_speed_active: u8 = |b: &[u8]| bits(b, 35, 4, 4), |b: &mut [u8], v| put_bits(b, 35, 4, 4, v);
    /// Neighbor (active) MTU code.
    mtu_active / set_mtu_active: u8 = |b: &[u8]| bits(b, 36, 4, 4), |b: &mut [u8], v| put_bits(b, 36, 4, 4, v);
    /// Master SM SL.
    sm_sl / set_sm_sl: u8 = |b: &[u8]| bits(b, 36, 0, 4), |b: &mut [u8], v| put_bits(b, 36, 0, 4, v);
    /// VL cap (4 bits).
    vl_cap / set_vl_cap: u8 = |b: &[u8]| bits(b, 37, 4, 4), |b: &mut [u8], v| put_bits(b, 37, 4, 4, v);
    /// MTU cap code.
    mtu_cap / set_mtu_cap: u8 = |b: &[u8]| bits(b, 41, 0, 4), |b: &mut [u8], v| put_bits(b, 41, 0, 4, v);
    /// M_KeyViolations: SMPs refused for a wrong M_Key (saturates).
    mkey_violations / set_mkey_violations: u16 = |b: &[u8]| u16_at(b, 44), |b: &mut [u8], v| put_u16(b, 44, v);
    /// P_KeyViolations: packets the port dropped for their P_Key
    /// (saturates).
    pkey_violations / set_pkey_violations: u16 = |b: &[u8]| u16_at(b, 46), |b: &mut [u8], v| put_u16(b, 46, v);
    /// GUID cap.
    guid_cap / set_guid_cap: u8 = |b: &[u8]| b[50], |b: &mut [u8], v| b[50] = v;
    /// Client reregister bit.
    client_reregister / set_client_reregister: u8 = |b: &[u8]| bits(b, 51, 7, 1), |b: &mut [u8], v| put_bits(b, 51, 7, 1, v);
    /// Subnet timeout (5 bits).
    subnet_timeout / set_subnet_timeout: u8 = |b: &[u8]| bits(b, 51, 0, 5), |b: &mut [u8], v| put_bits(b, 51, 0, 5, v);
    /// Response time value (5 bits).
    resp_time_value / set_resp_time_value: u8 = |b: &[u8]| bits(b, 52, 0, 5), |b: &mut [u8], v| put_bits(b, 52, 0, 5, v);
    /// Capability mask 2.
    capability_mask2 / set_capability_mask2: u16 = |b: &[u8]| u16_at(b, 60), |b: &mut [u8], v| put_u16(b, 60, v);
}

/// SMInfo, 24 bytes (IBA 14.2.5.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmInfo {
    /// SM port GUID.
    pub guid: Guid,
    /// SM_Key.
    pub sm_key: u64,
    /// Activity counter.
    pub act_count: u32,
    /// Priority (4 bits).
    pub priority: u8,
    /// State: 0 not active, 1 discovering, 2 standby, 3 master.
    pub sm_state: u8,
}

impl SmInfo {
    /// Wire length.
    pub const LEN: usize = 24;

    /// Parses 24 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(SmInfo {
            guid: Guid(u64_at(b, 0)),
            sm_key: u64_at(b, 8),
            act_count: u32_at(b, 16),
            priority: b[20] >> 4,
            sm_state: b[20] & 0xf,
        })
    }

    /// Writes 24 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        put_u64(b, 0, self.guid.0);
        put_u64(b, 8, self.sm_key);
        put_u32(b, 16, self.act_count);
        b[20] = self.priority << 4 | (self.sm_state & 0xf);
    }
}

/// Notice (trap), 80 bytes (IBA 13.4.8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    /// Generic (true) or vendor-specific.
    pub is_generic: bool,
    /// Type (7 bits): 0 fatal, 1 urgent, 2 security, 3 SM, 4 info.
    pub notice_type: u8,
    /// Producer type (generic) or vendor ID, 24 bits.
    pub producer_type: u32,
    /// Trap number (generic) or device ID.
    pub trap_number: u16,
    /// Issuer LID.
    pub issuer_lid: u16,
    /// Notice toggle.
    pub toggle: bool,
    /// Notice count (15 bits).
    pub count: u16,
    /// Data details (54 bytes).
    pub data_details: [u8; 54],
    /// Issuer GID.
    pub issuer_gid: Gid,
}

impl Notice {
    /// Wire length.
    pub const LEN: usize = 80;
    /// Trap 64: GID now in service.
    pub const TRAP_GID_IN_SERVICE: u16 = 64;
    /// Trap 65: GID out of service.
    pub const TRAP_GID_OUT_OF_SERVICE: u16 = 65;
    /// Trap 256: an SMP with a bad M_Key (IBA 14.2.4.3).
    pub const TRAP_BAD_MKEY: u16 = 256;
    /// Trap 257: a packet with a bad P_Key (IBA 14.2.5.1, 10.9.3).
    pub const TRAP_BAD_PKEY: u16 = 257;
    /// Trap 258: a packet with a bad Q_Key.
    pub const TRAP_BAD_QKEY: u16 = 258;

    /// Parses 80 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(Notice {
            is_generic: b[0] >> 7 != 0,
            notice_type: b[0] & 0x7f,
            producer_type: u32_at(b, 0) & 0xFF_FFFF,
            trap_number: u16_at(b, 4),
            issuer_lid: u16_at(b, 6),
            toggle: b[8] >> 7 != 0,
            count: u16_at(b, 8) & 0x7fff,
            data_details: b[10..64].try_into().unwrap(),
            issuer_gid: Gid(b[64..80].try_into().unwrap()),
        })
    }

    /// Always 80.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 80 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        put_u32(
            b,
            0,
            (self.is_generic as u32) << 31
                | ((self.notice_type & 0x7f) as u32) << 24
                | (self.producer_type & 0xFF_FFFF),
        );
        put_u16(b, 4, self.trap_number);
        put_u16(b, 6, self.issuer_lid);
        put_u16(b, 8, (self.toggle as u16) << 15 | (self.count & 0x7fff));
        b[10..64].copy_from_slice(&self.data_details);
        b[64..80].copy_from_slice(&self.issuer_gid.0);
    }

    /// For generic traps 64/65, the GID that came or went (data details bytes 6..22).
    pub fn trap_gid(&self) -> Option<Gid> {
        if self.is_generic
            && matches!(
                self.trap_number,
                Self::TRAP_GID_IN_SERVICE | Self::TRAP_GID_OUT_OF_SERVICE
            )
        {
            Some(Gid(self.data_details[6..22].try_into().unwrap()))
        } else {
            None
        }
    }
}

/// The data details of traps 257 (bad P_Key) and 258 (bad Q_Key), IBA
/// 14.2.5.1: who sent the refused packet (LID1, QP1, GID1) to whom (LID2,
/// QP2, GID2), with which key. 50 of the 54 bytes; the rest reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BadKeyTrap {
    /// The sender's LID.
    pub lid1: u16,
    /// The receiver's LID.
    pub lid2: u16,
    /// The P_Key (trap 257, in the low 16 bits) or Q_Key (258) it carried.
    pub key: u32,
    /// Service level (4 bits).
    pub sl: u8,
    /// The sender's QP (24 bits).
    pub qp1: u32,
    /// The receiver's QP (24 bits).
    pub qp2: u32,
    /// The sender's GID.
    pub gid1: Gid,
    /// The receiver's GID.
    pub gid2: Gid,
}

impl BadKeyTrap {
    /// Reads the data details of a trap 257 or 258.
    pub fn parse(details: &[u8; 54]) -> BadKeyTrap {
        let d = &details[..];
        BadKeyTrap {
            lid1: u16_at(d, 2),
            lid2: u16_at(d, 4),
            key: u32_at(d, 6),
            sl: d[10] >> 4,
            qp1: u24_at(d, 11),
            qp2: u24_at(d, 15),
            gid1: Gid(d[18..34].try_into().unwrap()),
            gid2: Gid(d[34..50].try_into().unwrap()),
        }
    }

    /// Writes the data details (reserved bytes zero).
    pub fn emit(&self) -> [u8; 54] {
        let mut d = [0u8; 54];
        put_u16(&mut d, 2, self.lid1);
        put_u16(&mut d, 4, self.lid2);
        put_u32(&mut d, 6, self.key);
        put_u24(&mut d, 11, self.qp1 & 0xff_ffff);
        d[10] = self.sl << 4;
        put_u24(&mut d, 15, self.qp2 & 0xff_ffff);
        d[18..34].copy_from_slice(&self.gid1.0);
        d[34..50].copy_from_slice(&self.gid2.0);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-made directed-route SubnGet(NodeInfo) from IBA 14.2.2: one hop out port 1.
    #[test]
    fn directed_route_header() {
        let mut mad = [0u8; MAD_SIZE];
        mad[..24].copy_from_slice(&[
            0x01, // base version
            0x81, // class SubnDirected
            0x01, // class version
            0x01, // Get
            0x80, 0x00, // D bit set, status 0
            0x01, // hop pointer 1
            0x01, // hop count 1
            0, 0, 0, 0, 0, 0, 0, 0x2a, // TID 42
            0x00, 0x11, // NodeInfo
            0x00, 0x00, // reserved
            0x00, 0x00, 0x00, 0x00, // modifier
        ]);
        mad[32..36].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]); // DrSLID, DrDLID permissive
        mad[129] = 1; // initial path[1] = port 1
        let smp = Smp::new_checked(&mad[..]).unwrap();
        assert!(smp.is_directed());
        assert!(smp.direction());
        assert_eq!(smp.status(), 0);
        assert_eq!((smp.hop_pointer(), smp.hop_count()), (1, 1));
        assert_eq!((smp.dr_slid(), smp.dr_dlid()), (0xffff, 0xffff));
        assert_eq!(smp.initial_path()[1], 1);
        let mut copy = [0u8; MAD_SIZE];
        copy[..24].copy_from_slice(&mad[..24]);
        copy[4] = 0;
        let mut v = Smp::new_checked(&mut copy[..]).unwrap();
        v.set_direction(true);
        v.set_dr_slid(0xffff);
        v.set_dr_dlid(0xffff);
        v.initial_path_mut()[1] = 1;
        assert_eq!(copy, mad);
        let mut lid = mad;
        lid[1] = 0x01;
        assert!(!Smp::new_checked(&lid[..]).unwrap().direction());
        lid[1] = 0x07;
        assert!(Smp::new_checked(&lid[..]).is_err());
    }

    #[test]
    fn node_info_vector() {
        let b: [u8; 40] = [
            0x01, // base version
            0x01, // class version
            0x01, // node type CA
            0x01, // 1 port
            0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55, // system image GUID
            0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55, // node GUID
            0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55, // port GUID
            0x00, 0x40, // partition cap 64
            0x00, 0x00, // device ID
            0x00, 0x00, 0x00, 0x01, // revision 1
            0x01, // local port 1
            0xff, 0xff, 0xff, // vendor ID
        ];
        let n = NodeInfo::parse(&b).unwrap();
        assert_eq!(n.node_guid, Guid(0x0211_22ff_fe33_4455));
        assert_eq!(n.partition_cap, 64);
        assert_eq!(n.local_port_num, 1);
        assert_eq!(n.vendor_id, 0xff_ffff);
        let mut out = [0u8; 40];
        n.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn port_info_fields() {
        let mut b = [0u8; 64];
        b[16..18].copy_from_slice(&[0x00, 0x07]); // LID 7
        b[18..20].copy_from_slice(&[0x00, 0x01]); // SM LID 1
        b[20..24].copy_from_slice(&[0x00, 0x09, 0x00, 0x0a]); // bits 19 DevMgmt, 16 CM, 3 Trap, 1 SM
        b[32] = 0x14; // speed supported 1, state Active
        b[33] = 0x52; // phys LinkUp, down default 2
        b[36] = 0x50; // active MTU code 5 (4096), SM SL 0
        b[41] = 0x05; // MTU cap 4096
        let p = PortInfo::new_checked(&b[..]).unwrap();
        assert_eq!(p.lid(), 7);
        assert_eq!(p.sm_lid(), 1);
        assert_eq!(p.port_state(), 4);
        assert_eq!(p.phys_state(), 5);
        assert_eq!(p.mtu_active(), 5);
        assert_eq!(p.mtu_cap(), 5);
        assert_eq!(
            cap_names(p.capability_mask()),
            [
                "IsSM",
                "IsTrapSupported",
                "IsCommunicationManagementSupported",
                "IsDeviceManagementSupported"
            ]
        );
        let mut c = [0u8; 64];
        let mut v = PortInfo::new_checked(&mut c[..]).unwrap();
        v.set_lid(7);
        v.set_sm_lid(1);
        v.set_capability_mask(
            cap::IS_SM
                | cap::IS_TRAP_SUPPORTED
                | cap::IS_CM_SUPPORTED
                | cap::IS_DEVICE_MGMT_SUPPORTED,
        );
        v.set_link_speed_supported(1);
        v.set_port_state(4);
        v.set_phys_state(5);
        c[33] |= 2;
        let mut v = PortInfo::new_checked(&mut c[..]).unwrap();
        v.set_mtu_active(5);
        v.set_mtu_cap(5);
        assert_eq!(c, b);
    }

    #[test]
    fn port_info_mkey_fields() {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&[0xde, 0xad, 0, 0, 0, 0, 0xbe, 0xef]); // M_Key
        b[26..28].copy_from_slice(&[0x00, 0x3c]); // M_KeyLeasePeriod 60 s
        b[34] = 0x83; // M_KeyProtectBits 2, reserved 0, LMC 3
        b[44..46].copy_from_slice(&[0x01, 0x02]); // M_KeyViolations 258
        let p = PortInfo::new_checked(&b[..]).unwrap();
        assert_eq!(p.mkey(), 0xdead_0000_0000_beef);
        assert_eq!(p.mkey_lease_period(), 60);
        assert_eq!((p.mkey_protect(), p.lmc()), (2, 3));
        assert_eq!(p.mkey_violations(), 258);
        let mut c = [0u8; 64];
        let mut v = PortInfo::new_checked(&mut c[..]).unwrap();
        v.set_lmc(3);
        v.set_mkey_protect(2);
        v.set_mkey(0xdead_0000_0000_beef);
        v.set_mkey_lease_period(60);
        v.set_mkey_violations(258);
        assert_eq!(c, b);
    }

    #[test]
    fn notice_trap_64() {
        let mut b = [0u8; 80];
        b[0] = 0x83; // generic, type 3 (SM)
        b[1..4].copy_from_slice(&[0x00, 0x00, 0x04]); // producer: class manager
        b[4..6].copy_from_slice(&[0x00, 0x40]); // trap 64
        b[6..8].copy_from_slice(&[0x00, 0x01]); // issuer LID 1
        b[8..10].copy_from_slice(&[0x80, 0x02]); // toggle, count 2
        b[16..32].copy_from_slice(&[
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
        ]); // GID
        let n = Notice::parse(&b).unwrap();
        assert_eq!(n.trap_number, 64);
        assert_eq!(n.producer_type, 4);
        assert_eq!(n.count, 2);
        assert_eq!(
            n.trap_gid().unwrap().to_string(),
            Gid(b[16..32].try_into().unwrap()).to_string()
        );
        let mut out = [0u8; 80];
        n.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn bad_pkey_trap_details() {
        // Trap 257 data details as Linux's ib_mad_notice_attr lays out
        // ntc_257_258 (reserved, lid1, lid2, key, sl_qp1, qp2, gid1, gid2).
        let mut d = [0u8; 54];
        d[2..4].copy_from_slice(&[0x00, 0x05]); // LID1 5
        d[4..6].copy_from_slice(&[0x00, 0x07]); // LID2 7
        d[6..10].copy_from_slice(&[0x00, 0x00, 0x7f, 0xff]); // P_Key 0x7fff
        d[10..14].copy_from_slice(&[0x30, 0x00, 0x00, 0x01]); // SL 3, QP1 1
        d[14..18].copy_from_slice(&[0x00, 0x00, 0x01, 0x23]); // QP2 0x123
        d[18..34].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]); // GID1
        d[34..50].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]); // GID2
        let t = BadKeyTrap::parse(&d);
        assert_eq!(
            (t.lid1, t.lid2, t.key, t.sl, t.qp1, t.qp2),
            (5, 7, 0x7fff, 3, 1, 0x123)
        );
        assert_eq!((t.gid1.0[15], t.gid2.0[15]), (1, 2));
        assert_eq!(t.emit(), d);
    }

    #[test]
    fn port_info_pkey_violations() {
        let mut b = [0u8; 64];
        b[46..48].copy_from_slice(&[0x00, 0x2a]); // P_KeyViolations 42
        assert_eq!(PortInfo::new_checked(&b[..]).unwrap().pkey_violations(), 42);
        let mut c = [0u8; 64];
        PortInfo::new_checked(&mut c[..])
            .unwrap()
            .set_pkey_violations(42);
        assert_eq!(c, b);
    }
}
