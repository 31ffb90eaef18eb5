//! The subnet administration client (IBA 15): path, node, port and service
//! queries to the SA, and event subscriptions whose notices arrive as
//! Report MADs.
//!
//! The protocol half is sans-IO: request builders ([`path_request`],
//! [`node_request`], [`port_info_request`], [`service_request`],
//! [`inform_info_request`]) return a MAD with the SA header and the record
//! the component mask selects on; [`records`] reads a response (a Get's
//! one record, or a GetTable's RMPP-reassembled table cut at the response's
//! attribute offset); [`report_response`] is the ReportResp a Report
//! deserves. The formats are `rdma_mad::sa`'s, so the client speaks to the
//! project's SA (`ib-sm`) and to opensm alike.
//!
//! [`SaClient`] drives it on a port's QP1: it registers the SA class
//! (version 2) for Report, so one client per port; queries block until the
//! response (GetTable responses larger than a MAD come whole, the
//! dispatcher reassembles and acknowledges their segments) or the last
//! retry. Notices are answered with a ReportResp on the client's own thread
//! as they come (a Report resent because our answer was lost is answered
//! again but delivered once) and handed out by [`SaClient::notices`].

use crate::agent::{CmAgent, CmError, MadAgent, MadWait};
use crate::gsi::{status_reply, MadBytes};
use rdma_mad::mad::{MadHeaderRepr, MadStatus, Method, MgmtClass, StatusCode, MAD_SIZE};
use rdma_mad::sa::{
    InformInfo, PathRecord, SaAttr, SaHeader, ServiceRecord, SA_CLASS_VERSION, SA_HDR_LEN,
};
use rdma_mad::smp::{NodeInfo, Notice, PortInfo};
use rdma_types::{Gid, Pkey, Qpn};
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

/// The SA management class.
pub const SA_CLASS: u8 = 0x03;
pub use rdma_mad::sa::{
    node_comp, path_comp, portinfo_comp, service_comp, ERR_NO_RECORDS, NODE_RECORD_LEN,
    PORTINFO_RECORD_LEN,
};

/// Why a query failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaError {
    /// No answer, or the port is gone.
    #[error("SA query: {0}")]
    Port(#[from] CmError),
    /// The SA answered with a status other than success or "no records".
    #[error("SA answered status {0:#06x}")]
    Status(u16),
    /// The response does not parse.
    #[error("SA response malformed: {0}")]
    Malformed(String),
}

/// A NodeRecord.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's base LID.
    pub lid: u16,
    /// Its NodeInfo.
    pub info: NodeInfo,
    /// NodeDescription, up to the first NUL.
    pub description: String,
}

impl NodeRecord {
    /// Parses the 108-byte record.
    ///
    /// # Errors
    /// Too short.
    pub fn parse(b: &[u8]) -> Result<NodeRecord, rdma_mad::Error> {
        if b.len() < NODE_RECORD_LEN {
            return Err(rdma_mad::Error::Truncated {
                need: NODE_RECORD_LEN,
                have: b.len(),
            });
        }
        Ok(NodeRecord {
            lid: u16::from_be_bytes([b[0], b[1]]),
            info: NodeInfo::parse(&b[4..44])?,
            description: rdma_mad::smp::node_description(&b[44..108])?,
        })
    }
}

/// A PortInfoRecord.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfoRecord {
    /// The port's LID.
    pub lid: u16,
    /// Port number.
    pub port: u8,
    /// The 64-byte PortInfo attribute (read with `rdma_mad::smp::PortInfo`).
    pub port_info: [u8; 64],
}

impl PortInfoRecord {
    /// Parses the 68-byte record.
    ///
    /// # Errors
    /// Too short.
    pub fn parse(b: &[u8]) -> Result<PortInfoRecord, rdma_mad::Error> {
        if b.len() < PORTINFO_RECORD_LEN {
            return Err(rdma_mad::Error::Truncated {
                need: PORTINFO_RECORD_LEN,
                have: b.len(),
            });
        }
        Ok(PortInfoRecord {
            lid: u16::from_be_bytes([b[0], b[1]]),
            port: b[2],
            port_info: b[4..68].try_into().expect("64 bytes"),
        })
    }

