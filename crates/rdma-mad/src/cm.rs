//! Communication management messages (IBA 12.6) and the RDMA CM
//! private-data header and service IDs (IBA Annex A11).
//!
//! Each message is a `Repr` over the 232 bytes of MAD data after the common
//! header ([`crate::mad::Mad::data`]). Bit positions count from the most
//! significant bit of each byte, as in IBA 12.6 tables 99-110.

use crate::bytes::*;
use crate::mad::{Mad, MadHeaderRepr, Method, MgmtClass, DATA_LEN, MAD_SIZE};
use crate::{check_len, Error, Result};
use rdma_types::{Gid, Guid, Pkey, Psn, Qkey, Qpn};

/// CM class version used by Linux and IBA 1.2+.
pub const CM_CLASS_VERSION: u8 = 2;

open_enum! {
    /// CM attribute IDs (IBA 12.6.1, table 98).
    pub enum CmAttr(u16) {
        /// ClassPortInfo.
        ClassPortInfo = 0x0001 => "ClassPortInfo",
        /// Connection request.
        Req = 0x0010 => "REQ",
        /// Message receipt acknowledgement.
        Mra = 0x0011 => "MRA",
        /// Reject.
        Rej = 0x0012 => "REJ",
        /// Reply to request.
        Rep = 0x0013 => "REP",
        /// Ready to use.
        Rtu = 0x0014 => "RTU",
        /// Disconnection request.
        Dreq = 0x0015 => "DREQ",
        /// Disconnection reply.
        Drep = 0x0016 => "DREP",
        /// Service ID resolution request.
        SidrReq = 0x0017 => "SIDR_REQ",
        /// Service ID resolution reply.
        SidrRep = 0x0018 => "SIDR_REP",
        /// Load alternate path.
        Lap = 0x0019 => "LAP",
        /// Alternate path response.
        Apr = 0x001A => "APR",
    }
}

open_enum! {
    /// REJ reason codes (IBA 12.6.7.2, table 104; Linux `ib_cm_rej_reason`).
    pub enum RejReason(u16) {
        /// No QP available.
        NoQp = 1 => "no QP available",
        /// No EEC available.
        NoEec = 2 => "no EEC available",
        /// No resources available.
        NoResources = 3 => "insufficient resources",
        /// Timeout.
        Timeout = 4 => "timeout",
        /// Unsupported request.
        Unsupported = 5 => "unsupported request",
        /// Invalid communication ID.
        InvalidCommId = 6 => "invalid communication ID",
        /// Invalid communication instance.
        InvalidCommInstance = 7 => "invalid communication instance",
        /// Invalid service ID.
        InvalidServiceId = 8 => "invalid service ID",
        /// Invalid transport service type.
        InvalidTransportType = 9 => "invalid transport service type",
        /// Stale connection.
        StaleConn = 10 => "stale connection",
        /// RDC does not exist.
        RdcNotExist = 11 => "RDC does not exist",
        /// Primary remote GID rejected.
        InvalidGid = 12 => "primary remote port GID rejected",
        /// Primary remote LID rejected.
        InvalidLid = 13 => "primary remote port LID rejected",
        /// Invalid primary SL.
        InvalidSl = 14 => "invalid primary SL",
        /// Invalid primary traffic class.
        InvalidTrafficClass = 15 => "invalid primary traffic class",
        /// Invalid primary hop limit.
        InvalidHopLimit = 16 => "invalid primary hop limit",
        /// Invalid primary packet rate.
        InvalidPacketRate = 17 => "invalid primary packet rate",
        /// Alternate remote GID rejected.
        InvalidAltGid = 18 => "alternate remote port GID rejected",
        /// Alternate remote LID rejected.
        InvalidAltLid = 19 => "alternate remote port LID rejected",
        /// Invalid alternate SL.
        InvalidAltSl = 20 => "invalid alternate SL",
        /// Invalid alternate traffic class.
        InvalidAltTrafficClass = 21 => "invalid alternate traffic class",
        /// Invalid alternate hop limit.
        InvalidAltHopLimit = 22 => "invalid alternate hop limit",
        /// Invalid alternate packet rate.
        InvalidAltPacketRate = 23 => "invalid alternate packet rate",
        /// Port CM redirection.
        PortCmRedirect = 24 => "port CM redirection",
        /// Port redirection.
        PortRedirect = 25 => "port redirection",
        /// Invalid path MTU.
        InvalidMtu = 26 => "invalid path MTU",
        /// Insufficient responder resources.
        InsufficientRespResources = 27 => "insufficient responder resources",
        /// Consumer defined (reason in private data).
        ConsumerDefined = 28 => "consumer defined",
        /// Invalid RNR retry count.
        InvalidRnrRetry = 29 => "invalid RNR retry count",
        /// Duplicate local communication ID.
        DuplicateLocalCommId = 30 => "duplicate local communication ID",
        /// Unsupported class version.
        InvalidClassVersion = 31 => "unsupported class version",
        /// Invalid primary flow label.
        InvalidFlowLabel = 32 => "invalid primary flow label",
        /// Invalid alternate flow label.
        InvalidAltFlowLabel = 33 => "invalid alternate flow label",
        /// Vendor option not supported.
        VendorOptionNotSupported = 35 => "vendor option not supported",
    }
}

