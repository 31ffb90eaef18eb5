//! The SA server: queries for PathRecords, NodeRecords, PortInfoRecords
//! and ServiceRecords answered from the subnet the SM configured, service
//! registration, and InformInfo subscriptions with the reports they get.

use super::*;

pub(super) struct Subscriber<P> {
    pub(super) addr: P,
    pub(super) trap: u16,
}

/// A registered service and when its lease ends (`None`: indefinite).
pub(super) struct Service {
    pub(super) rec: ServiceRecord,
    pub(super) expires: Option<Instant>,
}

pub(super) fn service_bytes(r: &ServiceRecord) -> Vec<u8> {
    let mut b = vec![0u8; ServiceRecord::LEN];
    r.emit(&mut b);
    b
}

impl<P: Copy + Eq + std::fmt::Debug> SubnetManager<P> {
    /// Sends trap `number` about `gid` to every subscriber of it.
    pub(super) fn trap(&mut self, now: Instant, number: u16, gid: Gid) {
        let mut details = [0u8; 54];
        details[6..22].copy_from_slice(&gid.0);
        let notice = Notice {
            is_generic: true,
            notice_type: 3,   // informational
            producer_type: 4, // class manager (the SA)
            trap_number: number,
            issuer_lid: self.lid_now(),
            toggle: false,
            count: 0,
            data_details: details,
            issuer_gid: Gid([0; 16]),
        };
        self.report(now, &notice);
    }

    /// Sends `notice` as a Report to every subscriber of its trap.
    pub(super) fn report(&mut self, now: Instant, notice: &Notice) {
        let number = notice.trap_number;
        let targets: Vec<P> = self
            .subscribers
            .iter()
            .filter(|s| s.trap == 0xffff || s.trap == number)
            .map(|s| s.addr)
            .collect();
        for to in targets {
            let mut m = [0u8; MAD_SIZE];
            m[0] = 1;
            m[1] = 0x03;
            m[2] = SA_CLASS_VERSION;
            m[3] = u8::from(Method::Report);
            m[16..18].copy_from_slice(&u16::from(SaAttr::Notice).to_be_bytes());
            notice.emit(&mut m[SA_HDR_LEN..SA_HDR_LEN + Notice::LEN]);
            self.stats.reports += 1;
            self.send(now, None, to, QP_GSI, None, m);
        }
    }