    /// PortInfo:CapabilityMask.
    pub fn capability_mask(&self) -> u32 {
        PortInfo::new_checked(&self.port_info[..]).map_or(0, |p| p.capability_mask())
    }
}

/// What a PathRecord query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathQuery {
    /// Source port GID.
    pub sgid: Gid,
    /// Destination port GID.
    pub dgid: Gid,
    /// At most this many paths (1: a Get, the SA's first path; more: a
    /// GetTable with NumbPath; 0: a GetTable without NumbPath, every path
    /// the SA has for the pair: with LMC, one per (SLID, DLID) pair).
    pub max_paths: u8,
    /// Only paths in this partition.
    pub pkey: Option<Pkey>,
    /// Only paths for this service ID.
    pub service_id: Option<u64>,
}

/// An SA request MAD: `method` for `attr`, matching `record` on `comp_mask`
/// (the TID is the dispatcher's to fill in).
pub fn sa_request(method: Method, attr: SaAttr, comp_mask: u64, record: &[u8]) -> MadBytes {
    let mut m = [0u8; MAD_SIZE];
    MadHeaderRepr::new(
        MgmtClass::from(SA_CLASS),
        SA_CLASS_VERSION,
        method,
        0,
        attr.into(),
    )
    .emit(&mut m);
    SaHeader {
        comp_mask,
        ..Default::default()
    }
    .emit(&mut m);
    let n = record.len().min(MAD_SIZE - SA_HDR_LEN);
    m[SA_HDR_LEN..SA_HDR_LEN + n].copy_from_slice(&record[..n]);
    m
}

/// The PathRecord query for `q`.
pub fn path_request(q: &PathQuery) -> MadBytes {
    let mut rec = PathRecord::parse(&[0u8; PathRecord::LEN]).expect("64 bytes");
    rec.sgid = q.sgid;
    rec.dgid = q.dgid;
    rec.reversible = true;
    let mut mask = path_comp::SGID | path_comp::DGID | path_comp::REVERSIBLE;
    if let Some(p) = q.pkey {
        rec.pkey = p;
        mask |= path_comp::PKEY;
    }
    if let Some(s) = q.service_id {
        rec.service_id = s;
        mask |= path_comp::SERVICE_ID;
    }
    let method = match q.max_paths {
        0 => Method::GetTable,
        1 => Method::Get,
        n => {
            rec.numb_path = n.min(0x7f);
            mask |= path_comp::NUMB_PATH;
            Method::GetTable
        }
    };
    let mut b = [0u8; PathRecord::LEN];
    rec.emit(&mut b);
    sa_request(method, SaAttr::PathRecord, mask, &b)
}

/// The NodeRecord query: one LID, or every node.
pub fn node_request(lid: Option<u16>) -> MadBytes {
    let mut b = [0u8; NODE_RECORD_LEN];
    b[0..2].copy_from_slice(&lid.unwrap_or(0).to_be_bytes());
    let mask = if lid.is_some() { node_comp::LID } else { 0 };
    sa_request(Method::GetTable, SaAttr::NodeRecord, mask, &b)
}

/// The PortInfoRecord query: one LID or all, and only ports whose
/// CapabilityMask has every bit of `cap_mask`.
pub fn port_info_request(lid: Option<u16>, cap_mask: Option<u32>) -> MadBytes {
    let mut b = [0u8; PORTINFO_RECORD_LEN];
    let mut mask = 0;
    if let Some(l) = lid {
        b[0..2].copy_from_slice(&l.to_be_bytes());
        mask |= portinfo_comp::LID;
    }
    if let Some(c) = cap_mask {
        if let Ok(mut p) = PortInfo::new_checked(&mut b[4..68]) {
            p.set_capability_mask(c);
        }
        mask |= portinfo_comp::CAPMASK;
    }
    sa_request(Method::GetTable, SaAttr::PortInfoRecord, mask, &b)
}

/// The ServiceRecord query: by service ID, by name, or every record.
pub fn service_request(service_id: Option<u64>, name: Option<&str>) -> MadBytes {
    let mut b = [0u8; ServiceRecord::LEN];
    let mut mask = 0;
    if let Some(id) = service_id {
        b[0..8].copy_from_slice(&id.to_be_bytes());
        mask |= service_comp::ID;
    }
    if let Some(n) = name {
        let n = &n.as_bytes()[..n.len().min(63)];
        b[48..48 + n.len()].copy_from_slice(n);
        mask |= service_comp::NAME;
    }
    sa_request(Method::GetTable, SaAttr::ServiceRecord, mask, &b)
}