/// Which message a REJ or MRA refers to (IBA 12.6.6, 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgRef {
    /// REQ (0).
    Req,
    /// REP (1).
    Rep,
    /// LAP (2) for MRA; "other" for REJ.
    Other,
    /// Reserved (3).
    Reserved,
}

impl MsgRef {
    fn from_bits(v: u8) -> MsgRef {
        match v & 3 {
            0 => MsgRef::Req,
            1 => MsgRef::Rep,
            2 => MsgRef::Other,
            _ => MsgRef::Reserved,
        }
    }
    fn bits(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
            MsgRef::Reserved => 3,
        }
    }
}

/// One path in a REQ (primary or alternate), IBA 12.6.5 table 99.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmPath {
    /// Local port LID (0xFFFF on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// 6-bit packet rate.
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// 4-bit service level.
    pub sl: u8,
    /// Subnet local bit.
    pub subnet_local: bool,
    /// 5-bit local ACK timeout exponent.
    pub local_ack_timeout: u8,
}

impl CmPath {
    fn parse(b: &[u8], off: usize) -> CmPath {
        let fl = u32_at(b, off + 36);
        CmPath {
            local_lid: u16_at(b, off),
            remote_lid: u16_at(b, off + 2),
            local_gid: Gid(b[off + 4..off + 20].try_into().unwrap()),
            remote_gid: Gid(b[off + 20..off + 36].try_into().unwrap()),
            flow_label: fl >> 12,
            packet_rate: (fl & 0x3f) as u8,
            traffic_class: b[off + 40],
            hop_limit: b[off + 41],
            sl: bits(b, off + 42, 4, 4),
            subnet_local: bits(b, off + 42, 3, 1) != 0,
            local_ack_timeout: bits(b, off + 43, 3, 5),
        }
    }

    fn emit(&self, b: &mut [u8], off: usize) {
        put_u16(b, off, self.local_lid);
        put_u16(b, off + 2, self.remote_lid);
        b[off + 4..off + 20].copy_from_slice(&self.local_gid.0);
        b[off + 20..off + 36].copy_from_slice(&self.remote_gid.0);
        put_u32(
            b,
            off + 36,
            ((self.flow_label & 0xF_FFFF) << 12) | (self.packet_rate as u32 & 0x3f),
        );
        b[off + 40] = self.traffic_class;
        b[off + 41] = self.hop_limit;
        put_bits(b, off + 42, 4, 4, self.sl);
        put_bits(b, off + 42, 3, 1, self.subnet_local as u8);
        put_bits(b, off + 43, 3, 5, self.local_ack_timeout);
    }

