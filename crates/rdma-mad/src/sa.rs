//! Subnet administration (IBA 15.2): the SA MAD header and records.

use crate::bytes::*;
use crate::mad::MAD_SIZE;
use crate::{check_len, Result};
use rdma_types::{Gid, Pkey, Qpn};

/// SA class version.
pub const SA_CLASS_VERSION: u8 = 2;
/// Length of common + RMPP + SA headers (Linux `IB_MGMT_SA_HDR`).
pub const SA_HDR_LEN: usize = 56;
/// SA data bytes per MAD.
pub const SA_DATA_LEN: usize = MAD_SIZE - SA_HDR_LEN;

/// SA status: the request is invalid (class-specific bits of the MAD
/// status, IBA 15.2.1.2).
pub const ERR_REQ_INVALID: u16 = 0x0200;
/// SA status: no records match (IBA 15.2.1.2).
pub const ERR_NO_RECORDS: u16 = 0x0300;

/// NodeRecord length on the wire (LID, reserved, NodeInfo, NodeDescription).
pub const NODE_RECORD_LEN: usize = 108;
/// PortInfoRecord length (LID, port, options, reserved, PortInfo).
pub const PORTINFO_RECORD_LEN: usize = 68;

/// PathRecord component mask bits (IBA 15.2.5.16).
pub mod path_comp {
    /// ServiceID.
    pub const SERVICE_ID: u64 = 0x3;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
}

/// NodeRecord component mask bits.
pub mod node_comp {
    /// LID.
    pub const LID: u64 = 1 << 0;
}

/// PortInfoRecord component mask bits (opensm's numbering).
pub mod portinfo_comp {
    /// End port LID.
    pub const LID: u64 = 1 << 0;
    /// Port number.
    pub const PORT_NUM: u64 = 1 << 1;
    /// PortInfo:CapabilityMask.
    pub const CAPMASK: u64 = 1 << 7;
}

/// ServiceRecord component mask bits (IBA 15.2.5.14).
pub mod service_comp {
    /// ServiceID.
    pub const ID: u64 = 1 << 0;
    /// ServiceGID.
    pub const GID: u64 = 1 << 1;
    /// ServiceP_Key.
    pub const PKEY: u64 = 1 << 2;
    /// ServiceName (one component for all 64 bytes; IBA 15.2.5.14, as
    /// Linux's `IB_SA_SERVICE_REC_SERVICE_NAME`).
    pub const NAME: u64 = 1 << 6;
}

open_enum! {
    /// SA attribute IDs (IBA 15.2.5, table 205).
    pub enum SaAttr(u16) {
        /// ClassPortInfo.
        ClassPortInfo = 0x0001 => "ClassPortInfo",
        /// Notice.
        Notice = 0x0002 => "Notice",
        /// InformInfo.
        InformInfo = 0x0003 => "InformInfo",
        /// NodeRecord.
        NodeRecord = 0x0011 => "NodeRecord",
        /// PortInfoRecord.
        PortInfoRecord = 0x0012 => "PortInfoRecord",
        /// SLtoVLMappingTableRecord.
        SlToVlRecord = 0x0013 => "SLtoVLMappingTableRecord",
        /// SwitchInfoRecord.
        SwitchInfoRecord = 0x0014 => "SwitchInfoRecord",
        /// LinearForwardingTableRecord.
        LftRecord = 0x0015 => "LinearForwardingTableRecord",
        /// MulticastForwardingTableRecord.
        MftRecord = 0x0017 => "MulticastForwardingTableRecord",
        /// SMInfoRecord.
        SmInfoRecord = 0x0018 => "SMInfoRecord",
        /// LinkRecord.
        LinkRecord = 0x0020 => "LinkRecord",
        /// GuidInfoRecord.
        GuidInfoRecord = 0x0030 => "GuidInfoRecord",
        /// ServiceRecord.
        ServiceRecord = 0x0031 => "ServiceRecord",
        /// P_KeyTableRecord.
        PkeyTableRecord = 0x0033 => "P_KeyTableRecord",
        /// PathRecord.
        PathRecord = 0x0035 => "PathRecord",
        /// VLArbitrationTableRecord.
        VlArbRecord = 0x0036 => "VLArbitrationTableRecord",
        /// MCMemberRecord.
        McMemberRecord = 0x0038 => "MCMemberRecord",
        /// TraceRecord.
        TraceRecord = 0x0039 => "TraceRecord",
        /// MultiPathRecord.
        MultiPathRecord = 0x003A => "MultiPathRecord",
        /// InformInfoRecord.
        InformInfoRecord = 0x00F3 => "InformInfoRecord",
    }
}