/// Set(InformInfo): subscribe to (or unsubscribe from) generic trap
/// `trap` (0xFFFF: all traps) for the port `gid`.
pub fn inform_info_request(gid: Gid, trap: u16, subscribe: bool) -> MadBytes {
    let info = InformInfo {
        gid,
        lid_range_begin: 0xffff,
        lid_range_end: 0,
        is_generic: 1,
        subscribe: u8::from(subscribe),
        trap_type: 0xffff,
        trap_number: trap,
        qpn: Qpn::GSI,
        resp_time_value: 18,
        producer_type: 0xff_ffff,
    };
    let mut b = [0u8; InformInfo::LEN];
    info.emit(&mut b);
    sa_request(Method::Set, SaAttr::InformInfo, 0, &b)
}

/// The records of SA response `resp` (a GetResp's one record, or a
/// GetTableResp's table, one MAD or RMPP-reassembled), each
/// `record_len` bytes; "no records" is an empty list.
///
/// # Errors
/// Another status, or a response too short or of the wrong kind.
pub fn records(resp: &[u8], record_len: usize) -> Result<Vec<Vec<u8>>, SaError> {
    if resp.len() < SA_HDR_LEN {
        return Err(SaError::Malformed(format!("{} bytes", resp.len())));
    }
    let status = u16::from_be_bytes([resp[4], resp[5]]);
    if status == ERR_NO_RECORDS {
        return Ok(Vec::new());
    }
    if status != 0 {
        return Err(SaError::Status(status));
    }
    let hdr = SaHeader::parse(resp).map_err(|e| SaError::Malformed(e.to_string()))?;
    let data = &resp[SA_HDR_LEN..];
    match Method::from(resp[3]) {
        Method::GetResp => {
            if data.len() < record_len {
                return Err(SaError::Malformed("record cut short".into()));
            }
            Ok(vec![data[..record_len].to_vec()])
        }
        Method::GetTableResp => {
            let stride = hdr.record_len();
            if stride < record_len {
                return Err(SaError::Malformed(format!(
                    "attribute offset {} for {record_len}-byte records",
                    hdr.attr_offset
                )));
            }
            let rmpp = rdma_mad::rmpp::RmppHeader::parse(resp).is_ok_and(|h| h.active());
            Ok(data
                .chunks_exact(stride)
                // A single MAD without RMPP has no length: drop the padding.
                .filter(|r| rmpp || r.iter().any(|&b| b != 0))
                .map(|r| r[..record_len].to_vec())
                .collect())
        }
        m => Err(SaError::Malformed(format!("method {m}"))),
    }
}

/// The ReportResp for Report `report`: same TID, the notice echoed.
pub fn report_response(report: &MadBytes) -> MadBytes {
    let mut r = status_reply(report, MadStatus::OK);
    r[SA_HDR_LEN..].copy_from_slice(&report[SA_HDR_LEN..]);
    r
}

/// The notice in a Report MAD, if it is one.
pub fn notice_of(report: &[u8]) -> Option<Notice> {
    if report.len() < SA_HDR_LEN + Notice::LEN
        || report[1] != SA_CLASS
        || Method::from(report[3]) != Method::Report
        || SaAttr::from(u16::from_be_bytes([report[16], report[17]])) != SaAttr::Notice
    {
        return None;
    }
    Notice::parse(&report[SA_HDR_LEN..]).ok()
}

/// How long a query waits for its answer, and how often it asks.
#[derive(Debug, Clone, Copy)]
pub struct SaTiming {
    /// Time per try.
    pub timeout: Duration,
    /// Tries after the first.
    pub retries: u32,
}

impl Default for SaTiming {
    fn default() -> SaTiming {
        SaTiming {
            timeout: Duration::from_millis(300),
            retries: 3,
        }
    }
}