    /// True when every field is zero (no alternate path).
    fn is_empty(&self) -> bool {
        self.local_lid == 0
            && self.remote_lid == 0
            && self.local_gid.0 == [0; 16]
            && self.remote_gid.0 == [0; 16]
            && self.flow_label == 0
            && self.packet_rate == 0
            && self.traffic_class == 0
            && self.hop_limit == 0
            && self.sl == 0
            && !self.subnet_local
            && self.local_ack_timeout == 0
    }
}

/// Private data lengths (IBA 12.6, Linux `IB_CM_*_PRIVATE_DATA_SIZE`).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
    /// REJ additional rejection information.
    pub const REJ_ARI: usize = 72;
}

/// REQ (IBA 12.6.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: Guid,
    /// Local Q_Key.
    pub local_qkey: Qkey,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5-bit exponent).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD, 3 extended).
    pub transport_type: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Local CM response timeout (5-bit exponent).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: Pkey,
    /// Path MTU code (4 bits, IBA: 1=256 .. 5=4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: CmPath,
    /// Alternate path, absent when all its fields are zero.
    pub alternate_path: Option<CmPath>,
    /// Private data.
    pub private_data: [u8; private_len::REQ],
}

impl ReqRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(ReqRepr {
            local_comm_id: u32_at(b, 0),
            service_id: u64_at(b, 8),
            local_ca_guid: Guid(u64_at(b, 16)),
            local_qkey: Qkey(u32_at(b, 28)),
            local_qpn: Qpn::from_bits(u24_at(b, 32)),
            responder_resources: b[35],
            local_eecn: u24_at(b, 36),
            initiator_depth: b[39],
            remote_eecn: u24_at(b, 40),
            remote_cm_response_timeout: bits(b, 43, 3, 5),
            transport_type: bits(b, 43, 1, 2),
            flow_control: bits(b, 43, 0, 1) != 0,
            starting_psn: Psn::new(u24_at(b, 44)),
            local_cm_response_timeout: bits(b, 47, 3, 5),
            retry_count: bits(b, 47, 0, 3),
            pkey: Pkey(u16_at(b, 48)),
            path_mtu: bits(b, 50, 4, 4),
            rdc_exists: bits(b, 50, 3, 1) != 0,
            rnr_retry_count: bits(b, 50, 0, 3),
            max_cm_retries: bits(b, 51, 4, 4),
            srq: bits(b, 51, 3, 1) != 0,
            extended_transport_type: bits(b, 51, 0, 3),
            primary_path: CmPath::parse(b, 52),
            alternate_path: Some(CmPath::parse(b, 96)).filter(|p| !p.is_empty()),
            private_data: b[140..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data (reserved fields zero).
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.local_comm_id);
        put_u64(b, 8, self.service_id);
        put_u64(b, 16, self.local_ca_guid.0);
        put_u32(b, 28, self.local_qkey.0);
        put_u32(
            b,
            32,
            (self.local_qpn.value() << 8) | self.responder_resources as u32,
        );
        put_u32(b, 36, (self.local_eecn << 8) | self.initiator_depth as u32);
        put_u24(b, 40, self.remote_eecn);
        put_bits(b, 43, 3, 5, self.remote_cm_response_timeout);
        put_bits(b, 43, 1, 2, self.transport_type);
        put_bits(b, 43, 0, 1, self.flow_control as u8);
        put_u24(b, 44, self.starting_psn.value());
        put_bits(b, 47, 3, 5, self.local_cm_response_timeout);
        put_bits(b, 47, 0, 3, self.retry_count);
        put_u16(b, 48, self.pkey.0);
        put_bits(b, 50, 4, 4, self.path_mtu);
        put_bits(b, 50, 3, 1, self.rdc_exists as u8);
        put_bits(b, 50, 0, 3, self.rnr_retry_count);
        put_bits(b, 51, 4, 4, self.max_cm_retries);
        put_bits(b, 51, 3, 1, self.srq as u8);
        put_bits(b, 51, 0, 3, self.extended_transport_type);
        self.primary_path.emit(b, 52);
        if let Some(p) = &self.alternate_path {
            p.emit(b, 96);
        }
        b[140..232].copy_from_slice(&self.private_data);
    }
}