/// The SA class header after the RMPP header (IBA 15.2.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaHeader {
    /// SM_Key (zero unless trusted).
    pub sm_key: u64,
    /// Distance between records in 8-byte units (GetTable responses).
    pub attr_offset: u16,
    /// Reserved word (kept for byte-identical re-emission).
    pub reserved: u16,
    /// Component mask: which record fields a query matches on.
    pub comp_mask: u64,
}

impl SaHeader {
    /// Reads the SA header from a whole MAD.
    pub fn parse(mad: &[u8]) -> Result<Self> {
        check_len(mad, SA_HDR_LEN)?;
        Ok(SaHeader {
            sm_key: u64_at(mad, 36),
            attr_offset: u16_at(mad, 44),
            reserved: u16_at(mad, 46),
            comp_mask: u64_at(mad, 48),
        })
    }

    /// Writes the SA header into a whole MAD.
    pub fn emit(&self, mad: &mut [u8]) {
        put_u64(mad, 36, self.sm_key);
        put_u16(mad, 44, self.attr_offset);
        put_u16(mad, 46, self.reserved);
        put_u64(mad, 48, self.comp_mask);
    }

    /// Record length in bytes from `attr_offset`.
    pub fn record_len(&self) -> usize {
        self.attr_offset as usize * 8
    }
}

/// Splits GetTable response data into records of `attr_offset * 8` bytes.
pub fn records(data: &[u8], attr_offset: u16) -> impl Iterator<Item = &[u8]> {
    let len = (attr_offset as usize * 8).max(1);
    data.chunks_exact(len)
        .take(if attr_offset == 0 { 0 } else { usize::MAX })
}

/// PathRecord, 64 bytes (IBA 15.2.5.16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRecord {
    /// Service ID (IBA 1.2.1; reserved before).
    pub service_id: u64,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Raw traffic bit.
    pub raw_traffic: bool,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible bit.
    pub reversible: bool,
    /// Number of paths (7 bits).
    pub numb_path: u8,
    /// Partition key.
    pub pkey: Pkey,
    /// QoS class (12 bits).
    pub qos_class: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// MTU selector (2 bits).
    pub mtu_selector: u8,
    /// MTU code (6 bits).
    pub mtu: u8,
    /// Rate selector (2 bits).
    pub rate_selector: u8,
    /// Rate code (6 bits).
    pub rate: u8,
    /// Packet lifetime selector (2 bits).
    pub packet_life_selector: u8,
    /// Packet lifetime (6 bits).
    pub packet_life: u8,
    /// Preference.
    pub preference: u8,
}

impl PathRecord {
    /// Wire length.
    pub const LEN: usize = 64;

