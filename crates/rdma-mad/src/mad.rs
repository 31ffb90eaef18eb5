//! The common MAD header (IBA 13.4.2) and the 256-byte MAD.

use crate::bytes::*;
use crate::{check_len, Result};

/// Every MAD is 256 bytes (IBA 13.4.1).
pub const MAD_SIZE: usize = 256;
/// Length of the common header (IBA 13.4.2).
pub const HEADER_LEN: usize = 24;
/// Attribute data after the common header.
pub const DATA_LEN: usize = MAD_SIZE - HEADER_LEN;

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TID: usize = 8;
    pub const ATTR_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTR_MOD: usize = 20;
    pub const DATA: Range<usize> = 24..256;
}

open_enum! {
    /// Management class (IBA 13.4.4, table 114).
    pub enum MgmtClass(u8) {
        /// Subnet management, LID routed.
        SubnLid = 0x01 => "subnet management (LID routed)",
        /// Subnet administration.
        SubnAdm = 0x03 => "subnet administration",
        /// Performance management.
        PerfMgt = 0x04 => "performance management",
        /// Baseboard management.
        Bm = 0x05 => "baseboard management",
        /// Device management.
        DevMgt = 0x06 => "device management",
        /// Communication management.
        Cm = 0x07 => "communication management",
        /// SNMP tunneling.
        Snmp = 0x08 => "SNMP tunneling",
        /// Device administration.
        DevAdm = 0x10 => "device administration",
        /// Boot management.
        BootMgt = 0x11 => "boot management",
        /// Bus interface services.
        Bis = 0x12 => "BIS",
        /// Congestion control.
        CongMgt = 0x21 => "congestion control",
        /// Subnet management, directed route.
        SubnDirected = 0x81 => "subnet management (directed route)",
    }
}

impl MgmtClass {
    /// Vendor-specific classes: 0x09-0x0F (range 1) and 0x30-0x4F (range 2, with OUI).
    pub fn is_vendor(self) -> bool {
        matches!(u8::from(self), 0x09..=0x0F | 0x30..=0x4F)
    }

    /// Subnet management classes travel on QP0 (IBA 13.4.4).
    pub fn is_smp(self) -> bool {
        matches!(self, MgmtClass::SubnLid | MgmtClass::SubnDirected)
    }
}

open_enum! {
    /// Method, with the response bit (0x80) included (IBA 13.4.5, tables 115-116, 194).
    pub enum Method(u8) {
        /// Get.
        Get = 0x01 => "Get",
        /// Set.
        Set = 0x02 => "Set",
        /// Send.
        Send = 0x03 => "Send",
        /// Trap.
        Trap = 0x05 => "Trap",
        /// Report.
        Report = 0x06 => "Report",
        /// TrapRepress.
        TrapRepress = 0x07 => "TrapRepress",
        /// SA GetTable.
        GetTable = 0x12 => "GetTable",
        /// SA GetTraceTable.
        GetTraceTable = 0x13 => "GetTraceTable",
        /// SA GetMulti.
        GetMulti = 0x14 => "GetMulti",
        /// SA Delete.
        Delete = 0x15 => "Delete",
        /// GetResp.
        GetResp = 0x81 => "GetResp",
        /// ReportResp.
        ReportResp = 0x86 => "ReportResp",
        /// SA GetTableResp.
        GetTableResp = 0x92 => "GetTableResp",
        /// SA GetTraceTableResp.
        GetTraceTableResp = 0x93 => "GetTraceTableResp",
        /// SA GetMultiResp.
        GetMultiResp = 0x94 => "GetMultiResp",
        /// SA DeleteResp.
        DeleteResp = 0x95 => "DeleteResp",
    }
}

impl Method {
    /// The R bit: this method is a response.
    pub fn is_response(self) -> bool {
        u8::from(self) & 0x80 != 0
    }

    /// The response method for a request (sets the R bit; Set answers with GetResp).
    pub fn response(self) -> Method {
        match self {
            Method::Set => Method::GetResp,
            other => Method::from(u8::from(other) | 0x80),
        }
    }
}

open_enum! {
    /// The 3-bit code in status bits 2-4 (IBA 13.4.7, table 117).
    pub enum StatusCode(u8) {
        /// No invalid fields.
        Ok = 0 => "ok",
        /// Bad base or class version.
        BadVersion = 1 => "bad version",
        /// Method not supported.
        MethodUnsupported = 2 => "method unsupported",
        /// Method/attribute combination not supported.
        MethodAttrUnsupported = 3 => "method/attribute combination unsupported",
        /// Invalid value in an attribute or attribute modifier.
        InvalidAttrValue = 7 => "invalid attribute or modifier value",
    }
}

/// The MAD status word (IBA 13.4.7): busy, redirect, a code, class bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadStatus(pub u16);

impl MadStatus {
    /// Success.
    pub const OK: MadStatus = MadStatus(0);