/// REP (IBA 12.6.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: Qkey,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: Guid,
    /// Private data.
    pub private_data: [u8; private_len::REP],
}

impl RepRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(RepRepr {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            local_qkey: Qkey(u32_at(b, 8)),
            local_qpn: Qpn::from_bits(u24_at(b, 12)),
            local_eecn: u24_at(b, 16),
            starting_psn: Psn::new(u24_at(b, 20)),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: bits(b, 26, 3, 5),
            failover_accepted: bits(b, 26, 1, 2),
            flow_control: bits(b, 26, 0, 1) != 0,
            rnr_retry_count: bits(b, 27, 5, 3),
            srq: bits(b, 27, 4, 1) != 0,
            local_ca_guid: Guid(u64_at(b, 28)),
            private_data: b[36..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_u32(b, 8, self.local_qkey.0);
        put_u24(b, 12, self.local_qpn.value());
        put_u24(b, 16, self.local_eecn);
        put_u24(b, 20, self.starting_psn.value());
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        put_bits(b, 26, 3, 5, self.target_ack_delay);
        put_bits(b, 26, 1, 2, self.failover_accepted);
        put_bits(b, 26, 0, 1, self.flow_control as u8);
        put_bits(b, 27, 5, 3, self.rnr_retry_count);
        put_bits(b, 27, 4, 1, self.srq as u8);
        put_u64(b, 28, self.local_ca_guid.0);
        b[36..232].copy_from_slice(&self.private_data);
    }
}

/// REJ (IBA 12.6.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MsgRef,
    /// Length of the used part of `ari` (7 bits).
    pub reject_info_len: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional rejection information.
    pub ari: [u8; private_len::REJ_ARI],
    /// Private data.
    pub private_data: [u8; private_len::REJ],
}

impl RejRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(RejRepr {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            message_rejected: MsgRef::from_bits(bits(b, 8, 6, 2)),
            reject_info_len: bits(b, 9, 1, 7),
            reason: RejReason::from(u16_at(b, 10)),
            ari: b[12..84].try_into().unwrap(),
            private_data: b[84..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_bits(b, 8, 6, 2, self.message_rejected.bits());
        put_bits(b, 9, 1, 7, self.reject_info_len);
        put_u16(b, 10, self.reason.into());
        b[12..84].copy_from_slice(&self.ari);
        b[84..232].copy_from_slice(&self.private_data);
    }

    /// The used part of the ARI (length clamped to 72).
    pub fn ari_used(&self) -> &[u8] {
        &self.ari[..(self.reject_info_len as usize).min(private_len::REJ_ARI)]
    }
}

/// MRA (IBA 12.6.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (REQ, REP, LAP).
    pub message_mraed: MsgRef,
    /// Service timeout exponent (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; private_len::MRA],
}

impl MraRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(MraRepr {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            message_mraed: MsgRef::from_bits(bits(b, 8, 6, 2)),
            service_timeout: bits(b, 9, 3, 5),
            private_data: b[10..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_bits(b, 8, 6, 2, self.message_mraed.bits());
        put_bits(b, 9, 3, 5, self.service_timeout);
        b[10..232].copy_from_slice(&self.private_data);
    }
}

/// RTU (IBA 12.6.9) and DREP (IBA 12.6.11): two IDs and 224 bytes of private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdsRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; private_len::RTU],
}

impl IdsRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(IdsRepr {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            private_data: b[8..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        b[8..232].copy_from_slice(&self.private_data);
    }
}

/// DREQ (IBA 12.6.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN or EECN.
    pub remote_qpn: Qpn,
    /// Private data.
    pub private_data: [u8; private_len::DREQ],
}