    /// Parses 64 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        let w = u32_at(b, 44);
        Ok(PathRecord {
            service_id: u64_at(b, 0),
            dgid: Gid(b[8..24].try_into().unwrap()),
            sgid: Gid(b[24..40].try_into().unwrap()),
            dlid: u16_at(b, 40),
            slid: u16_at(b, 42),
            raw_traffic: w >> 31 != 0,
            flow_label: (w >> 8) & 0xF_FFFF,
            hop_limit: w as u8,
            tclass: b[48],
            reversible: b[49] >> 7 != 0,
            numb_path: b[49] & 0x7f,
            pkey: Pkey(u16_at(b, 50)),
            qos_class: u16_at(b, 52) >> 4,
            sl: b[53] & 0xf,
            mtu_selector: b[54] >> 6,
            mtu: b[54] & 0x3f,
            rate_selector: b[55] >> 6,
            rate: b[55] & 0x3f,
            packet_life_selector: b[56] >> 6,
            packet_life: b[56] & 0x3f,
            preference: b[57],
        })
    }

    /// Always 64.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 64 bytes (reserved zero).
    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        put_u64(b, 0, self.service_id);
        b[8..24].copy_from_slice(&self.dgid.0);
        b[24..40].copy_from_slice(&self.sgid.0);
        put_u16(b, 40, self.dlid);
        put_u16(b, 42, self.slid);
        put_u32(
            b,
            44,
            (self.raw_traffic as u32) << 31
                | (self.flow_label & 0xF_FFFF) << 8
                | self.hop_limit as u32,
        );
        b[48] = self.tclass;
        b[49] = (self.reversible as u8) << 7 | (self.numb_path & 0x7f);
        put_u16(b, 50, self.pkey.0);
        put_u16(
            b,
            52,
            (self.qos_class & 0xfff) << 4 | (self.sl & 0xf) as u16,
        );
        b[54] = self.mtu_selector << 6 | (self.mtu & 0x3f);
        b[55] = self.rate_selector << 6 | (self.rate & 0x3f);
        b[56] = self.packet_life_selector << 6 | (self.packet_life & 0x3f);
        b[57] = self.preference;
    }
}

/// ServiceRecord, 176 bytes (IBA 15.2.5.14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    /// Service ID.
    pub service_id: u64,
    /// Service GID.
    pub service_gid: Gid,
    /// Service P_Key.
    pub service_pkey: Pkey,
    /// Lease in seconds (0xFFFFFFFF = indefinite).
    pub service_lease: u32,
    /// Service key.
    pub service_key: [u8; 16],
    /// Service name (NUL padded).
    pub service_name: [u8; 64],
    /// ServiceData8/16/32/64, 64 bytes.
    pub service_data: [u8; 64],
}

impl ServiceRecord {
    /// Wire length.
    pub const LEN: usize = 176;

    /// Parses 176 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(ServiceRecord {
            service_id: u64_at(b, 0),
            service_gid: Gid(b[8..24].try_into().unwrap()),
            service_pkey: Pkey(u16_at(b, 24)),
            service_lease: u32_at(b, 28),
            service_key: b[32..48].try_into().unwrap(),
            service_name: b[48..112].try_into().unwrap(),
            service_data: b[112..176].try_into().unwrap(),
        })
    }

    /// Always 176.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 176 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        put_u64(b, 0, self.service_id);
        b[8..24].copy_from_slice(&self.service_gid.0);
        put_u16(b, 24, self.service_pkey.0);
        put_u32(b, 28, self.service_lease);
        b[32..48].copy_from_slice(&self.service_key);
        b[48..112].copy_from_slice(&self.service_name);
        b[112..176].copy_from_slice(&self.service_data);
    }

    /// The name up to its first NUL, lossily as UTF-8.
    pub fn name(&self) -> String {
        let end = self.service_name.iter().position(|&c| c == 0).unwrap_or(64);
        String::from_utf8_lossy(&self.service_name[..end]).into_owned()
    }
}

/// InformInfo, 36 bytes (IBA 13.4.8.3): subscribe to traps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InformInfo {
    /// GID of the port to watch (zero: use the LID range).
    pub gid: Gid,
    /// LID range begin (0xFFFF: all).
    pub lid_range_begin: u16,
    /// LID range end.
    pub lid_range_end: u16,
    /// Generic (1) or vendor-specific (0).
    pub is_generic: u8,
    /// Subscribe (1) or unsubscribe (0).
    pub subscribe: u8,
    /// Trap type (0xFFFF: all).
    pub trap_type: u16,
    /// Trap number (generic) or device ID.
    pub trap_number: u16,
    /// QPN to report to.
    pub qpn: Qpn,
    /// Response time value (5 bits).
    pub resp_time_value: u8,
    /// Producer type or vendor ID (24 bits).
    pub producer_type: u32,
}