    /// Builds a status from a code (no busy/redirect, no class bits).
    pub fn from_code(code: StatusCode) -> MadStatus {
        MadStatus(((u8::from(code) as u16) & 7) << 2)
    }

    /// Bit 0: the responder is busy, retry later.
    pub fn busy(self) -> bool {
        self.0 & 1 != 0
    }

    /// Bit 1: redirection required (ClassPortInfo follows).
    pub fn redirect(self) -> bool {
        self.0 & 2 != 0
    }

    /// Bits 2-4.
    pub fn code(self) -> StatusCode {
        StatusCode::from(((self.0 >> 2) & 7) as u8)
    }

    /// Bits 8-15: class-specific status.
    pub fn class_specific(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// True when nothing is set.
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
}

impl core::fmt::Display for MadStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.code())?;
        if self.busy() {
            f.write_str(", busy")?;
        }
        if self.redirect() {
            f.write_str(", redirect")?;
        }
        if self.class_specific() != 0 {
            write!(f, ", class-specific {:#04x}", self.class_specific())?;
        }
        Ok(())
    }
}

/// A view of a MAD: the common header and its attribute data.
#[derive(Debug, Clone)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps a buffer without checking (getters may panic if short).
    pub fn new_unchecked(buffer: T) -> Self {
        Mad { buffer }
    }

    /// Wraps a buffer of at least 256 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), MAD_SIZE)?;
        Ok(Mad { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Base version (1 for IBA MADs).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass::from(self.buffer.as_ref()[field::MGMT_CLASS])
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method including the R bit.
    pub fn method(&self) -> Method {
        Method::from(self.buffer.as_ref()[field::METHOD])
    }
    /// Status word (for directed-route SMPs bit 15 is the D bit: see [`crate::smp`]).
    pub fn status(&self) -> MadStatus {
        MadStatus(u16_at(self.buffer.as_ref(), field::STATUS))
    }
    /// Class-specific word (hop pointer/count for directed-route SMPs).
    pub fn class_specific(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::TID)
    }
    /// Attribute ID.
    pub fn attr_id(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::ATTR_ID)
    }
    /// Reserved word after the attribute ID.
    pub fn reserved(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::RESERVED)
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::ATTR_MOD)
    }
    /// The 232 bytes after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// The 232 bytes after the header, mutable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
    /// Sets the method (with its R bit).
    pub fn set_method(&mut self, m: Method) {
        self.buffer.as_mut()[field::METHOD] = m.into();
    }
    /// Sets the status word.
    pub fn set_status(&mut self, s: MadStatus) {
        put_u16(self.buffer.as_mut(), field::STATUS, s.0);
    }
    /// Sets the transaction ID.
    pub fn set_tid(&mut self, tid: u64) {
        put_u64(self.buffer.as_mut(), field::TID, tid);
    }
    /// Sets the attribute modifier.
    pub fn set_attr_mod(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), field::ATTR_MOD, v);
    }
}

/// The common header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: MgmtClass,
    /// Class version.
    pub class_version: u8,
    /// Method with R bit.
    pub method: Method,
    /// Status.
    pub status: MadStatus,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Reserved word (kept so re-emission is byte-identical).
    pub reserved: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// A header for a new request with base version 1 and status 0.
    pub fn new(
        mgmt_class: MgmtClass,
        class_version: u8,
        method: Method,
        tid: u64,
        attr_id: u16,
    ) -> Self {
        MadHeaderRepr {
            base_version: 1,
            mgmt_class,
            class_version,
            method,
            status: MadStatus::OK,
            class_specific: 0,
            tid,
            attr_id,
            reserved: 0,
            attr_mod: 0,
        }
    }

    /// Reads the header of a checked view.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> Result<Self> {
        Ok(MadHeaderRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            tid: mad.tid(),
            attr_id: mad.attr_id(),
            reserved: mad.reserved(),
            attr_mod: mad.attr_mod(),
        })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 24 header bytes at the start of `buf` (at least 24 bytes).
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::BASE_VERSION] = self.base_version;
        buf[field::MGMT_CLASS] = self.mgmt_class.into();
        buf[field::CLASS_VERSION] = self.class_version;
        buf[field::METHOD] = self.method.into();
        put_u16(buf, field::STATUS, self.status.0);
        put_u16(buf, field::CLASS_SPECIFIC, self.class_specific);
        put_u64(buf, field::TID, self.tid);
        put_u16(buf, field::ATTR_ID, self.attr_id);
        put_u16(buf, field::RESERVED, self.reserved);
        put_u32(buf, field::ATTR_MOD, self.attr_mod);
    }
}

/// A whole MAD: header plus raw attribute data (unknown attributes pass through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadRepr {
    /// The common header.
    pub header: MadHeaderRepr,
    /// The 232 bytes after the header.
    pub data: [u8; DATA_LEN],
}