impl DreqRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(DreqRepr {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            remote_qpn: Qpn::from_bits(u24_at(b, 8)),
            private_data: b[12..232].try_into().unwrap(),
        })
    }

    /// Bytes of MAD data written by `emit`.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_u24(b, 8, self.remote_qpn.value());
        b[12..232].copy_from_slice(&self.private_data);
    }
}

/// SIDR_REQ (IBA 12.11.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: Pkey,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; private_len::SIDR_REQ],
}

impl SidrReqRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(SidrReqRepr {
            request_id: u32_at(b, 0),
            pkey: Pkey(u16_at(b, 4)),
            service_id: u64_at(b, 8),
            private_data: b[16..232].try_into().unwrap(),
        })
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.request_id);
        put_u16(b, 4, self.pkey.0);
        put_u64(b, 8, self.service_id);
        b[16..232].copy_from_slice(&self.private_data);
    }
}

/// SIDR_REP (IBA 12.11.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status (0 valid, 1 service ID not supported, 2 rejected, 3 no QP, 4 redirect, 5 bad class version).
    pub status: u8,
    /// Additional information length.
    pub add_info_len: u8,
    /// QPN.
    pub qpn: Qpn,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: Qkey,
    /// Additional information (ClassPortInfo on redirect).
    pub add_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; private_len::SIDR_REP],
}

impl SidrRepRepr {
    /// Parses the 232 bytes of MAD data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, DATA_LEN)?;
        Ok(SidrRepRepr {
            request_id: u32_at(b, 0),
            status: b[4],
            add_info_len: b[5],
            qpn: Qpn::from_bits(u24_at(b, 8)),
            service_id: u64_at(b, 12),
            qkey: Qkey(u32_at(b, 20)),
            add_info: b[24..96].try_into().unwrap(),
            private_data: b[96..232].try_into().unwrap(),
        })
    }

    /// Writes the 232 bytes of MAD data.
    pub fn emit(&self, b: &mut [u8]) {
        b[..DATA_LEN].fill(0);
        put_u32(b, 0, self.request_id);
        b[4] = self.status;
        b[5] = self.add_info_len;
        put_u24(b, 8, self.qpn.value());
        put_u64(b, 12, self.service_id);
        put_u32(b, 20, self.qkey.0);
        b[24..96].copy_from_slice(&self.add_info);
        b[96..232].copy_from_slice(&self.private_data);
    }
}

/// A CM message decoded from a whole MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ.
    Req(Box<ReqRepr>),
    /// MRA.
    Mra(Box<MraRepr>),
    /// REJ.
    Rej(Box<RejRepr>),
    /// REP.
    Rep(Box<RepRepr>),
    /// RTU.
    Rtu(Box<IdsRepr>),
    /// DREQ.
    Dreq(Box<DreqRepr>),
    /// DREP.
    Drep(Box<IdsRepr>),
    /// SIDR_REQ.
    SidrReq(Box<SidrReqRepr>),
    /// SIDR_REP.
    SidrRep(Box<SidrRepRepr>),
    /// Any other attribute (LAP, APR, ClassPortInfo, unknown), raw data.
    Other(Box<[u8; DATA_LEN]>),
}

/// A CM MAD: the common header plus a decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMadRepr {
    /// The common header.
    pub header: MadHeaderRepr,
    /// The message.
    pub message: CmMessage,
}