impl InformInfo {
    /// Wire length.
    pub const LEN: usize = 36;

    /// Parses 36 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, Self::LEN)?;
        Ok(InformInfo {
            gid: Gid(b[0..16].try_into().unwrap()),
            lid_range_begin: u16_at(b, 16),
            lid_range_end: u16_at(b, 18),
            is_generic: b[22],
            subscribe: b[23],
            trap_type: u16_at(b, 24),
            trap_number: u16_at(b, 26),
            qpn: Qpn::from_bits(u24_at(b, 28)),
            resp_time_value: b[31] & 0x1f,
            producer_type: u32_at(b, 32) & 0xFF_FFFF,
        })
    }

    /// Always 36.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes 36 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        b[0..16].copy_from_slice(&self.gid.0);
        put_u16(b, 16, self.lid_range_begin);
        put_u16(b, 18, self.lid_range_end);
        b[22] = self.is_generic;
        b[23] = self.subscribe;
        put_u16(b, 24, self.trap_type);
        put_u16(b, 26, self.trap_number);
        put_u32(
            b,
            28,
            self.qpn.value() << 8 | (self.resp_time_value & 0x1f) as u32,
        );
        put_u32(b, 32, self.producer_type & 0xFF_FFFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-made from IBA 15.2.5.16: a RoCE path 10.0.0.1 -> 10.0.0.2.
    #[test]
    fn path_record_vector() {
        let b: [u8; 64] = [
            0, 0, 0, 0, 0, 0, 0, 0, // service ID 0
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2, // DGID ::ffff:10.0.0.2
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1, // SGID ::ffff:10.0.0.1
            0x00, 0x05, // DLID 5
            0x00, 0x04, // SLID 4
            0x80, 0x12, 0x34, 0x40, // raw traffic 1, flow label 0x01234, hop limit 64
            0x00, // traffic class 0
            0x81, // reversible, numb path 1
            0xff, 0xff, // P_Key default
            0x00, 0x03, // QoS class 0, SL 3
            0x83, // MTU selector 2 (exactly), MTU 3 (1024)
            0x87, // rate selector 2, rate 7 (40 Gb/s)
            0x92, // packet life selector 2, life 18
            0x00, // preference
            0, 0, 0, 0, 0, 0, // reserved
        ];
        let p = PathRecord::parse(&b).unwrap();
        assert_eq!(p.dlid, 5);
        assert!(p.raw_traffic);
        assert_eq!(p.flow_label, 0x01234);
        assert_eq!(p.hop_limit, 64);
        assert!(p.reversible);
        assert_eq!(p.sl, 3);
        assert_eq!((p.mtu_selector, p.mtu), (2, 3));
        assert_eq!((p.rate_selector, p.rate), (2, 7));
        assert_eq!(p.packet_life, 18);
        let mut out = [0u8; 64];
        p.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn inform_info_vector() {
        let mut b = [0u8; 36];
        b[16..18].copy_from_slice(&[0xff, 0xff]); // LID range begin: all
        b[22] = 1; // generic
        b[23] = 1; // subscribe
        b[24..26].copy_from_slice(&[0xff, 0xff]); // all types
        b[26..28].copy_from_slice(&[0x00, 0x40]); // trap 64 (GID in service)
        b[28..32].copy_from_slice(&[0x00, 0x00, 0x01, 0x12]); // QPN 1, resp time 18
        b[33..36].copy_from_slice(&[0xff, 0xff, 0xff]); // producer: all
        let i = InformInfo::parse(&b).unwrap();
        assert_eq!(i.trap_number, 64);
        assert_eq!(i.qpn.value(), 1);
        assert_eq!(i.resp_time_value, 18);
        let mut out = [0u8; 36];
        i.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn records_split() {
        let data = [0u8; 200];
        assert_eq!(records(&data, 8).count(), 3);
        assert_eq!(records(&data, 0).count(), 0);
    }
}