impl MadRepr {
    /// Parses any 256-byte MAD; only the length is checked.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mad = Mad::new_checked(bytes)?;
        let mut data = [0u8; DATA_LEN];
        data.copy_from_slice(mad.data());
        Ok(MadRepr {
            header: MadHeaderRepr::parse(&mad)?,
            data,
        })
    }

    /// Always 256.
    pub const fn buffer_len(&self) -> usize {
        MAD_SIZE
    }

    /// Writes the 256 bytes.
    pub fn emit(&self, buf: &mut [u8; MAD_SIZE]) {
        self.header.emit(buf);
        buf[field::DATA].copy_from_slice(&self.data);
    }

    /// The 256 bytes as an array.
    pub fn to_bytes(&self) -> [u8; MAD_SIZE] {
        let mut b = [0u8; MAD_SIZE];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_write_what_the_getters_and_the_repr_read() {
        let mut buf = [0u8; MAD_SIZE];
        MadHeaderRepr::new(MgmtClass::SubnAdm, 2, Method::Get, 1, 0x0035).emit(&mut buf);
        let mut m = Mad::new_checked(&mut buf[..]).unwrap();
        m.set_method(Method::Get.response());
        m.set_status(MadStatus(0x000c));
        m.set_tid(0x0102_0304_0506_0708);
        m.set_attr_mod(0xdead_beef);
        let h = MadHeaderRepr::parse(&Mad::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(h.method, Method::Get.response());
        assert_eq!(h.status, MadStatus(0x000c));
        assert_eq!(h.tid, 0x0102_0304_0506_0708);
        assert_eq!(h.attr_mod, 0xdead_beef);
        assert_eq!(
            (h.mgmt_class, h.class_version, h.attr_id),
            (MgmtClass::SubnAdm, 2, 0x0035)
        );
        // Big-endian on the wire (IBA 13.4.2).
        assert_eq!(buf[4..6], [0x00, 0x0c]);
        assert_eq!(buf[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    // The common header of a CM REP from Linux rxe:
    // linux-rxe-rc-pingpong-and-rping.pcapng frame 102, first 24 bytes of
    // its MAD (testdata/mad/cm_mads.hex, which the test checks).
    #[test]
    fn header_vector() {
        let hdr: [u8; 24] = [
            0x01, // base version 1
            0x07, // class CM
            0x02, // class version 2
            0x03, // method Send
            0x00, 0x00, // status 0
            0x00, 0x00, // class specific
            0x00, 0x00, 0x00, 0x02, 0x24, 0xf5, 0x21, 0xd1, // TID
            0x00, 0x13, // attribute REP
            0x00, 0x00, // reserved
            0x00, 0x00, 0x00, 0x00, // attribute modifier
        ];
        let frame_102 = include_str!("../../../testdata/mad/cm_mads.hex")
            .lines()
            .find_map(|l| l.strip_prefix("linux-rxe-rc-pingpong-and-rping.pcapng 102 0x0013 "))
            .expect("frame 102 in testdata/mad/cm_mads.hex");
        let hex: String = hdr.iter().map(|b| format!("{b:02x}")).collect();
        assert!(frame_102.starts_with(&hex), "{frame_102}");
        let mut mad = [0u8; MAD_SIZE];
        mad[..24].copy_from_slice(&hdr);
        let repr = MadRepr::parse(&mad).unwrap();
        assert_eq!(repr.header.mgmt_class, MgmtClass::Cm);
        assert_eq!(repr.header.method, Method::Send);
        assert_eq!(repr.header.tid, 0x0000_0002_24f5_21d1);
        assert_eq!(repr.header.attr_id, 0x13);
        assert_eq!(repr.to_bytes(), mad);
    }

    #[test]
    fn status_words() {
        let s = MadStatus(0x0101 | (3 << 2));
        assert!(s.busy());
        assert!(!s.redirect());
        assert_eq!(s.code(), StatusCode::MethodAttrUnsupported);
        assert_eq!(s.class_specific(), 1);
        assert_eq!(
            s.to_string(),
            "method/attribute combination unsupported, busy, class-specific 0x01"
        );
        assert_eq!(MadStatus::from_code(StatusCode::InvalidAttrValue).0, 0x1c);
        assert_eq!(StatusCode::from(5).to_string(), "unknown (0x5)");
    }

    #[test]
    fn tables_round_trip() {
        for c in MgmtClass::ALL {
            assert_eq!(MgmtClass::from(u8::from(*c)), *c);
        }
        for m in Method::ALL {
            assert_eq!(Method::from(u8::from(*m)), *m);
        }
        assert_eq!(MgmtClass::from(0x0A), MgmtClass::Unknown(0x0A));
        assert!(MgmtClass::from(0x0A).is_vendor());
        assert_eq!(Method::Get.response(), Method::GetResp);
        assert_eq!(Method::Set.response(), Method::GetResp);
        assert_eq!(Method::GetTable.response(), Method::GetTableResp);
        assert!(Method::GetTableResp.is_response());
    }

    #[test]
    fn short_is_error() {
        assert!(MadRepr::parse(&[0u8; 255]).is_err());
    }
}