impl CmMadRepr {
    /// Parses a 256-byte CM MAD; other classes are [`Error::WrongKind`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mad = Mad::new_checked(bytes)?;
        if mad.mgmt_class() != MgmtClass::Cm {
            return Err(Error::WrongKind { expected: "CM MAD" });
        }
        let header = MadHeaderRepr::parse(&mad)?;
        let d = mad.data();
        let message = match CmAttr::from(header.attr_id) {
            CmAttr::Req => CmMessage::Req(Box::new(ReqRepr::parse(d)?)),
            CmAttr::Mra => CmMessage::Mra(Box::new(MraRepr::parse(d)?)),
            CmAttr::Rej => CmMessage::Rej(Box::new(RejRepr::parse(d)?)),
            CmAttr::Rep => CmMessage::Rep(Box::new(RepRepr::parse(d)?)),
            CmAttr::Rtu => CmMessage::Rtu(Box::new(IdsRepr::parse(d)?)),
            CmAttr::Dreq => CmMessage::Dreq(Box::new(DreqRepr::parse(d)?)),
            CmAttr::Drep => CmMessage::Drep(Box::new(IdsRepr::parse(d)?)),
            CmAttr::SidrReq => CmMessage::SidrReq(Box::new(SidrReqRepr::parse(d)?)),
            CmAttr::SidrRep => CmMessage::SidrRep(Box::new(SidrRepRepr::parse(d)?)),
            _ => CmMessage::Other(Box::new(d.try_into().unwrap())),
        };
        Ok(CmMadRepr { header, message })
    }

    /// A header for a CM Send MAD of the given attribute.
    pub fn header_for(attr: CmAttr, tid: u64) -> MadHeaderRepr {
        MadHeaderRepr::new(
            MgmtClass::Cm,
            CM_CLASS_VERSION,
            Method::Send,
            tid,
            attr.into(),
        )
    }

    /// Always 256.
    pub const fn buffer_len(&self) -> usize {
        MAD_SIZE
    }

    /// Writes the whole MAD.
    pub fn emit(&self, buf: &mut [u8; MAD_SIZE]) {
        self.header.emit(buf);
        let d = &mut buf[24..];
        match &self.message {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
            CmMessage::Other(raw) => d.copy_from_slice(&raw[..]),
        }
    }

    /// The 256 bytes.
    pub fn to_bytes(&self) -> [u8; MAD_SIZE] {
        let mut b = [0u8; MAD_SIZE];
        self.emit(&mut b);
        b
    }
}

/// RDMA CM port spaces (Linux `rdma_ucm_port_space`).
pub mod port_space {
    /// TCP-like (RC).
    pub const TCP: u8 = 0x06;
    /// UDP-like (UD).
    pub const UDP: u8 = 0x11;
    /// IPoIB.
    pub const IPOIB: u8 = 0x02;
    /// IB (no IP addressing header).
    pub const IB: u8 = 0x3F;
}

/// RDMA CM service ID for an IP port space: bytes 00 00 00 00 01, port space, port (IBA Annex A11.2).
pub fn rdma_cm_service_id(port_space: u8, port: u16) -> u64 {
    0x0000_0000_0100_0000 | (port_space as u64) << 16 | port as u64
}

/// Splits an RDMA CM service ID into (port space, port), or `None` if not of that form.
pub fn parse_rdma_cm_service_id(sid: u64) -> Option<(u8, u16)> {
    if sid >> 24 != 1 {
        return None;
    }
    Some(((sid >> 16) as u8, sid as u16))
}

/// Length of the RDMA CM private-data header (IBA Annex A11.5, Linux `cma_hdr`).
pub const CMA_HDR_LEN: usize = 36;

/// The RDMA CM IP addressing header at the start of REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdrRepr {
    /// CM version (0).
    pub cma_version: u8,
    /// IP version (4 or 6; upper nibble of byte 1).
    pub ip_version: u8,
    /// Source port.
    pub src_port: u16,
    /// Source address (IPv4 in the last 4 bytes for version 4).
    pub src_addr: [u8; 16],
    /// Destination address.
    pub dst_addr: [u8; 16],
}