/// An SA client on a port (see the module docs).
pub struct SaClient {
    agent: Arc<MadAgent>,
    sa: Gid,
    local: Gid,
    timing: SaTiming,
    notices: std::sync::Mutex<Option<Receiver<(Gid, Notice)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SaClient {
    /// A client of the SA at `sa` on `port`.
    ///
    /// # Errors
    /// Another SA client holds the port's Report method.
    pub fn new(port: &CmAgent, sa: Gid, timing: SaTiming) -> Result<SaClient, CmError> {
        let agent =
            Arc::new(port.mad_agent(SA_CLASS, SA_CLASS_VERSION, &[u8::from(Method::Report)])?);
        let (tx, rx) = mpsc::channel();
        let a = agent.clone();
        let thread = std::thread::Builder::new()
            .name("sa-notices".into())
            .spawn(move || {
                // TIDs of the last Reports answered: a resent one is
                // answered again but delivered once.
                let mut seen: VecDeque<(Gid, u64)> = VecDeque::new();
                // Until the agent closes (the client's drop, or its CA's
                // removal); no periodic wake-up.
                loop {
                    let (peer, mad) = match a.wait(Duration::from_secs(3600)) {
                        MadWait::Request(peer, mad) => (peer, mad),
                        MadWait::TimedOut => continue,
                        MadWait::Closed => return,
                    };
                    let Some(notice) = notice_of(&mad[..]) else {
                        a.send(
                            peer,
                            status_reply(
                                &mad,
                                MadStatus::from_code(StatusCode::MethodAttrUnsupported),
                            ),
                        );
                        continue;
                    };
                    a.send(peer, report_response(&mad));
                    let key = (peer, u64::from_be_bytes(mad[8..16].try_into().expect("8")));
                    if seen.contains(&key) {
                        continue;
                    }
                    if seen.len() == 64 {
                        seen.pop_front();
                    }
                    seen.push_back(key);
                    let _ = tx.send((peer, notice));
                }
            })
            .map_err(|e| CmError::Mad(e.to_string()))?;
        Ok(SaClient {
            agent,
            sa,
            local: port.gid(),
            timing,
            notices: std::sync::Mutex::new(Some(rx)),
            thread: Some(thread),
        })
    }

    fn query(&self, req: MadBytes, record_len: usize) -> Result<Vec<Vec<u8>>, SaError> {
        let r = self
            .agent
            .request_long(self.sa, req, self.timing.timeout, self.timing.retries)?;
        records(&r, record_len)
    }

    /// Paths from `q.sgid` to `q.dgid` (several when `q.max_paths` is 0
    /// or more than 1), in the SA's order of preference: a port with
    /// LMC > 0 has several LIDs, and the SA lists the LID pairs best
    /// first, so a caller logs in over the first and falls back to the
    /// next.
    ///
    /// # Errors
    /// No answer, a failing status, or a malformed response.
    pub fn path_records(&self, q: &PathQuery) -> Result<Vec<PathRecord>, SaError> {
        self.query(path_request(q), PathRecord::LEN)?
            .iter()
            .map(|r| PathRecord::parse(r).map_err(|e| SaError::Malformed(e.to_string())))
            .collect()
    }

    /// The path from `sgid` to the port with LID `dlid` (srp_daemon's
    /// question after the SA named a port by its LID: over UDP it is the
    /// path's DGID that reaches the port).
    ///
    /// # Errors
    /// As [`SaClient::path_records`]; no path is `SaError::Status` with
    /// the SA's "no records".
    pub fn path_to_lid(&self, sgid: Gid, dlid: u16) -> Result<PathRecord, SaError> {
        let mut b = [0u8; PathRecord::LEN];
        let mut q = PathRecord::parse(&b).map_err(|e| SaError::Malformed(e.to_string()))?;
        q.sgid = sgid;
        q.dlid = dlid;
        q.emit(&mut b);
        let req = sa_request(
            Method::Get,
            SaAttr::PathRecord,
            path_comp::SGID | path_comp::DLID,
            &b,
        );
        let recs = self.query(req, PathRecord::LEN)?;
        let first = recs.first().ok_or(SaError::Status(0x0300))?;
        PathRecord::parse(first).map_err(|e| SaError::Malformed(e.to_string()))
    }

    /// The NodeRecords of `lid`, or of every node.
    ///
    /// # Errors
    /// As [`SaClient::path_records`].
    pub fn node_records(&self, lid: Option<u16>) -> Result<Vec<NodeRecord>, SaError> {
        self.query(node_request(lid), NODE_RECORD_LEN)?
            .iter()
            .map(|r| NodeRecord::parse(r).map_err(|e| SaError::Malformed(e.to_string())))
            .collect()
    }

    /// The PortInfoRecords of `lid` (or all) whose capability mask has
    /// every bit of `cap_mask`.
    ///
    /// # Errors
    /// As [`SaClient::path_records`].
    pub fn port_info_records(
        &self,
        lid: Option<u16>,
        cap_mask: Option<u32>,
    ) -> Result<Vec<PortInfoRecord>, SaError> {
        self.query(port_info_request(lid, cap_mask), PORTINFO_RECORD_LEN)?
            .iter()
            .map(|r| PortInfoRecord::parse(r).map_err(|e| SaError::Malformed(e.to_string())))
            .collect()
    }

    /// ServiceRecords by ID, by name, or all.
    ///
    /// # Errors
    /// As [`SaClient::path_records`].
    pub fn service_records(
        &self,
        service_id: Option<u64>,
        name: Option<&str>,
    ) -> Result<Vec<ServiceRecord>, SaError> {
        self.query(service_request(service_id, name), ServiceRecord::LEN)?
            .iter()
            .map(|r| ServiceRecord::parse(r).map_err(|e| SaError::Malformed(e.to_string())))
            .collect()
    }

    /// Registers `rec` with the SA (Set ServiceRecord): the SA keys it by
    /// ID, GID and P_Key, replacing an older one, and keeps it for its
    /// lease (`u32::MAX`: indefinitely).
    ///
    /// # Errors
    /// No answer or a failing status.
    pub fn register_service(&self, rec: &ServiceRecord) -> Result<(), SaError> {
        self.service_op(Method::Set, rec)
    }

    /// Removes the registration of `rec` (by ID, GID and P_Key).
    ///
    /// # Errors
    /// No answer, or a failing status ("no records" when it was not there).
    pub fn delete_service(&self, rec: &ServiceRecord) -> Result<(), SaError> {
        self.service_op(Method::Delete, rec)
    }

    fn service_op(&self, method: Method, rec: &ServiceRecord) -> Result<(), SaError> {
        let mut b = [0u8; ServiceRecord::LEN];
        rec.emit(&mut b);
        let mask = service_comp::ID | service_comp::GID | service_comp::PKEY;
        let r = self.agent.request(
            self.sa,
            sa_request(method, SaAttr::ServiceRecord, mask, &b),
            self.timing.timeout,
            self.timing.retries,
        )?;
        match u16::from_be_bytes([r[4], r[5]]) {
            0 => Ok(()),
            s => Err(SaError::Status(s)),
        }
    }

    fn inform(&self, trap: u16, subscribe: bool) -> Result<(), SaError> {
        let r = self.agent.request(
            self.sa,
            inform_info_request(self.local, trap, subscribe),
            self.timing.timeout,
            self.timing.retries,
        )?;
        match u16::from_be_bytes([r[4], r[5]]) {
            0 => Ok(()),
            s => Err(SaError::Status(s)),
        }
    }

    /// Subscribes this port to trap `trap` (0xFFFF: every trap); notices
    /// come out of [`SaClient::notices`].
    ///
    /// # Errors
    /// No answer or a failing status.
    /// On a tracked port ([`CmAgent::track_in`]) the subscription is a
    /// node of the client's tree until [`SaClient::unsubscribe`]; the
    /// client's close deletes it at the SA.
    pub fn subscribe(&self, trap: u16) -> Result<(), SaError> {
        self.agent.track_subscription(self.sa, trap)?;
        let r = self.inform(trap, true);
        if r.is_err() {
            self.agent.untrack_subscription(self.sa, trap);
        }
        r
    }

    /// Ends a subscription.
    ///
    /// # Errors
    /// No answer or a failing status.
    pub fn unsubscribe(&self, trap: u16) -> Result<(), SaError> {
        self.agent.untrack_subscription(self.sa, trap);
        self.inform(trap, false)
    }

    /// The notices (with the sender), already answered; the receiver can be
    /// taken once.
    pub fn notices(&self) -> Option<Receiver<(Gid, Notice)>> {
        self.notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Drop for SaClient {
    fn drop(&mut self) {
        self.agent.closer().close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The body of the `answers` fuzz target: `data` as an SA response read
/// for every record size, as a Report, and (padded to a MAD) as a DM
/// request to an I/O unit with one controller, whose answer must be a
/// GetResp with the request's TID. Panics only on a real bug.
#[doc(hidden)]
pub fn fuzz_answers(data: &[u8]) {
    for len in [
        PathRecord::LEN,
        NODE_RECORD_LEN,
        PORTINFO_RECORD_LEN,
        ServiceRecord::LEN,
    ] {
        if let Ok(recs) = records(data, len) {
            assert!(recs.iter().all(|r| r.len() == len));
        }
    }
    let _ = notice_of(data);
    let mut req = [0u8; MAD_SIZE];
    let n = data.len().min(MAD_SIZE);
    req[..n].copy_from_slice(&data[..n]);
    let mut unit = crate::dm::IoUnit::new();
    let profile = rdma_mad::dm::IocProfile::parse(&[0u8; 128]).expect("128 bytes");
    unit.add(crate::dm::Ioc {
        profile,
        services: vec![rdma_mad::dm::ServiceEntry::srp(1, 1); 5],
    });
    let r = unit.answer(&req);
    assert_eq!(r[3], u8::from(Method::from(req[3]).response()));
    assert_eq!(r[8..16], req[8..16]);
}

/// The PathRecord GetTable from `sgid` to the port with LID `dlid`, in
/// partition `pkey` only when given (srp_daemon's question with its `-p`).
pub fn path_to_lid_request(sgid: Gid, dlid: u16, pkey: Option<Pkey>) -> MadBytes {
    let mut rec = PathRecord::parse(&[0u8; PathRecord::LEN]).expect("64 bytes");
    rec.sgid = sgid;
    rec.dlid = dlid;
    let mut mask = path_comp::SGID | path_comp::DLID;
    if let Some(p) = pkey {
        rec.pkey = p;
        mask |= path_comp::PKEY;
    }
    let mut b = [0u8; PathRecord::LEN];
    rec.emit(&mut b);
    sa_request(Method::GetTable, SaAttr::PathRecord, mask, &b)
}

impl SaClient {
    /// Every path from `sgid` to the port with LID `dlid`, in partition
    /// `pkey` when given; none is an empty list.
    ///
    /// # Errors
    /// As [`SaClient::path_records`].
    pub fn paths_to_lid(
        &self,
        sgid: Gid,
        dlid: u16,
        pkey: Option<Pkey>,
    ) -> Result<Vec<PathRecord>, SaError> {
        self.query(path_to_lid_request(sgid, dlid, pkey), PathRecord::LEN)?
            .iter()
            .map(|r| PathRecord::parse(r).map_err(|e| SaError::Malformed(e.to_string())))
            .collect()
    }

    /// Every path from `sgid` to `dgid` (in partition `pkey` when given),
    /// best first: [`SaClient::path_records`] with `max_paths` 0.
    ///
    /// # Errors
    /// As [`SaClient::path_records`].
    pub fn all_paths(
        &self,
        sgid: Gid,
        dgid: Gid,
        pkey: Option<Pkey>,
    ) -> Result<Vec<PathRecord>, SaError> {
        self.path_records(&PathQuery {
            sgid,
            dgid,
            max_paths: 0,
            pkey,
            service_id: None,
        })
    }

    /// The SA this client asks.
    pub fn sa_gid(&self) -> Gid {
        self.sa
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_body_holds_on_deterministic_inputs() {
        let mut rng = rdma_sim::Rng::new(0xa5);
        let mut statuses = 0;
        for i in 0..3000u32 {
            let mut buf = vec![0u8; rng.below(400) as usize];
            rng.fill(&mut buf);
            if buf.len() >= 24 && i % 2 == 0 {
                // A plausible header: DM Get, or an SA GetTableResp.
                buf[0] = 1;
                buf[1] = if i % 4 == 0 { 0x06 } else { 0x03 };
                buf[3] = if i % 4 == 0 { 0x01 } else { 0x92 };
                buf[4] &= 0x03;
            }
            fuzz_answers(&buf);
            if buf.len() >= 24 && i % 4 == 0 {
                let mut req = [0u8; MAD_SIZE];
                req[..buf.len().min(MAD_SIZE)].copy_from_slice(&buf[..buf.len().min(MAD_SIZE)]);
                let r = crate::dm::IoUnit::new().answer(&req);
                statuses += usize::from(r[4..6] != [0, 0]);
            }
        }
        assert!(
            statuses > 500,
            "malformed DM requests get statuses: {statuses}"
        );
    }

    #[test]
    fn requests_carry_the_record_and_mask() {
        let g = |x: u8| Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, x]);
        let m = path_request(&PathQuery {
            sgid: g(1),
            dgid: g(2),
            max_paths: 4,
            pkey: Some(Pkey(0xffff)),
            service_id: None,
        });
        assert_eq!(m[3], 0x12, "several paths: GetTable");
        let h = SaHeader::parse(&m).unwrap();
        assert_eq!(
            h.comp_mask,
            path_comp::SGID
                | path_comp::DGID
                | path_comp::REVERSIBLE
                | path_comp::NUMB_PATH
                | path_comp::PKEY
        );
        let r = PathRecord::parse(&m[SA_HDR_LEN..]).unwrap();
        assert_eq!((r.sgid, r.dgid, r.numb_path), (g(1), g(2), 4));
        let one = path_request(&PathQuery {
            max_paths: 1,
            pkey: None,
            ..PathQuery {
                sgid: g(1),
                dgid: g(2),
                max_paths: 0,
                pkey: None,
                service_id: Some(7),
            }
        });
        assert_eq!(one[3], 0x01, "one path: Get");
        let all = path_request(&PathQuery {
            sgid: g(1),
            dgid: g(2),
            max_paths: 0,
            pkey: None,
            service_id: None,
        });
        assert_eq!(all[3], 0x12, "every path: GetTable");
        assert_eq!(
            SaHeader::parse(&all).unwrap().comp_mask & path_comp::NUMB_PATH,
            0,
            "without NumbPath"
        );
        assert_ne!(
            SaHeader::parse(&one).unwrap().comp_mask & path_comp::SERVICE_ID,
            0
        );
        let p = port_info_request(None, Some(1 << 19));
        assert_eq!(
            SaHeader::parse(&p).unwrap().comp_mask,
            portinfo_comp::CAPMASK
        );
        let rec = PortInfoRecord::parse(&p[SA_HDR_LEN..]).unwrap();
        assert_eq!(rec.capability_mask(), 1 << 19);
        let i = inform_info_request(g(9), 64, true);
        let info = InformInfo::parse(&i[SA_HDR_LEN..]).unwrap();
        assert_eq!((info.gid, info.trap_number, info.subscribe), (g(9), 64, 1));
    }

    #[test]
    fn responses_yield_records_or_errors() {
        let mut r = sa_request(Method::GetTable, SaAttr::PortInfoRecord, 0, &[]);
        r[3] = 0x92;
        r[44..46].copy_from_slice(&9u16.to_be_bytes()); // 72-byte stride
        let mut whole = r[..SA_HDR_LEN].to_vec();
        rdma_mad::rmpp::RmppHeader {
            version: 1,
            rmpp_type: 1,
            resp_time: 0,
            flags: 7,
            status: 0,
            seg_num: 1,
            paylen_newwin: 0,
        }
        .emit(&mut whole);
        for k in 0..5u8 {
            let mut rec = [0u8; 72];
            rec[0..2].copy_from_slice(&[0, k + 1]);
            whole.extend_from_slice(&rec);
        }
        let recs = records(&whole, PORTINFO_RECORD_LEN).unwrap();
        assert_eq!(recs.len(), 5);
        assert_eq!(PortInfoRecord::parse(&recs[4]).unwrap().lid, 5);
        let mut none = r;
        none[4..6].copy_from_slice(&ERR_NO_RECORDS.to_be_bytes());
        assert_eq!(records(&none, 68).unwrap().len(), 0);
        let mut bad = r;
        bad[4..6].copy_from_slice(&0x0200u16.to_be_bytes());
        assert_eq!(records(&bad, 68), Err(SaError::Status(0x0200)));
        assert!(matches!(records(&r[..10], 68), Err(SaError::Malformed(_))));
        let mut short = r;
        short[44..46].copy_from_slice(&2u16.to_be_bytes());
        assert!(matches!(records(&short, 68), Err(SaError::Malformed(_))));
    }
}