    pub(super) fn sa_request(&mut self, now: Instant, from: P, req: &MadBytes) {
        self.stats.sa_requests += 1;
        let reply = |m: MadBytes| Outgoing {
            to: from,
            qp: QP_GSI,
            mad: Box::new(m),
        };
        // Nothing answers a response, a Send, a Trap or a TrapRepress, not
        // even with a status (IBA 13.4.7).
        let m = Method::from(req[3]);
        if m.is_response() || matches!(m, Method::Send | Method::Trap | Method::TrapRepress) {
            return;
        }
        if req[2] != SA_CLASS_VERSION {
            let r = status_reply(req, MadStatus::from_code(StatusCode::BadVersion));
            self.tx.push_back(reply(r));
            return;
        }
        let method = Method::from(req[3]);
        let attr = SaAttr::from(u16::from_be_bytes([req[16], req[17]]));
        let Ok(hdr) = SaHeader::parse(req) else {
            return;
        };
        // IBA C15-0.1.5: the SA header's SM_Key is zero or the SM's;
        // anything else is discarded unanswered, as opensm does (an
        // answer would tell a prober the key was wrong).
        if hdr.sm_key != 0 && hdr.sm_key != self.cfg.sm_key {
            self.stats.sa_bad_sm_key += 1;
            return;
        }
        let data = &req[SA_HDR_LEN..];
        match (method, attr) {
            (Method::Set, SaAttr::InformInfo) => {
                let Ok(info) = InformInfo::parse(data) else {
                    self.tx
                        .push_back(reply(status_reply(req, MadStatus(SA_ERR_REQ_INVALID))));
                    return;
                };
                self.subscribers
                    .retain(|s| !(s.addr == from && s.trap == info.trap_number));
                if info.subscribe == 1 {
                    self.subscribers.push(Subscriber {
                        addr: from,
                        trap: info.trap_number,
                    });
                }
                let mut r = status_reply(req, MadStatus::OK);
                r[SA_HDR_LEN..].copy_from_slice(&req[SA_HDR_LEN..]);
                self.tx.push_back(reply(r));
            }
            (Method::Get | Method::GetTable, SaAttr::PathRecord) => {
                let recs = self.path_records(from, method, &hdr, data);
                self.answer(from, req, method, &recs, PathRecord::LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::NodeRecord) => {
                let recs = self.node_records(&hdr, data);
                self.answer(from, req, method, &recs, NODE_RECORD_LEN);
            }
            (Method::Get | Method::GetTable, SaAttr::PortInfoRecord) => {
                let mut recs = self.portinfo_records(&hdr, data);
                // IBA PortInfoRecord: the M_Key shows only to a trusted request
                // (its SM_Key, checked above, is not zero).
                if hdr.sm_key == 0 {
                    for r in &mut recs {
                        PortInfo::new_checked(&mut r[4..68])
                            .expect("64 bytes")
                            .set_mkey(0);
                    }
                }
                self.answer(from, req, method, &recs, PORTINFO_RECORD_LEN);
            }
            (
                Method::Set | Method::Get | Method::GetTable | Method::Delete,
                SaAttr::ServiceRecord,
            ) => {
                self.services.retain(|s| s.expires.is_none_or(|t| t > now));
                self.stats.services = self.services.len() as u64;
                let Ok(q) = ServiceRecord::parse(data) else {
                    self.tx
                        .push_back(reply(status_reply(req, MadStatus(SA_ERR_REQ_INVALID))));
                    return;
                };
                let mask = if method == Method::Set {
                    service_comp::ID | service_comp::GID | service_comp::PKEY
                } else {
                    hdr.comp_mask
                };
                let matches = |r: &ServiceRecord| {
                    (mask & service_comp::ID == 0 || r.service_id == q.service_id)
                        && (mask & service_comp::GID == 0 || r.service_gid == q.service_gid)
                        && (mask & service_comp::PKEY == 0 || r.service_pkey == q.service_pkey)
                        && (mask & service_comp::NAME == 0 || r.service_name == q.service_name)
                };
                let recs: Vec<Vec<u8>> = match method {
                    Method::Set => {
                        // Registration replaces the record with the same
                        // ID, GID and P_Key; the lease starts again.
                        self.services.retain(|s| !matches(&s.rec));
                        let expires = (q.service_lease != u32::MAX)
                            .then(|| now + Duration::from_secs(u64::from(q.service_lease)));
                        self.services.push(Service { rec: q, expires });
                        self.stats.services = self.services.len() as u64;
                        vec![data[..ServiceRecord::LEN].to_vec()]
                    }
                    Method::Delete => {
                        let (gone, kept): (Vec<Service>, Vec<Service>) =
                            std::mem::take(&mut self.services)
                                .into_iter()
                                .partition(|s| matches(&s.rec));
                        self.services = kept;
                        self.stats.services = self.services.len() as u64;
                        gone.iter().map(|s| service_bytes(&s.rec)).collect()
                    }
                    _ => self
                        .services
                        .iter()
                        .filter(|s| matches(&s.rec))
                        .map(|s| service_bytes(&s.rec))
                        .collect(),
                };
                // Set and Delete answer GetResp with the record, as Get does.
                let as_get = if method == Method::GetTable {
                    Method::GetTable
                } else {
                    Method::Get
                };
                self.answer(from, req, as_get, &recs, ServiceRecord::LEN);
            }
            (Method::Get | Method::GetTable | Method::Set | Method::Delete, _) => {
                let r = status_reply(req, MadStatus::from_code(StatusCode::MethodAttrUnsupported));
                self.tx.push_back(reply(r));
            }
            (m, _)
                if m.is_response()
                    || matches!(m, Method::Send | Method::Trap | Method::TrapRepress) => {}
            _ => {
                let r = status_reply(req, MadStatus::from_code(StatusCode::MethodUnsupported));
                self.tx.push_back(reply(r));
            }
        }
    }

    /// Get: the first record (or "no records"); GetTable: all of them,
    /// segmented with RMPP.
    pub(super) fn answer(
        &mut self,
        from: P,
        req: &MadBytes,
        method: Method,
        recs: &[Vec<u8>],
        len: usize,
    ) {
        let stride = len.div_ceil(8) * 8;
        let mut hdr = SaHeader::parse(req).unwrap_or_default();
        hdr.attr_offset = (stride / 8) as u16;
        if method == Method::Get {
            let r = match recs.first() {
                Some(rec) => {
                    let mut r = status_reply(req, MadStatus::OK);
                    hdr.emit(&mut r);
                    r[SA_HDR_LEN..SA_HDR_LEN + rec.len()].copy_from_slice(rec);
                    r
                }
                None => status_reply(req, MadStatus(SA_ERR_NO_RECORDS)),
            };
            self.tx.push_back(Outgoing {
                to: from,
                qp: QP_GSI,
                mad: Box::new(r),
            });
            return;
        }
        let mut table = vec![0u8; recs.len() * stride];
        for (k, rec) in recs.iter().enumerate() {
            table[k * stride..k * stride + rec.len()].copy_from_slice(rec);
        }
        let mut template = status_reply(req, MadStatus::OK);
        hdr.emit(&mut template);
        // Active sender without a window: every segment at once; a lost one
        // costs the requester a timeout and a new query.
        if let Ok(segs) = rmpp::segment(&template[..SA_HDR_LEN], SA_HDR_LEN, &table, 0x1f) {
            for s in segs {
                self.tx.push_back(Outgoing {
                    to: from,
                    qp: QP_GSI,
                    mad: Box::new(s),
                });
            }
        }
    }

    pub(super) fn shares_partition(&self, a: Guid, b: Guid, only: Option<u16>) -> Option<u16> {
        self.cfg.partitions.iter().find_map(|p| {
            if only.is_some_and(|k| k & 0x7fff != p.pkey) {
                return None;
            }
            let (x, y) = (partitions::membership(p, a)?, partitions::membership(p, b)?);
            (x || y).then_some(p.pkey | 0x8000)
        })
    }

    /// True if `lid` is one of node `n`'s (its base and the `2^lmc - 1`
    /// above: the SA's LID-to-port map, as opensm's covers the range).
    pub(super) fn holds(&self, n: &Node<P>, lid: u16) -> bool {
        n.lid != 0 && lid >= n.lid && lid - n.lid < self.span()
    }

    /// The (SLID, DLID, preference) of the paths from a port with LIDs
    /// `s` to one with `d`, in opensm's order: first the pairs at the same
    /// offset from each base (base to base, base+1 to base+1, ...:
    /// preference 0, the most redundant with each other), then every
    /// other pair, source-major (preference 2); at most `limit`.
    pub(super) fn lid_pairs(s: (u16, u16), d: (u16, u16), limit: usize) -> Vec<(u16, u16, u8)> {
        let mut out = Vec::new();
        let (ns, nd) = (s.1 - s.0 + 1, d.1 - d.0 + 1);
        for k in 0..ns.min(nd) {
            out.push((s.0 + k, d.0 + k, 0));
        }
        for i in 0..ns {
            for j in (0..nd).filter(|j| *j != i) {
                out.push((s.0 + i, d.0 + j, 2));
            }
        }
        out.truncate(limit);
        out
    }

    pub(super) fn path_records(
        &self,
        from: P,
        method: Method,
        hdr: &SaHeader,
        data: &[u8],
    ) -> Vec<Vec<u8>> {
        let Ok(q) = PathRecord::parse(data) else {
            return Vec::new();
        };
        let m = hdr.comp_mask;
        // Paths per pair: one for a Get (IBA 1.2 erratum, as opensm);
        // NumbPath when the mask has it; else every LID pair, at most
        // MAX_PATHS_PER_PAIR.
        let limit = if method == Method::Get {
            1
        } else if m & path_comp::NUMB_PATH != 0 {
            usize::from(q.numb_path)
        } else {
            MAX_PATHS_PER_PAIR
        };
        let srcs: Vec<&Node<P>> = self
            .nodes
            .iter()
            .filter(|n| n.in_service)
            .filter(|n| {
                if m & (path_comp::SGID | path_comp::SLID) == 0 {
                    n.addr == from
                } else {
                    (m & path_comp::SGID == 0 || n.gid == q.sgid)
                        && (m & path_comp::SLID == 0 || self.holds(n, q.slid))
                }
            })
            .collect();
        let mut out = Vec::new();
        for s in &srcs {
            for d in self.nodes.iter().filter(|n| n.in_service) {
                if (m & path_comp::DGID != 0 && d.gid != q.dgid)
                    || (m & path_comp::DLID != 0 && !self.holds(d, q.dlid))
                {
                    continue;
                }
                let (Some(si), Some(di)) = (s.info, d.info) else {
                    continue;
                };
                let only = (m & path_comp::PKEY != 0).then_some(q.pkey.0);
                let Some(pkey) = self.shares_partition(si.port_guid, di.port_guid, only) else {
                    continue;
                };
                // The client's SLID or DLID narrows its end to that LID.
                let top = self.span() - 1;
                let srange = if m & path_comp::SLID != 0 {
                    (q.slid, q.slid)
                } else {
                    (s.lid, s.lid + top)
                };
                let drange = if m & path_comp::DLID != 0 {
                    (q.dlid, q.dlid)
                } else {
                    (d.lid, d.lid + top)
                };
                for (slid, dlid, preference) in Self::lid_pairs(srange, drange, limit) {
                    let rec = PathRecord {
                        service_id: q.service_id,
                        dgid: d.gid,
                        sgid: s.gid,
                        dlid,
                        slid,
                        raw_traffic: false,
                        flow_label: 0,
                        hop_limit: 0,
                        tclass: 0,
                        reversible: true,
                        numb_path: 1,
                        pkey: Pkey(pkey),
                        qos_class: 0,
                        sl: 0,
                        mtu_selector: 2,
                        mtu: 5,
                        rate_selector: 2,
                        rate: 3,
                        packet_life_selector: 2,
                        packet_life: 16,
                        preference,
                    };
                    let mut b = vec![0u8; PathRecord::LEN];
                    rec.emit(&mut b);
                    out.push(b);
                }
            }
        }
        out
    }

    pub(super) fn node_records(&self, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let want_lid = u16::from_be_bytes([data[0], data[1]]);
        self.nodes
            .iter()
            .filter(|n| n.in_service && (hdr.comp_mask & 1 == 0 || self.holds(n, want_lid)))
            .filter_map(|n| {
                let mut b = vec![0u8; NODE_RECORD_LEN];
                b[0..2].copy_from_slice(&n.lid.to_be_bytes());
                n.info?.emit(&mut b[4..44]);
                b[44..108].copy_from_slice(&n.desc);
                Some(b)
            })
            .collect()
    }

    pub(super) fn portinfo_records(&self, hdr: &SaHeader, data: &[u8]) -> Vec<Vec<u8>> {
        let want_lid = u16::from_be_bytes([data[0], data[1]]);
        let want_caps = PortInfo::new_checked(&data[4..68])
            .map(|p| p.capability_mask())
            .unwrap_or(0);
        let m = hdr.comp_mask;
        let by_lid: BTreeMap<u16, &Node<P>> = self
            .nodes
            .iter()
            .filter(|n| n.in_service)
            .map(|n| (n.lid, n))
            .collect();
        by_lid
            .values()
            .filter(|n| m & portinfo_comp::LID == 0 || self.holds(n, want_lid))
            .filter(|n| {
                let caps = PortInfo::new_checked(&n.port[..])
                    .expect("64")
                    .capability_mask();
                m & portinfo_comp::CAPMASK == 0 || caps & want_caps == want_caps
            })
            .map(|n| {
                let mut b = vec![0u8; PORTINFO_RECORD_LEN];
                b[0..2].copy_from_slice(&n.lid.to_be_bytes());
                b[2] = 1;
                b[4..68].copy_from_slice(&n.port);
                // The record shows the state the SM left the port in.
                let mut p = PortInfo::new_checked(&mut b[4..68]).expect("64");
                p.set_lid(n.lid);
                p.set_lmc(self.lmc());
                p.set_sm_lid(self.lid_now());
                p.set_port_state(state::ACTIVE);
                b
            })
            .collect()
    }
}

/// Reassembles the RMPP segments of one GetTableResp (in order) into its
/// SA header and records.
///
/// # Errors
/// The segments do not form one response.
pub fn table_records(segments: &[&[u8]]) -> Result<(SaHeader, Vec<Vec<u8>>), rdma_mad::Error> {
    let (hdr_bytes, data) = rmpp::reassemble(segments, SA_HDR_LEN)?;
    let mut full = hdr_bytes.clone();
    full.resize(MAD_SIZE, 0);
    let hdr = SaHeader::parse(&full)?;
    let recs = rdma_mad::sa::records(&data, hdr.attr_offset)
        .map(<[u8]>::to_vec)
        .collect();
    let _ = RmppHeader::parse(&full)?;
    Ok((hdr, recs))
}