impl CmaHdrRepr {
    /// Parses the first 36 bytes of private data.
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len(b, CMA_HDR_LEN)?;
        let ip_version = b[1] >> 4;
        if ip_version != 4 && ip_version != 6 {
            return Err(Error::Malformed {
                what: "cma_hdr IP version",
                value: ip_version as u64,
            });
        }
        Ok(CmaHdrRepr {
            cma_version: b[0],
            ip_version,
            src_port: u16_at(b, 2),
            src_addr: b[4..20].try_into().unwrap(),
            dst_addr: b[20..36].try_into().unwrap(),
        })
    }

    /// Always 36.
    pub const fn buffer_len(&self) -> usize {
        CMA_HDR_LEN
    }

    /// Writes 36 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.cma_version;
        b[1] = self.ip_version << 4;
        put_u16(b, 2, self.src_port);
        b[4..20].copy_from_slice(&self.src_addr);
        b[20..36].copy_from_slice(&self.dst_addr);
    }

    /// Source address as an IP address.
    pub fn src_ip(&self) -> std::net::IpAddr {
        ip_of(self.ip_version, &self.src_addr)
    }

    /// Destination address as an IP address.
    pub fn dst_ip(&self) -> std::net::IpAddr {
        ip_of(self.ip_version, &self.dst_addr)
    }
}

fn ip_of(version: u8, a: &[u8; 16]) -> std::net::IpAddr {
    if version == 4 {
        std::net::Ipv4Addr::new(a[12], a[13], a[14], a[15]).into()
    } else {
        std::net::Ipv6Addr::from(*a).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_in_words() {
        assert_eq!(RejReason::from(28).to_string(), "consumer defined");
        assert_eq!(RejReason::from(10).to_string(), "stale connection");
        assert_eq!(RejReason::from(8).to_string(), "invalid service ID");
        assert_eq!(RejReason::from(34), RejReason::Unknown(34));
        for r in RejReason::ALL {
            assert_eq!(RejReason::from(u16::from(*r)), *r);
        }
    }

    #[test]
    fn service_ids() {
        // rping's default port 7174 in the TCP port space.
        assert_eq!(
            rdma_cm_service_id(port_space::TCP, 7174),
            0x0000_0000_0106_1c06
        );
        assert_eq!(
            parse_rdma_cm_service_id(0x0000_0000_0106_1c06),
            Some((6, 7174))
        );
        assert_eq!(parse_rdma_cm_service_id(0x0002_c903_0000_0001), None);
    }

    #[test]
    fn cma_hdr_vector() {
        let b: [u8; 36] = [
            0x00, // cma version 0
            0x40, // IP version 4
            0xc3, 0x50, // source port 50000
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1, // src 10.0.0.1
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2, // dst 10.0.0.2
        ];
        let h = CmaHdrRepr::parse(&b).unwrap();
        assert_eq!(h.src_port, 50000);
        assert_eq!(h.src_ip().to_string(), "10.0.0.1");
        assert_eq!(h.dst_ip().to_string(), "10.0.0.2");
        let mut out = [0u8; 36];
        h.emit(&mut out);
        assert_eq!(out, b);
        let mut bad = b;
        bad[1] = 0x50;
        assert!(CmaHdrRepr::parse(&bad).is_err());
    }

    #[test]
    fn rej_round_trip() {
        let mut pd = [0u8; private_len::REJ];
        pd[..4].copy_from_slice(b"nope");
        let m = CmMadRepr {
            header: CmMadRepr::header_for(CmAttr::Rej, 7),
            message: CmMessage::Rej(Box::new(RejRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_rejected: MsgRef::Req,
                reject_info_len: 0,
                reason: RejReason::ConsumerDefined,
                ari: [0; 72],
                private_data: pd,
            })),
        };
        let b = m.to_bytes();
        assert_eq!(&b[16..18], &[0x00, 0x12]); // attribute REJ
        assert_eq!(&b[34..36], &[0x00, 28]); // reason 28 at data offset 10
        assert_eq!(CmMadRepr::parse(&b).unwrap(), m);
    }
}
